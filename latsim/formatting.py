"""Number formatting for terminal tables (no heavy imports: the CLI loads this at start)."""

from __future__ import annotations


def fmt(value: object, digits: int = 3) -> str:
    """``–`` for missing values, fixed ``digits`` for floats, ``str`` otherwise."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
