"""One live measurement: build the generator, warm up, set the lead, run each (K, policy).

:func:`measure` is what ``latsim measure`` calls. For every K it runs warm-up jobs and an
in-run calibration pass (:mod:`harness.calibration`), sets the lead by
:data:`latsim.model.lead.LIVE` unless one is given, then drives one live run per policy on the
same trace and writes one run folder per run (:mod:`latsim.run.folder`, kind ``measured``):
the controller's record CSVs, appended while the run goes; ``trace.jsonl``; ``config.json``
(everything needed to re-run: versions, device, lead and its source, status); ``summary.json``
and the telemetry files of :mod:`harness.measured`. Summary metrics come from
:func:`latsim.analysis.metrics.summarize` on the run's records, the same code as simulation.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.calibration import GeneratorExecutor, LeadChoice, Warmup, calibrate, choose_lead
from harness.driver import DriverConfig, DriverResult, LiveDriver
from harness.generator import GeneratorConfig, WanGenerator, device_name, require_device
from harness.measured import measured_summary, versions, wall_latencies, write_telemetry
from harness.presets import model_preset, resolution
from harness.recorder import RecordWriter
from harness.telemetry import NvmlSampler, unavailable
from latsim.controller import ControllerConfig
from latsim.controller.policies import PRESETS, Policy
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.arrivals import PoissonArrivals
from latsim.model.lead import LIVE, LeadRule
from latsim.model.traces import Trace, load_trace, write_trace
from latsim.run.folder import run_config, write_json

#: Default results folder when ``--out`` is not given (one folder per run inside).
RESULTS_RUNS = Path("results/runs")


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
    lead: float | None = None  # default: latsim.model.lead.LIVE on warm-up/calibration jobs
    r: int = 4
    fps: float = 16.0
    seed: int = 0
    decode: bool = False
    context: int = 0
    warmup_untimed: int = 2
    warmup_timed: int = 10
    warmup_gap_s: float | None = None  # idle before each timed warm-up job; default min(T/2, .5)
    lead_rule: LeadRule = LIVE
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
class _Session:
    """What every run of one measurement shares."""

    config: MeasureConfig
    generator: WanGenerator
    trace: Trace
    duration: float
    env: dict
    progress: Callable[[str], None] | None
    on_driver: Callable[[LiveDriver], None] | None


@dataclass(frozen=True)
class _RunPlan:
    """One (K, policy) run of a session."""

    timing: Timing
    policy: Policy
    lead: LeadChoice
    warmup: Warmup
    run_dir: Path
    baseline: DriverResult | None  # the baseline's run of the same K, for A

    @property
    def decode_group(self) -> int:
        return self.warmup.decode_group


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


def _warm_up(session: _Session, timing: Timing, policies: list[Policy]) -> dict[int, Warmup]:
    """Warm-up jobs per decode group (the commit unit when decoding, else 0)."""
    config = session.config
    warmups: dict[int, Warmup] = {}
    for policy in policies:
        group = policy.commit_unit(timing.K) if config.decode else 0
        if group not in warmups:
            gap = (config.warmup_gap_s if config.warmup_gap_s is not None
                   else min(timing.T / 2, 0.5))
            jobs = session.generator.warmup(timing.K, config.warmup_untimed,
                                            config.warmup_timed, max(group, 1), gap)
            warmups[group] = Warmup(timing.K, group, tuple(jobs))
    return warmups


def _lead(session: _Session, timing: Timing, warmups: dict[int, Warmup]
          ) -> tuple[LeadChoice, dict[int, Warmup]]:
    """``--lead``, or the rule on warm-up jobs, raised by the in-run calibration pass."""
    config = session.config
    if config.lead is not None:
        return LeadChoice(config.lead, "--lead"), warmups
    rule = config.lead_rule
    first = choose_lead(rule, list(warmups.values()), ())
    samples = {
        group: calibrate(session.generator, timing, first.lead, config.calibration_jobs,
                         config.calibration_max_s, max(group, 1) if config.decode else 0,
                         config.drain)
        for group in warmups
    }
    warmups = {g: replace(w, calibration=tuple(samples[g])) for g, w in warmups.items()}
    measured = [c for values in samples.values() for c in values]
    return choose_lead(rule, list(warmups.values()), measured), warmups


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
    policies = [PRESETS[name] for name in config.policies]
    for timing in timings.values():
        for policy in policies:  # validates the window and q against K before any work
            ControllerConfig(timing, policy, 0.0)
        if duration < timing.T:
            raise LatsimError(f"duration {duration:g} s is shorter than one chunk "
                              f"(K={timing.K}: T = {timing.T:g} s)")
    if generator is None:
        generator = WanGenerator(config.generator_config())
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = Path(config.out) if config.out is not None else RESULTS_RUNS
    prefix = "" if config.out is not None else f"{stamp}-{config.preset}-"
    root.mkdir(parents=True, exist_ok=True)
    env = {"versions": versions(), "device_name": device_name(config.device),
           "torch_threads": generator.threads, "n_params": generator.n_params}
    session = _Session(config, generator, trace, duration, env, progress, on_driver)

    results: list[RunResult] = []
    for K, timing in timings.items():  # noqa: N806
        lead, warmups = _lead(session, timing, _warm_up(session, timing, policies))
        baseline: DriverResult | None = None
        for policy in policies:
            group = policy.commit_unit(K) if config.decode else 0
            run_dir = root / f"{prefix}K{K}-{policy.name}"
            result = _run_one(session, _RunPlan(timing, policy, lead, warmups[group], run_dir,
                                                baseline))
            results.append(result)
            if policy.name == "baseline":
                baseline = result.driver
            if result.driver.stop_reason == "KeyboardInterrupt":
                _write_index(root, config, results, interrupted=True)
                raise KeyboardInterrupt
            if result.driver.errors:
                _write_index(root, config, results, interrupted=True)
                raise LatsimError(f"{run_dir.name}: {result.driver.errors[0]}")
    _write_index(root, config, results, interrupted=False)
    return results


def _write_index(root: Path, config: MeasureConfig, results: list[RunResult],
                 interrupted: bool) -> None:
    if config.out is None:
        return
    index = {"config": asdict(config), "interrupted": interrupted,
             "runs": [{"run_dir": str(r.run_dir), **r.summary} for r in results]}
    write_json(root / "measure.json", index)


def _run_one(session: _Session, plan: _RunPlan) -> RunResult:
    config, timing, policy = session.config, plan.timing, plan.policy
    K, run_dir, run_id = timing.K, plan.run_dir, plan.run_dir.name  # noqa: N806
    duration = session.duration
    ctrl_config = ControllerConfig(timing, policy, plan.lead.lead)
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_times = [t for t in session.trace.times if t < duration]
    write_trace(run_dir / "trace.jsonl", trace_times,
                {**session.trace.meta, "duration": duration,
                 "source": config.trace or session.trace.name})
    conf = run_config(
        ctrl_config, duration, "measured",
        run_id=run_id,
        command=command_line(config, K, policy.name, config.lead),
        measure_config=asdict(config),
        trace_path=config.trace, trace_name=session.trace.name,
        n_trace_conditions=len(trace_times),
        lead_source=plan.lead.source,
        warmup_durations=plan.warmup.durations,
        calibration_durations=list(plan.warmup.calibration),
        decode_group=plan.decode_group,
        device=config.device, **session.env,
        switch_interval_s=DriverConfig(duration).switch_interval_s,
        spin_s=DriverConfig(duration).spin_s,
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    write_json(run_dir / "config.json", conf)

    writer = RecordWriter(run_dir, (("policy", policy.name), ("K", K), ("run", 0)))
    writer.start()
    sampler = NvmlSampler() if config.device == "cuda" else None
    if sampler is not None:
        sampler.start()
    session.generator.reset_stream(K)
    line = _progress_line(run_id, duration)
    progress = session.progress
    driver = LiveDriver(
        ctrl_config, GeneratorExecutor(session.generator, plan.decode_group),
        Trace(session.trace.name, tuple(trace_times), duration),
        DriverConfig(duration, config.drain), on_record=writer,
        progress=(lambda t, ctrl: progress(line(t, ctrl))) if progress else None,
    )
    if session.on_driver is not None:
        session.on_driver(driver)
    try:
        result = driver.run()
    finally:
        writer.close()
        if sampler is not None:
            sampler.stop()
    if progress is not None:
        progress(line(result.end_time, result.controller))

    if sampler is not None:
        activity = sampler.activity(result.t0_unix,
                                    result.t0_unix + min(duration, result.end_time))
    else:
        activity = unavailable(
            "device is cpu: NVML measures GPU kernels; generator busy % is busy_pct"
        )
    display = wall_latencies(result)
    summary = measured_summary(
        ctrl_config, f"live:{config.preset}@{config.resolution},steps={config.steps}",
        f"trace:{config.trace}" if config.trace else f"poisson:{config.rate!r}", config.seed,
        result, result.records if policy.name == "baseline" else (
            None if plan.baseline is None else plan.baseline.records), display,
        plan.warmup, activity,
        run_id=run_id, device=config.device, device_name=session.env["device_name"],
        preset=config.preset, resolution=config.resolution, steps=config.steps,
        context=config.context, decode=config.decode,
    )
    # the summary first: small and essential; then the telemetry files
    write_json(run_dir / "summary.json", summary)
    write_telemetry(run_dir, result, plan.warmup, sampler, display)
    write_json(run_dir / "config.json", {
        **conf, "status": result.records.status, "interrupted": result.interrupted,
        "stop_reason": result.stop_reason, "end_time": result.end_time,
    })
    return RunResult(run_dir, summary, result)


def command_line(config: MeasureConfig, K: int, policy: str,  # noqa: N803
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
