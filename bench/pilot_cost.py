"""What ``--lead auto``'s pilot runs cost beside the run they plan (the trust issue: "whatever
sets the lead costs a small fraction of the run it serves").

Run: ``.venv/bin/python bench/pilot_cost.py [--streams 4 16 64 256] [--seeds 30]
[--duration 60] [--repeats 3]``. Reports numbers (medians of the repeats); asserts
nothing. For each stream count: N streams at random phases on dit = N/4 devices, K = 8,
C = 0.425 s fixed (ρ = 0.85 before replans), both policies, updates at the default 0.1/s,
``records = "none"``. CPU seconds of this process, the garbage collector paused, of
:func:`~latsim.experiments.engine.plan` alone (every cell's pilots, in process), then of
the run it planned (the pilots' answers kept, so the run does not pay them again), and
their ratio. On 2026-12-04 (2 cores, medians of 3): 0.95 at 4 streams, 0.15 at 16, 0.07
at 64 and 0.07 at 256. Each pilot is ``4800/N`` s of N streams (at least 120 s, at most
1,200 s): with few streams it costs about what the default 30 × 60 s run does; with many,
the 120 s floor weighs on a short run (1,024 streams, 1 × 30 s: about 2.7 times the run;
docs/serving.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

from latsim.experiments.engine import Experiment, clear_auto_leads, plan, run_experiment
from latsim.experiments.executors import gc_paused
from latsim.model.serving import ServingConfig


def pilot_and_run(streams: int, seeds: int, duration: float) -> tuple[float, float]:
    """(CPU seconds of the pilots, CPU seconds of the run) for ``streams`` streams."""
    serving = ServingConfig(streams=streams, pools=(("dit", max(1, streams // 4)),),
                            start="random")
    experiment = Experiment(Ks=(8,), cost="fixed:0.425", lead="auto", serving=serving,
                            seeds=seeds, duration=duration, records="none")
    clear_auto_leads()
    with gc_paused():
        start = time.process_time()
        plan(experiment)
        pilots = time.process_time() - start
        start = time.process_time()
        run_experiment(experiment, jobs=1)
        return pilots, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[4, 16, 64, 256])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    print(f"  {options.seeds} x {options.duration:g} s, K = 8, C = 0.425 s, dit = N/4, "
          "random starts, both policies (CPU s)")
    for streams in options.streams:
        tries = [pilot_and_run(streams, options.seeds, options.duration)
                 for _ in range(options.repeats)]
        pilots = statistics.median(p for p, _ in tries)
        run = statistics.median(r for _, r in tries)
        print(f"    {streams:5d} streams: pilots {pilots:7.2f}, run {run:7.2f}, "
              f"pilots / run {pilots / run:5.2f}")


if __name__ == "__main__":
    main()
