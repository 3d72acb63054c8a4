"""Measured vs predicted on the viewer's side: client runs (:mod:`latsim.run.viewer`).

The prediction re-simulates the run through the serving model (:mod:`latsim.sim.serving`)
with one stream on one dedicated device: the same conditions (client send times, stream
time), K, policy, lead, window and playout delay D; each job's C drawn from the run's own
jobs (controller start to ready, by job kind); the uplink and deliver stages drawn from the
run's own measured one-way delays (``t_arrival − t_sent`` per condition, ``t_received −
t_start`` per slot, both with the offset the client used, so the two carry its error with opposite
signs, as the live playout did). Conditions the server never acknowledged (lost, refused)
are left out on both sides. Errors are ``100·(predicted − measured)/measured``; stall % is
compared in percentage points (the viewer's: server stalls plus late slots). Beside each
prediction, ``*_predicted_lo`` and ``*_predicted_hi``: the least and greatest value of the
metric over the replications, each one run of the same conditions, so the spread one run
shows by chance (a median of 19 conditions can move by a whole slot when one condition
lands on the other side of a job start).

A browser session (``config["viewer"] == "browser"``) shows each slot at its display's next
refresh after the playout rule's time (:mod:`latsim.model.display`): its prediction puts each
displayed condition on screen at the next refresh of the session's refresh clock, whose
period the page measured (else 60 Hz is assumed) and whose phase is fitted to the display
times of the slots that first showed no condition, so no compared condition's own display
time goes into it. A viewer without a display refresh (``latsim client``) gets no such step.

A partial run (``status`` not ``complete``) is compared over the window it covers,
``[0, end_time]`` (a client killed outright has no ``end_time``: its last row's time), and
said to be partial in its row.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from latsim.analysis.fidelity import error_pct, mape
from latsim.analysis.serving import per_stream_rows, viewer_metrics
from latsim.controller import ControllerConfig
from latsim.controller.policies import PRESETS
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.costs import TableCost
from latsim.model.display import NOMINAL_PERIOD, RefreshFit, fit_refresh
from latsim.model.generators import SpawnedStreams
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.run.folder import COMPLETE, read_run_folder, scan_run_folders
from latsim.run.serving import ServingRecords
from latsim.run.viewer import KIND, ViewerRecords, read_viewer_records
from latsim.sim.serving import StreamInput, simulate_serving

#: Metrics compared per client run; stall also in percentage points.
VIEWER_COMPARED = ("L_mean", "L50", "L95", "viewer_stall_pct")


def client_runs(paths: list[Path]) -> list[Path]:
    """The client run folders among ``paths`` (each a run folder or a folder of them)."""
    found, _ = scan_run_folders(paths)
    return [p for p in found if read_run_folder(p).config.get("kind") == KIND]


@dataclass(frozen=True)
class ClientRun:
    """A client run folder, read for comparison."""

    path: Path
    config: dict
    records: ViewerRecords
    window: float

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        return str(self.config.get("status", "incomplete"))

    def controller_config(self) -> ControllerConfig:
        """The session's controller, as the server ran it. A folder that does not say
        when a queued job took its condition (``bind``) was served by a server that bound
        it at enqueue: it is predicted that way, like for like."""
        c = self.config
        try:
            return ControllerConfig(Timing(int(c["K"]), int(c["r"]), float(c["fps"])),
                                    PRESETS[str(c["policy"])], float(c["lead"]),
                                    bind=str(c.get("bind") or "enqueue"))
        except (TypeError, ValueError, KeyError, LatsimError) as exc:
            raise LatsimError(f"{self.path / 'config.json'}: the session's K, r, fps, policy, "
                              f"lead or bind is not valid ({type(exc).__name__})") from None

    def served(self) -> list[float]:
        """Send times of the conditions the server acknowledged."""
        return [c.t_sent for c in self.records.conditions if c.version > 0]

    def display(self) -> RefreshFit | None:
        """The refresh clock of a browser session's display (None for a viewer without
        one, or a session that displayed no slot): the period the page measured
        (``config.json``'s ``display.period``), else :data:`NOMINAL_PERIOD` assumed; the
        phase fitted to the display times of the slots that first showed no condition (all
        displayed slots where every one showed one)."""
        if self.config.get("viewer") != "browser":
            return None
        measured = (self.config.get("display") or {}).get("period")
        try:
            period = float(measured) if measured is not None else NOMINAL_PERIOD
        except (TypeError, ValueError):
            raise LatsimError(f"{self.path / 'config.json'}: display.period is not a number: "
                              f"{measured!r}") from None
        source = "measured" if measured is not None else "assumed"
        displayed = [s for s in self.records.slots if math.isfinite(s.t_displayed)]
        if not displayed:
            return None
        firsts = sorted(c.t_shown for c in self.records.conditions if c.status == "shown")
        held_out = [s.t_displayed for s in displayed if not _among(s.t_shown, firsts)]
        return fit_refresh(held_out or [s.t_displayed for s in displayed], period, source)


def load_client_run(path: Path) -> ClientRun:
    folder = read_run_folder(path)
    config = folder.config
    if config.get("kind") != KIND:
        raise LatsimError(f"{path}: not a client run (kind {config.get('kind')!r})")
    for key in ("K", "r", "fps", "policy", "lead", "duration", "playout_delay"):
        if config.get(key) is None:
            raise LatsimError(f"{path}: config.json lacks {key!r} (the session never started)")
    records = read_viewer_records(path)
    if not records.jobs:
        raise LatsimError(f"{path}: no finished jobs to take C samples from")
    duration = folder.duration  # a number, or a one-line error
    end = config.get("end_time")
    if end is None and config.get("status") != COMPLETE:  # killed: as far as its rows go
        end = max([0.0] + [s.t_received for s in records.slots]
                  + [c.t_sent for c in records.conditions])
    window = duration if config.get("status") == COMPLETE else min(duration, float(end))
    return ClientRun(path, config, records, window)


def _among(t: float, ordered: list[float]) -> bool:
    """Whether ``t`` is one of the times in ``ordered`` (sorted), to a microsecond: slots
    are a slot time apart, so that names one slot."""
    i = bisect.bisect_left(ordered, t - 1e-6)
    return i < len(ordered) and ordered[i] <= t + 1e-6


def _on_screen(sim: ServingRecords, displays: Sequence[RefreshFit | None]
               ) -> ServingRecords:
    """``sim`` with each displayed condition of a stream that has a display refresh on
    screen at its next refresh after the playout rule's time (``t_display`` and ``L``
    later by that step); streams without one unchanged."""
    if all(d is None for d in displays):
        return sim
    viewer = []
    for v in sim.viewer:
        fit = displays[v.stream]
        if fit is None or not v.displayed:
            viewer.append(v)
            continue
        step = fit.refresh.step(v.t_display)
        viewer.append(replace(v, t_display=v.t_display + step, L=v.L + step))
    return replace(sim, viewer=tuple(viewer))


def _samples(values: list[float], name: str, path: Path) -> TableCost | None:
    finite = tuple(v for v in values if math.isfinite(v))
    if not finite:
        return None
    if min(finite) < 0:
        raise LatsimError(f"{path}: a measured {name} delay is negative ({min(finite):.4f} s): "
                          "the clock offset is off by more than the delay")
    return TableCost(f"{path}:{name}", {(1, "refill"): finite})


def _group_key(run: ClientRun) -> tuple:
    """Runs that can be predicted together: one server run, complete, the same window and
    playout delay (the serving model has one of each)."""
    c = run.config
    if c.get("server_run") is None or c.get("server_start") is None or run.status != COMPLETE:
        return ("alone", str(run.path))
    return (c["server_run"], run.window, float(c["playout_delay"]))


def predict_viewers(runs: list[ClientRun], replications: int = 20, seed: int = 0
                    ) -> list[dict]:
    """The serving model's prediction of each run's viewer metrics, the runs simulated
    together as streams on one shared device (joining when their sessions started on the
    server's clock), with the C samples of all their jobs (one generator) and the uplink
    and deliver samples of all of them (pooled). One run alone is one stream. A browser
    session's conditions are on screen at its display's next refresh (:meth:`ClientRun.display`);
    its row's ``display_fit`` is that clock and ``display_step_mean`` the mean predicted step."""
    jobs: dict[tuple[int, str], list[float]] = {}
    uplinks, delivers = [], []
    for run in runs:
        K = run.controller_config().timing.K
        for job in run.records.jobs:
            if job.kind != "prebuffer":
                jobs.setdefault((K, job.kind), []).append(job.C)
        uplinks += [c.t_arrival - c.t_sent for c in run.records.conditions]
        delivers += [s.t_received - s.t_start for s in run.records.slots]
    for K in {k for k, _ in jobs}:
        if (K, "refill") not in jobs:
            jobs[(K, "refill")] = [c for (k, _), values in jobs.items() if k == K
                                   for c in values]
    if not jobs:
        raise LatsimError(f"{runs[0].path}: no finished jobs to take C samples from")
    where = runs[0].path
    cost = TableCost(f"{where}:jobs", {k: tuple(v) for k, v in jobs.items()})
    serving = ServingConfig(
        pools=(("dit", 1),), schedule=str(runs[0].config.get("schedule") or "fifo"),
        uplink=_samples(uplinks, "uplink", where), deliver=_samples(delivers, "deliver", where),
        playout_delay=float(runs[0].config["playout_delay"]))
    configs = [run.controller_config() for run in runs]
    starts = [float(run.config.get("server_start") or 0.0) for run in runs]
    joins = [t - min(starts) for t in starts] if len(runs) > 1 else [0.0]
    traces = [Trace(run.name, tuple(run.served()), run.window) for run in runs]
    drain = runs[0].config.get("drain") if runs[0].status == COMPLETE else None
    sims = []
    for child in np.random.SeedSequence(seed).spawn(replications):
        streams_seq, batch_seq = child.spawn(2)
        streams = []
        for trace, join, stream_seq in zip(traces, joins, streams_seq.spawn(len(runs)),
                                           strict=True):
            cost_seq, stages_seq = stream_seq.spawn(2)
            streams.append(StreamInput(trace, join, np.random.default_rng(cost_seq),
                                       SpawnedStreams(stages_seq, 4)))
        sims.append(simulate_serving(configs[0], cost, serving, streams, runs[0].window,
                                     np.random.default_rng(batch_seq), drain, configs))
    displays = [run.display() for run in runs]
    rule = sims  # the playout rule's display times, before any refresh
    sims = [_on_screen(sim, displays) for sim in sims]
    rows = _viewer_rows(sims)
    one_run_rows = [_viewer_rows([sim]) for sim in sims]
    for index, row in enumerate(rows):
        row["latencies"] = tuple(v.L for sim in sims for v in sim.viewer
                                 if v.stream == index and v.displayed)
        for metric in VIEWER_COMPARED:
            one_run = [run[index][metric] for run in one_run_rows]
            finite = [v for v in one_run if v is not None and math.isfinite(v)]
            row[f"{metric}_band"] = (min(finite), max(finite)) if finite else (None, None)
        row["display_fit"] = displays[index]
        if displays[index] is not None:
            steps = [after.t_display - before.t_display
                     for plain, shifted in zip(rule, sims, strict=True)
                     for before, after in zip(plain.viewer, shifted.viewer, strict=True)
                     if before.stream == index and before.displayed]
            row["display_step_mean"] = float(np.mean(steps)) if steps else None
    return rows


def _viewer_rows(sims: list) -> list[dict]:
    """:func:`per_stream_rows` with the viewer's stall (server stalls plus late slots)."""
    rows = per_stream_rows(sims)
    for row in rows:
        row["viewer_stall_pct"] = row["stall_pct"] + row["client_stall_pct"]
    return rows


def compare_client_run(run: ClientRun, predicted: dict, replications: int = 20,
                       together: int = 1) -> dict:
    """One row: measured, predicted and error per :data:`VIEWER_COMPARED` metric;
    ``together``: how many viewers the prediction simulated on the shared device."""
    measured = viewer_metrics(run.records, run.window)
    row: dict = {"run": run.name, "status": run.status, "window_s": run.window,
                 "n_conditions": measured["n_displayed"], "replications": replications,
                 "predicted_with": together}
    for metric in VIEWER_COMPARED:
        row[f"{metric}_measured"] = measured[metric]
        row[f"{metric}_predicted"] = predicted[metric]
        row[f"{metric}_predicted_lo"], row[f"{metric}_predicted_hi"] = \
            predicted[f"{metric}_band"]
        row[f"{metric}_err_pct"] = (None if metric.endswith("pct") else
                                    error_pct(measured[metric], predicted[metric]))
    row["viewer_stall_pct_abs_err"] = (predicted["viewer_stall_pct"]
                                       - measured["viewer_stall_pct"])
    row["MAPE"] = mape(row[f"{m}_err_pct"] for m in VIEWER_COMPARED)
    for key in ("uplink_mean", "deliver_mean", "C_mean"):
        row[key] = measured[key]
    row["offset_uncertainty"] = run.config.get("offset_uncertainty")
    row["notes"] = "; ".join(
        ([] if run.status == COMPLETE else
         [f"partial run ({run.status}): compared over [0, {run.window:.2f}] s"])
        + list(run.records.notes))
    fit = predicted.get("display_fit")
    if fit is not None:  # a browser session: its display refresh, after the common columns
        shown = [c for c in run.records.conditions if c.status == "shown"]
        steps = [c.t_displayed - c.t_shown for c in shown]
        row["display_period"] = fit.refresh.period
        row["display_period_source"] = fit.period_source
        row["display_phase"] = fit.refresh.phase
        row["display_phase_slots"] = fit.n
        row["display_phase_spread"] = fit.spread
        row["display_step_measured"] = float(np.mean(steps)) if steps else None
        row["display_step_predicted"] = predicted.get("display_step_mean")
    return row


@dataclass(frozen=True)
class ViewerComparison:
    """Rows in run order, and per run the measured and predicted latencies (the CDFs)."""

    rows: list[dict]
    measured: list[tuple[float, ...]]
    predicted: list[tuple[float, ...]]


def compare_client_runs(paths: list[Path], replications: int = 20, seed: int = 0
                        ) -> ViewerComparison:
    """One row per client run, in ``paths`` order. Complete runs of one server run (same
    window and playout delay) are predicted together, as streams sharing its device
    (:func:`predict_viewers`); any other run alone."""
    runs = [load_client_run(p) for p in paths]
    groups: dict[tuple, list[int]] = {}
    for index, run in enumerate(runs):
        groups.setdefault(_group_key(run), []).append(index)
    rows: list[dict] = [{}] * len(runs)
    predicted: list[tuple[float, ...]] = [()] * len(runs)
    for members in groups.values():
        streams = predict_viewers([runs[i] for i in members], replications, seed)
        for i, stream in zip(members, streams, strict=True):
            rows[i] = compare_client_run(runs[i], stream, replications, len(members))
            predicted[i] = stream["latencies"]
    measured = [tuple(c.L for c in run.records.conditions if c.status == "shown")
                for run in runs]
    return ViewerComparison(rows, measured, predicted)
