"""The figures' shared style (latsim/viz/style.py) and what the paper figures promise:
a distinct look per policy, integer ticks on counts, honest axes, and marks that say which
bar they belong to."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from latsim.viz import style

ROOT = Path(__file__).resolve().parent.parent


def _cell(value: str) -> object:
    if value == "":
        return None
    if value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _table(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return [{key: _cell(value) for key, value in row.items()}
                for row in csv.DictReader(handle)]


@pytest.fixture
def close_figures():
    figures = []
    yield figures.append
    plt = style.pyplot()
    for fig in figures:
        plt.close(fig)


def test_each_policy_has_its_own_colour_marker_and_line():
    looks = [style.policy_style(name) for name in ("baseline", "speculative", "q2-lazy")]
    for attribute in ("color", "marker", "linestyle"):
        values = [getattr(look, attribute) for look in looks]
        assert len(set(map(str, values))) == len(values), attribute
    assert style.policy_style("q2-lazy") == style.policy_style("q2-lazy")  # stable
    baseline, speculative = looks[:2]
    assert baseline.offset < 0 < speculative.offset  # dodged to either side
    assert baseline.hollow != speculative.hollow  # one shows through the other
    assert baseline.edge != baseline.color and speculative.edge != speculative.color


def test_the_style_module_does_not_import_matplotlib():
    code = ("import sys, latsim.viz.style, latsim.viz.timeline; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "False"


def test_integer_ticks_put_ticks_on_whole_numbers_only(close_figures):
    plt = style.pyplot()
    fig, ax = plt.subplots()
    close_figures(fig)
    ax.plot([1, 2, 3], [0, 1, 2])
    ax.set_xlim(0.8, 3.2)
    style.integer_ticks(ax.xaxis)
    ticks = [t for t in ax.get_xticks() if 0.8 <= t <= 3.2]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_row_of_panels_scales_with_the_count():
    assert style.row_of_panels(3) == (3 * style.PANEL[0], style.PANEL[1])
    with pytest.raises(ValueError):
        style.row_of_panels(0)


def test_serving_figure_counts_streams_on_integer_ticks(close_figures):
    from matplotlib.ticker import MaxNLocator

    from latsim.viz.paper import serving_figure

    tables = {name: _table(ROOT / "results" / "serving" / f"{name}.csv")
              for name in ("e2e", "headroom", "discard")}
    fig = serving_figure(tables)
    close_figures(fig)
    _, middle, right = fig.axes
    for axis in (middle.yaxis, right.xaxis):
        locator = axis.get_major_locator()
        assert isinstance(locator, MaxNLocator) and locator._integer  # noqa: SLF001


def _interactive(equal_l95: bool) -> dict[str, list[dict]]:
    rows = []
    for speed in (1.0, 2.0):
        for system, l50, l95 in (("plain", 1.0, 1.5), ("SDVG", 1.2, 1.9)):
            for policy in ("baseline", "speculative"):
                spec = policy == "speculative"
                rows.append({"speed": speed, "system": system, "load": "high",
                             "policy": policy, "L50": (l50 - 0.2 * spec) / speed,
                             "L95": (l95 - (0 if equal_l95 else 0.3 * spec)) / speed,
                             "C_mean_model": 0.5 / speed, "lead": 0.7 / speed})
    return {"interactive": rows}


def test_systems_l95_marks_sit_on_their_own_bars(close_figures):
    """Each policy's L95 is a whisker at its own bar's centre, in its own colour, with a
    legend entry; equal L95s of the two policies still draw two marks."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_hex

    from latsim.viz.paper import systems_figure

    fig = systems_figure(_interactive(equal_l95=True))
    close_figures(fig)
    ax = fig.axes[0]
    centres = sorted(round(p.get_x() + p.get_width() / 2, 6) for p in ax.patches)
    whiskers = {}
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            colors = collection.get_colors()  # one for all segments, or one each
            for i, segment in enumerate(collection.get_segments()):
                (x0, y0), (x1, y1) = segment
                if x0 == x1 and y1 != y0:  # the vertical stems of the whiskers
                    whiskers[round(x0, 6)] = to_hex(colors[i % len(colors)])
    assert sorted(whiskers) == centres  # one whisker per bar, on the bar
    edges = {to_hex(style.policy_style(p).edge) for p in ("baseline", "speculative")}
    assert set(whiskers.values()) == edges
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert any(label.startswith("baseline L95") for label in labels)
    assert any(label.startswith("speculative L95") for label in labels)


def test_reproduction_figure_axes_are_honest(close_figures):
    """A(p) on a linear p axis; P(busy) on its own probability axis, not among seconds."""
    from latsim.experiments.paper import Reproduction
    from latsim.viz.paper import reproduction_figure

    folder = ROOT / "results" / "paper"
    result = Reproduction(*(_table(folder / f"{name}.csv")
                            for name in ("settings", "eq6", "amplification", "stall", "l50")))
    fig = reproduction_figure(result)
    close_figures(fig)
    by_label = {ax.get_xlabel(): ax for ax in fig.axes}
    amplification = next(ax for label, ax in by_label.items() if label.startswith("per-latent"))
    assert amplification.get_xscale() == "linear"
    seconds, probability = by_label["seconds"], by_label["probability"]
    assert "P(busy)" not in [t.get_text() for t in seconds.get_yticklabels()]
    assert [t.get_text() for t in probability.get_yticklabels()] == ["P(busy)"]
    assert probability.get_xlim() == (0.0, 1.0)
    assert "probability" not in seconds.get_xlabel()
