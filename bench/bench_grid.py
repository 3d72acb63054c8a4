"""Grid throughput: cells per second of a 1,000-cell grid on each scheduler, as ratios.

Run: ``.venv/bin/python bench/bench_grid.py [--cells 1000]``. Reports; asserts nothing.
The grid: K x C x update rate (10 x 10 x 10 by default), baseline, 60 s, one replication
per cell (a small cell, so that scheduling overhead shows). Scaling efficiency is
``(cells/s with 2 workers) / (2 x cells/s in process)``; the issue's target is >= 80%.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latsim.experiments.grid import parse_grid, run_grid


def grid_text(side: int) -> str:
    Ks = [2 + i for i in range(side)]
    Cs = [round(0.05 + 0.02 * i, 3) for i in range(side)]
    rates = [round(0.02 + 0.02 * i, 3) for i in range(side)]
    return (f'name = "bench"\nseeds = 1\nmetrics = ["L50", "L95", "stall_pct"]\n'
            f'[fixed]\nduration = 60\npolicy = "baseline"\n'
            f"[axes]\nK = {Ks}\nC = {Cs}\nrate = {rates}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=1000)
    args = parser.parse_args()
    side = max(1, round(args.cells ** (1 / 3)))
    spec = parse_grid(grid_text(side))
    print(f"{spec.n_cells} cells")
    rates, outputs = {}, {}
    for name, scheduler, jobs in (("local, 1 process", "local", 1),
                                  ("local, 2 processes", "local", 2),
                                  ("dask-local, 2 workers", "dask-local", 2)):
        out = Path(tempfile.mkdtemp(prefix="bench-grid-"))
        start = time.perf_counter()
        run_grid(spec, out, scheduler, jobs)
        took = time.perf_counter() - start
        rates[name] = spec.n_cells / took
        outputs[name] = (out / "cells.csv").read_bytes()
        shutil.rmtree(out)
        print(f"  {name:24s} {took:7.2f} s  {rates[name]:8.1f} cells/s")
    from latsim.experiments.executors import work_pool

    start = time.perf_counter()
    with work_pool("dask-local", 2):
        pass
    startup = time.perf_counter() - start
    name = "dask-local, 2 workers"
    rates["dask-local, 2 workers, after start-up"] = spec.n_cells / (
        spec.n_cells / rates[name] - startup)
    print(f"  dask-local start-up and shutdown alone: {startup:.2f} s")
    one = rates["local, 1 process"]
    for name in ("local, 2 processes", "dask-local, 2 workers",
                 "dask-local, 2 workers, after start-up"):
        print(f"  {name}: {rates[name] / one:.2f}x one process, scaling efficiency "
              f"{100 * rates[name] / (2 * one):.0f}%")
    print("  same bytes on every scheduler:", len(set(outputs.values())) == 1)


if __name__ == "__main__":
    main()
