"""Simulator benchmark: events/s, simulations/s, and the command line's wall times.

Run: ``.venv/bin/python bench/bench_sim.py [--baseline DIR]``. Reports numbers; asserts
nothing. Targets (2-core machine): default ``latsim sweep --K 4 8 21`` < 5 s wall including
start-up, ``latsim --help`` < 0.5 s, ``import latsim.cli`` < 60 ms. ``--baseline DIR`` (a
checkout of an earlier commit, e.g. ``git worktree add /tmp/old REV``) times the same
commands from that tree in the same run, alternating, and prints new/old ratios.
"""

from __future__ import annotations

import os
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


COMMANDS = (
    ("latsim --help", ["--help"], 5, 0.5),
    ("latsim sweep --K 4 8 21", ["sweep", "--K", "4", "8", "21"], 3, 5.0),
    ("latsim reproduce", ["reproduce", "--out", "{tmp}"], 2, None),
)


def _latsim(tree: Path | None, args: list[str]) -> None:
    """Run the CLI of the installed tree, or of ``tree`` (put first on the import path)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    code = "import sys; from latsim.cli import main; sys.argv[0] = 'latsim'; main()"
    subprocess.run([sys.executable, "-c", code, *args], capture_output=True, check=True,
                   env=env, cwd=tree or Path.cwd())


def import_time() -> float:
    """Self time of ``import latsim.cli`` and its imports, from ``python -X importtime``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import latsim.cli"],
                         capture_output=True, text=True, check=True).stderr
    line = next(x for x in err.splitlines() if x.rstrip().endswith("| latsim.cli"))
    return int(line.split("|")[1]) / 1e6


def command_line(baseline: Path | None) -> None:
    import tempfile

    took = min(import_time() for _ in range(5))
    print(f"  import latsim.cli: {took * 1e3:.0f} ms (target < 60 ms; ratio {took / 0.06:.2f})")
    with tempfile.TemporaryDirectory() as tmp:
        for label, args, reps, target in COMMANDS:
            args = [a.replace("{tmp}", tmp) for a in args]
            new, old = [], []
            for _ in range(reps):  # alternate, so load from elsewhere hits both alike
                start = time.perf_counter()
                _latsim(None, args)
                new.append(time.perf_counter() - start)
                if baseline is not None:
                    start = time.perf_counter()
                    _latsim(baseline, args)
                    old.append(time.perf_counter() - start)
            line = f"  {label}: {min(new):.3f} s"
            if target:
                line += f" (target < {target:g} s; ratio {min(new) / target:.2f})"
            if old:
                line += f"; baseline tree {min(old):.3f} s, new/old {min(new) / min(old):.2f}"
            print(line)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an earlier checkout to compare with")
    options = parser.parse_args()
    print("single-core controller + SimPy throughput:")
    single_core_throughput()
    print("simulations per second:")
    sims_per_second()
    print("command line (wall, best of runs, including interpreter start-up):")
    command_line(options.baseline)
