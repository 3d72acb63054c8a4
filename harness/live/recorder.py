"""Appending the controller's records to CSV while a live run goes.

The controller calls ``on_record`` on the driver thread; :class:`RecordWriter` only enqueues
there and a writer thread appends the rows with :func:`latsim.run.record_files.write_csv` every
``flush_every_s`` (0.2 s), so disk I/O never delays a decision. The files are the simulator's
(``conditions.csv``, ``jobs.csv``, ``slots.csv``, ``stalls.csv``, ``discards.csv``) with
the same leading ``policy, K, run`` columns as :func:`latsim.run.files.write_experiment`; all
five exist (with a header) from the start, so an interrupted run leaves readable files.

A write that fails on the writer thread (a full disk) is kept in :attr:`RecordWriter.error`
and reported to ``on_error`` (the run fails with it); later records are dropped.

Every file the harness writes goes through :func:`writing`, so a failed write is a one-line
:class:`~latsim.errors.LatsimError` naming the file (``cannot write PATH: No space left on
device``); :func:`latsim.run.files.check_writable` probes an output folder before any work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from latsim.controller.records import RECORD_TYPES
from latsim.run.record_files import write_csv
from latsim.writing import cannot_write, writing

_TABLE_OF: dict[type, str] = {record_type: table for table, record_type in RECORD_TYPES.items()}


class RecordWriter:
    """Writer thread appending records to ``<out>/<table>.csv`` with ``extra`` columns first."""

    def __init__(self, out: Path, extra: Sequence[tuple[str, object]],
                 flush_every_s: float = 0.2,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.out = out
        self.extra = tuple(extra)
        self._flush_every = flush_every_s
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="latsim-records", daemon=True)
        self.written = 0
        self.on_error = on_error
        self.error: str | None = None  # ``cannot write PATH: REASON`` of the first failure

    def path(self, table: str) -> Path:
        return self.out / f"{table}.csv"

    def start(self) -> None:
        with writing(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
        for table, record_type in RECORD_TYPES.items():
            path = self.path(table)
            with writing(path):
                if path.exists():
                    path.unlink()
                write_csv(path, record_type, [], extra=self.extra, append=True)
        self._thread.start()

    def __call__(self, record: object) -> None:
        """The controller's ``on_record`` callback (cheap: one queue put)."""
        self._queue.put(record)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and stop the thread."""
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        # Poll instead of blocking on the queue: a put never wakes this thread, so writing
        # never competes for the GIL in the middle of a controller decision.
        while not self._stop.wait(self._flush_every):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        batch: list[object] = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            self._write(batch)

    def _write(self, batch: list[object]) -> None:
        by_table: dict[str, list[object]] = {}
        for record in batch:
            by_table.setdefault(_TABLE_OF[type(record)], []).append(record)
        for table, records in by_table.items():
            if self.error is not None:
                return
            path = self.path(table)
            try:
                write_csv(path, RECORD_TYPES[table], records, extra=self.extra, append=True)
            except OSError as exc:
                self.error = cannot_write(path, exc)
                if self.on_error is not None:
                    self.on_error(self.error)
                return
            self.written += len(records)
