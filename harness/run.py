"""One live measurement: build the generator, warm up, derive the lead, run each (K, policy).

:func:`measure` is what ``latsim measure`` calls. For every K it runs warm-up jobs (their
durations are the first measured C samples), sets ``lead`` to their 0.99 quantile plus a
stated margin (``max(lead_margin_frac x q99, lead_margin_s)``) unless a lead is given, then
drives one live run per policy on the same trace and writes one run folder. Timed warm-up
jobs are separated by idle gaps (default ``min(T/2, 0.5 s)``) because jobs in a live run
start from idle and take longer than back-to-back ones. Files of a run folder::

    conditions.csv jobs.csv slots.csv stalls.csv discards.csv   the simulator's records
                      (leading columns policy, K, run), appended while the run goes
    gen_jobs.csv      the generator's own timing of every job (warm-up and run)
    events.csv        every event the controller handled: due, fired, handled, decision time
    nvml_samples.csv  raw GPU utilisation samples (when NVML is available)
    trace.jsonl       the arrival trace as replayed
    cost_samples.json every measured job duration, in latsim.model.costs.load_table's format
    config.json       everything needed to re-run (versions, device, lead, trace path, status)
    summary.json      DESIGN §4 keys + kernel_activity(_note), device, timing diagnostics

Summary metrics come from :func:`latsim.analysis.metrics.summarize` on a
:class:`~latsim.sim.simpy_driver.RunRecords` built from the live records, the same code as simulation.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.driver import DriverConfig, DriverResult, LiveDriver
from harness.generator import (
    GeneratorConfig,
    JobTiming,
    WanGenerator,
    device_name,
    require_device,
)
from harness.presets import model_preset, resolution
from harness.recorder import RecordWriter
from harness.telemetry import KernelActivity, NvmlSampler, unavailable
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig, StartJob
from latsim.controller.policies import PRESETS, Policy
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.arrivals import PoissonArrivals
from latsim.model.traces import Trace, load_trace, write_trace
from latsim.run.files import clean, dumps

#: Default results folder when ``--out`` is not given (one folder per run inside).
RESULTS_RUNS = Path("results/runs")

#: Quantile of the warm-up job times used for the lead (DESIGN §2).
LEAD_QUANTILE = 0.99


@dataclass(frozen=True)
class MeasureConfig:
    """Everything ``latsim measure`` needs; ``None`` means the documented default."""

    preset: str = "tiny"
    resolution: str = "tiny"
    Ks: tuple[int, ...] = (4,)
    steps: int = 4
    policies: tuple[str, ...] = ("baseline", "speculative")
    trace: str | None = None  # JSONL trace; None: a seeded Poisson trace at ``rate``
    rate: float = 0.1  # conditions per second when no trace is given
    duration: float | None = None  # default: the trace header's, else 60 s
    device: str = "cpu"
    out: str | None = None  # parent folder of the run folders
    lead: float | None = None  # default: warm-up q99 + margin
    r: int = 4
    fps: float = 16.0
    seed: int = 0
    decode: bool = False
    context: int = 0
    warmup_untimed: int = 2
    warmup_timed: int = 10
    warmup_gap_s: float | None = None  # idle before each timed warm-up job; default min(T/2, .5)
    lead_margin_frac: float = 0.10
    lead_margin_s: float = 0.005
    calibration_jobs: int = 8  # refills of the in-situ calibration pass (0: warm-up only)
    calibration_max_s: float = 15.0
    drain: float | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        model_preset(self.preset)
        resolution(self.resolution)
        if not self.Ks:
            raise LatsimError("give at least one --K")
        for K in self.Ks:  # noqa: N806
            Timing(K, self.r, self.fps)
        for name in self.policies:
            if name not in PRESETS:
                raise LatsimError(f"unknown policy {name!r}; choose baseline or speculative")
        if self.duration is not None and not (math.isfinite(self.duration)
                                              and self.duration > 0):
            raise LatsimError(f"--duration must be a positive number of seconds, "
                              f"got {self.duration!r}")
        if self.lead is not None and not (math.isfinite(self.lead) and self.lead >= 0):
            raise LatsimError(f"--lead must be >= 0 seconds, got {self.lead!r}")
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise LatsimError(f"--rate must be >= 0 per second, got {self.rate!r}")
        if self.calibration_jobs < 0:
            raise LatsimError(f"--calibrate must be >= 0 jobs, got {self.calibration_jobs}")
        if self.warmup_timed < 1 or self.warmup_untimed < 0:
            raise LatsimError("warm-up needs at least one timed job")
        GeneratorConfig(self.preset, self.resolution, self.steps, self.context, self.decode,
                        self.device, self.seed, self.threads)

    def generator_config(self) -> GeneratorConfig:
        return GeneratorConfig(self.preset, self.resolution, self.steps, self.context,
                               self.decode, self.device, self.seed, self.threads)


@dataclass(frozen=True)
class RunResult:
    """One (K, policy) run: its folder, summary row and the driver's result."""

    run_dir: Path
    summary: dict
    driver: DriverResult = field(repr=False)


@dataclass(frozen=True)
class Warmup:
    """Warm-up jobs of one K (and decode group) and the lead derived from them."""

    K: int
    decode_group: int
    jobs: tuple[JobTiming, ...]
    calibration: tuple[float, ...] = ()  # controller-view C of the in-run calibration pass

    @property
    def durations(self) -> list[float]:
        return [j.wall_s for j in self.jobs]

    @property
    def q99(self) -> float:
        return float(np.quantile(np.asarray(self.durations), LEAD_QUANTILE, method="higher"))


def calibrate(generator: WanGenerator, timing: Timing, lead: float, config: MeasureConfig,
              decode_group: int) -> list[float]:
    """Job times as the controller sees them in a live run, measured in situ.

    Warm-up jobs run alone; in a run the same job shares the process with the player clock,
    the driver and the recorder (GIL hand-offs, a 2-core CPU), and the controller's clock
    starts it at the due time it acted on, so timer lateness and dispatch delay count too
    (on this machine: jobs ~30% slower and 6-10 ms of dispatch at K=2). A short pass of the
    real driver with no conditions (baseline refills) measures ``t_ready - t_start`` of each
    job; the lead is then set from these.
    """
    if config.calibration_jobs <= 0:
        return []
    duration = min((config.calibration_jobs + 1) * timing.T, config.calibration_max_s)
    duration = max(duration, timing.T)
    generator.reset_stream(timing.K)
    driver = LiveDriver(
        ControllerConfig(timing, PRESETS["baseline"], lead),
        _Executor(generator, max(decode_group, 1) if config.decode else 0),
        Trace("calibration", (), duration), DriverConfig(duration, config.drain),
    )
    result = driver.run()
    return [j.t_ready - j.t_start for j in result.records.jobs if j.kind != "prebuffer"]


def lead_from_warmup(q99: float, margin_frac: float, margin_s: float) -> float:
    """The planning lead: warm-up q99 plus ``max(margin_frac * q99, margin_s)``."""
    return q99 + max(margin_frac * q99, margin_s)


def load_or_make_trace(config: MeasureConfig) -> tuple[Trace, float]:
    """The trace to replay and the window length."""
    if config.trace is not None:
        trace = load_trace(config.trace)
        duration = config.duration or trace.duration or 60.0
        return trace, float(duration)
    duration = float(config.duration or 60.0)
    drawn = PoissonArrivals(config.rate).trace(
        config.seed, np.random.default_rng(config.seed), duration, Timing(1, config.r, config.fps)
    )
    meta = {"duration": duration, "generator": f"poisson:{config.rate!r}", "seed": config.seed}
    return Trace(drawn.name, drawn.times, duration, meta), duration


class _Executor:
    """Adapts the generator to the driver's ``run_job(job)``, decoding ``decode_group``."""

    def __init__(self, generator: WanGenerator, decode_group: int) -> None:
        self.generator = generator
        self.decode_group = decode_group

    def run_job(self, job: StartJob) -> JobTiming:
        return self.generator.run_job(job, self.decode_group)


def versions() -> dict:
    """Versions of everything that shapes a measurement."""
    import diffusers
    import torch

    import latsim

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "diffusers": diffusers.__version__,
        "numpy": np.__version__,
        "latsim": getattr(latsim, "__version__", "0.1.0"),
        "platform": platform.platform(),
    }


def _percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    arr = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "max": float(arr.max()), "n": int(arr.size)}


def timing_diagnostics(result: DriverResult) -> dict:
    """Timer lateness, handling delay and controller decision time of one run (ms)."""
    slot_fire = [e.happened - e.scheduled for e in result.events
                 if e.kind == "slot_due" and e.scheduled is not None]
    slot_handle = [e.handled - e.scheduled for e in result.events
                   if e.kind == "slot_due" and e.scheduled is not None]
    timer_fire = [e.happened - e.scheduled for e in result.events if e.scheduled is not None]
    done_handle = [e.handled - e.happened for e in result.events if e.kind == "job_done"]
    decision = [e.decision_s for e in result.events]
    dispatch = []
    by_id = {j.job_id: j for j in result.jobs}
    for job_id, start in result.job_starts.items():
        if job_id in by_id:
            dispatch.append(by_id[job_id].t_start - start)
    return {
        "slot_start_lateness_ms": _percentiles_ms(slot_fire),
        "slot_handle_lateness_ms": _percentiles_ms(slot_handle),
        "timer_lateness_ms": _percentiles_ms(timer_fire),
        "job_done_handle_delay_ms": _percentiles_ms(done_handle),
        "job_dispatch_delay_ms": _percentiles_ms(dispatch),
        "decision_ms": _percentiles_ms(decision),
    }


def _write_rows(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _progress_line(run_id: str, duration: float) -> Callable:
    def line(elapsed: float, ctrl) -> str:
        shown = sum(1 for c in ctrl.conditions if c.displayed)
        arrived = ctrl.latest_version
        stall_s = sum(s.t_end - s.t_start for s in ctrl.stalls)
        stalled = " STALLED" if ctrl.stalled else ""
        return (f"[{run_id}] {elapsed:6.1f}/{duration:g} s  conditions served "
                f"{shown}/{arrived}  stalls {len(ctrl.stalls)} ({stall_s:.2f} s){stalled}  "
                f"jobs {ctrl.jobs_done}")
    return line


def measure(
    config: MeasureConfig,
    progress: Callable[[str], None] | None = None,
    generator: WanGenerator | None = None,
    on_driver: Callable[[LiveDriver], None] | None = None,
) -> list[RunResult]:
    """Run every (K, policy) of ``config`` live; returns one result per run folder.

    ``progress`` receives a one-line status about twice a second. ``on_driver`` sees each
    driver before it runs (tests use it to stop a run early). Ctrl-C ends the current run,
    writes what it measured (marked interrupted) and re-raises ``KeyboardInterrupt``.
    """
    require_device(config.device)
    trace, duration = load_or_make_trace(config)
    timings = {K: Timing(K, config.r, config.fps) for K in config.Ks}
    for K, timing in timings.items():  # noqa: N806
        if duration < timing.T:
            raise LatsimError(
                f"duration {duration:g} s is shorter than one chunk (K={K}: T = {timing.T:g} s)"
            )
    policies = [PRESETS[name] for name in config.policies]
    for K in config.Ks:  # noqa: N806
        for policy in policies:
            ControllerConfig(timings[K], policy, 0.0)  # validates q against K
    if generator is None:
        generator = WanGenerator(config.generator_config())
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if config.out is not None:
        root = Path(config.out)
        names = {(K, p.name): f"K{K}-{p.name}" for K in config.Ks for p in policies}
    else:
        root = RESULTS_RUNS
        names = {(K, p.name): f"{stamp}-{config.preset}-K{K}-{p.name}"
                 for K in config.Ks for p in policies}
    root.mkdir(parents=True, exist_ok=True)
    env = {"versions": versions(), "device_name": device_name(config.device),
           "torch_threads": generator.threads, "n_params": generator.n_params}

    results: list[RunResult] = []
    for K in config.Ks:  # noqa: N806
        warmups: dict[int, Warmup] = {}
        for policy in policies:
            group = policy.commit_unit(K) if config.decode else 0
            if group not in warmups:
                gap = (config.warmup_gap_s if config.warmup_gap_s is not None
                       else min(timings[K].T / 2, 0.5))
                jobs = generator.warmup(K, config.warmup_untimed, config.warmup_timed,
                                        max(group, 1), gap)
                warmups[group] = Warmup(K, group, tuple(jobs))
        q99 = max(w.q99 for w in warmups.values())
        if config.lead is not None:
            lead, lead_source = config.lead, "--lead"
        else:
            lead = lead_from_warmup(q99, config.lead_margin_frac, config.lead_margin_s)
            lead_source = (f"warm-up q{LEAD_QUANTILE:g} ({q99:.6f} s) + "
                           f"max({config.lead_margin_frac:g} x q99, {config.lead_margin_s:g} s)")
            calibration = {
                group: calibrate(generator, timings[K], lead, config, group)
                for group in warmups
            }
            measured = [c for samples in calibration.values() for c in samples]
            if measured:
                q99_live = float(np.quantile(np.asarray(measured), LEAD_QUANTILE,
                                             method="higher"))
                if q99_live > q99:
                    q99 = q99_live
                    lead = lead_from_warmup(q99, config.lead_margin_frac,
                                            config.lead_margin_s)
                    lead_source = (
                        f"in-run calibration q{LEAD_QUANTILE:g} ({q99:.6f} s, {len(measured)} "
                        f"jobs as the controller saw them) + max({config.lead_margin_frac:g} "
                        f"x q99, {config.lead_margin_s:g} s)")
            for group, samples in calibration.items():
                warmups[group] = replace(warmups[group], calibration=tuple(samples))
        baseline_calls: int | None = None
        for policy in policies:
            group = policy.commit_unit(K) if config.decode else 0
            run_id = names[(K, policy.name)]
            result = _run_one(
                config, generator, trace, duration, timings[K], policy, lead, lead_source,
                warmups[group], root / run_id, run_id, env, baseline_calls, progress,
                on_driver,
            )
            results.append(result)
            if policy.name == "baseline":
                baseline_calls = result.summary["dit_calls"]
            if result.driver.stop_reason == "KeyboardInterrupt":
                _write_index(root, config, results, interrupted=True)
                raise KeyboardInterrupt
            if result.driver.errors:
                _write_index(root, config, results, interrupted=True)
                raise LatsimError(f"{run_id}: {result.driver.errors[0]}")
    _write_index(root, config, results, interrupted=False)
    return results


def _write_index(root: Path, config: MeasureConfig, results: list[RunResult],
                 interrupted: bool) -> None:
    if config.out is None:
        return
    index = {"config": asdict(config), "interrupted": interrupted,
             "runs": [{"run_dir": str(r.run_dir), **r.summary} for r in results]}
    (root / "measure.json").write_text(dumps(index) + "\n")


def _run_one(
    config: MeasureConfig,
    generator: WanGenerator,
    trace: Trace,
    duration: float,
    timing: Timing,
    policy: Policy,
    lead: float,
    lead_source: str,
    warmup: Warmup,
    run_dir: Path,
    run_id: str,
    env: dict,
    baseline_calls: int | None,
    progress: Callable[[str], None] | None,
    on_driver: Callable[[LiveDriver], None] | None,
) -> RunResult:
    K = timing.K  # noqa: N806
    q = policy.commit_unit(K)
    decode_group = q if config.decode else 0
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_times = [t for t in trace.times if t < duration]
    write_trace(run_dir / "trace.jsonl", trace_times,
                {**trace.meta, "duration": duration, "source": config.trace or trace.name})
    run_config = {
        "run_id": run_id,
        "status": "running",
        "command": _command_line(config, K, policy.name, config.lead),
        "measure_config": asdict(config),
        "K": K, "policy": policy.name, "q": q, "commit": policy.commit,
        "r": config.r, "fps": config.fps, "T": timing.T, "delta": timing.delta,
        "duration": duration,
        "trace_path": config.trace, "trace_copy": "trace.jsonl",
        "trace_name": trace.name, "n_trace_conditions": len(trace_times),
        "lead": lead, "lead_source": lead_source,
        "warmup_durations": warmup.durations, "warmup_q99": warmup.q99,
        "calibration_durations": list(warmup.calibration),
        "decode_group": decode_group,
        "device": config.device, **env,
        "switch_interval_s": DriverConfig(duration).switch_interval_s,
        "spin_s": DriverConfig(duration).spin_s,
        "started_at": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    (run_dir / "config.json").write_text(dumps(run_config) + "\n")

    writer = RecordWriter(run_dir, (("policy", policy.name), ("K", K), ("run", 0)))
    writer.start()
    sampler = NvmlSampler() if config.device == "cuda" else None
    if sampler is not None:
        sampler.start()
    generator.reset_stream(K)
    ctrl_config = ControllerConfig(timing, policy, lead)
    line = _progress_line(run_id, duration)
    driver = LiveDriver(
        ctrl_config, _Executor(generator, decode_group), Trace(trace.name, tuple(trace_times),
                                                               duration),
        DriverConfig(duration, config.drain), on_record=writer,
        progress=(lambda t, ctrl: progress(line(t, ctrl))) if progress else None,
    )
    if on_driver is not None:
        on_driver(driver)
    try:
        result = driver.run()
    finally:
        writer.close()
        if sampler is not None:
            sampler.stop()
    if progress is not None:
        progress(line(result.end_time, result.controller))

    if sampler is not None:
        activity = sampler.activity(result.t0_unix, result.t0_unix + min(duration,
                                                                          result.end_time))
    else:
        activity = unavailable(
            "device is cpu: NVML measures GPU kernels; generator busy % is busy_pct"
        )
    display = wall_latencies(result)
    summary = _summary(config, result, timing, policy, lead, warmup, activity, env,
                       baseline_calls, run_id, display)
    _write_telemetry(run_dir, result, warmup, sampler, K, display)
    (run_dir / "summary.json").write_text(dumps(summary) + "\n")
    run_config["status"] = "interrupted" if result.interrupted else "complete"
    run_config["interrupted"] = result.interrupted
    run_config["stop_reason"] = result.stop_reason
    run_config["end_time"] = result.end_time
    (run_dir / "config.json").write_text(dumps(run_config) + "\n")
    return RunResult(run_dir, summary, result)


def _command_line(config: MeasureConfig, K: int, policy: str,  # noqa: N803
                  lead: float | None) -> str:
    parts = ["latsim measure", f"--preset {config.preset}", f"--resolution {config.resolution}",
             f"--K {K}", f"--steps {config.steps}", f"--policy {policy}",
             f"--device {config.device}", f"--r {config.r}", f"--fps {config.fps:g}",
             f"--seed {config.seed}", f"--context {config.context}",
             "--decode" if config.decode else "--no-decode"]
    if config.trace:
        parts.append(f"--trace {config.trace}")
    else:
        parts.append(f"--rate {config.rate:g}")
    if config.duration:
        parts.append(f"--duration {config.duration:g}")
    if lead is not None:
        parts.append(f"--lead {lead!r}")
    return " ".join(parts)


def wall_latencies(result: DriverResult) -> list[dict]:
    """Each displayed condition's latency on the wall clock: from its trace time to when the
    player was told to show its first slot (scheduled start + timer lateness + handling).

    The controller runs on the slots' scheduled times (the playback grid does not drift), so
    the records' L excludes the player's own delays; this puts them back in.
    """
    position_at = {slot.t_start: slot.position for slot in result.records.slots}
    rows = []
    for c in result.records.conditions:
        if not c.displayed:
            continue
        position = position_at[c.t_play]
        shown = result.display_times[position]
        rows.append({"version": c.version, "t_arrival": c.t_arrival, "position": position,
                     "t_play": c.t_play, "t_display": shown, "L": c.L,
                     "L_wall": shown - c.t_arrival, "superseded": c.superseded})
    return rows


def _summary(config: MeasureConfig, result: DriverResult, timing: Timing, policy: Policy,
             lead: float, warmup: Warmup, activity: KernelActivity, env: dict,
             baseline_calls: int | None, run_id: str, display: list[dict]) -> dict:
    metrics = summarize([result.records])
    run_c = [j.wall_s for j in result.jobs]
    c_all = run_c or warmup.durations
    A = None  # noqa: N806
    if policy.name == "baseline":
        A = 1.0 if metrics.dit_calls else None  # noqa: N806
    elif baseline_calls:
        A = metrics.dit_calls / baseline_calls  # noqa: N806
    w = metrics.w
    wall = np.array([row["L_wall"] for row in display])
    lateness = np.array([row["t_display"] - row["t_play"] for row in display])
    measured_l = {
        "L_mean": float(wall.mean()) if wall.size else None,
        "L50": float(np.percentile(wall, 50)) if wall.size else None,
        "L95": float(np.percentile(wall, 95)) if wall.size else None,
        "L_mean_timeline": metrics.L_mean,
        "L50_timeline": metrics.L50,
        "L95_timeline": metrics.L95,
        "display_lateness_ms": _percentiles_ms(list(lateness)),
    }
    return {
        "run_id": run_id,
        "policy": policy.name,
        "K": timing.K,
        "q": policy.commit_unit(timing.K),
        "commit": policy.commit,
        "r": timing.r,
        "fps": timing.fps,
        "T": timing.T,
        "delta": timing.delta,
        "cost": f"live:{config.preset}@{config.resolution},steps={config.steps}",
        "C_mean": float(np.mean(c_all)),
        "C_p50": float(np.percentile(c_all, 50)),
        "C_p99": float(np.percentile(c_all, 99)),
        "C_warmup_mean": float(np.mean(warmup.durations)),
        "C_warmup_q99": warmup.q99,
        "lead": lead,
        "updates": f"trace:{config.trace}" if config.trace else f"poisson:{config.rate!r}",
        "duration": result.records.duration,
        "seed": config.seed,
        **metrics.as_dict(),
        **measured_l,  # L on the wall clock; the controller-timeline values beside it
        "A": A,
        "A_from_w": (1.0 / (1.0 - w)) if w is not None and w < 1 else None,
        "kernel_activity": activity.percent,
        "kernel_activity_note": activity.note,
        "kernel_activity_source": activity.source,
        "nvml_samples": activity.n_samples,
        "device": config.device,
        "device_name": env["device_name"],
        "preset": config.preset,
        "resolution": config.resolution,
        "steps": config.steps,
        "context": config.context,
        "decode": config.decode,
        "interrupted": result.interrupted,
        "stop_reason": result.stop_reason,
        "end_time": result.end_time,
        **{k: v for k, v in timing_diagnostics(result).items()},
    }


def _write_telemetry(run_dir: Path, result: DriverResult, warmup: Warmup,
                     sampler: NvmlSampler | None, K: int,  # noqa: N803
                     display: list[dict]) -> None:
    header = ["phase", "job_id", "kind", "K", "branch", "version", "context", "t_start",
              "t_end", "wall_s", "device_s", "decoded_latents", "decoded_frames",
              "controller_start"]
    rows = []
    for j in warmup.jobs:
        rows.append(["warmup", j.job_id, j.kind, j.K, j.branch, j.version, j.context, "", "",
                     j.wall_s, "" if j.device_s is None else j.device_s, j.decoded_latents,
                     j.decoded_frames, ""])
    for j in result.jobs:
        rows.append(["run", j.job_id, j.kind, j.K, j.branch, j.version, j.context, j.t_start,
                     j.t_end, j.wall_s, "" if j.device_s is None else j.device_s,
                     j.decoded_latents, j.decoded_frames, result.job_starts.get(j.job_id, "")])
    _write_rows(run_dir / "gen_jobs.csv", header, rows)
    columns = ["version", "t_arrival", "position", "t_play", "t_display", "L", "L_wall",
               "superseded"]
    _write_rows(run_dir / "display.csv", columns, [[row[c] for c in columns] for row in display])
    _write_rows(
        run_dir / "events.csv",
        ["kind", "position", "scheduled", "happened", "handled", "now", "decision_s"],
        [[e.kind, "" if e.position is None else e.position,
          "" if e.scheduled is None else float(e.scheduled), e.happened, e.handled, e.now,
          e.decision_s] for e in result.events],
    )
    if sampler is not None and sampler.samples:
        _write_rows(run_dir / "nvml_samples.csv", ["t_unix", "t_rel", "gpu_util_pct"],
                    [[s.t_unix, s.t_unix - result.t0_unix, s.percent]
                     for s in sampler.samples])
    refill = warmup.durations + [j.wall_s for j in result.jobs if j.kind == "refill"]
    replan = [j.wall_s for j in result.jobs if j.kind == "replan"]
    observed: dict[str, list[float]] = {"refill": [], "replan": []}
    for rec in result.records.jobs:
        if rec.job_id > 0:
            observed[rec.kind].append(rec.t_ready - rec.t_start)
    payload = {
        "costs": {str(K): {"refill": refill, "replan": replan}},
        "note": "generator wall time per job (s), warm-up jobs first under refill; "
                "controller_observed adds dispatch and hand-back delays (t_ready - t_start)",
        "warmup": warmup.durations,
        "controller_observed": {str(K): observed},
    }
    (run_dir / "cost_samples.json").write_text(json.dumps(clean(payload), indent=2) + "\n")


def print_stderr(line: str) -> None:
    """A progress sink that rewrites one stderr line."""
    sys.stderr.write("\r" + line[:160].ljust(100))
    sys.stderr.flush()
