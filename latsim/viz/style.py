"""The one style of latsim's figures: sizes, fonts, palette and a look per policy.

What belongs here: every choice that should read the same in every figure, so a reader
who learnt one figure can read the next, and so one edit restyles them all:

- figure sizes (:data:`PANEL`, :func:`row_of_panels`, the named sizes) and the DPI;
- font sizes by role (:data:`FONT`: titles, axis labels, ticks, legends, notes);
- the palette (:data:`PALETTE`) and the colour of each source of a number: the paper,
  theory, our simulation, a measurement (:data:`SOURCE_COLORS`);
- a colour, marker, line style, hatch and dodge offset per commitment policy
  (:data:`POLICY_STYLES`, :func:`policy_style`; a name not listed gets a distinct fallback);
- the colours of the timeline (condition versions, R/C/Q segments, stalls, other streams'
  use of a shared device) and of verdicts and run states;
- helpers the figure code shares: :func:`pyplot` (matplotlib on the Agg backend),
  :func:`integer_ticks` for axes of counts, :func:`style_axes`, :func:`save`
  (fixed metadata, so PNGs reproduce byte for byte).

What does not: what a figure draws and from which table (that stays in ``plots.py``,
``paper.py``, ``timeline.py`` and ``fleet.py``).

matplotlib is never imported when this module is: only inside the helpers that need it,
so ``latsim --help`` and the simulator stay free of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from latsim.writing import replacing

if TYPE_CHECKING:  # names for annotations only: nothing is imported at run time
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

#: Resolution of every saved figure (dots per inch).
DPI = 120

#: One panel (width, height) in inches; a row of n panels is n panels wide.
PANEL = (5.0, 4.2)
#: Two panels side by side (L50 | L95 figures, capacity).
TWO_PANELS = (10.0, 4.2)
#: A 2 x 2 grid of panels (the paper reproduction).
GRID_2X2 = (12.0, 8.0)
#: The timeline: a lane panel over a latent-position panel.
TIMELINE = (12.0, 7.5)
#: Two stacked panels sharing a time axis (a fleet's day).
STACKED = (10.0, 6.4)


def row_of_panels(n: int, width: float = PANEL[0],
                  height: float = PANEL[1]) -> tuple[float, float]:
    """The size of a row of ``n`` panels, each ``width`` x ``height`` inches."""
    if n < 1:
        raise ValueError(f"a row needs at least one panel, got {n}")
    return (width * n, height)


#: Font sizes (points) by role.
FONT: dict[str, float] = {
    "suptitle": 9,  # a figure's title: the setting it shows
    "suptitle_small": 8,  # a long figure title (the compare figures' setup lines)
    "title": 9,  # a panel's title
    "label": 10,  # axis labels
    "tick": 8,  # tick labels where they are long (setting names)
    "legend": 7,
    "legend_small": 6,  # legends of many entries
    "note": 6,  # text drawn in a panel: values, "no gain" notes
    "tiny": 5,  # labels of narrow bars
}

#: The palette (matplotlib's tab10 and its light pairs, named by use).
PALETTE: dict[str, str] = {
    "grey": "#7f7f7f",
    "light_grey": "#b0b0b0",
    "green": "#2ca02c",
    "light_green": "#98df8a",
    "red": "#d62728",
    "dark_red": "#b00000",
    "blue": "#1f77b4",
    "light_blue": "#aec7e8",
    "orange": "#ff7f0e",
    "light_orange": "#ffbb78",
    "dark_orange": "#c85a00",
    "purple": "#9467bd",
    "black": "#000000",
    "note": "#333333",  # text drawn in a panel
}

#: Colours of series that are not policies and have no colour of their own, in order.
SERIES_COLORS: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

#: Bar fill and edge (its marks') colours of successive device speeds.
SPEED_COLORS: tuple[tuple[str, str], ...] = ((PALETTE["light_blue"], PALETTE["blue"]),
                                             (PALETTE["light_orange"], PALETTE["dark_orange"]))

#: Where a number comes from.
SOURCE_COLORS: dict[str, str] = {
    "paper": PALETTE["red"],
    "theory": PALETTE["grey"],
    "theory_line": PALETTE["black"],  # a closed form drawn through policies' points
    "simulated": PALETTE["green"],
    "simulated_low": PALETTE["light_green"],
    "ideal": PALETTE["light_green"],
}


@dataclass(frozen=True)
class PolicyStyle:
    """How one policy is drawn: its colour (and a darker edge for marks on its bars), the
    marker and line style of its series, a hatch for its bars, whether its markers are
    hollow (so a series drawn under another still shows), and an offset (a share of the
    spacing of the x values) that dodges it from the other policies at the same x."""

    color: str
    edge: str
    marker: str
    linestyle: str
    hatch: str
    hollow: bool
    offset: float

    def marker_kwargs(self, size: float = 6.0) -> dict[str, Any]:
        """``plot``/``errorbar`` keyword arguments for this policy's markers."""
        kwargs: dict[str, Any] = {"marker": self.marker, "color": self.color, "ms": size}
        if self.hollow:
            kwargs.update(mfc="none", mew=1.5)
        return kwargs


#: One look per commitment policy: baseline grey hollow circles on solid lines,
#: speculative green filled squares on dashed lines, dodged to either side.
POLICY_STYLES: dict[str, PolicyStyle] = {
    "baseline": PolicyStyle(color=PALETTE["grey"], edge="#3f3f3f", marker="o",
                            linestyle="-", hatch="", hollow=True, offset=-0.12),
    "speculative": PolicyStyle(color=PALETTE["green"], edge="#155015", marker="s",
                               linestyle="--", hatch="", hollow=False, offset=0.12),
}

_FALLBACK_MARKERS = ("^", "D", "v", "P", "X", "<", ">")
_FALLBACK_LINES = ("-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)))


def policy_style(policy: str) -> PolicyStyle:
    """The style of ``policy``; a name not in :data:`POLICY_STYLES` (an ablation) gets a
    fallback that differs from the presets and is the same on every call."""
    if policy in POLICY_STYLES:
        return POLICY_STYLES[policy]
    index = sum(policy.encode()) % len(_FALLBACK_MARKERS)
    color = SERIES_COLORS[(index + 3) % len(SERIES_COLORS)]
    if color in (PALETTE["grey"], PALETTE["green"]):
        color = PALETTE["purple"]
    return PolicyStyle(color=color, edge=color, marker=_FALLBACK_MARKERS[index],
                       linestyle=_FALLBACK_LINES[index % len(_FALLBACK_LINES)], hatch="..",
                       hollow=False, offset=0.0)


def policy_color(policy: str) -> str:
    """The colour of ``policy`` (:func:`policy_style`)."""
    return policy_style(policy).color


# ------------------------------------------------------------------ timeline colours

#: The timeline's colours: V0 (the prebuffer) grey as in the paper's figures; R, C and Q
#: segments; stalls; the other streams' use of a shared device; a partial run's end.
TIMELINE_COLORS: dict[str, str] = {
    "v0": PALETTE["light_grey"],
    "R": PALETTE["orange"],
    "C": PALETTE["blue"],
    "Q": PALETTE["purple"],
    "uplink": "#17becf",  # a client run's: send to arrival, and play to display
    "to_screen": PALETTE["green"],
    "stall": PALETTE["red"],
    "other_streams": "#e4e4e4",  # lighter than V0's grey, and without its black edge
    "other_streams_text": "#555555",
    "partial": PALETTE["dark_red"],
    "unrecorded": "#808080",
}


def version_color(version: int) -> Any:
    """The colour of condition version ``version``: V0 grey, then tab10 in turn."""
    if version <= 0:
        return TIMELINE_COLORS["v0"]
    import matplotlib

    return matplotlib.colormaps["tab10"]((version - 1) % 10)


#: A capacity search's verdict per stream count.
VERDICT_COLORS: dict[str, str] = {"meets": PALETTE["green"], "fails": PALETTE["red"],
                                  "uncertain": PALETTE["orange"]}

#: Marker of a measured point by run status: a partial run stands out.
STATUS_MARKERS: dict[str, str] = {"complete": "o", "interrupted": "v", "failed": "X",
                                  "incomplete": "^"}

#: Line styles of successive measurements in one figure.
MEASUREMENT_LINES: tuple[Any, ...] = ("-", "--", "-.", (0, (3, 1, 1, 1, 1, 1)))


# ------------------------------------------------------------------ helpers


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported here, on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def integer_ticks(axis: Axis) -> None:
    """Major ticks at whole numbers only, for an axis of counts (streams, nodes, K)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def style_axes(ax: Axes, grid: Literal["both", "x", "y", "none"] = "both",
               legend: bool = False, legend_size: float | None = None,
               **legend_kwargs: Any) -> None:
    """The common look of a panel: a light grid on ``grid`` and, with ``legend``, a legend
    in the legend font (``legend_kwargs`` passed on)."""
    if grid != "none":
        ax.grid(alpha=0.3, axis=grid)
    if legend:
        ax.legend(fontsize=FONT["legend"] if legend_size is None else legend_size,
                  **legend_kwargs)


def title(ax: Axes, text: str, size: float | None = None, **kwargs: Any) -> None:
    """A panel title in the title font."""
    ax.set_title(text, fontsize=FONT["title"] if size is None else size, **kwargs)


def save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    """Write ``fig`` to ``path`` with fixed metadata (no software version: the same figure
    gives the same bytes) and close it; a failed write leaves no partial file."""
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=dpi, metadata={"Software": None},
                        format=Path(path).suffix[1:] or "png")
    finally:
        pyplot().close(fig)
    return path
