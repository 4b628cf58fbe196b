"""Fuzz the annotation readers with mutated SEG and RTSTRUCT files: a header, a mask or a reason, never a crash.

Seeds (built once): a CT series of 6 slices of 16×20 pixels, a BINARY SEG of two overlapping
segments and a FRACTIONAL SEG over it (highdicom's writer, :mod:`test_seg`'s helpers), and an
RTSTRUCT of three ROIs over it, one of them a ring (an outer contour with a hole), one inside
another (pydicom, :mod:`test_rtstruct`'s helpers, referencing the series by UID). Mutations:
:func:`test_fuzz.byte_mutations` (bit flips, overwrites, truncation), and pydicom-level edits of
the fields the annotation readers use, wherever they sit in the nested sequences (NumberOfFrames,
Rows/Columns, BitsAllocated, SegmentationType, MaximumFractionalValue, segment numbers, the
functional groups' Image Position/Orientation, Pixel Spacing and slice spacing, source references,
ContourData, NumberOfContourPoints, ContourGeometricType, ROINumber/ReferencedROINumber, the
referenced series, instances and frame of reference), with odd values or a wrong VR and random
bytes, or whole elements and sequence items deleted, emptied or repeated; then re-serialised.

For each mutated file: ``probe_dicom(annotations=True)`` returns a DicomHeader, a known Issue or
an Excluded (:func:`test_fuzz.check_outcome`); when the header says it is an annotation, its
refs are linked to the unmutated series (:func:`packer.read.dicom_masks.link`: AnnotatedSeries
and known reasons only) and the file is painted by its modality (``paint_seg`` under both grid
policies and a few thresholds, ``paint_rtstruct``; both overlap policies) onto the series'
SlicePlaces with a fresh Painter: a ``Drawn`` or an ``AnnotationError`` whose reason is in
REASONS, never another exception, never a hang (every call under :func:`test_fuzz.timed`).

Two more mutations aim at what the probe salvages from a file that does not parse
(:mod:`packer.read.annotation_salvage`: the DICM marker overwritten, the file meta gone, a cut
inside it) and at structure sets that lose an ROI's contours (cut at an item of the ROI Contour
Sequence, a ReferencedROINumber rewritten as another's).

Sizing follows :mod:`test_fuzz`: the default run is for CI; ``PACKER_FUZZ_LONG=1`` runs 20× the
examples with a random seed; ``PACKER_FUZZ_REPORT=1`` prints the reasons seen.

What it found (each now a proper reason in the readers): a damaged element inside a SEG's or
RTSTRUCT's reference sequences (a wrong value length, decoded by pydicom only on access:
BytesLengthException, no ValueError) escaped ``probe_dicom(annotations=True)`` from
``annotation_refs`` → ``unreadable`` (read through ``dicom_attrs.element``); a referenced series
item whose Series Instance UID has no value made highdicom's frame tables raise sqlite3's
IntegrityError out of ``paint_seg`` → ``unreadable``; a SEG frame whose Image Position (Patient)
has four values reached numpy's ``dot`` when placed (ValueError) → ``annotation_frames``, as now
any plane position, orientation or pixel spacing of the wrong arity, non-finite, or (spacing)
not positive. The RTSTRUCT rasteriser and ``link`` gave only reasons throughout.
"""

from __future__ import annotations

import copy
import io
import os
import struct
import warnings
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydicom.datadict import dictionary_VR, tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.errors import BytesLengthException
from pydicom.sequence import Sequence as DicomSequence
from pydicom.tag import BaseTag, Tag
from pydicom.uid import ExplicitVRLittleEndian, ImplicitVRLittleEndian
from test_fuzz import EXAMPLES, FUZZ, LIMITS, ODD_U16, SEEN, byte_mutations, check_outcome, timed
from test_rtstruct import closed
from test_rtstruct import rtstruct as build_rtstruct
from test_seg import Grid, ct_series
from test_seg import write_seg as build_seg

from packer.config import MaskConfig, SeriesConfig
from packer.read.annotations import AnnotationError, Drawn, Painter, SlicePlace
from packer.read.dicom import DicomHeader, probe_dicom
from packer.read.dicom_masks import AnnotatedSeries, link
from packer.read.rtstruct import paint_rtstruct
from packer.read.rtstruct_items import contour_items
from packer.read.seg import paint_seg
from packer.read.series import Series, assemble
from packer.records import REASONS, Issue, SampleRef
from packer.structures import Structure, StructureMap

pytestmark = pytest.mark.slow  # fuzzing, as test_fuzz.py

SOURCE = "fz"
GRID = Grid(rows=16, columns=20, n=6, spacing=(0.8, 0.6), step=2.5, origin=(-10.0, -8.0, 30.0))
SEGMENTS = StructureMap((Structure("liver", 1, aliases=("Liver",), codes=("SCT:10200004",)),
                         Structure("tumour", 2, aliases=("Tumour",))))
ROIS = StructureMap((Structure("body", 3, aliases=("BODY",)), Structure("lung", 4, aliases=("Lung_L",)),
                     Structure("heart", 5, aliases=("Heart",))))
MASK = MaskConfig(column="", origin="dicom", segments=SEGMENTS, rois=ROIS)


# ------------------------------------------------------------------------------------- seeds


@cache
def series_datasets() -> tuple[Dataset, ...]:
    """The CT series (:func:`test_seg.ct_series`: shuffled order and instance numbers)."""
    return tuple(ct_series(GRID, seed=4))


def _by_position(sources: tuple[Dataset, ...]) -> list[Dataset]:
    return sorted(sources, key=lambda ds: float(ds.ImagePositionPatient[2]))


def _places(sources: tuple[Dataset, ...]) -> list[SlicePlace]:
    return [SlicePlace(ds.SOPInstanceUID, 0, (float(ds.ImagePositionPatient[0]), float(ds.ImagePositionPatient[1]),
                                              float(ds.ImagePositionPatient[2])),
                       tuple(float(v) for v in ds.ImageOrientationPatient),
                       (float(ds.PixelSpacing[0]), float(ds.PixelSpacing[1])), int(ds.Rows), int(ds.Columns))
            for ds in _by_position(sources)]


def _rtstruct(sources: tuple[Dataset, ...]) -> Dataset:
    """Body (a box on every slice), Lung_L (a ring: a contour and its hole, on slices 1-4) inside
    it, Heart (a triangle on slice 3, referencing its image), all referencing the series."""
    places = _places(sources)
    body = [(2, 2), (2, 17), (13, 17), (13, 2)]
    outer, hole = [(4, 4), (4, 12), (11, 12), (11, 4)], [(6.5, 6.5), (6.5, 9.5), (9.5, 9.5), (9.5, 6.5)]
    rois = [("BODY", [closed(p, body) for p in places]),
            ("Lung_L", [c for p in places[1:5] for c in (closed(p, outer), closed(p, hole[::-1]))]),
            ("Heart", [closed(places[3], [(5, 13), (12, 16.5), (12, 13.2)], ref=places[3].sop_uid)])]
    ds = build_rtstruct(rois)
    first = sources[0]
    ds.PatientID, ds.StudyInstanceUID = first.PatientID, first.StudyInstanceUID
    frame = ds.ReferencedFrameOfReferenceSequence[0]
    frame.FrameOfReferenceUID = first.FrameOfReferenceUID
    study = frame.RTReferencedStudySequence[0]
    study.ReferencedSOPInstanceUID = first.StudyInstanceUID
    referenced = study.RTReferencedSeriesSequence[0]
    referenced.SeriesInstanceUID = first.SeriesInstanceUID
    images = []
    for place in places:
        image = Dataset()
        image.ReferencedSOPClassUID, image.ReferencedSOPInstanceUID = first.SOPClassUID, place.sop_uid
        images.append(image)
    referenced.ContourImageSequence = DicomSequence(images)
    for roi in ds.StructureSetROISequence:
        roi.ReferencedFrameOfReferenceUID = first.FrameOfReferenceUID
    return ds


def _volume(values: np.ndarray, sources: tuple[Dataset, ...]) -> np.ndarray:
    """``values`` (slices in position order) in the order of ``sources``."""
    rank = {ds.SOPInstanceUID: k for k, ds in enumerate(_by_position(sources))}
    return values[[rank[ds.SOPInstanceUID] for ds in sources]]


@cache
def annotation_seeds() -> dict[str, bytes]:
    """``binary_seg.dcm`` (Liver: a box, Tumour: a box overlapping it), ``fractional_seg.dcm``
    (Liver as fractions 0..1, MaximumFractionalValue 255) and ``rtstruct.dcm``, as bytes."""
    sources = series_datasets()
    binary = np.zeros((GRID.n, GRID.rows, GRID.columns, 2), dtype=bool)
    binary[1:5, 3:12, 2:14, 0] = True
    binary[2:4, 8:14, 10:18, 1] = True
    rng = np.random.default_rng(3)
    fractional = np.zeros((GRID.n, GRID.rows, GRID.columns, 1), dtype=np.float32)
    fractional[0:4, 2:14, 3:17, 0] = rng.integers(0, 256, (4, 12, 14)) / 255.0
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    seeds = {}
    for name, pixels, kind in (("binary_seg.dcm", binary, "BINARY"), ("fractional_seg.dcm", fractional, "FRACTIONAL")):
        path = folder / f"packer-annotation-fuzz-{os.getpid()}-{name}"
        labels = ["Liver", "Tumour"][:pixels.shape[-1]]
        build_seg(path, list(sources), _volume(pixels, sources), labels, kind=kind)
        seeds[name] = path.read_bytes()
        path.unlink()
    out = io.BytesIO()
    _rtstruct(sources).save_as(out, enforce_file_format=True)
    seeds["rtstruct.dcm"] = out.getvalue()
    return seeds


# --------------------------------------------------------------------------------- mutations

UIDS = st.sampled_from(["", "1.2.3", "1.2.840.10008.5.1.4.1.1.2", "0.0", "1." + "9" * 62, "not a uid"])
SHORT_DS = st.sampled_from(["", "x", "nan", "inf", "-inf", "1e308", "-1e400", "0", "-0.5", "1\\2", "7\\8\\9\\10",
                            "2.5", "1e-300"])
POSITION = st.sampled_from(["", "0\\0\\0", "-10\\-8\\31.25", "-10\\-8\\1e9", "nan\\0\\0", "1\\2", "x\\y\\z",
                            "-10\\-8\\32.5\\4", "-9.7\\-8\\30", "1e308\\1e308\\1e308", "-10\\-8\\-1e-300"])
ORIENTATION = st.sampled_from(["", "1\\0\\0\\0\\1\\0", "0\\0\\0\\0\\0\\0", "1\\0\\0\\1\\0\\0", "0\\1\\0\\0\\0\\-1",
                               "1\\0\\0\\0\\1", "nan\\0\\0\\0\\1\\0", "0.7071\\0.7071\\0\\-0.7071\\0.7071\\0",
                               "1e308\\0\\0\\0\\1e308\\0", "1\\0\\0\\0\\1\\0\\0"])
SPACING = st.sampled_from(["", "0\\0", "-1\\1", "0.8", "0.8\\0.6\\1", "nan\\0.6", "1e-300\\1e-300", "0.4\\0.3",
                           "1e308\\1e308", "x\\0.6"])
INTEGER_TEXT = st.sampled_from(["", "0", "1", "2", "3", "4", "-1", "99", "1A", "1.5", "2147483648", "1\\2", " ",
                                "999999"])


def _contour_data(draw: st.DrawFn, old: bytes) -> bytes:
    """ContourData: values edited (scaled, shifted off the plane, non-finite, one dropped) or
    replaced by random points near the series, few or many."""
    text = old.decode("ascii", "replace").strip(" \x00")
    values = text.split("\\") if text else []
    kind = draw(st.sampled_from(["shift", "scale", "odd", "drop", "random", "collapse", "empty"]))
    if kind == "shift" and values:
        at = draw(st.integers(0, len(values) - 1))
        values[at] = draw(st.sampled_from(["nan", "inf", "1e308", "x", "", "1e7", "31.25", "-1e-320"]))
    elif kind == "scale" and values:
        factor = draw(st.sampled_from([0.0, -1.0, 1e-9, 1e5, 3.0]))
        values = [f"{float(v) * factor:.6g}" if v.strip() else v for v in values]
    elif kind == "odd":
        values = values + ["1.0"] * draw(st.integers(1, 2))
    elif kind == "drop" and values:
        del values[draw(st.integers(0, len(values) - 1)):][:3]
    elif kind == "random":
        n = draw(st.sampled_from([1, 2, 3, 4, 7, 50, 700]))
        z = draw(st.sampled_from([30.0, 32.5, 33.75, 35.0, 42.5, 1e5]))
        seed = draw(st.integers(0, 1 << 16))
        xy = np.random.default_rng(seed).uniform(-30, 30, (n, 2))
        values = [f"{v:.4f}" for x, y in xy for v in (x, y, z)]
    elif kind == "collapse" and len(values) >= 3:
        values = values[:3] * draw(st.integers(1, 6))
    else:
        values = []
    raw = "\\".join(values).encode("ascii")
    return raw + b" " * (len(raw) % 2)


#: keyword → the odd values it is set to (text for string VRs, numbers for US)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "NumberOfFrames": INTEGER_TEXT,
    "Rows": ODD_U16,
    "Columns": ODD_U16,
    "BitsAllocated": st.sampled_from([0, 1, 2, 8, 16, 32, 64, 65535]),
    "BitsStored": st.sampled_from([0, 1, 8, 16, 65535]),
    "HighBit": st.sampled_from([0, 7, 15, 65535]),
    "SamplesPerPixel": st.sampled_from([0, 1, 3, 65535]),
    "SegmentationType": st.sampled_from(["", "BINARY", "FRACTIONAL", "LABELMAP", "binary", "PROBABILITY", "X"]),
    "SegmentationFractionalType": st.sampled_from(["", "PROBABILITY", "OCCUPANCY", "X"]),
    "MaximumFractionalValue": st.sampled_from([0, 1, 2, 127, 255, 256, 65535]),
    "SegmentNumber": st.sampled_from([0, 1, 2, 3, 255, 65535]),
    "ReferencedSegmentNumber": st.sampled_from([0, 1, 2, 3, 65535]),
    "SegmentLabel": st.sampled_from(["", "Liver", "Tumour", "liver ", "\x00", "X" * 64]),
    "ImagePositionPatient": POSITION,
    "ImageOrientationPatient": ORIENTATION,
    "PixelSpacing": SPACING,
    "SpacingBetweenSlices": SHORT_DS,
    "SliceThickness": SHORT_DS,
    "ReferencedFrameNumber": INTEGER_TEXT,
    "ReferencedSOPInstanceUID": UIDS,
    "SeriesInstanceUID": UIDS,
    "FrameOfReferenceUID": UIDS,
    "ReferencedFrameOfReferenceUID": UIDS,
    "SOPClassUID": st.sampled_from(["1.2.840.10008.5.1.4.1.1.66.4", "1.2.840.10008.5.1.4.1.1.66.7",
                                    "1.2.840.10008.5.1.4.1.1.481.3", "1.2.840.10008.5.1.4.1.1.2", "", "1.2"]),
    "Modality": st.sampled_from(["SEG", "RTSTRUCT", "CT", "", "seg"]),
    "ContourGeometricType": st.sampled_from(["", "CLOSED_PLANAR", "OPEN_PLANAR", "OPEN_NONPLANAR", "POINT",
                                             "closed_planar ", "X"]),
    "NumberOfContourPoints": INTEGER_TEXT,
    "ROINumber": INTEGER_TEXT,
    "ReferencedROINumber": INTEGER_TEXT,
    "ROIName": st.sampled_from(["", "BODY", "Lung_L", "Heart", "lung l", "\x00"]),
    "ContourData": st.just(None),  # edited from its old value: _contour_data
}
#: sequences whose items (or the whole sequence) a structural mutation deletes, empties or repeats
SEQUENCES = ("PerFrameFunctionalGroupsSequence", "SharedFunctionalGroupsSequence", "SegmentSequence",
             "SegmentIdentificationSequence", "PlanePositionSequence", "PlaneOrientationSequence",
             "PixelMeasuresSequence", "DerivationImageSequence", "SourceImageSequence", "ReferencedSeriesSequence",
             "SegmentedPropertyTypeCodeSequence", "StructureSetROISequence", "ROIContourSequence", "ContourSequence",
             "ContourImageSequence", "ReferencedFrameOfReferenceSequence", "RTReferencedStudySequence",
             "RTReferencedSeriesSequence")
WRONG_VRS = ["UT", "SS", "UL", "OB", "FD", "DS", "IS", "CS", "SQ", "UN", "AT", "US"]
PIXEL_DATA = Tag(0x7FE00010)
#: what pydicom raises decoding an element a mutation left malformed
DECODE_ERRORS = (BytesLengthException, NotImplementedError, ValueError, OSError)


def _walk(ds: Dataset) -> Iterator[tuple[Dataset, BaseTag, str]]:
    """Every (data set, tag, keyword) in ``ds`` and its sequence items, depth first."""
    for tag in list(ds.keys()):
        keyword = pydicom.datadict.keyword_for_tag(tag)
        yield ds, tag, keyword
        try:
            element = ds[tag]
        except DECODE_ERRORS:
            continue  # an element an earlier mutation left undecodable: nothing to walk into
        if element.VR == "SQ" and element.value:
            for item in element.value:
                yield from _walk(item)


def _set_raw(ds: Dataset, tag: BaseTag, vr: str, raw: bytes, implicit: bool, little: bool) -> None:
    ds._dict[tag] = RawDataElement(tag, None if implicit else vr, len(raw), raw, 0, implicit, little)


def _field(draw: st.DrawFn, ds: Dataset, tag: BaseTag, keyword: str, implicit: bool, little: bool) -> None:
    vr = dictionary_VR(tag)
    if draw(st.integers(0, 5)) == 0:  # a wrong VR or value length, as after a flipped byte
        _set_raw(ds, tag, draw(st.sampled_from(WRONG_VRS)), draw(st.binary(max_size=12)), implicit, little)
        return
    if keyword == "ContourData":
        element = ds.get_item(tag)
        old = element.value if isinstance(element, RawDataElement) else None
        if not isinstance(old, bytes):
            value = ds[tag].value
            old = "\\".join(str(v) for v in (value if isinstance(value, list | tuple | DicomSequence) or hasattr(
                value, "__iter__") and not isinstance(value, str) else [value])).encode("ascii")
        _set_raw(ds, tag, vr, _contour_data(draw, old), implicit, little)
        return
    value = draw(FIELDS[keyword])
    if vr == "US":
        raw = struct.pack(("<" if little else ">") + "H", value)
    else:
        raw = str(value).encode("latin-1")
        raw += (b"\x00" if vr == "UI" else b" ") * (len(raw) % 2)
    _set_raw(ds, tag, vr, raw, implicit, little)


def _structural(draw: st.DrawFn, ds: Dataset, tag: BaseTag) -> None:
    """Delete the element, or for a sequence: empty it, drop an item, or repeat one."""
    element = ds[tag]
    kind = draw(st.sampled_from(["delete", "empty", "drop", "repeat"]))
    if kind == "delete" or element.VR != "SQ":
        del ds[tag]
    elif kind == "empty":
        element.value = DicomSequence([])
    elif element.value:
        items = list(element.value)
        at = draw(st.integers(0, len(items) - 1))
        if kind == "drop":
            del items[at]
        else:
            items.insert(at, copy.deepcopy(items[at]))
        element.value = DicomSequence(items)


#: whole-object moves (mm): in plane by a fraction of a pixel, along the normal by half a slice or
#: beyond the series, or both
SHIFTS = st.sampled_from([(0.3, 0.0, 0.0), (0.0, -0.4, 0.0), (0.0, 0.0, 1.25), (0.0, 0.0, 1.0), (0.0, 0.0, -40.0),
                          (0.25, 0.3, 0.6), (0.0, 0.0, 1e-4)])


def _regrid(draw: st.DrawFn, ds: Dataset) -> None:
    """Move the whole object (every frame's Image Position, every contour point) by one shift,
    or give every frame another pixel spacing or orientation: a SEG or RTSTRUCT made on
    another grid than the series, which resampling, placement and slice matching must meet."""
    shift = np.asarray(draw(SHIFTS))
    kind = draw(st.sampled_from(["shift", "spacing", "orientation"]))
    for item, tag, keyword in list(_walk(ds)):
        if kind == "shift" and keyword in ("ImagePositionPatient", "ContourData"):
            values = np.asarray([float(v) for v in item[tag].value], dtype=np.float64).reshape(-1, 3) + shift
            item[tag].value = [f"{v:.6g}" for v in values.ravel()]
        elif kind == "spacing" and keyword == "PixelSpacing":
            item[tag].value = list(draw(st.sampled_from([("0.4", "0.3"), ("1.6", "1.2"), ("0.8", "0.6000001")])))
        elif kind == "orientation" and keyword == "ImageOrientationPatient":
            item[tag].value = list(draw(st.sampled_from([("1", "0", "0", "0", "0.9998", "0.02"),
                                                         ("0", "1", "0", "1", "0", "0"),
                                                         ("1", "0", "0", "0", "0", "-1")])))


@st.composite
def annotation_field_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """Sometimes a move of the whole object (:func:`_regrid`), and 1-3 edits of the fields the
    annotation readers use, anywhere in the nested sequences
    (:data:`FIELDS`: odd values, or a wrong VR and random bytes), or of their sequences
    (:data:`SEQUENCES`: deleted, emptied, an item dropped or repeated), then re-saved."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = pydicom.dcmread(io.BytesIO(data))
        implicit, little = (bool(flag) for flag in ds.original_encoding)
        regrid = draw(st.integers(0, 3)) == 0
        if regrid:
            _regrid(draw, ds)
        for _ in range(draw(st.integers(0 if regrid else 1, 3))):
            places = [(item, tag, keyword) for item, tag, keyword in _walk(ds) if keyword in FIELDS
                      or keyword in SEQUENCES or tag == PIXEL_DATA]
            if not places:
                break
            item, tag, keyword = draw(st.sampled_from(places))
            try:
                if tag == PIXEL_DATA:  # cut short or grown: the frames no longer fit
                    raw = ds[tag].value
                    cut = draw(st.sampled_from([0, 1, len(raw) // 2, len(raw) - 2, len(raw) + 2, 2 * len(raw)]))
                    ds[tag].value = (raw * 3)[:cut + cut % 2]
                elif keyword in SEQUENCES or draw(st.integers(0, 7)) == 0:
                    _structural(draw, item, tag)
                else:
                    _field(draw, item, tag, keyword, implicit, little)
            except DECODE_ERRORS:
                continue  # an element an earlier edit left undecodable: leave it so
        out = io.BytesIO()
        try:
            ds.save_as(out)
        except (*DECODE_ERRORS, TypeError, struct.error, OverflowError, AttributeError, KeyError):
            return data  # this combination cannot even be written; fuzz the original instead
    return out.getvalue()


# ------------------------------------------------------------------------------------ checks


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("annotation-fuzz")
    if os.environ.get("PACKER_FUZZ_REPORT") == "1":
        print("\nannotation fuzz reasons:", dict(sorted(item for item in SEEN.items() if item[0][0] in WHAT)))


WHAT = ("probe_annotation", "link", "paint_seg", "paint_rtstruct", "salvage")


@pytest.fixture(scope="module")
def series(fuzz_dir: Path) -> tuple[Series, dict[str, Any], tuple[SlicePlace, ...]]:
    """The series as the pipeline assembles it (probed with placement, ``assemble``d), its
    files' geometry by sample id, and its SlicePlaces (linked with the unmutated SEG)."""
    folder = fuzz_dir / "ct"
    folder.mkdir()
    files = []
    for k, ds in enumerate(series_datasets()):
        path = folder / f"{k}.dcm"
        ds.save_as(path, enforce_file_format=True)
        ref = SampleRef(sample_id=f"ct{k}", source=SOURCE, kind="dicom", path=str(path), relpath=path.name,
                        entity=str(ds.PatientID))
        header = probe_dicom(ref, entity_keyword="PatientID", time_keywords=(), limits=LIMITS, placement=True)
        assert isinstance(header, DicomHeader) and header.geometry is not None
        files.append((ref, header.geometry))
    assembled = assemble(files, SeriesConfig(min_slices=1, gap_tolerance=float("inf")))
    assert len(assembled.series) == 1 and not assembled.issues
    geometry = {ref.sample_id: g for ref, g in files}
    seed = fuzz_dir / "seed.dcm"
    seed.write_bytes(annotation_seeds()["binary_seg.dcm"])
    header = probe(seed)
    assert isinstance(header, DicomHeader) and header.annotation is not None
    linked, issues = link(assembled.series, geometry, [(annotation_ref(seed), header.annotation)], [],
                          {SOURCE: MASK})
    assert not issues and len(linked) == 1 and len(linked[0].places) == GRID.n
    assert linked[0].places == tuple(_places(series_datasets()))  # the pipeline's places are the test's
    return assembled.series[0], geometry, linked[0].places


def annotation_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="fz", source=SOURCE, kind="dicom", path=str(path), relpath=path.name, entity="SEG1")


def probe(path: Path) -> Any:
    return timed(lambda: probe_dicom(annotation_ref(path), entity_keyword="PatientID", time_keywords=(),
                                     limits=LIMITS, annotations=True))


def check_paint(what: str, call: Any) -> None:
    """A Drawn, or an AnnotationError with a known reason (never unexpected_error)."""
    try:
        drawn = timed(call)
    except AnnotationError as err:
        SEEN[(what, err.reason)] += 1
        assert err.reason in REASONS and err.reason != "unexpected_error", (what, err.reason)
        assert err.message
        return
    assert isinstance(drawn, Drawn), f"{what} returned {type(drawn).__name__}"
    SEEN[(what, "ok")] += 1


def run_annotation(path: Path, data: bytes, choice: dict[str, Any],
                   series: tuple[Series, dict[str, Any], tuple[SlicePlace, ...]]) -> None:
    path.write_bytes(data)
    header = probe(path)
    check_outcome("probe_annotation", header, DicomHeader)
    if not isinstance(header, DicomHeader) or header.annotation is None:
        return
    refs = header.annotation
    assembled, geometry, places = series
    linked, issues = timed(lambda: link([assembled], geometry, [(annotation_ref(path), refs)], [], {SOURCE: MASK}))
    assert all(isinstance(group, AnnotatedSeries) for group in linked)
    for issue in issues:
        assert isinstance(issue, Issue) and issue.reason in REASONS, issue
        SEEN[("link", issue.reason)] += 1
    if not issues:
        SEEN[("link", "ok")] += 1
    dataset = None
    if choice["parsed"]:  # as the pipeline's worker does: parse once, hand the data set over
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dataset = timed(lambda: pydicom.dcmread(path))
        except Exception:  # noqa: BLE001 - the worker's own record (unreadable); paint the path instead
            dataset = None
    if refs.damaged:  # linking keeps its record and never hands it to a painter (its series is held back)
        return
    first = places[0]
    shape = (len(places), first.rows, first.columns)
    if refs.modality == "SEG":
        painter = Painter(shape=shape, structures=SEGMENTS, overlap=choice["overlap"], path=str(path))
        check_paint("paint_seg", lambda: paint_seg(str(path), places, SEGMENTS, painter, threshold=choice["threshold"],
                                                   grid=choice["grid"], dataset=dataset))
    else:
        painter = Painter(shape=shape, structures=ROIS, overlap=choice["overlap"], path=str(path))
        check_paint("paint_rtstruct", lambda: paint_rtstruct(str(path), places, ROIS, painter, dataset=dataset))


CHOICES = st.fixed_dictionaries({"overlap": st.sampled_from(["later_wins", "refuse"]),
                                 "grid": st.sampled_from(["require", "resample"]),
                                 "threshold": st.sampled_from([0.5, 1e-3, 1.0]),
                                 "parsed": st.booleans()})


@st.composite
def mutated_annotation(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = annotation_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    return name, draw(byte_mutations(seeds[name]))


@st.composite
def field_mutated_annotation(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = annotation_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    data = draw(annotation_field_mutations(seeds[name]))
    if draw(st.integers(0, 5)) == 0:
        data = draw(byte_mutations(data))
    return name, data


def _meta_end(data: bytes) -> int:
    """Where a seed's file meta ends: after (0002,0000) File Meta Information Group Length's value."""
    return 132 + 12 + int(struct.unpack_from("<I", data, 132 + 8)[0])


@st.composite
def unparsable_annotation(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """A seed made unparsable where the probe salvages (:mod:`packer.read.annotation_salvage`):
    its ``DICM`` marker overwritten, its file meta gone (the data set alone), or cut inside its
    file meta; then, half the time, byte mutations on top."""
    seeds = annotation_seeds()
    name = draw(st.sampled_from(sorted(seeds)))
    data = seeds[name]
    how = draw(st.sampled_from(["no_dicm", "data_set_alone", "cut_in_meta"]))
    if how == "no_dicm":
        data = data[:128] + draw(st.binary(min_size=4, max_size=4).filter(lambda b: b != b"DICM")) + data[132:]
    elif how == "data_set_alone":
        data = data[_meta_end(data):]
    else:
        data = data[:draw(st.integers(132, _meta_end(data)))]
    mutated = draw(st.booleans())
    if mutated:
        data = draw(byte_mutations(data))
    return name, data, how if not mutated else "mutated"


@settings(FUZZ, max_examples=100 * EXAMPLES)
@given(case=unparsable_annotation(), choice=CHOICES)
def test_fuzz_unparsable_annotations_are_salvaged_or_kept_as_their_records(
        fuzz_dir: Path, series: Any, case: tuple[str, bytes, str], choice: dict[str, Any]) -> None:
    """The salvage path: a header, a known Issue or an Excluded from the probe, known reasons from
    linking, never a crash; and without byte mutations on top, a seed whose DICM marker alone is
    gone is found to be the annotation it is, with the references it holds."""
    name, data, how = case
    run_annotation(fuzz_dir / name, data, choice, series)
    header = probe(fuzz_dir / name)
    refs = header.annotation if isinstance(header, DicomHeader) else None
    SEEN[("salvage", f"{how}:{refs.modality or 'maybe' if refs is not None and refs.damaged else 'other'}")] += 1
    if how == "no_dicm":
        assert refs is not None and refs.damaged and refs.damaged_reason == "not_dicom"
        assert refs.modality == ("RTSTRUCT" if name == "rtstruct.dcm" else "SEG") and refs.series_uids


@st.composite
def damaged_structure_set(draw: st.DrawFn) -> bytes:
    """The RTSTRUCT seed cut at the start of an item inside its ROI Contour Sequence (pydicom
    reads the items before it without a word), or one ReferencedROINumber (3006,0084) rewritten
    as another's; then, a third of the time, byte mutations on top."""
    data = annotation_seeds()["rtstruct.dcm"]
    start = data.index(b"\x06\x30\x39\x00SQ")
    if draw(st.booleans()):
        items = [i for i in range(start, len(data)) if data.startswith(b"\xfe\xff\x00\xe0", i)]
        data = data[:draw(st.sampled_from(items))]
    else:
        numbers = [i for i in range(start, len(data)) if data.startswith(b"\x06\x30\x84\x00IS", i)]
        at = draw(st.sampled_from(numbers)) + 8
        data = data[:at] + draw(st.sampled_from([b"1 ", b"2 ", b"3 "])) + data[at + 2:]
    if draw(st.integers(0, 2)) == 0:
        data = draw(byte_mutations(data))
    return data


@settings(FUZZ, max_examples=60 * EXAMPLES)
@given(data=damaged_structure_set(), choice=CHOICES)
def test_fuzz_structure_sets_that_lose_rois(fuzz_dir: Path, series: Any, data: bytes, choice: dict[str, Any]) -> None:
    run_annotation(fuzz_dir / "rtstruct.dcm", data, choice, series)


@settings(FUZZ, max_examples=150 * EXAMPLES)
@given(case=mutated_annotation(), choice=CHOICES)
def test_fuzz_annotation_bytes(fuzz_dir: Path, series: Any, case: tuple[str, bytes], choice: dict[str, Any]) -> None:
    run_annotation(fuzz_dir / case[0], case[1], choice, series)


@settings(FUZZ, max_examples=300 * EXAMPLES)
@given(case=field_mutated_annotation(), choice=CHOICES)
def test_fuzz_annotation_fields(fuzz_dir: Path, series: Any, case: tuple[str, bytes], choice: dict[str, Any]) -> None:
    run_annotation(fuzz_dir / case[0], case[1], choice, series)


def test_unmutated_seeds_link_and_paint(fuzz_dir: Path, series: Any) -> None:
    """The seeds probe as annotations, link to the series and paint what was planted: the SEG's
    segments overlap (refused under ``refuse``), the RTSTRUCT's lung ring keeps its hole."""
    _, _, places = series
    shape = (len(places), places[0].rows, places[0].columns)
    for name, data in sorted(annotation_seeds().items()):
        path = fuzz_dir / f"seed-{name}"
        path.write_bytes(data)
        header = probe(path)
        assert isinstance(header, DicomHeader) and header.annotation is not None, name
        assert set(header.annotation.instance_uids) <= {p.sop_uid for p in places}, name
        for overlap in ("later_wins", "refuse"):
            structures = ROIS if header.annotation.modality == "RTSTRUCT" else SEGMENTS
            painter = Painter(shape=shape, structures=structures, overlap=overlap, path=str(path))
            try:
                if header.annotation.modality == "SEG":
                    drawn = paint_seg(str(path), places, SEGMENTS, painter)
                else:
                    drawn = paint_rtstruct(str(path), places, ROIS, painter)
            except AnnotationError as err:
                assert (overlap, err.reason) == ("refuse", "mask_overlap") and name != "fractional_seg.dcm", name
                continue
            assert drawn.unmapped == () and drawn.notes == (), (name, drawn)
            labels = painter.labels
            if name == "binary_seg.dcm":
                assert {int(v) for v in np.unique(labels)} == {0, 1, 2}
            elif name == "fractional_seg.dcm":
                assert {int(v) for v in np.unique(labels)} == {0, 1} and labels[4:].max() == 0
            else:
                assert {int(v) for v in np.unique(labels)} == {0, 3, 4, 5}
                assert labels[2, 8, 8] == 3 and labels[2, 5, 5] == 4  # the hole is body, the ring lung
                assert (labels[0] != 4).all() and (labels[5] != 4).all()


def test_field_mutations_reach_nested_fields() -> None:
    """The mutator finds the annotation fields inside the nested sequences (not only at the top)."""
    found: Counter[str] = Counter()
    for data in annotation_seeds().values():
        ds = pydicom.dcmread(io.BytesIO(data))
        found.update(keyword for _, _, keyword in _walk(ds) if keyword in FIELDS or keyword in SEQUENCES)
    for keyword in ("ImagePositionPatient", "ContourData", "ReferencedROINumber", "ReferencedSegmentNumber",
                    "ReferencedSOPInstanceUID", "PerFrameFunctionalGroupsSequence", "NumberOfContourPoints"):
        assert found[keyword] > 0, keyword
    assert tag_for_keyword("ContourData") == 0x30060050


def _edited(name: str, edit: Any) -> bytes:
    ds = pydicom.dcmread(io.BytesIO(annotation_seeds()[name]))
    edit(ds)
    out = io.BytesIO()
    ds.save_as(out)
    return out.getvalue()


def _damaged_uid(ds: Dataset) -> None:
    item = ds.ReferencedSeriesSequence[0].ReferencedInstanceSequence[0]
    tag = Tag(tag_for_keyword("ReferencedSOPInstanceUID") or 0)
    _set_raw(item, tag, "SS", b"\x00" * 9, False, True)


def _series_uid_of_no_value(ds: Dataset) -> None:
    """The referenced series' UID as an empty element of another VR: highdicom reads it as None."""
    _set_raw(ds.ReferencedSeriesSequence[0], Tag(0x0020000E), "SS", b"", False, True)


def _four_coordinates(ds: Dataset) -> None:
    ds.PerFrameFunctionalGroupsSequence[0].PlanePositionSequence[0].ImagePositionPatient = ["-10", "-8", "32.5", "4"]


@pytest.mark.parametrize(("edit", "probed", "painted"), [
    (_damaged_uid, "unreadable", None),
    (_series_uid_of_no_value, "ok", "unreadable"),
    (_four_coordinates, "ok", "annotation_frames"),
], ids=["damaged-nested-uid", "series-without-uid", "four-coordinates"])
def test_what_the_fuzzer_found(fuzz_dir: Path, series: Any, edit: Any, probed: str, painted: str | None) -> None:
    """The crashes the fuzzer found, pinned: each is a reason now."""
    path = fuzz_dir / "found.dcm"
    path.write_bytes(_edited("binary_seg.dcm", edit))
    header = probe(path)
    # references that cannot be decoded reach linking (which records the object as unreadable and
    # keeps its series from packing as empty), no longer a probe Issue
    damaged = not isinstance(header, Issue) and header.annotation is not None and header.annotation.damaged
    assert (header.reason if isinstance(header, Issue) else "unreadable" if damaged else "ok") == probed
    if painted is None:
        return
    places = series[2]
    painter = Painter(shape=(len(places), places[0].rows, places[0].columns), structures=SEGMENTS, path=str(path))
    with pytest.raises(AnnotationError) as caught:
        paint_seg(str(path), places, SEGMENTS, painter)
    assert caught.value.reason == painted


# ------------------------------------------------------------- the raw contour walk against pydicom

UNDEFINED = ("none", "sequence", "items", "images")


def _encoded(data: bytes, implicit: bool, undefined: str) -> bytes:
    """The structure set ``data`` re-saved in implicit or explicit VR little endian, with its
    Contour Sequences (``sequence``), their items (``items``) or their Contour Image Sequences
    (``images``) of undefined length, or none (``none``)."""
    ds = pydicom.dcmread(io.BytesIO(data))
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian
    for roi_contour in ds.ROIContourSequence:
        roi_contour["ContourSequence"].is_undefined_length = undefined == "sequence"
        for contour in roi_contour.ContourSequence:
            contour.is_undefined_length_sequence_item = undefined == "items"
            if "ContourImageSequence" in contour:
                contour["ContourImageSequence"].is_undefined_length = undefined == "images"
    out = io.BytesIO()
    ds.save_as(out, enforce_file_format=True)
    return out.getvalue()


def _painted(path: Path, places: tuple[SlicePlace, ...], walk_raw: bool) -> tuple[Any, ...]:
    """What painting ``path`` gives: the label map and Drawn, or the error's type, reason and message."""
    painter = Painter(shape=(len(places), places[0].rows, places[0].columns), structures=ROIS, path=str(path))
    try:
        drawn = timed(lambda: paint_rtstruct(str(path), places, ROIS, painter, walk_raw=walk_raw))
    except AnnotationError as err:
        return "error", err.reason, err.message
    except Exception as err:  # noqa: BLE001 - compared, not judged: check_paint judges the reasons
        return "raised", type(err).__name__, str(err)
    return "drawn", painter.labels.tobytes(), drawn


@pytest.mark.parametrize("implicit", [False, True], ids=["explicit", "implicit"])
@pytest.mark.parametrize("undefined", UNDEFINED)
def test_raw_contour_walk_reads_plain_sequences_and_leaves_the_rest_to_pydicom(
        fuzz_dir: Path, series: Any, implicit: bool, undefined: str) -> None:
    """The seed structure set in either VR encoding: its Contour Sequences are walked raw where
    every length is defined, left to pydicom where one is not, and both paint the seed's mask."""
    data = _encoded(annotation_seeds()["rtstruct.dcm"], implicit, undefined)
    ds = pydicom.dcmread(io.BytesIO(data))
    walked = [contour_items(roi_contour) for roi_contour in ds.ROIContourSequence]
    counts = [None if w is None else len(w) for w in walked]  # BODY, Lung_L (ring), Heart (its image named)
    assert counts == {"none": [6, 8, 1], "images": [6, 8, None]}.get(undefined, [None, None, None])
    if undefined == "none":
        heart = walked[2][0]  # type: ignore[index]
        assert (heart.kind, heart.declared, heart.image_uids) == ("CLOSED_PLANAR", 3, (series[2][3].sop_uid,))
    path = fuzz_dir / f"walk-{implicit}-{undefined}.dcm"
    path.write_bytes(data)
    raw, parsed = _painted(path, series[2], walk_raw=True), _painted(path, series[2], walk_raw=False)
    assert raw[0] == "drawn" and raw == parsed


@settings(FUZZ, max_examples=300 * EXAMPLES)
@given(implicit=st.booleans(), undefined=st.sampled_from(UNDEFINED), how=st.sampled_from(["fields", "bytes", "both"]),
       data=st.data())
def test_raw_contour_walk_paints_what_pydicom_items_paint(fuzz_dir: Path, series: Any, implicit: bool,
                                                         undefined: str, how: str, data: st.DataObject) -> None:
    """Mutated structure sets (fields, bytes or both; either encoding; undefined lengths or none)
    paint the same mask, notes and unmapped names, or fail with the same reason and message,
    whether their contour items are walked raw or built by pydicom."""
    mutated = _encoded(annotation_seeds()["rtstruct.dcm"], implicit, undefined)
    if how != "bytes":
        mutated = data.draw(annotation_field_mutations(mutated))
    if how != "fields":
        mutated = data.draw(byte_mutations(mutated))
    path = fuzz_dir / "walk.dcm"
    path.write_bytes(mutated)
    assert _painted(path, series[2], walk_raw=True) == _painted(path, series[2], walk_raw=False)
