"""Command-line options shared by several commands (types only: typer, no numpy), and the
one place that turns the serving flags into a serving configuration."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from latsim.cli.completion import choices, plugins, prefixes

PolicyOpt = Annotated[str, typer.Option(help="baseline, speculative or both",
                                        autocompletion=choices("baseline", "speculative", "both"))]
ROptions = Annotated[int, typer.Option("--r", help="pixel frames per latent frame")]
FpsOpt = Annotated[float, typer.Option("--fps", help="video frames per second")]
COpt = Annotated[float | None, typer.Option("--C", help="fixed generation time C (s)")]
#: The built-in cost spec forms (``latsim plugins costs`` lists them with plug-ins').
#: (Wave Forcing's optional ``,nf1c`` is said apart: the whole spec is too long a word for
#: the help's column at 80.)
COST_SPECS = ("fixed:C", "affine:A,B", "table:PATH", "lognormal:MEAN,CV", "usp:PATH[@G]",
              "sdvg:PATH", "draftverify:UNIT,CV,TAU",
              "waveforcing:ROUND,STEPS,VAE (add ,nf1c to run a chunk on one device)")
CostOpt = Annotated[
    str | None,
    # rich markup would read [@G] as a tag: escaped
    typer.Option(help=f"cost model: {', '.join(COST_SPECS)}, or a plug-in's "
                 "(latsim plugins costs)".replace("[", "\\["),
                 autocompletion=prefixes("costs")),
]
LeadOpt = Annotated[
    str | None, typer.Option(
        help="planning lead: seconds; cost (C's 0.99 quantile, plus decode's and the replan "
        "overhead's); or auto (serving model: cost plus the wait budget that holds each "
        "policy's stalls to 0.1%, from a pilot run of its own cell); or adaptive (cost "
        "plus a wait estimate each stream keeps from the device waits it sees, as TCP's "
        "retransmit timer, starting at the nD/D/1 quantile; no pilot). Default: auto for "
        "the serving model (--streams, --pools), else cost",
        metavar="S|MODE")
]


PilotOpt = Annotated[
    str, typer.Option(
        help="where --lead auto's pilots run: part (the largest part of the pool, streams "
        "and devices divided alike, that costs at most a tenth of the run: a longer lead "
        "for a short run of a large pool) or whole (the whole pool, whatever it costs)",
        metavar="part|whole", autocompletion=choices("part", "whole"))
]


def parse_lead(text: str | None) -> float | str | None:
    """``--lead``: None (the default), ``auto``, ``adaptive``, ``cost``, or a number of
    seconds (range-checked later)."""
    if text is None or text in ("auto", "adaptive", "cost"):
        return text
    try:
        return float(text)
    except ValueError:
        from latsim.errors import LatsimError

        raise LatsimError(f"--lead must be a number of seconds, auto, adaptive or cost, "
                          f"got {text[:40]!r}") from None


QOpt = Annotated[
    int | None, typer.Option("--q", help="speculative policy's commit unit (must divide K)")
]
UpdatesOpt = Annotated[
    str, typer.Option(help="poisson:RATE, bernoulli:P, trace:PATH or traces:DIR",
                      autocompletion=prefixes(None, ("poisson", "bernoulli", "trace", "traces")))
]
DurationOpt = Annotated[
    float | None, typer.Option(help="window length (s); default: trace header or 60")
]
SeedsOpt = Annotated[
    int | None, typer.Option(help="replications (default 30; 1 per trace for trace specs)")
]
SeedOpt = Annotated[int, typer.Option(help="root seed of all random draws")]
OutOpt = Annotated[Path | None, typer.Option(help="write records, summary and plot here")]
RecordsOpt = Annotated[str | None, typer.Option(
    help="what each run keeps: all, conditions (per-condition and per-event tables; slots "
    "and tasks only counted) or none (summaries only; memory grows with streams and "
    "conditions, not slots). Default: all with --out, else none",
    autocompletion=choices("all", "conditions", "none"))]
JobsOpt = Annotated[int | None, typer.Option(help="worker processes (default: up to 2)")]
SchedulerOpt = Annotated[str, typer.Option(
    help="where simulations run: local (in process or --jobs worker processes), dask-local "
    "(a local Dask cluster of --jobs workers) or tcp://HOST:PORT (a Dask scheduler)",
    autocompletion=choices("local", "dask-local", "tcp://"))]
CommitOpt = Annotated[
    str | None,
    typer.Option(help="speculative policy's commit mode: eager or lazy (ablations)",
                 autocompletion=choices("eager", "lazy")),
]
CommitLeadOpt = Annotated[
    float, typer.Option(help="lazy commit locks a latent this many seconds before it plays")
]
RunAheadOpt = Annotated[
    float, typer.Option(help="refills start this many seconds beyond the lead (a deeper "
                        "buffer; replans still branch one lead ahead)")
]
ReplanAtCacheEndOpt = Annotated[str, typer.Option(
    help="a pending condition whose replan branch falls at the cache end (lazy commit): "
    "defer (the refill takes it; docs/design.md §2) or start (clamp the branch to the cache end "
    "and start the replan at once)")]
_SERVING = "Serving model (docs/design.md §6)"
StreamsOpt = Annotated[int | None, typer.Option(
    help="viewers sharing the pools (default 1)", rich_help_panel=_SERVING)]
PoolsOpt = Annotated[str | None, typer.Option(
    help="device pools NAME=DEVICES,..., e.g. dit=2,vae=1 (default dit=1, plus vae=1 "
    "with --decode)", rich_help_panel=_SERVING)]
ScheduleOpt = Annotated[str | None, typer.Option(
    help="which waiting task a free device takes: fifo, least-slack, replan-first or a "
    "plug-in's (latsim plugins schedules)",
    rich_help_panel=_SERVING, autocompletion=plugins("schedules"))]
DecodeOpt = Annotated[str | None, typer.Option(
    help="VAE decode cost spec of a chunk (on pool vae)", rich_help_panel=_SERVING,
    autocompletion=prefixes("costs"))]
DeliverOpt = Annotated[str | None, typer.Option(
    help="network delay spec of one slot to the client", rich_help_panel=_SERVING)]
UplinkOpt = Annotated[str | None, typer.Option(
    help="network delay spec of a condition to the server", rich_help_panel=_SERVING)]
ReplanCostOpt = Annotated[str | None, typer.Option(
    help="extra DiT cost spec of a replan (boundary decode + re-encode)",
    rich_help_panel=_SERVING)]
BatchOpt = Annotated[str | None, typer.Option(
    help="batch DiT tasks: COSTSPEC[;max=B], K = the batch's total latents",
    rich_help_panel=_SERVING)]
PlayoutOpt = Annotated[float | None, typer.Option(
    help="client playout delay D (s); default: deliver's 0.99 quantile",
    rich_help_panel=_SERVING)]
StartOpt = Annotated[str | None, typer.Option(
    help="stream join times: staggered (s·T/N), random (uniform in [0, T)) or together",
    rich_help_panel=_SERVING, autocompletion=choices("staggered", "random", "together"))]
DiscardOpt = Annotated[str | None, typer.Option(
    help="a replan discards the old future on-start (default) or on-ready",
    rich_help_panel=_SERVING, autocompletion=choices("on-start", "on-ready"))]
BindOpt = Annotated[str | None, typer.Option(
    help="a job that waited for a device takes the newest condition when the device starts "
    "it (start, default) or the one known when it was queued (enqueue)",
    rich_help_panel=_SERVING, autocompletion=choices("start", "enqueue"))]
InFlightOpt = Annotated[int | None, typer.Option(
    help="chunks one stream may have in flight at once (default 1)", rich_help_panel=_SERVING)]
InFlightPolicyOpt = Annotated[str | None, typer.Option(
    help="what a new condition does to chunks in flight: let-play (default: they play, it "
    "shows from the next chunk) or flush (a replan now; their outputs are discarded)",
    rich_help_panel=_SERVING, autocompletion=choices("let-play", "flush"))]
ColdStartOpt = Annotated[bool | None, typer.Option(
    "--cold-start/--no-cold-start",
    help="generate each stream's first chunk on the pools when it joins",
    rich_help_panel=_SERVING)]
DitDegreeOpt = Annotated[int | None, typer.Option(
    help="devices one DiT task runs on (USP degree; the dit pool is cut into groups of it); "
    "default: a usp: cost's degree, else 1", rich_help_panel=_SERVING)]
ServingFileOpt = Annotated[Path | None, typer.Option(
    help="a TOML file with the whole serving configuration; flags override it",
    rich_help_panel=_SERVING)]
MaxSimEventsOpt = Annotated[
    int, typer.Option(help="work bound: events (latent slots, (duration + drain)/δ per run, "
                      "plus conditions) over all cells and replications; checked first")
]


def serving_from_flags(serving_file: Path | None, **flags: Any) -> tuple[Any, str | None]:
    """The serving configuration the flags (and ``--serving FILE``) ask for, or ``None``
    when none is given (the single-worker model), and the file's DiT cost spec if any."""
    if serving_file is None and all(value is None for value in flags.values()):
        return None, None
    from latsim.model.serving import build_serving

    return build_serving(serving_file, **flags)


@contextlib.contextmanager
def scheduler_context(scheduler: str, jobs: int | None, local_pool: bool = False
                      ) -> Iterator[None]:
    """Run the block's experiments on ``scheduler`` (checked first). ``local`` leaves each
    experiment its own pool unless ``local_pool`` asks for one ``--jobs`` pool for all."""
    from latsim.experiments.executors import LOCAL, check_scheduler, using

    check_scheduler(scheduler)
    if scheduler == LOCAL and not local_pool:
        yield
        return
    from latsim.experiments.engine import check_jobs

    with using(scheduler, check_jobs(jobs)):
        yield
