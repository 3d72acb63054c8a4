"""The live harness: latsim's controller driven by the wall clock and a real Wan DiT.

- :mod:`harness.presets`   model and resolution presets, analytic FLOP count (no torch import)
- :mod:`harness.generator` the diffusers ``WanTransformer3DModel`` (+ optional
  ``AutoencoderKLWan`` decode) with random weights, executing ``StartJob`` commands
- :mod:`harness.player`    wall-clock timers: precise ``sleep_until``, the player clock that
  delivers slot ticks and wake-ups, the condition injector that replays a trace
- :mod:`harness.driver`    the live driver: one event queue, the controller on one thread,
  a generator worker thread
- :mod:`harness.recorder`  appends the controller's records to CSV while the run goes
- :mod:`harness.telemetry` NVML utilisation sampling and its time-weighted reduction
- :mod:`harness.run`       one measurement: warm-up, lead, one run folder per (K, policy)
- :mod:`harness.gpu_check` the script a GPU machine runs (``python -m harness.gpu_check``)
- :mod:`harness.netclock`  min-RTT clock-offset and drift estimation, and a seeded
  delay/jitter/loss shaper, for a viewer client and a streaming server

Importing this package does not import torch.
"""
