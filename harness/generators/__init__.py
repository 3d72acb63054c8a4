"""Live generators: real models (and a model-free one) that run the controller's jobs.

Each is a :class:`latsim.plugins.LiveGenerator` built by the factory its
``latsim.generators`` entry point names (``--generator NAME``), from the shared
:class:`latsim.plugins.GeneratorConfig`:

- :mod:`~harness.generators.wan`    the diffusers Wan DiT (+ optional VAE decode), random weights
- :mod:`~harness.generators.ltx`    the diffusers LTX family (r = 8), random weights
- :mod:`~harness.generators.sleep`  no model: each job sleeps for a time a cost spec draws
- :mod:`~harness.generators.presets` Wan's model and resolution presets (no torch import)
- :mod:`~harness.generators.device` checking and naming the device, CPU threads

Importing this package imports no torch.
"""
