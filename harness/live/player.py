"""Wall-clock timing for the live driver: precise sleeps, the player clock, the condition injector.

Everything here works in absolute ``time.perf_counter()`` seconds and only *posts* events to
the driver's queue; the controller itself is fed by the driver thread alone.

- :func:`sleep_until` sleeps with the OS until ``spin_s`` before the deadline, then spins:
  OS sleeps overshoot by 50-100 µs (more under load), the spin brings a timer to within a
  few µs of its deadline at the cost of holding one core for ``spin_s``.
- :class:`PlayerClock` is the player's clock thread: it delivers the controller's timers
  (``SlotDue`` ticks and refill ``WakeUp``\\ s) at their scheduled times and records the
  lateness of every one it delivers. A slot that is due but not ready stalls in the
  controller, not here.
- :class:`ConditionInjector` replays a trace's arrival times as ``ConditionArrived`` events.

Both say, with ``next_due()``, when their next event is due: a timer stays in the clock
until it is posted (pop and post happen under one lock), so the driver can tell an event
that is due but not yet posted (a late timer) from one that is not due yet, and hold back
an event that happened later (:mod:`harness.live.driver`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from latsim.controller import ConditionArrived

#: Spin this long before a deadline instead of sleeping (seconds).
SPIN_S = 0.001

#: ``post(event, scheduled_at, fired_at)``: hand an event to the driver (thread-safe).
Post = Callable[[object, float, float], None]


def sleep_until(deadline: float, spin_s: float = SPIN_S,
                stop: threading.Event | None = None) -> float:
    """Block until ``perf_counter() >= deadline``; returns the time it woke.

    Sleeps until ``spin_s`` before the deadline (in slices of at most 50 ms when ``stop``
    is given, so a stop request is seen), then spins. Returns early if ``stop`` is set.
    """
    clock = time.perf_counter
    while True:
        now = clock()
        remaining = deadline - now
        if remaining <= 0:
            return now
        if stop is not None and stop.is_set():
            return now
        if remaining > spin_s:
            pause = remaining - spin_s
            if stop is not None:
                stop.wait(min(pause, 0.05))
            else:
                time.sleep(pause)
        else:
            while clock() < deadline:
                pass


@dataclass(frozen=True)
class TimerFired:
    """One delivered timer: what it carried, when it was due and when it fired."""

    event: object
    scheduled: float
    fired: float

    @property
    def lateness(self) -> float:
        return self.fired - self.scheduled


class PlayerClock:
    """A thread that posts events at scheduled ``perf_counter`` times (earliest first).

    :meth:`schedule` may be called from any thread. Timers due in the past fire at once.
    """

    def __init__(self, post: Post, spin_s: float = SPIN_S) -> None:
        self._post = post
        self._spin = spin_s
        self._heap: list[tuple[float, int, object]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="latsim-player", daemon=True)
        self.fired: list[TimerFired] = []

    def start(self) -> None:
        self._thread.start()

    def schedule(self, at: float, event: object) -> None:
        with self._cond:
            seq = next(self._seq)
            heapq.heappush(self._heap, (at, seq, event))
            if self._heap[0][1] == seq:  # the new earliest timer: re-arm the wait
                self._cond.notify()

    def stop(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def next_due(self) -> float | None:
        """When the earliest timer not yet posted is due (``None``: none is scheduled)."""
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def _loop(self) -> None:
        clock = time.perf_counter
        while True:
            with self._cond:
                while not self._stopped and not self._heap:
                    self._cond.wait()
                if self._stopped:
                    return
                at = self._heap[0][0]
                wait = at - clock() - self._spin
                if wait > 0:
                    self._cond.wait(wait)  # woken early by an earlier timer or stop
                    continue
            while clock() < at:  # spin outside the lock: schedule() stays responsive
                pass
            with self._cond:
                if self._stopped:
                    return
                if not self._heap or self._heap[0][0] > at:
                    continue  # cannot happen (only this thread pops), kept for safety
                _, _, event = heapq.heappop(self._heap)
                fired = clock()
                # posted under the lock: next_due() never misses a timer between pop and post
                self._post(event, at, fired)
            self.fired.append(TimerFired(event, at, fired))


class ConditionInjector:
    """A thread that posts ``ConditionArrived`` at ``t0 + t`` for each trace time ``t``."""

    def __init__(self, post: Post, t0: float, times: Sequence[float],
                 spin_s: float = SPIN_S) -> None:
        self._post = post
        self._t0 = t0
        self._times = tuple(times)
        self._spin = spin_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0  # index of the next time to post
        self._thread = threading.Thread(target=self._loop, name="latsim-conditions",
                                        daemon=True)
        self.fired: list[TimerFired] = []

    def next_due(self) -> float | None:
        """When the next arrival not yet posted is due (``None``: none left, or stopped)."""
        with self._lock:
            if self._stop.is_set() or self._next >= len(self._times):
                return None
            return self._t0 + self._times[self._next]

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        for index, t in enumerate(self._times):
            at = self._t0 + t
            fired = sleep_until(at, self._spin, self._stop)
            if self._stop.is_set():
                return
            event = ConditionArrived(payload={"trace_index": index, "t": t})
            with self._lock:
                self._post(event, at, fired)
                self._next = index + 1
            self.fired.append(TimerFired(event, at, fired))
