"""The live harness: latsim's controller driven by the wall clock and a real generator.

Laid out by parts; imports run one way, ``generators`` <- ``live`` <- ``measure`` / ``serve``
(``telemetry`` and ``net`` beside them, ``viewer`` and ``tools`` on top):

- :mod:`harness.generators` live generators (``wan``, ``ltx``, ``sleep``; entry points of
  ``latsim.generators``), their presets and devices
- :mod:`harness.live`       the wall-clock driver (one event queue, the controller on one
  thread, a generator worker), the player clock, the record writer, the job executor and
  its fault injection (``LATSIM_FAULT``)
- :mod:`harness.measure`    one measurement (``latsim measure``): configuration and bounds,
  warm-up and lead calibration, the run folder, and ``latsim profile``
- :mod:`harness.telemetry`  NVML utilisation sampling (``nvml``) and its pure reduction to
  kernel activity (``reduce``)
- :mod:`harness.net`        the wire messages of serve and client, min-RTT clock alignment and
  a seeded delay/jitter/loss shaper
- :mod:`harness.serve`      ``latsim serve``: the shared device, a viewer session, the
  WebSocket protocol loop
- :mod:`harness.viewer`     ``latsim client``: a viewer that measures L end to end
- :mod:`harness.tools`      ``python -m harness.tools.gpu_check``, the script a GPU machine runs
- :mod:`harness.cli`        the commands, joined to ``latsim`` as a plugin

Importing this package does not import torch.
"""
