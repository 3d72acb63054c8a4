"""The replan rule at the cache end, both readings side by side (``latsim reproduce
replan-rule``).

A pending condition whose replan branch would fall at (or past) the end of the cache:
``defer`` (DESIGN §2, the default) starts no job and lets the refill take it; ``start``
clamps the branch to the cache end and starts the replan at once
(:data:`latsim.controller.REPLAN_AT_CACHE_END`). They differ where the cache end is often
the first feasible branch: C near T − δ. For three of the paper's settings, at fixed
C ∈ {T − 2δ, T − δ, T − δ/2, T}, on the committed low and high trace sets (one replication
per trace, the same traces for both rules), the speculative policy's L, stall, w and A
under each rule, and the difference start − defer with its paired jackknife standard error
over the traces (:func:`latsim.analysis.metrics.paired_jackknife_se`). The baseline commits
eagerly: nothing cached is replaceable, so the rule does not apply to it, and ``A`` is
measured against the same baseline under both.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from latsim.analysis.intervals import paired_jackknife_se
from latsim.errors import DEFAULT_MAX_EVENTS, check_work
from latsim.experiments.engine import Experiment, plan, plan_events, prefetched, run_experiment
from latsim.experiments.paper_settings import SETTINGS, TRACE_SETS, _trace_root
from latsim.model.costs import FixedCost

#: The paper's settings the table covers (the long Sol-H3 chunk, K = 124, adds only time).
RULE_SETTINGS = ("Wan1.3B short", "Wan1.3B long", "Sol-H3 short")
#: C as T minus this many slots δ.
SLOTS_BELOW_T = (2.0, 1.0, 0.5, 0.0)


def _experiments(root: Path, max_events: int) -> list[tuple[dict, Experiment, Experiment]]:
    """(row identity, defer experiment, start experiment) of every table cell."""
    cells = []
    for setting in (s for s in SETTINGS if s.name in RULE_SETTINGS):
        timing = setting.timing
        for below in SLOTS_BELOW_T:
            C = round(timing.T - below * timing.delta, 9)
            for load in TRACE_SETS:
                defer = Experiment(Ks=(setting.K,), r=setting.r, fps=setting.fps,
                                   cost=FixedCost(C), updates=f"traces:{root / load}",
                                   max_events=max_events, records="none")
                identity = {"setting": setting.name, "K": setting.K, "T": timing.T,
                            "delta": timing.delta, "C": C, "C_below_T_slots": below,
                            "load": load}
                cells.append((identity, defer, replace(defer, replan_at_cache_end="start")))
    return cells


def _speculative(result) -> tuple[dict, list]:  # ExperimentResult
    row = next(r for r in result.rows if r["policy"] == "speculative")
    runs = next(runs for (_, policy), runs in result.runs.items() if policy == "speculative")
    return row, runs


def _latency_components(runs: list) -> np.ndarray:
    """Per replication: the sum of L over displayed conditions, and their count."""
    return np.array([[sum(c.L for c in run.conditions if c.displayed),
                      sum(1 for c in run.conditions if c.displayed)] for run in runs])


def _difference_of_means(totals: np.ndarray) -> float:
    return float(totals[2] / totals[3] - totals[0] / totals[1])


def replan_rule_rows(root: Path, jobs: int | None = None,
                     max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """One row per (setting, C, load): each rule's speculative metrics and start − defer."""
    cells = _experiments(root, max_events)
    check_work(sum(plan_events(plan(e)) for _, *pair in cells for e in pair), max_events,
               "--max-events", "the table's simulations come to about {n} events (latent "
               "slots and conditions)")
    rows = []
    with prefetched([e for _, *pair in cells for e in pair], jobs):
        for identity, defer, start in cells:
            (kept, kept_runs), (started, started_runs) = (
                _speculative(run_experiment(e, jobs=jobs)) for e in (defer, start))
            components = np.hstack([_latency_components(kept_runs),
                                    _latency_components(started_runs)])
            row = dict(identity)
            for name, source in (("defer", kept), ("start", started)):
                for key in ("L_mean", "L95", "stall_pct", "w", "A", "R_mean", "Q_mean"):
                    row[f"{key}_{name}"] = source[key]
            row["dL_mean"] = _difference_of_means(components.sum(axis=0))
            row["dL_mean_se"] = paired_jackknife_se(components, _difference_of_means)
            for key in ("stall_pct", "w", "A"):
                a, b = kept[key], started[key]
                row[f"d{key}"] = None if a is None or b is None else b - a
            row["n_conditions"] = kept["n_conditions"]
            rows.append({k: round(v, 6) + 0.0 if isinstance(v, float) else v  # no -0.0
                         for k, v in row.items()})
    return rows


def reproduce_replan_rule(out: Path, traces_root: Path | None = None,
                          jobs: int | None = None,
                          max_events: int = DEFAULT_MAX_EVENTS) -> dict[str, list[dict]]:
    """Compute the table and write ``replan_rule.csv`` into ``out``."""
    from latsim.run.files import write_rows_csv

    with tempfile.TemporaryDirectory() as tmp:
        rows = replan_rule_rows(_trace_root(traces_root, Path(tmp)), jobs, max_events)
    out.mkdir(parents=True, exist_ok=True)
    write_rows_csv(out / "replan_rule.csv", rows)
    return {"replan_rule": rows}
