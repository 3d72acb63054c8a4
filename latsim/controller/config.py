"""What the controller is configured with (:class:`ControllerConfig`) and the values its
modes take. Plain data, kept apart from the controller's logic (:mod:`latsim.controller.
machine`): the compiled build compiles the logic, and a config stays an ordinary frozen
dataclass there, pickled for worker processes and validated with one-line errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from latsim.controller.policies import Policy
from latsim.controller.timing import Timing
from latsim.errors import LatsimError

#: When a replan gives up the replaceable future: ``on-start`` (the paper's rule: the cached
#: positions from the branch on are discarded when the replan starts, so a late replan
#: stalls the player) or ``on-ready`` (they stay playable until the replacement is ready).
DISCARD_MODES = ("on-start", "on-ready")
#: What a new condition does to chunks in flight (generated under an older one):
#: ``let-play`` (they play; the condition shows from the next chunk started, like chunk
#: commitment) or ``flush`` (a replan branches at once and the chunks in flight behind its
#: branch are dropped when they land, counted as discarded; like latent commitment).
IN_FLIGHT_POLICIES = ("let-play", "flush")
#: The most chunks one stream may have in flight.
MAX_IN_FLIGHT = 64
#: A pending condition whose replan branch would fall at (or past) the end of the cache,
#: under lazy commit: ``defer`` (start no job; the refill, due ``lead`` before that
#: position, takes the condition: DESIGN §2's rule, the default) or ``start`` (clamp the
#: branch to the cache end and start the replan at once, as an independent reference model
#: reads the paper). Under eager commit nothing cached is replaceable and both are ``defer``.
REPLAN_AT_CACHE_END = ("defer", "start")
#: When a job that waited for a shared device takes its condition (DESIGN §6): ``start``
#: (the newest version known when the device starts it, as a server assembles a job's
#: inputs at dispatch: the default) or ``enqueue`` (the version known when it was queued,
#: the reading before; kept for comparison). A worker that starts every job at once sends
#: no :class:`JobStarted`, and the two agree.
BIND_MODES = ("start", "enqueue")


@dataclass(frozen=True)
class AdaptiveLead:
    """An adaptive planning lead (``--lead adaptive``): each stream sets its next job's
    lead from the device waits it has seen, as TCP sets its retransmit timer from round
    trips, but with a running high quantile of the waits rather than mean + k·deviation.
    The lead is ``cost`` (the fixed part: C's quantile and the other stages', as ``--lead
    cost``) plus the wait estimate ``s``. When a job ends, its wait ``w`` (submission to
    device start, which :class:`JobStarted` reports; 0 for a job that started at once)
    moves ``s`` by the stochastic-approximation step for the ``quantile``:
    ``s += gain·cost·quantile`` where ``w > s``, else ``s −= gain·cost·(1 − quantile)``
    (never below 0), so that at rest a fraction ``1 − quantile`` of the waits exceed it.
    The first job's lead is the config's ``lead``: ``s`` starts at lead − cost, e.g. the
    nD/D/1 wait quantile, which is computed outside the controller.

    Jacobson/Karels (RFC 6298: mean + 4·deviation, gains 1/8 and 1/4) was tried first:
    streams that move their own leads reorder a FIFO queue and so move each other's
    waits, and its deviation term inflated the leads (L50 up to 0.6 s above the pilot's)
    and still missed the stall target (replan-first, staggered starts, ρ 0.8: 0.21 %).
    """

    cost: float
    quantile: float = 0.995
    gain: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cost) and self.cost >= 0):
            raise LatsimError(f"adaptive lead's cost part must be >= 0 seconds, got "
                              f"{self.cost!r}")
        if not 0 < self.quantile < 1:
            raise LatsimError(f"adaptive lead's quantile must be in (0, 1), got "
                              f"{self.quantile!r}")
        if not (math.isfinite(self.gain) and self.gain > 0):
            raise LatsimError(f"adaptive lead's gain must be > 0, got {self.gain!r}")

    @property
    def steps(self) -> tuple[float, float]:
        """(up, down): seconds a wait above the estimate adds to it, and one at or below
        it takes off."""
        step = self.gain * self.cost
        return step * self.quantile, step * (1.0 - self.quantile)


@dataclass(frozen=True)
class ControllerConfig:
    """What the controller needs to know: timing, policy, the planning lead (seconds), when
    a replan discards the old future (:data:`DISCARD_MODES`), how many chunks one stream
    may have in flight and what a new condition does to them (:data:`IN_FLIGHT_POLICIES`),
    ``run_ahead``: seconds beyond the lead that refills start early (a deeper buffer, as
    a pipeline that runs ahead keeps; replans still branch one lead ahead), and
    ``replan_at_cache_end`` (:data:`REPLAN_AT_CACHE_END`) and ``bind``, when a job that
    waited for a device takes its condition (:data:`BIND_MODES`).
    """

    timing: Timing
    policy: Policy
    lead: float
    discard: str = "on-start"
    in_flight: int = 1
    in_flight_policy: str = "let-play"
    run_ahead: float = 0.0
    replan_at_cache_end: str = "defer"
    bind: str = "start"
    adaptive: AdaptiveLead | None = None

    def __post_init__(self) -> None:
        self.policy.commit_unit(self.timing.K)
        if self.bind not in BIND_MODES:
            raise LatsimError(f"bind must be start or enqueue, got {self.bind!r}")
        if self.replan_at_cache_end not in REPLAN_AT_CACHE_END:
            raise LatsimError(f"replan at cache end must be defer or start, got "
                              f"{self.replan_at_cache_end!r}")
        if not (math.isfinite(self.lead) and self.lead >= 0):
            raise LatsimError(f"lead must be >= 0 seconds, got {self.lead!r}")
        if self.adaptive is not None and self.adaptive.cost > self.lead:
            raise LatsimError(f"an adaptive lead starts at or above its cost part: lead "
                              f"{self.lead!r} s < cost {self.adaptive.cost!r} s")
        if self.discard not in DISCARD_MODES:
            raise LatsimError(f"discard mode must be on-start or on-ready, got "
                              f"{self.discard!r}")
        if (isinstance(self.in_flight, bool) or not isinstance(self.in_flight, int)
                or not 1 <= self.in_flight <= MAX_IN_FLIGHT):
            raise LatsimError(f"chunks in flight must be a whole number in 1..{MAX_IN_FLIGHT}, "
                              f"got {self.in_flight!r}")
        if not (math.isfinite(self.run_ahead) and self.run_ahead >= 0):
            raise LatsimError(f"run-ahead must be >= 0 seconds, got {self.run_ahead!r}")
        if self.in_flight_policy not in IN_FLIGHT_POLICIES:
            raise LatsimError(f"in-flight policy must be let-play or flush, got "
                              f"{self.in_flight_policy!r}")
        if self.discard == "on-ready" and (self.in_flight > 1
                                           or self.in_flight_policy == "flush"):
            raise LatsimError("discard on-ready keeps the old future playing while one replan "
                              "runs: it needs one chunk in flight and the let-play policy")

    @property
    def pipelined(self) -> bool:
        """Whether jobs may overlap (several in flight, or a flush starting a replan while
        the flushed job still runs): a driver must then queue or pool them."""
        return self.in_flight > 1 or self.in_flight_policy == "flush"
