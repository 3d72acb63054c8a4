"""The figures' shared style (latsim/viz/style.py) and what the paper figures promise:
a distinct look per policy, integer ticks on counts, honest axes, marks that say which bar
they belong to, and a serving timeline that shows the other streams on the shared device."""

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


def test_serving_figure_shows_every_headroom_count_and_counts_on_integer_ticks(
        close_figures):
    """The headroom panel writes each (setting, SLO factor, margin) cell's stream count,
    zeros included (lines joining integer counts hid four series at 0); the stall panel's
    stream counts are on integer ticks."""
    from matplotlib.ticker import MaxNLocator

    from latsim.viz.paper import serving_figure

    tables = {name: _table(ROOT / "results" / "serving" / f"{name}.csv")
              for name in ("e2e", "headroom", "discard")}
    fig = serving_figure(tables)
    close_figures(fig)
    _, middle, right = fig.axes
    shown = sorted(text.get_text() for text in middle.texts)
    assert shown == sorted(f"{row['max_streams']:.0f}" for row in tables["headroom"])
    assert len(middle.get_yticklabels()) == len(
        {(row["setting"], row["slo_factor"]) for row in tables["headroom"]})
    locator = right.xaxis.get_major_locator()
    assert isinstance(locator, MaxNLocator) and locator._integer


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


def test_systems_l95_is_a_span_on_its_own_bar_not_a_whisker(close_figures):
    """Each policy's L50 to L95 is a lighter, hatched bar stacked on its own L50 bar (a
    range of the distribution, which a whisker read as an error bar), in its own colour,
    with a legend entry; equal L95s of the two policies still draw two spans."""
    from matplotlib.collections import LineCollection

    from latsim.viz.paper import systems_figure

    data = _interactive(equal_l95=True)
    fig = systems_figure(data)
    close_figures(fig)
    ax = fig.axes[0]
    assert not [c for c in ax.collections if isinstance(c, LineCollection)]  # no whiskers
    solid = [p for p in ax.patches if not p.get_hatch()]
    spans = [p for p in ax.patches if p.get_hatch()]
    assert len(solid) == len(spans) == 4  # two systems, two policies
    rows = [r for policy in ("baseline", "speculative") for system in ("plain", "SDVG")
            for r in data["interactive"]
            if (r["speed"], r["policy"], r["system"]) == (1.0, policy, system)]
    for bar, row in zip(solid, rows, strict=True):  # drawn policy by policy, system by system
        span = next(p for p in spans if p.get_x() == bar.get_x())
        assert bar.get_height() == pytest.approx(row["L50"])
        assert span.get_y() == pytest.approx(row["L50"])  # on top of its own L50
        assert span.get_y() + span.get_height() == pytest.approx(row["L95"])
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert "baseline: L50 to L95" in labels and "speculative: L50 to L95" in labels


def test_reproduction_figure_axes_are_honest(close_figures):
    """A(p) on a linear p axis; P(busy) on its own probability axis, not among seconds."""
    from latsim.experiments.paper import Reproduction
    from latsim.viz.paper import reproduction_figure

    folder = ROOT / "results" / "paper"
    result = Reproduction(*(_table(folder / f"{name}.csv")
                            for name in ("settings", "eq6", "amplification", "stall", "l50",
                                         "long_minus_short")))
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


def test_condition_lanes_separate_overlapping_conditions():
    from latsim.viz.timeline import condition_lanes

    assert condition_lanes([(0, 1), (2, 3), (4, 5)]) == [0, 0, 0]
    assert condition_lanes([(0, 2), (1, 3), (2.5, 4)]) == [0, 1, 0]
    assert max(condition_lanes([(0, 10)] * 5, most=3)) == 2


@pytest.fixture(scope="module")
def serving_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from latsim.experiments.engine import Experiment, run_experiment, write_experiment
    from latsim.model.serving import ServingConfig

    out = tmp_path_factory.mktemp("serving")
    exp = Experiment(Ks=(8,), cost="fixed:0.5", updates="poisson:0.3", duration=20.0,
                     seeds=1, seed=3, serving=ServingConfig(streams=3, pools=(("dit", 1),)))
    write_experiment(run_experiment(exp, jobs=1), out)
    return out


def test_a_serving_timeline_draws_the_other_streams_on_the_device(serving_dir, close_figures):
    from matplotlib.colors import to_hex

    from latsim.viz.timeline import select_run, timeline_figure

    data = select_run(serving_dir, policy="speculative", stream=1)
    assert data.other_streams and data.shared_devices == ("dit 0",)
    own = data.jobs[data.jobs["kind"] != "prebuffer"]
    for start, end in data.other_streams:  # one device: never while this stream's job runs
        assert not ((own["t_start"] < end - 1e-9) & (own["t_ready"] > start + 1e-9)).any()
    fig = timeline_figure(data, 0.0, 20.0)
    close_figures(fig)
    lanes = fig.axes[0]
    band = to_hex(style.TIMELINE_COLORS["other_streams"])
    assert any(to_hex(c) == band for coll in lanes.collections for c in coll.get_facecolors())
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert "other streams on the shared device" in labels
    assert "other streams" in fig.axes[0].get_title()


def test_a_single_worker_timeline_has_no_other_streams(tmp_path, close_figures):
    from latsim.experiments.engine import Experiment, run_experiment, write_experiment
    from latsim.viz.timeline import select_run, timeline_figure

    exp = Experiment(Ks=(4,), cost="fixed:0.6", updates="poisson:0.3", duration=10.0,
                     seeds=1, seed=4)
    write_experiment(run_experiment(exp, jobs=1), tmp_path)
    data = select_run(tmp_path)
    assert data.other_streams == () and data.waits == ()
    fig = timeline_figure(data)
    close_figures(fig)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert not any("other streams" in label for label in labels)
