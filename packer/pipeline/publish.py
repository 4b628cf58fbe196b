"""Write a version folder's per-sample tables: ``_index.parquet`` and ``_splits.parquet``.

Build-side only: the pipeline gathers the index shard by shard while it packs (:class:`IndexColumns`),
then writes both tables into the staging folder before the manifest, which records their size
and sha256. Their columns are the format (:data:`packer.manifest.INDEX_SCHEMA`,
:data:`packer.manifest.SPLITS_SCHEMA`); readers find them through the manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packer.files import atomic_output, file_sha256
from packer.manifest import INDEX_FILE, INDEX_SCHEMA, SPLITS_FILE, SPLITS_SCHEMA
from packer.pipeline.sampletable import as_table
from packer.shards.writer import ShardWrite


class IndexColumns:
    """The columns of ``_index.parquet``, gathered shard by shard.

    A shard writer returns positions, sizes and digests (:class:`ShardWrite`); the caller's
    shard plan knows each sample's key, split, label index, entity and source. Each shard
    becomes a small Arrow table at once, so no per-row Python objects pile up on the client.
    """

    def __init__(self) -> None:
        self._parts: list[tuple[tuple[str, str], pa.Table]] = []

    def add_shard(self, written: ShardWrite, *, split: str, keys: Sequence[str], labels: Sequence[int],
                  entity_ids: Sequence[str], sources: Sequence[str]) -> None:
        """Add one shard's rows; the sequences list its samples in the order they were written."""
        count = written.samples
        if not len(keys) == len(labels) == len(entity_ids) == len(sources) == count:
            raise ValueError(f"shard {written.file}: the writer reported {count} samples, the plan lists "
                             f"{len(keys)} keys, {len(labels)} labels, {len(entity_ids)} entities and "
                             f"{len(sources)} sources")
        if any(b <= a for a, b in zip(written.positions, written.positions[1:], strict=False)):
            raise ValueError(f"shard {written.file}: the writer reported positions out of order")
        self._parts.append(((split, written.file), pa.table({
            "key": pa.array(keys, pa.string()),
            "split": pa.array([split] * count, pa.string()),
            "shard": pa.array([written.file] * count, pa.string()),
            "position": pa.array(written.positions, pa.int64()),
            "bytes": pa.array(written.sizes, pa.int64()),
            "sha256": hex_digests(written.digests, count),
            "label": pa.array(labels, pa.int64()),
            "entity_id": pa.array(entity_ids, pa.string()),
            "source": pa.array(sources, pa.string()),
        }, schema=INDEX_SCHEMA)))

    def table(self) -> pa.Table:
        """All rows, ordered by split, shard and position (one chunk per column)."""
        if not self._parts:
            return INDEX_SCHEMA.empty_table()
        # Each part is one shard, its positions ascending (checked in add_shard): ordering the
        # parts orders the rows, without the copy a row sort makes of every column.
        return pa.concat_tables([part for _, part in sorted(self._parts, key=lambda p: p[0])]).combine_chunks()


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex_digests(digests: bytes, count: int) -> pa.Array:
    """``count`` 32-byte digests as a string column of 64-character lower-case hex, built in
    numpy: no Python string per sample (100k of them were 11 MB of short-lived objects at the
    client's peak, writing the index)."""
    raw = np.frombuffer(digests, dtype=np.uint8, count=32 * count)
    chars = np.empty(2 * raw.size, dtype=np.uint8)
    chars[0::2], chars[1::2] = _HEX[raw >> 4], _HEX[raw & 0x0F]
    offsets = np.arange(0, 64 * count + 1, 64, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def write_index(folder: Path, index: IndexColumns) -> dict[str, Any]:
    """Write ``_index.parquet`` (one row per packed sample, in shard order); return its entry."""
    return _write_table(folder / INDEX_FILE, index.table())


def _write_table(path: Path, table: pa.Table) -> dict[str, Any]:
    """Write a per-sample table as one zstd row group, atomically; return its manifest entry."""
    with atomic_output(path) as fh:
        pq.write_table(table, fh, compression="zstd", row_group_size=max(1, table.num_rows))
    size, digest = file_sha256(path)
    return {"file": path.name, "bytes": size, "sha256": digest, "rows": table.num_rows}


def release_table_memory() -> None:
    """Hand the pages of freed Arrow buffers back to the system.

    Arrow's allocator (mimalloc here) keeps freed blocks for later Arrow allocations; after the
    build's last per-sample table is written there are none, and those pages would count in
    the client's RSS while the HTML report stacks its own peak on top.
    """
    pa.default_memory_pool().release_unused()


def write_splits_table(folder: Path, samples: Sequence[Any], assignment: Any, phi: Any) -> dict[str, Any]:
    """Write ``_splits.parquet``: the per-sample split (and fold) assignment, sorted by key.

    ``time`` holds ISO times only with ``phi.dates: keep``; ``days_since_first`` (days since
    the entity's first record) is always written, so time-aware analysis needs no dates.
    """
    samples = as_table(samples)
    # Arrow arrays straight from the table's buffers where no Python logic is needed: a list of
    # Python strings per column was most of the client's peak here at 100k samples
    keys = samples.arrow("key")
    order = pc.sort_indices(keys)  # UTF-8 byte order is code point order, as sorted() on str
    entities, times = samples.column("entity"), samples.column("time")
    first: dict[str, str] = {}
    for entity, time in zip(entities, times, strict=True):
        if time is not None and (entity not in first or time < first[entity]):
            first[entity] = time
    shifted = replace(phi, dates="shift")
    days = pa.array([shifted.time(time, first.get(entity)) for entity, time in zip(entities, times, strict=True)],
                    pa.float64()).take(order)
    del entities, times, first
    time_column = samples.arrow("time").take(order) if phi.dates == "keep" else pa.nulls(len(keys), pa.string())
    keys = keys.take(order)
    sorted_keys = keys.to_pylist()
    columns = {
        "key": keys,
        "sample_id": samples.arrow("sample_id").take(order),
        "entity_id": samples.arrow("entity").take(order),
        "split": pa.array([assignment.split[k] for k in sorted_keys], pa.string()),
        "fold": pa.array([assignment.fold.get(k) for k in sorted_keys], pa.int32()),
        "time": time_column,
        "days_since_first": days,
        "label": samples.arrow("label").take(order),
    }
    del sorted_keys
    table = pa.table([columns[field.name].cast(field.type) for field in SPLITS_SCHEMA], schema=SPLITS_SCHEMA)
    del columns
    return _write_table(folder / SPLITS_FILE, table)
