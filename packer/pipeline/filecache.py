"""Per-file reuse: a chunk whose cache key missed decodes only its new and changed files.

A chunk's cache key (:func:`packer.pipeline.spill.chunk_key`) covers every file of the chunk,
so one new, changed, removed or re-labelled file misses the whole entry. Its task then looks
up each of its *units* in the cache-wide index and copies what an earlier entry holds for
the unit instead of decoding it: the samples' bytes (read back from the spill or the
published shards and checked against the entry's digests, as a whole-entry reuse checks
them), their near-copy signature rows, and the unit's issues, exclusions and reader notes.
Samples whose bytes sit in a published version are not copied into the new entry's spill:
it holds them by reference (:meth:`~packer.pipeline.spill.SpillWriter.refer`), and the pack
pass reads them from that version.

- A **unit** is one file, or for a kind that groups its files before decoding
  (:class:`~packer.read.kinds.Grouping`: a DICOM series for stacks and volumes) one group:
  a series' samples are made from all its slices at once, so a new slice decodes its series.
- A unit's **key** (:func:`unit_keys`) is what a file's decoded outcome depends on and
  nothing else: :data:`~packer.pipeline.spill.CACHE_FORMAT`, the library versions (packer's
  with a digest of its source), the
  sample-shaping config, the file's fingerprint (size, mtime and inode, or a remote object's size
  and version; its mask's and companions' too) and the ref fields the worker reads
  (:func:`keyed_fields`). It leaves out what only decides the file's target (its label's
  value, the table's other cells): a re-labelled file is copied, and its samples take the new
  ref's label and cells, so the packed bytes equal a fresh build's.
- A file's **move key** (:func:`move_key`) is its key without its name, with its inode in its
  fingerprint: a file moved or renamed (``mv`` keeps inode, size and mtime) misses its unit
  key and is found by it. The move key only finds a candidate: a *new* file at a new path can
  share a deleted file's inode (ext4 hands a freed inode number to the next file created), size
  and mtime (``tar``, ``cp -p`` and ``rsync -t`` keep it, and an unpacked archive gives every
  file one). So each entry records the xxh3-128 of each such unit's raw file (:func:`source_digests`),
  and a candidate is taken only where its own file's xxh3-128 is the one recorded: one read of a
  file that would otherwise be decoded. Its samples are then re-keyed from its new id
  (:func:`copy_units`).
- A **damaged** entry (a published shard it reads back from changed in place, its spill cut
  short by an interrupted build) is not given up whole: each unit is checked on its own and
  only the units whose bytes no longer check out are decoded again (:func:`copy_units`),
  reported with the file that held the bad bytes (:func:`damage_report`). A chunk whose own
  entry did not check out is copied from that entry this way too, found through the entry's
  records where the index does not list it: a build killed in its pack pass wrote no index, and
  freed the spill of the samples it had packed, so only those samples' files are decoded again.
- The **index** (``files.index.npy`` in the build cache, :func:`write_file_index`) maps each
  unit key (and move key) to the entry holding it: sorted 16-byte pairs, memory-mapped and binary-searched
  by the workers. The client rewrites it after each build from the entries that build kept
  (:func:`packer.pipeline.build._prune_cache` drops the others), so it stays as bounded as the
  cache and lists only entries that exist; an entry it names that is gone or damaged is
  simply decoded again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packer.config import JobConfig, SourceConfig
from packer.files import canonical_json, file_sha256
from packer.keys import parse_key
from packer.pipeline.nearcopy import read_signatures
from packer.pipeline.rawstore import RawObject
from packer.pipeline.spill import (
    CACHE_FORMAT,
    DamagedEntry,
    SpillReader,
    cache_output,
    checked_chain,
    file_fingerprint,
    index_keys,
    masked_sources,
    read_entry,
    records_path,
    sample_shaping_config,
    signature_name,
    unit_records,
)
from packer.records import Excluded, Issue, SampleRef, SpilledSample
from packer.shards.encode import pixels_digest
from packer.storage import MANIFEST_FILE, is_url

#: The cache-wide index of units (:func:`write_file_index`), in the build cache folder.
INDEX_NAME = "files.index.npy"
#: Hex digits, not the 16 raw bytes: NumPy drops a fixed-width bytes value's trailing zero bytes.
INDEX_DTYPE = np.dtype([("unit", "S32"), ("chunk", "S32")])


@dataclass(frozen=True)
class Unit:
    """A unit of per-file reuse: its key (32 hex digits) and the ids of its files, in order;
    ``move``: its move key (:func:`move_key`), ``""`` where a move cannot be told."""

    key: str
    sample_ids: tuple[str, ...]
    move: str = ""

    def index_keys(self) -> bytes:
        """What the index lists for this unit: its key and its move key, 16 bytes each."""
        return index_keys(self.key, self.move)


@dataclass(frozen=True)
class CopiedSample:
    """One sample copied out of an earlier entry: its bytes as spilled (checked), its record
    there (``spilled``, whose ``ref`` is already the new ref's; its ``spill`` says where its
    bytes are now), its signature row and the shard format its sha256 was made for."""

    spilled: SpilledSample
    pixels: bytes
    meta: bytes
    mask: bytes
    signature: np.void | None
    fmt: str
    #: re-keyed for a moved file (:func:`copy_units`): the earlier entry's pointer knows it by its old key
    renamed: bool = False


@dataclass(frozen=True)
class DamagedUnit:
    """A unit an earlier entry holds whose bytes no longer check out where they are: it is
    decoded again. ``where``: the file a sample of it was read back from (a published shard,
    or the spill in the build cache), or the entry's file that did not check out; ``sample_ids``:
    the unit's files; ``entry``: why the entry itself was not reused (its records or signatures
    did not check out, :class:`~packer.pipeline.spill.DamagedEntry`, or could not be read), ``""``
    where only the unit's bytes did not."""

    where: str
    sample_ids: tuple[str, ...]
    entry: str = ""


@dataclass(frozen=True)
class Copies:
    """What :func:`copy_units` found: the units copied, by unit key, and the units it could not
    copy because their bytes, or their entry's records, did not check out (each decoded again)."""

    units: dict[str, CopiedUnit]
    damaged: tuple[DamagedUnit, ...] = ()
    #: the xxh3-128 of each move candidate's file, by unit key, read to confirm the move (``""``:
    #: unreadable): a candidate refused is decoded, and its entry records this digest
    hashed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CopiedUnit:
    """What an earlier entry holds for one unit, in the order that entry recorded it."""

    samples: tuple[CopiedSample, ...]
    issues: tuple[Issue, ...]
    excluded: tuple[Excluded, ...]
    notes: tuple[tuple[str, str], ...]
    #: the xxh3-128 of the raw file the samples were made from, where the entry records one (a
    #: unit with a move key): what confirms a move, and what the new entry records for the unit
    source_xxh3: str = ""


def keyed_fields(ref: SampleRef, source: SourceConfig) -> dict[str, Any]:
    """The fields of ``ref`` a unit's key covers, each because the worker reads it:

    - ``sample_id``, ``source``, ``kind``, ``path``, ``relpath``: which file, which reader and
      config; the records name them (sample keys, issue messages, a remote file's URL);
    - ``entity``, ``time``: the probe checks them (``missing_entity``, ``missing_time``) and
      they travel in the samples' refs;
    - whether there is a label (``labelled``): a file without one is a ``missing_label`` issue
      on the worker; the label's value is left out: it is the target only, applied when the
      sample is packed (:func:`~packer.shards.encode.encode_sample`), and a source whose label is
      a header attribute reads it from the file (which the fingerprint covers);
    - ``maybe_label_map``, where set: the probe reads the file's header (and values) to tell
      whether it is the label map its name suggests (a sibling image appearing or going changes
      it); left out where None, so other files keep their keys;
    - the table cells naming the file's mask and companions (:meth:`SourceConfig.file_columns`):
      the readers open those files. The other cells are left out: a ``where:`` on them is
      applied by discovery on the client, and they reach only the packed record's ``extra``,
      from the ref, at packing time.
    """
    files = set(source.file_columns())
    return {"sample_id": ref.sample_id, "source": ref.source, "kind": ref.kind, "path": ref.path,
            "relpath": ref.relpath, "entity": ref.entity, "time": ref.time, "labelled": ref.label is not None,
            "cells": [[column, value] for column, value in ref.extra if column in files],
            **({"maybe_label_map": ref.maybe_label_map} if ref.maybe_label_map is not None else {})}


def unit_keys(refs: Sequence[SampleRef], job: JobConfig, libraries: Mapping[str, str], *, group: bool,
              listed: Mapping[str, RawObject] | None = None) -> list[Unit]:
    """The units of a chunk's ``refs``: one per file, or (``group``: the refs are one group of
    files, a DICOM series) one for them all, keyed by their files' keys in id order. Stats each
    file (:func:`~packer.pipeline.spill.file_fingerprint`); raises ValueError for a URL that
    ``listed`` lacks."""
    shared = hashlib.sha256(canonical_json({"format": CACHE_FORMAT, "libraries": dict(libraries),
                                            "config": sample_shaping_config(job)})).digest()
    sources = {s.name: s for s in job.sources}
    masked = masked_sources(job)
    keys = [hashlib.sha256(shared + canonical_json([keyed_fields(ref, sources[ref.source]),
                                                    file_fingerprint(ref, masked, listed)])).hexdigest()[:32]
            for ref in refs]
    if not group:
        return [Unit(key, (ref.sample_id,), move_key(shared, ref, sources[ref.source], masked))
                for ref, key in zip(refs, keys, strict=True)]
    ordered = sorted(zip((ref.sample_id for ref in refs), keys, strict=True))
    key = hashlib.sha256(canonical_json(["group", ordered])).hexdigest()[:32]
    return [Unit(key, tuple(ref.sample_id for ref in refs))]


def move_key(shared: bytes, ref: SampleRef, source: SourceConfig, masked: Mapping[str, SourceConfig]) -> str:
    """The key that finds a file again after it was moved or renamed (``mv`` keeps its inode and
    mtime): what its unit key covers but its name (id, path, relpath), with the file's device
    and inode in its fingerprint, so that a file at another path is the same file only if it is
    the same inode with the same size and mtime. ``""`` (no move key: a moved file is decoded
    again) for a remote file, a file with a mask or companions (they are named by path too) or
    one that cannot be stat'ed."""
    if is_url(ref.path) or ref.source in masked:
        return ""
    try:
        stat = os.stat(ref.path)
    except OSError:
        return ""
    named = keyed_fields(ref, source)
    for field_name in ("sample_id", "path", "relpath"):
        del named[field_name]
    fingerprint = ["inode", stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns]
    return hashlib.sha256(b"move" + shared + canonical_json([named, fingerprint])).hexdigest()[:32]


@dataclass(frozen=True)
class Earlier:
    """Where an earlier entry holds a unit: the entry (``chunk``) and the key it lists the unit
    under there (``held``): the same unit key, or (``moved``) the unit's move key, the same file
    under another name."""

    chunk: str
    held: str
    moved: bool = False


def find_earlier(cache_dir: Path, units: Iterable[Unit], *, own: str = "") -> dict[str, Earlier]:
    """Unit key → where the index (:data:`INDEX_NAME`) lists it, by its key or else by its move
    key, for those of ``units`` it lists, and where it lists a unit nowhere, the chunk's own
    entry ``own`` (its key; ``""``: none) if that entry's records hold it. The entry found may
    be the one of the chunk being made, when that entry did not check out whole: its units are
    then checked one by one (:func:`copy_units`), all copied into memory before the chunk's new
    entry is written. The index names it after a completed build; the records are asked
    because a build stopped in its pack pass never wrote the index (:func:`write_file_index`
    runs once the version is published) and did free the spill of the samples it had packed, so
    without them one packed sample would make every other file of its chunk decode again. An
    index or records that cannot be read give nothing (those units are simply decoded)."""
    try:
        index = np.load(cache_dir / INDEX_NAME, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        index = np.zeros(0, dtype=INDEX_DTYPE)
    if index.dtype != INDEX_DTYPE or index.ndim != 1:
        index = np.zeros(0, dtype=INDEX_DTYPE)
    column = index["unit"]

    def listed(key: str) -> str | None:
        wanted = key.encode()
        at = int(np.searchsorted(column, wanted))
        if at < len(index) and column[at] == wanted:
            return bytes(index["chunk"][at]).decode()
        return None

    found: dict[str, Earlier] = {}
    unlisted: list[Unit] = []
    for unit in units:
        if (chunk := listed(unit.key)) is not None:
            found[unit.key] = Earlier(chunk, unit.key)
        elif unit.move and (chunk := listed(unit.move)) is not None:
            found[unit.key] = Earlier(chunk, unit.move, moved=True)
        else:
            unlisted.append(unit)
    if own and unlisted:
        held = _units_held(cache_dir, own)
        found.update((unit.key, Earlier(own, unit.key)) for unit in unlisted if unit.key in held)
    return found


def _units_held(cache_dir: Path, key: str) -> set[str]:
    """The unit keys entry ``key``'s records list; none where they are missing or damaged."""
    try:
        data = json.loads(records_path(cache_dir, key).read_text(encoding="utf-8"))
        return {unit for unit, _, _, _ in unit_records(data)}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return set()


def copy_units(cache_dir: Path, found: Mapping[str, Earlier], units: Sequence[Unit], refs: Sequence[SampleRef],
               job: JobConfig) -> Copies:
    """What the earlier entries ``found`` (:func:`find_earlier`) hold for each of ``units``,
    checked: an entry whose records or signatures do not match the digests written with them
    (:func:`~packer.pipeline.spill.check_entry`), or cannot be read, gives nothing, and its units
    are decoded again, reported in :attr:`Copies.damaged` with the file and why.
    An entry's bytes are checked whole against its digests (each sample's, the digest chained
    over all); where that fails (a published shard it reads back from was damaged, its spill was
    cut short), each wanted unit is checked on its own (:func:`_check_each`) and only the units
    whose bytes do not check out are decoded again, reported in :attr:`Copies.damaged` with the
    file that held the bad bytes. The samples' refs become the matching ``refs``' (by file id) for what the
    unit key leaves out: the label (unless the source reads it from a header attribute) and the
    table cells. A unit found by its move key (a file moved or renamed) takes the new ref's id,
    path and relative path too, and its samples' keys are re-made from the new file id
    (:func:`_moved`); only a unit that gave samples and nothing else (no issue, exclusion or
    note, whose texts name the old path) is taken so, and only where the file at the new path
    is the file the entry's samples were made from: its xxh3-128 the one the entry records for
    the unit. The move key matches a new file that took a deleted file's inode number, size
    and mtime too; such a file is decoded."""
    by_chunk: dict[str, set[str]] = defaultdict(set)
    for place in found.values():
        by_chunk[place.chunk].add(place.held)
    held_units: dict[tuple[str, str], CopiedUnit] = {}
    damaged: list[DamagedUnit] = []
    for chunk, wanted in sorted(by_chunk.items()):
        try:
            taken, bad = _copy_from(cache_dir, chunk, wanted)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            # a damaged entry: its units are decoded again, and the build says why
            where, why = ((str(err.path), err.why) if isinstance(err, DamagedEntry) else
                          (str(records_path(cache_dir, chunk)),
                           f"its records could not be read ({type(err).__name__}: {err})"))
            damaged.extend(DamagedUnit(where, unit.sample_ids, entry=why) for unit in units
                           if unit.key in found and found[unit.key].chunk == chunk)
            continue
        held_units.update(((chunk, key), unit) for key, unit in taken.items())
        damaged.extend(bad)
    new_refs = {ref.sample_id: ref for ref in refs}
    sources = {s.name: s for s in job.sources}
    copied: dict[str, CopiedUnit] = {}
    hashed: dict[str, str] = {}
    for unit in units:
        earlier = found.get(unit.key)
        held = None if earlier is None else held_units.get((earlier.chunk, earlier.held))
        if held is None or earlier is None:
            continue
        if not earlier.moved:
            copied[unit.key] = replace(held, samples=tuple(
                replace(s, spilled=replace(s.spilled, ref=_relabelled(s.spilled.ref, new_refs, sources)))
                for s in held.samples))
            continue
        ref = new_refs[unit.sample_ids[0]]
        if held.source_xxh3:  # an entry that records no digest cannot confirm a move: decoded
            hashed[unit.key] = source_xxh3(ref.path)
        if not held.source_xxh3 or hashed[unit.key] != held.source_xxh3:
            continue  # another file on the moved one's inode, size and mtime: decoded
        moved = _moved(held, ref, sources)
        if moved is not None:
            copied[unit.key] = moved
    return Copies(units=copied, damaged=tuple(damaged), hashed=hashed)


def source_xxh3(path: str) -> str:
    """The xxh3-128 of the local raw file ``path`` (one read; xxh3, not sha256: every file a
    build decodes is hashed, and xxh3 runs at memory speed where sha256, at 1-2 GB/s, would be an
    estimated (not measured) tenth of a pack's CPU; a move is confirmed against an accidental
    match, never an adversary), ``""``
    where it cannot be read: no move is confirmed by it, and its reader reports the file as it
    finds it."""
    digest = xxhash.xxh3_128()
    try:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def source_digests(units: Sequence[Unit], refs: Sequence[SampleRef], copied: Mapping[str, CopiedUnit],
                   hashed: Mapping[str, str]) -> dict[str, str]:
    """Unit key → the xxh3-128 of its raw file that the chunk's new entry records, for each of
    ``units`` with a move key (one local file): what a copied unit's earlier entry records
    (``copied``), the digest read to confirm a move (``hashed``, :attr:`Copies.hashed`), else
    the file read now: one read of a file this build decoded, so that a later build can confirm
    it moved (:func:`copy_units`). ``""`` where there is none (an earlier entry recorded none, an
    unreadable file)."""
    paths = {ref.sample_id: ref.path for ref in refs}
    digests: dict[str, str] = {}
    for unit in units:
        if not unit.move:
            continue
        if unit.key in copied:
            digests[unit.key] = copied[unit.key].source_xxh3
        elif unit.key in hashed:
            digests[unit.key] = hashed[unit.key]
        else:
            digests[unit.key] = source_xxh3(paths[unit.sample_ids[0]])
    return digests


def _moved(held: CopiedUnit, ref: SampleRef, sources: Mapping[str, SourceConfig]) -> CopiedUnit | None:
    """``held``, one file's samples, as the same file's at its new place ``ref``: each sample
    keyed by the new file id with its own part suffix, its ref the one the worker made (what it
    read from the file's header) under the new ref's id, path, relative path, label (the file's
    own, where the source reads it from a header attribute) and cells. None where ``held`` is
    not one file's samples alone."""
    if held.issues or held.excluded or held.notes or not held.samples:
        return None
    old_ids = {parse_key(s.spilled.key).file_id for s in held.samples}
    if len(old_ids) != 1:
        return None
    (old_id,) = old_ids
    samples = []
    for sample in held.samples:
        spilled = sample.spilled
        # the worker's ref (entity and time read from the file's header, where the source does) under
        # the file's new names, with the target and cells the new ref gives (as for a re-labelled file)
        label = spilled.ref.label if sources[ref.source].target.origin == "attribute" else ref.label
        moved = replace(spilled.ref, sample_id=ref.sample_id, path=ref.path, relpath=ref.relpath, label=label,
                        extra=ref.extra)
        samples.append(replace(sample, renamed=True, spilled=replace(
            spilled, key=ref.sample_id + spilled.key[len(old_id):], ref=moved)))
    return replace(held, samples=tuple(samples))


def _relabelled(ref: SampleRef, new_refs: Mapping[str, SampleRef], sources: Mapping[str, SourceConfig]) -> SampleRef:
    new = new_refs.get(ref.sample_id)
    if new is None:
        return ref
    label = ref.label if sources[ref.source].target.origin == "attribute" else new.label
    return replace(ref, label=label, extra=new.extra)


def _copy_from(cache_dir: Path, chunk: str, wanted: set[str]) -> tuple[dict[str, CopiedUnit], list[DamagedUnit]]:
    """The units ``wanted`` of entry ``chunk`` that it holds, its bytes checked whole or, where
    they do not check out whole, unit by unit; and the units whose bytes did not check out."""
    entry = read_entry(cache_dir, chunk)
    if entry is None:
        return {}, []
    data, samples = entry
    records = unit_records(data)
    units = {unit: ids for unit, ids, _, _ in records}
    sources = {unit: source for unit, _, _, source in records}
    # a wanted key is a unit's key or its move key
    resolve = {**{move: unit for unit, _, move, _ in records if move}, **{unit: unit for unit in units}}
    asked = {key: resolve[key] for key in wanted if key in resolve}
    held = sorted(set(asked.values()))
    if not held:
        return {}, []
    # an entry of one unit (a file, a group) gives all it holds: a group's records may name files
    # beyond its own (an annotation object read as its series' mask)
    whole = len(units) == 1
    owner = {sample_id: unit for unit in held for sample_id in units[unit]}

    def unit_of(sample_id: str) -> str | None:
        return held[0] if whole else owner.get(sample_id)

    kept: dict[int, tuple[bytes, bytes, bytes]] = {}
    positions = {id(s): i for i, s in enumerate(samples)}

    def keep(sample: SpilledSample, pixels: bytes, meta: bytes, mask: bytes) -> None:
        if unit_of(sample.ref.sample_id) is not None:
            kept[positions[id(sample)]] = (pixels, meta, mask)

    damaged: dict[str, str] = {}  # unit -> the file whose bytes of it did not check out
    chain = checked_chain(cache_dir, samples, data["shard_format"], visit=keep)
    if chain is None or chain != data.get("spill_digest"):
        kept.clear()
        damaged = _check_each(cache_dir, samples, str(data["shard_format"]), unit_of, kept)
    signed = [s for s in samples if s.signature]
    signatures = None
    if signed:
        signatures = read_signatures(cache_dir / signature_name(chunk))
        if len(signed) != len(samples) or len(signatures) != len(samples):
            return {}, []
    out: dict[str, list[Any]] = {unit: [[], [], [], []] for unit in held if unit not in damaged}
    for position, sample in enumerate(samples):
        unit = unit_of(sample.ref.sample_id)
        if unit is None or unit in damaged:
            continue
        pixels, meta, mask = kept[position]
        row = None if signatures is None else signatures[sample.sig_row:sample.sig_row + 1].copy()[0]
        out[unit][0].append(CopiedSample(spilled=sample, pixels=pixels, meta=meta, mask=mask, signature=row,
                                         fmt=str(data["shard_format"])))
    for record in data["issues"]:
        if (unit := unit_of(str(record["sample_id"]))) in out:
            out[unit][1].append(Issue(**record))
    for record in data.get("excluded", ()):
        if (unit := unit_of(str(record["sample_id"]))) in out:
            out[unit][2].append(Excluded(**record))
    for note in data.get("notes", ()):
        if (unit := unit_of(str(note[0]))) in out:
            out[unit][3].append((str(note[0]), str(note[1])))
    copied = {unit: CopiedUnit(samples=tuple(parts[0]), issues=tuple(parts[1]), excluded=tuple(parts[2]),
                               notes=tuple(parts[3]), source_xxh3=sources[unit]) for unit, parts in out.items()}
    return ({key: copied[unit] for key, unit in asked.items() if unit in copied},
            [DamagedUnit(where, units[unit]) for unit, where in sorted(damaged.items())])


def _check_each(cache_dir: Path, samples: Sequence[SpilledSample], fmt: str,
                unit_of: Callable[[str], str | None], kept: dict[int, tuple[bytes, bytes, bytes]]) -> dict[str, str]:
    """Check each sample of a wanted unit (``unit_of`` its file id gives its unit, or None) on
    its own, for an entry whose bytes did not check out whole: its pixels against its sha256
    (made again: the digest chained over the entry, which would vouch for the records' sha256s,
    cannot be checked) and its metadata and mask against its ``meta_sha256``. The bytes of each
    sample that checks out go into ``kept`` (by position); returns the units with a sample that
    did not (missing, unreadable or changed bytes), each with the file that held them."""
    damaged: dict[str, str] = {}
    with SpillReader(cache_dir) as reader:
        for position, sample in enumerate(samples):
            unit = unit_of(sample.ref.sample_id)
            if unit is None or unit in damaged:
                continue
            try:
                pixels, meta, mask = reader.read_bytes(sample)
            except OSError:  # read_bytes says every failure to read back as an OSError
                damaged[unit] = reader.location(sample)
                continue
            digest = pixels_digest(pixels, shape=sample.shape, dtype=sample.dtype, fmt=fmt).hexdigest()
            if (not sample.meta_sha256 or hashlib.sha256(meta + mask).hexdigest() != sample.meta_sha256
                    or digest != sample.sha256):
                damaged[unit] = reader.location(sample)
                continue
            kept[position] = (pixels, meta, mask)
    for unit in damaged:  # a unit is copied whole or not at all
        for position, sample in enumerate(samples):
            if unit_of(sample.ref.sample_id) == unit:
                kept.pop(position, None)
    return damaged


def write_file_index(cache_dir: Path, entries: Iterable[tuple[str, bytes]]) -> int:
    """Write the index (:data:`INDEX_NAME`) of the entries ``entries`` ((entry key, its units'
    keys, 16 bytes each, concatenated), the ones the build just kept), replacing the old one;
    a unit held by two entries is listed with the first in key order (a unit's move key, listed
    beside its key, likewise). Returns the keys listed."""
    pairs: dict[bytes, bytes] = {}
    for chunk, units in sorted(entries):
        entry = chunk.encode()
        for start in range(0, len(units), 16):
            pairs.setdefault(units[start:start + 16].hex().encode(), entry)
    index = np.array(sorted(pairs.items()), dtype=INDEX_DTYPE)
    with cache_output(cache_dir / INDEX_NAME) as fh:
        np.save(fh, index, allow_pickle=False)
    return len(index)


@dataclass(frozen=True)
class DamageReport:
    """What a build says about the bytes its cache could not reuse (:func:`damage_report`):
    ``lines`` for its output (each version folder gone, as before; entries whose records did not
    check out) and ``warnings`` (each damaged published shard named, with its sha256 found and
    the one its manifest records, or each missing one of a version folder that is there);
    ``shards``: those shards' paths, resolved, so that the pack pass does not warn of them again."""

    lines: tuple[str, ...]
    warnings: tuple[str, ...]
    shards: frozenset[str] = frozenset()


def damage_report(cache_dir: Path, damaged: Iterable[DamagedUnit], keep_spill: str) -> DamageReport:
    """Name where the bytes of ``damaged`` (the units decoded again because their bytes did not
    check out) were read from: a published version folder that is gone (one line per build, all
    such folders), or a published shard of a version folder that is there, missing or whose
    bytes changed (one warning each: its path, that it is missing or its
    sha256 and size found against what its version's manifest records, how many files were
    decoded again because of it, and the ``packer verify`` that checks that version), or an
    entry in the build cache whose records or signatures did not check out (one line: each such
    file and why). A spill in the build cache cut short by an interrupted build is redone
    without a word. ``keep_spill``: how the caller spells the
    option that keeps a copy of the bytes in the cache."""
    by_file: dict[str, set[str]] = defaultdict(set)
    entries: dict[str, str] = {}  # an entry's file that did not check out -> why
    entry_ids: set[str] = set()
    for unit in damaged:
        if unit.entry:
            entries[unit.where] = unit.entry
            entry_ids.update(unit.sample_ids)
            continue
        by_file[unit.where].update(unit.sample_ids)
    inside = cache_dir.resolve()
    gone: dict[str, set[str]] = defaultdict(set)
    warnings: list[str] = []
    shards: set[str] = set()
    for where, ids in sorted(by_file.items()):
        path = Path(where)
        if path.resolve().is_relative_to(inside):
            continue
        if not path.parent.is_dir():  # the version folder itself: removed, or never published
            gone[str(path.parent)].update(ids)
            continue
        shards.add(str(path.resolve()))
        whose = "1 file's samples" if len(ids) == 1 else f"{len(ids)} files' samples"
        found = _shard_found(path) if path.exists() else "it is missing from its version folder, which is there"
        warnings.append(f"{path}: {found}: the build cache's {whose} read back from it did not check "
                        f"out, so {'that file was' if len(ids) == 1 else 'those files were'} decoded again. Check "
                        f"that version with `packer verify {path.parent}`")
    lines = []
    if entries:
        named = sorted(entries.items())
        listed = "; ".join(f"{where}: {why}" for where, why in named[:3])
        more = f"; and {len(named) - 3} more entries" if len(named) > 3 else ""
        lines.append(f"packer: decoded {_files(len(entry_ids))} again: the build cache's entries holding them did not "
                     f"check out ({listed}{more}); the rest of the cache was reused")
    if gone:
        count = len(set().union(*gone.values()))
        lines.append(f"packer: decoded {count} files again: the build cache read their samples back from "
                     f"{', '.join(sorted(gone))}, which is not there: a version removed, or one an interrupted "
                     f"build never published ({keep_spill} keeps a copy in the cache instead)")
    return DamageReport(tuple(lines), tuple(warnings), frozenset(shards))


def _files(count: int) -> str:
    return "1 file" if count == 1 else f"{count} files"


def _shard_found(path: Path) -> str:
    """How the published shard ``path`` compares with what its version's manifest records."""
    try:
        size, digest = file_sha256(path)
    except OSError as err:
        return f"it could not be read ({err})"
    try:
        manifest = json.loads((path.parent / MANIFEST_FILE).read_text(encoding="utf-8"))
        (entry,) = [shard for split in manifest["splits"].values() for shard in split["shards"]
                    if shard["file"] == path.name]
        recorded, recorded_bytes = str(entry["sha256"]), int(entry["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return (f"its bytes (sha256 {digest[:12]}…, {size} bytes) could not be compared with its version's "
                f"{MANIFEST_FILE} ({type(err).__name__}: {err})")
    if (digest, size) == (recorded, recorded_bytes):
        return (f"its bytes match its manifest (sha256 {digest[:12]}…, {size} bytes), but not the build cache's "
                "records of the samples in it")
    return (f"its bytes no longer match its manifest (sha256 {digest[:12]}…, {size} bytes; the manifest records "
            f"{recorded[:12]}…, {recorded_bytes} bytes)")
