"""Summary metrics computed from records (DESIGN §2): latency percentiles, stall %, busy %,
waste w and DiT calls. Works on simulated and measured records alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from latsim.sim.simpy_driver import RunRecords


@dataclass(frozen=True)
class Metrics:
    """Pooled over one or more runs of the same configuration. ``None`` = no data."""

    L_mean: float | None
    L_mean_se: float | None  # standard error of L_mean
    L50: float | None
    L95: float | None
    R_mean: float | None
    C_obs_mean: float | None
    Q_mean: float | None
    stall_pct: float
    busy_pct: float
    w: float | None
    dit_calls: int
    played: int
    discarded: int
    n_conditions: int
    n_displayed: int
    n_superseded: int
    n_censored: int
    n_runs: int
    window_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def stall_time_in_window(run: RunRecords) -> float:
    """Seconds the player was frozen within ``[0, duration]``."""
    return sum(
        max(0.0, min(s.t_end, run.duration) - max(s.t_start, 0.0)) for s in run.stalls
    )


def summarize(runs: Sequence[RunRecords]) -> Metrics:
    """Pool the runs' records into one set of metrics.

    L, R, C, Q statistics use every displayed condition, superseded ones included: DESIGN §2
    defines a condition's display as the first slot of a version at least its own, and leaving
    out the overtaken ones would drop the longest waits (under chunk commitment, exactly the
    early arrivals of a chunk window) and bias L low. Censored conditions (never displayed
    before the drain ended) are counted, not averaged. Stall % and busy % are time-weighted
    over the runs' windows; w counts latents played or discarded in the window.
    """
    shown = [c for run in runs for c in run.conditions if c.displayed]
    latencies = np.array([c.L for c in shown], dtype=float)
    window = sum(run.duration for run in runs)
    played = sum(1 for run in runs for s in run.slots if s.t_start < run.duration)
    discarded = sum(d.count for run in runs for d in run.discards if d.t < run.duration)
    n_all = sum(len(run.conditions) for run in runs)
    n_superseded = sum(1 for run in runs for c in run.conditions if c.superseded)
    n_censored = sum(1 for run in runs for c in run.conditions if not c.displayed)
    has_latency = latencies.size > 0
    return Metrics(
        L_mean=float(latencies.mean()) if has_latency else None,
        L_mean_se=(
            float(latencies.std(ddof=1) / math.sqrt(latencies.size))
            if latencies.size > 1
            else None
        ),
        L50=float(np.percentile(latencies, 50)) if has_latency else None,
        L95=float(np.percentile(latencies, 95)) if has_latency else None,
        R_mean=_mean([c.R for c in shown]),
        C_obs_mean=_mean([c.C for c in shown]),
        Q_mean=_mean([c.Q for c in shown]),
        stall_pct=100.0 * sum(stall_time_in_window(run) for run in runs) / window,
        busy_pct=100.0 * sum(run.busy_in_window for run in runs) / window,
        w=discarded / (discarded + played) if played + discarded else None,
        dit_calls=sum(run.calls_in_window for run in runs),
        played=played,
        discarded=discarded,
        n_conditions=n_all,
        n_displayed=n_all - n_censored - n_superseded,
        n_superseded=n_superseded,
        n_censored=n_censored,
        n_runs=len(runs),
        window_s=window,
    )
