"""Metrics of fleet runs (DESIGN §8): what a serving engineer reads.

Over ``[0, horizon]`` of one run (keys in seconds unless named otherwise):

- sessions: ``sessions_arrived``, ``sessions_admitted``, ``sessions_rejected``,
  ``sessions_queued`` (admitted after a wait, or still waiting at the end), ``blocking``
  (rejected / arrived), ``wait_mean`` (admission wait of the admitted), ``n_queued_mean``
  (time-average sessions waiting), ``sessions_suspended`` (idle periods suspended),
  ``migrations`` (sessions moved between nodes);
- occupancy: ``n_sessions_mean`` (time-average sessions present: admitted and not left,
  idle ones included), ``n_active_mean`` (time-average segments playing), ``n_nodes_mean``,
  ``util_pct`` (time-average slots held over the slots of the nodes taking sessions);
- viewers: ``ttfc_mean``, ``ttfc_p95``, ``ttfc_p99`` (arrival to first frame shown),
  ``L50``, ``L95``, ``L99`` (every shown condition, client send to client display:
  ``L_basis`` viewer),
  ``stall_pct`` (the share of played time the viewers saw frozen: server stalls plus late
  deliveries, within ``[0, horizon]``; a population's, within each session's own first
  ``horizon`` seconds of play, as the serving model's ``viewer_stall_pct``),
  ``chunk_p99`` and ``chunk_max`` (a DiT task's wait plus run: the per-chunk latency),
  ``w`` (the share of generated latents discarded) and ``dit_calls_per_viewer_hour``
  (the work: a speculative fleet's over a baseline one's is its amplification A);
- cost: ``gpu_hours`` (node-hours paid for, provisioning and draining included, times the
  node's devices), ``cost_usd``, ``viewer_hours`` (played time), ``cost_per_viewer_hour``.

After a warm-up (``[run] warmup``, ``since``) the window is ``[warmup, horizon]``: the
sessions that arrive in it, the conditions shown in it, its played and stalled time, its
levels and node-hours. The work metrics (``chunk_*``, ``w``, ``dit_calls_per_viewer_hour``)
stay the whole run's.

:func:`fleet_timeseries` gives the same per window (a minute by default), and
:func:`node_rows` per node.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from latsim.analysis.intervals import percentile_intervals
from latsim.analysis.latency import LEVELS, percentile, pooled
from latsim.analysis.metrics import stall_pct, work_counts
from latsim.numeric import total
from latsim.run.fleet import REJECTED, SERVED, WAITING, FleetRecords
from latsim.run.records import window_overlap
from latsim.run.serving import ServingRecords


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def level_means(run: FleetRecords, t0: float = 0.0, t1: float | None = None) -> dict:
    """Time averages of the control plane's counts over ``[t0, t1]``."""
    end = run.horizon if t1 is None else t1
    totals = {"present": 0.0, "playing": 0.0, "queued": 0.0, "nodes": 0.0, "held": 0.0,
              "slots": 0.0}
    levels = run.levels
    for i, level in enumerate(levels):
        stop = levels[i + 1].t if i + 1 < len(levels) else math.inf
        span = max(0.0, min(stop, end) - max(level.t, t0))
        if span <= 0:
            continue
        for key in ("present", "playing", "queued", "nodes", "held"):
            totals[key] += getattr(level, key) * span
        totals["slots"] += level.usable * run.max_sessions * span
    width = end - t0
    means = {key: value / width for key, value in totals.items()} if width > 0 else totals
    return means


@dataclass(frozen=True)
class NodeTally:
    """What a fleet's metrics need of one node's records, in global time: the end-to-end L
    of every condition its clients were shown and when, every stall (server or client)
    clipped to what its segment played, every DiT chunk's latency, and the work counts.
    A sharded node sends this back instead of its records."""

    latencies: array
    shown_at: array
    stalls: tuple[tuple[float, float], ...]
    chunks: array
    discarded: int
    played_generated: int
    dit_calls: int


def node_tally(node_run: ServingRecords, origins: Sequence[float],
               played: Sequence[float]) -> NodeTally:
    """The tally of one node whose stream ``i`` started playing at ``origins[i]`` (global;
    NaN: never) and played ``played[i]`` seconds."""
    latencies, shown_at = array("d"), array("d")
    for view in node_run.viewer:
        if view.displayed:
            latencies.append(view.L)
            shown_at.append(origins[view.stream] + view.t_display)
    client: dict[int, list[tuple[float, float]]] = {}
    for stall in node_run.client_stalls:
        client.setdefault(stall.stream, []).append((stall.t_start, stall.t_end))
    stalls = []
    started = []
    for index, stream in enumerate(node_run.streams):
        origin, length = origins[index], played[index]
        if math.isnan(origin):
            continue
        started.append(stream)
        for start, end in [(s.t_start, s.t_end) for s in stream.stalls] + client.get(index, []):
            lo, hi = max(0.0, start), min(length, end)
            if hi > lo:
                stalls.append((origin + lo, origin + hi))
    played_generated, discarded, dit_calls = work_counts(started)
    return NodeTally(latencies, shown_at, tuple(sorted(stalls)),
                     array("d", node_run.chunk_latencies()), discarded, played_generated,
                     dit_calls)


def node_tallies(run: FleetRecords) -> list[NodeTally]:
    """Every node's tally, from its records (an exact run's)."""
    origins: dict[int, dict[int, tuple[float, float]]] = {}
    for segment in run.segments:
        origins.setdefault(segment.node, {})[segment.stream] = (segment.t_start,
                                                                run.measured(segment))
    out = []
    for node, node_run in enumerate(run.node_runs):
        own = origins.get(node, {})
        spans = [own.get(i, (math.nan, 0.0)) for i in range(len(node_run.streams))]
        out.append(node_tally(node_run, [a for a, _ in spans], [b for _, b in spans]))
    return out


def _played(run: FleetRecords, t0: float, t1: float) -> float:
    """Seconds the segments played within global ``[t0, t1]``."""
    return total(max(0.0, min(s.t_start + s.played, t1) - max(s.t_start, t0))
                 for s in run.segments if not math.isnan(s.t_start))


def _stalled(tallies: Sequence[NodeTally], t0: float, t1: float) -> float:
    return total(window_overlap(start, end, t1, t0)
                 for tally in tallies for start, end in tally.stalls if start < t1 and end > t0)


def _latencies(tallies: Sequence[NodeTally], t0: float = -math.inf,
               t1: float = math.inf) -> list[float]:
    return [value for tally in tallies
            for value, at in zip(tally.latencies, tally.shown_at, strict=True)
            if t0 <= at < t1]


def fleet_samples(run: FleetRecords, tallies: Sequence[NodeTally] | None = None,
                  since: float = 0.0) -> dict[str, tuple[float, ...]]:
    """The values a fleet's quantiles are taken over, to pool them across replications:
    every condition shown from ``since`` on (its L, ``L``) and the time to first chunk of
    every admitted session that arrived from ``since`` on (``ttfc``)."""
    tallies = node_tallies(run) if tallies is None else tallies
    ttfc = tuple(s.ttfc for s in run.sessions if s.status == SERVED and s.arrival >= since
                 and math.isfinite(s.first_display))
    return {"L": tuple(_latencies(tallies, since)), "ttfc": ttfc}


#: The quantiles of :func:`fleet_metrics` that pool every replication's values (the
#: sample they are taken over, the level) rather than averaging each replication's own,
#: as the serving model's summary pools its conditions.
POOLED_QUANTILES = {**{f"L{level}": ("L", level) for level in LEVELS},
                    "ttfc_p95": ("ttfc", 95), "ttfc_p99": ("ttfc", 99)}


def pooled_quantiles(samples: Sequence[Mapping[str, Sequence[float]]]) -> dict:
    """:data:`POOLED_QUANTILES` over the values of every replication's ``samples``, then
    each one's 95% interval, ``{key}_lo``/``_hi``
    (:func:`~latsim.analysis.intervals.percentile_intervals` of the pooled values)."""
    out: dict[str, float | None] = {}
    bounds: dict[str, float | None] = {}
    for key, (name, level) in POOLED_QUANTILES.items():
        values = pooled(sample[name] for sample in samples)
        out[key] = percentile(values, level)
        ((bounds[f"{key}_lo"], bounds[f"{key}_hi"]),) = percentile_intervals(values, [level])
    return {**out, **bounds}


def blocking_bounds(rejected: int, arrived: int, tail: float = 0.05) -> tuple[float, float]:
    """One-sided ``1 − tail`` Clopper–Pearson bounds on the blocking probability, from
    ``rejected`` of ``arrived`` sessions: the lower bound is the p at which P(Bin(arrived,
    p) >= rejected) = ``tail`` (0 with none rejected), the upper the p at which
    P(Bin(arrived, p) <= rejected) = ``tail`` (1 − tail^(1/arrived) with none); the beta
    quantiles those equal (scipy). Sessions are taken as independent trials, as
    Erlang-B's arrivals are."""
    from scipy.special import betaincinv  # scipy.stats.beta.ppf's own function

    if not 0 <= rejected <= arrived or arrived < 1:
        raise ValueError(f"need 0 <= rejected <= arrived >= 1, got {rejected}, {arrived}")
    lower = 0.0 if rejected == 0 else float(betaincinv(rejected, arrived - rejected + 1, tail))
    upper = (1.0 if rejected == arrived
             else float(betaincinv(rejected + 1, arrived - rejected, 1 - tail)))
    return lower, upper


def fleet_metrics(run: FleetRecords, usd_per_gpu_hour: float = 0.0,
                  tallies: Sequence[NodeTally] | None = None,
                  samples: Mapping[str, Sequence[float]] | None = None,
                  since: float = 0.0) -> dict:
    """The metrics of one fleet run (see the module docstring); ``tallies``: its nodes'
    (a sharded run's, whose records stayed with the nodes), else made from its records;
    ``samples``: its :func:`fleet_samples` (from ``since``), where the caller keeps them
    too. ``since``: the end of a warm-up (``[run] warmup``) that no metric counts but the
    work ones (``chunk_*``, ``w``, DiT calls per viewer-hour: those of the whole run)."""
    tallies = node_tallies(run) if tallies is None else tallies
    sessions = [s for s in run.sessions if s.arrival >= since]
    arrived = len(sessions)
    admitted = [s for s in sessions if s.status == SERVED]
    rejected = sum(1 for s in sessions if s.status == REJECTED)
    waiting = sum(1 for s in sessions if s.status == WAITING)
    means = level_means(run, since)
    samples = fleet_samples(run, tallies, since) if samples is None else samples
    ttfc, latencies = list(samples["ttfc"]), list(samples["L"])
    if run.session_window is None:
        played = _played(run, since, run.horizon)
        stalled = _stalled(tallies, since, run.horizon)
        played_all = _played(run, 0.0, run.horizon) if since > 0 else played
    else:  # each session over its own window, as the serving model's summary takes it
        played = total(run.measured(s) for s in run.segments if not math.isnan(s.t_start))
        stalled = total(end - start for tally in tallies for start, end in tally.stalls)
        played_all = played
    chunks = [c for tally in tallies for c in tally.chunks]
    discarded = sum(t.discarded for t in tallies)
    generated = discarded + sum(t.played_generated for t in tallies)
    dit_calls = sum(t.dit_calls for t in tallies)
    gpu_hours = run.node_hours(since=since) * run.gpus_per_node
    viewer_hours = played / 3600.0
    cost = gpu_hours * usd_per_gpu_hour
    return {
        "sessions_arrived": arrived, "sessions_admitted": len(admitted),
        "sessions_rejected": rejected,
        "sessions_queued": sum(1 for s in admitted if s.wait > 0) + waiting,
        "blocking": rejected / arrived if arrived else None,
        "wait_mean": _mean([s.wait for s in admitted]),
        "n_queued_mean": means["queued"],
        "sessions_suspended": sum(s.suspended for s in sessions),
        "migrations": sum(s.migrations for s in sessions),
        "n_sessions_mean": means["present"], "n_active_mean": means["playing"],
        "n_nodes_mean": means["nodes"],
        "util_pct": 100.0 * means["held"] / means["slots"] if means["slots"] else None,
        "ttfc_mean": _mean(ttfc), "ttfc_p95": percentile(ttfc, 95),
        "ttfc_p99": percentile(ttfc, 99),
        **{f"L{level}": percentile(latencies, level) for level in LEVELS},
        "n_conditions_shown": len(latencies),
        "stall_pct": stall_pct(stalled, played),  # None: nothing played
        "chunk_p99": percentile(chunks, 99), "chunk_max": max(chunks) if chunks else None,
        "w": discarded / generated if generated else None,
        "dit_calls_per_viewer_hour": (dit_calls / (played_all / 3600.0) if played_all
                                      else None),
        "gpu_hours": gpu_hours, "cost_usd": cost, "viewer_hours": viewer_hours,
        "cost_per_viewer_hour": cost / viewer_hours if viewer_hours else None,
    }


def fleet_timeseries(run: FleetRecords, window_s: float = 60.0,
                     tallies: Sequence[NodeTally] | None = None) -> list[dict]:
    """One row per window of ``window_s`` seconds: time averages of the counts, and the L95
    and stall % of what was shown and played in it.

    Each record is put in the windows it touches in one pass, in the order the one-window
    sums (:func:`level_means`, :func:`_played`, :func:`_stalled`, :func:`_latencies`) take
    them, so every window's numbers are theirs bit for bit, in time linear in the records
    rather than in records × windows."""
    tallies = node_tallies(run) if tallies is None else tallies
    starts, ends = [], []
    t = 0.0
    while t < run.horizon - 1e-9:
        t1 = min(run.horizon, t + window_s)
        starts.append(t)
        ends.append(t1)
        t = t1

    def touched(a: float, b: float) -> range:
        """The windows [t0, t1) with a < t1 and b > t0."""
        return range(bisect_right(ends, a), bisect_left(starts, b))

    keys = ("present", "playing", "queued", "nodes", "held")
    totals = [dict.fromkeys((*keys, "slots"), 0.0) for _ in starts]
    levels = run.levels
    for i, level in enumerate(levels):
        stop = levels[i + 1].t if i + 1 < len(levels) else math.inf
        for k in touched(level.t, stop):
            span = max(0.0, min(stop, ends[k]) - max(level.t, starts[k]))
            if span <= 0:
                continue
            into = totals[k]
            for key in keys:
                into[key] += getattr(level, key) * span
            into["slots"] += level.usable * run.max_sessions * span
    played: list[list[float]] = [[] for _ in starts]
    for seg in run.segments:
        if not math.isnan(seg.t_start):
            measured = run.measured(seg)
            for k in touched(seg.t_start, seg.t_start + measured):
                played[k].append(max(0.0, min(seg.t_start + measured, ends[k])
                                     - max(seg.t_start, starts[k])))
    stalled: list[list[float]] = [[] for _ in starts]
    shown: list[list[float]] = [[] for _ in starts]
    for tally in tallies:
        for start, end in tally.stalls:
            for k in touched(start, end):
                stalled[k].append(window_overlap(start, end, ends[k], starts[k]))
        for value, at in zip(tally.latencies, tally.shown_at, strict=True):
            k = bisect_right(starts, at) - 1
            if k >= 0 and at < ends[k]:
                shown[k].append(value)
    rows = []
    for k, (t0, t1) in enumerate(zip(starts, ends, strict=True)):
        width = t1 - t0
        means = {key: value / width for key, value in totals[k].items()} if width > 0 \
            else totals[k]
        seconds = total(played[k])
        rows.append({"t_start": t0, "t_end": t1, "sessions": means["present"],
                     "active": means["playing"], "queued": means["queued"],
                     "nodes": means["nodes"], "L95": percentile(shown[k], 95),
                     "n_conditions_shown": len(shown[k]),
                     "stall_pct": stall_pct(total(stalled[k]), seconds)})
    return rows


def node_rows(run: FleetRecords) -> list[dict]:
    """One row per node: when it was up, the sessions it took, the most at once."""
    placed: dict[int, int] = {}
    for s in run.sessions:
        if s.node >= 0:
            placed[s.node] = placed.get(s.node, 0) + 1
    return [{"node": n.node, "t_provisioned": n.t_provisioned, "t_usable": n.t_usable,
             "t_removed": None if math.isnan(n.t_removed) else n.t_removed,
             "sessions_placed": placed.get(n.node, 0), "sessions_max": n.sessions_max,
             "hours": (min(run.horizon, run.horizon if math.isnan(n.t_removed)
                           else n.t_removed) - n.t_provisioned) / 3600.0}
            for n in run.nodes]
