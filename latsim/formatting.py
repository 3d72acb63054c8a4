"""Terminal text: number formatting for tables and a one-line progress display (no heavy
imports: the CLI loads this at start)."""

from __future__ import annotations

import math
import sys
from typing import TextIO

#: Floats at least this large in magnitude print in scientific notation (a fixed-point
#: 1e20 would be 21 digits wide).
SCIENTIFIC_FROM = 1e7


def fmt(value: object, digits: int = 3) -> str:
    """``–`` for missing values, fixed ``digits`` for floats (scientific from
    :data:`SCIENTIFIC_FROM`; ``nan``/``inf`` as such), ``str`` otherwise."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) >= SCIENTIFIC_FROM:
            return f"{value:.{digits}e}"
        return f"{value:.{digits}f}"
    return str(value)


#: ``latsim --quiet`` sets it: no progress bars or status lines.
QUIET_ENV = "LATSIM_QUIET"


def line_width() -> int:
    """How wide a printed line may be: the terminal's columns (``COLUMNS``, else the
    terminal's, else 80) less one, and at least 20."""
    import shutil

    return max(20, shutil.get_terminal_size((80, 24)).columns - 1)


def fit(text: str, width: int | None = None) -> str:
    """``text`` wrapped to ``width`` (default :func:`line_width`), later lines indented by
    two (a word longer than that, such as a path, stays whole on a line of its own)."""
    import textwrap

    return textwrap.fill(text, line_width() if width is None else width,
                         subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def quiet() -> bool:
    """Whether progress displays are off (``latsim --quiet``, or ``LATSIM_QUIET=1``)."""
    import os

    return os.environ.get(QUIET_ENV, "") not in ("", "0")


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed stream
        return False


class StatusLine:
    """A progress sink that rewrites one line of stderr (``\\r``); as a context manager it
    ends the line when done, so later output starts on a fresh one. Off a terminal it is
    silent (a log file would collect every rewrite as a line of its own), unless
    ``always``; or, with ``plain``, it writes each line once, as a line of its own wrapped
    to ``width`` (for progress that moves a few times a minute, such as one line per exact
    run). Each line
    ends with the seconds since the sink was made. A rewritten line is cut to ``width`` and
    padded to it (to clear a longer one before it); ``width`` defaults to the terminal's
    columns less one (``COLUMNS``, 80 where unknown), read at each line, so it never
    wraps."""

    def __init__(self, width: int | None = None, stream: TextIO | None = None,
                 always: bool = False, plain: bool = False) -> None:
        import time

        self.width = width
        self.stream = stream
        self.always = always
        self.plain = plain
        self.used = False
        self._started = time.monotonic()

    def __call__(self, line: str, done: float | None = None, total: float | None = None
                 ) -> None:
        """Show ``line`` (``done`` and ``total``, which a progress bar counts, are not
        shown: a status line says its own count)."""
        import time

        stream = self.stream or sys.stderr
        if quiet():
            return
        line = f"{line} [{time.monotonic() - self._started:.0f} s]"
        if not (self.always or _is_terminal(stream)):
            if self.plain:  # a log line, wrapped to the columns
                stream.write(fit(line, self.width) + "\n")
                stream.flush()
            return
        width = line_width() if self.width is None else self.width
        stream.write("\r" + line[:width].ljust(width))
        stream.flush()
        self.used = True

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.used:
            (self.stream or sys.stderr).write("\n")
