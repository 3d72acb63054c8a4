"""The numpy kernels of the bulk engine (:mod:`latsim.sim.bulk`): a FIFO pool's starts
and ends (Lindley's recursion for one server, Kiefer and Wolfowitz's for several), where a
time falls among a stream's ticks, and sums in a fixed order.

Every kernel gives the bits the event path computes, not merely close values: an end is
``max(request, device free) + took`` for each job, as the clock's events compute it; a
sum adds its terms one at a time in the order given (``numpy.add.accumulate`` adds in
order; ``numpy.sum`` pairs terms and would round differently). Nothing here knows about
streams, controllers or records.
"""

from __future__ import annotations

import heapq
from itertools import repeat

import numpy as np

#: Jacobi passes of :func:`fifo_one_server` before the rest is played one job at a time
#: (a pass settles one more job of every busy period; a long one is cheaper in a loop).
MAX_PASSES = 48


def fifo_one_server(requests: np.ndarray, took: np.ndarray) -> np.ndarray:
    """The ends of jobs served in order by one server: ``end[k] = max(requests[k],
    end[k-1]) + took[k]``, ``requests`` in the order served. Each pass recomputes only
    the jobs whose predecessor's end moved, so a pass costs what still waits; after
    :data:`MAX_PASSES` the jobs left are played in a Python loop."""
    ends = requests + took
    active = np.flatnonzero(requests[1:] < ends[:-1]) + 1  # those that wait
    for _ in range(MAX_PASSES):
        if not active.size:
            return ends
        moved = np.maximum(requests[active], ends[active - 1]) + took[active]
        changed = active[moved != ends[active]]
        ends[active] = moved
        active = changed[changed + 1 < ends.size] + 1
    if active.size:  # every job before the first left already satisfies the recursion
        first = int(active[0])
        r, t, e = requests[first:].tolist(), took[first:].tolist(), ends.tolist()
        free = e[first - 1]
        for k in range(len(r)):
            request = r[k]
            free = (request if request > free else free) + t[k]
            e[first + k] = free
        ends = np.array(e)
    return ends


def fifo_servers(requests: np.ndarray, took: np.ndarray, servers: int,
                 request_rank: np.ndarray | None = None, end_rank: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, devices, freed_by) of jobs served in order by ``servers`` devices,
    each job on the lowest-numbered idle device, else on the first to free (Kiefer and
    Wolfowitz). Two events at one instant come in rank order: a device is idle at a
    request if the end that frees it comes before it, by (time, ``end_rank``) against
    (time, ``request_rank``), or is the request's own event (equal ranks). ``freed_by``
    is the place of the job whose end dispatched each job (-1: dispatched as it asked).
    Without ranks, an end at a request's instant comes first."""
    idle = list(range(servers))
    busy: list[tuple[float, float, int, int]] = []  # (free at, its end's rank, device, job)
    starts = np.empty(requests.size)
    ends = np.empty(requests.size)
    devices = np.empty(requests.size, dtype=np.int64)
    freed_by = np.full(requests.size, -1, dtype=np.int64)
    ranks = repeat(0.0, requests.size) if request_rank is None else request_rank.tolist()
    done_ranks = repeat(0.0, requests.size) if end_rank is None else end_rank.tolist()
    for k, (request, job, rank, done_rank) in enumerate(zip(
            requests.tolist(), took.tolist(), ranks, done_ranks, strict=True)):
        mine = (request, rank)
        while busy and busy[0][:2] <= mine:
            heapq.heappush(idle, heapq.heappop(busy)[2])
        if idle:
            device, start = heapq.heappop(idle), request
        else:
            start, _, device, freed_by[k] = heapq.heappop(busy)
        starts[k] = start
        ends[k] = end = start + job
        devices[k] = device
        heapq.heappush(busy, (end, done_rank, device, k))
    return starts, ends, devices, freed_by


def event_ranks(times: np.ndarray, parents: np.ndarray, places: np.ndarray,
                most: int = 64) -> np.ndarray | None:
    """Each event's place in the clock's order: by time, then by when it was scheduled,
    which is its parent's place (``parents``: an event's index, -1 for none) and then its
    place among the parent's (``places``). A parent comes strictly before its children in
    time, so each pass settles one more generation of ties; None after ``most``."""
    ranks = np.empty(times.size, dtype=np.int64)
    ranks[np.lexsort((places, times))] = np.arange(times.size)
    for _ in range(most):
        parent_ranks = np.where(parents >= 0, ranks[np.maximum(parents, 0)], -1)
        settled = np.empty_like(ranks)
        settled[np.lexsort((places, parent_ranks, times))] = np.arange(times.size)
        if np.array_equal(settled, ranks):
            return ranks
        ranks = settled
    return None


def row_bisect(rows_of: np.ndarray, rows: np.ndarray, values: np.ndarray,
               origins: np.ndarray, step: float) -> np.ndarray | None:
    """For each value, ``bisect_left`` of it in its row of ``rows_of`` (rows sorted,
    starting at the row's origin, about ``step`` apart): how many of the row's times come
    before it. Estimated from the step and corrected by comparison; None if the rows are
    too uneven for a few corrections."""
    width = rows_of.shape[1]
    at = np.clip(np.ceil((values - origins[rows]) / step), 0, width).astype(np.int64)
    flat = rows_of.ravel()  # a row's place in it from its start (1-D takes cost less)
    first = rows * width
    last = first + (width - 1)
    for _ in range(8):
        place = first + at
        below = (at > 0) & (flat.take(np.maximum(place - 1, first)) >= values)
        above = (at < width) & (flat.take(np.minimum(place, last)) < values)
        if not (below.any() or above.any()):
            return at
        at = at - below + above
    return None


def ordered_row_sums(terms: np.ndarray) -> np.ndarray:
    """Each row's terms summed left to right from 0.0, as ``total += term`` sums them (a
    row's unused places hold 0.0, which leaves a sum of non-negative terms as it was)."""
    if not terms.shape[1]:
        return np.zeros(terms.shape[0])
    return np.add.accumulate(terms, axis=1)[:, -1]
