"""Shared test helpers: build configs and run single traces."""

from __future__ import annotations

import numpy as np

from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.timing import Timing
from latsim.model.costs import CostModel, FixedCost
from latsim.model.traces import Trace
from latsim.sim.simpy_driver import RunRecords, simulate_trace


def run(
    timing: Timing,
    policy: Policy,
    times: list[float] | tuple[float, ...],
    duration: float,
    cost: CostModel | float,
    lead: float | None = None,
    seed: int = 0,
    on_record=None,
) -> RunRecords:
    cost_model = FixedCost(cost) if isinstance(cost, float | int) else cost
    if lead is None:
        lead = cost_model.quantile(timing.K, 0.99)
    config = ControllerConfig(timing, policy, lead)
    records, _ = simulate_trace(
        config, cost_model, Trace("test", tuple(times), duration), duration,
        np.random.default_rng(seed), on_record=on_record,
    )
    return records


def shown_latencies(records: RunRecords, include_superseded: bool = False) -> np.ndarray:
    return np.array([
        c.L for c in records.conditions
        if c.displayed and (include_superseded or not c.superseded)
    ])


POLICIES = (BASELINE, SPECULATIVE)
