"""The lead of a live run: warm-up jobs, what a calibration pass measured, the choice.

:class:`Warmup` holds a K's warm-up jobs (and the controller-view C of an in-run calibration
pass, :class:`Calibration`); :func:`choose_lead` sets the lead from them by
:data:`latsim.model.lead.LIVE` (the rule object the simulator uses). Shared by a measurement
(:mod:`harness.measure`) and the server (:mod:`harness.serve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.live.driver import DriverResult
from latsim.model.lead import LeadRule
from latsim.plugins import JobTiming


@dataclass(frozen=True)
class Calibration:
    """What an in-run calibration pass measured (seconds)."""

    durations: tuple[float, ...] = ()  # job times as the controller saw them
    slot_lateness: tuple[float, ...] = ()  # slot ticks: fired - due
    dispatch: tuple[float, ...] = ()  # jobs: generator start - controller start

    @classmethod
    def of(cls, result: DriverResult) -> Calibration:
        return cls(
            tuple(j.t_ready - j.t_start for j in result.records.jobs if j.kind != "prebuffer"),
            tuple(result.slot_lateness()), tuple(result.dispatch_delays()),
        )

    @classmethod
    def merge(cls, passes: Sequence[Calibration]) -> Calibration:
        return cls(*(tuple(x for p in passes for x in getattr(p, name))
                     for name in ("durations", "slot_lateness", "dispatch")))

    @property
    def measured_jitter(self) -> bool:
        return bool(self.slot_lateness or self.dispatch)


@dataclass(frozen=True)
class Warmup:
    """Warm-up jobs of one K (and decode group), and the in-run calibration samples."""

    K: int
    decode_group: int
    jobs: tuple[JobTiming, ...]
    calibration: tuple[float, ...] = ()  # controller-view C of the in-run calibration pass

    @property
    def durations(self) -> list[float]:
        return [j.wall_s for j in self.jobs]


@dataclass(frozen=True)
class LeadChoice:
    """The lead of one K, a sentence saying where it came from and the jitter that set its
    margin (``None``: none was measured, or the lead was given)."""

    lead: float
    source: str
    jitter_s: float | None = None


def default_job_timeout(lead: float) -> float:
    """The job timeout when none is given: ``max(10 × lead, lead + 5 s)``.

    The lead is at least the 0.99 quantile of the measured job time, so a job still running
    after ten times that (and at least 5 s more, for a loaded machine's slowest jobs) has
    hung rather than run slowly."""
    return max(10.0 * lead, lead + 5.0)


def choose_lead(rule: LeadRule, warmups: Sequence[Warmup],
                calibration: Calibration | Sequence[float] | None = None) -> LeadChoice:
    """The rule applied to the warm-up jobs, or to the calibration pass where its quantile
    is higher (jobs in a run are slower than alone); the margin covers at least the jitter
    the calibration pass measured."""
    if calibration is None:
        calibration = Calibration()
    elif not isinstance(calibration, Calibration):
        calibration = Calibration(tuple(calibration))
    jitter = (rule.jitter(calibration.slot_lateness, calibration.dispatch)
              if calibration.measured_jitter and rule.jitter_quantile is not None else None)
    quantile = max(rule.sample_quantile(w.durations) for w in warmups)
    source = "warm-up"
    if calibration.durations:
        live = rule.sample_quantile(calibration.durations)
        if live > quantile:
            quantile = live
            source = (f"in-run calibration ({len(calibration.durations)} jobs as the "
                      "controller saw them)")
    described = rule.describe(source, quantile, jitter)
    if jitter is not None:
        level = f"p{100 * (rule.jitter_quantile or 0):g}"
        described += (f"; jitter = {level} slot-start lateness + {level} job dispatch delay "
                      f"of the in-run calibration ({len(calibration.slot_lateness)} slots, "
                      f"{len(calibration.dispatch)} jobs)")
    return LeadChoice(rule.with_margin(quantile, jitter or 0.0), described, jitter)
