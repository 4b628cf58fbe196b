"""Volumes of formats a NIfTI source does not read are left out as ``unsupported_format``, never unsaid.

A ``kind: nifti`` source lists ``*.nii`` and ``*.nii.gz``. An NRRD, MetaImage, MGH, MINC or
Analyze ``.hdr``/``.img`` file beside them (3D Slicer saves NRRD, FreeSurfer MGZ, older tools the
Analyze pair) was not listed at all: never a bad sample, never in ``excluded.jsonl``, so a set
that was partly NRRD lost those cases without a word. Each such file is now an ``excluded.jsonl``
record saying what it is and how to convert it to NIfTI, counted by ``packer validate`` and the
build; one record per file, so an Analyze pair gives two (its ``.img`` names the ``.hdr`` whose
conversion carries it). Files that are no volume (``dataset.json``, ``README.txt``) stay unlisted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import nibabel as nib
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

VOLUMES = ["imagesTr/case0.nii.gz", "imagesTr/case1.nii.gz", "imagesTr/case2.nii", "imagesTr/case3.nii.gz"]
#: Files of other volume formats, as a converted or half-converted set holds them (a capital suffix
#: is the same format). Their bytes are not read: the name alone decides, so any bytes will do.
OTHERS = ["imagesTr/case4.nrrd", "imagesTr/case5.MHA", "imagesTr/case6.mgz", "old/case7.hdr", "old/case7.img"]


def _volume(path: Path, seed: int) -> None:
    """A real NIfTI file (nibabel writes it), 8×8×4 int16 voxels of 1×1×2 mm, different per seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(seed).normal(0, 100, (8, 8, 4)).astype(np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([1.0, 1.0, 2.0, 1.0])), str(path))


def _tree(root: Path) -> None:
    for i, rel in enumerate(VOLUMES):
        _volume(root / rel, i)
    for rel in OTHERS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"NRRD0004\n" if rel.endswith(".nrrd") else b"not read")
    (root / "dataset.json").write_text('{"name": "four cases"}\n')
    (root / "README.txt").write_text("cases\n")


def _job(tmp_path: Path, root: Path) -> Path:
    doc: dict[str, Any] = {
        "name": "volumes", "sources": [{"kind": "nifti", "root": str(root), "label": "none"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"nifti": {"windows": [{"center": 0, "width": 400}], "sample": "volume", "output": "uint8"}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "validate": {"max_bad_fraction": 0.0}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_only_the_nifti_files_are_refs_and_each_other_volume_is_left_out_saying_how_to_convert(
        tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _tree(root)
    found = discover(load_job(_job(tmp_path, root)))
    assert sorted(ref.relpath for ref in found.refs) == sorted(VOLUMES)
    assert found.issues == []
    detail = {Path(e.path).relative_to(root).as_posix(): (e.why, e.detail) for e in found.excluded}
    assert sorted(detail) == sorted(OTHERS)  # dataset.json and README.txt are no volumes: unlisted
    assert {why for why, _ in detail.values()} == {"unsupported_format"}
    nrrd, mha, mgz = (detail[f"imagesTr/case{i}"][1] for i in ("4.nrrd", "5.MHA", "6.mgz"))
    assert nrrd.startswith("an NRRD volume (.nrrd, 3D Slicer's format), which packer does not read (NIfTI sources "
                           "read .nii and .nii.gz files); convert it to NIfTI")
    assert "sitk.WriteImage(sitk.ReadImage(p), p_out)" in nrrd and "c3d" in nrrd and "plastimatch" in nrrd
    assert mha.startswith("a MetaImage volume (.mha, ITK)") and "sitk.WriteImage" in mha
    assert mgz.startswith("an MGH volume (.mgz, FreeSurfer)") and "mri_convert p.mgz p_out.nii.gz" in mgz
    # one record per file of an Analyze pair: the voxel half points at its header
    assert detail["old/case7.hdr"][1].startswith("the header of an Analyze 7.5 or NIfTI-1 .hdr/.img pair")
    assert detail["old/case7.img"][1].startswith("the voxels of an Analyze 7.5 or NIfTI-1 .hdr/.img pair (its "
                                                 "header is the .hdr of the same name)")


def test_validate_counts_them_as_left_out_not_bad(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _tree(root)
    out = tmp_path / "validate.json"
    run = CliRunner().invoke(main, ["validate", str(_job(tmp_path, root)), "--scheduler", "sync", "-q",
                                    "--json", str(out)])
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert doc["inputs"]["files"] == 4 + 5 and doc["bad_samples"]["total"] == 0
    assert doc["excluded"]["total"] == 5 and doc["excluded"]["by_why"] == {"unsupported_format": 5}
    assert {r["path"] for r in doc["excluded"]["records"]} == {str(root / rel) for rel in OTHERS}
    assert "left out on purpose: 5 (unsupported_format 5); not bad samples" in run.output


def test_the_build_lists_them_in_excluded_jsonl_by_its_schema(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _tree(root)
    version = build(load_job(_job(tmp_path, root)), BuildOptions(scheduler="sync", quiet=True)).version_dir
    records = read_excluded(version / EXCLUDED_FILE)
    assert sorted(Path(r["path"]).relative_to(root).as_posix() for r in records) == sorted(OTHERS)
    validator = jsonschema.Draft202012Validator(load_schema("excluded"))
    for record in records:
        validator.validate(record)
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["inputs"]["samples"] == 4 and manifest["inputs"]["excluded"] == {"unsupported_format": 5}


def test_a_nifti_compressed_other_than_with_gzip_is_told_to_recompress_and_dicom_stays_unclaimed(
        tmp_path: Path) -> None:
    root = tmp_path / "raw"
    _volume(root / "a.nii.gz", 0)
    for name in ("b.nii.bz2", "c.nii.zst", "d.dcm", "e.bz2", "f.json"):
        (root / name).write_bytes(b"not read")
    found = discover(load_job(_job(tmp_path, root)))
    assert [ref.relpath for ref in found.refs] == ["a.nii.gz"]
    detail = {Path(e.path).name: e.detail for e in found.excluded}
    assert sorted(detail) == ["b.nii.bz2", "c.nii.zst"]  # a .dcm is the DICOM kind's; e.bz2 is no NIfTI file
    assert detail["b.nii.bz2"].startswith("a NIfTI file compressed with bzip2 (.bz2)")
    assert detail["c.nii.zst"].endswith("decompress it and gzip it (or keep the .nii)")


def test_a_root_of_nrrd_files_only_says_what_it_found_and_how_to_convert(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    for i in range(3):
        (root / f"case{i}.nrrd").parent.mkdir(parents=True, exist_ok=True)
        (root / f"case{i}.nrrd").write_bytes(b"NRRD0004\n")
    with pytest.raises(ConfigError) as raised:
        discover(load_job(_job(tmp_path, root)))
    message = str(raised.value)
    assert f"no nifti files under {root}" in message
    assert "It found 3 file(s) of formats it does not read (3 .nrrd): an NRRD volume (.nrrd" in message
    assert "sitk.WriteImage" in message
