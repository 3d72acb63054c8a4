"""One stream's run, independent of the clock that drives it.

Both drivers (SimPy in :mod:`latsim.sim.simpy_driver`, the wall clock in ``harness.live.driver``)
own a :class:`StreamRun` and supply only their clock, the way SimPy's ``rt.py`` overrides one
method of the core. The run owns what they used to repeat:

- the window check (:class:`RunWindow`: conditions arrive in ``[0, duration)``, the run goes
  on past ``duration`` only while conditions are open, for at most ``drain`` seconds);
- command dispatch: :meth:`StreamRun.start` and :meth:`StreamRun.deliver` hand each command to
  the driver's :class:`ClockPort` and note every job's start; a port that can say how far
  ahead nothing will happen (:class:`SkippingPort`) has the ticks that would only play a
  slot skipped (:meth:`Controller.play_ahead`);
- busy accounting: each job's generator interval, or (start, end of run) for a job still
  running when the run ends;
- the records (:class:`RunRecords`), built once by :meth:`StreamRun.finish`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import count
from typing import Protocol

from latsim.controller import (
    Command,
    ConditionArrived,
    Controller,
    ControllerConfig,
    Event,
    JobDone,
    PlaySlot,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.controller.records import (
    RECORD_LEVELS,
    SlotTally,
)
from latsim.errors import LatsimError
from latsim.run.records import (  # re-exported: they were defined here
    COMPLETE,
    INTERRUPTED,
    BusyInterval,
    BusyTally,
    RunRecords,
    RunWindow,
    default_drain,
    window_overlap,
)

__all__ = [
    "COMPLETE", "INTERRUPTED", "BusyInterval", "BusyTally", "ClockPort", "RunRecords",
    "RunWindow", "SkippingPort", "StreamRun", "default_drain", "window_overlap",
]


class ClockPort(Protocol):
    """What a driver supplies: its clock's way of carrying out the controller's commands."""

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        """Deliver ``event`` back at time ``at``."""

    def start_job(self, job: StartJob, now: float) -> None:
        """Run the job; deliver ``JobDone`` when it is done and report its interval with
        :meth:`StreamRun.job_ran`."""

    def play(self, slot: PlaySlot) -> None:
        """The player shows ``slot`` now."""


class SkippingPort(ClockPort, Protocol):
    """A port whose clock can jump (a simulator's): it knows when its next event other
    than the pending tick happens, and it can move that tick to an exact time."""

    def pending_tick(self) -> tuple[int, float] | None:
        """``(position, time)`` of the tick scheduled and not yet delivered, if the port
        would deliver every tick from then on at exactly the time asked; else None."""

    def horizon(self) -> float:
        """The time of the next event other than the pending tick (or an earlier bound)."""

    def move_tick(self, at: float, position: int) -> None:
        """Deliver the pending tick at ``at`` exactly instead, for ``position``, ordered
        after everything scheduled so far."""


def busy_at_end(job_starts: dict[int, float], ran: dict[int, tuple[float, float]],
                tally: BusyTally | None, end_time: float, duration: float
                ) -> tuple[tuple[BusyInterval, ...], BusyTally | None]:
    """A run's busy records at ``end_time``: an interval for each job not yet added up
    (``job_starts``, in start order: its generator interval from ``ran``, else from its
    start to the end), or, with a ``tally``, a copy of it with those added."""
    intervals: list[BusyInterval] = []
    if tally is not None:  # the jobs still running, as kept intervals would have them
        tally = BusyTally(tally.seconds, tally.started)
    for job_id, start in job_starts.items():
        interval = ran.get(job_id)
        t_start, t_end = (start, end_time) if interval is None else interval
        if tally is None:
            intervals.append(BusyInterval(job_id, t_start, t_end))
        else:
            tally.add(t_start, t_end, duration)
    return tuple(intervals), tally


class StreamRun:
    """One controller, one window, one driver's :class:`ClockPort`."""

    def __init__(
        self,
        config: ControllerConfig,
        window: RunWindow,
        port: ClockPort,
        on_record: Callable[[object], None] | None = None,
        records: str = "all",
        fast_paths: bool = True,
    ) -> None:
        if records not in RECORD_LEVELS:
            raise LatsimError(f"--records must be one of {', '.join(RECORD_LEVELS)}, got "
                              f"{records!r}")
        self.window = window
        self.records = records
        # False: every event through Controller.handle (the reference the fast paths are
        # checked against)
        self.fast_paths = fast_paths
        keep = records == "all"
        # "none" keeps no job table: the controller forgets done jobs' records
        self.controller = Controller(config, on_record=on_record,
                                     slots=None if keep else SlotTally(window.duration),
                                     forget_jobs=records == "none" and on_record is None)
        # below "all": each job's interval is added up once it and every job started
        # before it are done (start order, as kept intervals are summed), then forgotten
        self._tally = None if keep else BusyTally()
        self._port = port
        # a SkippingPort (not isinstance: a runtime protocol check costs more than a short run)
        self._skipping = callable(getattr(port, "pending_tick", None))
        self.job_starts: dict[int, float] = {}  # job id -> the controller's start time
        self._ran: dict[int, tuple[float, float]] = {}  # job id -> generator interval

    def start(self, now: float) -> None:
        self._execute(self.controller.start(now), now)

    def deliver(self, event: Event, now: float) -> None:
        """Feed one event to the controller and carry out what it commands."""
        if self.fast_paths and self._quick(event, now):
            return
        self._execute(self.controller.handle(event, now), now)
        if self._tally is not None and type(event) is JobDone:
            self._tally_done()

    def _quick(self, event: Event, now: float) -> bool:
        """A refill cycle's wake-up or job end, or a condition's arrival, through the
        controller's fast paths, where those hold (:meth:`Controller.quiet_wake`,
        :meth:`Controller.quiet_job_done`, :meth:`Controller.quiet_condition`): the same
        commands, carried out the same, without the table's dispatch. False: the event is
        still to be handled."""
        kind = type(event)
        if kind is ConditionArrived:
            if not self.controller.quiet_condition(now):
                return False
            self._execute((), now)
            return True
        if kind is WakeUp:
            job = self.controller.quiet_wake(now)
            if job is None:
                return False
            self._execute((job,), now)
            return True
        if kind is not JobDone:
            return False
        after = self.controller.quiet_job_done(event.job_id, now)  # type: ignore[union-attr]
        if after is None:
            return False
        if type(after) is StartJob:
            self._execute((after,), now)  # type: ignore[arg-type]
        else:
            self._port.schedule(after, WakeUp())  # type: ignore[arg-type]
            if self._skipping:
                self._skip_ticks()
        if self._tally is not None:
            self._tally_done()
        return True

    def play_quiet_cycles(self, ticks: Sequence[float],
                          jobs: Sequence[tuple[float, float, float, float]],
                          took: Sequence[float]) -> int:
        """:meth:`Controller.play_quiet_cycles` (many quiet refill cycles as one step), and
        this run's books of their jobs: each job asked for is noted at its start, and each
        one a device started has its generator interval (to its end, or to its start plus
        ``took``, its first step's draw, while it runs). Returns the first job's id, or 0
        where the controller refused (nothing changed)."""
        first = self.controller.play_quiet_cycles(ticks, jobs)
        if not first:
            return 0
        starts, ran, tally = self.job_starts, self._ran, self._tally
        # counted, not kept, and no older job waits to be: the jobs done here are added up
        # as they come (job id order, as _tally_done adds them), without the books
        direct = tally is not None and (not starts or next(iter(starts)) >= first)
        duration = self.window.duration
        for job_id, (asked, start, done, _), step in zip(count(first), jobs, took):
            if math.isinf(asked):
                break
            if direct and not math.isinf(done):
                starts.pop(job_id, None)
                ran.pop(job_id, None)
                tally.add(start, done, duration)  # type: ignore[union-attr]
                continue
            if job_id not in starts:
                starts[job_id] = asked
            if not math.isinf(start):
                ran[job_id] = (start, done) if not math.isinf(done) else (start, start + step)
        if tally is not None and not direct:
            self._tally_done()
        return first

    def _tally_done(self) -> None:
        """Add up the intervals of the oldest jobs that are done, and forget them."""
        running = set(self.controller.jobs_in_flight)
        starts, ran, duration = self.job_starts, self._ran, self.window.duration
        while starts:
            job_id = next(iter(starts))
            if job_id in running or job_id not in ran:  # finish() takes it as it is then
                return
            del starts[job_id]
            self._tally.add(*ran.pop(job_id), duration)  # type: ignore[union-attr]

    def _execute(self, commands: Sequence[Command], now: float) -> None:
        port = self._port
        for command in commands:
            if type(command) is ScheduleWakeUp:
                port.schedule(command.at, command.event)
            elif type(command) is StartJob:
                self.job_starts[command.job_id] = now
                port.start_job(command, now)
            elif type(command) is PlaySlot:
                port.play(command)
        if self._skipping:
            self._skip_ticks()

    def _skip_ticks(self) -> None:
        """Have the controller play ahead the quiet ticks before the port's next other
        event (:meth:`Controller.play_ahead`), then ask for the first tick it left."""
        port, ctrl = self._port, self.controller
        tick = port.pending_tick()  # type: ignore[attr-defined]
        if tick is None or tick != (ctrl.next_position, ctrl.next_due):
            return
        if ctrl.play_ahead(port.horizon()):  # type: ignore[attr-defined]
            port.move_tick(ctrl.next_due, ctrl.next_position)  # type: ignore[attr-defined]

    def job_ran(self, job_id: int, t_start: float, t_end: float) -> None:
        """The generator's own interval for a job (may differ from the controller's view)."""
        self._ran[job_id] = (t_start, t_end)

    def should_end(self, now: float) -> bool:
        """Past the window with nothing open, or past the drain limit."""
        return now >= self.window.duration and (
            self.controller.open_conditions == 0 or now >= self.window.limit
        )

    def finish(self, end_time: float, status: str = COMPLETE) -> RunRecords:
        """Close the controller (open stall, censored conditions) and collect the records."""
        ctrl = self.controller
        ctrl.finish(end_time)
        busy, tally = busy_at_end(self.job_starts, self._ran, self._tally, end_time,
                                  self.window.duration)
        return RunRecords(
            duration=self.window.duration,
            end_time=end_time,
            conditions=tuple(sorted(ctrl.conditions, key=lambda c: c.version)),
            jobs=tuple(ctrl.jobs) if self.records != "none" else tuple(ctrl.jobs[:1]),
            slots=ctrl.slots,
            stalls=tuple(ctrl.stalls),
            discards=tuple(ctrl.discards),
            busy=busy,
            jobs_started=ctrl.jobs_started,
            jobs_done=ctrl.jobs_done,
            cached_at_end=len(ctrl.cached_positions),
            status=status,
            records=self.records,
            busy_tally=tally,
        )
