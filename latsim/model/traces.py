"""Condition traces: JSONL files of condition arrival times (format in ``traces/README.md``).

Line 1 may be a header ``{"meta": {"duration": 60.0, ...}}``; every other line is one
condition, an object with at least ``"t"`` (seconds from stream start, sorted). Reading
collects every problem with its file and line; :func:`load_trace` raises on the first file
with problems, :func:`validate_trace` returns them all.

What counts as a trace (decided here, tested in ``tests/test_tracegen.py``):

- A header-only trace is valid: a session of ``duration`` seconds in which the viewer sent
  nothing (it contributes busy and stall time, and A, to a set). Whether a *run* can use a
  source whose traces have no conditions at all is the arrival source's call
  (:class:`latsim.model.arrivals.TraceArrivals`: an error, as there is no latency to measure).
- A file with neither a header nor a condition (empty, or blank lines only) is a problem: it
  says nothing, not even how long the session was, and is most likely a failed write.
- A file is read with bounds: at most :data:`~latsim.errors.MAX_INPUT_BYTES` bytes and
  ``max_events`` conditions (``--max-events``), so a device or a runaway file cannot hang.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latsim.errors import DEFAULT_MAX_TRACE_EVENTS, MAX_DURATION, MAX_INPUT_BYTES, LatsimError
from latsim.writing import replacing


@dataclass(frozen=True)
class Trace:
    """Arrival times (seconds, non-decreasing) of one viewer session."""

    name: str
    times: tuple[float, ...]
    duration: float | None = None
    meta: dict = field(default_factory=dict, compare=False)


def refuse_pipe(path: str | Path) -> None:
    """An ``OSError`` (``EINVAL``, "a named pipe or socket, not a file") for a named pipe or
    a socket at ``path``: opening one to read would wait for a writer. Other ``OSError``
    (no such file) pass through."""
    mode = os.stat(path).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise OSError(errno.EINVAL, "a named pipe or socket, not a file", str(path))


def read_bounded_text(path: str | Path, limit: int = MAX_INPUT_BYTES) -> str:
    """A UTF-8 file's text, reading at most ``limit`` bytes (a larger file, or an endless
    device such as ``/dev/zero``, is a :class:`LatsimError`, not a hang). ``OSError`` and
    ``UnicodeDecodeError`` pass through for the caller to word; a path the OS cannot take
    (a NUL byte) is an ``OSError`` too."""
    try:
        refuse_pipe(path)  # a pipe would block the open: refuse it first
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except ValueError as exc:  # embedded NUL byte, unencodable name
        raise OSError(0, str(exc), str(path)) from None
    if len(data) > limit:
        raise LatsimError(f"{path}: larger than {limit:,} bytes; not read")
    return data.decode("utf-8")


def read_input_file(path: str | Path, what: str) -> str:
    """:func:`read_bounded_text`, with an unreadable file a one-line :class:`LatsimError`
    (``cannot read WHAT PATH: reason``)."""
    try:
        return read_bounded_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise LatsimError(f"cannot read {what} {path}: {reason}") from None


def read_toml(path: str | Path, what: str) -> dict:
    """A TOML file (a serving, system, fleet or deployment file) read with
    :func:`read_input_file`, its relative file paths resolved from its own folder
    (:func:`paths_from_folder`); invalid TOML is a one-line :class:`LatsimError` naming the
    file."""
    data = loads_toml(read_input_file(path, what), str(path))
    return paths_from_folder(data, Path(path).parent, str(path))


#: The built-in spec prefixes whose argument is a file or a folder: cost tables
#: (``table:``, ``usp:PATH[@G]``), system files (``sdvg:``), arrival curves (``curve:``) and
#: traces (``trace:``, ``traces:``). A plug-in's arguments are passed as written.
FILE_SPECS = frozenset({"table", "usp", "sdvg", "curve", "trace", "traces"})


def paths_from_folder(value: Any, folder: Path, source: str) -> Any:
    """``value`` (a parsed TOML document, or any part of it) with every relative path of a
    :data:`FILE_SPECS` spec joined to ``folder``, the folder of the file it was read from:
    a path in an input file means the same file from wherever the command runs. A joined
    path that does not exist where the same path read from the current folder does is a
    one-line error that says so (the rule changed: such files once read paths from the
    current folder)."""
    if isinstance(value, dict):
        return {key: paths_from_folder(item, folder, source) for key, item in value.items()}
    if isinstance(value, list):
        return [paths_from_folder(item, folder, source) for item in value]
    if not isinstance(value, str):
        return value
    prefix, colon, argument = value.partition(":")
    if not colon or prefix not in FILE_SPECS:
        return value
    path, at, degree = (argument.rpartition("@") if prefix == "usp" and "@" in argument
                        else (argument, "", ""))
    return f"{prefix}:{path_from_folder(path, folder, source)}{at}{degree}"


def path_from_folder(path: str, folder: Path, source: str) -> str:
    """One file path of an input file, read from ``folder`` (see
    :func:`paths_from_folder`); an absolute path, or any path of a file in the current
    folder, is kept as given."""
    given = Path(path.strip())
    if not path.strip() or given.is_absolute() or folder == Path("."):
        return path
    joined = folder / given
    if not joined.exists() and given.exists():
        raise LatsimError(f"{source}: {path} is read from the file's own folder ({joined} "
                          f"does not exist); write it relative to {folder}/ or absolute")
    return str(joined)


def loads_toml(text: str, source: str) -> dict:
    """TOML text from ``source`` (named in the errors): invalid TOML, or nesting too deep
    for the parser (a damaged or hostile file), is a one-line :class:`LatsimError`."""
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LatsimError(f"{source}: not valid TOML ({exc})") from None
    except RecursionError:
        raise LatsimError(f"{source}: not valid TOML (nested too deeply to read)") from None


def _finite(value: object) -> float | None:
    """``value`` as a finite float if it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        return None
    return number if math.isfinite(number) else None


def _parse(path: Path,
           max_events: int = DEFAULT_MAX_TRACE_EVENTS) -> tuple[Trace | None, list[str]]:
    problems: list[str] = []
    try:
        text = read_bounded_text(path)
    except LatsimError as exc:
        return None, [str(exc)]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"]
    meta: dict = {}
    header = False
    times: list[float] = []
    lines: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not JSON ({exc.msg})")
            continue
        except (ValueError, RecursionError) as exc:  # a 5000-digit integer, deep nesting
            problems.append(f"{where}: not usable JSON ({type(exc).__name__})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{where}: expected a JSON object")
            continue
        if "meta" in obj and "t" not in obj:
            if times or header:
                problems.append(f"{where}: the meta header must be the first line")
            elif not isinstance(obj["meta"], dict):
                problems.append(f"{where}: meta must be an object")
            else:
                meta, header = obj["meta"], True
            continue
        t_raw = obj.get("t")
        if t_raw is None:
            problems.append(f"{where}: missing \"t\"")
            continue
        t = _finite(t_raw)
        if t is None:
            shown = repr(t_raw) if len(repr(t_raw)) <= 40 else repr(t_raw)[:37] + "..."
            problems.append(f"{where}: \"t\" must be a finite number, got {shown}")
            continue
        if t < 0:
            problems.append(f"{where}: negative \"t\" ({t})")
            continue
        if times and t < times[-1]:
            problems.append(f"{where}: unsorted: t={t} comes after t={times[-1]}")
            continue
        if len(times) >= max_events:
            problems.append(f"{where}: more than {max_events:,} conditions; not read further "
                            "(raise the bound with --max-events)")
            break
        times.append(t)
        lines.append(lineno)
    if not header and not times and not problems:
        problems.append(f"{path}:1: empty: no header and no conditions (a session without "
                        "updates needs a {\"meta\": {\"duration\": ...}} header)")
    duration = meta.get("duration")
    if duration is not None:
        value = _finite(duration)
        if value is None or not 0 < value <= MAX_DURATION:
            problems.append(f"{path}:1: meta duration must be a positive number of seconds "
                            f"<= {MAX_DURATION:g}")
            duration = None
        else:
            duration = value
            problems += [
                f"{path}:{lineno}: t={t} is beyond the declared duration {duration:g}"
                for t, lineno in zip(times, lines, strict=True)
                if t >= duration
            ]
            problems.sort(key=_line_number)
    trace = Trace(path.stem, tuple(times), duration, meta)
    return trace, problems


def _line_number(problem: str) -> int:
    parts = problem.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def validate_trace(path: str | Path, max_events: int = DEFAULT_MAX_TRACE_EVENTS) -> list[str]:
    """Every problem in one trace file, each as ``file:line: message``."""
    return _parse(Path(path), max_events)[1]


def load_trace(path: str | Path, max_events: int = DEFAULT_MAX_TRACE_EVENTS) -> Trace:
    """Read a trace, raising :class:`LatsimError` with its first problem."""
    trace, problems = _parse(Path(path), max_events)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise LatsimError(problems[0] + more)
    assert trace is not None
    return trace


def trace_files(directory: str | Path) -> list[Path]:
    """The ``*.jsonl`` files in a folder, sorted by name."""
    folder = Path(directory)
    if not folder.is_dir():
        raise LatsimError(f"{directory}: not a folder")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise LatsimError(f"{directory}: no *.jsonl traces in this folder")
    return files


def write_trace(path: str | Path, times: list[float], meta: dict | None = None) -> None:
    """Write a trace file (header line first when ``meta`` is given)."""
    lines = [json.dumps({"meta": meta}, sort_keys=True)] if meta else []
    lines += [json.dumps({"t": round(t, 6), "version": i + 1}) for i, t in enumerate(times)]
    with replacing(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
