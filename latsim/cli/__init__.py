"""The ``latsim`` command line: thin typer commands over library functions (DESIGN §4).

The package imports nothing heavy: ``latsim --help`` is drawn without typer
(:mod:`latsim.cli.fast_help`); :data:`app` loads the command line when first read.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]  # and ``app``, loaded when first read (module __getattr__)


def main() -> None:
    """Console-script entry point."""
    from latsim.cli.fast_help import top_level_help

    status = top_level_help(sys.argv)
    if status is not None:
        sys.exit(status)
    from latsim.cli.root import main as run

    run()


def __getattr__(name: str) -> Any:
    if name == "app":
        from latsim.cli.root import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
