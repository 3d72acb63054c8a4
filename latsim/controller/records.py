"""Flat, immutable records: the same types come out of simulation and live measurement.

One row per condition, job, played slot, stall and discard. ``pandas.DataFrame(records)``
works on any list of them; :func:`write_csv` writes them with a stable column order.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from latsim.errors import LatsimError

NAN = math.nan


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A finished generation job (id 0 is the version-0 prebuffer, not a DiT call)."""

    job_id: int
    kind: str  # prebuffer | refill | replan
    branch: int  # first position produced
    length: int  # positions produced (K)
    version: int  # condition version it was conditioned on
    context: int  # clean latents available before ``branch``
    t_start: float
    t_ready: float


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """A played latent slot."""

    position: int
    version: int
    job_id: int
    t_start: float


@dataclass(frozen=True, slots=True)
class StallRecord:
    """The player froze at ``position`` from ``t_start`` to ``t_end``."""

    position: int
    t_start: float
    t_end: float
    open_at_end: bool  # the run ended while still stalled


@dataclass(frozen=True, slots=True)
class DiscardRecord:
    """``count`` cached positions of ``job_id`` from ``first`` on were replaced at ``t``."""

    job_id: int
    first: int
    count: int
    t: float
    by_version: int


@dataclass(frozen=True, slots=True)
class ConditionRecord:
    """One condition: L = R + C + Q (DESIGN §2).

    ``displayed`` is False if the run ended before any output of version >= ``version``
    played (censored). ``superseded`` is True if the first such output had a newer version:
    the condition itself was never shown. Its R/C/Q/L then describe that newer response, the
    first display at least as new (DESIGN §2); summaries include them and count censored ones.
    """

    version: int
    t_arrival: float
    job_id: int
    t_start: float
    t_ready: float
    t_play: float
    R: float
    C: float
    Q: float
    L: float
    superseded: bool
    displayed: bool

    @classmethod
    def shown(
        cls, version: int, t_arrival: float, job: JobRecord, t_play: float, superseded: bool
    ) -> ConditionRecord:
        return cls(
            version=version,
            t_arrival=t_arrival,
            job_id=job.job_id,
            t_start=job.t_start,
            t_ready=job.t_ready,
            t_play=t_play,
            R=job.t_start - t_arrival,
            C=job.t_ready - job.t_start,
            Q=t_play - job.t_ready,
            L=t_play - t_arrival,
            superseded=superseded,
            displayed=True,
        )

    @classmethod
    def censored(cls, version: int, t_arrival: float) -> ConditionRecord:
        return cls(version, t_arrival, -1, NAN, NAN, NAN, NAN, NAN, NAN, NAN, False, False)


RECORD_TYPES: dict[str, type] = {
    "conditions": ConditionRecord,
    "jobs": JobRecord,
    "slots": SlotRecord,
    "stalls": StallRecord,
    "discards": DiscardRecord,
}


def column_names(record_type: type) -> list[str]:
    return [f.name for f in fields(record_type)]


def write_csv(
    path: Path,
    record_type: type,
    records: Iterable[object],
    extra: Sequence[tuple[str, object]] = (),
    append: bool = False,
) -> None:
    """Write records as CSV; ``extra`` columns (e.g. run id, policy) go first on every row."""
    new_file = not append or not path.exists()
    with path.open("a" if append else "w", newline="") as handle:
        writer = csv.writer(handle)
        if new_file:
            writer.writerow([name for name, _ in extra] + column_names(record_type))
        prefix = [value for _, value in extra]
        for record in records:
            writer.writerow(prefix + [_cell(v) for v in astuple(record)])


class CsvRows(list):
    """What :func:`read_csv` returns: a list of ``(extra columns, record)`` rows, plus
    ``torn``: ``None``, or a one-line note that the file's last row was cut short (a writer
    killed mid-row) and was dropped."""

    torn: str | None = None


def _parse(raw: str, kind: str) -> object:
    if kind == "float":
        return float(raw) if raw != "" else NAN
    if kind == "int":
        return int(raw)
    if kind == "bool":
        if raw not in ("True", "False"):
            raise ValueError(f"{raw!r} is not True or False")
        return raw == "True"
    return raw


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
    with path.open(newline="") as handle:
        text = handle.read()
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
