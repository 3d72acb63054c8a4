"""Standard errors of pooled metrics: the paired jackknife over replications."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latsim.analysis.intervals import paired_jackknife_se
from latsim.analysis.metrics import summarize, work_calls, work_ratio
from latsim.experiments.engine import Experiment, run_experiment
from latsim.experiments.paper import _se_diff
from latsim.model.costs import FixedCost


def _mean(totals: np.ndarray) -> float:
    return float(totals[0] / totals[1])


def _difference_of_means(totals: np.ndarray) -> float:
    return float(totals[0] / totals[1] - totals[2] / totals[3])


def _leave_one_out_se(values: list[float]) -> float:
    """The textbook jackknife SE from leave-one-out estimates, written out."""
    n = len(values)
    mean = sum(values) / n
    return math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in values))


def test_jackknife_of_a_mean_is_the_sample_sd_over_root_n():
    x = np.random.default_rng(4).gamma(2.0, 1.5, size=37)
    components = np.column_stack([x, np.ones_like(x)])
    se = paired_jackknife_se(components, _mean)
    assert se == pytest.approx(x.std(ddof=1) / math.sqrt(x.size), rel=1e-12)


def test_jackknife_needs_two_rows_and_finite_leave_one_out_values():
    assert paired_jackknife_se(np.array([[1.0, 1.0]]), _mean) is None
    def guarded(totals: np.ndarray) -> float:
        return float(totals[0] / totals[1]) if totals[1] else math.nan

    assert paired_jackknife_se(np.array([[1.0, 0.0], [2.0, 1.0]]), guarded) is None


def test_paired_se_is_below_the_independent_one_when_the_policies_are_correlated():
    """Both policies see a shared per-replication level (the common arrivals) plus their own
    noise: the difference cancels the shared part, the independent hypot does not."""
    rng = np.random.default_rng(11)
    n = 40
    shared = rng.normal(0.0, 1.0, size=n)
    a = 2.5 + shared + rng.normal(0.0, 0.1, size=n)
    b = 2.0 + shared + rng.normal(0.0, 0.1, size=n)
    ones = np.ones(n)
    paired = paired_jackknife_se(np.column_stack([a, ones, b, ones]), _difference_of_means)
    independent = math.hypot(a.std(ddof=1) / math.sqrt(n), b.std(ddof=1) / math.sqrt(n))
    expected = (a - b).std(ddof=1) / math.sqrt(n)  # one row per pair: SE of the differences
    assert paired == pytest.approx(expected, rel=1e-12)
    assert paired < independent / 5


@pytest.fixture(scope="module")
def crn_runs():
    """Both policies on the same arrivals (common random numbers), 12 replications."""
    exp = Experiment(Ks=(8,), cost=FixedCost(0.9), updates="poisson:0.3", duration=60.0,
                     seeds=12)
    result = run_experiment(exp, jobs=1)
    rows = {row["policy"]: row for row in result.rows}
    return result.runs[(8, "baseline")], result.runs[(8, "speculative")], rows


def test_paper_reduction_se_is_the_paired_jackknife_of_the_difference(crn_runs):
    base, spec, rows = crn_runs
    reduction = rows["baseline"]["L_mean"] - rows["speculative"]["L_mean"]

    def pooled(runs) -> float | None:
        return summarize(runs).L_mean

    leave_one_out = [pooled(base[:i] + base[i + 1:]) - pooled(spec[:i] + spec[i + 1:])
                     for i in range(len(base))]
    assert pooled(base) - pooled(spec) == pytest.approx(reduction)
    assert _se_diff(base, spec) == pytest.approx(_leave_one_out_se(leave_one_out), rel=1e-9)


def test_work_ratio_se_is_the_paired_jackknife_of_the_pooled_ratio(crn_runs):
    base, spec, _ = crn_runs
    ratio, se = work_ratio(spec, base)
    ours = [work_calls(r) for r in spec]
    theirs = [work_calls(r) for r in base]
    assert ratio == pytest.approx(sum(ours) / sum(theirs))
    leave_one_out = [(sum(ours) - o) / (sum(theirs) - t) for o, t in zip(ours, theirs, strict=True)]
    assert se == pytest.approx(_leave_one_out_se(leave_one_out), rel=1e-9)
    assert work_ratio(spec[:1], base[:1])[1] is None


def test_one_stall_rule_clips_to_the_window_and_has_no_value_for_an_empty_one():
    """Every stall share (a run's, a serving run's, a client's, a fleet's and its
    per-minute series) is latsim.analysis.metrics.stall_pct over stalls clipped by
    window_overlap: an empty window has none (None), where serving's and a client's said
    0.0, which met any stall limit."""
    from latsim.analysis.metrics import stall_pct
    from latsim.analysis.serving import viewer_metrics
    from latsim.run.records import window_overlap
    from latsim.run.viewer import ViewerRecords

    assert stall_pct(1.5, 60.0) == 100.0 * 1.5 / 60.0 and stall_pct(0.0, 0.0) is None
    assert window_overlap(-1.0, 2.0, 10.0) == 2.0  # [0, end] by default
    assert window_overlap(5.0, 12.0, 10.0, begin=6.0) == 4.0  # a fleet's [warm-up, end]
    assert window_overlap(1.0, 2.0, 10.0, begin=3.0) == 0.0
    empty = viewer_metrics(ViewerRecords((), (), (), (), ()), 0.0)
    assert empty["stall_pct"] is None and empty["viewer_stall_pct"] is None
