"""What every live generator shares: the device (checking it, naming it, torch's dtype and
CPU threads, out of memory as a one-line error) and the warm-up jobs.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from latsim.controller import StartJob
from latsim.errors import LatsimError, install_hint
from latsim.plugins import JobTiming, LiveGenerator

#: The devices a generator may be asked for.
DEVICES = ("cpu", "cuda")


def require_packages(what: str, packages: tuple[str, ...] = ("torch", "diffusers")) -> None:
    """One line instead of a traceback when ``what`` needs packages that are missing."""
    import importlib.util

    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise LatsimError(f"{what} needs {' and '.join(missing)}: install the live extra, "
                          f"{install_hint('live')}")


def default_threads() -> int:
    """CPU threads for torch: all cores but one (the driver's), at least one."""
    return max(1, (os.cpu_count() or 1) - 1)


def require_device(device: str) -> None:
    """Raise a one-line :class:`LatsimError` if ``device`` cannot be used."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise LatsimError(
                f"--device cuda: no CUDA GPU is available (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'none'})"
            )
    elif device != "cpu":
        raise LatsimError(f"unknown device {device!r}; choose cpu or cuda")


def device_name(device: str) -> str:
    """A human-readable name of the device (GPU name, or the CPU model)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return f"cpu: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    import platform

    return f"cpu: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def torch_device(device: str, threads: int | None) -> tuple[Any, Any, Any, int]:
    """torch, the device, its dtype (bfloat16 on CUDA, float32 on the CPU) and the CPU
    threads torch computes with (``threads``, default all cores but one)."""
    import torch

    require_device(device)
    if device == "cpu":
        torch.set_num_threads(threads or default_threads())
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return torch, torch.device(device), dtype, torch.get_num_threads()


@contextmanager
def out_of_memory_as_error(torch: Any, device: Any, K: int, what: str,
                           release: Callable[[], None]) -> Iterator[None]:
    """An out-of-memory error inside becomes a one-line :class:`LatsimError` naming K and
    ``what`` (the preset and resolution), after ``release()`` dropped what was allocated."""
    try:
        yield
    except torch.OutOfMemoryError:
        release()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise LatsimError(f"K={K} does not fit in {device.type} memory with {what} (out of "
                          "memory in warm-up); use a smaller --K or --resolution") from None


def warm_up(generator: LiveGenerator, K: int, untimed: int, timed: int,
            decode_group: int, gap_s: float) -> list[JobTiming]:
    """Run ``untimed`` then ``timed`` refills of ``K`` latents on a new default stream;
    returns the timed ones. Each timed job follows ``gap_s`` seconds of idleness, as jobs
    do in a live run: back-to-back jobs run hot and underestimate C (on a 2-core CPU a Wan
    job after a 0.3 s pause takes ~1.5x longer)."""
    generator.check_fits(K)
    generator.reset_stream(K)
    timings = []
    for i in range(untimed + timed):
        if i >= untimed and gap_s > 0:
            time.sleep(gap_s)
        branch = K * (i + 1)
        timing = generator.run_job(StartJob(-(i + 1), "refill", branch, K, i % 3, branch),
                                   decode_group)
        if i >= untimed:
            timings.append(timing)
    return timings
