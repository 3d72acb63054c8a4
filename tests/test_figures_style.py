"""The figures' shared style (latsim/viz/style.py): a distinct look per policy, integer
ticks on counts, and no matplotlib on importing it."""

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
