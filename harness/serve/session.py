"""One viewer session of ``latsim serve``: its controller in a live driver on its own thread,
its generator stream state and the shaped, ordered outbox of its connection.

With ``--out DIR`` the session's server side is a run folder ``DIR/<session id>``, kind
``served`` (:data:`latsim.run.folder.SERVED`), in the run-folder format of a measured run:
``config.json`` (the stream, the session, its ``server_run`` and ``server_start``, the
server-clock time of its stream time 0), the controller's record CSVs appended while it
runs by :class:`harness.live.recorder.RecordWriter` (stream time on the server's clock, the
``policy, K, run`` columns first), ``trace.jsonl`` (the conditions as they arrived) and
``summary.json`` at the end. The shared device's tasks go to the server's ``tasks.csv``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from harness.live.driver import FAILED, DriverConfig, LiveDriver
from harness.live.faults import JobFaults
from harness.live.lead import default_job_timeout
from harness.live.recorder import RecordWriter
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
from harness.serve.bucket import TokenBucket
from harness.serve.config import ServerConfig
from harness.serve.device import SharedDevice
from latsim.analysis.metrics import summarize
from latsim.controller import ControllerConfig, PlaySlot, StartJob
from latsim.controller.policies import PRESETS
from latsim.controller.records import ConditionRecord, JobRecord
from latsim.controller.timing import Timing
from latsim.model.traces import write_trace
from latsim.plugins import GeneratorInfo, JobTiming
from latsim.run.folder import SERVED, RunIdentity, run_config, summary_row, write_json
from latsim.writing import writing

log = logging.getLogger("latsim.serve")


class SessionHost(Protocol):
    """What a session needs of its server (:class:`harness.serve.server.StreamServer`)."""

    config: ServerConfig
    leads: dict[int, Any]  # K -> LeadChoice
    info: GeneratorInfo
    device: SharedDevice | None
    generator: Any  # the LiveGenerator the device runs
    run_id: str

    def session_ended(self, session: Session) -> None: ...

    def device_task(self, session: Session, job: StartJob, t_enqueue: float,
                    t_start: float, t_end: float) -> None: ...


class _SessionExecutor:
    """A session's view of the shared device (:class:`harness.live.driver.QueuedExecutor`)."""

    def __init__(self, device: SharedDevice, session: Session) -> None:
        self.device, self.session = device, session

    def run_queued(self, job: StartJob, playable_until: float,
                   started: Callable[[float], None]) -> JobTiming:
        t_enqueue = time.perf_counter()
        taken: list[float] = []

        def on_start(t: float) -> None:  # the device took a job that waited
            taken.append(t)
            started(t)

        timing = self.device.run(self.session, job, playable_until, on_start)
        # one that did not wait was taken as its generator started (a stall's start is the
        # time it was taken)
        self.session.server.device_task(self.session, job, t_enqueue,
                                        taken[0] if taken else timing.t_start, timing.t_end)
        return timing

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
        K = hello.K
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
        self.drain = drain  # None: the simulator's default drain
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
        self._bucket = TokenBucket(config.max_condition_rate, config.max_condition_rate,
                                   time.perf_counter())
        self.faults = JobFaults(session_id)  # LATSIM_FAULT, this session's jobs
        self.job_timeout = (default_job_timeout(self.lead) if config.job_timeout is None
                            else config.job_timeout)
        self.driver = LiveDriver(
            self.controller_config, _SessionExecutor(server.device, self),
            None, DriverConfig(self.duration, drain, job_timeout_s=self.job_timeout),
            on_record=self._on_record, on_play=self._on_play, on_job=self._on_job)
        self.result = None
        self.folder: Path | None = None  # with --out: its server-side run folder
        self.writer: RecordWriter | None = None
        if config.out is not None:
            self._open_folder(config.out / session_id)
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
        if self.writer is not None:
            self.writer(record)
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
                self.controller_config.bind,
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
            try:
                self._close_folder()
            except Exception as exc:  # noqa: BLE001 - the viewer still gets its end
                log.warning("session %s: its run folder: %s", self.id, exc)
            self.server.session_ended(self)

    # ------------------------------------------------------------ the run folder (--out)

    def _folder_config(self, **extra: Any) -> dict:
        server = self.server
        return {**run_config(self.controller_config, self.duration, "measured"),
                "kind": SERVED, "session": self.id, "server_run": server.run_id,
                "schedule": server.config.schedule, "generator": server.info.as_dict(),
                "lead_source": self.lead_source, "bind": self.controller_config.bind,
                "drain": self.drain, "job_timeout_s": self.job_timeout, "records_clock": (
                    "stream time on the server's clock: server time minus server_start"),
                "started_at": self._started_at, **extra}

    def _open_folder(self, folder: Path) -> None:
        self.folder = folder
        self._started_at = _dt.datetime.now().isoformat(timespec="seconds")
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "config.json", self._folder_config())
        self.writer = RecordWriter(folder, (("policy", self.policy), ("K", self.timing.K),
                                            ("run", 0)))
        self.writer.start()

    def folder_started(self) -> None:
        """Once playback started: its server-clock start goes into config.json (a folder
        left by a killed server can still be matched and placed on the device's clock)."""
        if self.folder is not None:
            with writing(self.folder / "config.json"):
                write_json(self.folder / "config.json", self._folder_config(
                    server_start=self.server_time(self.driver.t0)))

    def _close_folder(self) -> None:
        """The records written, then the trace of arrivals, the summary and the final
        config (the measured run's order: config.json says running until the end)."""
        if self.writer is None or self.folder is None:
            return
        self.writer.close()
        folder, result = self.folder, self.result
        started = self.driver.started.is_set()
        start = {"server_start": self.server_time(self.driver.t0)} if started else {}
        if result is None:
            write_json(folder / "config.json", self._folder_config(
                **start, status=FAILED, stop_reason="no result"))
            return
        arrivals = sorted(c.t_arrival for c in result.records.conditions)
        with writing(folder / "trace.jsonl"):
            write_trace(folder / "trace.jsonl", arrivals,
                        {"duration": self.duration, "source": f"viewer of session {self.id}"})
        run_c = [j.wall_s for j in result.jobs]
        identity = RunIdentity.of(self.controller_config, f"live:{self.server.info.label}",
                                  sum(run_c) / len(run_c) if run_c else float("nan"),
                                  f"viewer:{self.id}", self.duration, None)
        summary = summary_row(identity, summarize([result.covered()]).as_dict(),
                              session=self.id, server_run=self.server.run_id,
                              status=result.status, stop_reason=result.stop_reason,
                              end_time=result.end_time,
                              n_conditions_refused=self.refused_conditions)
        with writing(folder / "summary.json"):
            write_json(folder / "summary.json", summary)
        status = FAILED if self.writer.error is not None else result.status
        with writing(folder / "config.json"):
            write_json(folder / "config.json", self._folder_config(
                **start, status=status,
                stop_reason=self.writer.error or result.stop_reason,
                end_time=result.end_time))

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
        if not self._bucket.take(now):
            self.refused_conditions += 1
            raise ProtocolError(f"condition {cid} refused: more than this server's "
                                f"--max-condition-rate {self._bucket.rate:g} per s")
        arrival = self.driver.post_condition(cid)
        self.accepted += 1
        return Ack(cid, self.accepted, self.server_time(arrival))

    def condition_wait(self, now: float) -> float:
        """Seconds from ``now`` (``time.perf_counter``) until the rate limit admits another
        condition: how long the server leaves a flooding viewer's messages unread."""
        return self._bucket.wait(now)

    def end_messages(self) -> list[str]:
        """What ends the session: ``end`` with its status and summary, after an ``error``
        naming the reason where it failed (a generator error, a hung job)."""
        result = self.result
        if result is None:
            return [Error(f"session {self.id} failed: no result").to_json(),
                    End(FAILED, "no result").to_json()]
        summary = summarize([result.covered()]).as_dict()  # as summary.json: the covered window
        end = End(result.status, result.stop_reason, summary,
                  self.stream_to_server(result.end_time)).to_json()
        if result.status != FAILED:
            return [end]
        return [Error(f"session {self.id} failed: {result.stop_reason}").to_json(), end]
