"""The spec mini-language's one reader: ``KIND:ARGS`` texts (cost models, update sources,
session arrivals, workloads) split into their kind and body, their numbers read, and the
text quoted in messages.

Every prefix reads its numbers here, so all take the same ones: ASCII only (``float()``
reads other scripts' digits, ``"١"`` as 1.0, and ``int()`` too), finite, surrounding
spaces ignored, Python's float syntax otherwise (``1e-3``, ``.5``, ``1_000``; not
``0x10``). A whole number is ASCII digits alone. What a number means (seconds, a rate, a
count) and its range stay with the prefix that reads it; plug-ins read theirs here too
(docs/extending.md).
"""

from __future__ import annotations

import math

from latsim.errors import LatsimError, short

__all__ = ["is_number", "number", "numbers", "short", "split", "whole"]


def split(what: str, spec: object, example: str) -> tuple[str, str]:
    """``(kind, body)`` of ``KIND:ARGS``; ``what`` names the spec in messages ("cost
    spec"), ``example`` shows the form."""
    if not isinstance(spec, str):
        raise LatsimError(f"{what} must be text like {example}, got {short(spec)}")
    kind, sep, body = spec.partition(":")
    if not sep:
        raise LatsimError(f"{what} {short(spec)} needs the form KIND:ARGS, e.g. {example}")
    return kind, body


def number(what: str, spec: str, text: str) -> float:
    """One finite number of ``spec``, written with ASCII characters."""
    text = text.strip()
    if not text.isascii():
        raise LatsimError(f"{what} {short(spec)}: {short(text)} is not a number "
                          "(write it with ASCII digits)")
    try:
        value = float(text)
    except ValueError:
        raise LatsimError(f"{what} {short(spec)}: {short(text)} is not a number") from None
    if not math.isfinite(value):
        raise LatsimError(f"{what} {short(spec)}: {short(text)} is not a finite number")
    return value


def whole(what: str, spec: str, text: str) -> int:
    """One whole number of ``spec``: ASCII digits only (no sign, point or exponent)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise LatsimError(f"{what} {short(spec)}: {short(text)} is not a whole number")
    return int(text)


def numbers(what: str, spec: str, body: str, count: int, names: str = "") -> list[float]:
    """``count`` comma-separated numbers of ``spec`` (:func:`number` each); ``names``
    (``"UNIT,CV,TAU"``) says which in the message when the count is off."""
    parts = body.split(",")
    if len(parts) != count or not all(p.strip() for p in parts):
        raise LatsimError(f"{what} {short(spec)} needs {names + ': ' if names else ''}"
                          f"{count} comma-separated number(s)")
    return [number(what, spec, part) for part in parts]


def is_number(text: str) -> bool:
    """Whether ``text`` is written as a number (a table's header is not); infinite and NaN
    count, for :func:`number` to refuse with its reason."""
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().isascii()
