"""The ``latsim`` command line: thin typer commands over library functions (DESIGN §4)."""

from latsim.cli.app import app, main

__all__ = ["app", "main"]
