"""Sums that give the same float on every Python.

Python 3.12 made ``sum()`` of floats compensated (Neumaier), so one summary summed with it
differs in its last bits between 3.11 and 3.12+. latsim's summaries add their floats one
by one, left to right, as 3.11's ``sum()`` does, so that a result is the same on every
Python the simulator runs on (and a tally kept as a run goes equals the sum of the kept
records)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

__all__ = ["total"]

_N = TypeVar("_N", int, float)


def total(values: Iterable[_N]) -> _N | int:
    """``values`` added one by one from 0, left to right (ints stay ints)."""
    result: int | float = 0
    for value in values:
        result += value
    return result
