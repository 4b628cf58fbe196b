"""A DICOM SEG whose frames are sparse along the slice normal: annotators who draw every other
slice, and SEGs on another grid whose frames lie far apart.

highdicom writes a SEG of the frames it is given: drawn on slices 1 and 3 of a 2 mm series, it
holds two frames, each on its slice and referencing it as its source, with SliceThickness 2 mm (the
sources') and SpacingBetweenSlices 4 mm (the gap between its frames). Such a SEG is on its series'
grid: each frame goes to the slice it references, and the slices between them, never annotated, stay
empty. A SEG truly on another grid is resampled, but a frame reaches a slice only within half its own
thickness (never on that boundary exactly), and a slice pixel exactly midway between two frames that
both reach it is not given to whichever comes first: it is on where both frames hold it, and where
they disagree it is left empty and noted.
"""

from __future__ import annotations

from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset

from packer.read.annotations import AnnotationError
from tests.dicom_files import ct_dataset, save
from tests.test_dicom_masks import _items, _mask_job
from tests.test_seg import BOX, Grid, ct_series, paint, places, write_seg
from tests.test_targets import _build

GRID = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=5, step=2.0, origin=(-10.0, -8.0, 0.0))


def _box(rows: slice, columns: slice, grid: Grid = GRID) -> np.ndarray:
    out = np.zeros((grid.rows, grid.columns), dtype=bool)
    out[rows, columns] = True
    return out


#: what the annotator drew on slices 1 and 3
DRAWN = {1: _box(slice(2, 9), slice(3, 12)), 3: _box(slice(4, 7), slice(8, 15))}


def _by_slice(sources: list[Dataset], grid: Grid = GRID) -> dict[int, Dataset]:
    """The series' datasets by slice index along the normal."""
    return {int(round((float(ds.ImagePositionPatient[2]) - grid.origin[2]) / grid.step)): ds for ds in sources}


def _every_other_slice_seg(path: Path, sources: list[Dataset]) -> Path:
    """A SEG drawn on slices 1 and 3 only, by highdicom from those two source images."""
    by_slice = _by_slice(sources)
    frames = np.stack([DRAWN[k] for k in (1, 3)])[..., None]
    return write_seg(path, [by_slice[1], by_slice[3]], frames, ["Cube_A"])


def _expected(drawn: dict[int, np.ndarray], grid: Grid = GRID) -> np.ndarray:
    out = np.zeros((grid.n, grid.rows, grid.columns), dtype=np.uint8)
    for k, mask in drawn.items():
        out[k][mask] = BOX.id
    return out


def test_highdicom_writes_the_every_other_slice_seg_with_its_frames_on_and_referencing_their_slices(
        tmp_path: Path) -> None:
    """The premise: the SEG's SpacingBetweenSlices (4 mm) is not the series' step (2 mm), but each
    frame lies on the slice it references."""
    sources = ct_series(GRID, seed=11)
    path = _every_other_slice_seg(tmp_path / "seg.dcm", sources)
    seg = pydicom.dcmread(path)
    measures = seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert (float(measures.SpacingBetweenSlices), float(measures.SliceThickness)) == (4.0, 2.0)
    by_uid = {ds.SOPInstanceUID: k for k, ds in _by_slice(sources).items()}
    referenced = []
    for item in seg.PerFrameFunctionalGroupsSequence:
        k = by_uid[item.DerivationImageSequence[0].SourceImageSequence[0].ReferencedSOPInstanceUID]
        np.testing.assert_allclose(item.PlanePositionSequence[0].ImagePositionPatient, GRID.position(k))
        referenced.append(k)
    assert sorted(referenced) == [1, 3]


@pytest.mark.parametrize("grid", ["require", "resample"])
def test_frames_drawn_on_every_other_slice_go_to_the_slices_they_reference_only(tmp_path: Path, grid: str) -> None:
    """No geometry mismatch: grid: require accepts the SEG, and the never-annotated slices 0, 2
    and 4 stay empty (they were painted from the neighbouring frames, 2.4 times the volume drawn,
    slice 2 taking the first frame)."""
    sources = ct_series(GRID, seed=11)
    path = _every_other_slice_seg(tmp_path / "seg.dcm", sources)
    labels, drawn = paint(path, places(sources), grid=grid)
    np.testing.assert_array_equal(labels, _expected(DRAWN))
    assert drawn.notes == ()  # type: ignore[attr-defined]


def test_a_frame_that_references_its_slice_but_lies_off_it_is_still_compared_for_slice_spacing(
        tmp_path: Path) -> None:
    """Placing by reference needs the frame to lie on its slice (to 1e-3 mm): one shifted 0.4 mm
    along the normal (within half a step of its slice, so no contradiction) is on a SEG that samples
    the normal every 4 mm, another grid: mask_geometry under require."""
    sources = ct_series(GRID, seed=11)
    path = _every_other_slice_seg(tmp_path / "seg.dcm", sources)
    seg = pydicom.dcmread(path)
    moved = seg.PerFrameFunctionalGroupsSequence[1].PlanePositionSequence[0]
    moved.ImagePositionPatient = [*moved.ImagePositionPatient[:2], float(moved.ImagePositionPatient[2]) + 0.4]
    seg.save_as(path)
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "mask_geometry" and "SpacingBetweenSlices 4 mm" in err.value.message


def _coarse_seg(path: Path, sources: list[Dataset], frames: dict[int, np.ndarray], thickness: float,
                grid: Grid) -> tuple[Path, Grid]:
    """A SEG on a grid of twice the pixel spacing (same origin) whose frames lie on the series'
    slices ``frames`` (slice → coarse mask), with SliceThickness ``thickness``."""
    coarse = Grid(rows=grid.rows // 2, columns=grid.columns // 2, spacing=(2 * grid.spacing[0], 2 * grid.spacing[1]),
                  x=grid.x, y=grid.y, n=grid.n, step=grid.step, origin=grid.origin)
    order = sorted(frames)
    gaps = {b - a for a, b in zip(order, order[1:], strict=False)}
    assert len(gaps) == 1
    write_seg(path, sources, np.stack([frames[k] for k in order])[..., None], ["Cube_A"],
              pixel_measures=hd.PixelMeasuresSequence(pixel_spacing=coarse.spacing, slice_thickness=thickness,
                                                      spacing_between_slices=gaps.pop() * grid.step),
              plane_orientation=hd.PlaneOrientationSequence(coordinate_system="PATIENT",
                                                            image_orientation=[*grid.x, *grid.y]),
              plane_positions=[hd.PlanePositionSequence(coordinate_system="PATIENT",
                                                        image_position=[float(v) for v in grid.position(k)])
                               for k in order])
    measures = pydicom.dcmread(path).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
    assert float(measures.SliceThickness) == thickness
    return path, coarse


def _on_fine(coarse_mask: np.ndarray, grid: Grid) -> np.ndarray:
    """A coarse (2× spacing, same origin) mask as the nearest-neighbour reader samples it at the
    series' pixel centres: fine pixel r lies at coarse r/2, which takes floor(r/2 + 0.5)."""
    rows = np.floor(np.arange(grid.rows) / 2 + 0.5).astype(int)
    columns = np.floor(np.arange(grid.columns) / 2 + 0.5).astype(int)
    inside = (rows[:, None] < coarse_mask.shape[0]) & (columns[None, :] < coarse_mask.shape[1])
    return inside & coarse_mask[np.minimum(rows, coarse_mask.shape[0] - 1)[:, None],
                                np.minimum(columns, coarse_mask.shape[1] - 1)[None, :]]


SEVEN = Grid(rows=12, columns=18, spacing=(1.0, 1.2), n=7, step=2.0, origin=(-10.0, -8.0, 0.0))


@pytest.mark.parametrize(("thickness", "reached"), [
    (2.0, {1: 1, 5: 5}),  # each frame its own slice: 2 mm away is beyond half of 2 mm
    (4.0, {1: 1, 5: 5}),  # 2 mm away is exactly half of 4 mm: the boundary is not reached
    (5.0, {0: 1, 1: 1, 2: 1, 4: 5, 5: 5, 6: 5}),  # 2 mm < 2.5 mm; slice 3, 4 mm from both, is not
])
def test_resampled_frames_reach_only_within_half_their_thickness(tmp_path: Path, thickness: float,
                                                                 reached: dict[int, int]) -> None:
    """A SEG on another in-plane grid, frames on slices 1 and 5 (8 mm apart, SpacingBetweenSlices 8):
    a frame stands for its own slab, SliceThickness thick; the 8 mm between frames (what the old
    reach, half the SpacingBetweenSlices inclusive, took) says nothing about the slices between."""
    sources = ct_series(SEVEN, seed=12)
    frames = {1: np.zeros((6, 9), dtype=bool), 5: np.zeros((6, 9), dtype=bool)}
    frames[1][1:4, 2:6] = True
    frames[5][2:5, 4:8] = True
    path, _ = _coarse_seg(tmp_path / "coarse.dcm", sources, frames, thickness, SEVEN)
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "mask_geometry" and "mask.grid: resample" in err.value.message
    labels, drawn = paint(path, places(sources), grid="resample")
    expected = _expected({k: _on_fine(frames[frame], SEVEN) for k, frame in reached.items()}, SEVEN)
    np.testing.assert_array_equal(labels, expected)
    assert drawn.notes == ()  # type: ignore[attr-defined]


def test_a_slice_midway_between_two_frames_that_reach_it_is_on_only_where_both_hold(tmp_path: Path) -> None:
    """Overlapping slabs (6 mm thick every 4 mm): slice 2 lies 2 mm from the frames of slices 1 and 3,
    within both. It took the first frame before; now it is on where both frames hold it, off where
    neither does, and the pixels where they disagree are left empty and counted in a note."""
    sources = ct_series(GRID, seed=13)
    frames = {1: np.zeros((6, 9), dtype=bool), 3: np.zeros((6, 9), dtype=bool)}
    frames[1][1:4, 2:6] = True
    frames[3][2:5, 4:8] = True
    path, _ = _coarse_seg(tmp_path / "coarse.dcm", sources, frames, 6.0, GRID)
    labels, drawn = paint(path, places(sources), grid="resample")
    first, second = _on_fine(frames[1], GRID), _on_fine(frames[3], GRID)
    expected = _expected({0: first, 1: first, 2: first & second, 3: second, 4: second})
    np.testing.assert_array_equal(labels, expected)
    disputed = int((first ^ second).sum())
    assert disputed > 0 and (first & second).any()
    assert drawn.notes == (  # type: ignore[attr-defined]
        f"segment 1 ('Cube_A'): {disputed} slice pixels lie exactly midway between two of its frames that "
        "disagree there and were not painted (neither frame is nearer; overlapping slabs)",)


ROWS, COLUMNS, SLICES, STEP = 16, 16, 5, 2.0


@pytest.mark.slow
def test_a_build_packs_an_every_other_slice_seg_under_grid_require(tmp_path: Path) -> None:
    """End to end (the default grid: require): the volume's mask holds the frames on slices 1 and 3
    and nothing on slices 0, 2 and 4 (the SEG was mask_geometry, every file a bad sample, and the build
    failed; under grid: resample the volume was painted 2.4 times the drawn voxels)."""
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
