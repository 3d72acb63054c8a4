"""The record tables as files: :func:`write_csv` writes records as CSV with a stable column
order (extra leading columns first), :func:`read_csv` reads them back; and the bounded reads
of a record or run-folder file (:func:`read_file_bytes`, :func:`read_text`,
:func:`read_header`). The record types
are the controller's (:mod:`latsim.controller.records`), which does no I/O.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import Any

from latsim.controller.records import NAN, SlotLog, column_names, domain_of
from latsim.errors import MAX_RECORD_FILE_BYTES, LatsimError
from latsim.writing import writing


def _row_getter(record_type: type) -> attrgetter:
    """The record's fields as a tuple, in column order (``dataclasses.astuple`` deep-copies
    every value, which made writing a sweep's records slower than simulating it)."""
    names = column_names(record_type)
    return attrgetter(*names) if len(names) > 1 else (lambda r, n=names[0]: (getattr(r, n),))


def write_csv(
    path: Path,
    record_type: type,
    records: Iterable[object],
    extra: Sequence[tuple[str, object]] = (),
    append: bool = False,
) -> None:
    """Write records as CSV; ``extra`` columns (e.g. run id, policy) go first on every row."""
    new_file = not append or not path.exists()
    with writing(path), path.open("a" if append else "w", newline="") as handle:
        writer = csv.writer(handle)
        if new_file:
            writer.writerow([name for name, _ in extra] + column_names(record_type))
        prefix = [value for _, value in extra]
        rows = records.rows() if isinstance(records, SlotLog) else map(
            _row_getter(record_type), records)
        writer.writerows(prefix + [_cell(v) for v in row] for row in rows)


class CsvRows(list):
    """What :func:`read_csv` returns: a list of ``(extra columns, record)`` rows, plus
    ``torn``: ``None``, or a one-line note that the file's last row was cut short (a writer
    killed mid-row) and was dropped."""

    torn: str | None = None


def _parse(raw: str, kind: str) -> object:
    if kind in ("float", "int") and not raw.isascii():  # Python reads '١' as 1; pandas not
        raise ValueError(f"{raw!r} is not an ASCII number")
    if kind == "float":
        return float(raw) if raw != "" else NAN
    if kind == "int":
        return int(raw)
    if kind == "bool":
        if raw not in ("True", "False"):
            raise ValueError(f"{raw!r} is not True or False")
        return raw == "True"
    return raw


def read_file_bytes(path: Path, limit: int = MAX_RECORD_FILE_BYTES) -> bytes:
    """A record or run-folder file's bytes: a regular file of at most ``limit`` bytes.
    Anything else (a device such as ``/dev/zero``, a named pipe, a larger file) is a
    one-line error, not a hang or a ``MemoryError``; ``OSError`` passes through."""
    with _open_regular(path, limit) as (handle, size):
        # a read of n bytes allocates n first: ask for what the file holds, and more only
        # where it grew meanwhile (a writer appending), a chunk at a time up to the limit
        parts = [handle.read(size + 1)]
        read = len(parts[0])
        while read > size and read <= limit and parts[-1]:
            parts.append(handle.read(min(2**20, limit + 1 - read)))
            read += len(parts[-1])
        data = b"".join(parts) if len(parts) > 1 else parts[0]
    if len(data) > limit:  # it grew while being read
        raise LatsimError(f"{path}: larger than {limit:,} bytes; not read")
    return data


@contextmanager
def _open_regular(path: Path, limit: int) -> Iterator[tuple[io.BufferedReader, int]]:
    """``path`` open to read, and its size: a regular file of at most ``limit`` bytes (see
    :func:`read_file_bytes`). Checked on the open file, so a name swapped meanwhile for a
    pipe cannot hang the read."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # before opening: a pipe's open waits
        raise LatsimError(f"{path}: not a regular file (a device, pipe or folder); not read")
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise LatsimError(f"{path}: not a regular file (a device, pipe or folder); not "
                              "read")
        if info.st_size > limit:
            raise LatsimError(f"{path}: larger than {limit:,} bytes; not read")
        yield handle, info.st_size


def count_rows(path: Path) -> int:
    """The rows of a record file past its header (its line ends, less one; a torn last
    line counts as a row), counted without parsing, so a work bound can be checked before
    a large file is read; bounded as :func:`read_file_bytes` is."""
    with _open_regular(path, MAX_RECORD_FILE_BYTES) as (handle, size):
        ends, left, last = 0, size, b""
        while left > 0:
            chunk = handle.read(min(2**22, left))
            if not chunk:
                break
            ends += chunk.count(b"\n")
            left -= len(chunk)
            last = chunk[-1:]
    return max(0, ends - 1 + (1 if size and last != b"\n" else 0))


def read_text(path: Path, limit: int = MAX_RECORD_FILE_BYTES) -> str:
    """A record or telemetry file's text (:func:`read_file_bytes`); a file that is not
    UTF-8 is a one-line error."""
    try:
        return read_file_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise LatsimError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None


#: The longest line :func:`read_csv` reads (characters): a record row is a few hundred; a
#: longer "line" is not a record file (a sparse or foreign file with no line ends), refused
#: before it fills the memory.
MAX_CSV_LINE = 2**20


class _Prefix(io.RawIOBase):
    """The first ``size`` bytes of an open binary file: what it held when opened, read
    as a stream (a file its writer appends to while it is read stays that snapshot)."""

    def __init__(self, handle: io.BufferedReader, size: int) -> None:
        self._handle = handle
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[:self._left]
        got = self._handle.readinto(view)
        self._left -= got or 0
        return got or 0


def _csv_lines(path: Path, text: io.TextIOWrapper) -> Iterator[str]:
    """The lines of ``text`` (line ends kept), each at most :data:`MAX_CSV_LINE` long."""
    while True:
        line = text.readline(MAX_CSV_LINE)
        if not line:
            return
        if len(line) == MAX_CSV_LINE and not line.endswith(("\n", "\r")):
            raise LatsimError(f"{path}: a line longer than {MAX_CSV_LINE:,} characters; not "
                              "a record file")
        yield line


def _reader(path: Path, handle: io.BufferedReader, size: int) -> Any:
    """A CSV reader of the ``size`` bytes of ``handle`` (an open regular file), as UTF-8
    lines of at most :data:`MAX_CSV_LINE` characters."""
    text = io.TextIOWrapper(io.BufferedReader(_Prefix(handle, size)), encoding="utf-8",
                            newline="")
    return csv.reader(_csv_lines(path, text))


def read_header(path: Path) -> list[str]:
    """The column names on a CSV file's first line (none for an empty file), read as
    :func:`read_csv` reads: a regular file, a line of at most :data:`MAX_CSV_LINE`
    characters, UTF-8; anything else is a one-line error."""
    try:
        with _open_regular(path, MAX_RECORD_FILE_BYTES) as (handle, size):
            return next(_reader(path, handle, size), [])
    except OSError as exc:
        raise LatsimError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise LatsimError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None
    except csv.Error as exc:
        raise LatsimError(f"{path}:1: not a CSV row ({exc})") from None


def read_csv(path: Path, record_type: type,
             keys: Mapping[str, Collection[str] | None] | None = None) -> CsvRows:
    """Read a file written by :func:`write_csv`: ``(extra columns, record)`` per row.

    Empty cells of float fields come back as NaN, so ``read(write(x)) == x`` up to NaN.

    Every cell is checked: its field's type, then the record type's
    :class:`~latsim.controller.records.Domain` (by default a whole number >= 0, a time a
    finite number >= 0; a job ready after it started ...), and the leading columns
    (:data:`LEADING`: ``K``, ``run``, ``stream`` whole numbers). ``keys``
    names leading columns the header must have, each with the cells it may hold (``None``:
    any valid one), e.g. a single run's policy and K. A cell that fails is an error naming
    the file, the line and the column.

    Every row :func:`write_csv` writes ends with a line end, so a last line without one was
    cut short by a writer that was killed (the live harness appends while it runs): that row
    is dropped and ``rows.torn`` says so. Any other row that does not parse (a wrong number
    of cells, a value of the wrong type) is an error naming the file and line: rows in the
    middle are never dropped.

    The file is read as a stream, a row at a time, from a regular file of at most
    :data:`~latsim.errors.MAX_RECORD_FILE_BYTES` (:func:`read_file_bytes`'s rule), as it
    was when opened: the memory it takes is the records'.
    """
    names = column_names(record_type)
    kinds = {f.name: f.type for f in fields(record_type)}
    out = CsvRows()
    with _open_regular(path, MAX_RECORD_FILE_BYTES) as (handle, size):
        cut = False
        if size:
            handle.seek(size - 1)
            cut = handle.read(1) not in (b"\n", b"\r")
            handle.seek(0)
        reader = _reader(path, handle, size)
        try:
            header = next(reader, None)
            if header is None:
                return out
            missing = [name for name in [*(keys or ()), *names] if name not in header]
            held: tuple[int, list[str]] | None = None  # a row is parsed once one follows it
            for cells in reader:
                if not cells:
                    continue
                if held is None and missing:
                    raise LatsimError(f"{path}:1: the header lacks {', '.join(missing)}")
                if held is not None:
                    out.append(_row(path, header, names, kinds, *held, record_type, keys))
                held = (reader.line_num, cells)
        except UnicodeDecodeError:
            raise LatsimError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None
        except csv.Error as exc:
            raise LatsimError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None
    if held is None:
        if cut:  # the header itself is cut short: no rows yet
            out.torn = f"{path.name}: the header line is torn (no line end), no rows"
        elif missing:
            raise LatsimError(f"{path}:1: the header lacks {', '.join(missing)}")
        return out
    if cut:
        out.torn = (f"{path.name}: last row (line {held[0]}) is torn (no line end: its "
                    "writer stopped mid-row), dropped")
    else:
        out.append(_row(path, header, names, kinds, *held, record_type, keys))
    return out


def _row(path: Path, header: list[str], names: list[str], kinds: dict[str, object],
         line: int, cells: list[str], record_type: type,
         keys: Mapping[str, Collection[str] | None] | None = None) -> tuple[dict, object]:
    """One row of :func:`read_csv`: its extra columns and its record, each cell checked
    against its column's type and domain (:func:`domain_problem`)."""
    if len(cells) != len(header):
        raise LatsimError(f"{path}:{line}: {len(cells)} cells where the header has "
                          f"{len(header)}")
    row = dict(zip(header, cells, strict=True))
    values = {}
    for name in names:
        try:
            values[name] = _parse(row[name], kinds[name])  # type: ignore[arg-type]
        except ValueError:
            raise LatsimError(f"{path}:{line}: column {name}: {row[name]!r} is not "
                              f"a valid {kinds[name]}") from None
    extra = {k: v for k, v in row.items() if k not in values}
    problem = domain_problem(record_type, values) or _check_leading(extra, keys or {})
    if problem:
        raise LatsimError(f"{path}:{line}: {problem}")
    return extra, record_type(**values)


#: How far below its floor, or before the time it follows, a time may read (seconds):
#: rounding, never a measurement.
SLACK = 1e-9
#: The leading columns a record file's rows may start with (:mod:`latsim.run.folder`),
#: whole numbers, and the least each holds (a client folder without a session writes K 0).
LEADING = {"K": 0, "run": 0, "stream": 0}


@cache
def _rules(record_type: type) -> tuple[
        dict[str, float], frozenset[str], frozenset[str], tuple[tuple[str, str], ...],
        frozenset[str], dict[str, tuple[str, ...]]]:
    """``record_type``'s :class:`~latsim.controller.records.Domain` as
    :func:`domain_problem` reads it: floors, the fields that may be unset (any row; a shown
    row), order, shown, choices."""
    domain = domain_of(record_type)
    return (dict(domain.lowest), frozenset(domain.unset),
            frozenset(domain.unset) - frozenset(domain.shown), domain.order,
            frozenset(domain.shown), dict(domain.choices))


def domain_problem(record_type: type, values: dict[str, object]) -> str | None:
    """What is wrong with one record's values for its type's
    :class:`~latsim.controller.records.Domain`, or None."""
    floors, unset, unset_if_shown, order, shown, choices = _rules(record_type)
    if values.get("displayed") is True:
        unset = unset_if_shown
    for name, value in values.items():
        if isinstance(value, str):
            if name in choices and value not in choices[name]:
                return (f"column {name}: {value[:40]!r} is not one of "
                        f"{', '.join(choices[name])}")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value != value:  # NaN: an empty cell
            if name not in unset:
                why = "a shown row's" if name in shown else "this"
                return f"column {name}: empty or NaN, but {why} column is always set"
            continue
        if not math.isfinite(value):
            return f"column {name}: {value!r} is not a finite number"
        floor = floors.get(name, 0)
        if value < floor - (SLACK if isinstance(value, float) else 0):
            return (f"column {name}: {value!r} is below {floor:g}"
                    + (" (a time or duration in seconds)" if isinstance(value, float)
                       and floor == 0 else ""))
    for first, then in order:
        a, b = values[first], values[then]
        if a == a and b == b and b < a - SLACK:  # type: ignore[operator]  # both set
            return f"column {then}: {b!r} is before {first} {a!r}"
    return None


def _check_leading(extra: dict[str, str],
                   keys: Mapping[str, Collection[str] | None]) -> str | None:
    """What is wrong with a row's leading columns (:data:`LEADING`; ``keys``: the cells
    those named may hold), or None."""
    for name, least in LEADING.items():
        raw = extra.get(name)
        if raw is not None and not (raw.isascii() and raw.isdigit() and int(raw) >= least):
            return f"column {name}: {raw[:40]!r} is not a whole number >= {least}"
    for name, allowed in keys.items():
        if allowed is not None and extra.get(name) not in allowed:
            return (f"column {name}: {str(extra.get(name))[:40]!r} where this folder's "
                    f"config.json says {' or '.join(sorted(allowed))}")
    return None


def _cell(value: object) -> object:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value
