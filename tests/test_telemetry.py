"""NVML telemetry without a GPU: a fake ``pynvml`` module with its own clock and driver.

The fake driver keeps utilisation samples every ``period`` seconds on a clock of its choice
(boot time, like Linux drivers are reported to, or the unix clock), optionally none while
the GPU idles; ``nvmlDeviceGetUtilizationRates`` answers the current value; per-process
utilisation and compute processes are scripted. The sampler runs on a fake unix clock and is
ticked by hand (``start(background=False)``), so every test is deterministic.
"""

from __future__ import annotations

import math
import os
import sys
import time
import types
from collections.abc import Callable

import pytest

from harness.telemetry.nvml import NvmlSampler, resolve_device
from harness.telemetry.reduce import (
    KernelActivity,
    UtilSample,
    coverage,
    time_weighted_activity,
    unavailable,
)

NOT_FOUND, NOT_SUPPORTED = 6, 3
UNIX0 = 1_750_000_000.0  # the fake unix clock starts here
BOOT0 = 4_321.0  # ... when the fake machine has been up this long


class Clock:
    def __init__(self, t: float = UNIX0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(clock: Clock, schedule: Callable[[float], float | None], *,
              period: float = 1 / 6, driver_base: str = "boot", history_s: float = 30.0,
              samples: bool = True, polling: bool = True, processes=None, running=None,
              uuids: tuple[str, ...] = ("GPU-aaaa", "GPU-bbbb")) -> types.ModuleType:
    """A ``pynvml`` stand-in. ``schedule(t_unix)`` is the GPU's utilisation at ``t`` (None:
    idle, and the driver keeps no sample). ``processes(t_unix)`` lists (pid, sm %) samples
    for per-process utilisation (None: not supported); ``running`` the pids holding a
    context (None: not supported)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.NVML_ERROR_NOT_FOUND = NOT_FOUND
    nvml.NVML_GPU_UTILIZATION_SAMPLES = 1
    nvml.calls = []
    offset = UNIX0 - BOOT0 if driver_base == "boot" else 0.0  # unix - driver clock
    origin = clock.t - history_s

    def driver_us(t_unix: float) -> int:
        return int(round((t_unix - offset) * 1e6))

    def sample_times(now: float) -> list[float]:
        return [origin + k * period for k in range(int((now - origin) / period) + 1)]

    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("index", i)

    def by_uuid(uuid):
        if uuid not in uuids:
            raise NVMLError(NOT_FOUND)
        return ("uuid", uuid)

    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetHandleByPciBusId = lambda bus: ("pci", bus)
    nvml.nvmlDeviceGetName = lambda handle: "Fake H200"
    nvml.nvmlDeviceGetUUID = lambda handle: handle[1] if handle[0] == "uuid" else "GPU-aaaa"

    def get_samples(handle, kind, last):
        nvml.calls.append(("samples", last))
        if not samples:
            raise NVMLError(NOT_SUPPORTED)
        out = []
        for t in sample_times(clock.t):
            value = schedule(t)
            if value is not None and driver_us(t) > last:
                out.append(types.SimpleNamespace(
                    timeStamp=driver_us(t), sampleValue=types.SimpleNamespace(uiVal=value)))
        if not out:
            raise NVMLError(NOT_FOUND)
        return 1, out

    nvml.nvmlDeviceGetSamples = get_samples

    def rates(handle):
        if not polling:
            raise NVMLError(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=schedule(clock.t) or 0, memory=0)

    nvml.nvmlDeviceGetUtilizationRates = rates

    def process_utilization(handle, last):
        if processes is None:
            raise NVMLError(NOT_SUPPORTED)
        out = [types.SimpleNamespace(pid=pid, timeStamp=driver_us(t), smUtil=sm)
               for t in sample_times(clock.t) for pid, sm in processes(t)
               if driver_us(t) > last]
        if not out:
            raise NVMLError(NOT_FOUND)
        return out

    nvml.nvmlDeviceGetProcessUtilization = process_utilization

    def compute_processes(handle):
        if running is None:
            raise NVMLError(NOT_SUPPORTED)
        return [types.SimpleNamespace(pid=pid) for pid in running(clock.t)]

    nvml.nvmlDeviceGetComputeRunningProcesses = compute_processes
    return nvml


def run_sampler(monkeypatch, nvml, clock: Clock, seconds: float, step: float = 0.05,
                **kwargs) -> NvmlSampler:
    """Install ``nvml``, start a sampler on ``clock``, tick it every ``step`` s (the
    background loop's polling rate) for ``seconds``, stop it."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    kwargs.setdefault("offsets", lambda: {"CLOCK_BOOTTIME": UNIX0 - BOOT0})
    sampler = NvmlSampler(clock=clock, **kwargs)
    sampler.start(background=False)
    assert sampler.available, sampler.note
    for _ in range(int(round(seconds / step))):
        clock.t += step
        sampler.tick()
    sampler.stop()
    return sampler


def busy_between(*spans: tuple[float, float], idle: float | None = 0.0):
    """Utilisation 100 inside the spans (seconds after UNIX0), ``idle`` outside."""
    def schedule(t: float) -> float | None:
        rel = t - UNIX0
        return 100.0 if any(a < rel <= b for a, b in spans) else idle
    return schedule


# ---------------------------------------------------------------- weighting and gaps


def test_an_unsampled_idle_stretch_is_a_gap_not_the_next_busy_value():
    """1 s busy sampled every 1/6 s, then 4 s with no samples, then one busy sample: the
    last sample stands for one period, not the whole 4 s (which read 100 % before)."""
    samples = [UtilSample(k / 6, 100.0) for k in range(1, 7)] + [UtilSample(5.0, 100.0)]
    found = coverage(samples, 0.0, 5.0)
    assert found.percent == pytest.approx(100 * (1 + 1 / 6) / 5)  # 23.3 %
    assert found.n_gaps == 1 and found.uncovered_s == pytest.approx(4 - 1 / 6)
    assert found.percent_covered == pytest.approx(100.0)
    assert found.period_s == pytest.approx(1 / 6)
    assert time_weighted_activity(samples, 0.0, 5.0) == pytest.approx(23.333, abs=1e-3)


def test_jittered_contiguous_samples_have_no_gaps():
    times = [0.0]
    for k in range(1, 60):
        times.append(times[-1] + (1 / 6) * (1 + 0.3 * math.sin(k)))  # +-30 % jitter
    samples = [UtilSample(t, 10.0 * (k % 3)) for k, t in enumerate(times)]
    found = coverage(samples, times[0], times[-1])
    assert found.n_gaps == 0 and found.uncovered_s == 0.0
    expected = sum(s.percent * (s.t_unix - p.t_unix) for p, s in zip(samples, samples[1:],
                                                                      strict=False))
    assert found.percent == pytest.approx(expected / (times[-1] - times[0]))


def test_gaps_at_the_window_edges_count_and_rounding_does_not():
    samples = [UtilSample(2.0 + k * 0.5, 50.0) for k in range(1, 5)]  # cover (2, 4]
    found = coverage(samples, 0.0, 6.0)
    assert found.n_gaps == 2 and found.uncovered_s == pytest.approx(4.0)
    assert found.percent == pytest.approx(50 * 2 / 6)
    # a window edge up to 1.5 periods past the last sample is not a gap (the next sample
    # may come after the sampler stopped); nor is the first sample's phase
    assert coverage(samples, 1.4, 4.7).n_gaps == 0
    assert coverage(samples, 1.4, 4.7).percent == pytest.approx(50.0)


def test_a_samples_own_period_caps_its_span():
    samples = [UtilSample(1.0, 100.0, period_s=0.1), UtilSample(3.0, 0.0, period_s=0.1)]
    found = coverage(samples, 0.0, 3.0)
    assert found.covered_s == pytest.approx(0.2)
    assert found.percent == pytest.approx(100 * 0.1 / 3)
    assert coverage([UtilSample(1.0, 100.0)], 0.0, 2.0).percent is None  # no period known
    assert coverage([], 0.0, 1.0).percent is None


def test_unavailable_keeps_its_shape():
    assert unavailable("why") == KernelActivity(None, "why", None, 0)


# ---------------------------------------------------------------- clock base


def test_a_boot_time_driver_clock_is_found_and_samples_land_on_the_unix_clock(monkeypatch):
    clock = Clock()
    nvml = fake_nvml(clock, busy_between((0.0, 2.0)), driver_base="boot")
    sampler = run_sampler(monkeypatch, nvml, clock, 4.0, period_s=0.25)
    assert sampler.clock_base == "CLOCK_BOOTTIME"
    # the first read asked from the unix clock's now; later ones from the whole buffer
    # (last seen 0), then from the last driver timestamp seen
    lasts = [last for kind, last in nvml.calls if kind == "samples"]
    assert lasts[0] == int(UNIX0 * 1e6) and lasts[1] == 0 and lasts[-1] > 0
    assert lasts[-1] < 1e13  # the boot clock: microseconds since boot, not since 1970
    inside = [s for s in sampler.samples if UNIX0 <= s.t_unix <= UNIX0 + 4.0]
    assert inside
    grid = 1 / 6
    for s in inside:  # on the fake driver's 1/6 s grid, to the microsecond
        k = (s.t_unix - (UNIX0 - 30.0)) / grid
        assert k == pytest.approx(round(k), abs=1e-4)
    activity = sampler.activity(UNIX0, UNIX0 + 4.0)
    assert activity.percent == pytest.approx(50.0, abs=100 / 6 / 4 + 0.5)
    assert activity.source == "nvml-samples" and activity.n_gaps == 0
    assert "CLOCK_BOOTTIME" in activity.note


def test_an_unknown_driver_clock_is_estimated_from_its_newest_sample(monkeypatch):
    clock = Clock()
    nvml = fake_nvml(clock, busy_between((0.0, 2.0)), driver_base="boot")
    sampler = run_sampler(monkeypatch, nvml, clock, 4.0, period_s=0.25, offsets=lambda: {})
    assert sampler.clock_base == "estimated"
    # the newest sample is at most one driver period old at a read: so is the error
    truth = [UNIX0 - 30.0 + k / 6 for k in range(int(34 * 6) + 1)]
    for s in sampler.samples:
        nearest = min(truth, key=lambda t: abs(t - s.t_unix))
        assert 0 <= s.t_unix - nearest <= 1 / 6 + 1e-6
    assert sampler.activity(UNIX0, UNIX0 + 4.0).percent == pytest.approx(50.0, abs=6.0)


def test_a_unix_clock_driver_is_read_from_now(monkeypatch):
    clock = Clock()
    nvml = fake_nvml(clock, busy_between((0.0, 4.0)), driver_base="unix")
    sampler = run_sampler(monkeypatch, nvml, clock, 4.0, period_s=0.25)
    assert sampler.clock_base == "unix"
    assert sampler.activity(UNIX0 + 0.5, UNIX0 + 3.5).percent == pytest.approx(100.0)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux clocks")
def test_the_real_boot_clock_is_matched_exactly(monkeypatch):
    """A driver stamping with this machine's CLOCK_BOOTTIME: the offset comes from reading
    both clocks at once, not from the samples' age."""
    boot_minus_unix = time.clock_gettime(time.CLOCK_BOOTTIME) - time.time()
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_GPU_UTILIZATION_SAMPLES = (
        NVMLError, NOT_FOUND, 1)
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("index", i)
    stamps = [time.clock_gettime(time.CLOCK_BOOTTIME) - k * 0.2 for k in range(5, 0, -1)]

    def get_samples(handle, kind, last):
        out = [types.SimpleNamespace(timeStamp=int(t * 1e6),
                                     sampleValue=types.SimpleNamespace(uiVal=70))
               for t in stamps if int(t * 1e6) > last]
        if not out:
            raise NVMLError(NOT_FOUND)
        return 1, out

    nvml.nvmlDeviceGetSamples = get_samples
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = NvmlSampler(period_s=0.01)
    sampler.start(background=False)
    sampler.tick(time.time() + 0.02)  # the second read asks for the whole buffer
    sampler.stop()
    assert sampler.clock_base == "CLOCK_BOOTTIME"
    unix = [t - boot_minus_unix for t in stamps]
    assert [s.t_unix for s in sampler.samples] == pytest.approx(unix, abs=2e-3)


# ---------------------------------------------------------------- polling fallback


def test_polling_fills_in_while_the_driver_keeps_no_samples(monkeypatch):
    """Busy 0-2 s and 8-10 s; idle 2-8 s with no driver samples (idle=None): after a few
    silent read periods the sampler polls the utilisation rate (0 %) until samples return."""
    clock = Clock()
    schedule = busy_between((0.0, 2.0), (8.0, 10.0), idle=None)
    nvml = fake_nvml(clock, schedule, driver_base="boot")
    sampler = run_sampler(monkeypatch, nvml, clock, 10.0, period_s=0.25)
    assert sampler.fallback_after_s == 1.0  # four read periods
    activity = sampler.activity(UNIX0, UNIX0 + 10.0)
    assert activity.source == "nvml-samples+polling"
    assert "polled nvmlDeviceGetUtilizationRates" in activity.note
    polled = [s for s in sampler.samples if UNIX0 + 2 < s.t_unix < UNIX0 + 8]
    assert len(polled) > 80 and all(s.percent == 0 for s in polled)  # every 50 ms from ~3 s
    assert activity.percent == pytest.approx(40.0, abs=2.5)
    # only the silence before polling began is uncovered: ~1 s of the 6 s idle stretch
    assert activity.n_gaps == 1 and activity.uncovered_s == pytest.approx(1.0, abs=0.35)


def test_without_polling_the_silence_is_a_reported_gap(monkeypatch):
    clock = Clock()
    schedule = busy_between((0.0, 2.0), (8.0, 10.0), idle=None)
    nvml = fake_nvml(clock, schedule, driver_base="boot", polling=False)
    sampler = run_sampler(monkeypatch, nvml, clock, 10.0, period_s=0.25)
    activity = sampler.activity(UNIX0, UNIX0 + 10.0)
    assert activity.source == "nvml-samples"
    # samples cover (0, 2] and (8, 9.83]; the 6 s between are one gap, counted idle (the
    # last 1/6 s is the sampling phase at the window's end, left out)
    assert activity.n_gaps == 1 and activity.uncovered_s == pytest.approx(6.0, abs=0.01)
    sampled = 2 + 11 / 6
    assert activity.percent == pytest.approx(100 * sampled / (sampled + 6), abs=0.1)  # not 100
    assert activity.percent_covered == pytest.approx(100.0)
    assert "1 gap(s) without samples" in activity.note


def test_a_driver_without_samples_is_polled(monkeypatch):
    clock = Clock()
    nvml = fake_nvml(clock, busy_between((0.0, 1.0)), samples=False)
    sampler = run_sampler(monkeypatch, nvml, clock, 4.0, period_s=0.25)
    activity = sampler.activity(UNIX0, UNIX0 + 4.0)
    assert activity.source == "nvml-polling"
    assert activity.percent == pytest.approx(25.0, abs=2.0)
    assert "nvmlDeviceGetSamples failed" in activity.note


# ---------------------------------------------------------------- device mapping


def _torch(props) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(is_available=lambda: True,
                                 get_device_properties=lambda i: props[i])
    return types.SimpleNamespace(cuda=cuda)


def test_the_torch_device_maps_to_nvml_by_uuid_then_pci_then_visible_devices():
    nvml = fake_nvml(Clock(), lambda t: 0.0)
    by_uuid = _torch([types.SimpleNamespace(uuid="bbbb")])
    assert resolve_device(nvml, 0, {}, by_uuid) == (("uuid", "GPU-bbbb"), "uuid GPU-bbbb")
    by_pci = _torch([types.SimpleNamespace(uuid="zzzz", pci_bus_id=0x3B, pci_domain_id=0,
                                           pci_device_id=0)])
    assert resolve_device(nvml, 0, {}, by_pci) == (("pci", "00000000:3B:00.0"),
                                                   "pci 00000000:3B:00.0")
    no_cuda = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert resolve_device(nvml, 1, env, no_cuda)[0] == ("uuid", "GPU-bbbb")
    handle, how = resolve_device(nvml, 0, {"CUDA_VISIBLE_DEVICES": "3,1"}, no_cuda)
    assert handle == ("index", 3) and "assumed" in how
    env = {"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    handle, how = resolve_device(nvml, 1, env, no_cuda)
    assert handle == ("index", 1) and "assumed" not in how
    handle, how = resolve_device(nvml, 2, {}, no_cuda)
    assert handle == ("index", 2) and "assumed" in how


def test_the_sampler_reports_the_device_it_found(monkeypatch):
    clock = Clock()
    monkeypatch.setitem(sys.modules, "torch", _torch([types.SimpleNamespace(uuid="bbbb")]))
    sampler = run_sampler(monkeypatch, fake_nvml(clock, lambda t: 50.0), clock, 1.0)
    assert sampler.device == "Fake H200 GPU-bbbb (found by uuid GPU-bbbb)"
    assert sampler.activity(UNIX0, UNIX0 + 1).device == sampler.device


def test_no_such_device_is_unavailable_not_a_crash(monkeypatch):
    nvml = fake_nvml(Clock(), lambda t: 0.0)

    def missing(i):
        raise NVMLError(NOT_FOUND)

    nvml.nvmlDeviceGetHandleByIndex = missing
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    sampler = NvmlSampler(device_index=3)
    sampler.start()
    sampler.stop()
    activity = sampler.activity(0.0, 1.0)
    assert not sampler.available and activity.percent is None
    assert "no device for cuda:3" in activity.note


def test_without_pynvml_activity_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler = NvmlSampler()
    sampler.start()
    sampler.stop()
    activity = sampler.activity(0.0, 1.0)
    assert activity.percent is None and activity.note.startswith("NVML unavailable")


# ---------------------------------------------------------------- other processes


OWN = os.getpid()


@pytest.mark.parametrize("others, expect", [((), False), ((424242,), True)])
def test_per_process_utilisation_says_whether_others_ran_kernels(monkeypatch, others, expect):
    clock = Clock()

    def processes(t):  # ours always; the other only from 1 s to 2 s
        rows = [(OWN, 60)]
        if 1.0 < t - UNIX0 <= 2.0:
            rows += [(pid, 30) for pid in others]
        return rows

    nvml = fake_nvml(clock, lambda t: 90.0, processes=processes)
    sampler = run_sampler(monkeypatch, nvml, clock, 3.0, period_s=0.25)
    activity = sampler.activity(UNIX0, UNIX0 + 3.0)
    assert activity.other_processes is expect
    assert ("424242" in activity.note) is expect
    # outside the other process's second: none
    assert sampler.other_processes(UNIX0 + 2.5, UNIX0 + 3.0)[0] is False


def test_compute_processes_are_the_fallback_evidence(monkeypatch):
    clock = Clock()
    nvml = fake_nvml(clock, lambda t: 90.0, running=lambda t: [OWN, 777])
    sampler = run_sampler(monkeypatch, nvml, clock, 1.0, period_s=0.25)
    others, note = sampler.other_processes(UNIX0, UNIX0 + 1.0)
    assert others is True and "777" in note and "compute context" in note


def test_other_processes_are_unknown_when_nvml_cannot_tell(monkeypatch):
    clock = Clock()
    sampler = run_sampler(monkeypatch, fake_nvml(clock, lambda t: 90.0), clock, 1.0)
    activity = sampler.activity(UNIX0, UNIX0 + 1.0)
    assert activity.other_processes is None and "unknown" in activity.note
    # a pid namespace: NVML sees one process, not by our pid
    clock = Clock()
    nvml = fake_nvml(clock, lambda t: 90.0, running=lambda t: [OWN + 1])
    sampler = run_sampler(monkeypatch, nvml, clock, 1.0)
    others, note = sampler.other_processes(UNIX0, UNIX0 + 1.0)
    assert others is None and "pid namespace" in note
