"""The executor: what runs a live generator's jobs for the driver, with injected faults.

:class:`GeneratorExecutor` adapts a :class:`latsim.plugins.LiveGenerator` to the driver's
``run_job(job)`` (decoding the commit unit where asked) and applies the ``LATSIM_FAULT``
faults of :mod:`harness.live.faults` to the jobs of the pass it is labelled with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from harness.live.faults import ExecutorClosed, Fault, JobFaults
from latsim.controller import StartJob
from latsim.plugins import JobTiming, LiveGenerator

__all__ = ["ExecutorClosed", "GeneratorExecutor"]


class GeneratorExecutor:
    """Adapts the generator to the driver's ``run_job(job)``, decoding ``decode_group``;
    applies ``LATSIM_FAULT`` faults (read when the executor is made) to the jobs of the pass
    named ``label``."""

    def __init__(self, generator: LiveGenerator, decode_group: int, label: str = "",
                 faults: Sequence[Fault] | None = None) -> None:
        self.generator = generator
        self.decode_group = decode_group
        self.label = label
        self._faults = JobFaults(label, faults)
        self.faults = self._faults.faults

    def close(self) -> None:
        """Refuse further jobs and end an injected stall or slowdown now."""
        self._faults.close()

    @property
    def closed(self) -> bool:
        return self._faults.closed

    @property
    def jobs_run(self) -> int:
        return self._faults.jobs_run

    def run_job(self, job: StartJob) -> JobTiming:
        t_call = time.perf_counter()
        delayed = self._faults.before()
        timing = self.generator.run_job(job, self.decode_group)
        # a delayed job took that much longer, as measured
        return replace(timing, t_start=t_call) if delayed else timing
