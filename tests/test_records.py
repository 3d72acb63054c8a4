"""Records survive a CSV round trip exactly (floats are written with repr)."""

from __future__ import annotations

import math
from dataclasses import astuple

from latsim.controller.policies import SPECULATIVE
from latsim.controller.records import RECORD_TYPES, read_csv, write_csv
from latsim.controller.timing import Timing
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
