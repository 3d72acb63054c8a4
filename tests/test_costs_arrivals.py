"""Cost models and arrival processes: parsing, moments and determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.arrivals import parse_updates
from latsim.model.costs import (
    AffineCost,
    FixedCost,
    LognormalCost,
    load_table,
)
from latsim.model.lead import SIMULATED
from latsim.plugins import load_cost

Z = 4.0


def test_specs_parse_to_the_right_models():
    assert load_cost("fixed:1.5") == FixedCost(1.5)
    assert load_cost("affine:0.1,0.2").mean(4) == pytest.approx(0.9)
    assert load_cost("lognormal:1,0.5") == LognormalCost(1.0, 0.5)
    assert SIMULATED.from_cost(FixedCost(0.7), 8) == 0.7
    assert SIMULATED.from_cost(AffineCost(0.1, 0.2), 4) == pytest.approx(0.9)


def test_lognormal_mean_and_quantile_match_samples():
    model = LognormalCost(0.8, 0.4)
    rng = np.random.default_rng(3)
    draws = np.array([model.sample(4, rng) for _ in range(20000)])
    assert abs(draws.mean() - 0.8) < Z * draws.std(ddof=1) / math.sqrt(draws.size)
    q99 = model.quantile(4, 0.99)
    # the share of draws above the 0.99 quantile is binomial(n, 0.01)
    share = (draws > q99).mean()
    assert abs(share - 0.01) < Z * math.sqrt(0.01 * 0.99 / draws.size)


def test_json_table_with_samples_kinds_and_interpolation(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"costs": {"2": 0.2, "8": {"refill": [0.5, 0.7], "replan": [0.9]}}}')
    table = load_table(path)
    assert table.mean(2) == 0.2 and table.mean(8) == pytest.approx(0.6)
    assert table.mean(5) == pytest.approx(0.4)  # linear between K=2 and K=8
    rng = np.random.default_rng(0)
    assert {table.sample(8, rng) for _ in range(50)} == {0.5, 0.7}
    assert table.sample(8, rng, kind="replan") == 0.9
    assert table.quantile(8, 0.99) == 0.9  # the lead covers the replan rows too
    assert not table.deterministic
    with pytest.raises(LatsimError, match="outside the cost table's range"):
        table.mean(9)


def test_table_with_different_refill_and_replan_costs_is_not_fixed(tmp_path):
    """One value per kind is still two job times: no closed form, and the lead must cover
    the replan, which the controller plans as far ahead as a refill."""
    path = tmp_path / "kinds.json"
    path.write_text('{"4": 0.3, "8": {"refill": 0.5, "replan": 1.2}}')
    table = load_table(path)
    assert table.mean(8) == 0.5
    assert not table.deterministic
    assert table.quantile(8, 0.99) == 1.2
    assert SIMULATED.from_cost(table, 8) == 1.2
    assert table.quantile(6, 0.99) == pytest.approx(0.4)  # between rows: every draw


def test_table_is_deterministic_when_every_kind_has_the_same_single_value(tmp_path):
    path = tmp_path / "same.json"
    path.write_text('{"4": 0.3, "8": {"refill": [0.5, 0.5], "replan": 0.5}}')
    table = load_table(path)
    assert table.deterministic
    assert table.quantile(8, 0.99) == 0.5 == table.mean(8)


def test_table_quantile_is_the_largest_per_kind_quantile_not_the_pooled_one(tmp_path):
    """199 refill samples and one replan sample: the pooled 0.99 quantile is a refill time,
    which would leave every replan late; the per-kind maximum is the replan's."""
    path = tmp_path / "profile.csv"
    rows = "".join(f"8,0.5{i % 10},refill\n" for i in range(199))
    path.write_text("K,C,kind\n" + rows + "8,1.2,replan\n")
    table = load_table(path)
    pooled = float(np.quantile([c for rows in table.samples.values() for c in rows], 0.99,
                               method="higher"))
    assert pooled < 0.6
    assert table.quantile(8, 0.99) == 1.2
    assert table.quantile(8, 0.5) == 1.2  # the replan's median is its only sample


def test_table_k_without_refill_rows_is_an_error(tmp_path):
    path = tmp_path / "replan_only.json"
    path.write_text('{"4": 0.3, "8": {"replan": 1.2}}')
    with pytest.raises(LatsimError, match="K=8 has rows for another job kind but no refill"):
        load_table(path)


def test_csv_table(tmp_path):
    path = tmp_path / "costs.csv"
    path.write_text("K,C,kind\n4,0.30,refill\n4,0.34,refill\n4,0.5,replan\n")
    table = load_cost(f"table:{path}")
    assert table.mean(4) == pytest.approx(0.32)
    bad = tmp_path / "bad.csv"
    bad.write_text("K,C\n4,abc\n")
    with pytest.raises(LatsimError, match="line 2"):
        load_table(bad)


@pytest.mark.parametrize("spec", ["fixed:-1", "lognormal:0,1", "lognormal:1,-1", "fixed:nan"])
def test_invalid_cost_values(spec):
    with pytest.raises(LatsimError):
        load_cost(spec)


def test_bernoulli_and_poisson_counts_match_their_rates():
    timing = Timing(4, 4, 16.0)
    duration = 2000.0
    p = 0.05
    trace = parse_updates(f"bernoulli:{p}").trace(0, np.random.default_rng(1), duration, timing)
    n_slots = duration / timing.delta
    assert abs(len(trace.times) - p * n_slots) < Z * math.sqrt(n_slots * p * (1 - p))
    slots = np.floor(np.array(trace.times) / timing.delta)
    assert len(set(slots)) == len(slots)  # at most one arrival per slot
    rate = 0.3
    trace = parse_updates(f"poisson:{rate}").trace(0, np.random.default_rng(2), duration, timing)
    assert abs(len(trace.times) - rate * duration) < Z * math.sqrt(rate * duration)
    assert all(0 <= t < duration for t in trace.times)


def test_arrivals_are_a_function_of_the_generator_only():
    timing = Timing(4, 4, 16.0)
    source = parse_updates("poisson:1")
    first = source.trace(0, np.random.default_rng(9), 50.0, timing)
    assert first == source.trace(0, np.random.default_rng(9), 50.0, timing)
    assert first != source.trace(0, np.random.default_rng(10), 50.0, timing)


def test_trace_folder_replays_every_file(tmp_path):
    for name, times in (("a", [1.0, 2.0]), ("b", [3.0])):
        (tmp_path / f"{name}.jsonl").write_text("".join(f'{{"t": {t}}}\n' for t in times))
    source = parse_updates(f"traces:{tmp_path}")
    assert source.replications(None) == 2 and source.replications(3) == 6
    timing = Timing(4, 4, 16.0)
    traces = [source.trace(i, np.random.default_rng(), 10.0, timing) for i in range(2)]
    assert [t.times for t in traces] == [(1.0, 2.0), (3.0,)]


# ---------------------------------------------------------------- bounded inputs


@pytest.mark.parametrize("spec, message", [
    ("fixed:1e308", "<= 86400"),
    ("fixed:86401", "<= 86400"),
    ("affine:1e308,0", "<= 86400"),
    ("affine:0,inf", "not a finite number"),
    ("lognormal:1e308,1", "lognormal mean must be > 0 and <= 86400"),
    ("lognormal:1,101", "lognormal CV must be >= 0 and <= 100"),
    ("fixed:" + "9" * 5000, "not a finite number"),
    ("fixed:" + "x" * 500, "not a number"),
])
def test_cost_values_are_bounded(spec, message):
    with pytest.raises(LatsimError, match=message) as info:
        load_cost(spec)
    assert len(str(info.value)) < 200  # a long spec is cut in the message


@pytest.mark.parametrize("name, text, message", [
    ("huge_int.json", '{"4": ' + "1" * 5000 + "}", "not usable JSON"),
    ("big_int.json", '{"4": ' + "1" * 400 + "}", "K and C must be numbers"),
    ("deep.json", "[" * 100_000, "not usable JSON"),
    ("big_k.json", '{"100000": 0.5}', "K must be a positive integer <= 4096"),
    ("overflow.json", '{"4": 1e999}', "<= 86400"),
    ("field.csv", "K,C\n4," + "1" * 200_000 + "\n", "not a readable CSV table"),
    ("kind.csv", "K,C,kind\n4,0.5," + "z" * 300 + "\n", "job kind must be refill or replan"),
    ("extra.csv", "K,C\n4,0.5,9\n", "line 2: more cells than the header's 2 columns"),
    ("digits.csv", "K,C\n\u0668,0.5\n", "K and C must be numbers"),
    ("digits_c.csv", "K,C\n8,\u0660.5\n", "K and C must be numbers"),
    ("digits.json", '{"\u0668": 0.5}', "K and C must be numbers"),
    ("bool.json", '{"8": true}', "K and C must be numbers"),
    ("binary.json", b"\xff\xfe\x00", "cannot read cost table"),
])
def test_malformed_tables_are_one_line_errors(tmp_path, name, text, message):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(LatsimError, match=message) as info:
        load_table(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_table_from_an_endless_device_is_refused_not_read_forever():
    with pytest.raises(LatsimError, match="larger than"):
        load_table("/dev/zero")


def test_update_sources_check_the_window_and_count_conditions(tmp_path):
    timing = Timing(4, 4, 16.0)
    assert parse_updates("poisson:0.5").mean_conditions(60, timing) == 30
    assert parse_updates("bernoulli:0.1").mean_conditions(60, timing) == pytest.approx(24)
    with pytest.raises(LatsimError, match="at most"):
        parse_updates("poisson:1e5").check(60.0)
    (tmp_path / "a.jsonl").write_text('{"t": 1}\n{"t": 2}\n{"t": 70}\n')
    (tmp_path / "b.jsonl").write_text('{"meta": {"duration": 90}}\n{"t": 80}\n')
    source = parse_updates(f"traces:{tmp_path}")
    assert source.mean_conditions(60, timing) == 1.0  # (2 + 0) / 2 in [0, 60)
    source.check(60.0, duration_given=True)  # the user's window: later ones left out
    with pytest.raises(LatsimError, match=r"a\.jsonl: t=70 is beyond the 60 s run"):
        source.check(60.0, duration_given=False)
    with pytest.raises(LatsimError, match="none of the 2 traces has a condition in"):
        source.check(0.5)


def test_update_spec_text_is_quoted_and_cut():
    with pytest.raises(LatsimError) as info:
        parse_updates("poisson:" + "z" * 1000)
    assert "not a number" in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(LatsimError, match="cannot read"):
        parse_updates("trace:bad\x00name")


def test_one_quantile_function_owns_both_rules():
    """:func:`latsim.numeric.empirical_quantile`: INTERPOLATED is numpy's percentile (every
    reported L, cost and gap percentile, bit for bit); OBSERVED is the order statistic at
    rank ceil((n - 1) q), a value of the sample (leads and cost-model quantiles)."""
    import math

    from latsim.analysis.latency import percentile
    from latsim.model.lead import LIVE
    from latsim.numeric import OBSERVED, empirical_quantile

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 1001):
        data = rng.lognormal(-1.0, 0.8, n)
        for level in (0, 1, 50, 95, 99, 99.9, 100):
            assert empirical_quantile(data, level / 100) == float(np.percentile(data, level))
            assert percentile(data, level) == float(np.percentile(data, level))
            ordered = sorted(data.tolist())
            observed = ordered[min(n - 1, math.ceil(level / 100 * (n - 1)))]
            assert empirical_quantile(data, level / 100, OBSERVED) == observed
        assert LIVE.sample_quantile(list(data)) == empirical_quantile(data, 0.99, OBSERVED)
    assert percentile([], 95) is None
    with pytest.raises(ValueError, match="empty"):
        empirical_quantile([], 0.5)


def test_a_runs_measured_cost_plans_with_the_tables_quantile_rule():
    """``latsim compare``'s cost model of a run's own jobs draws as a cost table of the
    same samples does, and its quantile is the table's: the largest of the kinds' observed
    quantiles (it was numpy's interpolated one, a time no job took)."""
    from latsim.analysis.compare import JobSample, MeasuredCost
    from latsim.model.costs import TableCost

    refills = (0.50, 0.51, 0.55, 0.70)
    replans = (0.60, 0.90)
    measured = MeasuredCost("jobs.csv", {
        "refill": tuple(JobSample("refill", c, 0.0, c) for c in refills),
        "replan": tuple(JobSample("replan", c, 0.0, c) for c in replans)})
    table = TableCost("table.json", {(8, "refill"): refills, (8, "replan"): replans})
    for level in (0.5, 0.9, 0.99):
        assert measured.quantile(8, level) == table.quantile(8, level)
        assert measured.quantile(8, level) in refills + replans
