"""What ``--lead auto``'s pilot runs cost beside the run they plan (the trust issue: "whatever
sets the lead costs a small fraction of the run it serves").

Run: ``.venv/bin/python bench/pilot_cost.py [--streams 4 16 64 256] [--seeds 30]
[--duration 60] [--repeats 3]``. Reports numbers (medians of the repeats); asserts nothing.

``--example [--pairs N]``: the issue's example instead, as a user runs it: ``latsim
simulate`` of 4,096 streams × 60 s on 1,024 DiT and 256 VAE devices, one seed, at ``--lead
auto`` and at ``--lead cost`` (no pilot), N alternated pairs (default 3) of child
processes with this Python's build and with ``.venv-compiled``'s where that exists: wall
and CPU seconds, medians, and the median of the pairs' ratios, written to
``results/bench/lead_cost.json`` (the target: auto under 1.2 times cost;
``tests/test_doc_times.py`` checks docs/testing.md's quote of it). Run it with nothing
else on the machine.
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
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_plan import latsim_builds  # this script's folder
from lead_regimes import experiment, timed

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


ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_JSON = ROOT / "results" / "bench" / "lead_cost.json"
EXAMPLE = ("simulate", "--K", "8", "--C", "0.3", "--streams", "4096", "--pools",
           "dit=1024,vae=256", "--decode", "fixed:0.02", "--duration", "60", "--seeds", "1")


def _timed(latsim: Path, lead: str) -> tuple[float, float, str]:
    """(wall s, CPU s, the lead model of the first row) of the example at ``lead``."""
    with tempfile.TemporaryDirectory(prefix="latsim-lead-") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([str(latsim), *EXAMPLE, "--lead", lead, "--out", out], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL,
                       env=os.environ | {"LATSIM_CACHE_DIR": "off"})
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        (row, *_) = json.loads((Path(out) / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, row.get("lead_model") or ""


def example(pairs: int) -> None:
    """The issue's example at --lead auto against --lead cost (see the module docstring)."""
    rows = []
    for build, latsim in latsim_builds():
        auto, cost = [], []
        for _ in range(pairs):
            auto.append(_timed(latsim, "auto"))
            cost.append(_timed(latsim, "cost"))
        ratio = statistics.median(a[0] / c[0] for a, c in zip(auto, cost, strict=True))
        row = {"build": build, "pairs": pairs,
               "auto_wall_s": round(statistics.median(a[0] for a in auto), 1),
               "cost_wall_s": round(statistics.median(c[0] for c in cost), 1),
               "auto_cpu_s": round(statistics.median(a[1] for a in auto), 1),
               "cost_cpu_s": round(statistics.median(c[1] for c in cost), 1),
               "wall_ratio": round(ratio, 2), "lead_model": auto[0][2]}
        rows.append(row)
        print(f"{build}: auto {row['auto_wall_s']} s, cost {row['cost_wall_s']} s wall "
              f"(medians of {pairs}); auto / cost {ratio:.2f} (target under 1.2); "
              f"{row['lead_model']}", flush=True)
    EXAMPLE_JSON.write_text(json.dumps({
        "command": ".venv/bin/python bench/pilot_cost.py --example",
        "example": "latsim " + " ".join(EXAMPLE),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "system": platform.platform()},
        "method": "alternated pairs of child processes (auto, then cost), nothing else "
                  "running; wall: a monotonic clock around each; CPU: the child's user + "
                  "system seconds; medians, and the median of the pairs' wall ratios",
        "rows": rows}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[4, 16, 64, 256])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--example", action="store_true",
                        help="the issue's 4,096-stream example, auto against cost, as child "
                             "processes of each build; writes results/bench/lead_cost.json")
    parser.add_argument("--pairs", type=int, default=3, help="with --example: how many")
    options = parser.parse_args()
    if options.example:
        example(options.pairs)
        return
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
