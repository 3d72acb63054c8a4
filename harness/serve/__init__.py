"""``latsim serve``: a live generator shared by viewer sessions behind a WebSocket endpoint.

- :mod:`~harness.serve.config`  what it builds and how it serves (``ServerConfig``)
- :mod:`~harness.serve.device`  the shared device: jobs in the schedule plug-in's order
- :mod:`~harness.serve.session` one viewer's controller, stream state and outbox
- :mod:`~harness.serve.server`  the configuration, the protocol loop, a server on a thread
"""
