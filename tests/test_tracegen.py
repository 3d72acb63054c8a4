"""Trace generation (counts, determinism) and `latsim traces generate|validate|show`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from latsim.cli import app
from latsim.errors import LatsimError
from latsim.experiments.tracegen import (
    BURST_RATE_HZ,
    CANONICAL_SETS,
    COUNT_RANGES,
    PAUSE_S,
    generate_set,
    max_conditions,
    summarize_set,
)
from latsim.model.traces import load_trace, validate_trace
from tests.helpers import row_of

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.mark.parametrize("kind", ["low", "high"])
@pytest.mark.parametrize("seed", [0, 1, 2, 17])
def test_counts_within_the_papers_ranges(kind: str, seed: int) -> None:
    lo, hi = COUNT_RANGES[kind]
    traces = generate_set(kind, 60, 60.0, seed)
    counts = [len(t.times) for t in traces]
    assert min(counts) >= lo and max(counts) <= hi
    assert len(set(counts)) > 1  # the count itself is drawn, not fixed
    for t in traces:
        assert list(t.times) == sorted(t.times)
        assert all(0 <= x < 60.0 for x in t.times)


def test_continuous_steering_has_bursts_and_pauses() -> None:
    for trace in generate_set("continuous", 10, 60.0, 3):
        gaps = np.diff(trace.times)
        assert gaps.min() >= 0.7 / BURST_RATE_HZ[1] - 1e-3  # never faster than 4 Hz (+jitter)
        assert (gaps >= PAUSE_S[0]).any()  # at least one pause
        assert (gaps <= 1.3 / BURST_RATE_HZ[0]).sum() > len(gaps) / 2  # mostly in bursts
        assert all(0 <= x < 60.0 for x in trace.times)


def test_generation_is_deterministic_and_seeded() -> None:
    a = generate_set("high", 30, 60.0, 5)
    assert a == generate_set("high", 30, 60.0, 5)
    assert a != generate_set("high", 30, 60.0, 6)
    assert a[:10] == generate_set("high", 10, 60.0, 5)  # trace i does not depend on count
    assert generate_set("low", 5, 30.0, 5)[0].meta["duration"] == 30.0


def test_cli_generate_is_byte_identical(tmp_path: Path) -> None:
    for name in ("a", "b"):
        result = runner.invoke(app, ["traces", "generate", "--kind", "continuous", "--count",
                                     "3", "--seed", "9", "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["continuous_000.jsonl", "continuous_001.jsonl", "continuous_002.jsonl"]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("kind", sorted(CANONICAL_SETS))
def test_committed_sets_are_the_canonical_generation(tmp_path: Path, kind: str) -> None:
    count, duration, seed = CANONICAL_SETS[kind]
    result = runner.invoke(app, ["traces", "generate", "--kind", kind, "--count", str(count),
                                 "--duration", str(duration), "--seed", str(seed),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0
    committed = sorted((ROOT / "traces" / kind).glob("*.jsonl"))
    assert len(committed) == count
    for path in committed:
        assert path.read_bytes() == (tmp_path / path.name).read_bytes()


def test_bad_kind_is_one_line_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["traces", "generate", "--kind", "medium", "--out",
                                 str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown trace kind 'medium'" in result.output
    assert "Traceback" not in result.output


BAD_CASES = {
    "not_json": ('{"t": 1.0}\n{t: 2}\n', 2, "not JSON"),
    "missing_t": ('{"t": 1.0}\n{"version": 2}\n', 2, 'missing "t"'),
    "negative_t": ('{"t": -0.5}\n', 1, 'negative "t"'),
    "unsorted": ('{"t": 5.0}\n{"t": 4.0}\n', 2, "unsorted"),
    "beyond_duration": ('{"meta": {"duration": 10}}\n{"t": 3}\n{"t": 12.5}\n', 3,
                        "beyond the declared duration"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_validate_reports_file_and_line(tmp_path: Path, case: str) -> None:
    text, line, message = BAD_CASES[case]
    path = tmp_path / f"{case}.jsonl"
    path.write_text(text)
    result = runner.invoke(app, ["traces", "validate", str(path)])
    assert result.exit_code != 0
    assert f"{path}:{line}: " in result.output
    assert message in result.output


def test_validate_folder_reports_every_problem(tmp_path: Path) -> None:
    for case, (text, _, _) in BAD_CASES.items():
        (tmp_path / f"{case}.jsonl").write_text(text)
    (tmp_path / "good.jsonl").write_text('{"t": 1.0}\n')
    (tmp_path / "many.jsonl").write_text('{"meta": {"duration": 5}}\n{"t": 6}\n{"t": 7}\n')
    result = runner.invoke(app, ["traces", "validate", str(tmp_path)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    for case, (_, line, message) in BAD_CASES.items():
        prefix = f"{tmp_path / case}.jsonl:{line}: "
        assert any(x.startswith(prefix) and message in x for x in lines), case
    assert f"{tmp_path / 'many.jsonl'}:2:" in result.output
    assert f"{tmp_path / 'many.jsonl'}:3:" in result.output
    assert "good.jsonl" not in result.output


def test_validate_accepts_the_committed_sets() -> None:
    for kind in CANONICAL_SETS:
        result = runner.invoke(app, ["traces", "validate", str(ROOT / "traces" / kind)])
        assert result.exit_code == 0, result.output


def test_validate_missing_path_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["traces", "validate", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such file or folder" in result.output


def test_show_summarises_a_set() -> None:
    folder = ROOT / "traces" / "high"
    result = runner.invoke(app, ["traces", "show", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    shown = row_of(result.stdout)
    traces = [load_trace(p) for p in sorted(folder.glob("*.jsonl"))]
    counts = [len(t.times) for t in traces]
    gaps = np.concatenate([np.diff(t.times) for t in traces])
    assert shown["count"] == len(traces) == 30
    assert shown["updates_min"] == min(counts) and shown["updates_max"] == max(counts)
    assert shown["updates_mean"] == pytest.approx(np.mean(counts))
    assert shown["gap_n"] == gaps.size
    assert shown["gap_mean"] == pytest.approx(gaps.mean())
    assert shown["gap_median"] == pytest.approx(np.median(gaps))
    text = runner.invoke(app, ["traces", "show", str(folder)])
    assert text.exit_code == 0
    assert "30 trace(s)" in text.output and "inter-arrival" in text.output


def test_summarize_set_without_gaps() -> None:
    summary = summarize_set([(1.0,), (2.0,)], [60.0, 60.0])
    assert summary.gap_n == 0 and summary.gap_mean is None
    assert summary.rate_per_min == pytest.approx(1.0)


# ---------------------------------------------------------------- bounded inputs


@pytest.mark.parametrize("kind, count, duration, seed, message", [
    ("low", 0, 60.0, 0, "count must be a positive integer"),
    ("low", 10**9, 60.0, 0, "count must be a positive integer <= 100000"),
    ("low", 3, float("nan"), 0, "duration must be a positive number in [1, 1e+06] s"),
    ("high", 3, 0.001, 0, "duration must be a positive number in [1,"),  # used to loop
    ("continuous", 3, 1e308, 0, "duration must be a positive number in [1,"),
    ("continuous", 3, 1e6, 0, "raise it with --max-events"),
    ("low", 3, 60.0, -1, "seed must be an integer >= 0"),
    ("low", 3, 60.0, 2**64, "seed must be an integer >= 0"),
])
def test_generate_refuses_out_of_range_sets_before_drawing(kind, count, duration, seed,
                                                           message):
    with pytest.raises(LatsimError) as info:
        generate_set(kind, count, duration, seed)
    assert message in str(info.value)


@pytest.mark.parametrize("kind", sorted(CANONICAL_SETS))
@pytest.mark.parametrize("duration", [1.0, 7.5, 60.0, 600.0])
def test_max_conditions_bounds_every_generated_trace(kind, duration):
    bound = max_conditions(kind, duration)
    for trace in generate_set(kind, 20, duration, 11):
        assert len(trace.times) <= bound
        assert all(0 <= t < duration for t in trace.times)


def test_generate_work_bound_is_the_flag(tmp_path):
    args = ["traces", "generate", "--kind", "continuous", "--count", "10", "--out",
            str(tmp_path)]
    refused = runner.invoke(app, [*args, "--max-events", "100"])
    assert refused.exit_code == 2 and "--max-events" in refused.stderr
    assert not list(tmp_path.iterdir())
    assert runner.invoke(app, [*args, "--max-events", "5000"]).exit_code == 0


@pytest.mark.parametrize("text, problem", [
    ("", "empty: no header and no conditions"),
    ("\n  \n", "empty: no header and no conditions"),
    ('{"t": ' + "1" * 5000 + "}\n", "not usable JSON"),
    ('{"t": ' + "1" * 400 + "}\n", '"t" must be a finite number'),
    ("[" * 100_000 + "\n", "not usable JSON"),
    ('{"t": NaN}\n', '"t" must be a finite number'),
    ('{"meta": {"duration": NaN}}\n{"t": 1}\n', "meta duration must be a positive number"),
    ('{"meta": {"duration": 1e300}}\n{"t": 1}\n', "meta duration must be a positive number"),
    ('{"meta": {"duration": ' + "9" * 400 + '}}\n', "meta duration must be a positive number"),
])
def test_hostile_traces_are_problems_not_crashes(tmp_path, text, problem):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    problems = validate_trace(path)
    assert problems and problem in problems[0]
    with pytest.raises(LatsimError):
        load_trace(path)
    result = runner.invoke(app, ["traces", "validate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_header_only_trace_is_valid_and_shows_no_gaps(tmp_path):
    path = tmp_path / "quiet.jsonl"
    path.write_text('{"meta": {"duration": 30}}\n')
    assert validate_trace(path) == []
    assert load_trace(path).times == () and load_trace(path).duration == 30.0
    shown = runner.invoke(app, ["traces", "show", str(path)])
    assert shown.exit_code == 0
    assert "inter-arrival: none (no trace has two updates)" in shown.output


def test_trace_reading_is_bounded(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(f'{{"t": {i}}}\n' for i in range(50)))
    assert validate_trace(path, max_events=50) == []
    problems = validate_trace(path, max_events=10)
    assert problems == [f"{path}:11: more than 10 conditions; not read further (raise the "
                        "bound with --max-events)"]
    result = runner.invoke(app, ["traces", "show", str(path), "--max-events", "10"])
    assert result.exit_code == 2 and "--max-events" in result.stderr
    assert runner.invoke(app, ["traces", "validate", str(path), "--max-events",
                               "0"]).exit_code == 2
    with pytest.raises(LatsimError, match="larger than"):
        load_trace("/dev/zero")


def test_generate_states_the_rate_a_shorter_trace_makes(tmp_path):
    """The paper's counts are per trace: a 30 s high trace has twice the per-minute rate of
    the paper's 60 s ones, and the command says so instead of doing it silently."""
    from typer.testing import CliRunner

    from latsim.cli import app

    result = CliRunner().invoke(app, ["traces", "generate", "--kind", "high", "--duration",
                                      "30", "--count", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # the line wraps to the terminal, where the temporary folder's path puts it
    assert "3-11 updates per 30 s trace: 6-22 per minute" in " ".join(result.stdout.split())
