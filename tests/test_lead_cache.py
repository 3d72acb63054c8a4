"""``--lead auto``'s pilot answers kept on disk (:mod:`latsim.experiments.lead_cache`).

A repeated run reads the answer instead of running the pilot again, and plans exactly what
the pilot gave; the key is the same in another process; any changed input (a trace edited
under the same path) is a miss; a damaged answer file is a miss and is written anew; a
folder that cannot be written costs nothing but the pilot; ``off`` keeps nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from latsim.experiments import engine, lead_cache
from latsim.experiments.engine import Experiment, clear_auto_leads, plan
from latsim.model.serving import ServingConfig


def _experiment(updates: str = "poisson:0.1") -> Experiment:
    return Experiment(Ks=(8,), cost="fixed:0.45", updates=updates, duration=30.0, seeds=2,
                      serving=ServingConfig(streams=4, pools=(("dit", 1),)))


@pytest.fixture
def pilots(monkeypatch, tmp_path):
    """The cache in a folder of the test's own, and the cells each planning piloted."""
    monkeypatch.setenv(lead_cache.CACHE_ENV, str(tmp_path / "cache"))
    runs: list[list] = []
    answers = engine._auto_lead_answers

    def counted(experiment, cells, **options):
        runs.append(list(cells))
        return answers(experiment, cells, **options)

    monkeypatch.setattr(engine, "_auto_lead_answers", counted)
    clear_auto_leads()
    yield runs
    clear_auto_leads()


def _piloted(runs: list[list]) -> int:
    return sum(len(cells) for cells in runs)


def test_a_repeated_plan_reads_the_pilots_answers_and_plans_the_same(pilots, tmp_path):
    first = plan(_experiment())
    assert _piloted(pilots) == 2  # one pilot per policy
    assert len(list((tmp_path / "cache" / "leads").glob("*.json"))) == 2
    clear_auto_leads()  # as a new process would start
    second = plan(_experiment())
    assert _piloted(pilots) == 2  # none ran again
    assert second.cells == first.cells
    assert second.auto_leads == first.auto_leads


def test_the_key_is_the_same_in_another_process(pilots):
    cell = (8, 0.45, "speculative")
    here = engine._pilot_key(_experiment(), cell)
    code = ("from tests.test_lead_cache import _experiment; "
            "from latsim.experiments import engine; "
            f"print(engine._pilot_key(_experiment(), {cell!r}))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert here is not None and there == here


def test_a_trace_edited_under_the_same_path_is_another_input(pilots, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 1.0}\n{"t": 7.0}\n')
    cell = (8, 0.45, "speculative")
    before = engine._pilot_key(_experiment(f"trace:{trace}"), cell)
    engine._parse_updates.cache_clear()
    trace.write_text('{"t": 1.0}\n{"t": 8.0}\n')
    after = engine._pilot_key(_experiment(f"trace:{trace}"), cell)
    engine._parse_updates.cache_clear()
    assert before != after
    # and the other settings are inputs too
    assert engine._pilot_key(_experiment(), cell) != engine._pilot_key(
        _experiment(), (8, 0.45, "baseline"))
    assert engine._pilot_key(_experiment("poisson:0.2"), cell) != engine._pilot_key(
        _experiment(), cell)


@pytest.mark.parametrize("damage", ["", "{", "[]", '{"format": 1, "wait": -1, "model": "x"}',
                                    '{"format": 1, "wait": NaN, "model": "x"}',
                                    '{"format": 1, "wait": true, "model": "x"}',
                                    '{"format": 99, "wait": 0.1, "model": "x"}'])
def test_a_damaged_answer_is_a_miss_and_is_written_anew(pilots, tmp_path, damage):
    first = plan(_experiment())
    files = sorted((tmp_path / "cache" / "leads").glob("*.json"))
    for path in files:
        path.write_text(damage)
    clear_auto_leads()
    assert plan(_experiment()).cells == first.cells
    assert _piloted(pilots) == 4  # both pilots ran again
    for path in files:
        assert json.loads(path.read_text())["format"] == lead_cache.FORMAT


def test_an_unwritable_folder_or_off_keeps_nothing_and_fails_nothing(pilots, monkeypatch,
                                                                     tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(lead_cache.CACHE_ENV, str(blocker))  # leads/ cannot be made in it
    first = plan(_experiment())
    clear_auto_leads()
    monkeypatch.setenv(lead_cache.CACHE_ENV, "off")
    assert lead_cache.cache_folder() is None
    assert plan(_experiment()).cells == first.cells
    assert _piloted(pilots) == 4
    assert not (tmp_path / "cache").exists()


def test_inputs_that_cannot_be_pickled_are_not_cached():
    assert lead_cache.answer_key(lambda: None) is None
    assert lead_cache.answer_key((1, "a")) == lead_cache.answer_key((1, "a"))
