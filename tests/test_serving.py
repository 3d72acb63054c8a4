"""The serving model (DESIGN §6): equivalence with the single worker, invariants of many
streams on shared pools, the queueing closed forms, discard-on-ready, and the outputs."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latsim.analysis.queueing import (
    overload_stall_fraction,
    periodic_wait_mean,
    periodic_wait_quantile,
    periodic_work_mean,
    pool_wait_quantile,
)
from latsim.analysis.serving import serving_metrics
from latsim.controller import (
    EPS,
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    JobStarted,
    SlotDue,
    StartJob,
)
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.serving import Batching, ServingConfig
from latsim.model.traces import Trace
from latsim.sim.serving import StreamInput, simulate_serving
from latsim.sim.simpy_driver import simulate_trace
from tests.test_properties import arrival_times, settings_with_c_below_t

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def inputs(traces, joins, seed=0):
    """One StreamInput per trace: its own cost and stage streams."""
    root = np.random.SeedSequence(seed)
    out = []
    for i, (times, join) in enumerate(zip(traces, joins, strict=True)):
        cost, *stages = root.spawn(5) if i == 0 else np.random.SeedSequence(
            seed, spawn_key=(i,)).spawn(5)
        out.append(StreamInput(Trace("t", tuple(times), 1e9), join,
                               np.random.default_rng(cost),
                               tuple(np.random.default_rng(s) for s in stages)))
    return out


# ---------------------------------------------------------------- one stream = single worker


ZERO = FixedCost(0.0)
DEDICATED = (
    ServingConfig(),
    ServingConfig(pools=(("dit", 1), ("vae", 1)), decode=ZERO, deliver=ZERO, uplink=ZERO,
                  playout_delay=0.0),
)


@SETTINGS
@given(data=st.data(), setting=settings_with_c_below_t(), cv=st.sampled_from([0.0, 0.4]),
       over=st.sampled_from([1.0, 1.5]))
def test_one_dedicated_stream_reproduces_the_single_worker_exactly(data, setting, cv, over):
    """Same seed, same records: zero-cost stages add no event and no draw that matters."""
    timing, C = setting
    C = max(C * over, 1e-3)  # C above T too (a stream that stalls)
    duration = timing.T * data.draw(st.floats(1.0, 8.0))
    times = data.draw(arrival_times(timing, duration))
    cost = LognormalCost(C, cv)
    seed = data.draw(st.integers(0, 1000))
    for policy in (BASELINE, SPECULATIVE):
        config = ControllerConfig(timing, policy, cost.quantile(timing.K, 0.99))
        single, _ = simulate_trace(config, cost, Trace("t", tuple(times), duration), duration,
                                   np.random.default_rng(seed))
        for serving in DEDICATED:
            [stream] = inputs([times], [0.0])
            stream = StreamInput(stream.trace, 0.0, np.random.default_rng(seed), stream.stages)
            run = simulate_serving(config, cost, serving, [stream], duration,
                                   np.random.default_rng(1))
            assert run.streams[0] == single
            shown = [v for v in run.viewer if v.displayed]
            assert [v.L for v in shown] == [v.L_server for v in shown]
            assert [v.L for v in shown] == [c.L for c in single.conditions if c.displayed]


# ---------------------------------------------------------------- invariants of many streams


class RecordingCost:
    """A lognormal cost that remembers every draw by the generator it was drawn from, in
    the generator's order: a generator set back to a state it drew from before (the bulk
    path gives a run back to the event path so, latsim.sim.bulk) draws those again, and the
    record keeps the sequence, not the attempts."""

    spec = "recording"
    deterministic = False

    def __init__(self, mean: float, cv: float) -> None:
        self.inner = LognormalCost(mean, cv)
        self.draws: dict[int, list[float]] = defaultdict(list)
        self._states: dict[int, dict[str, int]] = defaultdict(dict)  # state -> its draw

    def sample(self, K, rng, kind="refill"):
        before = repr(rng.bit_generator.state)
        states, draws = self._states[id(rng)], self.draws[id(rng)]
        if before in states:  # set back: the draws from there on are drawn again
            again = states[before]
            del draws[again:]
            for state in [state for state, index in states.items() if index >= again]:
                del states[state]
        states[before] = len(draws)
        value = self.inner.sample(K, rng, kind)
        draws.append(value)
        return value

    def mean(self, K):
        return self.inner.mean(K)

    def quantile(self, K, level):
        return self.inner.quantile(K, level)


@st.composite
def serving_setups(draw):
    timing = Timing(draw(st.sampled_from([2, 4, 8])), 4, 16.0)
    n = draw(st.integers(1, 6))
    dit = draw(st.integers(1, 3))
    decode = draw(st.sampled_from([None, FixedCost(0.0), LognormalCost(0.05, 0.5)]))
    pools = (("dit", dit),) if decode is None else (("dit", dit), ("vae", draw(st.integers(1, 2))))
    batch = draw(st.sampled_from([None, Batching(FixedCost(0.3), 3)]))
    serving = ServingConfig(
        streams=n, pools=pools, decode=decode, decode_pool="vae",
        deliver=draw(st.sampled_from([None, LognormalCost(0.03, 1.0)])),
        uplink=draw(st.sampled_from([None, FixedCost(0.02)])),
        replan_cost=draw(st.sampled_from([None, FixedCost(0.05)])),
        batch=batch, schedule=draw(st.sampled_from(["fifo", "least-slack", "replan-first"])),
        discard=draw(st.sampled_from(["on-start", "on-ready"])),
        cold_start=draw(st.booleans()))
    policy = draw(st.sampled_from([BASELINE, SPECULATIVE]))
    mean_c = draw(st.floats(0.05, 1.2)) * timing.T
    duration = timing.T * draw(st.floats(2.0, 6.0))
    traces = [draw(arrival_times(timing, duration)) for _ in range(n)]
    joins = [draw(st.floats(0.0, timing.T)) for _ in range(n)]
    return timing, serving, policy, mean_c, duration, traces, joins


@SETTINGS
@given(setup=serving_setups(), seed=st.integers(0, 1000))
def test_many_streams_keep_every_invariant(setup, seed):
    timing, serving, policy, mean_c, duration, traces, joins = setup
    cost = RecordingCost(mean_c, 0.3)
    config = ControllerConfig(timing, policy, cost.quantile(timing.K, 0.99), serving.discard)
    streams = inputs(traces, joins, seed)
    run = simulate_serving(config, cost, serving, streams, duration, np.random.default_rng(seed))
    K = timing.K
    for index, records in enumerate(run.streams):
        # no stream's played versions ever decrease; slots play in order, δ apart or more
        versions = [s.version for s in records.slots]
        assert versions == sorted(versions)
        assert [s.position for s in records.slots] == list(range(len(records.slots)))
        starts = [s.t_start for s in records.slots]
        assert all(b - a >= timing.delta - 1e-9 for a, b in zip(starts, starts[1:], strict=False))
        # every generated latent is played, discarded or still cached
        discarded = sum(d.count for d in records.discards)
        assert (records.jobs_done + 1) * K == len(records.slots) + discarded + (
            records.cached_at_end)
        for c in records.conditions:
            if c.displayed:
                assert min(c.R, c.C, c.Q) >= -EPS and abs(c.L - (c.R + c.C + c.Q)) < 1e-9
        # a job's R includes its wait for a device: its dit task starts at its t_start
        dit = {t.job_id: t for t in run.tasks if t.stream == index and t.stage == "dit"}
        origin = run.starts[index].t_origin
        for job in records.jobs:
            if job.job_id > 0:
                assert abs(dit[job.job_id].t_start - origin - job.t_start) < 1e-9
    # every device serves one task (or one batch) at a time
    by_device = defaultdict(dict)
    for task in run.tasks:
        by_device[(task.pool, task.device)][task.batch] = (task.t_start, task.t_end)
    for intervals in by_device.values():
        spans = sorted(intervals.values())
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    # per-device busy time is the sum of its tasks' costs: a task alone runs for exactly its
    # draw (the i-th DiT draw of a stream is its i-th job, plus the replan overhead)
    if serving.batch is None:
        for index, inputs_ in enumerate(streams):
            draws = cost.draws[id(inputs_.cost)]
            for task in run.tasks:
                if task.stream == index and task.stage == "dit" and task.t_end < run.end_time:
                    position = task.job_id - (0 if serving.cold_start else 1)
                    extra = 0.05 if task.kind == "replan" and serving.replan_cost else 0.0
                    assert abs(task.t_end - task.t_start - draws[position] - extra) < 1e-9
    busy = run.busy_by_device()
    for (pool, device), intervals in by_device.items():
        total = sum(max(0.0, min(e, run.window_end) - max(s, 0.0)) for s, e in intervals.values())
        assert abs(busy[pool][device] - total) < 1e-9
    # a fifo pool starts its tasks in the order they were queued
    if serving.schedule == "fifo" and serving.batch is None:
        for pool, _ in serving.pools:
            queued = sorted((t for t in run.tasks if t.pool == pool),
                            key=lambda t: (t.t_start, t.t_enqueue))
            enqueues = [t.t_enqueue for t in queued]
            assert enqueues == sorted(enqueues)


# ---------------------------------------------------------------- queueing theory


def _periodic_run(streams: int, ratio: float, start: str, seed: int, periods: int = 6):
    """Baseline streams with no conditions, fixed C = T / ratio, a lead that covers every
    wait (N·C + C/4 < T): each stream asks for a refill exactly every T, phase = its join."""
    timing = Timing(8, 4, 16.0)
    C = timing.T / ratio
    lead = (streams + 0.25) * C
    assert lead < timing.T
    rng = np.random.default_rng(seed)
    joins = (rng.uniform(0, timing.T, streams) if start == "random"
             else np.zeros(streams))
    serving = ServingConfig(streams=streams, start=start)
    run = simulate_serving(ControllerConfig(timing, BASELINE, lead), FixedCost(C), serving,
                           inputs([()] * streams, list(joins), seed), periods * timing.T,
                           np.random.default_rng(seed))
    return timing, C, run


def test_synchronised_streams_wait_in_a_deterministic_interleaving():
    """All streams join together: their refills are due at the same instants, FIFO serves
    them in stream order, so stream s waits exactly s·C every period and never stalls."""
    timing, C, run = _periodic_run(4, 5.0, "together", 0)
    for task in run.tasks:
        if task.job_id > 1:  # from the second refill on (the first is also due at once)
            assert abs(task.wait - task.stream * C) < 1e-9
    assert all(not s.stalls for s in run.streams)


@pytest.mark.parametrize(("streams", "ratio"), [(2, 4.0), (4, 5.0), (3, 3.5)])
def test_random_phases_wait_as_the_nd_d_1_queue(streams, ratio):
    """The mean wait of a refill for the shared device is the nD/D/1 mean (Roberts &
    Virtamo 1991, see latsim.analysis.queueing), averaged over random phases, and the
    device's unfinished work at a random instant (what an out-of-band job such as a rare
    replan waits for) is its virtual-wait mean. Each replication's mean (two steady periods:
    exactly one job per stream each) is one draw; the tolerance is 4 standard errors."""
    waits, work = [], []
    probe = np.random.default_rng(99)
    for seed in range(300):
        timing, C, run = _periodic_run(streams, ratio, "random", seed)
        assert all(not s.stalls for s in run.streams)  # the lead covers every wait
        window = [t.wait for t in run.tasks if 3 * timing.T <= t.t_enqueue < 5 * timing.T]
        assert len(window) == 2 * streams
        waits.append(np.mean(window))
        # the device's unfinished work seen at random instants of the same steady window
        at = probe.uniform(3 * timing.T, 5 * timing.T, 20)
        work.append(np.mean([sum(t.t_end - max(u, t.t_start) for t in run.tasks
                                 if t.t_enqueue <= u < t.t_end) for u in at]))
    for measured, expected in ((waits, periodic_wait_mean(streams, timing.T, C)),
                               (work, periodic_work_mean(streams, timing.T, C))):
        se = np.std(measured, ddof=1) / math.sqrt(len(measured))
        assert abs(np.mean(measured) - expected) <= 4 * se, (np.mean(measured), expected, se)


def test_queueing_closed_forms_agree_with_each_other():
    # E[V] = ρ (E[W] + C/2) (Brumelle); one stream never waits; hand value for N=2, D=4
    for n, ratio in [(2, 4.0), (4, 5.0), (8, 10.0), (3, 3.5)]:
        rho = n / ratio
        assert periodic_work_mean(n, ratio, 1.0) == pytest.approx(
            rho * (periodic_wait_mean(n, ratio, 1.0) + 0.5), rel=1e-12)
    assert periodic_wait_mean(1, 4.0, 1.0) == 0.0
    assert periodic_wait_mean(2, 4.0, 1.0) == pytest.approx(1 / 8)
    with pytest.raises(LatsimError, match="overload"):
        periodic_wait_mean(4, 4.0, 1.0)


def test_overloaded_device_stalls_grow_with_the_run_length():
    """ρ = N·C/T > 1 on one device: each stream's stall time grows without bound, at the
    rate 1 − 1/ρ. The deficit is exact up to edge effects of one chunk per stream (the
    free prebuffer and a partly served period at each end), so the tolerance is N·C + T
    seconds of stall over the window."""
    timing = Timing(8, 4, 16.0)
    streams, C = 3, 1.0  # ρ = 3 / 2
    rate = overload_stall_fraction(streams, timing.T, C)
    stalls = {}
    for duration in (100.0, 400.0):
        run = simulate_serving(
            ControllerConfig(timing, BASELINE, C), FixedCost(C),
            ServingConfig(streams=streams, start="staggered"),
            inputs([()] * streams, [i * timing.T / streams for i in range(streams)]),
            duration, np.random.default_rng(0))
        metrics = serving_metrics([run])
        stalls[duration] = metrics["stall_pct"] / 100 * duration
        assert abs(stalls[duration] - rate * duration) <= streams * C + timing.T
    assert stalls[400.0] - stalls[100.0] >= rate * 300 - 2 * (streams * C + timing.T)


# ---------------------------------------------------------------- binding a queued job


def _two_streams_one_condition(bind: str):
    """Two baseline streams on one device, joined together (K = 8, δ = 0.25 s, C = 0.5 s,
    lead 1 s); stream 1's refill is queued at 1.0 s behind stream 0's and starts at 1.5 s;
    its one condition arrives at 1.2 s, while that refill waits."""
    timing = Timing(8, 4, 16.0)
    config = ControllerConfig(timing, BASELINE, 1.0, bind=bind)
    run = simulate_serving(config, FixedCost(0.5), ServingConfig(streams=2, start="together"),
                           inputs([(), (1.2,)], [0.0, 0.0]), 6.0, np.random.default_rng(0))
    return run.streams[1]


def test_a_queued_job_takes_the_condition_known_when_the_device_starts_it():
    """DESIGN §6: a job is conditioned on the newest version known when it starts. Bound at
    start the queued refill carries the condition (L = R + C = 0.3 + 0.5); bound at enqueue
    it waits for the next chunk's refill (L = 2.8 s, one T later)."""
    at_start, at_enqueue = (_two_streams_one_condition(b) for b in ("start", "enqueue"))
    refill = at_start.jobs[1]
    assert (refill.kind, refill.t_start, refill.version) == ("refill", 1.5, 1)
    (cond,) = at_start.conditions
    assert cond.job_id == refill.job_id
    assert cond.R == pytest.approx(0.3) and cond.L == pytest.approx(0.8)
    assert at_enqueue.jobs[1].version == 0
    (late,) = at_enqueue.conditions
    assert late.job_id == at_enqueue.jobs[2].job_id and late.L == pytest.approx(2.8)
    assert late.L - cond.L == pytest.approx(Timing(8, 4, 16.0).T)


def test_bind_is_checked():
    with pytest.raises(LatsimError, match="bind must be start or enqueue"):
        ControllerConfig(Timing(8, 4, 16.0), BASELINE, 1.0, bind="later")
    with pytest.raises(LatsimError, match="--bind must be one of start, enqueue"):
        ServingConfig(bind="")


# ---------------------------------------------------------------- discard on ready


def _drive(discard: str):
    """A speculative stream whose replan finishes late (after its branch is due)."""
    timing = Timing(4, 1, 4.0)  # δ = 0.25 s, T = 1 s
    ctrl = Controller(ControllerConfig(timing, SPECULATIVE, 0.25, discard))
    ctrl.start(0.0)
    events = []

    def feed(event, now):
        events.extend(ctrl.handle(event, now))

    feed(SlotDue(0), 0.0)
    feed(ConditionArrived(), 0.1)
    replan = next(c for c in events if isinstance(c, StartJob) and c.kind == "replan")
    feed(JobStarted(replan.job_id), 0.2)  # it waited for a device
    feed(SlotDue(1), 0.25)
    feed(SlotDue(2), 0.5)  # the branch (position 2) is due: the replan is still running
    feed(SlotDue(3), 0.75)
    feed(JobDone(replan.job_id), 0.8)
    ctrl.finish(1.0)
    return ctrl, replan


def test_discard_on_ready_keeps_playing_the_old_future_until_the_replan_is_ready():
    on_start, replan = _drive("on-start")
    on_ready, replan_ready = _drive("on-ready")
    assert replan.branch == replan_ready.branch == 2
    # on-start: the future was discarded at once, so the player stalled at the branch
    assert on_start.stalls and on_start.stalls[0].position == 2
    assert [s.version for s in on_start.slots] == [0, 0, 1]
    # on-ready: positions 2 and 3 played from the old content, no stall; the replan's
    # first two latents came too late and count as waste, the rest replace the old future
    assert not on_ready.stalls
    assert [s.version for s in on_ready.slots] == [0, 0, 0, 0]
    assert [(d.job_id, d.first, d.count) for d in on_ready.discards] == [(replan.job_id, 2, 2)]
    assert on_ready.cached_positions == {4: (1, replan.job_id), 5: (1, replan.job_id)}
    # JobStarted moved the job's start: its wait counts in R
    assert on_ready.jobs[-1].t_start == 0.2
    K = 4
    assert K * (1 + on_ready.jobs_done) == on_ready.played + on_ready.discarded + len(
        on_ready.cached_positions)


def test_discard_on_ready_stalls_less_under_queueing():
    """Speculative streams sharing one device with the default lead: replans wait for the
    device, and keeping the old future playable removes stalls that discarding it on start
    causes (same arrivals and costs for both)."""
    timing = Timing(8, 4, 16.0)
    result = {}
    for discard in ("on-start", "on-ready"):
        stalls = []
        for seed in range(5):
            rng = np.random.default_rng(seed)
            traces = [tuple(np.sort(rng.uniform(0, 60, 12))) for _ in range(3)]
            run = simulate_serving(
                ControllerConfig(timing, SPECULATIVE, 0.5, discard), FixedCost(0.5),
                ServingConfig(streams=3, discard=discard),
                inputs(traces, [0.0, 0.7, 1.3], seed), 60.0, np.random.default_rng(seed))
            stalls.append(serving_metrics([run])["stall_pct"])
        result[discard] = np.mean(stalls)
    assert result["on-ready"] < result["on-start"]



# ---------------------------------------------------------------- scheduling and batching


class _FakeStream:
    def __init__(self, index: int, slack: float) -> None:
        self.index = index
        self._slack = slack
        self.env = SimpleNamespace(now=0.0)

    def slack(self, now: float) -> float:
        return self._slack


@pytest.mark.parametrize(("schedule", "expected"), [
    ("fifo", [0, 1, 2]),  # queue order
    ("least-slack", [2, 0, 1]),  # slack 0.1 < 0.5 < 2.0
    ("replan-first", [1, 0, 2]),  # the one replan, then queue order
])
def test_a_free_device_takes_the_task_its_schedule_names(schedule, expected):
    from latsim.model.generators import StagedGenerator
    from latsim.sim.clock import Clock
    from latsim.sim.serving import _Engine, _Task

    env = Clock()
    engine = _Engine(env, ServingConfig(schedule=schedule), np.random.default_rng(0),
                     StagedGenerator(FixedCost(1.0)))
    pool = engine.pools["dit"]
    pool.free.clear()  # the device is busy: tasks queue
    slacks, kinds = (0.5, 2.0, 0.1), ("refill", "replan", "refill")
    for i in range(3):
        pool.waiting.append(_Task(_FakeStream(i, slacks[i]), i + 1, kinds[i], "dit", 8, 1.0,
                                  0.0, i, lambda s, e: None))
    assert [pool._next(0.0).stream for _ in range(3)] == expected


def test_waiting_dit_tasks_run_as_one_batch_at_the_batch_cost():
    """Two streams join together, so their refills are queued at the same instant: with a
    batch of up to 2 they run together, once, for the batch's cost (a fixed 0.1 s here,
    not 2 x 0.4 s); with a batch of 1 the second waits behind the first, which takes its
    own 0.4 s."""
    timing = Timing(8, 4, 16.0)
    for size, together in ((2, True), (1, False)):
        serving = ServingConfig(streams=2, start="together",
                                batch=Batching(FixedCost(0.1), size))
        run = simulate_serving(ControllerConfig(timing, BASELINE, 1.0), FixedCost(0.4),
                               serving, inputs([(), ()], [0.0, 0.0]), 10.0,
                               np.random.default_rng(0))
        first = sorted((t for t in run.tasks if t.job_id == 1), key=lambda t: t.stream)
        if together:
            assert first[0].batch == first[1].batch
            assert first[0].t_start == first[1].t_start == first[0].t_enqueue
            assert first[0].t_end - first[0].t_start == pytest.approx(0.1)
        else:  # a batch of one costs the task's own draw
            assert first[0].batch != first[1].batch
            assert first[1].t_start == pytest.approx(first[0].t_end)
            assert first[0].t_end - first[0].t_start == pytest.approx(0.4)


def test_replication_standard_errors_are_those_of_the_pooled_metrics():
    """With equal windows the pooled stall % is the mean of the replications', so its
    jackknife SE is their s/√n; the percentiles' SEs are there from two replications."""
    from latsim.analysis.serving import replication_se, viewer_stall_pct
    from latsim.experiments.engine import Experiment, run_experiment

    experiment = Experiment(Ks=(8,), cost="lognormal:0.45,0.3", updates="poisson:0.2",
                            policies=("speculative",), lead=0.6, duration=120.0, seeds=5,
                            serving=ServingConfig(streams=3, start="random"))
    result = run_experiment(experiment, jobs=1)
    runs = result.runs[8, "speculative"]
    row = next(r for r in result.rows if r["policy"] == "speculative")
    spread = replication_se(runs)
    server = np.array([serving_metrics([run])["stall_pct"] for run in runs])
    viewer = np.array([viewer_stall_pct([run]) for run in runs])
    assert server.mean() == pytest.approx(row["stall_pct"], rel=1e-9)
    assert viewer.mean() == pytest.approx(row["viewer_stall_pct"], rel=1e-9)
    assert server.std(ddof=1) > 0  # else the check below says nothing
    assert spread["stall_pct_se"] == pytest.approx(server.std(ddof=1) / math.sqrt(5))
    assert spread["viewer_stall_pct_se"] == pytest.approx(viewer.std(ddof=1) / math.sqrt(5))
    assert all(spread[f"L{level}_se"] > 0 for level in (50, 95, 99))
    assert set(replication_se(runs[:1]).values()) == {None}


def _kiefer_wolfowitz_waits(arrivals: list[float], servers: int, service: float) -> list[float]:
    """Brute force: each job (in arrival order) takes the device that frees first."""
    free = [0.0] * servers
    waits = []
    for arrival in arrivals:
        device = min(range(servers), key=lambda d: free[d])
        start = max(arrival, free[device])
        free[device] = start + service
        waits.append(start - arrival)
    return waits


def test_the_pool_recursion_is_the_lowest_free_device_queue():
    """With one service time, the j-th job takes the device the (j − c)-th frees: the
    recursion behind pool_wait_quantile gives every wait a brute-force c-server FIFO gives."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        servers, streams = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        ratio = streams / servers / rng.uniform(0.3, 0.95)  # T/C, ρ < 1
        phases = np.sort(rng.uniform(0, ratio, streams))
        arrivals = [p * ratio + phase for p in range(6) for phase in phases]
        freed = [-math.inf] * servers
        recursion = []
        for j, arrival in enumerate(arrivals):
            start = max(arrival, freed[j % servers])
            freed[j % servers] = start + 1.0
            recursion.append(start - arrival)
        assert recursion == pytest.approx(_kiefer_wolfowitz_waits(arrivals, servers, 1.0),
                                          abs=1e-9)


@pytest.mark.parametrize(("streams", "ratio"), [(4, 6.0), (8, 10.0), (16, 20.0)])
def test_the_pool_quantile_on_one_device_is_the_nd_d_1_closed_form(streams, ratio):
    """Played over its phase draws, one device's waits exceed the Roberts & Virtamo 0.99
    quantile for 1 % of the jobs, within 4 binomial standard errors of its draws."""
    from latsim.analysis.queueing import POOL_PHASE_DRAWS, _pool_waits

    waits = _pool_waits(streams, 1, ratio)
    q = periodic_wait_quantile(0.99, streams, ratio, 1.0)
    assert abs(np.mean(waits > q) - 0.01) <= 4 * math.sqrt(0.01 * 0.99 / POOL_PHASE_DRAWS)


@pytest.mark.parametrize(("streams", "devices", "ratio"), [(6, 2, 4.0), (12, 4, 4.0)])
def test_random_phases_on_a_pool_wait_as_the_nd_d_c_quantile(streams, devices, ratio):
    """The serving simulator's refills on a FIFO pool of ``devices`` wait as long on average
    as the pool's phase draws do, and exceed its 0.9 and 0.99 wait quantiles as often as
    those levels say: over 400 phase draws (a run each,
    two steady periods), within 4 standard errors of the runs' shares plus 4 binomial ones
    of the quantile's own draws (a share of one draw varies at most as a Bernoulli)."""
    from latsim.analysis.queueing import POOL_PHASE_DRAWS, _pool_waits

    timing = Timing(8, 4, 16.0)
    C = timing.T / ratio
    quantiles = {level: pool_wait_quantile(level, streams, devices, timing.T, C)
                 for level in (0.9, 0.99)}
    assert 0 < quantiles[0.99] < periodic_wait_quantile(0.99, -(-streams // devices), timing.T,
                                                        C)  # a shared queue beats ⌈N/c⌉ each
    lead = (-(-streams // devices) + 0.25) * C  # covers every wait: none stalls
    assert lead < timing.T
    seen: dict[float, list[float]] = {level: [] for level in quantiles}
    means = []
    runs = 400
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        serving = ServingConfig(streams=streams, start="random", pools=(("dit", devices),))
        run = simulate_serving(ControllerConfig(timing, BASELINE, lead), FixedCost(C),
                               serving, inputs([()] * streams,
                                               list(rng.uniform(0, timing.T, streams)), seed),
                               8 * timing.T, np.random.default_rng(seed))
        window = [t.wait for t in run.tasks if 5 * timing.T <= t.t_enqueue < 7 * timing.T]
        assert len(window) == 2 * streams and not any(s.stalls for s in run.streams)
        means.append(np.mean(window))
        for level, q in quantiles.items():
            seen[level].append(np.mean(np.array(window) > q + 1e-9))
    drawn = _pool_waits(streams, devices, ratio) * C  # the waits the quantiles come from
    tolerance = (4 * np.std(means, ddof=1) / math.sqrt(runs)
                 + 4 * np.std(drawn) / math.sqrt(POOL_PHASE_DRAWS))
    assert abs(np.mean(means) - np.mean(drawn)) <= tolerance
    for level, shares in seen.items():
        p = 1 - level
        tolerance = (4 * np.std(shares, ddof=1) / math.sqrt(runs)
                     + 4 * math.sqrt(p * level / POOL_PHASE_DRAWS))
        assert abs(np.mean(shares) - p) <= tolerance, (level, np.mean(shares), tolerance)


def test_the_pool_quantile_refuses_an_overload_and_needs_no_queue_past_one_device_each():
    assert pool_wait_quantile(0.99, 4, 4, 1.0, 0.9) == 0.0
    assert pool_wait_quantile(0.99, 3, 1, 4.0, 1.0) == periodic_wait_quantile(0.99, 3, 4.0, 1.0)
    with pytest.raises(LatsimError, match="overload"):
        pool_wait_quantile(0.99, 8, 2, 4.0, 1.0)
    with pytest.raises(LatsimError, match="servers"):
        pool_wait_quantile(0.99, 8, 0, 4.0, 1.0)
