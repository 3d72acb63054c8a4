"""The simulators' clock: SimPy's environment, with the order of events stated and owned.

Every SimPy driver in latsim (one stream, the serving model, the fleet) runs on a
:class:`Clock`. It is the only code in the project that reads or writes SimPy's internals
(its event queue, its event-id counter, its current time), as SimPy's own ``rt.py``
overrides ``step`` in one subclass; ``tests/test_clock.py`` checks the SimPy series and
the queue-entry layout it relies on, so that a SimPy release that changes them fails there
and not as a silently different result.

**The order of events** (docs/design.md §6, "Event order"). An event runs at its time; at
one time, an ``URGENT`` event (a condition's arrival, a run's stop) before a ``NORMAL``
one (a device step, a job's end, a wake-up), and among events of one time and priority,
in the order they were scheduled: the event id each scheduling call takes (SimPy's key:
``(time, priority, id)``). Playout ticks come last at their instant (priority
:data:`TICK`), among themselves by stream index, then scheduling order (their id is
``(stream, id)``): their place does not depend on when they were scheduled, so a driver
may play a stream's quiet ticks when it next touches the stream without moving them.
Scheduling by delay sums ``now + delay`` in floating point, as :class:`simpy.Timeout`
does; :meth:`Clock.timeout_at` schedules at an exact time instead. A driver that keeps
some of its timers outside the queue (the single-stream driver's batches, the
controller's quiet ticks) must deliver them in this order; ``tests/test_play_ahead.py``
and the serving model's reproduction of the single worker check that they do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappush

import simpy
from simpy.events import NORMAL, URGENT

__all__ = ["NORMAL", "SIMPY_SERIES", "TICK", "URGENT", "Call", "Clock"]

#: The SimPy major version whose queue layout :class:`Clock` reads (``simpy<5`` is pinned).
SIMPY_SERIES = 4
#: A playout tick's priority: after URGENT and NORMAL events of the same instant.
TICK = NORMAL + 1


class Call:
    """A callback on the clock, lighter than a :class:`simpy.Timeout`: the two attributes
    :meth:`simpy.Environment.step` reads of an event (``callbacks``, which it only
    iterates, so one tuple may serve many; ``_ok``) and the value it carries. The serving
    model's ticks, timers and device steps are most of its events, and a Timeout's
    construction was a fifth of a tick's cost."""

    __slots__ = ("callbacks", "_ok", "value")

    def __init__(self, callbacks: tuple[Callable[[Call], None], ...], value: object) -> None:
        self.callbacks = callbacks
        self._ok = True
        self.value = value


class Clock(simpy.Environment):
    """SimPy's environment, plus scheduling at an exact time, light callbacks, event ids
    taken ahead, and moving a timer (see the module docstring for the order of events)."""

    def __init__(self, initial_time: float = 0.0) -> None:
        # SimPy's own default is the int 0, which a record made before the first float
        # event kept (a prebuffer's t_start read 0, the compiled build's 0.0)
        super().__init__(initial_time)

    def call_later(self, delay: float, callbacks: tuple[Callable[[Call], None], ...],
                   value: object = None) -> None:
        """Call each of ``callbacks`` with a :class:`Call` carrying ``value``, ``delay``
        (≥ 0) from now, in the order ``env.timeout(delay, value)`` with those callbacks
        would run them (the same key)."""
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid),
                               Call(callbacks, value)))

    def call_tick_later(self, delay: float, callbacks: tuple[Callable[[Call], None], ...],
                        value: object, stream: int) -> None:
        """:meth:`call_later` for a playout tick: after every other event of its instant,
        and among ticks by ``stream`` (then scheduling order)."""
        heappush(self._queue, (self._now + delay, TICK, (stream, next(self._eid)),
                               Call(callbacks, value)))

    def call_tick_at(self, at: float, callbacks: tuple[Callable[[Call], None], ...],
                     value: object, stream: int) -> None:
        """:meth:`call_tick_later` at the time ``at`` exactly (not after now)."""
        heappush(self._queue, (at, TICK, (stream, next(self._eid)), Call(callbacks, value)))

    def take_id(self) -> int:
        """The next event id, taken now: an event queued later under it (:meth:`call_at`)
        keeps the place in the order of one scheduled now."""
        return next(self._eid)

    def call_at(self, at: float, priority: int, event_id: int,
                callbacks: tuple[Callable[[Call], None], ...], value: object = None) -> None:
        """Queue a :class:`Call` under a key taken earlier (:meth:`take_id`)."""
        heappush(self._queue, (at, priority, event_id, Call(callbacks, value)))

    def timeout_at(self, at: float, priority: int = NORMAL) -> simpy.Event:
        """An event that fires at ``at`` exactly (not ``now + delay``), ordered as if
        scheduled now."""
        if at < self._now:
            raise ValueError(f"{at!r} is in the past (now {self._now!r})")
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heappush(self._queue, (at, priority, next(self._eid), event))
        return event

    def advance_to(self, at: float) -> None:
        """Move the clock to ``at`` with no event run: for timers a driver holds outside
        the queue (quiet ticks), which would have moved it there had they been events.
        Refused past the next queued event, or back in time."""
        if at < self._now or at > self.peek():
            raise ValueError(f"{at!r} is not between now ({self._now!r}) and the next event "
                             f"({self.peek()!r})")
        self._now = at

    def reschedule(self, event: simpy.Event, at: float) -> None:
        """Move a scheduled, unfired ``event`` to ``at`` exactly, ordered as if scheduled
        now (a new event id). A linear search: for a queue a handful of entries long (the
        single-stream driver's)."""
        if at < self._now:
            raise ValueError(f"{at!r} is in the past (now {self._now!r})")
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
