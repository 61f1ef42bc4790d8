"""Checks of the stream and consumer names that go into JetStream API subjects.

A name is one token of an API subject (``$JS.API.STREAM.INFO.<stream>``,
``$JS.API.CONSUMER.INFO.<stream>.<consumer>``). A name with a ``.`` makes the subject address
another operation or none, a wildcard or whitespace makes it no valid subject at all, and an
empty one leaves a token out: the server never answers, and the call would wait out its whole
timeout before failing with an error that says nothing about the name. So every name is checked
before anything is sent, the way nats-server checks names it is given in a request body.
"""

from __future__ import annotations

import re

from headrace.jetstream.errors import ConsumerNameConflict, InvalidNameError

# Whitespace (any, as str.isspace sees it), the subject separators and wildcards, the path
# separators (the server makes directories of names) and control characters, C0 and C1.
_BAD_CHAR = re.compile(r"[\s.*>/\\\x00-\x1f\x7f-\x9f]")


def check_name(kind: str, argument: str, name: object) -> str:
    """``name`` if it can be a ``kind`` ("stream" or "consumer") name, else
    :class:`InvalidNameError` naming ``argument``, the argument that carried it."""
    if not isinstance(name, str) or not name or _BAD_CHAR.search(name):
        raise InvalidNameError(kind, argument, name)
    return name


def check_stream(argument: str, name: object) -> str:
    return check_name("stream", argument, name)


def check_consumer(argument: str, name: object) -> str:
    return check_name("consumer", argument, name)


def agreed_name(names: dict[str, str | None]) -> str | None:
    """The one consumer name that ``names`` (argument -> name, ``None`` for not given) give,
    or ``None`` if none does; :class:`ConsumerNameConflict` if they give different ones.

    Two names for one consumer cannot both be meant: the server would use one and drop the
    other without a word (``name`` and ``durable_name`` of a create), or a subscription would
    look one up and create the other.
    """
    given = {argument: name for argument, name in names.items() if name is not None}
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{argument}={name!r}" for argument, name in given.items())
        raise ConsumerNameConflict(
            f"the consumer is given different names ({listed}); a consumer has one name: "
            "give it once, or the same everywhere"
        )
    return next(iter(given.values()), None)
