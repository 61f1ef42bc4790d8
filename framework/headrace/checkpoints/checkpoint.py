"""A checkpoint: how far one subscription has processed one entity's stream (Beckett's model).

Checkpoints are per group + subscription + entity stream (``orders.42``). The global stream
consumer raises a checkpoint's ``version`` (the entity's last stream sequence); workers process
it from ``position`` up to ``version`` in order and move ``position`` on. A checkpoint whose
version is ahead of its position is *lagging*: there is work. A worker *reserves* it before
processing (a reservation expires, so a killed worker's checkpoints are recovered); a handler
error puts it into *retry* (retry.py says when), and after the last retry it is *failed* until
an operator retries or skips the failing message.

Values only, no I/O: the KV store (one key per checkpoint, compare-and-set on its revision) is
the caller's. Every transition returns a new checkpoint.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Iterable
from typing import Any

import attrs

from headrace._validators import non_negative
from headrace.checkpoints.retry import GiveUp, Retry
from headrace.errors import HeadraceError


class CheckpointError(HeadraceError):
    """Base of the checkpoint errors."""


class InvalidCheckpoint(CheckpointError, ValueError):
    """A stored checkpoint (or key) that cannot be read back; the message says what is wrong."""


class AlreadyReserved(CheckpointError):
    """Another worker holds an unexpired reservation on the checkpoint."""


class ReservationLost(CheckpointError):
    """A worker's reservation is no longer its own (expired and taken by another host, or
    released by an operator): its checkpoint writes are refused, and its handler should stop
    (its outside effects are fenced by the token it held; docs/checkpoints.md)."""


class CheckpointMoved(CheckpointError):
    """An operator's action named a checkpoint state (its position, or the failure read at
    the start of the command) that it is no longer in: someone acted first, nothing done."""


class Status(enum.StrEnum):
    """Where a checkpoint stands: ``active`` (handling its entity's messages in order),
    ``retry`` (its handler failed; the message is tried again at ``retry_at``), ``failed``
    (retries used up: parked until an operator retries or skips it)."""

    ACTIVE = "active"
    RETRY = "retry"
    FAILED = "failed"


# KV key tokens allow [-/_=a-zA-Z0-9]; anything else in a part (the dots of an entity subject
# included) is written as =XX per UTF-8 byte, so a key splits back into its three parts. Keys
# are escaped and read back for every checkpoint write and watch entry, so both directions take
# whole runs with one regex rather than a character at a time.
_UNSAFE = re.compile(r"[^-_a-zA-Z0-9]+")
_TOKEN = re.compile(r"(?:[-_a-zA-Z0-9]|=[0-9A-F]{2})+")
_ESCAPE = re.compile(rb"=([0-9A-F]{2})")


def _escaped(run: re.Match[str]) -> str:
    return "".join(f"={b:02X}" for b in run.group().encode())


def _escape(part: str) -> str:
    if not part:
        raise ValueError("checkpoint id parts must not be empty")
    return _UNSAFE.sub(_escaped, part)


def _unescape(token: str) -> str:
    if _TOKEN.fullmatch(token) is None:
        if not token:
            raise ValueError("empty token")
        bad = _TOKEN.match(token)
        at = bad.end() if bad else 0
        if token[at] == "=":
            raise ValueError(f"bad escape at {at} in {token!r}")
        raise ValueError(f"{token[at]!r} cannot stand in a checkpoint key token")
    if "=" not in token:
        return token
    return _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), token.encode()).decode()


@attrs.frozen(slots=True, order=True)
class CheckpointId:
    """Which checkpoint: a subscription ``group``, a ``subscription`` in it, and the entity
    ``stream`` (the subject the entity's messages share)."""

    group: str
    subscription: str
    stream: str
    #: The KV key, escaped once, when first asked for: every write of the checkpoint names it
    #: (an id read from a watch entry's key may never need it).
    _key: str | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for name in ("group", "subscription", "stream"):
            if not getattr(self, name):
                raise ValueError(f"checkpoint {name} must not be empty")

    @property
    def key(self) -> str:
        """The KV key: ``<group>.<subscription>.<stream>``, each part escaped."""
        key = self._key
        if key is None:
            key = ".".join(_escape(p) for p in (self.group, self.subscription, self.stream))
            object.__setattr__(self, "_key", key)
        return key

    @classmethod
    def from_key(cls, key: str) -> CheckpointId:
        """The checkpoint a KV key names (:class:`InvalidCheckpoint` if it names none). The
        last 65,536 are remembered: a host reads the key of every change of its group."""
        found = _from_key(key)
        if isinstance(found, InvalidCheckpoint):
            raise found
        return found

    def __str__(self) -> str:
        return f"{self.group}/{self.subscription}/{self.stream}"


@functools.lru_cache(maxsize=1 << 16)
def _from_key(key: str) -> CheckpointId | InvalidCheckpoint:
    parts = key.split(".")
    if len(parts) != 3:
        return InvalidCheckpoint(f"a checkpoint key has three tokens, not {len(parts)}: {key!r}")
    try:
        group, subscription, stream = (_unescape(p) for p in parts)
    except (UnicodeDecodeError, ValueError) as exc:
        return InvalidCheckpoint(f"checkpoint key {key!r}: {exc}")
    return CheckpointId(group, subscription, stream)


#: One encoder for every write (``json.dumps`` with separators makes a new one per call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))

#: A new checkpoint counts its events from the entity's first (typed so for the counts' fields).
_COUNTED_FROM_START: int | None = 0


@attrs.frozen(slots=True)
class Reservation:
    """A worker's claim on a checkpoint until ``expires_at`` (seconds since the epoch)."""

    owner: str
    expires_at: float


@attrs.frozen(slots=True, kw_only=True)
class Checkpoint:
    """One entity's place in one subscription (a KV value): how far the global consumer has
    seen its stream (``version``), how far it was handled (``position``), and whether it is
    active, retrying or failed."""

    id: CheckpointId
    #: The entity's last stream sequence the global consumer has seen.
    version: int = attrs.field(default=0, validator=non_negative)
    #: The last stream sequence processed (0: none).
    position: int = attrs.field(default=0, validator=non_negative)
    status: Status = Status.ACTIVE
    #: In retry: the number of the retry scheduled (1-based); 0 otherwise.
    attempt: int = attrs.field(default=0, validator=non_negative)
    #: In retry: when the retry is due (seconds since the epoch).
    retry_at: float | None = None
    #: The last handler error, as text (type and message).
    error: str | None = None
    #: In retry or failed: the stream sequence of the message that failed.
    failing_seq: int | None = None
    reservation: Reservation | None = None
    #: The fencing token of the latest reservation: raised by each new claim (never by a
    #: renewal), so a stale holder's token is below the current one.
    fence: int = attrs.field(default=0, validator=non_negative)
    #: How many of the entity's events (those of this subscription) the global consumer has
    #: counted up to ``version``, and how many workers have processed up to ``position``;
    #: None when not counted (a checkpoint stored before these were). Fewer processed than
    #: counted once caught up means events went missing from the stream before they were
    #: handled, in the middle of the backlog (not only the last one).
    seen_events: int | None = attrs.field(
        default=_COUNTED_FROM_START, validator=attrs.validators.optional(non_negative)
    )
    processed_events: int | None = attrs.field(
        default=_COUNTED_FROM_START, validator=attrs.validators.optional(non_negative)
    )

    # -- looking at it ----------------------------------------------------------------------

    @property
    def lagging(self) -> bool:
        """Active with messages past its position: a worker should take it."""
        return self.status is Status.ACTIVE and self.version > self.position

    def retry_due(self, now: float) -> bool:
        return self.status is Status.RETRY and self.retry_at is not None and self.retry_at <= now

    def reserved(self, now: float) -> bool:
        """Whether a reservation holds at ``now`` (an expired one does not)."""
        return self.reservation is not None and self.reservation.expires_at > now

    # -- transitions ------------------------------------------------------------------------

    def seen(self, version: int) -> Checkpoint:
        """The global consumer saw the entity's stream at ``version`` (never moves back)."""
        return attrs.evolve(self, version=max(self.version, version))

    def counted(self, seqs: Iterable[int]) -> Checkpoint:
        """The global consumer read these of the entity's events (stream sequences): the
        version is raised to the highest, and those past the version are counted. Applying
        it again (a batch redelivered after its write) counts nothing twice."""
        seqs = list(seqs)
        if not seqs:
            return self
        seen_events = self.seen_events
        if seen_events is not None:
            seen_events += sum(1 for seq in seqs if seq > self.version)
        return attrs.evolve(self, version=max(self.version, *seqs), seen_events=seen_events)

    @property
    def events_missing(self) -> int:
        """Caught up, how many counted events were never processed (gone from the stream
        before a worker read them); 0 when not caught up or not counted."""
        if self.position < self.version or self.seen_events is None:
            return 0
        if self.processed_events is None:
            return 0
        return max(0, self.seen_events - self.processed_events)

    def reserve(self, owner: str, now: float, timeout: float) -> Checkpoint:
        """Claimed by ``owner`` until ``now + timeout``; :class:`AlreadyReserved` when another
        owner's reservation still holds. The same owner renews (same fence); a new claim
        takes the next fencing token."""
        if timeout <= 0:
            raise ValueError(f"reservation timeout must be positive, not {timeout}")
        current = self.reservation
        if current is not None and current.owner != owner and current.expires_at > now:
            raise AlreadyReserved(
                f"checkpoint {self.id} is reserved by {current.owner!r} until {current.expires_at}"
            )
        fence = self.fence if current is not None and current.owner == owner else self.fence + 1
        return attrs.evolve(self, reservation=Reservation(owner, now + timeout), fence=fence)

    def held_by(self, owner: str, fence: int) -> bool:
        """Whether the reservation is still ``owner``'s claim with token ``fence`` (expiry
        aside: an expired claim nobody took over is still the holder's to renew)."""
        current = self.reservation
        return current is not None and current.owner == owner and self.fence == fence

    def release(self) -> Checkpoint:
        return attrs.evolve(self, reservation=None)

    def advanced(self, position: int) -> Checkpoint:
        """Processed up to ``position``: a success, so a checkpoint in retry (or failed and
        retried by hand) is active again."""
        if position < self.position:
            raise ValueError(f"checkpoint {self.id} cannot move back from {self.position}")
        return attrs.evolve(
            self,
            position=position,
            status=Status.ACTIVE,
            attempt=0,
            retry_at=None,
            error=None,
            failing_seq=None,
        )

    def failed(
        self, error: BaseException, decision: Retry | GiveUp, now: float, seq: int | None = None
    ) -> Checkpoint:
        """The handler failed on message ``seq`` (the entity's next after ``position``);
        ``decision`` is the retry policy's for it. The reservation is dropped: the retry may
        run anywhere."""
        text = f"{type(error).__name__}: {error}"
        if isinstance(decision, Retry):
            return attrs.evolve(
                self,
                status=Status.RETRY,
                attempt=decision.attempt,
                retry_at=now + decision.delay,
                error=text,
                failing_seq=seq,
                reservation=None,
            )
        return attrs.evolve(
            self,
            status=Status.FAILED,
            attempt=0,
            retry_at=None,
            error=text,
            failing_seq=seq,
            reservation=None,
        )

    @property
    def failed_retries(self) -> int:
        """Retries that have failed, for the retry policy's next decision."""
        return self.attempt if self.status is Status.RETRY else 0

    def retry_now(self, now: float) -> Checkpoint:
        """An operator's retry: due at once, with a fresh retry budget."""
        return attrs.evolve(self, status=Status.RETRY, attempt=1, retry_at=now, reservation=None)

    def skip(self) -> Checkpoint:
        """An operator's skip: the failing message counts as processed."""
        if self.status is Status.ACTIVE:
            raise CheckpointError(f"checkpoint {self.id} is active: there is nothing to skip")
        if self.failing_seq is None:
            raise CheckpointError(f"checkpoint {self.id} does not say which message failed")
        skipped = self.advanced(max(self.position, self.failing_seq))
        if skipped.lagging and skipped.processed_events is not None:
            # The failing message is one of the counted events: it counts as processed.
            return attrs.evolve(skipped, processed_events=skipped.processed_events + 1)
        return skipped.caught_up_counts()

    def caught_up_counts(self) -> Checkpoint:
        """Caught up: the processed count set to the counted one (events found missing are
        accepted, and counting starts on a checkpoint stored before it was counted)."""
        if self.seen_events is None or self.processed_events is None:
            return attrs.evolve(self, seen_events=0, processed_events=0)
        return attrs.evolve(self, processed_events=self.seen_events)

    # -- stored form --------------------------------------------------------------------------

    def to_json(self) -> bytes:
        state: dict[str, Any] = {
            "version": self.version,
            "position": self.position,
            "status": self.status.value,
        }
        if self.attempt:
            state["attempt"] = self.attempt
        if self.retry_at is not None:
            state["retry_at"] = self.retry_at
        if self.error is not None:
            state["error"] = self.error
        if self.failing_seq is not None:
            state["failing_seq"] = self.failing_seq
        if self.reservation is not None:
            state["reserved_by"] = self.reservation.owner
            state["reserved_until"] = self.reservation.expires_at
        if self.fence:
            state["fence"] = self.fence
        if self.seen_events is not None:
            state["seen_events"] = self.seen_events
        if self.processed_events is not None:
            state["processed_events"] = self.processed_events
        return _COMPACT.encode(state).encode()

    @classmethod
    def from_json(cls, checkpoint_id: CheckpointId, data: bytes) -> Checkpoint:
        where = f"checkpoint {checkpoint_id}"
        try:
            state = json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidCheckpoint(f"{where}: not JSON: {exc}") from exc
        if not isinstance(state, dict):
            raise InvalidCheckpoint(f"{where}: not a JSON object")
        try:
            reservation = None
            if "reserved_by" in state:
                reservation = Reservation(
                    _text(state["reserved_by"]), _number(state["reserved_until"])
                )
            retry_at = state.get("retry_at")
            error = state.get("error")
            failing = state.get("failing_seq")
            return cls(
                id=checkpoint_id,
                version=_int(state["version"]),
                position=_int(state["position"]),
                status=Status(state["status"]),
                attempt=_int(state.get("attempt", 0)),
                retry_at=None if retry_at is None else _number(retry_at),
                error=None if error is None else _text(error),
                failing_seq=None if failing is None else _int(failing),
                reservation=reservation,
                fence=_int(state.get("fence", 0)),
                seen_events=_optional_int(state.get("seen_events")),
                processed_events=_optional_int(state.get("processed_events")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidCheckpoint(f"{where}: {type(exc).__name__}: {exc}") from exc


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value
