"""packer validate agrees with packer build, or says where it cannot.

A check that passes where the build of the same job fails (exit 4) is worse than no check: CI
goes green and the build breaks later. Each test here plants the case on real files, runs the
build and the check, and holds the check to the build's verdict, or to saying (``skipped``,
``passed: null``) the part it could not judge.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import nibabel as nib
import numpy as np
import pydicom
import pytest

import packer.pipeline.stages as stages
from packer.config import load_job
from packer.demo import write_ct_slice
from packer.errors import LeakageError
from packer.pipeline.datacheck import format_summary, summary, validate_job, write_junit
from tests.helpers import write_job
from tests.test_label_conflicts import _keys, _leakage, _mask_tree, _source
from tests.test_nifti import AFFINE, nifti_job, phantom, save
from tests.test_targets import _build, _job, _photo


def _scratch(work: Path) -> list[Path]:
    """What a check left in the work folder: its scratch folders (signatures, masks)."""
    return sorted(work.glob("packer-signatures-*")) if work.is_dir() else []


def _mask_job(tmp: Path, policy: str) -> Path:
    raw, _ = _mask_tree(tmp)
    source = {**_source(raw), "label": "none", "mask": {"column": "mask", "classes": [0, 1]}}
    return _job(tmp, [source], transform={"image": {}},
                split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_conflict": policy}})


def test_full_validate_compares_masks_as_the_build_does_and_fails_where_it_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two byte-identical images whose masks draw different structures: the build compares the
    masks (its spill holds them) and fails under ``label_conflict: fail``; the full check must
    compare them too, count the same group, exit 4 and print the rule as failed, keeping the
    masks only for the run (its scratch folder is gone after)."""
    work = tmp_path / "work"
    monkeypatch.setenv("PACKER_WORK_DIR", str(work))
    job = _mask_job(tmp_path, "fail")
    keys = _keys(job)
    with pytest.raises(LeakageError):
        _build(job)
    built = next((tmp_path / "out").rglob("leakage.json"))
    built_rule = _leakage(built.parent)["rules"]["label_conflicts"]
    assert built_rule["masks_compared"] is True and built_rule["count"] == 1
    before = _scratch(work)

    result = validate_job(load_job(job), scheduler="sync", quiet=True)
    rule = summary(result)["audit"]["rules"]["label_conflicts"]
    assert rule["masks_compared"] is True
    assert rule["count"] == built_rule["count"] == 1 and rule["passed"] is False
    (finding,) = rule["findings"]
    assert {s["key"] for s in finding["samples"]} == {keys["img/0.png"], keys["img/copy_far.png"]}
    assert finding["mask_dice"] == built_rule["findings"][0]["mask_dice"]
    assert result.exit_code == LeakageError.exit_code == 4
    assert "[FAIL] label_conflicts: 1" in format_summary(result)
    assert _scratch(work) == before  # the masks lived for the run only


def test_full_validate_leaves_out_the_groups_drop_group_leaves_out(tmp_path: Path) -> None:
    """``label_conflict: drop_group``: the check leaves out the members the build leaves out."""
    job = _mask_job(tmp_path, "drop_group")
    keys = _keys(job)
    _build(job)
    result = validate_job(load_job(job), scheduler="sync", quiet=True)
    dropped = {e.sample_id for e in result.prepared.excluded if e.why == "label_conflict"}
    assert dropped == {keys["img/0.png"], keys["img/copy_far.png"]}
    assert result.exit_code == 0


def test_the_masks_scratch_is_removed_when_the_check_stops_midway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt while the masks are compared (Ctrl-C) leaves no scratch folder behind."""
    work = tmp_path / "work"
    monkeypatch.setenv("PACKER_WORK_DIR", str(work))
    job = _mask_job(tmp_path, "fail")
    seen: list[list[Path]] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        seen.append(sorted(p for folder in _scratch(work) for p in folder.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "find_label_conflicts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate_job(load_job(job), scheduler="sync", quiet=True)
    assert seen and any(p.name.endswith(".masks") for p in seen[0])  # the masks were there while compared
    assert _scratch(work) == []


# -- split_balance under --quick: groups joined by copies need pixels ---------------------------------------------


def _collapsing_tree(tmp: Path) -> Path:
    """Ten patients of two photos each, and one template image filed under four of them: the
    build's exact-copy links join those four patients into one split group of 12 of 24 samples
    (50%, over the default max_group_share of 20%)."""
    raw = tmp / "raw"
    rows = ["path,label,entity"]
    for p in range(10):
        for k in range(2):
            _photo(raw / f"p{p}_{k}.png", 2 * p + k)
            rows.append(f"p{p}_{k}.png,{'a' if k else 'b'},P{p}")
    _photo(raw / "shared_0.png", 99)
    for p in range(4):
        if p:
            shutil.copyfile(raw / "shared_0.png", raw / f"shared_{p}.png")
        rows.append(f"shared_{p}.png,a,P{p}")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    return _job(tmp, [{**_source(raw), "label": {"column": "label"}}],
                split={"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 3})


def test_quick_never_passes_split_balance_it_cannot_judge_without_duplicate_links(tmp_path: Path) -> None:
    """The build fails split_balance (one group of four patients, joined by copies of one image,
    holds half the samples); --quick links no copies, so its groups are the patients alone: it
    says the rule was partly run (passed null, its reason; [skip] in the summary, <skipped> in
    JUnit), never ``[  ok]``, and its opening line names the missing links as a cause of
    differences."""
    job = _collapsing_tree(tmp_path)
    with pytest.raises(LeakageError):
        _build(job)
    built = _leakage(next((tmp_path / "out").rglob("leakage.json")).parent)["rules"]["split_balance"]
    assert built["passed"] is False and built["findings"][0]["reason"] == "group"
    assert validate_job(load_job(job), scheduler="sync", quiet=True).exit_code == 4

    quick = validate_job(load_job(job), quick=True, scheduler="sync", quiet=True)
    rule = summary(quick)["audit"]["rules"]["split_balance"]
    assert rule["passed"] is None and "duplicate" in rule["skipped"] and "--quick" in rule["skipped"]
    text = format_summary(quick)
    (line,) = [line for line in text.splitlines() if "split_balance:" in line]
    assert line.lstrip().startswith("[skip] split_balance: partly run")
    assert "duplicate links" in text.splitlines()[0]
    assert "split_balance partly run" in text.splitlines()[-1]
    junit = tmp_path / "junit.xml"
    write_junit(quick, junit)
    (case,) = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "split_balance"]
    assert case.find("skipped") is not None and case.find("failure") is None


# -- header-derived warnings under --quick -----------------------------------------------------------------------


def _uid_job(tmp: Path) -> Path:
    """Four patients' CT slices; P0's first file saved again under P3 with its SOP Instance UID kept."""
    raw = tmp / "raw"
    rng = np.random.default_rng(2)
    for p in range(4):
        for k in range(2):
            write_ct_slice(raw / f"P{p}" / f"IM{k}.dcm", patient_id=f"P{p}", study_date="20230101",
                           pixels_hu=rng.normal(0, 200, (16, 16)), instance_number=k + 1, slice_location_mm=3.0 * k)
    ds = pydicom.dcmread(raw / "P0" / "IM0.dcm")
    ds.PatientID = "P3"
    ds.save_as(raw / "P3" / "IMX.dcm")
    return write_job(tmp / "job", {
        "name": "uids", "sources": [{"kind": "dicom", "root": str(raw), "label": "none"}],
        "split": {"by": "entity", "ratios": {"train": 1.0}},
        "transform": {"dicom": {"windows": ["lung"], "size": [16, 16]}},
        "pack": {"format": "webdataset"}, "output": str(tmp / "out"), "phi": {"mode": "keep"}})


def test_quick_warns_of_one_sop_instance_uid_in_two_patients_files_from_the_header(tmp_path: Path) -> None:
    """The UID is a header value: --quick warns of it as the full check does, naming the same
    patients and samples, and says the pixels were not compared rather than guessing."""
    job = load_job(_uid_job(tmp_path))
    full = [w for w in summary(validate_job(job, scheduler="sync", quiet=True))["warnings"]
            if w["code"] == "instance_uids"]
    quick = [w for w in summary(validate_job(job, quick=True, scheduler="sync", quiet=True))["warnings"]
             if w["code"] == "instance_uids"]
    assert len(full) == len(quick) == 1
    named, pixels = full[0]["message"].split(", with ")
    assert "samples of P3 (" in named and "P0 (" in named and pixels.startswith("the same pixels;")
    assert quick[0]["message"].startswith(f"{named}, with pixels not compared (headers only);")


def test_quick_warns_of_a_nifti_files_sform_and_qform_disagreeing_from_its_header(tmp_path: Path) -> None:
    """The two forms are header fields: --quick prints the readers warning the full check prints."""
    root = tmp_path / "raw"
    save(root / "a.nii.gz", phantom())
    path = save(root / "b.nii.gz", phantom(seed=1))
    img = nib.load(path)
    moved = AFFINE.copy()
    moved[:3, 3] += [0, 8.0, 0]
    img.header.set_qform(moved, code=1)
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), None, header=img.header), path)
    job = load_job(nifti_job(tmp_path, ["a.nii.gz,P1", "b.nii.gz,P2"]))
    full, quick = ([w["message"] for w in summary(validate_job(job, quick=q, scheduler="sync", quiet=True))["warnings"]
                    if w["code"] == "readers"] for q in (False, True))
    assert len(full) == 1 and "sform and qform differ by up to 8 mm; the sform is used" in full[0]
    assert quick == full
