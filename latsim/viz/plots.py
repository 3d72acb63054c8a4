"""Figures drawn from result rows and records (matplotlib is imported here only; the look
of every figure comes from :mod:`latsim.viz.style`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from latsim.analysis import theory
from latsim.analysis.intervals import cdf_band, percentile_intervals
from latsim.viz import style
from latsim.viz.style import FONT, SOURCE_COLORS, STATUS_MARKERS, policy_color, policy_style

plt = style.pyplot()


def replication_quantile_se(runs: list, level: float) -> float | None:
    """Bootstrap standard error over replications of the pooled ``level`` percentile of L
    (:func:`~latsim.analysis.intervals.replication_percentile_se`; serving runs count each
    stream of a replication together). None with fewer than two replications."""
    from latsim.analysis.intervals import replication_percentile_se

    return replication_percentile_se(
        [[c.L for s in getattr(run, "streams", (run,)) for c in s.conditions if c.displayed]
         for run in runs], level)


def _interval_errors(samples: list, points: list[float], level: float) -> np.ndarray:
    """Error bars (below, above) of each point: to its sample's order-statistic 95%
    interval of the ``level`` percentile (none on a side the sample cannot bound)."""
    errors = np.zeros((2, len(points)))
    for i, (sample, point) in enumerate(zip(samples, points, strict=True)):
        ((lo, hi),) = percentile_intervals(sample, [level])
        errors[:, i] = (0.0 if lo is None else max(0.0, point - lo),
                        0.0 if hi is None else max(0.0, hi - point))
    return errors


def plot_latency_vs_k(rows: list[dict], path: Path, runs: dict | None = None) -> Path:
    """L50 and L95 against K per policy, with the closed forms drawn in.

    ``runs`` (an experiment's records by (K, policy)) adds error bars: the jackknife
    standard error over replications of each pooled percentile; the legend says n.
    Theory lines (fixed C, lead = C): the baseline's L is uniform on [C, C+T), so its median
    is C + T/2 and its 95th percentile C + 0.95·T; for latent commitment the rare-update
    quantiles (:func:`latsim.analysis.theory.speculative_latency_quantile`) and the ideal
    C + δ/2.
    """
    fig, axes = plt.subplots(1, 2, figsize=style.TWO_PANELS, sharex=True)
    policies = sorted({row["policy"] for row in rows})
    Ks = sorted({row["K"] for row in rows})
    for ax, metric in zip(axes, ("L50", "L95"), strict=True):
        level = 50 if metric == "L50" else 95
        for policy in policies:
            look = policy_style(policy)
            sel = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["K"])
            sel = [r for r in sel if r[metric] is not None]
            if not sel:
                continue
            xs = [r["K"] * (1 + look.offset * 0.25) for r in sel]  # dodged: both show
            ys = [r[metric] for r in sel]
            errors = None
            if runs is not None:
                errors = [replication_quantile_se(runs.get((r["K"], policy), []), level)
                          for r in sel]
                errors = [0.0 if e is None else e for e in errors]
            n = f", n = {sel[0]['n_runs']} runs" if errors is not None else ""
            ax.errorbar(xs, ys, yerr=errors, linestyle=look.linestyle, capsize=3,
                        label=f"{policy} (simulated{n})", **look.marker_kwargs())
        base = sorted((r for r in rows if r["policy"] == "baseline"), key=lambda r: r["K"])
        fixed = [r for r in base if r["L_mean_theory"] is not None]
        if fixed:
            share = 0.5 if metric == "L50" else 0.95
            ax.plot([r["K"] for r in fixed],
                    [theory.baseline_latency_quantile(r["lead"], r["T"], share) for r in fixed],
                    ":", marker="_", markersize=14, color=policy_color("baseline"),
                    label=f"baseline theory C + {share:g}·T")
        spec = sorted((r for r in rows if r["policy"] == "speculative"), key=lambda r: r["K"])
        spec_fixed = [r for r in spec if r["L_mean_theory"] is not None
                      and r["C_mean"] < r["T"] and r["C_mean"] <= r["lead"]]
        if spec_fixed:
            share = 0.5 if metric == "L50" else 0.95
            ax.plot([r["K"] for r in spec_fixed],
                    [theory.speculative_latency_quantile(r["C_mean"], r["T"], r["delta"], share,
                                                         r["lead"]) for r in spec_fixed],
                    ":", marker="_", markersize=14, color=policy_color("speculative"),
                    label=f"speculative theory: its {metric} (fixed C, rare updates)")
        if metric == "L50" and spec_fixed:
            ax.plot([r["K"] for r in spec_fixed],
                    [theory.speculative_latency_ideal(r["C_mean"], r["delta"])
                     for r in spec_fixed],
                    "-.", marker="_", markersize=14, color=SOURCE_COLORS["ideal"],
                    label="ideal C + δ/2")
        ax.set_xlabel("chunk size K (latents)")
        ax.set_ylabel(f"{metric} latency (s)")
        ax.set_title(metric)
        ax.set_xticks(Ks)
        ax.set_xticklabels([str(k) for k in Ks])
        if len(Ks) > 2 and Ks[-1] / Ks[0] >= 4:  # K = 4 .. 21 and wider: a log axis
            ax.set_xscale("log")
            ax.set_xticks(Ks)
            ax.set_xticklabels([str(k) for k in Ks])
            ax.minorticks_off()
        if len(Ks) == 1:  # room around the one K for both policies' points
            ax.set_xlim(Ks[0] * 0.8, Ks[0] * 1.2)
        style.style_axes(ax)
        tops = [float(np.nanmax(line.get_ydata())) for line in ax.get_lines()  # error caps
                if len(line.get_ydata())]  # are lines too: their tops count
        ax.set_ylim(0, 1.12 * max(tops, default=1.0))
        ax.legend(fontsize=FONT["legend"], loc="best")
    if rows:
        first = rows[0]
        fig.suptitle(
            f"{first['fps']:g} fps, r={first['r']}, cost {first['cost']}, updates "
            f"{first['updates']}, {first['duration']:g} s × {first['n_runs']} runs"
            + ("" if runs is None else "; error bars: ±1 standard error over the runs"),
            fontsize=FONT["suptitle"],
        )
    fig.tight_layout()
    return style.save(fig, path)


def plot_latency(rows: list[dict], folder: Path, runs: dict) -> Path:
    """An experiment's latency figure in ``folder``: L50 and L95 against K
    (``latency_vs_K.png``, :func:`plot_latency_vs_k`) where it has several K; with one K,
    where that would be a point per policy, the distribution of L instead
    (``latency_cdf.png``, :func:`plot_latency_cdf`)."""
    if len({row["K"] for row in rows}) > 1:
        return plot_latency_vs_k(rows, folder / "latency_vs_K.png", runs)
    return plot_latency_cdf(rows, folder / "latency_cdf.png", runs)


def plot_latency_cdf(rows: list[dict], path: Path, runs: dict) -> Path:
    """The empirical CDF of L per policy at one K, pooled over the runs, with its 95 %
    Kolmogorov–Smirnov band (:func:`~latsim.analysis.intervals.cdf_band`), L50 and L95
    marked, and the timing model's L50 and L95 beside them where they hold (fixed C)."""
    fig, ax = plt.subplots(figsize=style.PANEL)
    for row in sorted(rows, key=lambda r: r["policy"]):
        policy = row["policy"]
        look = policy_style(policy)
        values = [c.L for run in runs.get((row["K"], policy), [])
                  for s in getattr(run, "streams", (run,)) for c in s.conditions if c.displayed]
        if not values:
            continue
        xs, ys = _ecdf(values)
        band = cdf_band(len(xs))
        ax.step(xs, ys, where="post", color=look.color, linestyle=look.linestyle,
                label=f"{policy}: L50 {row['L50']:.3g} s, L95 {row['L95']:.3g} s "
                      f"(n = {len(xs)})")
        ax.fill_between(xs, np.clip(np.array(ys) - band, 0, 1),
                        np.clip(np.array(ys) + band, 0, 1), step="post", color=look.color,
                        alpha=0.12, linewidth=0)
        predicted = _theory_quantiles(row)
        for share, value in predicted:
            ax.plot([value], [share], marker="x", ms=8, mew=1.6, color=look.edge, ls="")
    ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
    ax.axhline(0.95, color="0.6", lw=0.8, ls=":")
    ax.plot([], [], marker="x", ls="", color="0.3", label="timing model's L50, L95 (fixed C)")
    ax.set_xlabel("latency L (s)")
    ax.set_ylabel("share of conditions shown")
    ax.set_ylim(0, 1.02)
    if rows:
        first = rows[0]
        ax.set_title(f"K = {first['K']}: the distribution of L; shaded: 95 % KS band",
                     fontsize=FONT["title"])
        fig.suptitle(f"{first['fps']:g} fps, r={first['r']}, cost {first['cost']}, updates "
                     f"{first['updates']}, {first['duration']:g} s × {first['n_runs']} runs",
                     fontsize=FONT["suptitle"])
    ax.legend(fontsize=FONT["legend"], loc="lower right")
    style.style_axes(ax)
    fig.tight_layout()
    return style.save(fig, path)


def _theory_quantiles(row: dict) -> list[tuple[float, float]]:
    """(share, L) of the timing model's L50 and L95 for ``row`` where they hold (fixed C;
    for latent commitment C < T and C <= lead)."""
    if row["L_mean_theory"] is None:
        return []
    if row["policy"] == "baseline":
        return [(share, theory.baseline_latency_quantile(row["lead"], row["T"], share))
                for share in (0.5, 0.95)]
    if row["C_mean"] < row["T"] and row["C_mean"] <= row["lead"]:
        return [(share, theory.speculative_latency_quantile(row["C_mean"], row["T"],
                                                            row["delta"], share, row["lead"]))
                for share in (0.5, 0.95)]
    return []


def _ecdf(values) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def _joined(values) -> str:
    unique = []
    for value in values:
        if value is not None and value not in unique:
            unique.append(value)
    return "/".join(str(v) for v in unique)


#: The closed-form quantile lines of the overlay, at each run's mean measured C (fixed C
#: and rare updates: a reference, not the prediction).
THEORY_LINES = {
    "baseline": "baseline theory: lead + T/2 (L50), lead + 0.95·T (L95)",
    "speculative": "speculative theory: the phase map's quantiles (fixed C, rare updates)",
}


def compare_setup_title(comparison) -> str:
    """The setup line of the comparison figures: preset, resolution, steps and device where
    the runs give them, the trace and the K values (values differing between runs joined
    with ``/``)."""
    setups = [run.setup for run in comparison.runs]
    parts = []
    for key in ("preset", "resolution", "steps", "device"):
        value = _joined(setup.get(key) for setup in setups)
        if value:
            parts.append(f"{key} {value}" if key in ("steps", "device") else value)
    parts.append(f"trace {_joined(setup.get('trace') for setup in setups)}")
    parts.append("K = " + ", ".join(str(k) for k in sorted({row["K"] for row in comparison.rows})))
    return ", ".join(parts)


def _partial_label(row: dict) -> str:
    if row["status"] == "complete":
        return ""
    return f" [{row['status']}, 0–{row['window_s']:.0f} s]"


def plot_compare_cdf(comparison, path: Path) -> Path:
    """Per K, the CDF of measured (steps) and predicted (lines) L for each policy; the title
    gives the setup and what "predicted" means (:func:`compare_cdf_figure`)."""
    return _save(compare_cdf_figure(comparison), path)


def plot_viewer_cdf(comparison, path: Path) -> Path:
    """Per client run, the CDF of measured (steps) and predicted (dashed) end-to-end L;
    the legend says how many viewers each prediction simulated on the shared device."""
    rows = comparison.rows
    fig, axes = plt.subplots(1, len(rows), figsize=style.row_of_panels(len(rows), 4.0, 4.0),
                             squeeze=False)
    for ax, row, measured, predicted in zip(axes[0], rows, comparison.measured,
                                            comparison.predicted, strict=True):
        if measured:
            ax.step(*_ecdf(measured), where="post", lw=2,
                    label=f"measured (n={len(measured)})")
        if predicted:
            ax.plot(*_ecdf(predicted), "--", lw=1,
                    label=f"predicted ({row['predicted_with']} viewer(s) on the device)")
        style.title(ax, f"{row['run']} ({row['status']})")
        ax.set_xlabel("end-to-end L (s), client send to display")
        style.style_axes(ax, legend=True, legend_size=FONT["legend_small"])
    axes[0][0].set_ylabel("CDF")
    fig.suptitle("viewer side: measured vs the serving model with the runs' own C, uplink "
                 "and deliver samples", fontsize=FONT["suptitle"])
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:  # a matplotlib Figure
    return style.save(fig, path)


def compare_cdf_figure(comparison):
    """The figure of :func:`plot_compare_cdf` (the caller closes it)."""
    rows = comparison.rows
    ks = sorted({row["K"] for row in rows})
    fig, axes = plt.subplots(1, len(ks), figsize=style.row_of_panels(len(ks), 4.0, 4.0),
                             squeeze=False)
    for ax, K in zip(axes[0], ks, strict=True):
        for run, row, predicted in zip(comparison.runs, rows, comparison.predicted_latencies,
                                       strict=True):
            if row["K"] != K:
                continue
            color = policy_color(row["policy"])
            partial = _partial_label(row)
            if run.latencies:
                xs, ys = _ecdf(run.latencies)
                band = cdf_band(len(xs))
                ax.fill_between(xs, [max(0.0, y - band) for y in ys],
                                [min(1.0, y + band) for y in ys], step="post", color=color,
                                alpha=0.15, lw=0)
                ax.step(xs, ys, where="post", color=color, lw=1.2 if partial else 2,
                        ls=":" if partial else "-", zorder=2,
                        label=f"{row['policy']} measured (n={len(xs)}, 95% band "
                        f"±{band:.2f}){partial}")
            if predicted:  # drawn over the measured curve, so it shows where they agree
                ax.plot(*_ecdf(predicted), "--", color=color,
                        lw=1.2, zorder=3, dashes=(3, 2),
                        label=f"{row['policy']} predicted (n={len(predicted)}){partial}")
        ax.set_title(f"K={K}")
        ax.set_xlabel("latency L (s)")
        style.style_axes(ax, legend=True, legend_size=FONT["legend_small"])
    axes[0][0].set_ylabel("CDF")
    replications = _joined(row["replications"] for row in rows)
    about = (f"predicted = re-simulated with the run's own measured C (its job times "
             f"resampled per job kind; {replications} replications), same trace, policy, K "
             f"and lead; shaded: the measured CDF's 95% band (KS)")
    fig.suptitle(f"measured vs predicted latency: {compare_setup_title(comparison)}\n"
                 + textwrap.fill(about, int(fig.get_figwidth() * 15)),
                 fontsize=FONT["suptitle_small"])
    fig.tight_layout()
    return fig


def _label_once(seen: set[str], label: str) -> str:
    """Matplotlib skips labels starting with ``_``: each legend entry is drawn once."""
    if label in seen:
        return "_" + label
    seen.add(label)
    return label


def plot_compare_overlay(comparison, path: Path) -> Path:
    """L50 and L95 vs K (:func:`compare_overlay_figure`)."""
    return _save(compare_overlay_figure(comparison), path)


def compare_overlay_figure(comparison):
    """L50 and L95 vs K: measured points, simulated (predicted) lines, quantile theory lines
    (the caller closes the figure).

    Lines join runs of one measurement only (:func:`latsim.run.folder.measurement_of`), one
    line style per measurement; partial runs (compared over a shorter window) are drawn as
    separate markers, never on a line. Only quantile closed forms are drawn (medians with
    medians): the baseline's L is uniform on [lead, lead + T), so L50 = lead + T/2 and
    L95 = lead + 0.95·T; the speculative policy has a closed form for its mean only.
    """
    rows = sorted(comparison.rows, key=lambda r: r["K"])
    measured_of = {id(row): run.latencies for row, run in zip(comparison.rows, comparison.runs,
                                                               strict=True)}
    groups = list(dict.fromkeys(r["measurement"] for r in rows))
    styles = style.MEASUREMENT_LINES
    ks = sorted({r["K"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(style.TWO_PANELS[0], 5.2), sharex=True)
    for ax, metric in zip(axes, ("L50", "L95"), strict=True):
        seen: set[str] = set()
        for g, group in enumerate(groups):
            line = styles[g % len(styles)]
            tag = f" ({group})" if len(groups) > 1 else ""
            in_group = [r for r in rows if r["measurement"] == group]
            for policy in sorted({r["policy"] for r in in_group}):
                color = policy_color(policy)
                full = [r for r in in_group if r["policy"] == policy and r["status"] == "complete"]
                pts = [(r["K"], r[f"{metric}_predicted"]) for r in full
                       if r[f"{metric}_predicted"] is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), linestyle=line, marker=".", color=color,
                            label=_label_once(seen, f"{policy} simulated{tag}"))
                measured = [r for r in full if r[f"{metric}_measured"] is not None]
                if measured:
                    level = 50 if metric == "L50" else 95
                    n = sorted({len(measured_of[id(r)]) for r in measured})
                    ax.errorbar([r["K"] for r in measured],
                                [r[f"{metric}_measured"] for r in measured],
                                yerr=_interval_errors(
                                    [measured_of[id(r)] for r in measured],
                                    [r[f"{metric}_measured"] for r in measured], level),
                                fmt="o", color=color, ms=7, mfc="none", mew=2, capsize=3,
                                zorder=3, label=_label_once(
                                    seen, f"{policy} measured, 95% interval (n="
                                    f"{'/'.join(map(str, n))} per run)"))
                for r in in_group:
                    if r["policy"] != policy or r["status"] == "complete":
                        continue
                    if r[f"{metric}_measured"] is not None:
                        ax.plot([r["K"]], [r[f"{metric}_measured"]],
                                STATUS_MARKERS.get(r["status"], "^"), color=color, ms=8,
                                label=_label_once(seen, f"{policy} measured, partial run "
                                                  f"({r['status']}: its own window)"))
                    if r[f"{metric}_predicted"] is not None:
                        ax.plot([r["K"]], [r[f"{metric}_predicted"]], "x", color=color,
                                ms=7, mew=1.5,
                                label=_label_once(seen, f"{policy} simulated over a "
                                                  "partial run's window"))
            for policy, text in THEORY_LINES.items():
                lines = sorted({(r["K"], theory.theory_lines(r)[f"{policy}_{metric}"])
                                for r in in_group if r["policy"] == policy},
                               key=lambda kv: kv[0])
                pts = [(k, v) for k, v in lines if v is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), ":", color=policy_color(policy),
                            label=_label_once(seen, text))
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.set_xlabel("chunk size K (latents)")
        ax.set_ylabel(f"{metric} (s)")
        ax.set_title(f"{metric}: measured vs predicted")
        style.style_axes(ax)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=FONT["legend"],
               frameon=False)
    fig.suptitle(f"{compare_setup_title(comparison)}; predicted = re-simulated with measured "
                 "C; lines join one measurement's complete runs", fontsize=FONT["suptitle_small"])
    rows_of_legend = -(-len(labels) // 3)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * rows_of_legend + 0.02), 1, 1))
    return fig


def plot_capacity(payload: dict, path: Path, config: dict | None = None) -> Path:
    """Capacity search: end-to-end L95 and viewer stall % against the stream count, with
    the SLO lines, error bars of one bootstrap SE, and the DiT pool's busy %.

    A point's colour is its stream count's verdict (the legend says which); a point drawn
    hollow is within this panel's SLO although its verdict failed, on the other metric.
    ``config`` (the command's K, cost, lead, policy, serving) names the setting."""
    from matplotlib.lines import Line2D

    rows = sorted(payload["rows"], key=lambda r: r["streams"])
    fig, (left, right) = plt.subplots(1, 2, figsize=style.TWO_PANELS, sharex=True)
    colors = style.VERDICT_COLORS
    for ax, key, se_key, limit, label in (
            (left, "L95", "L95_se", payload["slo"]["L95"], "end-to-end L95 (s)"),
            (right, "viewer_stall_pct", "viewer_stall_pct_se", payload["slo"]["viewer_stall_pct"],
             "viewer stall (%)")):
        for row in rows:
            if row[key] is not None:
                color = colors.get(row["verdict"], "k")
                within = row[key] <= limit
                ax.errorbar(row["streams"], row[key], yerr=row[se_key] or 0, fmt="o",
                            color=color, capsize=3,
                            markerfacecolor="white" if within and row["verdict"] != "meets"
                            else color)
        ax.axhline(limit, ls="--", color="k", lw=1)
        ax.set_xlabel("streams N")
        ax.set_ylabel(label)
        style.integer_ticks(ax.xaxis)  # stream counts
        style.style_axes(ax)
    keys = [Line2D([], [], marker="o", ls="", color=c, label=f"N {verdict}")
            for verdict, c in colors.items() if any(r["verdict"] == verdict for r in rows)]
    limits = {"L95": payload["slo"]["L95"],
              "viewer_stall_pct": payload["slo"]["viewer_stall_pct"]}
    if any(r["verdict"] != "meets" and r[k] is not None and r[k] <= limit
           for r in rows for k, limit in limits.items()):
        keys.append(Line2D([], [], marker="o", ls="", color=colors["fails"],
                           markerfacecolor="white", label="within this SLO, failed on the other"))
    keys.append(Line2D([], [], ls="--", color="k", lw=1, label="SLO"))
    right.legend(handles=keys, fontsize=FONT["legend"], loc="upper left")
    busy = right.twinx()
    busy.plot([r["streams"] for r in rows], [r["busy_pct"] for r in rows], ":",
              color=style.PALETTE["blue"], label="DiT busy %")
    busy.set_ylabel("DiT pool busy (%)", color=style.PALETTE["blue"])
    if payload["max_streams"] is not None:
        left.axvline(payload["max_streams"], color=colors["meets"], lw=1, alpha=0.6,
                     label=f"capacity {payload['max_streams']}")
        left.legend(fontsize=FONT["legend"], loc="upper left")
    title = "capacity search"
    if config:
        pools = (config.get("serving") or {}).get("pools")
        if isinstance(pools, dict):
            pools = ",".join(f"{name}={size}" for name, size in pools.items())
        elif isinstance(pools, list | tuple):
            pools = ",".join(f"{name}={size}" for name, size in pools)
        title += (f": K={config.get('K')}, {config.get('policy')}, cost {config.get('cost')}, "
                  f"lead {config.get('lead') if config.get('lead') is not None else 'cost'}"
                  + (f", pools {pools}" if pools else ""))
    fig.suptitle(title, fontsize=FONT["suptitle"])
    fig.tight_layout()
    return _save(fig, path)
