"""Warm-up and lead calibration of a live measurement, and the executor that runs jobs.

The measured C samples the lead is set from, by :data:`latsim.model.lead.LIVE` (the same rule
object the simulator uses). Timed warm-up jobs are separated by idle gaps because jobs in a
live run start from idle and take longer than back-to-back ones. Warm-up jobs run alone; in a
run the same job shares the process with the player clock, the driver and the recorder, so
:func:`calibrate` measures job times as the controller sees them in a short pass of the real
driver, and the lead is taken from whichever of the two is longer. The same pass measures
the player's own jitter (slot-start lateness and job dispatch delay), which sets the lead's
margin (:meth:`latsim.model.lead.LeadRule.jitter`).

The calibration pass is a real run: Ctrl-C or SIGTERM during it raise
:class:`~latsim.errors.Interrupted`, a generator exception or a hung job raise
:class:`~latsim.errors.LatsimError` naming it; neither lets the measurement go on.

Fault injection (tests)
-----------------------
:class:`GeneratorExecutor` runs every job of a live run, of a calibration pass and of
``latsim profile``; the environment variable ``LATSIM_FAULT`` makes it misbehave on purpose,
so the failure paths can be tested in CI on the tiny preset::

    LATSIM_FAULT="FAULT[,FAULT...]"      FAULT = KIND@N[:SECONDS][/WHERE]

    raise@3            job 3 raises RuntimeError (a generator failure)
    stall@2:60         job 2 does not return for 60 s (a hang), then runs
    slow@4:0.5         job 4 takes 0.5 s longer (counted in its measured time)
    sigint@2           job 2 sends the process SIGINT (as Ctrl-C would), then runs
    sigterm@2          job 2 sends the process SIGTERM, then runs
    raise@1/calibration   only in passes whose label contains ``calibration``

``N`` counts the jobs one executor has run, from 1: each live run (label: its run folder's
name, e.g. ``K4-baseline``), each in-run calibration pass (``calibration-K4``) and each K of
a profile (``profile-K4``) has its own executor, so in a run job N is the controller's job
id N. ``WHERE`` is matched as a substring of that label. Warm-up jobs do not go through
an executor and are never faulted. A stall or slowdown ends early when the executor is
closed (the driver closes it when it abandons a hung worker), so a test leaves no thread
holding the generator. A malformed value is a one-line error before any work.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from harness.driver import DriverConfig, DriverResult, LiveDriver
from latsim.controller import ControllerConfig, StartJob
from latsim.controller.policies import BASELINE
from latsim.controller.timing import Timing
from latsim.errors import Interrupted, LatsimError
from latsim.model.lead import LeadRule
from latsim.model.traces import Trace
from latsim.plugins import JobTiming, LiveGenerator

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


@dataclass(frozen=True)
class Calibration:
    """What an in-run calibration pass measured (seconds)."""

    durations: tuple[float, ...] = ()  # job times as the controller saw them
    slot_lateness: tuple[float, ...] = ()  # slot ticks: fired - due
    dispatch: tuple[float, ...] = ()  # jobs: generator start - controller start

    @classmethod
    def of(cls, result: DriverResult) -> Calibration:
        return cls(
            tuple(j.t_ready - j.t_start for j in result.records.jobs if j.kind != "prebuffer"),
            tuple(result.slot_lateness()), tuple(result.dispatch_delays()),
        )

    @classmethod
    def merge(cls, passes: Sequence[Calibration]) -> Calibration:
        return cls(*(tuple(x for p in passes for x in getattr(p, name))
                     for name in ("durations", "slot_lateness", "dispatch")))

    @property
    def measured_jitter(self) -> bool:
        return bool(self.slot_lateness or self.dispatch)


@dataclass(frozen=True)
class Warmup:
    """Warm-up jobs of one K (and decode group), and the in-run calibration samples."""

    K: int
    decode_group: int
    jobs: tuple[JobTiming, ...]
    calibration: tuple[float, ...] = ()  # controller-view C of the in-run calibration pass

    @property
    def durations(self) -> list[float]:
        return [j.wall_s for j in self.jobs]


@dataclass(frozen=True)
class LeadChoice:
    """The lead of one K, a sentence saying where it came from and the jitter that set its
    margin (``None``: none was measured, or the lead was given)."""

    lead: float
    source: str
    jitter_s: float | None = None


def default_job_timeout(lead: float) -> float:
    """The job timeout when none is given: ``max(10 × lead, lead + 5 s)``.

    The lead is at least the 0.99 quantile of the measured job time, so a job still running
    after ten times that (and at least 5 s more, for a loaded machine's slowest jobs) has
    hung rather than run slowly."""
    return max(10.0 * lead, lead + 5.0)


def calibrate(generator: LiveGenerator, timing: Timing, lead: float, jobs: int, max_s: float,
              decode_group: int, drain: float | None = None,
              job_timeout: float | None = None) -> Calibration:
    """Job times as the controller sees them in a live run (``t_ready - t_start``: timer
    lateness and dispatch delay count too), and the player's jitter, from a pass of
    baseline refills with no conditions; about ``jobs`` jobs, at most ``max_s`` seconds.

    Raises :class:`Interrupted` if Ctrl-C or SIGTERM stopped the pass and
    :class:`LatsimError` if the generator failed or a job ran past ``job_timeout``
    (default :func:`default_job_timeout`)."""
    if jobs <= 0:
        return Calibration()
    duration = max(min((jobs + 1) * timing.T, max_s), timing.T)
    if job_timeout is None:
        job_timeout = default_job_timeout(lead)
    label = f"calibration-K{timing.K}"
    generator.reset_stream(timing.K)
    driver = LiveDriver(
        ControllerConfig(timing, BASELINE, lead),
        GeneratorExecutor(generator, decode_group, label),
        Trace("calibration", (), duration),
        DriverConfig(duration, drain, job_timeout_s=job_timeout),
    )
    result = driver.run()
    if result.failed:
        stuck = (" (its generator thread is still running)" if result.worker_alive else "")
        raise LatsimError(f"in-run calibration of K={timing.K} failed: "
                          f"{result.stop_reason}{stuck}")
    if result.interrupted:
        stopped = Interrupted(f"in-run calibration of K={timing.K} stopped "
                              f"({result.stop_reason}); nothing of it kept")
        stopped.stop_reason = result.stop_reason  # type: ignore[attr-defined]
        raise stopped
    return Calibration.of(result)


def choose_lead(rule: LeadRule, warmups: Sequence[Warmup],
                calibration: Calibration | Sequence[float] | None = None) -> LeadChoice:
    """The rule applied to the warm-up jobs, or to the calibration pass where its quantile
    is higher (jobs in a run are slower than alone); the margin covers at least the jitter
    the calibration pass measured."""
    if calibration is None:
        calibration = Calibration()
    elif not isinstance(calibration, Calibration):
        calibration = Calibration(tuple(calibration))
    jitter = (rule.jitter(calibration.slot_lateness, calibration.dispatch)
              if calibration.measured_jitter and rule.jitter_quantile is not None else None)
    quantile = max(rule.sample_quantile(w.durations) for w in warmups)
    source = "warm-up"
    if calibration.durations:
        live = rule.sample_quantile(calibration.durations)
        if live > quantile:
            quantile = live
            source = (f"in-run calibration ({len(calibration.durations)} jobs as the "
                      "controller saw them)")
    described = rule.describe(source, quantile, jitter)
    if jitter is not None:
        level = f"p{100 * (rule.jitter_quantile or 0):g}"
        described += (f"; jitter = {level} slot-start lateness + {level} job dispatch delay "
                      f"of the in-run calibration ({len(calibration.slot_lateness)} slots, "
                      f"{len(calibration.dispatch)} jobs)")
    return LeadChoice(rule.with_margin(quantile, jitter or 0.0), described, jitter)
