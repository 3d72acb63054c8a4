"""Run folders as Chrome/Perfetto trace-event JSON (``latsim export perfetto``).

Open the file in https://ui.perfetto.dev (or chrome://tracing). For every run in the folder
(each ``policy, K, run``; a serving folder's streams too):

- a *devices* process: one thread per device (a serving folder's ``tasks.csv``: every stage
  on every device of every pool) or one ``generator`` thread (a single worker's jobs), each
  job a slice named by its kind and condition version (``refill v3``), so that the UI's
  colours, which follow the name, tell refills from replans and versions apart;
- a process per stream with a *playback* thread (each played slot a slice named by its
  version; each stall a ``stall`` slice) and a *conditions* thread: each condition's arrival
  as a short slice, a flow arrow from it to the slot that first showed it, and its lifetime
  as an async slice (arrival to display) with R, C and Q nested inside.

Times are microseconds on one clock: a serving run's streams are placed at their playback
start (``starts.csv``), so devices and streams line up.

A client folder (:mod:`latsim.run.viewer`: the viewer's side of a ``latsim serve``
session) shows both sides of its session on its stream-time axis (:func:`client_trace`):

- the server's side, from the server's session folder where one is given (``latsim serve
  --out``: its controller's records, and a *shared device* thread with every session's
  tasks from the serve folder's ``tasks.csv``), else from the times the client was told
  (its jobs, slots, stalls and each condition's R, C, Q): processes as above, on the
  server's clock (server time minus the session's playback start: no offset);
- a *viewer* process on the client's clock: a *display* thread (each slot from the time it
  was displayed), a *client stalls* thread (late slots) and a *conditions* thread, each
  condition's end-to-end L (send to display) as an async slice with its uplink, server
  (R + C + Q) and to-screen parts nested inside; flow arrows from each send to the server's
  arrival and from each slot's server play to its display.

The client's times carry the clock offset it estimated; the trace's metadata holds it, its
bound (``RTT_min / 2``), the final estimate and the drift, and the session and server run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from latsim.controller.records import (
    ConditionRecord,
    JobRecord,
    SlotRecord,
    StallRecord,
)
from latsim.errors import (
    DEFAULT_MAX_EXPORT_RECORDS,
    MAX_EXPORT_RECORDS,
    LatsimError,
    check_int,
    check_work,
)
from latsim.run.folder import SERVED, RunFolder, is_run_folder, read_run_folder
from latsim.run.record_files import count_rows, read_csv
from latsim.run.serving import TaskRecord
from latsim.run.viewer import KIND as VIEWER_KIND
from latsim.run.viewer import ViewerRecords, read_viewer_records

#: ``latsim serve --out DIR``'s file of the shared device's tasks, in DIR (every session's)
DEVICE_TASKS = "tasks.csv"

#: Marks a condition's arrival on its thread (microseconds): flows need a slice to leave.
ARRIVAL_US = 1.0


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _slice(start: float, end: float) -> dict[str, float]:
    """A complete slice's ``ts`` and ``dur`` (µs): both ends rounded, so a slice that ends
    where the next begins ends exactly there (rounding ``dur`` on its own could overlap
    the next by a rounding step)."""
    ts = _us(start)
    return {"ts": ts, "dur": round(_us(end) - ts, 3)}


def _group(extra: dict) -> tuple[str, str, str]:
    return (str(extra.get("policy", "")), str(extra.get("K", "")), str(extra.get("run", "")))


def _delta(folder, slots: list) -> float:
    config = folder.config
    if "delta" in config:
        return float(config["delta"])
    if "r" in config and "fps" in config:
        return float(config["r"]) / float(config["fps"])
    starts = sorted(s.t_start for _, s in slots)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False) if b > a]
    return min(gaps) if gaps else 1.0


#: The record tables an export reads, of a run folder and of a client folder.
EXPORTED = ("jobs", "slots", "stalls", "conditions", "tasks", "starts")


def check_export_size(folders: list[Path], max_records: int) -> None:
    """Refuse, before reading them, folders whose record tables (:data:`EXPORTED`) hold
    more than ``max_records`` rows together (``--max-records``)."""
    check_int("--max-records", max_records, 1, MAX_EXPORT_RECORDS)
    paths = [folder / f"{name}.csv" for folder in folders for name in EXPORTED]
    rows = sum(count_rows(path) for path in paths if path.is_file())
    check_work(rows, max_records, "--max-records",
               f"{folders[0]}: its record tables hold {rows:,} rows to export",
               f", at most {MAX_EXPORT_RECORDS:,}")


def perfetto_trace(run_dir: str | Path,
                   max_records: int = DEFAULT_MAX_EXPORT_RECORDS) -> dict:
    """The trace of every run in ``run_dir`` (see the module docstring); a folder with
    more than ``max_records`` record rows is refused before it is read."""
    folder = read_run_folder(run_dir)
    if folder.config.get("kind") == VIEWER_KIND:
        return client_trace(run_dir, max_records=max_records)
    check_export_size([folder.path], max_records)
    read = {name: folder.records(name) for name in ("jobs", "slots", "stalls", "conditions")}
    tables = {name: list(rows) for name, rows in read.items()}
    notes = [rows.torn for rows in read.values() if rows.torn]
    if not tables["jobs"]:
        raise LatsimError(f"{run_dir}: no job records to export")
    for name in ("tasks", "starts"):
        if (folder.path / f"{name}.csv").exists():
            read[name] = folder.records(name)
            notes += [read[name].torn] if read[name].torn else []
    serving = {name: list(read.get(name, ())) for name in ("tasks", "starts")}
    if folder.kind == "records":
        notes.insert(0, f"{folder.path.name}: no config.json (bare record CSVs): whether "
                        "the run finished, and its settings, are unknown")
    delta = _delta(folder, tables["slots"])
    by_run: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for name, rows in {**tables, **serving}.items():
        for extra, record in rows:
            by_run[_group(extra)][name].append((extra, record))
    events: list[dict] = []
    next_pid = 1
    flow_id = 0
    for group in sorted(by_run):
        records = by_run[group]
        label = " ".join(part for part in (group[0], f"K={group[1]}" if group[1] else "",
                                            f"run {group[2]}" if group[2] else "") if part)
        origin = {record.stream: record.t_origin for _, record in records["starts"]}
        versions = {(int(extra.get("stream", 0)), job.job_id): job.version
                    for extra, job in records["jobs"]}
        devices_pid = next_pid
        next_pid += 1
        events += _devices(devices_pid, label, records, origin, versions)
        streams = sorted({int(extra.get("stream", 0)) for extra, _ in records["slots"]}
                         | {int(extra.get("stream", 0)) for extra, _ in records["jobs"]})
        for stream in streams:
            pid = next_pid
            next_pid += 1
            shift = origin.get(stream, 0.0)
            name = f"{label}: stream {stream}" if len(streams) > 1 or records["starts"] \
                else f"{label}: playback"
            own = {table: [r for extra, r in records[table]
                           if int(extra.get("stream", 0)) == stream]
                   for table in ("slots", "stalls", "conditions")}
            stream_events, flow_id = _stream(pid, name, own, shift, delta, flow_id)
            events += stream_events
    # each track's events in time order (metadata first; a stable sort keeps nested async
    # begins and ends that share a timestamp in the order they were made)
    events.sort(key=lambda e: (e["pid"], e["ph"] != "M", e["tid"], e.get("ts", 0.0)))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"source": Path(run_dir).name, "format": "latsim run folder",
                         "kind": folder.kind, "status": folder.state,
                         **({"notes": notes} if notes else {})}}


def _meta(pid: int, tid: int | None, name: str) -> dict:
    if tid is None:
        return {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}}
    return {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}


def _devices(pid: int, label: str, records: dict, origin: dict, versions: dict) -> list[dict]:
    events = [_meta(pid, None, f"{label}: devices")]
    if records["tasks"]:
        threads: dict[tuple[str, int], int] = {}
        for _, task in sorted(records["tasks"], key=lambda row: (row[1].pool, row[1].device)):
            threads.setdefault((task.pool, task.device), len(threads) + 1)
        for (pool, device), tid in threads.items():
            events.append(_meta(pid, tid, f"{pool} {device}"))
        for _, task in records["tasks"]:
            version = versions.get((task.stream, task.job_id), 0)
            events.append({
                "ph": "X", "pid": pid, "tid": threads[(task.pool, task.device)],
                "name": f"{task.stage} {task.kind} v{version}", "cat": task.kind,
                **_slice(task.t_start, task.t_end),
                "args": {"stream": task.stream, "job": task.job_id, "version": version,
                         "queued_s": task.t_start - task.t_enqueue, "batch": task.batch}})
        return events
    events.append(_meta(pid, 1, "generator"))
    for extra, job in records["jobs"]:
        if job.kind == "prebuffer" or not math.isfinite(job.t_ready):
            continue
        shift = origin.get(int(extra.get("stream", 0)), 0.0)
        events.append({
            "ph": "X", "pid": pid, "tid": 1, "name": f"{job.kind} v{job.version}",
            "cat": job.kind, **_slice(shift + job.t_start, shift + job.t_ready),
            "args": {"job": job.job_id, "branch": job.branch, "length": job.length,
                     "version": job.version}})
    return events


def _stream(pid: int, name: str, own: dict, shift: float, delta: float, flow_id: int
            ) -> tuple[list[dict], int]:
    events = [_meta(pid, None, name), _meta(pid, 1, "playback"), _meta(pid, 2, "conditions")]
    for slot in own["slots"]:
        events.append({"ph": "X", "pid": pid, "tid": 1, "name": f"slot v{slot.version}",
                       "cat": "slot", **_slice(shift + slot.t_start, shift + slot.t_start + delta),
                       "args": {"position": slot.position, "version": slot.version,
                                "job": slot.job_id}})
    for stall in own["stalls"]:
        events.append({"ph": "X", "pid": pid, "tid": 1, "name": "stall", "cat": "stall",
                       **_slice(shift + stall.t_start, shift + stall.t_end),
                       "args": {"position": stall.position, "open_at_end": stall.open_at_end}})
    for cond in sorted(own["conditions"], key=lambda c: (c.t_arrival, c.version)):
        arrival = _us(shift + cond.t_arrival)
        events.append({"ph": "X", "pid": pid, "tid": 2, "name": f"condition v{cond.version}",
                       "cat": "condition", "ts": arrival, "dur": ARRIVAL_US,
                       "args": {"version": cond.version, "displayed": cond.displayed,
                                "superseded": cond.superseded}})
        if not cond.displayed:
            continue
        flow_id += 1
        lifetime = f"{pid}:{cond.version}"
        events += [
            {"ph": "s", "pid": pid, "tid": 2, "name": "shown", "cat": "condition",
             "id": flow_id, "ts": arrival},
            {"ph": "f", "bp": "e", "pid": pid, "tid": 1, "name": "shown", "cat": "condition",
             "id": flow_id, "ts": _us(shift + cond.t_play)},
        ]
        parts = (("R", cond.t_arrival, cond.t_start), ("C", cond.t_start, cond.t_ready),
                 ("Q", cond.t_ready, cond.t_play))
        events.append({"ph": "b", "pid": pid, "tid": 2, "cat": "latency", "id": lifetime,
                       "name": f"L v{cond.version}", "ts": arrival,
                       "args": {"L": cond.L, "R": cond.R, "C": cond.C, "Q": cond.Q}})
        for part, start, end in parts:
            events.append({"ph": "b", "pid": pid, "tid": 2, "cat": "latency", "id": lifetime,
                           "name": part, "ts": _us(shift + start)})
            events.append({"ph": "e", "pid": pid, "tid": 2, "cat": "latency", "id": lifetime,
                           "name": part, "ts": _us(shift + end)})
        events.append({"ph": "e", "pid": pid, "tid": 2, "cat": "latency", "id": lifetime,
                       "name": f"L v{cond.version}", "ts": _us(shift + cond.t_play)})
    return events, flow_id


# ---------------------------------------------------------------- a client folder


def find_server_folder(client: RunFolder, server: str | Path) -> RunFolder:
    """The server's session folder of ``client``: ``server`` itself (a ``served`` folder),
    or the one among its sub-folders (a ``latsim serve --out`` folder) whose session and
    server run are the client's."""
    session, run = client.config.get("session"), client.config.get("server_run")
    if not session:
        raise LatsimError(f"{client.path}: no session in config.json (it never started), so "
                          "no server folder is its")
    path = Path(server)
    if not path.is_dir():
        raise LatsimError(f"--server {server}: not a folder")
    candidates = [path] if is_run_folder(path) else sorted(
        p for p in path.iterdir() if p.is_dir() and is_run_folder(p))
    for candidate in candidates:
        folder = read_run_folder(candidate)
        if folder.kind != SERVED:
            continue
        if folder.config.get("session") == session and (
                run is None or folder.config.get("server_run") == run):
            return folder
    if len(candidates) == 1 and candidates[0] == path:
        found = read_run_folder(path).config
        raise LatsimError(f"--server {server}: the server folder of session "
                          f"{found.get('session')!r} of server run {found.get('server_run')!r}"
                          f", not the client's ({session!r} of {run!r})")
    raise LatsimError(f"--server {server}: no server folder of session {session!r} (server "
                      f"run {run!r}) there; give the folder latsim serve --out wrote")


def _from_client(records: ViewerRecords) -> dict[str, list]:
    """The server's side as the client was told it, as the simulator's records."""
    def rows(items: list) -> list:
        return [({}, item) for item in items]

    jobs = [JobRecord(j.job_id, j.kind, j.branch, j.length, j.version, -1, j.t_start,
                      j.t_ready) for j in records.jobs]
    slots = [SlotRecord(s.position, s.version, s.job_id, s.t_start) for s in records.slots]
    stalls = [StallRecord(s.position, s.t_start, s.t_end, False) for s in records.stalls
              if s.side == "server"]
    conditions = [ConditionRecord(c.version, c.t_arrival, c.job_id, c.t_start, c.t_ready,
                                  c.t_play, c.R, c.C, c.Q, c.L_server, c.superseded,
                                  math.isfinite(c.t_play))
                  for c in records.conditions if c.version > 0 and math.isfinite(c.t_arrival)]
    return {"jobs": rows(jobs), "slots": rows(slots), "stalls": rows(stalls),
            "conditions": rows(conditions), "tasks": [], "starts": []}


def _device_tasks(server: RunFolder) -> list[tuple[dict, TaskRecord]]:
    """The shared device's tasks of the server run ``server`` belongs to (the serve
    folder's ``tasks.csv``, beside the session folders), every session's."""
    path = server.path.parent / DEVICE_TASKS
    if not path.is_file():
        return []
    run = server.config.get("server_run")
    return [(extra, task) for extra, task in read_csv(path, TaskRecord)
            if run is None or extra.get("server_run") == run]


def client_trace(client_dir: str | Path, server: str | Path | None = None,
                 max_records: int = DEFAULT_MAX_EXPORT_RECORDS) -> dict:
    """Both sides of one ``latsim serve`` session on one timeline (the module docstring):
    the client folder ``client_dir``, and the server's session folder found from
    ``server`` (:func:`find_server_folder`) where given."""
    client = read_run_folder(client_dir)
    if client.kind != VIEWER_KIND:
        raise LatsimError(f"{client_dir}: not a client run folder (kind {client.kind!r}); "
                          "--server goes with a client folder")
    config = client.config
    server_folder = None if server is None else find_server_folder(client, server)
    check_export_size([client.path] + ([] if server_folder is None else [
        server_folder.path, server_folder.path.parent]), max_records)  # its device tasks
    records = read_viewer_records(client.path)
    if not records.slots:
        raise LatsimError(f"{client_dir}: no slots recorded: nothing to export")
    if config.get("delta") is None:
        raise LatsimError(f"{client_dir}/config.json: no session (delta): nothing to export")
    delta = float(config["delta"])
    session = config.get("session") or "?"
    notes: list[str] = list(records.notes)
    if server_folder is None:
        side = _from_client(records)
        label = f"server: session {session} (as the client was told)"
    else:
        side = {name: list(server_folder.records(name))
                for name in ("jobs", "slots", "stalls", "conditions")}
        notes += [side_rows.torn for side_rows in map(server_folder.records,
                  ("jobs", "slots", "stalls", "conditions")) if side_rows.torn]
        side.update(tasks=[], starts=[])
        label = f"server: session {session} ({server_folder.name})"
    versions = {(0, job.job_id): job.version for _, job in side["jobs"]}
    events = _devices(1, label, side, {}, versions)
    events[0]["args"]["name"] = f"{label}: generator"
    if server_folder is not None:
        events += _shared_device(1, server_folder, session)
    own = {table: [r for _, r in side[table]] for table in ("slots", "stalls", "conditions")}
    stream_events, flow_id = _stream(2, f"{label}: playback", own, 0.0, delta, 0)
    events += stream_events
    events += _viewer(3, client, records, delta, flow_id)
    events.sort(key=lambda e: (e["pid"], e["ph"] != "M", e["tid"], e.get("ts", 0.0)))
    summary = client.summary

    def number(value: object) -> float | None:
        return float(value) if isinstance(value, int | float) and not isinstance(
            value, bool) else None

    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {
                "source": Path(client_dir).name, "format": "latsim client run folder",
                "kind": VIEWER_KIND, "status": client.state,
                "session": config.get("session"), "server_run": config.get("server_run"),
                "server_folder": None if server_folder is None else str(server_folder.path),
                "clock": "stream time (s x 1e6): 0 is the server's playback start; server "
                         "times are the server's clock minus it (no offset), client times "
                         "the client's clock minus (server start - offset)",
                "offset": number(config.get("offset")),
                "offset_uncertainty": number(config.get("offset_uncertainty")),
                "offset_final": number(summary.get("offset_final")),
                "offset_final_uncertainty": number(summary.get("offset_final_uncertainty")),
                "rtt_min": number(summary.get("rtt_min")),
                "drift": number(summary.get("drift")),
                **({"notes": notes} if notes else {})}}


def _shared_device(pid: int, server: RunFolder, session: str) -> list[dict]:
    """Every session's tasks on the shared device (its own marked), on this session's
    stream time (the server clock minus its ``server_start``); those before it are cut."""
    tasks = _device_tasks(server)
    start = server.config.get("server_start")
    if not tasks or not isinstance(start, int | float):
        return []
    events = [_meta(pid, 2, "shared device (every session)")]
    for extra, task in sorted(tasks, key=lambda row: row[1].t_start):
        begin, end = task.t_start - start, task.t_end - start
        if end <= 0:
            continue
        begin = max(0.0, begin)
        who = str(extra.get("session", task.stream))
        events.append({
            "ph": "X", "pid": pid, "tid": 2,
            "name": f"{'this session' if who == session else who} {task.kind}",
            "cat": "device", **_slice(begin, end),
            "args": {"session": who, "job": task.job_id, "queued_s": task.wait}})
    return events


def _viewer(pid: int, client: RunFolder, records: ViewerRecords, delta: float,
            flow_id: int) -> list[dict]:
    """The client's clock: display, client stalls and conditions (send to display)."""
    config = client.config
    offset, bound = config.get("offset"), config.get("offset_uncertainty")
    clock = "" if offset is None else f", offset {1e3 * float(offset):+.2f} ms" + (
        "" if bound is None else f" ± {1e3 * float(bound):.2f} ms")
    events = [_meta(pid, None, f"viewer: session {config.get('session')} (client clock"
                               f"{clock})"),
              _meta(pid, 1, "display"), _meta(pid, 2, "client stalls"),
              _meta(pid, 3, "conditions")]
    shown = [(s.t_displayed if math.isfinite(s.t_displayed) else s.t_shown, s)
             for s in records.slots if math.isfinite(s.t_shown)]
    shown.sort(key=lambda pair: pair[0])
    flow_of: dict[int, int] = {}
    for index, (at, slot) in enumerate(shown):
        following = shown[index + 1][0] if index + 1 < len(shown) else at + delta
        events.append({"ph": "X", "pid": pid, "tid": 1, "name": f"slot v{slot.version}",
                       "cat": "display", **_slice(at, min(at + delta, following)),
                       "args": {"position": slot.position, "version": slot.version,
                                "job": slot.job_id, "received": slot.t_received,
                                "shown": slot.t_shown, "displayed": slot.t_displayed}})
        flow_id += 1
        flow_of[slot.position] = flow_id
        events += [  # the server's play of the slot to its display
            {"ph": "s", "pid": 2, "tid": 1, "name": "displayed", "cat": "slot",
             "id": flow_id, "ts": _us(slot.t_start)},
            {"ph": "f", "bp": "e", "pid": pid, "tid": 1, "name": "displayed", "cat": "slot",
             "id": flow_id, "ts": _us(max(at, slot.t_start))}]
    for stall in records.stalls:
        if stall.side == "client":
            events.append({"ph": "X", "pid": pid, "tid": 2, "name": "client stall",
                           "cat": "stall", **_slice(stall.t_start, stall.t_end),
                           "args": {"position": stall.position}})
    for cond in sorted(records.conditions, key=lambda c: (c.t_sent, c.cid)):
        sent = _us(cond.t_sent)
        events.append({"ph": "X", "pid": pid, "tid": 3, "name": f"sent v{cond.version}",
                       "cat": "condition", "ts": sent, "dur": ARRIVAL_US,
                       "args": {"cid": cond.cid, "version": cond.version,
                                "status": cond.status}})
        if cond.version > 0 and math.isfinite(cond.t_arrival):
            flow_id += 1
            events += [  # the send to the server's arrival
                {"ph": "s", "pid": pid, "tid": 3, "name": "sent", "cat": "condition",
                 "id": flow_id, "ts": sent},
                {"ph": "f", "bp": "e", "pid": 2, "tid": 2, "name": "sent",
                 "cat": "condition", "id": flow_id, "ts": max(sent, _us(cond.t_arrival))}]
        if not cond.displayed:
            continue
        lifetime = f"{pid}:{cond.cid}"
        # parts in time order, each from where the last ended (a part made negative by the
        # offset's error draws empty; its value is in the args)
        bounds = [cond.t_sent]
        for t in (cond.t_arrival, cond.t_play, cond.t_displayed):
            bounds.append(max(bounds[-1], t))
        events.append({"ph": "b", "pid": pid, "tid": 3, "cat": "latency", "id": lifetime,
                       "name": f"L v{cond.version}", "ts": sent,
                       "args": {"L": cond.L, "uplink": cond.t_arrival - cond.t_sent,
                                "R": cond.R, "C": cond.C, "Q": cond.Q,
                                "to_screen": cond.t_displayed - cond.t_play}})
        for part, start, end in zip(("uplink", "server (R+C+Q)", "to screen"), bounds,
                                    bounds[1:], strict=False):
            events.append({"ph": "b", "pid": pid, "tid": 3, "cat": "latency", "id": lifetime,
                           "name": part, "ts": _us(start)})
            events.append({"ph": "e", "pid": pid, "tid": 3, "cat": "latency", "id": lifetime,
                           "name": part, "ts": _us(end)})
        events.append({"ph": "e", "pid": pid, "tid": 3, "cat": "latency", "id": lifetime,
                       "name": f"L v{cond.version}", "ts": _us(bounds[-1])})
    return events
