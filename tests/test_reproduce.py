"""`latsim reproduce`: numbers are computed (theory functions, simulation), the paper's numbers
come only from paper_data.json, and regenerating results/paper/ changes no CSV byte."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim.analysis import theory
from latsim.cli import app
from latsim.experiments import paper, paper_settings
from latsim.experiments.engine import Experiment, run_experiment

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("paper")
    result = runner.invoke(app, ["reproduce", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def _rows(path: Path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow  # the `run` fixture reproduces every table (~20-45 s)
def test_reproduce_writes_tables_and_figure(run: tuple[Path, str]) -> None:
    out, text = run
    for name in ("settings", "eq6", "amplification", "stall", "l50", "long_minus_short"):
        assert (out / f"{name}.csv").stat().st_size > 100
    assert (out / "reproduce.png").stat().st_size > 10_000
    for setting in paper_settings.SETTINGS:
        assert setting.name in text


@pytest.mark.slow  # the `run` fixture reproduces every table (~20-45 s)
def test_committed_results_are_byte_identical(run: tuple[Path, str]) -> None:
    out, _ = run
    committed = ROOT / "results" / "paper"
    for path in sorted(out.glob("*.csv")):
        assert path.read_bytes() == (committed / path.name).read_bytes(), path.name
    for path in committed.glob("*.csv"):
        assert "/" not in path.read_text().split("\n", 1)[1].replace("C/T", "")  # no paths


@pytest.mark.slow  # the `run` fixture reproduces every table (~20-45 s)
def test_theory_column_matches_the_papers_predictions(run: tuple[Path, str]) -> None:
    out, text = run
    rows = {r["setting"]: r for r in _rows(out / "settings.csv")}
    for setting in paper_settings.SETTINGS:
        timing = setting.timing
        expected = theory.boundary_wait_reduction(timing.T, timing.delta)
        assert float(rows[setting.name]["theory_reduction"]) == pytest.approx(expected, abs=1e-6)
    assert f"{float(rows['Sol-H3 short']['theory_reduction']):.3f}" == "0.438"
    assert f"{float(rows['Sol-H3 long']['theory_reduction']):.3f}" == "2.562"
    eq6 = {r["quantity"]: r for r in _rows(out / "eq6.csv")}
    assert f"{float(eq6['E[R]']['theory']):.3f}" == "0.256"
    assert f"{float(eq6['unconditional R+C']['theory']):.3f}" == "1.856"
    assert float(eq6["E[R]"]["theory"]) == pytest.approx(theory.residual_wait_mean(1.6, 5.0))
    # the phase-grid simulation reproduces every closed form; eq. (6) starts every idle
    # arrival at once, latsim's controller lets the refill serve the ones whose branch would
    # be the cache end, which adds a known deferral to R (and nothing to L)
    C, T, delta = 1.6, 5.0, 0.25
    deferral = (theory.speculative_residual_wait_mean(C, T, delta)
                - theory.residual_wait_mean(C, T))
    assert deferral > 0
    shifted = {"E[R]": deferral, "unconditional R+C": deferral,
               "idle arrival R+C": deferral / (1 - C / T)}
    for name, row in eq6.items():
        expected = float(row["theory"]) + shifted.get(name, 0.0)
        assert float(row["simulated"]) == pytest.approx(expected, abs=1e-3), name
    assert re.search(r"E\[R\]\s*│\s*0\.256\s*│", text)


@pytest.mark.slow  # the `run` fixture reproduces every table (~20-45 s)
def test_simulated_reduction_is_recomputed(run: tuple[Path, str]) -> None:
    out, _ = run
    row = next(r for r in _rows(out / "settings.csv") if r["setting"] == "Wan1.3B short")
    s = paper_settings.SETTINGS[0]
    exp = Experiment(Ks=(s.K,), r=s.r, fps=s.fps, cost=f"fixed:{paper_settings.infer_C(s)!r}",
                     updates=f"traces:{ROOT / 'traces' / 'low'}")
    sim = {r["policy"]: r for r in run_experiment(exp, jobs=1).rows}
    assert float(row["sim_low_reduction"]) == pytest.approx(
        sim["baseline"]["L_mean"] - sim["speculative"]["L_mean"], abs=1e-6)
    assert float(row["diff_sim_low_minus_paper"]) == pytest.approx(
        float(row["sim_low_reduction"]) - float(row["paper_reduction"]), abs=1e-6)


@pytest.mark.slow  # the `run` fixture reproduces every table (~20-45 s)
def test_amplification_and_stall_follow_theory(run: tuple[Path, str]) -> None:
    out, _ = run
    for row in _rows(out / "amplification.csv"):
        K, p = int(row["K"]), float(row["p"])
        assert float(row["A_independent"]) == pytest.approx(
            theory.work_amplification_independent(K, p), abs=1e-6)
        if float(row["lambda_T"]) <= 0.2:
            assert float(row["A_sim"]) == pytest.approx(float(row["A_independent"]), abs=0.03)
    for row in _rows(out / "stall.csv"):
        assert float(row["sim_stall_pct"]) == pytest.approx(float(row["theory_stall_pct"]),
                                                           abs=0.5)


def test_paper_numbers_live_only_in_the_data_file() -> None:
    # the reproduction and the settings it moved out (C is inferred there)
    source = "".join(Path(m.__file__).read_text() for m in (paper, paper_settings))
    data = json.loads(paper_settings.PAPER_DATA.read_text())
    reported = [str(v["reduction_s"]) for v in data["settings"].values()]
    reported += ["19.669", "20.339", "1.856", "0.256", "2.562", "0.438", "1.87", "1.42"]
    for number in reported:
        assert number not in source, number


def test_C_comes_from_the_paper_data(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(paper_settings.PAPER_DATA.read_text())
    settings = paper_settings.SETTINGS
    wan_long, ltx_short, ltx_long = settings[1], settings[4], settings[5]
    assert paper_settings.infer_C(wan_long) == pytest.approx(0.17 * wan_long.timing.T)
    assert paper_settings.infer_C(ltx_short) == pytest.approx(
        1.0 / (1 - (19.669 + 20.339) / 200), rel=1e-9)
    c = paper_settings.infer_C(ltx_long)  # the smoothed reduction formula inverted
    target = data["settings"]["LTX-2.3 long"]["reduction_s"]
    t, d = ltx_long.timing.T, ltx_long.timing.delta
    assert (t - d) / 2 - c * c / (2 * t) == pytest.approx(target, abs=1e-9)
    data["settings"]["Wan1.3B long"]["kernel_activity_pct"] = [30, 40]
    paper_settings.paper_data.cache_clear()
    monkeypatch.setattr(paper_settings, "paper_data", lambda: data)  # infer_C reads it there
    assert paper_settings.infer_C(wan_long) == pytest.approx(0.30 * wan_long.timing.T)


def test_invert_reduction_round_trip() -> None:
    t, d = 5.25, 0.25
    for c in (0.0, 0.3, 0.9, 2.1, 5.25):
        found = paper_settings.invert_reduction(paper_settings.smooth_reduction(c, t, d), t, d)
        assert found == pytest.approx(c, abs=1e-9)
    assert paper_settings.invert_reduction((t - d) / 2 + 0.1, t, d) is None
    # the exact (sawtooth) reduction stays within a slot of the smooth one, below (T − δ)/2
    for i in range(0, 101):
        c = i / 100 * t
        exact = paper_settings.refined_reduction(c, t, d)
        assert exact <= (t - d) / 2 + 1e-9
        assert abs(exact - paper_settings.smooth_reduction(c, t, d)) <= d
