"""The wire protocol between ``latsim serve`` and ``latsim client`` (WebSocket messages).

Text messages are JSON objects with a ``type``; a played slot is one binary message: the
magic ``LSF1``, a 4-byte big-endian header length, the JSON header, then the slot's payload
(the latent or decoded pixels, as the header's ``payload``, ``shape`` and ``dtype`` say).

Client to server:

- ``probe``   ``{t0}``: a clock probe (client clock); answered at once.
- ``shape``   ``{delay, jitter, loss, seed}``: shape what the server sends on this
  connection from now on (before ``hello`` only; the probes before the session need it).
- ``hello``   ``{K, policy, duration, lead?, drain?, r?, fps?}``: start this connection's
  session.
- ``condition`` ``{cid, sent, session?}``: the viewer's condition number ``cid``, sent at
  client time ``sent``; ``session``, if given, must be this connection's.
- ``bye``: end the session now.

Server to client: ``probe`` ``{t0, t1, t2}``; ``ready`` ``{session, K, policy, T, delta,
lead, lead_source, duration, start, schedule, server_run, ...}`` (``start``: server time of
playback 0; ``server_run``: names this server run, shared by its sessions); ``ack``
``{cid, version, arrival}``; ``job`` ``{job_id, kind, branch, length, version, start,
ready, gen_start, gen_end}`` when a job finishes; binary ``slot`` frames ``{position,
version, job_id, played, sent, resolves}`` (``resolves``: the conditions this slot is the
first to show, each ``{version, arrival, start, ready}``); ``end`` ``{status,
stop_reason, summary}``; ``error`` ``{error, cid?}`` for a message the server could not
use (``cid``: the refused condition's number, where it was one).
Server times are on the server's clock (seconds).
"""

from __future__ import annotations

import json
import struct
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Self

from latsim.controller.policies import PRESETS
from latsim.errors import OPTION_BOUNDS, WIRE_BOUNDS, Bound, LatsimError, check_int, check_number

MAGIC = b"LSF1"
_LEN = struct.Struct(">I")
#: Largest header of a slot frame, and largest text message accepted (bytes).
MAX_HEADER = 1 << 20
MAX_TEXT = 1 << 16
#: Longest string field accepted in a viewer's message (characters); the server's own
#: messages (error texts, lead sources) are bounded by :data:`MAX_TEXT` alone.
MAX_STRING = 200


class ProtocolError(ValueError):
    """A message that does not follow the protocol (the server answers with ``error``)."""


def encode_frame(header: dict[str, Any], payload: bytes) -> bytes:
    """One binary slot frame."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + _LEN.pack(len(head)) + head + payload


def decode_frame(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload) of a binary slot frame."""
    if len(data) < 8 or data[:4] != MAGIC:
        raise ProtocolError("not a slot frame (bad magic)")
    (length,) = _LEN.unpack_from(data, 4)
    if length > MAX_HEADER or 8 + length > len(data):
        raise ProtocolError("slot frame header length out of range")
    try:
        header = json.loads(data[8:8 + length])
    except ValueError as exc:
        raise ProtocolError(f"slot frame header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("slot frame header is not an object")
    return header, data[8 + length:]


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def parse_text(message: str | bytes) -> dict[str, Any]:
    """A text message as an object with a string ``type``."""
    if isinstance(message, bytes):
        raise ProtocolError("binary messages are not accepted here; send JSON text")
    if len(message) > MAX_TEXT:
        raise ProtocolError(f"message longer than {MAX_TEXT} bytes")
    try:
        data = json.loads(message)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("JSON nested too deep") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError("a message must be a JSON object with a string 'type'")
    return data


# ---------------------------------------------------------------- typed messages


def _bound(name: str) -> Bound | None:
    """The range of field ``name``: its option's (``K`` is ``--K``), else the wire's own."""
    return WIRE_BOUNDS.get(name) or OPTION_BOUNDS.get("--" + name.replace("_", "-"))


def _value(kind: str, name: str, annotation: str, value: object,
           max_string: int | None) -> object:
    """``value`` of field ``name`` checked against its annotation and range."""
    optional = annotation.endswith("| None")
    base = annotation.removesuffix("| None").strip()
    if value is None:
        if optional:
            return None
        raise ProtocolError(f"'{kind}' needs '{name}'")
    if base in ("int", "float"):
        bound = _bound(name)
        try:
            if bound is not None:
                return bound.check(f"'{name}'", value)
            if base == "int":
                return check_int(f"'{name}'", value, -(2**63), 2**63 - 1)
            return check_number(f"'{name}'", value, -1e300, 1e300)
        except LatsimError as exc:
            raise ProtocolError(str(exc)) from None
    expected = {"str": str, "dict[str, Any]": dict, "list[dict[str, Any]]": list,
                "list[int]": list}[base]
    if not isinstance(value, expected):
        raise ProtocolError(f"'{name}' of '{kind}' must be a {expected.__name__}, got "
                            f"{type(value).__name__}")
    if base == "str" and max_string is not None and len(value) > max_string:  # type: ignore[arg-type]
        raise ProtocolError(f"'{name}' of '{kind}' is longer than {max_string} characters")
    return value


@dataclass(frozen=True)
class Message:
    """A text message of the protocol: its fields, checked on the way in."""

    TYPE: ClassVar[str] = ""
    MAX_STRING: ClassVar[int | None] = None  # a viewer's messages: :data:`MAX_STRING`

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.TYPE, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The message ``data`` holds (unknown keys are ignored); a one-line
        :class:`ProtocolError` for a missing field, a wrong type or a value out of range."""
        values = {}
        for f in fields(cls):
            given = data.get(f.name)
            if given is None and f.default is not MISSING:
                values[f.name] = f.default
                continue
            values[f.name] = _value(cls.TYPE, f.name, str(f.type), given, cls.MAX_STRING)
        return cls(**values)


# client -> server


@dataclass(frozen=True)
class _FromViewer(Message):
    MAX_STRING: ClassVar[int | None] = MAX_STRING


@dataclass(frozen=True)
class Probe(_FromViewer):
    TYPE: ClassVar[str] = "probe"
    t0: float  # client clock


@dataclass(frozen=True)
class Shape(_FromViewer):
    TYPE: ClassVar[str] = "shape"
    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class Hello(_FromViewer):
    TYPE: ClassVar[str] = "hello"
    K: int
    duration: float
    policy: str = "speculative"
    lead: float | None = None  # default: the server's for K
    drain: float | None = None
    r: int | None = None  # default: the server's generator's
    fps: float = 16.0

    def __post_init__(self) -> None:
        if self.policy not in PRESETS:
            raise ProtocolError(f"'policy' must be one of {', '.join(PRESETS)}, got "
                                f"{_shown(self.policy)}")


@dataclass(frozen=True)
class Condition(_FromViewer):
    TYPE: ClassVar[str] = "condition"
    cid: int
    sent: float | None = None  # client clock
    session: str | None = None  # must be this connection's, if given


@dataclass(frozen=True)
class Bye(_FromViewer):
    TYPE: ClassVar[str] = "bye"


# server -> client


@dataclass(frozen=True)
class ProbeReply(Message):
    TYPE: ClassVar[str] = "probe"
    t0: float  # the probe's client time
    t1: float  # server clock, received
    t2: float  # server clock, sent


@dataclass(frozen=True)
class Ready(Message):
    TYPE: ClassVar[str] = "ready"
    session: str
    K: int
    policy: str
    T: float
    delta: float
    r: int
    fps: float
    lead: float
    lead_source: str
    duration: float
    start: float  # server time of stream time 0
    schedule: str
    server_run: str  # shared by the sessions of one server run
    generator: dict[str, Any]
    downlink: dict[str, Any]
    #: when a job that waited for the device takes its condition (BIND_MODES); a server
    #: that does not say bound it at enqueue, as latsim's did before it said
    bind: str = "enqueue"


@dataclass(frozen=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    cid: int
    version: int
    arrival: float  # server clock


@dataclass(frozen=True)
class JobDone(Message):
    TYPE: ClassVar[str] = "job"
    job_id: int
    kind: str
    branch: int
    length: int
    version: int
    start: float  # server clock
    ready: float
    gen_start: float | None = None  # the generator's own timing, where it ran
    gen_end: float | None = None


@dataclass(frozen=True)
class End(Message):
    TYPE: ClassVar[str] = "end"
    status: str
    stop_reason: str | None = None
    summary: dict[str, Any] | None = None
    end: float | None = None  # server time the session's driver stopped


@dataclass(frozen=True)
class Error(Message):
    TYPE: ClassVar[str] = "error"
    error: str
    cid: int | None = None  # the refused condition's number, where it was one


@dataclass(frozen=True)
class SlotHeader(Message):
    """The JSON header of a binary slot frame."""

    TYPE: ClassVar[str] = "slot"
    position: int
    version: int
    job_id: int
    played: float  # server clock
    sent: float
    resolves: list[dict[str, Any]]  # each {version, arrival, start, ready}
    payload: str  # pixels, latent or none
    shape: list[int]
    dtype: str


#: The messages each side accepts, by type.
FROM_CLIENT: dict[str, type[Message]] = {m.TYPE: m for m in (Probe, Shape, Hello, Condition, Bye)}
FROM_SERVER: dict[str, type[Message]] = {m.TYPE: m for m in (ProbeReply, Ready, Ack, JobDone,
                                                                End, Error)}


def parse_message(raw: str | bytes, accepted: dict[str, type[Message]]) -> Message:
    """A text message as one of ``accepted`` (:data:`FROM_CLIENT` or :data:`FROM_SERVER`)."""
    data = parse_text(raw)
    kind = accepted.get(data["type"])
    if kind is None:
        raise ProtocolError(f"unknown message type {_shown(data['type'])}")
    return kind.from_dict(data)


def encode_slot(header: SlotHeader, payload: bytes) -> bytes:
    return encode_frame(header.to_dict(), payload)


def decode_slot(data: bytes) -> tuple[SlotHeader, bytes]:
    header, payload = decode_frame(data)
    return SlotHeader.from_dict(header), payload


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
