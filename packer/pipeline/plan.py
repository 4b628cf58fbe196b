"""Plan shard boundaries from exact sample sizes, before any shard is written.

Boundaries are a pure function of one split's ordered ``(key, size)`` list and the pack limits,
so they never depend on how many workers run or in which order tasks finish. They are also
local: where a shard ends depends on its own start and on the samples that could close it, not
on the rest of the split, so an incremental build that adds or removes a few samples keeps the
other shards' sample lists, and so their bytes (:func:`shard_bounds`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from packer.config import SPLITS, PackConfig
from packer.files import canonical_json
from packer.pipeline.sampletable import SampleTable
from packer.records import SampleRef, SpilledSample
from packer.shards.encode import EncodedSample, encode_sample
from packer.shards.members import npy_header
from packer.shards.tar import BLOCK, RECORD, member_bytes, npy_bytes
from packer.targets import Target

#: Bytes a sample adds beyond the sizes :func:`shard_bounds` is given: none for a tar shard,
#: whose sizes are already each sample's exact bytes in the file (:func:`tar_sizes`),
#: and Parquet's per-row share of page and column overhead and of the record's fixed fields
#: beyond what :func:`parquet_sizes` counts (pixels, metadata, mask, target cells and fields, extras).
PER_SAMPLE_OVERHEAD = {"webdataset": 0, "parquet": 64}
#: Bytes a Parquet shard adds once, whatever its samples: the footer (schema, column chunk
#: metadata and statistics) and each column's page headers. An estimate: 3.2 KB measured for
#: the 11 columns of a shard without masks or targets; 8 KiB leaves room for those columns.
#: A tar's fixed bytes are exact instead (:func:`sample_budget`).
PARQUET_SHARD_OVERHEAD = 8 * 1024
EXTENSIONS = {"webdataset": "tar", "parquet": "parquet"}

#: A shard may close once it is this full, in percent of ``max_bytes`` or of ``max_samples``
#: (whichever it reaches first), so every shard but a split's last holds 75-100% of a limit:
#: the ±25% size spread the incremental builds of issue 39 allow, and no tighter, because the
#: wider the window of samples that may close a shard, the rarer an edit moves the next
#: shard's start (``benchmarks/shard_plan.py``).
MIN_FILL_PERCENT = 75

_CUT_PERSON = b"packer-shard"  # blake2b personalisation: these hashes mean nothing else


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write, as a pack task carries it: its file name, split, index and the
    samples that go in it, in order (the planned rows of the build's sample table)."""

    file: str
    split: str
    index: int
    samples: Sequence[SpilledSample]


def shard_file(split: str, index: int, fmt: str) -> str:
    return f"{split}-{index:06d}.{EXTENSIONS[fmt]}"


def cut_hashes(keys: Sequence[str]) -> np.ndarray:
    """Each key's cut hash (uint64): the first 8 bytes of blake2b over the key's UTF-8 text,
    the same on every machine, Python build and worker (never Python's salted ``hash``)."""
    return np.array([_cut_hash(key.encode()) for key in keys], dtype=np.uint64)


def _cut_hash(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, person=_CUT_PERSON).digest(), "big")


#: rows whose offsets are turned into Python ints at a time by :func:`row_cut_hashes`
_HASH_BATCH = 65_536


def row_cut_hashes(samples: SampleTable, rows: np.ndarray) -> np.ndarray:
    """:func:`cut_hashes` of the keys of ``samples``' ``rows``, read from the table's key buffer
    (no ``str`` per record, and offsets turned into Python ints a batch at a time)."""
    data, ends = samples.text_bytes("key")
    out = np.empty(len(rows), dtype=np.uint64)
    for at in range(0, len(rows), _HASH_BATCH):
        batch = rows[at:at + _HASH_BATCH]
        starts = np.where(batch > 0, ends[np.maximum(batch - 1, 0)], 0)
        out[at:at + len(batch)] = [_cut_hash(data[start:end])
                                   for start, end in zip(starts.tolist(), ends[batch].tolist(), strict=True)]
    return out


def shard_bounds(keys: Sequence[str], sizes: Sequence[int], *, fmt: str, max_samples: int,
                 max_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each shard over samples with these ``keys`` and ``sizes`` in bytes
    (one split, already in its final order), counting each sample's bytes plus the format's
    per-sample overhead (:data:`PER_SAMPLE_OVERHEAD`: for a tar, ``sizes`` are each sample's
    exact bytes in the file, :func:`tar_sizes`), and the file's own fixed bytes (:func:`sample_budget`).

    Hard limits: a shard never holds more than ``max_samples`` samples or ``max_bytes`` bytes
    (its tar end blocks and record padding included; Parquet's footer estimated), except that a
    sample that cannot fit with them on its own gets a shard to itself. "Full" and "fits" below
    are of the bytes the samples may take, :func:`sample_budget`.

    Content-defined ends: from a shard's start, the samples after which it may close are those
    where it is at least :data:`MIN_FILL_PERCENT` full (of ``max_bytes`` or of
    ``max_samples``, whichever it reaches first) and still within both limits; it closes after
    the one of them whose key has the smallest :func:`cut_hash <cut_hashes>`. So a shard's end
    depends on its start and on the keys and sizes up to one shard ahead, nothing else: an
    inserted or removed sample changes the shard it falls in and, where it moves that shard's
    end, the shards after it until an end falls on the same key again (usually the next one;
    the measured distribution is in ``benchmarks/RESULTS.md``). Where no sample can close the
    shard in that window (a sample jumps from under the minimum to over a limit), it closes
    after the last sample that fits. The samples left at the end of the split are one shard
    when they fit in one.
    """
    if len(keys) != len(sizes):
        raise ValueError(f"shard_bounds: {len(keys)} keys but {len(sizes)} sizes; pass one size per key")
    return _bounds(cut_hashes(keys), sizes, fmt=fmt, max_samples=max_samples, max_bytes=max_bytes)


#: What each byte of a text value adds to its JSON spelling (``json.dumps(..., ensure_ascii=False)``):
#: a quote or backslash and the control characters with a short escape (``\b \t \n \f \r``)
#: one byte, other control characters five (``\u00XX``); everything else, UTF-8 included, none.
_JSON_ESCAPE = np.zeros(256, dtype=np.uint8)
_JSON_ESCAPE[:0x20] = 5
_JSON_ESCAPE[[0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x22, 0x5C]] = 1
#: text bytes looked at a time by :func:`_json_text_bytes` (bounds its temporary arrays)
_ESCAPE_CHUNK = 1 << 24


def _json_text_bytes(samples: SampleTable, name: str) -> np.ndarray:
    """Bytes each row's value of text field ``name`` takes in canonical JSON beyond the empty
    string ``""``: its UTF-8 bytes and their escapes; 2 for a missing value (``null``)."""
    text = samples.field_text(name)
    out = np.diff(text.ends, prepend=np.int64(0)).astype(np.int64)
    data = np.frombuffer(text.data, dtype=np.uint8)
    for at in range(0, len(data), _ESCAPE_CHUNK):
        costs = _JSON_ESCAPE[data[at:at + _ESCAPE_CHUNK]]
        hits = np.flatnonzero(costs)
        if hits.size:  # rare: the rows holding such bytes get their escapes' extra bytes
            np.add.at(out, np.searchsorted(text.ends, hits + at, side="right"), costs[hits].astype(np.int64))
    out[text.null] = 2
    return out


def _json_value_bytes(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())


@dataclass(frozen=True)
class TarSizes:
    """What each row of a sample table takes in a tar shard (:func:`tar_sizes`), but for the split
    its record names (:meth:`of` adds it): ``record`` the bytes of its ``.json`` record without
    the split, ``members`` the bytes of all its other members, headers and padding included."""

    record: np.ndarray
    members: np.ndarray

    def of(self, rows: np.ndarray, split: str) -> np.ndarray:
        """The exact bytes (int64) the samples at ``rows`` take in a tar shard of ``split``."""
        record = self.record[rows] + _json_value_bytes(split) - 2  # the template's split is ""
        return self.members[rows] + BLOCK + -(-record // BLOCK) * BLOCK


def tar_sizes(samples: SampleTable, target: Target, *, raw_paths: bool = False) -> TarSizes:
    """Each sample's bytes in a tar shard, as :func:`~packer.shards.tar.write_tar_shard` writes
    it from :func:`~packer.shards.encode.encode_sample`: every member it will hold (``.cls``,
    ``.json``, ``.npy``, ``.mask.npy``, ``.target.npy``, ``.target_mask.npy``) as its 512-byte
    header and its data padded to whole blocks, with the ``.npy`` header's exact length, the
    ``.cls`` text's and the record's. ``raw_paths``: records name their raw files (``phi.mode: keep``).

    The record's length is that of a template record made by ``encode_sample`` itself for each
    label (every field's text empty, metadata ``{}``), plus each field's own text as canonical
    JSON spells it, with the spilled metadata's bytes (canonical JSON already, written into the
    record as they are). Per row it is numpy over the table's buffers; per distinct label,
    shape, dtype, source and so on a few Python calls."""
    label_codes, label_texts, templates = _label_templates(samples, target, raw_paths=raw_paths)
    members = np.zeros(samples.size, dtype=np.int64)
    record = np.zeros(samples.size, dtype=np.int64)
    base_record = np.zeros(len(label_texts), dtype=np.int64)
    label_members = np.zeros(len(label_texts), dtype=np.int64)
    for code, encoded in templates.items():
        base_record[code] = len(canonical_json(encoded.info))
        label_members[code] = ((member_bytes(len(str(encoded.label).encode())) if encoded.label is not None else 0)
                               + (member_bytes(len(npy_bytes(encoded.target))) if encoded.target is not None else 0)
                               + (member_bytes(len(npy_bytes(encoded.target_mask)))
                                  if encoded.target_mask is not None else 0))
    record += base_record[label_codes]
    members += label_members[label_codes]
    for name in ("key", "sample_id"):
        record += _json_text_bytes(samples, name)
    if raw_paths:
        path = _json_text_bytes(samples, "relpath")
        missing = samples.field_text("relpath").null  # no path field at all: less its name and comma
        record += np.where(missing, -len(',"path":""'), path)
    for name in ("source", "kind", "entity", "dtype"):
        codes, values = samples.codes(name)
        record += np.array([_json_value_bytes(v) - 2 for v in values], dtype=np.int64)[codes] if values else 0
    shape_codes, shapes = samples.codes("shape")
    if shapes:
        record += np.array([_json_value_bytes(list(s)) - 2 for s in shapes], dtype=np.int64)[shape_codes]
    record += _extra_bytes(samples)
    record += samples.array("meta_bytes") - 2  # the template's metadata is {}
    dtype_codes, dtypes = samples.codes("dtype")
    if shapes and dtypes:  # the pixels' member: numpy.save's header, then the raw pixels
        pairs = shape_codes.astype(np.int64) * len(dtypes) + dtype_codes
        heads = np.zeros(len(shapes) * len(dtypes), dtype=np.int64)
        for p in np.flatnonzero(np.bincount(pairs, minlength=len(heads))).tolist():
            heads[p] = len(npy_header(tuple(shapes[p // len(dtypes)]), str(dtypes[p % len(dtypes)])))
        npy = heads[pairs] + samples.array("pixel_bytes")
        members += BLOCK + -(-npy // BLOCK) * BLOCK
    mask = samples.array("mask_bytes")
    members += np.where(mask > 0, BLOCK + -(-mask // BLOCK) * BLOCK, 0)  # a sample without a mask has no member
    return TarSizes(record=record, members=members)


def _label_templates(samples: SampleTable, target: Target, *,
                     raw_paths: bool) -> tuple[np.ndarray, Sequence[str | None], dict[int, EncodedSample]]:
    """Each row's label code, the labels' texts, and per label code a sample holds the sample
    :func:`~packer.shards.encode.encode_sample` makes of it with every other field's text empty
    and metadata ``{}``: its target cells and record fields are those of every sample of that label."""
    label_codes, label_texts = samples.codes("label")
    templates: dict[int, EncodedSample] = {}
    for code in np.flatnonzero(np.bincount(label_codes, minlength=len(label_texts))).tolist():
        text = label_texts[code]
        if text is None:
            row = int(np.flatnonzero(label_codes == code)[0])
            raise ValueError(f"plan_shards: sample {samples.value('key', row)!r} has no label; only samples with "
                             "one are packed (discovery gives each packed sample its target)")
        ref = SampleRef(sample_id="", source="", kind="", path="", relpath="", label=text, entity="")
        templates[code] = encode_sample(key="", ref=ref, shape=(), dtype="", pixels=b"", metadata={}, split="",
                                        target=target, relpath="" if raw_paths else None)
    return label_codes, label_texts, templates


def _extra_bytes(samples: SampleTable) -> np.ndarray:
    """Bytes each row's ``extra`` field (a table's other cells) takes in its record: its name,
    value and comma where a sample has any, else 0 (int64)."""
    extra_codes, extras = samples.codes("extra")
    if not extras:
        return np.zeros(samples.size, dtype=np.int64)
    return np.array([len(canonical_json({"extra": dict(e)})) - 1 if e else 0 for e in extras],
                    dtype=np.int64)[extra_codes]


def _list_cell_bytes(values: np.ndarray | None) -> int:
    """An upper bound on the bytes a ``target``/``target_mask`` cell takes in a Parquet shard:
    those columns are stored uncompressed (:func:`~packer.shards.parquet.write_parquet_shard`),
    as the raw values plus their repetition (1 bit) and definition (2 bits) levels, bit-packed
    at worst, with a few bytes of run headers."""
    if values is None:
        return 0
    return values.nbytes + -(-3 * values.size // 8) + 8


def parquet_sizes(samples: SampleTable, target: Target | None) -> np.ndarray:
    """Each sample's bytes in a Parquet shard beyond :data:`PER_SAMPLE_OVERHEAD` (int64): an
    upper bound on what :func:`~packer.shards.parquet.write_parquet_shard` writes of it that
    grows with the data. Its pixels, spilled metadata and mask (:attr:`SampleTable.nbytes`);
    where ``target`` gives the sample a vector (multi-label, numeric), its ``target`` and
    ``target_mask`` cells (:func:`_list_cell_bytes`) and the record fields that name it in the
    ``metadata`` cell (uncompressed: a 300-column numeric target is ~1.2 KB of cells and ~7 KB
    of names and numbers); the record's ``extra`` field (a table's other cells, such as a
    free-text report) as :func:`tar_sizes` counts it. The record's fixed fields (key, ids,
    source, split, shape, a class's name and index) are within the row's 64 bytes with the
    spilled metadata counted uncompressed, so a class dataset without extra columns is sized
    by its pixels, metadata and mask alone. ``target`` None: no target cells or fields."""
    sizes = samples.nbytes + _extra_bytes(samples)
    if target is None:
        return sizes
    label_codes, label_texts, templates = _label_templates(samples, target, raw_paths=False)
    vector = np.zeros(len(label_texts), dtype=np.int64)
    for code, encoded in templates.items():
        if encoded.target is None:
            continue  # a class label (or no target): its name and index are in the row's share
        fields = target.record_fields(str(label_texts[code]), encoded.label, encoded.target)
        named = len(canonical_json(fields)) - 1 if fields else 0  # its fields, less the braces, and a comma
        vector[code] = named + _list_cell_bytes(encoded.target) + _list_cell_bytes(encoded.target_mask)
    return sizes + vector[label_codes]


def sample_budget(fmt: str, max_bytes: int) -> int:
    """The bytes a shard's samples (each with :data:`PER_SAMPLE_OVERHEAD`) may take so that the
    file stays within ``max_bytes``: a tar ends with two zero blocks and is padded to a whole
    10,240-byte record (so it is never larger than the records ``max_bytes`` holds whole), a
    Parquet file adds its footer (:data:`PARQUET_SHARD_OVERHEAD`). Zero or less where even one
    sample cannot fit (a tar under ``max_bytes`` < 10,240): every shard then holds one sample."""
    if fmt == "webdataset":
        return max_bytes // RECORD * RECORD - 2 * BLOCK
    return max_bytes - PARQUET_SHARD_OVERHEAD


def _bounds(cuts: np.ndarray, sizes: Sequence[int] | np.ndarray, *, fmt: str, max_samples: int,
            max_bytes: int) -> list[tuple[int, int]]:
    """:func:`shard_bounds` of samples whose keys' cut hashes are ``cuts``."""
    count = len(cuts)
    ends = np.zeros(count + 1, dtype=np.int64)  # ends[i]: bytes of samples [0, i)
    np.cumsum(np.asarray(sizes, dtype=np.int64) + PER_SAMPLE_OVERHEAD[fmt], out=ends[1:])
    budget = sample_budget(fmt, max_bytes)  # the file's own fixed bytes count against max_bytes too
    min_samples = -(-max_samples * MIN_FILL_PERCENT // 100)
    min_bytes = -(-budget * MIN_FILL_PERCENT // 100)
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < count:
        base = int(ends[start])
        if count - start <= max_samples and int(ends[count]) - base <= budget:
            bounds.append((start, count))
            break
        # stop: the most samples that fit (at least one); first: the fewest that reach the minimum
        stop = max(start + 1, min(start + max_samples, int(np.searchsorted(ends, base + budget, "right")) - 1))
        first = max(start + 1, min(start + min_samples, int(np.searchsorted(ends, base + min_bytes, "left"))))
        if first <= stop:
            stop = first + int(np.argmin(cuts[first - 1:stop]))
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class PlannedShard:
    """A planned shard: its file, split and index, and the rows of its samples (in the order they
    go in) in the build's sample table."""

    file: str
    split: str
    index: int
    rows: np.ndarray
    #: The file's planned bytes: exact for a tar shard, an estimate for Parquet (:func:`_file_bytes`)
    bytes: int = 0


def order_ranks(samples: SampleTable, order: str) -> np.ndarray | None:
    """Each row's rank in the order shards hold samples, or None for ``key`` (the table's own
    order). ``path`` ranks rows by source, relative path and then key (a file's frames, pages
    or tiles stay in key order), so files added under later-sorting paths go to their split's
    end and leave the shards before them as they were."""
    if order == "key":
        return None
    if order != "path":
        raise ValueError(f"pack.order is {order!r}; use key or path")
    ranks = np.empty(samples.size, dtype=np.int64)
    # Python's order of (source, relpath or "", key) as str, sorted by Arrow (SampleTable.order_by)
    ranks[samples.order_by(["source", "relpath", "key"])] = np.arange(samples.size, dtype=np.int64)
    return ranks


#: what :func:`plan_shards` takes as each sample's split: a mapping from sample key to split
#: name, or one entry per row of the sample table, a split name or a code (an index into
#: :data:`~packer.config.SPLITS`)
SplitOf = Mapping[str, str] | Sequence[str] | np.ndarray


def row_splits(samples: SampleTable, split_of: SplitOf) -> np.ndarray:
    """Each row's split as an int8 index into :data:`~packer.config.SPLITS`. ``split_of`` is a
    mapping from sample key to split name (the build passes the codes an assignment holds,
    :func:`packer.pipeline.split.split_codes`), or a split name or code per row of ``samples``.
    Every sample is planned: a key without a split, or a split name that is none of
    :data:`~packer.config.SPLITS`, raises ValueError naming it."""
    if isinstance(split_of, Mapping):
        index = {name: code for code, name in enumerate(SPLITS)}
        codes = np.full(samples.size, -1, dtype=np.int8)
        data, ends = samples.text_bytes("key")
        start = 0
        for at in range(0, samples.size, _HASH_BATCH):  # keys decoded a batch at a time, not as one list
            batch = []
            for end in ends[at:at + _HASH_BATCH].tolist():
                batch.append(data[start:end].decode())
                start = end
            codes[at:at + len(batch)] = [index.get(split_of.get(key, ""), -1) for key in batch]
    elif len(split_of) != samples.size:
        raise ValueError(f"plan_shards: {len(split_of)} splits given for {samples.size} samples; give one split "
                         "per row of the sample table (or a mapping from sample key to split)")
    elif isinstance(split_of, np.ndarray) and split_of.dtype.kind in "iu":
        codes = split_of.astype(np.int8)
    else:
        distinct, inverse = np.unique(np.asarray(split_of, dtype=object).astype(str), return_inverse=True)
        unknown = [str(name) for name in distinct if str(name) not in SPLITS]
        if unknown:
            raise ValueError(f"plan_shards: split {unknown[0]!r} is none of {', '.join(SPLITS)}")
        codes = np.array([SPLITS.index(str(name)) for name in distinct], dtype=np.int8)[inverse.reshape(-1)]
    if codes.size and (codes.min() < 0 or codes.max() >= len(SPLITS)):
        row = int(np.flatnonzero((codes < 0) | (codes >= len(SPLITS)))[0])
        raise ValueError(f"plan_shards: sample {samples.value('key', row)!r} has no split (code {int(codes[row])}); "
                         f"a code is an index into {', '.join(SPLITS)} (0 to {len(SPLITS) - 1})")
    return codes


def plan_shards(samples: SampleTable, split_of: SplitOf, pack: PackConfig, target: Target | None = None, *,
                raw_paths: bool = False) -> list[PlannedShard]:
    """The shards of every split, in split order (train, valid, test), each split's samples in
    ``pack.order`` (:func:`order_ranks`), cut by :func:`shard_bounds` under ``pack``'s limits.
    ``split_of``: each sample's split (:func:`row_splits`). A tar plan (``webdataset``) counts
    each sample's exact bytes in the file (:func:`tar_sizes`), which depend on the dataset's
    ``target`` and on ``raw_paths`` (records name their raw files, ``phi.mode: keep``); a Parquet
    plan an upper bound on what grows with the data (:func:`parquet_sizes`: its target cells and
    fields where ``target`` is given)."""
    codes = row_splits(samples, split_of)
    if pack.format == "webdataset":
        if target is None:
            raise ValueError("plan_shards: a webdataset plan needs the dataset's target: a sample's .cls, .json and "
                             ".target.npy bytes depend on it; pass target=")
        sizes = tar_sizes(samples, target, raw_paths=raw_paths)
    else:
        parquet = parquet_sizes(samples, target)
    ranks = order_ranks(samples, pack.order)
    shards: list[PlannedShard] = []
    for code, split in enumerate(SPLITS):
        mine = np.flatnonzero(codes == code).astype(np.int64)
        if ranks is not None:
            mine = mine[np.argsort(ranks[mine], kind="stable")]
        bytes_of = sizes.of(mine, split) if pack.format == "webdataset" else parquet[mine]
        bounds = _bounds(row_cut_hashes(samples, mine), bytes_of, fmt=pack.format,
                         max_samples=pack.max_samples, max_bytes=pack.max_bytes)
        shards.extend(PlannedShard(file=shard_file(split, index, pack.format), split=split, index=index,
                                   rows=mine[start:stop], bytes=_file_bytes(bytes_of[start:stop], pack.format))
                      for index, (start, stop) in enumerate(bounds))
    return shards


def _file_bytes(sizes: np.ndarray, fmt: str) -> int:
    """A planned shard's file bytes: exact for a tar (its samples', two end blocks, padding to a
    whole record), an estimate for Parquet (its samples' with :data:`PER_SAMPLE_OVERHEAD` and
    :data:`PARQUET_SHARD_OVERHEAD`)."""
    if fmt == "webdataset":
        return -(-(int(sizes.sum()) + 2 * BLOCK) // RECORD) * RECORD
    return int(sizes.sum()) + len(sizes) * PER_SAMPLE_OVERHEAD[fmt] + PARQUET_SHARD_OVERHEAD
