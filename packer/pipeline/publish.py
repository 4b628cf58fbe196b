"""Publish a version folder: its per-sample tables, and (for a URL output) the upload.

``_index.parquet`` and ``_splits.parquet`` are build-side only: the pipeline gathers the index
shard by shard while it packs (:class:`IndexColumns`), then writes both tables into the staging
folder before the manifest, which records their size and sha256. Their columns are the format
(:data:`packer.manifest.INDEX_SCHEMA`, :data:`packer.manifest.SPLITS_SCHEMA`); readers find them
through the manifest.

:func:`publish_version` uploads a finished local version folder to a store
(:class:`packer.storage.VersionFolder`): the shards and tables first, each read back and
checked against the manifest, ``manifest.json`` last, so a remote folder without a manifest is
never taken for a dataset. A shard that an earlier version of the dataset in the same store
already holds (same sha256) is copied there inside the store instead of uploaded
(:func:`_copy_earlier`; S3 CopyObject through fsspec's ``copy``), then read back and checked like
the rest, so each remote version folder is complete on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packer.allocator import trim_heap
from packer.config import SPLITS
from packer.errors import IntegrityError, PackerError, refused_write, uncreatable
from packer.files import atomic_output, file_sha256
from packer.manifest import (
    INDEX_FILE,
    INDEX_SCHEMA,
    SPLITS_FILE,
    SPLITS_SCHEMA,
    fitted_schema,
    read_dataset_hash,
    read_manifest,
    text_size,
    text_type,
)
from packer.pipeline.sampletable import as_table, hex_chars
from packer.pipeline.spill import cache_elsewhere
from packer.pipeline.split import fold_codes, split_codes
from packer.shards.writer import ShardWrite
from packer.storage import (
    LOCAL_ONLY,
    MANIFEST_FILE,
    TMP_SUFFIX,
    VersionFolder,
    etag_matches,
    join_url,
    remote_errors,
    storage_error,
)

#: the index's columns of one value per shard (its split and file) or made from its raw
#: digests, built for all rows at once by :meth:`IndexColumns.table`, not kept per row per shard
_PER_SHARD = ("split", "shard", "sha256")


@dataclass
class _Shard:
    """One shard's rows of the index until the table is made."""

    order: tuple[str, str]       # (split, file): the table's order of shards
    count: int
    digests: bytes               # 32 raw bytes a row (the sha256 column's hex is made from them)
    columns: dict[str, Any]      # the other columns, one single-chunk column each
    text: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes of text in each text column
    batch: int = -1              # where spilled (IndexColumns' spill file): its record batch; columns empty


class IndexColumns:
    """The columns of ``_index.parquet``, gathered shard by shard.

    A shard writer returns positions, sizes and digests (:class:`ShardWrite`); the caller's
    shard plan knows each sample's key, split, label index, entity and source. Each shard's
    columns become small Arrow arrays at once, so no per-row Python objects pile up on the
    client; the columns of one value per shard (split, file) and the digests' hex are made for
    every row only when the table is (:meth:`table`), so no shard holds them per row.

    With ``spill`` (a file path on the work disk) each shard's columns are written there as an
    Arrow IPC record batch as they are added and read back a row group at a time
    (:meth:`row_groups`), so the client holds a row group's shards, not every shard's columns
    (~1 GB at 10M samples); the file is removed once a released table is made.
    """

    def __init__(self, schema: pa.Schema = INDEX_SCHEMA, *, spill: Path | None = None) -> None:
        self._parts: list[_Shard] = []
        self.schema = schema
        self._row_schema = pa.schema([f for f in schema if f.name not in _PER_SHARD])
        self._spill, self._spilled = spill, 0
        self._spill_writer: Any = None

    def add_shard(self, written: ShardWrite, *, split: str, keys: Sequence[str], labels: Sequence[int | None],
                  entity_ids: Sequence[str], sources: Sequence[str],
                  targets: Sequence[np.ndarray] | None = None,
                  target_masks: Sequence[np.ndarray] | None = None) -> None:
        """Add one shard's rows; the sequences list its samples in the order they were written.
        ``labels``: class indices (None without a class target); ``targets``: the samples'
        target vectors where the schema has a ``target`` column; ``target_masks``: their target
        masks where it has a ``target_mask`` column."""
        count = written.samples
        if len(written.checksums) != count:
            raise ValueError(f"shard {written.file}: the writer reported {count} samples but "
                             f"{len(written.checksums)} checksums")
        if not len(keys) == len(labels) == len(entity_ids) == len(sources) == count:
            raise ValueError(f"shard {written.file}: the writer reported {count} samples, the plan lists "
                             f"{len(keys)} keys, {len(labels)} labels, {len(entity_ids)} entities and "
                             f"{len(sources)} sources")
        if len(written.digests) < 32 * count:
            raise ValueError(f"shard {written.file}: the writer reported {count} samples but "
                             f"{len(written.digests) // 32} digests")
        if any(b <= a for a, b in zip(written.positions, written.positions[1:], strict=False)):
            raise ValueError(f"shard {written.file}: the writer reported positions out of order")
        columns = {
            "key": pa.array(keys, pa.string()),
            "position": pa.array(written.positions, pa.int64()),
            "bytes": pa.array(written.sizes, pa.int64()),
            "xxh3": pa.array(np.frombuffer(written.checksums, dtype=np.uint64, count=count), pa.uint64()),
            "label": pa.array(labels, pa.int64()),
            "entity_id": pa.array(entity_ids, pa.string()),
            "source": pa.array(sources, pa.string()),
        }
        if "target" in self.schema.names:
            columns["target"] = pa.array(list(targets or ()), self.schema.field("target").type)
        if "target_mask" in self.schema.names:
            columns["target_mask"] = pa.array(list(target_masks or ()), self.schema.field("target_mask").type)
        table = pa.table(columns, schema=self._row_schema)
        text = {f.name: text_size(table.column(f.name)) for f in self._row_schema if pa.types.is_string(f.type)}
        if self._spill is None:
            self._parts.append(_Shard((split, written.file), count, written.digests,
                                      dict(zip(table.column_names, table.columns, strict=True)), text))
            return
        digests = pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), count,
                                                       [None, pa.py_buffer(written.digests[:32 * count])])
        batch = pa.RecordBatch.from_arrays([*(table.column(n).combine_chunks() for n in table.column_names), digests],
                                           schema=self._row_schema.append(pa.field("_digests", pa.binary(32))))
        try:
            if self._spill_writer is None:
                self._spill_writer = pa.ipc.new_file(pa.OSFile(str(self._spill), "wb"), batch.schema)
            self._spill_writer.write_batch(batch)
        except OSError as err:
            raise self._refused(err, opening=self._spill_writer is None) from err
        self._parts.append(_Shard((split, written.file), count, b"", {}, text, batch=self._spilled))
        self._spilled += 1

    def _spilled_reader(self) -> tuple[Any, Any]:
        """(the spill file opened, a reader of its batches), its writer closed first; (None, None)
        without spilled shards."""
        self._close_spill_writer()
        if self._spill is None or not self._spilled:
            return None, None
        source = pa.OSFile(str(self._spill), "rb")
        return source, pa.ipc.open_file(source)

    def _close_spill_writer(self) -> None:
        writer, self._spill_writer = self._spill_writer, None
        if writer is not None:
            try:
                writer.close()  # writes the file's footer: a full disk can refuse that too
            except OSError as err:
                raise self._refused(err) from err

    def _refused(self, err: OSError, *, opening: bool = False) -> OSError | PackerError:
        """``err`` met writing the spill file, as the FileSystemError that names it and the cache's
        fix (it is in the build cache, not the output), or ``err`` itself when the file system did
        not refuse it (a bug then stays one)."""
        assert self._spill is not None  # only a spilling instance writes
        return (refused_write(err, self._spill, opening=opening, elsewhere=cache_elsewhere())
                or uncreatable(err, self._spill, elsewhere=cache_elsewhere()) or err)

    def discard(self) -> None:
        """Remove the spill file (a no-op without one); the shards added are given up. Never
        raises for the spill's own refusal: it runs in the ``finally`` of the write that met it,
        and the file goes anyway."""
        writer, self._spill_writer = self._spill_writer, None
        if writer is not None:
            with contextlib.suppress(OSError):  # a footer the full disk refused: the file is deleted below
                writer.close()
        if self._spill is not None:
            self._spill.unlink(missing_ok=True)
        self._parts, self._spilled = [], 0

    def table(self, *, release: bool = False) -> pa.Table:
        """All rows, ordered by split, shard and position (one chunk per column). With
        ``release=True`` the shards' columns are given up as the table is made, each freed once
        copied into it (the client holds the index once and one column twice, not twice), and
        this object is left empty.

        A text column whose rows hold more than :data:`packer.manifest.STRING_MAX_BYTES` of
        text together (``sha256`` past ~33.5M rows) is ``large_string`` in the table and its
        schema (:func:`packer.manifest.text_type`), the others ``string`` as the schema says."""
        schema, groups = self.row_groups(max(1, self.rows), release=release)
        tables = list(groups)
        return tables[0] if len(tables) == 1 else schema.empty_table()

    @property
    def rows(self) -> int:
        """How many rows the shards added so far hold."""
        return sum(p.count for p in self._parts)

    def row_groups(self, rows: int, *, release: bool = False) -> tuple[pa.Schema, Iterator[pa.Table]]:
        """The index's schema and its rows (ordered as :meth:`table` orders them) as tables of
        ``rows`` rows each (the last one fewer; none for an empty index), one chunk per column:
        what ``pq.write_table(self.table(), row_group_size=rows)`` writes as row groups, made one
        group at a time, so the client never holds the whole index's columns at once (at 10M
        samples they were +2.3 GB on top of the shards' own columns). With ``release=True`` each
        shard's columns are given up once its last row is in a group, and this object is left
        empty."""
        if rows < 1:
            raise ValueError(f"row_groups: rows must be at least 1, not {rows}")
        # Each part is one shard, its positions ascending (checked in add_shard): ordering the
        # parts orders the rows, without the copy a row sort makes of every column.
        parts = sorted(self._parts, key=lambda p: p.order)
        if release:
            self._parts = []
        schema = self._fitted(parts)
        return schema, self._groups(parts, schema, rows, release=release)

    def _fitted(self, parts: Sequence[_Shard]) -> pa.Schema:
        """The schema, with ``large_string`` for the text columns that the whole index's rows
        pass :data:`packer.manifest.STRING_MAX_BYTES` in (decided before any group is made)."""
        fields = []
        for field in self.schema:
            if not pa.types.is_string(field.type):
                fields.append(field)
                continue
            if field.name in ("split", "shard"):
                size = sum(len(p.order[0 if field.name == "split" else 1].encode("utf-8")) * p.count for p in parts)
            elif field.name == "sha256":
                size = 64 * sum(p.count for p in parts)
            else:
                size = sum(p.text[field.name] for p in parts)
            fields.append(field.with_type(text_type(size)))
        return pa.schema(fields, metadata=self.schema.metadata)

    def _groups(self, parts: list[_Shard], schema: pa.Schema, rows: int, *, release: bool) -> Iterator[pa.Table]:
        source, reader = self._spilled_reader()
        pending: list[tuple[_Shard, int, int]] = []   # (shard, first row, end row) of the group being made
        held = 0
        try:
            for part in parts:
                if part.batch >= 0:  # spilled: read back for the group(s) its rows go to
                    part = _spilled_part(part, reader.get_batch(part.batch))
                at = 0
                while at < part.count:
                    take = min(part.count - at, rows - held)
                    pending.append((part, at, at + take))
                    at += take
                    held += take
                    if held == rows:
                        yield _group_table(pending, schema)
                        if release or reader is not None:
                            _give_up([p for p, _, end in pending if end == p.count])
                        pending, held = [], 0
            if pending:
                yield _group_table(pending, schema)
                if release or reader is not None:
                    _give_up([p for p, _, end in pending if end == p.count])
        finally:
            if source is not None:
                source.close()
            if release:
                self.discard()


def _spilled_part(part: _Shard, batch: pa.RecordBatch) -> _Shard:
    """A spilled shard's columns and digests from its record batch (a new part: the spilled one
    stays as it is for a later table)."""
    names = batch.schema.names[:-1]   # the last column holds the digests
    digests = batch.column(len(names))
    raw = digests.buffers()[1].to_pybytes()[32 * digests.offset:32 * (digests.offset + len(digests))]
    return _Shard(part.order, part.count, raw, {n: pa.chunked_array([batch.column(i)]) for i, n in enumerate(names)},
                  part.text)


def _group_table(pending: Sequence[tuple[_Shard, int, int]], schema: pa.Schema) -> pa.Table:
    """One row group of the index: rows ``start`` to ``end`` of each listed shard, in order."""
    counts = [end - start for _, start, end in pending]
    shard_of_row = pa.array(np.repeat(np.arange(len(pending), dtype=np.int32), counts))
    combined = []
    for field in schema:
        if field.name in ("split", "shard"):
            names = [p.order[0 if field.name == "split" else 1] for p, _, _ in pending]
            combined.append(pa.array(names, field.type).take(shard_of_row))
        elif field.name == "sha256":
            combined.append(_hex_column(pending, large=pa.types.is_large_string(field.type)))
        else:
            chunks = [chunk for p, start, end in pending
                      for chunk in p.columns[field.name].slice(start, end - start).chunks]
            if pa.types.is_large_string(field.type):
                chunks = [chunk.cast(pa.large_string()) for chunk in chunks]  # one string column can't hold them
            combined.append(pa.concat_arrays(chunks) if chunks else pa.array([], field.type))
            del chunks
    return pa.Table.from_arrays(combined, schema=schema)


def _give_up(parts: Sequence[_Shard]) -> None:
    """Free the columns and digests of released shards whose rows are all in made groups."""
    for part in parts:
        part.columns = {}
        part.digests = b""
    if parts:
        trim_heap()  # the shards' small buffers freed: their pages, not only the Arrow pool's


def _hex_column(pending: Sequence[tuple[_Shard, int, int]], *, large: bool) -> pa.Array:
    """The ``sha256`` column of rows ``start`` to ``end`` of each listed shard: each row's
    32-byte digest as 64 lower-case hex characters (:func:`hex_digests`), written straight into
    the column's buffer; ``large_string`` where ``large``."""
    count = sum(end - start for _, start, end in pending)
    chars = bytearray(64 * count)
    view = np.frombuffer(chars, dtype=np.uint8)
    at = 0
    for part, start, end in pending:
        raw = np.frombuffer(part.digests, dtype=np.uint8, count=32 * (end - start), offset=32 * start)
        hex_chars(raw, view[at:at + 2 * raw.size])
        at += 2 * raw.size
    del view
    return _hex_array(chars, count, large=large)


def _hex_array(chars: Any, count: int, *, large: bool) -> pa.Array:
    """``count`` rows of 64 hex characters each, back to back in buffer ``chars``, as a string
    column (``large_string`` where ``large``: past ~33.5M rows a string column's int32 offsets
    cannot reach the end of the text)."""
    if not large:
        return pa.StringArray.from_buffers(count, pa.py_buffer(np.arange(0, 64 * count + 1, 64, dtype=np.int32)),
                                           pa.py_buffer(chars))
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(np.arange(0, 64 * count + 1, 64, dtype=np.int64)),
                                            pa.py_buffer(chars))


def hex_digests(digests: bytes, count: int) -> pa.Array:
    """``count`` 32-byte digests as a string column of 64-character lower-case hex, built in
    numpy: no Python string per sample (100k of them were 11 MB of short-lived objects at the
    client's peak, writing the index). ``large_string`` past ~33.5M digests
    (:func:`packer.manifest.text_type`), where int32 offsets would wrap around."""
    chars = hex_chars(np.frombuffer(digests, dtype=np.uint8, count=32 * count))
    return _hex_array(chars, count, large=pa.types.is_large_string(text_type(64 * count)))


#: rows in one row group of ``_index.parquet`` and ``_splits.parquet``: a table of up to this
#: many rows is one row group (every dataset built before row groups were made is that small,
#: and keeps its bytes); a larger one is written a group at a time, each group made when it is
#: written (:meth:`IndexColumns.row_groups`, :func:`write_splits_table`). pyarrow's own default
#: group length.
ROW_GROUP_ROWS = 1 << 20


def write_index(folder: Path, index: IndexColumns) -> dict[str, Any]:
    """Write ``_index.parquet`` (one row per packed sample, in shard order, in row groups of
    :data:`ROW_GROUP_ROWS`), atomically; return its entry. An :class:`IndexColumns` gives
    its shards' columns up as each group is written (:meth:`IndexColumns.row_groups`) and is left
    empty; any other object's ``table()`` is written."""
    if not isinstance(index, IndexColumns):
        return _write_table(folder / INDEX_FILE, index.table())
    schema, groups = index.row_groups(ROW_GROUP_ROWS, release=True)
    return _write_groups(folder / INDEX_FILE, schema, groups)


def _write_groups(path: Path, schema: pa.Schema, groups: Iterable[pa.Table]) -> dict[str, Any]:
    """Write a per-sample table given as row groups of :data:`ROW_GROUP_ROWS` rows (the last
    fewer), zstd, atomically; return its manifest entry. The file is the one ``pq.write_table``
    writes of the groups joined, with ``row_group_size=ROW_GROUP_ROWS``."""
    written = 0
    with atomic_output(path) as fh, pq.ParquetWriter(fh, schema, compression="zstd") as writer:
        for group in groups:
            writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
            written += group.num_rows
            del group
        if not written:
            writer.write_table(schema.empty_table(), row_group_size=1)
    size, digest = file_sha256(path)
    return {"file": path.name, "bytes": size, "sha256": digest, "rows": written}


def _write_table(path: Path, table: pa.Table) -> dict[str, Any]:
    """Write a whole per-sample table as :func:`_write_groups` writes its groups."""
    return _write_groups(path, table.schema, (table.slice(start, ROW_GROUP_ROWS)
                                              for start in range(0, table.num_rows, ROW_GROUP_ROWS)))


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
    # days since the entity's first record, for the rows with a time (the others have none)
    timed = np.flatnonzero(~samples.field_text("time").null)
    entity_codes, _ = samples.codes("entity")
    times = samples.field_text("time").take(timed).values()
    first: dict[int, str] = {}
    for entity, time in zip(entity_codes[timed].tolist(), times, strict=True):
        if time is not None and (entity not in first or time < first[entity]):
            first[entity] = time
    shifted = replace(phi, dates="shift")
    since = np.full(len(samples), np.nan)
    since[timed] = [np.nan if (d := shifted.time(time, first.get(entity))) is None else d
                    for entity, time in zip(entity_codes[timed].tolist(), times, strict=True)]
    days = pa.array(since, pa.float64(), mask=np.isnan(since))
    del times, first, since
    split_of = split_codes(samples, assignment.split)
    if (split_of < 0).any():
        raise KeyError(samples.value("key", int(np.flatnonzero(split_of < 0)[0])))  # every packed sample has a split
    fold_of = fold_codes(samples, assignment.fold)
    # the columns in the table's order: whole where they are views of the table's buffers or
    # numbers, as codes where they are few distinct values (entity, label, split); the rows are
    # put in key order, and the codes' text made, a row group at a time
    whole = {
        "key": keys,
        "sample_id": samples.arrow("sample_id"),
        "fold": pa.array(fold_of.astype(np.int32), pa.int32(), mask=fold_of < 0),
        "time": samples.arrow("time") if phi.dates == "keep" else pa.nulls(len(keys), pa.string()),
        "days_since_first": days,
    }
    del fold_of
    split_names = pa.array(list(SPLITS), pa.string())
    coded = {"entity_id": samples.coded_text("entity"), "label": samples.coded_text("label"),
             "split": (split_of.astype(np.int32), split_names,
                       int(np.array([len(n) for n in SPLITS], dtype=np.int64)[split_of].sum()))}
    # a text column past STRING_MAX_BYTES is written large_string (text_type), the others as the schema says
    schema = fitted_schema(SPLITS_SCHEMA, {**whole, **{name: size for name, (_, _, size) in coded.items()}})
    at = order.to_numpy()

    def column(name: str, rows: pa.Array, start: int) -> pa.Array:
        if name in whole:
            return whole[name].take(rows)
        codes, values, _ = coded[name]
        return values.take(pa.array(codes[at[start:start + len(rows)]]))

    def groups() -> Iterator[pa.Table]:
        for start in range(0, len(order), ROW_GROUP_ROWS):
            rows = order.slice(start, ROW_GROUP_ROWS)
            yield pa.table([column(field.name, rows, start).cast(field.type) for field in schema], schema=schema)

    return _write_groups(folder / SPLITS_FILE, schema, groups())


# -- publishing a finished version folder to a remote store ---------------------------------
@dataclass(frozen=True)
class PublishResult:
    """Where a version was published and what was sent.

    ``url``: the remote version folder; ``manifest_url``: its manifest. ``skipped``: the
    remote manifest already held this ``dataset_hash``, nothing was uploaded. ``uploaded``:
    file names in upload order (``manifest.json`` last); ``bytes``: their total size.
    """

    url: str
    manifest_url: str
    skipped: bool
    uploaded: tuple[str, ...] = ()
    bytes: int = 0
    #: shards copied inside the store from an earlier version of the dataset that holds the same
    #: bytes (same sha256) instead of uploaded, and their total size; read back and checked as
    #: uploaded ones are (``uploaded`` lists them too)
    copied: tuple[str, ...] = ()
    copied_bytes: int = 0
    #: objects found damaged (the same size, other bytes) and uploaded anew from the local
    #: version: of this remote version (a rebuild of the same dataset_hash), or copied from an
    #: earlier version whose object is damaged (that version is left as it is: a warning names it)
    repaired: tuple[str, ...] = ()


def _upload_order(names: list[str], manifest: dict[str, Any]) -> list[str]:
    """Shards (manifest order), then the tables and other side files, manifest excluded."""
    shards = [s["file"] for split in manifest["splits"].values() for s in split["shards"]]
    rest = sorted(n for n in names if n not in shards and n != MANIFEST_FILE)
    return [n for n in shards if n in names] + rest


def _recorded(manifest: dict[str, Any], field: str) -> dict[str, Any]:
    """What the manifest records under ``field`` (``sha256``, ``bytes``) for each file it lists
    (shards, index, splits table), by file name."""
    recorded = {s["file"]: s[field] for split in manifest["splits"].values() for s in split["shards"]}
    for value in manifest.values():
        if isinstance(value, dict) and isinstance(value.get("file"), str) and field in value:
            recorded[value["file"]] = value[field]
    return recorded


@dataclass(frozen=True)
class _RemoteState:
    """What the remote version folder holds: a manifest (``exists``), the dataset_hash it records
    (None when it is damaged or edited, or a file ``manifest`` lists is missing there or has
    another size: a version to publish again, not to skip), and, where that hash is the local
    version's, which listed objects hold their manifest's bytes (``intact``) and which, of the
    same size, do not (``damaged``)."""

    exists: bool
    dataset_hash: str | None
    intact: frozenset[str] = frozenset()
    damaged: tuple[str, ...] = ()


def _record_file(local: Path) -> Path:
    """Where the ETags of the objects a publish of the local version ``local`` checked are kept:
    beside it in the local dataset folder (a dot file: no version, and not uploaded), by URL."""
    return local.parent / f".published-{local.name}.json"


def _checked_etags(local: Path, url: str) -> dict[str, str]:
    """The ETags the objects of the remote version ``url`` had when a publish of ``local`` last
    read them back (or checked them) and found them whole; empty where none is recorded."""
    try:
        recorded = json.loads(_record_file(local).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # a cache of checks only: check the objects again
        _warn(f"{_record_file(local)} could not be read ({err}); every object of {url} is checked again")
        return {}
    etags = recorded.get(url) if isinstance(recorded, dict) else None
    return {str(k): str(v) for k, v in etags.items()} if isinstance(etags, dict) else {}


def _record_checked(folder: VersionFolder, local: Path, names: list[str]) -> None:
    """Record the ETags the objects ``names`` of ``folder`` have now, just checked whole, so the
    next publish of the same version takes an unchanged ETag (the object not rewritten since)
    without hashing anything. A file that cannot be written is a warning: the next publish checks
    the objects again."""
    url = folder.where()
    listing = folder.listing()
    etags = {name: listing[name][1] for name in names if name in listing and listing[name][1]}
    path = _record_file(local)
    try:
        recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        recorded = {}  # rewritten below with this URL's checks
    recorded = {**(recorded if isinstance(recorded, dict) else {}), url: etags}
    try:
        with atomic_output(path) as fh:
            fh.write(json.dumps(recorded, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as err:
        _warn(f"{path} could not be written ({err}); the next build checks every object of {url} again")


def _remote_state(folder: VersionFolder, storage_options: Mapping[str, Any] | None, manifest: dict[str, Any],
                  local: Path) -> _RemoteState:
    """The remote version folder's :class:`_RemoteState`. Where it records the local version's
    dataset_hash, every object the manifest lists is checked, not only its size: an object whose
    ETag is the one it had when a publish last found it whole (:func:`_record_checked`) has not
    been rewritten since; else its ETag is compared with the MD5 of the local file's bytes
    (:func:`packer.storage.etag_matches`: a local read, no download), else it is read back and
    hashed against the manifest's sha256."""
    try:
        listing = folder.listing()
    except FileNotFoundError:  # no such folder yet
        return _RemoteState(False, None)
    if MANIFEST_FILE not in listing:
        return _RemoteState(False, None)
    listed = _recorded(manifest, "bytes")
    if any(name not in listing or listing[name][0] != size for name, size in listed.items()):
        return _RemoteState(True, None)
    remote_hash = read_dataset_hash(folder.where(MANIFEST_FILE), storage_options=storage_options)
    if remote_hash != manifest["dataset_hash"]:
        return _RemoteState(True, remote_hash)
    recorded = _recorded(manifest, "sha256")
    checked = _checked_etags(local, folder.where())
    intact, damaged = set(), []
    for name in _upload_order(list(listed), manifest):
        etag = listing[name][1]
        if (etag is not None and checked.get(name) == etag) or etag_matches(etag, local / name) \
                or folder.sha256(name)[1] == recorded[name]:
            intact.add(name)
        else:
            damaged.append(name)
    return _RemoteState(True, remote_hash, frozenset(intact), tuple(damaged))


def publish_version(local_version_dir: Path, remote_url: str, *, storage_options: Mapping[str, Any] | None = None,
                    include_local_only: bool = False, quiet: bool = True) -> PublishResult:
    """Upload a built version folder to ``<remote_url>/<name>/<version>/``, manifest last.

    ``local_version_dir`` holds a finished build (``manifest.json`` included). Uploads every
    file except stale ``*.partial`` temporaries and, unless ``include_local_only``, the
    files that name raw paths (:data:`LOCAL_ONLY`: the bad-sample report, ``leakage.json``,
    ``report.html``). Order: shards, then the tables, then — only after every object was
    read back and matched the manifest's size and sha256 — ``manifest.json``. A remote
    folder that already holds a manifest with the same ``dataset_hash`` is left alone
    (``skipped``) when every file it lists holds the manifest's bytes (:func:`_remote_state`:
    an ETag that is their MD5, else read back); a file missing there or of another size makes
    the whole version upload again, a damaged one of the same size is put there again alone
    (``repaired``, with a warning on stderr saying how, once done: copied in the store from an
    earlier version that holds the same shard, else uploaded from ``local_version_dir``). A
    damaged or different remote version has its manifest deleted before anything is uploaded,
    so readers never see a manifest over half-replaced shards. A shard copied in the store from an earlier version
    (:func:`_copy_earlier`) that reads back damaged is uploaded from ``local_version_dir``
    instead (``repaired``; the warning names the earlier object). An interrupted
    publish leaves objects without a manifest; publishing again replaces them.

    Raises ``ConfigError`` (bucket missing, no credentials, access denied, endpoint
    unreachable), ``IntegrityError`` when an uploaded object reads back different from the
    manifest (the remote folder then has no manifest), ``PackerError`` for other failures.
    """
    local_version_dir = Path(local_version_dir)
    manifest_bytes = (local_version_dir / MANIFEST_FILE).read_bytes()
    manifest = read_manifest(local_version_dir / MANIFEST_FILE).data
    target = join_url(remote_url, manifest["name"], manifest["version"])
    folder = VersionFolder(target, storage_options)
    target, result_url = folder.where(), folder.where(MANIFEST_FILE)
    say: Callable[[str], None] = (lambda _: None) if quiet else (lambda m: print(f"packer: {m}", flush=True))
    try:
        state = _remote_state(folder, storage_options, manifest, local_version_dir)
        if state.dataset_hash == manifest["dataset_hash"] and not state.damaged:
            _record_checked(folder, local_version_dir, sorted(state.intact))
            say(f"{result_url} already holds dataset_hash {manifest['dataset_hash'][:12]}: nothing uploaded")
            return PublishResult(url=target, manifest_url=result_url, skipped=True)
        if state.exists:
            say(f"{result_url} holds another or a damaged version (a different manifest, or a file it lists missing, "
                "of another size or damaged): removing its manifest before uploading")
            folder.remove(MANIFEST_FILE)
        names = [p.name for p in sorted(local_version_dir.iterdir())
                 if p.is_file() and not p.name.endswith(TMP_SUFFIX)
                 and (include_local_only or p.name not in LOCAL_ONLY)]
        order = [name for name in _upload_order(names, manifest) if name not in state.intact]
        recorded = _recorded(manifest, "sha256")
        # only what is to be uploaded: an object already intact here is never overwritten by a copy
        # (an earlier version's object may be damaged, and only the uploaded ones are read back)
        copied, sources = _copy_earlier(folder, VersionFolder(join_url(remote_url, manifest["name"]),
                                                              storage_options), manifest, storage_options,
                                        only=frozenset(order))
        total, repaired = _upload(folder, local_version_dir, order, recorded, copied=sources)
        for name in repaired:
            copied.pop(name, None)
        for name in state.damaged:  # a warning, not progress: printed under quiet too; said once it is done
            how = f"copied it again in the store from {sources[name]}" if name in copied else \
                f"uploaded it again from {local_version_dir / name}"
            _warn(f"{folder.where(name)} has the size but not the sha256 its manifest records (damaged in the "
                  f"store); {how}")
        folder.upload([local_version_dir / MANIFEST_FILE], [MANIFEST_FILE])
        if folder.read_bytes(MANIFEST_FILE) != manifest_bytes:
            folder.remove(MANIFEST_FILE)
            raise IntegrityError(f"{result_url}: the uploaded manifest reads back different from "
                                 f"{local_version_dir / MANIFEST_FILE}; removed it: rerun the build to publish again")
        _record_checked(folder, local_version_dir, sorted(_recorded(manifest, "bytes")))
    except remote_errors() as err:
        raise storage_error(target, err, doing=f"publishing {local_version_dir} to {target}/") from err
    copied_bytes = sum(copied.values())
    reused = f", {len(copied)} shards ({copied_bytes / 2**20:.1f} MiB) copied in the store from earlier versions" \
        if copied else ""
    say(f"published {len(order) + 1} files ({(total + len(manifest_bytes) - copied_bytes) / 2**20:.1f} MiB uploaded"
        f"{reused}) to {target}/, each read back and checked")
    return PublishResult(url=target, manifest_url=result_url, skipped=False, uploaded=(*order, MANIFEST_FILE),
                         bytes=total + len(manifest_bytes), copied=tuple(copied), copied_bytes=copied_bytes,
                         repaired=(*state.damaged, *repaired))


def _warn(message: str) -> None:
    print(f"packer: warning: {message}", file=sys.stderr, flush=True)


def _copy_earlier(folder: VersionFolder, dataset: VersionFolder, manifest: dict[str, Any],
                  storage_options: Mapping[str, Any] | None, *, only: frozenset[str] | None = None
                  ) -> tuple[dict[str, int], dict[str, str]]:
    """Copy into ``folder``, inside the store, each shard of ``manifest`` (of those named in
    ``only``, where given: the ones to upload) that an earlier version in ``dataset`` (the remote
    dataset folder) lists with the same sha256 and size, instead of uploading it (the caller
    reads every object it uploads back and checks it, these too; a shard already intact in
    ``folder`` is not in ``only``, so a damaged earlier object is never copied over it unread).
    Versions whose manifest does not read cleanly are not used, nor an object whose size is not
    the one its manifest records. Returns the copied shards' sizes by name, and where each was
    copied from (its earlier object, as a user would type it)."""
    wanted = {s["sha256"]: (s["file"], s["bytes"]) for split in manifest["splits"].values() for s in split["shards"]
              if only is None or s["file"] in only}
    copied: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name in dataset.folders():
        if name == manifest["version"] or len(copied) == len(wanted):
            continue
        earlier = VersionFolder(join_url(dataset.url, name), storage_options)
        try:
            other = read_manifest(earlier.where(MANIFEST_FILE), storage_options=storage_options, strict=False)
        except (PackerError, FileNotFoundError):
            continue  # not a version (no manifest, or not one packer can read): nothing to copy from
        if other.problems or other.data.get("format") != manifest["format"]:
            continue
        sizes = earlier.sizes()
        for split in other.data["splits"].values():
            for shard in split["shards"]:
                file, size = wanted.get(shard["sha256"], ("", -1))
                if file and file not in copied and size == shard["bytes"] == sizes.get(shard["file"]) and \
                        folder.copy_from(earlier, shard["file"], file):
                    copied[file] = size
                    sources[file] = earlier.where(shard["file"])
    return copied, sources


def _upload(folder: VersionFolder, local: Path, order: list[str], recorded: dict[str, str],
            copied: Mapping[str, str] | None = None) -> tuple[int, list[str]]:
    """Upload ``order`` (concurrently where the filesystem can) but ``copied`` (already there:
    copied in the store, from the earlier object each names), then read each back, those too,
    and check it. A copied object that reads back other than the manifest records is uploaded
    from ``local`` (the earlier version's object is damaged: a warning names it, and the copy
    is not kept) and checked again. Returns the bytes checked and the names uploaded so."""
    copied = copied or {}
    sent = [n for n in order if n not in copied]
    folder.upload([local / n for n in sent], sent)
    total = 0
    repaired: list[str] = []
    for name in order:
        expected = recorded.get(name)
        if expected is None:  # not a file the manifest hashes (e.g. report.html): compare with the local copy
            expected = file_sha256(local / name)[1]
        problem = _read_back(folder, local, name, expected)
        if problem is not None and name in copied:
            _warn(f"{copied[name]} is damaged ({problem}, copied in the store to {folder.where(name)}); uploaded "
                  f"{local / name} there instead. The earlier version is left as it is: check it with "
                  f"`packer verify {copied[name].rsplit('/', 1)[0]}`")
            folder.upload([local / name], [name])
            repaired.append(name)
            problem = _read_back(folder, local, name, expected)
        if problem is not None:
            raise IntegrityError(f"{folder.where(name)}: {problem} after upload; nothing was published (no "
                                 f"manifest): check {local / name} with `packer verify {local}` and rebuild or rerun")
        total += (local / name).stat().st_size
    return total, repaired


def _read_back(folder: VersionFolder, local: Path, name: str, expected: str) -> str | None:
    """Why the object ``name`` does not hold the bytes of ``local / name`` whose sha256 is
    ``expected`` (its size, then its sha256 read back), or None when it does."""
    size = (local / name).stat().st_size
    remote_size = folder.size(name)
    if remote_size != size:
        return f"{remote_size} bytes, {local / name} has {size}"
    _, digest = folder.sha256(name)
    if digest != expected:
        return f"sha256 {digest[:16]}…, the manifest records {expected[:16]}…"
    return None
