"""Process: the pixel pass. Decode, validate and transform each raw file once, spill the result.

A dask task takes a chunk of raw files, reads each header (identity: entity, time, label),
decodes and transforms the pixels, and appends every sample's bytes to one spill file in
the build cache. Only small records (:class:`SpilledSample`, :class:`Issue`) go back to the
client. Splitting and shard planning then work on exact sizes and content hashes, and the
pack pass copies bytes out of the spill files without decoding anything again.

The spill files are a cache: a chunk's key covers packer and library versions, the parts of
the job that shape samples, and each file's path, size, mtime and table values, so a
re-run (``--resume`` after a crash, or a build after adding files) decodes only what changed.
Its records name raw paths, entity ids and dates, so the cache folder lives outside the output
tree (``packer.pipeline.build.cache_location``); tasks get it as ``cache_dir``.

A raw file behind a URL (``s3://...``) is fetched once, by the task that decodes it, into a
temporary local copy (:func:`packer.pipeline.rawstore.fetched`); the readers run on the copy and every
record that comes out names the URL. Its cache key uses the size and version tag (ETag)
discovery's listing gave, so an object replaced in the store is decoded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from packer.allocator import tune_allocator
from packer.config import JobConfig
from packer.errors import OUTPUT_ELSEWHERE, FileSystemError
from packer.files import TMP_SUFFIX, atomic_output, canonical_json
from packer.pipeline.checks import find_sample_issue
from packer.pipeline.discover import probe_for_read, probe_ref
from packer.pipeline.nearcopy import read_signatures, signature, write_signatures
from packer.pipeline.rawstore import RawObject, fetched
from packer.read import read_sample
from packer.records import REF_FIELDS, Issue, Sample, SampleRef, SpilledSample
from packer.storage import is_url
from packer.transform.channels import match_channels

T = TypeVar("T")

#: Part of every chunk's cache key: raise it whenever a reader or transform changes what a raw
#: file turns into, so no build reuses samples made the old way (5: PNG eXIf orientation is
#: applied; 6: every page of a multi-page TIFF is read; 7: near-copy signatures replace the dHash;
#: 8: the signature embedding gains the equalised spectrum).
CACHE_FORMAT = 8
#: A chunk closes after a file whose id hash hits 1 in BOUNDARY (content-defined, so adding
#: a file changes only its own chunk's key), or at MAX_CHUNK files.
BOUNDARY = 32
MAX_CHUNK = 128


@dataclass(frozen=True)
class ChunkTask:
    """A chunk of raw files to process. ``cache_dir`` None: keep nothing (``packer validate``)
    but the near-copy signatures, which go to ``sig_dir`` (a temporary folder of the run);
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


@dataclass(frozen=True)
class ChunkResult:
    key: str
    samples: tuple[SpilledSample, ...]
    issues: tuple[Issue, ...]
    files: int
    reused: bool = False
    seconds: tuple[tuple[str, float], ...] = ()


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


def group_chunks(tasks: Sequence[ChunkTask], threads: int) -> list[ChunkGroup]:
    """``tasks`` in order, cut into groups of :func:`group_size`."""
    size = group_size(len(tasks), threads)
    return [ChunkGroup(tuple(tasks[i:i + size])) for i in range(0, len(tasks), size)]


def process_group(group: ChunkGroup) -> tuple[ChunkResult, ...]:
    """Dask task: :func:`process_chunk` of each chunk of ``group``, in order."""
    return tuple(process_chunk(task) for task in group.tasks)


def chunk_bounds(sample_ids: Sequence[str]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk of the sorted refs whose ids are ``sample_ids``: a chunk
    closes after an id whose hash hits 1 in :data:`BOUNDARY` (content-defined, so adding a file
    changes only its own chunk), or at :data:`MAX_CHUNK` refs."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for index, sample_id in enumerate(sample_ids):
        hit = int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) % BOUNDARY == 0
        if hit or index + 1 - start >= MAX_CHUNK:
            bounds.append((start, index + 1))
            start = index + 1
    if start < len(sample_ids):
        bounds.append((start, len(sample_ids)))
    return bounds


def chunk_refs(refs: Sequence[SampleRef]) -> list[tuple[SampleRef, ...]]:
    """Cut the sorted ref list into chunks with content-defined boundaries (:func:`chunk_bounds`)."""
    return [tuple(refs[start:stop]) for start, stop in chunk_bounds([ref.sample_id for ref in refs])]


def sample_shaping_config(job: JobConfig) -> dict[str, Any]:
    """The parts of the job that change what a raw file turns into (not split ratios or packing)."""
    identity = job.identity()
    return {"sources": identity["sources"], "transform": identity["transform"], "split_by": job.split.by}


def chunk_key(refs: Sequence[SampleRef], job: JobConfig, libraries: dict[str, str],
              listed: Mapping[str, RawObject] | None = None) -> str:
    """Cache key of a chunk: format, library versions, sample-shaping config, and per file its
    path, table values and fingerprint: a local file's size and mtime (files that cannot be
    stat'ed key as missing), a remote file's size and version tag from ``listed`` (discovery's
    listing: no request is made here). Raises ValueError for a URL that ``listed`` lacks."""
    files = []
    for ref in refs:
        fingerprint: list[Any]
        if is_url(ref.path):
            stat = (listed or {}).get(ref.path)
            if stat is None:
                raise ValueError(f"{ref.path}: not in discovery's listing; pass Discovery.listed to chunk_key")
            fingerprint = ["object", stat.size, stat.version]
        else:
            try:
                local = os.stat(ref.path)
                fingerprint = [local.st_size, local.st_mtime_ns]
            except OSError:
                fingerprint = ["missing"]
        # the ref's fields, as dataclasses.asdict gives them (its fields are flat), at a fraction of the cost
        files.append([{name: getattr(ref, name) for name in REF_FIELDS}, fingerprint])
    payload = {"format": CACHE_FORMAT, "libraries": libraries, "config": sample_shaping_config(job),
               "files": files}
    return hashlib.sha256(canonical_json(payload)).hexdigest()[:32]


def _ref_from_json(data: dict[str, Any]) -> SampleRef:
    return SampleRef(**{**data, "extra": tuple(tuple(pair) for pair in data.get("extra", ()))})


def remove_stale_temporaries(folder: Path) -> int:
    """Delete ``*.partial`` files a killed build left behind; return how many."""
    stale = list(folder.glob(f"*{TMP_SUFFIX}")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def _records_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


def signature_name(key: str) -> str:
    """The file of a chunk's near-copy signatures (:mod:`packer.pipeline.nearcopy`), next to its spill."""
    return f"{key}.sig.npy"


#: The fix for a cache write a full or read-only disk refused: the cache is not in the output folder.
CACHE_ELSEWHERE = "choose another cache folder (packer build --cache-dir DIR, or set PACKER_WORK_DIR)"


@contextlib.contextmanager
def _cache_output(path: Path) -> Iterator[Any]:
    """:func:`atomic_output` for a cache file (no fsync: :func:`load_cached_chunk` verifies
    entries and a damaged one is redone), whose refusal names the cache's fix, not the output's."""
    try:
        with atomic_output(path, durable=False) as fh:
            yield fh
    except FileSystemError as err:
        if OUTPUT_ELSEWHERE not in str(err):  # not this file's refusal (e.g. fetching a raw file into TMPDIR)
            raise
        raise FileSystemError(str(err).replace(OUTPUT_ELSEWHERE, CACHE_ELSEWHERE)) from err


def load_cached_chunk(cache_dir: Path, key: str) -> ChunkResult | None:
    """The chunk's records if its records file is complete and its spill file's size and
    sha256 check out, else None (the chunk is then processed again)."""
    records = _records_path(cache_dir, key)
    spill = cache_dir / f"{key}.spill"
    if not (records.is_file() and spill.is_file()):
        return None
    try:
        data = json.loads(records.read_text(encoding="utf-8"))
        if data.get("spill_bytes") != spill.stat().st_size:
            return None
        samples = tuple(SpilledSample(**{**s, "ref": _ref_from_json(s["ref"]), "shape": tuple(s["shape"])})
                        for s in data["samples"])
        if data.get("spill_digest") != _spill_digest(spill, samples):
            return None
        if samples and len(read_signatures(cache_dir / signature_name(key))) != len(samples):
            return None
        issues = tuple(Issue(**i) for i in data["issues"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged cache entry is simply recomputed
    return ChunkResult(key=key, samples=samples, issues=issues, files=data["files"], reused=True)


def _spill_digest(spill: Path, samples: Sequence[SpilledSample]) -> str | None:
    """The spill file's digest as :func:`process_chunk` records it (sha256 over each sample's
    pixel sha256 and metadata bytes, in order), or None when a sample's pixels do not match
    its own sha256. Reads and hashes the whole file once, as a plain sha256 of it would."""
    chain = hashlib.sha256()
    with open(spill, "rb") as fh:
        for sample in samples:
            fh.seek(sample.offset)
            pixels = hashlib.sha256(fh.read(sample.pixel_bytes))
            if pixels.hexdigest() != sample.sha256:
                return None
            chain.update(pixels.digest())
            chain.update(fh.read(sample.meta_bytes))
    return chain.hexdigest()


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


def _samples_of(ref: SampleRef, job: JobConfig, clock: StageClock) -> list[Any] | Issue:
    clock.switch("header")
    probed = probe_for_read(ref, job)  # a DICOM file is parsed once, here, pixels included
    if isinstance(probed, Issue):
        return probed
    clock.switch("decode+transform")
    result = read_sample(probed[0], job, dataset=probed[1])
    if isinstance(result, Issue):
        return result
    clock.switch("validate")
    for sample in result:
        problem = find_sample_issue(sample, job)
        if problem is not None:
            return problem  # one record per raw file: its first defect
    return _with_channels(result, job)


def _with_channels(samples: list[Sample], job: JobConfig) -> list[Sample] | Issue:
    """``samples`` with the job's channel count for their kind (``transform.channels``, see
    :mod:`packer.transform.channels`); a sample no rule maps makes its file ``bad_shape``."""
    if not samples:
        return samples
    target = job.dicom.channels if samples[0].ref.kind == "dicom" else job.image.channels
    if target is None:
        return samples
    out = []
    for sample in samples:
        photometric = str(sample.metadata.get("photometric_interpretation", ""))
        color = sample.ref.kind == "dicom" and photometric not in ("", "MONOCHROME1", "MONOCHROME2")
        mapped = match_channels(sample.image, target, color=color)
        if isinstance(mapped, str):
            return Issue.of(sample.ref, stage="transform", reason="bad_shape",
                            message=f"{sample.ref.path}: sample {sample.key}: {mapped} (frames: stack gives one "
                                    "channel per frame and window; colour DICOM gives 3); use frames: split, or drop "
                                    "transform.channels and load each source with ShardDataset(sources=[...])")
        if mapped.rule == "keep":
            out.append(sample)
        else:
            metadata = {**sample.metadata, "channels": {"from": int(sample.image.shape[0]), "rule": mapped.rule}}
            out.append(replace(sample, image=mapped.image, metadata=metadata))
    return out


def _named_by(outcome: Any, ref: SampleRef, local: str) -> Any:
    """``outcome`` (samples, a probed ref or an issue) of ``local``, the local copy of the remote
    file ``ref``, with the URL put back wherever the copy's path went."""
    if isinstance(outcome, Issue):
        return replace(outcome, path=ref.path, message=outcome.message.replace(local, ref.path))
    if isinstance(outcome, SampleRef):
        return replace(outcome, path=ref.path)
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


def _headers_only(task: ChunkTask) -> ChunkResult:
    samples: list[SpilledSample] = []
    issues: list[Issue] = []
    listed = dict(task.listed)
    for ref in task.refs:
        probed = _on_local_file(ref, task, listed, lambda local: probe_ref(local, task.job), headers_only=True)
        if isinstance(probed, Issue):
            issues.append(probed)
            continue
        samples.append(SpilledSample(key=probed.sample_id, ref=probed, spill="", offset=0, pixel_bytes=0,
                                     meta_bytes=0, shape=(), dtype="", sha256=f"not-decoded:{probed.sample_id}"))
    return ChunkResult(key=task.key, samples=tuple(samples), issues=tuple(issues), files=len(task.refs))


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
        cached = load_cached_chunk(cache_dir, task.key)
        if cached is not None:
            return cached
    spill_name = f"{task.key}.spill"
    sig_dir = cache_dir if cache_dir is not None else Path(task.sig_dir) if task.sig_dir else None
    sig_name = signature_name(task.key) if sig_dir is not None else ""
    signatures: list[np.void] = []
    listed = dict(task.listed)
    samples: list[SpilledSample] = []
    issues: list[Issue] = []
    clock = StageClock()
    spill_hash = hashlib.sha256()
    with (_cache_output(cache_dir / spill_name) if cache_dir is not None else _Discard()) as fh:
        offset = 0
        for ref in task.refs:
            outcome = _on_local_file(ref, task, listed, lambda local: _samples_of(local, task.job, clock), clock)
            if isinstance(outcome, Issue):
                issues.append(outcome)
                continue
            for sample in outcome:
                clock.switch("hash+signature")
                image = sample.image
                pixels = image.tobytes(order="C")
                meta = canonical_json(sample.metadata)
                digest = hashlib.sha256(pixels)
                if sig_dir is not None:
                    signatures.append(signature(image))
                clock.switch("spill")
                fh.write(pixels)
                fh.write(meta)
                # the spill's digest chains the samples' own digests: no second pass over the pixels
                spill_hash.update(digest.digest())
                spill_hash.update(meta)
                samples.append(SpilledSample(
                    key=sample.key, ref=sample.ref, spill=spill_name, offset=offset, pixel_bytes=len(pixels),
                    meta_bytes=len(meta), shape=tuple(int(d) for d in image.shape),
                    dtype=image.dtype.name, sha256=digest.hexdigest(), signature=sig_name,
                    sig_row=len(signatures) - 1 if sig_dir is not None else -1))
                offset += len(pixels) + len(meta)
        clock.switch("spill")
        spill_bytes = offset
    if sig_dir is not None:
        with _cache_output(sig_dir / sig_name) as fh:
            write_signatures(fh, signatures)
    if cache_dir is not None:
        record = {"files": len(task.refs), "spill_bytes": spill_bytes, "spill_digest": spill_hash.hexdigest(),
                  "samples": [asdict(s) for s in samples], "issues": [i.to_json() for i in issues]}
        with _cache_output(_records_path(cache_dir, task.key)) as fh:
            fh.write(canonical_json(record))
    return ChunkResult(key=task.key, samples=tuple(samples), issues=tuple(issues), files=len(task.refs),
                       seconds=clock.items())


class _Discard(contextlib.AbstractContextManager["_Discard"]):
    """A file-like sink for ``packer validate``: counts nothing, keeps nothing."""

    def write(self, data: bytes) -> int:
        return len(data)

    def __exit__(self, *exc: object) -> None:
        return None


def read_spilled(cache_dir: Path, sample: SpilledSample,
                 handles: dict[str, BinaryIO] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The pixel bytes and metadata of one spilled sample; ``handles`` caches open files."""
    handles = {} if handles is None else handles
    fh = handles.get(sample.spill)
    if fh is None:
        fh = handles[sample.spill] = open(cache_dir / sample.spill, "rb")  # noqa: SIM115 - closed by the caller
    fh.seek(sample.offset)
    pixels = fh.read(sample.pixel_bytes)
    meta = fh.read(sample.meta_bytes)
    if len(pixels) != sample.pixel_bytes or len(meta) != sample.meta_bytes:
        raise OSError(f"{cache_dir / sample.spill}: spill file is shorter than its records say; "
                      "delete the build cache folder and rebuild")
    metadata: dict[str, Any] = json.loads(meta)
    return pixels, metadata
