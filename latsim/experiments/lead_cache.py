"""``--lead auto``'s pilot answers kept on disk, so that a repeated run does not pay again.

A pilot run's answer (:func:`latsim.experiments.engine.auto_lead_wait`) is a pure function
of its inputs: the cell, the resolved cost model, arrival source and serving configuration
(their contents, not their specs: a trace or cost table edited under the same path is
another input), the seed, and the simulator's code. The key is a SHA-256 of all of them
(the objects pickled, with a digest of latsim's own source files), so an answer read back
is the one the pilot would give again, byte for byte, and any change to an input or to
the code is a miss. Inputs that cannot be pickled (a plug-in's cost model, say) are never
cached.

Where: ``$LATSIM_CACHE_DIR/leads`` if that is set (``off`` turns the cache off; the tests
and the benchmarks that time pilots do so), else ``$XDG_CACHE_HOME/latsim/leads``, else
``~/.cache/latsim/leads``; one small JSON file per answer. A damaged or foreign file is
read as a miss and written anew; a folder that cannot be written only costs the pilot
next time. Delete the folder to forget every answer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

from latsim.errors import LatsimError
from latsim.writing import replacing

#: The environment variable naming the cache folder (``off``: no cache).
CACHE_ENV = "LATSIM_CACHE_DIR"
#: Bumped when what an answer file holds changes.
FORMAT = 1


def cache_folder() -> Path | None:
    """The folder the answers go to, or None where the cache is off."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return None if given.strip().lower() in ("", "off", "0", "none") else Path(given) / "leads"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "latsim" / "leads"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of latsim's own Python source: a changed simulator is another input."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def answer_key(inputs: Any) -> str | None:
    """The key of the answer to ``inputs`` (any picklable value), or None where they
    cannot be pickled (then nothing is cached)."""
    try:
        data = pickle.dumps((FORMAT, source_digest(), inputs), protocol=4)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None  # a plug-in's object, say: not cached, never a failed run
    return hashlib.sha256(data).hexdigest()


def read_answer(key: str) -> tuple[float, str] | None:
    """The answer kept under ``key``, or None (none kept, the cache off, or a file that is
    not an answer)."""
    folder = cache_folder()
    if folder is None:
        return None
    try:
        data = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
        wait, model = data["wait"], data["model"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if (data.get("format") != FORMAT or isinstance(wait, bool)
            or not isinstance(wait, int | float) or not math.isfinite(wait) or wait < 0
            or not isinstance(model, str)):
        return None
    return float(wait), model


def write_answer(key: str, answer: tuple[float, str]) -> None:
    """Keep ``answer`` under ``key``, written as :func:`latsim.writing.replacing` writes (a
    reader never sees half a file); a failure to write is only a miss next time."""
    folder = cache_folder()
    if folder is None:
        return
    wait, model = answer
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with replacing(folder / f"{key}.json") as tmp:
            tmp.write_text(json.dumps({"format": FORMAT, "wait": wait, "model": model}),
                           encoding="utf-8")
    except (OSError, LatsimError):
        pass
