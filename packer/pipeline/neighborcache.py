"""The neighbour-list cache: each sample's nearest other-entity samples, kept between builds.

The candidate search (:func:`packer.pipeline.nearcopy.candidate_pairs`) compares every sample
with every other one, at three query zooms: O(n²), most of an incremental build's audit once
the verified pairs are reused (:mod:`packer.pipeline.paircache`). An old sample whose
embeddings, key and entity are unchanged has the same cosine with every other unchanged sample
as in the last build, so its neighbours among them are the last build's; only the samples that
are new (or changed, or moved to another entity) need comparing with it.

:func:`search_candidates` keeps, per sample and query zoom, the top ``2·w`` list (``w`` the
neighbours the search keeps at that zoom) of other-entity samples, ordered as the search orders
them (the rounded cosine, descending, then the sample's place in key order, which unchanged
samples keep). On a rebuild an unchanged sample's list loses the samples that are gone or
changed, and is merged with its scores against the new ones; the merged list is exact up to the
first place where something unseen could rank (the last kept old entry, or the last new one
when more new ones qualify than were kept). A list with fewer than ``w`` exact entries is
searched again in full, as is every new or changed sample. The candidates are then the ones a
full search gives, pair for pair and score for score (the cosines are exact sums of the float16
embeddings' products, the same in any block: :func:`~packer.pipeline.nearcopy.nearest`).

Above :data:`~packer.pipeline.nearcopy.EXACT_LIMIT` samples the search is an inverted file whose
clusters are trained on all embeddings: its answer depends on every sample, so nothing is reused
there (the file is left as it is).

The cache is one file in the build cache folder, :data:`NEIGHBORS_FILE`: a JSON header line
(format, version, the search's parameters, rows, the digest of the rows) and one row a sample of
the last build (its identity digest, and per zoom its list and whether the list holds every
qualifying sample). Written whole under a temporary name and renamed; a file that does not check
out is ignored and every sample is searched in full.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.pipeline.nearcopy import (
    _BLOCK_ELEMENTS,
    _SLACK,
    EMBED_DIM,
    EXACT_LIMIT,
    QUERY_ZOOMS,
    Candidates,
    candidate_pairs,
    nearest,
)
from packer.pipeline.spill import cache_output
from packer.progress import Progress, stage_progress

#: The cache's file in the build cache folder; its stem is what the cache's pruning keeps.
NEIGHBORS_FILE = "near-neighbors.bin"
NEIGHBORS_STEM = NEIGHBORS_FILE.split(".")[0]
_MAGIC = "packer-near-neighbors"
#: The version of the lists' meaning: raise it when the search's scores or order change.
SEARCH_VERSION = 1
_IDENT = np.dtype("V16")

Embeddings = Callable[[int, slice], np.ndarray]


def wanted(k: int, zoom: int) -> int:
    """Neighbours the search keeps per query at query zoom ``zoom`` (as
    :func:`~packer.pipeline.nearcopy.candidate_pairs` does)."""
    return k if zoom == 0 else max(2, k // 8)


def _row_dtype(k: int) -> np.dtype:
    kept = sum(2 * wanted(k, z) for z in range(len(QUERY_ZOOMS)))
    return np.dtype([("ident", _IDENT), ("index", "<i4", (kept,)), ("score", "<f4", (kept,)),
                     ("complete", "u1", (len(QUERY_ZOOMS),))])


def sample_identities(keys: Sequence[str], entities: Sequence[str | None], embeddings: Embeddings) -> np.ndarray:
    """Per sample, a 16-byte blake2b digest of its key, its entity and its embeddings at every
    query zoom: equal digests mean an unchanged sample, for the search."""
    n = len(keys)
    views = [np.ascontiguousarray(embeddings(z, slice(0, n)), dtype="<f2") for z in range(len(QUERY_ZOOMS))]
    out = np.empty(n, dtype=_IDENT)
    for s in range(n):
        digest = hashlib.blake2b(digest_size=16)
        entity = entities[s]
        digest.update(f"{keys[s]}\0{'' if entity is None else '=' + entity}\0".encode())
        for view in views:
            digest.update(view[s].data)
        out[s] = np.frombuffer(digest.digest(), dtype=_IDENT)[0]
    return out


@dataclass
class NeighborCache:
    """The lists a build found in :data:`NEIGHBORS_FILE` (``rows``, for neighbour count ``k``)
    and, after :func:`search_candidates`, the ones it leaves for the next build (``fresh``).
    ``reused`` counts the samples whose lists were merged rather than searched in full."""

    path: Path
    k: int
    rows: np.ndarray
    fresh: np.ndarray | None = None
    reused: int = 0
    #: why the file on disk was not used ("" when it was, or when there was none)
    ignored: str = ""

    @classmethod
    def open(cls, cache_dir: Path, k: int) -> NeighborCache:
        """The cache in ``cache_dir`` for neighbour count ``k``; empty when there is no file or
        it does not check out (:attr:`ignored` says why)."""
        path = cache_dir / NEIGHBORS_FILE
        dtype = _row_dtype(k)
        empty = np.zeros(0, dtype=dtype)
        try:
            with open(path, "rb") as fh:
                line = fh.readline(4096)
                size = os.fstat(fh.fileno()).st_size
                try:
                    header = json.loads(line)
                except (ValueError, UnicodeDecodeError):
                    header = None
                if not isinstance(header, dict) or header.get("format") != _MAGIC:
                    return cls(path, k, empty, ignored="damaged or cut short" if line.startswith(b"{")
                               else "not a neighbour cache")
                if header.get("parameters") != _parameters(k) or header.get("row_bytes") != dtype.itemsize:
                    return cls(path, k, empty, ignored="written for other search parameters or another version")
                count = header.get("rows")
                if not isinstance(count, int) or size - len(line) != count * dtype.itemsize:
                    return cls(path, k, empty, ignored="damaged or cut short")
                rows = np.frombuffer(fh.read(), dtype=dtype)
        except FileNotFoundError:
            return cls(path, k, empty)
        if _digest(rows) != header.get("digest"):
            return cls(path, k, empty, ignored="damaged or cut short")
        return cls(path, k, rows)

    def save(self) -> None:
        """Replace the file by this build's lists (whole or not at all); nothing when the search
        kept none (above :data:`~packer.pipeline.nearcopy.EXACT_LIMIT`)."""
        if self.fresh is None:
            return
        rows = np.ascontiguousarray(self.fresh)
        header = {"format": _MAGIC, "parameters": _parameters(self.k), "row_bytes": rows.dtype.itemsize,
                  "rows": len(rows), "digest": _digest(rows)}
        with cache_output(self.path) as fh:
            fh.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            fh.write(rows.tobytes())


def _parameters(k: int) -> dict[str, object]:
    return {"version": SEARCH_VERSION, "k": k, "zooms": list(QUERY_ZOOMS), "embed_dim": EMBED_DIM}


def _digest(rows: np.ndarray) -> str:
    return hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest()


def search_candidates(embeddings: Embeddings, groups: np.ndarray, k: int, identities: np.ndarray,
                      cache: NeighborCache, *, quiet: bool = False) -> Candidates:
    """:func:`~packer.pipeline.nearcopy.candidate_pairs` of the samples (``embeddings(zoom,
    rows)``, ``groups``), reusing the lists of ``cache.rows`` for samples whose
    ``identities`` (:func:`sample_identities`) are unchanged, and leaving this build's lists in
    ``cache.fresh``. The answer equals ``candidate_pairs(embeddings, groups, k)``. A long search
    shows the same ``search`` progress line (queries: one per sample and zoom, a reused list
    counted when merged) unless ``quiet``."""
    n = len(groups)
    if n < 2 or k < 1 or n > EXACT_LIMIT:
        cache.fresh = None if n > EXACT_LIMIT else np.zeros(0, dtype=_row_dtype(k))
        return candidate_pairs(embeddings, groups, k, quiet=quiet)
    with stage_progress("search", n * len(QUERY_ZOOMS), unit="queries", quiet=quiet) as progress:
        return _search_candidates(embeddings, groups, k, identities, cache, progress)


def _search_candidates(embeddings: Embeddings, groups: np.ndarray, k: int, identities: np.ndarray,
                       cache: NeighborCache, progress: Progress) -> Candidates:
    """:func:`search_candidates` of 2 to :data:`EXACT_LIMIT` samples, counting in ``progress``."""
    n = len(groups)
    old = cache.rows
    old_at = {bytes(ident): row for row, ident in enumerate(old["ident"].tolist())}
    old_of = np.array([old_at.get(bytes(ident), -1) for ident in identities.tolist()], dtype=np.int64)
    new_of_old = np.full(len(old) + 1, -1, dtype=np.int64)  # the last entry: a list's -1 padding
    new_of_old[old_of[old_of >= 0]] = np.flatnonzero(old_of >= 0)
    fresh = np.zeros(n, dtype=_row_dtype(k))
    fresh["ident"] = identities
    base = embeddings(0, slice(0, n))
    unchanged = old_of >= 0
    kept = np.flatnonzero(unchanged)
    reused = unchanged.copy()  # samples whose lists were all merged, none searched in full
    lists: list[np.ndarray] = []
    offset = 0
    for z in range(len(QUERY_ZOOMS)):
        w = wanted(k, z)
        width = 2 * w
        queries = base if z == 0 else embeddings(z, slice(0, n))
        index = np.full((n, width), -1, dtype=np.int64)
        score = np.full((n, width), -np.inf, dtype=np.float32)
        complete = np.zeros(n, dtype=bool)
        merged_ok = np.zeros(n, dtype=bool)
        if len(kept):
            at = slice(offset, offset + width)
            exact, m_index, m_score, m_complete = _merged(
                old["index"][old_of[kept], at], old["score"][old_of[kept], at],
                old["complete"][old_of[kept], z].astype(bool), new_of_old, kept, unchanged, base, queries, groups,
                width)
            ok = (exact >= w) | m_complete
            rows = kept[ok]
            index[rows], score[rows], complete[rows] = m_index[ok], m_score[ok], m_complete[ok]
            merged_ok[rows] = True
            progress.update(len(rows))
        searched = np.flatnonzero(~merged_ok)
        reused[searched] = False
        if len(searched):
            found, found_score = nearest(base, queries[searched], groups[searched], groups, width, progress=progress)
            index[searched], score[searched] = found, found_score
            complete[searched] = (found >= 0).sum(axis=1) < width
        fresh["index"][:, offset:offset + width] = index
        fresh["score"][:, offset:offset + width] = score
        fresh["complete"][:, z] = complete
        lists.append(index[:, :w])
        offset += width
    cache.reused = int(reused.sum())
    cache.fresh = fresh
    return _pairs(lists, fresh, k)


def _merged(old_index: np.ndarray, old_score: np.ndarray, old_complete: np.ndarray, new_of_old: np.ndarray,
            kept: np.ndarray, unchanged: np.ndarray, base: np.ndarray, queries: np.ndarray, groups: np.ndarray,
            width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The lists of the unchanged samples ``kept``: their old lists (``old_index`` into the last
    build's rows, -1 padded) without the samples that are gone, merged with their best ``width``
    among the samples that are not unchanged. Returns (exact entries, indices, scores, complete)
    per row, the lists cut to ``width``: entries past the exact ones are -1/-inf.

    Most rows are *settled* without ranking anything: an open list (not every qualifying sample)
    that keeps at least one old entry, against which every new sample of another group scores
    surely below its last kept entry (float32 cosines plus the slack that bounds their error,
    :data:`~packer.pipeline.nearcopy._SLACK`). The merge would put every new sample after the
    old entries and count the old ones exact, so the row is its old list as it is; only the other
    rows are merged in full (:func:`_merged_in_full`). Same answer, a fraction of the work when few
    samples are new."""
    rows = len(kept)
    mapped = new_of_old[np.where(old_index >= 0, old_index, len(new_of_old) - 1)]
    k_score = np.where(mapped >= 0, old_score, -np.inf).astype(np.float32)
    order = np.argsort(mapped < 0, axis=1, kind="stable")  # the kept entries first, in their order
    k_index = np.take_along_axis(mapped, order, axis=1)
    k_score = np.take_along_axis(k_score, order, axis=1)
    k_count = (k_index >= 0).sum(axis=1)
    last = np.where(k_count > 0, k_score[np.arange(rows), np.maximum(k_count - 1, 0)], np.inf)
    settled = ~old_complete & (k_count > 0)
    others = np.flatnonzero(~unchanged)
    if len(others) and settled.any():
        at = np.flatnonzero(settled)
        settled[at] = _surely_below(queries[kept[at]], base[others], groups[kept[at]], groups[others], last[at])
    exact = np.where(settled, k_count, 0)
    out_index = np.where(settled[:, None], k_index, -1)[:, :width]
    out_score = np.where(settled[:, None], k_score, -np.inf)[:, :width].astype(np.float32)
    complete = np.zeros(rows, dtype=bool)
    rest = np.flatnonzero(~settled)
    if len(rest):
        exact[rest], out_index[rest], out_score[rest], complete[rest] = _merged_in_full(
            k_index[rest], k_score[rest], k_count[rest], old_complete[rest], kept[rest], unchanged, base, queries,
            groups, width)
    return exact, out_index, out_score, complete


def _surely_below(queries: np.ndarray, base: np.ndarray, query_group: np.ndarray, base_group: np.ndarray,
                  bound: np.ndarray) -> np.ndarray:
    """Per query, whether every ``base`` row of another group has an exact (rounded) cosine
    below ``bound``: its float32 cosine plus :data:`~packer.pipeline.nearcopy._SLACK` is (the
    float32 error and the rounding step together are below the slack)."""
    out = np.empty(len(queries), dtype=bool)
    base32 = np.asarray(base, dtype=np.float32)
    block = max(1, _BLOCK_ELEMENTS // max(1, len(base)))
    for start in range(0, len(queries), block):
        stop = min(len(queries), start + block)
        rough = np.asarray(queries[start:stop], dtype=np.float32) @ base32.T
        rough[query_group[start:stop, None] == base_group[None, :]] = -np.inf
        out[start:stop] = rough.max(axis=1, initial=-np.inf) + _SLACK < bound[start:stop]
    return out


def _merged_in_full(k_index: np.ndarray, k_score: np.ndarray, k_count: np.ndarray, old_complete: np.ndarray,
                    kept: np.ndarray, unchanged: np.ndarray, base: np.ndarray, queries: np.ndarray,
                    groups: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_merged` of rows ``kept``, every row ranked against every new sample: their old
    entries still there (``k_index`` in this build's rows, ``k_score``, the first ``k_count`` of
    each row; -1/-inf after) merged with their best ``width`` among the new samples."""
    rows = len(kept)
    others = np.flatnonzero(~unchanged)
    if len(others):
        found, f_score = nearest(base[others], queries[kept], groups[kept], groups[others], width)
        f_index = np.where(found >= 0, others[np.maximum(found, 0)], -1)
    else:
        f_index = np.full((rows, width), -1, dtype=np.int64)
        f_score = np.full((rows, width), -np.inf, dtype=np.float32)
    f_count = (f_index >= 0).sum(axis=1)
    f_complete = f_count < width
    all_index = np.concatenate([k_index, f_index], axis=1)
    all_score = np.concatenate([k_score, f_score], axis=1)
    big = np.iinfo(np.int64).max
    rank = np.lexsort((np.where(all_index < 0, big, all_index), -all_score), axis=1)
    all_index = np.take_along_axis(all_index, rank, axis=1)
    all_score = np.take_along_axis(all_score, rank, axis=1)
    # the last place known exact: an incomplete part's last entry bounds what is unseen of it
    last = np.arange(rows)
    bound_score = np.full(rows, -np.inf, dtype=np.float32)
    bound_index = np.full(rows, big, dtype=np.int64)
    parts = ((k_count, old_complete, k_index, k_score), (f_count, f_complete, f_index, f_score))
    for count, complete, idx, sc in parts:
        open_ = ~complete
        at = np.maximum(count - 1, 0)
        b_score = np.where(count > 0, sc[last, at], np.inf).astype(np.float32)  # nothing kept: nothing is exact
        b_index = np.where(count > 0, idx[last, at], -1)
        tighter = open_ & ((b_score > bound_score) | ((b_score == bound_score) & (b_index < bound_index)))
        bound_score = np.where(tighter, b_score, bound_score)
        bound_index = np.where(tighter, b_index, bound_index)
    valid = all_index >= 0
    within = valid & ((all_score > bound_score[:, None]) |
                      ((all_score == bound_score[:, None]) & (all_index <= bound_index[:, None])))
    exact = within.sum(axis=1)
    complete = old_complete & f_complete & (exact <= width)
    keep = np.arange(all_index.shape[1])[None, :] < np.minimum(exact, width)[:, None]
    out_index = np.where(keep, all_index, -1)[:, :width]
    out_score = np.where(keep, all_score, -np.inf)[:, :width].astype(np.float32)
    return exact, out_index, out_score, complete


def _pairs(lists: Sequence[np.ndarray], rows: np.ndarray, k: int) -> Candidates:
    """The candidate pairs of the per-zoom neighbour lists (``lists[z]``: n × wanted, -1 padded),
    each once with its best similarity, as :func:`~packer.pipeline.nearcopy.candidate_pairs`
    assembles them."""
    keys, similarities = [], []
    offset = 0
    for z, found in enumerate(lists):
        w = found.shape[1]
        score = rows["score"][:, offset:offset + w]
        keep = found >= 0
        a = np.nonzero(keep)[0].astype(np.int64)
        b = found[keep].astype(np.int64)
        keys.append((np.minimum(a, b) << 32) | np.maximum(a, b))
        similarities.append(score[keep])
        offset += 2 * wanted(k, z)
    key = np.concatenate(keys)
    similarity = np.concatenate(similarities)
    order = np.argsort(key, kind="stable")
    key, similarity = key[order], similarity[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, dtype=np.int64)
    best = np.maximum.reduceat(similarity, starts) if len(starts) else similarity[:0]
    key = key[starts]
    return Candidates((key >> 32).astype(np.int32), (key & 0xFFFFFFFF).astype(np.int32), best.astype(np.float32))
