"""Quiet serving runs in bulk: refill cycles on FIFO pools without the clock (DESIGN §6).

A serving run whose streams see no condition is, while nothing stalls, a set of periodic
refill cycles sharing FIFO pools: each stream asks for its next chunk when its armed
refill falls due (or at once, when its job ends after that), and the DiT pool serves the
requests in order on its lowest free device, as Kiefer and Wolfowitz's recursion for a
multi-server queue has it (then the decode pool, the same way, where there is one).
:func:`simulate_quiet_serving` plays such a run with no event per tick and no SimPy
event at all: the streams' ticks are computed for all streams at once (numpy, column by
column: each tick the same float sums as the event path's, so the same bits), and their
jobs go through one loop over the pools' requests and ends, in the clock's order.

What it may assume is what the controller's table implies for a quiet refill cycle
(:meth:`~latsim.controller.machine.Controller.quiet_wake`, ``quiet_job_started`` and
``quiet_job_done``, the rows ``Controller._quiet_cycles`` checks), and it checks each of
those assumptions as it goes: every tick it plays is quiet by the table's own test
(cached, and the decide step after it commands nothing), every wake-up and job end takes
the fast path, and nothing stalls. Where one fails, or the run is not of this kind
(:func:`bulk_refusal`), it gives the run back to the event path
(:func:`latsim.sim.serving.simulate_serving`), its random streams as it found them. The
records are then those of the event path, byte for byte: ``tests/test_bulk.py`` holds the
two equal over the serving model's generators.

Where a run can be told exactly as arrays, :mod:`latsim.sim.bulk_numpy` computes it in
numpy and writes the result into this module's books (:class:`_Run`), whose ``finish``
makes the records; this module's loop plays the rest.

Conditions under an eager commit move no job: the numpy path computes such a run's
schedule as a quiet one's and replays each stream that sees a condition through its own
controller (:mod:`latsim.sim.bulk_replay`). Under a lazy commit they do (a replan is a
job of its own), and where the arrays cannot tell a run with conditions, this module's
loop drives each stream that sees one through its controller as the events come
(:class:`~latsim.sim.bulk_replay.OnlineStream`), beside the quiet streams' arithmetic (under
a lazy commit it drives every stream: a stall, which the arithmetic cannot play, then
gives nothing back), and past the window's end while a condition is open
(:meth:`_Run._drain`).

A sharded fleet node's plan (:func:`simulate_node_in_bulk`) is played by the same loop,
every stream driven through its controller: streams join at their request times (with a
cold start, their first chunk goes to the pools first, and playback starts when it is
ready), leave after their length (:meth:`_Run.close`: their steps still waiting dropped,
one running finished with nothing after it, their records ending then), and the run ends
at the node's horizon with no drain.

The event path stays the reference and does everything else: a stall the arithmetic
meets, a tick that starts a job, flushes, batching, pipelines, other scheduling policies,
a fleet's exact mode (one clock for every node, sessions that move).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Protocol, TypeVar, cast

import numpy as np

from latsim.controller import Controller, ControllerConfig
from latsim.controller.machine import EPS
from latsim.controller.playout import ClientPlayout
from latsim.controller.records import ConditionRecord, JobRecord, SlotLog, SlotTally
from latsim.model.costs import CostModel, FixedCost
from latsim.model.generators import StagedGenerator, Step, StepStreams
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.run.records import COMPLETE, BusyTally, RunRecords, RunWindow
from latsim.run.serving import (
    ServingRecords,
    StreamStart,
    TaskRecord,
    TaskTally,
    ViewerRecord,
)
from latsim.run.stream import busy_at_end
from latsim.sim.bulk_replay import Differs, OnlineStream, StreamReplay


class Shows(Protocol):
    """A stream's conditions where the arrays tell them (:mod:`latsim.sim.bulk_numpy`):
    each job's version, and the records once the ticks played are known."""

    versions: list[int]

    def slot_versions(self, played: int) -> list[int]: ...

    def records(self, played: int, delay: float, shift: float
                ) -> tuple[list[ConditionRecord], list[ViewerRecord]]: ...


class StreamInput(Protocol):
    """What this module reads of a :class:`latsim.sim.serving.StreamInput` (which imports
    this module, so it is not imported here)."""

    @property
    def trace(self) -> Trace: ...
    @property
    def join(self) -> float: ...
    @property
    def cost(self) -> np.random.Generator: ...
    @property
    def stages(self) -> Sequence[np.random.Generator]: ...


@dataclass(frozen=True)
class NodeRun:
    """A sharded fleet node's run (:func:`latsim.sim.fleet.simulate_node_plan`): each
    stream leaves its window's duration (its segment's length) after it starts
    (``ServingNode.close``), and the run ends at ``horizon`` (global time) with no drain,
    the window of its records and its task tally too."""

    horizon: float


#: The most ticks (streams × ticks each) a bulk run computes at once; a longer run goes
#: to the event path.
MAX_TICKS = 20_000_000


def bulk_refusal(configs: Sequence[ControllerConfig], cost: CostModel,
                 serving: ServingConfig, streams: Sequence[StreamInput], duration: float,
                 fleet_node: bool = False) -> str | None:
    """Why this serving run is not one :func:`simulate_quiet_serving` plays (a phrase), or
    None if it is: one chunk in flight with a fixed lead, conditions without a flush or an
    uplink draw, the plain chain (DiT, then decode if any; no pipeline or system model) on
    FIFO pools without batching, no per-slot network draw and no cold start (but in a
    ``fleet_node``'s run: :func:`simulate_node_in_bulk`)."""
    if not Controller._quiet_cycles:
        return "the controller's table has no quiet refill cycle"
    if any(c.in_flight != 1 or c.adaptive is not None for c in configs):
        return "more than one chunk in flight, or an adaptive lead"
    if serving.schedule != "fifo" or serving.batch is not None:
        return "a scheduling policy other than fifo, or batching"
    if serving.deliver is not None or serving.cold_start and not fleet_node:
        return "a delivery draw or a cold start"
    if hasattr(cost, "steps") or StagedGenerator(cost).pipelines():
        return "a system model's own chain of steps"
    if any(t < duration for s in streams for t in s.trace.times) and (
            serving.uplink is not None
            or any(c.in_flight_policy == "flush" for c in configs)):
        return "a condition under a flush, or with an uplink draw"
    if any(type(s.join) is not float for s in streams):
        return "a join time that is not a float (its type would carry into the records)"
    first = configs[0]
    if any(c.timing != first.timing or c.lead != first.lead or c.run_ahead != first.run_ahead
           for c in configs):
        return "streams with their own chunk timing or lead"
    joins = [s.join for s in streams]
    ticks = _tick_count(joins, duration, first.timing.delta)
    if ticks * len(joins) > MAX_TICKS:
        return f"more than {MAX_TICKS:,} ticks to compute at once"
    return None


def _tick_count(joins: Sequence[float], duration: float, delta: float) -> int:
    """Ticks per stream that cover the run: from the first join to the last one's window
    end (ticks are a slot apart), and two more."""
    return int(math.ceil((max(joins) + duration - min(joins)) / delta)) + 2


class _Pool:
    """A pool's free devices (a heap: the lowest serves next) and its FIFO queue."""

    __slots__ = ("name", "free", "waiting")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.free = list(range(size))
        self.waiting: deque[_Stream] = deque()


_Played = TypeVar("_Played")


class _Giveback(Exception):
    """The run is not quiet after all: the event path plays it."""


class _Stream:
    """One stream's refill cycle, as the controller's books keep it (the fields the quiet
    fast paths read and write), and its ticks."""

    __slots__ = ("index", "origin", "rng", "stages", "clock", "played", "stage",
                 "dit_start",
                 "planned_end", "armed", "next_job", "job", "branch", "t_enqueue",
                 "ctrl_start", "jobs", "jobs_done", "starts", "ran", "tally", "took",
                 "kind", "steps", "driven", "closed", "left", "cold", "shows")

    def __init__(self, index: int, origin: float, rng: np.random.Generator,
                 stages: Sequence[np.random.Generator], clock: Sequence[float]) -> None:
        self.index = index
        self.origin = origin
        self.rng = rng
        self.stages = stages  # StreamInput.stages: read as they are drawn from
        self.stage = "dit"  # the step of the job in flight: "dit", then "decode" if any
        self.dit_start = 0.0  # when its DiT step started (global time)
        self.clock = clock  # tick n's clock time (its controller time: minus the origin)
        self.played = 0  # ticks played (the playhead's position)
        self.planned_end = 0
        self.armed: float | None = None  # the armed refill's due time (controller time)
        self.next_job = 1
        self.job = 0  # the job in flight (0: none)
        self.branch = 0
        self.ctrl_start = 0.0  # the controller's start time of the job in flight
        self.jobs: list[JobRecord] = []
        self.jobs_done = 0
        self.starts: dict[int, float] = {}  # job id -> StartJob's time (RunRecords.busy)
        self.ran: dict[int, tuple[float, float]] = {}  # job id -> generator interval
        self.tally: BusyTally | None = None
        self.took = math.inf  # the draw of the step in flight
        self.t_enqueue = 0.0  # when that step was queued
        self.kind = "refill"  # the job's kind
        # a stream driven by its controller (it sees conditions): that, and the steps of
        # its job in flight still to run (the generator draws each as it is queued)
        self.driven: OnlineStream | None = None
        self.steps: Iterator[Step] = iter(())
        # a fleet node's stream whose first chunk is still on the pools (a cold start)
        self.cold = False
        # a fleet node's stream that left (:meth:`_Run.close`), and its records then
        self.closed = False
        self.left: tuple[RunRecords, list[ViewerRecord]] | None = None
        # its conditions, where the arrays tell them (latsim.sim.bulk_numpy's _Shows)
        self.shows: Shows | None = None

    @property
    def decode_rng(self) -> np.random.Generator:
        return self.stages[0]


def simulate_quiet_serving(configs: Sequence[ControllerConfig], cost: CostModel,
                           serving: ServingConfig, streams: Sequence[StreamInput],
                           windows: Sequence[RunWindow], records: str = "all",
                           in_arrays: Callable[[_Run], bool] | None = None
                           ) -> ServingRecords | None:
    """The records :func:`latsim.sim.serving.simulate_serving` gives for a run
    :func:`bulk_refusal` accepts, or None (its random streams restored) where the run is
    not quiet throughout: a tick that is not, or a stall (of a stream it plays as
    arithmetic), or a tick of a stream its controller drives which starts a job.
    ``in_arrays`` (the serving model passes :func:`latsim.sim.bulk_numpy.play_in_numpy`,
    which builds on this module) fills the run's books where it can tell the run
    exactly, else says False and this module's loop plays it."""

    def play() -> ServingRecords:
        run = _Run(configs, cost, serving, streams, windows, records)
        # the arrays replay conditions only where they move no job (an eager commit)
        if in_arrays is None or run.online_only or not in_arrays(run):
            run.play()
        return run.finish()

    return _restoring(_drawn(cost, serving, streams), play)


def simulate_node_in_bulk(configs: Sequence[ControllerConfig], cost: CostModel,
                          serving: ServingConfig, streams: Sequence[StreamInput],
                          windows: Sequence[RunWindow], records: str, node: NodeRun
                          ) -> tuple[ServingRecords, list[float], list[float]] | None:
    """A sharded fleet node's run (:func:`latsim.sim.fleet.simulate_node_plan`) in the
    bulk loop, every stream driven through its controller (each joins at its join time,
    with a cold start where the serving model has one, and leaves as :class:`NodeRun`
    says): its records, and each stream's start and first frame's display (global time;
    nan: its first chunk was not ready by the horizon, or none showed), or None (its
    random streams restored) where the loop gives it back."""

    def play() -> tuple[ServingRecords, list[float], list[float]]:
        run = _Run(configs, cost, serving, streams, windows, records, node)
        run.play()
        done = run.finish()  # (which plays the ticks before the end)
        shown = [None if stream.driven is None else stream.driven.first_display
                 for stream in run.streams]
        return done, [math.nan if stream.cold else stream.origin for stream in run.streams], [
            math.nan if first is None else stream.origin + first
            for stream, first in zip(run.streams, shown, strict=True)]

    return _restoring(_drawn(cost, serving, streams), play)


def draws(model: CostModel | None) -> bool:
    """Whether ``model`` may draw from the random stream it is given (a fixed cost, or
    none, draws nothing: its stream need not be kept or restored)."""
    return model is not None and type(model) is not FixedCost


def _drawn(cost: CostModel, serving: ServingConfig, streams: Sequence[StreamInput]
           ) -> list[np.random.Generator]:
    """The streams' random streams a run may draw from: DiT, decode and replan overhead
    (all three where the cost is a system model: its own chain draws what it likes)."""
    chain = hasattr(cost, "steps")
    dit, decode, replan = (chain or draws(model) for model in (
        cost, serving.decode, serving.replan_cost))
    drawn = []
    for s in streams:  # a stage stream read only where it may be drawn (SpawnedStreams)
        if dit:
            drawn.append(s.cost)
        if decode:
            drawn.append(s.stages[0])
        if replan:
            drawn.append(s.stages[3])
    return drawn


def _restoring(drawn: list[np.random.Generator], play: Callable[[], _Played]
               ) -> _Played | None:
    """What ``play`` gives, or None where it gives the run back, the random streams it
    may draw from (:func:`_drawn`) then as they were."""
    saved = [rng.bit_generator.state for rng in drawn]
    try:
        return play()
    except (_Giveback, Differs):
        for rng, state in zip(drawn, saved, strict=True):
            rng.bit_generator.state = state
        return None


class _Run:
    """One run in bulk: its streams' ticks and books, its pools, and the events left (the
    streams' starts and wake-ups, the steps' ends) in the clock's order."""

    def __init__(self, configs: Sequence[ControllerConfig], cost: CostModel,
                 serving: ServingConfig, streams: Sequence[StreamInput],
                 windows: Sequence[RunWindow], records: str, node: NodeRun | None = None
                 ) -> None:
        self.cost = cost
        self.serving = serving
        self.records = records
        window = max(windows, key=lambda w: w.limit)
        self.window = window
        self.inputs, self.configs, self.windows = streams, configs, windows
        origins = [s.join for s in streams]  # no cold start: each plays from its join
        # the window's end; the run's end (past it while a condition is still open there)
        self.window_end = self.end = max(origins) + window.duration
        # the events the run holds are those before this (past the end's instant where a
        # drain ends the run: its events ran before the tick that closed it)
        self.cut = self.end
        # streams with conditions: they are replayed (latsim.sim.bulk_replay), and the
        # schedule is computed up to the drain's limit
        self.conditions = any(t < window.duration for s in streams for t in s.trace.times)
        self.horizon = max(origins) + window.limit if self.conditions else self.end
        self.replays: dict[int, StreamReplay | OnlineStream] = {}  # by stream index
        # what each stream that sees a condition sends (those in its window), by index:
        # the loop drives those through their controllers (OnlineStream)
        self.sends = {i: sent for i, (s, w) in enumerate(zip(streams, windows, strict=True))
                      for sent in [[t for t in s.trace.times if t < w.duration]] if sent}
        # conditions that move jobs (a lazy commit): only the loop plays the run, and it
        # drives every stream through its controller (one that sees no condition too, so
        # that its stall, which the arithmetic cannot play, does not give the run back);
        # a fleet node's streams too: they leave, and the node's run ends at its horizon
        self.node = node
        self.online_only = (node is not None
                            or any(configs[i].policy.commit != "eager" for i in self.sends))
        if node is not None:
            self.window_end = self.end = self.cut = self.horizon = node.horizon
        if self.online_only:
            self.sends = {i: self.sends.get(i, []) for i in range(len(streams))}
        self.generator = StagedGenerator(cost, serving.replan_cost, serving.decode,
                                         serving.decode_pool)
        self.step_streams: dict[int, StepStreams] = {}  # a driven stream's, by index
        # streams below this index play their ticks at the end's instant, and the stream
        # of this index its tick there (the one that closed the run)
        self.last_tick = -1
        timing = configs[0].timing  # every stream's (bulk_refusal)
        self.K, self.delta = timing.K, timing.delta
        self.refill_lead = Controller(configs[0]).refill_lead
        covered = window.limit if self.conditions else window.duration
        # a row of tick times for each stream the loop plays as arithmetic: none where its
        # controllers drive them all (they keep their own clock)
        rowed = [] if self.online_only else list(range(len(origins)))
        self.clock = clock = _tick_columns(
            np.array([origins[i] for i in rowed]), self.delta,
            _tick_count(origins, covered, self.delta))
        rows = dict(zip(rowed, clock, strict=True))
        none = np.empty(0)
        # a row each, a view of the matrix's C doubles (bisect reads them as floats; a list
        # of float objects took four times the memory)
        self.streams = [_Stream(i, origins[i], s.cost, s.stages,
                                cast(Sequence[float], memoryview(rows.get(i, none))))
                        for i, s in enumerate(streams)]
        self.keep = records == "all"
        self.forget = records == "none"
        # the clock's order: (time, event id, what, whom); what: 0 a stream's start, 1 its
        # wake-up, 3 a condition's arrival (whom: its index), 2 a device's task ending
        # (whom: the batch id)
        self.heap: list[tuple[float, int, int, int]] = []
        self.ids = count()
        # the time of the event being played, and of the one played before it
        self.event_at = self.previous_at = -math.inf
        self.decode = serving.decode
        self.pools = {name: _Pool(name, size // (serving.degree if name == serving.dit_pool
                                                 else 1))
                      for name, size in serving.pools}
        self.dit_pool = self.pools[serving.dit_pool]
        self.decode_pool = self.pools[serving.decode_pool] if self.decode else None
        # batch id -> (stream, pool, device, start, enqueued): the steps running
        self.running: dict[int, tuple[_Stream, _Pool, int, float, float]] = {}
        self.batches = 0
        self.tasks: list[TaskRecord] = []
        # a fleet node tallies its tasks whatever it keeps (``ServingNode``'s node plan)
        self.task_tally = (None if self.keep and node is None
                           else TaskTally(serving.pools, serving.degree, self.end))
        self.playout = serving.playout()
        # the client's shift from earlier stalls: none here (no delivery draws, no stall)
        self.playout_shift = ClientPlayout(self.playout).shift

    # ------------------------------------------------------------ the loop

    def play(self) -> None:
        """Every event before the run's end, in the clock's order, and past the window's
        end while a condition is still open (:meth:`_drain`)."""
        heap, ids = self.heap, self.ids
        for stream in self.streams:
            if stream.origin > 0.0:
                heapq.heappush(heap, (stream.origin, next(ids), 0, stream.index))
            else:
                self.start(stream, 0.0)
        end = self.end
        while heap and heap[0][0] < end:
            self._step()
        if self.sends and self.node is None:  # a node's run ends at its horizon
            self._drain()

    def _step(self) -> None:
        """The next event."""
        at, _, kind, whom = heapq.heappop(self.heap)
        self.previous_at, self.event_at = self.event_at, at
        if kind == 2:
            self.done(whom, at)
            return
        stream = self.streams[whom]
        if stream.closed:
            return  # a stream that left: its timers and arrivals do nothing
        if kind == 1:
            if stream.driven is None:
                self.wake(stream, at)
            else:
                stream.driven.wake(at)
        elif kind == 3:
            stream.driven.arrive(at)  # type: ignore[union-attr]
        elif kind == 4:
            self.close(stream, at)
        else:
            self.start(stream, at)

    def _drain(self) -> None:
        """``run_drain``: past the window's end, the events in the clock's order while a
        stream has a condition open, up to the drain's limit. The run ends after what
        shows the last of them: a tick (the events of its instant ran before it, and the
        ticks of lower streams: :attr:`last_tick`), or an event (a job's end that ends a
        stall plays its slot then). One open at the limit gives the run back (the event
        path then ends it at its last quiet tick)."""
        driven = [self.replays[index] for index in sorted(self.replays)]
        for stream in driven:  # the ticks the clock ran before the window's end
            stream.play_to(self.window_end, False)  # type: ignore[union-attr]
        draining = [stream for stream in driven if stream.ctrl.open_conditions]
        closes: list[tuple[float, int]] = []
        heap, limit = self.heap, self.horizon
        while draining:
            at = heap[0][0] if heap else math.inf
            past = at > limit  # the ticks to the limit, then no more events
            still = []
            for stream in draining:
                closed = stream.close_by(limit if past else at, past)  # type: ignore[union-attr]
                if closed is None:
                    still.append(stream)
                else:
                    closes.append((closed, stream.index))
            if not still:
                self.end, self.last_tick = max(closes)
                return
            if past:
                raise _Giveback
            self._step()
            draining = [stream for stream in still if stream.ctrl.open_conditions]
            if not draining:  # the event showed the last one
                self.end = at
                return

    # ------------------------------------------------------------ the streams

    def start(self, stream: _Stream, now: float) -> None:
        """``start_playback``: the controller starts (the prebuffer cached, the first tick
        at ``now``), then its decide step starts the first refill or arms it. A stream that
        sees conditions is driven by its own controller (:class:`OnlineStream`)."""
        index = stream.index
        sent = self.sends.get(index)
        if sent is not None:
            inputs = self.inputs[index]
            if index not in self.step_streams:
                self.step_streams[index] = StepStreams(inputs.cost, inputs.stages)
                # a fleet node's cold start: its first chunk on the pools, then here
                if self.node is not None and self.serving.cold_start:
                    self.cold_start(stream, now)
                    return
            driven = stream.driven = OnlineStream(
                index, stream.origin, self.configs[index], self.windows[index],
                self.records, sent, self.playout, self)
            self.replays[index] = driven
            driven.start(now)
            if self.node is not None:  # it leaves its length after it starts
                heapq.heappush(self.heap, (now + self.windows[index].duration,
                                           next(self.ids), 4, index))
            return
        stream.jobs.append(JobRecord(0, "prebuffer", 0, self.K, 0, 0, 0.0, 0.0))
        stream.planned_end = self.K
        if not self.keep:
            stream.tally = BusyTally()
        due = 0.0 + (self.K - 0) * self.delta - self.refill_lead  # _refill_due_from(0, 0.0)
        if due <= 0.0 + EPS:
            self.request(stream, now)
        else:
            self.arm(stream, due, now)

    def cold_start(self, stream: _Stream, now: float) -> None:
        """``ServingNode.begin`` with a cold start: the stream's first chunk (job 0, a
        prebuffer) goes to the pools, and its playback starts when that is ready
        (:meth:`done`)."""
        stream.cold = True
        stream.job = 0
        stream.kind = "prebuffer"
        stream.stage = "dit"
        stream.t_enqueue = now
        stream.steps = steps = self.generator.steps(self.K, "prebuffer",
                                                    self.step_streams[stream.index])
        stream.took = next(steps).duration
        self.dit_pool.waiting.append(stream)
        self.dispatch(self.dit_pool, now)

    def close(self, stream: _Stream, now: float) -> None:
        """``ServingNode.close``: a fleet node's stream leaves at ``now``. Its ticks before
        then play, its steps still waiting are dropped (one running finishes, and nothing
        follows it), its timers and arrivals do nothing, and its records end now."""
        stream.closed = True
        for pool in self.pools.values():
            if stream in pool.waiting:
                pool.waiting = deque(s for s in pool.waiting if s is not stream)
        driven = cast(OnlineStream, stream.driven)
        driven.play_to(now, False)
        stream.left = driven.records(now)

    def wake_at(self, index: int, at: float) -> None:
        heapq.heappush(self.heap, (at, next(self.ids), 1, index))

    def take_id(self) -> int:
        return next(self.ids)

    def arrive_at(self, index: int, at: float, event_id: int) -> None:
        heapq.heappush(self.heap, (at, event_id, 3, index))

    def submit(self, index: int, job: int, kind: str, now: float) -> None:
        """A driven stream's job: its first step (DiT) queued on the pool, drawn as it is
        queued, as the generator draws it (a replan's overhead too)."""
        stream = self.streams[index]
        stream.job = job
        stream.kind = kind
        stream.stage = "dit"
        stream.t_enqueue = now
        stream.steps = steps = self.generator.steps(self.K, kind,
                                                    self.step_streams[index])
        stream.took = next(steps).duration
        self.dit_pool.waiting.append(stream)
        self.dispatch(self.dit_pool, now)

    def arm(self, stream: _Stream, due: float, now: float) -> None:
        stream.armed = due
        at = now + max(0.0, due + stream.origin - now)  # port.schedule, call_later
        heapq.heappush(self.heap, (at, next(self.ids), 1, stream.index))

    def wake(self, stream: _Stream, now: float) -> None:
        """The armed refill's wake-up: the ticks before it play (in Consume, each checked
        as quiet), then :meth:`Controller.quiet_wake` starts the refill."""
        t_now = now - stream.origin
        self.catch_up(stream, now, consume=True)
        armed = stream.armed
        if (stream.played > stream.planned_end  # a tick past the cache: a stall
                or armed is None or armed > t_now + EPS or self.due(stream) > t_now + EPS):
            raise _Giveback  # not the fast path
        stream.armed = None
        self.request(stream, now)

    def due(self, stream: _Stream) -> float:
        """``_refill_due_at``: from the playhead's next due time (no stall here)."""
        played = stream.played
        # the next due time a play left: the last tick's t plus δ (t = clock - origin)
        next_due = (stream.clock[played - 1] - stream.origin) + self.delta if played else 0.0
        return next_due + (stream.planned_end - played) * self.delta - self.refill_lead

    def request(self, stream: _Stream, now: float) -> None:
        """``_new_job`` and the job's DiT step queued on the pool (drawn as it is queued)."""
        job = stream.next_job
        stream.next_job += 1
        stream.job = job
        stream.branch = stream.planned_end
        stream.planned_end += self.K
        stream.ctrl_start = now - stream.origin
        stream.starts[job] = now - stream.origin
        stream.stage = "dit"
        stream.t_enqueue = now
        stream.took = self.cost.sample(self.K, stream.rng, "refill")  # drawn as queued
        self.dit_pool.waiting.append(stream)
        self.dispatch(self.dit_pool, now)

    def dispatch(self, pool: _Pool, now: float) -> None:
        """``_Pool.dispatch``: the lowest free device takes the first step waiting."""
        free, waiting = pool.free, pool.waiting
        while free and waiting:
            stream = waiting.popleft()
            device = heapq.heappop(free)
            self.batches += 1
            batch, took = self.batches, stream.took
            self.running[batch] = (stream, pool, device, now, stream.t_enqueue)
            if stream.stage == "dit":  # the job's first step: the job starts
                stream.dit_start = now
                driven = stream.driven
                if driven is not None or stream.cold:
                    if driven is not None:
                        driven.job_started(stream.job, now, took, now > stream.t_enqueue)
                    heapq.heappush(self.heap, (now + took, next(self.ids), 2, batch))
                    continue
                stream.ran[stream.job] = (now - stream.origin, now - stream.origin + took)
                if now > stream.t_enqueue:  # JobStarted, through quiet_job_started
                    stream.ctrl_start = now - stream.origin
            elif took == 0:  # a later step of no time ends without an event
                self.done(batch, now)
                continue
            heapq.heappush(self.heap, (now + took, next(self.ids), 2, batch))

    def done(self, batch: int, now: float) -> None:
        """A step ends: its device serves the next step waiting, then the job's next step
        is queued, or the job is done (``quiet_job_done``)."""
        stream, pool, device, start, enqueued = self.running.pop(batch)
        self.record(stream, pool, device, batch, enqueued, start, now)
        heapq.heappush(pool.free, device)
        self.dispatch(pool, now)
        if stream.closed:
            return  # it left while this step ran: nothing follows it
        decode = self.decode_pool
        driven = stream.driven
        if driven is not None or stream.cold:  # its job's next step (drawn as it is
            step = next(stream.steps, None)  # queued), or its end
            if step is not None:
                stream.stage = step.stage
                stream.t_enqueue = now
                stream.took = step.duration
                decode.waiting.append(stream)  # type: ignore[union-attr]
                self.dispatch(decode, now)  # type: ignore[arg-type]
                return
            job, stream.job = stream.job, 0
            if stream.cold:  # its first chunk is ready: its playback starts
                stream.cold = False
                stream.origin = now
                self.start(stream, now)
                return
            driven.job_done(job, stream.dit_start, now)  # type: ignore[union-attr]
            return
        if stream.stage == "dit" and decode is not None:
            stream.stage = "decode"
            stream.t_enqueue = now
            stream.took = self.decode.sample(  # type: ignore[union-attr]
                self.K, stream.decode_rng, "refill")
            decode.waiting.append(stream)
            self.dispatch(decode, now)
            return
        origin = stream.origin
        job = stream.job
        stream.ran[job] = (stream.dit_start - origin, now - origin)
        self.catch_up(stream, now, consume=False)
        if stream.played > stream.branch:
            raise _Giveback  # a tick before the chunk was ready: a stall
        # quiet_job_done: _finish_job's books, then the next refill's due time
        t_now = now - origin
        stream.job = 0
        stream.jobs_done += 1
        if not self.forget:  # at "none" a run keeps only the prebuffer's record
            stream.jobs.append(JobRecord(job, "refill", stream.branch, self.K, 0,
                                         stream.branch, stream.ctrl_start, t_now))
        due = self.due(stream)
        if due <= t_now + EPS:
            self.request(stream, now)
        else:
            self.arm(stream, due, now)
        if stream.tally is not None:
            stream.tally.add(*stream.ran.pop(job), self.window.duration)
            del stream.starts[job]

    def catch_up(self, stream: _Stream, now: float, consume: bool, through: bool = False
                 ) -> None:
        """Play the ticks before ``now`` (at it too, ``through``): cached, and in Consume
        each one quiet by ``_play_quiet``'s test (its decide step would neither start nor
        re-arm)."""
        upto = (bisect_right if through else bisect_left)(stream.clock, now, stream.played)
        if consume:
            armed, planned_end, delta = stream.armed, stream.planned_end, self.delta
            lead, clock, origin = self.refill_lead, stream.clock, stream.origin
            for n in range(stream.played, upto):
                t = clock[n] - origin
                due = (t + delta) + (planned_end - (n + 1)) * delta - lead
                if due <= t + EPS or armed is None or abs(armed - due) > EPS:
                    raise _Giveback
        stream.played = upto

    def record(self, stream: _Stream, pool: _Pool, device: int, batch: int,
               enqueued: float, start: float, end: float) -> None:
        if self.task_tally is None:
            self.tasks.append(TaskRecord(stream.index, stream.job, stream.stage, stream.kind,
                                         pool.name, device, batch, enqueued, start, end))
        else:
            self.task_tally.add_values(stream.stage, stream.kind, pool.name, device, batch,
                                       enqueued, start, end)

    # ------------------------------------------------------------ the end

    def finish(self) -> ServingRecords:
        end = self.end
        for batch in list(self.running):  # engine.close: running tasks end with the run
            stream, pool, device, start, enqueued = self.running.pop(batch)
            self.record(stream, pool, device, batch, enqueued, start, end)
        runs, starts, viewer = [], [], []
        for stream in self.streams:
            replay = self.replays.get(stream.index)
            if stream.cold:  # its first chunk was not ready by the end: never started
                replay = OnlineStream(stream.index, stream.origin, self.configs[stream.index],
                                      self.windows[stream.index], self.records, [],
                                      self.playout, self)
            if stream.left is not None:  # it left: its records then
                done, shown = stream.left
            elif replay is not None:  # its controller's records
                if stream.driven is not None:
                    stream.driven.play_to(end, stream.index < self.last_tick)
                done, shown = replay.records(end)
            if replay is not None:
                runs.append(done)
                viewer.extend(shown)
                first_display = replay.first_display
                join = self.inputs[stream.index].join
                starts.append(StreamStart(
                    stream.index, join, stream.origin,
                    math.nan if first_display is None
                    else stream.origin - join + first_display))
                replay.release()
                continue
            self.catch_up(stream, end, consume=stream.job == 0,
                          through=stream.index <= self.last_tick)
            cache_end = stream.branch if stream.job else stream.planned_end
            if stream.played > cache_end:
                raise _Giveback  # a stall before the end
            runs.append(self.run_records(stream, cache_end, viewer))
            # the event path's sums: its first tick's time less the origin (the tick is
            # at the origin) plus the playout, then the origin less the join
            first = (stream.origin - stream.origin + self.playout + self.playout_shift
                     if stream.played else math.nan)
            starts.append(StreamStart(stream.index, stream.origin, stream.origin,
                                      stream.origin - stream.origin + first))
        serving = self.serving
        return ServingRecords(
            duration=self.window.duration if self.node is None else self.node.horizon,
            window_end=self.window_end, end_time=end,
            streams=tuple(runs), starts=tuple(starts), tasks=tuple(self.tasks),
            viewer=tuple(sorted(viewer, key=lambda v: (v.stream, v.version))),
            client_stalls=(), pools=serving.pools, playout_delay=self.playout,
            dit_degree=serving.degree, records=self.records, task_tally=self.task_tally)

    def run_records(self, stream: _Stream, cache_end: int, viewer: list[ViewerRecord]
                    ) -> RunRecords:
        """A stream's records at the run's end, from its books (and what its viewer saw
        of its conditions, into ``viewer``)."""
        window, K = self.window, self.K
        played, end_time = stream.played, self.end - stream.origin
        origin = stream.origin
        shows = stream.shows
        conditions: list[ConditionRecord] = []
        if shows is not None:
            conditions, seen = shows.records(played, self.playout, self.playout_shift)
            viewer.extend(seen)
        # slot p: its job's version, job p // K (0: the prebuffer), at its tick's
        # controller time
        t_starts = np.asarray(stream.clock)[:played] - origin
        if self.keep:
            slots = SlotLog()
            slots.extend(range(played),
                         [0] * played if shows is None else shows.slot_versions(played),
                         (np.arange(played) // K).tolist(), t_starts.tolist())
        else:  # the counts a tally folds of those columns
            slots = SlotTally(window.duration)
            before = int(np.searchsorted(t_starts, window.duration, side="left"))
            slots.add_counts(played, before, before - min(before, K))
        busy, tally = busy_at_end(stream.starts, stream.ran, stream.tally, end_time,
                                  window.duration)
        return RunRecords(
            duration=window.duration, end_time=end_time, conditions=tuple(conditions),
            jobs=tuple(stream.jobs), slots=slots, stalls=(), discards=(), busy=busy,
            jobs_started=stream.next_job - 1, jobs_done=stream.jobs_done,
            cached_at_end=cache_end - played, status=COMPLETE, records=self.records,
            busy_tally=tally)


def _tick_columns(origins: np.ndarray, delta: float, ticks: int) -> np.ndarray:
    """Each stream's quiet ticks from its start, as clock times, one row per stream.
    Column by column, the float sums of
    :meth:`Controller.play_quiet_shifted` (``t = clock - origin``, ``after = t + δ``, the
    clock moved by ``after + origin - clock`` where that is positive), which numpy's float64
    operations do bit for bit as Python's do."""
    if len(origins) <= _ROWS_IN_PYTHON:  # a few rows: a numpy call a column costs more
        return np.array([_tick_row(origin, delta, ticks) for origin in origins.tolist()],
                        dtype=float).reshape(len(origins), ticks)
    clock = np.empty((len(origins), ticks))
    at = origins + np.maximum(0.0, (0.0 + origins) - origins)  # port.schedule's sum
    for n in range(ticks):
        clock[:, n] = at
        ahead = ((at - origins) + delta + origins) - at
        at = np.where(ahead > 0.0, at + ahead, at)
    return clock


#: Up to this many streams, :func:`_tick_columns` computes each row in Python (about
#: 0.15 µs a tick) rather than each column in numpy (about 6 µs a column, whatever the
#: streams).
_ROWS_IN_PYTHON = 32


def _tick_row(origin: float, delta: float, ticks: int) -> list[float]:
    """One stream's row of :func:`_tick_columns`, with the same float sums."""
    row = []
    at = origin + max(0.0, (0.0 + origin) - origin)
    for _ in range(ticks):
        row.append(at)
        ahead = ((at - origin) + delta + origin) - at
        if ahead > 0.0:
            at = at + ahead
    return row
