"""The SimPy driver of a fleet (DESIGN §8), exact mode: every node's serving model and the
control plane on one clock, so each decision reads the nodes' real state.

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
migrate), while more than ``nodes_min`` would stay. One action per ``cooldown_s``.

A ``population:N`` workload is the serving model itself: its N sessions are admitted at 0,
join at their start times, play ``horizon`` seconds each and drain as ``simulate --streams
N`` does, with the same events in the same order, so one node reproduces it exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from latsim.controller import ControllerConfig
from latsim.model.costs import CostModel
from latsim.model.fleet import FleetSpec, NodeSpec
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
from latsim.run.stream import RunWindow
from latsim.sim.serving import ServingNode, StreamInput, _Draining, _StreamPort

#: ``inputs(segment_id, join, length)``: a segment's arrivals and random streams.
InputsFor = Callable[[int, float, float], StreamInput]


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


class _Node:
    def __init__(self, fleet: _Fleet, index: int, usable_at: float) -> None:
        self.index = index
        self.serving = ServingNode(fleet.env, fleet.setup.cost, fleet.setup.node.serving,
                                   fleet.batch_rng(index), fleet.setup.records)
        self.t_provisioned = fleet.env.now
        self.usable_at = usable_at
        self.removed_at = math.nan
        self.draining = False
        self.held: set[int] = set()  # sessions holding a slot
        self.playing: set[_StreamPort] = set()
        self.sessions_max = 0

    @property
    def up(self) -> bool:
        return math.isnan(self.removed_at)


class _Segment:
    """A segment as it runs (its record is made at the end)."""

    __slots__ = ("session", "k", "node", "port", "t_request", "t_start", "t_end")

    def __init__(self, session: int, k: int, node: int, port: _StreamPort,
                 t_request: float) -> None:
        self.session = session
        self.k = k
        self.node = node
        self.port = port
        self.t_request = t_request
        self.t_start = math.nan
        self.t_end = math.nan

    def record(self) -> SegmentRecord:
        return SegmentRecord(self.session, self.k, self.node, self.port.index,
                             self.t_request, self.t_start, self.t_end)


class _SessionState:
    __slots__ = ("session", "node", "first_node", "admitted", "first", "left", "started",
                 "suspended", "status", "next_segment")

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


class _Fleet:
    def __init__(self, setup: FleetSetup, sessions: Sequence[Session], inputs: InputsFor,
                 batch_rng: Callable[[int], np.random.Generator],
                 placement_rng: np.random.Generator) -> None:
        self.setup = setup
        self.env = simpy.Environment()
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
        for _ in range(setup.fleet.nodes_initial):
            self.nodes.append(_Node(self, len(self.nodes), 0.0))

    # ---------------------------------------------------------------- levels

    def note(self) -> None:
        """Log the counts if they changed (one level per change, at most one per instant)."""
        up = [n for n in self.nodes if n.up]
        level = Level(self.env.now,
                      sum(1 for s in self.states if s.status == SERVED and math.isnan(s.left)),
                      sum(len(n.playing) for n in up), len(self.queue), len(up),
                      sum(1 for n in up if self._takes(n)), sum(len(n.held) for n in up))
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
        return [n for n in self.nodes if self._takes(n) and len(n.held) < cap]

    def _load(self, node: _Node) -> NodeLoad:
        now = self.env.now
        slack = min((p.slack(now) for p in node.playing if not p.closed), default=math.inf)
        return NodeLoad(node.index, len(node.held), self.setup.node.max_sessions,
                        self.devices, self.c_mean * math.ceil((len(node.held) + 1)
                                                              / self.devices), slack)

    def place(self, state: _SessionState) -> bool:
        """Put ``state`` on a node with room (the placement plug-in chooses); False if
        none has room."""
        room = self._room()
        if not room:
            return False
        loads = [self._load(n) for n in room]
        chosen = self.choose(loads, self.placement_rng)
        if not isinstance(chosen, NodeLoad) or chosen not in loads:
            from latsim.errors import LatsimError

            raise LatsimError(f"placement {self.setup.fleet.placement!r} returned "
                              f"{chosen!r}, not one of the nodes it was offered")
        node = self.nodes[chosen.index]
        node.held.add(state.session.index)
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
        self.start_segment(state, 0)

    def start_segment(self, state: _SessionState, k: int) -> None:
        """Segment ``k`` of ``state`` starts now on its node."""
        node = state.node
        assert node is not None
        length = state.session.segments[k][1]
        segment_id = self._segment_ids
        self._segment_ids += 1
        window = RunWindow(length, self.window_drain)
        port = node.serving.add(self.setup.config, window,
                                self.inputs(segment_id, self.env.now, length))
        state.started += 1
        segment = _Segment(state.session.index, k, node.index, port, self.env.now)
        self.segments.append(segment)
        if state.first is None:
            state.first = segment

        def started(port: _StreamPort) -> None:
            node.playing.add(port)
            segment.t_start = self.env.now
            self.note()
            end = self.env.timeout(length)
            end.callbacks.append(lambda _: self.end_segment(state, segment))

        node.serving.begin(port, started)

    def end_segment(self, state: _SessionState, segment: _Segment) -> None:
        node, k = state.node, segment.k
        assert node is not None
        now = self.env.now
        node.serving.close(segment.port, now)
        node.playing.discard(segment.port)
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
        self.release(state)
        self.note()

    def release(self, state: _SessionState) -> None:
        """``state`` gives its slot back: a draining node it emptied goes, and the first
        sessions waiting take the room."""
        node = state.node
        assert node is not None
        node.held.discard(state.session.index)
        state.node = None
        if node.draining and not node.held and not node.playing:
            node.removed_at = self.env.now
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
                  and len(usable) == len(taking)):
                self.consolidate(usable)
        env.timeout(fleet.autoscale_interval_s).callbacks.append(self.autoscale)

    def provision(self) -> None:
        env = self.env
        node = _Node(self, len(self.nodes), env.now + self.setup.fleet.provision_delay_s)
        self.nodes.append(node)
        self.last_action = env.now

        def usable(_: object) -> None:
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
        self.note()

    # ---------------------------------------------------------------- the run

    def run(self) -> FleetRecords:
        env, setup = self.env, self.setup
        if setup.fleet.autoscale:
            env.timeout(setup.fleet.autoscale_interval_s).callbacks.append(self.autoscale)
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
                                                self.setup.horizon))
            ports.append(port)
            state.started = 1
            state.first = _Segment(state.session.index, 0, node.index, port,
                                   state.session.arrival)
            self.segments.append(state.first)

            def begin(_: object = None, node: _Node = node, port: _StreamPort = port) -> None:
                def on_start(p: _StreamPort) -> None:
                    node.playing.add(p)
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
        draining = _Draining([p.run.controller for p in ports])
        while draining.any_open() and env.peek() <= limit:
            env.step()
        for segment in self.segments:
            segment.t_start = segment.port.origin
        self.note()
        return env.now

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
        node_runs = tuple(n.serving.records(horizon, window_end, end) for n in self.nodes)
        sessions = tuple(
            SessionRecord(s.session.index, s.session.arrival, s.session.duration, s.status,
                          s.first_node, s.admitted, _first_display(s.first), s.left,
                          s.started, s.suspended)
            for s in self.states)
        nodes = tuple(NodeRecord(n.index, n.t_provisioned, n.usable_at, n.removed_at,
                                 n.sessions_max) for n in self.nodes)
        return FleetRecords(horizon=setup.horizon, end_time=end, sessions=sessions,
                            segments=tuple(s.record() for s in self.segments), nodes=nodes,
                            levels=tuple(self.levels), node_runs=node_runs,
                            gpus_per_node=setup.node.gpus,
                            max_sessions=setup.node.max_sessions)



def _counts(level: Level) -> tuple[int, ...]:
    return (level.present, level.playing, level.queued, level.nodes, level.usable, level.held)


def _first_display(segment: _Segment | None) -> float:
    """When a session's first frame was shown at its client (NaN: none was)."""
    if segment is None or segment.port.first_display is None:
        return math.nan
    return segment.port.origin + segment.port.first_display


def simulate_fleet(setup: FleetSetup, sessions: Sequence[Session], inputs: InputsFor,
                   batch_rng: Callable[[int], np.random.Generator],
                   placement_rng: np.random.Generator) -> FleetRecords:
    """One exact fleet run of ``sessions`` over ``[0, setup.horizon]``: ``inputs`` gives each
    segment's arrivals and random streams, ``batch_rng(node)`` each node's batch-cost
    stream, ``placement_rng`` the placement policy's draws."""
    return _Fleet(setup, sessions, inputs, batch_rng, placement_rng).run()
