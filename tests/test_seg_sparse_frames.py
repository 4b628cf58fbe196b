"""A DICOM SEG whose frames are sparse along the slice normal: annotators who draw every other
slice, beside SEGs of thick slabs whose frames lie far apart.

highdicom writes a SEG of the frames it is given: drawn on slices 1 and 3 of a 2 mm series (2 mm
thick slices), it holds two frames, each on its slice and referencing it as its source, with
SliceThickness 2 mm (the sources') and SpacingBetweenSlices 4 mm (the gap between its frames). A
frame that references one slice of the series, lies on it, is on its pixel grid and is no thicker
than that slice (its own SliceThickness against the slice's) was drawn on that slice: it is copied
onto it whatever the SEG's SpacingBetweenSlices, and the slices between, never annotated, stay
empty (as highdicom's ``get_volume`` and every viewer show them). Every other frame follows the
rules of before: a frame thicker than its slice is a slab, and a SEG whose spacing is not the
series' is on another grid (``mask_geometry`` under ``grid: require``; resampled under
``grid: resample``, each slice taking the nearest frame within half the SEG's spacing). Where a
thickness is unknown (Type 2, empty) a thin frame cannot be told from a slab, and the rules of
before hold as well.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.tag import Tag
from pydicom.uid import generate_uid

from packer.read.annotations import AnnotationError, SlicePlace
from packer.read.dicom_series import slice_geometry
from tests.dicom_files import ct_dataset, save
from tests.test_dicom_masks import _items, _mask_job
from tests.test_seg import BOX, Grid, ct_series, paint, places, write_seg
from tests.test_targets import _build

GRID = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=5, step=2.0, origin=(-10.0, -8.0, 0.0))
SLICE_THICKNESS = Tag(0x0018, 0x0050)
SEVEN = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=7, step=2.0, origin=(-10.0, -8.0, 0.0))


def _box(rows: slice, columns: slice, grid: Grid = GRID) -> np.ndarray:
    out = np.zeros((grid.rows, grid.columns), dtype=bool)
    out[rows, columns] = True
    return out


#: what the annotator drew, by slice (each mask different, so a test sees which frame reached a slice)
DRAWN = {0: _box(slice(1, 5), slice(2, 6)), 1: _box(slice(2, 9), slice(3, 12)), 2: _box(slice(3, 6), slice(1, 16)),
         3: _box(slice(4, 7), slice(8, 15)), 4: _box(slice(6, 11), slice(5, 9)), 5: _box(slice(0, 3), slice(10, 17)),
         6: _box(slice(7, 12), slice(0, 4))}


def header_places(sources: list[Dataset]) -> list[SlicePlace]:
    """The series' slice places with each slice's SliceThickness as the header pass reads it
    (:func:`slice_geometry`, per frame for a multi-frame source), as series linking builds them."""
    read = {ds.SOPInstanceUID: slice_geometry(ds) for ds in sources}
    return [replace(p, thickness=read[p.sop_uid].thicknesses[p.frame]) for p in places(sources)]


def _by_slice(sources: list[Dataset], grid: Grid) -> dict[int, Dataset]:
    """The series' datasets by slice index along the normal."""
    return {int(round((float(ds.ImagePositionPatient[2]) - grid.origin[2]) / grid.step)): ds for ds in sources}


def _drawn_on(path: Path, sources: list[Dataset], grid: Grid, drawn: dict[int, np.ndarray]) -> Path:
    """A SEG by highdicom drawn on the slices ``drawn`` names (slice → mask), from those source images."""
    by_slice = _by_slice(sources, grid)
    order = sorted(drawn)
    return write_seg(path, [by_slice[k] for k in order], np.stack([drawn[k] for k in order])[..., None], ["Cube_A"])


def _measures(path: Path, *, thickness: float | None = None, between: float | None = None) -> Path:
    """Rewrite the SEG's shared Pixel Measures: SliceThickness (``0``: emptied) and SpacingBetweenSlices."""
    ds = pydicom.dcmread(path)
    measures = ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    if thickness is not None:
        measures.SliceThickness = thickness if thickness else None
    if between is not None:
        measures.SpacingBetweenSlices = between
    ds.save_as(path)
    return path


def _expected(drawn: dict[int, np.ndarray], grid: Grid = GRID) -> np.ndarray:
    out = np.zeros((grid.n, grid.rows, grid.columns), dtype=np.uint8)
    for k, mask in drawn.items():
        out[k][mask] = BOX.id
    return out


def test_the_header_pass_reads_each_slices_own_slice_thickness() -> None:
    """SliceThickness of a single-frame slice, and of each frame of an enhanced multi-frame source
    from its Pixel Measures (per frame, else shared); None where it is empty (Type 2), 0, negative or
    no number: such a value says nothing of the slice, and is never a reason to refuse the file."""
    sources = ct_series(GRID, seed=3)
    assert [slice_geometry(ds).thicknesses for ds in sources] == [(2.0,)] * GRID.n
    for value in (b"", b"0 ", b"-2", b"2,5 "):  # as a file holds them (pydicom refuses to set "2,5")
        sources[0][SLICE_THICKNESS] = RawDataElement(SLICE_THICKNESS, "DS", len(value), value, 0, False, True)
        assert slice_geometry(sources[0]).thicknesses == (None,), value
    del sources[0].SliceThickness
    assert slice_geometry(sources[0]).thicknesses == (None,)
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=ct_series(GRID, seed=4), series_instance_uid=generate_uid(), series_number=2,
        sop_instance_uid=generate_uid(), instance_number=1)
    assert "SliceThickness" not in enhanced  # in the shared Pixel Measures only
    assert slice_geometry(enhanced).thicknesses == (2.0,) * GRID.n
    own = Dataset()
    own.SliceThickness = 3.0
    enhanced.PerFrameFunctionalGroupsSequence[2].PixelMeasuresSequence = [own]
    assert slice_geometry(enhanced).thicknesses == (2.0, 2.0, 3.0, 2.0, 2.0)


def test_highdicom_writes_the_every_other_slice_seg_with_its_frames_on_and_referencing_their_slices(
        tmp_path: Path) -> None:
    """The premise: the SEG's SpacingBetweenSlices (4 mm) is not the series' step (2 mm), but each
    frame lies on the slice it references, and its SliceThickness is that slice's."""
    sources = ct_series(GRID, seed=11)
    path = _drawn_on(tmp_path / "seg.dcm", sources, GRID, {1: DRAWN[1], 3: DRAWN[3]})
    seg = pydicom.dcmread(path)
    measures = seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert (float(measures.SpacingBetweenSlices), float(measures.SliceThickness)) == (4.0, 2.0)
    by_uid = {ds.SOPInstanceUID: k for k, ds in _by_slice(sources, GRID).items()}
    referenced = []
    for item in seg.PerFrameFunctionalGroupsSequence:
        k = by_uid[item.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID]
        np.testing.assert_allclose(item.PlanePositionSequence[0].ImagePositionPatient, GRID.position(k))
        referenced.append(k)
    assert sorted(referenced) == [1, 3]


@pytest.mark.parametrize("grid", ["require", "resample"])
def test_frames_drawn_on_every_other_slice_go_to_the_slices_they_reference_only(tmp_path: Path, grid: str) -> None:
    """No geometry mismatch: grid: require accepts the SEG (it was mask_geometry, advising resample),
    and the never-annotated slices 0, 2 and 4 stay empty (resample painted them from the
    neighbouring frames, 2.4 times the volume drawn)."""
    sources = ct_series(GRID, seed=11)
    drawn = {1: DRAWN[1], 3: DRAWN[3]}
    path = _drawn_on(tmp_path / "seg.dcm", sources, GRID, drawn)
    labels, result = paint(path, header_places(sources), grid=grid)
    np.testing.assert_array_equal(labels, _expected(drawn))
    assert result.notes == ()  # type: ignore[attr-defined]


def test_frames_drawn_on_every_other_frame_of_an_enhanced_source_go_to_those_frames(tmp_path: Path) -> None:
    """The same on a multi-frame source (a Legacy Converted Enhanced CT): frames reference it by
    Referenced Frame Number, and its frames' thickness is its shared Pixel Measures'. (highdicom
    copies the source's SpacingBetweenSlices, 2 mm, into such a SEG; a writer that writes its
    frames' gap, 4 mm, as highdicom does for single-frame sources, is the case here.)"""
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=ct_series(GRID, seed=5), series_instance_uid=generate_uid(), series_number=2,
        sop_instance_uid=generate_uid(), instance_number=1)
    depth = [round((float(item.PlanePositionSequence[0].ImagePositionPatient[2]) - GRID.origin[2]) / GRID.step)
             for item in enhanced.PerFrameFunctionalGroupsSequence]
    pixels = np.stack([DRAWN[1] if k == 1 else DRAWN[3] if k == 3 else np.zeros_like(DRAWN[1]) for k in depth])
    path = _measures(write_seg(tmp_path / "mf.dcm", [enhanced], pixels[..., None], ["Cube_A"]), between=4.0)
    assert int(pydicom.dcmread(path).NumberOfFrames) == 2  # the empty frames omitted
    labels, result = paint(path, header_places([enhanced]))
    np.testing.assert_array_equal(labels, _expected({1: DRAWN[1], 3: DRAWN[3]}))
    assert result.notes == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize("unknown", ["the slices'", "the SEG's"])
def test_without_a_slice_thickness_the_seg_spacing_decides_as_before(tmp_path: Path, unknown: str) -> None:
    """A series whose SliceThickness is empty (Type 2), or a SEG that writes none: whether a frame is
    a thin drawing or a slab cannot be told, so the SEG's 4 mm spacing against the series' 2 mm makes
    it another grid, as before: mask_geometry under require; under resample each slice takes the
    nearest frame within half of 4 mm (slice 2, midway, the lower)."""
    sources = ct_series(GRID, seed=11)
    path = _drawn_on(tmp_path / "seg.dcm", sources, GRID, {1: DRAWN[1], 3: DRAWN[3]})
    if unknown == "the SEG's":
        _measures(path, thickness=0)
        assert not pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SliceThickness
    else:
        for ds in sources:
            ds.SliceThickness = None
    slices = header_places(sources)
    assert all(p.thickness is None for p in slices) == (unknown == "the slices'")
    with pytest.raises(AnnotationError) as err:
        paint(path, slices)
    assert err.value.reason == "mask_geometry" and "SpacingBetweenSlices 4 mm" in err.value.message
    labels, _ = paint(path, slices, grid="resample")
    np.testing.assert_array_equal(labels, _expected({0: DRAWN[1], 1: DRAWN[1], 2: DRAWN[1], 3: DRAWN[3],
                                                     4: DRAWN[3]}))


def test_a_frame_that_references_its_slice_but_lies_off_it_is_still_compared_for_slice_spacing(
        tmp_path: Path) -> None:
    """Copying by reference needs the frame to lie on its slice (to 1e-3 mm): one shifted 0.4 mm
    along the normal (within half a step of its slice, so no contradiction) is on a SEG that samples
    the normal every 4 mm, another grid: mask_geometry under require."""
    sources = ct_series(GRID, seed=11)
    path = _drawn_on(tmp_path / "seg.dcm", sources, GRID, {1: DRAWN[1], 3: DRAWN[3]})
    seg = pydicom.dcmread(path)
    moved = seg.PerFrameFunctionalGroupsSequence[1].PlanePositionSequence[0]
    moved.ImagePositionPatient = [*moved.ImagePositionPatient[:2], float(moved.ImagePositionPatient[2]) + 0.4]
    seg.save_as(path)
    with pytest.raises(AnnotationError) as err:
        paint(path, header_places(sources))
    assert err.value.reason == "mask_geometry" and "SpacingBetweenSlices 4 mm" in err.value.message


def test_a_thick_slab_seg_referencing_series_slices_stays_a_slab(tmp_path: Path) -> None:
    """Frames 6 mm thick (SliceThickness and SpacingBetweenSlices 6 mm) on slices 1 and 4 of a 2 mm
    series, each referencing the slice it lies on: each stands for a 6 mm slab, not for its one slice
    (copied onto it alone, the mask would be a third of what was drawn). Thicker than the slice it
    references, it is another grid as before: mask_geometry under require, and under resample each
    slice within 3 mm of a frame takes it (slice 6, 4 mm from the last, none)."""
    sources = ct_series(SEVEN, seed=12)
    path = _measures(_drawn_on(tmp_path / "slab.dcm", sources, SEVEN, {1: DRAWN[1], 4: DRAWN[4]}),
                     thickness=6.0, between=6.0)
    slices = header_places(sources)
    with pytest.raises(AnnotationError) as err:
        paint(path, slices)
    assert err.value.reason == "mask_geometry" and "mask.grid: resample" in err.value.message
    labels, result = paint(path, slices, grid="resample")
    expected = _expected({0: DRAWN[1], 1: DRAWN[1], 2: DRAWN[1], 3: DRAWN[4], 4: DRAWN[4], 5: DRAWN[4]}, SEVEN)
    np.testing.assert_array_equal(labels, expected)
    assert result.notes == ()  # type: ignore[attr-defined]


def test_touching_slabs_of_a_thick_reconstruction_leave_no_slice_empty(tmp_path: Path) -> None:
    """4 mm slabs on slices 0, 2 and 4 of a 2 mm series (a 4 mm reconstruction's, its frames
    referencing the thin slices they lie on), the same box on each: slices 1 and 3 lie on the
    boundary of two slabs that both hold the box, and are painted; no slice is left empty (a
    striped mask). Thicker than their slices, the frames are resampled as before."""
    sources = ct_series(GRID, seed=11)
    box = DRAWN[1]
    path = _measures(_drawn_on(tmp_path / "slabs.dcm", sources, GRID, {0: box, 2: box, 4: box}), thickness=4.0)
    assert float(pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
                 .SpacingBetweenSlices) == 4.0
    slices = header_places(sources)
    with pytest.raises(AnnotationError) as err:
        paint(path, slices)
    assert err.value.reason == "mask_geometry"
    labels, result = paint(path, slices, grid="resample")
    np.testing.assert_array_equal(labels, _expected({k: box for k in range(GRID.n)}))
    assert result.notes == ()  # type: ignore[attr-defined]


def test_an_omitted_empty_slab_leaves_its_boundary_to_its_neighbour(tmp_path: Path) -> None:
    """4 mm slabs on slices 0, 2, 4 and 6 of a 2 mm series, the slab of slice 4 empty (highdicom
    omits it): slice 3, on the boundary of slabs 2 and 4, takes slab 2 (the nearest frame there is,
    within half the SEG's 4 mm); slice 4, 4 mm from the frames either side, is empty; slice 5 takes
    slab 6. As before: the frames are thicker than their slices."""
    sources = ct_series(SEVEN, seed=14)
    drawn = {0: DRAWN[0], 2: DRAWN[2], 4: np.zeros_like(DRAWN[0]), 6: DRAWN[6]}
    path = _measures(_drawn_on(tmp_path / "slabs.dcm", sources, SEVEN, drawn), thickness=4.0, between=4.0)
    assert int(pydicom.dcmread(path).NumberOfFrames) == 3
    labels, result = paint(path, header_places(sources), grid="resample")
    expected = _expected({0: DRAWN[0], 1: DRAWN[0], 2: DRAWN[2], 3: DRAWN[2], 5: DRAWN[6], 6: DRAWN[6]}, SEVEN)
    np.testing.assert_array_equal(labels, expected)
    assert result.notes == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize("grid", ["require", "resample"])
def test_an_overlapping_reconstruction_annotated_every_other_slice_keeps_the_skipped_slices_empty(
        tmp_path: Path, grid: str) -> None:
    """Slices 3 mm thick every 1.5 mm (an overlapping reconstruction), drawn on slices 1, 3 and 5:
    the SEG's frames are 3 mm apart and 3 mm thick, each on the slice it references and as thick as
    that slice. Each was drawn on that slice, so it is copied there. The slices between overlap the
    drawn ones by half their thickness, but nobody drew on them: a viewer shows them empty, and the
    mask keeps them empty rather than inventing half of each neighbour's outline onto them."""
    overlapping = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=7, step=1.5, origin=(-10.0, -8.0, 0.0))
    sources = ct_series(overlapping, seed=15)
    for ds in sources:
        ds.SliceThickness = 3.0
    drawn = {1: DRAWN[1], 3: DRAWN[3], 5: DRAWN[5]}
    path = _drawn_on(tmp_path / "seg.dcm", sources, overlapping, drawn)
    measures = pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert (float(measures.SpacingBetweenSlices), float(measures.SliceThickness)) == (3.0, 3.0)
    labels, result = paint(path, header_places(sources), grid=grid)
    np.testing.assert_array_equal(labels, _expected(drawn, overlapping))
    assert result.notes == ()  # type: ignore[attr-defined]


def test_frames_drawn_on_their_slices_beside_a_frame_on_another_grid(tmp_path: Path) -> None:
    """Frames on slices 1 and 3 reference them; the frame on slice 5 references nothing (placed by
    position, it is on a SEG of 4 mm spacing: another grid). Under require the SEG is mask_geometry;
    under resample the referenced frames are copied onto their slices only, and the other reaches
    what it reached before: the slices nearest it within 2 mm (5 and 6; slice 4, midway between it
    and frame 3, goes to the lower frame, which is copied and reaches no further)."""
    sources = ct_series(SEVEN, seed=16)
    path = _drawn_on(tmp_path / "seg.dcm", sources, SEVEN, {1: DRAWN[1], 3: DRAWN[3], 5: DRAWN[5]})
    seg = pydicom.dcmread(path)
    by_uid = {ds.SOPInstanceUID: k for k, ds in _by_slice(sources, SEVEN).items()}
    for item in seg.PerFrameFunctionalGroupsSequence:
        if by_uid[item.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID] == 5:
            del item.DerivationImageSequence
    seg.save_as(path)
    slices = header_places(sources)
    with pytest.raises(AnnotationError) as err:
        paint(path, slices)
    assert err.value.reason == "mask_geometry" and "SpacingBetweenSlices 4 mm" in err.value.message
    labels, result = paint(path, slices, grid="resample")
    np.testing.assert_array_equal(labels, _expected({1: DRAWN[1], 3: DRAWN[3], 5: DRAWN[5], 6: DRAWN[5]}, SEVEN))
    assert result.notes == ()  # type: ignore[attr-defined]


ROWS, COLUMNS, SLICES, STEP = 16, 16, 5, 2.0


@pytest.mark.slow
def test_a_build_packs_an_every_other_slice_seg_under_grid_require(tmp_path: Path) -> None:
    """End to end (the default grid: require), slice thickness read by the header pass: the
    volume's mask holds the frames on slices 1 and 3 and nothing on slices 0, 2 and 4 (the SEG was
    mask_geometry, every file a bad sample, and the build failed)."""
    raw = tmp_path / "raw"
    sources = []
    for k in range(SLICES):
        pixels = np.full((ROWS, COLUMNS), 1000 + 40 * k, dtype=np.int16)
        pixels[::2, ::2] += 8
        ds = ct_dataset(pixels, PatientID="PS", InstanceNumber=k + 1, StudyInstanceUID="1.2.3.4",
                        SeriesInstanceUID="1.2.3.4.1", FrameOfReferenceUID="1.2.3.4.2",
                        ImageOrientationPatient=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                        ImagePositionPatient=[-10.0, -8.0, STEP * k], PixelSpacing=[1.0, 1.0],
                        ImageType=["ORIGINAL", "PRIMARY", "AXIAL"], SeriesNumber=1, AccessionNumber="",
                        ReferringPhysicianName="", PatientName="Doe^Jane", PatientSex="F", StudyID="1",
                        Manufacturer="packer-tests", PositionReferenceIndicator="")
        ds.SliceThickness = STEP
        sources.append(pydicom.dcmread(save(ds, raw / "CT" / f"ct{k}.dcm")))
    planted = np.zeros((SLICES, ROWS, COLUMNS), dtype=bool)
    planted[1, 2:9, 3:12] = True
    planted[3, 4:7, 8:15] = True
    description = hd.seg.SegmentDescription(
        segment_number=1, segment_label="Liver",
        segmented_property_category=hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure"),
        segmented_property_type=hd.sr.CodedConcept("10200004", "SCT", "Liver"),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL)
    seg = hd.seg.Segmentation(source_images=[sources[1], sources[3]], pixel_array=planted[[1, 3]],
                              segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
                              segment_descriptions=[description], series_instance_uid="1.2.3.4.3",
                              series_number=2, sop_instance_uid="1.2.3.4.3.1", instance_number=1,
                              manufacturer="packer-tests", manufacturer_model_name="tests",
                              software_versions="1", device_serial_number="1")
    (raw / "SEG").mkdir()
    seg.save_as(raw / "SEG" / "seg.dcm")
    result = _build(_mask_job(tmp_path / "out", raw, {"segments": {"liver": 4}}, sample="volume"))
    bad = result.version_dir / "bad_samples.jsonl"
    items = _items(result)
    assert len(items) == 1, bad.read_text() if bad.exists() else ""
    mask = items[0]["mask"].numpy()
    np.testing.assert_array_equal(mask, np.where(planted, 4, 0).astype(np.uint8))
