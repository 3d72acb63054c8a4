"""A stateful fuzz of the controller with several chunks in flight (let-play and flush).

Run it longer with ``LATSIM_IN_FLIGHT_FUZZ_STEPS=200000`` (about 2 minutes; passed once).

The companion of ``test_controller_fuzz.py``, which models one job at a time: here a
hypothesis state machine plays a driver whose jobs overlap and end in any order, under the
driver contract (a forward-only clock; timers delivered at or after their time, in the order
asked; ``JobStarted`` and ``JobDone`` only for jobs in flight; conditions and stale events
at any time). Every run draws K, r, fps, start time, lead, commit mode and unit, commit lead,
chunks in flight (1..4), the in-flight policy, a run-ahead and a job-time scale from 0 to 3 T.
After every event it checks, from the commands and the public views:

1. **playback**: slots play once each, in order, at the event's ``now``, at least δ apart,
   each from the prebuffer or a finished job that produced that position under that
   version, never from a flushed job; the version on screen never decreases and never
   exceeds the newest known;
2. **in flight**: at most ``in_flight`` live jobs; every job started is in flight until its
   ``JobDone``; a flushed job's latents come back as one discard of K when it lands, and
   only the flush policy flushes;
3. **accounting**: K x (1 + jobs_done) = played + discarded + cached;
4. **commitment**: a position below ``locked_end`` before an event is still cached as it
   was, or was played with the same (version, job);
5. **progress**: with nothing in flight a wake-up is pending; a stall has a live job;
6. **conditions**: each shown one has R, C, Q >= 0 and L = R + C + Q.
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from latsim.controller import (
    BIND_MODES,
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    JobStarted,
    PlaySlot,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.controller.policies import Policy
from latsim.controller.timing import Timing
from tests.helpers import lateness_strategy, time_step_strategy
from tests.test_controller_fuzz import TimerQueue, _Timer, tol

STEPS_PER_RUN = 40
STEPS = int(os.environ.get("LATSIM_IN_FLIGHT_FUZZ_STEPS", "3000"))
COUNT = {"steps": 0, "flushed": 0, "out of order": 0}



@functools.cache
def _job_time_strategy(c_scale: float, T: float) -> st.SearchStrategy[float]:
    """A job's time: the run's C scale, or anything up to 3 T (built once per setting)."""
    return st.one_of(st.just(c_scale), st.floats(0.0, 3 * T, allow_nan=False))

class InFlightMachine(TimerQueue, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctrl: Controller | None = None

    @initialize(K=st.integers(1, 6), r=st.integers(1, 4),
                fps=st.sampled_from([8.0, 12.0, 16.0, 24.0, 30.0]),
                commit=st.sampled_from(["lazy", "eager"]),
                t0=st.one_of(st.just(0.0), st.floats(0.0, 1e5, allow_nan=False)),
                data=st.data())
    def setup(self, K, r, fps, commit, t0, data):
        timing = Timing(K, r, fps)
        delta, T = timing.delta, timing.T
        q = data.draw(st.sampled_from([d for d in range(1, K + 1) if K % d == 0]), label="q")
        commit_lead = data.draw(st.sampled_from([0.0, delta / 2, T]), label="commit_lead")
        lead = data.draw(st.one_of(st.just(0.0), st.integers(0, 2 * K).map(lambda k: k * delta),
                                   st.floats(0.0, 2 * T)), label="lead")
        # listed so that the simplest draws (which hypothesis favours, and a derandomized
        # run starts from) already overlap jobs and flush them: a buffer beyond the lead
        self.in_flight = data.draw(st.sampled_from([3, 2, 4, 1]), label="in flight")
        self.flush = data.draw(st.sampled_from([True, True, False]), label="flush")
        run_ahead = data.draw(st.sampled_from([T, T, delta, 0.0]), label="run-ahead")
        self.c_scale = data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), label="C/T") * T
        self.K, self.delta, self.T = K, delta, T
        bind = data.draw(st.sampled_from(BIND_MODES), label="bind")
        self.bind_at_start = bind == "start"
        policy = Policy("fuzz", q, commit, commit_lead)
        self.ctrl = Controller(ControllerConfig(
            timing, policy, lead, in_flight=self.in_flight,
            in_flight_policy="flush" if self.flush else "let-play", run_ahead=run_ahead,
            bind=bind))
        self.conditions_sent = 0
        # job id -> the versions it may carry: its StartJob's, and under bind="start" the
        # newest sent when a device took it (it keeps the first where taking the newest
        # would put a newer version before an older one in flight)
        self.versions: dict[int, set[int]] = {}
        self.now = t0
        self.timers: list[_Timer] = []
        self.seq = 0
        self.jobs: dict[int, StartJob] = {}  # every job started
        self.running: dict[int, float] = {}  # job id -> start (device start once taken)
        self.took: set[int] = set()
        self.finished: set[int] = set()
        self.flushed: set[int] = set()
        self.played_version = 0
        self._apply(self.ctrl.start(t0), None, self._snapshot())

    # ------------------------------------------------------------ rules

    def _dt(self, data) -> float:
        return data.draw(time_step_strategy(self.K, self.delta, self.T), label="dt")

    @precondition(lambda self: self.ctrl is not None)
    @rule(data=st.data())
    def condition_arrives(self, data):
        self.conditions_sent += 1
        self._handle(ConditionArrived(), self.now + self._dt(data))

    @precondition(lambda self: self.ctrl is not None and self.flush and self.running)
    @rule()
    def a_condition_meets_chunks_in_flight(self):
        """Under the flush policy, a condition now, while chunks are in flight: the case a
        flush is for (the other rules reach it only now and then)."""
        self.conditions_sent += 1
        self._handle(ConditionArrived(), self.now)

    @precondition(lambda self: self.ctrl is not None and self.timers)
    @rule(data=st.data())
    def timer_fires(self, data):
        late = data.draw(lateness_strategy(self.T), label="late")
        timer = self._pop_timer()
        self._handle(timer.event, max(self.now, timer.at) + late)

    @precondition(lambda self: self.ctrl is not None)
    @rule(data=st.data())
    def time_passes(self, data):
        self._pass_until(self.now + self._dt(data))

    @precondition(lambda self: self.ctrl is not None and self.running)
    @rule(data=st.data())
    def a_job_finishes(self, data):
        """JobDone for any job in flight (not only the oldest), about C after its start."""
        job_id = data.draw(st.sampled_from(sorted(self.running)), label="job")
        if job_id != min(self.running):
            COUNT["out of order"] += 1
        duration = data.draw(_job_time_strategy(self.c_scale, self.T), label="C")
        self._handle(JobDone(job_id), max(self.now, self.running[job_id] + duration))

    @precondition(lambda self: self.ctrl is not None and set(self.running) - self.took)
    @rule(data=st.data())
    def a_job_takes_a_device(self, data):
        job_id = data.draw(st.sampled_from(sorted(set(self.running) - self.took)), label="job")
        self._handle(JobStarted(job_id), self.now + self._dt(data))
        self.running[job_id] = self.now
        self.took.add(job_id)
        if self.bind_at_start:
            self.versions[job_id].add(self.conditions_sent)

    @precondition(lambda self: self.ctrl is not None)
    @rule(data=st.data())
    def stale_event(self, data):
        at = self.now + self._dt(data)
        played = self.ctrl.next_position
        if played and data.draw(st.booleans(), label="slot tick"):
            self._handle(SlotDue(data.draw(st.integers(0, played - 1), label="pos")), at)
        else:
            self._handle(WakeUp(), at)

    # ------------------------------------------------------------ the driver and checks

    def _snapshot(self) -> tuple[int, dict, int, int]:
        c = self.ctrl
        return c.locked_end, c.cached_positions, len(c.slots), len(c.discards)

    def _handle(self, event, at: float) -> None:
        assert at >= self.now
        self.now = at
        COUNT["steps"] += 1
        before = self._snapshot()
        self._apply(self.ctrl.handle(event, at), event, before)

    def _apply(self, commands, event, before) -> None:
        ctrl, K = self.ctrl, self.K
        locked_before, cache_before, n_slots, n_discards = before
        if isinstance(event, JobDone):
            assert event.job_id in self.running
            del self.running[event.job_id]
            self.finished.add(event.job_id)
            job = self.jobs[event.job_id]
            if event.job_id in self.flushed:  # its latents are dropped whole as it lands
                assert ctrl.discards[n_discards].job_id == event.job_id
                assert (ctrl.discards[n_discards].first, ctrl.discards[n_discards].count,
                        ctrl.discards[n_discards].t) == (job.branch, K, self.now)
                COUNT["flushed"] += 1
        for command in commands:
            if isinstance(command, StartJob):
                assert command.job_id not in self.jobs and command.length == K
                self.jobs[command.job_id] = command
                self.versions[command.job_id] = {command.version}
                self.running[command.job_id] = self.now
            elif isinstance(command, ScheduleWakeUp):
                assert command.at >= self.now - tol(self.now)
                self._push_timer(command.at, command.event)
            else:
                assert isinstance(command, PlaySlot)
        # 1. playback
        for index in range(n_slots, len(ctrl.slots)):
            slot = ctrl.slots[index]
            assert slot.t_start == self.now and slot.position == index
            assert slot.version >= self.played_version and slot.version <= ctrl.latest_version
            self.played_version = slot.version
            if slot.job_id:
                job = self.jobs[slot.job_id]
                assert slot.job_id in self.finished and slot.job_id not in self.flushed
                assert job.branch <= slot.position < job.branch + K
                assert slot.version in self.versions[slot.job_id]
        recent = ctrl.slots.t_start[max(0, n_slots - 1):]  # this event's, and the one before
        assert all(b - a >= self.delta - tol(b) for a, b in zip(recent, recent[1:],
                                                                  strict=False))
        # 2. in flight
        assert set(ctrl.jobs_in_flight) == set(self.running)
        assert len(ctrl.live_jobs) <= self.in_flight
        newly_flushed = set(ctrl.jobs_in_flight) - set(ctrl.live_jobs) - self.flushed
        assert self.flush or not newly_flushed, "only the flush policy flushes"
        assert not newly_flushed or any(isinstance(c, StartJob) and c.kind == "replan"
                                        for c in commands), "a flush without its replan"
        self.flushed |= newly_flushed
        assert not self.flushed & {s.job_id for s in ctrl.slots[n_slots:]}
        # 3. accounting
        assert K * (1 + ctrl.jobs_done) == ctrl.played + ctrl.discarded + len(
            ctrl.cached_positions)
        assert ctrl.discarded == sum(d.count for d in ctrl.discards)
        # 4. commitment
        played_now = {s.position: (s.version, s.job_id) for s in ctrl.slots[n_slots:]}
        cache = ctrl.cached_positions
        for position, entry in cache_before.items():
            if position < locked_before:
                assert cache.get(position, played_now.get(position)) == entry
        # 5. progress
        if not ctrl.jobs_in_flight:
            assert any(isinstance(t.event, WakeUp) for t in self.timers), "no refill pending"
        if ctrl.stalled:
            assert ctrl.live_jobs, "a stall with nothing coming"
        # 6. conditions
        for cond in ctrl.conditions:
            if cond.displayed:
                assert min(cond.R, cond.C, cond.Q) >= -tol(self.now)
                assert abs(cond.L - (cond.R + cond.C + cond.Q)) <= tol(self.now)


def _run(steps: int) -> None:
    COUNT.update({key: 0 for key in COUNT})
    run_state_machine_as_test(InFlightMachine, settings=settings(
        max_examples=max(1, steps // STEPS_PER_RUN), stateful_step_count=STEPS_PER_RUN,
        # the same examples every run, as the folder fuzz: drawn afresh, one CI run in
        # many drew no flush in its 3,000 steps and failed the coverage check below
        # (LATSIM_FUZZ_RANDOM=1 draws new ones)
        derandomize=os.environ.get("LATSIM_FUZZ_RANDOM") != "1",
        deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.filter_too_much,
                                              HealthCheck.data_too_large]))
    assert COUNT["steps"] >= steps / 2, COUNT
    assert COUNT["flushed"] > 0 and COUNT["out of order"] > 0, COUNT


def test_chunks_in_flight_survive_arbitrary_event_interleavings():
    """``LATSIM_IN_FLIGHT_FUZZ_STEPS`` rule steps (default 2000, a few seconds)."""
    _run(STEPS)


@pytest.mark.slow
def test_chunks_in_flight_survive_arbitrary_event_interleavings_long():
    """At least 50,000 rule steps (about 30 s)."""
    _run(max(50_000, STEPS))
