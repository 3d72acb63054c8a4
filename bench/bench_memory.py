"""Peak memory of a long many-stream serving run, by records level (issue "speed").

Run: ``.venv/bin/python bench/bench_memory.py [--streams N] [--duration S] [--records L]
[--json]``.
Each level runs in a fresh process (the peak resident set, ``ru_maxrss``, only grows) and
reports its wall time, its peak and the peak of the bare interpreter with latsim imported,
beside the target: 4,096 streams x 600 s with ``--records none`` under 1 GiB, for both of
the engine issue's workloads (``bench_serving.run_workload``: K = 8, dit = streams / 4,
``fixed:0.25`` alone, and ``fixed:0.3`` with a VAE stage on vae = streams / 16, decode
``fixed:0.02``). Asserts nothing. ``--json`` (the defaults only) keeps this build's rows
in ``results/bench/memory.json`` beside the other build's (run it with each build's
interpreter: ``.venv-compiled/bin/python bench/bench_memory.py --json`` measures the compiled
one), which docs/testing.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


#: the engine issue's two workloads: (DiT cost, decode cost or None)
WORKLOADS = {"dit": ("fixed:0.25", None), "dit+vae": ("fixed:0.3", "fixed:0.02")}


def one(streams: int, duration: float, records: str, workload: str) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_serving  # the same streams, pools and costs

    from latsim.analysis.serving import serving_metrics

    before = _peak_mib()
    cost, decode = WORKLOADS[workload]
    took, run = bench_serving.run_workload(streams, duration, cost, decode, records)
    metrics = serving_metrics([run])
    return {"streams": streams, "duration": duration, "records": records,
            "workload": workload, "cpu_s": round(took, 2), "peak_mib": round(_peak_mib(), 1),
            "import_peak_mib": round(before, 1), "L95": metrics["L95"]}


#: Where ``--json`` writes the rows, one a build and workload.
MEMORY_JSON = Path(__file__).resolve().parents[1] / "results" / "bench" / "memory.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4096)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--records", nargs="*", default=["none"])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true",
                        help=f"keep the rows in {MEMORY_JSON.name} (the defaults only)")
    options = parser.parse_args()
    if options.json and (options.streams, options.duration, options.records,
                         options.workloads) != (4096, 600.0, ["none"], list(WORKLOADS)):
        parser.error("--json keeps the target's runs only: leave the other options out")
    if options.one:
        print(json.dumps(one(options.streams, options.duration, options.records[0],
                             options.workloads[0])))
        return
    rows = []
    for workload in options.workloads:
        for records in options.records:
            out = subprocess.run([sys.executable, __file__, "--one", "--streams",
                                  str(options.streams), "--duration", str(options.duration),
                                  "--records", records, "--workloads", workload],
                                 capture_output=True, text=True, check=True).stdout
            row = json.loads(out)
            rows.append(row)
            print(f"  {row['workload']}: {row['streams']} streams x {row['duration']:g} s, "
                  f"--records {row['records']}: {row['cpu_s']} s CPU, peak "
                  f"{row['peak_mib']:.0f} MiB "
                  f"(interpreter and imports {row['import_peak_mib']:.0f} MiB; target under "
                  f"1024 MiB with none); L95 {row['L95']}")
    if options.json:
        from bench_serving import write_rows  # this script's folder

        write_rows(rows, MEMORY_JSON)
        print(f"  wrote {MEMORY_JSON.relative_to(MEMORY_JSON.parents[2])}")


if __name__ == "__main__":
    main()
