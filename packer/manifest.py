"""Manifest: describe a built dataset version, hash it, write it atomically, load it back.

``dataset_hash`` is sha256 over the canonical JSON of every manifest field except
``created_at``, ``version`` and ``dataset_hash`` itself. It therefore covers the resolved
config, the library versions that shape the bytes, every shard's sha256 and the sample
index: one flipped byte anywhere changes it. The version folder is its first 12 hex digits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packer import __version__
from packer.errors import IntegrityError
from packer.files import atomic_output, canonical_json, file_sha256
from packer.pipeline.sampletable import as_table
from packer.schemas import load_schema
from packer.shards.writer import ShardWrite

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "_index.parquet"
SPLITS_FILE = "_splits.parquet"
_UNHASHED = ("created_at", "version", "dataset_hash")
_BYTE_SHAPING = ("numpy", "opencv-python-headless", "pydicom", "pylibjpeg", "pylibjpeg-libjpeg",
                 "pylibjpeg-openjpeg", "pylibjpeg-rle", "pyarrow")


def library_versions() -> dict[str, str]:
    """Versions of packer and of every library whose behaviour shapes the packed bytes."""
    versions = {"packer": __version__}
    for name in _BYTE_SHAPING:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()


def compute_dataset_hash(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its unhashed fields."""
    content = {k: v for k, v in manifest.items() if k not in _UNHASHED}
    return hashlib.sha256(canonical_json(content)).hexdigest()


def seal_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """Fill ``dataset_hash``, ``version`` and ``created_at`` into a manifest body."""
    digest = compute_dataset_hash(manifest)
    return {**manifest, "dataset_hash": digest, "version": digest[:12],
            "created_at": datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")}


def validate_manifest(manifest: dict[str, Any], *, source: str) -> None:
    """Raise IntegrityError if ``manifest`` breaks ``schemas/manifest.schema.json``."""
    import jsonschema

    schema = load_schema("manifest")
    validator_cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(validator_cls(schema).iter_errors(manifest))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top level)"
        raise IntegrityError(f"{source}: manifest field {where}: {error.message}")


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    """Validate and write ``folder/manifest.json`` atomically (sorted keys, 2-space indent)."""
    validate_manifest(manifest, source=str(folder / MANIFEST_FILE))
    path = folder / MANIFEST_FILE
    with atomic_output(path) as fh:
        fh.write(json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return path


def resolve_manifest_path(path: str | Path) -> Path:
    """Accept a manifest file or the version folder holding it."""
    candidate = Path(path)
    return candidate / MANIFEST_FILE if candidate.is_dir() else candidate


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and schema-check a manifest; IntegrityError names the file and the field."""
    file = resolve_manifest_path(path)
    try:
        manifest: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise IntegrityError(f"{file}: cannot read the manifest ({err.strerror})") from err
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{file}: not valid JSON ({err.msg} at line {err.lineno})") from err
    validate_manifest(manifest, source=str(file))
    if compute_dataset_hash(manifest) != manifest["dataset_hash"]:
        raise IntegrityError(f"{file}: dataset_hash does not match the manifest's content; the manifest was edited")
    return manifest


INDEX_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("shard", pa.string(), nullable=False),
    pa.field("position", pa.int64(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("label", pa.int64(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
])


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


SPLITS_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("entity_id", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("fold", pa.int32(), nullable=True),
    pa.field("time", pa.string(), nullable=True),
    pa.field("days_since_first", pa.float64(), nullable=True),
    pa.field("label", pa.string(), nullable=False),
])


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
