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
