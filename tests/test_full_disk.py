"""A full disk: every write names its file, and nothing half-written is left looking complete.

The unit tests inject ``ENOSPC`` (a full disk's error names no file); the command-line
test writes into a real, full tmpfs where this machine lets the test mount one (root), and
says why it skips elsewhere.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from latsim.errors import LatsimError
from latsim.experiments import tracegen
from latsim.writing import replacing


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_replacement_keeps_the_old_file_and_leaves_no_twin(tmp_path):
    target = tmp_path / "rows.csv"
    target.write_text("old\n")
    with (pytest.raises(LatsimError, match=f"^cannot write {target}: No space left on device$"),
          replacing(target) as tmp):
        tmp.write_text("half")
        _enospc()
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]


def test_a_trace_set_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write that fails midway leaves the folder as it was: an earlier set's files of
    the same names included (they used to be overwritten, then removed; a user's own
    files of those names are refused before any write, tests/test_run_folder.py)."""
    traces = tracegen.generate_set("low", 5, 60.0, 0, 10_000)
    folder = tmp_path / "set"
    tracegen.write_set(tracegen.generate_set("low", 5, 60.0, 1, 10_000), folder)
    own = {p.name: p.read_text() for p in folder.iterdir()}
    assert len(own) == 5
    real_write = tracegen.write_trace
    calls = []

    def write_trace(path, times, meta):
        calls.append(path)
        if len(calls) == 4:
            with replacing(path):
                _enospc()
        real_write(path, times, meta)

    monkeypatch.setattr(tracegen, "write_trace", write_trace)
    with pytest.raises(LatsimError) as info:
        tracegen.write_set(traces, folder)
    assert str(info.value) == (
        f"cannot write {folder / 'low_003.jsonl'}: No space left on device; nothing in "
        f"{folder}/ was changed")
    assert {p.name: p.read_text() for p in folder.iterdir()} == own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no staging left
    monkeypatch.setattr(tracegen, "write_trace", real_write)
    assert tracegen.write_set(traces, folder) == [folder / f"low_00{i}.jsonl" for i in range(5)]
    assert all(p.read_text() != own[p.name] for p in folder.iterdir())


def test_a_figure_that_cannot_be_written_leaves_no_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from latsim.viz.style import save

    figure = Figure()
    figure.add_subplot().plot([0, 1], [0, 1])
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: (
        Path(path).write_bytes(b"\x89PNG half"), _enospc()))
    with pytest.raises(LatsimError, match=f"cannot write {tmp_path / 'f.png'}: No space"):
        save(figure, tmp_path / "f.png")
    assert list(tmp_path.iterdir()) == []


def test_compare_writes_its_files_whole_or_none(tmp_path, monkeypatch):
    """compare --out wrote compare.json and .csv, then failed on its figure (a full disk),
    leaving a set that looked complete but for the figure. Now the set lands whole or not
    at all."""
    from matplotlib.figure import Figure
    from typer.testing import CliRunner

    from latsim.cli import app

    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: (
        Path(path).write_bytes(b"\x89PNG half"), _enospc()))
    runs = Path(__file__).resolve().parents[1] / "results" / "serve" / "runs"
    result = CliRunner().invoke(app, ["compare", str(runs), "--replications", "2", "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "No space left" in result.stderr and "nothing in" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_a_staged_set_of_files_lands_whole_or_not_at_all(tmp_path):
    """A reproduction's tables are written into a staging folder and moved into place
    when all are written: a failure part way leaves the old set as it was."""
    from latsim.writing import staged, writing

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").write_text("old")
    with pytest.raises(LatsimError) as caught, staged(out) as staging:
        (staging / "a.csv").write_text("new")
        with writing(staging / "b.csv"):
            _enospc()
    assert str(caught.value) == (f"cannot write {out / 'b.csv'}: No space left on device; "
                                 f"nothing in {out}/ was changed")
    assert (out / "a.csv").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left
    with staged(out) as staging:
        (staging / "a.csv").write_text("new")
        (staging / "b.csv").write_text("b")
    assert sorted(p.name for p in out.iterdir()) == ["a.csv", "b.csv"]
    assert (out / "a.csv").read_text() == "new" and len(list(tmp_path.iterdir())) == 1


# ---------------------------------------------------------------- a real full disk


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs with no room left; skips where it cannot be mounted."""
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8); the unit tests above inject "
                    "the same error")
    root = tmp_path / "disk"
    root.mkdir()
    made = subprocess.run([mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        with (root / "filler").open("wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)


def _latsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "latsim"), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, written", [
    (["traces", "generate", "--kind", "low", "--count", "5", "--out", "{out}"],
     "{out}/low_000.jsonl"),
    (["reproduce", "--out", "{out}"], "{out}/settings.csv"),
    (["sweep", "--K", "4", "--duration", "10", "--out", "{out}"], "{out}/config.json"),
    (["plot", "timeline", "{run}", "--out", "{out}.png"], "{out}.png"),
    (["compare", str(Path(__file__).resolve().parents[1] / "results" / "serve" / "runs"),
      "--replications", "2", "--out", "{out}"], "{out}/compare_viewer.json"),  # all or none
])
def test_commands_on_a_full_disk_fail_in_one_line_naming_the_file(full_disk, tmp_path, args,
                                                                written):
    run = tmp_path / "run"
    if "{run}" in args:
        assert _latsim("simulate", "--K", "8", "--duration", "10", "--out",
                       str(run)).returncode == 0
    out = full_disk / "out"
    result = _latsim(*[a.format(out=out, run=run) for a in args])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"latsim: error: cannot write {written.format(out=out)}: No "
                               "space left on device"), lines[0]
    left = [p for p in full_disk.rglob("*") if p.is_file() and p.name != "filler"]
    assert not [p for p in left if p.stat().st_size == 0 or ".partial" in p.name], left


def test_a_fleet_plan_writes_both_tables_or_neither(tmp_path, monkeypatch):
    """The disk fills between plan.csv and tried.csv: neither lands (plan.csv used to be
    left alone, looking like a finished plan), and the error names the file."""
    from typer.testing import CliRunner

    from latsim.cli.root import app
    from latsim.run import files
    from tests.helpers import SMALL_FLEET

    path = tmp_path / "fleet.toml"
    path.write_text(SMALL_FLEET)
    real = files.write_rows_csv

    def write_rows_csv(target, rows, *args, **kwargs):
        if Path(target).name == "tried.csv":
            with replacing(target):
                _enospc()
        return real(target, rows, *args, **kwargs)

    monkeypatch.setattr(files, "write_rows_csv", write_rows_csv)
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["fleet", "plan", str(path), "--slo-l95", "3",
                                      "--slo-stall", "5", "--seeds", "1", "--max-nodes", "2",
                                      "--out", str(out)])
    assert result.exit_code == 2
    *progress, error = result.stderr.splitlines()  # a line per exact run, then the error
    assert all(line.endswith(" s]") for line in progress), progress
    assert error == (f"latsim: error: cannot write {out / 'tried.csv'}: No space left "
                     f"on device; nothing in {out}/ was changed")
    assert not out.exists() or list(out.iterdir()) == []


def test_a_grid_that_cannot_write_its_lines_names_the_file_and_says_partial(tmp_path):
    """A file-size limit (``ulimit -f``) under cells.jsonl: the error names it (the
    buffer's second failure at the close hid it: 'File too large', no file), and grid.json
    says partial, not running; the same command then resumes."""
    import json
    import resource

    grid_file = tmp_path / "g.toml"
    grid_file.write_text('name = "t"\nseeds = 1\n[fixed]\nC = 0.5\nduration = 10\n'
                         '[axes]\nK = [4, 8, 12, 16]\npolicy = ["baseline", "speculative"]\n')
    out = tmp_path / "g"
    command = [sys.executable, "-c", "from latsim.cli import main; main()", "grid",
               str(grid_file), "--out", str(out)]

    def limit() -> None:  # 1 KiB a file: grid.json fits, the eight cells' lines do not
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    failed = subprocess.run(command, capture_output=True, text=True, preexec_fn=limit)
    assert failed.returncode == 2
    assert failed.stderr == f"latsim: error: cannot write {out / 'cells.jsonl'}: File too large\n"
    assert json.loads((out / "grid.json").read_text())["status"] == "partial"
    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "grid.json").read_text())["status"] == "complete"
