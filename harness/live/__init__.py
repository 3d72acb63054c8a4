"""The live run: latsim's controller on the wall clock.

- :mod:`~harness.live.driver`   one event queue, the controller on one thread, a generator
  worker thread, the hang watch, the run's result
- :mod:`~harness.live.player`   precise sleeps, the player clock (slot ticks, wake-ups), the
  condition injector that replays a trace
- :mod:`~harness.live.recorder` appends the controller's records to CSV while the run goes
- :mod:`~harness.live.executor` runs a live generator's jobs for the driver
- :mod:`~harness.live.faults`   ``LATSIM_FAULT``: faults injected on purpose, for tests

It uses generators only through :class:`latsim.plugins.LiveGenerator`.
"""
