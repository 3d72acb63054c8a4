"""A browser's display refresh: a slot the playout rule shows at ``t`` is on screen at the
first refresh of the display at or after ``t``.

A web page draws in ``requestAnimationFrame`` callbacks, one per refresh (vsync) of the
display, and the browser viewer (``harness/viewer/web``) takes a slot's display time to be
the timestamp of the frame that draws it. The refreshes tick at ``phase + n · period`` of
the session's stream time, where

- ``period`` is the display's: the page fits it to every frame's timestamp and writes it to
  ``config.json`` (``display.period``: *measured*); a folder without it is given
  :data:`NOMINAL_PERIOD` (*assumed*);
- ``phase`` is the refresh clock's offset against the stream's slot clock, constant for the
  session: it is *fitted* to the display times of the session's own slots
  (:func:`fit_refresh`).

Between the playout rule and the screen this puts a delay in ``[0, period)``; where the slot
time δ is a whole number of refreshes (δ = 0.25 s is 15 at 60 Hz) it is the same for every
slot played on time, and only a late slot (a client stall, shown when it arrives) lands
elsewhere on the refresh clock. The serving model's prediction of a browser session adds it
(:mod:`latsim.analysis.viewer_compare`); a viewer without a display refresh (``latsim
client``) gets none. A display whose refresh rate varies (adaptive sync) has no constant
phase: :attr:`RefreshFit.spread` then comes out large.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from latsim.controller.machine import EPS
from latsim.errors import LatsimError

#: The refresh period assumed where the viewer measured none: 60 Hz (seconds).
NOMINAL_PERIOD = 1.0 / 60.0
#: Where a refresh period came from: the page's fit to its frames, or :data:`NOMINAL_PERIOD`.
PERIOD_SOURCES = ("measured", "assumed")


@dataclass(frozen=True)
class DisplayRefresh:
    """A display that refreshes every ``period`` seconds at ``phase + n · period`` (stream
    time, ``0 <= phase < period``)."""

    period: float
    phase: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period) and self.period > 0):
            raise LatsimError(f"a display refresh period must be > 0 s, got {self.period}")
        if not 0.0 <= self.phase < self.period:
            raise LatsimError(f"a display refresh phase must be in [0, {self.period}) s, "
                              f"got {self.phase}")

    def present(self, t: float) -> float:
        """When a frame the playout rule shows at ``t`` is on screen: the first refresh at
        or after ``t`` (a refresh within :data:`~latsim.controller.machine.EPS` before
        ``t`` counts as at it)."""
        n = math.ceil((t - self.phase - EPS) / self.period)
        return self.phase + n * self.period

    def step(self, t: float) -> float:
        """How long after ``t`` its frame is on screen: ``present(t) - t``, in
        ``[0, period)``."""
        return max(0.0, self.present(t) - t)


@dataclass(frozen=True)
class RefreshFit:
    """A session's refresh clock, fitted: the clock, where its period came from
    (:data:`PERIOD_SOURCES`), how many display times its phase was fitted to, and the
    largest distance of one of them from the fitted clock's nearest refresh (seconds: the
    timestamps' own jitter and coarsening, plus any drift the period leaves)."""

    refresh: DisplayRefresh
    period_source: str
    n: int
    spread: float


def fit_refresh(display_times: Iterable[float], period: float,
                period_source: str = "measured") -> RefreshFit:
    """The refresh clock of ``period`` that the frames drawn at ``display_times`` (stream
    time) lie on: its phase is their circular mean modulo ``period``, so a phase near 0 or
    near ``period`` is fitted as well as any other."""
    if period_source not in PERIOD_SOURCES:
        raise LatsimError(f"period_source must be one of {PERIOD_SOURCES}, got "
                          f"{period_source!r}")
    times = [t for t in display_times if math.isfinite(t)]
    if not times:
        raise LatsimError("no display time to fit a refresh phase to")
    if not (math.isfinite(period) and period > 0):
        raise LatsimError(f"a display refresh period must be > 0 s, got {period}")
    angles = [2.0 * math.pi * (t % period) / period for t in times]
    x = math.fsum(math.cos(a) for a in angles)
    y = math.fsum(math.sin(a) for a in angles)
    phase = (math.atan2(y, x) / (2.0 * math.pi) * period) % period
    if phase >= period:  # rounding of a phase a hair below 0
        phase = 0.0
    spread = max(abs(_wrapped(t - phase, period)) for t in times)
    return RefreshFit(DisplayRefresh(period, phase), period_source, len(times), spread)


def _wrapped(x: float, period: float) -> float:
    """``x`` modulo ``period``, in ``[-period / 2, period / 2)``."""
    return (x + period / 2.0) % period - period / 2.0
