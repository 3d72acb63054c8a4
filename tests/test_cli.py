"""Command-line contract (DESIGN §4): outputs, determinism, and one-line errors."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from latsim.analysis import theory
from latsim.cli.root import OneLineErrors, _expand_multi_values, app
from latsim.errors import DEFAULT_MAX_EVENTS, Interrupted, LatsimError
from latsim.formatting import fmt
from tests.helpers import envelope_of, row_of, rows_of

runner = CliRunner()

SUMMARY_KEYS = {
    "policy", "K", "T", "delta", "C_mean", "lead", "L_mean", "L50", "L95", "R_mean",
    "C_obs_mean", "Q_mean", "stall_pct", "busy_pct", "w", "A", "dit_calls", "n_conditions",
}
FAST = ["--duration", "20", "--seeds", "3"]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_multi_value_k_is_expanded():
    assert _expand_multi_values(["sweep", "--K", "4", "8", "--C", "1"]) == [
        "sweep", "--K", "4", "--K", "8", "--C", "1",
    ]


def test_sweep_json_has_a_row_per_k_and_policy_with_the_contract_keys():
    result = invoke("sweep", "--K", "4", "8", "--C", "0.3", *FAST, "--json")
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout)
    assert [(r["K"], r["policy"]) for r in rows] == [
        (4, "baseline"), (4, "speculative"), (8, "baseline"), (8, "speculative"),
    ]
    for row in rows:
        assert SUMMARY_KEYS <= row.keys()
        assert row["lead"] == 0.3 and row["T"] == row["K"] * row["delta"]


def test_same_seed_gives_byte_identical_json_and_another_seed_does_not():
    args = ("sweep", "--K", "4", "8", "--cost", "lognormal:0.4,0.5", *FAST, "--json")
    first = invoke(*args, "--seed", "7").stdout
    assert first == invoke(*args, "--seed", "7").stdout
    serial = invoke(*args, "--seed", "7", "--jobs", "1").stdout
    assert rows_of(first) == rows_of(serial)  # serial == parallel (only the command differs)
    assert first != invoke(*args, "--seed", "8").stdout


def test_speculative_alone_runs_one_policy_and_leaves_a_blank_saying_why():
    """No baseline twin unasked: one policy's runs, A null with its note, the table's
    footnote; the other numbers are those of the same policy run beside the baseline."""
    from latsim.experiments.engine import Experiment, plan, run_experiment

    alone = Experiment(Ks=(8,), cost="fixed:0.5", updates="poisson:0.5",
                       policies=("speculative",), duration=20.0, seeds=3)
    assert [c.policy.name for c in plan(alone).cells] == ["speculative"]
    result = run_experiment(alone, jobs=1)
    assert {key: len(runs) for key, runs in result.runs.items()} == {(8, "speculative"): 3}
    (row,) = result.rows
    assert row["A"] is None and row["A_se"] is None
    assert row["A_note"].startswith("no baseline ran on the same arrivals")
    assert row["A_from_w"] > 1.0  # w's estimate needs no baseline
    both = run_experiment(replace(alone, policies=("baseline", "speculative")), jobs=1)
    (paired,) = [r for r in both.rows if r["policy"] == "speculative"]
    assert paired["A"] >= 1.0 and "A_note" not in paired
    assert {k: v for k, v in row.items() if k not in ("A", "A_se", "A_note")} == {
        k: v for k, v in paired.items() if k not in ("A", "A_se")}
    # asked for explicitly (Experiment.twin), the baseline runs beside it for A alone
    twin = run_experiment(replace(alone, twin=True), jobs=1)
    assert set(twin.runs) == {(8, "baseline"), (8, "speculative")}
    assert twin.rows == [paired]

    printed = invoke("simulate", "--K", "8", "--C", "0.5", "--policy", "speculative",
                     "--updates", "poisson:0.5", *FAST, "--json")
    assert printed.exit_code == 0, printed.stderr
    assert row_of(printed.stdout)["A"] is None
    table = invoke("simulate", "--K", "8", "--C", "0.5", "--policy", "speculative", *FAST)
    assert "no baseline ran on the same arrivals; --policy both measures A" in table.stdout
    assert "no baseline ran" not in invoke("simulate", "--K", "8", "--C", "0.5",
                                           *FAST).stdout


def test_simulate_out_writes_records_summary_and_plot(tmp_path):
    result = invoke("simulate", "--K", "8", "--C", "0.5", *FAST, "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    for name in ("summary.json", "summary.csv", "config.json", "conditions.csv", "jobs.csv",
                 "slots.csv", "stalls.csv", "discards.csv", "latency_cdf.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    # one K: the distribution of L, not a one-point plot against K
    assert not (tmp_path / "latency_vs_K.png").exists()
    assert "latency_cdf.png" in result.stdout
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert {r["policy"] for r in rows} == {"baseline", "speculative"}
    header = (tmp_path / "conditions.csv").read_text().splitlines()[0]
    assert header.startswith("policy,K,run,version,t_arrival")


def test_config_says_running_until_the_figure_is_drawn(tmp_path, monkeypatch):
    """The figure came after config.json said complete: drawing it hung past
    --lead 8192 (a bisection) and the folder claimed a finished run."""
    import latsim.viz.plots as plots

    seen, draw = [], plots.plot_latency

    def drawing(rows, out, runs=None):
        seen.append(json.loads((out / "config.json").read_text())["status"])
        return draw(rows, out, runs)

    monkeypatch.setattr(plots, "plot_latency", drawing)
    result = invoke("simulate", "--K", "4", "--C", "0.5", "--lead", "8200", "--policy",
                    "speculative", "--duration", "30", "--seeds", "1", "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert seen == ["running"]
    assert json.loads((tmp_path / "config.json").read_text())["status"] == "complete"


def test_several_k_draw_latency_against_k(tmp_path):
    result = invoke("sweep", "--K", "4", "8", *FAST, "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "latency_vs_K.png").stat().st_size > 0
    assert not (tmp_path / "latency_cdf.png").exists()


def test_trace_updates(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"meta": {"duration": 30}}\n{"t": 3.1}\n{"t": 17.9}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}",
                    "--json")
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout)
    assert all(r["n_conditions"] == 2 and r["duration"] == 30 for r in rows)


def test_theory_json_keys_and_paper_example():
    result = invoke("theory", "--K", "20", "--r", "1", "--fps", "4", "--C", "1.6",
                    "--rate", "0.05", "--json")
    assert result.exit_code == 0, result.stderr
    out = row_of(result.stdout)
    for key in ("T", "delta", "baseline_L_lower_bound", "speculative_L_ideal",
                "residual_wait_mean", "speculative_L_mean", "boundary_wait_reduction",
                "A_poisson_approx"):
        assert key in out
    assert out["T"] == 5.0 and round(out["residual_wait_mean"], 3) == 0.256
    assert round(out["unconditional_L_excl_Q"], 3) == 1.856


def test_theory_json_has_the_speculative_residual_wait_and_says_what_to_compare_it_with():
    result = invoke("theory", "--K", "8", "--C", "0.9", "--json")
    assert result.exit_code == 0, result.stderr
    payload = envelope_of(result.stdout)
    out = payload["rows"][0]
    assert out["residual_wait_mean"] == pytest.approx(0.2025)  # eq. (6)
    assert out["speculative_R_mean"] == pytest.approx(0.2025 + 0.25**2 / 4)  # + deferral
    assert "R_mean" in payload["about"]["speculative_R_mean"]
    assert payload["units"]["K"] == "latents" and payload["units"]["T"] == "s"
    table = invoke("theory", "--K", "8", "--C", "0.9")
    assert table.exit_code == 0 and "speculative_R_mean" in table.stdout


def test_sweep_with_different_refill_and_replan_costs_has_no_theory_value(tmp_path):
    """Refill 0.5 s, replan 1.2 s: no single C, so no closed form (it used to print the
    fixed-C 0.656 s while the simulation gave 1.27 s); the lead covers the replan."""
    table = tmp_path / "kinds.json"
    table.write_text('{"8": {"refill": 0.5, "replan": 1.2}}')
    result = invoke("sweep", "--K", "8", "--cost", f"table:{table}", *FAST, "--json")
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout)
    assert [r["policy"] for r in rows] == ["baseline", "speculative"]
    assert all(r["L_mean_theory"] is None for r in rows)
    assert all(r["lead"] == 1.2 for r in rows)


@pytest.mark.parametrize("extra, expected", [
    ((), theory.speculative_latency_mean(0.3, 2.0, 0.25)),
    (("--lead", "0.55"), theory.speculative_latency_mean(0.3, 2.0, 0.25, 0.55)),
    (("--commit-lead", "1.0"), None),  # branches placed 1 s ahead, not `lead`
    (("--q", "2"), None),
])
def test_sweep_speculative_theory_only_where_the_closed_form_holds(extra, expected):
    result = invoke("sweep", "--K", "8", "--C", "0.3", *FAST, *extra, "--json")
    assert result.exit_code == 0, result.stderr
    spec = rows_of(result.stdout)[1]
    assert spec["policy"] == "speculative"
    assert spec["L_mean_theory"] == (None if expected is None else pytest.approx(expected))


def test_controller_diagram_is_mermaid():
    result = invoke("controller", "--diagram")
    assert result.exit_code == 0
    assert result.stdout.startswith("stateDiagram-v2")
    assert "Produce --> Consume: job_done" in result.stdout


@pytest.fixture()
def bad_traces(tmp_path):
    unsorted = tmp_path / "unsorted.jsonl"
    unsorted.write_text('{"t": 2.0}\n{"t": 1.0}\n')
    not_json = tmp_path / "notjson.jsonl"
    not_json.write_text('{"t": 1.0}\n{"t": 2.0}\nnope\n')
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    return {"unsorted": unsorted, "not_json": not_json, "empty_dir": empty_dir}


BAD_INPUTS = [
    (["simulate", "--K", "0", "--C", "1"], "K must be a positive integer"),
    (["simulate", "--K", "-3", "--C", "1"], "K must be a positive integer"),
    (["simulate", "--K", "4", "--r", "0", "--C", "1"], "r must be a positive integer"),
    (["simulate", "--K", "4", "--fps", "0", "--C", "1"], "fps must be a positive number"),
    (["simulate", "--K", "4", "--fps", "-16", "--C", "1"], "fps must be a positive number"),
    (["simulate", "--K", "4", "--q", "3", "--C", "1"], "q=3 does not divide K=4"),
    (["simulate", "--K", "4", "--C", "-1"], "C must be a finite number of seconds >= 0"),
    (["simulate", "--K", "4", "--cost", "gamma:1,2"], "unknown cost spec prefix 'gamma'"),
    (["simulate", "--K", "4", "--cost", "fixed"], "needs the form KIND:ARGS"),
    (["simulate", "--K", "4", "--cost", "affine:1"], "needs 2 comma-separated"),
    (["simulate", "--K", "4", "--cost", "table:/nonexistent.json"], "cannot read cost table"),
    (["simulate", "--K", "4", "--C", "1", "--cost", "fixed:1"], "either --C or --cost"),
    (["simulate", "--K", "4", "--C", "1", "--updates", "storm:3"],
     "unknown update spec prefix 'storm'"),
    (["simulate", "--K", "4", "--C", "1", "--updates", "poisson:-1"], "poisson rate"),
    (["simulate", "--K", "4", "--C", "1", "--updates", "bernoulli:2"], "bernoulli probability"),
    (["simulate", "--K", "4", "--C", "1", "--updates", "trace:/nonexistent.jsonl"],
     "cannot read"),
    (["simulate", "--K", "21", "--C", "1", "--duration", "5"], "shorter than one chunk"),
    (["simulate", "--K", "4", "--C", "1", "--duration", "0"], "duration must be a positive"),
    (["simulate", "--K", "4", "--C", "1", "--lead", "-1"], "lead must be >= 0"),
    (["simulate", "--K", "4", "--C", "1", "--policy", "greedy"], "unknown policy 'greedy'"),
    (["simulate", "--K", "4", "--C", "1", "--seeds", "0"], "--seeds must be a positive"),
    (["simulate", "--K", "4", "8", "--C", "1"], "simulate takes one --K"),
    (["simulate", "--K", "four", "--C", "1"], "Invalid value for '--K'"),
    (["simulate", "--K", "4", "--C", "1", "--commit", "greedy"], "commit mode must be"),
    # accepted silently before: an empty mode (the preset's), a lead eager commit ignores
    (["simulate", "--K", "4", "--C", "1", "--commit", ""], "commit mode must be eager or lazy"),
    (["simulate", "--K", "4", "--C", "1", "--commit", "eager", "--commit-lead", "0.5"],
     "the lead would be ignored"),
    (["fleet", "plan", "examples/fleet.toml", "--slo-l95", "3", "--slo-stall", "1",
      "--policies", ""], "give each policy once"),
    (["fleet", "plan", "examples/fleet.toml", "--slo-l95", "3", "--slo-stall", "1",
      "--policies", "baseline,baseline"], "give each policy once"),
    (["simulate", "--K", "4", "--C", "1", "--commit-lead", "-1"], "commit lead must be >= 0"),
    (["simulate", "--K", "4", "--C", "1", "--policy", "baseline", "--q", "2"],
     "modify the speculative policy"),
    (["simulate", "--K", "4", "--C", "1", "--updates", "poisson:1e9"], "at most"),
    (["simulate", "--K", "4", "--C", "1", "--duration", "5", "--seeds", "1",
      "--out", "/proc/latsim-cannot-write"], "/proc/latsim-cannot-write"),
    (["theory", "--K", "4", "--C", "1", "--rate", "-1"], "rate must be >= 0"),
    (["theory", "--K", "4", "--C", "-2"], "C must be >= 0"),
    (["theory", "--K", "0", "--C", "1"], "K must be a positive integer"),
    (["sweep", "--K", "2", "4", "--cost", "table:TABLE", "--duration", "5"], "outside the cost"),
    # bounded inputs: each of these crashed, hung or was accepted
    (["simulate", "--K", "4", "--C", "1e308"],
     "C must be a finite number of seconds >= 0 and <= 86400"),
    (["simulate", "--K", "4", "--C", "0.1", "--fps", "1e9"], "fps must be a positive number in"),
    (["simulate", "--K", "4", "--C", "0.1", "--fps", "5e-324"], "fps must be a positive number in"),
    (["simulate", "--K", "4", "--C", "0.1", "--seeds", "1000000000"], "--seeds must be a positive"),
    (["simulate", "--K", "4", "--C", "0.1", "--seeds", str(10**40)], "an integer of 41 digits"),
    (["simulate", "--K", "100000", "--C", "0.1"], "K must be a positive integer <= 4096"),
    (["simulate", "--K", "4", "--C", "0.1", "--r", "100000"], "r must be a positive integer <="),
    (["simulate", "--K", "4", "--C", "1", "--lead", "1e308"], "lead must be >= 0 and <= 86400"),
    (["simulate", "--K", "4", "--C", "1", "--lead", "nan"], "lead must be >= 0"),
    (["simulate", "--K", "4", "--C", "1", "--commit-lead", "1e308"], "commit lead must be >= 0"),
    (["simulate", "--K", "4", "--C", "1", "--duration", "inf"], "duration must be a positive"),
    (["simulate", "--K", "4", "--C", "1", "--seed", "-1"], "--seed must be an integer >= 0"),
    (["simulate", "--K", "4", "--C", "1", "--jobs", "-1"], "--jobs must be a positive integer"),
    (["simulate", "--K", "4", "--C", "1", "--jobs", "0"], "--jobs must be a positive integer"),
    (["simulate", "--K", "4", "--C", "1", "--max-events", "0"], "--max-events must be"),
    (["simulate", "--K", "4", "--cost", "lognormal:1e308,1"], "lognormal mean must be > 0 and"),
    (["simulate", "--K", "4", "--cost", "lognormal:1,1e9"], "lognormal CV must be >= 0 and"),
    (["simulate", "--K", "21", "--cost", "affine:1,5000"], "mean C at K=21 is 1.05e+05 s"),
    (["simulate", "--K", "4", "--C", "0.1", "--updates", "trace:/dev/zero"], "larger than"),
    (["simulate", "--K", "4", "--cost", "table:/dev/zero"], "larger than"),
    (["simulate", "--K", "4", "--C", "0.1", "--seeds", "100000"], "--max-events"),
    (["simulate", "--K", "4", "--C", "0.1", "--duration", "1e6"], "--max-events"),
    (["simulate", "--K", "4", "--C", "0.1", "--updates", "poisson:1000", "--duration", "1000"],
     "--max-events"),
    (["sweep", "--K", "4", "8", "--C", "1", "--duration", "5", "--seeds", "2", "--max-events",
      "10"], "above the work bound of 10 (raise it with --max-events"),
    (["theory", "--K", "4", "--C", "1e308"], "C must be >= 0 and <= 86400 s"),
    (["theory", "--K", "4", "--C", "nan"], "C must be >= 0"),
    (["theory", "--K", "4", "--C", "1", "--fps", "inf"], "fps must be a positive number"),
    (["theory", "--K", "4", "--C", "1", "--rate", "1e308"], "rate must be >= 0 and"),
    (["theory", "--K", "5000", "--C", "1"], "K must be a positive integer <= 4096"),
    (["reproduce", "--jobs", "-1", "--out", "OUT"], "--jobs must be a positive integer"),
    (["reproduce", "--jobs", "1000", "--out", "OUT"], "--jobs must be a positive integer <= 64"),
    (["reproduce", "--max-events", "1000", "--out", "OUT"],
     "the reproduction's simulations come to about"),
    (["traces", "generate", "--kind", "low", "--count", "1000000000", "--out", "OUT"],
     "count must be a positive integer <= 100000"),
    (["traces", "generate", "--kind", "continuous", "--duration", "1e308", "--out", "OUT"],
     "duration must be a positive number in [1, 1e+06] s"),
    (["traces", "generate", "--kind", "continuous", "--duration", "1e5", "--out", "OUT"],
     "raise it with --max-events"),
    (["traces", "generate", "--kind", "high", "--duration", "0.001", "--out", "OUT"],
     "duration must be a positive number in [1,"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS)
def test_bad_input_is_one_clear_line_and_exit_2(args, message, tmp_path):
    table = tmp_path / "costs.json"
    table.write_text('{"3": 0.5, "8": 0.9}')
    args = [a.replace("TABLE", str(table)).replace("OUT", str(tmp_path / "out")) for a in args]
    started = time.perf_counter()
    result = invoke(*args)
    took = time.perf_counter() - started
    assert result.exit_code == 2, (result.stdout, result.stderr)
    # refused before any work: a hang or a run would take seconds, a plan milliseconds
    assert took < 20, took
    assert not (tmp_path / "out").exists()
    assert message in result.stderr
    assert result.stderr.startswith("latsim: error: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("name, where", [
    ("unsorted", "unsorted.jsonl:2: unsorted"),
    ("not_json", "notjson.jsonl:3: not JSON"),
])
def test_malformed_trace_names_file_and_line(bad_traces, name, where):
    result = invoke("simulate", "--K", "4", "--C", "1", "--updates",
                    f"trace:{bad_traces[name]}")
    assert result.exit_code == 2
    assert where in result.stderr and result.stderr.count("\n") == 1


def test_empty_trace_folder_is_an_error(bad_traces):
    result = invoke("sweep", "--K", "4", "--C", "1", "--updates",
                    f"traces:{bad_traces['empty_dir']}")
    assert result.exit_code == 2 and "no *.jsonl traces" in result.stderr


# ---------------------------------------------------------------- bounded inputs: traces


def write(path, text):
    path.write_text(text)
    return path


def test_header_only_trace_has_nothing_to_measure_and_says_so(tmp_path):
    """Decision (TraceArrivals): a header-only trace is a valid session, but a source with
    no condition in the window has no latency to measure, so a run on it is an error (it
    used to print L as '–')."""
    trace = write(tmp_path / "quiet.jsonl", '{"meta": {"duration": 30}}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}")
    assert result.exit_code == 2
    assert "has no condition in [0, 30) s" in result.stderr and "poisson:0" in result.stderr
    assert result.stderr.count("\n") == 1
    assert invoke("traces", "validate", str(trace)).exit_code == 0  # valid as a trace


def test_a_set_with_some_empty_traces_runs(tmp_path):
    write(tmp_path / "a.jsonl", '{"meta": {"duration": 20}}\n')
    write(tmp_path / "b.jsonl", '{"meta": {"duration": 20}}\n{"t": 5.5}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"traces:{tmp_path}",
                    "--json")
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout)
    assert all(r["n_conditions"] == 1 and r["n_runs"] == 2 for r in rows)


def test_empty_trace_file_is_an_error(tmp_path):
    trace = write(tmp_path / "empty.jsonl", "\n\n")
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}")
    assert result.exit_code == 2 and "empty: no header and no conditions" in result.stderr


def test_explicit_duration_that_cuts_every_condition_is_an_error(tmp_path):
    trace = write(tmp_path / "late.jsonl", '{"meta": {"duration": 60}}\n{"t": 50}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}",
                    "--duration", "20")
    assert result.exit_code == 2 and "no condition in [0, 20) s" in result.stderr


def test_time_beyond_a_defaulted_run_without_header_is_an_error(tmp_path):
    """Decision: no header and no --duration gives the 60 s default; a condition at or
    after it would be dropped silently, so it is an error naming both ways out. With
    --duration the window is the user's choice and later conditions are left out."""
    trace = write(tmp_path / "long.jsonl", '{"t": 1}\n{"t": 100}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}")
    assert result.exit_code == 2
    assert "t=100 is beyond the 60 s run" in result.stderr
    assert "--duration" in result.stderr and result.stderr.count("\n") == 1
    for extra, shown in ((["--duration", "120"], 2), (["--duration", "30"], 1)):
        ok = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}",
                    "--seeds", "1", "--json", *extra)
        assert ok.exit_code == 0, ok.stderr
        assert all(r["n_conditions"] == shown for r in rows_of(ok.stdout))


def test_beyond_the_run_in_a_folder_names_the_file(tmp_path):
    write(tmp_path / "a.jsonl", '{"t": 1}\n')
    write(tmp_path / "b.jsonl", '{"t": 2}\n{"t": 75}\n')
    result = invoke("sweep", "--K", "4", "--C", "0.3", "--updates", f"traces:{tmp_path}")
    assert result.exit_code == 2 and "b.jsonl: t=75 is beyond the 60 s run" in result.stderr
    # a set mixing traces with and without a header runs 60 s by default: a headed trace's
    # later condition would be dropped as silently
    mixed = tmp_path / "mixed"  # (a new spec: parsed specs are cached by their text)
    mixed.mkdir()
    write(mixed / "a.jsonl", '{"t": 1}\n')
    write(mixed / "b.jsonl", '{"meta": {"duration": 90}}\n{"t": 80}\n')
    result = invoke("sweep", "--K", "4", "--C", "0.3", "--updates", f"traces:{mixed}")
    assert result.exit_code == 2 and "b.jsonl: t=80 is beyond the 60 s run" in result.stderr
    assert "not every trace of the set has a meta duration header" in result.stderr


# ---------------------------------------------------------------- work bound


def test_work_bound_is_checked_before_any_simulation(monkeypatch):
    import latsim.experiments.stream_models as sweep

    def never(*args, **kwargs):
        raise AssertionError("simulated before checking the work bound")

    monkeypatch.setattr(sweep, "simulate_trace", never)
    result = invoke("sweep", "--K", "4", "8", "--C", "0.3", *FAST, "--max-events", "100")
    assert result.exit_code == 2 and "--max-events" in result.stderr


def test_work_bound_counts_slots_and_conditions_and_the_flag_raises_it():
    from latsim.experiments.engine import Experiment, cell_slots, plan, plan_events

    quiet = plan(Experiment(Ks=(4,), cost="fixed:0.3", updates="poisson:0", duration=20,
                            seeds=3))
    slots = sum(cell_slots(quiet, c) for c in quiet.cells)
    # ⌈(20 s + drain 4·(1 + 2·0.3) + 0.25) / 0.25⌉ for each of baseline and speculative
    assert slots == 2 * 107 and plan_events(quiet) == 3 * slots
    busy = plan(Experiment(Ks=(4,), cost="fixed:0.3", updates="poisson:2", duration=20,
                           seeds=3))
    assert plan_events(busy) == 3 * (slots + 2 * 40)
    args = ("simulate", "--K", "4", "--C", "0.3", *FAST, "--json")
    assert invoke(*args, "--max-events", "10").exit_code == 2
    assert invoke(*args, "--max-events", "1000").exit_code == 0


def test_default_work_bound_admits_every_documented_run():
    from latsim.experiments import paper, paper_settings
    from latsim.experiments.engine import Experiment, plan, plan_events

    readme = Experiment(Ks=(4, 8, 21))
    assert plan_events(plan(readme)) < DEFAULT_MAX_EVENTS / 100
    assert paper.reproduction_events(paper_settings.REPO_TRACES) < DEFAULT_MAX_EVENTS / 5
    one_long = Experiment(Ks=(21,), duration=6000.0)  # README: "one 6000 s run", 30 seeds
    assert plan_events(plan(one_long)) < DEFAULT_MAX_EVENTS / 5


# ---------------------------------------------------------------- one-line errors, Ctrl-C


def throwaway_app(exc: BaseException) -> typer.Typer:
    """A fresh app on the same group class with one command (and one in a sub-group) that
    raise ``exc``."""
    fresh = typer.Typer(cls=OneLineErrors, add_completion=False, pretty_exceptions_enable=False)
    sub = typer.Typer()

    @fresh.command("boom")
    def boom() -> None:
        raise exc

    @fresh.command("other")
    def other() -> None:  # a second command keeps "boom" a subcommand
        pass

    @sub.command("deep")
    def deep() -> None:
        raise exc

    fresh.add_typer(sub, name="sub")
    return fresh


@pytest.mark.parametrize("where", [["boom"], ["sub", "deep"]])
@pytest.mark.parametrize("exc, line", [
    (KeyboardInterrupt(), "latsim: interrupted"),
    (Interrupted("kept 3 of 8 runs in out/ (marked interrupted)"),
     "latsim: interrupted: kept 3 of 8 runs in out/ (marked interrupted)"),
    (Interrupted(), "latsim: interrupted"),
    (Interrupted("two\nlines"), "latsim: interrupted: two\\nlines"),
])
def test_ctrl_c_says_interrupted_and_exits_130(where, exc, line):
    result = runner.invoke(throwaway_app(exc), where)
    assert result.exit_code == 130
    assert result.stderr == line + "\n"


@pytest.mark.parametrize("exc, line", [
    (OSError(28, "No space left on device"), "latsim: error: No space left on device"),
    (OSError(13, "Permission denied", "/results/run"),
     "latsim: error: /results/run: Permission denied"),
    (OSError(18, "Invalid cross-device link", "/a", None, "/b"),
     "latsim: error: /a -> /b: Invalid cross-device link"),
    (OSError("disk on fire"), "latsim: error: disk on fire"),
    (LatsimError("bad\ninput"), "latsim: error: bad\\ninput"),
])
def test_errors_are_one_line_without_a_double_colon(exc, line):
    result = runner.invoke(throwaway_app(exc), ["boom"])
    assert result.exit_code == 2
    assert result.stderr == line + "\n"


def test_huge_numbers_print_in_scientific_notation():
    assert fmt(1.5e20) == "1.500e+20" and fmt(-3e9, 2) == "-3.00e+09"
    assert fmt(123456.789) == "123456.789" and fmt(None) == "–" and fmt(float("nan")) == "nan"


def _children(pid: int) -> list[int]:
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(x) for x in out.split()]


def _a_parallel_sweep_with_its_workers():
    """A long ``sweep --jobs 2`` in a session of its own, once both its workers run: the
    process and the workers' pids."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", "from latsim.cli import main; main()", "sweep", "--K", "4", "8",
         "21", "--seeds", "3000", "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    deadline = time.monotonic() + 60
    while len(workers := _children(proc.pid)) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    assert len(workers) >= 2, "the sweep never started its workers"
    return proc, workers


def test_ctrl_c_during_a_parallel_sweep_is_one_line_and_stops_the_workers():
    """A real Ctrl-C (SIGINT to the process group) while worker processes run: one line,
    exit 130, and no worker left behind (they used to print a traceback each)."""
    import os
    import shutil
    import signal

    if shutil.which("ps") is None:
        pytest.skip("needs ps to find the worker processes")
    proc, workers = _a_parallel_sweep_with_its_workers()
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err.decode()) == (130, "latsim: interrupted\n")
    time.sleep(0.5)
    assert not [w for w in workers if _running(w)]


def test_workers_die_with_a_parent_killed_outright():
    """SIGKILL of a parallel command's main process (no Ctrl-C, no chance to stop its
    workers): the workers see they were orphaned and end within a bounded time, where
    they used to run on (grid, fleet and plan fork the same pool)."""
    import contextlib
    import os
    import shutil
    import signal

    if shutil.which("ps") is None:
        pytest.skip("needs ps to find the worker processes")
    proc, workers = _a_parallel_sweep_with_its_workers()
    try:
        proc.kill()  # the parent alone, outright
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60  # a bound far above the watch's 0.25 s
        while (alive := [w for w in workers if _running(w)]) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left: no test leaks it
            os.killpg(proc.pid, signal.SIGKILL)
    assert not alive


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ---------------------------------------------------------------- CLI habits


def _command_paths() -> list[tuple[str, ...]]:
    """Every command of ``latsim`` (the live harness's included), as argument paths."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root)  # typer's own click (the installed one may be another)
    paths: list[tuple[str, ...]] = []

    def walk(group, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if hasattr(command, "list_commands"):
                walk(command, (*path, name))
            else:
                paths.append((*path, name))

    walk(root, ())
    return paths


def test_version_and_the_short_help_flag():
    from latsim import __version__, build

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"latsim {__version__} ({build()})\n"
    assert invoke("-h").exit_code == 0 and "Usage: " in invoke("-h").stdout


def test_help_on_a_command_is_that_commands_help_and_exits_0():
    for path in (("sweep",), ("traces", "generate"), ("measure",)):
        via_help = invoke("help", *path)
        assert via_help.exit_code == 0, via_help.output
        assert via_help.stdout == invoke(*path, "--help").stdout == invoke(*path, "-h").stdout
    assert invoke("help").exit_code == 0 and "Commands" in invoke("help").stdout


def _group_paths() -> list[tuple[str, ...]]:
    """Every command group of ``latsim`` (``fleet``, ``traces``, ...), as argument paths."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    return [(name,) for name in root.list_commands(ctx)
            if hasattr(root.get_command(ctx, name), "list_commands")]


def test_every_command_has_examples_in_its_help():
    paths = _command_paths()
    assert {("sweep",), ("measure",), ("plugins",), ("export", "perfetto")} <= set(paths)
    groups = _group_paths()  # a group's help too: its commands, an example each or so
    assert {("fleet",), ("reproduce",), ("plot",), ("export",), ("traces",)} <= set(groups)
    for path in paths + groups:
        result = invoke(*path, "--help")
        assert result.exit_code == 0, path
        assert "Examples:" in result.stdout and "$ latsim " + " ".join(path) in " ".join(
            result.stdout.split()), path


def _all_help_paths() -> list[tuple[str, ...]]:
    """The root, every group (nested ones too) and every command, as argument paths."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    paths: list[tuple[str, ...]] = [()]

    def walk(group, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            paths.append((*path, name))
            if hasattr(command, "list_commands"):
                walk(command, (*path, name))

    walk(root, ())
    return paths


def test_every_help_page_fits_80_columns_without_a_cut():
    """``-h`` of the root, of every group and of every command at COLUMNS=80: no line wider
    than 80 and nothing cut to "…" (an option's name, a cost spec, a path in the help)."""
    paths = _all_help_paths()
    assert {(), ("fleet",), ("fleet", "plan"), ("reproduce", "serving"), ("traces",),
            ("serve",), ("measure",), ("capacity",)} <= set(paths)
    cut = []
    for path in paths:
        result = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        cut += [f"{' '.join(path)}: {line}" for line in result.stdout.splitlines()
                if len(line) > 80 or "…" in line]
    assert not cut, "\n".join(cut)


def test_the_cost_help_names_every_built_in_prefix():
    from latsim.plugins import plugins

    text = " ".join(invoke("sweep", "--help").stdout.replace("│", " ").split())  # the box
    built_in = [p.name for p in plugins("costs") if p.distribution.startswith("latsim ")]
    assert len(built_in) == 8
    for prefix in built_in:
        assert f"{prefix}:" in text, prefix
    assert "latsim plugins costs" in text


_CUT_NUMBER = __import__("re").compile(r"\d…|…\d")


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", [
    ("sweep", "--K", "4", "8", "--seeds", "2", "--duration", "20"),
    ("simulate", "--K", "8", "--C", "0.9", "--streams", "2", "--pools", "dit=1",
     "--seeds", "2", "--duration", "20"),
    ("compare", "results/compare/runs", "--replications", "2"),
    ("capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95", "2.0",
     "--slo-stall", "1", "--duration", "20", "--max-streams", "4", "--max-seeds", "5"),
], ids=["sweep", "serving", "compare", "capacity"])
def test_tables_fit_the_terminal_and_never_cut_a_number(args, columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, max(lines, key=len)
    assert not _CUT_NUMBER.search(result.stdout)
    header = next(line for line in lines if "┃" in line)
    for kept in {"sweep": ("policy", "K", "L50", "L95", "stall%"),
                 "simulate": ("policy", "K", "L50", "viewer stall%"),
                 "compare": ("run", "status", "L50", "L95", "MAPE"),
                 "capacity": ("N", "verdict", "L95", "stall%")}[args[0]]:
        assert f" {kept} " in header, (kept, header)


def test_the_status_line_is_silent_off_a_terminal():
    import io

    from latsim.formatting import StatusLine

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, expect in ((io.StringIO(), ""), (Terminal(), "\rrun 1/2\n")):
        with StatusLine(width=7, stream=stream) as status:
            status("run 1/2")
        assert stream.getvalue() == expect


def test_quiet_silences_progress_and_keeps_results(monkeypatch):
    from latsim.formatting import QUIET_ENV, quiet

    monkeypatch.setenv(QUIET_ENV, "0")  # restored (unset) after the test
    assert not quiet()
    result = invoke("--quiet", "theory", "--K", "8", "--C", "0.5")
    assert result.exit_code == 0 and "speculative_L_mean" in result.stdout
    assert quiet()  # set for the rest of the process: the harness's status lines read it


def test_inputs_that_used_to_slip_through_are_one_line_errors(tmp_path, monkeypatch):
    """Non-ASCII digits (float() reads '١' as 1), a repeated --K, an unwritable --out found
    before any simulation, compare without a work bound."""
    import latsim.experiments.engine as engine

    cases = [
        (("simulate", "--K", "8", "--C", "0.5", "--updates", "poisson:١"), "ASCII digits"),
        (("simulate", "--K", "8", "--cost", "fixed:٠.٥"), "ASCII digits"),
        (("simulate", "--K", "8", "--C", "١"), "ASCII digits"),  # click's float reads it
        (("sweep", "--K=٨", "--C", "1"), "ASCII digits"),
        (("simulate", "--K", "8", "--C", "0.5", "--streams", "2", "--lead", "١"),
         "ASCII digits"),
        (("sweep", "--K", "4", "4", "8"), "--K repeats 4"),
        (("sweep", "--K", "4", "--out", ""), "--out is empty"),
        (("sweep", "--K", "4", "--out="), "--out is empty"),
        (("compare", "results/compare/runs", "--replications", "100000"),
         "above the work bound"),
    ]
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    for args, message in cases:
        result = invoke(*args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated before checking --out")

    # every module that holds the function, so that none imported now keeps the stand-in
    from latsim.experiments import paper, serving_paper

    for module in (engine, paper, serving_paper):
        monkeypatch.setattr(module, "run_experiment", no_simulation)
    for args in (("sweep", "--K", "4", "--out", str(blocker / "out")),
                 ("reproduce", "--out", str(blocker / "out")),
                 ("reproduce", "serving", "--out", str(blocker / "out"))):
        result = invoke(*args)
        assert result.exit_code == 2 and "cannot write there" in result.stderr, result.stderr


def test_a_number_with_an_underscore_is_refused_where_an_option_takes_it(tmp_path,
                                                                        monkeypatch):
    """Issue 51's corpus: click's int and float options read ``1_0`` as ten (Python's
    literal syntax), so ``--jobs 1_0`` ran with ten workers and ``compare --seed 1_0`` with
    seed ten, exit 0. An option's value is refused; a positional word (a folder named
    ``1_0``) is not looked at."""
    for args in (("simulate", "--K", "8", "--C", "0.5", "--seed", "1_0"),
                 ("sweep", "--K", "4", "8_0", "--C", "0.5"),
                 ("simulate", "--K", "8", "--C=2_5.5"),
                 ("theory", "--K", "8", "--C", "1_0.5")):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.stdout)
        assert "a number with an underscore" in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1
    folder = tmp_path / "1_0"
    folder.mkdir()
    result = invoke("traces", "validate", str(folder))
    assert "underscore" not in result.stderr, result.stderr
    monkeypatch.chdir(tmp_path)
    result = invoke("traces", "generate", "--kind", "high", "--count", "1", "--out", "1_0")
    assert "underscore" not in result.stderr, result.stderr  # an --out folder's name


def test_a_viewers_uplink_is_never_negative():
    from latsim.run.serving import ViewerRecord

    record = ViewerRecord(0, 1, 0.1 + 0.2, 0.3, 0.5, 0.6, 0.2, 0.3, False, True)
    assert 0.1 + 0.2 > 0.3 and record.uplink == 0.0


def test_every_simulate_option_is_a_grid_setting_or_says_why_not():
    from latsim.experiments.grid import NOT_SETTINGS, SETTINGS

    command = typer.main.get_command(app).get_command(None, "simulate")  # type: ignore[arg-type]
    names = {param.name for param in command.params}
    expected = (set(SETTINGS) - {"rate"}) | set(NOT_SETTINGS)  # rate: poisson:RATE, shorter
    assert names == expected, names ^ expected


def test_a_grid_with_in_flight_and_run_ahead_runs_them(tmp_path):
    from latsim.experiments.grid import parse_grid, run_grid

    spec = parse_grid("""
        name = "deep"
        seeds = 2
        metrics = ["L50", "stall_pct"]
        [fixed]
        duration = 20
        C = 0.9
        run_ahead = 0.5
        cold_start = true
        streams = 2
        pools = "dit=2"
        [axes]
        K = [8]
        policy = ["speculative"]
        in_flight = [1, 2]
        in_flight_policy = ["let-play", "flush"]
    """)
    result = run_grid(spec, tmp_path / "grid")
    assert [(r["in_flight"], r["in_flight_policy"]) for r in result.rows] == [
        (1, "let-play"), (1, "flush"), (2, "let-play"), (2, "flush")]
    with pytest.raises(LatsimError, match="cold_start = 1 is not a boolean"):
        parse_grid("[axes]\nK = [8]\n[fixed]\ncold_start = 1")
    with pytest.raises(LatsimError, match=r"^cell 1 \(K=8, cost='nope:1'\): unknown cost"):
        run_grid(parse_grid("[axes]\nK = [8]\ncost = ['fixed:0.5', 'nope:1']\n[fixed]\n"
                            "duration = 20"), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing written before every cell is checked


#: Help examples cheap enough to run here, in this order (the timeline example writes the
#: folder the perfetto one exports); the others need a model, a server, minutes or a file
#: the user names.
RUNNABLE_EXAMPLES = ("theory", "traces show", "traces validate", "plot timeline",
                     "export perfetto", "plugins", "help", "controller", "simulate")


def test_the_help_examples_run_as_written(tmp_path, monkeypatch):
    """What ``-h`` shows a newcomer works when pasted (traces show named a file that did
    not exist; plot timeline a folder no command writes)."""
    import shlex
    import shutil

    from latsim.cli.examples import EXAMPLES

    shutil.copytree(Path(__file__).resolve().parent.parent / "traces", tmp_path / "traces")
    monkeypatch.chdir(tmp_path)
    for name in RUNNABLE_EXAMPLES:
        for line in EXAMPLES[name]:
            words = shlex.split(line)
            assert words[0] == "latsim"
            result = invoke(*words[1:])
            assert result.exit_code == 0, (line, result.stderr)


def test_a_status_line_fits_the_terminal_it_writes_to(monkeypatch):
    """A status line longer than the terminal is cut to its columns less one (no wrap, so
    the next rewrite lands on the same line), and a shorter one after it is padded over
    it: at 80 columns and at 50."""
    import io

    from latsim.formatting import StatusLine

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for columns in (80, 50):
        monkeypatch.setenv("COLUMNS", str(columns))
        stream = Terminal()
        with StatusLine(stream=stream) as status:
            status("plan: " + "x" * 150)
            status("short")
        writes = stream.getvalue().split("\r")[1:]
        width = columns - 1
        assert [len(w.rstrip("\n")) for w in writes] == [width, width]
        assert writes[1].startswith("short ")


def test_a_plain_status_line_writes_each_line_once_off_a_terminal(monkeypatch):
    """``plan`` and ``fleet plan`` report each exact run off a terminal too (a log, CI):
    one line each, with the seconds so far; under --quiet nothing."""
    import io

    from latsim.formatting import QUIET_ENV, StatusLine

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv(QUIET_ENV, "0")
    stream = io.StringIO()
    with StatusLine(stream=stream, plain=True) as status:
        status("verifying K=8 speculative (1 of at most 12)")
        status("verifying K=8 baseline (2 of at most 12)")
    lines = stream.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == [
        "verifying K=8 speculative (1 of at most 12)", "verifying K=8 baseline (2 of at most 12)"]
    assert all(line.endswith(" s]") and "\r" not in line for line in lines)
    monkeypatch.setenv(QUIET_ENV, "1")
    quiet_stream = io.StringIO()
    StatusLine(stream=quiet_stream, plain=True)("verifying")
    assert quiet_stream.getvalue() == ""


def test_a_lead_long_against_the_window_is_said_beside_the_row(monkeypatch):
    """--lead 100 in a 60 s window: the cache needs about 33 s to hold the lead, so L sits
    well below the steady state's theory, and the table says why; in 1,200 s it reaches the
    theory and no note is needed. The default lead needs none either."""
    import json

    monkeypatch.setenv("COLUMNS", "200")
    base = ("simulate", "--K", "8", "--C", "0.5", "--seeds", "3", "--policy", "baseline")
    short = invoke(*base, "--lead", "100", "--duration", "60")
    assert short.exit_code == 0, short.output
    said = " ".join(short.stdout.split())
    assert "cache takes about 33 s (lead·C/(T−C)) to fill, 56% of the 60 s window" in said
    (row,) = json.loads(invoke(*base, "--lead", "100", "--duration", "60", "--json").stdout)[
        "rows"]
    assert row["L_mean"] < 0.8 * row["L_mean_theory"]  # what the note warns of
    long = invoke(*base, "--lead", "100", "--duration", "1200")
    assert "to fill" not in long.stdout
    (row,) = json.loads(invoke(*base, "--lead", "100", "--duration", "1200", "--json").stdout)[
        "rows"]
    assert abs(row["L_mean"] / row["L_mean_theory"] - 1) < 0.03
    assert "to fill" not in invoke(*base, "--duration", "60").stdout


def test_install_hints_name_the_way_latsim_was_installed(monkeypatch):
    """A missing extra's hint is a command that works for this install: ``pip install -e``
    only from an editable checkout (it meant nothing to a wheel's install), else the path
    or URL pip recorded; a bare egg-info without a record (a checkout as the current
    folder) is passed over."""
    from importlib import metadata

    from latsim.errors import install_hint

    class Dist:
        def __init__(self, record: str | None) -> None:
            self.record = record

        def read_text(self, name: str) -> str | None:
            return self.record if name == "direct_url.json" else None

    def installed(*records: str | None) -> None:
        monkeypatch.setattr(metadata, "distributions",
                            lambda name: [Dist(r) for r in records])

    installed(None, '{"url": "file:///src/latsim", "dir_info": {"editable": true}}')
    assert install_hint("dask") == "pip install -e '.[dask]'"
    installed('{"url": "file:///tmp/latsim-0.1.0-py3-none-any.whl", "archive_info": {}}')
    assert install_hint("live") == "pip install '/tmp/latsim-0.1.0-py3-none-any.whl[live]'"
    installed('{"url": "https://example.org/latsim.tar.gz", "archive_info": {}}')
    assert install_hint() == "pip install 'https://example.org/latsim.tar.gz'"
    installed(None, "not json")
    assert install_hint("dask") == "pip install 'latsim[dask]'"
