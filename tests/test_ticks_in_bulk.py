"""Quiet ticks played in bulk (the serving model's default) give the records of delivering
every tick as its own event on the clock (the reference path), byte for byte: for the
serving model across its property generators, and for the fleet in both of its modes. In
bulk, a refill cycle's events also take the controller's fast paths; the reference path
hands every event to the transition table."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import latsim.sim.serving as serving_module
from latsim.controller import AdaptiveLead, ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.serving import ServingConfig
from latsim.sim.serving import simulate_serving
from tests.test_fleet import fleet, replications
from tests.test_serving import SETTINGS, RecordingCost, inputs, serving_setups


def _both(run):
    """``run(ticks_in_bulk)`` both ways: the pickled records of each."""
    return pickle.dumps(run(True)), pickle.dumps(run(False))


@SETTINGS
@given(setup=serving_setups(), seed=st.integers(0, 1000), network=st.booleans(),
       together=st.booleans(), records=st.sampled_from(["all", "none"]),
       bind=st.sampled_from(["start", "enqueue"]),
       in_flight=st.sampled_from([(1, "let-play"), (2, "let-play"), (2, "flush")]),
       adaptive=st.booleans())
def test_the_serving_model_records_the_same_with_ticks_in_bulk(
        setup, seed, network, together, records, bind, in_flight, adaptive):
    """``together``: every stream joins at once, so ticks of one instant tie across
    streams (they run by stream index); ``network``: a delivery draw per slot, which plays
    every tick as an event either way; ``adaptive``: each stream's lead moves with its
    waits (steps larger than the default, so that it moves a lot)."""
    timing, serving, policy, mean_c, duration, traces, joins = setup
    if not network:
        serving = replace(serving, deliver=None)
    if together:
        joins = [joins[0]] * len(joins)
    if serving.discard == "on-ready":  # it plays the old future while one replan runs
        in_flight = (1, "let-play")
    lead = RecordingCost(mean_c, 0.3).quantile(timing.K, 0.99)
    config = ControllerConfig(timing, policy, lead + (0.1 if adaptive else 0.0),
                              serving.discard, in_flight=in_flight[0],
                              in_flight_policy=in_flight[1], bind=bind,
                              adaptive=AdaptiveLead(lead, 0.8, 2.0) if adaptive else None)

    def run(bulk: bool):  # on the clock (tests/test_bulk.py compares the bulk engine)
        return simulate_serving(config, RecordingCost(mean_c, 0.3), serving,
                                inputs(traces, joins, seed), duration,
                                np.random.default_rng(seed), records=records,
                                ticks_in_bulk=bulk, quiet_in_bulk=False)

    bulk, each = _both(run)
    assert bulk == each


def _overloaded_drain(mean_c: float, joins: list[float], seed: int):
    """Six streams on one device, two chunks in flight, bind at enqueue, cold starts; the
    last stream's four conditions stay open to the drain's limit (the property's cases
    below). Returns ``run(ticks_in_bulk)``."""
    timing = Timing(K=4, r=4, fps=16.0)
    serving = ServingConfig(streams=6, pools=(("dit", 1),), cold_start=True)
    traces = [(), (), (), (), (), (0.6799319039689096, 1.6995290054347743,
                                   1.7193356680238296, 1.7216049947050578)]
    config = ControllerConfig(timing, BASELINE, RecordingCost(mean_c, 0.3).quantile(4, 0.99),
                              "on-start", in_flight=2, in_flight_policy="let-play",
                              bind="enqueue")

    def run(bulk: bool):
        return simulate_serving(config, RecordingCost(mean_c, 0.3), serving,
                                inputs(traces, joins, seed), 2.0,
                                np.random.default_rng(seed), records="all", ticks_in_bulk=bulk)

    return run


def test_a_drain_stopped_at_its_limit_ends_where_each_tick_as_an_event_ends():
    """Found by the property above: an overloaded device leaves one stream's conditions
    open to the drain's limit while five other streams play quiet ticks. Each tick an
    event, the clock ends on the last tick before the limit (and a task running then is
    recorded up to it); in bulk, it ends there too, not on the last other event."""
    run = _overloaded_drain(0.875, [0.0] * 6, 3)
    bulk = run(True)
    assert all(math.isnan(c.L) for c in bulk.streams[5].conditions)  # open to the limit
    assert pickle.dumps(bulk) == pickle.dumps(run(False))


def test_a_stale_queued_tick_stands_where_the_pending_tick_of_its_instant_runs():
    """Found by the property above (the drain's case, one stream later): stream 4's queued
    tick went stale (its ticks turned quiet) but still ran at the time of its pending tick,
    the drain's last instant. Each tick an event, that tick runs there (ticks of an instant
    by stream index) and plays its slot; in bulk the stale event now plays it too."""
    run = _overloaded_drain(0.78125, [0.0] * 5 + [1.0], 234)
    bulk = run(True)
    last = bulk.streams[4].slots.t_start[-1] + bulk.starts[4].t_origin
    assert last == pytest.approx(bulk.end_time)  # its tick of the last instant played
    assert pickle.dumps(bulk) == pickle.dumps(run(False))


def test_a_stale_queued_tick_plays_the_quiet_ticks_of_its_instant_not_yet_caught_up():
    """Found by the property above (2026-12-04): the case before, where the stream's ticks
    before the stale tick's instant were not caught up yet, so its pending tick read as
    earlier than the instant: stream 3's last slot (the drain's last instant) was lost in
    bulk (32 slots against 33). The stale event now catches up through its instant."""
    timing = Timing(K=8, r=4, fps=16.0)
    serving = ServingConfig(streams=6, pools=(("dit", 1),), start="staggered",
                            cold_start=True)
    traces = [(), (), (), (), (), (0.6799319039689096, 1.6995290054347743,
                                   1.7193356680238296, 1.7216049947050578,
                                   2.271947867344106, 3.901888302002491)]
    cost = RecordingCost(1.703125, 0.3)
    config = ControllerConfig(timing, BASELINE, cost.quantile(8, 0.99), "on-start",
                              in_flight=2, in_flight_policy="let-play", bind="enqueue")

    def run(bulk: bool):
        return simulate_serving(config, cost, serving, inputs(traces, [0.0] * 6, 77), 4.0,
                                np.random.default_rng(77), records="all", ticks_in_bulk=bulk)

    bulk = run(True)
    last = bulk.streams[3].slots.t_start[-1] + bulk.starts[3].t_origin
    assert last == pytest.approx(bulk.end_time)
    assert pickle.dumps(bulk) == pickle.dumps(run(False))


def _queued_ticks(monkeypatch) -> list[int]:
    """From now on, each serving run's count of the ticks its ports queued on the clock
    (each port numbers them), appended as the run ends."""
    queued: list[int] = []

    class Counting(serving_module.ServingNode):
        def records(self, *args):
            queued.append(sum(port._queued_id for port in self.ports))
            return super().records(*args)

    monkeypatch.setattr(serving_module, "ServingNode", Counting)
    return queued


@pytest.mark.parametrize("schedule", ["fifo", "least-slack"])
def test_streams_play_most_ticks_in_bulk(schedule, monkeypatch):
    """Not only the same records: at K = 8 with rare conditions, most ticks never reach
    the clock (the event path's: a fifo run like this one the bulk loop plays without
    it)."""
    timing = Timing(8, 4, 16.0)
    streams = 8
    serving = ServingConfig(streams=streams, pools=(("dit", 2),), schedule=schedule)
    traces = [(3.0 + i, 11.0 + i) for i in range(streams)]
    joins = [0.25 * i for i in range(streams)]
    config = ControllerConfig(timing, SPECULATIVE, 1.0)
    queued = _queued_ticks(monkeypatch)
    run = simulate_serving(config, FixedCost(0.4), serving, inputs(traces, joins), 40.0,
                           np.random.default_rng(0), quiet_in_bulk=False)
    played = sum(len(s.slots) for s in run.streams)
    assert played > 1000
    assert queued[0] < played / 3


def test_a_job_with_a_decode_step_queues_no_tick_its_steps_end_before(monkeypatch):
    """With a decode after the DiT step the job's end is known only once the decode
    starts: the tick at the cache's end is looked for up to the DiT step's end, and again
    then. The same records as each tick an event; before, about 1.8 ticks a job reached
    the clock (the stall tick at the cache end, then stale), now fewer than one in three."""
    timing = Timing(8, 4, 16.0)
    streams = 16
    serving = ServingConfig(streams=streams, pools=(("dit", 4), ("vae", 1)),
                            decode=LognormalCost(0.05, 0.5), decode_pool="vae")
    traces = [(3.0 + i, 11.0 + i, 30.0 + i) for i in range(streams)]
    joins = [0.125 * i for i in range(streams)]
    config = ControllerConfig(timing, SPECULATIVE, 1.0)
    queued = _queued_ticks(monkeypatch)
    bulk, each = (simulate_serving(config, FixedCost(0.3), serving, inputs(traces, joins),
                                   60.0, np.random.default_rng(0), records="all",
                                   ticks_in_bulk=in_bulk, quiet_in_bulk=False)
                  for in_bulk in (True, False))
    assert pickle.dumps(bulk) == pickle.dumps(each)
    jobs = sum(len(s.jobs) for s in bulk.streams)
    assert jobs > 400 and queued[0] < jobs / 3, (queued[0], jobs)


def test_quiet_refill_cycles_skip_the_table_only_off_the_reference_path(monkeypatch):
    """A refill cycle's wake-up, device start and job end take the controller's fast paths
    (:meth:`Controller.quiet_wake`, ``quiet_job_started``, ``quiet_job_done``) in bulk, for
    most jobs of a quiet run, and never on the reference path, which the property above
    compares them with."""
    from latsim.controller import Controller

    taken: dict[str, int] = {}

    def counting(name: str):
        original = getattr(Controller, name)

        def counted(self, *args):
            out = original(self, *args)
            if out is not None and out is not False:
                taken[name] = taken.get(name, 0) + 1
            return out
        return counted

    for name in ("quiet_wake", "quiet_job_started", "quiet_job_done"):
        monkeypatch.setattr(Controller, name, counting(name))
    timing = Timing(8, 4, 16.0)
    serving = ServingConfig(streams=6, pools=(("dit", 1),))
    config = ControllerConfig(timing, BASELINE, 1.5)
    joins = [0.05 * i for i in range(6)]  # refills that meet at the device
    runs = {}
    for bulk in (True, False):
        taken.clear()
        runs[bulk] = simulate_serving(config, FixedCost(0.25), serving,
                                      inputs([(5.0,)] * 6, joins), 60.0,
                                      np.random.default_rng(0), ticks_in_bulk=bulk,
                                      quiet_in_bulk=False)  # on the clock
        if bulk:
            counts = dict(taken)
        else:
            assert taken == {}
    jobs = sum(s.jobs_done for s in runs[True].streams)
    assert counts["quiet_wake"] > 0.9 * jobs and counts["quiet_job_done"] > 0.9 * jobs
    assert counts.get("quiet_job_started", 0) > 0  # jobs that waited for the device
    assert pickle.dumps(runs[True]) == pickle.dumps(runs[False])


@pytest.mark.slow  # 11 s on 2 cores
@SETTINGS
@given(rate=st.sampled_from([0.1, 0.3]), nodes=st.integers(1, 3),
       activity=st.sampled_from(["always", "active_idle:15,5"]),
       autoscale=st.booleans(), cold_start=st.booleans(),
       policy=st.sampled_from(["baseline", "speculative"]),
       placement=st.sampled_from(["round-robin", "least-loaded"]),
       rebalance=st.sampled_from([None, 1]), seed=st.integers(0, 2**16))
def test_a_fleet_records_the_same_with_ticks_in_bulk(rate, nodes, activity, autoscale,
                                                       cold_start, policy, placement,
                                                       rebalance, seed, monkeypatch_module):
    fleet_ = {"nodes_initial": 1 if autoscale else nodes, "nodes_max": nodes,
              "autoscale": autoscale, "placement": placement, "cooldown_s": 5,
              "provision_delay_s": 5}
    if rebalance is not None:
        fleet_["rebalance_gap"] = rebalance
    exact = fleet({"arrivals": f"poisson:{rate}", "duration": "exponential:20",
                   "activity": activity, "updates": "poisson:0.3"},
                  {"K": 8, "r": 4, "fps": 16.0, "cost": "lognormal:0.5,0.3",
                   "max_sessions": 3, "cold_start": cold_start, "policy": policy,
                   "pools": "dit=2"},
                  fleet_, {"duration": 90, "seed": seed})
    for run in (exact, replace(exact, mode="sharded")):
        outputs = []
        for bulk in (True, False):
            monkeypatch_module.setattr(serving_module, "TICKS_IN_BULK", bulk)
            outputs.append(pickle.dumps(replications(run, 1)))
        assert outputs[0] == outputs[1]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_a_baseline_stream_on_its_own_device_keeps_the_single_worker_path():
    """A dedicated stream: the reference records, and the single-worker test's premise."""
    timing = Timing(4, 4, 16.0)
    config = ControllerConfig(timing, BASELINE, 0.6)
    serving = ServingConfig()

    def run(bulk: bool):
        return simulate_serving(config, FixedCost(0.5), serving,
                                inputs([(1.0, 5.5, 9.0)], [0.0]), 20.0,
                                np.random.default_rng(3), ticks_in_bulk=bulk)

    bulk, each = _both(run)
    assert bulk == each
