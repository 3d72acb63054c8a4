"""Clock alignment (min-RTT offset, drift) and network shaping for the live client/server."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.net.netclock import Probe, Shaper, estimate_drift, estimate_offset
from latsim.errors import LatsimError


def probes(offset: float, up, down, service, start: float = 0.0, every: float = 0.5,
           drift: float = 0.0):
    """Probes between a client clock and a server clock ``offset + drift·t`` ahead, with
    the given one-way delays and server turnaround times."""
    out = []
    for i, (u, d, s) in enumerate(zip(up, down, service, strict=True)):
        t0 = start + i * every
        server_at = lambda t: t + offset + drift * t  # noqa: E731
        t1 = server_at(t0 + u)
        t2 = server_at(t0 + u + s)
        out.append(Probe(t0, t1, t2, t0 + u + s + d))
    return out


@settings(max_examples=60, deadline=None)
@given(offset=st.floats(-1e4, 1e4), n=st.integers(1, 40), seed=st.integers(0, 10**6),
       up_base=st.floats(0.0, 0.05), down_base=st.floats(0.0, 0.05))
def test_the_true_offset_is_within_half_the_minimum_rtt(offset, n, seed, up_base, down_base):
    """NTP's bound holds whatever the asymmetry: |estimate − offset| <= rtt_min / 2."""
    rng = np.random.default_rng(seed)
    up = up_base + rng.exponential(0.01, n)
    down = down_base + rng.exponential(0.01, n)
    estimate = estimate_offset(probes(offset, up, down, rng.uniform(0, 0.002, n)))
    assert abs(estimate.offset - offset) <= estimate.uncertainty + 1e-6
    assert estimate.rtt_min == pytest.approx(min(up + down), abs=1e-6)


def test_asymmetric_delays_bias_the_estimate_by_half_their_difference():
    """5 ms up, 25 ms down, no jitter: the estimate is off by (5 − 25)/2 = −10 ms, inside the
    15 ms bound; the min-RTT probe among jittered ones gets the tightest bound."""
    n = 50
    estimate = estimate_offset(probes(3.0, [0.005] * n, [0.025] * n, [0.001] * n))
    assert estimate.offset - 3.0 == pytest.approx(-0.010, abs=1e-9)
    assert estimate.uncertainty == pytest.approx(0.015)
    rng = np.random.default_rng(1)
    jittered = probes(3.0, 0.005 + rng.exponential(0.02, n), 0.025 + rng.exponential(0.02, n),
                      [0.001] * n)
    best = estimate_offset(jittered)
    assert best.rtt_min == min(p.rtt for p in jittered) and abs(best.offset - 3.0) <= (
        best.uncertainty + 1e-9)


def test_drift_is_recovered_from_the_best_probe_of_each_window():
    rng = np.random.default_rng(2)
    n, drift = 400, 50e-6  # 50 ppm over 200 s: 10 ms
    got = estimate_drift(probes(0.2, 0.01 + rng.exponential(0.005, n),
                                0.01 + rng.exponential(0.005, n), [0.0] * n, drift=drift),
                         windows=8)
    # the bound per window is about rtt_min / 2 ~ 10 ms over a 200 s baseline
    assert got == pytest.approx(drift, abs=2 * 0.011 / 200)
    assert estimate_drift(probes(0.0, [0.01], [0.01], [0.0])) is None


def test_bad_probes_are_one_line_errors():
    with pytest.raises(LatsimError, match="no clock probes"):
        estimate_offset([])
    with pytest.raises(LatsimError, match="come back after it left"):
        Probe(1.0, 5.0, 5.1, 0.5)
    with pytest.raises(LatsimError, match="finite"):
        Probe(0.0, math.nan, 1.0, 2.0)


def test_the_shaper_delays_jitters_loses_and_keeps_order():
    """20 ms ± 5 ms with 5 % loss over 20,000 messages every 10 ms: the delay mean is
    within 4 standard errors of 20 ms (before reordering is prevented; in order, the mean
    can only rise), every delay within [15, 25] ms or pushed back by its predecessor, loss
    within 4 binomial standard errors, and the same seed gives the same arrivals."""
    shaper = Shaper(0.020, 0.005, 0.05)
    n = 20_000
    sent = np.arange(n) * 0.01
    channel, twin = (shaper.channel(np.random.default_rng(7)) for _ in range(2))
    arrivals = [channel.deliver_at(t) for t in sent]
    again = [twin.deliver_at(t) for t in sent]
    assert arrivals == again
    kept = [(s, a) for s, a in zip(sent, arrivals, strict=True) if a is not None]
    lost = 1 - len(kept) / n
    assert abs(lost - 0.05) <= 4 * math.sqrt(0.05 * 0.95 / n)
    delays = np.array([a - s for s, a in kept])
    assert np.all(delays >= 0.015 - 1e-12) and np.all(delays <= 0.025 + 1e-12)
    se = 0.005 / math.sqrt(3) / math.sqrt(delays.size)  # uniform(−j, j) has sd j/√3
    assert abs(delays.mean() - 0.020) <= 4 * se
    times = [a for _, a in kept]
    assert times == sorted(times)  # no message overtakes the one sent before it
    burst = Shaper(0.020, 0.005).channel(np.random.default_rng(0))
    out = [burst.deliver_at(0.0) for _ in range(100)]  # sent together: still in order
    assert out == sorted(out)


def test_a_shaper_cannot_deliver_before_sending():
    with pytest.raises(LatsimError, match="exceeds the delay"):
        Shaper(0.01, 0.02)
    for loss in (1.5, 1.0, 0.51):  # all lost, or most: a session would measure nothing
        with pytest.raises(LatsimError, match="loss"):
            Shaper(0.01, 0.0, loss)
