"""The progress bar of long commands: one rich bar with a count and an ETA, on stderr; silent
off a terminal and under ``--quiet``; never mixed with what a command prints on stdout."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim.cli import app
from tests.helpers import SMALL_FLEET, SMALL_GRID

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bar(monkeypatch, stderr: io.StringIO, stdout: io.StringIO):
    from latsim.cli.progress import ProgressBar

    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    return ProgressBar("simulating (runs)", delay_s=0.0)


def test_the_bar_shows_the_count_and_an_eta_on_a_terminal_and_clears_itself(monkeypatch):
    monkeypatch.delenv("LATSIM_QUIET", raising=False)
    err, out = Terminal(), io.StringIO()
    with _bar(monkeypatch, err, out) as bar:
        bar(3, 8)
        bar(8, 8)
    shown = err.getvalue()
    assert "simulating (runs)" in shown and "8/8" in shown and "eta" in shown
    assert out.getvalue() == ""


def test_results_printed_while_the_bar_runs_stay_on_stdout(monkeypatch):
    """rich's default moves stdout onto the bar's console (stderr) while the bar is live."""
    monkeypatch.delenv("LATSIM_QUIET", raising=False)
    err, out = Terminal(), io.StringIO()
    with _bar(monkeypatch, err, out) as bar:
        bar(1, 2)
        print('{"rows": []}')
        bar(2, 2)
    assert out.getvalue() == '{"rows": []}\n'
    assert '"rows"' not in err.getvalue()


@pytest.mark.parametrize("quiet, stderr", [("0", io.StringIO), ("1", Terminal)],
                         ids=["not-a-terminal", "quiet"])
def test_the_bar_is_silent_off_a_terminal_and_under_quiet(quiet, stderr, monkeypatch):
    monkeypatch.setenv("LATSIM_QUIET", quiet)
    err, out = stderr(), io.StringIO()
    with _bar(monkeypatch, err, out) as bar:
        bar(1, 2)
        bar(2, 2)
    assert err.getvalue() == "" and out.getvalue() == ""





def test_the_bars_thread_is_stopped_while_workers_are_forked(monkeypatch):
    """rich redraws a live bar from a thread of its own; a worker forked meanwhile inherits
    whatever lock it held (Python 3.12+ warns: "This process is multi-threaded, use of
    fork() may lead to deadlocks"). A LocalPool stops it while it starts its workers, and
    decides there how to start them (:func:`~latsim.experiments.executors.start_method`:
    a fork, in a process with no other thread); it runs again after."""
    import os
    import threading

    from latsim.experiments import executors

    monkeypatch.delenv("LATSIM_QUIET", raising=False)
    # the bar's own thread, told from any other this process runs (another test's server
    # thread still ending, say: counting threads made this test fail beside others)
    before = set(threading.enumerate())
    bars: set[threading.Thread] = set()
    at_start: list[tuple[str, bool]] = []
    real_fork, real_start_method = os.fork, executors.start_method

    def fork() -> int:
        at_start.append(("fork", any(thread.is_alive() for thread in bars)))
        return real_fork()

    def start_method() -> str:
        method = real_start_method()
        at_start.append((method, any(thread.is_alive() for thread in bars)))
        return method

    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(executors, "start_method", start_method)
    err, out = Terminal(), io.StringIO()
    with _bar(monkeypatch, err, out) as bar:
        bar(1, 4)
        bars.update(set(threading.enumerate()) - before)
        assert len(bars) == 1  # the bar's refresh thread
        done = sorted(executors.LocalPool(2).map_unordered(abs, [-1, -2, -3]))
        assert done == [(0, 1), (1, 2), (2, 3)]
        assert len(set(threading.enumerate()) - before) == 1  # drawn again
        bar(4, 4)
    # the bar's thread stopped where the pool chose how to start its workers, and for each
    # fork if it forks (here alone: two; beside a pytest-xdist worker's thread: a server)
    assert at_start[0][1] is False and all(not alive for _, alive in at_start), at_start
    assert [m for m, _ in at_start[1:]] == (["fork", "fork"] if at_start[0][0] == "fork"
                                            else []), at_start
    assert "4/4" in err.getvalue()


def test_a_status_line_leaves_the_bars_columns_whole_at_80(monkeypatch):
    """``status`` (plan, measure, profile) puts its line beside the bar where it fits in
    what 80 columns leave beside the bar, count, elapsed time and ETA (less a trailing
    parenthesis, the count the bar shows); a longer line goes whole on a line of its own
    above the bar, and one wider than the terminal loses its last parts: nothing is cut to
    "…" (measure's line was, at 80 columns)."""
    import re

    monkeypatch.delenv("LATSIM_QUIET", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    long = ("verifying K=21 speculative usp4 8gpu autoscaled to 0.75 (run 13 of at most "
            "24)")
    measure = "[K4-speculative]    1.3/2 s  conditions served 1/1  stalls 0 (0.00 s)  jobs 1"
    frames: set[str] = set()
    for line in ("verifying K=21 speculative usp4 8gpu (run 12 of at most 24)", long,
                 measure.replace("[K4", "[K16"), measure + "  queued 3"):
        err, out = Terminal(), io.StringIO()
        with _bar(monkeypatch, err, out) as bar:  # one bar each: each is drawn
            bar.status(line, 12, 24)
        frames |= {re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame).rstrip()
                   for frame in re.split(r"[\r\n]", err.getvalue())}
    shown = [frame for frame in frames if "eta" in frame]
    assert any(frame.startswith("verifying K=21 speculative usp4 8gpu ━") for frame in shown)
    # whole above the bar; the last without its last part ("  queued 3"), 89 columns
    assert {long, measure, measure.replace("[K4", "[K16")} <= frames, frames
    assert all(len(frame) <= 80 and "…" not in frame for frame in frames), frames
    assert all(re.search(r"\d+/24 \d:\d\d:\d\d eta ", frame) for frame in shown), shown


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "grid.toml").write_text(SMALL_GRID)
    (tmp_path / "fleet.toml").write_text(SMALL_FLEET)
    traces = tmp_path / "traces"
    for kind in ("low", "high"):  # one trace of each set: reproduce* in a second or two
        (traces / kind).mkdir(parents=True)
        name = f"{kind}_000.jsonl"
        (traces / kind / name).write_bytes((ROOT / "traces" / kind / name).read_bytes())
    return {
        "sweep": ["sweep", "--K", "4", "8", "--seeds", "2", "--duration", "10"],
        "simulate": ["simulate", "--K", "8", "--C", "0.5", "--seeds", "2", "--duration", "10"],
        "simulate --streams": ["simulate", "--K", "8", "--C", "0.3", "--streams", "2",
                               "--pools", "dit=1", "--seeds", "2", "--duration", "10"],
        "grid": ["grid", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "grid")],
        "fleet": ["fleet", str(tmp_path / "fleet.toml")],
        "reproduce": ["reproduce", "--traces", str(traces), "--out", str(tmp_path / "paper")],
        "capacity": ["capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95",
                     "2.0", "--slo-stall", "1", "--duration", "20", "--max-streams", "2",
                     "--max-seeds", "5"],
        "reproduce systems": ["reproduce", "systems", "--traces", str(traces), "--out",
                              str(tmp_path / "systems")],
        "reproduce replan-rule": ["reproduce", "replan-rule", "--traces", str(traces),
                                  "--out", str(tmp_path / "replan")],
        "measure": ["measure", "--generator", "sleep", "--cost", "fixed:0.02", "--K", "4",
                    "--policy", "baseline", "--duration", "2", "--warmup", "2",
                    "--calibrate", "0", "--out", str(tmp_path / "live")],
        "profile": ["profile", "--generator", "sleep", "--cost", "fixed:0.01", "--K", "4",
                    "--jobs", "3", "--gap", "0", "--out", str(tmp_path / "profile.json")],
        "plan": ["plan", str(_plan_file(tmp_path))],
    }


def _plan_file(tmp_path: Path) -> Path:
    from tests.test_plan import _document, _toml

    path = tmp_path / "plan.toml"
    path.write_text(_toml(_document(tmp_path, run={"seeds": 2}, search={"max_verified": 3})))
    return path


def test_reproduce_serving_gives_its_bar_the_total_before_the_first_run(tmp_path,
                                                                       monkeypatch):
    """``reproduce serving`` counts steps (an experiment, or a capacity search), every one
    known before the first run: the bar's total never changes, ``done`` only grows and
    ends at it. (A reproduction cut down to one family, SLO, margin and a few rows; its
    searches stop at 2 streams.)"""
    import latsim.cli.progress as progress
    from latsim.experiments import serving_paper

    calls: list[tuple[float, float]] = []

    class Recording(progress.ProgressBar):
        def __call__(self, done: float, total: float) -> None:
            calls.append((done, total))
            super().__call__(done, total)

    real_search = serving_paper.search_capacity
    from dataclasses import replace

    monkeypatch.setattr(progress, "ProgressBar", Recording)
    monkeypatch.setattr(serving_paper, "search_capacity",
                        lambda query, *a, **k: real_search(replace(query, max_streams=2)))
    for name, value in {"FAMILIES": ("Sol-H3",), "SLO_FACTORS": (1.0,), "MARGINS": (0.0,),
                        "SHARED_ROWS": serving_paper.SHARED_ROWS[:2], "LEAD_STREAMS": (2,),
                        "LEAD_SEEDS": 1, "LEAD_DURATION": 120.0}.items():
        monkeypatch.setattr(serving_paper, name, value)
    traces = tmp_path / "traces"
    for kind in ("low", "high"):
        (traces / kind).mkdir(parents=True)
        name = f"{kind}_000.jsonl"
        (traces / kind / name).write_bytes((ROOT / "traces" / kind / name).read_bytes())
    result = runner.invoke(app, ["reproduce", "serving", "--traces", str(traces), "--out",
                                 str(tmp_path / "serving"), "--format", "json"])
    assert result.exit_code == 0, result.output
    total = calls[0][1]
    assert {t for _, t in calls} == {total}, calls
    assert calls[0] == (0, total) and total > 0
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert calls[-1] == (total, total)
    assert len({d for d, _ in calls}) > 5  # it moves through the work, not at the end only


@pytest.mark.parametrize("name", [
    "sweep", "simulate", "simulate --streams", "grid", "fleet",
    *(pytest.param(name, marks=pytest.mark.slow) for name in ("reproduce", "reproduce systems")),
    "reproduce replan-rule", "capacity", "measure", "profile", "plan",
])
def test_each_long_command_counts_its_work_on_one_bar(name, tmp_path, monkeypatch):
    """The command reports (done, total) to one ProgressBar, ending at total (a serving
    ``simulate`` counts its ``--lead auto`` pilot runs first, then its runs; ``reproduce
    serving`` shares ``reproduce systems``' code path; ``reproduce fleet``, minutes long,
    counts its ten tables' steps and is not run here; ``measure`` counts live seconds and
    ``profile`` jobs, of the ``sleep`` generator here)."""
    import latsim.cli.progress as progress

    bars: list[tuple[str, list[tuple[int, int]]]] = []

    class Recording(progress.ProgressBar):
        def __init__(self, label: str, delay_s: float = 1.0, **options) -> None:
            super().__init__(label, delay_s, **options)
            self.calls: list[tuple[int, int]] = []
            bars.append((label, self.calls))

        def __call__(self, done: int, total: int) -> None:
            self.calls.append((done, total))
            super().__call__(done, total)

    monkeypatch.setattr(progress, "ProgressBar", Recording)
    monkeypatch.chdir(ROOT)
    command = _commands(tmp_path)[name]
    result = runner.invoke(app, [*command, *(() if name == "profile" else ("--format", "json"))])
    assert result.exit_code == 0, result.output
    assert len(bars) == 1, bars
    _, calls = bars[0]
    assert calls and calls[-1][0] == calls[-1][1] > 0, calls
    assert all(0 <= done <= total for done, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert result.stderr == ""  # off a terminal: nothing but the envelope, on stdout
    if name == "simulate --streams":  # 2 cells x 2 seeds, after at least 2 pilot runs
        assert calls[0] == (1, 2) and calls[-1][1] >= 6, calls
    if name == "plan":  # the most exact runs left, known before the first: never growing
        assert calls[0] == (0, 3) and calls[-1] == (3, 3), calls
        assert [total for _, total in calls] == sorted((t for _, t in calls), reverse=True)
