"""The one exception type that reaches users as a one-line message."""


class LatsimError(ValueError):
    """Bad input or configuration. ``str(error)`` is a complete, single-line explanation."""


class Interrupted(KeyboardInterrupt):
    """A run stopped early by Ctrl-C or SIGTERM after keeping what it measured.

    ``str(error)`` says, in one line, what was kept and where; the command line prints it
    after ``latsim: interrupted:`` and exits 130.
    """
