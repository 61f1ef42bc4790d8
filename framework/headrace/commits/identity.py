"""Who is who in the commit protocol: a stream's identity, an attempt's token, a worker.

- A stream's name is not its identity: a stream deleted and created again under the same name
  starts its sequences at 1 again. :class:`StreamIdentity` adds the creation time the server
  reports in stream info, which a new stream never shares with the old one.
- An :class:`Attempt` is one try at committing records: its token names the files it stages
  (so two attempts never clash, in one process or across hosts) and carries the time it
  started, which lets any worker tell an attempt that can no longer commit from one that still
  may (state.py, the horizon).
- A worker is one process writing an output. Its id is random for each process (a container
  restarted under a new host name, or the same host running many workers, changes nothing),
  optionally prefixed by ``HEADRACE_WORKER_NAME`` to be recognisable in the state.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import secrets
import time

import attrs

#: A token's shape: ``<batch id>.<start, ms since the epoch, 11 hex digits><8 hex digits>``.
_TOKEN = re.compile(
    r"^(?P<batch>[A-Za-z0-9_+-]{1,100})\.(?P<ms>[0-9a-f]{11})(?P<nonce>[0-9a-f]{8})$"
)
_BATCH = re.compile(r"^[A-Za-z0-9_+-]{1,100}$")
_WORKER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


def iso(moment: dt.datetime) -> str:
    """A creation time as the state records it (UTC, microseconds)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@attrs.frozen(slots=True)
class StreamIdentity:
    """A stream: its name and when it was created (ISO 8601, UTC)."""

    name: str
    created: str

    @classmethod
    def of(cls, name: str, created: dt.datetime | None) -> StreamIdentity:
        if created is None:
            raise ValueError(f"stream {name!r}: the server reported no creation time")
        return cls(name, iso(created))


def now_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen(slots=True)
class Attempt:
    """One try at committing records (see the module docs)."""

    #: A file-name-safe id of what it holds (the batch's sequence ranges, or a hash of them).
    batch: str
    #: When it started, in milliseconds since the epoch (this worker's clock).
    started: int
    nonce: str = attrs.field(factory=lambda: secrets.token_hex(4))

    @classmethod
    def new(cls, batch: str) -> Attempt:
        """A new attempt at ``batch`` (a file-name-safe id: see :meth:`of_batch`)."""
        return cls(batch, now_ms())

    @classmethod
    def of_batch(cls, key: str) -> Attempt:
        """A new attempt at the batch ``key`` (``ORDERS-1-100``): the key itself names its
        files when it is short and plain, so that they say which sequences they hold; else a
        hash of it does."""
        if not _BATCH.match(key):
            key = "h" + hashlib.sha256(key.encode()).hexdigest()[:32]
        return cls.new(key)

    @property
    def token(self) -> str:
        return f"{self.batch}.{self.started:011x}{self.nonce}"

    @classmethod
    def parse(cls, token: str) -> Attempt | None:
        """The attempt a token names, or None for a name that is not a token."""
        found = _TOKEN.match(token)
        if found is None:
            return None
        return cls(found["batch"], int(found["ms"], 16), found["nonce"])

    def __str__(self) -> str:
        return self.token


def new_worker_id() -> str:
    """A new worker id (see the module docs); ``HEADRACE_WORKER_NAME`` must be made of letters,
    digits, ``_``, ``.`` and ``-`` (at most 40)."""
    name = os.environ.get("HEADRACE_WORKER_NAME", "")
    if name and not _WORKER_NAME.match(name):
        raise ValueError(
            f"HEADRACE_WORKER_NAME={name!r}: use at most 40 letters, digits, '_', '.' or '-'"
        )
    suffix = secrets.token_hex(6)
    return f"{name}-{suffix}" if name else f"w-{suffix}"
