"""Latency statistics, computed in one place for every summary: simulate, sweep, serving,
fleet, measure, serve, client and compare.

- **The set.** The mean, its standard error and the 50th, 95th and 99th percentiles
  (:data:`LEVELS`), under one prefix: ``L_mean``, ``L_mean_se``, ``L50``, ``L95``, ``L99``.
- **Pooling.** Over replications the shown conditions are pooled, and the percentiles are
  those of the pooled sample (a replication's own percentile is not averaged): a run of n
  replications then reports what one run n times as long would. ``L_mean_se`` is
  ``s/√n`` over the pooled conditions (conditions of one run are close to independent
  where they are further apart than a chunk; where a summary needs the spread between
  replications it says so, as the fleet's ``_se`` columns do). A pooled percentile's own
  standard error is the jackknife over replications (:func:`replication_percentile_se`);
  one sample's, the bootstrap (:func:`bootstrap_percentile_se`); an empirical CDF's band,
  Dvoretzky–Kiefer–Wolfowitz's (:func:`dkw_band`).
- **The basis** (``L_basis``): what L is measured between, which differs by driver and
  must be said beside the number (:data:`TIMELINE`, :data:`WALL`, :data:`VIEWER`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

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
    """``{prefix}_mean``, ``{prefix}_mean_se`` and ``{prefix}50/95/99`` of ``values`` (a
    pooled sample, :func:`pooled`); None where there are too few values."""
    data = np.asarray(values, dtype=float)
    mean = float(data.mean()) if data.size else None
    se = float(data.std(ddof=1) / math.sqrt(data.size)) if data.size > 1 else None
    return {f"{prefix}_mean": mean, f"{prefix}_mean_se": se,
            **{f"{prefix}{level}": percentile(data, level) for level in LEVELS}}


def pooled(samples: Iterable[Sequence[float]]) -> list[float]:
    """The pooling rule across replications: every replication's values, in one sample."""
    return [value for sample in samples for value in sample]


def replication_percentile_se(samples: Sequence[Sequence[float]], level: float
                              ) -> float | None:
    """Jackknife standard error over replications of the pooled ``level`` percentile:
    each replication's values (``samples``, one sequence each) left out in turn. None
    with fewer than two replications, or where leaving one out leaves no value."""
    groups = [np.asarray(sample, dtype=float) for sample in samples]
    if len(groups) < 2 or not any(group.size for group in groups):
        return None
    leave_one_out = []
    for index in range(len(groups)):
        rest = [group for i, group in enumerate(groups) if i != index]
        kept = np.concatenate(rest) if rest else np.array([])
        if not kept.size:
            return None
        leave_one_out.append(empirical_quantile(kept, level / 100))
    n = len(groups)
    values = np.array(leave_one_out)
    return float(math.sqrt((n - 1) / n * np.sum((values - values.mean()) ** 2)))


def bootstrap_percentile_se(values: Sequence[float] | np.ndarray, level: float,
                            resamples: int = 400, seed: int = 0) -> float:
    """The bootstrap standard error of the ``level`` percentile of ``values`` (one sample,
    resampled ``resamples`` times with a fixed ``seed``: the same figure every time); 0
    with fewer than two values."""
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    draws = np.array([empirical_quantile(resample, level / 100)
                      for resample in rng.choice(data, size=(resamples, data.size))])
    return float(draws.std(ddof=1))


def dkw_band(n: int, confidence: float = 0.95) -> float:
    """The half-width of the Dvoretzky–Kiefer–Wolfowitz confidence band of an empirical CDF
    of ``n`` values: sup |F_n − F| <= ε with probability ``confidence``,
    ε = sqrt(ln(2 / (1 − confidence)) / (2n))."""
    return math.sqrt(math.log(2 / (1 - confidence)) / (2 * n))
