"""Where experiment work runs: in process, a local process pool, or a Dask cluster.

``--scheduler`` picks one: ``local`` (the default: in process, or ``--jobs`` worker
processes, forked where that is safe: :func:`start_method`; Dask is not imported),
``dask-local`` (a ``distributed.LocalCluster`` of
``--jobs`` single-threaded worker processes, started for the run and stopped after), or
the address ``tcp://HOST:PORT`` of a running Dask scheduler (``dask scheduler`` and ``dask
worker`` on each host; the workers need latsim installed).

A :class:`WorkPool` maps a top-level function over items and yields ``(index, result)``
as results come back, in completion order; callers place each result by its index, so what
they write does not depend on the scheduler, the number of workers or the order work
finished in. Random streams are the caller's business and are derived from the item (its
cell and replication), never from the worker.

:func:`using` makes a pool the active one for a block, so experiments deep inside a command
(``latsim reproduce`` runs dozens) use it without every signature carrying it:
:func:`latsim.experiments.engine.run_experiment` takes the active pool when there is one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextvars import ContextVar
from multiprocessing import get_all_start_methods, get_context
from typing import Any, Protocol

from latsim.errors import LatsimError, install_hint

LOCAL = "local"
DASK_LOCAL = "dask-local"
_ADDRESS = re.compile(r"^tcp://[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


def check_scheduler(text: str) -> str:
    """``--scheduler`` validated: ``local``, ``dask-local`` or ``tcp://HOST:PORT``."""
    if text in (LOCAL, DASK_LOCAL) or _ADDRESS.match(text):
        return text
    raise LatsimError(f"--scheduler must be local, dask-local or tcp://HOST:PORT, got {text!r}")


class WorkPool(Protocol):
    """Runs ``fn(item)`` for every item; yields ``(index, result)`` as results arrive."""

    workers: int

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]: ...


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (and back on after, if it was on).

    Simulating and collecting results allocate records by the hundred thousand, and every
    allocation burst makes the collector walk all of them again, for nothing: records hold
    no cycles. A run leaves a few small cycles behind (its SimPy environment and driver),
    which the collector takes after the block. Measured on ``latsim reproduce``'s
    simulations: 10% of the time in a worker, and half the time of loading their results."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _start_worker(parent: int, environ: dict[str, str] | None = None) -> None:
    """A worker leaves Ctrl-C to the parent, which stops it, and runs what it is given in
    process: the active pool a forked one inherits is the parent's (an experiment it plans
    would hand its ``--lead auto`` pilots to it). It starts with SIGINT blocked
    (:func:`_sigint_blocked`; a spawned worker and a fork server keep the mask they were
    started with): a Ctrl-C that came before this is dropped here. It dies with its
    parent (:func:`_die_with`), whose pid is ``parent``. ``environ``: the parent's
    environment, for a fork server's worker (the server's is the one it started with)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the cyclic collector on, whatever it was in the parent as it forked (pools fork at
    # their first map, which may come inside a gc_paused block): each unit pauses it
    # itself, and the cycles a unit leaves are collected after it. What the parent held
    # as it forked is frozen first: the worker never frees it, and a collection that
    # walked it would copy the parent's pages into the worker
    gc.freeze()
    gc.enable()
    if _CAN_BLOCK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    _ACTIVE.set(None)
    _die_with(parent)


#: How often a worker looks whether its parent is still there (s).
PARENT_CHECK_S = 0.25


def _die_with(parent: int) -> None:
    """End this worker once ``parent`` is gone (a parent killed with SIGKILL cannot stop
    its workers, which would run on, orphaned): a daemon thread looks every
    :data:`PARENT_CHECK_S` whether this process was handed to another parent, as POSIX
    does with an orphan. Polling, not Linux's ``PR_SET_PDEATHSIG``, which fires when the
    *thread* that forked ends, and works on every platform that forks. A fork server's
    worker is the server's child, and the server outlives the parent while its workers
    hold the pipe it waits on: such a worker looks whether ``parent`` itself is there
    (:func:`_alive`)."""
    direct = os.getppid() == parent

    def watch() -> None:
        while os.getppid() == parent if direct else _alive(parent):
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="latsim-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is there and has not ended (Linux: a zombie has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # there, another user's
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


_CAN_BLOCK = hasattr(signal, "pthread_sigmask")


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back from this thread for the block, where workers are forked: a child
    inherits the mask, so a Ctrl-C to the process group just as it starts stays pending
    until :func:`_start_worker` ignores it (it used to kill the child before then, with a
    traceback, and break the pool). The parent takes its own Ctrl-C when the block ends."""
    if not _CAN_BLOCK:
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


#: What stops a thread of this process while workers are forked, and starts it again after
#: (the progress bar's refresh thread, :func:`paused_while_forking`).
_FORK_PAUSES: list[contextlib.AbstractContextManager[None]] = []


@contextlib.contextmanager
def paused_while_forking(pause: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    """Within the block, :class:`LocalPool` enters ``pause`` around each fork of its
    workers. A child forked while another thread runs inherits whatever locks that thread
    held (the stderr a progress bar draws on, say) and may deadlock on them; Python 3.12+
    warns of it ("This process is multi-threaded, use of fork() may lead to deadlocks")."""
    _FORK_PAUSES.append(pause)
    try:
        yield
    finally:
        _FORK_PAUSES.remove(pause)


@contextlib.contextmanager
def _forking() -> Iterator[None]:
    """Where workers are forked: SIGINT held back (:func:`_sigint_blocked`) and this
    process's own threads stopped (:func:`paused_while_forking`)."""
    with contextlib.ExitStack() as stack:
        for pause in list(_FORK_PAUSES):
            stack.enter_context(pause)
        stack.enter_context(_sigint_blocked())
        yield


FORK = "fork"
FORKSERVER = "forkserver"
SPAWN = "spawn"
#: What a fork server imports once, before it forks workers: what every task needs.
SERVER_PRELOAD = ["latsim.experiments.executors", "latsim.experiments.engine",
                  "latsim.sim.serving", "latsim.sim.simpy_driver"]


#: How long :func:`start_method` waits for threads that are ending.
THREADS_ENDING_S = 0.05


def start_method() -> str:
    """How :class:`LocalPool` starts its workers, decided where they start.

    ``fork`` (a copy of this process, its imports done: a worker starts in milliseconds)
    where it is safe: on a POSIX system other than macOS, when no other thread runs
    Python. A fork copies only the thread that calls it; a lock another thread held then
    (a stream's, the import lock's) stays held in the child forever. latsim's own thread,
    the progress bar's, is stopped for the fork (:func:`paused_while_forking`), so the
    command line forks; a host's threads are not: a pytest-xdist worker's channel
    threads, a Jupyter kernel's, a server's. There ``forkserver``: one fresh
    single-threaded process, started once (about 0.8 s on a loaded 2-core machine: it
    imports :data:`SERVER_PRELOAD`), forks the workers, and each takes this process's
    folder, ``sys.path`` and environment as they are when it starts (a script run as
    ``__main__`` is imported again in each, so its work must sit under
    ``if __name__ == "__main__":``, as with any non-fork start). On macOS (whose system
    libraries are not fork-safe: CPython spawns there by default) and on Windows (no
    fork), ``spawn``: a fresh interpreter per worker.

    Threads that never run Python do not count: OpenBLAS's pool (numpy and scipy start
    one) stops itself for a fork, and jemalloc (pyarrow's allocator) takes its locks
    across one (``pthread_atfork``). Python 3.12+ counts the system's threads when it
    warns of a fork, so jemalloc's background thread, which stays, still draws its
    "multi-threaded, use of fork()" warning once pyarrow is imported."""
    methods = get_all_start_methods()
    if FORK not in methods or sys.platform == "darwin":
        return SPAWN
    deadline = time.monotonic() + THREADS_ENDING_S
    while len(sys._current_frames()) > 1:  # threads with Python state, _thread's too
        if time.monotonic() >= deadline:
            return FORKSERVER if FORKSERVER in methods else SPAWN
        time.sleep(0.002)
    return FORK


def strided_chunks(n: int, workers: int) -> list[range]:
    """Items ``0..n-1`` in work units for ``workers``: one item each in process (so progress
    can be reported item by item), else up to 8 strided units per worker (big enough that
    scheduling overhead stays small, several per worker so they finish close together)."""
    count = n if workers <= 1 else max(1, min(n, 8 * workers))
    return [range(i, n, count) for i in range(count)]


def _executor(workers: int) -> ProcessPoolExecutor:
    """A process pool of ``workers`` started the way :func:`start_method` says."""
    method = start_method()
    context = get_context(method)
    environ = None
    if method == FORKSERVER:
        context.set_forkserver_preload(SERVER_PRELOAD)  # no-op once the server runs
        environ = dict(os.environ)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context,
                               initializer=_start_worker, initargs=(os.getpid(), environ))


class LocalPool:
    """In process (``jobs`` <= 1), or ``jobs`` worker processes (forked, or spawned where
    a fork is not safe: :func:`start_method`).

    A pool made by :func:`work_pool` keeps its workers from the first map to the end of the
    block (``latsim reproduce`` runs dozens of experiments: forking for each cost more than
    some of them take); one made directly forks for each map and stops them after it.
    """

    def __init__(self, jobs: int, keep_workers: bool = False) -> None:
        self.workers = max(1, jobs)
        self._keep = keep_workers
        self._executor: ProcessPoolExecutor | None = None

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]:
        if self.workers <= 1 or len(items) <= 1:
            for index, item in enumerate(items):
                yield index, fn(item)
            return
        pool = self._executor
        try:
            with _forking():  # the first submit starts the workers
                if pool is None:  # decided with latsim's own threads stopped
                    pool = _executor(self.workers)
                    if self._keep:
                        self._executor = pool
                pending = {pool.submit(fn, item): index for index, item in enumerate(items)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield pending.pop(future), future.result()
        except BaseException:  # Ctrl-C, a failed task, or the caller stopped early
            self._executor = None
            if pool is None:
                raise
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        if not self._keep:
            pool.shutdown(wait=True)

    def close(self) -> None:
        """Stop the kept workers (a no-op when none were started)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class DaskPool:
    """Work on a Dask cluster through ``client``; a task whose worker dies is run again
    elsewhere by Dask (its result is kept only once)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        try:  # newer clients list only some workers unless asked for all
            info = client.scheduler_info(n_workers=-1)
        except TypeError:
            info = client.scheduler_info()
        self.workers = max(1, len(info.get("workers", {})))
        client.run(_warm_up)  # each worker imports the simulator once, before any task

    def map_unordered(self, fn: Callable[[Any], Any], items: Sequence[Any]
                      ) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed

        futures = self.client.map(fn, list(items), pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        try:
            for future in as_completed(futures):
                yield index[future.key], future.result()
        finally:
            self.client.cancel(futures)


def _warm_up() -> None:
    """Import what every task needs (numpy, SimPy, the simulators) on a worker; the
    experiment engine on top of them is light."""
    import latsim.sim.serving
    import latsim.sim.simpy_driver  # noqa: F401


def _require_dask() -> None:
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        raise LatsimError("--scheduler dask-local or tcp:// needs Dask: install the dask "
                          f"extra, {install_hint('dask')}")


@contextlib.contextmanager
def work_pool(scheduler: str = LOCAL, jobs: int = 1) -> Iterator[WorkPool]:
    """The pool ``scheduler`` names (a local cluster lives as long as the block)."""
    scheduler = check_scheduler(scheduler)
    if scheduler == LOCAL:
        pool = LocalPool(jobs, keep_workers=True)
        try:
            yield pool
        finally:
            pool.close()
        return
    _require_dask()
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler == DASK_LOCAL:
        # no dashboard, and the scheduler's HTTP server on a free port: with
        # dashboard_address=None it still takes 8787, and another cluster there makes
        # Distributed warn on stderr
        with LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True,
                          dashboard_address=":0", scheduler_kwargs={"dashboard": False}
                          ) as cluster, Client(cluster) as client:
            yield DaskPool(client)
        return
    try:
        client = Client(scheduler, timeout=10)
    except OSError as exc:
        raise LatsimError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    with client:
        yield DaskPool(client)


_ACTIVE: ContextVar[WorkPool | None] = ContextVar("latsim_work_pool", default=None)


def active_pool() -> WorkPool | None:
    """The pool of the innermost :func:`using` block, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(scheduler: str = LOCAL, jobs: int = 1) -> Iterator[WorkPool]:
    """Run the block's experiments on ``scheduler`` (see the module docstring)."""
    with work_pool(scheduler, jobs) as pool:
        token = _ACTIVE.set(pool)
        try:
            yield pool
        finally:
            _ACTIVE.reset(token)


@contextlib.contextmanager
def local_only() -> Iterator[None]:
    """No active pool in the block: a worker runs its own experiments in process (a forked
    worker inherits the parent's active pool, which it must not use)."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
