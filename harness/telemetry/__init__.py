"""GPU telemetry: NVML sampling (:mod:`~harness.telemetry.nvml`, the I/O) and its pure
reduction to kernel activity (:mod:`~harness.telemetry.reduce`)."""
