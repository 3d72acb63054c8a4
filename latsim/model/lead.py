"""The planning lead (DESIGN §2): how long before a deadline the controller starts the job.

One rule for both drivers: a quantile of the job time C plus a safety margin
``max(margin_frac × quantile, margin_s)``. The simulator takes the quantile from the cost
model (:data:`SIMULATED`: C's 0.99 quantile, no margin; equal to C for a fixed cost); the live
harness from measured job times (:data:`LIVE`: the same quantile plus a margin for the timing
noise a model of C does not have). The controller plans refills and replans with the same
lead, so the quantile covers every job kind (:meth:`CostModel.quantile`; for a table with
separate replan rows, the larger of the two kinds' quantiles).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from latsim.errors import LatsimError
from latsim.model.costs import CostModel


@dataclass(frozen=True)
class LeadRule:
    """Lead = the ``quantile`` of C + ``max(margin_frac × that quantile, margin_s)``."""

    quantile: float = 0.99
    margin_frac: float = 0.0
    margin_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise LatsimError(f"lead quantile must be in (0, 1], got {self.quantile!r}")
        for name in ("margin_frac", "margin_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise LatsimError(f"lead {name} must be >= 0, got {value!r}")

    def with_margin(self, c_quantile: float) -> float:
        return c_quantile + max(self.margin_frac * c_quantile, self.margin_s)

    def from_cost(self, cost: CostModel, K: int) -> float:  # noqa: N803
        """The lead for chunk size ``K`` under a cost model: its quantile over every job
        kind the controller may start, plus the margin."""
        return self.with_margin(cost.quantile(K, self.quantile))

    def sample_quantile(self, samples: Sequence[float]) -> float:
        """The rule's quantile of measured job times (the smallest sample at or above it,
        so the lead is a time some job actually took)."""
        if not samples:
            raise LatsimError("no job times to set the lead from")
        ordered = sorted(samples)
        index = min(len(ordered) - 1, math.ceil(self.quantile * (len(ordered) - 1)))
        return float(ordered[index])

    def from_samples(self, samples: Sequence[float]) -> float:
        """The lead from measured job times."""
        return self.with_margin(self.sample_quantile(samples))

    def describe(self, source: str, c_quantile: float) -> str:
        """Where a lead came from, for config files."""
        margin = (f" + max({self.margin_frac:g} x q, {self.margin_s:g} s)"
                  if self.margin_frac or self.margin_s else "")
        return f"{source} q{self.quantile:g} ({c_quantile:.6f} s){margin}"


#: The simulator's default: C's 0.99 quantile.
SIMULATED = LeadRule()
#: The live harness's default: measured C's 0.99 quantile plus max(10 %, 5 ms).
LIVE = LeadRule(0.99, 0.10, 0.005)
