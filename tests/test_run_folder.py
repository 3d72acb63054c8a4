"""The run-folder format: atomic writes, versioning, and status read from what is there."""

from __future__ import annotations

import json
import os
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
