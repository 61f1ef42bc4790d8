"""The commit state's bitmasks (seqbits.py) against plain sets: a SeqSet to a mask above a base
and back, the run of set bits from the bottom, the stored form; and the fragmented sets that
several workers' interleaved batches make, which is why the state keeps bitmasks."""

from __future__ import annotations

import pytest
from headrace.commits import SeqSet
from headrace.commits.seqbits import decode, encode, mask_of, seqset_of, trailing_ones
from hypothesis import given
from hypothesis import strategies as st

members = st.sets(st.integers(1, 400), max_size=120)


@given(members, st.integers(0, 420))
def test_mask_of_keeps_what_is_at_or_above_the_base(model: set[int], base: int) -> None:
    mask = mask_of(SeqSet.of(model), base)
    assert {base + i for i in range(mask.bit_length()) if mask >> i & 1} == {
        n for n in model if n >= base
    }
    assert seqset_of(mask, base) == SeqSet.of(n for n in model if n >= base)


@given(members)
def test_union_and_intersection_are_the_masks_or_and_and(model: set[int]) -> None:
    other = {n * 3 % 401 for n in model}
    a, b = mask_of(SeqSet.of(model), 1), mask_of(SeqSet.of(other), 1)
    assert seqset_of(a | b, 1) == SeqSet.of(model | other)
    assert seqset_of(a & b, 1) == SeqSet.of(model & other)


@given(st.integers(0, 200), st.integers(0, 200))
def test_trailing_ones(run: int, gap: int) -> None:
    mask = ((1 << run) - 1) | (1 << (run + 1 + gap))
    assert trailing_ones(mask) == run
    assert trailing_ones((1 << run) - 1) == run


@given(members)
def test_the_stored_form_round_trips(model: set[int]) -> None:
    mask = mask_of(SeqSet.of(model), 1)
    text = encode(mask)
    assert decode(text) == mask
    assert (text == "") is (mask == 0)


@pytest.mark.parametrize("bad", ["!!", "AAAA", "eJw"])
def test_a_stored_form_that_is_not_one(bad: str) -> None:
    with pytest.raises(ValueError, match="not an encoded bitmask"):
        decode(bad)


def test_interleaved_batches_stay_small() -> None:
    """Eight workers each committing every eighth of 800,000 sequences (a pull consumer hands
    messages to the workers' pull requests in turn): as intervals 100,000 per worker; as the
    stored bitmask a few hundred bytes, whatever the pattern."""
    worker = SeqSet((s, s) for s in range(3, 800_001, 8))
    assert len(worker.intervals) == 100_000
    mask = mask_of(worker, 1)
    assert len(encode(mask)) < 2_000
    assert seqset_of(mask, 1) == worker
