"""The demo's annotated jobs (``workflows/annotated-*.yaml``) on the demo tree: one job file, no
conversion step, and masks equal to the planted structures (:func:`packer.demo_annotations.truth_labels`)
up to the boundary of the RTSTRUCT's 72-gons against the exact ellipses they approximate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.demo_annotations import CLASSES, PATIENTS, truth_labels
from packer.htmlreport import render_html_report
from packer.inspection import format_summary, inspect_dataset
from packer.loader import ShardDataset
from packer.phi import pseudonymizer_for
from packer.pipeline.discover import make_sample_id
from packer.verify import verify_dataset
from tests.demo_version import REPO
from tests.test_targets import _build

pytestmark = pytest.mark.slow


def _job(tmp: Path, demo_raw: Any, name: str) -> Path:
    """``workflows/<name>.yaml`` copied beside a link to the demo tree, as `make demo` lays them out."""
    (tmp / "workflows").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "workflows" / f"{name}.yaml", tmp / "workflows")
    if not (tmp / "demo-raw").exists():
        (tmp / "demo-raw").symlink_to(demo_raw.root)
    return tmp / "workflows" / f"{name}.yaml"


def _items(manifest: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for split in ("train", "valid", "test"):
        for item in ShardDataset(manifest, split, shuffle=False):
            out[item["key"]] = item
    return out


def _slices_by_key(job: Path, root: Path) -> dict[str, tuple[str, int]]:
    """Each CT file's sample key → (patient, its index in ascending z)."""
    phi = pseudonymizer_for(load_job(job).phi)
    out = {}
    for patient in PATIENTS:
        files = sorted((root / patient / "CT").glob("*.dcm"),
                       key=lambda p: float(pydicom.dcmread(p, stop_before_pixels=True).ImagePositionPatient[2]))
        for k, path in enumerate(files):
            out[make_sample_id("annotated", path.relative_to(root).as_posix(), phi)] = (patient, k)
    return out


def _agree(mask: np.ndarray, truth: np.ndarray) -> None:
    """Every SEG class exactly; the rest on all but the RTSTRUCT polygons' boundary pixels."""
    for cid in (CLASSES["liver"], CLASSES["tumour"]):
        assert np.array_equal(mask == cid, truth == cid), cid
    assert np.mean(mask == truth) > 0.97


def test_the_slice_job_packs_every_planted_structure_and_refuses_the_broken(tmp_path: Path, demo_raw: Any) -> None:
    job = _job(tmp_path, demo_raw, "annotated-slices")
    result = _build(job)
    manifest = json.loads(result.manifest_path.read_text())
    root = demo_raw.root / "annotated"
    keys = _slices_by_key(job, root)
    items = _items(result.manifest_path)
    assert manifest["inputs"]["samples"] == 24 + 20 + 12  # ANN004's 6 slices are refused with their reason
    bad = {Path(b["path"]).relative_to(root).as_posix(): b["reason"]
           for b in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert bad.pop("broken/orphan_seg.dcm") == "annotation_orphan"
    assert bad.pop("broken/offslice_rtstruct.dcm") == "contour_off_slice"
    assert set(bad.values()) == {"contour_off_slice"} and {p.split("/")[0] for p in bad} == {"ANN004"}
    assert len(bad) == 6
    excluded = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert sorted(e["why"] for e in excluded) == ["annotation"] * 4
    assert manifest["mask"]["names"]["5"]["name"] == "tumour"
    assert verify_dataset(result.manifest_path, deep=True).ok
    truths = {p: truth_labels(0, p) for p in ("ANN001", "ANN003")}
    for key, item in items.items():
        patient, k = keys[key]
        if patient in truths:  # 64×64 as stored: no resize
            _agree(item["mask"].numpy()[0], truths[patient][k])
    assert "Dr Smith" not in (result.version_dir / "manifest.json").read_text()
    report = render_html_report(result.version_dir)
    assert "5 tumour" in report and "Dr Smith" not in report  # the overlay legend names the classes
    assert "4 liver, 5 tumour" in format_summary(inspect_dataset(result.manifest_path))


def test_the_stack_and_volume_jobs_carry_the_same_masks(tmp_path: Path, demo_raw: Any) -> None:
    stacks = _build(_job(tmp_path, demo_raw, "annotated-stacks"))
    root = demo_raw.root / "annotated"
    keys = _slices_by_key(tmp_path / "workflows" / "annotated-stacks.yaml", root)
    truth = truth_labels(0, "ANN001")
    seen = 0
    for key, item in _items(stacks.manifest_path).items():
        patient, k = keys[key]
        if patient == "ANN001":
            _agree(item["mask"].numpy()[0], truth[k])  # the centre slice's
            seen += 1
    assert seen == 24
    volumes = _build(_job(tmp_path, demo_raw, "annotated-volume"))
    manifest = json.loads(volumes.manifest_path.read_text())
    assert manifest["mask"]["layout"] == "DHW"
    assert verify_dataset(volumes.manifest_path, deep=True).ok
    masks = [item["mask"].numpy() for item in _items(volumes.manifest_path).values()]
    assert len(masks) == 3  # ANN001, ANN002, ANN003 (ANN004 refused)
    present = sorted(tuple(int(c) for c in np.unique(m)) for m in masks)
    assert present[0] == (0,) and present[1] == present[2] == (0, 1, 2, 3, 4, 5)
