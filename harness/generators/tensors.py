"""What the diffusers generators (Wan, LTX) share: seeded noise on the device, the latent
shape of a preset at a resolution, a slot's payload, the default stream and the warm-up.

A mixin: a generator sets ``_torch``, ``device``, ``dtype``, ``preset`` (with
``in_channels`` and ``name``), ``res`` (with ``latent_h``, ``latent_w`` and ``name``) and
defines ``new_stream``, ``run_job`` and ``check_fits``; its stream states hold ``store``
(position -> latent) and ``frames`` (position -> decoded pixels). torch is never imported
here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.generators.device import DEVICES, out_of_memory_as_error, warm_up
from latsim.controller import StartJob
from latsim.errors import LatsimError, check_option
from latsim.plugins import JobTiming


def check_model_options(steps: int, context: int, device: str, threads: int | None) -> None:
    """The options every model generator takes, in :data:`latsim.errors.OPTION_BOUNDS`."""
    for option, value in (("--steps", steps), ("--context", context),
                          ("--threads", threads)):
        check_option(option, value)
    if device not in DEVICES:
        raise LatsimError(f"unknown device {device!r}; choose cpu or cuda")


@dataclass
class JobClock:
    """A job's wall-clock start and end (``perf_counter``) and, on CUDA, its event time."""

    t_start: float = 0.0
    t_end: float = 0.0
    device_s: float | None = None


class TensorGenerator:
    """The shared part of a diffusers generator (see the module docstring)."""

    _torch: Any
    device: Any
    dtype: Any
    preset: Any
    res: Any
    config: Any  # with ``context``: the clean prefix latents a job may be fed
    _stream: Any

    def latent_shape(self, frames: int) -> tuple[int, int, int, int, int]:
        return (1, self.preset.in_channels, frames, self.res.latent_h, self.res.latent_w)

    def _randn(self, shape: tuple[int, ...], seed: int) -> Any:
        """Seeded standard-normal noise, drawn on the CPU (the same on every device)."""
        torch = self._torch
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randn(shape, generator=gen).to(self.device, self.dtype)

    def _context_length(self, store: dict[int, Any], job: StartJob) -> int:
        """The clean latents just before the branch a job is fed: at most ``context``, as
        many as the controller says exist, and those the store still holds."""
        n_ctx = 0
        limit = min(self.config.context, job.context, job.branch)
        while n_ctx < limit and (job.branch - n_ctx - 1) in store:
            n_ctx += 1
        return n_ctx

    def _forget_stale(self, stream: Any, job: StartJob) -> None:
        """Drop latents and pixels no later job can use as context (or a server send)."""
        stale = job.branch - 2 * job.length - self.config.context
        for pos in [p for p in stream.store if p < stale]:
            del stream.store[pos]
        for pos in [p for p in stream.frames if p < stale]:
            del stream.frames[pos]

    @contextmanager
    def _clock(self) -> Iterator[JobClock]:
        """Time the block on the wall clock and, on CUDA, with events (synchronized)."""
        clock = JobClock(time.perf_counter())
        cuda = self.device.type == "cuda"
        if cuda:
            ev_start = self._torch.cuda.Event(enable_timing=True)
            ev_end = self._torch.cuda.Event(enable_timing=True)
            ev_start.record()
        yield clock
        if cuda:
            ev_end.record()
            ev_end.synchronize()
            clock.device_s = ev_start.elapsed_time(ev_end) / 1000.0
        clock.t_end = time.perf_counter()

    @property
    def _store(self) -> dict[int, Any]:
        """The default stream's latents by position."""
        return self._stream.store

    def new_stream(self, K: int, keep_frames: bool = False) -> Any:
        raise NotImplementedError

    def reset_stream(self, K: int) -> None:
        """Start a new default stream (:meth:`new_stream`)."""
        self._stream = self.new_stream(K)

    def payload(self, stream: Any, position: int) -> tuple[str, tuple[int, ...], bytes]:
        """What a server sends for one slot: the decoded pixels of ``position`` where they
        were decoded (``pixels``: uint8, (frames, H, W, 3)), else its latent (``latent``:
        float32, (C, H, W)). Call it from the thread that runs the jobs (a device copy)."""
        frames = stream.frames.get(position)
        if frames is not None:
            pixels = ((frames[0].float().clamp(-1, 1) + 1) * 127.5).round()
            array = pixels.to(self._torch.uint8).permute(1, 2, 3, 0).contiguous().cpu().numpy()
            return "pixels", tuple(array.shape), array.tobytes()
        latent = stream.store[position][0, :, 0].float().contiguous().cpu().numpy()
        return "latent", tuple(latent.shape), latent.tobytes()

    def warmup(
        self, K: int, untimed: int = 2, timed: int = 10, decode_group: int = 1,
        gap_s: float = 0.0,
    ) -> list[JobTiming]:
        """:func:`~harness.generators.device.warm_up`; raises :class:`LatsimError` if ``K``
        does not fit in memory (the default stream is dropped first)."""
        with out_of_memory_as_error(self._torch, self.device, K,
                                    f"preset {self.preset.name} at {self.res.name}",
                                    lambda: setattr(self, "_stream", type(self._stream)(0))):
            return warm_up(self, K, untimed, timed, decode_group, gap_s)  # type: ignore[arg-type]
