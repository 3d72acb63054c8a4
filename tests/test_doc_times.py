"""The wall times the README and docs/ give for commands are the measured ones.

Every such time comes from a committed benchmark file: ``results/bench/commands.json``
(bench/bench_commands.py) for the commands, ``results/bench/fleet_target.json``
(bench/bench_fleet.py) for the 10,000-viewer fleet, ``results/bench/plan_target.json``
(bench/bench_plan.py --target) for the Wan plan. A document quotes a row in the form
``bench_commands.quote`` writes; this test checks every quote against its file, and that
no document quotes the file with a time no row holds.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "bench"))
from bench_commands import COMMANDS, quote  # noqa: E402

COMMANDS_JSON = ROOT / "results" / "bench" / "commands.json"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _rows() -> list[dict]:
    return json.loads(COMMANDS_JSON.read_text())["rows"]


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row["command"])
def test_each_measured_command_is_quoted_with_its_median_where_it_says(row):
    assert row["quoted_in"], f"{row['command']}: quoted nowhere"
    for name in row["quoted_in"]:
        assert quote(row) in (ROOT / name).read_text(), f"{name}: quote {quote(row)!r}"


def test_every_benchmarked_command_has_a_row_and_no_document_quotes_a_stale_one():
    rows = _rows()
    assert [row["command"] for row in rows] == [command for command, _, _ in COMMANDS]
    quoted = sum(len(row["quoted_in"]) for row in rows)
    cited = sum(doc.read_text().count("results/bench/commands.json)") for doc in DOCUMENTS)
    assert cited == quoted, "a document quotes results/bench/commands.json with no row"


def test_the_fleet_targets_times_are_the_benchmarks():
    rows = json.loads((ROOT / "results" / "bench" / "fleet_target.json").read_text())["rows"]
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"10,000 viewers for a simulated hour take ([0-9.]+) minutes sharded on"
                      r"\s+2 cores, ([0-9.]+) with the compiled build", readme)
    assert found, "README: the 10,000-viewer fleet's times"
    for build, quoted in (("pure Python", found.group(1)),
                          ("compiled with mypyc", found.group(2))):
        walls = [row["wall_s"] for row in rows if row["build"] == build
                 and row["mode"] == "sharded" and row["viewers"] == 10_000 and row["jobs"] == 2]
        assert walls, build
        assert quoted == f"{statistics.median(walls) / 60:.1f}", build


def test_the_plan_targets_times_are_the_benchmarks():
    rows = json.loads((ROOT / "results" / "bench" / "plan_target.json").read_text())["rows"]
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"takes ([0-9.]+) minutes on 2\s+cores, ([0-9.]+) with the compiled "
                      r"build \(wall, one run of each of `bench/bench_plan.py", readme)
    assert found, "README: the Wan plan's times"
    for build, quoted in (("pure Python", found.group(1)),
                          ("compiled with mypyc", found.group(2))):
        (wall,) = [row["wall_s"] for row in rows if row["build"] == build]
        assert quoted == f"{wall / 60:.1f}", build
