"""The run-folder format: atomic writes, versioning, and status read from what is there."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from latsim.errors import LatsimError
from latsim.run.folder import (
    FORMAT_VERSION,
    INCOMPLETE,
    RUNNING,
    read_run_folder,
    write_json,
)


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path,
                                                                           monkeypatch):
    target = tmp_path / "summary.json"
    write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        write_json(target, {"a": object()})  # not JSON: fails before the temporary
    blocker = tmp_path / "config.json"
    blocker.mkdir()  # a folder is refused before anything is written
    with pytest.raises(LatsimError, match="not a file"):
        write_json(blocker, {"b": 2})

    def failing_replace(src, dst):  # the rename fails after the write
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr("latsim.run.folder.os.replace", failing_replace)
    with pytest.raises(LatsimError, match=f"^cannot write {target}: No space left on device$"):
        write_json(target, {"c": 3})
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "summary.json"]


def _folder(tmp_path, config, summary=None):
    (tmp_path / "jobs.csv").write_text("policy,K,run\n")
    write_json(tmp_path / "config.json", config)
    if summary is not None:
        write_json(tmp_path / "summary.json", summary)
    return read_run_folder(tmp_path)


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_status_is_derived_from_what_the_folder_holds(tmp_path):
    import socket
    import subprocess
    import sys

    config = {"format_version": FORMAT_VERSION, "kind": "measured", "status": "running"}
    mine = _folder(tmp_path, config)  # write_json stamps this process as the writer
    assert mine.config["writer"] == {"pid": os.getpid(), "host": socket.gethostname()}
    assert mine.status == INCOMPLETE  # its own run may have ended without saying so
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = {**config, "writer": {"pid": other.pid, "host": socket.gethostname()}}
        (tmp_path / "config.json").write_text(json.dumps(live))
        assert read_run_folder(tmp_path).status == RUNNING  # another process, alive
        assert read_run_folder(tmp_path).state == RUNNING
    finally:
        other.kill()
        other.wait()
    for writer in ({"pid": _dead_pid(), "host": socket.gethostname()},  # a killed writer
                   {"pid": os.getpid(), "host": "another-host"},  # cannot be checked
                   None):  # a folder from before the stamp
        path = tmp_path / "config.json"
        stamped = {**config, **({} if writer is None else {"writer": writer})}
        path.write_text(json.dumps(stamped))
        assert read_run_folder(tmp_path).status == INCOMPLETE, writer
    done = {**config, "status": "complete"}
    assert _folder(tmp_path, done).status == INCOMPLETE  # no summary yet
    assert _folder(tmp_path, done, {"L50": 1.0}).complete


def test_a_newer_format_is_refused_with_one_line(tmp_path):
    with pytest.raises(LatsimError, match="newer than this latsim reads"):
        _folder(tmp_path, {"format_version": FORMAT_VERSION + 1, "kind": "measured"})


# ---------------------------------------------------------------- what --out may replace


def test_json_output_never_replaces_what_is_not_its_own_file(tmp_path):
    """A device or a pipe is written through and stays what it is; a symbolic link is
    followed (the file it names is replaced, the link stays); a pipe with no reader and a
    directory are one-line errors, not a hang or a replaced node."""
    import os
    import stat

    write_json(Path(os.devnull), {"a": 1})
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    if os.path.exists("/dev/full"):
        with pytest.raises(LatsimError, match="^cannot write /dev/full: No space left"):
            write_json(Path("/dev/full"), {"a": 1})
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real)
    write_json(link, {"b": 2})
    assert link.is_symlink() and json.loads(real.read_text()) == {"b": 2}
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(LatsimError, match="a named pipe with no reader"):
        write_json(fifo, {})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(LatsimError, match="not a file"):
        write_json(tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "pipe", "real.json"]


# ---------------------------------------------------------------- inputs that are not files


INPUTS = (("simulate", "--K", "4", "--C", "0.5", "--updates", "trace:{p}"),
          ("simulate", "--K", "4", "--serving", "{p}"),
          ("simulate", "--K", "4", "--cost", "table:{p}"),
          ("simulate", "--K", "4", "--cost", "usp:{p}"),
          ("fleet", "{p}"), ("grid", "{p}", "--out", "{d}/grid"),
          ("traces", "validate", "{p}"), ("traces", "show", "{p}"))


@pytest.mark.parametrize("args", INPUTS, ids=lambda a: " ".join(a[:2]) + " " + a[-1][:6])
def test_a_named_pipe_given_as_input_is_refused_not_waited_on(tmp_path, args):
    """A FIFO blocks whoever opens it for reading until a writer comes: every input path
    refuses one (one line, exit 2 or the validator's 1) instead of hanging."""
    import os
    import subprocess
    import sys

    pipe = tmp_path / "input"
    os.mkfifo(pipe)
    argv = [a.format(p=pipe, d=tmp_path) for a in args]
    done = subprocess.run([sys.executable, "-c", "from latsim.cli import main; main()", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (1, 2), done.stderr
    said = done.stdout + done.stderr  # traces validate lists its problems on stdout
    assert "a named pipe or socket, not a file" in said
    assert "Traceback" not in said


def test_a_run_folder_table_that_is_a_device_is_a_one_line_error(tmp_path):
    """``ln -sf /dev/zero RUN/slots.csv`` read the endless device into memory."""
    import os

    from typer.testing import CliRunner

    from latsim.cli import app

    runner = CliRunner()
    run = tmp_path / "run"
    result = runner.invoke(app, ["simulate", "--K", "4", "--C", "0.5", "--duration", "5",
                                 "--seeds", "1", "--out", str(run)])
    assert result.exit_code == 0, result.stderr
    os.remove(run / "slots.csv")
    os.symlink(os.devnull if not os.path.exists("/dev/zero") else "/dev/zero",
               run / "slots.csv")
    result = runner.invoke(app, ["plot", "timeline", str(run), "--out",
                                 str(tmp_path / "t.png")])
    assert result.exit_code == 2
    assert result.stderr.strip().endswith("slots.csv: not a regular file (a device, pipe or "
                                          "folder); not read")


def test_a_sparse_run_folder_table_is_refused_in_bounded_memory(tmp_path):
    """A 3 GiB sparse slots.csv (no line end in it) was read whole, decoded and copied:
    13.6 GB for ``plot timeline``. The reader streams rows and refuses a line no record
    file has, in a process whose address space is capped at 1 GiB."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", "from latsim.cli import main; main()",
                           "simulate", "--K", "4", "--C", "0.5", "--duration", "5", "--seeds",
                           "1", "--out", str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(run / "slots.csv", "r+b") as handle:
        handle.truncate(3 * 2**30)  # the rows stay; 3 GiB of zero bytes follow the last
    capped = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
              "from latsim.cli import main; sys.argv[0] = 'latsim'; main()")
    done = subprocess.run([sys.executable, "-c", capped, "plot", "timeline", str(run),
                           "--out", str(tmp_path / "t.png")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"latsim: error: {run / 'slots.csv'}: a line longer than 1,048,576 characters; not a "
        "record file"]
    assert os.path.getsize(run / "slots.csv") == 3 * 2**30  # read, not changed


_ROOT = Path(__file__).resolve().parents[1]
_CAPACITY = ["capacity", "--K", "4", "--C", "0.3", "--duration", "10", "--max-streams",
             "4", "--slo-l95", "3", "--slo-stall", "5"]


@pytest.mark.parametrize("args, foreign", [
    (["simulate", "--K", "4", "--C", "0.5", "--duration", "10", "--seeds", "1"],
     "config.json"),
    (["sweep", "--K", "4", "8", "--duration", "10", "--seeds", "1"], "summary.json"),
    (["plan", str(_ROOT / "examples" / "plan.toml")], "plan.json"),
    (_CAPACITY, "capacity.json"),
    (["compare", str(_ROOT / "results" / "serve" / "runs"), "--replications", "2"],
     "compare.json"),
    (["fleet", "plan", str(_ROOT / "examples" / "fleet.toml"), "--slo-l95", "3",
      "--slo-stall", "5"], "tried.csv"),
    (["fleet", "run", str(_ROOT / "examples" / "fleet.toml")], "summary.json"),
    (["traces", "generate", "--kind", "low", "--count", "3"], "low_001.jsonl"),
    (["client", "ws://127.0.0.1:9", "--K", "4", "--duration", "30"], "config.json"),
    (["measure", "--generator", "sleep", "--K", "4", "--duration", "5"], "measure.json"),
    (["serve", "--generator", "sleep", "--K", "4", "--port", "0"], "tasks.csv"),
    (["reproduce"], "l50.csv"),
    (["reproduce"], "reproduce.json"),
    (["reproduce", "serving"], "e2e.csv"),
    (["reproduce", "systems"], "systems.png"),
    (["reproduce", "fleet"], "policy.csv"),
    (["reproduce", "replan-rule"], "replan_rule.csv"),
])
def test_no_command_writes_over_files_it_did_not_write(tmp_path, args, foreign):
    """`--out` onto a folder holding someone else's config.json or summary.json replaced
    them: every folder-writing command now refuses, in one line naming the file, before
    any work, through one check (claim_folder); fleet and grid already did, serve and the
    reproductions since issue 51."""
    from typer.testing import CliRunner

    from latsim.cli import app

    if args[0] in ("client", "serve"):
        pytest.importorskip("websockets", reason="the live extra adds latsim client, serve")
    out = tmp_path / "out"
    out.mkdir()
    mine = '{"t": 1.0}\n' if foreign.endswith(".jsonl") else '{"mine": 1}\n'  # a trace
    (out / foreign).write_text(mine)
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert (out / foreign).read_text() == mine
    assert sorted(p.name for p in out.iterdir()) == [foreign]
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert f"{out / foreign}: not written by latsim " in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith("use another --out")


@pytest.mark.slow  # 7 s or more on 2 cores
def test_a_command_runs_again_into_its_own_folder(tmp_path):
    """What the same command wrote there is its own: a second run replaces it."""
    from typer.testing import CliRunner

    from latsim.cli import app

    out = tmp_path / "out"
    for _ in range(2):
        result = CliRunner().invoke(app, [*_CAPACITY, "--out", str(out)])
        assert result.exit_code == 0, result.output
    assert json.loads((out / "capacity.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("name", ["paper", "serving", "systems", "fleet", "replan-rule"])
def test_a_reproduction_takes_its_own_folder_and_no_other(tmp_path, name):
    """Its committed folder (what the default --out reruns into) holds exactly what it
    writes and its record; a folder another reproduction wrote is refused."""
    from latsim.cli.paper_commands import REPRODUCE_RECORD, REPRODUCTIONS, claim_reproduction

    committed = _ROOT / "results" / ("paper" if name == "paper" else name.replace("-", "_"))
    assert sorted(p.name for p in committed.iterdir()) == sorted(
        [*REPRODUCTIONS[name], REPRODUCE_RECORD])
    claim_reproduction(committed, name)
    other = next(n for n in REPRODUCTIONS if n != name)
    what = "latsim reproduce" + ("" if other == "paper" else f" {other}")
    with pytest.raises(LatsimError, match=f"{REPRODUCE_RECORD}: not written by {what};"):
        claim_reproduction(committed, other)
    assert sorted(p.name for p in committed.iterdir()) == sorted(
        [*REPRODUCTIONS[name], REPRODUCE_RECORD])


def test_serve_appends_to_its_own_tasks_csv_and_no_other(tmp_path):
    from harness.serve.server import DEVICE_TASKS, claim_serve_folder
    from latsim.run.record_files import write_csv
    from latsim.run.serving import TaskRecord

    write_csv(tmp_path / DEVICE_TASKS, TaskRecord, (), extra=(("server_run", "a"),
                                                              ("session", "s1")))
    claim_serve_folder(tmp_path)  # an earlier server's: appended to
    for damaged, why in ((b"\xff\n", "not UTF-8"), (b"a,b\n", "not written by latsim serve"),
                         (b"x" * (2**20 + 1), "a line longer than")):
        (tmp_path / DEVICE_TASKS).write_bytes(damaged)
        with pytest.raises(LatsimError, match=why):
            claim_serve_folder(tmp_path)


def test_claim_folder_refuses_a_live_writer_and_takes_a_dead_ones_folder(tmp_path):
    import socket
    import subprocess
    import sys

    from latsim.run.folder import claim_folder

    def check() -> None:
        claim_folder(tmp_path, ("config.json", "jobs.csv"), "config.json", "latsim x",
                     lambda config: config.get("kind") == "x")

    check()  # empty: nothing to replace
    (tmp_path / "other.csv").write_text("not one of ours\n")
    check()  # files not of its names are never touched
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "config.json").write_text(json.dumps({
            "kind": "x", "status": "running",
            "writer": {"pid": sleeper.pid, "host": socket.gethostname()}}))
        with pytest.raises(LatsimError, match=f"process {sleeper.pid} on this host is "
                           "still writing there"):
            check()
    finally:
        sleeper.kill()
        sleeper.wait()
    check()  # its writer is gone: the folder is taken over
    (tmp_path / "config.json").write_bytes(b"\xff")
    with pytest.raises(LatsimError, match="not UTF-8 text.*not written by latsim x"):
        check()


def test_grid_does_not_write_over_a_cells_csv_without_its_grid_json(tmp_path):
    from typer.testing import CliRunner

    from latsim.cli import app

    grid = tmp_path / "grid.toml"
    grid.write_text("[axes]\nK = [4]\n[fixed]\nduration = 10\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "cells.csv").write_text("mine\n")
    result = CliRunner().invoke(app, ["grid", str(grid), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{out / 'cells.csv'}: not written by latsim grid" in result.stderr
    assert (out / "cells.csv").read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir()) == ["cells.csv"]

# ---------------------------------------------------------------- every cell checked


@pytest.mark.parametrize("table, line, column, cell, message", [
    # the issue's: a negative job time gave C_mean = -0.051 and status complete
    ("jobs", 3, "t_ready", "-0.051", "column t_ready: -0.051 is below 0"),
    ("jobs", 3, "t_ready", "1.0", "column t_ready: 1.0 is before t_start 1.3"),
    ("jobs", 3, "t_start", "nan", "column t_start: empty or NaN"),
    ("jobs", 3, "t_start", "", "column t_start: empty or NaN"),
    ("jobs", 3, "kind", "x", "column kind: 'x' is not one of prebuffer"),
    ("jobs", 3, "version", "-2", "column version: -2 is below 0"),
    ("slots", 2, "t_start", "inf", "column t_start: inf is not a finite number"),
    ("slots", 2, "t_start", "1e999", "column t_start: inf is not a finite number"),
    # ... and a negative arrival a Perfetto timestamp of -7e6 µs
    ("conditions", 2, "t_arrival", "-7", "column t_arrival: -7.0 is below 0"),
    ("conditions", 2, "L", "", "column L: empty or NaN, but a shown row's"),
    ("conditions", 2, "job_id", "-2", "column job_id: -2 is below -1"),
    ("discards", 2, "t", "-1", "column t: -1.0 is below 0"),
    ("jobs", 2, "K", "x", "column K: 'x' is not a whole number"),
    ("jobs", 2, "run", "-1", "column run: '-1' is not a whole number"),
    ("jobs", 2, "policy", "baseline", "column policy: 'baseline' where this folder's "
                                      "config.json says speculative"),
    ("jobs", 2, "K", "4", "column K: '4' where this folder's config.json says 8"),
])
def test_a_damaged_cell_is_an_error_naming_file_line_and_column(
        tmp_path, table, line, column, cell, message):
    from tests.run_folders import complete_run, set_cell

    run = complete_run(tmp_path / "run")
    set_cell(run / f"{table}.csv", line, column, cell)
    with pytest.raises(LatsimError, match=re.escape(f"{table}.csv:{line}: {message}")):
        read_run_folder(run).records(table)
    with pytest.raises(LatsimError, match=re.escape(f"{table}.csv:{line}: {message}")):
        read_run_folder(run).frame(table)  # the timeline's reader: the same check


def test_a_run_folder_table_without_its_leading_columns_is_an_error(tmp_path):
    import csv
    import io

    from tests.run_folders import complete_run

    run = complete_run(tmp_path / "run")
    path = run / "jobs.csv"
    rows = list(csv.reader(io.StringIO(path.read_text())))
    out = io.StringIO()
    csv.writer(out).writerows(row[1:] for row in rows)  # without policy
    path.write_text(out.getvalue())
    with pytest.raises(LatsimError, match=re.escape("jobs.csv:1: the header lacks policy")):
        read_run_folder(run).records("jobs")


def test_every_committed_run_folder_still_reads(tmp_path):
    """The checks refuse damage, not what latsim writes: every run and client folder
    under results/ reads whole."""
    from latsim.run.folder import TABLE_TYPES
    from latsim.run.viewer import read_viewer_records

    root = Path(__file__).resolve().parents[1] / "results"
    read = 0
    for config in sorted(root.rglob("config.json")):
        folder = read_run_folder(config.parent)
        if folder.kind == "client":
            read_viewer_records(folder.path)
            read += 1
            continue
        for table in TABLE_TYPES:
            if (folder.path / f"{table}.csv").is_file():
                folder.records(table)
                read += 1
    assert read > 50
