"""Help pages whose option names are not cut at 80 columns: the table typer's rich help
draws its panels with (imports rich only: :mod:`latsim.cli.fast_help` draws the top-level
page with it too).

rich shares out a table too wide for the terminal by shrinking its widest wrappable columns
together; in typer's options panel those are an option's long name and its help, so at 80
columns ``serve -h`` printed ``--max-pending-per-…`` beside a help column with room to
spare. Here the names, flags and types keep their width and the help (the last column)
takes what is left, as long as that leaves it :data:`MIN_HELP_WIDTH`; on a terminal too
narrow for that, rich shares the width out as before (a cut name beats a help column of a
few characters).
"""

from __future__ import annotations

from typing import Any

from rich.measure import Measurement
from rich.table import Table

#: The narrowest help column kept beside whole option names.
MIN_HELP_WIDTH = 20


class HelpTable(Table):
    """A :class:`rich.table.Table` whose columns but the last do not wrap or shrink while
    the last keeps :data:`MIN_HELP_WIDTH`."""

    def __rich_console__(self, console: Any, options: Any) -> Any:
        names = self.columns[:-1]
        taken = sum(_width(console, options, column) + 2 for column in names)  # + padding
        if options.max_width - taken >= MIN_HELP_WIDTH:
            for column in names:
                column.no_wrap = True
        yield from super().__rich_console__(console, options)


def _width(console: Any, options: Any, column: Any) -> int:
    if column.width is not None:
        return int(column.width)
    return max((Measurement.get(console, options, cell).maximum for cell in column.cells),
               default=0)


def install() -> None:
    """Make typer's rich help draw its option and command panels with :class:`HelpTable`."""
    from typer import rich_utils

    rich_utils.Table = HelpTable  # type: ignore[misc]  # the name its panels are drawn with
