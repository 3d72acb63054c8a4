"""The in-run calibration pass of a live measurement: job times as the controller sees them.

Warm-up jobs run alone; in a run the same job shares the process with the player clock, the
driver and the recorder, so :func:`calibrate` measures job times as the controller sees them
in a short pass of the real driver (baseline refills, no conditions), and the lead is taken
from whichever of the two is longer (:func:`harness.live.lead.choose_lead`). The same pass
measures the player's own jitter (slot-start lateness and job dispatch delay), which sets
the lead's margin (:meth:`latsim.model.lead.LeadRule.jitter`).

The calibration pass is a real run: Ctrl-C or SIGTERM during it raise
:class:`~latsim.errors.Interrupted`, a generator exception or a hung job raise
:class:`~latsim.errors.LatsimError` naming it; neither lets the measurement go on.
"""

from __future__ import annotations

from harness.live.driver import DriverConfig, LiveDriver
from harness.live.executor import GeneratorExecutor
from harness.live.lead import Calibration, default_job_timeout
from latsim.controller import ControllerConfig
from latsim.controller.policies import BASELINE
from latsim.controller.timing import Timing
from latsim.errors import Interrupted, LatsimError
from latsim.model.traces import Trace
from latsim.plugins import LiveGenerator


def calibrate(generator: LiveGenerator, timing: Timing, lead: float, jobs: int, max_s: float,
              decode_group: int, drain: float | None = None,
              job_timeout: float | None = None) -> Calibration:
    """Job times as the controller sees them in a live run (``t_ready - t_start``: timer
    lateness and dispatch delay count too), and the player's jitter, from a pass of
    baseline refills with no conditions; about ``jobs`` jobs, at most ``max_s`` seconds.

    Raises :class:`Interrupted` if Ctrl-C or SIGTERM stopped the pass and
    :class:`LatsimError` if the generator failed or a job ran past ``job_timeout``
    (default :func:`default_job_timeout`)."""
    if jobs <= 0:
        return Calibration()
    duration = max(min((jobs + 1) * timing.T, max_s), timing.T)
    if job_timeout is None:
        job_timeout = default_job_timeout(lead)
    label = f"calibration-K{timing.K}"
    generator.reset_stream(timing.K)
    driver = LiveDriver(
        ControllerConfig(timing, BASELINE, lead),
        GeneratorExecutor(generator, decode_group, label),
        Trace("calibration", (), duration),
        DriverConfig(duration, drain, job_timeout_s=job_timeout),
    )
    result = driver.run()
    if result.failed:
        stuck = (" (its generator thread is still running)" if result.worker_alive else "")
        raise LatsimError(f"in-run calibration of K={timing.K} failed: "
                          f"{result.stop_reason}{stuck}")
    if result.interrupted:
        stopped = Interrupted(f"in-run calibration of K={timing.K} stopped "
                              f"({result.stop_reason}); nothing of it kept")
        stopped.stop_reason = result.stop_reason  # type: ignore[attr-defined]
        raise stopped
    return Calibration.of(result)
