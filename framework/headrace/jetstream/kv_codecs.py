"""Key and value codecs for Key-Value buckets (ADR-54): a client-side layer, no wire change.

A key becomes a subject (``$KV.<bucket>.<key>``), so it may only use ``a-z A-Z 0-9 - / _ =``
in ``.``-separated tokens. A key codec lets an application use other keys by encoding each
token on the way in and decoding it on the way out; it encodes token by token, so a
``*`` or ``>`` token of a watch or ``keys`` pattern still matches whole (encoded) tokens. A
value codec turns the stored bytes into other bytes (compression, encryption). Neither is
known to the server or to other clients: a bucket must be read with the codecs it was
written with. :class:`CodecKeyValue` applies them around a :class:`KeyValue`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import attrs

from headrace.jetstream.kv import Entry, InvalidKey, KeyValue, KeyWatcher, Operation
from headrace.jetstream.msg_ttl import MessageTTL

_WILDCARDS = ("*", ">")


class KeyCodec(Protocol):
    """Maps application keys to bucket keys and back, token by token."""

    def encode_token(self, token: str) -> str: ...

    def decode_token(self, token: str) -> str: ...


class ValueCodec(Protocol):
    """Maps application values to stored bytes and back."""

    def encode_value(self, value: bytes) -> bytes: ...

    def decode_value(self, value: bytes) -> bytes: ...


@attrs.frozen
class NoOpCodec:
    """Keys and values as they are: the default of both sides."""

    def encode_token(self, token: str) -> str:
        return token

    def decode_token(self, token: str) -> str:
        return token

    def encode_value(self, value: bytes) -> bytes:
        return value

    def decode_value(self, value: bytes) -> bytes:
        return value


@attrs.frozen
class Base64KeyCodec:
    """Each key token as URL-safe base64 (``-``, ``_`` and ``=`` are key characters), so a
    token may hold any text, spaces and ``.``-free punctuation included. A ``.`` still
    separates tokens, which keeps wildcard patterns meaningful."""

    def encode_token(self, token: str) -> str:
        return base64.urlsafe_b64encode(token.encode()).decode("ascii")

    def decode_token(self, token: str) -> str:
        try:
            return base64.urlsafe_b64decode(token.encode("ascii")).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise InvalidKey(f"key token {token!r} is not base64 text: {exc}") from None


@attrs.frozen
class PathKeyCodec:
    """Keys written as paths (ADR-54's path codec): ``/orders/eu/1`` is stored as the key
    ``orders.eu.1`` and read back as ``/orders/eu/1``; a pattern such as ``/orders/*`` or
    ``/orders/>`` matches as its stored form does. A key must start with ``/`` (so that what is
    read back is what was written), must not hold ``.`` (it would read back as ``/``) nor an
    empty segment; a trailing ``/`` is dropped. Each segment is kept as it is, so it must
    still be a valid key token."""

    def encode_token(self, token: str) -> str:
        return token

    def decode_token(self, token: str) -> str:
        return token

    def split_key(self, key: str) -> list[str]:
        """The application key's tokens (its path segments); ``>`` or ``*`` alone (every key,
        every one-segment key) is a pattern as it is."""
        if key in _WILDCARDS:
            return [key]
        if not key.startswith("/") or "." in key:
            raise InvalidKey(f"a path key starts with '/' and holds no '.': {key!r}")
        segments = key[1:].removesuffix("/").split("/")
        if not all(segments):
            raise InvalidKey(f"a path key has no empty segment: {key!r}")
        return segments

    def join_key(self, tokens: list[str]) -> str:
        """The application key of a stored key's tokens."""
        return "/" + "/".join(tokens)


def _map_key(key: str, token: Any, *, pattern: bool) -> str:
    if not key:
        raise InvalidKey("a key must not be empty")
    return ".".join(t if pattern and t in _WILDCARDS else token(t) for t in key.split("."))


@attrs.define
class CodecKeyValue:
    """A :class:`KeyValue` seen through codecs: keys and values given here are encoded before
    they reach the bucket, and those read are decoded. Markers (delete, purge) carry no value
    and are not decoded. Revisions, TTLs and compare-and-set are the bucket's own."""

    kv: KeyValue
    keys_codec: KeyCodec = attrs.field(factory=NoOpCodec)
    values_codec: ValueCodec = attrs.field(factory=NoOpCodec)

    def encode_key(self, key: str) -> str:
        return _map_key(self._stored_form(key), self.keys_codec.encode_token, pattern=False)

    def encode_pattern(self, pattern: str) -> str:
        return _map_key(self._stored_form(pattern), self.keys_codec.encode_token, pattern=True)

    def decode_key(self, key: str) -> str:
        decoded = _map_key(key, self.keys_codec.decode_token, pattern=False)
        join = getattr(self.keys_codec, "join_key", None)
        return decoded if join is None else str(join(decoded.split(".")))

    def _stored_form(self, key: str) -> str:
        """``key`` with ``.`` between its tokens: a codec that splits keys its own way (a
        path codec's ``/``) says where they are."""
        split = getattr(self.keys_codec, "split_key", None)
        return key if split is None else ".".join(split(key))

    def _decoded(self, entry: Entry) -> Entry:
        value = entry.value
        if entry.operation is Operation.PUT:
            value = self.values_codec.decode_value(value)
        return attrs.evolve(entry, key=self.decode_key(entry.key), value=value)

    async def get(self, key: str, revision: int | None = None) -> Entry:
        return self._decoded(await self.kv.get(self.encode_key(key), revision))

    async def history(self, key: str) -> list[Entry]:
        return [self._decoded(e) for e in await self.kv.history(self.encode_key(key))]

    async def keys(self, keys: str | Sequence[str] = ">") -> list[str]:
        patterns = [keys] if isinstance(keys, str) else list(keys)
        found = await self.kv.keys([self.encode_pattern(p) for p in patterns])
        return [self.decode_key(k) for k in found]

    async def put(self, key: str, value: bytes) -> int:
        return await self.kv.put(self.encode_key(key), self.values_codec.encode_value(value))

    async def create(self, key: str, value: bytes, *, ttl: MessageTTL | None = None) -> int:
        encoded = self.values_codec.encode_value(value)
        return await self.kv.create(self.encode_key(key), encoded, ttl=ttl)

    async def update(self, key: str, value: bytes, last_revision: int) -> int:
        encoded = self.values_codec.encode_value(value)
        return await self.kv.update(self.encode_key(key), encoded, last_revision)

    async def delete(self, key: str, last_revision: int | None = None) -> int:
        return await self.kv.delete(self.encode_key(key), last_revision)

    async def purge(
        self, key: str, last_revision: int | None = None, *, ttl: MessageTTL | None = None
    ) -> int:
        return await self.kv.purge(self.encode_key(key), last_revision, ttl=ttl)

    @asynccontextmanager
    async def watch(
        self, keys: str | Sequence[str] = ">", **options: Any
    ) -> AsyncIterator[AsyncIterator[Entry]]:
        """The bucket's watch (same options) with decoded entries."""
        patterns = [keys] if isinstance(keys, str) else list(keys)
        encoded = [self.encode_pattern(p) for p in patterns]
        async with self.kv.watch(encoded, **options) as watcher:
            yield self._decode_watch(watcher)

    async def _decode_watch(self, watcher: KeyWatcher) -> AsyncIterator[Entry]:
        async for entry in watcher:
            yield self._decoded(entry)
