"""Near copies: which samples are the same image re-encoded, resized, shifted, cropped or re-windowed.

Leakage hides in copies that are not byte-identical: a CT slice exported as PNG or JPEG with
another window, a resized or slightly cropped copy, the same image under a second entity id.
Look-alikes are not copies: slices of different patients at the same level of the same
anatomy resemble each other at any coarse scale. A hash within a Hamming threshold cannot tell
the two apart (a re-windowed copy differed in 10-20 of 64 dHash bits while different patients'
slices agreed within 4), and linking every pair within a threshold closes the links
transitively into one giant group as soon as chance links reach about one per sample.

So a link is made in two steps, and only a verified pair is a link:

1. **Candidates** (:func:`candidate_pairs`): each sample's ``k`` nearest samples of *other*
   entities by the cosine of a compact :func:`embedding` (low frequencies of the thumbnail's
   magnitude spectrum, which a shift does not change, an 8×8 view of it, and the spectrum after
   histogram equalisation, which another window does not change), queried also at ±6 % zoom so
   that cropped copies are found. Work grows with ``n · k``, not with how many
   samples look alike (:func:`nearest`).
2. **Verification** (:func:`verify`) on the two 64×64 thumbnails: the best alignment over zooms of
   0.91-1.09 and shifts of ±6 pixels of their fine structure (the image minus its blur), scored
   by the normalised correlation of that structure (``structure``), and the share of one
   image's variance that the other's intensities explain through any function
   (``intensity``: the correlation ratio η² over 128 equal-count intensity bins, so a
   re-windowed copy, whose intensities are a monotone function of the source's, still scores
   high, while two patients' slices leave their differing anatomy unexplained). A pair passes
   when ``intensity`` reaches ``split.near_duplicates.min_score`` (default 0.984) and
   ``structure`` reaches 0.6. A cheap first stage (:mod:`packer.pipeline.nearscreen`: the same
   fine-structure agreement at half resolution, for a task's pairs at once) turns away, before
   they are verified, the pairs that agree far less there than any copy measured; the pairs the
   rival test reads are then verified in full (:func:`settle_rivals`), so the links are those of
   verifying every candidate.
3. **The rival test** (:func:`rival_test`): a passing pair is a link only when it stands out from
   everything else its samples resemble: its disagreement ``1 - score`` is at most
   ``split.near_duplicates.max_ratio`` (default 0.5) of the disagreement with the best *rival*,
   the highest-scoring candidate of either sample from a third entity that is not itself a copy
   of the other side (the ratio test of feature matching). Among thousands of look-alike
   patients, the best look-alike of a slice scores about as high as the next one (ratios 0.61
   and up, measured); a copy leaves every look-alike far behind (0.38 and below).

Signatures are computed once, in the pixel pass, from the packed output (:func:`signature`; under
``resize: fit`` from the box the image lies in, not its padding: :func:`packed_signature`) and
kept in the build cache, not in the shards: per sample a 64×64 uint8 thumbnail and a float16
embedding at three zooms (:data:`SIGNATURE_DTYPE`, 5,572 bytes), one file per chunk.

Transitivity: links are joined (a copy of a copy is a copy), and what bounds the chains is
that a link is strong evidence on its own: a look-alike among look-alikes fails the rival test,
which is exactly where chains of chance links grow (a giant group needs about one chance link
per sample; 0 in 12,090 were made at 3,000 similar patients). Each link's evidence (scores,
alignment, rival) is in ``leakage.json``, and a split group that still grows past
``split.balance.max_group_share`` fails the build.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packer.opencv import cv2
from packer.pipeline.cluster import LazySequence
from packer.pipeline.dedup import is_blank
from packer.pipeline.nearscreen import BLOCK as SCREEN_BLOCK
from packer.pipeline.nearscreen import let_through
from packer.progress import Progress, stage_progress
from packer.schemas import schema_defaults

#: Side of the verification thumbnail.
THUMB = 64
#: Spectrum radius of the embedding: frequencies |u|, |v| <= R of the 64×64 thumbnail.
_RADIUS = 6
_RAW = 8
_SPECTRUM = (2 * _RADIUS + 1) * (_RADIUS + 1)
EMBED_DIM = 2 * _SPECTRUM + _RAW * _RAW
#: Zooms at which every sample is embedded: at 1.0 it is found, at all three it searches (a crop of a
#: few pixels is a zoom).
QUERY_ZOOMS = (1.0, 0.94, 1.06)
SIGNATURE_DTYPE = np.dtype([("embedding", "<f2", (len(QUERY_ZOOMS), EMBED_DIM)), ("thumb", "u1", (THUMB, THUMB))])
#: Zooms and shifts (pixels of the thumbnail) the verification searches.
VERIFY_ZOOMS = (0.91, 1.09)  # range: searched at 0.94, 1, 1.06, then ±0.03 around the best
VERIFY_SHIFT = 6
_HANN = np.outer(np.hanning(THUMB), np.hanning(THUMB)).astype(np.float32)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The sample as a 64×64 uint8 grey thumbnail: channel mean, area-resized, min-max scaled.

    ``image`` is C×H×W or H×W of any numeric dtype. A blank image (:func:`~packer.pipeline.dedup.is_blank`:
    constant, or a uint8 one within 2 levels) gives zeros, as it shows nothing: min-max scaling would
    stretch a dark border's faint pattern, shared by many photos, into a full-contrast look-alike.
    Raises ValueError for an empty array or non-finite values.
    """
    arr = np.asarray(image)
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise ValueError(f"a thumbnail needs a non-empty H×W or C×H×W array, got shape {arr.shape}")
    if is_blank(arr):
        return np.zeros((THUMB, THUMB), dtype=np.uint8)
    gray = arr.mean(axis=0, dtype=np.float32) if arr.ndim == 3 else arr.astype(np.float32)
    if not np.isfinite(gray).all():
        raise ValueError("a thumbnail needs finite pixel values; the array holds NaN or inf")
    small = cv2.resize(np.ascontiguousarray(gray), (THUMB, THUMB), interpolation=cv2.INTER_AREA)
    low, high = float(small.min()), float(small.max())
    if high <= low:
        return np.zeros((THUMB, THUMB), dtype=np.uint8)
    return np.rint((small - low) * (255.0 / (high - low))).astype(np.uint8)


def _spectrum(grey: np.ndarray) -> np.ndarray:
    """Log magnitudes of the low frequencies of a (Hann-windowed) thumbnail: a shift barely changes them."""
    spectrum = np.abs(np.fft.rfft2((grey - grey.mean()) * _HANN))[:, :_RADIUS + 1]
    return np.log1p(np.concatenate([spectrum[:_RADIUS + 1], spectrum[-_RADIUS:]]).ravel())


def embedding(thumb: np.ndarray) -> np.ndarray:
    """The candidate-search vector of a uint8 thumbnail: float32, unit length, :data:`EMBED_DIM` long.

    Three parts, each centred and scaled to length 1/√3: the low-frequency spectrum of the
    thumbnail (:func:`_spectrum`), the thumbnail area-averaged to 8×8, and the spectrum of the
    thumbnail after histogram equalisation, which a copy shown through another window (a
    monotone remapping of intensities) shares with its source.
    """
    grey = thumb.astype(np.float32)
    equalised = cv2.equalizeHist(np.ascontiguousarray(thumb, dtype=np.uint8)).astype(np.float32)
    raw = cv2.resize(grey, (_RAW, _RAW), interpolation=cv2.INTER_AREA).ravel()
    parts = []
    for part in (_spectrum(grey), raw, _spectrum(equalised)):
        part = part - part.mean()
        norm = float(np.linalg.norm(part))
        parts.append(part / norm if norm > 0 else part)
    return (np.concatenate(parts) / np.sqrt(3.0)).astype(np.float32)


#: The smallest packed output side (pixels) whose thumbnail is near-copy evidence. A smaller
#: output is blown up to 64×64 in blocks or bars of one value each: aligned on the blocks' grid,
#: every bin of η² holds one block, so any two such outputs "explain" each other (independent
#: uniform noise scored a median η² of 0.86 at 1×8 and 3×3, 0.53 at 8×8, 0.10 at 20×20), and the
#: fine structure is the blocks' shared edges (13 of 150 noise pairs passed at 1×8, 9 at 3×3,
#: and a tiled build chained every entity into one group). Below it a sample's signature is
#: blank: it gets exact copies only (its sha256), never a near link.
MIN_SIDE = 16


def signature(image: np.ndarray, *, blank: bool = False) -> Any:
    """One row of :data:`SIGNATURE_DTYPE` for a packed sample (C×H×W or H×W): its thumbnail and its
    embedding at each of :data:`QUERY_ZOOMS`. ``blank``: the thumbnail is zeros (no evidence of
    anything, as a blank image's: :func:`packed_signature` for an output under :data:`MIN_SIDE`)."""
    row = np.zeros((), dtype=SIGNATURE_DTYPE)
    thumb = thumbnail(image)  # also where blank: it refuses what no sample can be
    if blank:
        thumb = np.zeros((THUMB, THUMB), dtype=np.uint8)
    row["thumb"] = thumb
    grey = thumb.astype(np.float32)
    for z, zoom in enumerate(QUERY_ZOOMS):
        view = thumb if zoom == 1.0 else np.clip(np.rint(zoomed(grey, zoom)), 0, 255).astype(np.uint8)
        row["embedding"][z] = embedding(view)
    return row[()]  # type: ignore[no-any-return]


def packed_signature(image: np.ndarray, content: tuple[int, int, int, int] | None = None) -> Any:
    """The :func:`signature` of a packed output, C×H×W (or C×D×H×W: a volume's is its middle
    slice's, so a copy of a series that lost slices at one end, whose middle is another source
    slice, is often missed: a limit README's "Near copies" names), drawn from ``content`` alone:
    the (top, left, height, width) box the source image lies in (:attr:`packer.records.Sample.content`;
    ``None``: the whole output), resized to the thumbnail as a ``stretch`` output would be.
    ``resize: fit``'s letterbox padding is no evidence: counted, two different photos of one unusual
    aspect (4:1 panoramas, whose content is a quarter of a square output) agreed on the three
    quarters of constant border and verified as copies (η² 0.99 for two noise textures). Blank where
    the box's height or width is under :data:`MIN_SIDE` (a wide panorama in a small output
    included), so the sample gets exact copies only."""
    plane = image if image.ndim == 3 else image[:, image.shape[1] // 2]
    if content is not None:
        top, left, height, width = content
        if min(height, width) < MIN_SIDE:
            return signature(plane, blank=True)
        plane = plane[:, top:top + height, left:left + width]
    return signature(plane, blank=min(plane.shape[-2:]) < MIN_SIDE)


def zoomed(thumb: np.ndarray, zoom: float) -> np.ndarray:
    """``thumb`` (float32) magnified by ``zoom`` about its centre, edges replicated."""
    centre = (THUMB - 1) / 2.0
    matrix = cv2.getRotationMatrix2D((centre, centre), 0.0, zoom)
    return cv2.warpAffine(thumb, matrix, (THUMB, THUMB), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def write_signatures(target: Path | BinaryIO, rows: Sequence[np.void]) -> None:
    """Write a chunk's signatures as one ``.npy`` array (``np.load(..., mmap_mode="r")`` reads rows)."""
    np.save(target, np.array(rows, dtype=SIGNATURE_DTYPE), allow_pickle=False)


def read_signatures(path: Path) -> np.ndarray:
    """A chunk's signature array, memory-mapped. Raises ValueError when it is not one."""
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.dtype != SIGNATURE_DTYPE:
        raise ValueError(f"{path}: not a packer signature file (dtype {array.dtype})")
    return array


# -- candidates --------------------------------------------------------------------------------

#: Score-matrix elements computed at once (float32): 4M, 16 MB (with the selection's int64
#: indices, about 50 MB a block; 16M elements peaked at 490 MB at 10,000 samples).
_BLOCK_ELEMENTS = 1 << 22
#: Up to this many samples the nearest neighbours are exact; above, an inverted-file index
#: (:class:`InvertedFile`) compares each query with the members of its nearest clusters only.
EXACT_LIMIT = 30_000
#: Clusters searched per query in the inverted file.
PROBES = 24


def _best_k(scores: np.ndarray, columns: np.ndarray, query_group: np.ndarray, base_group: np.ndarray,
            k: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``scores`` (rows × columns), the ``k`` best columns of another group than the
    row's, as (base indices, scores), -1/-inf where fewer qualify. Scores are rounded to 1e-5
    and ties go to the lower index: the answer is a function of the rounded scores alone, not of
    which block a row or column was scored in. ``skip``: the largest group size (the most
    same-group columns that can precede the k wanted). ``scores`` is the caller's temporary: it
    is rounded and negated in place (no copies of a block)."""
    rows, width = scores.shape
    take = min(width, k + skip)
    negated = np.negative(np.round(scores, 5, out=scores), out=scores)
    if take < width:
        part = np.argpartition(negated, take - 1, axis=1)[:, :take]
        # equal scores across the partition's edge: which of them it kept is arbitrary, and the
        # lower index must win, so such a row is ranked over every column (rare)
        edge = np.take_along_axis(negated, part, axis=1).max(axis=1)
        straddles = np.flatnonzero((negated <= edge[:, None]).sum(axis=1) > take)
    else:
        part = np.broadcast_to(np.arange(width), (rows, width)).copy()
        straddles = np.zeros(0, dtype=np.int64)
    best_index, best_score = _ranked(negated, part, columns, query_group, base_group, k)
    every = np.arange(width)[None, :]
    for row in straddles.tolist():
        index, score = _ranked(negated[row:row + 1], every, columns, query_group[row:row + 1], base_group, k)
        best_index[row], best_score[row] = index[0], score[0]
    return best_index, best_score


def _ranked(negated: np.ndarray, part: np.ndarray, columns: np.ndarray, query_group: np.ndarray,
            base_group: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_best_k` among the columns ``part`` (per row) of the negated, rounded scores."""
    part_scores = -np.take_along_axis(negated, part, axis=1)
    part_index = columns[part]
    part_scores[base_group[part_index] == query_group[:, None]] = -np.inf
    order = np.lexsort((part_index, -part_scores), axis=1)[:, :k]
    best_index = np.take_along_axis(part_index, order, axis=1)
    best_score = np.take_along_axis(part_scores, order, axis=1).astype(np.float32)
    if best_index.shape[1] < k:
        pad = k - best_index.shape[1]
        best_index = np.pad(best_index, ((0, 0), (0, pad)), constant_values=-1)
        best_score = np.pad(best_score, ((0, 0), (0, pad)), constant_values=-np.inf)
    best_index[~np.isfinite(best_score)] = -1
    return best_index, best_score


def nearest(base: np.ndarray, queries: np.ndarray, query_group: np.ndarray, base_group: np.ndarray,
            k: int, index: InvertedFile | None = None, progress: Progress | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """For each query, the ``k`` base rows of the highest cosine whose group differs from its own.

    ``base`` (n×d) and ``queries`` (m×d) hold unit vectors; returns (indices m×k, similarities
    m×k), -1 / -inf where fewer than ``k`` rows qualify. Exact (blockwise float32 matrix
    products, O(n·m·d) time, 16 MB of scores at a time, then the columns near each row's k-th
    rescored exactly: :func:`_best_k_exact`, the same answer in any block) up to
    :data:`EXACT_LIMIT` base rows; beyond, an inverted file (:class:`InvertedFile`, ``index`` when
    already built on ``base``):
    approximate, O(m·√n·d). ``progress`` counts the queries answered, block by block (cluster by
    cluster in the inverted file).
    """
    if len(base) > EXACT_LIMIT:
        return (index or InvertedFile.build(base, base_group)).query(base, queries, query_group, base_group, k,
                                                                     progress)
    m = len(queries)
    skip = int(np.bincount(np.unique(base_group, return_inverse=True)[1]).max()) if len(base_group) else 0
    out_index = np.full((m, k), -1, dtype=np.int32)
    out_score = np.full((m, k), -np.inf, dtype=np.float32)
    block = max(1, _BLOCK_ELEMENTS // max(1, len(base)))
    base32 = np.asarray(base, dtype=np.float32)
    exact = _ExactCosines(base, queries)
    for start in range(0, m, block):
        stop = min(m, start + block)
        rough = np.asarray(queries[start:stop], dtype=np.float32) @ base32.T
        out_index[start:stop], out_score[start:stop] = _best_k_exact(
            rough, exact.scaled(queries[start:stop]), exact, query_group[start:stop], base_group, k, skip)
        if progress is not None:
            progress.update(stop - start)
    return out_index, out_score


#: How far below a row's ``k + skip``-th float32 cosine a column may be and still be rescored
#: exactly: a float32 dot product of two unit vectors of :data:`EMBED_DIM` float16 values is within
#: ``d·u`` ≈ 1.5e-5 of the exact one in any summation order, twice that plus a rounding step is
#: below this slack, so no column of the exact top ``k`` is left out.
_SLACK = 5e-5
#: Column pairs rescored at once (bounds the gathered vectors: 16k × d × 8 bytes, twice).
_RESCORE = 1 << 14


class _ExactCosines:
    """Cosines that are a function of the two vectors alone, not of the block they are computed
    in (float32 and float64 matrix products are not: BLAS kernels sum in an order that depends on
    the shapes, which changed ~2% of the float32 scores at the fifth decimal). float16 vectors
    with components in [-1, 1] (every embedding) are integers times 2⁻²⁴, so their dot product is
    an exact int64 sum; other inputs are summed in float64."""

    def __init__(self, base: np.ndarray, queries: np.ndarray) -> None:
        self.integer = _integral(base) and _integral(queries)
        self.base = self.scaled(base)

    def scaled(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` as :meth:`scores` takes them (int64 times 2²⁴, or float64)."""
        if self.integer:
            return (np.asarray(vectors, dtype=np.float64) * 2.0 ** 24).astype(np.int64)
        return np.asarray(vectors, dtype=np.float64)

    def scores(self, queries: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Rounded (1e-5) cosines of pairs (``rows[p]`` of ``queries``, :meth:`scaled`, and ``cols[p]``
        of the base)."""
        out = np.empty(len(rows), dtype=np.float64)
        for lo in range(0, len(rows), _RESCORE):
            hi = min(len(rows), lo + _RESCORE)
            dots = (queries[rows[lo:hi]] * self.base[cols[lo:hi]]).sum(axis=1)
            out[lo:hi] = dots * 2.0 ** -48 if self.integer else dots
        return np.round(out, 5)


def _integral(vectors: np.ndarray) -> bool:
    array = np.asarray(vectors)
    return bool(array.dtype == np.float16 and (array.size == 0 or float(np.abs(array).max()) <= 1.0))


def _best_k_exact(rough: np.ndarray, queries: np.ndarray, exact: _ExactCosines, query_group: np.ndarray,
                  base_group: np.ndarray, k: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_best_k` of a block of queries, ranked by exact cosines (:class:`_ExactCosines`):
    the float32 scores ``rough`` pick the columns within :data:`_SLACK` of each row's
    ``k + skip``-th best, which are rescored exactly, then the ``k`` best of another group by
    (rounded cosine descending, index ascending). Equal inputs give equal answers in any block."""
    rows, width = rough.shape
    take = min(width, k + skip)
    if take < width:
        edge = np.partition(rough, width - take, axis=1)[:, width - take]
        r, c = np.nonzero(rough >= (edge - _SLACK)[:, None])
    else:
        r, c = np.nonzero(np.ones((rows, width), dtype=bool))
    qualifies = base_group[c] != query_group[r]
    r, c = r[qualifies], c[qualifies]
    # only columns within the slack of the row's k-th qualifying float32 score can be among its k best
    values = rough[r, c]
    order = np.lexsort((-values, r))
    r, c, values = r[order], c[order], values[order]
    first = np.searchsorted(r, np.arange(rows))
    count = np.diff(np.r_[first, len(r)])
    kth = np.where(count >= k, values[np.minimum(first + k - 1, max(0, len(r) - 1))] if len(r) else 0.0, -np.inf)
    near = values >= kth[r] - _SLACK
    r, c = r[near], c[near]
    score = exact.scores(queries, r, c)
    order = np.lexsort((c, -score, r))
    r, c, score = r[order], c[order], score[order]
    rank = np.arange(len(r)) - np.searchsorted(r, r)
    keep = rank < k
    best_index = np.full((rows, k), -1, dtype=np.int64)
    best_score = np.full((rows, k), -np.inf, dtype=np.float32)
    best_index[r[keep], rank[keep]] = c[keep]
    best_score[r[keep], rank[keep]] = score[keep]
    return best_index, best_score


def _kmeans(vectors: np.ndarray, clusters: int, iterations: int = 8) -> np.ndarray:
    """Spherical k-means centroids (clusters × d) of ``vectors``, from a seeded start: the same
    input gives the same centroids."""
    rng = np.random.default_rng(0)
    sample = np.asarray(vectors[np.sort(rng.choice(len(vectors), min(len(vectors), 32 * clusters), replace=False))],
                        dtype=np.float32)
    centroids = sample[np.sort(rng.choice(len(sample), clusters, replace=False))]
    for _ in range(iterations):
        assign = _assign(sample, centroids)
        sums = np.zeros_like(centroids)
        np.add.at(sums, assign, sample)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0
        centroids = np.where(empty[:, None], centroids, sums / np.maximum(norms, 1e-12))
    return centroids


def _assign(vectors: np.ndarray, centroids: np.ndarray, probes: int = 1) -> np.ndarray:
    """The ``probes`` nearest centroids of each vector (n × probes, best first; n when probes is 1)."""
    out = np.empty((len(vectors), probes), dtype=np.int32)
    block = max(1, _BLOCK_ELEMENTS // max(1, len(centroids)))
    for start in range(0, len(vectors), block):
        scores = np.asarray(vectors[start:start + block], dtype=np.float32) @ centroids.T
        if probes == 1:
            out[start:start + block, 0] = np.argmax(scores, axis=1)
        else:
            part = np.argpartition(-scores, probes - 1, axis=1)[:, :probes]
            order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
            out[start:start + block] = np.take_along_axis(part, order, axis=1)
    return out[:, 0] if probes == 1 else out


@dataclass(frozen=True)
class InvertedFile:
    """Base rows in ``4·√n`` clusters (spherical k-means); a query is compared with the members
    of its :data:`PROBES` nearest clusters (:meth:`query`). Built once, queried block by block."""

    centroids: np.ndarray
    members: np.ndarray   # base rows, cluster by cluster
    starts: np.ndarray    # cluster c's members: members[starts[c]:starts[c + 1]]
    skip: int             # the largest group's size: how many rows one query may have to pass over

    @classmethod
    def build(cls, base: np.ndarray, base_group: np.ndarray) -> InvertedFile:
        clusters = int(min(len(base), max(1, round(4 * np.sqrt(len(base))))))
        centroids = _kmeans(base, clusters)
        home = _assign(base, centroids)
        members = np.argsort(home, kind="stable").astype(np.int32)
        starts = np.searchsorted(home[members], np.arange(clusters + 1))
        skip = int(np.bincount(np.unique(base_group, return_inverse=True)[1]).max())
        return cls(centroids, members, starts, skip)

    def query(self, base: np.ndarray, queries: np.ndarray, query_group: np.ndarray, base_group: np.ndarray,
              k: int, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`nearest` through this index (built on ``base``); ``progress`` counts the queries
        answered (a query asks several clusters: its share of each, as the clusters are searched)."""
        clusters = len(self.centroids)
        probe = _assign(queries, self.centroids, min(PROBES, clusters))
        best_index = np.full((len(queries), k), -1, dtype=np.int32)
        best_score = np.full((len(queries), k), -np.inf, dtype=np.float32)
        by_cluster = np.argsort(probe.ravel(), kind="stable")
        bounds = np.searchsorted(probe.ravel()[by_cluster], np.arange(clusters + 1))
        for c in range(clusters):
            asking = by_cluster[bounds[c]:bounds[c + 1]] // probe.shape[1]
            if progress is not None:  # bounds[c + 1] of the m × probes (query, cluster) pairs are searched
                progress.update(int(bounds[c + 1]) // probe.shape[1] - int(bounds[c]) // probe.shape[1])
            listed = self.members[self.starts[c]:self.starts[c + 1]]
            if len(asking) == 0 or len(listed) == 0:
                continue
            scores = np.asarray(queries[asking], dtype=np.float32) @ np.asarray(base[listed], dtype=np.float32).T
            index, score = _best_k(scores, listed, query_group[asking], base_group, k, self.skip)
            merged_index = np.concatenate([best_index[asking], index], axis=1)
            merged_score = np.concatenate([best_score[asking], score], axis=1)
            order = np.lexsort((np.where(merged_index < 0, np.iinfo(np.int32).max, merged_index), -merged_score),
                               axis=1)[:, :k]
            best_index[asking] = np.take_along_axis(merged_index, order, axis=1)
            best_score[asking] = np.take_along_axis(merged_score, order, axis=1)
        return best_index, best_score


@dataclass(frozen=True)
class Candidates:
    """Pairs (i < j) of samples of different groups to verify, with their embedding cosine."""

    i: np.ndarray
    j: np.ndarray
    similarity: np.ndarray

    def __len__(self) -> int:
        return len(self.i)


def _best_per_pair(key: np.ndarray, similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct pair key once, ascending, with its highest similarity."""
    order = np.argsort(key, kind="stable")
    key = key[order]
    # (no pairs at all, e.g. every sample in one split group: np.r_[True] would still start one)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, dtype=np.int64)
    best = np.maximum.reduceat(similarity[order], starts) if len(starts) else similarity[:0]
    return key[starts], best.astype(np.float32)


#: Query rows searched at once: bounds the search's working arrays (probes, neighbour lists) at any n.
QUERY_BLOCK = 1 << 17


def candidate_pairs(embeddings: np.ndarray | Callable[[int, slice], np.ndarray], groups: np.ndarray,
                    k: int, *, quiet: bool = False) -> Candidates:
    """Each sample's ``k`` nearest samples of other groups (entities), by the best cosine over
    its query zooms: the pairs to verify, each once.

    ``embeddings``: n × zooms × d (the signatures' ``embedding`` field; zoom 0 is 1.0, the one
    searched), or a function giving zoom ``z``'s embeddings of the rows in a slice (float16 kept
    as such): the base (zoom 0) is held whole, the other zooms are read :data:`QUERY_BLOCK` rows
    at a time; ``groups`` an int per sample (samples of one group are never paired). A long
    search shows a ``search`` progress line (queries: one per sample and zoom) unless ``quiet``.
    """
    n = len(groups)
    if n < 2 or k < 1:
        empty = np.zeros(0, dtype=np.int64)
        return Candidates(empty, empty, np.zeros(0, dtype=np.float32))
    with stage_progress("search", n * len(QUERY_ZOOMS), unit="queries", quiet=quiet) as progress:
        return _candidate_pairs(embeddings, groups, k, progress)


def _candidate_pairs(embeddings: np.ndarray | Callable[[int, slice], np.ndarray], groups: np.ndarray, k: int,
                     progress: Progress) -> Candidates:
    """:func:`candidate_pairs` of at least two samples, counting its queries in ``progress``."""
    n = len(groups)
    rows_of = embeddings if callable(embeddings) else (lambda z, rows: embeddings[rows, z])
    base = rows_of(0, slice(0, n))
    index = InvertedFile.build(base, groups) if n > EXACT_LIMIT else None
    key = np.zeros(0, dtype=np.int64)
    best = np.zeros(0, dtype=np.float32)
    for z in range(len(QUERY_ZOOMS)):
        # at its own size a sample looks for its k nearest; zoomed, for the few a crop would make nearest
        wanted = k if z == 0 else max(2, k // 8)
        keys, similarities = [key], [best]
        for start in range(0, n, QUERY_BLOCK):
            rows = slice(start, min(n, start + QUERY_BLOCK))
            queries = base[rows] if z == 0 else rows_of(z, rows)
            found, score = nearest(base, queries, groups[rows], groups, wanted, index, progress)
            keep = found >= 0
            a = np.nonzero(keep)[0] + start  # the query of each kept neighbour (row-major, as found[keep])
            b = found[keep].astype(np.int64)
            keys.append((np.minimum(a, b) << 32) | np.maximum(a, b))  # one int64 per pair, in (i, j) order
            similarities.append(score[keep])
            del found, score, keep, a, b, queries
        # merged zoom by zoom: each pair once, with its best similarity
        key, best = _best_per_pair(np.concatenate(keys), np.concatenate(similarities))
        del keys, similarities
    return Candidates((key >> 32).astype(np.int32), (key & 0xFFFFFFFF).astype(np.int32), best.astype(np.float32))


# -- verification -----------------------------------------------------------------------------

#: The verification's default decision (``split.near_duplicates.min_score``): a pair is a copy when
#: its ``intensity`` (η²) reaches it and its ``structure`` reaches :data:`MIN_STRUCTURE` (see
#: :class:`Evidence`). Set from measurements on similar-anatomy phantoms with planted copies
#: (benchmarks/RESULTS.md, "Near copies").
MIN_SCORE: float = schema_defaults("job")["split.near_duplicates.min_score"]
#: Aligned fine structure a copy always keeps: a gate against images that share only a flat background.
MIN_STRUCTURE = 0.6
_COARSE_ZOOMS = (0.94, 1.0, 1.06)
_FINE_STEP = 0.03
_BINS = 128


@dataclass(frozen=True)
class Evidence:
    """How well two thumbnails agree at their best alignment.

    ``structure``: normalised correlation of their fine structure (image minus its σ=1 blur),
    maximised over the zoom and shift of the second; ``detail``: the same at σ=0.6 (noise and
    texture: what two different patients never share) at that alignment; ``intensity``: the
    correlation ratio η² (the smaller of both directions), the share of one thumbnail's variance
    a function of the other's intensities explains, high for a copy shown through another
    window; ``zoom``, ``dy``, ``dx``: the alignment (second thumbnail's zoom and shift, pixels).
    """

    structure: float
    detail: float
    intensity: float
    zoom: float
    dy: int
    dx: int

    @property
    def score(self) -> float:
        """The decision value: ``intensity`` where ``structure`` passes :data:`MIN_STRUCTURE`, else 0."""
        return self.intensity if self.structure >= MIN_STRUCTURE else 0.0


def _fine(grey: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    return grey - cv2.GaussianBlur(grey, (0, 0), sigma)


def _correlation_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """η²(A|B): the share of A's variance explained by a function of B. B's values (0-255) are
    grouped into equal-count bins by their cumulative histogram; equal values share a bin."""
    return _ratio(_Explained.of(a), _Bins.of(b))


class _Explained:
    """A's side of :func:`_correlation_ratio`: its values as float64, their mean and spread."""

    __slots__ = ("values", "mean", "spread")

    def __init__(self, values: np.ndarray, mean: float, spread: float) -> None:
        self.values, self.mean, self.spread = values, mean, spread

    @classmethod
    def of(cls, a: np.ndarray) -> _Explained:
        flat = a.ravel()
        values = flat.astype(np.float64)
        mean = values.mean()
        # kept as float32 (the thumbnail's own values, exactly): bincount weighs in float64 anyway
        return cls(flat.astype(np.float32, copy=False), mean, float(((values - mean) ** 2).sum()))


class _Bins:
    """B's side of :func:`_correlation_ratio`: each pixel's equal-count bin, and the bins' sizes."""

    __slots__ = ("bin_of", "counts")

    def __init__(self, bin_of: np.ndarray, counts: np.ndarray) -> None:
        self.bin_of, self.counts = bin_of, counts

    @classmethod
    def of(cls, b: np.ndarray) -> _Bins:
        levels = np.clip(np.rint(b.ravel()), 0, 255).astype(np.intp)
        histogram = np.bincount(levels, minlength=256)
        before = np.cumsum(histogram) - histogram
        # a level's bin: where both an equal-count bin (of _BINS // 2) and an equal-width one (of
        # _BINS // 2, 4 levels) agree. Equal counts alone merged the sparse bright levels of a star
        # field or a dark CT slice into a few bins, and such a thumbnail scored 0.88-0.95 against
        # itself, below min_score: no copy of it could ever be linked. Both parts rise with the
        # level, so their pairs number at most _BINS - 1 and no bin spans more than 4 levels.
        half = _BINS // 2
        key = (before * half // len(levels)) * half + np.arange(256) * half // 256
        bin_of_level = np.concatenate(([0], np.cumsum(np.diff(key) != 0)))
        bin_of = bin_of_level[levels].astype(np.uint8)  # _BINS <= 256: one byte a pixel
        return cls(bin_of, np.bincount(bin_of, minlength=_BINS))


def _ratio(a: _Explained, b: _Bins) -> float:
    if a.spread == 0.0:
        return 0.0
    means = np.bincount(b.bin_of, weights=a.values, minlength=_BINS) / np.maximum(b.counts, 1)
    return float(((means[b.bin_of] - a.mean) ** 2).sum() / a.spread)


def _ncc(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    denominator = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0


class Prepared:
    """A thumbnail's views the verification reuses across pairs: float, fine structure, zoomed fines."""

    __slots__ = ("grey", "template", "flat", "_zoomed", "_inner")

    def __init__(self, thumb: np.ndarray) -> None:
        self.grey = thumb.astype(np.float32)
        m = VERIFY_SHIFT
        self.template = _fine(self.grey)[m:-m, m:-m]
        self.flat = float(self.template.std()) == 0.0
        self._zoomed: dict[float, np.ndarray] = {}
        self._inner: tuple[_Explained, _Bins] | None = None

    def grey_at(self, zoom: float) -> np.ndarray:
        """The thumbnail magnified by ``zoom`` (:func:`zoomed`); not kept, to keep a task's memory small."""
        return self.grey if zoom == 1.0 else zoomed(self.grey, zoom)

    def inner(self) -> tuple[_Explained, _Bins]:
        """Both sides of :func:`_correlation_ratio` for the unmoved thumbnail's inner part."""
        if self._inner is None:
            m = VERIFY_SHIFT
            part = self.grey[m:-m, m:-m]
            self._inner = (_Explained.of(part), _Bins.of(part))
        return self._inner

    def fine_at(self, zoom: float) -> np.ndarray:
        if zoom not in self._zoomed:
            self._zoomed[zoom] = _fine(self.grey_at(zoom))
        return self._zoomed[zoom]


def _vertex(left: float, centre: float, right: float) -> tuple[float, float]:
    """The top of the parabola through three equally spaced scores: (offset in -0.5..0.5, how
    much higher than ``centre`` it is)."""
    curvature = left - 2.0 * centre + right
    if curvature >= 0:
        return 0.0, 0.0
    offset = float(min(max(0.5 * (left - right) / curvature, -0.5), 0.5))  # np.clip's value, without its cost
    return offset, float(-0.25 * (left - right) * offset)


#: The version of :func:`verify`'s answer: part of every key of the verified-pair cache
#: (:mod:`packer.pipeline.paircache`), which reuses a pair's evidence from the last build when its
#: two thumbnails are unchanged. Raise it whenever :func:`verify`, :class:`Prepared`, :data:`THUMB`,
#: the first stage (:mod:`packer.pipeline.nearscreen`) or the constants they read change what a
#: pair's :class:`Evidence` is. 2: a task may turn a pair away by the first stage (:data:`SCREENED`).
#: 3: intensity bins are at most 4 levels wide (:class:`_Bins`). 4: a ``resize: fit`` sample's
#: thumbnail is its content box's, not its letterbox's (:func:`packed_signature`): the pairs a
#: fit build verified compared padding, and are verified again.
VERIFY_VERSION = 4
#: A zoom other than 1 must match this much better to be chosen: most copies are not magnified.
_ZOOM_PREFERENCE = 0.005


def _warped(grey: np.ndarray, zoom: float, dy: float, dx: float) -> np.ndarray:
    """``grey`` magnified by ``zoom`` about its centre and moved by (-dy, -dx): the view of a
    thumbnail that lines up with the other one when the match said it sits at (dy, dx)."""
    centre = (THUMB - 1) / 2.0
    matrix = cv2.getRotationMatrix2D((centre, centre), 0.0, zoom)
    matrix[0, 2] -= dx
    matrix[1, 2] -= dy
    return cv2.warpAffine(grey, matrix, (THUMB, THUMB), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def verify(a: np.ndarray | Prepared, b: np.ndarray | Prepared, *, floor: float = 0.0) -> Evidence:
    """Align thumbnail ``b`` to ``a`` (zooms 0.91-1.09, shifts up to :data:`VERIFY_SHIFT` pixels,
    to a fraction of a pixel) by their fine structure, and measure their agreement there
    (:class:`Evidence`).

    ``floor``: a pair whose ``intensity`` at the best whole-pixel alignment of the first zooms
    tried is below it is not refined (its evidence is that first look): refinement raised a
    planted copy's intensity by at most 0.085 (a crop: zoom and a fraction of a pixel), so a
    floor :data:`REFINE_MARGIN` below the decision changes no decision and skips most of the
    work for look-alikes. The answer is a pure function of the two thumbnails and ``floor``
    (the pair cache relies on it: change it, raise :data:`VERIFY_VERSION`)."""
    first = a if isinstance(a, Prepared) else Prepared(a)
    second = b if isinstance(b, Prepared) else Prepared(b)
    m = VERIFY_SHIFT
    if first.flat:
        return Evidence(0.0, 0.0, 0.0, 1.0, 0, 0)

    def at(zoom: float) -> tuple[float, float, float]:
        """(peak match, interpolated to a fraction of a pixel, less the zoom's handicap; dy; dx)."""
        scores = cv2.matchTemplate(second.fine_at(zoom), first.template, cv2.TM_CCOEFF_NORMED)
        _, value, _, (x, y) = cv2.minMaxLoc(scores)
        fy, gy = _vertex(scores[y - 1, x], value, scores[y + 1, x]) if 0 < y < scores.shape[0] - 1 else (0.0, 0.0)
        fx, gx = _vertex(scores[y, x - 1], value, scores[y, x + 1]) if 0 < x < scores.shape[1] - 1 else (0.0, 0.0)
        handicap = 0.0 if zoom == 1.0 else _ZOOM_PREFERENCE
        return float(value) + gy + gx - handicap, y - m + fy, x - m + fx

    tried = {zoom: at(zoom) for zoom in _COARSE_ZOOMS}
    coarse = max(tried, key=lambda zoom: (tried[zoom][0], -abs(zoom - 1.0)))
    if floor > 0.0:
        value, y, x = tried[coarse]
        y, x = int(round(y)) + m, int(round(x)) + m
        aligned = second.grey_at(coarse)[y:y + THUMB - 2 * m, x:x + THUMB - 2 * m]
        explained, bins = first.inner()
        quick = min(_ratio(explained, _Bins.of(aligned)), _ratio(_Explained.of(aligned), bins))
        if quick < floor:
            return Evidence(round(value, 4), 0.0, round(quick, 4), coarse, y - m, x - m)
    for zoom in (round(coarse - _FINE_STEP, 2), round(coarse + _FINE_STEP, 2)):
        if zoom not in tried and VERIFY_ZOOMS[0] - 1e-9 <= zoom <= VERIFY_ZOOMS[-1] + 1e-9:
            tried[zoom] = at(zoom)
    zoom = max(tried, key=lambda z: (tried[z][0], -abs(z - 1.0)))
    _, dy, dx = tried[zoom]
    # each thumbnail moves half the way, so both are resampled alike: a copy shifted by a
    # fraction of a pixel is then compared blur for blur, not sharp against blurred
    here = _warped(first.grey, 1.0, -dy / 2.0, -dx / 2.0) if dy or dx else first.grey
    there = _warped(second.grey, zoom, dy / 2.0, dx / 2.0)
    inner, aligned = here[m:-m, m:-m], there[m:-m, m:-m]
    structure = _ncc(_fine(here)[m:-m, m:-m], _fine(there)[m:-m, m:-m])
    detail = _ncc(_fine(here, 0.6)[m:-m, m:-m], _fine(there, 0.6)[m:-m, m:-m])
    intensity = min(_correlation_ratio(inner, aligned), _correlation_ratio(aligned, inner))
    return Evidence(round(structure, 4), round(detail, 4), round(intensity, 4), zoom, int(round(dy)), int(round(dx)))


# -- verification tasks and links -------------------------------------------------------------

#: The evidence of a pair the first stage turned away (:mod:`packer.pipeline.nearscreen`): never
#: aligned (zoom 0, which no verification gives), score 0. Which pairs get it depends on their two
#: thumbnails alone; :func:`find_near_links` verifies in full every such pair the rival test reads.
SCREENED = Evidence(0.0, 0.0, 0.0, 0.0, 0, 0)

#: Candidate pairs per verification task (a task reads the thumbnails it needs from the cache).
PAIRS_PER_TASK = 4096


#: How far below the decision a first look may be before refinement is skipped (:func:`verify`).
REFINE_MARGIN = 0.10


@dataclass(frozen=True)
class VerifyTask:
    """Pairs to verify: pair ``p`` is row ``a_row[p]`` of ``files[a_file[p]]`` against row
    ``b_row[p]`` of ``files[b_file[p]]`` (signature files, :func:`read_signatures`);
    ``floor``: see :func:`verify`; ``screen``: the first stage (:mod:`packer.pipeline.nearscreen`)
    runs first, and a pair it turns away is not verified (its evidence is :data:`SCREENED`)."""

    index: int
    files: tuple[str, ...]
    a_file: np.ndarray
    a_row: np.ndarray
    b_file: np.ndarray
    b_row: np.ndarray
    floor: float = 0.0
    screen: bool = False


class VerifyTasks(LazySequence[VerifyTask]):
    """The verification tasks of pairs (``i[p]``, ``j[p]``), :data:`PAIRS_PER_TASK` pairs a task
    in pair order, each made when it is read (:meth:`Executor.map_unordered
    <packer.pipeline.cluster.Executor.map_unordered>` reads a task when it submits it): the
    file and row arrays of every task at once were 32 bytes a pair on the client, about 150 MB
    for the 4.7M candidates of 300,000 samples. A task names only the signature files its pairs
    read (``files`` of sample ``s``'s signature: ``all_files[file_of[s]]``, row ``row_of[s]``),
    so what is sent with it is bounded by its pairs, not by the dataset's files."""

    def __init__(self, all_files: Sequence[str], file_of: np.ndarray, row_of: np.ndarray, i: np.ndarray,
                 j: np.ndarray, *, floor: float, screen: bool) -> None:
        super().__init__(-(-len(i) // PAIRS_PER_TASK), self._task)
        self._files, self._file_of, self._row_of = all_files, file_of, row_of
        self._i, self._j, self._floor, self._screen = i, j, floor, screen
        self._per_task = PAIRS_PER_TASK

    @property
    def pairs(self) -> int:
        """The pairs of all tasks."""
        return len(self._i)

    def _task(self, t: int) -> VerifyTask:
        part = slice(t * self._per_task, (t + 1) * self._per_task)
        a_file, b_file = self._file_of[self._i[part]], self._file_of[self._j[part]]
        used, local = np.unique(np.concatenate([a_file, b_file]), return_inverse=True)
        local = local.ravel().astype(np.int32)
        return VerifyTask(index=t, files=tuple(self._files[int(f)] for f in used), a_file=local[:len(a_file)],
                          a_row=self._row_of[self._i[part]], b_file=local[len(a_file):],
                          b_row=self._row_of[self._j[part]], floor=self._floor, screen=self._screen)


def pairs_in(tasks: Sequence[VerifyTask]) -> int:
    """The pairs of ``tasks``: a task list that makes its tasks when read (:class:`VerifyTasks`)
    says how many it holds as ``pairs``, so they are not made to be counted."""
    counted = getattr(tasks, "pairs", None)
    return int(counted) if counted is not None else sum(len(t.a_file) for t in tasks)


@dataclass(frozen=True)
class EvidenceArrays:
    """:class:`Evidence` of many pairs, one array per field (pair order)."""

    structure: np.ndarray
    detail: np.ndarray
    intensity: np.ndarray
    zoom: np.ndarray
    dy: np.ndarray
    dx: np.ndarray

    @classmethod
    def of(cls, evidence: Sequence[Evidence]) -> EvidenceArrays:
        def column(name: str, dtype: str) -> np.ndarray:
            return np.array([getattr(e, name) for e in evidence], dtype=dtype)

        return cls(column("structure", "f4"), column("detail", "f4"), column("intensity", "f4"),
                   column("zoom", "f4"), column("dy", "i1"), column("dx", "i1"))

    @classmethod
    def concat(cls, parts: Sequence[EvidenceArrays]) -> EvidenceArrays:
        fields = ("structure", "detail", "intensity", "zoom", "dy", "dx")
        if not parts:
            return cls.of([])
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))

    def take(self, keep: np.ndarray) -> EvidenceArrays:
        return EvidenceArrays(self.structure[keep], self.detail[keep], self.intensity[keep], self.zoom[keep],
                              self.dy[keep], self.dx[keep])

    def replaced(self, where: np.ndarray, other: EvidenceArrays) -> EvidenceArrays:
        """This evidence with pairs ``where`` (indices) replaced by ``other``'s, in that order."""
        def column(name: str) -> np.ndarray:
            out = getattr(self, name).copy()
            out[where] = getattr(other, name)
            return out

        return EvidenceArrays(*(column(name) for name in ("structure", "detail", "intensity", "zoom", "dy", "dx")))

    @property
    def screened(self) -> np.ndarray:
        """Which pairs the first stage turned away (:data:`SCREENED`: zoom 0)."""
        return np.asarray(self.zoom == 0.0)

    @property
    def score(self) -> np.ndarray:
        """:attr:`Evidence.score` of every pair (float64)."""
        return np.where(self.structure >= MIN_STRUCTURE, self.intensity.astype(np.float64), 0.0)

    def __len__(self) -> int:
        return len(self.structure)


#: Prepared thumbnails a verification task keeps (least recently used dropped first): about
#: 100 kB each, so at most ~40 MB whatever the dataset's size (a task of 4,096 pairs touched
#: 1,267 distinct thumbnails on a 2,000-sample tree, and can touch up to 8,192). Measured on the
#: peer harness's one-family phantoms (4,900 samples, 2 workers): 1,024 kept the workers at
#: 264-277 MB (the pixel pass alone peaks near 155-200 MB) and 384 at 188-204 MB, for 8% more
#: verification time (22.0 -> 23.7 s); the evidence is the same either way.
PREPARED_LIMIT = 384


class _ThumbReader:
    """Thumbnails read one by one from signature files with positional reads: a task holds the
    thumbnails it prepared, not the pages of every signature row it touched (memory-mapped, a
    task of 4,096 pairs kept up to 8,192 rows resident, about 45 MB). The files' headers are
    checked as :func:`read_signatures` checks them, once per file (a task that reads from more
    files than it keeps open opens them again, and parsing a header costs as much as 50 reads);
    at most ``OPEN_FILES`` stay open."""

    OPEN_FILES = 64
    _THUMB_AT = SIGNATURE_DTYPE.fields["thumb"][1] if SIGNATURE_DTYPE.fields else 0  # byte offset in a row

    def __init__(self, files: Sequence[str]) -> None:
        self.files = files
        self._open: OrderedDict[int, tuple[int, int, int]] = OrderedDict()  # file -> (fd, data offset, rows)
        self._layout: dict[int, tuple[int, int]] = {}  # file -> (data offset, rows), checked

    def _opened(self, file: int) -> tuple[int, int, int]:
        found = self._open.get(file)
        if found is not None:
            self._open.move_to_end(file)
            return found
        start, rows = self._layout.get(file) or self._checked(file)
        found = self._open[file] = (os.open(self.files[file], os.O_RDONLY), start, rows)
        if len(self._open) > self.OPEN_FILES:
            os.close(self._open.popitem(last=False)[1][0])
        return found

    #: The npy 1.0 header :func:`write_signatures` writes (numpy's own layout: keys sorted, the dict's
    #: text padded with spaces to a multiple of 64 bytes), read without parsing the dict as Python.
    _HEADER = re.compile(rb"\{'descr': " + re.escape(repr(np.lib.format.dtype_to_descr(SIGNATURE_DTYPE)).encode())
                         + rb", 'fortran_order': False, 'shape': \((\d+),\), \} *\n")

    def _checked(self, file: int) -> tuple[int, int]:
        """Signature file ``file``'s data offset and rows, from its checked header (a header that is
        not exactly the one :func:`write_signatures` writes is parsed and checked in full)."""
        path = self.files[file]
        with open(path, "rb") as fh:
            head = fh.read(10)
            if head[:8] == b"\x93NUMPY\x01\x00":
                size = int.from_bytes(head[8:10], "little")
                found = self._HEADER.fullmatch(fh.read(size))
                if found is not None:
                    self._layout[file] = (10 + size, int(found.group(1)))
                    return self._layout[file]
            fh.seek(0)
            version = np.lib.format.read_magic(fh)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"{path}: not a packer signature file (npy format {version})")
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(fh)
            start = fh.tell()
        if dtype != SIGNATURE_DTYPE or fortran or len(shape) != 1:
            raise ValueError(f"{path}: not a packer signature file (dtype {dtype})")
        self._layout[file] = (start, int(shape[0]))
        return self._layout[file]

    def thumb(self, file: int, row: int) -> np.ndarray:
        """Row ``row``'s 64×64 uint8 thumbnail in signature file ``file``. Raises ValueError when
        the file does not hold that row."""
        fd, start, rows = self._opened(file)
        if not 0 <= row < rows:
            raise ValueError(f"{self.files[file]}: no signature row {row} (the file holds {rows})")
        size = THUMB * THUMB
        data = os.pread(fd, size, start + row * SIGNATURE_DTYPE.itemsize + self._THUMB_AT)
        if len(data) != size:
            raise ValueError(f"{self.files[file]}: signature row {row} is cut short")
        return np.frombuffer(data, dtype=np.uint8).reshape(THUMB, THUMB)

    def close(self) -> None:
        for fd, _, _ in self._open.values():
            os.close(fd)
        self._open.clear()


def verify_task(task: VerifyTask) -> EvidenceArrays:
    """Dask task: :func:`verify` every pair of ``task``; a thumbnail is prepared once while it
    stays among the :data:`PREPARED_LIMIT` most recently used (the evidence does not depend on it)."""
    thumbs = _ThumbReader(task.files)
    try:
        return _verify_pairs(task, thumbs)
    finally:
        thumbs.close()


def _verify_pairs(task: VerifyTask, thumbs: _ThumbReader) -> EvidenceArrays:
    prepared: OrderedDict[tuple[int, int], Prepared] = OrderedDict()

    def get(file: int, row: int) -> Prepared:
        key = (file, row)
        found = prepared.get(key)
        if found is None:
            found = prepared[key] = Prepared(thumbs.thumb(file, row))
            if len(prepared) > PREPARED_LIMIT:
                prepared.popitem(last=False)
        else:
            prepared.move_to_end(key)
        return found

    wanted = _screened_in(task, thumbs) if task.screen else np.ones(len(task.a_file), dtype=bool)
    return EvidenceArrays.of([verify(get(int(fa), int(ra)), get(int(fb), int(rb)), floor=task.floor) if keep
                              else SCREENED
                              for fa, ra, fb, rb, keep in zip(task.a_file, task.a_row, task.b_file, task.b_row,
                                                              wanted.tolist(), strict=True)])


def _screened_in(task: VerifyTask, thumbs: _ThumbReader) -> np.ndarray:
    """Which of ``task``'s pairs the first stage lets through (bool per pair), screened
    :data:`~packer.pipeline.nearscreen.BLOCK` pairs at a time, each distinct thumbnail of a block read once."""
    wanted = np.ones(len(task.a_file), dtype=bool)
    for lo in range(0, len(wanted), SCREEN_BLOCK):
        block = slice(lo, lo + SCREEN_BLOCK)
        sides = []
        for files, rows in ((task.a_file, task.a_row), (task.b_file, task.b_row)):
            key = (np.asarray(files[block], dtype=np.int64) << 32) | np.asarray(rows[block], dtype=np.int64)
            distinct, at = np.unique(key, return_inverse=True)
            stack = np.stack([thumbs.thumb(int(k >> 32), int(k & 0xFFFFFFFF)) for k in distinct.tolist()])
            sides.append((stack, at.ravel()))
        (firsts, first), (seconds, second) = sides
        wanted[block] = let_through(firsts, seconds, first, second)
    return wanted


@dataclass(frozen=True)
class NearLinks:
    """Verified near copies between samples ``i[k] < j[k]`` (indices into the sample list), the
    embedding cosine that made them candidates, and the verification's evidence. ``candidates``
    counts the pairs verified."""

    i: np.ndarray
    j: np.ndarray
    similarity: np.ndarray
    evidence: EvidenceArrays
    candidates: int = 0
    #: Per link, the best rival's score (:func:`rival_test`); 0 where none was measured.
    rival: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.i)

    @classmethod
    def empty(cls) -> NearLinks:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, np.zeros(0, dtype=np.float32), EvidenceArrays.of([]))

    def without(self, rows: np.ndarray) -> NearLinks:
        """These links less those from or to a row where ``rows`` (a bool per sample) is True."""
        if not len(self) or not rows.any():
            return self
        keep = np.flatnonzero(~(rows[self.i] | rows[self.j]))
        if len(keep) == len(self):
            return self
        return NearLinks(self.i[keep], self.j[keep], self.similarity[keep], self.evidence.take(keep),
                         candidates=self.candidates, rival=None if self.rival is None else self.rival[keep])

    def describe(self, k: int) -> dict[str, float | list[int]]:
        """Link ``k``'s evidence as JSON numbers: the candidate similarity, the verification
        (score, structure, detail, intensity at zoom and shift) and the rival test (the best
        rival's score, and the link's residual as a share of the rival's)."""
        e = self.evidence
        rival = float(self.rival[k]) if self.rival is not None else 0.0
        score = float(e.score[k])
        return {"similarity": round(float(self.similarity[k]), 4), "score": score,
                "structure": float(e.structure[k]), "detail": float(e.detail[k]),
                "intensity": float(e.intensity[k]), "zoom": float(e.zoom[k]), "shift": [int(e.dy[k]), int(e.dx[k])],
                "rival": round(rival, 4), "residual_ratio": round(residual_ratio(score, rival), 4)}


def corroborated(links: NearLinks, files: np.ndarray) -> NearLinks:
    """``links`` less those that stand alone between two files that each give several samples.

    ``files[s]``: a code for the raw file sample ``s`` was read from. A tile, frame, page or
    volume slice is one of several samples of its file, and two such files are copies of one
    another when their samples are: a copied tiled photo links tile for tile. One link alone
    between two such files is a look-alike (a small tile holding one edge between two flat
    regions matches another such tile at some shift and zoom, whatever its intensities), not a
    copy, and is dropped. Links from or to a file of one sample are kept as they are."""
    if len(links) == 0:
        return links
    per_file = np.bincount(files)
    a, b = files[links.i], files[links.j]
    several = (per_file[a] > 1) & (per_file[b] > 1)
    if not several.any():
        return links
    pair = np.minimum(a, b).astype(np.int64) * (int(files.max()) + 1) + np.maximum(a, b)
    _, inverse, counts = np.unique(pair, return_inverse=True, return_counts=True)
    keep = np.flatnonzero(~several | (counts[inverse] > 1))
    if len(keep) == len(links):
        return links
    return NearLinks(links.i[keep], links.j[keep], links.similarity[keep], links.evidence.take(keep),
                     candidates=links.candidates, rival=None if links.rival is None else links.rival[keep])

def load_embeddings(files: Sequence[str], file_of: np.ndarray, row_of: np.ndarray, zoom: int) -> np.ndarray:
    """Zoom ``zoom``'s embeddings (n × d, float16) of samples whose signatures are row ``row_of[s]``
    of ``files[file_of[s]]``, read file by file."""
    out = np.zeros((len(file_of), EMBED_DIM), dtype=np.float16)
    order = np.argsort(file_of, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(file_of[order]) != 0, True])
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        samples = order[lo:hi]
        out[samples] = read_signatures(Path(files[int(file_of[samples[0]])]))["embedding"][row_of[samples], zoom]
    return out


def find_near_links(files: Sequence[str], file_of: np.ndarray, row_of: np.ndarray, groups: np.ndarray, *,
                    neighbors: int, min_score: float, run: Callable[[Sequence[VerifyTask]], Iterable[
                        tuple[VerifyTask, EvidenceArrays]]], max_ratio: float | None = None,
                    search: Callable[[Callable[[int, slice], np.ndarray], np.ndarray, int], Candidates] | None = None,
                    quiet: bool = False) -> NearLinks:
    """Candidates (:func:`candidate_pairs`) among samples of different ``groups``, verified by
    ``run`` (which maps :func:`verify_task` over tasks, e.g. on a dask cluster) after the first
    stage (:mod:`packer.pipeline.nearscreen`), kept where their score reaches ``min_score`` (and,
    with ``max_ratio``, they pass :func:`rival_test`, whose pairs are verified in full:
    :func:`settle_rivals`). Sample ``s``'s signature is row ``row_of[s]`` of
    ``files[file_of[s]]``. ``search``: the candidate search, :func:`candidate_pairs` unless given
    (one that reuses the last build's lists must give the same pairs). The result does not depend
    on how tasks are run or ordered. ``quiet``: :func:`candidate_pairs` shows no progress line (a
    ``search`` given shows its own, or none)."""
    if len(file_of) < 2 or neighbors < 1:
        return NearLinks.empty()

    def searched(embeddings: Callable[[int, slice], np.ndarray], groups: np.ndarray, k: int) -> Candidates:
        return candidate_pairs(embeddings, groups, k, quiet=quiet)

    candidates = (search or searched)(
        lambda zoom, rows: load_embeddings(files, file_of[rows], row_of[rows], zoom), groups, neighbors)
    floor = max(0.0, min_score - REFINE_MARGIN)

    def verified(i: np.ndarray, j: np.ndarray, screen: bool = False) -> EvidenceArrays:
        """The evidence of pairs (``i[p]``, ``j[p]``), in that order, verified by ``run`` in tasks
        (after the first stage, with ``screen``)."""
        tasks = VerifyTasks(files, file_of, row_of, i, j, floor=floor, screen=screen)
        parts = dict((task.index, result) for task, result in run(tasks))
        return EvidenceArrays.concat([parts[t] for t in range(len(tasks))])

    evidence = verified(candidates.i, candidates.j, screen=True)
    if max_ratio is not None:
        evidence = settle_rivals(candidates, evidence, min_score, verified)
    score = evidence.score
    passed = np.flatnonzero(score >= min_score)
    rival = rival_test(candidates, score, groups, passed, min_score=min_score, max_ratio=max_ratio,
                       verify_more=lambda i, j: verified(i, j).score)
    kept = residual_ratio(score[passed], rival) <= max_ratio if max_ratio is not None else np.ones(len(passed), bool)
    keep = passed[kept]
    return NearLinks(candidates.i[keep], candidates.j[keep], candidates.similarity[keep], evidence.take(keep),
                     candidates=len(candidates), rival=rival[kept].astype(np.float32))


def settle_rivals(candidates: Candidates, evidence: EvidenceArrays, min_score: float,
                  verify_full: Callable[[np.ndarray, np.ndarray], EvidenceArrays]) -> EvidenceArrays:
    """``evidence`` of ``candidates`` with every pair the first stage turned away
    (:attr:`EvidenceArrays.screened`) that shares a sample with a passing pair (score ≥
    ``min_score``) verified in full by ``verify_full(i, j)``, until no such pair is left.

    :func:`rival_test` reads the scores of every candidate of a passing pair's two samples (the
    rival is the best of them, and its score is in ``leakage.json``), so those must be the full
    verification's; the others' scores are read by nothing. With a first stage that turns away
    no pair the full test passes, the passing pairs, their rivals and so the links are those of
    verifying every candidate in full."""
    while True:
        passed = evidence.score >= min_score
        ends = np.unique(np.concatenate([candidates.i[passed], candidates.j[passed]]))
        redo = np.flatnonzero(evidence.screened & (np.isin(candidates.i, ends) | np.isin(candidates.j, ends)))
        if len(redo) == 0:
            return evidence
        evidence = evidence.replaced(redo, verify_full(candidates.i[redo], candidates.j[redo]))


def residual_ratio(score: float | np.ndarray, rival: float | np.ndarray) -> Any:
    """``(1 - score) / (1 - rival)``: how much of the best rival's disagreement a link keeps (0 for
    identical images; 1 when the rival agrees as well as the partner does)."""
    return (1.0 - np.asarray(score, dtype=np.float64)) / np.maximum(1e-9, 1.0 - np.asarray(rival, dtype=np.float64))


def rival_test(candidates: Candidates, score: np.ndarray, groups: np.ndarray, passed: np.ndarray, *,
               min_score: float, max_ratio: float | None,
               verify_more: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """The best rival's score for each passed candidate pair ``passed[k]`` = (a, b): the highest
    score between ``a`` and a sample ``p`` of a third entity (not ``a``'s, not ``b``'s), or between
    ``b`` and such a ``p``, where ``p`` is not itself a copy of the other side (``p``–``b``, resp.
    ``p``–``a``, verified at ``min_score`` or above and standing out, by ``max_ratio``, from the
    best candidate of either of the two among every entity but the three: a family of look-alikes
    of one template does not stand out, and its members stay each other's rivals). 0 where there
    is none.

    A copy stands out from everything else its sample resembles; a look-alike among look-alikes
    does not. A link is kept when its residual ``1 - score`` is at most ``max_ratio`` of its best
    rival's (:func:`residual_ratio`): the ratio test of feature matching. A rival that is a copy
    of the other side (one image exported twice, under two more entities) is no rival; where
    that pair was not a candidate it is verified here (``verify_more(p, q)`` → scores), so the
    answer never depends on the candidate search having paired them. ``max_ratio`` None:
    nothing is searched, every rival is 0. A copy check that would decide a link, verified one way
    round below ``min_score``, is verified the other way round too and counts at the better score:
    which sample is verified first follows the sample keys (the source's name, the PHI key), and
    the score is not symmetric, so a copy of one image exported twice was caught under one source
    name and missed under another."""
    rival = np.zeros(len(passed), dtype=np.float64)
    if max_ratio is None or len(passed) == 0:
        return rival
    cap = max_ratio
    n = len(groups)
    pair_key = (candidates.i.astype(np.int64) << 32) | candidates.j.astype(np.int64)  # ascending
    # every candidate from both sides, sorted: made while the client holds the most of a build
    # (its peak at 300k samples fell here), so sample indices stay int32 as the candidates hold them
    a = np.concatenate([candidates.i, candidates.j]).astype(np.int32, copy=False)
    b = np.concatenate([candidates.j, candidates.i]).astype(np.int32, copy=False)
    s = np.concatenate([score, score])
    order = np.lexsort((-s, a))                    # each sample's candidates, the best first
    a, b, s = a[order], b[order], s[order]
    del order
    starts = np.searchsorted(a, np.arange(n + 1))
    extra: dict[int, float] = {}                   # rivals' pairs with the other side, verified here
    # the same pairs verified the other way round (the larger index's thumbnail first): a score
    # is not symmetric (one thumbnail is the template), and which sample has the smaller index
    # follows the sample keys, i.e. the source's name and the PHI key; a copy check that decides a
    # link takes the better of both orders, so no name decides whether a copy is caught
    reverse: dict[int, float] = {}

    def scored(p: int, q: int) -> float | None:
        key = (min(p, q) << 32) | max(p, q)
        at = int(np.searchsorted(pair_key, key))
        forward = float(score[at]) if at < len(pair_key) and pair_key[at] == key else extra.get(key)
        if forward is None or key not in reverse:
            return forward
        return max(forward, reverse[key])

    def copies_a_mate(p: int, sp: float, x: int, other: int, decides: bool,
                      turned: list[tuple[int, int]] | None) -> bool:
        """Whether ``p`` (of a third entity; ``sp``: its score with ``x``) is a copy of another
        sample of the pair's own two entities (a mate of ``x`` or of ``other``) that it resembles
        more than ``x``, so that its resemblance to ``x`` is the mate's: one image of the patient
        exported again under a third entity is no independent look-alike, as the mate itself is
        none. A copy stands out: its score with the mate is at least ``min_score`` and keeps at
        most ``max_ratio`` of the disagreement of ``p``'s best candidate among every other entity
        (where there is none, as among three phantoms of one design, nothing shows it stands out,
        and it stays a rival). A look-alike among look-alikes has such a candidate and stays a
        rival, and so does a copy of ``x`` itself. Where the mate's check would decide the link,
        verified one way round only, it is verified the other way too (``turned``)."""
        own = (groups[x], groups[other], groups[p])
        mate, mate_score, outside = -1, -1.0, None
        for at in range(int(starts[p]), int(starts[p + 1])):  # the best first
            q = int(b[at])
            if groups[q] not in own:
                outside = float(s[at])
                break
        if outside is None:  # nothing of any other entity to stand out from: no evidence it is a copy
            return False
        for at in range(int(starts[p]), int(starts[p + 1])):
            q = int(b[at])
            if q in (x, other) or groups[q] == groups[p] or groups[q] not in own:
                continue
            got = scored(p, q)
            if got is not None and got > mate_score:
                mate, mate_score = q, got
        if mate < 0:
            return False
        stands_out = mate_score >= max(min_score, sp) and residual_ratio(mate_score, outside) <= cap
        if (not stands_out and decides and turned is not None
                and ((min(p, mate) << 32) | max(p, mate)) not in reverse):
            turned.append((p, mate))  # it would decide: verify the other order too
        return bool(stands_out)

    def outside_best(q: int, own: tuple[Any, ...]) -> float | None:
        """``q``'s best candidate score among samples of entities not in ``own``; None where it has none."""
        for at in range(int(starts[q]), int(starts[q + 1])):  # the best first
            if groups[int(b[at])] not in own:
                return float(s[at])
        return None

    def copies_the_other(p: int, x: int, other: int, copy_of_other: float | None) -> bool:
        """Whether ``p`` (of a third entity), scoring ``copy_of_other`` with ``other``, is a copy of
        the other side: their pair passes ``min_score`` and stands out, keeping at most ``max_ratio``
        of the disagreement of the best candidate of ``p`` or ``other`` among every entity but the
        three. Three exports of one image under three entities stand out from everything else; a
        family of look-alikes (one template rendered for many subjects) does not, as each member's
        best outside candidate is another member, so such a ``p`` stays a rival. Where neither has
        a candidate of another entity (three samples in all), nothing outside shows them to be a
        family, and a pair passing ``min_score`` counts as a copy."""
        if copy_of_other is None or copy_of_other < min_score:
            return False
        own = (groups[x], groups[other], groups[p])
        outside = [v for v in (outside_best(p, own), outside_best(other, own)) if v is not None]
        return not outside or bool(residual_ratio(copy_of_other, max(outside)) <= cap)

    def rivals(k: int, missing: list[tuple[int, int]] | None,
               turned: list[tuple[int, int]] | None = None) -> float:
        """Link ``passed[k]``'s best rival; with ``missing``, list instead the rivals' pairs with the
        other side that would decide it and were never verified, and with ``turned`` those verified
        in one order only whose forward score would make the rival decide it."""
        link = int(passed[k])
        x0, y0 = int(candidates.i[link]), int(candidates.j[link])
        # a rival scoring above this rejects the link: only such rivals need their copy check verified
        bound = 1.0 - (1.0 - float(score[link])) / max_ratio
        best = 0.0
        wanted: list[tuple[int, int]] = []
        for x, other in ((x0, y0), (y0, x0)):
            for at in range(int(starts[x]), int(starts[x + 1])):  # the best first
                p, sp = int(b[at]), float(s[at])
                if sp <= best:
                    break
                if p == other or groups[p] == groups[x] or groups[p] == groups[other]:
                    continue
                copy_of_other = scored(p, other)
                if copy_of_other is None and missing is not None:
                    if sp > bound:  # it would decide: verify it before deciding
                        wanted.append((p, other))
                    continue
                if (turned is not None and copy_of_other is not None and copy_of_other < min_score
                        and sp > bound and ((min(p, other) << 32) | max(p, other)) not in reverse):
                    turned.append((p, other))  # it would decide: verify the other order too
                if copies_the_other(p, x, other, copy_of_other):
                    continue  # the other side exported again: no rival (two exports of one image)
                if copies_a_mate(p, sp, x, other, sp > bound, turned):
                    continue  # a copy of the pair's own patient's other image: no rival, as that image is none
                # a look-alike of x that is no copy of the other side (or, never verified with it, one
                # that scores too low to decide: reported as the rival, it cannot reject the link)
                best = sp
                break
        if missing is not None and best <= bound:  # a known rival that rejects it already: nothing to verify
            missing.extend(wanted)
        return best

    missing: list[tuple[int, int]] = []
    for k in range(len(passed)):
        rivals(k, missing)
    if missing:
        unique = sorted({(min(p, q), max(p, q)) for p, q in missing})
        got = verify_more(np.array([p for p, _ in unique]), np.array([q for _, q in unique]))
        extra.update({(p << 32) | q: float(v) for (p, q), v in zip(unique, got.tolist(), strict=True)})
    turned: list[tuple[int, int]] = []
    for k in range(len(passed)):
        rivals(k, None, turned)
    if turned:  # the deciding copy checks in the other order: the larger index's thumbnail first
        unique = sorted({(min(p, q), max(p, q)) for p, q in turned})
        got = verify_more(np.array([q for _, q in unique]), np.array([p for p, _ in unique]))
        reverse.update({(p << 32) | q: float(v) for (p, q), v in zip(unique, got.tolist(), strict=True)})
    for k in range(len(passed)):
        rival[k] = rivals(k, None)
    return rival
