"""The closed forms against the paper's worked numbers, and their validity checks."""

from __future__ import annotations

import numpy as np
import pytest

from latsim.analysis import theory
from latsim.analysis.intervals import paired_jackknife_se
from latsim.analysis.metrics import summarize
from latsim.controller.policies import SPECULATIVE
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.arrivals import parse_updates
from tests.helpers import run

Z = 4.0


def test_sol_h3_predicted_reductions_match_the_paper_to_three_decimals():
    # 22- and 124-frame proposals at 24 fps, one latent per frame (§4.3)
    for frames, paper in ((22, 0.438), (124, 2.562)):
        timing = Timing(K=frames, r=1, fps=24.0)
        assert f"{theory.boundary_wait_reduction(timing.T, timing.delta):.3f}" == f"{paper:.3f}"


def test_eq6_worked_example():
    assert f"{theory.residual_wait_mean(1.6, 5.0):.3f}" == "0.256"
    split = theory.residual_wait_split(1.6, 5.0)
    assert split["idle_arrival"] == pytest.approx(1.6)
    assert split["busy_arrival_mean"] == pytest.approx(2.4)
    assert f"{split['unconditional_mean']:.3f}" == "1.856"


def test_limits_and_consistency():
    T, delta = 2.0, 0.25
    # C = T: eq. (6) gives T/2 and the refined mean becomes 3T/2 (no gain over baseline)
    assert theory.residual_wait_mean(T, T) == pytest.approx(T / 2)
    assert theory.speculative_latency_mean(T, T, delta) == pytest.approx(
        theory.saturated_latency_mean(T)
    )
    # C -> 0: the refined mean tends to the ideal C + δ/2
    assert theory.speculative_latency_mean(1e-9, T, delta) == pytest.approx(
        theory.speculative_latency_ideal(0.0, delta), abs=1e-6
    )
    # for C a multiple of δ the exact and DESIGN forms agree
    assert theory.speculative_latency_mean(0.5, T, delta) == pytest.approx(
        theory.speculative_latency_mean_design(0.5, T, delta)
    )
    # the baseline planned lead ahead: L uniform on [lead, lead + T)
    assert theory.baseline_latency_quantile(0.3, T, 0.5) == pytest.approx(1.3)
    assert theory.baseline_latency_quantile(T / 4, T, 0.5) == pytest.approx(
        theory.baseline_latency_lower_bound(T / 4, T))
    assert theory.stall_fraction(1.0, 2.0) == 0.0
    assert theory.stall_fraction(4.0, 2.0) == pytest.approx(0.5)
    assert theory.work_amplification(0.5) == pytest.approx(2.0)
    assert theory.work_amplification_independent(4, 1.0) == pytest.approx(4.0)
    assert theory.work_amplification_independent(4, 0.0) == 1.0
    # for small p, A - 1 ≈ p(K-1)/2, the Poisson form with λ = p/δ
    p, K = 1e-4, 8
    approx = theory.work_amplification_poisson(p / delta, K * delta, delta)
    assert theory.work_amplification_independent(K, p) == pytest.approx(approx, rel=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: theory.residual_wait_mean(3.0, 2.0),  # C > T
        lambda: theory.speculative_latency_mean(3.0, 2.0, 0.25),
        lambda: theory.residual_wait_mean(-1.0, 2.0),
        lambda: theory.boundary_wait_reduction(1.0, 2.0),  # δ > T
        lambda: theory.work_amplification(1.0),
        lambda: theory.work_amplification_independent(4, 1.5),
        lambda: theory.work_amplification_independent(0, 0.5),
        lambda: theory.work_amplification_poisson(1.0, 2.0, 0.25),  # λT = 2, not << 1
        lambda: theory.stall_fraction(0.0, 1.0),
        lambda: theory.boundary_wait_lower_bound(0.0),
        lambda: theory.baseline_latency_quantile(0.1, 1.0, 1.5),
    ],
)
def test_outside_validity_raises(call):
    with pytest.raises(LatsimError):
        call()


def test_summary_reports_invalid_formulas_as_none_with_a_note():
    out = theory.summary(K=4, r=4, fps=16.0, C=2.0, rate=0.1)  # C > T = 1
    assert out["speculative_L_mean"] is None and "C <= T" in out["notes"]["speculative_L_mean"]
    assert out["stall_fraction"] == pytest.approx(0.5)


def test_summary_names_the_residual_wait_a_simulation_measures():
    out = theory.summary(K=8, r=4, fps=16.0, C=0.9)
    assert out["speculative_R_mean"] == theory.speculative_residual_wait_mean(0.9, 2.0, 0.25)
    assert out["speculative_R_mean"] > out["residual_wait_mean"]
    assert "compare a simulation's speculative R_mean with this" in (
        out["about"]["speculative_R_mean"])
    assert theory.summary(K=4, r=4, fps=16.0, C=2.0)["speculative_R_mean"] is None


def test_simulated_speculative_r_mean_matches_the_summarys_speculative_r_mean():
    """Rare Poisson updates (λT = 0.04), fixed C = lead = 0.9 s <= T = 2 s, many seeds: the
    pooled R_mean that ``latsim simulate`` reports is within Z standard errors (a jackknife
    over runs) of the summary's ``speculative_R_mean``."""
    timing = Timing(K=8, r=4, fps=16.0)
    C, duration, seeds = 0.9, 600.0, 100
    source = parse_updates("poisson:0.02")
    runs = [
        run(timing, SPECULATIVE, source.trace(i, np.random.default_rng(i), duration, timing).times,
            duration, C)
        for i in range(seeds)
    ]
    r_mean = summarize(runs).R_mean
    components = np.array([
        (sum(c.R for c in r.conditions if c.displayed),
         sum(1 for c in r.conditions if c.displayed))
        for r in runs
    ])
    se = paired_jackknife_se(components, lambda t: t[0] / t[1])
    assert components[:, 1].sum() > 1000 and se is not None
    expected = theory.summary(timing.K, timing.r, timing.fps, C)["speculative_R_mean"]
    assert abs(r_mean - expected) < Z * se


@pytest.mark.parametrize("kwargs, message", [
    ({"C": 1e308}, "C must be >= 0 and <= 86400 s"),
    ({"C": float("nan")}, "C must be >= 0"),
    ({"C": -0.5}, "C must be >= 0"),
    ({"K": 10**6}, "K must be a positive integer <= 4096"),
    ({"K": 2.0}, "K must be a positive integer"),
    ({"r": 0}, "r must be a positive integer"),
    ({"fps": float("inf")}, "fps must be a positive number in"),
    ({"fps": 5e-324}, "fps must be a positive number in"),
    ({"rate": 1e308}, "rate must be >= 0 and <= 1e+06"),
    ({"rate": float("nan")}, "rate must be >= 0"),
])
def test_summary_inputs_are_range_checked(kwargs, message):
    """`latsim theory --C 1e308` printed 300-digit numbers; every input is bounded now."""
    args = {"K": 8, "r": 4, "fps": 16.0, "C": 0.9, "rate": None} | kwargs
    with pytest.raises(LatsimError) as info:
        theory.summary(**args)
    assert message in str(info.value)


def test_summary_at_the_bounds_is_finite():
    out = theory.summary(4096, 1, 1000.0, 86400.0, 1e6)
    assert all(np.isfinite(v) for v in out.values() if isinstance(v, float))
    assert theory.summary(1, 1024, 0.001, 0.0)["stall_fraction"] == 0.0


@pytest.mark.parametrize("lead", [8200.0, 86_400.0])
def test_speculative_quantile_ends_past_the_float_spacing(monkeypatch, lead):
    """`simulate --lead 8200 --policy speculative` hung drawing its figure: past 8,192 s no
    two floats are 1e-12 s apart, and the bisection waited for that. The share is counted
    here so that the old endless loop fails instead of hanging the test."""
    calls = []
    share = theory._share_at_most

    def counted(*args):
        calls.append(1)
        if len(calls) > 10_000:
            raise AssertionError("the bisection does not end")
        return share(*args)

    monkeypatch.setattr(theory, "_share_at_most", counted)
    for level in (0.5, 0.95):
        value = theory.speculative_latency_quantile(0.5, 1.0, 0.25, level, lead)
        cdf = [theory.speculative_latency_cdf(x, 0.5, 1.0, 0.25, lead)
               for x in (value - 1e-9, value)]
        assert cdf[0] < level <= cdf[1]


def test_the_shared_bisection_ends_at_adjacent_floats_and_keeps_its_tolerance_elsewhere():
    from latsim.numeric import least_true

    # a tolerance finer than the floats' spacing at 8,200 (1.8e-12): ends, at the edge
    x = least_true(lambda v: v >= 8200.5, 8200.0, 8201.0, 1e-15)
    assert x >= 8200.5 and x - 8200.5 <= 2e-12
    # a tolerance the floats can reach: within it, and never below the answer
    y = least_true(lambda v: v * v >= 2.0, 0.0, 2.0, 1e-9)
    assert 2.0 ** 0.5 <= y <= 2.0 ** 0.5 + 1e-9
