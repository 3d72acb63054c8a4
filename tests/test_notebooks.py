"""Every notebook runs as a plain script and writes its results; the CSVs match the committed
ones in results/notebooks/ byte for byte (fixed seeds), and no committed CSV is left that a
notebook no longer writes. Slow tier: the three notebooks take ~20-30 s together."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {
    "01_boundary_wait": ["latency_vs_phase.csv", "latency_vs_phase.png",
                         "mean_latency_vs_bound.csv", "mean_latency_vs_bound.png"],
    "02_speculative_vs_baseline": ["sweep.csv", "speculative_vs_baseline.png",
                                   "timeline_baseline.png", "timeline_speculative.png",
                                   "timeline_run/jobs.csv"],
    "03_limits": ["limits.csv", "limits.png"],
    "04_seed_systems": ["sdvg_c.csv", "draft_verify_gain.csv", "wave_forcing_vae.csv",
                        "wave_forcing_14b_in_flight.csv", "seed_systems.png"],
}
# every notebook on disk and every one we expect: a notebook without an EXPECTED entry, or an
# entry whose notebook is gone, fails its own case below instead of being silently skipped
STEMS = sorted({p.stem for p in (ROOT / "notebooks").glob("0*.py")} | set(EXPECTED))


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_notebook_runs_and_writes(stem: str, tmp_path: Path) -> None:
    notebook = ROOT / "notebooks" / f"{stem}.py"
    assert notebook.is_file(), f"EXPECTED lists {stem}, but notebooks/{stem}.py is gone"
    assert stem in EXPECTED, f"notebooks/{stem}.py has no EXPECTED outputs in this test"
    env = dict(os.environ, LATSIM_RESULTS=str(tmp_path), MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(notebook)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "notebooks" / stem
    for name in EXPECTED[stem]:
        assert (out / name).stat().st_size > 0, name
    committed = ROOT / "results" / "notebooks" / stem
    written = sorted(csv.relative_to(out) for csv in out.rglob("*.csv"))
    assert written, "the notebook wrote no CSV"
    assert written == sorted(csv.relative_to(committed) for csv in committed.rglob("*.csv"))
    for rel in written:
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel
