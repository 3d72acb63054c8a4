"""latsim: response-latency simulator for interactive video generation.

The public surface is small: a :class:`~latsim.controller.timing.Timing` (K, r, fps), a
:class:`~latsim.controller.policies.Policy` (commit unit and mode), a cost model and an
arrival process (:mod:`latsim.model`), and :func:`~latsim.sim.simpy_driver.simulate_trace`,
which drives the sans-IO :class:`~latsim.controller.Controller` on SimPy's clock through the
run layer (:mod:`latsim.run`). The folders are the layers; docs/design.md §3 lists them.
"""

__version__ = "0.1.0"
