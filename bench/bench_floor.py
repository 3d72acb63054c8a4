"""The engine's floor in pure Python: what a job costs the controller alone, beside what
the engine issue's targets allow, and how one heap of N timers grows.

Run: ``.venv/bin/python bench/bench_floor.py [--json]``. Reports numbers; asserts nothing.
CPU seconds of this process, the garbage collector paused (as the experiment engine's work
units run), best of 3 alternated runs. ``--json`` keeps this build's figures in
``results/bench/floor.json``, which docs/testing.md quotes.

1. **A job's floor.** One stream, baseline, no conditions, no device shared: the
   single-stream driver plays whole refill cycles with no timer each
   (``latsim.sim.simpy_driver._refill_cycles``), so its CPU per job is the controller's
   own work on a job (the quiet fast paths, the slot bookkeeping of K slots, the job's
   record and tallies) plus one cost draw. The serving model does at least this per job,
   and the device queue, the dispatch and the clock on top. Beside it: plain SimPy's CPU
   per job on ``bench/bench_serving.py``'s first workload (N periodic streams, one FIFO
   device, ρ = 0.5), and the budget per job its target (0.5 of plain SimPy's jobs per
   second) leaves: twice plain SimPy's. The serving model needs at least the sum of the
   two; where the sum is over the budget, the target is out of reach in pure Python with
   one controller for both clocks on SimPy (2026-12-04, idle 2 cores: plain 12.6 µs, the
   controller 15.7 µs at K = 8, so at most 0.44–0.45 of plain SimPy's jobs/s; the serving model
   reaches 0.21–0.22; later that day, after the refill cycle's events, commands and books
   were built more cheaply: plain 12.5 µs, the controller 14.0 µs, at most 0.47; the
   serving model 0.25).
2. **A heap of N timers.** Bare SimPy, N periodic timers of period 1 s at random phases:
   µs per event at 16 and 4,096 timers, and their ratio (the engine issue's "4,096 ÷ 16
   streams" figure for the serving model, ≤ 1.5, holds the engine to a growth the heap
   under it may exceed by itself: 1.38, 1.50, 1.47 and 1.63 in four runs on 2026-12-04,
   where the serving model's per-slot cost grows 1.66–1.92).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import simpy
from bench_serving import (  # this script's folder
    TIMING,
    cpu_seconds,
    plain_simpy_jobs,
    write_rows,
)

from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE
from latsim.controller.timing import Timing
from latsim.experiments.engine import DEFAULT_FPS, DEFAULT_R
from latsim.model.costs import FixedCost
from latsim.model.traces import Trace
from latsim.sim.simpy_driver import simulate_trace

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")


def controller_per_job(K: int, jobs: int = 50_000) -> tuple[float, float]:
    """(µs of CPU per job, share of slots played ahead) of one quiet stream at chunk
    size ``K`` (C = T/2, the lead C: one job per period)."""
    timing = Timing(K, DEFAULT_R, DEFAULT_FPS)
    cost = FixedCost(0.5 * timing.T)
    duration = jobs * timing.T
    config = ControllerConfig(timing, BASELINE, cost.mean(K))
    took, (run, ctrl) = cpu_seconds(lambda: simulate_trace(
        config, cost, Trace("none", (), duration), duration, np.random.default_rng(1),
        records="none"))
    return took / ctrl.jobs_done * 1e6, ctrl.slots_played_ahead / ctrl.played


def plain_per_job(streams: int = 1024, duration: float = 60.0) -> float:
    """µs of CPU per job of bench_serving's plain SimPy workload."""
    job = 0.5 * TIMING.T / streams
    phases = list(np.random.default_rng(0).uniform(0, TIMING.T, size=streams))
    took, jobs = cpu_seconds(lambda: plain_simpy_jobs(streams, job, duration, phases))
    return took / jobs * 1e6  # type: ignore[operator]


def heap_per_event(timers: int, events: int = 400_000) -> float:
    """µs of CPU per event of bare SimPy with ``timers`` periodic timers."""
    env = simpy.Environment()
    phases = np.random.default_rng(0).uniform(0, 1, size=timers)

    def tick(event: simpy.Event) -> None:
        env.timeout(1.0).callbacks.append(tick)

    for phase in phases:
        env.timeout(float(phase)).callbacks.append(tick)
    until = events / timers
    took, _ = cpu_seconds(lambda: env.run(until=until))
    return took / (until * timers) * 1e6


#: Where ``--json`` keeps the figures, one row a build.
FLOOR_JSON = Path(__file__).resolve().parents[1] / "results" / "bench" / "floor.json"


def main() -> None:
    row: dict[str, float] = {}
    plain = min(plain_per_job() for _ in range(3))
    print(f"1. plain SimPy, 1,024 periodic streams on one device: {plain:.1f} us per job; "
          f"the serving target (0.5 of its jobs/s) leaves {2 * plain:.1f} us per job")
    for K in (4, 8):
        runs = [controller_per_job(K) for _ in range(3)]
        micro, ahead = min(runs)
        row[f"controller_us_per_job_K{K}"] = round(micro, 1)
        print(f"   the controller alone, one quiet stream, K = {K}: {micro:.1f} us per job "
              f"({micro / K:.2f} us per slot; {ahead:.0%} of slots played ahead): "
              f"{micro / (2 * plain):.2f} of the serving target's budget")
    # the serving workload is K = 8: its jobs need at least plain SimPy's own work (a
    # device request and release, a job's timeout, a period's) and the controller's
    print(f"   so the serving model at K = 8 needs at least {plain + micro:.1f} us per job: "
          f"at most {plain / (plain + micro):.2f} of plain SimPy's jobs/s (target 0.5)")
    small = min(heap_per_event(16) for _ in range(3))
    large = min(heap_per_event(4096) for _ in range(3))
    print(f"2. bare SimPy, N periodic timers: {small:.2f} us per event at 16, {large:.2f} at "
          f"4,096: {large / small:.2f}x")
    if "--json" in sys.argv:
        row |= {"plain_us_per_job": round(plain, 1),
                "most_of_plain_jobs_per_s": round(plain / (plain + micro), 2),
                "heap_us_per_event_16": round(small, 2),
                "heap_us_per_event_4096": round(large, 2),
                "heap_growth": round(large / small, 2)}
        write_rows([row], FLOOR_JSON)
        print(f"   wrote {FLOOR_JSON.relative_to(FLOOR_JSON.parents[2])}")


if __name__ == "__main__":
    main()
