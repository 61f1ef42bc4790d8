"""The options of the ``jetstream`` Spark format, read and checked once, on the driver.

Spark hands a data source its options as a case-insensitive mapping of strings. This module
turns them into value types (:class:`ConnectionSpec`, :class:`SourceSpec`, :class:`SinkSpec`)
before any work is planned, so a typo or a malformed value fails the query at once with a
:class:`~headrace_spark.errors.JetStreamOptionError` naming the option, never in a task on an
executor half an hour later. An option nobody reads is refused too: ``maxMessagesPerTriger``
silently doing nothing is worse than an error.

The specs are pickled into Spark's tasks (the executors connect with the same
:class:`ConnectionSpec`). Their ``repr`` hides every secret (passwords, tokens, seeds, the
userinfo of a server URL), since Spark prints a data source's objects in plans and logs.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs

from headrace_spark.errors import JetStreamOptionError

if TYPE_CHECKING:
    from headrace.jetstream import JetStream
    from headrace.nats import Connection

#: The options every use of the format takes: where the server is and how to log in.
CONNECTION_OPTIONS = frozenset(
    {
        "servers",
        "user",
        "password",
        "token",
        "nkey",
        "nkeysecret",
        "creds",
        "tls.ca",
        "tls.cert",
        "tls.key",
        "tls.hostname",
        "domain",
        "apiprefix",
        "connecttimeout",
        "requesttimeout",
    }
)
SOURCE_OPTIONS = frozenset(
    {
        "stream",
        "subjects",
        "startingoffsets",
        "endingoffsets",
        "maxmessagespertrigger",
        "maxbytespertrigger",
        "numpartitions",
        "partitionbytes",
        "failondataloss",
        "fetchbatch",
        "readmethod",
    }
)
SINK_OPTIONS = frozenset(
    {"subject", "maxinflight", "msgidprefix", "msgidcolumn", "publishtimeout", "stream"}
)
#: Options Spark itself adds or reads, which the format ignores.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

_SECRET = "***"


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_known(options: Mapping[str, str], allowed: frozenset[str], what: str) -> None:
    """Refuse an option ``what`` (the source or the sink) does not read."""
    for name in _lower(options):
        if name not in allowed and name not in CONNECTION_OPTIONS and name not in SPARK_OPTIONS:
            raise JetStreamOptionError(
                name, f"unknown option of the jetstream {what} (see docs/spark-streaming.md)"
            )


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower(), "").strip()
    if not value:
        raise JetStreamOptionError(name, "is required")
    return value


def _int(options: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    text = options.get(name.lower())
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise JetStreamOptionError(name, f"must be a whole number, not {text!r}") from None
    if value < minimum:
        raise JetStreamOptionError(name, f"must be at least {minimum}, not {value}")
    return value


def _float(options: Mapping[str, str], name: str) -> float | None:
    text = options.get(name.lower())
    if text is None or text.strip() == "":
        return None
    try:
        value = float(text.strip())
    except ValueError:
        raise JetStreamOptionError(name, f"must be a number of seconds, not {text!r}") from None
    if not value > 0:
        raise JetStreamOptionError(name, f"must be more than 0 seconds, not {text!r}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise JetStreamOptionError(name, f"must be true or false, not {text!r}")


def _list(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


_USERINFO = re.compile(r"//[^/@]*@")


def redact_url(url: str) -> str:
    """``url`` without the user and password it may carry (``nats://u:p@h`` -> ``nats://***@h``)."""
    return _USERINFO.sub(f"//{_SECRET}@", url)


def _nkey(opts: Mapping[str, str]) -> str | None:
    """The NKey seed: inline under ``nkeySecret`` (a name Spark redacts in plans and its UI),
    or a file under ``nkey``. A seed given inline under ``nkey`` is refused: Spark would show
    it in the query plan."""
    path, seed = opts.get("nkey") or None, opts.get("nkeysecret") or None
    if path is not None and seed is not None:
        raise JetStreamOptionError("nkey", "give nkey (a seed file) or nkeySecret, not both")
    if path is not None and path.strip().startswith("SU") and "/" not in path:
        raise JetStreamOptionError(
            "nkey",
            "takes the path of a seed file; an inline seed goes in nkeySecret, which Spark "
            "hides in query plans (it would show this one)",
        )
    return seed or path


# -- the connection -------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True, repr=False)
class ConnectionSpec:
    """How the driver and each task connect: headrace's ``connect()`` options as Spark options.

    ``nkey`` is the seed (the option ``nkeySecret``, which Spark's redaction hides) or the path
    of a file holding one (the option ``nkey``), ``creds`` the path of a ``.creds``
    file; the TLS files are paths that must exist where the task runs (every executor).
    """

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    domain: str | None = None
    api_prefix: str | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 10.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ConnectionSpec:
        opts = _lower(options)
        servers = _list(_required(opts, "servers"))
        for url in servers:
            if "://" not in url and ":" not in url:
                raise JetStreamOptionError(
                    "servers", f"{redact_url(url)!r} is not a URL (nats://host:4222)"
                )
        if "domain" in opts and "apiprefix" in opts:
            raise JetStreamOptionError("domain", "give domain or apiPrefix, not both")
        if "tls.key" in opts and "tls.cert" not in opts:
            raise JetStreamOptionError("tls.key", "needs tls.cert too")
        if "password" in opts and "user" not in opts:
            raise JetStreamOptionError("password", "needs user too")
        return cls(
            servers=servers,
            user=opts.get("user") or None,
            password=opts.get("password") or None,
            token=opts.get("token") or None,
            nkey=_nkey(opts),
            creds=opts.get("creds") or None,
            tls_ca=opts.get("tls.ca") or None,
            tls_cert=opts.get("tls.cert") or None,
            tls_key=opts.get("tls.key") or None,
            tls_hostname=opts.get("tls.hostname") or None,
            domain=opts.get("domain") or None,
            api_prefix=opts.get("apiprefix") or None,
            connect_timeout=_float(opts, "connectTimeout") or 5.0,
            request_timeout=_float(opts, "requestTimeout") or 10.0,
        )

    def __repr__(self) -> str:
        shown = [f"servers={[redact_url(u) for u in self.servers]!r}"]
        for name in ("user", "creds", "tls_ca", "tls_cert", "tls_key", "domain", "api_prefix"):
            value = getattr(self, name)
            if value is not None:
                shown.append(f"{name}={value!r}")
        hidden = [n for n in ("password", "token", "nkey") if getattr(self, n) is not None]
        shown.extend(f"{name}={_SECRET!r}" for name in hidden)
        return f"ConnectionSpec({', '.join(shown)})"

    @property
    def where(self) -> str:
        """The servers, for messages (no credentials)."""
        return ", ".join(redact_url(u) for u in self.servers)

    def connect_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`headrace.nats.connect`."""
        from headrace.nats import TLSConfig

        kwargs: dict[str, Any] = {
            "user": self.user,
            "password": self.password,
            "token": self.token,
            "nkey_seed": self.nkey,
            "creds_file": self.creds,
            "connect_timeout": self.connect_timeout,
            "request_timeout": self.request_timeout,
            # A task is short: fail it (Spark retries it) rather than wait a minute.
            "max_reconnect_attempts": 20,
            "name": "headrace-spark",
        }
        if self.tls_ca or self.tls_cert or self.tls_hostname:
            kwargs["tls"] = TLSConfig(
                ca_file=self.tls_ca,
                cert_file=self.tls_cert,
                key_file=self.tls_key,
                hostname=self.tls_hostname,
            )
        return kwargs

    @asynccontextmanager
    async def open(self) -> AsyncIterator[tuple[Connection, JetStream]]:
        """A connection and its JetStream context, for the ``async with`` block."""
        from headrace.jetstream import JetStream
        from headrace.nats import connect

        async with connect(list(self.servers), **self.connect_kwargs()) as nc:
            yield (
                nc,
                JetStream(
                    nc, domain=self.domain, api_prefix=self.api_prefix, timeout=self.request_timeout
                ),
            )


# -- positions in a stream ------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Earliest:
    """The stream's first message still stored."""


@attrs.frozen(slots=True)
class Latest:
    """After the stream's last message (when the query plans it)."""


@attrs.frozen(slots=True)
class AtSequence:
    """The message with stream sequence ``seq`` (the first after it, if it is gone)."""

    seq: int


@attrs.frozen(slots=True)
class AtTime:
    """The first message stored at or after ``time``."""

    time: dt.datetime


Position = Earliest | Latest | AtSequence | AtTime


def parse_position(name: str, text: str) -> Position:
    """``earliest``, ``latest``, a stream sequence (``1234``) or an ISO 8601 time with a zone
    (``2026-11-27T10:00:00Z``)."""
    value = text.strip()
    lowered = value.lower()
    if lowered == "earliest":
        return Earliest()
    if lowered == "latest":
        return Latest()
    if value.isdigit():
        seq = int(value)
        if seq < 1:
            raise JetStreamOptionError(name, "a stream sequence starts at 1")
        return AtSequence(seq)
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise JetStreamOptionError(
            name,
            f"must be earliest, latest, a stream sequence or an ISO 8601 time, not {text!r}",
        ) from None
    if when.tzinfo is None:
        raise JetStreamOptionError(name, f"the time {text!r} needs a zone (Z or +00:00)")
    return AtTime(when)


# -- the source -----------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class SourceSpec:
    """What to read and how: the source options (docs/spark-streaming.md has the table)."""

    connection: ConnectionSpec
    stream: str
    subjects: tuple[str, ...] = ()
    starting: Position = Latest()
    ending: Position = Latest()
    max_messages: int | None = None
    max_bytes: int | None = None
    num_partitions: int | None = None
    partition_bytes: int = 64 * 1024 * 1024
    fail_on_data_loss: bool = True
    fetch_batch: int = 10_000
    read_method: str = "auto"

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, streaming: bool) -> SourceSpec:
        check_known(options, SOURCE_OPTIONS, "source")
        opts = _lower(options)
        from headrace.jetstream import check_stream
        from headrace.protocol import check_subject

        stream = _required(opts, "stream")
        try:
            check_stream("stream", stream)
        except ValueError as exc:
            raise JetStreamOptionError("stream", str(exc)) from None
        subjects = _list(opts.get("subjects"))
        for subject in subjects:
            try:
                check_subject(subject, wildcards=True)
            except ValueError as exc:
                raise JetStreamOptionError("subjects", str(exc)) from None
        for i, one in enumerate(subjects):
            for other in subjects[i + 1 :]:
                if subjects_overlap(one, other):
                    raise JetStreamOptionError(
                        "subjects", f"{one!r} and {other!r} overlap: a message would be read twice"
                    )
        method = opts.get("readmethod", "auto").strip().lower()
        if method not in ("auto", "direct", "consumer"):
            raise JetStreamOptionError(
                "readMethod", f"must be auto, direct or consumer, not {method!r}"
            )
        default_start = "latest" if streaming else "earliest"
        starting = parse_position("startingOffsets", opts.get("startingoffsets", default_start))
        if "endingoffsets" in opts:
            if streaming:
                raise JetStreamOptionError(
                    "endingOffsets", "is for batch reads (spark.read); a stream has no end"
                )
            ending = parse_position("endingOffsets", opts["endingoffsets"])
            if isinstance(ending, Earliest):
                raise JetStreamOptionError("endingOffsets", "cannot be earliest")
        else:
            ending = Latest()
        if not streaming:
            for name in ("maxMessagesPerTrigger", "maxBytesPerTrigger"):
                if name.lower() in opts:
                    raise JetStreamOptionError(name, "is for streaming reads (spark.readStream)")
        return cls(
            connection=ConnectionSpec.from_options(options),
            stream=stream,
            subjects=subjects,
            starting=starting,
            ending=ending,
            max_messages=_int(opts, "maxMessagesPerTrigger"),
            max_bytes=_int(opts, "maxBytesPerTrigger"),
            num_partitions=_int(opts, "numPartitions"),
            partition_bytes=_int(opts, "partitionBytes") or 64 * 1024 * 1024,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            fetch_batch=_int(opts, "fetchBatch") or 10_000,
            read_method=method,
        )


def subjects_overlap(one: str, other: str) -> bool:
    """Whether some subject matches both filters (``*`` one token, ``>`` one or more)."""
    a, b = one.split("."), other.split(".")
    for x, y in zip(a, b, strict=False):
        if x == ">" or y == ">":
            return True
        if x != y and x != "*" and y != "*":
            return False
    return len(a) == len(b)


# -- the sink -------------------------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class SinkSpec:
    """Where rows go and how many publishes are in flight per task."""

    connection: ConnectionSpec
    subject: str | None = None
    stream: str | None = None
    max_in_flight: int = 512
    msg_id_prefix: str | None = None
    msg_id_column: str | None = None
    publish_timeout: float = 10.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSpec:
        check_known(options, SINK_OPTIONS, "sink")
        opts = _lower(options)
        from headrace.protocol import check_subject

        subject = opts.get("subject") or None
        if subject is not None:
            try:
                check_subject(subject)
            except ValueError as exc:
                raise JetStreamOptionError("subject", str(exc)) from None
        prefix = opts.get("msgidprefix") or None
        if prefix is not None and not re.fullmatch(r"[^\s:]+", prefix):
            raise JetStreamOptionError(
                "msgIdPrefix", "may hold no spaces or ':' (it is joined to the row's place by ':')"
            )
        return cls(
            connection=ConnectionSpec.from_options(options),
            subject=subject,
            stream=opts.get("stream") or None,
            max_in_flight=_int(opts, "maxInFlight") or 512,
            msg_id_prefix=prefix,
            msg_id_column=opts.get("msgidcolumn") or None,
            publish_timeout=_float(opts, "publishTimeout") or 10.0,
        )
