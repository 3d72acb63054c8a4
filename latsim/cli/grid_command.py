"""``latsim grid``: a design-space grid from a file, on any scheduler, resumable.

Only typer is imported at module level; the experiment loads inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from latsim.cli.options import JobsOpt, SchedulerOpt
from latsim.cli.output import FormatOpt, JsonOpt, emit, output_format
from latsim.errors import Interrupted, install_hint


def grid(
    experiment_file: Annotated[Path, typer.Argument(help="the grid (TOML): axes, fixed "
                                                    "settings, seeds, metrics")],
    out: Annotated[Path, typer.Option(help="output folder (resumes a grid already there)")],
    jobs: JobsOpt = None,
    scheduler: SchedulerOpt = "local",
    fmt: FormatOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a design-space grid from a TOML file; resumable.

    One row per cell goes to cells.csv and cells.parquet; an interrupted grid resumes
    where it stopped when the same command runs again.
    """
    from latsim.experiments.engine import check_jobs
    from latsim.experiments.executors import check_scheduler
    from latsim.experiments.grid import load_grid, run_grid

    output = output_format(fmt, as_json)
    check_scheduler(scheduler)
    workers = check_jobs(jobs)
    spec = load_grid(experiment_file)
    from latsim.cli.progress import ProgressBar

    try:
        with ProgressBar(f"grid {spec.name} (cells)", delay_s=0.0) as progress:
            result = run_grid(spec, out, scheduler, workers, progress)
    except KeyboardInterrupt:
        raise Interrupted(f"grid interrupted; the finished cells are in {out}/cells.csv "
                          "(partial); run the same command to resume") from None
    tables = ("cells.csv, cells.parquet" if result.parquet else
              f"cells.csv (cells.parquet needs pyarrow: {install_hint('dask')})")

    def table() -> None:
        from latsim.formatting import fit

        typer.echo(fit(f"{spec.name}: {len(result.rows)}/{spec.n_cells} cells ({result.ran} "
                       f"run now, {len(result.rows) - result.ran} resumed) -> {out}/{tables}"))

    emit(output, result.rows, table, seed=spec.seed, grid=spec.name, n_cells=spec.n_cells,
         ran=result.ran, resumed=len(result.rows) - result.ran, out=str(out))


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("grid")(grid)
