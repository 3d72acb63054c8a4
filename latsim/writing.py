"""Writing files so that a failure names its path and leaves nothing half-written.

:func:`writing` turns an ``OSError`` (a full disk's names no file) into a one-line
:class:`~latsim.errors.LatsimError` that says which file; :func:`replacing` writes a new
file beside the target and renames it over the target only once it is complete, so a
reader sees the old file or the new one, never a torn or empty one; it writes through to a
device or a pipe and never replaces one. :func:`staged` does the same for a set of files
written into one folder: all of them or none. :func:`appending` adds lines to a file whose
errors name it, even those a failed write leaves for its close.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from latsim.errors import LatsimError


def cannot_write(path: object, exc: OSError) -> str:
    """``cannot write PATH: REASON`` for a failed write of ``path``."""
    return f"cannot write {path}: {exc.strerror or exc}"


@contextmanager
def writing(path: object) -> Iterator[None]:
    """Turn an ``OSError`` in the block into a :class:`LatsimError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise LatsimError(cannot_write(path, exc)) from exc


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield the path to write ``path``'s new content to, never replacing what is not a
    file of its own. Errors name ``path`` (:func:`writing`).

    - A regular file (or a new one): a temporary file beside it (same suffix), renamed over
      it when the block ends and removed when the block fails, so a reader sees the old
      file or the new one, never a torn or empty one.
    - A symbolic link is followed: the file it names is replaced, the link stays a link.
    - A process's open file named through ``/dev`` or ``/proc`` (``/dev/stdout`` when the
      shell sends it to a file, ``/dev/fd/N``): the new content is added to it, as any
      write to that stream would be (``>>`` keeps what was there), not renamed over it.
    - A character device or a named pipe (``/dev/stdout``, ``/dev/null``): the path itself,
      written through, and it stays what it is; a pipe with no reader is an error, not a
      wait.
    - Anything else (a directory, a socket) is refused with a one-line error."""
    stream = _names_a_stream(path)
    # a stream's name leads to "pipe:[N]" under realpath: its own stat follows the link
    target = Path(path) if stream else Path(os.path.realpath(path))
    try:
        mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISFIFO(mode):
            _has_reader(path, target)
        elif not stat.S_ISCHR(mode):
            raise LatsimError(f"{path}: not a file (a directory, socket or other); give the "
                              "path of a file to write")
        with writing(path):
            yield target
        return
    if mode is not None and stream:
        with tempfile.TemporaryDirectory(prefix="latsim-") as folder:
            tmp = Path(folder) / f"out{target.suffix}"
            with writing(path):
                yield tmp
                with open(path, "ab") as sink, open(tmp, "rb") as content:
                    shutil.copyfileobj(content, sink)
        return
    tmp = target.with_name(f".{target.stem}.partial{target.suffix}")
    try:
        with writing(path):
            yield tmp
            os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _names_a_stream(path: str | Path) -> bool:
    """Whether ``path`` is a name of an open file (``/dev/stdout``, ``/dev/fd/1``,
    ``/proc/self/fd/1``) rather than of a file on disk."""
    return Path(os.path.abspath(path)).parts[1:2] in (("dev",), ("proc",))


def _has_reader(path: str | Path, fifo: Path) -> None:
    """Refuse a named pipe that nobody reads (opening it to write would wait forever)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise LatsimError(f"{path}: a named pipe with no reader") from None
        raise LatsimError(cannot_write(path, exc)) from exc
    os.close(fd)


@contextmanager
def staged(folder: str | Path) -> Iterator[Path]:
    """Yield a staging folder beside ``folder`` to write a set of files into; when the block
    ends, move each of them into ``folder`` (a rename each, replacing files of the same
    name), so that the set lands whole. When the block fails the staging folder is
    removed and ``folder`` is as it was; a :class:`~latsim.errors.LatsimError` from the
    block names the file in ``folder`` it was writing and says nothing there changed."""
    folder = Path(folder)
    staging = folder.parent / f".{folder.name}.staging-{os.getpid()}"
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    try:
        yield staging
    except LatsimError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise LatsimError(f"{str(exc).replace(str(staging), str(folder))}; nothing in "
                          f"{folder}/ was changed") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        for path in sorted(staging.iterdir()):
            with writing(folder / path.name):
                os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class _Appender:
    """A text file open for appending whose writes' errors name it (:func:`appending`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        with writing(path):
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by appending)

    def write(self, text: str) -> None:
        with writing(self.path):
            self.file.write(text)

    def flush(self) -> None:
        with writing(self.path):
            self.file.flush()


@contextmanager
def appending(path: str | Path) -> Iterator[_Appender]:
    """Append to ``path`` in the block: an ``OSError`` of a write, a flush or the close is
    a :class:`LatsimError` naming ``path``. Where the block fails, what a failed write left
    in the buffer is dropped quietly at the close (a full disk would fail it again, and
    hide the error that ended the block)."""
    appender = _Appender(path)
    try:
        yield appender
    except BaseException:
        with contextlib.suppress(OSError):
            appender.file.close()
        raise
    with writing(path):
        appender.file.close()
