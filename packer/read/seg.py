"""DICOM SEG → the label map of the series it references: one segment and one frame at a time.

highdicom (:class:`highdicom.seg.Segmentation`) reads the object: it checks the SOP class and
the multi-frame module, types the segment descriptions (label, coded property type), builds
its frame table, unpacks BINARY bits (frames need not start on a byte) and decodes each frame
on demand (``get_stored_frame``), so a 150-slice, 5-segment SEG is never decoded as one dense
array. highdicom 0.28 has no public per-frame accessor for "which source slice, which segment,
where", so this module reads those three values from the per-frame functional group items that
highdicom has already typed (:func:`_frame_places`); it never touches Pixel Data itself.

Rules (the README's, stated once here):

- **Class of a segment**: its Segment Label through ``mask.segments`` (names and aliases,
  compared without case, spaces or punctuation), else its Segmented Property Type code
  (``SCT:10200004``). A segment in no class is *unmapped* (ignored, reported); a SEG none of
  whose segments maps is ``annotation_unmapped``.
- **Frame → slice**: by reference first (Derivation Image → Source Image: Referenced SOP
  Instance UID, + Referenced Frame Number for a multi-frame source; a multi-frame source named
  without one is referenced in all its frames, PS3.3 Table 10-3, and names no one slice), when the
  references name exactly one slice of the series; else by position: the slice whose centre lies within half
  the series' slice spacing (the median gap) of the frame along the slice normal. A frame on no
  slice, on two (exactly midway), or whose reference contradicts its position by more than half
  a spacing is ``annotation_frames``.
- **Same grid** (copied pixel for pixel): same rows and columns, orientation cosines within
  1e-4, pixel spacing within 1e-4 relative, the frame's first pixel within 1e-3 mm of the
  slice's in the slice plane, and, where the SEG says its SpacingBetweenSlices, that spacing
  within 1% of the series' (a SEG drawn on a 9 mm reconstruction of a 3 mm series is not on its
  grid, although each of its frames lies on one of its slices; a SEG whose frames all lie on one
  plane has no spacing, whatever it says). Any other frame is on *another
  grid*: ``grid="require"`` → ``mask_geometry``; ``grid="resample"`` → the whole segment is
  resampled by nearest neighbour.
- **Resampling** (nearest neighbour in patient coordinates): each slice pixel centre takes the
  SEG plane nearest along the SEG's normal, provided it lies within half the SEG's own slice
  spacing (SpacingBetweenSlices, else the smallest gap between its frame planes, else
  SliceThickness, else the series' spacing), since a SEG omits empty frames and a farther plane
  says nothing about this point; then the SEG pixel whose centre is nearest in that plane
  (``floor(x + 0.5)``: a centre exactly midway takes the higher index); 0 outside the frame.
- **FRACTIONAL**: a voxel is on when ``stored / MaximumFractionalValue >= threshold``
  (inclusive: 0.5 keeps a voxel stored at exactly half); a stored value above
  MaximumFractionalValue is ``mask_values``. BINARY: on where the bit is 1. LABELMAP (highdicom
  0.28 reads it): on where the stored value is the segment's number.
- Source slices without a frame of a segment are empty for it. Overlaps between classes follow
  the :class:`~packer.read.annotations.Painter`'s policy.
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import highdicom as hd
import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import BytesLengthException, InvalidDicomError

from packer.read.annotations import (
    SEG_STORAGE,
    AnnotationError,
    Drawn,
    Painter,
    SlicePlace,
    uid_digest,
    unmapped_error,
)
from packer.read.dicom_attrs import item_text, sop_class_name
from packer.read.dicom_cut import cut_in_header
from packer.structures import Structure, StructureMap

GRID_POLICIES = ("require", "resample")
SEG_CLASSES = (SEG_STORAGE, "1.2.840.10008.5.1.4.1.1.66.7")  # Segmentation, Label Map Segmentation
ORIENTATION_TOL = 1e-4  # cosines
SPACING_RTOL = 1e-4  # relative
IN_PLANE_TOL_MM = 1e-3
#: How far a SEG's SpacingBetweenSlices may differ from the series' slice spacing (relative) and
#: still be its grid: DS text rounds both, and a 1% difference is far below a slice
SLICE_SPACING_RTOL = 1e-2

# What highdicom and pydicom raise on a malformed file (a missing attribute, a short value, a
# sequence without items, a frame past the pixel data, a damaged element decoded on access; and
# sqlite3's IntegrityError from the frame tables highdicom builds when a referenced series or
# instance has no UID): turned into ``unreadable`` with their text.
_FILE_DEFECTS = (InvalidDicomError, OSError, EOFError, ValueError, TypeError, KeyError, AttributeError,
                 IndexError, NotImplementedError, RuntimeError, struct.error, BytesLengthException,
                 sqlite3.Error)


#: A Source Image reference without Referenced Frame Number (0008,1160): Type 1C, absent where the
#: reference applies to every frame of a multi-frame instance (PS3.3 Table 10-3), and for a
#: single-frame one, whose only frame it names
ANY_FRAME = -1


@dataclass(frozen=True)
class _Frame:
    """One SEG frame: its 0-based index, the segment number it holds (0 for a LABELMAP frame:
    all), the source (SOP Instance UID, 0-based frame or :data:`ANY_FRAME`) pairs it derives
    from, and its plane."""

    index: int
    segment: int
    sources: tuple[tuple[str, int], ...]
    position: np.ndarray | None
    orientation: np.ndarray
    spacing: tuple[float, float]
    between: float | None  # SpacingBetweenSlices of its pixel measures
    thickness: float | None  # SliceThickness of its pixel measures


def paint_seg(path: str, slices: Sequence[SlicePlace], segments: StructureMap, painter: Painter, *,
              threshold: float = 0.5, grid: str = "require", dataset: Dataset | None = None,
              elsewhere: frozenset[str] = frozenset(), frame_of_reference: str = "") -> Drawn:
    """Paint each mapped segment of the SEG at ``path`` onto ``painter`` (D×H×W, D = ``len(slices)``).

    ``slices`` are the referenced series' slices in order along the normal (slice ``i`` is
    ``painter.labels[i]``); ``segments`` maps segments to classes; ``threshold`` (0 < t ≤ 1) turns
    a FRACTIONAL SEG on where ``stored / MaximumFractionalValue >= threshold``; ``grid``
    (``require`` | ``resample``) says what a frame on another grid than its slice does;
    ``dataset``: the file already parsed (not modified); ``elsewhere``: the SOP Instance UIDs of
    the series' other stacks (its other acquisitions, stacked apart): a frame that references
    only those belongs there, and is left to that stack's painting, never placed here;
    ``frame_of_reference``: the series' Frame of Reference UID ("" where its files name none), which
    the SEG's own must equal (``mask_geometry`` otherwise). Returns the
    unmapped segment labels and notes. Raises :class:`AnnotationError` for every defect of the file: ``unreadable``,
    ``annotation_unmapped``, ``annotation_frames``, ``mask_geometry``, ``mask_values``, and
    ``mask_overlap`` from the painter; ValueError for a bad ``threshold`` or ``grid`` (a caller's
    error, not the file's).
    """
    if grid not in GRID_POLICIES:
        raise ValueError(f"grid must be one of {GRID_POLICIES}, not {grid!r}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], not {threshold!r}")
    if painter.shape[0] != len(slices):
        raise ValueError(f"a painter of {painter.shape[0]} slices for {len(slices)} slice places")
    seg, segment_names = _read(path, dataset)
    try:
        kind = str(seg.SegmentationType).upper()
        classes, unmapped = _map_segments(path, seg, segments, segment_names)
        _check_frame_of_reference(path, seg, frame_of_reference)
        placed_frames = _frame_places(path, seg, kind, sorted(int(n) for n in seg.segment_numbers))
        frames = [f for f in placed_frames
                  if not (f.sources and elsewhere and all(uid in elsewhere for uid, _ in f.sources))]
        # a segment drawn on the series' other stacks only is theirs, not empty here
        theirs = {f.segment for f in placed_frames} - {f.segment for f in frames}
        scale = _fractional_scale(path, seg) if kind == "FRACTIONAL" else None
        if _one_plane(placed_frames):  # its SpacingBetweenSlices spaces nothing: not compared with the series'
            frames = [replace(f, between=None) for f in frames]
    except AnnotationError:
        raise
    except _FILE_DEFECTS as err:
        raise _unreadable(path, err) from err
    notes: list[str] = []
    geometry = _Series(slices)
    between = _seg_spacing(frames, geometry)
    for number, (structure, label) in classes.items():
        own = [f for f in frames if f.segment in (number, 0)]
        if not own:
            if number not in theirs:
                notes.append(f"segment {number} ({label!r}) has no frames: empty")
            continue
        placed = [(f, *geometry.place(f, seg.Rows, seg.Columns)) for f in own]
        off = [p for p in placed if p[2] != "copy"]
        if off and grid == "require":
            raise _placement_error(path, off[0], geometry, seg, label)
        pixels = _Pixels(path, seg, kind, number, scale, threshold)
        if not off:
            for frame, index, _ in placed:
                assert index is not None  # "copy" always names its slice
                painter.paint(structure, index, pixels.mask(frame), source=label)
            continue
        outside = _resample(path, own, pixels, slices, geometry, between, structure, painter, label)
        if outside:
            notes.append(f"segment {number} ({label!r}): {outside} of its {len(own)} frames lie on no slice of the "
                         "series (beyond its ends, or where a slice is missing) and were not painted")
    mapped = {*classes, 0}  # a LABELMAP frame (segment 0) holds every segment
    return Drawn(unmapped=tuple(unmapped), notes=tuple(notes), sop_class=sop_class_name(str(seg.SOPClassUID)),
                 elsewhere=not any(f.segment in mapped for f in frames)
                 and any(f.segment in mapped for f in placed_frames))


def _check_frame_of_reference(path: str, seg: hd.seg.Segmentation, series: str) -> None:
    """``mask_geometry`` where the SEG's Frame of Reference UID is known and is not the series'
    (``series``; "" where its files name none): its frame positions are then another scan's
    patient coordinates (a series it lists beside the one it was drawn on: a registered scan shown
    with it in the viewer), and placed on this series by position its frames would land wherever
    the two origins put them. As an RTSTRUCT's ROI in another frame of reference refuses its
    structure set."""
    own = str(seg.get("FrameOfReferenceUID", "") or "").strip()
    if own and series and own != series:
        raise AnnotationError("mask_geometry", (
            f"{path}: the SEG lies in frame of reference {uid_digest(own)} (the SEG's FrameOfReferenceUID; UID "
            f"digests), not {uid_digest(series)} (the FrameOfReferenceUID of this series' images), although its "
            "Referenced Series Sequence lists this series: its frames are another scan's patient coordinates, so "
            "painted on this series they would land wherever the two origins put them; remove this series from "
            "the SEG's Referenced Series Sequence (it was drawn on a series of its own frame of reference), or "
            "export it registered to this series"))


def _unreadable(path: str, err: BaseException) -> AnnotationError:
    return AnnotationError("unreadable", (
        f"{path}: not a readable DICOM SEG ({type(err).__name__}: {err}); re-export the segmentation "
        "(a SEG is the Segmentation Storage multi-frame object) or drop the file"))


def _read(path: str, dataset: Dataset | None) -> tuple[hd.seg.Segmentation, dict[int, str]]:
    """The SEG as highdicom reads it, and its segment labels (:func:`segment_labels`); the caller's
    ``dataset`` is copied, never retyped in place."""
    try:
        ds = dataset if dataset is not None else pydicom.dcmread(path)
        sop_class = str(ds.get("SOPClassUID", "") or "")
        if sop_class not in SEG_CLASSES:
            raise AnnotationError("unreadable", (
                f"{path}: SOP Class UID (0008,0016) {sop_class or 'missing'} is not Segmentation Storage "
                f"({', '.join(SEG_CLASSES)}); only a DICOM SEG can be read as segments: link the right file"))
        absent = [f"{name} {tag}" for keyword, name, tag in (
            ("NumberOfFrames", "NumberOfFrames", "(0028,0008)"),
            ("PerFrameFunctionalGroupsSequence", "Per-Frame Functional Groups Sequence", "(5200,9230)"),
            ("PixelData", "Pixel Data", "(7FE0,0010)")) if keyword not in ds]
        if "NumberOfFrames (0028,0008)" in absent or len(absent) > 1:
            raise AnnotationError("annotation_frames", (
                f"{path}: the file holds no {' and no '.join(absent)}, which every SEG has: it is cut short (a copy "
                "that stopped ends before them) or is not a whole SEG; copy it again, or re-export it"))
        n_items = len(ds.get("PerFrameFunctionalGroupsSequence") or [])
        stated = ds.get("NumberOfFrames")
        empty = stated is None or stated == ""
        frames = 1 if empty else int(stated)  # quoted as the file has it: 0 is not 1
        if n_items != frames or frames < 1:
            raise AnnotationError("annotation_frames", (
                f"{path}: NumberOfFrames (0028,0008) is {'empty' if empty else frames} but the Per-Frame Functional "
                f"Groups Sequence (5200,9230) has {n_items} items (a SEG holds one frame or more, each with its "
                "item); the file is inconsistent: re-export it"))
        if "PixelData" not in ds:
            _no_pixel_data(path, frames)
        _check_bits_allocated(path, ds)
        _check_pixel_length(path, ds, frames)
        _check_planes(path, ds)
        _check_segment_numbers(path, ds)
        labels = segment_labels(ds)  # before highdicom decodes them its way (U+FFFD)
        seg = hd.seg.Segmentation.from_dataset(ds, copy=dataset is not None)
        return seg, labels
    except AnnotationError:
        raise
    except _FILE_DEFECTS as err:
        cut = _cut_short(path)
        if cut:  # pydicom's own words ("unpack requires a buffer of 4 bytes") do not say the file ends early
            raise AnnotationError("annotation_frames", (
                f"{path}: {cut}: the file is cut short (a copy that stopped early); copy it again, or re-export "
                "it")) from err
        raise _unreadable(path, err) from err


def _cut_short(path: str) -> str:
    """Where the SEG at ``path`` ends inside its header (:func:`packer.read.dicom_cut.cut_in_header`),
    "" where it does not, or is no DICOM file (no ``DICM`` marker: random bytes walk as anything), or
    cannot be read again: walked only for a file already refused."""
    try:
        with open(path, "rb") as handle:
            handle.seek(128)
            if handle.read(4) != b"DICM":
                return ""
        cut = cut_in_header(path)
    except (OSError, ValueError):
        return ""
    return cut.what if cut is not None else ""


def _no_pixel_data(path: str, frames: int) -> None:
    """``annotation_frames`` for a SEG whose header and per-frame items are there but whose Pixel
    Data is not: the file ends where (7FE0,0010) should start (or a few bytes before or into its
    header: pydicom keeps a partial value and drops a partial element header without a word), as
    a copy cut a little later or earlier does, which is ``annotation_frames`` too."""
    cut = _cut_short(path)
    if cut:
        raise AnnotationError("annotation_frames", (
            f"{path}: {cut}, and it holds no Pixel Data (7FE0,0010): the file is cut short (a copy that stopped "
            "early); copy it again, or re-export it"))
    raise AnnotationError("annotation_frames", (
        f"{path}: the file ends after its header and the {frames} Per-Frame Functional Groups item(s) NumberOfFrames "
        "declares, where its Pixel Data (7FE0,0010) should start: it is cut short (a copy that stopped before its "
        "pixels) or was written without them; copy it again, or re-export it"))


#: The Bits Allocated each Segmentation Type allows (PS3.3 C.8.20.2); and a BINARY SEG of a byte a
#: pixel, as pydicom's ``set_pixel_data(..., bits_stored=1)`` writes it (Bits Allocated 8, Bits Stored
#: 1): its Pixel Data's length says bytes (bit-packed frames would be an eighth of it, refused as short)
_BITS_OF_TYPE = {"BINARY": (1, 8), "FRACTIONAL": (8,), "LABELMAP": (8, 16)}


def _check_bits_allocated(path: str, ds: Dataset) -> None:
    """``annotation_frames`` where Bits Allocated is not one its Segmentation Type allows: a
    FRACTIONAL SEG saying 1 was unpacked as bits (an empty or scrambled mask), a BINARY one saying
    8 read as bytes. A type not in :data:`_BITS_OF_TYPE` is left to highdicom, which refuses it."""
    kind = str(ds.get("SegmentationType", "") or "").strip().upper()
    allowed = _BITS_OF_TYPE.get(kind)
    bits = ds.get("BitsAllocated")
    if allowed is None or bits is None or bits == "" or int(bits) in allowed:
        return
    raise AnnotationError("annotation_frames", (
        f"{path}: Segmentation Type (0062,0001) {kind} with Bits Allocated (0028,0100) {int(bits)}; a {kind} SEG "
        f"stores {' or '.join(str(b) for b in allowed)} bit (PS3.3 C.8.20.2), so its frames cannot be read as "
        "stored (a damaged type or bit depth): re-export it"))


def _check_pixel_length(path: str, ds: Dataset, frames: int) -> None:
    """Native (uncompressed) Pixel Data must hold NumberOfFrames frames: a truncated file or a
    wrong frame count would otherwise decode as a short or shifted frame. Longer Pixel Data is
    padding where the bytes past the frames, beyond the one byte that pads an odd length, are all
    zero (read as the frames they follow, as an image's are), else a wrong Rows, Columns, Bits
    Allocated or frame count, which would read the frames shifted or cut: ``annotation_frames``
    either way."""
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if syntax is not None and pydicom.uid.UID(syntax).is_encapsulated:
        return
    pixel_data = ds.get("PixelData")
    if pixel_data is None:
        _no_pixel_data(path, frames)
    bits = int(ds.Rows) * int(ds.Columns) * int(ds.get("SamplesPerPixel") or 1) * int(ds.BitsAllocated) * frames
    if len(pixel_data) * 8 < bits:
        raise AnnotationError("annotation_frames", (
            f"{path}: Pixel Data (7FE0,0010) holds {len(pixel_data)} bytes but NumberOfFrames {frames} × "
            f"{ds.Rows}×{ds.Columns} at {ds.BitsAllocated} bit needs {(bits + 7) // 8}; the file is truncated "
            "or its frame count is wrong: re-export it"))
    needed = (bits + 7) // 8
    padded = needed + needed % 2  # the byte that pads an odd length is not read (highdicom leaves bits in it)
    if len(pixel_data) > padded and np.frombuffer(pixel_data, dtype=np.uint8, offset=padded).any():
        raise AnnotationError("annotation_frames", (
            f"{path}: Pixel Data (7FE0,0010) holds {len(pixel_data)} bytes but NumberOfFrames {frames} × "
            f"{ds.Rows}×{ds.Columns} at {ds.BitsAllocated} bit needs {needed}, and the {len(pixel_data) - needed} "
            "bytes past them are not all zero (padding is): its Rows, Columns, Bits Allocated or frame count is "
            "wrong, and its frames would be read shifted or cut; re-export it"))


def _map_segments(path: str, seg: hd.seg.Segmentation, segments: StructureMap,
                  names: dict[int, str]) -> tuple[dict[int, tuple[Structure, str]], list[str]]:
    """Segment number → (class, label) for mapped segments, and the labels of unmapped ones
    (``names``: each segment's label, :func:`segment_labels`)."""
    mapped: dict[int, tuple[Structure, str]] = {}
    unmapped: list[str] = []
    labels: list[str] = []
    for number in seg.segment_numbers:
        description = seg.get_segment_description(number)
        label = names.get(number) or f"segment {number}"
        labels.append(label)
        structure = segments.by_name(label)
        if structure is None and description.get("SegmentedPropertyTypeCodeSequence"):
            code = description.segmented_property_type
            structure = segments.by_code(str(code.scheme_designator), str(code.value))
        if structure is None:
            unmapped.append(label)
        else:
            mapped[number] = (structure, label)
    if not mapped:
        raise unmapped_error(path, "segments", "segments", labels, segments)
    return mapped, unmapped


def segment_labels(ds: Dataset) -> dict[int, str]:
    """Segment number → SegmentLabel, read from the SegmentSequence items as :func:`item_text`
    reads them: bytes the file's character set cannot decode kept as ``\\xNN`` (pydicom, and
    highdicom after it, would write U+FFFD, so PTV<A0> and PTV<B0> became one label)."""
    out: dict[int, str] = {}
    for item in ds.get("SegmentSequence") or ():
        number = item.get("SegmentNumber")
        if number is not None:
            out[int(number)] = item_text(item, "SegmentLabel")
    return out


def _check_segment_numbers(path: str, ds: Dataset) -> None:
    """``unreadable`` where two Segment Sequence items share a Segment Number (unique, PS3.3
    C.8.20.4): frames name their segment by number, so whose frames they are cannot be told
    (highdicom keeps the last item's description, and its label and code would class them all)."""
    first: dict[int, tuple[int, str]] = {}
    for k, item in enumerate(ds.get("SegmentSequence") or (), start=1):
        number = item.get("SegmentNumber")
        if number is None:
            continue
        label = item_text(item, "SegmentLabel")
        if int(number) in first:
            at, other = first[int(number)]
            raise AnnotationError("unreadable", (
                f"{path}: Segment Sequence (0062,0002) items {at} and {k} both have Segment Number (0062,0004) "
                f"{int(number)} ({other!r} and {label!r}); segment numbers are unique (PS3.3 C.8.20.4), so which "
                "segment the frames of that number hold cannot be told: re-export the SEG"))
        first[int(number)] = (k, label)


def _fractional_scale(path: str, seg: hd.seg.Segmentation) -> float:
    maximum = int(seg.get("MaximumFractionalValue") or 0)
    if maximum <= 0:
        raise AnnotationError("mask_values", (
            f"{path}: a FRACTIONAL SEG needs a positive MaximumFractionalValue (0062,000E), found {maximum}; "
            "re-export it"))
    return float(maximum)


def _item(ds: Dataset | None, keyword: str) -> Dataset | None:
    value = ds.get(keyword) if ds is not None else None
    return value[0] if value else None


def _frame_value(item: Dataset, shared: Dataset | None, group: str, keyword: str) -> object:
    for where in (item, shared):
        found = _item(where, group)
        if found is not None and keyword in found:
            return found.get(keyword)
    return None


def _frame_places(path: str, seg: hd.seg.Segmentation, kind: str, declared: Sequence[int]) -> list[_Frame]:
    """Each frame's segment, sources and plane, from the functional groups highdicom typed;
    ``annotation_frames`` where a frame holds a segment number ``declared`` (the Segment
    Sequence's) lacks: a damaged number, whose frame no class could take, and dropped it would
    leave its slice packed with part of its mask."""
    shared = _item(seg, "SharedFunctionalGroupsSequence")
    out = []
    for index, item in enumerate(seg.PerFrameFunctionalGroupsSequence):
        segment = 0
        if kind != "LABELMAP":
            ident = _item(item, "SegmentIdentificationSequence") or _item(shared, "SegmentIdentificationSequence")
            if ident is None or "ReferencedSegmentNumber" not in ident:
                raise AnnotationError("annotation_frames", (
                    f"{path}: frame {index + 1} has no Segment Identification Sequence (0062,000A) → "
                    "Referenced Segment Number: which segment it holds is unknown; re-export the SEG"))
            segment = int(ident.ReferencedSegmentNumber)
            if segment not in declared:
                raise AnnotationError("annotation_frames", (
                    f"{path}: frame {index + 1} has Referenced Segment Number (0062,000B) {segment}, which the "
                    f"Segment Sequence (0062,0002) does not declare (it declares segments {list(declared)}): which "
                    "segment the frame holds cannot be told, and without it its slice would be packed with part "
                    "of its mask; re-export the SEG"))
        sources: list[tuple[str, int]] = []
        for derivation in item.get("DerivationImageSequence") or []:
            for source in derivation.get("SourceImageSequence") or []:
                uid = str(source.get("ReferencedSOPInstanceUID", "") or "").strip()
                numbers = source.get("ReferencedFrameNumber")
                if numbers is None or numbers == "":
                    sources.append((uid, ANY_FRAME))
                else:
                    many = numbers if isinstance(numbers, (list, pydicom.multival.MultiValue)) else [numbers]
                    sources.extend((uid, int(n) - 1) for n in many)
        position = _frame_value(item, shared, "PlanePositionSequence", "ImagePositionPatient")
        orientation = _frame_value(item, shared, "PlaneOrientationSequence", "ImageOrientationPatient")
        spacing = _frame_value(item, shared, "PixelMeasuresSequence", "PixelSpacing")
        if orientation is None or spacing is None:
            raise AnnotationError("annotation_frames", (
                f"{path}: frame {index + 1} lacks Plane Orientation (0020,9116) or Pixel Measures (0028,9110) → "
                "Pixel Spacing, shared or per frame; without them it cannot be placed: re-export the SEG"))
        between, thickness = (_positive(_frame_value(item, shared, "PixelMeasuresSequence", keyword))
                              for keyword in ("SpacingBetweenSlices", "SliceThickness"))
        row_col = _plane_values(path, index, "PixelSpacing", spacing, 2)
        out.append(_Frame(
            index=index, segment=segment, sources=tuple(sources),
            position=_plane_values(path, index, "ImagePositionPatient", position, 3) if position is not None else None,
            orientation=_plane_values(path, index, "ImageOrientationPatient", orientation, 6),
            spacing=(float(row_col[0]), float(row_col[1])), between=between, thickness=thickness))
    return out


def _check_planes(path: str, ds: Dataset) -> None:
    """Each frame's Image Position and Orientation (Patient), per frame or shared, where it has
    them, as :func:`_plane_values` reads them (``annotation_frames`` naming the frame), before
    highdicom builds its frame table: a NaN there fails that table's NOT NULL constraint, an
    sqlite IntegrityError that names neither the frame nor the attribute."""
    shared = _item(ds, "SharedFunctionalGroupsSequence")
    for index, item in enumerate(ds.get("PerFrameFunctionalGroupsSequence") or ()):
        for group, keyword, count in (("PlanePositionSequence", "ImagePositionPatient", 3),
                                      ("PlaneOrientationSequence", "ImageOrientationPatient", 6)):
            value = _frame_value(item, shared, group, keyword)
            if value is not None:
                _plane_values(path, index, keyword, value, count)


def _one_plane(frames: Sequence[_Frame]) -> bool:
    """Whether all of a SEG's frames lie on one plane (one frame, or one frame a segment on one
    slice): a SpacingBetweenSlices then spaces no frames (highdicom writes 1.0 for a one-frame
    SEG), so it says nothing about how the SEG samples the normal and is not its grid; its frame
    is placed as any other, on the slice it references or lies on. Planes compare by position
    along their normal (to 1e-3 mm), else, for frames without a position, by their sources."""
    planes: set[object] = set()
    for frame in frames:
        if frame.position is None:
            planes.add(frame.sources)
        else:
            normal = np.cross(frame.orientation[:3], frame.orientation[3:6])
            planes.add(round(float(np.dot(frame.position, normal)), 3))
        if len(planes) > 1:
            return False
    return True


def _plane_values(path: str, index: int, keyword: str, value: object, count: int) -> np.ndarray:
    """``count`` finite numbers of a frame's plane attribute (a position of three, an orientation
    of six, a positive spacing of two), else ``annotation_frames``: numpy would otherwise meet a
    frame of four coordinates only when placing it (ValueError from ``dot``), and a zero spacing
    when resampling it (a division by zero)."""
    many = value if isinstance(value, (list, tuple, pydicom.multival.MultiValue)) else [value]
    try:
        numbers = np.asarray([float(v) for v in many], dtype=np.float64)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        numbers = np.asarray([np.nan])  # not a number: refused below, quoting it
    positive = keyword != "PixelSpacing" or bool((numbers > 0).all())
    if numbers.shape != (count,) or not np.isfinite(numbers).all() or not positive:
        what = f"{count} finite{' positive' if keyword == 'PixelSpacing' else ''} numbers"
        raise AnnotationError("annotation_frames", (
            f"{path}: frame {index + 1} has {keyword} {list(many)!r}, not {what}; it cannot be "
            "placed: re-export the SEG"))
    return numbers


def _positive(value: object) -> float | None:
    """A positive decimal string or number, else None."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


class _Series:
    """The referenced series' slices: where each lies along the normal, and frame placement."""

    def __init__(self, slices: Sequence[SlicePlace]) -> None:
        self.slices = slices
        self.normal = slices[0].normal() if slices else np.array([0.0, 0.0, 1.0])
        self.depth = np.asarray([np.dot(s.position, self.normal) for s in slices], dtype=np.float64)
        gaps = np.abs(np.diff(self.depth))
        self.spacing = float(np.median(gaps)) if gaps.size else 0.0
        self.by_source = {(s.sop_uid, s.frame): i for i, s in enumerate(slices)}
        self.frames_of: dict[str, int] = {}  # how many slices each SOP instance holds
        for s in slices:
            self.frames_of[s.sop_uid] = self.frames_of.get(s.sop_uid, 0) + 1

    def named(self, frame: _Frame) -> set[int]:
        """The slices ``frame``'s source references name: a reference without Referenced Frame
        Number names a single-frame instance's slice, and no one slice of a multi-frame instance
        (it applies to all its frames: the frame is placed by its position)."""
        out = set()
        for uid, number in frame.sources:
            key = (uid, 0 if number == ANY_FRAME else number)
            if key in self.by_source and (number != ANY_FRAME or self.frames_of.get(uid) == 1):
                out.add(self.by_source[key])
        return out

    def half(self, fallback: float | None) -> float:
        """Half the slice spacing (a one-slice series: half the SEG's, else 1e-3 mm)."""
        spacing = self.spacing or fallback or 2e-3
        return 0.5 * spacing

    def place(self, frame: _Frame, rows: int, columns: int) -> tuple[int | None, str]:
        """(slice index, status): ``copy`` (same grid), ``grid`` (another grid), ``outside``
        (on no slice), ``ambiguous`` (on two), ``contradicts`` (its reference and position disagree)."""
        half = self.half(frame.between or frame.thickness)
        named = self.named(frame)
        if len(named) == 1:
            index = named.pop()
            if frame.position is not None and abs(float(np.dot(frame.position, self.normal)) - self.depth[index]) > (
                    half * (1 + 1e-6)):
                return index, "contradicts" if self._same_plane_grid(frame, index, rows, columns) else "grid"
        elif frame.position is None:
            return None, "ambiguous" if named else "outside"
        else:
            near = np.flatnonzero(np.abs(self.depth - float(np.dot(frame.position, self.normal))) <= half * (1 + 1e-6))
            if near.size == 0:
                return None, "outside" if self._same_plane_grid(frame, 0, rows, columns) else "grid"
            if near.size > 1:
                same = self._same_plane_grid(frame, int(near[0]), rows, columns)
                return int(near[0]), "ambiguous" if same else "grid"
            index = int(near[0])
        return index, "copy" if self._same_grid(frame, index, rows, columns) else "grid"

    def _same_plane_grid(self, frame: _Frame, index: int, rows: int, columns: int) -> bool:
        """Rows, columns, orientation, pixel spacing and (where the SEG says it) slice spacing
        equal (position along the normal aside)."""
        if not self.slices:
            return False
        place = self.slices[index]
        turned = float(np.max(np.abs(frame.orientation - np.asarray(place.orientation, dtype=np.float64))))
        pairs = zip(frame.spacing, place.spacing, strict=True)
        return ((rows, columns) == (place.rows, place.columns) and turned <= ORIENTATION_TOL
                and all(abs(a - b) <= SPACING_RTOL * max(abs(a), abs(b)) for a, b in pairs)
                and self._same_slice_spacing(frame))

    def _same_slice_spacing(self, frame: _Frame) -> bool:
        """False where the frame's SpacingBetweenSlices and the series' spacing (median gap) are
        both known and differ by more than :data:`SLICE_SPACING_RTOL`: the SEG samples the
        normal otherwise than the series, so placing its frames by position alone would paint
        only the slices that happen to coincide with one (or stack several frames on one)."""
        if not frame.between or not self.spacing:
            return True
        return abs(frame.between - self.spacing) <= SLICE_SPACING_RTOL * self.spacing

    def _same_grid(self, frame: _Frame, index: int, rows: int, columns: int) -> bool:
        if not self._same_plane_grid(frame, index, rows, columns):
            return False
        if frame.position is None:
            return True  # placed by reference alone: its grid is its source's
        place = self.slices[index]
        offset = frame.position - np.asarray(place.position, dtype=np.float64)
        x = np.asarray(place.orientation[:3], dtype=np.float64)
        y = np.asarray(place.orientation[3:6], dtype=np.float64)
        return abs(float(offset @ x)) < IN_PLANE_TOL_MM and abs(float(offset @ y)) < IN_PLANE_TOL_MM


def _describe_frame(frame: _Frame, rows: int, columns: int) -> str:
    where = "no position" if frame.position is None else "IPP " + _fmt(frame.position)
    between = f", SpacingBetweenSlices {frame.between:g} mm" if frame.between else ""
    return (f"{rows}×{columns} at {frame.spacing[0]:g}×{frame.spacing[1]:g} mm, IOP {_fmt(frame.orientation)}, "
            f"{where}{between}")


def _describe_slice(place: SlicePlace, spacing: float) -> str:
    every = f", slices every {spacing:.4g} mm" if spacing else ""
    return (f"{place.rows}×{place.columns} at {place.spacing[0]:g}×{place.spacing[1]:g} mm, "
            f"IOP {_fmt(place.orientation)}, IPP {_fmt(place.position)}{every}")


def _fmt(values: Sequence[float] | np.ndarray) -> str:
    return "(" + ", ".join(f"{float(v):.4g}" for v in values) + ")"


def _placement_error(path: str, off: tuple[_Frame, int | None, str], geometry: _Series,
                     seg: hd.seg.Segmentation, label: str) -> AnnotationError:
    """The error of the first frame that is not copied under ``grid: require``."""
    frame, index, status = off
    rows, columns = int(seg.Rows), int(seg.Columns)
    head = f"{path}: segment {label!r}, frame {frame.index + 1}"
    if status == "grid":
        target = geometry.slices[index] if index is not None else (geometry.slices[0] if geometry.slices else None)
        other = _describe_slice(target, geometry.spacing) if target is not None else "no slice"
        every = _every_nth(frame, index, geometry, rows, columns)
        if every is not None:
            return AnnotationError("mask_geometry", (
                f"{head} lies on slice {index} of the series, on its in-plane grid, but is spaced otherwise "
                f"({_describe_frame(frame, rows, columns)}; the series' slice: {other}): the SEG's spacing is "
                f"{every} times the series' slice step, its frames on every {_ordinal(every)} slice. The file "
                "does not say which it is: drawn on those "
                "slices alone (the slices between were never annotated) or a segmentation of "
                f"{frame.between:g} mm slabs (highdicom writes the source's SliceThickness either way). Set "
                "mask.grid: resample to paint every slice from its nearest frame (the slab reading: it paints "
                "slices no one drew if they were skipped), or re-export the SEG with a frame for every slice "
                "(empty where nothing was drawn), which packs as drawn"))
        return AnnotationError("mask_geometry", (
            f"{head} lies on another grid ({_describe_frame(frame, rows, columns)}) than the series' slice "
            f"({other}); set mask.grid: resample to resample it by nearest neighbour onto the series"))
    at = float(np.dot(frame.position, geometry.normal)) if frame.position is not None else None
    depth = "" if at is None else f" at {at:.4g} mm along the normal"
    span = (f"slices span {geometry.depth.min():.4g}..{geometry.depth.max():.4g} mm, median spacing "
            f"{geometry.spacing:.4g} mm" if geometry.slices else "the series has no slices")
    what = {"outside": "lies on no slice of the series", "ambiguous": "lies midway between two slices",
            "contradicts": f"references slice {index} but lies more than half a spacing from it"}[status]
    fix = ("the SEG was made on other slices than this series: link it to its own series, or set mask.grid: "
           "resample to resample it")
    present = {place.sop_uid for place in geometry.slices}
    missing = [uid for uid, _ in frame.sources if uid not in present]
    inside = at is not None and geometry.slices and geometry.depth.min() < at < geometry.depth.max()
    if status == "outside" and (missing or inside):  # drawn on a slice the export lacks, not on another series
        what += (f", and it derives from image {uid_digest(missing[0])} (UID digest), which the series lacks"
                 if missing else ", within its span: where a slice is missing")
        fix = ("a slice of the series is missing from the export (restore that file), or the SEG was made on "
               "other slices: link it to its own series, or set mask.grid: resample to resample it")
    return AnnotationError("annotation_frames", f"{head}{depth} {what} ({span}); {fix}")


def _every_nth(frame: _Frame, index: int | None, geometry: _Series, rows: int, columns: int) -> int | None:
    """N (2 or more) where ``frame`` lies on slice ``index`` (which it references, or where it lies)
    on the series' own in-plane grid and only the SEG's SpacingBetweenSlices, N times the series'
    step, sets it apart: a SEG on every N-th slice of the series. Else None."""
    if index is None or frame.position is None or not frame.between or not geometry.spacing:
        return None
    if abs(float(np.dot(frame.position, geometry.normal)) - geometry.depth[index]) > 1e-3:
        return None
    ratio = frame.between / geometry.spacing
    every = round(ratio)
    if every < 2 or abs(ratio - every) > SLICE_SPACING_RTOL * every:
        return None
    return every if geometry._same_grid(replace(frame, between=None), index, rows, columns) else None


def _ordinal(n: int) -> str:
    return {2: "other", 3: "third"}.get(n, f"{n}th")


class _Pixels:
    """One segment's frames as boolean masks, decoded a frame at a time by highdicom."""

    def __init__(self, path: str, seg: hd.seg.Segmentation, kind: str, number: int, scale: float | None,
                 threshold: float) -> None:
        self.path, self.seg, self.kind, self.number = path, seg, kind, number
        self.scale, self.threshold = scale, threshold

    def mask(self, frame: _Frame) -> np.ndarray:
        """Frame ``frame`` as a rows×columns bool mask of this segment."""
        try:
            stored = self.seg.get_stored_frame(frame.index, as_index=True)
        except _FILE_DEFECTS as err:
            raise _unreadable(self.path, err) from err
        if stored.ndim != 2:
            raise AnnotationError("unreadable", (
                f"{self.path}: frame {frame.index + 1} decodes to shape {stored.shape}, not rows×columns; "
                "a SEG is single-sample grayscale: re-export it"))
        if self.kind == "LABELMAP":
            return np.asarray(stored == self.number)
        if self.scale is None:
            return np.asarray(stored != 0)
        top = int(stored.max()) if stored.size else 0
        if top > self.scale:
            raise AnnotationError("mask_values", (
                f"{self.path}: frame {frame.index + 1} stores the fractional value {top}, above "
                f"MaximumFractionalValue (0062,000E) {self.scale:g}; a FRACTIONAL SEG stores 0..max: re-export it"))
        return np.asarray(stored.astype(np.float64) / self.scale >= self.threshold)


def _seg_spacing(frames: Sequence[_Frame], geometry: _Series) -> float:
    """The SEG's own slice spacing: SpacingBetweenSlices of its pixel measures, else the
    smallest gap between its frame planes (gaps from omitted empty frames only widen the others),
    else its SliceThickness, else the series' spacing."""
    for frame in frames:
        if frame.between:
            return frame.between
    if frames and frames[0].position is not None:
        normal = np.cross(frames[0].orientation[:3], frames[0].orientation[3:6])
        depths = np.unique(np.round([float(np.dot(f.position, normal)) for f in frames if f.position is not None], 3))
        gaps = np.diff(depths)
        if gaps.size:
            return float(gaps.min())
    for frame in frames:
        if frame.thickness:
            return frame.thickness
    return geometry.spacing


def _resample(path: str, frames: Sequence[_Frame], pixels: _Pixels, slices: Sequence[SlicePlace],
              geometry: _Series, between: float, structure: Structure, painter: Painter, label: str) -> int:
    """Paint one segment resampled by nearest neighbour onto every slice; returns how many of
    its frames no slice pixel took (beyond the series)."""
    if any(f.position is None for f in frames):
        raise AnnotationError("mask_geometry", (
            f"{path}: segment {label!r} has frames without Plane Position (0020,9113) on another grid than "
            "the series; without positions they cannot be resampled: re-export the SEG with positions"))
    first = frames[0].orientation
    if any(np.max(np.abs(f.orientation - first)) > ORIENTATION_TOL for f in frames):
        raise AnnotationError("mask_geometry", (
            f"{path}: segment {label!r} has frames in differing orientations; nearest-neighbour resampling "
            "needs one stack of parallel planes: re-export the SEG"))
    normal = np.cross(first[:3], first[3:6])
    normal = normal / (np.linalg.norm(normal) or 1.0)
    depth = np.asarray([float(np.dot(f.position, normal)) for f in frames])  # type: ignore[arg-type]
    order = np.argsort(depth, kind="stable")
    planes, plane_of = _planes(depth[order])
    members: list[list[_Frame]] = [[] for _ in planes]
    for rank, k in enumerate(order):
        members[plane_of[rank]].append(frames[k])
    half = 0.5 * between if between > 0 else geometry.half(None)
    rows, columns = int(pixels.seg.Rows), int(pixels.seg.Columns)
    cache: dict[int, np.ndarray] = {}
    used: set[int] = set()
    for index, place in enumerate(slices):
        centres = _pixel_centres(place)  # H×W×3 mm
        z = centres @ normal
        nearest = _nearest_plane(planes, z)
        ok = np.abs(z - planes[nearest]) <= half * (1 + 1e-6)
        if not ok.any():
            continue
        out = np.zeros((place.rows, place.columns), dtype=bool)
        for plane in np.unique(nearest[ok]):
            chosen = ok & (nearest == plane)
            points = centres[chosen]
            for frame in members[int(plane)]:
                assert frame.position is not None
                offset = points - frame.position
                col = np.floor(offset @ frame.orientation[:3] / frame.spacing[1] + 0.5).astype(np.int64)
                row = np.floor(offset @ frame.orientation[3:6] / frame.spacing[0] + 0.5).astype(np.int64)
                inside = (row >= 0) & (row < rows) & (col >= 0) & (col < columns)
                if not inside.any():
                    continue
                used.add(frame.index)
                if frame.index not in cache:
                    cache[frame.index] = pixels.mask(frame)
                hit = np.zeros(points.shape[0], dtype=bool)
                hit[inside] = cache[frame.index][row[inside], col[inside]]
                out[chosen] |= hit
        painter.paint(structure, index, out, source=label)
    return sum(1 for f in frames if f.index not in used)


def _planes(sorted_depth: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Distinct plane depths (frames within 1e-3 mm share one) and each sorted frame's plane."""
    planes: list[float] = []
    plane_of: list[int] = []
    for value in sorted_depth:
        if not planes or value - planes[-1] > IN_PLANE_TOL_MM:
            planes.append(float(value))
        plane_of.append(len(planes) - 1)
    return np.asarray(planes), plane_of


def _nearest_plane(planes: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Index of the plane nearest each depth in ``z`` (a tie takes the lower plane)."""
    right = np.clip(np.searchsorted(planes, z), 0, len(planes) - 1)
    left = np.clip(right - 1, 0, len(planes) - 1)
    return np.where(np.abs(z - planes[left]) <= np.abs(z - planes[right]), left, right)


def _pixel_centres(place: SlicePlace) -> np.ndarray:
    """rows×columns×3 patient coordinates (mm) of the slice's pixel centres."""
    x = np.asarray(place.orientation[:3], dtype=np.float64)
    y = np.asarray(place.orientation[3:6], dtype=np.float64)
    r = np.arange(place.rows, dtype=np.float64)[:, None, None] * place.spacing[0] * y
    c = np.arange(place.columns, dtype=np.float64)[None, :, None] * place.spacing[1] * x
    return np.asarray(place.position, dtype=np.float64) + r + c
