"""DICOM SEG → masks (packer.read.seg): real SEG files written by highdicom's own writer on
synthetic CT series, checked against a truth planted in patient coordinates (a sphere and a box
evaluated at each slice pixel's centre, ``IPP + r·Δrow·Y + c·Δcol·X``, independent of both the
writer and the reader)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sr.codedict import codes
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from packer.read.annotations import AnnotationError, Painter, SlicePlace
from packer.read.seg import paint_seg
from packer.structures import Structure, StructureMap

SPHERE = Structure("sphere", 1, aliases=("Ball Thing",), codes=("SCT:10200004",))
BOX = Structure("box", 2, aliases=("Cube_A",))
SEGMENTS = StructureMap((SPHERE, BOX))


@dataclass(frozen=True)
class Grid:
    """A series' geometry: rows × columns at (Δrow, Δcol) mm, row direction X, column direction Y,
    ``n`` slices ``step`` mm apart along X × Y from ``origin``."""

    rows: int = 32
    columns: int = 28
    spacing: tuple[float, float] = (0.9, 0.7)
    x: tuple[float, float, float] = (1.0, 0.0, 0.0)
    y: tuple[float, float, float] = (0.0, 1.0, 0.0)
    n: int = 12
    step: float = 1.5
    origin: tuple[float, float, float] = (-10.0, -12.0, -8.0)

    @property
    def normal(self) -> np.ndarray:
        return np.cross(self.x, self.y)

    def position(self, k: int) -> np.ndarray:
        return np.asarray(self.origin) + k * self.step * self.normal

    def centres(self, k: int) -> np.ndarray:
        """rows × columns × 3 pixel centres of slice k (mm)."""
        r = np.arange(self.rows)[:, None, None] * self.spacing[0] * np.asarray(self.y)
        c = np.arange(self.columns)[None, :, None] * self.spacing[1] * np.asarray(self.x)
        return self.position(k) + r + c


def rotated(angle_deg: float, axis: tuple[float, float, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """X and Y of the identity orientation turned ``angle_deg`` about ``axis`` (Rodrigues)."""
    k = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    t = math.radians(angle_deg)
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    rot = np.eye(3) + math.sin(t) * kx + (1 - math.cos(t)) * kx @ kx
    return tuple(rot[:, 0]), tuple(rot[:, 1])


def sphere(points: np.ndarray, centre: tuple[float, float, float] = (-1.0, -2.0, 0.0),
           radius: float = 5.0) -> np.ndarray:
    return np.linalg.norm(points - np.asarray(centre), axis=-1) <= radius


def box(points: np.ndarray, lo: tuple[float, float, float] = (3.0, 3.0, -4.0),
        hi: tuple[float, float, float] = (8.0, 9.0, 4.0)) -> np.ndarray:
    return np.all((points >= np.asarray(lo)) & (points <= np.asarray(hi)), axis=-1)


def truth(grid: Grid, shapes=(sphere, box)) -> np.ndarray:
    """n × rows × columns × len(shapes) booleans at the slice pixel centres."""
    return np.stack([np.stack([shape(grid.centres(k)) for shape in shapes], axis=-1) for k in range(grid.n)])


def ct_series(grid: Grid, *, seed: int = 0) -> list[Dataset]:
    """Single-frame CT Image Storage slices, in a shuffled order with shuffled Instance Numbers."""
    study, series, frame_of_reference = generate_uid(), generate_uid(), generate_uid()
    order = np.random.default_rng(seed).permutation(grid.n)
    out = []
    for number, k in enumerate(order, start=1):
        ds = Dataset()
        ds.file_meta = FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.file_meta.MediaStorageSOPClassUID = CTImageStorage
        ds.SOPClassUID = CTImageStorage
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame_of_reference
        ds.Modality = "CT"
        ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = "Test^Seg", "SEG1", "", "O"
        ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber = "20240101", "120000", "1", ""
        ds.ReferringPhysicianName, ds.SeriesNumber, ds.InstanceNumber = "", 1, int(number)
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.Rows, ds.Columns = grid.rows, grid.columns
        ds.PixelSpacing = list(grid.spacing)
        ds.SliceThickness = grid.step
        ds.ImageOrientationPatient = [*grid.x, *grid.y]
        ds.ImagePositionPatient = [float(v) for v in grid.position(int(k))]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.PixelData = np.zeros((grid.rows, grid.columns), dtype=np.uint16).tobytes()
        out.append(ds)
    return out


def places(sources: list[Dataset]) -> list[SlicePlace]:
    """The series' SlicePlaces in order along the normal (single- or multi-frame sources)."""
    out = []
    for ds in sources:
        if "PerFrameFunctionalGroupsSequence" in ds:
            shared = ds.SharedFunctionalGroupsSequence[0]
            iop = shared.PlaneOrientationSequence[0].ImageOrientationPatient
            spacing = shared.PixelMeasuresSequence[0].PixelSpacing
            for f, item in enumerate(ds.PerFrameFunctionalGroupsSequence):
                out.append(SlicePlace(ds.SOPInstanceUID, f, tuple(float(v) for v in item.PlanePositionSequence[0]
                                                                  .ImagePositionPatient),
                                      tuple(float(v) for v in iop), (float(spacing[0]), float(spacing[1])),
                                      int(ds.Rows), int(ds.Columns)))
        else:
            out.append(SlicePlace(ds.SOPInstanceUID, 0, tuple(float(v) for v in ds.ImagePositionPatient),
                                  tuple(float(v) for v in ds.ImageOrientationPatient),
                                  (float(ds.PixelSpacing[0]), float(ds.PixelSpacing[1])), int(ds.Rows),
                                  int(ds.Columns)))
    normal = out[0].normal()
    return sorted(out, key=lambda p: float(np.dot(p.position, normal)))


def description(number: int, label: str, code=None) -> hd.seg.SegmentDescription:
    return hd.seg.SegmentDescription(
        segment_number=number, segment_label=label, segmented_property_category=codes.SCT.Tissue,
        segmented_property_type=code or codes.SCT.Tissue, algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL)


def write_seg(path: Path, sources: list[Dataset], pixels: np.ndarray, labels: list[str], *,
              kind: str = "BINARY", types=None, max_fractional: int = 255, **geometry) -> Path:
    """A SEG by highdicom's writer; ``pixels``: frames × rows × columns × segments, frames in
    the order of ``sources`` (or of ``geometry['plane_positions']``)."""
    seg = hd.seg.Segmentation(
        source_images=sources, pixel_array=pixels, segmentation_type=kind,
        segment_descriptions=[description(i + 1, label, (types or {}).get(label)) for i, label in enumerate(labels)],
        series_instance_uid=generate_uid(), series_number=99, sop_instance_uid=generate_uid(), instance_number=1,
        manufacturer="packer tests", manufacturer_model_name="test", software_versions="1",
        device_serial_number="1", max_fractional_value=max_fractional, **geometry)
    seg.save_as(path)
    return path


def in_source_order(sources: list[Dataset], grid: Grid, volume: np.ndarray) -> np.ndarray:
    """Reorder a normal-ordered volume to the order of ``sources``."""
    normal = grid.normal
    depth = [float(np.dot(np.asarray(ds.ImagePositionPatient, dtype=float) - grid.origin, normal)) for ds in sources]
    return volume[[int(round(d / grid.step)) for d in depth]]


def paint(path: Path, grid_places: list[SlicePlace], structures: StructureMap = SEGMENTS, *,
          overlap: str = "later_wins", **kwargs) -> tuple[np.ndarray, object]:
    first = grid_places[0]
    painter = Painter((len(grid_places), first.rows, first.columns), structures, overlap=overlap, path=str(path))
    drawn = paint_seg(str(path), grid_places, structures, painter, **kwargs)
    return painter.labels, drawn


def expected_labels(planted: np.ndarray) -> np.ndarray:
    """Label map of sphere (1) and box (2), box winning (declared later) where both hold."""
    out = np.zeros(planted.shape[:3], dtype=np.uint8)
    out[planted[..., 0]] = SPHERE.id
    out[planted[..., 1]] = BOX.id
    return out


@pytest.fixture(scope="module")
def axial(tmp_path_factory) -> tuple[Grid, list[Dataset], Path, np.ndarray]:
    grid = Grid()
    sources = ct_series(grid)
    planted = truth(grid)
    assert planted[..., 0].sum() > 100 and planted[..., 1].sum() > 100
    assert not (planted[..., 0] & planted[..., 1]).any()
    path = write_seg(tmp_path_factory.mktemp("seg") / "axial.dcm", sources, in_source_order(sources, grid, planted),
                     ["Ball Thing", "Cube_A"])
    return grid, sources, path, planted


def test_axial_binary_matches_planted_truth(axial) -> None:
    grid, sources, path, planted = axial
    labels, drawn = paint(path, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))
    assert drawn.unmapped == () and drawn.notes == ()
    parsed = pydicom.dcmread(path)
    again, _ = paint(path, places(sources), dataset=parsed)
    np.testing.assert_array_equal(again, labels)
    assert type(parsed) is pydicom.FileDataset  # the caller's dataset is not retyped by highdicom


def test_oblique_non_isotropic(tmp_path: Path) -> None:
    x, y = rotated(20.0, (1.0, 0.5, 0.2))
    grid = Grid(x=x, y=y, spacing=(0.8, 0.6), step=1.7, origin=(-9.0, -10.0, -9.0), rows=34, columns=30)
    sources = ct_series(grid, seed=3)
    planted = truth(grid)
    assert planted[..., 0].sum() > 100 and planted[..., 1].sum() > 50
    path = write_seg(tmp_path / "oblique.dcm", sources, in_source_order(sources, grid, planted),
                     ["ball thing", "CUBE-A"])
    labels, _ = paint(path, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))


def test_multiframe_source(tmp_path: Path) -> None:
    """A Legacy Converted Enhanced CT (one multi-frame file, per-frame Plane Position) as the source:
    frames are placed by Referenced Frame Number."""
    grid = Grid(n=8)
    singles = ct_series(grid, seed=5)
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=singles, series_instance_uid=generate_uid(), series_number=2,
        sop_instance_uid=generate_uid(), instance_number=1)
    planted = truth(grid)
    frame_depth = [float(np.dot(np.asarray(item.PlanePositionSequence[0].ImagePositionPatient) - grid.origin,
                                grid.normal)) for item in enhanced.PerFrameFunctionalGroupsSequence]
    in_frame_order = planted[[int(round(d / grid.step)) for d in frame_depth]]
    path = write_seg(tmp_path / "mf.dcm", [enhanced], in_frame_order, ["Ball Thing", "Cube_A"])
    seg = pydicom.dcmread(path)
    assert "ReferencedFrameNumber" in seg.PerFrameFunctionalGroupsSequence[0].DerivationImageSequence[0] \
        .SourceImageSequence[0]
    labels, _ = paint(path, places([enhanced]))
    np.testing.assert_array_equal(labels, expected_labels(planted))


@pytest.mark.parametrize("threshold", [0.5, 0.75])
def test_fractional_threshold(tmp_path: Path, threshold: float) -> None:
    grid = Grid(n=6)
    sources = ct_series(grid, seed=1)
    rng = np.random.default_rng(7)
    values = rng.integers(0, 5, size=(grid.n, grid.rows, grid.columns, 1)) / 4.0  # exact in 0..4 stored
    path = write_seg(tmp_path / "frac.dcm", sources, in_source_order(sources, grid, values).astype(np.float32),
                     ["Ball Thing"], kind="FRACTIONAL", max_fractional=4)
    labels, _ = paint(path, places(sources), threshold=threshold)
    np.testing.assert_array_equal(labels, np.where(values[..., 0] >= threshold, SPHERE.id, 0))


def test_fractional_above_maximum_is_mask_values(tmp_path: Path) -> None:
    grid = Grid(n=4)
    sources = ct_series(grid, seed=2)
    values = np.zeros((grid.n, grid.rows, grid.columns, 1), dtype=np.float32)
    values[:, 5:9, 5:9] = 1.0
    path = write_seg(tmp_path / "frac.dcm", sources, values, ["Ball Thing"], kind="FRACTIONAL", max_fractional=4)
    ds = pydicom.dcmread(path)
    ds.MaximumFractionalValue = 2
    ds.save_as(path)
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "mask_values" and str(path) in err.value.message


def test_match_by_code_and_unmapped(tmp_path: Path, axial) -> None:
    grid, sources, _, planted = axial
    liver = codes.SCT.Liver  # SCT 10200004, in SPHERE's codes
    three = np.concatenate([planted, planted[..., :1]], axis=-1)
    path = write_seg(tmp_path / "code.dcm", sources, in_source_order(sources, grid, three),
                     ["Segment A", "cube a", "Tumour Left"], types={"Segment A": liver})
    labels, drawn = paint(path, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))
    assert drawn.unmapped == ("Tumour Left",)


def test_all_unmapped_is_annotation_unmapped(tmp_path: Path, axial) -> None:
    grid, sources, _, planted = axial
    path = write_seg(tmp_path / "none.dcm", sources, in_source_order(sources, grid, planted), ["Ball Thin", "Cylinder"])
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "annotation_unmapped"
    assert "closest" in err.value.message and "'Ball Thin' → sphere" in err.value.message


def test_frames_located_by_position_only(tmp_path: Path, axial) -> None:
    grid, sources, path, planted = axial
    ds = pydicom.dcmread(path)
    for item in ds.PerFrameFunctionalGroupsSequence:
        del item.DerivationImageSequence
    stripped = tmp_path / "stripped.dcm"
    ds.save_as(stripped)
    labels, _ = paint(stripped, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))


def test_frame_on_no_slice_is_annotation_frames(tmp_path: Path, axial) -> None:
    grid, sources, path, _ = axial
    labels, _ = paint(path, places(sources))
    # the same SEG on a series missing its first three slices: frames there lie on no slice
    ds = pydicom.dcmread(path)
    for item in ds.PerFrameFunctionalGroupsSequence:
        del item.DerivationImageSequence
    stripped = tmp_path / "stripped.dcm"
    ds.save_as(stripped)
    sphere_slices = [k for k in range(grid.n) if (labels[k] == SPHERE.id).any()]
    cut = places(sources)[sphere_slices[0] + 1:]
    with pytest.raises(AnnotationError) as err:
        paint(stripped, cut)
    assert err.value.reason == "annotation_frames" and "mask.grid: resample" in err.value.message


def seg_on_other_grid(tmp_path: Path, grid: Grid, sources: list[Dataset]) -> tuple[Path, Grid]:
    """The sphere and box on a grid of half the resolution, shifted 0.3 mm along X and 0.2 mm along Y."""
    shift = 0.3 * np.asarray(grid.x) + 0.2 * np.asarray(grid.y)
    coarse = Grid(rows=grid.rows // 2, columns=grid.columns // 2, spacing=(grid.spacing[0] * 2, grid.spacing[1] * 2),
                  x=grid.x, y=grid.y, n=grid.n, step=grid.step, origin=tuple(np.asarray(grid.origin) + shift))
    path = seg_on_grid(tmp_path / "coarse.dcm", sources, truth(coarse), ["Ball Thing", "Cube_A"], coarse)
    return path, coarse


def seg_on_grid(path: Path, sources: list[Dataset], frames: np.ndarray, labels: list[str], grid: Grid) -> Path:
    """A SEG of ``frames`` (one a plane of ``grid``, in its order) whose geometry is ``grid``'s, not
    its sources': pixel spacing, SpacingBetweenSlices (and thickness) its step, orientation, positions."""
    return write_seg(
        path, sources, frames, labels,
        pixel_measures=hd.PixelMeasuresSequence(pixel_spacing=grid.spacing, slice_thickness=grid.step,
                                                spacing_between_slices=grid.step),
        plane_orientation=hd.PlaneOrientationSequence(coordinate_system="PATIENT",
                                                      image_orientation=[*grid.x, *grid.y]),
        plane_positions=[hd.PlanePositionSequence(coordinate_system="PATIENT",
                                                  image_position=[float(v) for v in grid.position(k)])
                         for k in range(grid.n)])


def test_other_grid_require_is_mask_geometry(tmp_path: Path, axial) -> None:
    grid, sources, _, _ = axial
    path, _ = seg_on_other_grid(tmp_path, grid, sources)
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "mask_geometry"
    message = err.value.message
    assert "16×14 at 1.8×1.4 mm" in message and "32×28 at 0.9×0.7 mm" in message and "mask.grid: resample" in message


def seg_every_third_slice(tmp_path: Path, grid: Grid, sources: list[Dataset]) -> tuple[Path, np.ndarray]:
    """The box drawn on a reconstruction three times thicker than the series: frames on the
    series' slices 0, 3, 6, 9 (in-plane grid the series'), SpacingBetweenSlices 3 steps, the box
    on the frames of slices 3 and 6. Returns the SEG and the series' slices each frame covers."""
    thick = Grid(rows=grid.rows, columns=grid.columns, spacing=grid.spacing, x=grid.x, y=grid.y, n=4,
                 step=3 * grid.step, origin=grid.origin)
    frames = np.zeros((thick.n, grid.rows, grid.columns, 1), dtype=bool)
    frames[1:3, 8:20, 5:15, 0] = True
    path = seg_on_grid(tmp_path / "thick.dcm", sources, frames, ["Cube_A"], thick)
    # nearest frame within half its spacing (1.5 steps): slices 2..7 lie nearest the box's frames
    # (3 and 6); slice 2 is 1 step from frame 3 and 2 from frame 0, slice 7 1 step from frame 6
    covered = np.zeros(grid.n, dtype=bool)
    covered[2:8] = True
    return path, covered


def test_a_seg_sampling_the_normal_more_coarsely_than_the_series_is_another_grid(tmp_path: Path, axial) -> None:
    """Each frame of a SEG drawn every third slice lies on a slice of the series, but the SEG's
    SpacingBetweenSlices says it samples the normal otherwise: under require that is
    mask_geometry (painting by position alone left the slices between its frames empty, a
    striped mask), under resample each slice takes the nearest frame."""
    grid, sources, _, _ = axial
    path, covered = seg_every_third_slice(tmp_path, grid, sources)
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources))
    assert err.value.reason == "mask_geometry"
    assert "SpacingBetweenSlices 4.5 mm" in err.value.message and "slices every 1.5 mm" in err.value.message
    labels, _ = paint(path, places(sources), grid="resample")
    box = np.zeros((grid.rows, grid.columns), dtype=np.uint8)
    box[8:20, 5:15] = BOX.id
    for k in range(grid.n):
        np.testing.assert_array_equal(labels[k], box if covered[k] else 0, err_msg=f"slice {k}")


def test_a_seg_of_one_slice_is_placed_whatever_spacing_between_slices_it_writes(tmp_path: Path, axial) -> None:
    """A lesion drawn on one slice (OHIF, highdicom: source_images one slice) is a SEG whose frames,
    one a segment, all lie on that slice's plane; highdicom writes SpacingBetweenSlices 1.0 for it,
    a spacing that spaces nothing, so it is not compared with the series' 1.5 mm: the frames are
    copied onto their slice under require, not refused as mask_geometry."""
    grid, sources, _, planted = axial
    k = 6
    source = next(ds for ds in sources if np.allclose(ds.ImagePositionPatient, grid.position(k)))
    path = write_seg(tmp_path / "one.dcm", [source], planted[k:k + 1], ["Ball Thing", "Cube_A"])
    written = pydicom.dcmread(path)
    assert written.NumberOfFrames == 2
    assert float(written.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SpacingBetweenSlices) == 1.0
    labels, drawn = paint(path, places(sources))
    expected = np.zeros_like(labels)
    expected[k] = expected_labels(planted)[k]
    np.testing.assert_array_equal(labels, expected)
    assert drawn.notes == ()


def test_other_grid_resample_nearest_neighbour(tmp_path: Path, axial) -> None:
    """Each slice pixel takes the coarse SEG pixel nearest its centre: it can differ from the
    truth only where a shape's boundary passes within half a coarse pixel diagonal of the centre."""
    grid, sources, _, planted = axial
    path, coarse = seg_on_other_grid(tmp_path, grid, sources)
    labels, _ = paint(path, places(sources), grid="resample")
    expected = expected_labels(planted)
    reach = 0.5 * math.hypot(*coarse.spacing) + 1e-6
    centre, radius = np.asarray((-1.0, -2.0, 0.0)), 5.0
    lo, hi = np.asarray((3.0, 3.0, -4.0)), np.asarray((8.0, 9.0, 4.0))
    points = np.stack([grid.centres(k) for k in range(grid.n)])
    near_sphere = np.abs(np.linalg.norm(points - centre, axis=-1) - radius) <= reach
    outside = np.maximum(lo - points, points - hi)  # > 0 along an axis where the point is outside
    inside_depth = np.min(np.minimum(points - lo, hi - points), axis=-1)
    distance_out = np.linalg.norm(np.clip(outside, 0, None), axis=-1)
    near_box = np.where(distance_out > 0, distance_out, inside_depth) <= reach
    wrong = labels != expected
    assert wrong.sum() > 0  # a coarser grid must lose something
    assert not (wrong & ~(near_sphere | near_box)).any()
    assert (labels == expected).mean() > 0.97


def test_overlap_refuse_and_later_wins(tmp_path: Path) -> None:
    grid = Grid(n=8)
    sources = ct_series(grid, seed=4)

    def big_box(points: np.ndarray) -> np.ndarray:
        return box(points, lo=(-3.0, -4.0, -6.0), hi=(6.0, 6.0, 2.0))

    planted = truth(grid, (sphere, big_box))
    both = planted[..., 0] & planted[..., 1]
    assert both.sum() > 20
    # segment 1 is the box: the class declared later (box) wins although painted first
    path = write_seg(tmp_path / "overlap.dcm", sources, in_source_order(sources, grid, planted[..., [1, 0]]),
                     ["Cube_A", "Ball Thing"])
    labels, _ = paint(path, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))
    assert (labels[both] == BOX.id).all()
    with pytest.raises(AnnotationError) as err:
        paint(path, places(sources), overlap="refuse")
    assert err.value.reason == "mask_overlap"


def test_labelmap(tmp_path: Path, axial) -> None:
    grid, sources, _, planted = axial
    path = write_seg(tmp_path / "labelmap.dcm", sources, in_source_order(sources, grid, expected_labels(planted)),
                     ["Ball Thing", "Cube_A"], kind="LABELMAP")
    labels, drawn = paint(path, places(sources))
    np.testing.assert_array_equal(labels, expected_labels(planted))
    # its own SOP class, as excluded.jsonl and the manifest's excluded_by_sop_class count it (pydicom
    # 3.0 does not know the class: it is newer)
    assert pydicom.dcmread(path).SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.7"
    assert drawn.sop_class == "Label Map Segmentation Storage"
    _, binary = paint(write_seg(tmp_path / "binary.dcm", sources, in_source_order(sources, grid, planted),
                                ["Ball Thing", "Cube_A"]), places(sources))
    assert binary.sop_class == "Segmentation Storage"


def test_defects_are_annotation_errors(tmp_path: Path, axial) -> None:
    grid, sources, path, _ = axial
    raw = path.read_bytes()
    truncated = tmp_path / "truncated.dcm"
    truncated.write_bytes(raw[: int(len(raw) * 0.8)])
    garbage = tmp_path / "garbage.dcm"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    header_only = tmp_path / "header.dcm"
    header_only.write_bytes(raw[:1200])
    wrong_count = tmp_path / "frames.dcm"
    ds = pydicom.dcmread(path)
    ds.NumberOfFrames = int(ds.NumberOfFrames) + 3
    ds.save_as(wrong_count)
    short_pixels = tmp_path / "short.dcm"
    ds = pydicom.dcmread(path)
    ds.PixelData = ds.PixelData[: len(ds.PixelData) // 2]
    ds.save_as(short_pixels)
    not_seg = tmp_path / "ct.dcm"
    sources[0].save_as(not_seg, enforce_file_format=True)
    reasons = {}
    messages = {}
    for bad in (truncated, garbage, header_only, wrong_count, short_pixels, not_seg):
        with pytest.raises(AnnotationError) as err:
            paint(bad, places(sources))
        assert str(bad) in err.value.message
        reasons[bad.name], messages[bad.name] = err.value.reason, err.value.message
    # cut inside its header: the record says what the file lacks and why, never a frame count it does not hold
    assert "NumberOfFrames (0028,0008) is" not in messages["header.dcm"]
    assert "the file holds no NumberOfFrames (0028,0008)" in messages["header.dcm"]
    assert "cut short" in messages["header.dcm"] and "copy it again" in messages["header.dcm"]
    assert reasons["frames.dcm"] == "annotation_frames" and reasons["short.dcm"] == "annotation_frames"
    assert reasons["garbage.dcm"] == "unreadable" and reasons["ct.dcm"] == "unreadable"
    assert set(reasons.values()) <= {"unreadable", "annotation_frames"}


@pytest.mark.parametrize("references", [True, False], ids=["by-reference", "by-position"])
def test_a_frame_on_a_slice_the_export_lacks_says_a_slice_is_missing(tmp_path: Path, axial, references: bool) -> None:
    """One annotated CT file deleted from the export: the SEG frame on it was said to be "made on
    other slices than this series" ("slices span a..b mm, every 2.5 mm", though the series then
    had a 5 mm gap), and under grid: resample noted as lying "beyond the series"."""
    grid, sources, path, _ = axial
    labels, _ = paint(path, places(sources))
    inner = [k for k in range(1, grid.n - 1) if labels[k].any()][0]  # an annotated slice inside the span
    kept = [p for k, p in enumerate(places(sources)) if k != inner]
    target = path
    if not references:
        ds = pydicom.dcmread(path)
        for item in ds.PerFrameFunctionalGroupsSequence:
            del item.DerivationImageSequence
        target = tmp_path / "stripped.dcm"
        ds.save_as(target)
    with pytest.raises(AnnotationError) as err:
        paint(target, kept)
    said = err.value.message
    assert err.value.reason == "annotation_frames" and "a slice of the series is missing from the export" in said
    assert ("which the series lacks" if references else "within its span: where a slice is missing") in said, said
    assert "median spacing" in said and "every " not in said
    _, drawn = paint(target, kept, grid="resample")
    assert any("where a slice is missing" in note for note in drawn.notes), drawn.notes
