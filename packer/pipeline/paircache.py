"""The verified-pair cache: a near-copy pair's evidence, kept in the build cache between builds.

Verifying a candidate pair (:func:`packer.pipeline.nearcopy.verify`, about 0.5 ms) is most of a
small-image build's audit: twelve pairs a sample. Its evidence is a pure function of the two
64×64 thumbnails it reads, so a pair whose two thumbnails are the same as in the last build
need not be verified again. :class:`PairCache` keys each pair by the blake2b digests of its two
thumbnails (in the order the pair is verified: the evidence aligns the second to the first),
the verification's ``floor``, whether the first stage ran (``screen``: a pair it turns away has
other evidence than one verified in full) and :data:`~packer.pipeline.nearcopy.VERIFY_VERSION`;
:func:`cached_verification` wraps a verification runner so that it verifies only the pairs the
cache does not hold, and answers every task with the whole task's evidence, as if it had
verified all of it. Everything after the verification (the rival test, the links, the split
and ``leakage.json``) sees the same numbers with a cold cache, a warm one or none.

The cache is one file in the build cache folder, :data:`PAIRS_FILE`: a JSON header line (format,
version, rows, the digest of the rows) and the rows, sorted by key. It is written whole under a
temporary name and renamed (:func:`~packer.pipeline.spill.cache_output`), and holds only the
pairs the last build looked at, so it stays bounded by one build's candidates (59 bytes a pair,
about 0.7 KB a sample). A file that does not check out (cut short, another version) is ignored:
its pairs are verified again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packer.pipeline.cluster import LazySequence
from packer.pipeline.nearcopy import VERIFY_VERSION, EvidenceArrays, VerifyTask, read_signatures
from packer.pipeline.spill import cache_output
from packer.pipeline.split import RunVerify

#: The cache's file in the build cache folder; its stem is what the cache's pruning keeps.
PAIRS_FILE = "near-pairs.bin"
PAIRS_STEM = PAIRS_FILE.split(".")[0]
_MAGIC = "packer-near-pairs"
#: Bytes of a thumbnail's digest.
DIGEST_BYTES = 16
#: A pair's key: the first thumbnail's digest, the second's, the verification's floor (float64) and
#: whether the first stage ran (one byte, 0 or 1).
KEY_DTYPE = np.dtype(f"V{2 * DIGEST_BYTES + 9}")
ROW_DTYPE = np.dtype([("key", KEY_DTYPE), ("structure", "<f4"), ("detail", "<f4"), ("intensity", "<f4"),
                      ("zoom", "<f4"), ("dy", "i1"), ("dx", "i1")])
_FIELDS = ("structure", "detail", "intensity", "zoom", "dy", "dx")


def thumb_digests(path: str) -> np.ndarray:
    """The blake2b digest (:data:`DIGEST_BYTES` bytes) of each row's thumbnail in signature file
    ``path`` (rows × DIGEST_BYTES uint8). Raises ValueError when it is not a signature file."""
    thumbs = read_signatures(Path(path))["thumb"]
    out = np.empty((len(thumbs), DIGEST_BYTES), dtype=np.uint8)
    for row in range(len(thumbs)):
        out[row] = np.frombuffer(hashlib.blake2b(np.ascontiguousarray(thumbs[row]).data, digest_size=DIGEST_BYTES)
                                 .digest(), dtype=np.uint8)
    return out


@dataclass
class PairCache:
    """The pairs a build found in :data:`PAIRS_FILE` (``known``, sorted by key) and the ones it
    looked at (``seen``: what :meth:`save` writes). ``reused`` and ``verified`` count the pairs
    answered from the file and the ones verified anew."""

    path: Path
    known: np.ndarray
    seen: list[np.ndarray] = field(default_factory=list)
    reused: int = 0
    verified: int = 0
    #: why the file on disk was not used ("" when it was, or when there was none)
    ignored: str = ""

    @classmethod
    def open(cls, cache_dir: Path) -> PairCache:
        """The cache in ``cache_dir``, memory-mapped; empty when there is no file or it does not
        check out (:attr:`ignored` says why)."""
        path = cache_dir / PAIRS_FILE
        empty = np.zeros(0, dtype=ROW_DTYPE)
        try:
            with open(path, "rb") as fh:
                line = fh.readline(4096)
                size = os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            return cls(path, empty)
        try:
            header = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict) or header.get("format") != _MAGIC:
            return cls(path, empty, ignored="damaged or cut short" if line.startswith(b"{") else "not a pair cache")
        if header.get("version") != VERIFY_VERSION or header.get("row_bytes") != ROW_DTYPE.itemsize:
            return cls(path, empty, ignored="written by another version of the verification")
        rows = header.get("rows")
        if not isinstance(rows, int) or size - len(line) != rows * ROW_DTYPE.itemsize:
            return cls(path, empty, ignored="damaged or cut short")
        known = np.memmap(path, dtype=ROW_DTYPE, mode="r", offset=len(line), shape=(rows,)) if rows else empty
        if _digest(known) != header.get("digest"):
            return cls(path, empty, ignored="damaged or cut short")
        return cls(path, known)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For pair keys (:data:`KEY_DTYPE`): which the file holds (bool mask) and their rows."""
        if len(self.known) == 0 or len(keys) == 0:
            return np.zeros(len(keys), dtype=bool), np.zeros(0, dtype=ROW_DTYPE)
        at = np.minimum(np.searchsorted(self.known["key"], keys), len(self.known) - 1)
        found = self.known["key"][at] == keys
        return found, self.known[at[found]]

    def remember(self, keys: np.ndarray, evidence: EvidenceArrays) -> None:
        """Note pairs this build looked at, with their evidence (:meth:`save` writes them)."""
        rows = np.empty(len(keys), dtype=ROW_DTYPE)
        rows["key"] = keys
        for name in _FIELDS:
            rows[name] = getattr(evidence, name)
        self.seen.append(rows)

    def save(self) -> None:
        """Replace the file by the pairs this build looked at, each once, sorted by key (whole or
        not at all: written under a temporary name, then renamed)."""
        rows = np.concatenate(self.seen) if self.seen else np.zeros(0, dtype=ROW_DTYPE)
        _, first = np.unique(rows["key"], return_index=True)  # sorted by key
        kept = np.ascontiguousarray(rows[first])
        header = {"format": _MAGIC, "version": VERIFY_VERSION, "row_bytes": ROW_DTYPE.itemsize,
                  "rows": len(kept), "digest": _digest(kept)}
        with cache_output(self.path) as fh:
            fh.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            fh.write(kept.tobytes())


def _digest(rows: np.ndarray) -> str:
    """blake2b of the rows' bytes, read 16 MB at a time (a memory-mapped file is not loaded whole)."""
    data = rows.view(np.uint8) if len(rows) else np.zeros(0, dtype=np.uint8)
    digest = hashlib.blake2b(digest_size=16)
    for start in range(0, len(data), 1 << 24):
        digest.update(data[start:start + (1 << 24)].data)
    return digest.hexdigest()


def _evidence(rows: np.ndarray) -> EvidenceArrays:
    return EvidenceArrays(*(np.array(rows[name]) for name in _FIELDS))


class _Digests:
    """The thumbnails' digests of each signature file, computed once per file (a task names only
    the files its pairs read: :class:`~packer.pipeline.nearcopy.VerifyTasks`)."""

    def __init__(self) -> None:
        self.of_file: dict[str, np.ndarray] = {}

    def _rows(self, files: tuple[str, ...], file: np.ndarray, row: np.ndarray) -> np.ndarray:
        out = np.empty((len(row), DIGEST_BYTES), dtype=np.uint8)
        file, row = np.asarray(file, dtype=np.int64), np.asarray(row)
        for f in np.unique(file).tolist():
            digests = self.of_file.get(files[f])
            if digests is None:
                digests = self.of_file[files[f]] = thumb_digests(files[f])
            here = file == f
            out[here] = digests[row[here]]
        return out

    def pair_keys(self, task: VerifyTask) -> np.ndarray:
        """Each pair's key (:data:`KEY_DTYPE`) in ``task``: its thumbnails' digests in the task's
        order, the task's floor and its ``screen``."""
        first = self._rows(task.files, task.a_file, task.a_row)
        second = self._rows(task.files, task.b_file, task.b_row)
        floor = np.full((len(first), 1), task.floor, dtype="<f8").view(np.uint8)
        screen = np.full((len(first), 1), int(task.screen), dtype=np.uint8)
        return np.ascontiguousarray(np.concatenate([first, second, floor, screen], axis=1)).view(KEY_DTYPE)[:, 0]


def cached_verification(run: RunVerify, cache: PairCache) -> RunVerify:
    """``run`` behind ``cache``: each task's pairs are looked up first, only the misses are
    verified by ``run`` (as a task of those pairs), and every task is answered whole, in its own
    pair order. Every pair is remembered for :meth:`PairCache.save`.

    What waits between the lookup and the answer is one flag a pair (which pairs missed): a
    task, its pair keys and the rows found are made again when its misses come back, so the
    tasks need not all exist at once (:class:`~packer.pipeline.nearcopy.VerifyTasks`)."""
    digests = _Digests()

    def wrapped(tasks: Sequence[VerifyTask]) -> Iterator[tuple[VerifyTask, EvidenceArrays]]:
        missed: dict[int, np.ndarray] = {}  # position in ``tasks`` -> which of its pairs the cache lacks
        for at in range(len(tasks)):
            task = tasks[at]
            if not len(cache.known):  # nothing to look up (a first build): every pair is verified
                missed[at] = np.ones(len(task.a_file), dtype=bool)
                continue
            keys = digests.pair_keys(task)
            found, rows = cache.lookup(keys)
            if not found.all():
                missed[at] = ~found
                continue
            cache.reused += len(rows)
            evidence = _evidence(rows)
            cache.remember(keys, evidence)
            yield task, evidence
        waiting = list(missed)

        def miss(k: int) -> VerifyTask:  # a task of the pairs the cache lacks, numbered by its place in ``waiting``
            task, lack = tasks[waiting[k]], missed[waiting[k]]
            return VerifyTask(index=k, files=task.files, a_file=task.a_file[lack], a_row=task.a_row[lack],
                              b_file=task.b_file[lack], b_row=task.b_row[lack], floor=task.floor, screen=task.screen)

        for sub, result in run(_Misses(len(waiting), miss, pairs=sum(int(m.sum()) for m in missed.values()))):
            at = waiting[sub.index]
            task = tasks[at]
            keys = digests.pair_keys(task)
            found, rows = cache.lookup(keys)
            del missed[at]
            cache.reused += len(rows)
            cache.verified += len(sub.a_file)
            evidence = _merged(found, _evidence(rows), result)
            cache.remember(keys, evidence)
            yield task, evidence
    return wrapped


class _Misses(LazySequence[VerifyTask]):
    """The tasks of the pairs a cache lacks, made as they are read, with their pair count."""

    def __init__(self, count: int, make: Callable[[int], VerifyTask], *, pairs: int) -> None:
        super().__init__(count, make)
        self.pairs = pairs


def _merged(found: np.ndarray, hits: EvidenceArrays, verified: EvidenceArrays) -> EvidenceArrays:
    """A task's evidence in pair order: ``hits`` where ``found``, ``verified`` elsewhere."""
    def column(name: str) -> np.ndarray:
        hit, new = getattr(hits, name), getattr(verified, name)
        out = np.empty(len(found), dtype=new.dtype)
        out[found], out[~found] = hit, new
        return out

    return EvidenceArrays(*(column(name) for name in _FIELDS))

