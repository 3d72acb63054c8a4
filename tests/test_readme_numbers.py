"""Every result number the README (and the docs named below) states is what its command
prints, at the precision the text gives it: the numbers are parsed out of the text, so a
README edited without its results (or results changed without the README) fails here."""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from latsim.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
NUMBER = r"[−+-]?\d+(?:\.\d+)?"


def _flat(path: Path, start: str | None = None) -> str:
    """The page's text with its whitespace collapsed, from the section ``start`` on (up to
    the next section)."""
    text = path.read_text()
    if start is not None:
        begin = text.index(f"## {start}\n")
        end = text.find("\n## ", begin + 1)
        text = text[begin:end if end > 0 else None]
    return " ".join(text.split())


def _find(pattern: str, text: str) -> tuple[str, ...]:
    match = re.search(pattern, text)
    assert match, f"the text no longer says {pattern!r}"
    return match.groups()


def _printed(stated: str, value: float) -> None:
    """``value`` printed as ``stated`` is: its decimals, and its sign where one is shown."""
    stated = stated.replace("−", "-")
    digits = len(stated.split(".")[1]) if "." in stated else 0
    sign = "+" if stated[0] in "+-" else ""
    assert f"{value:{sign}.{digits}f}" == stated, (stated, value)


def _within(stated: str, values: list[float]) -> None:
    """"within ``stated``": the largest magnitude, at the stated precision, is no more."""
    digits = len(stated.split(".")[1]) if "." in stated else 0
    assert round(max(abs(v) for v in values), digits) <= float(stated), (stated, values)


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---------------------------------------------------------------- README: the default sweep

SWEEP = _flat(ROOT / "README.md", "What the default sweep means")


@pytest.fixture(scope="module")
def sweep() -> dict[tuple[int, str], dict]:
    """The README's own command (``latsim sweep --K 4 8 21``), its rows by (K, policy)."""
    (command,) = _find(r"`(latsim sweep [^`]*)`", SWEEP)
    rows = _json(*shlex.split(command)[1:])["rows"]
    return {(row["K"], row["policy"]): row for row in rows}


def test_the_readme_runs_the_sweep_it_describes(sweep):
    (command,) = _find(r"`(latsim sweep [^`]*)`", SWEEP)
    Ks = [int(k) for k in shlex.split(command)[shlex.split(command).index("--K") + 1:]]
    assert sorted({K for K, _ in sweep}) == Ks == [4, 8, 21]
    assert {policy for _, policy in sweep} == {"baseline", "speculative"}


def test_the_defaults_table_is_what_the_sweep_ran_with(sweep):
    def default(option: str) -> str:
        """The option's row of the table: its default, then its source."""
        value, source = _find(rf"\| `--{option}` \| `?([^|`]+?)`? \| ([^|]+) \|", SWEEP)
        return f"{value} | {source}"

    (r,) = _find(r"one latent frame per (\d+) pixel frames", SWEEP)
    delta, per = _find(r"δ = (\d+\.\d+) s and T = K/(\d+) s", SWEEP)
    for row in sweep.values():
        _printed(_find(r"^(\d+) \|", default("fps"))[0], row["fps"])
        assert row["r"] == int(_find(r"^(\d+) \|", default("r"))[0])
        assert row["cost"] == default("cost").split(" | ")[0]
        assert row["updates"] == default("updates").split(" | ")[0]
        _printed(_find(r"^(\d+) s \|", default("duration"))[0], row["duration"])
        seeds, seed = _find(r"^(\d+) \|.*; seed (\d+)", default("seeds"))
        assert row["n_runs"] == int(seeds) and row["seed"] == int(seed)
        assert row["lead"] == pytest.approx(row["C_mean"])  # a fixed C: its q99 is C
        assert int(r) == row["r"]
        _printed(delta, row["delta"])
        assert row["T"] == pytest.approx(row["K"] / int(per))


def test_the_cost_models_derivation_and_its_C_per_K(sweep):
    cost = next(iter(sweep.values()))["cost"]
    a, b = (float(x) for x in cost.removeprefix("affine:").split(","))
    steps, k1, ratio, fixed, slope = _find(
        rf"(\d+) sampling steps × .*?: ({NUMBER}) ms at K=1 and ({NUMBER})× that at K=3 .*?"
        rf"\(({NUMBER}) ms \+ ({NUMBER}) ms·K per forward\)", SWEEP)
    n = int(steps)
    _printed(k1, (a + b) / n * 1e3)
    _printed(ratio, (a + 3 * b) / (a + b))
    _printed(fixed, a / n * 1e3)
    _printed(slope, b / n * 1e3)
    *Cs, k_a, k_b, k_c = _find(rf"C = ({NUMBER}) / ({NUMBER}) / ({NUMBER}) s for K = (\d+) / "
                               r"(\d+) / (\d+)", SWEEP)
    for stated, K in zip(Cs, (k_a, k_b, k_c), strict=True):
        for policy in ("baseline", "speculative"):
            _printed(stated, sweep[(int(K), policy)]["C_mean"])


def test_what_the_default_sweep_shows(sweep):
    K, busy = _find(r"at K = (\d+) the worker is busy (\d+)% of the time \(C > T − δ\)",
                    SWEEP)
    for policy in ("baseline", "speculative"):
        row = sweep[(int(K), policy)]
        _printed(busy, row["busy_pct"])
        assert row["C_mean"] > row["T"] - row["delta"]
    (both,) = _find(rf"mean L ({NUMBER}) s for both, C \+ T/2", SWEEP)
    low = sweep[(int(K), "baseline")]
    _printed(both, low["C_mean"] + low["T"] / 2)
    for policy in ("baseline", "speculative"):
        _printed(both, sweep[(int(K), policy)]["L_mean"])

    k8, k21, *means = _find(rf"at K = (\d+) and (\d+) it removes much of the boundary wait "
                            rf"\(mean L ({NUMBER}) → ({NUMBER}) s and ({NUMBER}) → ({NUMBER}) s\)",
                            SWEEP)
    for i, K in enumerate((int(k8), int(k21))):
        _printed(means[2 * i], sweep[(K, "baseline")]["L_mean"])
        _printed(means[2 * i + 1], sweep[(K, "speculative")]["L_mean"])

    *extra, a8, se8, a21, se21, seconds, long_a, long_k = _find(
        rf"at ({NUMBER})% and ({NUMBER})% extra DiT work \(A = ({NUMBER}) ± ({NUMBER}) and "
        rf"({NUMBER}) ± ({NUMBER}); one (\d+) s run gives ({NUMBER}) at K = (\d+)\)", SWEEP)
    for K, pct, A, se in ((int(k8), extra[0], a8, se8), (int(k21), extra[1], a21, se21)):
        row = sweep[(K, "speculative")]
        _printed(pct, 100 * (row["A"] - 1))
        _printed(A, row["A"])
        _printed(se, row["A_se"])
        assert sweep[(K, "baseline")]["A"] == 1.0
    rows = _json("sweep", "--K", long_k, "--seeds", "1", "--duration", seconds)["rows"]
    (long_run,) = [row for row in rows if row["policy"] == "speculative"]
    assert long_run["window_s"] == float(seconds)
    _printed(long_a, long_run["A"])


# ---------------------------------------------------------------- docs/commands.md

def _power(mantissa: str, exponent: str) -> float:
    return float(mantissa) * 10 ** int(exponent.translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹",
                                                                       "0123456789")))


def test_the_work_bounds_docs_commands_md_states():
    """The default bound, and what the default sweep and all of ``latsim reproduce`` need,
    as the work-bound error names them."""
    from latsim.errors import DEFAULT_MAX_EVENTS

    text = _flat(ROOT / "docs" / "commands.md")
    power = r"(\d(?:\.\d)?)·10([⁰¹²³⁴⁵⁶⁷⁸⁹]+)"
    default, default_exp, command, need, need_exp, reproduce, reproduce_exp = _find(
        rf"default {power}, while `([^`]+)` needs {power} and all of `latsim reproduce` "
        rf"{power}", text)
    assert _power(default, default_exp) == DEFAULT_MAX_EVENTS
    for args, mantissa, exponent in ((shlex.split(command), need, need_exp),
                                     (["reproduce", "--out", "unused"], reproduce,
                                      reproduce_exp)):
        result = runner.invoke(app, [*args, "--max-events", "1000"])
        assert result.exit_code == 2, result.output
        (counted,) = _find(r"about (\d\.\d+e\+\d+) events", result.stderr)
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        assert f"{float(counted):.{digits}e}" == f"{_power(mantissa, exponent):.{digits}e}"


# ---------------------------------------------------------------- docs/live.md: compare

def test_the_compare_example_docs_live_md_states(monkeypatch):
    """``latsim compare results/compare/runs`` on the committed runs prints what
    docs/live.md says of it."""
    monkeypatch.chdir(ROOT)
    text = _flat(ROOT / "docs" / "live.md")
    (command,) = _find(r"then `(latsim compare results/compare/runs)[^`]*`", text)
    payload = _json(*shlex.split(command)[1:])
    rows = {(row["K"], row["policy"]): row for row in payload["rows"]}
    busy_low, busy_high, Ks, updates, window = _find(
        r"\(busy (\d+)–(\d+)%\), K = ([\d, ]+), both policies, (\d+) isolated updates in "
        r"(\d+) s", text)
    busy = [row["busy_pct_measured"] for row in rows.values()]
    _printed(busy_low, min(busy))
    _printed(busy_high, max(busy))
    assert set(rows) == {(int(K), p) for K in Ks.split(", ")
                         for p in ("baseline", "speculative")}
    assert all(row["n_conditions"] == int(updates) for row in rows.values())
    assert all(row["window_s"] == float(window) for row in rows.values())

    l50, n_close, err_a, k_a, pol_a, err_b, k_b, pol_b = _find(
        rf"L50 within ({NUMBER})% for (\w+) runs, ({NUMBER})% for K = (\d+) (\w+) and "
        rf"({NUMBER})% for K = (\d+) (\w+)", text)
    outliers = {(int(k_a), pol_a): err_a, (int(k_b), pol_b): err_b}
    for key, stated in outliers.items():
        _printed(stated, rows[key]["L50_err_pct"])
    close = [row["L50_err_pct"] for key, row in rows.items() if key not in outliers]
    assert len(close) == {"four": 4}[n_close]
    _within(l50, close)
    l95, stall, busy_err, mape = _find(
        rf"L95 within ({NUMBER})%, stall within ({NUMBER}) points, busy within ({NUMBER})%; "
        rf"MAPE ({NUMBER})%", text)
    _within(l95, [row["L95_err_pct"] for row in rows.values()])
    _within(stall, [row["stall_pct_abs_err"] for row in rows.values()])
    _within(busy_err, [row["busy_pct_err_pct"] for row in rows.values()])
    _printed(mape, payload["MAPE"])


# ------------------------------------- committed tables (their regeneration is tested where
# ------------------------------------- noted: these tie the prose to them, quickly)

def _csv(*parts: str) -> list[dict]:
    with (ROOT / "results").joinpath(*parts).open() as handle:
        return list(csv.DictReader(handle))


def test_the_replan_rule_numbers_docs_implementation_md_states():
    """results/replan_rule/ (regenerated byte for byte by ``latsim reproduce replan-rule``
    in tests/test_theory_vs_sim.py): the rows with T − δ < C < T."""
    text = _flat(ROOT / "docs" / "implementation.md")
    w_low, w_high, moved, ses = _find(
        rf"starting wastes ({NUMBER})–({NUMBER})% of the work, and the mean L moves by at "
        rf"most ({NUMBER}) s, within ({NUMBER}) paired standard errors", text)
    between = [r for r in _csv("replan_rule", "replan_rule.csv")
               if 0 < float(r["C_below_T_slots"]) < 1]
    assert between and all(float(r["w_defer"]) == 0.0 for r in between)
    wasted = [100 * float(r["w_start"]) for r in between]
    _printed(w_low, min(wasted))
    _printed(w_high, max(wasted))
    _printed(moved, max(abs(float(r["dL_mean"])) for r in between))
    _within(ses, [float(r["dL_mean"]) / float(r["dL_mean_se"]) for r in between
                  if float(r["dL_mean_se"]) > 0])


def test_the_seed_system_figures_docs_systems_md_states():
    """results/systems/reproduction.csv (regenerated byte for byte by ``latsim reproduce
    systems`` in tests/test_systems.py): each figure the prose puts beside the seed's."""
    text = _flat(ROOT / "docs" / "systems.md")
    rows = {(r["system"], r["figure"]): r for r in _csv("systems", "reproduction.csv")}

    def ours(system: str, figure: str) -> float:
        return float(rows[(system, figure)]["ours"])

    def err(system: str, figure: str) -> float:
        return float(rows[(system, figure)]["err_pct"])

    s1, a1, s2, a2, lo1, hi1, lo2, hi2, ceiling = _find(
        rf"({NUMBER})× implies a = ({NUMBER}) and ({NUMBER})× a = ({NUMBER}) at the FLOP ratio "
        rf"\(({NUMBER})–({NUMBER}) and ({NUMBER})–({NUMBER}) across ratios .*? every draft "
        rf"accepted, ({NUMBER})×", text)
    for speedup, figure, a, low, high in ((s1, "speedup, default tau", a1, lo1, hi1),
                                          (s2, "speedup, tau = -2.5", a2, lo2, hi2)):
        _printed(speedup, ours("SDVG", figure))
        implied = float(_find(r"a = (\d\.\d+)", rows[("SDVG", figure)]["note"])[0])
        _printed(a, implied)
        needs = [float(r["ours"]) for (system, f), r in rows.items()
                 if system == "SDVG" and f.startswith(f"{figure}: acceptance")]
        _printed(low, min(needs))
        _printed(high, max(needs))
    _printed(ceiling, ours("SDVG", "ceiling: speedup with every draft accepted"))

    stand = "STAND"
    (*throughput, tr_latency, tr_paper, tr_err, tr_thr, tr_thr_paper, tr_thr_err) = _find(
        rf"STAND's throughput ratio ({NUMBER}) against ({NUMBER}) \(({NUMBER})%\), Token "
        rf"Recycling's latency ({NUMBER}) against ({NUMBER}) \(({NUMBER})%\) and its throughput "
        rf"ratio ({NUMBER}) against ({NUMBER}) \(({NUMBER})%\)", text)
    for (stated, paper, error), figure in (
            (throughput, "throughput / plain"),
            ((tr_latency, tr_paper, tr_err), "Token Recycling normalised latency"),
            ((tr_thr, tr_thr_paper, tr_thr_err), "Token Recycling throughput / plain")):
        _printed(stated, ours(stand, figure))
        _printed(paper, float(rows[(stand, figure)]["paper"]))
        _printed(error, err(stand, figure))

    wave = "Wave Forcing"
    for pattern, figure in (
            (rf"5-step DiT FPS ({NUMBER}) against ({NUMBER}) \(({NUMBER})%",
             "5 steps: DiT FPS (6 DiT + 2 VAE GPUs)"),
            (rf"5-step end-to-end FPS ({NUMBER}) against ({NUMBER}) \(({NUMBER})%\)",
             "5 steps: end-to-end FPS"),
            (rf"speedup over one GPU becomes ({NUMBER}) against ({NUMBER}) \(({NUMBER})%",
             "4 steps: speedup over one GPU"),
            (rf"predicts ({NUMBER}) end-to-end FPS against WaveRT BF16's ({NUMBER}) "
             rf"\(({NUMBER})%\)", "14B end-to-end FPS (WaveRT BF16)")):
        stated, paper, error = _find(pattern, text)
        _printed(stated, ours(wave, figure))
        _printed(paper, float(rows[(wave, figure)]["paper"]))
        _printed(error, err(wave, figure))
    speedup, paper = _find(rf"a ({NUMBER})× speedup against ({NUMBER})×", text)
    _printed(speedup, ours(wave, "14B speedup over one GPU (WaveRT BF16)"))
    _printed(paper, float(rows[(wave, "14B speedup over one GPU (WaveRT BF16)")]["paper"]))


def test_the_wave_forcing_viewer_numbers_docs_systems_md_states():
    """results/systems/interactive.csv, high-frequency traces: one 14B viewer on the
    pipeline with one, three and four chunks in flight, and Wave Forcing's 9 streams."""
    text = _flat(ROOT / "docs" / "systems.md")
    rows = {(r["system"], r["load"], r["policy"]): r
            for r in _csv("systems", "interactive.csv") if r["speed"] == "1.0"}

    def high(system: str, key: str) -> float:
        return float(rows[(system, "high", "baseline")][key])

    stall1, l50_1 = _find(rf"one 14B viewer stalls ({NUMBER})% of the time on the 8 GPUs as on "
                          rf"one \(L50 ({NUMBER}) s, high-frequency traces\)", text)
    _printed(stall1, high("Wave Forcing 14B", "viewer_stall_pct"))
    _printed(l50_1, high("Wave Forcing 14B", "L50"))
    stall3, l50_3 = _find(rf"the stall drops to ({NUMBER})% \(the cold start\) and L50 to "
                          rf"({NUMBER}) s", text)
    _printed(stall3, high("Wave Forcing 14B 3 in flight", "viewer_stall_pct"))
    _printed(l50_3, high("Wave Forcing 14B 3 in flight", "L50"))
    stall4, play, flush, wasted = _find(
        rf"stalls ({NUMBER})% of the time; if a new condition lets the chunks in flight play, "
        rf"L50 is ({NUMBER}) s, if it flushes them ({NUMBER}) s, for ({NUMBER})% of the DiT work "
        r"discarded", text)
    _printed(stall4, high("Wave Forcing 14B let-play", "viewer_stall_pct"))
    _printed(play, high("Wave Forcing 14B let-play", "L50"))
    _printed(flush, high("Wave Forcing 14B flush", "L50"))
    _printed(wasted, 100 * high("Wave Forcing 14B flush", "w"))
    one, streams, stall9 = _find(rf"one stream's L50 is ({NUMBER}) s on 8 GPUs and on one; its "
                                 rf"throughput serves (\d+) streams of 16 fps \(({NUMBER})% stall",
                                 text)
    for system in ("Wave Forcing 1F1C", "Wave Forcing NF1C"):
        _printed(one, high(system, "L50"))
    _printed(stall9, high(f"Wave Forcing 1F1C x{streams}", "viewer_stall_pct"))
