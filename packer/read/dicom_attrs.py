"""Read the intensity and geometry attributes of a DICOM dataset, frame by frame.

Enhanced multi-frame images (Enhanced CT/MR/XA, PS3.3 C.7.6.16) keep Rescale Slope/Intercept,
Window Center/Width and Pixel Spacing in functional groups: look up the Per-Frame Functional
Groups item of the frame first, then the Shared Functional Groups, then the top level of the
dataset (the order highdicom uses). Nothing here mutates the dataset.

pydicom decodes an element on first access. ``packer.read.dicom`` decodes the top level right
after parsing, through :func:`convert_faithfully` (text whose bytes the declared character set
cannot decode is kept, not replaced); elements inside sequence items are read here through
:func:`element`, which turns a damaged one into :class:`DamagedElement` (a ``ValueError``) naming
the tag. Nothing here changes a value the file holds.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
import struct
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any, ParamSpec, TypeVar

import numpy as np
from pydicom import config as pydicom_config
from pydicom.charset import CODES_TO_ENCODINGS, convert_encodings, default_encoding, python_encoding
from pydicom.datadict import dictionary_description, dictionary_VR, keyword_for_tag, tag_for_keyword
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.errors import BytesLengthException
from pydicom.multival import MultiValue
from pydicom.sequence import Sequence as PydicomSequence
from pydicom.tag import BaseTag, Tag
from pydicom.uid import UID
from pydicom.valuerep import DA, DT, TM, PersonName

from packer.config import WindowSpec
from packer.transform.dicom import Lut, ModalityTransform, VoiTransform
from packer.transform.window import check_window

RT_DOSE_STORAGE = "1.2.840.10008.5.1.4.1.1.481.2"

P = ParamSpec("P")
R = TypeVar("R")


#: The calls inside :func:`pydicom_quietly` in this process, and what the first one found: calls
#: on threads (builds or checks run from a worker's threads, in-process) share pydicom's settings.
_QUIET: dict[str, Any] = {"count": 0, "mode": None, "warnings": None}
_QUIET_LOCK = threading.Lock()


@contextlib.contextmanager
def pydicom_quietly() -> Iterator[None]:
    """Read with pydicom's own opinions of a header kept off stderr: its check of each value
    against its VR's rules as the value is converted (``reading_validation_mode``, WARN by
    default: a warning, never an error) is off, and the warnings its parser gives while it
    recovers (``Expected explicit VR, but found implicit VR``) are dropped. On a damaged file
    they were printed by every worker, without the file's name, between the progress lines, and
    with the damaged bytes they quote, a patient's name among them. They change nothing packer
    reads: what packer needs it checks itself, and a file it cannot use is a bad sample with its
    reason. Both are process-wide: the first call in sets them, the last one out restores the
    caller's (counted under a lock: calls on threads, each saving and restoring, undid each other
    in the wrong order and left the caller's strict pydicom reading off for good)."""
    with _QUIET_LOCK:
        if _QUIET["count"] == 0:
            _QUIET["mode"] = pydicom_config.settings.reading_validation_mode
            kept = warnings.catch_warnings()
            kept.__enter__()
            warnings.filterwarnings("ignore", category=UserWarning, module=r"pydicom(\.|$)")
            _QUIET["warnings"] = kept
            pydicom_config.settings.reading_validation_mode = pydicom_config.IGNORE
        _QUIET["count"] += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _QUIET["count"] -= 1
            if _QUIET["count"] == 0:
                pydicom_config.settings.reading_validation_mode = _QUIET["mode"]
                _QUIET["warnings"].__exit__(None, None, None)
                _QUIET["mode"] = _QUIET["warnings"] = None


def quiet(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run under :func:`pydicom_quietly`."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with pydicom_quietly():
            return fn(*args, **kwargs)

    return run

# What pydicom raises when it decodes a damaged element on access (a sequence item cut short
# raises OSError or EOFError; an unknown VR NotImplementedError; a bad length BytesLengthException).
#: What pydicom raises converting a damaged element
ELEMENT_ERRORS = (OSError, EOFError, struct.error, NotImplementedError, BytesLengthException, ValueError,
                   TypeError, KeyError, IndexError, OverflowError)


class DamagedElement(ValueError):
    """An element pydicom cannot decode (found on access, usually inside a sequence item)."""


def element(ds: Dataset, keyword: str, default: Any = None) -> Any:
    """``ds.get(keyword, default)``, raising :class:`DamagedElement` (naming the tag) when the
    stored element cannot be decoded."""
    try:
        return ds.get(keyword, default)
    except ELEMENT_ERRORS as err:
        raise DamagedElement(f"{Tag(tag_for_keyword(keyword) or 0)} {keyword} cannot be decoded "
                             f"({type(err).__name__}: {err})") from err


def sequence_items(ds: Dataset, keyword: str) -> tuple[Dataset, ...]:
    """The items of the sequence ``keyword`` of ``ds`` (empty when absent or empty).

    Raises :class:`DamagedElement`, naming the tag, when the element cannot be decoded or holds
    no items: a sequence written with another VR (OB, UN, US in a damaged export) reads back as
    bytes or numbers, whose "items" are ints, and reading on would end in an AttributeError
    outside any reason the file could be given."""
    value = element(ds, keyword)
    if value is None or (isinstance(value, str | bytes) and len(value) == 0):
        return ()
    if not isinstance(value, PydicomSequence) or not all(isinstance(item, Dataset) for item in value):
        raw = ds.get_item(keyword) if isinstance(ds, Dataset) else None
        vr = getattr(raw, "VR", None) or "?"
        raise DamagedElement(f"{Tag(tag_for_keyword(keyword) or 0)} {keyword} holds no sequence items (it reads as "
                             f"VR {vr}, {type(value).__name__}; a sequence is SQ)")
    return tuple(value)


def functional_item(ds: Dataset, frame: int, sequence: str) -> Dataset | None:
    """The first item of ``sequence`` (e.g. PixelValueTransformationSequence) for ``frame``:
    per-frame group, else shared group, else ``None`` (caller falls back to the top level).
    Raises :class:`DamagedElement` when a group cannot be decoded, or is no sequence of items, or
    when the per-frame sequence has no item for ``frame`` (PS3.3 C.7.6.16: one item per frame; the
    frame's own values are lost, and the shared group's would be a guess)."""
    for groups_keyword, index in (("PerFrameFunctionalGroupsSequence", frame),
                                  ("SharedFunctionalGroupsSequence", 0)):
        groups = sequence_items(ds, groups_keyword)
        if groups_keyword.startswith("PerFrame") and groups and len(groups) <= index:
            raise DamagedElement(f"(5200,9230) Per-frame Functional Groups Sequence has {len(groups)} item(s) for "
                                 f"{ds.get('NumberOfFrames', '?')} frames: frame {index} has none")
        if groups_keyword.startswith("PerFrame") and groups and len(groups) > _frame_count(ds, len(groups)):
            raise DamagedElement(f"(5200,9230) Per-frame Functional Groups Sequence has {len(groups)} item(s) for "
                                 f"{ds.get('NumberOfFrames', '?')} frames: which item is which frame's cannot be "
                                 "told (one item per frame, PS3.3 C.7.6.16)")
        if len(groups) > index:
            seq = sequence_items(groups[index], sequence)
            if seq:
                return seq[0]
    return None


class FramesDisagree(ValueError):
    """An attribute a multi-frame file holds per frame, with values that differ between its frames:
    a reading of the whole file (a source's ``where:``, ``label: {attribute: ...}``) has no one value."""


#: Attributes that, where a file has none, read as their frame-level counterpart: Frame Anatomy's
#: Frame Laterality (PS3.3 C.7.6.16.2.8) is what Image Laterality is for a single-frame image, and
#: enhanced objects (Breast Tomosynthesis, Enhanced MG) write laterality only there.
FRAME_COUNTERPARTS: dict[str, str] = {"ImageLaterality": "FrameLaterality"}


def file_level(ds: Dataset, keyword: str) -> tuple[Dataset, str] | None:
    """Where the whole file's value of ``keyword`` is, as ``(data set, keyword)``: ``ds`` where it
    has the attribute with a value at the top level; else the item of a Shared Functional Groups
    macro (a sequence of one item, e.g. Frame Anatomy) that holds it; else frame 1's such item of
    the Per-frame Functional Groups, where every frame holds the same value. An attribute of
    :data:`FRAME_COUNTERPARTS` found nowhere is its counterpart's, looked for the same way. None
    where the file holds neither. Raises :class:`FramesDisagree`, naming the values, where the
    frames' values differ (or some frames have none), and :class:`DamagedElement` where a
    functional group cannot be decoded."""
    for name in (keyword, *((FRAME_COUNTERPARTS[keyword],) if keyword in FRAME_COUNTERPARTS else ())):
        if name in ds and text_value(ds, name) is not None:
            return ds, name
        shared = next((item for group in sequence_items(ds, "SharedFunctionalGroupsSequence")[:1]
                       if (item := _macro_item(group, name)) is not None), None)
        if shared is not None:
            return shared, name
        frames = [_macro_item(group, name) for group in sequence_items(ds, "PerFrameFunctionalGroupsSequence")]
        if any(item is not None for item in frames):
            values = {text_value(item, name) if item is not None else None for item in frames}
            if len(values) > 1:
                shown = ", ".join(sorted(value or "none" for value in values))
                raise FramesDisagree(f"{name} differs between the file's frames ({shown})")
            return next(item for item in frames if item is not None), name
    return None


def _macro_item(group: Dataset, keyword: str) -> Dataset | None:
    """The item of a functional group macro of ``group`` (one functional groups item) that holds
    ``keyword`` with a value, or ``group`` itself where it holds it directly; None otherwise."""
    if keyword in group and text_value(group, keyword) is not None:
        return group
    try:
        macros = [elem.keyword for elem in group if elem.VR == "SQ" and elem.keyword]  # a private one: no keyword
    except ELEMENT_ERRORS as err:
        raise DamagedElement(f"a functional groups item cannot be decoded ({type(err).__name__}: {err})") from err
    for macro in macros:
        for item in sequence_items(group, macro)[:1]:
            if keyword in item and text_value(item, keyword) is not None:
                return item
    return None


def file_text(ds: Dataset, keyword: str) -> str | None:
    """:func:`text_value` of ``keyword`` for the whole file (:func:`file_level`: the top level, else
    the functional groups), ``None`` where the file holds none. Raises :class:`FramesDisagree` and
    :class:`DamagedElement` as :func:`file_level` does."""
    held = file_level(ds, keyword)
    return text_value(*held) if held is not None else None


def _frame_count(ds: Dataset, otherwise: int) -> int:
    """Number of Frames as an integer, ``otherwise`` where it is absent or not one (the frame
    count's own checks name that defect)."""
    try:
        return int(str(ds.get("NumberOfFrames", "")).strip())
    except (TypeError, ValueError):
        return otherwise


def floats(value: Any) -> tuple[float, ...]:
    """A DS/FD value of VM 1-n as a tuple of floats; ``()`` where it is empty or where any entry is
    no finite number. An entry is never dropped alone: the rest shifted into its place would be
    read as other values ("NaN\\0.5\\0.7" as a Pixel Spacing of 0.5 x 0.7). What packer places
    images by reads through :func:`decimals`, which refuses such a value instead."""
    if value is None or value == "":
        return ()
    iterable = hasattr(value, "__iter__") and not isinstance(value, str | bytes)
    items = list(value) if iterable else [value]
    out = []
    for item in items:
        try:
            number = float(item)
        except (TypeError, ValueError):
            return ()
        if not np.isfinite(number):
            return ()
        out.append(number)
    return tuple(out)


class MalformedValue(DamagedElement):
    """An element that decodes, but whose value is not what packer needs it to be (a decimal
    comma, a ``NaN``, a count other than its VM): its message names the element, quotes the value
    as written and says the fix."""


def _written(items: list[Any]) -> str:
    return "\\".join(str(item).strip() for item in items)


def decimals(source: Dataset, keyword: str, count: int, *, positive: bool = False) -> tuple[float, ...] | None:
    """The DS value ``keyword`` of ``source`` as exactly ``count`` finite numbers (each above 0
    where ``positive``); ``None`` where the element is absent or empty.

    Raises :class:`MalformedValue` where it is present but holds another count of values, or an
    entry that is no such number: a geometry value read as absent would place the image by a
    fallback (no position, no resample, the Slice Thickness), and one read without its bad entry
    would shift the rest into its place (Image Position "0\\NaN\\0\\4" at (0, 0, 4)).
    """
    raw = element(source, keyword)
    iterable = hasattr(raw, "__iter__") and not isinstance(raw, str | bytes)
    items = list(raw) if iterable else [] if raw is None or str(raw).strip() == "" else [raw]
    if not items:
        return None
    out: list[float] = []
    problem = "" if len(items) == count else f"it holds {len(items)} value(s), not {count}"
    for n, item in enumerate(items, 1):
        try:
            number = float(item)
        except (TypeError, ValueError):
            number = float("nan")
        if not problem and (not np.isfinite(number) or (positive and number <= 0)):
            comma = " (a decimal comma: DS writes a period)" if "," in str(item) else ""
            problem = f"value {n} '{str(item).strip()}' is no {'positive ' if positive else ''}number{comma}"
        out.append(number)
    if problem:
        tag = tag_for_keyword(keyword) or 0
        raise MalformedValue(f"{Tag(tag)} {dictionary_description(tag) if tag else keyword} '{_written(items)}' is "
                             f"malformed: {problem}; it must be {count} {'positive ' if positive else ''}decimal "
                             f"number(s){' separated by backslashes' if count > 1 else ''}, with a period as the "
                             "decimal point: fix the value in the file's header (or the exporter that wrote it)")
    return tuple(out)


def first_float(value: Any) -> float | None:
    values = floats(value)
    return values[0] if values else None


def _little_endian(ds: Dataset) -> bool:
    syntax = ds.file_meta.get("TransferSyntaxUID") if hasattr(ds, "file_meta") else None
    return syntax != "1.2.840.10008.1.2.2"


def _written_vr(item: Dataset, tag: int) -> str | None:
    """The VR the file wrote for ``tag`` in ``item``: None in an Implicit VR file, where the VR
    pydicom reports for a 'US or SS' element is its own guess from Pixel Representation."""
    if getattr(item, "original_encoding", (None, None))[0]:  # read as Implicit VR
        return None
    raw = item.get_item(tag)
    return None if raw is None else raw.VR


def read_lut(item: Dataset, *, signed_input: bool, little_endian: bool, ss_keeps_sign: bool = True) -> Lut:
    """A Modality or VOI LUT Sequence item → :class:`Lut` (PS3.3 C.11.1.1, C.11.2.1.1).

    LUT Descriptor value 1 is the entry count (0 means 65536); value 2 the first input value
    mapped, US or SS by the input's signedness (``signed_input``): written US, its 16 bits are
    re-read as signed for signed input (64512 is -1024 before HU); written explicitly SS, it
    keeps its sign (-4095 under unsigned stored values is -4095, not 61441), unless not
    ``ss_keeps_sign`` (behind a Modality LUT, whose output is unsigned: C.11.2.1.1 asks for US
    there, and a writer that followed Pixel Representation wrote 40000 as SS -25536); in an
    Implicit VR file, where no VR is written, the input's signedness decides; value 3 the bits
    per entry. LUT Data (US or OW) is read as 16-bit words, one entry
    each, except 8-bit entries packed two to a word (half as many words as entries), under either VR.
    Raises ``ValueError`` when the descriptor or the data is missing or malformed: bits per entry
    outside 1..16, or another number of LUT Data entries than the descriptor declares (more are
    no padding, bar the one byte that evens an odd count of packed 8-bit entries: read up to the
    declared count, every value past it would render as the last entry).
    """
    descriptor = element(item, "LUTDescriptor")
    raw_data = element(item, "LUTData")
    if descriptor is None or raw_data is None or isinstance(descriptor, int | str | bytes) or len(descriptor) != 3:
        raise ValueError("LUT item lacks a 3-valued (0028,3002) LUT Descriptor or (0028,3006) LUT Data")
    try:
        entries, first, bits = (int(value) for value in descriptor)
    except (TypeError, ValueError) as err:
        raise ValueError(f"(0028,3002) LUT Descriptor {list(descriptor)!r} is not three integers") from err
    entries = entries % 65536 or 65536
    if signed_input and first >= 32768:
        first -= 65536
    elif not signed_input and first < 0 and not (ss_keeps_sign and _written_vr(item, 0x00283002) == "SS"):
        first += 65536
    bits = bits % 65536
    if not 1 <= bits <= 16:
        raise ValueError(f"(0028,3002) LUT Descriptor gives {bits} bits per entry; expected 8 to 16")
    pad = 0  # the one byte that evens an odd count of 8-bit entries packed two to a word
    if isinstance(raw_data, bytes):  # OW: the words in the file's byte order
        data = np.frombuffer(raw_data[: len(raw_data) // 2 * 2], dtype="<u2" if little_endian else ">u2")
    else:  # US: pydicom gave the words as numbers
        data = np.atleast_1d(np.asarray(raw_data, dtype=np.int64))
    if bits <= 8 and entries > 1 and data.size == (entries + 1) // 2 and int(data.min()) >= 0 \
            and int(data.max()) <= 0xFFFF:
        pad = entries % 2
        # 8-bit entries "stored in a format equivalent to 8 bits allocated" (PS3.3 C.11.1.1.1,
        # C.11.2.1.1): two entries per word, the first in its low-order byte, as dcmtk reads them,
        # whether LUT Data is OW or US (an explicit-VR export may write either; the bytes are the
        # same). Read as words, each value would glue two entries and the table would end halfway.
        data = np.stack([data & 0xFF, data >> 8], axis=-1).reshape(-1)
    if data.size == 0:
        raise ValueError("(0028,3006) LUT Data is empty")
    if data.size < entries:  # looked up past its end, every value there would take the last entry
        raise ValueError(f"(0028,3002) LUT Descriptor declares {entries} entries but (0028,3006) LUT Data holds "
                         f"{data.size}; the LUT is cut short: re-export the file")
    if data.size > entries + pad:  # a botched descriptor: its first entries alone would saturate the rest
        raise ValueError(f"(0028,3002) LUT Descriptor declares {entries} entries but (0028,3006) LUT Data holds "
                         f"{data.size}: one of the two is wrong, and the LUT cannot be read without guessing which; "
                         "fix the LUT Descriptor's first value or re-export the file")
    data = data[:entries]
    return Lut(entries=entries, first_mapped=first, bits=bits, data=tuple(int(v) for v in data),
               explanation=str(element(item, "LUTExplanation", "") or "").strip())


def _rescale(source: Dataset, keyword: str, partner: str) -> float | None:
    """Rescale Slope or Intercept as a number, None when absent or when both of the pair are
    empty; a value that is there but no finite number (``NaN``, ``abc``) raises
    :class:`DamagedElement`: taking 1 or 0 in its place would pack every pixel at a wrong modality
    value (HU off by the intercept). So does an empty one beside a ``partner`` (the other of the
    pair) that has a value: the two are Type 1 together (PS3.3 C.11.1, C.7.6.16.2.9), and a slope
    written without its intercept is as corrupt as 'abc', not an intercept of 0."""
    raw = element(source, keyword)
    value = first_float(raw)
    if value is None and raw is not None and str(raw).strip() != "":
        raise DamagedElement(f"{Tag(tag_for_keyword(keyword) or 0)} {keyword} {str(raw)!r} is not a finite number")
    if value is None and keyword in source:  # present, empty: pydicom reads an empty DS as None
        other = element(source, partner)
        if other is not None and str(other).strip() != "":
            raise DamagedElement(f"{Tag(tag_for_keyword(keyword) or 0)} {keyword} is empty while "
                                 f"{Tag(tag_for_keyword(partner) or 0)} {partner} is {str(other)!r}: the pair is "
                                 "written together, and taking the default in its place would pack every pixel at "
                                 "a wrong modality value")
    return value


#: Why a PET image without Rescale Slope and Intercept is refused. Both are Type 1 in the PET
#: Image module (PS3.3 C.8.9.4; in an Enhanced PET's Pixel Value Transformation, C.7.6.16.2.9):
#: a scanner scales each slice's counts by its own slope, so the default slope 1 would pack this
#: slice's stored values beside its series' Bq/ml, a hundredfold off, with nothing to show it.
#: A CT or MR file without them is common (the stored values are the modality values) and is read so.
#: The storage classes of PET images, whose Rescale Slope and Intercept are Type 1 (PS3.3 C.8.9.4;
#: in the Pixel Value Transformation group of the enhanced ones): PET Image, Enhanced PET Image and
#: Legacy Converted Enhanced PET Image. A secondary capture of Modality PT (a workstation's MIP in
#: display levels) is none: its module asks for no rescale.
PET_IMAGE_CLASSES = frozenset({"1.2.840.10008.5.1.4.1.1.128", "1.2.840.10008.5.1.4.1.1.130",
                               "1.2.840.10008.5.1.4.1.1.128.1"})
_PET_WITHOUT_RESCALE = (
    "(0028,1053) Rescale Slope and (0028,1052) Rescale Intercept are absent (or empty) in a PET image (PET Image "
    "Storage), where both are required (PS3.3 C.8.9.4): each PET slice has its own slope, and taking slope 1 would "
    "pack its stored counts as Bq/ml or SUV, far off its series' other slices; export the series again with them "
    "from the scanner or PACS (an anonymiser or converter may have dropped them), or leave the file out with the "
    "source's where:")
#: The enhanced PET classes, whose pair lives in the Pixel Value Transformation functional group,
#: not in the classic PET Image module: their message names the class and that group.
_ENHANCED_PET_CLASSES = {"1.2.840.10008.5.1.4.1.1.130": "Enhanced PET Image Storage",
                         "1.2.840.10008.5.1.4.1.1.128.1": "Legacy Converted Enhanced PET Image Storage"}


def _pet_without_rescale(ds: Dataset, frame: int) -> str:
    """Why this PET ``frame`` is refused: the classic module's message, or for an Enhanced PET
    (PS3.3 A.56) or Legacy Converted Enhanced PET (A.21) its class and where the pair belongs."""
    name = _ENHANCED_PET_CLASSES.get(str(ds.get("SOPClassUID", "")))
    if name is None:
        return _PET_WITHOUT_RESCALE
    return ("(0028,1053) Rescale Slope and (0028,1052) Rescale Intercept are absent (or empty) for frame "
            f"{frame + 1} of an enhanced PET image ({name}), where both are required in the Pixel Value "
            "Transformation functional group (PS3.3 C.7.6.16.2.9): a (0028,9145) Pixel Value Transformation Sequence "
            "item in the frame's (5200,9230) Per-Frame Functional Groups Sequence item or in the (5200,9229) Shared "
            "Functional Groups Sequence; neither holds them, nor does the top level. Each PET frame has its own "
            "slope, and taking slope 1 would pack its stored counts as Bq/ml or SUV, far off the true values; "
            "export the series again with them from the scanner or PACS (an anonymiser or converter may have "
            "dropped them), or leave the file out with the source's where:")


def modality_transform(ds: Dataset, frame: int) -> ModalityTransform:
    """Stored → modality parameters for ``frame`` (PS3.3 C.11.1; C.7.6.16.2.9 for Enhanced).

    The frame's Pixel Value Transformation item (per frame, then shared) wins over the top level,
    whose Modality LUT Sequence or Rescale Slope/Intercept then count for nothing (a stray
    top-level LUT replaced every frame's own rescale). At one level a Modality LUT Sequence wins
    over Rescale Slope/Intercept (they are mutually exclusive). RT Dose adds Dose Grid Scaling
    (3004,000E). Raises ``ValueError`` for a malformed LUT.
    """
    little = _little_endian(ds)
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    item = functional_item(ds, frame, "PixelValueTransformationSequence")
    source = item if item is not None and ("RescaleSlope" in item or "ModalityLUTSequence" in item) else ds
    lut = None
    modality_luts = sequence_items(source, "ModalityLUTSequence")
    if modality_luts:
        lut = read_lut(modality_luts[0], signed_input=signed, little_endian=little)
    slope = _rescale(source, "RescaleSlope", "RescaleIntercept")
    intercept = _rescale(source, "RescaleIntercept", "RescaleSlope")
    if lut is None and slope is None and intercept is None and str(ds.get("SOPClassUID", "")) in PET_IMAGE_CLASSES:
        raise MalformedValue(_pet_without_rescale(ds, frame))
    dose = None
    # Dose Grid Scaling is RT Dose's alone (PS3.3 C.8.8.3): a stray one in a CT halved its HU
    if str(ds.get("SOPClassUID", "")) == RT_DOSE_STORAGE or str(ds.get("Modality", "")).strip().upper() == "RTDOSE":
        dose = first_float(ds.get("DoseGridScaling"))
    return ModalityTransform(slope=1.0 if slope is None else slope,
                             intercept=0.0 if intercept is None else intercept, lut=lut, dose_grid_scaling=dose)


@dataclass(frozen=True)
class FileVoi:
    """The VOI choices a file offers for one frame (PS3.3 C.11.2; C.7.6.16.2.10 Frame VOI LUT)."""

    centers: tuple[float, ...]
    widths: tuple[float, ...]
    explanations: tuple[str, ...]
    function: str
    luts: tuple[Lut, ...]
    #: per pair index, why that pair cannot be read: a value of Window Center or Width that is no
    #: finite number (it keeps its place: the pairs after it are still the file's pairs)
    damaged: tuple[tuple[int, str], ...] = ()


#: What a file without any VOI attributes offers.
NO_FILE_VOI = FileVoi(centers=(), widths=(), explanations=(), function="LINEAR", luts=())


def file_voi(ds: Dataset, frame: int, modality: ModalityTransform) -> FileVoi:
    """Collect Window Center/Width/Explanation, VOI LUT Function and VOI LUT Sequence for ``frame``:
    all from the frame's Frame VOI LUT item (per frame, then shared), else all from the top level.

    Raises ``ValueError`` for a malformed VOI LUT Sequence item.
    """
    item = functional_item(ds, frame, "FrameVOILUTSequence")
    # The frame's (or shared group's) Frame VOI LUT item is the frame's VOI, whole: its window
    # pairs and its VOI LUT Sequence, never a top-level VOI LUT Sequence beside them (that one
    # would win over the frame's own pair #0, as a LUT does at one level)
    source = item if item is not None else ds
    explanations = element(source, "WindowCenterWidthExplanation")
    if explanations is None or explanations == "":
        explanation_list: tuple[str, ...] = ()
    elif isinstance(explanations, str):
        explanation_list = (explanations.strip(),)
    else:
        explanation_list = tuple(str(e).strip() for e in explanations)
    function = str(element(source, "VOILUTFunction", "") or "LINEAR").strip().upper()
    voi_items = sequence_items(source, "VOILUTSequence")
    signed = _modality_may_be_negative(ds, modality)
    luts = tuple(read_lut(lut_item, signed_input=signed, little_endian=_little_endian(ds),
                          ss_keeps_sign=modality.lut is None) for lut_item in voi_items)
    centers, bad_centers = _window_values(element(source, "WindowCenter"), "(0028,1050) Window Center")
    widths, bad_widths = _window_values(element(source, "WindowWidth"), "(0028,1051) Window Width")
    return FileVoi(centers=centers, widths=widths, explanations=explanation_list, function=function, luts=luts,
                   damaged=bad_centers + bad_widths)


def _modality_may_be_negative(ds: Dataset, modality: ModalityTransform) -> bool:
    """Whether the VOI stage's input, the modality values, can go below 0, which makes the VOI LUT
    Descriptor's first mapped value SS (PS3.3 C.11.2.1.1): never behind a Modality LUT (its LUT
    Data are unsigned); else where the stored range (Bits Stored, Pixel Representation) rescaled,
    ``min(slope × low, slope × high) + intercept``, reaches below 0: HU from unsigned values, or
    unsigned values under a negative slope (-1 gives -4095..0 from 12 bits)."""
    if modality.lut is not None:
        return False
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    try:
        bits = int(ds.get("BitsStored") or ds.get("BitsAllocated") or 16)
    except (TypeError, ValueError):
        bits = 16
    bits = min(max(bits, 1), 32)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    scale = modality.dose_grid_scaling if modality.dose_grid_scaling is not None else 1.0
    return min(modality.slope * low, modality.slope * high) * scale + modality.intercept * scale < 0


def _window_values(value: Any, name: str) -> tuple[tuple[float, ...], tuple[tuple[int, str], ...]]:
    """A Window Center or Width value of VM 1-n, by position: (numbers, damaged), where an entry
    that is no finite number keeps its place as NaN and is named in ``damaged`` as (index, why)."""
    if value is None or value == "":
        return (), ()
    items = list(value) if hasattr(value, "__iter__") and not isinstance(value, str | bytes) else [value]
    numbers: list[float] = []
    damaged: list[tuple[int, str]] = []
    for index, item in enumerate(items):
        try:
            number = float(item)
        except (TypeError, ValueError):
            number = float("nan")
        if not np.isfinite(number):
            damaged.append((index, f"{name} value #{index} {str(item).strip()!r} is not a number"))
        numbers.append(number)
    return tuple(numbers), tuple(damaged)


def resolve_window(spec: WindowSpec, offer: FileVoi, *, fallback: bool = False) -> VoiTransform | str:
    """Turn a requested window into a :class:`VoiTransform`, or a message saying why the file
    cannot give it. ``file`` windows: a VOI LUT Sequence item wins over the Window Center/Width
    pair with the same index (or the same explanation text), as in pydicom's default.
    """
    prefix = "fallback_" if fallback else ""
    name = spec.name if spec.kind != "file" or spec.selector == 0 else f"file:{spec.selector}"
    if spec.kind != "file":
        return VoiTransform(name=spec.name, function=spec.function, source=prefix + spec.kind,
                            center=spec.center, width=spec.width)
    selector = spec.selector
    index: int | None = None
    if isinstance(selector, str):
        wanted = selector.strip().lower()
        for lut in offer.luts:
            if lut.explanation.lower() == wanted:
                return VoiTransform(name=name, function="LUT", source=prefix + "file_lut", lut=lut)
        index = next((k for k, text in enumerate(offer.explanations) if text.lower() == wanted), None)
        if index is None:
            offered = [lut.explanation for lut in offer.luts] + list(offer.explanations)
            return (f"the file has no (0028,3003) LUT Explanation or (0028,1055) Window Center & Width "
                    f"Explanation equal to {selector!r} (it offers {offered or 'none'})")
    else:
        if selector < len(offer.luts):
            return VoiTransform(name=name, function="LUT", source=prefix + "file_lut", lut=offer.luts[selector])
        index = selector
    pairs = min(len(offer.centers), len(offer.widths))
    if index >= pairs:
        hidden = min(pairs, len(offer.luts))
        shared = "pair #0 shares its index" if hidden == 1 else f"pairs #0-#{hidden - 1} share their indexes"
        behind = (f"; its {shared} with VOI LUT Sequence item(s), which {{file: N}} picks first, so it is reached "
                  "by its (0028,1055) Window Center & Width Explanation, {file: \"TEXT\"}, only, or written as an "
                  "explicit window {center: C, width: W}") if hidden else ""
        return (f"the file has no (0028,1050) Window Center / (0028,1051) Window Width pair #{index} "
                f"(it has {pairs} pair(s) and {len(offer.luts)} (0028,3010) VOI LUT Sequence item(s)){behind}")
    broken = [why for at, why in offer.damaged if at == index]
    if broken:
        return f"the file's window #{index} cannot be read: {'; '.join(broken)}; fix the header"
    center, width = offer.centers[index], offer.widths[index]
    try:
        check_window(center, width, offer.function)
    except ValueError as err:
        return f"the file's window #{index} (center {center:g}, width {width:g}, {offer.function}) is invalid: {err}"
    return VoiTransform(name=name, function=offer.function, source=prefix + "file", center=center, width=width)


def displays_inverted(ds: Dataset, photometric: str) -> bool:
    """Whether a grey image displays its minimum white: MONOCHROME1 (PS3.3 C.7.6.3.1.2), or
    MONOCHROME2 under Presentation LUT Shape (2050,0020) INVERSE (C.11.6.1.2: the output after
    inversion is in P-values, as DCMTK renders it; a DX/MG/CR "for presentation" image may carry
    it). MONOCHROME1 with INVERSE, the value the standard pairs with it, is inverted once, as
    MONOCHROME1 alone is; IDENTITY, an absent or any other value change nothing. The one place
    every rendering step (windows, a z-score's sign, padding's and the border's black) asks."""
    if photometric == "MONOCHROME1":
        return True
    return photometric == "MONOCHROME2" and (text_value(ds, "PresentationLUTShape") or "").upper() == "INVERSE"


def pixel_spacing(ds: Dataset, frame: int) -> tuple[float, float] | None:
    """(row, column) spacing in mm from Pixel Measures (Enhanced) or top-level Pixel Spacing;
    ``None`` where it is absent or malformed (what a sample records; where the job resamples or
    places the image by it, :func:`checked_pixel_spacing` refuses a malformed one)."""
    item = functional_item(ds, frame, "PixelMeasuresSequence")
    source = item if item is not None and "PixelSpacing" in item else ds
    values = floats(element(source, "PixelSpacing"))
    if len(values) != 2 or min(values) <= 0:
        return None
    return (values[0], values[1])


def checked_pixel_spacing(ds: Dataset, frame: int) -> tuple[float, float] | None:
    """:func:`pixel_spacing`, ``None`` only where the file has none: a Pixel Spacing that is there
    but is not two positive numbers raises :class:`MalformedValue`. A file without one is resized
    only (README); a malformed one read as absent would pack a sample at another scale than the
    job asked for, saying only that it had no Pixel Spacing."""
    item = functional_item(ds, frame, "PixelMeasuresSequence")
    source = item if item is not None and "PixelSpacing" in item else ds
    values = decimals(source, "PixelSpacing", 2, positive=True)
    return None if values is None else (values[0], values[1])


def pixel_measure(ds: Dataset, frame: int, keyword: str) -> float | None:
    """The first value of ``keyword`` (SliceThickness, SpacingBetweenSlices) in a frame's Pixel
    Measures (Enhanced), else at the top level; None where absent."""
    item = functional_item(ds, frame, "PixelMeasuresSequence")
    source = item if item is not None and keyword in item else ds
    return first_float(element(source, keyword))


def slice_thickness(ds: Dataset, frame: int) -> float | None:
    return pixel_measure(ds, frame, "SliceThickness")


#: SOP classes packer reads that are newer than the pydicom it pins (its UID dictionary has them not).
NEWER_SOP_CLASSES = {"1.2.840.10008.5.1.4.1.1.66.7": "Label Map Segmentation Storage"}


def sop_class_name(uid: str) -> str:
    """'RT Plan Storage' for its UID; the UID itself when pydicom does not know it."""
    if not uid:
        return "unknown SOP class (no (0008,0016) SOP Class UID)"
    name = NEWER_SOP_CLASSES.get(uid) or UID(uid).name
    return name if name and name != uid else f"SOP class {uid}"


#: Text VRs decoded with (0008,0005) Specific Character Set whose values are split at backslashes
#: (PS3.5 6.1.2.3, 6.2): a single value never holds a backslash, so an escape written with one
#: (:func:`escape_undecodable`) cannot be confused with text.
_CHARSET_VRS = frozenset({"SH", "LO", "UC", "PN"})
#: Text VRs decoded with the character set that hold one value, backslashes included (PS3.5 6.2:
#: ST, LT, UT): kept whole, each undecodable byte as ``\xNN``, a backslash of the text doubled
#: where it would read as part of an escape (:func:`escape_undecodable_text`).
_TEXT_VRS = frozenset({"ST", "LT", "UT"})
#: An escape of an undecodable byte in such text: ``\xNN`` after an even number of backslashes.
_ESCAPED = re.compile(r"(?<!\\)(?:\\\\)*\\x[0-9a-f]{2}")
#: Valid text of those VRs that would read as escaped (a ``\xNN`` or ``\\`` of its own): written
#: in the escaped form too, so it cannot collide with an escape (:func:`escape_text`).
_LOOKS_ESCAPED = re.compile(r"\\(?:\\|x[0-9a-f]{2})")
_ESCAPE_TAIL = re.compile(r"\\|x[0-9a-f]{2}")
_ESC = b"\x1b"


def escape_undecodable(raw: bytes, codecs: list[str], delimiters: bytes = b"") -> list[str]:
    """The values of a text element whose bytes ``raw`` do not all decode under ``codecs`` (the
    Python codecs of the declared character sets, :func:`_codecs`), split at backslashes and read
    by :func:`_decode_value`: what decodes is kept as text, each byte that does not as the four
    characters ``\\xNN`` (``b"MRN\\xff01"`` is ``MRN\\xff01``), trailing spaces and NULs (padding)
    stripped. Unlike pydicom's U+FFFD replacement, this loses nothing: two values that differ in
    any byte stay different, and one value is always shown the same."""
    return [_escape_bytes(_decode_value(part.rstrip(b"\0 "), codecs, delimiters))
            for part in _split_values(raw, codecs, delimiters)]


#: pydicom's codecs of the character sets whose characters of two or four bytes may hold the byte
#: 0x5C without a code extension: GB18030 and GBK (a lead byte 0x81-0xFE, then a trail byte
#: 0x40-0xFE, or, in GB18030, a digit, a lead byte and a digit).
_LEAD_BYTE_CODECS = frozenset({"GB18030", "GBK"})


def _split_values(raw: bytes, codecs: list[str], delimiters: bytes) -> list[bytes]:
    """``raw`` split at each backslash that is a character of its own, the value delimiter. PS3.5
    6.1.2.3: "Multi-byte encoding systems, such as GB18030, GBK and ISO 2022, may generate
    encodings that contain a byte valued 05/12. Only the character that encodes as a single byte
    valued 05/12 is a delimiter." So a 0x5C that is a later byte of a GB18030 or GBK character
    (乗 = 81 5C) is not one, nor one inside a multi-byte G0 set an ISO 2022 escape sequence
    designates (JIS X 0208 倍 = ``ESC $ B`` 47 5C), which runs to the next ESC as
    :func:`_decode_value` reads it. The sets are tracked as :func:`_decode_value` tracks them,
    the first set in force again after each of ``delimiters``; UTF-8 never holds 0x5C inside a
    character. A lead byte without a trail byte stands alone (it is undecodable)."""
    initial = "ascii" if codecs[0] == default_encoding else codecs[0]
    single, multi = initial, False
    values: list[bytes] = []
    start = at = 0
    while at < len(raw):
        byte = raw[at]
        if byte == _ESC[0]:
            escape = raw[at:at + (4 if raw.startswith((b"\x1b$(", b"\x1b$)"), at) else 3)]
            named = CODES_TO_ENCODINGS.get(escape)
            if named is not None and (named in codecs or named == default_encoding):
                if escape in _MULTI_BYTE_G0:
                    multi = True
                elif escape in (b"\x1b(B", b"\x1b(J"):
                    multi = False
                else:
                    single = _ESCAPE_CODECS[escape]
                at += len(escape)
            else:
                at += 1  # an ESC of no escape sequence the file declares: one undecodable byte
            continue
        if multi:
            at += 1
        elif byte == 0x5C:
            values.append(raw[start:at])
            start = at = at + 1
            single = initial
        elif single in _LEAD_BYTE_CODECS and 0x81 <= byte <= 0xFE:
            at += _multi_byte_length(raw, at, four=single == "GB18030")
        else:
            if byte in delimiters:
                single = initial
            at += 1
    values.append(raw[start:])
    return values


def _multi_byte_length(raw: bytes, at: int, *, four: bool) -> int:
    """How many bytes the GBK (``four``: GB18030) character whose lead byte is ``raw[at]`` takes:
    2 for a trail byte 0x40-0x7E or 0x80-0xFE, 4 for GB18030's digit, lead byte, digit; 1 where
    no trail byte follows (the lead byte is undecodable on its own)."""
    trail = raw[at + 1] if at + 1 < len(raw) else -1
    if 0x40 <= trail <= 0x7E or 0x80 <= trail <= 0xFE:
        return 2
    if (four and 0x30 <= trail <= 0x39 and at + 3 < len(raw) and 0x81 <= raw[at + 2] <= 0xFE
            and 0x30 <= raw[at + 3] <= 0x39):
        return 4
    return 1


def _escape_bytes(pieces: list[str | int]) -> str:
    """Pieces of a value of SH, LO, UC or PN (which never holds a backslash) as one string, each
    undecodable byte as ``\\xNN``."""
    return "".join(f"\\x{piece:02x}" if isinstance(piece, int) else piece for piece in pieces)


def escape_undecodable_text(raw: bytes, codecs: list[str]) -> str:
    """:func:`escape_undecodable` for ST, LT and UT, whose one value may hold backslashes of its
    own: the bytes are not split, trailing spaces and NULs (padding) stripped, and the text is
    written by :func:`escape_text`, so that a byte 0xE9 (``\\xe9``) and the four characters
    ``\\xe9`` of valid text (``\\\\xe9``) read differently."""
    return escape_text(_decode_value(raw.rstrip(b"\0 "), codecs, _LINE_DELIMITERS))


def _decode_pieces(raw: bytes, encoding: str, prefix: bytes = b"") -> list[str | int]:
    """``raw`` under ``encoding`` as runs of text and the bytes (ints) that do not decode.
    ``prefix`` (an ISO 2022 escape sequence that a stateful codec such as ``iso2022_jp`` needs
    to read ``raw`` in the set it designates) is put before each run decoded."""
    pieces: list[str | int] = []
    while raw:
        try:
            pieces.append((prefix + raw).decode(encoding))
            break
        except UnicodeDecodeError as err:
            start, end = max(err.start - len(prefix), 0), max(err.end - len(prefix), 1)
            pieces.extend(_decode_pieces(raw[:start], encoding, prefix))
            pieces.extend(raw[start:end])
            raw = raw[end:]
    return pieces


#: Delimiters after which code extensions return to the initial character set, for every text
#: VR (PS3.5 6.1.2.5.3: TAB, LF, FF, CR); PN adds its component delimiters ``^`` and ``=``.
_LINE_DELIMITERS = b"\t\n\f\r"
_PN_DELIMITERS = _LINE_DELIMITERS + b"^="
#: The ISO 2022 escape sequences DICOM defines (PS3.3 C.12.1.1.2, tables C.12-3 and C.12-4) that
#: designate a multi-byte set into G0: their runs are read by Python's stateful codec, escape
#: sequence first. Every other one designates ASCII or JIS X 0201 Romaji into G0 (``ESC ( B``,
#: ``ESC ( J``), whose bytes then read as ASCII, or a set into G1 (``ESC - A``, ``ESC ) I``,
#: ``ESC $ ) C``, ``ESC $ ) A``), whose codec reads a run whole, ASCII and high bytes alike.
_MULTI_BYTE_G0 = frozenset({b"\x1b$B", b"\x1b$(D"})
#: The codec each escape sequence selects (pydicom's table), except ISO-IR 58 (GB2312 into G1):
#: pydicom hands the escape sequence to Python's ``iso_ir_58`` (EUC-CN, which keeps ESC as a
#: character), so ``ESC $ ) A 张伟`` read as ``\x1b$)A张伟``; its bytes after the escape are EUC-CN,
#: read here by ``gb2312`` with the escape sequence consumed.
_ESCAPE_CODECS = {**CODES_TO_ENCODINGS, b"\x1b(B": "ascii", b"\x1b$)A": "gb2312"}


def _decode_value(raw: bytes, codecs: list[str], delimiters: bytes) -> list[str | int]:
    """One value's bytes ``raw`` under the declared character sets ``codecs`` as runs of text and
    the bytes (ints) that do not decode, strictly: each byte is read in the set the code
    extensions (PS3.5 6.1.2.5) have designated where it stands, and a byte that set does not hold
    is undecodable, as is the ESC of an escape sequence DICOM does not define or the file does
    not declare in (0008,0005) (ISO 2022 IR 87 for ``ESC $ B``). Without escape sequences the
    value is read in its first set, ASCII where (0008,0005) is absent, ``ISO_IR 6`` or a term
    pydicom does not know (:func:`_codecs`). After each of ``delimiters`` the first set is in
    force again (PS3.5 6.1.2.5.3)."""
    initial = "ascii" if codecs[0] == default_encoding else codecs[0]
    if _ESC not in raw:  # one set throughout (and a GBK or GB18030 byte may be a delimiter's)
        return _decode_pieces(raw, initial)
    pieces: list[str | int] = []
    single, multi = initial, b""  # the codec of a run outside a multi-byte G0 set; the escape sequence of one
    for index, fragment in enumerate(re.split(b"(?=\x1b)", raw)):
        if index and fragment:  # starts with ESC: an escape sequence, else an undecodable ESC
            length = 4 if fragment.startswith((b"\x1b$(", b"\x1b$)")) else 3
            escape = fragment[:length]
            named = CODES_TO_ENCODINGS.get(escape)
            if named is None or (named not in codecs and named != default_encoding):
                pieces.append(fragment[0])
                fragment = fragment[1:]
            else:
                fragment = fragment[length:]
                if escape in _MULTI_BYTE_G0:
                    multi = escape
                elif escape in (b"\x1b(B", b"\x1b(J"):
                    multi = b""
                else:
                    single = _ESCAPE_CODECS[escape]
        if multi:  # a multi-byte set's bytes (0x21-0x7E) may be delimiters' too: read whole
            pieces.extend(_decode_pieces(fragment, _ESCAPE_CODECS[multi], multi))
            continue
        for part in re.split(b"([" + re.escape(delimiters) + b"])", fragment) if delimiters else [fragment]:
            if len(part) == 1 and part in delimiters:
                pieces.append(part.decode("ascii"))
                single = initial
            elif part:
                pieces.extend(_decode_pieces(part, single))
    return pieces


def escape_text(pieces: list[str | int]) -> str:
    """Text runs and undecodable bytes (:func:`_decode_pieces`) as one string that tells them
    apart: each byte as ``\\xNN`` (two lower-case hex digits), each backslash of the text doubled
    where a backslash or ``xNN`` follows it (so ``\\\\`` reads as one backslash, ``\\xNN`` as a
    byte), every other character as it is. Text with no backslash before ``\\`` or ``xNN`` comes
    out unchanged (``Case A\\B``); no output of a valid text without such a backslash is the
    output of any other bytes."""
    parts: list[str] = []  # right to left
    after = ""  # the first characters of what follows
    for piece in reversed(pieces):
        if isinstance(piece, int):
            parts.append(f"\\x{piece:02x}")
            after = parts[-1][:3]
            continue
        for char in reversed(piece):
            parts.append("\\\\" if char == "\\" and _ESCAPE_TAIL.match(after) else char)
            after = (parts[-1] + after)[:3]
    return "".join(reversed(parts))


def _codecs(ds: Dataset) -> list[str]:
    """pydicom's Python codecs of the character sets ``ds`` declares, or its parent's for a
    sequence item without its own (0008,0005) (PS3.5 7.5.1: an item inherits the data set's).
    pydicom's default, ``iso8859``, stands for ISO_IR 6 (ASCII): an absent (0008,0005), ``ISO_IR
    6`` or a term pydicom does not know (:func:`_decode_value` reads it as ASCII)."""
    own = ds.get("SpecificCharacterSet")
    if own:
        return list(convert_encodings(_spelled_terms(own)))
    inherited = getattr(ds, "_character_set", None)  # pydicom: the item's parent encoding, as codecs
    if isinstance(inherited, str) and inherited:
        return [inherited]
    if isinstance(inherited, (list, tuple)) and inherited:
        return [str(codec) for codec in inherited]
    return list(convert_encodings("ISO_IR 6"))


#: A defined term written without the space between its prefix and number (``ISO_IR100``,
#: ``ISO_IR192``, ``ISO 2022 IR100``): pydicom corrects ``ISO-IR 100`` and ``ISO IR 100``, but not
#: these, and reads them as ASCII, so a Latin-1 ``Müller`` under ``ISO_IR100`` and the same id under
#: ``ISO_IR 100`` became two entities.
_UNSPACED_TERM = re.compile(r"(ISO[ _-]?IR|ISO 2022 IR)[ _-]?(\d+)", re.IGNORECASE)


def _spelled_terms(value: Any) -> Any:
    """(0008,0005)'s values with each term pydicom does not know but that is a defined term less
    the space before its number (:data:`_UNSPACED_TERM`) written as that term; every other value as
    it stands (an unknown term is still read as ASCII)."""
    terms = list(value) if isinstance(value, MultiValue | list | tuple) else [value]

    def spelled(term: Any) -> Any:
        text = str(term or "").strip()
        match = _UNSPACED_TERM.fullmatch(text)
        if text in python_encoding or match is None:
            return term
        prefix = "ISO 2022 IR" if "2022" in match.group(1) else "ISO_IR"
        fixed = f"{prefix} {int(match.group(2))}"
        return fixed if fixed in python_encoding else term

    fixed = [spelled(term) for term in terms]
    return fixed if isinstance(value, MultiValue | list | tuple) else fixed[0]


def _texts(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, MultiValue) else [str(value)]


def convert_faithfully(ds: Dataset, tag: BaseTag) -> DataElement:
    """``ds[tag]``, which converts a raw element on first access as pydicom does, except for a
    text element (SH, LO, UC, PN; ST, LT, UT) whose bytes pydicom reads otherwise than the data
    set's (0008,0005) Specific Character Set (a sequence item's: its own, else the one it
    inherits) strictly gives them (:func:`_decode_value`): pydicom warns and writes U+FFFD for
    each undecodable byte, so two PatientIDs (or ROI names, comments a job reads its entity from)
    that differ only in those bytes would read alike and two patients would become one entity; it
    reads bytes above 0x7F under the default ASCII as Latin-1 without a word (a UTF-8 ``MÜLLER``
    written without (0008,0005) became ``MÃ\\x9cLLER``), falls back to Latin-1 for a whole value
    of ISO 2022 code extensions that does not decode, and keeps the escape sequence of ISO 2022
    IR 58 as text. Such an element is converted by :func:`escape_undecodable`
    (:func:`escape_undecodable_text` for ST, LT, UT) instead, each undecodable byte as ``\\xNN``,
    and ``ds`` holds that element from then on. A value whose bytes decode as pydicom decodes
    them (a valid UTF-8 ``Müller``) is pydicom's. Raises what pydicom raises on a damaged
    element."""
    raw = ds.get_item(tag)
    elem = ds[tag]
    if (elem.VR not in _CHARSET_VRS | _TEXT_VRS or not isinstance(raw, RawDataElement)
            or not isinstance(raw.value, bytes)):
        return elem
    if raw.value.isascii() and _ESC not in raw.value:  # read alike under every character set
        if elem.VR in _TEXT_VRS and isinstance(elem.value, str) and _LOOKS_ESCAPED.search(elem.value):
            # valid text that reads as escaped (a literal \xe9): escaped too, to differ from a byte 0xE9
            kept = DataElement(elem.tag, elem.VR, escape_text([elem.value]), validation_mode=pydicom_config.IGNORE)
            ds[tag] = kept
            return kept
        return elem
    codecs = _codecs(ds)
    value: str | list[str]
    if elem.VR in _TEXT_VRS:
        value = escape_undecodable_text(raw.value, codecs)
        if value == elem.value:
            return elem
    else:
        # A list of one value is not split again at the backslashes the escapes hold.
        value = escape_undecodable(raw.value, codecs, _PN_DELIMITERS if elem.VR == "PN" else _LINE_DELIMITERS)
        if value == [text.rstrip("\0 ") for text in _texts(elem.value)]:
            return elem
    kept = DataElement(elem.tag, elem.VR, value, validation_mode=pydicom_config.IGNORE)
    ds[tag] = kept
    return kept


#: Raw values up to this many bytes are remembered by :func:`convert_remembered`; the memo holds
#: at most :data:`_MEMO_ENTRIES` of them and starts afresh when full.
_MEMO_VALUE_BYTES = 256
_MEMO_ENTRIES = 8192
_MEMO: dict[tuple[Any, ...], DataElement] = {}
#: The VRs whose values are remembered: text and numbers. Never a sequence, an unknown VR, bytes
#: (Pixel Data and other O* values carry more than their bytes: an undefined length, a frame
#: table), nor a VR pydicom resolves from another element (``US or SS`` by Pixel Representation)
_REMEMBERED_VRS = frozenset({"AE", "AS", "CS", "DA", "DS", "DT", "IS", "LO", "LT", "PN", "SH", "ST", "TM", "UC",
                             "UI", "UR", "UT", "FL", "FD", "SL", "SS", "UL", "US", "SV", "UV", "AT"})
_SPECIFIC_CHARACTER_SET = 0x00080005


def convert_remembered(ds: Dataset, tag: BaseTag) -> DataElement:
    """:func:`convert_faithfully` of a top-level element of ``ds``, remembering what a raw value
    converts to: the slices of a series repeat most of their header (its UIDs, names, dates,
    grid, windows; 37 of a CT slice's 43 elements), and converting each element is about half
    of a header probe. The memo's key is everything the conversion reads: the tag, the VR as
    written, the raw bytes, the byte order and VR encoding, and the data set's raw Specific
    Character Set. Only text and numbers are remembered (:data:`_REMEMBERED_VRS`): an element
    whose conversion reads anything else (an ambiguous VR resolved by Pixel Representation, a
    sequence, Specific Character Set itself, Pixel Data and every other value of bytes) is
    converted every time, and so is a multi-value list, which can change in place. Each data
    set gets its own element object, so setting a value in one data set never reaches another.
    Raises what :func:`convert_faithfully` raises."""
    raw = ds.get_item(tag)
    if (not isinstance(raw, RawDataElement) or not isinstance(raw.value, bytes) or len(raw.value) > _MEMO_VALUE_BYTES
            or tag == _SPECIFIC_CHARACTER_SET):
        return convert_faithfully(ds, tag)
    written = raw.VR
    if written is None:  # implicit VR: the dictionary's, which may be ambiguous ("US or SS")
        try:
            written = dictionary_VR(tag)
        except KeyError:
            return convert_faithfully(ds, tag)
    if written not in _REMEMBERED_VRS:
        return convert_faithfully(ds, tag)
    charset = ds.get_item(_SPECIFIC_CHARACTER_SET)
    key = (int(tag), raw.VR, raw.value, raw.is_little_endian, raw.is_implicit_VR,
           None if charset is None else (charset.value if isinstance(charset, RawDataElement) else
                                         str(charset.value)))
    known = _MEMO.get(key)
    if known is not None:
        elem = copy.copy(known)
        ds[tag] = elem
        return elem
    elem = convert_faithfully(ds, tag)
    if isinstance(elem.value, (str, int, float, PersonName)) and not isinstance(elem.value, MultiValue):
        if len(_MEMO) >= _MEMO_ENTRIES:
            _MEMO.clear()
        _MEMO[key] = copy.copy(elem)
    return elem


def undecodable_note(ds: Dataset, keyword: str) -> str | None:
    """The warning for a file whose ``keyword`` element (the source's entity) holds bytes its
    declared character set cannot decode, kept by :func:`convert_faithfully`; None otherwise. It
    names the tag and the character set, never the value (a patient's id)."""
    tag = tag_for_keyword(keyword)
    try:
        if tag is None or tag not in ds:
            return None
        elem = convert_faithfully(ds, Tag(tag))
    except (KeyError, ValueError, TypeError):
        return None  # a damaged element is the probe's to report
    if elem.VR in _TEXT_VRS:  # one value that may hold backslashes of its own: the escapes' form
        if not any(_ESCAPED.search(text) for text in _texts(elem.value)):
            return None
    elif elem.VR not in _CHARSET_VRS or not any("\\" in text for text in _texts(elem.value)):
        return None  # a single value of these VRs holds a backslash only where an escape was written
    declared = ds.get("SpecificCharacterSet")
    charset = "\\".join(_texts(declared)) if declared else "ISO_IR 6 (absent: the default, ASCII)"
    return (f"{elem.tag} {keyword}, the entity, holds bytes that (0008,0005) Specific Character Set {charset} "
            "cannot decode: each is read as \\xNN, so ids that differ only in those bytes stay apart (pydicom "
            "would make them U+FFFD, or Latin-1 letters under ASCII); fix the character set or the ids where the "
            "files were exported if this patient's files must match others'")


def item_text(item: Dataset, keyword: str) -> str:
    """A text element of a sequence item (an RTSTRUCT's ROIName, a SEG's SegmentLabel) as
    :func:`text_value` reads one of the top level, faithfully under the character set the item
    inherits; ``""`` when absent, empty or undecodable (the caller names what it lacks)."""
    return text_value(item, keyword) or ""


def text_value(ds: Dataset, keyword: str) -> str | None:
    """``str`` of an element's value, stripped; ``None`` when absent, empty or not a keyword. Text
    whose bytes the declared character set cannot decode is read by :func:`convert_faithfully`
    (``MRN\\xff01``), so distinct raw ids stay distinct. A value of several values is written as
    DICOM writes it, joined by backslashes (ScanningSequence ``SE\\IR``), not as Python's list
    text (``['SE', 'IR']``), which no label map keyed by the header's form could match; a
    separator followed by ``xNN`` or a backslash is doubled, so that it never reads as an escape.
    A person name (VR PN) is spelled by :func:`person_name`, without trailing empty components."""
    tag = tag_for_keyword(keyword)
    try:
        if tag is None or tag not in ds:
            return None
        elem = convert_faithfully(ds, Tag(tag))
    except (KeyError, ValueError, TypeError):
        return None
    value = elem.value
    if value is None:
        return None
    if isinstance(value, (MultiValue, list, tuple)):
        parts = [spelled_value(part, elem.VR).strip() for part in value]
        # a separator before "xNN" or a backslash is doubled, as escape_text doubles a backslash of
        # text there: values MRN and xff01 must not read as the one value of bytes MRN, 0xFF, 01
        text = "".join([parts[0], *(("\\\\" if _ESCAPE_TAIL.match(part) else "\\") + part for part in parts[1:])]
                       ).strip("\\ ") if parts else ""
    else:
        text = spelled_value(value, elem.VR).strip()
    return text or None


def spelled_value(value: Any, vr: str) -> str:
    """One value of an element of VR ``vr`` as text: a person name (PN) as :func:`person_name`
    spells it; a float32 (FL) as the shortest text that reads back as that float32, the number the
    file holds (pydicom gives its float64 widening: an FL written 0.1 reads ``0.10000000149011612``,
    which no ``where:`` value 0.1 is, and which no one wrote); anything else as ``str`` spells it
    (a double, FD, as the float64 it is)."""
    if vr == "PN":
        return person_name(value)
    if vr == "FL" and isinstance(value, float | int | np.floating) and not isinstance(value, bool):
        return str(np.float32(value))
    return str(value)


def person_name(value: Any) -> str:
    """A PN value as text in one spelling of its name: trailing empty components, with their
    ``^``, and trailing empty component groups, with their ``=``, dropped, and the trailing spaces
    of each component. PS3.5 6.2.1.1 lets a writer omit them, and exports differ in doing so
    (``Müller^Jörg`` and ``Müller^Jörg^^^`` are one name): compared as written, one patient whose
    files are named both ways would be two entities, split apart."""
    groups = ["^".join(_without_trailing_empty([part.rstrip(" ") for part in group.split("^")]))
              for group in str(value).split("=")]
    return "=".join(_without_trailing_empty(groups))


def _without_trailing_empty(parts: list[str]) -> list[str]:
    while parts and not parts[-1]:
        parts.pop()
    return parts


#: A whole DT value to at least the day (PS3.5 6.2: YYYYMMDD[HH[MM[SS[.F{1,6}]]]][&ZZXX]). pydicom's
#: DT matches a prefix only, so ISO ``2024-08-01T10:10:10`` read as its year, 2024-01-01; and a DT of
#: a year or month alone (``2024``, ``202408``) names no day, as a DA must.
_DT_TO_THE_DAY = re.compile(r"\d{8}(?:\d{2}(?:\d{2}(?:\d{2}(?:\.\d{1,6})?)?)?)?(?:[+-]\d{4})?")


def _parse_time(text: str, vr: str) -> date | time | datetime | None:
    """pydicom's DA/TM/DT parsers (which accept the retired ACR-NEMA forms too); None if invalid,
    and for a DT that is not whole DT syntax to at least the day (:data:`_DT_TO_THE_DAY`): judged
    without the spaces and NUL bytes that pad a value (PS3.5 6.2), which a writer may leave."""
    if vr == "DT" and not _DT_TO_THE_DAY.fullmatch(text.strip(" \x00")):
        return None
    parser = {"DA": DA, "TM": TM, "DT": DT}[vr]
    try:
        parsed = parser(text)
    except (ValueError, TypeError, OverflowError):
        return None
    return parsed if isinstance(parsed, date | time) else None


#: The VRs that hold bytes, not values (PS3.5 6.2: Other Byte, Word, Float, Double, Long and Very
#: Long, and Unknown): an attribute of one (PixelData, OB or OW) has nothing to compare or name by
BINARY_VRS = frozenset({"OB", "OW", "OF", "OD", "OL", "OV", "UN"})


#: An attribute written as its tag, as DICOM dumps print one: (0008,0060) or 0008,0060
#: (not eight bare digits: a table's column may be named by a date, 20200110, which is also the tag
#: (2020,0110), so only the forms with a comma are taken for a tag)
_TAG_FORM = re.compile(r"\(\s*([0-9A-Fa-f]{4})\s*,\s*([0-9A-Fa-f]{4})\s*\)|([0-9A-Fa-f]{4})\s*,\s*([0-9A-Fa-f]{4})")


def tag_key_problem(key: str) -> str | None:
    """Why ``key``, an attribute written as its tag (``(0008,0060)`` or ``0008,0060``), names
    nothing a job reads, with the fix: headers are read by keyword, so a tag of pydicom's
    dictionary is told its keyword (``write its keyword: Modality``), a private tag (an odd group)
    that private tags are not supported, and another tag that the dictionary does not name it.
    None for any other key, eight bare hex digits included (``20200110``, a table's date column,
    though also the tag (2020,0110)): no tag without its comma."""
    match = _TAG_FORM.fullmatch(key.strip())
    if match is None:
        return None
    group, element = (part.upper() for part in match.groups() if part is not None)
    tag = f"({group},{element})"
    keyword = keyword_for_tag(int(group + element, 16))
    if keyword and tag_for_keyword(keyword) is not None:  # a repeating group's (60xx) has no keyword to give
        return (f"{key!r} is the tag {tag}: header attributes are named by keyword, not by tag; write its keyword: "
                f"{keyword}")
    if int(group, 16) % 2:
        return (f"{key!r} is the private tag {tag} (an odd group): private tags are not supported as keys, only the "
                "keywords of pydicom's data dictionary (Modality, not (0008,0060))")
    return (f"{key!r} is the tag {tag}, which pydicom's data dictionary does not name: header attributes are named "
            "by the dictionary's keywords (Modality, not (0008,0060))")


def valueless_problem(keyword: str) -> str | None:
    """Why the dictionary attribute ``keyword`` has no value a ``where:``, ``entity:`` or
    ``label: {attribute}`` could read, or None where it has one: a sequence (VR SQ) holds items,
    whose attributes are not read (pydicom's text for it is a dump of every element of every
    item), and an attribute of a binary VR (:data:`BINARY_VRS`, as one of its VRs: PixelData is
    ``OB or OW``) holds bytes. Said with the keyword, its VR and its name; the caller adds the fix."""
    try:
        vr, described = dictionary_VR(keyword), dictionary_description(keyword)
    except KeyError:
        return None
    if vr == "SQ":
        return (f"{keyword} is a sequence (VR SQ, {described}): it holds items, not a value of its own, and the "
                "attributes inside its items are not read")
    if any(part in BINARY_VRS for part in vr.split(" or ")):
        return f"{keyword} is of VR {vr} ({described}): it holds bytes, not a value"
    return None


#: One whole value of a date or time VR (PS3.5 6.2), and how it is written: a ``where:`` value
#: of any other form never equals one a header holds
_VALUE_FORMS = {
    "DA": (re.compile(r"\d{8}"), "YYYYMMDD"),
    "TM": (re.compile(r"\d{2}(?:\d{2}(?:\d{2}(?:\.\d{1,6})?)?)?"), "HHMMSS.FFFFFF, the parts after HH optional"),
    "DT": (re.compile(r"\d{4}(?:\d{2}(?:\d{2}(?:\d{2}(?:\d{2}(?:\d{2}(?:\.\d{1,6})?)?)?)?)?)?(?:[+-]\d{4})?"),
           "YYYYMMDDHHMMSS.FFFFFF&ZZXX, the parts after YYYY optional"),
}
#: The ACR-NEMA 300 spellings PS3.5 Table 6.2-1 notes for backward compatibility, which a header
#: written before DICOM 3.0 (an old archive, a pre-3.0 converter) holds: a value so written matches it
_LEGACY_FORMS = {
    "DA": (re.compile(r"\d{4}\.\d{2}\.\d{2}"), "YYYY.MM.DD"),
    "TM": (re.compile(r"\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?"), "HH:MM:SS.frac"),
}
#: The separators an ISO or locale spelling puts between a date's or time's parts, which DICOM does not
_SEPARATORS = {"DA": r"[-/. ]", "TM": r":", "DT": r"[-/:T ]"}


def value_form_problem(keyword: str, text: str) -> str | None:
    """Why ``text`` can be no value of ``keyword`` where its VR is a date or time (DA, TM, DT),
    None where it can be one or the VR is another: ``StudyDate is a DA, written YYYYMMDD (here
    20240110)`` for an ISO ``2024-01-10``, with the DICOM spelling where dropping the separators
    gives one. A value in the ACR-NEMA spelling a pre-3.0 header holds (DA ``1995.03.15``, TM
    ``10:11:12``, :data:`_LEGACY_FORMS`) can be one: it matches a header written so."""
    vr = dictionary_VR(keyword) if tag_for_keyword(keyword) is not None else ""
    if vr not in _VALUE_FORMS:
        return None
    form, written = _VALUE_FORMS[vr]
    legacy, old = _LEGACY_FORMS.get(vr, (None, ""))
    if form.fullmatch(text) or (legacy is not None and legacy.fullmatch(text)):
        return None
    spelled = re.sub(_SEPARATORS[vr], "", text)
    here = f" (here {spelled})" if form.fullmatch(spelled) else ""
    also = f", or {old} in a header written before DICOM 3.0 (ACR-NEMA)" if old else ""
    return f"{keyword} is a {vr}, written {written}{here}{also}"


#: What a DICOM source's ``time:`` may name where no keyword of the list dates a file (a time of day)
_DATE_KEYWORDS = "StudyDate, AcquisitionDateTime or ContentDate"


def time_keywords_problem(keywords: tuple[str, ...]) -> str | None:
    """Why a DICOM source's ``time:`` (keywords of pydicom's dictionary) can date no file, as
    :func:`record_time` reads it, or None: a keyword of a VR other than DA, DT and TM (``PatientID``,
    LO), which it skips, or a list without a DA or DT (``[StudyTime]``: a TM is a time of day, which
    only adds to a DA's day). Said with the keyword, its VR and the keywords to give instead."""
    fix = f"give a date keyword, such as {_DATE_KEYWORDS}"
    vrs = {keyword: dictionary_VR(keyword) for keyword in keywords}
    for keyword, vr in vrs.items():
        if vr not in ("DA", "DT", "TM"):
            return (f"{keyword!r} is of VR {vr} ({dictionary_description(keyword)}), not a date: time: reads DA, DT "
                    f"and TM attributes; {fix} (a TM beside a DA, as [StudyDate, StudyTime], adds the time of day)")
    if not any(vr in ("DA", "DT") for vr in vrs.values()):
        named = ", ".join(repr(keyword) for keyword in keywords)
        return (f"{named} {'is' if len(keywords) == 1 else 'are'} of VR TM, a time of day with no day, and no DA or "
                f"DT keyword of time: gives one, so no file would be dated; {fix}, beside it: [StudyDate, StudyTime]")
    return None


#: The date attributes a ``missing_time`` record looks in for one the file fills, beside ``time:``'s
_DATE_ATTRIBUTES = ("StudyDate", "SeriesDate", "AcquisitionDate", "ContentDate", "AcquisitionDateTime")
#: An ISO date (and time) as some exporters write one in a DA or DT: its DICOM spelling can be given
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?")


def _unread_date(keyword: str, vr: str, text: str) -> str:
    """``StudyDate holds '2024-03-05', not a DICOM date (DA: YYYYMMDD, here 20240305)``."""
    form = ("a DICOM date (DA: YYYYMMDD" if vr == "DA" else
            "a DICOM date-time to at least the day (DT: YYYYMMDD[HHMMSS]")
    iso = _ISO.fullmatch(text.strip(" \x00"))
    if iso is not None:
        form += ", here " + "".join(part for part in iso.groups()[:3 if vr == "DA" else 6] if part)
    return f"{keyword} holds {text!r}, not {form})"


def missing_time_note(ds: Dataset, keywords: tuple[str, ...]) -> str:
    """Why :func:`record_time` read no date from ``ds``, for its ``missing_time`` record: each DA
    or DT keyword of ``time:`` that holds a value no DICOM date reads, quoted (an ISO
    ``2024-03-05`` in a DA, with the DICOM spelling to write), and those absent or empty; then the
    fix: the value to correct, and the date attributes this file fills that ``time:`` does not
    name (:data:`_DATE_ATTRIBUTES`), as examples only where the file fills them. The values are
    quoted under either ``phi.mode``, as the raw paths and a ``straddles_cutoff`` record's time
    are: the record stays in the local ``bad_samples.jsonl``, and a pseudonymized job's report,
    summary and ``--junit`` name bad files by sample key and reason only."""
    unread, absent = [], []
    for keyword in keywords:
        vr = dictionary_VR(keyword) if tag_for_keyword(keyword) is not None else ""
        if vr not in ("DA", "DT"):  # a TM gives no day; time: refuses other VRs
            continue
        text = text_value(ds, keyword)
        if text is None:
            absent.append(keyword)
        elif _parse_time(text, vr) is None:
            unread.append(_unread_date(keyword, vr, text))
    said = [*unread, *([f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} absent or empty"] if absent
                       else [])]
    if not said:  # not expected: record_time dates a file whose DA or DT reads
        said = [f"{', '.join(keywords)} hold no date packer reads"]
    others = [keyword for keyword in _DATE_ATTRIBUTES if keyword not in keywords]
    fills = [keyword for keyword in others if record_time(ds, (keyword,)) is not None]
    offer = f"add to the source's time: an attribute this file fills with a date ({', '.join(fills)})"
    if unread:
        fix = f"fix the value{'s' if len(unread) > 1 else ''} in the file" + (
            f", or {offer}" if fills else f"; no other date attribute of this file holds a date ({', '.join(others)})")
    else:
        fix = offer if fills else (f"give the file a date, or leave it out; no other date attribute of this file "
                                   f"holds one ({', '.join(others)})")
    return f"its header's {'; '.join(said)} (the source's time: {', '.join(keywords)}): {fix}"


def record_time(ds: Dataset, keywords: tuple[str, ...]) -> str | None:
    """ISO 8601 record time from DA/TM/DT keywords, e.g. (StudyDate, StudyTime).

    The first parsable DA or DT gives the date; with a DA, the first parsable TM adds the time
    of day (seconds precision). Returns ``2023-05-04``, ``2023-05-04T10:11:12`` or ``None``.
    """
    day: date | None = None
    clock: time | None = None
    for keyword in keywords:
        try:
            vr = dictionary_VR(keyword)
        except (KeyError, ValueError):
            continue
        text = text_value(ds, keyword)
        if text is None or vr not in ("DA", "TM", "DT"):
            continue
        parsed = _parse_time(text, vr)
        if parsed is None:
            continue
        if vr == "DT" and day is None and isinstance(parsed, datetime):
            if len(text.split("+")[0].split("-")[0]) <= 8:
                return parsed.date().isoformat()
            return parsed.replace(microsecond=0, tzinfo=None).isoformat()
        if vr == "DA" and day is None and isinstance(parsed, date):
            day = parsed
        elif vr == "TM" and clock is None and isinstance(parsed, time):
            clock = parsed
    if day is None:
        return None
    if clock is None:
        return day.isoformat()
    return datetime.combine(day, clock.replace(microsecond=0, tzinfo=None)).isoformat()
