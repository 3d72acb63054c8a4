"""A token bucket: how often one viewer may do something (send a condition, a clock probe)."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens a second, at most ``size`` held; full at ``now`` (seconds, any
    monotonic clock). Each :meth:`take` spends one token if there is one."""

    __slots__ = ("rate", "size", "_tokens", "_since")

    def __init__(self, rate: float, size: float, now: float) -> None:
        self.rate = rate
        self.size = size
        self._tokens = size
        self._since = now

    def take(self, now: float) -> bool:
        """Spend a token at ``now``; False (none spent) if the bucket is empty."""
        tokens = self._level(now)
        self._since = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until a token is there to take (0: one is), changing
        nothing."""
        tokens = self._level(now)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def _level(self, now: float) -> float:
        """The tokens held at ``now``: those left, refilled at the rate, at most ``size``."""
        return min(self.size, self._tokens + (now - self._since) * self.rate)
