"""``latsim reproduce fleet``: the fleet questions of DESIGN §8 answered on stated workloads
(→ ``results/fleet/``). Every workload number here is an assumption (no provider's trace
is public); the nodes' timings are the paper's.

- ``sharded_vs_exact.csv``: every metric of a fleet with cold starts in both modes, paired
  over the same replications: the error of sharding.
- ``diurnal.csv``: a day with a 5:1 peak-to-trough arrival curve (compressed to
  :data:`DAY_S` seconds), lognormal durations and active/idle alternation, served by a
  static fleet sized for the peak or an autoscaled one, with round-robin or min-max
  placement: GPU-hours, cost, worst per-chunk latency, L95 and TTFC. TurboServe reports
  −37.5 % worst-case per-chunk latency and −37.2 % GPU cost for its control plane on its
  own production workload; this is a different workload, not a reproduction, and the
  ``vs_static_round_robin_pct`` columns give our direction and size.
- ``policy.csv``: the paper's Wan1.3B and Sol-H3 long-chunk settings at fleet scale: the
  smallest static fleet meeting an L95 SLO under chunk-boundary (baseline) and
  latent-boundary (speculative) commitment, with w and the work per viewer-hour beside it;
  A is the speculative fleet's work over the baseline fleet's at the loosest SLO the
  baseline meets (none: no fleet of up to 8 nodes meets it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from latsim.errors import DEFAULT_MAX_EVENTS
from latsim.experiments.fleet import plan_fleet, pooled_row, run_fleet, sharded_vs_exact
from latsim.experiments.fleet_plan import FleetSLO, plan_fleet_size
from latsim.model.fleet import FleetRun, parse_fleet
from latsim.writing import replacing

#: The compressed day: the arrival curve's period (s).
DAY_S = 7200.0
#: Peak and trough arrival rates (sessions/s): 5:1.
PEAK_RATE, TROUGH_RATE = 1 / 6, 1 / 30
#: Pieces of the curve over the day.
CURVE_PIECES = 24
SEEDS = 2

#: The node of the diurnal day and of the sharding check: Wan1.3B's timing (16 fps, r = 4),
#: K = 8, a lognormal DiT time of mean 0.5 s, three sessions per DiT GPU.
NODE = {"K": 8, "r": 4, "fps": 16.0, "cost": "lognormal:0.5,0.2", "pools": "dit=1",
        "max_sessions": 3, "lead": 1.0, "cold_start": True}


#: Migration as assumed for the day: 2 GB of a session's state over 200 Gb/s, plus 50 ms
#: (a pause of 0.13 s, which a 1 s lead's buffer plays through).
MIGRATION = {"migration": True, "state_bytes": 2e9, "bandwidth": 25e9,
             "migration_fixed_s": 0.05}


def diurnal_curve(path: Path) -> Path:
    """A sinusoid with a 5:1 peak-to-trough ratio over :data:`DAY_S`, as ``t,rate`` pieces
    (the trough at 0, the peak at midday)."""
    mid, amplitude = (PEAK_RATE + TROUGH_RATE) / 2, (PEAK_RATE - TROUGH_RATE) / 2
    rows = ["t,rate"]
    for i in range(CURVE_PIECES):
        t = i * DAY_S / CURVE_PIECES
        phase = 2 * math.pi * i / CURVE_PIECES  # the first piece the trough, piece 12 the peak
        rows.append(f"{t:g},{mid - amplitude * math.cos(phase):.6f}")
    with replacing(path) as tmp:
        tmp.write_text("\n".join(rows) + "\n")
    return path


def _fleet(workload: dict, fleet: dict, run: dict, node: dict | None = None) -> FleetRun:
    return parse_fleet({"workload": workload, "node": {**NODE, **(node or {})},
                        "fleet": fleet, "run": run}, "reproduce fleet")


def sharded_table(max_events: int, step: Callable[[], None] = lambda: None) -> list[dict]:
    run = _fleet({"arrivals": "poisson:0.1", "duration": "lognormal:120,1.0",
                  "activity": "active_idle:60,20", "updates": "poisson:0.1"},
                 {"nodes_initial": 1, "nodes_max": 6, "autoscale": True,
                  "placement": "least-loaded", "admission": "queue", "cooldown_s": 60,
                  "provision_delay_s": 60, "suspend_after_s": 15, "resume_s": 1.0,
                  "usd_per_gpu_hour": 3.0},
                 {"duration": 1800, "seeds": 4})
    rows = sharded_vs_exact(run, max_events)
    step()
    return rows


def diurnal_table(curve: Path, max_events: int, step: Callable[[], None] = lambda: None
                  ) -> list[dict]:
    peak_nodes = math.ceil(PEAK_RATE * 120 / NODE["max_sessions"])
    base_workload = {"arrivals": f"curve:{curve}", "duration": "lognormal:120,1.0",
                     "activity": "active_idle:60,20", "updates": "poisson:0.1"}
    common = {"admission": "queue", "suspend_after_s": 15, "resume_s": 1.0,
              "usd_per_gpu_hour": 3.0}
    configurations = [
        ("static peak", "round-robin", {"nodes_initial": peak_nodes, "nodes_max": peak_nodes}),
        ("static peak", "min-max", {"nodes_initial": peak_nodes, "nodes_max": peak_nodes}),
        ("autoscaled", "round-robin", {"nodes_initial": 1, "nodes_max": peak_nodes,
                                        "autoscale": True}),
        ("autoscaled", "min-max", {"nodes_initial": 1, "nodes_max": peak_nodes,
                                    "autoscale": True}),
        ("autoscaled", "min-max + migration", {"nodes_initial": 1, "nodes_max": peak_nodes,
                                                "autoscale": True, **MIGRATION}),
    ]
    rows = []
    for fleet_kind, placement, fleet in configurations:
        run = _fleet(base_workload,
                     {**common, **fleet, "placement": placement.split(" + ")[0],
                      "target_util": 0.7, "hysteresis": 0.15, "cooldown_s": 60,
                      "provision_delay_s": 60},
                     {"duration": DAY_S, "seeds": SEEDS})
        fp = plan_fleet(run, max_events)
        row = pooled_row(fp, run_fleet(fp))
        step()
        rows.append({"fleet": fleet_kind, "placement": placement,
                     **{key: row[key] for key in (
                         "nodes_max", "n_nodes_mean", "gpu_hours", "gpu_hours_se", "cost_usd",
                         "cost_per_viewer_hour", "chunk_max", "chunk_max_se", "chunk_p99",
                         "L95", "L95_se", "stall_pct", "stall_pct_se", "ttfc_mean",
                         "ttfc_p95", "wait_mean", "sessions_arrived", "migrations",
                         "n_runs")}})
    reference = rows[0]
    for row in rows:
        for key in ("chunk_max", "cost_usd", "L95", "ttfc_mean"):
            base = reference[key]
            row[f"{key}_vs_static_round_robin_pct"] = (
                None if not base else 100.0 * (row[key] - base) / base)
    return rows


#: The paper's long-chunk settings (``results/paper/settings.csv``): K, r, fps, C.
POLICY_SETTINGS = (("Wan1.3B long", 21, 4, 16.0, 0.8925), ("Sol-H3 long", 124, 1, 24.0, 0.93))
#: L95 SLOs (s): one both commitment units can meet, one only latent commitment can.
POLICY_SLOS = (7.0, 3.0)


def policy_table(max_events: int, step: Callable[[], None] = lambda: None) -> list[dict]:
    rows = []
    for name, K, r, fps, C in POLICY_SETTINGS:
        base_work = None  # the baseline's work at the loosest SLO it meets: A's denominator
        run = _fleet({"arrivals": "poisson:0.05", "duration": "exponential:120",
                      "updates": "poisson:0.1"},
                     {"placement": "least-loaded", "admission": "queue",
                      "usd_per_gpu_hour": 3.0},
                     {"duration": 900, "seeds": SEEDS},
                     {"K": K, "r": r, "fps": fps, "cost": f"fixed:{C}", "max_sessions": 8,
                      "lead": round(2 * C, 6)})
        # measured in steady state, as latsim fleet plan measures: after the ramp from empty
        run = replace(run, warmup=run.workload.steady_warmup())
        for l95 in POLICY_SLOS:
            plans, _ = plan_fleet_size(run, FleetSLO(l95, 1.0), max_nodes=8,
                                       max_events=max_events)
            step()
            by_policy = {p["policy"]: p for p in plans}
            base_work = base_work or by_policy["baseline"]["static_dit_calls_per_viewer_hour"]
            for policy, plan in by_policy.items():
                work = plan["static_dit_calls_per_viewer_hour"]
                rows.append({
                    "setting": name, "K": K, "C": C, "slo_l95": l95, "slo_stall_pct": 1.0,
                    "policy": policy, "nodes_needed": plan["nodes_static"],
                    "gpu_hours": plan["static_gpu_hours"],
                    "cost_per_viewer_hour": plan["static_cost_per_viewer_hour"],
                    "L95": plan["static_L95"], "stall_pct": plan["static_stall_pct"],
                    "w": plan["static_w"], "dit_calls_per_viewer_hour": work,
                    "A": (None if work is None or not base_work else work / base_work)})
    return rows


#: The steps :func:`reproduce_fleet` reports: the sharded-vs-exact pair, each diurnal
#: configuration, each (setting, SLO) fleet plan.
STEPS = 1 + 5 + len(POLICY_SETTINGS) * len(POLICY_SLOS)


def reproduce_fleet(out: Path, max_events: int = DEFAULT_MAX_EVENTS,
                    progress: Callable[[int, int], None] | None = None
                    ) -> dict[str, list[dict]]:
    """Write the three tables (and the day's curve) into ``out``; returns the tables.
    ``progress(done, total)`` counts :data:`STEPS`."""
    from latsim.run.files import write_rows_csv

    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, STEPS)

    out.mkdir(parents=True, exist_ok=True)
    curve = diurnal_curve(out / "diurnal_curve.csv")
    tables = {"sharded_vs_exact": sharded_table(max_events, step),
              "diurnal": diurnal_table(curve, max_events, step),
              "policy": policy_table(max_events, step)}
    for name, rows in tables.items():
        write_rows_csv(out / f"{name}.csv", rows)
    return tables
