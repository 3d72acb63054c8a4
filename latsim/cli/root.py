"""The ``latsim`` command line's root group (:data:`app`) and its typer commands (DESIGN §4).

Heavy imports (numpy, simpy, matplotlib, torch) happen inside commands so that
``latsim --help`` stays fast. Bad input exits with status 2 and one line on stderr
(``latsim: error: ...``); Ctrl-C exits 130 with ``latsim: interrupted`` (plus what was kept,
for :class:`latsim.errors.Interrupted`). Every number is range-checked by the library
(:mod:`latsim.errors`), and every command that simulates or reads traces has a work bound
(``--max-events``) checked before it starts.
"""

from __future__ import annotations

import inspect
import sys
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from latsim.cli import help_layout
from latsim.cli.examples import epilog
from latsim.cli.options import (
    BatchOpt,
    BindOpt,
    ColdStartOpt,
    CommitLeadOpt,
    CommitOpt,
    COpt,
    CostOpt,
    DecodeOpt,
    DeliverOpt,
    DiscardOpt,
    DitDegreeOpt,
    DurationOpt,
    FpsOpt,
    InFlightOpt,
    InFlightPolicyOpt,
    JobsOpt,
    LeadOpt,
    MaxSimEventsOpt,
    OutOpt,
    PilotOpt,
    PlayoutOpt,
    PolicyOpt,
    PoolsOpt,
    QOpt,
    RecordsOpt,
    ReplanAtCacheEndOpt,
    ReplanCostOpt,
    ROptions,
    RunAheadOpt,
    ScheduleOpt,
    SchedulerOpt,
    SeedOpt,
    SeedsOpt,
    ServingFileOpt,
    StartOpt,
    StreamsOpt,
    UpdatesOpt,
    UplinkOpt,
    parse_lead,
    scheduler_context,
    serving_from_flags,
)
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format, set_invocation
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError, short
from latsim.formatting import fit
from latsim.formatting import fmt as _fmt

#: Options that take several values after one flag (``--K 4 8 21``).
MULTI_VALUE_OPTIONS = ("--K",)
#: Options naming a file or folder: an empty value would read as the working directory.
PATH_OPTIONS = ("--out", "--trace", "--traces", "--serving")


def _refuse_empty_paths(args: list[str]) -> None:
    for i, arg in enumerate(args):
        option, sep, value = arg.partition("=")
        if option not in PATH_OPTIONS:
            continue
        given = value if sep else (args[i + 1] if i + 1 < len(args) else None)
        if given is not None and not given.strip():
            raise LatsimError(f"{option} is empty; name a file or folder")


def _refuse_non_ascii_numbers(args: list[str]) -> None:
    """A value that Python reads as a number but is not ASCII (``--C ١``, ``--K=٨``) is
    refused: click's int and float options take other scripts' digits, and a typo then runs
    with a number nobody wrote. Spec bodies (``fixed:١``) are the spec reader's
    (:mod:`latsim.plugins.spec`)."""
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        if value.isascii():
            continue
        try:
            float(value)
        except ValueError:
            continue
        raise LatsimError(f"{short(value)} is a number in other digits than ASCII; write it "
                          "with ASCII digits (0-9)")


def _refuse_underscored_numbers(args: list[str]) -> None:
    """An option's value that Python reads as a number only through its underscores
    (``--jobs 1_0``: ten) is refused: click's int and float options take them, so a slip of
    the finger ran with a number nobody meant. Only the values of options that are not
    paths are looked at (a folder may be named ``1_0``)."""
    option = ""  # the option the next word is a value of
    for arg in args:
        if arg.startswith("-"):
            name, _, value = arg.partition("=")
            option = "" if value or name in PATH_OPTIONS else name
            if not value or name in PATH_OPTIONS:
                continue
        elif option:
            value = arg
            option = option if option in MULTI_VALUE_OPTIONS else ""
        else:
            continue
        if "_" not in value:
            continue
        try:
            float(value)
        except ValueError:
            continue
        raise LatsimError(f"{short(value)}: a number with an underscore; write it with "
                          "digits only")


def _expand_multi_values(args: list[str]) -> list[str]:
    """Rewrite ``--K 4 8 21`` as ``--K 4 --K 8 --K 21`` (click options take one value)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        out.append(token)
        i += 1
        if token in MULTI_VALUE_OPTIONS:
            first = True
            while i < len(args) and (first or not args[i].startswith("--")):
                if not first:
                    out.append(token)
                out.append(args[i])
                first = False
                i += 1
    return out


#: Entry-point group of command plugins: each entry names a ``typer.Typer`` whose commands
#: join ``latsim``'s (the live harness registers ``measure`` and ``profile`` this way, so the
#: library never imports it). Plugins load only when a command is looked up or listed.
PLUGIN_GROUP = "latsim.commands"


@cache
def _plugin_commands() -> dict[str, Any]:
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for entry in entry_points(group=PLUGIN_GROUP):
        command = typer.main.get_command(entry.load())
        if hasattr(command, "commands"):  # a group (typer vendors its own click)
            found.update(command.commands)
        elif command.name:
            found[command.name] = command
    for name, command in found.items():
        command.epilog = command.epilog or epilog(name)
        if command.help:
            command.help = unwrapped(command.help)
    return found


class _KeyboardInterruptCarrier(Exception):
    """Carries a ``KeyboardInterrupt`` past typer, which would turn it into a silent exit
    130 (``typer.core._main`` raises ``Exit(130)`` from it and returns the code)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


#: Characters ``str.splitlines`` breaks a line at; escaped so an error stays on one line.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def one_line(text: str) -> str:
    """``text`` with every line break escaped (``\\n``): a message is one line however a
    path or spec in it was spelled."""
    return "".join(repr(ch)[1:-1] if ch in _LINE_BREAKS else ch for ch in text)


def _interrupted_message(exc: BaseException | None) -> str:
    if isinstance(exc, Interrupted) and str(exc).strip():
        return f"latsim: interrupted: {one_line(str(exc).strip())}"
    return "latsim: interrupted"


def _os_error_message(exc: OSError) -> str:
    """``latsim: error: PATH: reason`` (``PATH -> PATH2`` for a rename), or without a path
    ``latsim: error: reason``."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = ""
    if exc.filename is not None:
        where = f"{exc.filename}"
        if exc.filename2 is not None:
            where += f" -> {exc.filename2}"
        where += ": "
    return one_line(f"latsim: error: {where}{reason}")


class OneLineErrors(TyperGroup):
    """Turns usage errors, :class:`LatsimError` and ``OSError`` into ``latsim: error: …``
    and exit 2, and ``KeyboardInterrupt`` into ``latsim: interrupted`` and exit 130; adds
    the commands of installed plugins (:data:`PLUGIN_GROUP`)."""

    def list_commands(self, ctx):  # click's signature
        own = super().list_commands(ctx)
        return own + sorted(name for name in _plugin_commands() if name not in own)

    def get_command(self, ctx, cmd_name):  # click's signature
        return super().get_command(ctx, cmd_name) or _plugin_commands().get(cmd_name)

    def invoke(self, ctx):  # click's signature
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # past typer's Exit(130), see the carrier
            raise _KeyboardInterruptCarrier(exc) from exc

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             windows_expand_args=True, **extra: Any):
        argv = list(sys.argv[1:] if args is None else args)
        if argv[:1] == ["help"] and not {"-h", "--help"} & set(argv):
            argv = [*argv[1:], "--help"]  # latsim help [COMMAND ...] is COMMAND --help
        set_invocation(argv)
        try:
            _refuse_empty_paths(argv)
            _refuse_non_ascii_numbers(argv)
            _refuse_underscored_numbers(argv)
            code = super().main(args=_expand_multi_values(argv), prog_name=prog_name,
                                complete_var=complete_var, standalone_mode=False, **extra)
            if code == 130:  # typer's own Exit(130) for an interrupt outside a command
                typer.echo(_interrupted_message(None), err=True)
        except _KeyboardInterruptCarrier as exc:
            typer.echo(_interrupted_message(exc.original), err=True)
            code = 130
        except KeyboardInterrupt as exc:
            typer.echo(_interrupted_message(exc), err=True)
            code = 130
        except LatsimError as exc:
            typer.echo(one_line(f"latsim: error: {exc}"), err=True)
            code = 2
        except OSError as exc:  # unreadable input or unwritable output
            typer.echo(_os_error_message(exc), err=True)
            code = 2
        except Exception as exc:
            # click's (or typer's vendored click's) Exit, UsageError and Abort, by shape
            name = type(exc).__name__
            if name == "Exit":
                code = exc.exit_code  # type: ignore[attr-defined]
            elif name == "Abort":
                typer.echo(_interrupted_message(None), err=True)
                code = 130
            elif hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
                message = " ".join(exc.format_message().split())
                if message:  # no arguments to a group: its help is the message, printed
                    typer.echo(f"latsim: error: {message}", err=True)
                code = 2
            else:
                raise
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


help_layout.install()  # no option name cut in a help page
app = typer.Typer(
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # subcommands inherit them
)


def _version(value: bool) -> None:
    if value:
        from latsim import __version__, build

        typer.echo(f"latsim {__version__} ({build()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", help="print latsim's version and exit", is_eager=True,
        callback=_version)] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="no progress bars or status lines (results still print)")
    ] = False,
) -> None:
    """Response-latency simulator for interactive video generation (theory, SimPy
    simulation, live measurement).

    One command's help: latsim help COMMAND, or latsim COMMAND -h.

    What can be plugged in (cost models, schedules, generators): latsim plugins."""
    if quiet:
        import os

        from latsim.formatting import QUIET_ENV

        os.environ[QUIET_ENV] = "1"  # the harness's status lines read it too



def _run(experiment, fmt: str, out: Path | None, jobs: int | None) -> None:
    from latsim.cli.progress import ProgressBar
    from latsim.experiments.engine import (
        EXPERIMENT_FILES,
        plan_all,
        reporting_progress,
        run_experiment,
        write_experiment,
    )
    from latsim.run.files import check_writable
    from latsim.run.folder import claim_folder, of_kind

    if out is not None:  # never over another's files
        claim_folder(out, EXPERIMENT_FILES, "config.json", "latsim simulate or sweep",
                     of_kind("experiment"))
    # one bar counts --lead auto's pilot runs, then the runs
    with ProgressBar("simulating (runs)") as progress, reporting_progress(progress):
        # bad input and the work bound fail before the output is touched (the pilots run
        # here, on the --jobs workers)
        plan_all([experiment], jobs)
        if out is not None:
            check_writable(out)  # before the runs
        result = run_experiment(experiment, jobs=jobs)
    figure = None
    if out is not None:
        from latsim.viz.plots import plot_latency

        figure = write_experiment(
            result, out, also=lambda folder: plot_latency(result.rows, folder, result.runs))[-1]

    def table() -> None:
        _print_rows(result.rows)
        if figure is not None:
            typer.echo(fit(f"wrote {out}/ (summary.json, records CSV, {figure.name})"))

    emit(fmt, result.rows, table, seed=experiment.seed,
         out=None if out is None else str(out))


def _print_rows(rows: list[dict]) -> None:
    from latsim.cli.tables import Column, print_table

    first = rows[0]
    runs, streams = first["n_runs"], first.get("n_streams")
    # a serving run's runs are its streams' (each seed's): say which
    counted = (f"{runs // streams} seed(s) × {streams} stream(s)"
               if streams and runs % streams == 0 else f"{runs} runs")
    title = (f"{first['fps']:g} fps, r={first['r']}, cost {first['cost']}, updates "
             f"{first['updates']}, {first['duration']:g} s × {counted}")
    # (key, header, digits, rank): rank 0 shows first; the highest ranks go first at 80
    columns = [
        ("policy", "policy", 0, 0), ("K", "K", 0, 0), ("T", "T", 2, 5), ("C_mean", "C", 3, 4),
        ("L_mean", "L mean", 3, 1), ("L_mean_se", "±se", 3, 4),
        ("L_mean_theory", "theory", 3, 3), ("L50", "L50", 3, 1),
        ("L95", "L95", 3, 1), ("R_mean", "R", 3, 6), ("Q_mean", "Q", 3, 6),
        ("stall_pct", "stall%", 2, 2), ("busy_pct", "busy%", 1, 4), ("w", "w", 3, 3),
        ("A", "A", 3, 3), ("dit_calls", "calls", 0, 7), ("n_displayed", "shown", 0, 7),
        ("n_superseded", "supers.", 0, 8),
    ]
    if "n_streams" in first:  # a serving run: the viewer's view beside the server's
        title += f"; playout delay {_fmt(first['playout_delay'], 3)} s"
        after_l95 = [key for key, *_ in columns].index("L95") + 1
        columns[after_l95:after_l95] = [("L99", "L99", 3, 3), ("L_server50", "srv L50", 3, 5)]
        columns += [("viewer_stall_pct", "viewer stall%", 2, 2), ("cpr", "cpr", 3, 6),
                    ("ttff_mean", "ttff", 3, 6)]
    notes = []
    for row in rows:
        if "busy_pct_by_pool" in row:
            pools = ", ".join(f"{name} {_fmt(pct, 1)}%"
                              for name, pct in row["busy_pct_by_pool"].items())
            waits = ", ".join(f"{stage} {_fmt(wait, 3)} s"
                              for stage, wait in row["queue_wait_mean_by_stage"].items())
            notes.append(f"{row['policy']} K={row['K']}: busy {pools}; mean queue wait "
                         f"{waits or 'none'}")
    overloaded = {row["K"]: row["refill_rho"] for row in rows
                  if row.get("refill_rho", 0.0) >= 1}  # the same for every policy of a K
    notes += [f"K={K}: the busiest DiT device is at ρ = {rho:.2f} from refills alone: no "
              "lead keeps the stall target there; lower --streams or add devices"
              for K, rho in overloaded.items()]
    notes += _filling_notes(rows)
    notes.append("[dim]seconds; theory = closed-form E[L] where one holds (fixed C <= T, "
                 "rare updates for speculative)[/dim]")
    if any("A_note" in row for row in rows):
        notes.append("[dim]A –: no baseline ran on the same arrivals; --policy both "
                     "measures A[/dim]")
    print_table(title, [Column(header, rank, "left" if key == "policy" else "right")
                        for key, header, _, rank in columns],
                [[_fmt(row[key], digits) for key, _, digits, _ in columns] for row in rows],
                notes)


#: The share of the window the cache may spend filling before a row says its run is far
#: from the steady state the closed forms assume.
FILLING_SHARE = 0.1


def _filling_notes(rows: list[dict]) -> list[str]:
    """A note per K whose lead is long against the window: from the prebuffer, the cache
    grows by T/C − 1 seconds of content a second (one chunk of T every C), so it takes
    about lead·C/(T − C) to hold the lead; past :data:`FILLING_SHARE` of the window the
    measured L sits below the steady state's (early conditions show sooner)."""
    notes = {}
    for row in rows:
        lead, C, T = row.get("lead"), row.get("C_mean"), row.get("T")
        if lead is None or C is None or T is None or not 0 < C < T:
            continue
        filling = lead * C / (T - C)
        if filling > FILLING_SHARE * row["duration"]:
            notes[row["K"]] = (f"K={row['K']}: with a lead of {lead:g} s the cache takes "
                               f"about {filling:.0f} s (lead·C/(T−C)) to fill, "
                               f"{filling / row['duration']:.0%} of the {row['duration']:g} s "
                               "window: the run is far from the steady state the theory "
                               "assumes; a longer --duration or a shorter --lead")
    return list(notes.values())


def _experiment_command(name: str, default_Ks: list[int] | None, summary: str) -> None:  # noqa: N803
    """Register ``simulate`` or ``sweep``: the same options, one K or several."""

    def command(
        K: Annotated[
            list[int] | None, typer.Option("--K", help="chunk size(s) in latent frames, "
                                           "e.g. --K 4 8 21")
        ] = default_Ks,
        policy: PolicyOpt = "both",
        r: ROptions = 4,
        fps: FpsOpt = 16.0,
        C: COpt = None,
        cost: CostOpt = None,
        lead: LeadOpt = None,
        pilot: PilotOpt = "part",
        q: QOpt = None,
        updates: UpdatesOpt = "poisson:0.1",
        duration: DurationOpt = None,
        seeds: SeedsOpt = None,
        seed: SeedOpt = 0,
        fmt: FormatOpt = None,
        as_json: JsonOpt = False,
        out: OutOpt = None,
        jobs: JobsOpt = None,
        scheduler: SchedulerOpt = "local",
        commit: CommitOpt = None,
        commit_lead: CommitLeadOpt = 0.0,
        run_ahead: RunAheadOpt = 0.0,
        replan_at_cache_end: ReplanAtCacheEndOpt = "defer",
        max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
        streams: StreamsOpt = None,
        pools: PoolsOpt = None,
        schedule: ScheduleOpt = None,
        decode: DecodeOpt = None,
        deliver: DeliverOpt = None,
        uplink: UplinkOpt = None,
        playout_delay: PlayoutOpt = None,
        replan_cost: ReplanCostOpt = None,
        batch: BatchOpt = None,
        start: StartOpt = None,
        discard: DiscardOpt = None,
        bind: BindOpt = None,
        in_flight: InFlightOpt = None,
        in_flight_policy: InFlightPolicyOpt = None,
        cold_start: ColdStartOpt = None,
        dit_degree: DitDegreeOpt = None,
        serving: ServingFileOpt = None,
        records: RecordsOpt = None,
    ) -> None:
        output = output_format(fmt, as_json)
        if not K:
            raise LatsimError(f"{name} needs --K")
        repeated = sorted({k for k in K if K.count(k) > 1})
        if repeated:
            raise LatsimError(f"--K repeats {', '.join(map(str, repeated))}; give each chunk "
                              "size once")
        if default_Ks is None and len(K) != 1:
            raise LatsimError(f"{name} takes one --K; use 'latsim sweep' for several")
        if C is not None and cost is not None:
            raise LatsimError("give either --C or --cost, not both")
        from latsim.controller.policies import policy_names
        from latsim.experiments.engine import DEFAULT_COST, Experiment
        from latsim.model.costs import FixedCost

        serving_config, file_cost = serving_from_flags(
            serving, streams=streams, pools=pools, schedule=schedule, decode=decode,
            deliver=deliver, uplink=uplink, playout_delay=playout_delay,
            replan_cost=replan_cost, batch=batch, start=start, discard=discard, bind=bind,
            in_flight=in_flight, in_flight_policy=in_flight_policy, cold_start=cold_start,
            dit_degree=dit_degree)
        if C is None and cost is None:
            cost = file_cost
        experiment = Experiment(
            Ks=tuple(K), r=r, fps=fps,
            cost=FixedCost(C) if C is not None else cost or DEFAULT_COST,
            lead=parse_lead(lead), q=q,
            policies=tuple(policy_names(policy)), updates=updates, duration=duration,
            seeds=seeds, seed=seed, commit=commit, commit_lead=commit_lead,
            run_ahead=run_ahead, replan_at_cache_end=replan_at_cache_end,
            max_events=max_events, serving=serving_config,
            records=records or ("all" if out is not None else "none"), pilot=pilot,
        )
        with scheduler_context(scheduler, jobs):
            _run(experiment, output, out, jobs)

    command.__doc__ = summary
    app.command(name)(command)


_experiment_command(
    "simulate", None,
    "Simulate one K under one or both policies; records per condition, job, slot, stall.")
_experiment_command(
    "sweep", [4, 8, 21],
    "One row per (K, policy). Defaults: Wan1.3B at 16 fps, r=4 (see README).")


@app.command("theory")
def theory_cmd(
    K: Annotated[int, typer.Option("--K", help="chunk size in latent frames")],
    C: Annotated[float, typer.Option("--C", help="generation time C (s)")],
    r: ROptions = 4,
    fps: FpsOpt = 16.0,
    rate: Annotated[
        float | None, typer.Option(help="Poisson update rate (1/s) for A ≈ 1 + λ(T−δ)/2")
    ] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every closed form of the timing model for one setting."""
    from latsim.analysis import theory

    output = output_format(fmt, as_json)
    result = theory.summary(K, r, fps, C, rate)  # range-checks every input
    quantities = {key: value for key, value in result.items() if key not in ("notes", "about")}
    units = {key: THEORY_UNITS.get(key, "s") for key in quantities}

    def table() -> None:
        from rich.console import Console
        from rich.table import Table

        drawn = Table(title=f"theory: K={K}, r={r}, fps={fps:g}, C={C:g} s")
        drawn.add_column("quantity")
        drawn.add_column("value", justify="right")
        drawn.add_column("unit")
        for key, value in quantities.items():
            drawn.add_row(key, str(value) if isinstance(value, int) else _fmt(value, 4),
                          units[key])
        console = Console()
        console.print(drawn)
        for key, text in result["about"].items():
            console.print(f"{key}: {text}", highlight=False)
        for key, note in result["notes"].items():
            console.print(f"[dim]{key}: {note}[/dim]")

    emit(output, [quantities], table, units=units, about=result["about"],
         notes=result["notes"])


#: Units of ``latsim theory``'s quantities that are not in seconds.
THEORY_UNITS = {"K": "latents", "r": "frames/latent", "fps": "frames/s", "rate": "1/s",
                "stall_fraction": "fraction", "A_poisson_approx": "ratio"}


@app.command()
def plugins(
    kind: Annotated[
        str | None, typer.Argument(help="costs, schedules, generators or placements "
                                   "(default: all four)")
    ] = None,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the cost models, schedules, live generators and placements, and who provides each.

    They come from entry points (docs/extending.md)."""
    from latsim.plugins import registry

    output = output_format(fmt, as_json)
    kinds = list(registry.GROUPS) if kind is None else [kind]
    found = [p for k in kinds for p in registry.plugins(k)]

    def table() -> None:
        heading = {"costs": "cost models (--cost PREFIX:ARGS, --decode, --deliver, ...)",
                   "schedules": "schedules (--schedule NAME)",
                   "generators": "live generators (--generator NAME)",
                   "placements": "fleet placement policies (fleet.placement in latsim fleet)"}
        names = [(p.kind, p.name) for p in found]
        for k in kinds:
            typer.echo(heading[k])
            for p in (p for p in found if p.kind == k):
                clash = "  (registered twice)" if names.count((k, p.name)) > 1 else ""
                typer.echo(f"  {p.name:<13} {p.distribution:<14} {p.target}{clash}")

    emit(output, [{"kind": p.kind, "name": p.name, "target": p.target,
                   "distribution": p.distribution} for p in found], table)


@app.command()
def controller(
    diagram: Annotated[bool, typer.Option("--diagram", help="print a Mermaid diagram")] = False,
) -> None:
    """Print the controller's transition table (or its Mermaid state diagram)."""
    from latsim.controller import EVENT_KINDS, TRANSITIONS, mermaid_diagram

    if diagram:
        typer.echo(mermaid_diagram(), nl=False)
        return
    import textwrap

    from latsim.cli.tables import UNBOUNDED_WIDTH, table_width

    width = table_width()
    width = 100 if width == UNBOUNDED_WIDTH else max(40, width)  # piped: lines a reader keeps
    for row in TRANSITIONS:  # source None: any state; target None: the state is kept
        source = "any" if row.source is None else row.source.value
        target = "same" if row.target is None else row.target.value
        guard = f"[{row.guard}]" if row.guard else ""
        trigger = EVENT_KINDS[row.trigger]
        typer.echo(f"{source:8} --{trigger}{guard}--> {target:8} {row.action}")
        typer.echo(textwrap.fill(row.note, width, initial_indent="    ",
                                 subsequent_indent="    ", break_on_hyphens=False))


def _register_extensions() -> None:
    from latsim.cli import (
        capacity_command,
        compare_command,
        export_command,
        fleet_command,
        grid_command,
        paper_commands,
        plan_command,
    )

    paper_commands.register(app)
    compare_command.register(app)
    capacity_command.register(app)
    export_command.register(app)
    grid_command.register(app)
    fleet_command.register(app)
    plan_command.register(app)


def unwrapped(text: str) -> str:
    """A docstring's paragraphs each on one line: typer's rich help keeps a paragraph's
    single newlines, so a docstring wrapped at 100 columns printed ragged at 80. A line
    that starts a list item (``-``) or is indented stays on its own."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.split("\n"):
            if lines and not line.startswith(("- ", " ", "\b")):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _finish_help(typer_app: typer.Typer, prefix: str = "") -> None:
    """Every command's ``--help``: its docstring's paragraphs unwrapped (:func:`unwrapped`),
    then its examples (:mod:`latsim.cli.examples`)."""
    for info in typer_app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
        info.epilog = info.epilog or epilog(prefix + name)
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = unwrapped(doc)
    for group in typer_app.registered_groups:
        instance = group.typer_instance
        if instance is not None:
            info = instance.info
            info.epilog = info.epilog or epilog(f"{prefix}{group.name}")
            _finish_help(instance, f"{prefix}{group.name} ")


@app.command("help")
def help_command(
    command: Annotated[list[str] | None, typer.Argument(
        help="a command, e.g. sweep or traces generate")] = None,
) -> None:
    """Show the help of latsim or of one command (the same as COMMAND --help)."""
    # ``main`` turns ``latsim help X`` into ``latsim X --help`` before typer sees it


_register_extensions()
_finish_help(app)


def main() -> None:
    """Console-script entry point."""
    app()
