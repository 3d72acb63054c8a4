"""What one stream's run recorded (:class:`RunRecords`) and the window it is measured over
(:class:`RunWindow`). Plain data, kept apart from the run's per-event logic
(:mod:`latsim.run.stream`): the compiled build compiles that logic, and these stay ordinary
frozen dataclasses there, pickled back from worker processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from latsim.controller import ControllerConfig
from latsim.controller.records import (
    ConditionRecord,
    DiscardRecord,
    JobRecord,
    SlotRecord,
    StallRecord,
    record,
)
from latsim.errors import LatsimError

#: Status of a run that reached the end of its window (and drain).
COMPLETE = "complete"
#: Status of a run stopped early (Ctrl-C, a stop request, a failed generator).
INTERRUPTED = "interrupted"


def window_overlap(t_start: float, t_end: float, end: float, begin: float = 0.0) -> float:
    """Seconds of ``[t_start, t_end]`` that lie within the window ``[begin, end]``: the
    one clipping rule of every stall and busy share."""
    return max(0.0, min(t_end, end) - max(t_start, begin))


@record
class BusyInterval:
    """Generator time of one job: ``[t_start, t_end]`` (``t_end`` of a job still running at
    the end of the run is the end of the run)."""

    job_id: int
    t_start: float
    t_end: float


@dataclass(frozen=True)
class RunRecords:
    """Everything one run recorded, plus the window it is measured over.

    ``status`` is :data:`COMPLETE` or :data:`INTERRUPTED` (a partial run: its records cover
    ``[0, end_time]`` only).
    """

    duration: float
    end_time: float
    conditions: tuple[ConditionRecord, ...]
    jobs: tuple[JobRecord, ...]
    slots: Sequence[SlotRecord]  # a SlotLog from the controller, a tuple from a folder
    stalls: tuple[StallRecord, ...]
    discards: tuple[DiscardRecord, ...]
    busy: tuple[BusyInterval, ...]
    jobs_started: int
    jobs_done: int
    cached_at_end: int
    status: str = COMPLETE
    #: what was kept (:data:`~latsim.controller.records.RECORD_LEVELS`); below ``all``,
    #: ``slots`` is a :class:`~latsim.controller.records.SlotTally`, ``busy`` is empty and
    #: ``busy_tally`` holds what the summary needs of it; at ``none``, ``jobs`` holds only
    #: the prebuffer's record (the job table is not kept; K reads off it)
    records: str = "all"
    busy_tally: BusyTally | None = None

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def busy_in_window(self) -> float:
        """Generator-busy seconds within ``[0, duration]``."""
        if self.busy_tally is not None:
            return self.busy_tally.seconds
        seconds = 0.0  # summed one by one, as the tally sums (sum() compensates on 3.12+)
        for b in self.busy:
            seconds += window_overlap(b.t_start, b.t_end, self.duration)
        return seconds

    @property
    def calls_started_in_window(self) -> int:
        """Generator jobs started within ``[0, duration)`` (the prebuffer is none)."""
        if self.busy_tally is not None:
            return self.busy_tally.started
        return sum(1 for b in self.busy if b.t_start < self.duration)


@dataclass
class BusyTally:
    """What the summary needs of a run's busy intervals, summed in job start order (the
    order the intervals are kept in), so the floats are those of summing kept ones."""

    seconds: float = 0.0  # generator-busy seconds within the window
    started: int = 0  # jobs started within it

    def add(self, t_start: float, t_end: float, duration: float) -> None:
        self.seconds += window_overlap(t_start, t_end, duration)
        if t_start < duration:
            self.started += 1


@dataclass(frozen=True)
class RunWindow:
    """The measurement window ``[0, duration]`` and the drain allowed past it."""

    duration: float
    drain: float

    @classmethod
    def for_config(cls, config: ControllerConfig, duration: float,
                   drain: float | None = None) -> RunWindow:
        """Validate ``duration`` against the stream's timing; ``drain`` defaults to
        :func:`default_drain`."""
        if not (math.isfinite(duration) and duration > 0):
            raise LatsimError(f"duration must be a positive number of seconds, got {duration!r}")
        if duration < config.timing.T:
            raise LatsimError(
                f"duration {duration:g} s is shorter than one chunk (T = {config.timing.T:g} s)"
            )
        if drain is None:
            drain = default_drain(config)
        if not (math.isfinite(drain) and drain >= 0):
            raise LatsimError(f"drain must be >= 0 seconds, got {drain!r}")
        return cls(float(duration), float(drain))

    @property
    def limit(self) -> float:
        """The latest time the run goes on to (end of window plus drain)."""
        return self.duration + self.drain


def default_drain(config: ControllerConfig) -> float:
    """How long past the window both drivers wait for open conditions: four chunks plus
    twice the lead (the lead stands in for a late job: it is C's 0.99 quantile by default)."""
    return 4 * (config.timing.T + 2 * config.lead) + config.timing.delta
