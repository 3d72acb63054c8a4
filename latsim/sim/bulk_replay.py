"""Streams that see conditions in a bulk run, each replayed through its own controller on
the schedule the arrays computed (DESIGN §6, the bulk engine).

Under an eager commit (the baseline's chunk-boundary commitment) a condition moves no job:
the next job a device starts carries it, and nothing before the cache end can be
replanned, so the pools serve the same requests as in a run without it.
:mod:`latsim.sim.bulk_numpy` therefore computes the pools' schedule as if every stream
were quiet, and this module replays each stream that sees a condition through its own
controller (a :class:`~latsim.run.stream.StreamRun`: its fast paths where they hold, the
table where they do not) on that schedule: the conditions' arrivals, the armed wake-ups,
the starts of jobs that waited and the jobs' ends, in the clock's order, its quiet ticks
played in bulk between them (``play_quiet_shifted``) and the others one at a time, as the
serving port plays them. The stream's records are then its controller's own.

The replay trusts the schedule only where the controller agrees with it: each job the
controller starts must be the schedule's next one (a refill at its branch), asked for at
the very instant the arrays have it, and each wake-up it arms the one they armed. A
stall, a replan, another wake-up, or a condition arriving at the instant of another of
the stream's events ends the replay (:class:`Differs`), and the event path plays the run.

The run ends as the event path's does: at the window's end, or, while a condition is still
open there, at the tick that shows the last of them (within the drain).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from latsim.controller import (
    ConditionArrived,
    ControllerConfig,
    JobDone,
    JobStarted,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.run.records import RunRecords, RunWindow
from latsim.run.serving import ViewerRecord, censored_records, shown_records
from latsim.run.stream import StreamRun


class Differs(Exception):
    """The controller does not do what the schedule says: the event path plays the run."""


_ARRIVAL, _WAKE, _START, _DONE = range(4)


class StreamReplay:
    """One stream's controller driven through its events on a given schedule, and the
    client's side of it (what it showed). Its own :class:`~latsim.run.stream.ClockPort`:
    times are global, the controller's are global minus ``origin``.

    The schedule is the stream's jobs in order (job ``j`` at index ``j - 1``), those asked
    for before ``horizon``: when each is asked for, whether at an armed wake-up, when a
    device starts it and when it is done (inf: not within the horizon), and its first
    step's draw."""

    def __init__(self, index: int, origin: float, config: ControllerConfig,
                 window: RunWindow, records: str, arrivals: Sequence[tuple[float, float]],
                 requests: Sequence[float], woken: Sequence[bool], starts: Sequence[float],
                 ends: Sequence[float], took: Sequence[float], horizon: float,
                 playout: float) -> None:
        self.index = index
        self.origin = origin
        self.K = config.timing.K
        self.requests, self.woken, self.starts, self.ends, self.took = (
            requests, woken, starts, ends, took)
        self.horizon = horizon
        self.arrivals = arrivals  # (arrival, sent), global time, in order
        self.delay = playout
        self.shift = 0.0  # the client's shift from stalls: none without delivery draws
        self.sent: list[float] = []  # each version's send time, in version order
        self.viewer: list[ViewerRecord] = []
        self.seen = 0  # the controller's condition records already shown
        self.first_display: float | None = None
        self.now = origin
        self.tick_pos = -1  # the pending tick (-1: none) and its time
        self.tick_at = 0.0
        self.asked = 0  # the last job the controller started
        self.armed_for = 0  # the job the last wake-up was armed for
        self.run = StreamRun(config, window, self, records=records)
        self.ctrl = self.run.controller
        self._events = self._in_order()
        self._next = next(self._events, None)
        self.run.start(origin - origin)  # the event path's start: its clock less the origin

    # ------------------------------------------------------------ the port

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        now = self.now
        when = now + max(0.0, at + self.origin - now)  # the serving port's sum
        if type(event) is SlotDue:
            self.tick_pos, self.tick_at = event.position, when
            return
        job = self.asked + 1
        if job <= len(self.requests):
            if not (self.woken[job - 1] and self.requests[job - 1] == when):
                raise Differs
        elif when < self.horizon:
            raise Differs
        self.armed_for = job

    def start_job(self, job: StartJob, now: float) -> None:
        number = self.asked + 1
        if (number > len(self.requests) or job.job_id != number or job.kind != "refill"
                or job.branch != number * self.K or self.requests[number - 1] != self.now):
            raise Differs
        self.asked = number
        start = self.starts[number - 1]
        if start == self.now:  # a device takes it at once: the serving port's note
            self.run.job_ran(number, start - self.origin,
                             start - self.origin + self.took[number - 1])

    def play(self, slot: PlaySlot) -> None:
        self.show(slot.at)

    def show(self, t: float) -> None:
        """A slot played at ``t`` reaches the client, which shows it after the playout
        delay, and the viewer's records of the conditions it resolved."""
        shown = t + self.delay + self.shift
        if self.first_display is None:
            self.first_display = shown
        conditions = self.ctrl.conditions
        if len(conditions) > self.seen:
            self.viewer.extend(shown_records(self.index, conditions[self.seen:], self.sent,
                                             shown))
            self.seen = len(conditions)

    # ------------------------------------------------------------ the replay

    def play_until(self, until: float, through: bool = False, closing: bool = False
                   ) -> float | None:
        """Deliver the stream's events before ``until`` (global time) in the clock's order
        and play its ticks before it (at it too, ``through``). With ``closing``, stop after
        the tick that shows the last condition open, and return its time (None: none came
        by ``until``)."""
        while True:
            event = self._next
            last = event is None or event[0] >= until
            closed = self._ticks(until if last else event[0],  # type: ignore[index]
                                 through and last, closing)
            if closed is not None or last:
                return closed
            self._next = next(self._events, None)
            self._deliver(*event)  # type: ignore[misc]

    def records(self, end: float) -> tuple[RunRecords, list[ViewerRecord]]:
        """The stream's records at the run's end (global time)."""
        done = self.run.finish(end - self.origin)
        return done, self.viewer + censored_records(self.index, self.ctrl.conditions,
                                                    self.sent)

    def _in_order(self) -> Iterator[tuple[float, int, int | float]]:
        """The stream's events by time: its conditions' arrivals (time, kind, sent) and its
        jobs' armed wake-ups, starts after a wait and ends (time, kind, job)."""
        arrivals = iter(self.arrivals)
        arrival = next(arrivals, None)
        for number in range(1, len(self.requests) + 1):
            asked, start = self.requests[number - 1], self.starts[number - 1]
            steps = [(asked, _WAKE)] if self.woken[number - 1] else []
            if start > asked:
                steps.append((start, _START))
            steps.append((self.ends[number - 1], _DONE))
            for at, kind in steps:
                while arrival is not None and arrival[0] <= at:
                    if arrival[0] == at:
                        raise Differs  # an instant of two events: their ids order them
                    yield arrival[0], _ARRIVAL, arrival[1]
                    arrival = next(arrivals, None)
                yield at, kind, number
        while arrival is not None:
            yield arrival[0], _ARRIVAL, arrival[1]
            arrival = next(arrivals, None)

    def _deliver(self, at: float, kind: int, value: int | float) -> None:
        """One event of the stream, as the serving port delivers it."""
        self.now = at
        t = at - self.origin
        run = self.run
        if kind == _ARRIVAL:
            self.sent.append(value)
            run.deliver(ConditionArrived(), t)
            return
        job = int(value)
        if kind == _WAKE:
            if self.armed_for != job:
                raise Differs
            run.deliver(WakeUp(), t)
            if self.asked != job:
                raise Differs  # the wake-up did not start its job
        elif kind == _START:
            run.job_ran(job, t, t + self.took[job - 1])
            if not self.ctrl.quiet_job_started(job, t):
                run.deliver(JobStarted(job), t)
        else:
            run.job_ran(job, self.starts[job - 1] - self.origin, t)
            run.deliver(JobDone(job), t)
            if self.asked != job + 1 and self.armed_for != job + 1:
                raise Differs  # neither the next job nor its wake-up

    def _ticks(self, horizon: float, through: bool, closing: bool) -> float | None:
        """Play the ticks before ``horizon`` (at it, ``through``): the quiet ones in bulk,
        each other one as the serving port's queued tick. With ``closing``, the time of
        the tick that closed the last condition open, once one has."""
        ctrl, origin = self.ctrl, self.origin
        bound = math.nextafter(horizon, math.inf) if through else horizon
        while self.tick_pos >= 0 and self.tick_at < bound:
            played, at = ctrl.play_quiet_shifted(self.tick_at, origin, bound)
            if played:
                if self.first_display is None:  # the serving port's, for the first slot
                    self.first_display = self.tick_at - origin + self.delay + self.shift
                self.tick_pos += played
                self.tick_at = at
            if at >= bound:
                return None
            position, t = self.tick_pos, at - origin
            self.now = at
            self.tick_pos = -1
            if ctrl.play_tick(position, t):
                self.show(t)
                self.tick_pos, self.tick_at = (position + 1,
                                               at + max(0.0, ctrl.next_due + origin - at))
            else:
                self.run.deliver(SlotDue(position), t)
                if ctrl.stalled or self.tick_pos < 0:
                    raise Differs  # a stall: the arrays hold none
            if closing and not ctrl.open_conditions:
                return at
        return None

