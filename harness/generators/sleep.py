"""The ``sleep`` generator: a job takes a time drawn from a cost spec, and no model runs.

It makes the live driver, ``measure``, ``compare``, the server and the client runnable (and
testable) without torch: pick it to check a network path, a client or a schedule, or to see
how the wall-clock driver itself adds to what a cost model predicts. Each job sleeps for
``cost.sample(K, rng, kind)`` seconds (``--cost``, any spec ``latsim.plugins.load_cost``
reads), drawn from a ``numpy`` generator seeded with ``--seed``, in the order the jobs run.
:class:`~latsim.plugins.JobTiming` reports the time it really slept.

A slot's payload is ``payload_bytes`` bytes of a float32 "latent" (``--generator-option
payload_bytes=N``, default 64, at most 16 MiB), so a server sends something of a chosen
size. There is no temporal compression of its own: a run uses ``--r``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from harness.generators.device import warm_up
from latsim.controller import StartJob
from latsim.errors import LatsimError, check_int
from latsim.plugins import CostModel, GeneratorConfig, GeneratorInfo, JobTiming, load_cost

#: The options ``--generator-option`` may set, with their defaults.
OPTIONS = {"payload_bytes": "64"}
MAX_PAYLOAD_BYTES = 16 * 2**20


@dataclass
class SleepStream:
    """One stream of the sleep generator: the condition version of each position."""

    K: int
    versions: dict[int, int] = field(default_factory=dict)


class SleepGenerator:
    """A live generator whose jobs sleep for a drawn cost (see the module docstring)."""

    def __init__(self, cost: CostModel, seed: int = 0, payload_bytes: int = 64) -> None:
        self.cost = cost
        self.seed = seed
        self.payload_bytes = payload_bytes
        self._rng = np.random.default_rng(seed)
        self._stream = SleepStream(0)

    def describe(self) -> GeneratorInfo:
        return GeneratorInfo("sleep", f"sleep:{self.cost.spec}", "cpu",
                             "none (the sleep generator runs no model)", "none", None,
                             {"cost": self.cost.spec, "seed": self.seed,
                              "payload_bytes": self.payload_bytes})

    def check_fits(self, K: int) -> None:
        self.cost.mean(K)  # K outside a cost table's range fails here

    def new_stream(self, K: int, keep_frames: bool = False) -> SleepStream:
        return SleepStream(K, dict.fromkeys(range(K), 0))

    def reset_stream(self, K: int) -> None:
        self._stream = self.new_stream(K)

    def run_job(self, job: StartJob, decode_group: int = 1,
                stream: SleepStream | None = None) -> JobTiming:
        stream = stream or self._stream
        duration = self.cost.sample(job.length, self._rng, job.kind)
        t_start = time.perf_counter()
        time.sleep(duration)
        for position in range(job.branch, job.branch + job.length):
            stream.versions[position] = job.version
        t_end = time.perf_counter()
        return JobTiming(job.job_id, job.kind, job.length, job.branch, job.version, 0,
                         t_start, t_end, None, 0, 0)

    def payload(self, stream: SleepStream, position: int) -> tuple[str, tuple[int, ...], bytes]:
        values = np.full(self.payload_bytes // 4, stream.versions.get(position, 0), np.float32)
        return "latent", values.shape, values.tobytes()

    def warmup(self, K: int, untimed: int = 2, timed: int = 10,
               decode_group: int = 1, gap_s: float = 0.0) -> list[JobTiming]:
        return warm_up(self, K, untimed, timed, decode_group, gap_s)


def build(config: GeneratorConfig) -> SleepGenerator:
    """The ``sleep`` entry of the ``latsim.generators`` group."""
    if config.cost is None:
        raise LatsimError("generator sleep needs --cost SPEC (its job time), e.g. "
                          "--cost fixed:0.2 or --cost table:profile.json")
    if config.device != "cpu":  # checked without torch: there is no model to put on a GPU
        raise LatsimError("generator sleep runs no model: use --device cpu")
    for name, given in (("--preset", config.preset), ("--resolution", config.resolution)):
        if given is not None:
            raise LatsimError(f"generator sleep has no {name} (it runs no model)")
    if config.decode or config.context:
        raise LatsimError("generator sleep has no VAE or context: drop --decode/--context")
    options = dict(OPTIONS)
    for key, value in config.options:
        if key not in OPTIONS:
            raise LatsimError(f"generator sleep has no option {key!r}; its options: "
                              f"{', '.join(OPTIONS)}")
        options[key] = value
    try:
        payload_bytes = int(options["payload_bytes"])
    except ValueError:
        raise LatsimError(f"payload_bytes must be a whole number of bytes, got "
                          f"{options['payload_bytes']!r}") from None
    check_int("payload_bytes", payload_bytes, 4, MAX_PAYLOAD_BYTES)
    return SleepGenerator(load_cost(config.cost), config.seed, payload_bytes)
