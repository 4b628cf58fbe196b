"""Write Parquet shards byte-reproducibly: one row per sample, one row group per shard.

Columns (documented in ``schemas/parquet_shard.schema.json`` and the README): key, label,
label_name, entity_id, split, source, shape, dtype, image (raw C-order bytes, uncompressed
so readers can map them straight into tensors), sha256 (of ``image``), metadata (JSON).
Writer options are fixed here so the bytes depend only on the data and pyarrow's version.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer.files import atomic_output, canonical_json, file_sha256
from packer.shards.encode import EncodedSample
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


def write_parquet_shard(path: Path, samples: Iterable[EncodedSample]) -> ShardWrite:
    """Write ``samples`` as one Parquet file at ``path``; return its size, sha256 and, per
    sample, its row number and the size and sha256 of its ``image`` cell."""
    columns: dict[str, list] = {name: [] for name in SCHEMA.names}
    written = WrittenSamples()
    for position, sample in enumerate(samples):
        digest = sample.pixels_sha256
        for name, value in (("key", sample.key), ("label", sample.label), ("label_name", sample.label_name),
                            ("entity_id", sample.entity_id), ("split", sample.split), ("source", sample.source),
                            ("shape", list(sample.shape)), ("dtype", sample.dtype), ("image", sample.pixels),
                            ("sha256", digest), ("metadata", canonical_json(sample.info).decode())):
            columns[name].append(value)
        written.add(position=position, size=len(sample.pixels), sha256=bytes.fromhex(digest))
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    with atomic_output(path) as fh:
        pq.write_table(
            table, fh,
            row_group_size=max(1, table.num_rows),
            compression={name: ("zstd" if name in _SMALL_COLUMNS + ["metadata", "shape"] else "none")
                         for name in SCHEMA.names},
            use_dictionary=_SMALL_COLUMNS,
            write_statistics=_SMALL_COLUMNS,
            data_page_version="2.0",
            version="2.6",
        )
    size, sha = file_sha256(path)
    return written.result(file=path.name, size=size, sha256=sha)
