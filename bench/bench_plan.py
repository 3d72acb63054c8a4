"""``latsim plan``'s cost: the surrogate stage alone, and the whole plan with its exact runs.

Run: ``.venv/bin/python bench/bench_plan.py [FILE]`` (default ``examples/plan.toml``;
``examples/plan_wan_day.toml`` is the paper's Wan setting at about 1,000 viewers).
Reports CPU seconds of this process (``time.process_time``; ``--jobs 1`` so the exact runs
are counted too) beside a yardstick from the same run: one exact fleet run of the first
verified configuration. The issue's goals: the surrogate under 5 s, the whole plan of the
Wan setting under 3 minutes on 2 cores. Asserts nothing.

``--target``: the goal itself, as a user runs it: ``latsim plan
examples/plan_wan_day.toml --jobs 2`` once with this Python's build and once with
``.venv-compiled``'s where that exists (the compiled build, ``docs/testing.md``), wall
and CPU time of the child process, written to ``results/bench/plan_target.json``
(``tests/test_doc_times.py`` checks the README's quote of it). Run it with nothing else on
the machine.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from latsim.experiments.deployment import (
    candidates,
    fleet_of,
    load_deployment,
    plan_deployment,
    screen,
)
from latsim.experiments.fleet import plan_fleet, pooled_row, run_fleet

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")


def cpu(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "results" / "bench" / "plan_target.json"
TARGET_FILE = "examples/plan_wan_day.toml"


def latsim_builds() -> list[tuple[str, Path]]:
    """(build, its ``latsim`` command): this Python's, and ``.venv-compiled``'s (the
    compiled build, ``docs/testing.md``) where that exists."""
    builds = [("pure Python", Path(sys.executable).parent / "latsim")]
    compiled = ROOT / ".venv-compiled" / "bin" / "latsim"
    if compiled.exists():
        builds.append(("compiled with mypyc", compiled))
    return builds


def target() -> None:
    """One run of the Wan plan with 2 workers per build found (see the module docstring)."""
    rows = []
    for build, latsim in latsim_builds():
        with tempfile.TemporaryDirectory(prefix="latsim-plan-") as out:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([str(latsim), "plan", TARGET_FILE, "--jobs", "2", "--out", out],
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            plan = json.loads((Path(out) / "plan.json").read_text())
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rows.append({"build": build, "file": TARGET_FILE, "jobs": 2, "wall_s": round(wall, 1),
                     "cpu_s": round(cpu, 1), "comparison": plan["comparison"]})
        print(f"{build}: {wall / 60:.1f} min wall, {cpu:.0f} s CPU (goal: under 3 min)",
              flush=True)
    TARGET.write_text(json.dumps({
        "command": ".venv/bin/python bench/bench_plan.py --target",
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "system": platform.platform()},
        "method": "one run of each build, nothing else running; wall: a monotonic clock "
                  "around the child process; CPU: the children's user + system seconds",
        "rows": rows}, indent=1) + "\n")


def main() -> None:
    if "--target" in sys.argv:
        target()
        return
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/plan.toml")
    deployment = load_deployment(path)
    screened, rows = cpu(lambda: [screen(deployment, c) for c in candidates(deployment)])
    print(f"{path}: {len(rows)} candidates, {sum(r['verdict'] == 'meets' for r in rows)} "
          f"pass the surrogate")
    print(f"  surrogate stage: {screened:.3f} s CPU (goal: under 5 s)")
    whole, result = cpu(lambda: plan_deployment(deployment))
    verified = [r for r in result.rows if "exact_verdict" in r]
    yardstick, _ = cpu(lambda: pooled_row(*(lambda fp: (fp, run_fleet(fp)))(
        plan_fleet(fleet_of(deployment, verified[0])))))
    print(f"  whole plan: {whole:.1f} s CPU with {len(verified)} exact runs "
          f"({deployment.base.seeds} replication(s) each; goal for the Wan setting: under "
          "180 s)")
    print(f"  yardstick, one exact run of {verified[0]['K']}/{verified[0]['policy']}/usp"
          f"{verified[0]['usp']}: {yardstick:.1f} s CPU; the plan is "
          f"{whole / yardstick:.1f} of it, the surrogate {screened / yardstick:.4f}")


if __name__ == "__main__":
    main()
