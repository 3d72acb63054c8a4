"""What a measured run folder holds beyond the controller's records: the summary row and the
telemetry files (the format is :mod:`latsim.run.folder`, kind ``measured``)::

    gen_jobs.csv      the generator's own timing of every job (warm-up and run)
    display.csv       each displayed condition's latency on the wall clock
    events.csv        every event the controller handled: due, fired, handled, decision time
    nvml_samples.csv  raw GPU utilisation samples (when NVML is available)
    cost_samples.json every measured job duration, in latsim.model.costs.load_table's format

Every write goes through :func:`harness.live.recorder.writing`: a failure is a one-line error
naming the file. ``summary.json`` is written (atomically) before these files.
"""

from __future__ import annotations

import csv
import platform
from pathlib import Path

import numpy as np

from harness.live.driver import DriverResult
from harness.live.lead import Warmup
from harness.telemetry.nvml import NvmlSampler
from harness.telemetry.reduce import KernelActivity
from latsim.analysis.latency import WALL, latency_stats
from latsim.analysis.metrics import summarize, work_ratio
from latsim.controller import ControllerConfig
from latsim.model.lead import LIVE
from latsim.numeric import empirical_quantile
from latsim.run.folder import RunIdentity, summary_row, write_json
from latsim.run.stream import RunRecords
from latsim.writing import replacing, writing


def save_json(path: Path, payload: object) -> Path:
    """:func:`latsim.run.folder.write_json` (atomic), failing with the path in the error."""
    with writing(path):
        return write_json(path, payload)


def versions() -> dict:
    """Versions of everything that shapes a measurement (``None``: not installed; torch's
    CUDA version only where a generator has imported torch)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    import latsim

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    torch = sys.modules.get("torch")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else installed("torch"),
        "torch_cuda": torch.version.cuda if torch is not None else None,
        "diffusers": installed("diffusers"),
        "numpy": np.__version__,
        "latsim": getattr(latsim, "__version__", "0.1.0"),
        "platform": platform.platform(),
    }


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


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    arr = np.asarray(values) * 1e3
    return {"p50": empirical_quantile(arr, 0.50), "p99": empirical_quantile(arr, 0.99),
            "max": float(arr.max()), "n": int(arr.size)}


def timing_diagnostics(result: DriverResult) -> dict:
    """Timer lateness, handling delay and controller decision time of one run (ms)."""
    slot_fire = result.slot_lateness()
    slot_handle = [e.handled - e.scheduled for e in result.events
                   if e.kind == "slot_due" and e.scheduled is not None]
    timer_fire = [e.happened - e.scheduled for e in result.events if e.scheduled is not None]
    done_handle = [e.handled - e.happened for e in result.events if e.kind == "job_done"]
    decision = [e.decision_s for e in result.events]
    dispatch = result.dispatch_delays()
    return {
        "slot_start_lateness_ms": percentiles_ms(slot_fire),
        "slot_handle_lateness_ms": percentiles_ms(slot_handle),
        "timer_lateness_ms": percentiles_ms(timer_fire),
        "job_done_handle_delay_ms": percentiles_ms(done_handle),
        "job_dispatch_delay_ms": percentiles_ms(dispatch),
        "decision_ms": percentiles_ms(decision),
    }


def measured_summary(config: ControllerConfig, cost: str, updates: str, seed: int,
                     result: DriverResult, baseline: RunRecords | None, display: list[dict],
                     warmup: Warmup, activity: KernelActivity, **settings: object) -> dict:
    """The summary row of a measured run: the simulator's metrics, L on the wall clock (the
    controller-timeline values beside it), C statistics (the generator's wall time per job),
    A against ``baseline`` (the baseline's run on the same trace; ``None`` if it was not
    measured), kernel activity, ``settings`` (device, preset, ...) and timing diagnostics."""
    records = result.covered()
    metrics = summarize([records])
    run_c = [j.wall_s for j in result.jobs] or warmup.durations
    identity = RunIdentity.of(config, cost, float(np.mean(run_c)), updates,
                              result.records.duration, seed)
    wall = [row["L_wall"] for row in display]
    lateness = [row["t_display"] - row["t_play"] for row in display]
    A = work_ratio([records], [baseline])[0] if baseline is not None else None
    return summary_row(
        identity, metrics.as_dict(),
        # L on the wall clock; the controller-timeline values beside it
        **latency_stats(wall), L_basis=WALL,
        **{f"{key}_timeline": getattr(metrics, key)
           for key in ("L_mean", "L_mean_se", "L50", "L95", "L99")},
        display_lateness_ms=percentiles_ms(lateness),
        C_p50=empirical_quantile(run_c, 0.50), C_p99=empirical_quantile(run_c, 0.99),
        C_warmup_mean=float(np.mean(warmup.durations)),
        C_warmup_q99=LIVE.sample_quantile(warmup.durations),
        A=A,
        A_from_w=(1.0 / (1.0 - metrics.w)) if metrics.w is not None and metrics.w < 1 else None,
        kernel_activity=activity.percent,
        kernel_activity_note=activity.note,
        kernel_activity_source=activity.source,
        nvml_samples=activity.n_samples,
        kernel_activity_covered=activity.percent_covered,
        kernel_activity_gaps={"n": activity.n_gaps, "uncovered_s": activity.uncovered_s},
        kernel_activity_other_processes=activity.other_processes,
        kernel_activity_device=activity.device,
        **settings,
        metrics_window=("the window" if records is result.records else
                        f"partial: [0, {records.duration:.3f}] s covered of the "
                        f"{result.records.duration:g} s window"),
        status=result.status,
        interrupted=result.interrupted,
        stop_reason=result.stop_reason,
        end_time=result.end_time,
        **timing_diagnostics(result),
    )


def write_rows(path: Path, header: list[str], rows: list[list]) -> None:
    with replacing(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_telemetry(run_dir: Path, result: DriverResult, warmup: Warmup,
                    sampler: NvmlSampler | None, display: list[dict]) -> None:
    """The telemetry files of a measured run (see the module docstring)."""
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
    write_rows(run_dir / "gen_jobs.csv", header, rows)
    columns = ["version", "t_arrival", "position", "t_play", "t_display", "L", "L_wall",
               "superseded"]
    write_rows(run_dir / "display.csv", columns, [[row[c] for c in columns] for row in display])
    write_rows(
        run_dir / "events.csv",
        ["kind", "position", "scheduled", "happened", "handled", "now", "decision_s"],
        [[e.kind, "" if e.position is None else e.position,
          "" if e.scheduled is None else float(e.scheduled), e.happened, e.handled, e.now,
          e.decision_s] for e in result.events],
    )
    if sampler is not None and sampler.samples:
        write_rows(run_dir / "nvml_samples.csv", ["t_unix", "t_rel", "gpu_util_pct"],
                   [[s.t_unix, s.t_unix - result.t0_unix, s.percent]
                    for s in sampler.samples])
    refill = warmup.durations + [j.wall_s for j in result.jobs if j.kind == "refill"]
    replan = [j.wall_s for j in result.jobs if j.kind == "replan"]
    observed: dict[str, list[float]] = {"refill": [], "replan": []}
    for rec in result.records.jobs:
        if rec.job_id > 0:
            observed[rec.kind].append(rec.t_ready - rec.t_start)
    K = warmup.K
    save_json(run_dir / "cost_samples.json", {
        "costs": {str(K): {"refill": refill, "replan": replan}},
        "note": "generator wall time per job (s), warm-up jobs first under refill; "
                "controller_observed adds dispatch and hand-back delays (t_ready - t_start)",
        "warmup": warmup.durations,
        "controller_observed": {str(K): observed},
    })
