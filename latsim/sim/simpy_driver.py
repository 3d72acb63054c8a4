"""The SimPy driver: one controller, one generator worker, a player and an arrival process.

The controller decides and :class:`~latsim.run.stream.StreamRun` keeps the books; this module
only keeps SimPy's clock. Job durations come from a cost model, arrivals from a
:class:`~latsim.model.traces.Trace`. Conditions arrive within ``[0, duration)``; the run
continues past ``duration`` only to let the last conditions show (bounded by ``drain``), and
time fractions are measured over ``[0, duration]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from itertools import count

import numpy as np
import simpy

from latsim.controller import (
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
from latsim.errors import LatsimError
from latsim.model.costs import CostModel
from latsim.model.traces import Trace
from latsim.run.stream import RunRecords, RunWindow, StreamRun
from latsim.sim.clock import URGENT, Clock


class _SimPyPort:
    """Carries out commands on SimPy's clock; job durations are drawn from ``cost``.

    **The stream's own timers** (its ticks, wake-ups and job ends) wait in the port's heap,
    and SimPy holds one timer for the earliest of them. When it fires, the port delivers
    its timers in order for as long as they fall strictly before SimPy's next other event
    (an arrival, or the end of the window) and before ``batch_until``, without a SimPy
    event for each. Every other event SimPy holds is ``URGENT`` (arrivals, ``run``'s
    stop), so it comes before a stream timer at the same time either way, and the stream's
    timers keep their scheduling order among themselves: the order of events, and every
    time (``now + delay``, as SimPy sums it), are those of one SimPy timer per command.
    Past ``batch_until`` (the drain) the port delivers one timer per SimPy step, so the
    driver can stop between any two.

    It lets the controller skip ticks (a :class:`~latsim.run.stream.SkippingPort`) before
    ``skip_until``. The pending tick is the one timer it may take back: the next other
    event bounds the skip. A tick asked for one slot ahead from ``now >= delta`` lands on
    ``at`` exactly (``now + (at - now)``; Sterbenz: ``at <= 2 now``), which is what
    :meth:`Controller.play_ahead` assumes of every skipped tick, so the port offers the
    pending tick only from ``delta`` on, and only when it lands where the controller
    expects it.
    """

    def __init__(self, env: Clock, cost: CostModel, K: int,
                 rng: np.random.Generator, delta: float) -> None:
        self.env = env
        self.cost = cost
        self.K = K
        self.rng = rng
        self.delta = delta
        self.skip_until = -math.inf
        self.batch_until = -math.inf
        self.play_through = False  # the controller delivers the timers of a batch itself
        self.run: StreamRun | None = None
        self.now = 0.0  # the time of the event being delivered (SimPy's or the port's)
        # [time, order, event]: the event is None once the timer is taken back
        self._timers: list[list] = []
        self._order = count()
        self._wake: simpy.Event | None = None  # SimPy's timer for the earliest of them
        self._wake_at = math.inf
        self._tick: list | None = None  # the pending tick's entry in _timers

    def _push(self, at: float, event: Event) -> list:
        entry = [at, (type(event) is SlotDue, next(self._order)), event]
        heappush(self._timers, entry)
        if at < self._wake_at:
            self._wake_at = at
            if self._wake is None:
                self._wake = self.env.timeout_at(at)
                self._wake.callbacks.append(self._on_wake)
            else:
                self.env.reschedule(self._wake, at)
        return entry

    def _on_wake(self, _: simpy.Event) -> None:
        """Deliver the timer due now, then the ones before SimPy's next event (see the
        class docstring); then hand SimPy a timer for the earliest left."""
        timers, env, run = self._timers, self.env, self.run
        assert run is not None, "the port is attached to its run before the clock starts"
        self._wake, self._wake_at = None, -math.inf  # pushes while delivering: no timer
        now = env.now
        limit = min(self.batch_until, env.peek())
        while timers:
            at, _, event = timers[0]
            if event is None:  # taken back
                heappop(timers)
                continue
            if at > now and not at < limit:
                break
            heappop(timers)
            if type(event) is SlotDue:
                self._tick = None
            self.now = at
            run.deliver(event, at)
            if not at < limit:
                break
            if self.play_through:
                last = _play_through(run, timers, limit, self._order, self._job_end)
                if last > self.now:
                    self.now = last
                self._tick = next((entry for entry in timers if type(entry[2]) is SlotDue),
                                  None)
                break
        self._wake_at = math.inf
        if timers:
            self._wake_at = timers[0][0]
            self._wake = env.timeout_at(self._wake_at)
            self._wake.callbacks.append(self._on_wake)

    def pending_tick(self) -> tuple[int, float] | None:
        tick = self._tick
        if tick is None or tick[0] < self.delta or tick[0] >= self.skip_until:
            return None
        return tick[2].position, tick[0]

    def horizon(self) -> float:
        return min(_first_besides(self._timers, self._tick, math.inf),
                   self.env.peek_besides(self._wake), self.skip_until)

    def move_tick(self, at: float, position: int) -> None:
        self._tick[2] = None  # type: ignore[index]
        self._tick = self._push(at, SlotDue(position))

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        now = self.now
        entry = self._push(now + max(0.0, at - now), event)
        if type(event) is SlotDue:
            if self._tick is not None:  # the controller asks for one tick at a time
                raise AssertionError("a tick asked for while another is pending")
            self._tick = entry

    def start_job(self, job: StartJob, now: float) -> None:
        self._push(self._job_end(job, now), JobDone(job.job_id))

    def _job_end(self, job: StartJob, now: float) -> float:
        """Draw the job's time; book and return when it ends."""
        took = self.cost.sample(self.K, self.rng, job.kind)
        self.run.job_ran(job.job_id, now, now + took)  # type: ignore[union-attr]
        return now + took

    def play(self, slot: PlaySlot) -> None:
        pass  # nothing to show in simulation: the slot record is the output

    def arrivals(self, times: list[float]) -> None:
        """Deliver a condition at each of ``times`` (sorted). One timer at a time, each at
        its time exactly and urgent, so a condition comes before any other event at the
        same time, as when every arrival was scheduled before the run began."""
        if not times:
            return
        pending = iter(times)

        def arrive(_: object) -> None:
            self.now = self.env.now
            self.run.deliver(ConditionArrived(), self.now)  # type: ignore[union-attr]
            following = next(pending, None)
            if following is not None:
                self.env.timeout_at(following, URGENT).callbacks.append(arrive)

        self.env.timeout_at(next(pending), URGENT).callbacks.append(arrive)


def _play_through(run: StreamRun, timers: list[list], horizon: float, order: Iterator[int],
                  job_end: Callable[[StartJob, float], float]) -> float:
    """Deliver the stream's own timers that fall strictly before ``horizon`` to its
    controller, as the port would one SimPy step each, without a step for each; returns
    the time of the last one delivered (``-inf`` if none).

    ``timers`` is the port's heap of ``[at, order, event]`` entries (the ticks, wake-ups
    and job ends asked for; ``event`` None for an entry taken back), delivered in ``(at,
    order)`` order, new ones getting ``next(order)``. The port promises what a single
    worker on a simulated clock does: nothing but these timers reaches the controller
    before ``horizon``; a wake-up or tick asked for at ``at`` from ``now`` fires at
    ``now + max(0, at − now)``; a job started at ``now`` ends when ``job_end(command,
    now)`` (which also books it) says; showing a slot takes nothing. Every event goes
    through :meth:`Controller.handle`, and the quiet ticks between two other timers are
    played ahead (:meth:`Controller.play_ahead`), so the records are those of delivering
    each timer as its own event, byte for byte (``tests/test_play_ahead.py``).
    """
    ctrl, starts = run.controller, run.job_starts
    if ctrl.config.pipelined:
        raise RuntimeError("play_through runs one job at a time")
    handle, delta = ctrl.handle, ctrl.config.timing.delta
    last = -math.inf
    tick: list | None = None  # the pending tick's entry
    for entry in timers:
        if type(entry[2]) is SlotDue:
            tick = entry
    while timers:
        entry = timers[0]
        at, _, event = entry
        if event is None:
            heappop(timers)
            continue
        if not at < horizon:
            break
        heappop(timers)
        if type(event) is SlotDue:
            tick = None
        last = at
        if type(event) is WakeUp and _tick_pending(tick, ctrl, delta):
            job = ctrl.quiet_wake(at)
            if job is not None:  # a refill cycle with nothing else going on: by the chunk
                last, pending_at, pending = _refill_cycles(
                    ctrl, starts, job, at, _first_besides(timers, tick, horizon), job_end,
                    delta)
                heappush(timers, [pending_at, (False, next(order)), pending])
                if not _tick_pending(tick, ctrl, delta):
                    tick = _ask_tick(tick, ctrl, timers, order)
                continue
        for command in handle(event, at):
            if type(command) is ScheduleWakeUp:
                timer = [at + max(0.0, command.at - at),
                         (type(command.event) is SlotDue, next(order)), command.event]
                if type(command.event) is SlotDue:
                    tick = timer
                heappush(timers, timer)
            elif type(command) is StartJob:
                starts[command.job_id] = at
                heappush(timers, [job_end(command, at), (False, next(order)),
                                  JobDone(command.job_id)])
        if (_tick_pending(tick, ctrl, delta)
                and ctrl.play_ahead(_first_besides(timers, tick, horizon))):
            tick = _ask_tick(tick, ctrl, timers, order)
    return last


def _first_besides(timers: list[list], tick: list | None, bound: float) -> float:
    """The time of the earliest live timer of ``timers`` other than ``tick``, if before
    ``bound`` (a handful of entries: the tick, a wake-up or two, a job's end)."""
    for entry in timers:
        if entry[0] < bound and entry is not tick and entry[2] is not None:
            bound = entry[0]
    return bound


def _tick_pending(tick: list | None, ctrl: Controller, delta: float) -> bool:
    """Whether ``tick`` is the controller's next tick where :meth:`Controller.play_ahead`
    expects it (see :class:`_SimPyPort`)."""
    return (tick is not None and tick[0] >= delta and tick[0] == ctrl.next_due
            and tick[2].position == ctrl.next_position)


def _ask_tick(tick: list | None, ctrl: Controller, timers: list[list],
              order: Iterator[int]) -> list:
    """Take ``tick`` back and ask for the controller's next one: its new entry."""
    if tick is not None:
        tick[2] = None
    entry = [ctrl.next_due, (True, next(order)), SlotDue(ctrl.next_position)]
    heappush(timers, entry)
    return entry


def _refill_cycles(ctrl: Controller, starts: dict[int, float], job: StartJob, now: float,
                   bound: float, job_end: Callable[[StartJob, float], float], delta: float
                   ) -> tuple[float, float, JobDone | WakeUp]:
    """Refill cycles played by the chunk, from ``job`` started at ``now`` by a wake-up
    (:meth:`Controller.quiet_wake`): each job's end, the next refill armed and its wake-up
    (:meth:`Controller.quiet_job_done`, :meth:`Controller.quiet_wake`) and the quiet ticks
    between them (:meth:`Controller.play_ahead`), without a timer each, while nothing but
    those would reach the controller before ``bound`` and each is quiet. Returns the time
    of the last event handled, and the timer left pending: a job's end or a wake-up, to
    go through :meth:`Controller.handle` (the pending tick is at the controller's
    :attr:`~Controller.next_due`). The same calls in the same order as
    :func:`_play_through` makes one timer at a time, so the same records."""
    last = now
    while True:
        starts[job.job_id] = now
        end = job_end(job, now)
        if ctrl.next_due >= delta:
            ctrl.play_ahead(min(end, bound))
        if not end < bound or ctrl.next_due < end:  # a tick before it is not quiet
            return last, end, JobDone(job.job_id)
        after = ctrl.quiet_job_done(job.job_id, end)
        if after is None:
            return last, end, JobDone(job.job_id)
        last = now = end
        if type(after) is StartJob:  # the next refill was due already
            job = after
            continue
        wake = end + max(0.0, after - end)  # type: ignore[operator]
        if ctrl.next_due >= delta:
            ctrl.play_ahead(min(wake, bound))
        if not wake < bound or ctrl.next_due < wake:
            return last, wake, WakeUp()
        started = ctrl.quiet_wake(wake)
        if started is None:
            return last, wake, WakeUp()
        job, last, now = started, wake, wake


def simulate_trace(
    config: ControllerConfig,
    cost: CostModel,
    trace: Trace,
    duration: float,
    rng: np.random.Generator,
    drain: float | None = None,
    on_record: Callable[[object], None] | None = None,
    skip_ticks: bool = True,
    records: str = "all",
) -> tuple[RunRecords, Controller]:
    """Run one trace through the controller on SimPy's clock.

    ``drain`` bounds the time past ``duration`` spent letting open conditions show (default:
    :func:`latsim.run.stream.default_drain`); ``on_record`` receives every record as it is
    made. ``skip_ticks=False`` is the reference path: every timer (every slot's tick
    included) is one SimPy step, instead of the controller playing the quiet ticks ahead
    (:meth:`Controller.play_ahead`) and the port delivering its timers in batches between
    SimPy's other events. The records are the same, bit for bit; it is there to check
    that, and to measure the gain. ``records`` is what to keep
    (:data:`~latsim.controller.records.RECORD_LEVELS`): below ``all`` the slots and busy
    intervals are counted into what the summary needs, not kept.
    """
    if config.pipelined:
        raise LatsimError("one worker runs one job at a time: several chunks in flight, or "
                          "the flush policy, need the serving model (--pools; one stream on "
                          "one dedicated device is this model)")
    window = RunWindow.for_config(config, duration, drain)
    env = Clock()
    port = _SimPyPort(env, cost, config.timing.K, rng, config.timing.delta)
    run = port.run = StreamRun(config, window, port, on_record, records,
                               fast_paths=skip_ticks)

    port.arrivals(sorted(t for t in trace.times if t < window.duration))
    # Only within the window: the drain stops between two events as soon as nothing is
    # open, which a skip or a batch of the stream's timers would overrun.
    if skip_ticks:
        port.skip_until = port.batch_until = window.duration
        port.play_through = on_record is None
    run.start(env.now)
    env.run(until=window.duration)
    port.skip_until = port.batch_until = -math.inf
    port.play_through = False
    while run.controller.open_conditions and env.peek() <= window.limit:
        env.step()
    return run.finish(env.now), run.controller
