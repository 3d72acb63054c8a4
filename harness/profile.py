"""Profiling the generator: C per K and job kind, written as a cost table for the simulator.

A *refill* job continues the stream at the end of the cache; a *replan* job branches inside
the previous job's output under a new condition version (and may carry extra work, e.g. a
continuation adapter, in other generators). Each timed job follows an idle gap, as jobs do
in a live run (back-to-back jobs run hot and underestimate C). The output file is read by
``--cost table:PATH`` (:func:`latsim.model.costs.load_table`): every sample is kept, so the
simulator resamples the empirical distribution.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.generator import GeneratorConfig, WanGenerator, device_name
from latsim.controller import StartJob
from latsim.errors import LatsimError


@dataclass(frozen=True)
class ProfileConfig:
    generator: GeneratorConfig
    Ks: tuple[int, ...]
    jobs_per_kind: int = 20
    gap_s: float = 0.3
    untimed: int = 2

    def __post_init__(self) -> None:
        if not self.Ks or any(k <= 0 for k in self.Ks):
            raise LatsimError(f"--K must be positive integers, got {list(self.Ks)}")
        if self.jobs_per_kind <= 0:
            raise LatsimError(f"--jobs must be a positive integer, got {self.jobs_per_kind}")
        if self.gap_s < 0:
            raise LatsimError(f"--gap must be >= 0 seconds, got {self.gap_s}")


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values)
    return {"n": int(arr.size), "mean": float(arr.mean()), "p50": float(np.median(arr)),
            "p99": float(np.quantile(arr, 0.99)), "cv": float(arr.std() / arr.mean())}


def profile(config: ProfileConfig, progress=None) -> dict:
    """Time ``jobs_per_kind`` refill and replan jobs per K; returns the profile document."""
    generator = WanGenerator(config.generator)
    costs: dict[str, dict[str, list[float]]] = {}
    for K in config.Ks:  # noqa: N806
        generator.warmup(K, untimed=config.untimed, timed=0)
        generator.reset_stream(K)
        samples: dict[str, list[float]] = {"refill": [], "replan": []}
        branch, version, job_id = K, 0, 1
        for i in range(2 * config.jobs_per_kind):
            kind = "refill" if i % 2 == 0 else "replan"
            if kind == "replan":  # branch inside the last job's output, new version
                branch, version = branch - K + max(1, K // 2), version + 1
            time.sleep(config.gap_s)
            job = StartJob(job_id, kind, branch, K, version, branch)
            samples[kind].append(generator.run_job(job).wall_s)
            branch, job_id = branch + K, job_id + 1
            if progress:
                progress(f"K={K}: {i + 1}/{2 * config.jobs_per_kind} jobs")
        costs[str(K)] = samples
    from harness.measured import versions

    return {
        "costs": costs,
        "summary": {k: {kind: _stats(v) for kind, v in kinds.items()}
                    for k, kinds in costs.items()},
        "config": {**asdict(config), "generator": asdict(config.generator)},
        "device_name": device_name(config.generator.device),
        "versions": versions(),
        "note": "generator wall time per job (s); use with --cost table:THIS_FILE",
    }


def write_profile(document: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
