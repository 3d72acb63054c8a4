"""A fleet experiment (DESIGN §8): a fleet file's replications, their metrics pooled, and
the run folder.

Each replication draws its sessions and every segment's arrivals and costs from
``SeedSequence(seed)`` with keys that do not depend on the fleet: segment ``k`` of
replication ``r`` draws as stream ``k`` of a serving replication does
(:meth:`~latsim.experiments.stream_models.SharedDevices.stream_inputs`), node 0 draws its
batch costs as a serving run's pools do. So a fleet of one node holding a ``population:N``
is ``latsim simulate --streams N`` event for event, and its node's summary row is the same
(``tests/test_fleet.py``).

In exact mode a replication is one work unit on the active pool (``--jobs``,
``--scheduler``) and sends back its metrics, its time series and its node and session
tables, not its records; in sharded mode every node of every replication is one, and sends
back its tally (:class:`latsim.analysis.fleet.NodeTally`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from latsim.analysis.fleet import fleet_metrics, fleet_timeseries, node_rows
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError
from latsim.experiments.engine import (
    ADAPTIVE_LEAD,
    AUTO_LEAD,
    COST_LEAD,
    DEFAULT_COST,
    PILOT_WHOLE,
    Cell,
    Experiment,
    Plan,
    plan,
    refill_load,
)
from latsim.experiments.executors import LocalPool, active_pool, gc_paused
from latsim.experiments.stream_models import BATCH_KEY
from latsim.model.fleet import FleetRun
from latsim.model.traces import Trace
from latsim.model.workload import Session, sample_sessions
from latsim.run.fleet import FleetRecords

#: Spawn keys (beside a replication's segment keys 0, 1, 2, ...): the sessions, the
#: placement's draws, nodes 1, 2, ...'s batch costs. Node 0 draws its batch costs with a
#: serving run's key (``stream_models.BATCH_KEY``).
_WORKLOAD_KEY = 2**33
_PLACEMENT_KEY = 2**33 + 1
_NODE_KEY = 2**34
#: A fleet run folder's ``fleet.json``: its format and version.
FLEET_FORMAT = "latsim-fleet"
FLEET_FORMAT_VERSION = 1


def fleet_experiment(run: FleetRun) -> Experiment:
    """The serving experiment a node runs: the node's K, policy, cost and serving model
    (a population's N sessions as its streams), the workload's updates, the run's seeds.

    Its lead is ``node.lead``: seconds; ``"cost"`` (C's 0.99 quantile, plus decode's and
    the replan overhead's); or ``"auto"``, the default, ``--lead auto``'s rule: for a
    population that one node can hold (N <= ``max_sessions``) the wait budget of its N
    streams (one node is then ``simulate --streams N``), else that of a full node,
    ``max_sessions`` streams at random phases, as sessions that come and go have
    (:func:`node_auto_lead`; a larger population is spread over nodes, none of which
    holds more than ``max_sessions`` of it). A session keeps its lead while others
    join and leave, so the lead covers the node at its fullest: a part-full node's sessions
    pay for waits they may not meet (the price is in L), and a node whose full occupancy
    loads its devices to ρ >= 1 (:func:`full_node_load`) has no wait budget that keeps the
    stall target."""
    node, workload = run.node, run.workload
    streams = workload.arrivals.population if workload.population else 1
    experiment = Experiment(
        Ks=(node.K,), r=node.r, fps=node.fps, cost=node.cost or DEFAULT_COST,
        lead=AUTO_LEAD if node.lead is None else node.lead, policies=(node.policy,),
        updates=workload.updates, duration=run.warmup + run.duration, seeds=run.seeds,
        seed=run.seed,
        serving=replace(node.serving, streams=streams), records="conditions",
        pilot=PILOT_WHOLE)  # the run a pilot serves is the fleet's, not one node's
    if experiment.lead != AUTO_LEAD or (workload.population and streams <= node.max_sessions):
        return experiment
    return replace(experiment, lead=node_auto_lead(experiment, node.max_sessions))


def node_auto_lead(experiment: Experiment, sessions: int) -> float:
    """``--lead auto``'s lead for ``experiment``'s policy with ``sessions`` streams joining
    at random phases on one node (a fleet's experiment pilots the whole node:
    :func:`fleet_experiment`)."""
    serving = replace(experiment.serving, streams=sessions, start="random")
    full = plan(replace(experiment, serving=serving, seeds=1))
    (cell,) = full.cells
    return cell.lead


def lead_rule(run: FleetRun) -> str:
    """How the node's lead was chosen, in words (the fleet's summary says it)."""
    lead = AUTO_LEAD if run.node.lead is None else run.node.lead
    if lead == COST_LEAD:
        return "cost: C's 0.99 quantile, no wait for shared devices"
    if lead == ADAPTIVE_LEAD:
        return "adaptive: each session's own, from the device waits it sees"
    if lead != AUTO_LEAD:
        return "given"
    population, full = run.workload.arrivals.population, run.node.max_sessions
    if run.workload.population and population <= full:
        return f"auto: the wait budget of the node's {population} streams"
    spread = (f"; the population's {population} spread over nodes"
              if run.workload.population else "")
    return f"auto: the wait budget of a full node ({full} sessions{spread})"

@dataclass(frozen=True)
class FleetPlan:
    run: FleetRun
    plan: Plan
    cell: Cell

    @property
    def horizon(self) -> float:
        return self.plan.duration


def plan_fleet(run: FleetRun, max_events: int = DEFAULT_MAX_EVENTS) -> FleetPlan:
    """Resolve the node's serving model and check the work bound: the latent slots the
    sessions are expected to play over every replication (offered load × active share ×
    horizon / δ, with no session turned away) against ``max_events``."""
    p = plan(fleet_experiment(run))
    (cell,) = p.cells  # the node's policy alone: a fleet reports no A, so runs no twin
    workload = run.workload
    cap = run.fleet.nodes_max * run.node.max_sessions
    present = min(workload.offered_load(p.duration), cap)
    slots = present * workload.active_fraction * p.duration / cell.timing.delta
    events = slots * run.seeds
    if events > max_events:
        raise LatsimError(f"the fleet would play about {events:.3g} latent slots over "
                          f"{run.seeds} replication(s) (about {present:.3g} sessions present "
                          f"for {p.duration:g} s), more than the work bound {max_events:.3g};"
                          " shorten run.duration" + (" or run.warmup" if run.warmup else "")
                          + ", lower the rate, or raise --max-events")
    return FleetPlan(run, p, cell)


def full_node_load(fp: FleetPlan) -> float:
    """A full node's refill load on its busiest DiT device (:func:`refill_load`):
    ``max_sessions`` sessions, or a population's N streams where that is fewer."""
    serving = fp.plan.serving
    assert serving is not None
    streams = fp.run.node.max_sessions
    if fp.run.workload.population:
        streams = min(streams, serving.streams)
    return refill_load(replace(serving, streams=streams), fp.plan.cost, fp.cell.timing)


def _joins(fp: FleetPlan, replication: int) -> tuple[float, ...]:
    """A population's join times, by the serving model's ``start`` rule."""
    serving, seed = fp.plan.serving, fp.run.seed
    assert serving is not None
    T = fp.cell.timing.T
    joins = []
    for s in range(serving.streams):
        if serving.start == "random":
            arrivals = np.random.SeedSequence(seed, spawn_key=(replication, 2 * s))
            joins.append(float(np.random.default_rng(arrivals.spawn(1)[0]).uniform(0, T)))
        elif serving.start == "staggered":
            joins.append(s * T / serving.streams)
        else:
            joins.append(0.0)
    return tuple(joins)


def sessions_of(fp: FleetPlan, replication: int) -> tuple[Session, ...]:
    """The sessions of one replication."""
    rng = np.random.default_rng(np.random.SeedSequence(fp.run.seed,
                                                       spawn_key=(replication, _WORKLOAD_KEY)))
    joins = _joins(fp, replication) if fp.run.workload.population else ()
    return sample_sessions(fp.run.workload, fp.horizon, rng, joins)


def _parts(fp: FleetPlan, replication: int, with_sessions: bool = True) -> tuple:
    """(setup, sessions, segment inputs, node batch streams, placement stream) of one
    replication (for a sharded node, which needs neither, no sessions drawn and no
    placement stream: None)."""
    from latsim.model.generators import SpawnedStreams
    from latsim.sim.fleet import FleetSetup
    from latsim.sim.serving import StreamInput

    run, p, seed = fp.run, fp.plan, fp.run.seed
    timing = fp.cell.timing

    def inputs(segment: int, join: float, length: float,
               conditions: tuple[float, ...] | None = None) -> StreamInput:
        arrivals = np.random.SeedSequence(seed, spawn_key=(replication, 2 * segment))
        costs = np.random.SeedSequence(seed, spawn_key=(replication, 2 * segment + 1))
        trace = (Trace(f"log segment {segment}", conditions, length) if conditions is not None
                 else p.arrivals.trace((replication + segment) % p.replications,
                                       np.random.default_rng(arrivals), length, timing))
        return StreamInput(trace, join, np.random.default_rng(costs), SpawnedStreams(costs, 4))

    def batch_rng(node: int) -> np.random.Generator:
        key = BATCH_KEY if node == 0 else _NODE_KEY + node
        return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(replication, key)))

    assert p.serving is not None
    setup = FleetSetup(fp.cell.config, p.cost, replace(run.node, serving=p.serving),
                       run.fleet, fp.horizon, run.workload.population,
                       mode="exact" if run.workload.population else run.mode)
    if not with_sessions:
        return setup, (), inputs, batch_rng, None
    placement = np.random.default_rng(np.random.SeedSequence(
        seed, spawn_key=(replication, _PLACEMENT_KEY)))
    return setup, sessions_of(fp, replication), inputs, batch_rng, placement


def simulate_replication(fp: FleetPlan, replication: int) -> FleetRecords:
    """One replication's records, in the run's mode (a population always runs exact: its
    nodes do not interact, so a plan would change nothing)."""
    from latsim.sim.fleet import merge_plays, plan_fleet_run, simulate_fleet

    setup, sessions, inputs, batch_rng, placement = _parts(fp, replication)
    if setup.mode == "exact":
        return simulate_fleet(setup, sessions, inputs, batch_rng, placement)
    control, plans = plan_fleet_run(setup, sessions, inputs, placement)
    plays = {node: _play(fp, replication, node, plan) for node, plan in plans.items()}
    return merge_plays(control, plans, plays)


def _play(fp: FleetPlan, replication: int, node: int, plan: list):
    """One node's plan played."""
    from latsim.sim.fleet import simulate_node_plan

    setup, _, inputs, batch_rng, _ = _parts(fp, replication, with_sessions=False)
    return simulate_node_plan(setup, node, plan, inputs, batch_rng(node))


def run_node_unit(args: tuple) -> tuple:
    """One node of a sharded replication (a work unit: top-level, for worker processes):
    what it made of its plan, its records tallied here so that only the tally goes back."""
    from latsim.analysis.fleet import node_tally

    fp, replication, node, plan = args
    # the cyclic collector off while the node plays (as for every other simulation:
    # gc_paused says why) and until its records are tallied and freed: on again while
    # they lived, its next collection would walk every one of them (5% of a plan)
    with gc_paused():
        play = _play(fp, replication, node, plan)
        window = fp.horizon if fp.run.workload.population else math.inf  # .measured
        played = [0.0 if math.isnan(a) else min(max(0.0, b - a), window)
                  for a, b in zip(play.starts, play.ends, strict=True)]
        unit = replace(play, records=None), node_tally(play.records, play.starts, played)
        del play
    return unit


@dataclass(frozen=True)
class ReplicationResult:
    replication: int
    metrics: dict
    timeseries: list[dict]
    nodes: list[dict]
    sessions: list[dict]
    #: the values its quantiles were taken over (:func:`latsim.analysis.fleet.fleet_samples`)
    samples: dict = field(default_factory=dict)


def run_replication(args: tuple[FleetPlan, int]) -> ReplicationResult:
    """One replication, summarised (a work unit: top-level, so worker processes run it)."""
    fp, replication = args
    return _summarised(fp, replication, simulate_replication(fp, replication))


def _summarised(fp: FleetPlan, replication: int, records: FleetRecords,
                tallies: list | None = None) -> ReplicationResult:
    """One replication's metrics, series and tables; ``tallies``: its nodes' (a sharded
    run's), else made from its records."""
    from latsim.analysis.fleet import fleet_samples, node_tallies

    tallies = node_tallies(records) if tallies is None else tallies
    sessions = [{"session": s.session, "arrival": s.arrival, "duration": s.duration,
                 "status": s.status, "node": s.node, "wait": _finite(s.wait),
                 "ttfc": _finite(s.ttfc), "left": _finite(s.left), "segments": s.segments,
                 "suspended": s.suspended, "migrations": s.migrations}
                for s in records.sessions]
    samples = fleet_samples(records, tallies, since=fp.run.warmup)
    return ReplicationResult(replication,
                             fleet_metrics(records, fp.run.fleet.usd_per_gpu_hour, tallies,
                                           samples, since=fp.run.warmup),
                             fleet_timeseries(records, tallies=tallies), node_rows(records),
                             sessions, samples)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def pooled_row(fp: FleetPlan, results: list[ReplicationResult]) -> dict:
    """The replications' metrics: each one's mean, its standard error over the
    replications (``_se``), and how many there were (``n_runs``). The quantiles of L and
    of the time to first chunk are taken over every replication's values pooled, as the
    serving model's summary takes them (:data:`~latsim.analysis.fleet.POOLED_QUANTILES`);
    their ``_se`` is still the spread of each replication's own, and ``_lo``/``_hi`` their
    95% interval over the pooled values. ``stall_pct_lo``/``_hi``: the t interval of the
    replications' mean stall % (:func:`~latsim.analysis.intervals.t_interval`)."""
    from latsim.analysis.fleet import pooled_quantiles
    from latsim.analysis.intervals import t_interval
    from latsim.analysis.latency import VIEWER

    run = fp.run
    row: dict = {"K": run.node.K, "policy": run.node.policy, "cost": fp.plan.cost.spec,
                 "L_basis": VIEWER, "lead": fp.cell.lead, "lead_rule": lead_rule(run),
                 "full_node_rho": full_node_load(fp), "placement": run.fleet.placement,
                 "admission": run.fleet.admission, "autoscale": run.fleet.autoscale,
                 "target_util": run.fleet.target_util if run.fleet.autoscale else None,
                 "nodes_initial": run.fleet.nodes_initial, "nodes_max": run.fleet.nodes_max,
                 "max_sessions": run.node.max_sessions, "arrivals": run.workload.arrivals.spec,
                 "duration": run.duration, "warmup": run.warmup,
                 "offered_load": run.workload.offered_load(fp.horizon)}
    if not results:
        return {**row, "n_runs": 0}
    for key in results[0].metrics:
        values = [r.metrics[key] for r in results if r.metrics[key] is not None]
        row[key] = float(np.mean(values)) if values else None
        row[f"{key}_se"] = (float(np.std(values, ddof=1) / math.sqrt(len(values)))
                            if len(values) > 1 else None)
    if all(r.samples for r in results):
        row.update(pooled_quantiles([r.samples for r in results]))
    stalls = [r.metrics["stall_pct"] for r in results if r.metrics["stall_pct"] is not None]
    row["stall_pct_lo"], row["stall_pct_hi"] = t_interval(row.get("stall_pct"),
                                                          row.get("stall_pct_se"), len(stalls))
    row["n_runs"] = len(results)
    return row


def run_fleet(fp: FleetPlan, progress: Callable[[int, int], None] | None = None,
              done: Callable[[ReplicationResult], None] | None = None
              ) -> list[ReplicationResult]:
    """Every replication, on the active pool; ``done`` gets each as it finishes (a run
    folder keeps it), ``progress(finished, total)`` counts them. An interrupt raises
    :class:`Interrupted` with the replications finished so far kept by ``done``."""
    pool = active_pool() or LocalPool(1)
    if fp.run.mode == "sharded" and not fp.run.workload.population:
        return _run_sharded(fp, pool, progress, done)
    work = [(fp, r) for r in range(fp.run.seeds)]
    results: list[ReplicationResult] = []
    try:
        for _, result in pool.map_unordered(run_replication, work):
            results.append(result)
            if done is not None:
                done(result)
            if progress is not None:
                progress(len(results), len(work))
    except KeyboardInterrupt:
        raise Interrupted(f"fleet stopped after {len(results)} of {len(work)} "
                          "replication(s)") from None
    return sorted(results, key=lambda r: r.replication)


class FleetFolder:
    """A fleet run folder, written as replications finish: ``fleet.json`` (the settings,
    ``format_version`` and ``status``: running, complete or interrupted), ``summary.json``
    and ``runs.csv`` (the pooled row and one row per finished replication), and per
    replication ``timeseries.csv``, ``nodes.csv`` and ``sessions.csv`` rows (a ``run``
    column first)."""

    def __init__(self, out: Path, fp: FleetPlan) -> None:
        self.out = out
        self.fp = fp
        self.results: list[ReplicationResult] = []
        _refuse_a_live_writer(out / "fleet.json")
        out.mkdir(parents=True, exist_ok=True)
        self._write("running")

    def add(self, result: ReplicationResult) -> None:
        self.results.append(result)
        self._write("running")

    def finish(self, status: str = "complete") -> None:
        self._write(status)

    def _write(self, status: str) -> None:
        from latsim.run.files import write_rows_csv
        from latsim.run.folder import write_json

        results = sorted(self.results, key=lambda r: r.replication)
        write_json(self.out / "fleet.json", {
            "format": FLEET_FORMAT, "format_version": FLEET_FORMAT_VERSION,
            "status": status, "replications_done": len(results),
            "replications": self.fp.run.seeds, "config": self.fp.run.describe()})
        write_json(self.out / "summary.json", [pooled_row(self.fp, results)])
        for name, rows in (("runs", [{"run": r.replication, **r.metrics} for r in results]),
                           ("timeseries", [{"run": r.replication, **row} for r in results
                                           for row in r.timeseries]),
                           ("nodes", [{"run": r.replication, **row} for r in results
                                      for row in r.nodes]),
                           ("sessions", [{"run": r.replication, **row} for r in results
                                         for row in r.sessions])):
            if rows:
                write_rows_csv(self.out / f"{name}.csv", rows)


def _refuse_a_live_writer(path: Path) -> None:
    """Refuse a folder whose ``fleet.json`` is not a fleet's, that holds a fleet's files
    without one (someone else's ``summary.json``), or whose ``fleet.json`` says
    ``running`` for a process on this host that still runs: two runs would write over
    each other's rows (:func:`latsim.run.folder.claim_folder`). One whose writer is gone
    (killed) is replaced."""
    from latsim.run.folder import claim_folder, of_format

    claim_folder(path.parent, FLEET_FILES, path.name, "latsim fleet",
                 of_format(FLEET_FORMAT))


#: What a fleet run folder's own files are called (:class:`FleetFolder`).
FLEET_FILES = ("fleet.json", "summary.json", "runs.csv", "timeseries.csv", "nodes.csv",
               "sessions.csv")


def _run_sharded(fp: FleetPlan, pool, progress, done) -> list[ReplicationResult]:
    """Every replication's control plane here, then every node of every replication as
    one work unit on the pool, then each replication's merge as its nodes come back."""
    from latsim.sim.fleet import merge_plays, plan_fleet_run

    planned = {}
    for replication in range(fp.run.seeds):
        setup, sessions, inputs, _, placement = _parts(fp, replication)
        planned[replication] = plan_fleet_run(setup, sessions, inputs, placement)
    units = [(fp, r, node, plan) for r, (_, plans) in planned.items()
             for node, plan in plans.items()]
    left = {r: len(plans) for r, (_, plans) in planned.items()}
    plays: dict[int, dict] = {r: {} for r in planned}
    tallies: dict[int, dict] = {r: {} for r in planned}
    results: list[ReplicationResult] = []
    finished = 0
    try:
        for index, (play, tally) in pool.map_unordered(run_node_unit, units):
            _, replication, node, _ = units[index]
            plays[replication][node] = play
            tallies[replication][node] = tally
            left[replication] -= 1
            finished += 1
            if left[replication] == 0:
                control, plans = planned[replication]
                own = tallies.pop(replication)
                result = _summarised(fp, replication,
                                     merge_plays(control, plans, plays.pop(replication)),
                                     [own[n.node] for n in control.nodes])
                results.append(result)
                if done is not None:
                    done(result)
            if progress is not None:
                progress(finished, len(units))
    except KeyboardInterrupt:
        raise Interrupted(f"fleet stopped after {len(results)} of {fp.run.seeds} "
                          "replication(s)") from None
    return sorted(results, key=lambda r: r.replication)


def sharded_vs_exact(run: FleetRun, max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """Every metric of ``run`` in both modes over the same replications: the exact mean,
    the sharded mean, and their difference (sharded − exact) with its standard error paired
    over the replications (the same sessions and draws in both)."""
    by_mode = {}
    for mode in ("exact", "sharded"):
        fp = plan_fleet(replace(run, mode=mode), max_events)
        by_mode[mode] = run_fleet(fp)
    rows = []
    for metric in by_mode["exact"][0].metrics:
        pairs = [(e.metrics[metric], s.metrics[metric])
                 for e, s in zip(by_mode["exact"], by_mode["sharded"], strict=True)
                 if e.metrics[metric] is not None and s.metrics[metric] is not None]
        if not pairs:
            continue
        diffs = [s - e for e, s in pairs]
        rows.append({
            "metric": metric, "exact": float(np.mean([e for e, _ in pairs])),
            "sharded": float(np.mean([s for _, s in pairs])),
            "difference": float(np.mean(diffs)),
            "difference_se": (float(np.std(diffs, ddof=1) / math.sqrt(len(diffs)))
                              if len(diffs) > 1 else None),
            "n_runs": len(pairs)})
    return rows
