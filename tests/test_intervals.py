"""Confidence intervals of reported percentiles and stall % (latsim.analysis.intervals):
coverage by simulation, the order statistics chosen, edge cases, and the summaries that
carry them."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import beta, binom, t

from latsim.analysis.intervals import (
    CONFIDENCE,
    binomial_quantile,
    cdf_band,
    percentile_intervals,
    percentile_ranks,
    replication_bootstrap_se,
    replication_percentile_se,
    stall_interval,
    t_interval,
)
from latsim.analysis.latency import LEVELS, percentile

#: trials of the coverage test, and the chance a correct interval fails one of its checks
TRIALS, MISS = 2000, 1e-4


def test_percentile_interval_covers_the_true_quantile_at_its_confidence():
    """400 exponential values, drawn TRIALS times: the share of intervals that hold the
    true quantile -ln(1 - p) is Binomial(TRIALS, c) / TRIALS, with c the exact coverage of
    the order statistics chosen (B(u - 1) - B(l - 1)), which must be at least 95%. The
    count must lie in that binomial's central 1 - MISS range: an interval too narrow or
    too wide falls outside it."""
    n = 400
    rng = np.random.default_rng(52)
    hits = dict.fromkeys(LEVELS, 0)
    for _ in range(TRIALS):
        sample = rng.exponential(size=n)
        for level, (lo, hi) in zip(LEVELS, percentile_intervals(sample, LEVELS),
                                   strict=True):
            hits[level] += lo <= -math.log(1 - level / 100) <= hi
    for level, (low, high) in zip(LEVELS, percentile_ranks(n, LEVELS), strict=True):
        p = level / 100
        exact = binom.cdf(high - 1, n, p) - binom.cdf(low - 1, n, p)
        assert exact >= CONFIDENCE, level
        least, most = binom.ppf(MISS / 2, TRIALS, exact), binom.isf(MISS / 2, TRIALS, exact)
        assert least <= hits[level] <= most, (level, hits[level], least, most, exact)
        # and the share is not below the promise either (the same binomial tolerance)
        assert hits[level] >= binom.ppf(MISS, TRIALS, CONFIDENCE), level


@pytest.mark.parametrize("n", [20, 100, 400, 5000])
def test_the_order_statistics_are_the_tightest_equal_tailed_pair(n):
    """Each side misses with probability at most α/2, and moving either order statistic
    one rank inward would let that side miss more often than α/2."""
    half = (1 - CONFIDENCE) / 2
    for level, (low, high) in zip(LEVELS, percentile_ranks(n, LEVELS), strict=True):
        p = level / 100
        below = binom.cdf(low - 1, n, p)  # x(low) above the quantile
        above = binom.sf(high - 1, n, p)  # x(high) below it
        assert below <= half and above <= half, (n, level)
        assert binom.cdf(low, n, p) > half, (n, level)  # x(low + 1) would miss too often
        assert binom.sf(high - 2, n, p) > half, (n, level)  # so would x(high - 1)


def test_percentile_interval_edge_cases():
    assert percentile_intervals([], LEVELS) == [(None, None)] * 3
    assert percentile_intervals([3.0], [50]) == [(None, None)]  # one value bounds nothing
    assert percentile_intervals([2.5] * 500, LEVELS) == [(2.5, 2.5)] * 3
    # ten values: the 99th percentile has no upper bound; its lower bound is x(9), since
    # all ten below the true p99 happens with probability 0.99^10 + 10 x 0.01 x 0.99^9 > α/2
    ten = np.arange(1.0, 11.0)
    ((lo, hi),) = percentile_intervals(ten[::-1], [99])
    assert (lo, hi) == (9.0, None)
    ((lo, hi),) = percentile_intervals(ten, [50])
    assert (lo, hi) == (2.0, 9.0)  # binomial(10, 1/2): P(<= 1) = 0.011 <= α/2 < P(<= 2)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 19, 20, 64, 101, 1000, 4567, 10**6 + 7])
def test_the_binomial_quantile_is_scipy_stats_own(n):
    """binomial_quantile computes binom.ppf from scipy.special (scipy.stats is slow to
    import): the same ranks at every level a summary reports, and at the ends, for the
    tails an interval uses. (Where the CDF equals q exactly, as at q = 0.5 for an odd n
    and p = 1/2, the last bit of either CDF decides, and scipy's own versions differ.)"""
    p = np.array([0.0, 1e-6, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999,
                  1.0, *(np.asarray(LEVELS, dtype=float) / 100)])
    for q in (0.025, 0.975, 0.005, 0.995, 0.05, 0.95):
        assert binomial_quantile(q, n, p).tolist() == binom.ppf(q, n, p).tolist(), q


def test_the_other_quantiles_are_scipy_stats_own():
    """t_interval and the blocking bounds use scipy.stats.t's and beta's ppf functions
    from scipy.special: the same numbers."""
    from latsim.analysis.fleet import blocking_bounds

    for n in (2, 3, 5, 30, 200):
        half = float(t.ppf(0.975, n - 1)) * 2.0
        assert t_interval(50.0, 2.0, n, bounds=(-math.inf, math.inf)) == (50.0 - half,
                                                                             50.0 + half)
    for rejected, arrived in ((1, 10), (3, 1000), (999, 1000), (50, 100_000)):
        assert blocking_bounds(rejected, arrived) == (
            beta.ppf(0.05, rejected, arrived - rejected + 1),
            beta.ppf(0.95, rejected + 1, arrived - rejected))


def test_a_summary_with_its_intervals_does_not_import_scipy_stats():
    """Every summarising command reaches the intervals: scipy.stats would cost each run
    about 0.9 s of CPU to import (scipy.special, which they use, about 0.4)."""
    code = ("import sys; sys.argv = ['latsim', 'simulate', '--K', '8', '--duration', '20',"
            " '--seeds', '2', '--streams', '2', '--pools', 'dit=1']\n"
            "from latsim.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('scipy.stats' in sys.modules, 'scipy.special' in sys.modules,"
            " file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=300)
    assert "L95_lo" in done.stdout or "L95" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "False True"


def test_stall_interval_is_the_t_interval_over_replications():
    """Equal windows: the pooled stall % is the replications' mean and the interval is the
    textbook mean ± t(0.975, n - 1) s / √n, clipped to [0, 100]."""
    stalled = np.array([1.2, 0.4, 2.0, 0.9, 1.6])
    pct = 100 * stalled / 60.0
    half = t.ppf(0.975, 4) * pct.std(ddof=1) / math.sqrt(5)
    lo, hi = stall_interval(stalled, [60.0] * 5)
    assert lo == pytest.approx(pct.mean() - half) and hi == pytest.approx(pct.mean() + half)
    assert stall_interval([0.0, 0.0, 6.0], [60.0] * 3)[0] == 0.0  # clipped at 0
    assert stall_interval([0.0, 0.0], [60.0, 60.0]) == (0.0, 0.0)
    assert stall_interval([1.0], [60.0]) == (None, None)  # one replication: no spread
    assert stall_interval([], []) == (None, None)
    assert stall_interval([0.0, 0.0], [0.0, 0.0]) == (None, None)  # nothing played
    assert t_interval(None, 1.0, 5) == (None, None)


def test_stall_interval_covers_the_true_stall_at_its_confidence():
    """Replications whose stall % is normal around 2%: the t interval of 5 covers 2% in a
    share within the binomial tolerance of 95% (t is exact for normal replications)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(TRIALS):
        pct = rng.normal(2.0, 0.5, size=5)
        lo, hi = stall_interval(pct * 0.6, [60.0] * 5)
        hits += lo <= 2.0 <= hi
    least, most = (binom.ppf(MISS / 2, TRIALS, CONFIDENCE),
                   binom.isf(MISS / 2, TRIALS, CONFIDENCE))
    assert least <= hits <= most, hits


def test_cdf_band_holds_the_whole_cdf_at_its_confidence():
    n, rng, hits = 50, np.random.default_rng(3), 0
    band = cdf_band(n)
    assert band < 0.99 * math.sqrt(math.log(2 / 0.05) / (2 * n))  # DKW bounds it loosely
    grid = np.arange(1, n + 1) / n
    for _ in range(TRIALS):
        u = np.sort(rng.uniform(size=n))
        hits += max(np.max(grid - u), np.max(u - (grid - 1 / n))) <= band
    assert binom.ppf(MISS / 2, TRIALS, 0.95) <= hits <= binom.isf(MISS / 2, TRIALS, 0.95)


def test_replication_bootstrap_se_of_a_mean_is_near_s_over_root_n():
    rng = np.random.default_rng(5)
    groups = [rng.normal(10.0, 2.0, size=30) for _ in range(20)]
    means = np.array([g.mean() for g in groups])
    se = replication_bootstrap_se(groups, lambda v: float(v.mean()))
    assert se == pytest.approx(means.std(ddof=1) / math.sqrt(20), rel=0.15)
    assert se == replication_bootstrap_se(groups, lambda v: float(v.mean()))  # seeded
    assert replication_bootstrap_se(groups[:1], lambda v: float(v.mean())) is None


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 25), min_size=2, max_size=9),
       level=st.sampled_from([*LEVELS, 0, 12.5, 100]), seed=st.integers(0, 2**32 - 1),
       ties=st.booleans(), nan=st.booleans(), resamples=st.integers(2, 60))
def test_the_percentiles_bootstrap_all_at_once_gives_the_general_ways_floats(
        sizes, level, seed, ties, nan, resamples):
    """``replication_percentile_se`` is ``replication_bootstrap_se`` of the pooled
    percentile to the last bit: the same resamples, and numpy's own interpolation between
    the same order statistics (empty replications, ties, NaN, every level and a bootstrap
    whose resamples may pool nothing included)."""
    rng = np.random.default_rng(seed)
    groups = [rng.integers(0, 5, size).astype(float) if ties else rng.lognormal(0, 1, size)
              for size in sizes]
    if nan and sizes[0]:
        groups[0][0] = math.nan

    def pooled(values):
        return percentile(values, level)

    fast = replication_percentile_se(groups, level, np.random.default_rng(seed), resamples)
    general = replication_bootstrap_se(groups, pooled, np.random.default_rng(seed), resamples)
    assert (fast is None and general is None) or fast == general, (fast, general)


def test_the_percentiles_bootstrap_counts_in_chunks(monkeypatch):
    """Resamples counted a few at a time (the memory bound) give the same figure."""
    import latsim.analysis.intervals as intervals

    rng = np.random.default_rng(3)
    groups = [rng.lognormal(0, 1, int(rng.integers(10, 40))) for _ in range(12)]
    whole = replication_percentile_se(groups, 95)
    monkeypatch.setattr(intervals, "CELLS_AT_ONCE", 3 * sum(g.size for g in groups))
    assert replication_percentile_se(groups, 95) == whole
    assert whole == replication_bootstrap_se(groups, lambda v: percentile(v, 95))


@pytest.fixture(scope="module")
def sweep():
    from latsim.experiments.engine import Experiment, run_experiment
    from latsim.model.costs import FixedCost

    exp = Experiment(Ks=(8,), cost=FixedCost(0.9), updates="poisson:2", duration=60.0,
                     seeds=4, policies=("speculative",))
    return run_experiment(exp, jobs=1)


def test_summaries_carry_the_intervals(sweep):
    from latsim.analysis.latency import latency_stats
    from latsim.analysis.metrics import stall_time_in_window, summarize

    runs = sweep.runs[8, "speculative"]
    row = sweep.rows[0]
    latencies = [c.L for run in runs for c in run.conditions if c.displayed]
    for level, (lo, hi) in zip(LEVELS, percentile_intervals(latencies, LEVELS),
                               strict=True):
        assert (row[f"L{level}_lo"], row[f"L{level}_hi"]) == (lo, hi)
        assert lo <= row[f"L{level}"] <= hi
    stalled = [stall_time_in_window(run) for run in runs]
    assert (row["stall_pct_lo"], row["stall_pct_hi"]) == stall_interval(stalled, [60.0] * 4)
    one = summarize(runs[:1])
    assert one.stall_pct_lo is None and one.stall_pct_hi is None and one.L95_lo is not None
    assert {"uplink95_lo", "uplink95_hi"} <= set(latency_stats([1.0, 2.0], "uplink"))


def test_serving_stall_intervals_take_a_replications_streams_together():
    """Streams of one replication share the devices: the serving summary's stall
    intervals are over replications, not over streams."""
    from latsim.analysis.serving import serving_metrics, viewer_stall_pct
    from latsim.experiments.engine import Experiment, run_experiment
    from latsim.model.serving import ServingConfig

    experiment = Experiment(Ks=(8,), cost="lognormal:0.45,0.3", updates="poisson:0.2",
                            policies=("speculative",), lead=0.6, duration=60.0, seeds=4,
                            serving=ServingConfig(streams=3, start="random"))
    runs = run_experiment(experiment, jobs=1).runs[8, "speculative"]
    metrics = serving_metrics(runs)
    viewer = np.array([viewer_stall_pct([run]) for run in runs])
    assert viewer.std(ddof=1) > 0  # else the check says nothing
    half = t.ppf(0.975, 3) * viewer.std(ddof=1) / 2
    assert metrics["viewer_stall_pct_lo"] == pytest.approx(max(0.0, viewer.mean() - half))
    assert metrics["viewer_stall_pct_hi"] == pytest.approx(viewer.mean() + half)
    assert {"stall_pct_lo", "client_stall_pct_hi", "L95_lo", "L_server95_hi"} <= set(metrics)


def test_fleet_rows_carry_the_pooled_intervals():
    """A fleet's pooled quantiles carry the interval of the pooled values."""
    from latsim.analysis.fleet import pooled_quantiles

    rng = np.random.default_rng(9)
    samples = [{"L": tuple(rng.exponential(size=300)), "ttfc": tuple(rng.uniform(size=300))}
               for _ in range(3)]
    row = pooled_quantiles(samples)
    values = [v for s in samples for v in s["L"]]
    assert (row["L95_lo"], row["L95_hi"]) == percentile_intervals(values, [95])[0]
    assert row["ttfc_p99_lo"] <= row["ttfc_p99"] <= row["ttfc_p99_hi"]
