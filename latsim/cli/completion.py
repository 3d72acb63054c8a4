"""Shell completion of option values (``latsim --install-completion``): the registered
plug-ins' names (schedules, generators, placements), the cost and update specs' prefixes,
and the fixed choices. Each completer is a plain function of the word typed so far; the
plug-in registry is read only when the shell asks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Completer = Callable[[str], list[str]]


def choices(*values: str) -> Completer:
    """Complete one of ``values``."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


def plugins(kind: str) -> Completer:
    """Complete a registered plug-in's name of ``kind`` (``latsim plugins KIND``)."""

    def complete(incomplete: str) -> list[str]:
        from latsim.plugins import available

        return [name for name in available(kind) if name.startswith(incomplete)]

    return complete


def prefixes(kind: str | None = None, builtin: Sequence[str] = ()) -> Completer:
    """Complete a spec's ``PREFIX:``: ``builtin`` ones and, with ``kind``, every plug-in's
    of that kind."""

    def complete(incomplete: str) -> list[str]:
        names = list(builtin)
        if kind is not None:
            from latsim.plugins import available

            names += [name for name in available(kind) if name not in names]
        return [f"{name}:" for name in names if f"{name}:".startswith(incomplete)]

    return complete
