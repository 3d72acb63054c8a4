"""Controller unit tests: events fed by hand (no SimPy), commands and state asserted."""

from __future__ import annotations

import pytest

from latsim.controller import (
    TRANSITIONS,
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    PlaySlot,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    State,
    WakeUp,
    mermaid_diagram,
)
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.timing import Timing
from latsim.errors import LatsimError

# K=4 latents of 0.25 s: T = 1 s. Lead = C = 0.3 s.
TIMING = Timing(K=4, r=4, fps=16.0)
DELTA = 0.25
LEAD = 0.3


def make(policy: Policy = SPECULATIVE, lead: float = LEAD) -> Controller:
    return Controller(ControllerConfig(TIMING, policy, lead))


def of_type(commands, kind):
    return [c for c in commands if isinstance(c, kind)]


def play_through(ctrl: Controller, until_position: int, start_time: float = 0.0) -> None:
    """Deliver SlotDue for every position up to ``until_position`` on schedule."""
    for pos in range(ctrl.next_position, until_position + 1):
        ctrl.handle(SlotDue(pos), start_time + pos * DELTA)


def test_start_prebuffers_version_zero_and_schedules_first_slot_and_refill():
    ctrl = make()
    commands = ctrl.start(0.0)
    assert ScheduleWakeUp(0.0, SlotDue(0)) in commands
    wakeups = [c for c in of_type(commands, ScheduleWakeUp) if isinstance(c.event, WakeUp)]
    assert [w.at for w in wakeups] == [pytest.approx(4 * DELTA - LEAD)]
    assert ctrl.state is State.CONSUME
    assert ctrl.cached_positions == {p: (0, 0) for p in range(4)}
    assert ctrl.jobs[0].kind == "prebuffer"
    assert ctrl.next_deadline() == 0.0


def test_slot_due_plays_cached_slot_and_schedules_next():
    ctrl = make()
    ctrl.start(0.0)
    commands = ctrl.handle(SlotDue(0), 0.0)
    assert PlaySlot(0, 0, 0, 0.0) in commands
    assert ScheduleWakeUp(DELTA, SlotDue(1)) in commands
    assert ctrl.next_position == 1
    assert [s.position for s in ctrl.slots] == [0]


def test_refill_starts_at_cache_end_when_due_and_not_before():
    ctrl = make()
    ctrl.start(0.0)
    play_through(ctrl, 2)
    assert ctrl.running_job is None
    early = ctrl.handle(WakeUp(), 0.5)  # refill due at 1.0 - 0.3 = 0.7
    assert not of_type(early, StartJob)
    commands = ctrl.handle(WakeUp(), 0.7)
    (job,) = of_type(commands, StartJob)
    assert (job.kind, job.branch, job.length, job.version) == ("refill", 4, 4, 0)
    assert ctrl.state is State.PRODUCE


def test_speculative_condition_while_idle_replans_at_first_feasible_latent():
    ctrl = make()
    ctrl.start(0.0)
    play_through(ctrl, 0)
    commands = ctrl.handle(ConditionArrived(), 0.1)
    (job,) = of_type(commands, StartJob)
    # first slot starting at or after 0.1 + 0.3 = 0.4 is position 2 (starts 0.5)
    assert (job.kind, job.branch, job.version) == ("replan", 2, 1)
    assert ctrl.cached_positions.keys() == {1}  # position 0 played, 2..3 discarded
    (discard,) = ctrl.discards
    assert (discard.job_id, discard.first, discard.count) == (0, 2, 2)
    assert ctrl.state is State.PRODUCE


def test_baseline_never_replans_a_committed_chunk():
    ctrl = make(BASELINE)
    ctrl.start(0.0)
    play_through(ctrl, 0)
    commands = ctrl.handle(ConditionArrived(), 0.1)
    assert not of_type(commands, StartJob)
    assert ctrl.locked_end == 4
    # the next chunk's refill picks up the new version
    (job,) = of_type(ctrl.handle(WakeUp(), 0.7), StartJob)
    assert (job.kind, job.branch, job.version) == ("refill", 4, 1)


def test_running_job_is_never_aborted_and_pending_version_replans_after_it():
    ctrl = make()
    ctrl.start(0.0)
    play_through(ctrl, 0)
    (first,) = of_type(ctrl.handle(ConditionArrived(), 0.1), StartJob)
    commands = ctrl.handle(ConditionArrived(), 0.2)
    assert not of_type(commands, StartJob)
    assert ctrl.running_job == first.job_id and ctrl.state is State.PRODUCE
    play_through(ctrl, 1)
    commands = ctrl.handle(JobDone(first.job_id), 0.4)
    (second,) = of_type(commands, StartJob)
    # first slot at or after 0.7 is position 3 (0.75); position 2 keeps version 1
    assert (second.kind, second.branch, second.version) == ("replan", 3, 2)
    assert ctrl.cached_positions == {2: (1, first.job_id)}


def test_stall_when_due_slot_is_missing_and_recovery_on_job_done():
    ctrl = make(lead=0.1)  # too little lead for a 0.3 s job
    ctrl.start(0.0)
    play_through(ctrl, 3)
    (job,) = of_type(ctrl.handle(WakeUp(), 0.9), StartJob)
    commands = ctrl.handle(SlotDue(4), 1.0)
    assert not of_type(commands, PlaySlot) and ctrl.stalled
    assert ctrl.next_deadline() is None
    commands = ctrl.handle(JobDone(job.job_id), 1.2)
    assert PlaySlot(4, 0, job.job_id, 1.2) in commands
    assert ScheduleWakeUp(pytest.approx(1.45), SlotDue(5)) in commands
    (stall,) = ctrl.stalls
    assert (stall.position, stall.t_start, stall.t_end) == (4, 1.0, 1.2)


def test_condition_latency_splits_into_r_c_q_from_the_serving_job():
    ctrl = make()
    ctrl.start(0.0)
    play_through(ctrl, 0)
    (job,) = of_type(ctrl.handle(ConditionArrived(), 0.1), StartJob)
    ctrl.handle(JobDone(job.job_id), 0.4)
    play_through(ctrl, 2)
    (cond,) = ctrl.conditions
    assert cond.version == 1 and not cond.superseded
    assert pytest.approx(0.0) == cond.R
    assert pytest.approx(0.3) == cond.C
    assert pytest.approx(0.1) == cond.Q
    assert pytest.approx(0.4) == cond.L


def test_overtaken_condition_is_recorded_as_superseded():
    ctrl = make(BASELINE)
    ctrl.start(0.0)
    play_through(ctrl, 0)
    ctrl.handle(ConditionArrived(), 0.1)
    ctrl.handle(ConditionArrived(), 0.2)
    (job,) = of_type(ctrl.handle(WakeUp(), 0.7), StartJob)
    assert job.version == 2
    play_through(ctrl, 3)
    ctrl.handle(JobDone(job.job_id), 1.0)
    ctrl.handle(SlotDue(4), 1.0)
    by_version = {c.version: c for c in ctrl.conditions}
    assert by_version[1].superseded and not by_version[2].superseded
    assert by_version[1].t_play == by_version[2].t_play == 1.0


def test_finish_records_unresolved_conditions_as_censored():
    ctrl = make(BASELINE)
    ctrl.start(0.0)
    ctrl.handle(ConditionArrived(), 0.1)
    ctrl.finish(0.2)
    (cond,) = ctrl.conditions
    assert not cond.displayed


def test_stale_events_are_harmless():
    ctrl = make()
    ctrl.start(0.0)
    ctrl.handle(SlotDue(0), 0.0)
    assert ctrl.handle(SlotDue(0), 0.0) == []  # already played
    ctrl.handle(WakeUp(), 0.05)  # not due: nothing starts
    assert ctrl.running_job is None


def test_job_done_for_a_job_that_is_not_running_is_an_error():
    ctrl = make()
    ctrl.start(0.0)
    with pytest.raises(RuntimeError):
        ctrl.handle(JobDone(99), 0.0)


def test_lazy_commit_unit_q_locks_whole_groups_and_aligns_branches():
    policy = Policy("ablation", q=2, commit="lazy")
    ctrl = Controller(ControllerConfig(TIMING, policy, 0.05))
    ctrl.start(0.0)
    ctrl.handle(SlotDue(0), 0.0)
    assert ctrl.locked_end == 2  # playing position 0 commits its group {0, 1}
    (job,) = of_type(ctrl.handle(ConditionArrived(), 0.01), StartJob)
    assert job.branch == 2  # position 1 would be feasible, but it is committed


def test_q_must_divide_k():
    with pytest.raises(LatsimError, match="does not divide"):
        ControllerConfig(TIMING, Policy("bad", q=3, commit="lazy"), 0.1)


def test_transition_table_covers_every_state_and_event():
    kinds = {"condition_arrived", "job_done", "slot_due", "wake_up"}
    for state in State:
        for kind in kinds - ({"job_done"} if state is State.CONSUME else set()):
            assert any(t.source is state and t.trigger == kind for t in TRANSITIONS), (state, kind)
    diagram = mermaid_diagram()
    assert diagram.startswith("stateDiagram-v2")
    assert "Consume --> Produce: decide [replan_feasible] / start_replan" in diagram
