"""``latsim fleet``: sessions that come and go across nodes (DESIGN §8), from a fleet file.

Only typer is imported at module level; the simulation loads inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import JobsOpt, MaxSimEventsOpt, SchedulerOpt, scheduler_context
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError
from latsim.formatting import fmt as _fmt

#: The table's rows: (key, label, digits).
SHOWN = (
    ("sessions_arrived", "sessions arrived", 1), ("sessions_admitted", "admitted", 1),
    ("sessions_rejected", "rejected", 1), ("blocking", "blocking (rejected / arrived)", 4),
    ("wait_mean", "admission wait mean (s)", 3), ("sessions_mean", "sessions present", 2),
    ("active_mean", "segments playing", 2), ("nodes_mean", "nodes", 2),
    ("util_pct", "slots held (%)", 1), ("ttfc_mean", "TTFC mean (s)", 3),
    ("ttfc_p95", "TTFC p95 (s)", 3), ("L50", "condition L50 (s)", 3),
    ("L95", "condition L95 (s)", 3), ("L99", "condition L99 (s)", 3),
    ("stall_pct", "viewer stall (%)", 3), ("chunk_p99", "per-chunk latency p99 (s)", 3),
    ("chunk_max", "worst per-chunk latency (s)", 3), ("gpu_hours", "GPU-hours", 3),
    ("cost_usd", "cost (USD)", 2), ("cost_per_viewer_hour", "USD per viewer-hour", 3),
)


def fleet(
    fleet_file: Annotated[Path, typer.Argument(help="the fleet (TOML): [workload], [node], "
                                               "[fleet], [run]; docs/fleet.md")],
    out: Annotated[Path | None, typer.Option(help="write the run folder here: fleet.json, "
                                             "summary.json, runs/timeseries/nodes/sessions "
                                             ".csv, fleet.png")] = None,
    seeds: Annotated[int | None, typer.Option(help="replications (default: run.seeds)")] = None,
    seed: Annotated[int | None, typer.Option(help="root seed (default: run.seed)")] = None,
    nodes: Annotated[int | None, typer.Option(
        help="a static fleet of N nodes (nodes_initial = nodes_max = N, no autoscaling)")
    ] = None,
    placement: Annotated[str | None, typer.Option(
        help="placement policy (latsim plugins placements)")] = None,
    autoscale: Annotated[str | None, typer.Option(help="on or off (default: the file's)")
                         ] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
) -> None:
    """Simulate a fleet: sessions arrive, are placed on nodes (each a serving model),
    play and idle and leave, under admission, placement and autoscaling.

    Exact mode: the control plane and every node on one clock. Prints the metrics pooled
    over the replications (mean ± standard error)."""
    from latsim.cli.progress import ProgressBar
    from latsim.experiments.fleet import FleetFolder, plan_fleet, pooled_row, run_fleet
    from latsim.model.fleet import load_fleet, override
    from latsim.run.files import check_writable

    output = output_format(fmt, as_json)
    if autoscale not in (None, "on", "off"):
        raise LatsimError(f"--autoscale must be on or off, got {autoscale!r}")
    run = override(load_fleet(fleet_file), nodes=nodes, placement=placement,
                   autoscale=None if autoscale is None else autoscale == "on", seeds=seeds,
                   seed=seed)
    fp = plan_fleet(run, max_events)  # bad input and the work bound fail before any output
    if out is not None:
        check_writable(out)
    folder = FleetFolder(out, fp) if out is not None else None
    try:
        with (scheduler_context(scheduler, jobs, local_pool=True),
              ProgressBar("fleet (replications)") as progress):
            results = run_fleet(fp, progress=progress,
                                done=None if folder is None else folder.add)
    except Interrupted as exc:
        if folder is not None:
            folder.finish("interrupted")
            raise Interrupted(f"{exc}; kept in {out}/ (status interrupted)") from None
        raise
    row = pooled_row(fp, results)
    if folder is not None:
        from latsim.viz.fleet import plot_fleet

        folder.finish()
        plot_fleet(results[0].timeseries, row, out / "fleet.png")  # type: ignore[operator]

    def table() -> None:
        from latsim.cli.tables import Column, print_table

        title = f"fleet {fleet_file.name}: {row['policy']} K={row['K']}, {row['cost']}"
        note = (f"[dim]{row['arrivals']}, {row['placement']} placement, admission "
                f"{row['admission']}, nodes {row['nodes_initial']}..{row['nodes_max']}"
                f"{' autoscaled' if row['autoscale'] else ''}, {row['max_sessions']} "
                f"sessions/node; mean ± standard error over {row['n_runs']} replication(s) "
                f"of {row['duration']:g} s[/dim]")
        print_table(title, [Column("metric", 0, "left"), Column("mean", 0), Column("± se", 1)],
                    [[label, _fmt(row[key], digits), _fmt(row[f"{key}_se"], digits)]
                     for key, label, digits in SHOWN if key in row], [note])
        if out is not None:
            typer.echo(f"wrote {out}/ (fleet.json, summary.json, runs.csv, timeseries.csv, "
                       "nodes.csv, sessions.csv, fleet.png)")

    emit(output, [row], table, seed=run.seed,
         runs=[{"run": r.replication, **r.metrics} for r in results],
         config=run.describe(), out=None if out is None else str(out))


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("fleet")(fleet)
