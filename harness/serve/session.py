"""One viewer session of ``latsim serve``: its controller in a live driver on its own thread,
its generator stream state and the shaped, ordered outbox of its connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.live.driver import DriverConfig, LiveDriver
from harness.net.netclock import Shaper
from harness.net.wire import ProtocolError, dumps, encode_frame, integer, number
from harness.serve.device import SharedDevice
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig, PlaySlot, StartJob
from latsim.controller.policies import PRESETS
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.controller.timing import Timing
from latsim.plugins import (
    JobTiming,
)

if TYPE_CHECKING:
    from harness.serve.server import StreamServer


class _SessionExecutor:
    """A session's view of the shared device (:class:`harness.live.driver.QueuedExecutor`)."""

    def __init__(self, device: SharedDevice, session: Session) -> None:
        self.device, self.session = device, session

    def run_queued(self, job: StartJob, playable_until: float,
                   started: Callable[[float], None]) -> JobTiming:
        return self.device.run(self.session, job, playable_until, started)


class Session:
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
