"""`latsim export perfetto`: the trace is well-formed (every event, nesting per track, time
order, flows and async slices matched) for simulated, serving and measured run folders, and a
small simulated run's trace matches a golden file."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim.cli.root import app
from latsim.errors import LatsimError
from latsim.viz.perfetto import perfetto_trace

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "perfetto_small.json"
runner = CliRunner()


def check_trace(trace: dict) -> None:
    """Structural checks a trace viewer relies on."""
    events = trace["traceEvents"]
    assert events and trace["displayTimeUnit"] == "ms"
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    flows: dict[int, list[dict]] = defaultdict(list)
    spans: dict[tuple[str, str], list[dict]] = defaultdict(list)
    named = {(e["pid"], e["tid"]) for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        assert e["ph"] in {"M", "X", "s", "f", "b", "e"}, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], float | int) and math.isfinite(e["ts"]) and e["ts"] >= 0, e
        assert (e["pid"], e["tid"]) in named, f"an event on an unnamed thread: {e}"
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            tracks[(e["pid"], e["tid"])].append(e)
        elif e["ph"] in "sf":
            flows[e["id"]].append(e)
        else:
            spans[(e["cat"], e["id"])].append(e)
    for track, slices in tracks.items():
        starts = [s["ts"] for s in slices]
        assert starts == sorted(starts), f"track {track} is not in time order"
        stack: list[float] = []  # ends of the open slices
        for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
            while stack and s["ts"] >= stack[-1] - 1e-3:
                stack.pop()
            end = s["ts"] + s["dur"]
            assert not stack or end <= stack[-1] + 1e-3, f"overlapping slices on {track}: {s}"
            stack.append(end)
    for flow_id, pair in flows.items():  # one start and one end, the end no earlier
        assert sorted(e["ph"] for e in pair) == ["f", "s"], flow_id
        start, end = sorted(pair, key=lambda e: e["ph"] == "f")
        assert end["bp"] == "e" and end["ts"] >= start["ts"]
    for key, seq in spans.items():
        open_: list[str] = []
        last = -1.0
        for e in seq:
            assert e["ts"] >= last
            last = e["ts"]
            if e["ph"] == "b":
                open_.append(e["name"])
            else:
                assert open_ and open_.pop() == e["name"], f"unmatched async end in {key}"
        assert not open_, f"async slices left open in {key}"


def _simulate(tmp_path: Path, *args: str) -> Path:
    result = runner.invoke(app, ["simulate", "--out", str(tmp_path), *args])
    assert result.exit_code == 0, result.stderr
    return tmp_path


def test_a_small_simulated_run_matches_its_golden_trace(tmp_path):
    run = _simulate(tmp_path / "small", "--K", "2", "--C", "0.2", "--updates", "poisson:1",
                    "--duration", "3", "--seeds", "1", "--seed", "3")
    out = tmp_path / "trace.json"
    result = runner.invoke(app, ["export", "perfetto", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    trace = json.loads(out.read_text())
    check_trace(trace)
    assert trace == json.loads(GOLDEN.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"baseline K=2 run 0: devices", "speculative K=2 run 0: playback",
            "generator", "playback", "conditions"} <= names
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "b"} >= {"R", "C", "Q"}


def test_a_serving_run_has_a_track_per_device_and_a_process_per_stream(tmp_path):
    run = _simulate(tmp_path / "serving", "--K", "8", "--C", "0.4", "--streams", "3",
                    "--pools", "dit=2,vae=1", "--decode", "fixed:0.05", "--deliver",
                    "fixed:0.01", "--duration", "15", "--seeds", "1", "--lead", "1.0",
                    "--policy", "speculative", "--updates", "poisson:0.5")
    trace = perfetto_trace(run)
    check_trace(trace)
    threads = {e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"dit 0", "dit 1", "vae 0"} <= threads
    processes = {e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"speculative K=8 run 0: stream {s}" for s in range(3)} <= processes


def test_a_measured_run_and_a_pipeline_export_too(tmp_path):
    check_trace(perfetto_trace(ROOT / "results" / "compare" / "runs" / "K8-speculative"))
    run = _simulate(tmp_path / "wave", "--K", "3", "--cost", "waveforcing:0.08,4,0.2",
                    "--pools", "dit=5,vae=3", "--streams", "4", "--duration", "6",
                    "--seeds", "1", "--lead", "0.7", "--policy", "baseline")
    check_trace(perfetto_trace(run))


def test_a_folder_without_records_is_a_one_line_error(tmp_path):
    with pytest.raises(LatsimError, match="not a run folder"):
        perfetto_trace(tmp_path)
    result = runner.invoke(app, ["export", "perfetto", str(tmp_path), "--out",
                                 str(tmp_path / "t.json")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_export_to_a_full_device_is_one_line_and_leaves_the_device(tmp_path):
    """``--out /dev/full`` wrote a temporary file and renamed it over the device node."""
    import os
    import stat

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    run = _simulate(tmp_path / "small", "--K", "2", "--C", "0.2", "--duration", "3",
                    "--seeds", "1")
    result = runner.invoke(app, ["export", "perfetto", str(run), "--out", "/dev/full"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("latsim: error: cannot write /dev/full: No space left on "
                                     "device")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_export_to_dev_stdout_adds_to_the_shells_file_or_pipe(tmp_path):
    """``--out /dev/stdout >> log`` renamed a new file over log (what was there was lost),
    and ``--out /dev/stdout | …`` failed (its realpath is ``pipe:[N]``). Both now write
    to the stream: appended to the file, through the pipe."""
    import shutil
    import subprocess
    import sys

    if not Path("/dev/stdout").exists():
        pytest.skip("no /dev/stdout on this system")
    run = _simulate(tmp_path / "small", "--K", "2", "--C", "0.2", "--duration", "3",
                    "--seeds", "1")
    latsim = shutil.which("latsim") or str(Path(sys.executable).with_name("latsim"))
    log = tmp_path / "log.txt"
    log.write_text("PREVIOUS\n")
    command = [latsim, "export", "perfetto", str(run), "--out", "/dev/stdout"]
    with open(log, "a") as out:
        subprocess.run(command, stdout=out, check=True, timeout=120)
    first, rest = log.read_text().split("\n", 1)
    assert first == "PREVIOUS" and json.loads(rest)["traceEvents"]
    piped = subprocess.run(command, capture_output=True, check=True, timeout=120)
    assert json.loads(piped.stdout)["traceEvents"]


# ---------------------------------------------------------------- damaged folders


def _one_line_refusal(args: list[str], *expected: str) -> None:
    result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stderr.startswith("latsim: error: ") and result.stderr.count("\n") == 1
    for text in expected:
        assert text in result.stderr, result.stderr


def test_a_negative_arrival_is_refused_not_exported_at_minus_seven_seconds(tmp_path):
    """The issue's: a negative conditions.csv cell gave Perfetto timestamps of -7e6 µs."""
    from tests.run_folders import complete_run, set_cell

    run = complete_run(tmp_path / "run")
    set_cell(run / "conditions.csv", 2, "t_arrival", "-7")
    out = tmp_path / "t.json"
    _one_line_refusal(["export", "perfetto", str(run), "--out", str(out)],
                      "conditions.csv:2: column t_arrival: -7.0 is below 0")
    assert not out.exists()


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> Path:
    from tests.run_folders import serving_run

    return serving_run(tmp_path_factory.mktemp("serving") / "run")


@pytest.mark.parametrize("table, damage, expected", [
    ("tasks", "xff", "tasks.csv: not UTF-8 text"),
    ("starts", "xff", "starts.csv: not UTF-8 text"),
    ("tasks", ("cell", "device", "x"), "tasks.csv:3: column device: 'x' is not a valid int"),
    ("starts", ("cell", "t_origin", "x"), "starts.csv:3: column t_origin"),
    ("tasks", ("cell", "stream", "x"), "tasks.csv:3: column stream"),
    ("tasks", ("drop", "device"), "tasks.csv:1: the header lacks device"),
    ("starts", ("drop", "t_origin"), "starts.csv:1: the header lacks t_origin"),
    ("tasks", ("cell", "t_end", "-1"), "tasks.csv:3: column t_end: -1.0 is below 0"),
    ("jobs", ("drop", "stream"), "jobs.csv:1: the header lacks stream"),
])
@pytest.mark.parametrize("command", ["perfetto", "timeline"])
def test_a_damaged_serving_folder_is_a_one_line_error(serving, tmp_path, table, damage,
                                                       expected, command):
    """Tracebacks before: \\xff, text cells or a missing column in tasks.csv/starts.csv."""
    import shutil

    from tests.run_folders import drop_column, set_cell

    run = tmp_path / "run"
    shutil.copytree(serving, run)
    path = run / f"{table}.csv"
    if damage == "xff":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2] + b"\xff" + data[len(data) // 2:])
    elif damage[0] == "cell":
        set_cell(path, 3, damage[1], damage[2])
    else:
        drop_column(path, damage[1])
    out = tmp_path / ("t.json" if command == "perfetto" else "t.png")
    args = (["export", "perfetto", str(run), "--out", str(out)] if command == "perfetto"
            else ["plot", "timeline", str(run), "--out", str(out)])
    _one_line_refusal(args, expected)
    assert not out.exists()


def test_export_refuses_more_records_than_its_bound_and_says_how_to_raise_it(tmp_path):
    """A 400,000-row conditions.csv made 756 MB of JSON in 142 s: now a bound, checked
    before the folder is read, that --max-records raises (within a stated range)."""
    from tests.run_folders import complete_run

    run = complete_run(tmp_path / "run")
    out = tmp_path / "t.json"
    rows = sum(len(path.read_text().splitlines()) - 1
               for path in run.glob("*.csv") if path.stem in ("jobs", "slots", "stalls",
                                                              "conditions"))
    _one_line_refusal(["export", "perfetto", str(run), "--out", str(out), "--max-records",
                       str(rows - 1)],
                      f"its record tables hold {rows:,} rows to export",
                      f"above the work bound of {rows - 1:,}",
                      "raise it with --max-records, at most 100,000,000")
    assert not out.exists()
    for bad in ("0", "100000001"):
        _one_line_refusal(["export", "perfetto", str(run), "--out", str(out),
                           "--max-records", bad], "--max-records must be")
    result = runner.invoke(app, ["export", "perfetto", str(run), "--out", str(out),
                                 "--max-records", str(rows)])
    assert result.exit_code == 0, result.stderr


def test_a_torn_row_of_a_client_folder_is_noted_not_dropped_silently(tmp_path):
    from tests.run_folders import client_run, tear_last_row

    run = client_run(tmp_path / "client")
    tear_last_row(run / "slots.csv")
    result = runner.invoke(app, ["export", "perfetto", str(run), "--out",
                                 str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.stderr
    assert "latsim: note: slots.csv: last row" in result.stderr and "torn" in result.stderr
    result = runner.invoke(app, ["plot", "timeline", str(run), "--out",
                                 str(tmp_path / "t.png")])
    assert result.exit_code == 0, result.stderr
    assert "slots.csv: last row" in result.stdout
