"""The paper's six serving settings and what they are computed from: the numbers the paper
reports (``paper_data.json``, only ever shown beside ours), each setting's timing, the C
latsim infers for it (:func:`infer_C`, from the measurement :data:`SETTINGS` names), and
the trace sets they replay. Shared by every reproduction (:mod:`latsim.experiments.paper`,
``serving_paper``, ``replan_rule``, ``systems``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from latsim.analysis import theory
from latsim.controller.timing import Timing
from latsim.errors import LatsimError

PAPER_DATA = Path(__file__).with_name("paper_data.json")
REPO_TRACES = Path(__file__).resolve().parents[2] / "traces"
TRACE_SETS = ("low", "high")


@cache
def paper_data() -> dict:
    """The paper's reported numbers (``paper_data.json``): only for side-by-side display."""
    return json.loads(PAPER_DATA.read_text())


# ---------------------------------------------------------------- settings and C


@dataclass(frozen=True)
class Setting:
    """One of the paper's six serving settings and how its C is obtained.

    ``c_method``: ``activity`` (C = low end of the paper's per-GPU kernel-activity range ×
    T: a single worker that refills every T is busy C/T of the time, and the low end is the
    baseline under rare updates, A = 1), ``stall`` (C = T / (1 − s), s = the paper's mean
    short-chunk stall fraction: eq. stall → 1 − T/C inverted), or ``reduction`` (C solves
    (T − δ)/2 − C²/(2T) = the paper's measured reduction: :func:`invert_reduction`).
    """

    name: str
    K: int
    r: int
    fps: float
    c_method: str

    @property
    def timing(self) -> Timing:
        return Timing(self.K, self.r, self.fps)


SETTINGS: tuple[Setting, ...] = (
    Setting("Wan1.3B short", 3, 4, 16.0, "activity"),
    Setting("Wan1.3B long", 21, 4, 16.0, "activity"),
    Setting("Sol-H3 short", 22, 1, 24.0, "activity"),
    Setting("Sol-H3 long", 124, 1, 24.0, "activity"),
    Setting("LTX-2.3 short", 3, 8, 24.0, "stall"),
    Setting("LTX-2.3 long", 15, 8, 24.0, "reduction"),
)

C_METHOD_TEXT = {
    "activity": "C = low end of the paper's per-GPU kernel activity x T (busy = C/T, A = 1)",
    "stall": "C = T/(1 - s), s = mean of the paper's baseline stall % (stall -> 1 - T/C)",
    "reduction": "C solves (T - δ)/2 - C²/(2T) = paper's reduction (fitted, not predicted;"
    " LTX kernel activity includes text/media GPUs)",
}


def refined_reduction(C: float, T: float, delta: float) -> float:
    """Theory's mean-latency reduction at generation time C: baseline C + T/2 minus the
    refined speculative mean (eq. 6 plus Q), :func:`theory.speculative_latency_mean`."""
    return theory.baseline_latency_lower_bound(C, T) - theory.speculative_latency_mean(
        C, T, delta
    )


def smooth_reduction(C: float, T: float, delta: float) -> float:
    """Δ(C) ≈ (T − δ)/2 − C²/(2T): the boundary-wait reduction less eq. (6)'s residual wait,
    with the completion phase averaged out. The exact :func:`refined_reduction` is a
    sawtooth in C (a busy arrival's Q jumps from 0 to nearly δ each time C passes a multiple
    of δ); any jitter in C smooths it to about this curve."""
    return theory.boundary_wait_reduction(T, delta) - theory.residual_wait_mean(C, T)


def invert_reduction(target: float, T: float, delta: float) -> float | None:
    """The C in [0, T] with :func:`smooth_reduction` = ``target``:
    C = sqrt(2T·((T − δ)/2 − target)); None when ``target`` exceeds (T − δ)/2 (no C >= 0
    reaches it) or needs C > T."""
    slack = theory.boundary_wait_reduction(T, delta) - target
    if slack < 0:
        return None
    c = math.sqrt(2 * T * slack)
    return c if c <= T else None


def infer_C(setting: Setting) -> float:
    """The C used for ``setting``, derived from the paper measurement its method names."""
    data = paper_data()["settings"][setting.name]
    T = setting.timing.T
    if setting.c_method == "activity":
        return min(data["kernel_activity_pct"]) / 100.0 * T
    if setting.c_method == "stall":
        stalls = data["baseline_stall_pct"]
        s = (stalls["low"] + stalls["high"]) / 200.0
        return T / (1.0 - s)
    if setting.c_method == "reduction":
        c = invert_reduction(data["reduction_s"], T, setting.timing.delta)
        if c is None:
            raise LatsimError(f"{setting.name}: no C reproduces the paper's reduction")
        return c
    raise LatsimError(f"unknown C method {setting.c_method!r}")


# ---------------------------------------------------------------- simulation helpers


def _trace_root(traces_root: Path | None, tmp: Path) -> Path:
    """The folder holding ``low/`` and ``high/``: given, the repo's, or generated into tmp."""
    root = traces_root if traces_root is not None else REPO_TRACES
    if all((root / kind).is_dir() for kind in TRACE_SETS):
        return root
    if traces_root is not None:
        raise LatsimError(f"{traces_root}: needs sub-folders {' and '.join(TRACE_SETS)}")
    from latsim.experiments.tracegen import CANONICAL_SETS, generate_set, write_set

    for kind in TRACE_SETS:
        count, duration, seed = CANONICAL_SETS[kind]
        write_set(generate_set(kind, count, duration, seed), tmp / kind)
    return tmp
