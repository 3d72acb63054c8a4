"""latsim profile: measured C per K and job kind, usable as --cost table:PATH."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from latsim.cli import app
from latsim.model.costs import load_table
from tests.helpers import rows_of


def test_profile_writes_a_cost_table_the_simulator_uses(tmp_path):
    pytest.importorskip("diffusers", reason="the live extra is not installed")
    out = tmp_path / "profile.json"
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--K", "1", "3", "--jobs", "3", "--gap", "0",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    document = json.loads(out.read_text())
    for k in ("1", "3"):
        assert {kind: len(v) for kind, v in document["costs"][k].items()} == {
            "refill": 3, "replan": 3,
        }
    table = load_table(out)
    assert table.mean(3) > 0 and table.mean(2) > 0  # K=2 interpolated between 1 and 3
    assert not table.deterministic
    sweep = runner.invoke(app, ["sweep", "--K", "1", "3", "--cost", f"table:{out}",
                                "--duration", "10", "--seeds", "2", "--json"])
    assert sweep.exit_code == 0, sweep.stderr
    rows = rows_of(sweep.stdout)
    assert rows[0]["cost"] == f"table:{out}" and rows[0]["C_mean"] == table.mean(1)


def test_profile_bad_input_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--K", "0", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    result = CliRunner().invoke(app, ["profile", "--preset", "huge"])
    assert result.exit_code == 2 and "preset" in result.stderr


def test_profile_options_are_bounded_before_any_work(tmp_path):
    """``--gap nan`` was a traceback and ``--gap 1e9`` slept forever after building the
    model; every option now has a range, checked first (one line naming it)."""
    out = str(tmp_path / "p.json")
    for args, message in (
        (["--gap", "nan"], "--gap must be >= 0 and <= 10 s, got nan"),
        (["--gap", "1e9"], "--gap must be >= 0 and <= 10 s, got 1000000000.0"),
        (["--gap", "-1"], "--gap must be >= 0 and <= 10 s"),
        (["--jobs", "0"], "--jobs must be a positive integer <= 5000"),
        (["--jobs", "5000", "--gap", "1"], "idle gaps would take 10000 s"),
        (["--steps", "0"], "--steps must be a positive integer <= 1000"),
        (["--seed", "-3"], "--seed must be an integer >= 0 and <= 4294967295"),
        (["--K", "5000"], "--K must be a positive integer <= 4096"),
    ):
        result = CliRunner().invoke(app, ["profile", *args, "--out", out])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def test_live_commands_say_which_extra_is_missing(monkeypatch):
    """With torch hidden (only torch: the message names what else is missing, too)."""
    pytest.importorskip("diffusers", reason="the live extra is not installed")
    import importlib.util

    from latsim.errors import install_hint

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    for command in ("measure", "profile"):
        result = CliRunner().invoke(app, [command, "--K", "2"])
        assert result.exit_code == 2
        assert result.stderr.strip() == ("latsim: error: generator wan needs torch: "
                                         f"install the live extra, {install_hint('live')}")
