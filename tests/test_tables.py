"""``--format table`` of every command not in tests/test_cli.py's table test (sweep, serving
simulate, compare, capacity), at ``COLUMNS=80`` and ``120``: no number cut to "…", and the
tables drawn with latsim.cli.tables fit the width."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim.cli import app
from tests.helpers import SMALL_FLEET, SMALL_GRID

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
CUT_NUMBER = re.compile(r"\d…|…\d")



#: Commands whose tables ignore COLUMNS (expected failures; none now: reproduce's report
#: went through latsim.cli.tables last). A name here that fits fails the test.
TOO_WIDE: set[str] = set()

#: name -> (arguments, what the output must show, whether it prints a table that must fit
#: the width: the plain-text reports are lines, which a terminal wraps)
CASES: dict[str, tuple[list[str], tuple[str, ...], bool]] = {
    "simulate": (["simulate", "--K", "8", "--C", "0.5", "--seeds", "2", "--duration", "20"],
                 (" policy ", " L50 "), True),
    "theory": (["theory", "--K", "8", "--C", "0.5", "--rate", "0.1"],
               ("speculative_L_mean", "0.6562"), True),
    "plugins": (["plugins"], ("affine", "round-robin"), False),
    "controller": (["controller"], ("register_condition", "    new version pending"), False),
    "traces show": (["traces", "show", "traces/high"], ("30 trace(s)", "mean 7.30"), False),
    "grid": (["grid", "{tmp}/grid.toml", "--out", "{tmp}/grid"], ("2/2 cells",), False),
    "compare viewer": (["compare", "results/serve/runs", "--replications", "2"],
                       (" run ", " L50 ", " MAPE ", "v4-baseline"), True),
    "fleet": (["fleet", "{tmp}/fleet.toml", "--seeds", "1"], ("condition L95 (s)",), True),
    "fleet plan": (["fleet", "plan", "{tmp}/fleet.toml", "--slo-l95", "3", "--slo-stall", "5",
                    "--seeds", "1", "--max-nodes", "4"], ("static nodes", " speculative "),
                   True),
    "reproduce": (["reproduce", "--traces", "{tmp}/traces", "--out", "{tmp}/out"],
                  ("Work amplification A", "Wan1.3B long"), True),
    "reproduce serving": (["reproduce", "serving", "--traces", "{tmp}/traces", "--out",
                           "{tmp}/out"], ("Sol-H3 short", " stall % "), True),
    "reproduce systems": (["reproduce", "systems", "--traces", "{tmp}/traces", "--out",
                           "{tmp}/out"], ("Wave Forcing", " figure "), True),
    "reproduce replan-rule": (["reproduce", "replan-rule", "--traces", "{tmp}/traces",
                               "--out", "{tmp}/out"], (" dL se ", "Sol-H3 short"), True),
    "measure": (["measure", "--generator", "sleep", "--cost", "fixed:0.04", "--K", "2",
                 "--duration", "2", "--rate", "1", "--warmup", "3", "--calibrate", "2",
                 "--policy", "speculative", "--out", "{tmp}/runs"],
                (" L50 ", " speculative ", "run folders: "), True),
    "profile": (["profile", "--generator", "sleep", "--cost", "fixed:0.01", "--K", "4", "8",
                 "--jobs", "2", "--gap", "0", "--out", "{tmp}/profile.json"],
                (" refill ", " replan ", " p99 ms ", "wrote "), True),
}
#: Commands that print lines, not tables, each of which must fit the width.
LINES_FIT = {"controller", "traces show"}
SLOW = {"reproduce serving": "6 s a width", "measure": "a live run of 2 s plus warm-up",
        "reproduce systems": "8 s a width", "reproduce": "5 s a width"}


def _case(name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(name, marks=marks, id=name.replace(" ", "-"))


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", [_case(name) for name in CASES])
def test_tables_never_cut_a_number(name, columns, tmp_path, monkeypatch):
    args, shown, fits = CASES[name]
    (tmp_path / "grid.toml").write_text(SMALL_GRID)
    (tmp_path / "fleet.toml").write_text(SMALL_FLEET)
    for kind in ("low", "high"):  # one trace of each set: reproduce* in seconds
        (tmp_path / "traces" / kind).mkdir(parents=True)
        trace = f"{kind}_000.jsonl"
        (tmp_path / "traces" / kind / trace).write_bytes(
            (ROOT / "traces" / kind / trace).read_bytes())
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, [arg.replace("{tmp}", str(tmp_path)) for arg in args])
    assert result.exit_code == 0, result.output
    assert not CUT_NUMBER.search(result.stdout), CUT_NUMBER.search(result.stdout)
    for text in shown:
        assert text in result.stdout, text
    if name in LINES_FIT:
        widest_line = max(result.stdout.splitlines(), key=len)
        assert len(widest_line) <= columns, widest_line
    for line in result.stdout.splitlines():  # a "wrote ..." line wraps at the width
        if line.startswith("wrote "):  # (a path longer than it stays whole on its line)
            assert len(line) <= columns or " " not in line[len("wrote "):], line
    if not fits:
        return
    widest = max((line for line in result.stdout.splitlines() if set(line) & set("│┃━─")),
                 key=len)  # a table's rules and rows (a "wrote PATH" line may be longer)
    if name in TOO_WIDE:
        if len(widest) > columns:
            pytest.xfail(f"{name}'s tables do not follow COLUMNS ({len(widest)} wide)")
        pytest.fail(f"{name} fits {columns} columns now: take it out of TOO_WIDE")
    assert len(widest) <= columns, widest
