"""Records on demand: a run that counts its slots and tasks (``--records conditions|none``)
summarises exactly as one that keeps every record, in memory that does not grow with them.

Every summary field is compared by ``repr`` (the floats bit for bit) between the levels,
for one stream over the property generators and for serving runs over the serving setups
(batching, USP groups, pipelines, cold starts, every schedule, client stages).
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from latsim.analysis.metrics import summarize, work_ratio
from latsim.analysis.serving import per_stream_rows, serving_metrics
from latsim.controller import ControllerConfig
from latsim.controller.records import SlotLog, SlotTally, count_slots_before
from latsim.errors import LatsimError
from latsim.model.traces import Trace
from latsim.sim.serving import simulate_serving
from latsim.sim.simpy_driver import simulate_trace
from tests.test_play_ahead import SETTINGS, streams
from tests.test_properties import arrival_times
from tests.test_serving import RecordingCost, inputs, serving_setups


def _same(a: object, b: object) -> None:
    """Equal, NaN fields included: by repr (Python 3.13's dataclass ``__eq__`` compares
    field by field, and NaN != NaN there even for one object)."""
    assert repr(a) == repr(b)


@SETTINGS
@given(data=st.data(), stream=streams(), seed=st.integers(0, 2**16),
       level=st.sampled_from(["conditions", "none"]))
def test_one_stream_summarises_the_same_at_every_level(data, stream, seed, level):
    config, cost = stream
    duration = config.timing.T * data.draw(st.floats(1.0, 12.0))
    times = data.draw(arrival_times(config.timing, duration))
    trace = Trace("t", tuple(times), duration)
    runs = {records: simulate_trace(config, cost, trace, duration, np.random.default_rng(seed),
                                    records=records)[0]
            for records in ("all", level)}
    kept, counted = runs["all"], runs[level]
    _same(summarize([kept]).as_dict(), summarize([counted]).as_dict())
    _same(work_ratio([kept], [kept]), work_ratio([counted], [counted]))
    assert isinstance(counted.slots, SlotTally) and len(counted.slots) == 0
    assert counted.busy == () and counted.records == level
    assert counted.slots.played == len(kept.slots)
    for generated in (False, True):
        assert (count_slots_before(counted.slots, duration, generated)
                == count_slots_before(kept.slots, duration, generated))
    # the rest is kept as it is, but "none" keeps no job table: the prebuffer's record only
    for table in ("conditions", "stalls", "discards"):
        _same(getattr(counted, table), getattr(kept, table))
    assert counted.jobs == (kept.jobs if level == "conditions" else kept.jobs[:1])


@pytest.mark.parametrize("policy", ["baseline", "speculative"])
def test_nothing_kept_means_memory_that_does_not_grow_with_jobs(policy, monkeypatch):
    """At ``none`` the controller keeps the prebuffer's job record and those of jobs with
    positions still cached, forgetting the others as it goes (a 3,989-job run keeps fewer
    than FORGET_JOBS_AT + K), and the run's records only the prebuffer's; it summarises
    bit for bit as the run that keeps them all."""
    from latsim.controller.machine import FORGET_JOBS_AT
    from latsim.controller.policies import PRESETS
    from latsim.controller.timing import Timing
    from latsim.model.costs import LognormalCost
    from latsim.run.stream import StreamRun

    held: list[int] = []  # the job records each controller holds at its run's end
    finish = StreamRun.finish
    monkeypatch.setattr(StreamRun, "finish", lambda self, *args: (
        held.append(len(self.controller.jobs)), finish(self, *args))[1])
    timing = Timing(2, 1, 16.0)  # T = 0.125 s: 4,000 chunks in 500 s
    config = ControllerConfig(timing, PRESETS[policy], 0.1)
    rng = np.random.default_rng(3)
    trace = Trace("t", tuple(np.cumsum(rng.exponential(2.0, 240))), 500.0)
    runs = {records: simulate_trace(config, LognormalCost(0.06, 0.3), trace, 500.0,
                                    np.random.default_rng(5), records=records)[0]
            for records in ("all", "none")}
    kept, counted = runs["all"], runs["none"]
    assert len(kept.jobs) > 3900 and counted.jobs == kept.jobs[:1]
    assert held[0] == len(kept.jobs) and held[1] < FORGET_JOBS_AT + timing.K
    _same(summarize([kept]).as_dict(), summarize([counted]).as_dict())
    _same(counted.conditions, kept.conditions)


@SETTINGS
@given(setup=serving_setups(), seed=st.integers(0, 1000),
       degree=st.sampled_from([1, 2]), level=st.sampled_from(["conditions", "none"]))
def test_serving_summarises_the_same_at_every_level(setup, seed, degree, level):
    timing, serving, policy, mean_c, duration, traces, joins = setup
    if degree > 1:  # USP groups: the DiT pool in groups of two devices
        pools = tuple((name, 2 * size) if name == "dit" else (name, size)
                      for name, size in serving.pools)
        serving = replace(serving, pools=pools, dit_degree=degree)
    config = ControllerConfig(timing, policy, mean_c * 1.5, serving.discard)
    runs = {}
    for records in ("all", level):
        cost = RecordingCost(mean_c, 0.3)
        runs[records] = simulate_serving(config, cost, serving, inputs(traces, joins, seed),
                                         duration, np.random.default_rng(seed),
                                         records=records)
    kept, counted = runs["all"], runs[level]
    _same(serving_metrics([kept]), serving_metrics([counted]))
    _same(per_stream_rows([kept]), per_stream_rows([counted]))
    assert counted.tasks == () and kept.tasks
    _same((counted.viewer, counted.client_stalls), (kept.viewer, kept.client_stalls))
    assert all(isinstance(s.slots, SlotTally) for s in counted.streams)


def test_the_seed_systems_summarise_the_same_counted():
    """The seed-system generator models (SDVG's draft and target, draft-verify, Wave
    Forcing's 1F1C pipeline ranks, several chunks in flight, flush) through the experiment
    engine: the rows match when nothing is kept."""
    from latsim.experiments.engine import Experiment, run_experiment
    from latsim.experiments.systems import FPS, K, R, _generators, _wave_forcing_generators

    for _, _, cost, serving, *rest in _generators(1.0) + _wave_forcing_generators():
        experiment = Experiment(Ks=(K,), r=R, fps=FPS, cost=cost, updates="poisson:0.2",
                                duration=20.0, seeds=2, run_ahead=rest[0] if rest else 0.0,
                                serving=serving)
        kept = run_experiment(experiment, jobs=1)
        counted = run_experiment(replace(experiment, records="none"), jobs=1)
        _same(kept.rows, counted.rows)


def test_a_tally_pickles_as_its_counts_and_refuses_another_window():
    tally = SlotTally(10.0)
    tally.add(0, 0, 0, 0.0)
    tally.position += [1, 2]
    tally.version += [1, 1]
    tally.job_id += [1, 1]
    tally.t_start += [9.5, 10.0]
    tally.fold()
    assert (tally.played, tally.before_end, tally.generated_before_end) == (3, 2, 1)
    assert len(tally) == 0 and tally.t_start == []
    back = pickle.loads(pickle.dumps(tally))
    assert (back.played, back.before_end, back.generated_before_end) == (3, 2, 1)
    assert len(pickle.dumps(tally)) < len(pickle.dumps(SlotLog()))  + 64
    with pytest.raises(ValueError, match="counted before 10.0"):
        count_slots_before(tally, 20.0)


def test_an_unknown_level_is_a_one_line_error():
    from latsim.controller.policies import BASELINE
    from latsim.controller.timing import Timing
    from latsim.model.costs import FixedCost

    config = ControllerConfig(Timing(4, 4, 16.0), BASELINE, 0.5)
    with pytest.raises(LatsimError, match="--records must be one of all, conditions, none"):
        simulate_trace(config, FixedCost(0.5), Trace("t", (), 10.0), 10.0,
                       np.random.default_rng(0), records="some")
