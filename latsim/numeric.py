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

:func:`empirical_quantile`: the one place a quantile of a sample is taken (latencies,
costs, gaps, lateness), under one of two named rules: :data:`INTERPOLATED` for a
statistic reported of a sample, :data:`OBSERVED` where the answer must be a value that
occurred (a lead set from measured job times: a time some job actually took).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["INTERPOLATED", "OBSERVED", "empirical_quantile", "least_true", "total"]

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


#: Linear interpolation between the two order statistics around rank ``(n - 1) × level``
#: (Hyndman and Fan's type 7, numpy's default ``method="linear"``): every reported
#: percentile (L50/L95/L99, time to first chunk, cost and gap p95/p99).
INTERPOLATED = "linear"
#: The order statistic at rank ``ceil((n - 1) × level)`` (numpy's ``method="higher"``):
#: an observed value, never below :data:`INTERPOLATED`'s. Leads and cost-model quantiles,
#: which the controller plans with.
OBSERVED = "higher"


def empirical_quantile(values: Iterable[float], level: float,
                       rule: str = INTERPOLATED) -> float:
    """The ``level`` quantile (0 to 1) of the sample ``values`` under ``rule``
    (:data:`INTERPOLATED` or :data:`OBSERVED`). A percentile ``p`` is ``level = p / 100``
    (the same float numpy's ``percentile`` divides to). Raises ``ValueError`` for an empty
    sample: a caller says what an empty one reports."""
    import numpy as np

    if rule not in (INTERPOLATED, OBSERVED):
        raise ValueError(f"unknown quantile rule {rule!r}")
    data = np.asarray(values if isinstance(values, np.ndarray) else list(values),
                      dtype=float)
    if not data.size:
        raise ValueError("the quantile of an empty sample")
    return float(np.quantile(data, level, method=rule))
