"""JSON and CSV text for results: deterministic JSON (NaN becomes null) and summary rows as
CSV; and the check that an output folder can be written, made before any work. Standard
library only, besides latsim's errors."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from latsim.errors import LatsimError


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


def write_rows_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(v) for k, v in clean(row).items()})


def _csv_cell(value: object) -> object:
    """A CSV cell: empty for None, JSON for a nested dict or list (per-pool values)."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value
