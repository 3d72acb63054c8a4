"""The viewer-side run folder: what a live client (``latsim client``, or the browser viewer)
measured.

One folder per client session, ``config.json`` kind ``client``, format
:data:`~latsim.run.folder.CLIENT_FORMAT_VERSION` (2). The record tables have the simulator's
file names and, where a column means the same, its column names, after the same leading
``policy, K, run`` columns (:mod:`latsim.run.folder`)::

    conditions.csv  per condition: cid, version, t_sent (client), t_arrival, job_id,
                    t_start, t_ready, t_play (server, converted), t_received, t_shown,
                    t_displayed (client); R, C, Q, L_server, L; superseded, displayed, status
    slots.csv       per slot received: position, version, job_id, t_start (the server's play
                    time), t_server_sent (converted), t_received, t_due, t_shown (the playout
                    rule), t_displayed (client), bytes, payload
    stalls.csv      side (server: a gap between played slots; client: a late slot),
                    position, t_start, t_end
    jobs.csv        the server's jobs: job_id, kind, branch, length, version, t_start,
                    t_ready (the controller's: C), t_gen_start, t_gen_end (the generator's)
    probes.csv      clock probes: raw clocks t0..t3 (no leading columns), rtt, offset
    trace.jsonl     the conditions sent (stream time)

Two clocks, one time axis. Every time in the CSVs except ``probes.csv`` is **stream time**
in seconds: 0 is the server's playback start. Times the server reported (``t_arrival``,
``t_start``, ``t_ready``, ``t_play``, a slot's ``t_start`` and ``t_server_sent``, jobs) are
the server's clock minus that start, and need no offset. Times the client took
(``t_sent``, ``t_received``, ``t_due``, ``t_shown``, ``t_displayed``) are its own
``perf_counter`` (``performance.now()`` in a browser) minus the client time of the server's
start, which is the server start minus ``config["offset"]`` (server minus client, the
min-RTT estimate, ``config["offset_uncertainty"]`` its bound ``RTT_min / 2``), so they
carry that offset's error. ``R = t_start − t_arrival``, ``C = t_ready − t_start``,
``Q = t_play − t_ready`` and ``L_server = t_play − t_arrival`` are on the server's clock
alone; ``L = t_displayed − t_sent``, the end-to-end latency, on the client's alone (as in
the serving model's ``viewer.csv`` and every summary: DESIGN §6). A condition's ``job_id``
and ``superseded`` come from the slot that first showed it (its job; a newer version).

Each row is appended as soon as it is final (a slot once it showed, a condition once its
slot showed, stalls, jobs and probes as they happen), and the tables are rewritten whole
when the client stops (also on Ctrl-C, SIGTERM or a lost connection, with ``status`` saying
so). ``config.json`` says ``running`` until then, with the session's fields from its
``ready`` on (``session``, ``server_run``, ``server_start``, ``offset``,
``offset_uncertainty``): a client killed outright leaves a folder that reads as
``incomplete`` with every row up to the kill, and ``compare`` takes it over the window its
rows cover.

Format 1 folders (``viewer.csv`` with ``sent``/``shown``... columns and no leading keys)
are read too, converted as they are read (:func:`read_viewer_records`), and
:func:`migrate_client_folder` rewrites one in format 2.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, fields
from pathlib import Path

from latsim.controller.records import JOB_KINDS, Domain
from latsim.errors import LatsimError
from latsim.run.folder import CLIENT_FORMAT_VERSION, read_json, write_json
from latsim.run.record_files import domain_problem, read_csv, read_text, write_csv

KIND = "client"
NAN = math.nan

#: The floor of a time on the client's clock: it carries the offset's error (at most
#: ``RTT_min / 2``), so the first ones may read a little below 0; a second below is damage.
CLIENT_FLOOR = -1.0
CLIENT_TIMES = ("t_sent", "t_received", "t_due", "t_shown", "t_displayed")

#: conditions.csv's ``status``: shown, censored (acknowledged, not shown before the end),
#: lost (no acknowledgement: dropped by the shaper or refused), refused (the server said why).
CONDITION_STATES = ("shown", "censored", "lost", "refused")


@dataclass(frozen=True)
class ViewerCondition:
    cid: int
    version: int  # 0 where the server never acknowledged it
    t_sent: float  # client clock
    t_arrival: float  # server clock, from here to t_play
    job_id: int  # the job whose slot first showed it; -1 where none did
    t_start: float
    t_ready: float
    t_play: float
    t_received: float  # client clock, from here on
    t_shown: float  # the playout rule's display time
    t_displayed: float  # when the client's display callback ran (a browser: its frame)
    R: float
    C: float
    Q: float
    L_server: float  # t_play - t_arrival = R + C + Q (server times: no offset)
    L: float  # t_displayed - t_sent (client times: no offset)
    superseded: bool  # first shown by a newer version's slot
    displayed: bool  # status == "shown"
    status: str

    DOMAIN = Domain(
        unset=("t_arrival", "t_start", "t_ready", "t_play", "t_received", "t_shown",
               "t_displayed", "R", "C", "Q", "L_server", "L"),  # not shown, or lost
        lowest=(("job_id", -1), *((name, CLIENT_FLOOR) for name in CLIENT_TIMES)),
        order=(("t_arrival", "t_start"), ("t_start", "t_ready"), ("t_ready", "t_play")),
        # shown: its slot's and its display's times (an acknowledgement may be lost)
        shown=("t_start", "t_ready", "t_play", "t_received", "t_shown", "t_displayed", "C",
               "Q", "L"),
        choices=(("status", CONDITION_STATES),))


@dataclass(frozen=True)
class ViewerSlot:
    position: int
    version: int
    job_id: int
    t_start: float  # the server's play time
    t_server_sent: float  # when the server sent its frame
    t_received: float
    t_due: float
    t_shown: float
    t_displayed: float
    bytes: int
    payload: str

    DOMAIN = Domain(unset=("t_displayed",),  # not displayed yet
                    lowest=tuple((name, CLIENT_FLOOR) for name in CLIENT_TIMES))


@dataclass(frozen=True)
class ViewerStall:
    side: str  # server | client
    position: int
    t_start: float
    t_end: float

    # a client stall is on the client's clock
    DOMAIN = Domain(lowest=(("t_start", CLIENT_FLOOR), ("t_end", CLIENT_FLOOR)),
                    order=(("t_start", "t_end"),), choices=(("side", ("server", "client")),))


@dataclass(frozen=True)
class ViewerJob:
    job_id: int
    kind: str
    branch: int
    length: int
    version: int
    t_start: float
    t_ready: float
    t_gen_start: float
    t_gen_end: float

    DOMAIN = Domain(unset=("t_gen_start", "t_gen_end"),  # no generator times (prebuffer)
                    order=(("t_start", "t_ready"), ("t_gen_start", "t_gen_end")),
                    choices=(("kind", JOB_KINDS),))

    @property
    def C(self) -> float:
        return self.t_ready - self.t_start


@dataclass(frozen=True)
class ProbeRow:
    t0: float
    t1: float
    t2: float
    t3: float
    rtt: float
    offset: float

    # raw clocks (any origin) and an offset of either sign
    DOMAIN = Domain(lowest=tuple((name, -math.inf)
                                 for name in ("t0", "t1", "t2", "t3", "offset")))


TABLES: dict[str, type] = {"conditions": ViewerCondition, "slots": ViewerSlot,
                           "stalls": ViewerStall, "jobs": ViewerJob, "probes": ProbeRow}
#: What a client folder's own files are called: those a later session into it replaces.
CLIENT_FILES = ("config.json", "summary.json", "trace.jsonl",
                *(f"{table}.csv" for table in TABLES))
#: The tables whose rows start with the ``policy, K, run`` columns (probes are the clock's).
KEYED = ("conditions", "slots", "stalls", "jobs")


@dataclass(frozen=True)
class ViewerRecords:
    """Everything a client run recorded."""

    conditions: tuple[ViewerCondition, ...]
    slots: tuple[ViewerSlot, ...]
    stalls: tuple[ViewerStall, ...]
    jobs: tuple[ViewerJob, ...]
    probes: tuple[ProbeRow, ...]
    #: read from a folder: a note per table whose torn last row was dropped (a client
    #: killed mid-row), for the reader to show
    notes: tuple[str, ...] = ()


def run_keys(config: dict) -> tuple[tuple[str, object], ...]:
    """The leading ``policy, K, run`` columns of a client folder's rows."""
    return (("policy", str(config.get("policy", ""))), ("K", config.get("K", 0)), ("run", 0))


def table_keys(table: str, config: dict) -> tuple[tuple[str, object], ...]:
    return run_keys(config) if table in KEYED else ()


def condition_row(cid: int, version: int, t_sent: float, t_arrival: float, status: str,
                  slot: ViewerSlot | None = None, t_start: float = NAN,
                  t_ready: float = NAN, t_displayed: float = NAN) -> ViewerCondition:
    """A condition's row; ``slot`` is the one that first showed it (``None``: none did)."""
    if slot is None:
        return ViewerCondition(cid, version, t_sent, t_arrival, -1, NAN, NAN, NAN, NAN, NAN,
                               NAN, NAN, NAN, NAN, NAN, NAN, False, False, status)
    play = slot.t_start
    return ViewerCondition(
        cid, version, t_sent, t_arrival, slot.job_id, t_start, t_ready, play,
        slot.t_received, slot.t_shown, t_displayed, t_start - t_arrival, t_ready - t_start,
        play - t_ready, play - t_arrival, t_displayed - t_sent, slot.version > version,
        status == "shown", status)


def write_viewer_records(run_dir: Path, records: ViewerRecords, config: dict) -> None:
    """The record tables, whole; ``config`` (the folder's) gives the leading columns."""
    for table, rows in (("conditions", records.conditions), ("slots", records.slots),
                        ("stalls", records.stalls), ("jobs", records.jobs),
                        ("probes", records.probes)):
        write_csv(run_dir / f"{table}.csv", TABLES[table], rows,
                  extra=table_keys(table, config))


def _config(run_dir: Path) -> dict:
    path = run_dir / "config.json"
    loaded = read_json(path) if path.is_file() else {}
    return loaded if isinstance(loaded, dict) else {}


def client_format(config: dict) -> int:
    try:
        return int(config.get("format_version", 0))
    except (TypeError, ValueError):
        return 0


def read_viewer_records(run_dir: Path) -> ViewerRecords:
    """A client folder's records, of format 2 or (converted as read) format 1: every cell
    checked (:func:`~latsim.run.record_files.read_csv`: its type, its record's
    :class:`~latsim.controller.records.Domain`, the leading columns the config names), a
    torn last row dropped with a note in :attr:`ViewerRecords.notes`."""
    run_dir = Path(run_dir)
    config = _config(run_dir)
    if client_format(config) < 2:
        return _read_format1(run_dir)
    notes: list[str] = []
    keys = {name: {str(value)} for name, value in run_keys(config)}

    def rows(table: str) -> tuple:
        path = run_dir / f"{table}.csv"
        if not path.exists():
            return ()
        read = read_csv(path, TABLES[table], keys if table in KEYED else None)
        if read.torn:
            notes.append(read.torn)
        return tuple(r for _, r in read)

    if (run_dir / "viewer.csv").exists() and not (run_dir / "conditions.csv").exists():
        raise LatsimError(f"{run_dir}: config.json says format 2 but the folder has format "
                          "1's viewer.csv; set its format_version to 1 to read it")
    return ViewerRecords(rows("conditions"), rows("slots"), rows("stalls"), rows("jobs"),
                         rows("probes"), tuple(notes))


# ---------------------------------------------------------------- format 1

#: Format 1's column names, renamed to format 2's (``viewer.csv`` became conditions.csv).
FORMAT1_NAMES = {
    "conditions": {"sent": "t_sent", "arrival": "t_arrival", "start": "t_start",
                   "ready": "t_ready", "played": "t_play", "received": "t_received",
                   "shown": "t_shown", "displayed": "t_displayed"},
    "slots": {"played": "t_start", "server_sent": "t_server_sent", "received": "t_received",
              "due": "t_due", "shown": "t_shown", "displayed": "t_displayed"},
    "jobs": {"start": "t_start", "ready": "t_ready", "gen_start": "t_gen_start",
             "gen_end": "t_gen_end"},
    "stalls": {}, "probes": {},
}


def _format1_rows(path: Path, renames: dict[str, str]) -> list[dict[str, str]]:
    """A format 1 table's rows as ``{format 2 name: cell}`` (a torn last row dropped)."""
    if not path.exists():
        return []
    text = read_text(path)
    if text and not text.endswith(("\n", "\r")):
        text = text[:max(text.rfind("\n"), text.rfind("\r")) + 1]
    reader = csv.DictReader(io.StringIO(text))
    return [{renames.get(k, k): v for k, v in row.items()} for row in reader if row]


def _typed(record_type: type, row: dict[str, str], path: Path) -> object:
    values = {}
    for f in fields(record_type):
        raw = row.get(f.name)
        if raw is None:
            raise LatsimError(f"{path}: a format 1 table without column {f.name!r}")
        try:
            values[f.name] = (float(raw) if raw != "" else NAN) if f.type == "float" else (
                int(raw) if f.type == "int" else raw == "True" if f.type == "bool" else raw)
        except ValueError:
            raise LatsimError(f"{path}: column {f.name}: {raw!r} is not a valid "
                              f"{f.type}") from None
    problem = domain_problem(record_type, values)
    if problem:
        raise LatsimError(f"{path}: {problem}")
    return record_type(**values)


def _read_format1(run_dir: Path) -> ViewerRecords:
    tables: dict[str, tuple] = {}
    for table in ("slots", "stalls", "jobs", "probes"):
        path = run_dir / f"{table}.csv"
        tables[table] = tuple(_typed(TABLES[table], row, path)
                              for row in _format1_rows(path, FORMAT1_NAMES[table]))
    by_position: dict[int, ViewerSlot] = {}
    for slot in tables["slots"]:
        by_position.setdefault(slot.position, slot)
    by_play = {slot.t_start: slot for slot in tables["slots"]}
    path = run_dir / "viewer.csv"
    conditions = []
    for row in _format1_rows(path, FORMAT1_NAMES["conditions"]):
        base = _typed(_Format1Condition, row, path)
        slot = by_play.get(base.t_play) if math.isfinite(base.t_play) else None
        if math.isfinite(base.t_play) and slot is None:
            raise LatsimError(f"{path}: condition {base.cid} played at {base.t_play} s, a "
                              "time no slot in slots.csv has")
        conditions.append(condition_row(base.cid, base.version, base.t_sent, base.t_arrival,
                                        base.status, slot, base.t_start, base.t_ready,
                                        base.t_displayed))
    return ViewerRecords(tuple(conditions), tables["slots"], tables["stalls"],
                         tables["jobs"], tables["probes"])


@dataclass(frozen=True)
class _Format1Condition:
    cid: int
    version: int
    t_sent: float
    t_arrival: float
    t_start: float
    t_ready: float
    t_play: float
    t_displayed: float
    status: str


def migrate_client_folder(run_dir: Path) -> bool:
    """Rewrite a format 1 client folder in format 2 (conditions.csv for viewer.csv, the new
    column names, the leading keys, ``format_version`` 2); ``False`` where it already was."""
    run_dir = Path(run_dir)
    config = _config(run_dir)
    if config.get("kind") != KIND:
        raise LatsimError(f"{run_dir}: not a client run folder")
    if client_format(config) >= CLIENT_FORMAT_VERSION:
        return False
    records = _read_format1(run_dir)
    config = {**config, "format_version": CLIENT_FORMAT_VERSION}
    write_viewer_records(run_dir, records, config)
    (run_dir / "viewer.csv").unlink(missing_ok=True)
    write_json(run_dir / "config.json", config)
    return True
