"""Garbage-collector settings for a process that streams messages.

A pipeline keeps up to a few batches of messages in flight, each message a handful of small
objects (the protocol message, its JetStream view, a delivery, a record). CPython's collector
runs a full collection, which visits every tracked object in the process, whenever the objects
that survived since the last one grow by a quarter. With a hundred thousand messages in flight
and a SparkSession's worth of modules loaded, that was 20-30% of the end-to-end benchmark's
time (``bench e2e``: 2 s of collections in a 6.4 s run), spent finding no garbage: messages
are freed by reference counting as soon as they are acked.

:func:`tune_gc` makes full collections rare and moves what the process holds at that moment
(modules, sessions, configuration) out of the collector's sight with ``gc.freeze()``. Young
collections keep their default pace, so reference cycles made by user code are still found
quickly. It changes process-wide settings, so the library never calls it by itself: the
``headrace`` commands do, and applications opt in (docs/pipelines.md).
"""

from __future__ import annotations

import gc

import attrs

#: Full collections at most once per this many middle-generation collections (CPython's
#: default is 10); with the default thresholds about every seven million allocations.
FULL_EVERY = 1000


@attrs.frozen(slots=True)
class GcSettings:
    """The collector's thresholds (``gc.get_threshold()``), to put back with :func:`restore_gc`."""

    thresholds: tuple[int, ...]


def tune_gc(full_every: int = FULL_EVERY) -> GcSettings:
    """Freeze what the process holds now and make full collections rare; returns the previous
    settings. Call it once set-up is done (sessions started, pipeline built)."""
    if full_every < 1:
        raise ValueError(f"full_every must be at least 1, not {full_every}")
    previous = gc.get_threshold()
    young, middle, old = previous
    gc.freeze()
    gc.set_threshold(young, middle, max(old, full_every))
    return GcSettings(previous)


def restore_gc(settings: GcSettings) -> None:
    """Put the thresholds back and let the collector see the frozen objects again (all of
    them: CPython has one permanent generation, so objects the application froze itself
    before :func:`tune_gc` are unfrozen too)."""
    gc.set_threshold(*settings.thresholds)
    gc.unfreeze()
