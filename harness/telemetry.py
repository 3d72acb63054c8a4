"""GPU telemetry: NVML utilisation samples with timestamps, reduced to kernel activity.

NVML's GPU utilisation is "percent of time over the past sample period during which one or
more kernels was executing". :class:`NvmlSampler` collects the driver's own timestamped
samples with ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` (package
``nvidia-ml-py``, import name ``pynvml``), falling back to polling
``nvmlDeviceGetUtilizationRates`` when the driver does not keep samples.
:func:`time_weighted_activity` turns samples into one percentage over a window: each sample
covers the interval since the previous one, clipped to the window, weighted by its length.

Without NVML (no package, no driver, no GPU, or a CPU run) kernel activity is ``None`` with
a note saying why: never a made-up number.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UtilSample:
    """One utilisation sample: unix time (seconds) and percent busy over the period before."""

    t_unix: float
    percent: float


@dataclass(frozen=True)
class KernelActivity:
    """Time-weighted kernel activity over a window, or why it is unavailable."""

    percent: float | None
    note: str | None
    source: str | None  # "nvml-samples", "nvml-polling" or None
    n_samples: int


class NvmlSampler:
    """Background sampling of one GPU's utilisation while a run goes.

    ``start()`` never raises: if NVML cannot be used, :attr:`available` is False and
    :attr:`note` says why.
    """

    def __init__(self, device_index: int = 0, period_s: float = 0.5,
                 poll_s: float = 0.05) -> None:
        self.device_index = device_index
        self.period_s = period_s
        self.poll_s = poll_s
        self.available = False
        self.note: str | None = None
        self.source: str | None = None
        self.samples: list[UtilSample] = []
        self._nvml = None
        self._handle = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ts = 0

    def start(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, driver missing
            self.available = False
            self.note = f"NVML unavailable ({type(exc).__name__}: {exc})".replace("\n", " ")
            return
        self.available = True
        self._last_ts = int(time.time() * 1e6)
        self.source = "nvml-samples" if self._read_samples() is not None else "nvml-polling"
        self._thread = threading.Thread(target=self._loop, name="latsim-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2.0)
            self._thread = None
            if self.source == "nvml-samples":
                self._read_samples()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def _read_samples(self) -> list[UtilSample] | None:
        """New buffered samples since the last read; None if the driver keeps none."""
        nvml = self._nvml
        try:
            _, raw = nvml.nvmlDeviceGetSamples(
                self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_ts
            )
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", -1):
                return []  # no new samples yet
            return None
        new = []
        for sample in raw:
            ts = int(sample.timeStamp)
            if ts <= self._last_ts:
                continue
            new.append(UtilSample(ts / 1e6, float(sample.sampleValue.uiVal)))
        if new:
            self._last_ts = max(int(s.t_unix * 1e6) for s in new)
            self.samples.extend(new)
        return new

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.source == "nvml-samples":
                if self._read_samples() is None:
                    self.source = "nvml-polling"
                self._stop.wait(self.period_s)
            else:
                try:
                    rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
                    self.samples.append(UtilSample(time.time(), float(rates.gpu)))
                except Exception:  # noqa: BLE001
                    pass
                self._stop.wait(self.poll_s)

    def activity(self, t_begin_unix: float, t_end_unix: float) -> KernelActivity:
        """Kernel activity over ``[t_begin, t_end]`` (unix seconds)."""
        if not self.available:
            return KernelActivity(None, self.note or "NVML was not started", None, 0)
        percent = time_weighted_activity(self.samples, t_begin_unix, t_end_unix)
        inside = sum(1 for s in self.samples if t_begin_unix <= s.t_unix <= t_end_unix)
        if percent is None:
            return KernelActivity(None, "NVML returned no utilisation samples in the window",
                                  self.source, inside)
        return KernelActivity(percent, None, self.source, inside)


def time_weighted_activity(
    samples: Sequence[UtilSample], t_begin: float, t_end: float
) -> float | None:
    """Time-weighted mean of utilisation samples over ``[t_begin, t_end]``.

    Sample ``i`` stands for ``(t_{i-1}, t_i]``; the first one for the median sample spacing
    before it. Parts outside the window are clipped. None if no sample overlaps the window.
    """
    ordered = sorted(samples, key=lambda s: s.t_unix)
    if not ordered or t_end <= t_begin:
        return None
    gaps = sorted(b.t_unix - a.t_unix for a, b in zip(ordered, ordered[1:], strict=False))
    first_span = gaps[len(gaps) // 2] if gaps else 0.0
    total = weight = 0.0
    prev = ordered[0].t_unix - first_span
    for sample in ordered:
        lo, hi = max(prev, t_begin), min(sample.t_unix, t_end)
        if hi > lo:
            total += sample.percent * (hi - lo)
            weight += hi - lo
        prev = sample.t_unix
    if weight <= 0:
        return None
    return total / weight


def unavailable(reason: str) -> KernelActivity:
    """Kernel activity that was not measured, with the reason."""
    return KernelActivity(None, reason, None, 0)
