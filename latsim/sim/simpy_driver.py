"""The SimPy driver: one controller, one generator worker, a player and an arrival process.

The controller decides; this module only keeps SimPy's clock. Job durations come from a
cost model, arrivals from a :class:`~latsim.model.traces.Trace`. Conditions arrive within
``[0, duration)``; the run continues past ``duration`` only to let the last conditions
show (bounded by ``drain``), and time fractions are measured over ``[0, duration]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    ScheduleWakeUp,
    StartJob,
)
from latsim.controller.records import (
    ConditionRecord,
    DiscardRecord,
    JobRecord,
    SlotRecord,
    StallRecord,
)
from latsim.errors import LatsimError
from latsim.model.costs import CostModel
from latsim.model.traces import Trace


@dataclass(frozen=True)
class RunRecords:
    """Everything one run recorded, plus the window it is measured over."""

    duration: float
    end_time: float
    conditions: tuple[ConditionRecord, ...]
    jobs: tuple[JobRecord, ...]
    slots: tuple[SlotRecord, ...]
    stalls: tuple[StallRecord, ...]
    discards: tuple[DiscardRecord, ...]
    jobs_started: int
    jobs_done: int
    cached_at_end: int
    calls_in_window: int  # DiT calls started before ``duration``
    busy_in_window: float  # generator-busy seconds within [0, duration]

    @classmethod
    def from_controller(
        cls, ctrl: Controller, duration: float, end_time: float,
        busy: list[tuple[float, float]],
    ) -> RunRecords:
        """Collect a finished controller's records; ``busy`` holds every job's (start, end)
        on the generator, including one still running at the end."""
        return cls(
            duration=duration,
            end_time=end_time,
            conditions=tuple(sorted(ctrl.conditions, key=lambda c: c.version)),
            jobs=tuple(ctrl.jobs),
            slots=tuple(ctrl.slots),
            stalls=tuple(ctrl.stalls),
            discards=tuple(ctrl.discards),
            jobs_started=ctrl.jobs_started,
            jobs_done=ctrl.jobs_done,
            cached_at_end=len(ctrl.cached_positions),
            calls_in_window=sum(1 for start, _ in busy if start < duration),
            busy_in_window=sum(
                max(0.0, min(end, duration) - max(start, 0.0)) for start, end in busy
            ),
        )


def default_drain(config: ControllerConfig) -> float:
    """How long past the window both drivers wait for open conditions: four chunks plus
    twice the lead (the lead stands in for a late job: it is C's 0.99 quantile by default)."""
    return 4 * (config.timing.T + 2 * config.lead) + config.timing.delta


def simulate_trace(
    config: ControllerConfig,
    cost: CostModel,
    trace: Trace,
    duration: float,
    rng: np.random.Generator,
    drain: float | None = None,
    on_record: Callable[[object], None] | None = None,
) -> tuple[RunRecords, Controller]:
    """Run one trace through the controller on SimPy's clock.

    ``drain`` bounds the time past ``duration`` spent letting open conditions show (default:
    :func:`default_drain`); ``on_record`` receives every record as it is made.
    """
    if not (math.isfinite(duration) and duration > 0):
        raise LatsimError(f"duration must be a positive number of seconds, got {duration!r}")
    timing = config.timing
    if duration < timing.T:
        raise LatsimError(
            f"duration {duration:g} s is shorter than one chunk (T = {timing.T:g} s)"
        )
    K = timing.K  # noqa: N806
    if drain is None:
        drain = default_drain(config)

    env = simpy.Environment()
    ctrl = Controller(config, on_record=on_record)
    busy_intervals: list[tuple[float, float]] = []

    def deliver(event) -> None:
        execute(ctrl.handle(event, env.now))

    def execute(commands) -> None:
        for command in commands:
            if type(command) is ScheduleWakeUp:
                timer = env.timeout(max(0.0, command.at - env.now))
                timer.callbacks.append(lambda _, e=command.event: deliver(e))
            elif type(command) is StartJob:
                took = cost.sample(K, rng, command.kind)
                busy_intervals.append((env.now, env.now + took))
                done = env.timeout(took)
                done.callbacks.append(lambda _, j=command.job_id: deliver(JobDone(j)))

    for t in trace.times:
        if t < duration:
            arrival = env.timeout(t)
            arrival.callbacks.append(lambda _: deliver(ConditionArrived()))
    execute(ctrl.start(env.now))
    env.run(until=duration)
    limit = duration + drain
    while ctrl.open_conditions and env.peek() <= limit:
        env.step()
    ctrl.finish(env.now)
    records = RunRecords.from_controller(ctrl, duration, env.now, busy_intervals)
    return records, ctrl
