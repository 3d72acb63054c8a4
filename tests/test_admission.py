"""The places before hello (harness.serve.admission), driven without a server: the two
bounds hold, and idle connections from a few addresses never keep a newcomer out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.serve.admission import HelloPlaces


def test_the_bounds_and_the_refusals_name_them():
    places: HelloPlaces[int] = HelloPlaces(total=3, per_address=2)
    assert places.admit("a", 1).refused is None
    assert places.admit("a", 2).refused is None
    assert places.admit("a", 3).refused == ("too many connections from a waiting to say "
                                            "hello (2)")
    assert places.admit("b", 4).refused is None
    # full; the largest holder (a: 2) has only one more than c would have: refused
    assert places.admit("b", 5).refused == "too many connections waiting to say hello (3)"
    assert len(places) == 3 and places.evictions == 0
    assert places.release(2) and not places.release(2)
    with pytest.raises(ValueError, match="already holds"):
        places.admit("a", 1)


def test_a_newcomer_takes_the_oldest_place_of_the_largest_holder():
    places: HelloPlaces[str] = HelloPlaces(total=4, per_address=3)
    for key in ("a1", "a2", "a3", "b1"):
        assert places.admit(key[0], key).refused is None
    admission = places.admit("c", "c1")
    assert admission.refused is None and admission.evicted == "a1"
    assert (places.held("a"), places.held("b"), places.held("c")) == (2, 1, 1)
    assert places.admit("d", "d1").evicted == "a2"
    # now every address holds one place, as e would: e waits
    assert places.admit("e", "e1").refused == "too many connections waiting to say hello (4)"
    # a connection the server is acting on (its hello) is not taken
    places2: HelloPlaces[str] = HelloPlaces(total=2, per_address=2)
    places2.admit("a", "a1")
    places2.admit("a", "a2")
    assert places2.admit("b", "b1", lambda key: key != "a1").evicted == "a2"


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 12), per_address=st.integers(1, 12),
       steps=st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans()), max_size=80))
def test_places_are_shared_max_min_fairly(total, per_address, steps):
    """Whatever arrives and leaves: the bounds hold, and an address is refused only at its
    own bound or while no address holds two places more than it does."""
    per_address = min(per_address, total)
    places: HelloPlaces[int] = HelloPlaces(total, per_address)
    held: dict[int, str] = {}
    for key, (address, leave) in enumerate(steps):
        if leave and held:
            gone = min(held)  # the oldest connection says hello or leaves
            assert places.release(gone)
            del held[gone]
            continue
        counts = {a: sum(1 for h in held.values() if h == a) for a in set(held.values())}
        admission = places.admit(address, key)
        if admission.refused is None:
            held[key] = address
            if admission.evicted is not None:
                before = counts[held.pop(admission.evicted)]
                assert before == max(counts.values()) >= counts.get(address, 0) + 2
        else:
            mine = counts.get(address, 0)
            assert mine >= per_address or (
                len(held) >= total and max(counts.values()) <= mine + 1)
        assert len(places) == len(held) <= total
        assert all(places.held(a) == sum(1 for h in held.values() if h == a) <= per_address
                   for a in "abcdefgh")
