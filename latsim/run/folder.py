"""The run-folder format: one schema, one writer, one reader, one summary-row builder.

A run folder holds the records of one or more runs and what they were run with::

    config.json     {"format_version": 1, "kind": ..., "status": ..., ...}
    summary.json    one summary row (a single run) or a list of rows (an experiment)
    conditions.csv jobs.csv slots.csv stalls.csv discards.csv
                    the controller's records, leading columns ``policy, K, run``
    trace.jsonl     the arrival trace of a single run (``config["trace_copy"]``)
    baseline_twin/  an experiment of speculative runs alone that asked for the baseline
                    beside them to measure A (``Experiment.twin``): that baseline, an
                    experiment folder of its own (``twin_of``)

``kind`` is ``experiment`` (``latsim simulate/sweep --out``: every (policy, K, replication)
in one folder), ``simulated`` (one simulated run, e.g. for ``latsim compare``),
``measured`` (one live run, written by the harness with extra telemetry files), ``served``
(one session of ``latsim serve --out``, the server's side) or ``client`` (the viewer's side
of one: :mod:`latsim.run.viewer`, its own format version).
``status`` is ``complete``, ``running`` (the writer has not finished; a folder left so by a
killed process reads as ``incomplete``), or why the run stopped early. A finished single run's
config also holds ``end_time``, the time its records cover (past ``duration`` by the drain for
a complete run, before it for an interrupted one). :attr:`RunFolder.state` sorts every run
into ``complete``, ``interrupted`` (stopped early and said so), ``failed`` (stopped by an
error, e.g. a failed generator) or ``incomplete`` (its writer never finished: killed, or still
running). Small, essential files are written atomically (a temporary name, then a rename), so
a reader never sees half a ``config.json`` or ``summary.json``; the record CSVs are appended
while a live run goes, so a killed writer can leave a torn last row, which readers drop with a
note (:func:`latsim.run.record_files.read_csv`). Every command that writes a folder checks
first that it would replace no file another wrote there (:func:`claim_folder`).

Folders written before the format had a version (no ``format_version``) read as version 0.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from latsim.controller import ControllerConfig
from latsim.controller.policies import Policy
from latsim.controller.records import (
    COUNTED_TABLES,
    RECORD_TYPES,
    JobRecord,
)
from latsim.controller.timing import Timing
from latsim.errors import MAX_INPUT_BYTES, LatsimError
from latsim.model.traces import Trace, load_trace, write_trace
from latsim.run.files import dumps
from latsim.run.record_files import CsvRows, read_csv, read_file_bytes, write_csv
from latsim.run.serving import SERVING_RECORD_TYPES, ServingRecords
from latsim.run.stream import COMPLETE, INTERRUPTED, RunRecords
from latsim.writing import replacing

FORMAT_VERSION = 1
#: A client folder's format (:mod:`latsim.run.viewer`): 2 has the simulator's table and
#: column names (conditions.csv, ``t_*``) and the ``policy, K, run`` columns; 1 (viewer.csv,
#: ``sent``/``shown``...) is still read.
CLIENT_FORMAT_VERSION = 2
KINDS = ("experiment", "simulated", "measured")
#: One session of ``latsim serve --out``, the server's side (``harness.serve``): the
#: controller's records like a measured run's, but on a device other sessions shared.
SERVED = "served"
#: Every kind a run folder's config.json may name (``client``: a viewer's,
#: :data:`latsim.run.viewer.KIND`; ``served``: :data:`SERVED`); another is a foreign folder.
KNOWN_KINDS = (*KINDS, "client", SERVED)
RUNNING = "running"
INCOMPLETE = "incomplete"  # "running" in a folder no process is writing any more
FAILED = "failed"  # stopped early by an error (a failed generator)
#: What :attr:`RunFolder.state` reads: how far a run got (``running``: still being
#: written by a live process on this host).
STATES = (COMPLETE, INTERRUPTED, INCOMPLETE, FAILED, RUNNING)
TRACE_COPY = "trace.jsonl"

#: What a single run's config.json must hold to be re-simulated.
RUN_KEYS = ("K", "policy", "q", "commit", "r", "fps", "duration", "lead")
#: Every record table a run folder may hold, by name, with its record type: the
#: controller's and a serving run's. :meth:`RunFolder.records` reads each, checked.
TABLE_TYPES: dict[str, type] = {**RECORD_TYPES, **SERVING_RECORD_TYPES}


# ---------------------------------------------------------------- schema


@dataclass(frozen=True)
class RunIdentity:
    """What a summary row starts with: the configuration its metrics belong to."""

    policy: str
    K: int
    q: int
    commit: str
    r: int
    fps: float
    T: float
    delta: float
    cost: str
    C_mean: float
    lead: float
    updates: str
    duration: float
    seed: int | None

    @classmethod
    def of(cls, config: ControllerConfig, cost: str, C_mean: float, updates: str,
           duration: float, seed: int | None) -> RunIdentity:
        timing, policy = config.timing, config.policy
        return cls(policy.name, timing.K, policy.commit_unit(timing.K), policy.commit,
                   timing.r, timing.fps, timing.T, timing.delta, cost, C_mean, config.lead,
                   updates, duration, seed)


def summary_row(identity: RunIdentity, metrics: Mapping[str, Any], **extra: Any) -> dict:
    """The one summary row layout: identity, then the metrics, then ``extra`` keys."""
    return {**asdict(identity), **metrics, **extra}


def run_config(config: ControllerConfig, duration: float, kind: str, status: str = RUNNING,
               **extra: Any) -> dict:
    """``config.json`` of a single run: the format, the stream and the window, then
    ``extra`` (provenance, measurement settings)."""
    if kind not in KINDS[1:]:
        raise ValueError(f"a single run's kind is simulated or measured, not {kind!r}")
    timing, policy = config.timing, config.policy
    return {
        "format_version": FORMAT_VERSION, "kind": kind, "status": status,
        "K": timing.K, "policy": policy.name, "q": policy.commit_unit(timing.K),
        "commit": policy.commit, "commit_lead": policy.commit_lead, "r": timing.r,
        "fps": timing.fps, "T": timing.T, "delta": timing.delta, "duration": duration,
        "lead": config.lead, "trace_copy": TRACE_COPY, **extra,
    }


# ---------------------------------------------------------------- writing


def writer_stamp() -> dict[str, Any]:
    """Who is writing a folder that says ``running``: this process's id and host."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def writer_alive(payload: Mapping[str, Any]) -> bool | None:
    """Whether the process a ``running`` payload names (:func:`writer_stamp`) still runs:
    True or False on the host that wrote it, None where that cannot be told (another
    host; no stamp, a folder from before stamps; or this very process, whose run may have
    ended without saying so, as one stopped by a full disk). A pid the system has since
    given to another process reads alive: the stamp bounds staleness, it does not prove
    life."""
    writer = payload.get("writer")
    if not isinstance(writer, Mapping) or writer.get("host") != socket.gethostname():
        return None
    pid = writer.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return None
    return True


def write_json(path: Path, payload: object) -> Path:
    """Write JSON to ``path``, never replacing what is not a file of its own. A mapping
    whose ``status`` is ``running`` gets a ``writer`` stamp (:func:`writer_stamp`), so a
    reader can tell a dead run from a live one (:func:`writer_alive`). Written as
    :func:`latsim.writing.replacing` says: atomically, following a link, through a device
    or a pipe, never replacing a device, a pipe or a folder."""
    if isinstance(payload, Mapping) and payload.get("status") == RUNNING:
        payload = {**payload, "writer": writer_stamp()}
    text = dumps(payload) + "\n"
    with replacing(path) as destination:
        destination.write_text(text)
    return path


def claim_folder(out: Path, files: Iterable[str], record: str, what: str,
                 wrote: Callable[[Mapping[str, Any]], bool],
                 read: Callable[[Path], Any] | None = None) -> None:
    """Refuse ``out`` before any work where writing ``files`` there would replace what
    another wrote: a one-line error naming the file. ``record`` (one of ``files``, a JSON
    object, or what ``read`` makes of it) says who wrote the folder, and ``wrote`` tells
    from it whether a command of this kind (``what``, e.g. ``latsim simulate``) did.
    Allowed: a new folder, one holding none of ``files`` (other files are never touched),
    and one whose ``record`` ``wrote`` accepts and that no live process on this host is
    still writing (:func:`writer_alive`): re-running into one's own output replaces it."""
    there = [name for name in files if (out / name).exists() or (out / name).is_symlink()]
    if not there:
        return
    path = out / record
    if record not in there:
        raise LatsimError(f"{out / there[0]}: not written by {what} (no {record} beside "
                          "it); use another --out")
    try:
        earlier = (read or read_json)(path)
    except LatsimError as exc:
        raise LatsimError(f"{exc}: not written by {what}; use another --out") from None
    if not isinstance(earlier, Mapping) or not wrote(earlier):
        raise LatsimError(f"{path}: not written by {what}; use another --out")
    if earlier.get("status") == RUNNING and writer_alive(earlier):
        raise LatsimError(f"{out}: process {earlier['writer'].get('pid')} on this host is "
                          "still writing there; wait for it, stop it, or use another --out")


def of_kind(kind: str) -> Callable[[Mapping[str, Any]], bool]:
    """For :func:`claim_folder`: a run folder's ``config.json`` of ``kind``."""
    return lambda config: config.get("kind") == kind


def of_format(name: str) -> Callable[[Mapping[str, Any]], bool]:
    """For :func:`claim_folder`: a record whose ``format`` is ``name`` (a grid's, a
    fleet's, a plan's)."""
    return lambda record: record.get("format") == name


def header_of(path: Path) -> dict[str, list[str]]:
    """For :func:`claim_folder`'s ``read``: a CSV record's column names, as
    ``{"columns": [...]}`` (a folder whose only record is a CSV, as ``latsim serve``'s)."""
    from latsim.run.record_files import read_header

    return {"columns": read_header(path)}


def of_columns(columns: Iterable[str]) -> Callable[[Mapping[str, Any]], bool]:
    """For :func:`claim_folder` with :func:`header_of`: a CSV with exactly ``columns``."""
    expected = list(columns)
    return lambda record: record.get("columns") == expected


def write_records(run_dir: Path, runs: Iterable[tuple[tuple[str, int, int], RunRecords]],
                  skip: Iterable[str] = ()) -> list[Path]:
    """One CSV per record type but those in ``skip``, rows of every ``((policy, K, run),
    records)`` in order."""
    runs, skip = list(runs), set(skip)
    return [_write_table(run_dir, table, record_type,
                         (((("policy", policy), ("K", K), ("run", index)),
                           getattr(records, table))
                          for (policy, K, index), records in runs))
            for table, record_type in RECORD_TYPES.items() if table not in skip]


def _write_table(run_dir: Path, table: str, record_type: type,
                 parts: Iterable[tuple[tuple[tuple[str, object], ...], Iterable[object]]]
                 ) -> Path:
    """``table.csv``: the header, then each part's records with its leading columns."""
    parts = list(parts)
    path = run_dir / f"{table}.csv"
    header = parts[0][0] if parts else (("policy", ""), ("K", 0), ("run", 0))
    write_csv(path, record_type, (), extra=header)
    for extra, records in parts:
        write_csv(path, record_type, records, extra=extra, append=True)
    return path


def write_serving_records(run_dir: Path,
                          runs: Iterable[tuple[tuple[str, int, int], ServingRecords]],
                          skip: Iterable[str] = ()) -> list[Path]:
    """A serving experiment's records: the controller's tables with a ``stream`` column
    after ``policy, K, run``, and the serving tables (:data:`SERVING_RECORD_TYPES`, whose
    records carry their stream) after ``policy, K, run``; none of the tables in ``skip``."""
    runs, skip = list(runs), set(skip)
    paths = [_write_table(run_dir, table, record_type,
                          (((("policy", policy), ("K", K), ("run", index),
                             ("stream", stream)), getattr(records, table))
                           for (policy, K, index), serving in runs
                           for stream, records in enumerate(serving.streams)))
             for table, record_type in RECORD_TYPES.items() if table not in skip]
    paths += [_write_table(run_dir, table, record_type,
                           (((("policy", policy), ("K", K), ("run", index)),
                             getattr(serving, table))
                            for (policy, K, index), serving in runs))
              for table, record_type in SERVING_RECORD_TYPES.items() if table not in skip]
    return paths


def write_simulated_run(run_dir: Path, config: ControllerConfig, trace: Trace,
                        records: RunRecords, summary: dict, **extra: Any) -> Path:
    """A single simulated run as a run folder, so it can be compared, plotted and checked
    like a measured one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    duration = records.duration
    conf = run_config(config, duration, "simulated", **extra)
    write_json(run_dir / "config.json", conf)
    write_trace(run_dir / TRACE_COPY, list(trace.times), {"duration": duration})
    write_records(run_dir, [((config.policy.name, config.timing.K, 0), records)])
    write_json(run_dir / "summary.json", summary)
    write_json(run_dir / "config.json",
               {**conf, "status": records.status, "end_time": records.end_time})
    return run_dir


# ---------------------------------------------------------------- reading


def read_json(path: Path) -> Any:
    """A run folder's JSON file, bounded (:data:`MAX_INPUT_BYTES`); a one-line error for
    one that cannot be read or parsed."""
    try:
        return json.loads(read_file_bytes(path, MAX_INPUT_BYTES).decode("utf-8"))
    except OSError as exc:
        raise LatsimError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise LatsimError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None
    except json.JSONDecodeError as exc:
        raise LatsimError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise LatsimError(f"{path}: not usable JSON ({type(exc).__name__})") from None


@dataclass(frozen=True)
class RunFolder:
    """A run folder, read: its config, its summary rows and access to its records."""

    path: Path
    config: dict
    summaries: tuple[dict, ...]
    # record tables already read (each file is read once per RunFolder)
    _read: dict[str, CsvRows] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def format_version(self) -> int:
        return int(self.config.get("format_version", 0))

    @property
    def kind(self) -> str:
        """One of :data:`KINDS`, or ``records`` for bare record CSVs with no config."""
        if "kind" in self.config:
            return str(self.config["kind"])
        if not self.config:
            return "records"
        if "Ks" in self.config:
            return "experiment"
        return "simulated" if self.config.get("source") == "simulated" else "measured"

    @property
    def status(self) -> str:
        """``complete``; ``running`` (marked running by another process on this host that
        still runs); ``incomplete`` (a writer stopped without saying why: no summary, or marked
        running by a process that is gone or cannot be checked); or the reason the run
        stopped early."""
        status = str(self.config.get("status", COMPLETE))
        if status == RUNNING and writer_alive(self.config):
            return RUNNING
        if status == RUNNING or not self.summaries:
            return INCOMPLETE
        return status

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def stop_reason(self) -> str | None:
        reason = self.config.get("stop_reason") or self.summary.get("stop_reason")
        return None if reason is None else str(reason)

    @property
    def state(self) -> str:
        """One of :data:`STATES`: ``complete``; ``incomplete`` (see :attr:`status`);
        ``failed`` where the run says an error stopped it (status or stop reason naming a
        failure or an error); otherwise a run stopped early reads ``interrupted``."""
        status = self.status
        if status in (COMPLETE, INCOMPLETE, RUNNING):
            return status
        reason = f"{status} {self.stop_reason or ''}".lower()
        if status == FAILED or "fail" in reason or "error" in reason:
            return FAILED
        return INTERRUPTED

    @property
    def end_time(self) -> float | None:
        """The time the run's records cover, as the run stated it (config, else summary);
        ``None`` where it did not say (a killed writer: see :meth:`records_end`)."""
        for source in (self.config, self.summary):
            value = source.get("end_time")
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        return None

    def records_end(self) -> float | None:
        """The time up to which a single run's records are complete when its writer did not
        say (killed): the last finished job's ``t_ready``. Everything the controller decided
        before it was written before that job's record (the writer appends in order), and
        with one worker no other job was running then; a job running when the writer died
        left no record, so no later time is safe. ``None`` if no job finished."""
        ready = [job.t_ready for _, job in self.records("jobs")
                 if isinstance(job, JobRecord) and job.kind != "prebuffer"]
        return max(ready) if ready else None

    @property
    def summary(self) -> dict:
        """The summary row of a single run (``{}`` if it has none yet)."""
        return self.summaries[0] if self.summaries else {}

    def require_single_run(self) -> None:
        if self.kind not in KINDS[1:]:
            raise LatsimError(f"{self.path}: a single run needs its config.json "
                              f"(this folder is {self.kind!r})")
        missing = [k for k in RUN_KEYS if k not in self.config]
        if missing:
            raise LatsimError(f"{self.path}/config.json lacks {', '.join(missing)}")

    @property
    def controller_config(self) -> ControllerConfig:
        """The stream a single run was made with."""
        self.require_single_run()
        c = self.config
        try:
            timing = Timing(self._int("K"), self._int("r"), self._float("fps"))
            if not isinstance(c["policy"], str) or not isinstance(c["commit"], str):
                raise LatsimError("policy and commit must be names")
            policy = Policy(c["policy"], self._int("q"), c["commit"],
                            self._float("commit_lead", 0.0))
            return ControllerConfig(timing, policy, self._float("lead"))
        except LatsimError as exc:
            raise LatsimError(f"{self.path / 'config.json'}: {exc}") from None

    @property
    def duration(self) -> float:
        try:
            return self._float("duration")
        except LatsimError as exc:
            raise LatsimError(f"{self.path / 'config.json'}: {exc}") from None

    def _float(self, key: str, default: float | None = None) -> float:
        """A finite number of config.json (``default`` where absent), else an error."""
        value = self.config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise LatsimError(f"{key} must be a number, got {str(value)[:40]!r}")
        return float(value)

    def _int(self, key: str) -> int:
        value = self.config.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise LatsimError(f"{key} must be a whole number, got {str(value)[:40]!r}")
        return value

    def trace(self) -> Trace:
        return load_trace(self.path / self.config.get("trace_copy", TRACE_COPY))

    def _check_kept(self, table: str) -> None:
        """A table the run counted instead of keeping (``--records``) is an error to read,
        not an empty table."""
        level = self.config.get("records", "all")
        if level != "all" and (level == "none" or table in COUNTED_TABLES):
            raise LatsimError(f"{self.path}: {table} records were not kept (written with "
                              f"--records {level}); rerun with --records all for them")

    def record_keys(self) -> dict[str, set[str] | None]:
        """The leading columns every record row of this folder starts with, and the cells
        its config.json allows there (``None``: any whole number): a single run's policy
        and K, an experiment's policies and Ks; a serving experiment's streams. Bare
        record CSVs (no config.json) need none: a measured run's may have none."""
        config = self.config
        if not config:  # bare record CSVs (a measured run's own): the columns they have
            return {}
        policies: object = config.get("policies") if self.kind == "experiment" else [
            config.get("policy")]
        Ks: object = config.get("Ks") if self.kind == "experiment" else [config.get("K")]
        keys: dict[str, set[str] | None] = {"policy": None, "K": None, "run": None}
        if isinstance(config.get("serving"), dict):  # a serving experiment: many streams
            keys["stream"] = None
        if isinstance(policies, list) and all(isinstance(p, str) for p in policies):
            keys["policy"] = set(policies)
        if isinstance(Ks, list) and all(isinstance(K, int) and not isinstance(K, bool)
                                        for K in Ks):
            keys["K"] = {str(K) for K in Ks}
        return keys

    def records(self, table: str) -> CsvRows:
        """``(leading columns, record)`` rows of one record table (:data:`TABLE_TYPES`;
        empty if it is absent), every cell checked (:func:`read_csv`, with the leading
        columns :meth:`record_keys` says); ``.torn`` notes a torn last row that was
        dropped."""
        if table not in self._read:
            self._check_kept(table)
            path = self.path / f"{table}.csv"
            self._read[table] = (read_csv(path, TABLE_TYPES[table], self.record_keys())
                                 if path.exists() else CsvRows())
        return self._read[table]

    def frame(self, table: str) -> Any:
        """One record CSV as a pandas DataFrame (empty if absent or empty).

        Checked like :meth:`records`: a torn last row is dropped, its note in
        ``frame.attrs["torn"]``; a bad row elsewhere is an error naming file and line.
        """
        import pandas as pd

        self._check_kept(table)
        path = self.path / f"{table}.csv"
        if not path.exists():
            return pd.DataFrame()
        torn = None
        if table in TABLE_TYPES:  # every row checked as records() checks it, not kept
            checked = self._read.get(table)
            if checked is None:
                checked = read_csv(path, TABLE_TYPES[table], self.record_keys())
            torn = checked.torn
        raw = read_file_bytes(path)
        if raw and not raw.endswith((b"\n", b"\r")):  # drop the torn last line
            raw = raw[:max(raw.rfind(b"\n"), raw.rfind(b"\r")) + 1]
        try:
            frame = pd.read_csv(io.BytesIO(raw))
        except pd.errors.EmptyDataError:
            frame = pd.DataFrame()
        except pd.errors.ParserError as exc:
            raise LatsimError(f"{path}: {' '.join(str(exc).split())}") from None
        frame.attrs["torn"] = torn
        return frame


def is_run_folder(path: Path) -> bool:
    """config.json and jobs.csv; or config.json alone in a folder written with
    ``--records none`` (its summaries, no record tables)."""
    config = path / "config.json"
    if not config.is_file():
        return False
    if (path / "jobs.csv").is_file():
        return True
    try:
        return read_json(config).get("records") == "none"
    except (AttributeError, LatsimError):  # read_json: a one-line error for any bad file
        return False


def read_run_folder(path: str | Path) -> RunFolder:
    """Read a run folder's config and summary (records are read on demand)."""
    folder = Path(path)
    if not folder.is_dir():
        raise LatsimError(f"{path}: not a folder")
    if not (folder / "config.json").is_file():
        if not (folder / "jobs.csv").is_file():
            raise LatsimError(f"{path}: not a run folder (config.json and jobs.csv missing)")
        return RunFolder(folder, {}, ())  # bare record CSVs: status reads incomplete
    config = read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise LatsimError(f"{folder / 'config.json'}: expected a JSON object")
    kind = config.get("kind")
    if kind is not None and kind not in KNOWN_KINDS:
        raise LatsimError(f"{folder / 'config.json'}: kind {str(kind)[:40]!r} is not a "
                          f"latsim run folder's ({', '.join(KNOWN_KINDS)})")
    try:
        version = int(config.get("format_version", 0))
    except (TypeError, ValueError):
        raise LatsimError(f"{folder / 'config.json'}: format_version is not a number") from None
    newest = CLIENT_FORMAT_VERSION if kind == "client" else FORMAT_VERSION
    if version > newest:
        raise LatsimError(f"{folder}: run-folder format {version} is newer than this latsim "
                          f"reads ({newest}); upgrade latsim")
    # every versioned writer says what it wrote and how it ended: without them a damaged
    # folder would read as a complete run of a guessed kind
    lacking = [key for key in ("kind", "status") if version >= 1 and key not in config]
    if lacking:
        raise LatsimError(f"{folder / 'config.json'}: lacks {' and '.join(lacking)} (every "
                          f"run-folder format {version} config says them): not a run "
                          "folder latsim wrote, or a damaged one")
    summary_path = folder / "summary.json"
    summaries: tuple[dict, ...] = ()
    if summary_path.is_file():
        loaded = read_json(summary_path)
        summaries = tuple(loaded) if isinstance(loaded, list) else (loaded,)
        if not all(isinstance(row, dict) for row in summaries):
            raise LatsimError(f"{summary_path}: expected a JSON object or a list of objects")
    return RunFolder(folder, config, summaries)


def _why_not_a_run(path: Path) -> str:
    if (path / "jobs.csv").is_file():
        return "bare record CSVs without config.json (not a run folder)"
    return "not a run folder (config.json and jobs.csv missing)"


def scan_run_folders(paths: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Run folders among ``paths`` (each a run folder or a folder of them), and the
    sub-folders skipped there with the reason (hidden ones are passed over quietly).

    A path that does not exist, or that neither is a run folder nor holds any folder, is an
    error; a folder of folders none of which is a run yields only skipped entries."""
    found: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for path in paths:
        if not path.exists():
            raise LatsimError(f"{path}: no such folder")
        if not path.is_dir():
            skipped.append((path, "not a folder"))
            continue
        if is_run_folder(path):
            found.append(path)
            continue
        subfolders = sorted(p for p in path.iterdir()
                            if p.is_dir() and not p.name.startswith((".", "_")))
        inside = [p for p in subfolders if is_run_folder(p)]
        if not inside and not subfolders:
            raise LatsimError(f"{path}: not a run folder (config.json + jobs.csv) "
                              "and holds none")
        found.extend(inside)
        skipped.extend((p, _why_not_a_run(p)) for p in subfolders if p not in inside)
    return found, skipped


def find_run_folders(paths: Iterable[Path]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder or a folder of them."""
    found, skipped = scan_run_folders(paths)
    if not found:
        if not skipped:
            raise LatsimError("no run folders given")
        path, reason = skipped[0]
        raise LatsimError(f"{path}: {reason}")
    return found


_RUN_NAME = re.compile(r"K\d+-[A-Za-z_]+$")


def measurement_of(folder: RunFolder) -> str:
    """Which measurement a single run belongs to, so runs of different measurements are not
    joined in one figure line: ``config["measurement_id"]`` where the writer gave one, else
    the parent folder's name, plus the name's prefix before ``K<K>-<policy>`` (the live
    harness prefixes runs in a shared folder with their measurement's time stamp)."""
    given = folder.config.get("measurement_id")
    if given:
        return str(given)
    parent = folder.path.resolve().parent.name or "."
    match = _RUN_NAME.search(folder.name)
    prefix = folder.name[:match.start()].rstrip("-_ ") if match else ""
    return f"{parent}/{prefix}" if prefix else parent
