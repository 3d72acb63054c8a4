"""The reproductions' terminal reports (``latsim reproduce``, ``reproduce serving``,
``reproduce systems``): their tables beside the paper's and the seeds', laid out for the
terminal by :func:`latsim.cli.tables.print_table` (at 80 columns the least important
columns go first and are named)."""

from __future__ import annotations

import textwrap

from latsim.cli.tables import Column, print_table
from latsim.experiments.paper import (
    AMP_C,
    AMP_DURATION,
    AMP_SEEDS,
    EQ6_PHASES,
    Reproduction,
)
from latsim.experiments.paper_settings import C_METHOD_TEXT
from latsim.formatting import fmt


def _signed(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:+.{digits}f}"


def print_report(result: Reproduction) -> None:
    """Tables of ours beside the paper's, with the differences."""
    def columns(*spec: tuple[str, int]) -> list[Column]:
        return [Column(header, rank, "left" if rank == 0 and header in LEFT else "right")
                for header, rank in spec]

    LEFT = {"setting", "C from", "quantity", "case", "policy", "metric", "load",  # noqa: N806
            "family"}
    print_table(
        "Six serving settings and the generation time C used for each",
        columns(("setting", 0), ("K", 0), ("r", 2), ("fps", 2), ("T (s)", 1), ("δ (s)", 2),
                ("C (s)", 0), ("C/T", 1), ("C from", 3), ("C implied by paper Δ", 3)),
        [[row["setting"], str(row["K"]), str(row["r"]), fmt(row["fps"], 0), fmt(row["T"]),
          fmt(row["delta"]), fmt(row["C"]), fmt(row["C_over_T"], 2), row["C_method"],
          fmt(row["C_implied_by_paper"])] for row in result.settings],
        [*(f"[dim]C from {method}: {text}[/dim]" for method, text in C_METHOD_TEXT.items()),
         "[dim]C implied = the C with (T−δ)/2 − C²/(2T) = the paper's Δ (– : none, the "
         "paper's Δ exceeds (T−δ)/2)[/dim]"])
    print_table(
        "Mean-latency reduction Δ = baseline − speculative L_mean (s): paper vs theory vs "
        "ours (simulated on the committed trace sets)",
        columns(("setting", 0), ("paper Δ", 0), ("theory (T−δ)/2", 1), ("theory−paper", 3),
                ("theory Δ(C)", 2), ("sim low ±se", 0), ("sim high ±se", 0),
                ("low−paper", 2), ("high−paper", 2)),
        [[row["setting"], fmt(row["paper_reduction"]), fmt(row["theory_reduction"]),
          _signed(row["diff_theory_minus_paper"]), fmt(row["theory_reduction_at_C"]),
          f"{fmt(row['sim_low_reduction'])}±{fmt(row['sim_low_reduction_se'], 2)}",
          f"{fmt(row['sim_high_reduction'])}±{fmt(row['sim_high_reduction_se'], 2)}",
          _signed(row["diff_sim_low_minus_paper"]), _signed(row["diff_sim_high_minus_paper"])]
         for row in result.settings],
        ["[dim]theory Δ(C) = C + T/2 − refined speculative mean (eq. 6 + Q), "
         "theory.speculative_latency_mean; – where C > T[/dim]"])
    print_table(
        f"Eq. (6) worked example, T = 5 s (K=20, r=1, 4 fps), C = 1.6 s; simulation over "
        f"{EQ6_PHASES} arrival phases",
        columns(("quantity", 0), ("theory", 0), ("simulated", 0), ("sim−theory", 1),
                ("paper", 0), ("theory−paper", 1)),
        [[row["quantity"], fmt(row["theory"]), fmt(row["simulated"]),
          _signed(row["diff_sim_minus_theory"], 4), fmt(row["paper"]),
          _signed(row["diff_theory_minus_paper"])] for row in result.eq6])
    print_table(
        f"Work amplification A: theory vs simulation (C = {AMP_C} s ≪ δ = 0.25 s, "
        f"bernoulli:p, {AMP_SEEDS} × {AMP_DURATION:g} s)",
        columns(("K", 0), ("p", 0), ("λT", 1), ("Kp/(1−(1−p)^K)", 0), ("1+λ(T−δ)/2", 2),
                ("sim A", 0), ("sim 1/(1−w)", 2), ("sim−theory", 1)),
        [[str(row["K"]), fmt(row["p"]), fmt(row["lambda_T"], 2), fmt(row["A_independent"]),
          fmt(row["A_poisson_approx"]), fmt(row["A_sim"]), fmt(row["A_sim_from_w"]),
          _signed(row["diff_sim_minus_independent"])] for row in result.amplification])
    print_table(
        "Stall regime: LTX-2.3 short chunk (K=3, T=1 s) with C > T, and a C/T sweep",
        columns(("case", 0), ("policy", 0), ("C", 2), ("C/T", 0), ("theory stall %", 1),
                ("sim stall %", 0), ("paper %", 0), ("sim−paper", 2), ("sim L mean", 3),
                ("3T/2 at C=T", 3)),
        [[row["case"], row["policy"], fmt(row["C"]), fmt(row["C_over_T"], 2),
          fmt(row["theory_stall_pct"], 2), fmt(row["sim_stall_pct"], 2),
          fmt(row["paper_stall_pct"], 3), _signed(row["diff_sim_minus_paper"], 2),
          fmt(row["sim_L_mean"]), fmt(row["theory_saturated_L_mean"])]
         for row in result.stall])
    print_table(
        "Paper Table 3 cells (measured end to end) beside the end-to-end serving model "
        "(L50 s, stall %)",
        columns(("setting", 0), ("metric", 0), ("load", 0), ("paper", 0), ("end to end", 0),
                ("role", 2), ("e2e−paper", 1), ("boundary wait", 3), ("bw−paper", 4)),
        [[row["setting"], row["metric"], row["load"], fmt(row["paper"]),
          fmt(row["end_to_end"]), row["end_to_end_role"] or "–",
          _signed(row["diff_end_to_end_minus_paper"]), fmt(row["boundary_wait"]),
          _signed(row["diff_boundary_wait_minus_paper"])] for row in result.l50],
        ["[dim]end to end: the serving model of `latsim reproduce serving` (USP group, "
         "family lead, one overhead D calibrated on the Sol-H3 short baseline high cell; "
         "role says which cell is calibrated, fitted or predicted)[/dim]",
         "[dim]boundary wait: the bare model without lead, decode, network or playout, the "
         "part of L that commitment changes; not a prediction of these cells[/dim]"])
    low, high = (result.long_minus_short[0][key] for key in ("paper_low", "paper_high"))
    print_table(
        f"Speculative L50, long minus short chunk (s): paper {low:g}–{high:g} for every "
        "family",
        columns(("family", 0), ("load", 0), ("boundary wait", 0), ("in paper range", 0),
                ("C long−short", 1)),
        [[row["family"], row["load"], _signed(row["boundary_wait"]),
          "yes" if row["within_paper_range"] else "no", _signed(row["C_long_minus_short"])]
         for row in result.long_minus_short],
        ["[dim]the bare model's difference moves with C long − C short (its lead is each "
         "setting's C; the paper's leads are not stated); LTX-2.3 short has C > T and "
         "stalls, which lengthens its L50[/dim]"])


def _columns(left: tuple[str, ...], *spec: tuple[str, int]) -> list[Column]:
    """``(header, rank)`` columns, the ``left`` ones left-aligned."""
    return [Column(header, rank, "left" if header in left else "right")
            for header, rank in spec]


def _error(row: dict) -> str:
    """A compared row's error: percent of the paper's (or seed's) value, or percentage
    points for a stall % (whose paper value may be 0)."""
    if row.get("metric", "").endswith("pct"):
        return "–" if row["diff"] is None else f"{row['diff']:+.2f} pp"
    return "–" if row["err_pct"] is None else f"{row['err_pct']:+.1f}%"


#: Short names of the serving tables' metrics.
_METRIC = {"L50": "L50 (s)", "viewer_stall_pct": "stall %"}


def print_serving_report(tables: dict[str, list[dict]]) -> None:
    """``reproduce serving``'s tables: end to end (one table per calibration), headroom,
    discard, schedule and lead."""
    left = ("setting", "policy", "metric", "load", "role", "discard", "schedule", "rule")

    def columns(*spec: tuple[str, int]) -> list[Column]:
        return _columns(left, *spec)

    for group in dict.fromkeys(r["calibrated_on"] for r in tables["e2e"]):
        print_table(
            f"End to end, calibrated on: {group}",
            columns(("setting", 0), ("policy", 0), ("metric", 0), ("load", 0), ("paper", 0),
                    ("ours", 0), ("± SE", 2), ("error", 1), ("role", 3)),
            [[r["setting"], r["policy"], _METRIC.get(r["metric"], r["metric"]), r["load"],
              fmt(r["paper"]), fmt(r["ours"]), fmt(r.get("ours_se")), _error(r), r["role"]]
             for r in tables["e2e"] if r["calibrated_on"] == group])
    print_table(
        "Headroom: streams per USP group meeting the SLO (viewer stall <= 0.1 %)",
        columns(("setting", 0), ("SLO L95 (s)", 0), ("lead (s)", 0), ("+C", 1),
                ("streams", 0), ("naive", 1)),
        [[r["setting"], fmt(r["slo_L95"]), fmt(r["lead"]), f"{r['margin_C']:g}",
          str(r["max_streams"]), str(r["streams_by_activity"])] for r in tables["headroom"]],
        ["[dim]+C: the lead's queueing margin in units of C; naive = 100 / busy %[/dim]"])
    for table in ("discard", "schedule"):
        print_table(
            f"{table.capitalize()}: speculative streams sharing one device",
            columns(("streams", 0), (table, 0), ("stall %", 0), ("± SE", 1), ("L50", 0),
                    ("L95", 0), ("± SE ", 1), ("L99", 2)),
            [[str(r["streams"]), r[table], fmt(r["stall_pct"]), fmt(r.get("stall_pct_se")),
              fmt(r["L50"]), fmt(r["L95"]), fmt(r.get("L95_se")), fmt(r["L99"])]
             for r in tables[table]],
            ["[dim]± SE: standard error over replications (the stall %'s, then L95's)[/dim]"])
    if tables.get("lead"):
        print_table(
            "Lead: C's 0.99 quantile (cost) vs --lead auto (fixed C = 0.5 s, one device)",
            columns(("streams", 0), ("ρ", 1), ("policy", 0), ("rule", 0), ("lead", 0),
                    ("stall %", 0), ("L50", 2), ("L95", 0)),
            [[str(r["streams"]), fmt(r["rho"], 2), r["policy"], r["lead_rule"],
              fmt(r["lead"]), fmt(r["viewer_stall_pct"]), fmt(r["L50"]), fmt(r["L95"])]
             for r in tables["lead"]])


def print_systems_report(tables: dict[str, list[dict]]) -> None:
    """``reproduce systems``' tables: each seed's reported figure beside latsim's, and the
    systems' interactive latency on the high-frequency traces."""
    left = ("system", "figure", "role", "policy")

    def columns(*spec: tuple[str, int]) -> list[Column]:
        return _columns(left, *spec)

    print_table(
        "Each seed's reported figure beside latsim's",
        columns(("system", 0), ("figure", 0), ("paper", 0), ("ours", 0), ("error", 1),
                ("role", 2)),
        [[r["system"], "\n".join(textwrap.wrap(r["figure"], 32)), fmt(r["paper"]),
          fmt(r["ours"]), _error(r), r["role"]] for r in tables["reproduction"]])
    print_table(
        "Interactive latency, high-frequency traces (L50, L95 s; viewer stall %)",
        columns(("speed", 0), ("system", 0), ("policy", 0), ("C mean", 2), ("lead", 1),
                ("L50", 0), ("L95", 0), ("stall %", 0)),
        [[f"x{r['speed']:g}", r["system"], r["policy"], fmt(r["C_mean"]), fmt(r["lead"]),
          fmt(r["L50"]), fmt(r["L95"]), fmt(r["viewer_stall_pct"], 2)]
         for r in tables["interactive"] if r["load"] == "high"])
