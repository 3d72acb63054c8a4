"""The record tables as files: :func:`write_csv` writes records as CSV with a stable column
order (extra leading columns first), :func:`read_csv` reads them back; and the bounded reads
of a record or run-folder file (:func:`read_file_bytes`, :func:`read_text`). The record types
are the controller's (:mod:`latsim.controller.records`), which does no I/O.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import fields
from operator import attrgetter
from pathlib import Path

from latsim.controller.records import NAN, SlotLog, column_names
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
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise LatsimError(f"{path}: not a regular file (a device, pipe or folder); not read")
    if info.st_size > limit:
        raise LatsimError(f"{path}: larger than {limit:,} bytes; not read")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise LatsimError(f"{path}: larger than {limit:,} bytes; not read")
    return data


def read_text(path: Path, limit: int = MAX_RECORD_FILE_BYTES) -> str:
    """A record or telemetry file's text (:func:`read_file_bytes`); a file that is not
    UTF-8 is a one-line error."""
    try:
        return read_file_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise LatsimError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None


def read_csv(path: Path, record_type: type) -> CsvRows:
    """Read a file written by :func:`write_csv`: ``(extra columns, record)`` per row.

    Empty cells of float fields come back as NaN, so ``read(write(x)) == x`` up to NaN.

    Every row :func:`write_csv` writes ends with a line end, so a last line without one was
    cut short by a writer that was killed (the live harness appends while it runs): that row
    is dropped and ``rows.torn`` says so. Any other row that does not parse (a wrong number
    of cells, a value of the wrong type) is an error naming the file and line: rows in the
    middle are never dropped.
    """
    names = column_names(record_type)
    kinds = {f.name: f.type for f in fields(record_type)}
    out = CsvRows()
    text = read_text(path)
    cut = bool(text) and not text.endswith(("\n", "\r"))
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        return out
    rows = [(reader.line_num, cells) for cells in reader if cells]
    if cut and not rows:  # the header itself is cut short: no rows yet
        out.torn = f"{path.name}: the header line is torn (no line end), no rows"
        return out
    missing = [name for name in names if name not in header]
    if missing:
        raise LatsimError(f"{path}:1: the header lacks {', '.join(missing)}")
    if cut:
        line, _ = rows.pop()
        out.torn = (f"{path.name}: last row (line {line}) is torn (no line end: its writer "
                    "stopped mid-row), dropped")
    for line, cells in rows:
        if len(cells) != len(header):
            raise LatsimError(f"{path}:{line}: {len(cells)} cells where the header has "
                              f"{len(header)}")
        row = dict(zip(header, cells, strict=True))
        values = {}
        for name in names:
            try:
                values[name] = _parse(row[name], kinds[name])
            except ValueError:
                raise LatsimError(f"{path}:{line}: column {name}: {row[name]!r} is not "
                                  f"a valid {kinds[name]}") from None
        extra = {k: v for k, v in row.items() if k not in values}
        out.append((extra, record_type(**values)))
    return out


def _cell(value: object) -> object:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value
