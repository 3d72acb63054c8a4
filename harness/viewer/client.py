"""``latsim client``: a viewer that measures L end to end against ``latsim serve``.

It connects, aligns its clock with the server's by the minimum-RTT method
(:mod:`harness.net.netclock`: a burst of probes before the session, one probe every
``probe_every`` seconds during it; the offset of the probe with the smallest round trip is
the estimate, ``rtt_min / 2`` its bound, the drift a fit over the run's probes), starts a
session, sends the trace's conditions at their times on its own clock, and plays what the
server streams through the playout rule of the serving model
(:class:`latsim.controller.playout.ClientPlayout`, delay D): a slot the server played at
``p`` (server clock, minus the offset) is due at ``p + D`` plus any earlier shift, and shows
when it arrives if that is later (a client stall). Each slot's display is a timer on the
client's clock; its actual time is recorded beside the scheduled one.

What it sends is shaped (a seeded :class:`~harness.net.netclock.Shaper`: the uplink), and it
asks the server to shape the downlink the same way unless told otherwise. The offset used
for the run is the one estimated before the session starts, so the playout and every
converted server time agree; the final estimate and the drift are reported beside it.

The run folder (:mod:`latsim.run.viewer`) is written when the session ends, when the
connection is lost or the server ends it early (``status`` ``interrupted``, what was
measured kept), when the server fails it (``failed``, with the server's reason) or on
Ctrl-C.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.net.netclock import Probe as ClockProbe
from harness.net.netclock import Shaper, estimate_drift, estimate_offset
from harness.net.wire import (
    FROM_SERVER,
    Ack,
    Condition,
    End,
    Error,
    Hello,
    JobDone,
    Message,
    Probe,
    ProbeReply,
    Ready,
    Shape,
    decode_slot,
    parse_message,
)
from latsim.analysis.serving import viewer_metrics
from latsim.controller.playout import ClientPlayout
from latsim.errors import LatsimError, check_option
from latsim.model.traces import Trace, write_trace
from latsim.run.folder import (
    CLIENT_FORMAT_VERSION,
    FAILED,
    RUNNING,
    claim_folder,
    of_kind,
    write_json,
)
from latsim.run.record_files import write_csv
from latsim.run.stream import COMPLETE, INTERRUPTED
from latsim.run.viewer import (
    CLIENT_FILES,
    KIND,
    TABLES,
    ProbeRow,
    ViewerCondition,
    ViewerJob,
    ViewerRecords,
    ViewerSlot,
    ViewerStall,
    condition_row,
    table_keys,
    write_viewer_records,
)

NAN = math.nan
log = logging.getLogger("latsim.client")


def retry_after(status: int, headers) -> float | None:
    """The seconds a refusal asks the client to wait before it tries again: a 429's (or
    503's) ``Retry-After`` in whole seconds (RFC 9110; its date form, or anything else,
    is ignored), else None."""
    if status not in (429, 503):
        return None
    value = str(headers.get("Retry-After", "")).strip()
    if not value.isascii() or not value.isdigit() or len(value) > 6:
        return None
    return float(value)


def redacted(url: str) -> str:
    """``url`` with the secrets a user may put in it replaced by ``***``: the value of a
    ``token`` query parameter (the server's ``--token``, as the browser page takes it) and
    a password before the host. Never stored or echoed as given."""
    import re

    base, sep, query = url.partition("?")
    base = re.sub(r"//([^/@]*?):[^/@]*@", r"//\1:***@", base)
    query = re.sub(r"(^|[&;])(token=)[^&;#]*", r"\1\2***", query)
    return base + sep + query


@dataclass(frozen=True)
class ClientConfig:
    """One viewer session."""

    url: str
    trace: Trace
    out: Path
    K: int = 4
    policy: str = "speculative"
    duration: float | None = None  # default: the trace's
    lead: float | None = None  # default: the server's (from its warm-up)
    drain: float | None = None
    playout_delay: float = 0.1  # D (s)
    r: int = 4
    fps: float = 16.0
    uplink: Shaper = field(default_factory=Shaper)
    downlink: Shaper | None = None  # None: the same as the uplink
    seed: int = 0
    probes: int = 16  # before the session
    probe_every: float = 0.5  # during it (s)
    connect_timeout: float = 10.0
    token: str | None = None  # the server's --token, sent as Authorization: Bearer
    end_timeout: float = 60.0  # how long past the window (+ drain) to wait for ``end``

    @property
    def shown_url(self) -> str:
        """:attr:`url` as it may be written or shown: a ``token`` in its query and a
        password in it are replaced by ``***`` (:func:`redacted`)."""
        return redacted(self.url)

    def __post_init__(self) -> None:
        if not self.url.startswith(("ws://", "wss://")):
            raise LatsimError(f"the server URL must start with ws:// or wss://, got "
                              f"{self.shown_url!r}")
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(self.url)
            port = parts.port  # parsed here: a bad one raises
        except ValueError as exc:
            raise LatsimError(f"the server URL {self.shown_url[:80]!r} is not valid: "
                              f"{exc}") from None
        if not parts.hostname:
            raise LatsimError(f"the server URL {self.shown_url[:80]!r} names no host")
        if port == 0:
            raise LatsimError(f"the server URL {self.shown_url[:80]!r} has port 0")
        for option, value in (("--K", self.K), ("--playout-delay", self.playout_delay),
                              ("--probes", self.probes), ("--probe-every", self.probe_every),
                              ("--connect-timeout", self.connect_timeout),
                              ("--duration", self.duration), ("--seed", self.seed)):
            check_option(option, value)

    @property
    def window(self) -> float:
        return float(self.duration or self.trace.duration or 60.0)


@dataclass
class _Pending:
    """What the client knows of one condition so far."""

    cid: int
    sent: float  # client perf time
    version: int = 0
    arrival: float = NAN  # server clock
    refused: bool = False


def _probe_row(p: ClockProbe) -> ProbeRow:
    return ProbeRow(p.t0, p.t1, p.t2, p.t3, p.rtt, p.offset)


class _RowLog:
    """The run folder's record CSVs, appended row by row as each row is final (each write
    closes its file, so the row is on disk), so a client killed with SIGKILL leaves every
    row up to the kill (the folder reads as ``incomplete``: its ``config.json`` still says
    ``running``). The client rewrites the tables whole when it stops, ordered and with the
    rows only the end decides (conditions lost, refused or censored)."""

    def __init__(self, out: Path, config: dict) -> None:
        self._out = out
        self._keys = {table: table_keys(table, config) for table in TABLES}
        for table, record_type in TABLES.items():
            write_csv(out / f"{table}.csv", record_type, (), extra=self._keys[table])

    def add(self, table: str, row: object) -> None:
        write_csv(self._out / f"{table}.csv", TABLES[table], (row,), extra=self._keys[table],
                  append=True)


class _Client:
    def __init__(self, config: ClientConfig,
                 progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.progress = progress
        self.clock = time.perf_counter
        self.probes: list[ClockProbe] = []
        self.offset = 0.0  # server minus client, the run's estimate
        self.origin = 0.0  # client perf time of stream time 0
        self.ready: Ready | None = None
        self.end: End | None = None
        self.stop_reason = ""
        self.conditions: list[_Pending] = []
        self.resolves: dict[int, tuple[dict, int]] = {}  # version -> (server info, position)
        self.slots: list[ViewerSlot] = []
        self.displayed: dict[int, float] = {}  # position -> client perf time it showed
        self.jobs: list[ViewerJob] = []
        self.errors: list[str] = []
        self.playout = ClientPlayout(config.playout_delay)
        self.last_played: float | None = None
        self.stalls: list[ViewerStall] = []
        self.bytes = 0
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self.uplink = config.uplink.channel(np.random.default_rng(config.seed))
        self.estimate = None  # the run's OffsetEstimate, once the first probes are back
        self._early: list[tuple[bytes, float]] = []
        self.rows: _RowLog | None = None  # open from ready (stream time is known) on
        self._resolved_at: dict[int, list[int]] = {}  # position -> versions it showed first

    # ------------------------------------------------------------ sending

    def send(self, message: Message) -> None:
        """Queue a message; it leaves now (its shaped delay applies from now)."""
        self._outbox.put_nowait((message.to_json(), self.clock()))

    async def _sender(self, websocket) -> None:
        while True:
            text, sent = await self._outbox.get()
            arrives = self.uplink.deliver_at(sent)
            if arrives is None:
                continue  # lost on the shaped network
            wait = arrives - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            await websocket.send(text)

    def probe(self) -> None:
        self.send(Probe(self.clock()))

    # ------------------------------------------------------------ receiving

    def stream_time(self, perf: float) -> float:
        return perf - self.origin

    def from_server(self, server_time: float) -> float:
        """A server time in stream time on the client's clock."""
        return server_time - self.offset - self.origin

    async def _receiver(self, websocket) -> None:
        async for raw in websocket:
            now = self.clock()
            if isinstance(raw, bytes):
                if self.ready:
                    self._slot(raw, now)
                else:  # a frame before ready breaks the protocol's order: keep it for later
                    self._early.append((raw, now))
                continue
            message = parse_message(raw, FROM_SERVER)
            if isinstance(message, ProbeReply):
                self.probes.append(ClockProbe(message.t0, message.t1, message.t2, now))
                self._log("probes", _probe_row(self.probes[-1]))
            elif isinstance(message, Ready):  # the offset is known: stream time starts now
                self.origin = message.start - self.offset
                self.ready = message
                try:
                    # a folder killed from now on says what its session was (still running)
                    config_path = self.config.out / "config.json"
                    folder_config = {**json.loads(config_path.read_text()),
                                     **self.session_fields()}
                    self.rows = _RowLog(self.config.out, folder_config)
                    write_json(config_path, folder_config)
                except OSError as exc:
                    raise LatsimError(f"cannot write {self.config.out}: "
                                      f"{exc.strerror or exc}") from None
                for probe in self.probes:
                    self._log("probes", _probe_row(probe))
                for early, received in self._early:
                    self._slot(early, received)
                self._early.clear()
                self._ready.set()
            elif isinstance(message, Ack):
                pending = self.conditions[message.cid]
                pending.version = message.version
                pending.arrival = message.arrival
            elif isinstance(message, JobDone):
                gen_start, gen_end = message.gen_start, message.gen_end
                self.jobs.append(ViewerJob(  # the server's times, converted
                    message.job_id, message.kind, message.branch, message.length,
                    message.version, self.from_server(message.start),
                    self.from_server(message.ready),
                    NAN if gen_start is None else self.from_server(gen_start),
                    NAN if gen_end is None else self.from_server(gen_end)))
                self._log("jobs", self.jobs[-1])
            elif isinstance(message, Error):
                self.errors.append(message.error)
                cid = message.cid  # set where the server refused a condition
                if cid is not None and cid < len(self.conditions):
                    self.conditions[cid].refused = True
                if not self._ready.is_set():
                    self._ready.set()  # a refused hello: the caller raises
            elif isinstance(message, End):
                self.end = message
                self._ended.set()

    def _slot(self, data: bytes, received: float) -> None:
        header, payload = decode_slot(data)
        self.bytes += len(payload)
        played = self.from_server(header.played)
        arrives = self.stream_time(received)
        assert self.ready is not None
        delta = self.ready.delta
        position = header.position
        if self.last_played is not None and played - self.last_played > delta + 1e-6:
            self.stalls.append(ViewerStall("server", position, self.last_played + delta,
                                           played))  # a gap between played slots
            self._log("stalls", self.stalls[-1])
        self.last_played = played
        placed = self.playout.show(played, arrives)
        if placed.stalled:
            self.stalls.append(ViewerStall("client", position, placed.due, placed.shown))
            self._log("stalls", self.stalls[-1])
        self.slots.append(ViewerSlot(
            position, header.version, header.job_id, played, self.from_server(header.sent),
            arrives, placed.due, placed.shown, NAN, len(payload), header.payload))
        for info in header.resolves:
            self.resolves[int(info["version"])] = (info, position)
            self._resolved_at.setdefault(position, []).append(int(info["version"]))
        loop = asyncio.get_running_loop()
        delay = max(0.0, placed.shown + self.origin - self.clock())
        loop.call_later(delay, self._display, position)

    def _display(self, position: int) -> None:
        self.displayed[position] = self.clock()
        if self.rows is None:
            return
        slot = self._slot_at(position)
        if slot is not None:
            self._log("slots", self._slot_row(slot))
        for version in self._resolved_at.pop(position, ()):  # conditions now shown
            for pending in self.conditions:
                if pending.version == version:
                    self._log("conditions", self._condition_row(pending))

    def session_fields(self) -> dict:
        """What ``config.json`` says of the session once it is ready: the server's answer
        and the clock offset the stream times use."""
        ready = self.ready.to_dict() if self.ready is not None else {}
        first = self.estimate
        return {"session": ready.get("session"), "T": ready.get("T"),
                "delta": ready.get("delta"), "lead": ready.get("lead"),
                "lead_source": ready.get("lead_source"), "bind": ready.get("bind"),
                "schedule": ready.get("schedule"),
                "generator": ready.get("generator"), "server_run": ready.get("server_run"),
                "server_start": ready.get("start"), "server_downlink": ready.get("downlink"),
                "drain": self.config.drain, "offset": self.offset,
                "offset_uncertainty": None if first is None else first.uncertainty}

    def _log(self, table: str, row: object) -> None:
        if self.rows is not None:
            try:
                self.rows.add(table, row)
            except OSError as exc:  # a full disk: the rest is written at the end, or fails
                log.warning("cannot append to %s.csv: %s", table, exc)
                self.rows = None

    def _slot_at(self, position: int) -> ViewerSlot | None:
        for slot in reversed(self.slots):  # displayed soon after it arrived: near the end
            if slot.position == position:
                return slot
        return None

    # ------------------------------------------------------------ the session

    async def run(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        config = self.config
        headers = ({} if config.token is None
                   else {"Authorization": f"Bearer {config.token}"})
        deadline = time.monotonic() + config.connect_timeout
        while True:
            try:
                websocket = await asyncio.wait_for(
                    connect(config.url, max_size=1 << 28, compression=None,
                            open_timeout=None, additional_headers=headers),
                    max(0.0, deadline - time.monotonic()))
                break
            except InvalidStatus as exc:
                wait = retry_after(exc.response.status_code, exc.response.headers)
                if wait is not None and time.monotonic() + wait < deadline:
                    # its address is refused for a while (others' wrong tokens, or this
                    # viewer's earlier ones): the token is compared after that
                    log.warning("%s: HTTP 429, retrying in %g s", config.shown_url, wait)
                    await asyncio.sleep(wait)
                    continue
                raise LatsimError(
                    f"{config.shown_url} refused the connection: HTTP "
                    f"{exc.response.status_code} "
                    + (f"(retry after {wait:g} s, past --connect-timeout)" if wait is not None
                       else "(a --token it accepts?)")) from None
            except (OSError, TimeoutError) as exc:
                reason = str(exc) or f"no answer within {config.connect_timeout:g} s"
                raise LatsimError(f"cannot connect to {config.shown_url}: {reason}") from None
        tasks = [asyncio.create_task(self._sender(websocket)),
                 asyncio.create_task(self._receiver(websocket))]
        try:
            await self._session(websocket, tasks)
        finally:
            for task in tasks:
                task.cancel()
            await websocket.close()

    async def _session(self, websocket, tasks: list[asyncio.Task]) -> None:
        config = self.config
        receiver = tasks[1]
        downlink = config.downlink or config.uplink
        self.send(Shape(downlink.delay, downlink.jitter, downlink.loss,
                        (config.seed + 1) % 2**32))
        for _ in range(config.probes):
            self.probe()
            await asyncio.sleep(0.01)
        deadline = self.clock() + 2.0
        while len(self.probes) < config.probes and self.clock() < deadline:
            if receiver.done():
                break
            await asyncio.sleep(0.005)
        if not self.probes:
            raise LatsimError(f"{config.shown_url}: no clock probe came back")
        self.estimate = estimate_offset(self.probes)
        self.offset = self.estimate.offset
        self.send(Hello(config.K, config.window, config.policy, config.lead, config.drain,
                        config.r, config.fps))
        ready = asyncio.create_task(self._ready.wait())
        tasks.append(ready)  # cancelled with the others if the receiver ends first
        await asyncio.wait([ready, receiver], timeout=config.connect_timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        if not self.ready:
            why = self.errors[-1] if self.errors else "no answer to hello"
            raise LatsimError(f"{config.shown_url} refused the session: {why}")
        injector = asyncio.create_task(self._inject())
        prober = asyncio.create_task(self._probe_loop())
        tasks += [injector, prober]
        drain = float(config.drain) if config.drain is not None else 10 * self.ready.T
        limit = config.window + drain + config.end_timeout
        ended = asyncio.create_task(self._ended.wait())
        tasks.append(ended)
        await asyncio.wait([ended, receiver], timeout=max(
            0.0, self.origin + limit - self.clock()), return_when=asyncio.FIRST_COMPLETED)
        if self.end is None:
            if receiver.done() and receiver.exception() is not None:
                self.stop_reason = f"connection lost: {receiver.exception()}"
            elif receiver.done():
                self.stop_reason = "connection closed by the server before the session ended"
            else:
                self.stop_reason = f"no end from the server {limit:g} s after the start"
        # let the scheduled displays run
        last = max((s.t_shown for s in self.slots), default=0.0) + self.origin
        await asyncio.sleep(min(max(0.0, last - self.clock()), 2 * config.playout_delay + 5)
                            + 0.01)

    async def _inject(self) -> None:
        for cid, t in enumerate(t for t in self.config.trace.times if t < self.config.window):
            wait = self.origin + t - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            sent = self.clock()
            self.conditions.append(_Pending(cid, sent))
            self.send(Condition(cid, sent, self.ready.session if self.ready else None))

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_every)
            self.probe()
            if self.progress is not None:
                shown = len(self.resolves)
                client_stalls = sum(s.side == "client" for s in self.stalls)
                self.progress(
                    f"[{self.ready.session if self.ready else '-'}] "
                    f"{self.stream_time(self.clock()):6.1f}/"
                    f"{self.config.window:g} s  conditions sent {len(self.conditions)}, "
                    f"shown {shown}  slots {len(self.slots)}  client stalls {client_stalls}  "
                    f"offset {self.offset:+.4f} s")

    # ------------------------------------------------------------ records

    def records(self) -> ViewerRecords:
        conditions = tuple(self._condition_row(pending) for pending in self.conditions)
        slots = tuple(self._slot_row(s) for s in self.slots)
        probes = tuple(_probe_row(p) for p in self.probes)
        return ViewerRecords(conditions, slots, tuple(self.stalls), tuple(self.jobs), probes)

    def _condition_row(self, pending: _Pending) -> ViewerCondition:
        sent = self.stream_time(pending.sent)
        arrival = NAN if math.isnan(pending.arrival) else self.from_server(pending.arrival)
        resolved = self.resolves.get(pending.version) if pending.version else None
        if resolved is None:
            status = "refused" if pending.refused else "censored" if pending.version else "lost"
            return condition_row(pending.cid, pending.version, sent, arrival, status)
        info, position = resolved
        slot = self._slot_at(position)
        assert slot is not None
        shown_at = self.displayed.get(position)
        displayed = NAN if shown_at is None else self.stream_time(shown_at)
        return condition_row(
            pending.cid, pending.version, sent, arrival,
            "shown" if shown_at is not None else "censored", slot,
            self.from_server(info["start"]), self.from_server(info["ready"]), displayed)

    def _slot_row(self, s: ViewerSlot) -> ViewerSlot:
        displayed = (self.stream_time(self.displayed[s.position])
                     if s.position in self.displayed else NAN)
        return replace(s, t_displayed=displayed)


def run_client(config: ClientConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Run one viewer session and write its run folder; returns the summary. Ctrl-C ends
    the session early (the folder is written, marked ``interrupted``, and the
    ``KeyboardInterrupt`` propagates)."""
    out = config.out
    claim_folder(out, CLIENT_FILES, "config.json", "latsim client", of_kind(KIND))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LatsimError(f"cannot write {out}: {exc.strerror or exc}") from None
    started = _dt.datetime.now().isoformat(timespec="seconds")
    base = {"format_version": CLIENT_FORMAT_VERSION, "kind": KIND, "status": RUNNING,
            "url": config.shown_url, "K": config.K, "policy": config.policy,
            "duration": config.window, "playout_delay": config.playout_delay,
            "r": config.r, "fps": config.fps, "seed": config.seed,
            "uplink": asdict(config.uplink),
            "downlink": asdict(config.downlink or config.uplink),
            "trace_name": config.trace.name, "trace_copy": "trace.jsonl",
            "started_at": started}
    write_json(out / "config.json", base)
    client = _Client(config, progress)
    interrupted: BaseException | None = None
    try:
        asyncio.run(client.run())
    except KeyboardInterrupt as exc:
        interrupted = exc
        client.stop_reason = "KeyboardInterrupt"
    except LatsimError:
        write_json(out / "config.json", {**base, "status": "failed",
                                         "stop_reason": "no session"})
        raise
    client.rows = None  # the tables are written whole now
    records = client.records()
    sent = [c.t_sent for c in records.conditions]
    write_trace(out / "trace.jsonl", sent, {"duration": config.window,
                                            "source": config.trace.name})
    write_viewer_records(out, records, base)
    ready = client.ready.to_dict() if client.ready is not None else {}
    end = client.end.to_dict() if client.end is not None else {}
    # the server's failure of the session (a generator error, a hung job) is a failure
    # here too; an end the server did not send (it was killed, the connection dropped) or
    # sent early (it was stopped) leaves the run interrupted
    status = (COMPLETE if end.get("status") == COMPLETE and not client.stop_reason
              else FAILED if end.get("status") == FAILED else INTERRUPTED)
    stop_reason = client.stop_reason or (
        COMPLETE if status == COMPLETE else f"server: {end.get('stop_reason') or 'unknown'}")
    final = estimate_offset(client.probes) if client.probes else None
    drift = estimate_drift(client.probes)
    first = client.estimate
    end_time = max([config.window]
                   + [s.t_shown for s in records.slots if math.isfinite(s.t_shown)]) \
        if status == COMPLETE else max(
            [0.0] + [s.t_received for s in records.slots]
            + [c.t_sent for c in records.conditions])
    window = config.window if status == COMPLETE else min(config.window, end_time)
    summary = {"status": status, "stop_reason": stop_reason, "session": ready.get("session"),
               "window_s": window, **viewer_metrics(records, window),
               "offset": client.offset,
               "offset_uncertainty": None if first is None else first.uncertainty,
               "offset_final": None if final is None else final.offset,
               "offset_final_uncertainty": None if final is None else final.uncertainty,
               "rtt_min": None if final is None else final.rtt_min, "drift": drift,
               "n_probes": len(client.probes),
               "errors": client.errors[:20], "n_errors": len(client.errors),
               "server_summary": end.get("summary")}
    write_json(out / "summary.json", summary)
    write_json(out / "config.json", {**base, "status": status, "stop_reason": stop_reason,
                                     "end_time": end_time, **client.session_fields()})
    if interrupted is not None:
        raise interrupted
    return summary

