"""The spec mini-language's one reader (latsim/plugins/spec.py): every prefix that takes a
number refuses one written in other digits than ASCII ("١" is 1.0 to float()), wherever the
number stands, and reads the ASCII one."""

from __future__ import annotations

import re

import pytest

from latsim.errors import LatsimError
from latsim.model.arrivals import parse_updates
from latsim.model.serving import parse_batch, parse_pools
from latsim.model.workload import parse_activity, parse_arrivals, parse_duration
from latsim.plugins import available, load_cost

#: A valid spec per number-taking prefix, by parser. Prefixes that take a path alone
#: (table:, sdvg:) have no number to write; usp: has its degree.
COST_EXAMPLES = {
    "fixed": "fixed:0.5", "affine": "affine:0.1,0.05", "lognormal": "lognormal:0.5,0.2",
    "draftverify": "draftverify:0.01,0.1,2", "waveforcing": "waveforcing:0.1,3,0.2",
}
PATH_ONLY = {"table", "sdvg", "usp"}
OTHER_EXAMPLES = [
    (parse_updates, "poisson:0.1"), (parse_updates, "bernoulli:0.5"),
    (parse_arrivals, "poisson:0.5"), (parse_arrivals, "mmpp:0.1,0.5,60,30"),
    (parse_arrivals, "population:3"), (parse_duration, "fixed:60"),
    (parse_duration, "exponential:60"), (parse_duration, "lognormal:60,1"),
    (parse_duration, "pareto:60,2"), (parse_activity, "active_idle:10,5"),
    (parse_pools, "dit=2,vae=1"), (parse_batch, "affine:0.1,0.05;max=4"),
]
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


def _each_number_in_other_digits(spec: str) -> list[str]:
    """``spec`` once per number in it, that number's digits Arabic-Indic."""
    out = []
    for match in re.finditer(r"\d+(\.\d+)?", spec):
        other = match.group().translate(ARABIC_INDIC)
        out.append(spec[:match.start()] + other + spec[match.end():])
    return out


def test_every_registered_cost_prefix_is_covered():
    assert set(available("costs")) <= set(COST_EXAMPLES) | PATH_ONLY


@pytest.mark.parametrize("spec", COST_EXAMPLES.values())
def test_a_cost_spec_reads_ascii_and_refuses_other_digits(spec):
    load_cost(spec)
    for other in _each_number_in_other_digits(spec):
        with pytest.raises(LatsimError, match="not a (whole )?number"):
            load_cost(other)


def test_a_usp_degree_in_other_digits_is_refused():
    with pytest.raises(LatsimError, match="'١' is not a whole number"):
        load_cost("usp:table.json@١")


@pytest.mark.parametrize(("parse", "spec"), OTHER_EXAMPLES,
                         ids=[spec for _, spec in OTHER_EXAMPLES])
def test_other_specs_read_ascii_and_refuse_other_digits(parse, spec):
    parse(spec)
    for other in _each_number_in_other_digits(spec):
        with pytest.raises(LatsimError, match="(not a (whole )?number|integer in)"):
            parse(other)
