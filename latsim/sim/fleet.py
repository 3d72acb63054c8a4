"""The SimPy driver of a fleet (DESIGN §8). Exact mode: every node's serving model and the
control plane on one clock, so each decision reads the nodes' real state. Sharded mode: the
control plane alone on its predictors (:func:`plan_fleet_run`), each node then running its
plan on its own clock (:func:`simulate_node_plan`), merged back (:func:`merge_plays`).

A node is a :class:`~latsim.sim.serving.ServingNode`. A session arrives, is admitted or
rejected or queued (:class:`~latsim.model.fleet.FleetSpec` ``admission``), is placed on a
node with room by the placement plug-in, and plays its active periods (segments) there, each
as one stream with its own controller (the same controller every driver uses); between two
segments it is idle and plays nothing. An idle period longer than ``suspend_after_s`` frees
the session's slot; it is placed again when it resumes, ``resume_s`` before its next segment
starts. When it leaves (its watch time is over) its slot goes to the first session waiting.

The autoscaler looks every ``autoscale_interval_s``: utilisation is the slots held (plus the
sessions waiting) over the slots of the usable nodes that take sessions. Above ``target_util
+ hysteresis`` it provisions a node (usable ``provision_delay_s`` later) while fewer than
``nodes_max`` are up; below ``target_util − hysteresis`` it consolidates: the emptiest usable
node takes no new sessions and is removed once its last one leaves (sessions do not
migrate), while more than ``nodes_min`` would stay and the nodes left would hold the
present demand at or below ``target_util`` (else the next arrivals would have it provision
the node again: it thrashed). One action per ``cooldown_s``.

With ``migration``, every ``autoscale_interval_s`` the draining nodes' playing sessions
move to nodes with room, then the fullest node gives one to the emptiest while they differ
by ``rebalance_gap``; a session moves only at a chunk boundary, keeps its stream (the same
controller and buffer) and its next job waits for its state's transfer.

A ``population:N`` workload is the serving model itself: its N sessions are admitted at 0,
join at their start times, play ``horizon`` seconds each and drain as ``simulate --streams
N`` does, with the same events in the same order, so one node reproduces it exactly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from latsim.controller import ControllerConfig
from latsim.model.costs import CostModel
from latsim.model.fleet import FleetSpec, NodeSpec
from latsim.model.placement import FEWEST_SESSIONS
from latsim.model.workload import Session
from latsim.plugins import NodeLoad, load_placement
from latsim.run.fleet import (
    REJECTED,
    SERVED,
    WAITING,
    FleetRecords,
    Level,
    NodeRecord,
    SegmentRecord,
    SessionRecord,
)
from latsim.run.serving import ServingRecords
from latsim.run.stream import RunWindow
from latsim.sim.bulk import NodeRun, bulk_refusal, simulate_node_in_bulk
from latsim.sim.clock import Clock
from latsim.sim.serving import ServingNode, StreamInput, _StreamPort, run_drain

#: ``inputs(segment_id, join, length, conditions)``: a segment's arrivals (``conditions``,
#: its own time, from a session log; None: drawn) and random streams.
InputsFor = Callable[[int, float, float, "tuple[float, ...] | None"], StreamInput]


@dataclass(frozen=True)
class FleetSetup:
    """What one exact fleet run needs besides its sessions."""

    config: ControllerConfig
    cost: CostModel
    node: NodeSpec
    fleet: FleetSpec
    horizon: float
    population: bool
    records: str = "conditions"
    #: exact: every node simulated on the control plane's clock; sharded: the control plane
    #: alone, on its predictors (a segment's first chunk takes the mean C with a cold
    #: start), giving each node its plan (:func:`simulate_node_plan` then runs it)
    mode: str = "exact"


class _Node:
    def __init__(self, fleet: _Fleet, index: int, usable_at: float) -> None:
        self.index = index
        setup = fleet.setup
        self.serving = None if fleet.planned else ServingNode(
            fleet.env, setup.cost, setup.node.serving, fleet.batch_rng(index), setup.records)
        if self.serving is not None and not setup.population:  # the window is the horizon
            self.serving.engine.tally_tasks(setup.horizon)
        self.t_provisioned = fleet.env.now
        self.usable_at = usable_at
        self.removed_at = math.nan
        self.draining = False
        self.held: set[int] = set()  # sessions holding a slot
        self.playing: set[_Segment] = set()
        self.sessions_max = 0

    @property
    def up(self) -> bool:
        return math.isnan(self.removed_at)


class _Segment:
    """A segment as it runs (its record is made at the end)."""

    __slots__ = ("segment_id", "session", "k", "node", "port", "length", "t_request",
                 "t_start", "t_end", "stream", "conditions", "owner")

    def __init__(self, segment_id: int, session: int, k: int, node: int,
                 port: _StreamPort | None, length: float, t_request: float,
                 conditions: tuple[float, ...] | None = None) -> None:
        self.conditions = conditions
        self.owner: _Node | None = None  # the node whose records hold its stream
        self.segment_id = segment_id
        self.session = session
        self.k = k
        self.node = node
        self.port = port  # None in a sharded plan: the node runs it later
        self.length = length
        self.t_request = t_request
        self.t_start = math.nan
        self.t_end = math.nan
        self.stream = -1 if port is None else port.index

    def record(self) -> SegmentRecord:
        return SegmentRecord(self.session, self.k, self.segment_id, self.node, self.stream,
                             self.t_request, self.t_start, self.t_end)


class _SessionState:
    __slots__ = ("session", "node", "first_node", "admitted", "first", "left", "started",
                 "suspended", "status", "next_segment", "migrations")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.node: _Node | None = None
        self.first_node = -1
        self.admitted = math.nan
        self.first: _Segment | None = None  # its first segment (its first frame's)
        self.left = math.nan
        self.started = 0
        self.suspended = 0
        self.status = WAITING
        self.next_segment = 0  # the segment placing it starts (a resume's)
        self.migrations = 0


class _Fleet:
    def __init__(self, setup: FleetSetup, sessions: Sequence[Session], inputs: InputsFor,
                 batch_rng: Callable[[int], np.random.Generator],
                 placement_rng: np.random.Generator) -> None:
        self.setup = setup
        self.planned = setup.mode == "sharded"
        self.env = Clock()
        self.inputs = inputs
        self.batch_rng = batch_rng
        self.placement_rng = placement_rng
        self.choose = load_placement(setup.fleet.placement)
        self.states = [_SessionState(s) for s in sessions]
        self.nodes: list[_Node] = []
        self.queue: deque[_SessionState] = deque()
        self.segments: list[_Segment] = []
        self._segment_ids = 0
        self.levels: list[Level] = []
        self.last_action = -math.inf
        self.c_mean = setup.cost.mean(setup.config.timing.K)
        serving = setup.node.serving
        self.devices = max(1, serving.pool_size(serving.dit_pool) // serving.degree)
        self.window_drain = (RunWindow.for_config(setup.config, setup.horizon).drain
                             if setup.population else 0.0)
        #: a plan's prediction of a segment's first chunk (none without a cold start)
        self.prebuffer_s = self.c_mean if setup.node.serving.cold_start else 0.0
        self.present = self.playing = self.held = 0  # the counts a level logs
        for _ in range(setup.fleet.nodes_initial):
            self.nodes.append(_Node(self, len(self.nodes), 0.0))
        self._up = 0
        self._taking: list[_Node] = []
        #: a plan's loads of the nodes with room, by node index (None: no room), kept as
        #: they change: what placement is offered, without rebuilding every node's load
        #: for every session (a plan has no slack to read, so a load changes only with its
        #: node's sessions)
        self._room_loads: list[NodeLoad | None] = []
        #: where placement takes the fewest sessions (``least-loaded``), a plan's nodes with
        #: room by their sessions: a heap of node indices a count, entries checked as they
        #: are read (one whose node's sessions or room changed since is dropped then)
        self._fewest: list[list[int]] | None = (
            [] if self.planned and getattr(self.choose, FEWEST_SESSIONS, False) else None)
        self.recount()

    def recount(self) -> None:
        """Recount the nodes up and those taking sessions (after any node changes state)."""
        self._up = sum(1 for n in self.nodes if n.up)
        self._taking = [n for n in self.nodes if self._takes(n)]
        if self.planned:
            self._room_loads = [None] * len(self.nodes)
            if self._fewest is not None:
                self._fewest = [[] for _ in range(self.setup.node.max_sessions)]
            for node in self._taking:
                self._refresh(node)

    def _refresh(self, node: _Node) -> None:
        """A plan's load of ``node`` after its sessions changed."""
        if self.planned:
            room = self._takes(node) and len(node.held) < self.setup.node.max_sessions
            self._room_loads[node.index] = self._load(node) if room else None
            if room and self._fewest is not None:
                heapq.heappush(self._fewest[len(node.held)], node.index)

    # ---------------------------------------------------------------- levels

    def note(self) -> None:
        """Log the counts if they changed (one level per change, at most one per instant)."""
        level = Level(self.env.now, self.present, self.playing, len(self.queue), self._up,
                      len(self._taking), self.held)
        if self.levels and _counts(self.levels[-1]) == _counts(level):
            return
        if self.levels and self.levels[-1].t == level.t:
            self.levels[-1] = level
        else:
            self.levels.append(level)

    # ---------------------------------------------------------------- placement

    def _takes(self, node: _Node) -> bool:
        return node.up and not node.draining and self.env.now >= node.usable_at

    def _room(self) -> list[_Node]:
        cap = self.setup.node.max_sessions
        return [n for n in self._taking if len(n.held) < cap]

    def _offers(self) -> list[NodeLoad]:
        """The loads placement is offered: the nodes with room, in index order."""
        if self.planned:
            return [load for load in self._room_loads if load is not None]
        return [self._load(n) for n in self._room()]

    def _load(self, node: _Node) -> NodeLoad:
        now = self.env.now
        slack = min((s.port.slack(now) for s in node.playing if s.port is not None),
                    default=math.inf)  # a sharded plan has no streams: no slack to read
        return NodeLoad(node.index, len(node.held), self.setup.node.max_sessions,
                        self.devices, self.c_mean * math.ceil((len(node.held) + 1)
                                                              / self.devices), slack)

    def _fewest_sessions(self) -> NodeLoad | None:
        """The load of the node with room of fewest sessions, ties to the lowest index (what
        ``least-loaded`` chooses among :meth:`_offers`), from :attr:`_fewest`; None if no
        node has room."""
        loads = self._room_loads
        for sessions, heap in enumerate(self._fewest):  # type: ignore[arg-type]
            while heap:
                load = loads[heap[0]]
                if load is not None and load.sessions == sessions:
                    return load
                heapq.heappop(heap)  # its node filled, emptied or stopped taking sessions
        return None

    def place(self, state: _SessionState) -> bool:
        """Put ``state`` on a node with room (the placement plug-in chooses); False if
        none has room."""
        if self._fewest is not None:  # least-loaded, from the index
            chosen = self._fewest_sessions()
            if chosen is None:
                return False
        else:
            loads = self._offers()
            if not loads:
                return False
            chosen = self.choose(loads, self.placement_rng)
        offered = isinstance(chosen, NodeLoad) and (
            0 <= chosen.index < len(self.nodes)
            and self._room_loads[chosen.index] is chosen if self.planned
            else any(chosen is load for load in loads))
        if not offered:
            from latsim.errors import LatsimError

            raise LatsimError(f"placement {self.setup.fleet.placement!r} returned "
                              f"{chosen!r}, not one of the nodes it was offered")
        node = self.nodes[chosen.index]
        node.held.add(state.session.index)
        self._refresh(node)
        self.held += 1
        node.sessions_max = max(node.sessions_max, len(node.held))
        state.node = node
        if state.first_node < 0:
            state.first_node = node.index
        return True

    # ---------------------------------------------------------------- sessions

    def arrive(self, state: _SessionState) -> None:
        if self.place(state):
            self.admit(state)
        elif (self.setup.fleet.admission == "queue"
              and len(self.queue) < self.setup.fleet.max_queue):
            self.queue.append(state)
        else:
            state.status = REJECTED
        self.note()

    def admit(self, state: _SessionState) -> None:
        state.status = SERVED
        state.admitted = self.env.now
        self.present += 1
        self.start_segment(state, 0)

    def start_segment(self, state: _SessionState, k: int) -> None:
        """Segment ``k`` of ``state`` starts now on its node."""
        node = state.node
        assert node is not None
        length = state.session.segments[k][1]
        segment_id = self._segment_ids
        self._segment_ids += 1
        port = None
        if node.serving is not None:
            window = RunWindow(length, self.window_drain)
            port = node.serving.add(self.setup.config, window,
                                    self.inputs(segment_id, self.env.now, length,
                                                _conditions(state.session, k)))
        state.started += 1
        segment = _Segment(segment_id, state.session.index, k, node.index, port, length,
                           self.env.now, _conditions(state.session, k))
        segment.owner = node
        self.segments.append(segment)
        if state.first is None:
            state.first = segment

        def started(_: object = None) -> None:
            node.playing.add(segment)
            self.playing += 1
            segment.t_start = self.env.now
            self.note()
            end = self.env.timeout(length)
            end.callbacks.append(lambda _: self.end_segment(state, segment))

        if port is not None:
            node.serving.begin(port, started)  # type: ignore[union-attr]
        elif self.prebuffer_s > 0:  # a plan: the first chunk takes the predicted time
            self.env.timeout(self.prebuffer_s).callbacks.append(started)
        else:
            started()

    def end_segment(self, state: _SessionState, segment: _Segment) -> None:
        node, k = state.node, segment.k
        assert node is not None
        now = self.env.now
        if segment.port is not None:  # closed where its records are (it may have moved)
            segment.owner.serving.close(segment.port, now)  # type: ignore[union-attr]
        node.playing.discard(segment)
        self.playing -= 1
        segment.t_end = now
        segments = state.session.segments
        if k + 1 == len(segments):
            self.leave(state)
            return
        idle = segments[k + 1][0] - (segments[k][0] + segments[k][1])
        suspend = self.setup.fleet.suspend_after_s
        if suspend is not None and idle > suspend:
            self.env.timeout(suspend).callbacks.append(lambda _: self.suspend(state))
            self.env.timeout(idle).callbacks.append(lambda _: self.resume(state, k + 1))
        else:
            self.env.timeout(idle).callbacks.append(
                lambda _: self.start_segment(state, k + 1))
        self.note()

    def suspend(self, state: _SessionState) -> None:
        state.suspended += 1
        self.release(state)
        self.note()

    def resume(self, state: _SessionState, k: int) -> None:
        state.next_segment = k
        if self.place(state):
            self._resumed(state)
        else:
            self.queue.appendleft(state)  # a resumed session goes before new ones
        self.note()

    def _resumed(self, state: _SessionState) -> None:
        delay = self.setup.fleet.resume_s
        k = state.next_segment
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _: self.start_segment(state, k))
        else:
            self.start_segment(state, k)

    def leave(self, state: _SessionState) -> None:
        state.left = self.env.now
        self.present -= 1
        self.release(state)
        self.note()

    def release(self, state: _SessionState) -> None:
        """``state`` gives its slot back: a draining node it emptied goes, and the first
        sessions waiting take the room."""
        node = state.node
        assert node is not None
        node.held.discard(state.session.index)
        self._refresh(node)
        self.held -= 1
        state.node = None
        if node.draining and not node.held and not node.playing:
            node.removed_at = self.env.now
            self.recount()
        self.admit_waiting()

    def admit_waiting(self) -> None:
        while self.queue and self._room():
            state = self.queue.popleft()
            self.place(state)
            if state.status == SERVED:  # a resume
                self._resumed(state)
            else:
                self.admit(state)

    # ---------------------------------------------------------------- autoscaling

    def autoscale(self, _: object = None) -> None:
        fleet, env = self.setup.fleet, self.env
        up = [n for n in self.nodes if n.up]
        taking = [n for n in up if not n.draining]
        usable = [n for n in taking if env.now >= n.usable_at]
        capacity = len(usable) * self.setup.node.max_sessions
        demand = sum(len(n.held) for n in up) + len(self.queue)
        util = demand / capacity if capacity else math.inf
        if env.now - self.last_action >= fleet.cooldown_s:
            if util > fleet.target_util + fleet.hysteresis and len(up) < fleet.nodes_max:
                self.provision()
            elif (util < fleet.target_util - fleet.hysteresis and len(taking) > fleet.nodes_min
                  and len(usable) == len(taking)
                  and demand <= fleet.target_util * (len(usable) - 1)
                  * self.setup.node.max_sessions):
                self.consolidate(usable)
        env.timeout(fleet.autoscale_interval_s).callbacks.append(self.autoscale)

    def provision(self) -> None:
        env = self.env
        node = _Node(self, len(self.nodes), env.now + self.setup.fleet.provision_delay_s)
        self.nodes.append(node)
        self.last_action = env.now
        self.recount()

        def usable(_: object) -> None:
            self.recount()
            self.admit_waiting()
            self.note()

        env.timeout(self.setup.fleet.provision_delay_s).callbacks.append(usable)
        self.note()

    def consolidate(self, usable: list[_Node]) -> None:
        node = min(usable, key=lambda n: (len(n.held), -n.index))
        node.draining = True
        self.last_action = self.env.now
        if not node.held and not node.playing:
            node.removed_at = self.env.now
        self.recount()
        self.note()

    # ---------------------------------------------------------------- migration

    def _movable(self, segment: _Segment) -> bool:
        """At a chunk boundary: playing, no job in flight, not moving already."""
        port = segment.port
        return (port is not None and not port.closed and not math.isnan(segment.t_start)
                and not port.run.controller.jobs_in_flight
                and port.hold_until <= self.env.now)

    def rebalance(self, _: object = None) -> None:
        """Empty the draining nodes into the others, then move one session from the
        fullest node to the emptiest while they differ by ``rebalance_gap`` or more; only
        sessions at a chunk boundary move. Looks again every ``autoscale_interval_s``."""
        fleet, cap = self.setup.fleet, self.setup.node.max_sessions
        for node in [n for n in self.nodes if n.up and n.draining]:
            for segment in sorted(node.playing, key=lambda s: s.segment_id):
                room = [n for n in self._room() if n is not node]
                if room and self._movable(segment):
                    self.migrate(segment, node, min(room, key=lambda n: (len(n.held),
                                                                         n.index)))
        taking = self._taking
        if len(taking) > 1:
            fullest = max(taking, key=lambda n: (len(n.held), -n.index))
            emptiest = min(taking, key=lambda n: (len(n.held), n.index))
            if (len(fullest.held) - len(emptiest.held) >= fleet.rebalance_gap
                    and len(emptiest.held) < cap):
                movable = [s for s in sorted(fullest.playing, key=lambda s: s.segment_id)
                           if self._movable(s)]
                if movable:
                    self.migrate(movable[0], fullest, emptiest)
        self.env.timeout(fleet.autoscale_interval_s).callbacks.append(self.rebalance)

    def migrate(self, segment: _Segment, source: _Node, target: _Node) -> None:
        """Move ``segment``'s session from ``source`` to ``target``: its slot at once, its
        next job after the pause of moving its state (its buffer plays meanwhile)."""
        state = self.states[segment.session]
        source.held.discard(state.session.index)
        source.playing.discard(segment)
        target.held.add(state.session.index)
        target.playing.add(segment)
        target.sessions_max = max(target.sessions_max, len(target.held))
        state.node = target
        state.migrations += 1
        segment.port.move_to(target.serving.engine,  # type: ignore[union-attr]
                             self.env.now + self.setup.fleet.migration_pause_s)
        if source.draining and not source.held and not source.playing:
            source.removed_at = self.env.now
            self.recount()
        self.note()

    # ---------------------------------------------------------------- the run

    def run(self) -> FleetRecords:
        env, setup = self.env, self.setup
        if setup.fleet.autoscale:
            env.timeout(setup.fleet.autoscale_interval_s).callbacks.append(self.autoscale)
        if setup.fleet.migration:
            env.timeout(setup.fleet.autoscale_interval_s).callbacks.append(self.rebalance)
        if setup.population:
            end = self._run_population()
        else:
            for state in self.states:
                env.timeout(state.session.arrival).callbacks.append(
                    lambda _, s=state: self.arrive(s))
            self.note()
            env.run(until=setup.horizon)
            end = setup.horizon
        return self._records(end)

    def _run_population(self) -> float:
        """Admit every session now, start each at its join, play the horizon, drain."""
        env = self.env
        for state in self.states:
            if self.place(state):
                state.status, state.admitted = SERVED, 0.0
                self.present += 1
            else:
                state.status = REJECTED
        self.note()
        admitted = [s for s in self.states if s.status == SERVED]
        if not admitted:
            return self.setup.horizon
        started = env.event()
        waiting = [len(admitted)]
        ports: list[_StreamPort] = []  # in session order, as simulate's streams are

        def one_started(port: _StreamPort) -> None:
            waiting[0] -= 1
            if waiting[0] == 0:
                started.succeed()

        for state in admitted:
            node = state.node
            assert node is not None
            window = RunWindow(self.setup.horizon, self.window_drain)
            port = node.serving.add(self.setup.config, window,
                                    self.inputs(state.session.index, state.session.arrival,
                                                self.setup.horizon, None))
            ports.append(port)
            state.started = 1
            state.first = _Segment(state.session.index, state.session.index, 0, node.index,
                                   port, self.setup.horizon, state.session.arrival)
            self.segments.append(state.first)

            def begin(_: object = None, node: _Node = node, port: _StreamPort = port,
                      segment: _Segment = state.first) -> None:
                def on_start(p: _StreamPort) -> None:
                    node.playing.add(segment)
                    self.playing += 1
                    one_started(p)

                node.serving.begin(port, on_start)

            if state.session.arrival > env.now:
                env.timeout(state.session.arrival).callbacks.append(begin)
            else:
                begin()
        env.run(until=started)
        last_origin = max(p.origin for p in ports)
        if last_origin + self.setup.horizon > env.now:
            env.run(until=last_origin + self.setup.horizon)
        limit = last_origin + self.setup.horizon + self.window_drain
        end = run_drain(env, [node.serving for node in self.nodes], limit)
        for segment in self.segments:
            segment.t_start = segment.port.origin
        self.note()
        return end

    def _records(self, end: float) -> FleetRecords:
        setup = self.setup
        for segment in self.segments:
            if math.isnan(segment.t_end):
                segment.t_end = end
        if setup.population:
            horizon = setup.horizon
            ports = [p for n in self.nodes for p in n.serving.ports]
            window_end = max((p.origin for p in ports), default=0.0) + horizon
        else:
            window_end = horizon = setup.horizon
        node_runs = tuple(n.serving.records(horizon, window_end, end) for n in self.nodes
                          if n.serving is not None)
        sessions = tuple(
            SessionRecord(s.session.index, s.session.arrival, s.session.duration, s.status,
                          s.first_node, s.admitted, _first_display(s.first), s.left,
                          s.started, s.suspended, s.migrations)
            for s in self.states)
        nodes = tuple(NodeRecord(n.index, n.t_provisioned, n.usable_at, n.removed_at,
                                 n.sessions_max) for n in self.nodes)
        return FleetRecords(horizon=setup.horizon, end_time=end, sessions=sessions,
                            segments=tuple(s.record() for s in self.segments), nodes=nodes,
                            levels=tuple(self.levels), node_runs=node_runs,
                            gpus_per_node=setup.node.gpus,
                            max_sessions=setup.node.max_sessions,
                            session_window=setup.horizon if setup.population else None)



def _conditions(session: Session, k: int) -> tuple[float, ...] | None:
    return None if session.conditions is None else session.conditions[k]


def _counts(level: Level) -> tuple[int, ...]:
    return (level.present, level.playing, level.queued, level.nodes, level.usable, level.held)


def _first_display(segment: _Segment | None) -> float:
    """When a session's first frame was shown at its client (NaN: none was, or the
    segment is a plan's)."""
    if segment is None or segment.port is None or segment.port.first_display is None:
        return math.nan
    return segment.port.origin + segment.port.first_display


@dataclass(frozen=True)
class PlannedSegment:
    """A segment as a sharded plan gives it to its node: requested at ``t_request``
    (global time), playing ``length`` seconds once its first chunk is ready."""

    segment_id: int
    t_request: float
    length: float
    conditions: tuple[float, ...] | None = None  # from a session log


@dataclass(frozen=True)
class NodePlay:
    """What a node made of its plan: its records, and per planned segment (in plan order)
    its stream's start and end and its first frame's display (global time; NaN: none)."""

    records: ServingRecords | None  # None once tallied (a sharded unit sends back a tally)
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    first_displays: tuple[float, ...]


def plan_fleet_run(setup: FleetSetup, sessions: Sequence[Session], inputs: InputsFor,
                   placement_rng: np.random.Generator
                   ) -> tuple[FleetRecords, dict[int, list[PlannedSegment]]]:
    """The control plane of a sharded run alone, on its predictors: its records (no node
    records yet) and each node's planned segments, in request order."""
    fleet = _Fleet(replace(setup, mode="sharded"), sessions, inputs,
                   lambda _: np.random.default_rng(0), placement_rng)
    control = fleet.run()
    plans: dict[int, list[PlannedSegment]] = {n.node: [] for n in control.nodes}
    for segment in fleet.segments:
        plans[segment.node].append(PlannedSegment(segment.segment_id, segment.t_request,
                                                  segment.length, segment.conditions))
    return control, plans


def merge_plays(control: FleetRecords, plans: dict[int, list[PlannedSegment]],
                plays: dict[int, NodePlay]) -> FleetRecords:
    """A sharded run's records: the control plane's, with each segment's stream, start
    and end, each session's first frame and each node's records from what its node made of
    its plan (no node records if the plays were tallied instead)."""
    where = {planned.segment_id: (node, index) for node, plan in plans.items()
             for index, planned in enumerate(plan)}
    segments = []
    first: dict[int, float] = {}
    for segment in control.segments:
        node, index = where[segment.segment_id]
        play = plays[node]
        segments.append(replace(segment, stream=index, t_start=play.starts[index],
                                t_end=play.ends[index]))
        if segment.segment == 0:
            first[segment.session] = play.first_displays[index]
    sessions = tuple(replace(s, first_display=first.get(s.session, math.nan))
                     for s in control.sessions)
    runs = tuple(plays[n.node].records for n in control.nodes)
    return replace(control, segments=tuple(segments), sessions=sessions,
                   node_runs=() if any(r is None for r in runs) else runs)  # type: ignore[arg-type]


def simulate_node_plan(setup: FleetSetup, node: int, plan: Sequence[PlannedSegment],
                       inputs: InputsFor, batch_rng: np.random.Generator) -> NodePlay:
    """Run one node of a sharded fleet on its own clock: each planned segment joins at its
    request time (its first chunk generated there with a cold start) and plays its length;
    the node's records end at the horizon."""
    played = _node_in_bulk(setup, plan, inputs)
    if played is not None:
        return played
    env = Clock()
    serving = ServingNode(env, setup.cost, setup.node.serving, batch_rng, setup.records)
    serving.engine.tally_tasks(setup.horizon)
    ports: list[_StreamPort | None] = [None] * len(plan)
    starts = [math.nan] * len(plan)
    ends = [math.nan] * len(plan)

    def join(index: int) -> None:
        planned = plan[index]
        port = serving.add(setup.config, RunWindow(planned.length, 0.0),
                           inputs(planned.segment_id, env.now, planned.length,
                                  planned.conditions))
        ports[index] = port

        def started(port: _StreamPort) -> None:
            starts[index] = env.now

            def leave(_: object) -> None:
                serving.close(port, env.now)
                ends[index] = env.now

            env.timeout(planned.length).callbacks.append(leave)

        serving.begin(port, started)

    for index, planned in enumerate(plan):
        if planned.t_request > 0:
            env.timeout(planned.t_request).callbacks.append(lambda _, i=index: join(i))
        else:
            join(index)
    env.run(until=setup.horizon)
    records = serving.records(setup.horizon, setup.horizon, setup.horizon)
    return NodePlay(records, tuple(starts),
                    tuple(setup.horizon if math.isnan(e) else e for e in ends),
                    tuple(math.nan if p is None or p.first_display is None
                          else p.origin + p.first_display for p in ports))


#: Whether :func:`simulate_node_plan` plays a node plan in bulk where it can
#: (:func:`latsim.sim.bulk.simulate_node_in_bulk`); False: on the clock, the reference.
NODES_IN_BULK = True


def _node_in_bulk(setup: FleetSetup, plan: Sequence[PlannedSegment], inputs: InputsFor
                  ) -> NodePlay | None:
    """:func:`simulate_node_plan`'s play by the bulk loop
    (:func:`latsim.sim.bulk.simulate_node_in_bulk`), or None where the loop does not play
    it or gives it back (the clock then does). The segments that join before the horizon
    are the plan's first ones (it is in request order), each at its request time as the
    clock's sum gives it (``0 + t_request``: a float; one at time 0 would join at the
    clock's integer 0, which is left to the clock)."""
    horizon = setup.horizon
    requests = [p.t_request for p in plan]
    if not NODES_IN_BULK or requests != sorted(requests) or any(not t > 0 for t in requests):
        return None
    joined = [p for p in plan if p.t_request < horizon]
    if not joined:
        return None
    streams = [inputs(p.segment_id, 0 + p.t_request, p.length, p.conditions)
               for p in joined]
    configs = [setup.config] * len(joined)
    windows = [RunWindow(p.length, 0.0) for p in joined]
    serving = setup.node.serving
    if bulk_refusal(configs, setup.cost, serving, streams, max(w.duration for w in windows),
                    fleet_node=True) is not None:
        return None
    played = simulate_node_in_bulk(configs, setup.cost, serving, streams, windows,
                                   setup.records,
                                   NodeRun(horizon))
    if played is None:
        return None
    records, starts, first_displays = played
    left = (math.nan,) * (len(plan) - len(joined))
    ends = [min(horizon, start + p.length) if start == start else horizon
            for start, p in zip(starts, joined, strict=True)]
    return NodePlay(records, tuple(starts) + left, tuple(ends) + (horizon,) * len(left),
                    tuple(first_displays) + left)


def simulate_fleet(setup: FleetSetup, sessions: Sequence[Session], inputs: InputsFor,
                   batch_rng: Callable[[int], np.random.Generator],
                   placement_rng: np.random.Generator) -> FleetRecords:
    """One exact fleet run of ``sessions`` over ``[0, setup.horizon]``: ``inputs`` gives each
    segment's arrivals and random streams, ``batch_rng(node)`` each node's batch-cost
    stream, ``placement_rng`` the placement policy's draws."""
    return _Fleet(setup, sessions, inputs, batch_rng, placement_rng).run()
