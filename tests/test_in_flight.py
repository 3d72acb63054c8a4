"""Several chunks in flight per stream, and what a new condition does to them (let-play or
flush): the controller fed by hand, the serving model's invariants over random settings,
and the drivers that run one job at a time refusing them."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    State,
    WakeUp,
)
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.sim.serving import simulate_serving
from latsim.sim.simpy_driver import simulate_trace
from tests.helpers import rows_of
from tests.test_properties import arrival_times
from tests.test_serving import inputs

# K = 2 latents of 0.25 s: T = 0.5 s. A chunk takes C = 1 s = 2 T: one chunk in flight
# cannot keep up, three can.
TIMING = Timing(K=2, r=4, fps=16.0)
DELTA, C = 0.25, 1.0


def make(in_flight: int = 3, policy: str = "let-play", run_ahead: float = 0.0,
         commit=SPECULATIVE) -> Controller:
    return Controller(ControllerConfig(TIMING, commit, C, in_flight=in_flight,
                                       in_flight_policy=policy, run_ahead=run_ahead))


def starts(commands) -> list[StartJob]:
    return [c for c in commands if isinstance(c, StartJob)]


def test_one_instant_fills_every_chunk_in_flight_that_is_due():
    ctrl = make(in_flight=3)
    first = starts(ctrl.start(0.0))
    # the prebuffer covers [0, 2); refills for 2 (due at 0.5 - 1 s) and 4 (due at 0) start
    # at once, the one for 6 (due at 0.5) waits for its wake-up
    assert [(j.branch, j.version) for j in first] == [(2, 0), (4, 0)]
    assert ctrl.state is State.PRODUCE and ctrl.jobs_in_flight == (1, 2)
    assert ctrl.planned_end == 6 and ctrl.cache_end == 2
    ctrl.handle(SlotDue(0), 0.0)
    later = ctrl.handle(SlotDue(1), DELTA)
    assert not starts(later)
    due = starts(ctrl.handle(SlotDue(2), 2 * DELTA))  # 0.5 s: the third is due
    assert [j.branch for j in due] == [6] and ctrl.jobs_in_flight == (1, 2, 3)
    # full: no fourth even when it is due
    assert not starts(ctrl.handle(WakeUp(), 1.0))


def test_with_one_chunk_in_flight_produce_decides_nothing():
    ctrl = make(in_flight=1)
    commands = ctrl.start(0.0)
    assert [j.branch for j in starts(commands)] == [2]
    for position in range(2):
        commands = ctrl.handle(SlotDue(position), position * DELTA)
        assert not starts(commands)
        assert not [c for c in commands if isinstance(c, ScheduleWakeUp)
                    and isinstance(c.event, WakeUp)]


def test_chunks_that_end_out_of_order_wait_for_the_one_before_them():
    ctrl = make(in_flight=3)
    ctrl.start(0.0)
    ctrl.handle(JobDone(2), 0.8)  # positions 4, 5 are ready before 2, 3
    assert ctrl.cache_end == 2 and {4, 5} <= set(ctrl.cached_positions)
    ctrl.handle(JobDone(1), 0.9)
    assert ctrl.cache_end == 6 and ctrl.state is State.PRODUCE  # job 3 is not started yet


def test_let_play_keeps_the_chunks_in_flight_and_the_next_refill_carries_the_condition():
    ctrl = make(in_flight=3, policy="let-play")
    ctrl.start(0.0)
    ctrl.handle(SlotDue(0), 0.0)
    ctrl.handle(ConditionArrived(), 0.1)
    assert not starts(ctrl.handle(SlotDue(1), DELTA))  # no replan with chunks in flight
    job = starts(ctrl.handle(SlotDue(2), 2 * DELTA))[0]
    assert (job.kind, job.branch, job.version) == ("refill", 6, 1)
    ctrl.handle(JobDone(1), 1.0)
    ctrl.handle(JobDone(2), 1.0)
    assert not ctrl.discards and ctrl.discarded == 0


def test_flush_replans_at_once_and_drops_the_chunks_in_flight_behind_the_branch():
    ctrl = make(in_flight=3, policy="flush", run_ahead=1.0)
    first = starts(ctrl.start(0.0))  # run-ahead: three refills due at once
    assert [j.branch for j in first] == [2, 4, 6]
    ctrl.handle(SlotDue(0), 0.0)
    replan = starts(ctrl.handle(ConditionArrived(), 0.1))
    # the branch one lead ahead: 0.1 + 1 s -> slot 5, inside job 2's chunk [4, 6): that
    # chunk plays, the replan branches after it and job 3 ([6, 8)) is flushed
    assert [(j.kind, j.branch, j.version) for j in replan] == [("replan", 6, 1)]
    assert ctrl.jobs_in_flight == (1, 2, 3, 4) and ctrl.planned_end == 8
    ctrl.handle(JobDone(1), 1.0)
    ctrl.handle(JobDone(2), 1.0)
    ctrl.handle(JobDone(3), 1.0)  # flushed: its output is dropped, counted as discarded
    assert [(d.job_id, d.first, d.count, d.by_version) for d in ctrl.discards] == [(3, 6, 2, 1)]
    assert ctrl.cache_end == 6 and 6 not in ctrl.cached_positions
    refills = starts(ctrl.handle(JobDone(4), 1.1))
    assert ctrl.cached_positions[6] == (1, 4) and ctrl.cache_end == 8
    # run-ahead: each chunk that lands makes room for another, under the new version
    assert refills and all(j.kind == "refill" and j.version == 1 for j in refills)


def test_flush_discards_a_cached_chunk_behind_the_branch_too():
    ctrl = make(in_flight=2, policy="flush", run_ahead=1.0)
    ctrl.start(0.0)  # jobs 1 ([2, 4)) and 2 ([4, 6))
    ctrl.handle(SlotDue(0), 0.0)
    ctrl.handle(JobDone(1), 0.2)
    ctrl.handle(JobDone(2), 0.2)  # cached up to 6; jobs 3 ([6, 8)) and 4 ([8, 10)) start
    assert ctrl.cache_end == 6 and ctrl.jobs_in_flight == (3, 4)
    replan = starts(ctrl.handle(ConditionArrived(), 0.2))  # branch: slot of 1.2 s -> 5
    # the replan, then (room again: the flushed chunks do not count) the refill behind it
    assert [(j.kind, j.branch, j.version) for j in replan] == [("replan", 5, 1),
                                                               ("refill", 7, 1)]
    assert {(d.job_id, d.first, d.count) for d in ctrl.discards} == {(2, 5, 1)}
    assert ctrl.cache_end == 5 and ctrl.planned_end == 9
    assert ctrl.jobs_in_flight == (3, 4, 5, 6)
    for job_id in (3, 4):  # both flushed: dropped when they land
        ctrl.handle(JobDone(job_id), 0.9)
    assert [(d.job_id, d.first, d.count) for d in ctrl.discards[1:]] == [(3, 6, 2), (4, 8, 2)]
    assert ctrl.discarded == 5 and not {6, 7, 8, 9} & set(ctrl.cached_positions)


@pytest.mark.parametrize("bad", [
    {"in_flight": 0}, {"in_flight": 65}, {"in_flight": 2.0}, {"in_flight_policy": "drop"},
    {"run_ahead": -1.0}, {"discard": "on-ready", "in_flight": 2},
    {"discard": "on-ready", "in_flight_policy": "flush"},
])
def test_bad_in_flight_settings_are_one_line_errors(bad):
    with pytest.raises(LatsimError):
        ControllerConfig(TIMING, SPECULATIVE, C, **bad)


def test_the_single_worker_simulator_refuses_overlapping_jobs():
    config = ControllerConfig(TIMING, SPECULATIVE, C, in_flight=2)
    with pytest.raises(LatsimError, match="serving model"):
        simulate_trace(config, FixedCost(C), Trace("t", (), 5.0), 5.0,
                       np.random.default_rng(0))


@st.composite
def pipelined_setups(draw):
    timing = Timing(draw(st.sampled_from([1, 2, 4])), 4, 16.0)
    n = draw(st.integers(1, 3))
    serving = ServingConfig(
        streams=n, pools=(("dit", draw(st.integers(1, 4))),),
        schedule=draw(st.sampled_from(["fifo", "least-slack", "replan-first"])),
        in_flight=draw(st.integers(1, 4)),
        in_flight_policy=draw(st.sampled_from(["let-play", "flush"])),
        cold_start=draw(st.booleans()))
    policy = draw(st.sampled_from([BASELINE, SPECULATIVE]))
    mean_c = draw(st.floats(0.1, 3.0)) * timing.T  # past T: chunks must overlap
    run_ahead = draw(st.sampled_from([0.0, timing.delta, timing.T]))
    duration = timing.T * draw(st.floats(2.0, 8.0))
    traces = [draw(arrival_times(timing, duration)) for _ in range(n)]
    joins = [draw(st.floats(0.0, timing.T)) for _ in range(n)]
    return timing, serving, policy, mean_c, run_ahead, duration, traces, joins


@settings(max_examples=int(os.environ.get("LATSIM_IN_FLIGHT_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(setup=pipelined_setups(), seed=st.integers(0, 1000))
def test_chunks_in_flight_keep_every_invariant(setup, seed):
    timing, serving, policy, mean_c, run_ahead, duration, traces, joins = setup
    cost = LognormalCost(mean_c, 0.3)
    config = ControllerConfig(timing, policy, cost.quantile(timing.K, 0.99),
                              in_flight=serving.in_flight,
                              in_flight_policy=serving.in_flight_policy, run_ahead=run_ahead)
    run = simulate_serving(config, cost, serving, inputs(traces, joins, seed), duration,
                           np.random.default_rng(seed))
    K = timing.K
    for records in run.streams:
        # slots play once each, in order, δ apart or more, never an older version
        assert [s.position for s in records.slots] == list(range(len(records.slots)))
        versions = [s.version for s in records.slots]
        assert versions == sorted(versions)
        starts_ = [s.t_start for s in records.slots]
        assert all(b - a >= timing.delta - 1e-9 for a, b in zip(starts_, starts_[1:],
                                                                 strict=False))
        # no slot plays before its job was ready
        ready = {j.job_id: j.t_ready for j in records.jobs}
        assert all(s.t_start >= ready[s.job_id] - 1e-9 for s in records.slots)
        # every generated latent is played, discarded or still cached
        discarded = sum(d.count for d in records.discards)
        assert (records.jobs_done + 1) * K == len(records.slots) + discarded + (
            records.cached_at_end)
        # at most in_flight jobs overlap (flushed ones ran on: they are not counted out)
        spans = sorted((j.t_start, j.t_ready) for j in records.jobs if j.job_id > 0)
        if serving.in_flight_policy == "let-play":
            for t, _ in spans:
                assert sum(a <= t < b for a, b in spans) <= serving.in_flight
            # let-play never drops a chunk in flight: a discard is a cached future's
            assert all(d.count <= K for d in records.discards)
        for c in records.conditions:
            if c.displayed:
                assert min(c.R, c.C, c.Q) >= -1e-9 and abs(c.L - (c.R + c.C + c.Q)) < 1e-9


def test_run_ahead_starts_the_refill_that_much_earlier():
    timing = Timing(K=4, r=4, fps=16.0)  # T = 1 s
    for run_ahead, due in ((0.0, 0.7), (0.5, 0.2)):
        ctrl = Controller(ControllerConfig(timing, BASELINE, 0.3, run_ahead=run_ahead))
        wakeups = [c.at for c in ctrl.start(0.0)
                   if isinstance(c, ScheduleWakeUp) and isinstance(c.event, WakeUp)]
        assert wakeups == [pytest.approx(due)]


def test_the_command_line_runs_chunks_in_flight_and_rejects_bad_values():

    from typer.testing import CliRunner

    from latsim.cli import app

    args = ["sweep", "--K", "3", "--C", "2.0", "--pools", "dit=4", "--in-flight", "4",
            "--run-ahead", "1.5", "--duration", "30", "--seeds", "2", "--json"]
    rows = {}
    for policy in ("let-play", "flush"):
        result = CliRunner().invoke(app, [*args, "--in-flight-policy", policy])
        assert result.exit_code == 0, result.output
        rows[policy] = {r["policy"]: r for r in rows_of(result.stdout)}
    # C = 2 s is 2.7 chunks of video: with four in flight the stream keeps up; flushing the
    # buffer a new condition finds shortens its wait and discards work, letting it play not
    for policy in ("baseline", "speculative"):
        played, flushed = rows["let-play"][policy], rows["flush"][policy]
        assert played["w"] == 0 and flushed["w"] > 0
        assert flushed["L50"] < played["L50"] - 0.5
    for bad, words in ((["--in-flight", "65"], "--in-flight"),
                       (["--in-flight-policy", "drop"], "--in-flight-policy"),
                       (["--run-ahead", "-1"], "run-ahead")):
        result = CliRunner().invoke(app, [*args, *bad])
        assert result.exit_code == 2 and words in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_flushed_job_that_waited_for_a_device_is_recorded_from_its_device_start():
    from latsim.controller import JobStarted

    ctrl = make(in_flight=3, policy="flush", run_ahead=1.0)
    ctrl.start(0.0)  # jobs 1, 2, 3 for [2, 4), [4, 6), [6, 8)
    ctrl.handle(SlotDue(0), 0.0)
    ctrl.handle(ConditionArrived(), 0.1)  # flushes job 3
    ctrl.handle(JobStarted(3), 0.4)  # it still runs: a device takes it late
    ctrl.handle(JobDone(3), 1.3)
    record = next(j for j in ctrl.jobs if j.job_id == 3)
    assert (record.t_start, record.t_ready) == (0.4, 1.3)
    assert [(d.job_id, d.count) for d in ctrl.discards] == [(3, 2)]


def test_a_stalled_player_is_not_flushed():
    ctrl = make(in_flight=1, policy="flush")
    ctrl.start(0.0)  # job 1 for [2, 4), due at 0.5 but C = 1 s: the player stalls at 2
    for position in range(3):
        ctrl.handle(SlotDue(position), position * DELTA)
    assert ctrl.stalled
    assert not starts(ctrl.handle(ConditionArrived(), 0.6))  # only the job in flight helps
    assert ctrl.jobs_in_flight == (1,)
