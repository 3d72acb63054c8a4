"""``--lead auto``: the serving model's lead plus the wait for a shared device.

Where the nD/D/1 queue holds (fixed C, one FIFO device, N·C < T) the added wait is its
0.99 quantile; elsewhere a pilot run measures it. Checked: the quantile against the
survival function and a hand value, the stall it buys (at most 0.1 % at ρ <= 0.8 over
long runs, where C's quantile alone stalls), the summary naming the lead it chose, and the
capacity of a loose-latency SLO that the lead no longer bounds.
"""

from __future__ import annotations

import numpy as np
import pytest

from latsim.analysis.queueing import periodic_wait_quantile, periodic_wait_survival
from latsim.errors import LatsimError
from latsim.experiments.engine import Experiment, plan, run_experiment
from latsim.model.serving import ServingConfig


@pytest.mark.parametrize(("streams", "ratio"), [(2, 4.0), (3, 4.0), (4, 5.0), (8, 10.0)])
def test_the_wait_quantile_is_where_the_survival_crosses_its_level(streams, ratio):
    q = periodic_wait_quantile(0.99, streams, ratio, 1.0)
    assert periodic_wait_survival(q, streams, ratio, 1.0) <= 0.01 + 1e-12
    assert periodic_wait_survival(q - 1e-6, streams, ratio, 1.0) > 0.01
    assert 0 < q < streams - 1


def test_the_wait_quantile_by_hand_and_at_its_edges():
    # two streams: W = max(0, C − U) with U uniform on [0, T): P(W > x) = (C − x)/T
    assert periodic_wait_quantile(0.99, 2, 2.0, 0.5) == pytest.approx(0.48, abs=1e-8)
    assert periodic_wait_quantile(0.99, 1, 2.0, 0.5) == 0.0  # one stream never waits
    with pytest.raises(LatsimError, match="overload"):
        periodic_wait_quantile(0.99, 4, 2.0, 0.5)
    with pytest.raises(LatsimError, match="quantile level"):
        periodic_wait_quantile(1.0, 2, 2.0, 0.5)


def _shared(streams: int, C: float = 0.5, lead=None, **serving) -> Experiment:  # noqa: N803
    return Experiment(Ks=(8,), cost=f"fixed:{C}", updates="poisson:0.04", lead=lead,
                      duration=1200.0, seeds=4, records="none",
                      serving=ServingConfig(streams=streams, pools=(("dit", 1),), **serving))


def test_the_chosen_lead_is_the_base_plus_each_policys_wait_and_the_summary_says_so():
    p = plan(_shared(3, lead="auto"))
    wait = periodic_wait_quantile(0.99, 3, 2.0, 0.5)
    leads = {cell.policy.name: cell.lead for cell in p.cells}
    assert leads["speculative"] == pytest.approx(0.5 + wait)
    assert dict(p.auto_leads)[8, "speculative"] == (wait, "nD/D/1")
    # the baseline never replans: its evenly staggered phases never collide (a pilot run
    # finds no wait), while random ones start with collisions that its pilot run measures
    assert leads["baseline"] == 0.5
    assert dict(p.auto_leads)[8, "baseline"] == (0.0, "pilot run of 120 s")
    shuffled = plan(_shared(3, lead="auto", start="random"))
    waited, model = dict(shuffled.auto_leads)[8, "baseline"]
    assert model == "pilot run of 120 s" and 0 < waited < 2 * 0.5
    # auto is the serving model's default; cost is C's quantile alone, the single worker's
    assert plan(_shared(3)).cells == p.cells
    assert [c.lead for c in plan(_shared(3, lead="cost")).cells] == [0.5, 0.5]
    assert plan(_shared(3, lead="cost")).auto_leads == ()
    # a cost with a spread has no closed form: a pilot run measures the wait
    pilot = plan(Experiment(Ks=(8,), cost="lognormal:0.5,0.3", updates="poisson:0.04",
                            lead="auto", duration=300.0, seeds=2,
                            serving=ServingConfig(streams=3, pools=(("dit", 1),))))
    waited, model = dict(pilot.auto_leads)[8, "speculative"]
    assert model.startswith("pilot run") and waited > 0


@pytest.mark.slow
@pytest.mark.parametrize("streams", [2, 3])  # ρ = 0.5, 0.75 (C = 0.5 s, T = 2 s)
@pytest.mark.parametrize("start", ["random", "staggered"])
def test_auto_lead_keeps_stalls_under_a_tenth_of_a_percent_where_c_alone_does_not(streams,
                                                                                  start):
    stalls = {}
    for lead in ("cost", "auto"):
        rows = run_experiment(_shared(streams, lead=lead, start=start), jobs=1).rows
        for row in rows:
            stalls[lead, row["policy"]] = row["viewer_stall_pct"]
            if lead == "auto" and row["policy"] == "speculative":
                assert row["lead_model"] == "nD/D/1" and row["lead_wait"] > 0
    # each policy's own lead holds it under a tenth of a percent, the baseline included
    assert stalls["auto", "speculative"] <= 0.1 and stalls["auto", "baseline"] <= 0.1
    assert stalls["cost", "speculative"] > stalls["auto", "speculative"]


def test_lead_auto_is_for_the_serving_model_and_other_words_are_refused():
    with pytest.raises(LatsimError, match="for the serving model"):
        Experiment(Ks=(8,), lead="auto")
    with pytest.raises(LatsimError, match="a number of seconds, auto or cost"):
        Experiment(Ks=(8,), lead="soon", serving=ServingConfig(streams=2))


@pytest.mark.slow
def test_a_loose_latency_slo_is_bounded_by_the_device_not_by_the_lead():
    """L95 <= 10 s and stall <= 0.1 %: at C's quantile alone the second stream's queueing
    stalls, so one stream fits; with the wait in the lead the capacity is N·C < T's 3."""
    from latsim.experiments.capacity import SLO, CapacityQuery, search_capacity

    found = {}
    for lead in ("cost", None):
        experiment = Experiment(Ks=(8,), cost="fixed:0.5", updates="poisson:0.04",
                                policies=("speculative",), lead=lead, duration=600.0,
                                serving=ServingConfig(pools=(("dit", 1),)))
        found[lead] = search_capacity(CapacityQuery(experiment, SLO(10.0, 0.1),
                                                    max_streams=8)).max_streams
    assert found == {"cost": 1, None: 3}  # auto, the serving model's default
    assert np.floor(2.0 / 0.5 - 1e-9) == 3  # N·C < T
