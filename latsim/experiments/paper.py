"""The paper reproduction behind ``latsim reproduce``: settings, C choices and every table.

Everything printed as "ours" is computed here, from :mod:`latsim.analysis.theory` closed forms
or from simulations of the committed trace sets; the paper's own numbers are read from
``paper_data.json`` and only ever placed beside ours (columns prefixed ``paper_``). Where a C
has to be inferred from a paper measurement, :data:`SETTINGS` says which measurement and
:func:`infer_C` computes it (nothing is typed in as a result).

Tables (one CSV each in ``results/paper/``):

- ``settings``       the six serving settings: paper Δ, theory (T−δ)/2, refined theory Δ(C),
                     simulated Δ on the low- and high-frequency trace sets, and the gaps
- ``eq6``            the eq. (6) worked example (T=5 s, C=1.6 s) by theory and by simulation
- ``amplification``  A(p) and the Poisson approximation against simulation (C ≪ δ)
- ``stall``          the stall regime C > T (LTX short-chunk eager), and C → T
- ``l50``            L50 and stall checks against the paper's Table 3 values
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from latsim.analysis import theory
from latsim.analysis.intervals import paired_jackknife_se
from latsim.controller import ControllerConfig
from latsim.controller.policies import PRESETS
from latsim.controller.timing import Timing
from latsim.errors import DEFAULT_MAX_EVENTS, LatsimError, check_work
from latsim.experiments.engine import (
    Experiment,
    ExperimentResult,
    check_jobs,
    plan,
    plan_events,
    prefetched,
    run_experiment,
)
from latsim.experiments.executors import LocalPool, active_pool, gc_paused, strided_chunks
from latsim.experiments.paper_settings import (
    C_METHOD_TEXT,
    SETTINGS,
    TRACE_SETS,
    Setting,
    _trace_root,
    infer_C,
    invert_reduction,
    paper_data,
    refined_reduction,
)
from latsim.model.costs import FixedCost
from latsim.model.traces import Trace
from latsim.run.stream import RunRecords, default_drain
from latsim.sim.simpy_driver import simulate_trace


def _setting_experiment(setting: Setting, C: float, trace_dir: Path,
                        max_events: int = DEFAULT_MAX_EVENTS) -> Experiment:
    """Both policies of ``setting`` at fixed ``C`` on one trace set (one replication per
    trace, the same traces for both policies)."""
    return Experiment(Ks=(setting.K,), r=setting.r, fps=setting.fps, cost=FixedCost(C),
                      updates=f"traces:{trace_dir}", max_events=max_events)


def _simulate(setting: Setting, C: float, trace_dir: Path,
              jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS) -> ExperimentResult:
    """Run :func:`_setting_experiment`."""
    return run_experiment(_setting_experiment(setting, C, trace_dir, max_events), jobs=jobs)


def _rows_by_policy(result: ExperimentResult) -> dict[str, dict]:
    return {row["policy"]: row for row in result.rows}


def _sim_rows(setting: Setting, C: float, trace_dir: Path, jobs: int | None,
              max_events: int = DEFAULT_MAX_EVENTS) -> dict:
    """The summary row of each policy (see :func:`_simulate`)."""
    return _rows_by_policy(_simulate(setting, C, trace_dir, jobs, max_events))


def _r6(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _latency_components(run: RunRecords) -> tuple[float, int]:
    """Sum and count of the latencies ``summarize`` pools into L_mean for one run."""
    latencies = [c.L for c in run.conditions if c.displayed]
    return float(sum(latencies)), len(latencies)


def _mean_difference(totals: np.ndarray) -> float:
    sum_a, n_a, sum_b, n_b = totals
    return float(sum_a / n_a - sum_b / n_b) if n_a > 0 and n_b > 0 else math.nan


def _se_diff(runs_a: list[RunRecords], runs_b: list[RunRecords]) -> float | None:
    """Standard error of L_mean(a) − L_mean(b), the pooled means of two policies run on the
    same traces (paired by index).

    On common random numbers the two means are correlated (typically positively: a trace
    with late updates delays both), so ``hypot`` of their SEs, which treats them as
    independent, misstates the SE of the difference. The paired jackknife (leave one trace
    out of both policies) keeps that covariance, and with whole traces as the unit it also
    keeps the dependence between conditions of one trace. None with fewer than two traces.
    """
    if len(runs_a) != len(runs_b):
        raise ValueError("the paired SE needs the same replications for both policies")
    components = np.array([
        (*_latency_components(a), *_latency_components(b))
        for a, b in zip(runs_a, runs_b, strict=True)
    ])
    return paired_jackknife_se(components, _mean_difference)


# ---------------------------------------------------------------- tables


def settings_table(root: Path, jobs: int | None,
                   max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """The six settings: paper's reduction, theory's and ours (simulated on both sets).

    A simulated reduction's SE is paired over the traces (:func:`_se_diff`): both policies
    replay the same traces."""
    rows = []
    for s in SETTINGS:
        data = paper_data()["settings"][s.name]
        T, delta = s.timing.T, s.timing.delta
        C = infer_C(s)
        row: dict = {
            "setting": s.name, "K": s.K, "r": s.r, "fps": s.fps, "T": _r6(T),
            "delta": _r6(delta), "C": _r6(C), "C_method": s.c_method,
            "C_over_T": _r6(C / T),
            "theory_reduction": _r6(theory.boundary_wait_reduction(T, delta)),
            "theory_reduction_at_C": _r6(refined_reduction(C, T, delta)) if C <= T else None,
            "C_implied_by_paper": _r6(invert_reduction(data["reduction_s"], T, delta)),
        }
        for kind in TRACE_SETS:
            result = _simulate(s, C, root / kind, jobs, max_events)
            sim = _rows_by_policy(result)
            base, spec = sim["baseline"], sim["speculative"]
            reduction = base["L_mean"] - spec["L_mean"]
            row |= {
                f"sim_{kind}_baseline_L_mean": _r6(base["L_mean"]),
                f"sim_{kind}_speculative_L_mean": _r6(spec["L_mean"]),
                f"sim_{kind}_reduction": _r6(reduction),
                f"sim_{kind}_reduction_se": _r6(_se_diff(result.runs[(s.K, "baseline")],
                                                         result.runs[(s.K, "speculative")])),
                f"sim_{kind}_baseline_L50": _r6(base["L50"]),
                f"sim_{kind}_speculative_L50": _r6(spec["L50"]),
                f"sim_{kind}_baseline_stall_pct": _r6(base["stall_pct"]),
                f"sim_{kind}_speculative_stall_pct": _r6(spec["stall_pct"]),
                f"sim_{kind}_baseline_busy_pct": _r6(base["busy_pct"]),
                f"sim_{kind}_speculative_busy_pct": _r6(spec["busy_pct"]),
                f"sim_{kind}_A": _r6(spec["A"]),
                f"sim_{kind}_n_shown": spec["n_displayed"],
            }
        paper_red = data["reduction_s"]
        row |= {
            "paper_reduction": paper_red,
            "diff_theory_minus_paper": _r6(row["theory_reduction"] - paper_red),
            "diff_sim_low_minus_paper": _r6(row["sim_low_reduction"] - paper_red),
            "diff_sim_high_minus_paper": _r6(row["sim_high_reduction"] - paper_red),
            "paper_kernel_activity_pct": "-".join(str(v) for v in data["kernel_activity_pct"]),
        }
        rows.append(row)
    return rows


def phase_grid_runs(K: int, r: int, fps: float, C: float, policy: str,
                    n: int) -> list[tuple]:
    """One run per arrival phase u_i = (i + ½)/n · T, arrival at T + u_i (steady state: the
    refill cycle is busy over [mT − C, mT)); a deterministic stand-in for uniform phase.
    Returns (condition record, whether the generator was busy when it arrived), in phase
    order; the runs go to the active work pool in chunks (else in process)."""
    pool = active_pool() or LocalPool(1)
    work = [(K, r, fps, C, policy, n, phases)
            for phases in strided_chunks(n, pool.workers)]
    out: list[tuple | None] = [None] * n
    for index, results in pool.map_unordered(_phase_runs, work):
        for i, result in zip(work[index][-1], results, strict=True):
            out[i] = result
    return out  # type: ignore[return-value]


def _phase_runs(work: tuple) -> list[tuple]:
    K, r, fps, C, policy, n, phases = work
    timing = Timing(K, r, fps)
    config = ControllerConfig(timing, PRESETS[policy], C)
    cost = FixedCost(C)
    T = timing.T
    out = []
    with gc_paused():
        for i in phases:
            t = T + (i + 0.5) / n * T
            trace = Trace(f"phase-{i}", (t,), 4 * T)
            records, _ = simulate_trace(config, cost, trace, 4 * T, np.random.default_rng(0))
            busy = any(j.t_start < t < j.t_ready for j in records.jobs
                       if j.kind != "prebuffer")
            out.append((records.conditions[0], busy))
    return out


def phase_grid_conditions(K: int, r: int, fps: float, C: float, policy: str,
                          n: int) -> list:
    """The condition records of :func:`phase_grid_runs`."""
    return [cond for cond, _ in phase_grid_runs(K, r, fps, C, policy, n)]


#: Eq. (6) example timing: K=20 latents, one latent per frame at 4 fps -> δ=0.25 s, T=5 s.
EQ6_TIMING = (20, 1, 4.0)
EQ6_C = 1.6
EQ6_PHASES = 2000


def eq6_table() -> list[dict]:
    """The eq. (6) worked example by theory and by a phase-grid simulation."""
    K, r, fps = EQ6_TIMING
    timing = Timing(K, r, fps)
    T, delta, C = timing.T, timing.delta, EQ6_C
    split = theory.residual_wait_split(C, T)
    spec_runs = phase_grid_runs(K, r, fps, C, "speculative", EQ6_PHASES)
    spec = [cond for cond, _ in spec_runs]
    base = phase_grid_conditions(K, r, fps, C, "baseline", EQ6_PHASES)
    R = np.array([c.R for c in spec])
    rc = np.array([c.R + c.C for c in spec])
    busy = np.array([was_busy for _, was_busy in spec_runs])
    paper = paper_data()["eq6_example"]
    quantities = [
        ("E[R]", theory.residual_wait_mean(C, T), float(R.mean()), paper["E_R_s"]),
        ("idle arrival R+C", split["idle_arrival"], float(rc[~busy].mean()),
         paper["idle_arrival_s"]),
        ("busy arrival R+C", split["busy_arrival_mean"], float(rc[busy].mean()),
         paper["busy_arrival_s"]),
        ("P(busy)", split["busy_probability"], float(busy.mean()), None),
        ("unconditional R+C", split["unconditional_mean"], float(rc.mean()),
         paper["unconditional_s"]),
        # eq. (6) starts every idle arrival's job at once; latsim's controller lets the
        # refill serve those whose branch would be the cache end (same slot, wait in R)
        ("E[R] with refill deferral", theory.speculative_residual_wait_mean(C, T, delta),
         float(R.mean()), None),
        ("speculative E[L] (with Q)", theory.speculative_latency_mean(C, T, delta),
         float(np.mean([c.L for c in spec])), None),
        ("baseline E[L]", theory.baseline_latency_lower_bound(C, T),
         float(np.mean([c.L for c in base])), None),
    ]
    return [
        {"quantity": q, "K": K, "r": r, "fps": fps, "T": T, "delta": delta, "C": C,
         "theory": _r6(th), "simulated": _r6(sim), "paper": pap,
         "diff_sim_minus_theory": _r6(sim - th),
         "diff_theory_minus_paper": None if pap is None else _r6(th - pap)}
        for q, th, sim, pap in quantities
    ]


AMP_KS = (4, 8, 16, 32)
AMP_PS = (0.002, 0.005, 0.01, 0.02, 0.05)
AMP_TIMING = (4, 16.0)  # r, fps: δ = 0.25 s
AMP_C = 0.001  # C ≪ δ, as the independent-update model assumes
AMP_DURATION = 300.0
AMP_SEEDS = 8


def _amplification_experiment(p: float, max_events: int = DEFAULT_MAX_EVENTS) -> Experiment:
    r, fps = AMP_TIMING
    return Experiment(Ks=AMP_KS, r=r, fps=fps, cost=FixedCost(AMP_C), updates=f"bernoulli:{p!r}",
                      duration=AMP_DURATION, seeds=AMP_SEEDS, max_events=max_events)


def amplification_table(jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """A(p) = Kp/(1 − (1−p)^K) and 1 + λ(T − δ)/2 (λ = p/δ) against simulated calls ratio."""
    rows = []
    for p in AMP_PS:
        exp = _amplification_experiment(p, max_events)
        for row in run_experiment(exp, jobs=jobs).rows:
            if row["policy"] != "speculative":
                continue
            K, T, delta = row["K"], row["T"], row["delta"]
            rate = p / delta
            a_ind = theory.work_amplification_independent(K, p)
            try:
                a_poi: float | None = theory.work_amplification_poisson(rate, T, delta)
            except LatsimError:
                a_poi = None  # λT >= 1: the approximation makes no claim
            rows.append({
                "K": K, "p": p, "rate_per_s": _r6(rate), "T": T, "delta": delta,
                "lambda_T": _r6(rate * T), "A_independent": _r6(a_ind),
                "A_poisson_approx": _r6(a_poi), "A_sim": _r6(row["A"]),
                "A_sim_from_w": _r6(row["A_from_w"]), "w_sim": _r6(row["w"]),
                "diff_sim_minus_independent": _r6(row["A"] - a_ind),
            })
    return sorted(rows, key=lambda x: (x["K"], x["p"]))


STALL_RATIOS = (0.5, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
STALL_DURATION = 600.0


def _stall_experiment(ratio: float, max_events: int = DEFAULT_MAX_EVENTS) -> Experiment:
    """The C/T sweep's run at C = ``ratio`` x T (LTX short chunk, Poisson updates)."""
    s = SETTINGS[4]
    return Experiment(Ks=(s.K,), r=s.r, fps=s.fps, cost=FixedCost(ratio * s.timing.T),
                      updates="poisson:0.1", duration=STALL_DURATION, seeds=2,
                      max_events=max_events)


def stall_table(root: Path, jobs: int | None, max_events: int = DEFAULT_MAX_EVENTS) -> list[dict]:
    """LTX short-chunk eager (C > T) on the paper's trace sets, then a C/T sweep."""
    s = SETTINGS[4]
    C = infer_C(s)
    paper = paper_data()["settings"][s.name]["baseline_stall_pct"]
    rows = []
    for kind in TRACE_SETS:
        sim = _sim_rows(s, C, root / kind, jobs, max_events)
        for policy in ("baseline", "speculative"):
            rows.append(_stall_row(f"{s.name} {kind}", s, C, sim[policy], paper[kind]))
    for ratio in STALL_RATIOS:
        exp = _stall_experiment(ratio, max_events)
        c = exp.cost.C  # type: ignore[union-attr]
        for row in run_experiment(exp, jobs=jobs).rows:
            rows.append(_stall_row(f"C/T={ratio:g} poisson:0.1", s, c, row, None))
    return rows


def _stall_row(case: str, s: Setting, C: float, row: dict, paper: float | None) -> dict:
    T = s.timing.T
    stall = 100 * theory.stall_fraction(C, T)
    return {
        "case": case, "policy": row["policy"], "K": s.K, "T": _r6(T), "C": _r6(C),
        "C_over_T": _r6(C / T), "theory_stall_pct": _r6(stall),
        "sim_stall_pct": _r6(row["stall_pct"]), "paper_stall_pct": paper,
        "diff_sim_minus_paper": None if paper is None else _r6(row["stall_pct"] - paper),
        "theory_saturated_L_mean": _r6(theory.saturated_latency_mean(T))
        if abs(C - T) < 1e-9 else None,
        "sim_L_mean": _r6(row["L_mean"]), "sim_busy_pct": _r6(row["busy_pct"]),
    }


#: The paper's Table 3 keys: (its key, ours in the settings table, the end-to-end model's
#: policy and metric).
TABLE3_KEYS = (("baseline_L50_s", "baseline_L50", "baseline", "L50"),
               ("speculative_L50_s", "speculative_L50", "speculative", "L50"),
               ("baseline_stall_pct", "baseline_stall_pct", "baseline", "viewer_stall_pct"),
               ("speculative_stall_pct", "speculative_stall_pct", "speculative",
                "viewer_stall_pct"))


def l50_table(settings: list[dict], end_to_end: list[dict]) -> list[dict]:
    """The paper's Table 3 cells, measured end to end, beside the end-to-end serving model
    (``end_to_end``: :func:`latsim.experiments.serving_paper.e2e_table`'s rows, whose
    ``role`` says which cell calibrated its one overhead D, which were fitted and which
    predicted) and beside the bare boundary-wait model (``boundary_wait``: no lead, decode,
    network or playout; the part of L that commitment changes, not a prediction of the
    cell)."""
    by_name = {row["setting"]: row for row in settings}
    model = {(r["setting"], r["policy"], r["metric"], r["load"]): r for r in end_to_end}
    rows = []
    for name, data in paper_data()["settings"].items():
        for key, ours_key, policy, metric in TABLE3_KEYS:
            for kind, value in data.get(key, {}).items():
                bare = by_name[name][f"sim_{kind}_{ours_key}"]
                e2e = model.get((name, policy, metric, kind))
                rows.append({
                    "setting": name, "metric": ours_key, "load": kind, "paper": value,
                    "end_to_end": None if e2e is None else e2e["ours"],
                    "end_to_end_role": None if e2e is None else e2e["role"],
                    "diff_end_to_end_minus_paper": None if e2e is None
                    else _r6(e2e["ours"] - value),
                    "boundary_wait": bare, "diff_boundary_wait_minus_paper": _r6(bare - value),
                })
    return rows


def long_minus_short_table(settings: list[dict]) -> list[dict]:
    """Speculative L50 of each family's long setting minus its short one, per trace set,
    beside the range the paper reports for all three families. Ours is the bare
    boundary-wait model's: the lead, decode, network and playout it leaves out are the same
    for both chunk sizes of a family except the lead (here each setting's own C)."""
    low, high = paper_data()["long_minus_short_speculative_L50_s"]
    by_name = {row["setting"]: row for row in settings}
    rows = []
    for family in dict.fromkeys(s.name.rsplit(" ", 1)[0] for s in SETTINGS):
        for kind in TRACE_SETS:
            ours = (by_name[f"{family} long"][f"sim_{kind}_speculative_L50"]
                    - by_name[f"{family} short"][f"sim_{kind}_speculative_L50"])
            rows.append({"family": family, "load": kind, "paper_low": low, "paper_high": high,
                         "boundary_wait": _r6(ours), "within_paper_range": low <= ours <= high,
                         "C_long_minus_short": _r6(by_name[f"{family} long"]["C"]
                                                   - by_name[f"{family} short"]["C"])})
    return rows


# ---------------------------------------------------------------- the whole reproduction


@dataclass(frozen=True)
class Reproduction:
    """All tables of ``latsim reproduce`` (lists of flat row dicts)."""

    settings: list[dict]
    eq6: list[dict]
    amplification: list[dict]
    stall: list[dict]
    l50: list[dict]
    long_minus_short: list[dict]


def reproduction_experiments(root: Path, max_events: int = DEFAULT_MAX_EVENTS
                             ) -> list[Experiment]:
    """Every experiment :func:`reproduce` runs (for its up-front work bound, and to run
    them as one batch); the eq. (6) phase grid runs apart."""
    experiments = [_setting_experiment(s, infer_C(s), root / kind, max_events)
                   for s in SETTINGS for kind in TRACE_SETS]
    experiments += [_setting_experiment(SETTINGS[4], infer_C(SETTINGS[4]), root / kind,
                                        max_events) for kind in TRACE_SETS]
    experiments += [_stall_experiment(ratio, max_events) for ratio in STALL_RATIOS]
    experiments += [_amplification_experiment(p, max_events) for p in AMP_PS]
    return experiments


def phase_grid_events(K: int, r: int, fps: float, C: float, n: int) -> float:
    """Events :func:`phase_grid_runs` may cover for one policy: n runs of 4T plus the
    drain, one condition each."""
    timing = Timing(K, r, fps)
    config = ControllerConfig(timing, PRESETS["baseline"], C)
    return n * (math.ceil((4 * timing.T + default_drain(config)) / timing.delta) + 1)


def reproduction_events(root: Path) -> float:
    """The work of :func:`reproduce`, checked against its bound: events (latent slots and
    conditions, :func:`latsim.experiments.engine.plan_events`) over every simulation."""
    total = sum(plan_events(plan(exp)) for exp in reproduction_experiments(root))
    return total + 2 * phase_grid_events(*EQ6_TIMING, EQ6_C, EQ6_PHASES)


def reproduce(traces_root: Path | None = None, jobs: int | None = None,
              max_events: int = DEFAULT_MAX_EVENTS) -> Reproduction:
    """Compute every table (deterministic: fixed C, committed traces, fixed seeds).

    ``jobs``, the trace sets and the work bound (:func:`reproduction_events` against
    ``max_events``) are checked before any simulation."""
    jobs = check_jobs(jobs)
    with tempfile.TemporaryDirectory() as tmp:
        root = _trace_root(traces_root, Path(tmp))
        check_work(reproduction_events(root), max_events, "--max-events",
                   "the reproduction's simulations come to about {n} events (latent slots "
                   "and conditions)")
        with prefetched(reproduction_experiments(root, max_events), jobs):
            settings = settings_table(root, jobs, max_events)
            stall = stall_table(root, jobs, max_events)
            amplification = amplification_table(jobs, max_events)
        # the paper's cells are end to end: the serving model's, with its reported
        # calibration (the module imports this one)
        from latsim.experiments.serving_paper import CALIBRATIONS, e2e_table

        end_to_end, _ = e2e_table(root, jobs, max_events, CALIBRATIONS[:1])
    return Reproduction(settings, eq6_table(), amplification, stall,
                        l50_table(settings, end_to_end), long_minus_short_table(settings))


def as_json(result: Reproduction) -> dict:
    return asdict(result) | {"C_methods": C_METHOD_TEXT}


def write_results(result: Reproduction, out: Path) -> list[Path]:
    """One CSV per table; byte-identical for identical results."""
    from latsim.run.files import write_rows_csv

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in asdict(result).items():
        path = out / f"{name}.csv"
        write_rows_csv(path, rows)
        written.append(path)
    return written
