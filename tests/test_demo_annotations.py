"""The demo's annotated tree (demo-raw/annotated/): SEG and RTSTRUCT objects that say what the README
says, lie on the pixels they name, and the two planted broken objects. Checked with highdicom (SEG),
pydicom and scikit-image's polygon fill (RTSTRUCT), never with packer's own annotation readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import highdicom as hd
import numpy as np
import pydicom
import pytest
from skimage.draw import polygon as fill_polygon

from packer.demo import DEMO_MTIME
from packer.demo_annotations import (
    CLASSES,
    LIVER_CODE,
    PATIENTS,
    RING_SLICES,
    ROI_NAMES,
    SEGMENT_LABELS,
    TUMOUR_CODE,
    UNMAPPED_ROI,
    AnnotatedDemo,
    truth_labels,
    write_annotated_examples,
)

REPO = Path(__file__).resolve().parents[1]
#: HU each structure is drawn with (packer/demo_annotations.py, _render_hu), noise σ 12.
HU = {"body": 40.0, "lung": -850.0, "heart": 50.0, "liver": 65.0, "tumour": 20.0}
#: Chest slices (lungs, heart) per annotated patient: the top 45% of 24 and of 20 slices.
CHEST = {"ANN001": 11, "ANN002": 9}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> AnnotatedDemo:
    return write_annotated_examples(tmp_path_factory.mktemp("annotated"), seed=0)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _series(root: Path, patient: str) -> list[pydicom.Dataset]:
    """The patient's CT slices, in ascending z (Image Position, not file name or Instance Number)."""
    slices = [pydicom.dcmread(p) for p in sorted((root / patient / "CT").glob("*.dcm"))]
    return sorted(slices, key=lambda ds: float(ds.ImagePositionPatient[2]))


def _hu(ds: pydicom.Dataset) -> np.ndarray:
    return ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)


def _contours(rt: pydicom.Dataset) -> dict[str, list[np.ndarray]]:
    """ROI name → its contours as N×3 arrays (mm)."""
    names = {int(roi.ROINumber): str(roi.ROIName) for roi in rt.StructureSetROISequence}
    return {names[int(item.ReferencedROINumber)]: [np.asarray(c.ContourData, dtype=float).reshape(-1, 3)
                                                  for c in item.ContourSequence]
            for item in rt.ROIContourSequence}


def _fill(points: np.ndarray, ds: pydicom.Dataset) -> np.ndarray:
    """Pixels whose centre lies inside the contour (axial slice: column from x, row from y)."""
    x0, y0 = float(ds.ImagePositionPatient[0]), float(ds.ImagePositionPatient[1])
    d_row, d_col = (float(v) for v in ds.PixelSpacing)
    out = np.zeros((int(ds.Rows), int(ds.Columns)), dtype=bool)
    rr, cc = fill_polygon((points[:, 1] - y0) / d_row, (points[:, 0] - x0) / d_col, out.shape)
    out[rr, cc] = True
    return out


def test_the_tree_is_a_pure_function_of_the_seed(tree: AnnotatedDemo, tmp_path: Path) -> None:
    first = _files(tree.root)
    assert _files(write_annotated_examples(tmp_path / "again", seed=0).root) == first
    other = _files(write_annotated_examples(tmp_path / "other", seed=1).root)
    assert other.keys() == first.keys()
    assert all(other[name] != first[name] for name in first)


def test_the_layout_and_counts(tree: AnnotatedDemo) -> None:
    files = set(_files(tree.root))
    for patient, (count, _, _, _) in PATIENTS.items():
        assert len([f for f in files if f.startswith(f"{patient}/CT/")]) == count
    assert dict(tree.slices) == {p: spec[0] for p, spec in PATIENTS.items()}
    assert set(tree.annotations) == {f"{p}/{k}" for p in ("ANN001", "ANN002")
                                     for k in ("SEG/seg.dcm", "RTSTRUCT/rtstruct.dcm")}
    assert {"broken/orphan_seg.dcm", "broken/offslice_rtstruct.dcm"} <= files
    assert not any(f.startswith("ANN003/") and "/CT/" not in f for f in files)
    assert {(d.relpath, d.reason) for d in tree.defects} == {
        ("broken/orphan_seg.dcm", "annotation_orphan"), ("broken/offslice_rtstruct.dcm", "contour_off_slice"),
        *((f"ANN004/CT/IM{n:04d}.dcm", "contour_off_slice") for n in range(1, 7))}
    assert tree.unmapped == (UNMAPPED_ROI,)


def test_ann002_is_numbered_against_its_positions(tree: AnnotatedDemo) -> None:
    numbers = [int(ds.InstanceNumber) for ds in _series(tree.root, "ANN002")]
    assert sorted(numbers) == list(range(1, 21)) and numbers != sorted(numbers)
    zs = [float(ds.ImagePositionPatient[2]) for ds in _series(tree.root, "ANN002")]
    assert np.allclose(np.diff(zs), 3.0)


@pytest.mark.parametrize("patient", ["ANN001", "ANN002"])
def test_highdicom_reads_the_seg_on_its_series(tree: AnnotatedDemo, patient: str) -> None:
    seg = hd.seg.segread(tree.root / patient / "SEG" / "seg.dcm")
    series = _series(tree.root, patient)
    assert seg.segmentation_type == hd.seg.SegmentationTypeValues.BINARY
    labels = SEGMENT_LABELS[patient]
    assert [str(s.SegmentLabel) for s in seg.SegmentSequence] == [labels["liver"], labels["tumour"]]
    codes = [(str(c.CodeValue), str(c.CodingSchemeDesignator)) for s in seg.SegmentSequence
             for c in s.SegmentedPropertyTypeCodeSequence]
    assert codes == [LIVER_CODE[:2], TUMOUR_CODE[:2]]
    assert seg.FrameOfReferenceUID == series[0].FrameOfReferenceUID
    assert {str(item.SeriesInstanceUID) for item in seg.ReferencedSeriesSequence} == {series[0].SeriesInstanceUID}
    sources = {uid for _, _, uid in seg.get_source_image_uids()}
    assert sources == {str(ds.SOPInstanceUID) for ds in series}
    # every frame on the slice it names: liver pixels read ~65 HU in the CT, tumour pixels ~20 HU
    uids = [str(ds.SOPInstanceUID) for ds in series]
    pixels = seg.get_pixels_by_source_instance(source_sop_instance_uids=uids, segment_numbers=[1, 2])
    liver, tumour = pixels[..., 0].astype(bool), pixels[..., 1].astype(bool)
    hu = np.stack([_hu(ds) for ds in series])
    assert liver.sum() > 500 and tumour.sum() > 30
    assert not (tumour & ~liver).any()                     # the tumour lies inside the liver
    assert abs(np.median(hu[liver & ~tumour]) - HU["liver"]) < 5
    assert abs(np.median(hu[tumour]) - HU["tumour"]) < 5
    assert not liver[-CHEST[patient]:].any()              # no liver on the chest slices


@pytest.mark.parametrize("patient", ["ANN001", "ANN002"])
def test_the_rtstruct_names_its_rois_and_lies_on_the_slices(tree: AnnotatedDemo, patient: str) -> None:
    rt = pydicom.dcmread(tree.root / patient / "RTSTRUCT" / "rtstruct.dcm")
    series = _series(tree.root, patient)
    assert rt.SOPClassUID == "1.2.840.10008.5.1.4.1.1.481.3" and rt.Modality == "RTSTRUCT"
    names = ROI_NAMES[patient]
    expected = {names["body"]: len(series), names["lung_left"]: CHEST[patient] + RING_SLICES,
                names["lung_right"]: CHEST[patient], names["heart"]: CHEST[patient]}
    if patient == "ANN001":
        expected[UNMAPPED_ROI] = 1
    contours = _contours(rt)
    assert {name: len(items) for name, items in contours.items()} == expected
    kinds = {int(o.ReferencedROINumber): str(o.RTROIInterpretedType) for o in rt.RTROIObservationsSequence}
    by_name = {str(r.ROIName): kinds[int(r.ROINumber)] for r in rt.StructureSetROISequence}
    assert by_name[names["body"]] == "EXTERNAL" and by_name[names["heart"]] == "ORGAN"
    ref = rt.ReferencedFrameOfReferenceSequence[0]
    assert ref.FrameOfReferenceUID == series[0].FrameOfReferenceUID
    ref_series = ref.RTReferencedStudySequence[0].RTReferencedSeriesSequence[0]
    assert ref_series.SeriesInstanceUID == series[0].SeriesInstanceUID
    assert {str(i.ReferencedSOPInstanceUID) for i in ref_series.ContourImageSequence} == {
        str(ds.SOPInstanceUID) for ds in series}
    by_z = {round(float(ds.ImagePositionPatient[2]), 3): ds for ds in series}
    for roi in rt.ROIContourSequence:
        for item in roi.ContourSequence:
            assert item.ContourGeometricType == "CLOSED_PLANAR"
            z = {round(float(v), 3) for v in item.ContourData[2::3]}
            assert len(z) == 1 and z <= by_z.keys()       # planar, on a slice's z
            assert item.ContourImageSequence[0].ReferencedSOPInstanceUID == by_z[z.pop()].SOPInstanceUID
    # the contours enclose the tissue they name: rasterised independently, they read its HU
    for name, key in ((names["body"], "body"), (names["lung_right"], "lung"), (names["heart"], "heart")):
        for points in contours[name]:
            ds = by_z[round(points[0, 2], 3)]
            inside = _fill(points, ds)
            if key == "body":
                hu = _hu(ds)                              # air (-1000) outside, none inside
                assert (hu[~inside] < -950).mean() > 0.99 and (hu[inside] < -950).mean() < 0.02
            else:
                assert abs(np.median(_hu(ds)[inside]) - HU[key]) < 10


def test_the_left_lung_is_a_ring_around_the_heart_on_the_top_slices(tree: AnnotatedDemo) -> None:
    for patient in ("ANN001", "ANN002"):
        series = _series(tree.root, patient)
        by_z = {round(float(ds.ImagePositionPatient[2]), 3): ds for ds in series}
        contours = _contours(pydicom.dcmread(tree.root / patient / "RTSTRUCT" / "rtstruct.dcm"))
        lung = contours[ROI_NAMES[patient]["lung_left"]]
        heart = {round(c[0, 2], 3): c for c in contours[ROI_NAMES[patient]["heart"]]}
        per_z: dict[float, list[np.ndarray]] = {}
        for points in lung:
            per_z.setdefault(round(points[0, 2], 3), []).append(points)
        rings = sorted(z for z, items in per_z.items() if len(items) == 2)
        assert rings == sorted(by_z)[-RING_SLICES:]
        for z in rings:
            ds = by_z[z]
            outer, inner = (_fill(points, ds) for points in per_z[z])
            assert inner.sum() > 20 and not (inner & ~outer).any()   # the inner contour lies inside the outer
            ring = outer ^ inner                                      # the even-odd rule: the inner one is a hole
            hu = _hu(ds)
            assert abs(np.median(hu[ring]) - HU["lung"]) < 10
            assert abs(np.median(hu[inner]) - HU["heart"]) < 10
            assert (_fill(heart[z], ds) == inner).all()               # the hole is the heart's outline


def test_the_orphan_seg_references_no_written_series(tree: AnnotatedDemo) -> None:
    seg = hd.seg.segread(tree.root / "broken" / "orphan_seg.dcm")
    written = [pydicom.dcmread(p, stop_before_pixels=True) for p in tree.root.glob("ANN*/CT/*.dcm")]
    series = {str(ds.SeriesInstanceUID) for ds in written}
    instances = {str(ds.SOPInstanceUID) for ds in written}
    referenced = {str(item.SeriesInstanceUID) for item in seg.ReferencedSeriesSequence}
    assert referenced and not referenced & series
    assert not {uid for _, _, uid in seg.get_source_image_uids()} & instances
    assert seg.number_of_segments == 2 and int(seg.NumberOfFrames) > 0  # a valid SEG otherwise


def test_the_off_slice_contour_lies_halfway_between_two_slices(tree: AnnotatedDemo) -> None:
    rt = pydicom.dcmread(tree.root / "broken" / "offslice_rtstruct.dcm")
    series = _series(tree.root, "ANN004")
    zs = [float(ds.ImagePositionPatient[2]) for ds in series]
    assert rt.ReferencedFrameOfReferenceSequence[0].RTReferencedStudySequence[0].RTReferencedSeriesSequence[
        0].SeriesInstanceUID == series[0].SeriesInstanceUID
    heights = [float(c.ContourData[2]) for c in rt.ROIContourSequence[0].ContourSequence]
    off = [z for z in heights if min(abs(z - s) for s in zs) > 1e-3]
    assert len(off) == 1 and len(heights) == len(zs) + 1
    below = max(s for s in zs if s < off[0])
    above = min(s for s in zs if s > off[0])
    assert off[0] == pytest.approx((below + above) / 2)


def test_truth_labels(tree: AnnotatedDemo) -> None:
    ann001 = truth_labels(0, "ANN001")
    assert ann001.shape == (24, 64, 64) and ann001.dtype == np.uint8
    assert set(np.unique(ann001)) == {0, *CLASSES.values()}
    assert not truth_labels(0, "ANN003").any()
    # the truth matches the CT: each class's pixels read its HU
    hu = np.stack([_hu(ds) for ds in _series(tree.root, "ANN002")])
    ann002 = truth_labels(0, "ANN002")
    assert ann002.shape == hu.shape
    for name, class_id in CLASSES.items():
        assert abs(np.median(hu[ann002 == class_id]) - HU[name]) < 5, name


def test_the_demo_tree_holds_the_annotated_tree(demo_raw: Any) -> None:
    root = Path(demo_raw.root)
    assert demo_raw.annotated is not None
    files = [p for p in (root / "annotated").rglob("*") if p.is_file()]
    assert len(files) == sum(spec[0] for spec in PATIENTS.values()) + 6
    assert {int(p.stat().st_mtime) for p in files} == {DEMO_MTIME}
    readme = (root / "README.txt").read_text(encoding="utf-8")
    assert "annotated/broken/orphan_seg.dcm -> annotation_orphan" in readme
    assert "annotated/ANN004/CT/IM0001.dcm -> contour_off_slice" in readme


@pytest.mark.parametrize("job", ["annotated-slices.yaml", "annotated-stacks.yaml", "annotated-volume.yaml"])
def test_the_job_files_load(job: str) -> None:
    from packer.config import load_job

    loaded = load_job(REPO / "workflows" / job)
    assert loaded.sources[0].mask is not None
