"""Closed forms of the timing model (DESIGN §1–2), each citing the paper result it implements.

Symbols: C generation time of the first output (s), T = K·δ chunk play time (s), δ = r/f
latent play time (s), λ Poisson update rate (1/s), p per-latent update probability, w waste
fraction. A formula called outside its validity raises :class:`LatsimError` instead of
returning a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from latsim.errors import (
    MAX_FPS,
    MAX_K,
    MAX_R,
    MAX_RATE,
    MAX_SECONDS,
    MIN_FPS,
    LatsimError,
    check_int,
    check_number,
)
from latsim.numeric import least_true


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise LatsimError(message)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        _require(math.isfinite(value) and value > 0, f"{name} must be > 0, got {value!r}")


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        _require(math.isfinite(value) and value >= 0, f"{name} must be >= 0, got {value!r}")


def boundary_wait_lower_bound(T: float) -> float:
    """E[R + Q] >= T/2 under chunk-boundary commitment (eq. 4; App. A.1 Prop. 1)."""
    _check_positive(T=T)
    return T / 2


def baseline_latency_lower_bound(C: float, T: float) -> float:
    """E[L] >= C + T/2 under chunk-boundary commitment, fixed C (eq. 4; Prop. 1).

    With lead = C the baseline's L is uniform on [C, C + T), so the bound holds with equality.
    """
    _check_nonnegative(C=C)
    return C + boundary_wait_lower_bound(T)


def baseline_latency_quantile(lead: float, T: float, level: float) -> float:
    """The ``level`` quantile of the baseline's L when it plans ``lead`` >= C ahead, C <= T.

    A chunk's job starts ``lead`` before its boundary, so a condition is shown at the first
    boundary at least ``lead`` after it arrives: L is uniform on [lead, lead + T) (Prop. 1,
    with equality at lead = C). Level 0.5 is both its median and its mean.
    """
    _check_nonnegative(lead=lead)
    _check_positive(T=T)
    _require(0 <= level <= 1, f"level must be in [0, 1], got {level!r}")
    return lead + level * T


def speculative_latency_ideal(C: float, delta: float) -> float:
    """E[L] -> C + δ/2 when a ready prefix exists on arrival (eq. 5; App. A.2)."""
    _check_nonnegative(C=C)
    _check_positive(delta=delta)
    return C + delta / 2


def residual_wait_mean(C: float, T: float) -> float:
    """E[R] = C²/(2T): a worker busy C of every T, uniform arrivals (eq. 6; App. A.3)."""
    _check_nonnegative(C=C)
    _check_positive(T=T)
    _require(C <= T, f"eq. (6) needs C <= T (one worker keeps up); got C={C:g} > T={T:g}")
    return C * C / (2 * T)


def speculative_residual_wait_mean(C: float, T: float, delta: float) -> float:
    """E[R] under latent commitment with refill deferral, fixed C = lead, rare updates.

    Eq. (6)'s C²/(2T) assumes every idle arrival starts its job at once. latsim's controller
    starts a replan only where there is a replaceable future (a branch before the cache end);
    otherwise the refill, due ``lead`` before that position, serves the condition at the same
    slot. L is unchanged (:func:`speculative_latency_mean`), but the wait moves from Q to R:
    idle arrivals whose first feasible slot is the cache end (a window of length
    min(δ, T − C) before each refill) wait for it, adding (T − max(C, T − δ))²/(2T); and when
    ⌈C/δ⌉ = K a busy arrival's replan would also land there, adding (C/T)(T − C).
    """
    base = residual_wait_mean(C, T)
    _check_positive(delta=delta)
    _require(abs(T / delta - round(T / delta)) < 1e-9, "T must be a whole number of slots δ")
    idle = (T - max(C, T - delta)) ** 2 / (2 * T)
    busy = (C / T) * (T - C) if math.ceil(C / delta - 1e-9) >= round(T / delta) else 0.0
    return base + idle + busy


def residual_wait_split(C: float, T: float) -> dict[str, float]:
    """Eq. (6) worked out, Q excluded (App. A.3): an idle arrival waits C; a busy arrival
    (probability C/T) waits C/2 + C on average; the unconditional mean is C + C²/(2T)."""
    residual = residual_wait_mean(C, T)
    return {
        "idle_arrival": C,
        "busy_arrival_mean": 1.5 * C,
        "busy_probability": C / T,
        "unconditional_mean": C + residual,
    }


def speculative_latency_mean(
    C: float, T: float, delta: float, lead: float | None = None
) -> float:
    """E[L] of latent-boundary commitment, fixed C, lead = C, rare updates (DESIGN §2).

    A worker refills C of every T (eq. 6). An idle arrival (probability 1 − C/T) replans at
    once and shows at the first slot starting >= t + C; a busy one waits R (mean C/2), then
    replans as the refill lands on a slot boundary, so its Q is δ·(⌈C/δ⌉ − C/δ): the
    completion phase is not uniform (the paper's remark after eq. 5). Exactly, with
    m = ⌈C/δ⌉ and g = mδ − C:

        E[L] = C + C²/(2T) + [(K − m)·δ²/2 + g²/2 + C·g] / T.

    DESIGN §2 writes the idle term as (1 − C/T)·δ/2, which assumes the idle arrivals' phase is
    uniform over a slot; that is exact when C is a multiple of δ (g = 0) and otherwise exceeds
    this value by g·(δ − g)/(2T).

    With a planning ``lead`` >= C (a live run plans with a quantile of C plus a margin)
    every branch is placed ``lead`` ahead instead of C, and the same derivation gives the
    value above plus (lead − C).
    """
    _check_positive(delta=delta)
    if lead is not None:
        _require(math.isfinite(lead) and lead >= C,
                 f"the lead form needs lead >= C; got lead={lead!r}, C={C!r}")
    _require(delta <= T + 1e-12, f"need δ <= T, got δ={delta:g}, T={T:g}")
    _require(abs(T / delta - round(T / delta)) < 1e-9, "T must be a whole number of slots δ")
    residual = residual_wait_mean(C, T)
    m = math.ceil(C / delta - 1e-9)
    gap = m * delta - C
    K = round(T / delta)
    q_total = (K - m) * delta * delta / 2 + gap * gap / 2 + C * gap
    return C + residual + q_total / T + (0.0 if lead is None else lead - C)


def speculative_latency_segments(C: float, T: float, delta: float,
                                 lead: float | None = None) -> list[tuple[float, float, float]]:
    """The map from an arrival's phase to its L under latent-boundary commitment, fixed C,
    rare updates and a ``lead`` >= C (default C): segments ``(a, b, c)`` on which an
    arrival at phase u in [a, b) of a chunk period waits L = c − u.

    The phase u is measured from a refill's start (which is ``lead`` before its chunk
    boundary). A busy arrival (u < C) replans when the refill lands, at u = C, and shows at
    the first slot at least ``lead`` later: the slot m = ⌈C/δ⌉ after the boundary, so
    c = mδ + lead. An idle one replans at once and shows at the first slot starting at least
    ``lead`` after it: for u in ((k − 1)δ, kδ], c = kδ + lead (a branch at the cache end is
    the refill's, which shows at the same boundary). u is uniform on [0, T) for uniform
    arrivals, so these segments give L's distribution (:func:`speculative_latency_quantile`)
    and its mean, :func:`speculative_latency_mean`."""
    _check_positive(T=T, delta=delta)
    lead = C if lead is None else lead
    _require(math.isfinite(lead) and lead >= C, f"need lead >= C; got lead={lead!r}, C={C!r}")
    _require(C < T, f"the segments need C < T (an idle worker between refills); got C={C:g}")
    _require(abs(T / delta - round(T / delta)) < 1e-9, "T must be a whole number of slots δ")
    m = math.ceil(C / delta - 1e-9)
    segments = [(0.0, C, m * delta + lead)] if C > 0 else []
    for k in range(1, round(T / delta) + 1):
        a, b = max(C, (k - 1) * delta), k * delta
        if b > a:
            segments.append((a, b, k * delta + lead))
    return segments


def speculative_latency_cdf(x: float, C: float, T: float, delta: float,
                            lead: float | None = None) -> float:
    """P(L <= x) under latent-boundary commitment, fixed C, rare updates, a ``lead`` >= C
    (default C), C < T: the share of a chunk period's phases whose L is at most ``x``
    (:func:`speculative_latency_segments`)."""
    return _share_at_most(speculative_latency_segments(C, T, delta, lead), T, x)


def _share_at_most(segments: list[tuple[float, float, float]], T: float,
                   x: float) -> float:
    """The share of a period of length ``T`` whose phase map L = c − u is at most ``x``."""
    return sum(max(0.0, b - max(a, c - x)) for a, b, c in segments) / T


def speculative_latency_quantile(C: float, T: float, delta: float,
                                 level: float, lead: float | None = None) -> float:
    """The ``level`` quantile of L under latent-boundary commitment, fixed C, rare updates,
    a ``lead`` >= C (default C), C < T: the inverse of :func:`speculative_latency_cdf`,
    exact to 1e-12 s by bisection, or to the floats' own spacing where that is coarser (a
    lead of thousands of seconds): it stops when no float lies between the bounds."""
    _require(0 < level < 1, f"level must be in (0, 1), got {level!r}")
    segments = speculative_latency_segments(C, T, delta, lead)
    low = min(c - b for a, b, c in segments)
    high = max(c - a for a, b, c in segments)
    return least_true(lambda x: _share_at_most(segments, T, x) >= level, low, high, 1e-12)


def speculative_latency_mixture_quantile(points: Sequence[tuple[float, float, float]],
                                         T: float, delta: float, level: float) -> float:
    """The ``level`` quantile of L when a condition meets one of several (weight, C, lead)
    cases with those weights (each as :func:`speculative_latency_cdf`; C < T and lead >=
    C in each): the least x whose weighted share of L <= x reaches ``level``, to 1e-9 s."""
    _require(0 < level < 1, f"level must be in (0, 1), got {level!r}")
    total = math.fsum(weight for weight, _, _ in points)
    _require(total > 0, "the cases need a positive total weight")
    cases = [(weight / total, speculative_latency_segments(C, T, delta, lead))
             for weight, C, lead in points if weight > 0]
    low = min(c - b for _, segments in cases for a, b, c in segments)
    high = max(c - a for _, segments in cases for a, b, c in segments)
    return least_true(lambda x: math.fsum(weight * _share_at_most(segments, T, x)
                                          for weight, segments in cases) >= level,
                      low, high, 1e-9)


def speculative_latency_mean_design(C: float, T: float, delta: float) -> float:
    """DESIGN §2's form C + C²/(2T) + (1 − C/T)·δ/2 + (C/T)·δ·(⌈C/δ⌉ − C/δ).

    Equal to :func:`speculative_latency_mean` when C is a multiple of δ, an upper bound on it
    otherwise (see there).
    """
    _check_positive(delta=delta)
    residual = residual_wait_mean(C, T)
    slots = C / delta
    busy_q = delta * (math.ceil(slots - 1e-9) - slots)
    return C + residual + (1 - C / T) * delta / 2 + (C / T) * busy_q


def boundary_wait_reduction(T: float, delta: float) -> float:
    """Predicted mean-latency reduction of latent vs chunk commitment: (T − δ)/2 (§4.3)."""
    _check_positive(T=T, delta=delta)
    _require(delta <= T + 1e-12, f"need δ <= T, got δ={delta:g}, T={T:g}")
    return (T - delta) / 2


def work_amplification(w: float) -> float:
    """Relative DiT work A = 1/(1 − w) for waste fraction w (eq. 7; App. B)."""
    _require(math.isfinite(w) and 0 <= w < 1, f"waste fraction w must be in [0, 1), got {w!r}")
    return 1 / (1 - w)


def work_amplification_independent(K: int, p: float) -> float:
    """A = Kp / (1 − (1−p)^K), independent per-latent updates with probability p (App. B.2).

    p = 0 returns the limit 1.
    """
    _require(isinstance(K, int) and K > 0, f"K must be a positive integer, got {K!r}")
    _require(math.isfinite(p) and 0 <= p <= 1, f"p must be in [0, 1], got {p!r}")
    if p == 0:
        return 1.0
    return K * p / (1 - (1 - p) ** K)


def work_amplification_poisson(rate: float, T: float, delta: float) -> float:
    """A ≈ 1 + λ(T − δ)/2 for Poisson updates with λT ≪ 1 (App. B.2).

    Raises when λT >= 1, where the approximation has no claim.
    """
    _check_nonnegative(rate=rate)
    _check_positive(T=T, delta=delta)
    _require(rate * T < 1, f"the Poisson approximation needs λT << 1; got λT = {rate * T:.3g}")
    return 1 + rate * (T - delta) / 2


def saturated_latency_mean(T: float) -> float:
    """C = T: the worker is always busy, E[R] = T/2, Q = 0, E[L] = 3T/2 (App. A.3)."""
    _check_positive(T=T)
    return 1.5 * T


def stall_fraction(C: float, T: float) -> float:
    """Long-run fraction of time a single worker's player is frozen: max(0, 1 − T/C).

    For C > T one worker produces T seconds of video per C seconds of work.
    """
    _check_positive(C=C, T=T)
    return max(0.0, 1 - T / C)


#: What a simulation's numbers are to be compared with, shown under ``about`` by
#: :func:`summary` (``latsim theory``).
ABOUT: dict[str, str] = {
    "residual_wait_mean": "eq. (6), C²/(2T): every idle arrival's job starts at once",
    "speculative_R_mean": (
        "eq. (6) plus the refill deferral (docs/implementation.md, 'Replans need a "
        "replaceable future'); "
        "compare a simulation's speculative R_mean with this one, not residual_wait_mean "
        "(fixed C = lead <= T, rare updates)"
    ),
}


def summary(K: int, r: int, fps: float, C: float, rate: float | None = None) -> dict:
    """Every closed form for one setting; formulas outside their validity give ``None``
    and a note under ``notes``; ``about`` says which simulated quantity a value is the
    mean of where two are easily confused (R with and without the refill deferral).
    Used by ``latsim theory``: its inputs are range-checked first (:mod:`latsim.errors`), so
    that every value printed is a readable number."""
    from latsim.controller.timing import Timing

    check_int("K", K, 1, MAX_K)
    check_int("r", r, 1, MAX_R)
    check_number("fps", fps, MIN_FPS, MAX_FPS, positive=True)
    check_number("C", C, 0, MAX_SECONDS, unit="s")
    if rate is not None:
        check_number("rate", rate, 0, MAX_RATE, unit="per s")
    timing = Timing(K, r, fps)
    T, delta = timing.T, timing.delta
    notes: dict[str, str] = {}

    def attempt(key: str, fn, *args):
        try:
            return fn(*args)
        except LatsimError as exc:
            notes[key] = str(exc)
            return None

    out: dict = {
        "K": K,
        "r": r,
        "fps": fps,
        "C": C,
        "T": T,
        "delta": delta,
        "baseline_L_lower_bound": baseline_latency_lower_bound(C, T),
        "speculative_L_ideal": speculative_latency_ideal(C, delta),
        "residual_wait_mean": attempt("residual_wait_mean", residual_wait_mean, C, T),
        "speculative_R_mean": attempt(
            "speculative_R_mean", speculative_residual_wait_mean, C, T, delta
        ),
        "speculative_L_mean": attempt(
            "speculative_L_mean", speculative_latency_mean, C, T, delta
        ),
        "boundary_wait_reduction": boundary_wait_reduction(T, delta),
        "L_mean_at_C_equals_T": saturated_latency_mean(T),
        "stall_fraction": stall_fraction(C, T) if C > 0 else 0.0,
    }
    split = attempt("residual_wait_split", residual_wait_split, C, T)
    out["idle_arrival_L_excl_Q"] = split["idle_arrival"] if split else None
    out["busy_arrival_L_excl_Q"] = split["busy_arrival_mean"] if split else None
    out["unconditional_L_excl_Q"] = split["unconditional_mean"] if split else None
    if rate is not None:
        out["rate"] = rate
        out["A_poisson_approx"] = attempt(
            "A_poisson_approx", work_amplification_poisson, rate, T, delta
        )
    out["notes"] = notes
    out["about"] = dict(ABOUT)
    return out


def theory_lines(row: dict) -> dict[str, float | None]:
    """Closed forms at a run's measured mean C (``row["C_measured_mean"]``), its ``T``,
    ``delta`` and ``lead`` (None outside their validity): the baseline's L is uniform on
    [lead, lead + T); the speculative mean is eq. (6) + Q planned ``lead`` ahead
    (:func:`speculative_latency_mean`) and its quantiles those of the phase map
    (:func:`speculative_latency_quantile`). They assume fixed C and rare updates: a
    measured C varies, so they are references, not predictions."""
    C, T, delta, lead = row["C_measured_mean"], row["T"], row["delta"], row["lead"]
    out: dict[str, float | None] = {"baseline_L50": None, "baseline_L95": None,
                                    "speculative_L50": None, "speculative_L95": None,
                                    "speculative_L_mean": None}
    if C is None:
        return out
    if C <= lead:
        out["baseline_L50"] = baseline_latency_quantile(lead, T, 0.5)
        out["baseline_L95"] = baseline_latency_quantile(lead, T, 0.95)
    if C <= T and C <= lead:
        out["speculative_L_mean"] = speculative_latency_mean(C, T, delta, lead)
    if C < T and C <= lead:
        for level, key in ((0.5, "speculative_L50"), (0.95, "speculative_L95")):
            out[key] = speculative_latency_quantile(C, T, delta, level, lead)
    return out
