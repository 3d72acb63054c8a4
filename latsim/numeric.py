"""Float arithmetic that gives the same answer on every Python, and always ends.

:func:`total`: sums that give the same float on every Python.

Python 3.12 made ``sum()`` of floats compensated (Neumaier), so one summary summed with it
differs in its last bits between 3.11 and 3.12+. latsim's summaries add their floats one
by one, left to right, as 3.11's ``sum()`` does, so that a result is the same on every
Python the simulator runs on (and a tally kept as a run goes equals the sum of the kept
records).

:func:`least_true`: the bisection every closed form and budget inverts with, which stops
at its tolerance or where no float lies between its bounds, whichever comes first (at
thousands of seconds floats are coarser than a picosecond: an absolute tolerance alone
never ends there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["least_true", "total"]

_N = TypeVar("_N", int, float)


def total(values: Iterable[_N]) -> _N | int:
    """``values`` added one by one from 0, left to right (ints stay ints)."""
    result: int | float = 0
    for value in values:
        result += value
    return result


def least_true(holds: Callable[[float], bool], low: float, high: float,
               tolerance: float) -> float:
    """The least ``x`` in (``low``, ``high``] at which the monotone ``holds`` is true (it
    is false at ``low`` and true at ``high``), to within ``tolerance`` or the floats'
    spacing there: bisection, returning its upper bound."""
    while high - low > tolerance:
        middle = (low + high) / 2
        if not low < middle < high:
            break  # adjacent floats: nothing left to halve
        if holds(middle):
            high = middle
        else:
            low = middle
    return high
