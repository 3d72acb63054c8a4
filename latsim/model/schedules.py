"""The built-in scheduling policies: which waiting task a device serves next.

Each is a :data:`latsim.plugins.Schedule`, registered in the ``latsim.schedules`` entry-point
group, and is the one implementation behind both the serving simulator
(:mod:`latsim.sim.serving`) and the live server (``latsim serve``). A policy is given the
waiting tasks in submission order (at least two; with one there is nothing to choose) and
the time, reads them, and returns one; the engine takes it off the queue. Ties go to the
task submitted first, so every policy is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from latsim.plugins.protocols import WaitingTask


def fifo(waiting: Sequence[WaitingTask], now: float) -> WaitingTask:
    """First come, first served."""
    return waiting[0]


def least_slack(waiting: Sequence[WaitingTask], now: float) -> WaitingTask:
    """The task of the stream with the least buffered playable time (closest to a stall)."""
    return min(waiting, key=lambda task: (task.slack, task.seq))


def replan_first(waiting: Sequence[WaitingTask], now: float) -> WaitingTask:
    """Replans (a viewer's change waiting to be shown) before refills, each in order."""
    return min(waiting, key=lambda task: (task.kind != "replan", task.seq))
