"""Several experiments as one batch of work (``run_experiments``, ``prefetched``), and what
keeps sending their results back cheap (records pickled as field values, the collector
paused while records are made)."""

from __future__ import annotations

import gc
import pickle
from pathlib import Path

import pytest

import latsim.experiments.engine as sweep
from latsim.controller.records import RECORD_TYPES, record
from latsim.experiments.engine import Experiment, prefetched, run_experiment, run_experiments
from latsim.experiments.executors import LocalPool, gc_paused, using
from latsim.run.stream import BusyInterval
from tests.test_cli import _running
from tests.test_play_ahead import fingerprint

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENTS = [
    Experiment(Ks=(4, 8), cost="fixed:0.4", updates="poisson:0.3", duration=20.0, seeds=3),
    Experiment(Ks=(3,), cost="lognormal:0.5,0.3", updates="bernoulli:0.05", duration=15.0,
               seeds=4, seed=7),
    Experiment(Ks=(6,), cost="fixed:0.2", updates="poisson:1", duration=10.0, seeds=2,
               policies=("baseline",)),
]


def _same(a: sweep.ExperimentResult, b: sweep.ExperimentResult) -> None:
    assert a.rows == b.rows
    assert a.runs.keys() == b.runs.keys()
    for key, runs in a.runs.items():
        assert [fingerprint(r) for r in runs] == [fingerprint(r) for r in b.runs[key]]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_batch_gives_each_experiment_what_it_gives_alone(jobs):
    alone = [run_experiment(e, jobs=1) for e in EXPERIMENTS]
    with using("local", jobs):
        batch = run_experiments(EXPERIMENTS, jobs=jobs)
    assert len(batch) == len(EXPERIMENTS)
    for a, b in zip(alone, batch, strict=True):
        _same(a, b)


def test_prefetched_runs_each_experiment_once_and_hands_back_its_result(monkeypatch):
    calls: list[int] = []
    real = sweep.run_cell

    def counting(experiment, cell, rep, p=None):
        calls.append(cell)
        return real(experiment, cell, rep, p)

    monkeypatch.setattr(sweep, "run_cell", counting)
    first, second, third = EXPERIMENTS
    with prefetched([first, second, first], jobs=1):
        runs_in_batch = len(calls)
        assert runs_in_batch == 2 * 3 * 2 + 2 * 4  # cells x replications, first once
        got = run_experiment(first, jobs=1)
        assert got is run_experiment(first, jobs=1)  # the same object, not run again
        assert len(calls) == runs_in_batch
        calls.clear()
        run_experiment(third, jobs=1)  # not prefetched: runs
        assert len(calls) == 2
    calls.clear()
    _same(got, run_experiment(first, jobs=1))  # outside the block: runs again, the same
    assert len(calls) == 2 * 3 * 2


def test_the_collector_is_paused_in_the_block_and_restored_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves it as it found it
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_records_pickle_as_their_fields_and_come_back_equal():
    result = run_experiment(EXPERIMENTS[1], jobs=1)
    runs = [r for runs in result.runs.values() for r in runs]
    for table in RECORD_TYPES:
        records = [rec for run in runs for rec in getattr(run, table)]
        assert records or table == "stalls"
        for rec in records[:50]:
            cls, args = rec.__reduce__()
            assert cls is type(rec) and cls(*args) == rec
        assert pickle.loads(pickle.dumps(records)) == records
    busy = [b for run in runs for b in run.busy]
    assert busy and pickle.loads(pickle.dumps(busy)) == busy
    assert isinstance(busy[0], BusyInterval)
    # through a forked worker, as the pool sends them
    pool = LocalPool(2)
    back = dict(pool.map_unordered(_identity, runs))
    assert [fingerprint(back[i]) for i in range(len(runs))] == [fingerprint(r) for r in runs]


def _identity(x):
    return x


def test_a_record_type_needs_every_field_in_its_constructor():
    from dataclasses import field

    with pytest.raises(TypeError, match="all in __init__"):
        @record
        class Bad:
            a: int
            b: int = field(init=False, default=0)


@pytest.mark.parametrize("streams", [None, 8])
def test_a_run_leaves_no_cyclic_garbage_per_job(streams):
    """Work units run with the collector paused (``gc_paused``), so what a run leaves for
    it must stay small: the run's own books, which become garbage together when it ends
    (about one object a job: the driver's job intervals), and no cycles made per job as it
    goes (a job's steps once were closures calling themselves, some twenty objects a
    job)."""
    from latsim.experiments.engine import plan, run_cell
    from latsim.model.serving import ServingConfig

    serving = None if streams is None else ServingConfig(streams=streams, start="random")
    left, jobs = [], []
    for duration in (30.0, 240.0):
        experiment = Experiment(Ks=(8,), cost="lognormal:0.4,0.3", updates="poisson:0.2",
                                duration=duration, seeds=1, serving=serving)
        p = plan(experiment)
        gc.collect()
        with gc_paused():
            records = run_cell(experiment, 1, 0, p)
            left.append(gc.collect())
        runs = records.streams if streams else (records,)
        jobs.append(sum(len(run.jobs) for run in runs))
    assert jobs[1] > 4 * jobs[0]
    assert left[1] - left[0] < 2 * (jobs[1] - jobs[0])


def test_a_ctrl_c_that_reaches_a_worker_before_it_starts_is_left_to_the_parent():
    """Ctrl-C goes to the whole process group, workers included. A worker ignores it once
    started, but one just forked took it before then ("Exception in initializer", a
    traceback, a broken pool). Here every forked child signals itself as it is forked, as
    such a Ctrl-C would: the signal must never reach the child's Python code (without the
    fix it is raised in the fork hook, and printed), and the map finishes quietly."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from latsim.experiments.executors import LocalPool\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # even if inherited off
        "os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        "print(sorted(r for _, r in LocalPool(2).map_unordered(abs, [-1, -2, -3, -4])))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[1, 2, 3, 4]\n", "")


#: A host process with a thread of its own (as a pytest-xdist worker or a Jupyter kernel
#: has) that maps with a LocalPool; it records every fork of its own.
_THREADED_HOST = (
    "import os, sys, threading, time\n"
    "forks = []\n"
    "os.register_at_fork(before=lambda: forks.append(1))\n"
    "from latsim.experiments.executors import LocalPool\n"
    "stop = threading.Event()\n"
    "threading.Thread(target=stop.wait, daemon=True).start()\n")


def _threaded_host(body: str, **popen):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-W", "error::DeprecationWarning", "-c",
                             _THREADED_HOST + body], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def test_a_process_with_other_threads_starts_its_workers_without_forking_itself():
    """Forking a process that runs another thread copies only the forking thread; a lock
    the other held stays held in the child (Python 3.12+ warns: "multi-threaded, use of
    fork()"; 140 warnings in the test suite under Python 3.13). There a fork server, a
    fresh single-threaded process, forks the workers: this process forks nothing, nothing
    warns, and the workers see the environment as it is when they start, not as it was
    when the server started."""
    host = _threaded_host(
        "os.environ['LATSIM_TEST_VALUE'] = 'first'\n"
        "print(sorted(r for _, r in LocalPool(2).map_unordered(abs, [-1, -2, -3, -4])))\n"
        "os.environ['LATSIM_TEST_VALUE'] = 'second'\n"
        "seen = LocalPool(2).map_unordered(os.getenv, ['LATSIM_TEST_VALUE'] * 4)\n"
        "print(sorted({value for _, value in seen}), len(forks))\n")
    out, err = host.communicate(timeout=120)
    assert (host.returncode, out, err) == (0, "[1, 2, 3, 4]\n['second'] 0\n", "")


def test_a_fork_servers_workers_die_with_a_parent_killed_outright():
    """A fork server's workers are its children, not the parent's: they watch the server,
    which ends when the parent does (SIGKILL included), and end after it."""
    import contextlib
    import os
    import signal
    import time

    host = _threaded_host(
        "from latsim.experiments.executors import work_pool\n"
        "with work_pool('local', 2) as pool:\n"
        "    for _ in pool.map_unordered(time.sleep, [600, 600]):\n"
        "        pass\n", start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(workers := _descendants(host.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the server and its two workers
        assert len(workers) >= 3, host.stderr.read() if host.poll() is not None else workers
        host.kill()
        host.wait(timeout=60)
        deadline = time.monotonic() + 60
        while (alive := [w for w in workers if _running(w)]) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(host.pid, signal.SIGKILL)
        host.communicate(timeout=60)  # and its pipes closed
    assert not alive


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: parent pid of each)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found

