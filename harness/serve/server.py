"""``latsim serve``: the live generator and latsim's controller behind a WebSocket endpoint.

Each connection is one viewer session (:mod:`harness.net.wire` has the messages): after its
``hello`` the session gets its own controller and playback clock, a
:class:`~harness.live.driver.LiveDriver` on its own thread whose conditions are the viewer's
(:meth:`~harness.live.driver.LiveDriver.post_condition` at the moment each arrives). Its jobs go
to one :class:`SharedDevice`, a thread that runs the generator's jobs one at a time for every
session in the serving model's schedule order (``fifo``, ``least-slack``, ``replan-first``,
as :mod:`latsim.sim.serving` picks); a job that waited tells its controller when the device
took it, so the wait counts in R as simulated. Every slot the controller plays goes to the
viewer as a binary frame with its payload: the decoded pixels where ``--decode`` decoded them,
else the latent, so the bytes on the wire are real.

What the server sends is shaped per connection (a seeded :class:`~harness.net.netclock.Shaper`:
delay, jitter, loss; the viewer's ``shape`` message may set it), in order: a probe reply
queues behind the frames sent before it, as on one connection. Server times in messages are
``perf_counter()`` plus ``clock_offset`` (0 unless a test moves the server's clock).

The same port serves the browser viewer (``harness/viewer/web``: ``index.html`` and
``viewer.js``) to a plain HTTP GET of ``/`` that asks for no WebSocket upgrade; the page needs
no token, its WebSocket does (``?token=T`` in the page's URL, passed on).

**The protocol** is :mod:`harness.serve.connection`'s: pure state machines for what a
viewer may send in each phase (:class:`~harness.serve.connection.Connection`) and what the
server may queue for it (:class:`~harness.serve.connection.Outflow`); the code here reads
messages into them and carries out the actions they answer.

**Faults.** A malformed message gets an ``error`` reply and a log line, never an exception;
a condition naming another session is refused the same way; a viewer that disconnects ends
its own session only (its job, if running, finishes; its later jobs are never run); a
session ends at its window plus drain, or on ``bye``; the server stops with Ctrl-C/SIGTERM,
ending every session (the viewers get ``end`` with status ``interrupted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import math
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np

from harness.live.lead import LeadChoice, Warmup, choose_lead
from harness.net.wire import Error, Hello, ProtocolError
from harness.serve.admission import HelloPlaces
from harness.serve.bucket import TokenBucket
from harness.serve.config import ServerConfig
from harness.serve.connection import (
    Action,
    Connection,
    Fault,
    Forward,
    Open,
    Outflow,
    Phase,
    Refuse,
    Reply,
    Reshape,
    StopSession,
)
from harness.serve.device import SharedDevice
from harness.serve.session import Session
from latsim.controller import StartJob
from latsim.errors import LatsimError
from latsim.model.lead import LIVE
from latsim.plugins import (
    LiveGenerator,
    build_generator,
)
from latsim.run.record_files import write_csv
from latsim.run.serving import TaskRecord

#: The client addresses whose shared probe buckets the server keeps (the least recently
#: seen go first): a bound on memory however many addresses connect.
MAX_PROBE_ADDRESSES = 4096
#: One client address may probe this many times one connection's ``--max-probe-rate``, in
#: all its connections together (before, its 32 pending connections had 32 times).
ADDRESS_PROBES = 8
#: ``--out DIR``'s file of the shared device's tasks (every session's, every server run's)
DEVICE_TASKS = "tasks.csv"

log = logging.getLogger("latsim.serve")


def claim_serve_folder(out: Path) -> None:
    """Refuse an ``--out`` whose ``tasks.csv`` another wrote (a one-line error, before the
    warm-up): a server appends its device's tasks to the one an earlier ``latsim serve``
    left there (rows carry their ``server_run``), never to a file of another header
    (:func:`latsim.run.folder.claim_folder`). Session folders have fresh names."""
    from latsim.controller.records import column_names
    from latsim.run.folder import claim_folder, header_of, of_columns

    columns = ["server_run", "session", *column_names(TaskRecord)]
    claim_folder(out, (DEVICE_TASKS,), DEVICE_TASKS, "latsim serve", of_columns(columns),
                 read=header_of)


#: Wrong tokens in a row from one address before it is refused outright for a while; then
#: FIRST_TOKEN_BACKOFF_S, doubling with each further one, up to :data:`MAX_TOKEN_BACKOFF_S`
#: (guessing a token stops paying long before it could succeed, and a typo costs nothing).
FREE_TOKEN_FAILURES = 5
FIRST_TOKEN_BACKOFF_S = 0.1
MAX_TOKEN_BACKOFF_S = 60.0
#: Addresses whose wrong tokens are remembered (the oldest is forgotten past this).
MAX_TRACKED_ADDRESSES = 4096


def shared_device_leads(warmups: dict[int, Warmup], max_sessions: int,
                        schedule: str = "fifo") -> dict[int, LeadChoice]:
    """Each K's default lead: one stream's (:func:`~harness.live.lead.choose_lead`, from
    its warm-up) plus a wait budget for the other sessions' jobs on the shared device.

    A session has one job in flight at a time, so on the FIFO device a job it queues waits
    for at most one job of each of the ``max_sessions - 1`` others (whatever they send:
    a session flooding conditions holds one job too), each at most the largest warm-up
    quantile over the Ks served: the budget is their product. A lead of one stream's
    let a refill queued behind another session's job stall its viewer (issue 33: 12 of 64
    sessions stalled at 2 ms jobs; an honest viewer beside one sending 20 conditions/s
    stalled 0.56 %). Under another ``schedule`` each other session may also overtake the
    job once (:func:`latsim.plugins.take_next`'s share bound): twice as many jobs. A
    viewer's hello may give its own lead."""
    single = {K: choose_lead(LIVE, [warm]) for K, warm in warmups.items()}
    longest = max(LIVE.sample_quantile(warm.durations) for warm in warmups.values())
    others = max_sessions - 1
    if not others:
        return single
    jobs = others if schedule == "fifo" else 2 * others
    wait = jobs * longest
    ahead = ("one each" if schedule == "fifo"
             else f"two each under {schedule} (ahead, and overtaking once)")
    return {K: LeadChoice(choice.lead + wait, f"{choice.source}; plus {others} other "
                          f"session(s)' jobs on the shared device, {ahead}, at the "
                          f"warm-up's p{100 * LIVE.quantile:g} of {longest:.4g} s: "
                          f"{wait:.4g} s", choice.jitter_s)
            for K, choice in single.items()}


class StreamServer:
    """Builds the generator, warms it up per K (the default leads), serves sessions."""

    def __init__(self, config: ServerConfig, generator: LiveGenerator | None = None,
                 leads: dict[int, Any] | None = None) -> None:
        self.config = config
        self.generator = generator
        self.leads: dict[int, Any] = dict(leads or {})
        self.device: SharedDevice | None = None
        self.sessions: dict[str, Session] = {}
        # admitted sessions, counted at hello on the event loop before anything awaits, so
        # the limit holds for any number of simultaneous hellos; released when one ends
        self._admitted = 0
        # the connections that have not said hello, shared fairly between addresses
        self._waiting: HelloPlaces[_Link] = HelloPlaces(config.max_pending,
                                                         config.pending_per_address)
        self._evictions: set[asyncio.Task] = set()  # closing a connection whose place went
        self._probes_from: dict[str, TokenBucket] = {}  # probe buckets by address (LRU)
        self.refused = 0  # connections refused: server full, too many pending, no hello
        # per client address: wrong tokens in a row, and until when it is refused outright
        self._token_failures: dict[object, tuple[int, float]] = {}
        self.lagging = 0  # connections told they were lagging
        self.dropped = 0  # sessions ended because their viewer fell behind
        self.peak_queue_bytes = 0  # the most one connection had queued
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.errors = 0  # malformed or refused messages answered with ``error``
        self.port: int | None = None
        # names this server run in every ready: viewers of one run shared its device
        self.run_id = uuid.uuid4().hex[:12]
        self._tasks_lock = threading.Lock()  # --out's tasks.csv, appended from sessions
        self._task_ids = itertools.count()
        self.task_error: str | None = None  # the first failed write of tasks.csv

    # ------------------------------------------------------------ set-up

    def prepare(self, progress: Callable[[str], None] | None = None) -> None:
        """Build the generator (unless given) and warm it up for every K without a lead."""
        if self.generator is None:
            self.generator = build_generator(self.config.generator_name,
                                             self.config.generator)
        self.info = self.generator.describe()
        decode_group = 1 if self.config.generator.decode else 0
        warmups = {}
        for K in self.config.Ks:
            if K in self.leads:
                continue
            if progress is not None:
                progress(f"warming up K={K}")
            jobs = self.generator.warmup(K, 2, self.config.warmup, max(decode_group, 1),
                                         gap_s=0.1)
            warmups[K] = Warmup(K, decode_group, tuple(jobs))
        if warmups:
            self.leads.update(shared_device_leads(warmups, self.config.max_sessions,
                                                   self.config.schedule))
        self.device = SharedDevice(self.generator, self.config.schedule, decode_group)

    def clock(self) -> float:
        return time.perf_counter() + self.config.clock_offset

    # ------------------------------------------------------------ serving

    async def serve(self, on_listening: Callable[[int], None] | None = None,
                    handle_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or the task is cancelled); with ``handle_signals``,
        SIGINT and SIGTERM stop it the same way: every viewer gets ``end``, then a close."""
        from websockets.asyncio.server import serve

        if self.device is None:
            self.prepare()
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if handle_signals:
            import signal

            for signum in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(signum, self._stop.set)
        origins = None if self.config.origins is None else [*self.config.origins, None]
        async with serve(self._connection, self.config.host, self.config.port,
                         max_size=2**16, compression=None, origins=origins,
                         process_request=self._check_token) as server:
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
        """Stop serving (from any thread; again, or after the loop has closed, it does
        nothing: a timer's stop and the context manager's may race)."""
        loop, stop = self._loop, self._stop
        if loop is None or stop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # it closed between the check and the call
            loop.call_soon_threadsafe(stop.set)

    def close(self) -> None:
        if self.device is not None:
            self.device.stop()

    def device_task(self, session: Session, job: StartJob, t_enqueue: float, t_start: float,
                    t_end: float) -> None:
        """With ``--out``: append the job the device ran for ``session`` to ``tasks.csv``
        (server-clock times: queued, taken, done), with the server run and session first.
        On the session's generator thread, after the job: one short row, under a lock."""
        out = self.config.out
        if out is None or self.task_error is not None:
            return
        shift = self.config.clock_offset
        record = TaskRecord(session.index, job.job_id, "dit", job.kind, "dit", 0,
                            next(self._task_ids), t_enqueue + shift, t_start + shift,
                            t_end + shift)
        try:
            with self._tasks_lock:
                write_csv(out / DEVICE_TASKS, TaskRecord, (record,), append=True,
                          extra=(("server_run", self.run_id), ("session", session.id)))
        except OSError as exc:
            self.task_error = f"cannot write {out / DEVICE_TASKS}: {exc.strerror or exc}"
            log.warning("%s; no more device tasks are recorded", self.task_error)

    def session_ended(self, session: Session) -> None:
        """On the session's thread, after its driver returned."""
        result = session.result
        log.info("session %s ended: %s (%s), %d conditions, %d jobs", session.id,
                 result.status if result else "failed",
                 result.stop_reason if result else "no result", session.accepted,
                 len(result.jobs) if result else 0)
        try:
            for message in session.end_messages():
                session.send(message, time.perf_counter())
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._release, session.id)
        except RuntimeError:  # the event loop has closed: nobody is listening
            self._release(session.id)

    def _check_token(self, connection, request):  # websockets'
        """At the handshake: no token configured, or the right one in the URL's ``token``
        query or an ``Authorization: Bearer`` header; else 401 (counted as refused).

        A plain HTTP GET (no WebSocket upgrade) of ``/`` or ``/viewer.js`` gets the browser
        viewer's page instead (:func:`web_page`), without a token: the page is given the
        token by its URL and presents it when it opens its WebSocket, which is checked
        here like any other."""
        page = _web_response(connection, request)
        if page is not None:
            return page
        foreign = self._foreign_origin(connection, request)
        if foreign is not None:
            return foreign
        token = self.config.token
        if token is None:
            return None
        from urllib.parse import parse_qs, urlsplit

        address = (connection.remote_address or ("?",))[0]
        failures, blocked_until = self._token_failures.get(address, (0, 0.0))
        now = time.monotonic()
        if now < blocked_until:  # guessing: refused before the token is even compared
            # (comparing it would let guesses go on at any rate); Retry-After tells a
            # client with the right token, sharing the address, when it will be compared
            self.refused += 1
            response = connection.respond(HTTPStatus.TOO_MANY_REQUESTS,
                                          f"too many wrong tokens; retry in "
                                          f"{blocked_until - now:.1f} s\n")
            response.headers["Retry-After"] = str(math.ceil(blocked_until - now))
            return response
        given = parse_qs(urlsplit(request.path).query).get("token", [""])[-1]
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":  # RFC 7235: the scheme is case-insensitive
            given = given or credentials.strip()
        if hmac.compare_digest(given.encode(), token.encode()):
            self._token_failures.pop(address, None)
            return None
        self.refused += 1
        failures += 1
        delay = (0.0 if failures <= FREE_TOKEN_FAILURES
                 else min(MAX_TOKEN_BACKOFF_S,
                         FIRST_TOKEN_BACKOFF_S * 2 ** (failures - FREE_TOKEN_FAILURES - 1)))
        if len(self._token_failures) >= MAX_TRACKED_ADDRESSES:  # the oldest entry goes
            self._token_failures.pop(next(iter(self._token_failures)))
        self._token_failures[address] = (failures, now + delay)
        if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, 8th ... in a row: the log
            log.warning("connection from %s refused: no or wrong token (%d in a row%s)",
                        connection.remote_address, failures,
                        f"; refused outright for {delay:.1f} s" if delay else "")
        return connection.respond(HTTPStatus.UNAUTHORIZED, "a valid token is required\n")

    def _own_name(self, host: str) -> bool:
        """Whether ``host`` (from a URL, lower case) names this server without DNS: an IP
        address, ``localhost``, or the ``--host`` it was given."""
        import ipaddress

        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return host in ("localhost", self.config.host.lower())

    def _foreign_origin(self, connection, request):  # websockets'
        """Without ``--allow-origin``, a browser may connect only from a page of this server:
        an Origin header (browsers send one; other clients need not) must name the host and
        port the request was sent to, else 403. Otherwise any web page the user opens could
        drive a server on their loopback. That host must also be one of the server's own
        names (an IP address, ``localhost``, or ``--host``) on its port: a page whose DNS
        name is made to point at 127.0.0.1 (DNS rebinding) sends Origin and Host alike,
        both with that name. An ``--allow-origin`` list is websockets' to check."""
        origin = request.headers.get("Origin")
        if self.config.origins is not None or origin is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(origin)
        try:
            port = parts.port
        except ValueError:  # 127.0.0.1:PORT.evil.example: no port at all, so not ours
            port = None
        if (parts.scheme in ("http", "https") and port == self.port
                and parts.netloc.lower() == request.headers.get("Host", "").lower()
                and self._own_name(parts.hostname or "")):
            return None
        self.refused += 1
        log.warning("connection from %s refused: Origin %r is not this server's (give "
                    "--allow-origin)", connection.remote_address, origin[:80])
        return connection.respond(HTTPStatus.FORBIDDEN, "this origin may not connect; the "
                                  "server names the ones it allows with --allow-origin\n")

    def _release(self, session_id: str) -> None:
        if self.sessions.pop(session_id, None) is not None:
            self._admitted -= 1

    async def _refuse(self, websocket, reason: str, code: int) -> None:
        """An ``error`` frame, then a close with ``code`` (1013: try again later; 1008: a
        policy the connection broke)."""
        self.refused += 1
        log.warning("connection from %s refused: %s", websocket.remote_address, reason)
        try:
            await websocket.send(Error(reason, None).to_json())
            await websocket.close(code, reason[:120])
        except Exception as exc:  # noqa: BLE001 - it went away first
            log.info("refusal not delivered: %s", exc)

    def _probes_of(self, address: str) -> TokenBucket:
        """The probe bucket every connection from ``address`` shares, ADDRESS_PROBES times
        one connection's rate (many viewers behind one address each probe 16 times as they
        start); the least recently seen of more than MAX_PROBE_ADDRESSES go."""
        buckets = self._probes_from
        bucket = buckets.pop(address, None)
        if bucket is None:
            rate = ADDRESS_PROBES * self.config.max_probe_rate
            bucket = TokenBucket(rate, rate, time.perf_counter())
            if len(buckets) >= MAX_PROBE_ADDRESSES:
                del buckets[next(iter(buckets))]
        buckets[address] = bucket  # now the most recently seen
        return bucket

    async def _connection(self, websocket) -> None:
        config = self.config
        address = str((websocket.remote_address or ("?",))[0])
        link = _Link(websocket, config, address, self._enqueue, self._probes_of(address))
        admission = self._waiting.admit(
            address, link, lambda other: other.connection.phase is Phase.GREETING)
        if admission.refused is not None:
            await self._refuse(websocket, admission.refused, 1013)
            return
        if admission.evicted is not None:
            self._evict(admission.evicted, address)
        try:
            await self._pump(link)
        finally:
            self._said_hello(link)

    def _evict(self, link: _Link, newcomer: str) -> None:
        """``link`` (waiting for its hello) lost its place to a connection from
        ``newcomer``, whose address held fewer: it is told so and closed."""
        reason = (f"the server is crowded: this connection's place before hello went to "
                  f"another address ({link.address} held "
                  f"{self._waiting.held(link.address) + 1}, {newcomer} fewer)")
        task = asyncio.ensure_future(self._carry_out(link, link.connection.evicted(reason)))
        self._evictions.add(task)
        task.add_done_callback(self._evictions.discard)

    def _said_hello(self, link: _Link) -> None:
        """The connection said hello, left, or is being closed: it no longer holds a place
        among those waiting for a hello (again, nothing)."""
        self._waiting.release(link)

    async def _pump(self, link: _Link) -> None:
        """Read the viewer's messages into the connection's machine and carry out what it
        answers (:mod:`harness.serve.connection`), until it closes or the viewer leaves."""
        websocket, connection = link.websocket, link.connection
        sender = asyncio.create_task(self._sender(link))
        refused = 0  # the session's refused conditions seen so far
        try:
            while connection.phase is not Phase.CLOSED:
                if connection.phase is Phase.GREETING:
                    wait = max(0.0, connection.hello_deadline - time.perf_counter())
                    try:
                        raw = await asyncio.wait_for(websocket.recv(), wait)
                    except TimeoutError:
                        await self._carry_out(link, connection.timed_out())
                        continue
                else:
                    raw = await websocket.recv()
                received = time.perf_counter()
                actions = connection.receive(raw, received, received + self.config.clock_offset)
                await self._carry_out(link, actions)
                session = link.session
                if session is not None and session.refused_conditions > refused:
                    # over its condition rate: leave its messages unread until the rate
                    # admits another, so a flood is held back by TCP, not parsed and
                    # answered at the cost of every other viewer's event loop
                    refused = session.refused_conditions
                    await asyncio.sleep(session.condition_wait(time.perf_counter()))
        except Exception as exc:  # noqa: BLE001 - a broken connection ends its session only
            log.info("connection closed: %s", exc)
        finally:
            connection.close()
            session = link.session
            if session is not None and session.thread.is_alive():
                session.driver.stop("the viewer disconnected")
                await asyncio.to_thread(session.thread.join, 30)
            await asyncio.sleep(0)
            sender.cancel()

    async def _carry_out(self, link: _Link, actions: list[Action]) -> None:
        """Do what the connection's machine answered, in order; a session's refusal of a
        condition or a hello is answered like a malformed message."""
        for action in actions:
            try:
                match action:
                    case Reply(text):
                        link.send(text, time.perf_counter())
                    case Refuse(reason, code):
                        # its place before hello is free at once, not after the close
                        # handshake (up to websockets' close timeout with a silent peer)
                        self._said_hello(link)
                        await self._refuse(link.websocket, reason, code)
                    case Open(hello):
                        await self._open(link, hello)
                    case Forward(condition):
                        session = link.session
                        assert session is not None  # the machine forwards in session only
                        link.send(session.condition(condition).to_json(), time.perf_counter())
                    case Reshape(shaper, seed):
                        link.channel = shaper.channel(np.random.default_rng(seed))
                    case StopSession(reason):
                        assert link.session is not None
                        link.session.driver.stop(reason)
                    case Fault(error, cid):
                        self._fault(link, error, cid)
            except (ProtocolError, LatsimError) as exc:
                self._fault(link, str(exc), action.condition.cid
                            if isinstance(action, Forward) else None)

    def _fault(self, link: _Link, error: str, cid: int | None) -> None:
        """Answer ``error``; counted, and logged for a connection's 1st, 2nd, 4th, 8th ...
        fault only (a flood of refused conditions wrote a line each, about 1 GB an hour)."""
        self.errors += 1
        link.faults += 1
        if link.faults & (link.faults - 1) == 0:
            log.warning("session %s: %s (fault %d of this connection)",
                        link.session.id if link.session else "-", error, link.faults)
        link.send(Error(error, cid).to_json(), time.perf_counter())

    async def _open(self, link: _Link, hello: Hello) -> None:
        """Admit and start the session ``hello`` asks for (or refuse it: the server is
        full, or the hello asks for what the server cannot give)."""
        connection = link.connection
        if self._admitted >= self.config.max_sessions:
            await self._carry_out(link, connection.refused(
                f"server full ({self.config.max_sessions} sessions)"))
            return
        self._admitted += 1  # no await between the check and this
        try:
            # the number orders streams for a schedule; the random part makes an id
            # nobody can guess
            session = await asyncio.to_thread(
                Session, self, f"s{next(self._ids)}-{secrets.token_hex(8)}", hello, link.send,
                link.channel.shaper)
        except (ProtocolError, LatsimError):
            self._admitted -= 1
            connection.open_failed()
            raise
        except BaseException:
            self._admitted -= 1
            raise
        connection.opened()
        self.sessions[session.id] = session
        link.session = session
        self._said_hello(link)
        session.start()
        log.info("session %s: K=%d %s, %g s, lead %.4f s, from %s", session.id,
                 session.timing.K, session.policy, session.duration, session.lead,
                 link.websocket.remote_address)
        # bounded: a thread of the default executor that never returned would hold up the
        # event loop's shutdown
        await asyncio.to_thread(session.driver.started.wait, 10.0)
        session.send_ready()
        if session.folder is not None:
            await asyncio.to_thread(session.folder_started)

    def _enqueue(self, link: _Link, message: bytes | str, perf: float) -> None:
        """On the event loop: queue ``message`` within the connection's bounds
        (:class:`~harness.serve.connection.Outflow` decides: a lagging notice ahead of the
        backlog, the drop of a viewer that stayed behind, frames no longer queued once it
        is dropped); a dropped viewer's connection closes (1008) soon after its ``end``."""
        session, outflow = link.session, link.outflow
        backlog, queued = outflow.bytes, outflow.items  # before this message and its notice
        offer = outflow.offer(len(message), isinstance(message, bytes), time.perf_counter(),
                              session is not None)
        if offer.notice is not None and session is not None:
            self.lagging += 1
            log.warning("session %s: the viewer is lagging (%d bytes, %d frames queued)",
                        session.id, backlog, queued)
            link.outbox.put((offer.notice, perf), first=True)  # ahead of the backlog
        if offer.drop and session is not None:
            self.dropped += 1
            behind = time.perf_counter() - (outflow.lagging_since or 0.0)
            log.warning("session %s: dropped: the viewer fell behind (%d bytes, %d frames "
                        "queued, lagging for %.1f s)", session.id, backlog, queued, behind)
            session.driver.stop("the viewer fell behind")
            # closed soon after its end went out, or when the close times out
            asyncio.get_running_loop().call_later(
                1.0, lambda: asyncio.ensure_future(link.websocket.close(
                    1008, "the viewer fell behind")))
        if offer.queue:
            self.peak_queue_bytes = max(self.peak_queue_bytes, outflow.bytes)
            link.outbox.put((message, perf))

    async def _sender(self, link: _Link) -> None:
        """Send queued messages in order, each when its shaped delay has passed."""
        try:
            while True:
                message, perf = await link.outbox.get()
                link.outflow.sent(len(message))
                arrives = link.channel.deliver_at(perf)
                if arrives is None:
                    continue  # lost on the (shaped) network
                wait = arrives - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                await link.websocket.send(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the viewer went away
            log.info("send failed: %s", exc)


class _Link:
    """What the server holds for one open connection: its websocket, its protocol machines
    (:class:`~harness.serve.connection.Connection`, :class:`~harness.serve.connection.Outflow`),
    its outbox and downlink shaping, and its session once it has one."""

    def __init__(self, websocket, config: ServerConfig, address: str,
                 enqueue: Callable[[_Link, bytes | str, float], None],
                 address_probes: TokenBucket | None = None) -> None:
        self.websocket = websocket
        self.address = address
        self.connection = Connection(time.perf_counter(), config.hello_timeout,
                                     config.max_probe_rate, config.clock_offset,
                                     address_probes)
        self.outflow = Outflow(config.max_queue_bytes, config.max_queue_frames,
                               config.lag_grace)
        self.outbox = _Outbox()
        self.channel = config.downlink.channel(np.random.default_rng(0))  # and its shaper
        self.session: Session | None = None
        self.faults = 0  # the errors it was answered (StreamServer._fault)
        self._enqueue = enqueue
        self._loop = asyncio.get_running_loop()

    def send(self, message: bytes | str, perf: float) -> None:  # any thread
        """Queue ``message`` (sent at ``perf``) on the event loop, within the bounds."""
        self._loop.call_soon_threadsafe(self._enqueue, self, message, perf)


class _Outbox:
    """What one connection has to send, in order, on the event loop: a FIFO that also takes
    a message ahead of the others (the lagging notice, which must not wait behind the
    backlog it is about)."""

    def __init__(self) -> None:
        self._items: deque[tuple[bytes | str, float]] = deque()
        self._ready = asyncio.Event()

    def put(self, item: tuple[bytes | str, float], first: bool = False) -> None:
        if first:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> tuple[bytes | str, float]:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


#: The browser viewer's files (``harness/viewer/web``, package data), by URL path.
WEB_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
             "/index.html": ("index.html", "text/html; charset=utf-8"),
             "/viewer.js": ("viewer.js", "text/javascript; charset=utf-8")}


def web_page(path: str) -> tuple[str, str] | None:
    """(text, content type) of the browser viewer's file at URL ``path`` (its query
    ignored), or ``None`` where it names none."""
    from importlib.resources import files
    from urllib.parse import urlsplit

    entry = WEB_FILES.get(urlsplit(path).path)
    if entry is None:
        return None
    name, content_type = entry
    return (files("harness.viewer") / "web" / name).read_text(encoding="utf-8"), content_type


def _web_response(connection, request):  # websockets' types
    """The viewer page's HTTP response for a GET that asks for no WebSocket, else ``None``
    (the handshake goes on)."""
    if "websocket" in request.headers.get("Upgrade", "").lower():
        return None
    page = web_page(request.path)
    if page is None:
        return None
    text, content_type = page
    response = connection.respond(HTTPStatus.OK, text)
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = content_type
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


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
