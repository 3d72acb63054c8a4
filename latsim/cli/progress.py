"""One progress bar for long commands: a count, the elapsed time and an ETA, on stderr.

It appears only on a terminal, only once the work has taken a second (a quick command
prints nothing), never under ``latsim --quiet``, and it is cleared when the work ends, so
it never mixes with what a command prints on stdout.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from latsim.formatting import quiet

#: The widest label a bar shows (a status line is cut to it).
LABEL_WIDTH = 60


class ProgressBar:
    """``progress(done, total)`` as a bar labelled ``label``; a context manager."""

    def __init__(self, label: str, delay_s: float = 1.0) -> None:
        self.label = label
        self.delay_s = delay_s
        self._started = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._enabled = sys.stderr.isatty() and not quiet()

    def status(self, line: str, done: float, total: float) -> None:
        """``done`` of ``total`` with a status ``line`` as the bar's label (a long line is
        cut to fit beside the bar): the progress callback of ``measure`` and ``profile``."""
        self.label = line if len(line) <= LABEL_WIDTH else line[:LABEL_WIDTH - 1] + "…"
        self(round(done), round(total))

    def __call__(self, done: int, total: int) -> None:
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

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True,
                                 # rich would move what is printed on stdout meanwhile
                                 # onto the bar's console (stderr): results stay on stdout
                                 redirect_stdout=False)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(self._task, completed=done, total=total, description=self.label)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
