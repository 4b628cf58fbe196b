"""Duplicate finding for the leakage audit: dhash, near-pair search, union-find, clusters."""

from __future__ import annotations

import itertools
import time
from collections import deque

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.dedup import (
    DuplicateCluster,
    TooManyPairsError,
    UnionFind,
    cluster_duplicates,
    dhash,
    duplicate_clusters,
    exact_groups,
    find_near_pairs,
    hamming,
    near_duplicate_edges,
)

ALL_ONES = 2**64 - 1


# ---------------------------------------------------------------- references (no packer code)


def brute_pairs(hashes: list[int], threshold: int) -> list[tuple[int, int, int]]:
    return [
        (i, j, bin(hashes[i] ^ hashes[j]).count("1"))
        for i, j in itertools.combinations(range(len(hashes)), 2)
        if bin(hashes[i] ^ hashes[j]).count("1") <= threshold
    ]


def bfs_components(n: int, edges: list[tuple[int, int]]) -> list[int]:
    """Component id = smallest member, by breadth-first search."""
    adjacency: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adjacency[a].append(b)
        adjacency[b].append(a)
    component = [-1] * n
    for start in range(n):  # ascending, so the first visitor of a component is its smallest member
        if component[start] >= 0:
            continue
        component[start] = start
        queue = deque([start])
        while queue:
            for nxt in adjacency[queue.popleft()]:
                if component[nxt] < 0:
                    component[nxt] = start
                    queue.append(nxt)
    return component


def photo(seed: int, size: int = 256) -> np.ndarray:
    """A seeded photo-like H×W×3 uint8 image: smooth colour field, filled ellipses, blur, grain."""
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.uniform(0, 255, (6, 6, 3)).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(25):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        center = tuple(int(v) for v in rng.integers(0, size, 2))
        axes = tuple(int(v) for v in rng.integers(4, size // 4, 2))
        cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
    img = np.asarray(cv2.GaussianBlur(img, (0, 0), 1.5)) + np.asarray(rng.normal(0, 4, img.shape), dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def chw(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image.transpose(2, 0, 1))


# ---------------------------------------------------------------- dhash


def test_dhash_of_increasing_ramp_is_all_ones_and_its_mirror_all_zeros() -> None:
    ramp = np.tile(np.arange(9, dtype=np.uint8) * 20, (8, 1))  # already 9 wide × 8 high
    assert dhash(ramp) == ALL_ONES
    assert dhash(ramp[:, ::-1]) == 0
    big = np.tile(np.arange(900, dtype=np.uint16), (3, 400, 1))  # C×H×W, resized down
    assert dhash(big) == ALL_ONES
    assert dhash(big[:, :, ::-1].astype(np.float16)) == 0


def test_dhash_bit_order_is_row_major_msb_first() -> None:
    grid = np.zeros((8, 9), dtype=np.float32)
    grid[0, 1] = 1.0  # cell (0, 1) > cell (0, 0): bit (0, 0), the MSB
    grid[7, 8] = 1.0  # cell (7, 8) > cell (7, 7): bit (7, 7), the LSB
    assert dhash(grid) == (1 << 63) | 1
    rng = np.random.default_rng(7)
    values = rng.integers(0, 256, (8, 9)).astype(np.uint8)
    expected = "".join("1" if values[r, c + 1] > values[r, c] else "0" for r in range(8) for c in range(8))
    assert dhash(values) == int(expected, 2)


def test_dhash_averages_channels_before_differencing() -> None:
    up = np.tile(np.arange(9, dtype=np.float32), (8, 1))
    channels = np.stack([up * 3, -up, np.zeros_like(up)])  # channel mean = 2/3 · up: increasing
    assert dhash(channels) == ALL_ONES
    assert dhash(np.stack([up, -up * 3])) == 0  # mean = -up: decreasing


@pytest.mark.parametrize("shape", [(512, 512), (37, 53), (1000, 333), (3, 7, 5)])
@pytest.mark.parametrize("value", [0.7, 173.0, 40000.0])
def test_dhash_of_flat_image_is_zero_despite_float_rounding(shape: tuple[int, ...], value: float) -> None:
    # cv2's float32 INTER_AREA leaves ulp-level ripples on flat input (up to 24 set bits without a tie tolerance)
    assert dhash(np.full(shape, value, dtype=np.float32)) == 0


def test_dhash_is_stable_under_jpeg_noise_and_resize() -> None:
    for seed in range(8):
        image = photo(seed)
        reference = dhash(chw(image))
        ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        jpeg = cv2.imdecode(encoded, cv2.IMREAD_COLOR)
        assert jpeg is not None
        assert hamming(reference, dhash(chw(jpeg))) <= 6
        noise = np.random.default_rng(seed + 100).normal(0, 3, image.shape)
        noisy = np.clip(image + noise, 0, 255).astype(np.uint8)
        assert hamming(reference, dhash(chw(noisy))) <= 6
        doubled = cv2.resize(image, (512, 512), interpolation=cv2.INTER_LINEAR)
        halved = cv2.resize(image, (128, 128), interpolation=cv2.INTER_AREA)
        assert hamming(reference, dhash(chw(doubled))) <= 6
        assert hamming(reference, dhash(chw(halved))) <= 6
        assert dhash(chw(image)) == reference  # deterministic


def test_dhash_of_unrelated_images_is_far_apart() -> None:
    hashes = [dhash(chw(photo(seed))) for seed in range(8)]
    assert min(hamming(a, b) for a, b in itertools.combinations(hashes, 2)) > 15


@pytest.mark.parametrize(
    "bad",
    [np.zeros((0, 5)), np.zeros(9), np.zeros((1, 2, 3, 4)), np.array([[0.0, np.nan]]), np.array([["a", "b"]])],
)
def test_dhash_rejects_bad_arrays(bad: np.ndarray) -> None:
    with pytest.raises(ValueError):
        dhash(bad)


def test_hamming_counts_differing_bits() -> None:
    assert hamming(0, 0) == 0
    assert hamming(0, ALL_ONES) == 64
    assert hamming(0b1011, 0b0110) == 3


# ---------------------------------------------------------------- near-pair search


@st.composite
def planted_hashes(draw: st.DrawFn) -> tuple[list[int], int]:
    """Random hashes, some copied exactly and some with up to threshold (+2) bits flipped."""
    threshold = draw(st.integers(0, 10))
    hashes = draw(st.lists(st.integers(0, ALL_ONES), min_size=0, max_size=40))
    for _ in range(draw(st.integers(0, 40))):
        if not hashes:
            break
        base = hashes[draw(st.integers(0, len(hashes) - 1))]
        bits = draw(st.sets(st.integers(0, 63), max_size=threshold + 2))
        hashes.append(base ^ sum(1 << b for b in bits))
    order = draw(st.permutations(range(len(hashes))))
    return [hashes[k] for k in order], threshold


@settings(max_examples=300, deadline=None)
@given(planted_hashes())
def test_find_near_pairs_equals_brute_force(case: tuple[list[int], int]) -> None:
    hashes, threshold = case
    expected = brute_pairs(hashes, threshold)
    array = np.array(hashes, dtype=np.uint64)
    for method in ("mih", "brute", "auto"):
        assert find_near_pairs(array, threshold, method=method, limit=None) == expected


@settings(max_examples=200, deadline=None)
@given(planted_hashes())
def test_near_duplicate_edges_connect_like_all_pairs(case: tuple[list[int], int]) -> None:
    hashes, threshold = case
    all_pairs = brute_pairs(hashes, threshold)
    edges = near_duplicate_edges(np.array(hashes, dtype=np.uint64), threshold, method="mih")
    assert set(edges) <= set(all_pairs)
    assert bfs_components(len(hashes), [(i, j) for i, j, _ in edges]) == bfs_components(
        len(hashes), [(i, j) for i, j, _ in all_pairs]
    )
    assert len(edges) <= len(hashes) - len(set(hashes)) + len(brute_pairs(sorted(set(hashes)), threshold))


def test_threshold_64_pairs_everything() -> None:
    hashes = np.array([0, ALL_ONES, 12345], dtype=np.uint64)
    assert find_near_pairs(hashes, 64, method="mih") == [(0, 1, 64), (0, 2, 6), (1, 2, 58)]


def test_large_identical_group_yields_a_chain_not_a_clique() -> None:
    rng = np.random.default_rng(0)
    hashes = np.concatenate([np.full(5000, 0xDEADBEEF, dtype=np.uint64), rng.integers(0, 2**63, 5000, np.uint64)])
    hashes = hashes[rng.permutation(len(hashes))]
    start = time.perf_counter()
    edges = near_duplicate_edges(hashes, 6)
    elapsed = time.perf_counter() - start
    group = sorted(np.flatnonzero(hashes == 0xDEADBEEF).tolist())
    assert [(i, j) for i, j, d in edges if d == 0] == list(itertools.pairwise(group))
    assert len(edges) < 5100  # 4999 chain edges plus any chance near pairs among the random ones
    assert elapsed < 1.0
    with pytest.raises(TooManyPairsError, match="12497500 pairs"):
        find_near_pairs(hashes, 6)  # 5000·4999/2 pairs > the default limit


def test_identical_group_pairs_are_reported_in_full_under_the_limit() -> None:
    hashes = np.array([7] * 300 + [7 ^ 0b11, (1 << 40) | 0xF0F0], dtype=np.uint64)
    pairs = find_near_pairs(hashes, 2)
    assert len(pairs) == 300 * 299 // 2 + 300
    assert pairs[:2] == [(0, 1, 0), (0, 2, 0)] and (299, 300, 2) in pairs


@pytest.mark.parametrize(
    ("hashes", "threshold"),
    [(np.zeros((2, 2), np.uint64), 1), (np.array([-1, 3]), 1), (np.array([0.5]), 1), (np.zeros(3, np.uint64), 65)],
)
def test_near_pair_search_rejects_bad_input(hashes: np.ndarray, threshold: int) -> None:
    with pytest.raises(ValueError):
        find_near_pairs(hashes, threshold)


def test_python_ints_and_empty_input_are_accepted() -> None:
    assert find_near_pairs([ALL_ONES, ALL_ONES - 1], 1) == [(0, 1, 1)]
    assert find_near_pairs([ALL_ONES, 1, ALL_ONES ^ 4], 1) == [(0, 2, 1)]  # mixed sizes: no float64 detour
    with pytest.raises(ValueError):
        find_near_pairs([-1, 3], 1)
    assert find_near_pairs([], 3) == []
    assert near_duplicate_edges(np.zeros(0, np.uint64), 3) == []


# ---------------------------------------------------------------- grouping and clustering


def test_exact_groups() -> None:
    digests = ["b", "a", "c", "a", "b", "a", "d"]
    assert exact_groups(digests) == [[0, 4], [1, 3, 5]]
    assert exact_groups([]) == []


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    n = draw(st.integers(0, 40))
    if n == 0:
        return 0, []
    node = st.integers(0, n - 1)
    return n, draw(st.lists(st.tuples(node, node), max_size=60))


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_union_find_matches_bfs(case: tuple[int, list[tuple[int, int]]]) -> None:
    n, edges = case
    assert cluster_duplicates(n, edges) == bfs_components(n, edges)


def test_union_find_reports_merges() -> None:
    forest = UnionFind(4)
    assert forest.union(3, 2) and forest.union(2, 1)
    assert not forest.union(1, 3)
    assert forest.find(3) == forest.find(1) != forest.find(0)
    assert forest.components() == [0, 1, 1, 1]


def test_duplicate_clusters_kinds_and_chained_distance() -> None:
    digests = ["x", "y", "x", "z1", "z2", "z3", "w", "v"]
    hashes = np.array(
        [
            0xFF00,  # 0: exact copy of 2
            0x5555_5555_0000_0000,  # 1: alone (16+ bits from all)
            0xFF00,  # 2
            0b0000,  # 3: chain 3 - 4 - 5, each step 2 bits, ends 4 apart
            0b0011,  # 4
            0b1111,  # 5
            ALL_ONES,  # 6: same hash as 7 but different digest -> near, distance 0
            ALL_ONES,  # 7
        ],
        dtype=np.uint64,
    )
    assert duplicate_clusters(digests, hashes, 2) == [
        DuplicateCluster(members=(0, 2), kind="exact", max_distance=0),
        DuplicateCluster(members=(3, 4, 5), kind="near", max_distance=4),
        DuplicateCluster(members=(6, 7), kind="near", max_distance=0),
    ]


def test_duplicate_clusters_joins_exact_and_near_and_checks_lengths() -> None:
    clusters = duplicate_clusters(["a", "a", "b"], np.array([0, 1, 3], dtype=np.uint64), 1)
    assert clusters == [DuplicateCluster(members=(0, 1, 2), kind="near", max_distance=2)]
    assert duplicate_clusters(["a", "a"], np.array([0, ALL_ONES], dtype=np.uint64), 0) == [
        DuplicateCluster(members=(0, 1), kind="exact", max_distance=64)
    ]
    with pytest.raises(ValueError, match="2 digests but 3 hashes"):
        duplicate_clusters(["a", "b"], np.zeros(3, np.uint64), 1)


def test_popcount_fallback_for_numpy_before_2(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**63, 300, dtype=np.uint64)
    hashes = np.concatenate([base, base[:50] ^ np.uint64(0b10110), base[50:60] ^ np.uint64(1 << 63)])
    expected = brute_pairs([int(h) for h in hashes], 4)
    monkeypatch.delattr(np, "bitwise_count")
    assert find_near_pairs(hashes, 4, method="mih") == expected
    assert find_near_pairs(hashes, 4, method="brute") == expected


def test_edges_are_a_compact_sequence_of_sorted_tuples() -> None:
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**63, size=40, dtype=np.uint64)
    hashes = np.concatenate([base, base[:10] ^ np.uint64(1), base[:5]])  # near and exact repeats
    edges = near_duplicate_edges(hashes, 2)
    as_list = list(edges)
    assert as_list == sorted(as_list) and all(i < j for i, j, _ in as_list)
    assert edges == as_list and len(edges) == len(as_list) and edges[0] == as_list[0]
    assert edges[1:3] == as_list[1:3] and edges != as_list[:-1]
    assert edges.i.dtype == np.int32 and edges.i.nbytes == 4 * len(edges)
    assert {(i, j) for i, j, d in as_list if d == 0} >= {(k, 50 + k) for k in range(5)}
