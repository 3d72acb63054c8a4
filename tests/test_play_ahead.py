"""Event skipping (:meth:`Controller.play_ahead`) gives the tick-by-tick records, bit for bit.

The simulator lets the controller play quiet slots without a SimPy event each, and delivers
the stream's own timers in batches between SimPy's other events. Every record of every table
must come out the same as when each tick and timer is its own SimPy event: the same rows,
the same floats (compared by ``repr``), over the property generators of
``tests/test_properties.py`` plus inputs built to tie: costs and arrivals on whole slots,
leads of zero and of whole slots, stalls (C > T), both discard modes and lazy commit groups.
With several chunks in flight (let-play and flush, refills run ahead) a bare event loop of
this file's own stands in for a driver: no simulator runs overlapping jobs and skips.
"""

from __future__ import annotations

import os

import numpy as np
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
)
from latsim.controller.policies import BASELINE, SPECULATIVE, Policy
from latsim.controller.records import RECORD_TYPES, column_names
from latsim.controller.timing import Timing
from latsim.model.costs import FixedCost, LognormalCost
from latsim.model.traces import Trace
from latsim.run.stream import RunRecords
from latsim.sim.simpy_driver import simulate_trace
from tests.test_properties import arrival_times

#: more examples for a long local check: LATSIM_PLAY_AHEAD_EXAMPLES=3000 pytest this file
EXAMPLES = int(os.environ.get("LATSIM_PLAY_AHEAD_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def fingerprint(records: RunRecords) -> dict[str, object]:
    """Every table as rows of ``repr``'d values, plus the run's counters."""
    tables = {
        table: [tuple(repr(getattr(r, name)) for name in column_names(record_type))
                for r in getattr(records, table)]
        for table, record_type in RECORD_TYPES.items()
    }
    return tables | {
        "busy": [repr((b.job_id, b.t_start, b.t_end)) for b in records.busy],
        "counters": (records.jobs_started, records.jobs_done, records.cached_at_end,
                     repr(records.end_time)),
    }


def both_ways(config: ControllerConfig, cost, times, duration: float, seed: int
              ) -> tuple[dict, dict, int]:
    out = []
    for skip in (False, True):
        records, ctrl = simulate_trace(config, cost, Trace("t", tuple(times), duration),
                                       duration, np.random.default_rng(seed), skip_ticks=skip)
        out.append((fingerprint(records), ctrl.slots_played_ahead))
    (ticked, none_ahead), (skipped, ahead) = out
    assert none_ahead == 0
    return ticked, skipped, ahead


@st.composite
def streams(draw):
    """A timing, a policy, a lead and a cost model, with ties made likely."""
    timing = Timing(K=draw(st.integers(1, 12)), r=draw(st.integers(1, 4)),
                    fps=draw(st.sampled_from([8.0, 12.0, 16.0, 24.0, 30.0])))
    divisors = [d for d in range(1, timing.K + 1) if timing.K % d == 0]
    policy = draw(st.sampled_from([
        BASELINE, SPECULATIVE,
        Policy("ablation", draw(st.sampled_from(divisors)),
               draw(st.sampled_from(["eager", "lazy"])),
               draw(st.sampled_from([0.0, 0.5 * timing.delta, 2 * timing.delta]))),
    ]))
    whole = draw(st.booleans())  # C on whole slots: job ends tie with ticks
    if whole:
        C = timing.delta * draw(st.integers(1, 2 * timing.K))  # past T: stalls
    else:
        C = draw(st.floats(0.01, 2.0)) * timing.T
    cost = FixedCost(C) if draw(st.booleans()) else LognormalCost(C, draw(st.floats(0.1, 1.5)))
    lead = draw(st.sampled_from([0.0, C, timing.delta * draw(st.integers(0, 2 * timing.K)),
                                 cost.quantile(timing.K, 0.99)]))
    discard = draw(st.sampled_from(["on-start", "on-ready"]))
    at_end = draw(st.sampled_from(["defer", "start"]))
    return ControllerConfig(timing, policy, lead, discard, replan_at_cache_end=at_end), cost


@SETTINGS
@given(data=st.data(), stream=streams(), seed=st.integers(0, 2**16))
def test_skipping_gives_the_tick_by_tick_records(data, stream, seed):
    config, cost = stream
    timing = config.timing
    duration = timing.T * data.draw(st.floats(1.0, 12.0))
    if data.draw(st.booleans()):
        times = data.draw(arrival_times(timing, duration))
    else:  # conditions exactly on ticks
        slots = data.draw(st.lists(st.integers(0, int(duration / timing.delta) - 1),
                                   max_size=20))
        times = sorted(s * timing.delta for s in slots)
    ticked, skipped, _ = both_ways(config, cost, times, duration, seed)
    assert skipped == ticked


@SETTINGS
@given(data=st.data(), stream=streams(), seed=st.integers(0, 2**16))
def test_skipping_with_records_handed_out_gives_the_same_records(data, stream, seed):
    """With ``on_record`` (records handed out as they are made) the quiet ticks are played
    one ``_play_slot`` at a time: the records, and what was handed out, are the same."""
    config, cost = stream
    duration = config.timing.T * data.draw(st.floats(1.0, 12.0))
    times = data.draw(arrival_times(config.timing, duration))
    trace = Trace("t", tuple(times), duration)
    handed: list = []
    ticked, _ = simulate_trace(config, cost, trace, duration, np.random.default_rng(seed),
                               skip_ticks=False)
    skipped, _ = simulate_trace(config, cost, trace, duration, np.random.default_rng(seed),
                                on_record=handed.append)
    assert fingerprint(skipped) == fingerprint(ticked)
    assert [r for r in handed if type(r).__name__ == "SlotRecord"] == list(skipped.slots)


def test_skipping_plays_most_slots_ahead_and_keeps_the_records():
    """The long quiet stretches are skipped: with rare conditions nearly every slot is
    played ahead, and still nothing differs."""
    timing = Timing(8, 4, 16.0)
    cost = LognormalCost(1.2, 0.3)
    config = ControllerConfig(timing, SPECULATIVE, cost.quantile(8, 0.99))
    times = np.cumsum(np.random.default_rng(3).exponential(10.0, size=40))
    duration = float(times[-1]) + 1
    ticked, skipped, ahead = both_ways(config, cost, times, duration, seed=5)
    assert skipped == ticked
    assert ahead > 0.7 * len(ticked["slots"])
    # handing each record out as it is made, the stretches are skipped all the same
    handed: list = []
    records, ctrl = simulate_trace(config, cost, Trace("t", tuple(times), duration), duration,
                                   np.random.default_rng(5), on_record=handed.append)
    assert fingerprint(records) == ticked
    assert ctrl.slots_played_ahead > 0.7 * len(ticked["slots"])


def test_quiet_stretches_are_played_by_the_chunk(monkeypatch):
    """Between rare conditions the refill cycles themselves skip the events: each wake-up
    that starts a refill, and the job's end, go through the controller's fast paths
    (:meth:`Controller.quiet_wake`, :meth:`Controller.quiet_job_done`) with no timer each,
    for most jobs; the reference path hands every event to the table, and the records are
    the same."""
    taken = {"wake": 0, "done": 0}
    wake, done = Controller.quiet_wake, Controller.quiet_job_done

    def counting_wake(self, now):
        job = wake(self, now)
        taken["wake"] += job is not None
        return job

    def counting_done(self, job_id, now):
        after = done(self, job_id, now)
        taken["done"] += after is not None
        return after

    monkeypatch.setattr(Controller, "quiet_wake", counting_wake)
    monkeypatch.setattr(Controller, "quiet_job_done", counting_done)
    timing = Timing(4, 4, 16.0)
    cost = LognormalCost(0.3, 0.3)
    config = ControllerConfig(timing, BASELINE, cost.quantile(4, 0.99))
    times = np.cumsum(np.random.default_rng(4).exponential(30.0, size=10))
    duration = float(times[-1]) + 1
    ticked, skipped, _ = both_ways(config, cost, times, duration, seed=2)
    assert skipped == ticked
    jobs = len(ticked["jobs"])
    assert taken["wake"] > 0.9 * jobs and taken["done"] > 0.9 * jobs
    taken.update(wake=0, done=0)
    simulate_trace(config, cost, Trace("t", tuple(times), duration), duration,
                   np.random.default_rng(2), skip_ticks=False)
    assert taken == {"wake": 0, "done": 0}


def test_play_ahead_knows_the_decide_rows_it_keeps_quiet():
    """play_ahead mirrors each state's decide rows by name; a changed table must revisit
    it (a state whose rows it does not know is never skipped)."""
    from latsim.controller import TRANSITIONS, Decide, State
    from latsim.controller.machine import _QUIET_DECIDE_ACTIONS, Controller

    for state in State:
        rows = tuple(row.action for row in TRANSITIONS
                     if row.trigger is Decide and row.source in (None, state))
        assert rows in _QUIET_DECIDE_ACTIONS
        assert Controller._quiet_decide[state] == _QUIET_DECIDE_ACTIONS[rows]


# ---------------------------------------------------------------- several chunks in flight


class _EventLoop:
    """A bare discrete-event driver for one controller whose jobs may overlap (each takes
    its own duration, none waits for a device): a heap of (time, priority, order, event),
    conditions first at a shared time. With ``skip`` it lets the controller play quiet
    ticks ahead on the contract of :class:`~latsim.run.stream.SkippingPort`: the pending
    tick is taken back and asked for again after everything scheduled so far. Neither
    single-worker driver runs overlapping jobs, and the serving simulator does not skip,
    so this is how the Produce rows of :meth:`Controller.play_ahead` get checked."""

    def __init__(self, config: ControllerConfig, durations: list[float], skip: bool) -> None:
        self.ctrl = Controller(config)
        self.durations = iter(durations)
        self.skip = skip
        self.heap: list[list] = []
        self.order = 0
        self.tick: list | None = None
        self.ahead_with_room = 0  # slots played ahead in Produce with room for a chunk

    def _push(self, at: float, priority: int, event: object) -> list:
        import heapq

        self.order += 1
        entry = [at, priority, self.order, event]
        heapq.heappush(self.heap, entry)
        return entry

    def _execute(self, commands: list, now: float) -> None:
        for command in commands:
            if isinstance(command, ScheduleWakeUp):
                entry = self._push(command.at, 1, command.event)
                if isinstance(command.event, SlotDue):
                    self.tick = entry
            elif isinstance(command, StartJob):
                self._push(now + next(self.durations), 1, JobDone(command.job_id))
        if self.skip:
            self._play_ahead()

    def _play_ahead(self) -> None:
        ctrl, tick = self.ctrl, self.tick
        if tick is None or (tick[3].position, tick[0]) != (ctrl.next_position, ctrl.next_due):
            return
        horizon = min((e[0] for e in self.heap if e is not tick and e[3] is not None),
                      default=self.duration)
        room = (ctrl.state is State.PRODUCE
                and len(ctrl.live_jobs) < ctrl.config.in_flight)
        played = ctrl.play_ahead(min(horizon, self.duration))
        if played:
            self.ahead_with_room += played if room else 0
            tick[3] = None  # taken back
            self.tick = self._push(ctrl.next_due, 1, SlotDue(ctrl.next_position))

    def run(self, arrivals: list[float], duration: float) -> Controller:
        import heapq

        self.duration = duration
        for t in arrivals:
            self._push(t, 0, ConditionArrived())
        self._execute(self.ctrl.start(0.0), 0.0)
        while self.heap and self.heap[0][0] < duration:
            at, _, _, event = heapq.heappop(self.heap)
            if event is None:
                continue
            if event is (self.tick[3] if self.tick else None):
                self.tick = None
            self._execute(self.ctrl.handle(event, at), at)
        self.ctrl.finish(duration)
        return self.ctrl


def _controller_tables(ctrl: Controller) -> dict:
    return {table: [tuple(repr(getattr(r, name)) for name in column_names(record_type))
                    for r in getattr(ctrl, table)]
            for table, record_type in RECORD_TYPES.items()} | {
        "counters": (ctrl.jobs_started, ctrl.jobs_done, ctrl.discarded)}


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_skipping_with_chunks_in_flight_gives_the_tick_by_tick_records(data, seed):
    from latsim.controller import IN_FLIGHT_POLICIES

    timing = Timing(K=data.draw(st.integers(1, 6)), r=data.draw(st.integers(1, 4)),
                    fps=data.draw(st.sampled_from([8.0, 16.0, 24.0])))
    whole = data.draw(st.booleans())  # job ends on slot boundaries: ties with ticks
    C = (timing.delta * data.draw(st.integers(1, 4 * timing.K)) if whole
         else data.draw(st.floats(0.05, 3.0)) * timing.T)
    config = ControllerConfig(
        timing, data.draw(st.sampled_from([BASELINE, SPECULATIVE])),
        data.draw(st.sampled_from([C, 0.0, timing.delta * data.draw(st.integers(0, 8))])),
        in_flight=data.draw(st.integers(1, 4)),
        in_flight_policy=data.draw(st.sampled_from(sorted(IN_FLIGHT_POLICIES))),
        run_ahead=data.draw(st.sampled_from([0.0, timing.delta, timing.T])))
    duration = timing.T * data.draw(st.floats(2.0, 12.0))
    rng = np.random.default_rng(seed)
    durations = list(C * rng.lognormal(0.0, data.draw(st.sampled_from([0.0, 0.3])), 4000))
    arrivals = data.draw(arrival_times(timing, duration))
    ticked = _EventLoop(config, durations, skip=False).run(arrivals, duration)
    loop = _EventLoop(config, durations, skip=True)
    skipped = loop.run(arrivals, duration)
    assert ticked.slots_played_ahead == 0
    assert _controller_tables(skipped) == _controller_tables(ticked)


def test_the_produce_rows_are_skipped_with_room_in_flight_and_keep_the_records():
    """Three chunks in flight, refills started a chunk early: the controller spends most of
    its time in Produce with room for another chunk, and plays those ticks ahead too."""
    timing = Timing(K=4, r=4, fps=16.0)  # T = 1 s
    config = ControllerConfig(timing, SPECULATIVE, 1.5, in_flight=3, run_ahead=timing.T)
    durations = list(1.5 * np.random.default_rng(2).lognormal(0.0, 0.2, 4000))
    arrivals = list(np.cumsum(np.random.default_rng(4).exponential(8.0, size=20)))
    duration = float(arrivals[-1]) + 5
    ticked = _EventLoop(config, durations, skip=False).run(arrivals, duration)
    loop = _EventLoop(config, durations, skip=True)
    skipped = loop.run(arrivals, duration)
    assert _controller_tables(skipped) == _controller_tables(ticked)
    assert loop.ahead_with_room > 0.2 * len(ticked.slots)
