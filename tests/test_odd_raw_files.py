"""Odd files among a source's raw files: each is counted once, packed, bad or left out, and said as what it is.

A PACS export names its images without a suffix (``IMAGES/IM0001``), so the DICOM listing looks at
each such file's first bytes. A file whose bytes cannot be looked at (a broken link, a loop of
links, no read permission, a named pipe) is not "an empty file": it is listed, and the read
names its defect exactly as it does for the same file named ``.dcm``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.config import load_job
from packer.pipeline.discover import discover
from packer.pipeline.probe import probe_ref
from packer.records import Issue
from tests.dicom_files import ct_dataset, ct_pixels, save

NOBODY = 65534


def _export(root: Path, patients: int = 4) -> Path:
    """A PACS-style export: ``root/IMAGES/IM0000``... real CT slices, one patient each, no suffix."""
    images = root / "IMAGES"
    for i in range(patients):
        save(ct_dataset(ct_pixels(seed=i), PatientID=f"P{i}"), images / f"IM000{i}")
    return images


def _job(folder: Path, root: Path) -> Path:
    doc = {"name": "odd", "sources": [{"kind": "dicom", "root": str(root), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "transform": {"dicom": {"windows": ["lung"], "size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(folder / "out"), "phi": {"mode": "keep"},
           "validate": {"max_bad_fraction": 0.9}}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _said(record: dict[str, Any] | Issue, *names: str) -> tuple[str, str]:
    """(reason, message with the files' own ``names`` as NAME1, NAME2...), to hold twins' records
    side by side."""
    reason, message = (record["reason"], record["message"]) if isinstance(record, dict) else (
        record.reason, record.message)
    for i, name in enumerate(names, 1):
        message = message.replace(name, f"NAME{i}")
    return reason, message


def _probed(job_path: Path, names: list[str]) -> dict[str, Issue]:
    """The bad-sample records the read gives the listed files called ``names`` (none may pack)."""
    job = load_job(job_path)
    found = discover(job)
    listed = {Path(ref.path).name: ref for ref in found.refs}
    assert set(names) <= set(listed), f"not listed: {sorted(set(names) - set(listed))}"
    assert not {Path(e.path).name for e in found.excluded} & set(names)
    out = {}
    for name in names:
        issue = probe_ref(listed[name], job)
        assert isinstance(issue, Issue), (name, issue)
        out[name] = issue
    return out


def test_a_broken_link_or_a_loop_without_a_suffix_is_the_bad_sample_its_dcm_twin_is(tmp_path: Path) -> None:
    """IMAGES/IM0050 -> a file that is gone was left out as unsupported_format, "an empty file
    (0 bytes) ... export it again", and never counted as bad; IM0050.dcm, the same link, was a
    missing_file bad sample."""
    images = _export(tmp_path / "export")
    for name in ("IM0050", "IM0051.dcm"):  # a file that is gone
        (images / name).symlink_to(tmp_path / "elsewhere" / name)
    for a, b in (("IM0060", "IM0061"), ("IM0062.dcm", "IM0063.dcm")):  # links in a loop
        (images / a).symlink_to(b)
        (images / b).symlink_to(a)
    result = packer.validate(_job(tmp_path, tmp_path / "export"), scheduler="sync", progress=False)
    bad = {Path(r["path"]).name: r for r in result.report["bad_samples"]["records"]}
    assert sorted(bad) == ["IM0050", "IM0051.dcm", "IM0060", "IM0061", "IM0062.dcm", "IM0063.dcm"]
    assert result.report["excluded"]["total"] == 0
    assert bad["IM0050"]["reason"] == "missing_file"
    assert _said(bad["IM0050"], "IM0050") == _said(bad["IM0051.dcm"], "IM0051.dcm")
    assert bad["IM0050"]["message"].endswith("which does not exist; fix the link or remove it")
    assert bad["IM0060"]["reason"] == bad["IM0061"]["reason"] == "unreadable"
    assert "leads back to itself through links" in bad["IM0060"]["message"]
    assert _said(bad["IM0060"], "IM0060", "IM0061") == _said(bad["IM0062.dcm"], "IM0062.dcm", "IM0063.dcm")
    assert result.report["inputs"]["files"] == 10  # 4 images, 6 links: each counted once
    assert result.report["inputs"]["samples"] == 4


@contextlib.contextmanager
def _as_nobody() -> Iterator[None]:
    """Run the block as a user without root's powers (chmod 000 does not stop root from reading):
    the effective user id is nobody's for its length, where the suite runs as root."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


@contextlib.contextmanager
def _open_folder() -> Iterator[Path]:
    """A fresh folder every user can enter (pytest's tmp_path sits under a folder of mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="odd-raw-"))
    try:
        folder.chmod(0o777)
        yield folder
    finally:
        for path in folder.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o777 if path.is_dir() else 0o666)
        shutil.rmtree(folder)


def test_an_image_without_a_suffix_the_user_cannot_read_is_unreadable_as_its_dcm_twin_is() -> None:
    with _open_folder() as folder:
        images = _export(folder / "export")
        save(ct_dataset(ct_pixels(seed=9), PatientID="P9"), images / "IM0009")
        save(ct_dataset(ct_pixels(seed=10), PatientID="P9"), images / "IM0010.dcm")
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o666)
        (images / "IM0009").chmod(0)
        (images / "IM0010.dcm").chmod(0)
        job = _job(folder, folder / "export")
        with _as_nobody():
            issues = _probed(job, ["IM0009", "IM0010.dcm"])
    assert issues["IM0009"].reason == "unreadable"
    assert "Permission denied" in issues["IM0009"].message
    assert _said(issues["IM0009"], "IM0009") == _said(issues["IM0010.dcm"], "IM0010.dcm")


def test_a_named_pipe_without_a_suffix_is_unreadable_as_its_dcm_twin_is(tmp_path: Path) -> None:
    images = _export(tmp_path / "export")
    os.mkfifo(images / "IM0002x")
    os.mkfifo(images / "IM0003x.dcm")
    issues = _probed(_job(tmp_path, tmp_path / "export"), ["IM0002x", "IM0003x.dcm"])
    assert issues["IM0002x"].reason == "unreadable" and "named pipe" in issues["IM0002x"].message
    assert _said(issues["IM0002x"], "IM0002x") == _said(issues["IM0003x.dcm"], "IM0003x.dcm")


def test_a_broken_link_with_another_suffix_stays_unlisted_as_such_a_file_does(tmp_path: Path) -> None:
    """Only names the DICOM listing would speak for (no suffix, a UID) are listed unread: a broken
    LOCK.xml link beside the images is no image, as a readable LOCK.xml is none."""
    images = _export(tmp_path / "export")
    (images / "LOCK.xml").symlink_to(tmp_path / "gone.xml")
    (images / "1.2.840.113619.2.55.3.7").symlink_to(tmp_path / "gone")
    found = discover(load_job(_job(tmp_path, tmp_path / "export")))
    assert [Path(ref.path).name for ref in found.refs] == [
        "1.2.840.113619.2.55.3.7", "IM0000", "IM0001", "IM0002", "IM0003"]
    assert found.excluded == [] and found.issues == []


def test_an_empty_file_without_a_suffix_is_still_said_to_be_empty(tmp_path: Path) -> None:
    images = _export(tmp_path / "export")
    (images / "IM0099").write_bytes(b"")
    found = discover(load_job(_job(tmp_path, tmp_path / "export")))
    assert "IM0099" not in {Path(ref.path).name for ref in found.refs}
    (record,) = found.excluded
    assert (Path(record.path).name, record.why) == ("IM0099", "unsupported_format")
    assert record.detail.startswith("an empty file (0 bytes)")


COMPRESSED_DICOM = ["slice4.dcm.gz", "IM0005.gz", "slice6.dcm.bz2", "slice7.dcm.xz", "slice8.dcm.zst",
                    "1.2.840.113619.2.55.3.9.gz"]
ARCHIVES = ["series.zip", "series.tar.gz", "more.tgz", "plain.tar", "b.7z", "c.rar", "d.tar.zst"]
NOT_DICOM = ["labels.csv.gz", "notes.txt", "vol.nii.gz", "meta.json", "app.log.gz", "report.pdf"]


def test_compressed_dicom_files_and_archives_in_a_dicom_source_are_left_out_saying_to_decompress_or_unpack(
        tmp_path: Path) -> None:
    """x.dcm.gz (as TCIA mirrors ship them), a zip or a tarball of a series were in no count and no
    record: neither packed, bad nor left out. Compressed files and archives are now left out as
    unsupported_format with the fix; other files beside the images (a .csv.gz, a .nii.gz, a
    .log.gz) stay unlisted, as a .csv is."""
    root = tmp_path / "ct"
    for i in range(4):
        save(ct_dataset(ct_pixels(seed=i), PatientID=f"P{i}"), root / f"slice{i}.dcm")
    one = (root / "slice0.dcm").read_bytes()
    for name in ("slice4.dcm.gz", "IM0005.gz", "1.2.840.113619.2.55.3.9.gz"):  # the last two: told by their bytes
        (root / name).write_bytes(gzip.compress(one))
    for name in [*COMPRESSED_DICOM[2:-1], *ARCHIVES, *NOT_DICOM]:
        (root / name).write_bytes(b"\x1f\x8b not read" * 20)
    job = _job(tmp_path, root)
    result = packer.validate(job, scheduler="sync", progress=False)
    left = {Path(r["path"]).name: (r["why"], r["detail"]) for r in result.report["excluded"]["records"]}
    assert sorted(left) == sorted(COMPRESSED_DICOM + ARCHIVES)
    assert {why for why, _ in left.values()} == {"unsupported_format"}
    assert result.report["inputs"] == {"files": 4 + len(left), "samples": 4}
    assert result.report["bad_samples"]["total"] == 0
    assert result.report["excluded"]["by_why"] == {"unsupported_format": len(left)}

    dcm_gz = left["slice4.dcm.gz"][1]
    assert dcm_gz.startswith("a DICOM file compressed with gzip (.gz), which packer does not read")
    assert "decompress it where it lies (e.g. gunzip *.gz in its folder)" in dcm_gz
    assert left["IM0005.gz"][1] == dcm_gz  # an export's extension-less image, gzipped
    assert left["slice6.dcm.bz2"][1].startswith("a DICOM file compressed with bzip2 (.bz2)")
    assert "unzstd --rm *.zst" in left["slice8.dcm.zst"][1]
    assert left["series.zip"][1].startswith("a zip archive (.zip), whose files packer does not read")
    assert "unpack it into a folder under the root (e.g. unzip ARCHIVE -d FOLDER)" in left["series.zip"][1]
    assert left["series.tar.gz"][1].startswith("a gzip-compressed tar archive (.tar.gz)")
    assert left["more.tgz"][1].startswith("a gzip-compressed tar archive (.tgz)")
    assert "tar -xf ARCHIVE -C FOLDER" in left["plain.tar"][1]
    assert left["b.7z"][1].startswith("a 7-Zip archive") and left["c.rar"][1].startswith("a RAR archive")
    assert left["d.tar.zst"][1].startswith("a Zstandard-compressed tar archive (.tar.zst)")

    # the build counts them as validate does
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert run.exit_code == 0, run.output
    manifest = json.loads(next((tmp_path / "out").rglob("manifest.json")).read_text())
    assert manifest["inputs"]["files"] == 4 + len(left) and manifest["inputs"]["samples"] == 4
    assert manifest["inputs"]["excluded"] == {"unsupported_format": len(left)}


def test_compressed_images_and_archives_in_an_image_source_are_left_out_saying_to_decompress_or_unpack(
        tmp_path: Path) -> None:
    root = tmp_path / "raw"
    root.mkdir()
    ok, png = cv2.imencode(".png", np.zeros((8, 8), np.uint8))
    assert ok
    (root / "a.png").write_bytes(png.tobytes())
    (root / "b.png.gz").write_bytes(gzip.compress(png.tobytes()))
    for name in ("c.webp.xz", "more.zip", "photos.tar.gz", "labels.csv.gz", "h.nii.gz", "notes.txt"):
        (root / name).write_bytes(b"not read")
    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(root), "label": "none"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert [ref.relpath for ref in found.refs] == ["a.png"] and found.issues == []
    left = {Path(e.path).name: (e.why, e.detail) for e in found.excluded}
    assert sorted(left) == ["b.png.gz", "c.webp.xz", "more.zip", "photos.tar.gz"]
    assert {why for why, _ in left.values()} == {"unsupported_format"}
    assert left["b.png.gz"][1].startswith("an image compressed with gzip (.gz), which packer does not read")
    assert "gunzip *.gz" in left["b.png.gz"][1]
    assert left["c.webp.xz"][1].startswith("an image compressed with xz (.xz)")
    assert left["more.zip"][1].startswith("a zip archive (.zip), whose files packer does not read: an image source")
    assert left["photos.tar.gz"][1].startswith("a gzip-compressed tar archive (.tar.gz)")


def _pets(folder: Path, name: str = "pets", output: str = "data/packed") -> Path:
    """An image job over ``folder/data`` (12 PNGs in two class folders) whose output lies under its root."""
    data = folder / "data"
    for i in range(12):
        path = data / ("cat" if i % 2 else "dog") / f"{i}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(path), np.random.default_rng(i).integers(0, 255, (16, 16, 3), dtype=np.uint8))
    doc = {"name": name, "sources": [{"kind": "image", "root": "data", "label": "folder"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "pack": {"format": "webdataset"}, "output": output, "validate": {"max_bad_fraction": 0.5}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_job_whose_output_lies_under_its_root_never_lists_its_own_shards(tmp_path: Path) -> None:
    """output: data/packed under root: data. A rebuild listed the first build's shards
    (data/packed/pets/<version>/train-000000.tar) as archives to unpack, so each rebuild of the same
    raw files made a new version with a growing input count. The job's output folder is no input."""
    job = _pets(tmp_path)
    first = packer.build(job, scheduler="sync", progress=False, report=False)
    second = packer.build(job, scheduler="sync", progress=False, report=False)
    assert first.data["inputs"] == {"files": 12, "samples": 12}
    assert second.data["inputs"] == first.data["inputs"]
    assert second.data["version"] == first.data["version"]
    assert list((tmp_path / "data" / "packed" / "pets" / first.data["version"]).glob("*.tar"))
    found = discover(load_job(job))
    assert not [ref.relpath for ref in found.refs if ref.relpath.startswith("packed/")]
    assert found.excluded == [] and found.issues == [] and found.warnings == []


def test_a_root_that_is_the_jobs_own_dataset_folder_keeps_its_raw_files(tmp_path: Path) -> None:
    """name: data, output: the folder above it, so the raw root is the job's dataset folder
    ``<output>/<name>`` and versions land beside the raw class folders. Skipping the job's own
    output folder whole skipped every raw file ("no image files under ... Check the root"); only
    its version folders are output."""
    job = _pets(tmp_path, name="data", output=str(tmp_path))
    first = packer.build(job, scheduler="sync", progress=False, report=False)
    second = packer.build(job, scheduler="sync", progress=False, report=False)
    assert first.data["inputs"] == {"files": 12, "samples": 12}
    assert second.data["inputs"] == first.data["inputs"] and second.data["version"] == first.data["version"]
    found = discover(load_job(job))
    assert len(found.refs) == 12 and found.excluded == [] and found.warnings == []


def test_another_jobs_version_folder_under_the_root_is_skipped_and_said_once_without_unpack_advice(
        tmp_path: Path) -> None:
    """A version folder of packer's (manifest.json and _index.parquet beside its shards) under a
    root, built by another job or moved there, holds a build's output, not raw files: its .tar
    shards are not archives to unpack. It is skipped, and one warning says so."""
    packer.build(_pets(tmp_path, "old", output=str(tmp_path / "elsewhere")), scheduler="sync", progress=False,
                 report=False)
    old = next((tmp_path / "elsewhere" / "old").iterdir())
    shutil.copytree(old, tmp_path / "data" / "archive" / "old" / old.name)
    found = discover(load_job(_pets(tmp_path, output=str(tmp_path / "out"))))
    assert len(found.refs) == 12 and found.excluded == [] and found.issues == []
    said = [w for w in found.warnings if "packer" in w and "version" in w]
    assert len(said) == 1, found.warnings
    assert f"archive/old/{old.name}" in said[0] and "unpack" not in said[0]


def test_a_compressed_file_under_a_dicom_source_is_called_a_dicom_file_only_by_its_bytes_or_a_dicom_name(
        tmp_path: Path) -> None:
    """A receiver's rotated logs beside its export (storescp.log.1.gz, syslog.2.gz, README.gz) were
    called "a DICOM file compressed with gzip": a name without a suffix, or ending in digits, was
    read as an export's image. A .gz, .bz2 or .xz is now one where its first decompressed bytes
    carry DICM at byte 128, or its name decompressed has a DICOM suffix; a .zst (no decoder in
    the standard library) where its name is a UID or has a DICOM suffix. Any other stays
    unlisted, as a .log does: a stream that does not decompress too."""
    import bz2
    import lzma

    images = _export(tmp_path / "export", patients=3)
    one = (images / "IM0000").read_bytes()
    big = bytes(np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8))  # bzip2 decodes whole blocks
    called = {"IM0005.gz": gzip.compress(one), "1.2.840.113619.2.55.3.9.gz": gzip.compress(one),
              "IM0006.bz2": bz2.compress(one[:128] + b"DICM" + big), "IM0007.xz": lzma.compress(one),
              "broken.dcm.gz": b"\x1f\x8b cut short", "1.2.840.113619.2.55.3.10.zst": b"(\xb5/\xfd not read",
              "scan.ima.zst": b"(\xb5/\xfd not read"}
    log = b"I: Association Received\n" * 40
    unlisted = {"storescp.log.1.gz": gzip.compress(log), "syslog.2.gz": gzip.compress(log),
                "README.gz": gzip.compress(log), "VERSION.bz2": bz2.compress(log), "messages.3.xz": lzma.compress(log),
                "IM0008.gz": b"\x1f\x8b not a gzip stream" * 10, "IM0009.zst": b"(\xb5/\xfd not read",
                "storescp.log.4.zst": b"(\xb5/\xfd not read", "empty.gz": b""}
    for name, data in {**called, **unlisted}.items():
        (images / name).write_bytes(data)
    found = discover(load_job(_job(tmp_path, tmp_path / "export")))
    assert sorted(Path(ref.path).name for ref in found.refs) == ["IM0000", "IM0001", "IM0002"]
    left = {Path(e.path).name: e.detail for e in found.excluded}
    assert sorted(left) == sorted(called)
    assert all(d.startswith("a DICOM file compressed with ") for d in left.values())
    assert left["IM0006.bz2"].startswith("a DICOM file compressed with bzip2 (.bz2)")
