"""The deployment plan's figure: cost per viewer-hour against L95, both policies.

Every candidate the surrogate passes is a small hollow point (its predicted cost and L95);
the Pareto frontier's are larger, and they and the recommendations are labelled with their
K (or quality) and USP degree. Where the exact fleet model ran, its measured point is drawn
filled (it met the SLO) or as a cross (it missed), joined to the prediction by a thin line,
so the surrogate's error shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from latsim.viz.style import FONT, PALETTE, policy_style, pyplot, save, style_axes, title


def draw_frontier(rows: Sequence[dict], frontier: Sequence[int], path: Path,
                  measure: str = "K") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    on_frontier = set(frontier)
    for policy in sorted({row["policy"] for row in rows}):
        style = policy_style(policy)
        passing = [(i, row) for i, row in enumerate(rows)
                   if row["policy"] == policy and row["verdict"] == "meets"]
        if not passing:
            continue
        ax.scatter([r["cost_per_viewer_hour"] for _, r in passing],
                   [r["L95"] for _, r in passing], s=[40 if i in on_frontier else 10
                                                       for i, _ in passing],
                   marker=style.marker, facecolors="none", edgecolors=style.color,
                   label=f"{policy}: surrogate", alpha=0.8)
        for i, row in passing:
            if i in on_frontier or row.get("role"):
                value = f"{row['quality']:g}" if measure == "quality" else str(row["K"])
                ax.annotate(f"{measure}={value} usp{row['usp']}",
                            (row["cost_per_viewer_hour"], row["L95"]), fontsize=FONT["note"],
                            xytext=(4, 3), textcoords="offset points", color=PALETTE["note"])
        exact = [r for _, r in passing if r.get("exact_verdict")  # and something to draw
                 and r.get("exact_L95") is not None
                 and r.get("exact_cost_per_viewer_hour") is not None]
        for row in exact:
            ax.plot([row["cost_per_viewer_hour"], row["exact_cost_per_viewer_hour"]],
                    [row["L95"], row["exact_L95"]], color=style.color, lw=0.6, alpha=0.6)
        for verdict, marker, said in (("meets", style.marker, "meets"), ("fails", "x", "misses"),
                                      ("undecided", "+", "undecided")):
            shown = [r for r in exact if r["exact_verdict"] == verdict]
            if shown:
                ax.scatter([r["exact_cost_per_viewer_hour"] for r in shown],
                           [r["exact_L95"] for r in shown], s=40, marker=marker,
                           color=style.color, label=f"{policy}: exact run, {said}")
    ax.set_xlabel("cost per viewer-hour (USD)", fontsize=FONT["label"])
    ax.set_ylabel("condition L95 (s)", fontsize=FONT["label"])
    style_axes(ax)
    ax.legend(fontsize=FONT["legend"], loc="best")
    title(ax, "deployment plan: the surrogate's candidates, the frontier labelled, and the "
              "exact runs")
    return save(fig, path)
