"""Simulation against the closed forms, with tolerances derived from the sample.

Stochastic checks use Z standard errors of the simulated estimate (Z = 4: a false alarm
has probability ~6e-5, and the seeds are fixed). Deterministic checks use the error bound
of the finite horizon or phase grid.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from latsim.analysis import theory
from latsim.analysis.metrics import stall_time_in_window, work_calls
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.model.arrivals import BernoulliArrivals
from tests.helpers import run, shown_latencies

Z = 4.0


def se(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(values.size))


def isolated_arrivals(timing: Timing, C: float, n: int, seed: int) -> list[float]:
    """Rare updates: gaps of 2(T + C) (back to steady state) plus U[0, 4T), so the arrival
    phase modulo the refill period T is exactly uniform and independent of the past."""
    rng = np.random.default_rng(seed)
    gaps = 2 * (timing.T + C) + rng.uniform(0, 4 * timing.T, size=n)
    return list(np.cumsum(gaps) + timing.T)


def test_baseline_mean_is_c_plus_half_t_with_lead_c():
    timing = Timing(K=8, r=4, fps=16.0)  # T = 2 s
    C = 0.7
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(1.5, size=1500))  # Poisson, phases uniform
    duration = float(times[-1] + 1)
    records = run(timing, BASELINE, times, duration, C)
    # superseded conditions are shown at the same boundary as their successor: keep them
    L = shown_latencies(records, include_superseded=True)
    assert L.size == len(times)
    expected = theory.baseline_latency_lower_bound(C, timing.T)
    assert abs(L.mean() - expected) < Z * se(L)
    assert L.min() >= C - 1e-9 and L.max() < C + timing.T + 1e-9


@pytest.mark.parametrize("K, C, lead", [
    (8, 0.7, None), (4, 0.62, None), (21, 3.565, None), (8, 0.3, 0.55), (4, 0.2, 1.4),
])
def test_speculative_residual_wait_and_refined_mean_under_rare_updates(K, C, lead):
    timing = Timing(K=K, r=4, fps=16.0)
    times = isolated_arrivals(timing, C, 1200, seed=K)
    records = run(timing, SPECULATIVE, times, times[-1] + 1, C, lead=lead)
    shown = [c for c in records.conditions if c.displayed and not c.superseded]
    assert len(shown) == len(times)
    R = np.array([c.R for c in shown])
    L = np.array([c.L for c in shown])
    expected_r = theory.speculative_residual_wait_mean(C, timing.T, timing.delta)
    assert abs(R.mean() - expected_r) < Z * se(R)
    expected = theory.speculative_latency_mean(C, timing.T, timing.delta, lead)
    assert abs(L.mean() - expected) < Z * se(L)


@pytest.mark.parametrize("K, C, lead", [
    (8, 0.7, None), (4, 0.62, None), (21, 3.565, None), (8, 0.3, 0.55), (8, 0.55, None),
])
def test_speculative_latency_distribution_under_rare_updates(K, C, lead):
    """The whole distribution of L, not only its mean: the empirical CDF of 1200 isolated
    conditions stays within the DKW band of the phase map's CDF (false alarm 1e-4), the
    segments' mean is the exact mean, and the quantiles invert the CDF."""
    timing = Timing(K=K, r=4, fps=16.0)
    T, delta = timing.T, timing.delta
    times = isolated_arrivals(timing, C, 1200, seed=K + 1)
    records = run(timing, SPECULATIVE, times, times[-1] + 1, C, lead=lead)
    L = np.sort([c.L for c in records.conditions if c.displayed and not c.superseded])
    assert L.size == len(times)
    band = math.sqrt(math.log(2 / 1e-4) / (2 * L.size))
    theory_cdf = np.array([theory.speculative_latency_cdf(x, C, T, delta, lead) for x in L])
    above = np.arange(1, L.size + 1) / L.size - theory_cdf  # F_n just after each sample
    below = theory_cdf - np.arange(L.size) / L.size  # and just before it
    assert max(above.max(), below.max()) < band
    segments = theory.speculative_latency_segments(C, T, delta, lead)
    mean = sum((b - a) * (c - (a + b) / 2) for a, b, c in segments) / T
    assert mean == pytest.approx(theory.speculative_latency_mean(C, T, delta, lead), abs=1e-12)
    for level in (0.05, 0.5, 0.95):
        q = theory.speculative_latency_quantile(C, T, delta, level, lead)
        assert theory.speculative_latency_cdf(q, C, T, delta, lead) == pytest.approx(
            level, abs=1e-9)


@pytest.mark.parametrize("K, C", [(8, 0.7), (4, 0.62), (8, 1.9), (4, 0.95)])
def test_replans_started_at_the_cache_end_wait_as_eq_6_and_show_at_the_same_slot(K, C):
    """replan_at_cache_end=start: an idle arrival whose branch would be the cache end starts
    its replan at once, and a busy one as the running job ends, so R is eq. (6)'s C²/(2T)
    with no deferral term; L is what the deferring rule gives (the same slot). The last
    two cases have T − δ < C, where both of the deferral's terms are large."""
    timing = Timing(K=K, r=4, fps=16.0)
    times = isolated_arrivals(timing, C, 1200, seed=K)
    records = run(timing, SPECULATIVE, times, times[-1] + 1, C, replan_at_cache_end="start")
    shown = [c for c in records.conditions if c.displayed and not c.superseded]
    assert len(shown) == len(times)
    R = np.array([c.R for c in shown])
    L = np.array([c.L for c in shown])
    assert abs(R.mean() - theory.residual_wait_mean(C, timing.T)) < Z * se(R)
    assert abs(L.mean() - theory.speculative_latency_mean(C, timing.T, timing.delta)) < (
        Z * se(L))
    deferred = theory.speculative_residual_wait_mean(C, timing.T, timing.delta)
    if deferred - theory.residual_wait_mean(C, timing.T) > 0.05:  # the rules tell apart
        assert abs(R.mean() - deferred) > Z * se(R)


def test_refined_mean_is_exact_over_a_phase_grid_and_designs_form_is_an_upper_bound():
    """K=2, δ=0.5, C=0.25: C is not a multiple of δ, so DESIGN §2's idle term
    (1 − C/T)·δ/2 overstates E[Q] by g(δ − g)/(2T) = 0.03125 s. A midpoint grid of N
    phases over one refill period integrates L exactly up to jumps: error <= jumps·T/N."""
    timing = Timing(K=2, r=4, fps=8.0)
    C, T, n = 0.25, timing.T, 400
    latencies = []
    for i in range(n):
        t = 3 * T + (i + 0.5) / n * T
        (cond,) = run(timing, SPECULATIVE, [t], 6 * T, C).conditions
        latencies.append(cond.L)
    grid_error = (timing.K + 2) * T / n
    exact = theory.speculative_latency_mean(C, T, timing.delta)
    design = theory.speculative_latency_mean_design(C, T, timing.delta)
    assert design - exact == pytest.approx(0.03125)
    assert abs(np.mean(latencies) - exact) < grid_error
    assert abs(np.mean(latencies) - design) > grid_error


@pytest.mark.parametrize("K, p", [(4, 0.1), (8, 0.05), (16, 0.2)])
def test_work_amplification_matches_independent_update_model(K, p):
    """bernoulli:p with C << δ: each call plays min(Geom(p), K) latents (App. B.2)."""
    timing = Timing(K=K, r=4, fps=16.0)
    C = timing.delta * 1e-3
    duration = 3000 * timing.delta / p
    trace = BernoulliArrivals(p).trace(0, np.random.default_rng(K), duration, timing)
    spec = run(timing, SPECULATIVE, trace.times, duration, C)
    base = run(timing, BASELINE, trace.times, duration, C)
    played = Counter(s.job_id for s in spec.slots)
    played_per_call = np.array([played[job.job_id] for job in spec.jobs[1:-1]])
    A_sim = K / played_per_call.mean()
    A_se = A_sim * se(played_per_call) / played_per_call.mean()  # delta method
    expected = theory.work_amplification_independent(K, p)
    assert abs(A_sim - expected) < Z * A_se
    discarded = sum(d.count for d in spec.discards)
    w = discarded / (discarded + len(spec.slots))
    edge = 2 * K / len(spec.slots)  # the last call's unplayed remainder
    assert abs(theory.work_amplification(w) - expected) < Z * A_se + edge
    A_calls = work_calls(spec) / work_calls(base)
    assert abs(A_calls - expected) < Z * A_se + edge


def test_saturated_worker_c_equals_t_gives_three_halves_t():
    timing = Timing(K=8, r=4, fps=16.0)
    C = timing.T
    times = isolated_arrivals(timing, C, 800, seed=5)
    records = run(timing, SPECULATIVE, times, times[-1] + 1, C)
    shown = [c for c in records.conditions if c.displayed and not c.superseded]
    R = np.array([c.R for c in shown])
    L = np.array([c.L for c in shown])
    assert max(abs(c.Q) for c in shown) < 1e-9
    assert abs(R.mean() - timing.T / 2) < Z * se(R)
    assert abs(L.mean() - theory.saturated_latency_mean(timing.T)) < Z * se(L)
    assert stall_time_in_window(records) < 1e-6


@pytest.mark.parametrize("ratio", [1.25, 1.5, 3.0])
@pytest.mark.parametrize("policy", [BASELINE, SPECULATIVE])
def test_stall_fraction_when_generation_is_slower_than_playback(ratio, policy):
    """C > T: deterministic, so the only error is the horizon's transient (prebuffer and
    the partial last job): at most (2T + C)/D."""
    timing = Timing(K=4, r=4, fps=16.0)
    C = ratio * timing.T
    duration = 400 * timing.T
    records = run(timing, policy, [], duration, C)
    fraction = stall_time_in_window(records) / duration
    expected = theory.stall_fraction(C, timing.T)
    assert abs(fraction - expected) <= (2 * timing.T + C) / duration


@pytest.mark.slow
def test_the_replan_rule_table_is_recomputed_byte_for_byte(tmp_path):
    """``latsim reproduce replan-rule`` regenerates results/replan_rule/ unchanged, and its
    rows say what the rule means: with T − δ < C < T deferring wastes nothing (w = 0, the
    baseline's work) while starting wastes some; at C = T both agree exactly."""
    from pathlib import Path

    from latsim.experiments.replan_rule import reproduce_replan_rule

    committed = Path(__file__).parents[1] / "results" / "replan_rule" / "replan_rule.csv"
    rows = reproduce_replan_rule(tmp_path)["replan_rule"]
    assert (tmp_path / "replan_rule.csv").read_bytes() == committed.read_bytes()
    between = [r for r in rows if r["C_below_T_slots"] == 0.5]
    assert between and all(r["w_defer"] == 0.0 and r["w_start"] > 0 for r in between)
    for r in (r for r in rows if r["C_below_T_slots"] == 0.0):
        assert r["L_mean_defer"] == r["L_mean_start"] and r["w_start"] == r["w_defer"]
