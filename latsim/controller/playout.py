"""The viewer client's playout rule: when a slot the server played is shown.

Pure logic, one rule for both clocks: the serving model's simulated client
(:mod:`latsim.sim.serving`) and the live viewer client (``harness.viewer.client``) feed it each
slot's server play time and its arrival at the client, in slot order, on one clock (the
live client converts server times with its clock-offset estimate first).

A slot is due ``delay`` after the server played it, plus the client's accumulated shift. A
slot that arrives after it was due freezes the client until it arrives (a client stall) and
shifts every later slot by as much, so the client never shows a slot before its predecessor
has had its full slot time.
"""

from __future__ import annotations

from dataclasses import dataclass

from latsim.controller.machine import EPS


@dataclass(frozen=True, slots=True)
class Shown:
    """Where one slot lands on the client: when it was due, when it is shown, and whether
    the client stalled for it (``shown > due``)."""

    due: float
    shown: float

    @property
    def stalled(self) -> bool:
        return self.shown > self.due


class ClientPlayout:
    """The playout buffer of one client with delay ``delay`` (seconds)."""

    __slots__ = ("delay", "shift")

    def __init__(self, delay: float) -> None:
        if not delay >= 0:
            raise ValueError(f"playout delay must be >= 0, got {delay}")
        self.delay = delay
        self.shift = 0.0  # seconds later than server time + delay, from earlier stalls

    def show(self, played: float, arrives: float) -> Shown:
        """The slot the server played at ``played`` arrives at ``arrives``: when it shows."""
        due = played + self.delay + self.shift
        if arrives > due + EPS:
            self.shift = arrives - played - self.delay
            return Shown(due, arrives)
        return Shown(due, due)
