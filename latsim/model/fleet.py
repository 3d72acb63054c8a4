"""A fleet's definition (DESIGN §8): its workload, one node's serving model, the control
plane's settings (nodes, placement, admission, autoscaling, suspension, price) and the run.

A fleet file is TOML with four tables, ``[workload]``, ``[node]``, ``[fleet]`` and
``[run]`` (docs/fleet.md lists every key). ``[node]`` takes any key of a ``--serving`` file
besides ``streams`` (the sessions are the streams), plus ``K``, ``cost``, ``policy``,
``lead``, ``r``, ``fps`` and ``max_sessions``; ``pools`` may be a spec string
(``"dit=1,vae=1"``) or a table. Unknown keys, wrong types and out-of-range numbers are
one-line errors naming the file, the table and the key.

Placement policies are plug-ins (:data:`PLACEMENT_GROUP`), like schedules: a factory that
returns a fresh chooser for each run (:class:`~latsim.plugins.protocols.Placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from latsim.errors import (
    MAX_DURATION,
    MAX_SEED,
    MAX_SEEDS,
    LatsimError,
    check_int,
    check_number,
)
from latsim.model.serving import (
    MAX_DEVICES,
    ServingConfig,
    build_serving,
    parse_pools,
    serving_values,
    typed_value,
)
from latsim.model.traces import path_from_folder, read_toml
from latsim.model.workload import Workload, parse_workload

ADMISSIONS = ("reject", "queue")
MODES = ("exact", "sharded")
#: Nodes a fleet may have at once.
MAX_NODES = 4096
#: Sessions one node may hold.
MAX_NODE_SESSIONS = 16384


@dataclass(frozen=True)
class NodeSpec:
    """One node: a serving model whose streams are the sessions placed on it."""

    K: int
    cost: str | None  # None: latsim's default (Wan1.3B's affine cost)
    policy: str
    lead: float | str | None  # seconds, "auto", "adaptive" or "cost"; None: auto
    r: int
    fps: float
    serving: ServingConfig
    max_sessions: int

    @property
    def gpus(self) -> int:
        """Devices a node has: the sum of its pools (what it costs per hour)."""
        return sum(size for _, size in self.serving.pools)

    def describe(self) -> dict[str, Any]:
        return {"K": self.K, "cost": self.cost, "policy": self.policy, "lead": self.lead,
                "r": self.r, "fps": self.fps, "max_sessions": self.max_sessions,
                "gpus": self.gpus, "serving": self.serving.describe()}


@dataclass(frozen=True)
class FleetSpec:
    """The control plane: how many nodes, where sessions go, what happens when full."""

    nodes_initial: int = 1
    nodes_min: int = 1
    nodes_max: int = 1
    placement: str = "least-loaded"
    admission: str = "reject"
    max_queue: int = 100_000
    autoscale: bool = False
    target_util: float = 0.7
    hysteresis: float = 0.1
    cooldown_s: float = 60.0
    provision_delay_s: float = 60.0
    autoscale_interval_s: float = 10.0
    suspend_after_s: float | None = None  # an idle session frees its slot after this
    resume_s: float = 0.0
    usd_per_gpu_hour: float = 0.0
    migration: bool = False  # move playing sessions between nodes at chunk boundaries
    state_bytes: float = 0.0  # a session's state to move (bytes)
    bandwidth: float = 10e9  # bytes per second between nodes
    migration_fixed_s: float = 0.0  # the pause's fixed part (s)
    rebalance_gap: int = 2  # sessions between the fullest and the emptiest node that move one

    @property
    def migration_pause_s(self) -> float:
        """How long a moved session's generation pauses: its state over the bandwidth,
        plus the fixed part (its buffer plays on meanwhile)."""
        return self.state_bytes / self.bandwidth + self.migration_fixed_s

    def __post_init__(self) -> None:
        check_int("fleet.nodes_max", self.nodes_max, 1, MAX_NODES)
        check_int("fleet.nodes_min", self.nodes_min, 0, self.nodes_max)
        check_int("fleet.nodes_initial", self.nodes_initial, max(1, self.nodes_min),
                  self.nodes_max)
        from latsim.plugins import available

        if self.placement not in available("placements"):
            raise LatsimError(f"fleet.placement must be one of "
                              f"{', '.join(available('placements'))}, got {self.placement!r}")
        if self.admission not in ADMISSIONS:
            raise LatsimError(f"fleet.admission must be reject or queue, got "
                              f"{self.admission!r}")
        check_int("fleet.max_queue", self.max_queue, 0, 10**7)
        check_number("fleet.target_util", self.target_util, 0, 1, positive=True)
        check_number("fleet.hysteresis", self.hysteresis, 0, 0.5)
        if self.autoscale and self.target_util + self.hysteresis > 1 + 1e-12:
            raise LatsimError("fleet.target_util + fleet.hysteresis must be at most 1 (a "
                              "fleet can never be fuller than full)")
        for name in ("cooldown_s", "provision_delay_s", "resume_s"):
            check_number(f"fleet.{name}", getattr(self, name), 0, MAX_DURATION, unit="s")
        check_number("fleet.autoscale_interval_s", self.autoscale_interval_s, 0, MAX_DURATION,
                     positive=True, unit="s")
        if self.suspend_after_s is not None:
            check_number("fleet.suspend_after_s", self.suspend_after_s, 0, MAX_DURATION,
                         unit="s")
        check_number("fleet.usd_per_gpu_hour", self.usd_per_gpu_hour, 0, 1e6)
        check_number("fleet.state_bytes", self.state_bytes, 0, 1e15)
        check_number("fleet.bandwidth", self.bandwidth, 0, 1e15, positive=True)
        check_number("fleet.migration_fixed_s", self.migration_fixed_s, 0, MAX_DURATION,
                     unit="s")
        check_int("fleet.rebalance_gap", self.rebalance_gap, 1, MAX_NODE_SESSIONS)


@dataclass(frozen=True)
class FleetRun:
    """A fleet file, resolved: what to simulate and for how long."""

    workload: Workload
    node: NodeSpec
    fleet: FleetSpec
    duration: float
    seeds: int = 1
    seed: int = 0
    mode: str = "exact"
    source: str = "fleet"
    #: seconds played before ``duration`` and left out of every metric (``[run] warmup``):
    #: the fleet fills from empty, so a steady state's blocking, L and stall are measured
    #: after it; stationary arrivals (poisson, mmpp) only
    warmup: float = 0.0

    def __post_init__(self) -> None:
        check_number("run.duration", self.duration, 0, MAX_DURATION, positive=True, unit="s")
        check_number("run.warmup", self.warmup, 0, MAX_DURATION, unit="s")
        if self.warmup > 0 and not self.workload.stationary:
            raise LatsimError("run.warmup needs stationary arrivals (poisson or mmpp): a "
                              "population starts together, and a curve or a session log is "
                              "its own timeline from 0")
        check_int("run.seeds", self.seeds, 1, MAX_SEEDS)
        check_int("run.seed", self.seed, 0, MAX_SEED)
        if self.mode not in MODES:
            raise LatsimError(f"run.mode must be exact or sharded, got {self.mode!r}")
        if self.mode == "sharded" and self.fleet.migration:
            raise LatsimError("fleet.migration needs run.mode exact: a moved session keeps "
                              "its controller across nodes, which sharded nodes cannot share")

    def describe(self) -> dict[str, Any]:
        w = self.workload
        workload = ({"log": w.log_path, "updates": w.updates} if w.log is not None else
                    {"arrivals": w.arrivals.spec, "duration": w.duration.spec,
                     "activity": w.activity.spec, "updates": w.updates})
        return {"workload": workload,
                "node": self.node.describe(),
                "fleet": {k: getattr(self.fleet, k) for k in FleetSpec.__dataclass_fields__},
                "run": {"duration": self.duration, "seeds": self.seeds, "seed": self.seed,
                        "mode": self.mode, "warmup": self.warmup}}


# ---------------------------------------------------------------- the file

_WORKLOAD_KEYS = {"arrivals": str, "duration": str, "activity": str, "updates": str,
                  "log": str}
_NODE_OWN = {"K": int, "cost": str, "policy": str, "lead": (int, float, str), "r": int,
             "fps": (int, float), "max_sessions": int}
_FLEET_KEYS: dict[str, Any] = {
    "nodes_initial": int, "nodes_min": int, "nodes_max": int, "placement": str,
    "admission": str, "max_queue": int, "autoscale": bool, "target_util": (int, float),
    "hysteresis": (int, float), "cooldown_s": (int, float),
    "provision_delay_s": (int, float), "autoscale_interval_s": (int, float),
    "suspend_after_s": (int, float), "resume_s": (int, float),
    "usd_per_gpu_hour": (int, float), "migration": bool, "state_bytes": (int, float),
    "bandwidth": (int, float), "migration_fixed_s": (int, float), "rebalance_gap": int}
_RUN_KEYS = {"duration": (int, float), "seeds": int, "seed": int, "mode": str,
             "warmup": (int, float)}


def _table(data: dict, name: str, keys: dict, path: str, required: tuple[str, ...] = (),
           extra_ok: bool = False) -> dict[str, Any]:
    body = data.get(name, {})
    if not isinstance(body, dict):
        raise LatsimError(f"{path}: [{name}] must be a table")
    out = {}
    for key, value in body.items():
        if key in keys:
            out[key] = typed_value(f"{path}: {name}.{key}", value, keys[key])
        elif not extra_ok:
            raise LatsimError(f"{path}: unknown key {name}.{key} (known: "
                              f"{', '.join(sorted(keys))})")
    for key in required:
        if key not in out:
            raise LatsimError(f"{path}: [{name}] needs {key}")
    return out


def parse_fleet(data: dict[str, Any], path: str = "fleet file") -> FleetRun:
    """A fleet from a parsed TOML document (see the module docstring); every error names
    ``path``."""
    try:
        return _parse_fleet(data, path)
    except LatsimError as exc:
        if str(exc).startswith(path):
            raise
        raise LatsimError(f"{path}: {exc}") from None


def _parse_fleet(data: dict[str, Any], path: str) -> FleetRun:
    unknown = set(data) - {"workload", "node", "fleet", "run"}
    if unknown:
        raise LatsimError(f"{path}: unknown table(s) {', '.join(sorted(unknown))} (a fleet "
                          "file has [workload], [node], [fleet] and [run])")
    workload = _table(data, "workload", _WORKLOAD_KEYS, path)
    if "log" in workload:
        given = sorted({"arrivals", "duration", "activity"} & set(workload))
        if given:
            raise LatsimError(f"{path}: workload.log replays its sessions; it takes no "
                              f"{', '.join(given)}")
    elif "arrivals" not in workload:
        raise LatsimError(f"{path}: [workload] needs arrivals (or a session log)")
    workload_spec = parse_workload(
        workload.get("arrivals", ""), workload.get("duration", "fixed:60"),
        workload.get("activity", "always"), workload.get("updates", "poisson:0.1"),
        workload.get("log"))
    node = _node(data.get("node", {}), path)
    fleet = FleetSpec(**_table(data, "fleet", _FLEET_KEYS, path))
    run = _table(data, "run", _RUN_KEYS, path)
    return FleetRun(workload_spec, node, fleet, float(run.get("duration", 3600.0)),
                    run.get("seeds", 1), run.get("seed", 0), run.get("mode", "exact"),
                    source=path, warmup=float(run.get("warmup", 0.0)))


def _node(body: Any, path: str) -> NodeSpec:
    if not isinstance(body, dict):
        raise LatsimError(f"{path}: [node] must be a table")
    own = {k: typed_value(f"{path}: node.{k}", v, _NODE_OWN[k]) for k, v in body.items()
           if k in _NODE_OWN}
    rest = {k: v for k, v in body.items() if k not in _NODE_OWN}
    if "streams" in rest:
        raise LatsimError(f"{path}: node.streams: a node's streams are the sessions placed "
                          "on it (set node.max_sessions and the [workload])")
    pools = rest.pop("pools", None)
    values, dit_cost = serving_values(rest, f"{path}: node", also=frozenset(_NODE_OWN),
                                      without=frozenset({"streams"}))
    if isinstance(pools, str):
        values["pools"] = parse_pools(pools)
    elif isinstance(pools, dict):
        values["pools"] = tuple((name, typed_value(f"{path}: node.pools.{name}", size, int))
                                for name, size in pools.items())
    elif pools is not None:
        raise LatsimError(f"{path}: node.pools: expected a spec like \"dit=1\" or a table")
    values.setdefault("cold_start", True)  # a session's first chunk is generated when it joins
    serving, _ = build_serving(None, **values)
    cost = own.get("cost", dit_cost)  # None: the command line's default cost
    if dit_cost is not None and "cost" in own and own["cost"] != dit_cost:
        raise LatsimError(f"{path}: node.cost and node.stages.dit.cost disagree; give one")
    policy = own.get("policy", "speculative")
    if policy not in ("baseline", "speculative"):
        raise LatsimError(f"{path}: node.policy must be baseline or speculative, got "
                          f"{policy!r}")
    from latsim.plugins import load_cost

    if cost is not None:
        load_cost(cost)  # a bad cost fails here, naming it
    spec = NodeSpec(K=check_int("node.K", own.get("K", 8), 1, 4096), cost=cost, policy=policy,
                    lead=_node_lead(path, own.get("lead")),
                    r=check_int("node.r", own.get("r", 4), 1, 1024),
                    fps=check_number("node.fps", own.get("fps", 16.0), 1e-3, 1e3,
                                     positive=True),
                    serving=serving,
                    max_sessions=check_int("node.max_sessions", own.get("max_sessions", 4), 1,
                                           MAX_NODE_SESSIONS))
    check_int("node devices", spec.gpus, 1, MAX_DEVICES)
    return spec


def _node_lead(path: str | Path, value: object) -> float | str | None:
    """``node.lead``: seconds, ``"auto"``, ``"adaptive"`` or ``"cost"`` (as ``--lead``),
    or None."""
    if value is None or value in ("auto", "adaptive", "cost"):
        return value  # type: ignore[return-value]
    if isinstance(value, str):
        raise LatsimError(f"{path}: node.lead must be seconds, \"auto\", \"adaptive\" or "
                          f"\"cost\", got {value[:40]!r}")
    return check_number("node.lead", float(value), 0, 86_400, unit="s")


def load_fleet(path: str | Path) -> FleetRun:
    """Read and check a fleet file (TOML)."""
    data = read_toml(path, "fleet file")
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("log"), str):
        log = path_from_folder(workload["log"], Path(path).parent, str(path))
        data = {**data, "workload": {**workload, "log": log}}
    return parse_fleet(data, str(path))


def override(run: FleetRun, nodes: int | None = None, placement: str | None = None,
             autoscale: bool | None = None, seeds: int | None = None,
             seed: int | None = None) -> FleetRun:
    """``run`` with the command line's overrides (``--nodes N`` is a static fleet of N)."""
    fleet = run.fleet
    if nodes is not None:
        fleet = replace(fleet, nodes_initial=nodes, nodes_min=min(fleet.nodes_min, nodes),
                        nodes_max=nodes, autoscale=False)
    if placement is not None:
        fleet = replace(fleet, placement=placement)
    if autoscale is not None:
        fleet = replace(fleet, autoscale=autoscale)
    return replace(run, fleet=fleet, seeds=run.seeds if seeds is None else seeds,
                   seed=run.seed if seed is None else seed)
