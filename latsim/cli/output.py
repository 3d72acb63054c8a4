"""What a command prints as its result: a table, CSV or the JSON envelope (``--format``).

Every command's machine output is one JSON object, the envelope (docs/envelope.md)::

    {"latsim": "0.1.0", "envelope": 1, "command": ["latsim", "sweep", ...],
     "created": "2026-12-01T19:20:00Z", "seed": 0, "rows": [...], ...}

``rows`` is always a list of flat-keyed objects, one per result row (a command with
several tables puts its headline table there and all of them under ``tables``); keys are
in seconds unless their name carries a unit (``_pct``, ``_ms``, ``_bytes``, ...).
``--format csv`` prints ``rows`` as CSV with nested objects spread into ``key.sub``
columns. ``created`` honours ``SOURCE_DATE_EPOCH``, so an output can be made byte for byte
again. Only typer at module level.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from latsim.cli.completion import choices
from latsim.errors import LatsimError

#: Bumped when a key of the envelope changes meaning or goes away (adding keys does not).
ENVELOPE_VERSION = 1
FORMATS = ("table", "csv", "json")

FormatOpt = Annotated[str | None, typer.Option(
    "--format", help="table (default), csv (the rows) or json (the envelope, "
    "docs/envelope.md)", metavar="table|csv|json", autocompletion=choices(*FORMATS))]
JsonOpt = Annotated[bool, typer.Option("--json", help="the same as --format json")]

#: The command line being run, set by the ``latsim`` entry point before a command starts.
_invocation: list[str] = []


def set_invocation(argv: list[str]) -> None:
    """Record the arguments ``latsim`` was called with (the envelope's ``command``)."""
    _invocation[:] = ["latsim", *argv]


def claims(command: str, out: Any, files: tuple[str, ...], record: str) -> None:
    """Refuse ``out`` where writing ``files`` would replace what another wrote
    (:func:`latsim.run.folder.claim_folder`): its ``record`` must be an envelope
    (:func:`envelope`) that ``latsim COMMAND`` wrote."""
    from latsim.run.folder import claim_folder

    def wrote(payload: Any) -> bool:
        said = payload.get("command")
        return isinstance(said, list) and said[:2] == ["latsim", command]

    claim_folder(out, files, record, f"latsim {command}", wrote)


def output_format(fmt: str | None, as_json: bool) -> str:
    """The format asked for: ``--format``, or ``json`` for ``--json``; a clash or an
    unknown name is a one-line error."""
    if fmt is not None and fmt not in FORMATS:
        raise LatsimError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if as_json and fmt not in (None, "json"):
        raise LatsimError(f"--json asks for json but --format says {fmt}; give one")
    return "json" if as_json else fmt or "table"


def created() -> str:
    """Now in UTC as ISO 8601 (seconds), or ``SOURCE_DATE_EPOCH`` where it is set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        if not epoch.isascii() or not epoch.isdigit():
            raise LatsimError(f"SOURCE_DATE_EPOCH must be whole seconds, got {epoch!r}")
        moment = datetime.fromtimestamp(int(epoch), UTC)
    else:
        moment = datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def envelope(rows: list[dict], seed: int | None = None, **extra: Any) -> dict:
    """The envelope around ``rows``; ``extra`` are the command's own keys (they may not
    reuse the envelope's)."""
    from latsim import __version__

    head = {"latsim": __version__, "envelope": ENVELOPE_VERSION,
            "command": list(_invocation) or ["latsim"], "created": created(), "seed": seed,
            "rows": list(rows)}
    clash = sorted(set(head) & set(extra))
    if clash:
        raise ValueError(f"envelope keys {clash} given as command keys")
    return head | extra


def emit(fmt: str, rows: list[dict], table: Callable[[], None], seed: int | None = None,
         **extra: Any) -> None:
    """Print the result in ``fmt``: ``table()`` draws the table; csv prints ``rows``;
    json prints the envelope."""
    if fmt == "table":
        table()
    elif fmt == "csv":
        from latsim.run.files import rows_csv

        rows_csv(sys.stdout, rows)
    else:
        from latsim.run.files import dumps

        typer.echo(dumps(envelope(rows, seed, **extra)))
