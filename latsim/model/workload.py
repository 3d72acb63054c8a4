"""A fleet's workload (DESIGN §8): sessions that arrive, last a while, and alternate active
and idle periods.

Specs (TOML ``[workload]``; every number is range-checked, bad input is one line):

- arrivals: ``poisson:RATE`` (sessions per second), ``curve:PATH`` (a CSV of ``t,rate``
  rows: the rate from each ``t`` to the next, the last one to the end), ``mmpp:R1,R2,M1,M2``
  (a two-state Markov-modulated Poisson process: rates R1 and R2 per second, mean sojourns
  M1 and M2 seconds, starting in state 1), or ``population:N`` (N sessions present for the
  whole run and never idle, joining as ``simulate --streams N`` staggers them);
- duration, the seconds a session watches (playback, idle periods included; waiting for
  admission and first chunks come on top): ``fixed:S``, ``exponential:MEAN``,
  ``lognormal:MEAN,CV`` or ``pareto:MEAN,ALPHA`` (ALPHA > 1; a heavy tail);
- activity: ``always`` or ``active_idle:ACTIVE_MEAN,IDLE_MEAN`` (exponential periods,
  starting active; an idle session generates and plays nothing).

:func:`sample_sessions` draws the sessions of one run from one random stream; each
session's active periods are its *segments*, each played as one stream on a node.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from latsim.errors import MAX_DURATION, LatsimError
from latsim.model.traces import read_input_file
from latsim.numeric import least_true
from latsim.plugins.spec import is_number, numbers, short, split

#: Sessions one run may draw (the work bound of the sampler; a typo'd rate fails here).
MAX_SESSIONS = 1_000_000
#: Rows of a ``curve:`` file.
MAX_CURVE_ROWS = 100_000

#: A steady-state measurement (``latsim plan``, ``latsim fleet plan``) without ``[run]
#: warmup`` first plays the M/G/∞ ramp from empty to this share of the steady sessions
#: present (:meth:`Workload.ramp`), and measures after it ...
STEADY_LEVEL = 0.99
#: ... but for at most this many mean session lengths: a heavy tail's ramp is far longer
#: (Pareto sessions of α = 1.5 need 1,480 mean lengths to reach 99 %; after 10 they hold 88 %).
STEADY_MEANS = 10


# ---------------------------------------------------------------- durations


@dataclass(frozen=True)
class DurationLaw:
    """How long a session watches: a positive distribution with a finite mean."""

    spec: str
    kind: str  # fixed | exponential | lognormal | pareto
    mean: float
    shape: float = 0.0  # lognormal: CV; pareto: alpha

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            return self.mean
        if self.kind == "exponential":
            return float(rng.exponential(self.mean))
        if self.kind == "lognormal":
            sigma2 = math.log1p(self.shape**2)
            return float(rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2)))
        alpha = self.shape  # pareto with scale x_m = mean (alpha - 1) / alpha
        return float(self.mean * (alpha - 1) / alpha * (1 - rng.random()) ** (-1 / alpha))

    def survival(self, s: float) -> float:
        """P(D > ``s``)."""
        if s < 0:
            return 1.0
        if self.kind == "fixed":
            return 1.0 if s < self.mean else 0.0
        if self.kind == "exponential":
            return math.exp(-s / self.mean)
        if self.kind == "lognormal":
            sigma2 = math.log1p(self.shape**2)
            if sigma2 == 0:
                return 1.0 if s < self.mean else 0.0
            if s == 0:
                return 1.0
            mu = math.log(self.mean) - sigma2 / 2
            return 0.5 * math.erfc((math.log(s) - mu) / math.sqrt(2 * sigma2))
        alpha = self.shape
        scale = self.mean * (alpha - 1) / alpha
        return 1.0 if s < scale else (scale / s) ** alpha

    def held(self, t: float) -> float:
        """E[min(D, ``t``)]: the seconds a session holds its slot within ``t`` of joining
        (the integral of :meth:`survival` over ``[0, t]``, in closed form)."""
        if t <= 0:
            return 0.0
        if self.kind == "exponential":
            return self.mean * -math.expm1(-t / self.mean)
        sigma2 = math.log1p(self.shape**2) if self.kind == "lognormal" else 0.0
        if self.kind == "fixed" or (self.kind == "lognormal" and sigma2 == 0):
            return min(self.mean, t)
        if self.kind == "lognormal":
            mu, sigma = math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2)
            z = (math.log(t) - mu) / sigma
            below = 0.5 * math.erfc(-(z - sigma) / math.sqrt(2))  # Φ(z − σ)
            return self.mean * below + t * 0.5 * math.erfc(z / math.sqrt(2))
        alpha = self.shape
        scale = self.mean * (alpha - 1) / alpha
        if t <= scale:
            return t
        return self.mean - scale**alpha * t ** (1 - alpha) / (alpha - 1)


def parse_duration(spec: str) -> DurationLaw:
    """A session duration spec (see the module docstring)."""
    what = "duration spec"
    kind, body = split(what, spec, "fixed:60")
    if kind in ("fixed", "exponential"):
        (mean,) = numbers(what, spec, body, 1)
        shape = 0.0
    elif kind in ("lognormal", "pareto"):
        mean, shape = numbers(what, spec, body, 2)
    else:
        raise LatsimError(f"unknown {what} prefix {short(kind)}; use fixed:, exponential:, "
                          "lognormal: or pareto:")
    if not 0 < mean <= MAX_DURATION:
        raise LatsimError(f"{what} {short(spec)}: the mean must be in (0, {MAX_DURATION:g}] "
                          f"seconds, got {mean:g}")
    if kind == "lognormal" and not 0 <= shape <= 100:
        raise LatsimError(f"{what} {short(spec)}: CV must be in [0, 100], got {shape:g}")
    if kind == "pareto" and not 1 < shape <= 100:
        raise LatsimError(f"{what} {short(spec)}: ALPHA must be in (1, 100] (a finite "
                          f"mean), got {shape:g}")
    return DurationLaw(spec, kind, mean, shape)


# ---------------------------------------------------------------- arrivals


@dataclass(frozen=True)
class SessionArrivals:
    """When sessions arrive: a piecewise-constant rate, a two-state MMPP, or a population."""

    spec: str
    kind: str  # poisson | curve | mmpp | population
    #: poisson and curve: (start time, rate) pieces; mmpp: ((R1, M1), (R2, M2))
    pieces: tuple[tuple[float, float], ...] = ()
    population: int = 0

    def mean_rate(self, horizon: float) -> float:
        """The average arrival rate over ``[0, horizon)`` (the MMPP's stationary one)."""
        if self.kind == "population":
            return 0.0
        if self.kind == "mmpp":
            (r1, m1), (r2, m2) = self.pieces
            return (r1 * m1 + r2 * m2) / (m1 + m2)
        total = 0.0
        for i, (start, rate) in enumerate(self.pieces):
            end = self.pieces[i + 1][0] if i + 1 < len(self.pieces) else horizon
            total += rate * max(0.0, min(end, horizon) - min(start, horizon))
        return total / horizon

    def rate_at(self, t: float) -> float:
        """The arrival rate at time ``t`` (the MMPP's stationary mean rate)."""
        if self.kind == "population":
            return 0.0
        if self.kind == "mmpp":
            return self.mean_rate(1.0)
        rate = 0.0
        for start, piece in self.pieces:
            if start <= t:
                rate = piece
        return rate

    def times(self, horizon: float, rng: np.random.Generator) -> list[float]:
        """Arrival times in ``[0, horizon)``."""
        if self.kind == "mmpp":
            return self._mmpp(horizon, rng)
        out: list[float] = []
        for i, (start, rate) in enumerate(self.pieces):
            end = min(self.pieces[i + 1][0] if i + 1 < len(self.pieces) else horizon, horizon)
            t = start
            while rate > 0 and t < end:
                t += float(rng.exponential(1 / rate))
                if t < end:
                    out.append(t)
                    _check_count(len(out), self.spec)
        return out

    def _mmpp(self, horizon: float, rng: np.random.Generator) -> list[float]:
        out: list[float] = []
        t, state = 0.0, 0
        while t < horizon:
            rate, sojourn = self.pieces[state]
            leave = min(horizon, t + float(rng.exponential(sojourn)))
            while rate > 0:
                t += float(rng.exponential(1 / rate))
                if t >= leave:
                    break
                out.append(t)
                _check_count(len(out), self.spec)
            t, state = leave, 1 - state
        return out


def _check_count(count: int, spec: str) -> None:
    if count > MAX_SESSIONS:
        raise LatsimError(f"arrivals {short(spec)} draw more than {MAX_SESSIONS:,} sessions "
                          "in the run; lower the rate or the duration")


def _curve(spec: str, path: str) -> tuple[tuple[float, float], ...]:
    text = read_input_file(path, "arrival curve")
    rows = [row for row in csv.reader(io.StringIO(text)) if row and any(c.strip() for c in row)]
    if rows and not is_number(rows[0][0]):
        rows = rows[1:]  # a header
    if not rows:
        raise LatsimError(f"{path}: an arrival curve needs rows of t,rate")
    if len(rows) > MAX_CURVE_ROWS:
        raise LatsimError(f"{path}: more than {MAX_CURVE_ROWS:,} rows")
    pieces = []
    for number, row in enumerate(rows, 1):
        if len(row) != 2:
            raise LatsimError(f"{path}: row {number}: expected t,rate, got {','.join(row)!r}")
        t, rate = numbers("arrival curve row", ",".join(row), ",".join(row), 2)
        if rate < 0 or t < 0:
            raise LatsimError(f"{path}: row {number}: t and rate must be >= 0")
        if pieces and t <= pieces[-1][0]:
            raise LatsimError(f"{path}: row {number}: t must increase, got {t:g} after "
                              f"{pieces[-1][0]:g}")
        pieces.append((t, rate))
    if pieces[0][0] != 0:
        pieces.insert(0, (0.0, 0.0))  # no arrivals before the curve's first time
    return tuple(pieces)


def parse_arrivals(spec: str) -> SessionArrivals:
    """A session arrival spec (see the module docstring)."""
    what = "arrivals spec"
    kind, body = split(what, spec, "poisson:0.5")
    if kind == "poisson":
        (rate,) = numbers(what, spec, body, 1)
        if not 0 <= rate <= 1e4:
            raise LatsimError(f"{what} {short(spec)}: the rate must be in [0, 10000] "
                              f"sessions per second, got {rate:g}")
        return SessionArrivals(spec, kind, ((0.0, rate),))
    if kind == "curve":
        return SessionArrivals(spec, kind, _curve(spec, body))
    if kind == "mmpp":
        r1, r2, m1, m2 = numbers(what, spec, body, 4)
        if not (0 <= r1 <= 1e4 and 0 <= r2 <= 1e4):
            raise LatsimError(f"{what} {short(spec)}: rates must be in [0, 10000] per second")
        if not (0 < m1 <= MAX_DURATION and 0 < m2 <= MAX_DURATION):
            raise LatsimError(f"{what} {short(spec)}: mean sojourns must be in (0, "
                              f"{MAX_DURATION:g}] seconds")
        return SessionArrivals(spec, kind, ((r1, m1), (r2, m2)))
    if kind == "population":
        body = body.strip()
        if not (body.isascii() and body.isdigit()) or not 1 <= int(body) <= 16384:
            raise LatsimError(f"{what} {short(spec)}: N must be an integer in [1, 16384]")
        return SessionArrivals(spec, kind, population=int(body))
    raise LatsimError(f"unknown {what} prefix {short(kind)}; use poisson:, curve:, mmpp: or "
                      "population:")


# ---------------------------------------------------------------- activity


@dataclass(frozen=True)
class Activity:
    """Always active, or alternating exponential active and idle periods."""

    spec: str
    active_mean: float = math.inf
    idle_mean: float = 0.0

    @property
    def always(self) -> bool:
        return math.isinf(self.active_mean)

    def segments(self, duration: float, rng: np.random.Generator
                 ) -> tuple[tuple[float, float], ...]:
        """The active periods ``(start, length)`` within ``[0, duration)``."""
        if self.always:
            return ((0.0, duration),)
        out, t = [], 0.0
        while t < duration:
            length = min(float(rng.exponential(self.active_mean)), duration - t)
            out.append((t, length))
            t += length + float(rng.exponential(self.idle_mean))
        return tuple(out)

    @property
    def active_fraction(self) -> float:
        """The long-run share of a session's time that is active."""
        return 1.0 if self.always else self.active_mean / (self.active_mean + self.idle_mean)


def parse_activity(spec: str) -> Activity:
    """An activity spec (see the module docstring)."""
    if spec == "always":
        return Activity(spec)
    kind, sep, body = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if kind != "active_idle" or not sep:
        raise LatsimError(f"activity {short(str(spec))} must be always or "
                          "active_idle:ACTIVE_MEAN,IDLE_MEAN")
    active, idle = numbers("activity", spec, body, 2)
    for name, value in (("ACTIVE_MEAN", active), ("IDLE_MEAN", idle)):
        if not 0 < value <= MAX_DURATION:
            raise LatsimError(f"activity {short(spec)}: {name} must be in (0, "
                              f"{MAX_DURATION:g}] seconds, got {value:g}")
    return Activity(spec, active, idle)


# ---------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Session:
    """One viewer's session: it arrives at ``arrival`` (global time) and watches for
    ``duration`` seconds once admitted; ``segments`` are its active periods ``(start,
    length)`` in its own time. ``conditions``, from a session log, are its condition times
    per segment (each in that segment's own time); None: drawn from the updates spec."""

    index: int
    arrival: float
    duration: float
    segments: tuple[tuple[float, float], ...]
    conditions: tuple[tuple[float, ...], ...] | None = None


#: The keys of a session log's line.
LOG_KEYS = ("session", "arrival", "duration", "active", "conditions")


def load_session_log(path: str | Path) -> tuple[Session, ...]:
    """A provider's sessions from a JSONL log, one session a line (docs/fleet.md)::

        {"arrival": 12.5, "duration": 300, "active": [[0, 120], [150, 300]],
         "conditions": [3.1, 40.0, 170.2]}

    ``arrival`` (s, global) is required; ``duration`` defaults to the end of the last
    active period; ``active`` (periods in the session's own time, in order, not
    overlapping) defaults to the whole duration; ``conditions`` (the session's own time)
    are split over its active periods (one outside every period is an error), and without
    them the updates spec draws them. Sessions are numbered in arrival order. Any bad line is
    a one-line error naming the file and the line."""
    import json

    text = read_input_file(path, "session log")
    sessions = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            raise LatsimError(f"{where}: not a JSON object") from None
        if not isinstance(row, dict):
            raise LatsimError(f"{where}: not a JSON object")
        unknown = set(row) - set(LOG_KEYS)
        if unknown:
            raise LatsimError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(LOG_KEYS)})")
        sessions.append(_logged(row, where))
        _check_count(len(sessions), str(path))
    if not sessions:
        raise LatsimError(f"{path}: a session log needs at least one session")
    sessions.sort(key=lambda s: s.arrival)
    return tuple(replace(s, index=i) for i, s in enumerate(sessions))


def _number(where: str, key: str, value: object, lo: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and lo <= value <= MAX_DURATION):
        raise LatsimError(f"{where}: {key} must be a number of seconds in [{lo:g}, "
                          f"{MAX_DURATION:g}], got {value!r}")
    return float(value)


def _logged(row: dict, where: str) -> Session:
    if "arrival" not in row:
        raise LatsimError(f"{where}: a session needs its arrival")
    arrival = _number(where, "arrival", row["arrival"])
    active = row.get("active")
    periods: list[tuple[float, float]] = []
    if active is not None:
        if not isinstance(active, list) or not active:
            raise LatsimError(f"{where}: active must be a non-empty list of [start, end]")
        for period in active:
            if not (isinstance(period, list) and len(period) == 2):
                raise LatsimError(f"{where}: each active period is [start, end], got "
                                  f"{period!r}")
            start, end = (_number(where, "an active period's time", v) for v in period)
            if end <= start or (periods and start < periods[-1][1]):
                raise LatsimError(f"{where}: active periods must be in order, each ending "
                                  "after it starts and none overlapping")
            periods.append((start, end))
    if "duration" in row:
        duration = _number(where, "duration", row["duration"])
    elif periods:
        duration = periods[-1][1]
    else:
        raise LatsimError(f"{where}: a session needs a duration or its active periods")
    if duration <= 0:
        raise LatsimError(f"{where}: duration must be positive")
    if not periods:
        periods = [(0.0, duration)]
    if periods[-1][1] > duration + 1e-9:
        raise LatsimError(f"{where}: an active period ends after the duration {duration:g}")
    segments = tuple((start, end - start) for start, end in periods)
    conditions = None
    if "conditions" in row:
        times = row["conditions"]
        if not isinstance(times, list):
            raise LatsimError(f"{where}: conditions must be a list of times")
        values = [_number(where, "a condition's time", t) for t in times]
        if values != sorted(values):
            raise LatsimError(f"{where}: conditions must be in time order")
        split: list[list[float]] = [[] for _ in periods]
        for t in values:
            k = next((i for i, (start, end) in enumerate(periods) if start <= t < end), None)
            if k is None:
                raise LatsimError(f"{where}: condition at {t:g} s falls in no active period")
            split[k].append(t - periods[k][0])
        conditions = tuple(tuple(c) for c in split)
    return Session(0, arrival, duration, segments, conditions)


@dataclass(frozen=True)
class Workload:
    arrivals: SessionArrivals
    duration: DurationLaw
    activity: Activity
    updates: str
    log: tuple[Session, ...] | None = None  # replayed sessions instead of drawn ones
    log_path: str | None = None

    @property
    def population(self) -> bool:
        return self.log is None and self.arrivals.kind == "population"

    @property
    def stationary(self) -> bool:
        """Drawn arrivals at a rate that does not depend on the time (poisson, mmpp)."""
        return self.log is None and self.arrivals.kind in ("poisson", "mmpp")

    def ramp(self, level: float = 0.99) -> float:
        """Seconds from an empty start until the sessions present reach ``level`` of their
        steady mean (M/G/∞ with stationary arrivals: E[min(D, t)] >= level · E[D]), to the
        second, at most :data:`MAX_DURATION` (a heavy tail may need longer). Sessions of a
        fixed length D reach it at level · D, exponential ones of mean m at m · ln(1/(1 −
        level))."""
        if not 0 < level < 1:
            raise LatsimError(f"ramp level must be in (0, 1), got {level!r}")
        law, goal = self.duration, level * self.duration.mean
        if law.held(MAX_DURATION) < goal:
            return MAX_DURATION
        seconds = math.ceil(least_true(lambda t: law.held(t) >= goal, 0.0, MAX_DURATION, 0.5))
        return seconds - 1 if law.held(seconds - 1) >= goal else seconds  # the least whole

    def steady_warmup(self) -> float:
        """The warm-up a measurement of the steady state plays by default: the ramp to
        :data:`STEADY_LEVEL` of the steady sessions present, at most :data:`STEADY_MEANS`
        mean session lengths (whole seconds); 0 where the arrivals are not stationary (a
        population starts together; a curve or a log is its own timeline)."""
        if not self.stationary:
            return 0.0
        return float(min(self.ramp(STEADY_LEVEL),
                         math.ceil(STEADY_MEANS * self.duration.mean)))

    def offered_load(self, horizon: float) -> float:
        """Sessions present on average with unlimited capacity (M/G/∞: λ·E[D]; a log's own
        sessions' time within the horizon)."""
        if self.log is not None:
            return sum(max(0.0, min(s.arrival + s.duration, horizon) - s.arrival)
                       for s in self.log if s.arrival < horizon) / horizon
        if self.population:
            return float(self.arrivals.population)
        return self.arrivals.mean_rate(horizon) * self.duration.mean

    def viewer_seconds(self, horizon: float, steps: int = 2000) -> float:
        """Expected session-seconds present in ``[0, horizon)`` from an empty start with
        unlimited room (M/G/∞: ∫ λ(a) E[min(D, horizon − a)] da; a population's N·horizon,
        a log's own), idle time included; numerically, in ``steps`` steps."""
        if self.log is not None or self.population:
            return self.offered_load(horizon) * horizon
        step = horizon / steps
        # M(x) = ∫0^x P(D > s) ds = E[min(D, x)], by the trapezoid rule on the same grid
        survival = [self.duration.survival(i * step) for i in range(steps + 1)]
        held = [0.0]
        for i in range(steps):
            held.append(held[-1] + (survival[i] + survival[i + 1]) * step / 2)
        total = 0.0
        for i in range(steps):
            total += self.arrivals.rate_at((i + 0.5) * step) * held[steps - i] * step
        return total

    def present_over(self, horizon: float, steps: int = 2000) -> list[float]:
        """Expected sessions present at the middle of each of ``steps`` equal steps of
        ``[0, horizon)``, from an empty start with unlimited room (M/G/∞: m(t) = ∫0^t λ(a)
        P(D > t − a) da, by the midpoint rule; a population's N throughout). A log's
        sessions give their own count at each midpoint."""
        step = horizon / steps
        middles = [(i + 0.5) * step for i in range(steps)]
        if self.population:
            return [float(self.arrivals.population)] * steps
        if self.log is not None:
            return [float(sum(1 for s in self.log if s.arrival <= t < s.arrival + s.duration))
                    for t in middles]
        # arrivals in step j still present at step i's middle: P(D > (i − j)·step); of
        # step i's own, the half that has arrived by its middle
        arriving = np.array([self.arrivals.rate_at(t) * step for t in middles])
        staying = np.array([0.5] + [self.duration.survival(k * step)
                                    for k in range(1, steps)])
        return [float(v) for v in np.convolve(arriving, staying)[:steps]]

    @property
    def active_fraction(self) -> float:
        if self.log is None:
            return self.activity.active_fraction
        total = sum(s.duration for s in self.log)
        return sum(length for s in self.log for _, length in s.segments) / total


def parse_workload(arrivals: str, duration: str, activity: str, updates: str,
                   log: str | None = None) -> Workload:
    """The workload of a fleet file's ``[workload]``; with ``log``, its sessions replayed
    (``arrivals``, ``duration`` and ``activity`` then describe nothing and are not
    given)."""
    from latsim.model.arrivals import parse_updates

    parse_updates(updates)  # a bad updates spec fails before any work
    if log is not None:
        sessions = load_session_log(log)
        return Workload(SessionArrivals(f"log:{log}", "log"), parse_duration("fixed:1"),
                        parse_activity("always"), updates, sessions, log)
    return Workload(parse_arrivals(arrivals), parse_duration(duration),
                    parse_activity(activity), updates)


def sample_sessions(workload: Workload, horizon: float, rng: np.random.Generator,
                    joins: tuple[float, ...] = ()) -> tuple[Session, ...]:
    """The sessions of one run of ``horizon`` seconds. A population's sessions join at
    ``joins`` (one per session, as the serving model's ``start`` places streams) and watch
    for the whole run."""
    if workload.log is not None:
        return tuple(s for s in workload.log if s.arrival < horizon)
    if workload.population:
        return tuple(Session(i, join, horizon, ((0.0, horizon),))
                     for i, join in enumerate(joins))
    times = workload.arrivals.times(horizon, rng)
    sessions = []
    for index, arrival in enumerate(times):
        duration = workload.duration.sample(rng)
        sessions.append(Session(index, arrival, duration,
                                workload.activity.segments(duration, rng)))
    return tuple(sessions)
