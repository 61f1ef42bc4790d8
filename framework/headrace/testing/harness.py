"""Testing a pipeline with or without a server: feed messages, read what became of them.

::

    async with run_pipeline(pipe, [TestMessage("orders.eu", b'{"id": 1}')]) as run:
        await run.settled()
    assert run.values("lake") == [{"id": 1}]
    assert [a.stream_seq for a in run.acked] == [1]

Server-less (the default), the pipeline's own graph, stages, batchers, sinks and ack tracker
run unchanged on trio; only the server is replaced, at the two doors the run already has
(memory.py): the JetStream context its sources consume through, and the connection its acks
are published on. With ``real=True`` (or a ``server_url``), the same call runs the same
pipeline against a real server (a private :class:`~headrace.localserver.LocalServer` unless a
URL is given): it creates the streams the sources read if they are missing, publishes the
messages into them, and fills the same result from what went over the wire.

Both modes learn what was acked, naked or terminated the same way: from the ack publishes
themselves (``$JS.ACK`` reply subject and payload). In memory the connection hands them over;
against a server, a second connection subscribes to ``$JS.ACK.>`` and sees each one the server
was sent. What each sink committed comes from the run (``PipelineRun.on_commit``, told once per
committed batch), dead letters from the in-memory publish or a subscription to the dead-letter
subject. So one test body runs in both modes, and a difference between them is a difference of
the server's behaviour, not of the bookkeeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs
import trio

from headrace.checkpoints.subscription import subject_matches
from headrace.errors import HeadraceError
from headrace.jetstream.ack_reply import parse_ack_reply
from headrace.jetstream.context import JetStream
from headrace.jetstream.errors import InvalidAckReply, StreamLookupError, StreamNotFound
from headrace.jetstream.stream_config import StreamConfig
from headrace.localserver import LocalServer
from headrace.nats import connect
from headrace.pipeline.errors import PipelineError
from headrace.pipeline.runtime import PipelineRun
from headrace.protocol.headers import Headers
from headrace.testing.memory import (
    MemoryConnection,
    MemoryJetStream,
    MemoryStreams,
    PublishedMessage,
    parse_ack,
)

if TYPE_CHECKING:
    from headrace.nats.connection import Connection
    from headrace.pipeline.graph import Pipeline
    from headrace.pipeline.record import Record
    from headrace.pipeline.stats import PipelineStats
    from headrace.protocol.events import Msg

#: The stream a real-mode run creates for the pipeline's dead-letter subject if none stores it.
DEAD_LETTER_STREAM = "HEADRACE_TEST_DEAD_LETTERS"

AckKind = Literal["ack", "nak", "term", "in_progress"]


class HarnessError(HeadraceError):
    """A test run cannot be set up as asked (a message no stream would store, say)."""


def _to_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _to_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    return dict(headers) if headers else None


@attrs.frozen(slots=True)
class TestMessage:
    """A message to feed: subject, payload (``str`` is encoded as UTF-8), headers, and, where
    its subject alone does not say which of the sources' streams stores it, ``stream``."""

    __test__ = False  # not a pytest test class

    subject: str
    data: bytes = attrs.field(default=b"", converter=_to_bytes)
    headers: dict[str, str] | None = attrs.field(default=None, converter=_to_headers)
    stream: str | None = None


@attrs.frozen(slots=True)
class AckEvent:
    """One ack publish of the pipeline: what (``kind``), for which message (stream, sequence,
    delivery count, consumer), a nak's ``delay`` and a term's ``reason``; ``message`` is the
    :class:`TestMessage` fed at that sequence (None for one already in the stream)."""

    kind: AckKind
    stream: str
    stream_seq: int
    num_delivered: int
    consumer: str
    delay: float | None = None
    reason: str | None = None
    message: TestMessage | None = None

    @property
    def subject(self) -> str | None:
        return self.message.subject if self.message is not None else None

    @property
    def data(self) -> bytes | None:
        return self.message.data if self.message is not None else None


class TestRun:
    """The pipeline running under test, and what became of the messages fed to it.

    ``committed`` maps each sink's name to the records it committed, in commit order (a
    message delivered again is committed again: sinks see redeliveries). ``events`` lists every
    ack publish in order; ``acked``, ``naked``, ``terminated`` and ``in_progress`` are its
    parts. ``dead_lettered``: the copies published to the pipeline's ``dead_letter``. ``run``
    is the :class:`~headrace.pipeline.runtime.PipelineRun` (stats, errors); ``real`` says
    which mode this is. The lists keep growing until the block ends (the drain may commit and
    ack more); read them after :meth:`settled` or after the block.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, run: PipelineRun, *, real: bool) -> None:
        self.run = run
        self.real = real
        self.committed: dict[str, list[Record]] = {s.name: [] for s in run.pipeline.sinks}
        self.events: list[AckEvent] = []
        self.dead_lettered: list[PublishedMessage] = []
        #: The messages fed, by (stream, stream sequence).
        self.fed: dict[tuple[str, int], TestMessage] = {}
        self._finished: set[tuple[str, int]] = set()
        self._open: set[tuple[str, int]] = set()
        self._changed = trio.Event()
        self._feed: Any = None  # set by the mode: async (messages) -> stream keys
        run.on_commit = self._on_commit

    # -- what happened ------------------------------------------------------------------------

    def _of(self, kind: AckKind) -> list[AckEvent]:
        return [e for e in self.events if e.kind == kind]

    @property
    def acked(self) -> list[AckEvent]:
        return self._of("ack")

    @property
    def naked(self) -> list[AckEvent]:
        return self._of("nak")

    @property
    def terminated(self) -> list[AckEvent]:
        return self._of("term")

    @property
    def in_progress(self) -> list[AckEvent]:
        return self._of("in_progress")

    @property
    def stats(self) -> PipelineStats:
        return self.run.stats

    def values(self, sink: str) -> list[Any]:
        """The values of the records sink ``sink`` committed, in order."""
        if sink not in self.committed:
            raise KeyError(f"the pipeline has no sink {sink!r}: {sorted(self.committed)}")
        return [r.value for r in self.committed[sink]]

    # -- feeding and waiting ------------------------------------------------------------------

    async def feed(self, *messages: TestMessage) -> list[int]:
        """Feed more messages (stored in their streams); their stream sequences."""
        keys: list[tuple[str, int]] = await self._feed(messages)
        for key, message in zip(keys, messages, strict=True):
            self.fed[key] = message
            if key not in self._finished:
                self._open.add(key)
        # Against a server, the pipeline may ack a message before its PubAck is back here.
        self.events = [
            attrs.evolve(e, message=self.fed.get((e.stream, e.stream_seq)))
            if e.message is None
            else e
            for e in self.events
        ]
        return [seq for _, seq in keys]

    async def settled(self, timeout: float = 10.0) -> PipelineStats:
        """Wait until every message fed is acked or terminated (a naked one waiting for its
        redelivery is not settled; a dead-lettered one is terminated once its copy is stored);
        the run's stats then. Against a server, also until the server agrees
        (``PipelineRun.wait_caught_up``). ``trio.TooSlowError`` after ``timeout`` seconds, with
        what is still open in its note."""
        try:
            with trio.fail_after(timeout):
                while self._open:
                    await self._changed.wait()
                if self.real:
                    await self.run.wait_caught_up()
        except trio.TooSlowError as exc:
            open_ = sorted(self._open)
            exc.add_note(
                f"headrace.testing: {len(open_)} message(s) not settled after {timeout}s: "
                + ", ".join(f"{stream}#{seq}" for stream, seq in open_[:10])
            )
            raise
        return self.run.stats

    # -- told by the run, the wire or the in-memory server -----------------------------------

    def _on_commit(self, sink: str, records: list[Record]) -> None:
        self.committed[sink].extend(records)

    def _ours(self, stream: str, consumer: str) -> bool:
        return any(
            s.node.source is not None
            and s.node.source.stream == stream
            and s.consumer_name == consumer
            for s in self.run.sources
        )

    def _on_ack(self, reply: str, payload: bytes) -> None:
        try:
            meta = parse_ack_reply(reply)
        except InvalidAckReply:
            return
        if not self._ours(meta.stream, meta.consumer):
            return  # another consumer's acks, on a server shared with others
        kind, delay = parse_ack(payload)
        reason = None
        if kind == "term":
            reason = payload[5:].strip().decode(errors="replace") or None
        key = (meta.stream, meta.stream_seq)
        self.events.append(
            AckEvent(
                cast("AckKind", kind),
                meta.stream,
                meta.stream_seq,
                meta.num_delivered,
                meta.consumer,
                delay,
                reason,
                self.fed.get(key),
            )
        )
        if kind in ("ack", "term"):
            self._finished.add(key)
            self._open.discard(key)
        self._changed.set()
        self._changed = trio.Event()

    def _on_dead_letter(self, message: PublishedMessage) -> None:
        if message.subject == self.run.pipeline.dead_letter:
            self.dead_lettered.append(message)


# -- routing messages to streams --------------------------------------------------------------


def _stream_of(message: TestMessage, pipe: Pipeline, streams: Mapping[str, Sequence[str]]) -> str:
    """The stream that stores ``message``: its own ``stream``, else the one whose subjects
    (``streams``, else the filters of the sources reading it) match its subject."""
    if message.stream is not None:
        return message.stream
    candidates: set[str] = set()
    for name, subjects in streams.items():
        if any(subject_matches(s, message.subject) for s in subjects):
            candidates.add(name)
    if not candidates:
        for node in pipe.sources:
            spec = node.source
            assert spec is not None
            if spec.stream in streams:
                continue
            filters = spec.filter_subjects
            if not filters or any(subject_matches(f, message.subject) for f in filters):
                candidates.add(spec.stream)
    if len(candidates) != 1:
        said = f"streams {sorted(candidates)}" if candidates else "no stream of its sources"
        raise HarnessError(
            f"pipeline {pipe.name!r}: which stream stores a message on {message.subject!r}? "
            f"Its subject matches {said}: give TestMessage(stream=...) or run_pipeline(streams="
            "{name: [subjects]})"
        )
    return candidates.pop()


def _source_streams(pipe: Pipeline) -> list[str]:
    found: list[str] = []
    for node in pipe.sources:
        assert node.source is not None
        if node.source.stream not in found:
            found.append(node.source.stream)
    return found


# -- the two modes ------------------------------------------------------------------------------


@asynccontextmanager
async def run_pipeline(
    pipe: Pipeline,
    messages: Iterable[TestMessage] = (),
    *,
    real: bool = False,
    server_url: str | None = None,
    streams: Mapping[str, Sequence[str]] | None = None,
    sinks: Mapping[str, Any] | None = None,
) -> AsyncIterator[TestRun]:
    """Run ``pipe`` under test and feed it ``messages``: ``async with run_pipeline(pipe,
    msgs) as run: await run.settled()``; leaving the block drains the pipeline as
    ``Pipeline.running`` does (an actor that failed for good raises here).

    Without a server (the default) the messages are stored in in-memory streams (memory.py).
    ``real=True`` runs against a private :class:`~headrace.localserver.LocalServer`;
    ``server_url`` against that server. ``streams`` gives a stream's subjects (``{"ORDERS":
    ["orders.>"]}``): used to route messages to streams, and against a server to create a
    stream the sources read that is missing (by default with the sources' filter subjects, or
    the subjects of the messages fed). The messages are fed once every source is bound, so a
    consumer that delivers only new messages sees them too.

    ``sinks`` replaces sinks by name for this run only (``{"lake": MemorySink()}``), as
    ``headrace run --sink`` does: a sink that needs a server (one sharing its commits through
    the JetStream API) can be swapped for one that does not, or for a test double.
    """
    with _replaced_sinks(pipe, sinks or {}):
        pipe.validate()
        subjects = dict(streams or {})
        batch = list(messages)
        if real or server_url is not None:
            async with _real(pipe, batch, server_url, subjects) as run:
                yield run
        else:
            async with _in_memory(pipe, batch, subjects) as run:
                yield run


@contextmanager
def _replaced_sinks(pipe: Pipeline, sinks: Mapping[str, Any]) -> Iterator[None]:
    """Put ``sinks`` in place of the pipeline's sinks of those names; put them back after."""
    names = [n.name for n in pipe.sinks]
    unknown = sorted(set(sinks) - set(names))
    if unknown:
        raise HarnessError(
            f"pipeline {pipe.name!r} has no sink named {', '.join(map(repr, unknown))} "
            f"(its sinks: {', '.join(names) or 'none'})"
        )
    saved = {name: pipe.node(name).sink_obj for name in sinks}
    try:
        for name, sink in sinks.items():
            pipe.node(name).sink_obj = sink
        yield
    finally:
        for name, sink in saved.items():
            pipe.node(name).sink_obj = sink


@asynccontextmanager
async def _in_memory(
    pipe: Pipeline, batch: list[TestMessage], subjects: dict[str, Sequence[str]]
) -> AsyncIterator[TestRun]:
    kept = [n.name for n in pipe.nodes if n.kind in ("stateful", "lookup")]
    if kept:
        raise PipelineError(
            f"pipeline {pipe.name!r}: {', '.join(kept)} keep state or read KV, which the "
            "in-memory mode does not model; run it with real=True (a private nats-server)"
        )
    store = MemoryStreams()
    conn = MemoryConnection()
    js = MemoryJetStream(store, conn)
    pipeline_run = PipelineRun(pipe, cast("Connection", conn), js=cast("JetStream", js))
    result = TestRun(pipeline_run, real=False)
    conn.listeners.append(result._on_ack)
    js.on_publish = result._on_dead_letter

    async def feed(fed: Sequence[TestMessage]) -> list[tuple[str, int]]:
        await trio.lowlevel.checkpoint()
        keys = []
        for message in fed:
            stream = _stream_of(message, pipe, subjects)
            headers = Headers(message.headers) if message.headers else None
            stored = store.store(stream, message.subject, message.data, headers)
            keys.append((stream, stored.seq))
        return keys

    result._feed = feed
    async with pipeline_run.lifetime():
        await pipeline_run.wait_bound()
        await result.feed(*batch)
        yield result


@asynccontextmanager
async def _real(
    pipe: Pipeline,
    batch: list[TestMessage],
    server_url: str | None,
    subjects: dict[str, Sequence[str]],
) -> AsyncIterator[TestRun]:
    async with AsyncExitStack() as stack:
        if server_url is None:
            server = LocalServer()
            await trio.to_thread.run_sync(server.start)
            stack.push_async_callback(trio.to_thread.run_sync, server.stop)
            server_url = server.url
        nc = await stack.enter_async_context(connect(server_url, name=f"test:{pipe.name}"))
        watcher = await stack.enter_async_context(
            connect(server_url, name=f"test-watcher:{pipe.name}")
        )
        js = JetStream(nc)
        await _ensure_streams(js, pipe, batch, subjects)
        run = PipelineRun(pipe, nc, js=js)
        result = TestRun(run, real=True)

        def on_acks(batch: list[Msg]) -> None:
            for msg in batch:
                result._on_ack(msg.subject, msg.data)

        acks = watcher.subscribe_nowait("$JS.ACK.>", handler=on_acks)
        if pipe.dead_letter is not None:

            def on_dead(batch: list[Msg]) -> None:
                for msg in batch:
                    result._on_dead_letter(
                        PublishedMessage(msg.subject, msg.data, msg.headers or Headers())
                    )

            dead = watcher.subscribe_nowait(pipe.dead_letter, handler=on_dead)
            stack.push_async_callback(dead.unsubscribe)
        stack.push_async_callback(acks.unsubscribe)
        await watcher.flush()  # the subscriptions are in place before anything is sent

        async def feed(fed: Sequence[TestMessage]) -> list[tuple[str, int]]:
            keys = []
            for message in fed:
                ack = await js.publish(
                    message.subject,
                    message.data,
                    headers=message.headers,
                    expected_stream=message.stream,
                )
                keys.append((ack.stream, ack.seq))
            return keys

        result._feed = feed
        async with run.lifetime():
            await run.wait_bound()
            await result.feed(*batch)
            yield result
        await watcher.flush()  # the last acks of the drain have reached the watcher


async def _ensure_streams(
    js: JetStream, pipe: Pipeline, batch: list[TestMessage], subjects: dict[str, Sequence[str]]
) -> None:
    """Create the streams the sources read, and one for the dead-letter subject, if missing."""
    for stream in _source_streams(pipe):
        try:
            await js.stream_info(stream)
            continue
        except StreamNotFound:
            pass
        wanted: list[str] = list(subjects.get(stream, ()))
        if not wanted:
            for node in pipe.sources:
                assert node.source is not None
                if node.source.stream == stream:
                    wanted.extend(f for f in node.source.filter_subjects if f not in wanted)
        if not wanted:
            for message in batch:
                if _stream_of(message, pipe, subjects) == stream and message.subject not in wanted:
                    wanted.append(message.subject)
        if not wanted:
            raise HarnessError(
                f"stream {stream!r} does not exist and nothing says its subjects: give "
                f"run_pipeline(streams={{{stream!r}: [subjects]}})"
            )
        await js.add_stream(StreamConfig(name=stream, subjects=wanted))
    if pipe.dead_letter is not None:
        try:
            await js.find_stream(pipe.dead_letter)
        except StreamLookupError:
            await js.add_stream(StreamConfig(name=DEAD_LETTER_STREAM, subjects=[pipe.dead_letter]))
