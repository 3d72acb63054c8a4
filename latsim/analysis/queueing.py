"""Closed forms for streams sharing a device (DESIGN §6): the nD/D/1 queue, and the
nD/D/c queue of a pool of c devices (or USP groups) serving one FIFO.

N streams on one FIFO device, each sending one job of fixed service time C every period T
(its refills, while it keeps up) with an independent phase uniform on ``[0, T)`` (a random
start), and ``N·C < T``. Its unfinished work at a random time (the *virtual* wait V) has the
closed-form distribution of Roberts & Virtamo (J. W. Roberts, J. T. Virtamo, "The
superposition of periodic cell arrival streams in an ATM multiplexer", IEEE Trans. Commun.
39(2):298–303, 1991; also Humblet, Bhargava & Hluchyj, IEEE/ACM Trans. Networking 1(1), 1993),
in service units ``u = x/C`` with ``D = T/C``::

    P(V > u) = Q(u; N, D) = Σ_{n=⌊u⌋+1}^{N} binom(N, n) ((n−u)/D)^n (1 − (n−u)/D)^(N−n)
                                             · (D − N + u) / (D − n + u)

A job's own wait W is the work the *other* N − 1 streams left (its own previous job is done:
the device idles within every period when N·C < T), so ``P(W > u) = Q(u; N − 1, D)``.
Integrating term by term gives the means as finite sums of binomial tails (below), and they
satisfy E[V] = ρ (E[W] + C/2) with ρ = N·C/T (Brumelle 1971). An independent Monte Carlo
of the Lindley recursion (4 million phase draws per case, N up to 50) matched both means
within its standard error when these were derived.

**A pool: the nD/D/c queue.** With c devices serving one FIFO queue and every job the same
service time C, jobs leave in the order they start, so the j-th job takes the device the
(j − c)-th one frees: ``start_j = max(a_j, start_{j−c} + C)`` (for c = 1, Lindley's
recursion). No closed form of its stationary wait is used here: :func:`pool_wait_quantile`
plays that recursion over independent uniform phase draws, period after period from empty
until the waits repeat (the periodic regime every draw reaches when N·C < c·T), and reads
the quantile off every job's wait in the last period (a fixed seed, so the same inputs
give the same answer).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from latsim.errors import LatsimError
from latsim.numeric import least_true


def _log_binom(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def binomial_tail(m: int, p: float, k: int) -> float:
    """P(Bin(m, p) >= k)."""
    if k <= 0:
        return 1.0
    if k > m:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)

    def term(j: int) -> float:
        return math.exp(_log_binom(m, j) + j * log_p + (m - j) * log_q)

    if k > m * p:
        return sum(term(j) for j in range(k, m + 1))
    return 1.0 - sum(term(j) for j in range(k))


def _check(streams: int, period: float, service: float) -> float:
    if not (isinstance(streams, int) and streams >= 1):
        raise LatsimError(f"streams must be a positive integer, got {streams!r}")
    if not (math.isfinite(period) and period > 0 and math.isfinite(service) and service > 0):
        raise LatsimError("period and service time must be positive")
    # a subnormal service time (1e-320 s) makes T/C overflow to inf, and the sums' logs a
    # domain error: past 1e300 the waits are 0 to every float's precision anyway
    ratio = min(period / service, 1e300)
    if streams >= ratio:
        raise LatsimError(f"{streams} streams of service {service:g} s every {period:g} s "
                          "overload the device (N·C >= T): no stationary wait")
    return ratio


def _work_mean_units(sources: int, ratio: float) -> float:
    """E[unfinished work] / C of ``sources`` periodic sources (period ``ratio`` · C)."""
    return sum(ratio / (sources + 1) * binomial_tail(sources + 1, n / ratio, n + 1)
               - binomial_tail(sources, n / ratio, n + 1)
               for n in range(1, sources + 1))


def periodic_wait_mean(streams: int, period: float, service: float) -> float:
    """E[W] (s): the mean wait of a job for the device, N streams of period T, service C."""
    ratio = _check(streams, period, service)
    return service * _work_mean_units(streams - 1, ratio)


def periodic_work_mean(streams: int, period: float, service: float) -> float:
    """E[V] (s): the device's mean unfinished work at a random time; what a job arriving
    from outside the N periodic streams (say, a rare replan) waits on average."""
    ratio = _check(streams, period, service)
    return service * _work_mean_units(streams, ratio)


def periodic_wait_survival(x: float, streams: int, period: float, service: float) -> float:
    """P(W > x): the chance a job waits longer than ``x`` seconds for the device."""
    ratio = _check(streams, period, service)
    return _survival(x / service, streams - 1, ratio)


def _survival(u: float, sources: int, ratio: float) -> float:
    """Q(u; sources, D): P(unfinished work of ``sources`` periodic sources > u·C)."""
    if u < 0:
        return 1.0 if sources else 0.0
    if u >= sources:
        return 0.0
    total = 0.0
    for n in range(math.floor(u) + 1, sources + 1):
        a = (n - u) / ratio
        total += math.exp(_log_binom(sources, n) + n * math.log(a)
                          + (sources - n) * math.log1p(-a)
                          + math.log(ratio - sources + u) - math.log(ratio - n + u))
    return min(max(total, 0.0), 1.0)


def overload_stall_fraction(streams: int, period: float, service: float,
                            devices: int = 1) -> float:
    """The long-run stall fraction of each of N identical streams on ``devices`` devices
    when they overload them (ρ = N·C/(devices·T) > 1): the devices produce ``1/ρ`` of the
    content the streams play, so each stalls ``1 − 1/ρ`` of the time (0 when ρ <= 1)."""
    rho = streams * service / (devices * period)
    return max(0.0, 1.0 - 1.0 / rho) if rho > 0 else 0.0


def periodic_wait_quantile(level: float, streams: int, period: float, service: float
                           ) -> float:
    """The ``level`` quantile of W (s): the least ``x`` with P(W > x) <= 1 − ``level``, by
    bisection on the survival function (to 1e-9 of C); 0 with one stream. W is the other
    N − 1 streams' unfinished work, which a job of one stream arriving at a random time
    (a replan) also finds: its own stream has no job in the queue ahead of it."""
    ratio = _check(streams, period, service)
    if not 0 < level < 1:
        raise LatsimError(f"quantile level must be in (0, 1), got {level!r}")
    tail, sources = 1.0 - level, streams - 1
    if _survival(0.0, sources, ratio) <= tail:
        return 0.0
    low, high = 0.0, float(sources)  # W < (N − 1)·C: the others' jobs at most, in units of C
    return least_true(lambda x: _survival(x, sources, ratio) <= tail, low, high,
                      1e-9) * service


#: Phase draws behind :func:`pool_wait_quantile`. A draw's share of jobs past the answer
#: varies at most as a Bernoulli's, so the level it holds is off by a standard error of at
#: most sqrt(p(1 − p)/4096): 0.0016 at the 0.99 level (tests/test_serving.py checks it
#: against the simulator).
POOL_PHASE_DRAWS = 4096
#: The seed of those draws: the same inputs give the same quantile.
POOL_PHASE_SEED = 20_261_205


def pool_wait_quantile(level: float, streams: int, servers: int, period: float,
                       service: float) -> float:
    """The ``level`` quantile of a job's wait (s) for one of ``servers`` devices (or USP
    groups) that serve ``streams`` periodic streams from one FIFO queue, each stream's job
    ``service`` seconds every ``period``, phases uniform and independent: the nD/D/c queue
    (module docstring). One server is the nD/D/1 closed form
    (:func:`periodic_wait_quantile`); as many servers as streams never wait."""
    if not (isinstance(servers, int) and servers >= 1):
        raise LatsimError(f"servers must be a positive integer, got {servers!r}")
    if not 0 < level < 1:
        raise LatsimError(f"quantile level must be in (0, 1), got {level!r}")
    if servers == 1:
        return periodic_wait_quantile(level, streams, period, service)
    waits = pool_waits(streams, servers, period, service)
    allowed = math.floor((1.0 - level) * waits.size)  # waits that may exceed the answer
    return float(waits[waits.size - allowed - 1])


@functools.lru_cache(maxsize=256)
def _pool_waits(streams: int, servers: int, ratio: float) -> np.ndarray:
    """Every job's wait (in units of C, sorted) in the periodic regime of
    :data:`POOL_PHASE_DRAWS` phase draws of ``streams`` streams on ``servers`` devices,
    period ``ratio`` = T/C."""
    import numpy as np

    rng = np.random.default_rng(POOL_PHASE_SEED)
    phases = np.sort(rng.uniform(0.0, ratio, (POOL_PHASE_DRAWS, streams)), axis=1)
    freed = np.full((POOL_PHASE_DRAWS, servers), -np.inf)  # start + 1 of the last c jobs
    last = None
    # from empty the waits grow period by period to the periodic regime, which they reach
    # exactly: a bound on the periods keeps a pathological draw from looping for ever
    for period in range(10_000):
        waits = np.empty_like(phases)
        base = period * ratio
        for i in range(streams):
            slot = (period * streams + i) % servers
            arrival = phases[:, i] + base
            start = np.maximum(arrival, freed[:, slot])
            freed[:, slot] = start + 1.0
            waits[:, i] = start - arrival
        if last is not None and np.allclose(waits, last, rtol=0.0, atol=1e-9):
            break
        last = waits
    return np.sort(waits, axis=None)


def pool_waits(streams: int, servers: int, period: float, service: float) -> np.ndarray:
    """Every job's wait (s, sorted) behind :func:`pool_wait_quantile`: the nD/D/c queue's
    periodic regime over :data:`POOL_PHASE_DRAWS` phase draws (zeros where no job waits:
    as many servers as streams). Read only: the array is shared with later calls."""
    import numpy as np

    if not (isinstance(servers, int) and servers >= 1):
        raise LatsimError(f"servers must be a positive integer, got {servers!r}")
    if not (isinstance(streams, int) and streams >= 1):
        raise LatsimError(f"streams must be a positive integer, got {streams!r}")
    if not (math.isfinite(period) and period > 0 and math.isfinite(service) and service > 0):
        raise LatsimError("period and service time must be positive")
    if streams * service >= servers * period:
        raise LatsimError(f"{streams} streams of service {service:g} s every {period:g} s "
                          f"overload {servers} devices (N·C >= c·T): no stationary wait")
    if streams <= servers:
        return np.zeros(1)
    return _pool_waits(streams, servers, period / service) * service


def pool_stall_budget(stall: float, streams: int, servers: int, period: float,
                      service: float) -> float:
    """The least wait budget s >= 0 (s) with E[(W − s)+] <= ``stall`` seconds per job, W
    the nD/D/c wait of :func:`pool_waits`: ``--lead auto``'s stall-targeted rule
    (:func:`latsim.model.lead.stall_targeted_wait`) on the queue's own waits instead of a
    pilot run's."""
    from latsim.model.lead import stall_targeted_wait

    waits = pool_waits(streams, servers, period, service)
    return stall_targeted_wait(waits[waits > 0].tolist(), stall * waits.size)


def erlang_loss_pmf(servers: int, load: float) -> list[float]:
    """P(m busy) for m = 0 … ``servers`` in an M/G/c/c loss system with offered ``load``
    (erlangs): the Poisson law truncated at c, whatever the holding-time law."""
    if load <= 0:
        return [1.0] + [0.0] * servers
    logs = [m * math.log(load) - math.lgamma(m + 1) for m in range(servers + 1)]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def erlang_b(servers: int, load: float, since: tuple[int, float] = (0, 1.0)) -> float:
    """The Erlang-B blocking probability of ``servers`` with offered ``load`` (erlangs): an
    M/G/c/c loss system, whatever the holding-time law. The stable recurrence B(0) = 1,
    B(k) = a·B(k−1) / (k + a·B(k−1)); ``since``: (j, B(j)) an earlier call gave at this
    load, to go on from there (the same float as from B(0))."""
    done, blocking = since
    for k in range(done + 1, servers + 1):
        blocking = load * blocking / (k + load * blocking)
    return blocking
