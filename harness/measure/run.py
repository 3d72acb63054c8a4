"""One live measurement: build the generator, warm up, set the lead, run each (K, policy).

:func:`measure` is what ``latsim measure`` calls. For every K it runs warm-up jobs and an
in-run calibration pass (:mod:`harness.measure.calibration`), sets the lead by
:data:`latsim.model.lead.LIVE` unless one is given, then drives one live run per policy on the
same trace and writes one run folder per run (:mod:`latsim.run.folder`, kind ``measured``):
the controller's record CSVs, appended while the run goes; ``trace.jsonl``; ``config.json``
(everything needed to re-run: versions, device, lead and its source, status); ``summary.json``
and the telemetry files of :mod:`harness.measure.folder`. Summary metrics come from
:func:`latsim.analysis.metrics.summarize` on the run's records, the same code as simulation.

**Interrupted and failed runs.** ``config.json`` says ``running`` until a run's files are
all written; ``summary.json`` is written (atomically) after the run and before the telemetry
files, so a folder a killed process leaves (SIGKILL, power loss) reads ``incomplete``
(:attr:`latsim.run.folder.RunFolder.status`). Ctrl-C or SIGTERM (handled alike for the
duration of :func:`measure`) end the current run, which is written and marked
``interrupted``, and raise :class:`~latsim.errors.Interrupted` saying what was kept and
where; in the warm-up or the in-run calibration pass they stop the measurement the same way.
A generator exception, or a job still running ``job_timeout`` after the controller started
it, marks the run ``failed`` (``stop_reason`` names the job and how long it ran) and stops
the measurement with a one-line :class:`~latsim.errors.LatsimError`: the generator is not
thread-safe, so no further run may share it with a thread that is still stuck in a job.
The default job timeout is :func:`harness.live.lead.default_job_timeout`,
``max(10 × lead, lead + 5 s)``. An unwritable ``--out`` fails before the model is built,
and every file write names its path when it fails (``cannot write PATH: REASON``).

**Bounds.** Every option has a range (:data:`latsim.errors.OPTION_BOUNDS`; a one-line error
names the option and the range) and the work is bounded: at most 16 values of ``--K``, a
window of at most 1 h per run and 6 h over all runs.

**Fault injection.** ``LATSIM_FAULT`` makes jobs raise, stall, run slow or send a signal on
purpose (syntax in :mod:`harness.live.faults`; e.g. ``LATSIM_FAULT=stall@2:60``), so the
paths above are tested in CI on the tiny preset.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.generators.device import require_device
from harness.live.driver import (
    KEYBOARD_INTERRUPT,
    SIGTERM,
    DriverConfig,
    DriverResult,
    LiveDriver,
    Terminated,
    sigterm_as_interrupt,
)
from harness.live.executor import GeneratorExecutor
from harness.live.faults import faults_from_env
from harness.live.lead import Calibration, LeadChoice, Warmup, choose_lead, default_job_timeout
from harness.live.recorder import RecordWriter
from harness.measure.calibration import calibrate
from harness.measure.folder import (
    measured_summary,
    save_json,
    versions,
    wall_latencies,
    write_telemetry,
)
from harness.telemetry.nvml import NvmlSampler
from harness.telemetry.reduce import unavailable
from latsim.controller import ControllerConfig
from latsim.controller.policies import PRESETS, Policy
from latsim.controller.records import RECORD_TYPES
from latsim.controller.timing import Timing
from latsim.errors import (
    MAX_LIVE_WINDOW_S,
    OPTION_BOUNDS,
    Interrupted,
    LatsimError,
    check_number,
    check_option,
)
from latsim.model.arrivals import PoissonArrivals
from latsim.model.lead import LIVE, LeadRule
from latsim.model.traces import Trace, load_trace, write_trace
from latsim.plugins import GeneratorConfig, GeneratorInfo, LiveGenerator, build_generator
from latsim.run.files import check_writable
from latsim.run.folder import claim_folder, of_kind, run_config
from latsim.writing import writing

#: Default results folder when ``--out`` is not given (one folder per run inside).
RESULTS_RUNS = Path("results/runs")


#: At most this many values of ``--K`` in one command.
MAX_KS = 16
#: The window over all runs of one measurement (runs x duration), seconds.
MAX_TOTAL_WINDOW_S = 6 * 3600.0


def check_ks(Ks: tuple[int, ...]) -> None:
    if not Ks:
        raise LatsimError("give at least one --K")
    if len(Ks) > MAX_KS:
        raise LatsimError(f"--K takes at most {MAX_KS} values, got {len(Ks)}")
    for K in Ks:
        check_option("--K", K)


@dataclass(frozen=True)
class MeasureConfig:
    """Everything ``latsim measure`` needs; ``None`` means the documented default."""

    generator: str = "wan"  # a registered live generator (latsim plugins)
    preset: str | None = None  # the generator's own preset names; None: its default
    resolution: str | None = None
    Ks: tuple[int, ...] = (4,)
    steps: int = 4
    policies: tuple[str, ...] = ("baseline", "speculative")
    trace: str | None = None  # JSONL trace; None: a seeded Poisson trace at ``rate``
    rate: float = 0.1  # conditions per second when no trace is given
    duration: float | None = None  # default: the trace header's, else 60 s
    device: str = "cpu"
    out: str | None = None  # parent folder of the run folders
    lead: float | None = None  # default: latsim.model.lead.LIVE on warm-up/calibration jobs
    r: int | None = None  # default: what the generator's model implies, else 4
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
    # a job still running this long after it started has hung: the run fails and the
    # measurement stops; default max(10 x lead, lead + 5 s) (harness.live.lead.default_job_timeout)
    job_timeout: float | None = None
    cost: str | None = None  # the sleep generator's job time (a cost spec)
    generator_options: tuple[tuple[str, str], ...] = ()  # --generator-option KEY=VALUE

    def __post_init__(self) -> None:
        check_ks(self.Ks)
        for option, value in (
            ("--steps", self.steps), ("--rate", self.rate),
            ("--lead", self.lead), ("--job-timeout", self.job_timeout), ("--r", self.r),
            ("--fps", self.fps), ("--seed", self.seed), ("--context", self.context),
            ("--warmup", self.warmup_timed), ("--warmup-untimed", self.warmup_untimed),
            ("--warmup-gap", self.warmup_gap_s), ("--calibrate", self.calibration_jobs),
            ("--calibrate-max", self.calibration_max_s), ("--drain", self.drain),
            ("--threads", self.threads),
        ):
            check_option(option, value)
        if self.duration is not None:
            check_number("--duration", self.duration, 0, MAX_LIVE_WINDOW_S, positive=True,
                         unit="s")
        for K in self.Ks:
            Timing(K, self.r or 4, self.fps)
        if not self.policies:
            raise LatsimError("give at least one --policy")
        for name in self.policies:
            if name not in PRESETS:
                raise LatsimError(f"unknown policy {name!r}; choose baseline or speculative")

    def generator_config(self) -> GeneratorConfig:
        return GeneratorConfig(self.preset, self.resolution, self.steps, self.context,
                               self.decode, self.device, self.seed, self.threads, self.cost,
                               self.generator_options)


@dataclass(frozen=True)
class RunResult:
    """One (K, policy) run: its folder, summary row and the driver's result."""

    run_dir: Path
    summary: dict
    driver: DriverResult = field(repr=False)


@dataclass(frozen=True)
class _Measurement:
    """What every run of one measurement shares."""

    config: MeasureConfig
    generator: LiveGenerator
    info: GeneratorInfo
    r: int  # pixel frames per latent frame of every run
    trace: Trace
    duration: float
    env: dict
    #: ``progress(line, done_s, total_s)``: a status line, and the live seconds run of all
    progress: Callable[..., None] | None
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
    index: int = 0  # runs of the measurement before this one

    @property
    def decode_group(self) -> int:
        return self.warmup.decode_group


def load_or_make_trace(config: MeasureConfig) -> tuple[Trace, float]:
    """The trace to replay and the window length."""
    return trace_and_window(config.trace, config.rate, config.duration, config.seed,
                            config.r or 4, config.fps)


def trace_and_window(path: str | Path | None, rate: float, duration: float | None, seed: int,
                     r: int, fps: float) -> tuple[Trace, float]:
    """The trace file at ``path``, else a seeded Poisson trace at ``rate``; and the window
    (``duration``, else the trace header's, else 60 s)."""
    if path is not None:
        trace = load_trace(path)
        return trace, float(duration or trace.duration or 60.0)
    window = float(duration or 60.0)
    drawn = PoissonArrivals(rate).trace(seed, np.random.default_rng(seed), window,
                                        Timing(1, r, fps))
    meta = {"duration": window, "generator": f"poisson:{rate!r}", "seed": seed}
    return Trace(drawn.name, drawn.times, window, meta), window


def _warm_up(session: _Measurement, timing: Timing, policies: list[Policy]) -> dict[int, Warmup]:
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


def _lead(session: _Measurement, timing: Timing, warmups: dict[int, Warmup]
          ) -> tuple[LeadChoice, dict[int, Warmup]]:
    """``--lead``, or the rule on warm-up jobs, raised by the in-run calibration pass (which
    also measures the jitter that sets the margin)."""
    config = session.config
    if config.lead is not None:
        return LeadChoice(config.lead, "--lead"), warmups
    rule = config.lead_rule
    first = choose_lead(rule, list(warmups.values()))
    samples = {
        group: calibrate(session.generator, timing, first.lead, config.calibration_jobs,
                         config.calibration_max_s, max(group, 1) if config.decode else 0,
                         config.drain, config.job_timeout)
        for group in warmups
    }
    warmups = {g: replace(w, calibration=samples[g].durations) for g, w in warmups.items()}
    measured = Calibration.merge(list(samples.values()))
    return choose_lead(rule, list(warmups.values()), measured), warmups


@dataclass
class _Kept:
    """What a measurement has written so far, for the message when it stops early."""

    root: Path
    folders: list[Path] = field(default_factory=list)  # finished run folders
    stage: str = "start-up"  # what was going on
    current: Path | None = None  # the run folder being written
    partial: bool = False  # the last kept folder is an interrupted run

    def message(self, reason: str) -> str:
        """``kept N run folders under DIR (...)``: what was kept and where."""
        by = "Ctrl-C" if reason == KEYBOARD_INTERRUPT else reason
        n = len(self.folders)
        kept = f"kept {n} run folder{'s' if n != 1 else ''} under {self.root}"
        if self.current is not None:  # stopped while its files were being written
            return (f"{kept} and left {self.current.name} incomplete (stopped by {by} "
                    f"while writing it)")
        if n and self.partial:
            return f"{kept} (the last one partial: {self.folders[-1].name}; stopped by {by})"
        if not n:
            return (f"kept nothing (no run folder under {self.root}): stopped by {by} "
                    f"in {self.stage}")
        return f"{kept}; stopped by {by} in {self.stage} (nothing of it kept)"


def _stop_reason_of(exc: BaseException) -> str:
    if isinstance(exc, Terminated):
        return SIGTERM
    return getattr(exc, "stop_reason", None) or KEYBOARD_INTERRUPT


def measure(
    config: MeasureConfig,
    progress: Callable[..., None] | None = None,
    generator: LiveGenerator | None = None,
    on_driver: Callable[[LiveDriver], None] | None = None,
) -> list[RunResult]:
    """Run every (K, policy) of ``config`` live; returns one result per run folder.

    ``progress(line, done_s, total_s)`` receives a one-line status about twice a second,
    with the live seconds run so far and in all (every run's window). ``on_driver`` sees each
    driver before it runs (tests use it to stop a run early). Ctrl-C or SIGTERM end the
    current run, write what it measured (marked interrupted) and raise
    :class:`~latsim.errors.Interrupted` saying what was kept and where; a failed run (a
    generator error, a hung job, a failed write) raises :class:`LatsimError` after its
    folder is written. Input, ``LATSIM_FAULT`` and the output folder are checked before any
    work.
    """
    faults_from_env()  # a malformed LATSIM_FAULT fails before any work
    require_device(config.device)
    trace, duration = load_or_make_trace(config)
    check_number("--duration", duration, 0, MAX_LIVE_WINDOW_S, positive=True, unit="s")
    policies = [PRESETS[name] for name in config.policies]
    _check_runs(config, config.r or 4, trace, duration, policies)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = Path(config.out) if config.out is not None else RESULTS_RUNS
    prefix = "" if config.out is not None else f"{stamp}-{config.preset or config.generator}-"
    _claim(root, prefix, config.Ks, policies)  # never over another's files
    check_writable(root, keep=True)  # before the model is built, warmed up and calibrated

    kept = _Kept(root)
    results: list[RunResult] = []
    try:
        with sigterm_as_interrupt():
            kept.stage = "start-up (building the model)"
            if generator is None:
                generator = build_generator(config.generator, config.generator_config())
            info = generator.describe()
            r = run_r(config.r, info)
            if r != (config.r or 4):  # the generator's r: check the windows at it
                _check_runs(config, r, trace, duration, policies)
            timings = {K: Timing(K, r, config.fps) for K in config.Ks}
            env = {"versions": versions(), "device_name": info.device_name,
                   "torch_threads": info.threads, "n_params": info.parameters.get("n_params"),
                   "generator": info.as_dict()}
            session = _Measurement(config, generator, info, r, trace, duration, env, progress,
                               on_driver)
            _measure_all(session, timings, policies, root, prefix, kept, results)
    except KeyboardInterrupt as exc:
        _write_index(root, config, results, interrupted=True, quiet=True)
        raise Interrupted(kept.message(_stop_reason_of(exc))) from None
    except LatsimError:
        _write_index(root, config, results, interrupted=True, quiet=True)
        raise
    _write_index(root, config, results, interrupted=False)
    return results


#: What a measured run folder's own files are called: those a later run into it replaces.
MEASURED_FILES = ("config.json", "summary.json", "trace.jsonl", "cost_samples.json",
                  *(f"{table}.csv" for table in (*RECORD_TYPES, "gen_jobs", "display",
                                                 "events", "nvml_samples")))


def _claim(root: Path, prefix: str, Ks: Iterable[int], policies: list[Policy]) -> None:
    """Refuse, before any work, a ``--out`` whose ``measure.json`` or run folders another
    command wrote (:func:`latsim.run.folder.claim_folder`)."""
    claim_folder(root, ("measure.json",), "measure.json", "latsim measure",
                 lambda index: {"config", "runs"} <= index.keys())  # _write_index's
    for K in Ks:
        for policy in policies:
            claim_folder(root / f"{prefix}K{K}-{policy.name}", MEASURED_FILES, "config.json",
                         "latsim measure", of_kind("measured"))


def run_r(given: int | None, info: GeneratorInfo) -> int:
    """Pixel frames per latent frame: ``--r`` if given, else the generator's (else 4); a
    one-line error if ``--r`` contradicts the generator's model."""
    if given is not None and info.r is not None and given != info.r:
        raise LatsimError(f"--r {given}, but generator {info.name}'s model makes {info.r} "
                          f"pixel frames per latent frame; drop --r or give --r {info.r}")
    return given or info.r or 4


def _check_runs(config: MeasureConfig, r: int, trace: Trace, duration: float,
                policies: list[Policy]) -> None:
    """Every run's window, commit unit and work, at ``r`` pixel frames per latent frame."""
    timings = [Timing(K, r, config.fps) for K in config.Ks]
    for timing in timings:
        for policy in policies:  # validates the window and q against K before any work
            ControllerConfig(timing, policy, 0.0)
        if duration < timing.T:
            raise LatsimError(f"duration {duration:g} s is shorter than one chunk "
                              f"(K={timing.K}: T = {timing.T:g} s)")
    n_conditions = sum(1 for t in trace.times if t < duration)
    most = OPTION_BOUNDS["--rate"].high
    if n_conditions > most * duration:
        raise LatsimError(f"--trace {config.trace}: {n_conditions} conditions in {duration:g} s, "
                          f"more than {most:g} per second")
    n_runs = len(timings) * len(policies)
    if n_runs * duration > MAX_TOTAL_WINDOW_S:
        raise LatsimError(f"{n_runs} runs of {duration:g} s exceed the "
                          f"{MAX_TOTAL_WINDOW_S / 3600:g} h a measurement may take; "
                          "use fewer --K values or a shorter --duration")
    if config.cost is not None:  # a generator whose job time a spec gives: its warm-up too
        from latsim.plugins import load_cost

        cost = load_cost(config.cost)
        jobs = config.warmup_untimed + config.warmup_timed + config.calibration_jobs
        warm = sum(jobs * (cost.mean(t.K) + (config.warmup_gap_s or min(t.T / 2, 0.5)))
                   for t in timings)
        if n_runs * duration + warm > MAX_TOTAL_WINDOW_S:
            raise LatsimError(f"the warm-up and calibration ({jobs} jobs of C = "
                              f"{config.cost} per K, about {warm / 3600:.3g} h) and {n_runs} "
                              f"run(s) of {duration:g} s exceed the "
                              f"{MAX_TOTAL_WINDOW_S / 3600:g} h a measurement may take; use "
                              "a smaller --warmup or --calibrate, or fewer --K values")


def _measure_all(session: _Measurement, timings: dict[int, Timing], policies: list[Policy],
                 root: Path, prefix: str, kept: _Kept, results: list[RunResult]) -> None:
    config = session.config
    for K, timing in timings.items():
        kept.stage = f"the warm-up of K={K}"
        warmups = _warm_up(session, timing, policies)
        kept.stage = f"the in-run calibration of K={K}"
        lead, warmups = _lead(session, timing, warmups)
        baseline: DriverResult | None = None
        for policy in policies:
            group = policy.commit_unit(K) if config.decode else 0
            run_dir = root / f"{prefix}K{K}-{policy.name}"
            kept.stage, kept.current = f"run {run_dir.name}", run_dir
            result = _run_one(session, _RunPlan(timing, policy, lead, warmups[group], run_dir,
                                                baseline, len(results)))
            kept.current = None
            kept.folders.append(run_dir)
            results.append(result)
            driver = result.driver
            if policy.name == "baseline":
                baseline = driver
            if driver.stopped_by_user:
                kept.partial = True
                stop = KeyboardInterrupt(driver.stop_reason)
                stop.stop_reason = driver.stop_reason  # type: ignore[attr-defined]
                raise stop
            if driver.failed:
                stuck = (" Its generator thread is still running, so no further run may "
                         "share the generator (it is not thread-safe)."
                         if driver.worker_alive else "")
                n = len(kept.folders)
                raise LatsimError(
                    f"{run_dir.name} failed: {driver.stop_reason}.{stuck} Stopped the "
                    f"measurement; kept {n} run folder{'s' if n != 1 else ''} under {root} "
                    f"(the last one marked failed)")


def _write_index(root: Path, config: MeasureConfig, results: list[RunResult],
                 interrupted: bool, quiet: bool = False) -> None:
    """``measure.json`` (with ``--out``); ``quiet``: a failure to write it is ignored (the
    measurement is already failing with a better error)."""
    if config.out is None:
        return
    index = {"config": asdict(config), "interrupted": interrupted,
             "runs": [{"run_dir": str(r.run_dir), **r.summary} for r in results]}
    try:
        save_json(root / "measure.json", index)
    except LatsimError:
        if not quiet:
            raise


def _run_one(session: _Measurement, plan: _RunPlan) -> RunResult:
    config, timing, policy = session.config, plan.timing, plan.policy
    K, run_dir, run_id = timing.K, plan.run_dir, plan.run_dir.name
    duration = session.duration
    ctrl_config = ControllerConfig(timing, policy, plan.lead.lead)
    job_timeout = (config.job_timeout if config.job_timeout is not None
                   else default_job_timeout(plan.lead.lead))
    driver_config = DriverConfig(duration, config.drain, job_timeout_s=job_timeout)
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
    trace_times = [t for t in session.trace.times if t < duration]
    with writing(run_dir / "trace.jsonl"):
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
        lead_jitter_s=plan.lead.jitter_s,
        warmup_durations=plan.warmup.durations,
        calibration_durations=list(plan.warmup.calibration),
        decode_group=plan.decode_group,
        device=config.device, **session.env,
        switch_interval_s=driver_config.switch_interval_s,
        spin_s=driver_config.spin_s,
        job_timeout_s=job_timeout,
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    save_json(run_dir / "config.json", conf)

    writer = RecordWriter(run_dir, (("policy", policy.name), ("K", K), ("run", 0)))
    writer.start()
    sampler = NvmlSampler() if config.device == "cuda" else None
    if sampler is not None:
        sampler.start()
    session.generator.reset_stream(K)
    line = _progress_line(run_id, duration)
    progress = session.progress
    before = plan.index * duration
    total = len(session.config.Ks) * len(session.config.policies) * duration

    def report(t: float, ctrl) -> None:  # the driver's controller
        progress(line(t, ctrl), before + min(t, duration), total)  # type: ignore[misc]

    driver = LiveDriver(
        ctrl_config, GeneratorExecutor(session.generator, plan.decode_group, run_id),
        Trace(session.trace.name, tuple(trace_times), duration),
        driver_config, on_record=writer, progress=report if progress else None,
    )
    writer.on_error = driver.fail  # records that cannot be written fail the run
    if session.on_driver is not None:
        session.on_driver(driver)
    try:
        result = driver.run()
    finally:
        writer.close()
        if sampler is not None:
            sampler.stop()
    if writer.error is not None and not result.failed:  # failed in the last flush
        result = replace(result, failed=True, stop_reason=writer.error)
    if progress is not None:
        report(result.end_time, result.controller)

    if sampler is not None:
        activity = sampler.activity(result.t0_unix,
                                    result.t0_unix + min(duration, result.end_time))
    else:
        activity = unavailable(
            "device is cpu: NVML measures GPU kernels; generator busy % is busy_pct"
        )
    display = wall_latencies(result)
    summary = measured_summary(
        ctrl_config, f"live:{session.info.label}",
        f"trace:{config.trace}" if config.trace else f"poisson:{config.rate!r}", config.seed,
        result, result.records if policy.name == "baseline" else (
            None if plan.baseline is None else plan.baseline.records), display,
        plan.warmup, activity,
        run_id=run_id, device=config.device, device_name=session.env["device_name"],
        generator=session.info.name, preset=session.info.parameters.get("preset"),
        resolution=session.info.parameters.get("resolution"), steps=config.steps,
        context=config.context, decode=config.decode,
    )
    # the summary first: small and essential; then the telemetry files; config.json says
    # "running" until all of them are written
    save_json(run_dir / "summary.json", summary)
    write_telemetry(run_dir, result, plan.warmup, sampler, display)
    save_json(run_dir / "config.json", {
        **conf, "status": result.status, "interrupted": result.interrupted,
        "stop_reason": result.stop_reason, "end_time": result.end_time,
    })
    return RunResult(run_dir, summary, result)


def command_line(config: MeasureConfig, K: int, policy: str,
                  lead: float | None) -> str:
    parts = ["latsim measure", f"--generator {config.generator}"]
    parts += [f"--{name} {value}" for name, value in (
        ("preset", config.preset), ("resolution", config.resolution), ("cost", config.cost),
        ("r", config.r)) if value is not None]
    parts += [f"--generator-option {key}={value}" for key, value in config.generator_options]
    parts += [f"--K {K}", f"--steps {config.steps}", f"--policy {policy}",
             f"--device {config.device}", f"--fps {config.fps:g}",
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
    if config.job_timeout is not None:
        parts.append(f"--job-timeout {config.job_timeout!r}")
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
