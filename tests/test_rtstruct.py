"""RTSTRUCT contours painted as masks (packer.read.rtstruct).

Structure sets are built with pydicom, written to disk and read back. The expected masks come
from scikit-image's ``polygon`` (pixel centres inside, combined even-odd by XOR) or from a
planted shape in patient millimetres, never from the module under test.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid
from skimage.draw import polygon as sk_polygon

import packer.read.rtstruct as rtstruct_module
from packer.read.annotations import RTSTRUCT_STORAGE, AnnotationError, Painter, SlicePlace
from packer.read.rtstruct import Drawn, fill_even_odd, paint_rtstruct
from packer.read.rtstruct_items import RawContour
from packer.structures import Structure, StructureMap

ROWS, COLUMNS = 48, 64
SPACING = (0.8, 0.6)  # between rows, between columns (mm)
STEP = 2.5
AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)

MAP = StructureMap((
    Structure("lung", 1, aliases=("Lung_L", "Lung_R", "LUNG LEFT", "lt lung")),
    Structure("heart", 2, aliases=("Heart",)),
    Structure("cord", 3, aliases=("SpinalCord",)),
))

Contour = tuple[np.ndarray, str, str | None]  # patient points N×3, geometric type, referenced SOP UID


def rotation(axis: Sequence[float], degrees: float) -> np.ndarray:
    a = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    t = math.radians(degrees)
    k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + math.sin(t) * k + (1 - math.cos(t)) * k @ k


def series(count: int = 16, orientation: Sequence[float] = AXIAL, origin: Sequence[float] = (-20.0, -15.0, -30.0),
           missing: Sequence[int] = ()) -> list[SlicePlace]:
    """Slices STEP mm apart along X × Y (those in ``missing`` left out: a gap)."""
    x, y = np.asarray(orientation[:3]), np.asarray(orientation[3:])
    n = np.cross(x, y)
    def at(k: int) -> tuple[float, float, float]:
        p = np.asarray(origin, dtype=np.float64) + k * STEP * n
        return float(p[0]), float(p[1]), float(p[2])

    return [SlicePlace(sop_uid=f"1.2.3.{k}", frame=0, position=at(k),
                       orientation=tuple(orientation), spacing=SPACING, rows=ROWS, columns=COLUMNS)
            for k in range(count) if k not in missing]


def to_patient(place: SlicePlace, rc: np.ndarray, lift: float = 0.0) -> np.ndarray:
    """Pixel (row, column) coordinates on ``place`` as patient mm, ``lift`` mm along the normal
    (written out here, not taken from the module)."""
    o = np.asarray(place.position)
    x, y = np.asarray(place.orientation[:3]), np.asarray(place.orientation[3:])
    rc = np.asarray(rc, dtype=np.float64)
    return o + rc[:, 1:2] * place.spacing[1] * x + rc[:, 0:1] * place.spacing[0] * y + lift * np.cross(x, y)


def rtstruct(rois: Sequence[tuple[str, Sequence[Contour]]], *, numbers: Sequence[int] | None = None) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID = UID(RTSTRUCT_STORAGE)
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID = RTSTRUCT_STORAGE
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "RTSTRUCT"
    ds.StudyInstanceUID = "1.2.3"
    ds.SeriesInstanceUID = generate_uid()
    frame_uid = "1.2.3.9"
    image = Dataset()
    image.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
    image.ReferencedSOPInstanceUID = "1.2.3.0"
    ref_series = Dataset()
    ref_series.SeriesInstanceUID = "1.2.3.4"
    ref_series.ContourImageSequence = DicomSequence([image])
    study = Dataset()
    study.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"
    study.ReferencedSOPInstanceUID = "1.2.3"
    study.RTReferencedSeriesSequence = DicomSequence([ref_series])
    frame = Dataset()
    frame.FrameOfReferenceUID = frame_uid
    frame.RTReferencedStudySequence = DicomSequence([study])
    ds.ReferencedFrameOfReferenceSequence = DicomSequence([frame])
    set_items, contour_items = [], []
    for k, (name, contours) in enumerate(rois):
        number = numbers[k] if numbers else k + 1
        roi = Dataset()
        roi.ROINumber = number
        roi.ROIName = name
        roi.ReferencedFrameOfReferenceUID = frame_uid
        set_items.append(roi)
        roi_contour = Dataset()
        roi_contour.ReferencedROINumber = k + 1
        items = []
        for points, kind, ref in contours:
            item = Dataset()
            item.ContourGeometricType = kind
            item.NumberOfContourPoints = len(points)
            item.ContourData = [f"{v:.6f}" for v in np.asarray(points).ravel()]
            if ref is not None:
                picture = Dataset()
                picture.ReferencedSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
                picture.ReferencedSOPInstanceUID = ref
                item.ContourImageSequence = DicomSequence([picture])
            items.append(item)
        roi_contour.ContourSequence = DicomSequence(items)
        contour_items.append(roi_contour)
    ds.StructureSetROISequence = DicomSequence(set_items)
    ds.ROIContourSequence = DicomSequence(contour_items)
    return ds


def save(ds: Dataset, path: Path) -> str:
    ds.save_as(path, enforce_file_format=True)
    return str(path)


def paint(tmp_path: Path, ds: Dataset, slices: Sequence[SlicePlace], overlap: str = "later_wins",
          rois: StructureMap = MAP) -> tuple[np.ndarray, Drawn]:
    path = save(ds, tmp_path / "rs.dcm")
    painter = Painter(shape=(len(slices), slices[0].rows, slices[0].columns), structures=rois, overlap=overlap,
                      path=path)
    drawn = paint_rtstruct(path, slices, rois, painter)
    return painter.labels, drawn


def closed(place: SlicePlace, rc: Sequence[Sequence[float]], ref: str | None = None, lift: float = 0.0) -> Contour:
    return to_patient(place, np.asarray(rc, dtype=np.float64), lift), "CLOSED_PLANAR", ref


Polygons = Sequence[Sequence[Sequence[float]]] | Sequence[np.ndarray]


def skimage_even_odd(polygons: Polygons, shape: tuple[int, int] = (ROWS, COLUMNS)) -> np.ndarray:
    """The independent rasteriser: skimage's centre-inside polygon per contour, XOR-combined."""
    out = np.zeros(shape, dtype=bool)
    for poly in polygons:
        p = np.asarray(poly, dtype=np.float64)
        rr, cc = sk_polygon(p[:, 0], p[:, 1], shape)
        one = np.zeros(shape, dtype=bool)
        one[rr, cc] = True
        out ^= one
    return out


def near_edges(polygons: Polygons, shape: tuple[int, int] = (ROWS, COLUMNS),
               within: float = 0.5) -> np.ndarray:
    """Boundary pixels: those whose centre is within ``within`` pixel of a polygon edge."""
    r, c = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    near = np.zeros(shape, dtype=bool)
    for poly in polygons:
        p = np.asarray(poly, dtype=np.float64)
        for a, b in zip(p, np.roll(p, -1, axis=0), strict=True):
            d = b - a
            t = np.clip(((r - a[0]) * d[0] + (c - a[1]) * d[1]) / max(float(d @ d), 1e-12), 0, 1)
            near |= np.hypot(r - a[0] - t * d[0], c - a[1] - t * d[1]) <= within
    return near


def assert_matches_skimage(mask: np.ndarray, polygons: Polygons) -> int:
    """Equal off the boundary pixels; returns how many pixels differ at all."""
    expected = skimage_even_odd(polygons, mask.shape)
    boundary = near_edges(polygons, mask.shape)
    assert np.array_equal(mask[~boundary], expected[~boundary])
    differ = int((mask != expected).sum())
    assert differ <= max(3, boundary.sum() // 50)
    return differ


RING_OUT = [(5.3, 6.2), (5.1, 40.7), (30.6, 41.4), (31.2, 5.6)]
RING_IN = [(12.4, 14.3), (12.7, 30.1), (22.2, 29.6), (21.8, 13.9)]
ISLAND_A = [(3.2, 45.4), (3.6, 60.1), (14.3, 52.2)]
ISLAND_B = [(30.3, 48.8), (44.1, 49.3), (43.6, 61.7), (36.2, 55.1), (30.9, 62.4)]
# a keyhole: outer square, a channel of width zero down to an inner square traced the other way
KEYHOLE = [(20.5, 10.5), (20.5, 50.5), (44.5, 50.5), (44.5, 10.5), (32.5, 10.5), (32.5, 20.5), (40.5, 20.5),
           (40.5, 40.5), (24.5, 40.5), (24.5, 20.5), (32.5, 20.5), (32.5, 10.5)]


def test_ring_islands_and_keyhole_equal_skimage_even_odd_off_the_boundary(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Lung_L", [closed(slices[3], RING_OUT), closed(slices[3], RING_IN), closed(slices[5], ISLAND_A),
                               closed(slices[5], ISLAND_B), closed(slices[9], KEYHOLE)])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert drawn == Drawn(unmapped=(), notes=(), sop_class="RT Structure Set Storage")
    assert labels[3, 17, 22] == 0 and labels[3, 8, 22] == 1  # the hole and the ring, by hand
    assert labels[9, 30, 30] == 0 and labels[9, 22, 30] == 1  # the keyhole's hole and ring
    differ = assert_matches_skimage(labels[3] == 1, [RING_OUT, RING_IN])
    differ += assert_matches_skimage(labels[5] == 1, [ISLAND_A, ISLAND_B])
    differ += assert_matches_skimage(labels[9] == 1, [KEYHOLE])
    assert differ == 0  # no pixel centre lies on an edge here
    assert set(np.flatnonzero(labels.reshape(len(slices), -1).any(axis=1))) == {3, 5, 9}


def test_random_polygons_differ_from_skimage_only_on_centres_on_edges() -> None:
    rng = np.random.default_rng(7)
    differ = boundary = 0
    for _ in range(60):
        count = int(rng.integers(1, 4))
        polygons = []
        for _ in range(count):
            n = int(rng.integers(3, 14))
            angles = np.sort(rng.uniform(0, 2 * np.pi, n))
            radius = rng.uniform(3, 20, n)
            centre = rng.uniform([-5, -5], [ROWS + 5, COLUMNS + 5])
            polygons.append(np.stack([centre[0] + radius * np.sin(angles), centre[1] + radius * np.cos(angles)], 1))
        mask = fill_even_odd(polygons, ROWS, COLUMNS)
        differ += assert_matches_skimage(mask, polygons)
        boundary += int(near_edges(polygons).sum())
    assert boundary > 1000 and differ == 0
    # and on vertices at pixel centres, where centres do lie on edges: the top-left rule
    square = np.array([(2.0, 2.0), (2.0, 6.0), (6.0, 6.0), (6.0, 2.0)])
    mask = fill_even_odd([square], 10, 10)
    assert np.array_equal(np.argwhere(mask.any(axis=1)).ravel(), [2, 3, 4, 5])  # top edge in, bottom out
    assert np.array_equal(np.argwhere(mask.any(axis=0)).ravel(), [2, 3, 4, 5])  # left edge in, right out


def _fill_by_summing_every_pixel(polygons: list[np.ndarray], rows: int, columns: int) -> np.ndarray:
    """The even-odd fill as fill_window made it before it wrote runs: a toggle per crossing,
    summed along each row of the window, pixel by pixel (same crossings, same boundary rule; a
    crossing within 1e-9 of a pixel centre is on it, as packer's float noise tolerance says)."""
    mask = np.zeros((rows, columns), dtype=bool)
    segments = np.concatenate([np.stack([p, np.roll(p, -1, axis=0)], axis=1) for p in polygons])
    for (y0, x0), (y1, x1) in segments:
        first = int(np.clip(np.ceil(min(y0, y1)), 0, rows))
        stop = int(np.clip(np.ceil(max(y0, y1)), 0, rows))
        for row in range(first, stop):
            x = x0 + (row - y0) * ((x1 - x0) / (y1 - y0))
            x = round(x) if abs(x - round(x)) <= 1e-9 else x  # a crossing on a centre, up to float noise, is on it
            column = int(np.clip(np.ceil(x), 0, columns))
            mask[row, column:] ^= True
    return mask


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(1, 4), grid=st.sampled_from([0.0, 1.0, 0.5]), seed=st.integers(0, 2**32 - 1),
       shape=st.sampled_from([(24, 31), (7, 5), (64, 64)]))
def test_the_fill_written_as_runs_equals_summing_a_toggle_per_pixel(count: int, grid: float, seed: int,
                                                                     shape: tuple[int, int]) -> None:
    """Random polygons (self-intersecting, overlapping each other, reaching past the grid on
    every side, vertices snapped to pixel centres or half pixels so that crossings coincide and
    centres lie on edges): the runs between crossings give every pixel the summed toggles give."""
    rng = np.random.default_rng(seed)
    rows, columns = shape
    polygons = []
    for _ in range(count):
        points = rng.uniform([-6, -6], [rows + 6, columns + 6], size=(int(rng.integers(3, 12)), 2))
        polygons.append(np.round(points / grid) * grid if grid else points)
    expected = _fill_by_summing_every_pixel(polygons, rows, columns)
    assert np.array_equal(fill_even_odd(polygons, rows, columns), expected)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(1, 12), grid=st.sampled_from([0.0, 1.0, 0.5]), seed=st.integers(0, 2**32 - 1),
       budget=st.sampled_from([1, 40, 700, 1 << 24]))
def test_filling_a_roi_on_many_slices_at_once_equals_filling_each_slice_alone(count: int, grid: float, seed: int,
                                                                               budget: int) -> None:
    """One ROI's polygons on random slices of a series (several on a slice, past the grid's
    edges, vertices on pixel centres so that crossings sit at a window's last column): the
    windows over runs of slices, however few voxels each may hold, paint exactly what the
    even-odd fill of each slice's polygons alone paints."""
    rng = np.random.default_rng(seed)
    slices = series(count=6)
    polygons = [np.round(p / grid) * grid if grid else p
                for p in (rng.uniform([-4, -4], [ROWS + 4, COLUMNS + 4], size=(int(rng.integers(3, 9)), 2))
                          for _ in range(count))]
    at = rng.integers(0, len(slices), size=count)
    expected = np.stack([fill_even_odd([p for p, a in zip(polygons, at, strict=True) if a == k], ROWS, COLUMNS)
                         for k in range(len(slices))])
    painted = np.zeros_like(expected)
    original = rtstruct_module.FILL_VOXELS
    rtstruct_module.FILL_VOXELS = budget
    try:
        windows = rtstruct_module._fill_slices(rtstruct_module._Rings.of(polygons, 2), at,
                                               rtstruct_module._Grid.of(slices, "s"))
    finally:
        rtstruct_module.FILL_VOXELS = original
    for first, window, (top, left) in windows:
        box = painted[first:first + window.shape[0], top:top + window.shape[1], left:left + window.shape[2]]
        assert not (box & window).any()  # the windows do not overlap
        box |= window
    assert np.array_equal(painted, expected)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), overlap=st.sampled_from(["later_wins", "refuse"]))
def test_painting_a_stack_of_slices_equals_painting_them_one_by_one(seed: int, overlap: str) -> None:
    """Painter.paint of a D×H×W window gives the labels and the painted names that painting its
    slices one at a time gives, and refuses the same overlap (its slice, pixel and count). (A
    refused painter is dropped with its series, so what it holds after refusing is not compared.)"""
    rng = np.random.default_rng(seed)
    structures = list(MAP.structures)
    one, whole = (Painter(shape=(5, 12, 14), structures=MAP, overlap=overlap, path="p") for _ in range(2))

    def outcome(painter: Painter, structure: Structure, first: int, stack: np.ndarray, origin: tuple[int, int],
                by_slice: bool) -> str:
        try:
            if by_slice:
                for k in range(stack.shape[0]):
                    painter.paint(structure, first + k, stack[k], source="s", origin=origin)
            else:
                painter.paint(structure, first, stack, source="s", origin=origin)
        except AnnotationError as err:
            return f"{err.reason}: {err}"
        return "painted"

    for _ in range(int(rng.integers(1, 5))):
        structure = structures[int(rng.integers(len(structures)))]
        depth, rows, columns = int(rng.integers(1, 4)), int(rng.integers(1, 8)), int(rng.integers(1, 9))
        first = int(rng.integers(0, 6 - depth))
        origin = (int(rng.integers(0, 13 - rows)), int(rng.integers(0, 15 - columns)))
        stack = rng.random((depth, rows, columns)) < 0.4
        expected = outcome(one, structure, first, stack, origin, by_slice=True)
        assert outcome(whole, structure, first, stack, origin, by_slice=False) == expected
        if expected != "painted":
            break
        assert np.array_equal(whole.labels, one.labels) and whole.painted == one.painted


#: ids out of their declared order, and one class declared twice (its rank is where it first appears)
SHUFFLED = StructureMap((Structure("b", 7), Structure("a", 2), Structure("c", 300), Structure("b2", 7),
                         Structure("d", 1)))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), overlap=st.sampled_from(["later_wins", "refuse"]))
def test_painter_labels_equal_a_voxel_by_voxel_reference(seed: int, overlap: str) -> None:
    """Whatever order structures are painted in, each voxel holds, of the classes covering it, the
    one declared latest in the map (later_wins; a class declared twice ranks where it first
    appears); refuse raises mask_overlap on the first paint that covers a voxel of another class,
    and never otherwise. The reference keeps the best rank of every voxel, with none of the
    painter's shortcuts."""
    rng = np.random.default_rng(seed)
    structures = list(SHUFFLED.structures)
    shape = (4, 9, 11)
    painter = Painter(shape=shape, structures=SHUFFLED, overlap=overlap, dtype="uint16", path="p")
    best = np.full(shape, -1)  # the highest rank covering each voxel
    for _ in range(int(rng.integers(1, 7))):
        structure = structures[int(rng.integers(len(structures)))]
        depth, rows, columns = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 11))
        first = int(rng.integers(0, shape[0] - depth + 1))
        top, left = int(rng.integers(0, shape[1] - rows + 1)), int(rng.integers(0, shape[2] - columns + 1))
        stack = rng.random((depth, rows, columns)) < 0.5
        whole = np.zeros(shape, dtype=bool)
        whole[first:first + depth, top:top + rows, left:left + columns] = stack
        rank = SHUFFLED.rank(structure)
        clash = whole & (best >= 0) & (best != rank)
        if overlap == "refuse" and clash.any():
            with pytest.raises(AnnotationError) as err:
                painter.paint(structure, first, stack, source="s", origin=(top, left))
            assert err.value.reason == "mask_overlap"
            return
        painter.paint(structure, first, stack, source="s", origin=(top, left))
        best = np.where(whole, np.maximum(best, rank), best)
        ids = np.array([s.id for s in structures])
        expected = np.where(best >= 0, ids[np.maximum(best, 0)], 0)
        assert np.array_equal(painter.labels, expected)


@pytest.mark.parametrize("axis, degrees", [((1.0, 0.0, 0.0), 30.0), ((0.3, 1.0, 0.2), -55.0)])
def test_oblique_disc_in_patient_mm_lands_on_its_pixels(tmp_path: Path, axis: tuple[float, ...],
                                                        degrees: float) -> None:
    turn = rotation(axis, degrees)
    orientation = tuple(float(v) for v in (*turn[:, 0], *turn[:, 1]))
    slices = series(count=14, orientation=orientation, origin=(10.0, -40.0, 25.0))
    place = slices[6]
    x, y = turn[:, 0], turn[:, 1]
    centre = np.asarray(place.position) + 22.0 * x + 15.0 * y  # 22 mm along rows' direction, 15 mm down
    radius = 9.0
    t = np.linspace(0, 2 * np.pi, 72, endpoint=False)
    disc = centre + radius * (np.cos(t)[:, None] * x + np.sin(t)[:, None] * y) + 0.3 * np.cross(x, y)
    ds = rtstruct([("Heart", [(disc, "CLOSED_PLANAR", place.sop_uid)])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert drawn.notes == ()
    r, c = np.mgrid[0:ROWS, 0:COLUMNS]
    offset = (c * SPACING[1])[..., None] * x + (r * SPACING[0])[..., None] * y + np.asarray(place.position) - centre
    distance = np.linalg.norm(offset, axis=-1)
    inscribed = radius * math.cos(math.pi / 72)
    assert (labels[6][distance < inscribed - 1e-6] == 2).all()
    assert (labels[6][distance > radius + 1e-6] == 0).all()
    assert int((labels[6] == 2).sum()) == pytest.approx(math.pi * radius**2 / (SPACING[0] * SPACING[1]), rel=0.05)
    assert labels.sum() == labels[6].sum()  # nothing on another slice


def test_aliases_map_and_unmapped_are_counted(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("LUNG LEFT", [closed(slices[2], ISLAND_A)]), ("lt lung", [closed(slices[4], ISLAND_B)]),
                   ("Lung_L", [closed(slices[6], RING_OUT)]), ("Couch", [closed(slices[6], ISLAND_B)]),
                   ("dose 95%", [])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert drawn.unmapped == ("Couch", "dose 95%")
    assert {int(v) for v in np.unique(labels)} == {0, 1}
    assert labels[2].any() and labels[4].any() and labels[6].any()
    assert not labels[6][skimage_even_odd([ISLAND_B]) & ~skimage_even_odd([RING_OUT])].any()  # Couch not painted


def test_no_roi_mapped_is_annotation_unmapped_with_the_closest_names(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Lung-Lft", [closed(slices[2], ISLAND_A)]), ("Hearts", [closed(slices[2], ISLAND_B)])])
    with pytest.raises(AnnotationError) as caught:
        paint(tmp_path, ds, slices)
    assert caught.value.reason == "annotation_unmapped"
    assert "'Hearts' → heart" in caught.value.message and "mask.rois" in caught.value.message


@pytest.mark.parametrize("where, missing", [(7.3, (7, 8)), (16.0, ()), (-1.0, ())])
def test_contour_in_a_gap_or_beyond_the_series_is_off_slice(tmp_path: Path, where: float,
                                                            missing: tuple[int, ...]) -> None:
    slices = series(missing=missing)
    place = series()[0]
    contour = closed(place, ISLAND_A, lift=where * STEP)
    with pytest.raises(AnnotationError) as caught:
        paint(tmp_path, rtstruct([("Heart", [closed(slices[1], ISLAND_B), contour])]), slices)
    assert caught.value.reason == "contour_off_slice"
    assert "'Heart' contour 1" in caught.value.message and "half the slice spacing" in caught.value.message


def test_contour_between_adjacent_slices_goes_to_the_nearer_and_halfway_is_on_neither(tmp_path: Path) -> None:
    slices = series()
    labels, _ = paint(tmp_path, rtstruct([("Heart", [closed(slices[4], ISLAND_A, lift=0.4 * STEP)])]), slices)
    assert labels[4].any() and not labels[5].any()
    labels, _ = paint(tmp_path, rtstruct([("Heart", [closed(slices[5], ISLAND_A, lift=-0.4 * STEP)])]), slices)
    assert labels[5].any() and not labels[4].any()
    with pytest.raises(AnnotationError) as caught:
        paint(tmp_path, rtstruct([("Heart", [closed(slices[4], ISLAND_A, lift=0.5 * STEP)])]), slices)
    assert caught.value.reason == "contour_off_slice" and "halfway" in caught.value.message


def test_tilted_contour_is_off_slice(tmp_path: Path) -> None:
    slices = series()
    points = to_patient(slices[5], np.asarray(RING_OUT))
    points[:, 2] += np.array([-2.0, -2.0, 2.0, 2.0])  # mean on slice 5, ends 2 mm off: another orientation
    with pytest.raises(AnnotationError) as caught:
        paint(tmp_path, rtstruct([("Heart", [(points, "CLOSED_PLANAR", None)])]), slices)
    assert caught.value.reason == "contour_off_slice" and "not in the plane" in caught.value.message


def test_single_slice_series_matches_within_half_a_pixel(tmp_path: Path) -> None:
    slices = series(count=1)
    labels, _ = paint(tmp_path, rtstruct([("Heart", [closed(slices[0], ISLAND_A, lift=0.2)])]), slices)
    assert labels[0].any()
    with pytest.raises(AnnotationError, match="one slice") as caught:
        paint(tmp_path, rtstruct([("Heart", [closed(slices[0], ISLAND_A, lift=0.5)])]), slices)
    assert caught.value.reason == "contour_off_slice"


def test_degenerate_and_open_contours_are_skipped_and_a_bow_tie_is_filled_and_noted(tmp_path: Path) -> None:
    slices = series()
    bow_tie = [(5.2, 5.3), (30.7, 40.1), (5.4, 40.6), (30.1, 5.8)]
    two = closed(slices[2], [(3.0, 3.0), (9.0, 9.0)])
    flat = closed(slices[2], [(3.0, 3.0), (9.0, 9.0), (15.0, 15.0), (6.0, 6.0)])
    repeated = closed(slices[2], [(3.0, 3.0), (9.0, 9.0), (9.0, 9.0), (3.0, 3.0)])
    opened = (to_patient(slices[2], np.asarray(ISLAND_B)), "OPEN_PLANAR", None)
    point = (to_patient(slices[2], np.asarray([(4.0, 4.0)])), "POINT", None)
    ds = rtstruct([("Heart", [two, flat, repeated, opened, point, closed(slices[8], bow_tie)])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert not labels[2].any()
    assert drawn.notes == (
        "ROI 'Heart': 3 degenerate contours skipped (fewer than 3 distinct points, or all on one line): "
        "contours 1, 2, 3",
        "ROI 'Heart': 2 contours that are not CLOSED_PLANAR skipped (POINT and OPEN_* enclose no area): contours 4, 5",
        "ROI 'Heart': 1 self-intersecting contours filled by the even-odd rule (check the drawing): contours 6")
    assert assert_matches_skimage(labels[8] == 2, [bow_tie]) == 0
    assert labels[8, 17, 10] == 2 and labels[8, 10, 22] == 0  # the left lobe, and above the crossing


def test_contour_image_reference_is_not_trusted_position_wins(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Heart", [closed(slices[4], ISLAND_A, ref=slices[9].sop_uid),
                              closed(slices[6], ISLAND_A, ref=slices[6].sop_uid)])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert labels[4].any() and labels[6].any() and not labels[9].any()
    assert drawn.notes == ("ROI 'Heart': 1 contours' ContourImageSequence names another image than the slice at "
                           "their position (first: contour 1 on slice 4); position used",)


def test_two_rois_of_one_class_union(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Lung_L", [closed(slices[3], RING_OUT)]), ("Lung_R", [closed(slices[3], ISLAND_B)])])
    labels, _ = paint(tmp_path, ds, slices, overlap="refuse")
    assert np.array_equal(labels[3] == 1, skimage_even_odd([RING_OUT]) | skimage_even_odd([ISLAND_B]))


def test_overlap_of_two_classes_refused_or_later_declared_wins(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Heart", [closed(slices[3], RING_IN)]), ("Lung_L", [closed(slices[3], RING_OUT)])])
    with pytest.raises(AnnotationError) as caught:
        paint(tmp_path, ds, slices, overlap="refuse")
    assert caught.value.reason == "mask_overlap"
    # which slice: its place in the series' order (Instance Numbers may be shuffled), said so
    assert f"on slice 3 of {len(slices)} (counted from 0 in the series' order along its slice normal" \
        in caught.value.message
    labels, _ = paint(tmp_path, ds, slices, overlap="later_wins")
    inner = skimage_even_odd([RING_IN])
    assert (labels[3][inner] == 2).all()  # heart is declared after lung in the map: it wins, painted first or not
    assert (labels[3][skimage_even_odd([RING_OUT]) & ~near_edges([RING_IN]) & ~inner] == 1).all()


def valid(tmp_path: Path) -> tuple[Dataset, list[SlicePlace]]:
    slices = series()
    return rtstruct([("Lung_L", [closed(slices[3], RING_OUT), closed(slices[3], RING_IN)]),
                     ("Heart", [closed(slices[5], ISLAND_A)])]), slices


def reason(path: str, slices: list[SlicePlace], dataset: Dataset | None = None) -> str:
    painter = Painter(shape=(len(slices), ROWS, COLUMNS), structures=MAP, path=path)
    with pytest.raises(AnnotationError) as caught:
        paint_rtstruct(path, slices, MAP, painter, dataset=dataset)
    assert path in caught.value.message
    return caught.value.reason


def test_truncated_file_is_unreadable(tmp_path: Path) -> None:
    ds, slices = valid(tmp_path)
    path = save(ds, tmp_path / "rs.dcm")
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) * 2 // 3])
    assert reason(path, slices) == "unreadable"


def test_contour_data_of_seven_values_or_missing_is_unreadable(tmp_path: Path) -> None:
    ds, slices = valid(tmp_path)
    ds.ROIContourSequence[1].ContourSequence[0].ContourData = ["1.0"] * 7
    assert reason(save(ds, tmp_path / "seven.dcm"), slices) == "unreadable"
    del ds.ROIContourSequence[1].ContourSequence[0].ContourData
    assert reason(save(ds, tmp_path / "none.dcm"), slices) == "unreadable"


def test_non_numeric_contour_data_is_unreadable(tmp_path: Path) -> None:
    ds, slices = valid(tmp_path)
    ds.ROIContourSequence[1].ContourSequence[0].ContourData[4] = "12.345678"
    path = save(ds, tmp_path / "rs.dcm")
    data = Path(path).read_bytes()
    assert data.count(b"12.345678") == 1
    Path(path).write_bytes(data.replace(b"12.345678", b"12.3x5678"))
    assert reason(path, slices) == "unreadable"


_DS_VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.floats(min_value=-1e4, max_value=1e4).map(lambda v: f"{v:.6g}"),
    st.integers(-10**6, 10**6).map(str),
    st.sampled_from([" 1.5", "1.5 ", "+1.5", "1E+05", ".5", "5.", "-0", "1_0", "\u0661", "\t1", "", "1,5", "x",
                     "1e400", "0001.5", "1.2.3", "nan", "-inf", "1e", "0x10", "12\x00"]))


def _outcome(parse: Callable[[], list[np.ndarray]]) -> list[np.ndarray] | tuple[type, str]:
    try:
        return parse()
    except (AnnotationError, ValueError, UnicodeDecodeError) as err:
        return type(err), str(err)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(_DS_VALUE, max_size=9).map(lambda v: "\\".join(v))), max_size=6),
       st.sampled_from([b"", b" ", b"\x00", b" \x00"]))
def test_contour_data_parsed_at_once_equals_parsing_each_contour(texts: list[str | None], pad: bytes) -> None:
    """The batch parse of an ROI's ContourData (Arrow's cast) gives each contour's values, or
    the first error, exactly as numpy's item-by-item conversion does, for DS text valid or not."""
    items: list[Dataset | RawContour] = [
        RawContour(kind="CLOSED_PLANAR", declared=None, image_uids=(), image_frames=(),
                   data=None if text is None else text.encode("utf-8") + pad) for text in texts]
    where = "ROI 'r' ContourSequence item {}"
    expected = _outcome(lambda: [rtstruct_module._contour(item, k, "rs.dcm", where.format(k + 1)).points
                                 for k, item in enumerate(items)])
    got = _outcome(lambda: [contour.points for contour in rtstruct_module._parse("r", items, "rs.dcm")])
    if isinstance(expected, tuple):
        assert got == expected
        return
    assert isinstance(got, list) and len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


def test_contour_of_an_undeclared_roi_is_unreadable(tmp_path: Path) -> None:
    slices = series()
    ds = rtstruct([("Heart", [closed(slices[3], ISLAND_A)])], numbers=[5])
    assert reason(save(ds, tmp_path / "rs.dcm"), slices) == "unreadable"


def test_missing_contour_sequence_is_an_empty_roi_noted(tmp_path: Path) -> None:
    # Contour Sequence (3006,0040) is Type 3 (PS3.3 C.8.8.6): an ROI without contours is legal
    ds, slices = valid(tmp_path)
    del ds.ROIContourSequence[1].ContourSequence
    labels, drawn = paint(tmp_path, ds, slices)
    assert not (labels == 2).any() and (labels == 1).any()
    assert drawn.notes == ("ROI 'Heart': has no contour (an empty Contour Sequence or none): nothing painted",)


def test_missing_roi_sequences_are_unreadable(tmp_path: Path) -> None:
    ds, slices = valid(tmp_path)
    del ds.ROIContourSequence
    assert reason(save(ds, tmp_path / "a.dcm"), slices) == "unreadable"
    ds, _ = valid(tmp_path)
    del ds.StructureSetROISequence
    assert reason(save(ds, tmp_path / "b.dcm"), slices) == "unreadable"


MUTATIONS = ("delete", "text", "truncate", "flip", "number")


@settings(max_examples=int(os.environ.get("RT_FUZZ", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(MUTATIONS), seed=st.integers(0, 2**32 - 1))
def test_mutated_structure_sets_give_drawn_or_annotation_error(tmp_path: Path, kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ds, slices = valid(tmp_path)
    ds = copy.deepcopy(ds)
    path = tmp_path / "m.dcm"
    nested = [*ds.StructureSetROISequence, *ds.ROIContourSequence]
    nested += [c for item in ds.ROIContourSequence for c in item.ContourSequence]
    target = nested[int(rng.integers(len(nested)))]
    keywords = [e.keyword for e in target if e.keyword]
    if kind == "delete":
        delattr(target, keywords[int(rng.integers(len(keywords)))])
    elif kind == "number":
        setattr(target, "ROINumber" if "ROINumber" in target else "ReferencedROINumber", int(rng.integers(-3, 9)))
    elif kind == "text":
        element = target[keywords[int(rng.integers(len(keywords)))]]
        if element.VR != "SQ":
            element.value = ["1", "2"] if element.VR in ("DS", "IS") else "x"
    save(ds, path)
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        data = data[: int(rng.integers(0, len(data)))]
    elif kind == "flip":
        for at in rng.integers(132, len(data), size=int(rng.integers(1, 6))):
            data[at] = int(rng.integers(256))
    path.write_bytes(bytes(data))
    painter = Painter(shape=(len(slices), ROWS, COLUMNS), structures=MAP, path=str(path))
    try:
        drawn = paint_rtstruct(str(path), slices, MAP, painter)
    except AnnotationError as err:
        assert err.reason in ("unreadable", "annotation_unmapped", "contour_off_slice", "mask_overlap")
    else:
        assert isinstance(drawn, Drawn)


def _crossing_pairs_n_squared(pixels: np.ndarray) -> bool:
    """The self-intersection test as it was first written (every pair of edges compared by box,
    n × n), to hold the sort-and-sweep version to it."""
    start, end = pixels, np.roll(pixels, -1, axis=0)
    low, high = np.minimum(start, end), np.maximum(start, end)
    boxes = np.triu((low[:, None, 0] <= high[None, :, 0]) & (low[None, :, 0] <= high[:, None, 0])
                    & (low[:, None, 1] <= high[None, :, 1]) & (low[None, :, 1] <= high[:, None, 1]), k=2)
    i, j = np.nonzero(boxes)
    delta = end - start
    scale = 1e-9 * max(float(np.abs(delta).max()), 1.0) ** 2

    def side(edge: np.ndarray, point: np.ndarray) -> np.ndarray:
        value = delta[edge, 0] * (point - start[edge])[:, 1] - delta[edge, 1] * (point - start[edge])[:, 0]
        return np.where(np.abs(value) <= scale, 0.0, np.sign(value))

    return bool(((side(i, start[j]) * side(i, end[j]) < 0) & (side(j, start[i]) * side(j, end[i]) < 0)).any())


@settings(max_examples=400, deadline=None)
@given(points=st.integers(3, 40), grid=st.sampled_from([0.0, 1.0, 0.5]), shape=st.sampled_from(["random", "oval"]),
       seed=st.integers(0, 2**32 - 1))
def test_self_intersection_test_finds_what_comparing_every_pair_finds(points: int, grid: float, shape: str,
                                                                      seed: int) -> None:
    """Random polygons (vertices on a coarse grid too, so that edges touch, share lines and
    overlap collinearly, as a keyhole's channel does) and ovals (convex, or nearly: vertices
    snapped to a grid, some turning back, wound once or twice): the note is given exactly when
    some two edges cross properly, as the n × n comparison of every pair says."""
    from packer.read.rtstruct import _self_intersects

    rng = np.random.default_rng(seed)
    if shape == "random":
        pixels = rng.uniform(0, 12, size=(points, 2))
    else:
        turns = int(rng.integers(1, 3))
        angles = np.sort(rng.uniform(0, 2 * np.pi * turns, size=points + 3)) * rng.choice([-1, 1])
        pixels = np.stack([20 + rng.uniform(2, 15) * np.sin(angles), 30 + rng.uniform(2, 25) * np.cos(angles)], axis=1)
    if grid:
        pixels = np.round(pixels / grid) * grid
    pixels = pixels[np.any(np.abs(np.diff(pixels, axis=0, append=pixels[:1])) > 1e-9, axis=1)]
    if len(pixels) < 3:
        return
    assert _self_intersects(pixels) == _crossing_pairs_n_squared(pixels)


def test_self_intersection_note_on_a_bow_tie_and_a_star_not_on_a_keyhole_or_an_ellipse() -> None:
    from packer.read.rtstruct import _self_intersects

    angles = np.linspace(0, 2 * np.pi, 96, endpoint=False)
    ellipse = np.stack([20 + 15 * np.sin(angles), 30 + 25 * np.cos(angles)], axis=1)
    star = np.stack([20 + 15 * np.sin(angles[::19] * 2), 30 + 15 * np.cos(angles[::19] * 2)], axis=1)  # {5/2}
    bow_tie = np.array([(0.0, 0.0), (10.0, 10.0), (0.0, 10.0), (10.0, 0.0)])
    assert not _self_intersects(ellipse) and not _self_intersects(np.asarray(KEYHOLE))
    assert _self_intersects(bow_tie) and _self_intersects(star)


@pytest.mark.parametrize("copy", ["same", "rotated", "reversed"])
def test_a_contour_exported_twice_on_one_slice_is_painted_once_and_noted(tmp_path: Path, copy: str) -> None:
    """Even-odd makes a contour inside another a hole; the same polygon again (a TPS copy, a
    structure merged with itself; starting at another vertex or going the other way round) is
    no hole but one drawing repeated: XOR-ing it with itself would erase the structure on that
    slice. It is painted once and noted; a real hole (another outline) still is one."""
    slices = series()
    again = {"same": RING_OUT, "rotated": RING_OUT[2:] + RING_OUT[:2], "reversed": RING_OUT[::-1]}[copy]
    ds = rtstruct([("Heart", [closed(slices[4], RING_OUT), closed(slices[4], again), closed(slices[4], RING_IN),
                              closed(slices[6], RING_OUT)])])
    labels, drawn = paint(tmp_path, ds, slices)
    assert assert_matches_skimage(labels[4] == 2, [RING_OUT, RING_IN]) == 0  # the ring, its hole kept
    assert assert_matches_skimage(labels[6] == 2, [RING_OUT]) == 0  # the same outline on another slice: no repeat
    assert ("ROI 'Heart': 1 contours repeating an earlier contour of the ROI on the same slice painted once (the "
            "even-odd rule would cancel the copy against the original): contours 2") in drawn.notes


def test_roi_names_in_other_scripts_keep_their_letters_and_map_to_their_own_class(tmp_path: Path) -> None:
    # a Japanese, Chinese, Korean, Russian or Greek export names its ROIs in its own script; dropping
    # every letter outside a-z made 心臓 (heart), 肝臓 (liver) and 肺 (lung) one empty name, so the
    # heart was painted with the liver's class and an unmapped ROI with it too
    slices = series()
    rois = StructureMap((Structure("liver", 1, aliases=("肝臓",)), Structure("heart", 2, aliases=("心臓",)),
                         Structure("cord", 3, aliases=("Спинной мозг",)),
                         Structure("kidney", 4, aliases=("ＫＩＤＮＥＹ",))))
    ds = rtstruct([("肝臓", [closed(slices[2], ISLAND_A)]), ("心臓", [closed(slices[4], ISLAND_B)]),
                   ("肺", [closed(slices[6], RING_OUT)]), ("спинной МОЗГ", [closed(slices[8], RING_IN)]),
                   ("Kidney", [closed(slices[10], ISLAND_A)])])
    ds.SpecificCharacterSet = "ISO_IR 192"  # UTF-8, as such exports declare
    labels, drawn = paint(tmp_path, ds, slices, rois=rois)
    assert drawn.unmapped == ("肺",)
    assert set(np.unique(labels[2])) == {0, 1} and set(np.unique(labels[4])) == {0, 2}
    assert not labels[6].any()
    assert set(np.unique(labels[8])) == {0, 3}  # case folds in Cyrillic as in Latin
    assert set(np.unique(labels[10])) == {0, 4}  # full-width letters (Japanese systems) are the same letters


@pytest.mark.parametrize("top", [5, 12, 21, 30])
def test_a_box_drawn_through_pixel_centres_keeps_its_top_row_and_left_column_on_every_slice(
        tmp_path: Path, top: int) -> None:
    """The README's edge rule: a centre on a top or left edge is in, on a bottom or right one out.
    A box whose vertices lie on pixel centres (as a mask-to-contour conversion writes them) filled
    its top row on one slice and not another: ContourData in mm, divided back by the spacing,
    gave 12.000000000000002 for row 12, whose ceiling is 13. Every such box is rows top..top+3,
    columns top+1..top+4, on every slice."""
    slices = series()
    box = np.array([[top, top + 1], [top, top + 5], [top + 4, top + 5], [top + 4, top + 1]], dtype=np.float64)
    ds = rtstruct([("Lung_L", [closed(slices[k], box) for k in (2, 7, 11)])])
    labels, _ = paint(tmp_path, ds, slices)
    want = np.zeros((ROWS, COLUMNS), bool)
    want[top:top + 4, top + 1:top + 5] = True
    for k in (2, 7, 11):
        assert np.array_equal(labels[k] == 1, want), (k, np.argwhere(labels[k] == 1)[:3])
