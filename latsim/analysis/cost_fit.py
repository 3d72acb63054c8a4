"""The cost laws a measured profile fits: what ``latsim profile`` says beside its table.

A profile keeps every timed job (``--cost table:PATH`` resamples them), but a law is what a
user carries to another setting: an affine C = a + b·K over the K values measured
(``--cost affine:A,B``), and per K a lognormal of the jobs' times (``--cost
lognormal:MEAN,CV``). Each comes with how well it fits, so a reader can tell a law that
summarises the jobs from one that does not:

- the affine law: least squares over every job, R² of the per-job times, and the largest
  relative error of its mean at a measured K;
- the lognormal: maximum likelihood (scipy, the location fixed at 0), and the
  Kolmogorov–Smirnov distance of the jobs from it with its p-value. The parameters come
  from the same jobs, so the p-value is optimistic (Lilliefors); a small one still says the
  law is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

#: The fewest jobs a lognormal is fitted to.
MIN_JOBS = 3


def fit_affine(times_by_K: Mapping[int, Sequence[float]]) -> dict | None:
    """Least squares C = a + b·K over every job of ``times_by_K``; None with fewer than two
    K values. ``spec`` is the ``--cost`` spec, or None where a or b is negative (the
    affine cost takes neither)."""
    Ks = sorted(K for K, times in times_by_K.items() if len(times))
    if len(Ks) < 2:
        return None
    x = np.concatenate([np.full(len(times_by_K[K]), K, dtype=float) for K in Ks])
    y = np.concatenate([np.asarray(times_by_K[K], dtype=float) for K in Ks])
    b, a = np.polyfit(x, y, 1)
    residual = float(np.sum((y - (a + b * x)) ** 2))
    spread = float(np.sum((y - y.mean()) ** 2))
    worst = max(abs(a + b * K - float(np.mean(times_by_K[K]))) / float(np.mean(times_by_K[K]))
                for K in Ks)
    a, b = float(a), float(b)
    return {"a": a, "b": b, "r2": 1.0 - residual / spread if spread > 0 else 1.0,
            "max_mean_error": worst,
            "spec": f"affine:{a:.4g},{b:.4g}" if a >= 0 and b >= 0 else None}


def fit_lognormal(times: Sequence[float]) -> dict | None:
    """The lognormal of ``times`` by maximum likelihood, as ``--cost lognormal:MEAN,CV``,
    with the Kolmogorov–Smirnov distance and p-value; None with fewer than
    :data:`MIN_JOBS` jobs or a time that is not positive."""
    from scipy import stats

    data = np.asarray(times, dtype=float)
    if data.size < MIN_JOBS or not np.all(data > 0) or not np.all(np.isfinite(data)):
        return None
    if np.all(data == data[0]):  # no spread: the law of one value
        return {"mean": float(data[0]), "cv": 0.0, "ks": 0.0, "ks_p": 1.0,
                "spec": f"lognormal:{data[0]:.4g},0"}
    shape, _, scale = stats.lognorm.fit(data, floc=0)
    mean = float(scale * math.exp(shape**2 / 2))
    cv = float(math.sqrt(math.expm1(shape**2)))
    test = stats.kstest(data, "lognorm", args=(shape, 0, scale))
    return {"mean": mean, "cv": cv, "ks": float(test.statistic), "ks_p": float(test.pvalue),
            "spec": f"lognormal:{mean:.4g},{cv:.4g}"}


def fit_profile(costs: Mapping[str, Mapping[str, Sequence[float]]]) -> dict:
    """A profile's fits (its ``costs``: K as text -> job kind -> seconds): per kind, the
    affine law over its K values and a lognormal per K."""
    kinds = sorted({kind for by_kind in costs.values() for kind in by_kind})
    out = {}
    for kind in kinds:
        by_K = {int(K): by_kind[kind] for K, by_kind in costs.items() if by_kind.get(kind)}
        out[kind] = {"affine": fit_affine(by_K),
                     "lognormal": {str(K): fit_lognormal(times)
                                   for K, times in sorted(by_K.items())}}
    return out
