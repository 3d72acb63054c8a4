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
                 freed_by_own: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, ends, devices) of jobs served in order by ``servers`` devices, each job on the
    lowest-numbered idle device, else on the first to free (Kiefer and Wolfowitz). A
    device is idle at a request if it freed before it, or at it where ``freed_by_own``
    (the request was made by the end that frees it). None where another end falls at a
    request's time: which device serves it then turns on the order of two events at one
    instant, which only the clock knows."""
    idle = list(range(servers))
    busy: list[tuple[float, int]] = []  # (free at, device)
    starts = np.empty(requests.size)
    ends = np.empty(requests.size)
    devices = np.empty(requests.size, dtype=np.int64)
    own = freed_by_own.tolist()
    for k, (request, job) in enumerate(zip(requests.tolist(), took.tolist(), strict=True)):
        while busy and busy[0][0] <= request:
            if busy[0][0] == request and not own[k]:
                return None
            heapq.heappush(idle, heapq.heappop(busy)[1])
        if idle:
            device, start = heapq.heappop(idle), request
        else:
            start, device = heapq.heappop(busy)
        starts[k] = start
        ends[k] = end = start + job
        devices[k] = device
        heapq.heappush(busy, (end, device))
    return starts, ends, devices


def row_bisect(rows_of: np.ndarray, rows: np.ndarray, values: np.ndarray,
               origins: np.ndarray, step: float) -> np.ndarray | None:
    """For each value, ``bisect_left`` of it in its row of ``rows_of`` (rows sorted,
    starting at the row's origin, about ``step`` apart): how many of the row's times come
    before it. Estimated from the step and corrected by comparison; None if the rows are
    too uneven for a few corrections."""
    width = rows_of.shape[1]
    at = np.clip(np.ceil((values - origins[rows]) / step), 0, width).astype(np.int64)
    for _ in range(8):
        below = (at > 0) & (rows_of[rows, np.maximum(at - 1, 0)] >= values)
        above = (at < width) & (rows_of[rows, np.minimum(at, width - 1)] < values)
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
