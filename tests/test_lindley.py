"""The bulk engine's numpy kernels (:mod:`latsim.sim.lindley`) give the bits a plain loop
gives: a FIFO pool's ends one job at a time, ``bisect_left`` in a row, sums in order."""

from __future__ import annotations

import heapq
from bisect import bisect_left

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from latsim.model.costs import AffineCost, FixedCost, LognormalCost
from latsim.sim import lindley


def _one_server_loop(requests: list[float], took: list[float]) -> list[float]:
    ends, free = [], -np.inf
    for request, job in zip(requests, took, strict=True):
        free = max(request, free) + job
        ends.append(free)
    return ends


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=300),
       took=st.floats(0.01, 1.5), spread=st.floats(0.0, 0.9), seed=st.integers(0, 99))
def test_one_server_ends_are_the_loops_bit_for_bit(gaps, took, spread, seed):
    """Busy periods of every length, past MAX_PASSES included (the rest then in a loop)."""
    requests = np.cumsum(gaps)
    jobs = took * (1 + spread * np.random.default_rng(seed).uniform(-1, 1, requests.size))
    ends = lindley.fifo_one_server(requests.copy(), jobs)
    assert ends.tolist() == _one_server_loop(requests.tolist(), jobs.tolist())


def test_a_busy_period_longer_than_the_passes_is_finished_in_a_loop():
    requests = np.arange(500) * 0.1
    jobs = np.full(500, 0.3)  # every job waits: one busy period of 500
    ends = lindley.fifo_one_server(requests, jobs)
    assert ends.tolist() == _one_server_loop(requests.tolist(), jobs.tolist())
    assert lindley.MAX_PASSES < 500


def _servers_loop(requests, took, servers, ranks, end_ranks):
    """The event path's rule, one job at a time: idle devices (lowest first) at a request
    (freed by an end before it in the clock's order), else the first to free."""
    idle, busy, out = list(range(servers)), [], []
    for k, (request, job) in enumerate(zip(requests, took, strict=True)):
        while busy and (busy[0][0], busy[0][1]) <= (request, ranks[k]):
            heapq.heappush(idle, heapq.heappop(busy)[2])
        if idle:
            device, start = heapq.heappop(idle), request
        else:
            start, _, device = heapq.heappop(busy)
        heapq.heappush(busy, (start + job, end_ranks[k], device))
        out.append((start, start + job, device))
    return out


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=200),
       servers=st.integers(2, 6), seed=st.integers(0, 99))
def test_several_servers_serve_as_the_loop_does(gaps, servers, seed):
    """Requests and ends on a grid of quarters, so that many fall at one instant (their
    ranks then order them)."""
    requests = np.cumsum(gaps)
    rng = np.random.default_rng(seed)
    took = rng.choice([0.25, 0.5, 1.0, 1.5], requests.size)
    ranks = rng.permutation(requests.size).astype(float)
    end_ranks = rng.permutation(requests.size).astype(float) + requests.size
    starts, ends, devices, freed_by = lindley.fifo_servers(requests, took, servers, ranks,
                                                           end_ranks)
    expected = _servers_loop(requests.tolist(), took.tolist(), servers, ranks.tolist(),
                             end_ranks.tolist())
    assert list(zip(starts.tolist(), ends.tolist(), devices.tolist(), strict=True)) == expected
    waited = freed_by >= 0
    assert (ends[freed_by[waited]] == starts[waited]).all()
    assert (starts[~waited] == requests[~waited]).all()


def test_an_end_at_a_requests_instant_frees_its_device_first_if_it_comes_first():
    requests, took = np.array([0.0, 1.0]), np.array([1.0, 1.0])
    later = lindley.fifo_servers(requests, took, 2, np.array([0.0, 1.0]), np.array([2.0, 3.0]))
    assert later[2].tolist() == [0, 1]  # the end came after the request: device 1
    first = lindley.fifo_servers(requests, took, 2, np.array([0.0, 2.0]), np.array([1.0, 3.0]))
    assert first[2].tolist() == [0, 0] and first[3].tolist() == [-1, -1]


def test_event_ranks_order_ties_by_when_they_were_scheduled():
    """Two events at t = 2 scheduled by events at t = 1 (in rank order b, a) come in that
    order; a chain of ties settles a generation a pass."""
    times = np.array([0.0, 1.0, 1.0, 2.0, 2.0])
    parents = np.array([-1, 0, 0, 2, 1])
    places = np.array([0, 1, 0, 0, 0])
    ranks = lindley.event_ranks(times, parents, places)
    assert ranks.tolist() == [0, 2, 1, 3, 4]
    assert lindley.event_ranks(times, parents, places, most=0) is None


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 5), width=st.integers(1, 40), seed=st.integers(0, 99))
def test_row_bisect_is_bisect_left_in_each_row(rows, width, seed):
    rng = np.random.default_rng(seed)
    origins = rng.uniform(0, 3, rows)
    step = 0.25
    matrix = origins[:, None] + np.cumsum(np.full((rows, width), step), axis=1) - step
    which = rng.integers(0, rows, 50)
    values = np.concatenate([matrix[which, rng.integers(0, width, 50)],  # on a tick
                             rng.uniform(-1, width * step + 4, 50)])
    which = np.concatenate([which, rng.integers(0, rows, 50)])
    found = lindley.row_bisect(matrix, which, values, origins, step)
    assert found is not None
    assert found.tolist() == [bisect_left(matrix[r].tolist(), v)
                              for r, v in zip(which.tolist(), values.tolist(), strict=True)]


def test_ordered_row_sums_add_left_to_right():
    terms = np.array([[0.1, 0.2, 0.3, 1e16, -1e16 + 2.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    totals = []
    for row in terms.tolist():
        total = 0.0
        for term in row:
            total += term
        totals.append(total)
    assert lindley.ordered_row_sums(terms).tolist() == totals
    assert lindley.ordered_row_sums(np.zeros((3, 0))).tolist() == [0.0] * 3


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 50),
       cost=st.sampled_from([FixedCost(0.3), AffineCost(0.1, 0.02), LognormalCost(0.4, 0.5),
                             LognormalCost(0.4, 0.0)]))
def test_sample_many_is_n_samples_and_leaves_the_stream_where_they_do(seed, n, cost):
    one, many = np.random.default_rng(seed), np.random.default_rng(seed)
    singles = [cost.sample(8, one) for _ in range(n)]
    assert cost.sample_many(8, many, n).tolist() == singles
    assert one.bit_generator.state == many.bit_generator.state
