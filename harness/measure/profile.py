"""Profiling the generator: C per K and job kind, written as a cost table for the simulator.

A *refill* job continues the stream at the end of the cache; a *replan* job branches inside
the previous job's output under a new condition version (and may carry extra work, e.g. a
continuation adapter, in other generators). Each timed job follows an idle gap, as jobs do
in a live run (back-to-back jobs run hot and underestimate C). The output file is read by
``--cost table:PATH`` (:func:`latsim.model.costs.load_table`): every sample is kept, so the
simulator resamples the empirical distribution.

:func:`run_profile` is what ``latsim profile`` calls: it checks that the output can be
written before building the model, bounds the work (``--jobs``, ``--gap`` and the total idle
time, :data:`latsim.errors.OPTION_BOUNDS`), handles SIGTERM like Ctrl-C and, when stopped early,
keeps the jobs timed so far in ``<out stem>.partial.json`` (status ``interrupted``; the
profile file itself is written only when every job has run) and raises
:class:`~latsim.errors.Interrupted` saying so. Jobs run through
:class:`harness.live.executor.GeneratorExecutor` (label ``profile-K<K>``), so ``LATSIM_FAULT``
applies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.generators.device import device_name
from harness.live.driver import SIGTERM, Terminated, sigterm_as_interrupt
from harness.live.executor import GeneratorExecutor
from harness.live.faults import faults_from_env
from harness.measure.run import check_ks
from latsim.controller import StartJob
from latsim.errors import Interrupted, LatsimError, check_option
from latsim.numeric import empirical_quantile
from latsim.plugins import GeneratorConfig, LiveGenerator, build_generator
from latsim.run.files import check_writable
from latsim.run.folder import write_json
from latsim.writing import writing

#: The profile's idle gaps (2 x jobs x K values x gap) may take at most this long, seconds.
MAX_IDLE_S = 3600.0
#: At most this many timed jobs in one profile (2 x jobs x K values).
MAX_TIMED_JOBS = 20000


@dataclass(frozen=True)
class ProfileConfig:
    generator: GeneratorConfig
    Ks: tuple[int, ...]
    jobs_per_kind: int = 20
    gap_s: float = 0.3
    untimed: int = 2
    generator_name: str = "wan"  # a registered live generator

    def __post_init__(self) -> None:
        check_ks(self.Ks)
        check_option("--jobs", self.jobs_per_kind)
        check_option("--gap", self.gap_s)
        check_option("--warmup-untimed", self.untimed)
        timed = 2 * self.jobs_per_kind * len(self.Ks)
        if timed > MAX_TIMED_JOBS:
            raise LatsimError(f"{timed} timed jobs (2 kinds x --jobs {self.jobs_per_kind} x "
                              f"{len(self.Ks)} K) exceed the {MAX_TIMED_JOBS} a profile may "
                              "run; lower --jobs or give fewer --K")
        if timed * self.gap_s > MAX_IDLE_S:
            raise LatsimError(f"the idle gaps would take {timed * self.gap_s:g} s "
                              f"({timed} jobs x --gap {self.gap_s:g} s), more than the "
                              f"{MAX_IDLE_S:g} s a profile may; lower --jobs or --gap")


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values)
    return {"n": int(arr.size), "mean": float(arr.mean()), "p50": float(np.median(arr)),
            "p99": empirical_quantile(arr, 0.99), "cv": float(arr.std() / arr.mean())}


def _time_jobs(config: ProfileConfig, costs: dict[str, dict[str, list[float]]],
               progress: Callable[..., None] | None,
               generator: LiveGenerator | None = None) -> None:
    """Time the jobs into ``costs`` (K -> kind -> seconds) as they finish."""
    if generator is None:
        generator = build_generator(config.generator_name, config.generator)
    for K in config.Ks:
        generator.warmup(K, untimed=config.untimed, timed=0)
        generator.reset_stream(K)
        executor = GeneratorExecutor(generator, 1, f"profile-K{K}")
        samples: dict[str, list[float]] = {"refill": [], "replan": []}
        costs[str(K)] = samples
        branch, version, job_id = K, 0, 1
        for i in range(2 * config.jobs_per_kind):
            kind = "refill" if i % 2 == 0 else "replan"
            if kind == "replan":  # branch inside the last job's output, new version
                branch, version = branch - K + max(1, K // 2), version + 1
            time.sleep(config.gap_s)
            job = StartJob(job_id, kind, branch, K, version, branch)
            samples[kind].append(executor.run_job(job).wall_s)
            branch, job_id = branch + K, job_id + 1
            if progress:
                done = config.Ks.index(K) * 2 * config.jobs_per_kind + i + 1
                progress(f"K={K}: {i + 1}/{2 * config.jobs_per_kind} jobs", done,
                         2 * config.jobs_per_kind * len(config.Ks))


def _document(config: ProfileConfig, costs: dict[str, dict[str, list[float]]],
              status: str = "complete") -> dict:
    from harness.measure.folder import versions
    from latsim.analysis.cost_fit import fit_profile

    return {
        "costs": costs,
        "summary": {k: {kind: _stats(v) for kind, v in kinds.items() if v}
                    for k, kinds in costs.items()},
        "fit": fit_profile(costs),
        "config": {**asdict(config), "generator": asdict(config.generator)},
        "device_name": device_name(config.generator.device),
        "versions": versions(),
        "status": status,
        "note": "generator wall time per job (s); use with --cost table:THIS_FILE",
    }


def profile(config: ProfileConfig, progress: Callable[..., None] | None = None,
            generator: LiveGenerator | None = None) -> dict:
    """Time ``jobs_per_kind`` refill and replan jobs per K; returns the profile document."""
    costs: dict[str, dict[str, list[float]]] = {}
    _time_jobs(config, costs, progress, generator)
    return _document(config, costs)


def partial_path(out: Path) -> Path:
    """Where an interrupted profile keeps its jobs: ``<stem>.partial<suffix>`` beside
    ``out``."""
    return out.with_name(f"{out.stem}.partial{out.suffix or '.json'}")


def run_profile(config: ProfileConfig, out: Path,
                progress: Callable[..., None] | None = None,
                generator: LiveGenerator | None = None) -> dict:
    """Profile and write ``out`` (what ``latsim profile`` does); see the module docstring
    for the checks before any work and what an interruption keeps."""
    faults_from_env()  # a malformed LATSIM_FAULT fails before any work
    if out.is_dir():
        raise LatsimError(f"--out {out}: is a folder; give the profile file to write")
    check_writable(out.parent, keep=True)
    costs: dict[str, dict[str, list[float]]] = {}
    try:
        with sigterm_as_interrupt():
            _time_jobs(config, costs, progress, generator)
    except KeyboardInterrupt as exc:
        by = SIGTERM if isinstance(exc, Terminated) else "Ctrl-C"
        timed = sum(len(v) for kinds in costs.values() for v in kinds.values())
        total = 2 * config.jobs_per_kind * len(config.Ks)
        if not timed:
            raise Interrupted(f"kept nothing: stopped by {by} before the first timed job "
                              f"({out} not written)") from None
        partial = partial_path(out)
        write_profile(_document(config, costs, "interrupted"), partial)
        raise Interrupted(f"kept {timed} of {total} timed jobs in {partial} (status "
                          f"interrupted; {out} not written): stopped by {by}") from None
    document = _document(config, costs)
    write_profile(document, out)
    return document


def write_profile(document: dict, path: Path) -> Path:
    """Write the profile (atomically: a temporary name, then a rename); a failure names
    ``path``."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, document)
    return path
