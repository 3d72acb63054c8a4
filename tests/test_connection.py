"""The viewer connection's protocol machines (harness.serve.connection), driven without a
server: the transition table, the hello timeout, the probe limit, the outbound bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.serve.connection import (
    MISPLACED,
    TRANSITIONS,
    Connection,
    Fault,
    Forward,
    Open,
    Outflow,
    Phase,
    Refuse,
    Reply,
    Reshape,
    StopSession,
)

HELLO = json.dumps({"type": "hello", "K": 4, "duration": 5})
PROBE = json.dumps({"type": "probe", "t0": 1.5})
SHAPE = json.dumps({"type": "shape", "delay": 0.02, "jitter": 0.01, "seed": 3})
CONDITION = json.dumps({"type": "condition", "cid": 7})
BYE = json.dumps({"type": "bye"})


def _connection(now: float = 0.0) -> Connection:
    return Connection(now, hello_timeout=5.0, max_probe_rate=10.0, clock_offset=100.0)


def _in_session() -> Connection:
    connection = _connection()
    assert isinstance(connection.receive(HELLO, 0.1, 100.1)[0], Open)
    connection.opened()
    return connection


def test_before_hello_probes_and_shape_are_answered_and_a_condition_is_refused():
    connection = _connection()
    (reply,) = connection.receive(PROBE, 1.0, 101.0)
    assert isinstance(reply, Reply)
    assert json.loads(reply.text) == {"type": "probe", "t0": 1.5, "t1": 101.0,
                                      "t2": 101.0}
    (reshape,) = connection.receive(SHAPE, 1.1, 101.1)
    assert isinstance(reshape, Reshape) and reshape.seed == 3
    assert reshape.shaper.delay == 0.02 and reshape.shaper.jitter == 0.01
    assert connection.receive(CONDITION, 1.2, 101.2) == [
        Fault("condition before hello: no session", 7)]
    assert connection.receive(BYE, 1.3, 101.3) == []  # nothing to end yet
    assert connection.phase is Phase.GREETING


def test_hello_opens_once_and_the_session_takes_conditions_and_bye():
    connection = _connection()
    (opened,) = connection.receive(HELLO, 0.5, 100.5)
    assert isinstance(opened, Open) and opened.hello.K == 4
    assert connection.phase is Phase.OPENING
    with pytest.raises(RuntimeError, match="opening"):  # the server reads nothing meanwhile
        connection.receive(CONDITION, 0.6, 100.6)
    connection.opened()
    (forward,) = connection.receive(CONDITION, 1.0, 101.0)
    assert isinstance(forward, Forward) and forward.condition.cid == 7
    assert connection.receive(HELLO, 1.1, 101.1) == [
        Fault("this connection already has a session", None)]
    assert connection.receive(SHAPE, 1.2, 101.2) == [
        Fault("shape the connection before hello", None)]
    assert connection.receive(BYE, 1.3, 101.3) == [StopSession("the viewer said bye")]
    assert connection.timed_out() == []  # the deadline is the greeting's only


def test_a_refused_hello_waits_for_another_and_a_full_server_closes():
    connection = _connection()
    connection.receive(HELLO, 0.1, 100.1)
    connection.open_failed()
    assert connection.phase is Phase.GREETING
    connection.receive(HELLO, 0.2, 100.2)
    assert connection.refused("server full (2 sessions)") == [
        Refuse("server full (2 sessions)", 1013)]
    assert connection.phase is Phase.CLOSED
    with pytest.raises(RuntimeError):
        connection.receive(PROBE, 0.3, 100.3)
    with pytest.raises(RuntimeError):
        connection.opened()


def test_no_hello_by_the_deadline_closes_with_a_policy_code():
    connection = _connection(now=2.0)
    assert connection.hello_deadline == 7.0
    assert connection.timed_out() == [Refuse("no hello within 5 s", 1008)]
    assert connection.phase is Phase.CLOSED


def test_a_place_taken_before_hello_closes_with_try_again_later():
    connection = _connection()
    assert connection.evicted("crowded") == [Refuse("crowded", 1013)]
    assert connection.phase is Phase.CLOSED
    opening = _connection()
    assert isinstance(opening.receive(HELLO, 0.1, 100.1)[0], Open)
    with pytest.raises(RuntimeError):  # past hello it holds no place to lose
        opening.evicted("crowded")


def test_probes_beyond_the_rate_close_the_connection():
    connection = _connection()
    for i in range(10):  # the bucket starts full: a burst of one second's worth
        assert isinstance(connection.receive(PROBE, 1e-6 * i, 100.0)[0], Reply)
    assert connection.receive(PROBE, 1e-5, 100.0) == [
        Refuse("clock probes faster than 10 per s", 1008)]
    steady = _connection()
    for i in range(100):  # at the rate, for ten seconds
        assert isinstance(steady.receive(PROBE, 0.1 * i, 100.0)[0], Reply)


def test_connections_from_one_address_share_its_probe_rate():
    """A client that reconnects, or opens several connections, probes at one rate in all:
    each connection's bucket is fresh, the address's is shared."""
    from harness.serve.bucket import TokenBucket

    shared = TokenBucket(10.0, 10.0, 0.0)
    first, second = (Connection(0.0, 10.0, 10.0, address_probes=shared) for _ in range(2))
    for i in range(5):
        assert isinstance(first.receive(PROBE, 1e-6 * i, 100.0)[0], Reply)
        assert isinstance(second.receive(PROBE, 1e-6 * i, 100.0)[0], Reply)
    third = Connection(1e-5, 10.0, 10.0, address_probes=shared)  # a reconnection
    assert third.receive(PROBE, 1e-5, 100.0) == [
        Refuse("clock probes from this address faster than 10 per s", 1008)]
    assert third.phase is Phase.CLOSED


@pytest.mark.parametrize(("raw", "cid"), [
    ("not json", None), ('{"type": "nope"}', None), (b"\x00", None),
    ('{"type": "condition", "cid": 4, "sent": "yesterday"}', 4),
    ('{"type": "condition", "cid": "4"}', None),
])
def test_a_malformed_message_is_a_fault_naming_the_condition_where_it_can(raw, cid):
    for connection in (_connection(), _in_session()):
        (fault,) = connection.receive(raw, 1.0, 101.0)
        assert isinstance(fault, Fault) and fault.cid == cid and fault.error
        assert connection.phase in (Phase.GREETING, Phase.SESSION)


def test_every_message_and_phase_is_either_a_transition_or_a_named_error():
    viewer_messages = {message for _, message in TRANSITIONS} | {m for _, m in MISPLACED}
    for phase in (Phase.GREETING, Phase.SESSION):
        for message in viewer_messages:
            assert ((phase, message) in TRANSITIONS) != ((phase, message) in MISPLACED)


EVENTS = st.lists(st.tuples(
    st.sampled_from(["hello", "probe", "shape", "condition", "bye", "junk", "timeout",
                     "opened", "open_failed", "full"]),
    st.floats(0.0, 2.0)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_conditions_reach_a_session_only_after_it_opened(events):
    """Whatever the viewer sends and the server answers, in any order: a condition or a bye
    is forwarded only in a session the server opened, one Open is outstanding at a time,
    and a closed connection stays closed."""
    raws = {"hello": HELLO, "probe": PROBE, "shape": SHAPE, "condition": CONDITION,
            "bye": BYE, "junk": "{"}
    connection, now, opened, outstanding = _connection(), 0.0, False, False
    for kind, dt in events:
        now += dt
        before = connection.phase
        if kind in raws:
            if before in (Phase.OPENING, Phase.CLOSED):
                with pytest.raises(RuntimeError):
                    connection.receive(raws[kind], now, now)
                continue
            actions = connection.receive(raws[kind], now, now)
        elif kind == "timeout":
            actions = connection.timed_out() if now >= connection.hello_deadline else []
        elif before is not Phase.OPENING:
            with pytest.raises(RuntimeError):
                {"opened": connection.opened, "open_failed": connection.open_failed,
                 "full": lambda: connection.refused("full")}[kind]()
            continue
        elif kind == "opened":
            connection.opened()
            opened, outstanding, actions = True, False, []
        elif kind == "open_failed":
            connection.open_failed()
            outstanding, actions = False, []
        else:
            actions = connection.refused("full")
            outstanding = False
        for action in actions:
            if isinstance(action, Forward | StopSession):
                assert opened and connection.phase is Phase.SESSION
            if isinstance(action, Open):
                assert not outstanding and not opened
                outstanding = True
            if isinstance(action, Refuse):
                assert connection.phase is Phase.CLOSED
        if before is Phase.CLOSED:
            assert connection.phase is Phase.CLOSED


def test_outflow_tells_a_lagging_viewer_once_then_drops_it_after_its_grace():
    outflow = Outflow(max_bytes=1000, max_frames=100, lag_grace=2.0)
    assert outflow.offer(600, True, 0.0, in_session=True).queue
    behind = outflow.offer(600, True, 0.5, in_session=True)
    assert behind.queue and not behind.drop
    assert behind.notice is not None and "lagging: 600 bytes queued" in behind.notice
    assert outflow.bytes == 1200 + len(behind.notice) and outflow.items == 3
    again = outflow.offer(10, True, 1.0, in_session=True)  # within the grace: no 2nd notice
    assert again.queue and again.notice is None and not again.drop
    late = outflow.offer(10, True, 2.6, in_session=True)
    assert late.drop and not late.queue  # no more frames once dropped
    assert not outflow.offer(10, True, 2.7, in_session=True).drop  # dropped once
    end = outflow.offer(50, False, 2.8, in_session=True)
    assert end.queue and not end.drop  # the small texts (its end) still go


def test_outflow_drops_at_twice_its_bound_at_once_and_forgets_a_lag_it_caught_up():
    outflow = Outflow(max_bytes=1000, max_frames=100, lag_grace=30.0)
    first = outflow.offer(1500, True, 0.0, in_session=True)
    assert first.notice is not None and first.queue and not first.drop
    assert outflow.offer(900, True, 0.1, in_session=True).drop  # past 2000 bytes
    calm = Outflow(max_bytes=1000, max_frames=100, lag_grace=1.0)
    calm.offer(900, True, 0.0, in_session=True)
    assert calm.offer(200, True, 0.1, in_session=True).notice is not None
    for size in (900, 200):
        calm.sent(size)
    assert calm.lagging_since == 0.1
    assert calm.offer(10, True, 0.2, in_session=True).notice is None  # back under: forgotten
    assert calm.lagging_since is None
    late = calm.offer(1200, True, 5.0, in_session=True)  # behind again: a new grace
    assert late.notice is not None and not late.drop


def test_outflow_before_hello_queues_without_bounds_to_lag_by():
    outflow = Outflow(max_bytes=100, max_frames=2, lag_grace=0.0)
    for i in range(5):  # probe replies of a viewer with no session: nothing to drop
        offer = outflow.offer(80, False, float(i), in_session=False)
        assert offer.queue and offer.notice is None and not offer.drop
    assert outflow.items == 5 and outflow.bytes == 400
