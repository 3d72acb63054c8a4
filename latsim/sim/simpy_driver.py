"""The SimPy driver: one controller, one generator worker, a player and an arrival process.

The controller decides and :class:`~latsim.run.stream.StreamRun` keeps the books; this module
only keeps SimPy's clock. Job durations come from a cost model, arrivals from a
:class:`~latsim.model.traces.Trace`. Conditions arrive within ``[0, duration)``; the run
continues past ``duration`` only to let the last conditions show (bounded by ``drain``), and
time fractions are measured over ``[0, duration]``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    Event,
    JobDone,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.model.costs import CostModel
from latsim.model.traces import Trace
from latsim.run.stream import RunRecords, RunWindow, StreamRun


class _SimPyPort:
    """Carries out commands on SimPy's clock; job durations are drawn from ``cost``."""

    def __init__(self, env: simpy.Environment, cost: CostModel, K: int,  # noqa: N803
                 rng: np.random.Generator) -> None:
        self.env = env
        self.cost = cost
        self.K = K
        self.rng = rng
        self.run: StreamRun | None = None

    def deliver(self, event: Event) -> None:
        self.run.deliver(event, self.env.now)  # type: ignore[union-attr]

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        timer = self.env.timeout(max(0.0, at - self.env.now))
        timer.callbacks.append(lambda _, e=event: self.deliver(e))

    def start_job(self, job: StartJob, now: float) -> None:
        took = self.cost.sample(self.K, self.rng, job.kind)
        self.run.job_ran(job.job_id, now, now + took)  # type: ignore[union-attr]
        done = self.env.timeout(took)
        done.callbacks.append(lambda _, j=job.job_id: self.deliver(JobDone(j)))

    def play(self, slot: PlaySlot) -> None:
        pass  # nothing to show in simulation: the slot record is the output


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
    :func:`latsim.run.stream.default_drain`); ``on_record`` receives every record as it is
    made.
    """
    window = RunWindow.for_config(config, duration, drain)
    env = simpy.Environment()
    port = _SimPyPort(env, cost, config.timing.K, rng)
    run = port.run = StreamRun(config, window, port, on_record)

    for t in trace.times:
        if t < window.duration:
            arrival = env.timeout(t)
            arrival.callbacks.append(lambda _: port.deliver(ConditionArrived()))
    run.start(env.now)
    env.run(until=window.duration)
    while run.controller.open_conditions and env.peek() <= window.limit:
        env.step()
    return run.finish(env.now), run.controller
