"""The planning lead (DESIGN §2): how long before a deadline the controller starts the job.

One rule for both drivers: a quantile of the job time C plus a safety margin

    margin = max(margin_frac × that quantile, margin_s, jitter)

The simulator takes the quantile from the cost model (:data:`SIMULATED`: C's 0.99 quantile,
no margin; equal to C for a fixed cost). The live harness takes it from measured job times
(:data:`LIVE`) and adds a margin for the timing noise a model of C does not have: at least
10 % of the quantile and 5 ms, and at least the **measured player jitter** of the run's
in-run calibration pass (:meth:`LeadRule.jitter`: the ``jitter_quantile`` of its slot-start
lateness, timer fired - due, plus the same quantile of its job dispatch delay, worker start
- controller start). A fixed 5 ms was below the slot-start lateness p99 measured on a loaded
2-core CPU (6.8 ms) and let refills finish after their deadline; the jitter term follows the
machine the measurement runs on. The controller plans refills and replans with the same lead,
so the quantile covers every job kind (:meth:`CostModel.quantile`; for a table with separate
replan rows, the larger of the two kinds' quantiles).

**Streams sharing devices** (``--lead auto``, the serving model's default) add a *wait
budget* ``s`` to that lead: a job that waits longer than ``s`` for a device stalls its
stream by the excess. The budget is the least ``s`` whose excesses, summed over the jobs of
a pilot run of the same configuration, stay within the stall target's share of the pilot's
stream-time (:data:`AUTO_STALL`), with a margin for the pilot's own sampling noise
(:func:`confident_wait_budget`). Summing excesses counts every
job (replans add load the periodic closed forms leave out) and weighs each by how long it
stalls, not only whether it does; it bounds the stall from above where stalls overlap (a
stream already dry is not made drier). The experiment engine runs the pilot
(:func:`latsim.experiments.engine.auto_lead_wait`); ``bench/lead_regimes.py`` measures the
stall it gives across regimes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from latsim.errors import LatsimError
from latsim.model.costs import CostModel
from latsim.numeric import OBSERVED, empirical_quantile, least_true


@dataclass(frozen=True)
class LeadRule:
    """Lead = the ``quantile`` of C + ``max(margin_frac × that quantile, margin_s, jitter)``.

    ``jitter`` is what the driver measured of its own timing noise (0 in simulation, or
    when nothing was measured); :meth:`jitter` reduces measured samples to it with
    ``jitter_quantile`` (``None``: the rule ignores jitter).
    """

    quantile: float = 0.99
    margin_frac: float = 0.0
    margin_s: float = 0.0
    jitter_quantile: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise LatsimError(f"lead quantile must be in (0, 1], got {self.quantile!r}")
        for name in ("margin_frac", "margin_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise LatsimError(f"lead {name} must be >= 0, got {value!r}")
        if self.jitter_quantile is not None and not 0 < self.jitter_quantile <= 1:
            raise LatsimError(
                f"lead jitter quantile must be in (0, 1], got {self.jitter_quantile!r}")

    def margin(self, c_quantile: float, jitter_s: float = 0.0) -> float:
        """The safety margin added to ``c_quantile``."""
        if not (math.isfinite(jitter_s) and jitter_s >= 0):
            raise LatsimError(f"lead jitter must be >= 0 seconds, got {jitter_s!r}")
        return max(self.margin_frac * c_quantile, self.margin_s, jitter_s)

    def with_margin(self, c_quantile: float, jitter_s: float = 0.0) -> float:
        return c_quantile + self.margin(c_quantile, jitter_s)

    def from_cost(self, cost: CostModel, K: int) -> float:
        """The lead for chunk size ``K`` under a cost model: its quantile over every job
        kind the controller may start, plus the margin."""
        return self.with_margin(cost.quantile(K, self.quantile))

    def sample_quantile(self, samples: Sequence[float]) -> float:
        """The rule's quantile of measured job times (the smallest sample at or above it,
        so the lead is a time some job actually took)."""
        if not samples:
            raise LatsimError("no job times to set the lead from")
        return empirical_quantile(samples, self.quantile, OBSERVED)

    def from_samples(self, samples: Sequence[float], jitter_s: float = 0.0) -> float:
        """The lead from measured job times (and the measured jitter)."""
        return self.with_margin(self.sample_quantile(samples), jitter_s)

    def jitter(self, lateness: Sequence[float], dispatch: Sequence[float]) -> float:
        """The driver's measured timing noise: the ``jitter_quantile`` of the slot-start
        lateness samples plus the same quantile of the job dispatch delays (seconds; an
        empty list counts 0, negative samples count 0). 0 if the rule ignores jitter."""
        if self.jitter_quantile is None:
            return 0.0
        total = 0.0
        for samples in (lateness, dispatch):
            if samples:
                total += max(0.0, empirical_quantile(samples, self.jitter_quantile,
                                                     OBSERVED))
        return total

    def describe(self, source: str, c_quantile: float, jitter_s: float | None = None) -> str:
        """Where a lead came from, for config files (``jitter_s``: the measured jitter,
        ``None`` when none was measured)."""
        parts = []
        if self.margin_frac or self.margin_s:
            parts += [f"{self.margin_frac:g} x q", f"{self.margin_s:g} s"]
        if self.jitter_quantile is not None:
            parts.append("no jitter measured" if jitter_s is None
                         else f"jitter {jitter_s * 1e3:.3f} ms")
        margin = f" + max({', '.join(parts)})" if parts else ""
        lead = self.with_margin(c_quantile, jitter_s or 0.0)
        return f"{source} q{self.quantile:g} ({c_quantile:.6f} s){margin} = {lead:.6f} s"


#: The simulator's default: C's 0.99 quantile.
SIMULATED = LeadRule()
#: The live harness's default: measured C's 0.99 quantile plus max(10 %, 5 ms, the measured
#: jitter: p99 slot-start lateness + p99 job dispatch delay of the calibration pass).
LIVE = LeadRule(0.99, 0.10, 0.005, jitter_quantile=0.99)


#: The viewer stall ``--lead auto`` aims at: a fraction of the time (0.1 %).
AUTO_STALL = 0.001
#: An auto pilot run covers at least this many stream-seconds (so that the tail the target
#: reads holds more than a handful of jobs), and lasts from PILOT_MIN_S to PILOT_MAX_S.
PILOT_STREAM_S = 4800.0
PILOT_MIN_S = 120.0
PILOT_MAX_S = 1200.0
#: The pilot is cut into this many equal spans of time, whose excess-wait sums give the
#: sampling noise (batch means), and the budget holds at this many standard errors above
#: their mean (one-sided 95 %).
PILOT_BATCHES = 10
PILOT_Z = 1.645


#: A run pays for its auto pilot at most this share of its own stream-seconds, where its
#: pool can be divided that far (:func:`pilot_divisor`).
PILOT_SHARE = 0.1


def pilot_seconds(streams: int) -> float:
    """How long the auto pilot run of ``streams`` streams lasts (s)."""
    return min(PILOT_MAX_S, max(PILOT_MIN_S, PILOT_STREAM_S / streams))


def pilot_stream_seconds(streams: int) -> float:
    """What an auto pilot run of ``streams`` streams costs, in stream-seconds."""
    return streams * pilot_seconds(streams)


def pilot_divisor(streams: int, divisors: Sequence[int], run_stream_s: float | None) -> int:
    """The k (one of ``divisors``, each dividing ``streams``) for which a pilot on 1/k of
    the pool, ``streams/k`` streams on 1/k of every pool's devices, costs at most
    :data:`PILOT_SHARE` of a run of ``run_stream_s`` stream-seconds: the least such k, as
    the whole pool's waits are the pilot's aim. None of them costs less than the pilot's
    minimum, :data:`PILOT_STREAM_S` (or ``streams`` × :data:`PILOT_MAX_S` below 4 streams),
    which is always allowed; where no divisor gets down to the allowance, the cheapest.
    ``run_stream_s`` None: the whole pool (1).

    Fewer devices sharing a queue at the same load wait longer, not shorter (the sharing
    gain grows with the pool), so a part's budget covers the whole pool's stall target at
    the price of a longer lead."""
    if run_stream_s is None:
        return 1
    allowed = max(PILOT_SHARE * run_stream_s, PILOT_STREAM_S)
    ordered = sorted(set(divisors) | {1})
    fitting = [k for k in ordered if pilot_stream_seconds(streams // k) <= allowed]
    if fitting:
        return fitting[0]
    return min(ordered, key=lambda k: (pilot_stream_seconds(streams // k), k))


def confident_wait_budget(batches: Sequence[Sequence[float]], budget: float,
                          z: float = PILOT_Z) -> float:
    """The least wait budget ``s`` >= 0 (s, to 1e-6) at which the mean over ``batches`` of
    Σ (W − s)+, plus ``z`` standard errors of that mean (batch means), is at most
    ``budget`` (seconds of stall per batch): the pilot's tail is a handful of jobs, so the
    budget must hold beyond its own sampling noise. With one batch it is
    :func:`stall_targeted_wait`."""
    if len(batches) < 2:
        return stall_targeted_wait(batches[0] if batches else (), budget)
    if not (math.isfinite(budget) and budget >= 0):
        raise LatsimError(f"stall budget must be a finite number >= 0, got {budget!r}")
    count = len(batches)

    def bound(s: float) -> float:
        excess = [sum(w - s for w in batch if w > s) for batch in batches]
        mean = sum(excess) / count
        spread = sum((e - mean) ** 2 for e in excess) / (count - 1)
        return mean + z * math.sqrt(spread / count)

    low, high = 0.0, max((max(batch, default=0.0) for batch in batches), default=0.0)
    if bound(low) <= budget:
        return 0.0
    # bound(high) is 0: no job waits longer than high
    return least_true(lambda s: bound(s) <= budget, low, high, 1e-6)


def stall_targeted_wait(waits: Sequence[float], budget: float) -> float:
    """The least wait budget ``s`` >= 0 with Σ (W − s)+ <= ``budget`` over ``waits`` (s):
    exact on the piecewise-linear sum."""
    if not (math.isfinite(budget) and budget >= 0):
        raise LatsimError(f"stall budget must be a finite number >= 0, got {budget!r}")
    ordered = sorted((w for w in waits if w > 0), reverse=True)
    total = 0.0
    for k, wait in enumerate(ordered, start=1):
        total += wait
        below = ordered[k] if k < len(ordered) else 0.0
        s = (total - budget) / k  # the sum on [below, wait] is total − k·s
        if s >= below:
            return max(s, 0.0)
    return 0.0
