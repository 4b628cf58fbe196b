"""Image files of formats packer does not read (WebP, GIF, ...) are left out as ``unsupported_format``.

An image source lists PNG, JPEG, TIFF and BMP files. A WebP or GIF among them was not listed at
all: never a bad sample, never in ``excluded.jsonl``, so a dataset that was partly WebP lost those
images without a word. Each is now an ``excluded.jsonl`` record saying what it is and to convert
it, counted in the manifest, the summary and ``packer validate``; files that are no image
(``README.txt``, a ``.csv``) stay unlisted, and the samples are those of the readable files alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import discover
from packer.schemas import load_schema

PNGS = ["cat/a.png", "cat/b.png", "dog/c.png", "dog/d.png"]
OTHERS = ["cat/e.webp", "dog/f.GIF"]  # a suffix in capitals is still a GIF


def _image(path: Path, seed: int) -> None:
    """A real image of ``path``'s format (OpenCV encodes PNG, WebP and GIF alike), different per seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(path.suffix.lower(), pixels)
    assert ok, path
    path.write_bytes(encoded.tobytes())


def _tree(root: Path, *, others: bool) -> None:
    for i, rel in enumerate(PNGS):
        _image(root / rel, i)
    (root / "README.txt").write_text("four photos\n")
    (root / "cat" / "notes.csv").write_text("file,note\na.png,x\n")
    if others:
        for i, rel in enumerate(OTHERS):
            _image(root / rel, 100 + i)


def _job(tmp_path: Path, root: Path, **source: Any) -> Path:
    """A job of one image source over ``root``, labelled by folder unless ``source`` says otherwise
    (``label=None``: no ``label:`` key, for a table's label column)."""
    given = {"label": "folder", **source}
    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(root),
                                          **{k: v for k, v in given.items() if v is not None}}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), "validate": {"max_bad_fraction": 0.0}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _shards(version: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(version.rglob("*.tar"))}


def test_a_webp_and_a_gif_among_pngs_are_left_out_as_unsupported_format_and_the_rest_is_unchanged(
        tmp_path: Path) -> None:
    plain, mixed = tmp_path / "plain" / "raw", tmp_path / "mixed" / "raw"
    _tree(plain, others=False)
    _tree(mixed, others=True)
    before = build(load_job(_job(tmp_path / "plain", plain)), BuildOptions(scheduler="sync", quiet=True))
    run = CliRunner().invoke(main, ["build", str(_job(tmp_path / "mixed", mixed)), "--scheduler", "sync"])
    assert run.exit_code == 0, run.output
    version = next((tmp_path / "mixed" / "out").rglob("manifest.json")).parent
    manifest = json.loads((version / "manifest.json").read_text())

    records = read_excluded(version / EXCLUDED_FILE)
    assert [(Path(r["path"]).relative_to(mixed).as_posix(), r["why"]) for r in records] == [
        ("cat/e.webp", "unsupported_format"), ("dog/f.GIF", "unsupported_format")]
    webp, gif = records
    assert webp["detail"].startswith("a WebP image (.webp), which packer does not read: image sources read PNG, "
                                     "JPEG, TIFF and BMP files (.png, .jpg, .jpeg, .tif, .tiff, .bmp); convert it "
                                     "to PNG (lossless)")
    assert "magick mogrify -format png *.webp" in webp["detail"]
    assert gif["detail"].startswith("a GIF image (.gif), which packer does not read")
    validator = jsonschema.Draft202012Validator(load_schema("excluded"))
    for record in records:
        validator.validate(record)
    # counted once each, never bad; README.txt and notes.csv are no images and stay unlisted
    assert manifest["inputs"]["files"] == 6 and manifest["inputs"]["samples"] == 4
    assert manifest["inputs"]["excluded"] == {"unsupported_format": 2}
    assert manifest["bad_samples"]["total"] == 0
    assert "6 files: 4 packed, 0 bad, 2 left out on purpose (unsupported_format 2" in run.output
    # otherwise the same dataset: the same samples, byte for byte
    assert before.manifest["inputs"]["files"] == 4 and "excluded" not in before.manifest["inputs"]
    assert not (before.version_dir / EXCLUDED_FILE).exists() or read_excluded(before.version_dir / EXCLUDED_FILE) == []
    # (the dataset_hash covers the manifest's counts, which now count the two files left out)
    assert _shards(before.version_dir) and _shards(version) == _shards(before.version_dir)


def test_validate_counts_them_the_same_way(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _tree(root, others=True)
    out = tmp_path / "validate.json"
    run = CliRunner().invoke(main, ["validate", str(_job(tmp_path, root)), "--scheduler", "sync", "-q",
                                    "--json", str(out)])
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert doc["inputs"] == {"files": 6, "samples": 4} and doc["bad_samples"]["total"] == 0
    assert doc["excluded"]["total"] == 2 and doc["excluded"]["by_why"] == {"unsupported_format": 2}
    assert {r["path"] for r in doc["excluded"]["records"]} == {str(root / rel) for rel in OTHERS}
    assert "left out on purpose: 2 (unsupported_format 2); not bad samples" in run.output


def test_other_suffixes_are_told_to_convert_or_rename_and_non_images_stay_unlisted(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _image(root / "a.png", 0)
    for name in ("b.avif", "c.heic", "d.jp2", "e.ppm", "f.jfif", "g.json", "h.nii.gz", "i"):
        (root / name).write_bytes(b"not read")
    found = discover(load_job(_job(tmp_path, root, label="none")))
    assert [ref.relpath for ref in found.refs] == ["a.png"] and found.issues == []
    detail = {Path(e.path).name: (e.why, e.detail) for e in found.excluded}
    assert sorted(detail) == ["b.avif", "c.heic", "d.jp2", "e.ppm", "f.jfif"]
    assert {why for why, _ in detail.values()} == {"unsupported_format"}
    assert detail["d.jp2"][1].startswith("a JPEG 2000 image (.jp2), which packer does not read")
    assert detail["e.ppm"][1].startswith("a Netpbm image (.ppm)")
    assert detail["f.jfif"][1].endswith("; if it is one of them, rename it to .jpg")


def test_a_table_row_naming_a_webp_is_its_exclusion_not_a_missing_file_as_well(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _image(root / "x" / "a.png", 0)
    _image(root / "x" / "b.png", 1)
    _image(root / "x" / "c.webp", 2)
    table = tmp_path / "t.csv"
    table.write_text("path,label,entity\nx/a.png,cat,E1\nx/b.png,dog,E2\nx/c.webp,cat,E3\n")
    found = discover(load_job(_job(tmp_path, root, label=None, table=str(table))))
    assert [ref.relpath for ref in found.refs] == ["x/a.png", "x/b.png"]
    assert found.issues == []
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [("c.webp", "unsupported_format")]


@pytest.mark.parametrize("named", [True, False])
def test_under_files_table_a_webp_the_table_does_not_name_is_not_in_table(tmp_path: Path, named: bool) -> None:
    root = tmp_path / "raw"
    _image(root / "a.png", 0)
    _image(root / "b.webp", 1)
    table = tmp_path / "t.csv"
    table.write_text("path,label,entity\na.png,cat,E1\n" + ("b.webp,dog,E2\n" if named else ""))
    found = discover(load_job(_job(tmp_path, root, label=None, table={"file": str(table), "files": "table"})))
    assert [ref.relpath for ref in found.refs] == ["a.png"] and found.issues == []
    assert [(Path(e.path).name, e.why) for e in found.excluded] == [
        ("b.webp", "unsupported_format" if named else "not_in_table")]


def test_a_root_of_webp_files_only_says_what_it_found_and_what_to_do(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    for i in range(3):
        _image(root / f"{i}.webp", i)
    _image(root / "3.gif", 3)
    with pytest.raises(ConfigError) as raised:
        discover(load_job(_job(tmp_path, root, label="none")))
    message = str(raised.value)
    assert f"no image files under {root}" in message
    assert "It found 4 file(s) of formats it does not read (1 .gif, 3 .webp): a WebP image (.webp)" in message
    assert "convert it to PNG" in message


def test_extension_less_files_of_a_dicom_export_that_are_not_dicom_are_left_out_saying_what_they_are(
        tmp_path: Path) -> None:
    """A PACS export names its images IMAGES/IM0001, ... with no suffix; the listing keeps those
    that start as DICOM files. An empty one (a failed export), a text one, or a data set written
    without the preamble was skipped without a word; each is now an unsupported_format record
    saying what it is. Files with another suffix (a .xml, a .log) stay unlisted."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    root = tmp_path / "pacs" / "IMAGES"
    root.mkdir(parents=True)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, ds.file_meta.MediaStorageSOPInstanceUID
    ds.PatientID, ds.Modality, ds.SpecificCharacterSet = "P1", "CT", "ISO_IR 100"
    ds.Rows = ds.Columns = 8
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.PixelData = np.zeros((8, 8), np.int16).tobytes()
    ds.save_as(root / "IM0001", enforce_file_format=True)
    (root / "IM0002").write_bytes(b"")
    (root / "IM0003").write_text("export log\n")
    ds.save_as(root / "IM0004", enforce_file_format=False)  # a data set without preamble and DICM
    # named by its SOP Instance UID, as PACS exports name files: the UID's last part reads as a suffix
    ds.save_as(root / "1.2.840.113619.2.55.3.1", enforce_file_format=False)
    (root / "LOCK.xml").write_text("<lock/>")
    doc = {"name": "pacs", "sources": [{"kind": "dicom", "root": str(tmp_path / "pacs"), "label": "none"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert [ref.relpath for ref in found.refs] == ["IMAGES/IM0001"]
    detail = {Path(e.path).name: (e.why, e.detail) for e in found.excluded}
    assert sorted(detail) == ["1.2.840.113619.2.55.3.1", "IM0002", "IM0003", "IM0004"]
    assert detail["1.2.840.113619.2.55.3.1"][1].startswith("a file that starts like a DICOM data set without")
    assert {why for why, _ in detail.values()} == {"unsupported_format"}
    assert detail["IM0002"][1].startswith("an empty file (0 bytes): among a DICOM export's extension-less images")
    assert detail["IM0003"][1].startswith("a file of 11 bytes, shorter than a DICOM file's 132-byte preamble")
    assert detail["IM0004"][1].startswith("a file that starts like a DICOM data set without the 128-byte preamble")
    assert "dcmconv +F" in detail["IM0004"][1]
