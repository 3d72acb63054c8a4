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


def _servers_loop(requests, took, servers):
    """The event path's rule, one job at a time: idle devices (lowest first) at a request,
    else the first to free."""
    idle, busy, out = list(range(servers)), [], []
    for request, job in zip(requests, took, strict=True):
        while busy and busy[0][0] < request:
            heapq.heappush(idle, heapq.heappop(busy)[1])
        if idle:
            device, start = heapq.heappop(idle), request
        else:
            start, device = heapq.heappop(busy)
        heapq.heappush(busy, (start + job, device))
        out.append((start, start + job, device))
    return out


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(0.001, 1.0), min_size=1, max_size=200),
       servers=st.integers(2, 6), seed=st.integers(0, 99))
def test_several_servers_serve_as_the_loop_does(gaps, servers, seed):
    requests = np.cumsum(gaps)
    took = np.random.default_rng(seed).uniform(0.1, 3.0, requests.size)
    served = lindley.fifo_servers(requests, took, servers, np.zeros(requests.size, bool))
    expected = _servers_loop(requests.tolist(), took.tolist(), servers)
    if served is None:  # an end at a request's instant: only the clock can order them
        ends = {e for _, e, _ in expected}
        assert any(r in ends for r in requests.tolist())
        return
    starts, ends, devices = served
    assert list(zip(starts.tolist(), ends.tolist(), devices.tolist(), strict=True)) == expected


def test_an_end_at_a_requests_instant_is_left_to_the_clock_unless_it_is_the_requesters():
    requests, took = np.array([0.0, 1.0]), np.array([1.0, 1.0])
    assert lindley.fifo_servers(requests, took, 2, np.array([False, False])) is None
    served = lindley.fifo_servers(requests, took, 2, np.array([False, True]))
    assert served is not None and served[2].tolist() == [0, 0]  # its own device, freed


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
