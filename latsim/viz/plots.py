"""Figures drawn from result rows and records (matplotlib is imported here only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from latsim.analysis import theory  # noqa: E402

POLICY_COLORS = {"baseline": "#7f7f7f", "speculative": "#2ca02c"}


def plot_latency_vs_k(rows: list[dict], path: Path) -> Path:
    """L50 and L95 against K per policy, with the closed forms drawn in.

    Theory lines (fixed C, lead = C): the baseline's L is uniform on [C, C+T), so its median
    is C + T/2 and its 95th percentile C + 0.95·T; for latent commitment the rare-update mean
    (eq. 6 plus Q) and the ideal C + δ/2.
    """
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    policies = sorted({row["policy"] for row in rows})
    for ax, metric in zip(axes, ("L50", "L95"), strict=True):
        for policy in policies:
            sel = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["K"])
            pts = [(r["K"], r[metric]) for r in sel if r[metric] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", color=POLICY_COLORS.get(policy),
                        label=f"{policy} (simulated)")
        base = sorted((r for r in rows if r["policy"] == "baseline"), key=lambda r: r["K"])
        fixed = [r for r in base if r["L_mean_theory"] is not None]
        if fixed:
            share = 0.5 if metric == "L50" else 0.95
            ax.plot([r["K"] for r in fixed],
                    [theory.baseline_latency_quantile(r["lead"], r["T"], share) for r in fixed],
                    "--",
                    color=POLICY_COLORS["baseline"],
                    label=f"baseline theory C + {share:g}·T")
        spec = sorted((r for r in rows if r["policy"] == "speculative"), key=lambda r: r["K"])
        spec_fixed = [r for r in spec if r["L_mean_theory"] is not None]
        if metric == "L50" and spec_fixed:
            ax.plot([r["K"] for r in spec_fixed], [r["L_mean_theory"] for r in spec_fixed], ":",
                    color=POLICY_COLORS["speculative"], label="speculative theory mean (eq. 6+Q)")
            ax.plot([r["K"] for r in spec_fixed],
                    [theory.speculative_latency_ideal(r["C_mean"], r["delta"])
                     for r in spec_fixed],
                    "-.", color="#98df8a", label="ideal C + δ/2")
        ax.set_xlabel("chunk size K (latents)")
        ax.set_ylabel(f"{metric} latency (s)")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if rows:
        first = rows[0]
        fig.suptitle(
            f"{first['fps']:g} fps, r={first['r']}, cost {first['cost']}, updates "
            f"{first['updates']}, {first['duration']:g} s × {first['n_runs']} runs",
            fontsize=9,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _ecdf(values) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def plot_compare_cdf(comparison, path: Path) -> Path:
    """Per K, the CDF of measured (steps) and predicted (lines) L for each policy."""
    rows = comparison.rows
    ks = sorted({row["K"] for row in rows})
    fig, axes = plt.subplots(1, len(ks), figsize=(4 * len(ks), 3.6), squeeze=False)
    for ax, K in zip(axes[0], ks, strict=True):  # noqa: N806
        for run, row, predicted in zip(comparison.runs, rows, comparison.predicted_latencies,
                                       strict=True):
            if row["K"] != K:
                continue
            color = POLICY_COLORS.get(row["policy"])
            if run.latencies:
                ax.step(*_ecdf(run.latencies), where="post", color=color, lw=2,
                        label=f"{row['policy']} measured (n={len(run.latencies)})")
            if predicted:
                ax.plot(*_ecdf(predicted), "--", color=color, lw=1,
                        label=f"{row['policy']} predicted")
        ax.set_title(f"K={K}")
        ax.set_xlabel("latency L (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("CDF")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path


def plot_compare_overlay(comparison, path: Path) -> Path:
    """L50 and L95 vs K: measured points, simulated (predicted) lines, theory lines."""
    rows = sorted(comparison.rows, key=lambda r: r["K"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, metric in zip(axes, ("L50", "L95"), strict=True):
        for policy in sorted({r["policy"] for r in rows}):
            sel = [r for r in rows if r["policy"] == policy]
            color = POLICY_COLORS.get(policy)
            ks = [r["K"] for r in sel]
            ax.plot(ks, [r[f"{metric}_predicted"] for r in sel], "-", color=color,
                    label=f"{policy} simulated")
            ax.plot(ks, [r[f"{metric}_measured"] for r in sel], "o", color=color, ms=7,
                    mfc="none", mew=2, label=f"{policy} measured")
        base = [(r["K"], theory.theory_lines(r)) for r in rows if r["policy"] == "baseline"]
        key = "baseline_L50" if metric == "L50" else "baseline_L95"
        pts = [(k, t[key]) for k, t in base if t[key] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), ":", color=POLICY_COLORS["baseline"],
                    label="baseline theory lead + " + ("T/2" if metric == "L50" else "0.95·T"))
        spec = [(r["K"], theory.theory_lines(r)["speculative_L_mean"]) for r in rows
                if r["policy"] == "speculative"]
        pts = [(k, v) for k, v in spec if v is not None]
        if pts and metric == "L50":
            ax.plot(*zip(*pts, strict=True), ":", color=POLICY_COLORS["speculative"],
                    label="speculative theory mean (eq. 6 + Q, at lead)")
        ax.set_xlabel("chunk size K (latents)")
        ax.set_ylabel(f"{metric} (s)")
        ax.set_title(f"{metric}: measured vs predicted")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path
