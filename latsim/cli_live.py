"""CLI commands for live measurement (registered on the main app). Imports torch lazily."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
