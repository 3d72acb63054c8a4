"""The live harness's commands: measure, profile, serve, client. Imports torch lazily.

They join the ``latsim`` command line as a plugin (entry point group ``latsim.commands`` in
``pyproject.toml``), so the library never imports the harness.

``latsim measure`` drives latsim's controller with the wall clock and a real Wan diffusion
transformer (random weights; :mod:`harness`). Only typer is imported at module level so
``latsim --help`` stays fast; the harness (and torch) load inside the command.

Every option is range-checked before any work (:data:`latsim.errors.OPTION_BOUNDS`), as is
the output (written and removed probe file). Ctrl-C or SIGTERM raise
:class:`latsim.errors.Interrupted` saying what was kept and where (the command line prints
it and exits 130); a failed run (generator error, a job hung past ``--job-timeout``, a
failed write) is a one-line error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from latsim.cli.completion import plugins
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import LatsimError
from latsim.formatting import StatusLine, fit, fmt

if TYPE_CHECKING:
    import logging


def _check_trace(trace: Path | None) -> None:
    """``--trace``'s file, checked before any warm-up: one that exists and is a file; a
    named pipe or socket is refused as every other input path refuses it
    (:func:`latsim.model.traces.refuse_pipe`)."""
    from latsim.model.traces import refuse_pipe

    if trace is None or trace.is_file():
        return
    if not trace.exists():
        raise LatsimError(f"--trace {trace}: no such file")
    try:
        refuse_pipe(trace)
    except OSError as exc:
        raise LatsimError(f"--trace {trace}: cannot read: {exc.strerror}") from None
    raise LatsimError(f"--trace {trace}: cannot read: not a regular file (a device or folder)")


def require_live_extra(command: str, packages: tuple[str, ...]) -> None:
    """One line instead of a traceback when the live harness's packages are missing."""
    from harness.generators.device import require_packages

    require_packages(f"latsim {command}", packages)


commands = typer.Typer(help="Live measurement with a real generator (latsim plugins).")

# Generator options shared by profile, measure and serve.
GeneratorOpt = Annotated[
    str, typer.Option(help="live generator (latsim plugins lists them): wan, ltx, sleep or "
                      "a plug-in's", autocompletion=plugins("generators"))
]
PresetOpt = Annotated[
    str | None, typer.Option(help="the generator's model preset: tiny (default) or full size "
                             "(wan-1.3b; ltx-2, ltx-2.3)")
]
ResolutionOpt = Annotated[
    str | None, typer.Option(help="the generator's latent resolution: tiny (default), small, "
                             "480p, 720p; wan also 240p, ltx also 448p")
]
CostOpt = Annotated[
    str | None, typer.Option(help="sleep generator: the job time, any cost spec (e.g. "
                             "fixed:0.2, table:profile.json)")
]
GeneratorOptionOpt = Annotated[
    list[str] | None,
    typer.Option("--generator-option", help="KEY=VALUE for the generator alone (sleep: "
                 "payload_bytes=N); repeat for several"),
]
StepsOpt = Annotated[int, typer.Option(help="denoising steps per job (Euler)")]
DeviceOpt = Annotated[str, typer.Option(help="cpu or cuda")]
DecodeOpt = Annotated[
    bool, typer.Option("--decode/--no-decode",
                       help="VAE-decode each job's first output group inside C")
]
ContextOpt = Annotated[int, typer.Option(help="clean prefix latents fed to each job as context")]
SeedOpt = Annotated[int, typer.Option(help="seed of the generator (weights, noise, "
                                        "embeddings), the shaping and a --rate trace")]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU torch threads (default: cores - 1)")]
# The conditions of a live run (measure, client).
TraceOpt = Annotated[
    Path | None, typer.Option(help="condition trace (JSONL); default: Poisson at --rate")
]
RateOpt = Annotated[float, typer.Option(help="conditions per second when no --trace is given")]
UpdatesOpt = Annotated[str | None, typer.Option(
    help="poisson:RATE or trace:PATH, as simulate's --updates (in place of --rate/--trace)")]


def updates_as_trace_and_rate(updates: str | None, trace: Path | None, rate: float
                              ) -> tuple[Path | None, float]:
    """``--updates`` as a live run's ``(--trace, --rate)``: a live run replays one trace,
    or draws Poisson conditions from its seed."""
    if updates is None:
        return trace, rate
    from latsim.model.arrivals import PoissonArrivals, TraceArrivals, parse_updates

    if trace is not None or rate != 0.1:
        raise LatsimError("give --updates or --rate/--trace, not both")
    if updates.partition(":")[0] not in ("poisson", "trace"):
        raise LatsimError(f"--updates {updates[:60]!r}: a live run takes poisson:RATE or "
                          "trace:PATH (it replays one trace)")
    source = parse_updates(updates)  # the spec's own checks and messages
    if isinstance(source, PoissonArrivals):
        return None, source.rate
    assert isinstance(source, TraceArrivals)
    return Path(updates.partition(":")[2]), rate
DurationOpt = Annotated[
    float | None, typer.Option(help="window (s); default: the trace header's, else 60")
]
KsOpt = Annotated[
    list[int], typer.Option("--K", help="chunk sizes in latent frames, e.g. --K 2 4 8")
]


def generator_options(given: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--generator-option KEY=VALUE`` values as pairs; a one-line error for another form."""
    pairs = []
    for item in given or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LatsimError(f"--generator-option takes KEY=VALUE, got {item!r}")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _generator_config(preset: str | None, resolution: str | None, steps: int, context: int,
                      decode: bool, device: str, seed: int, threads: int | None,
                      cost: str | None = None,
                      options: list[str] | None = None):
    """The generator options of profile and serve, range-checked, as a GeneratorConfig."""
    from latsim.errors import check_option
    from latsim.plugins import GeneratorConfig

    for option, value in (("--steps", steps), ("--seed", seed), ("--context", context),
                          ("--threads", threads)):
        check_option(option, value)
    return GeneratorConfig(preset=preset, resolution=resolution, steps=steps, context=context,
                           decode=decode, device=device, seed=seed, threads=threads,
                           cost=cost, options=generator_options(options))


@commands.command("profile")
def profile(
    K: KsOpt = [4],  # noqa: B006
    out: Annotated[Path, typer.Option(help="profile file to write (JSON)")] = Path(
        "profile.json"
    ),
    generator: GeneratorOpt = "wan",
    preset: PresetOpt = None,
    resolution: ResolutionOpt = None,
    steps: StepsOpt = 4,
    jobs: Annotated[int, typer.Option(help="timed jobs per K and job kind (1-5000)")] = 20,
    gap: Annotated[
        float, typer.Option(help="idle seconds before each timed job (0-10)")
    ] = 0.3,
    device: DeviceOpt = "cpu",
    decode: DecodeOpt = False,
    context: ContextOpt = 0,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    cost: CostOpt = None,
    generator_option: GeneratorOptionOpt = None,
    format_name: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure C per K and job kind (refill, replan); write a --cost table:PATH file."""
    from harness.generators.device import require_device
    from harness.measure.profile import ProfileConfig, run_profile

    output = output_format(format_name, as_json)

    built = _generator_config(preset, resolution, steps, context, decode, device, seed,
                              threads, cost, generator_option)
    config = ProfileConfig(built, tuple(K), jobs_per_kind=jobs, gap_s=gap,
                           generator_name=generator)
    require_device(device)
    from latsim.cli.progress import ProgressBar

    with ProgressBar("profile") as bar:
        document = run_profile(config, out, progress=bar.status)
    fits = document["fit"]
    rows = []
    for k, kinds in document["summary"].items():
        for kind, stats in kinds.items():
            law = fits[kind]["lognormal"].get(k) or {}
            rows.append({"K": int(k), "kind": kind, **stats,
                         "lognormal": law.get("spec"), "lognormal_ks_p": law.get("ks_p")})

    def table() -> None:
        from latsim.cli.tables import Column, print_table

        columns = [Column("K"), Column("kind", justify="left"), Column("jobs", 2),
                   Column("mean ms"), Column("p50 ms", 2), Column("p99 ms"), Column("cv", 2),
                   Column("lognormal fit", 1, justify="left"), Column("KS p", 1)]
        notes = []
        for kind, fitted in fits.items():
            affine = fitted["affine"]
            if affine is not None:
                law = affine["spec"] or f"a = {affine['a']:.3g}, b = {affine['b']:.3g} s"
                notes.append(f"{kind}: {law} (R² {affine['r2']:.3f}, means within "
                             f"{100 * affine['max_mean_error']:.1f} %)")
        print_table(f"profile: {generator} on {device}, generator wall time per job", columns,
                    [[str(r["K"]), r["kind"], str(r["n"]), f"{r['mean'] * 1e3:.1f}",
                      f"{r['p50'] * 1e3:.1f}", f"{r['p99'] * 1e3:.1f}", f"{r['cv']:.2f}",
                      r["lognormal"] or "-",
                      "-" if r["lognormal_ks_p"] is None else f"{r['lognormal_ks_p']:.2f}"]
                     for r in rows],
                    [*notes, f"wrote {out} (use: latsim sweep --cost table:{out} ...; or a "
                     "law above: KS p small means it does not fit the jobs)"])

    emit(output, rows, table, seed=seed, out=str(out))


@commands.command("measure")
def measure(
    K: KsOpt = [4],  # noqa: B006
    generator: GeneratorOpt = "wan",
    preset: PresetOpt = None,
    resolution: ResolutionOpt = None,
    steps: StepsOpt = 4,
    policy: Annotated[str, typer.Option(help="baseline, speculative or both")] = "both",
    trace: TraceOpt = None,
    rate: RateOpt = 0.1,
    updates: UpdatesOpt = None,
    duration: DurationOpt = None,
    device: DeviceOpt = "cpu",
    out: Annotated[
        Path | None,
        typer.Option(help="parent folder: one run folder per (K, policy) inside; "
                     "default: a new one, named by its run id, in results/runs/"),
    ] = None,
    lead: Annotated[
        float | None,
        typer.Option(help="planning lead (s); default: q99 of warm-up and in-run calibration "
                     "jobs + max(10%, 5 ms, measured jitter: p99 slot-start lateness + p99 "
                     "dispatch delay) (LIVE in latsim.model.lead)"),
    ] = None,
    job_timeout: Annotated[
        float | None,
        typer.Option("--job-timeout",
                     help="a job running this long (s) has hung: the run fails and the "
                     "measurement stops; default max(10 x lead, lead + 5 s)"),
    ] = None,
    r: Annotated[
        int | None, typer.Option("--r", help="pixel frames per latent frame; default: the "
                                 "generator's VAE (wan 4, ltx 8), else 4")
    ] = None,
    fps: Annotated[float, typer.Option("--fps", help="video frames per second")] = 16.0,
    seed: SeedOpt = 0,
    decode: DecodeOpt = False,
    context: ContextOpt = 0,
    warmup: Annotated[int, typer.Option(help="timed warm-up jobs per K (lead, C samples)")] = 10,
    calibrate: Annotated[
        int, typer.Option(help="refills of the in-run calibration pass that sets the lead "
                          "(0: warm-up only)")
    ] = 8,
    threads: ThreadsOpt = None,
    cost: CostOpt = None,
    generator_option: GeneratorOptionOpt = None,
    format_name: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live run: a real generator (wan, ltx, sleep, ...) under latsim's controller.

    The controller runs on the wall clock; one run folder per (K, policy)."""
    from latsim.controller.policies import policy_names
    from latsim.errors import LatsimError

    output = output_format(format_name, as_json)
    trace, rate = updates_as_trace_and_rate(updates, trace, rate)
    _check_trace(trace)
    if device not in ("cpu", "cuda"):
        raise LatsimError(f"unknown device {device!r}; choose cpu or cuda")

    from harness.measure.run import MeasureConfig
    from harness.measure.run import measure as run_measure
    from latsim.plugins import load_generator

    load_generator(generator)  # an unknown or broken plug-in fails before any work
    config = MeasureConfig(
        generator=generator, cost=cost, generator_options=generator_options(generator_option),
        preset=preset, resolution=resolution, Ks=tuple(K), steps=steps,
        policies=tuple(policy_names(policy)), trace=None if trace is None else str(trace),
        rate=rate, duration=duration, device=device, out=None if out is None else str(out),
        lead=lead, r=r, fps=fps, seed=seed, decode=decode, context=context,
        warmup_timed=warmup, threads=threads, calibration_jobs=calibrate,
        job_timeout=job_timeout,
    )

    from latsim.cli.progress import ProgressBar

    with ProgressBar("measure") as bar:  # counts the live seconds of every run
        results = run_measure(config, progress=bar.status)
    def table() -> None:
        from latsim.cli.tables import Column, print_table

        columns = [Column("policy", justify="left"), Column("K"), Column("L50"),
                   Column("L95"), Column("stall %"), Column("C mean", 1), Column("lead", 1),
                   Column("busy %", 2), Column("kernel", 3), Column("calls", 3),
                   Column("shown", 1), Column("status", 0, "left"),
                   Column("folder", 4, "left")]
        body = []
        for res in results:
            s = res.summary
            status = s.get("status", "complete")
            body.append([s["policy"], str(s["K"]), fmt(s["L50"]), fmt(s["L95"]),
                         f"{s['stall_pct']:.2f}", f"{s['C_mean']:.4f}", f"{s['lead']:.4f}",
                         f"{s['busy_pct']:.1f}", fmt(s["kernel_activity"], 1),
                         str(s["dit_calls"]), f"{s['n_displayed']}/{s['n_conditions']}",
                         status if status == "complete" else f"{status}: {s['stop_reason']}",
                         str(res.run_dir)])
        print_table(f"measure: {generator} on {device} (seconds)", columns, body,
                    [f"run folders: {results[0].run_dir.parent}" if results else ""])

    emit(output, [res.summary for res in results], table, seed=seed,
         out=None if out is None else str(out))


# ---------------------------------------------------------------- serve / client

DelayOpt = Annotated[float, typer.Option(help="shaped one-way delay (s), application level")]
JitterOpt = Annotated[float, typer.Option(help="shaped delay jitter, uniform +- (s)")]
LossOpt = Annotated[float, typer.Option(help="shaped message loss probability (0-0.5; "
                                        "nothing is resent)")]


@commands.command("serve")
def serve(
    K: KsOpt = [4],  # noqa: B006
    generator: GeneratorOpt = "wan",
    preset: PresetOpt = None,
    resolution: ResolutionOpt = None,
    steps: StepsOpt = 4,
    device: DeviceOpt = "cpu",
    decode: DecodeOpt = False,
    context: ContextOpt = 0,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    cost: CostOpt = None,
    generator_option: GeneratorOptionOpt = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on (0: any free port)")] = 8765,
    schedule: Annotated[
        str, typer.Option(help="order of waiting jobs on the shared device: fifo, "
                          "least-slack, replan-first or a plug-in's (latsim plugins)")
    ] = "fifo",
    max_sessions: Annotated[int, typer.Option(help="viewer sessions at once (1-64)")] = 8,
    max_pending: Annotated[int, typer.Option(
        help="connections that have not said hello yet, held at once (1-4096)")] = 64,
    max_pending_per_address: Annotated[int | None, typer.Option(
        help="of them, from one client address (default 8, or --max-pending if fewer)")
    ] = None,
    max_duration: Annotated[
        float, typer.Option(help="longest session window a viewer may ask for (s)")
    ] = 3600.0,
    warmup: Annotated[int, typer.Option(help="timed warm-up jobs per K (default lead)")] = 10,
    delay: DelayOpt = 0.0,
    jitter: JitterOpt = 0.0,
    loss: LossOpt = 0.0,
    token: Annotated[str | None, typer.Option(
        envvar="LATSIM_TOKEN", show_envvar=True,
        help="viewers' shared secret, required at the handshake (?token=T or "
        "Authorization: Bearer T); needed to serve a non-loopback --host")] = None,
    allow_anonymous: Annotated[bool, typer.Option(
        "--allow-anonymous",  # no --no-allow-anonymous: its column would cut the help at 80
        help="serve a non-loopback --host without a token (prints a warning)")] = False,
    allow_origin: Annotated[list[str] | None, typer.Option(
        help="a browser Origin allowed to connect (repeat for more); default: any")] = None,
    max_condition_rate: Annotated[float, typer.Option(
        help="conditions one session may send per second; more are refused")] = 20.0,
    max_fps: Annotated[float, typer.Option(
        help="the highest frame rate a viewer may ask for")] = 60.0,
    job_timeout: Annotated[float | None, typer.Option(
        "--job-timeout", help="a session's job running this long (s) has hung: that session "
        "fails (error, then end); default max(10 x lead, lead + 5 s)")] = None,
    out: Annotated[Path | None, typer.Option(
        help="write a server-side run folder per session (its controller's records) and "
             "the shared device's tasks (tasks.csv) here")] = None,
) -> None:
    """Live server: a generator and the controller behind a WebSocket endpoint.

    One session per viewer (latsim client), all sharing the device; runs until Ctrl-C.
    With --out DIR, each session's server side is a run folder DIR/SESSION (kind served)
    and DIR/tasks.csv holds every job the shared device ran.
    """
    require_live_extra("serve", ("websockets",))
    import logging

    from harness.generators.device import require_device
    from harness.net.netclock import Shaper
    from harness.serve.config import ServerConfig
    from harness.serve.server import StreamServer
    from latsim.plugins import load_generator

    load_generator(generator)
    config = ServerConfig(
        _generator_config(preset, resolution, steps, context, decode, device, seed, threads,
                          cost, generator_option),
        generator_name=generator, Ks=tuple(K), host=host, port=port, schedule=schedule,
        max_sessions=max_sessions, max_pending=max_pending,
        max_pending_per_address=max_pending_per_address, max_duration=max_duration,
        warmup=warmup,
        downlink=Shaper(delay, jitter, loss), token=token, allow_anonymous=allow_anonymous,
        origins=None if not allow_origin else tuple(allow_origin),
        max_condition_rate=max_condition_rate, max_fps=max_fps, job_timeout=job_timeout,
        out=out)
    if out is not None:
        from harness.serve.server import claim_serve_folder
        from latsim.run.files import check_writable

        check_writable(out, keep=True)  # before the model is built and warmed up
        claim_serve_folder(out)
    from harness.live.faults import faults_from_env
    from harness.serve.config import loopback

    faults_from_env()  # a malformed LATSIM_FAULT fails before any work

    if token is None and not loopback(host):
        typer.echo(fit(f"latsim serve: warning: serving {host} to anyone who can reach it "
                       "(no token, --allow-anonymous)"), err=True)
    require_device(device)
    _check_listen(host, port)  # before the model is built and warmed up
    logging.basicConfig(level=logging.WARNING, handlers=[_log_handler()])
    logging.getLogger("latsim.serve").setLevel(logging.INFO)  # sessions starting, ending
    server = StreamServer(config)
    with StatusLine(width=40) as status:
        server.prepare(status)
    for k, choice in sorted(server.leads.items()):
        typer.echo(fit(f"K={k}: lead {choice.lead:.4f} s ({choice.source})"))
    import asyncio

    def listening(bound: int) -> None:
        typer.echo(fit(f"serving generator {server.info.name} ({server.info.label}) on "
                       f"ws://{host}:{bound} (schedule {schedule}; Ctrl-C stops)"))
        typer.echo(f"browser viewer: http://{host}:{bound}/")

    try:  # Ctrl-C or SIGTERM: every viewer gets ``end``, then the server stops
        asyncio.run(server.serve(listening, handle_signals=True))
        typer.echo(fit(f"latsim serve: stopped ({server.refused} connection(s) refused, "
                       f"{server.errors} message(s) answered with an error)"), err=True)
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        typer.echo("latsim serve: stopped", err=True)
    except OSError as exc:
        raise LatsimError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        server.close()


def _log_handler() -> logging.Handler:
    """``latsim serve``'s log on stderr: each record stamped and wrapped to the terminal's
    columns (:func:`latsim.formatting.fit`)."""
    import logging

    class Fitted(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return fit(super().format(record))

    handler = logging.StreamHandler()
    handler.setFormatter(Fitted("latsim serve: %(asctime)s.%(msecs)03d %(message)s",
                                datefmt="%Y-%m-%dT%H:%M:%S"))
    return handler


def _check_listen(host: str, port: int) -> None:
    """A one-line error now if ``host:port`` cannot be listened on (a foreign address, a
    port in use), instead of after the warm-up."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise LatsimError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@commands.command("client")
def client(
    url: Annotated[str, typer.Argument(help="the server, ws://HOST:PORT")],
    out: Annotated[Path, typer.Option(help="run folder to write")],
    trace: TraceOpt = None,
    rate: RateOpt = 0.1,
    updates: UpdatesOpt = None,
    duration: DurationOpt = None,
    K: Annotated[int, typer.Option("--K", help="chunk size (one the server warmed up)")] = 4,
    policy: Annotated[str, typer.Option(help="baseline or speculative")] = "speculative",
    lead: Annotated[
        float | None, typer.Option(help="planning lead (s); default: the server's")
    ] = None,
    drain: Annotated[
        float | None, typer.Option(help="seconds past the window to finish open conditions")
    ] = None,
    playout_delay: Annotated[
        float, typer.Option("--playout-delay", help="client playout delay D (s)")
    ] = 0.1,
    r: Annotated[int, typer.Option("--r", help="pixel frames per latent frame")] = 4,
    fps: Annotated[float, typer.Option("--fps", help="video frames per second")] = 16.0,
    delay: DelayOpt = 0.0,
    jitter: JitterOpt = 0.0,
    loss: LossOpt = 0.0,
    seed: SeedOpt = 0,
    format_name: FormatOpt = None,
    as_json: JsonOpt = False,
    token: Annotated[str | None, typer.Option(
        envvar="LATSIM_TOKEN", show_envvar=True,
        help="the server's --token (sent as Authorization: Bearer)")] = None,
) -> None:
    """Viewer client: measures L from send to display against latsim serve.

    Min-RTT clock alignment, conditions on the trace's timeline, a playout buffer with
    delay D; L on the client's clock. The shaping (--delay/--jitter/--loss) applies to
    both directions.
    """
    output = output_format(format_name, as_json)
    require_live_extra("client", ("websockets",))
    from latsim.controller.policies import PRESETS
    from latsim.errors import check_option

    if policy not in PRESETS:
        raise LatsimError(f"--policy must be one of {', '.join(PRESETS)}, got {policy!r}")
    check_option("--K", K)
    trace, rate = updates_as_trace_and_rate(updates, trace, rate)
    _check_trace(trace)
    from harness.measure.run import trace_and_window
    from harness.net.netclock import Shaper
    from harness.viewer.client import ClientConfig, run_client

    for option, value in (("--rate", rate), ("--duration", duration), ("--seed", seed),
                          ("--r", r), ("--fps", fps), ("--lead", lead), ("--drain", drain)):
        check_option(option, value)
    loaded, window = trace_and_window(trace, rate, duration, seed, r, fps)
    shaper = Shaper(delay, jitter, loss)
    config = ClientConfig(url, loaded, out, K=K, policy=policy, duration=window, lead=lead,
                          drain=drain, playout_delay=playout_delay, r=r, fps=fps,
                          uplink=shaper, seed=seed, token=token)
    from harness.live.driver import sigterm_as_interrupt
    from latsim.errors import Interrupted

    try:
        with sigterm_as_interrupt(), StatusLine() as status:
            summary = run_client(config, progress=status if output == "table" else None)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the folder was written, interrupted
        raise Interrupted(f"kept what was measured in {out} (status interrupted)") from None
    if output != "table":
        emit(output, [summary], lambda: None, seed=seed, out=str(out))
    else:
        typer.echo(fit(
            f"{out}: {summary['status']} K={K} {policy} L50={fmt(summary['L50'])} "
            f"L95={fmt(summary['L95'])} viewer stall={summary['viewer_stall_pct']:.2f}% "
            f"(client {summary['client_stall_pct']:.2f}%) shown={summary['n_displayed']}/"
            f"{summary['n_conditions']} offset={summary['offset']:+.6f} s "
            f"+-{summary['offset_uncertainty']:.6f} drift={fmt(summary['drift'], 6)} "
            f"uplink={fmt(summary['uplink_mean'])} deliver={fmt(summary['deliver_mean'])}"))
    _exit_for_status(summary, out)


#: ``latsim client``'s exit status for a session the server ended early or that was cut
#: off (status ``interrupted``); a session the server failed exits 2 (a one-line error).
EXIT_INTERRUPTED = 3


def _exit_for_status(summary: dict, out: Path) -> None:
    """Exit 0 only for a complete session, so that a script can tell the three apart."""
    from latsim.errors import LatsimError
    from latsim.run.folder import COMPLETE, FAILED

    status, reason = summary["status"], summary["stop_reason"]
    if status == FAILED:
        raise LatsimError(f"the server failed session {summary['session']}: {reason}; kept "
                          f"what was measured in {out} (status failed)")
    if status != COMPLETE:
        typer.echo(fit(f"latsim client: the session ended early ({reason}); kept what was "
                       f"measured in {out} (status {status})"), err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
