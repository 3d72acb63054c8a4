"""latsim profile: measured C per K and job kind, usable as --cost table:PATH."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from latsim.cli import app
from latsim.model.costs import load_table
from tests.helpers import rows_of


def test_profile_writes_a_cost_table_the_simulator_uses(tmp_path):
    pytest.importorskip("diffusers", reason="the live extra is not installed")
    out = tmp_path / "profile.json"
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--K", "1", "3", "--jobs", "3", "--gap", "0",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    document = json.loads(out.read_text())
    for k in ("1", "3"):
        assert {kind: len(v) for kind, v in document["costs"][k].items()} == {
            "refill": 3, "replan": 3,
        }
    table = load_table(out)
    assert table.mean(3) > 0 and table.mean(2) > 0  # K=2 interpolated between 1 and 3
    assert not table.deterministic
    sweep = runner.invoke(app, ["sweep", "--K", "1", "3", "--cost", f"table:{out}",
                                "--duration", "10", "--seeds", "2", "--json"])
    assert sweep.exit_code == 0, sweep.stderr
    rows = rows_of(sweep.stdout)
    assert rows[0]["cost"] == f"table:{out}" and rows[0]["C_mean"] == table.mean(1)


def test_profile_bad_input_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--K", "0", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    result = CliRunner().invoke(app, ["profile", "--preset", "huge"])
    assert result.exit_code == 2 and "preset" in result.stderr


def test_profile_options_are_bounded_before_any_work(tmp_path):
    """``--gap nan`` was a traceback and ``--gap 1e9`` slept forever after building the
    model; every option now has a range, checked first (one line naming it)."""
    out = str(tmp_path / "p.json")
    for args, message in (
        (["--gap", "nan"], "--gap must be >= 0 and <= 10 s, got nan"),
        (["--gap", "1e9"], "--gap must be >= 0 and <= 10 s, got 1000000000.0"),
        (["--gap", "-1"], "--gap must be >= 0 and <= 10 s"),
        (["--jobs", "0"], "--jobs must be a positive integer <= 5000"),
        (["--jobs", "5000", "--gap", "1"], "idle gaps would take 10000 s"),
        (["--steps", "0"], "--steps must be a positive integer <= 1000"),
        (["--seed", "-3"], "--seed must be an integer >= 0 and <= 4294967295"),
        (["--K", "5000"], "--K must be a positive integer <= 4096"),
    ):
        result = CliRunner().invoke(app, ["profile", *args, "--out", out])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def test_live_commands_say_which_extra_is_missing(monkeypatch):
    """With torch hidden (only torch: the message names what else is missing, too)."""
    pytest.importorskip("diffusers", reason="the live extra is not installed")
    import importlib.util

    from latsim.errors import install_hint

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    for command in ("measure", "profile"):
        result = CliRunner().invoke(app, [command, "--K", "2"])
        assert result.exit_code == 2
        assert result.stderr.strip() == ("latsim: error: generator wan needs torch: "
                                         f"install the live extra, {install_hint('live')}")


def test_the_cost_laws_a_profile_fits_and_how_well():
    """The affine law and the lognormals come back from jobs drawn from them (within 4
    standard errors of the sample; the CV's estimate within 25 % at n = 400), as specs
    --cost takes; a law the jobs do not follow says so by its KS p."""
    import numpy as np

    from latsim.analysis.cost_fit import fit_affine, fit_lognormal, fit_profile
    from latsim.plugins import load_cost

    rng = np.random.default_rng(7)
    a, b, cv, n = 0.03, 0.01, 0.2, 400
    sigma = float(np.sqrt(np.log1p(cv**2)))
    jobs = {K: (a + b * K) * rng.lognormal(-sigma**2 / 2, sigma, n) for K in (2, 4, 8)}
    affine = fit_affine(jobs)
    assert affine is not None and affine["r2"] > 0.5
    x = np.repeat([2.0, 4.0, 8.0], n)
    _, cov = np.polyfit(x, np.concatenate(list(jobs.values())), 1, cov=True)
    se_b, se_a = np.sqrt(np.diag(cov))  # the regression's own standard errors
    assert affine["a"] == pytest.approx(a, abs=4 * se_a)
    assert affine["b"] == pytest.approx(b, abs=4 * se_b)
    assert load_cost(affine["spec"]).mean(4) == pytest.approx(a + 4 * b, rel=0.02)
    law = fit_lognormal(jobs[4])
    assert law["mean"] == pytest.approx(a + 4 * b, abs=4 * (a + 4 * b) * cv / np.sqrt(n))
    assert law["cv"] == pytest.approx(cv, rel=0.25) and law["ks_p"] > 0.01
    assert load_cost(law["spec"]).mean(4) == pytest.approx(law["mean"], rel=1e-3)
    # two modes (a cache that sometimes misses) are no lognormal
    bimodal = np.concatenate([rng.normal(0.05, 0.001, 200), rng.normal(0.2, 0.002, 200)])
    assert fit_lognormal(bimodal)["ks_p"] < 1e-6
    assert fit_lognormal([0.1, 0.2]) is None and fit_lognormal([0.1, 0.0, 0.2]) is None
    assert fit_lognormal([0.1] * 5)["spec"] == "lognormal:0.1,0"
    assert fit_affine({4: [0.1, 0.2]}) is None  # one K: no slope
    assert fit_affine({1: [0.5], 8: [0.1]})["spec"] is None  # falls with K: no affine cost
    fits = fit_profile({"2": {"refill": list(jobs[2]), "replan": []},
                        "4": {"refill": list(jobs[4]), "replan": [0.1, 0.11, 0.12]}})
    assert fits["refill"]["affine"] is not None and fits["replan"]["affine"] is None
    assert set(fits["refill"]["lognormal"]) == {"2", "4"}
    assert set(fits["replan"]["lognormal"]) == {"4"}


def test_profile_reports_its_fits_beside_the_jobs(tmp_path):
    """The sleep generator (no torch): the profile file and the rows carry the fits, and
    the table names the affine law at 80 columns."""
    from latsim.plugins import load_cost

    out = tmp_path / "profile.json"
    result = CliRunner().invoke(app, ["profile", "--generator", "sleep", "--cost",
                                      "affine:0.004,0.001", "--K", "1", "4", "--jobs", "4",
                                      "--gap", "0", "--out", str(out)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    fits = json.loads(out.read_text())["fit"]
    for kind in ("refill", "replan"):
        load_cost(fits[kind]["affine"]["spec"])
        assert set(fits[kind]["lognormal"]) == {"1", "4"}
        assert f"{kind}: affine:" in result.stdout
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    rows = CliRunner().invoke(app, ["profile", "--generator", "sleep", "--cost",
                                    "fixed:0.002", "--K", "2", "--jobs", "3", "--gap", "0",
                                    "--out", str(tmp_path / "p2.json"), "--json"])
    (row_a, row_b) = rows_of(rows.stdout)
    assert row_a["lognormal"].startswith("lognormal:") and 0 <= row_a["lognormal_ks_p"] <= 1
