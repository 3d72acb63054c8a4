"""Serving-model benchmark: events per second with 1, 16 and 256 streams, how the cost of a
slot grows with the number of streams, and the wall time of a capacity search.

Run: ``.venv/bin/python bench/bench_serving.py``. Reports numbers; asserts nothing.
Targets (2-core machine): 256 streams x 60 s simulated in under 10 s (issue "serving
model"); from issue "speed": microseconds per slot at 4,096 streams over that at 16 streams
<= 1.2, and 4,096 streams x 60 s (K = 8, dit = 1,024, vae = 256) in under 5 s. Events are
the controllers' (slots, wake-ups, conditions, job starts and ends), summed over the
streams; the ratio of the per-stream rate to the single-stream rate shows what the shared
pools cost. Every run has the garbage collector paused, as the experiment engine's work
units do (:func:`latsim.experiments.executors.gc_paused`).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from latsim.controller import ControllerConfig
from latsim.controller.policies import SPECULATIVE
from latsim.controller.timing import Timing
from latsim.experiments.capacity import SLO, CapacityQuery, search_capacity
from latsim.experiments.engine import DEFAULT_FPS, DEFAULT_R, Experiment
from latsim.experiments.executors import gc_paused
from latsim.model.arrivals import PoissonArrivals
from latsim.model.costs import AffineCost
from latsim.model.serving import ServingConfig
from latsim.plugins import load_cost
from latsim.sim.serving import StreamInput, simulate_serving


def _serving_run(streams: int, duration: float, dit: int | None, vae: int | None
                 ) -> tuple:
    timing = Timing(8, DEFAULT_R, DEFAULT_FPS)
    cost = AffineCost(0.14725, 0.16275)
    devices = dit or max(1, round(streams * cost.mean(8) / timing.T / 0.6))
    vae = vae or 1 + devices // 4
    serving = ServingConfig(streams=streams, pools=(("dit", devices), ("vae", vae)),
                            decode=load_cost("fixed:0.02"), deliver=load_cost("fixed:0.01"),
                            start="random")
    lead = cost.mean(8) + 0.02 + 0.5
    rng = np.random.default_rng(0)
    inputs = [StreamInput(PoissonArrivals(0.1).trace(0, rng, duration, timing),
                          float(rng.uniform(0, timing.T)), np.random.default_rng(s),
                          tuple(np.random.default_rng(100 + 4 * s + i) for i in range(4)))
              for s in range(streams)]
    with gc_paused():
        start = time.perf_counter()
        run = simulate_serving(ControllerConfig(timing, SPECULATIVE, lead), cost, serving,
                               inputs, duration, np.random.default_rng(1))
        took = time.perf_counter() - start
    return run, took


def run_serving(streams: int, duration: float = 60.0, dit: int | None = None,
                vae: int | None = None):  # noqa: ANN201
    """The serving records of :func:`streams_throughput`'s run."""
    return _serving_run(streams, duration, dit, vae)[0]


def streams_throughput(streams: int, duration: float = 60.0, dit: int | None = None,
                       vae: int | None = None) -> tuple[float, int, float, int]:
    """(wall seconds, controller events, events/s, slots) of ``streams`` streams on a DiT
    pool of ``dit`` devices (default: sized to keep them at about 60 % utilisation) and a
    VAE pool of ``vae`` (default: a quarter as many, plus one), with delivery."""
    run, took = _serving_run(streams, duration, dit, vae)
    events = sum(len(s.slots) + len(s.jobs) * 2 + len(s.conditions) for s in run.streams)
    return took, events, events / took, sum(len(s.slots) for s in run.streams)


def growth() -> None:
    """Microseconds per slot as streams grow, on the issue's pools (dit = streams / 4, vae
    = streams / 16: 4,096 streams on 1,024 DiT devices), each as a ratio to 16 streams."""
    base = None
    for streams in (16, 256, 1024, 4096):
        if streams > 1024 and "--quick" in sys.argv:
            break
        tries = [streams_throughput(streams, dit=streams // 4, vae=streams // 16)
                 for _ in range(3 if streams <= 256 else 1)]  # the short ones: best of 3
        took, _, _, slots = min(tries)
        per_slot = took / slots * 1e6
        base = base or per_slot
        print(f"  {streams:4d} streams x 60 s (dit {streams // 4}, vae {streams // 16}): "
              f"{took:6.2f} s wall, {per_slot:5.2f} us per slot ({per_slot / base:.2f} of "
              f"16 streams; target <= 1.2 at 4096, and under 5 s)")


def main() -> None:
    print("serving model, one process (events: slots + job start/end + conditions)")
    base = None
    for streams in (1, 16, 256):
        took, events, rate, _ = streams_throughput(streams)
        base = base or rate
        print(f"  {streams:4d} streams x 60 s: {took:6.2f} s wall, {events:8d} events, "
              f"{rate:9.0f} events/s ({rate / base:.2f} of the 1-stream rate)")
    print("growth with the number of streams")
    growth()
    experiment = Experiment(Ks=(8,), cost="fixed:0.5", lead=1.5, policies=("speculative",),
                            duration=60.0, serving=ServingConfig(pools=(("dit", 4),),
                                                                 start="random"))
    query = CapacityQuery(experiment, SLO(2.5, 0.1), max_streams=256)
    start = time.perf_counter()
    result = search_capacity(query)
    took = time.perf_counter() - start
    print(f"  capacity search 1..256 streams of 60 s (dit=4, C=0.5 s, L95 <= 2.5 s, "
          f"stall <= 0.1 %): {took:.1f} s wall, {len(result.verdicts)} stream counts tried, "
          f"capacity {result.max_streams}")


if __name__ == "__main__":
    main()
