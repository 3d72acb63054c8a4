"""Run folders for compare and timeline tests: complete, interrupted, killed and live-style
runs, built from simulations so every expected number is known."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from latsim.analysis.compare import write_simulated
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.timing import Timing
from latsim.model.costs import FixedCost
from latsim.model.traces import Trace
from latsim.run.folder import RunIdentity, summary_row, write_simulated_run
from latsim.run.stream import INTERRUPTED, BusyInterval
from latsim.sim.simpy_driver import simulate_trace

TIMES = (1.3, 4.07, 4.5, 9.91, 13.2, 16.66, 21.05, 24.4)
DURATION = 30.0
C = 0.2
#: When each record type happened (the column a killed writer would have reached).
TIME_COLUMN = {"jobs": "t_ready", "slots": "t_start", "stalls": "t_start", "discards": "t",
               "conditions": "t_play"}


def trace() -> Trace:
    return Trace("synthetic", TIMES, DURATION)


def config(K: int = 8, policy: Policy = SPECULATIVE) -> ControllerConfig:
    return ControllerConfig(Timing(K, 4, 16.0), policy, C)


def complete_run(run_dir: Path, K: int = 8, policy: Policy = SPECULATIVE) -> Path:
    cfg = config(K, policy)
    records, _ = simulate_trace(cfg, FixedCost(C), trace(), DURATION, np.random.default_rng(0))
    return write_simulated(run_dir, cfg, FixedCost(C), trace(), records)


def interrupted_run(run_dir: Path, end: float, K: int = 8,
                    policy: Policy = SPECULATIVE, reason: str = "KeyboardInterrupt") -> Path:
    """A run stopped at ``end`` that said so, as the live harness leaves one: records up to
    ``end``, config and summary with status interrupted and ``end_time``, and a summary
    taken over the full window (as the harness's is)."""
    cfg = config(K, policy)
    records, _ = simulate_trace(cfg, FixedCost(C), trace(), end, np.random.default_rng(0),
                                drain=0.0)
    assert not any(b.t_start < end < b.t_end for b in records.busy), "a job runs at end"
    records = replace(records, duration=DURATION, status=INTERRUPTED)
    identity = RunIdentity.of(cfg, "fixed", C, "trace:synthetic", DURATION, None)
    summary = summary_row(identity, summarize([records]).as_dict(), stop_reason=reason,
                          end_time=end)
    return write_simulated_run(run_dir, cfg, trace(), records, summary, stop_reason=reason)


def killed_run(run_dir: Path, cut: float, K: int = 8, policy: Policy = SPECULATIVE,
               torn: str | None = "jobs") -> Path:
    """A run whose writer was killed at ``cut``: config still ``running`` (no end_time), no
    summary, record rows only up to ``cut``, and (``torn``) a half-written last row."""
    complete_run(run_dir, K, policy)
    for table, column in TIME_COLUMN.items():
        path = run_dir / f"{table}.csv"
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            rows = [r for r in reader if r[column] and float(r[column]) <= cut]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, header)
            writer.writeheader()
            writer.writerows(rows)
    if torn:
        with (run_dir / f"{torn}.csv").open("a", newline="") as handle:
            handle.write(f"{policy.name},{K},0,99,ref")
    (run_dir / "summary.json").unlink()
    conf = json.loads((run_dir / "config.json").read_text())
    conf.pop("end_time")
    (run_dir / "config.json").write_text(json.dumps({**conf, "status": "running"}))
    return run_dir


GEN_HEADER = ["phase", "job_id", "kind", "K", "branch", "version", "context", "t_start",
              "t_end", "wall_s", "device_s", "decoded_latents", "decoded_frames",
              "controller_start"]


def live_style_run(run_dir: Path, dispatch: float, K: int = 4,
                   policy: Policy = BASELINE) -> Path:
    """A measured-kind run whose generator starts each job ``dispatch`` s after the
    controller did (the controller's C = t_ready − t_start includes it); its summary's busy %
    counts the generator's time, as the harness's does, and gen_jobs.csv holds both."""
    cfg = config(K, policy)
    records, _ = simulate_trace(cfg, FixedCost(C), trace(), DURATION, np.random.default_rng(0))
    generator = replace(records, busy=tuple(
        BusyInterval(b.job_id, b.t_start + dispatch, b.t_end) for b in records.busy))
    identity = RunIdentity.of(cfg, "live", C - dispatch, "trace:synthetic", DURATION, None)
    summary = summary_row(identity, summarize([generator]).as_dict())
    write_simulated_run(run_dir, cfg, trace(), records, summary)
    conf = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**conf, "kind": "measured"}))
    with (run_dir / "gen_jobs.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(GEN_HEADER)
        writer.writerow(["warmup", -1, "refill", K, 0, 0, 0, "", "", C, "", 0, 0, ""])
        for job in records.jobs:
            if job.kind != "prebuffer":
                writer.writerow(["run", job.job_id, job.kind, K, job.branch, job.version,
                                 job.context, job.t_start + dispatch, job.t_ready,
                                 job.t_ready - job.t_start - dispatch, "", 0, 0, job.t_start])
    return run_dir


def serving_run(run_dir: Path) -> Path:
    """A small serving experiment (two streams on shared pools): the controller's tables
    with a ``stream`` column, and tasks.csv, starts.csv, viewer.csv, client_stalls.csv."""
    from typer.testing import CliRunner

    from latsim.cli.root import app

    result = CliRunner().invoke(app, [
        "simulate", "--out", str(run_dir), "--K", "4", "--C", "0.3", "--streams", "2",
        "--pools", "dit=2,vae=1", "--decode", "fixed:0.05", "--duration", "8", "--seeds",
        "1", "--policy", "speculative", "--updates", "poisson:0.5", "--lead", "0.6"])
    assert result.exit_code == 0, result.stderr
    return run_dir


#: A committed client folder (``latsim client``'s side of a served session).
CLIENT_RUN = Path(__file__).resolve().parents[1] / "results" / "serve" / "runs" / "v2-baseline"


def client_run(run_dir: Path) -> Path:
    """A copy of a committed client folder (:data:`CLIENT_RUN`)."""
    import shutil

    shutil.copytree(CLIENT_RUN, run_dir)
    return run_dir


def set_cell(path: Path, line: int, column: str, cell: str) -> None:
    """Set ``column`` of CSV line ``line`` (1 is the header) to ``cell``."""
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    rows[line - 1][rows[0].index(column)] = cell
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def drop_column(path: Path, column: str) -> None:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    keep = [i for i, name in enumerate(rows[0]) if name != column]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([row[i] for i in keep] for row in rows)


def tear_last_row(path: Path) -> None:
    """Cut the last row short, as a writer killed mid-row leaves it (no line end)."""
    data = path.read_bytes().rstrip(b"\r\n")
    path.write_bytes(data[:-2])
