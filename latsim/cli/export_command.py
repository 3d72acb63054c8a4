"""``latsim export perfetto``: a run folder as a Chrome/Perfetto trace (registered on the main
app; the conversion loads inside the command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.errors import DEFAULT_MAX_EXPORT_RECORDS
from latsim.formatting import fit

export_app = typer.Typer(help="Run folders in other tools' formats.", no_args_is_help=True)


@export_app.command("perfetto")
def perfetto(
    run_dir: Annotated[Path, typer.Argument(
        help="a run folder (simulated, measured, serving, a served session, or a client's)")],
    out: Annotated[Path, typer.Option(help="the trace-event JSON to write")],
    server: Annotated[Path | None, typer.Option(
        help="with a client folder: its server's session folder, or the folder latsim serve "
             "--out wrote (the session is found by its id)")] = None,
    max_records: Annotated[int, typer.Option(
        help="work bound: record rows read (every exported table of the folders "
             "together, 1 to 100,000,000); checked before reading")
    ] = DEFAULT_MAX_EXPORT_RECORDS,
) -> None:
    """Devices, playback, stalls and condition lifetimes (R/C/Q) as a trace for
    ui.perfetto.dev or chrome://tracing. A client folder shows both sides of its session:
    the server's (from --server's folder, else as the client was told) and the viewer's
    own clock, the offset and its bound in the metadata. A folder whose record tables hold
    more than --max-records rows is refused before it is read (a trace of them would be
    too large to open)."""
    from latsim.run.folder import write_json
    from latsim.viz.perfetto import client_trace, perfetto_trace

    trace = (perfetto_trace(run_dir, max_records) if server is None
             else client_trace(run_dir, server, max_records))
    write_json(out, trace)
    meta = trace["metadata"]
    status = "" if meta["status"] == "complete" else f"; status {meta['status']}"
    typer.echo(fit(f"wrote {out} ({len(trace['traceEvents'])} events{status}); open it "
                   "in https://ui.perfetto.dev"), err=True)  # stdout may be the trace itself
    for note in meta.get("notes", ()):
        typer.echo(f"latsim: note: {note}", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
