"""What commands print as results: the JSON envelope (one shape for every command, checked
against docs/envelope.schema.json), --format csv, and the format options' errors."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim import __version__
from latsim.cli.root import app
from tests.helpers import SMALL_FLEET, SMALL_GRID, envelope_of

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

#: tests/helpers.SMALL_GRID with its own seed
GRID = "seed = 3\n" + SMALL_GRID

#: the smallest deployment search: one candidate, one short exact run
PLAN = """
[workload]
arrivals = "poisson:0.05"
duration = "exponential:80"
updates = "poisson:0.1"
[node]
cost = "fixed:0.3"
r = 4
fps = 16
pools = "dit=2"
[fleet]
usd_per_gpu_hour = 2.0
[run]
duration = 120
seeds = 1
[search]
K = [2]
policies = ["speculative"]
usp = [1]
gpus_per_node = [2]
max_sessions = 6
[slo]
l95 = 2.5
stall_pct = 0.5
ttfc_p95 = 3.0
"""


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET)
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    return {
        "simulate": ["simulate", "--K", "8", "--C", "0.5", "--seeds", "2", "--duration", "20"],
        "sweep": ["sweep", "--K", "4", "8", "--seeds", "2", "--duration", "20"],
        "serving": ["simulate", "--K", "8", "--C", "0.9", "--streams", "2", "--pools",
                    "dit=1", "--seeds", "2", "--duration", "20"],
        "theory": ["theory", "--K", "8", "--C", "0.5", "--rate", "0.1"],
        "plugins": ["plugins"],
        "capacity": ["capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95",
                     "2.0", "--slo-stall", "1", "--duration", "20", "--max-streams", "2",
                     "--max-seeds", "5", "--out", str(tmp_path / "capacity")],
        "compare": ["compare", "results/compare/runs", "--replications", "2"],
        "compare-viewer": ["compare", "results/serve/runs", "--replications", "2"],
        "grid": ["grid", str(grid), "--out", str(tmp_path / "grid")],
        "traces-show": ["traces", "show", "traces/high"],
        "reproduce": ["reproduce", "--out", str(tmp_path / "paper")],
        "fleet": ["fleet", "run", str(fleet), "--out", str(tmp_path / "fleet")],
        "fleet-plan": ["fleet", "plan", str(fleet), "--slo-l95", "5", "--slo-stall", "5",
                       "--slo-ttfc", "30", "--max-nodes", "3", "--seeds", "2"],
        "plan": ["plan", str(plan), "--out", str(tmp_path / "plan")],
        "profile": ["profile", "--generator", "sleep", "--cost", "fixed:0.01", "--K", "4",
                    "--jobs", "3", "--out", str(tmp_path / "profile")],
    }


NAMES = ["simulate", "sweep", "serving", "theory", "plugins", "capacity", "compare",
         "compare-viewer", "grid", "traces-show", "reproduce", "fleet", "fleet-plan", "plan",
         "profile"]
#: commands whose second run differs by design: a grid or a plan resumes, reproduce is long,
#: profile measures the wall clock
RUN_ONCE = ("grid", "reproduce", "plan", "fleet", "profile")


def _schema():
    import jsonschema

    schema = json.loads((ROOT / "docs" / "envelope.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)  # 9 s
                                  if name == "reproduce" else name for name in NAMES])
def test_every_command_prints_the_envelope(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = _commands(tmp_path)[name]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = envelope_of(result.stdout)
    assert payload["latsim"] == __version__ and payload["envelope"] == 1
    assert payload["command"] == ["latsim", *args, "--format", "json"]
    assert payload["rows"] and all(isinstance(row, dict) for row in payload["rows"])
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _schema().iter_errors(payload)]
    assert not errors, errors[:5]
    if name not in RUN_ONCE:
        assert result.stdout == runner.invoke(app, [*args, "--format", "json"]).stdout
    if name in ("simulate", "sweep", "serving", "capacity", "compare", "grid"):
        assert isinstance(payload["seed"], int)


def test_json_is_the_same_as_format_json_and_rows_are_a_list_even_for_one():
    args = ["simulate", "--K", "8", "--C", "0.5", "--policy", "speculative", "--seeds", "2",
            "--duration", "20"]
    alias = envelope_of(runner.invoke(app, [*args, "--json"]).stdout)
    named = envelope_of(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert alias["rows"] == named["rows"] and len(alias["rows"]) == 1


def test_files_a_command_writes_hold_the_envelope_too(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = _commands(tmp_path)["capacity"]
    printed = envelope_of(runner.invoke(app, [*args, "--json"]).stdout)
    written = envelope_of((tmp_path / "capacity" / "capacity.json").read_text())
    assert written == printed and written["max_streams"] is not None
    for committed in ("results/compare/compare.json", "results/serve/compare_viewer.json"):
        assert envelope_of((ROOT / committed).read_text())["rows"]


def test_capacity_rows_name_their_errors_and_counts_like_the_simulators():
    result = runner.invoke(app, ["capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1",
                                 "--slo-l95", "2.0", "--slo-stall", "1", "--duration", "20",
                                 "--max-streams", "2", "--max-seeds", "5", "--json"])
    row = envelope_of(result.stdout)["rows"][0]
    assert {"L95_se", "viewer_stall_pct_se", "n_runs", "L95_lo", "L95_hi",
            "viewer_stall_pct_lo", "viewer_stall_pct_hi"} <= set(row)


def test_csv_has_one_row_per_result_row_and_flat_columns():
    args = ["simulate", "--K", "8", "--C", "0.9", "--streams", "2", "--pools", "dit=1,vae=1",
            "--decode", "fixed:0.05", "--seeds", "2", "--duration", "20"]
    rows = envelope_of(runner.invoke(app, [*args, "--json"]).stdout)["rows"]
    result = runner.invoke(app, [*args, "--format", "csv"])
    assert result.exit_code == 0, result.output
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["policy"] for r in table] == [r["policy"] for r in rows]
    assert not any(cell.startswith("{") for r in table for cell in r.values())
    for parsed, row in zip(table, rows, strict=True):
        assert float(parsed["busy_pct_by_pool.vae"]) == row["busy_pct_by_pool"]["vae"]
        assert float(parsed["L50"]) == row["L50"]


@pytest.mark.parametrize(("args", "message"), [
    (["theory", "--K", "8", "--C", "0.5", "--format", "yaml"],
     "--format must be one of table, csv, json, got 'yaml'"),
    (["theory", "--K", "8", "--C", "0.5", "--format", "csv", "--json"],
     "--json asks for json but --format says csv; give one"),
])
def test_a_bad_format_is_one_line_before_any_work(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"latsim: error: {message}\n"


def test_created_is_now_in_utc_or_source_date_epoch(monkeypatch):
    from latsim.cli.output import created

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")
    assert created() == "1970-01-02T00:00:00Z"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = datetime.strptime(created(), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= stamp <= datetime.now(UTC)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    result = runner.invoke(app, ["plugins", "--json"])
    assert result.exit_code == 2 and "SOURCE_DATE_EPOCH must be whole seconds" in result.stderr


def test_the_schema_refuses_what_is_not_the_envelope():
    validator = _schema()
    command = ["latsim", "simulate", "--K", "8", "--C", "0.5", "--seeds", "2", "--duration",
               "20"]
    good = envelope_of(runner.invoke(app, [*command[1:], "--json"]).stdout)
    validator.validate(good)
    row = good["rows"][0]
    for bad in ([row], {**good, "rows": row}, {**good, "envelope": 2},
                {k: v for k, v in good.items() if k != "created"},
                {**good, "command": command[1:]}, {**good, "created": "yesterday"}):
        assert not validator.is_valid(bad), bad


@pytest.mark.parametrize(("change", "command"), [
    ({"L_basis": None}, None),                      # a row without its basis
    ({"K": "8"}, None),                             # a count as a string
    ({"stall_pct": -0.5}, None),                    # a negative percentage
    ({"n_streams": 2}, None),                       # a serving row without its pools
    ({}, ["latsim", "theory", "--K", "8"]),         # another command's rows
    ({}, ["latsim", "fleet", "plan", "f.toml"]),
    ({}, ["latsim", "plan", "f.toml"]),
])
def test_each_commands_rows_are_checked_for_their_keys_and_types(change, command):
    """The schema names each command's row keys and types: a row of simulate's shape passes
    only under simulate, and only whole."""
    args = ["simulate", "--K", "8", "--C", "0.5", "--seeds", "2", "--duration", "20"]
    good = envelope_of(runner.invoke(app, [*args, "--json"]).stdout)
    row = {k: v for k, v in {**good["rows"][0], **change}.items() if v is not None}
    bad = {**good, "rows": [row], "command": command or good["command"]}
    assert not _schema().is_valid(bad)
