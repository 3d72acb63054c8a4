"""The records of a serving run: many streams on shared device pools (DESIGN §6).

Each stream keeps its controller's own records (:class:`~latsim.run.stream.RunRecords`, in
the stream's time: its playback starts at 0). Beside them a serving run records what only
the serving model has:

- :class:`TaskRecord`: one stage of one job on one device of a pool (global time), with its
  wait in the pool's queue; a batch is one record per task with the batch's id.
- :class:`ViewerRecord`: one condition seen from the client: sent, arrived at the server
  (uplink), played on the server, displayed at the client (stream time). ``L`` is the
  end-to-end latency, ``L_server`` the controller's ``R + C + Q``.
- :class:`ClientStallRecord`: the client froze because a slot arrived after its display time.
- :class:`StreamStart`: when the viewer joined and when its playback started (global time).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from latsim.controller.records import JOB_KINDS, ConditionRecord, Domain, record
from latsim.model.serving import DIT_POOL
from latsim.run.stream import COMPLETE, RunRecords, window_overlap


@record
class TaskRecord:
    """Stage ``stage`` of job ``job_id`` of ``stream`` on ``device`` of ``pool`` (for a DiT
    task on ``g`` devices at once, ``device`` is its group: devices ``g·device .. g·device +
    g − 1``)."""

    stream: int
    job_id: int
    stage: str  # dit | decode
    kind: str  # prebuffer | refill | replan
    pool: str
    device: int
    batch: int  # the batch's id (a task run alone is a batch of one)
    t_enqueue: float
    t_start: float
    t_end: float

    DOMAIN = Domain(order=(("t_enqueue", "t_start"), ("t_start", "t_end")),
                    choices=(("kind", JOB_KINDS),))

    @property
    def wait(self) -> float:
        return self.t_start - self.t_enqueue


@record
class ViewerRecord:
    """One condition end to end (stream time). NaN times for a censored condition."""

    stream: int
    version: int
    t_send: float
    t_arrival: float
    t_play: float
    t_display: float
    L_server: float
    L: float
    superseded: bool
    displayed: bool

    DOMAIN = Domain(unset=("t_play", "t_display", "L_server", "L"),  # censored
                    order=(("t_send", "t_arrival"), ("t_arrival", "t_play"),
                           ("t_play", "t_display")),
                    shown=("t_play", "t_display", "L_server", "L"))

    @property
    def uplink(self) -> float:
        # without an uplink stage the two times differ only by rounding (about 1e-17 s,
        # either sign); a delay is never negative
        return max(0.0, self.t_arrival - self.t_send)


def shown_records(stream: int, resolved: Sequence[ConditionRecord], sent: Sequence[float],
                  shown: float) -> list[ViewerRecord]:
    """The viewer's records of the conditions a slot shown at ``shown`` resolved (the
    controller's records of them, ``sent``: each version's send time, in version order)."""
    return [ViewerRecord(stream, cond.version, sent[cond.version - 1], cond.t_arrival,
                         cond.t_play, shown, cond.L, shown - sent[cond.version - 1],
                         cond.superseded, True)
            for cond in resolved]


def censored_records(stream: int, conditions: Sequence[ConditionRecord],
                     sent: Sequence[float]) -> list[ViewerRecord]:
    """The viewer's records of the conditions never displayed, at the run's end."""
    nan = math.nan
    return [ViewerRecord(stream, c.version, sent[c.version - 1], c.t_arrival, nan, nan, nan,
                         nan, False, False)
            for c in conditions if not c.displayed]


@record
class ClientStallRecord:
    """The client showed ``position`` at ``t_end`` instead of ``t_start`` (stream time)."""

    stream: int
    position: int
    t_start: float
    t_end: float

    DOMAIN = Domain(order=(("t_start", "t_end"),))


@record
class StreamStart:
    """Stream ``stream`` joined at ``t_join`` and started playback at ``t_origin`` (global
    time; its own time 0); its first frame showed ``ttff`` seconds after it joined."""

    stream: int
    t_join: float
    t_origin: float
    ttff: float

    DOMAIN = Domain(unset=("ttff",),  # no frame showed
                    order=(("t_join", "t_origin"),))


#: The serving records' CSV tables (beside the controller's, which gain a ``stream`` column).
SERVING_RECORD_TYPES: dict[str, type] = {
    "tasks": TaskRecord,
    "viewer": ViewerRecord,
    "client_stalls": ClientStallRecord,
    "starts": StreamStart,
}


@dataclass(frozen=True)
class ServingRecords:
    """One serving run: per-stream controller records plus the serving records.

    ``window_end`` is the global time the pools are measured to: the last stream's start
    plus ``duration``.
    """

    duration: float
    window_end: float
    end_time: float
    streams: tuple[RunRecords, ...]
    starts: tuple[StreamStart, ...]
    tasks: tuple[TaskRecord, ...]
    viewer: tuple[ViewerRecord, ...]
    client_stalls: tuple[ClientStallRecord, ...]
    pools: tuple[tuple[str, int], ...]
    playout_delay: float
    dit_degree: int = 1
    status: str = COMPLETE
    #: what was kept (:data:`~latsim.controller.records.RECORD_LEVELS`); below ``all``,
    #: ``tasks`` is empty and ``task_tally`` holds what the summary needs of them
    records: str = "all"
    task_tally: TaskTally | None = None

    def busy_by_device(self) -> dict[str, list[float]]:
        """Busy seconds of every device of every pool within ``[0, window_end]``."""
        return {pool: list(seconds) for pool, seconds in self._tally().busy.items()}

    def chunk_latencies(self) -> list[float]:
        """Every DiT chunk's wait plus run (refills and replans), in the order they ended."""
        return list(self._tally().chunks)

    def waits_by_stage(self) -> dict[str, list[float]]:
        """Every task's wait for a device, by stage, in the order the tasks ended."""
        return {stage: list(waits) for stage, waits in self._tally().waits.items()}

    def _tally(self) -> TaskTally:
        """The run's task tally: the one it made as it ran, or one of its kept records
        (made once: the summary reads it for busy time and for waits)."""
        if self.task_tally is not None:
            return self.task_tally
        return self._tally_of_tasks

    @cached_property
    def _tally_of_tasks(self) -> TaskTally:
        tally = TaskTally(self.pools, self.dit_degree, self.window_end)
        for task in self.tasks:
            tally.add(task)
        return tally


class TaskTally:
    """What the summary needs of the task records, added up as they are made: busy seconds
    per device within ``[0, window_end]`` (a batch occupies its device once; a DiT task on
    a USP group occupies each device of it) and every task's wait, by stage. Fed in the
    order the records are made, it gives the sums of reading the kept records. It also
    keeps every DiT chunk's latency (its wait plus run; the prebuffer is none)."""

    def __init__(self, pools: tuple[tuple[str, int], ...], dit_degree: int,
                 window_end: float) -> None:
        self.busy = {name: [0.0] * size for name, size in pools}
        self.waits: dict[str, array] = {}
        self.chunks = array("d")  # each DiT task's wait plus run (a fleet's chunk latency)
        self._degree = dit_degree
        self._window_end = window_end
        self._last: tuple[str, int, int] | None = None

    def add(self, task: TaskRecord) -> None:
        self.add_values(task.stage, task.kind, task.pool, task.device, task.batch,
                        task.t_enqueue, task.t_start, task.t_end)

    def add_values(self, stage: str, kind: str, pool: str, device: int, batch: int,
                   t_enqueue: float, t_start: float, t_end: float) -> None:
        """:meth:`add` from a task record's fields (a driver tallying, which makes none)."""
        waits = self.waits.get(stage)
        if waits is None:
            waits = self.waits[stage] = array("d")
        waits.append(t_start - t_enqueue)  # TaskRecord.wait
        if stage == "dit" and kind != "prebuffer":
            self.chunks.append(t_end - t_enqueue)
        key = (pool, device, batch)
        if key == self._last:  # a batch occupies its device once (its tasks come together)
            return
        self._last = key
        seconds = window_overlap(t_start, t_end, self._window_end)
        group = self._degree if pool == DIT_POOL else 1  # a USP group
        busy = self.busy[pool]
        for unit in range(device * group, (device + 1) * group):
            busy[unit] += seconds

