"""Load (issue 23): one ``latsim serve`` under 1, 8, 32 and 64 viewer sessions, where a job
costs the device almost nothing, so that any stall is the server's own (its event loop,
its session and device threads, its sending).

Run: ``.venv/bin/python bench/bench_serve_load.py [--sessions 1 8 32 64] [--duration 20]
[--out results/serve/load] [--repeats 2] [--lead S] [--payload-bytes N] [--cost SPEC]``
(about 25 s a server run, ``--repeats`` runs per session count, interleaved so that the
machine's other load spreads over the counts, their sessions, slots and jobs pooled;
``--lead`` has the viewers ask for that lead instead of the server's own, which its
warm-up sets: a few ms here). For each run a fresh
``latsim serve --generator sleep --cost fixed:0.002 --K 4 --max-sessions 64`` runs as a
subprocess (its CPU and memory are its own, and its peak resident set starts from zero);
this process is every viewer at once: one asyncio event loop with one ``websockets``
connection per session (the protocol of :mod:`harness.net.wire`, no shaping), the
sessions starting over ``--ramp`` seconds, each a ``--duration`` s window at 16 fps (K = 4,
δ = 0.25 s, the server's own lead), speculative, with ``--conditions`` conditions at seeded
random times (far below ``--max-condition-rate``).

Measured, per session count:

- **server CPU**: the server process's CPU seconds (utime + stime of ``/proc/PID/stat``)
  per wall second, while every session is on (from the last ``ready`` to the first
  ``end``), and the busiest 1 s of it; its threads (``/proc/PID/status``, the most seen);
- **server memory**: peak resident set (``VmHWM``) at the end, beside the resident set
  when it had warmed up and served nobody yet;
- **send lag**: each slot frame's ``sent − played``, both on the server's clock (how late
  the server sent a slot it played on time): p50, p99, max over all slots of all sessions;
  and ``received − sent`` on this side (loopback, the same CLOCK_MONOTONIC: the server's
  ``clock_offset`` is 0, which a min-RTT probe per session checks), which includes this
  process's own lateness;
- **stall**, per session over its window: the server's (a gap in its played slots longer
  than δ: the session's controller had nothing to play, as ``latsim client`` counts it)
  and the viewer's (the server's plus the client's: a slot that arrived after its server
  play time + ``--playout-delay``, by the serving model's
  :class:`~latsim.controller.playout.ClientPlayout`), median and max over sessions;
- beside them, what tells the server from the rest: the device's busy share, each job's
  dispatch delay (``gen_start − start`` of the ``job`` messages: from the controller's
  start, or for a job that queued for the device from when the device took it, to the
  generator's start: thread hand-offs, not the device's queue) against the lead, this
  process's CPU and its event-loop lag (a 5 ms sleep's overshoot, p99), and the CPU the
  machine spent on everything else meanwhile (``/proc/stat`` less the two processes).

The clients share the machine with the server (and with whatever else runs there): the
table and ``load.json`` say which machine, and this process's CPU shows what the viewers
took. Writes ``load.csv``, ``load.json`` (the setup, the machine, per-session figures) and
``load.png`` under ``--out``. Asserts nothing; a new measurement differs run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

COST = "fixed:0.002"
K = 4
FPS = 16.0
POLICY = "speculative"
CLK_TCK = os.sysconf("SC_CLK_TCK")
KB = 1024  # /proc status sizes are in kB


# ---------------------------------------------------------------- the server process


def _latsim() -> list[str]:
    exe = Path(sys.executable).with_name("latsim")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("latsim")
    if found is None:
        raise SystemExit("latsim is not installed next to this Python (run it from .venv)")
    return [found]


class Server:
    """``latsim serve`` of the sleep generator as a subprocess, on a free port."""

    def __init__(self, cost: str, payload_bytes: int, log_dir: Path,
                 args: tuple[str, ...] = ("--max-sessions", "64",
                                          "--max-pending-per-address", "64")) -> None:
        self.log_path = log_dir / "serve.log"
        self._log = self.log_path.open("w")
        cmd = [*_latsim(), "serve", "--generator", "sleep", "--cost", cost, "--K", str(K),
               "--port", "0", *args, "--generator-option", f"payload_bytes={payload_bytes}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("LATSIM_FAULT", None)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.port: int | None = None
        self.lead: float | None = None
        listening = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                lead = re.match(r"K=\d+: lead ([0-9.]+) s", line)
                if lead:
                    self.lead = float(lead.group(1))
                port = re.search(r"on ws://[^ ]+:(\d+) ", line)
                if port:
                    self.port = int(port.group(1))
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        if not listening.wait(120) or self.port is None:
            self.stop()
            raise SystemExit(f"latsim serve did not start: {' / '.join(self.lines)}; "
                             f"{self.log_path.read_text()[-500:]}")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime

    def status(self) -> dict[str, int]:
        values = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads"):
                    values[key] = int(value.split()[0])
        return values

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log_counts(self) -> dict[str, int]:
        """Lines of the server's log: viewers told they lag, sessions dropped for it, and
        other refusals, failures and errors (its closing summary line aside)."""
        lines = [line for line in self.log_path.read_text().splitlines()
                 if not line.startswith("latsim serve: stopped")]
        return {"log_lagging": sum("is lagging" in line for line in lines),
                "log_fell_behind": sum("fell behind" in line for line in lines),
                "log_warnings": sum(any(word in line.lower() for word in
                                        ("refused", "failed", "error")) for line in lines)}


# ---------------------------------------------------------------- one viewer


@dataclass
class Viewer:
    """What one session's viewer saw (times on the shared monotonic clock)."""

    index: int
    session: str | None = None
    start: float = math.nan  # server time of stream time 0
    delta: float = math.nan
    lead: float = math.nan
    offset: float = math.nan  # the min-RTT estimate of server − client (truth: 0)
    rtt: float = math.nan
    ready_at: float = math.nan
    end_at: float = math.nan
    status: str = "no session"
    server_summary: dict | None = None
    slots: list[tuple[int, float, float, float]] = field(default_factory=list)
    jobs: list[tuple[str, float, float, float]] = field(default_factory=list)
    sent: dict[int, float] = field(default_factory=dict)  # cid -> client time sent
    versions: dict[int, int] = field(default_factory=dict)  # cid -> version
    first_shown: dict[int, int] = field(default_factory=dict)  # version -> slot position
    errors: list[str] = field(default_factory=list)


async def _viewer(url: str, viewer: Viewer, delay: float, duration: float,
                  times: list[float], lead: float | None) -> None:
    from websockets.asyncio.client import connect

    from harness.net.wire import (
        FROM_SERVER,
        Ack,
        Condition,
        End,
        Error,
        Hello,
        JobDone,
        Probe,
        ProbeReply,
        Ready,
        decode_slot,
        parse_message,
    )

    clock = time.perf_counter
    await asyncio.sleep(delay)
    async with connect(url, max_size=1 << 26, compression=None, open_timeout=60) as ws:
        best = None
        for _ in range(4):  # the clock check: on loopback the offset is 0 within rtt / 2
            t0 = clock()
            await ws.send(Probe(t0).to_json())
            reply = parse_message(await ws.recv(), FROM_SERVER)
            t3 = clock()
            assert isinstance(reply, ProbeReply)
            rtt = (t3 - t0) - (reply.t2 - reply.t1)
            if best is None or rtt < best[0]:
                best = (rtt, ((reply.t1 - t0) + (reply.t2 - t3)) / 2)
        viewer.rtt, viewer.offset = best
        await ws.send(Hello(K=K, duration=duration, policy=POLICY, lead=lead,
                            fps=FPS).to_json())
        injector = None

        async def inject(session: str, start: float) -> None:
            for cid, t in enumerate(times):
                wait = start + t - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                viewer.sent[cid] = clock()
                await ws.send(Condition(cid, viewer.sent[cid], session).to_json())

        try:
            async for raw in ws:
                now = clock()
                if isinstance(raw, bytes):
                    header, _ = decode_slot(raw)
                    viewer.slots.append((header.position, header.played, header.sent, now))
                    for info in header.resolves:
                        viewer.first_shown.setdefault(int(info["version"]), header.position)
                    continue
                message = parse_message(raw, FROM_SERVER)
                if isinstance(message, Ready):
                    viewer.session, viewer.start = message.session, message.start
                    viewer.delta, viewer.lead, viewer.ready_at = (message.delta, message.lead,
                                                                  now)
                    injector = asyncio.create_task(inject(message.session, message.start))
                elif isinstance(message, Ack):
                    viewer.versions[message.cid] = message.version
                elif isinstance(message, JobDone):
                    if message.kind != "prebuffer" and message.gen_start is not None:
                        viewer.jobs.append((message.kind, message.start, message.gen_start,
                                            message.gen_end))
                elif isinstance(message, Error):
                    viewer.errors.append(message.error)
                    if viewer.session is None:
                        viewer.status = f"refused: {message.error}"
                        return
                elif isinstance(message, End):
                    viewer.status, viewer.end_at = message.status, now
                    viewer.server_summary = message.summary
                    return
        finally:
            if injector is not None:
                injector.cancel()


# ---------------------------------------------------------------- one session count


def _quantile(values: list[float] | np.ndarray, q: float) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if values.size else math.nan


def _viewer_stats(v: Viewer, duration: float, playout_delay: float) -> dict:
    """One session's stalls and latencies on its stream time (offset 0: one clock)."""
    from latsim.controller.playout import ClientPlayout
    from latsim.run.stream import window_overlap

    if v.session is None:
        return {"session": None, "status": v.status}
    playout = ClientPlayout(playout_delay)
    server_stall = client_stall = 0.0
    last = None
    shown: dict[int, float] = {}
    for position, played, _sent, received in v.slots:
        p, arrives = played - v.start, received - v.start
        if last is not None and p - last > v.delta + 1e-6:
            server_stall += window_overlap(last + v.delta, p, duration)
        last = p
        placed = playout.show(p, arrives)
        if placed.stalled:
            client_stall += window_overlap(placed.due, placed.shown, duration)
        shown.setdefault(position, placed.shown)
    L = []  # the project's name for latency
    for cid, sent in v.sent.items():
        position = v.first_shown.get(v.versions.get(cid, -1))
        if position is not None and position in shown:
            L.append(shown[position] - (sent - v.start))
    summary = v.server_summary or {}
    return {"session": v.session, "status": v.status, "slots": len(v.slots),
            "server_stall_pct": 100 * server_stall / duration,
            "viewer_stall_pct": 100 * (server_stall + client_stall) / duration,
            "server_reported_stall_pct": summary.get("stall_pct"),
            "send_lag_max_ms": 1e3 * max((s - p for _, p, s, _ in v.slots), default=math.nan),
            "conditions": len(v.sent), "shown": len(L),
            "L50_s": _quantile(L, 0.5), "offset_ms": 1e3 * v.offset, "rtt_ms": 1e3 * v.rtt,
            "lead_s": v.lead, "errors": len(v.errors)}


async def _measure(server: Server, n: int, duration: float, ramp: float, conditions: int,
                   seed: int, lead: float | None) -> tuple[list[Viewer], dict]:
    url = f"ws://127.0.0.1:{server.port}"
    rng = np.random.default_rng(seed + n)
    viewers = [Viewer(i) for i in range(n)]
    delays = np.sort(rng.uniform(0, ramp, n)) if n > 1 else np.zeros(1)
    schedules = [sorted(rng.uniform(1.0, duration - 4.0, conditions).tolist())
                 for _ in range(n)]
    samples: list[tuple[float, float, int]] = []  # (wall, server cpu s, threads)
    own: list[tuple[float, float]] = []  # (wall, this process's cpu s)
    total: list[tuple[float, float]] = []  # (wall, the machine's busy cpu s)
    loop_lag: list[float] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            now = time.perf_counter()
            samples.append((now, server.cpu_seconds(), server.status()["Threads"]))
            own.append((now, time.process_time()))
            total.append((now, _machine_busy()))
            await asyncio.sleep(0.25)

    async def lag() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            loop_lag.append(time.perf_counter() - t - 0.005)

    idle = server.status()
    tasks = [asyncio.create_task(sample()), asyncio.create_task(lag())]
    runs = [asyncio.create_task(asyncio.wait_for(
        _viewer(url, v, float(d), duration, times, lead), duration + ramp + 60))
        for v, d, times in zip(viewers, delays, schedules, strict=True)]
    outcomes = await asyncio.gather(*runs, return_exceptions=True)
    for v, outcome in zip(viewers, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            v.status = f"client: {type(outcome).__name__}: {outcome}"[:200]
    done.set()
    await asyncio.gather(*tasks)
    peak = server.status()
    return viewers, {"idle": idle, "peak": peak, "samples": samples, "own": own,
                     "total": total, "loop_lag": loop_lag, "load": os.getloadavg()[0]}


def _machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (``/proc/stat``: all but idle and
    iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def _rate(series: list[tuple[float, float]], t0: float, t1: float) -> float:
    """CPU seconds per wall second of ``series`` (wall, cpu) between ``t0`` and ``t1``."""
    inside = [s for s in series if t0 <= s[0] <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return math.nan
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _peak_rate(series: list[tuple[float, float]], t0: float, t1: float,
               width: float = 1.0) -> float:
    inside = [s for s in series if t0 <= s[0] <= t1]
    best = math.nan
    for i, (t, c) in enumerate(inside):
        later = [s for s in inside[i:] if s[0] >= t + width]
        if later:
            rate = (later[0][1] - c) / (later[0][0] - t)
            best = rate if math.isnan(best) else max(best, rate)
    return best


def one_run(n: int, options: argparse.Namespace, log_dir: Path, repeat: int) -> dict:
    """One server run with ``n`` sessions: its viewers, their figures and the run's own."""
    server = Server(options.cost, options.payload_bytes, log_dir)
    try:
        viewers, probe = asyncio.run(_measure(server, n, options.duration, options.ramp,
                                              options.conditions,
                                              options.seed + 1000 * repeat, options.lead))
    finally:
        rc = server.stop()
    stats = [{"repeat": repeat, **_viewer_stats(v, options.duration, options.playout_delay)}
             for v in viewers]
    served = [v for v in viewers if v.session is not None]
    ready = [v.ready_at for v in served]
    ends = [v.end_at for v in served if math.isfinite(v.end_at)]
    t0 = max(ready) if ready else math.nan
    t1 = min(ends) if ends else math.nan
    cpu_series = [(t, c) for t, c, _ in probe["samples"]]
    busy = sum(g1 - g0 for v in served for _, _, g0, g1 in v.jobs if t0 <= g0 <= t1)
    steady = t1 - t0 if ready and ends else math.nan
    scalars = {
        "sessions": n, "repeat": repeat, "served": len(served),
        "complete": sum(v.status == "complete" for v in viewers),
        "steady_s": steady,
        "server_cpu": _rate(cpu_series, t0, t1),
        "server_cpu_peak_1s": _peak_rate(cpu_series, t0, t1),
        "server_threads": max(th for _, _, th in probe["samples"]),
        "rss_idle_mib": probe["idle"]["VmRSS"] * KB / 2**20,
        "rss_peak_mib": probe["peak"]["VmHWM"] * KB / 2**20,
        "device_busy_pct": 100 * busy / steady if steady > 0 else math.nan,
        "lead_ms": 1e3 * served[0].lead if served else math.nan,
        "client_cpu": _rate(probe["own"], t0, t1),
        "other_cpu": (_rate(probe["total"], t0, t1) - _rate(cpu_series, t0, t1)
                      - _rate(probe["own"], t0, t1)),
        "load_1min": probe["load"],
        "errors": sum(len(v.errors) for v in viewers), "server_rc": rc,
        **server.log_counts()}
    return {"viewers": served, "stats": stats, "loop_lag": probe["loop_lag"],
            "scalars": scalars}


def combine(n: int, runs: list[dict]) -> dict:
    """The row of ``n`` sessions over its runs: slots, jobs and sessions pooled; CPU, busy
    and load the mean of the runs', threads and the peak resident set the largest."""
    served = [v for r in runs for v in r["viewers"]]
    per = [s for r in runs for s in r["stats"] if s["session"] is not None]
    lags = [1e3 * (s - p) for v in served for _, p, s, _ in v.slots]
    deliver = [1e3 * (r - s) for v in served for _, _, s, r in v.slots]
    dispatch = [1e3 * (g0 - st) for v in served for _, st, g0, _ in v.jobs]

    def over(key: str, how) -> float:
        values = [s[key] for s in per if s.get(key) is not None and math.isfinite(s[key])]
        return float(how(values)) if values else math.nan

    def runs_(key: str, how) -> float:
        values = [r["scalars"][key] for r in runs if math.isfinite(r["scalars"][key])]
        return float(how(values)) if values else math.nan

    L = [s["L50_s"] for s in per]
    return {
        "sessions": n, "runs": len(runs), "served": len(served),
        "complete": sum(r["scalars"]["complete"] for r in runs),
        "server_cpu": runs_("server_cpu", np.mean),
        "server_cpu_peak_1s": runs_("server_cpu_peak_1s", max),
        "server_threads": int(runs_("server_threads", max)),
        "rss_idle_mib": runs_("rss_idle_mib", np.mean),
        "rss_peak_mib": runs_("rss_peak_mib", max),
        "slots": len(lags),
        "send_lag_p50_ms": _quantile(lags, 0.5), "send_lag_p99_ms": _quantile(lags, 0.99),
        "send_lag_max_ms": max(lags, default=math.nan),
        "deliver_p50_ms": _quantile(deliver, 0.5), "deliver_p99_ms": _quantile(deliver, 0.99),
        "server_stall_median_pct": over("server_stall_pct", np.median),
        "server_stall_max_pct": over("server_stall_pct", max),
        "viewer_stall_median_pct": over("viewer_stall_pct", np.median),
        "viewer_stall_max_pct": over("viewer_stall_pct", max),
        "sessions_stalled": sum(s["viewer_stall_pct"] > 0 for s in per),
        "L50_median_s": _quantile(L, 0.5),
        "device_busy_pct": runs_("device_busy_pct", np.mean),
        "jobs": len(dispatch), "dispatch_p99_ms": _quantile(dispatch, 0.99),
        "dispatch_max_ms": max(dispatch, default=math.nan),
        "lead_ms": runs_("lead_ms", np.mean),
        "offset_max_abs_ms": over("offset_ms", lambda v: max(map(abs, v))),
        "client_cpu": runs_("client_cpu", np.mean),
        "client_loop_lag_p99_ms": _quantile([1e3 * x for r in runs for x in r["loop_lag"]],
                                            0.99),
        "other_cpu": runs_("other_cpu", np.mean),
        "load_1min": runs_("load_1min", np.mean),
        "errors": sum(r["scalars"]["errors"] for r in runs),
        "server_rc_max": max(r["scalars"]["server_rc"] or 0 for r in runs),
        **{key: sum(r["scalars"][key] for r in runs)
           for key in ("log_lagging", "log_fell_behind", "log_warnings")},
    }


# ---------------------------------------------------------------- output


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    with contextlib.suppress(OSError, IndexError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    return {"cpu": model, "cores": os.cpu_count(), "memory": mem,
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
            "clients": "every viewer in one process (one asyncio loop) on the same machine "
                       "as the server, which other work may share"}


COLUMNS = [
    ("sessions", "N", "{:d}"), ("runs", "runs", "{:d}"), ("served", "served", "{:d}"),
    ("server_cpu", "cpu s/s", "{:.2f}"), ("server_cpu_peak_1s", "peak", "{:.2f}"),
    ("server_threads", "thr", "{:d}"), ("rss_peak_mib", "HWM MiB", "{:.1f}"),
    ("send_lag_p50_ms", "lag50 ms", "{:.2f}"), ("send_lag_p99_ms", "lag99 ms", "{:.2f}"),
    ("send_lag_max_ms", "lagmax", "{:.1f}"), ("deliver_p99_ms", "dlv99 ms", "{:.2f}"),
    ("server_stall_median_pct", "sstall50%", "{:.3f}"),
    ("server_stall_max_pct", "sstallmax%", "{:.3f}"),
    ("viewer_stall_median_pct", "vstall50%", "{:.3f}"),
    ("viewer_stall_max_pct", "vstallmax%", "{:.3f}"), ("sessions_stalled", "stalled", "{:d}"),
    ("device_busy_pct", "busy%", "{:.1f}"), ("dispatch_p99_ms", "disp99 ms", "{:.2f}"),
    ("client_cpu", "client s/s", "{:.2f}"), ("client_loop_lag_p99_ms", "cloop99", "{:.2f}"),
    ("other_cpu", "other s/s", "{:.2f}"),
]


def table(rows: list[dict]) -> str:
    def cell(fmt: str, value: object) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return "-"
        return fmt.format(value)

    cells = [[title for _, title, _ in COLUMNS]] + [
        [cell(fmt, row[key]) for key, _, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                     for r in cells)


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    return value


def figure(rows: list[dict], setup: dict, path: Path) -> None:
    from matplotlib.ticker import FuncFormatter

    from latsim.viz import style

    plt = style.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=style.GRID_2X2)
    n = [r["sessions"] for r in rows]
    colors = style.SERIES_COLORS
    grey = style.PALETTE["grey"]

    def x_axis(ax) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(v) for v in n])
        ax.minorticks_off()
        ax.margins(x=0.08)
        ax.set_xlabel("sessions on one server", fontsize=style.FONT["label"])

    ax = axes[0][0]
    for key, label, color, marker in (
            ("send_lag_p50_ms", "send lag p50 (sent − played, server clock)", colors[0], "o"),
            ("send_lag_p99_ms", "send lag p99", colors[1], "s"),
            ("send_lag_max_ms", "send lag max", colors[3], "^"),
            ("deliver_p99_ms", "received − sent p99 (at the viewer)", colors[2], "D"),
            ("dispatch_p99_ms", "job dispatch delay p99", colors[4], "v")):
        ax.plot(n, [r[key] for r in rows], marker=marker, color=color, label=label)
    ax.axhline(1e3 * setup["playout_delay_s"], color=grey, ls="--", lw=1,
               label=f"playout delay D = {1e3 * setup['playout_delay_s']:g} ms")
    leads = [r["lead_ms"] for r in rows if math.isfinite(r["lead_ms"])]
    if leads:
        ax.axhline(leads[0], color=grey, ls=":", lw=1,
                   label=f"the sessions' lead = {leads[0]:.1f} ms")
    ax.set_yscale("log")
    ax.set_ylim(0.05, 2000)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("ms (log scale)", fontsize=style.FONT["label"])
    style.title(ax, "How late slots leave the server, and arrive")
    x_axis(ax)
    style.style_axes(ax, legend=True, loc="upper left", ncol=2)

    ax = axes[0][1]
    for key, label, color, marker, ls, hollow in (
            ("server_stall_median_pct", "server stall, median session", colors[0], "o", "-",
             True),
            ("server_stall_max_pct", "server stall, worst session", colors[0], "s", "--",
             True),
            ("viewer_stall_median_pct", "viewer stall (server + client), median session",
             colors[1], "o", "-", False),
            ("viewer_stall_max_pct", "viewer stall, worst session", colors[1], "s", "--",
             False)):
        marks = {"mfc": "none", "mew": 1.5, "ms": 10} if hollow else {"ms": 5}
        ax.plot(n, [r[key] for r in rows], marker=marker, color=color, ls=ls, label=label,
                **marks)
    for x, r in zip(n, rows, strict=True):
        ax.annotate(f"{r['sessions_stalled']}/{r['served']} sessions\nstalled at all",
                    (x, r["viewer_stall_max_pct"]), textcoords="offset points",
                    xytext=(0, 10), ha="center", fontsize=style.FONT["note"],
                    color=style.PALETTE["note"])
    ax.set_ylabel("stall, % of the session window", fontsize=style.FONT["label"])
    ax.set_ylim(bottom=0, top=max(0.25, 1.6 * max(r["viewer_stall_max_pct"] for r in rows)))
    style.title(ax, "Stall per session")
    x_axis(ax)
    style.style_axes(ax, legend=True, loc="upper left")

    ax = axes[1][0]
    ax.plot(n, [r["server_cpu"] for r in rows], marker="o", color=colors[0],
            label="server, all sessions on (mean)")
    ax.plot(n, [r["server_cpu_peak_1s"] for r in rows], marker="s", ls="--", color=colors[0],
            label="server, busiest 1 s")
    ax.plot(n, [r["client_cpu"] for r in rows], marker="^", color=colors[2],
            label="the viewers' process (same machine)")
    ax.plot(n, [r["other_cpu"] for r in rows], marker="x", color=grey,
            label="everything else on the machine")
    cores = setup["machine"]["cores"] or 1
    ax.axhline(1.0, color=grey, ls=":", lw=1, label="one core")
    if cores > 1:
        ax.axhline(cores, color=grey, ls="--", lw=1, label=f"the machine ({cores} cores)")
    ax.set_ylabel("CPU seconds per wall second", fontsize=style.FONT["label"])
    highest = max(max(r["server_cpu_peak_1s"], r["other_cpu"], r["client_cpu"]) for r in rows
                  if math.isfinite(r["other_cpu"]))
    ax.set_ylim(bottom=0, top=1.35 * max(cores, highest))
    style.title(ax, "CPU")
    x_axis(ax)
    style.style_axes(ax, legend=True, loc="upper left", ncol=2)

    ax = axes[1][1]
    ax.plot(n, [r["rss_peak_mib"] for r in rows], marker="o", color=colors[4],
            label="server's peak resident set (VmHWM)")
    ax.plot(n, [r["rss_idle_mib"] for r in rows], marker="s", ls="--", color=colors[7],
            label="server's resident set, warmed up, no session")
    for x, r in zip(n, rows, strict=True):
        ax.annotate(f"{r['server_threads']} threads", (x, r["rss_peak_mib"]),
                    textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=style.FONT["note"], color=style.PALETTE["note"])
    ax.set_ylabel("MiB", fontsize=style.FONT["label"])
    ax.set_ylim(bottom=0, top=1.2 * max(r["rss_peak_mib"] for r in rows))
    style.title(ax, "Server memory (and its most threads)")
    x_axis(ax)
    style.style_axes(ax, legend=True, loc="lower right")

    m = setup["machine"]
    fig.suptitle(
        f"latsim serve under load: sleep generator {setup['cost']}, K = {K}, {FPS:g} fps, "
        f"{setup['duration_s']:g} s sessions, {setup['conditions']} conditions each, "
        f"D = {setup['playout_delay_s']:g} s; {setup['repeats']} server runs per count, "
        f"pooled\n{m['cores']}-core {m['cpu']} machine, shared with other work; the "
        "viewers ran in one process on the same machine", fontsize=style.FONT["suptitle"])
    fig.tight_layout()
    style.save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--duration", type=float, default=20.0, help="session window (s)")
    parser.add_argument("--out", type=Path, default=Path("results/serve/load"))
    parser.add_argument("--cost", default=COST, help="the sleep generator's job time")
    parser.add_argument("--conditions", type=int, default=4, help="conditions per session")
    parser.add_argument("--ramp", type=float, default=2.0,
                        help="sessions start spread over this many seconds")
    parser.add_argument("--playout-delay", type=float, default=0.1, help="viewer's D (s)")
    parser.add_argument("--payload-bytes", type=int, default=64,
                        help="a slot's payload (the sleep generator's payload_bytes)")
    parser.add_argument("--lead", type=float, default=None,
                        help="the lead the viewers ask for in hello (s); default: the "
                        "server's (its warm-up's)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="server runs per session count (interleaved), pooled")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    if not all(1 <= n <= 64 for n in options.sessions):
        parser.error("--sessions: 1 to 64 each (latsim serve's --max-sessions range)")
    if options.duration < 6:
        parser.error("--duration: at least 6 s")
    setup = {"cost": options.cost, "K": K, "fps": FPS, "policy": POLICY,
             "duration_s": options.duration, "conditions": options.conditions,
             "ramp_s": options.ramp, "playout_delay_s": options.playout_delay,
             "payload_bytes": options.payload_bytes, "seed": options.seed,
             "repeats": options.repeats,
             "lead_s": options.lead if options.lead is not None else "the server's",
             "schedule": "fifo", "machine": machine(),
             "command": "latsim serve --generator sleep --cost " + options.cost
                        + f" --K {K} --port 0 --max-sessions 64 --max-pending-per-address"
                        " 64 --generator-option "
                        f"payload_bytes={options.payload_bytes}"}
    m = setup["machine"]
    print(f"machine: {m['cores']} cores, {m['cpu']}, {m['memory']}, {m['system']}, load "
          f"{m['load_average_before']}; viewers in this process, same machine", flush=True)
    results: dict[int, list[dict]] = {n: [] for n in options.sessions}
    with tempfile.TemporaryDirectory(prefix="latsim-load-") as tmp:
        for repeat in range(options.repeats):  # interleaved: the machine's load spreads
            for n in options.sessions:
                started = time.perf_counter()
                run = one_run(n, options, Path(tmp), repeat)
                results[n].append(run)
                sc = run["scalars"]
                print(f"{n} sessions, run {repeat + 1}: {time.perf_counter() - started:.0f} s, "
                      f"{sc['complete']}/{n} complete, errors {sc['errors']}, server exit "
                      f"{sc['server_rc']}, server cpu {sc['server_cpu']:.2f} s/s, others "
                      f"{sc['other_cpu']:.2f} s/s", flush=True)
    rows = [combine(n, results[n]) for n in options.sessions]
    per_run = [{k: _rounded(v) for k, v in run["scalars"].items()}
               for n in options.sessions for run in results[n]]
    sessions = {str(n): [{k: _rounded(v) for k, v in s.items()}
                         for run in results[n] for s in run["stats"]]
                for n in options.sessions}
    setup["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(table(rows))
    options.out.mkdir(parents=True, exist_ok=True)
    with (options.out / "load.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if (v := _rounded(row[k])) is None else v) for k in row})
    (options.out / "load.json").write_text(json.dumps(
        {"setup": setup, "rows": [{k: _rounded(v) for k, v in r.items()} for r in rows],
         "runs": per_run, "sessions": sessions}, indent=1) + "\n")
    figure(rows, setup, options.out / "load.png")
    print(f"wrote {options.out}/load.csv, load.json, load.png")


if __name__ == "__main__":
    main()
