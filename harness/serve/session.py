"""One viewer session of ``latsim serve``: its controller in a live driver on its own thread,
its generator stream state and the shaped, ordered outbox of its connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from harness.live.driver import FAILED, DriverConfig, LiveDriver
from harness.live.faults import JobFaults
from harness.live.lead import default_job_timeout
from harness.net.netclock import Shaper
from harness.net.wire import (
    Ack,
    Condition,
    End,
    Error,
    Hello,
    JobDone,
    ProtocolError,
    Ready,
    SlotHeader,
    encode_slot,
)
from harness.serve.config import ServerConfig
from harness.serve.device import SharedDevice
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig, PlaySlot, StartJob
from latsim.controller.policies import PRESETS
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.controller.timing import Timing
from latsim.plugins import GeneratorInfo, JobTiming


class SessionHost(Protocol):
    """What a session needs of its server (:class:`harness.serve.server.StreamServer`)."""

    config: ServerConfig
    leads: dict[int, Any]  # K -> LeadChoice
    info: GeneratorInfo
    device: SharedDevice | None
    generator: Any  # the LiveGenerator the device runs
    run_id: str

    def session_ended(self, session: Session) -> None: ...


class _SessionExecutor:
    """A session's view of the shared device (:class:`harness.live.driver.QueuedExecutor`)."""

    def __init__(self, device: SharedDevice, session: Session) -> None:
        self.device, self.session = device, session

    def run_queued(self, job: StartJob, playable_until: float,
                   started: Callable[[float], None]) -> JobTiming:
        return self.device.run(self.session, job, playable_until, started)

    def close(self) -> None:
        """The driver gave up on a hung job: end an injected stall now (a generator that
        really hangs keeps the device, and the other sessions' jobs time out behind it)."""
        self.session.faults.close()


class Session:
    """One viewer's stream: controller (in a live driver on its own thread), generator
    stream state, and the shaped, ordered outbox of its connection."""

    def __init__(self, server: SessionHost, session_id: str, hello: Hello,
                 send: Callable[[bytes | str, float], None], downlink: Shaper) -> None:
        self.server = server
        self.id = session_id
        # the stream a schedule sees: the number of "s<N>-<random>"
        self.index = int(session_id.lstrip("s").split("-")[0] or 0)
        self.send = send  # (message, server perf time it leaves) -> queued in order
        self.downlink = downlink
        config = server.config
        K = hello.K  # noqa: N806
        if K not in server.leads:
            raise ProtocolError(f"K={K} is not served here; choose one of "
                                f"{', '.join(map(str, sorted(server.leads)))}")
        if hello.duration > config.max_duration:
            raise ProtocolError(f"'duration' is {hello.duration:g} s, longer than this "
                                f"server's --max-duration {config.max_duration:g} s")
        self.duration = hello.duration
        model_r = server.info.r
        r = hello.r or model_r or 4
        if model_r is not None and r != model_r:
            raise ProtocolError(f"'r' is {r}, but this server's generator makes {model_r} "
                                "pixel frames per latent frame")
        if hello.fps > config.max_fps:
            raise ProtocolError(f"'fps' is {hello.fps:g}, more than this server's --max-fps "
                                f"{config.max_fps:g}")
        self.timing = Timing(K, r, hello.fps)
        choice = server.leads[K]
        self.lead = choice.lead if hello.lead is None else hello.lead
        self.lead_source = choice.source if hello.lead is None else "the viewer's hello"
        drain = hello.drain
        self.controller_config = ControllerConfig(self.timing, PRESETS[hello.policy], self.lead)
        self.policy = hello.policy
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
        self.refused_conditions = 0  # over the rate limit
        # the rate limit's token bucket: full at the start, refilled at the rate
        self._bucket = (config.max_condition_rate, time.perf_counter())
        self.faults = JobFaults(session_id)  # LATSIM_FAULT, this session's jobs
        self.job_timeout = (default_job_timeout(self.lead) if config.job_timeout is None
                            else config.job_timeout)
        self.driver = LiveDriver(
            self.controller_config, _SessionExecutor(server.device, self),
            None, DriverConfig(self.duration, drain, job_timeout_s=self.job_timeout),
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
            self.send_ready()  # nothing of the session goes before its ready
            self.send(JobDone(
                job.job_id, job.kind, job.branch, job.length, job.version,
                self.stream_to_server(job.t_start), self.stream_to_server(job.t_ready),
                None if gen is None else self.server_time(gen.t_start),
                None if gen is None else self.server_time(gen.t_end),
            ).to_json(), time.perf_counter())

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
            self.send(Ready(
                self.id, timing.K, self.policy, timing.T, timing.delta, timing.r, timing.fps,
                self.lead, self.lead_source, self.duration,
                self.server_time(self.driver.t0), server.config.schedule, server.run_id,
                server.info.as_dict(),
                {"delay": self.downlink.delay, "jitter": self.downlink.jitter,
                 "loss": self.downlink.loss},
            ).to_json(), time.perf_counter())

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
        header = SlotHeader(slot.position, slot.version, slot.job_id,
                            self.stream_to_server(slot.at), self.server_time(perf), resolves,
                            kind, list(shape),
                            {"pixels": "uint8", "latent": "float32"}.get(kind, ""))
        self.send(encode_slot(header, data), perf)

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

    def condition(self, message: Condition) -> Ack:
        """Accept a viewer's condition (on the event loop thread); the ``ack`` reply."""
        session = message.session
        if session is not None and session != self.id:
            raise ProtocolError(f"condition for session {session!r} refused: this connection "
                                f"is session {self.id!r}")
        cid = message.cid
        if not self.driver.started.is_set():
            raise ProtocolError("condition before the session's playback started")
        now = time.perf_counter()
        if now - self.driver.t0 >= self.duration:
            raise ProtocolError(f"condition {cid} after the session's {self.duration:g} s "
                                "window: not served")
        rate = self.server.config.max_condition_rate
        tokens, since = self._bucket
        tokens = min(rate, tokens + (now - since) * rate)
        if tokens < 1.0:
            self._bucket = (tokens, now)
            self.refused_conditions += 1
            raise ProtocolError(f"condition {cid} refused: more than this server's "
                                f"--max-condition-rate {rate:g} per s")
        self._bucket = (tokens - 1.0, now)
        arrival = self.driver.post_condition(cid)
        self.accepted += 1
        return Ack(cid, self.accepted, self.server_time(arrival))

    def end_messages(self) -> list[str]:
        """What ends the session: ``end`` with its status and summary, after an ``error``
        naming the reason where it failed (a generator error, a hung job)."""
        result = self.result
        if result is None:
            return [Error(f"session {self.id} failed: no result").to_json(),
                    End(FAILED, "no result").to_json()]
        summary = summarize([result.records]).as_dict()
        end = End(result.status, result.stop_reason, summary,
                  self.stream_to_server(result.end_time)).to_json()
        if result.status != FAILED:
            return [end]
        return [Error(f"session {self.id} failed: {result.stop_reason}").to_json(), end]
