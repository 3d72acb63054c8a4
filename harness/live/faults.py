"""Fault injection for tests: ``LATSIM_FAULT`` makes the live executor misbehave on purpose.

:class:`harness.live.executor.GeneratorExecutor` runs every job of a live run, of a
calibration pass and of ``latsim profile``; the environment variable ``LATSIM_FAULT`` makes
it misbehave on purpose, so the failure paths can be tested in CI on the tiny preset::

    LATSIM_FAULT="FAULT[,FAULT...]"      FAULT = KIND@N[:SECONDS][/WHERE]

    raise@3            job 3 raises RuntimeError (a generator failure)
    stall@2:60         job 2 does not return for 60 s (a hang), then runs
    slow@4:0.5         job 4 takes 0.5 s longer (counted in its measured time)
    sigint@2           job 2 sends the process SIGINT (as Ctrl-C would), then runs
    sigterm@2          job 2 sends the process SIGTERM, then runs
    raise@1/calibration   only in passes whose label contains ``calibration``

``N`` counts the jobs one executor has run, from 1 (:class:`JobFaults` keeps the count):
each live run (label: its run folder's name, e.g. ``K4-baseline``), each in-run calibration
pass (``calibration-K4``) and each K of a profile (``profile-K4``) has its own executor, so
in a run job N is the controller's job id N. ``WHERE`` is matched as a substring of that
label. Warm-up jobs do not go through an executor and are never faulted. A stall or slowdown
ends early when the executor is closed (the driver closes it when it abandons a hung
worker), so a test leaves no thread holding the generator. A malformed value is a one-line
error before any work.

``latsim serve`` applies them per session: a session's jobs are counted from 1 and its
label is its id (``s<N>-<hex>``), so ``raise@2/s1-`` fails the second job of the first
session only. Its faults act on the shared device, holding it while they stall.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from latsim.errors import LatsimError

#: The environment variable of the fault-injection hook.
FAULT_ENV = "LATSIM_FAULT"
FAULT_KINDS = ("raise", "stall", "slow", "sigint", "sigterm")


@dataclass(frozen=True)
class Fault:
    """One injected fault: job ``job`` of every pass whose label contains ``where``."""

    kind: str
    job: int
    seconds: float = 0.0
    where: str = ""

    def applies(self, job_number: int, label: str) -> bool:
        return job_number == self.job and self.where in label

    def __str__(self) -> str:
        seconds = f":{self.seconds:g}" if self.kind in ("stall", "slow") else ""
        where = f"/{self.where}" if self.where else ""
        return f"{self.kind}@{self.job}{seconds}{where}"


def parse_faults(text: str) -> tuple[Fault, ...]:
    """Parse a ``LATSIM_FAULT`` value (see the module docstring)."""
    faults = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        spec, _, where = part.partition("/")
        kind, at, rest = spec.partition("@")
        number, _, seconds = rest.partition(":")
        problem = None
        if kind not in FAULT_KINDS:
            problem = f"unknown kind {kind!r} (choose {', '.join(FAULT_KINDS)})"
        elif not at or not number.isdigit() or int(number) < 1:
            problem = "expected KIND@N with a job number N >= 1"
        elif kind in ("stall", "slow"):
            try:
                value = float(seconds)
            except ValueError:
                value = float("nan")
            if not 0 <= value <= 3600:  # also rejects nan
                problem = f"{kind} needs :SECONDS in [0, 3600]"
        elif seconds:
            problem = f"{kind} takes no :SECONDS"
        if problem is not None:
            raise LatsimError(f"{FAULT_ENV}={text!r}: {part!r}: {problem}; "
                              "syntax KIND@N[:SECONDS][/WHERE], e.g. stall@2:60")
        faults.append(Fault(kind, int(number), float(seconds or 0.0), where))
    return tuple(faults)


def faults_from_env(environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    """The faults ``LATSIM_FAULT`` asks for (none when it is unset or empty)."""
    return parse_faults((os.environ if environ is None else environ).get(FAULT_ENV, ""))


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises."""


class ExecutorClosed(RuntimeError):
    """A job was given to (or held in) an executor the driver has closed."""


class JobFaults:
    """The faults of one pass (label ``label``), applied to its jobs in turn: call
    :meth:`before` as each job starts; :meth:`close` refuses further jobs and ends an
    injected stall or slowdown now."""

    def __init__(self, label: str = "", faults: Sequence[Fault] | None = None) -> None:
        self.label = label
        self.faults = tuple(faults_from_env() if faults is None else faults)
        self.jobs_run = 0
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def before(self) -> bool:
        """Count the job starting now and apply its faults; whether it was delayed (a stall
        or slowdown, which then counts in its measured time). Raises
        :class:`InjectedFault` for a ``raise``, :class:`ExecutorClosed` once closed."""
        where = self.label or "this pass"
        if self._closed.is_set():
            raise ExecutorClosed(f"executor of {where} is closed")
        self.jobs_run += 1
        number, delayed = self.jobs_run, False
        for fault in self.faults:
            if not fault.applies(number, self.label):
                continue
            if fault.kind == "raise":
                raise InjectedFault(f"{FAULT_ENV} {fault}: job {number} of {where} raised")
            if fault.kind in ("stall", "slow"):
                delayed = True
                if self._closed.wait(fault.seconds):
                    raise ExecutorClosed(f"{FAULT_ENV} {fault}: job {number} abandoned")
            else:
                os.kill(os.getpid(), signal.SIGINT if fault.kind == "sigint"
                        else signal.SIGTERM)
        return delayed
