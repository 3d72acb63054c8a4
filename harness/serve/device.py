"""The shared device of ``latsim serve``: one generator, its jobs run one at a time for every
session, in the order of the schedule plug-in (:mod:`latsim.model.schedules`: the same
implementation the serving simulator picks with). A job that waited tells its controller
when the device took it, so the wait counts in R as simulated. A session's ``LATSIM_FAULT``
faults (:class:`harness.live.faults.JobFaults`) act as its job takes the device; a job's
error goes to its own session only, and the device goes on with the others' jobs.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from harness.live.faults import JobFaults
from latsim.controller import StartJob
from latsim.errors import LatsimError
from latsim.plugins import (
    JobTiming,
    LiveGenerator,
    Schedule,
    load_schedule,
    take_next,
)


class DeviceStream(Protocol):
    """What the device needs of a session (:class:`harness.serve.session.Session`): the
    stream index a schedule sees, its generator stream state and where its slots' payloads
    go."""

    index: int
    stream: Any
    payloads: dict[tuple[int, int], tuple[str, tuple[int, ...], bytes]]
    faults: JobFaults  # its LATSIM_FAULT faults, counting its jobs


@dataclass(eq=False)
class QueuedJob:
    """One job waiting for (or running on) the device; the schedule sees it as a
    :class:`latsim.plugins.WaitingTask`."""

    session: DeviceStream
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
    overtaken_by: set[int] | None = None  # the streams that overtook it (take_next)

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
        self._waiting: list[QueuedJob] = []
        self._busy = False
        self._stopped = False
        self._seq = itertools.count()
        self.jobs_run = 0
        # held while the generator works: by the device thread for a job, by whoever else
        # touches the generator (a new session's stream state)
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="latsim-device", daemon=True)
        self._thread.start()

    def run(self, session: DeviceStream, job: StartJob, playable_until: float,
            started: Callable[[float], None]) -> JobTiming:
        """Queue ``job`` of ``session`` and block until it ran."""
        with self._cond:
            if self._stopped:
                raise RuntimeError("the server's device has stopped")
            request = QueuedJob(session, job, playable_until, next(self._seq),
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

    def _pick(self) -> QueuedJob:
        """The waiting job the schedule names (the one implementation the simulator uses
        too); a schedule that fails stops the device with that error for every job."""
        now = time.perf_counter()
        for request in self._waiting:
            request.picked_at = now  # the time their slack is read at
        return take_next(self._waiting, self.schedule, now)

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
                    t_taken = time.perf_counter()
                    if request.waited:
                        request.started(t_taken)
                    session = request.session
                    delayed = session.faults.before()
                    request.timing = self.generator.run_job(request.job, self.decode_group,
                                                            session.stream)
                    if delayed:  # an injected stall or slowdown counts in its time
                        request.timing = replace(request.timing, t_start=t_taken)
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
