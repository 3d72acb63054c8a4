"""The exceptions that reach users as one line, and the bounds every input is checked against.

Every number a command takes has a validated range (:func:`check_int`, :func:`check_number`:
finite, positive where it must be, an integer where it must be, below a sane maximum), and
every command that does work proportional to its input has an explicit work bound, checked
before the work starts and named, with the flag that raises it, in its error message
(:data:`DEFAULT_MAX_EVENTS` for simulations, :data:`DEFAULT_MAX_TRACE_EVENTS` for traces). The
limits live here, at the bottom of the layers, so that the command line can show them in its
help without importing numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real


def install_hint(extra: str | None = None) -> str:
    """The pip command that installs latsim (with ``extra``) the way this copy was
    installed: ``pip install -e '.[EXTRA]'`` from an editable checkout, else from the path
    or URL pip recorded for it (its ``direct_url.json``), else ``pip install
    'latsim[EXTRA]'``. (``pip install -e .`` means nothing to a wheel's install.)"""
    import json
    from importlib import metadata

    suffix = f"[{extra}]" if extra else ""
    # the first copy with a record: run from a checkout, its bare latsim.egg-info (on the
    # path as the current folder) comes before the installed one
    recorded = next((text for dist in metadata.distributions(name="latsim")
                     if (text := dist.read_text("direct_url.json"))), None)
    try:
        direct = json.loads(recorded) if recorded else {}
    except ValueError:
        direct = {}
    url = direct.get("url") if isinstance(direct, dict) else None
    if not isinstance(url, str):
        return f"pip install 'latsim{suffix}'"
    if (direct.get("dir_info") or {}).get("editable"):
        return f"pip install -e '.{suffix}'"
    source = url.removeprefix("file://") if url.startswith("file://") else url
    return f"pip install '{source}{suffix}'"


class LatsimError(ValueError):
    """Bad input or configuration. ``str(error)`` is a complete, single-line explanation."""


class Interrupted(KeyboardInterrupt):
    """A run stopped early by Ctrl-C or SIGTERM after keeping what it measured.

    ``str(error)`` says, in one line, what was kept and where; the command line prints it
    after ``latsim: interrupted:`` and exits 130.
    """


# ---------------------------------------------------------------- ranges

#: Chunk size K in latent frames (the paper's largest is 124).
MAX_K = 4096
#: Pixel frames per latent frame r (Wan: 4, LTX: 8).
MAX_R = 1024
#: Video frames per second: 0.001 to 1000 (so δ = r/fps is finite and at least 1 ms per
#: pixel frame).
MIN_FPS, MAX_FPS = 1e-3, 1e3
#: Any one job time, planning lead or commit lead: one day. Longer is a unit mistake (ms
#: given as s), and unbounded values overflow the controller's slot arithmetic.
MAX_SECONDS = 86_400.0
#: A lognormal cost's coefficient of variation.
MAX_CV = 100.0
#: A run's, or a trace's, window: about 11.6 days.
MAX_DURATION = 1e6
#: Replications of one cell (``--seeds``).
MAX_SEEDS = 100_000
#: Root seeds are 63-bit.
MAX_SEED = 2**63 - 1
#: Worker processes (``--jobs``).
MAX_JOBS = 64
#: A Poisson update rate (per second) ``latsim theory`` takes.
MAX_RATE = 1e6
#: Traces in one generated set.
MAX_TRACE_COUNT = 100_000
#: A generated trace's shortest window: low and high traces need up to 11 distinct
#: millisecond times.
MIN_TRACE_DURATION = 1.0
#: The largest trace or cost-table file read (bytes); read with a bound so that a device
#: such as ``/dev/zero`` cannot hang a command.
MAX_INPUT_BYTES = 64 * 2**20
#: The largest run-folder record table read (bytes): a long run's own CSVs, not a device.
MAX_RECORD_FILE_BYTES = 4 * 2**30

# ---------------------------------------------------------------- work bounds

#: Simulated events one ``simulate``/``sweep``/``reproduce`` may cover (``--max-events``):
#: the sum over cells and replications of the latent slots a run may play,
#: (duration + drain)/δ, plus its expected conditions (each costs the controller about what
#: a slot does). The documented runs use a small share of it: ``sweep --K 4 8 21`` about 63
#: thousand, the whole of ``latsim reproduce`` about 1.9 million; at roughly 70 thousand
#: events a second per core the limit is a few minutes of simulation.
DEFAULT_MAX_EVENTS = 20_000_000
#: Conditions one ``traces`` command may generate (a set) or read (per file), its
#: ``--max-events``; the committed sets have under 3,000 in all.
DEFAULT_MAX_TRACE_EVENTS = 1_000_000
#: Record rows ``export perfetto`` may read (``--max-records``), every table of the folder
#: together: each becomes one to ten trace events, about 2 KB of JSON for a condition.
#: A 30 s simulated run has a few hundred; a 400,000-row conditions.csv made 756 MB of JSON
#: in 142 s before the bound.
DEFAULT_MAX_EXPORT_RECORDS = 100_000
#: The most ``--max-records`` may be raised to.
MAX_EXPORT_RECORDS = 100_000_000


def short(text: object) -> str:
    """``repr`` of a spec or name for a message, cut to a readable length."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "...'"


def _shown(value: object) -> str:
    """``repr`` of a value, shortened for integers too long to read (or to convert)."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        digits = len(str(abs(int(value)))) if abs(int(value)) < 10**4000 else None
        if digits is None or digits > 24:
            return f"an integer of {digits or 'over 4000'} digits"
        return str(int(value))
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int(name: str, value: object, lo: int, hi: int, why: str = "") -> int:
    """``value`` as an ``int`` if it is an integer in ``[lo, hi]``, else a
    :class:`LatsimError` naming the range ("K must be a positive integer <= 4096, got 0"),
    and ``why`` the range is what it is, if given."""
    if isinstance(value, Integral) and not isinstance(value, bool) and lo <= value <= hi:
        return int(value)
    if lo == 1:
        what = f"a positive integer <= {hi}"
    elif lo == 0:
        what = f"an integer >= 0 and <= {hi}"
    else:
        what = f"an integer in [{lo}, {hi}]"
    raise LatsimError(f"{name} must be {what}, got {_shown(value)}"
                      + (f" ({why})" if why else ""))


def check_number(name: str, value: object, lo: float, hi: float, *,
                 positive: bool = False, unit: str = "") -> float:
    """``value`` as a ``float`` if it is a finite number in ``[lo, hi]`` (and > 0 with
    ``positive``), else a :class:`LatsimError` naming the range."""
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)  # type: ignore[arg-type]
        except OverflowError:
            ok = False
        else:
            ok = math.isfinite(number) and lo <= number <= hi and (number > 0 or not positive)
    if ok:
        return number
    suffix = f" {unit}" if unit else ""
    if positive and lo <= 0:
        what = f"a positive number <= {hi:g}{suffix}"
    elif positive:
        what = f"a positive number in [{lo:g}, {hi:g}]{suffix}"
    else:
        what = f">= {lo:g} and <= {hi:g}{suffix}"
    raise LatsimError(f"{name} must be {what}, got {_shown(value)}")


@dataclass(frozen=True)
class Bound:
    """The accepted range of one option: ``[low, high]`` (``positive``: above 0 too), an
    integer where ``integer``; checked by :func:`check_int` or :func:`check_number`."""

    low: float
    high: float
    unit: str = ""
    integer: bool = False
    positive: bool = False

    def check(self, name: str, value: object) -> float:
        if self.integer:
            return check_int(name, value, int(self.low), int(self.high))
        return check_number(name, value, self.low, self.high, positive=self.positive,
                            unit=self.unit)


#: The ranges of the live harness's options (``measure``, ``profile``, ``serve``,
#: ``client``), by option; a wire message's field of the same name (``K`` for ``--K``,
#: ``playout_delay`` for ``--playout-delay``) has the same range.
OPTION_BOUNDS: dict[str, Bound] = {
    "--K": Bound(1, MAX_K, integer=True),  # a generator's own positions bound it too
    "--steps": Bound(1, 1000, integer=True),
    "--rate": Bound(0, 100, "conditions per second"),
    "--duration": Bound(0, 86400, "s", positive=True),  # measure: at most 1 h (below)
    "--lead": Bound(0, 600, "s"),
    "--job-timeout": Bound(0, 3600, "s", positive=True),
    "--r": Bound(1, 64, integer=True),
    "--fps": Bound(1, 240, "frames per second"),
    "--seed": Bound(0, 2**32 - 1, integer=True),
    "--context": Bound(0, 1024, integer=True),
    "--warmup": Bound(1, 1000, integer=True),
    "--warmup-untimed": Bound(0, 1000, integer=True),
    "--warmup-gap": Bound(0, 10, "s"),
    "--calibrate": Bound(0, 1000, integer=True),
    "--calibrate-max": Bound(0, 600, "s", positive=True),
    "--drain": Bound(0, 3600, "s"),
    "--threads": Bound(1, 1024, integer=True),
    "--jobs": Bound(1, 5000, integer=True),
    "--gap": Bound(0, 10, "s"),
    "--port": Bound(0, 65535, integer=True),
    "--max-sessions": Bound(1, 64, integer=True),
    "--max-duration": Bound(1, 86400, "s"),
    "--max-fps": Bound(1, 240, "frames per second"),
    "--max-condition-rate": Bound(0, 1000, "conditions per second", positive=True),
    "--playout-delay": Bound(0, 60, "s"),
    "--delay": Bound(0, 60, "s"),
    "--jitter": Bound(0, 60, "s"),
    # at most half: the protocol does not resend, and past that a session measures little
    # (at 1 every probe, frame and condition is lost and the session never starts)
    "--loss": Bound(0, 0.5),
    "--probes": Bound(1, 1000, integer=True),
    "--probe-every": Bound(0.01, 60, "s"),
    "--connect-timeout": Bound(0.1, 600, "s"),
}
#: The ranges of the wire protocol's fields that no option sets (``latsim serve`` and
#: ``latsim client``; :mod:`harness.net.wire`).
WIRE_BOUNDS: dict[str, Bound] = {
    "t0": Bound(-1e12, 1e12, "s"), "t1": Bound(-1e12, 1e12, "s"),
    "t2": Bound(-1e12, 1e12, "s"), "sent": Bound(-1e12, 1e12, "s"),
    "cid": Bound(0, 2**53, integer=True),
}
#: A measurement's window per run (``measure --duration``), seconds.
MAX_LIVE_WINDOW_S = 3600.0


def check_option(option: str, value: object) -> None:
    """A one-line :class:`LatsimError` unless ``value`` is in ``option``'s range
    (:data:`OPTION_BOUNDS`; ``None``, a documented default, passes)."""
    if value is not None:
        OPTION_BOUNDS[option].check(option, value)


def check_work(amount: float, limit: int, flag: str, what: str, hint: str = "") -> None:
    """Refuse work above ``limit`` before it starts: one line naming what was counted, the
    limit and the ``flag`` that raises it (``what`` reads "covers about N <unit>")."""
    if not amount <= limit:
        raise LatsimError(
            f"{what.replace('{n}', f'{amount:.3g}')}, above the work bound of {limit:,} "
            f"(raise it with {flag}{hint})"
        )
