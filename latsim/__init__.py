"""latsim: response-latency simulator for interactive video generation.

The public surface is small: a :class:`~latsim.controller.timing.Timing` (K, r, fps), a
:class:`~latsim.controller.policies.Policy` (commit unit and mode), a cost model and an
arrival process (:mod:`latsim.model`), and :func:`~latsim.sim.simpy_driver.simulate_trace`,
which drives the sans-IO :class:`~latsim.controller.Controller` on SimPy's clock through the
run layer (:mod:`latsim.run`). The folders are the layers; docs/design.md §3 lists them.
"""

__version__ = "0.1.0"

#: The modules the compiled build compiles (setup.py): the controller and the simulators'
#: per-event paths, where a simulation spends its time.
COMPILED = ("latsim.controller.machine", "latsim.run.stream", "latsim.sim.simpy_driver",
            "latsim.sim.serving", "latsim.sim.bulk", "latsim.sim.bulk_replay")


def build() -> str:
    """Which build runs: ``compiled with mypyc`` when every module of :data:`COMPILED` was
    loaded from an extension module (``LATSIM_COMPILE=1``, see setup.py), ``pure Python``
    when none was, else ``partly compiled with mypyc: MODULES``. Both builds give the same
    numbers; the compiled one is faster."""
    import importlib

    compiled = [name for name in COMPILED
                if not str(importlib.import_module(name).__file__).endswith(".py")]
    if not compiled:
        return "pure Python"
    if len(compiled) == len(COMPILED):
        return "compiled with mypyc"
    return f"partly compiled with mypyc: {', '.join(compiled)}"
