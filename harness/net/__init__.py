"""The network path of ``latsim serve`` and ``latsim client``.

- :mod:`~harness.net.wire`     the messages both sides speak (JSON text frames, binary slot
  frames), checked in one place
- :mod:`~harness.net.netclock` min-RTT clock offset and drift, a seeded delay/jitter/loss
  shaper
"""
