"""Writing an experiment's results: records as CSV, rows as CSV/JSON, and the sweep plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from latsim.controller.records import RECORD_TYPES, write_csv
from latsim.experiments.sweep import ExperimentResult


def clean(value: object) -> object:
    """JSON-safe value: NaN and infinities become ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def dumps(obj: object) -> str:
    """Deterministic JSON text for ``--json`` and summary files."""
    return json.dumps(clean(obj), indent=2, allow_nan=False)


def write_rows_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in clean(row).items()})


def write_experiment(result: ExperimentResult, out: Path, plot: bool = True) -> list[Path]:
    """Write ``summary.json``, ``summary.csv``, ``config.json``, one CSV per record type
    (with ``policy, K, run`` columns first) and ``latency_vs_K.png``. Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    experiment = result.plan.experiment
    config = {
        "Ks": list(experiment.Ks),
        "r": experiment.r,
        "fps": experiment.fps,
        "cost": result.plan.cost.spec,
        "lead": experiment.lead,
        "q": experiment.q,
        "policies": list(experiment.policies),
        "updates": result.plan.arrivals.spec,
        "duration": result.plan.duration,
        "replications": result.plan.replications,
        "seed": experiment.seed,
        "commit": experiment.commit,
        "commit_lead": experiment.commit_lead,
    }
    for name, payload in (("config.json", config), ("summary.json", result.rows)):
        (out / name).write_text(dumps(payload) + "\n")
        written.append(out / name)
    write_rows_csv(out / "summary.csv", result.rows)
    written.append(out / "summary.csv")
    for table, record_type in RECORD_TYPES.items():
        path = out / f"{table}.csv"
        first = True
        for (K, policy), runs in result.runs.items():  # noqa: N806
            for index, run in enumerate(runs):
                write_csv(path, record_type, getattr(run, table),
                          extra=(("policy", policy), ("K", K), ("run", index)),
                          append=not first)
                first = False
        written.append(path)
    if plot:
        from latsim.viz.plots import plot_latency_vs_k

        written.append(plot_latency_vs_k(result.rows, out / "latency_vs_K.png"))
    return written
