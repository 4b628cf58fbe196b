"""A file found by its move key is the moved file only if its bytes are the ones cached.

The build cache finds a file moved or renamed (``mv``) by its move key: its inode, size and
mtime without its name (:func:`packer.pipeline.filecache.move_key`). A *new* file at a new path
can match all three: ext4 hands a deleted file's inode number to the next file created, and a
file copied in with ``tar``, ``cp -p`` or ``rsync -t`` keeps its mtime, which an unpacked archive
shares with every other file. The version must still be the one a build with an empty cache
makes: the new file is decoded, its own pixels and entity packed, and a genuine ``mv`` is
still not decoded.

Whether a file system reuses an inode at once is its own affair, so the tests give the new
file the deleted one's inode themselves: the deleted file's inode is opened, its bytes
replaced by the new file's (the same size), and it is linked at the new path with the shared
mtime, which is what ext4 leaves after ``rm old; cp -p other new``.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq

from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.dicom_files import ct_dataset, ct_pixels, save
from tests.helpers import write_job

#: one mtime for every file, as an archive extraction leaves them
MTIME = 1_700_000_000 * 10**9


def take_inode(old: Path, new: Path, data: bytes) -> None:
    """``new`` (not there yet) holding ``data``, on the inode ``old`` had, with the shared mtime;
    ``old`` gone: what ``rm old`` then a copy of another file to ``new`` leave on ext4."""
    inode, size = old.stat().st_ino, old.stat().st_size
    assert len(data) == size, "the new file must be the deleted one's size"
    with open(old, "r+b") as fh:
        fh.write(data)
    new.parent.mkdir(parents=True, exist_ok=True)
    os.rename(old, new)
    os.utime(new, ns=(MTIME, MTIME))
    assert new.stat().st_ino == inode and not old.exists()


def run(job: dict[str, object], tmp_path: Path, out: str, cache: str) -> BuildResult:
    doc = {**job, "output": str(tmp_path / out)}
    return build(load_job(write_job(tmp_path / f"jobs-{out}", doc)),
                 BuildOptions(scheduler="sync", quiet=True, html_report=False, cache_dir=tmp_path / cache))


def index_rows(result: BuildResult) -> list[dict[str, object]]:
    return pq.read_table(result.version_dir / "_index.parquet").to_pylist()


def png(seed: int) -> bytes:
    """An uncompressed PNG (zlib level 0): its size depends on its shape only, not its pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert ok
    return data.tobytes()


def test_a_new_png_on_a_deleted_files_inode_is_decoded_and_a_moved_one_is_not(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for i in range(6):
        path = raw / f"E{i % 3}" / f"p{i}.png"  # the entity is the first folder: a rename keeps it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(i))
        os.utime(path, ns=(MTIME, MTIME))
    job = {"name": "photos", "sources": [{"kind": "image", "root": str(raw), "label": "none",
                                          "entity": {"component": 0}}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.5}, "seed": 3,
                     "balance": {"accept": True}},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset", "max_samples": 4},
           "validate": {"max_bad_fraction": 0.5}}
    first = run(job, tmp_path, "out", "cache")
    assert (first.files_decoded, first.files_cached) == (6, 0)

    # p1.png deleted and another photo copied in at new.png on its inode; p2.png renamed with mv
    take_inode(raw / "E1" / "p1.png", raw / "E1" / "new.png", png(100))
    os.rename(raw / "E2" / "p2.png", raw / "E2" / "p2-renamed.png")
    second = run(job, tmp_path, "out", "cache")
    fresh = run(job, tmp_path, "fresh", "fresh-cache")
    assert fresh.files_cached == 0
    # the new photo is decoded; the moved one is found again by its move key and its bytes, not decoded
    assert (second.files_decoded, second.files_cached) == (1, 5)
    assert second.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
    assert {r["sha256"] for r in index_rows(second)} == {r["sha256"] for r in index_rows(fresh)}


def uid(n: int) -> str:
    """A UID of one length whatever ``n`` (generate_uid's vary), so that files compare by size."""
    return f"1.2.826.0.1.3680043.8.498.{10**18 + n}"


def ct_slice(path: Path, patient: str, n: int, z: float, series: int) -> None:
    ds = ct_dataset(ct_pixels(seed=n), center=40.0, width=400.0)
    ds.PatientID = patient
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = uid(n)
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = uid(series), uid(series + 1), uid(series + 2)
    ds.ImagePositionPatient = [0.0, 0.0, z]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.InstanceNumber = 1
    save(ds, path)
    os.utime(path, ns=(MTIME, MTIME))


def test_a_new_patients_dicom_slice_on_a_deleted_slices_inode_keeps_its_own_patient_and_pixels(
        tmp_path: Path) -> None:
    """The walker's case: a slice of PAT0 deleted and a slice of a new patient PAT9 copied into
    PAT0's folder on its inode. Cached as the deleted slice's, PAT9 vanished from the version and
    PAT0 kept the deleted slice's pixels."""
    raw = tmp_path / "raw"
    for p in range(2):
        for k in range(3):
            ct_slice(raw / f"PAT{p}" / f"IM{k}.dcm", f"PAT{p}", 100 * p + k, 2.5 * k, series=1000 * (p + 1))
    job = {"name": "ct", "sources": [{"kind": "dicom", "root": str(raw), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.5}, "seed": 3,
                     "balance": {"accept": True}},
           "transform": {"dicom": {"windows": ["file"], "size": [16, 16]}},
           "pack": {"format": "webdataset", "max_samples": 8}, "phi": {"mode": "keep"},
           "validate": {"max_bad_fraction": 0.5}}
    first = run(job, tmp_path, "out", "cache")
    assert first.files_decoded == 6

    staged = tmp_path / "PAT9.dcm"
    ct_slice(staged, "PAT9", 999, 0.0, series=9000)
    take_inode(raw / "PAT0" / "IM1.dcm", raw / "PAT0" / "from_PAT9.dcm", staged.read_bytes())
    second = run(job, tmp_path, "out", "cache")
    fresh = run(job, tmp_path, "fresh", "fresh-cache")
    assert (second.files_decoded, second.files_cached) == (1, 5)
    assert sorted({str(r["entity_id"]) for r in index_rows(second)}) == ["PAT0", "PAT1", "PAT9"]
    assert second.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
