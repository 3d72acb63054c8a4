"""What the diffusers generators (Wan, LTX) share: seeded noise on the device, the latent
shape of a preset at a resolution, a slot's payload, the default stream and the warm-up.

A mixin: a generator sets ``_torch``, ``device``, ``dtype``, ``preset`` (with
``in_channels`` and ``name``), ``res`` (with ``latent_h``, ``latent_w`` and ``name``) and
defines ``new_stream``, ``run_job`` and ``check_fits``; its stream states hold ``store``
(position -> latent) and ``frames`` (position -> decoded pixels). torch is never imported
here.
"""

from __future__ import annotations

from typing import Any

from harness.generators.device import out_of_memory_as_error, warm_up
from latsim.plugins import JobTiming


class TensorGenerator:
    """The shared part of a diffusers generator (see the module docstring)."""

    _torch: Any
    device: Any
    dtype: Any
    preset: Any
    res: Any
    _stream: Any

    def latent_shape(self, frames: int) -> tuple[int, int, int, int, int]:
        return (1, self.preset.in_channels, frames, self.res.latent_h, self.res.latent_w)

    def _randn(self, shape: tuple[int, ...], seed: int) -> Any:
        """Seeded standard-normal noise, drawn on the CPU (the same on every device)."""
        torch = self._torch
        gen = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randn(shape, generator=gen).to(self.device, self.dtype)

    @property
    def _store(self) -> dict[int, Any]:
        """The default stream's latents by position."""
        return self._stream.store

    def new_stream(self, K: int, keep_frames: bool = False) -> Any:  # noqa: N803
        raise NotImplementedError

    def reset_stream(self, K: int) -> None:  # noqa: N803
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
        self, K: int, untimed: int = 2, timed: int = 10, decode_group: int = 1,  # noqa: N803
        gap_s: float = 0.0,
    ) -> list[JobTiming]:
        """:func:`~harness.generators.device.warm_up`; raises :class:`LatsimError` if ``K``
        does not fit in memory (the default stream is dropped first)."""
        with out_of_memory_as_error(self._torch, self.device, K,
                                    f"preset {self.preset.name} at {self.res.name}",
                                    lambda: setattr(self, "_stream", type(self._stream)(0))):
            return warm_up(self, K, untimed, timed, decode_group, gap_s)  # type: ignore[arg-type]
