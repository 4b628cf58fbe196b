"""Exact duplicates and the union-find that closes duplicate links into split groups."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from packer.pipeline.dedup import UnionFind, cluster_duplicates, exact_groups


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


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["", "x", "y", "z"])), max_size=30))
def test_exact_groups_join_samples_by_either_digest(pairs: list[tuple[str, str]]) -> None:
    """Two samples are exact duplicates when their packed pixels or (where known) the stored
    pixels they were rendered from agree: the groups are the components of both relations."""
    digests = [d for d, _ in pairs]
    stored = [s for _, s in pairs]
    edges = [(i, j) for i in range(len(pairs)) for j in range(i + 1, len(pairs))
             if digests[i] == digests[j] or (stored[i] and stored[i] == stored[j])]
    component = bfs_components(len(pairs), edges)
    want = sorted([i for i in range(len(pairs)) if component[i] == c] for c in set(component)
                  if component.count(c) > 1)
    assert exact_groups(digests, stored) == want
    assert exact_groups(digests, [""] * len(pairs)) == exact_groups(digests)
