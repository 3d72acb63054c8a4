"""Warm-up and lead calibration of a live measurement: the measured C samples the lead is set
from, by :data:`latsim.model.lead.LIVE` (the same rule object the simulator uses).

Timed warm-up jobs are separated by idle gaps because jobs in a live run start from idle and
take longer than back-to-back ones. Warm-up jobs run alone; in a run the same job shares the
process with the player clock, the driver and the recorder, so :func:`calibrate` measures job
times as the controller sees them in a short pass of the real driver, and the lead is taken
from whichever of the two is longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.driver import DriverConfig, LiveDriver
from harness.generator import JobTiming, WanGenerator
from latsim.controller import ControllerConfig, StartJob
from latsim.controller.policies import BASELINE
from latsim.controller.timing import Timing
from latsim.model.lead import LeadRule
from latsim.model.traces import Trace


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
    """The lead of one K and a sentence saying where it came from."""

    lead: float
    source: str


class GeneratorExecutor:
    """Adapts the generator to the driver's ``run_job(job)``, decoding ``decode_group``."""

    def __init__(self, generator: WanGenerator, decode_group: int) -> None:
        self.generator = generator
        self.decode_group = decode_group

    def run_job(self, job: StartJob) -> JobTiming:
        return self.generator.run_job(job, self.decode_group)


def calibrate(generator: WanGenerator, timing: Timing, lead: float, jobs: int, max_s: float,
              decode_group: int, drain: float | None = None) -> list[float]:
    """Job times as the controller sees them in a live run (``t_ready - t_start``: timer
    lateness and dispatch delay count too), from a pass of baseline refills with no
    conditions; about ``jobs`` jobs, at most ``max_s`` seconds."""
    if jobs <= 0:
        return []
    duration = max(min((jobs + 1) * timing.T, max_s), timing.T)
    generator.reset_stream(timing.K)
    driver = LiveDriver(
        ControllerConfig(timing, BASELINE, lead),
        GeneratorExecutor(generator, decode_group),
        Trace("calibration", (), duration), DriverConfig(duration, drain),
    )
    result = driver.run()
    return [j.t_ready - j.t_start for j in result.records.jobs if j.kind != "prebuffer"]


def choose_lead(rule: LeadRule, warmups: Sequence[Warmup], calibration: Sequence[float]
                ) -> LeadChoice:
    """The rule applied to the warm-up jobs, or to the calibration pass where its quantile
    is higher (jobs in a run are slower than alone)."""
    warm = max(rule.sample_quantile(w.durations) for w in warmups)
    choice = LeadChoice(rule.with_margin(warm), rule.describe("warm-up", warm))
    if calibration:
        live = rule.sample_quantile(calibration)
        if live > warm:
            choice = LeadChoice(rule.with_margin(live), rule.describe(
                f"in-run calibration ({len(calibration)} jobs as the controller saw them)",
                live))
    return choice
