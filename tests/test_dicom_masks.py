"""Masks from a DICOM source's own SEG and RTSTRUCT objects, end to end (``mask: {from: dicom}``).

A CT series is written with pydicom, its SEG with highdicom's own writer and its RTSTRUCT with
pydicom; the truth is planted in pixel indices of the slices (boxes whose edges lie half-way
between pixel centres, so any boundary rule agrees) and mapped to patient millimetres through
each slice's own geometry. Every build runs the real pipeline; the masks are read back with the
stock loader and compared voxel for voxel, in slices, neighbour stacks and volumes.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pydicom
import pytest
from click.testing import CliRunner
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from packer.badsamples import read_bad_samples
from packer.cli import main
from packer.config import MaskConfig, SeriesConfig, load_job
from packer.errors import ConfigError
from packer.loader import ShardDataset
from packer.read.annotations import AnnotationRefs
from packer.read.dicom_masks import link
from packer.read.dicom_series import SliceGeometry
from packer.read.series import assemble
from packer.records import SampleRef
from packer.structures import Structure, StructureMap
from tests.dicom_files import ct_dataset, save
from tests.test_targets import _build, _job

ROWS, COLUMNS, SLICES = 20, 24, 8
SPACING = (0.8, 0.6)  # between rows, between columns (mm)
STEP = 2.5
#: class id → (first slice, last slice, first row, last row, first column, last column), inclusive
BODY = (0, SLICES - 1, 2, 17, 2, 21)
LUNG = (2, 5, 5, 10, 4, 12)
LIVER = (3, 6, 12, 15, 14, 20)
RTSTRUCT_ROIS = {"rois": {"body": {"id": 1, "aliases": ["BODY", "External"]},
                          "lung": {"id": 2, "aliases": ["Lung_L", "LUNG LEFT"]}}}
SEGMENTS = {"segments": {"liver": {"id": 4, "codes": ["SCT:10200004"]}}}


def _truth() -> np.ndarray:
    """The planted D×H×W label map in series order: body, then the lung and liver over it."""
    labels = np.zeros((SLICES, ROWS, COLUMNS), dtype=np.uint8)
    for cid, (z0, z1, r0, r1, c0, c1) in ((1, BODY), (2, LUNG), (4, LIVER)):
        labels[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = cid
    return labels


def _write_series(folder: Path, patient: str, seed: int) -> list[Dataset]:
    """An axial CT series, instance numbers and file names shuffled; returned in position order."""
    rng = random.Random(seed)
    numbers = list(range(1, SLICES + 1))
    rng.shuffle(numbers)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    out: list[Dataset] = []
    for k in range(SLICES):
        pixels = np.full((ROWS, COLUMNS), 1000 + 40 * k, dtype=np.int16)
        pixels[::2, ::2] += 8  # not constant (a constant image is a bad sample); the mean still orders slices
        ds = ct_dataset(pixels, PatientID=patient, InstanceNumber=numbers[k], StudyInstanceUID=study,
                        SeriesInstanceUID=series, FrameOfReferenceUID=frame,
                        ImageOrientationPatient=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                        ImagePositionPatient=[-10.0, -8.0, 30.0 + STEP * k], PixelSpacing=list(SPACING),
                        ImageType=["ORIGINAL", "PRIMARY", "AXIAL"], SeriesNumber=1, AccessionNumber="",
                        ReferringPhysicianName="", PatientName="Doe^Jane", PatientSex="F",
                        StudyID="1", Manufacturer="packer-tests", PositionReferenceIndicator="")
        out.append(pydicom.dcmread(save(ds, folder / f"{rng.getrandbits(40):010x}.dcm")))
    return out


def _point(ds: Dataset, r: float, c: float) -> list[float]:
    o = np.asarray(ds.ImagePositionPatient, dtype=float)
    x, y = np.asarray(ds.ImageOrientationPatient[:3], dtype=float), np.asarray(ds.ImageOrientationPatient[3:],
                                                                                dtype=float)
    return [float(v) for v in o + c * SPACING[1] * x + r * SPACING[0] * y]


def _box_contour(ds: Dataset, r0: int, r1: int, c0: int, c1: int) -> list[float]:
    """A closed contour half a pixel outside the box's pixel centres."""
    corners = [(r0 - 0.5, c0 - 0.5), (r0 - 0.5, c1 + 0.5), (r1 + 0.5, c1 + 0.5), (r1 + 0.5, c0 - 0.5)]
    return [v for r, c in corners for v in _point(ds, r, c)]


def write_rtstruct(path: Path, slices: list[Dataset], rois: dict[str, tuple[int, ...]],
                   series_uid: str | None = None) -> Path:
    """An RTSTRUCT over ``slices`` with one box ROI per entry of ``rois`` (name → box)."""
    first = slices[0]
    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.481.3"
    ds.SOPInstanceUID = generate_uid()
    ds.Modality = "RTSTRUCT"
    ds.PatientID, ds.PatientName = first.PatientID, first.PatientName
    ds.StudyInstanceUID, ds.SeriesInstanceUID = first.StudyInstanceUID, generate_uid()
    ds.FrameOfReferenceUID = first.FrameOfReferenceUID
    ds.StructureSetLabel = "test"
    image_items = []
    for s in slices:
        item = Dataset()
        item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = s.SOPClassUID, s.SOPInstanceUID
        image_items.append(item)
    series = Dataset()
    series.SeriesInstanceUID = series_uid or first.SeriesInstanceUID
    series.ContourImageSequence = DicomSequence(image_items)
    study = Dataset()
    study.ReferencedSOPInstanceUID = first.StudyInstanceUID
    study.RTReferencedSeriesSequence = DicomSequence([series])
    frame = Dataset()
    frame.FrameOfReferenceUID = first.FrameOfReferenceUID
    frame.RTReferencedStudySequence = DicomSequence([study])
    ds.ReferencedFrameOfReferenceSequence = DicomSequence([frame])
    roi_items, contour_items = [], []
    for number, (name, (z0, z1, r0, r1, c0, c1)) in enumerate(rois.items(), start=1):
        roi = Dataset()
        roi.ROINumber, roi.ROIName = number, name
        roi.ReferencedFrameOfReferenceUID = first.FrameOfReferenceUID
        roi_items.append(roi)
        contours = []
        for k in range(z0, z1 + 1):
            contour = Dataset()
            contour.ContourGeometricType = "CLOSED_PLANAR"
            data = _box_contour(slices[k], r0, r1, c0, c1)
            contour.NumberOfContourPoints = len(data) // 3
            contour.ContourData = [round(v, 4) for v in data]
            contours.append(contour)
        item = Dataset()
        item.ReferencedROINumber = number
        item.ContourSequence = DicomSequence(contours)
        contour_items.append(item)
    ds.StructureSetROISequence = DicomSequence(roi_items)
    ds.ROIContourSequence = DicomSequence(contour_items)
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    return save(ds, path)


def write_seg(path: Path, slices: list[Dataset], label: str = "Liver", box: tuple[int, ...] = LIVER) -> Path:
    """A BINARY SEG of one segment (a box) written by highdicom over ``slices``."""
    z0, z1, r0, r1, c0, c1 = box
    pixels = np.zeros((len(slices), ROWS, COLUMNS), dtype=bool)
    pixels[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = True
    description = hd.seg.SegmentDescription(
        segment_number=1, segment_label=label,
        segmented_property_category=hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL)
    seg = hd.seg.Segmentation(source_images=slices, pixel_array=pixels,
                              segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
                              segment_descriptions=[description], series_instance_uid=generate_uid(),
                              series_number=2, sop_instance_uid=generate_uid(), instance_number=1,
                              manufacturer="packer-tests", manufacturer_model_name="tests",
                              software_versions="1", device_serial_number="1")
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return path


def _annotated_tree(raw: Path) -> dict[str, list[Dataset]]:
    """Patient A: a series with a SEG and an RTSTRUCT; patient B: a series with none."""
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    write_rtstruct(raw / "A" / "RT" / "rt.dcm", a, {"External": BODY, "LUNG LEFT": LUNG, "Dr Who check": LUNG})
    write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    b = _write_series(raw / "B" / "CT", "PB", seed=2)
    return {"A": a, "B": b}


def _mask_job(tmp: Path, raw: Path, mask: dict[str, Any], **dicom: Any) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none",
                       "mask": {"from": "dicom", **mask}}],
                transform={"dicom": {"windows": [{"center": 40, "width": 400}], **dicom}},
                validate={"max_bad_fraction": 0.9})


def _items(result: Any) -> list[dict[str, Any]]:
    return list(ShardDataset(result.manifest_path, "train", shuffle=False))


def _records(result: Any) -> dict[str, dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in result.version_dir.glob("*-*.tar"))
    return {s["__key__"]: s["json"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()}


@pytest.mark.slow
def test_slices_carry_the_planted_structures_voxel_for_voxel(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    items = _items(result)
    assert len(items) == 2 * SLICES  # every slice of both series; the annotations are no samples
    truth = _truth()
    # which slice an item is: its pixels hold 1000 + 40·k stored values, windowed, so k orders them
    by_patient: dict[int, list[tuple[float, np.ndarray]]] = {}
    for item in items:
        mask = item["mask"].numpy()
        assert mask.shape == (1, ROWS, COLUMNS) and mask.dtype == np.uint8
        by_patient.setdefault(int(mask.any()), []).append((float(item["image"].float().mean()), mask[0]))
    annotated = [m for _, m in sorted(by_patient[1], key=lambda pair: pair[0])]
    assert len(annotated) == SLICES and len(by_patient[0]) == SLICES  # B: all-zero masks (empty: keep)
    for k, mask in enumerate(annotated):
        assert np.array_equal(mask, truth[k]), k
    assert len(tree["B"]) == SLICES
    excluded = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert sorted(e["why"] for e in excluded) == ["annotation", "annotation"]
    assert {e["modality"] for e in excluded} == {"SEG", "RTSTRUCT"}
    assert "1 structure(s) the map does not name" in next(e["detail"] for e in excluded if e["modality"] == "RTSTRUCT")
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["libraries"].get("highdicom") == hd.__version__
    # a structure name typed by a person ("Dr Who check") never reaches the shards under pseudonymize
    everything = json.dumps(list(_records(result).values()))
    assert "Dr Who" not in everything and "LUNG LEFT" not in everything and "External" not in everything
    meta = next(iter(_records(result).values()))
    assert "annotations" in meta["metadata"] or "annotations" in json.dumps(meta)


@pytest.mark.slow
def test_stacks_keep_the_centre_slice_mask_and_volumes_the_stacked_label_map(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    truth = _truth()
    stacks = _build(_mask_job(tmp_path / "stacks", raw, {**RTSTRUCT_ROIS, **SEGMENTS}, sample={"neighbors": 1}))
    annotated = sorted((item for item in _items(stacks) if item["mask"].numpy().any()),
                       key=lambda item: float(item["image"][1].float().mean()))  # the centre slice's channel
    assert len(annotated) == SLICES
    for k, item in enumerate(annotated):
        assert item["image"].shape[0] == 3
        assert np.array_equal(item["mask"].numpy()[0], truth[k]), k
    volumes = _build(_mask_job(tmp_path / "volume", raw, {**RTSTRUCT_ROIS, **SEGMENTS}, sample="volume"))
    found = [item for item in _items(volumes) if item["mask"].numpy().any()]
    assert len(found) == 1
    mask = found[0]["mask"].numpy()
    assert mask.shape == (SLICES, ROWS, COLUMNS)
    # canonical LPS order for an axial series stored head-first with +z slices: D runs along z
    assert np.array_equal(mask, truth) or np.array_equal(mask, truth[::-1])
    assert found[0]["image"].shape[1:] == mask.shape


@pytest.mark.slow
def test_annotation_problems_have_their_reasons_and_the_series_goes_with_them(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    # an orphan: an RTSTRUCT over a series that is not in the source
    ghost = _write_series(tmp_path / "elsewhere", "PG", seed=3)
    write_rtstruct(raw / "orphan.dcm", ghost, {"BODY": BODY})
    # overlapping classes under refuse: the lung box lies inside the body
    result = _build(_mask_job(tmp_path / "refuse", raw, {**RTSTRUCT_ROIS, **SEGMENTS, "overlap": "refuse"}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    bad = {Path(b["path"]).name: b for b in records}
    assert bad["orphan.dcm"]["reason"] == "annotation_orphan"
    overlap = [b for b in records if b["reason"] == "mask_overlap"]
    assert {Path(b["path"]).name for b in overlap} & {"rt.dcm", "seg.dcm"}
    assert len([b for b in overlap if Path(b["path"]).parent.name == "CT"]) == SLICES  # every slice of A
    assert len(_items(result)) == SLICES  # B still packs, with empty masks
    # empty: bad makes the unannotated series mask_missing
    strict = _build(_mask_job(tmp_path / "strict", raw, {**RTSTRUCT_ROIS, **SEGMENTS, "empty": "bad"}))
    reasons = {Path(b["path"]).parent.parent.name: b["reason"]
               for b in read_bad_samples(strict.version_dir / "bad_samples.jsonl")
               if Path(b["path"]).parent.name == "CT"}
    assert reasons == {"B": "mask_missing"}
    assert len(tree["A"]) == SLICES


#: Where the SEG is cut, from the tag of (0008,0016) SOP Class UID or of (0008,1115) Referenced
#: Series Sequence, and the record it gets
CUTS = {
    "before its SOP Class UID": ("sop", 0, "annotation_orphan"),  # its class only in the file meta
    "inside its SOP Class UID": ("sop", 10, "annotation_orphan"),  # "1." of it left: the file meta's is whole
    "before its references": ("references", 0, "annotation_orphan"),
    # no Study Instance UID either; the file ends inside the UID, which is told (a SEG cut short: annotation_frames)
    "inside a referenced instance UID": ("references", 120, "annotation_frames"),
    "inside a referenced instance item": ("references", 264, "unreadable"),  # an item that cannot be decoded
}


@pytest.mark.parametrize("where", list(CUTS))
def test_a_series_whose_annotation_is_cut_short_before_its_references_is_not_packed_as_empty(
        tmp_path: Path, where: str) -> None:
    """A fresh-user trial cut a highdicom SEG short on disk: its header no longer named the series
    it was drawn on, it became an annotation_orphan, and its series, referenced by no annotation,
    packed with all-zero masks under empty: keep: a model would learn "no liver" from a read
    failure. Empty means no annotation was made, not one that could not be read: the series' files
    are mask_missing, naming the annotation; the patient without annotation still packs empty."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    _write_series(raw / "B" / "CT", "PB", seed=2)
    seg = write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    data = seg.read_bytes()
    anchor, offset, reason = CUTS[where]
    tags = {"sop": data.index(b"\x08\x00\x16\x00", 132 + 12),  # explicit VR little endian, after the file meta
            "references": data.index(b"\x08\x00\x15\x11")}
    cut = tags[anchor] + offset
    seg.write_bytes(data[:cut])
    result = _build(_mask_job(tmp_path, raw, SEGMENTS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-3], r["reason"]) for r in records) == sorted([
        ("A", reason), *[("A", "mask_missing")] * SLICES])
    if reason == "annotation_orphan":
        orphan = next(r for r in records if r["reason"] == "annotation_orphan")
        assert "may be cut short or damaged: re-export it" in orphan["message"]
    missing = next(r for r in records if r["reason"] == "mask_missing")["message"]
    assert f"{seg} (SEG, in the folder A/ of its files; its header is cut short or damaged)" in missing
    assert "that annotation's structures missing, not an empty series" in missing
    items = _items(result)
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B: empty, packed


def test_a_seg_cut_short_beside_an_rtstruct_holds_back_the_series_it_may_belong_to(tmp_path: Path) -> None:
    """A series with an RTSTRUCT that reads and a SEG cut before its references (its header names
    no series, no study): the SEG may only be a second annotation of that series, the one series
    of its folder, so the series is mask_missing (its liver would be background), not packed with
    the RTSTRUCT's classes alone; the other patient's series still packs empty."""
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    seg = raw / "A" / "SEG" / "seg.dcm"
    data = seg.read_bytes()
    seg.write_bytes(data[:data.index(b"\x08\x00\x15\x11")])
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("SEG", "annotation_orphan"), ("RT", "series_incomplete"), *[("CT", "mask_missing")] * len(tree["A"])])
    missing = next(r for r in records if r["reason"] == "mask_missing")["message"]
    assert f"{seg} (SEG, in the folder A/ of its files; its header is cut short or damaged)" in missing
    assert "annotated already" in missing
    items = _items(result)
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B


def test_a_seg_cut_short_in_the_folder_of_its_slices_holds_its_series_back(tmp_path: Path) -> None:
    """An export of one folder a patient (``A/seg.dcm`` beside ``A/<slices>.dcm``): a SEG cut
    before its references lies in its series' own folder, which ties it as the folder above does
    (``A/SEG/`` beside ``A/CT/``); it was tied to nothing, and its series packed with all-zero masks."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A", "PA", seed=1)
    _write_series(raw / "B", "PB", seed=2)
    seg = write_seg(raw / "A" / "seg.dcm", a)
    data = seg.read_bytes()
    seg.write_bytes(data[:data.index(b"\x08\x00\x15\x11")])
    result = _build(_mask_job(tmp_path, raw, SEGMENTS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("A", "annotation_orphan"), *[("A", "mask_missing")] * SLICES])
    assert f"{seg} (SEG, in the folder A/ of its files; its header is cut short or damaged)" in next(
        r["message"] for r in records if r["reason"] == "mask_missing")
    assert len(_items(result)) == SLICES  # B


def test_a_label_map_seg_cut_before_its_modality_is_still_an_annotation(tmp_path: Path) -> None:
    """A Label Map Segmentation (its own SOP class, ...66.7, which highdicom writes for LABELMAP)
    cut right after its SOP Class UID, before (0008,0060) Modality: known only by a class that was
    not among the annotation classes, it was an image without pixels (no_pixel_data) and its series
    packed with all-zero masks; now it is an annotation whose header names nothing, and its series
    is mask_missing."""
    from tests.test_seg import write_seg as write_typed_seg

    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    _write_series(raw / "B" / "CT", "PB", seed=2)
    pixels = np.zeros((SLICES, ROWS, COLUMNS, 1), dtype=bool)
    z0, z1, r0, r1, c0, c1 = LIVER
    pixels[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1, 0] = True
    (raw / "A" / "SEG").mkdir()
    seg = write_typed_seg(raw / "A" / "SEG" / "seg.dcm", a, pixels, ["Liver"], kind="LABELMAP")
    data = seg.read_bytes()
    assert pydicom.dcmread(seg).SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.7"
    sop = _sop_tag(data)
    seg.write_bytes(data[:sop + 8 + int.from_bytes(data[sop + 6:sop + 8], "little")])
    result = _build(_mask_job(tmp_path, raw, SEGMENTS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("SEG", "annotation_orphan"), *[("CT", "mask_missing")] * SLICES])
    assert len(_items(result)) == SLICES  # B


def _meta_class_end(data: bytes) -> int:
    """Where the value of the file meta's (0002,0002) Media Storage SOP Class UID ends."""
    at = data.index(b"\x02\x00\x02\x00UI", 132)
    return at + 8 + int.from_bytes(data[at + 6:at + 8], "little")


def _put(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


def _sop_tag(data: bytes) -> int:
    return data.index(b"\x08\x00\x16\x00UI", 132)


#: A SEG damaged past what its header can say, and how: (the damaged bytes from the SEG's, the
#: record it gets, whether the series it annotates is held back (mask_missing) rather than only
#: named in its record as possibly its own, and what that record says)
DAMAGES = {
    # its preamble overwritten, DICM gone: the rest parses leniently, and names the series it was drawn on
    "its DICM marker overwritten": (lambda d: bytes(128) + b"XXXX" + d[132:], "not_dicom", True,
                                    "Its bytes still show a SEG"),
    # no DICM, and cut in its file meta after its class: its class alone, tied by its folder
    "no DICM and cut after its class": (lambda d: bytes(128) + b"XXXX" + d[132:_meta_class_end(d) + 6],
                                        "not_dicom", True, "Its bytes still show a SEG"),
    # the file meta gone too: the data set alone, whose SOP Class UID the bytes still hold
    "its file meta gone": (lambda d: d[_sop_tag(d) - 12:], "not_dicom", True, "Its bytes still show a SEG"),
    # (0008,0016)'s length damaged: its value swallows the elements after it, the file meta names a SEG
    "its SOP Class UID's length damaged": (lambda d: _put(d, _sop_tag(d) + 6, b"\xff\x00"), "annotation_orphan",
                                           True, "may be cut short or damaged"),
    # cut inside its file meta's class: nothing says what it is
    "cut inside its file meta's class": (lambda d: d[:_meta_class_end(d) - 8], "unreadable", False,
                                         "it may be a SEG or RTSTRUCT"),
    "cut inside its file meta, before its class": (lambda d: d[:150], "unreadable", False,
                                                   "it may be a SEG or RTSTRUCT"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_seg_too_damaged_to_parse_is_still_tied_to_its_series_or_named_as_possibly_its_own(
        tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A SEG that pydicom cannot read at all (its record: unreadable or not_dicom) was tied to no
    series, so its series packed with all-zero masks under empty: keep, and nothing said that a
    lesion became background. Where its bytes still show a SEG (the file meta's class, the UID in
    its bytes, a lenient parse of the rest), its series is mask_missing naming it; where nothing
    says what the file is, its record names the series it may annotate and the build warns. The
    other patient's series, with no annotation, still packs with all-zero masks."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    _write_series(raw / "B" / "CT", "PB", seed=2)
    seg = write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    make, reason, held_back, said = DAMAGES[damage]
    seg.write_bytes(make(seg.read_bytes()))
    result = _build(_mask_job(tmp_path, raw, SEGMENTS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    own = next(r for r in records if Path(r["path"]).name == "seg.dcm")
    assert own["reason"] == reason and said in own["message"]
    series = [r for r in records if Path(r["path"]).parent.name == "CT"]
    items = _items(result)
    warned = capsys.readouterr().err
    if held_back:
        assert sorted((Path(r["path"]).parts[-3], r["reason"]) for r in series) == [("A", "mask_missing")] * SLICES
        assert all(str(seg) in r["message"] for r in series)
        assert len(items) == SLICES  # B alone
        assert "may be SEG or RTSTRUCT" not in warned
    else:
        assert series == []  # nothing ties it: A packs, and its record and the build say what may be wrong
        assert "A/CT/ (8 files, 0 annotation(s))" in own["message"]
        assert "1 file(s) of sources with masks from DICOM could not be read" in warned
        assert len(items) == 2 * SLICES
        out = tmp_path / "validate.json"  # packer validate --json names the warning by its code
        run = CliRunner().invoke(main, ["validate", str(_mask_job(tmp_path / "v", raw, SEGMENTS)), "--scheduler",
                                        "sync", "-q", "--json", str(out)])
        assert run.exit_code == 0, run.output
        assert [w["code"] for w in json.loads(out.read_text())["warnings"]] == ["annotations"]
    assert not any(item["mask"].numpy().any() for item in items)  # nothing painted: no annotation was read


def test_a_series_whose_seg_is_damaged_is_held_back_though_its_rtstruct_reads(tmp_path: Path) -> None:
    """A series with an RTSTRUCT that reads and a SEG whose DICM marker is gone: the SEG's salvaged
    header names the series, so the series is mask_missing (its liver would be background), not
    packed with the RTSTRUCT's classes alone."""
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    seg = raw / "A" / "SEG" / "seg.dcm"
    seg.write_bytes(bytes(128) + b"XXXX" + seg.read_bytes()[132:])
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-2], r["reason"]) for r in records) == sorted([
        ("SEG", "not_dicom"), ("RT", "series_incomplete"), *[("CT", "mask_missing")] * len(tree["A"])])
    assert all("cannot be read (see their records)" in r["message"] and str(seg) in r["message"]
               for r in records if r["reason"] == "mask_missing")
    assert len(_items(result)) == SLICES  # B, with all-zero masks; the RTSTRUCT is held back with its series


def test_a_damaged_image_file_beside_an_annotated_series_is_not_taken_for_an_annotation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CT slice whose preamble lost DICM, and a text file, in an annotated source: their bytes
    say they are no annotation (the slice's file meta names CT Image Storage whole; the text is
    no DICOM), so they keep their own records, no series is held back and nothing warns."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    broken = Path(a[0].filename)  # the first slice, outside the liver: the SEG has no frame on it
    data = broken.read_bytes()
    broken.write_bytes(bytes(128) + b"XXXX" + data[132:])
    cut = Path(a[1].filename)  # the second, cut inside its header: its file meta still names CT
    cut.write_bytes(cut.read_bytes()[:_sop_tag(cut.read_bytes()) + 10])
    (raw / "A" / "notes.dcm").write_text("exported from PACS\n")  # listed as DICOM by its name
    result = _build(_mask_job(tmp_path, raw, SEGMENTS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).name, r["reason"]) for r in records) == sorted([
        (broken.name, "not_dicom"), (cut.name, "truncated"), ("notes.dcm", "not_dicom")])  # cut: copy it again
    assert not any("may be a SEG" in r["message"] for r in records)
    assert "masks from DICOM could not be read" not in capsys.readouterr().err
    items = _items(result)
    truth = _truth()[2:]
    assert len(items) == SLICES - 2
    assert sorted(int((item["mask"].numpy() == 4).sum()) for item in items) == sorted(
        int((z == 4).sum()) for z in truth)  # the liver, on the slices that remain


def _lung_contour_data(data: bytes) -> tuple[int, int]:
    """Where the value of the lung's first ContourData starts in an RTSTRUCT of ``_damaged_rt``,
    and its length (explicit VR little endian: the body's SLICES contours come first)."""
    at = [i for i in range(len(data)) if data.startswith(b"\x06\x30\x50\x00DS", i)][SLICES]
    return at + 8, int.from_bytes(data[at + 6:at + 8], "little")


def _same_length(data: bytes, make: Any) -> bytes:
    start, length = _lung_contour_data(data)
    value = make(data[start:start + length]).ljust(length)
    assert len(value) == length
    return data[:start] + value + data[start + length:]


def _roi_contour_items(data: bytes) -> list[int]:
    """The offsets of the ROIContourSequence's items (each starts with its ROI Display Color or
    Contour Sequence)."""
    start = data.index(b"\x06\x30\x39\x00SQ")
    return [i for i in range(start, len(data)) if data.startswith(b"\xfe\xff\x00\xe0", i)
            and data[i + 8:i + 12] in (b"\x06\x30\x2a\x00", b"\x06\x30\x40\x00")]


def _empty_lung_contour(path: Path) -> bytes:
    ds = pydicom.dcmread(path)
    ds.ROIContourSequence[1].ContourSequence[0].ContourData = []
    ds.save_as(path)
    return path.read_bytes()


#: How the lung's contours (ROI 2 of 3, mapped; ROI 3 "Dr Who check" is not) are damaged, and what
#: the record's message says
RT_DAMAGES = {
    "a non-numeric value in its ContourData": (lambda d, p: _same_length(d, lambda v: b"abc" + v[3:]),
                                               "could not convert string to float"),
    "a value dropped from its ContourData": (lambda d, p: _same_length(d, lambda v: v[:v.rindex(b"\\")]),
                                             "not x, y, z triplets"),
    "an empty ContourData": (lambda d, p: _empty_lung_contour(p), "ContourData (3006,0050) is empty"),
    "the file cut before its ROIContourSequence item": (lambda d, p: d[:_roi_contour_items(d)[1]],
                                                        "'LUNG LEFT' (lung, ROINumber 2) has no ROIContourSequence "
                                                        "item: the file is cut short inside its ROIContourSequence"),
    "its item's ReferencedROINumber damaged into the body's": (
        lambda d, p: d.replace(b"\x06\x30\x84\x00IS\x02\x002 ", b"\x06\x30\x84\x00IS\x02\x001 "),
        "items 1, 2 all reference ROINumber 1"),
    # the unmapped ROI's number damaged into the body's: its contours (the lung's, here) would be
    # painted as the body, holes in it by the even-odd rule, under a note that said "not affected"
    "the unmapped ROI's ReferencedROINumber damaged into the body's": (
        lambda d, p: d.replace(b"\x06\x30\x84\x00IS\x02\x003 ", b"\x06\x30\x84\x00IS\x02\x001 "),
        "items 1, 3 all reference ROINumber 1, ROI 'External' (body)"),
}


@pytest.mark.parametrize("damage", list(RT_DAMAGES))
def test_an_rtstruct_that_loses_a_mapped_roi_to_damage_refuses_its_series(tmp_path: Path, damage: str) -> None:
    """A mapped ROI whose contours were in the file but cannot be read means the mask is wrong
    for its class: the structure set is unreadable and its series is refused (a defect refuses
    the series), never packed with the class missing and a note. A file cut before the item of
    its ROI and a ReferencedROINumber damaged into another ROI's (whose contours would then be
    painted as that class) parsed without a word before; the other patient still packs."""
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    (raw / "A" / "SEG" / "seg.dcm").unlink()
    rt = raw / "A" / "RT" / "rt.dcm"
    make, said = RT_DAMAGES[damage]
    rt.write_bytes(make(rt.read_bytes(), rt))
    result = _build(_mask_job(tmp_path, raw, RTSTRUCT_ROIS))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted((Path(r["path"]).parts[-3], r["reason"]) for r in records) == [("A", "unreadable")] * (
        len(tree["A"]) + 1)
    own = next(r for r in records if Path(r["path"]).name == "rt.dcm")
    assert said in own["message"], own["message"]
    items = _items(result)
    assert len(items) == SLICES and not any(item["mask"].numpy().any() for item in items)  # B: no annotation


def test_an_rtstruct_cut_before_an_unmapped_rois_item_still_paints_its_mapped_rois(tmp_path: Path) -> None:
    """The same cut, before the item of an ROI the map does not name: the mask is whole, so the
    series packs with the planted body and lung, and the lost ROI is noted."""
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    (raw / "A" / "SEG" / "seg.dcm").unlink()
    rt = raw / "A" / "RT" / "rt.dcm"
    data = rt.read_bytes()
    rt.write_bytes(data[:_roi_contour_items(data)[2]])
    result = _build(_mask_job(tmp_path, raw, RTSTRUCT_ROIS))
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    truth = _truth()
    truth[truth == 4] = 1  # no SEG: the liver box lies in the body
    excluded = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    rt_row = next(e for e in excluded if Path(e["path"]).name == "rt.dcm")
    assert "'Dr Who check': no ROIContourSequence item" in rt_row["detail"]
    painted = sorted((int((item["mask"].numpy() == 1).sum()), int((item["mask"].numpy() == 2).sum()))
                     for item in _items(result) if item["mask"].numpy().any())
    assert painted == sorted((int((z == 1).sum()), int((z == 2).sum())) for z in truth)
    assert len(painted) == len(tree["A"])


@pytest.mark.slow
def test_a_constant_slice_is_its_own_bad_sample_and_the_rest_of_its_series_packs(tmp_path: Path) -> None:
    # sample: slice packs slices one by one: an all-air slice at the edge of a scan is a constant_image
    # bad sample, but it used to make every other slice of its series (and its SEG and RTSTRUCT)
    # series_incomplete bad samples, dropping a whole annotated scan
    raw = tmp_path / "raw"
    tree = _annotated_tree(raw)
    edge = tree["A"][0]
    edge.PixelData = np.full((ROWS, COLUMNS), 24, dtype=np.int16).tobytes()
    edge.save_as(edge.filename)
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert [(Path(b["path"]).name, b["reason"]) for b in records] == [(Path(edge.filename).name, "constant_image")]
    excluded = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert sorted(e["why"] for e in excluded) == ["annotation", "annotation"]
    annotated = sorted(((float(item["image"].float().mean()), item["mask"].numpy()[0]) for item in _items(result)
                        if item["mask"].numpy().any()), key=lambda pair: pair[0])
    truth = _truth()
    assert len(annotated) == SLICES - 1
    for k, (_, mask) in enumerate(annotated, start=1):
        assert np.array_equal(mask, truth[k]), k


@pytest.mark.slow
def test_an_annotation_whose_structures_are_all_unmapped_names_the_closest(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    result = _build(_mask_job(tmp_path, raw, {"rois": {"lungs": {"id": 2, "aliases": ["Lung_Lt"]}},
                                              **SEGMENTS}))
    bad = {Path(b["path"]).name: b for b in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert bad["rt.dcm"]["reason"] == "annotation_unmapped"
    assert "LUNG LEFT" in bad["rt.dcm"]["message"] and "lungs" in bad["rt.dcm"]["message"]


def test_the_job_file_refuses_masks_from_dicom_it_cannot_honour(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    with pytest.raises(ConfigError, match="segments .* or rois"):
        load_job(_mask_job(tmp_path / "a", raw, {}))
    with pytest.raises(ConfigError, match="share id"):
        load_job(_mask_job(tmp_path / "b", raw, {"rois": {"lung": 1, "heart": 1}}))
    with pytest.raises(ConfigError, match="codes match SEG"):
        load_job(_mask_job(tmp_path / "c", raw, {"rois": {"lung": {"id": 1, "codes": ["SCT:39607008"]}}}))
    with pytest.raises(ConfigError, match="from: dicom"):
        load_job(_job(tmp_path / "d", [{"kind": "image", "root": str(raw), "label": "none",
                                        "mask": {"from": "dicom", "rois": {"lung": 1}}}]))
    (raw / "labels.csv").write_text("path,label\n")
    with pytest.raises(ConfigError, match="header attribute"):
        load_job(_job(tmp_path / "f", [{"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"),
                                        "mask": {"from": "dicom", "rois": {"lung": 1}}}]))
    with pytest.raises(ConfigError, match="frames: split"):
        load_job(_mask_job(tmp_path / "e", raw, {"rois": {"lung": 1}}, frames="stack"))
    # a name among the codes matched nothing, silently: the segment was counted as unmapped
    with pytest.raises(ConfigError, match=r"segments\.liver\.codes: 'liver' is a name, not a code .* aliases"):
        load_job(_mask_job(tmp_path / "g", raw, {"segments": {"liver": {"id": 1, "codes": ["liver"]}}}))
    load_job(_mask_job(tmp_path / "h", raw, {"segments": {"liver": {"id": 1, "codes": ["SCT:10200004", "10200004",
                                                                                       "SRT:T-62000"]}}}))


def test_the_job_file_refuses_names_that_compare_equal_in_two_classes_or_compare_as_nothing(tmp_path: Path) -> None:
    # names compare without case, spaces or punctuation, so Lung_L in one class and LUNG-L in another
    # are one name: the first class would silently take every such ROI and the second none
    raw = tmp_path / "raw"
    raw.mkdir()
    with pytest.raises(ConfigError, match="'LUNG-L' .* lung_left .* 'Lung_L' .* lung"):
        load_job(_mask_job(tmp_path / "a", raw, {"rois": {"lung": {"id": 1, "aliases": ["Lung_L", "Lung_R"]},
                                                          "lung_left": {"id": 2, "aliases": ["LUNG-L"]}}}))
    with pytest.raises(ConfigError, match="'--' .* no letter or digit"):
        load_job(_mask_job(tmp_path / "b", raw, {"segments": {"liver": {"id": 1, "aliases": ["--"]}}}))
    # one class may list spellings that compare equal; the other map is another namespace
    load_job(_mask_job(tmp_path / "c", raw, {"rois": {"lung": {"id": 1, "aliases": ["Lung_L", "LUNG L"]}},
                                             "segments": {"tumour": {"id": 2, "aliases": ["lung l"]}}}))
    # a code in two classes: the segment so coded went to the first class declared, silently
    with pytest.raises(ConfigError, match=r"the code '78961009' of class spleen and 'SCT:78961009' of class liver "
                                          r"name one concept"):
        load_job(_mask_job(tmp_path / "d", raw, {"segments": {"liver": {"id": 1, "codes": ["SCT:78961009"]},
                                                              "spleen": {"id": 2, "codes": ["78961009"]}}}))
    load_job(_mask_job(tmp_path / "e", raw, {"segments": {"kidney": {"id": 1, "codes": ["SCT:64033007",
                                                                                        "64033007"]}}}))


def test_the_declared_order_is_part_of_the_identity(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    first = load_job(_mask_job(tmp_path / "a", raw, {"rois": {"body": 1, "lung": 2}}))
    second = load_job(_mask_job(tmp_path / "b", raw, {"rois": {"lung": 2, "body": 1}}))
    assert first.sources[0].mask is not None and second.sources[0].mask is not None
    assert first.sources[0].mask.to_json()["order"] == ["body", "lung"]
    assert second.sources[0].mask.to_json()["order"] == ["lung", "body"]


def test_validate_quick_links_annotations_from_headers_and_counts_every_file(tmp_path: Path) -> None:
    from packer.pipeline.datacheck import validate_job

    raw = tmp_path / "raw"
    _annotated_tree(raw)
    write_rtstruct(raw / "orphan.dcm", _write_series(tmp_path / "elsewhere", "PG", seed=3), {"BODY": BODY})
    quick = validate_job(load_job(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS})), quick=True,
                         scheduler="sync", quiet=True).prepared
    assert len(quick.samples) == 2 * SLICES
    assert [(Path(i.path).name, i.reason) for i in quick.issues] == [("orphan.dcm", "annotation_orphan")]
    assert sorted((Path(e.path).name, e.why) for e in quick.excluded) == [("rt.dcm", "annotation"),
                                                                          ("seg.dcm", "annotation")]


@pytest.mark.parametrize("mask", [
    {"rois": {"heart": {"id": 1, "aliases": ["Heart"]}}, **SEGMENTS},
    {**RTSTRUCT_ROIS, "segments": {"spleen": {"id": 4, "codes": ["SCT:78961009"]}}},
    RTSTRUCT_ROIS,
], ids=["rois-unmapped", "segments-unmapped", "no-segments-map"])
def test_validate_quick_refuses_an_annotation_whose_structures_none_map_as_the_full_check_does(
        tmp_path: Path, mask: dict[str, Any]) -> None:
    """An RTSTRUCT none of whose ROI names the map names (the commonest configuration mistake),
    a SEG none of whose segments map by label or code, or a SEG where the mask has no segments
    map: --quick passed them (it paints nothing), while the full check refuses the series. The
    structure names are in the header, so --quick gives the same records as the full check, and
    counts no samples of the refused series."""
    from packer.pipeline.datacheck import validate_job

    raw = tmp_path / "raw"
    _annotated_tree(raw)
    job = load_job(_mask_job(tmp_path, raw, mask))
    quick = validate_job(job, quick=True, scheduler="sync", quiet=True).prepared
    full = validate_job(job, scheduler="sync", quiet=True).prepared
    def seen(prepared: Any) -> list[tuple[str, str]]:
        return sorted((str(Path(i.path).relative_to(raw)), i.reason) for i in prepared.issues)
    assert seen(quick) == seen(full)
    assert {reason for _, reason in seen(quick)} >= {"annotation_unmapped"}
    assert [i.message for i in quick.issues if i.reason == "annotation_unmapped" and "/A/CT/" not in i.path] == [
        i.message for i in full.issues if i.reason == "annotation_unmapped" and "/A/CT/" not in i.path]
    assert len(quick.samples) == len(full.samples) == SLICES  # patient B's series alone


def _oblique_series(folder: Path, degrees: float) -> list[Dataset]:
    """An oblique series (rotated about the row direction), returned in position order."""
    a = np.radians(degrees)
    row, col = np.array([1.0, 0.0, 0.0]), np.array([0.0, np.cos(a), np.sin(a)])
    normal = np.cross(row, col)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    out = []
    for k in range(SLICES):
        pixels = np.full((ROWS, COLUMNS), 1000 + 40 * k, dtype=np.int16)
        pixels[::2, ::2] += 8
        origin = np.array([-10.0, -8.0, 30.0]) + STEP * k * normal
        ds = ct_dataset(pixels, PatientID="PO", InstanceNumber=SLICES - k, StudyInstanceUID=study,
                        SeriesInstanceUID=series, FrameOfReferenceUID=frame,
                        ImageOrientationPatient=[*row.tolist(), *col.tolist()],
                        ImagePositionPatient=origin.tolist(), PixelSpacing=list(SPACING),
                        ImageType=["ORIGINAL", "PRIMARY", "AXIAL"], SeriesNumber=1, AccessionNumber="",
                        ReferringPhysicianName="", PatientName="Doe^Jane", PatientSex="F", StudyID="1",
                        Manufacturer="packer-tests", PositionReferenceIndicator="", SliceThickness=STEP,
                        ContentDate="20240101", ContentTime="101112", AcquisitionNumber=1)
        out.append(ds)
    return out


@pytest.mark.slow
def test_a_seg_over_an_oblique_multi_frame_source_packs_into_the_volume_in_patient_coordinates(
        tmp_path: Path) -> None:
    """The source is one Legacy Converted Enhanced CT (highdicom) of an oblique series: its frames
    are the slices, the SEG's frames reference them by frame number. Every packed mask voxel of the
    volume, mapped through the volume's affine to patient millimetres, holds the class planted at
    that point of the source slices."""
    singles = _oblique_series(tmp_path / "singles", 25.0)
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=singles, series_instance_uid=generate_uid(), series_number=3,
        sop_instance_uid=generate_uid(), instance_number=1)
    raw = tmp_path / "raw"
    save(enhanced, raw / "ct" / "enhanced.dcm")
    depth = [int(np.argmin([np.linalg.norm(np.subtract(item.PlanePositionSequence[0].ImagePositionPatient,
                                                       s.ImagePositionPatient)) for s in singles]))
             for item in enhanced.PerFrameFunctionalGroupsSequence]  # each frame's slice
    z0, z1, r0, r1, c0, c1 = LIVER
    planted = np.zeros((SLICES, ROWS, COLUMNS), dtype=bool)
    planted[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = True
    description = hd.seg.SegmentDescription(
        segment_number=1, segment_label="Liver",
        segmented_property_category=hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL)
    seg = hd.seg.Segmentation(source_images=[enhanced], pixel_array=planted[depth],
                              segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
                              segment_descriptions=[description], series_instance_uid=generate_uid(),
                              series_number=4, sop_instance_uid=generate_uid(), instance_number=1,
                              manufacturer="packer-tests", manufacturer_model_name="tests",
                              software_versions="1", device_serial_number="1")
    (raw / "seg").mkdir(parents=True)
    seg.save_as(raw / "seg" / "seg.dcm")
    result = _build(_mask_job(tmp_path, raw, SEGMENTS, sample="volume"))
    (item,) = _items(result)
    mask = item["mask"].numpy()
    meta = _records(result)[item["key"]]
    affine = np.asarray(meta["metadata"]["volume"]["affine"])
    # each source voxel's centre in patient mm, and where the packed volume holds that point
    to_volume = np.linalg.inv(affine)
    hits = 0
    for k, s in enumerate(singles):
        for r in range(ROWS):
            for c in range(COLUMNS):
                point = np.asarray(_point(s, r, c) + [1.0])
                d, h, w = np.rint(to_volume @ point)[:3].astype(int)
                assert mask[d, h, w] == (4 if planted[k, r, c] else 0), (k, r, c)
                hits += int(planted[k, r, c])
    assert hits == planted.sum() > 0



# --------------------------------------------------------------------------- linking, from headers


def _placed(series: str, frame_of_reference: str, patient: str, n: int = 4) -> list[tuple[SampleRef, SliceGeometry]]:
    return [(SampleRef(sample_id=f"{series}-{k}", source="ct", kind="dicom", path=f"/raw/{series}/{k}.dcm",
                       relpath=f"{series}/{k}.dcm", label="", entity=patient),
             SliceGeometry(study_uid="1.2", series_uid=series, frame_of_reference=frame_of_reference,
                           positions=((0.0, 0.0, 2.0 * k),), orientation=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0), rows=8,
                           columns=8, spacing=(1.0, 1.0), image_type=("ORIGINAL", "PRIMARY"),
                           sop_uid=f"{series}.{k}"))
            for k in range(n)]


def _note(name: str, **refs: Any) -> tuple[SampleRef, AnnotationRefs]:
    fields = {"modality": "RTSTRUCT", "study_uid": "1.2", "series_uids": (), "instance_uids": (),
              "frames_of_reference": (), **refs}
    return (SampleRef(sample_id=name, source="ct", kind="dicom", path=f"/raw/{name}.dcm", relpath=f"{name}.dcm"),
            AnnotationRefs(**fields))


@pytest.mark.parametrize(("refs", "linked"), [
    ({"series_uids": ("B",)}, "B"),                          # Referenced Series
    ({"instance_uids": ("A.2", "A.3")}, "A"),                # only the instances it was drawn on
    ({"frames_of_reference": ("FOR-B",)}, "B"),              # only its frame of reference, one series in it
    ({"series_uids": ("gone",)}, None),                      # a series not in the source: an orphan
    ({"frames_of_reference": ("FOR-A",)}, None),             # two series share the frame: which one is unknown
    ({}, None),                                              # references nothing at all
])
def test_an_annotation_is_linked_from_its_header_to_the_series_it_references(refs: dict[str, Any],
                                                                               linked: str | None) -> None:
    placed = _placed("A", "FOR-A", "P1") + _placed("A2", "FOR-A", "P1") + _placed("B", "FOR-B", "P2")
    assembled = assemble(placed, SeriesConfig(min_slices=1, gap_tolerance=float("inf")))
    masks = {"ct": MaskConfig(column="", origin="dicom", rois=StructureMap((Structure("body", 1),)))}
    groups, issues = link(assembled.series, {r.sample_id: g for r, g in placed}, [_note("n", **refs)], (), masks)
    holding = [g.series.refs[0].relpath.split("/")[0] for g in groups if g.annotations]
    assert holding == ([linked] if linked else [])
    if not refs:  # its header names no series and no instance (cut short): each series of its study may be
        # its own, so none is packed with all-zero masks that would be a read failure
        assert [i.reason for i in issues] == ["annotation_orphan"] + ["mask_missing"] * 12
        assert groups == []
        return
    if refs == {"frames_of_reference": ("FOR-A",)}:  # drawn on A or A2, which one is unknown: both were
        # packed as all background; B lies in another frame of reference and packs
        assert [i.reason for i in issues] == ["annotation_orphan"] + ["mask_missing"] * 8
        assert {i.path.split("/")[2] for i in issues[1:]} == {"A", "A2"}
        assert [g.series.refs[0].relpath.split("/")[0] for g in groups] == ["B"]
        return
    assert [i.reason for i in issues] == ([] if linked else ["annotation_orphan"])
    assert len(groups) == 3  # every series is packed; one without annotation has all-zero masks (empty: keep)
    every = [p for g in groups for p in g.places]
    assert len(every) == 12 and all(p.sop_uid for p in every)


def test_an_annotation_two_series_could_hold_says_how_to_name_one_not_to_add_a_series() -> None:
    # both series are under the root: "Put the series it was drawn on under the source's root" sent
    # the user looking for a series that was already there
    placed = _placed("A", "FOR-A", "P1") + _placed("A2", "FOR-A", "P1")
    assembled = assemble(placed, SeriesConfig(min_slices=1, gap_tolerance=float("inf")))
    masks = {"ct": MaskConfig(column="", origin="dicom", rois=StructureMap((Structure("body", 1),)))}
    _, issues = link(assembled.series, {r.sample_id: g for r, g in placed},
                     [_note("n", frames_of_reference=("FOR-A",))], (), masks)
    (issue,) = [i for i in issues if i.reason == "annotation_orphan"]  # and both series held back: mask_missing
    assert "2 series of the source share" in issue.message
    assert "under the source's root" not in issue.message and "Referenced Series Sequence" in issue.message
    # the series' own records say why the whole annotation cannot say which: not "cut short or damaged"
    held = [i.message for i in issues if i.reason == "mask_missing"]
    assert held and all("it names only a frame of reference several series share" in m for m in held)
    assert not any("cut short" in m or "read failure" in m for m in held)


def test_an_annotation_of_a_refused_series_names_that_series_refusal_and_a_file_of_it() -> None:
    # the series' records name it by a digest of (entity, study, series), the orphan's message by a
    # digest of the Series UID alone: "see their records" gave the user no way to tell which
    placed = _placed("A", "FOR-A", "P1") + _placed("B", "FOR-B", "P2")
    doubled = (replace(placed[1][0], sample_id="A-dup", path="/raw/A/dup.dcm", relpath="A/dup.dcm"),
               replace(placed[1][1], sop_uid="A.dup"))
    placed.append(doubled)  # a second image at slice 1's position: series A is refused
    assembled = assemble(placed, SeriesConfig(min_slices=1, gap_tolerance=float("inf")))
    assert {i.reason for i in assembled.issues} == {"series_duplicate_position"}
    masks = {"ct": MaskConfig(column="", origin="dicom", rois=StructureMap((Structure("body", 1),)))}
    _, issues = link(assembled.series, {r.sample_id: g for r, g in placed}, [_note("n", series_uids=("A",))],
                     assembled.issues, masks)
    (issue,) = issues
    # the series is there, refused: its own reason (an orphan references no series of the source)
    assert issue.reason == "series_duplicate_position"
    assert "series_duplicate_position" in issue.message and "/raw/A/" in issue.message, issue.message
    # and by the digest the series' own records print, so the records of one series can be matched
    (printed,) = {re.search(r"series ([0-9a-f]{16}) ", i.message).group(1) for i in assembled.issues}  # type: ignore[union-attr]
    assert f"named series {printed} in their records" in issue.message, issue.message


def test_a_reader_bug_is_the_series_unexpected_error_never_a_crash(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.read.rtstruct as rtstruct

    raw = tmp_path / "raw"
    _annotated_tree(raw)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(rtstruct, "paint_rtstruct", broken)
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert {Path(b["path"]).name for b in records if b["reason"] == "unexpected_error"} >= {"rt.dcm"}
    assert sum(b["reason"] == "unexpected_error" and Path(b["path"]).parent.name == "CT" for b in records) == SLICES
    assert "RuntimeError: a bug" in next(b["message"] for b in records if Path(b["path"]).name == "rt.dcm")


def test_an_roi_in_another_frame_of_reference_refuses_its_structure_set_and_series(tmp_path: Path) -> None:
    # a structure set can carry ROIs of a registered MR beside the CT's (StructureSetROISequence →
    # ReferencedFrameOfReferenceUID): their points are in the MR's patient coordinates, and painting
    # them on the CT's voxels puts them wherever the two frames' origins happen to be
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    path = write_rtstruct(raw / "A" / "RT" / "rt.dcm", a, {"External": BODY, "LUNG LEFT": LUNG})
    b = _write_series(raw / "B" / "CT", "PB", seed=2)  # the CT's own ROIs, in its frame: painted as ever
    write_rtstruct(raw / "B" / "RT" / "rt_b.dcm", b, {"External": BODY, "LUNG LEFT": LUNG})
    ds = pydicom.dcmread(path)
    other = generate_uid()
    ds.StructureSetROISequence[1].ReferencedFrameOfReferenceUID = other  # LUNG LEFT was drawn on the MR
    mr = Dataset()
    mr.FrameOfReferenceUID = other
    ds.ReferencedFrameOfReferenceSequence.append(mr)
    ds.save_as(path)
    result = _build(_mask_job(tmp_path, raw, RTSTRUCT_ROIS, sample="volume"))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    volumes = _records(result)
    assert len(volumes) == 1  # B's volume; nothing of A is packed
    (item,) = [i for split in ("train", "valid", "test") if split in result.manifest["splits"]
               for i in ShardDataset(result.manifest_path, split, shuffle=False)]
    assert int((item["mask"].numpy() == 2).sum())  # B's lung, drawn in B's own frame
    mine = next(r for r in records if Path(r["path"]).name == "rt.dcm")
    assert mine["reason"] == "mask_geometry"
    assert "ROI 'LUNG LEFT' (lung) lies in frame of reference" in mine["message"]
    assert other not in mine["message"]  # named by digest: a UID identifies a study
    assert {r["reason"] for r in records} == {"mask_geometry"} and len(records) == len(a) + 1  # the series too


def test_a_seg_listing_a_series_in_another_frame_of_reference_refuses_that_series(tmp_path: Path) -> None:
    """A SEG drawn on one CT (its frames derive from that CT, its Frame of Reference is the CT's)
    whose Referenced Series Sequence also lists a second scan of the patient in another frame of
    reference (a registered scan shown beside it) was painted onto that scan by position: the
    liver landed wherever the two origins put it. As an RTSTRUCT's ROI in another frame, the
    scan is refused (mask_geometry, its files and the SEG's record naming both frames' owners by
    digest); the CT it was drawn on packs with its liver."""
    raw = tmp_path / "raw"
    a = _write_series(raw / "A" / "CT", "PA", seed=1)
    other = _write_series(raw / "A" / "CT2", "PA", seed=3)  # its own Frame of Reference UID
    assert other[0].FrameOfReferenceUID != a[0].FrameOfReferenceUID
    path = write_seg(raw / "A" / "SEG" / "seg.dcm", a)
    ds = pydicom.dcmread(path)
    listed = Dataset()
    listed.SeriesInstanceUID = other[0].SeriesInstanceUID
    instance = Dataset()
    instance.ReferencedSOPClassUID, instance.ReferencedSOPInstanceUID = other[0].SOPClassUID, other[0].SOPInstanceUID
    listed.ReferencedInstanceSequence = DicomSequence([instance])
    ds.ReferencedSeriesSequence.append(listed)
    ds.save_as(path)
    result = _build(_mask_job(tmp_path, raw, SEGMENTS, sample="volume"))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    (item,) = [i for split in ("train", "valid", "test") if split in result.manifest["splits"]
               for i in ShardDataset(result.manifest_path, split, shuffle=False)]
    assert int((item["mask"].numpy() == 4).sum())  # the CT the SEG was drawn on
    assert {r["reason"] for r in records} == {"mask_geometry"}
    assert {Path(r["path"]).parent.name for r in records if r["path"].endswith(".dcm")} == {"CT2", "SEG"}
    assert sum(Path(r["path"]).parent.name == "CT2" for r in records) == len(other)
    mine = next(r for r in records if Path(r["path"]).name == "seg.dcm")["message"]
    assert "the SEG's FrameOfReferenceUID" in mine and "this series' images" in mine
    assert "Referenced Series Sequence" in mine
    assert other[0].FrameOfReferenceUID not in mine and a[0].FrameOfReferenceUID not in mine  # by digest


def test_an_annotation_links_to_its_own_entitys_series_when_another_entity_holds_the_same_uid() -> None:
    """An export copied into two patient folders (entity from the path) holds one Series Instance
    UID under two entities. Each folder's SEG names that UID: it was linked to both series, so each
    series carried both annotations and a refused one gave every file of both series a record per
    link (a build of 162 such folders wrote 22,885 records for 4,048 files and a manifest whose bad
    fraction, 5.65, failed its own schema: exit 5). The annotation's own entity decides; one that
    no series of its entity holds, among several entities', is an orphan saying so."""
    placed = _placed("A", "FOR-A", "P1") + [(replace(r, sample_id=f"copy-{r.sample_id}", path=f"/raw/copy/{r.relpath}",
                                                     relpath=f"copy/{r.relpath}", entity="P2"), g)
                                            for r, g in _placed("A", "FOR-A", "P1")]
    assembled = assemble(placed, SeriesConfig(min_slices=1, gap_tolerance=float("inf")))
    assert len(assembled.series) == 2 and not assembled.issues
    masks = {"ct": MaskConfig(column="", origin="dicom", rois=StructureMap((Structure("body", 1),)))}
    geometry = {r.sample_id: g for r, g in placed}
    for refs in ({"series_uids": ("A",)}, {"instance_uids": ("A.1",)}, {"frames_of_reference": ("FOR-A",)}):
        notes = [(replace(ref, entity=entity), r) for entity in ("P1", "P2")
                 for ref, r in [_note(f"n-{entity}", **refs)]]
        groups, issues = link(assembled.series, geometry, notes, (), masks)
        assert issues == []
        held = {g.series.refs[0].entity: [a.entity for a, _ in g.annotations] for g in groups}
        assert held == {"P1": ["P1"], "P2": ["P2"]}, (refs, held)
        stranger = [(replace(ref, entity="P3"), r) for ref, r in [_note("n-P3", **refs)]]
        groups, issues = link(assembled.series, geometry, stranger, (), masks)
        assert all(not g.annotations for g in groups)
        (issue,) = issues
        assert issue.reason == "annotation_orphan" and "2 series of other entities" in issue.message, issue.message


def add_degenerate_contour(raw: Path) -> None:
    """A contour of two points added to the first ROI of the annotated tree's RTSTRUCT (skipped
    when painted, and noted in the annotation's record)."""
    rt = pydicom.dcmread(raw / "A" / "RT" / "rt.dcm")
    first = rt.ROIContourSequence[0].ContourSequence[0]
    degenerate = Dataset()
    degenerate.ContourGeometricType = "CLOSED_PLANAR"
    degenerate.NumberOfContourPoints = 2
    degenerate.ContourData = list(first.ContourData[:6])
    rt.ROIContourSequence[0].ContourSequence.append(degenerate)
    rt.save_as(raw / "A" / "RT" / "rt.dcm")


@pytest.mark.slow
def test_an_annotation_painted_with_notes_is_a_warning_that_counts_them_without_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A contour of two points is skipped (degenerate) and noted in the annotation's row of
    excluded.jsonl; the build said nothing about it. It now warns with the counts, and never with
    a structure's name (one may be a person's)."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    add_degenerate_contour(raw)
    result = _build(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS}))
    said = capsys.readouterr().err
    warning = ("1 annotation object(s) were painted with 1 note(s) between them (contours skipped as degenerate or "
               "not closed")
    assert warning in said and "External" not in said and "Dr Who" not in said
    codes = [json.loads(line)["code"] for line in (result.version_dir / "warnings.jsonl").read_text().splitlines()]
    assert "annotation_notes" in codes
    (rt_row,) = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()
                 if json.loads(line)["modality"] == "RTSTRUCT"]
    assert "; 1 note(s): ROI 'External': 1 degenerate contours skipped" in rt_row["detail"]


def test_masks_from_dicom_pad_with_an_id_the_loss_ignores(tmp_path: Path) -> None:
    """pad: 255 was refused as "not 0 or a class id", and classes: [0, 1, 255], the README's way for
    a file mask, is refused with from: dicom: no ignore index could pad a DICOM mask under fit."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    job = _mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, "pad": 255}, size=[ROWS, 2 * COLUMNS], resize="fit")
    result = _build(job)
    masks = [item["mask"].numpy() for item in _items(result)]
    assert masks and all((m == 255).any() and set(np.unique(m)) <= {0, 1, 2, 255} for m in masks)
    manifest = json.loads(result.manifest_path.read_text())
    assert 255 in manifest["mask"]["classes"], manifest["mask"]
