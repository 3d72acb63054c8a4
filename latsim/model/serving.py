"""The serving configuration (DESIGN §6): stages on device pools, streams, scheduling.

Pure data and parsing: what the ``--streams/--pools/--schedule/--decode/...`` flags and a
``--serving FILE.toml`` describe, validated once, with no simulation in it (the SimPy driver
in :mod:`latsim.sim.serving` runs it).

A job is a chain of stages. ``dit`` (sampling K latents, cost from ``--C``/``--cost``, plus
``replan_cost`` for a replan: decoding the boundary frame and re-encoding it as context) runs
on the ``dit`` pool, on ``dit_degree`` devices at once (sequence parallelism: the pool is cut
into fixed groups of that many devices; a ``usp:`` cost spec gives the time per degree);
``decode`` (VAE of the whole chunk) on the pool ``decode_pool``; the job is ready, for the
controller, when both are done (DESIGN §1: C includes the decode it needs).
``uplink`` (a condition's trip to the server) and ``deliver`` (a played slot's trip to the
client) are network delays, not devices. Every stage's cost is a cost spec
(:func:`latsim.plugins.load_cost`; ``deliver`` draws with K = 1, one latent's frames).

A TOML file holds the same settings (every key optional; flags override it)::

    streams = 16                  # viewers
    start = "random"              # staggered | random | together
    schedule = "least-slack"      # fifo | least-slack | replan-first
    discard = "on-ready"          # on-start | on-ready
    bind = "start"                # a queued job's condition: start (dispatch) | enqueue
    in_flight = 3                 # chunks one stream may have in flight (default 1)
    in_flight_policy = "flush"    # a new condition and chunks in flight: let-play | flush
    playout_delay = 0.08          # seconds; default: deliver's 0.99 quantile
    cold_start = true             # each stream's first chunk is generated on the pools

    [pools]                       # name = devices
    dit = 2
    vae = 1

    [stages.dit]
    cost = "affine:0.15,0.16"     # used where --C/--cost is not given
    degree = 1                    # devices one DiT task occupies (USP groups of the pool)
    [stages.decode]
    pool = "vae"
    cost = "fixed:0.05"
    [stages.deliver]
    cost = "lognormal:0.03,0.3"
    [stages.uplink]
    cost = "fixed:0.02"

    [replan]
    cost = "fixed:0.04"
    [batch]                       # dit tasks waiting together run as one batch
    cost = "affine:0.1,0.05"      # K = the batch's total latents
    max = 4
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from latsim.controller import BIND_MODES, DISCARD_MODES, IN_FLIGHT_POLICIES, MAX_IN_FLIGHT
from latsim.errors import MAX_K, MAX_SECONDS, LatsimError, check_int, check_number
from latsim.model.costs import CostModel
from latsim.model.traces import read_toml
from latsim.plugins import Parallel, Pipelined, Staged, available, load_cost, load_schedule
from latsim.plugins.spec import whole

#: The pool DiT tasks run on (in groups of ``dit_degree`` devices).
DIT_POOL = "dit"
STARTS = ("staggered", "random", "together")
#: Streams one simulation may serve, and devices one pool may hold. With records counted
#: (``--records none``) a stream-hour holds about 0.6 MiB (``bench/bench_memory.py``:
#: 4,096 streams x 600 s, 465 MiB at peak), so 16,384 streams for an hour fit in about
#: 10 GiB of a 24 GiB machine; keeping every record takes about twice as much or more.
MAX_STREAMS = 16384
MAX_DEVICES = 4096
#: Why the limits are what they are, for their error messages.
STREAMS_LIMIT_NOTE = ("a 24 GiB machine holds about that many one-hour streams with "
                      "--records none, about 0.6 MiB each")
MAX_BATCH = 1024
_POOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Batching:
    """Tasks waiting for the same pool together run as one batch of at most ``max_size``;
    the batch takes ``cost`` drawn with K = the batch's total latents."""

    cost: CostModel
    max_size: int

    def __post_init__(self) -> None:
        check_int("batch max", self.max_size, 1, MAX_BATCH)


@dataclass(frozen=True)
class ServingConfig:
    """Stages, pools, streams and scheduling (see the module docstring).

    The defaults are one stream on one dedicated ``dit`` device with no other stage: the
    single-worker model of DESIGN §2, which this then reproduces exactly.
    """

    streams: int = 1
    pools: tuple[tuple[str, int], ...] = (("dit", 1),)
    decode: CostModel | None = None
    decode_pool: str = "vae"
    deliver: CostModel | None = None
    uplink: CostModel | None = None
    replan_cost: CostModel | None = None
    batch: Batching | None = None
    schedule: str = "fifo"
    start: str = "staggered"
    discard: str = "on-start"
    bind: str = "start"
    in_flight: int = 1
    in_flight_policy: str = "let-play"
    playout_delay: float | None = None
    cold_start: bool = False
    dit_degree: int | None = None  # devices one DiT task occupies (USP); None: the cost's
    dit_pool: str = field(default=DIT_POOL, init=False)

    def __post_init__(self) -> None:
        check_int("--streams", self.streams, 1, MAX_STREAMS, why=STREAMS_LIMIT_NOTE)
        names = [name for name, _ in self.pools]
        if len(set(names)) != len(names):
            raise LatsimError(f"--pools names a pool twice: {','.join(names)}")
        for name, size in self.pools:
            if not _POOL_NAME.match(name):
                raise LatsimError(f"pool name {name!r} must be a letter then up to 31 "
                                  "letters, digits, '_' or '-'")
            check_int(f"pool {name}'s devices", size, 1, MAX_DEVICES)
        if self.dit_pool not in names:
            raise LatsimError(f"stage dit runs on pool {self.dit_pool!r}, which the pools "
                              f"({','.join(names) or 'none'}) do not define")
        if self.dit_degree is not None:
            check_int("--dit-degree", self.dit_degree, 1, MAX_DEVICES)
            if self.pool_size(self.dit_pool) % self.dit_degree:
                raise LatsimError(f"pool {self.dit_pool} has {self.pool_size(self.dit_pool)} "
                                  f"device(s), not a multiple of --dit-degree {self.dit_degree}")
        if self.decode is not None and self.decode_pool not in names:
            raise LatsimError(f"stage decode runs on pool {self.decode_pool!r}, which the "
                              f"pools ({','.join(names)}) do not define")
        if not isinstance(self.schedule, str) or self.schedule not in available("schedules"):
            raise LatsimError(f"--schedule must be one of {', '.join(available('schedules'))}"
                              f", got {self.schedule!r}")
        load_schedule(self.schedule)  # a plug-in that fails to import fails here
        for name, allowed in (("start", STARTS),
                              ("discard", DISCARD_MODES),
                              ("bind", BIND_MODES),
                              ("in_flight_policy", IN_FLIGHT_POLICIES)):
            if getattr(self, name) not in allowed:
                raise LatsimError(f"--{name.replace('_', '-')} must be one of "
                                  f"{', '.join(allowed)}, got {getattr(self, name)!r}")
        check_int("--in-flight", self.in_flight, 1, MAX_IN_FLIGHT)
        if self.discard == "on-ready" and (self.in_flight > 1
                                           or self.in_flight_policy == "flush"):
            raise LatsimError("--discard on-ready needs --in-flight 1 and --in-flight-policy "
                              "let-play (the old future plays while one replan runs)")
        if self.playout_delay is not None:
            check_number("--playout-delay", self.playout_delay, 0, MAX_SECONDS, unit="s")

    def pool_size(self, name: str) -> int:
        return dict(self.pools)[name]

    def part_divisors(self, cost: CostModel) -> tuple[int, ...]:
        """Every k >= 1 for which :meth:`part` is a configuration of ``cost``'s model: k
        divides the streams, every pool's devices and the DiT pool's USP groups, and no
        pool holds a pipeline (one device per rank, whatever the load)."""
        if isinstance(cost, Pipelined) and cost.pipelines():
            return (1,)
        return self._divisors()

    def _divisors(self) -> tuple[int, ...]:
        groups = self.pool_size(self.dit_pool) // self.degree
        common = math.gcd(self.streams, groups, *(size for _, size in self.pools))
        return tuple(k for k in range(1, common + 1) if common % k == 0)

    def part(self, k: int) -> ServingConfig:
        """1/k of this configuration: ``streams/k`` streams on ``1/k`` of every pool's
        devices, each device as loaded as before (k one of :meth:`part_divisors`)."""
        if k not in self._divisors():
            raise LatsimError(f"{self.streams} stream(s) on pools "
                              f"{','.join(f'{n}={s}' for n, s in self.pools)} do not "
                              f"divide into {k} equal parts")
        return replace(self, streams=self.streams // k,
                       pools=tuple((name, size // k) for name, size in self.pools))

    @property
    def degree(self) -> int:
        """Devices one DiT task occupies (1 unless set)."""
        return self.dit_degree or 1

    @property
    def trivial(self) -> bool:
        """One stream on a dedicated device, every other stage absent or free, default
        scheduling: the single-worker model, whose closed forms then apply."""
        return (self.streams == 1 and self.batch is None and self.discard == "on-start"
                and self.in_flight == 1 and self.in_flight_policy == "let-play"
                and not self.cold_start and not self.playout_delay
                and all(_free(stage) for stage in (self.decode, self.deliver, self.uplink,
                                                   self.replan_cost)))

    def resolve(self, cost: CostModel) -> tuple[ServingConfig, CostModel]:
        """This configuration and ``cost`` made consistent: a per-degree cost table at the
        degree the DiT tasks run on (``--dit-degree``, else the table's), and every pool a
        generator model steps on defined (a pipeline's with one device per rank)."""
        if isinstance(cost, Parallel) and self.dit_degree is not None:
            cost = cost.at(self.dit_degree)
        resolved = replace(self, dit_degree=cost.degree if isinstance(cost, Parallel)
                           else self.degree)
        pools = dict(resolved.pools)
        for pool in cost.pools() if isinstance(cost, Staged) else ():
            if pool not in pools:
                raise LatsimError(f"cost {cost.spec} runs steps on pool {pool!r}, which the "
                                  f"pools ({','.join(pools)}) do not define; add it to --pools")
        for pool, (depth, *_) in (cost.pipelines() if isinstance(cost, Pipelined)
                                  else {}).items():
            if pools[pool] != depth:
                raise LatsimError(f"cost {cost.spec} runs a pipeline of {depth} ranks, one "
                                  f"device each, on pool {pool}: give it {depth} devices, "
                                  f"not {pools[pool]}")
        return resolved, cost

    def playout(self) -> float:
        """The client's playout delay D: as given, else deliver's 0.99 quantile (0 without
        a deliver stage). Decode is not in it: a slot plays on the server only once decoded,
        so its decode is in C."""
        if self.playout_delay is not None:
            return self.playout_delay
        return 0.0 if self.deliver is None else self.deliver.quantile(1, 0.99)

    def lead_extra(self, K: int) -> float:
        """What the default planning lead adds to the DiT's 0.99 quantile: decode's and the
        replan overhead's 0.99 quantiles (a sum of quantiles: exact for fixed costs, an
        upper bound otherwise). Queueing on shared pools is not in it: ``--lead auto`` adds
        it (:func:`latsim.experiments.engine.auto_lead_wait`)."""
        return sum(stage.quantile(K, 0.99) for stage in (self.decode, self.replan_cost)
                   if stage is not None)

    def describe(self) -> dict[str, Any]:
        """The configuration as plain values (config.json, summary rows)."""
        def spec(cost: CostModel | None) -> str | None:
            return None if cost is None else cost.spec

        return {
            "streams": self.streams, "pools": dict(self.pools), "schedule": self.schedule,
            "start": self.start, "discard": self.discard, "bind": self.bind,
            "cold_start": self.cold_start,
            "in_flight": self.in_flight, "in_flight_policy": self.in_flight_policy,
            "decode": spec(self.decode), "decode_pool": self.decode_pool,
            "deliver": spec(self.deliver), "uplink": spec(self.uplink),
            "replan_cost": spec(self.replan_cost),
            "batch": None if self.batch is None else {"cost": self.batch.cost.spec,
                                                      "max": self.batch.max_size},
            "playout_delay": self.playout_delay, "dit_degree": self.degree,
        }


def _free(stage: CostModel | None) -> bool:
    """An absent stage, or one that always takes 0 s (at any K)."""
    return stage is None or (stage.deterministic and stage.mean(1) == 0 == stage.mean(MAX_K))


def parse_pools(spec: str) -> tuple[tuple[str, int], ...]:
    """``dit=2,vae=1`` -> ``(("dit", 2), ("vae", 1))``."""
    pools = []
    for part in spec.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name:
            raise LatsimError(f"--pools {spec!r}: write NAME=DEVICES, comma-separated, "
                              "e.g. dit=2,vae=1")
        pools.append((name.strip(), whole("--pools", spec, size)))
    return tuple(pools)


def parse_batch(spec: str, max_size: int | None = None) -> Batching:
    """``--batch COSTSPEC[;max=B]``: e.g. ``affine:0.1,0.05;max=4`` (default max 8)."""
    cost_spec, _, rest = spec.partition(";")
    size = 8
    if rest:
        key, sep, value = rest.partition("=")
        if key.strip() != "max" or not sep:
            raise LatsimError(f"--batch {spec!r}: after the cost spec write ;max=B")
        size = whole("--batch", spec, value)
    return Batching(load_cost(cost_spec), size if max_size is None else max_size)


#: TOML keys and what they hold (sections are checked separately).
_TOP_KEYS = {"streams": int, "start": str, "schedule": str, "discard": str, "bind": str,
             "playout_delay": (int, float), "cold_start": bool, "in_flight": int,
             "in_flight_policy": str}
_SECTIONS = {"pools", "stages", "replan", "batch"}
_STAGES = {"dit": {"cost", "pool", "degree"}, "decode": {"cost", "pool"}, "deliver": {"cost"},
           "uplink": {"cost"}}


def typed_value(where: str, value: Any, kind: Any) -> Any:
    """``value`` if it is of ``kind`` (a bool is not a number), else a one-line error
    naming ``where`` (a file's key)."""
    if isinstance(value, bool) and kind is not bool:
        raise LatsimError(f"{where}: expected {getattr(kind, '__name__', 'a number')}, "
                          f"got {value!r}")
    if not isinstance(value, kind):
        shown = kind.__name__ if isinstance(kind, type) else "a number"
        raise LatsimError(f"{where}: expected {shown}, got {value!r}")
    return value


def load_serving_file(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """Read a ``--serving`` TOML file: the :class:`ServingConfig` fields it sets, and the
    DiT cost spec it names (``[stages.dit] cost``), if any. Unknown keys are errors."""
    data = read_toml(path, "serving file")
    return serving_values(data, str(path))


#: Every key a serving table takes.
SERVING_KEYS = frozenset({*_TOP_KEYS, *_SECTIONS})


def serving_values(data: dict[str, Any], path: str, also: frozenset[str] = frozenset(),
                   without: frozenset[str] = frozenset()
                   ) -> tuple[dict[str, Any], str | None]:
    """The :class:`ServingConfig` fields a ``--serving`` file's table sets, and its DiT cost
    spec (``path`` names the table in errors: a file, or a fleet file's ``[node]``). An
    unknown key's error lists the keys the table takes: these, less ``without``, plus
    ``also`` (the caller's own, taken out of ``data`` before)."""
    values: dict[str, Any] = {}
    dit_cost = None
    for key, value in data.items():
        where = f"{path}: {key}"
        if key in _TOP_KEYS and key not in without:
            values[key] = typed_value(where, value, _TOP_KEYS[key])
        elif key not in _SECTIONS:
            known = (SERVING_KEYS - without) | also
            raise LatsimError(f"{path}: unknown key {key!r} (known: "
                              f"{', '.join(sorted(known))})")
        elif not isinstance(value, dict):
            raise LatsimError(f"{where}: expected a [{key}] table")
    if "pools" in data:
        values["pools"] = tuple((name, typed_value(f"{path}: pools.{name}", size, int))
                                for name, size in data["pools"].items())
    for stage, body in data.get("stages", {}).items():
        if stage not in _STAGES:
            raise LatsimError(f"{path}: unknown stage {stage!r} (stages: "
                              f"{', '.join(_STAGES)})")
        if not isinstance(body, dict):
            raise LatsimError(f"{path}: stages.{stage}: expected a table")
        unknown = set(body) - _STAGES[stage]
        if unknown:
            raise LatsimError(f"{path}: stages.{stage}: unknown key(s) "
                              f"{', '.join(sorted(unknown))}")
        cost = body.get("cost")
        if cost is not None:
            typed_value(f"{path}: stages.{stage}.cost", cost, str)
        pool = body.get("pool")
        if pool is not None:
            typed_value(f"{path}: stages.{stage}.pool", pool, str)
        if stage == "dit":
            dit_cost = cost
            if pool is not None and pool != "dit":
                raise LatsimError(f"{path}: stages.dit runs on the pool named dit")
            if "degree" in body:
                values["dit_degree"] = typed_value(f"{path}: stages.dit.degree",
                                                   body["degree"], int)
        elif stage == "decode":
            if cost is not None:
                values["decode"] = load_cost(cost)
            if pool is not None:
                values["decode_pool"] = pool
        elif cost is not None:
            values[stage] = load_cost(cost)
    replan = data.get("replan", {})
    if set(replan) - {"cost"}:
        raise LatsimError(f"{path}: [replan] takes only cost")
    if "cost" in replan:
        values["replan_cost"] = load_cost(typed_value(f"{path}: replan.cost", replan["cost"], str))
    batch = data.get("batch")
    if batch is not None:
        if set(batch) - {"cost", "max"} or "cost" not in batch:
            raise LatsimError(f"{path}: [batch] takes cost (required) and max")
        values["batch"] = Batching(
            load_cost(typed_value(f"{path}: batch.cost", batch["cost"], str)),
            typed_value(f"{path}: batch.max", batch.get("max", 8), int))
    return values, dit_cost


def build_serving(path: str | Path | None = None, **flags: Any) -> tuple[ServingConfig, str | None]:
    """The serving configuration from a TOML file (optional) with ``flags`` over it (a
    flag left ``None`` keeps the file's value). Flags use the field names of
    :class:`ServingConfig`; ``pools`` and ``batch`` may be spec strings, cost stages spec
    strings. Returns the configuration and the file's DiT cost spec (or ``None``)."""
    values, dit_cost = load_serving_file(path) if path is not None else ({}, None)
    known = {f.name for f in fields(ServingConfig) if f.init}
    for name, value in flags.items():
        if name not in known:
            raise TypeError(f"unknown serving setting {name!r}")
        if value is None:
            continue
        if name == "pools" and isinstance(value, str):
            value = parse_pools(value)
        elif name == "batch" and isinstance(value, str):
            value = parse_batch(value)
        elif name in ("decode", "deliver", "uplink", "replan_cost") and isinstance(value, str):
            value = load_cost(value)
        values[name] = value
    if "pools" not in values and values.get("decode") is not None:
        # the default pools: one DiT device and, for a decode on the default pool, one VAE
        # device (a pool named elsewhere must be defined: a typo is not a new pool)
        values["pools"] = (("dit", 1),) + ((("vae", 1),)
                                           if values.get("decode_pool", "vae") == "vae" else ())
    return ServingConfig(**values), dit_cost

