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
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from latsim.controller.records import read_csv
from latsim.errors import LatsimError
from latsim.run.folder import read_run_folder
from latsim.run.serving import SERVING_RECORD_TYPES
from latsim.run.viewer import KIND as VIEWER_KIND

#: Marks a condition's arrival on its thread (microseconds): flows need a slice to leave.
ARRIVAL_US = 1.0


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _group(extra: dict) -> tuple[str, str, str]:
    return (str(extra.get("policy", "")), str(extra.get("K", "")), str(extra.get("run", "")))


def _delta(folder, slots: list) -> float:  # noqa: ANN001
    config = folder.config
    if "delta" in config:
        return float(config["delta"])
    if "r" in config and "fps" in config:
        return float(config["r"]) / float(config["fps"])
    starts = sorted(s.t_start for _, s in slots)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False) if b > a]
    return min(gaps) if gaps else 1.0


def perfetto_trace(run_dir: str | Path) -> dict:
    """The trace of every run in ``run_dir`` (see the module docstring)."""
    folder = read_run_folder(run_dir)
    if folder.config.get("kind") == VIEWER_KIND:
        raise LatsimError(f"{run_dir}: a viewer-side client run; the Perfetto export reads "
                          "simulated and measured run folders (the server's side)")
    read = {name: folder.records(name) for name in ("jobs", "slots", "stalls", "conditions")}
    tables = {name: list(rows) for name, rows in read.items()}
    notes = [rows.torn for rows in read.values() if rows.torn]
    if not tables["jobs"]:
        raise LatsimError(f"{run_dir}: no job records to export")
    serving = {}
    for name in ("tasks", "starts"):
        path = folder.path / f"{name}.csv"
        serving[name] = list(read_csv(path, SERVING_RECORD_TYPES[name])) if path.exists() else []
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
                "ts": _us(task.t_start), "dur": _us(task.t_end - task.t_start),
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
            "cat": job.kind, "ts": _us(shift + job.t_start),
            "dur": _us(job.t_ready - job.t_start),
            "args": {"job": job.job_id, "branch": job.branch, "length": job.length,
                     "version": job.version}})
    return events


def _stream(pid: int, name: str, own: dict, shift: float, delta: float, flow_id: int
            ) -> tuple[list[dict], int]:
    events = [_meta(pid, None, name), _meta(pid, 1, "playback"), _meta(pid, 2, "conditions")]
    for slot in own["slots"]:
        events.append({"ph": "X", "pid": pid, "tid": 1, "name": f"slot v{slot.version}",
                       "cat": "slot", "ts": _us(shift + slot.t_start), "dur": _us(delta),
                       "args": {"position": slot.position, "version": slot.version,
                                "job": slot.job_id}})
    for stall in own["stalls"]:
        events.append({"ph": "X", "pid": pid, "tid": 1, "name": "stall", "cat": "stall",
                       "ts": _us(shift + stall.t_start),
                       "dur": _us(stall.t_end - stall.t_start),
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
