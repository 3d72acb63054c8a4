"""The reproductions' figures and terminal reports (the tables come from
:mod:`latsim.experiments.paper`, ``serving_paper`` and ``systems``); matplotlib is imported
inside the functions, and the look comes from :mod:`latsim.viz.style`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from latsim.analysis import theory
from latsim.experiments.paper import (
    AMP_C,
    AMP_DURATION,
    AMP_KS,
    AMP_PS,
    AMP_SEEDS,
    Reproduction,
)
from latsim.viz import style
from latsim.viz.style import FONT, SOURCE_COLORS, policy_style

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _small_bar_note(ax, x: float, value: float | None, top: float) -> None:
    """Say the value of a bar too short to see (under 1.5% of the axis), or that it has
    none, so that no bar is missing without a note; over where the bar stands."""
    if value is None:
        ax.text(x, 0.015 * top, "n/a", ha="center", va="bottom", fontsize=FONT["note"],
                color=style.PALETTE["note"], rotation=90)
    elif abs(value) < 0.015 * top:
        ax.text(x, 0.015 * top, "0" if abs(value) < 5e-4 else f"{value:.2f}", ha="center",
                va="bottom", fontsize=FONT["note"], color=style.PALETTE["note"],
                rotation=90)  # upright: as narrow as its bar


def plot_reproduction(result: Reproduction, path: Path) -> Path:
    """Four panels: reductions per setting, eq. (6) (seconds; P(busy) on its own
    probability axis), A(p) on a linear p axis, stall vs C/T (:func:`reproduction_figure`)."""
    return style.save(reproduction_figure(result), path)


def reproduction_figure(result: Reproduction) -> Figure:
    """The figure of :func:`plot_reproduction` (the caller closes it)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MultipleLocator

    plt = style.pyplot()
    fig = plt.figure(figsize=style.GRID_2X2, layout="constrained")
    grid = fig.add_gridspec(2, 2)
    ax = fig.add_subplot(grid[0, 0])
    names = [row["setting"] for row in result.settings]
    x = np.arange(len(names))
    series = [("paper (measured)", "paper_reduction", SOURCE_COLORS["paper"]),
              ("theory (T−δ)/2", "theory_reduction", SOURCE_COLORS["theory"]),
              ("ours: low traces", "sim_low_reduction", SOURCE_COLORS["simulated_low"]),
              ("ours: high traces", "sim_high_reduction", SOURCE_COLORS["simulated"])]
    top = 1.12 * max((row[key] or 0.0) for row in result.settings for _, key, _ in series)
    for i, (label, key, color) in enumerate(series):
        values = [row[key] for row in result.settings]
        ax.bar(x + (i - 1.5) * 0.2, [0.0 if v is None else v for v in values], 0.2,
               label=label, color=color)
        for j, value in enumerate(values):
            _small_bar_note(ax, x[j] + (i - 1.5) * 0.2, value, top)
    for j, row in enumerate(result.settings):
        if row["C_over_T"] > 1:  # the closed form assumes C <= T: say why ours is 0
            ax.text(x[j], 0.45, f"C = {row['C_over_T']:.2f} T:\nstalls, no gain",
                    ha="center", fontsize=FONT["note"])
    ax.set_ylim(0, top)
    ax.set_xticks(x, [n.replace(" ", "\n") for n in names], fontsize=FONT["tick"])
    ax.set_ylabel("mean-latency reduction (s)")
    style.title(ax, "baseline − speculative mean L, six serving settings (short bars: "
                "their value)")
    style.style_axes(ax, grid="y", legend=True)

    # eq. (6): the times on a seconds axis, P(busy) on its own probability axis below
    eq6 = grid[0, 1].subgridspec(2, 1, height_ratios=[6, 1.3])
    ax = fig.add_subplot(eq6[0])
    prob = fig.add_subplot(eq6[1])
    times = [row for row in result.eq6 if row["quantity"] != "P(busy)"]
    probabilities = [row for row in result.eq6 if row["quantity"] == "P(busy)"]
    for panel, rows in ((ax, times), (prob, probabilities)):
        y = np.arange(len(rows))
        panel.barh(y + 0.2, [row["theory"] for row in rows], 0.4, label="theory",
                   color=SOURCE_COLORS["theory"])
        panel.barh(y - 0.2, [row["simulated"] for row in rows], 0.4, label="simulated",
                   color=SOURCE_COLORS["simulated"])
        panel.set_yticks(y, [row["quantity"] for row in rows], fontsize=FONT["tick"])
        style.style_axes(panel, grid="x")
    ax.set_xlabel("seconds")
    style.title(ax, "eq. (6) example: T = 5 s, C = 1.6 s")
    style.style_axes(ax, grid="none", legend=True, loc="lower right")
    prob.set_xlim(0, 1)
    prob.set_xlabel("probability")

    ax = fig.add_subplot(grid[1, 0])
    p_max = max(AMP_PS)
    dense = np.linspace(0.0, p_max, 201)
    for index, K in enumerate(AMP_KS):
        color = style.SERIES_COLORS[index]
        sel = [row for row in result.amplification if row["K"] == K]
        delta = sel[0]["delta"]
        ax.plot(dense, [theory.work_amplification_independent(K, p) for p in dense], "-",
                color=color, label=f"K={K}")
        poisson = [(p, theory.work_amplification_poisson(p / delta, K * delta, delta))
                   for p in dense if p / delta * K * delta < 1]
        ax.plot(*zip(*poisson, strict=True), ":", color=color)
        ax.plot([row["p"] for row in sel], [row["A_sim"] for row in sel], "o", color=color,
                ms=5)
    ax.set_xlim(0, p_max * 1.04)
    ax.xaxis.set_major_locator(MultipleLocator(0.01))
    ax.xaxis.set_minor_locator(MultipleLocator(0.002))
    ax.set_xlabel("per-latent update probability p (linear axis)")
    ax.set_ylabel("work amplification A")
    style.title(ax, f"work amplification A(p); C = {AMP_C} s, {AMP_SEEDS} × "
                f"{AMP_DURATION:g} s per point")
    keys = ax.get_legend_handles_labels()[0]
    keys += [Line2D([], [], color="k", ls="-", label="Kp/(1−(1−p)^K)"),
             Line2D([], [], color="k", ls=":", label="1+λ(T−δ)/2, drawn where λT < 1"),
             Line2D([], [], color="k", ls="", marker="o", ms=5, label="simulated")]
    ax.legend(handles=keys, fontsize=FONT["legend"], loc="upper left", ncol=2)
    style.style_axes(ax)

    ax = fig.add_subplot(grid[1, 1])
    sweep = [row for row in result.stall if row["case"].startswith("C/T")]
    ratios = np.linspace(0.5, 2.0, 200)
    ax.plot(ratios, [100 * theory.stall_fraction(q, 1.0) for q in ratios], "-",
            color=SOURCE_COLORS["theory_line"], lw=1, label="theory 100·(1 − T/C)")
    for policy, size in (("baseline", 9), ("speculative", 4)):  # the second inside the first
        sel = [row for row in sweep if row["policy"] == policy]
        look = policy_style(policy)
        ax.plot([row["C_over_T"] for row in sel], [row["sim_stall_pct"] for row in sel],
                ls="", label=f"simulated {policy}", **look.marker_kwargs(size))
    for row in result.stall:
        if row["paper_stall_pct"] is not None and row["policy"] == "baseline":
            ax.plot(row["C_over_T"], row["paper_stall_pct"], "*", color=SOURCE_COLORS["paper"],
                    markersize=10)
    ax.plot([], [], "*", color=SOURCE_COLORS["paper"], label="paper: LTX short eager")
    ax.set_xlabel("C / T")
    ax.set_ylabel("stall %")
    style.title(ax, "stall regime (LTX-2.3 K=3, T = 1 s)")
    style.style_axes(ax, legend=True)
    return fig


# ---------------------------------------------------------------- terminal report


def plot_serving(tables: dict[str, list[dict]], path: Path) -> Path:
    """Three panels: end-to-end L50 cells (paper vs ours), long-chunk capacity against the
    lead's queueing margin, and viewer stall by discard mode against the stream count
    (:func:`serving_figure`)."""
    return style.save(serving_figure(tables), path)


def serving_figure(tables: dict[str, list[dict]]) -> Figure:
    """The figure of :func:`plot_serving` (the caller closes it); stream counts on
    integer ticks."""
    plt = style.pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=style.row_of_panels(3))
    cells = [row for row in tables["e2e"] if row["metric"] == "L50"
             and row["calibrated_on"] == tables["e2e"][0]["calibrated_on"]]
    x = np.arange(len(cells))
    left.bar(x - 0.2, [c["paper"] for c in cells], 0.4, color=SOURCE_COLORS["paper"],
             label="paper")
    left.bar(x + 0.2, [c["ours"] for c in cells], 0.4, color=SOURCE_COLORS["simulated"],
             yerr=[c.get("ours_se") or 0.0 for c in cells], capsize=3,
             label="ours (± 1 SE over replications)")
    left.set_xticks(x, [f"{c['setting'].split()[1]} {c['policy'][:4]}\n{c['load']}"
                        f"{' (fit)' if c['role'] == 'calibrated' else ''}" for c in cells],
                    fontsize=FONT["tick"] - 1)
    left.set_ylabel("end-to-end L50 (s)")
    style.title(left, "Sol-H3 end to end")
    left.legend(fontsize=FONT["legend"])
    _headroom_grid(middle, tables["headroom"])
    for discard, color in (("on-start", style.PALETTE["grey"]),
                           ("on-ready", style.PALETTE["blue"])):
        rows = [r for r in tables["discard"] if r["discard"] == discard]
        right.errorbar([r["streams"] for r in rows], [r["stall_pct"] for r in rows],
                       yerr=[r.get("stall_pct_se") or 0.0 for r in rows], fmt="o-",
                       capsize=3, color=color, label=discard)
    right.set_xlabel("speculative streams on one device")
    right.set_ylabel("stall (%, ± 1 SE)")
    style.title(right, "when a replan discards the old future")
    right.legend(fontsize=FONT["legend"])
    style.integer_ticks(right.xaxis)
    for ax in (left, right):
        style.style_axes(ax)
    fig.tight_layout()
    return fig


def _headroom_grid(ax, rows: list[dict]) -> None:
    """The headroom table as a grid: one row per (setting, SLO factor), one column per lead
    margin, each cell the most streams per USP group meeting the SLO (every count shown,
    zeros included; counts are not joined by lines)."""
    settings = sorted({r["setting"] for r in rows})
    factors = sorted({r["slo_factor"] for r in rows})
    margins = sorted({r["margin_C"] for r in rows})
    labels, grid = [], []
    for setting in settings:
        for factor in factors:
            by_margin = {r["margin_C"]: r["max_streams"] for r in rows
                         if r["setting"] == setting and r["slo_factor"] == factor}
            labels.append(f"{setting}, L95 ≤ {factor:g}×")
            grid.append([by_margin.get(m, np.nan) for m in margins])
    values = np.array(grid, dtype=float)
    top = max(1.0, float(np.nanmax(values))) if values.size else 1.0
    ax.imshow(values, cmap="Greens", vmin=0, vmax=top * 1.4, aspect="auto")
    for (i, j), value in np.ndenumerate(values):
        ax.text(j, i, "–" if np.isnan(value) else f"{value:.0f}", ha="center", va="center",
                fontsize=FONT["tick"] + 1)
    ax.set_xticks(range(len(margins)), [f"{m:g}" for m in margins], fontsize=FONT["tick"])
    ax.set_yticks(range(len(labels)), labels, fontsize=FONT["tick"] - 1)
    ax.set_xlabel("lead margin (multiples of C)")
    style.title(ax, "streams per USP group meeting the SLO\n(L95 ≤ 1× or 1.5× the short "
                "chunk's baseline L95)")


def plot_systems(tables: dict[str, list[dict]], path: Path) -> Path:
    """L50 and L95 of each seed system against the plain target, per device speed and
    policy (high-frequency traces; Wave Forcing at its own timing in the first panel), and
    the mean C against the lead (:func:`systems_figure`)."""
    return style.save(systems_figure(tables), path)


def systems_figure(tables: dict[str, list[dict]]) -> Figure:
    """The figure of :func:`plot_systems` (the caller closes it).

    Each policy's L50 is a solid bar and the span from L50 to L95 a lighter, hatched bar
    on top of it (a range of the latency distribution, not an error bar), so a policy
    whose L95 equals the other's still shows its own; the lead markers take their speed's
    colour."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = style.pyplot()
    rows = [r for r in tables["interactive"] if r["load"] == "high"]
    speeds = sorted({r["speed"] for r in rows})
    policies = ("baseline", "speculative")
    width = 0.38
    counts = [len({r["system"] for r in rows if r["speed"] == speed}) for speed in speeds]
    ratios = [max(1.0, n / 5) for n in counts] + [1.0]  # a panel of many systems wider
    fig, axes = plt.subplots(1, len(speeds) + 1, width_ratios=ratios,
                             figsize=(3.8 * sum(ratios), 4.8))
    for ax, speed in zip(axes, speeds, strict=False):
        systems = list(dict.fromkeys(r["system"] for r in rows if r["speed"] == speed))
        x = np.arange(len(systems))
        for i, policy in enumerate(policies):
            look = policy_style(policy)
            sel = {r["system"]: r for r in rows if r["speed"] == speed and r["policy"] == policy}
            at = x + (i - 0.5) * width
            l50 = np.array([sel[s]["L50"] for s in systems])
            l95 = np.array([sel[s]["L95"] for s in systems])
            ax.bar(at, l50, width, color=look.color, edgecolor=look.edge, linewidth=0.6)
            ax.bar(at, l95 - l50, width, bottom=l50, color=look.color, alpha=0.3,
                   edgecolor=look.edge, linewidth=0.6, hatch="///")
        ax.set_xticks(x, [name.replace("Wave Forcing ", "WF ") for name in systems],
                      fontsize=FONT["tick"] - 1, rotation=35, ha="right")
        ax.set_ylabel("latency (s)")
        ax.set_ylim(0, 1.1 * max(r["L95"] for r in rows if r["speed"] == speed))
        style.title(ax, f"device speed x{speed:g} (high-frequency traces)")
        style.style_axes(ax, grid="y")
    keys = []
    for policy in policies:
        look = policy_style(policy)
        keys.append(Patch(facecolor=look.color, edgecolor=look.edge, label=f"{policy} L50"))
        keys.append(Patch(facecolor=look.color, alpha=0.3, edgecolor=look.edge, hatch="///",
                          label=f"{policy}: L50 to L95"))

    ax = axes[-1]
    systems = list(dict.fromkeys(r["system"] for r in rows if r["speed"] == speeds[-1]))
    for i, speed in enumerate(speeds):
        fill, edge = style.SPEED_COLORS[i % len(style.SPEED_COLORS)]
        sel = {r["system"]: r for r in rows if r["speed"] == speed and r["policy"] == "baseline"}
        x = np.arange(len(systems)) + (i - (len(speeds) - 1) / 2) * width
        ax.bar(x, [sel[s]["C_mean_model"] for s in systems], width, color=fill,
               edgecolor=edge, linewidth=0.6)
        ax.scatter(x, [sel[s]["lead"] for s in systems], marker="v", s=40, color=edge,
                   zorder=3)
        keys.append(Patch(facecolor=fill, edgecolor=edge, label=f"mean C, speed x{speed:g}"))
        keys.append(Line2D([], [], color=edge, marker="v", ls="",
                           label=f"lead = C's 0.99 quantile, speed x{speed:g}"))
    ax.set_xticks(np.arange(len(systems)), systems, fontsize=FONT["tick"])
    ax.set_ylabel("generation time C (s)")
    ax.set_ylim(0, 1.1 * max(r["lead"] for r in rows if r["system"] in systems))
    style.title(ax, "mean C vs the tail the lead must cover")
    style.style_axes(ax, grid="y")
    fig.legend(handles=keys, fontsize=FONT["legend"], loc="lower center", ncol=4,
               frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig
