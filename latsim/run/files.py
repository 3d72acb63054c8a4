"""JSON and CSV text for results: deterministic JSON (NaN becomes null) and summary rows as
CSV; and the check that an output folder can be written, made before any work. Standard
library only, besides latsim's errors."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import TextIO

from latsim.errors import LatsimError
from latsim.writing import replacing


def check_writable(folder: Path, option: str = "--out", keep: bool = False) -> None:
    """Write and remove a probe file in ``folder``, so an unwritable output is a one-line
    error before any work (simulation, warm-up, calibration, jobs) is done. Folders it had
    to create for the probe are removed again (a command that then fails on other input
    leaves nothing behind) unless ``keep``."""
    if not str(folder).strip():
        raise LatsimError(f"{option} is empty; name a folder")
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    probe = folder / f".latsim-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise LatsimError(f"{option} {folder}: cannot write there "
                          f"({exc.strerror or exc})") from exc
    finally:
        for path in [] if keep else created:  # deepest first
            try:
                path.rmdir()
            except OSError:
                break


def clean(value: object) -> object:
    """JSON-safe value: NaN and infinities become ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def dumps(obj: object) -> str:
    """Deterministic JSON text for ``--json`` and summary files."""
    return json.dumps(clean(obj), indent=2, allow_nan=False)


def flat_row(row: dict) -> dict:
    """``row`` with nested dicts spread into columns of their own (``busy_pct_by_pool``
    ``{"dit": 25.0}`` becomes ``busy_pct_by_pool.dit``), so no CSV cell holds JSON."""
    flat: dict = {}
    for key, value in row.items():
        if isinstance(value, dict):
            for sub, inner in flat_row(value).items():
                flat[f"{key}.{sub}"] = inner
        else:
            flat[key] = value
    return flat


def rows_csv(handle: TextIO, rows: list[dict]) -> None:
    """``rows`` as CSV on ``handle``: flat columns (:func:`flat_row`) in first-seen order
    over every row, an empty cell for a missing value or one a row lacks, a list as its
    items joined by spaces."""
    flat = [flat_row(clean(row)) for row in rows]  # type: ignore[arg-type]
    fields = list(dict.fromkeys(key for row in flat for key in row))
    writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\r\n")
    writer.writeheader()
    for row in flat:
        writer.writerow({k: _csv_cell(v) for k, v in row.items()})


def write_rows_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV file (:func:`rows_csv`); nothing is written for no rows."""
    if not rows:
        return
    with replacing(path) as tmp, tmp.open("w", newline="") as handle:
        rows_csv(handle, rows)


def _csv_cell(value: object) -> object:
    """A CSV cell: empty for None, a list's items joined by spaces."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return " ".join(str(_csv_cell(v)) for v in value)
    return value
