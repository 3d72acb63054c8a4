"""The figure of a fleet run: its day, one replication's minute by minute (matplotlib is
imported here only; the look comes from :mod:`latsim.viz.style`)."""

from __future__ import annotations

from pathlib import Path

from latsim.viz import style
from latsim.viz.style import FONT, PALETTE


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
