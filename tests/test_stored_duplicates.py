"""A DICOM file saved again under another patient is an exact duplicate, however it is windowed.

With ``windows: [file]`` each copy is rendered with its own window tags, so a copy re-saved with
other tags (and new UIDs) packs other pixels than its source; near-copy verification compares
what is packed and can miss it. The stored pixels both were rendered from are the same: the
split keeps the two together and the audit lists them as exact duplicates."""

from __future__ import annotations

import csv
from pathlib import Path

import pydicom
import pytest
import yaml
from pydicom.uid import generate_uid

from packer.config import load_job
from packer.demo import write_copies_tree
from packer.pipeline.cluster import open_executor
from packer.pipeline.stages import run_stages


def _resave(source: Path, target: Path, patient: str, center: float, width: float) -> None:
    ds = pydicom.dcmread(source)
    ds.PatientID = ds.PatientName = patient
    ds.WindowCenter, ds.WindowWidth = center, width
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SeriesInstanceUID, ds.StudyInstanceUID = generate_uid(), generate_uid()
    target.parent.mkdir(parents=True)
    ds.save_as(target)


@pytest.mark.parametrize("near", [False, True], ids=["near copies off", "near copies on"])
def test_a_rewindowed_copy_under_another_patient_is_kept_with_its_source_and_reported(
        tmp_path: Path, near: bool) -> None:
    tree = write_copies_tree(tmp_path / "raw", patients=16, copies=0, slices=2, size=64, seed=4)
    ct = tree.root / "ct"
    source = sorted((ct / "PAT0007").glob("*.dcm"))[1]
    _resave(source, ct / "CPY0001" / "IM001.dcm", "CPY0001", -600.0, 1500.0)
    with open(tree.root / "ct_labels.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    label = next(r["label"] for r in rows if r["path"] == source.relative_to(ct).as_posix())
    with open(tree.root / "ct_labels.csv", "a", newline="") as fh:
        csv.writer(fh).writerow(["CPY0001/IM001.dcm" if k == "path" else label for k in rows[0]])
    doc = {"name": "rewindowed",
           "sources": [{"kind": "dicom", "root": str(ct), "labels": str(tree.root / "ct_labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                     "near_duplicates": {"enabled": near}},
           "transform": {"dicom": {"windows": ["file"], "size": [64, 64]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "phi": {"mode": "keep"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    with open_executor("sync") as executor:
        prepared = run_stages(load_job(tmp_path / "job.yaml"), executor, through="audit",
                              cache_dir=tmp_path / "cache", quiet=True).prepared
    table = prepared.samples
    relpaths = table.column("relpath")
    copy, original = relpaths.index("CPY0001/IM001.dcm"), relpaths.index(source.relative_to(ct).as_posix())
    assert table.column("sha256")[copy] != table.column("sha256")[original]  # other window: other pixels
    assert table.column("stored_digest")[copy] == table.column("stored_digest")[original]
    keys = table.column("key")
    split_of = prepared.assignment.split
    assert split_of[keys[copy]] == split_of[keys[original]]
    within = prepared.audit.rule("exact_duplicates_within_split")
    assert {keys[copy], keys[original]} in [{s["key"] for s in finding["samples"]} for finding in within.findings]
    assert prepared.audit.rule("exact_duplicates_across_splits").count == 0
