"""Scripts run on other machines: :mod:`~harness.tools.gpu_check`, the GPU check."""
