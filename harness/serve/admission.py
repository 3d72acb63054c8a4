"""Who may hold a place before ``hello``: the server's fair share of its waiting places, as
pure logic (no sockets or clocks; :mod:`harness.serve.server` carries out its answers).

A connection that has not said hello yet holds one of ``--max-pending`` places, and one
client address holds at most ``--max-pending-per-address`` of them. Those two bounds alone
let a few addresses fill every place with idle connections and keep everyone else out
until the hello timeout, again and again (issue 51: eight addresses holding eight each
admitted none of 40 honest viewers for 60 s). So the places are shared max-min fairly:
when all are taken, a connection from an address holding fewer than the largest holder
less one takes the place of that holder's oldest connection, which is told so and closed.
An address is then refused only while every address holds at most one place more than
it does: idle connections from k addresses keep a newcomer out only once
``k ≥ --max-pending``, whatever they do.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Admission(Generic[Key]):
    """What :meth:`HelloPlaces.admit` decided: ``refused`` (a reason) or admitted, in
    which case ``evicted`` is the connection whose place it took, if any."""

    refused: str | None = None
    evicted: Key | None = None


class HelloPlaces(Generic[Key]):
    """The connections waiting to say hello, by address, within ``total`` places and
    ``per_address`` each, shared max-min fairly (the module's docstring)."""

    def __init__(self, total: int, per_address: int) -> None:
        if not 1 <= per_address <= total:
            raise ValueError(f"per_address must be in 1..{total}, got {per_address}")
        self.total = total
        self.per_address = per_address
        # address -> its waiting connections, oldest first (a dict keeps the order)
        self._by_address: dict[str, dict[Key, None]] = {}
        self._address_of: dict[Key, str] = {}
        self.evictions = 0  # places taken from a larger holder

    def __len__(self) -> int:
        return len(self._address_of)

    def held(self, address: str) -> int:
        """How many places ``address`` holds."""
        return len(self._by_address.get(address, ()))

    def admit(self, address: str, key: Key,
              evictable: Callable[[Key], bool] = lambda key: True) -> Admission[Key]:
        """Give ``key`` (a new connection from ``address``) a place, taking the oldest
        ``evictable`` one of the largest holder's if every place is taken and that holder
        has at least two more than ``address``; or refuse it. (A connection whose hello
        the server is acting on is not evictable: it is about to leave its place.)"""
        if key in self._address_of:
            raise ValueError(f"{key!r} already holds a place")
        held = self.held(address)
        if held >= self.per_address:
            return Admission(refused=f"too many connections from {address} waiting to say "
                                     f"hello ({self.per_address})")
        evicted = None
        if len(self._address_of) >= self.total:
            largest = max(self._by_address, key=lambda a: len(self._by_address[a]))
            evicted = next((k for k in self._by_address[largest] if evictable(k)), None)
            if len(self._by_address[largest]) < held + 2 or evicted is None:
                return Admission(refused=f"too many connections waiting to say hello "
                                         f"({self.total})")
            self.release(evicted)
            self.evictions += 1
        self._by_address.setdefault(address, {})[key] = None
        self._address_of[key] = address
        return Admission(evicted=evicted)

    def release(self, key: Key) -> bool:
        """``key`` said hello, left, or lost its place: it holds none now (True if it held
        one; again, False)."""
        address = self._address_of.pop(key, None)
        if address is None:
            return False
        connections = self._by_address[address]
        del connections[key]
        if not connections:
            del self._by_address[address]
        return True
