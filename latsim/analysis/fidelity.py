"""Error metrics for measured-vs-predicted comparisons (the way Vidur and LLMServingSim
report simulator fidelity): signed percent error per metric and MAPE over runs."""

from __future__ import annotations

import math
from collections.abc import Iterable

from latsim.numeric import total


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """Signed percent error of the prediction, ``100·(predicted − measured)/|measured|``.

    ``None`` when either side is missing or the measured value is 0 (a relative error is
    undefined there; compare such metrics in absolute terms, e.g. stall percentage points).
    """
    if measured is None or predicted is None:
        return None
    if not (math.isfinite(measured) and math.isfinite(predicted)) or measured == 0:
        return None
    return 100.0 * (predicted - measured) / abs(measured)


def mape(errors: Iterable[float | None]) -> float | None:
    """Mean absolute percent error over the defined errors (``None`` if there are none)."""
    defined = [abs(e) for e in errors if e is not None]
    return total(defined) / len(defined) if defined else None
