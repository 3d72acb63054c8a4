"""``latsim plan``: which chunk size, commitment policy, USP degree, node shape and fleet size
meet an SLO most cheaply (DESIGN §10).

A deployment file is a fleet file (docs/fleet.md) plus two tables: ``[search]``, the design
space, and ``[slo]``, the limits. ``node.cost`` gives the forward time per K (a ``usp:``
table gives it per parallel degree too) and ``fleet.usd_per_gpu_hour`` the price. The plan
works in two stages, both stated in every row:

1. **Screening by a surrogate, without simulation.** For each candidate (K, policy, USP
   degree, GPUs per node) and each node size n (1 to ``search.max_sessions``), from closed
   forms: the fleet is the least static node count whose Erlang-B blocking at the
   workload's peak offered load (sessions present, M/G/∞: peak arrival rate × mean
   duration; idle sessions keep their slot) is within ``slo.blocking``; the node's
   occupancy is the share of the sessions' time spent on a node with k streams active
   (:func:`occupancy`: the sessions present follow Erlang's loss law over the fleet's
   slots, least-loaded placement spreads them evenly, any other placement is taken as
   random; an idle session sends no job). The node's G = GPUs / degree DiT groups serve
   its streams' refills from one FIFO queue, as the node's DiT pool does (the nD/D/G
   queue of a job of C every T, :func:`~latsim.analysis.queueing.pool_waits`); a
   stream's device work is C·A a chunk (A: the speculative policy's work amplification
   1 + λ(T − δ)/2, 1 for the baseline), its replans counted in the load, not in the
   waits' law (a replan of a job still queued costs no work). The node is sized for n:
   its lead is C's 0.99 quantile plus ``--lead auto``'s stall-targeted wait budget of n
   streams (the least s with E[(W − s)+] ≤ 0.1 % of a stream's time,
   :func:`~latsim.analysis.queueing.pool_stall_budget`), as the fleet's nodes size theirs
   for a full node; n·C must stay under G·T (refills alone saturate a full node past it,
   and no budget exists: the exact model's own limit). Over the occupancy: the load a
   session meets, its node's max(k, G)·C·A/(G·T) averaged over the occupancy, must stay
   at or under :data:`RHO_MAX` (the range over which
   ``--lead auto`` was shown to hold its 0.1 % stall target, ``bench/lead_regimes.py``:
   a full node may be loaded past it, as sessions spend a small share of their time on
   one, and what it stalls there is the exact run's to judge); the stall is E[(W_k −
   s)+]·A/T averaged over it; L95 is the timing model's (:mod:`latsim.analysis.theory`):
   the baseline's lead + 0.95·T (the lead is the full node's whatever the occupancy), the
   speculative policy's quantile of C plus a replan's wait, mixed over the occupancy and
   the wait's law; the first chunk's time (TTFC) is the lead. The candidate's row is the
   node size of fewest nodes that passes (then the fewest sessions). Its cost per
   viewer-hour is the GPU-hours of the verification run's measured window over the
   viewer-hours an M/G/∞ fleet holds in it (:attr:`Deployment.viewer_seconds`: the
   steady mean after a warm-up, else from an empty start), less the blocked share,
   so that it predicts what the exact run measures.
   With ``search.autoscale``, each candidate also runs autoscaled (one node up to the
   static count, to each target utilisation): the same node, and at each moment the nodes
   that hold the M/G/∞ mean present then at the target (:func:`screen_autoscaled`).
2. **Verification by the exact fleet model** (``latsim fleet``, its own ``[run]``), for
   every candidate on the surrogate's Pareto frontier and for each policy's recommendation.
   With stationary arrivals the runs measure the steady state, after a warm-up (``[run]
   warmup``, else :meth:`~latsim.model.workload.Workload.steady_warmup`: the M/G/∞ ramp
   to 99 %, at most ten mean session lengths). A configuration meets the SLO
   when each limit is above its metric's one-sided 95 % upper bound, fails where one is
   below the lower bound, and is undecided otherwise (:func:`verify`). Every verified row
   carries the surrogate's error. A recommendation always meets the SLO in its exact run:
   where the surrogate was wrong, or the run could not tell, the plan says so and moves to
   the next cheapest candidate of the policy, at most ``search.max_verified`` runs in all.

The frontier is the non-dominated set of (cost per viewer-hour ↓, L95 ↓, quality ↑), where
quality is ``search.quality`` (a score per K the user supplies) or else K itself: the plan
never invents a quality number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from latsim.analysis import theory
from latsim.analysis.queueing import (
    erlang_b,
    erlang_loss_pmf,
    pool_stall_budget,
    pool_waits,
)
from latsim.controller.timing import Timing
from latsim.errors import DEFAULT_MAX_EVENTS, LatsimError, check_int, check_number
from latsim.experiments.fleet_plan import UPPER_Z, FleetSLO
from latsim.model.fleet import MAX_NODE_SESSIONS, MAX_NODES, FleetRun, parse_fleet
from latsim.model.lead import AUTO_STALL
from latsim.model.serving import typed_value
from latsim.model.traces import read_toml

#: The highest device load the surrogate accepts where a session meets it (averaged over
#: the node's occupancy): ``--lead auto`` was shown to keep its stall target up to here
#: (``bench/lead_regimes.py``); a full node may pass it, below saturation, for the share of
#: time sessions spend on one, which the exact run judges.
RHO_MAX = 0.85
POLICIES = ("baseline", "speculative")
#: Candidates a deployment file may describe, and exact runs one plan may make.
MAX_CANDIDATES = 4096
MAX_VERIFIED = 256
_SEARCH_KEYS: dict[str, Any] = {"K": list, "policies": list, "usp": list,
                                "gpus_per_node": list, "max_sessions": int,
                                "quality": dict, "max_verified": int, "autoscale": list}
_SLO_KEYS: dict[str, Any] = {"l95": (int, float), "stall_pct": (int, float),
                             "ttfc_p95": (int, float), "blocking": (int, float)}


@dataclass(frozen=True)
class PlanSLO:
    """The limits: condition L95 (s), viewer stall (%), p95 time to first chunk (s, optional)
    and the share of arriving sessions turned away (blocking, a fraction)."""

    l95: float
    stall_pct: float
    ttfc_p95: float | None = None
    blocking: float = 0.01

    def __post_init__(self) -> None:
        check_number("slo.l95", self.l95, 0, 86_400, positive=True, unit="s")
        check_number("slo.stall_pct", self.stall_pct, 0, 100, unit="%")
        if self.ttfc_p95 is not None:
            check_number("slo.ttfc_p95", self.ttfc_p95, 0, 86_400, positive=True, unit="s")
        check_number("slo.blocking", self.blocking, 0, 1)

    def fleet_slo(self) -> FleetSLO:
        return FleetSLO(self.l95, self.stall_pct, self.ttfc_p95)


@dataclass(frozen=True)
class SearchSpace:
    Ks: tuple[int, ...]
    policies: tuple[str, ...]
    degrees: tuple[int, ...]
    gpus_per_node: tuple[int, ...]
    max_sessions: int = 64
    quality: tuple[tuple[int, float], ...] = ()  # (K, score): the user's, never invented
    max_verified: int = 24
    #: autoscaled variants: the target utilisations to try (none: static fleets only)
    autoscale: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name, values, top in (("search.K", self.Ks, 4096), ("search.usp", self.degrees,
                                  4096), ("search.gpus_per_node", self.gpus_per_node, 4096)):
            if not values:
                raise LatsimError(f"{name} is empty: the search space has no candidate")
            for value in values:
                check_int(name, value, 1, top)
            if len(set(values)) != len(values):
                raise LatsimError(f"{name} names a value twice")
        if not self.policies or any(p not in POLICIES for p in self.policies):
            raise LatsimError(f"search.policies takes {' and '.join(POLICIES)}, got "
                              f"{list(self.policies)!r}")
        check_int("search.max_sessions", self.max_sessions, 1, MAX_NODE_SESSIONS)
        check_int("search.max_verified", self.max_verified, 1, MAX_VERIFIED)
        for K, score in self.quality:
            if K not in self.Ks:
                raise LatsimError(f"search.quality gives K={K}, which search.K does not list")
            check_number(f"search.quality[{K}]", score, -1e9, 1e9)
        if self.quality and {K for K, _ in self.quality} != set(self.Ks):
            missing = sorted(set(self.Ks) - {K for K, _ in self.quality})
            raise LatsimError(f"search.quality has no score for K={missing[0]}: give every K "
                              "a score, or none (the plan then ranks by K)")
        for target in self.autoscale:
            check_number("search.autoscale", target, 0, 1, positive=True)
            if target >= 1:
                raise LatsimError(f"search.autoscale: a target utilisation must be below 1, "
                                  f"got {target:g}")
        if len(set(self.autoscale)) != len(self.autoscale):
            raise LatsimError("search.autoscale names a value twice")
        count = (len(self.Ks) * len(self.policies) * len(self.degrees)
                 * len(self.gpus_per_node) * (1 + len(self.autoscale)))
        if count > MAX_CANDIDATES:
            raise LatsimError(f"the search space holds {count} candidates; at most "
                              f"{MAX_CANDIDATES}")

    def quality_of(self, K: int) -> float:
        return dict(self.quality).get(K, float(K))


@dataclass(frozen=True)
class Deployment:
    """A deployment file, resolved: the fleet it varies, the space and the limits."""

    base: FleetRun
    space: SearchSpace
    slo: PlanSLO

    @property
    def price(self) -> float:
        return self.base.fleet.usd_per_gpu_hour

    @cached_property
    def peak_load(self) -> float:
        """Sessions present at the workload's peak, with unlimited room (M/G/∞: the
        highest arrival rate times the mean duration; a population's own N; a log's
        mean)."""
        workload = self.base.workload
        if workload.log is not None or workload.population:
            return workload.offered_load(self.base.duration)
        arrivals = workload.arrivals
        if arrivals.kind == "mmpp":
            rate = max(r for r, _ in arrivals.pieces)
        else:
            rate = max(r for _, r in arrivals.pieces)
        return rate * workload.duration.mean

    @cached_property
    def present(self) -> list[float]:
        """Sessions present over the exact runs' measured window, in 2,000 steps (M/G/∞:
        after a warm-up, the steady mean; else from an empty start,
        :meth:`~latsim.model.workload.Workload.present_over`)."""
        workload, duration = self.base.workload, self.base.duration
        if self.base.warmup > 0:
            return [workload.offered_load(duration)] * 2000
        return workload.present_over(duration)

    @cached_property
    def viewer_seconds(self) -> float:
        """Session-seconds an M/G/∞ fleet holds over the exact runs' measured window: the
        steady mean's after a warm-up, else from an empty start
        (:meth:`~latsim.model.workload.Workload.viewer_seconds`)."""
        workload, duration = self.base.workload, self.base.duration
        if self.base.warmup > 0:
            return workload.offered_load(duration) * duration
        return workload.viewer_seconds(duration)

    def describe(self) -> dict[str, Any]:
        """The search space and the limits, as ``plan.json`` and the envelope give them."""
        space, slo = self.space, self.slo
        return {"search": {"K": list(space.Ks), "policies": list(space.policies),
                           "usp": list(space.degrees), "gpus_per_node": list(space.gpus_per_node),
                           "max_sessions": space.max_sessions, "quality": dict(space.quality),
                           **({"autoscale": list(space.autoscale)} if space.autoscale else {})},
                "slo": {"l95": slo.l95, "stall_pct": slo.stall_pct, "ttfc_p95": slo.ttfc_p95,
                        "blocking": slo.blocking}}


@dataclass(frozen=True)
class Candidate:
    K: int
    policy: str
    degree: int
    gpus: int
    target_util: float | None = None  # None: a static fleet; else autoscaled to it

    @property
    def label(self) -> str:
        fleet = "" if self.target_util is None else f" autoscaled to {self.target_util:g}"
        return f"K={self.K} {self.policy} usp{self.degree} {self.gpus}gpu{fleet}"

    @classmethod
    def of(cls, row: dict) -> Candidate:
        return cls(row["K"], row["policy"], row["usp"], row["gpus_per_node"],
                   row.get("target_util"))


def _list(where: str, value: object, kind: type) -> tuple:
    items = typed_value(where, value, list)
    return tuple(typed_value(f"{where}[{i}]", item, kind) for i, item in enumerate(items))


def parse_deployment(data: dict[str, Any], path: str = "deployment file") -> Deployment:
    """A deployment from a parsed TOML document; every error names ``path``."""
    if not isinstance(data.get("search"), dict) or not isinstance(data.get("slo"), dict):
        raise LatsimError(f"{path}: a deployment file needs [search] and [slo] tables beside "
                          "the fleet's (docs/plan.md)")
    rest = {k: v for k, v in data.items() if k not in ("search", "slo")}
    try:
        search = _keys(data["search"], "search", _SEARCH_KEYS)
        slo = _keys(data["slo"], "slo", _SLO_KEYS)
        for key in ("l95", "stall_pct"):
            if key not in slo:
                raise LatsimError(f"[slo] needs {key}")
        quality = tuple((_quality_key(k), float(typed_value(f"search.quality.{k}", v,
                                                            (int, float))))
                        for k, v in search.get("quality", {}).items())
        space = SearchSpace(
            Ks=_list("search.K", search.get("K", [8]), int),
            policies=_list("search.policies", search.get("policies", list(POLICIES)), str),
            degrees=_list("search.usp", search.get("usp", [1]), int),
            gpus_per_node=_list("search.gpus_per_node", search.get("gpus_per_node", [1]), int),
            max_sessions=search.get("max_sessions", 64), quality=quality,
            max_verified=search.get("max_verified", 24),
            autoscale=tuple(float(t) for t in _list("search.autoscale",
                                                    search.get("autoscale", []),
                                                    (int, float))))
        limits = PlanSLO(float(slo["l95"]), float(slo["stall_pct"]),
                         None if "ttfc_p95" not in slo else float(slo["ttfc_p95"]),
                         float(slo.get("blocking", 0.01)))
    except LatsimError as exc:
        raise LatsimError(f"{path}: {exc}") from None
    base = parse_fleet(rest, path)
    if base.warmup == 0:  # measure the steady state
        base = replace(base, warmup=base.workload.steady_warmup())
    deployment = Deployment(base, space, limits)
    for candidate in candidates(deployment):  # every cost and shape checked before any work
        _check_shape(deployment, candidate, path)
    return deployment


def _keys(body: dict, name: str, keys: dict) -> dict:
    out = {}
    for key, value in body.items():
        if key not in keys:
            raise LatsimError(f"unknown key {name}.{key} (known: {', '.join(sorted(keys))})")
        out[key] = typed_value(f"{name}.{key}", value, keys[key])
    return out


def _quality_key(key: str) -> int:
    if not key.isascii() or not key.isdigit():
        raise LatsimError(f"search.quality.{key[:20]}: keys are chunk sizes K (whole numbers)")
    return int(key)


def load_deployment(path: str | Path) -> Deployment:
    """Read and check a deployment file (TOML)."""
    return parse_deployment(read_toml(path, "deployment file"), str(path))


def candidates(deployment: Deployment) -> list[Candidate]:
    space = deployment.space
    return [Candidate(K, policy, degree, gpus) for K in space.Ks for policy in space.policies
            for degree in space.degrees for gpus in space.gpus_per_node]


def _check_shape(deployment: Deployment, candidate: Candidate, path: str) -> None:
    if candidate.gpus % candidate.degree:
        raise LatsimError(f"{path}: search.gpus_per_node {candidate.gpus} is not a multiple "
                          f"of search.usp {candidate.degree}")
    try:
        node_cost(deployment, candidate).mean(candidate.K)
    except LatsimError as exc:
        if str(exc).startswith("search."):
            raise LatsimError(f"{path}: {exc}") from None
        raise LatsimError(f"{path}: node.cost at K={candidate.K}, usp{candidate.degree}: "
                          f"{exc}") from None


def node_cost(deployment: Deployment, candidate: Candidate):
    """The DiT cost model at the candidate's USP degree (a ``usp:`` table's own table for
    that degree; any other cost is one time whatever the degree, so only degree 1)."""
    from latsim.experiments.engine import DEFAULT_COST
    from latsim.model.costs import ParallelTableCost
    from latsim.plugins import load_cost

    cost = load_cost(deployment.base.node.cost or DEFAULT_COST)
    if isinstance(cost, ParallelTableCost):
        return cost.at(candidate.degree)
    if candidate.degree != 1:
        raise LatsimError(f"search.usp {candidate.degree}: node.cost {cost.spec!r} has one "
                          "time for every degree; give a usp: table to search USP degrees")
    return cost


# ---------------------------------------------------------------- the surrogate


def update_rate(deployment: Deployment, K: int) -> float:
    """Conditions per second while a session is active (the workload's ``updates``)."""
    from latsim.model.arrivals import parse_updates

    node = deployment.base.node
    timing = Timing(K, node.r, node.fps)
    horizon = deployment.base.duration
    return parse_updates(deployment.base.workload.updates).mean_conditions(horizon,
                                                                           timing) / horizon


@dataclass(frozen=True)
class NodeModel:
    """What the surrogate knows of one candidate's node, whatever its session count: the
    chunk period and slot, the mean C, the lead before queueing, the update rate while
    active, the work a chunk costs in C (the speculative policy's replans: its work
    amplification A), its DiT groups and its policy."""

    T: float
    delta: float
    C: float
    base_lead: float
    rate: float
    groups: int
    policy: str
    amplification: float = 1.0

    @classmethod
    def of(cls, deployment: Deployment, candidate: Candidate) -> NodeModel:
        node = deployment.base.node
        timing = Timing(candidate.K, node.r, node.fps)
        cost = node_cost(deployment, candidate)
        extra = replace(node.serving, dit_degree=candidate.degree).lead_extra(candidate.K)
        rate = update_rate(deployment, candidate.K)
        return cls(timing.T, timing.delta, cost.mean(candidate.K),
                   cost.quantile(candidate.K, 0.99) + extra, rate,
                   candidate.gpus // candidate.degree, candidate.policy,
                   _amplification(candidate.policy, rate, timing))

    def estimate(self, sessions: int, slo: PlanSLO,
                 occupancy: Sequence[float] | None = None) -> dict:
        """The node sized for ``sessions`` streams: load, lead, L95, TTFC, stall (and the
        limit it breaks, ``failed``, empty when none). ``occupancy[k − 1]`` is the share
        of the sessions' time spent on the node with k streams active (:func:`occupancy`);
        by default every session is active at once. The lead is the full node's (the
        fleet's ``--lead auto`` sizes it so); the load, the stall and, for the
        speculative policy, L95 are taken over the occupancy."""
        T, C, G = self.T, self.C, self.groups
        weights = list(occupancy) if occupancy is not None else [0.0] * (sessions - 1) + [1.0]
        # a stream has one job at a time: however many groups, it loads one by its own
        rho = (math.fsum(w * max(k, G) for k, w in enumerate(weights, 1))
               * C * self.amplification / (G * T))
        out: dict[str, Any] = {"rho": rho, "rho_full": sessions * C / (G * T), "lead": None,
                               "L95": None, "ttfc_p95": None, "stall_pct": None,
                               "failed": ""}
        if sessions * C >= G * T or rho > RHO_MAX:  # refills alone saturate the node
            out["failed"] = "load"
            return out
        per_job = AUTO_STALL * T / self.amplification  # stall seconds a job may cost
        budget = pool_stall_budget(per_job, sessions, G, T, C)
        lead = self.base_lead + budget
        out.update(lead=lead, ttfc_p95=lead)
        excess = [_excess_wait(k, G, T, C, budget) for k in range(1, len(weights) + 1)]
        out["stall_pct"] = (100 * self.amplification / T
                            * math.fsum(w * e for w, e in zip(weights, excess, strict=True)))
        if self.policy == "baseline":
            l95 = theory.baseline_latency_quantile(lead, T, 0.95)
        else:
            l95 = self._speculative_l95(lead, weights)
        if l95 is None:
            out["failed"] = "load"
            return out
        out["L95"] = l95
        if l95 > slo.l95:
            out["failed"] = "L95"
        elif slo.ttfc_p95 is not None and lead > slo.ttfc_p95:
            out["failed"] = "TTFC"
        elif slo.stall_pct < 100 * AUTO_STALL:
            out["failed"] = "stall"  # below --lead auto's 0.1 % target: no claim is made
        return out

    def _speculative_l95(self, lead: float, weights: Sequence[float]) -> float | None:
        """The speculative policy's L95 over the occupancy: at k streams a replan waits
        W_k (the nD/D/G wait, :data:`WAIT_POINTS` equally likely values of it), then takes
        C; None where more than 5 % of the conditions find C + W past T (no claim)."""
        T, C = self.T, self.C
        cases: dict[float, float] = {}
        beyond = 0.0
        for k, weight in enumerate(weights, 1):
            if weight <= 0:
                continue
            waits = pool_waits(k, self.groups, T, C)
            for i in range(WAIT_POINTS):
                wait = float(waits[int((i + 0.5) / WAIT_POINTS * waits.size)])
                if C + wait >= T:
                    beyond += weight / WAIT_POINTS
                    continue
                key = round(wait, 4)
                cases[key] = cases.get(key, 0.0) + weight / WAIT_POINTS
        total = math.fsum(cases.values())
        if beyond >= 0.05 * (beyond + total) or not cases:
            return None
        level = 0.95 * (beyond + total) / total  # the cases past T lie above every other
        points = [(weight, C + wait, max(lead, C + wait)) for wait, weight in cases.items()]
        return theory.speculative_latency_mixture_quantile(points, T, self.delta, level)


#: Equally likely values of a replan's wait the speculative L95 mixes over.
WAIT_POINTS = 100


def _amplification(policy: str, rate: float, timing: Timing) -> float:
    """The device work a chunk costs, in C: 1 for the baseline; for the speculative policy
    its work amplification A = 1 + λ(T − δ)/2 (:func:`~latsim.analysis.theory.
    work_amplification_poisson`) where λT < 1, else one replan per condition, 1 + λT (an
    upper bound)."""
    if policy != "speculative":
        return 1.0
    if rate * timing.T < 1:
        return theory.work_amplification_poisson(rate, timing.T, timing.delta)
    return 1.0 + rate * timing.T


def _excess_wait(streams: int, groups: int, T: float, C: float, budget: float) -> float:
    """E[(W − budget)+] (s) of a job among ``streams`` on ``groups`` (nD/D/G)."""
    import numpy as np

    waits = pool_waits(streams, groups, T, C)
    return float(np.maximum(waits - budget, 0.0).mean())


def occupancy(deployment: Deployment, nodes: int, slots: int) -> list[float]:
    """``w[k − 1]``, k = 1 … ``slots``: the share of the active sessions' time spent on a
    node where k streams are active, in a fleet of ``nodes`` nodes of ``slots`` at the
    workload's peak load (session-weighted: a node with k streams counts k times).

    The sessions present m follow Erlang's loss law over all the slots (the Poisson law of
    the M/G/∞ load truncated at nodes × slots; a population: its N). Least-loaded
    placement spreads them evenly (m mod nodes nodes hold ⌈m/nodes⌉, the rest ⌊m/nodes⌋:
    departures unbalance it by a session or so, which this leaves out); any other
    placement is taken as random, each node an Erlang loss system of its own at the load
    over the nodes. An idle session keeps its slot but sends no job: a session active on a
    node of k present meets 1 + Bin(k − 1, a) active streams, a the active share."""
    workload = deployment.base.workload
    load = deployment.peak_load
    present = [0.0] * (slots + 1)  # session-weighted sessions present on a session's node
    if workload.population or deployment.base.fleet.placement == "least-loaded":
        if workload.population:
            law = {min(round(load), nodes * slots): 1.0}
        else:
            law = dict(enumerate(erlang_loss_pmf(nodes * slots, load)))
        for m, p in law.items():
            q, r = divmod(m, nodes)
            if r:
                present[q + 1] += p * r * (q + 1)
            if q:
                present[q] += p * (nodes - r) * q
    else:
        for k, p in enumerate(erlang_loss_pmf(slots, load / nodes)):
            present[k] += p * k
    total = math.fsum(present)
    if total <= 0:
        return [1.0] + [0.0] * (slots - 1)  # nobody present: a lone session's view
    active = workload.activity.active_fraction
    seen = [0.0] * slots
    for k in range(1, slots + 1):
        if present[k] <= 0:
            continue
        for j in range(k):  # j of the other k − 1 sessions active
            seen[j] += present[k] / total * math.comb(k - 1, j) * active**j * (
                1 - active) ** (k - 1 - j)
    return seen


def screen(deployment: Deployment, candidate: Candidate) -> dict:
    """The surrogate's row for ``candidate``: of the node sizes 1 … ``search.max_sessions``
    that pass (:meth:`NodeModel.estimate` over the :func:`occupancy` of the fleet
    Erlang-B sizes for them), the one of fewest nodes (then of fewest sessions), and what
    it costs."""
    space, model = deployment.space, NodeModel.of(deployment, candidate)
    A = model.amplification
    row: dict[str, Any] = {
        "K": candidate.K, "policy": candidate.policy, "usp": candidate.degree,
        "gpus_per_node": candidate.gpus, "quality": space.quality_of(candidate.K),
        "quality_given": bool(space.quality), "C": model.C, "A": A, "w": 1 - 1 / A}
    best: tuple[int, int, float, dict] | None = None
    first_failure = None
    load, limit = deployment.peak_load, deployment.slo.blocking
    for sessions in range(1, space.max_sessions + 1):
        if sessions * model.C >= model.groups * model.T:
            first_failure = first_failure or "load"
            break  # more sessions only load the node more
        nodes, blocking = fleet_nodes(load, sessions, limit,
                                      exact=deployment.base.workload.population)
        if nodes is None:
            first_failure = first_failure or "nodes"
            continue
        trial = model.estimate(sessions, deployment.slo,
                               occupancy(deployment, nodes, sessions))
        if trial["failed"]:
            first_failure = first_failure or trial["failed"]
        elif best is None or nodes < best[0]:
            best = (nodes, sessions, blocking, trial)
    if best is None:
        row.update(sessions_per_node=0, verdict="fails", failed=first_failure or "load",
                   nodes=None, gpus=None, rho=None, rho_full=None, lead=None, L95=None,
                   ttfc_p95=None, stall_pct=None, blocking=None,
                   cost_per_viewer_hour=None, gpu_hours=None)
        return row
    nodes, sessions, blocking, estimate = best
    row.update(sessions_per_node=sessions, verdict="meets", failed="", nodes=nodes,
               gpus=nodes * candidate.gpus, rho=estimate["rho"],
               rho_full=estimate["rho_full"], lead=estimate["lead"], L95=estimate["L95"],
               ttfc_p95=estimate["ttfc_p95"], stall_pct=estimate["stall_pct"],
               blocking=blocking)
    horizon = deployment.base.duration
    viewer_hours = deployment.viewer_seconds * (1 - blocking) / 3600
    row["gpu_hours"] = nodes * candidate.gpus * horizon / 3600
    row["cost_per_viewer_hour"] = (deployment.price * row["gpu_hours"] / viewer_hours
                                   if viewer_hours > 0 else math.inf)
    return row


def screen_autoscaled(deployment: Deployment, static: dict, target: float) -> dict:
    """The surrogate's row for ``static``'s candidate on a fleet autoscaled to ``target``:
    at most the static answer's nodes (``nodes``), and at each moment as many as hold the
    sessions present then (M/G/∞ from an empty start) at ``target`` of their slots, at
    least one (``n_nodes_mean``, and the GPU-hours and cost from it). Its node is the static
    one's, so are its L95, lead and TTFC. The autoscaler's lag (provisioning, cooldown,
    hysteresis) is not in it, nor what the lag costs in blocking or time to first chunk:
    the exact run decides those."""
    row = {**static, "fleet": "autoscaled", "target_util": target}
    if static["verdict"] != "meets":
        return row
    per_node = static["sessions_per_node"] * target
    nodes = [min(static["nodes"], max(1, math.ceil(present / per_node - 1e-9)))
             for present in deployment.present]
    row["n_nodes_mean"] = math.fsum(nodes) / len(nodes)
    row["gpu_hours"] = (row["n_nodes_mean"] * static["gpus_per_node"]
                        * deployment.base.duration / 3600)
    row["cost_per_viewer_hour"] = static["cost_per_viewer_hour"] * row["gpu_hours"] / static[
        "gpu_hours"]
    return row


def screen_all(deployment: Deployment) -> list[dict]:
    """Every candidate's surrogate row: each static fleet, followed (with
    ``search.autoscale``) by its autoscaled variants."""
    rows = []
    for candidate in candidates(deployment):
        static = screen(deployment, candidate)
        rows.append(static)
        if deployment.space.autoscale:
            static.update(fleet="static", target_util=None, n_nodes_mean=static["nodes"])
            rows += [screen_autoscaled(deployment, static, target)
                     for target in deployment.space.autoscale]
    return rows


def fleet_nodes(load: float, sessions_per_node: int, blocking: float, exact: bool = False
                ) -> tuple[int | None, float]:
    """The least static node count whose Erlang-B blocking at ``load`` sessions is within
    ``blocking`` (None past :data:`MAX_NODES`), and that blocking; with ``exact``, ``load``
    sessions that are always present (a population): the nodes that hold them all."""
    nodes = max(1, math.ceil(load / sessions_per_node) if blocking == 0 or exact else 1)
    if exact:  # a population: exactly ``load`` sessions, none turned away
        return (nodes, 0.0) if nodes <= MAX_NODES else (None, 1.0)
    found, servers = 1.0, 0  # Erlang-B's recurrence, carried from one count to the next
    while nodes <= MAX_NODES:
        slots = nodes * sessions_per_node
        found = erlang_b(slots, load, (servers, found)) if load > 0 else 0.0
        servers = slots
        if found <= blocking or (blocking == 0 and slots >= load and found < 1e-12):
            return nodes, found
        nodes += 1
    return None, 1.0


def pareto_frontier(rows: Sequence[dict]) -> list[int]:
    """Indices of the rows no other row dominates in (cost ↓, L95 ↓, quality ↑), among the
    rows the surrogate passes; ties in all three keep every row."""
    keys = [(row["cost_per_viewer_hour"], row["L95"], -row["quality"])
            for row in rows]
    passing = [i for i, row in enumerate(rows) if row["verdict"] == "meets"]

    def dominates(a: tuple, b: tuple) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    return [i for i in passing if not any(dominates(keys[j], keys[i]) for j in passing)]


# ---------------------------------------------------------------- verification


def fleet_of(deployment: Deployment, row: dict, nodes: int | None = None) -> FleetRun:
    """The fleet ``row`` describes: the base fleet with the candidate's node and a static
    node count (``nodes``, default the surrogate's), or for an autoscaled row one node
    growing to that many, nodes planning with ``--lead auto``."""
    base = deployment.base
    node = base.node
    pools = tuple((name, row["gpus_per_node"] if name == node.serving.dit_pool else size)
                  for name, size in node.serving.pools)
    serving = replace(node.serving, pools=pools, dit_degree=row["usp"])
    cost = node_cost(deployment, Candidate(row["K"], row["policy"], row["usp"],
                                           row["gpus_per_node"])).spec
    spec = replace(node, K=row["K"], policy=row["policy"], cost=cost, serving=serving,
                   lead="auto", max_sessions=row["sessions_per_node"])
    count = row["nodes"] if nodes is None else nodes
    target = row.get("target_util")
    if target is None:
        fleet = replace(base.fleet, nodes_initial=count, nodes_min=count, nodes_max=count,
                        autoscale=False)
    else:  # as fleet plan's autoscaling grid: from one node up to the static answer
        fleet = replace(base.fleet, nodes_initial=1, nodes_min=1, nodes_max=count,
                        autoscale=True, target_util=target,
                        hysteresis=min(base.fleet.hysteresis, 1 - target))
    return replace(base, node=spec, fleet=fleet)


def verify(deployment: Deployment, row: dict, max_events: int = DEFAULT_MAX_EVENTS,
           progress: Callable[[int, int], None] | None = None) -> dict:
    """Run ``row``'s fleet exactly; its measured metrics, verdict and the surrogate's error.

    Each limit is judged by one-sided 95 % bounds: L95, stall and TTFC by the mean ±
    :data:`UPPER_Z` standard errors over the replications; blocking by the wider of those
    and the Clopper–Pearson bounds of the sessions turned away among those that arrived,
    pooled. The first covers rejections that come in bursts (one replication's crowded
    hour); the second a run that turned none away, whose blocking is then bounded by about
    3 / arrivals, not by 0. A limit above the upper bound is met; one below the lower bound
    fails; one between them, or a metric with no value, is undecided in the time the run
    was given (``progress(finished, total)`` counts its replications). Blocking has one
    more way to be met: a static fleet that turns sessions
    away at once, under Poisson arrivals, is an M/G/c/c loss system, so its steady-state
    blocking is Erlang-B's whatever the session lengths; where the row's Erlang-B value is
    within the limit and inside the run's two bounds, the run confirms it
    (``exact_blocking_basis``: ``Erlang-B``, else ``run``). The verdict: ``fails`` where
    any limit fails, else ``undecided`` where any is undecided, else ``meets``."""
    from latsim.analysis.fleet import blocking_bounds
    from latsim.experiments.fleet import plan_fleet, pooled_row, run_fleet

    fp = plan_fleet(fleet_of(deployment, row), max_events)
    measured = pooled_row(fp, run_fleet(fp, progress))
    slo = deployment.slo
    limits = {**slo.fleet_slo().limits(), "blocking": slo.blocking}
    bounds = {key: _bounds(measured, key) for key in limits if key != "blocking"}
    runs = measured.get("n_runs") or 0
    arrived = round((measured.get("sessions_arrived") or 0) * runs)
    rejected = round((measured.get("sessions_rejected") or 0) * runs)
    if arrived:  # the wider of the two: see the docstring
        pooled_bounds = blocking_bounds(rejected, arrived)
        spread = _bounds(measured, "blocking") or pooled_bounds
        bounds["blocking"] = (min(pooled_bounds[0], spread[0]), max(pooled_bounds[1], spread[1]))
    else:
        bounds["blocking"] = None
    failed = [key for key, limit in limits.items()
              if bounds[key] is not None and bounds[key][0] > limit]
    undecided = [key for key, limit in limits.items()
                 if bounds[key] is None or bounds[key][0] <= limit < bounds[key][1]]
    basis = "run"
    if "blocking" in undecided and _erlang_b_holds(deployment, row):
        low, high = bounds["blocking"]
        if row["blocking"] <= slo.blocking and low <= row["blocking"] <= high:
            undecided.remove("blocking")
            basis = "Erlang-B"
    out = {f"exact_{key}": measured.get(key) for key in (
        "L50", "L95", "L95_se", "stall_pct", "stall_pct_se", "ttfc_p95", "ttfc_p95_se",
        "blocking", "blocking_se", "cost_per_viewer_hour", "gpu_hours", "n_runs")}
    out["exact_blocking_upper"] = None if bounds["blocking"] is None else bounds["blocking"][1]
    out["exact_blocking_basis"] = basis
    if row.get("target_util") is not None:
        out["exact_n_nodes_mean"] = measured.get("n_nodes_mean")
    out["exact_verdict"] = "fails" if failed else "undecided" if undecided else "meets"
    out["exact_failed"] = ",".join(failed)
    out["exact_undecided"] = ",".join(undecided)
    for key in ("L95", "ttfc_p95", "stall_pct", "blocking", "cost_per_viewer_hour"):
        predicted, got = row.get(key), measured.get(key)
        out[f"error_{key}"] = (None if predicted is None or got is None
                               else got - predicted)
    return out


def _erlang_b_holds(deployment: Deployment, row: dict) -> bool:
    """Whether ``row``'s fleet is an M/G/c/c loss system: static, admission ``reject``,
    Poisson arrivals, every idle session holding its slot, so that its blocking is
    Erlang-B's at ``nodes · sessions_per_node`` slots."""
    base = deployment.base
    return (row.get("target_util") is None and row.get("blocking") is not None
            and base.fleet.admission == "reject" and base.fleet.suspend_after_s is None
            and base.workload.log is None and base.workload.arrivals.kind == "poisson")


def _bounds(row: dict, key: str) -> tuple[float, float] | None:
    """``row[key]`` ± :data:`UPPER_Z` standard errors (None: no value)."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    margin = UPPER_Z * (row.get(f"{key}_se") or 0.0)
    return value - margin, value + margin


@dataclass(frozen=True)
class DeploymentPlan:
    rows: list[dict]  # every candidate, surrogate and (where run) exact columns
    frontier: list[int]
    recommended: dict[str, int | None]  # policy -> row index
    comparison: str


def plan_deployment(deployment: Deployment, max_events: int = DEFAULT_MAX_EVENTS,
                    progress: Callable[[str, float, int], None] | None = None
                    ) -> DeploymentPlan:
    """Screen every candidate, verify the frontier and each policy's recommendation.

    ``progress(line, done, total)`` follows the exact runs: ``done`` counts them (a run's
    finished replications as a fraction of it), ``total`` is the most the plan can still
    run, known before the first and never growing (the frontier and, for each policy whose
    recommendation is not found yet, its candidates the surrogate passes, capped at
    ``search.max_verified``), and equals ``done`` in the last call."""
    rows = screen_all(deployment)
    for row in rows:
        row["role"] = ""
    frontier = pareto_frontier(rows)
    for i in frontier:
        rows[i]["role"] = "frontier"
    runs = 0
    space = deployment.space
    passing = {policy: sorted((i for i, row in enumerate(rows)
                               if row["policy"] == policy and row["verdict"] == "meets"),
                              key=lambda i: (rows[i]["cost_per_viewer_hour"],
                                             -rows[i]["quality"], rows[i]["L95"]))
               for policy in space.policies}
    searching = set(space.policies)

    def most() -> int:
        could = set(frontier).union(*(passing[policy] for policy in searching))
        return min(space.max_verified,
                   runs + sum("exact_verdict" not in rows[i] for i in could))

    def check(i: int) -> bool:
        nonlocal runs
        if "exact_verdict" not in rows[i]:
            if runs >= space.max_verified:
                return False
            total = most()
            line = (f"verifying {Candidate.of(rows[i]).label} (run {runs + 1} of at most "
                    f"{total})")

            def replications(finished: int, of: int) -> None:
                if progress is not None:
                    progress(line, runs + finished / of, total)

            replications(0, 1)
            rows[i].update(verify(deployment, rows[i], max_events, replications))
            runs += 1
        return rows[i]["exact_verdict"] == "meets"

    recommended: dict[str, int | None] = {}
    for policy in space.policies:
        recommended[policy] = None
        for i in passing[policy]:
            if runs >= space.max_verified and "exact_verdict" not in rows[i]:
                break
            if check(i):
                recommended[policy] = i
                rows[i]["role"] = ("recommended" if not rows[i]["role"]
                                   else f"{rows[i]['role']},recommended")
                break
        searching.discard(policy)
    for i in frontier:
        check(i)
    if progress is not None:
        progress(f"{runs} exact run(s) done", runs, runs)
    return DeploymentPlan(rows, frontier, recommended, comparison_line(rows, deployment))


def comparison_line(rows: list[dict], deployment: Deployment) -> str:
    """The paper's comparison at this SLO: the largest K (or best quality) each policy
    affords among the exactly verified configurations, at its cheapest cost."""
    parts = {}
    for policy in ("speculative", "baseline"):
        met = [row for row in rows if row["policy"] == policy
               and row.get("exact_verdict") == "meets"]
        if not met:
            parts[policy] = None
            continue
        top = max(row["quality"] for row in met)
        cheapest = min((row for row in met if row["quality"] == top),
                       key=lambda row: row["exact_cost_per_viewer_hour"])
        parts[policy] = cheapest
    measure = "quality" if deployment.space.quality else "K"

    def said(row: dict | None) -> str:
        if row is None:
            return "no verified configuration"
        value = f"{row['quality']:g}" if measure == "quality" else str(row["K"])
        return f"{measure} = {value} at ${row['exact_cost_per_viewer_hour']:.3f} per viewer-hour"

    return (f"At this SLO, latent commitment (speculative) affords {said(parts['speculative'])}"
            f", against chunk commitment (baseline)'s {said(parts['baseline'])}.")
