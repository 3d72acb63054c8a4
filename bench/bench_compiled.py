"""The compiled build against the pure one: the engine issue's per-event figures in both.

Run: ``.venv/bin/python bench/bench_compiled.py [PYTHON] [--json]`` after making the
compiled build (``.venv-compiled``, as .ci/run does; or give its interpreter). Reports
numbers; asserts nothing; ``--json`` keeps each build's best figures in
``results/bench/compiled.json``, which docs/testing.md quotes. Each build runs the same
workloads in its own process, alternated three times,
best of each, every figure beside its yardstick from the same process (bare or plain
SimPy), so the ratios compare like with like:

- one stream, K = 4, conditions every 1,000 s and every 10 s: simulated slot-events per
  second, as a ratio to a bare SimPy timeout loop (``bench_sim.one_stream``: the median of
  3 alternated pairs, the simulator with the garbage collector paused as the experiment
  engine's work units run it);
- the serving model: 256 periodic streams on one FIFO device at ρ = 0.5, jobs per second
  as a ratio to the same workload in plain SimPy (bench/bench_serving.py's first figure);
- µs per played slot, 256 speculative streams, dit = N/4 (its second figure);
- CPU seconds of 4,096 speculative streams × 60 s with a VAE stage (its third figure; the
  engine issue's target: under 10 s), one run a round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs in each build's interpreter (the bench folder last on the path, so the installed
#: latsim of that interpreter is the one measured).
MEASURE = r"""
import json, os, sys, time
sys.path.append(sys.argv[1])
import numpy as np
import latsim
import bench_serving, bench_sim
from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE
from latsim.model.costs import FixedCost
from latsim.model.serving import ServingConfig
from latsim.sim.serving import simulate_serving

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")

out = {"build": latsim.build()}
for every in (1000.0, 10.0):
    out[f"one stream K=4 every {every:g} s / bare SimPy"] = bench_sim.one_stream(4, every)[1]

streams, seconds = 256, 60.0
job = 0.5 * bench_serving.TIMING.T / streams
inputs = bench_serving._inputs(streams, seconds, 0.0)
config = ControllerConfig(bench_serving.TIMING, BASELINE, job + 0.5 * bench_serving.TIMING.T)
serving = ServingConfig(streams=streams, pools=(("dit", 1),), start="random")
ours, plain = [], []
for _ in range(3):
    took, run = bench_serving.cpu_seconds(lambda: simulate_serving(
        config, FixedCost(job), serving, inputs, seconds, np.random.default_rng(1),
        records="none"))
    ours.append(sum(s.jobs_done for s in run.streams) / took)
    took, jobs = bench_serving.cpu_seconds(lambda: bench_serving.plain_simpy_jobs(
        streams, job, seconds, [i.join for i in inputs]))
    plain.append(jobs / took)
out["serving jobs/s, 256 streams / plain SimPy"] = max(ours) / max(plain)
out["serving us per slot, 256 streams"] = min(
    bench_serving.per_slot(256, 60.0, "fixed:0.25", None)[1] for _ in range(3))
out["serving CPU s, 4,096 streams x 60 s, VAE stage"] = bench_serving.run_workload(
    4096, 60.0, "fixed:0.3", "fixed:0.02")[0]
print(json.dumps(out))
"""


def measure(python: str) -> dict:
    result = subprocess.run([python, "-c", MEASURE, str(ROOT / "bench")], capture_output=True,
                            text=True, check=True, cwd="/")
    return json.loads(result.stdout)


#: Where ``--json`` keeps the figures: one row a build, each figure the best of its runs.
COMPILED_JSON = ROOT / "results" / "bench" / "compiled.json"


def main() -> None:
    arguments = [a for a in sys.argv[1:] if a != "--json"]
    compiled = arguments[0] if arguments else str(ROOT / ".venv-compiled/bin/python")
    if not Path(compiled).exists():
        sys.exit(f"no compiled build at {compiled}: make one as .ci/run does")
    runs: dict[str, list[dict]] = {"pure": [], "compiled": []}
    for _ in range(3):  # alternated
        runs["pure"].append(measure(sys.executable))
        runs["compiled"].append(measure(compiled))
    print(f"pure: {runs['pure'][0]['build']}; compiled: {runs['compiled'][0]['build']}")
    print(f"{'figure':48} {'pure':>8} {'compiled':>9} {'ratio':>6}")
    best: dict[str, dict] = {name: {"build": runs[name][0]["build"]} for name in runs}
    for key in (k for k in runs["pure"][0] if k != "build"):
        pick = min if key.startswith(("serving us", "serving CPU s")) else max  # the best
        for name in runs:
            best[name][key] = round(pick(r[key] for r in runs[name]), 3)
        pure, fast = best["pure"][key], best["compiled"][key]
        ratio = pure / fast if pick is min else fast / pure
        print(f"{key:48} {pure:8.3f} {fast:9.3f} {ratio:5.2f}x")
    if "--json" in sys.argv:
        stamp = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "runs": 3}
        COMPILED_JSON.write_text(json.dumps(
            {"rows": [row | stamp for row in best.values()]}, indent=1) + "\n")
        print(f"wrote {COMPILED_JSON.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
