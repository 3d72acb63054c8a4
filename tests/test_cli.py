"""Command-line contract (DESIGN §4): outputs, determinism, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from latsim.analysis import theory
from latsim.cli.app import _expand_multi_values, app

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
    rows = json.loads(result.stdout)
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
    assert first == invoke(*args, "--seed", "7", "--jobs", "1").stdout  # serial == parallel
    assert first != invoke(*args, "--seed", "8").stdout


def test_simulate_speculative_alone_still_reports_a_against_its_baseline_twin():
    result = invoke("simulate", "--K", "8", "--C", "0.5", "--policy", "speculative",
                    "--updates", "poisson:0.5", *FAST, "--json")
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["policy"] == "speculative" and row["A"] >= 1.0


def test_simulate_out_writes_records_summary_and_plot(tmp_path):
    result = invoke("simulate", "--K", "8", "--C", "0.5", *FAST, "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    for name in ("summary.json", "summary.csv", "config.json", "conditions.csv", "jobs.csv",
                 "slots.csv", "stalls.csv", "discards.csv", "latency_vs_K.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert {r["policy"] for r in rows} == {"baseline", "speculative"}
    header = (tmp_path / "conditions.csv").read_text().splitlines()[0]
    assert header.startswith("policy,K,run,version,t_arrival")


def test_trace_updates(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"meta": {"duration": 30}}\n{"t": 3.1}\n{"t": 17.9}\n')
    result = invoke("simulate", "--K", "4", "--C", "0.3", "--updates", f"trace:{trace}",
                    "--json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert all(r["n_conditions"] == 2 and r["duration"] == 30 for r in rows)


def test_theory_json_keys_and_paper_example():
    result = invoke("theory", "--K", "20", "--r", "1", "--fps", "4", "--C", "1.6",
                    "--rate", "0.05", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    for key in ("T", "delta", "baseline_L_lower_bound", "speculative_L_ideal",
                "residual_wait_mean", "speculative_L_mean", "boundary_wait_reduction",
                "A_poisson_approx"):
        assert key in out
    assert out["T"] == 5.0 and round(out["residual_wait_mean"], 3) == 0.256
    assert round(out["unconditional_L_excl_Q"], 3) == 1.856


def test_theory_json_has_the_speculative_residual_wait_and_says_what_to_compare_it_with():
    result = invoke("theory", "--K", "8", "--C", "0.9", "--json")
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["residual_wait_mean"] == pytest.approx(0.2025)  # eq. (6)
    assert out["speculative_R_mean"] == pytest.approx(0.2025 + 0.25**2 / 4)  # + deferral
    assert "R_mean" in out["about"]["speculative_R_mean"]
    table = invoke("theory", "--K", "8", "--C", "0.9")
    assert table.exit_code == 0 and "speculative_R_mean" in table.stdout


def test_sweep_with_different_refill_and_replan_costs_has_no_theory_value(tmp_path):
    """Refill 0.5 s, replan 1.2 s: no single C, so no closed form (it used to print the
    fixed-C 0.656 s while the simulation gave 1.27 s); the lead covers the replan."""
    table = tmp_path / "kinds.json"
    table.write_text('{"8": {"refill": 0.5, "replan": 1.2}}')
    result = invoke("sweep", "--K", "8", "--cost", f"table:{table}", *FAST, "--json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
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
    spec = json.loads(result.stdout)[1]
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
]


@pytest.mark.parametrize("args, message", BAD_INPUTS)
def test_bad_input_is_one_clear_line_and_exit_2(args, message, tmp_path):
    table = tmp_path / "costs.json"
    table.write_text('{"3": 0.5, "8": 0.9}')
    args = [a.replace("TABLE", str(table)) for a in args]
    result = invoke(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
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
