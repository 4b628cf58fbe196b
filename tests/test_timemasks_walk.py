"""Annotations (SEG, RTSTRUCT) of DICOM series in the header pass: what an annotation's record says
when its series was refused before series assembly, and what ``validate --quick`` lists of a used one.

Real files: CT series written with pydicom, a SEG with highdicom's writer, an RTSTRUCT with pydicom
(:mod:`tests.test_dicom_masks`); every check runs the real pipeline (``packer validate``'s stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydicom
import pytest
import yaml

from packer.config import load_job
from packer.exclusions import exclusion_counts
from packer.pipeline.datacheck import validate_job
from packer.records import Issue
from tests.test_dicom_masks import (
    RTSTRUCT_ROIS,
    SEGMENTS,
    SLICES,
    _annotated_tree,
    _mask_job,
    _write_series,
    write_seg,
)

TIME_SPLIT = {"by": "time", "cutoffs": {"valid": "2030-01-01", "test": "2031-01-01"}, "balance": {"accept": True}}


def _rewrite(folder: Path, **attrs: Any) -> None:
    """Set ``attrs`` in every file under ``folder`` (its annotations were written from the files before)."""
    for path in sorted(folder.glob("*.dcm")):
        ds = pydicom.dcmread(path)
        for keyword, value in attrs.items():
            setattr(ds, keyword, value)
        ds.save_as(path)


def _by_name(raw: Path, issues: tuple[Issue, ...] | list[Issue]) -> dict[str, list[Issue]]:
    out: dict[str, list[Issue]] = {}
    for issue in issues:
        out.setdefault(str(Path(issue.path).relative_to(raw).parent), []).append(issue)
    return out


def _with_split(job_path: Path, split: dict[str, Any]) -> Path:
    doc = yaml.safe_load(job_path.read_text())
    doc["split"] = split
    job_path.write_text(yaml.safe_dump(doc))
    return job_path


@pytest.mark.parametrize(("attrs", "reason", "split"), [
    ({"StudyDate": ""}, "missing_time", TIME_SPLIT),
    ({"PatientID": ""}, "missing_entity", None),
    ({"BurnedInAnnotation": "YES"}, "burned_in_annotation", None),  # a header check's refusal, as well
], ids=["missing_time", "missing_entity", "burned_in"])
@pytest.mark.parametrize(("sample", "quick"), [("volume", False), ("slice", False), ("volume", True)],
                         ids=["volume", "slice", "volume-quick"])
def test_an_annotation_of_a_series_the_probe_refused_whole_gets_the_series_reason_not_an_orphans(
        tmp_path: Path, attrs: dict[str, str], reason: str, split: dict[str, Any] | None, sample: str,
        quick: bool) -> None:
    """Every file of patient A's series is refused by the header pass (no StudyDate under a time
    split, no PatientID, burned-in text), so no series of it is assembled. Its SEG and RTSTRUCT are
    there with it: each gets the series' reason and names a refused file, never ``annotation_orphan``
    with advice to put the series under the root (it is there). Patient B's series packs."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    _rewrite(raw / "A" / "CT", **attrs)
    job_path = _mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}, sample=sample)
    job = load_job(job_path if split is None else _with_split(job_path, split))
    prepared = validate_job(job, quick=quick, scheduler="sync", quiet=True).prepared
    found = _by_name(raw, prepared.issues)
    assert {i.reason for i in found["A/CT"]} == {reason} and len(found["A/CT"]) == SLICES
    for folder in ("A/SEG", "A/RT"):
        (record,) = found[folder]
        assert record.reason == reason, record.message
        assert f"its series is refused ({reason}" in record.message
        assert "/A/CT/" in record.message  # names a file of the refused series, whose record says why
        assert "under the source's root" not in record.message
    assert "B/CT" not in found
    assert len(prepared.samples) == (1 if sample == "volume" else SLICES)  # patient B's series


def test_an_annotation_of_a_series_that_is_not_there_stays_an_orphan_beside_a_refused_one(tmp_path: Path) -> None:
    """The refused series' UIDs name only it: an annotation of a series that is not under the root
    is still ``annotation_orphan``, advising to put that series there."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    _rewrite(raw / "A" / "CT", StudyDate="")
    write_seg(raw / "C" / "SEG" / "seg.dcm", _write_series(tmp_path / "elsewhere", "PC", seed=3))
    job = load_job(_with_split(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}), TIME_SPLIT))
    found = _by_name(raw, validate_job(job, quick=True, scheduler="sync", quiet=True).prepared.issues)
    (orphan,) = found["C/SEG"]
    assert orphan.reason == "annotation_orphan"
    assert "under the source's root" in orphan.message
    assert [i.reason for i in found["A/SEG"]] == ["missing_time"]


def test_validate_quick_lists_a_used_annotation_with_its_sop_class_as_the_full_check_does(tmp_path: Path) -> None:
    """A used SEG and RTSTRUCT are listed ``annotation`` by both checks; --quick, which reads the
    header holding the SOP class, counts them by SOP class as the full check (and the build) do."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    job = load_job(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}, sample="volume"))
    quick = validate_job(job, quick=True, scheduler="sync", quiet=True).prepared.excluded
    full = validate_job(job, scheduler="sync", quiet=True).prepared.excluded

    def listed(excluded: tuple[Any, ...]) -> list[tuple[str, str, str, str]]:
        return sorted((Path(e.path).name, e.why, e.modality, e.sop_class) for e in excluded)

    assert listed(quick) == listed(full) == [("rt.dcm", "annotation", "RTSTRUCT", "RT Structure Set Storage"),
                                             ("seg.dcm", "annotation", "SEG", "Segmentation Storage")]
    assert exclusion_counts(quick) == exclusion_counts(full)
