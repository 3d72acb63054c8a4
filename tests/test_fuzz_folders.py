"""Fuzz what the commands read from disk: corrupted run folders and grid files.

A run folder (a complete simulated run) has one of its files damaged the ways files get
damaged: cut short, overwritten with random or non-UTF-8 bytes, deleted, a JSON field
given a foreign value, a CSV column dropped, a cell set to NaN, infinity or text, or the
file replaced by a named pipe or an endless device, or extended by a 64 MiB hole. Then
``compare``, ``plot timeline`` and ``export perfetto`` read it; a grid file is damaged the
same ways and ``grid`` runs it. Each must keep the one-line error contract of
``tests/test_fuzz_inputs.py`` (exit 0 or 2, one ``latsim: error:`` line, no traceback,
bounded time) and, when it refuses, leave nothing half-written where ``--out`` points.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.run_folders import complete_run
from tests.test_fuzz_inputs import FAST, SLOW, invoke_checked
from tests.test_fuzz_inputs import _tier as _fuzz_tier

TIERS = [pytest.param(FAST, id="fast"), pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]
#: The examples are the same on every run (CI stays reproducible); LATSIM_FUZZ_RANDOM=1
#: draws new ones, with ``--hypothesis-seed`` to replay a run (how the bugs it now guards
#: against were found: a null summary.json, a non-ASCII digit, a NaN job time).
RANDOM = os.environ.get("LATSIM_FUZZ_RANDOM") == "1"


def _tier(n: int):
    return settings(_fuzz_tier(n), derandomize=not RANDOM)
FOLDER_FILES = ("config.json", "summary.json", "conditions.csv", "jobs.csv", "slots.csv",
                "stalls.csv", "discards.csv", "trace.jsonl")
FOREIGN_JSON = [None, 5, "text", [], {"kind": "martian"}, {"format_version": 99},
                {"status": ["not", "a", "status"]}, {"K": -3}, {"duration": "long"},
                {"policy": {"name": 1}}]
CELLS = ["nan", "inf", "-inf", "", "x", "1e999", "-0", "True", "١"]


@st.composite
def damage(draw, names: tuple[str, ...]):
    """(file name, how) for one file of a folder."""
    name = draw(st.sampled_from(names))
    how = draw(st.sampled_from(["truncate", "random", "non-utf8", "delete", "json", "column",
                                "cell", "fifo", "device", "sparse"]))
    return name, how, draw(st.floats(0.0, 1.0)), draw(st.binary(max_size=64)), draw(
        st.sampled_from(FOREIGN_JSON)), draw(st.sampled_from(CELLS)), draw(st.integers(0, 99))


def apply(path: Path, how: str, cut: float, noise: bytes, foreign, cell: str,
          pick: int) -> None:
    """Damage ``path`` one way (a damage that does not apply to its kind leaves it cut)."""
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "fifo":  # a named pipe: opening it to read waits for a writer
        path.unlink()
        os.mkfifo(path)
    elif how == "device":  # an endless device behind the name
        path.unlink()
        path.symlink_to("/dev/zero" if os.path.exists("/dev/zero") else os.devnull)
    elif how == "sparse":  # zero bytes with no line end after what it held (a hole)
        with path.open("r+b") as handle:
            handle.truncate(len(data) + 64 * 2**20)
    elif how == "random":
        path.write_bytes(noise)
    elif how == "non-utf8":
        path.write_bytes(data[:int(cut * len(data))] + b"\xff\xfe\x80" + noise)
    elif how == "json" and path.suffix == ".json":
        loaded = json.loads(data)
        if isinstance(loaded, dict) and isinstance(foreign, dict):
            loaded.update(foreign)
        else:
            loaded = foreign
        path.write_text(json.dumps(loaded))
    elif how in ("column", "cell") and path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(data.decode())))
        if not rows or not rows[0]:
            path.write_bytes(data[:int(cut * len(data))])
            return
        column = pick % len(rows[0])
        if how == "column":
            rows = [row[:column] + row[column + 1:] for row in rows]
        elif len(rows) > 1:
            rows[1 + pick % (len(rows) - 1)][column] = cell
        out = io.StringIO()
        csv.writer(out).writerows(rows)
        path.write_text(out.getvalue())
    else:
        path.write_bytes(data[:int(cut * len(data))])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return complete_run(tmp_path_factory.mktemp("pristine") / "run")


def _damaged(pristine: Path, tmp: Path, damaged) -> Path:
    folder = tmp / "run"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    name, *how = damaged
    if (folder / name).exists():
        apply(folder / name, *how)
    return folder


def _snapshot(folder: Path) -> dict[str, object]:
    """Each entry of ``folder``: a regular file's bytes, else what it is (a pipe or a link
    is not read: that would wait for a writer, or never end)."""
    return {p.name: (p.read_bytes() if p.is_file() and not p.is_symlink()
                     else ("link", os.readlink(p)) if p.is_symlink() else "not a file")
            for p in folder.iterdir()}


def _nothing_half_written(result, out: Path) -> None:
    if result.exit_code == 2:
        assert not out.exists(), f"refused, yet {out} was written"


@pytest.mark.parametrize("n", TIERS)
def test_reading_a_damaged_run_folder_keeps_the_error_contract(n, pristine, tmp_path):
    @_tier(n)
    @given(damaged=damage(FOLDER_FILES), command=st.sampled_from(["compare", "timeline",
                                                                  "perfetto"]))
    def check(damaged, command):
        folder = _damaged(pristine, tmp_path, damaged)
        out = tmp_path / ("out.png" if command == "timeline" else "out.json")
        out.unlink(missing_ok=True)
        if command == "compare":
            invoke_checked(["compare", str(folder), "--replications", "2"])
            return
        args = (["plot", "timeline", str(folder)] if command == "timeline"
                else ["export", "perfetto", str(folder)])
        _nothing_half_written(invoke_checked([*args, "--out", str(out)]), out)

    check()


GRID = """name = "fuzz"
seeds = 2
seed = 0
metrics = ["L_mean", "stall_pct"]

[fixed]
duration = 10.0
C = 0.3

[axes]
K = [4, 8]
policy = ["baseline", "speculative"]
"""


@pytest.mark.parametrize("n", TIERS)
def test_a_damaged_grid_file_keeps_the_error_contract_and_writes_nothing(n, tmp_path):
    source = tmp_path / "grid.toml"

    @_tier(n)
    @given(damaged=damage(("grid.toml",)),
           replace=st.sampled_from([None, ("K = [4, 8]", "K = [4, -8]"),
                                    ('"stall_pct"', '"no_such_metric"'),
                                    ('name = "fuzz"', "name = 5"),
                                    ("C = 0.3", 'C = "slow"'),
                                    ("duration = 10.0", "duration = 1e12")]))
    def check(damaged, replace):
        text = GRID if replace is None else GRID.replace(*replace)
        source.unlink(missing_ok=True)  # an example before may have left a pipe or a link
        source.write_text(text)
        if replace is None:
            apply(source, *damaged[1:])
        out = tmp_path / "cells"
        if out.exists():
            shutil.rmtree(out)
        result = invoke_checked(["grid", str(source), "--out", str(out)])
        if result.exit_code == 2 and out.exists():
            assert not any(out.iterdir()), f"refused, yet wrote {sorted(out.iterdir())}"

    check()


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory) -> Path:
    from latsim.experiments.grid import parse_grid, run_grid

    folder = tmp_path_factory.mktemp("grid")
    (folder / "grid.toml").write_text(GRID)
    run_grid(parse_grid(GRID, "grid.toml"), folder / "cells")
    return folder


@pytest.mark.parametrize("n", TIERS)
def test_resuming_a_damaged_grid_keeps_the_contract_and_destroys_no_finished_cell(
        n, finished_grid, tmp_path):
    @_tier(n)
    @given(damaged=damage(("grid.json", "cells.jsonl", "cells.csv")))
    def check(damaged):
        out = tmp_path / "cells"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(finished_grid / "cells", out)
        name, *how = damaged
        apply(out / name, *how)
        before = _snapshot(out)
        result = invoke_checked(["grid", str(finished_grid / "grid.toml"), "--out", str(out)])
        if result.exit_code == 2:  # refused: every file as it was
            assert _snapshot(out) == before
        else:  # resumed: every cell is there (run again where its line was lost)
            assert (out / "cells.csv").is_file() and not (out / "cells.csv").is_symlink()
            rows = list(csv.DictReader(io.StringIO((out / "cells.csv").read_text())))
            assert sorted(int(r["cell"]) for r in rows) == [0, 1, 2, 3]
            assert json.loads((out / "grid.json").read_text())["status"] == "complete"

    check()
