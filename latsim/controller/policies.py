"""Commitment policies: the commit unit ``q`` and when output becomes irreplaceable.

``baseline`` is chunk-boundary commitment (q = K, eager: a finished chunk is committed at
once); ``speculative`` is latent-boundary commitment (q = 1, lazy: a latent is committed when
it starts playing, or ``commit_lead`` seconds before). Other combinations are ablations.
Under eager commit the commit unit does not matter: a finished job's whole output is
committed at once, so nothing is ever replanned and every eager policy behaves like the
baseline; ``q`` matters under lazy commit, where it sets the group that playback locks and
the alignment of replan branches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from latsim.errors import LatsimError

CommitMode = Literal["eager", "lazy"]


@dataclass(frozen=True)
class Policy:
    """How generated latents are committed. ``q=None`` means "the chunk size K"."""

    name: str
    q: int | None
    commit: CommitMode
    commit_lead: float = 0.0

    def __post_init__(self) -> None:
        if self.commit not in ("eager", "lazy"):
            raise LatsimError(f"commit mode must be 'eager' or 'lazy', got {self.commit!r}")
        if self.q is not None and (not isinstance(self.q, int) or self.q <= 0):
            raise LatsimError(f"q must be a positive integer, got {self.q!r}")
        if not (math.isfinite(self.commit_lead) and self.commit_lead >= 0):
            raise LatsimError(f"commit lead must be >= 0 seconds, got {self.commit_lead!r}")

    def commit_unit(self, K: int) -> int:
        """The commit unit for chunk size ``K``; raises if it does not divide ``K``."""
        q = K if self.q is None else self.q
        if K % q:
            raise LatsimError(f"q={q} does not divide K={K}")
        return q


BASELINE = Policy(name="baseline", q=None, commit="eager")
SPECULATIVE = Policy(name="speculative", q=1, commit="lazy")
PRESETS: dict[str, Policy] = {p.name: p for p in (BASELINE, SPECULATIVE)}


def policy_names(choice: str) -> list[str]:
    """Expand a ``--policy`` choice (``baseline``, ``speculative`` or ``both``)."""
    if choice == "both":
        return ["baseline", "speculative"]
    if choice not in PRESETS:
        raise LatsimError(f"unknown policy {choice!r}; choose baseline, speculative or both")
    return [choice]
