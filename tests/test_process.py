"""The pixel pass spills into a cache keyed by content and config; chunks are content-defined."""

from __future__ import annotations

from packer.process import BOUNDARY, MAX_CHUNK, chunk_refs
from packer.records import SampleRef


def ref(i: int) -> SampleRef:
    return SampleRef(sample_id=f"s-{i:06d}", source="s", kind="image", path=f"/r/{i}.png", relpath=f"{i:06d}.png")


def test_chunks_cover_every_ref_once_in_order() -> None:
    refs = [ref(i) for i in range(1000)]
    chunks = chunk_refs(refs)
    assert [r for c in chunks for r in c] == refs
    assert all(1 <= len(c) <= MAX_CHUNK for c in chunks)
    assert len(chunks) > 1000 / (4 * BOUNDARY)


def test_adding_a_file_changes_only_its_own_chunk() -> None:
    refs = [ref(i) for i in range(0, 2000, 2)]
    before = set(chunk_refs(refs))
    grown = sorted([*refs, ref(1001)], key=lambda r: r.relpath)
    after = set(chunk_refs(grown))
    changed = after - before
    assert len(changed) == 1 and any(r.sample_id == "s-001001" for r in next(iter(changed)))
    assert len(before - after) == 1
