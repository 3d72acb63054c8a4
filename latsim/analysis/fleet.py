"""Metrics of fleet runs (DESIGN §8): what a serving engineer reads.

Over ``[0, horizon]`` of one run (keys in seconds unless named otherwise):

- sessions: ``sessions_arrived``, ``sessions_admitted``, ``sessions_rejected``,
  ``sessions_queued`` (admitted after a wait, or still waiting at the end), ``blocking``
  (rejected / arrived), ``wait_mean`` (admission wait of the admitted), ``queue_mean``
  (time-average sessions waiting), ``sessions_suspended`` (idle periods suspended);
- occupancy: ``sessions_mean`` (time-average sessions present: admitted and not left,
  idle ones included), ``active_mean`` (time-average segments playing), ``nodes_mean``,
  ``util_pct`` (time-average slots held over the slots of the nodes taking sessions);
- viewers: ``ttfc_mean``, ``ttfc_p95``, ``ttfc_p99`` (arrival to first frame shown),
  ``L50``, ``L95``, ``L99`` (every shown condition, client send to client display),
  ``stall_pct`` (the share of played time the viewers saw frozen: server stalls plus late
  deliveries), ``chunk_p99`` and ``chunk_max`` (a DiT task's wait plus run: the
  per-chunk latency), ``w`` (the share of generated latents discarded) and
  ``dit_calls_per_viewer_hour`` (the work: a speculative fleet's over a baseline one's is
  its amplification A);
- cost: ``gpu_hours`` (node-hours paid for, provisioning and draining included, times the
  node's devices), ``cost_usd``, ``viewer_hours`` (played time), ``cost_per_viewer_hour``.

:func:`fleet_timeseries` gives the same per window (a minute by default), and
:func:`node_rows` per node.
"""

from __future__ import annotations

import math

import numpy as np

from latsim.analysis.metrics import summarize
from latsim.run.fleet import REJECTED, SERVED, WAITING, FleetRecords


def _quantile(values: list[float], level: float) -> float | None:
    return float(np.percentile(values, level)) if values else None


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


def _stall_seconds(run: FleetRecords, t0: float = 0.0, t1: float = math.inf
                   ) -> tuple[float, float]:
    """(stalled, played) seconds of every segment within global ``[t0, t1]``."""
    stalled = played = 0.0
    client = {}
    for node, node_run in enumerate(run.node_runs):
        for stall in node_run.client_stalls:
            client.setdefault((node, stall.stream), []).append((stall.t_start, stall.t_end))
    for segment in run.segments:
        if math.isnan(segment.t_start):
            continue
        origin, length = segment.t_start, segment.played
        lo, hi = max(0.0, t0 - origin), min(length, t1 - origin)
        if hi <= lo:
            continue
        played += hi - lo
        stream = run.node_runs[segment.node].streams[segment.stream]
        intervals = [(s.t_start, s.t_end) for s in stream.stalls]
        intervals += client.get((segment.node, segment.stream), [])
        for start, end in intervals:
            stalled += max(0.0, min(end, hi) - max(start, lo))
    return stalled, played


def _shown_latencies(run: FleetRecords, t0: float = 0.0, t1: float = math.inf
                     ) -> list[float]:
    """End-to-end L of every condition shown at a client within global ``[t0, t1)``."""
    origin = {(s.node, s.stream): s.t_start for s in run.segments}
    out = []
    for node, node_run in enumerate(run.node_runs):
        for view in node_run.viewer:
            if not view.displayed:
                continue
            shown = origin[(node, view.stream)] + view.t_display
            if math.isinf(t1) or t0 <= shown < t1:
                out.append(view.L)
    return out


def fleet_metrics(run: FleetRecords, usd_per_gpu_hour: float = 0.0) -> dict:
    """The metrics of one fleet run (see the module docstring)."""
    sessions = run.sessions
    arrived = len(sessions)
    admitted = [s for s in sessions if s.status == SERVED]
    rejected = sum(1 for s in sessions if s.status == REJECTED)
    waiting = sum(1 for s in sessions if s.status == WAITING)
    means = level_means(run)
    ttfc = [s.ttfc for s in admitted if math.isfinite(s.first_display)]
    latencies = _shown_latencies(run)
    stalled, played = _stall_seconds(run, 0.0, run.horizon)
    chunks = [c for node_run in run.node_runs for c in node_run.chunk_latencies()]
    streams = [run.node_runs[s.node].streams[s.stream] for s in run.segments
               if not math.isnan(s.t_start)]
    work = summarize(streams) if streams else None
    gpu_hours = run.node_hours() * run.gpus_per_node
    viewer_hours = played / 3600.0
    cost = gpu_hours * usd_per_gpu_hour
    return {
        "sessions_arrived": arrived, "sessions_admitted": len(admitted),
        "sessions_rejected": rejected,
        "sessions_queued": sum(1 for s in admitted if s.wait > 0) + waiting,
        "blocking": rejected / arrived if arrived else None,
        "wait_mean": _mean([s.wait for s in admitted]),
        "queue_mean": means["queued"],
        "sessions_suspended": sum(s.suspended for s in sessions),
        "sessions_mean": means["present"], "active_mean": means["playing"],
        "nodes_mean": means["nodes"],
        "util_pct": 100.0 * means["held"] / means["slots"] if means["slots"] else None,
        "ttfc_mean": _mean(ttfc), "ttfc_p95": _quantile(ttfc, 95),
        "ttfc_p99": _quantile(ttfc, 99),
        "L50": _quantile(latencies, 50), "L95": _quantile(latencies, 95),
        "L99": _quantile(latencies, 99), "n_conditions_shown": len(latencies),
        "stall_pct": 100.0 * stalled / played if played else 0.0,
        "chunk_p99": _quantile(chunks, 99), "chunk_max": max(chunks) if chunks else None,
        "w": None if work is None else work.w,
        "dit_calls_per_viewer_hour": (work.dit_calls / viewer_hours
                                      if work is not None and viewer_hours else None),
        "gpu_hours": gpu_hours, "cost_usd": cost, "viewer_hours": viewer_hours,
        "cost_per_viewer_hour": cost / viewer_hours if viewer_hours else None,
    }


def fleet_timeseries(run: FleetRecords, window_s: float = 60.0) -> list[dict]:
    """One row per window of ``window_s`` seconds: time averages of the counts, and the L95
    and stall % of what was shown and played in it."""
    rows = []
    t = 0.0
    while t < run.horizon - 1e-9:
        t1 = min(run.horizon, t + window_s)
        means = level_means(run, t, t1)
        stalled, played = _stall_seconds(run, t, t1)
        latencies = _shown_latencies(run, t, t1)
        rows.append({"t_start": t, "t_end": t1, "sessions": means["present"],
                     "active": means["playing"], "queued": means["queued"],
                     "nodes": means["nodes"], "L95": _quantile(latencies, 95),
                     "n_conditions_shown": len(latencies),
                     "stall_pct": 100.0 * stalled / played if played else None})
        t = t1
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
