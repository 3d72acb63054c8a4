"""Controller unit tests: events fed by hand (no SimPy), commands and state asserted."""

from __future__ import annotations

import pytest

from latsim.controller import (
    EVENT_KINDS,
    TRANSITIONS,
    AdaptiveLead,
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    JobStarted,
    PlaySlot,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    State,
    Transition,
    WakeUp,
    mermaid_diagram,
)
from latsim.controller.machine import Decide, _compile
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
    assert not of_type(commands, StartJob)  # both guarded decide rows were skipped


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


def test_refill_fires_when_the_replan_guard_before_it_does_not_hold():
    ctrl = make()
    ctrl.start(0.0)
    play_through(ctrl, 2)
    # version 1 is pending, but the first feasible branch (0.7 + 0.3 -> position 4) is the
    # cache end: the replan row's guard fails and the refill row fires with the new version
    (job,) = of_type(ctrl.handle(ConditionArrived(), 0.7), StartJob)
    assert (job.kind, job.branch, job.version) == ("refill", 4, 1)
    assert not ctrl.discards


def test_dispatch_covers_exactly_the_table_in_table_order():
    dispatch = Controller._dispatch
    for state, by_trigger in dispatch.items():
        for trigger, rows in by_trigger.items():
            expected = [t for t in TRANSITIONS
                        if t.trigger is trigger and t.source in (None, state)]
            assert [entry[0] for entry in rows] == expected
            # only the last row may be unguarded: every row can fire
            assert all(entry[1] is not None for entry in rows[:-1])
            for row, guard, action, target, target_rows in rows:
                assert action is getattr(Controller, "_act_" + row.action)
                assert guard is (None if row.guard is None
                                 else getattr(Controller, "_guard_" + row.guard))
                assert target is (state if row.target is None else row.target)
                assert target_rows is dispatch[target]
    compiled = {entry[0] for by_trigger in dispatch.values() for rows in by_trigger.values()
                for entry in rows}
    assert compiled == set(TRANSITIONS)


def test_every_event_has_a_row_in_every_state_except_job_done_in_consume():
    for state in State:
        for event_type in (ConditionArrived, JobDone, SlotDue, WakeUp):
            has_row = event_type in Controller._dispatch[state]
            assert has_row is not (state is State.CONSUME and event_type is JobDone)
    assert Decide in Controller._dispatch[State.CONSUME]
    # Produce decides too (another chunk in flight, a flush); its last row holds
    produce = Controller._dispatch[State.PRODUCE][Decide]
    assert produce[-1][0].action == "hold" and produce[-1][1] is None


def test_event_with_no_row_raises():
    ctrl = make()
    ctrl.start(0.0)
    with pytest.raises(RuntimeError, match="no transition for JobDone in Consume"):
        ctrl.handle(JobDone(0), 0.0)
    with pytest.raises(RuntimeError, match="no transition for object in Consume"):
        ctrl.handle(object(), 0.0)  # type: ignore[arg-type]


class _Probe(Controller):
    """A controller whose table has a guarded event row and no decide step."""

    def __init__(self, table: tuple[Transition, ...]) -> None:
        self._dispatch = _compile(table, _Probe)  # type: ignore[misc]
        super().__init__(ControllerConfig(TIMING, SPECULATIVE, LEAD))
        self.marked: list[int] = []

    def _guard_odd(self, event: SlotDue, now: float) -> int | None:
        return event.position * 10 if event.position % 2 else None

    def _act_mark(self, value: int, now: float, out: list) -> None:
        self.marked.append(value)


def test_event_rows_are_tried_in_order_and_the_first_whose_guard_holds_fires():
    C, P = State.CONSUME, State.PRODUCE
    ctrl = _Probe((
        Transition(C, SlotDue, "odd", P, "mark", "odd positions: marked, go to Produce"),
        Transition(None, SlotDue, None, None, "play_or_stall", "otherwise: play"),
    ))
    ctrl.start(0.0)
    commands = ctrl.handle(SlotDue(0), 0.0)  # guard fails: the second row plays
    assert PlaySlot(0, 0, 0, 0.0) in commands and ctrl.state is C and ctrl.marked == []
    assert ctrl.handle(SlotDue(1), DELTA) == []  # guard holds: its value reaches the action
    assert ctrl.marked == [10] and ctrl.state is P and ctrl.next_position == 1
    ctrl.handle(SlotDue(1), DELTA)  # in Produce only the any-state row remains
    assert ctrl.next_position == 2 and ctrl.marked == [10]


def test_no_guard_holds_raises():
    ctrl = _Probe((Transition(State.CONSUME, SlotDue, "odd", None, "mark", "odd only"),))
    ctrl.start(0.0)
    with pytest.raises(RuntimeError, match="no transition for SlotDue in Consume \\(no guard"):
        ctrl.handle(SlotDue(0), 0.0)


def test_a_row_after_an_unguarded_row_is_rejected():
    table = (
        Transition(None, SlotDue, None, None, "play_or_stall", "always"),
        Transition(State.PRODUCE, SlotDue, "odd", None, "mark", "unreachable"),
    )
    with pytest.raises(ValueError, match="unreachable"):
        _compile(table, _Probe)


def test_diagram_and_table_print_every_row():
    diagram = mermaid_diagram()
    assert diagram.startswith("stateDiagram-v2\n")
    assert "Consume --> Produce: decide [replan_feasible] / start_replan" in diagram
    assert "Produce --> Consume: job_done [last_job] / finish_job" in diagram
    assert diagram.count("    note right of Produce\n") == 1 and "    end note\n" in diagram
    for row in TRANSITIONS:
        guard = f" [{row.guard}]" if row.guard else ""
        assert f"{EVENT_KINDS[row.trigger]}{guard} / {row.action}" in diagram


# ---------------------------------------------------------------- the adaptive lead

C = 0.3  # the job time of the adaptive lead's tests (its cost part)


def drive(ctrl: Controller, waits: list[float], until: float) -> list[float]:
    """Run ``ctrl`` with a device that starts job n after ``waits[n - 1]`` (JobStarted
    only where it waited) and takes C; returns the lead after each job ended."""
    import heapq

    queue: list[tuple[float, int, object]] = []
    seq = 0

    def carry_out(commands, now):
        nonlocal seq
        for command in commands:
            if isinstance(command, ScheduleWakeUp):
                entry = [(command.at, command.event)]
            elif isinstance(command, StartJob):
                wait = waits[command.job_id - 1] if command.job_id <= len(waits) else 0.0
                entry = [(now + wait + C, JobDone(command.job_id))]
                if wait:
                    entry.append((now + wait, JobStarted(command.job_id)))
            else:
                continue
            for at, event in entry:
                seq += 1
                heapq.heappush(queue, (at, seq, event))

    leads = []
    carry_out(ctrl.start(0.0), 0.0)
    while queue and queue[0][0] < until:
        at, _, event = heapq.heappop(queue)
        carry_out(ctrl.handle(event, at), at)
        if isinstance(event, JobDone):
            leads.append(ctrl.lead)
    return leads


def adaptive(initial_wait: float, quantile: float = 0.9, gain: float = 1.0) -> Controller:
    # steps of gain·C·quantile = 0.27 s up and gain·C·(1 − quantile) = 0.03 s down
    return Controller(ControllerConfig(TIMING, BASELINE, C + initial_wait,
                                       adaptive=AdaptiveLead(C, quantile, gain)))


def test_adaptive_lead_starts_at_the_given_lead():
    ctrl = adaptive(0.1)
    commands = ctrl.start(0.0)
    assert ctrl.lead == pytest.approx(0.4)
    wakeups = [c.at for c in of_type(commands, ScheduleWakeUp) if isinstance(c.event, WakeUp)]
    assert wakeups == [pytest.approx(4 * DELTA - 0.4)]  # the first refill, one lead early


def test_adaptive_lead_grows_after_a_wait_above_its_estimate():
    ctrl = adaptive(0.1)
    assert drive(ctrl, [0.5], until=1.5) == [pytest.approx(0.4 + 0.27)]
    assert ctrl.wait_estimate == pytest.approx(0.37)
    ctrl = adaptive(0.1)
    assert drive(ctrl, [0.05], until=1.5) == [pytest.approx(0.4 - 0.03)]  # a wait below


def test_adaptive_lead_decays_to_its_cost_part_after_short_waits():
    ctrl = adaptive(0.1)
    leads = drive(ctrl, [0.5, 0.5] + [0.0] * 30, until=40.0)
    assert leads[:2] == pytest.approx([0.67, 0.94])  # each long wait one step up
    down = leads[1:]
    assert all(b < a for a, b in zip(down, down[1:21], strict=False))  # one step down a job
    assert leads[-1] == C  # then it stays at its cost part: no wait goes below 0
    assert ctrl.stalls[0].position == 4 and len(ctrl.stalls) == 2  # only the late jobs


def test_adaptive_lead_plans_each_refill_with_the_lead_it_has_then():
    ctrl = adaptive(0.1)
    waits = [0.2, 0.0, 0.4, 0.0, 0.0]
    after = drive(ctrl, waits, until=5.5)
    # refill n is started (submitted) one lead before its chunk is due at n·T plus the
    # stalls before it: the first at the initial lead, each next one at the lead the jobs
    # before it left
    submitted = [job.t_start - wait for job, wait in zip(ctrl.jobs[1:], waits, strict=True)]
    stalled = [sum(s.t_end - s.t_start for s in ctrl.stalls if s.t_start < t)
               for t in submitted]
    due = [4.0 * n * DELTA + late for n, late in enumerate(stalled, start=1)]
    assert [d - s for d, s in zip(due, submitted, strict=True)] == pytest.approx(
        [0.4, *after[:len(submitted) - 1]])
    assert after == pytest.approx([0.67, 0.64, 0.91, 0.88, 0.85])


def test_a_fixed_lead_ignores_the_waits():
    ctrl = make(BASELINE)
    assert drive(ctrl, [0.5, 0.0, 0.0], until=4.0) == [LEAD] * 3


def test_adaptive_lead_is_validated():
    with pytest.raises(LatsimError, match="starts at or above its cost part"):
        ControllerConfig(TIMING, BASELINE, 0.2, adaptive=AdaptiveLead(0.3))
    with pytest.raises(LatsimError, match="gain must be > 0"):
        AdaptiveLead(0.3, gain=0.0)
    with pytest.raises(LatsimError, match="quantile must be in"):
        AdaptiveLead(0.3, quantile=1.0)
