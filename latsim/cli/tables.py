"""Result tables that fit the terminal: columns by priority, never a number cut to "…".

A table is laid out for the terminal's width (``COLUMNS`` where set; a pipe or a file with
no ``COLUMNS`` gets every column). Columns that do not fit are left out, the least
important first, and a line under the table names them (``--json`` has them all); the
columns that are shown keep their order.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

#: What a table is laid out for when stdout is neither a terminal nor told ``COLUMNS``.
UNBOUNDED_WIDTH = 400


@dataclass(frozen=True)
class Column:
    """One column: its header, and its rank (0 is shown first; higher ranks go first when
    the width runs out)."""

    header: str
    rank: int = 0
    justify: str = "right"


def table_width() -> int:
    """The width to lay tables out for: ``COLUMNS``, else the terminal's, else unbounded."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return UNBOUNDED_WIDTH


def _cell_width(cell: str) -> int:
    return max((len(line) for line in cell.splitlines()), default=0)


def _needs(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width: its widest cell (or header) plus three characters of padding
    and rule."""
    return [max([len(c.header)] + [_cell_width(row[i]) for row in rows]) + 3
            for i, c in enumerate(columns)]


def fitted(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """The indices of the columns shown at ``width``: by rank, while the table fits."""
    need = _needs(columns, rows)
    shown: list[int] = []
    used = 1  # the table's right-hand rule
    for i in sorted(range(len(columns)), key=lambda i: (columns[i].rank, i)):
        if used + need[i] <= width or not shown:
            shown.append(i)
            used += need[i]
    return sorted(shown)


def print_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                notes: Sequence[str] = ()) -> None:
    """Print the table (rich) at :func:`table_width`, the columns that fit, then ``notes``
    and a line naming any column left out."""
    from rich.console import Console
    from rich.table import Table

    width = table_width()
    shown = fitted(columns, rows, width)
    table = Table(title=title)
    for i in shown:
        table.add_column(columns[i].header, justify=columns[i].justify,  # type: ignore[arg-type]
                         no_wrap=True)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    need = _needs(columns, rows)
    console = Console(width=min(width, max(80, sum(need[i] for i in shown) + 1)),
                      highlight=False)
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)
    left_out = [columns[i].header for i in range(len(columns)) if i not in shown]
    if left_out:
        console.print(f"[dim]not shown at {width} columns: {', '.join(left_out)} (a wider "
                      "terminal, COLUMNS=200 or --json shows them)[/dim]", highlight=False)
