"""Records survive a CSV round trip exactly (floats are written with repr)."""

from __future__ import annotations

import math
from dataclasses import astuple

import pytest

from latsim.controller.policies import SPECULATIVE
from latsim.controller.records import RECORD_TYPES, JobRecord
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.run.record_files import read_csv, write_csv
from tests.helpers import run


def same(a, b) -> bool:
    return all(
        (isinstance(x, float) and math.isnan(x) and math.isnan(y)) or x == y
        for x, y in zip(astuple(a), astuple(b), strict=True)
    )


def test_every_record_type_round_trips(tmp_path):
    timing = Timing(8, 4, 16.0)
    records = run(timing, SPECULATIVE, [0.3, 1.1, 1.2, 5.0, 11.9], 12.0, 0.45)
    for table, record_type in RECORD_TYPES.items():
        original = list(getattr(records, table))
        assert original or table == "stalls"
        path = tmp_path / f"{table}.csv"
        write_csv(path, record_type, original, extra=(("policy", "speculative"), ("K", 8)))
        back = read_csv(path, record_type)
        assert [extra for extra, _ in back] == [{"policy": "speculative", "K": "8"}] * len(back)
        assert len(back) == len(original)
        assert all(same(a, b) for a, (_, b) in zip(original, back, strict=True))


def _written(tmp_path):
    timing = Timing(8, 4, 16.0)
    records = run(timing, SPECULATIVE, [0.3, 1.1, 1.2, 5.0, 11.9], 12.0, 0.45)
    path = tmp_path / "jobs.csv"
    write_csv(path, JobRecord, records.jobs, extra=(("policy", "speculative"), ("K", 8)))
    return path, list(records.jobs)


def test_a_torn_last_row_is_dropped_with_a_note(tmp_path):
    """A writer killed mid-row leaves a last line without a line end: dropped and noted."""
    path, jobs = _written(tmp_path)
    with path.open("a", newline="") as handle:
        handle.write("speculative,8,9,refill,4")
    back = read_csv(path, JobRecord)
    assert [job for _, job in back] == jobs
    assert back.torn is not None and f"line {len(jobs) + 2}" in back.torn
    assert "torn" in back.torn and path.name in back.torn


def test_a_whole_file_has_no_note(tmp_path):
    path, jobs = _written(tmp_path)
    back = read_csv(path, JobRecord)
    assert back.torn is None and len(back) == len(jobs)


def test_a_cut_that_happens_to_parse_is_still_torn(tmp_path):
    """``1.25`` cut to ``1.2`` parses: the missing line end, not the value, tells."""
    path, jobs = _written(tmp_path)
    text = path.read_text()
    path.write_text(text[:-3])  # the last row's t_ready loses its last digits and line end
    back = read_csv(path, JobRecord)
    assert back.torn and [job for _, job in back] == jobs[:-1]


@pytest.mark.parametrize("damage, message", [
    (lambda row: "x," + row, "cells where the header has"),
    (lambda row: row.rsplit(",", 1)[0] + ",oops\r\n", "column t_ready: 'oops' is not a valid"),
    (lambda row: row.rsplit(",", 2)[0] + "\r\n", "cells where the header has"),
])
def test_a_bad_middle_row_is_an_error_naming_file_and_line(tmp_path, damage, message):
    path, _ = _written(tmp_path)
    with path.open(newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    lines[2] = damage(lines[2])
    path.write_text("".join(lines), newline="")
    with pytest.raises(LatsimError, match=rf"jobs\.csv:3: .*{message}"):
        read_csv(path, JobRecord)


def test_a_torn_header_reads_as_no_rows(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("policy,K,job_id,ki")
    back = read_csv(path, JobRecord)
    assert back == [] and "header" in back.torn


def test_slot_log_reads_as_a_sequence_of_records_and_pickles_as_columns():
    import pickle

    from latsim.controller.records import SlotLog, SlotRecord, count_slots_before

    rows = [SlotRecord(0, 0, 0, 0.0), SlotRecord(1, 0, 0, 0.25), SlotRecord(2, 1, 3, 0.5),
            SlotRecord(3, 1, 3, 0.75)]
    log = SlotLog(rows[:2])
    log.extend([2, 3], [1, 1], [3, 3], [0.5, 0.75])
    assert len(log) == 4 and list(log) == rows and log == rows and log == tuple(rows)
    assert log[-1] == rows[-1] and log[1:3] == rows[1:3]
    assert log != rows[:3] and log != rows[:3] + [SlotRecord(3, 1, 3, 0.7500001)]
    again = pickle.loads(pickle.dumps(log))
    assert isinstance(again, SlotLog) and again == log and again.t_start == log.t_start
    # counting by columns agrees with counting records, at and between slot starts
    for end in (0.0, 0.25, 0.3, 0.75, 9.0):
        for generated in (False, True):
            assert count_slots_before(log, end, generated) == count_slots_before(
                tuple(rows), end, generated) == sum(
                1 for r in rows if r.t_start < end and (r.job_id > 0 or not generated))


def test_a_record_is_built_as_its_dataclass_would_build_it():
    """``record`` replaces the frozen dataclass's ``__init__`` with one that stores through
    the slots: the same signature (defaults, keywords), the same errors, still frozen."""
    import dataclasses
    import inspect
    import pickle

    from latsim.controller.records import record
    from latsim.run.fleet import SessionRecord

    @dataclasses.dataclass(frozen=True, slots=True)
    class Reference:
        a: int
        b: float = 2.5

    @record
    class Made:
        a: int
        b: float = 2.5

    assert str(inspect.signature(Made)) == str(inspect.signature(Reference))
    assert Made(1) == Made(a=1, b=2.5) != Made(1, 3.0)
    job = JobRecord(3, "refill", 8, 8, 1, 8, 0.5, 0.75)
    assert pickle.loads(pickle.dumps(job)) == job
    with pytest.raises(dataclasses.FrozenInstanceError):
        Made(1).a = 2  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        Made()  # type: ignore[call-arg]
    assert SessionRecord(1, 0.0, 600.0, "served", 0, 0.0, 0.5, 600.0, 1, 0).migrations == 0
    with pytest.raises(TypeError, match="no __post_init__"):
        @record
        class Checked:
            a: int
            b: int

            def __post_init__(self) -> None:
                pass
