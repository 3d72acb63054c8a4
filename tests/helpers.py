"""Shared test helpers: build configs and run single traces."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from latsim.analysis.fidelity import error_pct
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
    replan_at_cache_end: str = "defer",
) -> RunRecords:
    cost_model = FixedCost(cost) if isinstance(cost, float | int) else cost
    if lead is None:
        lead = cost_model.quantile(timing.K, 0.99)
    config = ControllerConfig(timing, policy, lead, replan_at_cache_end=replan_at_cache_end)
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


# ---------------------------------------------------------------- live runs vs the simulator

#: A job the live run started but never finished: in the replay it never finishes either.
NEVER = 1e9


class ReplayCost:
    """Cost model replaying given job durations in start order (job ids 1, 2, ...); jobs
    beyond the list never finish. Re-simulates a live run with the job times it measured."""

    spec = "replay"
    deterministic = False

    def __init__(self, costs: list[float] | tuple[float, ...]) -> None:
        self.costs = tuple(costs)
        self._next = 0

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        i, self._next = self._next, self._next + 1
        return self.costs[i] if i < len(self.costs) else NEVER

    def mean(self, K: int) -> float:
        return float(np.mean(self.costs))

    def quantile(self, K: int, level: float) -> float:
        return float(np.quantile(self.costs, level))


def _when(event) -> float:
    """The time an event of the live driver stood for: due (timers, arrivals) or happened."""
    return event.happened if event.scheduled is None else event.scheduled


def comparable_horizon(driver, result) -> float:
    """Up to when a live run's controller saw exactly the input a simulation would give it.

    The live driver hands each event to the controller at the time it stood for, unless an
    event with a later time was handled first (it then gets that later time: a reordering,
    from timer or thread jitter beyond the gap between two events). Before the earliest
    reordered event the controller's input is the simulator's, given the same job times.
    The run also ends on the wall clock, so events due in the last chunk may go unhandled
    when they are late: the horizon stays a chunk plus the run's worst handling lag clear of
    the end of the window. Everything here comes from the run's own event timings.
    """
    events = result.events
    reordered = [_when(e) for e in events if e.now > _when(e)]
    lag = max((e.handled - _when(e) for e in events), default=0.0)
    end = driver.window.duration - driver.config.timing.T - lag
    return min([end, *reordered])


def replay_costs(result) -> list[float]:
    """Each started job's duration as the live controller saw it (``t_ready - t_start``,
    dispatch and hand-back delays included), in job order; NEVER for unfinished jobs."""
    seen = {j.job_id: j.t_ready - j.t_start for j in result.records.jobs if j.job_id > 0}
    return [seen.get(job_id, NEVER) for job_id in sorted(result.job_starts)]


def _same(a, b, tol: float = 1e-9) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (np.isnan(a) and np.isnan(b)) or abs(a - b) <= tol
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b, strict=True))
    return a == b


def _before(records: RunRecords, starts: dict[int, float], horizon: float) -> dict:
    """What a run had decided before ``horizon``, as plain tuples."""
    conditions = []
    for c in records.conditions:
        if c.t_arrival < horizon:
            shown = c.displayed and c.t_play < horizon
            conditions.append((c.version, c.t_arrival) + (
                (c.job_id, c.t_start, c.t_ready, c.t_play, c.L, c.superseded) if shown else ()))
    return {
        "job starts": [(i, t) for i, t in sorted(starts.items()) if t < horizon],
        "jobs": [(j.job_id, j.kind, j.branch, j.length, j.version, j.context, j.t_start,
                  j.t_ready) for j in records.jobs if j.t_ready < horizon],
        "slots": [(s.position, s.version, s.job_id, s.t_start) for s in records.slots
                  if s.t_start < horizon],
        "stalls": [(s.position, s.t_start) + ((s.t_end,) if s.t_end < horizon else ())
                   for s in records.stalls if s.t_start < horizon],
        "discards": [(d.job_id, d.first, d.count, d.t, d.by_version) for d in records.discards
                     if d.t < horizon],
        "conditions": conditions,
    }


def assert_live_run_matches_simulation(driver, result) -> float:
    """A live run (``harness.live.driver.LiveDriver`` and its result) against the simulator fed the
    job times the run measured: every record before :func:`comparable_horizon` must agree
    (to 1e-9 s). Also checks that each job's generator interval lies inside the controller's
    ``[t_start, t_ready]``. Returns the horizon."""
    records = result.records
    sim, _ = simulate_trace(driver.config, ReplayCost(replay_costs(result)), driver.trace,
                            driver.window.duration, np.random.default_rng(0),
                            drain=driver.window.drain)
    horizon = comparable_horizon(driver, result)
    live_view = _before(records, result.job_starts, horizon)
    sim_view = _before(sim, {b.job_id: b.t_start for b in sim.busy}, horizon)
    for name, ours in live_view.items():
        theirs = sim_view[name]
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False))
                     if not _same(a, b)), min(len(ours), len(theirs)))
        assert _same(ours, theirs), (
            f"{name} before t={horizon:.3f} s differ at #{diff}: live "
            f"{ours[diff:diff + 2]} vs simulated {theirs[diff:diff + 2]}")
    ctrl = {j.job_id: j for j in records.jobs}
    for b in records.busy:
        if b.job_id in ctrl:
            job = ctrl[b.job_id]
            assert job.t_start - 1e-9 <= b.t_start <= b.t_end <= job.t_ready + 1e-9, (job, b)
    return horizon


class HookedGenerator:
    """The generator, with ``hook(job)`` called in the generator thread before each job once
    armed (tests arm it in ``on_driver``, after warm-up and calibration)."""

    def __init__(self, generator: object) -> None:
        self._generator = generator
        self.hook = None

    def __getattr__(self, name: str):
        return getattr(self._generator, name)

    def run_job(self, job, decode_group: int = 1):
        if self.hook is not None:
            self.hook(job)
        return self._generator.run_job(job, decode_group)


ENVELOPE_SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "envelope.schema.json"


def envelope_of(text: str) -> dict:
    """A command's JSON output, checked against the envelope's schema (docs/envelope.md)."""
    import jsonschema

    payload = json.loads(text)
    jsonschema.validate(payload, json.loads(ENVELOPE_SCHEMA.read_text()))
    return payload


def rows_of(text: str) -> list[dict]:
    """The ``rows`` of a command's JSON envelope."""
    return envelope_of(text)["rows"]


def row_of(text: str) -> dict:
    """The one row of a command's JSON envelope."""
    rows = rows_of(text)
    assert len(rows) == 1, f"expected one row, got {len(rows)}"
    return rows[0]


#: A small fleet file (two nodes of three sessions, 2 x 300 s): seconds to run.
SMALL_FLEET = """
[workload]
arrivals = "poisson:0.1"
duration = "exponential:30"
updates = "poisson:0.2"

[node]
K = 4
r = 8
fps = 8
cost = "fixed:0.2"
pools = "dit=1"
max_sessions = 3

[fleet]
nodes_initial = 2
nodes_max = 2
usd_per_gpu_hour = 2.5

[run]
duration = 300
seeds = 2
"""

#: A small grid file (K = 4, 8; 2 seeds of 20 s).
SMALL_GRID = """
name = "tiny"
seeds = 2
metrics = ["L50", "stall_pct"]

[fixed]
duration = 20

[axes]
K = [4, 8]
"""


# ---------------------------------------------------------------- fuzz strategies


@functools.cache
def time_step_strategy(K: int, delta: float, T: float) -> st.SearchStrategy[float]:
    """A fuzz time step: 0, a multiple of half a slot (boundaries), or anything up to 2 T.
    Cached: hypothesis validates a new strategy object on its first draw, and building
    one per draw cost the controller fuzz a fifth of its time."""
    return st.one_of(st.just(0.0), st.integers(1, 4 * K).map(lambda k: k * delta / 2),
                     st.floats(0.0, 2 * T, allow_nan=False))


@functools.cache
def lateness_strategy(T: float) -> st.SearchStrategy[float]:
    """How late a fuzzed timer fires: on time or by up to T."""
    return st.one_of(st.just(0.0), st.floats(0.0, T))


def error_to_band(row: dict, metric: str) -> float:
    """How far the measured value lies outside the range that one run shows across the
    prediction's replications (0 inside it): % of the measured value, or percentage points
    for a stall %. One run's L50 over a few conditions is quantized by the job schedule (a
    condition landing just after a job start waits a whole cycle more), so it is compared
    with what one run of the prediction gives, not with the pooled median alone."""
    measured = row[f"{metric}_measured"]
    nearest = min(max(measured, row[f"{metric}_predicted_lo"]), row[f"{metric}_predicted_hi"])
    if metric.endswith("pct"):
        return abs(nearest - measured)
    return abs(error_pct(measured, nearest))
