"""Condition arrival processes, chosen by ``--updates`` (DESIGN §4).

- ``poisson:RATE``   exponential inter-arrivals, RATE per second
- ``bernoulli:P``    each latent slot holds one arrival with probability P, at a uniform
                     phase within the slot (the paper's independent-update model)
- ``trace:PATH``     one JSONL trace (see :mod:`latsim.model.traces`)
- ``traces:DIR``     every trace in a folder, one replication each

Each source's ``check(duration, duration_given)`` validates it against the run's window at
plan time, before any simulation (sources without one are not checked).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.traces import Trace, load_trace, trace_files
from latsim.plugins.spec import number, short, split


class ArrivalSource(Protocol):
    """Produces the arrival trace of replication ``index``."""

    spec: str

    def replications(self, seeds: int | None) -> int:
        """How many replications ``--seeds`` asks for (``None``: the source's default)."""
        ...

    def trace(self, index: int, rng: np.random.Generator, duration: float,
              timing: Timing) -> Trace:
        """Arrivals of replication ``index`` in ``[0, duration)``, drawn from ``rng``."""
        ...

    def default_duration(self) -> float | None:
        """The duration the source declares (trace headers), if any."""
        ...

    # optional: ``check(duration, duration_given) -> None`` raises LatsimError when the
    # source cannot fill a run of ``duration`` seconds (see the sources below), and
    # ``mean_conditions(duration, timing) -> float`` is the conditions a replication has on
    # average (the simulations' work bound counts them)


#: How messages name an ``--updates`` spec.
WHAT = "update spec"

#: Replications of a random arrival process when ``--seeds`` is not given: the paper's
#: workload has 30 traces per set.
DEFAULT_REPLICATIONS = 30

#: A run's expected condition count above which a Poisson spec is refused (a typo, not a
#: workload: the controller would see more conditions than latent slots).
MAX_ARRIVALS = 1e6


@dataclass(frozen=True)
class PoissonArrivals:
    rate: float

    @property
    def spec(self) -> str:
        return f"poisson:{self.rate!r}"

    def replications(self, seeds: int | None) -> int:
        return DEFAULT_REPLICATIONS if seeds is None else seeds

    def default_duration(self) -> float | None:
        return None

    def mean_conditions(self, duration: float, timing: Timing) -> float:
        return self.rate * duration

    def check(self, duration: float, duration_given: bool = True) -> None:
        if self.rate * duration > MAX_ARRIVALS:
            raise LatsimError(
                f"poisson:{self.rate:g} over {duration:g} s means ~{self.rate * duration:.3g} "
                f"conditions; at most {MAX_ARRIVALS:g} per run"
            )

    def trace(self, index, rng, duration, timing):
        self.check(duration)
        times: list[float] = []
        t = 0.0
        while self.rate > 0:
            t += float(rng.exponential(1.0 / self.rate))
            if t >= duration:
                break
            times.append(t)
        return Trace(f"poisson-{index}", tuple(times), duration)


@dataclass(frozen=True)
class BernoulliArrivals:
    p: float

    @property
    def spec(self) -> str:
        return f"bernoulli:{self.p!r}"

    def replications(self, seeds: int | None) -> int:
        return DEFAULT_REPLICATIONS if seeds is None else seeds

    def default_duration(self) -> float | None:
        return None

    def mean_conditions(self, duration: float, timing: Timing) -> float:
        return self.p * math.floor(duration / timing.delta + 1e-9)

    def trace(self, index, rng, duration, timing):
        n_slots = int(math.floor(duration / timing.delta + 1e-9))
        hits = rng.random(n_slots) < self.p
        phases = rng.random(n_slots)
        times = tuple(float((s + phases[s]) * timing.delta) for s in np.flatnonzero(hits))
        return Trace(f"bernoulli-{index}", times, duration)


@dataclass(frozen=True)
class TraceArrivals:
    """Trace files replayed as they are; ``--seeds N`` replays each N times (new cost draws).

    The run's window is ``--duration``, else the longest header duration, else 60 s; the
    conditions in ``[0, duration)`` are replayed. :meth:`check` decides the edge cases:

    - a time at or beyond a window that was *not* given (no ``--duration``) is an error:
      nothing declared the session that short (the trace has no header, or a set mixes
      traces with and without one, and the 60 s default applies), so dropping it would be
      silent data loss; give ``--duration`` or a header. With ``--duration`` the window is
      the user's choice and later conditions are left out, as a header's duration does.
    - a source with no condition in the window is an error: every latency statistic would
      be empty. A set in which only some traces are empty is fine (sessions without updates
      still count towards busy and stall time and A); ``poisson:0`` simulates a stream that
      never updates on purpose.
    """

    spec: str
    loaded: tuple[Trace, ...]

    def mean_conditions(self, duration: float, timing: Timing) -> float:
        return sum(bisect.bisect_left(t.times, duration) for t in self.loaded) / len(self.loaded)

    def check(self, duration: float, duration_given: bool = True) -> None:
        if not duration_given:
            for trace in self.loaded:
                if trace.times and trace.times[-1] >= duration:
                    where = (self.spec if len(self.loaded) == 1
                             else f"{self.spec}: {trace.name}.jsonl")
                    why = ("the trace has no meta duration header" if trace.duration is None
                           else "not every trace of the set has a meta duration header")
                    raise LatsimError(
                        f"{where}: t={trace.times[-1]:g} is beyond the {duration:g} s run "
                        f"({why}); give --duration or a header to say how long the session is"
                    )
        if not any(trace.times and trace.times[0] < duration for trace in self.loaded):
            which = ("the trace has no condition" if len(self.loaded) == 1
                     else f"none of the {len(self.loaded)} traces has a condition")
            raise LatsimError(
                f"{self.spec}: {which} in [0, {duration:g}) s, so there is no "
                "latency to measure (poisson:0 simulates a stream without updates)"
            )

    def replications(self, seeds: int | None) -> int:
        return len(self.loaded) * (1 if seeds is None else seeds)

    def default_duration(self) -> float | None:
        durations = [t.duration for t in self.loaded]
        if any(d is None for d in durations):
            return None
        return max(durations)  # type: ignore[type-var]

    def trace(self, index, rng, duration, timing):
        source = self.loaded[index % len(self.loaded)]
        times = tuple(x for x in source.times if x < duration)
        return Trace(source.name, times, duration, source.meta)


def parse_updates(spec: str) -> ArrivalSource:
    """Build an arrival source from a ``--updates`` spec (see the module docstring)."""
    prefix, body = split(WHAT, spec, "poisson:0.1")
    if prefix == "poisson":
        rate = number(WHAT, spec, body)
        if rate < 0:
            raise LatsimError(f"poisson rate must be >= 0 per second, got {rate}")
        return PoissonArrivals(rate)
    if prefix == "bernoulli":
        p = number(WHAT, spec, body)
        if not 0 <= p <= 1:
            raise LatsimError(f"bernoulli probability must be in [0, 1], got {p}")
        return BernoulliArrivals(p)
    if prefix == "trace":
        return TraceArrivals(spec, (load_trace(body),))
    if prefix == "traces":
        return TraceArrivals(spec, tuple(load_trace(f) for f in trace_files(body)))
    raise LatsimError(
        f"unknown update spec prefix {short(prefix)}; use poisson:, bernoulli:, trace: or "
        "traces:"
    )
