"""Design-space grids: ``latsim grid EXPERIMENT.toml --out DIR``.

A grid file names axes (each a list of values), fixed settings, replications and metrics::

    name = "K x update rate"
    seeds = 10                 # replications per cell
    seed = 0                   # root seed (every cell uses it: common random numbers)
    metrics = ["L50", "L95", "stall_pct", "w"]

    [fixed]
    duration = 300
    cost = "affine:0.14725,0.16275"

    [axes]
    K = [4, 8, 21]
    policy = ["baseline", "speculative"]
    rate = [0.05, 0.1, 0.2]

Settings (:data:`SETTINGS`) are those of ``latsim simulate``: ``K``, ``policy``, ``cost`` or
``C`` (``fixed:C``), ``updates`` or ``rate`` (``poisson:RATE``), ``lead``, ``pilot``, ``q``,
``duration``, ``r``, ``fps``, ``commit``, ``commit_lead``, and the serving model's
``streams``, ``pools``, ``schedule``, ``discard``, ``bind``, ``playout_delay``, ``decode``,
``deliver``, ``uplink``, ``replan_cost``, ``batch``, ``start``, ``dit_degree``, ``in_flight``,
``in_flight_policy``, ``cold_start``, ``run_ahead`` and ``replan_at_cache_end``
(:data:`NOT_SETTINGS` says why the other options are not settings). A cell is one point of
the axes' product (in file order, the last axis fastest); it runs ``seeds`` replications of
one (K, policy) and gives one row: the cell's settings, then the metrics of its summary
row (:func:`latsim.experiments.engine.run_experiment`), each beside its standard error over
the replications (``{metric}_se``), then their number (``n_runs``). Where ``A`` is among the
metrics (it is by default), a speculative cell also runs the baseline on the same arrivals
to measure it (``Experiment.twin``); without ``A`` it runs its own policy alone.

**Output.** ``DIR/grid.json`` (the grid, its hash, status), ``DIR/cells.jsonl`` (one line
per finished cell, appended as results stream back), and ``DIR/cells.csv`` and
``DIR/cells.parquet`` (every finished cell in cell order, rewritten at the end and when
the run is interrupted). A run that is interrupted says ``partial``; run the same command
again and it resumes: cells already in ``cells.jsonl`` are not run again. A ``DIR`` holding
another grid is an error.

**Schedulers.** Cells go in batches (big enough that scheduling stays small beside the
work) to the work pool of :mod:`latsim.experiments.executors`. A cell's random streams come
from the grid's seed alone, and rows are written in cell order, so the same file gives the
same bytes on every scheduler and any number of workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from latsim.errors import MAX_INPUT_BYTES, LatsimError, check_int
from latsim.experiments.executors import LOCAL, local_only, work_pool
from latsim.model.traces import loads_toml, paths_from_folder
from latsim.run.files import clean
from latsim.run.record_files import read_file_bytes
from latsim.writing import appending, replacing

#: Version 2: each metric has its standard error (``{metric}_se``) and a row its ``n_runs``.
FORMAT = "latsim-grid/2"
MAX_CELLS = 100_000
#: Experiment settings a grid may fix or vary, and their types.
SETTINGS: dict[str, type | tuple[type, ...]] = {
    "K": int, "policy": str, "cost": str, "C": (int, float), "updates": str,
    "rate": (int, float), "lead": (int, float, str), "q": int, "duration": (int, float),
    "r": int, "fps": (int, float), "commit": str, "commit_lead": (int, float),
    "streams": int, "pools": str, "schedule": str, "discard": str, "bind": str,
    "playout_delay": (int, float), "decode": str, "deliver": str, "uplink": str,
    "replan_cost": str, "batch": str, "start": str, "dit_degree": int,
    "in_flight": int, "in_flight_policy": str, "cold_start": bool, "run_ahead": (int, float),
    "replan_at_cache_end": str, "pilot": str,
}
SERVING = ("streams", "pools", "schedule", "discard", "bind", "playout_delay", "decode", "deliver",
           "uplink", "replan_cost", "batch", "start", "dit_degree", "in_flight",
           "in_flight_policy", "cold_start")
#: ``latsim simulate`` options a grid has no setting for, and why.
NOT_SETTINGS: dict[str, str] = {
    "seeds": "the grid's own seeds key (every cell runs that many replications)",
    "seed": "the grid's own seed key (common random numbers across cells)",
    "as_json": "output: a grid writes cells.csv, cells.jsonl and cells.parquet (latsim grid "
               "--format prints them)",
    "fmt": "output: a grid writes cells.csv, cells.jsonl and cells.parquet (latsim grid "
           "--format prints them)",
    "out": "output: latsim grid --out",
    "jobs": "where cells run: latsim grid --jobs",
    "scheduler": "where cells run: latsim grid --scheduler",
    "max_events": "each cell keeps simulate's default work bound",
    "serving": "a grid names the serving settings themselves",
    "records": "a grid keeps no records: a cell's row is its summary (--records none)",
}
DEFAULT_METRICS = ("n_conditions", "L_mean", "L50", "L95", "stall_pct", "w", "A",
                   "busy_pct", "dit_calls")
PARTIAL, COMPLETE, RUNNING = "partial", "complete", "running"


@dataclass(frozen=True)
class GridSpec:
    """A grid: axes (name -> values, file order), fixed settings, replications, metrics."""

    name: str
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    fixed: tuple[tuple[str, Any], ...]
    seeds: int
    seed: int
    metrics: tuple[str, ...]

    @property
    def n_cells(self) -> int:
        return math.prod(len(values) for _, values in self.axes)

    def cell(self, index: int) -> dict[str, Any]:
        """The settings of cell ``index`` (the last axis varies fastest)."""
        settings: dict[str, Any] = {}
        for name, values in reversed(self.axes):
            index, position = divmod(index, len(values))
            settings[name] = values[position]
        return {name: settings[name] for name, _ in self.axes}

    def payload(self) -> dict[str, Any]:
        return {"name": self.name, "axes": {k: list(v) for k, v in self.axes},
                "fixed": dict(self.fixed), "seeds": self.seeds, "seed": self.seed,
                "metrics": list(self.metrics)}

    @property
    def digest(self) -> str:
        text = json.dumps(self.payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _setting(where: str, name: str, value: Any) -> Any:
    kind = SETTINGS.get(name)
    if kind is None:
        raise LatsimError(f"{where}: unknown setting {name!r}; settings: "
                          f"{', '.join(SETTINGS)}")
    if (isinstance(value, bool) != (kind is bool)) or not isinstance(value, kind):
        raise LatsimError(f"{where}: {name} = {value!r} is not a {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return "number" if isinstance(kind, tuple) else {int: "integer", str: "string",
                                                     bool: "boolean"}[kind]


def parse_grid(text: str, source: str = "grid", folder: Path | None = None) -> GridSpec:
    """A grid from TOML text (every key checked; a one-line error names what is wrong);
    ``folder``: the folder of the file it was read from, which its relative file paths are
    read from (:func:`~latsim.model.traces.paths_from_folder`)."""
    data = loads_toml(text, source)
    if folder is not None:
        data = paths_from_folder(data, folder, source)
    unknown = set(data) - {"name", "seeds", "seed", "metrics", "fixed", "axes"}
    if unknown:
        raise LatsimError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; a grid has "
                          "name, seeds, seed, metrics, [fixed] and [axes]")
    axes_table = data.get("axes")
    if not isinstance(axes_table, dict) or not axes_table:
        raise LatsimError(f"{source}: [axes] needs at least one setting with a list of values")
    axes = []
    for name, values in axes_table.items():
        if not isinstance(values, list) or not values:
            raise LatsimError(f"{source}: axes.{name} must be a non-empty list")
        if len(set(map(repr, values))) != len(values):
            raise LatsimError(f"{source}: axes.{name} repeats a value")
        axes.append((name, tuple(_setting(f"{source}: axes", name, v) for v in values)))
    fixed_table = data.get("fixed", {})
    if not isinstance(fixed_table, dict):
        raise LatsimError(f"{source}: [fixed] must be a table")
    fixed = tuple((name, _setting(f"{source}: fixed", name, value))
                  for name, value in fixed_table.items())
    both = {n for n, _ in axes} & {n for n, _ in fixed}
    if both:
        raise LatsimError(f"{source}: {', '.join(sorted(both))} is both an axis and fixed")
    names = {n for n, _ in axes} | {n for n, _ in fixed}
    for one, other in (("C", "cost"), ("rate", "updates")):
        if one in names and other in names:
            raise LatsimError(f"{source}: give {one} or {other}, not both")
    if "K" not in names:
        raise LatsimError(f"{source}: K must be an axis or fixed")
    metrics = data.get("metrics", list(DEFAULT_METRICS))
    if (not isinstance(metrics, list) or not metrics
            or not all(isinstance(m, str) for m in metrics)):
        raise LatsimError(f"{source}: metrics must be a non-empty list of names")
    seeds = data.get("seeds", 10)
    seed = data.get("seed", 0)
    for key, value, high in (("seeds", seeds, 10_000), ("seed", seed, 2**32 - 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise LatsimError(f"{source}: {key} must be an integer, got {value!r}")
        check_int(key, value, 0 if key == "seed" else 1, high)
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise LatsimError(f"{source}: name must be a non-empty string, got {name!r}"[:200])
    spec = GridSpec(name, tuple(axes), fixed, seeds, seed, tuple(metrics))
    if spec.n_cells > MAX_CELLS:
        raise LatsimError(f"{source}: {spec.n_cells} cells; a grid has at most {MAX_CELLS}")
    experiment(spec, 0)  # the first cell's settings must make an experiment
    return spec


def load_grid(path: str | Path) -> GridSpec:
    from latsim.model.traces import read_input_file

    return parse_grid(read_input_file(path, "grid file"), str(path), Path(path).parent)


def experiment(spec: GridSpec, index: int):  # Experiment (lazy import)
    """The :class:`~latsim.experiments.engine.Experiment` of cell ``index``."""
    from latsim.experiments.engine import Experiment
    from latsim.model.serving import build_serving

    settings = {**dict(spec.fixed), **spec.cell(index)}
    serving = {k: settings.pop(k) for k in SERVING if k in settings}
    serving_config = build_serving(None, **serving)[0] if serving else None
    if "C" in settings:
        settings["cost"] = f"fixed:{settings.pop('C')!r}"
    if "rate" in settings:
        settings["updates"] = f"poisson:{settings.pop('rate')!r}"
    policy = settings.pop("policy", "speculative")
    K = settings.pop("K")
    # A is measured against the baseline on the same arrivals: a cell asks for it only
    # where A is among its metrics
    return Experiment(Ks=(K,), policies=(policy,), seeds=spec.seeds, seed=spec.seed,
                      serving=serving_config, records="none", twin="A" in spec.metrics,
                      **settings)


def check_cells(spec: GridSpec) -> None:
    """Every cell's settings make an experiment within its work bound (about 30 µs a cell:
    3 s for the largest grid), and every metric is in its summary, or a one-line error
    naming the first cell (or the metrics) that do not."""
    from latsim.experiments.engine import plan

    plans = []
    for index in range(spec.n_cells):
        try:
            plans.append(plan(experiment(spec, index)))
        except LatsimError as exc:
            settings = ", ".join(f"{k}={v!r}" for k, v in spec.cell(index).items())
            raise LatsimError(f"cell {index} ({settings}): {exc}") from None
    # a cell's summary keys depend on its kind (one worker or the serving model, and
    # whether --lead auto reports its wait): one short probe run of each kind
    kinds: dict[tuple[bool, bool], int] = {}
    for index, p in enumerate(plans):
        kinds.setdefault((p.serving is not None, bool(p.auto_leads)), index)
    for index in kinds.values():
        keys = _probe_keys(spec, index)
        missing = [m for m in spec.metrics if m not in keys]
        if missing:
            raise LatsimError(f"unknown metric(s) {', '.join(missing)}; a cell's summary has "
                              f"{', '.join(keys)}")


def _probe_keys(spec: GridSpec, index: int) -> tuple[str, ...]:
    """The summary keys of cell ``index``'s kind, from one replication of one chunk's
    length with one stream (the keys do not depend on the length or the stream count)."""
    from dataclasses import replace

    from latsim.experiments.engine import plan, run_experiment

    cell = experiment(spec, index)
    serving = None if cell.serving is None else replace(cell.serving, streams=1)
    probe = replace(cell, seeds=1, serving=serving)
    T = plan(probe).cells[0].timing.T
    with local_only():
        summary = run_experiment(replace(probe, duration=T), jobs=1).rows[0]
    return tuple(k for k, v in summary.items() if not isinstance(v, dict))


def run_cells(work: tuple[GridSpec, tuple[int, ...]]) -> list[tuple[int, dict]]:
    """Worker side: the summary rows of a batch of cells (top-level: picklable)."""
    from latsim.experiments.engine import run_experiment

    spec, cells = work
    out = []
    with local_only():
        for index in cells:
            result = run_experiment(experiment(spec, index), jobs=1)
            out.append((index, _with_errors(spec, result)))
    return out


def _with_errors(spec: GridSpec, result) -> dict:
    """The cell's summary row with each metric's standard error over its replications
    (``{metric}_se``, None with one replication or a metric missing from one) and their
    number (``n_runs``)."""
    from latsim.experiments.engine import replication_rows

    summary = dict(result.rows[0])
    per_run = replication_rows(result)
    for metric in spec.metrics:
        values = [row.get(metric) for row in per_run]
        numbers = [float(v) for v in values if isinstance(v, int | float)
                   and not isinstance(v, bool) and math.isfinite(v)]
        summary[f"{metric}_se"] = (
            float(np.std(numbers, ddof=1) / math.sqrt(len(numbers)))
            if len(numbers) > 1 and len(numbers) == len(values) else None)
    summary["n_runs"] = len(per_run)
    return summary


# ---------------------------------------------------------------- the run


@dataclass(frozen=True)
class GridResult:
    spec: GridSpec
    out: Path
    rows: list[dict]  # every finished cell, in cell order
    ran: int  # cells run by this call (the rest were resumed)
    status: str
    parquet: bool = True  # cells.parquet written (pyarrow installed)


def _row(spec: GridSpec, index: int, summary: dict) -> dict:
    missing = [m for m in spec.metrics if m not in summary]
    if missing:
        raise LatsimError(f"unknown metric(s) {', '.join(missing)}; a cell's summary has "
                          f"{', '.join(k for k in summary if not isinstance(summary[k], dict))}")
    row = {"cell": index, **spec.cell(index),
           **{key: summary.get(key) for m in spec.metrics for key in (m, f"{m}_se")},
           "n_runs": summary.get("n_runs")}
    # as JSON gives it back on a resume (numpy scalars as numbers, NaN as null), so a
    # resumed grid writes the same bytes as one that ran straight through
    return json.loads(json.dumps(clean(row), allow_nan=False, default=_plain))


def _row_keys(spec: GridSpec) -> tuple[str, ...]:
    """A cell row's keys besides ``cell`` and its settings."""
    return (*(key for m in spec.metrics for key in (m, f"{m}_se")), "n_runs")


def _plain(value: object) -> object:
    item = getattr(value, "item", None)  # a numpy scalar
    if item is None:
        raise TypeError(f"a grid metric must be a number, text or list, got {value!r}")
    return item()


def _ends_a_line(path: Path) -> bool:
    """Whether the file at ``path`` (read whole by :func:`_read_done` already) is empty or
    ends with a newline: its last byte alone."""
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        if not size:
            return True
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def _read_done(path: Path, spec: GridSpec) -> dict[int, dict]:
    """Finished cells of an earlier run of ``spec``: a torn last line (a kill) is dropped;
    any other line that is not one of this grid's cells (not JSON, another shape, a cell
    out of range or with other settings) is a one-line error, before anything is
    written, so a resume never rewrites the tables from a damaged file."""
    done: dict[int, dict] = {}
    if not path.exists():
        return done
    try:
        text = read_file_bytes(path).decode("utf-8")  # a regular file, bounded
    except (OSError, UnicodeDecodeError) as exc:
        raise LatsimError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}; "
                          "use another --out") from None
    lines = text.splitlines()
    torn = bool(text) and not text.endswith("\n")
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if torn and number == len(lines):
                continue  # the line a killed run was writing
            raise LatsimError(f"{path}:{number}: not a JSON line; use another --out") from None
        cell = row.get("cell") if isinstance(row, dict) else None
        ok = (type(cell) is int and 0 <= cell < spec.n_cells
              and set(row) == {"cell", *spec.cell(cell), *_row_keys(spec)}
              and all(row[k] == v for k, v in spec.cell(cell).items()))
        if not ok:
            raise LatsimError(f"{path}:{number}: not a cell of this grid; use another --out")
        done[cell] = row
    return done


def _write_tables(out: Path, rows: list[dict]) -> bool:
    """cells.csv, and cells.parquet where pyarrow is installed (returns whether it was)."""
    from latsim.run.files import write_rows_csv

    write_rows_csv(out / "cells.csv", rows)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (out / "cells.parquet").unlink(missing_ok=True)  # never a stale one beside the CSV
        return False
    columns = {key: [row.get(key) for row in rows] for key in (rows[0] if rows else {})}
    with replacing(out / "cells.parquet") as tmp:  # pyarrow's errors name no file
        pq.write_table(pa.table(columns), tmp)
    return True


def _batches(todo: list[int], workers: int) -> list[tuple[int, ...]]:
    """Consecutive cells per batch: about four batches per worker, at most 128 cells (a
    batch is also what an interruption can lose: it comes back whole or not at all)."""
    if not todo:
        return []
    size = max(1, min(128, math.ceil(len(todo) / (4 * workers))))
    return [tuple(todo[i:i + size]) for i in range(0, len(todo), size)]


def run_grid(spec: GridSpec, out: Path, scheduler: str = LOCAL, jobs: int = 1,
             progress: Callable[[int, int], None] | None = None) -> GridResult:
    """Run every cell not already in ``out`` (see the module docstring). Every cell's
    settings and work bound are checked before anything is written."""
    from latsim.run.folder import claim_folder, of_format, write_json, writer_alive

    check_cells(spec)
    out.mkdir(parents=True, exist_ok=True)
    meta_path, lines_path = out / "grid.json", out / "cells.jsonl"
    if meta_path.exists():
        record = read_file_bytes(meta_path, MAX_INPUT_BYTES)  # a regular file, bounded
        try:
            earlier = json.loads(record.decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # a truncated or foreign file
            raise LatsimError(f"{meta_path}: not a grid's record ({type(exc).__name__}); "
                              "use another --out") from None
        if not isinstance(earlier, dict):
            raise LatsimError(f"{meta_path}: not a grid's record; use another --out")
        if earlier.get("format") != FORMAT:
            raise LatsimError(f"{meta_path}: a grid of format {earlier.get('format')!r}, not "
                              f"{FORMAT} (its rows lack the standard errors); use another "
                              "--out")
        if earlier.get("digest") != spec.digest:
            raise LatsimError(f"{out} holds another grid ({earlier.get('name')!r}, "
                              f"digest {earlier.get('digest')}); use another --out")
        writer = earlier.get("writer") or {}
        if earlier.get("status") == RUNNING and writer_alive(earlier):
            raise LatsimError(f"{out}: process {writer.get('pid')} on this host is still "
                              "running this grid; wait for it, or stop it before resuming")
    for name in ("grid.json", "cells.jsonl", "cells.csv", "cells.parquet"):
        target = out / name  # the grid's own files: refused before any is written
        if (target.exists() or target.is_symlink()) and not target.is_file():
            raise LatsimError(f"{target}: not a regular file (a device, pipe or folder) "
                              "where the grid keeps its own; use another --out")
    # and none of them someone else's (a cells.csv with no grid.json beside it)
    claim_folder(out, ("grid.json", "cells.jsonl", "cells.csv", "cells.parquet"),
                 "grid.json", "latsim grid", of_format(FORMAT))
    done = _read_done(lines_path, spec)
    meta = {"format": FORMAT, **spec.payload(), "digest": spec.digest,
            "n_cells": spec.n_cells, "scheduler": scheduler}

    written = {"parquet": False}

    def save(status: str) -> list[dict]:
        """The tables, then the status; where the tables cannot be written, the status
        says partial (a best effort: the disk may be full)."""
        rows = [done[i] for i in sorted(done)]
        try:
            written["parquet"] = _write_tables(out, rows)
        except BaseException:
            with contextlib.suppress(LatsimError):
                write_json(meta_path, {**meta, "status": PARTIAL, "done": len(done)})
            raise
        write_json(meta_path, {**meta, "status": status, "done": len(done)})
        return rows

    write_json(meta_path, {**meta, "status": RUNNING, "done": len(done)})
    todo = [i for i in range(spec.n_cells) if i not in done]
    resumed = len(done)
    if progress is not None:
        progress(len(done), spec.n_cells)
    status = PARTIAL
    try:
        if todo:
            torn = lines_path.exists() and not _ends_a_line(lines_path)
            with work_pool(scheduler, jobs) as pool, appending(lines_path) as lines:
                if torn and lines_path.stat().st_size:
                    lines.write("\n")  # end the torn line a killed run left, not the next
                for _, results in pool.map_unordered(run_cells, [
                        (spec, batch) for batch in _batches(todo, pool.workers)]):
                    for index, summary in results:
                        row = _row(spec, index, summary)
                        done[index] = row
                        lines.write(json.dumps(row, allow_nan=False) + "\n")
                    lines.flush()
                    if progress is not None:
                        progress(len(done), spec.n_cells)
        status = COMPLETE
    except BaseException:
        # what was done is kept, as far as the disk lets it: the error that stopped the
        # run is the one to report, not one saving after it
        with contextlib.suppress(LatsimError):
            save(status)
        raise
    rows = save(status)
    return GridResult(spec, out, rows, len(done) - resumed, status, written["parquet"])
