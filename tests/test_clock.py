"""The clock's contract with SimPy: the one place that reads SimPy's internals
(:mod:`latsim.sim.clock`) relies on its series, its queue-entry layout and what ``step``
reads of an event; these tests fail on a SimPy that changes them, before any result does."""

from __future__ import annotations

import heapq
import itertools
from importlib.metadata import version

import simpy
from simpy.events import NORMAL, URGENT

from latsim.sim.clock import SIMPY_SERIES, Clock


def test_simpy_is_the_series_the_clock_reads():
    assert int(version("simpy").split(".")[0]) == SIMPY_SERIES
    assert URGENT < NORMAL  # an urgent event runs first at one time


def test_a_queue_entry_is_time_priority_id_event():
    env = simpy.Environment()
    assert isinstance(env._eid, itertools.count) and isinstance(env._queue, list)
    event = env.timeout(1.5)
    (entry,) = env._queue
    assert len(entry) == 4 and entry[0] == 1.5 and entry[1] == NORMAL and entry[3] is event
    first_id = entry[2]
    env.timeout(0.5)
    assert heapq.nsmallest(1, env._queue)[0][2] == first_id + 1  # ids count up
    env.step()
    assert env._now == env.now == 0.5


def test_calls_run_in_simpys_order_with_timeouts():
    """Light calls, exact-time events and timeouts interleave by (time, priority, id): the
    order ``env.timeout`` alone would give."""
    env = Clock()
    seen = []
    env.timeout(1.0).callbacks.append(lambda _: seen.append("timeout 1"))
    env.call_later(1.0, (lambda call: seen.append(call.value),), "call 1")
    late = env.take_id()  # an id taken now, queued later: keeps its place
    env.timeout_at(1.0, URGENT).callbacks.append(lambda _: seen.append("urgent at 1"))
    env.call_later(0.25, (lambda call: seen.append(call.value),), "call 0.25")
    env.call_at(1.0, NORMAL, late, (lambda call: seen.append(call.value),), "taken early")
    env.run()
    assert seen == ["call 0.25", "urgent at 1", "timeout 1", "call 1", "taken early"]


def test_a_call_sums_its_time_as_a_timeout_does():
    env, plain = Clock(), simpy.Environment()
    for clock in (env, plain):
        clock.timeout(0.1).callbacks.append(lambda _: None)
        clock.run()
    times = []
    env.call_later(0.2, (lambda _: times.append(env.now),))
    plain.timeout(0.2).callbacks.append(lambda _: times.append(plain.now))
    env.run()
    plain.run()
    assert times[0] == times[1] == 0.1 + 0.2  # not 0.3: the same float sum


def test_reschedule_and_peek_besides():
    env = Clock()
    moving = env.timeout_at(5.0)
    env.timeout_at(3.0)
    assert env.peek_besides(None) == 3.0
    env.reschedule(moving, 1.0)
    assert env.peek() == 1.0 and env.peek_besides(moving) == 3.0


def test_ticks_run_after_every_other_event_of_their_instant_by_stream():
    """The playout ticks' place in the order (docs/design.md §6): after the urgent and
    normal events of their instant whenever those were scheduled, and among themselves by
    stream index, so a driver may play a stream's quiet ticks late without moving them."""
    env = Clock()
    seen = []
    env.call_tick_later(1.0, (lambda call: seen.append(call.value),), "tick of stream 2", 2)
    env.call_tick_later(1.0, (lambda call: seen.append(call.value),), "tick of stream 0", 0)
    env.call_later(1.0, (lambda call: seen.append(call.value),), "normal")
    env.timeout_at(1.0, URGENT).callbacks.append(lambda _: seen.append("urgent"))
    env.call_tick_later(0.5, (lambda call: seen.append(call.value),), "earlier tick", 5)
    env.run()
    assert seen == ["earlier tick", "urgent", "normal", "tick of stream 0", "tick of stream 2"]
