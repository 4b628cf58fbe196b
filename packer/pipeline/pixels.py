"""The pixel pass: probe, read, check and transform each raw file once, and spill the result.

:func:`process_all` (client) cuts the sorted refs into content-defined chunks, groups them into
dask tasks and settles each result as it arrives (pseudonymized, into columns). A task
(:func:`process_chunk`) reads each file's header (:mod:`packer.pipeline.probe`), decodes and
transforms the pixels (:mod:`packer.read`), runs the per-sample checks
(:mod:`packer.pipeline.checks`), and appends every sample's bytes to the chunk's spill in the
build cache (:mod:`packer.pipeline.spill`, which owns the cache's key and files). Only small
records (:class:`SpilledSample`, :class:`Issue`) go back to the client; splitting and shard
planning then work on exact sizes and content hashes, and the pack pass copies bytes out of
the spill without decoding anything again. A chunk whose entry is not in the cache still
decodes only its new and changed files: the others' results are copied out of earlier entries
(:mod:`packer.pipeline.filecache`).

A raw file behind a URL (``s3://...``) is fetched once, by the task that decodes it, into a
temporary local copy (:func:`packer.pipeline.rawstore.fetched`); the readers run on the copy and every
record that comes out names the URL.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from packer.allocator import tune_allocator
from packer.config import JobConfig
from packer.files import canonical_json
from packer.manifest import decoding_libraries
from packer.phi import Pseudonymizer
from packer.pipeline.checks import find_sample_issue
from packer.pipeline.cluster import Executor, LazySequence, WorkerLost
from packer.pipeline.dedup import NOT_DECODED, is_blank
from packer.pipeline.filecache import (
    CopiedUnit,
    DamagedUnit,
    Unit,
    copy_units,
    find_earlier,
    source_digests,
    unit_keys,
)
from packer.pipeline.nearcopy import packed_signature
from packer.pipeline.probe import ProbedKeys, probe_for_read, probe_keys, probe_placement
from packer.pipeline.rawstore import FetchIssue, RawObject, fetched, remote_listing
from packer.pipeline.sampletable import RefTable, SampleTable, TableBuilder
from packer.pipeline.spill import PACKED_SUFFIX, KnownDigest, SpillWriter, chunk_key, load_cached_chunk
from packer.pipeline.split import HeldFiles
from packer.progress import Progress
from packer.read import read_sample
from packer.read.kinds import Grouping, series_incomplete, source_kind, source_libraries, with_channels
from packer.read.series import units_note
from packer.records import Excluded, Issue, MemberIssue, Sample, SampleRef, SpilledSample
from packer.shards.encode import pixels_digest
from packer.shards.tar import npy_bytes
from packer.storage import is_url

T = TypeVar("T")

#: A chunk closes after a file whose id hash hits 1 in BOUNDARY (content-defined, so adding
#: a file changes only its own chunk's key), or at MAX_CHUNK files.
BOUNDARY = 32
MAX_CHUNK = 128


@dataclass(frozen=True)
class ChunkTask:
    """A chunk of raw files to process. ``cache_dir`` None: keep nothing (``packer validate``)
    but the near-copy signatures and the masks, which go to ``sig_dir`` (a temporary folder of the run);
    ``decode`` False: headers only (``validate --quick``), samples carry no content hashes.
    ``key`` empty: the worker computes the chunk's cache key (:func:`chunk_key`, with the
    client's ``libraries``), so the client does not stat every file on its event loop's core.
    ``listed``: for refs whose path is a URL, what discovery's listing said (URL, size and
    version); ``storage_options``: for fetching them (the worker's environment adds its own)."""

    key: str
    refs: Sequence[SampleRef]
    job: JobConfig
    cache_dir: str | None
    decode: bool = True
    listed: tuple[tuple[str, RawObject], ...] = ()
    libraries: tuple[tuple[str, str], ...] = ()
    sig_dir: str | None = None
    # repr=False: dask logs a failed task with its arguments; the options may hold secrets
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    #: A chunk that is one group of files its kind assembled before decoding (a DICOM series for
    #: ``sample: {neighbors: k}`` or ``volume``: :meth:`packer.read.kinds.SourceKind.grouping`);
    #: its ``refs`` are the group's files
    group: Any = None
    #: Per-file reuse records an unchanged file's samples by reference where an earlier entry's
    #: bytes sit in a published version, instead of copying them (:meth:`SpillWriter.refer`);
    #: False when the build keeps its spill (``--keep-spill``: entries must not depend on versions):
    #: such samples are copied, and an entry reused whole whose bytes sit in a published version
    #: gets a spill of its own (``load_cached_chunk(own_copy=True)``)
    refer: bool = True


@dataclass(frozen=True)
class ChunkResult:
    """What a chunk's task returns: its samples' records, its files' issues, the warnings its
    readers noted (``notes``: file id, text; a sample's ``metadata.warnings``, once per file), and
    the files its probe left out on purpose (``excluded``: never samples, never bad)."""

    key: str
    samples: tuple[SpilledSample, ...]
    issues: tuple[Issue, ...]
    files: int
    reused: bool = False
    seconds: tuple[tuple[str, float], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()
    excluded: tuple[Excluded, ...] = ()
    #: files whose samples and records were copied from an earlier cache entry, not decoded
    #: (:mod:`packer.pipeline.filecache`; a whole entry reused is ``reused``)
    copied: int = 0
    #: the keys of the entry's units of per-file reuse and their move keys, 16 bytes each, concatenated (for the
    #: cache's index, :func:`packer.pipeline.filecache.write_file_index`)
    units: bytes = b""
    #: the units an earlier cache entry held whose bytes no longer checked out where they were read
    #: back from (a damaged published shard, a version folder deleted): decoded again, each with
    #: that file (:class:`~packer.pipeline.filecache.DamagedUnit`)
    damaged: tuple[DamagedUnit, ...] = ()


#: Chunks per dask task: at most MAX_GROUP, and small enough that every worker thread gets at
#: least GROUPS_PER_THREAD tasks (load balance at the end of the pass).
MAX_GROUP = 16
GROUPS_PER_THREAD = 16


@dataclass(frozen=True)
class ChunkGroup:
    """Consecutive chunks run by one dask task. Each task costs the client's event loop
    several milliseconds of CPU (about 6 ms measured on a LocalCluster), which on a small
    machine is taken from the workers; grouping keeps the chunk (the cache's unit) small
    without paying that per chunk."""

    tasks: tuple[ChunkTask, ...]


def group_size(chunks: int, threads: int) -> int:
    """Chunks per group: up to :data:`MAX_GROUP`, leaving at least :data:`GROUPS_PER_THREAD`
    groups per worker thread; 1 when ``threads`` is 0 (in-process: nothing to save)."""
    return 1 if threads <= 0 else max(1, min(MAX_GROUP, chunks // (GROUPS_PER_THREAD * threads)))


def process_group(group: ChunkGroup) -> tuple[ChunkResult, ...]:
    """Dask task: :func:`process_chunk` of each chunk of ``group``, in order."""
    return tuple(process_chunk(task) for task in group.tasks)


def chunk_bounds(sample_ids: Iterable[str], alone: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk of the sorted refs whose ids are ``sample_ids``: a chunk
    closes after an id whose hash hits 1 in :data:`BOUNDARY` (content-defined, so adding a file
    changes only its own chunk), or at :data:`MAX_CHUNK` refs. A ref marked ``alone`` (a file of
    a kind whose every file is a unit of work: a NIfTI volume) is a chunk of its own, so that
    the workers share such files one by one and the cache reuses each."""
    bounds: list[tuple[int, int]] = []
    start = count = 0
    for index, sample_id in enumerate(sample_ids):
        count = index + 1
        if alone is not None and alone[index]:
            if start < index:
                bounds.append((start, index))
            bounds.append((index, index + 1))
            start = index + 1
            continue
        hit = int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) % BOUNDARY == 0
        if hit or index + 1 - start >= MAX_CHUNK:
            bounds.append((start, index + 1))
            start = index + 1
    if start < count:
        bounds.append((start, count))
    return bounds


class StageClock:
    """Wall seconds spent per stage inside one task, summed over its files."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stage: str | None = None
        self._since = 0.0

    def switch(self, stage: str | None) -> None:
        now = time.perf_counter()
        if self._stage is not None:
            self.seconds[self._stage] = self.seconds.get(self._stage, 0.0) + now - self._since
        self._stage, self._since = stage, now

    def items(self) -> tuple[tuple[str, float], ...]:
        self.switch(None)
        return tuple(sorted(self.seconds.items()))


def _samples_of(ref: SampleRef, job: JobConfig, clock: StageClock, placed: Any = None) -> list[Any] | Issue | Excluded:
    """One file's samples, checked, with the job's channel count and their masks; or its Issue,
    or its Excluded record (its header leaves it out: nothing is decoded). ``placed``: what the
    file's placement probe left (a file of a group: :meth:`~packer.read.kinds.Grouping.placed`)."""
    clock.switch("header")
    probed = probe_for_read(ref, job, placed)  # a DICOM file is parsed once, here, pixels included
    if isinstance(probed, (Issue, Excluded)):
        return probed
    clock.switch("decode+transform")
    result = read_sample(probed[0], job, state=probed[1])
    if isinstance(result, Issue):
        return result
    if not result:  # every slice of a NIfTI volume within k of an edge (edge: skip): left out, said so
        return Excluded.of(ref, stage="read", why="not_requested", detail=(
            "the file makes no sample under this job: each of its slices lies within the neighbours of an edge "
            "(sample: {neighbors: k, edge: skip}); edge: replicate packs them"))
    clock.switch("validate")
    for sample in result:
        problem = find_sample_issue(sample, job)
        if problem is not None:
            return problem  # one record per raw file: its first defect
    shaped = with_channels(result, job)
    if isinstance(shaped, Issue):
        return shaped
    source = next(s for s in job.sources if s.name == ref.source)
    return source_kind(ref.kind).attach_masks(shaped, source, job) if source.mask is not None else shaped


def _named_by(outcome: Any, ref: SampleRef, local: str) -> Any:
    """``outcome`` (samples, a probed ref, an issue or an exclusion) of ``local``, the local copy of
    the remote file ``ref``, with the URL put back wherever the copy's path went."""
    if isinstance(outcome, Issue):
        return replace(outcome, path=ref.path, message=outcome.message.replace(local, ref.path))
    if isinstance(outcome, MemberIssue):
        return replace(outcome, issue=_named_by(outcome.issue, ref, local))
    if isinstance(outcome, Excluded):
        return replace(outcome, path=ref.path, detail=outcome.detail.replace(local, ref.path))
    if isinstance(outcome, SampleRef):
        return replace(outcome, path=ref.path)
    if isinstance(outcome, tuple):  # a probed ref with its series geometry
        return (replace(outcome[0], path=ref.path), outcome[1])
    if isinstance(outcome, ProbedKeys):  # the header pass's (validate --quick)
        return replace(outcome, ref=replace(outcome.ref, path=ref.path))
    samples: list[Sample] = outcome
    return [replace(s, ref=replace(s.ref, path=ref.path)) for s in samples]


def _on_local_file(ref: SampleRef, task: ChunkTask, listed: Mapping[str, RawObject],
                   read: Callable[[SampleRef], T], clock: StageClock | None = None, *,
                   headers_only: bool = False) -> T | Issue:
    """``read(ref)``; for a remote file on a fetched local copy (deleted after), with the URL
    named in the outcome, or the Issue saying why the file could not be fetched. The copy is
    the whole file, or with ``headers_only`` (``read`` must then be the header probe) only the
    byte ranges the probe reads (:func:`packer.pipeline.rawstore.fetched`)."""
    if not is_url(ref.path):
        return read(ref)
    if clock is not None:
        clock.switch("fetch")
    with fetched(ref, listed.get(ref.path), limits=task.job.limits, storage_options=task.storage_options,
                 headers_only=headers_only) as local:
        if isinstance(local, Issue):
            return local
        named: T = _named_by(read(local), ref, local.path)
        return named


def probe_placements(task: ChunkTask) -> tuple[tuple[SampleRef, Any] | Issue | MemberIssue | Excluded, ...]:
    """Dask task: each file's probed ref and what its kind groups it by (header only), or its
    Issue (a :class:`MemberIssue` where its header still names its group), or its Excluded
    record (a file left out joins no group)."""
    listed = dict(task.listed)
    return tuple(_on_local_file(ref, task, listed, lambda local: probe_placement(local, task.job), headers_only=True)
                 for ref in task.refs)


def _group_samples(task: ChunkTask, listed: Mapping[str, RawObject], clock: StageClock,
                   notes: dict[tuple[str, str], None]) -> list[list[Sample] | Issue | Excluded]:
    """The outcomes of the group ``task`` holds (a DICOM series), as per-file outcomes come: its
    samples as one list (its kind's :meth:`~packer.read.kinds.Grouping.combine` of its files'
    samples), or (when some of its files cannot be read) each such file's own Issue (or Excluded
    record: the header pass kept it, so only a file changed since can be) and
    ``series_incomplete`` for each of the others, naming the bad ones: every file is read, so
    two bad slices are two records, not one and an "incomplete" that hides the second. Each
    file's warnings go into ``notes`` (file id, text) as its samples are read: a stack or a
    volume keeps one slice's metadata, and a slice that is only a neighbour (``edge: skip``) is
    no sample's centre."""
    if task.group is None:
        raise ValueError("_group_samples needs a group chunk")
    grouping = source_kind(task.refs[0].kind).grouping(task.job)
    if grouping is None:
        raise ValueError(f"source kind {task.refs[0].kind!r} does not group files under this job")
    job = grouping.file_job(task.job, task.group)
    per_file: list[list[Sample]] = []
    alone = grouping.partial(task.job)
    failed: list[Issue | Excluded] = []
    bad: dict[str, str] = {}  # each failed file's path: its state, as its series' other files name it
    for ref, placed in zip(grouping.decoded(task.group), grouping.placed(task.group), strict=True):
        outcome = _on_local_file(ref, task, listed, partial(_samples_of, job=job, clock=clock, placed=placed), clock)
        if isinstance(outcome, (Issue, Excluded)):  # this file's record (alone: the others still pack)
            failed.append(outcome)
            bad[ref.path] = outcome.reason if isinstance(outcome, Issue) else f"left out: {outcome.why}"
            per_file.append([])
            continue
        # once a file failed the series is not packed; its other files are still read, each bad
        # one to get its own record, not to be called incomplete for the first one's sake
        per_file.append([] if bad and not alone else outcome)
    if bad and not alone:
        return [*failed, *series_incomplete(task.refs, bad, but={r.sample_id for r in failed})]
    clock.switch("decode+transform")
    samples, records = grouping.combine(task.group, per_file, task.job)
    if samples:  # a refused series packs nothing, so none of its files is packed with a warning
        for decoded in per_file:
            _note_warnings(decoded, notes)
        _note_warnings(samples, notes)  # and a volume's own (slices resampled off an irregular grid, say)
    gone = {r.sample_id for r in failed}  # a file with its own record keeps that one
    return [samples, *failed, *(r for r in records if r.sample_id not in gone)]


def _note_warnings(samples: Iterable[Sample], notes: dict[tuple[str, str], None]) -> None:
    """Each sample's ``metadata.warnings`` into ``notes``, once per file and text, in order, and
    the unit of its values where its modality has several (:func:`~packer.read.series.units_note`)."""
    for sample in samples:
        for warning in sample.metadata.get("warnings", ()):
            notes[(sample.ref.sample_id, str(warning))] = None
        unit = units_note(sample.metadata)
        if unit is not None:
            notes[(sample.ref.sample_id, unit)] = None


def _headers_only(task: ChunkTask) -> ChunkResult:
    samples: list[SpilledSample] = []
    issues: list[Issue] = []
    excluded: list[Excluded] = []
    notes: dict[tuple[str, str], None] = {}  # the header's reader warnings, in order, once per file
    listed = dict(task.listed)
    for ref in task.refs:
        probed = _on_local_file(ref, task, listed, lambda local: probe_keys(local, task.job), headers_only=True)
        if isinstance(probed, Issue):
            issues.append(probed)
            continue
        if isinstance(probed, Excluded):
            excluded.append(probed)
            continue
        samples.extend(SpilledSample(key=key, ref=probed.ref, spill="", offset=0, pixel_bytes=0, meta_bytes=0,
                                     shape=(), dtype="", sha256=f"{NOT_DECODED}{key}", instance=probed.instance)
                       for key in probed.keys)
        if probed.keys:  # as the pixel pass notes a file's warnings: once per file and text, for a file with samples
            notes.update(((probed.ref.sample_id, note), None) for note in probed.notes)
    return ChunkResult(key=task.key, samples=tuple(samples), issues=tuple(issues), files=len(task.refs),
                       excluded=tuple(excluded), notes=tuple(notes))


def process_chunk(task: ChunkTask) -> ChunkResult:
    """Dask task: header, decode, validate and transform every file of a chunk; spill the bytes.

    Reuses the cache entry when one with the same key is complete. Without a cache folder the
    bytes are hashed and dropped (records only).
    """
    if not task.key:
        task = replace(task, key=chunk_key(task.refs, task.job, dict(task.libraries), dict(task.listed)))
    if not task.decode:
        return _headers_only(task)
    tune_allocator()
    cache_dir = Path(task.cache_dir) if task.cache_dir else None
    if cache_dir is not None:
        # --keep-spill: an entry reused whole keeps its own copy of what it read back from a version
        cached = load_cached_chunk(cache_dir, task.key, task.job.pack.format, own_copy=not task.refer)
        if cached is not None:
            return ChunkResult(key=task.key, samples=cached.samples, issues=cached.issues, files=cached.files,
                               reused=True, notes=cached.notes, excluded=cached.excluded, units=cached.units)
    # near-copy signatures only where the check runs (split.near_duplicates resolved it: a one-split job has none)
    sig_dir = cache_dir if cache_dir is not None else Path(task.sig_dir) if task.sig_dir else None
    # packer validate keeps the masks (alone) in the run's scratch folder: the label-conflict rule compares them
    mask_dir = sig_dir if cache_dir is None and any(s.mask is not None for s in task.job.sources) else None
    if not task.job.split.near_enabled:
        sig_dir = None
    listed = dict(task.listed)
    issues: list[Issue] = []
    excluded: list[Excluded] = []
    clock = StageClock()
    clock.switch("reuse")
    units, copied, damaged, hashed = _copied_units(task, cache_dir, listed, signed=sig_dir is not None)
    notes: dict[tuple[str, str], None] = {}  # in order, once per file
    outcomes: Iterable[list[Sample] | Issue | Excluded | CopiedUnit]
    if task.group is not None:
        outcomes = [copied[units[0].key]] if units and units[0].key in copied else \
            _group_samples(task, listed, clock, notes)
    else:
        ready = {unit.sample_ids[0]: copied[unit.key] for unit in units if unit.key in copied}
        outcomes = (ready[ref.sample_id] if ref.sample_id in ready else
                    _on_local_file(ref, task, listed, lambda local: _samples_of(local, task.job, clock), clock)
                    for ref in task.refs)
    fmt = task.job.pack.format
    with SpillWriter(cache_dir, task.key, sig_dir=sig_dir, fmt=fmt, mask_dir=mask_dir) as spill:
        for outcome in outcomes:
            if isinstance(outcome, CopiedUnit):
                clock.switch("reuse")
                _spill_copied(outcome, spill, issues, excluded, notes, fmt=fmt, refer=task.refer)
                continue
            if isinstance(outcome, Issue):
                issues.append(outcome)
                continue
            if isinstance(outcome, Excluded):
                excluded.append(outcome)
                continue
            _note_warnings(outcome, notes)
            for sample in outcome:
                clock.switch("hash+signature")
                image = sample.image
                pixels = image.tobytes(order="C")
                shape = tuple(int(d) for d in image.shape)
                digest = pixels_digest(pixels, shape=shape, dtype=image.dtype.name, fmt=fmt)  # the only pass
                # a volume's is its middle slice's, of the box the image lies in (not fit's padding);
                # an output too small to show a copy gets a blank one
                sig = packed_signature(image, sample.content) if sig_dir is not None else None
                clock.switch("spill")
                mask = b"" if sample.mask is None else npy_bytes(sample.mask)
                spill.add(key=sample.key, ref=sample.ref, pixels=pixels, digest=digest,
                          meta=canonical_json(sample.metadata), shape=shape,
                          dtype=image.dtype.name, signature=sig, mask=mask, stored=sample.stored_digest,
                          blank=is_blank(image), instance=sample.instance)
        clock.switch("reuse")
        # the xxh3-128 of each decoded file a later build could find moved (a move candidate's, read already)
        sources = source_digests(units, task.refs, copied, hashed)
        clock.switch("spill")
    # a record of the store's state at the fetch (an object replaced since the listing, say) is
    # not the file's: the entry is not kept, so the next build fetches the file again
    spill.finish(files=len(task.refs), issues=issues, notes=tuple(notes), excluded=excluded,
                 units=[(unit.key, unit.sample_ids, unit.move, sources.get(unit.key, "")) for unit in units],
                 cached=not any(isinstance(issue, FetchIssue) for issue in issues))
    return ChunkResult(key=task.key, samples=tuple(spill.samples), issues=tuple(issues), files=len(task.refs),
                       seconds=clock.items(), notes=tuple(notes), excluded=tuple(excluded),
                       copied=sum(len(unit.sample_ids) for unit in units if unit.key in copied),
                       units=b"".join(unit.index_keys() for unit in units), damaged=damaged)


def _copied_units(task: ChunkTask, cache_dir: Path | None, listed: Mapping[str, RawObject], *,
                  signed: bool) -> tuple[list[Unit], dict[str, CopiedUnit], tuple[DamagedUnit, ...], Mapping[str, str]]:
    """The units of ``task`` (none without a cache), by unit key what earlier cache entries
    hold for those that did not change (:mod:`packer.pipeline.filecache`), the units such an
    entry held whose bytes did not check out, and the xxh3-128s of the move candidates' files read
    to confirm them (:attr:`~packer.pipeline.filecache.Copies.hashed`). The chunk's own entry is among those entries: it
    is here because it did not check out whole (:func:`~packer.pipeline.spill.load_cached_chunk`),
    and the units whose bytes still check out are copied from it, not decoded. A copy without
    the near-copy signatures the job needs (``signed``) is not taken: its unit is decoded."""
    if cache_dir is None:
        return [], {}, (), {}
    units = unit_keys(task.refs, task.job, dict(task.libraries), group=task.group is not None, listed=listed)
    copies = copy_units(cache_dir, find_earlier(cache_dir, units, own=task.key), units, task.refs, task.job)
    copied = copies.units
    if signed:
        copied = {unit: held for unit, held in copied.items()
                  if all(sample.signature is not None for sample in held.samples)}
    return units, copied, copies.damaged, copies.hashed


def _spill_copied(copied: CopiedUnit, spill: SpillWriter, issues: list[Issue], excluded: list[Excluded],
                  notes: dict[tuple[str, str], None], *, fmt: str, refer: bool) -> None:
    """Add a unit copied from an earlier entry to this chunk's: its records to the chunk's, and
    each sample's bytes into the spill (their sha256 for shard format ``fmt``) or, with
    ``refer``, where the earlier entry's bytes sit in a published version and their sha256 is
    already ``fmt``'s, a reference to them (:meth:`SpillWriter.refer`): the pack pass reads
    them from there, so an unchanged file of a changed chunk is not copied twice."""
    issues.extend(copied.issues)
    excluded.extend(copied.excluded)
    notes.update(dict.fromkeys(copied.notes))
    for sample in copied.samples:
        held = sample.spilled
        signature = sample.signature if spill.sig_dir else None
        if sample.fmt == fmt and refer and held.spill.endswith(PACKED_SUFFIX) and not sample.renamed:
            spill.refer(held, meta=sample.meta, mask=sample.mask, signature=signature)
            continue
        digest = (KnownDigest(held.sha256) if sample.fmt == fmt else
                  pixels_digest(sample.pixels, shape=held.shape, dtype=held.dtype, fmt=fmt))
        spill.add(key=held.key, ref=held.ref, pixels=sample.pixels, digest=digest, meta=sample.meta,
                  shape=held.shape, dtype=held.dtype, signature=signature, mask=sample.mask,
                  stored=held.stored_digest, blank=held.blank, instance=held.instance)


class _Settle:
    """Turns a worker's sample records into the client's: pseudonymized, then into columns.

    Pseudonymizing here, as each result arrives, means raw entity ids live only in header reads
    and the local cache, never in the records the client keeps. The records go into a
    :class:`~packer.pipeline.sampletable.TableBuilder` (about 300 bytes a sample, no Python object
    each); the chunk result keeps its counts and seconds, not its samples.
    """

    def __init__(self, phi: Pseudonymizer, keep: str | None = None) -> None:
        self._phi = phi
        #: the one table cell kept under PHI: a ``by: column`` split's (train/valid/test, nobody's identity)
        self._keep = keep
        self.table = TableBuilder(SampleTable)
        #: the first output entity id under each lookalike form (:meth:`Pseudonymizer.lookalike`:
        #: keyed under PHI, so that no raw id outlives the chunk it came in), the form held as 64
        #: bits (a few dozen bytes an entity, for hundreds of thousands of them), and every id of
        #: the forms that several ids share
        self._forms: dict[int, str] = {}
        self._twins: dict[int, set[str]] = {}

    def chunk(self, chunk: ChunkResult) -> ChunkResult:
        settled: dict[str, str] = {}  # raw id -> output id, for this chunk only (its samples share few)
        for sample in chunk.samples:
            if sample.ref.entity is not None:
                entity = settled.get(sample.ref.entity)
                if entity is None:
                    entity = settled[sample.ref.entity] = self._entity(sample.ref.entity)
                if self._phi.active:
                    kept = tuple(cell for cell in sample.ref.extra if cell[0] == self._keep)
                    sample = replace(sample, ref=replace(sample.ref, entity=entity, extra=kept))
                elif entity != sample.ref.entity:  # with keep, the id in NFC (Pseudonymizer.entity)
                    sample = replace(sample, ref=replace(sample.ref, entity=entity))
            self.table.append(sample)
        return replace(chunk, samples=())

    def _entity(self, raw: str) -> str:
        """The output id of raw entity id ``raw``, its lookalike form noted."""
        entity = self._phi.entity(raw)
        form = int.from_bytes(hashlib.blake2b(self._phi.lookalike(raw).encode(), digest_size=8).digest(), "big")
        first = self._forms.setdefault(form, entity)
        if first != entity:
            self._twins.setdefault(form, {first}).add(entity)
        return entity

    def lookalikes(self) -> tuple[tuple[str, ...], ...]:
        """The groups of two or more entity ids (as written to outputs) whose raw ids differ only
        in case, spacing, leading zeros or compatibility form, each sorted, in sorted order."""
        return tuple(sorted(tuple(sorted(ids)) for ids in self._twins.values()))


@dataclass(frozen=True)
class _TaskMaker:
    """Makes the :class:`ChunkTask` of some refs, with what every task of one pass shares (the
    worker computes each chunk's cache key)."""

    job: JobConfig
    cache: str | None
    decode: bool
    listed: Mapping[str, RawObject]
    libraries: tuple[tuple[str, str], ...]
    sig_dir: str | None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    refer: bool = True

    def __call__(self, refs: Sequence[SampleRef], group: Any = None) -> ChunkTask:
        return ChunkTask(key="", refs=refs, job=self.job, cache_dir=self.cache, decode=self.decode,
                         listed=remote_listing(refs, self.listed), libraries=self.libraries, sig_dir=self.sig_dir,
                         storage_options=self.storage_options, group=group, refer=self.refer)


def process_all(job: JobConfig, executor: Executor, refs: Sequence[SampleRef], *, cache_dir: Path | None,
                decode: bool = True, quiet: bool = False, phi: Pseudonymizer | None = None,
                listed: Mapping[str, RawObject] | None = None, storage_options: dict[str, Any] | None = None,
                sig_dir: Path | None = None,
                refer: bool = True) -> tuple[list[ChunkResult], SampleTable, tuple[tuple[str, ...], ...], HeldFiles]:
    """Run the pixel pass (or the header pass when ``decode`` is False) over all refs.

    Returns the chunk results in key order, without their samples, every sample in a table, in
    the order the results arrived, the groups of entity ids that differ only in case, spacing,
    compatibility form or leading zeros (:meth:`_Settle.lookalikes`), and what the samples of
    grouped files hold of other files (:func:`held_files`: from headers, so the same with and
    without ``decode``).

    Refs whose path is a URL need ``listed`` (:attr:`packer.pipeline.discover.Discovery.listed`): each
    task gets its files' entries, for the cache key and the size limit, and ``storage_options``
    to fetch them with. ``sig_dir``: where the near-copy signatures go when there is no cache
    (``packer validate``). ``refer``: :attr:`ChunkTask.refer`.

    Files of a kind that groups them before decoding (DICOM series for 2.5D stacks and volumes)
    are assembled first, from headers (:func:`_assemble_groups`); each group is one chunk. A
    chunk whose worker process keeps dying (a native decoder crash takes the whole worker down)
    is retried file by file (:func:`_isolate`). Each result's samples are settled as they
    arrive (:class:`_Settle`: pseudonymized under ``phi``, into columns).
    """
    settle = _Settle(phi or Pseudonymizer(mode="keep", dates="keep", key=None), keep=job.split.column)
    nonce = uuid.uuid4().hex[:8]
    libraries = decoding_libraries(source_libraries(job.sources))
    make = _TaskMaker(job=job, cache=str(cache_dir) if cache_dir is not None else None, decode=decode,
                      listed=listed or {}, libraries=tuple(sorted(libraries.items())),
                      sig_dir=str(sig_dir) if sig_dir is not None else None, storage_options=storage_options,
                      refer=refer)
    table = refs if isinstance(refs, RefTable) else RefTable.of(refs)
    results: list[ChunkResult] = []
    group_tasks: list[ChunkTask] = []
    held = HeldFiles()
    for grouping, rows in _grouped_rows(table, job):
        grouped, early = _assemble_groups(executor, grouping, [table[i] for i in rows], make, nonce, quiet)
        held = held_files(grouping, grouped, job, held)
        results.append(settle.chunk(early))
        if decode:
            group_tasks.extend(make(group.refs, group) for group in grouped)
        else:  # validate --quick: the grouping's checks are header checks, so they ran; the samples are counted
            results.append(settle.chunk(_counted(grouping, grouped, job)))
        table = table.take(sorted(set(range(len(table))).difference(rows)))
    groups, names = _plan_groups(table, group_tasks, make, executor.threads(), nonce)
    progress = Progress("process" if decode else "headers",
                        len(table) + sum(len(task.refs) for task in group_tasks), quiet=quiet)
    lost: list[ChunkTask] = []
    for group, done in executor.map_unordered(process_group, groups, names, waiting=progress.waiting):
        if isinstance(done, WorkerLost):
            lost.extend(group.tasks)
            continue
        for result in done:
            results.append(settle.chunk(result))
            progress.update(result.files, bad=len(result.issues))
    for result in _isolate(executor, lost, make, nonce):
        results.append(settle.chunk(result))
        progress.update(result.files, bad=len(result.issues))
    progress.close()
    return sorted(results, key=lambda r: r.key), settle.table.finish(release=True), settle.lookalikes(), held


def held_files(grouping: Grouping, groups: Sequence[Any], job: JobConfig, held: HeldFiles | None = None) -> HeldFiles:
    """``held`` (none by default) with what the samples of the assembled ``groups`` hold of other
    files (:meth:`~packer.read.kinds.Grouping.spans`, from the header pass's times): a sample's
    latest time where one of its files is later than its own, and every file of a sample that
    stands for its files whole (a volume)."""
    latest = dict(held.latest) if held is not None else {}
    files = dict(held.files) if held is not None else {}
    for group in groups:
        for span in grouping.spans(group, job):
            own, last = span.files[0].time, span.latest
            if own is not None and last is not None and last > own:  # ISO text: it orders as times do
                latest[span.key] = last
            if span.whole and len(span.files) > 1:
                files[span.key] = tuple((ref.sample_id, ref.path) for ref in span.files)
    return HeldFiles(latest=latest, files=files)


def _grouped_rows(table: RefTable, job: JobConfig) -> list[tuple[Grouping, list[int]]]:
    """For each kind of the job that groups its files before decoding, its grouping and the rows
    of ``table`` that hold its files."""
    kinds = table.column("kind")
    out = []
    for name in sorted(set(kinds)):
        grouping = source_kind(name).grouping(job)
        if grouping is not None:
            out.append((grouping, [i for i, kind in enumerate(kinds) if kind == name]))
    return out


def _plan_groups(table: RefTable, group_tasks: Sequence[ChunkTask], make: _TaskMaker, threads: int,
                 nonce: str) -> tuple[LazySequence[ChunkGroup], list[str]]:
    """The dask tasks of the pass and their names: the file refs of ``table`` cut into
    content-defined chunks, then the group tasks, grouped :func:`group_size` chunks a task.
    Tasks are made as the executor submits them, each from its rows of the ref table: made all
    at once, they would keep every ref alive as objects through the whole pass."""
    kind_codes, kinds = table.codes("kind")
    alone_codes = [code for code, name in enumerate(kinds) if source_kind(name).file_per_task]
    # the ids read a block at a time, not as one list of every id
    bounds = chunk_bounds(_column_blocks(table, "sample_id"),
                          np.isin(kind_codes, alone_codes).tolist() if alone_codes else None)
    size = group_size(len(bounds) + len(group_tasks), threads)
    spans = [bounds[i:i + size] for i in range(0, len(bounds), size)]
    group_spans = [group_tasks[i:i + size] for i in range(0, len(group_tasks), size)]
    names = [f"process-{table.value('sample_id', span[0][0])}-{len(span)}-{nonce}" for span in spans]
    names += [f"series-{span[0].refs[0].sample_id}-{len(span)}-{nonce}" for span in group_spans]

    def group_of(index: int) -> ChunkGroup:
        if index >= len(spans):
            return ChunkGroup(tuple(group_spans[index - len(spans)]))
        return ChunkGroup(tuple(make(tuple(table[start:stop])) for start, stop in spans[index]))

    return LazySequence(len(spans) + len(group_spans), group_of), names


def _column_blocks(table: RefTable, name: str, block: int = 1 << 16) -> Iterator[str]:
    """Text field ``name`` of every row of ``table``, in order, read a block of rows at a time
    (a missing value as ``""``)."""
    text = table.field_text(name)
    for start in range(0, len(table), block):
        yield from (value or "" for value in text.slice(start, min(start + block, len(table))).values())


def _isolate(executor: Executor, lost: Sequence[ChunkTask], make: _TaskMaker, nonce: str) -> Iterator[ChunkResult]:
    """The results of the chunks whose worker died: each file retried alone (a group stays
    whole), then each file whose retry died too, once more on its own, so that a death can only
    be its doing; a file that still kills its worker is a ``decoder_crash`` bad sample."""
    singles = [make((ref,)) if task.group is None else task for task in lost
               for ref in (task.refs if task.group is None else task.refs[:1])]
    suspects: list[ChunkTask] = []
    for task, outcome in executor.map_unordered(process_chunk, singles,
                                                [f"isolate-{t.refs[0].sample_id}-{nonce}" for t in singles]):
        if isinstance(outcome, WorkerLost):
            suspects.append(task)  # maybe only a bystander on a dying worker: retried alone below
            continue
        yield outcome
    for suspect in suspects:  # one at a time, so a death can only be this file's doing
        ((task, outcome),) = executor.map_unordered(process_chunk, [suspect],
                                                    [f"isolate-alone-{suspect.refs[0].sample_id}-{nonce}"])
        if isinstance(outcome, WorkerLost):
            outcome = _crashed(task, outcome, make)
        yield outcome


def _crashed(task: ChunkTask, death: WorkerLost, make: _TaskMaker) -> ChunkResult:
    """The result of a chunk whose files killed their worker every time: ``decoder_crash`` each."""
    key = chunk_key(task.refs, make.job, dict(make.libraries), make.listed)
    what = "this file alone" if len(task.refs) == 1 else f"this file's series ({len(task.refs)} files)"
    return ChunkResult(key=key, samples=(), files=len(task.refs), issues=tuple(Issue.of(
        ref, stage="read", reason="decoder_crash",
        message=f"{ref.path}: reading {what} killed the worker process every time it was tried "
                f"({death}); a native decoder crash. The file was isolated and the build went on")
        for ref in task.refs))


def _counted(grouping: Grouping, groups: Sequence[Any], job: JobConfig) -> ChunkResult:
    """The samples the assembled ``groups`` make, from their headers (``validate --quick``),
    keyed as the pixel pass keys them (:meth:`~packer.read.kinds.Grouping.counted`); no content hashes."""
    made = [pair for group in groups for pair in grouping.counted(group, job)]
    samples = tuple(SpilledSample(key=key, ref=ref, spill="", offset=0, pixel_bytes=0, meta_bytes=0, shape=(),
                                  dtype="", sha256=f"{NOT_DECODED}{key}") for ref, key in made)
    key = "series-headers-" + hashlib.sha256("".join(s.key for s in samples).encode()).hexdigest()[:24]
    others = [record for group in groups for record in grouping.headers_only(group, job)]
    return ChunkResult(key=key, samples=samples, issues=tuple(r for r in others if isinstance(r, Issue)),
                       files=sum(len(group.refs) for group in groups),
                       excluded=tuple(r for r in others if isinstance(r, Excluded)))


def _assemble_groups(executor: Executor, grouping: Grouping, refs: Sequence[SampleRef], make: _TaskMaker,
                     nonce: str, quiet: bool) -> tuple[tuple[Any, ...], ChunkResult]:
    """The header pass of a kind that groups its files (DICOM series): every file's placement
    on the workers, then :meth:`~packer.read.kinds.Grouping.assemble` here. Returns the groups
    and a result holding the files refused on the way (bad headers, bad groups, files left out).
    That result speaks for no file decoded (``files`` 0): their pixels are never read, and every
    build reads every file's header for the assembly, so a series refused from its headers
    (``series_gap``, say) is counted as decoded by no build, fresh or unchanged, and as taken from
    the build cache by none either, like a table row without a file."""
    tasks = [make(tuple(refs[a:b])) for a, b in chunk_bounds([ref.sample_id for ref in refs])]
    progress = Progress("series", len(refs), quiet=quiet)
    placed: list[tuple[SampleRef, Any]] = []
    issues: list[Issue] = []
    held: list[MemberIssue] = []  # refused files whose groups are not packed without them
    excluded: list[Excluded] = []
    for task, outcome in executor.map_unordered(probe_placements, tasks,
                                                [f"series-probe-{t.refs[0].sample_id}-{nonce}" for t in tasks],
                                                waiting=progress.waiting):
        found = (probe_placements(task) if isinstance(outcome, WorkerLost) else outcome)  # header reads: safe here
        for item in found:
            if isinstance(item, MemberIssue):
                held.append(item)
                issues.append(item.issue)
            elif isinstance(item, Issue):
                issues.append(item)
            elif isinstance(item, Excluded):  # joins no series
                excluded.append(item)
            else:
                placed.append(item)
        progress.update(len(task.refs), bad=sum(isinstance(item, (Issue, MemberIssue)) for item in found))
    groups, records = grouping.assemble(placed, make.job, held=held)
    refused = [*issues, *(r for r in records if isinstance(r, Issue))]
    said = {issue.sample_id for issue in issues}  # the line counts a file once, refused by header or by its series
    progress.update(0, bad=len({r.sample_id for r in refused} - said))
    progress.close()
    key = "series-" + hashlib.sha256("".join(sorted(i.sample_id for i in refused)).encode()).hexdigest()[:24]
    excluded.extend(r for r in records if isinstance(r, Excluded))  # placed, then left out (localizers)
    return groups, ChunkResult(key=key, samples=(), issues=tuple(refused), files=0,
                               excluded=tuple(sorted(excluded, key=lambda e: (e.path, e.sample_id))))


def stage_seconds(chunks: Sequence[ChunkResult]) -> dict[str, float]:
    """Seconds per stage summed over every task of the pixel pass."""
    total: dict[str, float] = {}
    for chunk in chunks:
        for stage, seconds in chunk.seconds:
            total[stage] = total.get(stage, 0.0) + seconds
    return total
