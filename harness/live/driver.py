"""The live driver: latsim's :class:`~latsim.controller.Controller` on the wall clock.

The second driver of the one controller (DESIGN §3; the first is
:mod:`latsim.sim.simpy_driver`). Both own a :class:`~latsim.run.stream.StreamRun` (window,
dispatch, drain, busy accounting, records) and supply only their clock; here SimPy's timeouts
are replaced by threads that post into **one event queue**:

- the **player clock** (:class:`~harness.live.player.PlayerClock`) posts ``SlotDue`` and
  ``WakeUp`` at the times the controller asked for;
- the **condition injector** posts ``ConditionArrived`` at the trace's times;
- the **generator worker** executes ``StartJob`` commands one at a time and posts ``JobDone``.

The thread that calls :meth:`LiveDriver.run` is the only one that touches the controller.
Times given to the controller are seconds since the stream started (``t0``), never earlier
than the last time it was given: for a timer or an arrival the time it was *due* (so the
playback timeline does not drift by timer lateness; the lateness of every delivered timer
is recorded in :class:`EventTiming`), for ``JobDone`` the time the generator finished.

**Order.** Events are handled in the order of the time they stand for, not the order the
threads happened to post them: the driver drains what is queued into a heap keyed by that
time, and holds back an event while a timer or arrival due *before* it is still waiting to
be posted (a late timer thread; :meth:`PlayerClock.next_due`), at most ``hold_s``. So a slot
tick that fires late, after a job that finished after the tick was due, still starts a stall
at the slot's due time instead of playing the slot late without one.

Conditions arrive in ``[0, duration)``; the run continues past
``duration`` only while conditions are still open, for at most ``drain`` seconds, exactly as
the simulator does.

**Stopping.** :meth:`LiveDriver.stop` (any thread), Ctrl-C or SIGTERM end a run early; the
result then says it was interrupted (``stop_reason`` ``KeyboardInterrupt`` or ``SIGTERM``)
and keeps every record made so far. While :meth:`LiveDriver.run` runs on the main thread it
turns SIGINT and SIGTERM into such a stop, at an event boundary (a second signal while it
shuts down raises at once); outside a run, :func:`sigterm_as_interrupt` makes SIGTERM raise
:class:`Terminated`, a ``KeyboardInterrupt``, so callers handle both alike.

**Failures.** A generator exception, or a job that has not finished ``job_timeout_s`` after
the controller started it (a hang), ends the run as *failed* (:attr:`DriverResult.status`;
``stop_reason`` names the job and how long it ran). The generator is not thread-safe, so a
worker that cannot be joined after a hang is reported (``worker_alive``) and the executor
is closed (``close()``, where it has one) rather than handed to the next run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from harness.live.player import SPIN_S, ConditionInjector, PlayerClock, sleep_until
from latsim.controller import (
    EVENT_KINDS,
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    JobStarted,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.errors import LatsimError
from latsim.model.traces import Trace
from latsim.plugins import JobTiming
from latsim.run.stream import COMPLETE, INTERRUPTED, RunRecords, RunWindow, StreamRun

#: Stop reasons of a run ended by the user (Ctrl-C, SIGTERM).
KEYBOARD_INTERRUPT = "KeyboardInterrupt"
SIGTERM = "SIGTERM"
USER_STOPS = (KEYBOARD_INTERRUPT, SIGTERM)
#: Status of a run that failed (generator exception, hung job); the records are partial.
FAILED = "failed"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised on the main thread by :func:`sigterm_as_interrupt`."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) on the
    main thread, as Ctrl-C raises ``KeyboardInterrupt``; the previous handler is restored
    after. Does nothing off the main thread (Python delivers signals to the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class JobExecutor(Protocol):
    """Runs one generation job synchronously and reports its own timing. An executor may
    also have ``close()``: called when the driver abandons a worker that is still running
    a job, so that nothing hands that worker's generator to another thread."""

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
    # a job still running this long after the controller started it has hung: the run
    # fails (None: no limit; the shutdown wait is then join_timeout_s)
    job_timeout_s: float | None = None
    # longest an event is held back for an earlier-due timer or arrival not yet posted
    hold_s: float = 0.5


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
    failed: bool = False  # a generator exception or a hung job ended (or marred) the run
    # the generator thread could not be joined: it still holds the executor's generator
    worker_alive: bool = False

    @property
    def status(self) -> str:
        """``failed``, ``interrupted`` or ``complete`` (the run folder's status)."""
        if self.failed:
            return FAILED
        return INTERRUPTED if self.interrupted else COMPLETE

    @property
    def stopped_by_user(self) -> bool:
        """Ended by Ctrl-C or SIGTERM."""
        return self.interrupted and not self.failed and self.stop_reason in USER_STOPS

    def covered(self) -> RunRecords:
        """The run's records over the window they cover: a run stopped early (interrupted,
        failed) is summarised over ``[0, end_time]``, not over the window it was asked for
        (stall % over the nominal window read 9.8% where the covered one was 12.3%)."""
        records = self.records
        if self.status != COMPLETE and self.end_time < records.duration:
            return replace(records, duration=self.end_time)
        return records

    def slot_lateness(self) -> list[float]:
        """Slot-start lateness of every slot tick the driver handled: fired - due (s)."""
        return [e.happened - e.scheduled for e in self.events
                if e.kind == "slot_due" and e.scheduled is not None]

    def dispatch_delays(self) -> list[float]:
        """Per finished job: the generator's start - the controller's start (s)."""
        by_id = {j.job_id: j for j in self.jobs}
        return [by_id[job_id].t_start - start for job_id, start in self.job_starts.items()
                if job_id in by_id]


@dataclass(frozen=True)
class _Item:
    event: object
    scheduled: float | None
    happened: float


_STOP = object()


class QueuedExecutor(Protocol):
    """An executor whose jobs may wait for a device shared with other streams (a server's
    sessions): ``run_queued`` blocks until the job ran. ``playable_until`` (``perf_counter``
    seconds) is when this stream's buffered playback runs out, for a least-slack schedule;
    ``started(t)`` is called when a device takes a job that had to wait, at ``perf_counter``
    time ``t``, so that the wait counts in R (the controller's :class:`JobStarted`)."""

    def run_queued(self, job: StartJob, playable_until: float,
                   started: Callable[[float], None]) -> JobTiming: ...


class _WallClockPort:
    """Carries out commands on the wall clock: timers go to the player clock, jobs to the
    generator worker's queue (with when this stream's playback runs out, for a shared
    device's schedule), played slots get their display time noted and go to ``on_play``."""

    def __init__(self, player: PlayerClock, jobs_in: queue.SimpleQueue, t0: float,
                 on_play: Callable[[PlaySlot, float], None] | None = None) -> None:
        self.player = player
        self.jobs_in = jobs_in
        self.t0 = t0
        self.on_play = on_play
        self.controller: Controller | None = None
        # position -> wall-clock time (s since t0) the player was told to show it
        self.display_times: dict[int, float] = {}

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        self.player.schedule(self.t0 + at, event)

    def start_job(self, job: StartJob, now: float) -> None:
        ctrl = self.controller
        playable = ctrl.playable_until(now) if ctrl is not None else now
        self.jobs_in.put((job, self.t0 + playable))

    def play(self, slot: PlaySlot) -> None:  # nothing to render; note when it would show
        shown = time.perf_counter()
        self.display_times[slot.position] = shown - self.t0
        if self.on_play is not None:
            self.on_play(slot, shown)


class LiveDriver:
    """Drives ``Controller(config)`` with the wall clock, a generator and a trace.

    Without a trace (``trace=None``) conditions come from :meth:`post_condition` (a
    server's viewer). ``on_play(slot, perf_time)`` sees every played slot and ``on_job``
    every finished job's timing (on the generator worker's thread).
    """

    def __init__(
        self,
        config: ControllerConfig,
        executor: JobExecutor | QueuedExecutor,
        trace: Trace | None,
        driver_config: DriverConfig,
        on_record: Callable[[object], None] | None = None,
        progress: Callable[[float, Controller], None] | None = None,
        on_play: Callable[[PlaySlot, float], None] | None = None,
        on_job: Callable[[JobTiming], None] | None = None,
    ) -> None:
        if config.pipelined:
            raise LatsimError("the live driver runs one job at a time: one chunk in flight "
                              "and the let-play policy")
        self.config = config
        self.driver_config = driver_config
        self.window = RunWindow.for_config(config, driver_config.duration, driver_config.drain)
        self.executor = executor
        self.trace = trace
        self._on_record = on_record
        self._progress = progress
        self._on_play = on_play
        self._on_job = on_job
        self.controller: Controller | None = None  # the run's, once it has started
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs_in: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_reason: str | None = None
        self._failed = False
        self._timings: list[JobTiming] = []
        self._errors: list[str] = []
        self.t0 = 0.0  # perf_counter time of stream time 0, once the run has started
        self.started = threading.Event()  # set when ``t0`` is

    # ------------------------------------------------------------ thread-safe inputs

    def stop(self, reason: str = "stopped") -> None:
        """Ask the run to end now (from any thread); records made so far are kept."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._events.put(_Item(_STOP, None, time.perf_counter()))

    def fail(self, reason: str) -> None:
        """End the run now as failed (from any thread), e.g. when its records cannot be
        written; ``reason`` becomes the stop reason unless the run was already stopping."""
        self._failed = True
        self.stop(reason)

    def _on_signal(self, signum: int, frame: object) -> None:
        """SIGINT/SIGTERM during :meth:`run`: stop at the next event boundary; a second
        signal (the run is already stopping) raises at once."""
        terminate = signum == signal.SIGTERM
        if self._stop_reason is not None:
            raise Terminated(SIGTERM) if terminate else KeyboardInterrupt
        self.stop(SIGTERM if terminate else KEYBOARD_INTERRUPT)

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal)
                for sig in (signal.SIGINT, signal.SIGTERM)}

    def _post(self, event: object, scheduled: float | None, happened: float) -> None:
        self._events.put(_Item(event, scheduled, happened))

    def post_condition(self, payload: object = None) -> float:
        """A condition arrives now (from any thread); returns its ``perf_counter`` time."""
        now = time.perf_counter()
        self._post(ConditionArrived(payload), None, now)
        return now

    # ------------------------------------------------------------ the worker

    def _worker(self) -> None:
        run_queued = getattr(self.executor, "run_queued", None)
        while True:
            item = self._jobs_in.get()
            if item is None:
                return
            job, playable_until = item
            try:
                if run_queued is None:
                    timing = self.executor.run_job(job)
                else:
                    timing = run_queued(job, playable_until, lambda t, job_id=job.job_id:
                                        self._post(JobStarted(job_id), None, t))
            except BaseException as exc:  # noqa: BLE001 - reported to the driver thread
                self._errors.append(f"{type(exc).__name__}: {exc}")
                self.fail(f"generator failed in job {job.job_id} ({job.kind}): "
                          f"{type(exc).__name__}: {exc}")
                return
            self._timings.append(timing)
            if self._on_job is not None:  # before JobDone: its record may look the timing up
                self._on_job(timing)
            self._post(JobDone(job.job_id), None, timing.t_end)

    # ------------------------------------------------------------ the run

    def run(self) -> DriverResult:
        """Run the stream to the end of the window (plus drain); Ctrl-C, SIGTERM,
        :meth:`stop`, a generator failure or a hung job end it early."""
        cfg = self.driver_config
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(cfg.switch_interval_s)
        player = PlayerClock(self._post, cfg.spin_s)
        worker = threading.Thread(target=self._worker, name="latsim-generator", daemon=True)
        clock = time.perf_counter
        t0 = clock()
        self.t0 = t0
        self.started.set()
        t0_unix = time.time()
        port = _WallClockPort(player, self._jobs_in, t0, self._on_play)
        run = StreamRun(self.config, self.window, port, on_record=self._on_record)
        self.controller = port.controller = run.controller
        times = [] if self.trace is None else [t for t in self.trace.times
                                               if t < self.window.duration]
        injector = ConditionInjector(self._post, t0, times, cfg.spin_s)
        pump = _EventPump(self._events, player, injector, cfg.hold_s)
        events: list[EventTiming] = []
        interrupted = worker_alive = False
        previous_handlers = self._install_signal_handlers()
        worker.start()
        player.start()
        injector.start()
        stopped_at = None
        try:
            interrupted = self._pump_events(run, pump, t0, events)
            stopped_at = clock() - t0
        except KeyboardInterrupt as exc:  # off the main thread, or a second signal
            stopped_at = clock() - t0
            interrupted = True
            self._stop_reason = self._stop_reason or (
                SIGTERM if isinstance(exc, Terminated) else KEYBOARD_INTERRUPT)
        finally:
            try:
                injector.stop()
                player.stop()
                worker_alive = self._join_worker(worker, run, t0)
            finally:
                sys.setswitchinterval(old_switch)
                for sig, handler in previous_handlers.items():
                    signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        # the run ends when the pump stopped handling events, not after the worker's last
        # job: the ticks due while a stop waited for that job were never handled
        end_time = max(clock() - t0 if stopped_at is None else stopped_at, pump.last_now)
        return self._result(run, port, events, t0, t0_unix, end_time, interrupted,
                            worker_alive)

    def _pump_events(self, run: StreamRun, pump: _EventPump, t0: float,
                     events: list[EventTiming]) -> bool:
        """Hand the controller its events in the order they were due, until the window
        ends (False) or the run is stopped or a job hangs (True)."""
        cfg, window, ctrl = self.driver_config, self.window, run.controller
        clock = time.perf_counter
        next_progress = 0.0
        run.start(0.0)
        while True:
            rel = clock() - t0
            if run.should_end(rel):
                return False
            if self._progress is not None and rel >= next_progress:
                self._progress(rel, ctrl)
                next_progress = rel + cfg.progress_every_s
            job_deadline = self._job_deadline(run)
            if rel >= job_deadline and not pump.finished(ctrl.running_job):
                running = ctrl.running_job
                self.fail(_hung(running, rel - run.job_starts[running], cfg.job_timeout_s))
                return True
            horizon = window.duration if rel < window.duration else window.limit
            got = pump.next(min(cfg.progress_every_s, horizon - rel, job_deadline - rel))
            if got is None:
                continue
            when, item = got
            if item.event is _STOP:
                return True
            handled = clock() - t0
            # timers and arrivals: the time they were due (the display clock does not drift
            # by timer lateness, which is recorded); jobs: when they finished
            now = pump.last_now = max(when - t0, pump.last_now)
            h0 = clock()
            run.deliver(item.event, now)
            decision = clock() - h0
            event = item.event
            events.append(EventTiming(
                kind=EVENT_KINDS[type(event)],
                position=event.position if type(event) is SlotDue else None,
                scheduled=None if item.scheduled is None else item.scheduled - t0,
                happened=item.happened - t0, handled=handled, now=now, decision_s=decision,
            ))

    def _job_deadline(self, run: StreamRun) -> float:
        """When the running job has hung (stream time; infinite without one or a timeout)."""
        running = run.controller.running_job
        timeout = self.driver_config.job_timeout_s
        if running is None or timeout is None:
            return math.inf
        return run.job_starts[running] + timeout

    def _join_worker(self, worker: threading.Thread, run: StreamRun, t0: float) -> bool:
        """Stop the generator worker and wait for its job as long as it may take; a worker
        still in a job then has hung (the run fails, the executor is closed). Returns
        whether the worker is still alive."""
        cfg = self.driver_config
        self._jobs_in.put(None)
        running = run.controller.running_job
        if running is None:
            join_s = 1.0
        elif cfg.job_timeout_s is None:
            join_s = cfg.join_timeout_s
        else:  # a running job may take until its timeout, then it has hung
            join_s = max(0.1, self._job_deadline(run) - (time.perf_counter() - t0))
        worker.join(join_s)
        if not worker.is_alive():
            return False
        ran = time.perf_counter() - t0 - run.job_starts.get(running, 0.0)
        self.fail(_hung(running, ran, cfg.job_timeout_s) if cfg.job_timeout_s is not None
                  else f"job {running} still running {ran:.3g} s after it started, "
                  f"{join_s:g} s after the run ended")
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()
        return True

    def _result(self, run: StreamRun, port: _WallClockPort, events: list[EventTiming],
                t0: float, t0_unix: float, end_time: float, interrupted: bool,
                worker_alive: bool) -> DriverResult:
        """The run's records and timings, times relative to ``t0``."""
        rel_timings = tuple(
            JobTiming(j.job_id, j.kind, j.K, j.branch, j.version, j.context, j.t_start - t0,
                      j.t_end - t0, j.device_s, j.decoded_latents, j.decoded_frames)
            for j in list(self._timings)
        )
        for j in rel_timings:
            run.job_ran(j.job_id, j.t_start, j.t_end)
        if interrupted:
            reason = self._stop_reason or "stopped"
        else:  # the window ended; a job hung at shutdown still fails the run
            reason = self._stop_reason if self._failed and self._stop_reason else COMPLETE
        records = run.finish(end_time, INTERRUPTED if interrupted else COMPLETE)
        return DriverResult(
            records=records, controller=run.controller, jobs=rel_timings,
            job_starts=dict(run.job_starts), events=tuple(events), t0_perf=t0,
            t0_unix=t0_unix, end_time=end_time, interrupted=interrupted, stop_reason=reason,
            errors=tuple(self._errors), display_times=port.display_times,
            failed=self._failed, worker_alive=worker_alive,
        )


class _EventPump:
    """The driver's queue of events, handed out in the order they were due: queued events
    by the time they stand for (due, or happened), then arrival order; an event that is due
    earlier than the first queued one but not posted yet (its thread has not run) is waited
    for, up to ``hold_s``."""

    def __init__(self, events: queue.SimpleQueue, player: PlayerClock,
                 injector: ConditionInjector, hold_s: float) -> None:
        self._get, self._get_nowait = events.get, events.get_nowait
        self._player, self._injector = player, injector
        self._hold_s = hold_s
        self._pending: list[tuple[float, int, _Item]] = []
        self._arrival = itertools.count()
        self.last_now = 0.0  # the last ``now`` handed to the controller

    def pull(self, block_s: float) -> None:
        """Move queued events into the pending heap, waiting up to ``block_s`` for one."""
        try:
            item = self._get(timeout=block_s) if block_s > 0 else self._get_nowait()
        except queue.Empty:
            return
        while True:
            when = item.happened if item.scheduled is None else item.scheduled
            heapq.heappush(self._pending, (when, next(self._arrival), item))
            try:
                item = self._get_nowait()
            except queue.Empty:
                return

    def finished(self, job_id: int | None) -> bool:
        """Whether job ``job_id`` finished (its ``JobDone`` is queued, not handled yet): a
        job past its deadline that did has not hung."""
        self.pull(0.0)
        return any(type(it.event) is JobDone and it.event.job_id == job_id
                   for _, _, it in self._pending)

    def _earliest_unposted(self) -> float | None:
        dues = [d for d in (self._player.next_due(), self._injector.next_due())
                if d is not None]
        return min(dues) if dues else None

    def next(self, wait_s: float) -> tuple[float, _Item] | None:
        """The next event and the time it stands for; ``None`` if none came within
        ``wait_s`` or one due earlier is still to be posted."""
        # what is not posted yet, read *before* draining the queue: a timer posted in
        # between is then drained with the rest, while one read after the drain could be
        # posted and missed in between (a late tick handled after a job that finished after
        # it was due, rarely, under load)
        due = self._earliest_unposted()
        if not self._pending:
            self.pull(max(wait_s, 1e-4))
            if not self._pending:
                return None
        else:
            self.pull(0.0)
        when, _, item = self._pending[0]
        if due is not None and due < when and time.perf_counter() - due < self._hold_s:
            self.pull(min(1e-3, self._hold_s))
            return None
        heapq.heappop(self._pending)
        return when, item


def _hung(job_id: int | None, ran_s: float, timeout_s: float | None) -> str:
    return (f"job {job_id} hung: no result {ran_s:.3g} s after the controller started it "
            f"(job timeout {timeout_s:g} s)")
