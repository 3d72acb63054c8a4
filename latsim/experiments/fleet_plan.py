"""``latsim fleet plan``: the smallest static fleet, and the cheapest autoscaling setting of a
small grid, that meet an SLO, for each commitment policy side by side.

A configuration *meets* the SLO when each metric's one-sided 95 % upper bound over the
replications (mean + 1.645 standard errors; the mean alone with one replication) is within
its limit: condition L95, viewer stall %, and (if given) the p95 time to first chunk. The
static search doubles the node count from 1 until the SLO is met, then bisects, so it
assumes more nodes never hurt (``tests/test_fleet.py`` checks that on its own). The
autoscaling grid is ``target_util`` in :data:`TARGETS` with the static answer as
``nodes_max``; the cheapest setting that meets the SLO is kept, by GPU-hours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from latsim.errors import DEFAULT_MAX_EVENTS, LatsimError, check_int, check_number
from latsim.experiments.fleet import plan_fleet, pooled_row, run_fleet
from latsim.model.fleet import FleetRun

#: The autoscaler's targets the plan tries.
TARGETS = (0.5, 0.7, 0.85)
#: The one-sided 95 % normal quantile of a metric's upper bound.
UPPER_Z = 1.645


@dataclass(frozen=True)
class FleetSLO:
    l95: float
    stall_pct: float
    ttfc_p95: float | None = None

    def __post_init__(self) -> None:
        check_number("--slo-l95", self.l95, 0, 86_400, positive=True, unit="s")
        check_number("--slo-stall", self.stall_pct, 0, 100)
        if self.ttfc_p95 is not None:
            check_number("--slo-ttfc", self.ttfc_p95, 0, 86_400, positive=True, unit="s")

    def limits(self) -> dict[str, float]:
        out = {"L95": self.l95, "stall_pct": self.stall_pct}
        if self.ttfc_p95 is not None:
            out["ttfc_p95"] = self.ttfc_p95
        return out

    def meets(self, row: dict) -> bool:
        return not self.missed(row)

    def missed(self, row: dict) -> list[str]:
        """The limits ``row`` misses (its value plus :data:`UPPER_Z` standard errors
        past the limit): their keys, in :meth:`limits` order."""
        return [key for key, limit in self.limits().items()
                if row.get(key) is None
                or row[key] + UPPER_Z * (row.get(f"{key}_se") or 0.0) > limit]


def why_missed(slo: FleetSLO, rows: list[dict]) -> str:
    """What kept every row of ``rows`` (configurations tried, none meeting ``slo``) from
    it: each limit missed, with the range of its values over the rows that missed it."""
    parts = []
    for key, limit in slo.limits().items():
        values = [r[key] for r in rows if key in slo.missed(r) and r.get(key) is not None]
        unmeasured = sum(1 for r in rows if r.get(key) is None)
        if values:
            low, high = min(values), max(values)
            shown = f"{low:.3g}" if low == high else f"{low:.3g}-{high:.3g}"
            parts.append(f"{key} {shown} > {limit:g}")
        elif unmeasured:
            parts.append(f"{key} not measured")
    return ", ".join(parts)


def _evaluate(run: FleetRun, slo: FleetSLO, tried: list[dict], max_events: int,
              what: str) -> dict:
    fp = plan_fleet(run, max_events)
    row = pooled_row(fp, run_fleet(fp))
    row = {"what": what, "meets": slo.meets(row), **row}
    tried.append(row)
    return row


def smallest_static(run: FleetRun, slo: FleetSLO, max_nodes: int, tried: list[dict],
                    max_events: int = DEFAULT_MAX_EVENTS,
                    progress: Callable[[str], None] | None = None) -> dict | None:
    """The row of the smallest static fleet (no autoscaling) meeting ``slo``, or None if
    ``max_nodes`` do not."""

    def static(nodes: int) -> dict:
        fleet = replace(run.fleet, nodes_initial=nodes, nodes_min=min(run.fleet.nodes_min,
                                                                     nodes),
                        nodes_max=nodes, autoscale=False)
        row = _evaluate(replace(run, fleet=fleet), slo, tried, max_events, "static")
        if progress is not None:
            progress(f"{run.node.policy}: {nodes} node(s) {'meet' if row['meets'] else 'miss'}"
                     " the SLO")
        return row

    rows: dict[int, dict] = {}
    low, high = 0, 1  # low fails (0 nodes serve nobody), high is the next to try
    while True:
        rows[high] = static(high)
        if rows[high]["meets"]:
            break
        if high >= max_nodes:
            return None
        low, high = high, min(2 * high, max_nodes)
    while high - low > 1:
        mid = (low + high) // 2
        rows[mid] = static(mid)
        if rows[mid]["meets"]:
            high = mid
        else:
            low = mid
    return rows[high]


def cheapest_autoscaled(run: FleetRun, slo: FleetSLO, nodes_max: int, tried: list[dict],
                        max_events: int = DEFAULT_MAX_EVENTS) -> dict | None:
    """The cheapest (GPU-hours) autoscaling setting of the grid meeting ``slo``."""
    best = None
    for target in TARGETS:
        fleet = replace(run.fleet, nodes_initial=1, nodes_min=1, nodes_max=nodes_max,
                        autoscale=True, target_util=target,
                        hysteresis=min(run.fleet.hysteresis, 1 - target))
        row = _evaluate(replace(run, fleet=fleet), slo, tried, max_events,
                        f"autoscale target {target:g}")
        if row["meets"] and (best is None or row["gpu_hours"] < best["gpu_hours"]):
            best = row
    return best


def plan_fleet_size(run: FleetRun, slo: FleetSLO, policies: tuple[str, ...] = (
        "baseline", "speculative"), max_nodes: int = 64,
        max_events: int = DEFAULT_MAX_EVENTS,
        progress: Callable[[str], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Per policy: the smallest static fleet and the cheapest autoscaled one meeting
    ``slo``. Returns (one row per policy, every configuration tried)."""
    check_int("--max-nodes", max_nodes, 1, 4096)
    for policy in policies:
        if policy not in ("baseline", "speculative"):
            raise LatsimError(f"--policies takes baseline and speculative, got {policy!r}")
    rows, tried = [], []
    for policy in policies:
        own = replace(run, node=replace(run.node, policy=policy))
        static = smallest_static(own, slo, max_nodes, tried, max_events, progress)
        largest = tried[-1] if static is None else None  # the last static fleet tried
        first_scaled = len(tried)
        scaled = (None if static is None else
                  cheapest_autoscaled(own, slo, static["nodes_max"], tried, max_events))
        row: dict = {"policy": policy, "nodes_static": None if static is None
                     else static["nodes_max"]}
        row["static_missed"] = (None if largest is None else
                                f"{why_missed(slo, [largest])} at {largest['nodes_max']} "
                                f"node(s), the most tried")
        row["autoscaled_missed"] = (
            None if static is None or scaled is not None else
            f"{why_missed(slo, tried[first_scaled:])} over the {len(TARGETS)} targets")
        for prefix, found in (("static", static), ("autoscaled", scaled)):
            for key in ("gpu_hours", "cost_per_viewer_hour", "L95", "stall_pct", "ttfc_p95",
                        "n_nodes_mean", "w", "dit_calls_per_viewer_hour"):
                row[f"{prefix}_{key}"] = None if found is None else found.get(key)
        row["autoscaled_target_util"] = None if scaled is None else scaled["target_util"]
        rows.append(row)
    return rows, tried
