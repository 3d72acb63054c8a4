"""Fleet speed (issue "fleet"): the sharded mode's wall time and memory at growing viewer
counts on 1 and 2 local workers, and the exact mode's events per second at 64 and 512
sessions.

Run: ``.venv/bin/python bench/bench_fleet.py [--viewers 250 1000] [--duration 600]
[--exact 64 512] [--jobs 1 2] [--scheduler local|dask-local]`` (the target itself:
``--viewers 10000 --duration 3600 --jobs 2 --exact``). Each case runs in a fresh process
(the peak resident set only grows).
The workload: Poisson arrivals with λ·E[D] = the viewer count (fixed 600 s sessions, so
about that many are present once warm), always active, conditions at 0.1/s; nodes of one
DiT GPU with 4 sessions at Wan1.3B's timing (K = 8, C = 0.5 s), 25 % more nodes than the
viewers need. The target is 10,000 viewers over one simulated hour, sharded on 2 workers,
under 10 minutes and 4 GiB; the report extrapolates it from the measured cost per
viewer-second. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")


def _fleet(viewers: int, duration: float, mode: str):
    from latsim.model.fleet import parse_fleet

    nodes = max(1, math.ceil(1.25 * viewers / 4))
    return parse_fleet({
        "workload": {"arrivals": f"poisson:{viewers / 600:.6g}", "duration": "fixed:600",
                     "updates": "poisson:0.1"},
        "node": {"K": 8, "cost": "fixed:0.5", "pools": "dit=1", "max_sessions": 4},
        "fleet": {"nodes_initial": nodes, "nodes_max": nodes, "placement": "least-loaded"},
        "run": {"duration": duration, "seeds": 1, "mode": mode}}, "bench")


def one(viewers: int, duration: float, mode: str, jobs: int, scheduler: str = "local") -> dict:
    from latsim.experiments.executors import using
    from latsim.experiments.fleet import plan_fleet, run_fleet

    fp = plan_fleet(_fleet(viewers, duration, mode), max_events=10**12)
    started = time.perf_counter()
    with using(scheduler, jobs):
        (result,) = run_fleet(fp)
    wall = time.perf_counter() - started
    metrics = result.metrics
    viewer_seconds = metrics["n_active_mean"] * duration
    return {"viewers": viewers, "duration": duration, "mode": mode, "jobs": jobs,
            "scheduler": scheduler,
            "wall_s": round(wall, 2),
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "worker_peak_mib": round(  # the largest worker process (0: none forked)
                resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "viewer_seconds": round(viewer_seconds),
            "us_per_viewer_second": round(1e6 * wall / viewer_seconds, 1),
            "slots_per_s": round(viewer_seconds * 4 / wall),  # 4 latent slots a second
            "n_active_mean": round(metrics["n_active_mean"], 1), "L95": metrics["L95"]}


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewers", type=int, nargs="*", default=[250, 1000])
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--exact", type=int, nargs="*", default=[64, 512])
    parser.add_argument("--jobs", type=int, nargs="*", default=[1, 2],
                        help="worker counts of the sharded runs")
    parser.add_argument("--scheduler", default="local",
                        help="local (forked processes) or dask-local (a Dask LocalCluster)")
    parser.add_argument("--out", help="also write the rows and the summary lines to this "
                        "JSON file")
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        viewers, duration, mode, jobs, scheduler = options.one
        print(json.dumps(one(int(viewers), float(duration), mode, int(jobs), scheduler)))
        return
    rows: list[dict] = []
    lines: list[str] = []
    for viewers in options.viewers:
        for jobs in options.jobs:
            rows.append(_run(str(viewers), str(options.duration), "sharded", str(jobs),
                             options.scheduler))
            print(rows[-1], flush=True)
    for viewers in options.exact:
        rows.append(_run(str(viewers), str(options.duration), "exact", "1", "local"))
        print(rows[-1], flush=True)
    sharded2 = [r for r in rows if r["mode"] == "sharded" and r["jobs"] == 2]
    if sharded2:
        largest = max(sharded2, key=lambda r: r["viewers"])
        if largest["viewers"] == 10_000 and largest["duration"] == 3600:
            lines.append(f"10,000 viewers x 1 h sharded on 2 workers, measured: "
                         f"{largest['wall_s'] / 60:.2f} min, {largest['peak_mib']:.0f} MiB "
                         "(target under 10 min and 4 GiB)")
        else:  # the fleet fills from empty: 600 s sessions, so V·(3600 − 300) viewer-s
            target_s = largest["us_per_viewer_second"] * 1e-6 * 10_000 * (3600 - 300)
            lines.append(f"10,000 viewers x 1 h sharded on 2 workers, extrapolated from "
                         f"{largest['viewers']} viewers at {largest['us_per_viewer_second']} "
                         f"us per viewer-second (the hour holds 10,000 x 3,300 "
                         f"viewer-seconds, as it fills from empty): {target_s / 60:.1f} min "
                         "(target under 10 min)")
    for viewers in options.viewers:
        pair = {r["jobs"]: r for r in rows if r["mode"] == "sharded" and r["viewers"] == viewers}
        if 1 in pair and 2 in pair:
            lines.append(f"{viewers} viewers on {options.scheduler}: 2 workers / 1 worker "
                         f"wall = {pair[2]['wall_s'] / pair[1]['wall_s']:.2f}")
    for viewers in options.exact:
        (row,) = [r for r in rows if r["mode"] == "exact" and r["viewers"] == viewers]
        lines.append(f"exact mode, {viewers} viewers: {row['slots_per_s']:,} slot-events/s")
    for line in lines:
        print(line)
    if options.out:
        with open(options.out, "w") as file:
            json.dump({"rows": rows, "summary": lines}, file, indent=1)
            file.write("\n")


if __name__ == "__main__":
    main()
