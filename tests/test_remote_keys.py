"""Objects under a URL root are read as they are named: by their own key, with their own suffix,
and described by their own bytes, as the same files under a local root are."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from packer.config import LimitsConfig, load_job
from packer.pipeline.discover import discover
from packer.pipeline.pixels import ChunkTask, process_chunk
from packer.pipeline.rawstore import fetched, remote_listing
from packer.records import SampleRef
from tests.helpers import write_job
from tests.s3_store import Store, running_store

pytestmark = pytest.mark.slow  # every test talks to moto's S3 server
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "odd-keys"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running


def png_bytes(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    return encoded.tobytes()


def job_for(tmp_path: Path, source: dict[str, Any], **overrides: Any) -> Any:
    doc = {"name": "t", "sources": [source], "split": {"by": "entity"}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), **overrides}
    return load_job(write_job(tmp_path, doc))


def test_a_key_with_an_empty_segment_is_read_by_its_own_key_not_a_normalised_one(store: Store,
                                                                                 tmp_path: Path) -> None:
    """``raw/dog//d.png`` (a prefix ending in ``/`` joined with ``/``) is another object than
    ``raw/dog/d.png``: each sample holds its own object's bytes, and one whose key has no
    normalised twin is not reported as listed-but-gone."""
    objects = {"dog/d.png": png_bytes(1), "dog//d.png": png_bytes(2), "cat//only.png": png_bytes(3)}
    for name, data in objects.items():
        store.client.put_object(Bucket=BUCKET, Key=f"slashes/{name}", Body=data)
    job = job_for(tmp_path, {"kind": "image", "root": f"s3://{BUCKET}/slashes", "label": "folder"})
    found = discover(job)
    assert sorted((r.relpath, r.path) for r in found.refs) == [
        ("cat//only.png", f"s3://{BUCKET}/slashes/cat//only.png"),
        ("dog//d.png", f"s3://{BUCKET}/slashes/dog//d.png"),
        ("dog/d.png", f"s3://{BUCKET}/slashes/dog/d.png")]
    limits = LimitsConfig()
    for ref in found.refs:
        with fetched(ref, found.listed[ref.path], limits=limits) as copy:
            assert isinstance(copy, SampleRef), copy
            assert Path(copy.path).read_bytes() == objects[ref.relpath]
    result = process_chunk(ChunkTask(key="slashes", refs=tuple(found.refs), job=job, cache_dir=None,
                                     listed=remote_listing(found.refs, found.listed)))
    assert result.issues == () and len(result.samples) == 3


def test_a_gzipped_nifti_object_keeps_its_compound_suffix_and_packs_as_from_a_local_root(
        store: Store, tmp_path: Path) -> None:
    """nibabel tells a NIfTI file by its name (``.nii`` or ``.nii.gz``): the local copy of
    ``ct.nii.gz`` is ``raw.nii.gz``, not ``raw.gz``, and each of its 4 axial slices is a sample."""
    import nibabel as nib

    volume = nib.Nifti1Image(np.arange(8 * 8 * 4, dtype=np.int16).reshape(8, 8, 4), np.diag([1.0, 1.0, 2.0, 1.0]))
    store.client.put_object(Bucket=BUCKET, Key="nifti/ct.NII.GZ", Body=gzip.compress(volume.to_bytes()))
    store.client.put_object(Bucket=BUCKET, Key="nifti/mr.nii.gz", Body=gzip.compress(volume.to_bytes()))
    job = job_for(tmp_path, {"kind": "nifti", "root": f"s3://{BUCKET}/nifti", "label": "none"},
                  transform={"nifti": {"windows": [{"center": 0, "width": 2000}], "sample": "slice",
                                       "axis": "axial"}})
    found = discover(job)
    ref = next(r for r in found.refs if r.relpath == "mr.nii.gz")
    with fetched(ref, found.listed[ref.path], limits=LimitsConfig()) as copy:
        assert isinstance(copy, SampleRef) and Path(copy.path).name == "raw.nii.gz"
    upper = next(r for r in found.refs if r.relpath == "ct.NII.GZ")
    with fetched(upper, found.listed[upper.path], limits=LimitsConfig()) as copy:
        assert isinstance(copy, SampleRef) and Path(copy.path).name == "raw.NII.GZ"
    result = process_chunk(ChunkTask(key="nifti", refs=(ref,), job=job, cache_dir=None,
                                     listed=remote_listing([ref], found.listed)))
    assert result.issues == () and len(result.samples) == 4


def test_a_short_extension_less_file_under_a_dicom_url_root_is_described_as_under_a_local_root(
        store: Store, tmp_path: Path) -> None:
    """A 5-byte ``IM0002`` among a DICOM export's images is "a file of 5 bytes" from either root
    (the listing said 5 bytes; "an empty file (0 bytes)" was false); an empty one is empty."""
    files = {"IM0001": b"\0" * 128 + b"DICM" + b"rest", "IM0002": b"hello", "IM0003": b""}
    local = tmp_path / "local"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
        store.client.put_object(Bucket=BUCKET, Key=f"short/{name}", Body=data)

    def described(root: str, folder: Path) -> dict[str, str]:
        found = discover(job_for(folder, {"kind": "dicom", "name": "ct", "root": root}))
        return {e.path.rsplit("/", 1)[-1]: e.detail for e in found.excluded}

    (tmp_path / "job-s3").mkdir()
    (tmp_path / "job-local").mkdir()
    remote = described(f"s3://{BUCKET}/short", tmp_path / "job-s3")
    assert sorted(remote) == ["IM0002", "IM0003"]
    assert remote["IM0002"].startswith("a file of 5 bytes, shorter than a DICOM file's 132-byte preamble")
    assert remote["IM0003"].startswith("an empty file (0 bytes)")
    assert described(str(local), tmp_path / "job-local") == remote
