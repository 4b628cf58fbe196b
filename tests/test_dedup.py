"""Exact duplicates and the union-find that closes duplicate links into split groups."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from packer.pipeline.dedup import (
    UnionFind,
    cluster_duplicates,
    components_of,
    exact_groups,
    exact_groups_of,
    shared_instances,
    shared_instances_of,
)
from packer.pipeline.sampletable import SampleTable
from packer.records import SampleRef, SpilledSample


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


def _table(rows: list[tuple[str, str, bool, str, str | None]]) -> SampleTable:
    """A sample table of (sha256, stored_digest, blank, instance, entity) rows."""
    records = []
    for i, (sha, stored, blank, instance, entity) in enumerate(rows):
        ref = SampleRef(sample_id=f"s{i}", source="src", kind="dicom", path=f"/raw/{i}.dcm", relpath=f"{i}.dcm",
                        label=None, entity=entity, time=None)
        records.append(SpilledSample(key=f"s{i}-f0000", ref=ref, spill="chunk", offset=0, pixel_bytes=1, meta_bytes=1,
                                     shape=(1,), dtype="uint8", sha256=sha, stored_digest=stored, blank=blank,
                                     instance=instance))
    return SampleTable.of(records)


# digests of the widths packer writes (sha256: 64 hex, stored and instance digests: 32), several
# sharing their first 16 characters (the prefix the table path sorts by), and one of another form
_SAME_START = "0123456789abcdef"
DIGESTS = st.sampled_from([_SAME_START + "0" * 48, _SAME_START + "1" * 48, "f" * 64, "e" * 64, "a" * 64])
SHORT = st.sampled_from(["", "", _SAME_START + "0" * 16, _SAME_START + "1" * 16, "c" * 32, "d" * 32])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(DIGESTS | st.sampled_from(["not-decoded:x"]), SHORT, st.booleans(), SHORT,
                          st.sampled_from(["P1", "P2", None])), max_size=40))
def test_table_groups_equal_the_list_groups(rows: list[tuple[str, str, bool, str, str | None]]) -> None:
    """The client's table path (no Python object per record: digests sorted by their first 64
    bits, then compared whole) finds the same exact-duplicate groups and shared UIDs, in the same
    order, as the list functions, including digests that share their first 16 characters and
    placeholders that are no digests (which fall back to the lists)."""
    table = _table(rows)
    shas, stored, blank, instances, entities = ([r[k] for r in rows] for k in range(5))
    assert exact_groups_of(table) == exact_groups(shas, stored, blank)
    assert shared_instances_of(table) == shared_instances(instances, entities, table.column("key"), shas)


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_components_of_named_rows_match_the_whole_forest(case: tuple[int, list[tuple[int, int]]]) -> None:
    """components_of holds only the rows an edge names, each with the id cluster_duplicates gives."""
    n, edges = case
    whole = cluster_duplicates(n, edges)
    assert components_of(edges) == {row: whole[row] for edge in edges for row in edge}
