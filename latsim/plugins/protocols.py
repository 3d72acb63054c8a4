"""The typed seams of latsim: what a cost model, a scheduling policy and a live generator are.

Pure declarations (no numpy, simpy or torch at run time): the registries
(:mod:`latsim.plugins.registry`) load objects that satisfy these, the simulator and the live
harness call only what is declared here, and a third-party plug-in needs nothing else.

- :class:`CostModel` — a job's duration (the execution-time seam, DESIGN §3). Optional
  capabilities the serving model looks for are their own protocols: :class:`Staged`
  (steps on named pools), :class:`Pipelined` (lockstep pipelines), :class:`Parallel`
  (a table per parallel degree).
- :class:`ArrivalChecks` and :class:`CountsConditions` — optional capabilities of an
  arrival source (:class:`latsim.model.arrivals.ArrivalSource`).
- :data:`Schedule` over :class:`WaitingTask` — which waiting task a device serves next,
  one implementation for the serving simulator and the live server.
- :data:`Placement` over :class:`NodeLoad` — which node of a fleet takes a new session.
- :class:`LiveGenerator`, built from a :class:`GeneratorConfig` — what the live driver,
  ``measure``, ``profile``, ``serve`` and ``gpu_check`` call; it times each job itself
  (:class:`JobTiming`) and describes itself for the run folder (:class:`GeneratorInfo`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from latsim.controller import StartJob
    from latsim.controller.timing import Timing

# ---------------------------------------------------------------- cost models


@runtime_checkable
class CostModel(Protocol):
    """Generation time of one job of ``K`` latents."""

    spec: str

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        """Draw one job duration (seconds)."""
        ...

    def mean(self, K: int) -> float:
        """Expected job duration (seconds); a refill's where the job kinds differ."""
        ...

    def quantile(self, K: int, level: float) -> float:
        """The ``level`` quantile of the job duration (seconds), for every job kind: the
        planning lead is set from it and covers refills and replans alike."""
        ...

    @property
    def deterministic(self) -> bool:
        """True if every draw, of every job kind, equals ``mean`` (so closed forms that
        assume one fixed C for every job apply)."""
        ...


#: What the ``latsim.costs`` group loads: the text after ``PREFIX:`` in, a cost model out.
CostFactory = Callable[[str], CostModel]


@runtime_checkable
class Staged(Protocol):
    """A cost model whose jobs run as steps on named pools (a generator model,
    :mod:`latsim.model.generators`): the serving model puts each step on its pool."""

    def steps(self, K: int, kind: str, streams: Any) -> Iterator[Any]:
        """The :class:`~latsim.model.generators.Step` s of one job of ``kind``."""
        ...

    def pools(self) -> tuple[str, ...]:
        """The pools its steps run on."""
        ...


@runtime_checkable
class Pipelined(Protocol):
    """A cost model with lockstep pipelines: pool -> (ranks, round seconds, downstream)."""

    def pipelines(self) -> dict[str, tuple[int, float, str | None]]:
        ...


@runtime_checkable
class Parallel(Protocol):
    """A cost model with one table per parallel degree (USP)."""

    degree: int

    def at(self, degree: int) -> CostModel:
        """The same model at another parallel degree."""
        ...


# ---------------------------------------------------------------- arrival capabilities


@runtime_checkable
class ArrivalChecks(Protocol):
    """An arrival source that validates the window it is asked for."""

    def check(self, duration: float, duration_given: bool = True) -> None:
        ...


@runtime_checkable
class CountsConditions(Protocol):
    """An arrival source that knows how many conditions a run expects (the work bound)."""

    def mean_conditions(self, duration: float, timing: Timing) -> float:
        ...


# ---------------------------------------------------------------- scheduling


class WaitingTask(Protocol):
    """One task waiting for a device, as a scheduling policy sees it (read only)."""

    @property
    def stream(self) -> int:
        """The index of the stream (the viewer session) the task belongs to."""
        ...

    @property
    def kind(self) -> str:
        """``prebuffer``, ``refill`` or ``replan``."""
        ...

    @property
    def stage(self) -> str:
        """The stage it runs (``dit``, ``decode``, ... in the serving model; ``dit`` for a
        live server's whole job)."""
        ...

    @property
    def t_enqueue(self) -> float:
        """When it joined the queue (the engine's clock, seconds)."""
        ...

    @property
    def seq(self) -> int:
        """Its place in submission order (ties broken by it keep a policy deterministic)."""
        ...

    @property
    def slack(self) -> float:
        """Seconds of playable video its stream has buffered at the time of the pick."""
        ...


#: What the ``latsim.schedules`` group loads: the waiting tasks (in submission order, at
#: least two) and the time; returns the one to serve next. It must not mutate anything.
Schedule = Callable[[Sequence[WaitingTask], float], WaitingTask]


# ---------------------------------------------------------------- fleet placement


@dataclass(frozen=True)
class NodeLoad:
    """What a placement policy sees of one node with room for another session."""

    index: int
    sessions: int  # sessions it holds (active or idle, not suspended)
    max_sessions: int
    devices: int  # its DiT device groups
    chunk_s: float  # predicted per-chunk latency with one more session (min-max's predictor)
    slack_s: float  # the least playout slack of its playing streams (inf with none)


class Placement(Protocol):
    """Chooses the node for a new session among those with room (never empty); a fresh one
    per run, built by the ``latsim.placements`` factory (``() -> Placement``), so it may
    keep state (round-robin's position). A plain function of these arguments is one."""

    def __call__(self, loads: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        """The chosen :class:`NodeLoad`."""


# ---------------------------------------------------------------- live generators


@dataclass(frozen=True)
class JobTiming:
    """A live generator's own measurement of one job (``time.perf_counter`` seconds)."""

    job_id: int
    kind: str
    K: int
    branch: int
    version: int
    context: int  # context latents actually fed
    t_start: float
    t_end: float
    device_s: float | None  # accelerator time of the job (e.g. CUDA events); None if none
    decoded_latents: int
    decoded_frames: int

    @property
    def wall_s(self) -> float:
        return self.t_end - self.t_start


@dataclass(frozen=True)
class GeneratorConfig:
    """What the ``latsim.generators`` group's factories are given: the options every
    generator command shares, plus ``options`` (``--generator-option KEY=VALUE``) that only
    one generator knows. ``None`` is the generator's own default. A factory rejects what it
    cannot use with a one-line :class:`~latsim.errors.LatsimError`."""

    preset: str | None = None
    resolution: str | None = None
    steps: int = 4
    context: int = 0  # clean prefix latents fed with each job (at most what exists)
    decode: bool = False
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None  # CPU threads; default: the generator's own
    cost: str | None = None  # a cost spec, for generators whose job time is drawn
    options: tuple[tuple[str, str], ...] = ()

    @property
    def option_map(self) -> dict[str, str]:
        return dict(self.options)


@dataclass(frozen=True)
class GeneratorInfo:
    """What a run folder records about the generator (``config.json`` ``generator``)."""

    name: str  # the registered name, e.g. ``wan``
    label: str  # e.g. ``wan:tiny@tiny,steps=4``: the summary's ``cost_spec`` is live:LABEL
    device: str  # ``cpu`` or ``cuda``
    device_name: str  # the GPU's name, or the CPU model
    dtype: str  # e.g. ``bfloat16``; ``none`` for a generator with no tensors
    r: int | None  # pixel frames per latent frame its model implies; None: any (--r)
    parameters: Mapping[str, Any] = field(default_factory=dict)  # preset, steps, n_params...
    threads: int | None = None  # CPU threads it computes with, where it says

    def as_dict(self) -> dict[str, Any]:
        """The record a run folder's ``config.json`` (and a server's ``ready``) carries."""
        return {"name": self.name, "label": self.label, "device": self.device,
                "device_name": self.device_name, "dtype": self.dtype, "r": self.r,
                "parameters": dict(self.parameters), "threads": self.threads}


@runtime_checkable
class LiveGenerator(Protocol):
    """A real generator that runs the controller's jobs on the wall clock.

    One thread calls :meth:`run_job` at a time; :meth:`new_stream` and :meth:`warmup` are
    called when no job runs (a server holds a lock around both).
    """

    def describe(self) -> GeneratorInfo:
        ...

    def check_fits(self, K: int) -> None:
        """A one-line :class:`~latsim.errors.LatsimError` if chunks of ``K`` latents cannot
        run (memory, positions), before any work."""
        ...

    def warmup(self, K: int, untimed: int = 2, timed: int = 10,
               decode_group: int = 1, gap_s: float = 0.0) -> list[JobTiming]:
        """Run ``untimed`` then ``timed`` jobs of ``K``, each timed one after ``gap_s`` s
        idle; returns the timed ones."""
        ...

    def new_stream(self, K: int, keep_frames: bool = False) -> Any:
        """A new stream's state, its prebuffer (positions ``0..K-1``) in place."""
        ...

    def reset_stream(self, K: int) -> None:
        """Start a new default stream (the one :meth:`run_job` uses when given none)."""
        ...

    def run_job(self, job: StartJob, decode_group: int = 1,
                stream: Any = None) -> JobTiming:
        """Generate positions ``job.branch .. job.branch + job.length - 1`` and time it."""
        ...

    def payload(self, stream: Any, position: int) -> tuple[str, tuple[int, ...], bytes]:
        """What a server sends for one slot: (``pixels`` or ``latent``, shape, bytes)."""
        ...


#: What the ``latsim.generators`` group loads.
GeneratorFactory = Callable[[GeneratorConfig], LiveGenerator]


@runtime_checkable
class TimesForwards(Protocol):
    """A live generator whose single forward pass can be timed alone (``gpu_check``)."""

    def forward_times(self, K: int, reps: int, context: int = 0, *,
                      warmup: int = 3) -> list[float]:
        """Milliseconds of each of ``reps`` forwards over ``K`` noisy latents (after
        ``warmup`` untimed ones), over a cache of ``context`` clean latents."""
        ...
