"""``latsim plan``'s cost: the surrogate stage alone, and the whole plan with its exact runs.

Run: ``.venv/bin/python bench/bench_plan.py [FILE]`` (default ``examples/plan.toml``;
``examples/plan_wan_day.toml`` is the paper's Wan setting at about 1,000 viewers).
Reports CPU seconds of this process (``time.process_time``; ``--jobs 1`` so the exact runs
are counted too) beside a yardstick from the same run: one exact fleet run of the first
verified configuration. The issue's goals: the surrogate under 5 s, the whole plan of the
Wan setting under 3 minutes on 2 cores. Asserts nothing.
"""

from __future__ import annotations

import sys
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


def cpu(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main() -> None:
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
