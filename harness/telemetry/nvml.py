"""GPU telemetry: NVML utilisation samples with timestamps, reduced to kernel activity.

NVML's GPU utilisation is "percent of time over the past sample period during which one or
more kernels was executing". :class:`NvmlSampler` collects the driver's own timestamped
samples with ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` (package
``nvidia-ml-py``, import name ``pynvml``) and polls ``nvmlDeviceGetUtilizationRates``
while the driver keeps none, or stops delivering them (for longer than a few read periods:
some drivers keep no samples while the GPU idles).

- **Clock base.** The driver's sample timestamps are microseconds on *its* clock, which on
  Linux need not be the unix clock (reports give boot time). The base is found from the
  first samples returned: the unix clock if they are near it, else ``CLOCK_BOOTTIME`` or
  ``CLOCK_MONOTONIC`` if they are near one of those (an exact offset from reading both
  clocks at once), else estimated from the newest sample, which is at most one driver
  period old (refined at every read).
- **Gaps.** :func:`coverage` weighs each sample over the time since the previous one, but
  never more than one sampling period (1.5 periods of spacing still count as contiguous,
  for jitter): a stretch with no samples is a *gap*, counted as idle (a driver that stops
  sampling is idle) and reported: number of gaps, uncovered seconds, and the activity over
  the sampled time alone. Without the cap, an idle stretch with no samples took the value
  of the next busy sample (1 s busy + 4 s unsampled idle read 100 % instead of 23 %).
- **Device.** The torch device (a logical index, after ``CUDA_VISIBLE_DEVICES``) is mapped
  to its NVML handle by UUID, else PCI bus id (``torch.cuda.get_device_properties``), else
  the ``CUDA_VISIBLE_DEVICES`` entry, else the same index (said so in the note).
- **Other processes.** Per-process SM utilisation (``nvmlDeviceGetProcessUtilization``) or,
  failing that, the processes holding a compute context
  (``nvmlDeviceGetComputeRunningProcesses``) say whether any process but this one used the
  GPU in the window; when NVML cannot tell (not supported, or its pids are not ours: a pid
  namespace), the answer is "unknown".

Without NVML (no package, no driver, no GPU, or a CPU run) kernel activity is ``None`` with
a note saying why: never a made-up number, never a crash.

The reduction of the samples is :mod:`harness.telemetry.reduce`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

from harness.telemetry.reduce import (
    CLOCK_MATCH_AGE_S,
    NVML_MIN_PERIOD_S,
    UNIX_BASE_TOLERANCE_S,
    KernelActivity,
    UtilSample,
    coverage,
)


def _visible_entry(device_index: int, environ: Mapping[str, str]) -> str | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",") if e.strip()]
    return entries[device_index] if 0 <= device_index < len(entries) else None


def _uuid_candidates(uuid: str) -> list[str]:
    text = uuid.strip()
    if text.startswith(("GPU-", "MIG-")):
        return [text]
    return [f"GPU-{text}", f"MIG-{text}", text]


def resolve_device(nvml, device_index: int, environ: Mapping[str, str] | None = None,
                   torch_module=None) -> tuple[object, str]:
    """The NVML handle of torch's CUDA device ``device_index`` and how it was found.

    By the device's UUID, else its PCI bus id (from ``torch.cuda.get_device_properties``,
    when torch is loaded and sees CUDA), else the ``CUDA_VISIBLE_DEVICES`` entry (a UUID, or
    an index: NVML's order is the PCI order, CUDA's only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``),
    else NVML's device ``device_index``. Raises what NVML raises if even that fails.
    """
    environ = os.environ if environ is None else environ
    torch = sys.modules.get("torch") if torch_module is None else torch_module
    props = None
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(device_index)
    if props is not None:
        uuid = getattr(props, "uuid", None)
        if uuid is not None and hasattr(nvml, "nvmlDeviceGetHandleByUUID"):
            for candidate in _uuid_candidates(str(uuid)):
                with contextlib.suppress(Exception):
                    return nvml.nvmlDeviceGetHandleByUUID(candidate), f"uuid {candidate}"
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None and hasattr(nvml, "nvmlDeviceGetHandleByPciBusId"):
            domain = getattr(props, "pci_domain_id", 0) or 0
            device = getattr(props, "pci_device_id", 0) or 0
            bus_id = f"{domain:08X}:{bus:02X}:{device:02X}.0"
            with contextlib.suppress(Exception):
                return nvml.nvmlDeviceGetHandleByPciBusId(bus_id), f"pci {bus_id}"
    entry = _visible_entry(device_index, environ)
    if entry is not None:
        if entry.startswith(("GPU-", "MIG-")) and hasattr(nvml, "nvmlDeviceGetHandleByUUID"):
            with contextlib.suppress(Exception):
                return (nvml.nvmlDeviceGetHandleByUUID(entry),
                        f"CUDA_VISIBLE_DEVICES uuid {entry}")
        elif entry.isdigit():
            order = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
            how = f"CUDA_VISIBLE_DEVICES index {entry}"
            if order != "PCI_BUS_ID":
                how += f" (assumed: CUDA_DEVICE_ORDER={order} may differ from NVML's order)"
            return nvml.nvmlDeviceGetHandleByIndex(int(entry)), how
    return (nvml.nvmlDeviceGetHandleByIndex(device_index),
            f"index {device_index} (assumed: NVML's index = torch's)")


def clock_offsets() -> dict[str, float]:
    """Unix time minus each reference clock NVML may stamp samples with, read now."""
    out = {}
    for name in ("CLOCK_BOOTTIME", "CLOCK_MONOTONIC"):
        clock_id = getattr(time, name, None)
        if clock_id is None:
            continue
        with contextlib.suppress(OSError):
            out[name] = time.time() - time.clock_gettime(clock_id)
    return out


class NvmlSampler:
    """Background sampling of one GPU's utilisation while a run goes.

    ``start()`` never raises: if NVML cannot be used, :attr:`available` is False and
    :attr:`note` says why. ``clock`` (unix seconds) and ``offsets`` (see
    :func:`clock_offsets`) are injectable for tests; ``start(background=False)`` runs no
    thread, and :meth:`tick` then takes one sampling step.
    """

    def __init__(self, device_index: int = 0, period_s: float = 0.5, poll_s: float = 0.05,
                 fallback_after_s: float | None = None,
                 clock: Callable[[], float] = time.time,
                 offsets: Callable[[], dict[str, float]] = clock_offsets) -> None:
        self.device_index = device_index
        self.period_s = period_s
        self.poll_s = poll_s
        self.fallback_after_s = 4 * period_s if fallback_after_s is None else fallback_after_s
        self.available = False
        self.note: str | None = None
        self.device: str | None = None  # NVML device and how it was found
        self.clock_base: str | None = None  # unix, CLOCK_BOOTTIME, CLOCK_MONOTONIC, estimated
        self._clock = clock
        self._offsets = offsets
        self._nvml = None
        self._handle = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # driver samples: raw timestamps (driver clock, us) until the base is known
        self._raw: list[tuple[int, float]] = []
        self._offset: float | None = None  # unix seconds = raw / 1e6 + offset
        self._period_cache: tuple[int, float | None] = (0, None)
        self._last_raw: int | None = None
        self._reads = 0
        self._samples_ok = True  # False once nvmlDeviceGetSamples fails for good
        self._samples_error: str | None = None
        self._last_new = 0.0
        self._next_read = 0.0
        self._polled: list[UtilSample] = []
        self._polling = False
        # other processes
        self._proc: list[tuple[int, int, float]] = []  # (raw ts, pid, sm %)
        self._proc_last: int | None = None
        self._proc_util: bool | None = None  # per-process utilisation supported
        self._running: list[tuple[float, frozenset[int]]] = []
        self._running_ok: bool | None = None

    # ------------------------------------------------------------ life cycle

    def start(self, background: bool = True) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, driver missing
            self._unavailable("NVML unavailable", exc)
            return
        try:
            self._handle, how = resolve_device(pynvml, self.device_index)
        except Exception as exc:  # noqa: BLE001 - no such device
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            self._unavailable(f"NVML unavailable: no device for cuda:{self.device_index}", exc)
            return
        self._nvml = pynvml
        self.device = self._describe(how)
        self.available = True
        now = self._clock()
        self._last_new = self._next_read = now
        self.tick(now)
        if background:
            self._thread = threading.Thread(target=self._loop, name="latsim-nvml", daemon=True)
            self._thread.start()

    def _unavailable(self, what: str, exc: Exception) -> None:
        self.available = False
        self.note = f"{what} ({type(exc).__name__}: {exc})".replace("\n", " ")

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2.0)
            self._thread = None
        if self._nvml is not None:
            now = self._clock()
            if self._samples_ok:
                self._read_samples(now)
            self._read_processes(now)
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.poll_s if self._polling else self.period_s)

    def tick(self, now: float | None = None) -> None:
        """One sampling step at ``now`` (unix s): read the driver's samples and the
        processes once per period; poll while the driver's samples are silent."""
        if self._nvml is None:
            return
        now = self._clock() if now is None else now
        if now >= self._next_read:
            self._next_read = now + self.period_s
            if self._samples_ok and self._read_samples(now):
                self._last_new = now
            self._read_processes(now)
        silent = not self._samples_ok or now - self._last_new > self.fallback_after_s
        if silent:
            self._poll(now)
        self._polling = silent

    # ------------------------------------------------------------ reading NVML

    def _describe(self, how: str) -> str:
        name = uuid = None
        with contextlib.suppress(Exception):
            name = self._nvml.nvmlDeviceGetName(self._handle)
        with contextlib.suppress(Exception):
            uuid = self._nvml.nvmlDeviceGetUUID(self._handle)
        label = " ".join(str(p) for p in (name, uuid) if p) or "NVML device"
        return f"{label} (found by {how})"

    def _not_found(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == getattr(self._nvml, "NVML_ERROR_NOT_FOUND", -1)

    def _read_samples(self, now: float) -> int:
        """Read the driver's new samples; returns how many. Marks samples unusable on an
        error other than "none yet"."""
        nvml = self._nvml
        if self._offset is None:
            # first read: the unix clock (a unix-clock driver answers); later, while the
            # base is unknown, the whole buffer (a driver on another clock answers)
            last = int(now * 1e6) if self._reads == 0 else 0
        else:
            last = self._last_raw or 0
        self._reads += 1
        try:
            _, raw = nvml.nvmlDeviceGetSamples(self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                               last)
        except Exception as exc:  # noqa: BLE001 - NVMLError, or a missing function
            if self._not_found(exc):
                return 0
            self._samples_ok = False
            self._samples_error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            return 0
        new = []
        for sample in raw:
            ts = int(sample.timeStamp)
            if ts > last and (self._last_raw is None or ts > self._last_raw):
                new.append((ts, float(sample.sampleValue.uiVal)))
        if not new:
            return 0
        newest = max(ts for ts, _ in new)
        self._place(newest, now)
        with self._lock:
            self._raw.extend(new)
        self._last_raw = max(self._last_raw or 0, newest)
        return len(new)

    def _place(self, newest_raw: int, now: float) -> None:
        """Find (or refine) the driver clock's offset from its newest sample read at ``now``."""
        newest = newest_raw / 1e6
        if self._offset is not None:
            if self.clock_base == "estimated":  # a sample is never newer than now
                self._offset = min(self._offset, now - newest)
            return
        if abs(newest - now) <= UNIX_BASE_TOLERANCE_S:
            self._offset, self.clock_base = 0.0, "unix"
            return
        for name, offset in self._offsets().items():
            if now - CLOCK_MATCH_AGE_S <= newest + offset <= now + 1.0:
                self._offset, self.clock_base = offset, name
                return
        self._offset, self.clock_base = now - newest, "estimated"

    def _poll(self, now: float) -> None:
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            value = float(rates.gpu)
        except Exception:  # noqa: BLE001 - not supported, or a missing function
            return
        period = max(self.poll_s, self._driver_period() or NVML_MIN_PERIOD_S)
        with self._lock:
            self._polled.append(UtilSample(now, value, period))

    def _read_processes(self, now: float) -> None:
        nvml = self._nvml
        if self._proc_util is not False:
            try:
                raw = nvml.nvmlDeviceGetProcessUtilization(self._handle, self._proc_last or 0)
            except Exception as exc:  # noqa: BLE001
                if self._not_found(exc):
                    self._proc_util = True
                    self._proc_last = self._proc_last or 0
                else:
                    self._proc_util = False
            else:
                self._proc_util = True
                baseline = self._proc_last is None  # the buffer from before the start
                newest = self._proc_last or 0
                rows = []
                for sample in raw:
                    ts = int(sample.timeStamp)
                    newest = max(newest, ts)
                    if not baseline and ts > (self._proc_last or 0):
                        rows.append((ts, int(sample.pid), float(sample.smUtil)))
                with self._lock:
                    self._proc.extend(rows)
                self._proc_last = newest
        if self._running_ok is not False:
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            except Exception:  # noqa: BLE001
                self._running_ok = False
            else:
                self._running_ok = True
                with self._lock:
                    self._running.append((now, frozenset(int(p.pid) for p in procs)))

    # ------------------------------------------------------------ results

    def _driver_period(self) -> float | None:
        """The driver's sampling period: the (upper) median spacing of its samples."""
        with self._lock:
            if self._period_cache[0] != len(self._raw):
                raw = sorted(ts for ts, _ in self._raw)
                gaps = sorted(b - a for a, b in zip(raw, raw[1:], strict=False) if b > a)
                period = gaps[len(gaps) // 2] / 1e6 if gaps else None
                self._period_cache = (len(self._raw), period)
            return self._period_cache[1]

    @property
    def samples(self) -> list[UtilSample]:
        """Every sample so far on the unix clock, in time order (the driver's while its
        clock base is unknown are left out)."""
        period = self._driver_period()
        with self._lock:
            raw, polled = list(self._raw), list(self._polled)
        out = list(polled)
        if self._offset is not None:
            out += [UtilSample(ts / 1e6 + self._offset, value, period) for ts, value in raw]
        return sorted(out, key=lambda s: s.t_unix)

    @property
    def source(self) -> str | None:
        """Where the samples came from."""
        if not self.available:
            return None
        with self._lock:
            driver, polled = bool(self._raw), bool(self._polled)
        if driver and polled:
            return "nvml-samples+polling"
        if polled or not self._samples_ok:
            return "nvml-polling"
        return "nvml-samples"

    def other_processes(self, t_begin_unix: float, t_end_unix: float
                        ) -> tuple[bool | None, str]:
        """Whether a process other than this one used the GPU in the window, and how that
        is known (or why not)."""
        own = os.getpid()
        with self._lock:
            proc, running = list(self._proc), list(self._running)
        if self._proc_util:
            if self._offset is not None:
                lo, hi = t_begin_unix - self._offset, t_end_unix - self._offset
                proc = [p for p in proc if lo <= p[0] / 1e6 <= hi]
                scope = "in the window"
            else:
                scope = "during sampling (window unknown: driver clock base not found)"
            active = {pid for _, pid, sm in proc if sm > 0}
            evidence = "per-process SM utilisation"
        elif self._running_ok:
            active = set()
            scope = "in the window"
            evidence = "processes holding a compute context"
        else:
            return None, "unknown: NVML offers no per-process query on this device"
        holders = set().union(*(pids for t, pids in running if t_begin_unix <= t <= t_end_unix))
        seen = active | holders
        others = sorted((active if self._proc_util else holders) - {own})
        if not seen:
            return None, f"unknown: NVML reported no process ({evidence}), not even this one"
        if own not in seen:
            if len(seen) == 1:
                return None, (f"unknown: NVML saw one process (pid {min(seen)}) but not this "
                              f"one (pid {own}; a pid namespace?) ({evidence})")
            return True, (f"yes: {len(seen)} processes used the GPU {scope} (pids "
                          f"{sorted(seen)}; this one is pid {own}) ({evidence})")
        if others:
            return True, f"yes: pids {others} used the GPU {scope} ({evidence})"
        return False, f"no: only this process used the GPU {scope} ({evidence})"

    def activity(self, t_begin_unix: float, t_end_unix: float) -> KernelActivity:
        """Kernel activity over ``[t_begin, t_end]`` (unix seconds)."""
        if not self.available:
            return KernelActivity(None, self.note or "NVML was not started", None, 0)
        samples = self.samples
        found = coverage(samples, t_begin_unix, t_end_unix)
        inside = sum(1 for s in samples if t_begin_unix <= s.t_unix <= t_end_unix)
        others, others_note = self.other_processes(t_begin_unix, t_end_unix)
        notes = []
        if found.percent is None:
            reason = "NVML returned no utilisation samples in the window"
            if self._samples_error:
                reason += f" (samples: {self._samples_error})"
            if self._raw and self._offset is None:
                reason += " (the driver's clock base was not found)"
            notes.append(reason)
        elif found.n_gaps:
            notes.append(
                f"{found.n_gaps} gap(s) without samples, {found.uncovered_s:.2f} s of "
                f"{t_end_unix - t_begin_unix:.2f} s, counted idle; "
                f"{found.percent_covered:.1f}% over the sampled time")
        with self._lock:
            polled, raw = bool(self._polled), bool(self._raw)
        if polled:
            why = (f"nvmlDeviceGetSamples failed: {self._samples_error}" if self._samples_error
                   else f"driver samples silent for > {self.fallback_after_s:g} s")
            notes.append(f"polled nvmlDeviceGetUtilizationRates ({why})")
        if raw and self.clock_base not in (None, "unix"):
            notes.append(f"driver timestamps on {self.clock_base}")
        notes.append(f"other processes: {others_note}")
        if self.device:
            notes.append(f"device: {self.device}")
        return KernelActivity(found.percent, "; ".join(notes), self.source, inside,
                              found.uncovered_s, found.n_gaps, found.percent_covered, others,
                              self.device)
