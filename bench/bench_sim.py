"""Simulator benchmark: events/s, simulations/s, the default sweep's wall time, --help time.

Run: ``.venv/bin/python bench/bench_sim.py``. Reports numbers; asserts nothing.
Targets (2-core machine): default ``latsim sweep --K 4 8 21`` < 5 s wall including start-up,
``latsim --help`` < 0.5 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.experiments.sweep import (
    DEFAULT_COST,
    DEFAULT_FPS,
    DEFAULT_R,
    Experiment,
    run_experiment,
)
from latsim.model.costs import AffineCost
from latsim.model.traces import Trace
from latsim.sim.simpy_driver import simulate_trace


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def single_core_throughput() -> None:
    cost = AffineCost(0.14725, 0.16275)
    rng = np.random.default_rng(0)
    for K in (4, 21):  # noqa: N806
        timing = Timing(K, DEFAULT_R, DEFAULT_FPS)
        arrivals = tuple(np.cumsum(rng.exponential(10.0, size=360)))
        duration = float(arrivals[-1]) + 1
        for policy in (BASELINE, SPECULATIVE):
            config = ControllerConfig(timing, policy, cost.mean(K))
            start = time.perf_counter()
            _, ctrl = simulate_trace(config, cost, Trace("b", arrivals, duration), duration,
                                     np.random.default_rng(1))
            took = time.perf_counter() - start
            print(f"  K={K:3d} {policy.name:11s} {duration:7.0f} s simulated: "
                  f"{ctrl.events_handled / took:9.0f} events/s "
                  f"({ctrl.events_handled} events in {took * 1e3:.0f} ms)")


def sims_per_second() -> None:
    experiment = Experiment(Ks=(4, 8, 21), cost=DEFAULT_COST, seeds=30)
    n_runs = 3 * 2 * 30
    for jobs in (1, 2):
        took = best_of(3, lambda j=jobs: run_experiment(experiment, jobs=j))
        print(f"  default sweep in-process, jobs={jobs}: {took:.3f} s "
              f"({n_runs / took:.0f} simulations/s of 60 s each)")


def command_line() -> None:
    exe = shutil.which("latsim") or str(Path(sys.executable).with_name("latsim"))
    help_s = best_of(5, lambda: subprocess.run([exe, "--help"], capture_output=True,
                                                check=True))
    sweep_s = best_of(3, lambda: subprocess.run([exe, "sweep", "--K", "4", "8", "21"],
                                                 capture_output=True, check=True))
    print(f"  latsim --help: {help_s:.3f} s (target < 0.5 s; ratio {help_s / 0.5:.2f})")
    print(f"  latsim sweep --K 4 8 21: {sweep_s:.3f} s (target < 5 s; ratio {sweep_s / 5:.2f})")


if __name__ == "__main__":
    print("single-core controller + SimPy throughput:")
    single_core_throughput()
    print("simulations per second:")
    sims_per_second()
    print("command line (wall, best of runs, including interpreter start-up):")
    command_line()
