"""``latsim compare``: measured vs predicted (registered on the main app).

Only typer is imported at module level; the analysis loads inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import MaxSimEventsOpt
from latsim.cli.output import FormatOpt, JsonOpt, claims, emit, envelope, output_format
from latsim.errors import DEFAULT_MAX_EVENTS
from latsim.formatting import fmt as _fmt

SeedOpt = Annotated[int, typer.Option(help="root seed of all random draws")]


def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="run folders, or folders of them")],
    replications: Annotated[
        int, typer.Option(help="simulations per run, each with new C draws")
    ] = 20,
    seed: SeedOpt = 0,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[
        Path | None, typer.Option(help="write compare.csv/.json and figures (default: none)")
    ] = None,
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
) -> None:
    """Measured vs predicted: re-simulate each run with its own measured C samples.

    A partial run (interrupted, failed, or left incomplete by a killed writer) is compared
    over the window its records cover and left out of the overall MAPE; folders that are not
    single runs are skipped. Both are listed on stderr and in compare.json.
    """
    from latsim.analysis.compare import COMPARED, compare_runs
    from latsim.analysis.viewer_compare import client_runs, compare_client_runs
    from latsim.errors import MAX_SEED, check_int
    from latsim.run.files import write_rows_csv
    from latsim.run.folder import write_json

    output = output_format(fmt, as_json)
    check_int("--seed", seed, 0, MAX_SEED)
    if out is not None:  # never over another's files, whichever comparison this is
        claims("compare", out, COMPARE_FILES, "compare.json")
        claims("compare", out, VIEWER_FILES, "compare_viewer.json")
    clients = client_runs(list(run_dirs))
    result = compare_runs(list(run_dirs), replications=replications, seed=seed,
                          allow_empty=bool(clients), max_events=max_events)
    if not result.rows:
        _compare_viewer(compare_client_runs(clients, replications, seed), output, out, seed)
        return
    for skipped in result.skipped:
        typer.echo(f"latsim: skipped {skipped['path']}: {skipped['reason']}", err=True)
    for row in result.rows:
        if row["notes"]:
            typer.echo(f"latsim: {'warning' if row['status'] != 'complete' else 'note'}: "
                       f"{row['run']}: {row['notes']}", err=True)
    beside = {key: value for key, value in result.payload().items() if key != "rows"}
    viewer = compare_client_runs(clients, replications, seed) if clients else None
    if out is not None:
        from latsim.viz.plots import plot_compare_cdf, plot_compare_overlay
        from latsim.writing import staged

        with staged(out) as files:  # the four land together, or none (a full disk)
            write_json(files / "compare.json", envelope(result.rows, seed, **beside))
            write_rows_csv(files / "compare.csv", result.rows)
            plot_compare_cdf(result, files / "compare_cdf.png")
            plot_compare_overlay(result, files / "compare_overlay.png")
    if output != "table":
        if viewer is not None:  # the viewer side is written, and printed beside the runs
            beside["viewer"] = _viewer_payload(_compare_viewer(viewer, "none", out, seed))
        emit(output, result.rows, lambda: None, seed, **beside)
        return
    from rich.console import Console

    from latsim.cli.tables import Column, print_table, table_width

    stacked = table_width() < 200  # measured, predicted and error on three lines
    ranks = {"L50": 1, "L95": 1, "stall_pct": 2, "L_mean": 3, "busy_pct": 3, "w": 4,
             "dit_calls": 5}
    rows = []
    for row in result.rows:
        cells = []
        for metric in COMPARED:
            digits = 0 if metric == "dit_calls" else (2 if metric.endswith("pct") else 3)
            err = row[f"{metric}_err_pct"]
            cells.append(_pair(_fmt(row[f"{metric}_measured"], digits),
                               _fmt(row[f"{metric}_predicted"], digits),
                               f"{err:+.1f}%" if err is not None else "", stacked))
        status = row["status"]
        if status != "complete":
            status += f"\n[0, {row['window_s']:.1f}] s"
        rows.append([row["run"], status, *cells, _fmt(row["MAPE"], 1)])
    print_table("measured / predicted (error %)",
                [Column("run", 0, "left"), Column("status", 0, "left"),
                 *(Column(metric, ranks.get(metric, 5)) for metric in COMPARED),
                 Column("MAPE", 0)], rows, _legend(stacked))
    console = Console(width=min(table_width(), 200), highlight=False)
    console.print(f"overall MAPE: {_fmt(result.mape, 2)} % over {len(result.mape_runs)} "
                  f"run(s), {result.mape_over}: {', '.join(result.mape_runs)}")
    if len(result.mape_runs) < len(result.rows):
        console.print(f"over all {len(result.rows)} compared runs, each over its own window: "
                      f"{_fmt(result.mape_all, 2)} %")
    console.print("stall % compared in points: "
                  + ", ".join(f"{r['run']} {_fmt(r['stall_pct_abs_err'], 2)}"
                              for r in result.rows)
                  + f"; busy % on the {', '.join(sorted({r['busy_basis'] for r in result.rows}))}"
                  " view of each job on both sides")
    if result.skipped:
        console.print(f"skipped {len(result.skipped)}: "
                      + "; ".join(f"{s['path']} ({s['reason']})" for s in result.skipped))
    if out is not None:
        console.print(f"wrote {out}/ (compare.json, compare.csv, compare_cdf.png, "
                      "compare_overlay.png)")
    if viewer is not None:
        _compare_viewer(viewer, "table", out, seed)


def _viewer_payload(envelope_of_viewer: dict) -> dict:
    return {key: envelope_of_viewer[key] for key in ("rows", "MAPE", "MAPE_over")}


#: What compare's own files are called, for runs and for client runs.
COMPARE_FILES = ("compare.json", "compare.csv", "compare_cdf.png", "compare_overlay.png")
VIEWER_FILES = ("compare_viewer.json", "compare_viewer.csv", "compare_viewer_cdf.png")


def _compare_viewer(comparison, output: str, out: Path | None, seed: int) -> dict:
    """The viewer-side table: client runs (``latsim client``) against the serving model,
    printed in ``output`` (``none``: not printed); returns its envelope."""
    from latsim.analysis.fidelity import mape
    from latsim.analysis.viewer_compare import VIEWER_COMPARED
    from latsim.run.files import write_rows_csv
    from latsim.run.folder import write_json

    rows = comparison.rows

    overall = mape(row[f"{m}_err_pct"] for row in rows for m in VIEWER_COMPARED
                   if row["status"] == "complete")
    payload = envelope(rows, seed, MAPE=overall, MAPE_over="complete client runs")
    if out is not None:
        from latsim.viz.plots import plot_viewer_cdf
        from latsim.writing import staged

        with staged(out) as files:  # the three land together, or none (a full disk)
            write_json(files / "compare_viewer.json", payload)
            write_rows_csv(files / "compare_viewer.csv", rows)
            plot_viewer_cdf(comparison, files / "compare_viewer_cdf.png")
    if output == "none":
        return payload
    if output != "table":
        emit(output, rows, lambda: None, seed, MAPE=overall, MAPE_over="complete client runs")
        return payload
    for row in rows:
        if row["notes"]:
            typer.echo(f"latsim: warning: {row['run']}: {row['notes']}", err=True)
    from rich.console import Console

    from latsim.cli.tables import Column, print_table, table_width

    stacked = table_width() < 200
    table_rows = []
    for row in rows:
        cells = []
        for metric in VIEWER_COMPARED:
            pct = metric.endswith("pct")
            digits = 2 if pct else 3
            tail = (f"{row['viewer_stall_pct_abs_err']:+.2f} pp" if pct
                    else f"{row[f'{metric}_err_pct']:+.1f}%"
                    if row[f"{metric}_err_pct"] is not None else "")
            cells.append(_pair(_fmt(row[f"{metric}_measured"], digits),
                               _fmt(row[f"{metric}_predicted"], digits), tail, stacked))
        table_rows.append([row["run"], row["status"], *cells, _fmt(row["MAPE"], 1)])
    print_table("viewer side (client runs): measured / predicted (error %)",
                [Column("run", 0, "left"), Column("status", 0, "left"),
                 *(Column(metric, 1 + i) for i, metric in enumerate(VIEWER_COMPARED)),
                 Column("MAPE", 0)], table_rows, _legend(stacked))
    console = Console(width=min(table_width(), 200), highlight=False)
    console.print(f"overall MAPE (complete client runs): {_fmt(overall, 2)} %; "
                  "uplink/deliver/C drawn from each run's own measurements")
    refreshed = [row for row in rows if row.get("display_phase") is not None]
    if refreshed:
        console.print(
            "browser sessions, each frame on screen at the display's next refresh (phase "
            "fitted to the slots that first showed no condition; step measured / predicted): "
            + "; ".join(
                f"{row['run']} period {1e3 * row['display_period']:.3f} ms "
                f"({row['display_period_source']}), step "
                f"{_fmt(_ms(row['display_step_measured']), 2)} / "
                f"{_fmt(_ms(row['display_step_predicted']), 2)} ms" for row in refreshed))
    if out is not None:
        console.print(f"wrote {out}/ (compare_viewer.json, compare_viewer.csv, "
                      "compare_viewer_cdf.png)")
    return payload


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def _pair(measured: str, predicted: str, error: str, stacked: bool) -> str:
    """One compared metric's cell: ``measured / predicted (error)`` on one line, or on
    three (a table that fits 80 columns)."""
    if stacked:
        return "\n".join(part for part in (measured, predicted, error) if part)
    return f"{measured} / {predicted}" + (f" ({error})" if error else "")


def _legend(stacked: bool) -> tuple[str, ...]:
    return ("[dim]each cell: measured, predicted, error (top to bottom)[/dim]",) if stacked \
        else ()


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("compare")(compare)
