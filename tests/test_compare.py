"""latsim compare: the pipeline is consistent (a simulated "measurement" is predicted with
~0 error) and reports disagreement relative to the measurement."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from latsim.analysis.compare import (
    COMPARED,
    GENERATOR,
    compare_runs,
    load_measured,
    write_simulated,
)
from latsim.cli import app
from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.costs import FixedCost
from latsim.model.traces import Trace
from latsim.run.folder import read_run_folder
from latsim.sim.simpy_driver import simulate_trace
from tests import run_folders
from tests.helpers import envelope_of

TIMES = (1.3, 4.07, 4.5, 9.91, 13.2, 16.66, 21.05, 24.4)


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    trace = Trace("synthetic", TIMES, 30.0)
    for K in (2, 8):
        for policy in (BASELINE, SPECULATIVE):
            config = ControllerConfig(Timing(K, 4, 16.0), policy, 0.2)
            records, _ = simulate_trace(config, FixedCost(0.2), trace, 30.0,
                                        np.random.default_rng(0))
            write_simulated(root / f"K{K}-{policy.name}", config, FixedCost(0.2), trace, records)
    return root


def test_simulated_measurement_is_predicted_with_zero_error(sim_runs):
    result = compare_runs([sim_runs], replications=3)
    assert [row["run"] for row in result.rows] == [
        "K2-baseline", "K2-speculative", "K8-baseline", "K8-speculative",
    ]
    for row in result.rows:
        for metric in COMPARED:
            err = row[f"{metric}_err_pct"]
            assert err is None or abs(err) < 1e-3, (row["run"], metric, err)
        assert row["stall_pct_abs_err"] == pytest.approx(0.0, abs=1e-9)
    assert result.mape is not None and result.mape < 1e-3


def test_error_is_relative_to_the_measurement(sim_runs, tmp_path):
    import shutil

    run_dir = tmp_path / "K8-speculative"
    shutil.copytree(sim_runs / "K8-speculative", run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["L50"] *= 1.25  # the "measurement" is 25% slower than the model
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (row,) = compare_runs([run_dir], replications=2).rows
    assert row["L50_err_pct"] == pytest.approx(-20.0, abs=1e-3)


def test_load_run_takes_c_samples_from_the_jobs(sim_runs):
    run = load_measured(sim_runs / "K8-speculative")
    assert set(run.job_costs) <= {"refill", "replan"}
    assert all(c == pytest.approx(0.2) for values in run.job_costs.values() for c in values)
    assert len(run.latencies) == run.summary["n_displayed"]


def test_cli_json_and_files(sim_runs, tmp_path):
    result = CliRunner().invoke(app, ["compare", str(sim_runs), "--replications", "2",
                                      "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    payload = envelope_of(result.stdout)
    assert "MAPE" in payload and len(payload["rows"]) == 4
    assert {"L50_measured", "L50_predicted", "L50_err_pct", "L95_err_pct",
            "stall_pct_err_pct"} <= payload["rows"][0].keys()
    for name in ("compare.json", "compare.csv", "compare_cdf.png", "compare_overlay.png"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such folder"),
    (lambda p: p, "not a run folder"),
])
def test_cli_bad_folders(tmp_path, make, message):
    result = CliRunner().invoke(app, ["compare", str(make(tmp_path))])
    assert result.exit_code == 2 and message in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("damage", ["device", "folder"])
def test_a_discards_csv_that_is_not_a_file_is_refused(tmp_path, damage):
    """Issue 51's corpus: discards.csv (optional: older folders have none) was read only
    where it was a regular file, so an endless device or a folder in its place was taken
    for no table and a complete run compared with exit 0; it is refused like any other
    table, in one line naming it."""
    run = run_folders.complete_run(tmp_path / "run")
    (run / "discards.csv").unlink()
    if damage == "device":
        (run / "discards.csv").symlink_to("/dev/zero")
    else:
        (run / "discards.csv").mkdir()
    result = CliRunner().invoke(app, ["compare", str(run), "--replications", "2"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.count("\n") == 1 and "discards.csv" in result.stderr, result.stderr


def _bootstrap_se_pct(latencies, q: float, n: int = 2000) -> float:
    """Bootstrap standard error of the ``q`` percentile of ``latencies``, in percent of it:
    how far a measured percentile of this many conditions moves by sampling alone."""
    values = np.asarray(latencies)
    rng = np.random.default_rng(0)
    draws = np.percentile(rng.choice(values, size=(n, values.size)), q, axis=1)
    return 100 * float(draws.std(ddof=1)) / float(np.percentile(values, q))


def test_committed_example_is_reproduced_and_meets_the_acceptance_bounds(tmp_path):
    """results/compare: tiny preset, K 2 4 8, both policies, measured on a 2-core CPU.
    Re-running the comparison on the committed runs rewrites the committed table byte for
    byte, and the committed numbers meet the issue's bounds (L50 within 10%, L95 within 15%,
    stall within 1 percentage point), or, where 30 conditions cannot pin a percentile that
    closely, within two bootstrap standard errors of the measured percentile."""
    root = Path(__file__).resolve().parent.parent / "results" / "compare"
    result = CliRunner().invoke(app, ["compare", str(root / "runs"), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "compare.csv").read_bytes() == (root / "compare.csv").read_bytes()
    rows = json.loads((root / "compare.json").read_text())["rows"]
    assert len(rows) == 6
    for row in rows:
        measured = load_measured(root / "runs" / row["run"]).latencies
        assert len(measured) >= 30  # enough that L95 is not the maximum of a handful
        bound50 = max(10.0, 2 * _bootstrap_se_pct(measured, 50))
        bound95 = max(15.0, 2 * _bootstrap_se_pct(measured, 95))
        assert abs(row["L50_err_pct"]) <= bound50, (row["run"], row["L50_err_pct"], bound50)
        assert abs(row["L95_err_pct"]) <= bound95, (row["run"], row["L95_err_pct"], bound95)
        assert abs(row["stall_pct_abs_err"]) <= 1


def test_committed_gpu_comparison_is_reproduced():
    """results/gpu/<date>/compare: the first H200 runs (wan-1.3b, 480p) re-simulated from the
    committed run folders rewrite the committed table byte for byte; every run is complete
    and says it ran on CUDA with NVML kernel activity (not a CPU run filed as a GPU one)."""
    for root in sorted((Path(__file__).resolve().parent.parent / "results" / "gpu").glob("20*")):
        out = root / "compare"
        with tempfile.TemporaryDirectory() as tmp:
            result = CliRunner().invoke(app, ["compare", str(root / "live"), "--out", tmp])
            assert result.exit_code == 0, result.stderr
            assert (Path(tmp) / "compare.csv").read_bytes() == (out / "compare.csv").read_bytes()
        for summary in sorted((root / "live").glob("*/summary.json")):
            data = json.loads(summary.read_text())
            assert data["status"] == "complete", summary
            assert data["device"] == "cuda" and data["kernel_activity"] is not None, summary


def test_committed_viewer_comparison_is_reproduced(tmp_path):
    """results/serve: four live viewers of one server for 120 s (tiny preset on this CPU)
    predicted together on its shared device; re-running the comparison on the committed
    client runs rewrites the committed table byte for byte, and it meets the targets."""
    root = Path(__file__).resolve().parent.parent / "results" / "serve"
    result = CliRunner().invoke(app, ["compare", str(root / "runs"), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    assert ((tmp_path / "compare_viewer.csv").read_bytes()
            == (root / "compare_viewer.csv").read_bytes())
    rows = json.loads((root / "compare_viewer.json").read_text())["rows"]
    assert [row["predicted_with"] for row in rows] == [4] * 4
    assert all(row["status"] == "complete" and row["n_conditions"] >= 100 for row in rows)
    # the live service's joint-prediction targets (issue 23), on the committed example
    for row in rows:
        assert abs(row["L50_err_pct"]) <= 5 and abs(row["L95_err_pct"]) <= 10, row["run"]
        assert abs(row["viewer_stall_pct_abs_err"]) <= 0.5, row["run"]


def test_a_viewer_is_predicted_with_the_binding_its_server_used():
    """A client folder says when its server's queued jobs took their condition (the ready
    message's ``bind``); one that does not was served binding at enqueue (every committed
    folder), so it is predicted that way: like for like."""
    from latsim.analysis.viewer_compare import load_client_run

    root = Path(__file__).resolve().parent.parent / "results" / "serve" / "runs"
    run = load_client_run(sorted(p for p in root.iterdir() if p.is_dir())[0])
    assert "bind" not in run.config and run.controller_config().bind == "enqueue"
    told = type(run)(run.path, {**run.config, "bind": "start"}, run.records, run.window)
    assert told.controller_config().bind == "start"
    wrong = type(run)(run.path, {**run.config, "bind": "later"}, run.records, run.window)
    with pytest.raises(LatsimError, match="lead or bind is not valid"):
        wrong.controller_config()


# ---------------------------------------------------------------- partial runs, mixed folders

def _assert_no_error(row):
    for metric in COMPARED:
        assert row[f"{metric}_measured"] is not None or metric == "w", (metric, row)
        err = row[f"{metric}_err_pct"]
        assert err is None or abs(err) < 1e-6, (row["run"], metric, err)
    assert abs(row["stall_pct_abs_err"]) < 1e-9


def test_an_interrupted_run_is_compared_over_the_window_it_covers(tmp_path):
    """Its records end at 13 s of a 30 s window and its summary divides by 30 s: both sides
    over [0, 13] agree exactly (fixed C); the whole-window comparison was far off."""
    run_folders.interrupted_run(tmp_path / "K8-speculative", end=13.0)
    (row,) = compare_runs([tmp_path], replications=2).rows
    assert row["status"] == "interrupted"
    assert row["window_s"] == pytest.approx(13.0) and row["end_time"] == pytest.approx(13.0)
    _assert_no_error(row)
    assert row["n_conditions"] == sum(1 for t in run_folders.TIMES if t < 13.0)
    assert "interrupted (KeyboardInterrupt)" in row["notes"]


def test_a_killed_run_is_compared_up_to_its_last_finished_job(tmp_path):
    """Config still 'running', no summary, rows up to 14.5 s and a torn last jobs.csv row
    (once a TypeError): compared over [0, last t_ready], the torn row dropped with a note."""
    run_dir = run_folders.killed_run(tmp_path / "K8-speculative", cut=14.5)
    folder = read_run_folder(run_dir)
    assert folder.state == "incomplete" and folder.end_time is None
    end = folder.records_end()
    assert 12.0 < end <= 14.5
    (row,) = compare_runs([run_dir], replications=2).rows
    assert row["status"] == "incomplete" and row["window_s"] == pytest.approx(end)
    assert row["L_basis"] == "controller timeline"
    _assert_no_error(row)
    assert "jobs.csv: last row (line" in row["notes"] and "torn" in row["notes"]


def test_run_states(tmp_path):
    run_folders.interrupted_run(tmp_path / "a", end=13.0, reason="generator failed: OOM")
    run_folders.interrupted_run(tmp_path / "b", end=13.0)
    run_folders.killed_run(tmp_path / "c", cut=14.5, torn=None)
    run_folders.complete_run(tmp_path / "d")
    states = [read_run_folder(tmp_path / n).state for n in "abcd"]
    assert states == ["failed", "interrupted", "incomplete", "complete"]
    assert read_run_folder(tmp_path / "d").end_time >= run_folders.DURATION


def test_a_run_with_no_finished_job_or_under_a_chunk_is_skipped_with_the_reason(tmp_path):
    run_folders.killed_run(tmp_path / "K8-early", cut=1.0, torn=None)
    run_folders.complete_run(tmp_path / "K8-speculative")
    result = compare_runs([tmp_path], replications=2)
    assert [r["run"] for r in result.rows] == ["K8-speculative"]
    (skipped,) = result.skipped
    assert skipped["path"].endswith("K8-early") and "nothing to compare" in skipped["reason"]
    with pytest.raises(LatsimError, match="nothing to compare"):
        compare_runs([tmp_path / "K8-early"], replications=2)


def test_mixed_folder_compares_what_it_can_and_lists_what_it_skipped(tmp_path):
    from latsim.experiments.engine import Experiment, run_experiment, write_experiment

    root = tmp_path / "mixed"
    run_folders.complete_run(root / "K8-speculative")
    exp = Experiment(Ks=(4,), cost="fixed:0.6", updates="poisson:0.3", duration=10.0, seeds=1)
    write_experiment(run_experiment(exp, jobs=1), root / "sweep")
    (root / "notes").mkdir()
    (root / "notes" / "README").write_text("not a run\n")
    (root / "bare").mkdir()
    (root / "bare" / "jobs.csv").write_bytes((root / "K8-speculative" / "jobs.csv").read_bytes())
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(root), "--replications", "2", "--json",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    payload = envelope_of(result.stdout)
    assert [r["run"] for r in payload["rows"]] == ["K8-speculative"]
    reasons = {Path(s["path"]).name: s["reason"] for s in payload["skipped"]}
    assert set(reasons) == {"bare", "notes", "sweep"}
    assert "experiment folder" in reasons["sweep"] and "not a run" in reasons["notes"]
    assert json.loads((out / "compare.json").read_text())["skipped"] == payload["skipped"]
    for name in reasons:
        assert f"skipped {root / name}" in result.stderr


def test_status_appears_in_rows_table_and_the_overall_mape_says_over_which_runs(tmp_path):
    run_folders.complete_run(tmp_path / "K8-speculative")
    run_folders.interrupted_run(tmp_path / "K8-cut", end=13.0)
    run_folders.killed_run(tmp_path / "K8-killed", cut=14.5)
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(tmp_path), "--replications", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    payload = envelope_of(result.stdout)
    assert {r["run"]: r["status"] for r in payload["rows"]} == {
        "K8-cut": "interrupted", "K8-killed": "incomplete", "K8-speculative": "complete"}
    assert payload["MAPE_runs"] == ["K8-speculative"] and "complete" in payload["MAPE_over"]
    assert "warning: K8-cut: interrupted" in result.stderr
    assert "warning: K8-killed: incomplete" in result.stderr
    table = runner.invoke(app, ["compare", str(tmp_path), "--replications", "2"])
    assert table.exit_code == 0, table.stderr
    assert "interrupted" in table.stdout and "incomplete" in table.stdout
    assert "over 1 run(s), complete runs (partial ones are left out): K8-speculative" in (
        " ".join(table.stdout.split()))


def test_a_bad_middle_row_names_file_and_line(tmp_path):
    run_dir = run_folders.complete_run(tmp_path / "K8-speculative")
    lines = (run_dir / "jobs.csv").read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("refill", "refill,extra", 1)
    (run_dir / "jobs.csv").write_text("".join(lines))
    result = CliRunner().invoke(app, ["compare", str(run_dir), "--replications", "2"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{run_dir / 'jobs.csv'}:4:" in result.stderr


def test_busy_is_compared_in_the_generators_view_on_both_sides(tmp_path):
    """The controller's C holds a 12 ms dispatch delay the generator's time does not: the
    prediction counts the generator's interval of each resampled job, like the measurement
    (the controller's C over-predicted busy % by ~6% here)."""
    run_dir = run_folders.live_style_run(tmp_path / "K4-baseline", dispatch=0.012)
    (row,) = compare_runs([run_dir], replications=3).rows
    assert row["busy_basis"] == GENERATOR
    assert abs(row["busy_pct_err_pct"]) < 1e-6
    _assert_no_error(row)


def test_committed_example_busy_is_predicted_within_3_percent():
    """On the committed live runs (2-core CPU, ~6–12 ms dispatch delay a job) busy % was
    over-predicted by 4–7% with the controller's C; in the generator's view it agrees."""
    root = Path(__file__).resolve().parent.parent / "results" / "compare" / "runs"
    result = compare_runs([root], replications=20)
    assert len(result.rows) == 6
    for row in result.rows:
        assert row["busy_basis"] == GENERATOR
        assert abs(row["busy_pct_err_pct"]) < 3, (row["run"], row["busy_pct_err_pct"])


def _two_measurements(tmp_path):
    for group in ("A", "B"):
        for K in (2, 8):
            for policy in (BASELINE, SPECULATIVE):
                run_folders.complete_run(tmp_path / group / f"K{K}-{policy.name}", K, policy)
    run_folders.interrupted_run(tmp_path / "A" / "K4-speculative", end=13.0, K=4)
    return compare_runs([tmp_path / "A", tmp_path / "B"], replications=2)


def test_overlay_figure_groups_by_measurement_and_marks_partial_runs(tmp_path):
    import matplotlib.pyplot as plt

    from latsim.viz.plots import compare_overlay_figure

    result = _two_measurements(tmp_path)
    assert {r["measurement"] for r in result.rows} == {"A", "B"}
    fig = compare_overlay_figure(result)
    try:
        for ax in fig.axes[:2]:
            assert list(ax.get_xticks()) == [2, 4, 8]
            assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4", "8"]
            lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 1]
            for line in lines:  # within one measurement: K increases along every line
                xs = list(line.get_xdata())
                assert xs == sorted(set(xs)), (line.get_label(), xs)
            simulated = [line for line in lines if "simulated" in line.get_label()]
            assert len(simulated) == 4  # 2 measurements x 2 policies, K4 (partial) off them
            assert all(4 not in line.get_xdata() for line in simulated)
        labels = [line.get_label() for line in fig.axes[0].get_lines()]
        assert not any("mean" in label for label in labels)  # medians with medians only
        assert any("partial run" in label for label in labels)
    finally:
        plt.close(fig)


def test_cdf_figure_title_gives_the_setup_and_what_predicted_means(tmp_path):
    import matplotlib.pyplot as plt

    from latsim.viz.plots import compare_cdf_figure

    fig = compare_cdf_figure(_two_measurements(tmp_path))
    try:
        title = " ".join(fig._suptitle.get_text().split())
        assert "trace synthetic" in title and "K = 2, 4, 8" in title
        assert "predicted = re-simulated with the run's own measured C" in title
    finally:
        plt.close(fig)


def test_damaged_record_files_are_not_compared_as_if_whole(tmp_path):
    """A complete run's measured metrics come from its summary; its record CSVs are still
    read, so a conditions.csv that lost a column or a slot with a NaN start is an error."""
    import shutil

    source = Path(__file__).resolve().parent.parent / "results" / "compare" / "runs"
    for damage, message in ((lambda d: _drop_column(d / "conditions.csv", "L"),
                             "conditions.csv:1: the header lacks L"),
                            (lambda d: _nan_slot(d / "slots.csv"),
                             r"slots.csv:\d+: column t_start: empty or NaN"),
                            # compared as "all complete, MAPE 0.03%" before
                            (lambda d: (d / "conditions.csv").unlink(),
                             "conditions.csv: missing"),
                            (lambda d: (d / "stalls.csv").write_text(""),
                             "stalls.csv: empty"),
                            (lambda d: _drop_keys(d / "config.json", "kind", "status"),
                             "lacks kind and status")):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(source / "K4-baseline", run)
        damage(run)
        with pytest.raises(LatsimError, match=message):
            compare_runs([run], replications=2)


def _drop_column(path: Path, column: str) -> None:
    import csv

    rows = list(csv.reader(path.open(newline="")))
    keep = [i for i, name in enumerate(rows[0]) if name != column]
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([[row[i] for i in keep] for row in rows])


def _drop_keys(path: Path, *keys: str) -> None:
    config = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in config.items() if k not in keys}))


def _nan_slot(path: Path) -> None:
    lines = path.read_text().split("\n")
    lines[2] = lines[2].rsplit(",", 1)[0] + ",nan"
    path.write_text("\n".join(lines))


def test_a_negative_seed_is_a_one_line_error():
    """``latsim compare RUN --seed -1`` was a numpy traceback."""
    root = Path(__file__).resolve().parent.parent / "results" / "compare" / "runs"
    result = CliRunner().invoke(app, ["compare", str(root), "--seed", "-1"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("latsim: error: --seed must be an integer >= 0 and <= "
                                     "9223372036854775807, got -1")


@pytest.mark.parametrize("cell, expected", [
    ("-0.3", "jobs.csv:3: column t_ready: -0.3 is below 0"),
    ("nan", "jobs.csv:3: column t_ready: empty or NaN"),
    ("0.5", "jobs.csv:3: column t_ready: 0.5 is before t_start"),
])
@pytest.mark.parametrize("kind", ["simulated", "client"])
def test_compare_refuses_nan_or_negative_job_times_in_one_line(tmp_path, cell, expected,
                                                               kind):
    """Before: a negative jobs.csv cell compared as C_mean = -0.051, status complete; a
    NaN one in a client folder was a traceback."""
    run = (run_folders.complete_run(tmp_path / "run") if kind == "simulated"
           else run_folders.client_run(tmp_path / "run"))
    run_folders.set_cell(run / "jobs.csv", 3, "t_ready", cell)
    result = CliRunner().invoke(app, ["compare", str(run), "--replications", "2"])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("latsim: error: ") and result.stderr.count("\n") == 1
    assert expected in result.stderr


@pytest.mark.parametrize("kind", ["simulated", "client"])
def test_compare_notes_a_torn_row_it_dropped(tmp_path, kind):
    run = (run_folders.complete_run(tmp_path / "run") if kind == "simulated"
           else run_folders.client_run(tmp_path / "run"))
    run_folders.tear_last_row(run / "conditions.csv")
    result = CliRunner().invoke(app, ["compare", str(run), "--replications", "2"])
    assert result.exit_code == 0, result.stderr
    assert "conditions.csv: last row" in result.stderr, result.stderr
