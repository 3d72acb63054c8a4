"""The one exception type that reaches users as a one-line message."""


class LatsimError(ValueError):
    """Bad input or configuration. ``str(error)`` is a complete, single-line explanation."""
