"""The demo's annotated CT tree (``demo-raw/annotated/``): CT series whose masks come from DICOM
SEG and RTSTRUCT objects, for ``workflows/annotated-*.yaml``.

Layout (one folder per patient, the annotation objects beside the series they reference):

- ``ANN001/CT/IM0001.dcm``...: 24 axial slices 2.5 mm apart, 64×64 pixels of 5.47 mm;
  ``ANN001/SEG/seg.dcm``: a BINARY SEG written with highdicom, segments ``Liver`` (SNOMED CT
  10200004) and ``Tumour`` (108369006 Neoplasm, a box inside the liver; the segments overlap, as
  SEG segments may); ``ANN001/RTSTRUCT/rtstruct.dcm``: ROIs ``BODY`` (EXTERNAL), ``Lung_L``,
  ``LUNG RIGHT``, ``Heart`` and ``Dr Smith check`` (a name no job maps: names are PHI).
  On the top :data:`RING_SLICES` chest slices the left lung is drawn as a ring around the heart:
  an outer and an inner contour of the one ROI, the inner one a hole (even-odd rule).
- ``ANN002``: 20 slices 3 mm apart, 56×56 pixels of 6.25 mm, file names and Instance Numbers
  shuffled against position; its SEG names the liver ``Organ 1`` (matched by its code only) and
  the tumour ``Tumor`` (an alias); its RTSTRUCT spells the ROIs ``External``, ``LUNG LEFT``,
  ``Lung_R`` and ``HEART``.
- ``ANN003``: 12 slices and no annotation (``mask.empty: keep`` packs all-zero masks).
- ``ANN004``: 6 slices whose only annotation is ``broken/offslice_rtstruct.dcm``: one BODY contour
  lies halfway between two slices (``contour_off_slice``, for the object and every slice).
- ``broken/orphan_seg.dcm``: a valid SEG of a series that was never saved (``annotation_orphan``).

The truth is drawn in patient millimetres (LPS: x to the patient's left, y posterior, z head):
a body ellipse, two lung ellipses and a heart circle on the chest slices, a liver ellipsoid with
a tumour box on the abdomen slices, each patient's shifted and scaled a little. The CT pixels and
the SEG are rasterised from it by "pixel centre inside"; the RTSTRUCT holds the same outlines as
:data:`CONTOUR_POINTS`-gons (a vertex every 5 degrees: boundary pixels may differ from the exact
shape only where a pixel centre lies within a fraction of a millimetre of it).
:func:`truth_labels` gives the label map a job with the class ids of :data:`CLASSES` (declared
in that order, ``overlap: later_wins``) should pack.

Nothing reads the wall clock: UIDs come from :func:`packer.demo.make_uid`, dates from the seed,
and what highdicom would take from ``now()`` or a random UID is set explicitly, so the same seed
gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pydicom
from numpy.typing import NDArray
from pydicom.dataset import Dataset
from pydicom.uid import CTImageStorage

from packer.demo import (
    IMPLEMENTATION_NAME,
    IMPLEMENTATION_UID,
    DicomUids,
    PlantedDefect,
    _new_dataset,
    _save,
    _set_patient_study,
    make_uid,
    make_uids,
    random_datetime,
    seeded_rng,
    write_ct_slice,
)

RTSTRUCT_STORAGE = "1.2.840.10008.5.1.4.1.1.481.3"
#: The class ids the annotated jobs give each structure, in the order they declare them (body
#: first: under ``later_wins`` a later class wins a voxel, and the body contains the organs).
CLASSES = {"body": 1, "lung": 2, "heart": 3, "liver": 4, "tumour": 5}
#: The patients: slices, slice spacing (mm), matrix (pixels over 350 mm), and what annotates them.
PATIENTS = {
    "ANN001": (24, 2.5, 64, "SEG and RTSTRUCT"),
    "ANN002": (20, 3.0, 56, "SEG and RTSTRUCT, Instance Numbers shuffled"),
    "ANN003": (12, 2.5, 64, "no annotation"),
    "ANN004": (6, 3.0, 64, "an RTSTRUCT with a contour between two slices"),
}
#: How each annotated patient's structures are named: SEG segment labels, RTSTRUCT ROI names.
SEGMENT_LABELS = {"ANN001": {"liver": "Liver", "tumour": "Tumour"}, "ANN002": {"liver": "Organ 1", "tumour": "Tumor"}}
ROI_NAMES = {
    "ANN001": {"body": "BODY", "lung_left": "Lung_L", "lung_right": "LUNG RIGHT", "heart": "Heart"},
    "ANN002": {"body": "External", "lung_left": "LUNG LEFT", "lung_right": "Lung_R", "heart": "HEART"},
}
#: An ROI of ANN001's structure set that no job maps (a reviewer's note: a person's name).
UNMAPPED_ROI = "Dr Smith check"
#: How many of the top chest slices draw the left lung as a ring around the heart.
RING_SLICES = 3
CONTOUR_POINTS = 72
LIVER_CODE = ("10200004", "SCT", "Liver")
TUMOUR_CODE = ("108369006", "SCT", "Neoplasm")
_FOV_MM = 350.0
_CHEST_FRACTION = 0.45  # the top 45% of a series is chest (lungs, heart), the rest abdomen (liver)


@dataclass(frozen=True)
class AnnotatedDemo:
    """What :func:`write_annotated_examples` wrote under ``root`` (``demo-raw/annotated``): slices
    per patient, the good annotation objects and the planted defects (paths relative to ``root``),
    and the structure names no job maps."""

    root: Path
    slices: tuple[tuple[str, int], ...]
    annotations: tuple[str, ...]
    defects: tuple[PlantedDefect, ...]
    unmapped: tuple[str, ...]


@dataclass(frozen=True)
class _Anatomy:
    """One patient's shapes in mm (LPS), from the seed."""

    dx: float
    dy: float
    scale: float

    def at(self, x: float, y: float) -> tuple[float, float]:
        return x * self.scale + self.dx, y * self.scale + self.dy


@dataclass(frozen=True)
class _Series:
    patient: str
    zs: tuple[float, ...]
    size: int
    anatomy: _Anatomy
    chest_from: int  # slices with an index at or above this are chest

    @property
    def spacing(self) -> float:
        return round(_FOV_MM / self.size, 6)

    def centres(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """x (columns) and y (rows) of the pixel centres, mm: IPP (-175, -175), axial."""
        along = -_FOV_MM / 2 + np.arange(self.size, dtype=np.float64) * self.spacing
        return along[None, :], along[:, None]


def _series(seed: int, patient: str) -> _Series:
    count, step, size, _ = PATIENTS[patient]
    rng = seeded_rng(seed, "annotated-anatomy", patient)
    anatomy = _Anatomy(dx=float(rng.uniform(-8, 8)), dy=float(rng.uniform(-8, 8)), scale=float(rng.uniform(0.92, 1.04)))
    z0 = float(np.round(rng.uniform(-120, -60), 1))
    zs = tuple(round(z0 + step * k, 3) for k in range(count))
    return _Series(patient, zs, size, anatomy, chest_from=int(round(count * (1 - _CHEST_FRACTION))))


# ---------------------------------------------------------------- shapes (mm) and masks


def _ellipses(series: _Series, k: int) -> dict[str, tuple[float, float, float, float]]:
    """The in-plane ellipses (cx, cy, ax, ay; mm) of slice ``k``: body always; lungs and heart on
    chest slices (``lung_left_hole``: the ring slices' hole, the heart's outline); liver and
    tumour come from :func:`_liver_masks`."""
    a = series.anatomy
    s = a.scale
    out = {"body": (*a.at(0, 0), 160 * s, 115 * s)}
    if k < series.chest_from:
        return out
    chest = len(series.zs) - series.chest_from
    up = (k - series.chest_from) / max(chest - 1, 1)  # 0 at the diaphragm, 1 at the top
    lung_ay = 65 * s * (1 - 0.2 * up)
    out["lung_right"] = (*a.at(-75, -5), 42 * s, lung_ay)
    out["heart"] = (*a.at(10, -40), 22 * s * (1 - 0.15 * up), 22 * s * (1 - 0.15 * up))
    if k >= len(series.zs) - RING_SLICES:
        out["lung_left"] = (*a.at(45, -15), 72 * s, 62 * s)
        out["lung_left_hole"] = out["heart"]
    else:
        out["lung_left"] = (*a.at(75, -5), 42 * s, lung_ay)
    return out


def _inside(series: _Series, ellipse: tuple[float, float, float, float]) -> NDArray[np.bool_]:
    x, y = series.centres()
    cx, cy, ax, ay = ellipse
    return np.asarray(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2 <= 1.0)


def _liver_masks(series: _Series, k: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Liver (an ellipsoid centred in the abdomen slices) and tumour (a box inside it) on slice ``k``."""
    x, y = series.centres()
    a, s, z = series.anatomy, series.anatomy.scale, series.zs[k]
    abdomen = series.zs[:series.chest_from]
    zc, half = (abdomen[0] + abdomen[-1]) / 2, max((abdomen[-1] - abdomen[0]) / 2, 1.0) * 0.95
    cx, cy = a.at(-45, 15)
    liver = ((x - cx) / (55 * s)) ** 2 + ((y - cy) / (45 * s)) ** 2 + ((z - zc) / half) ** 2 <= 1.0
    tumour = (np.abs(x - (cx - 5 * s)) <= 15 * s) & (np.abs(y - (cy - 2 * s)) <= 12 * s) & (abs(z - zc) <= 0.35 * half)
    if k >= series.chest_from:
        liver = np.zeros_like(liver)
    return np.asarray(liver), np.asarray(tumour & liver)


def _structure_masks(series: _Series, k: int) -> dict[str, NDArray[np.bool_]]:
    """Boolean H×W masks of slice ``k``: body, lung (both sides, the ring's hole left out), heart,
    liver, tumour (pixel centre inside the exact shape)."""
    shapes = _ellipses(series, k)
    empty = np.zeros((series.size, series.size), dtype=bool)
    lung = empty.copy()
    for side in ("lung_left", "lung_right"):
        if side in shapes:
            lung |= _inside(series, shapes[side])
    if "lung_left_hole" in shapes:
        lung &= ~_inside(series, shapes["lung_left_hole"])
    liver, tumour = _liver_masks(series, k)
    return {"body": _inside(series, shapes["body"]), "lung": lung,
            "heart": _inside(series, shapes["heart"]) if "heart" in shapes else empty, "liver": liver, "tumour": tumour}


def truth_labels(seed: int, patient: str) -> NDArray[np.uint8]:
    """The label map a job should pack for ``patient`` of the tree of ``seed``: uint8 D×H×W, slices
    in ascending z (the series' order along its normal), rows and columns as stored, class ids of
    :data:`CLASSES` painted in that order (a later class wins a pixel: tumour inside liver, organs
    inside the body). All zero for a patient no annotation references (ANN003). ANN004's RTSTRUCT
    is broken: its truth is its body, but a build must refuse its slices."""
    series = _series(seed, patient)
    out = np.zeros((len(series.zs), series.size, series.size), dtype=np.uint8)
    if patient == "ANN003":
        return out
    for k in range(len(series.zs)):
        masks = _structure_masks(series, k)
        for name, class_id in CLASSES.items():
            if patient == "ANN004" and name != "body":
                continue
            out[k][masks[name]] = class_id
    return out


def _render_hu(series: _Series, k: int, seed: int) -> NDArray[np.float32]:
    """HU of slice ``k``: air -1000, body 40, lungs -850, heart 50, liver 65, tumour 20, noise σ 12."""
    masks = _structure_masks(series, k)
    hu = np.full((series.size, series.size), -1000.0, dtype=np.float32)
    for name, value in (("body", 40.0), ("lung", -850.0), ("heart", 50.0), ("liver", 65.0), ("tumour", 20.0)):
        hu[masks[name]] = value
    hu += seeded_rng(seed, "annotated-slice", series.patient, k).standard_normal(hu.shape, dtype=np.float32) * 12.0
    return np.maximum(hu, -1024.0, out=hu)


# ---------------------------------------------------------------- CT series


@dataclass(frozen=True)
class _Written:
    """A written (or in-memory) CT series: its datasets in ascending z, and the dates."""

    series: _Series
    datasets: tuple[Dataset, ...]
    when: datetime


def _uids(seed: int, patient: str, k: int | str, series: int) -> tuple[str, str, str]:
    uids = make_uids(seed, f"annotated-{patient}", k, study=1, series=series)
    return uids.study, uids.series, uids.sop


def _write_ct(root: Path, seed: int, patient: str) -> _Written:
    """Write ``patient``'s CT series as ``root/<patient>/CT/IM0001.dcm``... and return its datasets
    in ascending z. ANN002's Instance Numbers (and so its file names) are a seeded permutation of
    the positions: only Image Position (Patient) orders a series."""
    series = _series(seed, patient)
    when = random_datetime(seeded_rng(seed, "annotated-date", patient))
    count = len(series.zs)
    numbers = (seeded_rng(seed, "annotated-order", patient).permutation(count) + 1 if patient == "ANN002"
               else np.arange(1, count + 1))
    frame_uid = make_uid(seed, "annotated-frame-of-reference", patient)
    datasets = []
    for k, z in enumerate(series.zs):
        path = root / patient / "CT" / f"IM{int(numbers[k]):04d}.dcm"
        write_ct_slice(path, patient_id=patient, study_date=when.strftime("%Y%m%d"),
                       study_time=when.strftime("%H%M%S"), pixels_hu=_render_hu(series, k, seed),
                       uids=make_uids(seed, f"annotated-{patient}", k, study=1, series=1),
                       instance_number=int(numbers[k]), slice_location_mm=z, FrameOfReferenceUID=frame_uid,
                       PositionReferenceIndicator="", SliceThickness=str(PATIENTS[patient][1]),
                       SeriesDescription="packer demo annotated CT", PatientBirthDate="")
        datasets.append(pydicom.dcmread(path))
    return _Written(series, tuple(datasets), when)


# ---------------------------------------------------------------- SEG (highdicom)


def _content_datetime(written: _Written) -> datetime:
    """When the annotation was made: the day after the scan, same time."""
    return written.when + timedelta(days=1)


def _seg_dataset(seed: int, written: _Written, labels: dict[str, str], *, tag: str) -> Dataset:
    """A BINARY SEG of ``written`` with a liver and a tumour segment (``labels``: their Segment
    Labels), every UID and date explicit; ``tag`` keys its own UIDs."""
    import highdicom as hd

    series = written.series
    masks = [_structure_masks(series, k) for k in range(len(series.zs))]
    pixels = np.stack([np.stack([m["liver"], m["tumour"]], axis=-1) for m in masks]).astype(np.uint8)
    anatomical = hd.sr.CodedConcept("123037004", "SCT", "Anatomical Structure")
    altered = hd.sr.CodedConcept("49755003", "SCT", "Morphologically Altered Structure")
    algorithm = hd.seg.SegmentAlgorithmTypeValues.MANUAL
    descriptions = [
        hd.seg.SegmentDescription(segment_number=1, segment_label=labels["liver"],
                                  segmented_property_category=anatomical,
                                  segmented_property_type=hd.sr.CodedConcept(*LIVER_CODE), algorithm_type=algorithm),
        hd.seg.SegmentDescription(segment_number=2, segment_label=labels["tumour"],
                                  segmented_property_category=altered,
                                  segmented_property_type=hd.sr.CodedConcept(*TUMOUR_CODE), algorithm_type=algorithm),
    ]
    made = _content_datetime(written)
    uids = make_uids(seed, f"annotated-{written.series.patient}", tag, study=1, series=2)
    seg = hd.seg.Segmentation(
        source_images=list(written.datasets), pixel_array=pixels,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=descriptions,
        series_instance_uid=uids.series, series_number=2,
        sop_instance_uid=uids.sop, instance_number=1, manufacturer="packer demo", manufacturer_model_name="demo",
        software_versions="packer demo", device_serial_number="0", content_description="packer demo segmentation",
        content_label="DEMO", content_creator_name="Demo^Annotator", content_date=made.date(),
        content_time=made.time(), series_description="packer demo SEG",
    )
    # highdicom takes these from now() and uuid: fix them so the same seed gives the same bytes
    seg.InstanceCreationDate = pydicom.valuerep.DA(made.strftime("%Y%m%d"))
    seg.InstanceCreationTime = pydicom.valuerep.TM(made.strftime("%H%M%S"))
    dimension_uid = make_uid(seed, "annotated-dimension", written.series.patient, tag)
    for item in [*seg.get("DimensionOrganizationSequence", []), *seg.get("DimensionIndexSequence", [])]:
        item.DimensionOrganizationUID = dimension_uid
    for equipment in seg.get("ContributingEquipmentSequence", []):  # highdicom names itself, contributing now()
        if "ContributionDateTime" in equipment:
            equipment.ContributionDateTime = made.strftime("%Y%m%d%H%M%S")
    seg.file_meta.ImplementationClassUID = pydicom.uid.UID(IMPLEMENTATION_UID)
    seg.file_meta.ImplementationVersionName = IMPLEMENTATION_NAME
    return seg


def _save_seg(seg: Dataset, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path, enforce_file_format=True)


# ---------------------------------------------------------------- RTSTRUCT (pydicom)


def _polygon(ellipse: tuple[float, float, float, float], z: float, *, clockwise: bool = False) -> list[float]:
    """``CONTOUR_POINTS`` vertices on the ellipse at height ``z``: x1, y1, z1, x2, ... (mm, 2 decimals)."""
    cx, cy, ax, ay = ellipse
    angles = np.linspace(0.0, 2 * np.pi, CONTOUR_POINTS, endpoint=False)
    if clockwise:
        angles = angles[::-1]
    points = np.stack([cx + ax * np.cos(angles), cy + ay * np.sin(angles), np.full_like(angles, z)], axis=1)
    return [round(float(v), 2) for v in points.ravel()]


def _ref_image(ds: Dataset) -> Dataset:
    item = Dataset()
    item.ReferencedSOPClassUID = CTImageStorage
    item.ReferencedSOPInstanceUID = ds.SOPInstanceUID
    return item


@dataclass(frozen=True)
class _Contour:
    """One closed planar contour of an ROI: its points and the slice it was drawn on (None: none named)."""

    points: list[float]
    image: Dataset | None


def _rtstruct(seed: int, written: _Written, rois: Sequence[tuple[str, str, list[_Contour]]], *, tag: str) -> Dataset:
    """An RT Structure Set of ``written``: ``rois`` as (ROI name, RT ROI Interpreted Type, contours),
    numbered from 1 in that order; every UID and date from the seed."""
    first = written.datasets[0]
    made_uids = make_uids(seed, f"annotated-{written.series.patient}", tag, study=1, series=3)
    uids = DicomUids(study=str(first.StudyInstanceUID), series=made_uids.series, sop=made_uids.sop)
    ds = _new_dataset(RTSTRUCT_STORAGE, uids, modality="RTSTRUCT")
    _set_patient_study(ds, patient_id=str(first.PatientID), study_date=str(first.StudyDate),
                       study_time=str(first.StudyTime))
    del ds.ContentDate, ds.ContentTime  # not in the RT Structure Set IOD
    made = _content_datetime(written)
    ds.SeriesNumber = 3
    ds.SeriesDescription = "packer demo RTSTRUCT"
    ds.InstanceNumber = 1
    ds.StructureSetLabel = "DEMO"
    ds.StructureSetDate, ds.StructureSetTime = made.strftime("%Y%m%d"), made.strftime("%H%M%S")
    ds.OperatorsName = ""
    frame_uid = str(first.FrameOfReferenceUID)
    series_item = Dataset()
    series_item.SeriesInstanceUID = first.SeriesInstanceUID
    series_item.ContourImageSequence = [_ref_image(image) for image in written.datasets]
    study_item = Dataset()
    study_item.ReferencedSOPClassUID = "1.2.840.10008.3.1.2.3.1"  # Detached Study Management, as RT systems write
    study_item.ReferencedSOPInstanceUID = first.StudyInstanceUID
    study_item.RTReferencedSeriesSequence = [series_item]
    frame_item = Dataset()
    frame_item.FrameOfReferenceUID = frame_uid
    frame_item.RTReferencedStudySequence = [study_item]
    ds.ReferencedFrameOfReferenceSequence = [frame_item]
    set_rois, roi_contours, observations = [], [], []
    colours = ((0, 255, 0), (0, 128, 255), (255, 0, 0), (255, 255, 0), (255, 0, 255), (128, 128, 128))
    for number, (name, kind, contours) in enumerate(rois, start=1):
        roi = Dataset()
        roi.ROINumber = number
        roi.ReferencedFrameOfReferenceUID = frame_uid
        roi.ROIName = name
        roi.ROIGenerationAlgorithm = "MANUAL"
        set_rois.append(roi)
        items = []
        for contour in contours:
            item = Dataset()
            if contour.image is not None:
                item.ContourImageSequence = [_ref_image(contour.image)]
            item.ContourGeometricType = "CLOSED_PLANAR"
            item.NumberOfContourPoints = len(contour.points) // 3
            item.ContourData = contour.points
            items.append(item)
        roi_contour = Dataset()
        roi_contour.ROIDisplayColor = list(colours[(number - 1) % len(colours)])
        roi_contour.ContourSequence = items
        roi_contour.ReferencedROINumber = number
        roi_contours.append(roi_contour)
        observation = Dataset()
        observation.ObservationNumber = number
        observation.ReferencedROINumber = number
        observation.RTROIInterpretedType = kind
        observation.ROIInterpreter = ""
        observations.append(observation)
    ds.StructureSetROISequence = set_rois
    ds.ROIContourSequence = roi_contours
    ds.RTROIObservationsSequence = observations
    return ds


def _roi_contours(written: _Written, names: dict[str, str]) -> list[tuple[str, str, list[_Contour]]]:
    """The body, lungs and heart of ``written`` as ROIs named ``names`` (a ring slice's left lung:
    its outer contour, then the heart's outline as its hole, drawn the other way round)."""
    series = written.series
    rois: dict[str, list[_Contour]] = {key: [] for key in ("body", "lung_left", "lung_right", "heart")}
    for k, (z, image) in enumerate(zip(series.zs, written.datasets, strict=True)):
        shapes = _ellipses(series, k)
        for key in rois:
            if key in shapes:
                rois[key].append(_Contour(_polygon(shapes[key], z), image))
        if "lung_left_hole" in shapes:
            rois["lung_left"].append(_Contour(_polygon(shapes["lung_left_hole"], z, clockwise=True), image))
    kinds = {"body": "EXTERNAL", "lung_left": "ORGAN", "lung_right": "ORGAN", "heart": "ORGAN"}
    return [(names[key], kinds[key], rois[key]) for key in rois]


# ---------------------------------------------------------------- the tree


def _write_orphan_seg(root: Path, seed: int) -> None:
    """``broken/orphan_seg.dcm``: a valid SEG of a series written only to a temporary folder,
    so no series of the tree has the Series or SOP Instance UIDs it references."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        throwaway = _write_ct(Path(tmp), seed, "ANN001")
    # the same anatomy as ANN001, but another patient and other UIDs: re-key the datasets
    patient = "ANN005"
    datasets = []
    for k, ds in enumerate(throwaway.datasets):
        copy = pydicom.Dataset(ds)
        copy.PatientID, copy.PatientName = patient, f"Demo^{patient}"
        uids = make_uids(seed, f"annotated-{patient}", k, study=1, series=1)
        copy.StudyInstanceUID, copy.SeriesInstanceUID, copy.SOPInstanceUID = uids.study, uids.series, uids.sop
        copy.FrameOfReferenceUID = make_uid(seed, "annotated-frame-of-reference", patient)
        datasets.append(copy)
    orphan = _Written(_series(seed, "ANN001"), tuple(datasets), throwaway.when)
    seg = _seg_dataset(seed, orphan, SEGMENT_LABELS["ANN001"], tag="orphan-seg")
    _save_seg(seg, root / "broken" / "orphan_seg.dcm")


def _write_offslice_rtstruct(root: Path, seed: int, written: _Written) -> float:
    """``broken/offslice_rtstruct.dcm``: ANN004's body on every slice, plus one body contour
    halfway between its third and fourth slices (on no slice); returns that contour's z."""
    series = written.series
    contours = [_Contour(_polygon(_ellipses(series, k)["body"], z), image)
                for k, (z, image) in enumerate(zip(series.zs, written.datasets, strict=True))]
    between = round((series.zs[2] + series.zs[3]) / 2, 3)
    contours.append(_Contour(_polygon(_ellipses(series, 2)["body"], between), None))
    ds = _rtstruct(seed, written, [("BODY", "EXTERNAL", contours)], tag="offslice-rtstruct")
    _save(ds, root / "broken" / "offslice_rtstruct.dcm", None)
    return between


def write_annotated_examples(root: Path, seed: int) -> AnnotatedDemo:
    """Write ``root`` (``demo-raw/annotated``) as the module docstring lays it out and return what
    was written; the same seed gives the same bytes. The caller clears an earlier tree."""
    root = Path(root)
    written = {patient: _write_ct(root, seed, patient) for patient in PATIENTS}
    annotations = []
    for patient in ("ANN001", "ANN002"):
        seg = _seg_dataset(seed, written[patient], SEGMENT_LABELS[patient], tag="seg")
        _save_seg(seg, root / patient / "SEG" / "seg.dcm")
        rois = _roi_contours(written[patient], ROI_NAMES[patient])
        if patient == "ANN001":  # a reviewer's note on one abdomen slice, named after the reviewer
            series = written[patient].series
            k = series.chest_from // 2
            cx, cy = series.anatomy.at(40, 30)
            rois.append((UNMAPPED_ROI, "CONTROL", [_Contour(_polygon((cx, cy, 12.0, 12.0), series.zs[k]),
                                                            written[patient].datasets[k])]))
        _save(_rtstruct(seed, written[patient], rois, tag="rtstruct"), root / patient / "RTSTRUCT" / "rtstruct.dcm",
              None)
        annotations += [f"{patient}/SEG/seg.dcm", f"{patient}/RTSTRUCT/rtstruct.dcm"]
    _write_orphan_seg(root, seed)
    _write_offslice_rtstruct(root, seed, written["ANN004"])
    off_slice = [PlantedDefect(f"ANN004/CT/{Path(str(ds.filename)).name}", "contour_off_slice")
                 for ds in written["ANN004"].datasets]
    defects = [PlantedDefect("broken/orphan_seg.dcm", "annotation_orphan"),
               PlantedDefect("broken/offslice_rtstruct.dcm", "contour_off_slice"), *off_slice]
    return AnnotatedDemo(root=root, slices=tuple((p, len(w.datasets)) for p, w in written.items()),
                         annotations=tuple(annotations), defects=tuple(defects), unmapped=(UNMAPPED_ROI,))


def readme_lines(tree: AnnotatedDemo) -> list[str]:
    """The demo README.txt's section on ``annotated/``: the series, their annotations, the class
    map the jobs use, and the broken objects (their reason codes are in the planted defects list)."""
    slices = dict(tree.slices)
    ids = ", ".join(f"{v} {k}" for k, v in {"background": 0, **CLASSES}.items())
    return [
        "annotated/      CT series with DICOM SEG and RTSTRUCT masks (workflows/annotated-slices.yaml,",
        "                annotated-stacks.yaml, annotated-volume.yaml); the jobs' classes: " + ids,
        *(f"  {patient}/CT/     {slices[patient]} axial slices, {step:g} mm apart, {size}x{size} pixels: {what}"
          for patient, (_, step, size, what) in PATIENTS.items()),
        "  ANN00N/SEG/seg.dcm            BINARY SEG (highdicom): liver (SNOMED CT 10200004) and tumour",
        "                                (108369006), overlapping; ANN001 labels them "
        + " and ".join(repr(v) for v in SEGMENT_LABELS["ANN001"].values()) + ", ANN002 "
        + " and ".join(repr(v) for v in SEGMENT_LABELS["ANN002"].values()) + " (liver by its code)",
        "  ANN00N/RTSTRUCT/rtstruct.dcm  ROIs: ANN001 " + ", ".join(repr(v) for v in ROI_NAMES["ANN001"].values())
        + f", {UNMAPPED_ROI!r}",
        "                                (mapped by no job: unmapped, never packed); ANN002 "
        + ", ".join(repr(v) for v in ROI_NAMES["ANN002"].values()),
        f"                                the top {RING_SLICES} slices draw the left lung as a ring: an outer contour",
        "                                and the heart's outline as a hole (even-odd rule)",
        "  broken/orphan_seg.dcm         a SEG of a series that is nowhere in the tree",
        "  broken/offslice_rtstruct.dcm  ANN004's structure set: one contour halfway between two slices",
    ]
