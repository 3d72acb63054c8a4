"""Confidence intervals for the figures a summary reports, computed in one place (scipy).

- **A latency percentile** (``L95_lo``/``L95_hi`` beside ``L95``, and every other
  ``{prefix}{level}`` of :func:`latsim.analysis.latency.latency_stats`):
  :func:`percentile_intervals`, the distribution-free order-statistic interval. Of ``n``
  values sorted, ``[x(l), x(u)]`` covers the true ``p`` quantile with probability
  ``B(u − 1) − B(l − 1)``, ``B`` the Binomial(n, p) CDF (the count of values below the
  quantile); ``l`` and ``u`` are the binomial's ``α/2`` and ``1 − α/2`` quantiles
  (``scipy.stats.binom``'s, computed from ``scipy.special``), so each side misses with
  probability at most ``α/2``. No resampling, exact for any continuous distribution,
  conservative with ties. Where the sample is too small to bound a side (``l < 1`` or
  ``u > n``), that side is None.
  Replications are pooled as their percentile is (:func:`latsim.analysis.latency.pooled`:
  one sample of every replication's values), and the interval takes the pooled values as
  independent draws, as ``L_mean_se`` does: conditions of one run that wait in the same
  queue are correlated, so near saturation, or where streams share devices, it is too
  narrow, and the spread between replications (a fleet's ``_se``, capacity's bootstrap)
  is the measure of the run-to-run noise.
- **Stall %** (``stall_pct_lo``/``stall_pct_hi``): :func:`stall_interval`, a Student t
  interval over replications (``scipy.stats.t``, n − 1 degrees of freedom) around the
  pooled stall % (stalled seconds over window seconds, pooled), with the jackknife
  standard error of that ratio over replications (:func:`paired_jackknife_se`; ``s/√n``
  of the replications' own stall % where their windows are equal), clipped to
  ``[0, 100]``. With one replication there is no spread to measure, and both ends are
  None (one window's stalls are too few and too clustered for a within-run interval).
- **An empirical CDF's band**: :func:`cdf_band`, the exact simultaneous band of the
  Kolmogorov–Smirnov statistic (``scipy.stats.kstwo``).

The level is :data:`CONFIDENCE`. scipy is imported inside the functions (``latsim --help``
does not load it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from latsim.numeric import empirical_quantile

#: The confidence level of every interval a summary reports.
CONFIDENCE = 0.95

Interval = tuple[float | None, float | None]


def percentile_ranks(n: int, levels: Sequence[float], confidence: float = CONFIDENCE
                     ) -> list[tuple[int, int]]:
    """For each ``level`` percentile (0 to 100) of ``n`` values, the 1-based ranks
    ``(l, u)`` of the order statistics that bound it with ``confidence``: ``l`` the
    Binomial(n, p) ``α/2`` quantile, ``u`` one more than its ``1 − α/2`` quantile. ``l``
    may be 0 and ``u`` ``n + 1``: no order statistic bounds that side."""
    alpha = 1 - confidence
    p = np.asarray(levels, dtype=float) / 100
    low = binomial_quantile(alpha / 2, n, p)
    high = binomial_quantile(1 - alpha / 2, n, p)
    return [(int(a), int(b) + 1) for a, b in zip(low, high, strict=True)]


def binomial_quantile(q: float, n: int, p: np.ndarray) -> np.ndarray:
    """``scipy.stats.binom.ppf(q, n, p)`` for ``0 < q < 1``: the smallest ``k`` whose
    Binomial(n, p) CDF reaches ``q``, as scipy up to 1.11 computed it (the continuous
    inverse ``bdtrik`` rounded up, stepped down one where ``bdtr`` allows; Binomial(n, 0) is
    0). tests/test_intervals.py holds it equal to ``binom.ppf`` at the tails an interval
    uses. ``scipy.stats`` costs a process about 0.9 s of CPU to import, ``scipy.special``
    0.4, and every summary reaches this."""
    from scipy.special import bdtr, bdtrik

    with np.errstate(invalid="ignore"):
        above = np.ceil(bdtrik(q, n, p))
    below = np.maximum(above - 1, 0)
    return np.where(p == 0, 0.0, np.where(bdtr(below, n, p) >= q, below, above))


def percentile_intervals(values: Sequence[float] | np.ndarray, levels: Sequence[float],
                         confidence: float = CONFIDENCE) -> list[Interval]:
    """The order-statistic interval (module docstring) of each ``level`` percentile of
    ``values``: ``(lo, hi)``, a side None where the sample is too small to bound it, both
    None for an empty sample."""
    data = np.sort(np.asarray(values, dtype=float))
    n = data.size
    if not n:
        return [(None, None) for _ in levels]
    return [(float(data[low - 1]) if low >= 1 else None,
             float(data[high - 1]) if high <= n else None)
            for low, high in percentile_ranks(n, levels, confidence)]


def paired_jackknife_se(
    per_run_components: np.ndarray, statistic: Callable[[np.ndarray], float]
) -> float | None:
    """Jackknife standard error of ``statistic(column totals)`` over replications.

    ``per_run_components`` has one row per replication and one column per additive
    component (e.g. the sum of L and the count of conditions of each policy); ``statistic``
    maps a vector of column totals to a number (a pooled mean, a ratio, a difference of
    pooled means). Leaving a whole row out keeps whatever the columns share within a
    replication, such as two policies run on the same arrivals: the SE of a paired
    difference then reflects their covariance instead of treating them as independent.
    For a plain mean (components ``[x_i, 1]``, statistic ``t[0] / t[1]``) it equals
    ``s / sqrt(n)``. ``None`` with fewer than two rows, or where a leave-one-out statistic
    is not finite (say, a zero denominator).
    """
    components = np.asarray(per_run_components, dtype=float)
    n = components.shape[0]
    if n < 2:
        return None
    totals = np.array([column.sum() for column in components.T])
    leave_one_out = np.array([statistic(totals - row) for row in components], dtype=float)
    if not np.all(np.isfinite(leave_one_out)):
        return None
    return math.sqrt((n - 1) / n * float(np.sum((leave_one_out - leave_one_out.mean()) ** 2)))


def t_interval(estimate: float | None, se: float | None, n: int,
               confidence: float = CONFIDENCE, bounds: tuple[float, float] = (0.0, 100.0)
               ) -> Interval:
    """``estimate ± t(1 − α/2, n − 1) × se``, clipped to ``bounds`` (where the quantity
    lies: a percentage by default); ``(None, None)`` without an estimate or a standard
    error, or with fewer than two replications."""
    if estimate is None or se is None or n < 2:
        return None, None
    from scipy.special import stdtrit  # scipy.stats.t.ppf's own function, lighter to import

    half = float(stdtrit(n - 1, 1 - (1 - confidence) / 2)) * se
    return max(bounds[0], estimate - half), min(bounds[1], estimate + half)


def _percent(totals: np.ndarray) -> float:
    return 100.0 * float(totals[0] / totals[1]) if totals[1] > 0 else math.nan


def stall_interval(stalled: Sequence[float], windows: Sequence[float],
                   confidence: float = CONFIDENCE) -> Interval:
    """The t interval (module docstring) of the pooled stall % of replications that stalled
    ``stalled[i]`` seconds of ``windows[i]``; ``(None, None)`` with fewer than two
    replications or an empty pooled window."""
    rows = np.column_stack([np.asarray(stalled, dtype=float),
                            np.asarray(windows, dtype=float)]).reshape(-1, 2)
    if len(rows) < 2 or rows[:, 1].sum() <= 0:
        return None, None
    estimate = _percent(rows.sum(axis=0))
    return t_interval(estimate, paired_jackknife_se(rows, _percent), len(rows), confidence)


#: Bootstrap resamples of the replications behind a standard error over replications.
RESAMPLES = 400


def replication_bootstrap_se(samples: Sequence[Sequence[float] | np.ndarray],
                             statistic: Callable[[np.ndarray], float | None],
                             rng: np.random.Generator | None = None,
                             resamples: int = RESAMPLES) -> float | None:
    """The bootstrap standard error, over replications, of ``statistic`` of the pooled
    values of ``samples`` (one sequence per replication): whole replications are resampled
    (``scipy.stats.bootstrap``), which keeps what the values of one replication share (a
    queue, the streams of one server). ``rng``: the draws (default: seed 0, the same figure
    every time). None with fewer than two replications, or where a resample has no value
    (``statistic`` returns None)."""
    groups = [np.asarray(sample, dtype=float) for sample in samples]
    if len(groups) < 2:
        return None

    def pooled_statistic(picked: np.ndarray) -> float:
        value = statistic(np.concatenate([groups[i] for i in picked]))
        return math.nan if value is None else value

    return _resampled_se(len(groups), pooled_statistic, False, rng, resamples)


def _resampled_se(count: int, statistic: Callable[..., object], vectorized: bool,
                  rng: np.random.Generator | None, resamples: int) -> float | None:
    """``scipy.stats.bootstrap``'s standard error of ``statistic`` over resamples of the
    replication indices ``0 .. count - 1`` (``rng``: default seed 0), or None where it is
    not finite."""
    from scipy.stats import DegenerateDataWarning, bootstrap

    with warnings.catch_warnings():  # only the standard error is read: scipy's warning
        # that the interval is undefined (a resample with no value) is not the user's
        warnings.simplefilter("ignore", DegenerateDataWarning)
        result = bootstrap((np.arange(count),), statistic, vectorized=vectorized,
                           n_resamples=resamples, method="percentile",
                           random_state=rng if rng is not None else np.random.default_rng(0))
    se = float(result.standard_error)
    return se if math.isfinite(se) else None


#: The most (resample, value) pairs :func:`replication_percentile_se` counts at once.
CELLS_AT_ONCE = 1 << 21


def replication_percentile_se(samples: Sequence[Sequence[float] | np.ndarray], level: float,
                              rng: np.random.Generator | None = None,
                              resamples: int = RESAMPLES) -> float | None:
    """:func:`replication_bootstrap_se` of the pooled ``level`` percentile (0 to 100, as
    :func:`latsim.analysis.latency.percentile` takes it), the same resamples and the same
    floats, with every resample's percentile computed at once: the values sorted once,
    each resample's order statistics found by counting how many times it picked each
    replication, and numpy's linear interpolation between them written out as
    ``numpy.quantile`` does it (``(n − 1)·q``, then ``a + (b − a)·γ``, or ``b − (b −
    a)·(1 − γ)`` where ``γ >= 0.5``). ``reproduce serving`` computed 400 quantiles one by
    one for each of its 200 standard errors. A sample holding a NaN goes the general way
    (numpy sorts it last and the pooled percentile is NaN)."""
    groups = [np.asarray(sample, dtype=float) for sample in samples]
    if len(groups) < 2:
        return None
    q = level / 100
    if not any(group.size for group in groups):
        return None  # no resample pools a value
    if any(np.isnan(group).any() for group in groups):
        return replication_bootstrap_se(
            groups, lambda values: empirical_quantile(values, q) if values.size else None,
            rng, resamples)
    count = len(groups)
    sizes = np.array([group.size for group in groups])
    owners = np.repeat(np.arange(count), sizes)
    values = np.concatenate(groups)
    order = np.argsort(values, kind="stable")
    values, owners = values[order], owners[order]
    last = values.size - 1

    def pooled_percentiles(picked: np.ndarray, axis: int = -1) -> np.ndarray:
        rows = np.atleast_2d(picked)
        out = np.empty(len(rows))
        step = max(1, CELLS_AT_ONCE // max(values.size, 1))
        for start in range(0, len(rows), step):
            chunk = rows[start:start + step]
            times = np.bincount((np.arange(len(chunk))[:, None] * count + chunk).ravel(),
                                minlength=len(chunk) * count).reshape(len(chunk), count)
            n = times @ sizes
            virtual = (n - 1) * q  # numpy's "linear": (n - 1) * quantiles
            previous = np.floor(virtual)
            gamma = virtual - previous
            above = virtual >= n - 1  # numpy takes the last value (gamma then moves nothing)
            low = np.where(above, n - 1, previous).astype(np.int64)
            high = np.where(above, n - 1, previous + 1).astype(np.int64)
            reached = np.cumsum(times[:, owners], axis=1)  # pooled values up to each sorted one
            a = values[np.minimum((reached <= low[:, None]).sum(axis=1), last)]
            b = values[np.minimum((reached <= high[:, None]).sum(axis=1), last)]
            diff = b - a
            result = a + diff * gamma
            upper = gamma >= 0.5
            result[upper] = (b - diff * (1 - gamma))[upper]
            result[n == 0] = math.nan  # no value: the general way's None
            out[start:start + len(chunk)] = result
        return out if picked.ndim > 1 else out[0]

    return _resampled_se(count, pooled_percentiles, True, rng, resamples)


def cdf_band(n: int, confidence: float = CONFIDENCE) -> float:
    """The half-width ε of the simultaneous band of an empirical CDF of ``n`` values:
    ``sup |F_n − F| <= ε`` with probability ``confidence`` (the Kolmogorov–Smirnov
    statistic's ``confidence`` quantile, ``scipy.stats.kstwo``; exact for a continuous F,
    and narrower than the Dvoretzky–Kiefer–Wolfowitz bound)."""
    from scipy.stats import kstwo

    return float(kstwo.ppf(confidence, n))
