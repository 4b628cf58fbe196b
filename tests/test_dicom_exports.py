"""DICOM exports as they ship: a CT series beside an RT Dose, a report, a plan, a localizer and a screenshot.

A PACS or radiotherapy export holds objects that are no CT slice. None of them is a defect, so
none may be a bad sample, and none may be packed as CT unless the job asks: the build packs
exactly the CT originals, leaves every other file out on purpose (``excluded.jsonl``, the
manifest's ``inputs``, the report, ``packer validate``), counts every input file once, and
deletes nothing. A source's ``where:`` on header attributes asks for what the defaults leave out.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pydicom
import pytest
import yaml
from click.testing import CliRunner
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import (
    BasicTextSRStorage,
    ExplicitVRLittleEndian,
    MediaStorageDirectoryStorage,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from packer.badsamples import read_bad_samples
from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.loader import ShardDataset
from packer.read.dicom import probe_dicom
from packer.records import Excluded, Issue
from packer.schemas import load_schema
from tests.dicom_files import ct_dataset, image_dataset, make_ref, save, shipped
from tests.test_series import _key_of, _write_series
from tests.test_targets import _build, _job

CT_WINDOWS = {"windows": ["lung", "mediastinum"], "size": [16, 16]}


def write_text_sr(path: Path, patient: str) -> Path:
    """A Basic Text SR (PS3.3 A.35.1): a report with a content sequence and no image."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = BasicTextSRStorage
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.SOPClassUID = BasicTextSRStorage
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.StudyDate, ds.StudyTime, ds.Modality = patient, "20230504", "101112", "SR"
    ds.ValueType, ds.ContinuityOfContent = "CONTAINER", "SEPARATE"
    title = Dataset()
    title.CodeValue, title.CodingSchemeDesignator, title.CodeMeaning = "18748-4", "LN", "Diagnostic imaging report"
    ds.ConceptNameCodeSequence = DicomSequence([title])
    item = Dataset()
    item.RelationshipType, item.ValueType, item.TextValue = "CONTAINS", "TEXT", "No acute findings."
    ds.ContentSequence = DicomSequence([item])
    return save(ds, path)


def write_export(raw: Path) -> dict[str, Path]:
    """The mixed export: a 3-slice CT series (P1), and beside it an RT Dose (15 frames), a Basic
    Text SR, an RT Plan, a CT localizer and a secondary capture with pixels."""
    ct = _write_series(raw / "ct", slices=3, seed=1, patient="P1")
    (raw / "rt").mkdir(parents=True)
    files = {f"ct{i}": path for i, path in enumerate(sorted(ct))}
    files["dose"] = Path(shutil.copy(shipped("rtdose.dcm"), raw / "rt" / "dose.dcm"))
    files["plan"] = Path(shutil.copy(shipped("rtplan.dcm"), raw / "rt" / "plan.dcm"))
    files["sr"] = write_text_sr(raw / "reports" / "report.dcm", "P1")
    scout = np.random.default_rng(5).integers(0, 3000, (16, 16), dtype=np.int16)
    files["localizer"] = save(ct_dataset(scout, PatientID="P1", ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"]),
                              raw / "ct-scout" / "scout.dcm")
    screen = np.random.default_rng(6).integers(0, 255, (16, 16), dtype=np.uint8)
    files["capture"] = save(image_dataset(screen, modality="OT", sop_class=SecondaryCaptureImageStorage,
                                          PatientID="P1", BurnedInAnnotation="NO"), raw / "screens" / "shot.dcm")
    return files


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def export_job(tmp: Path, raw: Path, where: dict[str, Any] | None = None, **dicom: Any) -> Path:
    source: dict[str, Any] = {"kind": "dicom", "root": str(raw), "label": "none"}
    if where is not None:
        source["where"] = where
    return _job(tmp, [source], transform={"dicom": {**CT_WINDOWS, **dicom}})


def packed_keys(result: Any) -> list[str]:
    return sorted(str(item["key"]) for item in ShardDataset(result.manifest_path, "train", shuffle=False))


@pytest.fixture()
def export(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    raw = tmp_path / "raw"
    return raw, write_export(raw)


def test_a_mixed_export_packs_exactly_the_ct_originals_and_counts_every_other_file_as_left_out(
        tmp_path: Path, export: tuple[Path, dict[str, Path]]) -> None:
    raw, files = export
    before = digests(raw)
    job = export_job(tmp_path, raw)
    run = CliRunner().invoke(main, ["build", str(job), "--workers", "2"])  # a real LocalCluster: records pickle
    assert run.exit_code == 0, run.output

    manifest = json.loads(next((tmp_path / "out" / "targets").glob("*/manifest.json")).read_text())
    version = next((tmp_path / "out" / "targets").glob("*/manifest.json")).parent
    ct = sorted(files[k] for k in ("ct0", "ct1", "ct2"))
    others = {"dose": ("not_requested", "RTDOSE", "RT Dose Storage"),
              "plan": ("not_image", "RTPLAN", "RT Plan Storage"),
              "sr": ("not_image", "SR", "Basic Text SR Storage"),
              "localizer": ("not_requested", "CT", "CT Image Storage"),
              "capture": ("not_requested", "OT", "Secondary Capture Image Storage")}
    # packed: the three CT slices, nothing else (not 15 dose frames, not the scout, not the screenshot)
    assert manifest["inputs"]["samples"] == 3
    keys = sorted(str(item["key"]) for item in ShardDataset(version / "manifest.json", "train", shuffle=False))
    assert keys == sorted(_key_of(job, p) for p in ct)
    # nothing bad: the bad-sample report is empty and the fraction is 0
    assert read_bad_samples(version / "bad_samples.jsonl") == []
    assert manifest["bad_samples"]["total"] == 0 and manifest["bad_samples"]["fraction"] == 0.0
    # every other file is listed once, with why, modality and SOP class
    records = read_excluded(version / EXCLUDED_FILE)
    by_path = {r["path"]: r for r in records}
    assert len(records) == len(by_path) == 5
    assert {name: (by_path[str(files[name])]["why"], by_path[str(files[name])]["modality"],
                   by_path[str(files[name])]["sop_class"]) for name in others} == others
    assert "where: {Modality: RTDOSE}" in by_path[str(files["dose"])]["detail"]
    # what a dose grid is not is image intensities, not "RTDOSE values" (the file's own modality)
    assert "dose grid (absorbed dose in Gy, not image intensities such as HU)" in by_path[str(files["dose"])]["detail"]
    assert "where: {ImageType: LOCALIZER}" in by_path[str(files["localizer"])]["detail"]
    assert "SOPClassUID: Secondary Capture Image Storage" in by_path[str(files["capture"])]["detail"]
    validator = jsonschema.Draft202012Validator(load_schema("excluded"))
    for record in records:
        validator.validate(record)
    # every input file counted once: 3 packed + 0 bad + 5 left out = 8 files
    assert manifest["inputs"]["files"] == 8 == len(before)
    assert manifest["inputs"]["excluded"] == {"not_image": 2, "not_requested": 3}
    assert manifest["inputs"]["excluded_by_modality"] == {"CT": 1, "OT": 1, "RTDOSE": 1, "RTPLAN": 1, "SR": 1}
    assert manifest["inputs"]["excluded_by_sop_class"] == {
        "Basic Text SR Storage": 1, "CT Image Storage": 1, "RT Dose Storage": 1, "RT Plan Storage": 1,
        "Secondary Capture Image Storage": 1}
    assert "8 files: 3 packed, 0 bad, 5 left out on purpose (not_image 2, not_requested 3" in run.output
    assert "packer: targets: 8 input files, running on" in run.output
    assert "5 files left out on purpose by their headers (not_image 2, not_requested 3)" in run.output
    # the report lists each exclusion (by sample id: the dataset is pseudonymized) with its counts
    report = (version / "report.html").read_text(encoding="utf-8")
    assert 'id="excluded-table"' in report and "Left out on purpose" in report
    # the summary accounts for every input file: 3 samples from 8 files, 0 bad, 5 left out
    summary = report[report.index('id="summary"'):report.index('id="splits"')]
    assert re.search(r"from 8 input files[^<]*; 5 left out on purpose", summary), summary
    # and so does packer inspect: 8 files -> 3 samples, 0 bad, 5 left out (by why)
    shown = CliRunner().invoke(main, ["inspect", str(version)])
    assert shown.exit_code == 0, shown.output
    assert "8 files -> 3 samples; 5 files left out on purpose (not_image 2, not_requested 3;" in shown.output
    for record in records:
        assert record["sample_id"] in report
        assert str(Path(record["path"]).parent) not in report  # no raw paths in a pseudonymized report
    assert "RT Dose Storage" in report and "RTPLAN" in report
    # nothing deleted or changed in the source
    assert digests(raw) == before


def test_validate_lists_what_it_left_out_and_passes(tmp_path: Path, export: tuple[Path, dict[str, Path]]) -> None:
    raw, files = export
    job = export_job(tmp_path, raw)
    out = tmp_path / "validate.json"
    run = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out)])
    assert run.exit_code == 0, run.output
    doc = json.loads(out.read_text())
    assert doc["inputs"] == {"files": 8, "samples": 3} and doc["bad_samples"]["total"] == 0
    assert doc["excluded"]["total"] == 5 and doc["excluded"]["by_why"] == {"not_image": 2, "not_requested": 3}
    assert {r["path"] for r in doc["excluded"]["records"]} == {str(files[k]) for k in
                                                                ("dose", "plan", "sr", "localizer", "capture")}
    assert "left out on purpose: 5 (not_image 2, not_requested 3); not bad samples" in run.output
    # a pseudonymized job (the DICOM default) names the file by key in the printed summary (CI logs)
    plan = next(r for r in doc["excluded"]["records"] if r["path"] == str(files["plan"]))
    assert f"not_image              {plan['sample_id']}: RTPLAN (RT Plan Storage)" in run.output
    assert str(files["plan"]) not in run.output


def test_where_modality_rtdose_packs_the_dose_frames_and_filters_the_rest(
        tmp_path: Path, export: tuple[Path, dict[str, Path]]) -> None:
    raw, files = export
    result = _build(export_job(tmp_path, raw, where={"Modality": "RTDOSE"}, windows=[{"percentiles": [1, 99]}]))
    frames = int(pydicom.dcmread(files["dose"], stop_before_pixels=True).NumberOfFrames)
    assert frames == 15
    assert result.manifest["inputs"]["samples"] == frames and result.manifest["bad_samples"]["total"] == 0
    assert result.manifest["inputs"]["excluded"] == {"filtered": 7}
    records = {r["path"]: r for r in read_excluded(result.version_dir / EXCLUDED_FILE)}
    assert records[str(files["ct0"])]["detail"] == "Modality is CT, where: Modality = RTDOSE"
    assert records[str(files["sr"])]["detail"] == "Modality is SR, where: Modality = RTDOSE"


def test_where_names_sop_classes_by_name_and_asks_for_what_the_defaults_leave_out(
        tmp_path: Path, export: tuple[Path, dict[str, Path]]) -> None:
    raw, files = export
    job = export_job(tmp_path, raw, where={"SOPClassUID": ["CT Image Storage", "Secondary Capture Image Storage"]})
    assert load_job(job).sources[0].header_where[0].values == ("1.2.840.10008.5.1.4.1.1.2",
                                                               "1.2.840.10008.5.1.4.1.1.7")
    result = _build(job)
    # the CT slices and the screenshot (asked for by its SOP class); the localizer is CT Image
    # Storage too, but only ImageType asks for localizers
    assert packed_keys(result) == sorted(_key_of(job, files[k]) for k in ("ct0", "ct1", "ct2", "capture"))
    records = {r["path"]: r["why"] for r in read_excluded(result.version_dir / EXCLUDED_FILE)}
    assert records == {str(files["dose"]): "filtered", str(files["plan"]): "filtered", str(files["sr"]): "filtered",
                       str(files["localizer"]): "not_requested"}
    scouts = _build(export_job(tmp_path / "scouts", raw, where={"ImageType": "LOCALIZER"}))
    assert packed_keys(scouts) == [_key_of(job, files["localizer"])]


def test_a_header_where_on_a_series_job_keeps_left_out_files_out_of_every_series(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    axial = _write_series(raw / "a", slices=4, seed=1, patient="P1")
    _write_series(raw / "b", slices=4, seed=2, patient="P2", overrides={i: {"SeriesDescription": "COR"}
                                                                      for i in range(4)})
    write_text_sr(raw / "a" / "report.dcm", "P1")  # same folder and patient as the kept series
    shutil.copy(shipped("rtdose.dcm"), raw / "a" / "dose.dcm")
    job = export_job(tmp_path, raw, where={"SeriesDescription": {"not": "COR"}}, sample={"neighbors": 1})
    result = _build(job)
    assert packed_keys(result) == sorted(_key_of(job, p) for p in axial)
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []  # no series_* refusal of any kind
    assert result.manifest["inputs"]["files"] == 10
    assert result.manifest["inputs"]["excluded"] == {"filtered": 4, "not_image": 1, "not_requested": 1}


def test_a_file_of_an_image_class_without_pixel_data_stays_a_bad_sample(tmp_path: Path) -> None:
    ds = ct_dataset()
    for keyword in ("PixelData", "Rows", "Columns", "BitsAllocated"):
        delattr(ds, keyword)
    found = probe_dicom(make_ref(save(ds, tmp_path / "cut.dcm")), entity_keyword="PatientID", time_keywords=())
    assert isinstance(found, Issue) and found.reason == "no_pixel_data"
    assert "export it again" in found.message and "drop" not in found.message
    report = probe_dicom(make_ref(write_text_sr(tmp_path / "sr.dcm", "P1")), entity_keyword="PatientID",
                         time_keywords=())
    assert isinstance(report, Excluded) and (report.why, report.modality) == ("not_image", "SR")


def test_the_dicomdir_at_the_root_of_an_export_is_left_out_as_not_image(tmp_path: Path) -> None:
    # every CD/DVD export has one: its SOP class (Media Storage Directory Storage) is in the file
    # meta only, so it read as a file of no class without pixels, a no_pixel_data bad sample
    path = _dicomdir(tmp_path / "DICOMDIR")
    found = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=())
    assert isinstance(found, Excluded) and found.why == "not_image", found
    assert "Media Storage Directory Storage" in found.detail


@pytest.mark.parametrize("with_bad", [False, True])
def test_an_export_of_no_image_is_refused_pointing_at_the_images_not_at_where(tmp_path: Path,
                                                                              with_bad: bool) -> None:
    """An export of reports and plans only packs nothing (a config error), but the fix it gave was
    to change the source's where: or its table's files:, which cannot pack an SR or an RT Plan
    (not_image). The error counts what the source holds, by modality, and points the root at the
    images or removes the source; a bad file beside them is to be re-exported."""
    from packer.pipeline.datacheck import validate_job

    raw = tmp_path / "raw"
    write_text_sr(raw / "reports" / "a.dcm", "P1")
    write_text_sr(raw / "reports" / "b.dcm", "P2")
    shutil.copy(shipped("rtplan.dcm"), raw / "plan.dcm")
    if with_bad:
        (raw / "broken.dcm").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"no sample to pack") as refused:
        validate_job(load_job(export_job(tmp_path, raw)), scheduler="sync", quiet=True)
    message = str(refused.value)
    assert "where:" not in message and "files:" not in message, message
    assert "objects that are not images (2 SR, 1 RTPLAN), which no filter can pack" in message, message
    assert "point the source's root at the folder of the images" in message and "remove the source" in message
    assert ("re-export the bad files" in message) is with_bad, message
    # the job stops before any bad-sample list is written: the message names the bad file itself
    assert "bad_samples.jsonl" not in message, message
    if with_bad:  # (by its sample id: the job pseudonymizes paths)
        assert re.search(r"re-export the bad files \(the first, sample \S+: unreadable\)", message), message


def test_a_where_key_that_is_no_dicom_keyword_is_refused_with_the_close_keyword(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    with pytest.raises(ConfigError, match=r"sources\[0\]\.where: modality .*did you mean the DICOM keyword "
                                          r"'Modality'\?"):
        load_job(export_job(tmp_path / "a", raw, where={"modality": "CT"}))
    with pytest.raises(ConfigError, match=r"SOPClassUID: 'RT Dose Storag' is neither .*did you mean 'RT Dose "
                                          r"Storage'"):
        load_job(export_job(tmp_path / "b", raw, where={"SOPClassUID": "RT Dose Storag"}))
    with pytest.raises(ConfigError, match=r"ContentSequence: a sequence has no value"):
        load_job(export_job(tmp_path / "c", raw, where={"ContentSequence": "x"}))
    with pytest.raises(ConfigError, match=r"NoSuchThing is not a header attribute of dicom files, and the source "
                                          r"has no table; add 'labels: FILE.csv'"):
        load_job(export_job(tmp_path / "d", raw, where={"NoSuchThing": "x"}))


def test_in_a_series_job_radiographs_and_ultrasound_are_left_out_not_refused_as_broken_series(
        tmp_path: Path) -> None:
    """A hospital export holds CR, DX and US files beside its CT series. A neighbour-stack or
    volume job cannot stack a 2-D image with no Image Position (Patient); each was refused as a
    series_no_position bad sample ("the slices cannot be ordered in space"), which read like
    scanner damage and pushed the bad fraction over the threshold (exit 3). Each is now left out
    as not_requested, saying to pack it with sample: slice; a CT slice without its position is
    still a bad sample. So are planar NM (STATIC, WHOLE BODY) and IVUS frames."""
    raw = tmp_path / "raw"
    _write_series(raw / "ct", slices=4, seed=3, patient="P1")
    plate = np.random.default_rng(1).integers(0, 4000, (16, 16), dtype=np.uint16)
    save(image_dataset(plate, modality="CR", sop_class="1.2.840.10008.5.1.4.1.1.1", PatientID="P2",
                       photometric="MONOCHROME1"), raw / "cr" / "chest.dcm")
    save(image_dataset(plate, modality="DX", sop_class="1.2.840.10008.5.1.4.1.1.1.1", PatientID="P3"),
         raw / "dx" / "hand.dcm")
    echo = np.random.default_rng(2).integers(0, 255, (16, 16), dtype=np.uint8)
    save(image_dataset(echo, modality="US", sop_class="1.2.840.10008.5.1.4.1.1.6.1", PatientID="P4"),
         raw / "us" / "liver.dcm")
    # nuclear medicine planar images and an intravascular ultrasound frame: 2-D imaging too
    nm = "1.2.840.10008.5.1.4.1.1.20"
    save(image_dataset(plate, modality="NM", sop_class=nm, PatientID="P5", ImageType=["ORIGINAL", "PRIMARY", "STATIC"]),
         raw / "nm" / "bone-static.dcm")
    save(image_dataset(plate, modality="NM", sop_class=nm, PatientID="P6",
                       ImageType=["ORIGINAL", "PRIMARY", "WHOLE BODY"]), raw / "nm" / "whole-body.dcm")
    save(image_dataset(echo, modality="IVUS", sop_class="1.2.840.10008.5.1.4.1.1.6.1", PatientID="P7"),
         raw / "ivus" / "vessel.dcm")
    job = export_job(tmp_path, raw, sample={"neighbors": 1}, windows=["mediastinum"])
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"])
    assert run.exit_code == 0, run.output
    version = next((tmp_path / "out" / "targets").glob("*/manifest.json")).parent
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["bad_samples"]["total"] == 0
    assert manifest["inputs"]["excluded"] == {"not_requested": 6}
    records = {Path(r["path"]).name: r for r in read_excluded(version / EXCLUDED_FILE)}
    assert sorted(records) == ["bone-static.dcm", "chest.dcm", "hand.dcm", "liver.dcm", "vessel.dcm", "whole-body.dcm"]
    assert {r["modality"] for r in records.values()} == {"CR", "DX", "US", "NM", "IVUS"}
    assert all("not a slice of a series" in r["detail"] and "sample: slice" in r["detail"] for r in records.values())
    # the same files in a slice job are packed as images
    sliced = export_job(tmp_path / "sliced", raw, windows=["mediastinum"])
    assert CliRunner().invoke(main, ["build", str(sliced), "--scheduler", "sync"]).exit_code == 0


def _multiframe_xray(path: Path, *, sop_class: str, modality: str, study: str, placed: bool, frames: int = 4,
                     patient: str = "P1", laterality: str | list[str] = "") -> None:
    """A multi-frame object with Shared and Per-frame Functional Groups: with ``placed``, a Plane
    Position (Patient) per frame and a Plane Orientation (a Breast Tomosynthesis reconstruction);
    without, Pixel Measures, Frame Content and X-Ray Geometry only (a projection run).
    ``laterality``: a Frame Anatomy FrameLaterality, in the shared group (one value) or in each
    frame's (a list), and no top-level ImageLaterality, as Breast Tomosynthesis writes it."""
    ds = image_dataset(np.random.default_rng(0).integers(0, 4000, (frames, 16, 16), dtype=np.uint16),
                       modality=modality, sop_class=sop_class, PatientID=patient, StudyInstanceUID=study)
    ds.NumberOfFrames = frames
    for keyword in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "SliceThickness"):
        if keyword in ds:
            delattr(ds, keyword)
    shared = Dataset()
    measures = Dataset()
    measures.PixelSpacing, measures.SliceThickness = [0.1, 0.1], 1.0
    shared.PixelMeasuresSequence = DicomSequence([measures])
    if placed:
        plane = Dataset()
        plane.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        shared.PlaneOrientationSequence = DicomSequence([plane])
    if isinstance(laterality, str) and laterality:
        shared.FrameAnatomySequence = DicomSequence([_frame_anatomy(laterality)])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])
    per_frame = []
    for frame in range(frames):
        group, content = Dataset(), Dataset()
        content.FrameAcquisitionNumber = frame + 1
        group.FrameContentSequence = DicomSequence([content])
        if isinstance(laterality, list):
            group.FrameAnatomySequence = DicomSequence([_frame_anatomy(laterality[frame])])
        if placed:
            position = Dataset()
            position.ImagePositionPatient = [0.0, 0.0, float(frame)]
            group.PlanePositionSequence = DicomSequence([position])
        else:
            geometry = Dataset()
            geometry.DistanceSourceToIsocenter, geometry.DistanceSourceToDetector = 600.0, 650.0
            group.XRayGeometrySequence = DicomSequence([geometry])
        per_frame.append(group)
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(per_frame)
    save(ds, path)


def _frame_anatomy(laterality: str) -> Dataset:
    """A Frame Anatomy macro item (PS3.3 C.7.6.16.2.8): the breast, and its FrameLaterality."""
    anatomy, region = Dataset(), Dataset()
    region.CodeValue, region.CodingSchemeDesignator, region.CodeMeaning = "T-04000", "SRT", "Breast"
    anatomy.AnatomicRegionSequence = DicomSequence([region])
    anatomy.FrameLaterality = laterality
    return anatomy


def test_where_and_label_read_laterality_from_the_frame_anatomy_functional_group(tmp_path: Path) -> None:
    """Breast Tomosynthesis writes laterality in each frame's (or the shared) Frame Anatomy
    functional group as FrameLaterality, with no top-level ImageLaterality. where: and label:
    read top-level keywords only, so where: {FrameLaterality: {not: [R]}} packed both breasts,
    where: {FrameLaterality: L} left every file out, and label: {attribute: ImageLaterality} was
    missing_label for every file. They now read a keyword absent at the top level from the shared
    group, else from the per-frame groups where all frames agree, ImageLaterality as
    FrameLaterality; a file whose frames disagree has no one value: filtered, or missing_label."""
    raw, bto = tmp_path / "raw", "1.2.840.10008.5.1.4.1.1.13.1.3"
    for name, laterality in [("left", ["L"] * 4), ("right", ["R"] * 4), ("shared-left", "L"),
                             ("both", ["L", "L", "R", "R"])]:
        _multiframe_xray(raw / f"{name}.dcm", sop_class=bto, modality="MG", study=generate_uid(), placed=True,
                         patient=name, laterality=laterality)
    dicom = {"windows": ["mediastinum"], "size": [16, 16], "frames": "split"}

    kept = _build(_job(tmp_path / "where", [{"kind": "dicom", "root": str(raw), "label": "none",
                                             "where": {"FrameLaterality": {"not": ["R"]}}}],
                       transform={"dicom": dicom}))
    assert kept.manifest["inputs"]["samples"] == 8  # left and shared-left, 4 frames each
    records = {Path(r["path"]).name: r for r in read_excluded(kept.manifest_path.parent / EXCLUDED_FILE)}
    assert sorted(records) == ["both.dcm", "right.dcm"] and {r["why"] for r in records.values()} == {"filtered"}
    assert records["right.dcm"]["detail"] == "FrameLaterality is R, where: FrameLaterality is not R"
    assert records["both.dcm"]["detail"].startswith("FrameLaterality differs between the file's frames (L, R)")
    left = _build(_job(tmp_path / "left", [{"kind": "dicom", "root": str(raw), "label": "none",
                                            "where": {"ImageLaterality": "L"}}], transform={"dicom": dicom}))
    assert left.manifest["inputs"]["samples"] == 8

    labelled = _build(_job(tmp_path / "label", [{"kind": "dicom", "root": str(raw),
                                                 "label": {"attribute": "ImageLaterality"}}],
                           transform={"dicom": dicom}, validate={"max_bad_fraction": 0.5}))
    assert labelled.manifest["label_map"] == {"L": 0, "R": 1}
    assert labelled.manifest["inputs"]["samples"] == 12
    (bad,) = read_bad_samples(labelled.manifest_path.parent / "bad_samples.jsonl")
    assert bad["reason"] == "missing_label" and Path(bad["path"]).name == "both.dcm"
    assert "FrameLaterality differs between the file's frames (L, R)" in bad["message"]


def test_in_a_series_job_multiframe_projections_with_functional_groups_but_no_plane_position_are_left_out(
        tmp_path: Path) -> None:
    """A breast tomosynthesis export ships Breast Projection X-Ray objects (MG, multi-frame, Shared
    and Per-frame Functional Groups, but no Plane Position (Patient)) beside the reconstruction.
    Any functional-group sequence counted as a place in patient space, so in a volume job each
    projection was a series_no_position bad sample and the build failed (exit 3). Functional
    groups without a Plane Position (Patient) are no place: the projections, like an Enhanced XA
    run, are left out as not_requested, as a 2-D radiograph is; the reconstruction is packed."""
    raw, study = tmp_path / "raw", generate_uid()
    _multiframe_xray(raw / "recon.dcm", sop_class="1.2.840.10008.5.1.4.1.1.13.1.3", modality="MG", study=study,
                     placed=True)
    _multiframe_xray(raw / "projections.dcm", sop_class="1.2.840.10008.5.1.4.1.1.13.1.4", modality="MG", study=study,
                     placed=False)
    _multiframe_xray(raw / "for-processing.dcm", sop_class="1.2.840.10008.5.1.4.1.1.13.1.5", modality="MG",
                     study=study, placed=False)
    _multiframe_xray(raw / "angio.dcm", sop_class="1.2.840.10008.5.1.4.1.1.12.1.1", modality="XA", study=study,
                     placed=False)
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": ["mediastinum"], "sample": "volume"}})
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"])
    assert run.exit_code == 0, run.output
    version = next((tmp_path / "out" / "targets").glob("*/manifest.json")).parent
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["bad_samples"]["total"] == 0 and manifest["inputs"]["samples"] == 1  # the reconstruction
    records = {Path(r["path"]).name: r for r in read_excluded(version / EXCLUDED_FILE)}
    assert sorted(records) == ["angio.dcm", "for-processing.dcm", "projections.dcm"]
    assert {r["why"] for r in records.values()} == {"not_requested"}
    assert all("Plane Position (Patient)" in r["detail"] and "sample: slice" in r["detail"] for r in records.values())


def test_a_dicom_entity_from_the_path_keeps_a_patients_views_together_when_patient_id_names_a_view(
        tmp_path: Path) -> None:
    """CBIS-DDSM writes each view's folder name as its PatientID (Mass-Training_P_00001_LEFT_CC),
    so with the header's id a patient's four views were four entities, spread over the splits
    (a leak), and a DICOM source refused entity: {path: ...}. It now takes the entity from the
    path; time stays the header's. A file the pattern does not match is missing_entity."""
    raw = tmp_path / "CBIS-DDSM"
    rng = np.random.default_rng(0)
    for patient in range(1, 7):
        for view in ("LEFT_CC", "LEFT_MLO", "RIGHT_CC", "RIGHT_MLO"):
            folder = f"Mass-Training_P_{patient:05d}_{view}"
            pixels = rng.integers(0, 4000, (16, 16), dtype=np.uint16)
            save(image_dataset(pixels, modality="MG", sop_class="1.2.840.10008.5.1.4.1.1.1.2", PatientID=folder),
                 raw / folder / "07-20-2016-DDSM-1" / "1.000000-full mammogram images-1" / "1-1.dcm")
    stray = raw / "unsorted" / "1-1.dcm"
    save(image_dataset(rng.integers(0, 4000, (16, 16), dtype=np.uint16), modality="MG",
                       sop_class="1.2.840.10008.5.1.4.1.1.1.2", PatientID="X"), stray)
    source: dict[str, Any] = {"kind": "dicom", "root": str(raw), "label": "none",
                              "entity": {"path": r"(?P<entity>P_\d{5})"}}
    job = _job(tmp_path, [source], transform={"dicom": {"windows": ["file"], "fallback_window": "soft_tissue",
                                                        "size": [16, 16]}})
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync"])
    assert run.exit_code == 0, run.output
    version = next((tmp_path / "out" / "targets").glob("*/manifest.json")).parent
    import pyarrow.parquet as pq

    index = pq.read_table(version / "_index.parquet", columns=["entity_id", "split"]).to_pylist()
    entities: dict[str, set[str]] = {}
    for row in index:
        entities.setdefault(str(row["entity_id"]), set()).add(str(row["split"]))
    assert len(index) == 24 and len(entities) == 6 and all(len(splits) == 1 for splits in entities.values())
    (bad,) = read_bad_samples(version / "bad_samples.jsonl")
    assert bad["reason"] == "missing_entity" and "does not match the source's entity: {path:" in bad["message"]


def test_an_entity_or_time_that_is_no_dicom_keyword_is_refused_naming_the_source_and_the_close_keyword(
        tmp_path: Path) -> None:
    # entity: PatientId (a typo of PatientID) read no header element, so every file of the source was
    # a missing_entity bad sample whose message said the header's PatientId "is empty for this file"
    raw = tmp_path / "raw"
    save(ct_dataset(PatientID="P001"), raw / "P001" / "s0.dcm")
    for name, key, value in [("e", "entity", "PatientId"), ("t", "time", ["StudyDate", "StudyTme"]),
                             ("u", "time", "AcquisitionDatetime")]:
        job = export_job(tmp_path / name, raw)
        doc = yaml.safe_load(job.read_text())
        doc["sources"][0]["name"] = "ct"
        doc["sources"][0][key] = value
        job.write_text(json.dumps(doc))
        close = {"PatientId": "PatientID", "StudyTme": "StudyTime", "AcquisitionDatetime": "AcquisitionDateTime"}
        bad = value if isinstance(value, str) else value[1]
        with pytest.raises(ConfigError, match=rf"sources\[0\]\.{key} \(source 'ct'\): {bad!r} is not a DICOM keyword"
                                              rf".*did you mean the DICOM keyword {close[bad]!r}\?"):
            load_job(job)
    ok = export_job(tmp_path / "ok", raw)
    assert load_job(ok).sources[0].entity == "PatientID"


@pytest.mark.parametrize(("text", "uid"), [
    ("Ultrasound Image Storage", "1.2.840.10008.5.1.4.1.1.6.1"),  # a retired class shares the name: ...1.1.6
    ("ultrasound multi-frame image storage", "1.2.840.10008.5.1.4.1.1.3.1"),
    ("UltrasoundImageStorageRetired", "1.2.840.10008.5.1.4.1.1.6"),  # the retired one by its keyword
    ("CT Image Storage", "1.2.840.10008.5.1.4.1.1.2"),
    ("1.2.3", "1.2.3"),
])
def test_a_sop_class_name_a_retired_class_shares_is_the_current_class(text: str, uid: str) -> None:
    """where: SOPClassUID: [Ultrasound Image Storage] resolved to the retired UID, so every
    modern ultrasound file was left out as filtered."""
    from packer.read.dicom_objects import sop_class_uid

    assert sop_class_uid(text) == uid


def test_the_dicm_preamble_is_read_on_any_suffix_but_tables_text_and_images(tmp_path: Path) -> None:
    """The README's rule, as the listing applies it: *.dcm, and the preamble on other suffixes
    except .csv/.txt/.json/.md and image suffixes, which are never read as DICOM."""
    from packer.demo import write_ct_slice
    from packer.pipeline.discover import discover

    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("a.dcm", "b", "c.dat", "d.txt", "e.json", "f.png"):
        write_ct_slice(raw / name, patient_id="P1", study_date="20240101", pixels_hu=np.zeros((8, 8)))
    doc = {"name": "sfx", "sources": [{"kind": "dicom", "root": "raw", "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"},
           "output": "out", "phi": {"mode": "keep"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    found = discover(load_job(tmp_path / "job.yaml"))
    assert sorted(r.relpath for r in found.refs) == ["a.dcm", "b", "c.dat"]


def test_a_table_column_filters_a_dicom_source_labelled_from_its_headers(tmp_path: Path) -> None:
    """README: leave a withdrawn patient out through a column of the table, where: {withdrawn:
    {not: [yes]}}. With label: {attribute: ...} (or none) the table was refused as unused, and
    without it the condition was refused for want of a table: the filter could not be written.
    A table whose columns where: tests is used; the labels still come from the headers."""
    raw = tmp_path / "raw"
    paths = {}
    for i in range(4):
        ds = ct_dataset(PatientID=f"P{i}")
        ds.BodyPartExamined = "CHEST"
        paths[f"P{i}"] = save(ds, raw / f"P{i}" / "1.dcm")
    (raw / "patients.csv").write_text("path,withdrawn\n" + "".join(
        f"{p.relative_to(raw).as_posix()},{'yes' if pid == 'P0' else 'no'}\n" for pid, p in paths.items()))
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "labels": str(raw / "patients.csv"),
                           "label": {"attribute": "BodyPartExamined"}, "where": {"withdrawn": {"not": ["yes"]}}}])
    result = _build(job)
    assert result.manifest["label_map"] == {"CHEST": 0}
    assert sum(result.manifest["splits"][s]["samples"] for s in ("train", "valid", "test")) == 3
    excluded = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert [Path(e["path"]).parent.name for e in excluded] == ["P0"]


def _mammography(tmp_path: Path, *, per_image: bool, folders: bool) -> Path:
    """RSNA Screening Mammography's layout: train.csv (patient_id, image_id, cancer), the images
    under <patient_id>/<image_id>.dcm (or flat, <image_id>.dcm); ``per_image``: the anonymiser
    wrote one PatientID per image, not one per patient."""
    rows = []
    for p in range(3):
        for j in range(2):
            image = f"{p}{j}0417"
            ds = ct_dataset(pixels=np.full((8, 8), 100 * p + j, dtype=np.int16),
                            PatientID=image if per_image else f"patient{10006 + p}")
            save(ds, tmp_path / "train_images" / (f"patient{10006 + p}/" if folders else "") / f"{image}.dcm")
            rows.append(f"patient{10006 + p},{image},{j}")
    (tmp_path / "train.csv").write_text("patient_id,image_id,cancer\n" + "\n".join(rows) + "\n")
    template = "{patient_id}/{image_id}.dcm" if folders else "{image_id}.dcm"
    doc = {"name": "breast", "sources": [{"kind": "dicom", "name": "b", "root": "train_images",
                                          "labels": {"file": "train.csv", "path": {"template": template}},
                                          "label": {"column": "cancer"}}],
           "labels": ["0", "1"], "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "seed": 3},
           "transform": {"dicom": {"windows": ["brain"], "size": [8, 8]}}, "pack": {"format": "webdataset"},
           "output": "out", "phi": {"mode": "keep"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "job.yaml"


@pytest.mark.parametrize("folders", [True, False])
def test_a_dicom_source_whose_headers_make_each_file_its_own_entity_warns_naming_the_patient_column(
        tmp_path: Path, folders: bool) -> None:
    """An anonymiser that wrote one PatientID per image, while the table's patient_id and the
    patient folders group the images: each image was its own entity and one patient's images
    went to several splits without a word (the warning was for sources reading entities from
    tables and paths only). It names the candidates and, where the paths hold the id, the
    entity: {component: N} that reads it; with the headers' PatientID per patient it is silent."""
    from packer.pipeline.datacheck import validate_job

    result = validate_job(load_job(_mammography(tmp_path, per_image=True, folders=folders)), quick=True,
                          scheduler="sync", quiet=True)
    (said,) = [message for code, message in result.prepared.warnings if code == "entities"]
    assert "source 'b': each of its 6 files is its own entity" in said and "leakage protection is off" in said
    if folders:
        assert "Column 'patient_id' and the path part 'patient10006' look like a patient id" in said, said
        assert said.endswith("read the entity from the path, entity: {component: 0}")
    else:
        assert "Column 'patient_id' looks like a patient id" in said and "not a table column" in said, said
    kept = tmp_path / "kept"
    kept.mkdir()
    result = validate_job(load_job(_mammography(kept, per_image=False, folders=folders)), quick=True,
                          scheduler="sync", quiet=True)
    assert [message for code, message in result.prepared.warnings if code == "entities"] == []


#: The SOP classes of the Secondary Capture family (PS3.4 B.5), by UID.
_SC_FAMILY = ("1.2.840.10008.5.1.4.1.1.7", "1.2.840.10008.5.1.4.1.1.7.1", "1.2.840.10008.5.1.4.1.1.7.2",
              "1.2.840.10008.5.1.4.1.1.7.3", "1.2.840.10008.5.1.4.1.1.7.4")


def test_the_readme_recipe_for_secondary_captures_packs_every_sc_class_multi_frame_included(tmp_path: Path) -> None:
    """README's DICOM-export table says how to pack secondary captures, "all SC classes incl.
    multi-frame"; its recipe named the single-frame class, which left the multi-frame ones out as
    filtered. The recipe, taken from README as written, asks for each of the five classes."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| secondary capture"))
    recipe = re.search(r"every SC class: `where: (\{.*?\})`", row)
    assert recipe is not None, row
    where = yaml.safe_load(recipe.group(1))
    raw = tmp_path / "raw"
    shapes = {"1.2.840.10008.5.1.4.1.1.7": ((16, 16), "MONOCHROME2", np.uint8),
              "1.2.840.10008.5.1.4.1.1.7.1": ((2, 16, 16), "MONOCHROME2", np.uint8),
              "1.2.840.10008.5.1.4.1.1.7.2": ((2, 16, 16), "MONOCHROME2", np.uint8),
              "1.2.840.10008.5.1.4.1.1.7.3": ((2, 16, 16), "MONOCHROME2", np.uint16),
              "1.2.840.10008.5.1.4.1.1.7.4": ((2, 16, 16, 3), "RGB", np.uint8)}
    files = {}
    for k, (uid, (shape, photometric, dtype)) in enumerate(shapes.items()):
        pixels = np.random.default_rng(k).integers(0, 200, shape).astype(dtype)
        files[uid] = save(image_dataset(pixels, modality="OT", sop_class=uid, photometric=photometric,
                                        PatientID=f"P{k}", BurnedInAnnotation="NO"), raw / f"sc{k}.dcm")
    save(ct_dataset(np.zeros((16, 16), np.int16) + 40, PatientID="P9"), raw / "ct.dcm")
    job = export_job(tmp_path, raw, where=where)
    conditions = load_job(job).sources[0].header_where
    for uid in _SC_FAMILY:  # each class asked for (no other exclusion), the CT slice filtered
        found = probe_dicom(make_ref(files[uid]), entity_keyword="PatientID", time_keywords=(), where=conditions)
        assert not isinstance(found, Excluded | Issue), (uid, found)
    ct = probe_dicom(make_ref(raw / "ct.dcm"), entity_keyword="PatientID", time_keywords=(), where=conditions)
    assert isinstance(ct, Excluded) and ct.why == "filtered", ct


def _non_image(path: Path, sop_class: str, modality: str, **payload: Any) -> Path:
    """A valid object of a non-image SOP class, no Image Pixel module; ``payload``: keyword → bytes."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = sop_class
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.StudyDate, ds.StudyTime, ds.Modality = "P1", "20240101", "120000", modality
    for keyword, value in payload.items():
        setattr(ds, keyword, value)
    return save(ds, path)


@pytest.mark.parametrize("keep_pixels", [False, True], ids=["header", "whole"])
def test_a_non_image_object_over_the_size_limit_is_left_out_as_not_image_without_being_read_whole(
        tmp_path: Path, keep_pixels: bool) -> None:
    """A Raw Data object (k-space, several GB) or an encapsulated PDF over limits.max_decoded_bytes
    was a too_large bad sample, counting against max_bad_fraction, where the same object when small
    is not_image: the file size was checked before the header said what the file is. The header
    is read first, bounded (its long values unread), and only an image is held to the limit."""
    import tracemalloc

    from packer.config import LimitsConfig

    limits = LimitsConfig(max_decoded_bytes=2**20)
    big = 24 * 2**20
    raw = _non_image(tmp_path / "kspace.dcm", "1.2.840.10008.5.1.4.1.1.66", "MR")  # Raw Data Storage
    ds = pydicom.dcmread(raw)
    ds.add_new(0x7FE10010, "LO", "SIEMENS CSA NON-IMAGE")
    ds.add_new(0x7FE11010, "OB", bytes(big))
    ds.save_as(raw, enforce_file_format=True)
    pdf = _non_image(tmp_path / "report.dcm", "1.2.840.10008.5.1.4.1.1.104.1", "DOC",
                     MIMETypeOfEncapsulatedDocument="application/pdf",
                     EncapsulatedDocument=b"%PDF-1.4\n" + bytes(big) + b"\n%%EOF\n")
    image = save(ct_dataset(np.zeros((1024, 1024), np.int16)), tmp_path / "ct.dcm")  # 2 MiB of pixels
    for path, modality in ((raw, "MR"), (pdf, "DOC")):
        assert path.stat().st_size > big
        tracemalloc.start()
        found = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=(), limits=limits,
                            keep_pixels=keep_pixels)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert isinstance(found, Excluded) and (found.why, found.modality) == ("not_image", modality), found
        assert peak < 4 * 2**20, f"{path.name}: {peak} bytes allocated to tell what a {big}-byte file is"
    # an image over the limit is still too_large, from its size, before a byte of it is decoded
    refused = probe_dicom(make_ref(image), entity_keyword="PatientID", time_keywords=(), limits=limits,
                          keep_pixels=keep_pixels)
    assert isinstance(refused, Issue) and refused.reason == "too_large", refused
    assert "over limits.max_decoded_bytes 1048576" in refused.message


def _slide_image(path: Path, kind: str, *, label_in_image: bool, seed: int) -> Path:
    """A VL Whole Slide Microscopy image (2 RGB tiles of 16×16) of Image Type value 3 ``kind``;
    Burned In Annotation NO, as scanners write it for the label's photo too."""
    tiles = np.random.default_rng(seed).integers(0, 255, (2, 16, 16, 3)).astype(np.uint8)
    ds = image_dataset(tiles, photometric="RGB", modality="SM", sop_class="1.2.840.10008.5.1.4.1.1.77.1.6",
                       PatientID="SLIDE1", ImageType=["ORIGINAL", "PRIMARY", kind, "NONE"],
                       BurnedInAnnotation="NO", SpecimenLabelInImage="YES" if label_in_image else "NO",
                       TotalPixelMatrixRows=16, TotalPixelMatrixColumns=32, DimensionOrganizationType="TILED_FULL")
    return save(ds, path)


def test_a_slides_label_overview_and_thumbnail_are_left_out_unless_asked_and_a_label_in_the_pixels_is_refused(
        tmp_path: Path) -> None:
    """A whole-slide export holds, beside the pyramid's levels (Image Type value 3 VOLUME), the
    photo of the slide's label (LABEL), a macro photo (OVERVIEW) that shows the label too, and a
    THUMBNAIL; they were packed as tissue samples, the label's photo (accession, often the
    patient's name) with them where Burned In Annotation says NO. They are left out as
    not_requested, as localizers are, until where: {ImageType: ...} asks for them; a requested
    image whose Specimen Label in Image is YES is refused as burned-in text."""
    raw = tmp_path / "raw"
    files = {kind: _slide_image(raw / f"{kind.lower()}.dcm", kind, label_in_image=kind in ("LABEL", "OVERVIEW"),
                                seed=k) for k, kind in enumerate(("VOLUME", "LABEL", "OVERVIEW", "THUMBNAIL"))}
    job = export_job(tmp_path, raw, windows=[{"center": 128, "width": 256}])
    result = _build(job)
    assert result.manifest["inputs"]["samples"] == 2  # the level's two tiles, nothing else
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    records = {r["path"]: r for r in read_excluded(result.version_dir / EXCLUDED_FILE)}
    assert {kind: records[str(files[kind])]["why"] for kind in ("LABEL", "OVERVIEW", "THUMBNAIL")} == {
        "LABEL": "not_requested", "OVERVIEW": "not_requested", "THUMBNAIL": "not_requested"}
    assert "where: {ImageType: LABEL}" in records[str(files["LABEL"])]["detail"]
    # asked for: the thumbnail packs; the label's and the overview's photos show the label: burned-in text
    where = load_job(export_job(tmp_path / "asked", raw, where={"ImageType": ["LABEL", "OVERVIEW", "THUMBNAIL"]}))
    conditions = where.sources[0].header_where
    found = {kind: probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=(), where=conditions)
             for kind, path in files.items()}
    assert isinstance(found["VOLUME"], Excluded) and found["VOLUME"].why == "filtered"
    assert not isinstance(found["THUMBNAIL"], Excluded | Issue), found["THUMBNAIL"]
    for kind in ("LABEL", "OVERVIEW"):
        refused = found[kind]
        assert isinstance(refused, Issue) and refused.reason == "burned_in_annotation", refused
        assert "(0048,0010) Specimen Label in Image is YES" in refused.message
    allowed = probe_dicom(make_ref(files["LABEL"]), entity_keyword="PatientID", time_keywords=(), where=conditions,
                          allow_burned_in=True)
    assert not isinstance(allowed, Excluded | Issue), allowed


def _dicomdir(path: Path) -> Path:
    """An export's DICOMDIR: its class (Media Storage Directory Storage) in its file meta only, no Modality."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = MediaStorageDirectoryStorage
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.FileSetID, ds.FileSetConsistencyFlag, ds.DirectoryRecordSequence = "EXPORT", 0, DicomSequence([])
    ds.OffsetOfTheFirstDirectoryRecordOfTheRootDirectoryEntity = 0
    ds.OffsetOfTheLastDirectoryRecordOfTheRootDirectoryEntity = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def test_non_image_objects_are_counted_by_what_they_are_and_the_modalities_sum_to_the_files_left_out(
        tmp_path: Path) -> None:
    """An export of no image counted a Raw Data object of Modality CT as '1 CT' (as if a CT image
    were there), and the manifest's excluded_by_modality left the DICOMDIR (no Modality) out, so
    it summed to one less than the files left out."""
    from packer.pipeline.datacheck import validate_job

    raw = tmp_path / "raw"
    _dicomdir(raw / "DICOMDIR")
    _non_image(raw / "kspace.dcm", "1.2.840.10008.5.1.4.1.1.66", "CT")  # Raw Data Storage
    write_text_sr(raw / "report.dcm", "P1")
    with pytest.raises(ConfigError, match=r"no sample to pack") as refused:
        validate_job(load_job(export_job(tmp_path, raw)), scheduler="sync", quiet=True)
    assert ("objects that are not images (1 Media Storage Directory Storage, 1 Raw Data Storage, 1 SR)"
            in str(refused.value)), refused.value
    save(ct_dataset(PatientID="P1"), raw / "ct.dcm")
    result = _build(export_job(tmp_path / "with-image", raw))
    inputs = result.manifest["inputs"]
    assert inputs["excluded"] == {"not_image": 3}
    assert inputs["excluded_by_modality"] == {"(none)": 1, "CT": 1, "SR": 1}
    assert sum(inputs["excluded_by_modality"].values()) == sum(inputs["excluded"].values())
