"""``tune_gc``: full collections become rare and what the process holds is frozen out of the
collector's sight; ``restore_gc`` puts both back. Young collections keep their pace, so a
reference cycle made while tuned is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from headrace.pipeline import GcSettings, restore_gc, tune_gc
from headrace.pipeline.gc_tuning import FULL_EVERY


@pytest.fixture
def untouched() -> Iterator[tuple[int, ...]]:
    """The test process's settings, put back whatever the test does."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)
    gc.unfreeze()


def test_tune_and_restore(untouched: tuple[int, ...]) -> None:
    young, middle, old = untouched
    settings = tune_gc()
    assert settings == GcSettings(untouched)
    assert gc.get_threshold() == (young, middle, max(old, FULL_EVERY))
    assert gc.get_freeze_count() > 0
    restore_gc(settings)
    assert gc.get_threshold() == untouched
    assert gc.get_freeze_count() == 0


def test_cycles_made_while_tuned_are_still_collected(untouched: tuple[int, ...]) -> None:
    class Node:
        other: object = None

    settings = tune_gc(full_every=10_000)
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        # No explicit collect: allocating past the young threshold must trigger the young
        # collection that frees the cycle, as it would without tune_gc.
        young = gc.get_threshold()[0]
        kept = [[] for _ in range(4 * young)]
        assert gone() is None
        del kept
    finally:
        restore_gc(settings)


def test_full_every_must_be_positive(untouched: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="full_every must be at least 1, not 0"):
        tune_gc(full_every=0)
    assert gc.get_threshold() == untouched  # refused before changing anything
