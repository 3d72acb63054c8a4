"""Stream timing: latent frames, chunks and the duration each one plays for (DESIGN §1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from latsim.errors import LatsimError


@dataclass(frozen=True)
class Timing:
    """A chunk of ``K`` latent frames, each standing for ``r`` pixel frames at ``fps``.

    ``delta = r / fps`` is the play time of one latent, ``T = K * delta`` that of a chunk.
    """

    K: int
    r: int
    fps: float

    def __post_init__(self) -> None:
        if not isinstance(self.K, int) or self.K <= 0:
            raise LatsimError(f"K must be a positive integer, got {self.K!r}")
        if not isinstance(self.r, int) or self.r <= 0:
            raise LatsimError(f"r must be a positive integer, got {self.r!r}")
        if not (isinstance(self.fps, int | float) and math.isfinite(self.fps) and self.fps > 0):
            raise LatsimError(f"fps must be a positive number, got {self.fps!r}")

    @property
    def delta(self) -> float:
        """Seconds one latent frame plays for."""
        return self.r / self.fps

    @property
    def T(self) -> float:  # the paper's symbol
        """Seconds one chunk of K latents plays for."""
        return self.K * self.r / self.fps
