"""Measured vs predicted: re-simulate measured runs and report the disagreement.

A *run folder* holds one (K, policy) run: ``config.json`` (K, policy, q, commit, r, fps,
duration, lead, the trace copy), ``summary.json`` (metrics as :func:`latsim.analysis.metrics.summarize`
computes them, plus ``kernel_activity`` for live runs), the record CSVs and the trace.
``latsim measure`` writes them; :func:`write_run_dir` writes one from simulator records.

The prediction re-runs the same trace through the simulator with the same policy, K, lead
and window, drawing each job's C from the run's own measured job times (by job kind), over
several cost seeds; errors are ``100·(predicted − measured)/measured`` per metric and MAPE
over all runs (:mod:`latsim.analysis.fidelity`).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latsim.analysis import theory
from latsim.analysis.fidelity import error_pct, mape
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig
from latsim.controller.policies import Policy
from latsim.controller.records import RECORD_TYPES, ConditionRecord, JobRecord, read_csv, write_csv
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.costs import TableCost
from latsim.model.traces import Trace, load_trace, write_trace
from latsim.run.files import dumps
from latsim.sim.simpy_driver import RunRecords, simulate_trace

#: Metrics compared per run (DESIGN §4 names). stall_pct is also compared in percentage
#: points, since its relative error is undefined when the measured value is 0.
COMPARED = ("L_mean", "L50", "L95", "stall_pct", "busy_pct", "w", "dit_calls")


@dataclass(frozen=True)
class MeasuredRun:
    """One run folder, loaded."""

    run_dir: Path
    name: str
    config: dict
    summary: dict
    trace: Trace
    job_costs: dict[str, tuple[float, ...]]  # measured C (t_ready − t_start) per job kind
    latencies: tuple[float, ...]  # measured L of displayed conditions (wall clock if live)

    @property
    def timing(self) -> Timing:
        return Timing(int(self.config["K"]), int(self.config["r"]), float(self.config["fps"]))

    @property
    def policy(self) -> Policy:
        return Policy(self.config["policy"], int(self.config["q"]), self.config["commit"],
                      float(self.config.get("commit_lead", 0.0)))

    @property
    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(self.timing, self.policy, float(self.config["lead"]))

    @property
    def duration(self) -> float:
        return float(self.config["duration"])

    def cost_model(self) -> TableCost:
        """The run's own job times as an empirical cost model (resampled per job kind)."""
        K = self.timing.K  # noqa: N806
        samples = {(K, kind): values for kind, values in self.job_costs.items() if values}
        if not samples:
            raise LatsimError(f"{self.run_dir}: no finished jobs to take C samples from")
        return TableCost(str(self.run_dir / "jobs.csv"), samples)


def is_run_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "conditions.csv").is_file()


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder or a folder of them."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise LatsimError(f"{path}: no such folder")
        if is_run_dir(path):
            found.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p))
        if not inside:
            raise LatsimError(f"{path}: not a run folder (config.json + conditions.csv) "
                              "and holds none")
        found.extend(inside)
    return found


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LatsimError(f"{path}: cannot read ({exc})") from None


def load_run(run_dir: Path) -> MeasuredRun:
    """Load a run folder (see the module docstring)."""
    config = _read_json(run_dir / "config.json")
    summary = _read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    missing = [k for k in ("K", "policy", "q", "commit", "r", "fps", "duration", "lead")
               if k not in config]
    if missing:
        raise LatsimError(f"{run_dir}/config.json lacks {', '.join(missing)}")
    trace_file = run_dir / config.get("trace_copy", "trace.jsonl")
    trace = load_trace(trace_file)
    costs: dict[str, list[float]] = {}
    for _, job in read_csv(run_dir / "jobs.csv", JobRecord):
        if job.kind != "prebuffer":
            costs.setdefault(job.kind, []).append(job.t_ready - job.t_start)
    display = run_dir / "display.csv"
    if display.exists():  # a live run: L on the wall clock, as its summary reports it
        with display.open(newline="") as handle:
            latencies = tuple(float(row["L_wall"]) for row in csv.DictReader(handle))
    else:
        latencies = tuple(
            c.L for _, c in read_csv(run_dir / "conditions.csv", ConditionRecord)
            if c.displayed
        )
    return MeasuredRun(run_dir, run_dir.name, config, summary, trace,
                       {k: tuple(v) for k, v in costs.items()}, latencies)


def predict(run: MeasuredRun, replications: int = 20, seed: int = 0
            ) -> tuple[dict, list[RunRecords]]:
    """Re-simulate ``run`` ``replications`` times with its own C samples.

    Each metric is predicted as its mean over the replications, each summarised like the
    measured run (one window of one trace): the expected value of what the measurement
    reports, not the metric of a pooled sample (percentiles of a pooled sample differ).
    """
    if replications <= 0:
        raise LatsimError(f"replications must be positive, got {replications}")
    cost = run.cost_model()
    streams = np.random.SeedSequence(seed).spawn(replications)
    runs = []
    for stream in streams:
        records, _ = simulate_trace(run.controller_config, cost, run.trace, run.duration,
                                    np.random.default_rng(stream))
        runs.append(records)
    per_run = [summarize([r]).as_dict() for r in runs]
    predicted = {}
    for key in per_run[0]:
        values = [m[key] for m in per_run if m[key] is not None]
        predicted[key] = float(np.mean(values)) if values else None
    return predicted, runs


@dataclass(frozen=True)
class Comparison:
    rows: list[dict]
    mape: float | None
    predicted_latencies: list[tuple[float, ...]]  # pooled over replications, per row
    runs: list[MeasuredRun]


def compare_runs(paths: list[Path], replications: int = 20, seed: int = 0) -> Comparison:
    """Measured vs predicted for every run folder under ``paths``."""
    runs = [load_run(p) for p in find_run_dirs(paths)]
    rows, predicted_l = [], []
    for run in runs:
        predicted, sims = predict(run, replications, seed)
        predicted_l.append(tuple(
            c.L for r in sims for c in r.conditions if c.displayed
        ))
        c_all = [c for values in run.job_costs.values() for c in values]
        row: dict = {
            "run": run.name,
            "policy": run.policy.name,
            "K": run.timing.K,
            "T": run.timing.T,
            "delta": run.timing.delta,
            "lead": float(run.config["lead"]),
            "C_measured_mean": float(np.mean(c_all)) if c_all else None,
            "n_conditions": run.summary.get("n_conditions"),
            "n_displayed": run.summary.get("n_displayed"),
            "replications": replications,
        }
        for metric in COMPARED:
            measured = run.summary.get(metric)
            row[f"{metric}_measured"] = measured
            row[f"{metric}_predicted"] = predicted[metric]
            row[f"{metric}_err_pct"] = error_pct(measured, predicted[metric])
        stall_m, stall_p = row["stall_pct_measured"], row["stall_pct_predicted"]
        row["stall_pct_abs_err"] = (
            stall_p - stall_m if stall_m is not None and stall_p is not None else None
        )
        activity = run.summary.get("kernel_activity")
        row["kernel_activity_measured"] = activity
        row["kernel_activity_err_pct"] = error_pct(activity, predicted["busy_pct"])
        row["kernel_activity_note"] = run.summary.get("kernel_activity_note")
        row["MAPE"] = mape(row[f"{m}_err_pct"] for m in COMPARED)
        rows.append(row)
    overall = mape(row[f"{m}_err_pct"] for row in rows for m in COMPARED)
    return Comparison(rows, overall, predicted_l, runs)


def theory_lines(row: dict) -> dict[str, float | None]:
    """Closed forms at a run's measured mean C and its lead (None outside their validity):
    the baseline's L is uniform on [lead, lead + T); the speculative mean is eq. (6) + Q
    planned ``lead`` ahead (:func:`latsim.analysis.theory.speculative_latency_mean`)."""
    C, T, delta, lead = row["C_measured_mean"], row["T"], row["delta"], row["lead"]  # noqa: N806
    out: dict[str, float | None] = {"baseline_L50": None, "baseline_L95": None,
                                    "speculative_L_mean": None}
    if C is None:
        return out
    if C <= lead:
        out["baseline_L50"] = theory.baseline_latency_quantile(lead, T, 0.5)
        out["baseline_L95"] = theory.baseline_latency_quantile(lead, T, 0.95)
    if C <= T and C <= lead:
        out["speculative_L_mean"] = theory.speculative_latency_mean(C, T, delta, lead)
    return out


def write_run_dir(run_dir: Path, config: ControllerConfig, trace: Trace, duration: float,
                  records: RunRecords, extra_summary: dict | None = None) -> Path:
    """Write simulator records as a run folder (the layout ``latsim measure`` writes), so
    simulated runs can be compared, plotted and checked like measured ones."""
    run_dir.mkdir(parents=True, exist_ok=True)
    policy, timing = config.policy, config.timing
    conf = {
        "K": timing.K, "policy": policy.name, "q": policy.commit_unit(timing.K),
        "commit": policy.commit, "commit_lead": policy.commit_lead, "r": timing.r,
        "fps": timing.fps, "T": timing.T, "delta": timing.delta, "duration": duration,
        "lead": config.lead, "trace_copy": "trace.jsonl", "source": "simulated",
    }
    summary = {"policy": policy.name, "K": timing.K, "T": timing.T, "delta": timing.delta,
               "lead": config.lead, **summarize([records]).as_dict(), **(extra_summary or {})}
    (run_dir / "config.json").write_text(dumps(conf) + "\n")
    (run_dir / "summary.json").write_text(dumps(summary) + "\n")
    write_trace(run_dir / "trace.jsonl", list(trace.times), {"duration": duration})
    extra = (("policy", policy.name), ("K", timing.K), ("run", 0))
    for table, record_type in RECORD_TYPES.items():
        write_csv(run_dir / f"{table}.csv", record_type, getattr(records, table), extra=extra)
    return run_dir
