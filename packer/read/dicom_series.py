"""What a DICOM file's header says about its place in a series: UIDs, positions, orientation, grid.

:func:`slice_geometry` reads, from a parsed dataset (header only is enough), what series
assembly (:mod:`packer.pipeline.series`) needs to group files into series, order their slices
and check them: Study/Series Instance UID, Frame of Reference, Image Position and Orientation
(Patient) (for an enhanced multi-frame object, per frame from the functional groups: PS3.3
C.7.6.16.2.3 Plane Position, C.7.6.16.2.4 Plane Orientation; an RT Dose's along the normal by
its Grid Frame Offset Vector, C.8.8.3.2; an NM tomogram's by its Slice Vector and Spacing
Between Slices, C.8.4.15), Rows/Columns, Pixel Spacing, Image Type, and the slice depth a series
of one slice stands for (Spacing Between Slices, else Slice Thickness). Nothing is judged here:
a missing value is ``None`` and assembly decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

from packer.read.dicom_attrs import (
    DamagedElement,
    MalformedValue,
    checked_pixel_spacing,
    decimals,
    element,
    first_float,
    floats,
    functional_item,
    sequence_items,
    sop_class_name,
)
from packer.read.dicom_objects import NM_RECONSTRUCTED


@dataclass(frozen=True)
class HeaderFingerprint:
    """The file as the header pass read it: its ``size`` and ``mtime_ns`` (from a stat before the
    read) and how many top-level ``elements`` its header held (up to the pixel data). The pixel
    pass trusts the checks the header pass made on a file it finds the same
    (:func:`packer.read.dicom.reread_placed`)."""

    size: int
    mtime_ns: int
    elements: int
    #: Whether the file is its header and one Pixel Data element of the length the header gives,
    #: ending with the file: ``""`` it is, else what is wrong; ``None`` where the header cannot
    #: tell (:func:`packer.read.dicom.pixel_data_problem`)
    pixels: str | None = None


#: The attributes that tell two images at one place apart (an echo, a time point, a b-value, an
#: inversion, a dynamic PET's frame by its Frame Reference Time, PS3.3 C.8.9.4.1.5, a dual-energy
#: CT's tube voltage): the same image exported twice carries the same values (PS3.3: one SOP Instance)
IMAGE_IDENTITY = ("InstanceNumber", "EchoNumbers", "EchoTime", "TemporalPositionIdentifier", "TriggerTime",
                  "InversionTime", "DiffusionBValue", "FrameReferenceTime", "KVP")

#: The times of day that tell two images at one place apart where nothing of :data:`IMAGE_IDENTITY`
#: does (a CT perfusion's time points, one Acquisition Number, written with their times only): a
#: record names them last, and they never make two files of one SOP Instance UID two images (a
#: copy's times may have been rewritten by a de-identifier; the UID says it is one image)
IMAGE_TIMES = ("AcquisitionTime", "ContentTime")

#: Where a multi-frame object's functional groups tell its frames at one place apart (PS3.3
#: C.7.6.16.2.2, C.8.13.5.2, C.8.13.5.9): (sequence, attribute), named by the attribute
FRAME_IDENTITY = (("FrameContentSequence", "StackID"), ("FrameContentSequence", "TemporalPositionIndex"),
                  ("MREchoSequence", "EffectiveEchoTime"), ("MRDiffusionSequence", "DiffusionBValue"),
                  ("FrameContentSequence", "DimensionIndexValues"))


@dataclass(frozen=True)
class SliceGeometry:
    """One file's series facts. ``positions``: Image Position (Patient) per frame (one entry for
    a single-frame file; ``None`` where a frame has none); ``orientation``: the six direction
    cosines (row, then column) of frame 0; ``spacing``: (row, column) mm; ``image_type``: the
    Image Type values, upper case."""

    study_uid: str
    series_uid: str
    frame_of_reference: str
    positions: tuple[tuple[float, float, float] | None, ...]
    orientation: tuple[float, ...] | None
    rows: int
    columns: int
    spacing: tuple[float, float] | None
    image_type: tuple[str, ...]
    #: SOP Instance UID: what an annotation's frames and contours reference
    sop_uid: str = ""
    #: The file as the header pass read it (None where it could not be stat'ed)
    fingerprint: HeaderFingerprint | None = None
    #: A multi-frame object's orientation per frame where its Per-frame Functional Groups give
    #: one (PS3.3 C.7.6.16.2.4): frames need not share frame 0's (a three-plane scout)
    frame_orientations: tuple[tuple[float, ...] | None, ...] = ()
    #: frames 1.. of a multi-frame file: each frame's own Pixel Spacing (Pixel Measures), checked
    #: against frame 0's as the orientations are (a frame of another scale is series_geometry)
    frame_spacings: tuple[tuple[float, float] | None, ...] = ()
    #: Acquisition Number (0020,0012) as written ("" where absent): two acquisitions of one series
    #: (a chest and an abdomen run) are stacks of their own (:func:`packer.read.series.assemble`)
    acquisition: str = ""
    #: Frame 0's Spacing Between Slices, else its Slice Thickness (mm; ``None`` where neither is a
    #: positive number): the depth step of a series of this one slice, which has no second position
    depth: float | None = None
    #: What is wrong with the Spacing Between Slices or Slice Thickness that ``depth`` would be
    #: read from, where that value is there but malformed ("" where none is): only a series of
    #: this one slice uses the depth, and is refused with this (others are placed by positions)
    depth_problem: str = ""
    #: Where a multi-frame file's frames have no position, what the file lacks to place them ("" to
    #: say the enhanced objects' way: Per-frame Functional Groups): an RT Dose without its Grid
    #: Frame Offset Vector, an NM tomogram without its Spacing Between Slices
    unplaced: str = ""
    #: Convolution Kernel (0018,1210), its values joined by a backslash ("" where absent): two
    #: reconstructions of one acquisition (a soft-tissue and a lung kernel) may share a Series
    #: Instance UID, and are never stacked together (:func:`packer.read.series.assemble`)
    kernel: str = ""
    #: The values of :data:`IMAGE_IDENTITY` as written ("" where absent): two files of one SOP
    #: Instance UID and position that differ in them are two images, not one exported twice
    identity: tuple[str, ...] = ()
    #: A multi-frame object's :data:`FRAME_IDENTITY` values, one tuple per frame (``()`` for a
    #: single frame): what a record names where two of its frames share a position
    frame_identity: tuple[tuple[str, ...], ...] = ()
    #: The values of :data:`IMAGE_TIMES` as written ("" where absent)
    times: tuple[str, ...] = ()
    #: Modality (0008,0060), upper case, and the SOP class's name (:func:`sop_class_name`), as a
    #: slice job's records give them: what a series job's record of a file it leaves out (a
    #: localizer, an end slice under ``edge: skip``) is counted by in the manifest
    modality: str = ""
    sop_class: str = ""

    @property
    def frames(self) -> int:
        return len(self.positions)


def _position(source: Dataset | None) -> tuple[float, float, float] | None:
    """Image Position (Patient): ``None`` where absent; raises
    :class:`~packer.read.dicom_attrs.MalformedValue` where it is not three numbers (a slice placed
    by what is left of it would be stacked elsewhere; one read as absent is refused as having
    none, which sends the user looking for a missing tag)."""
    values = decimals(source, "ImagePositionPatient", 3) if source is not None else None
    return (values[0], values[1], values[2]) if values is not None else None


def _orientation(source: Dataset | None) -> tuple[float, ...] | None:
    """Image Orientation (Patient): ``None`` where absent; raises
    :class:`~packer.read.dicom_attrs.MalformedValue` where it is not six numbers."""
    return decimals(source, "ImageOrientationPatient", 6) if source is not None else None


def slice_geometry(ds: Dataset) -> SliceGeometry:
    """The series facts of a parsed file (see :class:`SliceGeometry`). Raises
    :class:`~packer.read.dicom_attrs.DamagedElement` for an element that cannot be decoded."""
    frames = int(first or 1) if (first := element(ds, "NumberOfFrames")) not in (None, "") else 1
    positions: list[tuple[float, float, float] | None] = []
    for frame in range(max(frames, 1)):
        item = functional_item(ds, frame, "PlanePositionSequence")
        positions.append(_position(item) or (_position(ds) if frames == 1 else None))
    plane = functional_item(ds, 0, "PlaneOrientationSequence")
    orientation = _orientation(plane) or _orientation(ds) or _orientation(_detector(ds))
    unplaced = ""
    if frames > 1 and all(p is None for p in positions):  # no functional groups: frames a grid along the normal
        positions, unplaced = _stacked_frames(ds, frames, orientation)
    frame_orientations = tuple(_orientation(functional_item(ds, frame, "PlaneOrientationSequence"))
                               for frame in range(1, frames)) if frames > 1 else ()
    image_type = tuple(str(v).strip().upper() for v in (element(ds, "ImageType") or ()))
    depth, depth_problem = _depth(ds)
    return SliceGeometry(
        study_uid=str(element(ds, "StudyInstanceUID") or ""),
        series_uid=str(element(ds, "SeriesInstanceUID") or ""),
        frame_of_reference=str(element(ds, "FrameOfReferenceUID") or ""),
        positions=tuple(positions),
        orientation=orientation,
        rows=int(element(ds, "Rows") or 0),
        columns=int(element(ds, "Columns") or 0),
        spacing=checked_pixel_spacing(ds, 0),
        image_type=image_type,
        sop_uid=str(element(ds, "SOPInstanceUID") or ""),
        frame_orientations=frame_orientations,
        frame_spacings=tuple(checked_pixel_spacing(ds, frame) for frame in range(1, frames)) if frames > 1 else (),
        acquisition=str(element(ds, "AcquisitionNumber") or "").strip(),
        depth=depth,
        depth_problem=depth_problem,
        unplaced=unplaced,
        kernel=_text(ds, "ConvolutionKernel"),
        identity=tuple(_text(ds, keyword) for keyword in IMAGE_IDENTITY),
        frame_identity=_frame_identity(ds, frames) if frames > 1 else (),
        times=tuple(_text(ds, keyword) for keyword in IMAGE_TIMES),
        modality=str(element(ds, "Modality") or "").strip().upper(),
        sop_class=sop_class_name(str(element(ds, "SOPClassUID") or "").strip()),
    )


def _detector(ds: Dataset) -> Dataset | None:
    """An NM object's first Detector Information item (PS3.3 C.8.4.10), which holds the Image
    Position and Orientation (Patient) of a tomogram (C.8.4.15: at the top level as well)."""
    items = sequence_items(ds, "DetectorInformationSequence")
    return items[0] if items else None


def _stacked_frames(ds: Dataset, frames: int, orientation: tuple[float, ...] | None
                    ) -> tuple[list[tuple[float, float, float] | None], str]:
    """The positions of the frames of a multi-frame object that places them without functional
    groups, as a grid along the slice normal (row x column cosines) from one Image Position
    (Patient): an RT Dose by its Grid Frame Offset Vector (PS3.3 C.8.8.3.2), an NM tomogram (NM
    RECON TOMO) by its Slice Vector and Spacing Between Slices (C.8.4.8, C.8.4.15). Where the
    object lacks what that takes, no positions and what it lacks (the series' refusal says so);
    for any other object, no positions and ""."""
    none: list[tuple[float, float, float] | None] = [None] * frames
    if element(ds, "GridFrameOffsetVector") is not None:
        return _dose_frames(ds, frames, orientation)
    modality = str(element(ds, "Modality") or "").strip().upper()
    image_type = [str(v).strip().upper() for v in (element(ds, "ImageType") or ())]
    # a reconstruction's frames are slices; a TOMO object's are projections, which no position orders
    if element(ds, "SliceVector") is not None or (modality == "NM" and NM_RECONSTRUCTED & set(image_type)):
        return _tomo_frames(ds, frames, orientation)
    return none, ""



def _dose_frames(ds: Dataset, frames: int, orientation: tuple[float, ...] | None
                 ) -> tuple[list[tuple[float, float, float] | None], str]:
    """An RT Dose's frame positions (PS3.3 C.8.8.3.2): Grid Frame Offset Vector (3004,000C) holds
    one offset per frame; where its first is 0 they are mm along the normal from the top-level
    Image Position (Patient), else they are the frames' z coordinates, which the standard allows
    only for the transverse orientation (1,0,0,0,1,0)."""
    none: list[tuple[float, float, float] | None] = [None] * frames
    what = "its Grid Frame Offset Vector (3004,000C)"
    raw = element(ds, "GridFrameOffsetVector")
    count = len(raw) if hasattr(raw, "__len__") and not isinstance(raw, str | bytes) else 1
    offsets = floats(raw)
    if len(offsets) != frames or count != frames:
        return none, f"{what} has {len(offsets)} number(s) for {frames} frames (one offset per frame)"
    origin = _position(ds)
    if origin is None:
        return none, f"it has no top-level Image Position (Patient), the origin of {what}"
    if orientation is None:
        return none, f"it has no Image Orientation (Patient), whose normal {what} runs along"
    normal = _normal(orientation)
    if offsets[0] == 0:
        return [_along(origin, normal, offset) for offset in offsets], ""
    if abs(abs(normal[2]) - 1) > 1e-3:
        return none, (f"{what} starts at {offsets[0]:g}, not 0: z coordinates, which PS3.3 C.8.8.3.2 allows only "
                      f"for the orientation (1,0,0,0,1,0), and its Image Orientation (Patient) is "
                      f"{[round(v, 4) for v in orientation]}")
    return [(origin[0], origin[1], offset) for offset in offsets], ""


def _tomo_frames(ds: Dataset, frames: int, orientation: tuple[float, ...] | None
                 ) -> tuple[list[tuple[float, float, float] | None], str]:
    """An NM tomogram's frame positions: frame k is slice Slice Vector[k] (1-based, PS3.3
    C.8.4.8), which lies (slice - 1) x Spacing Between Slices along the normal from the Image
    Position (Patient) of the first slice (top level, else the Detector Information item)."""
    none: list[tuple[float, float, float] | None] = [None] * frames
    lacks = "an NM tomogram places its frames by Image Position (Patient), Slice Vector and Spacing Between " \
            "Slices; it has"
    origin = _position(ds) or _position(_detector(ds))
    if origin is None:
        return none, f"{lacks} no Image Position (Patient), at the top level or in its Detector Information Sequence"
    if orientation is None:
        return none, f"{lacks} no Image Orientation (Patient)"
    raw = element(ds, "SliceVector")
    indices = floats(raw)
    count = len(raw) if hasattr(raw, "__len__") and not isinstance(raw, str | bytes) else int(raw is not None)
    if count != frames or len(indices) != frames or any(i < 1 or i != int(i) for i in indices):
        return none, (f"{lacks} no Slice Vector (0054,0080)" if raw is None else
                      f"{lacks} a Slice Vector (0054,0080) of {count} value(s) for {frames} frames (one slice "
                      "number, from 1, per frame)")
    step = first_float(element(ds, "SpacingBetweenSlices"))
    if step is None or step <= 0:
        return none, f"{lacks} no positive Spacing Between Slices (0018,0088)"
    normal = _normal(orientation)
    return [_along(origin, normal, (index - 1) * step) for index in indices], ""


def _normal(orientation: tuple[float, ...]) -> tuple[float, float, float]:
    """The slice normal: row cosines x column cosines."""
    (a, b, c), (d, e, f) = orientation[:3], orientation[3:6]
    return (b * f - c * e, c * d - a * f, a * e - b * d)


def _along(origin: tuple[float, float, float], normal: tuple[float, float, float], distance: float
           ) -> tuple[float, float, float]:
    return (origin[0] + distance * normal[0], origin[1] + distance * normal[1], origin[2] + distance * normal[2])


def _frame_identity(ds: Dataset, frames: int) -> tuple[tuple[str, ...], ...]:
    """Each frame's :data:`FRAME_IDENTITY` values: its per-frame group's, else the shared group's
    ("" where neither has one). Only a record's words depend on them, so a group that cannot be
    decoded leaves them unknown (``()``) rather than refusing a file whose frames place and read
    (the positions' own reading refuses a damaged Per-frame Functional Groups Sequence)."""
    try:
        per_frame = sequence_items(ds, "PerFrameFunctionalGroupsSequence")
        shared = sequence_items(ds, "SharedFunctionalGroupsSequence")[:1]
        out = []
        for frame in range(frames):
            groups = (*per_frame[frame:frame + 1], *shared)
            values = []
            for sequence, keyword in FRAME_IDENTITY:
                items = next((found for group in groups if (found := sequence_items(group, sequence))), ())
                values.append(_text(items[0], keyword) if items else "")
            out.append(tuple(values))
        return tuple(out)
    except DamagedElement:
        return ()


def _text(ds: Dataset, keyword: str) -> str:
    """An attribute's values (VM 1-n), stripped and joined by a backslash, as written ("" absent)."""
    value = element(ds, keyword)
    values = list(value) if isinstance(value, MultiValue | list | tuple) else [] if value is None else [value]
    return "\\".join(str(v).strip() for v in values if str(v).strip())


def _depth(ds: Dataset) -> tuple[float | None, str]:
    """Frame 0's Spacing Between Slices (Pixel Measures, else top level), else its Slice
    Thickness: positive mm, or ``None`` where neither is there; and, where the one it would be
    read from is there but is no number or negative ("2,5", "NaN", "-2.5"), ``None`` and what
    is wrong with it. Such a value is never passed over for the next: a damaged Spacing Between
    Slices read as absent made a one-slice volume as deep as its Slice Thickness, silently. A 0
    is well-formed and says no step (exporters write it for a lone 2-D slice, which has no
    neighbour to measure to): read as absent, as before, and the next one taken."""
    item = functional_item(ds, 0, "PixelMeasuresSequence")
    for keyword in ("SpacingBetweenSlices", "SliceThickness"):
        source = item if item is not None and keyword in item else ds
        try:
            value = decimals(source, keyword, 1, positive=True)
        except MalformedValue as err:
            if _zero(source, keyword):
                continue
            return None, str(err)
        if value is not None:
            return value[0], ""
    return None, ""


def _zero(source: Dataset, keyword: str) -> bool:
    """Whether ``keyword`` of ``source`` is one well-formed 0 (no step, not a damaged value)."""
    try:
        return decimals(source, keyword, 1) == (0.0,)
    except MalformedValue:
        return False
