"""From a batch of records to a ``pyarrow.Table`` with an explicit schema.

``spark.createDataFrame(table)`` takes the Arrow path: columns cross to the JVM as Arrow
buffers, 4-6x faster than Python rows, and an explicit schema means Spark infers nothing, so a
batch of one kind of values never turns into another column type in the next batch.

Two shapes:

- the default, one row per record with the message's metadata (:data:`METADATA_SCHEMA`):
  subject, data (binary), headers (``map<string, array<string>>``), stream, stream_seq,
  consumer_seq, num_delivered, timestamp (UTC);
- a declared schema (a ``pyarrow.Schema`` or an attrs class) for values the pipeline or a
  ``decode`` function made: attrs instances or dicts, one per record, optionally followed by the
  metadata columns.

Spark has no unsigned integers, so sequences are ``int64``, and its timestamps are microseconds,
so the stream's nanosecond timestamps are cut to microseconds.

A declared column takes its values exactly or not at all (values.py): a value that would change
on the way (1611.5 into an integer column) is a record that does not fit, set aside by
:meth:`TableBuilder.build_accepting`, never a silent cast.
"""

from __future__ import annotations

import datetime as dt
import types
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc

from headrace_spark.errors import SparkSchemaError
from headrace_spark.metadata import BatchMetadata
from headrace_spark.values import exact_array

if TYPE_CHECKING:
    from headrace.pipeline import Record

HEADERS_TYPE = pa.map_(pa.string(), pa.list_(pa.string()))

#: The default columns: what a JetStream message is.
METADATA_SCHEMA = pa.schema(
    [
        pa.field("subject", pa.string(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("headers", HEADERS_TYPE),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("stream_seq", pa.int64(), nullable=False),
        pa.field("consumer_seq", pa.int64(), nullable=False),
        pa.field("num_delivered", pa.int32(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", "UTC"), nullable=False),
    ]
)

_SIMPLE: dict[Any, pa.DataType] = {
    str: pa.string(),
    bytes: pa.binary(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    dt.datetime: pa.timestamp("us", "UTC"),
    dt.date: pa.date32(),
}


def arrow_type(tp: Any, where: str) -> tuple[pa.DataType, bool]:
    """The Arrow type of a Python annotation, and whether it is nullable (``X | None``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise SparkSchemaError(f"{where}: a union of {args} has no column type", where)
        inner, _ = arrow_type(args[0], where)
        return inner, True
    if tp in _SIMPLE:
        return _SIMPLE[tp], False
    if origin in (list, Sequence):
        (item,) = typing.get_args(tp) or (None,)
        if item is None:
            raise SparkSchemaError(f"{where}: say what the list holds (list[int])", where)
        item_type, _ = arrow_type(item, where)
        return pa.list_(item_type), False
    if origin is dict:
        key, value = typing.get_args(tp) or (None, None)
        if key is not str:
            raise SparkSchemaError(f"{where}: only dict[str, X] has a column type", where)
        value_type, _ = arrow_type(value, where)
        return pa.map_(pa.string(), value_type), False
    raise SparkSchemaError(
        f"{where}: no column type for {tp!r}; use str, bytes, int, float, bool, datetime, date, "
        "list[X], dict[str, X] or X | None, or declare a pyarrow.Schema",
        where,
    )


def schema_of(declared: pa.Schema | type) -> pa.Schema:
    """A ``pyarrow.Schema`` as given, or the schema of an attrs class from its annotations."""
    if isinstance(declared, pa.Schema):
        return declared
    if isinstance(declared, type) and attrs.has(declared):
        try:
            hints = typing.get_type_hints(declared)
        except NameError as exc:
            raise SparkSchemaError(
                f"{declared.__name__}: cannot resolve its annotations: {exc}"
            ) from exc
        fields = []
        for field in attrs.fields(declared):
            where = f"{declared.__name__}.{field.name}"
            if field.name not in hints:
                raise SparkSchemaError(f"{where} has no type annotation", field.name)
            arrow, nullable = arrow_type(hints[field.name], where)
            fields.append(pa.field(field.name, arrow, nullable=nullable))
        return pa.schema(fields)
    raise SparkSchemaError(f"schema must be a pyarrow.Schema or an attrs class, not {declared!r}")


def metadata_arrays(
    records: Sequence[Record],
    prefix: str = "",
    names: Sequence[str] | None = None,
    meta: BatchMetadata | None = None,
) -> dict[str, pa.Array]:
    """The metadata columns ``names`` (default: all, in :data:`METADATA_SCHEMA` order) of
    ``records``; a column not asked for costs nothing. ``meta``: the records' delivery
    metadata if the caller has it already (metadata.py parses it for a whole batch in C)."""
    msgs = [r.delivery.msg for r in records]
    wanted = names or METADATA_SCHEMA.names
    if meta is None and not _FROM_MESSAGE.issuperset(wanted):
        meta = BatchMetadata.of(records)

    def field(name: str) -> pa.Array:
        assert meta is not None
        return meta.column(name)

    makers: dict[str, Callable[[], pa.Array]] = {
        "subject": lambda: pa.array([m.msg.subject for m in msgs], pa.string()),
        "data": lambda: pa.array([m.msg.data for m in msgs], pa.binary()),
        "headers": lambda: _headers_column(msgs),
        "stream": lambda: field("stream"),
        "stream_seq": lambda: field("stream_seq"),
        "consumer_seq": lambda: field("consumer_seq"),
        "num_delivered": lambda: field("num_delivered").cast(pa.int32()),
        # Spark keeps microseconds: the cut truncates, as ns // 1000 would
        "timestamp": lambda: pc.divide(field("timestamp_ns"), 1000).cast(pa.timestamp("us", "UTC")),
    }
    return {f"{prefix}{name}": makers[name]() for name in wanted}


#: Columns taken from the message itself; the others come from its delivery metadata.
_FROM_MESSAGE = frozenset({"subject", "data", "headers"})

#: Metadata columns whose values (almost) never repeat within a batch: sequence numbers and
#: the stream's timestamps. A parquet dictionary for them only grows until the writer gives up
#: on it and re-encodes the column; the sink writes them without one (see ``unique_columns``).
UNIQUE_METADATA = ("stream_seq", "consumer_seq", "timestamp")


def metadata_names(keep: bool | Sequence[str]) -> tuple[str, ...]:
    """The metadata columns ``keep_metadata`` asks for: all (True), none (False), or those
    named, in :data:`METADATA_SCHEMA` order."""
    if keep is True:
        return tuple(METADATA_SCHEMA.names)
    if keep is False:
        return ()
    if isinstance(keep, str):
        keep = [keep]
    unknown = sorted(set(keep) - set(METADATA_SCHEMA.names))
    if unknown:
        raise SparkSchemaError(
            f"keep_metadata names {unknown}, which are not metadata columns; they are "
            f"{METADATA_SCHEMA.names}"
        )
    if not keep:
        raise SparkSchemaError("keep_metadata is an empty list; say False for no metadata")
    return tuple(n for n in METADATA_SCHEMA.names if n in keep)


def _headers_column(msgs: Sequence[Any]) -> pa.Array:
    """Each message's headers as a ``map<string, array<string>>``, empty for none.

    Messages of one stream mostly carry the same header block byte for byte, so each distinct
    block is parsed and converted once per batch, and the column is made by Arrow picking the
    converted blocks by index: per record, one dictionary lookup.
    """
    seen: dict[bytes | None, int] = {}
    blocks: list[dict[str, list[str]]] = []
    picks: list[int] = []
    for m in msgs:
        raw = m.msg.raw_headers
        i = seen.get(raw)
        if i is None:
            i = seen[raw] = len(blocks)
            headers = m.headers if raw is not None else None
            blocks.append(headers.as_dict() if headers else {})
        picks.append(i)
    return pa.array(blocks, HEADERS_TYPE).take(pa.array(picks, pa.int32()))


#: What a value that does not fit its column raises (exact_array, pyarrow).
_UNFIT = (pa.ArrowException, TypeError, ValueError, OverflowError)


@attrs.frozen(slots=True)
class TableBuilder:
    """Turns a batch's records into a table of ``schema`` (see the module docs).

    ``schema`` None: the metadata columns only. Otherwise each record's value (or
    ``decode(record)``) is an attrs instance or a dict with the schema's fields; with
    ``keep_metadata`` the metadata columns follow, their names prefixed by ``metadata_prefix``.
    ``keep_metadata`` may name the metadata columns to keep (``["stream", "stream_seq"]``);
    without a schema that selects the columns written.
    """

    schema: pa.Schema | type | None = None
    decode: Callable[[Record], Any] | None = None
    keep_metadata: bool | Sequence[str] = False
    metadata_prefix: str = ""
    arrow_schema: pa.Schema = attrs.field(init=False)
    _declared: pa.Schema | None = attrs.field(init=False)
    _meta: tuple[str, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_declared", None)
        if self.schema is None:
            if self.decode is not None:
                raise SparkSchemaError("decode needs a schema: the columns its values fill")
            names = metadata_names(True if self.keep_metadata is False else self.keep_metadata)
            object.__setattr__(self, "_meta", names)
            arrow = pa.schema(
                [METADATA_SCHEMA.field(n).with_name(self.metadata_prefix + n) for n in names]
            )
        else:
            arrow = schema_of(self.schema)
            object.__setattr__(self, "_declared", arrow)
            names = metadata_names(self.keep_metadata)
            object.__setattr__(self, "_meta", names)
            if names:
                meta = [METADATA_SCHEMA.field(n).with_name(self.metadata_prefix + n) for n in names]
                clash = sorted(set(arrow.names) & {f.name for f in meta})
                if clash:
                    raise SparkSchemaError(
                        f"the schema's columns {clash} clash with the metadata columns; set "
                        "metadata_prefix (for example '_nats_') or rename them",
                        clash[0],
                    )
                arrow = pa.schema([*arrow, *meta])
        object.__setattr__(self, "arrow_schema", arrow)

    @property
    def unique_columns(self) -> tuple[str, ...]:
        """The written names of the :data:`UNIQUE_METADATA` columns this table has."""
        return tuple(self.metadata_prefix + n for n in self._meta if n in UNIQUE_METADATA)

    def build(self, records: Sequence[Record], meta: BatchMetadata | None = None) -> pa.Table:
        """The table of ``records``; :class:`SparkSchemaError` for the first that does not fit
        (see :meth:`build_accepting` to set such records aside instead). ``meta``: the
        records' metadata columns, if the caller has them."""
        if self.schema is None:
            return pa.table(
                metadata_arrays(records, self.metadata_prefix, self._meta, meta),
                self.arrow_schema,
            )
        decode = self.decode
        try:
            values = [decode(r) for r in records] if decode else [r.value for r in records]
        except Exception as exc:
            for record in records:
                try:
                    decode(record)  # type: ignore[misc]
                except Exception as one:
                    raise SparkSchemaError(
                        f"decode failed for the record at {_where(record)}: "
                        f"{type(one).__name__}: {one}"
                    ) from one
            raise SparkSchemaError(f"decode failed: {type(exc).__name__}: {exc}") from exc
        declared = self._declared
        assert declared is not None
        columns: dict[str, pa.Array] = {}
        for field in declared:
            column = self._column(values, field.name, records)
            try:
                columns[field.name] = exact_array(column, field.type)
            except _UNFIT as exc:
                columns[field.name] = self._one_by_one(field, column, records, exc)
            if not field.nullable and columns[field.name].null_count:
                i = columns[field.name].to_pylist().index(None)
                raise SparkSchemaError(
                    f"column {field.name!r} is not nullable, but the record at "
                    f"{_where(records[i])} has no value for it",
                    field.name,
                )
        if self._meta:
            columns.update(metadata_arrays(records, self.metadata_prefix, self._meta, meta))
        return pa.table(columns, self.arrow_schema)

    def build_accepting(
        self, records: Sequence[Record], meta: BatchMetadata | None = None
    ) -> tuple[pa.Table, list[Record], list[tuple[Record, SparkSchemaError]]]:
        """The table of the records that fit, those records, and the others with the reason
        each does not (a poison record fails alone, not its whole batch).

        Records of one message stand or fall together: when one is set aside, so are the
        others, since the message will be delivered again and its committed records would
        then be skipped, the set-aside one with them.
        """
        try:
            return self.build(records, meta), list(records), []
        except SparkSchemaError as exc:
            if len(records) == 1:
                return self.arrow_schema.empty_table(), [], [(records[0], exc)]
        rejected: list[tuple[Record, SparkSchemaError]] = []
        for record in records:
            try:
                self.build([record])
            except SparkSchemaError as exc:
                rejected.append((record, exc))
        if not rejected:  # the batch failed as a whole but no record alone: not a record's fault
            return self.build(records, meta), list(records), []
        bad = {(r.stream, r.stream_seq) for r, _ in rejected}
        alone = {id(r) for r, _ in rejected}
        good: list[Record] = []
        for record in records:
            if (record.stream, record.stream_seq) not in bad:
                good.append(record)
            elif id(record) not in alone:
                rejected.append(
                    (record, SparkSchemaError("another record of its message does not fit"))
                )
        return self.build(good) if good else self.arrow_schema.empty_table(), good, rejected

    @staticmethod
    def _column(values: list[Any], name: str, records: Sequence[Record]) -> list[Any]:
        # The usual batch holds one kind of value: one type check for the batch, then a plain
        # comprehension per column (this is per record and per field, the table's main cost).
        kinds = {type(v) for v in values}
        if len(kinds) == 1:
            (kind,) = kinds
            if issubclass(kind, dict):
                return [v.get(name) for v in values]
            if attrs.has(kind):
                return [getattr(v, name, None) for v in values]
        column = []
        for value, record in zip(values, records, strict=True):
            if isinstance(value, dict):
                column.append(value.get(name))
            elif attrs.has(type(value)):
                column.append(getattr(value, name, None))
            else:
                raise SparkSchemaError(
                    f"the record at {_where(record)} is a {type(value).__name__}, not an attrs "
                    "instance or a dict (decode the payload with a map, or pass decode=)"
                )
        return column

    @staticmethod
    def _one_by_one(
        field: pa.Field, column: list[Any], records: Sequence[Record], exc: BaseException
    ) -> pa.Array:
        """The column converted a value at a time, after the whole failed: the first record
        whose value does not fit is a :class:`SparkSchemaError` naming it. If each fits alone
        (values that only clash together, such as floats beside ints too large for a double),
        the column is made of them."""
        arrays = []
        for value, record in zip(column, records, strict=True):
            try:
                arrays.append(exact_array([value], field.type))
            except _UNFIT as one:
                raise SparkSchemaError(
                    f"column {field.name!r} ({field.type}): the record at {_where(record)} "
                    f"has {value!r} ({type(value).__name__}): {one}",
                    field.name,
                ) from one
        if not arrays:
            raise SparkSchemaError(f"column {field.name!r} ({field.type}): {exc}", field.name)
        return pa.concat_arrays(arrays)


def _where(record: Record) -> str:
    return f"{record.stream} #{record.stream_seq}"
