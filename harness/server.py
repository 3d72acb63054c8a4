"""``latsim serve``: the live generator and latsim's controller behind a WebSocket endpoint.

Each connection is one viewer session (:mod:`harness.wire` has the messages): after its
``hello`` the session gets its own controller and playback clock, a
:class:`~harness.driver.LiveDriver` on its own thread whose conditions are the viewer's
(:meth:`~harness.driver.LiveDriver.post_condition` at the moment each arrives). Its jobs go
to one :class:`SharedDevice`, a thread that runs the generator's jobs one at a time for every
session in the serving model's schedule order (``fifo``, ``least-slack``, ``replan-first``,
as :mod:`latsim.sim.serving` picks); a job that waited tells its controller when the device
took it, so the wait counts in R as simulated. Every slot the controller plays goes to the
viewer as a binary frame with its payload: the decoded pixels where ``--decode`` decoded them,
else the latent, so the bytes on the wire are real.

What the server sends is shaped per connection (a seeded :class:`~harness.netclock.Shaper`:
delay, jitter, loss; the viewer's ``shape`` message may set it), in order: a probe reply
queues behind the frames sent before it, as on one connection. Server times in messages are
``perf_counter()`` plus ``clock_offset`` (0 unless a test moves the server's clock).

**Faults.** A malformed message gets an ``error`` reply and a log line, never an exception;
a condition naming another session is refused the same way; a viewer that disconnects ends
its own session only (its job, if running, finishes; its later jobs are never run); a
session ends at its window plus drain, or on ``bye``; the server stops with Ctrl-C/SIGTERM,
ending every session (the viewers get ``end`` with status ``interrupted``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.calibration import Warmup, choose_lead
from harness.driver import DriverConfig, LiveDriver
from harness.netclock import Shaper
from harness.wire import (
    ProtocolError,
    dumps,
    encode_frame,
    integer,
    number,
    parse_text,
)
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig, PlaySlot, StartJob
from latsim.controller.policies import PRESETS
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.controller.timing import Timing
from latsim.errors import LatsimError, check_number
from latsim.model.lead import LIVE
from latsim.plugins import (
    GeneratorConfig,
    JobTiming,
    LiveGenerator,
    Schedule,
    available,
    build_generator,
    load_schedule,
    schedule_failed,
)

log = logging.getLogger("latsim.serve")

@dataclass(frozen=True)
class ServerConfig:
    """What ``latsim serve`` builds and how it serves."""

    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    generator_name: str = "wan"  # a registered live generator
    Ks: tuple[int, ...] = (4,)  # chunk sizes a session may ask for (warmed up at start)
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port
    schedule: str = "fifo"
    max_sessions: int = 8
    max_duration: float = 3600.0  # longest session window a viewer may ask for (s)
    warmup: int = 10  # timed warm-up jobs per K (they set the default lead)
    downlink: Shaper = field(default_factory=Shaper)  # default shaping of what it sends
    clock_offset: float = 0.0  # added to the server clock (tests of the viewer's alignment)

    def __post_init__(self) -> None:
        if self.schedule not in available("schedules"):
            raise LatsimError(f"--schedule must be one of {', '.join(available('schedules'))}"
                              f", got {self.schedule!r}")
        if not self.Ks or len(self.Ks) > 16:
            raise LatsimError("--K takes 1 to 16 chunk sizes")
        for name, values, lo, hi in (("--K", self.Ks, 1, 1000), ("--port", (self.port,), 0, 65535),
                                     ("--max-sessions", (self.max_sessions,), 1, 64),
                                     ("--warmup", (self.warmup,), 1, 1000)):
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise LatsimError(f"{name} must be an integer, got {value!r}")
                check_number(name, value, lo, hi)
        check_number("--max-duration", self.max_duration, 1, 86400, unit="s")


# ---------------------------------------------------------------- the shared device


@dataclass(eq=False)
class _Request:
    """One job waiting for (or running on) the device; the schedule sees it as a
    :class:`latsim.plugins.WaitingTask`."""

    session: _Session
    job: StartJob
    playable_until: float  # perf_counter time its stream's buffer runs out
    seq: int
    waited: bool
    started: Callable[[float], None]
    t_enqueue: float = 0.0
    picked_at: float = 0.0  # the time of the pick it is being considered in
    done: threading.Event = field(default_factory=threading.Event)
    timing: JobTiming | None = None
    error: BaseException | None = None

    @property
    def stream(self) -> int:
        return self.session.index

    @property
    def kind(self) -> str:
        return self.job.kind

    @property
    def stage(self) -> str:
        return "dit"  # the whole job (its decode too) runs on the one device

    @property
    def slack(self) -> float:
        return self.playable_until - self.picked_at


class SharedDevice:
    """One generator shared by the sessions: a thread runs their jobs one at a time, the
    waiting job that ``schedule`` names first (ties: submission order)."""

    def __init__(self, generator: LiveGenerator, schedule: str = "fifo",
                 decode_group: int = 1) -> None:
        self.generator = generator
        self.schedule: Schedule = load_schedule(schedule)
        self.decode_group = decode_group
        self._cond = threading.Condition()
        self._waiting: list[_Request] = []
        self._busy = False
        self._stopped = False
        self._seq = itertools.count()
        self.jobs_run = 0
        # held while the generator works: by the device thread for a job, by whoever else
        # touches the generator (a new session's stream state)
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="latsim-device", daemon=True)
        self._thread.start()

    def run(self, session: _Session, job: StartJob, playable_until: float,
            started: Callable[[float], None]) -> JobTiming:
        """Queue ``job`` of ``session`` and block until it ran."""
        with self._cond:
            if self._stopped:
                raise RuntimeError("the server's device has stopped")
            request = _Request(session, job, playable_until, next(self._seq),
                               self._busy or bool(self._waiting), started,
                               time.perf_counter())
            self._waiting.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.timing is not None
        return request.timing

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            for request in self._waiting:
                request.error = RuntimeError("the server stopped")
                request.done.set()
            self._waiting.clear()
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _pick(self) -> _Request:
        """The waiting job the schedule names (the one implementation the simulator uses
        too); a schedule that fails stops the device with that error for every job."""
        waiting = self._waiting
        if len(waiting) == 1:
            return waiting.pop()
        now = time.perf_counter()
        for request in waiting:
            request.picked_at = now
        try:
            best = self.schedule(waiting, now)
        except Exception as exc:  # noqa: BLE001 - a plug-in's failure is one line
            raise schedule_failed(self.schedule, exc) from None
        try:
            waiting.remove(best)  # type: ignore[arg-type]
        except ValueError:
            raise schedule_failed(self.schedule, None) from None
        return best  # type: ignore[return-value]

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                try:
                    request = self._pick()
                except LatsimError as exc:  # the schedule failed: so does every job
                    for waiting in self._waiting:
                        waiting.error = exc
                        waiting.done.set()
                    self._waiting.clear()
                    self._stopped = True
                    return
                self._busy = True
            try:
                with self.lock:
                    if request.waited:
                        request.started(time.perf_counter())
                    session = request.session
                    request.timing = self.generator.run_job(request.job, self.decode_group,
                                                            session.stream)
                    job = request.job
                    for position in range(job.branch, job.branch + job.length):
                        session.payloads[(job.job_id, position)] = self.generator.payload(
                            session.stream, position)
                self.jobs_run += 1
            except BaseException as exc:  # noqa: BLE001 - handed to the session's worker
                request.error = exc
            finally:
                with self._cond:
                    self._busy = False
                request.done.set()


class _SessionExecutor:
    """A session's view of the shared device (:class:`harness.driver.QueuedExecutor`)."""

    def __init__(self, device: SharedDevice, session: _Session) -> None:
        self.device, self.session = device, session

    def run_queued(self, job: StartJob, playable_until: float,
                   started: Callable[[float], None]) -> JobTiming:
        return self.device.run(self.session, job, playable_until, started)


# ---------------------------------------------------------------- a session


class _Session:
    """One viewer's stream: controller (in a live driver on its own thread), generator
    stream state, and the shaped, ordered outbox of its connection."""

    def __init__(self, server: StreamServer, session_id: str, hello: dict[str, Any],
                 send: Callable[[bytes | str, float], None], downlink: Shaper) -> None:
        self.server = server
        self.id = session_id
        self.index = int(session_id.lstrip("s") or 0)  # the stream a schedule sees
        self.send = send  # (message, server perf time it leaves) -> queued in order
        self.downlink = downlink
        config = server.config
        K = integer(hello, "K", 1, 1000)  # noqa: N806
        if K not in server.leads:
            raise ProtocolError(f"K={K} is not served here; choose one of "
                                f"{', '.join(map(str, sorted(server.leads)))}")
        policy = hello.get("policy", "speculative")
        if policy not in PRESETS:
            raise ProtocolError(f"'policy' must be one of {', '.join(PRESETS)}, got {policy!r}")
        self.duration = number(hello, "duration", 1.0, config.max_duration)
        model_r = server.info.r
        r = integer(hello, "r", 1, 64, model_r or 4)
        if model_r is not None and r != model_r:
            raise ProtocolError(f"'r' is {r}, but this server's generator makes {model_r} "
                                "pixel frames per latent frame")
        fps = number(hello, "fps", 1.0, 240.0, 16.0)
        self.timing = Timing(K, r, fps)
        choice = server.leads[K]
        lead = hello.get("lead")
        self.lead = choice.lead if lead is None else number(hello, "lead", 0.0, 3600.0)
        self.lead_source = choice.source if lead is None else "the viewer's hello"
        drain = hello.get("drain")
        drain = None if drain is None else number(hello, "drain", 0.0, 3600.0)
        self.controller_config = ControllerConfig(self.timing, PRESETS[policy], self.lead)
        self.policy = policy
        assert server.device is not None
        with server.device.lock:  # the generator (and its VAE's decode state) is shared
            self.stream = server.generator.new_stream(
                K, keep_frames=config.generator.decode)
            # (job id, position) -> what its slot sends; the prebuffer (job 0) is there now
            self.payloads: dict[tuple[int, int], tuple[str, tuple[int, ...], bytes]] = {
                (0, position): server.generator.payload(self.stream, position)
                for position in range(K)}
        self._resolved: list[ConditionRecord] = []
        self._gen: dict[int, JobTiming] = {}
        self.accepted = 0
        self.driver = LiveDriver(
            self.controller_config, _SessionExecutor(server.device, self),
            None, DriverConfig(self.duration, drain, job_timeout_s=None),
            on_record=self._on_record, on_play=self._on_play, on_job=self._on_job)
        self.result = None
        self._ready_lock = threading.Lock()
        self._ready_sent = False
        self.thread = threading.Thread(target=self._run, name=f"latsim-session-{session_id}",
                                       daemon=True)

    # ------------------------------------------------------------ times

    def server_time(self, perf: float) -> float:
        return perf + self.server.config.clock_offset

    def stream_to_server(self, t: float) -> float:
        return self.server_time(self.driver.t0 + t)

    # ------------------------------------------------------------ driver-side hooks

    def _on_record(self, record: object) -> None:
        kind = type(record)
        if kind is ConditionRecord and record.displayed:  # type: ignore[attr-defined]
            self._resolved.append(record)  # type: ignore[arg-type]
        elif kind is JobRecord:
            job: JobRecord = record  # type: ignore[assignment]
            gen = self._gen.pop(job.job_id, None)
            self.send(dumps({
                "type": "job", "job_id": job.job_id, "kind": job.kind, "branch": job.branch,
                "length": job.length, "version": job.version,
                "start": self.stream_to_server(job.t_start),
                "ready": self.stream_to_server(job.t_ready),
                "gen_start": None if gen is None else self.server_time(gen.t_start),
                "gen_end": None if gen is None else self.server_time(gen.t_end),
            }), time.perf_counter())

    def _on_job(self, timing: JobTiming) -> None:
        self._gen[timing.job_id] = timing

    def send_ready(self) -> None:
        """Send ``ready`` once, before anything else of the session (the first slot plays
        at stream time 0, possibly before the event loop gets to say ready)."""
        with self._ready_lock:
            if self._ready_sent:
                return
            self._ready_sent = True
            timing, server = self.timing, self.server
            self.send(dumps({
                "type": "ready", "session": self.id, "K": timing.K, "policy": self.policy,
                "T": timing.T, "delta": timing.delta, "r": timing.r, "fps": timing.fps,
                "lead": self.lead, "lead_source": self.lead_source,
                "duration": self.duration, "start": self.server_time(self.driver.t0),
                "schedule": server.config.schedule, "server_run": server.run_id,
                "generator": server.info.as_dict(),
                "downlink": {"delay": self.downlink.delay, "jitter": self.downlink.jitter,
                             "loss": self.downlink.loss},
            }), time.perf_counter())

    def _on_play(self, slot: PlaySlot, perf: float) -> None:
        self.send_ready()
        resolves = [{"version": c.version, "arrival": self.stream_to_server(c.t_arrival),
                     "start": self.stream_to_server(c.t_start),
                     "ready": self.stream_to_server(c.t_ready)} for c in self._resolved]
        self._resolved.clear()
        kind, shape, data = self.payloads.pop((slot.job_id, slot.position), ("none", (), b""))
        # superseded outputs that will never play (a snapshot of the keys: the device
        # thread adds to the dict meanwhile)
        for key in [k for k in list(self.payloads) if k[1] <= slot.position]:
            self.payloads.pop(key, None)
        header = {"type": "slot", "position": slot.position, "version": slot.version,
                  "job_id": slot.job_id, "played": self.stream_to_server(slot.at),
                  "sent": self.server_time(perf), "resolves": resolves,
                  "payload": kind, "shape": list(shape),
                  "dtype": {"pixels": "uint8", "latent": "float32"}.get(kind, "")}
        self.send(encode_frame(header, data), perf)

    # ------------------------------------------------------------ run

    def start(self) -> float:
        """Start playback; returns the server time of stream time 0 (approximately: the
        driver's exact ``t0`` is set on its thread, see :meth:`ready_message`)."""
        self.thread.start()
        return self.server_time(time.perf_counter())

    def _run(self) -> None:
        try:
            self.result = self.driver.run()
        finally:
            self.server.session_ended(self)

    def condition(self, message: dict[str, Any]) -> dict[str, Any]:
        """Accept a viewer's condition (on the event loop thread); the ``ack`` reply."""
        session = message.get("session")
        if session is not None and session != self.id:
            raise ProtocolError(f"condition for session {session!r} refused: this connection "
                                f"is session {self.id!r}")
        cid = integer(message, "cid", 0, 2**53)
        if self.driver.t0 == 0.0:
            raise ProtocolError("condition before the session's playback started")
        if time.perf_counter() - self.driver.t0 >= self.duration:
            raise ProtocolError(f"condition {cid} after the session's {self.duration:g} s "
                                "window: not served")
        arrival = self.driver.post_condition(cid)
        self.accepted += 1
        return {"type": "ack", "cid": cid, "version": self.accepted,
                "arrival": self.server_time(arrival)}

    def end_message(self) -> str:
        result = self.result
        if result is None:
            return dumps({"type": "end", "status": "failed", "stop_reason": "no result",
                          "summary": None})
        summary = summarize([result.records]).as_dict()
        return dumps({"type": "end", "status": result.status,
                      "stop_reason": result.stop_reason, "summary": summary,
                      "end": self.stream_to_server(result.end_time)})


# ---------------------------------------------------------------- the server


class StreamServer:
    """Builds the generator, warms it up per K (the default leads), serves sessions."""

    def __init__(self, config: ServerConfig, generator: LiveGenerator | None = None,
                 leads: dict[int, Any] | None = None) -> None:
        self.config = config
        self.generator = generator
        self.leads: dict[int, Any] = dict(leads or {})
        self.device: SharedDevice | None = None
        self.sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.errors = 0  # malformed or refused messages answered with ``error``
        self.port: int | None = None
        # names this server run in every ready: viewers of one run shared its device
        self.run_id = uuid.uuid4().hex[:12]

    # ------------------------------------------------------------ set-up

    def prepare(self, progress: Callable[[str], None] | None = None) -> None:
        """Build the generator (unless given) and warm it up for every K without a lead."""
        if self.generator is None:
            self.generator = build_generator(self.config.generator_name,
                                             self.config.generator)
        self.info = self.generator.describe()
        decode_group = 1 if self.config.generator.decode else 0
        for K in self.config.Ks:  # noqa: N806
            if K in self.leads:
                continue
            if progress is not None:
                progress(f"warming up K={K}")
            jobs = self.generator.warmup(K, 2, self.config.warmup, max(decode_group, 1),
                                         gap_s=0.1)
            self.leads[K] = choose_lead(LIVE, [Warmup(K, decode_group, tuple(jobs))])
        self.device = SharedDevice(self.generator, self.config.schedule, decode_group)

    def clock(self) -> float:
        return time.perf_counter() + self.config.clock_offset

    # ------------------------------------------------------------ serving

    async def serve(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Serve until :meth:`stop` (or the task is cancelled)."""
        from websockets.asyncio.server import serve

        if self.device is None:
            self.prepare()
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self._connection, self.config.host, self.config.port,
                         max_size=2**16, compression=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            if on_listening is not None:
                on_listening(self.port)
            try:
                await self._stop.wait()
            finally:
                for session in list(self.sessions.values()):
                    session.driver.stop("the server stopped")
                for session in list(self.sessions.values()):
                    await asyncio.to_thread(session.thread.join, 30)
                await asyncio.sleep(0.05)  # let the end messages go out

    def stop(self) -> None:
        """Stop serving (from any thread)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def close(self) -> None:
        if self.device is not None:
            self.device.stop()

    def session_ended(self, session: _Session) -> None:
        """On the session's thread, after its driver returned."""
        result = session.result
        log.info("session %s ended: %s (%s), %d conditions, %d jobs", session.id,
                 result.status if result else "failed",
                 result.stop_reason if result else "no result", session.accepted,
                 len(result.jobs) if result else 0)
        try:
            session.send(session.end_message(), time.perf_counter())
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.sessions.pop, session.id, None)
        except RuntimeError:  # the event loop has closed: nobody is listening
            self.sessions.pop(session.id, None)

    async def _connection(self, websocket) -> None:
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue = asyncio.Queue()
        state: dict[str, Any] = {"shaper": self.config.downlink, "channel":
                                 self.config.downlink.channel(np.random.default_rng(0))}

        def send(message: bytes | str, perf: float) -> None:  # any thread
            loop.call_soon_threadsafe(outbox.put_nowait, (message, perf))

        sender = asyncio.create_task(self._sender(websocket, outbox, state))
        session: _Session | None = None
        try:
            async for raw in websocket:
                received = time.perf_counter()
                message: dict[str, Any] = {}
                try:
                    message = parse_text(raw)
                    kind = message["type"]
                    if kind == "probe":
                        t0 = number(message, "t0", -1e12, 1e12)
                        send(dumps({"type": "probe", "t0": t0,
                                    "t1": received + self.config.clock_offset,
                                    "t2": self.clock()}), time.perf_counter())
                    elif kind == "hello":
                        if session is not None:
                            raise ProtocolError("this connection already has a session")
                        if len(self.sessions) >= self.config.max_sessions:
                            raise ProtocolError(f"server full ({self.config.max_sessions} "
                                                "sessions)")
                        session = await asyncio.to_thread(
                            _Session, self, f"s{next(self._ids)}", message, send,
                            state["shaper"])
                        self.sessions[session.id] = session
                        session.start()
                        log.info("session %s: K=%d %s, %g s, lead %.4f s, from %s",
                                 session.id, session.timing.K, session.policy,
                                 session.duration, session.lead, websocket.remote_address)
                        while session.driver.t0 == 0.0:
                            await asyncio.sleep(0.001)
                        session.send_ready()
                    elif kind == "shape":
                        if session is not None:
                            raise ProtocolError("shape the connection before hello")
                        try:
                            shaper = Shaper(number(message, "delay", 0, 60, 0.0),
                                            number(message, "jitter", 0, 60, 0.0),
                                            number(message, "loss", 0, 1, 0.0))
                        except LatsimError as exc:
                            raise ProtocolError(str(exc)) from None
                        seed = integer(message, "seed", 0, 2**63 - 1, 0)
                        state["shaper"] = shaper
                        state["channel"] = shaper.channel(np.random.default_rng(seed))
                    elif kind == "condition":
                        if session is None:
                            raise ProtocolError("condition before hello: no session")
                        send(dumps(session.condition(message)), time.perf_counter())
                    elif kind == "bye":
                        if session is not None:
                            session.driver.stop("the viewer said bye")
                    else:
                        raise ProtocolError(f"unknown message type {kind!r}")
                except (ProtocolError, LatsimError) as exc:
                    self.errors += 1
                    log.warning("session %s: %s", session.id if session else "-", exc)
                    reply = {"type": "error", "error": str(exc)}
                    cid = message.get("cid")
                    if message.get("type") == "condition" and isinstance(cid, int):
                        reply["cid"] = cid  # which condition was refused
                    send(dumps(reply), time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - a broken connection ends its session only
            log.info("connection closed: %s", exc)
        finally:
            if session is not None and session.thread.is_alive():
                session.driver.stop("the viewer disconnected")
                await asyncio.to_thread(session.thread.join, 30)
            await asyncio.sleep(0)
            sender.cancel()

    async def _sender(self, websocket, outbox: asyncio.Queue, state: dict[str, Any]) -> None:
        """Send queued messages in order, each when its shaped delay has passed."""
        try:
            while True:
                message, perf = await outbox.get()
                arrives = state["channel"].deliver_at(perf)
                if arrives is None:
                    continue  # lost on the (shaped) network
                wait = arrives - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                await websocket.send(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the viewer went away
            log.info("send failed: %s", exc)


class ServerThread:
    """A :class:`StreamServer` on its own thread and event loop (tests, notebooks):
    ``with ServerThread(server) as port: ...``."""

    def __init__(self, server: StreamServer) -> None:
        self.server = server
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="latsim-server", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.server.serve(lambda port: self._ready.set()))
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()

    def __enter__(self) -> int:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None or self.server.port is None:
            raise RuntimeError(f"the server did not start: {self._error}")
        return self.server.port

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.server.close()

    def stop(self) -> None:
        """Stop serving (sessions end, viewers get ``end``) and join the thread."""
        self.server.stop()
        self._thread.join(60)
