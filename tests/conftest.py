"""Test configuration: hypothesis is derandomized in CI so a run is reproducible."""

import os
import signal

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Every envelope a test makes says the same "created" (latsim honours SOURCE_DATE_EPOCH), so
# two runs of one command print the same bytes; tests/test_output.py checks the clock itself.
os.environ.setdefault("SOURCE_DATE_EPOCH", "1764547200")
# No --lead auto answer is read from or written to the user's cache folder: a test that
# counts pilots sees them run, and tests/test_lead_cache.py points it at a folder of its own.
os.environ["LATSIM_CACHE_DIR"] = "off"

# A suite started in the background by a non-interactive shell inherits SIGINT ignored
# (POSIX), which Python keeps and its children inherit: the tests of Ctrl-C handling would
# then see no Ctrl-C. Take it back, as an interactive terminal or CI would have it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the README's test command): two workers more than the cores. Many tests
    wait on sockets, child processes and sleeps (the live server, clients, the browser),
    during which one worker per core leaves a core idle; every test is written to pass on
    a loaded machine (README, "Tests and benchmarks", gives the measured times)."""
    return (os.cpu_count() or 1) + 2
