"""Capacity search (DESIGN §6): the most streams a serving configuration serves within an SLO.

A stream count N *meets* the SLO when the pooled end-to-end L95 is at most ``slo.l95`` and
the viewer stall % (server stalls plus late deliveries) at most ``slo.stall_pct``. Each N is
simulated with replications (common random numbers: stream ``s`` of replication ``r`` draws
the same arrivals and costs whatever N is), and the verdict is statistical:

- each metric's uncertainty is the bootstrap over replications (resampling whole
  replications keeps the correlation of the streams within one);
- ``p_l95`` and ``p_stall`` are the one-sided normal confidences that the true value is
  within its limit; the confidence that N meets both is at least ``p_l95 + p_stall − 1``
  (Bonferroni), and N *passes* when that bound reaches ``confidence``;
- N *fails* when either metric is over its limit with confidence ``confidence``;
- otherwise the replications double, up to ``max_seeds``; still undecided, N counts as not
  meeting the SLO (``uncertain``: the conservative reading) and the row says so.

Under ``--lead auto`` the search plans each N with one pilot's lead, as ``simulate``
does with ``--pilot whole`` (a search's run is many evaluations, so no pilot moves to part
of the pool to cost a tenth of one); then the answer N and N + 1 are judged again with
every replication planning with
the lead of pilots of its own (:func:`~latsim.experiments.engine.auto_lead_per_replication`,
on random streams no run uses), so the pilot's answer, one more random input of the
verdict, varies across the replications the bootstrap resamples: the answer holds for the
rule, not for one seed's lead. Where N no longer meets, the answer steps down (and up
while N + 1 meets). Those rows give the mean lead and ``lead_min``/``lead_max``.

The search doubles N from 1 until it fails (or reaches ``max_streams``), then bisects between
the largest pass and the smallest failure. It assumes that meeting the SLO is monotone in N,
which holds for the workloads here (more streams only add work to the queues); every N it
measured is in the result so a reader can check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from latsim.analysis.intervals import replication_bootstrap_se, replication_percentile_se
from latsim.analysis.serving import serving_metrics, viewer_stall_pct
from latsim.errors import MAX_SECONDS, LatsimError, check_int, check_number, check_work
from latsim.experiments.engine import (
    PILOT_WHOLE,
    Experiment,
    auto_lead_per_replication,
    cell_slots,
    lead_mode,
    plan,
    run_replications,
)
from latsim.experiments.stream_models import AUTO_LEAD, COST_LEAD
from latsim.model.serving import MAX_STREAMS, STREAMS_LIMIT_NOTE, ServingConfig
from latsim.run.serving import ServingRecords

#: Bootstrap resamples of the replications behind each verdict.
BOOTSTRAP = 400


@dataclass(frozen=True)
class SLO:
    """End-to-end L95 (seconds) and viewer stall (percent of the window) limits."""

    l95: float
    stall_pct: float

    def __post_init__(self) -> None:
        check_number("--slo-l95", self.l95, 0, MAX_SECONDS, positive=True, unit="s")
        check_number("--slo-stall", self.stall_pct, 0, 100, unit="%")


@dataclass(frozen=True)
class CapacityQuery:
    """What to search: one K and one policy of ``experiment`` (whose ``serving`` sets
    everything but the stream count), an SLO and the statistics of the verdict."""

    experiment: Experiment
    slo: SLO
    max_streams: int = 256
    confidence: float = 0.95
    min_seeds: int = 5
    max_seeds: int = 40

    def __post_init__(self) -> None:
        if len(self.experiment.Ks) != 1 or len(self.experiment.policies) != 1:
            raise LatsimError("capacity takes one --K and one --policy")
        if self.experiment.serving is None:
            raise LatsimError("capacity needs a serving configuration")
        check_int("--max-streams", self.max_streams, 1, MAX_STREAMS, why=STREAMS_LIMIT_NOTE)
        check_number("--confidence", self.confidence, 0.5, 0.9999)
        check_int("--min-seeds", self.min_seeds, 2, 10_000)
        check_int("--max-seeds", self.max_seeds, self.min_seeds, 10_000)


@dataclass(frozen=True)
class Verdict:
    streams: int
    replications: int
    metrics: dict
    l95_se: float | None
    stall_se: float | None
    p_l95: float
    p_stall: float
    verdict: str  # meets | fails | uncertain
    #: the lead the runs planned with, and what ``--lead auto`` added to it (and its model)
    lead: float | None = None
    lead_wait: float | None = None
    lead_model: str | None = None
    #: the least and the greatest lead, where each replication planned with its own
    lead_range: tuple[float, float] | None = None

    @property
    def meets(self) -> bool:
        return self.verdict == "meets"

    @property
    def confidence(self) -> float:
        """A lower bound on the confidence that this N meets the SLO."""
        return max(0.0, self.p_l95 + self.p_stall - 1.0)

    def row(self) -> dict:
        m = self.metrics
        return {
            "streams": self.streams, "n_runs": self.replications,
            "verdict": self.verdict, "confidence_meets": self.confidence,
            "L50": m["L50"], "L95": m["L95"], "L95_se": self.l95_se, "L99": m["L99"],
            "L95_lo": m["L95_lo"], "L95_hi": m["L95_hi"],
            "viewer_stall_pct": m["viewer_stall_pct"], "viewer_stall_pct_se": self.stall_se,
            "viewer_stall_pct_lo": m["viewer_stall_pct_lo"],
            "viewer_stall_pct_hi": m["viewer_stall_pct_hi"],
            "stall_pct": m["stall_pct"], "client_stall_pct": m["client_stall_pct"],
            "busy_pct": m["busy_pct"], "busy_pct_by_pool": m["busy_pct_by_pool"],
            "queue_wait_mean_by_stage": m["queue_wait_mean_by_stage"],
            "R_mean": m["R_mean"], "ttff_mean": m["ttff_mean"], "cpr": m["cpr"],
            "n_conditions": m["n_conditions"], "lead": self.lead,
            **({} if self.lead_model is None else
               {"lead_wait": self.lead_wait, "lead_model": self.lead_model}),
            **({} if self.lead_range is None else
               {"lead_min": self.lead_range[0], "lead_max": self.lead_range[1]}),
        }


@dataclass(frozen=True)
class CapacityResult:
    query: CapacityQuery
    max_streams: int
    verdicts: tuple[Verdict, ...]
    status: str = "complete"

    def payload(self) -> dict:
        return capacity_payload(self.query, self.verdicts, self.max_streams, self.status)


#: The DiT load up to which ``bench/lead_regimes.py`` checked ``--lead auto``'s stall
#: promise (stall at most 0.1%): an answer past it is outside what was checked.
LEAD_CHECKED_LOAD = 0.85


def capacity_notes(verdicts: tuple[Verdict, ...] | list[Verdict], answer: int | None
                   ) -> list[str]:
    """What a reader of the answer should know beside it: which lead each verdict holds
    for (a ``--lead auto`` pilot's, which another seed's pilot moves), and whether the
    answer loads the DiT devices past :data:`LEAD_CHECKED_LOAD`."""
    notes = []
    row = next((v for v in verdicts if v.streams == answer), None)
    if any(v.lead_range is not None for v in verdicts):
        notes.append("the answer and the next N were judged with each replication "
                     "planning with the lead of pilots of its own (lead_min to lead_max), "
                     "so their confidence includes how --lead auto's pilot varies; the "
                     "other rows hold at one pilot's lead")
    if row is not None and row.lead_model is not None:
        load = row.metrics["busy_pct"] / 100
        if load > LEAD_CHECKED_LOAD:
            notes.append(f"the answer loads the DiT devices to {load:.2f}, past the "
                         f"{LEAD_CHECKED_LOAD:g} up to which --lead auto's stall promise "
                         "was checked (bench/lead_regimes.py)")
    return notes


def capacity_payload(query: CapacityQuery, verdicts: tuple[Verdict, ...] | list[Verdict],
                     max_streams: int | None, status: str = "complete") -> dict:
    """What ``latsim capacity --json`` prints and ``capacity.json`` holds. A search that
    stopped early has ``max_streams`` null, its ``status`` says why, and
    ``largest_meeting_so_far`` is the largest N that met the SLO among those measured.
    ``notes`` are :func:`capacity_notes` on the answer (so far)."""
    slo = query.slo
    met = [v.streams for v in verdicts if v.meets]
    largest = max(met) if met else None
    return {
        "max_streams": max_streams, "status": status,
        **({} if status == "complete" else {"largest_meeting_so_far": largest}),
        "slo": {"L95": slo.l95, "viewer_stall_pct": slo.stall_pct},
        "confidence": query.confidence,
        "notes": capacity_notes(verdicts, max_streams if status == "complete" else largest),
        "rows": [v.row() for v in sorted(verdicts, key=lambda v: v.streams)],
    }


def _probability_within(estimate: float | None, se: float | None, limit: float) -> float:
    """One-sided normal confidence that the true value is at most ``limit``."""
    if estimate is None:
        return 0.0  # no displayed condition: nothing shows the SLO is met
    if not se:
        return 1.0 if estimate <= limit else 0.0
    return NormalDist().cdf((limit - estimate) / se)


def _bootstrap_se(runs: list[ServingRecords], rng: np.random.Generator
                  ) -> tuple[float | None, float | None]:
    """Bootstrap standard errors, over replications, of pooled L95
    (:func:`~latsim.analysis.intervals.replication_percentile_se`) and of the mean of the
    replications' viewer stall % (:func:`~latsim.analysis.intervals.replication_bootstrap_se`),
    from one generator: the L95 resamples first."""
    latencies = [[v.L for v in run.viewer if v.displayed] for run in runs]
    stalls = [[viewer_stall_pct([run])] for run in runs]
    return (replication_percentile_se(latencies, 95, rng, BOOTSTRAP),
            replication_bootstrap_se(stalls, lambda values: float(np.mean(values)), rng,
                                     BOOTSTRAP))


def _judge(query: CapacityQuery, streams: int, runs: list[ServingRecords],
           rng: np.random.Generator, last: bool) -> Verdict:
    metrics = serving_metrics(runs)
    l95_se, stall_se = _bootstrap_se(runs, rng)
    p_l95 = _probability_within(metrics["L95"], l95_se, query.slo.l95)
    p_stall = _probability_within(metrics["viewer_stall_pct"], stall_se, query.slo.stall_pct)
    level = query.confidence
    if p_l95 + p_stall - 1.0 >= level:
        verdict = "meets"
    elif p_l95 <= 1 - level or p_stall <= 1 - level:
        verdict = "fails"
    else:
        verdict = "uncertain" if last else ""
    return Verdict(streams, len(runs), metrics, l95_se, stall_se, p_l95, p_stall, verdict)


def _leads_of(base_lead: float, leads: list[tuple[float, str]]) -> dict:
    """The lead fields of a verdict whose replications each planned with a lead from
    pilots of their own: the mean lead and wait, and the range of the leads."""
    waits = [wait for wait, _ in leads]
    wait = float(np.mean(waits))
    return {"lead": base_lead + wait, "lead_wait": wait,
            "lead_model": f"a pilot per replication ({leads[0][1]})",
            "lead_range": (base_lead + min(waits), base_lead + max(waits))}


def _lead_of(experiment: Experiment, index: int) -> dict:
    """Cell ``index``'s lead in ``experiment``'s plan, and what ``--lead auto`` added."""
    p = plan(experiment)
    cell = p.cells[index]
    wait, model = dict(p.auto_leads).get((cell.timing.K, cell.policy.name), (None, None))
    return {"lead": cell.lead, "lead_wait": wait, "lead_model": model}


def search_capacity(query: CapacityQuery,
                    progress: Callable[[Verdict], None] | None = None,
                    max_events: int | None = None) -> CapacityResult:
    """Find the largest N in ``[1, max_streams]`` that meets the SLO (0 if none does).

    ``max_events`` bounds the simulated work (latent slots and conditions over every run),
    as ``--max-events`` does for ``simulate``; it defaults to the experiment's. A search
    that would pass it stops before the run that would, with an error naming the bound.
    """
    experiment = query.experiment
    serving: ServingConfig = experiment.serving  # type: ignore[assignment]
    bound = experiment.max_events if max_events is None else max_events
    base = plan(replace(experiment, serving=replace(serving, streams=1), seeds=1))
    cell_index = next(i for i, c in enumerate(base.cells)
                      if c.policy.name == experiment.policies[0])
    per_stream_run = cell_slots(base, base.cells[cell_index])
    check_work(per_stream_run * query.max_streams * query.min_seeds, bound, "--max-events",
               f"one evaluation of {query.max_streams} streams x {query.min_seeds} "
               f"replications of {base.duration:g} s comes to about {{n}} latent slots",
               ", or give fewer --max-streams, --min-seeds or a shorter --duration")
    spent = 0.0
    rng = np.random.default_rng(np.random.SeedSequence(experiment.seed, spawn_key=(2**33,)))
    verdicts: dict[int, Verdict] = {}

    def evaluate(streams: int, own_pilots: bool = False) -> Verdict:
        nonlocal spent
        # the search keeps its own account of the work (``spent``), run by run; a verdict
        # reads summaries only, so the runs count their slots and tasks instead of keeping
        trial = replace(experiment, serving=replace(serving, streams=streams),
                        max_events=10**15, records="none", pilot=PILOT_WHOLE)
        piloted = own_pilots and streams > 1 and lead_mode(trial) == AUTO_LEAD
        if piloted:  # the base lead the pilots add their wait budgets to
            base_cell = plan(replace(trial, lead=COST_LEAD)).cells[cell_index]
            base_lead, K = base_cell.lead, base_cell.timing.K
        leads: list[tuple[float, str]] = []
        runs: list[ServingRecords] = []
        replications = query.min_seeds
        while True:
            more = replications - len(runs)
            cost = per_stream_run * streams * more
            if spent + cost > bound:
                raise LatsimError(
                    f"the capacity search would pass --max-events {bound} (about "
                    f"{spent + cost:.0f} latent slots at N={streams}); measured so far: "
                    + (", ".join(f"N={n} {v.verdict}" for n, v in sorted(verdicts.items()))
                       or "nothing") + "; raise --max-events or lower --max-seeds")
            spent += cost
            more_runs = range(len(runs), replications)
            if piloted:
                leads += auto_lead_per_replication(trial, K, base_lead,
                                                   experiment.policies[0], more_runs)
                runs += run_replications(trial, cell_index, more_runs,
                                         [base_lead + wait for wait, _ in leads[-len(more_runs):]])
            else:
                runs += run_replications(trial, cell_index, more_runs)
            last = replications >= query.max_seeds
            verdict = _judge(query, streams, runs, rng, last)
            if verdict.verdict:
                verdict = replace(verdict, **(_leads_of(base_lead, leads) if piloted
                                              else _lead_of(trial, cell_index)))
                break
            replications = min(query.max_seeds, 2 * replications)
        verdicts[streams] = verdict
        if progress is not None:
            progress(verdict)
        return verdict

    best, worst = 0, None  # largest N that met the SLO, smallest that did not
    n = 1
    while n <= query.max_streams:
        if evaluate(n).meets:
            best = n
            if n == query.max_streams:
                break
            n = min(2 * n, query.max_streams)
        else:
            worst = n
            break
    if worst is not None:
        while worst - best > 1:
            mid = (best + worst) // 2
            if evaluate(mid).meets:
                best = mid
            else:
                worst = mid
    # the answer and the next N again, each replication planning with pilots of its own:
    # the verdicts that decide the answer count the pilot's variation (module docstring)
    if lead_mode(experiment) == AUTO_LEAD and best >= 1:
        stepped_down = False
        while best > 1 and not evaluate(best, own_pilots=True).meets:
            best, stepped_down = best - 1, True
        while (not stepped_down and best < query.max_streams
               and evaluate(best + 1, own_pilots=True).meets):
            best += 1
    return CapacityResult(query, best, tuple(verdicts.values()))

