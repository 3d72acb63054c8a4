"""The API reference builds from the docstrings (docs/build_api.py, pdoc from the test
extra): every public module of ``latsim`` but the commands' gets a page, and pdoc warns of
nothing (an export that does not resolve, an annotation it cannot read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pdoc", reason="the test extra installs pdoc")

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "docs"))
from build_api import public_modules  # noqa: E402


@pytest.mark.slow
def test_the_api_reference_builds_with_no_warning_and_a_page_per_module(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "build_api.py"),
                             str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in (result.stdout + result.stderr).splitlines()
                if line.startswith("Warn")]
    assert not warnings
    pages = {".".join(p.relative_to(tmp_path).with_suffix("").parts)
             for p in tmp_path.rglob("*.html") if p.name != "index.html"}
    assert len(public_modules()) > 60
    assert set(public_modules()) <= pages, sorted(set(public_modules()) - pages)
