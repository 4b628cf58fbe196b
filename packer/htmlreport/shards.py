"""Read a bounded, deterministic selection of packed samples back from a version folder.

The sample index (``_index.parquet``) says where each sample sits (tar offset or Parquet row),
so a selection of a few thousand samples reads only those samples from tar shards, whatever
the dataset's size. The selection order is sha256(dataset_hash, key): the same dataset always
shows the same samples, and any other dataset a different, unbiased subset.

The index stays in Arrow columns (:class:`SampleIndex`, about 60 bytes a row) and is ranked
and grouped in numpy; only the rows the report names become Python objects. One
:class:`IndexEntry` per row, with its strings and its sha256 digest, held ~250 bytes a sample
through the whole report (~400 while ranking) and made it the peak of a large build's memory.

A multi-label or numeric dataset's index also has a ``target`` column (the sample's vector,
:mod:`packer.targets`); it is read with the other columns, a few bytes a row. A sample of a
dataset with masks comes with its mask (``<key>.mask.npy``, the ``mask`` columns), read with it.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packer.files import arrow_readable
from packer.manifest import INDEX_SCHEMA
from packer.shards.checksum import INDEX_COLUMN, describe, members_checksum
from packer.shards.members import SampleDefect, decode_mask_member, load_npy
from packer.shards.parquet import read_parquet_samples
from packer.shards.tar import map_shard, read_member_bytes, read_sample_at, scan_tar
from packer.targets import Target

_INDEX_COLUMNS = ["key", "split", "shard", "position", "label", "entity_id", "source"]
_INDEX_SCHEMA = pa.schema([INDEX_SCHEMA.field(name) for name in _INDEX_COLUMNS])  # the build's, these columns
_TARGET = "target"  # the vector column of a multi-label or numeric dataset's index
_FEW_VALUES = ["split", "shard", "entity_id", "source"]  # read dictionary-encoded: 4 bytes a row each
_RANK_BATCH = 4096  # keys (and digests) held as Python objects at a time while ranking
_PARQUET_ROWS = 64  # rows per record batch when reading a Parquet shard's selected samples


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """Where one packed sample is and what it is (a row of ``_index.parquet``)."""

    key: str
    split: str
    shard: str
    position: int
    label: int | None  # the class index; None without a class target
    entity_id: str
    source: str
    #: the multi-label (0/1) or numeric target vector; None without one
    target: tuple[float, ...] | None = None
    #: the sample's checksum as ``_index.parquet`` records it (its ``xxh3``, :mod:`packer.shards.checksum`);
    #: None where the index has none (a scanned index, or one from before per-sample checksums)
    xxh3: int | None = None


@dataclass(frozen=True)
class PackedSample:
    """One sample as stored: ``image`` is the C×H×W array, ``info`` its JSON record, ``mask`` its
    F×H×W segmentation mask (None without one)."""

    entry: IndexEntry
    image: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    mask: np.ndarray | None = None
    #: the checksum of the sample's bytes as read now (:mod:`packer.shards.checksum`); None where
    #: its index row records none to compare it with
    checksum: int | None = None

    @property
    def checksum_failed(self) -> bool:
        """True when the sample's bytes are not those its index row's ``xxh3`` records: its shard
        was damaged after the build, and what the report shows of it is not what was packed."""
        return self.checksum is not None and self.entry.xxh3 is not None and self.checksum != self.entry.xxh3


def selection_rank(dataset_hash: str, key: str) -> bytes:
    """The sort key that orders samples for every bounded selection of the report."""
    return hashlib.sha256(f"packer-report\x00{dataset_hash}\x00{key}".encode()).digest()


@dataclass(frozen=True)
class SampleIndex:
    """The sample index as Arrow columns (``_INDEX_COLUMNS``), one row per sample.

    Rows become :class:`IndexEntry` objects only through :meth:`entries`, for the few thousand
    keys a report names, so the index costs Arrow buffers rather than Python objects per row.
    """

    table: pa.Table

    @classmethod
    def from_entries(cls, entries: Sequence[IndexEntry]) -> SampleIndex:
        """The columnar form of index rows rebuilt by :func:`scan_index` (with a ``target`` column
        when any row has a target vector)."""
        table = pa.table({name: pa.array([getattr(e, name) for e in entries], _INDEX_SCHEMA.field(name).type)
                          for name in _INDEX_COLUMNS}, schema=_INDEX_SCHEMA)
        if any(e.target is not None for e in entries):
            table = table.append_column(_TARGET, pa.array([e.target for e in entries], pa.list_(pa.float64())))
        return cls(table)

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> pa.Array:
        """Column ``name`` as one array: the chunk itself when there is one (``combine_chunks`` copies it)."""
        column = self.table.column(name)
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()

    def codes(self, name: str) -> tuple[np.ndarray, list[Any]]:
        """Per row, the number of its value in column ``name``; and those distinct values."""
        array = self.column(name)
        if pa.types.is_dictionary(array.type) and array.null_count:
            array = array.dictionary_decode()  # a null index would not survive to_numpy
        encoded = pc.dictionary_encode(array, null_encoding="encode")  # a dictionary column passes as is
        return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()

    def keys_at(self, rows: np.ndarray) -> list[str]:
        """The keys of the row numbers ``rows``, in that order."""
        return self.column("key").take(pa.array(rows, pa.int64())).to_pylist()  # type: ignore[no-any-return]

    def entries(self, keys: Iterable[str]) -> dict[str, IndexEntry]:
        """The rows of ``keys`` that are in the index, by key: a key listed twice gives its last row,
        as a dict built from every row would. One vectorised pass over the key column."""
        column = self.column("key")
        wanted = pa.array(sorted(set(keys)), column.type)
        rows = np.flatnonzero(pc.is_in(column, value_set=wanted).to_numpy(zero_copy_only=False))
        cols = self.table.take(pa.array(rows, pa.int64())).to_pydict()
        targets = [None if t is None else tuple(t) for t in cols[_TARGET]] if _TARGET in cols else [None] * len(rows)
        sums = cols[INDEX_COLUMN] if INDEX_COLUMN in cols else [None] * len(rows)
        return {entry.key: entry for entry in
                (IndexEntry(*values) for values in zip(*(cols[name] for name in _INDEX_COLUMNS), targets, sums,
                                                       strict=True))}

    def positives(self) -> tuple[np.ndarray, np.ndarray]:
        """Per nonzero value of the ``target`` column (a multi-label dataset's labels held): its row
        number and its position in the row's vector, by row then position; empty without the column.
        Works on the flat values, so no dense n × labels matrix is made."""
        if _TARGET not in self.table.column_names or not len(self):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        column = self.column(_TARGET)
        ends = np.cumsum(pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
        flat = pc.list_flatten(column)
        hits = np.flatnonzero(pc.fill_null(pc.not_equal(flat, pa.scalar(0, flat.type)), False)
                              .to_numpy(zero_copy_only=False))
        rows = np.searchsorted(ends, hits, side="right")
        starts = np.concatenate((np.zeros(1, np.int64), ends[:-1]))
        return rows, hits - starts[rows]

    def vectors(self, width: int) -> np.ndarray:
        """The ``target`` column as an n × ``width`` float64 matrix; a row without a vector of
        ``width`` values (or an index without the column) is all NaN."""
        matrix = np.full((len(self), width), np.nan)
        if _TARGET not in self.table.column_names or not len(self):
            return matrix
        column = self.column(_TARGET)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(column).cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        fits = lengths == width
        matrix[fits] = flat[np.repeat(fits, lengths)].reshape(-1, width)
        return matrix

    def rank_order(self, dataset_hash: str) -> np.ndarray:
        """Row numbers sorted by ``selection_rank(dataset_hash, key)``, a key listed twice in row order,
        as ``sorted()`` of the rows orders them. The digests are packed into one n × 32-byte array,
        ``_RANK_BATCH`` keys at a time, and sorted as four big-endian words each."""
        keys = self.column("key")
        digests = bytearray(32 * len(keys))
        for start in range(0, len(keys), _RANK_BATCH):
            batch = keys.slice(start, _RANK_BATCH).to_pylist()
            digests[32 * start: 32 * (start + len(batch))] = b"".join([selection_rank(dataset_hash, k) for k in batch])
        words = np.frombuffer(digests, ">u8").reshape(len(keys), 4)
        return np.lexsort(words.T[::-1])  # lexsort's last key sorts first: the digest's first word


def load_index(folder: Path, manifest: dict[str, Any]) -> tuple[SampleIndex, str | None]:
    """The index of a version folder, and a note when it had to be rebuilt.

    Reads ``_index.parquet``; when it is missing or unreadable, scans the shards instead
    (every shard is read once) and says so in the note.
    """
    path = folder / manifest.get("index", {}).get("file", "_index.parquet")
    try:
        # ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose import
        # alone adds 37 MiB to the process (the build's client never needs it otherwise)
        table = _read_columns(path, _INDEX_COLUMNS, read_dictionary=_FEW_VALUES, optional=[_TARGET, INDEX_COLUMN])
    except (OSError, ValueError) as err:
        return (SampleIndex.from_entries(scan_index(folder, manifest)),
                f"{path.name} unreadable ({err}); the shards were scanned instead")
    if any(column.num_chunks > 1 for column in table.columns):  # several row groups: join them once
        table = table.combine_chunks()
    return SampleIndex(table), None


def _read_columns(path: Path, columns: list[str], *, optional: Sequence[str] = (), **options: Any) -> pa.Table:
    """``columns`` of the Parquet file ``path``, and those of ``optional`` that it has; ValueError
    naming any of ``columns`` that it lacks (``ParquetFile.read`` would silently leave it out)."""
    with arrow_readable(path) as source:
        names = pq.read_schema(source).names
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"no column {', '.join(missing)}")
        return pq.ParquetFile(source, **options).read(columns=columns + [c for c in optional if c in names])


def _shard_files(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    return [(split, shard["file"]) for split, entry in manifest.get("splits", {}).items()
            for shard in entry.get("shards", [])]


def scan_index(folder: Path, manifest: dict[str, Any]) -> list[IndexEntry]:
    """Rebuild index rows by reading every shard (used only when ``_index.parquet`` is gone).

    A tar shard is scanned up to its first defect (:func:`packer.shards.tar.scan_tar`); a
    sample without a ``.json`` member has no row. A tar sample's target vector is rebuilt from
    its record (``labels`` or ``target``, :func:`packer.shards.encode.encode_sample`).
    """
    target = Target.of_manifest(manifest)
    rows: list[IndexEntry] = []
    for split, name in _shard_files(manifest):
        path = folder / name
        if not path.exists():
            continue
        if name.endswith(".parquet"):
            cols = _read_columns(path, ["key", "label", "entity_id", "source"], optional=[_TARGET]).to_pydict()
            vectors = cols.get(_TARGET, [None] * len(cols["key"]))
            rows.extend(IndexEntry(k, split, name, i, lab, ent, src, None if vec is None else tuple(vec))
                        for i, (k, lab, ent, src, vec) in
                        enumerate(zip(cols["key"], cols["label"], cols["entity_id"], cols["source"], vectors,
                                      strict=True)))
            continue
        with open(path, "rb") as fh:
            for sample in scan_tar(path).samples:
                members = read_member_bytes(fh, sample, ["json"]) if "json" in sample.members else None
                if isinstance(members, dict):
                    try:
                        info = sample_record(members["json"])
                    except ValueError:  # no record to list it by: the samples read say why, by key
                        continue
                    label = info.get("label_index", -1 if target.has_label else None)
                    rows.append(IndexEntry(sample.key, split, name, sample.offset,
                                           None if label is None else int(label),
                                           str(info.get("entity_id", "")), str(info.get("source", "")),
                                           target.record_vector(info)))
    return rows


def _packed(entry: IndexEntry, members: Mapping[str, bytes | bytearray | memoryview]
            ) -> PackedSample | tuple[IndexEntry, str]:
    """The sample ``entry`` from its tar member bytes by extension (``npy``, and ``json`` and
    ``mask.npy`` if present), or why its mask member cannot be read. The image is a view of its
    member's bytes where they are packer's own layout (read once, never copied again).

    ``members`` holds every member of the sample in the order they sit in the shard, so where the
    index records the sample's ``xxh3`` its checksum is taken over them as the loader takes it
    (``PackedSample.checksum``); a damaged sample is still returned, for the report to flag."""
    checksum = members_checksum(entry.key, members) if entry.xxh3 is not None else None
    raw = members.get("json")
    mask = decode_mask_member(entry.key, bytes(members["mask.npy"])) if "mask.npy" in members else None
    if isinstance(mask, SampleDefect):
        return entry, f"{mask.reason}: {mask.message}" + _failed(entry, checksum)
    try:  # one sample's damaged member is that sample's reason: it stopped the rest of its shard
        image = load_npy(members["npy"], copy=False)
        record = sample_record(bytes(raw)) if raw else {}
    except ValueError as err:  # a damaged .npy header, JSON that does not parse (or is not UTF-8)
        return entry, f"{type(err).__name__}: {err}" + _failed(entry, checksum)
    return PackedSample(entry, image, record, mask, checksum)


def sample_record(raw: str | bytes | bytearray | memoryview) -> dict[str, Any]:
    """A sample's ``.json`` member or ``metadata`` cell as the object packer writes; ValueError
    where it is not JSON, not an object, or nests too deeply to read (an edited shard)."""
    try:
        record = json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
    except RecursionError:
        raise ValueError("its JSON record nests too deeply to read") from None
    if not isinstance(record, dict):
        raise ValueError(f"its JSON record is a {type(record).__name__}, not an object")
    return record


def _plain_shard(name: str) -> bool:
    """True for a shard name as builds write it: one file name in the version folder."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\:\0")


def _failed(entry: IndexEntry, checksum: int | None) -> str:
    """What a sample that could not be shown adds to its reason when its bytes also fail their checksum."""
    if checksum is None or entry.xxh3 is None or checksum == entry.xxh3:
        return ""
    return f" (and its xxh3 {describe(checksum)} is not the {describe(entry.xxh3)} _index.parquet records)"


def _read_tar(path: Path, entries: list[IndexEntry]) -> Iterator[PackedSample | tuple[IndexEntry, str]]:
    """The samples ``entries`` of a tar shard: each read at the position the index records;
    those not found there (stale positions) by scanning the shard's headers. Images are views
    of a private map of the shard (:func:`~packer.shards.tar.map_shard`) where it can be mapped:
    the histograms and thumbnails read the page cache, nothing is copied first."""
    by_key = {e.key: e for e in entries}
    found: set[str] = set()
    with open(path, "rb") as fh:
        mapped = map_shard(fh)
        if all(e.position >= 0 for e in entries):
            for entry in sorted(entries, key=lambda e: e.position):
                try:
                    members = read_sample_at(fh, entry.position, entry.key, mapped)
                except tarfile.TarError:
                    continue  # not a member header at this offset: the scan below looks for it
                if "npy" in members:
                    found.add(entry.key)
                    yield _packed(entry, members)
        if len(found) == len(by_key):
            return
        index = scan_tar(path)
        samples = {s.key: s for s in index.samples if s.key in by_key and s.key not in found}
        for key, sample in sorted(samples.items()):
            # every member, in shard order: the checksum covers them all (the known ones are decoded)
            read = read_member_bytes(fh, sample, list(sample.members))
            if isinstance(read, SampleDefect):
                yield by_key[key], f"{read.reason}: {read.message}"
            elif "npy" in read:
                yield _packed(by_key[key], read)
    if index.defect is not None:
        for key in sorted(set(by_key) - found - set(samples)):
            yield by_key[key], f"not found before the shard's defect ({index.defect})"


def _read_parquet(path: Path, entries: list[IndexEntry]) -> Iterator[PackedSample | tuple[IndexEntry, str]]:
    """The samples ``entries`` of a Parquet shard, found by key (the key column is read whole)."""
    keys = _read_columns(path, ["key"]).column("key").to_pylist()
    row_of = {k: i for i, k in enumerate(keys)}
    by_row = {row_of[e.key]: e for e in entries if e.key in row_of}
    source = pa.memory_map(str(path), "r")
    check = any(e.xxh3 is not None for e in by_row.values())  # the cells are hashed only to compare with the index
    for row, result in read_parquet_samples(source, sorted(by_row), records=True, batch_rows=_PARQUET_ROWS,
                                            checksums=check):
        entry = by_row[row]
        checksum = result.checksum if check and entry.xxh3 is not None else None
        if isinstance(result, SampleDefect):
            yield entry, f"{result.reason}: {result.message}" + _failed(entry, checksum)
        else:
            try:
                record = sample_record(result.record) if result.record else {}
            except ValueError as err:
                yield entry, f"{type(err).__name__}: {err}" + _failed(entry, checksum)
                continue
            yield PackedSample(entry, result.image, record, result.mask, checksum)


def read_samples(folder: Path, entries: Iterable[IndexEntry]) -> Iterator[PackedSample | tuple[IndexEntry, str]]:
    """Yield the requested samples shard by shard (shards in name order).

    A sample that cannot be read (missing shard, damaged member) is yielded as
    ``(entry, reason)`` instead, so the report can say what it could not show.
    """
    by_shard: dict[str, list[IndexEntry]] = defaultdict(list)
    for entry in entries:
        by_shard[entry.shard].append(entry)
    for shard in sorted(by_shard):
        wanted = by_shard[shard]
        if not _plain_shard(shard):  # an edited index: open nothing outside the version folder
            for entry in wanted:
                yield entry, f"{shard!r}: not a plain file name inside the version folder (not opened)"
            continue
        path = folder / shard
        seen: set[str] = set()
        try:
            reader = _read_parquet if shard.endswith(".parquet") else _read_tar
            for sample in reader(path, wanted):
                if isinstance(sample, PackedSample):
                    seen.add(sample.entry.key)
                    yield sample
                else:
                    seen.add(sample[0].key)
                    yield sample[0], f"{shard}: {sample[1]}"
        except (OSError, ValueError, KeyError, tarfile.TarError) as err:
            reason = f"{shard}: {type(err).__name__}: {err}"
        else:
            reason = f"{shard}: sample not found in the shard"
        for entry in wanted:
            if entry.key not in seen:
                yield entry, reason
