"""The serving model on the command line: unchanged output without its flags, the pooled
JSON keys, run folders with a stream column, the TOML file, capacity, and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from latsim.cli.root import app
from latsim.experiments.capacity import SLO, CapacityQuery, search_capacity
from latsim.experiments.engine import Experiment
from latsim.model.costs import FixedCost
from latsim.model.serving import ServingConfig, build_serving
from latsim.run.files import dumps
from tests.helpers import envelope_of, row_of, rows_of

runner = CliRunner()
GOLDEN = Path(__file__).parent / "golden"
SERVING_KEYS = {"n_streams", "L99", "cpr", "ttff_mean", "busy_pct_by_pool"}


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize(("args", "golden"), [
    (("simulate", "--K", "8", "--seeds", "4", "--duration", "40"), "simulate_K8_seeds4.json"),
    (("simulate", "--K", "4", "--cost", "lognormal:0.6,0.3", "--updates", "poisson:0.3",
      "--seeds", "3", "--duration", "30"), "simulate_K4_lognormal.json"),
    (("sweep",), "sweep_default.json"),
])
def test_without_serving_flags_the_json_is_byte_identical_to_before(args, golden):
    """The golden files were written by the code before the serving model existed (and
    gained the 95% intervals' keys since, every figure they held unchanged)."""
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.stderr
    assert dumps(rows_of(result.stdout)) + "\n" == (GOLDEN / golden).read_text()


def test_without_serving_flags_the_run_folder_is_byte_identical_to_before(tmp_path):
    result = invoke("simulate", "--K", "4", "--seeds", "2", "--duration", "20", "--out",
                    str(tmp_path))
    assert result.exit_code == 0, result.stderr
    expected = json.loads((GOLDEN / "simulate_K4_out_sha256.json").read_text())
    for name, digest in expected.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest, name


def test_one_stream_on_dedicated_pools_gives_the_same_numbers_plus_pooled_keys():
    plain = rows_of(invoke("simulate", "--K", "8", "--seeds", "4", "--duration", "40",
                              "--json").stdout)
    result = invoke("simulate", "--K", "8", "--seeds", "4", "--duration", "40", "--json",
                    "--streams", "1", "--pools", "dit=1,vae=1", "--decode", "fixed:0",
                    "--deliver", "fixed:0", "--uplink", "fixed:0")
    assert result.exit_code == 0, result.stderr
    serving = rows_of(result.stdout)
    for old, new in zip(plain, serving, strict=True):
        assert SERVING_KEYS <= new.keys()
        # the same numbers; L is named for what it spans: the viewer's send to display
        assert {k: v for k, v in new.items() if k in old and k != "L_basis"} == {
            k: v for k, v in old.items() if k != "L_basis"}
        assert (old["L_basis"], new["L_basis"]) == ("controller timeline", "viewer")
        assert new["n_streams"] == 1 and new["busy_pct_by_pool"]["vae"] == 0.0


def test_many_streams_write_records_with_a_stream_column(tmp_path):
    result = invoke("simulate", "--K", "8", "--C", "0.4", "--policy", "speculative",
                    "--streams", "3", "--pools", "dit=1,vae=1", "--decode", "fixed:0.05",
                    "--deliver", "lognormal:0.02,0.5", "--uplink", "fixed:0.01",
                    "--updates", "poisson:0.3", "--duration", "30", "--seeds", "2",
                    "--lead", "1.2", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    speculative = row_of(result.stdout)  # one policy: one row
    assert speculative["n_streams"] == 3
    assert set(speculative["busy_pct_by_pool"]) == {"dit", "vae"}
    conditions = pd.read_csv(tmp_path / "conditions.csv")
    assert set(conditions["stream"]) == {0, 1, 2}
    assert conditions.groupby(["policy", "run", "stream"]).size().min() >= 1
    tasks = pd.read_csv(tmp_path / "tasks.csv")
    assert {"stream", "stage", "pool", "device", "t_enqueue"} <= set(tasks.columns)
    viewer = pd.read_csv(tmp_path / "viewer.csv")
    shown = viewer[viewer["displayed"]]
    # end-to-end L = uplink + server-side L + playout (+ client lateness)
    assert (shown["L"] >= shown["L_server"] + 0.01 - 1e-9).all()
    assert len(pd.read_csv(tmp_path / "streams.csv")) == 3  # the policy asked for, alone
    assert set(conditions["policy"]) == {"speculative"}
    # no baseline ran (A is blank): no twin's records either
    assert speculative["A"] is None and not (tmp_path / "baseline_twin").exists()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["serving"]["streams"] == 3 and config["serving"]["decode"] == "fixed:0.05"


def test_a_twin_asked_for_writes_its_records_apart_and_labelled(tmp_path):
    """``Experiment.twin``: the baseline behind A runs beside a speculative experiment; its
    records go to ``baseline_twin/``, an experiment folder of its own."""
    from latsim.experiments.engine import run_experiment, write_experiment

    experiment = Experiment(Ks=(8,), cost="fixed:0.4", policies=("speculative",),
                            updates="poisson:0.3", duration=30.0, seeds=2, lead=1.2,
                            twin=True, serving=ServingConfig(streams=3))
    result = run_experiment(experiment, jobs=1)
    (row,) = result.rows
    assert row["policy"] == "speculative" and row["A"] >= 1.0 and "A_note" not in row
    write_experiment(result, tmp_path)
    assert set(pd.read_csv(tmp_path / "conditions.csv")["policy"]) == {"speculative"}
    assert json.loads((tmp_path / "config.json").read_text())["twin"] is True
    twin = tmp_path / "baseline_twin"
    config = json.loads((twin / "config.json").read_text())
    assert config["twin_of"] == ["speculative"] and "twin" not in config
    assert set(pd.read_csv(twin / "conditions.csv")["policy"]) == {"baseline"}
    assert len(pd.read_csv(twin / "streams.csv")) == 3


def test_a_serving_file_sets_everything_and_flags_override_it(tmp_path):
    file = tmp_path / "serving.toml"
    file.write_text('streams = 4\nschedule = "least-slack"\ndiscard = "on-ready"\n'
                    'start = "random"\ncold_start = true\n[pools]\ndit = 2\nvae = 1\n'
                    '[stages.dit]\ncost = "fixed:0.3"\n[stages.decode]\npool = "vae"\n'
                    'cost = "fixed:0.05"\n[stages.deliver]\ncost = "fixed:0.02"\n'
                    '[replan]\ncost = "fixed:0.01"\n[batch]\ncost = "affine:0.1,0.02"\n'
                    'max = 2\n')
    config, dit_cost = build_serving(file, streams=2)
    assert dit_cost == "fixed:0.3"
    assert config.streams == 2 and config.pools == (("dit", 2), ("vae", 1))
    assert config.schedule == "least-slack" and config.cold_start and config.batch.max_size == 2
    result = invoke("simulate", "--K", "4", "--serving", str(file), "--duration", "20",
                    "--seeds", "2", "--json")
    assert result.exit_code == 0, result.stderr
    row = rows_of(result.stdout)[0]
    assert row["cost"] == "fixed:0.3" and row["n_streams"] == 4
    assert row["ttff_mean"] > row["playout_delay"]  # a cold start waits for its first chunk


@pytest.mark.parametrize(("args", "message"), [
    (("--streams", "0"), "--streams"),
    (("--pools", "dit=0"), "devices"),
    (("--pools", "gpu=1"), "stage dit runs on pool 'dit'"),
    (("--decode", "fixed:0.1", "--pools", "dit=1"), "stage decode runs on pool 'vae'"),
    (("--pools", "dit"), "NAME=DEVICES"),
    (("--pools", "dit=1,dit=2"), "twice"),
    (("--schedule", "random"), "--schedule must be one of"),
    (("--discard", "never"), "--discard must be one of"),
    (("--batch", "fixed:0.1;size=2"), ";max=B"),
    (("--deliver", "nope"), "cost spec"),
    (("--playout-delay", "-1"), "--playout-delay"),
])
def test_bad_serving_input_exits_2_with_one_line(args, message):
    result = invoke("simulate", "--K", "4", "--duration", "10", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("streams = [", "not valid TOML"),
    ("streamz = 3", "unknown key 'streamz'"),
    ("streams = 'three'", "expected int"),
    ("[stages.decode]\npool = 'nope'\ncost = 'fixed:0.1'", "stage decode runs on pool 'nope'"),
    ("[stages.render]\ncost = 'fixed:0.1'", "unknown stage 'render'"),
    ("[pools]\ndit = 1.5", "expected int"),
])
def test_bad_serving_files_exit_2_with_one_line(tmp_path, text, message):
    file = tmp_path / "bad.toml"
    file.write_text(text)
    result = invoke("simulate", "--K", "4", "--duration", "10", "--serving", str(file))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_capacity_json_is_one_object_with_max_streams_and_its_rows(tmp_path):
    result = invoke("capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95",
                    "2.0", "--slo-stall", "0.1", "--lead", "1.5", "--duration", "30",
                    "--max-streams", "8", "--json", "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    payload = envelope_of(result.stdout)
    assert payload["max_streams"] >= 1
    rows = {row["streams"]: row for row in payload["rows"]}
    assert rows[payload["max_streams"]]["verdict"] == "meets"
    above = payload["max_streams"] + 1
    if above <= 8:
        assert rows[above]["verdict"] != "meets"
    assert (tmp_path / "capacity.png").stat().st_size > 0
    assert len(pd.read_csv(tmp_path / "capacity.csv")) == len(payload["rows"])


@pytest.mark.slow  # 7 s or more on 2 cores
def test_capacity_says_which_lead_its_verdicts_hold_for_and_when_the_answer_is_past_it(
        monkeypatch):
    """Under --lead auto each verdict holds at its pilot's lead (another seed's pilot moves
    it), which the notes say, and an answer that loads the DiT devices past 0.85 (here
    0.94: 12 streams of C = 0.3 s every 2 s on 2 devices) is past what the lead's stall
    promise was checked over. A fixed lead needs neither note's first half."""
    monkeypatch.setenv("LATSIM_CACHE_DIR", "off")
    base = ["capacity", "--K", "8", "--C", "0.3", "--pools", "dit=2", "--slo-l95", "3",
            "--slo-stall", "0.5", "--max-streams", "32", "--duration", "60", "--json"]
    auto = envelope_of(invoke(*base).stdout)
    assert auto["max_streams"] >= 12
    answer = next(r for r in auto["rows"] if r["streams"] == auto["max_streams"])
    assert answer["busy_pct"] > 85
    assert any("pilots of its own" in note for note in auto["notes"])
    assert answer["lead_min"] <= answer["lead"] <= answer["lead_max"]
    assert any("past the 0.85" in note for note in auto["notes"])
    fixed = envelope_of(invoke(*base, "--lead", "1.5").stdout)
    assert fixed["notes"] == []


def test_capacity_bad_input_exits_2_with_one_line():
    for args in (("--slo-l95", "0"), ("--slo-l95", "2", "--max-streams", "0"),
                 ("--slo-l95", "2", "--policy", "both")):
        result = invoke("capacity", "--K", "8", "--C", "0.5", *args)
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def _capacity(slo_l95: float, devices: int) -> int:
    experiment = Experiment(Ks=(8,), cost=FixedCost(0.5), lead=1.5, policies=("baseline",),
                            updates="poisson:0.2", duration=30.0,
                            serving=ServingConfig(pools=(("dit", devices),), start="staggered"))
    query = CapacityQuery(experiment, SLO(slo_l95, 0.1), max_streams=12, min_seeds=3,
                          max_seeds=6)
    return search_capacity(query).max_streams


@settings(max_examples=6, deadline=None)
@given(slo=st.floats(3.0, 6.0), extra=st.floats(0.0, 2.0))
def test_capacity_is_monotone_in_the_slo(slo, extra):
    assert _capacity(slo, 1) <= _capacity(slo + extra, 1)


@settings(max_examples=4, deadline=None)
@given(slo=st.floats(3.0, 6.0))
def test_capacity_is_monotone_in_the_pool_size(slo):
    assert _capacity(slo, 1) <= _capacity(slo, 2)


def _auto_capacity(policy: str, cost: float, rate: float, devices: int) -> int:
    experiment = Experiment(Ks=(8,), cost=FixedCost(cost), lead="auto", policies=(policy,),
                            updates=f"poisson:{rate}", duration=30.0,
                            serving=ServingConfig(pools=(("dit", devices),), start="random"))
    query = CapacityQuery(experiment, SLO(100.0, 0.5), max_streams=16, min_seeds=3,
                          max_seeds=6)
    return search_capacity(query).max_streams


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(policy=st.sampled_from(["baseline", "speculative"]), cost=st.floats(0.3, 0.8),
       cheaper=st.floats(0.6, 0.9), rate=st.sampled_from([0.1, 0.3]),
       devices=st.integers(1, 2))
def test_capacity_under_the_auto_lead_never_falls_with_a_cheaper_c_or_fewer_updates(
        policy, cost, cheaper, rate, devices):
    """The trust issue's properties beyond the SLO and the pool: a cheaper C, fewer updates
    or one more device never lower the answer by more than one stream (each is another
    workload, judged on its own replications at 95 % confidence)."""
    held = _auto_capacity(policy, cost, rate, devices)
    assert _auto_capacity(policy, cost * cheaper, rate, devices) >= held - 1
    assert _auto_capacity(policy, cost, rate / 2, devices) >= held - 1
    assert _auto_capacity(policy, cost, rate, devices + 1) >= held


def _seeded_capacity(seed: int, max_streams: int = 64) -> int:
    """Speculative streams of C = 0.5 s every 2 s on two devices under --lead auto, at a
    stall limit of 0.1 %: the answer sits where the pilot's lead decides it."""
    experiment = Experiment(Ks=(8,), cost=FixedCost(0.5), lead="auto",
                            policies=("speculative",), updates="poisson:0.1", duration=60.0,
                            seed=seed, serving=ServingConfig(pools=(("dit", 2),),
                                                             start="random"))
    return search_capacity(CapacityQuery(experiment, SLO(100.0, 0.1),
                                         max_streams=max_streams)).max_streams


@pytest.mark.slow
def test_a_capacity_answer_holds_at_fresh_seeds_and_one_more_stream_does_not(monkeypatch):
    """The answer counts the pilot's variation: root seeds 0 to 3 all answer 6 (with one
    pilot's lead for every replication, seed 3 answered 7, which fails at every fresh
    seed), and at fresh root seeds 6 streams still meet the limit while 7 do not."""
    monkeypatch.setenv("LATSIM_CACHE_DIR", "off")
    answers = [_seeded_capacity(seed) for seed in range(4)]
    assert answers == [answers[0]] * 4, answers
    for seed in (100, 101):
        assert _seeded_capacity(seed, answers[0] + 1) == answers[0]


def test_a_dit_task_on_a_parallel_group_occupies_every_device_of_it(tmp_path):
    table = tmp_path / "usp.json"
    table.write_text('{"degrees": {"1": {"8": 1.2}, "4": {"8": 0.4}}}')
    result = invoke("simulate", "--K", "8", "--cost", f"usp:{table}", "--pools", "dit=8",
                    "--dit-degree", "4", "--streams", "4", "--start", "together", "--lead",
                    "1.9", "--policy", "baseline", "--duration", "30", "--seeds", "2", "--json")
    assert result.exit_code == 0, result.stderr
    row = row_of(result.stdout)
    assert row["cost"] == f"usp:{table}@4" and row["C_mean"] == 0.4
    busy = row["busy_pct_by_device"]["dit"]
    assert len(busy) == 8
    # the four devices of a group are busy together; four streams of 0.4 s per T = 2 s
    # use 80 % of two groups' time in all (a little less: the window's first refill is late)
    assert busy[0:4] == [busy[0]] * 4 and busy[4:8] == [busy[4]] * 4
    assert 0.7 * 80 < (busy[0] + busy[4]) <= 80 + 1e-9
    for args, message in ((("--cost", f"usp:{table}@2"), "no table for parallel degree 2"),
                          (("--cost", f"usp:{table}", "--dit-degree", "3"), "multiple")):
        bad = invoke("simulate", "--K", "8", "--pools", "dit=8", "--duration", "10", *args)
        assert bad.exit_code == 2 and message in bad.stderr, bad.stderr


def test_a_capacity_search_stopped_by_its_work_bound_keeps_what_it_measured(tmp_path):
    args = ["capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95", "3.0",
            "--lead", "1.5", "--duration", "20", "--max-streams", "8", "--out", str(tmp_path)]
    # a stream-run covers (20 s + drain 20.25 s) / δ = 161 slots: one evaluation of 8
    # streams x 5 runs (6,440) fits the bound, the whole search (capacity 3) does not
    result = invoke(*args, "--max-events", "6500")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("latsim: error")]
    assert len(errors) == 1 and "--max-events" in errors[0]  # after one progress line per N
    kept = json.loads((tmp_path / "capacity.json").read_text())
    assert kept["status"].startswith("stopped:") and kept["max_streams"] is None
    assert kept["rows"] and kept["largest_meeting_so_far"] >= 1


def test_plot_timeline_draws_one_stream_of_a_serving_folder(tmp_path):
    result = invoke("simulate", "--K", "8", "--C", "0.4", "--streams", "3", "--duration", "20",
                    "--seeds", "1", "--lead", "1.2", "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    from latsim.viz.timeline import select_run

    data = select_run(tmp_path, policy="speculative", stream=2)
    slots = pd.read_csv(tmp_path / "slots.csv")
    own = slots[(slots["policy"] == "speculative") & (slots["run"] == 0) & (slots["stream"] == 2)]
    assert len(data.slots) == len(own)  # one stream's slots, not all three
    drawn = invoke("plot", "timeline", str(tmp_path), "--stream", "1", "--out",
                   str(tmp_path / "t.png"))
    assert drawn.exit_code == 0, drawn.stderr
    assert (tmp_path / "t.png").stat().st_size > 0


@pytest.mark.slow  # 7 s or more on 2 cores
def test_capacity_grows_with_devices_under_the_auto_lead():
    """The engine issue's repro: with a loose L95, speculative streams under ``--lead auto``
    on two devices were 3, as on one (the pilot run's 0.99 wait quantile missed the rare
    long waits there: 0.104 % stall at 4 streams). The stall-targeted wait budget holds
    for G devices too (3, 6, 9 and 13 streams on 1 to 4 devices)."""
    held = []
    for devices in (1, 2, 3):
        result = invoke("capacity", "--K", "8", "--C", "0.5", "--slo-stall", "0.1",
                        "--slo-l95", "100", "--pools", f"dit={devices}", "--json")
        assert result.exit_code == 0, result.stderr
        held.append(json.loads(result.stdout)["max_streams"])
    one, two, three = held
    assert one < two < three, held
    assert two >= 2 * one - 1 and three >= 3 * one - 2, held  # about in proportion


def test_a_serving_run_past_one_device_load_says_the_stall_target_cannot_be_met():
    """Refills alone at ρ = 1.2 on the busiest device: the row carries ``refill_rho`` and
    the table says no lead keeps the stall target (as ``fleet`` does); at ρ = 0.6, not."""
    from typer.testing import CliRunner

    from latsim.cli.root import app
    from tests.helpers import rows_of

    args = ["simulate", "--K", "8", "--streams", "4", "--pools", "dit=1", "--duration", "20",
            "--seeds", "1", "--lead", "cost"]
    runner = CliRunner()
    over = runner.invoke(app, [*args, "--C", "0.6"], env={"COLUMNS": "200"})
    assert over.exit_code == 0, over.stderr
    assert ("K=8: the busiest DiT device is at ρ = 1.20 from refills alone: no lead keeps "
            "the stall target there" in over.stdout)
    under = runner.invoke(app, [*args, "--C", "0.3", "--json"])
    assert [row["refill_rho"] for row in rows_of(under.stdout)] == [0.6, 0.6]
    assert "busiest DiT device" not in runner.invoke(app, [*args, "--C", "0.3"]).stdout
