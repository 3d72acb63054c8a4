"""Smoke test: every notebook runs as a plain script and writes its results; the CSVs
match the committed ones in results/notebooks/ byte for byte (fixed seeds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.py"))
EXPECTED = {
    "01_boundary_wait": ["latency_vs_phase.csv", "latency_vs_phase.png",
                         "mean_latency_vs_bound.csv", "mean_latency_vs_bound.png"],
    "02_speculative_vs_baseline": ["sweep.csv", "speculative_vs_baseline.png",
                                   "timeline_baseline.png", "timeline_speculative.png",
                                   "timeline_run/jobs.csv"],
    "03_limits": ["limits.csv", "limits.png"],
}


def test_all_notebooks_are_covered() -> None:
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(EXPECTED)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_writes(notebook: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LATSIM_RESULTS=str(tmp_path), MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(notebook)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "notebooks" / notebook.stem
    for name in EXPECTED[notebook.stem]:
        assert (out / name).stat().st_size > 0, name
    committed = ROOT / "results" / "notebooks" / notebook.stem
    for csv in sorted(out.rglob("*.csv")):
        rel = csv.relative_to(out)
        assert csv.read_bytes() == (committed / rel).read_bytes(), rel
