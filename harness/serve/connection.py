"""One viewer connection's protocol as pure state machines: no sockets, threads or clocks.

As h11 writes HTTP/1.1 and :mod:`latsim.controller` writes the timing model, the server's
async code (:mod:`harness.serve.server`) only pumps bytes through these machines and carries
out what they answer:

- :class:`Connection`, the inbound side: *greeting* (connected, no ``hello`` yet) → *opening*
  (``hello`` accepted; the server builds the session) → *session* → *closed*. A transition
  table (:data:`TRANSITIONS`) says what each message does in each phase; every message it
  does not list is a protocol error, answered with ``error`` and otherwise ignored. The hello
  timeout and the clock-probe rate limit live here.
- :class:`Outflow`, the outbound side: what one connection has queued to send, and the
  lagging viewer's notice and drop.

Each takes the time as an argument (``perf_counter`` seconds on the server), so tests drive
them without a server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from harness.net.netclock import Shaper
from harness.net.wire import (
    FROM_CLIENT,
    Bye,
    Condition,
    Error,
    Hello,
    Message,
    Probe,
    ProbeReply,
    ProtocolError,
    Shape,
    parse_message,
    parse_text,
)
from harness.serve.bucket import TokenBucket
from latsim.errors import LatsimError


class Phase(Enum):
    GREETING = "greeting"  # connected; nothing but probes and shape until hello
    OPENING = "opening"  # hello accepted; the server is building the session
    SESSION = "session"
    CLOSED = "closed"  # refused, timed out or ended: nothing more is read


# ---------------------------------------------------------------- what the server must do


@dataclass(frozen=True)
class Reply:
    """Send ``text`` to the viewer (in order, behind what was queued before it)."""

    text: str


@dataclass(frozen=True)
class Refuse:
    """Send an ``error`` with ``reason``, close with ``code`` (1008: a policy broken; 1013:
    try again later); the connection is over."""

    reason: str
    code: int


@dataclass(frozen=True)
class Open:
    """Admit and build the session ``hello`` asks for, then call :meth:`Connection.opened`
    (or :meth:`Connection.refused` where the server is full)."""

    hello: Hello


@dataclass(frozen=True)
class Forward:
    """Hand the condition to the session; its answer (``ack`` or ``error``) goes back."""

    condition: Condition


@dataclass(frozen=True)
class Reshape:
    """Shape what the server sends from now on (delay, jitter, loss, with its own seed)."""

    shaper: Shaper
    seed: int


@dataclass(frozen=True)
class StopSession:
    """End the session early (the viewer said ``bye``)."""

    reason: str


@dataclass(frozen=True)
class Fault:
    """A malformed or misplaced message: answer ``error`` (naming the refused condition's
    number where it was one), count it and log it; the connection goes on."""

    error: str
    cid: int | None


Action = Reply | Refuse | Open | Forward | Reshape | StopSession | Fault


# ---------------------------------------------------------------- the inbound side


class Connection:
    """The inbound protocol of one connection (see the module's docstring).

    ``now`` arguments are ``perf_counter`` seconds; ``server_now`` is the server's clock
    (``now`` plus its offset), which probe replies carry."""

    def __init__(self, now: float, hello_timeout: float, max_probe_rate: float,
                 clock_offset: float = 0.0, address_probes: TokenBucket | None = None
                 ) -> None:
        self.phase = Phase.GREETING
        self.hello_deadline = now + hello_timeout
        self._hello_timeout = hello_timeout
        self._probe_rate = max_probe_rate
        self._probes = TokenBucket(max_probe_rate, max_probe_rate, now)
        # the bucket of every connection from this one's client address: a client that
        # reconnects, or opens many connections, does not get a fresh rate with each
        self._address_probes = address_probes
        self._clock_offset = clock_offset

    def receive(self, raw: str | bytes, now: float, server_now: float) -> list[Action]:
        """What to do with one message from the viewer, received at ``now``."""
        if self.phase in (Phase.OPENING, Phase.CLOSED):
            raise RuntimeError(f"a message received while the connection is {self.phase.value}")
        try:
            message = parse_message(raw, FROM_CLIENT)
        except ProtocolError as exc:
            return [Fault(str(exc), _refused_cid(raw))]
        handler = TRANSITIONS.get((self.phase, type(message)))
        if handler is None:
            return [Fault(MISPLACED[self.phase, type(message)],
                          message.cid if isinstance(message, Condition) else None)]
        return handler(self, message, now, server_now)

    def timed_out(self) -> list[Action]:
        """The hello deadline passed in *greeting*."""
        if self.phase is not Phase.GREETING:
            return []
        self.phase = Phase.CLOSED
        return [Refuse(f"no hello within {self._hello_timeout:g} s", 1008)]

    def evicted(self, reason: str) -> list[Action]:
        """Another address's connection took this one's place before hello
        (:mod:`harness.serve.admission`): try again later."""
        self._expect(Phase.GREETING)
        self.phase = Phase.CLOSED
        return [Refuse(reason, 1013)]

    def opened(self) -> None:
        """The server built the session :class:`Open` asked for."""
        self._expect(Phase.OPENING)
        self.phase = Phase.SESSION

    def open_failed(self) -> None:
        """The hello was refused as given (answered with ``error``): wait for another."""
        self._expect(Phase.OPENING)
        self.phase = Phase.GREETING

    def refused(self, reason: str) -> list[Action]:
        """The server could not admit the session (it is full)."""
        self._expect(Phase.OPENING)
        self.phase = Phase.CLOSED
        return [Refuse(reason, 1013)]

    def close(self) -> None:
        """The connection ended (either side)."""
        self.phase = Phase.CLOSED

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"the connection is {self.phase.value}, not {phase.value}")

    # the transitions: (phase, message) -> actions

    def _probe(self, message: Probe, now: float, server_now: float) -> list[Action]:
        if not self._probes.take(now):
            self.phase = Phase.CLOSED
            return [Refuse(f"clock probes faster than {self._probe_rate:g} per s", 1008)]
        shared = self._address_probes
        if shared is not None and not shared.take(now):
            self.phase = Phase.CLOSED
            return [Refuse(f"clock probes from this address faster than {shared.rate:g} "
                           "per s", 1008)]
        return [Reply(ProbeReply(message.t0, now + self._clock_offset, server_now).to_json())]

    def _hello(self, message: Hello, now: float, server_now: float) -> list[Action]:
        self.phase = Phase.OPENING
        return [Open(message)]

    def _shape(self, message: Shape, now: float, server_now: float) -> list[Action]:
        try:
            shaper = Shaper(message.delay, message.jitter, message.loss)
        except LatsimError as exc:  # jitter beyond the delay
            return [Fault(str(exc), None)]
        return [Reshape(shaper, message.seed)]

    def _condition(self, message: Condition, now: float, server_now: float) -> list[Action]:
        return [Forward(message)]

    def _bye(self, message: Bye, now: float, server_now: float) -> list[Action]:
        return [StopSession("the viewer said bye")]

    def _ignore(self, message: Message, now: float, server_now: float) -> list[Action]:
        return []


Transition = Callable[[Connection, Message, float, float], list[Action]]

#: What each message does in each phase in which it is allowed.
TRANSITIONS: dict[tuple[Phase, type[Message]], Transition] = {
    (Phase.GREETING, Probe): Connection._probe,
    (Phase.GREETING, Shape): Connection._shape,
    (Phase.GREETING, Hello): Connection._hello,
    (Phase.GREETING, Bye): Connection._ignore,  # nothing to end yet
    (Phase.SESSION, Probe): Connection._probe,
    (Phase.SESSION, Condition): Connection._condition,
    (Phase.SESSION, Bye): Connection._bye,
}  # type: ignore[dict-item]

#: The error a message gets in a phase that does not allow it.
MISPLACED: dict[tuple[Phase, type[Message]], str] = {
    (Phase.GREETING, Condition): "condition before hello: no session",
    (Phase.SESSION, Hello): "this connection already has a session",
    (Phase.SESSION, Shape): "shape the connection before hello",
}


def _refused_cid(raw: str | bytes) -> int | None:
    """The ``cid`` of a condition the parser refused, where one can be read."""
    try:
        data = parse_text(raw)
    except ProtocolError:
        return None
    cid = data.get("cid")
    return cid if data.get("type") == "condition" and type(cid) is int else None


# ---------------------------------------------------------------- the outbound side


@dataclass(frozen=True)
class Offer:
    """What to do with one message offered to a connection's outbox.

    ``notice``: a lagging notice to queue ahead of the backlog first (the viewer just fell
    behind); ``drop``: end the session and close the connection (the viewer stayed behind
    past its grace, or fell twice as far); ``queue``: whether to queue the message (frames
    are not once the viewer is dropped; texts such as its ``end`` still are)."""

    queue: bool
    notice: str | None = None
    drop: bool = False


class Outflow:
    """The bytes and messages one connection has queued, within its bounds.

    Past ``max_bytes`` or ``max_frames`` a viewer with a session is told it is lagging;
    still past them ``lag_grace`` seconds later, or past twice them at any time, it is
    dropped, once: its session ends and nothing more is queued but the small texts. The
    server's memory stays bounded whatever the viewer reads."""

    def __init__(self, max_bytes: int, max_frames: int, lag_grace: float) -> None:
        self.max_bytes = max_bytes
        self.max_frames = max_frames
        self.lag_grace = lag_grace
        self.bytes = 0  # queued, not yet sent
        self.items = 0
        self.lagging_since: float | None = None
        self.dropped = False

    def offer(self, size: int, is_frame: bool, now: float, in_session: bool) -> Offer:
        """Decide on a message of ``size`` bytes; a queued one (and its notice) counts until
        :meth:`sent`."""
        over = (self.bytes + size > self.max_bytes or self.items + 1 > self.max_frames)
        notice, drop = None, False
        if over and in_session:
            if self.lagging_since is None:
                self.lagging_since = now
                notice = Error(f"lagging: {self.bytes} bytes queued; the session ends if it "
                               f"stays behind {self.lag_grace:g} s").to_json()
                self.bytes += len(notice)
                self.items += 1
            hard = (self.bytes + size > 2 * self.max_bytes
                    or self.items + 1 > 2 * self.max_frames)
            if hard or now - self.lagging_since > self.lag_grace:
                drop = not self.dropped
                self.dropped = True
                if is_frame:
                    return Offer(False, notice, drop)
        elif not over:
            self.lagging_since = None
        self.bytes += size
        self.items += 1
        return Offer(True, notice, drop)

    def sent(self, size: int) -> None:
        """A queued message of ``size`` bytes left the queue."""
        self.bytes -= size
        self.items -= 1
