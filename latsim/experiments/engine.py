"""The experiment engine: one row per (K, policy), pooled over replications, on all cores.

What ``simulate``, ``sweep``, ``capacity``, ``grid`` and the reproductions run through:
planning and validating an :class:`Experiment`, cutting its replications into units of
work (batches of several experiments share them), running them on an executor
(:mod:`latsim.experiments.executors`) and summarising and writing the rows.

An :class:`Experiment` names the timing, cost model, arrival process and policies. Every
replication draws its arrivals and its job costs from child streams of one
``numpy.random.SeedSequence(seed)``, shared by all policies and K (common random numbers:
baseline and speculative see the same arrivals), so the same seed gives the same numbers.

Inputs are bounded (:mod:`latsim.errors`): every number is range-checked when the
:class:`Experiment` is made, and :func:`plan` refuses, before any simulation, an experiment
whose work, the latent slots its runs may cover plus their conditions
(:func:`plan_events`), is above ``Experiment.max_events`` (``--max-events``).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from latsim.analysis import theory
from latsim.analysis.metrics import work_ratio
from latsim.controller import REPLAN_AT_CACHE_END, AdaptiveLead, ControllerConfig
from latsim.controller.policies import PRESETS, Policy
from latsim.controller.records import COUNTED_TABLES, RECORD_LEVELS, RECORD_TYPES
from latsim.controller.timing import Timing
from latsim.errors import (
    DEFAULT_MAX_EVENTS,
    MAX_DURATION,
    MAX_FPS,
    MAX_JOBS,
    MAX_K,
    MAX_R,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SEEDS,
    MIN_FPS,
    LatsimError,
    check_int,
    check_number,
    check_work,
)
from latsim.experiments.executors import (
    LOCAL,
    LocalPool,
    active_pool,
    gc_paused,
    strided_chunks,
    using,
)
from latsim.experiments.stream_models import (
    ADAPTIVE_LEAD,
    AUTO_LEAD,
    COST_LEAD,
    OneStream,
    StreamModel,
    stream_model,
)
from latsim.model.arrivals import ArrivalSource, parse_updates
from latsim.model.costs import CostModel
from latsim.model.lead import SIMULATED
from latsim.model.serving import ServingConfig
from latsim.plugins import ArrivalChecks, CountsConditions, load_cost
from latsim.run.files import write_rows_csv
from latsim.run.folder import (
    FORMAT_VERSION,
    RUNNING,
    RunIdentity,
    summary_row,
    write_json,
)
from latsim.run.serving import SERVING_RECORD_TYPES, ServingRecords
from latsim.run.stream import COMPLETE, RunRecords, default_drain

#: Embedded defaults of ``latsim sweep`` (README, "Defaults"): Wan2.1-1.3B's stream
#: (16 fps, 4 pixel frames per latent), 4 sampling steps of the paper's H200 per-forward
#: time at 480p (77.5 ms at K=1, 2.05x at K=3, affine in K), and a Poisson update rate of
#: 6 per minute (the middle of the paper's high-frequency traces, 3-11 per 60 s).
DEFAULT_FPS = 16.0
DEFAULT_R = 4
DEFAULT_COST = "affine:0.14725,0.16275"
DEFAULT_UPDATES = "poisson:0.1"
DEFAULT_DURATION = 60.0
DEFAULT_SEED = 0
#: where ``--lead auto``'s pilots run (``--pilot``): on the largest part of the pool that
#: costs at most a tenth of the run (:func:`latsim.model.lead.pilot_divisor`), or on the
#: whole pool whatever it costs
PILOT_PART = "part"
PILOT_WHOLE = "whole"
PILOT_POOLS = (PILOT_PART, PILOT_WHOLE)


@dataclass(frozen=True)
class Experiment:
    """What to simulate. ``None`` means the documented default. ``cost`` and ``updates`` are
    a spec string (``--cost``, ``--updates``) or a cost model / arrival source object."""

    Ks: tuple[int, ...]
    r: int = DEFAULT_R
    fps: float = DEFAULT_FPS
    cost: str | CostModel = DEFAULT_COST
    lead: float | str | None = None  # seconds, None, "cost", "auto" (serving) or "adaptive"
    q: int | None = None
    policies: tuple[str, ...] = ("baseline", "speculative")
    updates: str | ArrivalSource = DEFAULT_UPDATES
    duration: float | None = None
    seeds: int | None = None
    seed: int = DEFAULT_SEED
    commit: str | None = None  # override the presets' commit mode (ablations)
    commit_lead: float = 0.0
    run_ahead: float = 0.0  # refills start this much beyond the lead (ControllerConfig)
    replan_at_cache_end: str = "defer"  # ControllerConfig's REPLAN_AT_CACHE_END
    max_events: int = DEFAULT_MAX_EVENTS  # the work bound (see plan_events)
    serving: ServingConfig | None = None  # None: one stream on one worker (DESIGN §2)
    #: what each run keeps (RECORD_LEVELS): below "all", slots and tasks are only counted
    records: str = "all"
    #: run the baseline beside a speculative policy asked for alone, on the same arrivals,
    #: only to measure A (its rows are not shown; its records go to TWIN_FOLDER). Without
    #: it, A is null where the baseline is not among ``policies`` (:data:`A_NOTE`)
    twin: bool = False
    #: where ``--lead auto``'s pilots run (:data:`PILOT_POOLS`): "part", the largest part
    #: of the pool that costs at most a tenth of the run, or "whole", the whole pool
    pilot: str = "part"

    def __post_init__(self) -> None:
        """Range-check every number (:mod:`latsim.errors`); what depends on several (q
        divides K, duration covers a chunk, the cost at each K, the work bound) is checked
        by :func:`plan`."""
        if not self.Ks:
            raise LatsimError("give at least one K")
        for K in self.Ks:
            check_int("K", K, 1, MAX_K)
        check_int("r", self.r, 1, MAX_R)
        check_number("fps", self.fps, MIN_FPS, MAX_FPS, positive=True)
        if isinstance(self.lead, str):
            if self.lead not in LEAD_WORDS:
                raise LatsimError(f"--lead must be a number of seconds, auto, adaptive or "
                                  f"cost, got {self.lead[:40]!r}")
            if self.lead == AUTO_LEAD and self.serving is None:
                raise LatsimError("--lead auto adds the wait for a shared device: it is for "
                                  "the serving model (--streams, --pools); one stream on its "
                                  "own worker never waits")
        elif self.lead is not None:
            check_number("lead", self.lead, 0, MAX_SECONDS, unit="s")
        if self.q is not None:
            check_int("q", self.q, 1, MAX_K)
        if self.duration is not None:
            check_number("duration", self.duration, 0, MAX_DURATION, positive=True, unit="s")
        if self.seeds is not None:
            check_int("--seeds", self.seeds, 1, MAX_SEEDS)
        check_int("--seed", self.seed, 0, MAX_SEED)
        check_number("commit lead", self.commit_lead, 0, MAX_SECONDS, unit="s")
        check_number("--run-ahead", self.run_ahead, 0, MAX_SECONDS, unit="s")
        check_int("--max-events", self.max_events, 1, 10**15)
        if self.replan_at_cache_end not in REPLAN_AT_CACHE_END:
            raise LatsimError(f"--replan-at-cache-end must be defer or start, got "
                              f"{self.replan_at_cache_end!r}")
        if self.pilot not in PILOT_POOLS:
            raise LatsimError(f"--pilot must be part or whole, got {self.pilot[:40]!r}")
        if self.records not in RECORD_LEVELS:
            raise LatsimError(f"--records must be one of {', '.join(RECORD_LEVELS)}, got "
                              f"{self.records!r}")
        for name in self.policies:
            if name not in PRESETS:
                raise LatsimError(f"unknown policy {name!r}; choose baseline or speculative")
        if self.commit is not None and self.commit not in ("eager", "lazy"):
            raise LatsimError(f"--commit: commit mode must be eager or lazy, got "
                              f"{self.commit[:40]!r}")
        if self.commit == "eager" and self.commit_lead:
            raise LatsimError("--commit-lead locks latents before they play under lazy "
                              "commit; eager commit locks a chunk when it is ready, so the "
                              "lead would be ignored: drop one of them")
        overrides = self.q is not None or self.commit is not None or self.commit_lead
        if overrides and "speculative" not in self.policies:
            raise LatsimError("--q, --commit and --commit-lead modify the speculative policy; "
                              "baseline is the fixed reference (q = K, eager)")


@dataclass(frozen=True)
class Cell:
    """One (K, policy) configuration, fully resolved: the controller's configuration, which
    it holds whole (:class:`~latsim.controller.ControllerConfig` validates it, q against K
    among the rest), with the parts a plan reads most named."""

    config: ControllerConfig

    @property
    def timing(self) -> Timing:
        return self.config.timing

    @property
    def policy(self) -> Policy:
        return self.config.policy

    @property
    def lead(self) -> float:
        return self.config.lead


@dataclass(frozen=True)
class Plan:
    """An experiment with every default resolved and its inputs validated."""

    experiment: Experiment
    cost: CostModel
    arrivals: ArrivalSource
    duration: float
    replications: int
    cells: tuple[Cell, ...]
    serving: ServingConfig | None = None  # with its DiT degree resolved
    #: (K, policy) -> (the wait budget added to its lead, its model), under
    #: ``--lead auto``; under ``--lead adaptive``, the wait its lead starts with
    auto_leads: tuple[tuple[tuple[int, str], tuple[float, str]], ...] = ()

    @property
    def model(self) -> StreamModel:
        """How the plan's streams meet their devices (:mod:`latsim.experiments.stream_models`)."""
        return stream_model(self.serving)


@dataclass(frozen=True)
class ExperimentResult:
    plan: Plan
    rows: list[dict]
    runs: dict[tuple[int, str], list[RunRecords | ServingRecords]]


@lru_cache(maxsize=8)
def _load_cost(spec: str) -> CostModel:
    return load_cost(spec)


@lru_cache(maxsize=8)
def _parse_updates(spec: str) -> ArrivalSource:
    return parse_updates(spec)


def _sources(experiment: Experiment) -> tuple[CostModel, ArrivalSource]:
    cost, updates = experiment.cost, experiment.updates
    return (_load_cost(cost) if isinstance(cost, str) else cost,
            _parse_updates(updates) if isinstance(updates, str) else updates)


def _policy(experiment: Experiment, name: str) -> Policy:
    """The preset; ablation knobs apply to the speculative policy only, so that A is
    always measured against the reference baseline."""
    preset = PRESETS[name]
    if name == "baseline":
        return preset
    return replace(preset, q=preset.q if experiment.q is None else experiment.q,
                   commit=experiment.commit or preset.commit,
                   commit_lead=experiment.commit_lead)


def _check_job_time(what: str, value: float, K: int, spec: str) -> float:
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise LatsimError(f"{what} at K={K} is {value:.4g} s under cost {spec}; a job time "
                          f"must be finite and at most {MAX_SECONDS:g} s")
    return value


def plan(experiment: Experiment) -> Plan:
    """Resolve defaults and validate everything before any simulation starts, the work
    bound included (:func:`plan_events` against ``experiment.max_events``)."""
    cost, arrivals = _sources(experiment)
    serving = experiment.serving
    if serving is not None:
        serving, cost = serving.resolve(cost)
    duration = experiment.duration
    if duration is None:
        duration = arrivals.default_duration() or DEFAULT_DURATION
    check_number("duration", duration, 0, MAX_DURATION, positive=True, unit="s")
    if isinstance(arrivals, ArrivalChecks):
        arrivals.check(duration, experiment.duration is not None)
    devices = stream_model(serving)
    stream = devices.settings
    names = list(experiment.policies)
    if experiment.twin and "speculative" in names and "baseline" not in names:
        names.insert(0, "baseline")  # the twin that A is measured against
    leads: dict[int, tuple[Timing, float]] = {}  # K -> (timing, base lead)
    for K in experiment.Ks:
        timing = Timing(K, experiment.r, experiment.fps)
        if duration < timing.T:
            raise LatsimError(
                f"duration {duration:g} s is shorter than one chunk (K={K}: T = {timing.T:g} s)"
            )
        # K outside a cost table's range fails here, before any work
        _check_job_time("mean C", cost.mean(K), K, cost.spec)
        if isinstance(experiment.lead, float | int):
            lead = float(experiment.lead)
        else:
            lead = _check_job_time("lead (C's 0.99 quantile)", SIMULATED.from_cost(cost, K), K,
                                   cost.spec)
            if extra := devices.lead_extra(K):
                lead = _check_job_time("lead (C's plus decode's and replan overhead's 0.99 "
                                       "quantiles)", lead + extra, K, cost.spec)
        leads[K] = (timing, lead)

    mode = lead_mode(experiment)

    def planned(auto: dict[tuple[int, str], tuple[float, str]]) -> Plan:
        cells = []
        for K in experiment.Ks:
            timing, lead = leads[K]
            for name in names:
                policy, own = _policy(experiment, name), lead
                if (K, name) in auto:
                    wait, model = auto[K, name]
                    own = _check_job_time(f"{name}'s lead (plus its wait budget, {model})",
                                          lead + wait, K, cost.spec)
                cells.append(Cell(ControllerConfig(
                    timing, policy, own, stream.discard, stream.in_flight,
                    stream.in_flight_policy, experiment.run_ahead,
                    experiment.replan_at_cache_end, stream.bind,
                    AdaptiveLead(lead) if mode == ADAPTIVE_LEAD else None)))
        p = Plan(experiment, cost, arrivals, duration,
                 arrivals.replications(experiment.seeds), tuple(cells), serving,
                 tuple(auto.items()))
        streams = "" if isinstance(devices, OneStream) else f" x {devices.streams} stream(s)"
        check_work(
            plan_events(p), experiment.max_events, "--max-events",
            f"{len(p.cells)} cell(s) x {p.replications} replication(s){streams} of "
            f"{p.duration:g} s plus drain come to about {{n}} events (latent slots and "
            "conditions)",
            ", or give a shorter --duration, fewer --seeds or K" + (", or fewer --streams"
                                                                      if streams else ""),
        )
        return p

    if mode == ADAPTIVE_LEAD:
        return planned({(K, name): adaptive_lead_start(serving, cost, timing)
                        for K, (timing, _) in leads.items() for name in names})
    if mode != AUTO_LEAD:
        return planned({})
    # the bound first at the base leads (a wait budget only lengthens the drain), so a run
    # over it is refused before its pilots; then every cell's pilots at once, side by side
    base = planned({})
    asked = [(K, lead, name) for K, (_, lead) in leads.items() for name in names]
    run_stream_s = (base.duration * base.replications * devices.streams
                    if experiment.pilot == PILOT_PART else None)
    return planned({(K, name): answer for (K, _, name), answer
                    in zip(asked, auto_lead_waits(experiment, asked, run_stream_s),
                           strict=True)})


#: the words ``--lead`` takes besides seconds (:mod:`latsim.experiments.stream_models`)
LEAD_WORDS = (AUTO_LEAD, COST_LEAD, ADAPTIVE_LEAD)


def lead_mode(experiment: Experiment) -> str | None:
    """How ``experiment``'s lead is set: :data:`AUTO_LEAD`, :data:`COST_LEAD`,
    :data:`ADAPTIVE_LEAD`, or None for
    a fixed number of seconds. The default (``lead=None``) is ``auto`` for the serving
    model and ``cost`` for one stream on its own worker."""
    if isinstance(experiment.lead, float | int):
        return None
    if experiment.lead is None:
        return stream_model(experiment.serving).default_lead
    return experiment.lead


def closed_form_wait(serving: ServingConfig, cost: CostModel, timing: Timing
                     ) -> float | None:
    """The refills' 0.99 wait quantile in the nD/D/1 queue
    (:func:`latsim.analysis.queueing.periodic_wait_quantile`) of ⌈N/G⌉ streams of mean C
    on one device, for G DiT devices (or USP groups); None where ⌈N/G⌉·C >= T. It is the
    lead an auto pilot runs at (where it holds exactly, fixed C on FIFO devices with no
    other stage, a job's wait is at most this quantile 99 % of the time, and ⌈N/G⌉ streams
    on one device wait at least as long as G devices sharing one queue)."""
    from latsim.analysis.queueing import periodic_wait_quantile

    if not 0 < refill_load(serving, cost, timing) < 1:
        return None
    return periodic_wait_quantile(0.99, _streams_per_group(serving), timing.T,
                                  cost.mean(timing.K))


def adaptive_lead_start(serving: ServingConfig | None, cost: CostModel, timing: Timing
                        ) -> tuple[float, str]:
    """(seconds, model): the wait ``--lead adaptive`` starts its estimate at, on top of the
    cost lead (:class:`latsim.controller.AdaptiveLead`): the refills' nD/D/1 0.99 wait
    quantile (:func:`closed_form_wait`) where it exists, else 0 (one stream on its own
    worker, or refills alone overload a device: the waits it sees move it)."""
    start = None if serving is None else closed_form_wait(serving, cost, timing)
    origin = "0" if start is None else "nD/D/1 q0.99"
    return start or 0.0, f"adaptive, from {origin}"


def _streams_per_group(serving: ServingConfig) -> int:
    groups = dict(serving.pools).get(serving.dit_pool, 0) // (serving.degree or 1)
    return -(-serving.streams // groups) if groups else 0


def refill_load(serving: ServingConfig, cost: CostModel, timing: Timing) -> float:
    """The busiest DiT device's (or USP group's) load from refills alone, ⌈N/G⌉·C/T for N
    streams on G devices: at 1 or more no wait budget keeps a stall target (replans add
    to it)."""
    return _streams_per_group(serving) * cost.mean(timing.K) / timing.T


def auto_lead_wait(experiment: Experiment, K: int, base_lead: float,
                   policy: str) -> tuple[float, str]:
    """(seconds, model) that ``--lead auto`` adds to ``base_lead`` for ``policy``'s cell at
    chunk size ``K``: the wait for devices shared with other streams. Each policy gets its
    own, as its refills (and replans) see their own queue. The process keeps the last
    :data:`AUTO_LEADS_KEPT` answers (a capacity search or a fleet asks again).

    - One stream: nothing (its own chunks in flight queue behind each other by design, and
      a longer lead there only costs L).
    - Else the stall-targeted wait budget (:func:`latsim.model.lead.confident_wait_budget`)
      of a pilot run of the policy's own cell: replication 0, for
      :func:`~latsim.model.lead.pilot_seconds`, on the whole pool or, where
      :func:`auto_lead_waits` is told what the run costs, on the largest part of it
      (:meth:`~latsim.model.serving.ServingConfig.part`) that costs at most a tenth of the
      run (:func:`~latsim.model.lead.pilot_divisor`), at ``base_lead`` plus the nD/D/1 quantile
      (:func:`closed_form_wait`; the waits a least-slack schedule gives depend on the
      lead, so the pilot runs near the answer). Each job's wait is summed over its stages
      (a stage's first record: a pipeline records one per rank, each later rank starting
      a round later, which C already counts); refills and replans alike.
    - Where that answer is longer than the lead the pilot ran at, a second pilot at the
      answer, and the larger of the two budgets: the waits depend on the lead (a longer
      one asks for each chunk earlier, so the jobs meet in other places), and a pilot at a
      shorter lead than its answer can under-cover (replan-first, staggered, ρ = 0.8: 1.37
      s where about 1.51 s keeps the target; the second pilot gives 1.54 s). Not where
      refills alone overload a device (:func:`refill_load` >= 1): no budget keeps the
      target there, and a pilot at a longer lead only waits longer.
    """
    (answer,) = auto_lead_waits(experiment, [(K, base_lead, policy)])
    return answer


#: How many :func:`auto_lead_wait` answers a process keeps.
AUTO_LEADS_KEPT = 64
_AUTO_LEADS: dict[tuple[Experiment, int, float, str, int], tuple[float, str]] = {}


def auto_lead_waits(experiment: Experiment, cells: Sequence[tuple[int, float, str]],
                    run_stream_s: float | None = None, part: int | None = None
                    ) -> list[tuple[float, str]]:
    """:func:`auto_lead_wait` of several cells, as (K, base lead, policy): the pilots not
    run before run side by side on the active work pool (the first pilots together, then
    the second ones). ``run_stream_s``: what one cell's run costs (streams × duration ×
    replications), which sets the part of the pool the pilots run on (None: the whole);
    ``part``: that part's k, given instead (``bench/lead_regimes.py --parts``)."""
    from latsim.experiments import lead_cache

    if part is None:
        part = pilot_part(experiment, run_stream_s)
    missing = [cell for cell in dict.fromkeys(cells)
               if (experiment, *cell, part) not in _AUTO_LEADS]
    keys = {cell: _pilot_key(experiment, cell, part) for cell in missing}
    kept = {cell: answer for cell, key in keys.items()
            if key is not None and (answer := lead_cache.read_answer(key)) is not None}
    to_run = [cell for cell in missing if cell not in kept]
    for cell, answer in zip(to_run, _auto_lead_answers(experiment, to_run, part=part),
                            strict=True):
        kept[cell] = answer
        if (key := keys[cell]) is not None:
            lead_cache.write_answer(key, answer)
    for cell in missing:
        if len(_AUTO_LEADS) >= AUTO_LEADS_KEPT:
            del _AUTO_LEADS[next(iter(_AUTO_LEADS))]  # the oldest
        _AUTO_LEADS[(experiment, *cell, part)] = kept[cell]
    return [_AUTO_LEADS[(experiment, *cell, part)] for cell in cells]


def pilot_part(experiment: Experiment, run_stream_s: float | None) -> int:
    """The k whose 1/k of ``experiment``'s pool (:meth:`ServingConfig.part`) its auto
    pilots run on, for a run of ``run_stream_s`` stream-seconds a cell
    (:func:`latsim.model.lead.pilot_divisor`)."""
    from latsim.model.lead import pilot_divisor

    cost, _ = _sources(experiment)
    serving, cost = experiment.serving.resolve(cost)  # type: ignore[union-attr]
    return pilot_divisor(serving.streams, serving.part_divisors(cost), run_stream_s)


def _pilot_key(experiment: Experiment, cell: tuple[int, float, str], part: int = 1
               ) -> str | None:
    """The on-disk key of a cell's pilot answer (:mod:`latsim.experiments.lead_cache`):
    the experiment with its specs resolved to what they load (a file's contents, not its
    path) and the settings a pilot sets itself (length, replications, records, bound, lead)
    left out, the cell (K, base lead, policy), the part of the pool, and the pilot's
    length."""
    from latsim.experiments import lead_cache
    from latsim.model.lead import pilot_seconds

    cost, arrivals = _sources(experiment)
    inputs = replace(experiment, Ks=(cell[0],), cost=cost, updates=arrivals, lead=None,
                     duration=None, seeds=None, records="all",
                     max_events=DEFAULT_MAX_EVENTS, twin=False, pilot=PILOT_PART)
    streams = experiment.serving.streams // part  # type: ignore[union-attr]
    return lead_cache.answer_key((inputs, cell, part, pilot_seconds(streams)))


def clear_auto_leads() -> None:
    """Forget the answers :func:`auto_lead_wait` kept (a benchmark timing its pilots)."""
    _AUTO_LEADS.clear()


#: The replication numbers the pilots of :func:`auto_lead_per_replication` run at start
#: here (pilot of replication r: replication PILOT_REPLICATIONS_FROM + r), past every
#: replication a run makes (``--max-seeds`` is at most 10,000), so that no pilot shares its
#: random streams with a run it sets the lead of.
PILOT_REPLICATIONS_FROM = 10_000


def auto_lead_per_replication(experiment: Experiment, K: int, base_lead: float,
                              policy: str, replications: Sequence[int]
                              ) -> list[tuple[float, str]]:
    """:func:`auto_lead_wait` for each of ``replications`` of ``policy``'s cell, each from
    pilots of its own on random streams no run uses (:data:`PILOT_REPLICATIONS_FROM`): a
    search that judges its replications together (``latsim capacity``) then sees the
    pilot's variation among the rest. Not kept on disk or in the process."""
    return _auto_lead_answers(experiment, [(K, base_lead, policy)] * len(replications),
                              [PILOT_REPLICATIONS_FROM + r for r in replications])


def _auto_lead_answers(experiment: Experiment, cells: Sequence[tuple[int, float, str]],
                       replications: Sequence[int] | None = None, part: int = 1
                       ) -> list[tuple[float, str]]:
    """The pilots' answers for ``cells``, each at its pilot replication (default 0), on
    1/``part`` of the pool."""
    from latsim.model.lead import pilot_seconds

    if not cells:
        return []
    cost, _ = _sources(experiment)
    serving, cost = experiment.serving.resolve(cost)  # type: ignore[union-attr]
    if serving.streams == 1:  # its own chunks in flight, or a pipeline's round, are not it
        return [(0.0, "one stream: no device shared")] * len(cells)
    at = [0] * len(cells) if replications is None else list(replications)
    timings = [Timing(K, experiment.r, experiment.fps) for K, _, _ in cells]
    quantiles = [closed_form_wait(serving, cost, timing) for timing in timings]
    waits = _pilots(experiment, [(K, base + (quantile or 0.0), policy, r, part)
                                 for (K, base, policy), quantile, r
                                 in zip(cells, quantiles, at, strict=True)])
    # a second pilot where the answer is longer than the quantile (not where overloaded,
    # and not within the budget's resolution)
    again = [i for i, (wait, quantile) in enumerate(zip(waits, quantiles, strict=True))
             if quantile is not None and wait > quantile + 1e-6]
    second = _pilots(experiment, [(cells[i][0], cells[i][1] + waits[i], cells[i][2], at[i],
                                   part) for i in again])
    streams = serving.streams // part
    seconds = pilot_seconds(streams)
    on = "" if part == 1 else f" on 1/{part} of the pool ({streams} streams)"
    answers = [(wait, f"pilot run of {seconds:g} s{on}, stall-targeted") for wait in waits]
    for i, wait in zip(again, second, strict=True):
        answers[i] = (max(waits[i], wait),
                      f"2 pilot runs of {seconds:g} s{on}, stall-targeted")
    return answers


def _pilots(experiment: Experiment, runs: Sequence[tuple[int, float, str, int, int]]
            ) -> list[float]:
    """:func:`pilot_wait_budget` of each (K, pilot lead, policy, replication, part), on the
    active pool (reporting to :func:`reporting_progress`'s callback, if any, as each
    ends)."""
    pool = active_pool() or LocalPool(1)
    progress = _PROGRESS.get()
    budgets: list[float] = [math.nan] * len(runs)
    for done, (index, budget) in enumerate(
            pool.map_unordered(_pilot, [(experiment, *run) for run in runs]), start=1):
        budgets[index] = budget
        if progress:
            progress(done, len(runs))
    return budgets


def _pilot(run: tuple[Experiment, int, float, str, int, int]) -> float:
    with gc_paused():
        return pilot_wait_budget(*run)


def pilot_wait_budget(experiment: Experiment, K: int, pilot_lead: float, policy: str,
                      replication: int = 0, part: int = 1) -> float:
    """The stall-targeted wait budget (s) of one pilot run of ``policy``'s cell at chunk
    size ``K`` with the lead ``pilot_lead`` (replication ``replication``), on 1/``part`` of
    the pool (:meth:`~latsim.model.serving.ServingConfig.part`): the body of
    :func:`auto_lead_wait`, which runs it at the nD/D/1 quantile and, where the answer is
    longer, again at the answer."""
    from latsim.model.lead import (
        AUTO_STALL,
        PILOT_BATCHES,
        confident_wait_budget,
        pilot_seconds,
    )

    if part != 1:
        experiment = replace(experiment,
                             serving=experiment.serving.part(part))  # type: ignore[union-attr]
    cost, _ = _sources(experiment)
    serving, cost = experiment.serving.resolve(cost)  # type: ignore[union-attr]
    seconds = pilot_seconds(serving.streams)
    pilot = replace(experiment, Ks=(K,), records="all", seeds=replication + 1,
                    duration=seconds, lead=pilot_lead, max_events=10**15)
    p = plan(pilot)
    check_work(plan_events(p) / len(p.cells) / p.replications, experiment.max_events,
               "--max-events",
               f"--lead auto's pilot run for {policy} ({serving.streams} stream(s) x "
               f"{seconds:g} s) comes to about {{n}} events",
               ", or give --lead a number of seconds, or cost")
    (index,) = [i for i, cell in enumerate(p.cells) if cell.policy.name == policy]
    run = run_cell(pilot, index, replication, p)
    per_stage: dict[tuple[int, int, str], float] = {}
    enqueued: dict[tuple[int, int], float] = {}
    for task in run.tasks:  # type: ignore[union-attr]
        if task.kind != "prebuffer":
            key = (task.stream, task.job_id, task.stage)
            per_stage[key] = min(per_stage.get(key, math.inf), task.wait)
            job = task.stream, task.job_id
            enqueued[job] = min(enqueued.get(job, math.inf), task.t_enqueue)
    per_job: dict[tuple[int, int], float] = {}
    for (stream, job_id, _), wait in per_stage.items():
        per_job[stream, job_id] = per_job.get((stream, job_id), 0.0) + wait
    batches: list[list[float]] = [[] for _ in range(PILOT_BATCHES)]
    for job, wait in per_job.items():  # by when the job was asked for
        batches[min(PILOT_BATCHES - 1, int(enqueued[job] / seconds * PILOT_BATCHES))].append(
            wait)
    budget = AUTO_STALL * serving.streams * seconds / PILOT_BATCHES
    return confident_wait_budget(batches, budget)


def cell_slots(p: Plan, cell: Cell) -> float:
    """The latent slots one replication of ``cell`` may cover: (duration + drain)/δ, the
    most a run can play (the drain, :func:`latsim.run.stream.default_drain`, bounds how long
    it goes on past the window)."""
    return math.ceil((p.duration + default_drain(cell.config)) / cell.timing.delta)


def plan_events(p: Plan) -> float:
    """The work of a plan, checked against its bound: latent slots (:func:`cell_slots`) plus
    the arrival source's expected conditions per run (``mean_conditions``, where the source
    has one), summed over cells and replications."""
    counts = isinstance(p.arrivals, CountsConditions)
    per_run = [cell_slots(p, cell) + (p.arrivals.mean_conditions(p.duration, cell.timing)
                                      if counts else 0.0)
               for cell in p.cells]
    return sum(per_run) * p.replications * p.model.streams


def run_cell(experiment: Experiment, cell_index: int, replication: int,
             p: Plan | None = None) -> RunRecords | ServingRecords:
    """One replication of one cell (top-level so worker processes can run it); ``p`` is
    ``plan(experiment)`` when the caller has it already."""
    p = p or plan(experiment)
    return p.model.run(p, p.cells[cell_index], replication)


def run_replications(experiment: Experiment, cell_index: int, replications: range,
                     leads: Sequence[float] | None = None
                     ) -> list[RunRecords | ServingRecords]:
    """Replications of one cell, in order, on the active work pool (else in process);
    ``leads``: one lead (seconds) for each replication, in place of the experiment's."""
    pool = active_pool() or LocalPool(1)
    if leads is None:
        p = plan(experiment)
        work = [[(p, [(cell_index, rep)])] for rep in replications]
    else:
        work = [[(plan(replace(experiment, lead=lead)), [(cell_index, rep)])]
                for rep, lead in zip(replications, leads, strict=True)]
    results: list = [None] * len(work)
    for index, (records,) in pool.map_unordered(_run_chunk, work):
        results[index] = records
    return results


#: A work unit: runs of one or several experiments, as (plan, [(cell, replication)]) (the
#: plan, not the experiment: a worker need not read trace folders and plan again).
_Unit = list[tuple[Plan, list[tuple[int, int]]]]


def _run_chunk(unit: _Unit) -> list[RunRecords | ServingRecords]:
    with gc_paused():
        return [run_cell(p.experiment, cell, rep, p) for p, tasks in unit for cell, rep in tasks]


_PREFETCHED: ContextVar[dict[Experiment, ExperimentResult] | None] = ContextVar(
    "latsim_prefetched", default=None)


#: Where :func:`run_experiments` reports its progress when no ``progress`` is given (a
#: command's progress bar around library code that runs batches of its own).
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("latsim_progress",
                                                                     default=None)


class _Batches:
    """Successive batches' ``(done, total)`` as one count: a batch that starts after one
    finished adds its runs to what went before, so ``done`` only grows (``total`` grows
    as later batches, sized only once the ones before them are done, begin)."""

    def __init__(self, progress: Callable[[int, int], None]) -> None:
        self._progress = progress
        self._before = 0  # runs of the batches that finished
        self._current = (0, 0)  # the batch reporting now

    def __call__(self, done: int, total: int) -> None:
        if self._current[1] and self._current[0] >= self._current[1]:
            self._before += self._current[1]
        self._current = (done, total)
        self._progress(self._before + done, self._before + total)


@contextlib.contextmanager
def reporting_progress(progress: Callable[[int, int], None]) -> Iterator[None]:
    """Within the block, every batch of work reports to ``progress(done, total)`` (runs),
    counted on from the batches before it."""
    token = _PROGRESS.set(_Batches(progress))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


@contextlib.contextmanager
def prefetched(experiments: Sequence[Experiment], jobs: int | None = None
               ) -> Iterator[None]:
    """Run ``experiments`` now, as one batch of work (:func:`run_experiments`), and have
    :func:`run_experiment` hand back their results within the block.

    A command that runs dozens of experiments one after another (``latsim reproduce``)
    otherwise leaves the workers idle at the end of each, while the slowest unit finishes
    and while its tables are built. An experiment's result depends on the experiment alone
    (never on the pool, the number of workers or the order work finished in), so handing
    back a result computed earlier changes nothing; one listed twice runs once. The same
    result object is handed to every caller that asks for that experiment."""
    unique = list(dict.fromkeys(experiments))
    done = dict(zip(unique, run_experiments(unique, jobs), strict=True))
    outer = _PREFETCHED.get()
    token = _PREFETCHED.set(done if outer is None else {**outer, **done})
    try:
        yield
    finally:
        _PREFETCHED.reset(token)


def plan_all(experiments: Sequence[Experiment], jobs: int | None = None) -> list[Plan]:
    """:func:`plan` of each experiment, their ``--lead auto`` pilots on the active work
    pool, else on ``jobs`` local worker processes (default: up to 2) as their runs are."""
    jobs = check_jobs(jobs)
    pilots_pool = (contextlib.nullcontext() if active_pool() is not None or jobs <= 1
                   else using(LOCAL, jobs))  # it forks only for a map of several pilots
    with pilots_pool:
        return [plan(experiment) for experiment in experiments]


def run_experiment(
    experiment: Experiment,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExperimentResult:
    """Run every (cell, replication): on the active work pool
    (:func:`latsim.experiments.executors.using`), else ``jobs`` local worker processes
    (default: up to 2). Results are placed by task, so the output does not depend on
    where or in which order the work ran. Within :func:`prefetched`, an experiment it ran
    is not run again."""
    done = _PREFETCHED.get()
    if done is not None and experiment in done:
        check_jobs(jobs)
        if progress:
            p = done[experiment].plan
            progress(len(p.cells) * p.replications, len(p.cells) * p.replications)
        return done[experiment]
    return run_experiments([experiment], jobs, progress)[0]


def run_experiments(
    experiments: Sequence[Experiment],
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ExperimentResult]:
    """Several experiments as one batch of work (see :func:`run_experiment`): every run of
    every experiment goes into the same work units, so the pool is busy until the last."""
    jobs = check_jobs(jobs)
    progress = progress or _PROGRESS.get()
    plans = plan_all(experiments, jobs)
    tasks = [(e, c, rep) for e, p in enumerate(plans)
             for c in range(len(p.cells)) for rep in range(p.replications)]
    results: list[RunRecords | ServingRecords | None] = [None] * len(tasks)
    pool = active_pool() or LocalPool(jobs if len(tasks) >= 8 else 1)
    chunks = strided_chunks(len(tasks), pool.workers)
    work: list[_Unit] = []
    for chunk in chunks:
        unit: dict[int, list[tuple[int, int]]] = {}
        for i in chunk:
            e, cell, rep = tasks[i]
            unit.setdefault(e, []).append((cell, rep))
        work.append([(plans[e], runs) for e, runs in unit.items()])
    done = 0
    with gc_paused():  # while results are unpickled and summarized
        for index, unit_results in pool.map_unordered(_run_chunk, work):
            # a unit's results come grouped by experiment, in the unit's order
            order = sorted(chunks[index], key=lambda i: tasks[i][0])
            for i, records in zip(order, unit_results, strict=True):
                results[i] = records
            done += len(chunks[index])
            if progress:
                progress(done, len(tasks))
        out = []
        start = 0  # tasks run experiment by experiment, cell by cell
        for p in plans:
            runs: dict[tuple[int, str], list[RunRecords | ServingRecords]] = {}
            for cell in p.cells:
                key = (cell.timing.K, cell.policy.name)
                runs.setdefault(key, []).extend(results[start:start + p.replications])  # type: ignore[arg-type]
                start += p.replications
            rows = [_row(p, cell, runs) for cell in p.cells
                    if cell.policy.name in p.experiment.policies]
            out.append(ExperimentResult(p, rows, runs))
    return out


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def check_jobs(jobs: int | None) -> int:
    """``--jobs`` resolved (``None``: :func:`default_jobs`) and range-checked."""
    return default_jobs() if jobs is None else check_int("--jobs", jobs, 1, MAX_JOBS)


def _theory_mean(p: Plan, cell: Cell) -> float | None:
    """The closed-form E[L] where one holds, else None (a blank theory column).

    The closed forms assume one fixed C for every job, refills and replans alike
    (``cost.deterministic``), one worker that keeps up (C <= T) and a lead that covers C.
    Under eager commit every policy behaves like the baseline: L is uniform on
    [lead, lead + T) at any update rate. Under lazy commit only latent commitment (q = 1)
    has one, :func:`theory.speculative_latency_mean` in the rare-update limit (plus
    lead − C for a lead above C), and only while its branches are placed ``lead`` ahead: a
    ``commit_lead`` beyond the lead moves them further.
    """
    timing, K = cell.timing, cell.timing.K
    if p.experiment.run_ahead:  # refills start earlier than the closed forms assume
        return None
    if not p.cost.deterministic or not p.model.closed_forms_hold():
        return None
    C = p.cost.mean(K)
    if C > timing.T or C > cell.lead + 1e-12:
        return None
    if cell.policy.commit == "eager":
        return theory.baseline_latency_quantile(cell.lead, timing.T, 0.5)
    if cell.policy.commit_unit(K) == 1 and cell.policy.commit_lead <= cell.lead:
        return theory.speculative_latency_mean(C, timing.T, timing.delta, max(cell.lead, C))
    return None


def _stream_runs(runs: list) -> list[RunRecords]:
    """Every stream's controller records, replication by replication (serving runs hold
    several; the pairing of policies by index stays: stream s of replication r)."""
    return [s for run in runs for s in (run.streams if isinstance(run, ServingRecords)
                                        else (run,))]


#: What a row says (``A_note``) where its A is null because no baseline ran beside it.
A_NOTE = ("no baseline ran on the same arrivals in this command: --policy both "
          "measures A (A_from_w estimates it from w)")


def _row(p: Plan, cell: Cell, runs: dict) -> dict:
    K = cell.timing.K
    own = runs[(K, cell.policy.name)]
    metrics = p.model.metrics(own)
    baseline = runs.get((K, "baseline"))
    A, A_se = ((None, None) if baseline is None
               else work_ratio(_stream_runs(own), _stream_runs(baseline)))
    identity = RunIdentity.of(cell.config, p.cost.spec, p.cost.mean(K), p.arrivals.spec,
                              p.duration, p.experiment.seed)
    auto = dict(p.auto_leads).get((K, cell.policy.name))
    return summary_row(
        identity, metrics, A=A, A_se=A_se,
        A_from_w=theory.work_amplification(metrics["w"]) if metrics["w"] is not None else None,
        L_mean_theory=_theory_mean(p, cell),
        **({} if auto is None else {"lead_wait": auto[0], "lead_model": auto[1]}),
        **({} if baseline is not None else {"A_note": A_NOTE}),
        **({} if p.serving is None
           else {"refill_rho": refill_load(p.serving, p.cost, cell.timing)}),
    )


def replication_rows(result: ExperimentResult, index: int = 0) -> list[dict]:
    """Row ``index`` of ``result`` (a (K, policy) summary) for each replication alone: what
    a metric's standard error over the replications is taken from."""
    p = result.plan
    shown = [cell for cell in p.cells if cell.policy.name in p.experiment.policies]
    cell = shown[index]
    return [_row(p, cell, {key: [runs[r]] for key, runs in result.runs.items()})
            for r in range(p.replications)]


def experiment_config(result: ExperimentResult) -> dict:
    """``config.json`` of an experiment folder: the run-folder format and every input."""
    experiment, p = result.plan.experiment, result.plan
    return {
        "format_version": FORMAT_VERSION, "kind": "experiment", "status": COMPLETE,
        "Ks": list(experiment.Ks), "r": experiment.r, "fps": experiment.fps,
        "cost": p.cost.spec, "lead": experiment.lead, "q": experiment.q,
        "policies": list(experiment.policies), "updates": p.arrivals.spec,
        "duration": p.duration, "replications": p.replications, "seed": experiment.seed,
        "commit": experiment.commit, "commit_lead": experiment.commit_lead,
        **({"run_ahead": experiment.run_ahead} if experiment.run_ahead else {}),
        **({"records": experiment.records} if experiment.records != "all" else {}),
        **({"replan_at_cache_end": experiment.replan_at_cache_end}
           if experiment.replan_at_cache_end != "defer" else {}),
        **({} if p.serving is None else {"serving": p.serving.describe()}),
        **({"twin": True} if experiment.twin else {}),
        **({"pilot": experiment.pilot} if experiment.pilot != PILOT_PART else {}),
    }


#: Where an experiment folder keeps the records of the baseline twin that a speculative
#: run's A (work amplification) is measured against, when the baseline was not asked for
#: but its twin was (``Experiment.twin``).
TWIN_FOLDER = "baseline_twin"


def _twin(result: ExperimentResult) -> ExperimentResult:
    """The baseline twin of ``result`` (run only to measure A) as an experiment of its own."""
    p = result.plan
    # the speculative policy's overrides (q, commit) do not apply to the baseline
    plan = replace(p, experiment=replace(p.experiment, policies=("baseline",), q=None,
                                         commit=None, commit_lead=0.0, twin=False))
    runs = {key: cell_runs for key, cell_runs in result.runs.items() if key[1] == "baseline"}
    return ExperimentResult(plan, [_row(plan, cell, runs) for cell in p.cells
                                   if cell.policy.name == "baseline"], runs)


#: What an experiment folder's own files may be called (:func:`write_experiment` and the
#: figure ``simulate``/``sweep`` draw): those a later run into the folder replaces.
EXPERIMENT_FILES = ("config.json", "summary.json", "summary.csv",
                    *(f"{table}.csv" for table in (*RECORD_TYPES, *SERVING_RECORD_TYPES)),
                    "latency_cdf.png", "latency_vs_K.png")


def write_experiment(result: ExperimentResult, out: Path,
                     twin_of: list[str] | None = None,
                     also: Callable[[Path], Path] | None = None) -> list[Path]:
    """Write an experiment folder (:mod:`latsim.run.folder`): ``config.json``,
    ``summary.json``/``.csv`` and one CSV per record type the experiment kept (none with
    ``records="none"``; not the counted ones, :data:`COUNTED_TABLES`, below ``all``), for
    the policies asked for. The baseline twin that a speculative run alone is measured
    against, where it asked for one (``Experiment.twin``), goes to :data:`TWIN_FOLDER`, an
    experiment folder of its own whose config says ``twin_of``. ``also`` writes one more
    file into ``out`` (the command's figure) before ``config.json`` says complete, so a
    folder whose figure failed or hangs says ``running``. Returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    config = experiment_config(result)
    if twin_of:
        config["twin_of"] = twin_of
    written = [write_json(out / "config.json", {**config, "status": RUNNING})]
    asked = result.plan.experiment.policies
    own = {key: cell_runs for key, cell_runs in result.runs.items() if key[1] in asked}
    runs = (((policy, K, index), run)
            for (K, policy), cell_runs in own.items()
            for index, run in enumerate(cell_runs))
    level, model = result.plan.experiment.records, result.plan.model
    if level != "none":
        written += model.write_records(out, runs, () if level == "all" else COUNTED_TABLES)
        if len(own) < len(result.runs):
            written += write_experiment(_twin(result), out / TWIN_FOLDER,
                                        twin_of=list(asked))
    written += model.write_tables(out, own)
    write_rows_csv(out / "summary.csv", result.rows)
    written += [out / "summary.csv", write_json(out / "summary.json", result.rows)]
    if also is not None:
        written.append(also(out))
    write_json(out / "config.json", config)
    return written
