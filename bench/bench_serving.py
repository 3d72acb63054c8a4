"""Serving-model benchmark: the engine issue's figures, each beside a yardstick from the same run.

Run: ``.venv/bin/python bench/bench_serving.py [--quick] [--json]``. Reports numbers;
asserts nothing. ``--json`` runs 1. to 3. and keeps their figures for this build in
``results/bench/serving_jobs.json`` and ``serving_growth.json``, which docs/testing.md
quotes. Every run has the
garbage collector paused, as the experiment engine's work units do
(:func:`latsim.experiments.executors.gc_paused`), keeps no slot or task rows (``records =
"none"``, what capacity searches and fleets keep) and is timed as CPU seconds of this
process (``time.process_time``), so another process on the machine slows it less.

The workloads load the DiT devices to ρ ≈ 0.5 (the engine issue's definition; an earlier
version of this file ran at ρ ≈ 2.9, where 70% of the time stalled):

1. **jobs per second against plain SimPy.** N periodic baseline streams (K = 8, T = 2 s)
   send fixed-C jobs to one FIFO device, C = 0.5 T / N, lead = C + ρT; the yardstick is
   the same workload written in plain SimPy (a process per stream, a ``simpy.Resource``
   device, a timeout per job and per period). Without conditions the run is quiet
   throughout, so latsim plays it in numpy (:mod:`latsim.sim.bulk_numpy`); the loop it
   falls back to, its event path and every tick an event are timed beside it. With
   Poisson conditions at 0.1/s a stream (the same jobs: under the baseline a condition
   moves none) the pools are still computed in numpy and each stream is replayed through
   its controller (:mod:`latsim.sim.bulk_replay`), timed beside the event path. Targets
   (the bulk-engine issue): ≥ 5 without conditions, ≥ 1 with them.
2. **µs per slot as streams grow** (K = 8, ``fixed:0.25``, dit = N/4: ρ = 0.5; Poisson
   conditions at 0.1/s, speculative, random starts): 16, 256, 1,024, 4,096 streams, each as
   a ratio to 16. Target at 4,096: ≤ 1.5. Their replans move jobs, so the bulk loop plays
   them (:class:`latsim.sim.bulk_replay.OnlineStream`); the event path is timed beside it.
3. **with a VAE stage** (dit = N/4, vae = N/16, decode ``fixed:0.02``, C = 0.3 s): 64 and
   4,096 streams per slot (target ≤ 1.5) and 4,096 streams × 60 s (target under 10 s).
4. **quiet ticks in bulk** (the event path's default) against every tick an event on the
   clock (the reference path, the same records), on the workloads of 2. and 3. at 256
   streams.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simpy

from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.experiments.engine import DEFAULT_FPS, DEFAULT_R
from latsim.experiments.executors import gc_paused
from latsim.model.arrivals import PoissonArrivals
from latsim.model.costs import FixedCost
from latsim.model.serving import ServingConfig
from latsim.model.traces import Trace
from latsim.plugins import load_cost
from latsim.sim.serving import StreamInput, simulate_serving

# time the pilots of --lead auto, not answers an earlier run kept (experiments/lead_cache)
os.environ.setdefault("LATSIM_CACHE_DIR", "off")

TIMING = Timing(8, DEFAULT_R, DEFAULT_FPS)  # δ = 0.25 s, T = 2 s


def cpu_seconds(fn: Callable[[], object]) -> tuple[float, object]:
    with gc_paused():
        start = time.process_time()
        out = fn()
        return time.process_time() - start, out


def _inputs(streams: int, duration: float, rate: float, seed: int = 0) -> list[StreamInput]:
    rng = np.random.default_rng(seed)
    empty = Trace("none", (), duration)
    return [StreamInput(PoissonArrivals(rate).trace(0, rng, duration, TIMING) if rate
                        else empty, float(rng.uniform(0, TIMING.T)), np.random.default_rng(s),
                        tuple(np.random.default_rng(100 + 4 * s + i) for i in range(4)))
            for s in range(streams)]


# ---------------------------------------------------------------- 1. jobs/s vs plain SimPy


def plain_simpy_jobs(streams: int, job: float, duration: float, phases: list[float]) -> int:
    """The periodic workload in plain SimPy: each stream, from its phase, asks the device
    for ``job`` seconds once a period T. Returns the jobs done."""
    env = simpy.Environment()
    device = simpy.Resource(env, capacity=1)
    done = 0

    def stream(phase: float):
        nonlocal done
        yield env.timeout(phase)
        due = phase
        while True:
            with device.request() as request:
                yield request
                yield env.timeout(job)
            done += 1
            due += TIMING.T
            yield env.timeout(max(0.0, due - env.now))

    for phase in phases:
        env.process(stream(phase))
    env.run(until=duration)
    return done


#: How the workload of 1. is played: latsim's default (a quiet run in numpy,
#: :mod:`latsim.sim.bulk_numpy`), the loop it falls back to (:mod:`latsim.sim.bulk`), the
#: event path on the clock (the reference both equal) and every tick an event too.
WAYS = ("in numpy", "in the loop", "event path", "every tick an event")
#: Where ``--json`` writes the figures of 1., one row a build, stream count and condition
#: rate (docs/testing.md quotes them; tests/test_doc_times.py checks the quotes).
JOBS_JSON = Path(__file__).resolve().parents[1] / "results" / "bench" / "serving_jobs.json"


#: The condition rates of 1. (a second, each stream).
RATES = (0.0, 0.1)


def jobs_per_second(streams: int, duration: float, rate: float = 0.0) -> dict:
    """The periodic workload each of :data:`WAYS` against plain SimPy, alternated, best of
    three each: the ratio of jobs per CPU second, and plain SimPy's jobs per CPU second.
    With conditions (``rate`` a second, each stream) only the default and the event path
    (the loop gives such a run to the event path; a ratio of None)."""
    import latsim.sim.bulk_numpy as bulk_numpy

    job = 0.5 * TIMING.T / streams
    inputs = _inputs(streams, duration, rate)
    config = ControllerConfig(TIMING, BASELINE, job + 0.5 * TIMING.T)
    serving = ServingConfig(streams=streams, pools=(("dit", 1),), start="random")
    in_numpy = bulk_numpy.play_in_numpy
    kept: list[bool] = []

    def watched(run) -> bool:
        kept.append(in_numpy(run))
        return kept[-1]

    def latsim_run(numpy: bool = True, quiet: bool = True, ticks: bool = True):
        bulk_numpy.play_in_numpy = watched if numpy else (lambda run: False)
        try:
            return simulate_serving(config, FixedCost(job), serving, inputs, duration,
                                    np.random.default_rng(1), records="none",
                                    ticks_in_bulk=ticks, quiet_in_bulk=quiet)
        finally:
            bulk_numpy.play_in_numpy = in_numpy

    def plain_run() -> int:
        return plain_simpy_jobs(streams, job, duration, [i.join for i in inputs])

    ways = dict(zip(WAYS, (lambda: latsim_run(), lambda: latsim_run(False),
                           lambda: latsim_run(False, False),
                           lambda: latsim_run(False, False, False)), strict=True))
    if rate:
        ways = {name: ways[name] for name in ("in numpy", "event path")}
    rates: dict[str, list[float]] = {name: [] for name in (*ways, "plain")}
    for _ in range(3):  # alternated, best of three each
        for name, way in ways.items():
            took, run = cpu_seconds(way)
            rates[name].append(sum(s.jobs_done for s in run.streams) / took)
        took, jobs = cpu_seconds(plain_run)
        rates["plain"].append(jobs / took)
    stalled = sum(len(s.stalls) for s in run.streams)
    plain = max(rates["plain"])
    if not all(kept):
        print("    (not all runs stayed in numpy: the default's figure is the event path's)")
    print(f"  {streams} periodic streams on one FIFO device, rho 0.5, {duration:g} s, "
          f"{rate:g} conditions/s ({stalled} stalls); plain SimPy {plain:8.0f} jobs/s")
    for name in ways:
        print(f"    latsim, {name:20s} {max(rates[name]):8.0f} jobs/s: ratio "
              f"{max(rates[name]) / plain:.2f}")
    return {"streams": streams, "duration_s": duration, "conditions_per_s": rate,
            "plain_jobs_per_cpu_s": round(plain),
            "ratio": {name: round(max(rates[name]) / plain, 2) if name in ways else None
                      for name in WAYS}}


def markdown_jobs(rows: list[dict]) -> str:
    """The table docs/testing.md shows of ``--json``'s file: each way's jobs per CPU second
    as a ratio to plain SimPy's on the same workload, a row a build and stream count."""
    lines = ["| build | streams | conditions /s | " + " | ".join(WAYS)
             + " | plain SimPy, jobs per CPU s |",
             "|---|---|---|" + "---|" * len(WAYS) + "---|"]
    for row in rows:
        ratios = " | ".join("–" if row["ratio"][way] is None else f"{row['ratio'][way]:.2f}"
                            for way in WAYS)
        lines.append(f"| {row['build']} ({row['date']}, {row['cores']} cores) | "
                     f"{row['streams']:,} | {row['conditions_per_s']:g} | {ratios} | "
                     f"{row['plain_jobs_per_cpu_s']:,} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- 2, 3. growth


def run_workload(streams: int, duration: float, cost: str, decode: str | None,
                 records: str = "none", ticks_in_bulk: bool = True, in_bulk: bool = True
                 ) -> tuple[float, object]:
    """(CPU seconds, serving records) of ``streams`` speculative streams on dit = N/4 (and
    vae = N/16 with ``decode``), Poisson conditions at 0.1/s, random starts: in the bulk
    loop (the default), or (``in_bulk=False``) on the event path."""
    pools = (("dit", max(1, streams // 4)),) + ((("vae", max(1, streams // 16)),)
                                                if decode else ())
    serving = ServingConfig(streams=streams, pools=pools, start="random",
                            decode=load_cost(decode) if decode else None)
    model = load_cost(cost)
    lead = model.quantile(8, 0.99) + serving.lead_extra(8) + 0.5
    inputs = _inputs(streams, duration, 0.1)
    return cpu_seconds(lambda: simulate_serving(
        ControllerConfig(TIMING, SPECULATIVE, lead), model, serving, inputs, duration,
        np.random.default_rng(1), records=records, ticks_in_bulk=ticks_in_bulk,
        quiet_in_bulk=in_bulk))


def per_slot(streams: int, duration: float, cost: str, decode: str | None,
             in_bulk: bool = True) -> tuple[float, float]:
    """(CPU seconds, µs per played slot) of :func:`run_workload`."""
    took, run = run_workload(streams, duration, cost, decode, in_bulk=in_bulk)
    slots = sum(s.slots.played for s in run.streams)  # type: ignore[attr-defined]
    return took, took / slots * 1e6


#: Where ``--json`` writes the figures of 2. and 3., one row a build, workload and stream
#: count (docs/testing.md's engine table quotes them; tests/test_doc_times.py checks).
GROWTH_JSON = JOBS_JSON.with_name("serving_growth.json")
#: The workloads of 2. and 3.: (label, cost, decode, stream counts; the first is the base).
GROWTH = (("DiT only", "fixed:0.25", None, (16, 256, 1024, 4096)),
          ("DiT + VAE", "fixed:0.3", "fixed:0.02", (64, 1024, 4096)))


def _tries(streams: int) -> int:
    """How many runs of ``streams`` streams :func:`growth` takes the median of: an odd
    count, more the shorter the run."""
    return 1 if streams >= 4096 else 3 if streams >= 1024 else 5 if streams >= 256 else 15


def growth(label: str, counts: tuple[int, ...], cost: str, decode: str | None) -> list[dict]:
    """µs per played slot of each stream count in the bulk loop, and as a ratio to the
    first count's; the same on the event path beside it (alternated). Each is the median
    of :func:`_tries` runs: the base's run is short (16 streams × 60 s take 0.01 s CPU),
    and one run of it moved the ratio by a third."""
    print(f"  {label}")
    base = event_base = None
    rows = []
    for streams in counts:
        tries, event_tries = [], []
        for _ in range(_tries(streams)):
            tries.append(per_slot(streams, 60.0, cost, decode))
            event_tries.append(per_slot(streams, 60.0, cost, decode, in_bulk=False))
        (took, micro), (event_took, event_micro) = (
            sorted(runs, key=lambda run: run[1])[len(runs) // 2] for runs in (tries, event_tries))
        base, event_base = base or micro, event_base or event_micro
        print(f"    {streams:5d} streams x 60 s: {took:7.2f} s CPU, {micro:6.2f} us per slot "
              f"({micro / base:.2f} of {counts[0]} streams); event path {event_took:.2f} s, "
              f"{event_micro:.2f} us ({event_micro / event_base:.2f})")
        rows.append({"workload": label, "streams": streams, "duration_s": 60.0,
                     "cpu_s": round(took, 2), "us_per_slot": round(micro, 2),
                     "ratio_to_first": round(micro / base, 2),
                     "event_path_cpu_s": round(event_took, 2),
                     "event_path_us_per_slot": round(event_micro, 2),
                     "event_path_ratio_to_first": round(event_micro / event_base, 2)})
    return rows


def write_rows(rows: list[dict], path: Path) -> None:
    """Keep this build's rows in ``path`` beside the other build's."""
    from latsim import build

    kept = json.loads(path.read_text())["rows"] if path.exists() else []
    kept = [row for row in kept if row["build"] != build()]
    stamp = {"build": build(), "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    path.write_text(json.dumps({"rows": kept + [stamp | row for row in rows]}, indent=1)
                    + "\n")


def bulk_against_each(streams: int) -> None:
    """The event path's quiet ticks played in bulk (its default) against every tick an
    event on the clock (the reference path, same records), on the workload of 2. and 3."""
    for label, cost, decode in (("DiT only", "fixed:0.25", None),
                                ("DiT + VAE", "fixed:0.3", "fixed:0.02")):
        bulk, each = [], []
        for _ in range(3):  # alternated, best of three each
            bulk.append(run_workload(streams, 60.0, cost, decode, in_bulk=False)[0])
            each.append(run_workload(streams, 60.0, cost, decode, ticks_in_bulk=False)[0])
        print(f"  {label}, {streams} streams x 60 s: in bulk {min(bulk):.2f} s CPU, each tick "
              f"an event {min(each):.2f} s: {min(each) / min(bulk):.2f}x faster")


def main() -> None:
    quick = "--quick" in sys.argv
    print("1. jobs per second against plain SimPy on the same workload")
    rows = [jobs_per_second(streams, 60.0, rate)
            for rate in RATES for streams in ((256,) if quick else (256, 1024))]
    if "--json" in sys.argv:
        write_rows(rows, JOBS_JSON)
        print(f"  wrote {JOBS_JSON.relative_to(JOBS_JSON.parents[2])}")
    headings = ("2. us per slot as streams grow (K=8, fixed:0.25, dit=N/4: rho 0.5; target "
                "<= 1.5 at 4096 / 16)",
                "3. with a VAE stage (C=0.3, decode fixed:0.02, dit=N/4, vae=N/16; targets: "
                "<= 1.5 at 4096 / 64, 4096 x 60 s under 10 s)")
    grown = []
    for heading, (label, cost, decode, counts) in zip(headings, GROWTH, strict=True):
        print(heading)
        grown += growth(label, counts[:-1] if quick else counts, cost, decode)
    if "--json" in sys.argv:
        write_rows(grown, GROWTH_JSON)
        print(f"  wrote {GROWTH_JSON.relative_to(GROWTH_JSON.parents[2])}")
        return
    print("4. quiet ticks in bulk against every tick an event on the clock")
    bulk_against_each(256)


if __name__ == "__main__":
    main()
