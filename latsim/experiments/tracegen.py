"""Trace sets: deterministic generation (the paper's workload, plus more), checks, summaries.

Kinds (see ``traces/README.md``):

- ``low``         1–2 updates per trace, uniform arrival times (the paper's low-frequency set)
- ``high``        3–11 updates per trace, uniform arrival times (the paper's high-frequency set)
- ``continuous``  a viewer steering the camera: bursts of 1–4 Hz updates separated by pauses
                  (beyond the paper, whose reviewers note continuous control was never tested)

Trace ``i`` of a set is drawn from child ``i`` of ``numpy.random.SeedSequence(seed)``, so it
does not depend on how many traces the set has, and the same (kind, count, duration, seed)
always gives byte-identical files. Times are rounded to the millisecond.

Bounds (:mod:`latsim.errors`): ``count`` at most :data:`~latsim.errors.MAX_TRACE_COUNT`,
``duration`` in [:data:`~latsim.errors.MIN_TRACE_DURATION`, :data:`~latsim.errors.MAX_DURATION`]
seconds, and the work bound: the set's most possible conditions (:func:`max_conditions`)
at most ``max_events`` (``--max-events``), checked before anything is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latsim.errors import (
    DEFAULT_MAX_TRACE_EVENTS,
    MAX_DURATION,
    MAX_SEED,
    MAX_TRACE_COUNT,
    MIN_TRACE_DURATION,
    LatsimError,
    check_int,
    check_number,
    check_work,
)
from latsim.model.traces import load_trace, write_trace
from latsim.numeric import empirical_quantile
from latsim.run.folder import claim_folder
from latsim.writing import staged

#: The kinds :func:`generate_set` knows, with a one-line description each.
KINDS: dict[str, str] = {
    "low": "1-2 updates per trace at uniform times (paper: low-frequency set)",
    "high": "3-11 updates per trace at uniform times (paper: high-frequency set)",
    "continuous": "bursts of 1-4 Hz steering (2-8 s) separated by 1-6 s pauses",
}

#: Update-count ranges (inclusive) of the paper's trace sets, per 60 s trace.
COUNT_RANGES: dict[str, tuple[int, int]] = {"low": (1, 2), "high": (3, 11)}

#: Continuous steering: burst rate range (Hz), burst and pause lengths (s).
BURST_RATE_HZ = (1.0, 4.0)
BURST_S = (2.0, 8.0)
PAUSE_S = (1.0, 6.0)

#: The canonical committed sets: kind -> (count, duration, seed).
CANONICAL_SETS: dict[str, tuple[int, float, int]] = {
    "low": (30, 60.0, 1),
    "high": (30, 60.0, 2),
    "continuous": (10, 60.0, 3),
}

GENERATOR = "latsim.tracegen/1"


@dataclass(frozen=True)
class GeneratedTrace:
    """One generated trace: its file stem, arrival times and header."""

    name: str
    times: tuple[float, ...]
    meta: dict


def _uniform_times(rng: np.random.Generator, n: int, duration: float) -> list[float]:
    raw = np.sort(rng.uniform(0.0, duration, size=n))
    return sorted({min(round(float(t), 3), round(duration - 0.001, 3)) for t in raw})


def _count_times(rng: np.random.Generator, kind: str, duration: float) -> list[float]:
    lo, hi = COUNT_RANGES[kind]
    n = int(rng.integers(lo, hi + 1))
    times = _uniform_times(rng, n, duration)
    while len(times) < n:  # two draws rounded onto the same millisecond: redraw
        times = _uniform_times(rng, n, duration)
    return times


def _continuous_times(rng: np.random.Generator, duration: float) -> list[float]:
    """Alternate pauses and bursts; within a burst, jittered periodic updates at 1–4 Hz."""
    times: list[float] = []
    t = float(rng.uniform(*PAUSE_S))  # start with a pause (the viewer looks first)
    while t < duration:
        burst_end = t + float(rng.uniform(*BURST_S))
        period = 1.0 / float(rng.uniform(*BURST_RATE_HZ))
        while t < min(burst_end, duration):
            times.append(round(t, 3))
            t += period * float(rng.uniform(0.7, 1.3))
        t = burst_end + float(rng.uniform(*PAUSE_S))
    return sorted({x for x in times if x < duration})


def max_conditions(kind: str, duration: float) -> int:
    """The most conditions one trace of ``kind`` over ``duration`` seconds can hold: the top
    of the count range, or for continuous steering one per shortest jittered period
    (0.7 / 4 Hz) over the whole window."""
    if kind in COUNT_RANGES:
        return COUNT_RANGES[kind][1]
    return math.ceil(duration * BURST_RATE_HZ[1] / 0.7) + 1


def generate_set(kind: str, count: int, duration: float, seed: int,
                 max_events: int = DEFAULT_MAX_TRACE_EVENTS) -> list[GeneratedTrace]:
    """``count`` traces of ``kind``, each covering ``[0, duration)`` seconds; refused before
    any drawing when the set could hold more than ``max_events`` conditions."""
    if kind not in KINDS:
        shown = repr(kind) if len(repr(kind)) <= 40 else repr(kind)[:37] + "..."
        raise LatsimError(f"unknown trace kind {shown}; choose {', '.join(KINDS)}")
    check_int("count", count, 1, MAX_TRACE_COUNT)
    check_number("duration", duration, MIN_TRACE_DURATION, MAX_DURATION, positive=True,
                 unit="s")
    check_int("seed", seed, 0, MAX_SEED)
    check_int("--max-events", max_events, 1, 10**12)
    check_work(count * max_conditions(kind, duration), max_events, "--max-events",
               f"{count} {kind} trace(s) of {duration:g} s hold up to about {{n}} conditions")
    out = []
    for index, child in enumerate(np.random.SeedSequence(seed).spawn(count)):
        rng = np.random.default_rng(child)
        if kind == "continuous":
            times = _continuous_times(rng, duration)
        else:
            times = _count_times(rng, kind, duration)
        meta = {"duration": float(duration), "generator": GENERATOR, "index": index,
                "kind": kind, "seed": seed}
        out.append(GeneratedTrace(f"{kind}_{index:03d}", tuple(times), meta))
    return out


def write_set(traces: list[GeneratedTrace], out_dir: str | Path) -> list[Path]:
    """Write each trace as ``out_dir/<name>.jsonl``; returns the paths. A set is written
    whole or not at all (:func:`latsim.writing.staged`): every trace is written beside the
    folder first and moved in only once all are, so when one cannot be written (a full
    disk) the folder is as it was, files of the same names included, and the error says
    so. A file of a trace's name that this generator did not write is refused first
    (:func:`latsim.run.folder.claim_folder`)."""
    folder = Path(out_dir)
    for trace in traces:  # never over a file this generator did not write
        name = f"{trace.name}.jsonl"
        claim_folder(folder, (name,), name, "latsim traces generate",
                     lambda meta: meta.get("generator") == GENERATOR,
                     lambda path: load_trace(path).meta)
    with staged(folder) as staging:
        for trace in traces:
            write_trace(staging / f"{trace.name}.jsonl", list(trace.times), trace.meta)
    return [folder / f"{trace.name}.jsonl" for trace in traces]


@dataclass(frozen=True)
class SetSummary:
    """What ``latsim traces show`` prints for a set of traces."""

    count: int
    duration_max: float | None
    updates_min: int
    updates_mean: float
    updates_max: int
    rate_per_min: float | None
    gap_n: int
    gap_min: float | None
    gap_mean: float | None
    gap_median: float | None
    gap_p95: float | None
    gap_max: float | None
    gap_cv: float | None


def summarize_set(times: list[tuple[float, ...]], durations: list[float | None]) -> SetSummary:
    """Counts per trace and inter-arrival statistics pooled over the set."""
    if not times:
        raise LatsimError("no traces to summarise")
    counts = np.array([len(t) for t in times])
    gaps = np.concatenate([np.diff(np.asarray(t, dtype=float)) for t in times if len(t) > 1]
                          or [np.array([])])
    known = [d for d in durations if d is not None]
    window = sum(known) if len(known) == len(durations) else None
    have = gaps.size > 0
    return SetSummary(
        count=len(times),
        duration_max=max(known) if known else None,
        updates_min=int(counts.min()),
        updates_mean=float(counts.mean()),
        updates_max=int(counts.max()),
        rate_per_min=60.0 * float(counts.sum()) / window if window else None,
        gap_n=int(gaps.size),
        gap_min=float(gaps.min()) if have else None,
        gap_mean=float(gaps.mean()) if have else None,
        gap_median=float(np.median(gaps)) if have else None,
        gap_p95=empirical_quantile(gaps, 0.95) if have else None,
        gap_max=float(gaps.max()) if have else None,
        gap_cv=float(gaps.std() / gaps.mean()) if have and gaps.mean() > 0 else None,
    )


