"""latsim: response-latency simulator for interactive video generation.

The public surface is small: a :class:`~latsim.controller.timing.Timing` (K, r, fps), a
:class:`~latsim.controller.policies.Policy` (commit unit and mode), a cost model, an arrival
process, and :func:`~latsim.sim.simpy_driver.simulate` which drives the sans-IO
:class:`~latsim.controller.Controller` on SimPy's clock.
"""

__version__ = "0.1.0"
