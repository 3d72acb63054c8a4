"""Measured vs predicted: re-simulate measured runs and report the disagreement.

Each run folder (:mod:`latsim.run.folder`, kind ``measured`` or ``simulated``) holds one
(K, policy) run. The prediction re-runs the same trace through the simulator with the same
policy, K, lead and window, drawing each job's C from the run's own measured job times (by job
kind), over several cost seeds; errors are ``100·(predicted − measured)/measured`` per metric
and MAPE over runs (:mod:`latsim.analysis.fidelity`).

**Partial runs.** A run that did not finish (:attr:`RunFolder.state` ``interrupted``,
``failed`` or ``incomplete``) is compared over the window its records cover, ``[0, end]``:
``end`` is the ``end_time`` the run stated (config, else summary) or, where its writer was
killed before saying, :meth:`RunFolder.records_end` (the last finished job's ``t_ready``).
The measured side is recomputed from the records over ``[0, min(end, duration)]`` (a
summary written by an interrupted run divides stall and busy time by the full window), and
the prediction simulates the same trace over the same window, stopping at ``end`` as the run
did (no drain past it; a run that ended in its drain gets the drain it had). Conditions
not shown before ``end`` are censored on both sides. So every metric in :data:`COMPARED`
stays comparable:
L statistics over the conditions shown before ``end``; stall % and busy % time-weighted
over the same window; w and dit_calls counted in it. A killed run has no ``display.csv``,
so its L is the controller's timeline (``L_basis``), and no ``gen_jobs.csv`` (busy below);
its job running at the kill, and a stall open then, left no record: the window ends at the
last finished job, and an open stall is closed at ``end`` as the controller would have. (An
interrupted live run lets its generator finish the running job, which ``gen_jobs.csv`` then
holds; a job running at ``end`` that left no record anywhere is missed on the measured side.)
Kernel activity is compared only where the run's summary reports it. A partial run's
window is short and its prediction noisy, so the overall MAPE is taken over the complete
runs (over all compared runs only where none is complete) and says which runs it covers.
A run with no finished job, or covering less than one chunk, is skipped with the reason.

**Busy %.** Measured busy % is the generator's own time per job (``gen_jobs.csv``: from when
the generator started a job to when it finished), not the controller's ``t_ready −
t_start``, which adds the dispatch delay (~6–12 ms a job on a loaded CPU). The prediction
therefore resamples each job as a pair: its controller time C, which drives the simulated
controller (as for every other metric), and its generator interval relative to the
controller's start, which is what the simulated job counts as busy. Both sides then use the
generator's definition (``busy_basis = generator``). Where a run has no generator timing (a
simulated run, whose two views coincide, or a killed live run), both sides use the
controller's view (``busy_basis = controller``), the measured side recomputed from
``jobs.csv`` if its summary used the generator's.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from latsim.analysis.fidelity import error_pct, mape
from latsim.analysis.latency import TIMELINE, WALL, latency_stats
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig
from latsim.controller.records import ConditionRecord, JobRecord, StallRecord
from latsim.errors import DEFAULT_MAX_EVENTS, MAX_SEEDS, LatsimError, check_int, check_work
from latsim.model.costs import CostModel
from latsim.model.traces import Trace
from latsim.numeric import OBSERVED, empirical_quantile, total
from latsim.run.folder import (
    COMPLETE,
    KINDS,
    SERVED,
    RunFolder,
    RunIdentity,
    measurement_of,
    read_run_folder,
    scan_run_folders,
    summary_row,
    write_simulated_run,
)
from latsim.run.record_files import read_text
from latsim.run.stream import INTERRUPTED, BusyInterval, RunRecords, window_overlap
from latsim.run.viewer import KIND as VIEWER_KIND
from latsim.sim.simpy_driver import simulate_trace

#: Metrics compared per run (DESIGN §4 names). stall_pct is also compared in percentage
#: points, since its relative error is undefined when the measured value is 0.
COMPARED = ("L_mean", "L50", "L95", "stall_pct", "busy_pct", "w", "dit_calls")

#: busy_basis values: which time per job counts as busy, on both sides.
GENERATOR = "generator"
CONTROLLER = "controller"


@dataclass(frozen=True)
class JobSample:
    """One measured job: its controller time ``C = t_ready − t_start`` and the generator's
    interval ``[gen_start, gen_end]`` measured from the controller's ``t_start``."""

    kind: str
    C: float
    gen_start: float
    gen_end: float


class MeasuredCost:
    """A run's own jobs as a cost model: each draw resamples one measured job of the kind
    asked for (a kind without jobs of its own draws refills), returns its controller time and
    keeps the pair in :attr:`drawn`, in draw order (= job start order in the simulator).

    Draws the same random numbers as :class:`latsim.model.costs.TableCost` over the same
    samples, so the simulated controller sees the same C sequence either way.
    """

    deterministic = False

    def __init__(self, path: str, samples: dict[str, tuple[JobSample, ...]]) -> None:
        self.path = path
        self.samples = {kind: rows for kind, rows in samples.items() if rows}
        if not self.samples:
            raise LatsimError(f"{path}: no finished jobs to take C samples from")
        self.drawn: list[JobSample] = []

    @property
    def spec(self) -> str:
        return f"table:{self.path}"

    def _rows(self, kind: str) -> tuple[JobSample, ...]:
        rows = self.samples.get(kind) or self.samples.get("refill")
        return rows or tuple(s for rows in self.samples.values() for s in rows)

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        rows = self._rows(kind)
        pick = rows[0] if len(rows) == 1 else rows[int(rng.integers(len(rows)))]
        self.drawn.append(pick)
        return pick.C

    def mean(self, K: int) -> float:
        return float(np.mean([s.C for s in self._rows("refill")]))

    def quantile(self, K: int, level: float) -> float:
        """:class:`~latsim.model.costs.TableCost`'s rule: the largest of the kinds'
        observed ``level`` quantiles."""
        return max(empirical_quantile([s.C for s in rows], level, OBSERVED)
                   for rows in self.samples.values())


@dataclass(frozen=True)
class MeasuredRun:
    """One single-run folder, loaded for comparison: what was measured over which window."""

    folder: RunFolder
    trace: Trace
    job_costs: dict[str, tuple[float, ...]]  # measured C (t_ready − t_start) per job kind
    latencies: tuple[float, ...]  # measured L of conditions shown in the window
    samples: dict[str, tuple[JobSample, ...]] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # the measured metrics over the window
    state: str = COMPLETE
    end: float | None = None  # the time a partial run's records cover (None: complete)
    window: float | None = None  # metrics are taken over [0, window]
    drain: float | None = None  # the prediction's drain past the window (None: default)
    busy_basis: str = CONTROLLER
    L_basis: str = TIMELINE
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def summary(self) -> dict:
        return self.folder.summary

    @property
    def partial(self) -> bool:
        return self.state != COMPLETE

    @property
    def controller_config(self) -> ControllerConfig:
        return self.folder.controller_config

    @property
    def duration(self) -> float:
        return self.folder.duration

    @property
    def setup(self) -> dict[str, object]:
        """What the run measured with (preset, resolution, steps, device, trace), where given."""
        config, summary = self.folder.config, self.summary
        out: dict[str, object] = {}
        for key in ("preset", "resolution", "steps", "device"):
            value = summary.get(key, config.get(key, (config.get("measure_config") or {}).get(key)))
            if value is not None:
                out[key] = value
        updates = str(summary.get("updates") or "")
        named = Path(updates.removeprefix("trace:")).stem if updates.startswith("trace:") else ""
        out["trace"] = config.get("trace_name") or named or self.trace.name
        return out

    def cost_model(self) -> MeasuredCost:
        """The run's own jobs as an empirical cost model (resampled per job kind)."""
        return MeasuredCost(str(self.folder.path / "jobs.csv"), self.samples)


# ---------------------------------------------------------------- reading a run


def _read_rows(path: Path) -> tuple[list[tuple[int, dict[str, str]]], str | None]:
    """A telemetry CSV (header + rows) as ``(line, row)`` pairs; a torn last row is dropped
    with a note, a row of the wrong width elsewhere is an error naming file and line."""
    text = read_text(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    rows = [(reader.line_num, cells) for cells in reader if cells]
    torn = None
    if rows and text and not text.endswith(("\n", "\r")):
        line, _ = rows.pop()
        torn = f"{path.name}: last row (line {line}) is torn (no line end), dropped"
    out = []
    for line, cells in rows:
        if header is None or len(cells) != len(header):
            raise LatsimError(f"{path}:{line}: {len(cells)} cells where the header has "
                              f"{len(header or [])}")
        out.append((line, dict(zip(header, cells, strict=True))))
    return out, torn


def _floats(path: Path, line: int, row: dict[str, str], *names: str) -> list[float]:
    try:
        return [float(row[name]) for name in names]
    except (KeyError, ValueError):
        raise LatsimError(f"{path}:{line}: expected numbers in {', '.join(names)}") from None


def _generator_intervals(path: Path, notes: list[str]) -> dict[int, tuple[float, float]]:
    """``job_id -> (t_start, t_end)`` of the generator's run jobs (``gen_jobs.csv``)."""
    if not path.is_file():
        return {}
    rows, torn = _read_rows(path)
    if torn:
        notes.append(torn)
    out = {}
    for line, row in rows:
        if row.get("phase") != "run" or not row.get("t_start") or not row.get("t_end"):
            continue
        t_start, t_end = _floats(path, line, row, "t_start", "t_end")
        try:
            out[int(row["job_id"])] = (t_start, t_end)
        except (KeyError, ValueError):
            raise LatsimError(f"{path}:{line}: expected an integer job_id") from None
    return out


def _display(path: Path, notes: list[str]) -> list[tuple[float, float, float]] | None:
    """``(t_arrival, t_play, L_wall)`` per displayed condition (``display.csv``), or None."""
    if not path.is_file():
        return None
    rows, torn = _read_rows(path)
    if torn:
        notes.append(torn)
    return [tuple(_floats(path, line, row, "t_arrival", "t_play", "L_wall"))  # type: ignore[misc]
            for line, row in rows]


def _controller_busy(jobs: list[JobRecord]) -> tuple[BusyInterval, ...]:
    return tuple(BusyInterval(j.job_id, j.t_start, j.t_ready) for j in jobs
                 if j.kind != "prebuffer")


def _partial_records(folder: RunFolder, trace: Trace, jobs: list[JobRecord],
                     busy: tuple[BusyInterval, ...], window: float, end: float,
                     notes: list[str]) -> RunRecords:
    """A partial run's records as the simulator would leave them had it stopped at ``end``:
    conditions not shown before ``end`` censored, a stall open at ``end`` closed there."""

    def rows(table: str) -> list:  # read and checked before (_check_records)
        found = folder.records(table)
        if found.torn and found.torn not in notes:
            notes.append(found.torn)
        return [record for _, record in found]

    shown = {c.version: c for c in rows("conditions")
             if c.displayed and c.t_arrival < window and c.t_play < end}
    arrivals = [t for t in trace.times if t < window]
    conditions = sorted([*shown.values(), *(ConditionRecord.censored(v, t)
                                            for v, t in enumerate(arrivals, start=1)
                                            if v not in shown)], key=lambda c: c.version)
    slots = sorted(rows("slots"), key=lambda s: s.t_start)
    stalls = rows("stalls")
    played = [s for s in slots if s.t_start < end]
    if played:
        due = played[-1].t_start + folder.controller_config.timing.delta
        if due < end and not any(s.t_start >= due - 1e-9 for s in stalls):
            stalls.append(StallRecord(played[-1].position + 1, due, end, True))
    return RunRecords(
        duration=window, end_time=end, conditions=tuple(conditions), jobs=tuple(jobs),
        slots=tuple(slots), stalls=tuple(stalls), discards=tuple(rows("discards")),
        busy=busy, jobs_started=len(busy),
        jobs_done=sum(1 for j in jobs if j.kind != "prebuffer"), cached_at_end=0,
        status=INTERRUPTED,
    )


def _check_records(folder: RunFolder) -> list[str]:
    """Every record CSV of the folder is there and reads (its columns, its cells: the
    reader checks each, :meth:`RunFolder.records`): a damaged record file is an error
    here, even where the comparison takes a complete run's measured metrics from its
    summary. Returns the notes of torn last rows dropped."""
    notes = []
    for table in ("conditions", "slots", "stalls", "jobs"):
        path = folder.path / f"{table}.csv"
        if not path.is_file() or path.stat().st_size == 0:
            raise LatsimError(f"{path}: {'empty' if path.is_file() else 'missing'}: a run's "
                              "record tables are what its comparison rests on (a folder "
                              "that lost one is damaged)")
        torn = folder.records(table).torn
        if torn:
            notes.append(torn)
    discards = folder.path / "discards.csv"  # optional (older folders have none)
    # read for a partial run's window; whatever is there is read, so that a device or a
    # folder in its place is refused as every other table's is
    if discards.exists() or discards.is_symlink():
        torn = folder.records("discards").torn
        notes += [torn] if torn else []
    return notes


def load_measured(run_dir: Path) -> MeasuredRun:
    """Read a single-run folder with what a comparison needs: trace, job samples, the
    measured metrics and latencies over the window it covers (see the module doc)."""
    folder = read_run_folder(run_dir)
    if folder.kind not in KINDS[1:]:
        raise LatsimError(f"{folder.path}: {'an' if folder.kind[0] in 'aeiou' else 'a'} "
                          f"{folder.kind} folder, not a single run (compare takes simulated "
                          "or measured runs)")
    folder.require_single_run()
    config = folder.controller_config
    notes = _check_records(folder)
    found = folder.records("jobs")
    jobs = [job for _, job in found if isinstance(job, JobRecord)]
    generator = _generator_intervals(folder.path / "gen_jobs.csv", notes)
    samples: dict[str, list[JobSample]] = {}
    for job in jobs:
        if job.kind == "prebuffer":
            continue
        c = job.t_ready - job.t_start
        g = generator.get(job.job_id)
        pair = (g[0] - job.t_start, g[1] - job.t_start) if g else (0.0, c)
        samples.setdefault(job.kind, []).append(JobSample(job.kind, c, *pair))
    busy_basis = GENERATOR if generator else CONTROLLER
    # a live run's summary counts the generator's time: without it, recompute in the
    # controller's view (what the prediction then uses)
    busy_fallback = folder.kind == "measured" and not generator
    if busy_fallback:
        notes.append("no gen_jobs.csv: busy % in the controller's view on both sides")
    trace = folder.trace()
    display = _display(folder.path / "display.csv", notes)
    state, duration = folder.state, folder.duration
    if state == COMPLETE:
        end, window, drain = None, duration, None
        measured = dict(folder.summary)
        if display is not None:
            latencies = [row[2] for row in display]
        else:
            latencies = [c.L for _, c in folder.records("conditions")
                         if isinstance(c, ConditionRecord) and c.displayed]
        if busy_fallback:
            busy = _controller_busy(jobs)
            measured["busy_pct"] = 100.0 * total(
                window_overlap(b.t_start, b.t_end, duration) for b in busy) / duration
    else:
        end, source = folder.end_time, "as the run stated"
        if end is None:
            end, source = folder.records_end(), "its last finished job (writer killed)"
        if end is None or end <= 0:
            raise LatsimError(f"{folder.path}: {state} run with no finished job: nothing to "
                              "compare")
        T = config.timing.T
        window = min(end, duration)
        if window < T:
            raise LatsimError(f"{folder.path}: {state} run covers only [0, {end:.3g}] s, less "
                              f"than one chunk (T = {T:g} s): nothing to compare")
        drain = max(0.0, end - duration)
        busy = (tuple(BusyInterval(i, a, b) for i, (a, b) in sorted(generator.items()))
                if generator else _controller_busy(jobs))
        records = _partial_records(folder, trace, jobs, busy, window, end, notes)
        measured = summarize([records]).as_dict()
        if display is not None:
            latencies = [L for t_arrival, t_play, L in display
                         if t_arrival < window and t_play < end]
            measured.update(latency_stats(latencies), L_basis=WALL)
        else:
            latencies = [c.L for c in records.conditions if c.displayed]
        for key in ("kernel_activity", "kernel_activity_note"):
            measured[key] = folder.summary.get(key)
        reason = f" ({folder.stop_reason})" if folder.stop_reason not in (None, state) else ""
        notes.insert(0, f"{state}{reason}: records end at {end:.3f} s ({source}) of the "
                        f"{duration:g} s window; both sides compared over [0, {window:.3f}] s"
                        + (f" with the {drain:.3f} s drain it had" if drain else ", no drain"))
    return MeasuredRun(
        folder, trace, {k: tuple(s.C for s in v) for k, v in samples.items()},
        tuple(latencies), {k: tuple(v) for k, v in samples.items()}, measured, state, end,
        window, drain, busy_basis, WALL if display is not None else TIMELINE, tuple(notes),
    )


# ---------------------------------------------------------------- predicting


def write_simulated(run_dir: Path, config: ControllerConfig, cost: CostModel, trace: Trace,
                    records: RunRecords, seed: int | None = None) -> Path:
    """Write one simulated run as a run folder, summarised like every other run."""
    K = config.timing.K
    identity = RunIdentity.of(config, cost.spec, cost.mean(K), f"trace:{trace.name}",
                              records.duration, seed)
    summary = summary_row(identity, summarize([records]).as_dict())
    return write_simulated_run(run_dir, config, trace, records, summary)


def _generator_busy(records: RunRecords, drawn: list[JobSample]) -> RunRecords:
    """The simulated jobs' busy intervals in the generator's view: each job's drawn pair."""
    if len(drawn) != len(records.busy):
        raise AssertionError(f"{len(drawn)} draws for {len(records.busy)} jobs")
    busy = tuple(BusyInterval(b.job_id, b.t_start + s.gen_start, b.t_start + s.gen_end)
                 for b, s in zip(records.busy, drawn, strict=True))
    return replace(records, busy=busy)


def predict(run: MeasuredRun, replications: int = 20, seed: int = 0
            ) -> tuple[dict, list[RunRecords]]:
    """Re-simulate ``run`` ``replications`` times with its own C samples, over its window.

    Each metric is predicted as its mean over the replications, each summarised like the
    measured run (one window of one trace): the expected value of what the measurement
    reports, not the metric of a pooled sample (percentiles of a pooled sample differ).
    """
    if replications <= 0:
        raise LatsimError(f"replications must be positive, got {replications}")
    streams = np.random.SeedSequence(seed).spawn(replications)
    window = run.window if run.window is not None else run.duration
    runs = []
    for stream in streams:
        cost = run.cost_model()
        records, _ = simulate_trace(run.controller_config, cost, run.trace, window,
                                    np.random.default_rng(stream), drain=run.drain)
        if run.busy_basis == GENERATOR:
            records = _generator_busy(records, cost.drawn)
        runs.append(records)
    per_run = [summarize([r]).as_dict() for r in runs]
    predicted = {}
    for key, first in per_run[0].items():
        if isinstance(first, str):  # a label (L_basis): the same in every replication
            predicted[key] = first
            continue
        values = [m[key] for m in per_run if m[key] is not None]
        predicted[key] = float(np.mean(values)) if values else None
    return predicted, runs


# ---------------------------------------------------------------- comparing


@dataclass(frozen=True)
class Comparison:
    rows: list[dict]
    mape: float | None  # over the runs in mape_runs
    predicted_latencies: list[tuple[float, ...]]  # pooled over replications, per row
    runs: list[MeasuredRun]
    skipped: list[dict] = field(default_factory=list)  # {"path", "reason"} per skipped folder
    mape_runs: list[str] = field(default_factory=list)
    mape_over: str = ""  # which runs the overall MAPE is taken over, in words
    mape_all: float | None = None  # over every compared run, partial ones included

    def payload(self) -> dict:
        """``compare.json`` / ``--json``: rows, overall MAPE and what it covers, skipped."""
        return {"rows": self.rows, "MAPE": self.mape, "MAPE_runs": self.mape_runs,
                "MAPE_over": self.mape_over, "MAPE_all_runs": self.mape_all,
                "skipped": self.skipped}


def _row(run: MeasuredRun, predicted: dict, replications: int) -> dict:
    c_all = [c for values in run.job_costs.values() for c in values]
    config = run.controller_config
    measured = run.measured
    row: dict = {
        "run": run.name,
        "status": run.state,
        "policy": config.policy.name,
        "K": config.timing.K,
        "T": config.timing.T,
        "delta": config.timing.delta,
        "lead": config.lead,
        "C_measured_mean": float(np.mean(c_all)) if c_all else None,
        "n_conditions": measured.get("n_conditions"),
        "n_displayed": measured.get("n_displayed"),
        "replications": replications,
        "end_time": run.end if run.end is not None else run.folder.end_time,
        "window_s": run.window,
        "measurement": measurement_of(run.folder),
        "busy_basis": run.busy_basis,
        "L_basis": run.L_basis,
        "notes": "; ".join(run.notes),
    }
    for metric in COMPARED:
        value = measured.get(metric)
        row[f"{metric}_measured"] = value
        row[f"{metric}_predicted"] = predicted[metric]
        row[f"{metric}_err_pct"] = error_pct(value, predicted[metric])
    stall_m, stall_p = row["stall_pct_measured"], row["stall_pct_predicted"]
    row["stall_pct_abs_err"] = (
        stall_p - stall_m if stall_m is not None and stall_p is not None else None
    )
    activity = measured.get("kernel_activity")
    row["kernel_activity_measured"] = activity
    row["kernel_activity_err_pct"] = error_pct(activity, predicted["busy_pct"])
    row["kernel_activity_note"] = measured.get("kernel_activity_note")
    row["MAPE"] = mape(row[f"{m}_err_pct"] for m in COMPARED)
    return row


def compare_runs(paths: list[Path], replications: int = 20, seed: int = 0,
                 allow_empty: bool = False,
                 max_events: int = DEFAULT_MAX_EVENTS) -> Comparison:
    """Measured vs predicted for every run folder under ``paths``.

    Folders that are not single runs (an experiment, bare records, a folder that is no run)
    and runs with nothing to compare are skipped and listed with the reason; it is an error
    only if nothing is left to compare (unless ``allow_empty``). Viewer-side client runs
    are left to :mod:`latsim.analysis.viewer_compare`.
    """
    found, passed_over = scan_run_folders(paths)
    found = [p for p in found if read_run_folder(p).config.get("kind") != VIEWER_KIND]
    skipped = [{"path": str(p), "reason": reason} for p, reason in passed_over]
    served = [p for p in found if read_run_folder(p).kind == SERVED]
    skipped += [{"path": str(p), "reason": "a served session (latsim serve --out): its jobs "
                 "shared a device with other sessions; compare its client folder, predicted "
                 "with the others"} for p in served]
    found = [p for p in found if p not in served]
    runs = []
    for path in found:
        try:
            runs.append(load_measured(path))
        except LatsimError as exc:
            reason = str(exc)
            reason = reason.removeprefix(f"{path}: ")
            skipped.append({"path": str(path), "reason": reason})
    if not runs and not allow_empty:
        raise LatsimError("nothing to compare: " + "; ".join(
            f"{s['path']}: {s['reason']}" for s in skipped))
    check_int("--replications", replications, 1, MAX_SEEDS)
    slots = sum(((run.window if run.window is not None else run.duration)
                 + 10 * run.controller_config.timing.T) / run.controller_config.timing.delta
                + len(run.trace.times) for run in runs)
    check_work(slots * replications, max_events, "--max-events",
               f"{len(runs)} run(s) x {replications} replication(s) come to about {{n}} "
               "events (latent slots and conditions)", ", or give fewer --replications")
    rows, predicted_l = [], []
    for run in runs:
        predicted, sims = predict(run, replications, seed)
        predicted_l.append(tuple(c.L for r in sims for c in r.conditions if c.displayed))
        rows.append(_row(run, predicted, replications))
    complete = [row for row in rows if row["status"] == COMPLETE]
    basis = complete or rows
    if not complete:
        over = "partial runs only (no complete run), each over its own window"
    elif len(complete) < len(rows):
        over = "complete runs (partial ones are left out)"
    else:
        over = "all runs (all complete)"
    return Comparison(
        rows, mape(row[f"{m}_err_pct"] for row in basis for m in COMPARED), predicted_l,
        runs, skipped, [row["run"] for row in basis], over,
        mape(row[f"{m}_err_pct"] for row in rows for m in COMPARED),
    )
