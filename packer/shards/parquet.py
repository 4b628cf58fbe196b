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
cells once out of the page cache because Parquet stores byte arrays length-prefixed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

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
            compression={name: ("zstd" if name in _SMALL_COLUMNS + ["metadata", "shape", "target", "target_mask",
                                                                  "mask_shape", "mask_dtype"] else "none")
                         for name in schema.names},
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
def image_view(data: Any, start: int, end: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Zero-copy view of bytes ``start:end`` of an Arrow buffer as ``dtype``, ``shape``; a copy
    where the bytes are not aligned for ``dtype`` or the buffer is read-only."""
    raw = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
    view = raw.view(dtype) if raw.ctypes.data % dtype.alignment == 0 else raw.copy().view(dtype)
    view = view.reshape(shape)
    return view if view.flags.writeable else view.copy()


def read_parquet_samples(source: Any, rows: Sequence[int], *, expect_rows: int | None = None,
                         records: bool = False, batch_rows: int,
                         checksums: bool = False) -> Iterator[tuple[int, Decoded | SampleDefect]]:
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
    """
    columns = READ_COLUMNS + (["metadata"] if records or checksums else [])
    try:
        parquet = pq.ParquetFile(source)
        count = parquet.metadata.num_rows
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        columns += [name for name in ("target", "target_mask", "mask", "mask_shape", "mask_dtype")
                    if name in parquet.schema_arrow.names]
    except (OSError, pa.ArrowException) as err:
        yield from _fail(rows, "bad_shard", f"not a readable Parquet file ({err})")
        return
    if missing:
        yield from _fail(rows, "bad_shard", f"columns {missing} are missing")
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
                offsets = np.frombuffer(buffers[1], dtype=np.int32)[images.offset:images.offset + len(images) + 1]
                while i < len(want) and want[i] < end_row:
                    row, r = want[i], want[i] - row0
                    key = keys[r].as_py()
                    shape_cell = shapes[r].as_py()
                    shape = tuple(int(d) for d in shape_cell)
                    start, stop = int(offsets[r]), int(offsets[r + 1])
                    dtype_name = dtypes[r].as_py()
                    dtype = np.dtype(dtype_name)
                    label = labels[r].as_py()
                    record = metadata[r].as_py() if metadata is not None else None
                    target, target_mask = _target_cell(targets, r), _target_cell(target_masks, r)
                    mask_cells = [column[r].as_py() for column in masks] if masks is not None else None
                    checksum = None
                    if checksums:
                        mask, mask_shape, mask_dtype = mask_cells if mask_cells is not None else (None, None, None)
                        checksum = parquet_cells_checksum(key, {  # the image straight from the batch's buffer
                            "label": label, "shape": shape_cell, "dtype": dtype_name,
                            "image": memoryview(buffers[2])[start:stop] if buffers[2] is not None else b"",
                            "metadata": record, "target": target, "target_mask": target_mask,
                            "mask": mask, "mask_shape": mask_shape, "mask_dtype": mask_dtype})
                    if math.prod(shape) * dtype.itemsize != stop - start:
                        yield row, SampleDefect("bad_sample", f"{stop - start} image bytes do not hold {dtype} {shape}",
                                                key, checksum=checksum)
                    else:
                        yield row, Decoded(key=key, label=None if label is None else int(label),
                                           image=image_view(buffers[2], start, stop, dtype, shape),
                                           record=record if records else None,
                                           target=target, mask=_mask_cell(mask_cells),
                                           target_mask=target_mask, checksum=checksum)
                    i += 1
            row0 = end_row
            if i >= len(want):
                return
    except (OSError, pa.ArrowException, TypeError, ValueError) as err:
        yield from _fail(want[i:], "undecodable", f"Parquet read failed at row {row0} ({err}): the shard's bytes "
                         "changed after the build (disk, copy or cache damage) or it is not the file the build wrote; "
                         "restore it from a good copy or rebuild the dataset, and run `packer verify` on the "
                         "version folder to name every damaged shard")
        return
    yield from _fail(want[i:], "truncated", f"the file ended after {row0} rows")


def _target_cell(targets: pa.Array | None, r: int) -> np.ndarray | None:
    """Row ``r`` of a ``target`` (or ``target_mask``) column as a 1-D array in the column's
    value type (None: no column or null)."""
    if targets is None or not targets[r].is_valid:
        return None
    return np.asarray(targets[r].values.to_numpy(zero_copy_only=False))


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
