"""The records of a fleet run (DESIGN §8): sessions, their segments, nodes, and the levels of
the control plane over time. All times are global (the fleet's clock).

- :class:`SessionRecord`: one session from arrival to leaving (or the end of the run);
- :class:`SegmentRecord`: one active period of a session, played as one stream on a node;
- :class:`NodeRecord`: one node from provisioning to removal;
- :class:`Level`: the counts the control plane keeps, from one change to the next.

Each node's own serving records (:class:`~latsim.run.serving.ServingRecords`: per-stream
controller records, device tasks, the viewer's view) are kept beside them; a segment names
its node and its stream there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from latsim.controller.records import record
from latsim.run.serving import ServingRecords

#: How a session ended: served to the end (or to the end of the run), or turned away.
SERVED, REJECTED, WAITING = "served", "rejected", "waiting"


@record
class SessionRecord:
    """``admitted`` and ``first_display`` are NaN for a session never admitted (rejected,
    or still waiting when the run ended); ``left`` is NaN for one still present then."""

    session: int
    arrival: float
    duration: float  # the watch time it asked for
    status: str  # served | rejected | waiting
    node: int  # the node it was first placed on (-1: none)
    admitted: float
    first_display: float  # when its first frame was shown at its client
    left: float
    segments: int  # active periods started
    suspended: int  # idle periods it was suspended for
    migrations: int = 0  # times it moved to another node while playing

    @property
    def wait(self) -> float:
        """Seconds it waited for admission (NaN if never admitted)."""
        return self.admitted - self.arrival

    @property
    def ttfc(self) -> float:
        """Time to first chunk: arrival to the first frame shown (admission wait, the
        first chunk's generation, delivery and playout delay)."""
        return self.first_display - self.arrival


@record
class SegmentRecord:
    """Active period ``segment`` of ``session`` on ``node`` (its stream ``stream`` there):
    requested at ``t_request``, playing from ``t_start`` (its first chunk ready) until
    ``t_end``; NaN ``t_start`` if its first chunk was not ready when the run ended."""

    session: int
    segment: int
    segment_id: int  # its random streams' key (segments numbered as they start)
    node: int
    stream: int
    t_request: float
    t_start: float
    t_end: float

    @property
    def played(self) -> float:
        """Seconds it played (NaN start: none)."""
        return 0.0 if math.isnan(self.t_start) else max(0.0, self.t_end - self.t_start)


@record
class NodeRecord:
    """Node ``node``: provisioned (paid for) from ``t_provisioned``, usable from
    ``t_usable``, removed at ``t_removed`` (NaN: still up at the end); the most sessions it
    held at once."""

    node: int
    t_provisioned: float
    t_usable: float
    t_removed: float
    sessions_max: int


@record
class Level:
    """The control plane's counts from ``t`` until the next level."""

    t: float
    present: int  # admitted sessions not yet left (active, idle or suspended)
    playing: int  # segments playing (their first chunk shown to the end)
    queued: int  # sessions waiting for admission
    nodes: int  # nodes provisioned and not removed (what is paid for)
    usable: int  # nodes that take sessions
    held: int  # session slots held on nodes (suspended sessions hold none)


@dataclass(frozen=True)
class FleetRecords:
    """One fleet run over ``[0, horizon]``."""

    horizon: float
    end_time: float
    sessions: tuple[SessionRecord, ...]
    segments: tuple[SegmentRecord, ...]
    nodes: tuple[NodeRecord, ...]
    levels: tuple[Level, ...]
    node_runs: tuple[ServingRecords, ...]
    gpus_per_node: int
    max_sessions: int
    #: a population's sessions are measured over their own first ``session_window``
    #: seconds of play, as the serving model measures each stream; None: over ``[0,
    #: horizon]``
    session_window: float | None = None

    def measured(self, segment: SegmentRecord) -> float:
        """Seconds of ``segment``'s play that the metrics measure (its window's)."""
        if self.session_window is None:
            return segment.played
        return min(segment.played, self.session_window)

    def node_hours(self, until: float | None = None, since: float = 0.0) -> float:
        """Node-hours paid for over ``[since, until]`` (default ``[0, horizon]``)."""
        end = self.horizon if until is None else until
        total = 0.0
        for node in self.nodes:
            stop = end if math.isnan(node.t_removed) else min(node.t_removed, end)
            total += max(0.0, stop - max(node.t_provisioned, since))
        return total / 3600.0
