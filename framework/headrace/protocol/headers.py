"""NATS message headers: the ``NATS/1.0`` block, repeated keys, and inline status lines.

A header block looks like an HTTP/1 header block with its own version line::

    NATS/1.0 100 Idle Heartbeat\\r\\n
    Nats-Last-Consumer: 42\\r\\n
    Nats-Last-Stream: 97\\r\\n
    \\r\\n

The version line may carry a status code and a description; the server uses it for no
responders (503), pull statuses (404, 408, 409) and idle heartbeats / flow control (100).
Keys are case-sensitive and may repeat; order is kept. Values are trimmed of surrounding spaces
and tabs, as the servers and the other clients do.

Writing is strict, reading is not. Headers built here are checked as they are added, so
headrace never sends a block another client cannot read. A received block is read with
:func:`read_header_block`: the server relays and stores whatever a publisher sent, so an
unreadable line is left out and reported (:class:`~headrace.errors.MalformedHeaderWarning`)
instead of making the whole message, or every reader of a stream, fail.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Iterator, Mapping

from headrace.errors import InvalidHeaderError, MalformedHeaderWarning

VERSION_LINE = b"NATS/1.0"

# RFC 7230 token characters, which is what NATS servers and clients accept as a header name.
_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# CR and LF would end the line; NUL and lone surrogates cannot travel as UTF-8 text.
_BAD_VALUE_RE = re.compile(r"[\r\n\x00\ud800-\udfff]")

# Names already checked against _NAME_RE. A stream's messages carry a handful of distinct
# names, so remembering them spares a regex match per header line on the hot path; the bound
# keeps a stream of ever-new names from growing it without limit.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX = 4096

HeaderInput = Mapping[str, "str | Iterable[str]"] | Iterable[tuple[str, str]]


class Headers(Mapping[str, str]):
    """An ordered, case-sensitive multi-map of header names to values.

    As a :class:`~collections.abc.Mapping` it answers the first value of each name;
    :meth:`get_all` gives every value and :meth:`multi_items` every (name, value) pair.
    """

    __slots__ = ("_map",)

    def __init__(self, items: HeaderInput | None = None) -> None:
        self._map: dict[str, list[str]] = {}
        if items is None:
            return
        pairs: Iterable[tuple[str, str | Iterable[str]]]
        pairs = items.items() if isinstance(items, Mapping) else items
        for name, value in pairs:
            if isinstance(value, str):
                self.add(name, value)
            else:
                for v in value:
                    self.add(name, v)

    # -- building -----------------------------------------------------------------------------

    def add(self, name: str, value: str) -> None:
        """Append ``value`` to ``name``, keeping earlier values."""
        _check_name(name)
        _check_value(name, value)
        self._map.setdefault(name, []).append(value)

    def set(self, name: str, value: str) -> None:
        """Replace every value of ``name`` with ``value``."""
        _check_name(name)
        _check_value(name, value)
        self._map[name] = [value]

    def remove(self, name: str) -> None:
        """Remove ``name`` and all its values, if present."""
        self._map.pop(name, None)

    # -- reading ------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> str:
        return self._map[name][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def get_all(self, name: str) -> list[str]:
        """Every value of ``name`` in order; an empty list when absent."""
        return list(self._map.get(name, ()))

    def as_dict(self) -> dict[str, list[str]]:
        """Every name with the list of its values (a copy): the shape of a
        ``map<string, array<string>>`` column."""
        return {name: list(values) for name, values in self._map.items()}

    def multi_items(self) -> Iterator[tuple[str, str]]:
        """Every (name, value) pair, repeated names included: names in the order first seen,
        each name's values in order (as NATS and HTTP headers are a map of lists)."""
        for name, values in self._map.items():
            for value in values:
                yield name, value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Headers):
            return self._map == other._map
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Headers({list(self.multi_items())!r})"

    def copy(self) -> Headers:
        h = Headers()
        h._map = {k: list(v) for k, v in self._map.items()}
        return h

    # -- wire form ----------------------------------------------------------------------------

    def encode(self, status: int | None = None, description: str = "") -> bytes:
        """The header block, version line through the blank line that ends it."""
        return encode_header_block(self, status, description)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidHeaderError(
            f"invalid header name {name!r}: use letters, digits and !#$%&'*+-.^_`|~ only "
            "(no spaces, colons or control characters)"
        )


def _check_value(name: str, value: str) -> None:
    if not isinstance(value, str):
        raise InvalidHeaderError(f"header {name!r} value must be str, not {type(value).__name__}")
    if _BAD_VALUE_RE.search(value):
        raise InvalidHeaderError(
            f"header {name!r} value contains CR, LF, NUL or an unpaired surrogate: {value!r}"
        )


def encode_header_block(
    headers: Headers | None, status: int | None = None, description: str = ""
) -> bytes:
    """Encode ``headers`` (already validated on insertion) as a NATS header block."""
    parts = [VERSION_LINE]
    if status is not None:
        if not 100 <= status <= 999:
            raise InvalidHeaderError(f"status must have three digits, not {status}")
        parts.append(b" %d" % status)
        if description:
            if _BAD_VALUE_RE.search(description):
                raise InvalidHeaderError(f"status description contains CR/LF: {description!r}")
            parts.append(b" " + description.encode())
    parts.append(b"\r\n")
    if headers is not None:
        for name, value in headers.multi_items():
            parts.append(f"{name}: {value}\r\n".encode())
    parts.append(b"\r\n")
    return b"".join(parts)


def parse_status_line(line: bytes) -> tuple[int | None, str]:
    """The (status, description) of a version line (without its CRLF); (None, "") if bare."""
    if not line.startswith(VERSION_LINE):
        raise InvalidHeaderError(f"header block does not start with NATS/1.0: {line[:40]!r}")
    rest = line[len(VERSION_LINE) :]
    if not rest.strip(b" \t"):
        return None, ""
    if rest[:1] not in (b" ", b"\t"):
        raise InvalidHeaderError(f"malformed version line: {line[:40]!r}")
    rest = rest.strip(b" \t")
    code, tail = rest[:3], rest[3:]
    if len(code) != 3 or not code.isdigit() or tail[:1] not in (b"", b" ", b"\t"):
        raise InvalidHeaderError(f"malformed status code in version line: {line[:40]!r}")
    return int(code), tail.strip(b" \t").decode("utf-8", "replace")


def parse_header_block(block: bytes) -> tuple[Headers, int | None, str]:
    """Parse a complete header block into (headers, status, description), strictly.

    The block must start with ``NATS/1.0`` and end with an empty line; a line without a colon,
    an invalid name, or trailing garbage raises :class:`InvalidHeaderError`. Received messages
    use :func:`read_header_block` instead, which keeps what it can read.
    """
    headers, status, description, problems = read_header_block(block)
    if problems:
        raise InvalidHeaderError(problems[0])
    return headers, status, description


def read_header_block(block: bytes) -> tuple[Headers, int | None, str, list[str]]:
    """Read what can be read of a header block: (headers, status, description, problems).

    Never raises. A received block comes from whoever published the message, and the server
    relays it (and a stream stores it) without checking, so one unreadable line must not make
    the rest, or the message, unreadable. A line that cannot be read is left out and described
    in ``problems``; so is a version line that is not ``NATS/1.0`` with an optional status
    (the status is then ``None``), and a missing blank line at the end.
    """
    problems: list[str] = []
    if block.endswith(b"\r\n\r\n"):
        body = block[:-4]
    else:
        problems.append(f"header block does not end with an empty line: {block[-20:]!r}")
        body = block[:-2] if block.endswith(b"\r\n") else block
    lines = body.split(b"\r\n")
    first = lines[0]
    status: int | None = None
    description = ""
    if first != VERSION_LINE:  # the common case has no status
        try:
            status, description = parse_status_line(first)
        except InvalidHeaderError as exc:
            problems.append(str(exc))
    headers = Headers()
    hmap = headers._map
    known = _VALID_NAMES
    for line in lines[1:]:
        name_b, colon, value_b = line.partition(b":")
        if not colon:
            problems.append(
                f"header line without a colon: {line[:60]!r}"
                if line
                else "empty line inside the header block"
            )
            continue
        try:
            name = name_b.decode("ascii")
            value = value_b.strip(b" \t").decode()
        except UnicodeDecodeError:
            problems.append(f"header line is not valid text: {line[:60]!r}")
            continue
        if name not in known:
            if not _NAME_RE.fullmatch(name):
                problems.append(f"invalid header name {name!r}")
                continue
            if len(known) < _VALID_NAMES_MAX:
                known.add(name)
        if "\r" in value or "\n" in value:
            problems.append(f"header {name!r} value contains CR or LF")
            continue
        values = hmap.get(name)
        if values is None:
            hmap[name] = [value]
        else:
            values.append(value)
    return headers, status, description, problems


def warn_malformed(what: str, problems: list[str]) -> None:
    """Report the ``problems`` :func:`read_header_block` found in the header block of
    ``what`` (a message, described for a person) as one :class:`MalformedHeaderWarning`."""
    warnings.warn(
        MalformedHeaderWarning(
            f"the header block of {what} is malformed; what could not be read was left out: "
            + "; ".join(problems)
        ),
        stacklevel=2,
    )
