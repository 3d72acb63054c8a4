"""A quiet serving run's jobs in numpy: every stream's refill cycles at once, no Python a
job (DESIGN §6, the bulk engine).

:mod:`latsim.sim.bulk` plays a quiet run as a loop over the pools' requests and ends;
this module computes the same numbers as arrays, a row per stream and a column per job:

- a request follows the job before it as ``quiet_job_done`` has it (the next refill's due
  time from the ticks played by the job's end, then at once, or an armed wake-up at
  ``now + max(0, due + origin - now)``), one column of all streams at a time;
- the DiT pool serves the requests in the clock's order: Lindley's recursion for one
  device or group (:func:`~latsim.sim.lindley.fifo_one_server`), Kiefer and Wolfowitz's
  for several; a decode pool, if any, serves the DiT steps' ends the same way;
- where two events fall at one instant the clock takes them in the order they were
  scheduled, which :func:`~latsim.sim.lindley.event_ranks` recovers from the events'
  causes (without a decode stage; with one, such a run goes to the loop);
- requests depend on ends and ends on requests, so the two are iterated to their fixed
  point, which is the run's (it is causal: a value depends only on earlier ones), and
  the iteration is stopped where it does not settle;
- a run with conditions (under an eager commit: they move no job) is computed the same
  way, up to the drain's limit; each stream's conditions are read off that schedule
  (:class:`_Shows`: each job's version from the arrivals, each condition shown by the
  first slot of the first job that binds it), or, where the schedule cannot tell them,
  the stream is replayed through its own controller on it
  (:mod:`latsim.sim.bulk_replay`); their last shows say where the run ends, and the
  arrays are cut there.

What the loop checks as it goes (every tick played in Consume quiet by ``_play_quiet``'s
test, every wake-up on ``quiet_wake``'s fast path, no tick before its chunk) is checked
here over all ticks at once, after the fact. The result is written into the loop's own
books (:class:`~latsim.sim.bulk._Run`), whose ``finish`` makes the records, so the two
paths share their records code. Where the run is not one this module can tell exactly,
it leaves the books untouched and the loop plays it: a cost model with no
``sample_many``, a step of no time, events at one instant with a decode stage, rounds
that do not settle, or a check that fails (the loop then gives back what stalls).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import repeat

import numpy as np

from latsim.controller.machine import EPS
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.run.records import BusyTally
from latsim.run.serving import (
    TaskRecord,
    TaskTally,
    ViewerRecord,
    censored_records,
    shown_records,
)
from latsim.sim.bulk import _Run, _Stream, draws
from latsim.sim.bulk_replay import Differs, StreamReplay
from latsim.sim.lindley import (
    event_ranks,
    fifo_one_server,
    fifo_servers,
    ordered_row_sums,
    row_bisect,
)

#: The most ticks :meth:`_Jobs._check_consumed` checks in one set of arrays.
TICKS_AT_ONCE = 1 << 18
#: Rounds of requests-from-ends and ends-from-requests before the loop plays the run
#: instead (a round settles at least the earliest job still moving).
MAX_ROUNDS = 24


class _NotExact(Exception):
    """This module cannot tell the run exactly: the loop plays it."""


def play_in_numpy(run: _Run) -> bool:
    """Fill ``run``'s books as its loop would leave them at the run's end, and say True;
    or leave them untouched and say False (the loop plays it)."""
    dit_draws = getattr(run.cost, "sample_many", None)
    decode_draws = (None if run.decode is None
                    else getattr(run.decode, "sample_many", None))
    if dit_draws is None or (run.decode is not None and decode_draws is None):
        return False
    # a fixed cost draws nothing: its streams are neither kept nor drawn again below
    drawing, decode_drawing = draws(run.cost), draws(run.decode)
    rngs = (([s.rng for s in run.streams] if drawing else [])
            + ([s.decode_rng for s in run.streams] if decode_drawing else []))
    saved = [rng.bit_generator.state for rng in rngs]
    run.cut = run.horizon  # the schedule as far as a drain may go, where one may
    try:
        jobs = _Jobs(run, dit_draws, decode_draws)
        if run.conditions:
            _show_conditions(run, jobs)
    except (_NotExact, Differs):
        run.end = run.cut = run.window_end
        run.replays, run.last_tick = {}, -1
        for stream in run.streams:
            stream.shows = None
        for rng, state in zip(rngs, saved, strict=True):
            rng.bit_generator.state = state
        return False
    # the draws the run made, and no more: a DiT step's as it is queued, a decode's as
    # its DiT step ends
    for rng, state in zip(rngs, saved, strict=True):
        rng.bit_generator.state = state
    if drawing:
        for stream, count in zip(run.streams, jobs.requested.sum(axis=1).tolist(),
                                 strict=True):
            dit_draws(run.K, stream.rng, count, "refill")
    if decode_draws is not None and decode_drawing:
        for stream, count in zip(run.streams, (jobs.dit_ends < run.cut).sum(axis=1).tolist(),
                                 strict=True):
            decode_draws(run.K, stream.decode_rng, count, "refill")
    jobs.write(run)
    return True


def _show_conditions(run: _Run, jobs: _Jobs) -> None:
    """Resolve each stream's conditions (:class:`_Shows`: read off the arrays where they
    can be, else replayed through the stream's own controller on the schedule,
    :mod:`latsim.sim.bulk_replay`), and end the run where the event path ends it: at the
    window's end, or past it at the tick that shows the last condition still open there
    (no later than the drain's limit; the streams of a lower index play their ticks of
    that instant, as the clock orders ticks). The arrays are then cut there."""
    horizon, window_end = run.horizon, run.window_end
    counts = (jobs.requests < horizon).sum(axis=1).tolist()
    replays: dict[int, StreamReplay] = {}
    closes = []
    for index, (inputs, stream) in enumerate(zip(run.inputs, run.streams, strict=True)):
        window = run.windows[index]
        sent = [t for t in inputs.trace.times if t < window.duration]
        if not sent:
            continue
        origin = now = stream.origin  # the serving port's sums, from its start
        n = counts[index]
        arrivals = [now + ((t + origin) - now) for t in sent]
        shows = _Shows.read(run, jobs, index, arrivals, sent, n)
        if shows is not None:
            stream.shows = shows
            closing = shows.closing(window_end, horizon)
            if closing is not None:
                closes.append((closing, index))
            continue
        asked, began = jobs.requests[index, :n], jobs.starts[index, :n]
        replays[index] = StreamReplay(
            index, origin, run.configs[index], window, run.records,
            list(zip(arrivals, sent, strict=True)),
            asked.tolist(), jobs.armed[index, :n + 1].tolist(), began.tolist(),
            jobs.ends[index, :n].tolist(), jobs.took[index, :n].tolist(), run.clock[index],
            horizon, run.playout,
            skips=not ((began > asked) & (began - origin == asked - origin)).any())
    for replay in replays.values():
        replay.play_until(window_end)
    for replay in replays.values():
        if replay.ctrl.open_conditions:
            closed = replay.play_until(horizon, through=True, closing=True)
            if closed is None:
                raise _NotExact  # open at the drain's limit: the event path's end rule
            closes.append((closed, replay.index))
    end, last = max(closes) if closes else (window_end, -1)
    for replay in replays.values():
        replay.play_until(end, through=replay.index < last, at_end=last >= 0)
    # past the window the drain stops after the tick that closes it: the events of that
    # instant ran before it (ticks run last), those of the window's end did not
    cut = math.nextafter(end, math.inf) if last >= 0 else end
    run.end, run.cut, run.last_tick, run.replays = end, cut, last, replays
    jobs.requested = jobs.requests < cut
    if jobs.ranked:  # the steps dispatched before the end
        jobs.ranks.dispatched = [
            tuple(column[keep] for column in dispatched)  # type: ignore[misc]
            for stage, dispatched in zip(jobs.stages, jobs.ranks.dispatched, strict=True)
            for keep in [stage.starts.flat[dispatched[0]] < cut]]


class _Shows:
    """One stream's conditions read off the arrays, as its controller would resolve them
    on their schedule: under an eager commit a condition moves no job, so each one only
    registers a version (``quiet_condition``), which the next job binds as it is asked
    for, or, binding at the start, as a device starts it after a wait
    (``_act_note_job_start``: one chunk in flight, so it always rebinds); a tick shows
    the conditions up to the version of the slot it plays (``_resolve_conditions``), and
    the versions along the slots never decrease, so the first slot of the first job that
    binds version v shows it. Where an arrival falls at the instant of another of the
    stream's events (their ids order them), or comes so near its armed refill's due time
    that the decide step would start it (``quiet_condition`` refuses), :meth:`read` says
    None and the stream is replayed through its controller instead."""

    __slots__ = ("index", "K", "origin", "versions", "arrivals", "sent", "places",
                 "ticks", "job_times")

    def __init__(self, index: int, K: int, origin: float, versions: list[int],
                 arrivals: list[float], sent: list[float], places: list[int],
                 ticks: list[float], job_times: list[tuple[float, float]]) -> None:
        self.index, self.K, self.origin = index, K, origin
        self.versions = versions  # each job's version (job j at j - 1)
        self.arrivals = arrivals  # each condition's arrival (global time)
        self.sent = sent  # ... and its send time, in version order
        # the place of the slot that shows each version (-1: no job binds it here), the
        # time of that tick (global; inf: past the ticks computed), and the controller's
        # (start, ready) of the job that made it
        self.places, self.ticks, self.job_times = places, ticks, job_times

    @classmethod
    def read(cls, run: _Run, jobs: _Jobs, index: int, arrivals: list[float],
             sent: list[float], n: int) -> _Shows | None:
        """Stream ``index``'s conditions (``arrivals``, global times, and their ``sent``
        times) over its first ``n`` jobs, or None where the arrays cannot tell them."""
        origin = run.streams[index].origin
        asked = jobs.requests[index, :n].tolist()
        began = jobs.starts[index, :n].tolist()
        ended = jobs.ends[index, :n].tolist()
        armed = jobs.armed[index, :n + 1].tolist()
        waited = [s > a for a, s in zip(asked, began, strict=True)]
        instants = {origin, *asked, *ended, *(s for s, w in zip(began, waited, strict=True)
                                              if w)}
        if any(a in instants for a in arrivals):
            return None  # two events at one instant: the clock orders them by their ids
        for a in arrivals:  # in Consume (the refill armed), the decide step keeps it armed
            job = bisect_right(asked, a)
            if (job == 0 or ended[job - 1] < a) and armed[job] == armed[job] and (
                    armed[job] <= (a - origin) + 2 * EPS):
                return None
        if run.configs[index].bind == "start":
            binds = [s if w else a for a, s, w in zip(asked, began, waited, strict=True)]
        else:
            binds = asked
        versions = [bisect_left(arrivals, b) for b in binds]
        K = run.K
        clock = run.clock[index]
        width = clock.size
        places, ticks, job_times = [], [], []
        for version in range(1, len(arrivals) + 1):
            job = bisect_left(versions, version)  # its index: job id job + 1
            if job >= n:
                places.append(-1)
                ticks.append(math.inf)
                job_times.append((math.nan, math.nan))
                continue
            place = (job + 1) * K
            places.append(place)
            ticks.append(float(clock[place]) if place < width else math.inf)
            start = began[job] if waited[job] else asked[job]
            job_times.append((start - origin, ended[job] - origin))
        return cls(index, K, origin, versions, arrivals, sent, places, ticks, job_times)

    def closing(self, window_end: float, horizon: float) -> float | None:
        """The time of the tick that shows the last condition, where one is still open at
        the window's end (None where none is); no later than ``horizon`` (the drain's
        limit: past it the event path ends the run its own way)."""
        last = self.ticks[-1]
        if last < window_end:
            return None
        if last > horizon:
            raise _NotExact
        return last

    def slot_versions(self, played: int) -> list[int]:
        """The version of each slot played, from position 0 (the prebuffer's: 0)."""
        K = self.K
        versions = [0] * K
        for version in self.versions[:(played + K - 1) // K]:
            versions += [version] * K
        return versions[:played]

    def records(self, played: int, delay: float, shift: float
                ) -> tuple[list[ConditionRecord], list[ViewerRecord]]:
        """The controller's condition records and the viewer's, ``played`` ticks played:
        those the ticks showed, then the censored ones."""
        conditions, viewer = [], []
        index, origin, K, versions = self.index, self.origin, self.K, self.versions
        for version, (arrival, place, tick, (start, ready)) in enumerate(zip(
                self.arrivals, self.places, self.ticks, self.job_times, strict=True), 1):
            t_arrival = arrival - origin
            if 0 <= place < played:
                job = place // K
                shown_version = versions[job - 1]
                cond = ConditionRecord.shown(
                    version, t_arrival, JobRecord(job, "refill", place, K, shown_version,
                                                  place, start, ready),
                    tick - origin, superseded=version < shown_version)
                conditions.append(cond)
                viewer.extend(shown_records(index, [cond], self.sent,
                                            cond.t_play + delay + shift))
            else:
                cond = ConditionRecord.censored(version, t_arrival)
                conditions.append(cond)
                viewer.extend(censored_records(index, [cond], self.sent))
        return conditions, viewer


class _Jobs:
    """Every stream's jobs as (streams × jobs) arrays: request, start and end times (global),
    the pool's device and batch, and what the ticks say of each."""

    def __init__(self, run: _Run, draws: Callable[..., np.ndarray],
                 decode_draws: Callable[..., np.ndarray] | None) -> None:
        self.run = run
        K, delta, lead, end = run.K, run.delta, run.refill_lead, run.cut
        self.clock = run.clock
        self.origins = origins = np.array([s.origin for s in run.streams])
        streams = len(run.streams)
        period = K * delta
        # no request comes before its due time, (j K) δ - lead from the stream's start
        self.width = width = int(np.ceil((end - origins.min() + lead) / period)) + 2
        self.took = np.array([draws(K, s.rng, width, "refill") for s in run.streams])
        self.decode_took = None if decode_draws is None else np.array(
            [decode_draws(K, s.decode_rng, width, "refill") for s in run.streams])
        if not ((self.took > 0.0).all()
                and (self.decode_took is None or (self.decode_took > 0.0).all())):
            raise _NotExact  # a step of no time ends at its start: the clock orders those
        # column 0: start_playback's decide step, at the start (0.0 where the origin is)
        self.now0 = np.where(origins > 0.0, origins, 0.0)
        due0 = 0.0 + (K - 0) * delta - lead
        self.armed = np.full((streams, width), np.nan)  # the due time a wake-up was armed at
        requests = np.full((streams, width), np.inf)
        if due0 <= 0.0 + EPS:
            requests[:, 0] = self.now0
        else:
            requests[:, 0] = self.now0 + np.maximum(0.0, (due0 + origins) - self.now0)
            self.armed[:, 0] = due0
        self.requests = requests
        # the clock's order of events at one instant, as places (lower first): at first,
        # requests in stream order (the order streams that join together start in) and
        # ends before requests; from then on as the last round's events rank them
        # whether two events fall at one instant, and then the clock's order of them
        self.ranked = False
        self.ranks = _Ranks([], [])
        self.broken = False  # set by _follow
        # a first guess: every job starts at its request
        for column in range(width - 1):
            ends = requests[:, column] + self.took[:, column]
            if self.decode_took is not None:
                ends = ends + self.decode_took[:, column]
            self._follow(ends[:, None], column, requests, self.armed)
        rounds = 0
        while True:
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise _NotExact
            self._serve()
            if rounds == 1 and self._ties():  # joins together tie from the start: rank
                rounds, self.ranked, self.ranks = 0, True, self._rank_events()  # at once
                self._serve()
            if self.ranked:  # the pool's order and the events' ranks, for these requests
                self._settle_ranks()
            following = np.full_like(requests, np.inf)
            following[:, 0] = requests[:, 0]
            armed = np.full_like(self.armed, np.nan)
            armed[:, 0] = self.armed[:, 0]
            self._follow(self.ends, None, following, armed)
            if np.array_equal(following, self.requests):
                # time orders the events where every instant is one event's; else they
                # are ranked from here on, and the rounds go on until that settles too
                # (a first round's requests and service are those it found untied)
                if self.ranked or rounds == 1 or not self._ties():
                    break
                rounds, self.ranked, self.ranks = 0, True, self._rank_events()
                continue
            self.requests, self.armed = following, armed
        if self.broken:
            raise _NotExact  # it stalls (or has more jobs than quiet cycles make)
        self._check_ticks()

    # ------------------------------------------------------------ requests from ends

    def _follow(self, ends: np.ndarray, column: int | None, into: np.ndarray,
                armed: np.ndarray) -> None:
        """``quiet_job_done`` for every job of ``ends`` that ends within the run (all
        columns, or the one given): the ticks played by its end and the next job's
        request (at once, or armed) into the next column. Whether a tick came before its
        chunk (a stall: the loop gives such a run back) or a stream went past the jobs'
        bound is kept in ``self.broken``: a round's guess may do either on its way to the
        run's own numbers, which :meth:`__init__` checks once they settle."""
        run = self.run
        first = 0 if column is None else column
        rows, places = np.nonzero(ends < run.cut)
        if not rows.size:
            return
        done = ends[rows, places]
        cols = places + first
        played = row_bisect(self.clock, rows, done, self.origins, run.delta)
        if played is None:
            raise _NotExact
        within = cols + 1 < self.width
        self.broken = bool((played > (cols + 1) * run.K).any() or not within.all())
        rows, cols, done, played = rows[within], cols[within], done[within], played[within]
        origins = self.origins[rows]
        due = self._due(rows, played, (cols + 2) * run.K)
        at_once = due <= (done - origins) + EPS
        into[rows, cols + 1] = np.where(
            at_once, done, done + np.maximum(0.0, (due + origins) - done))
        armed[rows, cols + 1] = np.where(at_once, np.nan, due)

    def _due(self, rows: np.ndarray, played: np.ndarray, planned_end: np.ndarray
             ) -> np.ndarray:
        """``_Run.due``: the next refill's due time from the ticks played."""
        run = self.run
        last = self.clock[rows, np.maximum(played - 1, 0)]
        next_due = np.where(played > 0, (last - self.origins[rows]) + run.delta, 0.0)
        return next_due + (planned_end - played) * run.delta - run.refill_lead

    # ------------------------------------------------------------ ends from requests

    def _serve(self) -> None:
        """The DiT pool's FIFO over every request made within the run, in time order, then
        the decode pool's over the DiT steps that end within it (each queued as it ends)."""
        run = self.run
        self.requested = requested = self.requests < run.cut
        ranks = self.ranks if self.ranked else None
        dit = _served(self.requests, requested, self.took, len(run.dit_pool.free),
                      ranks and (ranks.queued[0], ranks.ended[0]))
        self.stages = [dit]
        self.starts, self.dit_ends = dit.starts, dit.ends
        self.ends = dit.ends
        if self.decode_took is not None:
            assert run.decode_pool is not None
            queued = dit.ends < run.cut
            decode = _served(dit.ends, queued, self.decode_took, len(run.decode_pool.free),
                             ranks and (ranks.queued[1], ranks.ended[1]))
            self.stages.append(decode)
            self.ends = decode.ends

    def _ties(self) -> bool:
        """Whether two events fall at one instant: a start that asks at once, a wake-up
        or a step's end (a request made at once at an end is that end's event)."""
        end = self.run.cut
        ends = [stage.ends[stage.ends < end] for stage in self.stages]
        asked = self.requests[self.requested & (~np.isnan(self.armed)
                                                | (np.arange(self.width) == 0))]
        instants = np.sort(np.concatenate([asked, *ends]))
        return bool((instants[1:] == instants[:-1]).any())

    def _settle_ranks(self) -> None:
        """Serve the requests again in the order the events' ranks give, until the ranks
        of that service are the ones it was served in (the pools were last served in
        ``self.ranks``' order)."""
        for _ in range(MAX_ROUNDS):
            ranks = self._rank_events()
            if ranks.same(self.ranks):
                self.ranks = ranks
                return
            self.ranks = ranks
            self._serve()
        raise _NotExact

    def _rank_events(self) -> _Ranks:
        """Where each step's queueing, dispatch and end fall in the clock's order of events
        (for ties: two at one instant come in the order they were scheduled).

        The events: each stream's turn at the run's start (the loop starts or schedules
        the streams in order), its start where it joins later, the wake-ups armed, and
        each step's end within the run. A job's request is made in its wake-up, else (at
        once) in its start or in the end of the stream's job before it; its decode is
        queued in its DiT step's end. An end dispatches the next step waiting for its
        device first (place 0), then what its own stream asks for (place 1)."""
        end = self.run.cut
        streams, width = self.requests.shape
        total = streams * width
        armed = np.flatnonzero(self.requested & ~np.isnan(self.armed))
        ended = [np.flatnonzero(stage.ends < end) for stage in self.stages]
        count = 2 * streams + armed.size + sum(e.size for e in ended)
        wake_event = np.full(total, -1)
        wake_event[armed] = 2 * streams + np.arange(armed.size)
        end_event, first_free = [], 2 * streams + armed.size
        for stage_ended in ended:
            events = np.full(total, -1)
            events[stage_ended] = first_free + np.arange(stage_ended.size)
            end_event.append(events)
            first_free += stage_ended.size
        job_done = end_event[-1]  # the job is done at its last step's end
        times = np.full(count, -np.inf)
        parents = np.full(count, -1)
        places = np.zeros(count, dtype=np.int64)
        everyone = np.arange(streams)
        places[:streams] = everyone  # each stream's turn at the start
        joins_later = self.origins > 0.0
        times[streams:2 * streams] = np.where(joins_later, self.origins, -np.inf)
        parents[streams:2 * streams] = everyone
        start_event = np.where(joins_later, streams + everyone, everyone)

        def asked_in(jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(event, place among its parent's) in which each job's request is made."""
            first = jobs % width == 0
            event = np.where(wake_event[jobs] >= 0, wake_event[jobs],
                             np.where(first, start_event[jobs // width],
                                      job_done[np.maximum(jobs - 1, 0)]))
            return event, ((wake_event[jobs] < 0) & ~first).astype(np.int64)

        def queued_in(number: int, jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(event, place) in which step ``number`` of each job is queued."""
            return asked_in(jobs) if number == 0 else (
                end_event[number - 1][jobs], np.ones(jobs.size, dtype=np.int64))

        wakes = wake_event[armed]
        times[wakes] = self.requests.flat[armed]
        first = armed % width == 0
        parents[wakes] = np.where(first, start_event[armed // width],
                                  job_done[np.maximum(armed - 1, 0)])
        places[wakes] = ~first  # after the waiting step its end dispatched
        dispatched_in = []
        for number, (stage, stage_ended) in enumerate(zip(self.stages, ended, strict=True)):
            started = np.flatnonzero(stage.starts < end)
            freed_by = stage.freed_by.flat[started]
            queued, place = queued_in(number, started)
            dispatcher = np.where(freed_by >= 0, end_event[number][np.maximum(freed_by, 0)],
                                  queued)
            dispatched_in.append((started, dispatcher, np.where(freed_by >= 0, 0, place)))
            events = end_event[number][stage_ended]
            mine = np.searchsorted(started, stage_ended)  # ended ⊂ started, both sorted
            times[events] = stage.ends.flat[stage_ended]
            parents[events] = dispatcher[mine]
            places[events] = dispatched_in[-1][2][mine]
        if (parents[2 * streams:] < 0).any():
            raise _NotExact  # an event whose cause the arrays do not hold
        ranks = event_ranks(times, parents, places)
        if ranks is None:
            raise _NotExact
        out = _Ranks([], [])
        for number, (stage, stage_ended) in enumerate(zip(self.stages, ended, strict=True)):
            queued_rank = np.full((streams, width), np.inf)
            waiting = np.flatnonzero(stage.queued < end)
            queued_rank.flat[waiting] = ranks[queued_in(number, waiting)[0]]
            end_rank = np.full((streams, width), np.inf)
            end_rank.flat[stage_ended] = ranks[end_event[number][stage_ended]]
            out.queued.append(queued_rank)
            out.ended.append(end_rank)
        out.dispatched = [(started, ranks[dispatcher], place)
                          for started, dispatcher, place in dispatched_in]
        return out

    # ------------------------------------------------------------ the checks

    def _check_ticks(self) -> None:
        """What the loop checks at each wake-up (``quiet_wake``'s guards, and every tick
        played in Consume before it quiet by ``_play_quiet``'s test), for all at once."""
        run = self.run
        K = run.K
        woken = self.requested & ~np.isnan(self.armed)
        rows, cols = np.nonzero(woken)
        if not rows.size:
            return
        at = self.requests[rows, cols]
        origins = self.origins[rows]
        played = row_bisect(self.clock, rows, at, self.origins, run.delta)
        if played is None:
            raise _NotExact
        planned_end = (cols + 1) * K
        armed = self.armed[rows, cols]
        t_now = at - origins
        if ((played > planned_end).any() or (armed > t_now + EPS).any()
                or (self._due(rows, played, planned_end) > t_now + EPS).any()):
            raise _NotExact
        # the ticks from the previous job's end (or the start) to the wake-up
        before = np.zeros_like(played)
        previous = cols > 0
        if previous.any():
            ends = self.ends[rows[previous], cols[previous] - 1]
            found = row_bisect(self.clock, rows[previous], ends, self.origins, run.delta)
            if found is None:
                raise _NotExact
            before[previous] = found
        self._check_consumed(rows, before, played, planned_end, armed)

    def _check_consumed(self, rows: np.ndarray, first: np.ndarray, upto: np.ndarray,
                        planned_end: np.ndarray, armed: np.ndarray) -> None:
        """Ticks ``first .. upto - 1`` of each row, played in Consume: each quiet. Taken
        :data:`TICKS_AT_ONCE` ticks at a time (a tick costs about 60 bytes of arrays)."""
        run = self.run
        counts = np.maximum(upto - first, 0)
        width = self.clock.shape[1]
        clock = self.clock.ravel()
        ends = np.cumsum(counts)
        start = 0
        while start < counts.size:
            stop = int(np.searchsorted(ends, ends[start] - counts[start] + TICKS_AT_ONCE,
                                       side="right"))
            stop = max(stop, start + 1)
            part = slice(start, stop)
            start = stop
            these = counts[part]
            total = int(these.sum())
            if not total:
                continue
            row_base = rows[part] * width
            # each tick's place in the flattened matrix, and planned_end - (n + 1) for it
            place = np.repeat(row_base + first[part] - (np.cumsum(these) - these), these) \
                + np.arange(total)
            ahead = np.repeat(row_base + planned_end[part] - 1, these) - place
            t = clock[place] - np.repeat(self.origins[rows[part]], these)
            due = (t + run.delta) + ahead * run.delta - run.refill_lead
            if ((due <= t + EPS)
                    | (np.abs(np.repeat(armed[part], these) - due) > EPS)).any():
                raise _NotExact

    # ------------------------------------------------------------ the books

    def write(self, run: _Run) -> None:
        """The loop's books as the run's end finds them: each stream's state and records,
        the tasks done (or their tally) and those still running."""
        end = run.cut
        requests, starts, ends = self.requests, self.starts, self.ends
        started = starts < end
        done = ends < end
        origins = self.origins[:, None]
        # JobStarted moves the controller's start to the dispatch, where that is later
        ctrl_start = np.where(started & (starts > requests), starts - origins,
                              requests - origins)
        tally_seconds = started_in_window = None
        if not run.keep:
            duration = run.window.duration
            terms = np.where(done, np.maximum(0.0, np.minimum(ends - origins, duration)
                                              - np.maximum(starts - origins, 0.0)), 0.0)
            tally_seconds = ordered_row_sums(terms).tolist()
            started_in_window = (done & (starts - origins < duration)).sum(axis=1).tolist()
        done_played = self._played(done, ends)
        requested_n = self.requested.sum(axis=1).tolist()
        done_n = done.sum(axis=1).tolist()
        arrays = (requests, starts, ends, ctrl_start, ends - origins, self.armed, self.took,
                  done_played)
        for i, stream in enumerate(run.streams):
            self._write_stream(run, stream, _Row(*(a[i] for a in arrays)), requested_n[i],
                               done_n[i],
                               None if tally_seconds is None else
                               BusyTally(tally_seconds[i], started_in_window[i]),
                               records=i not in run.replays)
        self._write_tasks(run)

    def _played(self, done: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Ticks played by each done job's end (0 where none)."""
        rows, cols = np.nonzero(done)
        played = np.zeros(done.shape, dtype=np.int64)
        if rows.size:
            found = row_bisect(self.clock, rows, ends[rows, cols], self.origins,
                               self.run.delta)
            assert found is not None  # found in _follow already
            played[rows, cols] = found
        return played

    def _write_stream(self, run: _Run, stream: _Stream, row: _Row, requested: int,
                      done: int, tally: BusyTally | None, records: bool = True) -> None:
        """One stream's books, read from its row of each array (only the places a
        record or the state at the end needs are made Python numbers); without
        ``records`` (a replayed stream, whose controller made them) only its state at
        the end, which the tasks still running read."""
        K, end, origin = run.K, run.cut, stream.origin
        if records:
            stream.jobs.append(JobRecord(0, "prebuffer", 0, K, 0, 0, 0.0, 0.0))
            if not run.forget:  # at "none" a run keeps only the prebuffer's record
                kept = range(1, done + 1)
                branches = [j * K for j in kept]
                shows = stream.shows
                stream.jobs.extend(map(
                    JobRecord, kept, repeat("refill"), branches, repeat(K),
                    repeat(0) if shows is None else shows.versions[:done], branches,
                    row.ctrl[:done].tolist(), row.ready[:done].tolist()))
            stream.jobs_done = done
            stream.next_job = requested + 1
            stream.planned_end = (requested + 1) * K
            stream.tally = tally
            first = 1 if tally is None else done + 1  # the tally holds the jobs done
            asked, began, ended, took = (column[first - 1:requested].tolist() for column in (
                row.requests, row.starts, row.ends, row.took))
            for j, r, s, e, t in zip(range(first, requested + 1), asked, began, ended, took,
                                     strict=True):
                stream.starts[j] = r - origin
                if s < end:
                    stream.ran[j] = ((s - origin, e - origin) if j <= done else
                                     (s - origin, s - origin + t))
        if done < requested:  # a job requested and not done: in flight or waiting
            job = requested
            stream.job = job
            if len(self.stages) > 1 and self.dit_ends[stream.index, job - 1] < end:
                stream.stage = "decode"  # its DiT step is done: decode queued or running
            stream.branch = job * K
            stream.ctrl_start = float(row.ctrl[job - 1])
            at = float(row.requests[job - 1])
            woken = not np.isnan(row.armed[job - 1])
            # the ticks played when the job was asked for: at its wake-up, else at the
            # end of the job before it (or the start)
            stream.played = (bisect_left(stream.clock, at) if woken
                             else (int(row.played[job - 2]) if job > 1 else 0))
            stream.armed = None
        else:
            stream.job = 0
            stream.branch = done * K
            stream.played = int(row.played[done - 1]) if done else 0
            stream.armed = (float(row.armed[requested]) if requested < row.armed.size
                            else None)

    def _write_tasks(self, run: _Run) -> None:
        """The tasks: those done, in the order they ended (records or a tally), then those
        still running, in batch order, for ``finish`` to close. Batches are numbered in
        dispatch order across the pools: by time, and within one event a device's next
        waiting step before the step the event itself queued."""
        end = run.cut
        pools = [run.dit_pool] + ([run.decode_pool] if len(self.stages) > 1 else [])
        names = ("dit", "decode")
        parts = []
        for number, stage in enumerate(self.stages):
            started = np.flatnonzero(stage.starts < end)
            rows, cols = np.divmod(started, self.width)
            starts, queued = stage.starts.flat[started], stage.queued.flat[started]
            if self.ranked:  # the events' places in the clock's order
                _, dispatched_rank, place = self.ranks.dispatched[number]
                order_keys = (place, dispatched_rank, self.ranks.ended[number].flat[started])
            else:  # one event an instant: by time, and within one event a device's next
                # waiting step (asked before it started) before the step the event queued
                order_keys = (stage.rank.flat[started], starts <= queued)
            parts.append((np.full(rows.size, number), rows, cols, stage.devices.flat[started],
                          queued, starts, stage.ends.flat[started], *order_keys))
        columns = (list(parts[0]) if len(parts) == 1 else
                   [np.concatenate(column) for column in zip(*parts, strict=True)])
        del parts
        stage_of, rows, cols, devices, queued, starts, ends = columns[:7]
        if self.ranked:
            place, dispatched_rank, end_rank = columns[7:]
            dispatch = np.lexsort((place, dispatched_rank))
        else:
            fifo, asked = columns[7:]
            dispatch = np.lexsort((fifo, stage_of, asked, starts))
            end_rank = ends
        del columns
        batches = np.empty(dispatch.size, dtype=np.int64)
        batches[dispatch] = np.arange(1, dispatch.size + 1)
        run.batches = int(dispatch.size)
        ended = ends < end
        by_end = np.flatnonzero(ended)
        by_end = by_end[np.argsort(end_rank[by_end], kind="stable")]
        if run.task_tally is None:
            run.tasks.extend(
                TaskRecord(row, col + 1, names[number], "refill", pools[number].name, device,
                           batch, enqueued, start, stop)
                for number, row, col, device, batch, enqueued, start, stop in zip(
                    *(column[by_end].tolist() for column in (
                        stage_of, rows, cols, devices, batches, queued, starts, ends)),
                    strict=True))
        elif by_end.size:
            tally = run.task_tally
            for number, pool in enumerate(pools):
                mine = by_end[stage_of[by_end] == number]
                _tally_stage(tally, names[number], pool.name, len(pool.free), devices[mine],
                             queued[mine], starts[mine], ends[mine])
            last = by_end[-1]
            tally._last = (pools[stage_of[last]].name, int(devices[last]), int(batches[last]))
        streams = run.streams
        for k in dispatch[~ended[dispatch]].tolist():
            run.running[int(batches[k])] = (streams[int(rows[k])], pools[stage_of[k]],
                                            int(devices[k]), float(starts[k]),
                                            float(queued[k]))


class _Ranks:
    """The clock's order where events fall at one instant, for each step of a job (a list
    a stage): where its queueing (``queued``) and its end (``ended``) fall, as (streams ×
    jobs) arrays (lower first; inf where there is none), and
    (from :meth:`_Jobs._rank_events`) for each step dispatched: (its flat index, the
    dispatching event's rank, its place among that event's dispatches)."""

    __slots__ = ("queued", "ended", "dispatched")

    def __init__(self, queued: list[np.ndarray], ended: list[np.ndarray]) -> None:
        self.queued = queued
        self.ended = ended
        self.dispatched: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def same(self, other: _Ranks) -> bool:
        return all(np.array_equal(a, b) for a, b in zip(
            self.queued + self.ended, other.queued + other.ended, strict=True))


class _Stage:
    """One step of every job on its pool, as (streams × jobs) arrays: when it was queued,
    started and ended (inf: not queued, or not started within the run), on which device,
    and its place in the pool's FIFO."""

    __slots__ = ("queued", "starts", "ends", "devices", "rank", "freed_by")

    def __init__(self, queued: np.ndarray) -> None:
        self.queued = queued
        self.starts = np.full_like(queued, np.inf)
        self.ends = np.full_like(queued, np.inf)
        self.devices = np.zeros(queued.shape, dtype=np.int64)
        self.rank = np.zeros(queued.shape, dtype=np.int64)
        # the job (flat index) whose end dispatched it; -1: dispatched as it was queued
        self.freed_by = np.full(queued.shape, -1, dtype=np.int64)


def _served(queued: np.ndarray, within: np.ndarray, took: np.ndarray, servers: int,
            ranks: tuple[np.ndarray, np.ndarray] | None) -> _Stage:
    """A FIFO pool's service of the steps queued at ``queued`` where ``within``, in the
    clock's order: by time, then (where two events fall at one instant) by ``ranks``, the
    places of each step's queueing and end in the clock's order (None: no ties). Lindley's
    recursion on one device, Kiefer and Wolfowitz's on several."""
    stage = _Stage(np.where(within, queued, np.inf))
    flat = np.flatnonzero(within)
    if ranks is None:
        order = flat[np.argsort(queued.flat[flat], kind="stable")]
        asked_rank = done_rank = None
    else:
        order = flat[np.lexsort((ranks[0].flat[flat], queued.flat[flat]))]
        asked_rank, done_rank = ranks[0].flat[order], ranks[1].flat[order]
    times = queued.flat[order]
    jobs = took.flat[order]
    if servers == 1:
        ends = fifo_one_server(times, jobs)
        before = np.concatenate(([-np.inf], ends[:-1]))
        starts = np.maximum(times, before)
        devices = np.zeros(order.size, dtype=np.int64)
        # dispatched by the end before it where that end comes after its queueing
        waited = before > times
        if ranks is not None:
            waited |= (before == times) & (
                np.concatenate(([-np.inf], done_rank[:-1])) > asked_rank)
        freed_by = np.where(waited, np.arange(order.size) - 1, -1)
    else:
        starts, ends, devices, freed_by = fifo_servers(times, jobs, servers, asked_rank,
                                                       done_rank)
    stage.starts.flat[order] = starts
    stage.ends.flat[order] = ends
    stage.devices.flat[order] = devices
    stage.rank.flat[order] = np.arange(order.size)
    stage.freed_by.flat[order] = np.where(freed_by >= 0, order[np.maximum(freed_by, 0)], -1)
    return stage


def _tally_stage(tally: TaskTally, stage: str, pool: str, servers: int, devices: np.ndarray,
                 queued: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """``TaskTally.add_values`` for one stage's tasks done, in the order they ended: waits
    (and a DiT step's chunk latency) appended, busy seconds summed a device at a time."""
    if not devices.size:
        return
    waits = tally.waits.setdefault(stage, array("d"))
    waits.frombytes((starts - queued).tobytes())
    if stage == "dit":
        tally.chunks.frombytes((ends - queued).tobytes())
    window_end = tally._window_end
    seconds = np.maximum(0.0, np.minimum(ends, window_end) - np.maximum(starts, 0.0))
    counts = np.bincount(devices, minlength=servers)
    by_device = np.argsort(devices, kind="stable")
    place = np.arange(devices.size) - np.repeat(np.cumsum(counts) - counts, counts)
    terms = np.zeros((servers, int(counts.max())))
    terms[devices[by_device], place] = seconds[by_device]
    group = tally._degree if stage == "dit" else 1  # a DiT task on a USP group
    busy = tally.busy[pool]
    for device, total in enumerate(ordered_row_sums(terms).tolist()):
        if counts[device]:
            for unit in range(device * group, (device + 1) * group):
                busy[unit] += total


class _Row:
    """One stream's row of each (streams × jobs) array :meth:`_Jobs.write` reads."""

    __slots__ = ("requests", "starts", "ends", "ctrl", "ready", "armed", "took", "played")

    def __init__(self, *rows: np.ndarray) -> None:
        (self.requests, self.starts, self.ends, self.ctrl, self.ready, self.armed,
         self.took, self.played) = rows
