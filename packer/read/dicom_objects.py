"""What a DICOM object is, from its header: an image to pack, not an image, or an image a job packs only when asked.

Exports from a PACS or a radiotherapy system hold more than images: structured reports (SR),
presentation states (PR), key-object selections (KO), RT plans and treatment records, RT
structure sets and segmentations (masks of other images), encapsulated PDFs, raw data. None of
them is a defect of the export, so none is a bad sample: :func:`exclusion` makes each an
:class:`~packer.records.Excluded` record (``not_image``), counted and listed, never packed.

Some objects are images but not what an image job means by default: an RT Dose grid (Gy, not
HU: windowed as CT it silently pollutes a CT training set), a secondary capture (a screenshot,
often with burned-in text) and, in a slice job, a CT localizer (a projection scout among axial
slices). They are ``not_requested`` unless the source's ``where:`` asks for them by a positive
condition (equality, membership or match, not ``not``) that holds for the file and names them
(:func:`_asked`: a condition that merely holds, ``ImageType: ORIGINAL`` for a scout, does not):
``Modality: RTDOSE`` or ``SOPClassUID: RT Dose Storage`` for RT Dose, ``SOPClassUID`` for a
secondary capture (its Modality is often that of the images it shows), ``ImageType: LOCALIZER``
for a localizer. A slide's label, overview or thumbnail image (Image
Type value 3 in :data:`SLIDE_AUXILIARY`, beside a whole-slide scan's levels: the label's photo
often shows the patient's name) is ``not_requested`` in every job, asked for by ``ImageType``
(``ImageType: LABEL``); asked for, one whose Specimen Label in Image is YES is refused as
burned-in text by the read's safety check. Series jobs leave localizers to the series rule
(``transform.dicom.series.drop_localizers``); there, a projection or other 2-D image with no
place in patient space (a CR, DX, MG or US file, or an NM one but a SPECT reconstruction: planar
scintigraphy and SPECT projections, without Image Position (Patient), nor a Plane Position
(Patient) in its functional groups, :data:`PROJECTION_MODALITIES`) is ``not_requested``
instead (``Modality`` asks for it, and then the series rule refuses it as ``series_no_position``),
since it is no broken slice.

The source's ``where:`` header conditions (:func:`header_failure`) are tested first, from the
header alone: a file they leave out is ``filtered``, whatever its class; but only a header that
was read well (:func:`header_unread`): a damaged one is a bad sample, whatever its ``where:``.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydicom.datadict import dictionary_VR, keyword_dict
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue
from pydicom.uid import UID_dictionary

from packer.errors import ConfigError
from packer.read.dicom_attrs import (
    DamagedElement,
    FramesDisagree,
    file_level,
    sequence_items,
    sop_class_name,
    spelled_value,
    tag_key_problem,
    value_form_problem,
    valueless_problem,
)
from packer.where import Condition, failed

#: RT Dose Storage (PS3.4 B.5): a dose grid, Gy after Dose Grid Scaling, not HU.
RT_DOSE = "1.2.840.10008.5.1.4.1.1.481.2"
#: Secondary Capture Image Storage, whose UID begins each of its multi-frame classes' UIDs
SECONDARY_CAPTURE_UID = "1.2.840.10008.5.1.4.1.1.7"
#: Secondary Capture Image Storage and its multi-frame classes (PS3.4 B.5).
SECONDARY_CAPTURE = frozenset({
    "1.2.840.10008.5.1.4.1.1.7",    # Secondary Capture Image Storage
    "1.2.840.10008.5.1.4.1.1.7.1",  # Multi-frame Single Bit Secondary Capture Image Storage
    "1.2.840.10008.5.1.4.1.1.7.2",  # Multi-frame Grayscale Byte Secondary Capture Image Storage
    "1.2.840.10008.5.1.4.1.1.7.3",  # Multi-frame Grayscale Word Secondary Capture Image Storage
    "1.2.840.10008.5.1.4.1.1.7.4",  # Multi-frame True Color Secondary Capture Image Storage
})
#: Objects that describe other images (masks, contours), pixel data or not: not images of their own.
#: A job packs them as masks with ``mask: {from: dicom}`` (:mod:`packer.read.dicom_masks`); any
#: other job leaves them out as not_image.
MASK_CLASSES = frozenset({
    "1.2.840.10008.5.1.4.1.1.66.4",   # Segmentation Storage (SEG: binary or fractional frames)
    "1.2.840.10008.5.1.4.1.1.66.5",   # Surface Segmentation Storage
    "1.2.840.10008.5.1.4.1.1.481.3",  # RT Structure Set Storage (RTSTRUCT: contours)
})
#: The SOP classes whose valid objects hold Rows and Columns without pixel data: MR Spectroscopy
#: Storage (PS3.3 A.49: its MR Spectroscopy module's voxel grid, beside Spectroscopy Data). Any
#: other class's file with Rows and Columns but no pixel data is an image that lost its pixels.
GRID_WITHOUT_PIXELS = frozenset({"1.2.840.10008.5.1.4.1.1.4.2"})
#: Modality values (PS3.3 C.7.3.1.1.1) of objects that hold no image to train on.
NOT_IMAGE_MODALITIES = frozenset({"SR", "PR", "KO", "RTPLAN", "RTRECORD", "RTSTRUCT", "SEG", "DOC", "REG", "FID",
                                  "PLAN", "RWV", "ECG", "HD", "AU", "RESP"})
_PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")
#: Image Type value 3 (PS3.3 C.8.12.4.1.1) of the images of a slide that are no tissue at the
#: scan's resolution: the photo of the slide's label (accession number, barcode, often the
#: patient's name), the macro photo of the whole slide (which shows the label too) and a
#: thumbnail. A whole-slide export holds them beside the pyramid levels (value 3 VOLUME).
SLIDE_AUXILIARY = ("LABEL", "OVERVIEW", "THUMBNAIL")
#: Modalities of projection and other 2-D images (radiographs, mammograms, angiography and
#: fluoroscopy runs, ultrasound, photographs, slide scans): no slice of a cross-sectional stack.
#: In a series job one that has no place in patient space is left out, not refused as a broken series.
PROJECTION_MODALITIES = frozenset({"CR", "DX", "MG", "IO", "PX", "RG", "XA", "RF", "US", "IVUS", "ES", "XC", "OP",
                                   "SM", "GM", "DG"})
#: Image Type value 3 of an NM object whose frames are reconstructed slices (PS3.3 C.8.4.7.1.1):
#: a SPECT reconstruction. Every other NM object is 2-D as a radiograph is: a gamma camera's
#: STATIC, DYNAMIC, GATED or WHOLE BODY image, and the projections of a SPECT acquisition (TOMO,
#: GATED TOMO: one frame per detector angle, the raw data a reconstruction is made from).
NM_RECONSTRUCTED = frozenset({"RECON TOMO", "RECON GATED TOMO"})


def _planar(ds: Dataset, modality: str) -> bool:
    """Whether a ``modality`` image is projection or other 2-D imaging (:data:`PROJECTION_MODALITIES`,
    and NM but a reconstruction: Image Type value 3 in :data:`NM_RECONSTRUCTED`, or a Slice Vector)."""
    if modality == "NM":
        image_type = {value.strip().upper() for value in header_values(ds, "ImageType")}
        return not (image_type & NM_RECONSTRUCTED or "SliceVector" in ds)
    return modality in PROJECTION_MODALITIES


_FUNCTIONAL_GROUPS = ("SharedFunctionalGroupsSequence", "PerFrameFunctionalGroupsSequence")


def _placed(ds: Dataset) -> bool:
    """Whether ``ds`` has a place in patient space: a top-level Image Position (Patient), or a Plane
    Position (Patient) Sequence in its shared or any frame's functional groups (Enhanced CT/MR/PET,
    Breast Tomosynthesis). Functional groups alone are no place: a Breast Projection X-Ray, an
    Enhanced XA/XRF run or a multi-frame DX holds them (Pixel Measures, Frame Content, X-Ray
    Geometry) for 2-D frames that no series can stack. A group that cannot be decoded counts as a
    place, so that the series rule, which reads the positions, says what is damaged."""
    if "ImagePositionPatient" in ds:
        return True
    for keyword in _FUNCTIONAL_GROUPS:
        try:
            groups = sequence_items(ds, keyword)
        except DamagedElement:
            return True
        if any("PlanePositionSequence" in group for group in groups):
            return True
    return False


@functools.cache
def _sop_names() -> dict[str, str]:
    """Lower-cased SOP class name and keyword → UID, from pydicom's UID dictionary. A name a
    retired class shares with its successor (``Ultrasound Image Storage``: ...1.1.6, retired, and
    ...1.1.6.1) is the current class's; the retired one keeps its keyword (``...Retired``)."""
    out: dict[str, str] = {}
    current_first = sorted(UID_dictionary.items(), key=lambda item: bool(item[1][3]))  # stable: "" before "Retired"
    for uid, (name, kind, _info, _retired, keyword) in current_first:
        if kind == "SOP Class":
            out.setdefault(name.lower(), uid)
            out.setdefault(keyword.lower(), uid)
    return out


def sop_class_uid(text: str) -> str | None:
    """The SOP Class UID ``text`` names: a UID (digits and dots, returned as given), or a name
    or keyword pydicom knows (``RT Dose Storage``, ``RTDoseStorage``, any case); None otherwise."""
    text = text.strip()
    if text and all(part.isdigit() for part in text.split(".")):
        return text
    return _sop_names().get(text.lower())


def is_header_keyword(key: str) -> bool:
    """Whether ``key`` is a DICOM keyword of pydicom's data dictionary (``Modality``, ``ImageType``)."""
    return key in keyword_dict


def keyword_suggestion(key: str) -> str | None:
    """The DICOM keyword closest to ``key`` (``modality`` → ``Modality``), None when none is close."""
    lowered = {k.lower(): k for k in keyword_dict}
    if key.lower() in lowered:
        return lowered[key.lower()]
    close = difflib.get_close_matches(key, list(keyword_dict), n=1, cutoff=0.8)
    return close[0] if close else None


#: Attributes with a value a ``where:`` compares, as its refusals name them
_VALUED = "e.g. Modality, SOPClassUID, ImageType, SeriesDescription"


#: The VRs whose one value may hold a backslash (PS3.5 6.2: text, not a list of values)
_BACKSLASH_TEXT = ("LT", "ST", "UT")


def _one_value_at_a_time(condition: Condition, value: str) -> str:
    """Why a ``where:`` value holding a backslash (``DERIVED\\SECONDARY\\MPR``, as dcmdump shows a
    multi-valued attribute) never equals a value of ``condition.key``, and what to write instead."""
    parts = [part.strip() for part in value.split("\\") if part.strip()] or [value]
    one, listed = parts[-1], f"[{', '.join(parts)}]"
    if condition.op == "not":
        one, listed = f"{{not: [{one}]}}", f"{{not: {listed}}}"
    key = condition.key
    return (f"a backslash separates the values of a multi-valued attribute (PS3.5 6.4), and a condition tests "
            f"each value of {key} alone, so no value is '{value}'; write the one value that tells the files apart, "
            f"e.g. {key}: {one}, or a list, {key}: {listed} ({'none' if condition.op == 'not' else 'any one'} of "
            "them)")


def check_header_conditions(conditions: Sequence[Condition], where: str) -> tuple[Condition, ...]:
    """The ``where:`` header conditions as the probe tests them: SOPClassUID values given by name
    become UIDs. Raises ConfigError for a key written as a tag (``(0008,0060)``:
    :func:`~packer.read.dicom_attrs.tag_key_problem` names its keyword), a sequence attribute
    (no value to compare), one that holds bytes (PixelData:
    :func:`~packer.read.dicom_attrs.valueless_problem`), a SOP class name pydicom does not
    know (naming close ones), or a value no header can hold (an ISO ``2024-01-10`` for a DA:
    :func:`~packer.read.dicom_attrs.value_form_problem`), which would never match."""
    out = []
    for condition in conditions:
        tagged = tag_key_problem(condition.key)
        if tagged is not None:  # (0008,0060): read by keyword only, so told the keyword it is
            raise ConfigError(f"{where}.{condition.key}: {tagged}")
        if dictionary_VR(condition.key) == "SQ":
            raise ConfigError(f"{where}.{condition.key}: a sequence has no value to compare; name an attribute "
                              f"with a value ({_VALUED})")
        valueless = valueless_problem(condition.key)
        if valueless is not None:  # bytes (PixelData): their repr is no value a job could write
            raise ConfigError(f"{where}.{condition.key}: {valueless}, so there is nothing to compare; name an "
                              f"attribute with a value ({_VALUED})")
        numbers = condition.numbers or (None,) * len(condition.values)
        for value, number in zip(condition.values, numbers, strict=True) if condition.op != "match" else ():
            # a pattern finds part of a value
            if "\\" in value and dictionary_VR(condition.key) not in _BACKSLASH_TEXT:
                # quoted as written: repr would double each backslash
                raise ConfigError(f"{where}.{condition.key}: '{value}' never matches: "
                                  f"{_one_value_at_a_time(condition, value)}")
            # a number the job wrote (StudyTime: 083000, YAML's 83000) compares by value, 083000 as 83000,
            # not by its digits' form
            form = value_form_problem(condition.key, value) if number is None else None
            if form is not None:
                raise ConfigError(f"{where}.{condition.key}: {value!r} never matches: {form}, and a where: value "
                                  "is compared with the header's value as written; write it so, or find part of it "
                                  "with {match: REGEX}")
        if condition.key != "SOPClassUID" or condition.op == "match":
            out.append(condition)
            continue
        uids = []
        for value in condition.values:
            uid = sop_class_uid(value)
            if uid is None:
                names = [name for name in _sop_names() if " " in name]
                close = [UID_dictionary[_sop_names()[c]][0]
                         for c in difflib.get_close_matches(value.lower(), names, n=3, cutoff=0.6)]
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ConfigError(f"{where}.SOPClassUID: {value!r} is neither a UID nor a SOP class name pydicom "
                                  f"knows (e.g. 'RT Dose Storage', 'CT Image Storage'){hint}")
            uids.append(uid)
        out.append(Condition(condition.key, condition.op, tuple(uids)))
    return tuple(out)


def header_values(ds: Dataset, keyword: str) -> list[str]:
    """The values of ``keyword`` in ``ds`` as text, every value of a multi-valued attribute
    (ImageType: ``ORIGINAL``, ``PRIMARY``, ``LOCALIZER``); the SOP Class UID also by its name,
    so that ``match`` can find ``Secondary Capture``; each value as
    :func:`~packer.read.dicom_attrs.spelled_value` spells it, as the entity and the label
    attribute read it (a person name without trailing empty components, a float32 as the number
    the file holds: an FL 0.1 is ``0.1``, not its float64 widening). An attribute absent at the top
    level is read from the functional groups (:func:`~packer.read.dicom_attrs.file_level`:
    FrameLaterality, and ImageLaterality as it, of a Breast Tomosynthesis file). Empty when
    absent or undecodable, or where the frames disagree (:func:`header_failure` says so)."""
    try:
        return _held_values(ds, keyword)
    except (FramesDisagree, DamagedElement):
        return []


def _held_values(ds: Dataset, keyword: str) -> list[str]:
    """:func:`header_values`, raising :class:`~packer.read.dicom_attrs.FramesDisagree` and
    :class:`~packer.read.dicom_attrs.DamagedElement` as :func:`file_level` does."""
    held = file_level(ds, keyword)
    if held is None:
        return []
    ds, keyword = held
    try:
        value = ds.get(keyword)
        vr = ds[keyword].VR if keyword in ds else ""
    except (KeyError, ValueError, TypeError):
        return []
    if value is None:
        return []
    listed = value if isinstance(value, (MultiValue, list, tuple)) else [value]
    values = [spelled_value(v, vr) for v in listed]
    if keyword == "SOPClassUID" and values:
        values.append(sop_class_name(values[0]))
    return values


def _shown(values: Sequence[str]) -> str:
    """The values of a multi-valued attribute as DICOM (and dcmdump) writes them: ``ORIGINAL\\PRIMARY\\AXIAL``."""
    return "\\".join(values)


def header_failure(ds: Dataset, conditions: Sequence[Condition]) -> str | None:
    """Why ``ds`` fails the source's header ``conditions`` (``Modality is RTDOSE, where: Modality
    = CT``), None when it meets them all. A condition on an attribute whose frames hold different
    values (FrameLaterality L in some, R in others) fails: a ``where:`` keeps or leaves out a whole
    file, and neither value is the file's."""
    lookup: dict[str, list[str]] = {}
    for asked in conditions:  # each attribute looked up once (the per-frame groups walked once)
        try:
            lookup[asked.key] = _held_values(ds, asked.key)
        except FramesDisagree as err:
            return f"{err}, so the file has no one value, where: {asked.describe()}"
        except DamagedElement:
            lookup[asked.key] = []  # read as absent, as an undecodable top-level value is
    condition = failed(conditions, lookup)
    if condition is None:
        return None
    shown = [v for v in lookup[condition.key] if v.strip()]
    if condition.key == "SOPClassUID" and shown:
        shown = [sop_class_name(shown[0])]
    has = f"{condition.key} is {_shown(shown)}" if shown else f"{condition.key} is absent"
    return f"{has}, where: {condition.describe()}"


def header_unread(ds: Dataset) -> bool:
    """Whether ``ds`` is a header that was not read well, which no ``where:`` may judge: its file
    meta names an image SOP class, but the data set has neither its own (0008,0016) SOP Class UID
    (Type 1 in every object) nor an Image Pixel module. Such a data set is what a damaged file (or
    one whose file meta names another transfer syntax than its data set's) reads as: its
    attributes are absent because they were not read, and ``Modality is absent`` would hide a
    damaged image as ``filtered`` (a file left out on purpose) instead of a bad sample."""
    if "SOPClassUID" in ds or has_pixels(ds) or ("Rows" in ds and "Columns" in ds):
        return False
    meta = getattr(ds, "file_meta", None)
    uid = str(meta and meta.get("MediaStorageSOPClassUID", "") or "").strip()
    known = UID_dictionary.get(uid)
    return known is not None and known[1] == "SOP Class" and ("Image" in known[0] or uid == RT_DOSE)


#: A UID as PS3.5 9.1 writes one: numeric components without leading zeros, dot-separated, 64 characters at most
_UID = re.compile(r"(?=.{1,64}$)(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))+")


@dataclass(frozen=True)
class ObjectClass:
    """What a DICOM object is: ``modality`` and SOP class (``sop_class``: its name, or the UID
    pydicom does not know), and where it is left out by default, ``why`` (``not_image``,
    ``not_requested``) with ``detail`` (what it is, and for ``not_requested`` how to ask for it)."""

    modality: str
    sop_class: str
    why: str | None = None
    detail: str = ""


#: Image Type values (PS3.3 C.7.6.1.1.2, C.8.12.4.1.1) of images no job leaves out by default: a
#: ``match`` that finds one of them is too broad to name a localizer or a slide's label, overview or thumbnail
PLAIN_IMAGE_TYPES = ("ORIGINAL", "DERIVED", "PRIMARY", "SECONDARY", "AXIAL", "VOLUME", "RESAMPLED", "NONE", "OTHER")
#: Modalities (PS3.3 C.7.3.1.1.1) but RTDOSE: a ``match`` that finds one of them is too broad to name RT Dose
OTHER_MODALITIES = tuple(sorted({"CT", "MR", "PT", "NM", "OT", "RTIMAGE"} | NOT_IMAGE_MODALITIES
                                | PROJECTION_MODALITIES))


@functools.cache
def _other_image_classes(kind: frozenset[str]) -> tuple[str, ...]:
    """The UID and name of each image SOP class of pydicom's dictionary (its name says Image, or RT
    Dose) that is not in ``kind``: a ``match`` that finds one of them is too broad to name ``kind``."""
    return tuple(text for uid, (name, what, *_) in UID_dictionary.items()
                 if what == "SOP Class" and ("Image" in name or uid == RT_DOSE) and uid not in kind
                 for text in (uid, name))


@functools.lru_cache(maxsize=256)
def _broad(condition: Condition, others: tuple[str, ...]) -> bool:
    """Whether ``condition`` holds for any of ``others`` (once per condition and kind, not per file)."""
    return condition.holds(others)


@functools.lru_cache(maxsize=256)
def _spells(pattern: str, words: tuple[str, ...]) -> bool:
    """Whether the text of ``pattern`` writes out one of ``words`` (any case; a backslash before
    punctuation or a space dropped, so ``1\\.2\\.840`` is ``1.2.840``), not as part of a longer
    number: ``^(CT|RTDOSE)$`` writes RTDOSE, ``...1\\.1\\.7`` the SC class UID, while
    ``...1\\.1\\.77`` (VL Endoscopic) does not."""
    text = re.sub(r"\\([^\w])", r"\1", pattern)
    return any(re.search(rf"(?<!\d){re.escape(word)}(?!\d)", text, re.IGNORECASE) for word in words)


def _asked(conditions: Iterable[Condition], ds: Dataset, kinds: Mapping[str, tuple[Sequence[str], tuple[str, ...]]],
           spelled: tuple[str, ...] = ()) -> bool:
    """Whether a positive condition (not ``not``) that holds for ``ds`` names what it is: ``kinds``
    maps each key that may name it to the values that do (``LOCALIZER``, ``RTDOSE``, a SOP class's
    UID and name) and the values of the key that do not (``ORIGINAL``, ``CT``, other image classes).
    A value or a list names it when one of its values is one that does; a ``match`` when its
    pattern's text writes out one of ``spelled`` (the kind's own word: ``LOCALIZER``, ``RTDOSE``,
    ``RT Dose``, ``Secondary Capture``, the SC class UID; :func:`_spells`) and finds that word (a
    negative lookahead, ``^(?!LOCALIZER$)``, writes it to keep it out), as ``{match:
    '^(CT|RTDOSE)$'}`` stands for the list ``[CT, RTDOSE]``, or when it finds one that does and
    none that does not: ``{ImageType: ORIGINAL}`` holds for a scout (ORIGINAL\\PRIMARY\\LOCALIZER)
    but names no localizer, nor does ``{match: .}``, while ``{match: localizer}`` and ``{match:
    ^LOCAL}`` do; ``{SOPClassUID: {match: Image Storage}}`` names every image class, so no
    secondary capture, while ``{match: Secondary Capture}`` names the five SC classes only."""
    for c in conditions:
        if c.op == "not" or c.key not in kinds or not c.holds(header_values(ds, c.key)):
            continue
        naming, others = kinds[c.key]
        # a pattern that writes the kind's word and finds it: '^(?!LOCALIZER$)' writes it to keep it out
        if c.op == "match" and any(_spells(c.values[0], (word,)) and c.holds((word,)) for word in spelled):
            return True
        if c.holds(naming) and (c.op == "in" or not _broad(c, others)):
            return True
    return False


def has_pixels(ds: Dataset) -> bool:
    """Whether ``ds`` holds pixel data: Pixel Data, Float Pixel Data or Double Float Pixel Data
    (PS3.3 C.7.6.3). Rows and Columns alone are no image: an MR Spectroscopy object's module holds
    them (its voxel grid) beside Spectroscopy Data (:data:`GRID_WITHOUT_PIXELS`)."""
    return any(k in ds for k in _PIXEL_KEYWORDS)


def _grid(ds: Dataset) -> bool:
    """Whether ``ds`` has Rows and Columns (an Image Pixel module's, or a module's own grid)."""
    return "Rows" in ds and "Columns" in ds


def _slide_auxiliary(ds: Dataset) -> str | None:
    """The :data:`SLIDE_AUXILIARY` value of ``ds``'s Image Type value 3, None where it holds none."""
    values = [v.strip().upper() for v in header_values(ds, "ImageType")]
    return values[2] if len(values) > 2 and values[2] in SLIDE_AUXILIARY else None


def classify(ds: Dataset, conditions: Sequence[Condition], *, slices: bool, pixels: bool | None = None) -> ObjectClass:
    """What ``ds`` is, and whether an image job leaves it out by default (see the module doc).

    ``conditions``: the source's header ``where:`` (checked already: here they only ask for
    RT Dose, secondary captures, localizers); ``slices``: the job packs single files (not
    series, whose localizers the series rule handles); ``pixels``: whether the file holds pixel
    data where ``ds`` was read without it (a header-only parse stops before it), None where ``ds``
    holds all the file does (:func:`has_pixels`). A file of an image SOP class without pixel data,
    or of any standard class but :data:`GRID_WITHOUT_PIXELS` with Rows and Columns but no pixel
    data, is no exclusion: the read calls it ``no_pixel_data``, a real defect. A vendor's private
    class without pixel data is left out whatever it holds (its spectrum in private tags).
    """
    meta_uid = str(getattr(ds, "file_meta", None) and ds.file_meta.get("MediaStorageSOPClassUID", "") or "").strip()
    # a DICOMDIR (Media Storage Directory Storage) names its class in its file meta only
    uid = next(iter(header_values(ds, "SOPClassUID")), "").strip() or meta_uid
    # no image: no pixel data, and no Rows and Columns either unless the class holds them without
    # pixels (an image object of a class whose name lacks "Image", a Parametric Map or an Enhanced
    # US Volume, that lost its pixels is a damaged image, no_pixel_data, not an object without one)
    imageless = not (has_pixels(ds) or pixels) and (not _grid(ds) or uid in GRID_WITHOUT_PIXELS)
    modality = str(ds.get("Modality", "") or "").strip().upper()
    name = sop_class_name(uid)
    what = f"Modality {modality or '(none)'} ({name})"
    known = UID_dictionary.get(uid)
    non_image_class = known is not None and known[1] == "SOP Class" and "Image" not in known[0] and uid != RT_DOSE
    # a vendor's own SOP class (Siemens CSA Non-Image, Philips Private MR Series Data) without an
    # image: a well-formed object of a class no standard names, not a damaged image
    private_class = (known is None and not uid.startswith("1.2.840.10008.") and _UID.fullmatch(uid) is not None
                     and meta_uid in ("", uid))  # a damaged UID, or one its file meta contradicts, is no class
    # Rows and Columns do not make a private class's object an image that lost its pixels: Philips'
    # Private MR Spectrum and Siemens' CSA Non-Image objects hold them beside a spectrum kept in
    # private tags (a private image cut exactly before its pixel data is the rarer file)
    if private_class and modality not in NOT_IMAGE_MODALITIES and not (has_pixels(ds) or pixels):
        return ObjectClass(modality, name, "not_image", f"{what}: a vendor's private object, without pixel "
                                                        "data (a spectrum or other data in private tags)")
    if uid in MASK_CLASSES or modality in NOT_IMAGE_MODALITIES or (non_image_class and imageless):
        mask = (" (to pack it as the mask of its series, give the source mask: {from: dicom, segments/rois: "
                "...})") if uid in MASK_CLASSES or modality in ("RTSTRUCT", "SEG") else ""
        return ObjectClass(modality, name, "not_image", f"{what} holds no image to pack{mask}")
    if (uid == RT_DOSE or modality == "RTDOSE") and imageless:
        # PS3.3 A.18.3: the Image Pixel module is required only where the dose is grid-based, so
        # Rows and Columns without pixel data are a grid that lost them (read: no_pixel_data)
        return ObjectClass(modality, name, "not_image",
                           f"{what} holds no image to pack: an RT Dose with no dose grid (no Pixel Data), only "
                           "dose-volume histograms (DVH Sequence) or point doses")
    if uid == RT_DOSE or modality == "RTDOSE":
        dose = {"Modality": (["RTDOSE"], OTHER_MODALITIES),
                "SOPClassUID": ([RT_DOSE, sop_class_name(RT_DOSE)], _other_image_classes(frozenset({RT_DOSE})))}
        if not _asked(conditions, ds, dose, ("RTDOSE", "RT Dose", RT_DOSE)):
            return ObjectClass(modality, name, "not_requested",
                               f"{what}: a dose grid (absorbed dose in Gy, not image intensities such as HU) is packed "
                               "only when asked; to pack it add to the source where: {Modality: RTDOSE} (or list "
                               "RTDOSE among the modalities)")
    elif uid in SECONDARY_CAPTURE:
        if not _asked(conditions, ds, {"SOPClassUID": (header_values(ds, "SOPClassUID"),
                                                        _other_image_classes(SECONDARY_CAPTURE))},
                      ("Secondary Capture", SECONDARY_CAPTURE_UID)):
            return ObjectClass(modality, name, "not_requested",
                               f"{what}: a secondary capture (a screenshot, often with burned-in text) is packed "
                               f"only when asked; to pack it add to the source where: {{SOPClassUID: {name}}} "
                               "(every SC class, multi-frame included: {SOPClassUID: {match: Secondary Capture}})")
    elif (auxiliary := _slide_auxiliary(ds)) is not None:
        own = [v for v in header_values(ds, "ImageType") if v.strip().upper() == auxiliary]
        if not _asked(conditions, ds, {"ImageType": (own, PLAIN_IMAGE_TYPES)}, (auxiliary,)):
            return ObjectClass(modality, name, "not_requested",
                               f"{what} is a slide's {auxiliary} image (Image Type "
                               f"{_shown(header_values(ds, 'ImageType'))}), not tissue at the scan's resolution; "
                               "a label or overview photo often shows the patient's name or accession number. To "
                               f"pack such images add to the source where: {{ImageType: {auxiliary}}} (one that "
                               "shows the label is then refused as burned-in text, unless "
                               "safety.burned_in_annotation: allow)")
    elif not slices and _planar(ds, modality) and not _placed(ds):
        if not _asked(conditions, ds, {"Modality": (header_values(ds, "Modality"), ())}):
            return ObjectClass(modality, name, "not_requested",
                               f"{what}: a projection or 2-D image with no place in patient space (no Image "
                               "Position (Patient), nor Plane Position (Patient) in functional groups), not a slice "
                               "of a series; a series job (sample: {neighbors: k} "
                               "or volume) stacks cross-sectional slices (CT, MR, PT, ...): pack such images in a "
                               "job with sample: slice, or leave them out with the source's where: {Modality: "
                               "[CT, MR]}")
    elif slices and "LOCALIZER" in [v.strip().upper() for v in header_values(ds, "ImageType")]:
        own = [v for v in header_values(ds, "ImageType") if v.strip().upper() == "LOCALIZER"]
        if not _asked(conditions, ds, {"ImageType": (own, PLAIN_IMAGE_TYPES)}, ("LOCALIZER",)):
            return ObjectClass(modality, name, "not_requested",
                               f"{what} is a localizer (Image Type {_shown(header_values(ds, 'ImageType'))}), a "
                               "scout, not a slice; to pack localizers add to the source where: "
                               "{ImageType: LOCALIZER}")
    return ObjectClass(modality, name)
