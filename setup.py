"""The optional compiled build (pyproject.toml holds everything else).

``LATSIM_COMPILE=1 pip install --no-build-isolation .`` (with ``mypy`` and ``setuptools``
installed first) compiles :data:`COMPILED` with mypyc from the same source; the pure-Python
modules stay in the wheel beside them, and every other install (editable ones included)
is pure Python. Both builds give the same numbers, byte for byte (tests/test_compiled.py);
``latsim --version`` says which one runs.
"""

import os
import sys
from pathlib import Path

from setuptools import setup

ext_modules = []
if os.environ.get("LATSIM_COMPILE") == "1":
    from mypyc.build import mypycify

    sys.path.insert(0, str(Path(__file__).parent))
    from latsim import COMPILED  # the modules compiled; latsim --version names them

    paths = [name.replace(".", "/") + ".py" for name in COMPILED]
    # imported modules are read for their types, not checked (only COMPILED must be
    # clean), and numpy or simpy may not be installed yet when the wheel is built
    ext_modules = mypycify(["--follow-imports=silent", "--ignore-missing-imports", *paths],
                           opt_level="3")

setup(ext_modules=ext_modules)
