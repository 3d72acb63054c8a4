"""The wall times the README and docs/ give for commands are the measured ones.

Every such time comes from a committed benchmark file: ``results/bench/commands.json``
(bench/bench_commands.py) for the commands, ``results/bench/fleet_target.json``
(bench/bench_fleet.py) for the 10,000-viewer fleet, ``results/bench/plan_target.json``
(bench/bench_plan.py --target) for the Wan plan, ``results/bench/serving_jobs.json``
(bench/bench_serving.py --json) for the serving engine's jobs per CPU second and per-slot
growth, ``compiled.json``, ``memory.json`` and ``floor.json`` (bench/bench_compiled.py,
bench_memory.py and bench_floor.py with ``--json``) and ``lead_cost.json``
(bench/pilot_cost.py --example) for the rest of the engine table. A document
quotes a row in the form ``bench_commands.quote`` writes; this test checks every quote
against its file, and that no document quotes the file with a time no row holds.
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


def _quoted_minutes(pattern: str, what: str) -> dict[str, str]:
    """The two times (pure Python, then compiled) the README quotes as ``pattern``'s
    groups, by build."""
    found = re.search(pattern, (ROOT / "README.md").read_text())
    assert found, f"README: {what}"
    return {"pure Python": found.group(1), "compiled with mypyc": found.group(2)}


def _target_rows(name: str) -> list[dict]:
    return json.loads((ROOT / "results" / "bench" / name).read_text())["rows"]


def test_the_fleet_targets_times_are_the_benchmarks():
    rows = _target_rows("fleet_target.json")
    quoted = _quoted_minutes(
        r"10,000 viewers for a simulated hour take ([0-9.]+) minutes "
        r"sharded on\s+2 cores, ([0-9.]+) with the compiled build", "the 10,000-viewer fleet")
    for build, minutes in quoted.items():
        walls = [row["wall_s"] for row in rows if row["build"] == build
                 and row["mode"] == "sharded" and row["viewers"] == 10_000 and row["jobs"] == 2]
        assert walls, build
        assert minutes == f"{statistics.median(walls) / 60:.1f}", build


def test_the_plan_targets_times_are_the_benchmarks():
    rows = _target_rows("plan_target.json")
    quoted = _quoted_minutes(
        r"takes ([0-9.]+) minutes on 2\s+cores, ([0-9.]+) with the "
        r"compiled build \(wall, one run of each of `bench/bench_plan.py", "the Wan plan")
    for build, minutes in quoted.items():
        (wall,) = [row["wall_s"] for row in rows if row["build"] == build]
        assert minutes == f"{wall / 60:.1f}", build


def test_the_plans_surrogate_error_table_is_the_benchmarks():
    """docs/plan.md's table of the surrogate's error by candidate class is what
    bench/plan_surrogate.py wrote to results/bench/plan_surrogate.json."""
    from plan_surrogate import markdown

    rows = _target_rows("plan_surrogate.json")
    assert rows and all(row["candidates"] for row in rows)
    assert markdown(rows) in (ROOT / "docs" / "plan.md").read_text()


def test_the_hostile_input_corpus_figures_are_the_benchmarks():
    """docs/testing.md's figures of the hostile-input corpus (issue 51) are what the full
    bench/hostile_inputs.py (not --quick) wrote to results/bench/hostile_inputs.json, and
    the corpus held no bad outcome."""
    from hostile_inputs import BAD, CLASSES, quote

    report = json.loads((ROOT / "results" / "bench" / "hostile_inputs.json").read_text())
    assert report["bench"] == "bench/hostile_inputs.py", "a --quick run is not the corpus"
    assert sum(report["classes"][name] for name in CLASSES) == report["inputs"]
    assert sum(sum(row.values()) for row in report["by_command"].values()) == report["inputs"]
    assert report["bad"] == sum(report["classes"][name] for name in BAD)
    assert len(report["bad_outcomes"]) == report["bad"]
    assert quote(report) in " ".join((ROOT / "docs" / "testing.md").read_text().split())


def _engine_row(start: str) -> list[str]:
    """The cells of docs/testing.md's engine table row that starts with ``start``."""
    (row,) = [line for line in (ROOT / "docs" / "testing.md").read_text().splitlines()
              if line.startswith(start)]
    return row.split(" | ")


#: The builds a bench file holds a row of each.
BUILDS = ("pure Python", "compiled with mypyc")


def test_the_serving_engines_jobs_table_is_the_benchmarks():
    """docs/testing.md's table of jobs per CPU second against plain SimPy is what
    bench/bench_serving.py --json wrote, for both builds, both stream counts and both
    condition rates, and the engine table's rows quote the same figures."""
    from bench_serving import RATES, WAYS, markdown_jobs

    rows = _target_rows("serving_jobs.json")
    assert {(row["build"], row["streams"], row["conditions_per_s"]) for row in rows} == {
        (build, streams, rate) for build in BUILDS for streams in (256, 1024) for rate in RATES}
    assert all(set(row["ratio"]) == set(WAYS) for row in rows)
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert markdown_jobs(rows) in testing
    for rate, start, way in ((0.0, "| serving jobs/s, periodic", "event path"),
                             (0.0, "| the same workload (no conditions)", "in numpy"),
                             (0.1, "| the same workload with conditions", "in numpy")):
        ratio = {(row["build"], row["streams"], row["conditions_per_s"]): row["ratio"][way]
                 for row in rows}
        cells = _engine_row(start)
        assert (f"{ratio['pure Python', 256, rate]:.2f} at 256 streams, "
                f"{ratio['pure Python', 1024, rate]:.2f} at 1,024") in cells[2]
        assert (f"{ratio['compiled with mypyc', 256, rate]:.2f} / "
                f"{ratio['compiled with mypyc', 1024, rate]:.2f}") in cells[3]


def test_the_serving_engines_growth_rows_are_the_benchmarks():
    """The engine table's µs-per-slot rows (4,096 streams against the smallest count, with
    and without the VAE stage) and the 4,096-stream VAE run's CPU seconds, in the bulk
    loop and on the event path, are what bench/bench_serving.py --json wrote to
    serving_growth.json, for both builds."""
    from bench_serving import GROWTH

    rows = _target_rows("serving_growth.json")
    assert {(row["build"], row["workload"], row["streams"]) for row in rows} == {
        (build, label, streams) for build in BUILDS
        for label, _, _, counts in GROWTH for streams in counts}
    grown = {(row["build"], row["workload"], row["streams"]): row for row in rows}
    for start, key, figure in (("| µs per slot, 4,096 ÷ 16", "DiT only", "ratio_to_first"),
                               ("| the same with the VAE stage", "DiT + VAE", "ratio_to_first"),
                               ("| 4,096 streams × 60 s with the VAE", "DiT + VAE", "cpu_s")):
        cells = _engine_row(start)
        for build, cell in zip(BUILDS, cells[2:4], strict=True):
            row = grown[build, key, 4096]
            assert cell.startswith(f"{row[figure]:.2f}"), (start, build)
            # and the event path's, timed beside it
            assert f"the event path {row['event_path_' + figure]:.2f}" in cell, (start, build)


def test_the_engine_tables_other_rows_are_the_benchmarks():
    """The engine table's rows for one stream (bench/bench_compiled.py --json), peak memory
    (bench/bench_memory.py --json, each build), ``latsim --help`` (bench_commands.py) and
    what bounds the event path (bench/bench_floor.py --json) quote their files."""
    compiled = {row["build"]: row for row in _target_rows("compiled.json")}
    memory = {(row["build"], row["workload"]): row for row in _target_rows("memory.json")}
    (floor,) = [row for row in _target_rows("floor.json") if row["build"] == "pure Python"]
    assert set(compiled) == set(BUILDS)
    assert set(memory) == {(build, workload) for build in BUILDS
                           for workload in ("dit", "dit+vae")}
    assert all((row["streams"], row["duration"], row["records"]) == (4096, 600.0, "none")
               for row in memory.values())
    one = _engine_row("| one stream, K = 4")
    peak = _engine_row("| peak memory, 4,096 streams")
    for build, column in zip(BUILDS, (2, 3), strict=True):
        figures = [compiled[build][f"one stream K=4 every {every} s / bare SimPy"]
                   for every in (1000, 10)]
        assert one[column].startswith("{:.2f} / {:.2f}".format(*figures)), (build, one)
        assert peak[column].startswith(
            f"{memory[build, 'dit']['peak_mib']:.0f} / "
            f"{memory[build, 'dit+vae']['peak_mib']:.0f} MiB"), (build, peak)
    # the same runs in both builds give the same numbers (the row says so)
    assert all(memory[BUILDS[0], workload]["L95"] == memory[BUILDS[1], workload]["L95"]
               for workload in ("dit", "dit+vae"))
    assert "L95s are equal to the last digit" in peak[4]
    (help_row,) = [row for row in _rows() if row["command"] == "latsim --help"]
    assert _engine_row("| `latsim --help`")[2].startswith(f"{help_row['cpu_s_median']:.2f} s")
    bound = _engine_row("| serving jobs/s, periodic")[4]
    assert (f"plain SimPy's {floor['plain_us_per_job']:.1f} µs a job plus the controller's "
            f"own {floor['controller_us_per_job_K8']:.1f} µs") in bound, bound
    assert f"at most {floor['most_of_plain_jobs_per_s']:.2f} pure" in bound, bound
    growth = _engine_row("| µs per slot, 4,096 ÷ 16")[4]
    assert f"SimPy's heap of N timers alone grows {floor['heap_growth']:.2f}×" in growth
    fleet = _engine_row("| 10,000 viewers × 1 h")
    walls = {build: [row["wall_s"] / 60 for row in _target_rows("fleet_target.json")
                     if row["build"] == build and row["mode"] == "sharded"
                     and row["viewers"] == 10_000 and row["jobs"] == 2] for build in BUILDS}
    assert fleet[2].startswith(" and ".join(f"{m:.1f}" for m in walls["pure Python"]) + " min")
    assert fleet[3].startswith(" and ".join(f"{m:.1f}" for m in walls["compiled with mypyc"])
                               + " min")


def test_the_lead_targets_ratio_is_the_benchmarks():
    """The engine table's row for ``--lead auto``'s cost on the issue's 4,096-stream
    example quotes bench/pilot_cost.py --example's file, each build's median ratio."""
    rows = {row["build"]: row for row in _target_rows("lead_cost.json")}
    assert set(rows) == set(BUILDS)
    cells = _engine_row("| `--lead auto`'s cost")
    for build, column in zip(BUILDS, (2, 3), strict=True):
        assert cells[column].startswith(f"{rows[build]['wall_ratio']:.2f}"), (build, cells)
        assert rows[build]["lead_model"].startswith("pilot run of")
