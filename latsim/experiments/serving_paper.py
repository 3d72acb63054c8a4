"""The serving model on the paper's settings (``latsim reproduce serving`` -> results/serving/).

Three tables, each simulated through the serving model (stages on device pools, the DiT on
its USP group of the paper's size), on the committed low/high trace sets:

- ``e2e``       the paper's end-to-end L50 cells (seed 000 §3.2, Table 3). Only Sol-H3 has
                L50 cells in the seeds (short baseline 1.87/1.87 s, long speculative
                1.42/1.41 s); the other families report reductions and stalls, which
                ``results/paper`` covers. C is the kernel-activity inference of
                :mod:`latsim.experiments.paper` (not fitted to these cells). The paper says
                both policies share the scheduling lead; we take one lead per model family,
                the smallest that keeps its longest chunk stall-free (its largest C: the
                paper measured 0.000 % stall for Sol-H3 long). Everything the paper does not
                state (decode, network, playout) is one end-to-end overhead D, calibrated on
                **one** cell (Sol-H3 short baseline L50, low traces); the other three cells
                are predictions. Only lead + D is identified by these cells: the split
                between them is an assumption, stated.
- ``headroom``  the paper's claim that long-chunk kernel activity (17–25 %) "leaves room for
                more streams": the capacity (streams per DiT group, speculative, high-
                frequency traces) of each long-chunk setting at an L95 SLO equal to its
                family's short-chunk baseline L95 (one stream at the family lead, same D),
                and 1.5 times it, with viewer stall <= 0.1 %, for four leads of the long
                setting: the family lead plus 0, ½, 1 and 2 C of queueing margin (a stream
                sharing a device waits for the others' jobs; with no margin any wait is a
                stall). ``streams_by_activity`` is the naive reading, 100 % / busy %.
- ``discard``   what keeping the old future playable until a replan is ready
                (``discard=on-ready``) changes against discarding it when the replan starts
                (``on-start``), when streams share one device and replans queue.
- ``schedule``  which waiting task a free device takes: ``fifo``, ``least-slack`` (the
                stream with the least buffered playable time) or ``replan-first``, on the
                same shared-device workload.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from latsim.analysis.serving import replication_se
from latsim.errors import DEFAULT_MAX_EVENTS
from latsim.experiments.capacity import SLO, CapacityQuery, search_capacity
from latsim.experiments.engine import (
    Experiment,
    prefetched,
    reporting_progress,
    run_experiment,
)
from latsim.experiments.paper_settings import (
    SETTINGS,
    Setting,
    _trace_root,
    infer_C,
    paper_data,
)
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.serving import ServingConfig
from latsim.run.files import write_rows_csv

FAMILIES = ("Wan1.3B", "Sol-H3", "LTX-2.3")
#: The cells that calibrate the end-to-end overhead D: one at a time, the first is the
#: reported one (the high-frequency set: 217 conditions against 43, so the calibrated D
#: carries less sampling noise), the second a sensitivity check.
CALIBRATIONS = (("Sol-H3 short", "baseline", "high"), ("Sol-H3 short", "baseline", "low"))
#: Queueing margins of the long setting's lead in the headroom table, in units of its C.
MARGINS = (0.0, 0.5, 1.0, 2.0)
#: The headroom SLOs: the short-chunk baseline's L95 times these factors.
SLO_FACTORS = (1.0, 1.5)


def _setting(name: str) -> Setting:
    return next(s for s in SETTINGS if s.name == name)


def usp_degree(setting: Setting) -> int:
    """The USP degree of the paper's deployment of ``setting`` (``paper_data.json``)."""
    found = re.search(r"USP(\d+)", paper_data()["settings"][setting.name]["deployment"])
    return int(found.group(1)) if found else 1


def family_lead(family: str) -> float:
    """One lead for the family's chunk sizes: the largest C (fixed, so its 0.99 quantile)."""
    return max(infer_C(s) for s in SETTINGS if s.name.startswith(family))


def _serving(setting: Setting, playout: float, **extra) -> ServingConfig:
    degree = usp_degree(setting)
    return ServingConfig(pools=(("dit", degree),), dit_degree=degree,
                         playout_delay=playout, **extra)


def _experiment(setting: Setting, policy: str, trace_dir: Path, lead: float, playout: float,
                max_events: int, **serving) -> Experiment:
    return Experiment(Ks=(setting.K,), r=setting.r, fps=setting.fps,
                      cost=FixedCost(infer_C(setting)), lead=lead, policies=(policy,),
                      updates=f"traces:{trace_dir}", max_events=max_events,
                      serving=_serving(setting, playout, **serving))


def _row_of(result, policy: str) -> dict:
    """``policy``'s summary row, with the standard errors over replications that the
    figure's error bars use (:func:`~latsim.analysis.serving.replication_se`)."""
    row = next(row for row in result.rows if row["policy"] == policy)
    return {**row, **replication_se(result.runs[row["K"], policy])}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def e2e_table(root: Path, jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS,
              calibrations: tuple[tuple[str, str, str], ...] = CALIBRATIONS,
              steps: _Steps | None = None) -> tuple[list[dict], float]:
    """The Sol-H3 L50 and stall cells end to end, once per calibration cell
    (``calibrations``, by default :data:`CALIBRATIONS`); returns the rows and the D of the
    first calibration.

    Its experiments run in two batches of work: the calibration cells with the LTX-2.3
    stall cells (:func:`_ltx_stall_rows`), then the cells each calibration predicts (each
    a part of ``steps``: :func:`e2e_steps`)."""
    lead = family_lead("Sol-H3")
    cells = [(_setting(name), policy, metric, key) for name, policy, metric, key in E2E_CELLS]
    servers = [_experiment(_setting(name), fitted_policy, root / fitted_load, lead, 0.0,
                           max_events) for name, fitted_policy, fitted_load in calibrations]
    first = servers + _ltx_experiments(root, max_events)
    with _part(steps, len(first)), prefetched(first, jobs):
        playouts = []
        for (name, fitted_policy, fitted_load), server in zip(calibrations, servers,
                                                              strict=True):
            row = _row_of(run_experiment(server, jobs=jobs), fitted_policy)
            playouts.append(paper_data()["settings"][name]["baseline_L50_s"][fitted_load]
                            - row["L50"])
        predicted = [_experiment(setting, policy, root / load, lead, playout, max_events)
                     for playout in playouts for setting, policy, _, _ in cells
                     for load in LOADS]
        with _part(steps, len(predicted)), prefetched(predicted, jobs):
            rows = _e2e_rows(root, jobs, max_events, lead, cells, calibrations, playouts)
        rows += _ltx_stall_rows(root, jobs, max_events)
    return rows, playouts[0]


LOADS = ("low", "high")
#: The Sol-H3 cells each calibration predicts: (setting, policy, metric, the paper's key).
E2E_CELLS = (("Sol-H3 short", "baseline", "L50", "baseline_L50_s"),
             ("Sol-H3 long", "speculative", "L50", "speculative_L50_s"),
             ("Sol-H3 long", "speculative", "viewer_stall_pct", "speculative_stall_pct"))


def e2e_steps(calibrations: tuple[tuple[str, str, str], ...] = CALIBRATIONS) -> int:
    """The experiments of :func:`e2e_table`: each calibration cell and the cells it
    predicts, and the LTX-2.3 stall cells."""
    return (len(calibrations) * (1 + len(E2E_CELLS) * len(LOADS))
            + len(LTX_CELLS) * len(LOADS))


def _part(steps: _Steps | None, n: int) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if steps is None else steps.part(n)


def _e2e_rows(root: Path, jobs: int | None, max_events: int, lead: float, cells: list,
              calibrations: tuple[tuple[str, str, str], ...], playouts: list[float]
              ) -> list[dict]:
    rows: list[dict] = []
    for calibration, playout in zip(calibrations, playouts, strict=True):
        for setting, policy, metric, key in cells:
            for load in LOADS:
                row = _row_of(run_experiment(_experiment(setting, policy, root / load, lead,
                                                         playout, max_events), jobs=jobs),
                              policy)
                ours = row[metric]
                paper = paper_data()["settings"][setting.name][key][load]
                rows.append({
                    "calibrated_on": f"{calibration[0]} {calibration[1]} L50 {calibration[2]}",
                    "setting": setting.name, "policy": policy, "metric": metric,
                    "load": load, "paper": paper, "ours": round(ours, 6),
                    "ours_se": _rounded(row[f"{metric}_se"]),
                    "server_side": round(row["L_server50" if metric == "L50"
                                             else "stall_pct"], 6),
                    "err_pct": round(100 * (ours - paper) / paper, 3) if paper else None,
                    "diff": round(ours - paper, 6),
                    "role": ("calibrated" if (setting.name, policy, load) == calibration
                             else "predicted"),
                    "n_conditions": row["n_conditions"], "usp": usp_degree(setting),
                    "C": round(infer_C(setting), 6), "lead": round(lead, 6),
                    "playout_delay": round(playout, 6),
                })
    return rows


#: LTX-2.3's stall cells: (setting, policy, the paper's key, role).
LTX_CELLS = (("LTX-2.3 short", "baseline", "baseline_stall_pct", "fitted"),
             ("LTX-2.3 long", "baseline", "baseline_stall_pct", "predicted"),
             ("LTX-2.3 long", "speculative", "speculative_stall_pct", "predicted"))


def _ltx_experiments(root: Path, max_events: int) -> list[Experiment]:
    lead = family_lead("LTX-2.3")
    return [_experiment(_setting(name), policy, root / load, lead, 0.0, max_events)
            for name, policy, _, _ in LTX_CELLS for load in LOADS]


def _ltx_stall_rows(root: Path, jobs: int | None, max_events: int) -> list[dict]:
    """LTX-2.3's stall cells through the serving model (USP1/USP2, the family lead, fixed C).
    The short setting's C was inferred from its own stall cells, so those are marked
    ``fitted``; the long setting's (C from its mean-latency reduction) are predictions."""
    lead = family_lead("LTX-2.3")
    rows = []
    for name, policy, key, role in LTX_CELLS:
        setting = _setting(name)
        for load in LOADS:
            row = _row_of(run_experiment(_experiment(setting, policy, root / load, lead, 0.0,
                                                     max_events), jobs=jobs), policy)
            paper = paper_data()["settings"][name][key][load]
            rows.append({
                "calibrated_on": "C: short from its stall cells, long from its reduction",
                "setting": name, "policy": policy, "metric": "viewer_stall_pct", "load": load,
                "paper": paper, "ours": round(row["viewer_stall_pct"], 6),
                "ours_se": _rounded(row["viewer_stall_pct_se"]),
                "server_side": round(row["stall_pct"], 6), "err_pct": None,
                "diff": round(row["viewer_stall_pct"] - paper, 6), "role": role,
                "n_conditions": row["n_conditions"], "usp": usp_degree(setting),
                "C": round(infer_C(setting), 6), "lead": round(lead, 6), "playout_delay": 0.0,
            })
    return rows


def headroom_table(root: Path, playout_by_family: dict[str, float],
                   max_events: int = DEFAULT_MAX_EVENTS, max_streams: int = 64,
                   steps: _Steps | None = None) -> list[dict]:
    """Streams per DiT group of each long-chunk setting at its family's short-chunk baseline
    L95 (one stream at the family lead, high-frequency traces), viewer stall <= 0.1 %, with
    the long setting's lead raised by each queueing margin (each family's baseline run and
    each capacity search a step of ``steps``: :func:`headroom_steps`)."""
    rows = []
    for family in FAMILIES:
        short, long = _setting(f"{family} short"), _setting(f"{family} long")
        base_lead = family_lead(family)
        playout = playout_by_family.get(family, 0.0)
        c_long = infer_C(long)
        with _part(steps, 1):
            slo_row = _row_of(run_experiment(_experiment(short, "baseline", root / "high",
                                                         base_lead, playout, max_events)),
                              "baseline")
        for factor, margin in ((f, m) for f in SLO_FACTORS for m in MARGINS):
            lead = base_lead + margin * c_long
            query = CapacityQuery(
                replace(_experiment(long, "speculative", root / "high", lead, playout,
                                    max_events, start="random"), seeds=None),
                SLO(factor * slo_row["L95"], 0.1), max_streams=max_streams)
            with _part(steps, 1):
                result = search_capacity(query)
            at = {v.streams: v for v in result.verdicts}
            one = at.get(1)
            best = at.get(result.max_streams)
            rows.append({
                "setting": long.name, "usp": usp_degree(long), "C": round(c_long, 6),
                "T": round(long.timing.T, 6), "lead": round(lead, 6),
                "margin_C": margin, "playout_delay": round(playout, 6),
                "short_baseline_L95": round(slo_row["L95"], 6), "slo_factor": factor,
                "slo_L95": round(factor * slo_row["L95"], 6),
                "short_baseline_stall_pct": round(slo_row["viewer_stall_pct"], 6),
                "busy_pct_1_stream": None if one is None else round(one.metrics["busy_pct"], 3),
                "streams_by_activity": (None if one is None or not one.metrics["busy_pct"]
                                        else int(100 // one.metrics["busy_pct"])),
                "L95_1_stream": None if one is None else round(one.metrics["L95"], 6),
                "max_streams": result.max_streams,
                "busy_pct_at_max": (None if best is None
                                    else round(best.metrics["busy_pct"], 3)),
                "L95_at_max": None if best is None else round(best.metrics["L95"], 6),
                "tried": " ".join(f"{n}:{v.verdict}" for n, v in sorted(at.items())),
            })
    return rows


def headroom_steps() -> int:
    """The steps of :func:`headroom_table`: a baseline run and a search per SLO and margin,
    per family."""
    return len(FAMILIES) * (1 + len(SLO_FACTORS) * len(MARGINS))


#: The shared-device workload of the discard and schedule tables: K = 8 at 16 fps, r = 4
#: (T = 2 s), C lognormal with mean 0.4 s and CV 0.3 (each stream uses about 20 % of the
#: device), speculative, high-frequency traces, and C's 0.99 quantile as the lead, fixed:
#: the tables compare what queueing does to stalls, which ``--lead auto`` would hide.
SHARED_K, SHARED_COST = 8, (0.4, 0.3)


def _shared_device_experiment(root: Path, max_events: int, streams: int,
                              **serving: str) -> Experiment:
    """Speculative streams sharing one device (the same arrivals and costs whatever the
    serving options)."""
    return Experiment(
        Ks=(SHARED_K,), r=4, fps=16.0, cost=LognormalCost(*SHARED_COST),
        lead=LognormalCost(*SHARED_COST).quantile(SHARED_K, 0.99),
        policies=("speculative",), updates=f"traces:{root / 'high'}", max_events=max_events,
        serving=ServingConfig(streams=streams, start="random", **serving))


#: The schedules the reproduction compares (latsim's built-ins, whatever else is installed).
SCHEDULES = ("fifo", "least-slack", "replan-first")
#: The shared-device rows of the discard and schedule tables: (streams, serving options).
SHARED_ROWS = ([(streams, {"discard": discard}) for streams in (1, 2, 3, 4)
                for discard in ("on-start", "on-ready")]
               + [(streams, {"schedule": schedule}) for streams in (2, 3, 4)
                  for schedule in SCHEDULES])


def _shared_device_row(root: Path, jobs: int | None, max_events: int, streams: int,
                       **serving: str) -> dict:
    """One row of :func:`_shared_device_experiment`."""
    experiment = _shared_device_experiment(root, max_events, streams, **serving)
    row = _row_of(run_experiment(experiment, jobs=jobs), "speculative")
    return {"streams": streams, **serving,
            **{key: _rounded(row[key])
               for key in ("L50", "L50_se", "L95", "L95_se", "L99", "R_mean", "Q_mean",
                           "stall_pct", "stall_pct_se", "w", "busy_pct")},
            "queue_wait_dit": round(row["queue_wait_mean_by_stage"].get("dit", 0.0), 6)}


def discard_table(root: Path, jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS
                  ) -> list[dict]:
    """on-start vs on-ready for 1-4 speculative streams sharing one device
    (:data:`SHARED_COST`)."""
    return [_shared_device_row(root, jobs, max_events, streams, **options)
            for streams, options in SHARED_ROWS if "discard" in options]


def schedule_table(root: Path, jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS
                   ) -> list[dict]:
    """fifo vs least-slack vs replan-first for 2-4 speculative streams sharing one device
    (:data:`SHARED_COST`)."""
    return [_shared_device_row(root, jobs, max_events, streams, **options)
            for streams, options in SHARED_ROWS if "schedule" in options]


#: The lead table's workload (issue "fidelity" §1): K = 8 at 16 fps (T = 2 s), fixed C =
#: 0.5 s, a condition every 25 s on average, 1-3 streams on one FIFO device (ρ = N·C/T up
#: to 0.75), 4 replications of 1200 s.
LEAD_C, LEAD_STREAMS, LEAD_SEEDS, LEAD_DURATION = 0.5, (1, 2, 3), 4, 1200.0


def _lead_experiment(streams: int, lead: float | str, max_events: int) -> Experiment:
    return Experiment(Ks=(SHARED_K,), r=4, fps=16.0, cost=FixedCost(LEAD_C), lead=lead,
                      updates="poisson:0.04", duration=LEAD_DURATION, seeds=LEAD_SEEDS,
                      max_events=max_events, records="none",
                      serving=ServingConfig(streams=streams, pools=(("dit", 1),)))


def lead_table(jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """Each policy at ``--lead cost`` (C's 0.99 quantile) and at ``--lead auto``, the
    serving model's default (plus the wait for the shared device its own refills see): the
    lead, its model, stall and the price in L."""
    rows = []
    for streams in LEAD_STREAMS:
        for lead in ("cost", "auto"):
            result = run_experiment(_lead_experiment(streams, lead, max_events), jobs=jobs)
            for row in result.rows:
                rows.append({
                    "streams": streams, "rho": round(streams * LEAD_C / 2.0, 6),
                    "lead_rule": lead,
                    "policy": row["policy"], "lead": round(row["lead"], 6),
                    "lead_model": row.get("lead_model", ""),
                    **{key: (None if row[key] is None else round(float(row[key]), 6))
                       for key in ("L50", "L95", "L99", "viewer_stall_pct", "w")}})
    return rows


class _Steps:
    """The reproduction's progress as ``progress(done, total)`` in steps, all counted before
    the first run: an experiment is a step, and so is a capacity search (whose runs depend
    on its verdicts). Within :meth:`part`, the engine's count of runs
    (:func:`reporting_progress`) moves ``done`` through the part's steps."""

    def __init__(self, progress: Callable[[float, int], None] | None, total: int) -> None:
        self._progress = progress
        self.total = total
        self.done = 0.0
        self._report(0.0)

    def _report(self, done: float) -> None:
        self.done = max(self.done, min(done, self.total))  # never back
        if self._progress is not None:
            self._progress(self.done, self.total)

    @contextlib.contextmanager
    def part(self, steps: int) -> Iterator[None]:
        """A part of ``steps`` steps: its runs' share of its steps as they finish (a batch
        that ends counts in full; a prefetched result handed back adds nothing)."""
        start = self.done

        def runs(done: int, total: int) -> None:
            if total:
                self._report(start + steps * min(1.0, done / total))

        with reporting_progress(runs):
            yield
        self._report(start + steps)


def reproduce_serving(out: Path, traces_root: Path | None = None, jobs: int | None = None,
                      max_events: int = DEFAULT_MAX_EVENTS,
                      progress: Callable[[float, int], None] | None = None
                      ) -> dict[str, list[dict]]:
    """All the tables, written as CSV into ``out``; returns them. ``progress(done,
    total)`` counts :class:`_Steps`, the total given before the first run."""
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    shared = len(SHARED_ROWS) + 2 * len(LEAD_STREAMS)
    steps = _Steps(progress, e2e_steps() + headroom_steps() + shared)
    with tempfile.TemporaryDirectory() as tmp:
        root = _trace_root(traces_root, Path(tmp))
        e2e, playout = e2e_table(root, jobs, max_events, steps=steps)
        headroom = headroom_table(root, {"Sol-H3": playout}, max_events, steps=steps)
        # the shared-device rows are independent experiments: one batch of work
        with steps.part(shared), prefetched(
                [_shared_device_experiment(root, max_events, streams, **options)
                 for streams, options in SHARED_ROWS]
                + [_lead_experiment(streams, lead, max_events)
                   for streams in LEAD_STREAMS for lead in ("cost", "auto")], jobs):
            tables = {"e2e": e2e, "headroom": headroom,
                      "discard": discard_table(root, jobs, max_events),
                      "schedule": schedule_table(root, jobs, max_events),
                      "lead": lead_table(jobs, max_events)}
    for name, rows in tables.items():
        write_rows_csv(out / f"{name}.csv", rows)
    return tables


def mean_abs_error(rows: list[dict]) -> float:
    """Mean |error %| of the predicted L50 cells."""
    errors = [abs(r["err_pct"]) for r in rows
              if r["role"] == "predicted" and r["metric"] == "L50" and r["err_pct"] is not None]
    return float(np.mean(errors)) if errors else float("nan")
