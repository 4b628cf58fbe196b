"""Write Parquet shards byte-reproducibly: one row per sample, one row group per shard; read them back.

Columns (documented in the README): key, label,
label_name (null without a class target), entity_id, split, source, shape, dtype, image (raw
C-order bytes, uncompressed so readers can map them straight into tensors), sha256 (of
``image``), metadata (JSON), target (multi-label or numeric datasets only) and target_mask
(masked targets only), see
:func:`shard_schema`).
Writer options are fixed here so the bytes depend only on the data and pyarrow's version.

Reading (:func:`read_parquet_samples`, for packer's loader and HTML report; ``packer verify
--deep`` reads with stock pyarrow as its independent check): chosen rows in record batches,
each image a zero-copy ``np.frombuffer`` view on the batch's Arrow buffer (Arrow copies the
cells once out of the page cache because Parquet stores byte arrays length-prefixed). Where a
damaged page makes a record batch fail, the rows left are salvaged column by column
(:func:`_salvage`): a damaged page costs the rows whose cells it holds, not the row group.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.files import atomic_output, canonical_json, file_sha256
from packer.shards.checksum import (
    parquet_cells_checksum,
)
from packer.shards.encode import EncodedSample
from packer.shards.members import NPY_HEAD, Decoded, SampleDefect, npy_layout
from packer.shards.writer import ShardWrite, WrittenSamples

SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("label", pa.int64(), nullable=False),
    pa.field("label_name", pa.string(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("shape", pa.list_(pa.int32()), nullable=False),
    pa.field("dtype", pa.string(), nullable=False),
    pa.field("image", pa.binary(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),
])

_SMALL_COLUMNS = ["key", "label", "label_name", "entity_id", "split", "source", "dtype", "sha256"]


def shard_schema(*, has_label: bool, target: np.dtype | None, mask: bool = False,
                 target_mask: bool = False) -> pa.Schema:
    """The columns of a shard: :data:`SCHEMA` for a class dataset without masks (its bytes as
    ever); without a class target ``label``/``label_name`` are null; a multi-label or numeric
    dataset adds ``target``, a list of uint8 (multi-hot) or float32 (numbers), as ``.target.npy``
    holds it, and a masked target ``target_mask`` (list<uint8>, 1: use the entry, 0: skip it),
    as ``.target_mask.npy`` holds it; a dataset with masks adds ``mask`` (raw C-order bytes,
    uncompressed like ``image``), ``mask_shape`` and ``mask_dtype``."""
    if has_label and target is None and not mask:
        return SCHEMA
    fields = [pa.field(f.name, f.type, nullable=not has_label) if f.name in ("label", "label_name") else f
              for f in SCHEMA]
    if target is not None:
        fields.append(pa.field("target", pa.list_(pa.from_numpy_dtype(target)), nullable=False))
    if target_mask:
        fields.append(pa.field("target_mask", pa.list_(pa.uint8()), nullable=False))
    if mask:
        fields += [pa.field("mask", pa.binary(), nullable=False),
                   pa.field("mask_shape", pa.list_(pa.int32()), nullable=False),
                   pa.field("mask_dtype", pa.string(), nullable=False)]
    return pa.schema(fields)


def _mask_cells(data: bytes) -> tuple[bytes, list[int], str]:
    """A mask's ``.npy`` bytes (packer's own form) as (raw bytes, shape, dtype name)."""
    layout = npy_layout(data[:NPY_HEAD])
    if layout is None:
        raise ValueError("a mask's .npy bytes are not in packer's own header form")
    dtype, shape, start = layout
    return data[start:], list(shape), dtype.name


def _as_stored(vector: np.ndarray | None, schema: pa.Schema, name: str) -> np.ndarray | None:
    """A target (or target mask) vector in the value type its column stores (what a reader gets back)."""
    if vector is None or name not in schema.names:
        return None
    return np.asarray(vector, dtype=schema.field(name).type.value_type.to_pandas_dtype())


#: The columns written with zstd: the small ones, ``metadata`` and ``mask_dtype``.
_ZSTD_COLUMNS = frozenset([*_SMALL_COLUMNS, "metadata", "mask_dtype"])


def shard_compression(schema: pa.Schema) -> dict[str, str]:
    """Each column's codec as ``pq.write_table`` takes it: by the path Parquet stores the column's
    values under, which for a list column is its leaf (``shape.list.element``; a codec given
    under the column's own name is ignored). zstd for :data:`_ZSTD_COLUMNS`; none for ``image``
    and ``mask`` (raw bytes a reader maps straight into tensors) and for the list columns
    (``shape``, ``target``, ``target_mask``, ``mask_shape``). The list columns were once meant to
    be zstd but were named by their columns' names, so every Parquet shard packer has written
    holds them uncompressed; they stay so, since compressing them would change every shard's bytes."""
    return {f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name:
            "zstd" if field.name in _ZSTD_COLUMNS else "none"
            for field in schema}


def write_parquet_shard(path: Path, samples: Iterable[EncodedSample]) -> ShardWrite:
    """Write ``samples`` as one Parquet file at ``path``; return its size, sha256 and, per
    sample, its row number, the size and sha256 of its ``image`` cell and the checksum of the
    cells the loader decodes (:func:`packer.shards.checksum.parquet_cells_checksum`). The samples of a
    dataset share one target kind, so the first one decides the schema (:func:`shard_schema`)."""
    columns: dict[str, list] = {name: [] for name in [*SCHEMA.names, "target", "target_mask", "mask", "mask_shape",
                                                       "mask_dtype"]}
    written = WrittenSamples()
    schema = SCHEMA
    for position, sample in enumerate(samples):
        if position == 0:
            schema = shard_schema(has_label=sample.label is not None,
                                  target=sample.target.dtype if sample.target is not None else None,
                                  mask=sample.mask is not None, target_mask=sample.target_mask is not None)
        digest = sample.pixels_sha256
        for name, value in (("key", sample.key), ("label", sample.label), ("label_name", sample.label_name),
                            ("entity_id", sample.entity_id), ("split", sample.split), ("source", sample.source),
                            ("shape", list(sample.shape)), ("dtype", sample.dtype), ("image", sample.pixels),
                            ("sha256", digest), ("metadata", canonical_json(sample.info).decode()),
                            ("target", sample.target), ("target_mask", sample.target_mask)):
            columns[name].append(value)
        mask: tuple[bytes, list[int], str] | tuple[None, None, None] = (None, None, None)
        if sample.mask is not None:
            mask = _mask_cells(sample.mask)
            columns["mask"].append(mask[0])
            columns["mask_shape"].append(mask[1])
            columns["mask_dtype"].append(mask[2])
        cells = {"label": sample.label, "shape": sample.shape, "dtype": sample.dtype, "image": sample.pixels,
                 "metadata": columns["metadata"][-1], "target": _as_stored(sample.target, schema, "target"),
                 "target_mask": _as_stored(sample.target_mask, schema, "target_mask"),
                 "mask": mask[0], "mask_shape": mask[1], "mask_dtype": mask[2]}
        written.add(position=position, size=len(sample.pixels), sha256=bytes.fromhex(digest),
                    checksum=parquet_cells_checksum(sample.key, cells))
    table = pa.Table.from_pydict({name: columns[name] for name in schema.names}, schema=schema)
    with atomic_output(path) as fh:
        pq.write_table(
            table, fh,
            row_group_size=max(1, table.num_rows),
            compression=shard_compression(schema),
            use_dictionary=_SMALL_COLUMNS,
            write_statistics=_SMALL_COLUMNS,
            data_page_version="2.0",
            version="2.6",
        )
    size, sha = file_sha256(path)
    return written.result(file=path.name, size=size, sha256=sha)


# -- reading ------------------------------------------------------------------------------
#: The columns a reader needs to decode a sample (``metadata`` too when it wants the record).
READ_COLUMNS = ["key", "label", "shape", "dtype", "image"]
#: The column of a sample's packed pixels (its name, not a source kind).
IMAGE_COLUMN = "image"
def image_view(data: Any, start: int, end: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Zero-copy view of bytes ``start:end`` of an Arrow buffer as ``dtype``, ``shape``; a copy
    where the bytes are not aligned for ``dtype`` or the buffer is read-only."""
    raw = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
    view = raw.view(dtype) if raw.ctypes.data % dtype.alignment == 0 else raw.copy().view(dtype)
    view = view.reshape(shape)
    return view if view.flags.writeable else view.copy()


def _is_text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _is_bytes(kind: pa.DataType) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _is_list_of(test: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    def check(kind: pa.DataType) -> bool:
        return bool((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and test(kind.value_type))
    return check


def _is_number(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


#: The Arrow types a reader takes for each column it reads (what the column is, and the test): the
#: types packer writes (:func:`shard_schema`) and the same values under the 64-bit-offset
#: ("large") types other Arrow writers, such as polars, use. Anything else (a dictionary, a
#: view type, another value type) would be misread by code that takes the buffers' layout as given.
COLUMN_TYPES: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "key": ("string", _is_text),
    "label": ("an integer", lambda kind: bool(pa.types.is_integer(kind) or pa.types.is_null(kind))),
    "shape": ("a list of integers", _is_list_of(pa.types.is_integer)),
    "dtype": ("string", _is_text),
    "image": ("binary", _is_bytes),
    "metadata": ("string", _is_text),
    "target": ("a list of numbers", _is_list_of(_is_number)),
    "target_mask": ("a list of numbers", _is_list_of(_is_number)),
    "mask": ("binary", _is_bytes),
    "mask_shape": ("a list of integers", _is_list_of(pa.types.is_integer)),
    "mask_dtype": ("string", _is_text),
}


def column_type_problem(schema: pa.Schema, columns: Iterable[str]) -> str | None:
    """Why the Arrow ``schema`` of a Parquet shard does not give ``columns`` the types a reader
    takes (:data:`COLUMN_TYPES`), naming the first such column and its type; None when all do."""
    for name in columns:
        expected = COLUMN_TYPES.get(name)
        kind = schema.field(name).type
        if expected is not None and not expected[1](kind):
            return (f"column {name!r} is {kind}, not {expected[0]} as packer writes it (binary, string and list "
                    "columns may be their large_ variants); the shard was not written by packer or was edited "
                    "after the build: rebuild the dataset or get it again from its source")
    return None


#: The columns whose cells a salvaged read can take from elsewhere (:data:`Recover`)
RECOVERABLE = ("key", "label")
#: Where a column of :data:`RECOVERABLE` does not decode: that column's cells of every row of the
#: shard, by row, from elsewhere (the loader: the shard's rows of ``_index.parquet``), or a
#: sentence saying why they cannot be had
Recover = Callable[[str], Sequence[Any] | str]


def read_parquet_samples(source: Any, rows: Sequence[int], *, expect_rows: int | None = None,
                         records: bool = False, batch_rows: int, checksums: bool = False,
                         recover: Recover | None = None) -> Iterator[tuple[int, Decoded | SampleDefect]]:
    """Exactly one ``(row, Decoded | SampleDefect)`` per row of ``rows`` (ascending) of a Parquet
    shard, in that order, whatever is wrong with the file.

    ``source``: a path, a ``pa.memory_map`` or a seekable binary file. Rows are read in record
    batches of ``batch_rows`` (a held image keeps its whole batch alive); each image is a
    zero-copy view on its batch's Arrow buffer (:func:`image_view`), in the row's dtype and
    shape. ``expect_rows``: the row count the manifest records (another count fails every row
    as ``bad_shard``). ``records``: also read the ``metadata`` column into ``Decoded.record``.
    An image whose bytes do not hold its dtype × shape is a ``bad_sample``; an unreadable file,
    a missing column, a read error or an early end fails the rows not yet read. ``checksums``:
    also hash each row's cells (:mod:`packer.shards.checksum`; the ``metadata`` cell is then
    read too) into ``Decoded.checksum`` (or the ``bad_sample`` defect's ``checksum``).
    ``recover``: with ``checksums`` (which then check every row delivered, its key and label
    included), the ``key`` or ``label`` cells of a shard whose own pages of that column do not
    decode are taken from it (:data:`Recover`), asked only then; without, those rows are lost.
    A column whose Arrow type is not one the reader takes (:func:`column_type_problem`) fails
    every row as ``bad_shard``; ``image`` is read with 32- or 64-bit offsets as its type says.
    """
    columns = READ_COLUMNS + (["metadata"] if records or checksums else [])
    try:
        parquet = pq.ParquetFile(source)
        count = parquet.metadata.num_rows
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        columns += [name for name in ("target", "target_mask", "mask", "mask_shape", "mask_dtype")
                    if name in parquet.schema_arrow.names]
    except (OSError, pa.ArrowException, ValueError) as err:  # ValueError: a footer's name that is not UTF-8
        yield from _fail(rows, "bad_shard", f"not a readable Parquet file ({err})")
        return
    if missing:
        yield from _fail(rows, "bad_shard", f"columns {missing} are missing")
        return
    problem = column_type_problem(parquet.schema_arrow, columns)
    if problem is not None:
        yield from _fail(rows, "bad_shard", problem)
        return
    if expect_rows is not None and count != expect_rows:
        yield from _fail(rows, "bad_shard", f"the file has {count} rows, the manifest says {expect_rows}")
        return
    want = list(rows)
    i = 0
    row0 = 0
    try:
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            end_row = row0 + batch.num_rows
            if i < len(want) and want[i] < end_row:
                keys, labels, shapes, dtypes = (batch.column(n) for n in ("key", "label", "shape", "dtype"))
                metadata = batch.column("metadata") if records or checksums else None
                targets = batch.column("target") if "target" in columns else None
                target_masks = batch.column("target_mask") if "target_mask" in columns else None
                masks = [batch.column(n) for n in ("mask", "mask_shape", "mask_dtype")] if "mask" in columns else None
                images = batch.column("image")
                buffers = images.buffers()
                width = np.int64 if pa.types.is_large_binary(images.type) else np.int32  # large_binary: 64-bit
                offsets = np.frombuffer(buffers[1], dtype=width)[images.offset:images.offset + len(images) + 1]
                while i < len(want) and want[i] < end_row:
                    row, r = want[i], want[i] - row0
                    start, stop = int(offsets[r]), int(offsets[r + 1])
                    shape_cell, dtype_name = shapes[r].as_py(), dtypes[r].as_py()
                    if checksums and (size := _size_of(shape_cell, dtype_name)) not in (None, stop - start):
                        # a damaged cell length that still decodes: it swallowed its neighbours'
                        # bytes (or gave them away), and the rows after it read as other cells
                        raise _Misread(f"row {row}'s image cell holds {stop - start} bytes, its shape and dtype "
                                       f"say {size}")
                    yield row, _row_outcome(
                        keys[r].as_py(), labels[r].as_py(), shape_cell, dtype_name,
                        buffers[2], start, stop,
                        metadata[r].as_py() if metadata is not None else None,
                        _target_cell(targets, r), _target_cell(target_masks, r),
                        [column[r].as_py() for column in masks] if masks is not None else None,
                        records=records, checksums=checksums)
                    i += 1
            row0 = end_row
            if i >= len(want):
                return
    except GeneratorExit:  # closed mid-shard (a reader that stops early, or interpreter exit, when
        raise  # module globals may already be gone: the clause below must not be evaluated then)
    except (OSError, pa.ArrowException, TypeError, ValueError, _Misread) as err:
        # a damaged page (or cell) fails the whole record batch: read the rows left column by
        # column, and each column as far as it decodes, so that only the rows whose cells are
        # lost fail (the per-sample checksum, where asked for, still checks every row delivered)
        yield from _salvage(source, parquet, want[i:], columns, error=f"Parquet read failed at row {row0} ({err})",
                            records=records, checksums=checksums, recover=recover if checksums else None)
        return
    if i < len(want) and row0 < count:
        # the batches ended before the rows the footer counts, with no error: a page pyarrow
        # skipped (a data page header whose type reads as an index page) or took as empty; the
        # file is there to its end, so its columns are read as after any damaged page
        yield from _salvage(source, parquet, want[i:], columns,
                            error=f"Parquet read ended after {row0} of the file's {count} rows, without an error",
                            records=records, checksums=checksums, recover=recover if checksums else None)
        return
    yield from _fail(want[i:], "truncated", f"the file ended after {row0} rows")


class _Misread(ValueError):
    """A record batch decoded, but one of its cells is not what its row says (see the read loop)."""


def _size_of(shape_cell: Any, dtype_name: Any) -> int | None:
    """The bytes a cell of ``shape_cell`` × ``dtype_name`` holds, or None where they do not say."""
    try:
        return math.prod(int(d) for d in shape_cell) * np.dtype(dtype_name).itemsize
    except (TypeError, ValueError):
        return None


def _row_outcome(key: Any, label: Any, shape_cell: Any, dtype_name: Any, data: Any, start: int, stop: int,
                 record: Any, target: np.ndarray | None, target_mask: np.ndarray | None,
                 mask_cells: list[Any] | None, *, records: bool, checksums: bool) -> Decoded | SampleDefect:
    """One row from its cells: the image is bytes ``start:stop`` of ``data`` (a record batch's
    Arrow buffer, viewed without a copy, or a salvaged cell's bytes)."""
    shape = tuple(int(d) for d in shape_cell)
    dtype = np.dtype(dtype_name)
    checksum = None
    if checksums:
        mask, mask_shape, mask_dtype = mask_cells if mask_cells is not None else (None, None, None)
        checksum = parquet_cells_checksum(key, {  # the image straight from the batch's buffer
            "label": label, "shape": shape_cell, "dtype": dtype_name,
            "image": memoryview(data)[start:stop] if data is not None else b"",
            "metadata": record, "target": target, "target_mask": target_mask,
            "mask": mask, "mask_shape": mask_shape, "mask_dtype": mask_dtype})
    if math.prod(shape) * dtype.itemsize != stop - start:
        return SampleDefect("bad_sample", f"{stop - start} image bytes do not hold {dtype} {shape}", key,
                            checksum=checksum)
    return Decoded(key=key, label=None if label is None else int(label),
                   image=image_view(data, start, stop, dtype, shape), record=record if records else None,
                   target=target, mask=_mask_cell(mask_cells), target_mask=target_mask, checksum=checksum)


#: What a salvaged read says about a row it cannot deliver, after what failed
_DAMAGED = ("the shard's bytes changed after the build (disk, copy or cache damage) or it is not the file the build "
            "wrote; restore it from a good copy or rebuild the dataset, and run `packer verify` on the version "
            "folder to name every damaged shard")


def _salvage(source: Any, parquet: pq.ParquetFile, rows: Sequence[int], columns: Sequence[str], *, error: str,
             records: bool, checksums: bool,
             recover: Recover | None = None) -> Iterator[tuple[int, Decoded | SampleDefect]]:
    """Exactly one outcome per row of ``rows`` (ascending) of a file whose record batches no
    longer decode (a damaged page, or a cell that is not what it says): each column is read on
    its own, row by row as far as it decodes (a damaged page of a column the reader does not
    need costs nothing, one of a column it needs costs the rows from the damage on), and, where
    ``checksums`` will check every row delivered, the cells of the uncompressed ``image`` and
    ``mask`` columns that pyarrow does not give at the size their row says (past a damaged page,
    or moved by a damaged length that still decodes) are read from the column chunk's own pages
    (:func:`_plain_cells`), and the ``key`` and ``label`` cells past a damaged page, or past
    where their column ended early without an error, from ``recover`` (given only where the
    checksums check every row delivered). A row whose cells are all there is decoded (and its
    checksum computed) as any other; a row with a cell lost fails ``undecodable`` naming the
    column, the read's ``error`` and what to do."""
    cells: dict[str, list[Any]] = {}
    lost: dict[str, str] = {}  # column -> why its rows from len(cells[column]) on are lost
    for name in columns:
        cells[name] = []
        try:
            for batch in parquet.iter_batches(batch_size=1, columns=[name], use_threads=False):
                cells[name].append(batch.column(0)[0])
        except (OSError, pa.ArrowException) as err:
            lost[name] = f"{err}".strip()
    rows_in_file = parquet.metadata.num_rows
    # the cells of a key or label column that stopped decoding, or ended early without an error (a
    # page pyarrow skipped: its type byte read as an index page's), from elsewhere: every row's
    taken: dict[str, Sequence[Any]] = {}
    for name in (n for n in RECOVERABLE if n in lost or len(cells[n]) < rows_in_file):
        lost.setdefault(name, "ends early")
        got = recover(name) if recover is not None else None
        if got is None:
            continue
        if isinstance(got, str):
            lost[name] += f"; nor could its cells be had elsewhere ({got})"
        elif len(got) != parquet.metadata.num_rows:
            lost[name] += (f"; nor could its cells be had elsewhere ({len(got)} cells for "
                           f"{parquet.metadata.num_rows} rows)")
        else:
            taken[name] = got
    # the uncompressed byte columns (image, mask) from their pages: from row 0, since a damaged
    # length decodes (wrong, and maybe without an error) before the read fails; the pages' own
    # lengths, corrected by each row's shape and dtype, put every cell where it was written. A
    # row takes its cell from there where pyarrow's is not the size its row says.
    raw: dict[str, dict[int, memoryview]] = {}
    sizes: dict[str, dict[int, int]] = {}
    for name, shape_column, dtype_column in ((IMAGE_COLUMN, "shape", "dtype"), ("mask", "mask_shape", "mask_dtype")):
        if checksums and name in cells:
            sizes[name] = _cell_sizes(cells, shape_column, dtype_column)
            raw[name] = _plain_cells(source, name, sizes=sizes[name])

    def cell(name: str, row: int) -> Any:
        """A row's cell of a small column as a Python value: the shard's own, else the one taken."""
        return cells[name][row].as_py() if row < len(cells[name]) else taken[name][row]

    for row in rows:
        missing = [name for name in columns if row >= len(cells[name]) and name not in taken
                   and row not in raw.get(name, ())]
        key = cell("key", row) if row < len(cells["key"]) or "key" in taken else None
        if missing:
            why = "; ".join(f"column {name!r}: {lost.get(name, 'ends early')}" for name in missing)
            yield row, SampleDefect("undecodable", f"{error}; row {row}'s cells cannot be decoded ({why}): {_DAMAGED}",
                                    key)
            continue
        try:
            value = {name: cells[name][row].as_py() for name in columns if row < len(cells[name])}
            for name, found in raw.items():
                if row in found and (name not in value or len(value[name]) != sizes[name].get(row, -1)):
                    value[name] = bytes(found[row])  # from its page, in place of one a damaged length moved
            image = bytearray(value["image"])
            yield row, _row_outcome(
                key, cell("label", row), value["shape"], value["dtype"], image, 0, len(image), value.get("metadata"),
                _target_cell(cells["target"][row] if row < len(cells.get("target", ())) else None, None),
                _target_cell(cells["target_mask"][row] if row < len(cells.get("target_mask", ())) else None, None),
                [value[n] for n in ("mask", "mask_shape", "mask_dtype")] if "mask" in value else None,
                records=records, checksums=checksums)
        except (TypeError, ValueError) as err:
            yield row, SampleDefect("undecodable", f"{error}; row {row}'s cells do not decode ({err}): {_DAMAGED}",
                                    key)


def _cell_sizes(cells: Mapping[str, list[Any]], shape_column: str = "shape", dtype_column: str = "dtype"
                ) -> dict[int, int]:
    """Each row's cell size by its shape and dtype cells (the image's, or the mask's), where both
    decoded and make sense; a row whose cells do not say keeps its stored length as it is."""
    sizes = {}
    for row, (shape, dtype) in enumerate(zip(cells.get(shape_column, ()), cells.get(dtype_column, ()), strict=False)):
        size = _size_of(shape.as_py(), dtype.as_py())
        if size is not None:
            sizes[row] = size
    return sizes


def _plain_cells(source: Any, column: str, *, sizes: Mapping[int, int]) -> dict[int, memoryview]:
    """The cells of an uncompressed, PLAIN-encoded byte-array ``column``
    (packer's ``image``), by row, read from its column chunk's pages: each page's header says
    where its values are and how many rows it holds; each value is a 4-byte length and its bytes.
    ``sizes``: each row's length where its shape and dtype cells say it (a damaged length is
    corrected by it). Stops (leaving the later rows out) at a page header that does not parse, or
    within a page at a length that runs past it. Only for a caller whose checksums check every
    cell returned: a damaged page can still make a wrong cell, never a silently delivered one.
    The column chunks are found by the file's footer as :func:`_column_chunks` reads it (none
    where the footer does not parse: every row's cell is then left out)."""
    found: dict[int, memoryview] = {}
    row0 = 0
    for rows, chunk in _column_chunks(source, column):
        if chunk is not None:
            data = memoryview(_read_range(source, *chunk))
            found.update(_chunk_cells(data, row0, rows, sizes))
        row0 += rows
    return found


#: The last bytes of a Parquet file (with an unencrypted footer): the footer's length and the magic
_TAIL, _MAGIC = 8, b"PAR1"


def _column_chunks(source: Any, column: str) -> list[tuple[int, tuple[int, int] | None]]:
    """For each row group of a Parquet file, in order: its row count and where the uncompressed
    column chunk of ``column`` (its dotted path in the schema) lies (offset, size), None where it is not there,
    compressed or placed outside the file; [] where the footer does not parse. Read from the
    footer's own bytes (thrift compact protocol, :func:`_thrift_struct`), never through pyarrow's
    column chunk metadata: pyarrow 26 aborts the process (an uncaught C++ exception, no Python
    error) building that for a footer whose bytes were damaged, such as a list column's size
    statistics with a histogram of another length."""
    size = _file_size(source)
    if size < len(_MAGIC) + _TAIL:
        return []
    tail = _read_range(source, size - _TAIL, _TAIL)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != _MAGIC or not 0 < length <= size - _TAIL - len(_MAGIC):
        return []
    try:
        footer, _ = _thrift_struct(memoryview(_read_range(source, size - _TAIL - length, length)), 0)
    except (ValueError, IndexError):
        return []
    groups = footer.get(4)  # FileMetaData.row_groups
    if not isinstance(groups, list):
        return []
    found: list[tuple[int, tuple[int, int] | None]] = []
    for group in groups:
        rows = group.get(3) if isinstance(group, dict) else None  # RowGroup.num_rows
        if not isinstance(rows, int) or rows < 0:
            return found
        chunks = group.get(1)  # RowGroup.columns: ColumnChunk.meta_data is its field 3
        metas = [chunk.get(3) for chunk in chunks if isinstance(chunk, dict)] if isinstance(chunks, list) else []
        meta = next((m for m in metas if isinstance(m, dict) and m.get(3) == column.encode().split(b".")), None)
        found.append((rows, _chunk_place(meta, size)))
    return found


def _chunk_place(meta: dict[int, Any] | None, size: int) -> tuple[int, int] | None:
    """(offset, size) of the uncompressed column chunk a ColumnMetaData ``meta`` describes (its
    dictionary page first where it has one), within a file of ``size`` bytes; None otherwise."""
    if meta is None or meta.get(4) != 0:  # codec 0: UNCOMPRESSED
        return None
    dictionary, data, length = meta.get(11), meta.get(9), meta.get(7)
    start = dictionary if isinstance(dictionary, int) and dictionary > 0 else data
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length < 0 or start + length > size:
        return None
    return start, length


#: The most bytes a damaged page header is searched past for the first cell of its page
_HEADER_MAX = 1024


def _chunk_cells(data: memoryview, row0: int, rows: int, sizes: Mapping[int, int]) -> dict[int, memoryview]:
    """The cells of one uncompressed PLAIN byte-array column chunk ``data`` holding rows ``row0``
    to ``row0 + rows`` (see :func:`_plain_cells`): page by page as their headers say; past a
    header that does not parse, or whose values do not add up to its rows' sizes, at the first
    place within :data:`_HEADER_MAX` bytes where the next rows' lengths follow one another
    (:func:`_resync`); and the chunk's last rows, not found otherwise, back to front from its end."""
    found: dict[int, memoryview] = {}
    pos, row, end_row = 0, row0, row0 + rows
    while pos < len(data) and row < end_row:
        page = _data_page(data, pos, row, end_row, sizes)
        if page is None:  # a damaged page header: its page's cells are found by their lengths
            pos, row = _resync(data, pos, row, end_row, sizes, found)
            if pos < 0:
                break
            continue
        values, count, pos = page
        at = 0
        for r in range(row, row + count):
            length = int.from_bytes(values[at:at + 4], "little")
            if sizes.get(r, length) != length:  # a damaged length: the row's shape and dtype say how long
                length = sizes[r]
            if at + 4 + length > len(values):  # a damaged length nothing corrects: the page's later cells are lost
                break
            found[r] = values[at + 4:at + 4 + length]
            at += 4 + length
        row += count
    end = len(data)
    for r in range(end_row - 1, row0 - 1, -1):  # the last page's values end where the chunk does
        if r in found or r not in sizes or end - sizes[r] - 4 < 0:
            break
        found[r] = data[end - sizes[r]:end]
        end -= sizes[r] + 4
    return found


def _data_page(data: memoryview, pos: int, row: int, end_row: int,
               sizes: Mapping[int, int]) -> tuple[memoryview, int, int] | None:
    """The page whose header is at ``pos`` and whose first row is ``row``: its values, its row
    count and where the next page starts (a dictionary or index page: no values, 0 rows). None
    where the header does not parse, or says what cannot be: a page past the chunk, rows past its
    end, values that do not add up to its rows' sizes (where those are known)."""
    try:
        header, start = _thrift_struct(data, pos)
    except (ValueError, IndexError):
        return None
    size, page_type = header.get(3), header.get(1)
    if not isinstance(size, int) or size < 0 or start + size > len(data) or page_type not in (0, 1, 2, 3):
        return None
    body = data[start:start + size]
    page = header.get(8) if page_type == 3 else header.get(5) if page_type == 0 else None
    if page_type in (1, 2):  # an index or dictionary page
        return body[:0], 0, start + size
    if not isinstance(page, dict):
        return None
    if page_type == 3:  # DATA_PAGE_V2: the levels first (never compressed), then the values
        count = page.get(3)
        levels = int(page.get(5) or 0) + int(page.get(6) or 0)
    else:  # DATA_PAGE (v1) of a required top-level column: no levels
        count, levels = page.get(1), 0
    if not isinstance(count, int) or count < 0 or row + count > end_row or not 0 <= levels <= size:
        return None
    values = body[levels:]
    if all(r in sizes for r in range(row, row + count)) and \
            sum(4 + sizes[r] for r in range(row, row + count)) != len(values):
        return None
    return values, count, start + size


def _resync(data: memoryview, pos: int, row: int, end_row: int, sizes: Mapping[int, int],
            found: dict[int, memoryview]) -> tuple[int, int]:
    """Past a damaged page header at ``pos``: the first place within :data:`_HEADER_MAX` bytes
    where row ``row``'s length is its size and the next row's follows it (or the chunk ends),
    then the cells from there (into ``found``) as long as each length is its row's size.
    Returns where they end and the next row; (-1, row) where no such place is found."""
    def length_at(at: int) -> int:
        return int.from_bytes(data[at:at + 4], "little") if at + 4 <= len(data) else -1

    if row not in sizes:
        return -1, row
    for at in range(pos + 1, min(pos + _HEADER_MAX, len(data) - 4)):
        after = at + 4 + sizes[row]
        if length_at(at) == sizes[row] and (after == len(data) or row + 1 >= end_row
                                            or length_at(after) == sizes.get(row + 1)):
            break
    else:
        return -1, row
    while row < end_row and row in sizes and length_at(at) == sizes[row] and at + 4 + sizes[row] <= len(data):
        found[row] = data[at + 4:at + 4 + sizes[row]]
        at, row = at + 4 + sizes[row], row + 1
    return at, row


def _read_range(source: Any, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of a Parquet file given as a path, a ``pa.memory_map`` or a
    seekable binary file."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)
    source.seek(offset)
    return bytes(source.read(size))


def _file_size(source: Any) -> int:
    """The length of a Parquet file given as :func:`_read_range` takes it."""
    if isinstance(source, (str, Path)):
        return os.path.getsize(source)
    source.seek(0, os.SEEK_END)
    return int(source.tell())


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a thrift varint longer than 10 bytes")


def _thrift_struct(data: memoryview, pos: int, depth: int = 0) -> tuple[dict[int, Any], int]:
    """A thrift compact-protocol struct at ``pos`` (a Parquet page header, or a file's footer):
    its fields by field id (integers, bools, bytes, lists and structs; a double as None), and the
    position after it. ValueError or IndexError where the bytes are not one."""
    if depth > 8:
        raise ValueError("thrift structs nested too deep")
    fields: dict[int, Any] = {}
    field_id = 0
    while True:
        head = data[pos]
        pos += 1
        if head == 0:
            return fields, pos
        kind, delta = head & 0x0F, head >> 4
        if delta:
            field_id += delta
        else:
            raw, pos = _varint(data, pos)
            field_id = (raw >> 1) ^ -(raw & 1)
        value, pos = _thrift_value(data, pos, kind, depth)
        fields[field_id] = value


def _thrift_value(data: memoryview, pos: int, kind: int, depth: int) -> tuple[Any, int]:
    """A value of thrift compact type ``kind`` at ``pos`` and the position after it. Each list
    element is read from ``data`` (none is skipped unread), so a damaged count ends in an
    IndexError at the end of the bytes, not in a loop that long."""
    if kind in (1, 2):  # bool true / false, in the field header
        return kind == 1, pos
    if kind == 3:
        return data[pos], pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64: zigzag varints
        raw, pos = _varint(data, pos)
        return (raw >> 1) ^ -(raw & 1), pos
    if kind == 7:  # a double: not one a reader here needs
        if pos + 8 > len(data):
            raise IndexError("a thrift double runs past the end")
        return None, pos + 8
    if kind == 8:  # binary (and string)
        length, pos = _varint(data, pos)
        if pos + length > len(data):
            raise IndexError(f"a thrift binary of {length} bytes runs past the end")
        return bytes(data[pos:pos + length]), pos + length
    if kind in (9, 10):  # list, set
        head = data[pos]
        pos += 1
        count = head >> 4
        if count == 15:
            count, pos = _varint(data, pos)
        element = head & 0x0F
        values = []
        for _ in range(count):
            if element in (1, 2):  # a bool element is one byte of its own
                value, pos = data[pos] == 1, pos + 1
            else:
                value, pos = _thrift_value(data, pos, element, depth + 1)
            values.append(value)
        return values, pos
    if kind == 12:
        return _thrift_struct(data, pos, depth + 1)
    raise ValueError(f"thrift type {kind} is not one a Parquet page header or footer holds")


def _target_cell(targets: Any, r: int | None) -> np.ndarray | None:
    """Row ``r`` of a ``target`` (or ``target_mask``) column as a 1-D array in the column's
    value type (None: no column or null); ``r`` None: ``targets`` is the row's cell itself."""
    cell = targets if r is None or targets is None else targets[r]
    if cell is None or not cell.is_valid:
        return None
    return np.asarray(cell.values.to_numpy(zero_copy_only=False))


def _mask_cell(cells: list[Any] | None) -> np.ndarray | None:
    """A row's mask (a copy, so it does not hold its batch) from its mask, mask_shape and
    mask_dtype cells (None: no mask columns)."""
    if cells is None:
        return None
    data, shape, dtype = cells
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()


def _fail(rows: Sequence[int], reason: str, message: str) -> Iterator[tuple[int, SampleDefect]]:
    for row in rows:
        yield row, SampleDefect(reason, message)


class FilePrefix:
    """The first ``length`` bytes of the seekable binary file ``fh``, as a file of that length
    (what a Parquet reader, which looks for its index at the end, should see of a shard whose
    copy had bytes appended)."""

    def __init__(self, fh: IO[bytes], length: int) -> None:
        self.fh, self.length, self.pos = fh, length, 0
        self.closed = False

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        size = self.length - self.pos if size is None or size < 0 else min(size, self.length - self.pos)
        if size <= 0:
            return b""
        self.fh.seek(self.pos)
        data = self.fh.read(size)
        self.pos += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
