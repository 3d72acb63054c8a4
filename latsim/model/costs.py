"""Cost models: how long a generation job of K latents takes (the execution-time seam).

The controller never sees a duration; drivers ask a cost model
(:class:`latsim.plugins.CostModel`), built from a spec by
:func:`latsim.plugins.load_cost`. The built-in prefixes (each registered in the
``latsim.costs`` entry-point group, as a third party's would be; their ``parse_*``
functions take the text after ``PREFIX:``):

- ``fixed:C``            every job takes C seconds
- ``affine:A,B``         C = A + B*K
- ``table:PATH``         K -> C from JSON or CSV (see :func:`load_table`); samples per K
                         are resampled, means are interpolated linearly between table K
- ``lognormal:MEAN,CV``  lognormal with that mean and coefficient of variation
- ``usp:PATH[@G]``       per-parallel-degree tables (see :func:`load_parallel_table`): the
                         table of degree G (default 1; the serving model's ``--dit-degree``
                         picks it when the spec does not)
- ``sdvg:PATH``          SDVG's draft/target routing from a system file,
  ``draftverify:UNIT,CV,TAU``  draft–verify decoding, and
  ``waveforcing:ROUND,STEPS,VAE[,nf1c]``  Wave Forcing (:mod:`latsim.model.generators`)
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from latsim.errors import MAX_CV, MAX_K, MAX_SECONDS, LatsimError
from latsim.model.traces import read_input_file
from latsim.numeric import OBSERVED, empirical_quantile
from latsim.plugins.protocols import CostModel
from latsim.plugins.spec import numbers, whole

__all__ = ["JOB_KINDS", "AffineCost", "CostModel", "FixedCost", "LognormalCost",
           "ParallelTableCost", "TableCost", "load_parallel_table", "load_table"]

JOB_KINDS = ("refill", "replan")

#: How messages name a cost model's ``PREFIX:ARGS`` spec.
WHAT = "cost spec"


def _check_seconds(name: str, value: float) -> float:
    """A job time: finite, >= 0 and at most :data:`~latsim.errors.MAX_SECONDS` (a day)."""
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise LatsimError(f"{name} must be a finite number of seconds >= 0 and <= "
                          f"{MAX_SECONDS:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FixedCost:
    C: float

    def __post_init__(self) -> None:
        _check_seconds("C", self.C)

    @property
    def spec(self) -> str:
        return f"fixed:{self.C!r}"

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        return self.C

    def sample_many(self, K: int, rng: np.random.Generator, n: int, kind: str = "refill"
                    ) -> np.ndarray:
        """``n`` calls of :meth:`sample` at once (the same values; none draws)."""
        return np.full(n, self.C)

    def mean(self, K: int) -> float:
        return self.C

    def quantile(self, K: int, level: float) -> float:
        return self.C

    @property
    def deterministic(self) -> bool:
        return True


@dataclass(frozen=True)
class AffineCost:
    """C = a + b*K (a per-call overhead plus a per-latent slope)."""

    a: float
    b: float

    def __post_init__(self) -> None:
        _check_seconds("affine intercept A", self.a)
        _check_seconds("affine slope B", self.b)

    @property
    def spec(self) -> str:
        return f"affine:{self.a!r},{self.b!r}"

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        return self.mean(K)

    def sample_many(self, K: int, rng: np.random.Generator, n: int, kind: str = "refill"
                    ) -> np.ndarray:
        """``n`` calls of :meth:`sample` at once (the same values; none draws)."""
        return np.full(n, self.mean(K))

    def mean(self, K: int) -> float:
        return self.a + self.b * K

    def quantile(self, K: int, level: float) -> float:
        return self.mean(K)

    @property
    def deterministic(self) -> bool:
        return True


@dataclass(frozen=True)
class LognormalCost:
    """Lognormal job time with the given mean and coefficient of variation (any K)."""

    mean_s: float
    cv: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_s) and 0 < self.mean_s <= MAX_SECONDS):
            raise LatsimError(f"lognormal mean must be > 0 and <= {MAX_SECONDS:g} seconds, "
                              f"got {self.mean_s!r}")
        if not (math.isfinite(self.cv) and 0 <= self.cv <= MAX_CV):
            raise LatsimError(f"lognormal CV must be >= 0 and <= {MAX_CV:g}, got {self.cv!r}")

    @property
    def _sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv**2))

    @property
    def _mu(self) -> float:
        return math.log(self.mean_s) - self._sigma**2 / 2

    @property
    def spec(self) -> str:
        return f"lognormal:{self.mean_s!r},{self.cv!r}"

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        return float(rng.lognormal(self._mu, self._sigma)) if self.cv > 0 else self.mean_s

    def sample_many(self, K: int, rng: np.random.Generator, n: int, kind: str = "refill"
                    ) -> np.ndarray:
        """``n`` calls of :meth:`sample` at once: the same values, and ``rng`` left where
        they leave it (numpy's array draws fill in order with the scalar draw's method)."""
        if self.cv > 0:
            return rng.lognormal(self._mu, self._sigma, n)
        return np.full(n, self.mean_s)

    def mean(self, K: int) -> float:
        return self.mean_s

    def quantile(self, K: int, level: float) -> float:
        if self.cv == 0:
            return self.mean_s
        return math.exp(self._mu + self._sigma * NormalDist().inv_cdf(level))

    @property
    def deterministic(self) -> bool:
        return self.cv == 0


@dataclass(frozen=True)
class TableCost:
    """Measured or tabulated costs per K, optionally per job kind, with samples.

    ``samples[(K, kind)]`` holds one or more durations; a single value is a fixed cost. K
    values between table rows use the linear interpolation of the refill row means; K
    outside the table is an error. A kind without its own rows uses the ``refill`` rows, so
    every K in the table needs refill rows.
    """

    path: str
    samples: dict[tuple[int, str], tuple[float, ...]]

    def __post_init__(self) -> None:
        if not self.samples:
            raise LatsimError(f"{self.path}: the cost table has no rows")
        for k in self._table_ks():
            if not self.samples.get((k, "refill")):
                raise LatsimError(
                    f"{self.path}: K={k} has rows for another job kind but no refill rows"
                )

    @property
    def spec(self) -> str:
        return f"table:{self.path}"

    def _rows(self, K: int, kind: str) -> tuple[float, ...] | None:
        return self.samples.get((K, kind)) or self.samples.get((K, "refill"))

    def _table_ks(self) -> list[int]:
        return sorted({k for k, _ in self.samples})

    def _kind_rows(self, K: int) -> list[tuple[float, ...]]:
        """The rows each job kind draws from at a table ``K`` (empty between table rows)."""
        return [rows for kind in JOB_KINDS if (rows := self._rows(K, kind)) is not None]

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        rows = self._rows(K, kind)
        if rows is None:
            return self.mean(K)
        if len(rows) == 1:
            return rows[0]
        return rows[int(rng.integers(len(rows)))]

    def mean(self, K: int) -> float:
        """The refill rows' mean (what a refill costs on average), interpolated between
        table K."""
        rows = self._rows(K, "refill")
        if rows is not None:
            return float(np.mean(rows))
        ks = self._table_ks()
        if K < ks[0] or K > ks[-1]:
            raise LatsimError(
                f"K={K} is outside the cost table's range [{ks[0]}, {ks[-1]}] ({self.path})"
            )
        i = bisect.bisect_left(ks, K)
        lo, hi = ks[i - 1], ks[i]
        m_lo, m_hi = self.mean(lo), self.mean(hi)
        return m_lo + (m_hi - m_lo) * (K - lo) / (hi - lo)

    def quantile(self, K: int, level: float) -> float:
        """The largest of the job kinds' ``level`` quantiles at ``K``.

        The planning lead is this quantile, and the controller starts both refills and
        replans that far ahead, so it has to cover each kind. The maximum of the per-kind
        quantiles gives every kind at least ``level`` probability of finishing in time;
        the quantile of the pooled samples would weigh the kinds by how many samples each
        has in the table (a profiling choice, not the run's job mix), and with few replan
        samples it would leave replans late most of the time. Each kind's quantile is an
        observed job time (:data:`latsim.numeric.OBSERVED`), as the live lead's is.
        Between table K every draw is the interpolated mean, so that is the quantile.
        """
        kinds = self._kind_rows(K)
        if not kinds:
            return self.mean(K)
        return max(empirical_quantile(rows, level, OBSERVED) for rows in kinds)

    @property
    def deterministic(self) -> bool:
        """True if at every table K all draws, of every job kind, are one value (the mean
        the closed forms use); between table K every draw is the interpolated mean."""
        return all(
            len({c for rows in self._kind_rows(k) for c in rows}) == 1
            for k in self._table_ks()
        )


def load_table(path: str | Path) -> TableCost:
    """Read a cost table.

    JSON: ``{"4": 0.8, "8": [1.41, 1.45, ...], "21": {"refill": [...], "replan": [...]}}``,
    optionally wrapped as ``{"costs": {...}}`` (a profile file may carry other keys).
    CSV: a header with ``K`` and ``C`` (optionally ``kind``); several rows per K are samples.
    """
    file = Path(path)
    text = read_input_file(file, "cost table")
    samples: dict[tuple[int, str], list[float]] = {}

    def add(k_raw: object, kind: object, value: object, where: str) -> None:
        _add_sample(samples, path, k_raw, kind, value, where)

    if file.suffix.lower() == ".csv":
        try:
            reader = csv.DictReader(text.splitlines())
            if not reader.fieldnames or not {"K", "C"} <= set(reader.fieldnames):
                raise LatsimError(f"{path}: a CSV cost table needs columns K and C")
            for lineno, row in enumerate(reader, start=2):
                if None in row:  # DictReader's key for the cells past the header's
                    raise LatsimError(f"{path}: line {lineno}: more cells than the header's "
                                      f"{len(reader.fieldnames)} columns")
                add(row["K"], (row.get("kind") or "refill").strip(), row["C"], f"line {lineno}")
        except csv.Error as exc:
            raise LatsimError(f"{path}: not a readable CSV table ({exc})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LatsimError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # a 5000-digit integer, deep nesting
            raise LatsimError(f"{path}: not usable JSON ({type(exc).__name__})") from None
        if isinstance(data, dict) and isinstance(data.get("costs"), dict):
            data = data["costs"]
        return _table_from_json(data, str(path))
    return TableCost(str(path), {key: tuple(vals) for key, vals in samples.items()})


def _table_from_json(data: object, path: str) -> TableCost:
    """A :class:`TableCost` from the JSON form :func:`load_table` documents."""
    if not isinstance(data, dict):
        raise LatsimError(f"{path}: expected a JSON object mapping K to seconds")
    samples: dict[tuple[int, str], list[float]] = {}
    for k_raw, value in data.items():
        per_kind = value if isinstance(value, dict) else {"refill": value}
        for kind, vals in per_kind.items():
            for v in vals if isinstance(vals, list) else [vals]:
                _add_sample(samples, path, k_raw, kind, v, f"K={k_raw}")
    return TableCost(path, {key: tuple(vals) for key, vals in samples.items()})


def _add_sample(samples: dict[tuple[int, str], list[float]], path: object, k_raw: object,
                kind: object, value: object, where: str) -> None:
    """Check one table entry and add it to ``samples``."""
    try:
        if not str(k_raw).isascii() or isinstance(value, bool) or (
                isinstance(value, str) and not value.isascii()):
            raise ValueError  # int() and float() read other scripts' digits ("٨" as 8)
        k = int(str(k_raw))
        c = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise LatsimError(f"{path}: {where}: K and C must be numbers (ASCII digits)") from None
    if not 0 < k <= MAX_K:
        raise LatsimError(f"{path}: {where}: K must be a positive integer <= {MAX_K}")
    if kind not in JOB_KINDS:
        shown = repr(kind) if len(repr(kind)) <= 40 else repr(kind)[:37] + "..."
        raise LatsimError(f"{path}: {where}: job kind must be refill or replan, got {shown}")
    samples.setdefault((k, kind), []).append(_check_seconds(f"{path}: {where}: C", c))


@dataclass(frozen=True)
class ParallelTableCost:
    """Cost tables per parallel degree (USP: one DiT job on G devices at once), the table
    of ``degree`` in use. A cost model like any other; :meth:`at` picks another degree."""

    path: str
    tables: dict[int, TableCost]
    degree: int = 1

    def __post_init__(self) -> None:
        if self.degree not in self.tables:
            raise LatsimError(f"{self.path}: no table for parallel degree {self.degree} "
                              f"(degrees: {', '.join(map(str, sorted(self.tables)))})")

    def at(self, degree: int) -> ParallelTableCost:
        return ParallelTableCost(self.path, self.tables, degree)

    @property
    def spec(self) -> str:
        return f"usp:{self.path}@{self.degree}"

    def sample(self, K: int, rng: np.random.Generator, kind: str = "refill") -> float:
        return self.tables[self.degree].sample(K, rng, kind)

    def mean(self, K: int) -> float:
        return self.tables[self.degree].mean(K)

    def quantile(self, K: int, level: float) -> float:
        return self.tables[self.degree].quantile(K, level)

    @property
    def deterministic(self) -> bool:
        return self.tables[self.degree].deterministic


def load_parallel_table(path: str | Path, degree: int = 1) -> ParallelTableCost:
    """Read per-degree cost tables: a JSON object mapping each parallel degree to a cost
    table body as :func:`load_table` reads it, e.g. ``{"1": {"3": 0.31, "21": 1.9},
    "4": {"3": 0.11, "21": 0.52}}`` (optionally wrapped as ``{"degrees": {...}}``)."""
    text = read_input_file(path, "cost table")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LatsimError(f"{path}: not valid JSON ({type(exc).__name__})") from None
    if isinstance(data, dict) and isinstance(data.get("degrees"), dict):
        data = data["degrees"]
    if not isinstance(data, dict) or not data:
        raise LatsimError(f"{path}: expected a JSON object mapping parallel degrees to tables")
    tables = {}
    for key, body in data.items():
        try:
            g = int(key)
        except ValueError:
            raise LatsimError(f"{path}: parallel degree {key!r} is not a whole number") from None
        if not 0 < g <= 4096 or not isinstance(body, dict):
            raise LatsimError(f"{path}: degree {key}: a positive degree mapping K to seconds")
        tables[g] = _table_from_json(body, f"{path}@{g}")
    return ParallelTableCost(str(path), tables, degree)


def parse_fixed(args: str) -> FixedCost:
    """``fixed:C``: every job takes C seconds."""
    return FixedCost(*numbers(WHAT, f"fixed:{args}", args, 1))


def parse_affine(args: str) -> AffineCost:
    """``affine:A,B``: C = A + B*K."""
    return AffineCost(*numbers(WHAT, f"affine:{args}", args, 2))


def parse_lognormal(args: str) -> LognormalCost:
    """``lognormal:MEAN,CV``."""
    return LognormalCost(*numbers(WHAT, f"lognormal:{args}", args, 2))


def parse_table(args: str) -> TableCost:
    """``table:PATH`` (:func:`load_table`)."""
    return load_table(args)


def parse_usp(args: str) -> ParallelTableCost:
    """``usp:PATH[@G]`` (:func:`load_parallel_table`, degree G, default 1)."""
    path, _, degree = args.rpartition("@") if "@" in args else (args, "", "1")
    return load_parallel_table(path, whole(WHAT, f"usp:{args}", degree))
