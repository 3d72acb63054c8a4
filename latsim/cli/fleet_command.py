"""``latsim fleet``: sessions that come and go across nodes (DESIGN §8), from a fleet file;
``latsim fleet plan``: the smallest fleet that meets an SLO, per commitment policy.

``latsim fleet FILE`` is ``latsim fleet run FILE``. Only typer is imported at module level;
the simulation loads inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from latsim.cli.completion import plugins
from latsim.cli.options import JobsOpt, MaxSimEventsOpt, SchedulerOpt, scheduler_context
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError
from latsim.formatting import fit
from latsim.formatting import fmt as _fmt

#: The table's rows: (key, label, digits).
SHOWN = (
    ("sessions_arrived", "sessions arrived", 1), ("sessions_admitted", "admitted", 1),
    ("sessions_rejected", "rejected", 1), ("blocking", "blocking (rejected / arrived)", 4),
    ("wait_mean", "admission wait mean (s)", 3), ("n_sessions_mean", "sessions present", 2),
    ("n_active_mean", "segments playing", 2), ("n_nodes_mean", "nodes", 2),
    ("util_pct", "slots held (%)", 1), ("ttfc_mean", "TTFC mean (s)", 3),
    ("ttfc_p95", "TTFC p95 (s)", 3), ("L50", "condition L50 (s)", 3),
    ("L95", "condition L95 (s)", 3), ("L99", "condition L99 (s)", 3),
    ("stall_pct", "viewer stall (%)", 3), ("chunk_p99", "per-chunk latency p99 (s)", 3),
    ("chunk_max", "worst per-chunk latency (s)", 3), ("gpu_hours", "GPU-hours", 3),
    ("cost_usd", "cost (USD)", 2), ("cost_per_viewer_hour", "USD per viewer-hour", 3),
)


def fleet(
    fleet_file: Annotated[Path, typer.Argument(help="the fleet (TOML): \\[workload], \\[node], "
                                               "\\[fleet], \\[run]; docs/fleet.md")],
    out: Annotated[Path | None, typer.Option(help="write the run folder here: fleet.json, "
                                             "summary.json, runs/timeseries/nodes/sessions "
                                             ".csv, fleet.png")] = None,
    seeds: Annotated[int | None, typer.Option(help="replications (default: run.seeds)")] = None,
    seed: Annotated[int | None, typer.Option(help="root seed (default: run.seed)")] = None,
    nodes: Annotated[int | None, typer.Option(
        help="a static fleet of N nodes (nodes_initial = nodes_max = N, no autoscaling)")
    ] = None,
    placement: Annotated[str | None, typer.Option(
        help="placement policy (latsim plugins placements)",
        autocompletion=plugins("placements"))] = None,
    autoscale: Annotated[str | None, typer.Option(help="on or off (default: the file's)")
                         ] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
) -> None:
    """Simulate a fleet of serving nodes under admission, placement and autoscaling.

    Sessions arrive, are placed on nodes (each a serving model), play, idle and leave.
    Prints the metrics pooled over the replications (mean ± standard error)."""
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
                f"of {row['duration']:g} s; lead {row['lead']:.3g} s ({row['lead_rule']})"
                "[/dim]")
        notes = [note]
        if row["lead_rule"].startswith("auto") and row["full_node_rho"] >= 1:
            notes.append(f"a full node's busiest device is at ρ = {row['full_node_rho']:.2f} "
                         "from refills alone: no lead keeps the stall target there; lower "
                         "node.max_sessions or add devices")
        if not row["viewer_hours"]:
            notes.append("no session saw a frame: stall %, L and cost per viewer-hour are "
                         "undefined (–), and blocking counts only the sessions turned away")
        print_table(title, [Column("metric", 0, "left"), Column("mean", 0), Column("± se", 1)],
                    [[label, _fmt(row[key], digits), _fmt(row[f"{key}_se"], digits)]
                     for key, label, digits in SHOWN if key in row], notes)
        if out is not None:
            typer.echo(fit(f"wrote {out}/ (fleet.json, summary.json, runs.csv, "
                           "timeseries.csv, nodes.csv, sessions.csv, fleet.png)"))

    emit(output, [row], table, seed=run.seed,
         runs=[{"run": r.replication, **r.metrics} for r in results],
         config=run.describe(), out=None if out is None else str(out))


class _RunByDefault(TyperGroup):
    """A group whose first argument, when it names no command, is the file of ``run``."""

    def parse_args(self, ctx, args):  # click's signature
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def plan(
    fleet_file: Annotated[Path, typer.Argument(help="the fleet (TOML); docs/fleet.md")],
    slo_l95: Annotated[float, typer.Option(help="condition L95 limit (s)")],
    slo_stall: Annotated[float, typer.Option(help="viewer stall limit (%)")],
    slo_ttfc: Annotated[float | None, typer.Option(
        help="p95 time-to-first-chunk limit (s)")] = None,
    policies: Annotated[str, typer.Option(
        help="commitment policies side by side, comma-separated")] = "baseline,speculative",
    max_nodes: Annotated[int, typer.Option(help="the most nodes to try")] = 64,
    seeds: Annotated[int | None, typer.Option(help="replications per configuration "
                                              "(default: run.seeds)")] = None,
    out: Annotated[Path | None, typer.Option(
        help="write plan.csv, tried.csv and fleet_plan.json here")] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
) -> None:
    """Size a fleet: the smallest one meeting an SLO, per commitment policy.

    The smallest static fleet, and the cheapest autoscaling setting of a small grid, with
    GPU-hours and cost per viewer-hour. Meeting the SLO: each metric's one-sided 95 % upper
    bound over the replications is within its limit. The static search doubles the nodes,
    then bisects. Poisson or MMPP arrivals are measured in steady state, after run.warmup
    or else the ramp from empty to 99 % of the sessions present."""
    from dataclasses import replace

    from latsim.experiments.fleet_plan import UPPER_Z, FleetSLO, plan_fleet_size
    from latsim.model.fleet import load_fleet, override
    from latsim.run.files import check_writable

    output = output_format(fmt, as_json)
    slo = FleetSLO(slo_l95, slo_stall, slo_ttfc)
    run = override(load_fleet(fleet_file), seeds=seeds)
    if run.warmup == 0:  # measure the steady state, as latsim plan does
        run = replace(run, warmup=run.workload.steady_warmup())
    chosen = tuple(p.strip() for p in policies.split(","))
    if not all(chosen) or len(set(chosen)) != len(chosen):
        raise LatsimError(f"--policies {policies[:60]!r}: give each policy once, "
                          "comma-separated (baseline, speculative)")
    if out is not None:
        from latsim.run.folder import claim_folder, of_format

        claim_folder(out, PLAN_FILES, PLAN_RECORD, "latsim fleet plan",
                     of_format(PLAN_FORMAT))
        check_writable(out)

    from latsim.formatting import StatusLine

    with scheduler_context(scheduler, jobs, local_pool=True), StatusLine(plain=True) as say:
        rows, tried = plan_fleet_size(run, slo, chosen, max_nodes, max_events,
                                      say if output == "table" else None)
    if out is not None:
        _write_plan(out, rows, tried, {"format": PLAN_FORMAT, "fleet": str(fleet_file),
                                       "slo": slo.limits(), "policies": list(chosen),
                                       "warmup": run.warmup})

    def table() -> None:
        from latsim.cli.tables import Column, print_table

        shown = (("nodes_static", "static nodes", 0), ("static_gpu_hours", "static GPU-h", 3),
                 ("static_cost_per_viewer_hour", "static $/viewer-h", 3),
                 ("static_L95", "static L95", 3),
                 ("static_stall_pct", "static stall %", 3),
                 ("static_ttfc_p95", "static TTFC p95", 2),
                 ("autoscaled_target_util", "autoscale target", 2),
                 ("autoscaled_gpu_hours", "autoscaled GPU-h", 3),
                 ("autoscaled_cost_per_viewer_hour", "autoscaled $/viewer-h", 3),
                 ("autoscaled_ttfc_p95", "autoscaled TTFC p95", 2),
                 ("static_w", "w", 3))
        missed = [f"{r['policy']}: {what}: {r[key]}" for r in rows
                  for key, what in (("static_missed", "no static fleet"),
                                    ("autoscaled_missed", "no autoscaling setting"))
                  if r.get(key)]
        print_table(f"fleet plan {fleet_file.name}",
                    [Column("metric", 0, "left"), *(Column(r["policy"]) for r in rows)],
                    [[label, *(_fmt(r[key], digits) for r in rows)]
                     for key, label, digits in shown],
                    [f"SLO: L95 <= {slo_l95:g} s, stall <= {slo_stall:g} %"
                     + (f", TTFC p95 <= {slo_ttfc:g} s" if slo_ttfc else "")
                     + f" (each + {UPPER_Z} standard errors)", *missed,
                     f"[dim]{len(tried)} configuration(s) tried, {run.seeds} replication(s) "
                     f"of {run.duration:g} s each"
                     + (f" after a {run.warmup:g} s warm-up" if run.warmup else "")
                     + "; -: none meets the SLO[/dim]"])

    emit(output, rows, table, seed=run.seed, tried=tried, slo=slo.limits(),
         warmup=run.warmup, out=None if out is None else str(out))


#: ``fleet plan --out``'s record of the plan: what it sized, and its ``status``; written
#: with plan.csv and tried.csv, all three or none, so another command's files are told
#: from its own (:func:`latsim.run.folder.claim_folder`).
PLAN_RECORD = "fleet_plan.json"
PLAN_FORMAT = "latsim-fleet-plan"
PLAN_FILES = (PLAN_RECORD, "plan.csv", "tried.csv")


def _write_plan(out: Path, rows: list[dict], tried: list[dict], about: dict) -> None:
    """plan.csv, tried.csv and :data:`PLAN_RECORD` (saying ``complete``), all three or
    none (:func:`latsim.writing.staged`): a full disk left plan.csv alone, looking like a
    finished plan."""
    from latsim.run.files import write_rows_csv
    from latsim.run.folder import write_json
    from latsim.run.stream import COMPLETE
    from latsim.writing import staged

    with staged(out) as staging:
        write_rows_csv(staging / "plan.csv", rows)
        write_rows_csv(staging / "tried.csv", tried)
        write_json(staging / PLAN_RECORD, {**about, "status": COMPLETE})


fleet_app = typer.Typer(cls=_RunByDefault, no_args_is_help=True,
                        help="Sessions across nodes: latsim fleet FILE (the same as latsim "
                        "fleet run FILE) simulates a fleet; latsim fleet plan FILE sizes one.")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    fleet_app.command("run")(fleet)
    fleet_app.command("plan")(plan)
    app.add_typer(fleet_app, name="fleet")
