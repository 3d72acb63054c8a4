"""Condition traces: JSONL files of condition arrival times (format in ``traces/README.md``).

Line 1 may be a header ``{"meta": {"duration": 60.0, ...}}``; every other line is one
condition, an object with at least ``"t"`` (seconds from stream start, sorted). Reading
collects every problem with its file and line; :func:`load_trace` raises on the first file
with problems, :func:`validate_trace` returns them all.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from latsim.errors import LatsimError


@dataclass(frozen=True)
class Trace:
    """Arrival times (seconds, non-decreasing) of one viewer session."""

    name: str
    times: tuple[float, ...]
    duration: float | None = None
    meta: dict = field(default_factory=dict, compare=False)


def _parse(path: Path) -> tuple[Trace | None, list[str]]:
    problems: list[str] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"]
    meta: dict = {}
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
        if not isinstance(obj, dict):
            problems.append(f"{where}: expected a JSON object")
            continue
        if "meta" in obj and "t" not in obj:
            if times or meta:
                problems.append(f"{where}: the meta header must be the first line")
            elif not isinstance(obj["meta"], dict):
                problems.append(f"{where}: meta must be an object")
            else:
                meta = obj["meta"]
            continue
        t = obj.get("t")
        if t is None:
            problems.append(f"{where}: missing \"t\"")
            continue
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            problems.append(f"{where}: \"t\" must be a finite number, got {t!r}")
            continue
        if t < 0:
            problems.append(f"{where}: negative \"t\" ({t})")
            continue
        if times and t < times[-1]:
            problems.append(f"{where}: unsorted: t={t} comes after t={times[-1]}")
            continue
        times.append(float(t))
        lines.append(lineno)
    duration = meta.get("duration")
    if duration is not None:
        if isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0:
            problems.append(f"{path}:1: meta duration must be a positive number")
            duration = None
        else:
            problems += [
                f"{path}:{lineno}: t={t} is beyond the declared duration {duration}"
                for t, lineno in zip(times, lines, strict=True)
                if t >= duration
            ]
            problems.sort(key=_line_number)
    trace = Trace(path.stem, tuple(times), float(duration) if duration else None, meta)
    return trace, problems


def _line_number(problem: str) -> int:
    parts = problem.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def validate_trace(path: str | Path) -> list[str]:
    """Every problem in one trace file, each as ``file:line: message``."""
    return _parse(Path(path))[1]


def load_trace(path: str | Path) -> Trace:
    """Read a trace, raising :class:`LatsimError` with its first problem."""
    trace, problems = _parse(Path(path))
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
    Path(path).write_text("\n".join(lines) + "\n")
