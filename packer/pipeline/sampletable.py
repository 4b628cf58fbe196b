"""The client's per-file and per-sample records in columns: a few buffers however many there are.

From the pixel pass to the manifest the client holds one record per sample: its key and
ref, where its bytes sit in the spill files, its shape and its content hashes. As objects
(:class:`~packer.records.SpilledSample`, its :class:`~packer.records.SampleRef` and their
strings) a record costs about 1 KB in a dozen small allocations, and CPython keeps the arenas
of freed ones whenever a long-lived object pins them (``benchmarks/RESULTS.md``, "Packing
memory at 100k samples"), so the client grew by 1.2 KB a sample. Discovery's refs, alive
through the whole pixel pass, added as much again. A :class:`SampleTable` (and a
:class:`RefTable` for refs) keeps the same records in about 300 bytes a sample and holds no
Python object per record, not even per distinct value, so nothing it keeps pins the arenas
of the objects it was built from:

- text that differs from record to record (key, id, relpath, time) in one UTF-8 buffer per
  field with end offsets; content digests (sha256, meta_sha256, stored_digest) as their raw
  bytes at one width (:class:`_Digests`); a path as the code of the root it starts with,
  followed by its relpath (:class:`_Prefixed`); each back to text where a value does not fit;
- fields with few distinct values (source, kind, label, entity, extra, spill file, shape,
  dtype) as int32 codes into a text column of those values, decoded when read;
- numbers (offset, sizes, signature rows) in numpy arrays.

A table is a ``Sequence`` of its records: an item is built when it is read, so code written
for a list of records works unchanged. The client's loops over every record (split, audit,
shard planning, index) read whole fields with :meth:`column`, :meth:`codes` and :meth:`array`
instead. A table pickles as its buffers, which is how chunk and shard tasks carry theirs.
"""

from __future__ import annotations

import json
import operator
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar, overload

import numpy as np

from packer.records import REF_FIELDS, SampleRef, SpilledSample

R = TypeVar("R")


@dataclass(frozen=True, eq=False, slots=True)
class _Text:
    """Row ``i`` is ``data[ends[i - 1]:ends[i]]`` decoded, or None where ``null[i]``."""

    data: bytes
    ends: np.ndarray   # int64, end offset of each row
    null: np.ndarray   # bool

    @classmethod
    def of(cls, values: Sequence[str | None]) -> _Text:
        encoded = [b"" if v is None else v.encode() for v in values]
        ends = np.cumsum(np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded)))
        return cls(b"".join(encoded), ends, np.fromiter((v is None for v in values), dtype=bool, count=len(values)))

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        """Bytes the column holds (text, offsets, null flags)."""
        return len(self.data) + self.ends.nbytes + self.null.nbytes

    def starts(self) -> np.ndarray:
        starts = np.zeros_like(self.ends)
        starts[1:] = self.ends[:-1]
        return starts

    def get(self, i: int) -> str | None:
        if self.null[i]:
            return None
        start = int(self.ends[i - 1]) if i else 0
        return self.data[start:int(self.ends[i])].decode()

    def values(self) -> list[str | None]:
        data = self.data
        return [None if null else data[start:end].decode()
                for start, end, null in zip(self.starts().tolist(), self.ends.tolist(), self.null.tolist(),
                                            strict=True)]

    @classmethod
    def concat(cls, parts: Sequence[_Text]) -> _Text:
        shifts = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        return cls(b"".join(p.data for p in parts), np.concatenate([p.ends + shift for p, shift in zip(parts, shifts,
                   strict=True)]), np.concatenate([p.null for p in parts]))

    def take(self, rows: np.ndarray) -> _Text:
        if 4 * len(rows) >= len(self.ends) > 0:
            return self._take_many(rows)
        # the starts of the rows taken only: a whole column's starts per take made slicing a
        # 100k-record table into chunks quadratic
        ends, data = self.ends[rows], self.data
        starts = np.where(rows > 0, self.ends[np.maximum(rows - 1, 0)], 0) if len(self.ends) else ends
        joined = b"".join([data[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)])
        return _Text(joined, np.cumsum(ends - starts, dtype=np.int64), self.null[rows])

    def _take_many(self, rows: np.ndarray) -> _Text:
        """:meth:`take` of a large share of the rows (a whole table's reordering): gathered by
        Arrow, without the Python ``bytes`` object per row the short path makes (10M of them
        per field sorting a 10M-record table)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        taken = pc.take(_arrow_large(self), pa.array(rows, pa.int64()))
        _, offsets, data = taken.buffers()
        ends = np.frombuffer(offsets, dtype=np.int64, count=len(taken) + 1, offset=8 * taken.offset)
        begin = int(ends[0])
        joined = data.to_pybytes()[begin:int(ends[-1])] if data is not None else b""
        return _Text(joined, ends[1:] - begin, self.null[rows])

    def slice(self, start: int, stop: int) -> _Text:
        """Rows ``start`` to ``stop`` (0 <= start <= stop <= len), copied out of the buffers."""
        begin = int(self.ends[start - 1]) if start else 0
        end = int(self.ends[stop - 1]) if stop > start else begin
        return _Text(self.data[begin:end], self.ends[start:stop] - begin, self.null[start:stop].copy())


_HEXCHARS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex_chars(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The lower-case hex of bytes ``raw`` (uint8, any shape: its last axis doubles) as ASCII
    codes (uint8), made in numpy, written into ``out`` where given."""
    chars = np.empty((*raw.shape[:-1], 2 * raw.shape[-1]), dtype=np.uint8) if out is None else out
    chars[..., 0::2], chars[..., 1::2] = _HEXCHARS[raw >> 4], _HEXCHARS[raw & 0x0F]
    return chars


@dataclass(frozen=True, eq=False, slots=True)
class _Digests:
    """A text field of lower-case hex digests, kept as their raw bytes: row ``i`` is
    ``raw[i * width:(i + 1) * width].hex()``, or None where ``null[i]``, or ``""`` where
    ``empty[i]`` (such rows hold zero bytes of ``raw``' width). Half the bytes of the hex text
    and no end offsets: a sample's ``sha256`` and ``meta_sha256`` were 146 of its ~390 bytes
    on the client. A field whose values are not all such digests is a :class:`_Text`
    (:class:`TableBuilder` decides)."""

    raw: bytes
    width: int
    null: np.ndarray    # bool
    empty: np.ndarray   # bool

    def __len__(self) -> int:
        return len(self.null)

    @property
    def nbytes(self) -> int:
        """Bytes the column holds (digests, missing and empty flags)."""
        return len(self.raw) + self.null.nbytes + self.empty.nbytes

    def get(self, i: int) -> str | None:
        if self.null[i]:
            return None
        if self.empty[i]:
            return ""
        return self.raw[i * self.width:(i + 1) * self.width].hex()

    def values(self) -> list[str | None]:
        return self.as_text().values()

    def as_text(self) -> _Text:
        """The same rows as hex text (made in numpy, no Python object per row)."""
        chars = hex_chars(np.frombuffer(self.raw, dtype=np.uint8).reshape(len(self), self.width))
        held = ~(self.null | self.empty)
        lengths = np.where(held, 2 * self.width, 0).astype(np.int64)
        return _Text(chars[held].tobytes(), np.cumsum(lengths), self.null.copy())

    def take(self, rows: np.ndarray) -> _Digests:
        raw = np.frombuffer(self.raw, dtype=np.uint8).reshape(len(self), self.width)
        return _Digests(raw[rows].tobytes(), self.width, self.null[rows], self.empty[rows])

    def slice(self, start: int, stop: int) -> _Digests:
        return _Digests(self.raw[start * self.width:stop * self.width], self.width, self.null[start:stop].copy(),
                        self.empty[start:stop].copy())

    @staticmethod
    def concat(parts: Sequence[_Digests | _Text]) -> _Digests | _Text:
        """One column of ``parts``' rows: digests where every part holds digests of one width (a
        part of only missing or empty rows takes any width), text otherwise."""
        digests = [p for p in parts if isinstance(p, _Digests)]
        if parts and len(digests) == len(parts):
            widths = {p.width for p in digests if p.held()}
            if len(widths) <= 1:
                width = next(iter(widths)) if widths else max(p.width for p in digests)
                return _Digests(b"".join(p.raw if p.width == width else bytes(width * len(p)) for p in digests), width,
                                np.concatenate([p.null for p in digests]), np.concatenate([p.empty for p in digests]))
        return _Text.concat([_text_of(p) for p in parts])

    def held(self) -> bool:
        """Whether any row holds a digest (not missing, not empty)."""
        return bool(len(self)) and not bool((self.null | self.empty).all())


@dataclass(frozen=True, eq=False, slots=True)
class _Prefixed:
    """A text field whose every row is one of a few prefixes followed by the row's value of
    another text field ``of`` (a path: its source's root, then its relpath): the prefix's code
    per row. The rows' text is made from both fields when read (:meth:`_Columns._text`)."""

    codes: np.ndarray   # int32
    prefixes: _Text
    of: str

    def __len__(self) -> int:
        return len(self.codes)

    @property
    def nbytes(self) -> int:
        """Bytes the column holds (codes and prefixes)."""
        return self.codes.nbytes + self.prefixes.nbytes

    def take(self, rows: np.ndarray) -> _Prefixed:
        return _Prefixed(self.codes[rows], self.prefixes, self.of)

    def slice(self, start: int, stop: int) -> _Prefixed:
        return _Prefixed(self.codes[start:stop].copy(), self.prefixes, self.of)

    def joined(self, follow: _Text) -> _Text:
        """The rows' text: each row's prefix, then its value of ``follow`` (the field ``of``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        prefix = _arrow_large(self.prefixes).take(pa.array(self.codes, pa.int32()))
        joined = pc.binary_join_element_wise(prefix, _arrow_large(follow), pa.scalar("", pa.large_string()))
        _, offsets, data = joined.buffers()
        ends = np.frombuffer(offsets, dtype=np.int64, count=len(joined) + 1, offset=8 * joined.offset)
        begin = int(ends[0]) if len(ends) else 0
        text = data.to_pybytes()[begin:int(ends[-1])] if data is not None and len(joined) else b""
        return _Text(text, ends[1:] - begin, np.zeros(len(self), dtype=bool))


Column = _Text | _Digests | _Prefixed


def _text_of(column: _Text | _Digests) -> _Text:
    """A text field as :class:`_Text`, whichever way it is kept."""
    return column.as_text() if isinstance(column, _Digests) else column


def _unjoined(column: Column) -> _Text | _Digests:
    """A column of a field that is never kept joined (:attr:`_Columns.JOINED`)."""
    if isinstance(column, _Prefixed):
        raise TypeError(f"a field joined to {column.of!r} taken for a plain text field")
    return column


def _concat_text(parts: Sequence[_Text | _Digests]) -> _Text | _Digests:
    """One text column of ``parts``' rows (digests where they all are, :meth:`_Digests.concat`)."""
    if any(isinstance(p, _Digests) for p in parts):
        return _Digests.concat(parts)
    return _Text.concat(parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Codec:
    """How a coded field's distinct values are written as text and read back."""

    encode: Callable[[Any], str | None]
    decode: Callable[[str | None], Any]


_AS_TEXT = _Codec(lambda value: value, lambda text: text)
_SHAPE = _Codec(lambda shape: ",".join(map(str, shape)),
                lambda text: tuple(int(d) for d in text.split(",")) if text else ())
_PAIRS = _Codec(lambda pairs: json.dumps(pairs), lambda text: tuple(tuple(p) for p in json.loads(text or "[]")))


@dataclass(frozen=True, eq=False, slots=True)
class _Coded:
    """Row ``i`` is the ``codes[i]``-th distinct value, kept as text in ``values``."""

    codes: np.ndarray  # int32
    values: _Text
    codec: str         # a key of _CODECS

    def distinct(self) -> tuple[Any, ...]:
        decode = _CODECS[self.codec].decode
        return tuple(decode(text) for text in self.values.values())

    def take(self, rows: np.ndarray) -> _Coded:
        return _Coded(self.codes[rows], self.values, self.codec)


_CODECS = {"text": _AS_TEXT, "shape": _SHAPE, "pairs": _PAIRS}


class _Columns(Generic[R], Sequence[R]):
    """Records of one dataclass type in columns; subclasses name the fields and build a record."""

    TEXT: ClassVar[tuple[str, ...]]
    DIGESTS: ClassVar[tuple[str, ...]] = ()  # text fields kept as raw digests where every value is one (_Digests)
    JOINED: ClassVar[dict[str, str]] = {}  # field -> the field its values end with: prefix codes (_Prefixed)
    CODED: ClassVar[dict[str, str]]    # field -> codec
    NUMBERS: ClassVar[dict[str, str]]  # field -> array typecode ("q" int64, "Q" uint64)

    def __init__(self, size: int, text: dict[str, Column], coded: dict[str, _Coded],
                 numbers: dict[str, np.ndarray]) -> None:
        self.size, self.text, self.coded, self.numbers = size, text, coded, numbers

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return (*cls.TEXT, *cls.CODED, *cls.NUMBERS)

    @staticmethod
    def _field(record: R, name: str) -> Any:
        raise NotImplementedError

    @staticmethod
    def _record(row: dict[str, Any]) -> R:
        raise NotImplementedError

    @classmethod
    def _getter(cls, name: str) -> Callable[[R], Any]:
        """A function that reads field ``name`` of a record (:meth:`_field`, bound to it)."""
        field = cls._field
        return lambda record: field(record, name)

    @classmethod
    def of(cls, records: Iterable[R]) -> Self:
        """A table of ``records``, in their order."""
        builder = TableBuilder(cls)
        builder.extend(records)
        return builder.finish(release=True)

    @classmethod
    def concat(cls, tables: Sequence[Self]) -> Self:
        """One table of ``tables``' records, in order (coded fields' distinct values merged)."""
        if len(tables) == 1:
            return tables[0]
        if not tables:
            return cls.of(())
        text: dict[str, Column] = {
            name: _concat_text([_unjoined(t.text[name]) for t in tables]) if name not in cls.JOINED
            else cls._concat_joined(tables, name) for name in cls.TEXT}
        coded: dict[str, _Coded] = {}
        for name, codec in cls.CODED.items():
            values: dict[str | None, int] = {}
            parts = []
            for table in tables:
                column = table.coded[name]
                remap = np.array([values.setdefault(v, len(values)) for v in column.values.values()], dtype=np.int32)
                parts.append(remap[column.codes] if len(remap) else column.codes)
            coded[name] = _Coded(np.concatenate(parts), _Text.of(list(values)), codec)
        numbers = {name: np.concatenate([t.numbers[name] for t in tables]) for name in cls.NUMBERS}
        return cls(sum(t.size for t in tables), text, coded, numbers)

    @staticmethod
    def _concat_joined(tables: Sequence[_Columns[Any]], name: str) -> Column:
        """A joined field of ``tables``: prefix codes where every table keeps it so (prefixes
        merged), text otherwise."""
        columns = [t.text[name] for t in tables]
        if not all(isinstance(c, _Prefixed) for c in columns):
            return _Text.concat([t._text(name) for t in tables])
        values: dict[str | None, int] = {}
        parts = []
        for column in columns:
            assert isinstance(column, _Prefixed)
            remap = np.array([values.setdefault(v, len(values)) for v in column.prefixes.values()], dtype=np.int32)
            parts.append(remap[column.codes] if len(remap) else column.codes)
        return _Prefixed(np.concatenate(parts), _Text.of(list(values)), tables[0].JOINED[name])

    def _text(self, name: str) -> _Text:
        """Text field ``name`` as :class:`_Text`, however it is kept."""
        column = self.text[name]
        if isinstance(column, _Prefixed):
            return column.joined(self._text(column.of))
        return _text_of(column)

    def field_text(self, name: str) -> _Text:
        """Text field ``name``'s rows as one UTF-8 buffer with end offsets and null flags: the
        column itself where it is kept so (the same object every call), made for the call where
        it is kept as digests or prefix codes."""
        return self._text(name)

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        """Tables of the same type are equal when they hold equal records in the same order."""
        if type(other) is not type(self):
            return NotImplemented
        return list(self) == list(other)  # type: ignore[arg-type]

    __hash__ = None  # type: ignore[assignment]  # compared by content, like a list, so not hashable

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.size, self.text, self.coded, self.numbers))

    @overload
    def __getitem__(self, index: int) -> R: ...

    @overload
    def __getitem__(self, index: slice) -> Self: ...

    def __getitem__(self, index: int | slice) -> R | Self:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.size)
            if step == 1:
                return self._slice(start, max(start, stop))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        i = operator.index(index)
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError(f"record {index} of a table of {self.size}")
        return self._record({name: self._get(name, i) for name in self.fields()})

    def __iter__(self) -> Iterator[R]:
        names = self.fields()
        for row in zip(*(self.column(name) for name in names), strict=True):
            yield self._record(dict(zip(names, row, strict=True)))

    def _get(self, name: str, i: int) -> Any:
        if name in self.text:
            column = self.text[name]
            if isinstance(column, _Prefixed):
                return f"{column.prefixes.get(int(column.codes[i]))}{self._get(column.of, i)}"
            return column.get(i)
        if name in self.coded:
            coded = self.coded[name]
            return _CODECS[coded.codec].decode(coded.values.get(int(coded.codes[i])))
        return int(self.numbers[name][i])

    def value(self, name: str, i: int) -> Any:
        """Field ``name`` of record ``i`` (0 <= i < len), without building the record."""
        return self._get(name, i)

    def column(self, name: str) -> list[Any]:
        """Every record's value of field ``name``, in order, as a list."""
        if name in self.text:
            return self._text(name).values()
        if name in self.coded:
            column = self.coded[name]
            if 4 * len(column.codes) >= len(column.values):
                codes, distinct = self.codes(name)
                return [distinct[c] for c in codes.tolist()]
            # a few rows taken from a table of many distinct values (a shard's samples, whose
            # signatures and cells are nearly all distinct): decode only the values they use
            used, inverse = np.unique(column.codes, return_inverse=True)
            decode = _CODECS[column.codec].decode
            texts = [decode(column.values.get(int(code))) for code in used.tolist()]
            return [texts[i] for i in inverse.tolist()]
        if name in self.numbers:
            return self.numbers[name].tolist()  # type: ignore[no-any-return]
        raise KeyError(f"no field {name!r}; fields: {', '.join(self.fields())}")

    def codes(self, name: str) -> tuple[np.ndarray, tuple[Any, ...]]:
        """(int32 code per record, the distinct values) of a field with few distinct values."""
        column = self.coded[name]
        return column.codes, column.distinct()

    def array(self, name: str) -> np.ndarray:
        """A numeric field as a numpy array (int64); do not modify it."""
        return self.numbers[name]

    def arrow(self, name: str) -> Any:
        """Field ``name`` as a ``pyarrow`` array (int64/uint64 for numbers). A text or coded field
        is ``string``, or ``large_string`` where its rows hold more text together than one string
        array can (:data:`packer.manifest.STRING_MAX_BYTES`, 2 GiB: ~100M keys), built from the
        buffers without a Python object per record; Arrow's compute functions (sort, dictionary
        encode, compare) take both."""
        import pyarrow as pa

        if name in self.numbers:
            return pa.array(self.numbers[name])
        if name in self.text:
            return _arrow_strings(self._text(name))
        codes, values, size = self.coded_text(name)   # size: the taken rows' text, not the values'
        return (values.cast(pa.large_string()) if _is_large(size) else values).take(pa.array(codes))

    def coded_text(self, name: str) -> tuple[np.ndarray, Any, int]:
        """A text field with few distinct values as (the int32 code of each record, the distinct
        values as a ``pyarrow`` string array, the bytes of text the records hold together): for
        taking some rows' values (``values.take(codes[rows])``) without a whole column's text."""
        column = self.coded[name]
        if column.codec != "text":
            raise TypeError(f"field {name!r} holds {column.codec} values, not text")
        lengths = np.diff(column.values.ends, prepend=np.int64(0))
        size = int(lengths[column.codes].sum()) if len(column.codes) else 0
        return column.codes, _arrow_strings(column.values), size

    def order_by(self, names: Sequence[str]) -> np.ndarray:
        """The rows (int64) in the order of their values of text fields ``names``, the first
        deciding, then the next; a missing value (None) sorts as the empty string. The order is
        Python's order of those values as ``str`` tuples (code point order, which is the UTF-8
        bytes' order, in which Arrow sorts them: no Python object per record); rows of equal
        values keep their order."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.size:
            return np.zeros(0, dtype=np.int64)
        columns = {}
        for name in names:
            if name in self.text:
                columns[name] = _arrow_large(self._text(name))
            elif name in self.coded and self.coded[name].codec == "text":
                column = self.coded[name]
                columns[name] = _arrow_large(column.values).take(pa.array(column.codes))
            else:
                raise TypeError(f"order_by: field {name!r} is not a text field; text fields: "
                                f"{', '.join(n for n in self.fields() if n in self.text or n in self.coded)}")
        order = pc.sort_indices(pa.table(columns), sort_keys=[(name, "ascending") for name in names])
        return order.to_numpy().astype(np.int64, copy=False)

    def text_bytes(self, name: str) -> tuple[bytes, np.ndarray]:
        """Text field ``name``'s UTF-8 buffer and each row's end offset in it (int64; row ``i``
        starts where row ``i - 1`` ends, row 0 at 0; a missing value is the empty string): for
        code that reads rows' text as bytes without a ``str`` per record. Do not modify them (a
        digest field's and a path's are made for the call: :meth:`digests` reads a digest
        field's raw bytes)."""
        text = self._text(name)
        return text.data, text.ends

    def digests(self, name: str) -> _Digests | None:
        """Text field ``name`` as raw digests (its rows' bytes at a fixed width, and which rows are
        missing or empty) where it is kept so, else None (then :meth:`text_bytes` reads it)."""
        column = self.text[name]
        return column if isinstance(column, _Digests) else None

    def _slice(self, start: int, stop: int) -> Self:
        return type(self)(stop - start, {n: c.slice(start, stop) for n, c in self.text.items()},
                          {n: _Coded(c.codes[start:stop].copy(), c.values, c.codec) for n, c in self.coded.items()},
                          {n: a[start:stop].copy() for n, a in self.numbers.items()})

    def take(self, rows: Sequence[int] | np.ndarray, *, release: bool = False) -> Self:
        """The records at ``rows`` (indices, in that order) as a new table. With ``release=True``
        this table gives its fields up as the new one is made, each freed once copied (the client
        holds one table and one field, not two tables), and is left an empty table; use it where
        nothing else reads this table afterwards."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < -self.size or index.max() >= self.size):
            raise IndexError(f"rows outside a table of {self.size} records")
        index = np.where(index < 0, index + self.size, index)
        if not release:
            return type(self)(int(index.size), {n: c.take(index) for n, c in self.text.items()},
                              {n: c.take(index) for n, c in self.coded.items()},
                              {n: a[index] for n, a in self.numbers.items()})
        text, coded, numbers = {}, {}, {}
        for name in list(self.text):
            text[name] = self.text.pop(name).take(index)
        for name in list(self.coded):
            coded[name] = self.coded.pop(name).take(index)
        for name in list(self.numbers):
            numbers[name] = self.numbers.pop(name)[index]
        self.size = 0
        empty = np.zeros(0, dtype=np.int64)
        self.text = {name: _Text(b"", empty, np.zeros(0, dtype=bool)) for name in text}
        self.coded = {name: _Coded(np.zeros(0, dtype=np.int32), column.values, column.codec)
                      for name, column in coded.items()}
        self.numbers = {name: np.zeros(0, dtype=values.dtype) for name, values in numbers.items()}
        return type(self)(int(index.size), text, coded, numbers)


def _arrow_large(text: _Text) -> Any:
    """``text`` as a ``pyarrow`` large_string array over its buffer (int64 offsets: any size;
    a null row reads as the empty string it is stored as, :attr:`_Text.null` says which)."""
    import pyarrow as pa

    offsets = np.zeros(len(text) + 1, dtype=np.int64)
    offsets[1:] = text.ends
    return pa.LargeStringArray.from_buffers(len(text), pa.py_buffer(offsets), pa.py_buffer(text.data))


def _is_large(size: int) -> bool:
    """Whether ``size`` bytes of text need a ``large_string`` array (:func:`packer.manifest.text_type`)."""
    import pyarrow as pa

    from packer.manifest import text_type

    return bool(pa.types.is_large_string(text_type(size)))


def _arrow_strings(text: _Text, *, large: bool = False) -> Any:
    """``text`` as a ``pyarrow`` string array over its buffer (nulls where :attr:`_Text.null`
    says), or ``large_string`` where ``large`` or where its text passes what a string array's
    int32 offsets reach (:data:`packer.manifest.STRING_MAX_BYTES`)."""
    import pyarrow as pa

    offsets = np.zeros(len(text) + 1, dtype=np.int64)
    offsets[1:] = text.ends
    validity = pa.py_buffer(np.packbits(~text.null, bitorder="little")) if text.null.any() else None
    if not large and not _is_large(int(offsets[-1])):
        return pa.StringArray.from_buffers(len(text), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(text.data),
                                           validity)
    return pa.LargeStringArray.from_buffers(len(text), pa.py_buffer(offsets), pa.py_buffer(text.data), validity)


class RefTable(_Columns[SampleRef]):
    """Discovery's refs in columns (see the module's docstring)."""

    TEXT = ("sample_id", "path", "relpath", "time")
    JOINED = {"path": "relpath"}  # a path is its root, then its relpath
    CODED = {"source": "text", "kind": "text", "label": "text", "entity": "text", "extra": "pairs",
             "maybe_label_map": "text"}
    NUMBERS: ClassVar[dict[str, str]] = {}

    @staticmethod
    def _field(record: SampleRef, name: str) -> Any:
        return getattr(record, name)

    @classmethod
    def _getter(cls, name: str) -> Callable[[SampleRef], Any]:
        return operator.attrgetter(name)

    @staticmethod
    def _record(row: dict[str, Any]) -> SampleRef:
        return SampleRef(**row)


class SampleTable(_Columns[SpilledSample]):
    """The pixel pass's sample records in columns (see the module's docstring)."""

    TEXT = ("key", "sample_id", "path", "relpath", "time", "sha256", "meta_sha256", "stored_digest", "instance")
    DIGESTS = ("sha256", "meta_sha256", "stored_digest")
    JOINED = {"path": "relpath"}  # a path is its root, then its relpath
    CODED = {"source": "text", "kind": "text", "label": "text", "entity": "text", "extra": "pairs",
             "maybe_label_map": "text", "spill": "text", "shape": "shape", "dtype": "text", "signature": "text"}
    NUMBERS = {"offset": "q", "pixel_bytes": "q", "meta_bytes": "q", "sig_row": "q", "mask_bytes": "q",
               "pixels_xxh3": "Q", "blank": "q"}

    @staticmethod
    def _field(record: SpilledSample, name: str) -> Any:
        return getattr(record.ref, name) if name in REF_FIELDS else getattr(record, name)

    @classmethod
    def _getter(cls, name: str) -> Callable[[SpilledSample], Any]:
        return operator.attrgetter(f"ref.{name}" if name in REF_FIELDS else name)

    @staticmethod
    def _record(row: dict[str, Any]) -> SpilledSample:
        ref = SampleRef(**{name: row.pop(name) for name in list(row) if name in REF_FIELDS})
        return SpilledSample(ref=ref, **{**row, "blank": bool(row["blank"])})

    @property
    def nbytes(self) -> np.ndarray:
        """Spilled bytes of each sample (pixels + metadata + mask), int64."""
        return self.numbers["pixel_bytes"] + self.numbers["meta_bytes"] + self.numbers["mask_bytes"]

    def sorted_by_key(self, *, release: bool = False) -> SampleTable:
        """The records ordered by key, as ``sorted()`` orders the keys as ``str`` (code point
        order, which is the UTF-8 bytes' order, in which Arrow sorts them: no Python object per
        record). With ``release=True`` this table gives its fields up as the sorted table is made,
        each freed once copied (the client holds one table and one field, not two tables), and is
        left an empty table; use it where nothing else reads this table afterwards."""
        missing = self.field_text("key").null
        if missing.any():
            raise ValueError(f"sorted_by_key: {int(missing.sum())} records have no key; every sample record "
                             "needs one (its reader's key)")
        return self.take(self.order_by(["key"]), release=release)


T = TypeVar("T", bound=_Columns[Any])


class _DigestBuffer:
    """A digest field's rows as :class:`TableBuilder` appends them: raw bytes at one width (see
    :class:`_Digests`) for as long as every value is lower-case hex of that width, None or ``""``."""

    __slots__ = ("raw", "null", "empty", "width", "zero")

    def __init__(self) -> None:
        self.raw, self.null, self.empty = bytearray(), bytearray(), bytearray()
        self.width, self.zero = 0, b""

    def append(self, value: str | None) -> bool:
        """Append ``value``; False (and nothing appended) when it is not a digest of this width."""
        if value is None or value == "":
            self.raw += self.zero
            self.null.append(value is None)
            self.empty.append(value is not None)
            return True
        try:
            raw = bytes.fromhex(value)
        except (TypeError, ValueError):
            return False
        if 2 * len(raw) != len(value) or raw.hex() != value:  # spaces or upper case: not as hex() writes it
            return False
        if len(raw) != self.width:
            if self.width:
                return False
            self.width, self.zero = len(raw), bytes(len(raw))
            self.raw += bytes(self.width * len(self.null))  # the missing and empty rows before the first digest
        self.raw += raw
        self.null.append(False)
        self.empty.append(False)
        return True

    def column(self) -> _Digests:
        return _Digests(bytes(self.raw), self.width, np.frombuffer(self.null, dtype=np.uint8).astype(bool),
                        np.frombuffer(self.empty, dtype=np.uint8).astype(bool))

    def as_text(self) -> tuple[bytearray, array[int], bytearray]:
        """The rows so far as a text field's buffers (data, ends, null)."""
        text = self.column().as_text()
        ends: array[int] = array("q")
        ends.frombytes(text.ends.astype(np.int64).tobytes())
        return bytearray(text.data), ends, bytearray(text.null.astype(np.uint8).tobytes())


class TableBuilder(Generic[T]):
    """Appends records of a table type into growable buffers (no Python object kept per record;
    the distinct values of coded fields are kept until :meth:`finish`)."""

    def __init__(self, kind: type[T]) -> None:
        self._kind = kind
        # each field's reader made once, not looked up per record and field
        self._read = {name: kind._getter(name) for name in kind.fields()}
        self._reset()

    def _reset(self) -> None:
        kind = self._kind
        self._size = 0
        self._text = {name: (bytearray(), array("q"), bytearray()) for name in kind.TEXT
                      if name not in kind.DIGESTS and name not in kind.JOINED}
        self._digests = {name: _DigestBuffer() for name in kind.DIGESTS}
        self._joined: dict[str, tuple[array[int], dict[str, int]]] = {name: (array("i"), {}) for name in kind.JOINED}
        self._codes: dict[str, tuple[array[int], dict[Any, int]]] = {name: (array("i"), {}) for name in kind.CODED}
        self._numbers = {name: array(code) for name, code in kind.NUMBERS.items()}

    def append(self, record: Any) -> None:
        read = self._read
        for name in self._kind.DIGESTS:
            digests = self._digests.get(name)
            if digests is not None and not digests.append(read[name](record)):
                # a value that is no digest of the field's width: the field is text from here on,
                # and this value is appended with the text fields below
                self._text[name] = digests.as_text()
                del self._digests[name]
        for name, of in self._kind.JOINED.items():
            joined = self._joined.get(name)
            if joined is None:
                continue
            value, follow = read[name](record), read[of](record)
            if value is not None and follow is not None and value.endswith(follow):
                codes, seen = joined
                codes.append(seen.setdefault(value[:len(value) - len(follow)], len(seen)))
            else:  # no prefix of the other field's value: the field is text from here on (this value below)
                self._text[name] = self._joined_text(name, of)
                del self._joined[name]
        for name, (data, ends, null) in self._text.items():
            value = read[name](record)
            if value is not None:
                data += value.encode()
            ends.append(len(data))
            null.append(value is None)
        for name, (codes, seen) in self._codes.items():
            codes.append(seen.setdefault(read[name](record), len(seen)))
        for name, numbers in self._numbers.items():
            numbers.append(read[name](record))
        self._size += 1

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.append(record)

    def _joined_text(self, name: str, of: str) -> tuple[bytearray, array[int], bytearray]:
        """Joined field ``name``'s rows so far as a text field's buffers (data, ends, null): each
        row's prefix, then its value of field ``of`` (a text field, its rows so far held)."""
        codes, seen = self._joined[name]
        prefixes = [prefix.encode() for prefix in seen]
        follow, follow_ends, _ = self._text[of]
        data, ends = bytearray(), array("q")
        start = 0
        for code, end in zip(codes, follow_ends, strict=True):
            data += prefixes[code]
            data += follow[start:end]
            ends.append(len(data))
            start = end
        return data, ends, bytearray(len(codes))

    def finish(self, *, release: bool = False) -> T:
        """The table of everything appended so far. The builder can go on appending, unless
        ``release=True``: then each field's buffers are handed over and freed one field at a time
        (the client holds the records once and one field twice, not everything twice), and the
        builder is left empty."""
        kind, size = self._kind, self._size
        text: dict[str, Column] = {}
        for name in kind.TEXT:
            if name in self._joined:
                codes, seen = self._joined.pop(name) if release else self._joined[name]
                text[name] = _Prefixed(np.frombuffer(codes, dtype=np.int32).copy(), _Text.of(list(seen)),
                                       kind.JOINED[name])
                continue
            if name in self._digests:
                text[name] = (self._digests.pop(name) if release else self._digests[name]).column()
                continue
            data, ends, null = self._text.pop(name) if release else self._text[name]
            text[name] = _Text(bytes(data), np.frombuffer(ends, dtype=np.int64).copy(),
                               np.frombuffer(null, dtype=np.uint8).astype(bool))
            del data, ends, null
        coded: dict[str, _Coded] = {}
        for name in list(self._codes):
            codes, seen = self._codes.pop(name) if release else self._codes[name]
            codec = kind.CODED[name]
            coded[name] = _Coded(np.frombuffer(codes, dtype=np.int32).copy(),
                                 _Text.of([_CODECS[codec].encode(v) for v in seen]), codec)
            del codes, seen
        numbers: dict[str, np.ndarray] = {}
        for name in list(self._numbers):
            values = self._numbers.pop(name) if release else self._numbers[name]
            numbers[name] = np.frombuffer(values, dtype=np.uint64 if values.typecode == "Q" else np.int64).copy()
            del values
        if release:
            self._reset()  # empty again: appending starts a new table
        return kind(size, text, coded, numbers)


def as_table(samples: Sequence[SpilledSample]) -> SampleTable:
    """``samples`` as a table (itself when it already is one)."""
    return samples if isinstance(samples, SampleTable) else SampleTable.of(samples)


def sample_schema(samples: SampleTable) -> dict[str, Any]:
    """The manifest's ``sample_schema`` of ``samples``: their dtype, layout and shape (each None
    where they differ), each source's shapes, and each source's dtypes where there are several
    (:func:`several_dtypes`, :func:`several_shapes` warn of those; so does packer validate)."""
    source_codes, sources = samples.codes("source")
    shape_codes, shapes = samples.codes("shape")
    dtype_codes, dtypes_of = samples.codes("dtype")
    by_source: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    pairs = np.unique(np.stack([source_codes, shape_codes], axis=1), axis=0) if len(samples) else ()
    for source, shape in pairs:
        by_source[sources[source]].add(shapes[shape])
    dtypes = {dtypes_of[c] for c in np.unique(dtype_codes).tolist()}
    all_shapes = {s for shapes in by_source.values() for s in shapes}
    schema: dict[str, Any] = {
        "dtype": next(iter(dtypes)) if len(dtypes) == 1 else None,
        "layout": "CDHW" if any(len(shape) == 4 for shape in all_shapes) else "CHW",
        "shape": list(next(iter(all_shapes))) if len(all_shapes) == 1 else None,
        "shapes": {src: sorted(list(s) for s in shapes) for src, shapes in sorted(by_source.items())},
    }
    if len(dtypes) > 1:  # only then: a dataset of one dtype keeps the manifest (and version) it had
        by_dtype: dict[str, set[str]] = defaultdict(set)
        for source, dtype in np.unique(np.stack([source_codes, dtype_codes], axis=1), axis=0):
            by_dtype[sources[source]].add(dtypes_of[dtype])
        schema["dtypes"] = {src: sorted(found) for src, found in sorted(by_dtype.items())}
    return schema


def several_dtypes(schema: Mapping[str, Any]) -> list[str]:
    """A warning for a dataset whose samples have several dtypes (the manifest's
    ``sample_schema.dtypes``): the loader reads one dtype at a time, so such a dataset is read a
    source view at a time. Empty for a dataset of one dtype."""
    dtypes: Mapping[str, list[str]] = schema.get("dtypes") or {}
    if schema.get("dtype") is not None or not dtypes:
        return []
    each = ", ".join(f"{source} {'/'.join(found)}" for source, found in sorted(dtypes.items()))
    return [f"the sources' samples have different dtypes ({each}), which no batch can stack and the loader reads "
            "only one source view of one dtype at a time (ShardDataset(..., sources=[...])); for one dataset give "
            "every kind one output dtype (transform.dicom.output, transform.nifti.output; images are uint8)"]


def several_shapes(schema: Mapping[str, Any]) -> list[str]:
    """Warnings for a dataset whose samples have several shapes (the manifest's
    ``sample_schema``): a batch stacks one shape, and torch's default collate, the README's
    first loader, fails on them with a message that names no sample. One warning per source of
    several shapes, with every setting that makes them one (a channel count, a size, or both:
    the loader's own message names each); where each source has one shape but they differ, one
    warning naming each source's. A collate is offered only where it can load them: ``pad``
    pads the height and width of images of one channel count, and where the dtypes differ too
    (``sample_schema.dtypes``) the loader reads only a source view of one dtype, under any
    collate (:func:`several_dtypes`). Empty for a dataset of one shape."""
    shapes: Mapping[str, list[list[int]]] = schema.get("shapes") or {}
    if schema.get("shape") is not None or len({tuple(s) for listed in shapes.values() for s in listed}) <= 1:
        return []
    dtypes: Mapping[str, list[str]] = (schema.get("dtypes") or {}) if schema.get("dtype") is None else {}
    out = []
    for source, listed in sorted(shapes.items()):
        if len(listed) < 2:
            continue
        fixes = _shape_fixes(listed, "make them one channel count with transform.channels (or the kind's own "
                                     "channels setting: a file whose count cannot be made so becomes a bad_shape "
                                     "sample)", "give the kind a size (transform.<kind>.size) so every sample is "
                                                "resized to it")
        # a collate loads the whole split, or where the dtypes differ, only a view of this source
        names = [source] if dtypes else sorted(shapes)
        loaders = _collates([s for name in names for s in shapes[name]], names, dtypes)
        out.append(f"source {source} packs samples of {len(listed)} shapes ({_shapes_text(listed)}), which no batch "
                   f"can stack: {_either([*fixes, *loaders]) or 'no setting makes them one shape'}")
    if not out:
        each = ", ".join(f"{source} {_shapes_text(listed)}" for source, listed in sorted(shapes.items()))
        every = [s for listed in shapes.values() for s in listed]
        fixes = _shape_fixes(every, "make them one channel count with transform.channels", "give every source one size")
        # mixed dtypes: the whole split loads under no collate, so a collate is offered only for a view
        # of one dtype whose sources still differ in shape
        views = ([sorted(src for src in shapes if dtypes.get(src) == [dtype])
                  for dtype in sorted({d for found in dtypes.values() for d in found})] if dtypes else [sorted(shapes)])
        loaders = [fix for names in views for fix in _collates([s for n in names for s in shapes[n]], names, dtypes)]
        of_dtype = ", ".join(f"{source} {'/'.join(found)}" for source, found in sorted(dtypes.items()))
        dtyped = f", and their dtypes differ too ({of_dtype}), so no collate loads the whole split" if of_dtype else ""
        out.append(f"the sources' samples have different shapes ({each}), which no batch can stack{dtyped}: "
                   f"{_either(['load one source at a time (ShardDataset(..., sources=[...]))', *fixes, *loaders])}")
    return out


def _shape_fixes(shapes: Sequence[Sequence[int]], channels: str, size: str) -> list[str]:
    """The settings that make ``shapes`` one: ``channels`` where their channel counts differ and
    a size where their sizes do, both where both do (one alone leaves them unstackable); a
    volume's size is ``sample: {volume: {size}}`` (``transform.<kind>.size`` is refused there).
    None where volumes meet 2-D samples: no setting makes those one shape."""
    if len({len(s) for s in shapes}) > 1:
        return []
    fixes = [channels] if len({s[0] for s in shapes}) > 1 else []
    if len({tuple(s[1:]) for s in shapes}) > 1:
        fixes.append("give the volumes one size with sample: {volume: {size: [D, H, W]}} (under transform.<kind>) "
                     "so every volume is cropped or padded to it" if len(shapes[0]) == 4 else size)
    return fixes


def _collates(shapes: Sequence[Sequence[int]], sources: Sequence[str], dtypes: Mapping[str, list[str]]) -> list[str]:
    """The collates that load samples of ``shapes`` from ``sources`` together: ``list`` always,
    ``pad`` only for C×H×W images of one channel count (it pads height and width alone); where
    the dataset's dtypes differ (``dtypes``, each source's), only through a view of these
    sources, and none where they are not of one dtype (the loader refuses them under any)."""
    if len({tuple(s) for s in shapes}) < 2:
        return []
    chosen = {dtype for source in sources for dtype in dtypes.get(source, ())}
    if dtypes and len(chosen) != 1:
        return []
    view = ("" if not dtypes else
            f" a view of one dtype (ShardDataset(..., sources=[{', '.join(repr(s) for s in sources)}]))")
    pad = all(len(s) == 3 for s in shapes) and len({s[0] for s in shapes}) == 1
    return [f'batch{view or " them"} with make_loader(..., collate="list")' + (' or collate="pad"' if pad else "")]


def _either(fixes: Sequence[str]) -> str:
    """``a, b, or c``: the ways out, the last after ``or``."""
    return ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + (fixes[-1] if fixes else "")


def _shapes_text(shapes: Sequence[Sequence[int]], most: int = 4) -> str:
    shown = ", ".join("×".join(str(n) for n in shape) for shape in shapes[:most])
    return shown + (f" and {len(shapes) - most} more" if len(shapes) > most else "")
