"""One live measurement (``latsim measure``) and ``latsim profile``.

- :mod:`~harness.measure.run`         the options, their bounds, and the orchestration:
  build the generator, warm up, set the lead, one run folder per (K, policy)
- :mod:`~harness.measure.calibration` warm-up jobs, the in-run calibration pass, the lead
- :mod:`~harness.measure.folder`      what a measured run folder holds beyond the records
- :mod:`~harness.measure.profile`     C per K and job kind, written as a cost table
"""
