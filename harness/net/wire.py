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
import math
import struct
from typing import Any

MAGIC = b"LSF1"
_LEN = struct.Struct(">I")
#: Largest header of a slot frame, and largest text message accepted (bytes).
MAX_HEADER = 1 << 20
MAX_TEXT = 1 << 16


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
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError("a message must be a JSON object with a string 'type'")
    return data


def number(message: dict[str, Any], key: str, low: float, high: float,
           default: float | None = None) -> float:
    """``message[key]`` as a finite number in ``[low, high]`` (``default`` where absent)."""
    value = message.get(key, default)
    if value is None and default is None and key not in message:
        raise ProtocolError(f"'{message['type']}' needs '{key}'")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProtocolError(f"'{key}' must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise ProtocolError(f"'{key}' must be in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def integer(message: dict[str, Any], key: str, low: int, high: int,
            default: int | None = None) -> int:
    """``message[key]`` as an integer in ``[low, high]`` (``default`` where absent)."""
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"'{message['type']}' needs an integer '{key}', got {value!r}")
    if not low <= value <= high:
        raise ProtocolError(f"'{key}' must be in [{low}, {high}], got {value}")
    return value
