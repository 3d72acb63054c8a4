"""Build the API reference from the docstrings: ``python docs/build_api.py [OUT]``.

Every public module of ``latsim`` but the command line's (``latsim COMMAND -h`` documents
those) gets a page, written with pdoc (in the test extra) to OUT (default ``docs/api/``,
not committed). The modules of a package with an ``__all__`` are named one by one: pdoc
follows ``__all__``, which names classes and functions there, not submodules.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def public_modules() -> list[str]:
    """``latsim`` and its modules, but private ones and ``latsim.cli``'s submodules."""
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in (ROOT / "latsim").rglob("*.py")}
    return sorted(n for n in names if not any(part.startswith("_") for part in n.split("."))
                  and not n.startswith("latsim.cli."))


def specs() -> list[str]:
    """What to name to pdoc: ``latsim``, plus the modules of packages whose ``__all__``
    hides them (naming a module pdoc reaches anyway makes it warn)."""
    hidden = [m for m in public_modules() if "__all__" in (
        ROOT / m.rsplit(".", 1)[0].replace(".", "/") / "__init__.py").read_text()]
    return ["latsim", *hidden]


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "api")
    # pdoc blocks subprocesses while it imports a module; matplotlib's first import on a
    # fresh machine runs fc-list to build its font cache, and these modules are our own
    env = {**os.environ, "PDOC_ALLOW_EXEC": "1"}
    return subprocess.run([sys.executable, "-m", "pdoc", *specs(), "-o", out],
                          cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
