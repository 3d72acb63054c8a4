"""One progress bar for long commands: a count, the elapsed time and an ETA, on stderr.

It appears only on a terminal, only once the work has taken a second (a quick command
prints nothing), never under ``latsim --quiet``, and it is cleared when the work ends, so
it never mixes with what a command prints on stdout. A status line too long to sit beside
the bar is drawn on a line of its own above it. Off a terminal a bar made ``plain``
writes each new status line once instead, as a log line of its own (``latsim plan``: one
per exact run).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from latsim.experiments.executors import paused_while_forking
from latsim.formatting import StatusLine, quiet

#: The widest label a bar shows (a status line is cut to it, or to what the terminal
#: leaves beside the bar's other columns: :func:`label_room`).
LABEL_WIDTH = 60
#: The narrowest the bar itself is drawn beside a label.
BAR_MIN_WIDTH = 10


def label_room(total: float) -> int:
    """The columns a label may take on one line beside the bar (:data:`BAR_MIN_WIDTH`), the
    count ``total/total``, the elapsed time, ``eta``, the time left and a space between
    each: at most :data:`LABEL_WIDTH`."""
    from latsim.formatting import line_width

    count = 2 * len(str(int(total))) + 1
    return max(1, min(LABEL_WIDTH, line_width() - (BAR_MIN_WIDTH + count + 7 + 3 + 7 + 5)))


def shorten(line: str, width: int) -> str:
    """``line`` in ``width`` columns: without a trailing parenthesis (a count the bar shows
    beside it) where that is enough, else without its last parts (a status line's parts
    are separated by two spaces, the most telling first), else cut to end in "…"."""
    if len(line) <= width:
        return line
    if line.endswith(")") and " (" in line:
        line = line[:line.rindex(" (")]
        if len(line) <= width:
            return line
    while len(line) > width and "  " in line.strip():
        line = line.rstrip()
        line = line[:line.rindex("  ")].rstrip()
    return line if len(line) <= width else line[:width - 1] + "…"


class ProgressBar:
    """``progress(done, total)`` as a bar labelled ``label``; a context manager."""

    def __init__(self, label: str, delay_s: float = 1.0, plain: bool = False) -> None:
        self.label = label
        self.delay_s = delay_s
        self._started = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._enabled = sys.stderr.isatty() and not quiet()
        self._log = StatusLine(plain=True) if plain and not self._enabled else None
        self._logged: str | None = None
        self._above = ""  # a status line drawn on a line of its own above the bar

    def status(self, line: str, done: float, total: float) -> None:
        """``done`` of ``total`` with a status ``line`` as the bar's label: beside the bar
        where it fits there (less a trailing count in parentheses, which the bar shows),
        else on a line of its own above the bar, shortened to the terminal's width only
        if it is wider (:func:`shorten`): the progress callback of ``measure``,
        ``profile`` and ``plan``. A plain bar off a terminal logs ``line`` when it
        changes."""
        from latsim.formatting import line_width

        if self._log is not None and line != self._logged:
            self._logged = line
            self._log(line)
        beside = line
        if line.endswith(")") and " (" in line and len(line) > label_room(total):
            beside = line[:line.rindex(" (")]
        if len(beside) <= label_room(total):
            self.label, self._above = beside, ""
        else:
            self.label, self._above = "", shorten(line, line_width())
        self(done, total)

    def __call__(self, done: float, total: float) -> None:
        if not self._enabled:
            return
        if self._bar is None:
            if time.perf_counter() - self._started < self.delay_s:
                return
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = _with_line_above(Progress)(
                                 TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True,
                                 # rich would move what is printed on stdout meanwhile
                                 # onto the bar's console (stderr): results stay on stdout
                                 redirect_stdout=False)
            stopped = _Stopped(self._bar)
            stopped.start()
            self._paused = paused_while_forking(stopped)
            self._paused.__enter__()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.above = self._above
        self._bar.update(self._task, completed=done, total=total, description=self.label)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._paused.__exit__(None, None, None)
            self._bar.stop()


def _with_line_above(progress: type) -> type:
    """rich's ``Progress`` drawing its ``above`` text, when set, on a line of its own above
    the bar (whole: it was shortened to the terminal's width)."""
    from rich.text import Text

    class Progress(progress):  # type: ignore[misc,valid-type]
        above = ""

        def get_renderables(self) -> Any:
            if self.above:
                yield Text(self.above, no_wrap=True, overflow="crop")
            yield from super().get_renderables()

    return Progress


class _Stopped:
    """A rich bar stopped for the block and started after: a worker pool forks meanwhile
    (:func:`latsim.experiments.executors.paused_while_forking`). rich's ``stop`` only tells
    its refresh thread to end, so the thread its ``start`` made is joined here: a fork
    while it was still ending was a fork beside it."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._threads: set[threading.Thread] = set()

    def start(self) -> None:
        before = set(threading.enumerate())
        self._bar.start()
        self._threads = set(threading.enumerate()) - before

    def __enter__(self) -> None:
        self._bar.stop()
        for thread in self._threads:
            thread.join()

    def __exit__(self, *exc: object) -> None:
        self.start()
