"""Metrics of serving runs (DESIGN §6): end-to-end latency, viewer stalls, pools, queues.

Pooled over streams and replications, and per stream. The server-side metrics of
:func:`latsim.analysis.metrics.summarize` keep their meaning (R, C, Q, server stall %,
waste); this module adds what the viewer and the pools see:

- ``L_mean/L50/L95/L99``: end-to-end latency, client send to client display
  (uplink + R + C + Q + playout delay + any client-side lateness); ``L_server_*`` the
  controller's ``R + C + Q``.
- ``client_stall_pct``: time the client froze because a slot arrived after its display time;
  ``viewer_stall_pct`` adds the server's stalls (each delays the client's display one for one).
- ``*_lo``/``*_hi``: 95% confidence intervals (:mod:`latsim.analysis.intervals`): of each
  L percentile, over the pooled conditions; of each stall %, the t interval over
  replications (a replication's streams together: they share the devices).
- ``cpr``: continuous-play ratio, the share of each stream's whole seconds of the window
  (stream time) in which the viewer saw no stall.
- ``ttff_mean``: time to first frame from joining (with ``cold_start``, the wait for the
  first chunk on the pools plus the playout delay; otherwise the playout delay and any
  lateness of the first slot).
- ``busy_pct_by_pool`` / ``busy_pct_by_device``: time-weighted busy % over
  ``[0, window_end]``, the simulated kernel activity; ``busy_pct`` is the DiT pool's.
- ``queue_wait_mean_by_stage`` / ``queue_wait_p95_by_stage``: seconds tasks waited for a
  device, per stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from latsim.analysis.intervals import (
    paired_jackknife_se,
    replication_percentile_se,
    stall_interval,
)
from latsim.analysis.latency import LEVELS, VIEWER, latency_stats, percentile
from latsim.analysis.metrics import stall_pct, stall_time_in_window, summarize
from latsim.numeric import total
from latsim.run.serving import ServingRecords
from latsim.run.stream import RunRecords, window_overlap
from latsim.run.viewer import ViewerRecords


def _client_stall_by_stream(run: ServingRecords) -> list[float]:
    """Each stream's client stall seconds in the window, its stalls added in order."""
    stalls: list[list[float]] = [[] for _ in run.streams]
    for s in run.client_stalls:
        stalls[s.stream].append(window_overlap(s.t_start, s.t_end, run.duration))
    return [total(own) for own in stalls]


def _by_stream(run: ServingRecords) -> list[list[float]]:
    """Each stream's displayed conditions' L, in the viewer records' order."""
    latencies: list[list[float]] = [[] for _ in run.streams]
    for v in run.viewer:
        if v.displayed:
            latencies[v.stream].append(v.L)
    return latencies


def _stall_seconds(runs: Sequence[ServingRecords]) -> tuple[float, float, float]:
    """(client stall, server stall, window) seconds over every stream of ``runs``."""
    client = total(seconds for run in runs for seconds in _client_stall_by_stream(run))
    server = total(stall_time_in_window(s) for run in runs for s in run.streams)
    return client, server, total(s.duration for run in runs for s in run.streams)


def viewer_stall_pct(runs: Sequence[ServingRecords]) -> float | None:
    """The share of the streams' windows the viewers saw frozen (server stalls plus late
    deliveries), in percent (:func:`~latsim.analysis.metrics.stall_pct`)."""
    client, server, window = _stall_seconds(runs)
    return stall_pct(client + server, window)


def _pct(totals: np.ndarray) -> float:
    return 100.0 * float(totals[0] / totals[1]) if totals[1] > 0 else math.nan


def replication_se(runs: Sequence[ServingRecords]) -> dict[str, float | None]:
    """Standard errors over replications of the pooled metrics a figure draws error bars
    for: ``L50_se``, ``L95_se`` and ``L99_se`` (the viewer's L, bootstrap of the pooled
    percentile over replications, :func:`~latsim.analysis.intervals.replication_percentile_se`),
    ``stall_pct_se`` (the server's) and ``viewer_stall_pct_se`` (jackknife of
    the pooled stall time over the pooled window). None with fewer than two replications."""
    shown = [[v.L for v in run.viewer if v.displayed] for run in runs]
    out: dict[str, float | None] = {
        f"L{level}_se": replication_percentile_se(shown, level) for level in LEVELS}
    seconds = [_stall_seconds([run]) for run in runs]
    server = np.array([[s, w] for _, s, w in seconds]).reshape(-1, 2)
    viewer = np.array([[c + s, w] for c, s, w in seconds]).reshape(-1, 2)
    out["stall_pct_se"] = paired_jackknife_se(server, _pct)
    out["viewer_stall_pct_se"] = paired_jackknife_se(viewer, _pct)
    return out


def _stall_intervals(run: ServingRecords, stream: int) -> list[tuple[float, float]]:
    own = run.streams[stream]
    return ([(s.t_start, s.t_end) for s in own.stalls]
            + [(s.t_start, s.t_end) for s in run.client_stalls if s.stream == stream])


def _smooth_seconds(intervals: list[tuple[float, float]], duration: float) -> tuple[int, int]:
    """(whole seconds of ``[0, duration)`` touched by no interval, whole seconds)."""
    seconds = int(duration)
    if seconds == 0:
        return 0, 0
    stalled = np.zeros(seconds, dtype=bool)
    for start, end in intervals:
        first, last = max(0, math.floor(start)), min(seconds - 1, math.ceil(end) - 1)
        if end > start and first <= last:
            stalled[first:last + 1] = True
    return int(seconds - stalled.sum()), seconds


def _stall_intervals_by_replication(runs: Sequence[ServingRecords]) -> dict:
    """``stall_pct``'s, ``client_stall_pct``'s and ``viewer_stall_pct``'s ``_lo``/``_hi``:
    t intervals over the replications (:func:`~latsim.analysis.intervals.stall_interval`)."""
    seconds = [_stall_seconds([run]) for run in runs]
    windows = [w for _, _, w in seconds]
    out = {}
    for key, stalled in (("stall_pct", [s for _, s, _ in seconds]),
                         ("client_stall_pct", [c for c, _, _ in seconds]),
                         ("viewer_stall_pct", [c + s for c, s, _ in seconds])):
        out[f"{key}_lo"], out[f"{key}_hi"] = stall_interval(stalled, windows)
    return out


def serving_metrics(runs: Sequence[ServingRecords]) -> dict:
    """The serving metrics pooled over ``runs`` (streams and replications): see the module
    docstring. Server-side metrics come from :func:`summarize` over every stream's run."""
    stream_runs: list[RunRecords] = [s for run in runs for s in run.streams]
    base = summarize(stream_runs).as_dict()
    shown = [v for run in runs for v in run.viewer if v.displayed]
    viewer = latency_stats([v.L for v in shown])
    server = latency_stats([v.L_server for v in shown], "L_server")
    client_stall, server_stall, window = _stall_seconds(runs)
    smooth = [_smooth_seconds(_stall_intervals(run, i), run.duration)
              for run in runs for i in range(len(run.streams))]
    ttff = [s.ttff for run in runs for s in run.starts if math.isfinite(s.ttff)]
    busy_device: dict[str, list[float]] = {}
    device_window: dict[str, float] = {}
    for run in runs:
        for pool, seconds in run.busy_by_device().items():
            totals = busy_device.setdefault(pool, [0.0] * len(seconds))
            busy_device[pool] = [a + b for a, b in zip(totals, seconds, strict=True)]
            device_window[pool] = device_window.get(pool, 0.0) + run.window_end
    busy_pct_by_device = {pool: [100.0 * b / device_window[pool] for b in seconds]
                          for pool, seconds in busy_device.items()}
    busy_pct_by_pool = {pool: float(np.mean(pcts)) for pool, pcts in busy_pct_by_device.items()}
    waits: dict[str, list[float]] = {}
    for run in runs:
        for stage, stage_waits in run.waits_by_stage().items():
            waits.setdefault(stage, []).extend(stage_waits)
    return {
        **base,
        **viewer,
        **{key: value for key, value in server.items() if key != "L_server_mean_se"},
        "L_basis": VIEWER,
        "uplink_mean": (float(np.mean([v.uplink for v in shown])) if shown else None),
        "playout_delay": runs[0].playout_delay if runs else None,
        "busy_pct": busy_pct_by_pool.get("dit", base["busy_pct"]),
        "client_stall_pct": stall_pct(client_stall, window),
        "viewer_stall_pct": stall_pct(client_stall + server_stall, window),
        **_stall_intervals_by_replication(runs),
        "cpr": (total(a for a, _ in smooth) / total(b for _, b in smooth)
                if total(b for _, b in smooth) else None),
        "ttff_mean": float(np.mean(ttff)) if ttff else None,
        "n_streams": len(runs[0].streams) if runs else 0,
        "busy_pct_by_pool": busy_pct_by_pool,
        "busy_pct_by_device": busy_pct_by_device,
        "queue_wait_mean_by_stage": {k: float(np.mean(v)) for k, v in sorted(waits.items())},
        "queue_wait_p95_by_stage": {k: percentile(v, 95) for k, v in sorted(waits.items())},
    }


def per_stream_rows(runs: Sequence[ServingRecords]) -> list[dict]:
    """One row per stream index, pooled over the replications: its L percentiles, stalls,
    time to first frame and mean R (the wait its conditions saw, queueing included)."""
    if not runs:
        return []
    rows = []
    # grouped once (a scan of every record for each stream was quadratic in streams)
    latencies = [_by_stream(run) for run in runs]
    client_stalls = [_client_stall_by_stream(run) for run in runs]
    for index in range(len(runs[0].streams)):
        own = [run.streams[index] for run in runs]
        latency = latency_stats([value for by_stream in latencies
                                 for value in by_stream[index]])
        base = summarize(own)
        window = total(r.duration for r in own)
        client = total(by_stream[index] for by_stream in client_stalls)
        ttff = [run.starts[index].ttff for run in runs if math.isfinite(run.starts[index].ttff)]
        rows.append({
            "stream": index, "n_conditions": base.n_conditions,
            **{key: latency[key] for key in ("L_mean", "L50", "L95", "L99")},
            "R_mean": base.R_mean, "C_obs_mean": base.C_obs_mean,
            "Q_mean": base.Q_mean, "stall_pct": base.stall_pct,
            "client_stall_pct": stall_pct(client, window),
            "ttff_mean": float(np.mean(ttff)) if ttff else None, "w": base.w,
        })
    return rows


def viewer_metrics(records: ViewerRecords, duration: float) -> dict:
    """A live client run's metrics (:mod:`latsim.run.viewer`), with the definitions of
    :func:`serving_metrics`: L over the shown conditions; client and viewer stall % over
    ``[0, duration]`` of stream time (viewer = server stalls + client stalls); the uplink
    and deliver delays; how late the display callbacks ran; C over the jobs a device ran."""
    shown = [c for c in records.conditions if c.status == "shown"]
    server = total(window_overlap(s.t_start, s.t_end, duration)
                 for s in records.stalls if s.side == "server")
    client = total(window_overlap(s.t_start, s.t_end, duration)
                 for s in records.stalls if s.side == "client")
    ran = [j for j in records.jobs if j.kind != "prebuffer"]  # the prebuffer ran on no device

    def stats(values: list[float], prefix: str) -> dict:
        return latency_stats([v for v in values if math.isfinite(v)], prefix)

    return {
        "n_conditions": len(records.conditions), "n_displayed": len(shown),
        "n_lost": sum(c.status in ("lost", "refused") for c in records.conditions),
        **stats([c.L for c in shown], "L"),
        **stats([c.L_server for c in shown], "L_server"),
        "L_basis": VIEWER,
        "stall_pct": stall_pct(server, duration),
        "client_stall_pct": stall_pct(client, duration),
        "viewer_stall_pct": stall_pct(server + client, duration),
        **stats([c.t_arrival - c.t_sent for c in records.conditions], "uplink"),
        **stats([s.t_received - s.t_start for s in records.slots], "deliver"),
        **stats([s.t_displayed - s.t_shown for s in records.slots], "display_lateness"),
        "C_mean": total(j.C for j in ran) / len(ran) if ran else None,
        "n_jobs": len(ran), "n_slots": len(records.slots),
        "bytes_received": sum(s.bytes for s in records.slots),
    }
