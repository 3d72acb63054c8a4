"""`latsim plot timeline RUN_DIR`: drawn from a run folder's CSVs only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from latsim.cli import app
from latsim.experiments.engine import Experiment, run_experiment, write_experiment
from latsim.viz.timeline import default_window, select_run
from tests import run_folders

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    exp = Experiment(Ks=(4, 8), cost="fixed:0.6", updates="poisson:0.3", duration=30.0,
                     seeds=2, seed=4)
    write_experiment(run_experiment(exp, jobs=1), out)
    return out


def test_timeline_default_and_selected(run_dir: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["plot", "timeline", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "timeline.png").stat().st_size > 20_000
    assert "baseline, K=4, run 0" in " ".join(result.output.split())  # wrapped at COLUMNS
    out = tmp_path / "spec.png"
    result = runner.invoke(app, ["plot", "timeline", str(run_dir), "--policy", "speculative",
                                 "--K", "8", "--run", "1", "--t0", "2", "--t1", "14",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "speculative, K=8, run 1" in " ".join(result.output.split())
    assert out.stat().st_size > 20_000


def test_selection_reads_the_right_rows(run_dir: Path) -> None:
    data = select_run(run_dir, policy="speculative", K=8, run=1)
    for frame in (data.jobs, data.slots, data.conditions):
        assert set(frame["policy"]) == {"speculative"}
        assert set(frame["K"]) == {8} and set(frame["run"]) == {1}
    assert data.delta == pytest.approx(0.25)
    assert data.T == pytest.approx(2.0)
    t0, t1 = default_window(data)
    assert 0 <= t0 < t1


def test_works_on_a_measured_style_folder(run_dir: Path, tmp_path: Path) -> None:
    """No config.json and no policy/K/run columns: a single measured run."""
    folder = tmp_path / "measured"
    folder.mkdir()
    for name in ("jobs", "slots", "discards", "conditions", "stalls"):
        frame = pd.read_csv(run_dir / f"{name}.csv")
        if not frame.empty:
            frame = frame[(frame["policy"] == "speculative") & (frame["K"] == 4)
                          & (frame["run"] == 0)]
        frame.drop(columns=["policy", "K", "run"]).to_csv(folder / f"{name}.csv",
                                                          index=False)
    data = select_run(folder)
    assert data.K == 4 and data.delta == pytest.approx(0.25)
    result = runner.invoke(app, ["plot", "timeline", str(folder)])
    assert result.exit_code == 0, result.output
    assert (folder / "timeline.png").exists()


def test_bad_input_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    for args, message in (
        ([str(tmp_path / "nope")], "not a folder"),
        ([str(run_dir), "--policy", "eager"], "no policy 'eager'"),
        ([str(run_dir), "--K", "5"], "K=5"),
        ([str(run_dir), "--t0", "5", "--t1", "4"], "t1 > t0"),
        ([str(tmp_path)], "missing"),
    ):
        result = runner.invoke(app, ["plot", "timeline", *args])
        assert result.exit_code == 2, args
        assert message in result.output
        assert "Traceback" not in result.output


def test_commit_mode_follows_the_folder_kind(run_dir: Path, tmp_path: Path) -> None:
    """An experiment folder and bare record CSVs take the commit mode from the policy; a
    single run's config.json states it."""
    assert select_run(run_dir, policy="baseline").eager
    assert not select_run(run_dir, policy="speculative").eager
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("jobs", "slots", "discards", "conditions", "stalls"):
        (bare / f"{name}.csv").write_bytes((run_dir / f"{name}.csv").read_bytes())
    assert select_run(bare, policy="baseline").eager
    assert not select_run(bare, policy="speculative").eager


def _title(data) -> str:
    import matplotlib.pyplot as plt

    from latsim.viz.timeline import timeline_figure

    fig = timeline_figure(data)
    try:
        return " ".join(fig.axes[0].get_title().split())
    finally:
        plt.close(fig)


def test_a_partial_run_says_so_in_the_title(tmp_path: Path) -> None:
    run_folders.interrupted_run(tmp_path / "cut", end=13.0)
    data = select_run(tmp_path / "cut")
    assert data.partial and data.status == "interrupted"
    assert data.end_time == pytest.approx(13.0)
    assert "PARTIAL RUN (interrupted: records end at 13.00 s of the 30 s window)" in _title(data)
    result = runner.invoke(app, ["plot", "timeline", str(tmp_path / "cut")])
    assert result.exit_code == 0, result.output
    assert "PARTIAL RUN (interrupted" in result.output


def test_a_killed_run_with_a_torn_row_is_drawn_and_noted(tmp_path: Path) -> None:
    run_dir = run_folders.killed_run(tmp_path / "killed", cut=14.5, torn="slots")
    data = select_run(run_dir)
    assert data.status == "incomplete" and 12.0 < data.end_time <= 14.5
    assert data.slots["t_start"].max() <= 14.5  # the torn row is not a slot
    title = _title(data)
    assert "PARTIAL RUN (incomplete: records end at" in title
    assert "slots.csv: last row" in title and "torn" in title


def test_a_complete_run_and_an_experiment_are_not_marked(tmp_path: Path, run_dir: Path) -> None:
    run_folders.complete_run(tmp_path / "whole")
    for data in (select_run(tmp_path / "whole"), select_run(run_dir)):
        assert not data.partial and data.status_line() == ""
        assert "PARTIAL" not in _title(data)


def test_foreign_kinds_bare_records_and_torn_rows_are_said(tmp_path):
    """A config.json of another kind is refused; bare records are plotted as RECORDS ONLY;
    --out that is neither a .png nor a folder is refused (matplotlib would write OUT.png);
    the Perfetto export notes a torn last row instead of dropping it quietly."""
    import json
    import shutil

    from typer.testing import CliRunner

    from latsim.cli import app

    runner = CliRunner()
    run = tmp_path / "run"
    assert runner.invoke(app, ["simulate", "--K", "8", "--C", "0.5", "--seeds", "1",
                               "--duration", "20", "--out", str(run)]).exit_code == 0
    foreign = tmp_path / "foreign"
    shutil.copytree(run, foreign)
    config = json.loads((foreign / "config.json").read_text())
    (foreign / "config.json").write_text(json.dumps({**config, "kind": "martian"}))
    for args in (["plot", "timeline", str(foreign)],
                 ["export", "perfetto", str(foreign), "--out", str(tmp_path / "f.json")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "kind 'martian' is not a latsim run" in result.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    for csv_file in run.glob("*.csv"):
        if csv_file.name != "summary.csv":
            shutil.copy(csv_file, bare)
    result = runner.invoke(app, ["plot", "timeline", str(bare)])
    assert result.exit_code == 0 and "RECORDS ONLY" in result.stdout
    result = runner.invoke(app, ["plot", "timeline", str(run), "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "give a .png path or an existing folder" in result.stderr
    assert not (tmp_path / "t.png").exists()
    result = runner.invoke(app, ["plot", "timeline", str(run), "--out", str(tmp_path)])
    assert result.exit_code == 0 and (tmp_path / "timeline.png").is_file()
    slots = run / "slots.csv"
    slots.write_bytes(slots.read_bytes()[:-5])  # a writer killed mid-row
    result = runner.invoke(app, ["export", "perfetto", str(run), "--out",
                                 str(tmp_path / "p.json")])
    assert result.exit_code == 0 and "is torn" in result.stderr
    assert "is torn" in json.loads((tmp_path / "p.json").read_text())["metadata"]["notes"][0]


def test_a_segment_label_is_set_inside_its_bar_only_where_it_fits():
    """A client timeline over its whole window (the committed browser run b1) set "Q 0.09"
    and "to screen 0.11" inside bars narrower than the text, which printed over the next
    bar and the marker ("C 0.050.01screen 0.10"). Every label inside a bar fits it now; the
    rest go below."""
    import matplotlib

    matplotlib.use("Agg")
    from latsim.viz.timeline import timeline_figure

    root = Path(__file__).resolve().parent.parent
    figure = timeline_figure(select_run(root / "results/browser/runs/b1"))
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    ax = figure.axes[0]
    inside = [t for t in ax.texts if t.get_color() == "white" and t.get_visible()]
    assert inside  # some labels do fit
    for text in inside:
        seconds = float(text.get_text().rsplit(" ", 1)[1])
        bar_px = ax.transData.transform((seconds, 0))[0] - ax.transData.transform((0, 0))[0]
        assert text.get_window_extent(renderer).width <= bar_px + 1, text.get_text()
