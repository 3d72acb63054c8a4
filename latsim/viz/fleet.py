"""The figure of a fleet run: its day, one replication's minute by minute (matplotlib is
imported here only; the look comes from :mod:`latsim.viz.style`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from latsim.viz import style
from latsim.viz.style import FONT, PALETTE

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_fleet(timeseries: list[dict], row: dict, path: Path, replication: int = 0) -> Path:
    """Sessions present, segments playing, sessions waiting and nodes over time (top),
    condition L95 and viewer stall % per window (bottom), for ``replication``; the title
    names the setting and the pooled cost."""
    series = [r for r in timeseries if r.get("run", replication) == replication]
    mid = [(r["t_start"] + r["t_end"]) / 2 / 60 for r in series]
    plt = style.pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=style.STACKED, sharex=True)
    top.step(mid, [r["sessions"] for r in series], where="mid", color=PALETTE["blue"],
             label="sessions present")
    top.step(mid, [r["active"] for r in series], where="mid", color=PALETTE["green"], ls="--",
             label="segments playing")
    if any(r["queued"] for r in series):
        top.step(mid, [r["queued"] for r in series], where="mid", color=PALETTE["orange"],
                 ls=":", label="sessions waiting")
    top.set_ylabel("sessions (window mean)")
    nodes = top.twinx()
    nodes.step(mid, [r["nodes"] for r in series], where="mid", color=PALETTE["black"], lw=1.2,
               label="nodes")
    nodes.set_ylabel("nodes (window mean)")
    nodes.set_ylim(0, max([r["nodes"] for r in series] + [1]) * 1.25)
    style.integer_ticks(nodes.yaxis)  # node counts
    handles = top.get_legend_handles_labels()[0] + nodes.get_legend_handles_labels()[0]
    top.legend(handles=handles, fontsize=FONT["legend"], loc="upper left")
    style.style_axes(top)
    bottom.plot(mid, [r["L95"] for r in series], "o-", ms=3, color=PALETTE["purple"],
                label="condition L95 (s)")
    bottom.set_ylabel("L95 of conditions shown (s)")
    stall = bottom.twinx()
    stall.plot(mid, [r["stall_pct"] for r in series], "s:", ms=3, color=PALETTE["red"],
               label="viewer stall (%)")
    stall.set_ylabel("viewer stall (%)", color=PALETTE["red"])
    handles = bottom.get_legend_handles_labels()[0] + stall.get_legend_handles_labels()[0]
    bottom.legend(handles=handles, fontsize=FONT["legend"], loc="upper left")
    bottom.set_xlabel(f"time (min); windows of {_window_min(series):g} min, replication "
                      f"{replication}")
    style.style_axes(bottom)
    cost = row.get("cost_usd")
    fig.suptitle(
        f"fleet: {row['policy']} K={row['K']}, cost {row['cost']}, {row['arrivals']}, "
        f"{row['placement']} placement, admission {row['admission']}, nodes "
        f"{row['nodes_initial']}..{row['nodes_max']}"
        f"{' autoscaled' if row['autoscale'] else ''}, {row['max_sessions']} sessions/node\n"
        f"over {row['n_runs']} replication(s): {_fmt(row.get('gpu_hours'))} GPU-h"
        + (f", ${_fmt(cost)}" if cost else "")
        + f", L95 {_fmt(row.get('L95'))} s, stall {_fmt(row.get('stall_pct'))}%, "
        f"blocking {_fmt(row.get('blocking'))}", fontsize=FONT["suptitle_small"])
    fig.tight_layout()
    return style.save(fig, path)


def _window_min(series: list[dict]) -> float:
    return (series[0]["t_end"] - series[0]["t_start"]) / 60 if series else 1.0


def _fmt(value: object) -> str:
    return "–" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


#: The sharded-vs-exact metrics the reproduction's figure shows (the rest are in the CSV).
SHARDED_SHOWN = (("L50", "L50"), ("L95", "L95"), ("L99", "L99"), ("stall_pct", "stall %"),
                 ("ttfc_mean", "TTFC mean"), ("ttfc_p95", "TTFC p95"),
                 ("n_nodes_mean", "nodes"), ("gpu_hours", "GPU-hours"), ("w", "w"))


def plot_fleet_reproduction(tables: dict[str, list[dict]], path: Path) -> Path:
    """``latsim reproduce fleet``'s figure, from its three tables: the diurnal day's cost
    per fleet (GPU-hours ± 1 SE, each bar labelled with its mean TTFC), the nodes each
    commitment policy needs at each L95 SLO (labelled with the L95 reached; a cross where
    no fleet of up to 8 nodes meets it), and the sharding error of the main metrics
    (sharded − exact, % of exact, ± 1 SE of the paired difference)."""
    return style.save(fleet_reproduction_figure(tables), path)


def fleet_reproduction_figure(tables: dict[str, list[dict]]) -> Figure:
    """The figure of :func:`plot_fleet_reproduction` (the caller closes it)."""
    import numpy as np

    plt = style.pyplot()
    fig, (day, need, shard) = plt.subplots(1, 3, figsize=style.row_of_panels(3, 4.6, 4.4),
                                           width_ratios=(1.1, 1.0, 1.0))
    rows = tables["diurnal"]
    x = np.arange(len(rows))
    autoscaled = [r["fleet"] == "autoscaled" for r in rows]
    day.bar(x, [r["gpu_hours"] for r in rows], 0.6, yerr=[r["gpu_hours_se"] for r in rows],
            capsize=3, color=[PALETTE["blue"] if a else PALETTE["grey"] for a in autoscaled],
            edgecolor="#3f3f3f", linewidth=0.6)
    for at, r in zip(x, rows, strict=True):
        day.annotate(f"TTFC\n{r['ttfc_mean']:.1f} s", (at, r["gpu_hours"]),
                     xytext=(0, 6), textcoords="offset points", ha="center",
                     fontsize=FONT["note"])
    day.set_xticks(x, [f"{r['fleet']}\n{r['placement']}".replace("static peak", "static")
                       for r in rows], fontsize=FONT["tick"] - 1, rotation=30, ha="right")
    day.set_ylabel("GPU-hours over the day", fontsize=FONT["label"])
    day.set_ylim(0, 1.25 * max(r["gpu_hours"] for r in rows))
    style.title(day, "a compressed diurnal day (5:1 peak to trough)")
    style.style_axes(day, grid="y")

    policy = tables["policy"]
    groups = list(dict.fromkeys((r["setting"], r["slo_l95"]) for r in policy))
    g = np.arange(len(groups))
    width = 0.38
    for i, name in enumerate(("baseline", "speculative")):
        look = style.policy_style(name)
        chosen = {(r["setting"], r["slo_l95"]): r for r in policy if r["policy"] == name}
        at = g + (i - 0.5) * width
        nodes = [chosen[k]["nodes_needed"] for k in groups]
        need.bar(at, [n or 0 for n in nodes], width, color=look.color, edgecolor=look.edge,
                 linewidth=0.6, label=name)
        for a, k, n in zip(at, groups, nodes, strict=True):
            if n is None:
                need.plot(a, 0.15, marker="x", color=look.edge, ms=7, mew=1.5)
                need.annotate("none\n≤ 8", (a, 0.15), xytext=(0, 6), textcoords="offset points",
                              ha="center", fontsize=FONT["note"])
            else:
                need.annotate(f"L95\n{chosen[k]['L95']:.1f} s", (a, n), xytext=(0, 3),
                              textcoords="offset points", ha="center", fontsize=FONT["note"])
    need.set_xticks(g, [f"{s}\nL95 ≤ {slo:g} s" for s, slo in groups],
                    fontsize=FONT["tick"] - 1)
    need.set_ylabel("nodes needed (stall ≤ 1 %)", fontsize=FONT["label"])
    need.set_ylim(0, 1.4 * (max(r["nodes_needed"] or 0 for r in policy) or 1))
    style.integer_ticks(need.yaxis)
    style.title(need, "nodes needed at an L95 SLO, per policy")
    style.style_axes(need, grid="y", legend=True, loc="upper left")

    by_metric = {r["metric"]: r for r in tables["sharded_vs_exact"]}
    shown = [(key, label) for key, label in SHARDED_SHOWN if key in by_metric
             and by_metric[key]["exact"]]
    y = np.arange(len(shown))[::-1]
    rel = [100 * by_metric[k]["difference"] / abs(by_metric[k]["exact"]) for k, _ in shown]
    err = [100 * by_metric[k]["difference_se"] / abs(by_metric[k]["exact"]) for k, _ in shown]
    shard.errorbar(rel, y, xerr=err, fmt="o", color=PALETTE["blue"], capsize=3, ms=4)
    shard.axvline(0, color=PALETTE["black"], lw=0.8)
    shard.set_yticks(y, [label for _, label in shown], fontsize=FONT["tick"])
    runs = int(next(iter(by_metric.values()))["n_runs"])
    shard.set_xlabel(f"sharded − exact (% of exact; ± 1 SE, {runs} paired runs)",
                     fontsize=FONT["label"] - 1)
    style.title(shard, "the sharding error (cold starts)")
    style.style_axes(shard, grid="x")
    fig.tight_layout()
    return fig
