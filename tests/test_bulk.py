"""Quiet serving runs played in bulk (:mod:`latsim.sim.bulk`) give the records of the event
path, byte for byte, over generated setups; where a run is not quiet throughout, the bulk
path gives it back with its random streams as it found them."""

from __future__ import annotations

import copy
import heapq
import math
import pickle
from dataclasses import replace
from itertools import count

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import latsim.sim.bulk as bulk_module
import latsim.sim.bulk_numpy as bulk_numpy
from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.records import SlotTally
from latsim.controller.timing import Timing
from latsim.model.costs import AffineCost, FixedCost, LognormalCost
from latsim.model.serving import ServingConfig
from latsim.run.records import RunWindow
from latsim.run.stream import StreamRun
from latsim.sim.serving import simulate_serving
from tests.test_serving import SETTINGS, RecordingCost, inputs


def _quiet_inputs(n: int, joins: list[float], seed: int):
    return inputs([()] * n, joins, seed)


def _joins(draw, start: str, n: int, timing: Timing) -> list[float]:
    """``n`` streams' join times: drawn within a chunk's time, all at 0, or evenly apart."""
    if start == "random":
        return [draw(st.floats(0.0, timing.T)) for _ in range(n)]
    return [0.0] * n if start == "together" else [s * timing.T / n for s in range(n)]


@st.composite
def quiet_setups(draw):
    """A run :func:`latsim.sim.bulk.bulk_refusal` accepts: no condition, a FIFO DiT pool
    (devices, USP groups) and maybe a decode pool (a decode of no time included: it ends
    without an event), the lead anywhere from loose to tight, so that some runs stall (those
    the bulk path gives back)."""
    timing = Timing(draw(st.sampled_from([2, 4, 8])), 4, 16.0)
    n = draw(st.integers(1, 8))
    degree = draw(st.sampled_from([1, 1, 2]))
    devices = degree * draw(st.integers(1, 3))
    cost = draw(st.sampled_from(["fixed", "lognormal", "recording"]))
    mean_c = draw(st.floats(0.05, 1.0)) * timing.T * devices / degree / n * 2
    model = {"fixed": FixedCost(mean_c), "lognormal": LognormalCost(mean_c, 0.5),
             "recording": RecordingCost(mean_c, 0.3)}[cost]
    joins = _joins(draw, draw(st.sampled_from(["random", "together", "staggered"])), n,
                   timing)
    lead = model.quantile(timing.K, 0.99) + draw(st.floats(0.0, 2.0)) * timing.T
    config = ControllerConfig(timing, draw(st.sampled_from([BASELINE, SPECULATIVE])), lead,
                              run_ahead=draw(st.sampled_from([0.0, 0.0, 0.25])))
    decode = draw(st.sampled_from([None, FixedCost(0.0), FixedCost(0.05),
                                   LognormalCost(0.05, 0.5)]))
    pools = (("dit", devices),) if decode is None else (
        ("dit", devices), ("vae", draw(st.integers(1, 2))))
    serving = ServingConfig(streams=n, pools=pools, dit_degree=degree, decode=decode)
    duration = timing.T * draw(st.floats(2.0, 12.0))
    return config, model, serving, joins, duration


@SETTINGS
@given(setup=quiet_setups(), seed=st.integers(0, 1000),
       records=st.sampled_from(["all", "conditions", "none"]))
def test_a_quiet_run_in_bulk_records_what_the_event_path_records(setup, seed, records):
    config, model, serving, joins, duration = setup

    def run(in_bulk: bool):
        return pickle.dumps(simulate_serving(
            config, model, serving, _quiet_inputs(len(joins), joins, seed), duration,
            np.random.default_rng(seed), records=records, quiet_in_bulk=in_bulk))

    assert run(True) == run(False)


def _played_in_bulk(monkeypatch) -> list[bool]:
    """From now on, whether each run the serving model tried in bulk stayed there (True)
    or was given back (False), as they finish."""
    outcomes: list[bool] = []
    original = bulk_module.simulate_quiet_serving

    def watching(*args, **kwargs):
        out = original(*args, **kwargs)
        outcomes.append(out is not None)
        return out

    monkeypatch.setattr("latsim.sim.serving.simulate_quiet_serving", watching)
    return outcomes


@pytest.mark.parametrize("start", ["random", "together", "staggered"])
@pytest.mark.parametrize("records", ["all", "none"])
def test_a_loaded_pool_without_stalls_is_played_in_bulk(start, records, monkeypatch):
    """Twelve streams on three devices at ρ ≈ 0.6 with a lead that covers the queue: the
    run stays in bulk (no event path behind it) and records what the event path does, with
    ties across streams where they join together or a fixed fraction of T apart."""
    timing = Timing(8, 4, 16.0)
    n = 12
    joins = {"random": np.random.default_rng(5).uniform(0, timing.T, n).tolist(),
             "together": [0.0] * n,
             "staggered": [s * timing.T / n for s in range(n)]}[start]
    model = LognormalCost(0.3, 0.3) if start == "random" else FixedCost(0.3)
    config = ControllerConfig(timing, SPECULATIVE, 1.6)
    serving = ServingConfig(streams=n, pools=(("dit", 3),))
    outcomes = _played_in_bulk(monkeypatch)
    runs = [simulate_serving(config, model, serving, _quiet_inputs(n, joins, 7), 60.0,
                             np.random.default_rng(0), records=records, quiet_in_bulk=q)
            for q in (True, False)]
    assert outcomes == [True]
    assert pickle.dumps(runs[0]) == pickle.dumps(runs[1])
    assert sum(s.jobs_done for s in runs[0].streams) > 300
    assert not any(s.stalls for s in runs[1].streams)


def test_a_decode_stage_is_played_in_bulk_too(monkeypatch):
    """DiT on eight devices, then decode on two: each job's two steps, the decode queued
    when the DiT step ends; the same records as the event path, in bulk."""
    timing = Timing(8, 4, 16.0)
    n = 16
    joins = np.random.default_rng(2).uniform(0, timing.T, n).tolist()
    serving = ServingConfig(streams=n, pools=(("dit", 8), ("vae", 2)),
                            decode=LognormalCost(0.05, 0.5))
    config = ControllerConfig(timing, BASELINE, 1.5)
    outcomes = _played_in_bulk(monkeypatch)
    runs = [simulate_serving(config, LognormalCost(0.6, 0.3), serving,
                             _quiet_inputs(n, joins, 4), 60.0, np.random.default_rng(0),
                             quiet_in_bulk=q) for q in (True, False)]
    assert outcomes == [True]
    assert pickle.dumps(runs[0]) == pickle.dumps(runs[1])
    stages = {t.stage for t in runs[0].tasks}
    assert stages == {"dit", "decode"} and len(runs[0].tasks) > 800


@st.composite
def numpy_setups(draw):
    """A quiet run the numpy path (:mod:`latsim.sim.bulk_numpy`) plays, mostly: random
    joins, a DiT pool of devices or USP groups and maybe a decode pool, cost models with
    ``sample_many``, runs long enough that ``records="none"`` forgets jobs (K = 2: 64 jobs
    in 32 s), the lead anywhere from tight (some stall: the loop then gives them back) to
    loose."""
    timing = Timing(draw(st.sampled_from([2, 4, 8])), 4, 16.0)
    n = draw(st.integers(1, 12))
    degree = draw(st.sampled_from([1, 1, 2]))
    devices = degree * draw(st.integers(1, 4))
    mean_c = draw(st.floats(0.05, 0.9)) * timing.T * devices / degree / n
    model = draw(st.sampled_from([FixedCost(mean_c), LognormalCost(mean_c, 0.5),
                                  AffineCost(mean_c, 0.0)]))
    joins = [draw(st.floats(0.0, timing.T)) for _ in range(n)]
    lead = model.quantile(timing.K, 0.99) + draw(st.floats(0.0, 1.5)) * timing.T
    config = ControllerConfig(timing, draw(st.sampled_from([BASELINE, SPECULATIVE])), lead,
                              run_ahead=draw(st.sampled_from([0.0, 0.0, 0.25])))
    decode = draw(st.sampled_from([None, None, FixedCost(0.02), LognormalCost(0.05, 0.5)]))
    pools = (("dit", devices),) if decode is None else (
        ("dit", devices), ("vae", draw(st.integers(1, 3))))
    serving = ServingConfig(streams=n, pools=pools, dit_degree=degree, decode=decode)
    duration = timing.T * draw(st.floats(2.0, 80.0))
    return config, model, serving, joins, duration


def _three_ways(config, model, serving, joins, duration, seed, records, monkeypatch):
    """The run's pickled records in numpy, in the loop and on the event path, and whether
    the numpy path kept it."""
    kept: list[bool] = []

    def watching(run):
        kept.append(original(run))
        return kept[-1]

    def run(in_bulk: bool):
        return pickle.dumps(simulate_serving(
            config, model, serving, _quiet_inputs(len(joins), joins, seed), duration,
            np.random.default_rng(seed), records=records, quiet_in_bulk=in_bulk))

    original = bulk_numpy.play_in_numpy
    with monkeypatch.context() as patch:
        patch.setattr(bulk_numpy, "play_in_numpy", watching)
        in_numpy = run(True)
        patch.setattr(bulk_numpy, "play_in_numpy", lambda run: False)
        in_loop = run(True)
    return in_numpy, in_loop, run(False), kept == [True]


@SETTINGS
@given(setup=numpy_setups(), seed=st.integers(0, 1000),
       records=st.sampled_from(["all", "conditions", "none"]))
def test_the_numpy_path_records_what_the_loop_and_the_event_path_record(setup, seed, records):
    with pytest.MonkeyPatch.context() as monkeypatch:
        in_numpy, in_loop, on_clock, kept = _three_ways(*setup, seed, records, monkeypatch)
    event("numpy kept it" if kept else "the loop played it")
    assert in_numpy == in_loop == on_clock


@pytest.mark.parametrize(("devices", "degree", "cv", "vae", "records"), [
    (1, 1, 0.0, 0, "none"), (3, 1, 0.5, 0, "all"), (4, 2, 0.0, 0, "conditions"),
    (2, 1, 0.3, 0, "none"), (1, 1, 0.0, 1, "all"), (3, 1, 0.5, 2, "none")])
def test_a_quiet_pool_with_random_joins_is_played_in_numpy(devices, degree, cv, vae, records,
                                                           monkeypatch):
    """Ten streams with random joins at ρ 0.6 (and a decode on ``vae`` devices), no
    stall: the numpy path keeps the run (no loop behind it) and its records are the
    loop's and the event path's. At K = 2 and 60 s each stream does about 120 jobs, so
    ``records="none"`` forgets some."""
    timing = Timing(2, 4, 16.0)
    n = 10
    model = LognormalCost(0.6 * timing.T * devices / degree / n, cv)
    joins = np.random.default_rng(devices).uniform(0, timing.T, n).tolist()
    decode = LognormalCost(0.01 * (vae or 1), cv) if vae else None
    config = ControllerConfig(timing, BASELINE, model.quantile(2, 0.99) + 0.6)
    serving = ServingConfig(streams=n, pools=(("dit", devices),) + ((("vae", vae),) if vae
                                                                  else ()),
                            dit_degree=degree, decode=decode)
    in_numpy, in_loop, on_clock, kept = _three_ways(config, model, serving, joins, 60.0, 3,
                                                    records, monkeypatch)
    assert kept
    assert in_numpy == in_loop == on_clock
    jobs = pickle.loads(in_numpy).streams[0].jobs
    assert (len(jobs) < 100) == (records == "none")


@pytest.mark.parametrize("seed", [2, 3])
def test_a_decode_end_dispatches_the_next_decode_before_the_refill_it_asks_for(seed,
                                                                             monkeypatch):
    """Jobs that sometimes take longer than T (a decode queue of CV 1 on one device) ask
    for the next chunk at once as they end, within a lead of 3 T: at that instant the
    decode device's next waiting step is dispatched first, then the refill (batch ids
    number them in that order), as the event path does."""
    timing = Timing(2, 4, 16.0)
    n = 3
    joins = np.random.default_rng(seed).uniform(0, timing.T, n).tolist()
    config = ControllerConfig(timing, BASELINE, 3 * timing.T)
    serving = ServingConfig(streams=n, pools=(("dit", n), ("vae", 1)),
                            decode=LognormalCost(0.6 * timing.T / n, 1.0))
    in_numpy, in_loop, on_clock, kept = _three_ways(
        config, LognormalCost(0.4 * timing.T, 0.3), serving, joins, 60.0, seed, "all",
        monkeypatch)
    assert kept
    assert in_numpy == in_loop == on_clock


def _ranking(monkeypatch) -> list[int]:
    """From now on, a mark each time the numpy path ranks events (it met a tie)."""
    calls: list[int] = []
    original = bulk_numpy.event_ranks

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(bulk_numpy, "event_ranks", counting)
    return calls


@pytest.mark.parametrize(("K", "n", "devices", "C", "lead", "start"), [
    (8, 8, 1, 1 / 16, 0.6, "together"), (8, 8, 3, 3 / 16, 0.6, "together"),
    (8, 8, 4, 1 / 4, 0.6, "staggered"), (2, 3, 2, 1 / 2, 3.0, "together"),
    (2, 4, 3, 1 / 2, 6.0, "together")])
def test_events_at_one_instant_stay_in_numpy_in_the_clocks_order(K, n, devices, C, lead,
                                                                 start, monkeypatch):
    """Streams that join together ask for their chunks at the same instants, and with a
    fixed C several devices free at the same instants; staggered joins a fixed fraction
    of T apart make ends fall on requests; with C = T / 2 on fewer devices than streams
    a wake-up falls at the instant a waiting job ends (C and the lead in T). The clock
    orders such events as they were scheduled; the numpy path ranks them so
    (``lindley.event_ranks``) and keeps the run."""
    timing = Timing(K, 4, 16.0)
    joins = [0.0] * n if start == "together" else [s * timing.T / n for s in range(n)]
    config = ControllerConfig(timing, BASELINE, lead * timing.T)
    serving = ServingConfig(streams=n, pools=(("dit", devices),))
    cost = FixedCost(C * timing.T)
    ranked = _ranking(monkeypatch)
    in_numpy, in_loop, on_clock, kept = _three_ways(config, cost, serving, joins,
                                                    12 * timing.T, 1, "all", monkeypatch)
    assert kept and ranked  # it had ties to order
    assert in_numpy == in_loop == on_clock


@pytest.mark.parametrize(("start", "n", "vae", "C", "decode", "lead"), [
    ("together", 4, 1, 0.25, 0.125, 1.0), ("together", 4, 2, 0.25, 0.125, 1.0),
    ("staggered", 4, 2, 0.5, 0.125, 1.0), ("together", 6, 2, 0.25, 0.5, 3.0),
    ("staggered", 6, 1, 0.25, 0.25, 3.0)])
def test_with_a_decode_events_at_one_instant_stay_in_numpy_too(start, n, vae, C, decode,
                                                               lead, monkeypatch):
    """With a decode stage a step's end queues the next step: DiT ends, decode ends and
    requests at one instant are ranked by what scheduled them, as the clock takes them
    (with a lead of 3 s some jobs end past their next due time, and a decode's end then
    dispatches the next decode waiting before the refill its stream asks for)."""
    timing = Timing(8, 4, 16.0)
    joins = [0.0] * n if start == "together" else [s * timing.T / n for s in range(n)]
    config = ControllerConfig(timing, BASELINE, lead)
    serving = ServingConfig(streams=n, pools=(("dit", 2), ("vae", vae)),
                            decode=FixedCost(decode))
    ranked = _ranking(monkeypatch)
    in_numpy, in_loop, on_clock, kept = _three_ways(config, FixedCost(C), serving, joins,
                                                    30.0, 1, "all", monkeypatch)
    assert kept and ranked  # it had ties to order
    assert in_numpy == in_loop == on_clock
    assert {t.stage for t in pickle.loads(in_numpy).tasks} == {"dit", "decode"}


def test_a_run_that_stalls_goes_back_to_the_event_path_with_its_streams_untouched():
    """A lead too short for the queue: a chunk comes late. The bulk path gives the run back
    (None) and every DiT and decode stream reads as it did before (the event path then
    draws the same jobs)."""
    timing = Timing(8, 4, 16.0)
    n = 6
    config = ControllerConfig(timing, BASELINE, 0.35)
    serving = ServingConfig(streams=n, pools=(("dit", 1), ("vae", 1)),
                            decode=LognormalCost(0.02, 0.5))
    streams = _quiet_inputs(n, [0.0] * n, 3)
    before = [(s.cost.bit_generator.state, s.stages[0].bit_generator.state) for s in streams]
    windows = [RunWindow.for_config(config, 30.0)] * n
    assert bulk_module.bulk_refusal([config] * n, FixedCost(0.3), serving, streams,
                                    30.0) is None
    out = bulk_module.simulate_quiet_serving([config] * n, LognormalCost(0.3, 0.3), serving,
                                             streams, windows)
    assert out is None
    assert [(s.cost.bit_generator.state, s.stages[0].bit_generator.state)
            for s in streams] == before
    ran = simulate_serving(config, LognormalCost(0.3, 0.3), serving, streams, 30.0,
                           np.random.default_rng(0))
    assert any(s.stalls for s in ran.streams)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda c, s, i: (replace(c, policy=SPECULATIVE, in_flight_policy="flush"), s,
                      [replace(i[0], trace=replace(i[0].trace, times=(1.0,)))] + i[1:]),
     "a condition under a flush"),
    (lambda c, s, i: (c, replace(s, uplink=FixedCost(0.01)),
                      [replace(i[0], trace=replace(i[0].trace, times=(1.0,)))] + i[1:]),
     "an uplink draw"),
    (lambda c, s, i: (replace(c, in_flight=2), s, i), "more than one chunk in flight"),
    (lambda c, s, i: (c, replace(s, schedule="least-slack"), i), "fifo"),
    (lambda c, s, i: (c, replace(s, deliver=FixedCost(0.01)), i), "a delivery draw"),
    (lambda c, s, i: (c, replace(s, cold_start=True), i), "a cold start"),
    (lambda c, s, i: (c, s, [replace(x, join=np.float64(x.join)) for x in i]), "float"),
])
def test_what_the_bulk_path_does_not_play_it_says(change, reason):
    timing = Timing(8, 4, 16.0)
    config = ControllerConfig(timing, BASELINE, 1.0)
    serving = ServingConfig(streams=2, pools=(("dit", 1),))
    streams = _quiet_inputs(2, [0.0, 0.5], 1)
    assert bulk_module.bulk_refusal([config] * 2, FixedCost(0.3), serving, streams,
                                    20.0) is None
    config, serving, streams = change(config, serving, streams)
    refusal = bulk_module.bulk_refusal([config] * 2, FixedCost(0.3), serving, streams, 20.0)
    assert refusal is not None and reason in refusal


def test_a_slot_tally_pickles_as_its_counts():
    """The same slots fed one by one or as columns (folded or not yet) pickle the same:
    the event path and the bulk path feed a tally differently."""
    rows = [(p, 0, p // 4, 0.25 * p) for p in range(40)]
    one_by_one, columns = SlotTally(5.0), SlotTally(5.0)
    for row in rows:
        one_by_one.add(*row)
    columns.extend(*zip(*rows, strict=True))
    waiting = SlotTally(5.0)
    for position, version, job, t in rows:  # appended to the columns, not folded
        waiting.position.append(position)
        waiting.version.append(version)
        waiting.job_id.append(job)
        waiting.t_start.append(t)
    assert pickle.dumps(one_by_one) == pickle.dumps(columns) == pickle.dumps(waiting)
    copy = pickle.loads(pickle.dumps(waiting))
    assert (copy.played, copy.before_end, copy.generated_before_end) == (40, 20, 16)


# ---------------------------------------------------------------- conditions in bulk


@st.composite
def conditioned_setups(draw):
    """A run with conditions the numpy path plays, mostly: the baseline (eager commit: a
    condition moves no job) on a FIFO DiT pool (devices or USP groups, maybe a decode
    pool), random, together or staggered joins, conditions at up to one a second a stream
    (some near the window's end, so that the run drains past it), binding at the start or
    as asked for, and the lead from tight (some stall: the event path plays those) to
    loose; now and then latent commitment
    (its replans move jobs: the loop plays those, :func:`replanning_setups` more of them)."""
    timing = Timing(draw(st.sampled_from([2, 4, 8])), 4, 16.0)
    n = draw(st.integers(1, 8))
    degree = draw(st.sampled_from([1, 1, 2]))
    devices = degree * draw(st.integers(1, 3))
    mean_c = draw(st.floats(0.05, 0.9)) * timing.T * devices / degree / n
    model = draw(st.sampled_from([FixedCost(mean_c), LognormalCost(mean_c, 0.5),
                                  AffineCost(mean_c, 0.0)]))
    joins = _joins(draw, draw(st.sampled_from(["random", "random", "together",
                                               "staggered"])), n, timing)
    lead = model.quantile(timing.K, 0.99) + draw(st.floats(0.0, 1.5)) * timing.T
    policy = draw(st.sampled_from([BASELINE] * 5 + [SPECULATIVE]))
    # a job that waits takes the newest version as a device starts it, or keeps the one
    # it was asked for with
    config = ControllerConfig(timing, policy, lead,
                              bind=draw(st.sampled_from(["start", "start", "enqueue"])))
    decode = draw(st.sampled_from([None, None, FixedCost(0.02), LognormalCost(0.05, 0.5)]))
    pools = (("dit", devices),) if decode is None else (
        ("dit", devices), ("vae", draw(st.integers(1, 3))))
    serving = ServingConfig(streams=n, pools=pools, dit_degree=degree, decode=decode)
    duration = timing.T * draw(st.floats(2.0, 30.0))
    rate = draw(st.sampled_from([0.1, 0.5, 1.0]))
    traces = [tuple(sorted(draw(st.lists(st.floats(0.0, duration), max_size=int(
        rate * duration) + 1)))) for _ in range(n)]
    return config, model, serving, joins, traces, duration


def _in_bulk_and_on_clock(config, model, serving, joins, traces, duration, seed, records,
                          monkeypatch):
    """The run's pickled records in bulk and on the event path, whether the numpy path
    kept it, and how many times a replayed stream played its quiet cycles as one step."""
    kept: list[bool] = []
    steps: list[int] = []
    original, cycles = bulk_numpy.play_in_numpy, StreamRun.play_quiet_cycles

    def watching(run):
        kept.append(original(run))
        return kept[-1]

    def counting(self, *args):
        steps.append(1)
        return cycles(self, *args)

    def run(in_bulk: bool):
        return pickle.dumps(simulate_serving(
            config, model, serving, inputs(traces, joins, seed), duration,
            np.random.default_rng(seed), records=records, quiet_in_bulk=in_bulk))

    with monkeypatch.context() as patch:
        patch.setattr(bulk_numpy, "play_in_numpy", watching)
        patch.setattr(StreamRun, "play_quiet_cycles", counting)
        in_bulk = run(True)
    return in_bulk, run(False), kept == [True], len(steps)


@SETTINGS
@given(setup=conditioned_setups(), seed=st.integers(0, 1000),
       records=st.sampled_from(["all", "conditions", "none"]))
def test_a_run_with_conditions_in_bulk_records_what_the_event_path_records(setup, seed,
                                                                          records):
    with pytest.MonkeyPatch.context() as monkeypatch:
        in_bulk, on_clock, kept, _ = _in_bulk_and_on_clock(*setup, seed, records,
                                                           monkeypatch)
    event("numpy kept it" if kept else "the loop or the event path played it")
    assert in_bulk == on_clock


@st.composite
def replanning_setups(draw):
    """A run whose conditions move jobs: latent commitment (a lazy commit, replans at
    q = 1 or a coarser unit), the table's options that change what a replan does
    (discard on start or when ready, a replan at the cache end deferred or started,
    binding at the start or the enqueue), a replan overhead drawn from its own stream or
    none, and the rest as :func:`conditioned_setups` draws it. The bulk loop drives each
    stream through its controller; a tick that would start a job gives the run back, and
    so does a stall where no stream sees a condition (the run is quiet: arithmetic)."""
    config, model, serving, joins, traces, duration = draw(conditioned_setups())
    K = config.timing.K
    policy = draw(st.sampled_from([SPECULATIVE, SPECULATIVE, Policy("chunked", K // 2 or 1,
                                                                    "lazy")]))
    config = replace(config, policy=policy,
                     discard=draw(st.sampled_from(["on-start", "on-ready"])),
                     replan_at_cache_end=draw(st.sampled_from(["defer", "start"])),
                     bind=draw(st.sampled_from(["start", "enqueue"])),
                     run_ahead=draw(st.sampled_from([0.0, 0.0, 0.25])))
    overhead = draw(st.sampled_from([None, None, FixedCost(0.01), LognormalCost(0.02, 0.5)]))
    return config, model, replace(serving, replan_cost=overhead), joins, traces, duration


@SETTINGS
@given(setup=replanning_setups(), seed=st.integers(0, 1000),
       records=st.sampled_from(["all", "conditions", "none"]))
def test_replans_in_the_bulk_loop_record_what_the_event_path_records(setup, seed, records):
    config, model, serving, joins, traces, duration = setup
    with pytest.MonkeyPatch.context() as monkeypatch:
        kept = _played_in_bulk(monkeypatch)
        in_bulk = pickle.dumps(simulate_serving(
            config, model, serving, inputs(traces, joins, seed), duration,
            np.random.default_rng(seed), records=records))
    event("the loop kept it" if kept == [True] else "given back" if kept else "refused")
    on_clock = pickle.dumps(simulate_serving(
        config, model, serving, inputs(traces, joins, seed), duration,
        np.random.default_rng(seed), records=records, quiet_in_bulk=False))
    assert in_bulk == on_clock


def _kept_in_the_loop(monkeypatch, config, cost, serving, traces, joins, duration, seed=0,
                      records="all"):
    """The run's records in bulk, after checking that the loop kept it and that they are
    the event path's, byte for byte."""
    kept = _played_in_bulk(monkeypatch)

    def run(in_bulk: bool):
        return simulate_serving(config, cost, serving, inputs(traces, joins, seed), duration,
                                np.random.default_rng(seed), records=records,
                                quiet_in_bulk=in_bulk)

    ran = run(True)
    assert kept == [True]
    assert pickle.dumps(ran) == pickle.dumps(run(False))
    return ran


@pytest.mark.parametrize(("vae", "records"), [(0, "all"), (2, "none"), (1, "conditions")])
def test_replans_stay_in_the_loop_and_the_run_drains_at_a_tick(vae, records, monkeypatch):
    """Sixteen speculative streams at ρ 0.5, random joins, a condition every 3 s each
    and one 0.1 s before the window's end (open there): the loop keeps the run (its
    replans are jobs on the pools, a replan overhead drawn for each), and ends it past
    the window at the tick that shows the last condition; every record is the event
    path's."""
    timing = Timing(8, 4, 16.0)
    n, duration = 16, 40.0
    rng = np.random.default_rng(vae)
    model = LognormalCost(0.5 * timing.T * 4 / n, 0.3)
    joins = rng.uniform(0, timing.T, n).tolist()
    traces = [tuple(np.sort(rng.uniform(0, duration - 1, 13)).tolist()) + (duration - 0.1,)
              for _ in range(n)]
    config = ControllerConfig(timing, SPECULATIVE, model.quantile(8, 0.99) + 0.6)
    serving = ServingConfig(streams=n, pools=(("dit", 4),) + ((("vae", vae),) if vae else ()),
                            decode=LognormalCost(0.02, 0.3) if vae else None,
                            replan_cost=FixedCost(0.01))
    ran = _kept_in_the_loop(monkeypatch, config, model, serving, traces, joins, duration,
                            seed=2, records=records)
    assert sum(s.jobs_started for s in ran.streams) > 0
    assert ran.end_time > ran.window_end
    shown = max(start.t_origin + c.t_play for run, start in zip(ran.streams, ran.starts,
                                                              strict=True)
                for c in run.conditions if c.displayed)
    assert ran.end_time == pytest.approx(shown, abs=1e-9)  # the last one shown then
    if records == "all":
        assert sum(t.kind == "replan" for t in ran.tasks) > n


def test_an_arrival_at_the_instant_of_the_first_wake_up_comes_first(monkeypatch):
    """Each arrival takes its place in the clock's order when its stream starts, before
    the controller arms its first refill: a condition that arrives at the very instant
    of that wake-up (1 s) is registered first, so the refill carries it, in the loop as
    on the clock (the other way round, the refill would start with version 0 and the
    condition wait for a replan)."""
    config = ControllerConfig(Timing(8, 4, 16.0), SPECULATIVE, 1.0)
    serving = ServingConfig(streams=2, pools=(("dit", 1),))
    ran = _kept_in_the_loop(monkeypatch, config, FixedCost(0.4), serving, [(1.0, 5.3), ()],
                            [0.0, 0.7], 8.0)
    assert ran.streams[0].jobs[1].version == 1  # the first refill carries version 1


def test_under_a_lazy_commit_a_stream_without_conditions_may_stall_in_bulk(monkeypatch):
    """Two speculative streams overloading one device (ρ 1.2): both stall, stream 1 sees no
    condition. The loop drives it through its controller too, so its stalls stay in bulk
    (the arithmetic of a quiet stream cannot play a stall: it gave such runs back)."""
    config = ControllerConfig(Timing(4, 4, 16.0), SPECULATIVE, 0.8)
    serving = ServingConfig(streams=2, pools=(("dit", 1),))
    ran = _kept_in_the_loop(monkeypatch, config, FixedCost(0.6), serving, [(1.0, 3.0), ()],
                            [0.0, 0.3], 6.0)
    assert ran.streams[1].stalls and not ran.streams[1].conditions


def test_a_drain_can_end_at_the_job_end_that_ends_a_stall(monkeypatch):
    """One stream whose condition is shown by the slot a job's end plays as it ends a
    stall, past the window's end: the run ends at that event (1.5 s), not at a tick
    after it, in the loop as on the clock."""
    config = ControllerConfig(Timing(2, 4, 16.0), SPECULATIVE, 0.75)
    serving = ServingConfig(streams=1, pools=(("dit", 3),), dit_degree=1)
    ran = _kept_in_the_loop(monkeypatch, config, FixedCost(0.75), serving, [(0.0,)], [0.0],
                            1.0)
    assert ran.end_time == 1.5 and ran.streams[0].stalls[-1].t_end == 1.5


@pytest.mark.parametrize("replayed", [False, True])
@pytest.mark.parametrize(("devices", "degree", "vae", "start", "records", "bind"), [
    (1, 1, 0, "random", "all", "start"), (3, 1, 0, "random", "none", "start"),
    (4, 2, 0, "random", "all", "start"), (2, 1, 1, "random", "conditions", "start"),
    (2, 1, 0, "staggered", "all", "start"), (3, 1, 2, "random", "none", "start"),
    (1, 1, 0, "random", "all", "enqueue"), (2, 1, 1, "random", "all", "enqueue")])
def test_conditions_under_the_baseline_stay_in_numpy(devices, degree, vae, start, records,
                                                     bind, replayed, monkeypatch):
    """Eight streams at ρ 0.5 with a condition every 2 s each, 60 s (K = 2: about 120
    jobs a stream, so ``records="none"`` forgets some): the numpy path keeps the run and
    reads every stream's conditions off the arrays (none is replayed through its
    controller), conditions are shown and the run drains past its window's end, and
    every record is the event path's. The same where the arrays do not tell them
    (``replayed``: each stream is replayed, its quiet cycles between conditions as one
    step each). A job that waits binds its version as a device starts it, or (``bind``
    enqueue) keeps the one it was asked for with."""
    if replayed:
        monkeypatch.setattr(bulk_numpy._Shows, "read", classmethod(lambda *args: None))
    timing = Timing(2, 4, 16.0)
    n, duration = 8, 60.0
    rng = np.random.default_rng(devices + vae)
    model = LognormalCost(0.5 * timing.T * devices / degree / n, 0.3)
    joins = ([s * timing.T / n for s in range(n)] if start == "staggered"
             else rng.uniform(0, timing.T, n).tolist())
    traces = [tuple(np.sort(rng.uniform(0, duration - 1, 29)).tolist()) + (duration - 0.1,)
              for _ in range(n)]  # the last one is open at the window's end
    decode = LognormalCost(0.01 * vae, 0.3) if vae else None
    config = ControllerConfig(timing, BASELINE, model.quantile(2, 0.99) + 0.5, bind=bind)
    serving = ServingConfig(streams=n, pools=(("dit", devices),) + ((("vae", vae),) if vae
                                                                  else ()),
                            dit_degree=degree, decode=decode)
    in_bulk, on_clock, kept, steps = _in_bulk_and_on_clock(
        config, model, serving, joins, traces, duration, 5, records, monkeypatch)
    assert kept and (steps > n if replayed else steps == 0)
    assert in_bulk == on_clock
    ran = pickle.loads(in_bulk)
    assert sum(v.displayed for v in ran.viewer) > 0.9 * 30 * n
    assert ran.end_time > ran.window_end  # conditions open at the window's end: a drain


@pytest.mark.parametrize("before", [0.0, 0.5e-9])
def test_an_arrival_the_arrays_cannot_tell_is_replayed(before, monkeypatch):
    """Two baseline streams, the first refill armed for 0.5 s (K δ less the lead): a
    condition at that wake-up's instant (the clock orders the two by their ids), or half
    of EPS before it (the decide step after the arrival finds the refill due and starts
    it then, not at the wake-up), is not read off the arrays; that stream is replayed
    through its controller (which gives the near one to the event path), the other's
    read, and the records are the event path's: the refill carries the condition (at
    the instant, the arrival took its place in the clock's order first)."""
    config = ControllerConfig(Timing(8, 4, 16.0), BASELINE, 1.5)
    serving = ServingConfig(streams=2, pools=(("dit", 1),))
    read: list[bool] = []
    original = bulk_numpy._Shows.read.__func__

    def watched(cls, *args):
        shows = original(cls, *args)
        read.append(shows is not None)
        return shows

    monkeypatch.setattr(bulk_numpy._Shows, "read", classmethod(watched))
    in_bulk, on_clock, _, _ = _in_bulk_and_on_clock(
        config, FixedCost(0.4), serving, [0.0, 0.7], [(0.5 - before, 3.3), (2.1,)], 8.0, 0,
        "all", monkeypatch)
    assert in_bulk == on_clock
    assert read == [False, True]
    first = pickle.loads(on_clock).streams[0].jobs[1]  # the refill carries it, and
    assert (first.version, first.t_start) == (1, 0.5 - before)  # starts at the arrival


def _waiting_for_a_version() -> Controller:
    """A controller (δ = 1/4 s, T = 1 s, lead 1.2 s) whose version 1 waits for job 2, armed
    for 0.8 s."""
    ctrl = Controller(ControllerConfig(Timing(4, 4, 16.0), BASELINE, 1.2))
    ctrl.start(0.0)  # job 1 (positions 4 to 7) asked for at once
    ctrl.handle(ConditionArrived(), 0.01)  # version 1 waits for the next job
    ctrl.handle(JobDone(1), 0.1)  # the refill armed for 0.8
    return ctrl


def _books(ctrl: Controller) -> tuple:
    return (ctrl.conditions, ctrl.jobs, list(ctrl.slots.rows()), ctrl.next_position,
            ctrl.next_due, ctrl.cached_positions, ctrl.jobs_in_flight, ctrl.state,
            ctrl._armed_refill, ctrl.latest_version, ctrl.open_conditions, ctrl.locked_end,
            ctrl.cache_end)


def test_quiet_cycles_as_one_step_leave_the_books_the_events_leave():
    """``Controller.play_quiet_cycles`` over two refill cycles in which version 1 binds to
    job 2 and slot 8 shows it leaves the records and books one event at a time leaves;
    it refuses (changing nothing) a first job that is not the armed one and a tick that
    plays a chunk not done yet."""
    jobs = [(0.8, 0.8, 1.1, 0.8), (1.8, 1.8, 2.1, 1.8), (math.inf, math.inf, math.inf, 2.8)]
    ticks = [k * 0.25 for k in range(9)]  # to 2.0 s: slot 8, job 2's first, at 2.0
    in_bulk = _waiting_for_a_version()
    assert in_bulk.in_quiet_cycles
    before = pickle.dumps(in_bulk.__dict__)
    assert in_bulk.play_quiet_cycles(ticks, jobs[1:]) == 0  # job 2 is the one armed
    early = [*ticks[:8], 1.0]
    assert in_bulk.play_quiet_cycles(early, jobs) == 0  # slot 8 before job 2 is done
    assert pickle.dumps(in_bulk.__dict__) == before
    assert in_bulk.play_quiet_cycles(ticks, jobs) == 2
    events = _waiting_for_a_version()
    for at, step in sorted([(t, SlotDue(k)) for k, t in enumerate(ticks)]
                            + [(0.8, WakeUp()), (1.1, JobDone(2)), (1.8, WakeUp()),
                               (2.1, JobDone(3))], key=lambda pair: pair[0]):
        events.handle(step, at)
    assert _books(in_bulk) == _books(events)
    assert [c.t_play for c in in_bulk.conditions] == [2.0]
    assert [j.version for j in in_bulk.jobs] == [0, 0, 1, 1]


def _one_stream(config: ControllerConfig, arrival: float, cost: float, start: float,
                end: float) -> tuple[Controller, Controller, list, list]:
    """One controller played event by event on a device of its own (each job takes
    ``cost``), a condition arriving at ``arrival``: the controller at ``end``, a copy of
    it as it was at ``start`` (in its quiet cycles there), and the quiet cycles between:
    the ticks and the jobs (asked, start, done, due), as ``play_quiet_cycles`` takes them."""
    ctrl, heap, order = Controller(config), [], count()
    then, ticks, jobs = None, [], []

    def carry(commands, now: float, cause) -> None:
        for command in commands:
            if type(command) is ScheduleWakeUp:
                heapq.heappush(heap, (command.at, next(order), command.event))
                if then is not None and type(command.event) is WakeUp:  # a refill armed
                    jobs.append([math.inf, math.inf, math.inf, command.at])
            elif type(command) is StartJob:
                heapq.heappush(heap, (now + cost, next(order), JobDone(command.job_id)))
                if then is not None and type(cause) is WakeUp:
                    jobs[-1][:2] = [now, now]
                elif then is not None:  # asked for at once as a job ended
                    jobs.append([now, now, math.inf, math.nan])

    carry(ctrl.start(0.0), 0.0, None)
    heapq.heappush(heap, (arrival, next(order), ConditionArrived()))
    while heap[0][0] < end:
        at, _, step = heapq.heappop(heap)
        if then is None and at >= start:
            first, asked, armed = ctrl.quiet_cycle_books()
            then = copy.deepcopy(ctrl)
            jobs.append([math.inf, math.inf, math.inf, armed] if armed == armed
                        else [asked, asked, math.inf, math.nan])
        if then is not None and type(step) is SlotDue:
            ticks.append(at)
        elif then is not None and type(step) is JobDone:
            jobs[-2 if jobs[-1][0] == math.inf else -1][2] = at
        carry(ctrl.handle(step, at), at, step)
    return ctrl, then, ticks, [tuple(job) for job in jobs]


def test_quiet_cycles_after_a_replan_under_a_lazy_commit_as_one_step():
    """Latent commitment by half chunks (K = 4, q = 2): a condition at 0.85 s is replanned
    from slot 10 (job 3), so job j's chunk begins at 4j − 2. The quiet cycles from 1.6 s
    to 4.1 s as one step (``quiet_cycle_books`` where they begin) leave the books the
    events leave: the jobs' branches, the cache, the slot that shows the condition, and
    the lock of the half chunk the last tick plays into (slot 16 locks to 18)."""
    config = ControllerConfig(Timing(4, 4, 16.0), Policy("chunked", 2, "lazy"), 1.2)
    events, in_one_step, ticks, jobs = _one_stream(config, 0.85, 0.3, 1.6, 4.1)
    assert in_one_step.play_quiet_cycles(ticks, jobs) == 4
    assert _books(in_one_step) == _books(events)
    assert [(j.job_id, j.kind, j.branch) for j in events.jobs[-3:]] == [
        (3, "replan", 10), (4, "refill", 14), (5, "refill", 18)]
    assert (events.next_position, events.locked_end) == (17, 18)
    assert [c.t_play for c in events.conditions] == [2.5]


def test_a_drain_that_ends_at_an_instant_of_other_events_stays_in_numpy(monkeypatch):
    """Staggered joins (the serving model's default), a fixed C and a lead of whole slots
    put other streams' events on the instant of the tick that shows the last condition
    open past the window: the clock runs those events before that tick (ticks run last),
    so the run holds them. The numpy path keeps such a run, and its records are the event
    path's."""
    timing = Timing(8, 4, 16.0)
    n, duration = 16, 60.0
    rng = np.random.default_rng(7)
    joins = [s * timing.T / n for s in range(n)]
    traces = [tuple(np.sort(rng.uniform(0, duration - 1, 6)).tolist()) + (duration - 0.2,)
              for _ in range(n)]
    config = ControllerConfig(timing, BASELINE, 1.5)
    serving = ServingConfig(streams=n, pools=(("dit", 4),))
    in_bulk, on_clock, kept, _ = _in_bulk_and_on_clock(
        config, FixedCost(0.3), serving, joins, traces, duration, 3, "all", monkeypatch)
    assert kept
    assert in_bulk == on_clock
    ran = pickle.loads(in_bulk)
    end = ran.end_time
    assert end > ran.window_end
    assert any(end in (t.t_enqueue, t.t_start) or t.t_end == end and t.t_end - t.t_start
               >= 0.3 for t in ran.tasks)  # a step asked for, started or done then


@given(origins=st.lists(st.floats(0.0, 1e4, allow_subnormal=False), max_size=6),
       delta=st.floats(1e-3, 2.0), ticks=st.integers(0, 300))
def test_tick_rows_in_python_are_the_numpy_columns_bit_for_bit(origins, delta, ticks):
    """A few streams' tick rows are computed in Python, many streams' a column at a time in
    numpy: the same float sums, so the same bits."""
    in_python = bulk_module._tick_columns(np.array(origins, dtype=float), delta, ticks)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(bulk_module, "_ROWS_IN_PYTHON", -1)
        in_numpy = bulk_module._tick_columns(np.array(origins, dtype=float), delta, ticks)
    assert in_python.shape == in_numpy.shape == (len(origins), ticks)
    assert in_python.tobytes() == in_numpy.tobytes()


def test_a_run_keeps_the_random_streams_its_models_may_draw_from():
    """A run the bulk engine may give back keeps (and restores) each random stream a model
    may draw from, and skips those of a fixed cost, which draws nothing: the DiT stream
    with a random cost, the decode and replan streams with a decode stage or a replan
    overhead that draw, and all three with a system model (its own chain draws as it
    likes)."""
    from latsim.model.generators import WaveForcingCost

    streams = inputs([[], []], [0.0, 0.5])
    plain = ServingConfig(streams=2, pools=(("dit", 1),))
    staged = replace(plain, pools=(("dit", 1), ("vae", 1)), decode=LognormalCost(0.1, 0.2),
                     replan_cost=FixedCost(0.05))

    def kept(cost, serving):
        return [id(rng) for rng in bulk_module._drawn(cost, serving, streams)]

    assert kept(FixedCost(0.4), plain) == []
    assert kept(LognormalCost(0.4, 0.3), plain) == [id(s.cost) for s in streams]
    assert kept(FixedCost(0.4), staged) == [id(s.stages[0]) for s in streams]
    assert kept(WaveForcingCost(0.1, 4, 0.05), plain) == [
        id(rng) for s in streams for rng in (s.cost, s.stages[0], s.stages[3])]
