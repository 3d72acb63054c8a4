"""The live driver: latsim's :class:`~latsim.controller.Controller` on the wall clock.

The second driver of the one controller (DESIGN §3; the first is
:mod:`latsim.sim.simpy_driver`). Both own a :class:`~latsim.run.stream.StreamRun` (window,
dispatch, drain, busy accounting, records) and supply only their clock; here SimPy's timeouts
are replaced by threads that post into **one event queue**:

- the **player clock** (:class:`~harness.player.PlayerClock`) posts ``SlotDue`` and
  ``WakeUp`` at the times the controller asked for;
- the **condition injector** posts ``ConditionArrived`` at the trace's times;
- the **generator worker** executes ``StartJob`` commands one at a time and posts ``JobDone``.

The thread that calls :meth:`LiveDriver.run` is the only one that touches the controller.
Times given to the controller are seconds since the stream started (``t0``), never earlier
than the last time it was given: for a timer or an arrival the time it was *due* (so the
playback timeline does not drift by timer lateness; the lateness of every delivered timer
is recorded in :class:`EventTiming`), for ``JobDone`` the time the generator finished.

Conditions arrive in ``[0, duration)``; the run continues past
``duration`` only while conditions are still open, for at most ``drain`` seconds, exactly as
the simulator does. :meth:`LiveDriver.stop` (any thread) or Ctrl-C ends a run early; the
result then says it was interrupted and keeps every record made so far.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from harness.generator import JobTiming
from harness.player import SPIN_S, ConditionInjector, PlayerClock, sleep_until
from latsim.controller import (
    Controller,
    ControllerConfig,
    JobDone,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.model.traces import Trace
from latsim.run.stream import COMPLETE, INTERRUPTED, RunRecords, RunWindow, StreamRun


class JobExecutor(Protocol):
    """Runs one generation job synchronously and reports its own timing."""

    def run_job(self, job: StartJob) -> JobTiming: ...


@dataclass(frozen=True)
class SleepExecutor:
    """A stand-in generator that takes exactly ``C`` seconds per job (tests, benchmarks)."""

    C: float
    spin_s: float = SPIN_S

    def run_job(self, job: StartJob) -> JobTiming:
        start = time.perf_counter()
        end = sleep_until(start + self.C, self.spin_s)
        return JobTiming(job.job_id, job.kind, job.length, job.branch, job.version, 0, start,
                         end, None, 0, 0)


@dataclass(frozen=True)
class DriverConfig:
    """Wall-clock settings of one live run."""

    duration: float
    drain: float | None = None  # default: latsim.run.stream.default_drain, as simulated
    spin_s: float = SPIN_S
    switch_interval_s: float = 0.0005  # sys.setswitchinterval during the run (GIL hand-off)
    progress_every_s: float = 0.5
    join_timeout_s: float = 30.0  # how long to wait for a running job at shutdown


@dataclass(frozen=True)
class EventTiming:
    """One event the controller handled (times in seconds since ``t0``)."""

    kind: str
    position: int | None  # SlotDue's position
    scheduled: float | None  # when a timer/arrival was due (None for JobDone)
    happened: float  # when it fired (timers, arrivals) or the job finished
    handled: float  # when the driver called controller.handle
    now: float  # the time given to the controller
    decision_s: float  # wall time inside controller.handle


@dataclass(frozen=True)
class DriverResult:
    """What one live run produced."""

    records: RunRecords
    controller: Controller
    jobs: tuple[JobTiming, ...]  # the generator's own timings, times relative to t0
    job_starts: dict[int, float]  # job id -> the controller's start time
    events: tuple[EventTiming, ...]
    t0_perf: float
    t0_unix: float
    end_time: float
    interrupted: bool
    stop_reason: str  # "complete", or why the run was cut short
    errors: tuple[str, ...] = field(default=())
    # position -> wall-clock time (s since t0) the player was told to show it: the slot's
    # scheduled start plus timer lateness and handling delay
    display_times: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Item:
    event: object
    scheduled: float | None
    happened: float


_STOP = object()


class _WallClockPort:
    """Carries out commands on the wall clock: timers go to the player clock, jobs to the
    generator worker's queue, played slots get their display time noted."""

    def __init__(self, player: PlayerClock, jobs_in: queue.SimpleQueue, t0: float) -> None:
        self.player = player
        self.jobs_in = jobs_in
        self.t0 = t0
        # position -> wall-clock time (s since t0) the player was told to show it
        self.display_times: dict[int, float] = {}

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        self.player.schedule(self.t0 + at, event)

    def start_job(self, job: StartJob, now: float) -> None:
        self.jobs_in.put(job)

    def play(self, slot: PlaySlot) -> None:  # nothing to render; note when it would show
        self.display_times[slot.position] = time.perf_counter() - self.t0


class LiveDriver:
    """Drives ``Controller(config)`` with the wall clock, a generator and a trace."""

    def __init__(
        self,
        config: ControllerConfig,
        executor: JobExecutor,
        trace: Trace,
        driver_config: DriverConfig,
        on_record: Callable[[object], None] | None = None,
        progress: Callable[[float, Controller], None] | None = None,
    ) -> None:
        self.config = config
        self.driver_config = driver_config
        self.window = RunWindow.for_config(config, driver_config.duration, driver_config.drain)
        self.executor = executor
        self.trace = trace
        self._on_record = on_record
        self._progress = progress
        self.controller: Controller | None = None  # the run's, once it has started
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs_in: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_reason: str | None = None
        self._timings: list[JobTiming] = []
        self._errors: list[str] = []
        self.t0 = 0.0

    # ------------------------------------------------------------ thread-safe inputs

    def stop(self, reason: str = "stopped") -> None:
        """Ask the run to end now (from any thread); records made so far are kept."""
        self._events.put(_Item(_STOP, None, time.perf_counter()))
        if self._stop_reason is None:
            self._stop_reason = reason

    def _post(self, event: object, scheduled: float | None, happened: float) -> None:
        self._events.put(_Item(event, scheduled, happened))

    # ------------------------------------------------------------ the worker

    def _worker(self) -> None:
        while True:
            job = self._jobs_in.get()
            if job is None:
                return
            try:
                timing = self.executor.run_job(job)
            except BaseException as exc:  # noqa: BLE001 - reported to the driver thread
                self._errors.append(f"{type(exc).__name__}: {exc}")
                self.stop(f"generator failed: {type(exc).__name__}: {exc}")
                return
            self._timings.append(timing)
            self._post(JobDone(job.job_id), None, timing.t_end)

    # ------------------------------------------------------------ the run

    def run(self) -> DriverResult:
        """Run the stream to the end of the window (plus drain); Ctrl-C ends it early."""
        cfg = self.driver_config
        window = self.window
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(cfg.switch_interval_s)
        player = PlayerClock(self._post, cfg.spin_s)
        worker = threading.Thread(target=self._worker, name="latsim-generator", daemon=True)
        events: list[EventTiming] = []
        interrupted = False
        last_now = 0.0
        clock = time.perf_counter

        t0 = clock()
        self.t0 = t0
        t0_unix = time.time()
        port = _WallClockPort(player, self._jobs_in, t0)
        run = StreamRun(self.config, window, port, on_record=self._on_record)
        ctrl = self.controller = run.controller
        injector = ConditionInjector(
            self._post, t0, [t for t in self.trace.times if t < window.duration], cfg.spin_s
        )
        worker.start()
        player.start()
        injector.start()
        next_progress = 0.0
        try:
            run.start(0.0)
            while True:
                rel = clock() - t0
                if run.should_end(rel):
                    break
                if self._progress is not None and rel >= next_progress:
                    self._progress(rel, ctrl)
                    next_progress = rel + cfg.progress_every_s
                horizon = window.duration if rel < window.duration else window.limit
                wait = min(cfg.progress_every_s, max(0.0, horizon - rel))
                try:
                    item = self._events.get(timeout=max(wait, 1e-4))
                except queue.Empty:
                    continue
                if item.event is _STOP:
                    interrupted = True
                    break
                handled = clock() - t0
                happened = item.happened - t0
                # timers and arrivals: the time they were due (the display clock does not
                # drift by timer lateness, which is recorded); jobs: when they finished
                when = happened if item.scheduled is None else item.scheduled - t0
                now = max(when, last_now)
                last_now = now
                h0 = clock()
                run.deliver(item.event, now)
                decision = clock() - h0
                event = item.event
                events.append(EventTiming(
                    kind=event.kind,  # type: ignore[attr-defined]
                    position=event.position if type(event) is SlotDue else None,
                    scheduled=None if item.scheduled is None else item.scheduled - t0,
                    happened=happened, handled=handled, now=now, decision_s=decision,
                ))
        except KeyboardInterrupt:
            interrupted = True
            self._stop_reason = self._stop_reason or "KeyboardInterrupt"
        finally:
            injector.stop()
            player.stop()
            self._jobs_in.put(None)
            running = ctrl.running_job is not None
            worker.join(cfg.join_timeout_s if running else 1.0)
            sys.setswitchinterval(old_switch)

        end_time = max(clock() - t0, last_now)
        rel_timings = tuple(
            JobTiming(j.job_id, j.kind, j.K, j.branch, j.version, j.context, j.t_start - t0,
                      j.t_end - t0, j.device_s, j.decoded_latents, j.decoded_frames)
            for j in list(self._timings)
        )
        for j in rel_timings:
            run.job_ran(j.job_id, j.t_start, j.t_end)
        reason = (self._stop_reason or "stopped") if interrupted else COMPLETE
        records = run.finish(end_time, INTERRUPTED if interrupted else COMPLETE)
        return DriverResult(
            records=records, controller=ctrl, jobs=rel_timings, job_starts=dict(run.job_starts),
            events=tuple(events), t0_perf=t0, t0_unix=t0_unix, end_time=end_time,
            interrupted=interrupted, stop_reason=reason,
            errors=tuple(self._errors), display_times=port.display_times,
        )
