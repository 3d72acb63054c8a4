"""latsim compare on a real stopped live run (tiny preset on CPU; slow tier): the measured side
of a partial run, rebuilt from its folder, is what the driver itself recorded over the window
the run covers, and busy % is the generator's time on both sides."""

from __future__ import annotations

import csv
import time
from dataclasses import replace

import numpy as np
import pytest

from latsim.analysis.compare import GENERATOR, compare_runs
from latsim.analysis.metrics import summarize
from latsim.model.traces import write_trace

pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from harness.generators.wan import WanConfig, WanGenerator  # noqa: E402
from harness.live.driver import LiveDriver  # noqa: E402
from harness.measure.run import MeasureConfig, measure  # noqa: E402
from tests.helpers import HookedGenerator  # noqa: E402


def test_a_stopped_live_run_is_compared_over_what_it_recorded(tmp_path):
    times = [0.3, 0.9, 1.5, 2.2, 6.0, 8.0]
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, times, {"duration": 10.0})
    hooked = HookedGenerator(WanGenerator(WanConfig("tiny", "tiny", steps=8)))
    stopped: list[float] = []

    def arm(driver: LiveDriver) -> None:
        def stop_at_version_3(job) -> None:
            if job.version >= 3 and not stopped:
                driver.stop("test stop")
                stopped.append(time.perf_counter())
                # the job outlasts the stop by more than two slots (T = 0.25 s), as a slow
                # job on a loaded machine does: no tick due meanwhile is handled, so the run
                # ends at the stop, not when the worker finishes (CI saw a 2.757% stall
                # that the driver's own records did not have)
                time.sleep(0.6)

        hooked.hook = stop_at_version_3

    config = MeasureConfig(preset="tiny", resolution="tiny", Ks=(4,), steps=8,
                           policies=("speculative",), trace=str(trace), duration=10.0,
                           out=str(tmp_path / "runs"), r=4, fps=16.0, warmup_timed=5,
                           warmup_gap_s=0.1, calibration_jobs=2)
    (result,) = measure(config, generator=hooked, on_driver=arm)
    driver = result.driver
    (row,) = compare_runs([result.run_dir], replications=3).rows
    window = min(driver.end_time, 10.0)
    assert row["status"] == "interrupted" and row["window_s"] == pytest.approx(window)
    assert row["busy_basis"] == GENERATOR and row["L_basis"] == "wall clock"
    expected = summarize([replace(driver.records, duration=window)])
    assert row["stall_pct_measured"] == pytest.approx(expected.stall_pct, abs=1e-9)
    assert row["busy_pct_measured"] == pytest.approx(expected.busy_pct, abs=1e-9)
    assert row["dit_calls_measured"] == expected.dit_calls
    assert row["w_measured"] == expected.w
    with (result.run_dir / "display.csv").open(newline="") as handle:
        wall = [float(r["L_wall"]) for r in csv.DictReader(handle)]
    assert wall, "no condition was shown before the stop"
    assert row["L50_measured"] == pytest.approx(float(np.percentile(wall, 50)), abs=1e-12)
    for metric in ("stall_pct", "busy_pct", "dit_calls"):
        assert row[f"{metric}_predicted"] is not None
