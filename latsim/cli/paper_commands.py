"""CLI commands for traces, paper reproduction and figures (registered on the main app).

``latsim traces generate|validate|show``, ``latsim reproduce`` and ``latsim plot timeline``.
Only typer is imported at module level; everything else is imported inside the commands so
that ``latsim --help`` stays fast.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import JobsOpt, SchedulerOpt, scheduler_context
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRACE_EVENTS, LatsimError
from latsim.formatting import fit
from latsim.writing import staged

traces_app = typer.Typer(
    help="Condition traces: generate the paper's workload, validate and summarise sets.",
    no_args_is_help=True,
)
plot_app = typer.Typer(help="Figures drawn from a run folder's CSV records.",
                       no_args_is_help=True)

MaxEventsOpt = Annotated[
    int, typer.Option(help="work bound: conditions per trace file read (checked as it is read)")
]


def _trace_paths(path: Path) -> list[Path]:
    from latsim.model.traces import trace_files

    if path.is_dir():
        return trace_files(path)
    if not path.exists():
        raise LatsimError(f"{path}: no such file or folder")
    return [path]


@traces_app.command("generate")
def traces_generate(
    kind: Annotated[str, typer.Option(help="low (1-2 updates per trace), high (3-11 per "
                                       "trace) or continuous (1-4 Hz bursts)")],
    out: Annotated[Path, typer.Option(help="folder to write <kind>_NNN.jsonl into")],
    count: Annotated[int, typer.Option(help="number of traces")] = 30,
    duration: Annotated[float, typer.Option(help="seconds per trace")] = 60.0,
    seed: Annotated[int, typer.Option(help="root seed (trace i uses child i)")] = 0,
    max_events: Annotated[
        int, typer.Option(help="work bound: the most conditions the set may hold "
                          "(checked before drawing)")
    ] = DEFAULT_MAX_TRACE_EVENTS,
) -> None:
    """Generate a deterministic set of traces (same kind, count, duration, seed: same bytes)."""
    from latsim.experiments.tracegen import COUNT_RANGES, generate_set, write_set

    paths = write_set(generate_set(kind, count, duration, seed, max_events), out)
    rate = ""
    if kind in COUNT_RANGES:  # a count per trace, whatever its length: say the rate it makes
        low, high = COUNT_RANGES[kind]
        rate = (f" ({low}-{high} updates per {duration:g} s trace: {60 * low / duration:.3g}-"
                f"{60 * high / duration:.3g} per minute; the paper's sets are 60 s)")
    typer.echo(fit(f"wrote {len(paths)} {kind} traces to {out}/{rate}"))


@traces_app.command("validate")
def traces_validate(
    path: Annotated[Path, typer.Argument(help="a trace file or a folder of *.jsonl")],
    max_events: MaxEventsOpt = DEFAULT_MAX_TRACE_EVENTS,
) -> None:
    """Check traces; print every problem as file:line and exit 1 if there is any."""
    from latsim.errors import check_int
    from latsim.model.traces import validate_trace

    check_int("--max-events", max_events, 1, 10**12)
    files = _trace_paths(path)
    problems = [p for f in files for p in validate_trace(f, max_events)]
    for problem in problems:
        typer.echo(problem)
    if problems:
        bad = len({p.split(":", 1)[0] for p in problems})
        typer.echo(f"latsim: {len(problems)} problem(s) in {bad} of {len(files)} trace(s)",
                   err=True)
        raise typer.Exit(1)
    typer.echo(f"ok: {len(files)} trace(s) valid")


@traces_app.command("show")
def traces_show(
    path: Annotated[Path, typer.Argument(help="a trace file or a folder of *.jsonl")],
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    max_events: MaxEventsOpt = DEFAULT_MAX_TRACE_EVENTS,
) -> None:
    """Summarise a set: count, updates per trace (min/mean/max), inter-arrival statistics."""
    from dataclasses import asdict

    from latsim.errors import check_int
    from latsim.experiments.tracegen import summarize_set
    from latsim.model.traces import load_trace

    output = output_format(fmt, as_json)
    check_int("--max-events", max_events, 1, 10**12)
    loaded = [load_trace(f, max_events) for f in _trace_paths(path)]
    summary = summarize_set([t.times for t in loaded], [t.duration for t in loaded])
    if output != "table":
        emit(output, [asdict(summary)], lambda: None, path=str(path))
        return

    def f(x: float | None, digits: int = 3) -> str:
        return "–" if x is None else f"{x:.{digits}f}"

    typer.echo(f"{path}: {summary.count} trace(s), window {f(summary.duration_max, 1)} s")
    typer.echo(f"updates per trace: min {summary.updates_min}, mean "
               f"{summary.updates_mean:.2f}, max {summary.updates_max} "
               f"({f(summary.rate_per_min, 2)} per minute)")
    if not summary.gap_n:
        typer.echo("inter-arrival: none (no trace has two updates)")
        return
    typer.echo(f"inter-arrival (s, n={summary.gap_n}): min {f(summary.gap_min)}, mean "
               f"{f(summary.gap_mean)}, median {f(summary.gap_median)},")
    typer.echo(f"  p95 {f(summary.gap_p95)}, max {f(summary.gap_max)}, "
               f"CV {f(summary.gap_cv, 2)}")


#: What each reproduction writes into its --out, besides :data:`REPRODUCE_RECORD`.
REPRODUCTIONS: dict[str, tuple[str, ...]] = {
    "paper": ("settings.csv", "eq6.csv", "amplification.csv", "stall.csv", "l50.csv",
              "long_minus_short.csv", "reproduce.png"),
    "serving": ("e2e.csv", "headroom.csv", "discard.csv", "schedule.csv", "lead.csv",
                "serving.png"),
    "systems": ("reproduction.csv", "interactive.csv", "systems.png"),
    "fleet": ("sharded_vs_exact.csv", "diurnal.csv", "policy.csv", "diurnal_curve.csv",
              "fleet.png"),
    "replan-rule": ("replan_rule.csv",),
}
#: Written beside a reproduction's files, naming it: running it again into its folder
#: replaces what it wrote there, and nothing another wrote (claim_folder).
REPRODUCE_RECORD = "reproduce.json"
_FORMAT = "latsim-reproduce"


def _what(name: str) -> str:
    return "latsim reproduce" if name == "paper" else f"latsim reproduce {name}"


def claim_reproduction(out: Path, name: str) -> None:
    """Before any work: check ``out`` can be written, and refuse it where reproduction
    ``name`` would replace files it did not write: its own :data:`REPRODUCE_RECORD` must
    be beside them (:func:`latsim.run.folder.claim_folder`)."""
    from latsim.run.files import check_writable
    from latsim.run.folder import claim_folder

    def wrote(record: dict) -> bool:
        return record.get("format") == _FORMAT and record.get("reproduction") == name

    check_writable(out)
    claim_folder(out, (*REPRODUCTIONS[name], REPRODUCE_RECORD), REPRODUCE_RECORD, _what(name),
                 wrote)


def _write_record(folder: Path, name: str) -> None:
    """``REPRODUCE_RECORD`` in ``folder`` (the staging folder: it lands with the files)."""
    from latsim.run.folder import write_json

    write_json(folder / REPRODUCE_RECORD, {"format": _FORMAT, "reproduction": name,
                                           "files": list(REPRODUCTIONS[name])})


TraceSetsOpt = Annotated[
    Path | None,
    typer.Option(help="folder holding low/ and high/ trace sets (default: the repo's "
                 "traces/, regenerated in memory if absent)"),
]

reproduce_app = typer.Typer(
    help="Reproduce the paper's latency results: theory, simulation and the paper side by "
    "side (latsim reproduce -> results/paper/); 'latsim reproduce serving': the serving "
    "model on the paper's settings (-> results/serving/); 'latsim reproduce systems': the "
    "seed systems (-> results/systems/); 'latsim reproduce fleet': fleets (-> results/fleet/); "
    "'latsim reproduce replan-rule': the replan rule's two readings (-> results/replan_rule/).",
    no_args_is_help=False)


@reproduce_app.callback(invoke_without_command=True)
def reproduce(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/paper"),
    traces: TraceSetsOpt = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: Annotated[
        int, typer.Option(help="work bound: events (latent slots and conditions) over all "
                          "the simulations (checked before the first)")
    ] = DEFAULT_MAX_EVENTS,
) -> None:
    """Reproduce the paper's latency results: theory, simulation and the paper side by side."""
    if ctx.invoked_subcommand is not None:
        return
    output = output_format(fmt, as_json)
    from latsim.cli.paper_report import print_report
    from latsim.cli.progress import ProgressBar
    from latsim.experiments import paper
    from latsim.experiments.engine import reporting_progress
    from latsim.viz.paper import plot_reproduction

    claim_reproduction(out, "paper")
    with (scheduler_context(scheduler, jobs, local_pool=True),
          ProgressBar("reproducing (runs)") as bar, reporting_progress(bar)):
        result = paper.reproduce(traces_root=traces, jobs=jobs, max_events=max_events)
    with staged(out) as staging:
        written = paper.write_results(result, staging)
        written.append(plot_reproduction(result, staging / "reproduce.png"))
        _write_record(staging, "paper")

    def table() -> None:
        print_report(result)
        typer.echo(fit(f"wrote {', '.join(p.name for p in written)} to {out}/"))

    tables = paper.as_json(result)
    notes = {"C_methods": tables.pop("C_methods")}
    _emit_tables(output, tables, table, out, **notes)


@reproduce_app.command("serving")
def reproduce_serving(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/serving"),
    traces: TraceSetsOpt = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: Annotated[
        int, typer.Option(help="work bound of each simulation (latent slots and conditions)")
    ] = DEFAULT_MAX_EVENTS,
) -> None:
    """The serving model on the paper's settings: end-to-end L50 cells (one calibrated, the
    rest predicted), long-chunk headroom in streams, and discard-on-ready vs -on-start."""
    from latsim.cli.paper_report import print_serving_report
    from latsim.experiments.serving_paper import reproduce_serving as run
    from latsim.viz.paper import plot_serving

    _report("serving", run, out, traces, jobs, scheduler, max_events, plot_serving,
            print_serving_report, output_format(fmt, as_json), counts_steps=True)


def _report(name: str, run, out: Path, traces: Path | None, jobs: int | None,
            scheduler: str, max_events: int, plot, report, output: str,
            counts_steps: bool = False) -> None:
    """Run reproduction ``name`` on ``scheduler``, draw its figure (``NAME.png``) into
    ``out`` and print the tables (or their JSON). The bar counts runs, or with
    ``counts_steps`` the steps that ``run`` reports to its ``progress`` (every one counted
    before the first run)."""
    from latsim.cli.progress import ProgressBar
    from latsim.experiments.engine import reporting_progress

    figure = f"{name}.png"
    claim_reproduction(out, name)
    with (scheduler_context(scheduler, jobs, local_pool=True),
          ProgressBar("reproducing (steps)" if counts_steps else "reproducing (runs)") as bar,
          contextlib.nullcontext() if counts_steps else reporting_progress(bar),
          staged(out) as staging):
        tables = run(staging, traces_root=traces, jobs=jobs, max_events=max_events,
                     **({"progress": bar} if counts_steps else {}))
        plot(tables, staging / figure)
        _write_record(staging, name)

    def table() -> None:
        report(tables)
        typer.echo(fit(f"wrote {', '.join(f'{name}.csv' for name in tables)}, {figure} "
                       f"to {out}/"))

    _emit_tables(output, tables, table, out)


def _emit_tables(output: str, tables: dict[str, list[dict]], table, out: Path,
                 **extra: object) -> None:
    """A reproduction's result: its first table as the envelope's rows, every table (by
    its CSV file's name) under ``tables``."""
    emit(output, next(iter(tables.values())), table, tables=tables, out=str(out), **extra)


@reproduce_app.command("systems")
def reproduce_systems(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/systems"),
    traces: TraceSetsOpt = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: Annotated[
        int, typer.Option(help="work bound of each simulation (latent slots and conditions)")
    ] = DEFAULT_MAX_EVENTS,
) -> None:
    """The seed systems as generator models: each seed's reported figures beside latsim's
    (fitted or predicted), and their interactive latency on the paper's traces."""
    from latsim.cli.paper_report import print_systems_report
    from latsim.experiments.systems import reproduce_systems as run
    from latsim.viz.paper import plot_systems

    _report("systems", run, out, traces, jobs, scheduler, max_events, plot_systems,
            print_systems_report, output_format(fmt, as_json))


@reproduce_app.command("fleet")
def reproduce_fleet(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/fleet"),
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: Annotated[
        int, typer.Option(help="work bound of each fleet run (latent slots)")
    ] = DEFAULT_MAX_EVENTS,
) -> None:
    """The fleet questions on stated workloads: sharded against exact, a diurnal day
    (static vs autoscaled, round-robin vs min-max) and commitment policy at fleet scale."""
    from latsim.cli.progress import ProgressBar
    from latsim.cli.tables import Column, print_table
    from latsim.experiments.fleet_paper import reproduce_fleet as run
    from latsim.formatting import fmt as cell
    from latsim.viz.fleet import plot_fleet_reproduction

    output = output_format(fmt, as_json)
    claim_reproduction(out, "fleet")
    with scheduler_context(scheduler, jobs, local_pool=True), \
            ProgressBar("reproduce fleet") as bar, staged(out) as staging:
        tables = run(staging, max_events, bar)
        plot_fleet_reproduction(tables, staging / "fleet.png")
        _write_record(staging, "fleet")

    def table() -> None:
        print_table("a compressed diurnal day (5:1 peak to trough)",
                    [Column("fleet", 0, "left"), Column("placement", 0, "left"),
                     Column("GPU-h"), Column("cost %"), Column("worst chunk"),
                     Column("worst %"), Column("L95", 1), Column("TTFC", 2)],
                    [[r["fleet"], r["placement"], cell(r["gpu_hours"], 2),
                      cell(r["cost_usd_vs_static_round_robin_pct"], 1),
                      cell(r["chunk_max"], 3), cell(r["chunk_max_vs_static_round_robin_pct"], 1),
                      cell(r["L95"], 3), cell(r["ttfc_mean"], 2)] for r in tables["diurnal"]],
                    ["[dim]% against the static fleet with round-robin placement[/dim]"])
        print_table("nodes needed at an L95 SLO (stall <= 1 %)",
                    [Column("setting", 0, "left"), Column("L95 SLO"), Column("policy", 0,
                                                                               "left"),
                     Column("nodes"), Column("L95", 1), Column("w", 2), Column("A", 2)],
                    [[r["setting"], cell(r["slo_l95"], 1), r["policy"],
                      cell(r["nodes_needed"]), cell(r["L95"], 3), cell(r["w"], 3),
                      cell(r["A"], 3)] for r in tables["policy"]],
                    ["[dim]nodes –: no fleet of up to 8 nodes meets the SLO[/dim]"])
        typer.echo(fit(f"wrote {', '.join(f'{name}.csv' for name in tables)}, "
                       f"diurnal_curve.csv, fleet.png to {out}/"))

    _emit_tables(output, tables, table, out)


@reproduce_app.command("replan-rule")
def reproduce_replan_rule(
    out: Annotated[Path, typer.Option(help="output folder")] = Path("results/replan_rule"),
    traces: TraceSetsOpt = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    max_events: Annotated[
        int, typer.Option(help="work bound: events (latent slots and conditions) over all "
                          "the simulations (checked before the first)")
    ] = DEFAULT_MAX_EVENTS,
) -> None:
    """The two readings of the replan rule at the cache end (--replan-at-cache-end defer |
    start) for C near T - delta, on the paper's low and high traces."""
    from latsim.cli.progress import ProgressBar
    from latsim.cli.tables import Column, print_table
    from latsim.experiments.engine import reporting_progress
    from latsim.experiments.replan_rule import reproduce_replan_rule as run

    output = output_format(fmt, as_json)
    claim_reproduction(out, "replan-rule")
    with (scheduler_context(scheduler, jobs, local_pool=True),
          ProgressBar("reproducing (runs)") as bar, reporting_progress(bar),
          staged(out) as staging):
        tables = run(staging, traces_root=traces, jobs=jobs, max_events=max_events)
        _write_record(staging, "replan-rule")
    if output != "table":
        _emit_tables(output, tables, lambda: None, out)
        return

    def cell(value: object, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    rows = tables["replan_rule"]
    print_table(
        "speculative policy: replan at the cache end deferred vs started (start - defer)",
        [Column("setting", 0, "left"), Column("C"), Column("load", 0, "left"),
         Column("L defer"), Column("L start", 2), Column("dL", 0), Column("dL se", 0),
         Column("w defer", 1), Column("w start", 1), Column("dA", 3), Column("n", 4)],
        [[r["setting"], cell(r["C"]), r["load"], cell(r["L_mean_defer"]),
          cell(r["L_mean_start"]), cell(r["dL_mean"]), cell(r["dL_mean_se"]),
          cell(r["w_defer"], 4), cell(r["w_start"], 4), cell(r["dA"], 4),
          str(r["n_conditions"])] for r in rows],
        ["[dim]seconds; w and A as fractions; dL's standard error is paired over the traces "
         "(the same traces under both rules)[/dim]"])
    typer.echo(fit(f"wrote replan_rule.csv to {out}/"))


@plot_app.command("timeline")
def plot_timeline(
    run_dir: Annotated[Path, typer.Argument(help="folder with jobs.csv, slots.csv, ...")],
    policy: Annotated[str | None, typer.Option(help="policy to draw (default: first)")] = None,
    K: Annotated[int | None, typer.Option("--K", help="chunk size (default: first)")] = None,
    run: Annotated[int | None, typer.Option(help="run index (default: first)")] = None,
    stream: Annotated[int | None, typer.Option(
        help="stream of a serving folder (default: the first)")] = None,
    t0: Annotated[float | None, typer.Option(help="window start (s)")] = None,
    t1: Annotated[float | None, typer.Option(help="window end (s)")] = None,
    out: Annotated[Path | None, typer.Option(help="PNG path (default RUN_DIR/timeline.png)")]
    = None,
) -> None:
    """Draw generator jobs, playback slots, commitments and condition latencies over time."""
    from latsim.viz.timeline import plot_timeline as draw
    from latsim.viz.timeline import select_run

    data = select_run(run_dir, policy=policy, K=K, run=run, stream=stream)
    path = draw(data, out or run_dir / "timeline.png", t0=t0, t1=t1)
    status = data.status_line()
    typer.echo(fit(f"wrote {path} ({data.policy}, K={data.K}, run {data.run})"
                   + (f"; {status}" if status else "")))


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.add_typer(traces_app, name="traces")
    app.add_typer(reproduce_app, name="reproduce")
    app.add_typer(plot_app, name="plot")
