"""Streams that see conditions in a bulk run, each driven through its own controller:
replayed on the schedule the arrays computed, or (a lazy commit) online, by the bulk
loop's events as they come (DESIGN §6, the bulk engine).

Under an eager commit (the baseline's chunk-boundary commitment) a condition moves no job:
the next job a device starts carries it, and nothing before the cache end can be
replanned, so the pools serve the same requests as in a run without it.
:mod:`latsim.sim.bulk_numpy` therefore computes the pools' schedule as if every stream
were quiet and reads most streams' conditions off it; this module replays each of the
others (two of its events at one instant, which the clock orders by their ids, or an
arrival at its armed refill's due time) through its own controller (a
:class:`~latsim.run.stream.StreamRun`: its fast paths where they hold, the table where
they do not) on that schedule: the conditions' arrivals, the armed wake-ups,
the starts of jobs that waited and the jobs' ends, in the clock's order, its quiet ticks
played in bulk between them (``play_quiet_shifted``) and the others one at a time, as the
serving port plays them. Where the controller is in its quiet cycles, those up to the
next arrival go as one step (``play_quiet_cycles``: the jobs, the ticks, the version a
job binds and the conditions a tick shows). The stream's records are then its
controller's own.

The replay trusts the schedule only where the controller agrees with it: each job the
controller starts must be the schedule's next one (a refill at its branch), asked for at
the very instant the arrays have it, and each wake-up it arms the one they armed. A
stall, a replan, another wake-up, or a condition arriving at the instant of another of
the stream's events ends the replay (:class:`Differs`), and the event path plays the run.

The run ends as the event path's does: at the window's end, or, while a condition is still
open there, at the tick that shows the last of them (within the drain; the events of that
instant run before it, ticks running last).

Under a lazy commit (latent commitment) a condition does move jobs: its replan is a job
of its own, asked for where the table says, and every refill after it follows from there.
No schedule can be computed first, so such a stream is an :class:`OnlineStream`: its
controller is driven by the bulk loop's events as they come (:mod:`latsim.sim.bulk`, whose
pools serve its jobs beside the quiet streams'), its ticks played as the replay plays
them, before each event that touches it. A tick is an event only for the stream it plays
(it shows a slot, resolves a condition, or stalls and ends the stall's wait), so playing
it late, just before the stream's next event, changes nothing another stream sees; one
that would start a job or arm a wake-up would, and ends the bulk run (:class:`Differs`).
Between conditions such a stream coasts (:meth:`OnlineStream._coast`): where its
controller is in its quiet cycles (under a lazy commit with no version pending; under an
eager one the next job asked for binds it), its wake-ups, jobs and ticks are played here
by the fast paths' sums, and handed to the controller in one ``play_quiet_cycles`` at the
next event they do not cover.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from latsim.controller import (
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
from latsim.controller.machine import EPS
from latsim.run.records import RunRecords, RunWindow
from latsim.run.serving import ViewerRecord, censored_records, shown_records
from latsim.run.stream import StreamRun


class Differs(Exception):
    """The controller does not do what the schedule says: the event path plays the run."""


_ARRIVAL, _WAKE, _START, _DONE = range(4)


class _Driven:
    """A stream driven through its own controller in a bulk run (its
    :class:`~latsim.run.stream.ClockPort`: times are global, the controller's are global
    minus ``origin``), and the client's side of it: what it showed. Its ticks are played
    in bulk where quiet, each other one as the serving port's queued tick
    (:meth:`_ticks`)."""

    index: int
    origin: float
    delay: float  # the client's playout delay
    shift: float  # ... and its shift from stalls: none without delivery draws
    run: StreamRun
    ctrl: Controller  # the run's controller
    now: float  # the global time of what the stream is doing
    tick_pos: int  # the pending tick (-1: none) and its time
    tick_at: float
    __deletable__ = ("run",)  # (mypyc: release)

    def release(self) -> None:
        """Once its records are taken: the run let go, so that reference counting frees
        them as the bulk run is dropped (it and its driver point at each other; left to
        the cyclic collector, they were 3% of a fleet node's time)."""
        del self.run

    def _client(self, index: int, origin: float, playout: float) -> None:
        self.index = index
        self.origin = origin
        self.delay = playout
        self.shift = 0.0
        self.sent: list[float] = []  # each version's send time, in version order
        self.viewer: list[ViewerRecord] = []
        self.seen = 0  # the controller's condition records already shown
        self.first_display: float | None = None
        self.now = origin
        self.tick_pos = -1
        self.tick_at = 0.0

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        now = self.now
        when = now + max(0.0, at + self.origin - now)  # the serving port's sum
        if type(event) is SlotDue:
            self.tick_pos, self.tick_at = event.position, when
        else:
            self._arm(when)

    def _arm(self, when: float) -> None:
        """A wake-up armed for ``when`` (global time)."""
        raise NotImplementedError

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

    def _shown_in_one_step(self, ticks: Sequence[float]) -> None:
        """What the viewer saw of quiet cycles played in one step (``ticks``: the times of
        their ticks, the controller's): the first slot's display, if it is the stream's
        first, and the conditions those ticks showed, as :meth:`show` has them."""
        if ticks and self.first_display is None:  # the serving port's, for the first slot
            self.first_display = ticks[0] + self.delay + self.shift
        conditions = self.ctrl.conditions
        for cond in conditions[self.seen:]:
            self.viewer.extend(shown_records(self.index, [cond], self.sent,
                                             cond.t_play + self.delay + self.shift))
        self.seen = len(conditions)

    def records(self, end: float) -> tuple[RunRecords, list[ViewerRecord]]:
        """The stream's records at the run's end (global time)."""
        done = self.run.finish(end - self.origin)
        return done, self.viewer + censored_records(self.index, self.ctrl.conditions,
                                                    self.sent)

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
                self._slot_due(position, t)
            if closing and not ctrl.open_conditions:
                return at
        return None

    def _slot_due(self, position: int, t: float) -> None:
        """A tick that is not quiet, as the table plays it."""
        self.run.deliver(SlotDue(position), t)


class StreamReplay(_Driven):
    """One stream's controller driven through its events on a given schedule, and the
    client's side of it (what it showed). Its own :class:`~latsim.run.stream.ClockPort`:
    times are global, the controller's are global minus ``origin``.

    The schedule is the stream's jobs in order (job ``j`` at index ``j - 1``), those asked
    for before ``horizon``: when each is asked for, the due time of the wake-up armed for
    it (nan: asked for at once; one more than the jobs, for the wake-up armed past the
    horizon), when a device starts it and when it is done (inf: not within the horizon),
    and its first step's draw; and the stream's tick times (``clock``, a tick a place)."""

    def __init__(self, index: int, origin: float, config: ControllerConfig,
                 window: RunWindow, records: str, arrivals: Sequence[tuple[float, float]],
                 requests: Sequence[float], dues: Sequence[float], starts: Sequence[float],
                 ends: Sequence[float], took: Sequence[float], clock: np.ndarray,
                 horizon: float, playout: float, skips: bool = True) -> None:
        self._client(index, origin, playout)
        self.K = config.timing.K
        self.requests, self.dues, self.starts, self.ends, self.took = (
            requests, dues, starts, ends, took)
        # the same in the controller's time (global less the origin)
        self.asked_t, self.start_t, self.end_t = (
            (np.asarray(times, dtype=float) - origin).tolist()
            for times in (requests, starts, ends))
        self.clock = clock
        # the same as floats bisect reads at C speed (a memoryview of the row's doubles)
        self.ticks = cast(Sequence[float], memoryview(cast(Any, clock)))
        self.horizon = horizon
        self.arrivals = arrivals  # (arrival, sent), global time, in order
        self.asked = 0  # the last job the controller started
        self.armed_for = 0  # the job the last wake-up was armed for
        # the next event: of job ``job`` (its wake-up, start or end: ``step`` 0, 1, 2)
        # or the arrival ``arrival``
        self.job, self.step, self.arrival = 1, 0, 0
        # the quiet cycles go as one step unless a job's wait is lost in the controller's
        # time (started after its request, at the same time less the origin): the
        # controller judges a wait by those times, the serving port by the clock's
        self.skips = skips
        self.run = StreamRun(config, window, self, records=records)
        self.ctrl = self.run.controller
        self.run.start(origin - origin)  # the event path's start: its clock less the origin

    # ------------------------------------------------------------ the port

    def _arm(self, when: float) -> None:
        job = self.asked + 1
        if job <= len(self.requests):
            if math.isnan(self.dues[job - 1]) or self.requests[job - 1] != when:
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

    # ------------------------------------------------------------ the replay

    def play_until(self, until: float, through: bool = False, closing: bool = False,
                   at_end: bool = False) -> float | None:
        """Deliver the stream's events before ``until`` (global time; at it too,
        ``at_end``: a drain's last instant, whose events run before its ticks) in the
        clock's order and play its ticks before it (at it too, ``through``). With
        ``closing``, stop after the tick that shows the last condition open, and return
        its time (None: none came by ``until``). Where the controller is in its quiet
        cycles, the cycles before the next arrival are played as one step
        (:meth:`_skip`)."""
        while True:
            at, kind = self._peek()
            if (kind != _ARRIVAL and at < until and self.skips and not closing
                    and self.ctrl.in_quiet_cycles):  # (closing: the tick that closes)
                arrival = (self.arrivals[self.arrival][0]
                           if self.arrival < len(self.arrivals) else math.inf)
                if self._skip(min(arrival, until)):
                    continue
            last = at > until if at_end else at >= until
            closed = self._ticks(until if last else at, through and last, closing)
            if closed is not None or last:
                return closed
            self._deliver(at, kind)

    def _peek(self) -> tuple[float, int]:
        """The time and kind of the stream's next event: a condition's arrival, or its
        next job's armed wake-up, start after a wait or end (inf: none)."""
        at, kind = math.inf, _DONE
        if self.job <= len(self.requests):
            index = self.job - 1
            if self.step == 0 and not math.isnan(self.dues[index]):
                at, kind = self.requests[index], _WAKE
            elif self.step <= 1 and self.starts[index] > self.requests[index]:
                at, kind = self.starts[index], _START
            else:
                at, kind = self.ends[index], _DONE
        if self.arrival < len(self.arrivals):
            arrival = self.arrivals[self.arrival][0]
            if arrival == at:
                raise Differs  # an instant of two events: their ids order them
            if arrival < at:
                return arrival, _ARRIVAL
        return at, kind

    def _deliver(self, at: float, kind: int) -> None:
        """The next event, as the serving port delivers it."""
        self.now = at
        t = at - self.origin
        run = self.run
        if kind == _ARRIVAL:
            self.sent.append(self.arrivals[self.arrival][1])
            self.arrival += 1
            run.deliver(ConditionArrived(), t)
            return
        job = self.job
        if kind == _WAKE:
            self.step = 1
            if self.armed_for != job:
                raise Differs
            run.deliver(WakeUp(), t)
            if self.asked != job:
                raise Differs  # the wake-up did not start its job
        elif kind == _START:
            self.step = 2
            run.job_ran(job, t, t + self.took[job - 1])
            if not self.ctrl.quiet_job_started(job, t):
                run.deliver(JobStarted(job), t)
        else:
            self.job, self.step = job + 1, 0
            run.job_ran(job, self.starts[job - 1] - self.origin, t)
            run.deliver(JobDone(job), t)
            if self.asked != job + 1 and self.armed_for != job + 1:
                raise Differs  # neither the next job nor its wake-up

    def _skip(self, bound: float) -> bool:
        """Play the quiet cycles before ``bound`` (global time) as one step
        (:meth:`~latsim.run.stream.StreamRun.play_quiet_cycles`): the jobs done by then,
        the one in flight or armed after them, the ticks and the conditions they show.
        False where no job is done before ``bound`` (the events go one by one) or the
        controller refuses."""
        clock = self.clock
        first = self.job  # in flight (asked), or armed
        done = bisect_left(self.ends, bound, first - 1)  # jobs 1 .. done are done by then
        if done < first or self.tick_pos != self.ctrl.next_position:
            return False
        last = done + 1  # the job after them: in flight, or armed
        if last > len(self.dues):
            return False
        inf = math.inf
        # the jobs done (all their times before the bound), then the last one
        jobs = list(zip(self.asked_t[first - 1:done], self.start_t[first - 1:done],
                        self.end_t[first - 1:done], self.dues[first - 1:done], strict=True))
        took = list(self.took[first - 1:done])
        if last <= len(self.requests):
            index = last - 1
            asked = self.requests[index] < bound
            jobs.append((self.asked_t[index] if asked else inf,
                         self.start_t[index] if self.starts[index] < bound else inf, inf,
                         self.dues[index]))
            took.append(self.took[index])
        else:  # armed past the horizon
            jobs.append((inf, inf, inf, self.dues[last - 1]))
            took.append(0.0)
        origin = self.origin
        position = self.tick_pos
        upto = bisect_left(self.ticks, bound, position)
        if position < upto and self.ticks[position] != self.tick_at or upto >= clock.size:
            return False
        ticks = (clock[position:upto] - origin).tolist()
        if not self.run.play_quiet_cycles(ticks, jobs, took):
            return False
        in_flight = jobs[-1][0] < inf  # the last job asked for, else armed
        self.asked = last if in_flight else done
        if not in_flight:
            self.armed_for = last
        self.job, self.step = last, (0 if not in_flight else
                                     2 if jobs[-1][1] < inf else 1)
        self._shown_in_one_step(ticks)
        if upto > position:
            self.tick_pos, self.tick_at = upto, self.ticks[upto]
        return True

    def _slot_due(self, position: int, t: float) -> None:
        self.run.deliver(SlotDue(position), t)
        if self.ctrl.stalled or self.tick_pos < 0:
            raise Differs  # a stall: the arrays hold none


class Loop(Protocol):
    """What an :class:`OnlineStream` asks of the bulk loop that drives it."""

    def wake_at(self, index: int, at: float) -> None:
        """Deliver stream ``index`` a wake-up at ``at`` (global time), ordered after
        everything scheduled so far."""

    def take_id(self) -> int:
        """The next event id: an event's place among those of its instant."""

    def arrive_at(self, index: int, at: float, event_id: int) -> None:
        """Deliver stream ``index`` its next condition's arrival at ``at``, ordered by the
        id it took."""

    def submit(self, index: int, job: int, kind: str, now: float) -> None:
        """Queue the first step of job ``job`` (of ``kind``) on its pool at ``now``."""

    @property
    def event_at(self) -> float:
        """The time of the event being played."""

    @property
    def previous_at(self) -> float:
        """The time of the event played before it."""


class OnlineStream(_Driven):
    """One stream's controller driven by the bulk loop's events as they come (the module
    docstring): the conditions' arrivals, the wake-ups it arms, the starts of jobs that
    waited and the jobs' ends, each after the stream's ticks before it, as the serving
    port delivers them. ``sent``: the conditions' send times (those in the window)."""

    def __init__(self, index: int, origin: float, config: ControllerConfig,
                 window: RunWindow, records: str, sent: Sequence[float], playout: float,
                 loop: Loop) -> None:
        self._client(index, origin, playout)
        self.loop = loop
        self.sends = sent  # the conditions' send times
        # the arrivals still to come (time, id, send time), the next one last
        self.coming: list[tuple[float, int, float]] = []
        self.ticking = False  # a tick that is not quiet is being played
        self.first_in_event = False  # the ticks played first in an event (_first_ticks)
        self.run = StreamRun(config, window, self, records=records)
        self.ctrl = self.run.controller
        self.K, self.delta = config.timing.K, config.timing.delta
        self.lead = self.ctrl.refill_lead
        # the job in flight's first step: when a device started it (the controller's time;
        # inf: not yet) and its draw
        self.job_start, self.job_took = math.inf, 0.0
        # coasting (:meth:`_coast`): the quiet cycles played here, handed to the controller
        # in one step; the stretch's jobs (asked, start, done, due; the first is the one in
        # flight or armed as it began), their first steps' draws and the ticks played
        self.coasting = False
        self.jobs: list[list[float]] = []
        self.took: list[float] = []
        self.ticks: list[float] = []
        self.first = 0  # the id of the stretch's first job
        # the slots cached (those before it: a tick at or past it stalls), which is the
        # planned end wherever that is read (no job in flight then)
        self.ready = 0
        self.armed = math.nan  # the armed refill's due time (nan: one in flight)
        self.due_next = 0.0  # the controller's next due time, as the ticks played leave it

    __deletable__ = ("loop",)

    def release(self) -> None:
        """:meth:`_Driven.release`, and the loop let go (which holds it)."""
        super().release()
        del self.loop

    def start(self, now: float) -> None:
        """``start_playback`` at ``now``: each arrival takes its place in the clock's order
        first (only the next one waits in the loop's heap, as on the clock), then the
        controller starts."""
        self.now = now
        origin, loop = self.origin, self.loop
        self.coming = [(now + ((t + origin) - now), loop.take_id(), t)  # the port's sums
                       for t in self.sends]
        self.coming.reverse()
        self._queue_arrival()
        self.run.start(now - origin)

    def _queue_arrival(self) -> None:
        if self.coming:
            at, event_id, _ = self.coming[-1]
            self.loop.arrive_at(self.index, at, event_id)

    # ------------------------------------------------------------ the port

    def _arm(self, when: float) -> None:
        if self.ticking:
            raise Differs  # armed by a tick: behind the loop's clock
        self.loop.wake_at(self.index, when)

    def start_job(self, job: StartJob, now: float) -> None:
        behind = self.ticking  # started by a tick: behind the loop's clock
        if behind and not (self.first_in_event and self.loop.previous_at < self.now):
            raise Differs  # ... with an event played since (_first_ticks)
        self.job_start = math.inf
        self.loop.submit(self.index, job.job_id, job.kind, self.now)
        if behind and self.job_start < math.inf and (
                self.now + self.job_took < self.loop.event_at):
            raise Differs  # its first step ended before the event being played

    def _slot_due(self, position: int, t: float) -> None:
        self.ticking = True
        self.run.deliver(SlotDue(position), t)
        self.ticking = False

    def _first_ticks(self, at: float) -> None:
        """The ticks before ``at``, played first in the loop's event at ``at`` (its
        wake-up or arrival: nothing has touched the pools in it yet). One of them may
        start a job, behind the loop's clock, where the loop played no event since that
        tick's time: the pools are then as they were at it, and the job is queued there
        as the clock queues it (after a stall the ticks fall off the due grid, and one
        within EPS before the armed due time starts the refill itself)."""
        self.first_in_event = True
        try:
            self._ticks(at, False, False)
        finally:
            self.first_in_event = False

    # ------------------------------------------------------------ the events

    def arrive(self, at: float) -> None:
        self.sent.append(self.coming.pop()[2])
        self._queue_arrival()
        if self.coasting:
            self._coast_ticks(at)
            self._hand_back()
        self._first_ticks(at)
        self.now = at
        self.run.deliver(ConditionArrived(), at - self.origin)
        self._coast()

    def wake(self, at: float) -> None:
        if self.coasting:
            if self._coast_ticks(at) and self._coast_wake(at):
                return
            self._hand_back()
        self._first_ticks(at)
        self.now = at
        self.run.deliver(WakeUp(), at - self.origin)
        self._coast()

    def job_started(self, job_id: int, at: float, took: float, waited: bool) -> None:
        """A device took the job's first step at ``at`` (``took``: its draw), after a wait
        or not, as the serving port notes it."""
        t = at - self.origin
        self.job_start, self.job_took = t, took
        if self.coasting:
            if not waited or t != self.jobs[-1][0]:
                self.jobs[-1][1], self.took[-1] = t, took
                return
            self._hand_back()  # a wait the controller's time loses: it judges that itself
        self.run.job_ran(job_id, t, t + took)
        if waited and not self.ctrl.quiet_job_started(job_id, t):
            self._ticks(at, False, False)
            self.now = at
            self.run.deliver(JobStarted(job_id), t)
            self._coast()

    def job_done(self, job_id: int, started: float, at: float) -> None:
        """The job's last step ended at ``at``; its first started at ``started``."""
        if self.coasting:
            if self._coast_ticks(at):
                self._coast_done(at)
                return
            self._hand_back()
        origin = self.origin
        self.run.job_ran(job_id, started - origin, at - origin)
        self._ticks(at, False, False)
        self.now = at
        self.run.deliver(JobDone(job_id), at - origin)
        self._coast()

    # ------------------------------------------------------------ coasting

    def _coast(self) -> None:
        """Coast from here where the controller is in its quiet cycles, under a lazy
        commit with no version pending (:meth:`Controller.quiet_cycle_books`; under an
        eager one a version pending binds to the next job asked for, as
        ``play_quiet_cycles`` binds it): its wake-ups, its jobs' starts and
        ends and its ticks are then played here, by the sums of its fast paths
        (``quiet_wake``, ``quiet_job_done``, ``_play_quiet``), and handed to it as one
        :meth:`~latsim.run.stream.StreamRun.play_quiet_cycles` at the next event they do
        not cover: a condition's arrival, a stall, a wake-up or tick off the fast path,
        the stream's leaving or the run's end (:meth:`_hand_back`)."""
        ctrl = self.ctrl
        if self.tick_pos < 0 or self.tick_pos != ctrl.next_position:
            return
        books = ctrl.quiet_cycle_books()
        if books is None:
            return
        first, asked, armed = books
        self.coasting = True
        self.first = first
        self.ready = ctrl.cache_end
        self.armed = armed
        if armed == armed:  # armed, not asked for
            self.jobs = [[math.inf, math.inf, math.inf, armed]]
            self.took = [0.0]
        else:
            self.jobs = [[asked, self.job_start, math.inf, math.nan]]
            self.took = [self.job_took]
        self.ticks = []
        self.due_next = ctrl.next_due

    def _coast_ticks(self, bound: float) -> bool:
        """Play the ticks before ``bound`` (global time) as ``_play_quiet`` would (in
        Consume, each one's decide step must keep the armed refill as it is). False where
        one cannot be: it stalls, or its decide step would act; the ticks before it are
        played."""
        at = self.tick_at
        if at >= bound:
            return True
        origin, delta, ticks = self.origin, self.delta, self.ticks
        position, ready, armed = self.tick_pos, self.ready, self.armed
        quiet = True
        if armed != armed:  # a job in flight: no decide step
            while at < bound:
                if position >= ready:
                    quiet = False
                    break
                t = at - origin
                ticks.append(t)
                position += 1
                ahead = (t + delta) + origin - at
                if ahead > 0.0:
                    at += ahead
        else:  # the decide step after each tick: the refill stays armed, not yet due
            lead = self.lead
            while at < bound:
                t = at - origin
                after = t + delta
                due = after + (ready - (position + 1)) * delta - lead
                if position >= ready or due <= t + EPS or abs(armed - due) > EPS:
                    quiet = False
                    break
                ticks.append(t)
                position += 1
                ahead = after + origin - at
                if ahead > 0.0:
                    at += ahead
        if position != self.tick_pos:
            self.tick_pos, self.tick_at = position, at
            self.due_next = ticks[-1] + delta
        return quiet

    def _refill_due(self) -> float:
        """``_refill_due_from(next_pos, next_due)`` as the ticks played leave them, with no
        job in flight (the planned end is the cache's)."""
        return (self.due_next + (self.ready - self.tick_pos) * self.delta) - self.lead

    def _coast_wake(self, at: float) -> bool:
        """``quiet_wake``: the armed refill starts, where one is armed and it and the
        refill's due time by the ticks played are due by ``at``. False (nothing changed)
        where not: a wake-up still comes with a job in flight where a condition's arrival
        started the job its refill was armed for (the table then does nothing)."""
        t = at - self.origin
        armed = self.armed
        if armed != armed or armed > t + EPS or self._refill_due() > t + EPS:
            return False
        self.jobs[-1][0] = t
        self._ask(at)
        return True

    def _coast_done(self, at: float) -> None:
        """``quiet_job_done``: the chunk is cached, and the next refill starts at once or
        is armed for its due time."""
        t = at - self.origin
        self.jobs[-1][2] = t
        self.ready += self.K
        due = self._refill_due()
        if due <= t + EPS:
            self.jobs.append([t, math.inf, math.inf, math.nan])
            self.took.append(0.0)
            self._ask(at)
            return
        self.armed = due
        self.jobs.append([math.inf, math.inf, math.inf, due])
        self.took.append(0.0)
        self.loop.wake_at(self.index, at + max(0.0, due + self.origin - at))

    def _ask(self, at: float) -> None:
        """The refill asked for at ``at`` (the stretch's last job): its first step queued
        on the pool."""
        self.armed = math.nan
        self.job_start = math.inf
        self.loop.submit(self.index, self.first + len(self.jobs) - 1, "refill", at)

    def _hand_back(self) -> None:
        """End the coasting: the stretch to the controller in one step, and what the
        viewer saw of it."""
        self.coasting = False
        ticks = self.ticks
        jobs = [(asked, start, done, due) for asked, start, done, due in self.jobs]
        if not self.run.play_quiet_cycles(ticks, jobs, self.took):
            raise Differs  # its books do not take what was played here
        self._shown_in_one_step(ticks)

    def close_by(self, horizon: float, through: bool) -> float | None:
        """Play the ticks before ``horizon`` (at it too, ``through``) until the one that
        shows the last condition open; its time, or None if none did."""
        if self.coasting:
            self._hand_back()
        return self._ticks(horizon, through, closing=True)

    def play_to(self, end: float, through: bool) -> None:
        """Play the ticks before the run's ``end`` (at it too, ``through``)."""
        if self.coasting:
            self._coast_ticks(math.nextafter(end, math.inf) if through else end)
            self._hand_back()
        self._ticks(end, through, closing=False)
