"""Latency statistics, computed in one place for every summary: simulate, sweep, serving,
fleet, measure, serve, client and compare.

- **The set.** The mean, its standard error and the 50th, 95th and 99th percentiles
  (:data:`LEVELS`), under one prefix: ``L_mean``, ``L_mean_se``, ``L50``, ``L95``, ``L99``,
  and each percentile's 95% confidence interval, ``L50_lo``/``L50_hi`` and so on
  (:mod:`latsim.analysis.intervals`).
- **Pooling.** Over replications the shown conditions are pooled, and the percentiles are
  those of the pooled sample (a replication's own percentile is not averaged): a run of n
  replications then reports what one run n times as long would. ``L_mean_se`` is
  ``s/√n`` over the pooled conditions (conditions of one run are close to independent
  where they are further apart than a chunk; where a summary needs the spread between
  replications it says so, as the fleet's ``_se`` columns do). A percentile's interval
  is the order-statistic interval of the pooled sample, which takes its values as
  independent as ``L_mean_se`` does (:mod:`latsim.analysis.intervals`).
- **The basis** (``L_basis``): what L is measured between, which differs by driver and
  must be said beside the number (:data:`TIMELINE`, :data:`WALL`, :data:`VIEWER`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from latsim.analysis.intervals import percentile_intervals
from latsim.numeric import empirical_quantile

#: The percentiles every latency summary reports.
LEVELS = (50, 95, 99)

#: L_basis values. The controller's clock: a condition's arrival at the controller to the
#: start of the first slot of a version at least its own (simulated runs, a served
#: session's server side, a measured run's ``*_timeline`` columns).
TIMELINE = "controller timeline"
#: The wall clock of a measured run: arrival at the controller to the frame shown.
WALL = "wall clock"
#: A viewer's: the client's send to the client's display (uplink, queueing, generation,
#: delivery and playout delay; a served session, a client run, a fleet).
VIEWER = "viewer"


def percentile(values: Sequence[float] | np.ndarray, level: float) -> float | None:
    """The ``level`` percentile (0 to 100) of ``values`` under
    :data:`latsim.numeric.INTERPOLATED` (:func:`latsim.numeric.empirical_quantile`); None
    if there are none."""
    data = np.asarray(values, dtype=float)
    return empirical_quantile(data, level / 100) if data.size else None


def latency_stats(values: Sequence[float] | np.ndarray, prefix: str = "L"
                  ) -> dict[str, float | None]:
    """``{prefix}_mean``, ``{prefix}_mean_se``, ``{prefix}50/95/99`` of ``values`` (a
    pooled sample, :func:`pooled`) and then each percentile's confidence interval,
    ``{prefix}{level}_lo``/``_hi`` (:func:`~latsim.analysis.intervals.percentile_intervals`);
    None where there are too few values."""
    data = np.asarray(values, dtype=float)
    mean = float(data.mean()) if data.size else None
    se = float(data.std(ddof=1) / math.sqrt(data.size)) if data.size > 1 else None
    bounds = percentile_intervals(data, LEVELS)
    return {f"{prefix}_mean": mean, f"{prefix}_mean_se": se,
            **{f"{prefix}{level}": percentile(data, level) for level in LEVELS},
            **{f"{prefix}{level}_{side}": bound
               for level, (lo, hi) in zip(LEVELS, bounds, strict=True)
               for side, bound in (("lo", lo), ("hi", hi))}}


def pooled(samples: Iterable[Sequence[float]]) -> list[float]:
    """The pooling rule across replications: every replication's values, in one sample."""
    return [value for sample in samples for value in sample]
