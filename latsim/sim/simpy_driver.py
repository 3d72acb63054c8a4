"""The SimPy driver: one controller, one generator worker, a player and an arrival process.

The controller decides and :class:`~latsim.run.stream.StreamRun` keeps the books; this module
only keeps SimPy's clock. Job durations come from a cost model, arrivals from a
:class:`~latsim.model.traces.Trace`. Conditions arrive within ``[0, duration)``; the run
continues past ``duration`` only to let the last conditions show (bounded by ``drain``), and
time fractions are measured over ``[0, duration]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappush

import numpy as np
import simpy
from simpy.events import NORMAL, URGENT

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    Event,
    JobDone,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.errors import LatsimError
from latsim.model.costs import CostModel
from latsim.model.traces import Trace
from latsim.run.stream import RunRecords, RunWindow, StreamRun


class _Environment(simpy.Environment):
    """SimPy's environment, plus scheduling at an absolute time and moving a timer.

    SimPy schedules by delay (``now + delay``), and after a skip no delay may land on the
    tick's time exactly; :meth:`timeout_at` pushes onto the same queue the way
    :meth:`simpy.Environment.schedule` does (time, priority, event id), so ties still
    resolve in scheduling order. :meth:`reschedule` moves a timer that has not fired, and
    :meth:`peek_besides` is the next event time but for one. These read SimPy 4's queue
    layout (``simpy<5`` is pinned); the queue stays a handful of entries long (the arrivals
    are scheduled one at a time), so a linear search is cheap.
    """

    def timeout_at(self, at: float, priority: int = NORMAL) -> simpy.Event:
        if at < self.now:
            raise ValueError(f"{at!r} is in the past (now {self.now!r})")
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (at, priority, next(self._eid), event))
        return event

    def reschedule(self, event: simpy.Event, at: float) -> None:
        """Move a scheduled, unfired ``event`` to ``at`` exactly, ordered as if scheduled
        now (a new event id)."""
        if at < self.now:
            raise ValueError(f"{at!r} is in the past (now {self.now!r})")
        queue = self._queue
        for index, entry in enumerate(queue):
            if entry[3] is event:
                queue[index] = (at, entry[1], next(self._eid), event)
                heapify(queue)
                return
        raise ValueError("the event is not scheduled")

    def peek_besides(self, event: simpy.Event | None) -> float:
        """The time of the next scheduled event other than ``event``."""
        queue = self._queue
        if not queue:
            return math.inf
        if queue[0][3] is not event:
            return queue[0][0]
        return min((entry[0] for entry in queue[1:3]), default=math.inf)  # root's children


class _SimPyPort:
    """Carries out commands on SimPy's clock; job durations are drawn from ``cost``.

    It lets the controller skip ticks (a :class:`~latsim.run.stream.SkippingPort`) before
    ``skip_until``. The pending tick is the one timer it may take back: SimPy's next other
    event bounds the skip. SimPy schedules by delay, ``now + (at - now)``; a tick asked for
    one slot ahead from ``now >= delta`` lands on ``at`` exactly (Sterbenz: ``at <= 2
    now``), which is what :meth:`Controller.play_ahead` assumes of every skipped tick, so the
    port offers the pending tick only from ``delta`` on, and only when it lands where the
    controller expects it.
    """

    def __init__(self, env: _Environment, cost: CostModel, K: int,  # noqa: N803
                 rng: np.random.Generator, delta: float) -> None:
        self.env = env
        self.cost = cost
        self.K = K
        self.rng = rng
        self.delta = delta
        self.skip_until = -math.inf
        self.run: StreamRun | None = None
        self._tick: simpy.Event | None = None  # the pending tick's timer
        self._tick_position = 0
        self._tick_at = 0.0  # where SimPy will deliver it

    def deliver(self, event: Event) -> None:
        self.run.deliver(event, self.env.now)  # type: ignore[union-attr]

    def _on_tick(self, timer: simpy.Event) -> None:
        if timer is not self._tick:  # the controller asks for one tick at a time
            raise AssertionError("a tick fired that is not the pending one")
        self._tick = None
        self.run.deliver(SlotDue(self._tick_position), self.env.now)  # type: ignore[union-attr]

    def pending_tick(self) -> tuple[int, float] | None:
        if self._tick is None or self._tick_at < self.delta or self._tick_at >= self.skip_until:
            return None
        return self._tick_position, self._tick_at

    def horizon(self) -> float:
        return min(self.env.peek_besides(self._tick), self.skip_until)

    def move_tick(self, at: float, position: int) -> None:
        self.env.reschedule(self._tick, at)  # type: ignore[arg-type]
        self._tick_position = position
        self._tick_at = at

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        now = self.env.now
        delay = max(0.0, at - now)
        timer = self.env.timeout(delay)
        if type(event) is SlotDue:
            timer.callbacks.append(self._on_tick)
            self._tick, self._tick_position, self._tick_at = timer, event.position, now + delay
        else:
            timer.callbacks.append(lambda _, e=event: self.deliver(e))

    def start_job(self, job: StartJob, now: float) -> None:
        took = self.cost.sample(self.K, self.rng, job.kind)
        self.run.job_ran(job.job_id, now, now + took)  # type: ignore[union-attr]
        done = self.env.timeout(took)
        done.callbacks.append(lambda _, j=job.job_id: self.deliver(JobDone(j)))

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
            self.deliver(ConditionArrived())
            following = next(pending, None)
            if following is not None:
                self.env.timeout_at(following, URGENT).callbacks.append(arrive)

        self.env.timeout_at(next(pending), URGENT).callbacks.append(arrive)


def simulate_trace(
    config: ControllerConfig,
    cost: CostModel,
    trace: Trace,
    duration: float,
    rng: np.random.Generator,
    drain: float | None = None,
    on_record: Callable[[object], None] | None = None,
    skip_ticks: bool = True,
) -> tuple[RunRecords, Controller]:
    """Run one trace through the controller on SimPy's clock.

    ``drain`` bounds the time past ``duration`` spent letting open conditions show (default:
    :func:`latsim.run.stream.default_drain`); ``on_record`` receives every record as it is
    made. ``skip_ticks=False`` delivers every slot's tick as a SimPy event instead of
    letting the controller play the quiet ones ahead (:meth:`Controller.play_ahead`): the
    records are the same, bit for bit; it is there to check that, and to measure the gain.
    """
    if config.pipelined:
        raise LatsimError("one worker runs one job at a time: several chunks in flight, or "
                          "the flush policy, need the serving model (--pools; one stream on "
                          "one dedicated device is this model)")
    window = RunWindow.for_config(config, duration, drain)
    env = _Environment()
    port = _SimPyPort(env, cost, config.timing.K, rng, config.timing.delta)
    run = port.run = StreamRun(config, window, port, on_record)

    port.arrivals(sorted(t for t in trace.times if t < window.duration))
    if skip_ticks:  # only within the window: the drain stops as soon as nothing is open,
        port.skip_until = window.duration  # between two events, which a skip would overrun
    run.start(env.now)
    env.run(until=window.duration)
    port.skip_until = -math.inf
    while run.controller.open_conditions and env.peek() <= window.limit:
        env.step()
    return run.finish(env.now), run.controller
