"""Every notebook executes as a notebook (nbclient, in its own folder as Jupyter runs it),
shows at least one figure inline and writes its results; the CSVs match the committed ones in
results/notebooks/ byte for byte (fixed seeds), and no committed CSV is left that a notebook
no longer writes. Each ``.ipynb`` is the pair of a jupytext ``.py`` (the reviewable source):
the two hold the same cells. Slow tier: the four notebooks take about a minute together."""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="the notebooks extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed")
nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")

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
STEMS = sorted({p.stem for p in (ROOT / "notebooks").glob("0*.py")}
               | {p.stem for p in (ROOT / "notebooks").glob("0*.ipynb")} | set(EXPECTED))


@pytest.mark.parametrize("stem", STEMS)
def test_each_notebook_and_its_script_hold_the_same_cells(stem: str) -> None:
    folder = ROOT / "notebooks"
    assert (folder / f"{stem}.py").is_file() and (folder / f"{stem}.ipynb").is_file(), (
        f"{stem}: pair the script and the notebook (jupytext --sync notebooks/{stem}.py)")
    script, notebook = (jupytext.read(folder / f"{stem}{ext}") for ext in (".py", ".ipynb"))
    cells = [[(c.cell_type, c.source) for c in nb.cells] for nb in (script, notebook)]
    assert cells[0] == cells[1], f"{stem}: run jupytext --sync notebooks/{stem}.py"
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert not any(c.get("outputs") for c in notebook.cells), "commit notebooks without outputs"


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_notebook_runs_and_writes(stem: str, tmp_path: Path, monkeypatch) -> None:
    notebook = ROOT / "notebooks" / f"{stem}.ipynb"
    assert notebook.is_file(), f"EXPECTED lists {stem}, but notebooks/{stem}.ipynb is gone"
    assert stem in EXPECTED, f"notebooks/{stem}.ipynb has no EXPECTED outputs in this test"
    monkeypatch.setenv("LATSIM_RESULTS", str(tmp_path))  # the kernel inherits it
    monkeypatch.delenv("MPLBACKEND", raising=False)  # Jupyter's own inline backend
    executed = nbformat.read(notebook, as_version=4)
    nbclient.NotebookClient(executed, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}}).execute()
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure shown inline"
    out = tmp_path / "notebooks" / stem
    for name in EXPECTED[stem]:
        assert (out / name).stat().st_size > 0, name
    committed = ROOT / "results" / "notebooks" / stem
    written = sorted(csv.relative_to(out) for csv in out.rglob("*.csv"))
    assert written, "the notebook wrote no CSV"
    assert written == sorted(csv.relative_to(committed) for csv in committed.rglob("*.csv"))
    for rel in written:
        assert (out / rel).read_bytes() == (committed / rel).read_bytes(), rel
