"""A quiet serving run's jobs in numpy: every stream's refill cycles at once, no Python a
job (DESIGN §6, the bulk engine).

:mod:`latsim.sim.bulk` plays a quiet run as a loop over the pools' requests and ends;
this module computes the same numbers as arrays, a row per stream and a column per job:

- a request follows the job before it as ``quiet_job_done`` has it (the next refill's due
  time from the ticks played by the job's end, then at once, or an armed wake-up at
  ``now + max(0, due + origin - now)``), one column of all streams at a time;
- the DiT pool serves the requests in their time order: Lindley's recursion for one
  device or group (:func:`~latsim.sim.lindley.fifo_one_server`), Kiefer and Wolfowitz's
  for several;
- requests depend on ends and ends on requests, so the two are iterated to their fixed
  point, which is the run's (it is causal: a value depends only on earlier ones), and
  the iteration is stopped where it does not settle.

What the loop checks as it goes (every tick played in Consume quiet by ``_play_quiet``'s
test, every wake-up on ``quiet_wake``'s fast path, no tick before its chunk) is checked
here over all ticks at once, after the fact. The result is written into the loop's own
books (:class:`~latsim.sim.bulk._Run`), whose ``finish`` makes the records, so the two
paths share their records code. Where the run is not one this module can tell exactly,
it leaves the books untouched and the loop plays it: a decode stage, a cost model with
no ``sample_many``, a job of no time, two requests at one instant (their order is the
clock's event ids), or, on several devices, an end at a request's instant. The loop
then gives back what does not stay quiet, as before.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np

from latsim.controller.machine import EPS, FORGET_JOBS_AT
from latsim.controller.records import JobRecord
from latsim.run.records import BusyTally
from latsim.run.serving import TaskRecord
from latsim.sim.bulk import _Run, _Stream
from latsim.sim.lindley import (
    fifo_one_server,
    fifo_servers,
    ordered_row_sums,
    row_bisect,
)

#: Rounds of requests-from-ends and ends-from-requests before the loop plays the run
#: instead (a round settles at least the earliest job still moving).
MAX_ROUNDS = 24


class _NotExact(Exception):
    """This module cannot tell the run exactly: the loop plays it."""


def play_in_numpy(run: _Run) -> bool:
    """Fill ``run``'s books as its loop would leave them at the run's end, and say True;
    or leave them untouched and say False (the loop plays it)."""
    draws = getattr(run.cost, "sample_many", None)
    if run.decode_pool is not None or draws is None:
        return False
    rngs = [s.rng for s in run.streams]
    saved = [rng.bit_generator.state for rng in rngs]
    try:
        jobs = _Jobs(run, draws)
    except _NotExact:
        for rng, state in zip(rngs, saved, strict=True):
            rng.bit_generator.state = state
        return False
    for rng, state, count in zip(rngs, saved, jobs.requested.sum(axis=1).tolist(),
                                 strict=True):
        rng.bit_generator.state = state  # the draws the run made, and no more
        draws(run.K, rng, count, "refill")
    jobs.write(run)
    return True


class _Jobs:
    """Every stream's jobs as (streams × jobs) arrays: request, start and end times (global),
    the pool's device and batch, and what the ticks say of each."""

    def __init__(self, run: _Run, draws: Callable[..., np.ndarray]) -> None:
        self.run = run
        K, delta, lead, end = run.K, run.delta, run.refill_lead, run.end
        self.clock = run.clock
        self.origins = origins = np.array([s.origin for s in run.streams])
        streams = len(run.streams)
        period = K * delta
        # no request comes before its due time, (j K) δ - lead from the stream's start
        self.width = width = int(np.ceil((end - origins.min() + lead) / period)) + 2
        self.took = np.array([draws(K, s.rng, width, "refill") for s in run.streams])
        if not (self.took > 0.0).all():
            raise _NotExact  # a job of no time ends at its start: the clock orders those
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
        # a first guess: every job starts at its request
        for column in range(width - 1):
            ends = requests[:, column] + self.took[:, column]
            self._follow(ends[:, None], column, requests, self.armed)
        for _ in range(MAX_ROUNDS):
            self._serve()
            following = np.full_like(requests, np.inf)
            following[:, 0] = requests[:, 0]
            armed = np.full_like(self.armed, np.nan)
            armed[:, 0] = self.armed[:, 0]
            self._follow(self.ends, None, following, armed)
            if np.array_equal(following, self.requests):
                break
            self.requests, self.armed = following, armed
        else:
            raise _NotExact
        self._check_ticks()

    # ------------------------------------------------------------ requests from ends

    def _follow(self, ends: np.ndarray, column: int | None, into: np.ndarray,
                armed: np.ndarray) -> None:
        """``quiet_job_done`` for every job of ``ends`` that ends within the run (all
        columns, or the one given): the ticks played by its end, its stall check, and the
        next job's request (at once, or armed) into the next column."""
        run = self.run
        first = 0 if column is None else column
        rows, places = np.nonzero(ends < run.end)
        if not rows.size:
            return
        done = ends[rows, places]
        cols = places + first
        played = row_bisect(self.clock, rows, done, self.origins, run.delta)
        if played is None:
            raise _NotExact
        if (played > (cols + 1) * run.K).any():
            raise _NotExact  # a tick before the chunk was ready: a stall (the loop says)
        if (cols + 1 >= self.width).any():
            raise _NotExact  # more jobs than the bound: not a quiet run
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
        """The DiT pool's FIFO over every request made within the run, in time order."""
        run = self.run
        requests = self.requests
        self.requested = requested = requests < run.end
        flat = np.flatnonzero(requested)
        order = flat[np.argsort(requests.flat[flat], kind="stable")]
        times = requests.flat[order]
        if (times[1:] == times[:-1]).any():
            raise _NotExact  # two requests at one instant: served in event id order
        took = self.took.flat[order]
        servers = len(run.dit_pool.free)
        if servers == 1:
            ends = fifo_one_server(times, took)
            starts = np.maximum(times, np.concatenate(([-np.inf], ends[:-1])))
            devices = np.zeros(order.size, dtype=np.int64)
        else:
            at_once = np.isnan(self.armed.flat[order]) & (order % self.width > 0)
            served = fifo_servers(times, took, servers, at_once)
            if served is None:
                raise _NotExact
            starts, ends, devices = served
            in_order = np.sort(ends)
            if (in_order[1:] == in_order[:-1]).any():
                raise _NotExact  # two ends at one instant
        self.order = order
        self.ends = np.full_like(requests, np.inf)
        self.ends.flat[order] = ends
        self.starts = np.full_like(requests, np.inf)
        self.starts.flat[order] = starts
        self.devices = devices

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
        """Ticks ``first .. upto - 1`` of each row, played in Consume: each quiet."""
        run = self.run
        counts = np.maximum(upto - first, 0)
        total = int(counts.sum())
        if not total:
            return
        which = np.repeat(np.arange(rows.size), counts)
        ticks = first[which] + (np.arange(total) - np.repeat(np.cumsum(counts) - counts,
                                                             counts))
        row = rows[which]
        t = self.clock[row, ticks] - self.origins[row]
        due = (t + run.delta) + (planned_end[which] - (ticks + 1)) * run.delta \
            - run.refill_lead
        if ((due <= t + EPS) | (np.abs(armed[which] - due) > EPS)).any():
            raise _NotExact

    # ------------------------------------------------------------ the books

    def write(self, run: _Run) -> None:
        """The loop's books as the run's end finds them: each stream's state and records,
        the tasks done (or their tally) and those still running."""
        end = run.end
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
        columns = zip(requests.tolist(), starts.tolist(), ends.tolist(),
                      ctrl_start.tolist(), (ends - origins).tolist(), self.armed.tolist(),
                      self.took.tolist(), strict=True)
        for i, (stream, (r, s, e, ctrl, ready, armed, took)) in enumerate(
                zip(run.streams, columns, strict=True)):
            self._write_stream(run, stream, r, s, e, ctrl, ready, armed, took, requested_n[i],
                               done_n[i], done_played[i],
                               None if tally_seconds is None else
                               BusyTally(tally_seconds[i], started_in_window[i]))
        self._write_tasks(run, started, done)

    def _played(self, done: np.ndarray, ends: np.ndarray) -> list[list[int]]:
        """Ticks played by each done job's end, a list a stream."""
        rows, cols = np.nonzero(done)
        played = np.zeros(done.shape, dtype=np.int64)
        if rows.size:
            found = row_bisect(self.clock, rows, ends[rows, cols], self.origins,
                               self.run.delta)
            assert found is not None  # found in _follow already
            played[rows, cols] = found
        return played.tolist()

    def _write_stream(self, run: _Run, stream: _Stream, r: list[float], s: list[float],
                      e: list[float], ctrl: list[float], ready: list[float],
                      armed: list[float],
                      took: list[float], requested: int, done: int, played: list[int],
                      tally: BusyTally | None) -> None:
        K, end, origin = run.K, run.end, stream.origin
        stream.jobs.append(JobRecord(0, "prebuffer", 0, K, 0, 0, 0.0, 0.0))
        kept = range(1, done + 1) if not run.forget else _kept_jobs(done, played, K)
        if isinstance(kept, range):  # the columns as slices (map makes them fastest)
            starts, readies = ctrl[kept.start - 1:done], ready[kept.start - 1:done]
        else:
            starts, readies = [ctrl[j - 1] for j in kept], [ready[j - 1] for j in kept]
        branches = [j * K for j in kept]
        stream.jobs.extend(map(JobRecord, kept, repeat("refill"), branches, repeat(K),
                               repeat(0), branches, starts, readies))
        stream.jobs_done = done
        stream.next_job = requested + 1
        stream.planned_end = (requested + 1) * K
        stream.tally = tally
        running = done < requested  # a job requested and not done: in flight or waiting
        first = 1 if tally is None else done + 1  # the tally holds the jobs done
        for j in range(first, requested + 1):
            stream.starts[j] = r[j - 1] - origin
            if s[j - 1] < end:
                stream.ran[j] = ((s[j - 1] - origin, e[j - 1] - origin) if j <= done else
                                 (s[j - 1] - origin, s[j - 1] - origin + took[j - 1]))
        if running:
            job = requested
            stream.job = job
            stream.branch = job * K
            stream.ctrl_start = ctrl[job - 1]
            at = r[job - 1]
            woken_at = at if armed[job - 1] == armed[job - 1] else None  # not NaN
            # the ticks played when the job was asked for: at its wake-up, else at the
            # end of the job before it (or the start)
            stream.played = (self._bisect(stream, at) if woken_at is not None
                             else (played[job - 2] if job > 1 else 0))
            stream.armed = None
        else:
            stream.job = 0
            stream.branch = done * K
            stream.played = played[done - 1] if done else 0
            stream.armed = armed[requested] if requested < len(armed) else None

    @staticmethod
    def _bisect(stream: _Stream, at: float) -> int:
        from bisect import bisect_left
        return bisect_left(stream.clock, at)

    def _write_tasks(self, run: _Run, started: np.ndarray, done: np.ndarray) -> None:
        """The DiT tasks: those done, in the order they ended (records or a tally), then
        those still running, in batch order, for ``finish`` to close."""
        order = self.order
        width = self.width
        flat_started = started.flat[order]
        dispatched = order[flat_started]
        batches = np.arange(1, dispatched.size + 1)
        devices = self.devices[flat_started]
        ended = done.flat[dispatched]
        rows, cols = np.divmod(dispatched, width)
        requests = self.requests.flat[dispatched]
        starts = self.starts.flat[dispatched]
        ends = self.ends.flat[dispatched]
        by_end = np.flatnonzero(ended)
        by_end = by_end[np.argsort(ends[by_end], kind="stable")]
        pool = run.dit_pool
        run.batches = int(dispatched.size)
        if run.task_tally is None:
            run.tasks.extend(
                TaskRecord(row, col + 1, "dit", "refill", pool.name, device, batch,
                           request, start, stop)
                for row, col, device, batch, request, start, stop in zip(
                    rows[by_end].tolist(), cols[by_end].tolist(),
                    devices[by_end].tolist(), batches[by_end].tolist(),
                    requests[by_end].tolist(), starts[by_end].tolist(),
                    ends[by_end].tolist(), strict=True))
        else:
            self._tally_tasks(run, devices[by_end], batches[by_end], requests[by_end],
                              starts[by_end], ends[by_end])
        streams = run.streams
        for k in np.flatnonzero(~ended).tolist():
            stream = streams[int(rows[k])]
            run.running[int(batches[k])] = (stream, pool, int(devices[k]), float(starts[k]),
                                            float(requests[k]))

    def _tally_tasks(self, run: _Run, devices: np.ndarray, batches: np.ndarray,
                     requests: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """``TaskTally.add_values`` for each task done, in the order they ended: waits and
        chunk latencies appended, busy seconds summed a device at a time in that order."""
        tally = run.task_tally
        assert tally is not None
        if not batches.size:
            return
        waits = tally.waits.setdefault("dit", array("d"))
        waits.frombytes((starts - requests).tobytes())
        tally.chunks.frombytes((ends - requests).tobytes())
        window_end = tally._window_end
        seconds = np.maximum(0.0, np.minimum(ends, window_end) - np.maximum(starts, 0.0))
        servers = len(run.dit_pool.free)
        counts = np.bincount(devices, minlength=servers)
        by_device = np.argsort(devices, kind="stable")
        place = np.arange(devices.size) - np.repeat(np.cumsum(counts) - counts, counts)
        terms = np.zeros((servers, int(counts.max())))
        terms[devices[by_device], place] = seconds[by_device]
        sums = ordered_row_sums(terms).tolist()
        group = tally._degree
        busy = tally.busy[run.dit_pool.name]
        for device, total in enumerate(sums):
            if counts[device]:
                for unit in range(device * group, (device + 1) * group):
                    busy[unit] += total
        tally._last = (run.dit_pool.name, int(devices[-1]), int(batches[-1]))


def _kept_jobs(done: int, played: list[int], K: int) -> Sequence[int]:
    """The refill jobs a stream keeps at ``records="none"``: ``quiet_job_done`` forgets,
    each time the list reaches :data:`FORGET_JOBS_AT`, every job whose chunk is no longer
    cached (``played`` is the ticks played by each job's end)."""
    kept: list[int] = []
    last = 0
    while True:
        upto = last + max(1, FORGET_JOBS_AT - 1 - len(kept))
        if upto > done:
            return kept + list(range(last + 1, done + 1)) if last else range(1, done + 1)
        kept += range(last + 1, upto + 1)
        oldest = played[upto - 1] // K  # the chunks cached: oldest .. upto
        kept = [j for j in kept if oldest <= j <= upto]
        last = upto
