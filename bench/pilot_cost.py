"""What ``--lead auto``'s pilot runs cost beside the run they plan (the trust issue: "whatever
sets the lead costs a small fraction of the run it serves").

Run: ``.venv/bin/python bench/pilot_cost.py [--streams 4 16 64 256] [--seeds 30]
[--duration 60] [--repeats 3]``. Reports numbers (medians of the repeats); asserts nothing.
For each stream count (a multiple of 4): ``bench/lead_regimes.py``'s FIFO regime at
ρ = 0.85 with N/4 groups, that is N streams at random phases on N/4 devices, K = 8, C =
0.425 s fixed, both policies, updates at 0.1/s, ``records = "none"``. CPU seconds of this
process, the garbage collector paused, of :func:`~latsim.experiments.engine.plan` alone
(every cell's pilots, in process), then of the run it planned (the pilots' answers kept, so
the run does not pay them again), and their ratio. On 2026-12-04 (2 cores, medians of 3):
0.95 at 4 streams (0.80–1.19 in four runs: a fraction of a second each), 0.15 at 16, 0.07
at 64 and 0.07 at 256. Each pilot is ``4800/N`` s of N streams (at least 120 s, at most
1,200 s): with few streams it costs about what the default 30 × 60 s run does. With many,
the 120 s floor weighed on a short run (1,024 streams, 1 × 30 s: about 2.7 times the run);
such a run now pilots part of its pool (docs/serving.md): ``--streams 1024 --seeds 1
--duration 30`` gave 0.11 on 2026-12-06 (medians of 3).
"""

from __future__ import annotations

import argparse
import os
import statistics

from lead_regimes import experiment, timed  # this script's folder

from latsim.experiments.executors import gc_paused

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")


def pilot_and_run(streams: int, seeds: int, duration: float) -> tuple[float, float]:
    """(CPU seconds of the pilots, of the run) for ``streams`` streams: ``lead_regimes``'
    regime at ρ 0.85, FIFO, random starts, with ``streams / 4`` groups of one device."""
    regime = dict(rho=0.85, groups=streams // 4, degree=1, start="random", schedule="fifo",
                  rate=0.1, cost="fixed")
    with gc_paused():
        pilots, run, _ = timed(experiment(regime, duration, seeds))
    return pilots, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[4, 16, 64, 256])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    if any(streams < 4 or streams % 4 for streams in options.streams):
        parser.error("--streams takes multiples of 4 (groups of 4 streams on a device)")
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
