"""Live harness on CPU with the tiny preset: both policies on one trace, interruption.

Each live run is a few wall-clock seconds (K=4, r=4, 16 fps: delta = 0.25 s, T = 1 s;
C of the tiny model is a few tens of ms, well under T).
"""

from __future__ import annotations

import _thread
import csv
import json
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import latsim.controller
from latsim.model.traces import write_trace

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from harness.driver import LiveDriver  # noqa: E402
from harness.generator import GeneratorConfig, WanGenerator  # noqa: E402
from harness.run import MeasureConfig, measure  # noqa: E402

SUMMARY_KEYS = {
    "policy", "K", "T", "delta", "C_mean", "lead", "L_mean", "L50", "L95", "R_mean",
    "C_obs_mean", "Q_mean", "stall_pct", "busy_pct", "w", "A", "dit_calls", "n_conditions",
    "kernel_activity", "kernel_activity_note", "device",
}
TIMES = [0.6, 1.45, 2.3, 3.1, 3.9, 4.65, 5.5, 6.35]
DURATION = 7.5
STEPS = 8


@pytest.fixture(scope="module")
def generator() -> WanGenerator:
    return WanGenerator(GeneratorConfig("tiny", "tiny", steps=STEPS))


def _config(tmp: Path, trace: Path, **kw) -> MeasureConfig:
    base = dict(preset="tiny", resolution="tiny", Ks=(4,), steps=STEPS,
                policies=("baseline", "speculative"), trace=str(trace), duration=DURATION,
                out=str(tmp / "runs"), r=4, fps=16.0, warmup_timed=5, warmup_gap_s=0.1,
                calibration_jobs=2)
    base.update(kw)
    return MeasureConfig(**base)


@pytest.fixture(scope="module")
def both(generator, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    trace = tmp / "trace.jsonl"
    write_trace(trace, TIMES, {"duration": DURATION})
    drivers: list[LiveDriver] = []
    results = measure(_config(tmp, trace), generator=generator, on_driver=drivers.append)
    return results, drivers


def test_one_run_folder_per_policy_with_the_contract_files(both):
    results, _ = both
    assert [r.summary["policy"] for r in results] == ["baseline", "speculative"]
    for res in results:
        for name in ("conditions.csv", "jobs.csv", "slots.csv", "stalls.csv", "discards.csv",
                     "gen_jobs.csv", "events.csv", "trace.jsonl", "cost_samples.json",
                     "config.json", "summary.json"):
            assert (res.run_dir / name).is_file(), name
        summary = json.loads((res.run_dir / "summary.json").read_text())
        assert SUMMARY_KEYS <= summary.keys()
        assert summary["kernel_activity"] is None and "cpu" in summary["kernel_activity_note"]
        assert summary["stall_pct"] is not None and summary["busy_pct"] > 0
        assert summary["interrupted"] is False
        config = json.loads((res.run_dir / "config.json").read_text())
        assert config["status"] == "complete" and config["lead"] == summary["lead"]
        assert {"torch", "diffusers"} <= config["versions"].keys()
        assert config["trace_path"].endswith("trace.jsonl") and config["device_name"]
        assert len(config["warmup_durations"]) == 5
        assert len(config["calibration_durations"]) >= 1  # the in-run calibration pass ran


def test_records_are_complete_and_every_latency_covers_its_job(both):
    results, _ = both
    for res in results:
        conditions = pd.read_csv(res.run_dir / "conditions.csv")
        assert list(conditions.columns[:3]) == ["policy", "K", "run"]
        assert sorted(conditions.version) == list(range(1, len(TIMES) + 1))
        # none left open at the end: each shown as itself, or overtaken (superseded) by a
        # newer version that was shown; the summary counts agree with the records
        assert conditions.displayed.all()
        summary = res.summary
        assert summary["n_censored"] == 0
        assert summary["n_displayed"] + summary["n_superseded"] == len(TIMES)
        assert summary["n_superseded"] == int(conditions.superseded.sum())
        gen = pd.read_csv(res.run_dir / "gen_jobs.csv")
        measured = gen[gen.phase == "run"].set_index("job_id").wall_s
        shown = conditions[conditions.displayed]
        for row in shown.itertuples():
            assert row.L >= measured[row.job_id] - 1e-9
            assert row.L >= row.C >= measured[row.job_id] - 1e-9
        assert res.summary["n_conditions"] == len(TIMES)
        # wall-clock latency adds the player's own delay to the controller's timeline
        display = pd.read_csv(res.run_dir / "display.csv")
        assert len(display) == len(conditions)
        delay = display.L_wall - display.L
        assert (delay >= -1e-9).all() and (delay < 0.1).all()
        assert summary["L50"] == pytest.approx(float(np.percentile(display.L_wall, 50)))
        assert summary["L50_timeline"] == pytest.approx(float(np.percentile(display.L, 50)))


def test_speculative_responds_faster_than_baseline_when_c_is_well_under_t(both):
    results, _ = both
    base, spec = (r.summary for r in results)
    assert base["C_mean"] < 0.25 * base["T"]
    assert spec["L50"] < base["L50"]
    assert spec["A"] is not None and spec["A"] >= 1.0 and base["A"] == 1.0


def test_the_harness_drives_latsims_controller_class_itself(both):
    _, drivers = both
    assert drivers and all(type(d.controller) is latsim.controller.Controller for d in drivers)


def test_cost_samples_load_as_a_latsim_cost_table(both):
    from latsim.model.costs import load_table

    results, _ = both
    path = results[1].run_dir / "cost_samples.json"
    table = load_table(path)
    n_run = len(results[1].driver.jobs)
    assert len(table.samples[(4, "refill")]) + len(table.samples.get((4, "replan"), ())) == (
        5 + n_run
    )


def test_a_stopped_run_leaves_readable_partial_records(generator, tmp_path):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [0.3, 0.9, 1.5, 6.0, 8.0], {"duration": 10.0})

    def stop_soon(driver: LiveDriver) -> None:
        threading.Timer(2.0, driver.stop, args=("test stop",)).start()

    results = measure(_config(tmp_path, trace, duration=10.0, policies=("speculative",)),
                      generator=generator, on_driver=stop_soon)
    run_dir = results[0].run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert summary["interrupted"] is True and config["status"] == "interrupted"
    assert summary["stop_reason"] == "test stop" and summary["end_time"] < 4.0
    with (run_dir / "slots.csv").open() as handle:
        slots = list(csv.DictReader(handle))
    assert 4 <= len(slots) <= 12
    conditions = pd.read_csv(run_dir / "conditions.csv")
    assert len(conditions) == 3  # the conditions that arrived before the stop


def test_ctrl_c_writes_what_was_measured_then_reraises(generator, tmp_path):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [0.3, 5.0], {"duration": 10.0})

    def interrupt_soon(driver: LiveDriver) -> None:
        threading.Timer(1.5, _thread.interrupt_main).start()

    with pytest.raises(KeyboardInterrupt):
        measure(_config(tmp_path, trace, duration=10.0, policies=("baseline", "speculative")),
                generator=generator, on_driver=interrupt_soon)
    run_dir = tmp_path / "runs" / "K4-baseline"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stop_reason"] == "KeyboardInterrupt"
    assert not (tmp_path / "runs" / "K4-speculative").exists()
    index = json.loads((tmp_path / "runs" / "measure.json").read_text())
    assert index["interrupted"] is True
