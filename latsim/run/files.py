"""JSON and CSV text for results: deterministic JSON (NaN becomes null) and summary rows as
CSV. A leaf: standard library only."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


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
