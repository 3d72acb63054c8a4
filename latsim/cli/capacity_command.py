"""``latsim capacity``: the most streams a serving configuration serves within an SLO
(registered on the main app; the simulation loads inside the command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import (
    BatchOpt,
    BindOpt,
    ColdStartOpt,
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
    PlayoutOpt,
    PoolsOpt,
    ReplanCostOpt,
    ROptions,
    ScheduleOpt,
    SchedulerOpt,
    SeedOpt,
    ServingFileOpt,
    UpdatesOpt,
    UplinkOpt,
    parse_lead,
    scheduler_context,
    serving_from_flags,
)
from latsim.cli.output import FormatOpt, JsonOpt, claims, emit, envelope, output_format
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError
from latsim.formatting import fit
from latsim.formatting import fmt as _fmt


def capacity(
    K: Annotated[int, typer.Option("--K", help="chunk size in latent frames")],
    slo_l95: Annotated[float, typer.Option(help="SLO: end-to-end L95 at most this (s)")],
    slo_stall: Annotated[float, typer.Option(
        help="SLO: viewer stall (server stalls + late deliveries) at most this % of the "
        "window")] = 0.1,
    policy: Annotated[str, typer.Option(help="baseline or speculative")] = "speculative",
    r: ROptions = 4,
    fps: FpsOpt = 16.0,
    C: COpt = None,
    cost: CostOpt = None,
    lead: LeadOpt = None,
    updates: UpdatesOpt = "poisson:0.1",
    duration: DurationOpt = None,
    seed: SeedOpt = 0,
    pools: PoolsOpt = None,
    schedule: ScheduleOpt = None,
    decode: DecodeOpt = None,
    deliver: DeliverOpt = None,
    uplink: UplinkOpt = None,
    playout_delay: PlayoutOpt = None,
    replan_cost: ReplanCostOpt = None,
    batch: BatchOpt = None,
    start: Annotated[str, typer.Option(
        help="stream join times: random (default), staggered or together")] = "random",
    discard: DiscardOpt = None,
    bind: BindOpt = None,
    in_flight: InFlightOpt = None,
    in_flight_policy: InFlightPolicyOpt = None,
    cold_start: ColdStartOpt = None,
    dit_degree: DitDegreeOpt = None,
    serving: ServingFileOpt = None,
    max_streams: Annotated[int, typer.Option(help="largest N to try")] = 256,
    confidence: Annotated[float, typer.Option(
        help="confidence a verdict needs (pass: both metrics within the SLO, Bonferroni)")
    ] = 0.95,
    min_seeds: Annotated[int, typer.Option(help="replications per N to start with")] = 5,
    max_seeds: Annotated[int, typer.Option(
        help="replications per N at most (doubling while undecided)")] = 40,
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[Path | None, typer.Option(
        help="write capacity.json/.csv and capacity.png here")] = None,
    max_events: MaxSimEventsOpt = DEFAULT_MAX_EVENTS,
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
) -> None:
    """Largest number of streams meeting an SLO.

    Doubling, then bisection, with a statistical verdict per N (bootstrap over
    replications)."""
    from latsim.experiments.capacity import (
        SLO,
        CapacityQuery,
        capacity_payload,
        search_capacity,
    )
    from latsim.experiments.engine import DEFAULT_COST, Experiment, lead_mode
    from latsim.model.costs import FixedCost
    from latsim.run.files import write_rows_csv

    output = output_format(fmt, as_json)
    if out is not None:  # never over another's files
        claims("capacity", out, ("capacity.json", "capacity.csv", "capacity.png"),
               "capacity.json")
    if C is not None and cost is not None:
        raise LatsimError("give either --C or --cost, not both")
    if policy not in ("baseline", "speculative"):
        raise LatsimError(f"capacity takes --policy baseline or speculative, got {policy!r}")
    serving_config, file_cost = serving_from_flags(
        serving, streams=1, pools=pools, schedule=schedule, decode=decode, deliver=deliver,
        uplink=uplink, playout_delay=playout_delay, replan_cost=replan_cost, batch=batch,
        start=start, discard=discard, bind=bind, in_flight=in_flight,
        in_flight_policy=in_flight_policy, cold_start=cold_start, dit_degree=dit_degree)
    experiment = Experiment(
        Ks=(K,), r=r, fps=fps,
        cost=FixedCost(C) if C is not None else cost or file_cost or DEFAULT_COST,
        lead=parse_lead(lead), policies=(policy,), updates=updates, duration=duration,
        seed=seed,
        max_events=max_events, serving=serving_config)
    query = CapacityQuery(experiment, SLO(slo_l95, slo_stall), max_streams=max_streams,
                          confidence=confidence, min_seeds=min_seeds, max_seeds=max_seeds)

    config = {"K": K, "policy": policy, "r": r, "fps": fps,
              "cost": experiment.cost if isinstance(experiment.cost, str)
              else experiment.cost.spec, "lead": lead_mode(experiment) or experiment.lead,
              "updates": updates,
              "duration": duration, "seed": seed, "serving": serving_config.describe()}
    measured = []

    def keep(payload: dict) -> None:
        """capacity.json as the search goes: a killed or stopped search keeps its rows."""
        if out is not None:
            from latsim.run.folder import write_json

            write_json(out / "capacity.json",
                       envelope(payload["rows"], seed, **_beside_rows(payload, config)))

    from latsim.cli.progress import ProgressBar

    bar = ProgressBar("capacity")

    def progress(verdict) -> None:
        measured.append(verdict)
        keep(capacity_payload(query, measured, None, "running"))
        bar.label = (f"capacity: N={verdict.streams} {verdict.verdict} (L95 "
                     f"{_fmt(verdict.metrics['L95'], 3)} s, stall "
                     f"{_fmt(verdict.metrics['viewer_stall_pct'], 3)}%)")
        bar(len(measured), len(measured) + evaluations_left(measured, max_streams))

    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    try:
        with scheduler_context(scheduler, jobs, local_pool=True), bar:
            result = search_capacity(query, progress=progress)
            bar(len(measured), len(measured))
    except KeyboardInterrupt:
        keep(capacity_payload(query, measured, None, "interrupted"))
        where = f"; kept in {out}/capacity.json (partial)" if out is not None else ""
        raise Interrupted(f"capacity search stopped after {len(measured)} stream count(s)"
                          f"{where}") from None
    except LatsimError as exc:  # the work bound, reached mid-search
        if measured:
            keep(capacity_payload(query, measured, None, f"stopped: {exc}"))
        raise
    payload = result.payload()
    if out is not None:
        from latsim.viz.plots import plot_capacity

        keep(payload)
        write_rows_csv(out / "capacity.csv", payload["rows"])
        plot_capacity(payload, out / "capacity.png", config)
    def table() -> None:
        from rich.console import Console

        from latsim.cli.tables import Column, print_table, table_width

        columns = [("streams", "N", 0, 0), ("verdict", "verdict", 0, 0),
                   ("confidence_meets", "P(meets)>=", 3, 2), ("L95", "L95", 3, 0),
                   ("L95_se", "±", 3, 1), ("viewer_stall_pct", "stall%", 3, 0),
                   ("viewer_stall_pct_se", "±", 3, 1), ("busy_pct", "dit busy%", 1, 2),
                   ("R_mean", "R", 3, 3), ("lead", "lead", 3, 3), ("n_runs", "runs", 0, 1)]
        print_table(f"capacity: L95 <= {slo_l95:g} s, viewer stall <= {slo_stall:g}% "
                    f"(confidence {confidence:g})",
                    [Column(header, rank) for _, header, _, rank in columns],
                    [[_fmt(row[key], digits) for key, _, digits, _ in columns]
                     for row in payload["rows"]])
        console = Console(width=min(table_width(), 200), highlight=False)
        console.print(f"max streams meeting the SLO: {result.max_streams}", highlight=False)
        for note in payload["notes"]:
            typer.echo(fit(note))
        if out is not None:
            console.print(f"wrote {out}/ (capacity.json, capacity.csv, capacity.png)",
                          highlight=False)

    emit(output, payload["rows"], table, seed=seed, **_beside_rows(payload, config))


def evaluations_left(verdicts: list, max_streams: int) -> int:
    """At most how many more stream counts the search will measure, given the verdicts so
    far: the doublings up to ``max_streams`` and a bisection of the bracket left."""
    import math

    best = max((v.streams for v in verdicts if v.meets), default=0)
    worst = min((v.streams for v in verdicts if not v.meets), default=None)
    if worst is not None:
        return 0 if worst - best <= 1 else math.ceil(math.log2(worst - best))
    if best >= max_streams:
        return 0
    return math.ceil(math.log2(max_streams / best)) + math.ceil(math.log2(best))


def _beside_rows(payload: dict, config: dict) -> dict:
    """The envelope's keys besides ``rows`` (capacity.json and ``--format json``): the
    search's verdict and SLO, and the command's settings under ``config``."""
    return {key: value for key, value in payload.items() if key != "rows"} | {"config": config}


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)
