"""Measured vs predicted: re-simulate measured runs and report the disagreement.

Each run folder (:mod:`latsim.run.folder`, kind ``measured`` or ``simulated``) holds one
(K, policy) run. The prediction re-runs the same trace through the simulator with the same
policy, K, lead and window, drawing each job's C from the run's own measured job times (by job
kind), over several cost seeds; errors are ``100·(predicted − measured)/measured`` per metric
and MAPE over all runs (:mod:`latsim.analysis.fidelity`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latsim.analysis.fidelity import error_pct, mape
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.errors import LatsimError
from latsim.model.costs import CostModel, TableCost
from latsim.model.traces import Trace
from latsim.run.folder import (
    RunFolder,
    RunIdentity,
    find_run_folders,
    read_run_folder,
    summary_row,
    write_simulated_run,
)
from latsim.run.stream import RunRecords
from latsim.sim.simpy_driver import simulate_trace

#: Metrics compared per run (DESIGN §4 names). stall_pct is also compared in percentage
#: points, since its relative error is undefined when the measured value is 0.
COMPARED = ("L_mean", "L50", "L95", "stall_pct", "busy_pct", "w", "dit_calls")


@dataclass(frozen=True)
class MeasuredRun:
    """One single-run folder, loaded for comparison."""

    folder: RunFolder
    trace: Trace
    job_costs: dict[str, tuple[float, ...]]  # measured C (t_ready − t_start) per job kind
    latencies: tuple[float, ...]  # measured L of displayed conditions (wall clock if live)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def summary(self) -> dict:
        return self.folder.summary

    @property
    def controller_config(self) -> ControllerConfig:
        return self.folder.controller_config

    @property
    def duration(self) -> float:
        return self.folder.duration

    def cost_model(self) -> TableCost:
        """The run's own job times as an empirical cost model (resampled per job kind)."""
        K = self.controller_config.timing.K  # noqa: N806
        samples = {(K, kind): values for kind, values in self.job_costs.items() if values}
        if not samples:
            raise LatsimError(f"{self.folder.path}: no finished jobs to take C samples from")
        return TableCost(str(self.folder.path / "jobs.csv"), samples)


def load_measured(run_dir: Path) -> MeasuredRun:
    """Read a single-run folder with what a comparison needs: trace, C samples, latencies."""
    folder = read_run_folder(run_dir)
    folder.require_single_run()
    costs: dict[str, list[float]] = {}
    for _, job in folder.records("jobs"):
        assert isinstance(job, JobRecord)
        if job.kind != "prebuffer":
            costs.setdefault(job.kind, []).append(job.t_ready - job.t_start)
    display = folder.path / "display.csv"
    if display.exists():  # a live run: L on the wall clock, as its summary reports it
        with display.open(newline="") as handle:
            latencies = tuple(float(row["L_wall"]) for row in csv.DictReader(handle))
    else:
        latencies = tuple(
            c.L for _, c in folder.records("conditions")
            if isinstance(c, ConditionRecord) and c.displayed
        )
    return MeasuredRun(folder, folder.trace(), {k: tuple(v) for k, v in costs.items()},
                       latencies)


def write_simulated(run_dir: Path, config: ControllerConfig, cost: CostModel, trace: Trace,
                    records: RunRecords, seed: int | None = None) -> Path:
    """Write one simulated run as a run folder, summarised like every other run."""
    K = config.timing.K  # noqa: N806
    identity = RunIdentity.of(config, cost.spec, cost.mean(K), f"trace:{trace.name}",
                              records.duration, seed)
    summary = summary_row(identity, summarize([records]).as_dict())
    return write_simulated_run(run_dir, config, trace, records, summary)


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
    runs = [load_measured(p) for p in find_run_folders(paths)]
    rows, predicted_l = [], []
    for run in runs:
        predicted, sims = predict(run, replications, seed)
        predicted_l.append(tuple(
            c.L for r in sims for c in r.conditions if c.displayed
        ))
        c_all = [c for values in run.job_costs.values() for c in values]
        config = run.controller_config
        row: dict = {
            "run": run.name,
            "policy": config.policy.name,
            "K": config.timing.K,
            "T": config.timing.T,
            "delta": config.timing.delta,
            "lead": config.lead,
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
