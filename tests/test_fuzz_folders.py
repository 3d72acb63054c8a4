"""Fuzz what the commands read from disk: corrupted run folders and grid files.

A run folder (a complete simulated run) has one of its files damaged the ways files get
damaged: cut short, overwritten with random or non-UTF-8 bytes, deleted, a JSON field
given a foreign value, a CSV column dropped, a cell set to NaN, infinity or text, or the
file replaced by a named pipe or an endless device, or extended by a 64 MiB hole, or a
JSON, JSONL or TOML file nested past the parsers' recursion limit. Then
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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.run_folders import complete_run
from tests.test_fuzz_inputs import DEEP, FAST, SLOW, invoke_checked
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
                                "cell", "fifo", "device", "sparse", "deep"]))
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
    elif how == "deep" and path.suffix in (".json", ".jsonl", ".toml"):
        path.write_text(_nested(path.suffix))
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


def _deep(name: str) -> tuple:
    """:func:`damage`'s draw that nests ``name`` too deeply (an example every tier runs)."""
    return name, "deep", 0.5, b"", None, "x", 0


def _nested(suffix: str) -> str:
    """A file of ``suffix``'s syntax nested :data:`DEEP` levels deep (a RecursionError in
    the parser, not a ValueError)."""
    if suffix == ".toml":
        return "x = " + "[" * DEEP + "]" * DEEP + "\n"
    if suffix == ".json":
        return '{"a": ' * DEEP + "1" + "}" * DEEP
    return '{"t": 1}\n' + '{"t": ' * DEEP + "1" + "}" * DEEP + "\n"  # a JSONL line


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
    @example(damaged=_deep("config.json"), command="compare")
    @example(damaged=_deep("summary.json"), command="timeline")
    @example(damaged=_deep("trace.jsonl"), command="perfetto")
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
    @example(damaged=_deep("grid.toml"), replace=None)
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
    @example(damaged=_deep("grid.json"))
    @example(damaged=_deep("cells.jsonl"))
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


# ---------------------------------------------------------------- damaged record cells

#: What each command reads, by the kind of folder it is given (a file it does not read
#: cannot mislead it).
READS = {
    ("simulated", "perfetto"): ("jobs", "slots", "stalls", "conditions"),
    ("simulated", "timeline"): ("jobs", "slots", "stalls", "conditions", "discards"),
    ("simulated", "compare"): ("jobs", "slots", "stalls", "conditions", "discards"),
    ("serving", "perfetto"): ("jobs", "slots", "stalls", "conditions", "tasks", "starts"),
    ("serving", "timeline"): ("jobs", "slots", "stalls", "conditions", "discards", "tasks",
                              "starts"),
    **{("client", command): ("conditions", "slots", "stalls", "jobs", "probes")
       for command in ("perfetto", "timeline", "compare")},
}
#: Columns that may be negative by what they mean: a client's raw clocks and its offset.
SIGNED = {("probes", name) for name in ("t0", "t1", "t2", "t3", "offset")}
#: Times every row has (a job's start, a played slot's ...): NaN there is damage.
ALWAYS_SET = {("jobs", "t_start"), ("jobs", "t_ready"), ("slots", "t_start"),
              ("stalls", "t_start"), ("stalls", "t_end"), ("discards", "t"),
              ("tasks", "t_enqueue"), ("tasks", "t_start"), ("tasks", "t_end"),
              ("starts", "t_join"), ("starts", "t_origin")}
#: The damages drawn: every one makes a file no latsim writer writes, so each must be
#: refused (exit 2, one line naming the file) or, for a torn last row (what a killed
#: writer leaves) and a lost config.json, flagged on the output.
DAMAGES = ("text", "negative", "inf", "nan", "column", "torn", "xff", "config")


@pytest.fixture(scope="module")
def pristine_folders(tmp_path_factory) -> dict[str, Path]:
    from tests.run_folders import client_run, serving_run

    root = tmp_path_factory.mktemp("pristine_kinds")
    return {"simulated": complete_run(root / "simulated"),
            "serving": serving_run(root / "serving"), "client": client_run(root / "client")}


def _numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return cell.strip().lower() not in ("nan", "inf", "-inf", "")


def _damage_cell(draw, table: str, rows: list[list[str]], how: str):
    """(line, column, cell) of a cell whose new value no writer writes, or None."""
    if how == "nan":
        columns = [c for c, name in enumerate(rows[0])
                   if (table, name) in ALWAYS_SET or name in ("K", "run", "stream")
                   or all(row[c].isdigit() for row in rows[1:])]
    else:
        columns = [c for c, name in enumerate(rows[0])
                   if all(_numeric(row[c]) for row in rows[1:])
                   and not (how == "negative" and (table, name) in SIGNED)]
    if not columns:
        return None
    column = draw(st.sampled_from(columns))
    line = draw(st.integers(2, len(rows)))
    return line, column, {"text": "x", "negative": "-7", "inf": "inf", "nan": "nan"}[how]


@pytest.mark.parametrize("n", TIERS)
@pytest.mark.parametrize("kind", ["simulated", "serving", "client"])
def test_a_damaged_record_file_is_refused_or_flagged(n, kind, pristine_folders, tmp_path):
    """Issue 51: NaN, negative or text cells, a missing column, a torn row, a \\xff byte
    or a lost config.json in any record file a command reads was read with exit 0 (or a
    traceback); each is now a one-line error naming the file (and the line, for a cell),
    or, for what a killed writer leaves, a note on the output."""
    from hypothesis import assume

    from tests.run_folders import drop_column, tear_last_row

    commands = sorted({command for folder, command in READS if folder == kind})

    @_tier(n)
    @given(data=st.data())
    def check(data):
        command = data.draw(st.sampled_from(commands))
        table = data.draw(st.sampled_from(READS[(kind, command)]))
        how = data.draw(st.sampled_from(DAMAGES))
        folder = tmp_path / "run"
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(pristine_folders[kind], folder)
        path = folder / f"{table}.csv"
        rows = list(csv.reader(io.StringIO(path.read_text())))
        assume(len(rows) > 1)
        named = f"{table}.csv"
        if how == "config":
            (folder / "config.json").unlink()
            named = ""
        elif how == "torn":
            tear_last_row(path)
        elif how == "xff":
            data_ = path.read_bytes()
            path.write_bytes(data_[:len(data_) // 2] + b"\xff" + data_[len(data_) // 2:])
        elif how == "column":
            drop_column(path, data.draw(st.sampled_from(rows[0])))
            named += ":1"
        else:
            cell = _damage_cell(data.draw, table, rows, how)
            assume(cell is not None)
            line, column, value = cell
            rows[line - 1][column] = value
            out = io.StringIO()
            csv.writer(out).writerows(rows)
            path.write_text(out.getvalue())
            named += f":{line}"
        out_file = tmp_path / ("t.png" if command == "timeline" else "t.json")
        out_file.unlink(missing_ok=True)
        args = {"perfetto": ["export", "perfetto", str(folder), "--out", str(out_file)],
                "timeline": ["plot", "timeline", str(folder), "--out", str(out_file)],
                "compare": ["compare", str(folder), "--replications", "2"]}[command]
        result = invoke_checked(args)
        said = result.stdout + result.stderr
        if how in ("torn", "config") and result.exit_code == 0:
            assert ("torn" in said if how == "torn" else
                    "config.json" in said or "RECORDS ONLY" in said), (how, said)
            return
        assert result.exit_code == 2, (kind, command, table, how, said)
        assert named in result.stderr, (named, result.stderr)
        _nothing_half_written(result, out_file)

    check()
