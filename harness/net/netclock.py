"""Clock alignment and network shaping for a viewer client and a streaming server.

Pure logic (standard library and numpy): the client and server of the live end-to-end
measurement use it, and tests drive it with synthetic clocks.

Clock offset, NTP-style with the minimum-RTT rule (the paper's method, seed 000 §3.2): a
probe leaves the client at ``t0`` (client clock), reaches the server at ``t1`` and leaves it
at ``t2`` (server clock), and is back at ``t3`` (client clock). Its round trip is
``rtt = (t3 − t0) − (t2 − t1)`` and its offset estimate ``((t1 − t0) + (t2 − t3)) / 2``
(server minus client). Whatever the split of the round trip between the two directions, the
true offset lies within ``rtt / 2`` of that estimate, so the probe with the smallest round
trip gives the tightest bound: :func:`estimate_offset` reports its offset and ``rtt_min / 2``
as the uncertainty. :func:`estimate_drift` fits the offset's change over the run from the
best probe of each window.

Shaping (:class:`Shaper`): a one-way delay ``delay ± jitter`` (uniform) and a loss
probability, drawn from a seeded ``numpy.random.Generator`` so that a shaped run can be
repeated; messages on one connection keep their order (a stream socket does not reorder),
so a message is never delivered before the one sent ahead of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latsim.errors import OPTION_BOUNDS, LatsimError


@dataclass(frozen=True)
class Probe:
    """One clock probe: client send ``t0``, server receive ``t1`` and send ``t2``, client
    receive ``t3`` (client times on the client clock, server times on the server's)."""

    t0: float
    t1: float
    t2: float
    t3: float

    def __post_init__(self) -> None:
        if not all(math.isfinite(t) for t in (self.t0, self.t1, self.t2, self.t3)):
            raise LatsimError("a clock probe's times must be finite")
        if self.t3 < self.t0 or self.t2 < self.t1:
            raise LatsimError("a clock probe must come back after it left, on both clocks")

    @property
    def rtt(self) -> float:
        return (self.t3 - self.t0) - (self.t2 - self.t1)

    @property
    def offset(self) -> float:
        """Server clock minus client clock, as this probe sees it."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2


@dataclass(frozen=True)
class OffsetEstimate:
    """The min-RTT offset (server minus client, seconds), its bound and the probe count."""

    offset: float
    uncertainty: float  # rtt_min / 2: the true offset is within this of ``offset``
    rtt_min: float
    probes: int
    at: float  # the client time of the probe it came from

    def to_server(self, client_time: float) -> float:
        return client_time + self.offset

    def to_client(self, server_time: float) -> float:
        return server_time - self.offset


def estimate_offset(probes: Sequence[Probe]) -> OffsetEstimate:
    """The offset of the probe with the smallest round trip (the first of equals)."""
    if not probes:
        raise LatsimError("no clock probes: cannot estimate the clock offset")
    best = min(probes, key=lambda p: p.rtt)
    return OffsetEstimate(best.offset, best.rtt / 2, best.rtt, len(probes), best.t0)


def estimate_drift(probes: Sequence[Probe], windows: int = 4) -> float | None:
    """The offset's drift (seconds per second of client time): the least-squares slope of
    the min-RTT offset of each of ``windows`` equal spans of the probes (in send order).
    ``None`` with fewer than two non-empty windows."""
    if windows < 2 or len(probes) < 2:
        return None
    ordered = sorted(probes, key=lambda p: p.t0)
    spans = [ordered[i * len(ordered) // windows:(i + 1) * len(ordered) // windows]
             for i in range(windows)]
    best = [estimate_offset(span) for span in spans if span]
    if len(best) < 2:
        return None
    times = np.array([b.at for b in best])
    offsets = np.array([b.offset for b in best])
    if np.ptp(times) == 0:
        return None
    return float(np.polyfit(times, offsets, 1)[0])


@dataclass(frozen=True)
class Shaper:
    """Application-level network shaping of one direction of one connection."""

    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("delay", self.delay), ("jitter", self.jitter),
                            ("loss", self.loss)):
            OPTION_BOUNDS[f"--{name}"].check(f"shaped {name}", value)
        if self.jitter > self.delay:
            raise LatsimError(f"shaped jitter {self.jitter:g} s exceeds the delay "
                              f"{self.delay:g} s (a message cannot arrive before it is sent)")

    def channel(self, rng: np.random.Generator) -> Channel:
        return Channel(self, rng)


class Channel:
    """One shaped direction: :meth:`deliver_at` says when (or whether) a message sent at
    ``t`` arrives, drawing from its own generator, keeping the connection's order."""

    def __init__(self, shaper: Shaper, rng: np.random.Generator) -> None:
        self.shaper = shaper
        self.rng = rng
        self._last = -math.inf

    def deliver_at(self, sent: float) -> float | None:
        """The arrival time of a message sent at ``sent``, or ``None`` if it is lost."""
        shaper = self.shaper
        if shaper.loss and self.rng.random() < shaper.loss:
            return None
        delay = shaper.delay
        if shaper.jitter:
            delay += float(self.rng.uniform(-shaper.jitter, shaper.jitter))
        arrival = max(sent + delay, self._last)  # in order: never before the previous one
        self._last = arrival
        return arrival
