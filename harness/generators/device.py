"""The devices a live generator runs on: checking one can be used, naming it, CPU threads.

Shared by every generator; torch is imported only to ask about CUDA.
"""

from __future__ import annotations

import os

from latsim.errors import LatsimError

#: The devices a generator may be asked for.
DEVICES = ("cpu", "cuda")


def require_packages(what: str, packages: tuple[str, ...] = ("torch", "diffusers")) -> None:
    """One line instead of a traceback when ``what`` needs packages that are missing."""
    import importlib.util

    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise LatsimError(f"{what} needs {' and '.join(missing)}: install the live extra, "
                          "pip install -e '.[live]'")


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
