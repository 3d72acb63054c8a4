"""The viewer-side run folder: what a live client (``latsim client``) measured.

One folder per client session, ``config.json`` kind ``client``::

    viewer.csv    per condition: client send, server arrival, job start/ready, server slot
                  time, client receive, scheduled and actual display; L, L_server
    slots.csv     per slot received: server play time, arrival, due/shown (playout rule),
                  actual display, bytes
    stalls.csv    server stalls (gaps between played slots) and client stalls (late slots)
    jobs.csv      the server's jobs: controller start/ready (C) and generator interval
    probes.csv    clock probes (raw clocks) and their RTT and offset
    trace.jsonl   the conditions sent (stream time)

Every time in the CSVs except ``probes.csv`` is **stream time on the client's clock**:
client ``perf_counter`` seconds minus the client time of the server's playback start
(server start minus the offset estimate used for the run). Server times enter only through
that offset; ``L = displayed − sent`` is measured on the client's clock alone. Each row is
appended as soon as it is final (a slot once it showed, a condition once its slot showed,
stalls, jobs and probes as they happen), and the tables are rewritten whole when the client
stops (also on Ctrl-C, SIGTERM or a lost connection, with ``status`` saying so).
``config.json`` says ``running`` until then, with the session's fields from its ``ready``
on: a client killed outright leaves a folder that reads as ``incomplete`` with every row up
to the kill, and ``compare`` takes it over the window its rows cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from latsim.controller.records import read_csv, write_csv

KIND = "client"

#: viewer.csv's ``status``: shown, censored (acknowledged, not shown before the end), lost
#: (no acknowledgement: dropped by the shaper or refused), refused (the server said why).
CONDITION_STATES = ("shown", "censored", "lost", "refused")


@dataclass(frozen=True)
class ViewerCondition:
    cid: int
    version: int  # 0 where the server never acknowledged it
    sent: float
    arrival: float
    start: float
    ready: float
    played: float
    received: float
    shown: float  # the playout rule's display time
    displayed: float  # when the client's display callback ran
    L: float  # displayed - sent
    L_server: float  # played - arrival (both server times: no offset)
    status: str


@dataclass(frozen=True)
class ViewerSlot:
    position: int
    version: int
    job_id: int
    played: float
    server_sent: float
    received: float
    due: float
    shown: float
    displayed: float
    bytes: int
    payload: str


@dataclass(frozen=True)
class ViewerStall:
    side: str  # server | client
    position: int
    t_start: float
    t_end: float


@dataclass(frozen=True)
class ViewerJob:
    job_id: int
    kind: str
    branch: int
    length: int
    version: int
    start: float
    ready: float
    gen_start: float
    gen_end: float

    @property
    def C(self) -> float:  # noqa: N802
        return self.ready - self.start


@dataclass(frozen=True)
class ProbeRow:
    t0: float
    t1: float
    t2: float
    t3: float
    rtt: float
    offset: float


TABLES: dict[str, type] = {"viewer": ViewerCondition, "slots": ViewerSlot,
                           "stalls": ViewerStall, "jobs": ViewerJob, "probes": ProbeRow}


@dataclass(frozen=True)
class ViewerRecords:
    """Everything a client run recorded."""

    conditions: tuple[ViewerCondition, ...]
    slots: tuple[ViewerSlot, ...]
    stalls: tuple[ViewerStall, ...]
    jobs: tuple[ViewerJob, ...]
    probes: tuple[ProbeRow, ...]


def write_viewer_records(run_dir: Path, records: ViewerRecords) -> None:
    for table, rows in (("viewer", records.conditions), ("slots", records.slots),
                        ("stalls", records.stalls), ("jobs", records.jobs),
                        ("probes", records.probes)):
        write_csv(run_dir / f"{table}.csv", TABLES[table], rows)


def read_viewer_records(run_dir: Path) -> ViewerRecords:
    def rows(table: str) -> tuple:
        path = run_dir / f"{table}.csv"
        return tuple(r for _, r in read_csv(path, TABLES[table])) if path.exists() else ()

    return ViewerRecords(rows("viewer"), rows("slots"), rows("stalls"), rows("jobs"),
                         rows("probes"))
