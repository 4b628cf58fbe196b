"""One DICOM SEG (or RTSTRUCT) over a series of two acquisitions, which packer stacks per acquisition.

A series whose two acquisitions (the same Series Instance UID, Acquisition Numbers 1 and 2) fail
as one stack is packed as two stacks (README, Series): pre and post contrast at the same
positions (``series_duplicate_position``), or a chest then an abdomen run (``series_gap``). One
SEG, written by highdicom over all the series' images, paints both: each stack must get the
frames of its own images only, never the other acquisition's (at the same positions they would
land on its slices; elsewhere they would lie on none of them). Every packed mask voxel is
compared with the box planted for that acquisition, in slice and volume mode. An RTSTRUCT whose
contours name their images (Contour Image Sequence) is split the same way.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from tests.dicom_files import ct_dataset, save
from tests.test_dicom_masks import _box_contour, _items, _mask_job
from tests.test_targets import _build

ROWS, COLUMNS, SLICES = 20, 24, 6
SPACING = (0.8, 0.6)
STEP = 2.5
#: per acquisition: the planted box (first slice, last slice, first row, last row, first column, last column)
BOXES = {1: (1, 3, 2, 8, 3, 10), 2: (2, 5, 10, 17, 12, 21)}
SEGMENTS = {"segments": {"liver": {"id": 4, "codes": ["SCT:10200004"]}}}


def _write_acquisitions(folder: Path, z_start: dict[int, float]) -> dict[int, list[Dataset]]:
    """One CT series of two acquisitions (``z_start``: where each starts, mm), each of
    :data:`SLICES` axial slices; stored values 1000 + 40·k (acquisition 1) or 3000 + 40·k (2),
    so a packed slice tells which it is. Returned per acquisition in position order."""
    rng = random.Random(3)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    out: dict[int, list[Dataset]] = {}
    number = 0
    for acquisition, start in z_start.items():
        for k in range(SLICES):
            number += 1
            pixels = np.full((ROWS, COLUMNS), (1000 if acquisition == 1 else 3000) + 40 * k, dtype=np.int16)
            pixels[::2, ::2] += 8
            ds = ct_dataset(pixels, PatientID="PA", InstanceNumber=number, StudyInstanceUID=study,
                            SeriesInstanceUID=series, FrameOfReferenceUID=frame, AcquisitionNumber=acquisition,
                            ImageOrientationPatient=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                            ImagePositionPatient=[-10.0, -8.0, start + STEP * k], PixelSpacing=list(SPACING),
                            ImageType=["ORIGINAL", "PRIMARY", "AXIAL"], SeriesNumber=1, AccessionNumber="",
                            ReferringPhysicianName="", PatientName="Doe^Jane", PatientSex="F", StudyID="1",
                            Manufacturer="packer-tests", PositionReferenceIndicator="")
            out.setdefault(acquisition, []).append(
                pydicom.dcmread(save(ds, folder / f"{rng.getrandbits(40):010x}.dcm")))
    return out


def _planted(acquisition: int) -> np.ndarray:
    z0, z1, r0, r1, c0, c1 = BOXES[acquisition]
    mask = np.zeros((SLICES, ROWS, COLUMNS), dtype=np.uint8)
    mask[z0:z1 + 1, r0:r1 + 1, c0:c1 + 1] = 4
    return mask


def _write_seg(path: Path, acquisitions: dict[int, list[Dataset]]) -> None:
    """One BINARY SEG (highdicom) over every image of the series: each acquisition's own box.
    highdicom refuses two frames at one position in a SEG it writes, so where the acquisitions
    share their positions each is written alone and the second's frames (their functional groups,
    source references and bit-packed pixels: 20 × 24 bits, whole bytes) are appended to the first."""
    positions = [tuple(ds.ImagePositionPatient) for a in acquisitions.values() for ds in a]
    if len(set(positions)) == len(positions):
        _highdicom_seg(path, [ds for a in sorted(acquisitions) for ds in acquisitions[a]],
                       np.concatenate([_planted(a).astype(bool) for a in sorted(acquisitions)]))
        return
    first, second = sorted(acquisitions)
    _highdicom_seg(path, acquisitions[first], _planted(first).astype(bool))
    _highdicom_seg(path.with_suffix(".other"), acquisitions[second], _planted(second).astype(bool))
    seg, other = pydicom.dcmread(path), pydicom.dcmread(path.with_suffix(".other"))
    path.with_suffix(".other").unlink()
    counts = int(seg.NumberOfFrames), int(other.NumberOfFrames)  # highdicom leaves out empty frames
    assert ROWS * COLUMNS % 8 == 0
    seg.PerFrameFunctionalGroupsSequence.extend(other.PerFrameFunctionalGroupsSequence)
    seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence.extend(
        other.ReferencedSeriesSequence[0].ReferencedInstanceSequence)
    frame_bytes = ROWS * COLUMNS // 8
    seg.PixelData = seg.PixelData[:counts[0] * frame_bytes] + other.PixelData[:counts[1] * frame_bytes]
    seg.NumberOfFrames = sum(counts)
    seg.save_as(path)


def _highdicom_seg(path: Path, sources: list[Dataset], pixels: np.ndarray) -> None:
    description = hd.seg.SegmentDescription(
        segment_number=1, segment_label="Liver",
        segmented_property_category=hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL)
    seg = hd.seg.Segmentation(source_images=sources, pixel_array=pixels,
                              segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
                              segment_descriptions=[description], series_instance_uid=generate_uid(),
                              series_number=2, sop_instance_uid=generate_uid(), instance_number=1,
                              manufacturer="packer-tests", manufacturer_model_name="tests",
                              software_versions="1", device_serial_number="1")
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)


LAYOUTS = {"same positions (pre and post contrast)": {1: 30.0, 2: 30.0},
           "two runs with a gap (chest, then abdomen)": {1: 30.0, 2: 80.0}}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_acquisition_s_slices_carry_its_own_frames_of_the_one_seg(tmp_path: Path, layout: str) -> None:
    raw = tmp_path / "raw"
    acquisitions = _write_acquisitions(raw / "CT", LAYOUTS[layout])
    _write_seg(raw / "SEG" / "seg.dcm", acquisitions)
    # float16 keeps the modality values: a slice's smallest is its stored 1000 + 40·k (acquisition 1)
    # or 3000 + 40·k (2), rescaled, so the order of the smallest values is acquisition 1's k, then 2's
    result = _build(_mask_job(tmp_path / "slices", raw, SEGMENTS, output="float16"))
    items = sorted(_items(result), key=lambda item: float(item["image"].float().min()))
    assert len(items) == 2 * SLICES, [b for b in (result.version_dir / "bad_samples.jsonl").read_text().splitlines()]
    for n, item in enumerate(items):
        acquisition, k = 1 + n // SLICES, n % SLICES
        mask = item["mask"].numpy()
        assert mask.shape == (1, ROWS, COLUMNS)
        assert np.array_equal(mask[0], _planted(acquisition)[k]), (acquisition, k)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_acquisition_s_volume_carries_its_own_frames_of_the_one_seg(tmp_path: Path, layout: str) -> None:
    raw = tmp_path / "raw"
    acquisitions = _write_acquisitions(raw / "CT", LAYOUTS[layout])
    _write_seg(raw / "SEG" / "seg.dcm", acquisitions)
    result = _build(_mask_job(tmp_path / "volume", raw, SEGMENTS, output="float16", sample="volume"))
    items = sorted(_items(result), key=lambda item: float(item["image"].float().min()))
    assert len(items) == 2
    for acquisition, item in enumerate(items, start=1):
        mask = item["mask"].numpy()
        assert mask.shape == (SLICES, ROWS, COLUMNS)
        # an axial head-first series with slices along +z: canonical D runs along z (superior)
        assert np.array_equal(mask, _planted(acquisition)), acquisition


@pytest.mark.slow
def test_the_one_seg_of_two_stacks_has_one_record_whether_used_or_refused(tmp_path: Path) -> None:
    """Each stack paints with (and judges) the SEG, but the file has one row: used, it is left out
    once in excluded.jsonl; refused, it is one bad sample, beside its series' 12 files, and the
    build finishes (two rows made the bad fraction 13 / 12 and the manifest was refused)."""
    raw = tmp_path / "raw"
    acquisitions = _write_acquisitions(raw / "CT", LAYOUTS["two runs with a gap (chest, then abdomen)"])
    _write_seg(raw / "SEG" / "seg.dcm", acquisitions)
    used = _build(_mask_job(tmp_path / "used", raw, SEGMENTS, output="float16", sample="volume"))
    excluded = [json.loads(line) for line in (used.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert [(Path(e["path"]).name, e["why"]) for e in excluded] == [("seg.dcm", "annotation")]
    refused = _build(_mask_job(tmp_path / "refused", raw, {"segments": {"kidney": 3}}, output="float16",
                               sample="volume"))
    bad = [json.loads(line) for line in (refused.version_dir / "bad_samples.jsonl").read_text().splitlines()]
    assert len(bad) == 2 * SLICES + 1 and len({b["sample_id"] for b in bad}) == len(bad)
    assert {b["reason"] for b in bad} == {"annotation_unmapped"}
    assert [b for b in bad if Path(b["path"]).name == "seg.dcm"][0]["message"].endswith(
        "add the names as aliases (names compare without case, spaces or punctuation)")
    manifest = json.loads(refused.manifest_path.read_text())
    assert manifest["bad_samples"]["total"] == 2 * SLICES + 1 and manifest["bad_samples"]["fraction"] == 1.0
    assert not (refused.version_dir / "excluded.jsonl").exists()


def _write_rtstruct(path: Path, acquisitions: dict[int, list[Dataset]]) -> None:
    """One RTSTRUCT over the whole series: ROI 'Liver' with each acquisition's box, one closed
    contour per slice, each naming its image (Contour Image Sequence) as treatment planning
    systems write them."""
    first = next(iter(acquisitions.values()))[0]
    ds = Dataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.481.3"
    ds.SOPInstanceUID = generate_uid()
    ds.Modality = "RTSTRUCT"
    ds.PatientID, ds.PatientName = first.PatientID, first.PatientName
    ds.StudyInstanceUID, ds.SeriesInstanceUID = first.StudyInstanceUID, generate_uid()
    ds.FrameOfReferenceUID = first.FrameOfReferenceUID
    ds.StructureSetLabel = "test"
    series = Dataset()
    series.SeriesInstanceUID = first.SeriesInstanceUID
    series.ContourImageSequence = DicomSequence([_image_ref(s) for a in acquisitions.values() for s in a])
    study = Dataset()
    study.ReferencedSOPInstanceUID = first.StudyInstanceUID
    study.RTReferencedSeriesSequence = DicomSequence([series])
    frame = Dataset()
    frame.FrameOfReferenceUID = first.FrameOfReferenceUID
    frame.RTReferencedStudySequence = DicomSequence([study])
    ds.ReferencedFrameOfReferenceSequence = DicomSequence([frame])
    roi = Dataset()
    roi.ROINumber, roi.ROIName, roi.ReferencedFrameOfReferenceUID = 1, "Liver", first.FrameOfReferenceUID
    contours = []
    for acquisition, slices in sorted(acquisitions.items()):
        z0, z1, r0, r1, c0, c1 = BOXES[acquisition]
        for k in range(z0, z1 + 1):
            contour = Dataset()
            contour.ContourGeometricType = "CLOSED_PLANAR"
            data = _box_contour(slices[k], r0, r1, c0, c1)
            contour.NumberOfContourPoints = len(data) // 3
            contour.ContourData = [round(v, 4) for v in data]
            contour.ContourImageSequence = DicomSequence([_image_ref(slices[k])])
            contours.append(contour)
    item = Dataset()
    item.ReferencedROINumber = 1
    item.ContourSequence = DicomSequence(contours)
    ds.StructureSetROISequence = DicomSequence([roi])
    ds.ROIContourSequence = DicomSequence([item])
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    path.parent.mkdir(parents=True, exist_ok=True)
    save(ds, path)


def _image_ref(image: Dataset) -> Dataset:
    item = Dataset()
    item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = image.SOPClassUID, image.SOPInstanceUID
    return item


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_acquisition_s_volume_carries_its_own_contours_of_the_one_rtstruct(tmp_path: Path, layout: str) -> None:
    raw = tmp_path / "raw"
    acquisitions = _write_acquisitions(raw / "CT", LAYOUTS[layout])
    _write_rtstruct(raw / "RT" / "rt.dcm", acquisitions)
    result = _build(_mask_job(tmp_path / "volume", raw, {"rois": {"liver": 4}}, output="float16", sample="volume"))
    items = sorted(_items(result), key=lambda item: float(item["image"].float().min()))
    assert len(items) == 2, (result.version_dir / "bad_samples.jsonl").read_text()
    for acquisition, item in enumerate(items, start=1):
        assert np.array_equal(item["mask"].numpy(), _planted(acquisition)), acquisition


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_roi_drawn_on_the_other_acquisition_is_no_note_on_this_one(tmp_path: Path, layout: str) -> None:
    """The liver's contours all name acquisition 2's images: painting acquisition 1's stack
    noted "ROI 'Liver': has no contour (an empty Contour Sequence or none)", false of the file,
    and which stack's note the object's one record kept depended on UID order."""
    from packer.read.annotations import Painter
    from packer.read.rtstruct import paint_rtstruct
    from packer.structures import Structure, StructureMap
    from tests.test_seg import places

    acquisitions = _write_acquisitions(tmp_path / "CT", LAYOUTS[layout])
    path = tmp_path / "rt.dcm"
    _write_rtstruct(path, {2: acquisitions[2]})
    rois = StructureMap((Structure("liver", 4, ("Liver",)),))
    notes = {}
    for this, other in ((1, 2), (2, 1)):
        stack = places(acquisitions[this])
        painter = Painter((len(stack), stack[0].rows, stack[0].columns), rois, overlap="later_wins", path=str(path))
        drawn = paint_rtstruct(str(path), stack, rois, painter,
                               elsewhere=frozenset(s.SOPInstanceUID for s in acquisitions[other]))
        notes[this] = drawn.notes
        assert bool(painter.labels.any()) == (this == 2) and drawn.elsewhere == (this == 1)
    assert notes == {1: (), 2: ()}, notes


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_segment_drawn_on_the_other_acquisition_is_no_empty_note_on_this_one(tmp_path: Path, layout: str) -> None:
    """A SEG drawn on acquisition 2 alone: painting acquisition 1's stack noted "segment 1
    ('liver') has no frames: empty", false of the file, and the object's one record kept that
    note or not by UID order. Its frames are the other stack's, so this stack notes nothing."""
    from packer.read.annotations import Painter
    from packer.read.seg import paint_seg
    from packer.structures import Structure, StructureMap
    from tests.test_seg import places

    acquisitions = _write_acquisitions(tmp_path / "CT", LAYOUTS[layout])
    path = tmp_path / "seg.dcm"
    _highdicom_seg(path, acquisitions[2], _planted(2).astype(bool))
    segments = StructureMap((Structure("liver", 4, ("Liver",)),))
    for this, other in ((1, 2), (2, 1)):
        stack = places(acquisitions[this])
        painter = Painter((len(stack), stack[0].rows, stack[0].columns), segments, overlap="later_wins",
                          path=str(path))
        drawn = paint_seg(str(path), stack, segments, painter,
                          elsewhere=frozenset(s.SOPInstanceUID for s in acquisitions[other]))
        assert drawn.notes == () and bool(painter.labels.any()) == (this == 2), (this, drawn.notes)
        assert drawn.elsewhere == (this == 1)  # drawn on the other stack alone: none of it is this one's


@pytest.mark.parametrize("kind", ["SEG", "RTSTRUCT"])
def test_a_stack_annotated_only_on_the_other_acquisition_is_mask_missing_not_a_wrong_map(tmp_path: Path,
                                                                                          kind: str) -> None:
    """An annotation drawn on acquisition 2 alone, under mask.empty: bad: acquisition 1's stack
    paints nothing, and was refused as mask_empty advising "fix the map (segments, rois)",
    although the map is right (acquisition 2 packs with its liver). No annotation references
    that stack's images: it is mask_missing, as a series no annotation references, and says so."""
    raw = tmp_path / "raw"
    acquisitions = _write_acquisitions(raw / "CT", LAYOUTS["same positions (pre and post contrast)"])
    if kind == "SEG":
        _highdicom_seg(raw / "SEG" / "seg.dcm", acquisitions[2], _planted(2).astype(bool))
        mask: dict[str, object] = {**SEGMENTS, "empty": "bad"}
    else:
        _write_rtstruct(raw / "RT" / "rt.dcm", {2: acquisitions[2]})
        mask = {"rois": {"liver": 4}, "empty": "bad"}
    result = _build(_mask_job(tmp_path / "out", raw, mask, output="float16", sample="volume"))
    (item,) = _items(result)
    assert np.array_equal(item["mask"].numpy(), _planted(2))
    bad = [json.loads(line) for line in (result.version_dir / "bad_samples.jsonl").read_text().splitlines()]
    first = {str(raw / "CT" / Path(ds.filename).name) for ds in acquisitions[1]}
    assert {b["path"] for b in bad} == first
    assert {b["reason"] for b in bad} == {"mask_missing"}
    message = bad[0]["message"]
    assert "no SEG or RTSTRUCT references this acquisition's images" in message and "fix the map" not in message
    assert "add this acquisition's annotation, or set empty: keep" in message


def test_an_object_read_by_several_stacks_keeps_the_record_with_its_notes() -> None:
    """A file several stacks read has one row in excluded.jsonl: which stack's row was kept went
    by sort order, so an RTSTRUCT's note (a POINT contour skipped) was lost whenever the other
    acquisition's stack, which drew none of it, sorted first."""
    from packer.pipeline.stages import one_record_per_file
    from packer.records import Excluded

    plain = Excluded(sample_id="rt", path="/raw/rt.dcm", stage="transform", why="annotation",
                     detail="RTSTRUCT: the mask of a series of 6 slices (6 files)")
    noted = Excluded(sample_id="rt", path="/raw/rt.dcm", stage="transform", why="annotation",
                     detail="RTSTRUCT: the mask of a series of 6 slices (6 files); 1 note(s): ROI 'Liver': a POINT")
    for records in ([plain, noted], [noted, plain]):
        _, (kept,) = one_record_per_file([], records)
        assert kept == noted

