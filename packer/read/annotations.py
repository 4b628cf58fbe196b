"""DICOM annotations (SEG, RTSTRUCT) as masks: what they reference, how their structures map to classes, how they paint.

An annotation object is never a sample: it is the mask of the series it references. This
module holds what the SEG reader (:mod:`packer.read.seg`) and the RTSTRUCT rasteriser
(:mod:`packer.read.rtstruct`) share, and what series assembly links them by:

- :class:`AnnotationRefs`: what an annotation's header says it references (series, instances,
  frame of reference), read with the header probe, before any pixel is decoded
  (:func:`annotation_refs`);
- :class:`SlicePlace`: one slice of the referenced series on its native pixel grid, in the
  series' order along the slice normal: what the readers paint onto;
- :class:`~packer.structures.StructureMap` (:mod:`packer.structures`): the job's
  ``mask.segments`` or ``mask.rois``, class name → id with aliases and, for SEG, codes;
- :class:`Painter`: one D×H×W label map, painted a structure and a slice at a time under the
  job's overlap policy (``later_wins``: a class declared later in the map wins a voxel;
  ``refuse``: a voxel claimed by two classes is ``mask_overlap``);
- :class:`AnnotationError`: an annotation's defect, with its reason code.

Structure names are free text typed by people and may hold names of people: they reach the
bad-sample report (a local file, beside the raw paths it already names) so a user can fix the
map, and never the shards or the manifest unless ``phi: keep``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydicom.datadict import tag_for_keyword
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.tag import Tag

from packer.read.dicom_attrs import ELEMENT_ERRORS, DamagedElement, element, item_text, sop_class_name
from packer.structures import Structure, StructureMap

#: Modality of each annotation object packer reads as masks.
ANNOTATION_MODALITIES = ("SEG", "RTSTRUCT")
SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.4"
RTSTRUCT_STORAGE = "1.2.840.10008.5.1.4.1.1.481.3"
LABEL_MAP_SEG_STORAGE = "1.2.840.10008.5.1.4.1.1.66.7"
ANNOTATION_CLASSES = {SEG_STORAGE: "SEG", LABEL_MAP_SEG_STORAGE: "SEG", RTSTRUCT_STORAGE: "RTSTRUCT"}
_WHOLE_UID = re.compile(r"[0-9]+(?:\.[0-9]+)*")


class AnnotationError(Exception):
    """An annotation object that cannot become a mask: ``reason`` (a bad-sample reason code:
    ``annotation_frames``, ``annotation_unmapped``, ``mask_overlap``, ``mask_geometry``,
    ``mask_values``, ``contour_off_slice``, ``unreadable``) and a ``message`` naming the object,
    what is wrong and the fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def unmapped_error(path: str, what: str, key: str, found: Sequence[str], structures: StructureMap) -> AnnotationError:
    """The ``annotation_unmapped`` error of an object none of whose structures (``found``; ``what``:
    ``segments``, ``ROIs``) the map (``mask.<key>``) names, with the closest names."""
    close = structures.suggestions(found)
    hint = f"closest: {close}; " if close else ""
    return AnnotationError("annotation_unmapped", (
        f"{path}: none of its {len(found)} {what} ({', '.join(repr(n) for n in found[:12])}"
        f"{', ...' if len(found) > 12 else ''}) is named by mask.{key} ({', '.join(structures.names())}); "
        f"{hint}add the names as aliases (names compare without case, spaces or punctuation)"))


@dataclass(frozen=True)
class SlicePlace:
    """One slice of a series on its native grid: the SOP Instance UID of its file, its ``frame``
    in that file (0-based; 0 for a single-frame file), Image Position (Patient) of its first
    pixel's centre (mm, LPS), Image Orientation (Patient) (row direction X, then column direction
    Y: six cosines), Pixel Spacing (between rows, between columns; mm) and its rows × columns."""

    sop_uid: str
    frame: int
    position: tuple[float, float, float]
    orientation: tuple[float, ...]
    spacing: tuple[float, float]
    rows: int
    columns: int

    def affine(self) -> np.ndarray:
        """4×4 map from (row, column, 0, 1) pixel indices to patient mm: pixel (r, c) has its
        centre at ``position + c·Δcol·X + r·Δrow·Y``."""
        x = np.asarray(self.orientation[:3], dtype=np.float64)
        y = np.asarray(self.orientation[3:6], dtype=np.float64)
        out = np.eye(4)
        out[:3, 0] = y * self.spacing[0]
        out[:3, 1] = x * self.spacing[1]
        out[:3, 2] = np.cross(x, y)
        out[:3, 3] = self.position
        return out

    def normal(self) -> np.ndarray:
        """The unit slice normal X × Y."""
        n = np.cross(np.asarray(self.orientation[:3], dtype=np.float64), np.asarray(self.orientation[3:6],
                                                                                   dtype=np.float64))
        length = float(np.linalg.norm(n))
        return n / length if length > 0 else n


@dataclass
class Painter:
    """A D×H×W label map (D: the series' slices in order), painted one structure's boolean mask of
    one slice at a time. A voxel claimed by two classes follows ``overlap``: ``later_wins`` (the
    class declared later in ``structures`` keeps it, whatever order they are painted in) or
    ``refuse`` (:class:`AnnotationError` ``mask_overlap``). Painting a class over itself (two ROIs
    mapped to one class: ``Lung_L`` and ``Lung_R`` → lung) is their union, not an overlap."""

    shape: tuple[int, int, int]
    structures: StructureMap
    overlap: str = "later_wins"
    dtype: str = "uint8"
    path: str = ""
    labels: np.ndarray = field(init=False)
    #: 1 + the rank of each class id (0: the background): a voxel's rank is its label's, so the
    #: painter keeps no second D×H×W array of ranks
    _ranks: np.ndarray = field(init=False, repr=False)
    _top: int = field(default=0, init=False, repr=False)  # the highest rank (1-based) painted so far
    #: class id → the source structure names painted into it (raw: PHI unless mapped out)
    painted: dict[int, set[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.labels = np.zeros(self.shape, dtype=self.dtype)
        ids = [s.id for s in self.structures.structures]
        self._ranks = np.zeros(max(ids, default=0) + 1, dtype=np.uint16 if len(ids) < 65535 else np.uint32)
        for structure in self.structures.structures:
            self._ranks[structure.id] = self.structures.rank(structure) + 1

    def record(self, structure: Structure, source: str) -> None:
        """Name ``source`` among the structures painted into ``structure``'s class (what
        :meth:`paint` does first, even for an empty mask)."""
        self.painted.setdefault(structure.id, set()).add(source)

    def paint(self, structure: Structure, index: int, mask: np.ndarray, source: str,
              origin: tuple[int, int] = (0, 0)) -> None:
        """Paint ``structure`` where the boolean ``mask`` holds: an H×W mask on slice ``index``
        (the whole slice, or a window of it whose top-left pixel is ``origin``), or a D×H×W
        mask on slices ``index`` to ``index + D − 1`` (the same window on each). ``source``: the
        structure's name in the object (for the report and the overlap message). An overlap
        refused is named by its first pixel in slice, row, column order, as painting the slices
        one by one would find it; nothing of ``mask`` is painted then (the caller drops the map)."""
        stack = mask if mask.ndim == 3 else mask[None]
        top, left = origin
        if (index < 0 or top < 0 or left < 0 or index + stack.shape[0] > self.shape[0]
                or top + stack.shape[1] > self.shape[1] or left + stack.shape[2] > self.shape[2]):
            raise ValueError(f"a {mask.shape} mask at slice {index}, {origin} painted on a {self.shape} label map")
        self.record(structure, source)
        planes = np.flatnonzero(stack.any(axis=(1, 2)))
        if planes.size == 0:
            return
        # the planes OR-ed: one pass, where any(axis=(0, 2)) and any(axis=(0, 1)) were two
        flat: np.ndarray = np.logical_or.reduce(stack, axis=0)
        rows = np.flatnonzero(flat.any(axis=1))
        cols = np.flatnonzero(flat.any(axis=0))
        stack = stack[int(planes[0]):int(planes[-1]) + 1, int(rows[0]):int(rows[-1]) + 1,
                      int(cols[0]):int(cols[-1]) + 1]
        z0, r0, c0 = index + int(planes[0]), top + int(rows[0]), left + int(cols[0])
        # only the structure's bounding box
        box = (slice(z0, z0 + stack.shape[0]), slice(r0, r0 + stack.shape[1]), slice(c0, c0 + stack.shape[2]))
        rank = self.structures.rank(structure) + 1
        labels = self.labels[box]
        # the voxel-by-voxel test only where it can find something: a class painted before (later_wins:
        # one that outranks this one), then a voxel of it in the box
        if self.overlap == "refuse" and self._top > 0:
            self._refuse_overlap(structure, stack, labels, source, (z0, r0, c0))
        elif self.overlap == "later_wins" and self._top > rank:
            stack = stack & (self._ranks[labels] <= rank)  # a voxel of a class that outranks it stays that class
        labels[stack] = structure.id
        self._top = max(self._top, rank)

    def _refuse_overlap(self, structure: Structure, stack: np.ndarray, labels: np.ndarray, source: str,
                        corner: tuple[int, int, int]) -> None:
        """``mask_overlap`` where ``stack`` (its box's first voxel at ``corner``) meets a voxel of
        another class already painted (``labels``: the map in that box)."""
        held = self._ranks[labels]
        other = stack & (held != 0) & (labels != structure.id)
        if other.any():
            z0, r0, c0 = corner
            at = np.argwhere(other)[0]
            owner = self.structures.structures[int(held[tuple(at)]) - 1]  # ranks index the declared list
            raise AnnotationError("mask_overlap", (
                f"{self.path}: {source!r} ({structure.name}) overlaps {owner.name} on slice {z0 + int(at[0])} "
                f"of {self.shape[0]} (counted from 0 in the series' order along its slice normal, not by "
                f"Instance Number) at row {r0 + int(at[1])}, column {c0 + int(at[2])} "
                f"({int(other[at[0]].sum())} pixels on that slice); a multi-class mask holds one class a pixel: "
                "set mask.overlap: later_wins (the class declared later in the map wins) or fix the structures"))


@dataclass(frozen=True)
class Drawn:
    """What painting one annotation object did besides the mask: the structure names the map
    does not name (ignored, in file order), and ``notes`` on what was skipped or distrusted
    (degenerate or self-intersecting contours, references that disagree with position, a
    segment without frames), one line per structure and kind."""

    unmapped: tuple[str, ...]
    notes: tuple[str, ...]
    #: the object's SOP class by name (``Segmentation Storage``, ``Label Map Segmentation Storage``,
    #: ``RT Structure Set Storage``), as the excluded records count it
    sop_class: str = ""
    #: whether everything it holds of the mapped structures belongs to the series' other stacks
    #: (its other acquisitions, stacked apart): drawn there, not on this stack, which it paints
    #: nothing of (an empty stack then lacks its annotation, not a mapped structure)
    elsewhere: bool = False


@dataclass(frozen=True)
class Declared:
    """The structures an annotation's header declares, in file order: each SEG segment's label
    (``segment N`` where it has none) with its Segmented Property Type code (scheme, value; None
    where it has none), or each RTSTRUCT ROI's name (no codes). What ``validate --quick`` matches
    against the job's map, since it paints nothing."""

    names: tuple[str, ...]
    codes: tuple[tuple[str, str] | None, ...] = ()

    def maps(self, structures: StructureMap) -> bool:
        """Whether ``structures`` names any of them, as painting matches them (a SEG segment by
        label, else by code; an ROI by name)."""
        codes = self.codes or (None,) * len(self.names)
        return any(structures.by_name(name) is not None or (code is not None and structures.by_code(*code) is not None)
                   for name, code in zip(self.names, codes, strict=True))


@dataclass(frozen=True)
class AnnotationRefs:
    """What an annotation object's header says it references: its ``modality`` (``SEG``,
    ``RTSTRUCT``), the Series Instance UIDs and SOP Instance UIDs of the images it was made on,
    and the Frame of Reference UIDs it lies in (its own, and for RTSTRUCT the referenced ones).
    ``structures``: how many segments or ROIs it holds."""

    modality: str
    study_uid: str
    series_uids: tuple[str, ...]
    instance_uids: tuple[str, ...]
    frames_of_reference: tuple[str, ...]
    structures: int = 0
    #: Why the header's references cannot be read ("" where they can): a damaged or cut sequence.
    #: Linking makes the object an ``unreadable`` bad sample and may tie it to its series (they
    #: are then not packed with all-zero masks: :func:`packer.read.dicom_masks.link`)
    damaged: str = ""
    #: The damaged file's own reason code (``unreadable``; ``not_dicom`` for a file without its
    #: ``DICM`` marker that still shows an annotation's class: :mod:`packer.read.annotation_salvage`)
    damaged_reason: str = "unreadable"
    #: The structures it declares (None where its header was not read whole: a damaged or
    #: salvaged object)
    declared: Declared | None = None
    #: Its SOP class as a used annotation's ``excluded.jsonl`` record names it (as its painter
    #: does: a SEG's own (0008,0016), RT Structure Set Storage for an RTSTRUCT); "" where not read
    sop_class: str = ""


def uid_digest(uid: str) -> str:
    """A short digest naming a UID in messages (a UID identifies a study; its digest does not)."""
    return hashlib.sha256(uid.encode()).hexdigest()[:12]


def _items(ds: Dataset | None, keyword: str) -> list[Dataset]:
    if ds is None:
        return []
    value = element(ds, keyword)
    return list(value) if value is not None else []


def _uid(ds: Dataset, keyword: str) -> str:
    """The UID ``keyword`` of ``ds`` ("" where absent); raises
    :class:`~packer.read.dicom_attrs.DamagedElement` when it cannot be decoded (a nested element
    of a wrong length or VR is decoded only here, on access)."""
    return str(element(ds, keyword, "") or "").strip()


def _frame_uid(ds: Dataset, keyword: str) -> str:
    """The Frame of Reference UID ``keyword`` of ``ds`` ("" where absent), as :func:`_uid`; raises
    :class:`~packer.read.dicom_attrs.DamagedElement` when its value is not one UID of digits and
    dots: a damaged element (a VR byte flipped, ``UI`` read as ``<I``, or a wrong length) whose value
    swallowed the elements after it. Taken as a frame of reference, such a value lies in no
    series' frame, and linking would tie the annotation, whose references it swallowed, to no
    series it may belong to (:func:`packer.read.dicom_masks._lost_for`). Damage is told by what a
    swallowed element leaves: bytes that are no printable ASCII (tags, lengths, binary values), or a
    length past :data:`_UID_DAMAGED_LENGTH`. A UID that is only malformed (a de-identifier's hex or
    text ids, a writer's longer UID) is not damaged: its images carry the same text and it links."""
    value = element(ds, keyword, "")
    text = "\\".join(str(v) for v in value) if isinstance(value, MultiValue) else str(value or "").strip()
    if text and (len(text) > _UID_DAMAGED_LENGTH or not (text.isascii() and text.isprintable())):
        raise DamagedElement(
            f"{Tag(tag_for_keyword(keyword) or 0)} {keyword} is not a UID ({len(text)} characters"
            + ("" if text.isascii() and text.isprintable() else ", binary bytes among them")
            + ": the element is damaged, and its value swallowed the elements after it, the references among them)")
    return text


#: A Frame of Reference UID this long is elements swallowed by a damaged one (PS3.5 allows 64 characters)
_UID_DAMAGED_LENGTH = 256


def annotation_modality(ds: Dataset) -> str | None:
    """``SEG`` or ``RTSTRUCT`` where ``ds`` is one (by SOP class, or Modality), else None."""
    uid = _uid(ds, "SOPClassUID")
    meta = getattr(ds, "file_meta", None)
    stored = str(meta.get("MediaStorageSOPClassUID", "") or "").strip() if meta is not None else ""
    # a header cut before (0008,0016), or inside its value (pydicom keeps the bytes there are: "1.2."),
    # or whose (0008,0016) is no UID at all (a damaged length swallowed the next elements), still
    # names its class in its file meta; a whole UID of another class is that class
    if uid != stored and (stored.startswith(uid) or not _WHOLE_UID.fullmatch(uid)):
        uid = stored
    if uid in ANNOTATION_CLASSES:
        return ANNOTATION_CLASSES[uid]
    modality = str(ds.get("Modality", "") or "").strip().upper()
    return modality if modality in ANNOTATION_MODALITIES else None


def annotation_refs(ds: Dataset) -> AnnotationRefs:
    """What the header of ``ds`` (a SEG or an RTSTRUCT, pixels not needed) references.

    SEG: Referenced Series Sequence (series and instances), each frame's Derivation Image →
    Source Image Sequence (instances), the Frame of Reference UID. RTSTRUCT: Referenced Frame of
    Reference → RT Referenced Study → RT Referenced Series (series, Contour Image Sequence
    instances), each contour's Contour Image Sequence, the Structure Set ROI Sequence's Referenced
    Frame of Reference UIDs. The per-frame and per-contour references are read only where the
    object names no series (a structure set of a thousand contours is then not walked twice).
    Missing sequences give empty tuples: linking decides. Raises
    :class:`~packer.read.dicom_attrs.DamagedElement` where an element cannot be decoded, or a Frame
    of Reference UID is no UID (:func:`_frame_uid`): the probe makes the references unreadable."""
    modality = annotation_modality(ds) or ""
    series: dict[str, None] = {}
    instances: dict[str, None] = {}
    frames: dict[str, None] = {}

    def add(found: dict[str, None], item: Dataset, keyword: str) -> None:
        uid = _frame_uid(item, keyword) if found is frames else _uid(item, keyword)
        if uid:
            found[uid] = None

    add(frames, ds, "FrameOfReferenceUID")
    structures = 0
    declared: Declared | None = None
    if modality == "SEG":
        segments = _items(ds, "SegmentSequence")
        structures = len(segments)
        declared = _declared(lambda: Declared(
            names=tuple(item_text(item, "SegmentLabel") or f"segment {element(item, 'SegmentNumber')}"
                        for item in segments),
            codes=tuple(_property_code(item) for item in segments)))
        for item in _items(ds, "ReferencedSeriesSequence"):
            add(series, item, "SeriesInstanceUID")
            for inst in _items(item, "ReferencedInstanceSequence"):
                add(instances, inst, "ReferencedSOPInstanceUID")
        for frame in _items(ds, "PerFrameFunctionalGroupsSequence") if not series else ():
            for derivation in _items(frame, "DerivationImageSequence"):
                for source in _items(derivation, "SourceImageSequence"):
                    add(instances, source, "ReferencedSOPInstanceUID")
    elif modality == "RTSTRUCT":
        rois = _items(ds, "StructureSetROISequence")
        structures = len(rois)
        declared = _declared(lambda: Declared(names=tuple(item_text(roi, "ROIName") for roi in rois)))
        for roi in rois:
            add(frames, roi, "ReferencedFrameOfReferenceUID")
        for ref in _items(ds, "ReferencedFrameOfReferenceSequence"):
            add(frames, ref, "FrameOfReferenceUID")
            for study in _items(ref, "RTReferencedStudySequence"):
                for item in _items(study, "RTReferencedSeriesSequence"):
                    add(series, item, "SeriesInstanceUID")
                    for image in _items(item, "ContourImageSequence"):
                        add(instances, image, "ReferencedSOPInstanceUID")
        for roi_contour in _items(ds, "ROIContourSequence") if not series else ():
            for contour in _items(roi_contour, "ContourSequence"):
                for image in _items(contour, "ContourImageSequence"):
                    add(instances, image, "ReferencedSOPInstanceUID")
    return AnnotationRefs(modality=modality, study_uid=_uid(ds, "StudyInstanceUID"), series_uids=tuple(series),
                          instance_uids=tuple(instances), frames_of_reference=tuple(frames), structures=structures,
                          declared=declared, sop_class=sop_class_name(RTSTRUCT_STORAGE if modality == "RTSTRUCT"
                                                                      else _uid(ds, "SOPClassUID")))


def _declared(read: Callable[[], Declared]) -> Declared | None:
    """The structures a header declares, or None where a name or code in it cannot be decoded:
    the build, which paints it, gives the file its record; ``validate --quick`` leaves it be."""
    try:
        return read()
    except (DamagedElement, *ELEMENT_ERRORS):
        return None


def _property_code(segment: Dataset) -> tuple[str, str] | None:
    """A SEG segment's Segmented Property Type as (Coding Scheme Designator, value: Code Value,
    else Long Code Value, else URN Code Value), as highdicom reads it; None where it has none."""
    items = _items(segment, "SegmentedPropertyTypeCodeSequence")
    if not items:
        return None
    code = items[0]
    value = next((v for k in ("CodeValue", "LongCodeValue", "URNCodeValue") if (v := _uid(code, k))), "")
    return (_uid(code, "CodingSchemeDesignator"), value) if value else None
