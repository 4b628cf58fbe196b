"""The pixel pass spills into a cache keyed by content and config; chunks are content-defined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packer.pipeline.pixels import BOUNDARY, MAX_CHUNK, chunk_refs
from packer.records import Issue, SampleRef
from tests.helpers import demo_job_doc, write_job


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


def test_one_parse_per_dicom_file_gives_what_probe_then_read_gave(demo_raw: Any, tmp_path: Path) -> None:
    """The pixel pass parses each DICOM file once (probe_for_read hands the dataset to the
    reader). On every file of the demo tree, planted defects included, the outcome is the
    one the header-only probe followed by a fresh full read gives."""
    import numpy as np

    from packer.config import load_job
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import discover, probe_for_read, probe_ref
    from packer.read import read_sample

    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    refs = discover(job, pseudonymizer_for(job.phi)).refs
    dicom = [r for r in refs if r.kind == "dicom"]
    assert len(dicom) > 30
    kept = 0
    for r in dicom:
        once = probe_for_read(r, job)
        probed = probe_ref(r, job)
        if isinstance(probed, Issue):
            assert once == probed
            continue
        assert not isinstance(once, Issue) and once[0] == probed
        kept += once[1] is not None
        got, want = read_sample(once[0], job, dataset=once[1]), read_sample(probed, job)
        if isinstance(want, Issue):
            assert got == want
            continue
        assert not isinstance(got, Issue) and [s.key for s in got] == [s.key for s in want]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.image, b.image)
            assert a.metadata == b.metadata
    assert kept > 30  # the datasets were really handed over


def test_a_chunk_tasks_repr_leaves_out_the_storage_options() -> None:
    # dask logs a failed task with its arguments: the options may hold credentials
    from packer.pipeline.pixels import ChunkTask

    task = ChunkTask(key="k", refs=(ref(1),), job=None, cache_dir=None,  # type: ignore[arg-type]
                     storage_options={"secret": "s3cr3t-key"})
    assert "s3cr3t-key" not in repr(task) and "s-000001" in repr(task)
    assert task.storage_options == {"secret": "s3cr3t-key"}


def test_the_chunk_key_is_the_sha256_of_the_refs_as_asdict_gives_them(demo_raw: Any, tmp_path: Path) -> None:
    # chunk_key builds the ref's dict itself (asdict cost 37 µs a file on the client); existing
    # build caches stay valid only if the key is the same
    import dataclasses
    import hashlib
    import os

    from packer.config import load_job
    from packer.files import canonical_json
    from packer.pipeline.pixels import CACHE_FORMAT, chunk_key, sample_shaping_config

    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    (tmp_path / "a.png").write_bytes(b"x")
    refs = [SampleRef(sample_id="s-1", source="s", kind="image", path=str(tmp_path / "a.png"), relpath="a.png",
                      label="l", entity="e", time="2020-01-01T00:00:00", extra=(("site", "A"), ("scanner", "B"))),
            SampleRef(sample_id="s-2", source="s", kind="image", path=str(tmp_path / "gone.png"), relpath="gone.png")]
    stat = os.stat(tmp_path / "a.png")
    payload = {"format": CACHE_FORMAT, "libraries": {"numpy": "1"}, "config": sample_shaping_config(job),
               "files": [[dataclasses.asdict(refs[0]), [stat.st_size, stat.st_mtime_ns]],
                         [dataclasses.asdict(refs[1]), ["missing"]]]}
    assert chunk_key(refs, job, {"numpy": "1"}) == hashlib.sha256(canonical_json(payload)).hexdigest()[:32]
