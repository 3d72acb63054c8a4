"""What ``latsim serve`` builds and how it serves: :class:`ServerConfig`, checked when made
(the schedule a registered one, every number in :data:`latsim.errors.OPTION_BOUNDS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.net.netclock import Shaper
from latsim.errors import LatsimError, check_option
from latsim.plugins import GeneratorConfig, available


def loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (reachable from nowhere else)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Connections one client address may hold before hello, by default: a viewer's host needs
#: one at a time, a few for a burst of viewers behind one address (the places are also
#: shared fairly between addresses: :mod:`harness.serve.admission`).
PENDING_PER_ADDRESS = 8


@dataclass(frozen=True)
class ServerConfig:
    """What ``latsim serve`` builds and how it serves."""

    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    generator_name: str = "wan"  # a registered live generator
    Ks: tuple[int, ...] = (4,)  # chunk sizes a session may ask for (warmed up at start)
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port
    schedule: str = "fifo"
    max_sessions: int = 8
    max_duration: float = 3600.0  # longest session window a viewer may ask for (s)
    warmup: int = 10  # timed warm-up jobs per K (they set the default lead)
    downlink: Shaper = field(default_factory=Shaper)  # default shaping of what it sends
    clock_offset: float = 0.0  # added to the server clock (tests of the viewer's alignment)
    #: the viewers' shared secret (``--token`` or ``LATSIM_TOKEN``): required at the
    #: WebSocket handshake as ``?token=T`` or ``Authorization: Bearer T``
    token: str | None = None
    allow_anonymous: bool = False  # serve a non-loopback address without a token
    #: the browser origins allowed to connect (``--allow-origin``); a connection without an
    #: Origin header (not a browser) is always allowed. None: any origin.
    origins: tuple[str, ...] | None = None
    #: conditions one session may send per second (a token bucket of this size); more
    #: are refused with ``error`` and counted
    max_condition_rate: float = 20.0
    max_fps: float = 60.0  # the highest video frame rate a viewer may ask for
    #: clock probes one connection may send per second (a token bucket of this size; the
    #: client sends at most 100 a second); past it the connection is closed (1008)
    max_probe_rate: float = 200.0
    #: what one connection may have queued and not yet sent (bytes, frames): a viewer
    #: that falls further behind is told (``error``: lagging) and, if it is still behind
    #: after ``lag_grace`` seconds, its session ends; its queue never grows past twice this
    max_queue_bytes: int = 8 * 2**20
    max_queue_frames: int = 512
    lag_grace: float = 5.0
    hello_timeout: float = 10.0  # seconds a connection may take to say hello
    #: connections that have not said hello (yet) held at once; more are refused
    max_pending: int = 64
    #: of them, from one client address, so that one client cannot take every place
    #: (None: :data:`PENDING_PER_ADDRESS`, or ``max_pending`` if fewer)
    max_pending_per_address: int | None = None
    #: a session's job still running this long (s) after its controller started it has
    #: hung: the session fails (``error``, then ``end``). None: max(10 x lead, lead + 5 s)
    job_timeout: float | None = None
    #: ``--out``: a server-side run folder per session (kind ``served``, named by its id)
    #: and the shared device's tasks of every session (``tasks.csv``) in this folder
    out: Path | None = None

    def __post_init__(self) -> None:
        if self.schedule not in available("schedules"):
            raise LatsimError(f"--schedule must be one of {', '.join(available('schedules'))}"
                              f", got {self.schedule!r}")
        if not self.Ks or len(self.Ks) > 16:
            raise LatsimError("--K takes 1 to 16 chunk sizes")
        for K in self.Ks:
            check_option("--K", K)
        for option, value in (("--port", self.port), ("--max-sessions", self.max_sessions),
                              ("--warmup", self.warmup), ("--max-duration", self.max_duration),
                              ("--max-condition-rate", self.max_condition_rate),
                              ("--max-fps", self.max_fps)):
            check_option(option, value)
        if self.token is not None and not 8 <= len(self.token) <= 256:
            raise LatsimError("--token must be 8 to 256 characters")
        if not (loopback(self.host) or self.token is not None or self.allow_anonymous):
            raise LatsimError(f"serving {self.host} (not loopback) without a token lets anyone "
                              "who can reach it in: give --token T (or LATSIM_TOKEN), or "
                              "--allow-anonymous")
        if not (2**10 <= self.max_queue_bytes <= 2**30 and 1 <= self.max_queue_frames
                <= 2**16 and 0 <= self.lag_grace <= 600):
            raise LatsimError("the outgoing queue bounds must be 1 KiB..1 GiB and 1..65536 "
                              "frames, the lag grace 0..600 s")
        if not 1 <= self.max_probe_rate <= 10_000:
            raise LatsimError(f"probe rate must be 1..10000 per s, got {self.max_probe_rate!r}")
        if not 0 < self.hello_timeout <= 600:
            raise LatsimError(f"hello timeout must be in (0, 600] s, got {self.hello_timeout!r}")
        if not 1 <= self.max_pending <= 4096:
            raise LatsimError(f"--max-pending (connections not past hello) must be 1..4096, "
                              f"got {self.max_pending!r}")
        if (self.max_pending_per_address is not None
                and not 1 <= self.max_pending_per_address <= self.max_pending):
            raise LatsimError(f"--max-pending-per-address must be 1..{self.max_pending} "
                              f"(--max-pending), got {self.max_pending_per_address!r}")
        if self.job_timeout is not None:
            check_option("--job-timeout", self.job_timeout)
        for origin in self.origins or ():
            check_origin(origin)

    @property
    def pending_per_address(self) -> int:
        """Connections one address may hold before hello."""
        if self.max_pending_per_address is not None:
            return self.max_pending_per_address
        return min(PENDING_PER_ADDRESS, self.max_pending)


def check_origin(origin: str) -> str:
    """An ``--allow-origin`` value as a browser sends it (RFC 6454): ``http`` or ``https``,
    a host and an optional port, nothing after; else a one-line error."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.path or parts.query or parts.fragment or parts.username
            or origin != origin.strip() or origin.endswith(":")):
        raise LatsimError(f"--allow-origin {origin!r} is not an origin: write it as a "
                          "browser sends it, e.g. http://localhost:8765 (scheme, host, port; "
                          "no path)")
    return origin
