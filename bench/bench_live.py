"""Benchmark (not a test): controller decision overhead per event and player slot-start jitter.

    .venv/bin/python bench/bench_live.py [--duration 20] [--json]

1. **Decision overhead, isolated**: the controller alone on a virtual clock (a heap of
   timers, jobs of a fixed C), every ``Controller.handle`` call timed with
   ``perf_counter``: median and p99 per event. This is the controller's own cost.
2. **Fixed-cost agreement**: the wall-clock driver with a stand-in generator that sleeps
   exactly C against the simulator with ``fixed:C`` on the same trace (both policies):
   |L50 live - L50 simulated|, the largest per-condition |L| difference, busy % and DiT
   calls side by side, and how much longer than C jobs took as the controller saw them
   (dispatch and hand-back delays). These are wall-clock figures: tests/test_harness_units.py
   checks the driver pathwise against the simulator fed the measured job times instead.
3. **Live**: the wall-clock driver with the tiny Wan DiT on CPU (both policies, Poisson
   conditions at 1/s): decision time as measured inside the live run (includes GIL
   contention with the generator thread), slot-start lateness (timer fired - due) and
   slot handling lateness (driver handled - due), p50/p99/max; the lead and the jitter
   term of its margin (p99 slot-start lateness + p99 dispatch delay of the in-run
   calibration, :data:`latsim.model.lead.LIVE`), stall %, and how many events the driver
   still had to hand over out of order (``now`` later than the time they stood for: the
   driver orders queued events by that time and waits for late timers, so this should be
   0 or nearly).
"""

from __future__ import annotations

import argparse
import heapq
import json
import tempfile
import time

import numpy as np

from latsim.controller import (
    ConditionArrived,
    Controller,
    ControllerConfig,
    JobDone,
    ScheduleWakeUp,
    StartJob,
)
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing


def isolated_overhead(policy, K: int = 8, C: float = 0.3, rate: float = 1.0,
                      duration: float = 3000.0, seed: int = 0) -> list[float]:
    """Seconds per ``handle`` call, the controller on a virtual clock."""
    rng = np.random.default_rng(seed)
    ctrl = Controller(ControllerConfig(Timing(K, 4, 16.0), policy, C))
    heap: list = []
    seq = 0

    def push(at, event):
        nonlocal seq
        heapq.heappush(heap, (at, seq, event))
        seq += 1

    def execute(commands, now):
        for command in commands:
            if type(command) is ScheduleWakeUp:
                push(command.at, command.event)
            elif type(command) is StartJob:
                push(now + C, JobDone(command.job_id))

    t = 0.0
    while True:
        t += float(rng.exponential(1 / rate))
        if t >= duration:
            break
        push(t, ConditionArrived())
    execute(ctrl.start(0.0), 0.0)
    times = []
    clock = time.perf_counter
    while heap:
        at, _, event = heapq.heappop(heap)
        if at > duration:
            break
        t0 = clock()
        commands = ctrl.handle(event, at)
        times.append(clock() - t0)
        execute(commands, at)
    return times


def _stats_us(values: list[float]) -> dict:
    arr = np.asarray(values) * 1e6
    return {"median_us": float(np.median(arr)), "p99_us": float(np.percentile(arr, 99)),
            "max_us": float(arr.max()), "n": int(arr.size)}


def fixed_cost_agreement(duration: float, C: float = 0.05, lead: float = 0.08,
                         rate: float = 2.0, seed: int = 0) -> dict:
    """The live driver with a generator that sleeps ``C`` against ``fixed:C`` simulated."""
    from harness.live.driver import DriverConfig, LiveDriver, SleepExecutor
    from latsim.analysis.metrics import summarize
    from latsim.model.arrivals import PoissonArrivals
    from latsim.model.costs import FixedCost
    from latsim.sim.simpy_driver import simulate_trace

    timing = Timing(2, 4, 16.0)
    trace = PoissonArrivals(rate).trace(seed, np.random.default_rng(seed), duration, timing)
    out = {}
    for policy in (BASELINE, SPECULATIVE):
        config = ControllerConfig(timing, policy, lead)
        live_run = LiveDriver(config, SleepExecutor(C), trace, DriverConfig(duration)).run()
        sim, _ = simulate_trace(config, FixedCost(C), trace, duration,
                                np.random.default_rng(seed))
        m_live, m_sim = summarize([live_run.records]), summarize([sim])
        shown = {c.version: c.L for c in sim.conditions if c.displayed}
        diffs = [abs(c.L - shown[c.version]) for c in live_run.records.conditions
                 if c.displayed and c.version in shown]
        extra = [j.t_ready - j.t_start - C for j in live_run.records.jobs if j.job_id > 0]
        out[policy.name] = {
            "L50_live_s": m_live.L50, "L50_sim_s": m_sim.L50,
            "L50_abs_diff_s": (abs(m_live.L50 - m_sim.L50)
                               if m_live.L50 is not None and m_sim.L50 is not None else None),
            "L_max_abs_diff_s": max(diffs, default=None),
            "busy_pct_live": m_live.busy_pct, "busy_pct_sim": m_sim.busy_pct,
            "dit_calls_live": m_live.dit_calls, "dit_calls_sim": m_sim.dit_calls,
            "job_extra_ms": _stats_ms(extra) if extra else None,
            "n_conditions": m_live.n_conditions,
        }
    return out


def _stats_ms(values: list[float]) -> dict:
    arr = np.asarray(values) * 1e3
    return {"median_ms": float(np.median(arr)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max()), "n": int(arr.size)}


def live(duration: float) -> dict:
    from harness.measure.run import MeasureConfig, measure

    with tempfile.TemporaryDirectory() as tmp:
        config = MeasureConfig(preset="tiny", resolution="tiny", Ks=(4,), steps=8,
                               duration=duration, rate=1.0, out=tmp, warmup_timed=5,
                               warmup_gap_s=0.1)
        results = measure(config)
        configs = [json.loads((res.run_dir / "config.json").read_text()) for res in results]
    out = {}
    for res, conf in zip(results, configs, strict=True):
        s = res.summary
        decisions = [e.decision_s for e in res.driver.events]
        reordered = sum(1 for e in res.driver.events
                        if e.now > (e.happened if e.scheduled is None else e.scheduled))
        out[s["policy"]] = {
            "lead_jitter_ms": (None if conf.get("lead_jitter_s") is None
                               else 1e3 * conf["lead_jitter_s"]),
            "reordered_events": reordered, "n_events": len(res.driver.events),
            "decision": _stats_us(decisions),
            "slot_start_lateness_ms": s["slot_start_lateness_ms"],
            "slot_handle_lateness_ms": s["slot_handle_lateness_ms"],
            "job_dispatch_delay_ms": s["job_dispatch_delay_ms"],
            "C_mean_s": s["C_mean"], "lead_s": s["lead"], "L50_s": s["L50"], "L95_s": s["L95"],
            "stall_pct": s["stall_pct"], "busy_pct": s["busy_pct"],
        }
    return out


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--skip-fixed", action="store_true")
    args = parser.parse_args()
    report = {"isolated": {p.name: _stats_us(isolated_overhead(p))
                           for p in (BASELINE, SPECULATIVE)}}
    if not args.skip_fixed:
        report["fixed_cost"] = fixed_cost_agreement(args.duration)
    if not args.skip_live:
        report["live"] = live(args.duration)
    try:
        with open("/proc/loadavg") as handle:
            report["loadavg"] = handle.read().split()[:3]
    except OSError:
        pass
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name, s in report["isolated"].items():
        print(f"isolated {name:>11}: decision median {s['median_us']:.1f} us, "
              f"p99 {s['p99_us']:.1f} us, max {s['max_us']:.1f} us ({s['n']} events)")
    for name, s in report.get("fixed_cost", {}).items():
        extra = s["job_extra_ms"] or {"median_ms": float("nan"), "max_ms": float("nan")}
        print(f"fixed C  {name:>11}: L50 live {_s(s['L50_live_s'])} vs sim "
              f"{_s(s['L50_sim_s'])} s (|diff| {_s(s['L50_abs_diff_s'])}, max per condition "
              f"{_s(s['L_max_abs_diff_s'])}); busy {s['busy_pct_live']:.2f} vs "
              f"{s['busy_pct_sim']:.2f} %; calls {s['dit_calls_live']} vs {s['dit_calls_sim']}; "
              f"job time over C median {extra['median_ms']:.3f} ms, max "
              f"{extra['max_ms']:.3f} ms")
    for name, s in report.get("live", {}).items():
        d, j, h = s["decision"], s["slot_start_lateness_ms"], s["slot_handle_lateness_ms"]
        jitter = "n/a" if s["lead_jitter_ms"] is None else f"{s['lead_jitter_ms']:.3f} ms"
        print(f"live     {name:>11}: decision median {d['median_us']:.1f} us, p99 "
              f"{d['p99_us']:.1f} us; slot-start lateness p50 {j['p50']:.3f} ms, p99 "
              f"{j['p99']:.3f} ms; handled p99 {h['p99']:.3f} ms; L50 {s['L50_s']:.3f} s; "
              f"lead {s['lead_s'] * 1e3:.2f} ms (jitter {jitter}); stall "
              f"{s['stall_pct']:.2f} %; reordered {s['reordered_events']}/{s['n_events']}")
    if "loadavg" in report:
        print(f"load average {' '.join(report['loadavg'])} (other processes share the cores)")


if __name__ == "__main__":
    main()
