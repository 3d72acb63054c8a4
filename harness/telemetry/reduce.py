"""Kernel activity from GPU utilisation samples: the pure reduction, no NVML.

A :class:`UtilSample` is one of NVML's utilisation samples on the unix clock; :func:`coverage`
weighs each over the time since the previous one, but never more than one sampling period
(1.5 periods of spacing still count as contiguous, for jitter): a stretch with no samples is
a *gap*, counted as idle (a driver that stops sampling is idle) and reported: number of
gaps, uncovered seconds, and the activity over the sampled time alone. Without the cap, an
idle stretch with no samples took the value of the next busy sample (1 s busy + 4 s
unsampled idle read 100 % instead of 23 %). :func:`unavailable` is the record of a run
without NVML: ``None`` with a note saying why, never a made-up number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Spacing up to this many periods counts as contiguous sampling (jitter), beyond it a gap.
GAP_FACTOR = 1.5
#: NVML's shortest utilisation sample period (1/6 s; the longest is 1 s).
NVML_MIN_PERIOD_S = 1 / 6
#: Driver timestamps within this of the unix clock are on the unix clock.
UNIX_BASE_TOLERANCE_S = 86_400.0
#: A driver timestamp is on a reference clock if it is at most this old on it.
CLOCK_MATCH_AGE_S = 3_600.0


@dataclass(frozen=True)
class UtilSample:
    """One utilisation sample: unix time (seconds) and percent busy over the period before.

    ``period_s`` is the span it stands for when known (polled samples); ``None`` means the
    sampling period is inferred from the samples' spacing.
    """

    t_unix: float
    percent: float
    period_s: float | None = None


@dataclass(frozen=True)
class KernelActivity:
    """Time-weighted kernel activity over a window, or why it is unavailable.

    ``percent`` counts gaps (stretches without samples) as idle; ``percent_covered`` is the
    activity over the sampled time alone; ``uncovered_s`` and ``n_gaps`` say how much was
    not sampled. ``other_processes`` is True if another process used the GPU in the window,
    False if none did, None if NVML could not tell (the note says why).
    """

    percent: float | None
    note: str | None
    source: str | None  # "nvml-samples", "nvml-polling", "nvml-samples+polling" or None
    n_samples: int
    uncovered_s: float = 0.0
    n_gaps: int = 0
    percent_covered: float | None = None
    other_processes: bool | None = None
    device: str | None = None  # the NVML device and how it was found


@dataclass(frozen=True)
class Coverage:
    """What :func:`coverage` finds in a window."""

    percent: float | None  # busy time / (sampled time + gap time): gaps count as idle
    percent_covered: float | None  # busy time / sampled time
    covered_s: float
    uncovered_s: float  # total length of the gaps
    n_gaps: int
    period_s: float | None  # the inferred sampling period (None if it could not be)


def sampling_period(samples: Sequence[UtilSample]) -> float | None:
    """The sampling period of samples without their own: the (upper) median spacing of
    consecutive ones. None with fewer than two."""
    times = sorted(s.t_unix for s in samples if s.period_s is None)
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def coverage(samples: Sequence[UtilSample], t_begin: float, t_end: float,
             period_s: float | None = None) -> Coverage:
    """Time-weighted activity over ``[t_begin, t_end]``, with the gaps counted.

    Sample ``i`` stands for ``(t_i - span_i, t_i]``: ``span_i`` is the spacing since the
    previous sample when that is at most :data:`GAP_FACTOR` periods, else one period (the
    rest is a gap); the first sample spans one period. The period is the sample's own, else
    ``period_s``, else :func:`sampling_period`. Unsampled stretches between samples are gaps;
    at the window's edges only those longer than :data:`GAP_FACTOR` periods are (shorter ones
    are the sampling phase, left out). ``percent`` is None if no sample overlaps the window.
    """
    window = max(0.0, t_end - t_begin)
    ordered = sorted(samples, key=lambda s: s.t_unix)
    default = period_s if period_s is not None else sampling_period(ordered)
    if not ordered or window <= 0:
        return Coverage(None, None, 0.0, 0.0, 0, default)
    spans: list[tuple[float, float, float, float]] = []  # (lo, hi, percent, period)
    prev: float | None = None
    for sample in ordered:
        period = sample.period_s if sample.period_s is not None else default
        if period is None or period <= 0:
            prev = sample.t_unix
            continue  # a lone sample with no known period: it stands for nothing
        spacing = period if prev is None else sample.t_unix - prev
        span = spacing if spacing <= GAP_FACTOR * period else period
        spans.append((sample.t_unix - span, sample.t_unix, sample.percent, period))
        prev = sample.t_unix
    busy = covered = uncovered = 0.0
    n_gaps = 0
    cursor = t_begin  # the window is accounted for up to here
    for lo, hi, percent, period in spans:
        lo_c, hi_c = max(lo, t_begin), min(hi, t_end)
        if hi_c <= lo_c:
            continue
        edge = covered == 0  # before the first sample: its phase, up to a period, is no gap
        if lo_c - cursor > (GAP_FACTOR if edge else 0.5) * period:
            uncovered += lo_c - cursor
            n_gaps += 1
        covered += hi_c - lo_c
        busy += percent * (hi_c - lo_c)
        cursor = hi_c
    if covered <= 0:
        return Coverage(None, None, 0.0, 0.0, 0, default)
    if t_end - cursor > GAP_FACTOR * spans[-1][3]:  # after the last: the next is up to a
        uncovered += t_end - cursor  # period away, and may come after the sampler stopped
        n_gaps += 1
    return Coverage(busy / (covered + uncovered), busy / covered, covered, uncovered, n_gaps,
                    default)


def time_weighted_activity(
    samples: Sequence[UtilSample], t_begin: float, t_end: float, period_s: float | None = None
) -> float | None:
    """Time-weighted mean utilisation over ``[t_begin, t_end]``, gaps counted as idle (see
    :func:`coverage`). None if no sample overlaps the window."""
    return coverage(samples, t_begin, t_end, period_s).percent


def unavailable(reason: str) -> KernelActivity:
    """Kernel activity that was not measured, with the reason."""
    return KernelActivity(None, reason, None, 0)
