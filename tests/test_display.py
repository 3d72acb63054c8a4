"""The display refresh (:mod:`latsim.model.display`): a frame is on screen at the first refresh
at or after the playout rule's time, and a session's refresh phase is fitted to its own
display times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latsim.errors import LatsimError
from latsim.model.display import NOMINAL_PERIOD, DisplayRefresh, fit_refresh

P = NOMINAL_PERIOD


def test_a_frame_is_on_screen_at_the_first_refresh_at_or_after_its_time():
    refresh = DisplayRefresh(P, 0.004)
    assert refresh.present(0.004) == pytest.approx(0.004)  # on a refresh: that one
    assert refresh.present(0.004 + 1e-12) == pytest.approx(0.004)  # within EPS: the same
    assert refresh.present(0.0041) == pytest.approx(0.004 + P)
    assert refresh.present(0.0) == pytest.approx(0.004)
    assert refresh.present(100 * P + 0.004) == pytest.approx(100 * P + 0.004)
    assert refresh.present(-0.001) == pytest.approx(0.004)
    assert refresh.present(-0.013) == pytest.approx(0.004 - P)
    steps = [refresh.step(t) for t in np.linspace(0.0, 10.0, 10_001)]
    assert min(steps) >= 0.0 and max(steps) < P
    # a slot grid of δ = 0.25 s, 15 refreshes: every slot waits the same step
    grid = [refresh.step(0.1 + 0.25 * k) for k in range(400)]
    assert max(grid) - min(grid) < 1e-9
    assert grid[0] == pytest.approx((0.004 - 0.1) % P)


@pytest.mark.parametrize(("period", "phase"), [(0.0, 0.0), (-P, 0.0), (math.nan, 0.0),
                                               (P, -1e-6), (P, P), (P, math.nan)])
def test_a_refresh_clock_must_make_sense(period, phase):
    with pytest.raises(LatsimError):
        DisplayRefresh(period, phase)


@pytest.mark.parametrize("phase", [0.0, 5e-5, P / 2, P - 5e-5])
def test_the_fitted_phase_is_within_the_timestamps_jitter_of_the_true_one(phase):
    """Frames drawn on a clock of ``phase``, each timestamp off by up to ``jitter`` (a
    coarsened clock) and some refreshes skipped: every timestamp lies within ``jitter`` of
    the clock, so their circular mean does too, wherever the phase is (also across 0)."""
    jitter = 2e-4
    rng = np.random.default_rng(7)
    n = np.cumsum(rng.integers(1, 4, size=60)) + 15 * np.arange(60)
    times = phase + n * P + rng.uniform(-jitter, jitter, size=n.size)
    fit = fit_refresh(times.tolist(), P)
    error = (fit.refresh.phase - phase + P / 2) % P - P / 2
    assert abs(error) <= jitter
    assert fit.n == 60 and fit.period_source == "measured"
    assert fit.spread <= 2 * jitter
    # the frames' own steps from the playout times they were drawn for
    assert all(fit.refresh.present(t - 0.003) == pytest.approx(t, abs=2 * jitter)
               for t in phase + n[:10] * P)


def test_a_fit_needs_display_times_and_a_period():
    with pytest.raises(LatsimError, match="no display time"):
        fit_refresh([math.nan], P)
    with pytest.raises(LatsimError, match="period"):
        fit_refresh([0.1], 0.0)
    with pytest.raises(LatsimError, match="period_source"):
        fit_refresh([0.1], P, "guessed")
    assert fit_refresh([0.1], P, "assumed").refresh.phase == pytest.approx(0.1 % P)
