"""``latsim plan``: search the deployment space (docs/plan.md).

Only typer is imported at module level; the search loads inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import JobsOpt, MaxSimEventsOpt, SchedulerOpt, scheduler_context
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import DEFAULT_MAX_EVENTS
from latsim.formatting import fmt as _fmt

#: The run folder's tables.
CANDIDATES_CSV = "candidates.csv"
PLAN_JSON = "plan.json"
FRONTIER_PNG = "frontier.png"
#: What plan.json says it is (its ``format``): how a later plan tells its own folder.
PLAN_FORMAT = "latsim-plan"


def plan(
    deployment_file: Annotated[Path, typer.Argument(
        help="the deployment (TOML): a fleet file plus \\[search] and \\[slo]; "
        "docs/plan.md")],
    out: Annotated[Path | None, typer.Option(
        help="write candidates.csv, plan.json and frontier.png here")] = None,
    seeds: Annotated[int | None, typer.Option(
        help="replications of each exact run (default: run.seeds)")] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
) -> None:
    """Which K, policy, USP degree, node shape and fleet size meet an SLO most cheaply.

    A surrogate (closed forms, no simulation) screens every candidate; the exact fleet
    model verifies the Pareto frontier of cost, L95 and K (or search.quality) and each
    policy's recommendation, which always meets the SLO in its exact run."""
    from dataclasses import replace

    from latsim.cli.progress import ProgressBar
    from latsim.experiments.deployment import load_deployment, plan_deployment
    from latsim.model.fleet import override
    from latsim.run.files import check_writable

    output = output_format(fmt, as_json)
    deployment = load_deployment(deployment_file)
    if seeds is not None:
        deployment = replace(deployment, base=override(deployment.base, seeds=seeds))
    if out is not None:
        from latsim.run.folder import claim_folder, of_format

        claim_folder(out, (CANDIDATES_CSV, PLAN_JSON, FRONTIER_PNG), PLAN_JSON,
                     "latsim plan", of_format(PLAN_FORMAT))
        check_writable(out)
    # a bar with an ETA on a terminal; off one, a line per exact run beside a table
    with (scheduler_context(scheduler, jobs, local_pool=True),
          ProgressBar("plan", plain=output == "table") as bar):
        result = plan_deployment(deployment, max_events, bar.status)
    rows = result.rows
    if out is not None:
        _write_folder(out, deployment_file, deployment, result)

    def table() -> None:
        from latsim.cli.tables import Column, print_table

        shown = ([i for i, row in enumerate(rows) if row["role"] or "exact_verdict" in row]
                 or list(range(len(rows))))
        slo = deployment.slo
        limits = f"L95 <= {slo.l95:g} s, stall <= {slo.stall_pct:g}%" + (
            f", TTFC p95 <= {slo.ttfc_p95:g} s" if slo.ttfc_p95 is not None else "")
        autoscaled = bool(deployment.space.autoscale)
        columns = [Column("K", 0), Column("policy", 0, "left"), Column("usp", 0),
                   Column("GPUs/node", 2), Column("n/node", 1), Column("nodes", 0),
                   *([Column("scaled", 1)] if autoscaled else []),
                   Column("$/viewer-h", 0), Column("L95", 0), Column("exact", 0, "left"),
                   Column("role", 3, "left")]
        body = []
        for i in shown:
            row = rows[i]
            exact = row.get("exact_verdict")
            target = row.get("target_util")
            body.append([
                str(row["K"]), row["policy"], str(row["usp"]), str(row["gpus_per_node"]),
                str(row["sessions_per_node"]), _fmt(row["nodes"], 0),
                *([("-" if target is None else f"to {target:g}")] if autoscaled else []),
                _fmt(row.get("exact_cost_per_viewer_hour", row["cost_per_viewer_hour"]), 3),
                _fmt(row.get("exact_L95", row["L95"]), 3),
                "-" if exact is None else _verdict(row),
                row["role"]])
        screened = sum(row["verdict"] == "meets" for row in rows)
        verified = sum("exact_verdict" in row for row in rows)
        print_table(f"plan {deployment_file.name}: {limits}", columns, body, [
            f"[dim]{len(rows)} candidates, {screened} pass the surrogate, {verified} run "
            f"exactly ({_runs(deployment)}); $ and L95 are the exact "
            "run's where there is one" + ("; scaled: autoscaled from one node up to "
                                          "nodes, to that target utilisation"
                                          if autoscaled else "") + "[/dim]",
            result.comparison])

    emit(output, rows, table, seed=deployment.base.seed, comparison=result.comparison,
         frontier=result.frontier, recommended=result.recommended,
         slo=deployment.describe()["slo"], out=None if out is None else str(out))


def _write_folder(out: Path, source: Path, deployment, result) -> None:
    from latsim.run.files import dumps, write_rows_csv
    from latsim.viz.plan import draw_frontier
    from latsim.writing import replacing

    out.mkdir(parents=True, exist_ok=True)
    write_rows_csv(out / CANDIDATES_CSV, result.rows)
    with replacing(out / PLAN_JSON) as tmp:
        tmp.write_text(dumps({
            "format": PLAN_FORMAT, "version": 1, "source": str(source),
            "comparison": result.comparison, "frontier": result.frontier,
            "recommended": result.recommended, "fleet": deployment.base.describe(),
            **deployment.describe()}))
    draw_frontier(result.rows, result.frontier, out / FRONTIER_PNG,
                  "quality" if deployment.space.quality else "K")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("plan")(plan)


def _verdict(row: dict) -> str:
    """An exact run's verdict and the limits that decided it: ``fails (stall_pct)``,
    ``undecided (blocking)``."""
    which = row["exact_failed"] or row.get("exact_undecided", "")
    return row["exact_verdict"] + (f" ({which})" if which else "")


def _runs(deployment) -> str:
    """How the exact runs ran: replications, measured seconds and the warm-up before."""
    run = deployment.base
    return (f"{run.seeds} replication(s) of {run.duration:g} s"
            + (f" after a {run.warmup:g} s warm-up" if run.warmup else " from empty"))
