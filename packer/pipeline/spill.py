"""The spill cache: where the pixel pass leaves each chunk's decoded samples for the pack pass.

A chunk of raw files (:mod:`packer.pipeline.pixels`) becomes three files in the build cache,
all named by the chunk's key:

- ``<key>.spill``: every sample's C-order pixel bytes followed by its canonical-JSON metadata,
  one after another (:class:`SpillWriter` writes it, :func:`read_spilled` reads one sample);
- ``<key>.json``: the records (:class:`~packer.records.SpilledSample` offsets, sizes, sha256s,
  the chunk's issues), with the spill's size and a digest chained over the samples' digests;
- ``<key>.sig.npy``: the near-copy signatures (:mod:`packer.pipeline.nearcopy`).

The key (:func:`chunk_key`) covers :data:`CACHE_FORMAT`, the library versions, the parts of the
job that shape samples and each file's path, table values and fingerprint, so an entry is
reused only for the same source version and processing config. :func:`load_cached_chunk`
re-checks an entry's sizes and digests before it is reused; a damaged entry is redone.
Cache files are written without fsync, under a temporary name renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packer.config import JobConfig, SourceConfig
from packer.errors import OUTPUT_ELSEWHERE, FileSystemError
from packer.files import TMP_SUFFIX, atomic_output, canonical_json
from packer.pipeline.nearcopy import read_signatures, write_signatures
from packer.pipeline.rawstore import RawObject
from packer.records import REF_FIELDS, Issue, SampleRef, SpilledSample
from packer.storage import is_url


@dataclass(frozen=True)
class CachedChunk:
    """A complete, verified cache entry: the chunk's samples and issues, and its file count."""

    samples: tuple[SpilledSample, ...]
    issues: tuple[Issue, ...]
    files: int


#: Part of every chunk's cache key: raise it whenever a reader or transform changes what a raw
#: file turns into, so no build reuses samples made the old way (5: PNG eXIf orientation is
#: applied; 6: every page of a multi-page TIFF is read; 7: near-copy signatures replace the dHash;
#: 8: the signature embedding gains the equalised spectrum).
CACHE_FORMAT = 8


def sample_shaping_config(job: JobConfig) -> dict[str, Any]:
    """The parts of the job that change what a raw file turns into, samples or bad-sample verdict:
    sources, transforms, ``split.by`` (a time split needs a time), the size ``limits`` and the
    burned-in-annotation policy, both applied by the worker, the job's ``labels`` where the
    worker checks header labels against them, and whether near-copy signatures are kept. Not
    split ratios, packing or PHI."""
    identity = job.identity()
    shaping = {"sources": identity["sources"], "transform": identity["transform"], "split_by": job.split.by,
               "limits": identity["limits"], "burned_in_annotation": job.safety.burned_in_annotation}
    if not job.split.near_enabled:  # its entries carry no near-copy signatures (only then: keys stay as they were)
        shaping["signatures"] = False
    if any(s.target.origin == "attribute" for s in job.sources):  # the worker checks header labels against it
        shaping["labels"] = identity["labels"]
    return shaping


def chunk_key(refs: Sequence[SampleRef], job: JobConfig, libraries: dict[str, str],
              listed: Mapping[str, RawObject] | None = None) -> str:
    """Cache key of a chunk: format, library versions, sample-shaping config, and per file its
    path, table values and fingerprint: a local file's size and mtime (files that cannot be
    stat'ed key as missing), a remote file's size and version tag from ``listed`` (discovery's
    listing: no request is made here). Raises ValueError for a URL that ``listed`` lacks."""
    files = []
    masks = {s.name: s for s in job.sources if s.mask is not None}
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
        if ref.source in masks:  # a mask is part of what the file turns into
            fingerprint.append(["mask", *_stat_fingerprint(mask_path(masks[ref.source], ref))])
        # the ref's fields, as dataclasses.asdict gives them (its fields are flat), at a fraction of the cost
        files.append([{name: getattr(ref, name) for name in REF_FIELDS}, fingerprint])
    payload = {"format": CACHE_FORMAT, "libraries": libraries, "config": sample_shaping_config(job),
               "files": files}
    return hashlib.sha256(canonical_json(payload)).hexdigest()[:32]


def mask_path(source: SourceConfig, ref: SampleRef) -> str | None:
    """The local path of ``ref``'s mask file (its table's mask column, under the source root),
    None where the row names none."""
    if source.mask is None:
        return None
    relpath = source.mask.relpath(ref.extra)
    return os.path.join(os.fspath(source.root), relpath) if relpath else None


def _stat_fingerprint(path: str | None) -> list[Any]:
    try:
        local = os.stat(path) if path is not None else None
    except OSError:
        local = None
    return [local.st_size, local.st_mtime_ns] if local is not None else ["missing"]


def _ref_from_json(data: dict[str, Any]) -> SampleRef:
    return SampleRef(**{**data, "extra": tuple(tuple(pair) for pair in data.get("extra", ()))})


def remove_stale_temporaries(folder: Path) -> int:
    """Delete ``*.partial`` files a killed build left behind; return how many."""
    stale = list(folder.glob(f"*{TMP_SUFFIX}")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def records_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{key}.json"


def signature_name(key: str) -> str:
    """The file of a chunk's near-copy signatures (:mod:`packer.pipeline.nearcopy`), next to its spill."""
    return f"{key}.sig.npy"


#: The fix for a cache write a full or read-only disk refused: the cache is not in the output folder.
CACHE_ELSEWHERE = "choose another cache folder (packer build --cache-dir DIR, or set PACKER_WORK_DIR)"


@contextlib.contextmanager
def cache_output(path: Path) -> Iterator[Any]:
    """:func:`~packer.files.atomic_output` for a cache file (no fsync: :func:`load_cached_chunk` verifies
    entries and a damaged one is redone), whose refusal names the cache's fix, not the output's."""
    try:
        with atomic_output(path, durable=False) as fh:
            yield fh
    except FileSystemError as err:
        if OUTPUT_ELSEWHERE not in str(err):  # not this file's refusal (e.g. fetching a raw file into TMPDIR)
            raise
        raise FileSystemError(str(err).replace(OUTPUT_ELSEWHERE, CACHE_ELSEWHERE)) from err


def load_cached_chunk(cache_dir: Path, key: str) -> CachedChunk | None:
    """The chunk's records if its records file is complete and its spill file's size and
    sha256 check out, else None (the chunk is then processed again)."""
    records = records_path(cache_dir, key)
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
        signed = [s for s in samples if s.signature]  # none where the job skips near copies
        if signed and (len(signed) != len(samples) or
                       len(read_signatures(cache_dir / signature_name(key))) != len(samples)):
            return None
        issues = tuple(Issue(**i) for i in data["issues"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged cache entry is simply recomputed
    return CachedChunk(samples=samples, issues=issues, files=data["files"])


def _spill_digest(spill: Path, samples: Sequence[SpilledSample]) -> str | None:
    """The spill file's digest as :class:`SpillWriter` records it (sha256 over each sample's
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
            if sample.mask_bytes:
                chain.update(fh.read(sample.mask_bytes))
    return chain.hexdigest()


class _Discard(contextlib.AbstractContextManager["_Discard"]):
    """A file-like sink for ``packer validate``: counts nothing, keeps nothing."""

    def write(self, data: bytes) -> int:
        return len(data)

    def __exit__(self, *exc: object) -> None:
        return None


def read_spilled(cache_dir: Path, sample: SpilledSample,
                 handles: dict[str, BinaryIO] | None = None) -> tuple[bytes, dict[str, Any], bytes]:
    """The pixel bytes, metadata and mask (``.npy`` bytes; empty without one) of one spilled
    sample; ``handles`` caches open files."""
    handles = {} if handles is None else handles
    fh = handles.get(sample.spill)
    if fh is None:
        fh = handles[sample.spill] = open(cache_dir / sample.spill, "rb")  # noqa: SIM115 - closed by the caller
    fh.seek(sample.offset)
    pixels = fh.read(sample.pixel_bytes)
    meta = fh.read(sample.meta_bytes)
    mask = fh.read(sample.mask_bytes) if sample.mask_bytes else b""
    if len(pixels) != sample.pixel_bytes or len(meta) != sample.meta_bytes or len(mask) != sample.mask_bytes:
        raise OSError(f"{cache_dir / sample.spill}: spill file is shorter than its records say; "
                      "delete the build cache folder and rebuild")
    metadata: dict[str, Any] = json.loads(meta)
    return pixels, metadata, mask


class SpillWriter:
    """Writes one chunk's cache entry: samples into the spill as they come, then the records.

    Without a cache folder (``packer validate``) the bytes go nowhere, but the records (sizes,
    sha256s) are made exactly as in a build. Use as a context manager around the samples;
    :meth:`finish` after it writes the signatures and the records file.
    """

    def __init__(self, cache_dir: Path | None, key: str, *, sig_dir: Path | None) -> None:
        self.cache_dir, self.key, self.sig_dir = cache_dir, key, sig_dir
        self.spill_name = f"{key}.spill"
        self.sig_name = signature_name(key) if sig_dir is not None else ""
        self.samples: list[SpilledSample] = []
        self._signatures: list[np.void] = []
        self._chain = hashlib.sha256()
        self._offset = 0
        self._stack = contextlib.ExitStack()
        self._fh: Any = None

    def __enter__(self) -> SpillWriter:
        target = cache_output(self.cache_dir / self.spill_name) if self.cache_dir is not None else _Discard()
        self._fh = self._stack.enter_context(target)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)  # type: ignore[arg-type]

    def add(self, *, key: str, ref: SampleRef, pixels: bytes, digest: Any, meta: bytes, shape: tuple[int, ...],
            dtype: str, signature: np.void | None, mask: bytes = b"") -> None:
        """Append one sample: its pixel bytes, sha256 object ``digest`` of them, metadata JSON
        and, where the source has masks, the mask's ``.npy`` bytes."""
        if signature is not None:
            self._signatures.append(signature)
        self._fh.write(pixels)
        self._fh.write(meta)
        # the spill's digest chains the samples' own digests: no second pass over the pixels
        self._chain.update(digest.digest())
        self._chain.update(meta)
        if mask:
            self._fh.write(mask)
            self._chain.update(mask)
        self.samples.append(SpilledSample(
            key=key, ref=ref, spill=self.spill_name, offset=self._offset, pixel_bytes=len(pixels),
            meta_bytes=len(meta), shape=shape, dtype=dtype, sha256=digest.hexdigest(), signature=self.sig_name,
            sig_row=len(self._signatures) - 1 if self.sig_dir is not None else -1, mask_bytes=len(mask)))
        self._offset += len(pixels) + len(meta) + len(mask)

    def finish(self, *, files: int, issues: Sequence[Issue]) -> None:
        """Write the signatures (when kept) and, with a cache folder, the records file."""
        if self.sig_dir is not None:
            with cache_output(self.sig_dir / self.sig_name) as fh:
                write_signatures(fh, self._signatures)
        if self.cache_dir is not None:
            record = {"files": files, "spill_bytes": self._offset, "spill_digest": self._chain.hexdigest(),
                      "samples": [asdict(s) for s in self.samples], "issues": [i.to_json() for i in issues]}
            with cache_output(records_path(self.cache_dir, self.key)) as fh:
                fh.write(canonical_json(record))
