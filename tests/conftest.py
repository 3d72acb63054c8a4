"""Test configuration: hypothesis is derandomized in CI so a run is reproducible, and the
longest tests start first (tests/durations.json) so that the workers end together."""

import json
import os
import signal
from pathlib import Path

import pytest
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


#: The tests that take long, with the wall seconds each took in a run of the whole suite
#: as CI runs it (``--store-durations``). They start first, longest first, and each worker
#: takes its next test when it is done with the last (below): a long test that started
#: last would hold the run open while the other workers idle (a 36 s test of sleeps did,
#: by about a minute). A test missing from the file keeps its place; the order changes no
#: result.
DURATIONS = Path(__file__).with_name("durations.json")
#: The shortest test the file keeps (wall seconds).
LONG_TEST_S = 4.0


def pytest_configure(config):
    """Under ``-n``, a worker asks for one test at a time (``--maxschedchunk 1``, unless
    given): xdist otherwise hands out runs of consecutive tests, and the first run would
    hold every long test of :data:`DURATIONS`."""
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_addoption(parser):
    parser.addoption("--store-durations", metavar="PATH", default=None,
                     help=f"write the wall seconds of every test of at least {LONG_TEST_S:g} s "
                          f"(setup, call and teardown) to PATH as JSON (tests/durations.json)")


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by fixture
def pytest_collection_modifyitems(config, items):
    try:
        long = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    first = sorted((item for item in items if item.nodeid in long),
                   key=lambda item: -long[item.nodeid])
    if first:
        items[:] = first + [item for item in items if item.nodeid not in long]


_took: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--store-durations")
    if path and not hasattr(session.config, "workerinput"):  # the controller's reports
        long = {nodeid: round(took, 1) for nodeid, took in sorted(_took.items())
                if took >= LONG_TEST_S}
        Path(path).write_text(json.dumps(long, indent=1) + "\n")
