"""The registries of the four extension points, filled from entry points.

Built-ins register exactly as third parties do (``[project.entry-points."latsim.costs"]``
and so on in ``pyproject.toml``), so adding one never means editing a table in latsim.
Discovery is lazy: the installed distributions' entry points are read once, the first time
any registry is asked, and an entry is imported only when its name is used. Both are
cached for the process (:func:`refresh` forgets them).

A name registered by two distributions, a plug-in that fails to import, or one that gives
the wrong kind of object is a one-line :class:`~latsim.errors.LatsimError` naming the
plug-in and its distribution, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from latsim.errors import LatsimError, install_hint, short

#: The entry-point group of each kind of plug-in.
GROUPS = {
    "costs": "latsim.costs",
    "schedules": "latsim.schedules",
    "generators": "latsim.generators",
    "placements": "latsim.placements",
}
#: How a message names one plug-in of each kind.
WHAT = {"costs": "cost model", "schedules": "schedule", "generators": "generator",
        "placements": "placement"}


@dataclass(frozen=True)
class Plugin:
    """One registered entry: its kind and name, what it points at and who provides it."""

    kind: str
    name: str
    target: str  # ``module:attribute``
    distribution: str  # ``name version``
    entry: Any = field(default=None, compare=False, repr=False)  # its importlib EntryPoint

    def describe(self) -> str:
        return f"{WHAT[self.kind]} {self.name!r} ({self.target}, from {self.distribution})"


_found: dict[str, dict[str, list[Plugin]]] | None = None
_loaded: dict[tuple[str, str], Any] = {}


def refresh() -> None:
    """Forget what was discovered and loaded (a package was installed meanwhile)."""
    global _found
    _found = None
    _loaded.clear()


def _discover() -> dict[str, dict[str, list[Plugin]]]:
    global _found
    if _found is None:
        from importlib.metadata import entry_points

        found: dict[str, dict[str, list[Plugin]]] = {kind: {} for kind in GROUPS}
        every = entry_points()  # one scan of the installed distributions for all groups
        for kind, group in GROUPS.items():
            for entry in every.select(group=group):
                dist = entry.dist
                provider = (f"{dist.name} {dist.version}" if dist is not None
                            else "an unknown distribution")
                plugins = found[kind].setdefault(entry.name, [])
                if all(p.distribution != provider for p in plugins):  # a path seen twice
                    plugins.append(Plugin(kind, entry.name, entry.value, provider, entry))
        _found = found
    return _found


def _kind(kind: str) -> str:
    if kind not in GROUPS:
        raise LatsimError(f"unknown kind of plug-in {kind!r}; choose {', '.join(GROUPS)}")
    return kind


def plugins(kind: str) -> list[Plugin]:
    """Every registered entry of ``kind``, by name (a name two distributions register
    appears twice)."""
    found = _discover()[_kind(kind)]
    return [p for name in sorted(found) for p in found[name]]


def available(kind: str) -> tuple[str, ...]:
    """The registered names of ``kind`` (``costs``, ``schedules`` or ``generators``)."""
    return tuple(sorted(_discover()[_kind(kind)]))


def lookup(kind: str, name: str) -> Plugin:
    """The one entry registered as ``name``; a one-line error if there is none or several."""
    found = _discover()[_kind(kind)].get(name) if isinstance(name, str) else None
    if not found:
        names = (", ".join(available(kind))
                 or f"none (is latsim installed? {install_hint()})")
        raise LatsimError(f"unknown {WHAT[kind]} {short(str(name))}; registered: {names}")
    if len(found) > 1:
        providers = " and by ".join(sorted(p.distribution for p in found))
        raise LatsimError(f"{WHAT[kind]} {name!r} is registered by {providers}; uninstall one")
    return found[0]


def load(kind: str, name: str) -> Any:
    """The object ``name`` points at, imported once; it must be callable."""
    plugin = lookup(kind, name)  # a name that is not a registered string fails here
    key = (kind, name)
    if key in _loaded:
        return _loaded[key]
    try:
        value = plugin.entry.load()
    except LatsimError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of foreign code is one line
        raise LatsimError(f"{plugin.describe()} failed to import: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None
    if not callable(value):
        raise LatsimError(f"{plugin.describe()} is a {type(value).__name__}, not a callable")
    _loaded[key] = value
    return value


def call(kind: str, name: str, *args: Any) -> Any:
    """Call plug-in ``name`` with ``args``: its own :class:`LatsimError` passes through,
    any other exception becomes one naming the plug-in."""
    factory = load(kind, name)
    try:
        return factory(*args)
    except LatsimError:
        raise
    except Exception as exc:  # noqa: BLE001 - foreign code
        raise LatsimError(f"{lookup(kind, name).describe()} failed: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None


def wrong_type(kind: str, name: str, value: object, expected: str) -> LatsimError:
    """The error for a plug-in that returned ``value`` where ``expected`` belongs."""
    return LatsimError(f"{lookup(kind, name).describe()} returned a "
                       f"{type(value).__name__}, not {expected}")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, for a one-line error."""
    text = str(exc).strip().splitlines()
    return text[0] if text else "(no message)"
