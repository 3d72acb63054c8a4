"""Extension points: cost models, scheduling policies, live generators and fleet placement
(DESIGN §9).

Each is a typed protocol (:mod:`latsim.plugins.protocols`) and a registry filled from entry
points (:mod:`latsim.plugins.registry`). latsim's own built-ins are registered in its
``pyproject.toml`` the way a third-party package registers its own:

=====================  ===========================  ==========================================
group                  entry name                   the object it points at
=====================  ===========================  ==========================================
``latsim.costs``       a spec prefix (``fixed``)    ``(args: str) -> CostModel``; ``args`` is
                                                    the text after ``PREFIX:``
``latsim.schedules``   a policy name (``fifo``)     ``(waiting, now) -> WaitingTask``
``latsim.generators``  a generator name (``wan``)   ``(GeneratorConfig) -> LiveGenerator``
``latsim.placements``  a placement (``min-max``)     ``() -> Placement`` (a fleet's chooser)
=====================  ===========================  ==========================================

``latsim plugins`` lists what is registered and by which distribution.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from itertools import islice
from typing import Any

from latsim.errors import LatsimError
from latsim.plugins.protocols import (
    ArrivalChecks,
    CostFactory,
    CostModel,
    CountsConditions,
    GeneratorConfig,
    GeneratorFactory,
    GeneratorInfo,
    JobTiming,
    LiveGenerator,
    NodeLoad,
    Parallel,
    Pipelined,
    Placement,
    Schedule,
    Staged,
    TimesForwards,
    WaitingTask,
)
from latsim.plugins.registry import (
    Plugin,
    available,
    call,
    first_line,
    load,
    plugins,
    refresh,
    short,
    wrong_type,
)
from latsim.plugins.spec import split

__all__ = [
    "ArrivalChecks", "CostFactory", "CostModel", "CountsConditions", "GeneratorConfig",
    "GeneratorFactory", "GeneratorInfo", "JobTiming", "LiveGenerator", "NodeLoad", "Parallel",
    "Pipelined", "Placement", "Plugin", "Schedule", "Staged", "TimesForwards", "WaitingTask",
    "available", "build_generator", "load_cost", "load_generator", "load_placement",
    "load_schedule", "plugins", "refresh", "schedule_failed", "take_next",
]


def load_cost(spec: str) -> CostModel:
    """The cost model of a ``PREFIX:ARGS`` spec (``--cost``, ``--decode``, ... and the
    serving and grid TOML files)."""
    prefix, args = split("cost spec", spec, "fixed:1.6")
    if prefix not in available("costs"):
        raise LatsimError(f"unknown cost spec prefix {short(prefix)}; registered: "
                          f"{', '.join(p + ':' for p in available('costs'))}")
    model = call("costs", prefix, args)
    if not isinstance(model, CostModel):
        raise wrong_type("costs", prefix, model, "a cost model (spec, sample, mean, quantile, "
                         "deterministic)")
    return model


def load_schedule(name: str) -> Schedule:
    """The scheduling policy registered as ``name`` (``--schedule``)."""
    return load("schedules", name)


def load_placement(name: str) -> Placement:
    """A fresh chooser of the placement policy registered as ``name`` (a fleet's
    ``placement``): its factory's result, which must be callable."""
    chooser = call("placements", name)
    if not callable(chooser):
        raise wrong_type("placements", name, chooser, "a placement (nodes, rng) -> node")
    return chooser


def take_next(waiting: MutableSequence[Any], schedule: Schedule, now: float) -> Any:
    """Take off ``waiting`` (in submission order) the task ``schedule`` serves next: the
    one loop the serving simulator and the live server share. With one task waiting there
    is nothing to choose. A schedule that raises, or returns something that is not
    waiting, is a one-line error (:func:`schedule_failed`).

    **The share bound.** While a task waits, each other stream overtakes it at most once
    (starts a task queued after it): where the schedule's choice would overtake a task for
    its stream's second time, the first task waiting goes instead (it overtakes nobody).
    So a task waits for the tasks queued before it plus at most one task of each other
    stream, whatever the schedule prefers and whatever a stream sends (a stream flooding
    replans under ``replan-first`` cannot starve the others' refills). FIFO never
    overtakes, so it is untouched. Each waiting task keeps the streams that overtook it in
    its ``overtaken_by`` attribute (None before the first)."""
    if len(waiting) == 1:
        return waiting.pop()
    try:
        best = schedule(waiting, now)
    except Exception as exc:  # noqa: BLE001 - a plug-in's failure is one line
        raise schedule_failed(schedule, exc) from None
    try:
        index = waiting.index(best)
    except ValueError:
        raise schedule_failed(schedule, None) from None
    if index:
        stream = best.stream
        older = list(islice(waiting, index))
        if any(task.overtaken_by is not None and stream in task.overtaken_by
               for task in older):
            best, index = waiting[0], 0  # a second overtaking: the first waiting goes
        else:
            for task in older:
                if task.stream != stream:  # a stream may reorder its own tasks
                    if task.overtaken_by is None:
                        task.overtaken_by = {stream}
                    else:
                        task.overtaken_by.add(stream)
    del waiting[index]
    return best


def schedule_failed(schedule: Schedule, exc: Exception | None) -> LatsimError:
    """The error for a schedule that raised ``exc``, or (``None``) returned something that
    is not one of the waiting tasks."""
    name = (f"{getattr(schedule, '__module__', '?')}:"
            f"{getattr(schedule, '__qualname__', type(schedule).__name__)}")
    if exc is None:
        return LatsimError(f"schedule {name} returned something that is not a waiting task")
    if isinstance(exc, LatsimError):
        return exc
    return LatsimError(f"schedule {name} failed: {type(exc).__name__}: {first_line(exc)}")


def load_generator(name: str) -> GeneratorFactory:
    """The factory of the live generator registered as ``name`` (``--generator``)."""
    return load("generators", name)


def build_generator(name: str, config: GeneratorConfig) -> LiveGenerator:
    """Build generator ``name`` from ``config``, checking that it is a live generator."""
    generator = call("generators", name, config)
    if not isinstance(generator, LiveGenerator):
        raise wrong_type("generators", name, generator,
                         "a live generator (describe, check_fits, warmup, new_stream, "
                         "reset_stream, run_job, payload)")
    return generator
