"""The executor: what runs a live generator's jobs for the driver, with injected faults.

:class:`GeneratorExecutor` adapts a :class:`latsim.plugins.LiveGenerator` to the driver's
``run_job(job)`` (decoding the commit unit where asked) and applies the ``LATSIM_FAULT``
faults of :mod:`harness.live.faults` to the jobs of the pass it is labelled with.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from harness.live.faults import FAULT_ENV, Fault, InjectedFault, faults_from_env
from latsim.controller import StartJob
from latsim.plugins import JobTiming, LiveGenerator


class ExecutorClosed(RuntimeError):
    """A job was given to (or held in) an executor the driver has closed."""


class GeneratorExecutor:
    """Adapts the generator to the driver's ``run_job(job)``, decoding ``decode_group``;
    applies ``LATSIM_FAULT`` faults (read when the executor is made) to the jobs of the pass
    named ``label``."""

    def __init__(self, generator: LiveGenerator, decode_group: int, label: str = "",
                 faults: Sequence[Fault] | None = None) -> None:
        self.generator = generator
        self.decode_group = decode_group
        self.label = label
        self.faults = tuple(faults_from_env() if faults is None else faults)
        self.jobs_run = 0
        self._closed = threading.Event()

    def close(self) -> None:
        """Refuse further jobs and end an injected stall or slowdown now."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def run_job(self, job: StartJob) -> JobTiming:
        if self._closed.is_set():
            raise ExecutorClosed(f"executor of {self.label or 'this pass'} is closed")
        self.jobs_run += 1
        number = self.jobs_run
        t_call = time.perf_counter()
        delayed = False
        for fault in self.faults:
            if not fault.applies(number, self.label):
                continue
            if fault.kind == "raise":
                raise InjectedFault(f"{FAULT_ENV} {fault}: job {number} of "
                                    f"{self.label or 'this pass'} raised")
            if fault.kind in ("stall", "slow"):
                delayed = True
                if self._closed.wait(fault.seconds):
                    raise ExecutorClosed(f"{FAULT_ENV} {fault}: job {number} abandoned")
            else:
                os.kill(os.getpid(), signal.SIGINT if fault.kind == "sigint"
                        else signal.SIGTERM)
        timing = self.generator.run_job(job, self.decode_group)
        # a delayed job took that much longer, as measured
        return replace(timing, t_start=t_call) if delayed else timing
