"""Find exact and near duplicates among packed samples, for the leakage audit.

Exact duplicates share a digest of their decoded pixels; near duplicates have 64-bit
difference hashes (:func:`dhash`) within a Hamming ``threshold``. Both become edges of one
graph; its connected components (:func:`duplicate_clusters`) must each sit in one split.

Near-pair search is multi-index hashing: the 64 bits are cut into ``threshold + 1``
disjoint segments, so by pigeonhole two hashes within ``threshold`` agree exactly on at
least one segment. Hashes are compared only inside the (segment, value) buckets. Identical
hashes are collapsed first, so a thousand copies of one blank slice are one bucket entry.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

HASH_BITS = 64
# Relative to the grid's peak magnitude: float32 area averaging of a flat region is only
# equal up to a few ulps, and which ulps depends on OpenCV's SIMD path. Differences below
# this count as ties (bit 0), so flat regions hash the same on every machine.
_TIE_TOLERANCE = 1e-4
# "auto" picks multi-index hashing while its candidate pairs stay under this share of all
# n²/2 pairs (a candidate costs ~1-2× a brute-force comparison, measured on 100k hashes).
_MIH_MAX_SHARE = 0.4
_BRUTE_BLOCK = 1 << 22  # elements of one brute-force XOR block (32 MiB of uint64)
DEFAULT_PAIR_LIMIT = 1_000_000

Method = Literal["auto", "mih", "brute"]


class TooManyPairsError(ValueError):
    """:func:`find_near_pairs` would return more pairs than its ``limit``."""


def dhash(image: np.ndarray) -> int:
    """64-bit difference hash of one sample.

    ``image`` is H×W or C×H×W (channels first), any integer or float dtype (uint8, uint16,
    float16, ...). Order of operations: mean over channels in float32; ``cv2.resize`` to
    9 wide × 8 high with ``INTER_AREA``; bit (r, c) is 1 where cell (r, c + 1) exceeds cell
    (r, c) by more than 1e-4 × the grid's peak magnitude (smaller differences are float
    rounding and count as ties, i.e. 0). Bits are row-major, MSB first: bit (0, 0) is
    ``1 << 63``. So a left-to-right increasing ramp hashes to ``2**64 - 1``, its mirror and
    any flat image to 0. Returns an int in [0, 2**64). O(C·H·W).

    Raises ValueError for an empty array, another number of dimensions, or NaN/inf values.
    """
    arr = np.asarray(image)
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise ValueError(f"dhash expects a non-empty H×W or C×H×W array, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"dhash expects a numeric array, got dtype {arr.dtype}")
    gray = arr.mean(axis=0, dtype=np.float32) if arr.ndim == 3 else arr.astype(np.float32)
    if not np.isfinite(gray).all():
        raise ValueError("dhash expects finite pixel values; the array holds NaN or inf")
    grid = cv2.resize(np.ascontiguousarray(gray), (9, 8), interpolation=cv2.INTER_AREA)
    tolerance = _TIE_TOLERANCE * float(np.abs(grid).max())
    bits = (grid[:, 1:] - grid[:, :-1]) > tolerance
    return int.from_bytes(np.packbits(bits.ravel()).tobytes(), "big")


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two 64-bit hashes (ints in [0, 2**64)). O(1)."""
    return (int(a) ^ int(b)).bit_count()


def popcount(values: np.ndarray) -> np.ndarray:
    """Set bits per element of a uint64 array, as uint8 of the same shape. O(n)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
    flat = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    return table[flat.view(np.uint8)].reshape(-1, 8).sum(axis=1, dtype=np.uint8).reshape(values.shape)


def _as_hashes(hashes: np.ndarray | Sequence[int]) -> np.ndarray:
    if not isinstance(hashes, np.ndarray):  # np.asarray would turn [2**64 - 1, 1] into float64
        try:
            return np.array([int(h) for h in hashes], dtype=np.uint64)
        except OverflowError as err:
            raise ValueError(f"hashes must be ints in [0, 2**64): {err}") from err
    if hashes.ndim != 1:
        raise ValueError(f"hashes must be 1-D, got shape {hashes.shape}")
    if hashes.dtype.kind not in "ui":
        raise ValueError(f"hashes must be uint64, got dtype {hashes.dtype}")
    if hashes.dtype.kind == "i" and hashes.size and hashes.min() < 0:
        raise ValueError("hashes must be uint64; got negative values (a signed view of a 64-bit hash?)")
    return hashes.astype(np.uint64, copy=False)


def _check_threshold(threshold: int) -> int:
    if isinstance(threshold, bool) or not 0 <= int(threshold) <= HASH_BITS or int(threshold) != threshold:
        raise ValueError(f"threshold must be an int in 0..{HASH_BITS}, got {threshold!r}")
    return int(threshold)


def _segment_masks(threshold: int) -> list[tuple[int, int]]:
    """(shift, mask) of threshold + 1 disjoint segments covering the 64 bits, widths within 1."""
    count = threshold + 1
    widths = [HASH_BITS // count + (1 if s < HASH_BITS % count else 0) for s in range(count)]
    shifts = [sum(widths[:s]) for s in range(count)]
    return [(shift, (1 << width) - 1) for shift, width in zip(shifts, widths, strict=True)]


def _segment_keys(values: np.ndarray, shift: int, mask: int) -> np.ndarray:
    return (values >> np.uint64(shift)) & np.uint64(mask)


def _mih_candidates(values: np.ndarray, threshold: int) -> int:
    """Pairs sharing a bucket, summed over segments: the work of :func:`_pairs_mih`."""
    total = 0
    for shift, mask in _segment_masks(threshold):
        sizes = np.unique(_segment_keys(values, shift, mask), return_counts=True)[1].astype(np.int64)
        total += int((sizes * (sizes - 1) // 2).sum())
    return total


def _pairs_mih(values: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (a < b) of distinct, ascending ``values`` within ``threshold``, by multi-index hashing.

    Per segment, values are sorted by segment key; offset k then compares every position p
    with p + k inside the same bucket. Sparse offsets gather only the positions whose bucket
    extends that far; dense ones scan the whole sorted array contiguously (cheaper than a
    gather). A pair is kept only by the first segment it agrees on, so there is no dedupe.
    Work ~ candidate pairs, (t+1)·n²/2^(64/(t+1)+1) for uniform hashes; memory O(n + output).
    """
    segments = _segment_masks(threshold)
    n = len(values)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for s, (shift, mask) in enumerate(segments):
        keys = _segment_keys(values, shift, mask)
        order = np.argsort(keys, kind="stable")  # stable + ascending values: order[p] < order[p + k]
        sorted_keys, sorted_values = keys[order], values[order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        remaining = np.repeat(np.r_[starts[1:], n], np.diff(np.r_[starts, n])) - np.arange(n)
        longest_first = np.argsort(remaining, kind="stable")[::-1]
        ascending = remaining[longest_first[::-1]]
        offset = 1
        while count := n - int(np.searchsorted(ascending, offset, side="right")):
            if count * 5 > n:
                near = popcount(sorted_values[:-offset] ^ sorted_values[offset:]) <= threshold
                p = np.flatnonzero(near)
                p = p[sorted_keys[p] == sorted_keys[p + offset]]
            else:
                active = longest_first[:count]
                p = active[popcount(sorted_values[active] ^ sorted_values[active + offset]) <= threshold]
            xor = sorted_values[p] ^ sorted_values[p + offset]
            owned = np.ones(p.size, dtype=bool)
            for earlier_shift, earlier_mask in segments[:s]:
                owned &= _segment_keys(xor, earlier_shift, earlier_mask) != 0
            found.append((order[p[owned]].astype(np.int32), order[p[owned] + offset].astype(np.int32),
                          popcount(xor[owned]).astype(np.uint8)))
            offset += 1
    return _concat(found)


def _pairs_brute(values: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (a < b) of ``values`` within ``threshold``, all n²/2 comparisons in blocks."""
    n = len(values)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    rows = max(1, _BRUTE_BLOCK // max(n, 1))
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        dist = popcount(values[start:stop, None] ^ values[None, start:])
        a, b = np.nonzero(dist <= threshold)
        a, b = a + start, b + start
        upper = b > a
        found.append((a[upper].astype(np.int32), b[upper].astype(np.int32),
                      dist[a[upper] - start, b[upper] - start].astype(np.uint8)))
    return _concat(found)


def _concat(found: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not found:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.uint8)
    # int32 indices and uint8 distances: near pairs can number in the millions (see Edges)
    return (np.concatenate([part[0] for part in found]).astype(np.int32, copy=False),
            np.concatenate([part[1] for part in found]).astype(np.int32, copy=False),
            np.concatenate([part[2] for part in found]).astype(np.uint8, copy=False))


def _unique_pairs(
    hashes: np.ndarray | Sequence[int], threshold: int, method: Method
) -> tuple[list[int], dict[int, list[int]], list[int], list[int], list[int]]:
    """:func:`_unique_pair_arrays` with Python lists (for callers that build pairs from them)."""
    first, repeats, a, b, dist = _unique_pair_arrays(hashes, threshold, method)
    return first.tolist(), repeats, a.tolist(), b.tolist(), dist.tolist()


def _unique_pair_arrays(
    hashes: np.ndarray | Sequence[int], threshold: int, method: Method
) -> tuple[np.ndarray, dict[int, list[int]], np.ndarray, np.ndarray, np.ndarray]:
    """Collapse identical hashes, then find near pairs among the distinct values.

    Returns (first, repeats, a, b, dist): ``first[u]`` is the smallest index holding distinct
    value u, ``repeats[u]`` all its indices (ascending) where there are several; distinct
    values a[k], b[k] are within ``dist[k]`` <= threshold.
    """
    values_in = _as_hashes(hashes)
    threshold = _check_threshold(threshold)
    values, inverse = np.unique(values_in, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(values))
    bounds = np.r_[0, np.cumsum(counts)]
    repeats = {int(u): order[bounds[u] : bounds[u + 1]].tolist() for u in np.flatnonzero(counts > 1)}
    if method == "auto":
        n = len(values)
        cheap = threshold < HASH_BITS and _mih_candidates(values, threshold) < _MIH_MAX_SHARE * n * (n - 1) / 2
        method = "mih" if cheap else "brute"
    if method == "mih" and threshold < HASH_BITS:
        a, b, dist = _pairs_mih(values, threshold)
    elif method in ("mih", "brute"):
        a, b, dist = _pairs_brute(values, threshold)
    else:
        raise ValueError(f"method must be 'auto', 'mih' or 'brute', got {method!r}")
    return order[bounds[:-1]], repeats, np.asarray(a), np.asarray(b), np.asarray(dist)


def find_near_pairs(
    hashes: np.ndarray | Sequence[int],
    threshold: int,
    *,
    limit: int | None = DEFAULT_PAIR_LIMIT,
    method: Method = "auto",
) -> list[tuple[int, int, int]]:
    """Every pair of samples whose hashes differ in at most ``threshold`` bits, for reports.

    ``hashes`` is a 1-D uint64 array (one :func:`dhash` per sample); ``threshold`` in 0..64.
    Returns sorted (i, j, distance) with i < j, identical hashes included (distance 0).
    A group of k identical hashes alone yields k(k-1)/2 pairs, so the count is computed
    before any pair is built and TooManyPairsError is raised when it exceeds ``limit``
    (None: no limit); use :func:`near_duplicate_edges` for clustering. ``method`` picks
    multi-index hashing, brute force, or (auto) whichever is cheaper.
    Cost: O(n log n) + candidate pairs (see module docstring) + output.
    """
    first, repeats, ua, ub, udist = _unique_pairs(hashes, threshold, method)
    members = {u: repeats.get(u, [first[u]]) for u in itertools.chain(ua, ub)}
    total = sum(len(m) * (len(m) - 1) // 2 for m in repeats.values())
    total += sum(len(members[a]) * len(members[b]) for a, b in zip(ua, ub, strict=True))
    if limit is not None and total > limit:
        raise TooManyPairsError(
            f"{total} pairs within Hamming distance {threshold} exceed limit={limit}; "
            "raise the limit, lower the threshold, or cluster with near_duplicate_edges()"
        )
    pairs = [(i, j, 0) for m in repeats.values() for i, j in itertools.combinations(m, 2)]
    for a, b, d in zip(ua, ub, udist, strict=True):
        pairs.extend((min(i, j), max(i, j), d) for i, j in itertools.product(members[a], members[b]))
    pairs.sort()
    return pairs


class Edges(Sequence[tuple[int, int, int]]):
    """Near-duplicate edges (i, j, distance), i < j, sorted, held as three int arrays.

    A sequence of ``(i, j, distance)`` tuples to its users, stored in 12 bytes an edge
    instead of ~100 for a list of tuples: adjacent CT slices of one patient are near
    duplicates, so a build of 10k synthetic slices already has over 200k edges, and the
    client holds them through the split and the audit.
    """

    __slots__ = ("i", "j", "distance")

    def __init__(self, i: np.ndarray, j: np.ndarray, distance: np.ndarray) -> None:
        order = np.lexsort((distance, j, i))
        self.i = np.asarray(i, dtype=np.int32)[order]
        self.j = np.asarray(j, dtype=np.int32)[order]
        self.distance = np.asarray(distance, dtype=np.int32)[order]

    def __len__(self) -> int:
        return len(self.i)

    def __getitem__(self, k):  # type: ignore[no-untyped-def,override]
        if isinstance(k, slice):
            return [self[n] for n in range(*k.indices(len(self)))]
        return int(self.i[k]), int(self.j[k]), int(self.distance[k])

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        for start in range(0, len(self), 65536):  # Python ints a block at a time, not all at once
            stop = start + 65536
            yield from zip(self.i[start:stop].tolist(), self.j[start:stop].tolist(),
                           self.distance[start:stop].tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Edges({len(self)} edges)"


def near_duplicate_edges(
    hashes: np.ndarray | Sequence[int], threshold: int, *, method: Method = "auto"
) -> Edges:
    """A sparse edge set with the same connected components as :func:`find_near_pairs`.

    Same inputs. For a group of k identical hashes (members m0 < m1 < ...) it emits the k-1
    chain edges (m0, m1, 0), (m1, m2, 0), ...; for two distinct hash values within
    ``threshold`` it emits one edge between their smallest members. So the output is at most
    (n - distinct) + (near pairs of distinct values), not quadratic in duplicate groups.
    Returns sorted (i, j, distance) with i < j, as compact :class:`Edges`.
    """
    firsts, repeats, ua, ub, udist = _unique_pair_arrays(hashes, threshold, method)
    firsts = firsts.astype(np.int32)
    chain = [(m[k], m[k + 1]) for m in repeats.values() for k in range(len(m) - 1)]
    fa, fb = firsts[ua], firsts[ub]
    del ua, ub
    chain_i = np.asarray([c[0] for c in chain], dtype=np.int32)
    chain_j = np.asarray([c[1] for c in chain], dtype=np.int32)
    return Edges(np.concatenate([chain_i, np.minimum(fa, fb)]), np.concatenate([chain_j, np.maximum(fa, fb)]),
                 np.concatenate([np.zeros(len(chain), dtype=np.int32), udist.astype(np.int32)]))


def exact_groups(digests: Sequence[str]) -> list[list[int]]:
    """Indices sharing a digest: groups of size >= 2, each ascending, ordered by first index. O(n)."""
    by_digest: dict[str, list[int]] = {}
    for index, digest in enumerate(digests):
        by_digest.setdefault(digest, []).append(index)
    return sorted(group for group in by_digest.values() if len(group) > 1)


class UnionFind:
    """Disjoint sets over 0..n-1 with path compression and union by size (near O(1) per op)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"UnionFind size must be >= 0, got {n}")
        self._parent = list(range(n))
        self._size = [1] * n

    def find(self, item: int) -> int:
        """The representative of ``item``'s set (IndexError outside 0..n-1)."""
        parent = self._parent
        root = item
        while parent[root] != root:
            root = parent[root]
        while parent[item] != root:
            parent[item], item = root, parent[item]
        return root

    def union(self, a: int, b: int) -> bool:
        """Merge the sets of ``a`` and ``b``; False if they were already one set."""
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return False
        if self._size[root_a] < self._size[root_b]:
            root_a, root_b = root_b, root_a
        self._parent[root_b] = root_a
        self._size[root_a] += self._size[root_b]
        return True

    def components(self) -> list[int]:
        """Component id per item; the id is the smallest member index, so runs agree. O(n)."""
        smallest: dict[int, int] = {}
        return [smallest.setdefault(self.find(item), item) for item in range(len(self._parent))]


def cluster_duplicates(n: int, edges: Iterable[Sequence[int]]) -> list[int]:
    """Component id (smallest member index) per item 0..n-1, from (i, j) or (i, j, distance) edges."""
    forest = UnionFind(n)
    for edge in edges:
        forest.union(edge[0], edge[1])
    return forest.components()


@dataclass(frozen=True)
class DuplicateCluster:
    """Samples that must share a split. ``kind`` is "exact" when all share one digest;
    ``max_distance`` is the largest Hamming distance between any two members' hashes
    (it can exceed the threshold, since near-duplicate links chain)."""

    members: tuple[int, ...]
    kind: Literal["exact", "near"]
    max_distance: int


def duplicate_clusters(
    digests: Sequence[str], hashes: np.ndarray | Sequence[int], threshold: int
) -> list[DuplicateCluster]:
    """Clusters of >= 2 samples linked by an equal digest or hashes within ``threshold``.

    ``digests[i]`` and ``hashes[i]`` (uint64 :func:`dhash`) describe sample i; raises
    ValueError if their lengths differ. Returns clusters ordered by smallest member,
    members ascending. Cost: near-pair search + O(sum of distinct-hash count² per cluster)
    for ``max_distance``.
    """
    values = _as_hashes(hashes)
    if len(digests) != len(values):
        raise ValueError(f"got {len(digests)} digests but {len(values)} hashes; expected one of each per sample")
    edges = [(g[k], g[k + 1]) for g in exact_groups(digests) for k in range(len(g) - 1)]
    edges.extend((i, j) for i, j, _ in near_duplicate_edges(values, threshold))
    component = cluster_duplicates(len(values), edges)
    grouped: dict[int, list[int]] = {}
    for index, root in enumerate(component):
        grouped.setdefault(root, []).append(index)
    clusters = []
    for members in sorted(g for g in grouped.values() if len(g) > 1):
        kind: Literal["exact", "near"] = "exact" if len({digests[i] for i in members}) == 1 else "near"
        clusters.append(DuplicateCluster(tuple(members), kind, _diameter(np.unique(values[members]))))
    return clusters


def _diameter(values: np.ndarray) -> int:
    """Largest pairwise Hamming distance among ``values``, in row blocks (O(n²) time, O(n) rows)."""
    best = 0
    rows = max(1, _BRUTE_BLOCK // max(len(values), 1))
    for start in range(0, len(values), rows):
        block = popcount(values[start : start + rows, None] ^ values[None, :])
        best = max(best, int(block.max()))
    return best
