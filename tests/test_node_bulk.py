"""A sharded fleet node's plan played by the bulk loop (:func:`latsim.sim.bulk.
simulate_node_in_bulk`) gives what the clock gives (:func:`latsim.sim.fleet.
simulate_node_plan` with ``NODES_IN_BULK`` off, the reference), byte for byte, over
generated plans: segments that join at their request times, with or without a cold start,
leave after their length (their steps still waiting dropped, one running finished), and a
node's run that ends at its horizon with no drain."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import latsim.sim.bulk as bulk_module
import latsim.sim.fleet as fleet_module
from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.timing import Timing
from latsim.experiments.executors import gc_paused
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.fleet import FleetSpec, NodeSpec
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.run.stream import StreamRun
from latsim.sim.fleet import FleetSetup, PlannedSegment, simulate_node_plan
from latsim.sim.serving import StreamInput
from tests.test_serving import SETTINGS


def _inputs(seed: int, rate: float):
    """``InputsFor``: each segment's own random streams; its arrivals from its log, else
    Poisson at ``rate`` a second over its length."""

    def inputs(segment: int, join: float, length: float,
               conditions: tuple[float, ...] | None = None) -> StreamInput:
        root = np.random.SeedSequence(seed, spawn_key=(segment,))
        arrivals, cost, *stages = root.spawn(6)
        if conditions is None and not rate:
            conditions = ()
        elif conditions is None:
            draw = np.random.default_rng(arrivals)
            times = np.cumsum(draw.exponential(1 / rate, int(2 * rate * length) + 8))
            conditions = tuple(float(t) for t in times if t < length)
        return StreamInput(Trace("log", conditions, length), join,
                           np.random.default_rng(cost),
                           tuple(np.random.default_rng(s) for s in stages))

    return inputs


@st.composite
def node_plans(draw):
    """A node (its policy, lead, pools, decode stage, cold start) and a plan of segments in
    request order, some of them leaving before the horizon and some joining after it."""
    timing = Timing(draw(st.sampled_from([4, 8])), 4, 16.0)  # δ = 0.25 s
    mean_c = draw(st.floats(0.2, 0.9)) * timing.T
    cost = draw(st.sampled_from([FixedCost(mean_c), LognormalCost(mean_c, 0.4)]))
    policy = draw(st.sampled_from([BASELINE, SPECULATIVE]))
    lead = cost.quantile(timing.K, 0.99) + draw(st.floats(0.0, 1.5)) * timing.T
    config = ControllerConfig(timing, policy, lead)
    devices = draw(st.integers(1, 3))
    degree = draw(st.sampled_from([1, devices]))
    decode = draw(st.sampled_from([None, FixedCost(0.05), LognormalCost(0.05, 0.5)]))
    pools = (("dit", devices),) if decode is None else (("dit", devices), ("vae", 1))
    serving = ServingConfig(streams=1, pools=pools, dit_degree=degree, decode=decode,
                            cold_start=draw(st.booleans()))
    count = draw(st.integers(1, 7))
    spread = draw(st.sampled_from([3.0, 4.0 * timing.T]))  # crowded, or a period or more
    # a gap of 0: segments that join at one instant (now and then the first, at time 0:
    # the clock plays that plan)
    first = 0.0 if draw(st.integers(0, 9)) == 0 else draw(st.floats(0.01, spread))
    gaps = [first] + draw(st.lists(st.just(0.0) | st.floats(0.01, spread),
                                   min_size=count - 1, max_size=count - 1))
    requests = np.cumsum(gaps).tolist()
    horizon = requests[-1] * draw(st.floats(0.6, 1.5)) + draw(st.floats(1.0, 30.0))
    plan = [PlannedSegment(index, at, draw(st.floats(0.5, 40.0)),
                           draw(st.sampled_from([None, None, (), (0.3, 2.0, 2.1)])))
            for index, at in enumerate(requests)]
    node = NodeSpec(timing.K, None, policy.name, lead, timing.r, timing.fps, serving, 4)
    setup = FleetSetup(config, cost, node, FleetSpec(), horizon, False,
                       records=draw(st.sampled_from(["all", "conditions", "none"])),
                       mode="sharded")
    return setup, plan, draw(st.sampled_from([0.0, 0.1, 0.5]))


def _plays(setup, plan, rate, seed, monkeypatch):
    """The plan's play in bulk and on the clock (pickled), and whether the loop kept it."""
    kept: list[bool] = []
    original = bulk_module.simulate_node_in_bulk

    def watching(*args, **kwargs):
        out = original(*args, **kwargs)
        kept.append(out is not None)
        return out

    def play(in_bulk: bool) -> bytes:
        monkeypatch.setattr(fleet_module, "NODES_IN_BULK", in_bulk)
        return pickle.dumps(simulate_node_plan(setup, 0, plan, _inputs(seed, rate),
                                               np.random.default_rng(seed)))

    monkeypatch.setattr(fleet_module, "simulate_node_in_bulk", watching)
    return play(True), play(False), kept == [True]


@SETTINGS
@given(setup=node_plans(), seed=st.integers(0, 1000))
def test_a_node_plan_in_bulk_plays_what_the_clock_plays(setup, seed):
    with pytest.MonkeyPatch.context() as monkeypatch:
        in_bulk, on_clock, kept = _plays(*setup, seed, monkeypatch)
    event("the loop kept it" if kept else "the clock played it")
    assert in_bulk == on_clock


def test_a_node_whose_sessions_come_and_go_stays_in_the_loop(monkeypatch):
    """Latent commitment on one device with a cold start: a segment leaves while another's
    step waits behind its job, one joins too late to start by the horizon, and one after
    it; the loop keeps the whole plan, with the clock's records."""
    timing = Timing(8, 4, 16.0)
    cost = FixedCost(0.6)
    config = ControllerConfig(timing, SPECULATIVE, 1.5)
    serving = ServingConfig(streams=1, pools=(("dit", 1),), cold_start=True)
    node = NodeSpec(8, None, "speculative", 1.5, 4, 16.0, serving, 4)
    setup = FleetSetup(config, cost, node, FleetSpec(), 40.0, False, mode="sharded")
    plan = [PlannedSegment(0, 0.5, 12.3), PlannedSegment(1, 0.7, 30.0),
            PlannedSegment(2, 2.0, 9.0), PlannedSegment(3, 39.9, 5.0),
            PlannedSegment(4, 41.0, 5.0)]
    in_bulk, on_clock, kept = _plays(setup, plan, 0.5, 3, monkeypatch)
    assert kept
    assert in_bulk == on_clock
    play = pickle.loads(in_bulk)
    assert play.ends[0] == 0.5 + 0.6 + 12.3 < 40.0  # left before the horizon
    assert np.isnan(play.starts[3]) and np.isnan(play.starts[4])  # never started
    assert len(play.records.streams) == 4  # the last never joined


def _a_full_node(records: str = "none", policy: Policy = SPECULATIVE):
    """Latent commitment (or ``policy``) on one device shared by 4 sessions over 10
    minutes (ρ ≈ 0.8, one condition every 10 s a session, a cold start): the fleet
    bench's node, shorter."""
    timing = Timing(8, 4, 16.0)
    config = ControllerConfig(timing, policy, 1.5)
    serving = ServingConfig(streams=1, pools=(("dit", 1),), cold_start=True)
    node = NodeSpec(8, None, policy.name, 1.5, 4, 16.0, serving, 4)
    setup = FleetSetup(config, FixedCost(0.4), node, FleetSpec(), 600.0, False,
                       records=records, mode="sharded")
    plan = [PlannedSegment(index, 0.3 + 0.7 * index, 599.0) for index in range(4)]
    return setup, plan


@pytest.mark.parametrize("policy", [SPECULATIVE, BASELINE])
def test_between_conditions_a_nodes_streams_coast(policy, monkeypatch):
    """Most of a full node's jobs are played by the loop's arithmetic and handed to their
    controllers in whole stretches (``play_quiet_cycles``), not event by event; the records
    are the clock's. Under the baseline every one is: a condition moves no job, so a
    stream coasts on from its arrival with the version pending (the next job asked for
    binds it), where under latent commitment the replan goes through the table."""
    handed: list[int] = []
    original = StreamRun.play_quiet_cycles

    def counting(self, ticks, jobs, took):
        first = original(self, ticks, jobs, took)
        handed.append(len(jobs) - 1)  # the jobs done in the stretch
        return first

    monkeypatch.setattr(StreamRun, "play_quiet_cycles", counting)
    setup, plan = _a_full_node(policy=policy)
    in_bulk, on_clock, kept = _plays(setup, plan, 0.1, 7, monkeypatch)
    assert kept
    assert in_bulk == on_clock
    done = sum(run.jobs_done for run in pickle.loads(in_bulk).records.streams)
    assert done > 4 * 599 / 2 * 0.9  # a refill every chunk period (2 s), about
    assert sum(handed) == done if policy is BASELINE else sum(handed) > 0.6 * done


def test_a_refill_a_tick_starts_after_a_stall_stays_in_the_loop(monkeypatch):
    """After a stall a stream's ticks fall off its refill's due grid, and a tick within EPS
    before the armed due time starts the refill itself, before the wake-up. The loop plays
    ticks at the stream's next event (here that wake-up), behind its clock; where it has
    played no event since the tick, the pools are as they were then, and it queues the job
    there as the clock does: the run stays in the loop, with the clock's records (it was
    given back to the clock whole)."""
    from latsim.sim.bulk_replay import OnlineStream

    started_by_ticks: list[int] = []
    start_job = OnlineStream.start_job

    def watching(self, job, now):
        if self.ticking:
            started_by_ticks.append(job.job_id)
        return start_job(self, job, now)

    monkeypatch.setattr(OnlineStream, "start_job", watching)
    timing = Timing(8, 4, 16.0)
    config = ControllerConfig(timing, SPECULATIVE, 0.75)
    serving = ServingConfig(streams=1, pools=(("dit", 1),), cold_start=True)
    node = NodeSpec(8, None, "speculative", 0.75, 4, 16.0, serving, 4)
    setup = FleetSetup(config, LognormalCost(0.5, 0.3), node, FleetSpec(), 600.0, False,
                       records="all", mode="sharded")
    plan = [PlannedSegment(index, 0.3 + 0.7 * index, 599.0) for index in range(4)]
    in_bulk, on_clock, kept = _plays(setup, plan, 0.002, 0, monkeypatch)
    assert started_by_ticks and kept
    assert in_bulk == on_clock


def test_a_node_run_leaves_no_cycles_for_the_collector():
    """Once a node's records are taken, its drivers let go of their runs and the loop: the
    run is freed by reference counting as it is dropped, with nothing left for the cyclic
    collector to walk (which a sharded node's records made 3% of a fleet)."""
    setup, plan = _a_full_node("conditions")

    def play():
        return simulate_node_plan(setup, 0, plan, _inputs(7, 0.1),
                                  np.random.default_rng(1)).records

    play()  # once first: what a first call imports or caches is not the run's
    gc.collect()
    with gc_paused():
        records = play()
        assert sum(len(run.conditions) for run in records.streams) > 100
        del records
        assert gc.collect() == 0


def test_a_hand_back_the_controller_refuses_gives_the_run_to_the_clock(monkeypatch):
    """Where a controller does not take a coasting stretch (``play_quiet_cycles`` says 0),
    the loop gives the node's run back: the clock plays it, from the random streams as they
    were."""
    monkeypatch.setattr(StreamRun, "play_quiet_cycles", lambda self, ticks, jobs, took: 0)
    setup, plan = _a_full_node("all")
    in_bulk, on_clock, kept = _plays(setup, plan, 0.1, 7, monkeypatch)
    assert not kept
    assert in_bulk == on_clock
