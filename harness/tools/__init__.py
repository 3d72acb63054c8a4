"""Scripts and helpers run beside latsim: :mod:`~harness.tools.gpu_check`, the GPU check, and
:mod:`~harness.tools.browser`, the browser viewer in headless Chromium."""
