"""The SimPy driver of the serving model (DESIGN §6): many streams on shared device pools.

Each stream is a :class:`~latsim.run.stream.StreamRun` (its own controller, trace, playback
clock and start) whose :class:`~latsim.run.stream.ClockPort` is a :class:`_StreamPort`: its
commands run on one SimPy clock shared by all streams, its jobs go through the stages of
:class:`~latsim.model.serving.ServingConfig` on :class:`_Pool` devices, and its played slots
go through the client's playout. The controller is the same one the single-worker driver
uses; a job that waited for a device tells it so with :class:`JobStarted`.

Times: every stream's records are in its own time (0 = its playback start), so the metrics
of :mod:`latsim.analysis.metrics` apply per stream unchanged; device tasks are in global time.

Quiet ticks (those that only play their slot) are played in bulk when something next
touches their stream, not as events on the clock (docs/design.md §6, "Quiet ticks in
bulk"); ``ticks_in_bulk=False`` queues every tick, the reference path, with the same
records.

With one stream on one dedicated device and no other stage this reproduces
:func:`latsim.sim.simpy_driver.simulate_trace` exactly: the same random draws (stream 0 uses
the single-worker streams), the same SimPy events in the same order. A stage whose draw is
exactly 0 completes without a SimPy event for that reason.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import simpy

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    JobStarted,
    PlaySlot,
    SlotDue,
    StartJob,
    WakeUp,
)
from latsim.controller.playout import ClientPlayout
from latsim.controller.records import RECORD_LEVELS
from latsim.model.costs import CostModel
from latsim.model.generators import StagedGenerator, Step, StepStreams
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.plugins import load_schedule, take_next
from latsim.run.serving import (
    ClientStallRecord,
    ServingRecords,
    StreamStart,
    TaskRecord,
    TaskTally,
    ViewerRecord,
    censored_records,
    shown_records,
)
from latsim.run.stream import RunRecords, RunWindow, StreamRun
from latsim.sim import bulk_numpy
from latsim.sim.bulk import bulk_refusal, simulate_quiet_serving
from latsim.sim.clock import NORMAL, Call, Clock

#: Whether streams play their quiet ticks in bulk (the default) or each as an event on the
#: clock (the reference the tests compare with): the records are the same, byte for byte.
TICKS_IN_BULK = True
#: Whether a serving run that is quiet throughout (no condition, nothing stalls: see
#: :mod:`latsim.sim.bulk`) is played in bulk, without the clock (the default), or on it:
#: the records are the same, byte for byte.
QUIET_RUNS_IN_BULK = True


@dataclass(frozen=True)
class StreamInput:
    """What one stream brings: its arrivals (client send times, stream time), where it
    joins (global time) and its random streams: ``cost`` for the DiT draws, ``stages`` for
    decode, deliver, uplink and replan overhead (in that order; a
    :class:`~latsim.model.generators.SpawnedStreams` seeds each as it is first read)."""

    trace: Trace
    join: float
    cost: np.random.Generator
    stages: Sequence[np.random.Generator]


class _Task:
    """One stage of one job waiting for, or running on, a device; a scheduling policy sees
    it as a :class:`latsim.plugins.WaitingTask`."""

    __slots__ = ("port", "job_id", "kind", "stage", "latents", "duration", "t_enqueue",
                 "seq", "then", "first", "last", "overtaken_by")

    def __init__(self, port: _StreamPort, job_id: int, kind: str, stage: str, latents: int,
                 duration: float, t_enqueue: float, seq: int,
                 then: Callable[[float, float], None], first: bool = False,
                 last: bool = False) -> None:
        self.first = first  # the job's first step: its start is the job's start
        self.last = last  # known to be its last: its end is the job's end
        self.port = port
        self.job_id = job_id
        self.kind = kind
        self.stage = stage
        self.latents = latents
        self.duration = duration
        self.t_enqueue = t_enqueue
        self.seq = seq
        self.then = then  # called with (t_start, t_end) once the task is done
        self.overtaken_by: set[int] | None = None  # take_next's share bound

    @property
    def stream(self) -> int:
        return self.port.index

    @property
    def slack(self) -> float:
        return self.port.slack(self.port.env.now)


class _PipelinePool:
    """A lockstep pipeline of ``depth`` ranks, one device each (Wave Forcing's 1F1C): a
    task enters at a round boundary, at most one per round, and leaves ``depth`` rounds
    later, having spent one round on each rank. Rounds run while any task is in flight; an
    empty pipeline starts a round as soon as a task comes. With a ``downstream`` pool (the
    decode), a finished task that waits there still holds a rank (its last rank cannot
    hand it over): the pipeline holds at most ``depth`` tasks in flight or waiting
    downstream, so a slow decode throttles it (back-pressure)."""

    def __init__(self, engine: _Engine, name: str, depth: int, round_time: float,
                 downstream: str | None = None) -> None:
        self.engine = engine
        self.name = name
        self.depth = depth
        self.round = round_time
        self.downstream = downstream
        self.waiting: deque[_Task] = deque()
        self.in_flight: dict[int, tuple[_Task, float]] = {}  # batch id -> (task, entry)
        self._anchor: float | None = None  # a round boundary, while any task is in flight
        self._last_entry = -math.inf
        self._entry_pending = False

    def submit(self, task: _Task) -> None:
        self.waiting.append(task)
        self._plan()

    def _plan(self) -> None:
        held = len(self.in_flight)
        if self.downstream is not None:  # finished chunks the decode has not taken yet
            held += len(self.engine.pools[self.downstream].waiting)
        if self._entry_pending or not self.waiting or held >= self.depth:
            return  # planned again when a task leaves, or the downstream pool takes one
        env = self.engine.env
        at = env.now
        if self._anchor is not None:
            rounds = math.ceil((env.now - self._anchor) / self.round - 1e-9)
            at = max(self._anchor + rounds * self.round, self._last_entry + self.round)
        self._entry_pending = True
        env.call_later(max(0.0, at - env.now), (self._enter,))

    def _enter(self, _: object) -> None:
        self._entry_pending = False
        engine, now = self.engine, self.engine.env.now
        if self._anchor is None:
            self._anchor = now
        task = take_next(self.waiting, engine.schedule, now)
        self._last_entry = now
        batch_id = engine.new_batch()
        self.in_flight[batch_id] = (task, now)
        if task.first and task.job_id:
            task.port.job_started(task.job_id, now, task.duration, now > task.t_enqueue)

        def leave(_: Call, batch: int = batch_id) -> None:  # typed: the compiled build
            self._leave(batch)

        engine.env.call_later(task.duration, (leave,))
        self._plan()

    def _leave(self, batch_id: int) -> None:
        task, entry = self.in_flight[batch_id]
        self.record(batch_id, self.engine.env.now)
        if not self.in_flight:
            self._anchor = None
        self._plan()
        task.then(entry, self.engine.env.now)

    def record(self, batch_id: int, end: float) -> None:
        """One record per rank: the round the task spent on it (up to ``end``)."""
        task, entry = self.in_flight.pop(batch_id)
        for rank in range(self.depth):
            start = entry + rank * self.round
            if start < end:
                self.engine.add_task(task, self.name, rank, batch_id, start,
                                     min(end, start + self.round))


class _Pool:
    """Identical devices, each serving one task (or one batch) at a time, and the queue of
    tasks waiting for them, served in the order of the scheduling policy."""

    def __init__(self, engine: _Engine, name: str, size: int) -> None:
        self.engine = engine
        self.name = name
        self.free = list(range(size))  # a heap: the lowest free device serves next
        self.waiting: deque[_Task] = deque()
        self._dispatch_pending = False

    def submit(self, task: _Task) -> None:
        self.waiting.append(task)
        if self.engine.config.batch is None:
            self.dispatch()
        elif not self._dispatch_pending:
            # with batching, tasks queued at the same instant form one batch: dispatch once
            # the instant's other events have run (a zero-delay event)
            self._dispatch_pending = True
            self.engine.env.call_later(0.0, (self._deferred_dispatch,))

    def _deferred_dispatch(self, _: object) -> None:
        self._dispatch_pending = False
        self.dispatch()

    def _next(self, now: float) -> _Task:
        return take_next(self.waiting, self.engine.schedule, now)

    def dispatch(self) -> None:
        env = self.engine.env
        if not self.waiting:
            return
        while self.free and self.waiting:
            first = self._next(env.now)
            batch = [first]
            batching = self.engine.config.batch
            if batching is not None and first.stage == "dit":
                while self.waiting and len(batch) < batching.max_size:
                    batch.append(self._next(env.now))
            device = heapq.heappop(self.free)
            self.engine.start(self, device, batch)
        if not self.waiting:
            for upstream in self.engine.upstream.get(self.name, ()):
                upstream._plan()


class _Engine:
    """The pools and the bookkeeping of tasks shared by all streams."""

    def __init__(self, env: Clock, config: ServingConfig,
                 batch_rng: np.random.Generator, generator: StagedGenerator) -> None:
        self.env = env
        self.config = config
        self.generator = generator
        self.schedule = load_schedule(config.schedule)
        # a DiT task occupies a fixed group of ``degree`` devices: the pool has size/degree
        self.pools: dict[str, _Pool | _PipelinePool] = {
            name: _Pool(self, name, size // (config.degree if name == config.dit_pool else 1))
            for name, size in config.pools}
        self.upstream: dict[str, list[_PipelinePool]] = {}
        for name, (depth, round_time, downstream) in generator.pipelines().items():
            self.pools[name] = pipeline = _PipelinePool(self, name, depth, round_time,
                                                        downstream)
            if downstream is not None:
                self.upstream.setdefault(downstream, []).append(pipeline)
        self.tasks: list[TaskRecord] = []  # all of them, or (tallied) those made before
        self.tally: TaskTally | None = None  # the window's end was known
        self.running: dict[int, tuple[_Pool, int, list[_Task], float]] = {}  # by batch id
        self._seq = 0
        self._batches = 0
        self._batch_rng = batch_rng
        # the last tick of this engine's streams that ran from the clock (in bulk): its
        # time and its stream's index (ticks of one instant run by stream index)
        self.tick_at = -math.inf
        self.tick_index = -1

    def submit(self, stream: _StreamPort, job_id: int, kind: str, step: Step, first: bool,
               then: Callable[[float, float], None], since: float | None = None) -> None:
        self._seq += 1
        queued = self.env.now if since is None else since
        self.pools[step.pool].submit(_Task(stream, job_id, kind, step.stage, step.latents,
                                           step.duration, queued, self._seq, then, first,
                                           step.stage == stream.last_stage))

    def add_task(self, task: _Task, pool: str, device: int, batch_id: int, start: float,
                 end: float) -> None:
        """Record ``task`` as run on ``device`` of ``pool`` from ``start`` to ``end``: kept
        as a :class:`TaskRecord`, or added to the tally without making one."""
        if self.tally is None:
            self.tasks.append(TaskRecord(task.stream, task.job_id, task.stage, task.kind,
                                         pool, device, batch_id, task.t_enqueue, start, end))
        else:
            self.tally.add_values(task.stage, task.kind, pool, device, batch_id,
                                  task.t_enqueue, start, end)

    def tally_tasks(self, window_end: float) -> None:
        """From now on add the task records up (:class:`TaskTally`) instead of keeping
        them, the ones kept so far first."""
        self.tally = TaskTally(self.config.pools, self.config.degree, window_end)
        for task in self.tasks:
            self.tally.add(task)
        self.tasks.clear()

    def new_batch(self) -> int:
        self._batches += 1
        return self._batches

    def close(self, end: float) -> None:
        """Record every task still running at ``end`` as run until then."""
        for batch_id in list(self.running):
            self.record(batch_id, end)
        for pool in self.pools.values():
            if isinstance(pool, _PipelinePool):
                for batch_id in list(pool.in_flight):
                    pool.record(batch_id, end)

    def record(self, batch_id: int, end: float) -> None:
        """Record a batch's tasks as run until ``end`` (the end of the run for a batch still
        running then, as :class:`~latsim.run.stream.BusyInterval` does)."""
        pool, device, batch, start = self.running.pop(batch_id)
        for task in batch:
            self.add_task(task, pool.name, device, batch_id, start, end)

    def start(self, pool: _Pool, device: int, batch: list[_Task]) -> None:
        env = self.env
        now = env.now
        batch_id = self.new_batch()
        if len(batch) == 1:
            took = batch[0].duration
        else:
            took = self.config.batch.cost.sample(  # type: ignore[union-attr]
                sum(t.latents for t in batch), self._batch_rng, "refill")
        for task in batch:
            if task.first and task.job_id:
                task.port.job_started(task.job_id, now, took, now > task.t_enqueue)
            if task.last:
                task.port.job_end_at = now + took
            else:
                task.port.step_end_at = now + took

        self.running[batch_id] = (pool, device, batch, now)

        def done(_: object = None) -> None:
            self.record(batch_id, env.now)
            heapq.heappush(pool.free, device)
            pool.dispatch()  # tasks that waited go before what these tasks lead to
            for task in batch:
                task.then(now, env.now)

        if took == 0 and not batch[0].first:
            done()  # no SimPy event: see the module docstring
        else:
            env.call_later(took, (done,))


class _StreamPort:
    """One stream's clock port: stream time = global time - ``origin``."""

    def __init__(self, engine: _Engine, index: int, config: ControllerConfig,
                 window: RunWindow, inputs: StreamInput, playout_delay: float,
                 records: str = "all", in_bulk: bool = True) -> None:
        self.engine = engine
        self.env = engine.env
        self.index = index
        self.serving = engine.config
        self.K = config.timing.K
        self.inputs = inputs
        self.deliver_rng, self.uplink_rng = inputs.stages[1], inputs.stages[2]
        self.streams = StepStreams(inputs.cost, inputs.stages)
        self.generator = engine.generator
        self.origin = inputs.join
        self.playout = ClientPlayout(playout_delay)
        self.run = StreamRun(config, window, self, records=records, fast_paths=in_bulk)
        self._ctrl = self.run.controller  # read every tick
        self.sent: list[float] = []  # client send time of each version, in version order
        self._conditions_seen = 0  # the controller's condition records already shown
        self.viewer: list[ViewerRecord] = []
        self.client_stalls: list[ClientStallRecord] = []
        self.first_display: float | None = None
        self.closed = False  # the stream left (a fleet's session): its events do nothing
        self.hold_until = -math.inf  # no job starts before this (a fleet's migration)
        self._tick_callbacks = (self._on_tick,)
        # quiet ticks played in bulk (module docstring); where the network draws a delivery
        # time for every slot, tick by tick
        self.in_bulk = in_bulk and self.serving.deliver is None
        self._tick_pos = -1  # in bulk: the pending tick's position (-1: none) ...
        self._tick_at = 0.0  # ... and its time on the clock
        self._queued: tuple[int, float] = (-1, math.nan)  # the tick queued on the clock
        self._queued_id = 0  # ... its number: one queued before it is stale
        self._queued_callbacks = (self._on_queued_tick,)
        self._timers: list[float] = []  # in bulk: when its timers on the clock run (a heap)
        self._arrival_at = math.inf  # and its next arrival
        # and, where it runs one job at a time whose last step is known, that job's end
        # once a device took its last step: JobDone comes at exactly that time (the end
        # of the device's task), a touch
        self.last_stage = _last_stage(engine.generator) if config.in_flight == 1 else None
        self.job_end_at = -math.inf
        # ... and before that, the end of the job's step running on a device (its DiT step,
        # with a decode to follow): the step's end then looks again (:meth:`step_ended`)
        self.step_end_at = -math.inf
        self._step_touch = False  # the queued tick was looked for up to that step's end
        self._timer_callbacks = (self._on_timer,)
        self._arrival_callbacks = (self._on_arrival,)
        self._arrivals: list[tuple[float, int, int, float]] = []  # latest first (start_playback)

    # ---------------------------------------------------------------- clock

    @property
    def now(self) -> float:
        return self.env.now - self.origin

    def slack(self, global_now: float) -> float:
        if self.in_bulk:
            self.catch_up(global_now)
        now = global_now - self.origin
        return self.run.controller.playable_until(now) - now

    def deliver(self, event: object) -> None:
        if not self.closed:
            if self.in_bulk:
                self.catch_up(self.env.now)
            self.run.deliver(event, self.env.now - self.origin)  # type: ignore[arg-type]
            if self.in_bulk:
                self._queue_tick()

    def schedule(self, at: float, event: SlotDue | WakeUp) -> None:
        now = self.env.now
        delay = max(0.0, at + self.origin - now)
        if type(event) is not SlotDue:
            self.env.call_later(delay, self._timer_callbacks, event)
            if self.in_bulk:
                heapq.heappush(self._timers, now + delay)
        elif self.in_bulk:
            self._tick_pos, self._tick_at = event.position, now + delay
        else:
            self.env.call_tick_later(delay, self._tick_callbacks, event.position, self.index)

    # ------------------------------------------------- quiet ticks in bulk

    def catch_up(self, now: float, through: bool = False) -> None:
        """Play the quiet ticks that run before an event at ``now`` (global time) touches
        the stream: those before ``now``, and those at ``now`` where a tick of a later
        stream of this node runs now (ticks of one instant run by stream index, after
        every other event of it), or (``through``) where this stream's own place among
        the ticks of ``now`` has come."""
        at = self._tick_at
        if self._tick_pos < 0 or at > now:
            return
        engine = self.engine
        horizon = (math.nextafter(now, math.inf)
                   if through or (engine.tick_at == now and self.index < engine.tick_index)
                   else now)
        if at >= horizon:
            return
        played, next_at = self._ctrl.play_quiet_shifted(at, self.origin, horizon)
        if played:
            if self.first_display is None:  # _show's, for the first slot (no network)
                playout = self.playout
                self.first_display = at - self.origin + playout.delay + playout.shift
            self._tick_pos += played
            self._tick_at = next_at
        if next_at < horizon and self._tick_pos != self._queued[0]:
            raise AssertionError("a tick played in bulk was not quiet")  # see _queue_tick

    def _queue_tick(self) -> None:
        """Queue on the clock the first tick from the pending one on that is not quiet, or
        that shows a condition (its place in the order is the tick's own): the ticks
        before it are played when something next touches the stream (:meth:`catch_up`)
        or when it runs. None is queued where the ticks are quiet up to the stream's next
        timer or arrival, which touches it, or its job's end, or the end of the job's step
        running now (which looks again, :meth:`step_ended`). One queued earlier for another
        tick goes stale."""
        if self._tick_pos < 0 or self.closed:
            return
        ctrl = self._ctrl
        touch = min(self._timers[0], self._arrival_at) if self._timers else self._arrival_at
        now = self.env.now
        self._step_touch = False
        if now < self.job_end_at < touch:
            touch = self.job_end_at
        elif now < self.step_end_at < touch and self.last_stage is not None:
            touch = self.step_end_at
            self._step_touch = True
        played, at = (ctrl.play_quiet_shifted(self._tick_at, self.origin, touch, dry=True)
                      if self._tick_pos == ctrl.next_position else (0, self._tick_at))
        if at >= touch:
            if self._queued[0] >= 0:
                self._queued = (-1, math.nan)
                self._queued_id += 1
            return
        tick = (self._tick_pos + played, at)
        if tick != self._queued:
            self._queued = tick
            self._queued_id += 1
            self.env.call_tick_at(at, self._queued_callbacks, self._queued_id, self.index)

    def step_ended(self) -> None:
        """A step of the stream's job ended and the next was submitted: where the queued
        tick was looked for only up to that end, look again (the next step may have
        started, so the job's end is known; else up to the next touch)."""
        if self._step_touch and not self.closed:
            self._queue_tick()

    def last_quiet_tick(self, limit: float) -> float:
        """The clock time of the last quiet tick this stream holds unplayed at or before
        ``limit`` (-inf if none), when nothing else touches it before ``limit``."""
        ctrl = self._ctrl
        if self._tick_pos < 0 or self.closed or self._tick_pos != ctrl.next_position:
            return -math.inf
        played, following = ctrl.play_quiet_shifted(
            self._tick_at, self.origin, math.nextafter(limit, math.inf), dry=True)
        if played <= 1:
            return self._tick_at if played else -math.inf
        # The ticks are a slot apart: counting to halfway between the last two stops
        # after the last but one, at the last one's time (the same float sums)
        delta = ctrl.config.timing.delta
        _, last = ctrl.play_quiet_shifted(self._tick_at, self.origin, following - 1.5 * delta,
                                          dry=True)
        return last

    def _on_queued_tick(self, call: Call) -> None:
        engine, now = self.engine, self.env.now
        engine.tick_at, engine.tick_index = now, self.index
        if self.closed:
            return
        if call.value != self._queued_id:  # stale: the ticks before it are quiet now,
            # and its place in the order is this stream's among the ticks of now: where
            # each tick an event plays a quiet tick of now, the stream's pending one once
            # it has caught up, or already
            self.catch_up(now, through=True)
            return
        self.catch_up(now)
        position = self._tick_pos
        if (position, self._tick_at) != self._queued:
            raise AssertionError("the queued tick is not the pending one")
        self._queued = (-1, math.nan)
        self._tick_pos = -1
        ctrl, origin = self._ctrl, self.origin
        t = now - origin
        if ctrl.play_tick(position, t):
            self._show(position, t)
            self._tick_pos = position + 1
            self._tick_at = now + max(0.0, ctrl.next_due + origin - now)
        else:
            self.run.deliver(SlotDue(position), t)
        self._queue_tick()

    def _on_timer(self, timer: Call) -> None:
        if self.in_bulk:
            heapq.heappop(self._timers)
        self.deliver(timer.value)

    def _on_tick(self, timer: Call) -> None:
        """A tick (its value the slot's position): the controller's fast path when it only
        plays its slot (the same commands, carried out here), else the tick as an event."""
        if self.closed:
            return
        position, ctrl, env, origin = cast(int, timer.value), self._ctrl, self.env, self.origin
        at = env.now
        now = at - origin
        if ctrl.play_tick(position, now):
            self._show(position, now)
            # schedule()'s timer: the next tick
            env.call_tick_later(max(0.0, ctrl.next_due + origin - at), self._tick_callbacks,
                                position + 1, self.index)
        else:
            self.run.deliver(SlotDue(position), now)

    def start_playback(self) -> None:
        """Schedule the arrivals (uplink included) and start the controller.

        Each arrival takes its place in the clock's order now, as ``env.timeout`` would
        give it (its time and the next event id), but only the earliest waits on the clock:
        the others wait here, each queued when the one before it arrives. The events run in
        the same order, and the clock's heap holds one arrival a stream, not every one of
        them (a fleet's exact mode: every session's)."""
        env = self.env
        window, uplink = self.run.window, self.serving.uplink
        arrivals: list[tuple[float, int, int, float]] = []
        for t in self.inputs.trace.times:
            if t < window.duration:
                arrives = t if uplink is None else t + uplink.sample(1, self.uplink_rng)
                delay = arrives + self.origin - env.now
                if delay < 0:
                    raise ValueError(f"Negative delay {delay}")  # as simpy.Timeout says
                arrivals.append((env.now + delay, NORMAL, env.take_id(), t))
        arrivals.sort(reverse=True)  # the earliest last: popped first
        self._arrivals = arrivals
        self._queue_arrival()
        self.run.start(self.now)
        if self.in_bulk:
            self._queue_tick()

    def _queue_arrival(self) -> None:
        if self._arrivals:
            at, priority, eid, sent = self._arrivals.pop()
            self.env.call_at(at, priority, eid, self._arrival_callbacks, sent)
            self._arrival_at = at
        else:
            self._arrival_at = math.inf

    def _on_arrival(self, arrival: Call) -> None:
        self._queue_arrival()
        self._condition(arrival.value)  # type: ignore[arg-type]

    def _condition(self, sent: float) -> None:
        self.sent.append(sent)
        self.deliver(ConditionArrived())

    # ---------------------------------------------------------------- jobs

    def start_job(self, job: StartJob, now: float) -> None:
        self.run_steps(job.job_id, job.kind, lambda: self.deliver(JobDone(job.job_id)))

    def run_steps(self, job_id: int, kind: str, ready: Callable[[], None]) -> None:
        """Run the job's steps one after the other on their pools, then call ``ready``.
        While the stream is held (a fleet moving it to another node), the first step
        waits for the hold to end, as if queued since now."""
        steps = _JobSteps(self, job_id, kind, ready)
        hold = self.hold_until - self.env.now
        if hold > 0:
            steps.since = self.env.now
            self.env.timeout(hold).callbacks.append(lambda _: steps.next_step(first=True))
        else:
            steps.next_step(first=True)

    def move_to(self, engine: _Engine, hold_until: float) -> None:
        """The stream's jobs go to ``engine``'s pools from now on (a fleet's migration, at
        a chunk boundary); none starts before ``hold_until`` (its state's transfer). Its
        controller, playback and records stay as they are."""
        self.engine = engine
        self.generator = engine.generator
        self.hold_until = hold_until
        if self.last_stage != _last_stage(engine.generator):
            self.last_stage = None

    def job_started(self, job_id: int, now: float, took: float, waited: bool) -> None:
        """A device took the job's first step: tell the controller if it waited, and note
        the interval the device plans for it (the whole interval is known once it is
        ready)."""
        self.run.job_ran(job_id, now - self.origin, now - self.origin + took)
        # a start that only notes itself changes nothing a quiet tick reads: the ticks
        # before it need not be played first, nor the queued tick moved
        if waited and not (self.closed or self.run.fast_paths
                           and self._ctrl.quiet_job_started(job_id, now - self.origin)):
            self.deliver(JobStarted(job_id))

    # ---------------------------------------------------------------- client

    def play(self, slot: PlaySlot) -> None:
        self._show(slot.position, slot.at)

    def _show(self, position: int, t: float) -> None:
        """The server plays ``position`` at ``t``: it goes to the client, which shows it
        after the playout delay, or when it arrives if that is later (a client stall)."""
        deliver = self.serving.deliver
        if deliver is None:  # it arrives as played, never after it is due: no client stall
            playout = self.playout
            shown = t + playout.delay + playout.shift  # as ClientPlayout.show's due
        else:
            placed = self.playout.show(t, t + deliver.sample(1, self.deliver_rng))
            shown = placed.shown
            if placed.stalled:
                self.client_stalls.append(
                    ClientStallRecord(self.index, position, placed.due, shown))
        if self.first_display is None:
            self.first_display = shown
        # the conditions this slot resolved: the controller records them as it plays it
        conditions = self._ctrl.conditions
        if len(conditions) == self._conditions_seen:
            return
        resolved = conditions[self._conditions_seen:]
        self._conditions_seen = len(conditions)
        self.viewer.extend(shown_records(self.index, resolved, self.sent, shown))

    def censored(self) -> list[ViewerRecord]:
        return censored_records(self.index, self.run.controller.conditions, self.sent)


def _last_stage(generator: StagedGenerator) -> str | None:
    """The stage of every job's last step on the pools, where the chain is the plain one
    (DiT, then decode if any); None for a system model's own chain."""
    if hasattr(generator.dit, "steps") or generator.pipelines():
        return None
    return "dit" if generator.decode is None else "decode"


class _JobSteps:
    """One job's steps, each submitted when the one before is done (an object rather than
    closures that call themselves: those are reference cycles, which only the garbage
    collector frees, some twenty objects a job)."""

    __slots__ = ("port", "job_id", "kind", "steps", "ready", "started", "since")

    def __init__(self, port: _StreamPort, job_id: int, kind: str,
                 ready: Callable[[], None]) -> None:
        self.port = port
        self.job_id = job_id
        self.kind = kind
        self.steps = port.generator.steps(port.K, kind, port.streams)
        self.ready = ready
        self.started = 0.0  # when its first step started (global time)
        self.since: float | None = None  # queued since (a held job's request), else now

    def next_step(self, first: bool = False) -> None:
        port = self.port
        if port.closed:
            return  # the stream left while this step ran: nothing follows it
        step = next(self.steps, None)
        if step is None:
            if self.job_id:
                port.run.job_ran(self.job_id, self.started - port.origin, port.now)
            self.ready()
            return
        port.engine.submit(port, self.job_id, self.kind, step, first,
                           self._first_done if first else self._done,
                           self.since if first else None)
        if not first:
            port.step_ended()

    def _first_done(self, start: float, _end: float) -> None:
        self.started = start
        self.next_step()

    def _done(self, _start: float, _end: float) -> None:
        self.next_step()


class ServingNode:
    """One serving model (DESIGN §6): its pools and the streams on them, on a SimPy clock it
    may share with other nodes (a fleet's). A stream joins with :meth:`add` and starts with
    :meth:`begin` (its first chunk generated on the pools first, with a cold start); a
    stream that leaves before the run ends goes with :meth:`close`; :meth:`records` collects
    what the node recorded."""

    def __init__(self, env: Clock, cost: CostModel, serving: ServingConfig,
                 batch_rng: np.random.Generator, records: str = "all",
                 ticks_in_bulk: bool | None = None) -> None:
        self.env = env
        self.ticks_in_bulk = TICKS_IN_BULK if ticks_in_bulk is None else ticks_in_bulk
        self.serving = serving
        self.engine = _Engine(env, serving, batch_rng,
                              StagedGenerator(cost, serving.replan_cost, serving.decode,
                                              serving.decode_pool))
        self.playout = serving.playout()
        self.records_level = records
        self.ports: list[_StreamPort] = []
        self.finished: dict[int, RunRecords] = {}  # by stream index: streams that left

    def add(self, config: ControllerConfig, window: RunWindow, inputs: StreamInput
            ) -> _StreamPort:
        """A stream of this node (index: the order it was added), not started yet."""
        port = _StreamPort(self.engine, len(self.ports), config, window, inputs,
                           self.playout, self.records_level, self.ticks_in_bulk)
        self.ports.append(port)
        return port

    def begin(self, port: _StreamPort, started: Callable[[_StreamPort], None] | None = None
              ) -> None:
        """Start ``port`` now: its playback, or with a cold start its first chunk on the
        pools, then its playback from when that chunk is ready (``started`` is called
        then)."""
        if not self.serving.cold_start:
            port.start_playback()
            if started is not None:
                started(port)
            return

        def ready() -> None:
            port.origin = self.env.now
            port.start_playback()
            if started is not None:
                started(port)

        port.run_steps(0, "prebuffer", ready)

    def close(self, port: _StreamPort, now: float) -> RunRecords:
        """``port``'s stream leaves at global time ``now``: it plays and generates no more,
        its tasks still waiting for a device are dropped (a task running finishes, and
        nothing follows it), and its records end at ``now``."""
        if port.in_bulk:
            port.catch_up(now)
        port.closed = True
        for pool in self.engine.pools.values():
            if any(task.port is port for task in pool.waiting):
                pool.waiting = deque(t for t in pool.waiting if t.port is not port)
        done = port.run.finish(max(0.0, now - port.origin))
        self.finished[port.index] = done
        return done

    def last_quiet_tick(self, now: float, limit: float) -> float:
        """Where a drain stopped at ``limit`` with conditions still open, the time the
        reference path (each tick an event) stops: the last quiet tick its streams play in
        bulk at or before ``limit``, if later than ``now``; from then the ticks of that
        instant count as run (:meth:`records` plays them)."""
        last = now
        for port in self.ports:
            if port.in_bulk:
                last = max(last, port.last_quiet_tick(limit))
        if last > now:
            self.engine.tick_at, self.engine.tick_index = last, len(self.ports)
        return last

    def records(self, window_duration: float, window_end: float, end: float
                ) -> ServingRecords:
        """The node's records at the end of the run (global time ``end``): tasks still
        running are recorded up to it, streams still here finish then."""
        self.engine.close(end)
        ports = self.ports
        for port in ports:
            if port.in_bulk and not port.closed:
                port.catch_up(end)
        runs = tuple(self.finished[p.index] if p.closed else p.run.finish(end - p.origin)
                     for p in ports)
        starts = tuple(
            StreamStart(p.index, p.inputs.join, p.origin,
                        math.nan if p.first_display is None
                        else p.origin - p.inputs.join + p.first_display)
            for p in ports)
        serving = self.serving
        return ServingRecords(
            duration=window_duration, window_end=window_end, end_time=end,
            streams=runs, starts=starts, tasks=tuple(self.engine.tasks),
            viewer=tuple(sorted((v for p in ports for v in (*p.viewer, *p.censored())),
                                key=lambda v: (v.stream, v.version))),
            client_stalls=tuple(s for p in ports for s in p.client_stalls),
            pools=serving.pools, playout_delay=self.playout, dit_degree=serving.degree,
            records=self.records_level, task_tally=self.engine.tally,
        )


def simulate_serving(
    config: ControllerConfig,
    cost: CostModel,
    serving: ServingConfig,
    streams: Sequence[StreamInput],
    duration: float,
    batch_rng: np.random.Generator,
    drain: float | None = None,
    configs: Sequence[ControllerConfig] | None = None,
    records: str = "all",
    ticks_in_bulk: bool | None = None,
    quiet_in_bulk: bool | None = None,
) -> ServingRecords:
    """Run ``streams`` (one :class:`StreamInput` each) on the pools of ``serving``.

    Every stream plays from its start for ``duration`` seconds of its own time (conditions
    arrive in that window) and goes on while any stream drains (bounded by ``drain`` past
    the last stream's window, as in the single-worker driver). ``config.discard`` is the
    serving configuration's discard mode. ``configs``, if given, is one controller
    configuration per stream (viewers of one server with their own K, policy or lead);
    the streams share the pools as before. ``records`` is what to keep
    (:data:`~latsim.controller.records.RECORD_LEVELS`): below ``all`` the slots and task
    records are added up into what the summary needs as the run goes, so memory grows
    with the streams and conditions, not with the slots. ``ticks_in_bulk`` (default
    :data:`TICKS_IN_BULK`) plays quiet ticks in bulk, or (False) each as an event: the
    reference path, with the same records. ``quiet_in_bulk`` (default
    :data:`QUIET_RUNS_IN_BULK`, and only with ticks in bulk) plays a run that is quiet
    throughout without the clock (:mod:`latsim.sim.bulk`), again with the same records.
    """
    if configs is not None and len(configs) != len(streams):
        raise ValueError(f"{len(configs)} stream configurations for {len(streams)} streams")
    if configs is None:  # one configuration: one window
        own = [config] * len(streams)
        windows = [RunWindow.for_config(config, duration, drain)] * len(streams)
    else:
        own = list(configs)
        windows = [RunWindow.for_config(c, duration, drain) for c in own]
    window = max(windows, key=lambda w: w.limit)
    if ((TICKS_IN_BULK if ticks_in_bulk is None else ticks_in_bulk)
            and (QUIET_RUNS_IN_BULK if quiet_in_bulk is None else quiet_in_bulk)
            and records in RECORD_LEVELS
            and bulk_refusal(own, cost, serving, streams, duration) is None):
        quiet = simulate_quiet_serving(own, cost, serving, streams, windows, records,
                                       bulk_numpy.play_in_numpy)
        if quiet is not None:
            return quiet
    env = Clock()
    node = ServingNode(env, cost, serving, batch_rng, records, ticks_in_bulk)
    ports = [node.add(own[index], windows[index], inputs)
             for index, inputs in enumerate(streams)]
    engine = node.engine
    tally = records != "all"
    if serving.cold_start:
        started = _cold_starts(env, node, ports)
        env.run(until=started)
        if tally:  # the window's end is known once every stream has started
            engine.tally_tasks(max(port.origin for port in ports) + window.duration)
    else:
        if tally:
            engine.tally_tasks(max(port.origin for port in ports) + window.duration)
        for port in ports:
            if port.origin > env.now:
                env.timeout(port.origin).callbacks.append(_then(port.start_playback))
            else:
                port.start_playback()
    last_origin = max(port.origin for port in ports)
    if last_origin + window.duration > env.now:
        env.run(until=last_origin + window.duration)
    limit = last_origin + window.limit
    end = run_drain(env, [node], limit)
    return node.records(window.duration, last_origin + window.duration, end)


def run_drain(env: Clock, nodes: Sequence[ServingNode], limit: float) -> float:
    """Step the clock while a stream of ``nodes`` has a condition open, up to ``limit``;
    returns when the run ends. Stopped at the limit, that is the last quiet tick played in
    bulk at or before it, where one is later than the clock: the reference path steps
    those ticks as events, and its clock ends on the last; the clock moves there."""
    draining = _Draining([port.run.controller for node in nodes for port in node.ports])
    while draining.any_open() and env.peek() <= limit:
        env.step()
    if draining.any_open():
        end = max(node.last_quiet_tick(env.now, limit) for node in nodes)
        if end > env.now:
            env.advance_to(end)
    return env.now


class _Draining:
    """Whether any stream has a condition open, asked before every step of the drain.

    Scanning every stream each step made the drain quadratic in streams. The scan starts at
    the stream found open last time, which usually still is, and goes round from there: a
    stream is passed over only once it has closed, so the streams scanned over the whole
    drain are about as many as the conditions that close in it, plus one round per stream
    that opens again (a condition whose uplink delivers it during the drain)."""

    def __init__(self, controllers: Sequence[Controller]) -> None:
        self._controllers = controllers
        self._at = 0

    def any_open(self) -> bool:
        controllers, n = self._controllers, len(self._controllers)
        for step in range(n):
            index = (self._at + step) % n
            if controllers[index].open_conditions:
                self._at = index
                return True
        return False


def _cold_starts(env: Clock, node: ServingNode, ports: list[_StreamPort]
                 ) -> simpy.Event:
    """Each stream's first chunk is generated on the pools when it joins; its playback
    starts when that chunk is ready. Returns the event of the last stream starting."""
    all_started = env.event()
    waiting = len(ports)

    def ready(_: _StreamPort) -> None:
        nonlocal waiting
        waiting -= 1
        if waiting == 0:
            all_started.succeed()

    for port in ports:
        if port.inputs.join > env.now:
            env.timeout(port.inputs.join).callbacks.append(
                _then(functools.partial(node.begin, port, ready)))
        else:
            node.begin(port, ready)
    return all_started


def _then(action: Callable[[], object]) -> Callable[[simpy.Event], None]:
    """A SimPy callback that ignores its event and calls ``action``."""

    def callback(_: simpy.Event) -> None:
        action()

    return callback
