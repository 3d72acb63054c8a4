"""The hostile-input corpus (issue 51, "Nothing lost, nothing hung"): every command, tried as
a new user would with inputs built to be wrong, each run as its own ``latsim`` process.

The corpus is fixed (seed 51): hostile option values (the float edges nan, inf, -0, 1e308,
5e-324, 1e-320, huge and over-long integers, text, unicode digits) on every option of
every command, found by walking the command line itself; hostile files (JSON, TOML and
JSONL nested 5,000 deep, ``\\xff`` bytes, empty, a 4 MiB line, a folder or an endless
device where a file goes) in every place a command reads a file; run folders of every kind
a reader takes (simulated, killed, interrupted, measured, serving, client:
``tests/run_folders.py``) damaged the ways ``tests/test_fuzz_folders.py`` damages them;
and files someone else wrote in every ``--out`` folder. No named pipe is used (a reader
that opened one would wait for ever; the fuzz tests bound that case with an alarm).

Each input is classed by what the process did:

- ``refused``: exit not 0, exactly one ``latsim: error:`` line on stderr, no traceback
  (``traces validate`` lists problems and exits 1, as documented);
- ``ran``: exit 0 on an input that may be valid;
- ``flagged``: exit 0 on an input invalid by construction, with a note naming the problem
  (what a killed writer leaves: a torn row, no config.json);
- and the bad outcomes: ``traceback``; ``hang`` (no answer within the time limit);
  ``silent`` (invalid by construction, exit 0, nothing said about it); ``unclear`` (exit
  not 0 without the one error line); ``lost`` (a file the user or another command wrote
  was changed or removed).

Writes ``results/bench/hostile_inputs.json`` (counts per class and per command, every bad
outcome's input, the date and the code's git revision) and prints a table; docs/testing.md
quotes its figures (:func:`quote`, checked by ``tests/test_doc_times.py``). The full corpus
takes about 9 minutes on 2 cores; ``--quick`` runs a tenth of it (the same kinds of input,
written to the temporary folder). Run from the repository root::

    .venv/bin/python bench/hostile_inputs.py [--quick] [--workers 2]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEED = 51
OUT = ROOT / "results" / "bench" / "hostile_inputs.json"
BAD = ("traceback", "hang", "silent", "unclear", "lost")
CLASSES = ("refused", "ran", "flagged", *BAD)
#: Seconds before a run is a hang: far above any input here that runs (a valid run is a
#: second or two; a refusal well under one), so only a process that does not end trips it.
TIMEOUT_S = 60.0
#: ``serve`` runs until stopped: one that prints that it is serving has run.
SERVE_TIMEOUT_S = 20.0

# ---------------------------------------------------------------- hostile values

FLOAT_EDGES = ["nan", "-nan", "NaN", "inf", "-inf", "Infinity", "-0", "-0.0", "0", "1e308",
               "-1e308", "1.8e308", "5e-324", "-5e-324", "1e-320", "1e-9", "-1", "0.5"]
INT_EDGES = [str(2**63), str(2**64 + 1), str(10**30), "-" + str(10**30), "9" * 400,
             "9" * 5000, "-1", "0", "1.5", "1e3"]
TEXT = ["abc", "", " ", "١٢", "４", "½", "1_0", "0x10", "1e", "--", "None", "true", "💥",
        "\u202e3", "x" * 10000, "1,2", "-"]
PATHS = ["", "/", "/dev/zero", "/nonexistent/x", "/proc/self/mem", ".", "\x7f"]
#: Values no number option takes, whatever its range: not a number, or not ASCII digits.
NOT_A_NUMBER = {"nan", "-nan", "NaN", "abc", "", " ", "١٢", "４", "½", "0x10", "1e", "--",
                "None", "true", "💥", "\u202e3", "x" * 10000, "1,2", "-"}


def _is_ascii_int(text: str) -> bool:
    body = text[1:] if text.startswith("-") else text
    return body.isascii() and body.isdigit()


# ---------------------------------------------------------------- the cases


@dataclass
class Case:
    """One input: the command (its words), the arguments, whether it is invalid by
    construction (``None``: it may be valid), the files it must leave as they were, and
    a note of what is hostile in it."""

    command: str
    args: list[str]
    invalid: bool | None
    what: str
    keep: list[Path] = field(default_factory=list)
    names: tuple[str, ...] = ()  # a problem a note must name (flagged), for damaged folders
    timeout: float = TIMEOUT_S
    setup: Callable[[], None] | None = None


class Fixtures:
    """The files the bases read: small valid inputs in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.trace = root / "trace.jsonl"
        self.trace.write_text('{"meta": {"duration": 10}}\n{"t": 1.5}\n{"t": 4.0}\n')
        self.fleet = root / "fleet.toml"
        self.fleet.write_text(_edit((ROOT / "examples" / "fleet.toml").read_text(),
                                    {"duration = 1800": "duration = 120",
                                     "seeds = 2": "seeds = 1"}))
        shutil.copy(ROOT / "examples" / "wan480p_usp.json", root)
        self.plan = root / "plan.toml"
        self.plan.write_text(_edit((ROOT / "examples" / "plan.toml").read_text(), {
            "duration = 1800": "duration = 120", "seeds = 2": "seeds = 1",
            "K = [3, 7, 21]": "K = [7]", "usp = [1, 2, 4, 8]": "usp = [8]",
            'policies = ["baseline", "speculative"]': 'policies = ["speculative"]'}))
        self.grid = root / "grid.toml"
        self.grid.write_text('name = "g"\nseeds = 1\nseed = 7\n[fixed]\nduration = 10\n'
                             "[axes]\nK = [4]\n")
        self.counter = 0

    def fresh(self, name: str = "out") -> Path:
        """A new path under the root (not created)."""
        self.counter += 1
        return self.root / "cases" / f"{self.counter:05d}" / name


def _edit(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


#: Each command's base: a small valid invocation (``{out}``: a fresh --out folder,
#: ``{file}`` a fresh file path), options as (name, values), then positional arguments.
def bases(fx: Fixtures) -> dict[str, tuple[list[str], list[tuple[str, list[str]]], bool]]:
    """command -> (positional args, options, whether the base itself runs quickly)."""
    small = [("--K", ["4"]), ("--C", ["0.2"]), ("--duration", ["5"]), ("--seeds", ["1"]),
             ("--jobs", ["1"]), ("--max-events", ["20000"])]
    sleep = [("--generator", ["sleep"]), ("--cost", ["fixed:0.02"])]
    return {
        "simulate": ([], small + [("--out", ["{out}"])], True),
        "sweep": ([], [("--K", ["4", "8"]), *small[1:]], True),
        "theory": ([], [("--K", ["4"]), ("--C", ["0.5"])], True),
        "plugins": ([], [], True),
        "controller": ([], [], True),
        "help": (["simulate"], [], True),
        "compare": (["{run}"], [("--replications", ["2"]), ("--out", ["{out}"])], True),
        "capacity": ([], [("--K", ["4"]), ("--C", ["0.3"]), ("--duration", ["10"]),
                          ("--max-streams", ["4"]), ("--slo-l95", ["3"]),
                          ("--slo-stall", ["5"]), ("--jobs", ["1"]),
                          ("--out", ["{out}"])], True),
        "grid": ([str(fx.grid)], [("--out", ["{out}"]), ("--jobs", ["1"])], True),
        "plan": ([str(fx.plan)], [("--out", ["{out}"]), ("--jobs", ["1"])], True),
        "traces generate": ([], [("--kind", ["low"]), ("--count", ["2"]),
                                 ("--duration", ["10"]), ("--out", ["{out}"])], True),
        "traces validate": ([str(fx.trace)], [], True),
        "traces show": ([str(fx.trace)], [], True),
        # the work bound stops every reproduction at plan time: refused, quickly
        **{f"reproduce{sub}": ([], [("--max-events", ["1000"]), ("--out", ["{out}"])], True)
           for sub in ("", " serving", " systems", " fleet", " replan-rule")},
        "plot timeline": (["{run}"], [("--out", ["{file}.png"])], True),
        "export perfetto": (["{run}"], [("--out", ["{file}.json"])], True),
        "fleet run": ([str(fx.fleet)], [("--out", ["{out}"]), ("--jobs", ["1"])], True),
        "fleet plan": ([str(fx.fleet)], [("--slo-l95", ["3"]), ("--slo-stall", ["5"]),
                                          ("--max-nodes", ["2"]), ("--seeds", ["1"]),
                                          ("--jobs", ["1"]), ("--out", ["{out}"])], True),
        # nobody listens on port 9: the client's run is refused once it tries to connect
        "client": (["ws://127.0.0.1:9"], [("--K", ["4"]), ("--duration", ["2"]),
                                          ("--out", ["{out}"])], True),
        "measure": ([], [*sleep, ("--K", ["4"]), ("--duration", ["1"]), ("--warmup", ["1"]),
                         ("--out", ["{out}"])], False),
        "profile": ([], [*sleep, ("--jobs", ["2"]), ("--out", ["{file}.json"])], True),
        "serve": ([], [*sleep, ("--K", ["4"]), ("--port", ["0"]), ("--warmup", ["1"]),
                       ("--out", ["{out}"])], False),
    }


def _render(positional: list[str], options: list[tuple[str, list[str]]], fx: Fixtures,
            run: Path | None = None) -> list[str]:
    out, file = fx.fresh(), fx.fresh("file")
    args: list[str] = []
    for word in positional:
        args.append(word.replace("{run}", str(run or "")))
    for name, values in options:
        args.append(name)
        args += [v.replace("{out}", str(out)).replace("{file}", str(file)) for v in values]
    return args


def command_options() -> dict[str, list[tuple[str, str, bool]]]:
    """Every command's options, found on the command line itself: (name, kind, takes
    several values); kind is int, float, choice, path, text or flag."""
    import typer.main

    from latsim.cli.root import app

    top = typer.main.get_command(app)
    found: dict[str, list[tuple[str, str, bool]]] = {}
    kinds = {"int": "int", "integer": "int", "integer range": "int", "float": "float",
             "float range": "float", "choice": "choice", "path": "path", "file": "path"}

    def walk(group, prefix: str) -> None:  # typer vendors click: duck-typed
        ctx = type("Context", (), {"obj": None})()
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            words = f"{prefix}{name}"
            if hasattr(command, "list_commands"):
                walk(command, f"{words} ")
                if not getattr(command, "invoke_without_command", False):
                    continue
            options = []
            for param in command.params:
                if param.param_type_name != "option" or param.name == "help":
                    continue
                long = max(param.opts, key=len)
                kind = "flag" if param.is_flag else kinds.get(param.type.name, "text")
                options.append((long, kind, bool(param.multiple or param.nargs != 1)))
            found[words] = options

    walk(top, "")
    return found


def _value_invalid(kind: str, value: str) -> bool | None:
    """Whether ``value`` is invalid by construction for an option of ``kind``."""
    if kind == "int":
        return not _is_ascii_int(value.strip()) or None
    if kind == "float":
        return (value in NOT_A_NUMBER or not value.strip().isascii()) or None
    if kind == "choice":
        return None
    return None


def _values(kind: str) -> list[str]:
    if kind in ("int", "float"):
        return FLOAT_EDGES + INT_EDGES + TEXT
    if kind == "path":
        return PATHS + TEXT[:6]
    return FLOAT_EDGES[:8] + INT_EDGES[:5] + TEXT


def option_cases(fx: Fixtures, rng: random.Random, share: float,
                 runs: dict[str, Path]) -> list[Case]:
    cases = []
    base = bases(fx)
    for command, options in sorted(command_options().items()):
        if command not in base:
            raise SystemExit(f"bench: no base for the command {command!r}; add one")
        positional, opts, _ = base[command]
        for name, kind, _several in options:
            if kind == "flag":
                continue
            values = _values(kind)
            picked = [v for v in values if rng.random() < share]
            for value in picked:
                replaced = [(n, [value]) if n == name else (n, v) for n, v in opts]
                if name not in dict(opts):
                    replaced.append((name, [value]))
                run = runs["simulated"] if "{run}" in positional else None
                args = [*command.split(), *_render(positional, replaced, fx, run)]
                cases.append(Case(command, args, _value_invalid(kind, value),
                                  f"{name} {value[:40]!r}",
                                  timeout=SERVE_TIMEOUT_S if command == "serve"
                                  else TIMEOUT_S))
        # the valid base, once (it must run)
        run = runs["simulated"] if "{run}" in positional else None
        cases.append(Case(command, [*command.split(), *_render(positional, opts, fx, run)],
                          None, "the base invocation",
                          timeout=SERVE_TIMEOUT_S if command == "serve" else TIMEOUT_S))
    return cases


# ---------------------------------------------------------------- hostile files

DEEP = 5000


def hostile_contents() -> dict[str, bytes]:
    """Contents no reader may take as valid."""
    return {
        "json nested 5000 deep": b"[" * DEEP + b"]" * DEEP,
        "json objects nested 5000 deep": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        "jsonl line nested 5000 deep": b'{"t": 1}\n' + b'{"t":' * DEEP + b"1" + b"}" * DEEP,
        "toml arrays nested 5000 deep": b"a = " + b"[" * DEEP + b"]" * DEEP + b"\n",
        "toml tables nested 5000 deep": b"a = " + b"{b = " * DEEP + b"1" + b"}" * DEEP,
        "\\xff bytes": b"\xff\xfe\x80 not utf-8 \xff\n",
        "empty": b"",
        "nul bytes": b"\x00" * 4096,
        "a 4 MiB line of digits": b"1" * (4 * 2**20),
        "a 4 MiB line of JSON": b'{"t": ' + b"1" * (4 * 2**20) + b"}\n",
        "a number of 5000 digits": b'{"t": ' + b"9" * 5000 + b"}\n" + b"t = " + b"9" * 5000,
        "1e999 and NaN": b'{"t": 1e999}\n{"t": NaN}\nt = nan\n',
        "text": b"hello, world\n",
    }


#: Where each command reads a file: (command, how the path goes into its arguments).
FILE_SLOTS: list[tuple[str, Callable[[str], list[tuple[str, list[str]]]] | None, str]] = [
    ("simulate", lambda p: [("--updates", [f"trace:{p}"])], "--updates trace:"),
    ("simulate", lambda p: [("--cost", [f"table:{p}"]), ("--C", [])], "--cost table:"),
    ("simulate", lambda p: [("--serving", [p])], "--serving"),
    ("sweep", lambda p: [("--cost", [f"table:{p}"]), ("--C", [])], "--cost table:"),
    ("capacity", lambda p: [("--serving", [p])], "--serving"),
    ("capacity", lambda p: [("--updates", [f"trace:{p}"])], "--updates trace:"),
    ("traces validate", None, "PATH"),
    ("traces show", None, "PATH"),
    ("plan", None, "FILE"),
    ("fleet run", None, "FILE"),
    ("fleet plan", None, "FILE"),
    ("grid", None, "FILE"),
    ("measure", lambda p: [("--trace", [p])], "--trace"),
    ("client", lambda p: [("--trace", [p])], "--trace"),
    ("profile", lambda p: [("--cost", [f"table:{p}"])], "--cost table:"),
]


def file_cases(fx: Fixtures, rng: random.Random, share: float) -> list[Case]:
    cases = []
    base = bases(fx)
    contents = hostile_contents()
    places = {**{name: ("bytes", data) for name, data in contents.items()},
              "a folder": ("folder", b""), "/dev/zero": ("device", b""),
              "a missing file": ("missing", b"")}
    for command, slot, where in FILE_SLOTS:
        positional, opts, _ = base[command]
        for what, (how, data) in places.items():
            if rng.random() >= share:
                continue
            path = fx.fresh("input" + (".toml" if command in ("plan", "fleet run",
                                                              "fleet plan", "grid")
                                       else ".json" if "table" in where or "serving" in where
                                       else ".jsonl"))

            def setup(path: Path = path, how: str = how, data: bytes = data) -> None:
                path.parent.mkdir(parents=True, exist_ok=True)
                if how == "bytes":
                    path.write_bytes(data)
                elif how == "folder":
                    path.mkdir()
                elif how == "device":
                    path.symlink_to("/dev/zero")

            if slot is None:
                args_pos = [str(path)]
                replaced = opts
            else:
                args_pos = positional
                extra = dict(slot(str(path)))
                replaced = [(n, extra.pop(n)) if n in extra else (n, v) for n, v in opts]
                replaced = [(n, v) for n, v in replaced if v]
                replaced += [(n, v) for n, v in extra.items() if v]
            args = [*command.split(), *_render(args_pos, replaced, fx)]
            # an empty TOML file is a valid --serving file: every key is optional
            invalid = None if (where == "--serving" and what == "empty") else True
            cases.append(Case(command, args, invalid, f"{where} {what}", setup=setup,
                              keep=[path] if how == "bytes" else []))
    return cases


def reproduce_trace_cases(fx: Fixtures, rng: random.Random, share: float) -> list[Case]:
    """``reproduce --traces DIR`` whose low/ set holds one hostile trace."""
    cases = []
    for what, data in hostile_contents().items():
        if rng.random() >= share:
            continue
        root = fx.fresh("sets")

        def setup(root: Path = root, data: bytes = data) -> None:
            for kind in ("low", "high"):
                (root / kind).mkdir(parents=True)
                shutil.copy(fx.trace, root / kind / f"{kind}_000.jsonl")
            (root / "low" / "low_001.jsonl").write_bytes(data)

        cases.append(Case("reproduce", ["reproduce", "--traces", str(root), "--out",
                                        str(fx.fresh()), "--max-events", "10000000"],
                          True, f"--traces with low/low_001.jsonl {what}", setup=setup,
                          keep=[root / "low" / "low_001.jsonl"]))
    return cases


# ---------------------------------------------------------------- damaged run folders

#: The damages of ``tests/test_fuzz_folders.apply`` used here (a named pipe is not).
FOLDER_DAMAGES = ("truncate", "random", "non-utf8", "delete", "json", "column", "cell",
                  "device", "sparse")
#: Cells no writer writes in a numeric column.
BAD_CELLS = ("x", "True", "١", "1e999", "nan", "-7")


def pristine_folders(root: Path) -> dict[str, Path]:
    from tests.run_folders import (
        client_run,
        complete_run,
        interrupted_run,
        killed_run,
        live_style_run,
        serving_run,
    )

    return {"simulated": complete_run(root / "simulated"),
            "killed": killed_run(root / "killed", 15.0),
            "interrupted": interrupted_run(root / "interrupted", 12.0),
            "measured": live_style_run(root / "measured", 0.05),
            "serving": serving_run(root / "serving"),
            "client": client_run(root / "client")}


def _reads(kind: str, command: str) -> tuple[str, ...]:
    from tests.test_fuzz_folders import READS

    key = "serving" if kind == "serving" else "client" if kind == "client" else "simulated"
    return READS.get((key, command), ())


def folder_cases(fx: Fixtures, rng: random.Random, share: float,
                 pristine: dict[str, Path]) -> list[Case]:
    from tests.run_folders import drop_column, tear_last_row
    from tests.test_fuzz_folders import CELLS, FOREIGN_JSON, _numeric, apply

    cases = []
    commands = {"compare": lambda d, o: ["compare", str(d), "--replications", "2"],
                "timeline": lambda d, o: ["plot", "timeline", str(d), "--out", f"{o}.png"],
                "perfetto": lambda d, o: ["export", "perfetto", str(d), "--out", f"{o}.json"]}
    for kind, source in pristine.items():
        names = sorted(p.name for p in source.iterdir() if p.is_file())
        for command, make in commands.items():
            if command == "compare" and kind == "serving":
                continue  # compare takes single runs and client folders
            read = {f"{t}.csv" for t in _reads(kind, command)}
            # 1. tests/test_fuzz_folders.apply's damages on every file
            for name in names:
                for how in FOLDER_DAMAGES:
                    if rng.random() >= share:
                        continue
                    params = (rng.random(), rng.randbytes(rng.randrange(1, 64)),
                              rng.choice(FOREIGN_JSON), rng.choice(CELLS), rng.randrange(100))
                    invalid = None
                    if name in read and how in ("random", "non-utf8", "device", "sparse",
                                                "column"):
                        invalid = True
                    if name == "config.json" and how in ("non-utf8", "device", "sparse"):
                        invalid = True
                    folder, out = fx.fresh("run"), fx.fresh("o")

                    def setup(folder=folder, source=source, name=name, how=how,
                              params=params) -> None:
                        folder.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copytree(source, folder)
                        apply(folder / name, how, *params)

                    cases.append(Case(command if command == "compare" else
                                      {"timeline": "plot timeline",
                                       "perfetto": "export perfetto"}[command],
                                      make(folder, out), invalid,
                                      f"{kind} folder, {name} {how}", setup=setup,
                                      names=(name,), keep=[folder]))
            # 2. a damaged cell, a dropped column, a torn row, \xff, no config.json
            for table in sorted(read):
                if not (source / table).exists():
                    continue
                rows = [r for r in csv.reader(io.StringIO((source / table).read_text()))
                        if r]
                if len(rows) < 2 or any(len(r) != len(rows[0]) for r in rows):
                    continue  # a ragged table (a client's probes) is damaged above only
                for how in ("cell", "column", "torn", "xff", "config"):
                    if rng.random() >= share * 2:
                        continue
                    folder, out = fx.fresh("run"), fx.fresh("o")
                    column = rng.choice([c for c, _ in enumerate(rows[0])
                                         if all(len(r) > c and _numeric(r[c])
                                                for r in rows[1:])] or [0])
                    line = rng.randrange(2, len(rows) + 1)
                    cell = rng.choice(BAD_CELLS)
                    if rows[0][column] in ("t0", "t1", "t2", "t3", "offset") and cell == "-7":
                        cell = "x"  # a client's raw clocks may be negative

                    def setup(folder=folder, source=source, table=table, how=how,
                              column=column, line=line, cell=cell, rows=rows) -> None:
                        folder.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copytree(source, folder)
                        path = folder / table
                        if how == "cell":
                            changed = [list(r) for r in rows]
                            changed[line - 1][column] = cell
                            text = io.StringIO()
                            csv.writer(text).writerows(changed)
                            path.write_text(text.getvalue())
                        elif how == "column":
                            drop_column(path, rows[0][column])
                        elif how == "torn":
                            tear_last_row(path)
                        elif how == "xff":
                            data = path.read_bytes()
                            path.write_bytes(data[:len(data) // 2] + b"\xff"
                                             + data[len(data) // 2:])
                        else:
                            (folder / "config.json").unlink(missing_ok=True)

                    label = {"cell": f"{table}:{line} {rows[0][column]} = {cell!r}",
                             "column": f"{table} without {rows[0][column]}",
                             "torn": f"{table} last row torn", "xff": f"{table} with \\xff",
                             "config": "no config.json"}[how]
                    named = ("torn",) if how == "torn" else (
                        ("config.json", "RECORDS ONLY") if how == "config" else (table,))
                    cases.append(Case({"compare": "compare", "timeline": "plot timeline",
                                       "perfetto": "export perfetto"}[command],
                                      make(folder, out), True, f"{kind} folder, {label}",
                                      setup=setup, names=named, keep=[folder]))
    return cases


# ---------------------------------------------------------------- foreign files in --out

#: What each folder-writing command writes, by name (a foreign file of that name must
#: survive), and the arguments that make it write.
def foreign_cases(fx: Fixtures, rng: random.Random, share: float,
                  runs: dict[str, Path]) -> list[Case]:
    base = bases(fx)
    writes = {
        "simulate": ("config.json", "summary.json", "jobs.csv", "trace.jsonl"),
        "sweep": ("config.json", "summary.json", "summary.csv"),
        "capacity": ("capacity.json", "capacity.csv"),
        "compare": ("compare.json", "compare.csv"),
        "grid": ("grid.json", "cells.csv", "cells.jsonl"),
        "plan": ("plan.json", "candidates.csv", "frontier.png"),
        "traces generate": ("low_000.jsonl", "low_001.jsonl"),
        "fleet run": ("fleet.json", "summary.json", "sessions.csv"),
        "fleet plan": ("fleet_plan.json", "plan.csv", "tried.csv"),
        "client": ("config.json", "conditions.csv"),
        "measure": ("measure.json",),
        "serve": ("tasks.csv",),
        "reproduce": ("l50.csv", "reproduce.json", "reproduce.png"),
        "reproduce serving": ("e2e.csv", "reproduce.json"),
        "reproduce systems": ("systems.png",),
        "reproduce fleet": ("policy.csv",),
        "reproduce replan-rule": ("replan_rule.csv",),
    }
    # Someone else's file: another command's record, plain text, bytes, an empty file, a
    # folder of that name.
    contents = {"another program's record": b'{"kind": "theirs", "format": "not-latsim", '
                b'"command": ["make", "report"], "status": "complete"}\n',
                "the user's notes": b"my notes\n", "\\xff bytes": b"\xff\xfe",
                "an empty file": b"", "a folder": None}
    cases = []
    for command, names in writes.items():
        positional, opts, _ = base[command]
        if command.startswith("reproduce"):  # let the reproduction get to its folder
            opts = [(n, v) for n, v in opts if n != "--max-events"]
        for name in names:
            for what, data in contents.items():
                if rng.random() >= share:
                    continue
                out = fx.fresh()
                replaced = [(n, [str(out)]) if n == "--out" else (n, v) for n, v in opts]
                run = runs["simulated"] if "{run}" in positional else None

                def setup(out=out, name=name, data=data) -> None:
                    out.mkdir(parents=True)
                    (out / "keep-me.txt").write_text("the user's\n")
                    if data is None:
                        (out / name).mkdir()
                        (out / name / "inside.txt").write_text("kept\n")
                    else:
                        (out / name).write_bytes(data)

                cases.append(Case(command, [*command.split(),
                                            *_render(positional, replaced, fx, run)],
                                  None, f"--out holding {name}: {what}", setup=setup,
                                  keep=[out / "keep-me.txt", out / name],
                                  timeout=SERVE_TIMEOUT_S if command == "serve"
                                  else TIMEOUT_S))
    return cases


# ---------------------------------------------------------------- running and classing


def _snapshot(paths: list[Path]) -> dict[str, object]:
    """What each kept path holds: a file's digest, a folder's entries (recursively), a
    link's target; a pipe or device is not read."""
    seen: dict[str, object] = {}
    for path in paths:
        for p in [path, *(sorted(path.rglob("*")) if path.is_dir()
                          and not path.is_symlink() else [])]:
            if p.is_symlink():
                seen[str(p)] = ("link", os.readlink(p))
            elif p.is_file():
                seen[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                seen[str(p)] = "folder"
            elif p.exists():
                seen[str(p)] = "special"
    return seen


def _latsim(source: Path | None) -> list[str]:
    """The command line to run: this environment's ``latsim``, or with ``source`` the
    latsim of another checkout (on ``PYTHONPATH``, which the caller sets)."""
    script = Path(sys.executable).with_name("latsim")
    if source is None and script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from latsim.cli import main; sys.exit(main())"]


_lock = threading.Lock()
_done = 0


def run_case(case: Case, latsim: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Run one input in ``cwd`` (a scratch folder: an --out of ``.`` or ``abc`` lands
    there) and class it."""
    if case.setup is not None:
        case.setup()
    global _done
    with _lock:
        _done += 1
        if _done % 100 == 0:
            print(f"{_done} done", file=sys.stderr, flush=True)
    before = _snapshot(case.keep)
    started = time.monotonic()
    try:
        done = subprocess.run([*latsim, *case.args], capture_output=True, timeout=case.timeout,
                              env=env, stdin=subprocess.DEVNULL, cwd=cwd)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = None, exc.stdout or b"", exc.stderr or b""
    took = time.monotonic() - started
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    after = _snapshot(case.keep)
    lost = [p for p, held in before.items() if after.get(p) != held]
    verdict = classify(case, code, stdout, stderr, lost)
    return {"command": case.command, "class": verdict, "what": case.what,
            "args": [a if len(a) <= 200 else a[:200] + f"...({len(a)} chars)"
                     for a in case.args],
            "exit": code, "seconds": round(took, 2),
            "stderr_tail": stderr[-600:], "lost": lost}


def classify(case: Case, code: int | None, stdout: str, stderr: str,
             lost: list[str]) -> str:
    if lost:
        return "lost"
    if "Traceback (most recent call last)" in stdout + stderr:
        return "traceback"
    if code is None:
        if case.command == "serve" and "serving generator" in stdout:
            return "ran"  # a server runs until it is stopped
        return "hang"
    if code == 0:
        if not case.invalid:
            return "ran"
        said = stdout + stderr
        if case.names and any(name in said for name in case.names):
            return "flagged"
        return "silent"
    lines = stderr.strip("\n").split("\n") if stderr.strip() else []
    errors = [line for line in lines if line.startswith("latsim: error: ")]
    if case.command == "traces validate" and code == 1 and lines and lines[-1].startswith(
            "latsim: ") and "problem" in lines[-1]:
        return "refused"  # it lists the problems on stdout and exits 1, as documented
    if code in (1, 2) and len(errors) == 1 and lines[-1] == errors[0] and all(
            line.startswith("latsim ") or line.startswith("latsim: ") or "warning" in line
            for line in lines):
        return "refused"
    return "unclear"


def quote(report: dict) -> str:
    """The corpus's figures as docs/testing.md quotes them (``tests/test_doc_times.py``
    checks the quote against ``results/bench/hostile_inputs.json``)."""
    n = report["classes"]
    return (f"{report['inputs']:,} inputs ({report['date']}): {n['refused']:,} refused "
            f"cleanly, {n['ran']:,} ran, {n['flagged']:,} ran with a note naming the "
            f"problem; {n['traceback']} tracebacks, {n['hang']} hangs, {n['silent']} silent "
            f"acceptances, {n['unclear']} unclear refusals, {n['lost']} lost files")


def corpus(fx: Fixtures, quick: bool) -> list[Case]:
    rng = random.Random(SEED)
    share = 0.1 if quick else 1.0
    pristine = pristine_folders(fx.root / "pristine")
    cases = (option_cases(fx, rng, share * 0.085, pristine)
             + file_cases(fx, rng, share)
             + reproduce_trace_cases(fx, rng, share)
             + folder_cases(fx, rng, share * 0.22, pristine)
             + foreign_cases(fx, rng, share, pristine))
    return cases


def git_revision(root: Path) -> str:
    """``root``'s commit, ``-dirty`` where tracked files differ from it."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=root, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=root).stdout.strip()
        return done.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the corpus")
    parser.add_argument("--workers", type=int, default=2, help="processes at once")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the JSON to write (default {OUT.relative_to(ROOT)}; with "
                        "--quick, hostile_inputs_quick.json in the temporary folder, so a "
                        "quick run never stands for the corpus)")
    parser.add_argument("--only", default=None, help="only commands starting with this")
    parser.add_argument("--source", type=Path, default=None,
                        help="run the latsim of this checkout instead (e.g. an older one, "
                        "for figures before a fix); the corpus stays this one")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "hostile_inputs_quick.json" if args.quick \
            else OUT
    env = {**os.environ, "MPLBACKEND": "Agg", "COLUMNS": "100", "PYTHONHASHSEED": "0"}
    for name in ("LATSIM_FAULT", "LATSIM_TOKEN"):
        env.pop(name, None)
    latsim = _latsim(args.source)
    if args.source is not None:
        env["PYTHONPATH"] = str(args.source.resolve())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="latsim-hostile-") as tmp:
        fx = Fixtures(Path(tmp))
        cases = corpus(fx, args.quick)
        if args.only:
            cases = [c for c in cases if c.command.startswith(args.only)]
        print(f"{len(cases)} inputs, {args.workers} at once", file=sys.stderr)
        with ThreadPoolExecutor(args.workers) as pool:
            cwd = fx.root / "cwd"
            cwd.mkdir()
            results = list(pool.map(lambda c: run_case(c, latsim, env, cwd), cases))
    wall = time.monotonic() - started
    by_class = Counter(r["class"] for r in results)
    by_command: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        by_command[r["command"]][r["class"]] += 1
    report = {
        "bench": "bench/hostile_inputs.py" + (" --quick" if args.quick else ""),
        "date": dt.date.today().isoformat(),
        "revision": git_revision(args.source or ROOT),
        "seed": SEED,
        "inputs": len(results),
        "wall_s": round(wall, 1),
        "workers": args.workers,
        "classes": {c: by_class.get(c, 0) for c in CLASSES},
        "bad": sum(by_class.get(c, 0) for c in BAD),
        "by_command": {cmd: {c: n for c, n in sorted(counts.items())}
                       for cmd, counts in sorted(by_command.items())},
        "bad_outcomes": [r for r in results if r["class"] in BAD],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    width = max(len(c) for c in by_command)
    print(f"{'command':<{width}} " + " ".join(f"{c:>9}" for c in CLASSES))
    for cmd, counts in sorted(by_command.items()):
        print(f"{cmd:<{width}} " + " ".join(f"{counts.get(c, 0):>9}" for c in CLASSES))
    print(f"{'all':<{width}} " + " ".join(f"{by_class.get(c, 0):>9}" for c in CLASSES))
    print(f"{len(results)} inputs in {wall:.0f} s; {report['bad']} bad; wrote {args.out}")
    print(quote(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
