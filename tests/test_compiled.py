"""The compiled build (setup.py, ``LATSIM_COMPILE=1``) gives the pure build's numbers, byte
for byte: the property generators' runs (tests/build_digest.py) under both, and a sweep
across worker processes (compiled frozen configs must pickle).

The compiled build lives in its own environment: ``.venv-compiled`` at the repository root
(.ci/run makes it), or the interpreter ``LATSIM_COMPILED_PYTHON`` names. Where there is
none, or it was built from other sources than these, the tests skip and say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Cases drawn from each property generator.
EXAMPLES = 60
#: Each build's processes import their own latsim: no PYTHONPATH pointing at a source tree.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _sources_digest(package: Path) -> str:
    """One SHA-256 over a package's Python sources, by relative path."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def compiled_python() -> Path:
    named = os.environ.get("LATSIM_COMPILED_PYTHON")
    python = Path(named) if named else ROOT / ".venv-compiled" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no compiled build at {python}: .ci/run makes one (see setup.py)")
    where = subprocess.run([str(python), "-c", "import latsim; print(latsim.__file__)"],
                           capture_output=True, text=True, check=True, cwd="/", env=ENV)
    installed = Path(where.stdout.strip()).parent
    if _sources_digest(installed) != _sources_digest(ROOT / "latsim"):
        pytest.skip(f"the compiled build at {installed} was built from other sources than "
                    "these: rebuild it (setup.py)")
    return python


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    """The cases, drawn once (by this interpreter) for both builds."""
    path = tmp_path_factory.mktemp("cases") / "cases.pickle"
    subprocess.run([sys.executable, str(ROOT / "tests" / "build_digest.py"), "draw",
                    str(EXAMPLES), str(path)], check=True, cwd="/")
    return path


def _digests(python: Path, cases: Path) -> dict:
    result = subprocess.run([str(python), str(ROOT / "tests" / "build_digest.py"), "run",
                             str(cases)], capture_output=True, text=True, cwd="/", env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_the_compiled_build_gives_the_pure_builds_records_byte_for_byte(compiled_python,
                                                                       cases):
    pure, compiled = _digests(Path(sys.executable), cases), _digests(compiled_python, cases)
    assert pure["build"] == "pure Python"
    assert compiled["build"] == "compiled with mypyc"  # every module of latsim.COMPILED
    assert len(pure["single"]) >= EXAMPLES and len(pure["serving"]) == EXAMPLES
    assert len(pure["quiet"]) == EXAMPLES
    assert compiled["single"] == pure["single"]
    assert compiled["serving"] == pure["serving"]
    assert compiled["quiet"] == pure["quiet"]  # most played in bulk (latsim.sim.bulk)
    assert len(pure["conditioned"]) == EXAMPLES
    assert compiled["conditioned"] == pure["conditioned"]  # many replayed in bulk
    assert len(pure["replanning"]) == EXAMPLES
    assert compiled["replanning"] == pure["replanning"]  # most driven in the bulk loop
    assert len(pure["node"]) == EXAMPLES
    assert compiled["node"] == pure["node"]  # fleet nodes' plans, most in the bulk loop


def test_a_compiled_sweep_across_processes_writes_the_pure_sweeps_files(compiled_python,
                                                                        tmp_path):
    """Workers get the config pickled: a compiled frozen dataclass raised
    FrozenInstanceError when unpickled field by field."""
    outputs = {}
    for name, python in (("pure", Path(sys.executable)), ("compiled", compiled_python)):
        out = tmp_path / name
        subprocess.run([str(python.parent / "latsim"), "sweep", "--K", "4", "8", "--seeds",
                        "4", "--jobs", "2", "--out", str(out)], check=True,
                       capture_output=True, cwd=tmp_path, env=ENV)
        outputs[name] = {p.name: p.read_bytes() for p in out.iterdir()
                         if p.suffix == ".csv"}
    assert "summary.csv" in outputs["pure"]
    assert outputs["compiled"] == outputs["pure"]


def test_a_compiled_adaptive_lead_writes_the_pure_builds_files(compiled_python, tmp_path):
    """``--lead adaptive`` moves each stream's lead in the compiled controller as in the
    pure one (the property generators' cases hold fixed leads)."""
    outputs = {}
    for name, python in (("pure", Path(sys.executable)), ("compiled", compiled_python)):
        out = tmp_path / name
        subprocess.run([str(python.parent / "latsim"), "simulate", "--K", "8", "--cost",
                        "fixed:0.425", "--streams", "4", "--pools", "dit=1", "--lead",
                        "adaptive", "--updates", "poisson:0.5", "--duration", "120",
                        "--seeds", "2", "--out", str(out)], check=True,
                       capture_output=True, cwd=tmp_path, env=ENV)
        outputs[name] = {p.name: p.read_bytes() for p in out.iterdir()
                         if p.suffix == ".csv"}
    assert "summary.csv" in outputs["pure"] and "jobs.csv" in outputs["pure"]
    assert outputs["compiled"] == outputs["pure"]
