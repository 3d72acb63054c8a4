"""The paper reproduction's figure and terminal report (the tables come from
:mod:`latsim.experiments.paper`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latsim.analysis import theory
from latsim.experiments.paper import (
    AMP_C,
    AMP_DURATION,
    AMP_KS,
    AMP_PS,
    AMP_SEEDS,
    C_METHOD_TEXT,
    EQ6_PHASES,
    Reproduction,
)
from latsim.formatting import fmt


def plot_reproduction(result: Reproduction, path: Path) -> Path:
    """Four panels: reductions per setting, eq. (6), A(p), stall vs C/T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0, 0]
    names = [row["setting"] for row in result.settings]
    x = np.arange(len(names))
    series = [("paper (measured)", "paper_reduction", "#d62728"),
              ("theory (T-δ)/2", "theory_reduction", "#7f7f7f"),
              ("ours: low traces", "sim_low_reduction", "#98df8a"),
              ("ours: high traces", "sim_high_reduction", "#2ca02c")]
    for i, (label, key, color) in enumerate(series):
        values = [row[key] for row in result.settings]
        ax.bar(x + (i - 1.5) * 0.2, values, 0.2, label=label, color=color)
        for j, value in enumerate(values):
            if value is not None and abs(value) < 0.005:  # a bar too short to see: say 0
                ax.text(x[j] + (i - 1.5) * 0.2, 0.02, "0", ha="center", fontsize=6,
                        color=color)
    for j, row in enumerate(result.settings):
        if row["C_over_T"] > 1:  # the closed form assumes C <= T: say why ours is 0
            ax.text(x[j], 0.45, f"C = {row['C_over_T']:.2f} T:\nstalls, no gain",
                    ha="center", fontsize=6)
    ax.set_xticks(x, [n.replace(" ", "\n") for n in names], fontsize=8)
    ax.set_ylabel("mean-latency reduction (s)")
    ax.set_title("baseline − speculative, six serving settings")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[0, 1]
    labels = [row["quantity"] for row in result.eq6]
    y = np.arange(len(labels))
    ax.barh(y + 0.2, [row["theory"] for row in result.eq6], 0.4, label="theory",
            color="#7f7f7f")
    ax.barh(y - 0.2, [row["simulated"] for row in result.eq6], 0.4, label="simulated",
            color="#2ca02c")
    ax.set_yticks(y, [f"{label} (a probability)" if label == "P(busy)" else label
                      for label in labels], fontsize=8)
    ax.set_xlabel("seconds (P(busy): a probability, on the same axis)")
    ax.set_title("eq. (6) example: T = 5 s, C = 1.6 s")
    ax.legend(fontsize=7)

    ax = axes[1, 0]
    for K in AMP_KS:  # noqa: N806
        sel = [row for row in result.amplification if row["K"] == K]
        ps = [row["p"] for row in sel]
        line = ax.plot(ps, [row["A_independent"] for row in sel], "-", label=f"K={K}")[0]
        ax.plot(ps, [row["A_sim"] for row in sel], "o", color=line.get_color())
        poi = [(row["p"], row["A_poisson_approx"]) for row in sel if row["A_poisson_approx"]]
        if poi:
            ax.plot(*zip(*poi, strict=True), ":", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xticks(AMP_PS, [f"{p:g}" for p in AMP_PS])
    ax.minorticks_off()
    ax.set_xlabel("per-latent update probability p")
    ax.set_ylabel("work amplification A")
    ax.set_title("A(p): line Kp/(1-(1-p)^K), dotted 1+λ(T-δ)/2, dots simulated")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)

    ax = axes[1, 1]
    sweep = [row for row in result.stall if row["case"].startswith("C/T")]
    for policy, marker in (("baseline", "o"), ("speculative", "x")):
        sel = [row for row in sweep if row["policy"] == policy]
        ax.plot([row["C_over_T"] for row in sel], [row["sim_stall_pct"] for row in sel],
                marker, label=f"simulated {policy}")
    ratios = np.linspace(0.5, 2.0, 200)
    ax.plot(ratios, [100 * theory.stall_fraction(q, 1.0) for q in ratios], "-", color="#7f7f7f",
            label="theory 100·(1 − T/C)")
    for row in result.stall:
        if row["paper_stall_pct"] is not None and row["policy"] == "baseline":
            ax.plot(row["C_over_T"], row["paper_stall_pct"], "*", color="#d62728",
                    markersize=10)
    ax.plot([], [], "*", color="#d62728", label="paper: LTX short eager")
    ax.set_xlabel("C / T")
    ax.set_ylabel("stall %")
    ax.set_title("stall regime (LTX-2.3 K=3, T = 1 s)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


# ---------------------------------------------------------------- terminal report


def _signed(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:+.{digits}f}"


def print_report(result: Reproduction) -> None:
    """Rich tables: ours beside the paper's, with the differences."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=170)
    t = Table(title="Six serving settings and the generation time C used for each")
    for header in ("setting", "K", "r", "fps", "T (s)", "δ (s)", "C (s)", "C/T", "C from",
                   "C implied by paper Δ"):
        t.add_column(header, justify="left" if header in ("setting", "C from") else "right",
                     no_wrap=True)
    for row in result.settings:
        t.add_row(row["setting"], str(row["K"]), str(row["r"]), fmt(row["fps"], 0),
                  fmt(row["T"]), fmt(row["delta"]), fmt(row["C"]), fmt(row["C_over_T"], 2),
                  row["C_method"], fmt(row["C_implied_by_paper"]))
    console.print(t)
    for method, text in C_METHOD_TEXT.items():
        console.print(f"[dim]C from {method}: {text}[/dim]")
    console.print("[dim]C implied = the C with (T−δ)/2 − C²/(2T) = the paper's Δ "
                  "(– : none, the paper's Δ exceeds (T−δ)/2)[/dim]")
    t = Table(title="Mean-latency reduction Δ = baseline − speculative L_mean (s): paper vs "
              "theory vs ours (simulated on the committed trace sets)")
    for header in ("setting", "paper Δ", "theory (T−δ)/2", "theory−paper", "theory Δ(C)",
                   "sim low ±se", "sim high ±se", "low−paper", "high−paper"):
        t.add_column(header, justify="left" if header == "setting" else "right",
                     no_wrap=True)
    for row in result.settings:
        t.add_row(
            row["setting"], fmt(row["paper_reduction"]), fmt(row["theory_reduction"]),
            _signed(row["diff_theory_minus_paper"]), fmt(row["theory_reduction_at_C"]),
            f"{fmt(row['sim_low_reduction'])}±{fmt(row['sim_low_reduction_se'], 2)}",
            f"{fmt(row['sim_high_reduction'])}±{fmt(row['sim_high_reduction_se'], 2)}",
            _signed(row["diff_sim_low_minus_paper"]), _signed(row["diff_sim_high_minus_paper"]),
        )
    console.print(t)
    console.print("[dim]theory Δ(C) = C + T/2 − refined speculative mean (eq. 6 + Q), "
                  "theory.speculative_latency_mean; – where C > T[/dim]")

    t = Table(title="Eq. (6) worked example, T = 5 s (K=20, r=1, 4 fps), C = 1.6 s; "
              f"simulation over {EQ6_PHASES} arrival phases")
    for header in ("quantity", "theory", "simulated", "sim−theory", "paper", "theory−paper"):
        t.add_column(header, justify="left" if header == "quantity" else "right")
    for row in result.eq6:
        t.add_row(row["quantity"], fmt(row["theory"]), fmt(row["simulated"]),
                  _signed(row["diff_sim_minus_theory"], 4), fmt(row["paper"]),
                  _signed(row["diff_theory_minus_paper"]))
    console.print(t)

    t = Table(title=f"Work amplification A: theory vs simulation (C = {AMP_C} s ≪ δ = 0.25 s, "
              f"bernoulli:p, {AMP_SEEDS} × {AMP_DURATION:g} s)")
    for header in ("K", "p", "λT", "Kp/(1−(1−p)^K)", "1+λ(T−δ)/2", "sim A", "sim 1/(1−w)",
                   "sim−theory"):
        t.add_column(header, justify="right")
    for row in result.amplification:
        t.add_row(str(row["K"]), fmt(row["p"]), fmt(row["lambda_T"], 2),
                  fmt(row["A_independent"]), fmt(row["A_poisson_approx"]), fmt(row["A_sim"]),
                  fmt(row["A_sim_from_w"]), _signed(row["diff_sim_minus_independent"]))
    console.print(t)

    t = Table(title="Stall regime: LTX-2.3 short chunk (K=3, T=1 s) with C > T, and a C/T sweep")
    for header in ("case", "policy", "C", "C/T", "theory stall %", "sim stall %", "paper %",
                   "sim−paper", "sim L mean", "3T/2 at C=T"):
        t.add_column(header, justify="left" if header in ("case", "policy") else "right")
    for row in result.stall:
        t.add_row(row["case"], row["policy"], fmt(row["C"]), fmt(row["C_over_T"], 2),
                  fmt(row["theory_stall_pct"], 2), fmt(row["sim_stall_pct"], 2),
                  fmt(row["paper_stall_pct"], 3), _signed(row["diff_sim_minus_paper"], 2),
                  fmt(row["sim_L_mean"]), fmt(row["theory_saturated_L_mean"]))
    console.print(t)

    t = Table(title="Paper Table 3 values beside ours (L50 s, stall %)")
    for header in ("setting", "metric", "load", "paper", "ours", "ours−paper"):
        t.add_column(header, justify="left" if header in ("setting", "metric", "load")
                     else "right")
    for row in result.l50:
        t.add_row(row["setting"], row["metric"], row["load"], fmt(row["paper"]),
                  fmt(row["ours"]), _signed(row["diff_ours_minus_paper"]))
    console.print(t)


def plot_serving(tables: dict[str, list[dict]], path: Path) -> Path:
    """Three panels: end-to-end L50 cells (paper vs ours), long-chunk capacity against the
    lead's queueing margin, and viewer stall by discard mode against the stream count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    cells = [row for row in tables["e2e"] if row["metric"] == "L50"
             and row["calibrated_on"] == tables["e2e"][0]["calibrated_on"]]
    x = np.arange(len(cells))
    left.bar(x - 0.2, [c["paper"] for c in cells], 0.4, color="#d62728", label="paper")
    left.bar(x + 0.2, [c["ours"] for c in cells], 0.4, color="#2ca02c", label="ours")
    left.set_xticks(x, [f"{c['setting'].split()[1]} {c['policy'][:4]}\n{c['load']}"
                        f"{' (fit)' if c['role'] == 'calibrated' else ''}" for c in cells],
                    fontsize=7)
    left.set_ylabel("end-to-end L50 (s)")
    left.set_title("Sol-H3 end to end", fontsize=9)
    left.legend(fontsize=7)
    for i, setting in enumerate(sorted({r["setting"] for r in tables["headroom"]})):
        for factor, style in ((1.0, "o-"), (1.5, "s--")):
            rows = [r for r in tables["headroom"]
                    if r["setting"] == setting and r["slo_factor"] == factor]
            # the first setting hollow and larger: a series the other covers still shows
            middle.plot([r["margin_C"] for r in rows], [r["max_streams"] for r in rows], style,
                        ms=9 if i == 0 else 4, mfc="none" if i == 0 else None,
                        label=f"{setting}, SLO {factor:g}x")
    middle.set_xlabel("lead margin (multiples of C)")
    middle.set_ylabel("streams meeting the SLO")
    middle.set_title("long-chunk headroom per USP group", fontsize=9)
    middle.legend(fontsize=6)
    for discard, color in (("on-start", "#7f7f7f"), ("on-ready", "#1f77b4")):
        rows = [r for r in tables["discard"] if r["discard"] == discard]
        right.plot([r["streams"] for r in rows], [r["stall_pct"] for r in rows], "o-",
                   color=color, label=discard)
    right.set_xlabel("speculative streams on one device")
    right.set_ylabel("stall (%)")
    right.set_title("when a replan discards the old future", fontsize=9)
    right.legend(fontsize=7)
    from matplotlib.ticker import MaxNLocator

    middle.yaxis.set_major_locator(MaxNLocator(integer=True))  # stream counts
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (left, middle, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_serving_report(tables: dict[str, list[dict]]) -> None:
    """The three serving tables, short, on the terminal."""
    print("end-to-end (Sol-H3; one cell calibrates the overhead D, the rest are predictions)")
    for r in tables["e2e"]:
        print(f"  [{r['calibrated_on']}] {r['setting']:13s} {r['policy']:11s} "
              f"{r['metric']:16s} {r['load']:4s} paper {fmt(r['paper'], 3):>6s} ours "
              f"{fmt(r['ours'], 3):>6s} err {fmt(r['err_pct'], 1):>6s}% {r['role']}")
    print("headroom (streams per USP group meeting the SLO; naive = 100 / busy %)")
    for r in tables["headroom"]:
        print(f"  {r['setting']:13s} SLO L95 {fmt(r['slo_L95'], 3)} s, lead "
              f"{fmt(r['lead'], 3)} s (+{r['margin_C']:g} C): {r['max_streams']} "
              f"(naive {r['streams_by_activity']})")
    for table, key in (("discard", "discard"), ("schedule", "schedule")):
        print(f"{key} (speculative streams sharing one device)")
        for r in tables[table]:
            print(f"  {r['streams']} stream(s) {r[key]:12s} stall {fmt(r['stall_pct'], 3)}% "
                  f"L50 {fmt(r['L50'], 3)} L95 {fmt(r['L95'], 3)} L99 {fmt(r['L99'], 3)}")
    print("lead (fixed C = 0.5 s on one device): C's 0.99 quantile vs --lead auto")
    for r in tables.get("lead", ()):
        print(f"  {r['streams']} stream(s) rho {r['rho']:.2f} {r['policy']:11s} "
              f"{r['lead_rule']:5s} lead {fmt(r['lead'], 3)} stall "
              f"{fmt(r['viewer_stall_pct'], 3)}% L50 {fmt(r['L50'], 3)} L95 {fmt(r['L95'], 3)}")


def plot_systems(tables: dict[str, list[dict]], path: Path) -> Path:
    """L50 and L95 of each seed system against the plain target, per device speed and
    policy (high-frequency traces; Wave Forcing at its own timing in the first panel), and
    the mean C against the lead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in tables["interactive"] if r["load"] == "high"]
    speeds = sorted({r["speed"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(1, len(speeds) + 1, figsize=(5 * (len(speeds) + 1), 4))
    colors = {"baseline": "#7f7f7f", "speculative": "#2ca02c"}
    for ax, speed in zip(axes, speeds, strict=False):
        systems = list(dict.fromkeys(r["system"] for r in rows if r["speed"] == speed))
        x = np.arange(len(systems))
        for i, policy in enumerate(("baseline", "speculative")):
            sel = {r["system"]: r for r in rows if r["speed"] == speed and r["policy"] == policy}
            ax.bar(x + (i - 0.5) * 0.38, [sel[s]["L50"] for s in systems], 0.38,
                   color=colors[policy], label=f"{policy} L50")
            ax.scatter(x + (i - 0.5) * 0.38, [sel[s]["L95"] for s in systems], marker="_",
                       s=300, color="k", label="L95" if i == 0 else None)
        ax.set_xticks(x, [name.replace("Wave Forcing ", "WF ") for name in systems],
                      fontsize=7, rotation=35, ha="right")
        ax.set_ylabel("latency (s)")
        ax.set_title(f"device speed x{speed:g} (high-frequency traces)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    ax = axes[-1]
    systems = list(dict.fromkeys(r["system"] for r in rows if r["speed"] == speeds[-1]))
    for i, speed in enumerate(speeds):
        sel = {r["system"]: r for r in rows if r["speed"] == speed and r["policy"] == "baseline"}
        x = np.arange(len(systems)) + (i - 0.5) * 0.38
        ax.bar(x, [sel[s]["C_mean_model"] for s in systems], 0.38, alpha=0.6,
               label=f"mean C, speed x{speed:g}")
        ax.scatter(x, [sel[s]["lead"] for s in systems], marker="v", color="k",
                   label="lead = C's 0.99 quantile" if i == 0 else None)
    ax.set_xticks(np.arange(len(systems)), systems)
    ax.set_ylabel("seconds")
    ax.set_title("generation time: mean vs the tail the lead must cover", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_systems_report(tables: dict[str, list[dict]]) -> None:
    """The two systems tables, short, on the terminal."""
    print("reproduction (each reported figure beside latsim's)")
    for r in tables["reproduction"]:
        print(f"  {r['system']:6s} {r['figure'][:62]:62s} paper {fmt(r['paper'], 3):>6s} "
              f"ours {fmt(r['ours'], 3):>6s} err {fmt(r['err_pct'], 1):>6s}% {r['role']}")
    print("interactive (high-frequency traces; L50 / L95 / stall %)")
    for r in tables["interactive"]:
        if r["load"] == "high":
            print(f"  speed x{r['speed']:g} {r['system']:12s} {r['policy']:11s} C mean "
                  f"{fmt(r['C_mean'], 3)} lead {fmt(r['lead'], 3)}  L50 {fmt(r['L50'], 3)} "
                  f"L95 {fmt(r['L95'], 3)} stall {fmt(r['viewer_stall_pct'], 2)}%")
