"""How long the commands the docs quote take: the source of every wall time the README and
docs/ give for a command.

Run: ``.venv/bin/python bench/bench_commands.py [--runs N] [--only COMMAND]`` from the
repository root, on a machine with nothing else running (``--only``: re-measure one
command, as the docs name it, after a change to it, keeping the other rows as an earlier
run wrote them). Each command runs once to warm the file cache, then N
times (default 3); each run's wall time (a monotonic clock around the child process, its
start-up included) and CPU time (the child's user + system, from ``getrusage``) are kept,
and the medians are written to ``results/bench/commands.json`` with the machine they were
measured on. Asserts nothing.

Each row names the documents that quote it (``quoted_in``), and
``tests/test_doc_times.py`` checks that every one of them quotes the row's median, in the
form :func:`quote` writes, and that no document quotes a time from this file that no row
holds. After a run, update the quotes the test names.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench" / "commands.json"

#: (command as the docs name it, its arguments, the documents that quote it). ``{tmp}`` is
#: an empty folder for the run's output.
COMMANDS: tuple[tuple[str, list[str], tuple[str, ...]], ...] = (
    ("latsim --help", ["--help"], ("README.md",)),
    ("latsim sweep --K 4 8 21", ["sweep", "--K", "4", "8", "21"], ("README.md",)),
    ("latsim reproduce", ["reproduce", "--out", "{tmp}"], ("README.md",)),
    ("latsim reproduce serving", ["reproduce", "serving", "--out", "{tmp}"],
     ("docs/serving.md",)),
    ("latsim reproduce systems", ["reproduce", "systems", "--out", "{tmp}"],
     ("docs/systems.md",)),
    ("latsim reproduce fleet --jobs 2", ["reproduce", "fleet", "--jobs", "2", "--out",
                                         "{tmp}"], ("docs/fleet.md",)),
    ("latsim plan examples/plan.toml", ["plan", "examples/plan.toml"], ("docs/plan.md",)),
)


def quote(row: dict) -> str:
    """How a document quotes a row: the command, then its median wall time."""
    return (f"`{row['command']}` takes {row['wall_s_median']:.2f} s (wall, median of "
            f"{row['runs']} runs on {row['cores']} cores; results/bench/commands.json)")


def _one(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    kept = ({row["command"]: row for row in json.loads(OUT.read_text())["rows"]}
            if only is not None else {})
    if only is not None and only not in {command for command, _, _ in COMMANDS}:
        raise SystemExit(f"--only: no benchmarked command {only!r}")
    latsim = str(Path(sys.executable).parent / "latsim")
    rows = []
    for command, args, quoted_in in COMMANDS:
        if only is not None and command != only:
            rows.append(kept[command])  # measured by an earlier run of this bench
            continue
        walls, cpus = [], []
        for attempt in range(runs + 1):  # the first warms the caches and is not kept
            tmp = tempfile.mkdtemp(prefix="latsim-bench-")
            try:
                wall, cpu = _one([latsim, *(a.replace("{tmp}", tmp) for a in args)])
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if attempt:
                walls.append(wall)
                cpus.append(cpu)
        row = {"command": command, "runs": runs, "cores": os.cpu_count(),
               "wall_s_median": round(statistics.median(walls), 2),
               "cpu_s_median": round(statistics.median(cpus), 2),
               "wall_s": [round(w, 2) for w in walls], "quoted_in": list(quoted_in)}
        rows.append(row)
        print(quote(row), flush=True)
    OUT.write_text(json.dumps({
        "command": ".venv/bin/python bench/bench_commands.py" + (
            f" --runs {runs}" if runs != 3 else ""),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "system": platform.platform()},
        "method": "each command once to warm up, then the runs; wall: a monotonic clock "
                  "around the child process, start-up included; CPU: the child's user + "
                  "system seconds (getrusage); medians",
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
