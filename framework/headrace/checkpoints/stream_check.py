"""Whether a stream keeps every event until its checkpoints have handled it.

Checkpoints read an entity's events from the stream when a worker gets to them, long after the
global consumer acked them. A stream that removes a message once its consumers acked it
(interest or work-queue retention) drops every event before a worker reads it: the handler sees
none and the checkpoints look caught up (issue 16: 0 of 10 events handled, no error). Such a
stream is refused at start with :class:`UnsafeStream`.

Limits (``max_age``, ``max_msgs``, ``max_bytes``, ``max_msgs_per_subject`` with the default
discard policy ``old``, and per-message TTLs) drop the oldest events whether handled or not.
They are legitimate on a stream sized for its backlog, so they are warned about, not refused;
an event they drop before it is handled is detected by the worker (the message a checkpoint's
version counts is gone) and parks the checkpoint as failed with :class:`MissingEvents`.
"""

from __future__ import annotations

import warnings

from headrace.checkpoints.checkpoint import CheckpointError
from headrace.errors import HeadraceWarning
from headrace.jetstream import JetStream
from headrace.jetstream.stream_config import DiscardPolicy, RetentionPolicy, StreamConfig


class UnsafeStream(CheckpointError):
    """The stream removes events before checkpoints can handle them (interest or work-queue
    retention): refused when the global consumer starts."""


class MissingEvents(CheckpointError):
    """Events a checkpoint counted are gone from the stream before they were handled (deleted,
    purged, aged out or over a limit): the checkpoint is parked as failed with this as its
    error; an operator's skip accepts the loss."""


class StreamLimitWarning(HeadraceWarning, RuntimeWarning):
    """The stream has a limit that drops events whether they were handled or not."""


def unsafe_retention(config: StreamConfig) -> str | None:
    """Why ``config``'s retention drops events before checkpoints handle them, or None."""
    if config.retention is RetentionPolicy.INTEREST:
        return (
            "interest retention removes a message once every consumer acked it, and the global "
            "consumer acks a batch before workers read its events"
        )
    if config.retention is RetentionPolicy.WORK_QUEUE:
        return (
            "work-queue retention removes a message once it is acked, and the global consumer "
            "acks a batch before workers read its events"
        )
    return None


def dropping_limits(config: StreamConfig) -> list[str]:
    """The limits of ``config`` that drop the oldest events whether handled or not."""
    found: list[str] = []
    if config.discard is not DiscardPolicy.NEW:  # "new" refuses publishes, drops nothing
        for name in ("max_msgs", "max_bytes", "max_msgs_per_subject"):
            value = getattr(config, name)
            if value is not None and value > 0:
                found.append(f"{name}={value}")
    if config.max_age:  # an age limit drops regardless of the discard policy
        found.append(f"max_age={config.max_age:g}s")
    if config.allow_msg_ttl:
        found.append("allow_msg_ttl (per-message TTLs)")
    return found


def check_stream_config(stream: str, config: StreamConfig) -> list[str]:
    """Refuse (:class:`UnsafeStream`) a retention that drops events before they are handled;
    the dropping limits, to be warned about."""
    why = unsafe_retention(config)
    if why is not None:
        raise UnsafeStream(
            f"stream {stream!r} cannot back checkpointed subscriptions: {why}; use limits "
            "retention (the default)"
        )
    return dropping_limits(config)


async def check_stream(js: JetStream, stream: str) -> None:
    """Check ``stream`` on the server: :class:`UnsafeStream` if refused; a
    :class:`StreamLimitWarning` naming the limits that may drop events before they are
    handled (such a loss then fails the checkpoint with :class:`MissingEvents`)."""
    info = await js.stream_info(stream)
    limits = check_stream_config(stream, info.config)
    if limits:
        warnings.warn(
            f"stream {stream!r} drops events whether handled or not ({', '.join(limits)}): "
            "one dropped before a worker reads it fails its checkpoint (MissingEvents); size "
            "the limits for the longest backlog, or use discard=new",
            StreamLimitWarning,
            stacklevel=2,
        )
