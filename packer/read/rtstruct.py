"""RTSTRUCT contours as masks: an RT Structure Set's closed planar contours, filled on the series they were drawn on.

An RT Structure Set (PS3.3 C.8.8.5, C.8.8.6) holds no pixels: each ROI of the Structure Set ROI
Sequence (``ROINumber``, ``ROIName``) has, in the ROI Contour Sequence (``ReferencedROINumber``), a
Contour Sequence of polygons in patient millimetres (LPS). :func:`paint_rtstruct` maps each ROI by
name through the job's ``mask.rois`` (aliases, case- and punctuation-insensitive), places each
contour on a slice of the referenced series by position and fills it there:

- **Slice matching.** A contour's place along the slice normal ``n = X × Y`` (the first slice's
  orientation: a series' slices share it) is the mean of its points' ``P·n``; it belongs to the
  nearest slice when within the tolerance: half the slice spacing (the median step between
  consecutive slices along ``n``), or, for a series of one slice, half its smaller pixel spacing.
  So a contour between two adjacent slices goes to the nearer one; it is ``contour_off_slice``
  beyond the series' ends, in a gap where slices are missing, or halfway between two slices
  (within :data:`TIE_MM` of as near to both: it lies on neither, and picking one would shift the
  structure by half a slice unnoticed). A contour marked planar whose points stray from that
  slice by more than the tolerance (drawn on another orientation) is ``contour_off_slice`` too:
  projecting it would paint a shape nobody drew. Contour Image Sequence references are not
  trusted: position wins, and a reference that names another image is noted.
- **Points to pixels.** On slice ``(o, X, Y, Δrow, Δcol)``: ``c = (P − o)·X / Δcol``,
  ``r = (P − o)·Y / Δrow``; pixel ``(r, c)`` has its centre at integer ``(r, c)``.
- **Fill rule: even-odd at pixel centres.** All contours of one ROI on one slice are filled
  together (:func:`fill_even_odd`): a pixel is in when a ray from its centre towards −column
  crosses the contours' edges an odd number of times. A contour inside another of the same ROI
  is thus a hole (a lung around the heart, a ring), a keyhole contour is a ring too, and a
  self-intersecting contour (a bow-tie) is filled by the same rule and noted. Boundary rule: an
  edge crosses pixel row ``r`` when ``min(y0, y1) ≤ r < max(y0, y1)``, and a crossing at column
  ``x`` counts for the centres with ``c ≥ x``: a centre exactly on an edge is in on a left or top
  edge, out on a right or bottom edge (the top-left rule of scanline fills), so two ROIs or
  contours sharing an edge never both take a pixel. Every pixel whose centre is off the edges is
  exactly "centre inside": against scikit-image's ``polygon`` (XOR-combined), 300 random sets of
  1-3 polygons on 48×64 grids differed on 0 of 96,000 filled pixels with off-grid vertices, and with
  vertices on pixel centres on 3,796 of the 6,735 centres lying exactly on an edge, nowhere
  else. ``cv2.fillPoly`` was not used: it is even-odd across the polygons of one call too, but
  it fills every pixel an edge passes through, growing each outline (and shrinking each hole) by
  up to one pixel: it differed from centre-inside on about 16 % of the filled pixels there.
- **Skipped and noted**, never errors: ``POINT`` and ``OPEN_*`` contours (they enclose no area),
  degenerate contours (fewer than three distinct points, or all points on one line), ROIs with
  no contour, a ``NumberOfContourPoints`` that disagrees with ``ContourData`` (the data is
  used), and a contour repeating an earlier one of its ROI on its slice (the same vertices from
  any start, in either direction: even-odd would cancel the copy against the original, erasing
  the structure there). Self-intersection is looked for (proper crossings among the edge pairs whose bounding
  boxes overlap) only in contours of at most :data:`SELF_INTERSECTION_POINTS` points; longer
  ones are filled by the same rule without the note.

Contour items are read from their raw bytes where they are plainly encoded
(:mod:`packer.read.rtstruct_items`: pydicom would build a Dataset for each contour and each of
its image references), and parsed by pydicom otherwise, with the same outcome.

Every defect of the file raises :class:`~packer.read.annotations.AnnotationError` with a reason:
``unreadable`` (not parseable, a missing or malformed sequence or value, a contour naming an ROI
the structure set does not declare), ``annotation_unmapped`` (no ROI is in the map),
``contour_off_slice``, and the painter's ``mask_overlap``. Contours of unmapped ROIs are ignored,
not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pydicom
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

from packer.read.annotations import (
    RTSTRUCT_STORAGE,
    AnnotationError,
    Drawn,
    Painter,
    SlicePlace,
    uid_digest,
    unmapped_error,
)
from packer.read.dicom_attrs import item_text, sop_class_name
from packer.read.rtstruct_items import CONTOUR_DATA, RawContour, contour_items
from packer.structures import Structure, StructureMap

#: Contours with more points are filled without the self-intersection test (its pairs grow as n² at worst).
SELF_INTERSECTION_POINTS = 512
#: The convex shortcut of the self-intersection test is taken for contours within this many pixels
#: of the grid's origin, where rounding stays far below the edge test's tolerance.
CONVEX_EXTENT = 1e4
#: A coordinate farther than this from the origin (mm) is not a patient coordinate.
MAX_COORDINATE_MM = 1e6
#: A contour whose distances to its two nearest slices differ by at most this (mm) is halfway: on neither.
TIE_MM = 1e-3


@dataclass(frozen=True)
class _Contour:
    index: int  # 0-based in the ROI's Contour Sequence
    kind: str
    points: np.ndarray  # N×3 float64, mm
    image_uids: tuple[str, ...]
    image_frames: tuple[int, ...]  # Referenced Frame Numbers (1-based), where given
    declared: int | None  # NumberOfContourPoints


@dataclass
class _Tally:
    """One ROI's noted contours, by kind: contour indices (0-based; the notes print them from 1, as
    ContourSequence item numbers)."""

    kinds: dict[str, list[int]] = field(default_factory=dict)
    refs: list[tuple[int, int]] = field(default_factory=list)  # (contour, slice) whose reference disagrees

    def add(self, kind: str, index: int) -> None:
        self.kinds.setdefault(kind, []).append(index)


_NOTE_TEXT = {
    "not_closed": "contours that are not CLOSED_PLANAR skipped (POINT and OPEN_* enclose no area)",
    "degenerate": "degenerate contours skipped (fewer than 3 distinct points, or all on one line)",
    "self_intersecting": "self-intersecting contours filled by the even-odd rule (check the drawing)",
    "count_mismatch": "contours whose NumberOfContourPoints disagrees with ContourData (ContourData used)",
    "no_type": "contours without ContourGeometricType read as CLOSED_PLANAR",
    "repeated": ("contours repeating an earlier contour of the ROI on the same slice painted once (the even-odd "
                 "rule would cancel the copy against the original)"),
}


def _indices(items: list[int]) -> str:
    """0-based contour indices as the ContourSequence item numbers (from 1) the refusals print."""
    shown = ", ".join(str(i + 1) for i in items[:8])
    return shown + (", ..." if len(items) > 8 else "")


def _notes(name: str, tally: _Tally, empty: bool) -> list[str]:
    out = [f"ROI {name!r}: has no contour (an empty Contour Sequence or none): nothing painted"] if empty else []
    for kind, items in tally.kinds.items():
        out.append(f"ROI {name!r}: {len(items)} {_NOTE_TEXT[kind]}: contours {_indices(items)}")
    if tally.refs:
        first = tally.refs[0]
        out.append(f"ROI {name!r}: {len(tally.refs)} contours' ContourImageSequence names another image than the "
                   f"slice at their position (first: contour {first[0] + 1} on slice {first[1]}); position used")
    return out


def _read(path: str, dataset: Dataset | None) -> Dataset:
    if dataset is not None:
        return dataset
    try:
        return pydicom.dcmread(path)
    except Exception as err:  # any parse failure of the file is this file's defect
        raise AnnotationError("unreadable", (
            f"{path}: not a readable DICOM RT Structure Set ({type(err).__name__}: {err}); re-export it")) from err


def _items(ds: Dataset, keyword: str, path: str, where: str, *, required: bool) -> list[Dataset]:
    value = ds.get(keyword)
    if value is None:
        if required:
            raise AnnotationError("unreadable", (
                f"{path}: {where} has no {keyword} (Type 1); re-export the structure set"))
        return []
    items = list(value)
    for item in items:
        if not isinstance(item, Dataset):
            raise AnnotationError("unreadable", (
                f"{path}: {where} {keyword} is not a sequence; re-export the structure set"))
    return items


def _number(ds: Dataset, keyword: str, path: str, where: str) -> int:
    value = ds.get(keyword)
    if value is None or str(value).strip() == "":
        raise AnnotationError("unreadable", f"{path}: {where} has no {keyword}; re-export the structure set")
    return int(str(value).strip())


def _raw_values(value: bytes) -> np.ndarray:
    """A DS value's raw text as float64 values (a few times faster than pydicom's DSfloat each)."""
    text = value.decode("ascii").strip(" \x00")
    return np.array(text.split("\\"), dtype=np.float64) if text else np.zeros(0)


def _batch_values(items: Sequence[Dataset | RawContour]) -> list[np.ndarray] | None:
    """Each item's ContourData as :func:`_raw_values` gives it, all parsed at once by Arrow's
    string-to-float cast (about five times faster than numpy's per-string conversion, which is
    most of an ROI's parse); None where that cannot stand for :func:`_raw_values` exactly: an
    item that is not a :class:`RawContour` with data, text that is not ASCII, or any value the
    cast refuses. Arrow's cast is stricter than numpy's (it refuses surrounding whitespace,
    underscores and non-ASCII digits, which numpy accepts) and never accepts a value numpy
    refuses, and both round to the nearest double, so where it succeeds the values are
    numpy's; where it does not, the caller parses item by item, with every error that gives."""
    texts: list[bytes] = []
    for item in items:
        if not isinstance(item, RawContour) or item.data is None:
            return None
        texts.append(item.data.strip(b" \x00"))
    joined = b"\\".join(text for text in texts if text)
    if not joined:
        return [np.zeros(0) for _ in texts]
    try:
        parsed = pc.cast(pc.split_pattern(pa.array([joined.decode("ascii")]), "\\").flatten(), pa.float64())
    except (UnicodeDecodeError, pa.ArrowInvalid):
        return None
    counts = [text.count(b"\\") + 1 if text else 0 for text in texts]
    values = parsed.to_numpy(zero_copy_only=False, writable=True)
    if values.size != sum(counts):
        return None
    return np.split(values, np.cumsum(counts)[:-1])


def _coordinates(item: Dataset | RawContour, path: str, where: str, flat: np.ndarray | None = None) -> np.ndarray:
    """ContourData as N×3 float64, parsed from the raw DS text where pydicom has not converted it
    yet (a few times faster than converting each value to DSfloat), or checked as ``flat`` where
    :func:`_batch_values` parsed it already."""
    if flat is None:
        flat = _item_values(item, path, where)
    if flat.size == 0:  # Type 1: a value emptied by damage, not a contour drawn without points
        raise AnnotationError("unreadable", (
            f"{path}: {where} ContourData (3006,0050) is empty (Type 1: it holds the contour's points); "
            "re-export the structure set"))
    if flat.size % 3:
        raise AnnotationError("unreadable", (
            f"{path}: {where} ContourData holds {flat.size} values, not x, y, z triplets; re-export the structure set"))
    if not np.all(np.isfinite(flat)) or (flat.size and float(np.abs(flat).max()) > MAX_COORDINATE_MM):
        raise AnnotationError("unreadable", (
            f"{path}: {where} ContourData holds a value that is not a finite patient coordinate "
            f"(within ±{MAX_COORDINATE_MM:g} mm); re-export the structure set"))
    return flat.reshape(-1, 3)


def _item_values(item: Dataset | RawContour, path: str, where: str) -> np.ndarray:
    """One item's ContourData as flat float64 values, from its raw text where it can be."""
    if isinstance(item, RawContour):
        if item.data is None:
            raise _no_contour_data(path, where)
        return _raw_values(item.data)
    return _dataset_coordinates(item, path, where)


def _no_contour_data(path: str, where: str) -> AnnotationError:
    return AnnotationError("unreadable", f"{path}: {where} has no ContourData (3006,0050) (Type 1); re-export it")


def _dataset_coordinates(item: Dataset, path: str, where: str) -> np.ndarray:
    if CONTOUR_DATA not in item:
        raise _no_contour_data(path, where)
    element = item.get_item(CONTOUR_DATA)
    value = element.value if element is not None else None
    if isinstance(element, RawDataElement) and isinstance(value, bytes):
        return _raw_values(value)
    if value is None or value == "":
        return np.zeros(0)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return np.array([float(value)], dtype=np.float64)
    return np.array([float(v) for v in value], dtype=np.float64)


def _contour(item: Dataset | RawContour, index: int, path: str, where: str, flat: np.ndarray | None = None) -> _Contour:
    if isinstance(item, RawContour):  # read from the raw bytes (packer.read.rtstruct_items)
        return _Contour(index=index, kind=item.kind, points=_coordinates(item, path, where, flat),
                        image_uids=item.image_uids, image_frames=item.image_frames, declared=item.declared)
    kind = str(item.get("ContourGeometricType", "") or "").strip().upper()
    points = _coordinates(item, path, where)
    declared_raw = item.get("NumberOfContourPoints")
    declared = int(str(declared_raw).strip()) if declared_raw not in (None, "") else None
    uids: list[str] = []
    frames: list[int] = []
    for image in _items(item, "ContourImageSequence", path, where, required=False):
        uid = str(image.get("ReferencedSOPInstanceUID", "") or "").strip()
        if uid:
            uids.append(uid)
        number = image.get("ReferencedFrameNumber")
        if number not in (None, ""):
            values = list(number) if isinstance(number, (list, tuple, MultiValue)) else [number]
            frames.extend(int(str(v).strip()) for v in values)
    return _Contour(index=index, kind=kind, points=points, image_uids=tuple(uids), image_frames=tuple(frames),
                    declared=declared)


ROI_CONTOUR_SEQUENCE = 0x30060039


def _cut_short(ds: Dataset, tag: int) -> str:
    """Why the top-level sequence ``tag`` of ``ds`` is cut short ("" where it is whole): pydicom
    keeps the bytes a file cut inside an element of defined length still holds, without a word,
    so a sequence cut at an item's end parses as the items before the cut."""
    element = ds.get_item(tag)
    if not isinstance(element, RawDataElement) or not isinstance(element.value, bytes):
        return ""
    if element.length in (None, 0xFFFFFFFF) or len(element.value) >= element.length:
        return ""
    return (f"the file is cut short inside its ROIContourSequence (3006,0039): {len(element.value):,} of its "
            f"{element.length:,} bytes are there")


def _lost(declared: list[tuple[int, str, str]], items: dict[int, list[int]], rois: StructureMap,
          cut: str, path: str) -> list[str]:
    """Check that no ROI of the map lost its ROIContourSequence item to damage; returns the notes
    on the unmapped ROIs that did. An ROI without an item is drawn empty in a whole file (noted as
    such), but in one cut inside its ROIContourSequence it is the cut's, and where another item
    references an ROI twice, the damaged number may be its: its class would be missing from the
    mask, so the structure set is ``unreadable`` (a defect refuses the series)."""
    twice = {number: at for number, at in items.items() if len(at) > 1}
    missing = [(number, name) for number, name, _ in declared if number not in items]
    if not missing or not (cut or twice):
        return []
    why = cut or "; ".join(f"ROIContourSequence items {', '.join(str(k + 1) for k in at)} all reference ROINumber "
                           f"{number} (one item per ROI, PS3.3 C.8.8.6: a damaged ReferencedROINumber?)"
                           for number, at in sorted(twice.items()))
    for number, name in missing:
        structure = rois.by_name(name)
        if structure is not None:
            raise AnnotationError("unreadable", (
                f"{path}: ROI {name!r} ({structure.name}, ROINumber {number}) has no ROIContourSequence item: {why}; "
                f"its contours cannot be read, and the mask would lack {structure.name}. Re-export or re-copy the "
                "structure set"))
    names = {number: name for number, name, _ in declared}
    for number, at in sorted(twice.items()):
        structure = rois.by_name(names.get(number, ""))
        if structure is not None:  # the unmapped ROI's contours would be painted as this class
            raise AnnotationError("unreadable", (
                f"{path}: ROIContourSequence items {', '.join(str(k + 1) for k in at)} all reference ROINumber "
                f"{number}, ROI {names[number]!r} ({structure.name}), while ROI(s) "
                f"{', '.join(repr(name) for _, name in missing)} have no item (one item per ROI, PS3.3 C.8.8.6: a "
                f"damaged ReferencedROINumber?): another ROI's contours would be painted as {structure.name}. "
                "Re-export or re-copy the structure set"))
    return [f"ROI {name!r}: no ROIContourSequence item ({why}); not in the map, so the mask is not affected"
            for _, name in missing]


def _structure(ds: Dataset, path: str, walk_raw: bool = True
               ) -> tuple[list[tuple[int, str, str]], dict[int, list[Dataset | RawContour]], dict[int, list[int]]]:
    """The declared ROIs (number, name, Referenced Frame of Reference UID or "") in file order,
    each ROI number's contour items (read from their raw bytes where
    :func:`~packer.read.rtstruct_items.contour_items` can, and ``walk_raw``, else the Datasets
    pydicom builds), and the ROIContourSequence items (0-based) that reference each ROI number."""
    declared: list[tuple[int, str, str]] = []
    seen: set[int] = set()
    for k, roi in enumerate(_items(ds, "StructureSetROISequence", path, "the structure set", required=True)):
        where = f"StructureSetROISequence item {k + 1}"
        number = _number(roi, "ROINumber", path, where)
        if number in seen:
            raise AnnotationError("unreadable", (
                f"{path}: {where} repeats ROINumber {number}: their contours cannot be told apart; "
                "re-export the structure set"))
        seen.add(number)
        name = item_text(roi, "ROIName")  # bytes its character set cannot decode kept as \\xNN, not U+FFFD
        frame = str(roi.get("ReferencedFrameOfReferenceUID", "") or "").strip()
        declared.append((number, name or f"(unnamed ROI {number})", frame))
    if not declared:
        raise AnnotationError("unreadable", f"{path}: its StructureSetROISequence declares no ROI; nothing to paint")
    contours: dict[int, list[Dataset | RawContour]] = {}
    referenced: dict[int, list[int]] = {}
    for k, roi_contour in enumerate(_items(ds, "ROIContourSequence", path, "the structure set", required=True)):
        where = f"ROIContourSequence item {k + 1}"
        number = _number(roi_contour, "ReferencedROINumber", path, where)
        if number not in seen:
            raise AnnotationError("unreadable", (
                f"{path}: {where} references ROINumber {number}, which StructureSetROISequence does not declare "
                f"(it declares {sorted(seen)}); re-export the structure set"))
        referenced.setdefault(number, []).append(k)
        raw = contour_items(roi_contour) if walk_raw else None
        contours.setdefault(number, []).extend(
            raw if raw is not None else _items(roi_contour, "ContourSequence", path, where, required=False))
    return declared, contours, referenced


@dataclass(frozen=True)
class _Grid:
    """The series' slices as the contours are matched to them and mapped to pixels."""

    normal: np.ndarray  # unit X × Y of the first slice
    heights: np.ndarray  # each slice's IPP·n, mm
    tolerance: float  # mm
    step: float  # the median spacing, 0 for one slice
    positions: np.ndarray  # D×3: each slice's Image Position (Patient)
    rows_axis: np.ndarray  # D×3: each slice's X (along a row)
    columns_axis: np.ndarray  # D×3: each slice's Y (down a column)
    spacing: np.ndarray  # D×2: each slice's Pixel Spacing (between rows, between columns)
    shape: np.ndarray  # D×2 int64: each slice's rows, columns

    @classmethod
    def of(cls, slices: Sequence[SlicePlace], path: str) -> _Grid:
        if not slices:
            raise AnnotationError("mask_geometry", f"{path}: the series it references has no slice to paint on")
        normal = slices[0].normal()
        if not np.isfinite(normal).all() or float(np.linalg.norm(normal)) < 0.5:
            raise AnnotationError("mask_geometry", (
                f"{path}: the referenced series' Image Orientation (Patient) {slices[0].orientation} has no slice "
                "normal (row and column directions parallel or zero); fix the series' orientation"))
        heights = np.array([np.dot(np.asarray(s.position, dtype=np.float64), normal) for s in slices])
        steps = np.abs(np.diff(heights))
        step = float(np.median(steps)) if steps.size else 0.0
        if step > 1e-6:
            tolerance = step / 2
        else:
            step = 0.0
            tolerance = min(slices[0].spacing) / 2
        orientation = np.array([s.orientation[:6] for s in slices], dtype=np.float64)
        return cls(normal=normal, heights=heights, tolerance=tolerance, step=step,
                   positions=np.array([s.position for s in slices], dtype=np.float64),
                   rows_axis=orientation[:, :3], columns_axis=orientation[:, 3:6],
                   spacing=np.array([s.spacing for s in slices], dtype=np.float64),
                   shape=np.array([(s.rows, s.columns) for s in slices], dtype=np.int64))

    def rule(self) -> str:
        if self.step:
            return f"half the slice spacing of {self.step:.3g} mm"
        return "half the pixel spacing: the series has one slice"


@dataclass(frozen=True)
class _Rings:
    """Closed polygons with their vertices concatenated: polygon ``k`` is
    ``vertices[starts[k]:starts[k] + lengths[k]]``, closed implicitly (its last vertex joins its first).
    One ROI's contours are checked, placed, mapped and filled as such arrays, not one by one: a
    structure set holds hundreds of small contours per ROI, and per-contour numpy calls cost more
    than their arithmetic."""

    vertices: np.ndarray  # V×k float64
    lengths: np.ndarray  # int64 per polygon (0 allowed only until :meth:`select` drops them)

    @classmethod
    def of(cls, polygons: Sequence[np.ndarray], width: int) -> _Rings:
        if not polygons:
            return cls(np.zeros((0, width)), np.zeros(0, dtype=np.int64))
        return cls(np.concatenate(polygons), np.array([len(p) for p in polygons], dtype=np.int64))

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def owner(self) -> np.ndarray:
        """The polygon of each vertex."""
        return np.repeat(np.arange(self.lengths.size), self.lengths)

    def following(self) -> np.ndarray:
        """The index of each vertex's successor in its polygon (the last vertex's: the first)."""
        after = np.arange(1, len(self.vertices) + 1)
        ends = self.lengths > 0
        after[(self.starts + self.lengths - 1)[ends]] = self.starts[ends]
        return after

    def subset(self, keep: np.ndarray) -> _Rings:
        """The polygons where ``keep`` (boolean, one per polygon) holds."""
        return _Rings(self.vertices[np.repeat(keep, self.lengths)], self.lengths[keep])

    def select(self, vertex: np.ndarray) -> _Rings:
        """Each polygon with only the vertices where ``vertex`` (boolean, one per vertex) holds."""
        return _Rings(self.vertices[vertex], np.bincount(self.owner()[vertex], minlength=self.lengths.size))

    def distinct(self) -> _Rings:
        """Each polygon without consecutive repeats (nor a last vertex repeating the first):
        the vertices that differ from their successor by more than 1e-9 in a coordinate."""
        moved = np.any(np.abs(self.vertices[self.following()] - self.vertices) > 1e-9, axis=1)
        return self.select(moved)


def _dot(vectors: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Row-wise ``vectors · axis`` (N×3 each, or one axis for all), written out term by term so
    that a vertex maps to the same coordinate whichever polygons share the call (a matrix
    product's summation order depends on the operands' size)."""
    axis = np.broadcast_to(axis, vectors.shape)
    return vectors[:, 0] * axis[:, 0] + vectors[:, 1] * axis[:, 1] + vectors[:, 2] * axis[:, 2]


def _pixels(points: np.ndarray, grid: _Grid, at: np.ndarray) -> np.ndarray:
    """Patient points (N×3 mm) as N×2 float64 (row, column) pixel coordinates, each on the slice
    ``at`` names (one slice index per point): ``c = (P − o)·X / Δcol``, ``r = (P − o)·Y / Δrow``;
    pixel (r, c) has its centre at integer (r, c). The component along the slice normal is
    dropped (the caller checked it is within tolerance)."""
    offset = points - grid.positions[at]
    return _on_centres(np.stack([_dot(offset, grid.columns_axis[at]) / grid.spacing[at, 0],
                                 _dot(offset, grid.rows_axis[at]) / grid.spacing[at, 1]], axis=1))


#: How near (in pixels) a contour coordinate is taken as a pixel centre's: float64 arithmetic
#: puts a vertex written on a centre a few 1e-15 off it ((-3.6 + 12.0) / 0.7 = 12.000000000000002)
ON_CENTRE = 1e-9


def _on_centres(coords: np.ndarray) -> np.ndarray:
    """``coords`` with every value within :data:`ON_CENTRE` of an integer (a pixel centre) set to
    it, so the edge rule (a centre on a top or left edge is in, on a bottom or right one out)
    decides, not the rounding of the arithmetic: a box drawn through centres lost its top row on
    some slices and kept it on others."""
    nearest = np.rint(coords)
    return np.where(np.abs(coords - nearest) <= ON_CENTRE, nearest, coords)


def _off_slice(contour: _Contour, along: np.ndarray, grid: _Grid, slices: Sequence[SlicePlace], path: str,
               name: str) -> AnnotationError:
    """Why ``contour`` (its points' places ``along`` the slice normal) lies on no slice."""
    height = float(along.sum() / along.size)
    gaps = np.abs(grid.heights - height)
    order = np.argsort(gaps, kind="stable")
    nearest = int(order[0])
    where = (f"{path}: ROI {name!r} contour {contour.index} (ROIContourSequence → ContourSequence item "
             f"{contour.index + 1})")
    tie = len(order) > 1 and float(gaps[order[1]] - gaps[nearest]) <= TIE_MM
    if gaps[nearest] > grid.tolerance or tie:
        why = (f"as near to slice {int(order[1])} (a contour halfway between two slices lies on neither)" if tie
               else f"farther than {grid.tolerance:.3g} mm ({grid.rule()})")
        return AnnotationError("contour_off_slice", (
            f"{where} lies at {height:.3f} mm along the slice normal; the nearest slice ({nearest}, SOP "
            f"{slices[nearest].sop_uid}) is at {grid.heights[nearest]:.3f} mm, {why}; the structure set was drawn "
            "on another series, or the series misses slices: link it to the series it was drawn on (its "
            "RTReferencedSeriesSequence names it) or restore the missing slices"))
    return AnnotationError("contour_off_slice", (
        f"{where} is not in the plane of slice {nearest}: its points spread from {float(along.min()):.3f} to "
        f"{float(along.max()):.3f} mm along the slice normal (slice at {grid.heights[nearest]:.3f} mm, tolerance "
        f"{grid.tolerance:.3g} mm: {grid.rule()}); it was drawn in another orientation: link the structure set "
        "to the series it was drawn on"))


#: Contours compared with every slice at once, at most (a block of the contours × slices gap matrix).
PLACE_BLOCK = 1 << 20


def _place(rings: _Rings, along: np.ndarray, grid: _Grid) -> tuple[np.ndarray, np.ndarray]:
    """The slice each contour of ``rings`` lies on (its points' mean place ``along`` the normal is
    nearest that slice's), and whether it lies on none: farther than the tolerance, within
    :data:`TIE_MM` of as near to a second slice, or a point off the slice's plane by more than the
    tolerance."""
    count = rings.lengths.size
    height = np.bincount(rings.owner(), weights=along, minlength=count) / rings.lengths
    nearest = np.zeros(count, dtype=np.int64)
    off = np.zeros(count, dtype=bool)
    block = max(1, PLACE_BLOCK // max(1, grid.heights.size))
    for begin in range(0, count, block):
        gaps = np.abs(grid.heights[None, :] - height[begin:begin + block, None])
        near = np.argmin(gaps, axis=1)
        gap = gaps[np.arange(len(near)), near]
        tie = (np.partition(gaps, 1, axis=1)[:, 1] - gap <= TIE_MM) if grid.heights.size > 1 else False
        nearest[begin:begin + block] = near
        off[begin:begin + block] = (gap > grid.tolerance) | tie
    if count:
        stray = np.maximum.reduceat(np.abs(along - grid.heights[nearest][rings.owner()]), rings.starts)
        off |= stray > grid.tolerance
    return nearest, off


def _degenerate(rings: _Rings) -> np.ndarray:
    """Per polygon: fewer than three vertices, or all on one line (within 1e-6 pixel)."""
    out = rings.lengths < 3
    solid = rings.subset(~out)
    if not solid.lengths.size:
        return out
    owner, starts = solid.owner(), solid.starts
    centred = solid.vertices - solid.vertices[starts][owner]
    square = centred[:, 0] * centred[:, 0] + centred[:, 1] * centred[:, 1]
    farthest = np.maximum.reduceat(square, starts)
    position = np.where(square == farthest[owner], np.arange(len(square)), len(square))
    far = centred[np.minimum.reduceat(position, starts)]  # the first vertex farthest from the first
    length = np.hypot(far[:, 0], far[:, 1])
    spread = np.maximum.reduceat(np.abs(centred[:, 0] * far[owner, 1] - centred[:, 1] * far[owner, 0]), starts)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[~out] = (length < 1e-9) | (spread / length < 1e-6)
    return out


def _convex(rings: _Rings) -> np.ndarray:
    """Per polygon (each of three or more distinct vertices): whether it is convex: every turn the
    same way, well clear of straight (by 1e-9 of the two edges' lengths' product, far above
    rounding), and one full turn in all. Such a polygon is simple, so no two of its edges cross:
    each of its vertices lies strictly on one side of every edge's line."""
    after = rings.following()
    delta = rings.vertices[after] - rings.vertices
    following = delta[after]
    turn = delta[:, 0] * following[:, 1] - delta[:, 1] * following[:, 0]
    margin = 1e-9 * np.hypot(delta[:, 0], delta[:, 1]) * np.hypot(following[:, 0], following[:, 1])
    starts = rings.starts
    one_way = np.logical_and.reduceat(turn > margin, starts) | np.logical_and.reduceat(turn < -margin, starts)
    dot = delta[:, 0] * following[:, 0] + delta[:, 1] * following[:, 1]
    winding = np.bincount(rings.owner(), weights=np.arctan2(turn, dot), minlength=rings.lengths.size)
    return one_way & (np.abs(np.abs(winding) - 2 * np.pi) < 0.5)  # a star winds 4π or more


def _self_intersecting(rings: _Rings) -> np.ndarray:
    """Per polygon (each of three or more distinct vertices): whether two of its edges cross
    properly (touching and collinear overlaps, as in a keyhole's channel, do not count). None of a
    convex polygon's do (:func:`_convex`, for polygons within :data:`CONVEX_EXTENT` of the origin);
    the others are swept one by one (:func:`_edges_cross`)."""
    if not rings.lengths.size:
        return np.zeros(0, dtype=bool)
    near = np.maximum.reduceat(np.abs(rings.vertices).max(axis=1), rings.starts) <= CONVEX_EXTENT
    out = np.zeros(rings.lengths.size, dtype=bool)
    for k in np.flatnonzero(~(near & _convex(rings))):
        start = int(rings.starts[k])
        out[k] = _edges_cross(rings.vertices[start:start + int(rings.lengths[k])])
    return out


def _self_intersects(pixels: np.ndarray) -> bool:
    """:func:`_self_intersecting` of one polygon."""
    return bool(_self_intersecting(_Rings.of([pixels], 2))[0])


def _edges_cross(pixels: np.ndarray) -> bool:
    """Whether two edges of the closed polygon cross properly. Only edge pairs whose bounding
    boxes overlap are tested, found by sort and sweep: edges sorted by their lowest row, each
    paired with the edges after it that start at or above its highest row, then kept where their
    column ranges overlap too (the pairs of an n × n box comparison, at O(n log n) plus the pairs
    found)."""
    start = pixels
    end = np.roll(pixels, -1, axis=0)
    delta = end - start
    low, high = np.minimum(start, end), np.maximum(start, end)
    n = len(pixels)
    order = np.argsort(low[:, 0], kind="stable")
    reach = np.searchsorted(low[order, 0], high[order, 0], side="right")  # sorted edges p+1 .. reach-1 overlap p
    counts = reach - np.arange(n) - 1
    total = int(counts.sum())
    if not total:
        return False
    first = np.repeat(np.arange(n), counts)
    second = first + 1 + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    a, b = order[first], order[second]
    i, j = np.minimum(a, b), np.maximum(a, b)
    keep = (j - i >= 2) & (low[i, 1] <= high[j, 1]) & (low[j, 1] <= high[i, 1])
    i, j = i[keep], j[keep]
    if not i.size:
        return False
    scale = 1e-9 * max(float(np.abs(delta).max()), 1.0) ** 2

    def side(edge: np.ndarray, point: np.ndarray) -> np.ndarray:
        """−1, 0 or 1: which side of each edge ``edge`` each point lies on (0: on its line)."""
        v = point - start[edge]
        value = delta[edge, 0] * v[:, 1] - delta[edge, 1] * v[:, 0]
        return np.where(np.abs(value) <= scale, 0.0, np.sign(value))

    crosses = (side(i, start[j]) * side(i, end[j]) < 0) & (side(j, start[i]) * side(j, end[i]) < 0)
    return bool(crosses.any())


def fill_even_odd(polygons: Sequence[np.ndarray], rows: int, columns: int) -> np.ndarray:
    """:func:`fill_window` on the whole rows × columns grid."""
    window, (top, left) = fill_window(polygons, rows, columns)
    mask = np.zeros((rows, columns), dtype=bool)
    mask[top:top + window.shape[0], left:left + window.shape[1]] = window
    return mask


def _crossings(start: np.ndarray, end: np.ndarray, rows: np.ndarray | int,
               columns: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the edges ``start → end`` (E×2 (row, column) each) cross the pixel rows of a rows ×
    columns grid (per edge, or one for all): each crossing's edge, row and column, the column
    rounded up to the first pixel centre at or right of it and held to ``0 … columns``. An edge
    crosses row ``r`` when ``min(y0, y1) ≤ r < max(y0, y1)``."""
    y0, x0, y1, x1 = start[:, 0], start[:, 1], end[:, 0], end[:, 1]
    first = np.clip(np.ceil(np.minimum(y0, y1)), 0, rows)
    stop = np.clip(np.ceil(np.maximum(y0, y1)), 0, rows)  # rows first ≤ r < stop
    counts = (stop - first).astype(np.int64)
    kept = np.flatnonzero(counts > 0)
    y0, x0, y1, x1, counts = y0[kept], x0[kept], y1[kept], x1[kept], counts[kept]
    edge = np.repeat(np.arange(counts.size), counts)
    starts = np.cumsum(counts) - counts
    row = first[kept].astype(np.int64)[edge] + (np.arange(edge.size) - starts[edge])
    x = _on_centres(x0[edge] + (row - y0[edge]) * ((x1 - x0) / (y1 - y0))[edge])
    limit = columns[kept][edge] if isinstance(columns, np.ndarray) else columns
    column = np.clip(np.ceil(x), 0, limit).astype(np.int64)  # columns: the crossing is right of the grid
    return kept[edge], row, column


def fill_window(polygons: Sequence[np.ndarray], rows: int, columns: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The pixels of a rows × columns grid whose centre lies inside ``polygons`` (each N×2
    float (row, column) vertices, closed implicitly) by the even-odd rule, all polygons together.

    A centre exactly on an edge is in on a left or top edge and out on a right or bottom one (an
    edge crosses row ``r`` when ``min(y0, y1) ≤ r < max(y0, y1)``; a crossing at column ``x``
    counts for centres with ``c ≥ x``). Vertices may lie outside the grid. Cost: one numpy pass
    over the crossings of pixel rows with the edges (:func:`_crossings`), then the window written
    as runs of in and out between consecutive crossings (:func:`_parity_runs`): 63 µs for a
    96-point body contour (a 240 × 340 window), where a cumulative sum over every pixel of the
    window took 670 µs. Returns the window of the grid the polygons cover (a boolean array) and
    its top-left pixel: no pixel outside it is in."""
    empty = (np.zeros((0, 0), dtype=bool), (0, 0))
    rings = _Rings.of([p for p in polygons if len(p) >= 2], 2)
    if not rings.lengths.size or rows <= 0 or columns <= 0:
        return empty
    _, row, column = _crossings(rings.vertices, rings.vertices[rings.following()], rows, columns)
    if not row.size:
        return empty
    # each row holds an even number of crossings (a closed polygon, half-open rows): the parity is
    # 0 left of a row's first and from its last on, so only the window they span is written
    low, high = int(row.min()), int(row.max()) + 1
    left, right = int(column.min()), int(column.max())
    if right == left:
        return empty
    width = right - left
    window = _parity_runs(np.sort((row - low) * width + column - left), (high - low) * width)
    return window.reshape(high - low, width), (low, left)


#: The fill of one ROI writes at most about this many voxels at once (a window over consecutive slices).
FILL_VOXELS = 1 << 24


def _fill_slices(rings: _Rings, at: np.ndarray, grid: _Grid) -> list[tuple[int, np.ndarray, tuple[int, int]]]:
    """:func:`fill_window` of each slice's polygons (polygon ``k`` lies on slice ``at[k]``), many
    slices at a time: ``(first slice, D×H×W window, (top, left))`` for runs of consecutive slices
    (one window box for all, at most about :data:`FILL_VOXELS` voxels), where any pixel is in. A
    pixel's parity counts only its own slice's crossings, as each slice alone would: every pixel
    row of every slice holds an even number of them."""
    if not rings.lengths.size:
        return []
    slice_of = at[rings.owner()]
    edge, row, column = _crossings(rings.vertices, rings.vertices[rings.following()], grid.shape[slice_of, 0],
                                   grid.shape[slice_of, 1])
    if not row.size:
        return []
    depth = slice_of[edge]
    low, high = int(row.min()), int(row.max()) + 1
    left, right = int(column.min()), int(column.max())
    if right == left:
        return []
    plane = (high - low) * (right - left)
    run = max(1, FILL_VOXELS // plane)  # slices a window spans
    top_slice = int(depth.min())
    chunk = (depth - top_slice) // run
    # each chunk's positions count from its own first voxel; a crossing at the end of a chunk's
    # last row (its column right of every pixel) is its chunk's last position, not the next one's first
    local = ((depth - top_slice - chunk * run) * (high - low) + row - low) * (right - left) + column - left
    order = np.lexsort((local, chunk))
    chunk, local = chunk[order], local[order]
    bounds = np.flatnonzero(np.diff(chunk)) + 1
    out = []
    for part, positions in zip(np.split(chunk, bounds), np.split(local, bounds), strict=True):
        first = top_slice + int(part[0]) * run
        count = min(run, int(depth.max()) + 1 - first)
        window = _parity_runs(positions, count * plane).reshape(count, high - low, right - left)
        out.append((first, window, (low, left)))
    return out


def _parity_runs(positions: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` booleans whose ``p``-th is in when an odd number of the sorted crossing
    ``positions`` are ``≤ p`` (a crossing may sit at ``size``: it toggles nothing), for a window
    read row after row (``position = row × width + column``).

    Each row holds an even number of crossings: an edge crosses row ``r`` when one end lies
    at or above it (``y ≤ r``) and the other below (``y > r``), and going round a closed polygon
    that side changes an even number of times. So the window's pixels, read row after row, are
    runs of out and in that change at each crossing, and a crossing at the end of a row (column
    ``width``) is the start of the next, where the parity is even again either way. The window
    is written run by run (``np.repeat``) instead of summing a toggle per pixel."""
    # two crossings at one place make a run of length 0 between them: they cancel, as they should
    edges = np.empty(positions.size + 2, dtype=np.int64)
    edges[0], edges[1:-1], edges[-1] = 0, positions, size
    lengths = np.diff(edges)
    values = np.zeros(lengths.size, dtype=np.uint8)
    values[1::2] = 1
    return np.repeat(values, lengths).view(bool)


def _matches_reference(contour: _Contour, place: SlicePlace) -> bool:
    if not contour.image_uids:
        return True
    if place.sop_uid not in contour.image_uids:
        return False
    return not contour.image_frames or place.frame + 1 in contour.image_frames


def _parse(name: str, items: list[Dataset | RawContour], path: str) -> list[_Contour]:
    batch = _batch_values(items)
    return [_contour(item, index, path, f"ROI {name!r} ContourSequence item {index + 1}",
                     batch[index] if batch is not None else None)
            for index, item in enumerate(items)]


def _repeats(rings: _Rings, at: np.ndarray) -> np.ndarray:
    """Per polygon: whether an earlier polygon on the same slice has the same vertices in the
    same cyclic order, from any starting vertex and in either direction (an ROI exported twice,
    a structure merged with its own copy). Filled even-odd, the copy would cancel the original:
    a hole needs an outline of its own. Only polygons alike in slice, vertex count and bounding
    box (which no reordering changes) are compared vertex by vertex."""
    out = np.zeros(rings.lengths.size, dtype=bool)
    if rings.lengths.size < 2:
        return out
    starts = rings.starts
    low = np.minimum.reduceat(rings.vertices, starts)
    high = np.maximum.reduceat(rings.vertices, starts)
    alike: dict[bytes, list[int]] = {}
    for k, key in enumerate(np.column_stack([at, rings.lengths, low.view(np.int64), high.view(np.int64)])):
        alike.setdefault(key.tobytes(), []).append(k)
    for group in alike.values():
        seen: set[bytes] = set()
        for k in group if len(group) > 1 else ():
            ring = rings.vertices[starts[k]:starts[k] + rings.lengths[k]]
            forms = []
            for way in (ring, ring[::-1]):
                first = int(np.lexsort((way[:, 1], way[:, 0]))[0])  # its least vertex (row, then column) first
                forms.append(np.ascontiguousarray(np.roll(way, -first, axis=0)).tobytes())
            form = min(forms)
            out[k] = form in seen
            seen.add(form)
    return out


def _place_roi(name: str, contours: list[_Contour], slices: Sequence[SlicePlace], grid: _Grid, path: str,
               tally: _Tally) -> tuple[_Rings, np.ndarray]:
    """One ROI's closed contours as pixel polygons (in contour order) and the slice each lies
    on. Skipped, in this order, and tallied: contours that are not CLOSED_PLANAR, those of fewer
    than three distinct points in space, then (after placing) those degenerate in pixels and
    those repeating an earlier contour on their slice (:func:`_repeats`); the first contour (in
    order) on no slice raises ``contour_off_slice``."""
    events: list[tuple[int, int, str, int]] = []  # (position, step, kind, contour index): tallied in this order
    chosen: list[int] = []
    for k, contour in enumerate(contours):
        if not contour.kind:
            events.append((k, 0, "no_type", contour.index))
        elif contour.kind != "CLOSED_PLANAR":
            events.append((k, 0, "not_closed", contour.index))
            continue
        if contour.declared is not None and contour.declared != len(contour.points):
            events.append((k, 1, "count_mismatch", contour.index))
        chosen.append(k)
    space = _Rings.of([contours[k].points for k in chosen], 3)
    solid = space.distinct().lengths >= 3
    events.extend((chosen[k], 2, "degenerate", contours[chosen[k]].index) for k in np.flatnonzero(~solid))
    chosen = [chosen[k] for k in np.flatnonzero(solid)]
    space = space.subset(solid)
    along = _dot(space.vertices, grid.normal)
    at, off = _place(space, along, grid)
    if off.any():
        k = int(np.argmax(off))
        start = int(space.starts[k])
        raise _off_slice(contours[chosen[k]], along[start:start + int(space.lengths[k])], grid, slices, path, name)
    plane = _Rings(_pixels(space.vertices, grid, at[space.owner()]), space.lengths).distinct()
    flat = _degenerate(plane)
    events.extend((chosen[k], 3, "degenerate", contours[chosen[k]].index) for k in np.flatnonzero(flat))
    plane, at, chosen = plane.subset(~flat), at[~flat], [c for c, f in zip(chosen, flat, strict=True) if not f]
    again = _repeats(plane, at)
    events.extend((chosen[k], 4, "repeated", contours[chosen[k]].index) for k in np.flatnonzero(again))
    plane, at, chosen = plane.subset(~again), at[~again], [c for c, r in zip(chosen, again, strict=True) if not r]
    small = plane.lengths <= SELF_INTERSECTION_POINTS
    crossing = np.zeros(plane.lengths.size, dtype=bool)
    crossing[small] = _self_intersecting(plane.subset(small))
    events.extend((chosen[k], 5, "self_intersecting", contours[chosen[k]].index) for k in np.flatnonzero(crossing))
    for *_, kind, index in sorted(events):
        tally.add(kind, index)
    tally.refs.extend((contours[c].index, int(a)) for c, a in zip(chosen, at, strict=True)
                      if not _matches_reference(contours[c], slices[int(a)]))
    return plane, at


def paint_rtstruct(path: str, slices: Sequence[SlicePlace], rois: StructureMap, painter: Painter, *,
                   dataset: Dataset | None = None, walk_raw: bool = True, frame_of_reference: str = "",
                   elsewhere: frozenset[str] = frozenset()) -> Drawn:
    """Paint the RT Structure Set at ``path`` (or its already read ``dataset``) onto ``painter``,
    whose D slices are ``slices`` (the referenced series in order along its normal).

    Each ROI whose ``ROIName`` the map ``rois`` names (:meth:`StructureMap.by_name`) is painted as
    its class, once per slice it has contours on: ``painter.paint(structure, index, mask,
    source=ROIName)`` with the even-odd fill of all its closed contours there (see the module
    docstring for slice matching and the boundary rule). Two ROIs of one class are their union;
    an overlap of two classes is the painter's policy. Returns the unmapped ROI names and notes.

    ``walk_raw``: read the contour items from their raw bytes where they are plainly encoded
    (:mod:`packer.read.rtstruct_items`); False lets pydicom build a Dataset for each (the same
    outcome, slower: what the raw walk is tested against). ``frame_of_reference``: the series'
    Frame of Reference UID, where known: an ROI the map names whose Referenced Frame of
    Reference UID is another one was drawn on another scan (a registered MR or PET; its points
    are that scan's patient coordinates) and refuses the object, ``mask_geometry``.
    ``elsewhere``: the SOP Instance UIDs of the series' other stacks (its other acquisitions,
    stacked apart): a contour whose Contour Image Sequence names only those belongs there, and is
    left to that stack's painting, never placed here.

    Raises :class:`AnnotationError` and nothing else for a defect of the file: ``unreadable``,
    ``annotation_unmapped`` (no ROI maps: with the closest names), ``contour_off_slice``,
    ``mask_geometry`` (no slices, or a mapped ROI in another frame of reference), and the
    painter's ``mask_overlap``.
    """
    ds = _read(path, dataset)
    mapped: list[tuple[str, Structure, list[_Contour], bool]] = []  # bool: the file holds contours of it
    unmapped: list[str] = []
    held = kept = 0  # contours of mapped ROIs in the file, and of them this stack's (not all elsewhere)
    # pydicom parses a sequence and converts a value when first accessed, so a damaged file
    # fails here, with any exception a parser can raise: all of them are this file's defect
    try:
        cut = _cut_short(ds, ROI_CONTOUR_SEQUENCE)  # before pydicom parses the sequence
        declared, items, referenced = _structure(ds, path, walk_raw)
        lost = _lost(declared, referenced, rois, cut, path)
        for number, name, frame in declared:
            structure = rois.by_name(name)
            if structure is None:
                unmapped.append(name)
                continue
            if frame and frame_of_reference and frame != frame_of_reference:
                raise AnnotationError("mask_geometry", (
                    f"{path}: ROI {name!r} ({structure.name}) lies in frame of reference {uid_digest(frame)} (its "
                    f"ReferencedFrameOfReferenceUID; UID digests), not the series' {uid_digest(frame_of_reference)}: "
                    "its points are another scan's patient coordinates (a registered MR or PET), so painted on this "
                    "series the structure would land wherever the two origins put it; export it registered to "
                    "this series, or leave it out of mask.rois"))
            contours = _parse(name, items.get(number, []), path)
            drawn = bool(contours)
            held += len(contours)
            if elsewhere:
                contours = [c for c in contours if not (c.image_uids and all(u in elsewhere for u in c.image_uids))]
            mapped.append((name, structure, contours, drawn))
            kept += len(contours)
    except AnnotationError:
        raise
    except Exception as err:
        raise AnnotationError("unreadable", (
            f"{path}: malformed ROI or contour sequences ({type(err).__name__}: {err}); "
            "re-export the structure set")) from err
    if not mapped:
        raise unmapped_error(path, "ROIs", "rois", [name for _, name, _ in declared], rois)
    grid = _Grid.of(slices, path)
    notes: list[str] = list(lost)
    for name, structure, contours, drawn in mapped:
        tally = _Tally()
        rings, at = _place_roi(name, contours, slices, grid, path, tally)
        # "has no contour" only where the file holds none: contours all on another stack of the
        # series (stacked per acquisition) are that stack's, and this one paints nothing of them
        notes.extend(_notes(name, tally, empty=not drawn))
        if rings.lengths.size:
            painter.record(structure, name)
        for first, window, origin in _fill_slices(rings, at, grid):
            painter.paint(structure, first, window, source=name, origin=origin)
    return Drawn(unmapped=tuple(unmapped), notes=tuple(notes), sop_class=sop_class_name(RTSTRUCT_STORAGE),
                 elsewhere=bool(held) and not kept)
