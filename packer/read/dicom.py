"""Read DICOM files: a header probe for planning, and one decode → validate → transform pass.

``probe_dicom`` reads the header only (``stop_before_pixels``) and rejects what cannot become a
sample early: no Part 10 preamble (``not_dicom``), no Image Pixel module (``no_pixel_data``), a
non-integer Number of Frames (``bad_shape``), a transfer syntax without a pinned decoder
(``unsupported_transfer_syntax``), a size over the job's limits (``too_large``, see
:mod:`packer.read.limits`), and text burned into the pixels (``burned_in_annotation``). It never
uses ``force=True``: pydicom then "reads" README, JSON and ICC files as one-element junk datasets.

Hostile files: the header probe reads through :class:`~packer.read.limits.BoundedFile`, the
full parse of a file up to 64 MiB reads it with one system call and parses it from memory (in
both, an element length larger than the file allocates nothing), a deflated data set is
inflated once without keeping it to check its size, and the size and burned-in checks run
again in ``read_dicom`` before any pixel is decoded. Encapsulated frames whose own JPEG /
JPEG 2000 header claims more pixels than Rows × Columns, or more frames than (0028,0008), are
``bad_shape`` before decoding.

``read_dicom`` decodes the pixels once with the decoder pinned in :func:`decoder_table` (lossy
JPEG output differs between plugins, so the bytes must not depend on what else is installed),
checks them, and hands each frame to :mod:`packer.transform.dicom`. Every defect of the file
comes back as one :class:`~packer.records.Issue`; nothing returns ``None``.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, Literal

import numpy as np
import pydicom
from pydicom.datadict import get_entry
from pydicom.dataelem import DataElement, RawDataElement
from pydicom.dataset import Dataset
from pydicom.encaps import generate_frames, parse_basic_offsets, parse_fragments
from pydicom.errors import BytesLengthException, InvalidDicomError
from pydicom.multival import MultiValue
from pydicom.pixels import apply_color_lut, get_decoder, pixel_array
from pydicom.tag import BaseTag
from pydicom.uid import UID, DeflatedExplicitVRLittleEndian
from pydicom.valuerep import VR

from packer.config import DicomTransformConfig, LimitsConfig
from packer.read import at_boundary
from packer.read.annotations import AnnotationRefs, annotation_modality, annotation_refs
from packer.read.dicom_attrs import (
    DamagedElement,
    FramesDisagree,
    MalformedValue,
    convert_faithfully,
    convert_remembered,
    element,
    file_text,
    first_float,
    missing_time_note,
    pixel_spacing,
    record_time,
    sop_class_name,
    text_value,
    undecodable_note,
)
from packer.read.dicom_cut import HeaderCut, cut_in_header
from packer.read.dicom_meta import LONG_VRS, META_START, meta_elements
from packer.read.dicom_objects import classify, header_failure, header_unread
from packer.read.dicom_render import GRAYSCALE, instance_digest, render_samples
from packer.read.dicom_series import HeaderFingerprint, SliceGeometry, slice_geometry
from packer.read.image_structure import Defect
from packer.read.jpeg_scan import check_scan
from packer.read.limits import (
    DEFAULT_LIMITS,
    BoundedFile,
    codestream_components,
    codestream_header,
    codestream_lossy,
    file_size_problem,
    inflated_size_exceeds,
    limit_problem,
)
from packer.read.opening import open_failure
from packer.records import Excluded, Issue, MemberIssue, Sample, SampleRef
from packer.where import Condition

_PYDICOM, _PYLIBJPEG = "pydicom", "pylibjpeg"

#: Transfer syntax UID → the one decoding plugin packer uses for it.
_DECODERS: dict[str, str] = {
    "1.2.840.10008.1.2": _PYDICOM,          # Implicit VR Little Endian
    "1.2.840.10008.1.2.1": _PYDICOM,        # Explicit VR Little Endian
    "1.2.840.10008.1.2.1.99": _PYDICOM,     # Deflated Explicit VR Little Endian
    "1.2.840.10008.1.2.2": _PYDICOM,        # Explicit VR Big Endian (retired)
    "1.2.840.10008.1.2.5": _PYDICOM,        # RLE Lossless (pydicom's numpy decoder)
    "1.2.840.10008.1.2.4.50": _PYLIBJPEG,   # JPEG Baseline (Process 1)
    "1.2.840.10008.1.2.4.51": _PYLIBJPEG,   # JPEG Extended (Process 2 & 4), incl. 12-bit
    "1.2.840.10008.1.2.4.57": _PYLIBJPEG,   # JPEG Lossless, Non-Hierarchical (Process 14)
    "1.2.840.10008.1.2.4.70": _PYLIBJPEG,   # JPEG Lossless SV1
    "1.2.840.10008.1.2.4.80": _PYLIBJPEG,   # JPEG-LS Lossless
    "1.2.840.10008.1.2.4.81": _PYLIBJPEG,   # JPEG-LS Near-Lossless
    "1.2.840.10008.1.2.4.90": _PYLIBJPEG,   # JPEG 2000 Lossless Only
    "1.2.840.10008.1.2.4.91": _PYLIBJPEG,   # JPEG 2000
    "1.2.840.10008.1.2.4.201": _PYLIBJPEG,  # HTJ2K Lossless
    "1.2.840.10008.1.2.4.202": _PYLIBJPEG,  # HTJ2K Lossless RPCL
    "1.2.840.10008.1.2.4.203": _PYLIBJPEG,  # HTJ2K
}
#: The pylibjpeg package that decodes each compressed syntax (the JPEG family is pylibjpeg-libjpeg's)
_PLUGIN_PACKAGES = {syntax: "pylibjpeg-openjpeg" for syntax in (
    "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.4.202",
    "1.2.840.10008.1.2.4.203")}
#: The JPEG 2000 syntaxes (HTJ2K is JPEG 2000 Part 15): the only ones YBR_ICT/YBR_RCT may use.
_JPEG_2000 = frozenset(_PLUGIN_PACKAGES)
_NATIVE = frozenset({"1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.1.99", "1.2.840.10008.1.2.2"})
_DEFLATED = "1.2.840.10008.1.2.1.99"
# Explicit VRs with a 2-byte reserved field and a 4-byte length (PS3.5 7.1.2).

#: Photometric interpretations pydicom's ``pixel_array`` returns as RGB (YBR converted).
RGB_DECODED = ("RGB", "YBR_FULL", "YBR_FULL_422", "YBR_RCT", "YBR_ICT")
PALETTE = "PALETTE COLOR"
_PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")

# What pydicom raises on a damaged header or on pixel data it cannot decode.
_PARSE_ERRORS = (InvalidDicomError, BytesLengthException, ValueError, EOFError, struct.error, KeyError, IndexError,
                 TypeError, NotImplementedError, OverflowError, zlib.error)
_DECODE_ERRORS = (ValueError, RuntimeError, NotImplementedError, AttributeError, KeyError, IndexError,
                  TypeError, struct.error, EOFError, StopIteration)


def decoder_table() -> dict[str, str]:
    """Transfer syntax UID → pinned plugin name (``pydicom`` or ``pylibjpeg``), for the manifest."""
    return dict(_DECODERS)


@dataclass(frozen=True)
class DicomHeader:
    """What the header-only pass knows about one file.

    ``dataset`` is the parsed file with its pixel data when the probe was asked to keep it
    (``probe_dicom(keep_pixels=True)``, the pixel pass), so :func:`read_dicom` need not parse
    the file a second time; ``None`` after a header-only read.
    """

    entity: str | None
    time: str | None
    rows: int
    columns: int
    frames: int
    samples_per_pixel: int
    sop_class_uid: str
    transfer_syntax_uid: str
    modality: str
    photometric_interpretation: str = ""
    pixel_spacing: tuple[float, float] | None = None
    dataset: Dataset | None = field(default=None, compare=False, repr=False)
    #: The value of the attribute the source's labels come from (``label: {attribute: ...}``)
    label_value: str | None = None
    #: Its place in a series, where the probe was asked for it (``probe_dicom(placement=True)``)
    geometry: SliceGeometry | None = None
    #: Why the header gave no time (:func:`~packer.read.dicom_attrs.missing_time_note`), None where it gave one
    time_note: str | None = None
    #: What a SEG or RTSTRUCT references, where the job reads them as masks
    #: (``probe_dicom(annotations=True)``); such a file has no image geometry
    annotation: AnnotationRefs | None = None
    #: The digest of its (0008,0018) SOP Instance UID (:func:`~packer.read.dicom_render.instance_digest`),
    #: as its samples carry it (:attr:`~packer.records.Sample.instance`); ``""`` for none
    instance: str = ""


@dataclass(frozen=True)
class _Geometry:
    rows: int
    columns: int
    frames: int
    samples: int
    bits_allocated: int
    bits_stored: int
    photometric: str
    transfer_syntax: str


def _issue(ref: SampleRef, stage: str, reason: str, message: str) -> Issue:
    return Issue.of(ref, stage=stage, reason=reason, message=f"{ref.relpath or ref.path}: {message}")


def label_value(ref: SampleRef, ds: Dataset, keyword: str | None) -> str | Issue | None:
    """The file's value of the source's label attribute ``keyword`` (``label: {attribute: ...}``):
    its top-level value, else its functional groups' (:func:`~packer.read.dicom_attrs.file_text`:
    ImageLaterality of a Breast Tomosynthesis file is its frames' FrameLaterality); None where it
    has none (discovery calls that ``missing_label``). The file's ``missing_label`` Issue where its
    frames hold different values, since a label is the whole file's; ``unreadable`` where a
    functional group cannot be decoded."""
    if not keyword:
        return None
    try:
        return file_text(ds, keyword)
    except FramesDisagree as err:
        return _issue(ref, "discover", "missing_label",
                      f"{err}, so the file has no one {keyword} to label it with (a label is the whole file's); "
                      "split its frames into files of one value, or leave it out with the source's where:")
    except DamagedElement as err:
        return _damaged(ref, err)


def _damaged(ref: SampleRef, err: DamagedElement) -> Issue:
    # a malformed value is as its exporter wrote it (its message says the fix): a copy is no cure
    fix = "" if isinstance(err, MalformedValue) else "; the header is corrupt, copy the file again"
    return _issue(ref, "read", "unreadable", f"{err}{fix}")


def _cannot_open(ref: SampleRef, err: OSError) -> Issue:
    reason, said = open_failure(ref.path, err)
    return _issue(ref, "read", reason, said)


def _check_preamble(ref: SampleRef, head: bytes | None = None) -> Issue | None:
    """PS3.10 7.1: a DICOM file starts with a 128-byte preamble and the 4 bytes ``DICM``.
    ``head``: the file's first 132 bytes when already read (else they are read here)."""
    if head is None:
        try:
            with open(ref.path, "rb") as handle:
                head = handle.read(132)
        except OSError as err:
            return _cannot_open(ref, err)
    if not head:
        return _issue(ref, "read", "unreadable", "zero-byte file; re-copy it from the source")
    if len(head) < 132 or head[128:132] != b"DICM":
        found = (f"the file is only {len(head)} bytes long, too short for the 128-byte preamble and b'DICM'"
                 if len(head) < 132 else f"bytes 128-131 are {head[128:132]!r}, not b'DICM'")
        return _issue(ref, "read", "not_dicom",
                      f"no DICOM Part 10 header: {found} (PS3.10 7.1); remove non-DICOM files from the source, or "
                      "re-export raw datasets as Part 10")
    return None


def _meta_transfer_syntax(head: bytes) -> tuple[str, int]:
    """(Transfer Syntax UID, offset of the data set) from the file meta group (PS3.10 7.1), which
    is always Explicit VR Little Endian; ``""`` when the group does not say."""
    syntax, end = "", META_START
    for number, value_at, length in meta_elements(head):
        if number == 0x0010:
            syntax = head[value_at:value_at + length].rstrip(b"\0 ").decode("ascii", "replace")
        end = value_at + length
    return syntax, end


#: Explicit VR Big Endian (PS3.5 A.3, retired) and Implicit VR Little Endian (PS3.5 A.1)
_BIG_ENDIAN, _IMPLICIT = "1.2.840.10008.1.2.2", "1.2.840.10008.1.2"
#: The two-letter value representations (PS3.5 6.2) an explicit-VR element header carries
_VR_BYTES = frozenset(vr.value.encode() for vr in VR if len(vr.value) == 2)


def _known_tag(tag: int) -> bool:
    """Whether ``tag`` is one of pydicom's data dictionary (a repeating group's too, (60xx,0010))."""
    try:
        get_entry(tag)
    except KeyError:
        return False
    return True


def _check_body_syntax(ref: SampleRef, head: bytes) -> Issue | None:
    """``unreadable`` when the file meta's Transfer Syntax UID names an encoding the data set is
    not in: Explicit VR Big Endian over a little-endian data set, a little-endian syntax over a
    big-endian one, Deflated over a data set that is not deflated (a broken converter, or a file
    meta rewritten by hand). pydicom reads such a header as what it is told: a few elements of
    nonsense tags, no SOP class, no Modality, no Image Pixel module, so a ``where:`` would leave the
    file out as ``filtered`` and the read would call it an image exported without its pixels.
    Decided from the data set's first element tag (``head``: the file's first bytes): read as
    the meta says it is no tag of the dictionary (nor private), read the other way it is one. A
    deflated stream's first bytes never read as a known tag followed by a value representation."""
    syntax, start = _meta_transfer_syntax(head)
    first = head[start:start + 8]
    if len(first) < 8 or not syntax:
        return None
    little, big = struct.unpack_from("<HH", first), struct.unpack_from(">HH", first)
    explicit = first[4:6] in _VR_BYTES
    if syntax == _DEFLATED:
        if not (_known_tag(little[0] << 16 | little[1]) and explicit):
            return None
        found, fix, other, declared = "is not deflated", "1.2.840.10008.1.2.1", little, ""
    else:
        said, other = (big, little) if syntax == _BIG_ENDIAN else (little, big)
        if said[0] % 2 or _known_tag(said[0] << 16 | said[1]) or not _known_tag(other[0] << 16 | other[1]):
            return None  # read as the meta says, the first tag is one (or private): the header is what it says
        order = "little" if syntax == _BIG_ENDIAN else "big"
        fix = _BIG_ENDIAN if order == "big" else "1.2.840.10008.1.2.1" if explicit else _IMPLICIT
        found = f"is {order} endian"
        declared = f" (as declared, ({said[0]:04X},{said[1]:04X}), a tag no data set holds)"
    keyword = get_entry(other[0] << 16 | other[1])[2]
    return _issue(ref, "read", "unreadable",
                  f"the file meta's (0002,0010) Transfer Syntax UID is {syntax} ({UID(syntax).name}), but the data "
                  f"set {found}: its first element reads as ({other[0]:04X},{other[1]:04X}) {keyword} in "
                  f"{UID(fix).name}{declared}, so the header cannot be read as declared. The file meta is wrong (a "
                  f"broken converter?): set (0002,0010) to {fix} ({UID(fix).name}), or re-export the file")


def _check_inflated(ref: SampleRef, handle: BoundedFile | _InMemory, head: bytes,
                    limits: LimitsConfig) -> Issue | None:
    """pydicom inflates a whole Deflated Explicit VR Little Endian data set in memory (header-only
    reads too): measure it first, keeping nothing, so a deflate bomb is ``too_large``. ``head``:
    the file's first bytes. The inflated bytes count twice against ``limits.max_decoded_bytes``:
    pydicom holds the inflated data set and a copy of each element's value out of it at once
    (measured: a header read of a 600 MiB data set peaked 1.27 GB above its start)."""
    syntax, start = _meta_transfer_syntax(head)
    if syntax != _DEFLATED:
        return None
    handle.seek(start)
    inflated = inflated_size_exceeds(handle, limits.max_decoded_bytes // _INFLATED_COPIES)
    if inflated is None:
        return None
    return _issue(ref, "read", "too_large",
                  f"the deflated data set (transfer syntax {_DEFLATED}) of this {handle.size}-byte file inflates "
                  f"to more than {inflated} bytes, held about {_INFLATED_COPIES} times while it is read (the "
                  f"inflated data set and its elements' values), over limits.max_decoded_bytes "
                  f"{limits.max_decoded_bytes}; nothing was decoded. If the file is genuine, raise "
                  "limits.max_decoded_bytes in the job file")


#: How many copies of an inflated data set a read holds at its peak (see :func:`_check_inflated`)
_INFLATED_COPIES = 2


def _convert_elements(ref: SampleRef, ds: Dataset, tags: Sequence[int] | None = None) -> Dataset | Issue:
    """Convert every public top-level element now, and every file meta element (or those of
    ``tags``): pydicom converts lazily, on first access, so a damaged VR or value length would
    otherwise raise wherever the element is first read (the probe reads (0002,0002) Media Storage
    SOP Class UID of a file without (0008,0016): a flipped VR there ended the whole build). Text
    its declared character set cannot decode is kept as :func:`convert_faithfully` keeps it."""
    meta = getattr(ds, "file_meta", None) if tags is None else None
    targets = [(ds, tag) for tag in (list(ds.keys()) if tags is None else [BaseTag(t) for t in tags])]
    targets += [(meta, tag) for tag in list(meta.keys())] if meta is not None else []
    for holder, tag in targets:
        if tag.is_private:
            continue  # never read by packer
        try:
            # a series' slices repeat most of their header: the top level's values are remembered
            (convert_remembered if holder is ds else convert_faithfully)(holder, tag)
        except _PARSE_ERRORS as err:  # a sequence, parsed on first access, cut inside an item's header too
            return _cut_issue(ref) or _issue(ref, "read", "unreadable",
                                             f"header element {tag} cannot be decoded ({type(err).__name__}: {err}); "
                                             "the file is corrupt, copy it again")
    return ds


#: The full parse reads a file up to this size with one system call and parses it from memory:
#: pydicom reads a data set element by element, and a few dozen reads through a Python-level
#: file object cost a third of the parse (dcmread of a 512×512 CT slice: 0.33 ms through
#: BoundedFile, 0.23 ms from memory; the whole parse 0.65 → 0.54 ms; one core, no other load).
#: Larger files stream through BoundedFile, so their bytes are not held twice.
WHOLE_READ_MAX = 64 * 2**20


class _InMemory(io.BytesIO):
    """A file's bytes as the parser's file. Like :class:`BoundedFile`, ``read(n)`` never
    allocates past the end, whatever an element's length field claims."""

    def __init__(self, data: bytes, mtime_ns: int = 0) -> None:
        super().__init__(data)
        self.size = len(data)
        self.mtime_ns = mtime_ns  # of the file, when it was read


def _read_whole(path: str) -> _InMemory | None:
    """The whole file at ``path`` in memory, or None when it is over :data:`WHOLE_READ_MAX`.
    Raises OSError."""
    with open(path, "rb", buffering=0) as raw:
        stat = os.fstat(raw.fileno())
        if stat.st_size > WHOLE_READ_MAX:
            return None
        return _InMemory(raw.readall(), stat.st_mtime_ns)


def _parse(ref: SampleRef, *, header_only: bool, limits: LimitsConfig) -> Dataset | Issue:
    return _parse_at(ref, header_only=header_only, limits=limits)[0]


_NO_STOP = (-1, b"")


#: The longest element value the header-only read of a file over ``limits.max_decoded_bytes``
#: reads: longer ones (raw data, an encapsulated document, a vendor's private payload) are
#: skipped, so that what the file is can be told from its header without reading it whole.
HEADER_ELEMENT_MAX = 1 << 20


def _parse_at(ref: SampleRef, *, header_only: bool, limits: LimitsConfig
              ) -> tuple[Dataset | Issue, tuple[int, bytes]]:
    """:func:`_parse`, and with ``header_only`` where the header stopped: its offset and the 12
    bytes there (the Pixel Data element's tag, VR and length where the file has one: pydicom
    rewinds to its tag); else ``(-1, b"")``.

    A file over ``limits.max_decoded_bytes`` is never read whole: a whole read is ``too_large``
    at once; a header-only read parses its header without the values longer than
    :data:`HEADER_ELEMENT_MAX` (those elements are left out of the data set), so that the probe
    can tell a non-image object (left out, :func:`_excluded`) from an image, which it then
    refuses as ``too_large`` (:func:`file_too_large`)."""
    try:
        oversized = file_size_problem(os.stat(ref.path).st_size, limits)
        whole = None if header_only or oversized is not None else _read_whole(ref.path)
    except OSError as err:
        return _cannot_open(ref, err), _NO_STOP
    problem = _check_preamble(ref, None if whole is None else whole.getvalue()[:132])
    if problem is not None:
        return problem, _NO_STOP
    try:
        with whole if whole is not None else BoundedFile(ref.path) as handle:
            oversized = file_size_problem(handle.size, limits)
            if oversized is not None and not header_only:
                return _issue(ref, "read", "too_large", oversized), _NO_STOP
            head = handle.read(1 << 16)
            mismatch = _check_body_syntax(ref, head)
            if mismatch is not None:
                return mismatch, _NO_STOP
            inflated = _check_inflated(ref, handle, head, limits)
            if inflated is not None:
                return inflated, _NO_STOP
            handle.seek(0)
            ds = pydicom.dcmread(handle, stop_before_pixels=header_only,
                                 defer_size=None if oversized is None else HEADER_ELEMENT_MAX)
            stop = (handle.tell(), handle.read(12)) if header_only else _NO_STOP
        if oversized is not None:
            _drop_deferred(ds)
        return _convert_elements(ref, ds), stop
    except OSError as err:  # pydicom's "No tag to read" too: a file cut inside an item's header
        return _cut_issue(ref) or _issue(ref, "read", "unreadable", f"cannot read the file ({type(err).__name__}: "
                                                                    f"{err}); copy it again from the source"), _NO_STOP
    except zlib.error as err:
        if "truncated" in str(err) or "incomplete" in str(err):  # Z_BUF_ERROR (-5): the stream stops short
            return _issue(ref, "read", "truncated", f"the file is Deflated Explicit VR Little Endian and its "
                                                    f"compressed data set ends before its stream does (zlib: {err}): "
                                                    "it was cut short, copy it again"), _NO_STOP
        return _issue(ref, "read", "unreadable", f"the deflated data set cannot be inflated (zlib: {err}); the file "
                                                 "is corrupt, copy it again or re-export it"), _NO_STOP
    except _PARSE_ERRORS as err:  # a file cut inside a sequence's or an item's header too
        return _cut_issue(ref) or _issue(ref, "read", "unreadable", f"the DICOM header cannot be parsed "
                                                                    f"({type(err).__name__}: {err}); the file is "
                                                                    "corrupt, copy it again or re-export it"), _NO_STOP
    except RecursionError:  # pydicom parses each nested sequence one call deeper
        return _issue(ref, "read", "unreadable", "the DICOM header cannot be parsed: its sequences are nested "
                                                 "deeper than a reader can follow (thousands of levels: no real "
                                                 "header nests so deep); the file is damaged or crafted, remove it"
                      ), _NO_STOP


def _drop_deferred(ds: Dataset) -> None:
    """Remove from ``ds`` the top-level elements whose values pydicom deferred (over
    :data:`HEADER_ELEMENT_MAX`), unread: a later access would read them from the file."""
    for tag in list(ds.keys()):
        raw = ds.get_item(tag, keep_deferred=True)
        if isinstance(raw, RawDataElement) and raw.value is None and raw.length > HEADER_ELEMENT_MAX:
            del ds[tag]


def file_too_large(ref: SampleRef, limits: LimitsConfig) -> Issue | None:
    """``too_large`` where the file at ``ref.path`` is over ``limits.max_decoded_bytes`` (an image
    is read whole before decoding), else None; None too where it cannot be stat'ed (its read says why)."""
    found = _stat(ref.path)
    problem = None if found is None else file_size_problem(found.st_size, limits)
    return None if problem is None else _issue(ref, "read", "too_large", problem)


_PIXEL_MODULE_INTS = (("0028,0010", "Rows"), ("0028,0011", "Columns"), ("0028,0002", "SamplesPerPixel"),
                      ("0028,0100", "BitsAllocated"), ("0028,0101", "BitsStored"), ("0028,0103", "PixelRepresentation"))


def _pixel_module_ints(ds: Dataset) -> tuple[int, int, int, int, int] | str:
    """(Rows, Columns, Samples per Pixel, Bits Allocated, Bits Stored), or why they are unusable: a
    damaged header can hold several values, or (after a flipped VR byte, or a writer's wrong VR)
    text or a decimal string where a US belongs. Pixel Representation is checked too (the decoder
    reads it). When missing or 0, Samples per Pixel counts as 1, Bits Stored as Bits Allocated and
    Pixel Representation as 0."""
    values: dict[str, int] = {}
    for tag, keyword in _PIXEL_MODULE_INTS:
        value = ds.get(keyword)
        if value in (None, "", 0):
            value = {"SamplesPerPixel": 1, "BitsStored": values.get("BitsAllocated"),
                     "PixelRepresentation": 0}.get(keyword, value)
        if isinstance(value, bool) or not isinstance(value, int):
            vr = ds[keyword].VR if keyword in ds else "US"
            if vr != "US":  # each is US (PS3.3 C.7.6.3): "is '12'; expected one integer" hid the wrong VR
                return (f"({tag}) {keyword} is {value!r} with VR {vr}, where the standard has US (Image Pixel "
                        "module, PS3.3 C.7.6.3): the writer stored it with the wrong VR, or the header is damaged, "
                        "and packer does not guess the number; write the element again as US (a DICOM editor "
                        "taking the VR from the data dictionary does), or re-export the file")
            return f"({tag}) {keyword} is {value!r}; expected one integer (Image Pixel module, PS3.3 C.7.6.3)"
        values[keyword] = int(value)
    return (values["Rows"], values["Columns"], values["SamplesPerPixel"], values["BitsAllocated"],
            values["BitsStored"])


def _check_image(ref: SampleRef, ds: Dataset, stop: tuple[int, bytes] = _NO_STOP) -> _Geometry | Issue:
    """Image Pixel module (PS3.3 C.7.6.3), Number of Frames and transfer syntax checks. ``stop``:
    where a header-only parse of ``ds`` stopped (:func:`_parse_at`); the default, a whole parse."""
    if len(ds) == 0:
        return _cut_issue(ref) or _issue(ref, "read", "unreadable", "the file has a DICOM preamble but no data set "
                                                                    "after the file meta information (cut short or "
                                                                    "corrupt); copy it again")
    missing = [f"({tag}) {kw}" for tag, kw in (("0028,0010", "Rows"), ("0028,0011", "Columns"),
                                                ("0028,0100", "BitsAllocated")) if ds.get(kw) in (None, "")]
    empty = [f"({tag}) {kw}" for tag, kw in (("0028,0010", "Rows"), ("0028,0011", "Columns"),
                                              ("0028,0100", "BitsAllocated")) if kw in ds and ds.get(kw) in (None, "")]
    if missing and not _lacks_pixel_element(ds, stop):
        # absent, or present with no value (an anonymiser that blanks or drops values leaves such):
        # the image is there, so "exported without its pixels" would send the user to re-export a
        # file that has them
        absent = [name for name in missing if name not in empty]
        said = [f"{', '.join(empty)} {'is' if len(empty) == 1 else 'are'} present but empty (zero length)"
                if empty else "", f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing"
                if absent else ""]
        what = " and ".join(part for part in said if part)
        return _issue(ref, "validate", "bad_shape",
                      f"{what}, though the file holds its Pixel Data: the Image Pixel module (PS3.3 C.7.6.3) "
                      "requires a value (Type 1), and without it the pixels cannot be laid out; set it to the value "
                      "the image was written with (an anonymiser that blanks or removes values must keep these), "
                      "or re-export the file")
    if missing:
        sop = sop_class_name(str(ds.get("SOPClassUID", "") or ""))
        image = classify(ds, (), slices=False).why != "not_image"
        cut = _cut_inside_value(ref) if image else None
        if cut is not None:
            return _issue(ref, "read", "truncated",
                          f"{sop_class_name(cut.sop_class) if cut.sop_class else sop}: {cut.what}, so its Image "
                          f"Pixel module ({', '.join(missing)}) and pixels are not in the file: it was cut short, "
                          "copy it again from the source")
        why = ("it is not an image object (the probe leaves such files out as not_image, never as bad samples)"
               if not image else
               "yet its SOP class is an image's (or unknown): the file is damaged or was exported without its "
               "pixels; export it again from the archive")
        return _issue(ref, "validate", "no_pixel_data",
                      f"{sop} has no image: {', '.join(missing)} missing (Image Pixel module, PS3.3 C.7.6.3); {why}")
    raw_frames = ds.get("NumberOfFrames", 1)
    try:
        frames = int(str(raw_frames).strip()) if raw_frames not in (None, "") else 1
    except ValueError:
        return _issue(ref, "validate", "bad_shape",
                      f"(0028,0008) Number of Frames is {str(raw_frames)!r}, not an integer; fix the header")
    ints = _pixel_module_ints(ds)
    if isinstance(ints, str):
        return _issue(ref, "validate", "bad_shape", ints)
    rows, columns, samples, bits_allocated, bits_stored = ints
    if frames < 1 or rows < 1 or columns < 1 or samples not in (1, 3) or bits_allocated not in (1, 8, 16, 32, 64):
        return _issue(ref, "validate", "bad_shape",
                      f"unusable image shape: Rows {rows}, Columns {columns}, Number of Frames {frames}, "
                      f"Samples per Pixel {samples} (1 or 3), Bits Allocated {bits_allocated} (1/8/16/32/64); "
                      "fix the header or re-export the file")
    photometric = str(ds.get("PhotometricInterpretation", "") or "").strip().upper()
    expected_samples = 3 if photometric in RGB_DECODED else 1
    if not photometric and _lacks_pixel_element(ds, stop):
        return _issue(ref, "validate", "no_pixel_data",
                      f"{sop_class_name(str(ds.get('SOPClassUID', '') or ''))} has no image: no (7FE0,0010) Pixel "
                      "Data and no (0028,0004) Photometric Interpretation (a header exported without its pixels); "
                      "re-export it from the archive with its pixels")
    mosaic = _mosaic_problem(ds)
    if mosaic is not None:
        return _issue(ref, "validate", "unsupported", mosaic)
    # the transfer syntax first: a file no decoder reads (a video's H.264 stream) is that, whatever its
    # photometric says (YBR_PARTIAL_420 is what such files carry; "fix the header" cannot help)
    syntax = str(getattr(ds, "file_meta", Dataset()).get("TransferSyntaxUID", "") or "")
    if not syntax:
        return _issue(ref, "read", "unsupported_transfer_syntax",
                      "the file meta has no (0002,0010) Transfer Syntax UID; re-export the file with one")
    plugin = _DECODERS.get(syntax)
    if plugin is None:
        named = _NEWER_SYNTAXES.get(syntax, UID(syntax).name)
        what = (f"{syntax} ({named})" if named != syntax else
                f"{syntax} (one pydicom {pydicom.__version__} does not know: newer than it, or made up)")
        if syntax in _JPIP_REFERENCED:
            return _issue(ref, "read", "unsupported_transfer_syntax", _jpip_message(ds, what))
        if any(word in named for word in ("MPEG", "HEVC", "H.264", "H.265")):
            # a video stream: no DICOM transcoder (dcmconv, gdcmconv) decodes it to frames
            return _issue(ref, "read", "unsupported_transfer_syntax",
                          f"transfer syntax {what} is a video stream, which packer does not decode; take the "
                          "stream out of the file (its encapsulated Pixel Data item; e.g. gdcmraw -i FILE -o "
                          "clip.mp4) and cut it into frames with ffmpeg (ffmpeg -i clip.mp4 frame-%05d.png) for an "
                          "image source")
        return _issue(ref, "read", "unsupported_transfer_syntax",
                      f"transfer syntax {what} has no pinned decoder; "
                      "transcode it to Explicit VR Little Endian (e.g. dcmconv +te or gdcmconv --raw)")
    if plugin != _PYDICOM and plugin not in get_decoder(syntax).available_plugins:
        package = _PLUGIN_PACKAGES.get(syntax, "pylibjpeg-libjpeg")
        return _issue(ref, "read", "unsupported_transfer_syntax",
                      f"transfer syntax {syntax} ({UID(syntax).name}) needs pydicom's {plugin} decoder with its "
                      f"{package} package, which is not installed here; pip install pylibjpeg {package} (packer's "
                      "own install has it: was the environment changed?)")
    if photometric not in GRAYSCALE + RGB_DECODED + (PALETTE,):
        return _issue(ref, "validate", "unsupported",
                      f"(0028,0004) Photometric Interpretation {photometric or '(missing)'} is not supported; "
                      f"packer reads {', '.join(GRAYSCALE + RGB_DECODED + (PALETTE,))}; fix the header, or convert "
                      "the file to one of these")
    if samples != expected_samples:
        return _issue(ref, "validate", "bad_shape",
                      f"(0028,0002) Samples per Pixel is {samples} but (0028,0004) {photometric} needs "
                      f"{expected_samples}; fix the header or re-export the file")
    high_bit = ds.get("HighBit")
    if isinstance(high_bit, int) and not isinstance(high_bit, bool) and bits_stored <= bits_allocated \
            and high_bit != bits_stored - 1:
        # pydicom reads the low Bits Stored bits whatever High Bit says, so 12 bits stored in bits
        # 4..15 would pack as other numbers (Bits Stored above Bits Allocated is the decoder's to refuse)
        if ds.get("BitsStored") in (None, "", 0):  # read as Bits Allocated: quoting it names a value not there
            given = ("absent" if "BitsStored" not in ds else
                     "0" if ds.get("BitsStored") == 0 else "empty (zero length)")
            return _issue(ref, "validate", "bad_shape",
                          f"(0028,0101) Bits Stored is {given}, so packer would read all {bits_allocated} allocated "
                          f"bits, but (0028,0102) High Bit {high_bit} says {high_bit + 1} bits are stored: the Image "
                          "Pixel module (PS3.3 C.7.6.3) requires Bits Stored (Type 1); set it to the bits the image "
                          f"was written with ({high_bit + 1} where High Bit is right), or re-export the file")
        return _issue(ref, "validate", "bad_shape",
                      f"(0028,0102) High Bit is {high_bit} but (0028,0101) Bits Stored is {bits_stored}: the Image "
                      f"Pixel module (PS3.3 C.7.6.3) requires High Bit = Bits Stored - 1 ({bits_stored - 1}), and "
                      "packer reads the stored values from the low bits only, so its pixels would be other numbers; "
                      "re-export the file with its values in the low bits (or fix the header if they are there "
                      "already)")
    problem = _colour_layout_problem(ds, photometric, columns, syntax)
    if problem is not None:
        return _issue(ref, "validate", *problem)
    return _Geometry(rows, columns, frames, samples, bits_allocated, bits_stored, photometric, syntax)


#: The JPIP Referenced syntaxes (JPIP Referenced, and Deflate; JPIP HTJ2K Referenced, and Deflate): the
#: file holds no Pixel Data, only (0028,7FE0) Pixel Data Provider URL, the JPIP server that has the
#: pixels (PS3.5 A.6 and A.7, and their HTJ2K counterparts)
_JPIP_REFERENCED = frozenset({"1.2.840.10008.1.2.4.94", "1.2.840.10008.1.2.4.95", "1.2.840.10008.1.2.4.204",
                              "1.2.840.10008.1.2.4.205"})
#: The most of a Pixel Data Provider URL a message quotes
_URL_QUOTED = 100


def _jpip_message(ds: Dataset, what: str) -> str:
    """The message for a JPIP Referenced file (:data:`_JPIP_REFERENCED`, ``what`` its syntax named):
    its pixels are on the server its Pixel Data Provider URL names, not in the file, so there is
    nothing a transcoder (dcmconv, gdcmconv) could convert; the instances must be retrieved again in
    a syntax that carries them."""
    url = str(ds.get("PixelDataProviderURL", "") or "").strip()
    where = (f"on the JPIP server its (0028,7FE0) Pixel Data Provider URL names "
             f"({url if len(url) <= _URL_QUOTED else url[:_URL_QUOTED - 3] + '...'!r})" if url else
             "on a JPIP server, though the file names none: it has no (0028,7FE0) Pixel Data Provider URL")
    return (f"transfer syntax {what} keeps the pixels out of the file, {where}; there is nothing "
            "in it to decode or transcode: retrieve the instances from the PACS again in a transfer syntax "
            "that carries the pixels (C-MOVE/C-GET or WADO asking for Explicit VR Little Endian, "
            "1.2.840.10008.1.2.1), not a JPIP one")


#: (0019,100A) Siemens Number of Images in Mosaic (private, SIEMENS MR HEADER / CSA HEADER block 10)
_IMAGES_IN_MOSAIC = 0x0019100A


def _mosaic_problem(ds: Dataset) -> str | None:
    """The message for a Siemens MOSAIC image, None for any other file. (0008,0008) Image Type
    value MOSAIC marks one 2-D image tiling many slices of a volume (fMRI, DWI); where each tile
    lies in the patient is only in the private CSA header, which packer does not read, so it
    cannot cut the tiles into slices without guessing, and packed as it is the mosaic would be
    one slice of many anatomical slices side by side."""
    image_type = ds.get("ImageType")
    values = list(image_type) if isinstance(image_type, MultiValue) else [image_type]
    if not any(str(v).strip().upper() == "MOSAIC" for v in values if v is not None):
        return None
    count = ds.get(_IMAGES_IN_MOSAIC)
    value = count.value if count is not None else None
    tiles = f" {value}" if isinstance(value, int) and not isinstance(value, bool) and value > 0 else ""
    return (f"(0008,0008) Image Type holds MOSAIC: a Siemens mosaic tiles{tiles} slices of a volume into this "
            "one 2-D image, and where each tile lies is only in the private CSA header, which packer does not "
            "read, so it would pack as one slice of many; convert the series with dcm2niix (dcm2niix -o OUT "
            "SERIES_DIR), which unpacks mosaics, and pack the NIfTI files with a nifti source")


def _colour_layout_problem(ds: Dataset, photometric: str, columns: int, syntax: str) -> tuple[str, str] | None:
    """(reason, message) where the colour model cannot hold in this transfer syntax (PS3.3
    C.7.6.3.1.2): YBR_ICT and YBR_RCT only with JPEG 2000, whose decoder undoes the component
    transform (elsewhere nothing would, and Y/Cb/Cr would pack as R/G/B); native YBR_FULL_422 only
    with an even column count (two pixels share each Cb/Cr pair) and interleaved samples
    (Planar Configuration 0), else pydicom pairs the wrong samples and makes up colours."""
    if photometric in ("YBR_ICT", "YBR_RCT") and syntax not in _JPEG_2000:
        return "unsupported", (f"(0028,0004) Photometric Interpretation {photometric} is only valid with a JPEG 2000 "
                               f"transfer syntax (PS3.3 C.7.6.3.1.2), whose decoder undoes the colour transform, "
                               f"but the file is {UID(syntax).name} ({syntax}), so nothing converts its samples "
                               "to RGB; re-export the file as JPEG 2000 or as RGB (or fix the header if the "
                               "samples are RGB already)")
    if photometric != "YBR_FULL_422" or syntax not in _NATIVE:
        return None
    planar = ds.get("PlanarConfiguration")
    if columns % 2 or planar == 1:
        what = (f"(0028,0011) Columns is {columns}, odd" if columns % 2 else
                "(0028,0006) Planar Configuration is 1 (colour-by-plane)")
        return "bad_shape", (f"{what}, but uncompressed YBR_FULL_422 needs an even column count and Planar "
                             "Configuration 0 (PS3.3 C.7.6.3.1.2: two pixels share one Cb/Cr pair, "
                             "stored Y Y Cb Cr), so its samples cannot be paired up; re-export the file as RGB or "
                             "YBR_FULL")
    return None


def _cut_inside_value(ref: SampleRef) -> HeaderCut | None:
    """Where the file ends inside its header (:func:`packer.read.dicom_cut.cut_in_header`: inside
    an element's value, an element's or a sequence item's header, or an undefined-length sequence
    or item before its delimiter), naming the element and the byte counts; ``None`` where the
    header ends cleanly after a whole element, reaches the pixel data, or does not read as a header
    cut short. Called only where a read found no image (no Image Pixel module, a data set that does
    not parse, an object left out): the files that pack never pay for the walk."""
    try:
        return cut_in_header(ref.path)
    except (OSError, ValueError):  # gone since it was read, or mmap refused it: the first verdict stands
        return None


def _cut_issue(ref: SampleRef, sop_class: str | None = None) -> Issue | None:
    """``truncated`` where the file ends inside its header (:func:`_cut_inside_value`), else None;
    the message names the SOP class: the file meta's, else the data set's (``sop_class``; its own
    value may be the one cut short)."""
    cut = _cut_inside_value(ref)
    if cut is None:
        return None
    sop = sop_class_name(cut.sop_class or sop_class or "")
    return _issue(ref, "read", "truncated", f"{sop}: {cut.what}: the file was cut short, copy it again from the "
                                            "source")


def _lacks_pixel_element(ds: Dataset, stop: tuple[int, bytes]) -> bool:
    """Whether the file holds no pixel data element of its own (top level: an Icon Image
    Sequence item's Pixel Data is a thumbnail's): none in ``ds``, nor where a header-only parse
    stopped (``stop``: :func:`_parse_at`'s; see :func:`_pixels_follow`)."""
    return not (any(keyword in ds for keyword in _PIXEL_KEYWORDS) or _pixels_follow(ds, stop))


def _decoded_bytes(geometry: _Geometry) -> tuple[int, str]:
    """Estimated peak bytes of decoding and transforming the file, and what they are made of
    (see :mod:`packer.read.limits`)."""
    per_sample = max(1, geometry.bits_allocated // 8)  # pydicom unpacks 1-bit data to uint8
    pixels = geometry.rows * geometry.columns
    stored = pixels * geometry.frames * geometry.samples * per_sample
    text = (f"{geometry.frames} frame(s) × {geometry.rows}×{geometry.columns} × {geometry.samples} sample(s) × "
            f"{per_sample} byte(s) stored")
    samples = geometry.samples
    if geometry.photometric == PALETTE:
        samples = 3
        stored += pixels * geometry.frames * 3 * 2
        text += ", plus the 3 × 16-bit palette expansion"
    working = 2 * pixels * samples * 8
    return stored + working, f"{text}, plus {working} bytes of float64 working copies of one frame"


#: The elements that say the pixels show text that may identify the patient, and what each means:
#: (0028,0301) Burned In Annotation, and (0048,0010) Specimen Label in Image, the slide label
#: (accession number, barcode, often the patient's name) photographed in a slide image (PS3.3
#: C.8.12.4.1.4), where a scanner may write Burned In Annotation NO (the label is no annotation).
_TEXT_IN_PIXELS = (("BurnedInAnnotation", "(0028,0301) Burned In Annotation is YES: the pixels carry text that may "
                                          "identify the patient"),
                   ("SpecimenLabelInImage", "(0048,0010) Specimen Label in Image is YES: the pixels show the slide's "
                                            "label (accession number, barcode, often the patient's name)"))


def _burned_in(ds: Dataset) -> str | None:
    """What says text is in the pixels (:data:`_TEXT_IN_PIXELS`: an element that is YES, any
    value of a multi-valued one), None where nothing does."""
    for keyword, said in _TEXT_IN_PIXELS:
        value = ds.get(keyword)
        values = list(value) if isinstance(value, MultiValue) else [value]
        if any(str(v).strip().upper() == "YES" for v in values if v is not None):
            return said
    return None


def _check_safety(ref: SampleRef, ds: Dataset, geometry: _Geometry, limits: LimitsConfig,
                  allow_burned_in: bool) -> Issue | None:
    """Header checks that must pass before any pixel is decoded: size limits, burned-in text."""
    decoded, decoded_text = _decoded_bytes(geometry)
    too_big = limit_problem(
        limits, pixels=geometry.rows * geometry.columns, decoded=decoded, decoded_text=decoded_text,
        size_text=f"(0028,0010) Rows {geometry.rows} × (0028,0011) Columns {geometry.columns}",
        frames=geometry.frames, frames_text="(0028,0008) Number of Frames")
    if too_big is not None:
        return _issue(ref, "read", "too_large", too_big)
    text = None if allow_burned_in else _burned_in(ds)
    if text is not None:
        return _issue(ref, "read", "burned_in_annotation",
                      f"{text}, so the file was not decoded. Remove it, or set safety.burned_in_annotation: allow "
                      "in the job file once the text is known to be free of PHI")
    return None


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


#: (7FE0,0010) Pixel Data
_PIXEL_DATA = 0x7FE00010

#: The native transfer syntaxes (PS3.5 A.1, A.2, A.3) by UID: whether explicit VR, whether little endian
_NATIVE_SYNTAXES = {"1.2.840.10008.1.2": (False, True), "1.2.840.10008.1.2.1": (True, True),
                    "1.2.840.10008.1.2.2": (True, False)}


#: (FFFC,FFFC) Data Set Trailing Padding (PS3.10 7.2): a standard element a file may end with
_TRAILING_PADDING = 0xFFFCFFFC


def _trailing_padding(path: str | None, at: int, size: int, explicit: bool, order: Literal["little", "big"]) -> bool:
    """Whether the bytes of ``path`` from ``at`` to its end (``size``) are one Data Set Trailing
    Padding element, which ends a valid file (pydicom's own CT_small.dcm has one)."""
    if path is None:
        return False
    try:
        with open(path, "rb") as handle:
            handle.seek(at)
            head = handle.read(12)
    except OSError:
        return False
    if len(head) < 8 or (int.from_bytes(head[:2], order) << 16 | int.from_bytes(head[2:4], order)) != _TRAILING_PADDING:
        return False
    if explicit and head[4:6] in (b"OB", b"OW", b"OF", b"SQ", b"UT", b"UN", b"OD", b"OL", b"OV", b"UC", b"UR"):
        if len(head) < 12:
            return False
        header, length = 12, int.from_bytes(head[8:12], order)
    elif explicit:
        header, length = 8, int.from_bytes(head[6:8], order)
    else:
        header, length = 8, int.from_bytes(head[4:8], order)
    return at + header + length == size


def pixel_data_problem(ds: Dataset, stop: tuple[int, bytes], size: int, path: str | None = None) -> str | None:
    """Whether a header-only parse's file is its header and one Pixel Data element of the length
    its Image Pixel module gives (Rows × Columns × frames × Samples per Pixel × Bits Allocated / 8,
    even), ending where the file ends: ``""`` where it is, what is wrong where not (a file cut
    short, a second Pixel Data element or other bytes after it, a length the header does not
    give), ``None`` where that cannot be told from the header (an encapsulated or deflated
    syntax, damaged Image Pixel values: the read says why). ``stop``: :func:`_parse_at`'s offset
    and bytes where the header ended; ``size``: the file's size in bytes; ``path``: the file, read
    where bytes follow the Pixel Data to tell a Data Set Trailing Padding element (a valid end)
    from damage."""
    syntax = _NATIVE_SYNTAXES.get(str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "") or ""))
    ints = _pixel_module_ints(ds)
    offset, head = stop
    if syntax is None or isinstance(ints, str) or offset < 0:
        return None
    if not head:
        return "the file ends after its header, without Pixel Data (7FE0,0010): most likely cut short"
    explicit, little = syntax
    order: Literal["little", "big"] = "little" if little else "big"
    if len(head) < (12 if explicit else 8) or int.from_bytes(head[:2], order) != 0x7FE0 \
            or int.from_bytes(head[2:4], order) != 0x0010:
        return None
    length = int.from_bytes(head[8:12] if explicit else head[4:8], order)
    start = offset + (12 if explicit else 8)
    rows, columns, samples, bits, _ = ints
    try:
        frames = max(int(str(ds.get("NumberOfFrames", 1) or 1)), 1)
    except ValueError:
        return None
    expected = -(-rows * columns * frames * samples * bits // 8)
    expected += expected % 2
    if length == 0xFFFFFFFF:
        return None
    if length != expected:
        return (f"its Pixel Data (7FE0,0010) says {length:,} bytes, where Rows {rows} × Columns {columns} × "
                f"{frames} frame(s) × {samples} sample(s) × Bits Allocated {bits} give {expected:,}")
    if start + length > size:
        return f"its Pixel Data runs {start + length - size:,} bytes past the end of the file: it is cut short"
    if start + length < size and not _trailing_padding(path, start + length, size, explicit, order):
        return (f"{size - start - length:,} bytes follow its Pixel Data (7FE0,0010) (a second Pixel Data element "
                "or other bytes after the image): the file is damaged")
    return ""


def reread_placed(ref: SampleRef, placed: HeaderFingerprint) -> Dataset | None:
    """The whole file parsed for the pixel pass without probing its header again, when it is
    the file the header pass probed (``placed``: :attr:`SliceGeometry.fingerprint`) and that probe
    could not have seen less: the same size and mtime now, and nothing after its Pixel Data
    (so the whole parse holds the header pass's elements and Pixel Data alone). Every check of
    :func:`probe_dicom` (size limits included: the job's limits are the same in both passes)
    ran then on the same bytes and passed, and every header element was converted; Pixel Data
    is converted here as the full probe converts it. None otherwise (the caller probes the file
    as any other, with every outcome that gives). Saves a CT slice's second header probe: 1.5 →
    0.6 ms a file."""
    try:
        whole = _read_whole(ref.path)
    except OSError:
        return None
    if whole is None or (whole.size, whole.mtime_ns) != (placed.size, placed.mtime_ns):
        return None
    try:
        with whole:
            ds = pydicom.dcmread(whole)
    except _PARSE_ERRORS:
        return None
    pixels = ds.get_item(_PIXEL_DATA)
    if (len(ds) != placed.elements + 1 or not isinstance(pixels, RawDataElement) or pixels.value_tell is None
            or pixels.value_tell + pixels.length != whole.size):
        return None
    converted = _convert_elements(ref, ds, tags=(_PIXEL_DATA,))
    return converted if isinstance(converted, Dataset) else None


def probe_dicom(ref: SampleRef, *, entity_keyword: str, time_keywords: tuple[str, ...],
                limits: LimitsConfig = DEFAULT_LIMITS, allow_burned_in: bool = False,
                keep_pixels: bool = False, label_keyword: str | None = None,
                placement: bool = False, where: Sequence[Condition] = (),
                slices: bool = True, annotations: bool = False) -> DicomHeader | Issue | MemberIssue | Excluded:
    """Header-only read of ``ref.path``: geometry, SOP class, transfer syntax, entity and time.

    Issues: ``unreadable`` (zero bytes, OSError, unparsable header), ``not_dicom`` (no preamble
    + ``DICM``), ``no_pixel_data`` (no Image Pixel module; names the SOP class), ``bad_shape``,
    ``unsupported`` (photometric, a Siemens MOSAIC), ``unsupported_transfer_syntax``, ``too_large`` (file size,
    inflated size, Number of Frames, Rows × Columns or the decoded size over ``limits``),
    ``burned_in_annotation`` ((0028,0301) is YES and ``allow_burned_in`` is False). A missing
    entity or time is not an issue here: those fields are ``None`` and discovery decides.

    Before any of those checks, the header decides what the file is
    (:mod:`packer.read.dicom_objects`): one the source's header conditions ``where`` leave out is
    Excluded ``filtered``; an object without an image (SR, PR, KO, RT Plan, RTSTRUCT, SEG, ...)
    ``not_image``; an RT Dose, a secondary capture or (``slices``: a job of single files) a
    localizer that ``where`` does not ask for, ``not_requested``. None of them is a bad sample.

    ``annotations``: the job reads the source's SEG and RTSTRUCT objects as masks
    (``mask: {from: dicom}``): such an object is neither excluded nor checked as an image (nor
    by ``where``, which selects images); its header gives what it references
    (:attr:`DicomHeader.annotation`, :func:`packer.read.annotations.annotation_refs`).

    ``keep_pixels``: parse the whole file once and keep it in ``DicomHeader.dataset`` for
    :func:`read_dicom` (the pixel pass; saves a second parse of every header). When the whole
    file does not parse, or parses to no data set at all, the header-only read runs instead, so
    the outcome is exactly that of a header-only probe (a file cut inside its pixel data still
    probes fine, and the read then says ``truncated``; native Pixel Data of undefined length,
    ``unreadable``).
    """
    before = _stat(ref.path) if placement and not keep_pixels else None
    ds, stop = _parse_at(ref, header_only=not keep_pixels, limits=limits)
    # An empty data set: pydicom drops the whole file, with a warning only, when it ends inside
    # undefined-length Pixel Data; the header-only read sees what it can, and the read says why.
    if keep_pixels and (isinstance(ds, Issue) or len(ds) == 0):
        return probe_dicom(ref, entity_keyword=entity_keyword, time_keywords=time_keywords, limits=limits,
                           allow_burned_in=allow_burned_in, label_keyword=label_keyword, placement=placement,
                           where=where, slices=slices, annotations=annotations)
    if isinstance(ds, Issue):
        return _salvaged(ref, ds) if annotations and ds.reason in _SALVAGED else ds
    too_big = file_too_large(ref, limits) if not keep_pixels else None  # a whole read checked it
    if annotations and too_big is not None and annotation_modality(ds) is not None:
        return too_big  # its references may lie in what the bounded read skipped
    if annotations and annotation_modality(ds) is not None:
        return _annotation_header(ref, ds, entity_keyword, time_keywords)
    if annotations and len(ds) == 0:  # the file meta alone (cut inside it): what do its bytes say?
        empty = _check_image(ref, ds)
        if isinstance(empty, Issue):
            return _salvaged(ref, empty)
    excluded = _excluded(ref, ds, where, slices=slices, pixels=_pixels_follow(ds, stop))
    if excluded is not None:
        # a where: judges only a header read whole: an image-class one cut short is a bad sample. A non-image
        # object (SR, RTSTRUCT, KO, PR) pydicom read is left out unwalked (its cut is told only where its
        # header cannot be read, above): the walk reads the whole file, seconds for a 100 MB RTSTRUCT
        cut = (_cut_issue(ref, str(ds.get("SOPClassUID", "") or ""))
               if _lacks_pixel_element(ds, stop) and classify(ds, (), slices=False).why != "not_image" else None)
        return cut or excluded
    if too_big is not None:  # an image (only an image is read whole), over the limit: never read whole
        return _member(too_big, ds, entity_keyword) if placement else too_big
    geometry = _check_image(ref, ds, stop)
    if isinstance(geometry, Issue):
        return _member(geometry, ds, entity_keyword) if placement else geometry
    problem = _check_safety(ref, ds, geometry, limits, allow_burned_in)
    if problem is not None:
        return _member(problem, ds, entity_keyword) if placement else problem
    try:
        spacing = pixel_spacing(ds, 0)
        placed = slice_geometry(ds) if placement else None
    except DamagedElement as err:
        return _member(_damaged(ref, err), ds, entity_keyword) if placement else _damaged(ref, err)
    if placed is not None and before is not None:
        pixels = pixel_data_problem(ds, stop, before.st_size, ref.path)
        placed = replace(placed, fingerprint=HeaderFingerprint(size=before.st_size, mtime_ns=before.st_mtime_ns,
                                                               elements=len(ds), pixels=pixels))
    label = label_value(ref, ds, label_keyword)
    if isinstance(label, Issue):  # its own label: its series packs without it
        return _member(label, ds, entity_keyword, holds=False) if placement else label
    timed = record_time(ds, tuple(time_keywords))
    return DicomHeader(
        entity=text_value(ds, entity_keyword),
        time=timed,
        time_note=missing_time_note(ds, tuple(time_keywords)) if timed is None else None,
        rows=geometry.rows, columns=geometry.columns, frames=geometry.frames,
        samples_per_pixel=geometry.samples,
        sop_class_uid=str(ds.get("SOPClassUID", "") or ""),
        transfer_syntax_uid=geometry.transfer_syntax,
        modality=str(ds.get("Modality", "") or ""),
        photometric_interpretation=geometry.photometric,
        pixel_spacing=spacing,
        dataset=ds if keep_pixels else None,
        label_value=label,
        geometry=placed,
        instance=instance_digest(ds),
    )


def _member(issue: Issue, ds: Dataset, entity_keyword: str, *, holds: bool = True) -> Issue | MemberIssue:
    """``issue`` with the series its file's header names (entity as the header gives it, Study
    and Series Instance UIDs), for the header pass: that series is not packed without the file
    (unless not ``holds``: a refusal of the file's own label), and an annotation of it, where no
    series of it is made, gets this file's reason (its Series and SOP Instance UIDs:
    :attr:`MemberIssue.names`). The Issue alone where the header does not name one (a UID
    missing or damaged too), and for a multi-frame file, a series of its own."""
    try:
        study = str(ds.get("StudyInstanceUID", "") or "").strip()
        series = str(ds.get("SeriesInstanceUID", "") or "").strip()
        instance = str(ds.get("SOPInstanceUID", "") or "").strip()
        entity = text_value(ds, entity_keyword) or ""
        frames = str(ds.get("NumberOfFrames", "") or "1").strip()
    except (DamagedElement, AttributeError, TypeError, ValueError, KeyError, OverflowError):
        return issue
    if not study or not series or frames not in ("", "1"):  # a multi-frame file is a series of its own
        return issue
    return MemberIssue(issue=issue, group=(entity, study, series),
                       names=tuple(uid for uid in (series, instance) if uid), holds=holds)


def _annotation_header(ref: SampleRef, ds: Dataset, entity_keyword: str,
                       time_keywords: Sequence[str]) -> DicomHeader | Issue:
    """The header of a SEG or RTSTRUCT read as a mask: identity and what it references."""
    try:
        refs = _cut_refs(ref, annotation_refs(ds))
    except DamagedElement as err:
        refs = _damaged_refs(ds, f"{err}; the header is corrupt, copy the file again")
    except (AttributeError, TypeError, ValueError, KeyError) as err:  # a malformed sequence
        refs = _damaged_refs(ds, f"its {annotation_modality(ds)} references cannot be read ({type(err).__name__}: "
                                 f"{err}); the annotation is not used")
    return DicomHeader(entity=text_value(ds, entity_keyword), time=record_time(ds, tuple(time_keywords)), rows=0,
                       columns=0, frames=0, samples_per_pixel=0, sop_class_uid=str(ds.get("SOPClassUID", "") or ""),
                       transfer_syntax_uid="", modality=refs.modality, annotation=refs)


#: The records of a file that did not parse, which may be an annotation's (with masks from DICOM).
_SALVAGED = ("unreadable", "not_dicom", "truncated")


def _salvaged(ref: SampleRef, issue: Issue) -> DicomHeader | Issue:
    """With masks from DICOM, a file that does not parse (``issue``) as the annotation its bytes
    show it is, or may be (:func:`packer.read.annotation_salvage.salvage_refs`: linking keeps
    ``issue`` as its record and ties it to the series it may annotate); ``issue`` itself where
    the bytes say it is none."""
    from packer.read.annotation_salvage import SALVAGE_BYTES, salvage_refs

    try:
        with open(ref.path, "rb") as handle:
            data = handle.read(SALVAGE_BYTES)
    except OSError:  # a file that cannot be opened: its record already says so
        return issue
    prefix = f"{ref.relpath or ref.path}: "
    why = issue.message[len(prefix):] if issue.message.startswith(prefix) else issue.message
    refs = salvage_refs(data, issue.reason, why)
    if refs is None:
        return issue
    return DicomHeader(entity=None, time=None, rows=0, columns=0, frames=0, samples_per_pixel=0, sop_class_uid="",
                       transfer_syntax_uid="", modality=refs.modality, annotation=refs)


#: How many bytes at a file's end hold any UID value it may end inside (64 characters at most)
_UID_TAIL = 128


def _cut_refs(ref: SampleRef, refs: AnnotationRefs) -> AnnotationRefs:
    """``refs`` as damaged where the annotation file ends inside the value of a UID that links it
    (its Study Instance UID, a Frame of Reference, a referenced series' or instance's UID): pydicom
    keeps the partial value without a word, and linking would take "1.2.826.0" for a whole UID, tying
    the annotation to another study or frame of reference than its series', or to a series no source
    holds, so the series packed with all-zero masks. The partial UID is dropped (the whole ones still
    tie it) and the file is ``unreadable`` (a SEG: ``annotation_frames``, as a truncated SEG is),
    saying it is cut short: its series are not packed empty
    (:func:`packer.read.dicom_masks.link`). Only a file whose last bytes are one of those UIDs is
    walked (:func:`packer.read.dicom_cut.cut_in_header`: the walk would take seconds on a large
    RTSTRUCT); ``refs`` unchanged otherwise."""
    uids = {uid for uid in (refs.study_uid, *refs.series_uids, *refs.instance_uids, *refs.frames_of_reference) if uid}
    if not uids:
        return refs
    try:
        with open(ref.path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(size - _UID_TAIL, 0))
            tail = handle.read().rstrip(b"\0 ")
    except OSError:  # gone since it was parsed: the parse's verdict stands
        return refs
    partial = {uid for uid in uids if tail.endswith(uid.encode("ascii", "replace"))}
    cut = _cut_inside_value(ref) if partial else None
    if cut is None:
        return refs

    def whole(values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(uid for uid in values if uid not in partial)

    return replace(refs, study_uid="" if refs.study_uid in partial else refs.study_uid,
                   series_uids=whole(refs.series_uids), instance_uids=whole(refs.instance_uids),
                   frames_of_reference=whole(refs.frames_of_reference), declared=None,
                   damaged_reason="annotation_frames" if refs.modality == "SEG" else "unreadable",
                   damaged=(f"{cut.what}: the {refs.modality or 'annotation'} is cut short inside a UID that ties it "
                            "to its series, which is not taken as a whole UID; copy it again from the source"))


def _damaged_refs(ds: Dataset, why: str) -> AnnotationRefs:
    """The references of an annotation whose header's references cannot be read: none, its
    study where that still reads, and ``why`` (linking makes it an ``unreadable`` record)."""
    try:
        study = str(element(ds, "StudyInstanceUID", "") or "").strip()
    except DamagedElement:
        study = ""
    return AnnotationRefs(modality=annotation_modality(ds) or "", study_uid=study, series_uids=(), instance_uids=(),
                          frames_of_reference=(), damaged=why)


#: A pixel data element's tag, (7FE0,0010), (7FE0,0008) or (7FE0,0009), as little- and big-endian files write it
_PIXEL_TAG_BYTES = tuple(b for element in (0x10, 0x08, 0x09)
                         for b in (bytes((0xE0, 0x7F, element, 0x00)), bytes((0x7F, 0xE0, 0x00, element))))


def _pixels_follow(ds: Dataset, stop: tuple[int, bytes]) -> bool | None:
    """Whether a header-only parse (``stop``: :func:`_parse_at`'s) stopped at a pixel data element,
    None after a whole parse (its data set holds the pixels, if any). A deflated data set's bytes
    cannot be looked at: an Image Pixel module (Rows and Columns) stands for its pixels there."""
    offset, head = stop
    if offset < 0:
        return None
    syntax = str(getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "") or "")
    if syntax == DeflatedExplicitVRLittleEndian:
        return "Rows" in ds and "Columns" in ds
    return head[:4] in _PIXEL_TAG_BYTES


def _excluded(ref: SampleRef, ds: Dataset, where: Sequence[Condition], *, slices: bool,
              pixels: bool | None = None) -> Excluded | None:
    """The file's Excluded record when its header leaves it out on purpose (see :func:`probe_dicom`;
    ``pixels``: :func:`_pixels_follow`)."""
    if len(ds) == 0:
        return None  # no data set at all: _check_image calls it unreadable
    kind = classify(ds, where, slices=slices, pixels=pixels)
    failure = header_failure(ds, where)
    if failure is not None and not header_unread(ds):  # a damaged header: _check_image says why
        return Excluded.of(ref, stage="read", why="filtered", detail=failure, modality=kind.modality,
                           sop_class=kind.sop_class)
    if kind.why is not None:
        return Excluded.of(ref, stage="read", why=kind.why, detail=kind.detail, modality=kind.modality,
                           sop_class=kind.sop_class)
    return None


#: The probe reads this much of a file's head itself (:func:`_check_inflated`), so a rehearsal does too.
_PROBE_HEAD = 1 << 16
#: Deflated Explicit VR Little Endian (PS3.5 A.5): the probe inflates the whole data set.
_DEFLATED_BYTES = _DEFLATED.encode()


def rehearse_header_reads(handle: Any) -> bool:
    """Read from ``handle`` (a binary file with ``read_at(offset, count)``, ``seek`` and ``read``)
    what :func:`probe_dicom` (header only) reads from the same file: the first 64 KiB (preamble,
    file meta), then what pydicom's ``dcmread(stop_before_pixels=True)`` reads, which ends at the
    Pixel Data element. True, having read no more, when the probe reads the whole file: the
    transfer syntax may be deflated (the probe inflates the whole data set to size it)."""
    head = handle.read_at(0, _PROBE_HEAD)
    if head[128:132] != b"DICM":
        return False  # the probe stops at the preamble: not_dicom
    if _DEFLATED_BYTES in head:  # a superset of "the file meta names it"
        return True
    handle.seek(0)
    try:
        pydicom.dcmread(handle, stop_before_pixels=True)
    except Exception:  # noqa: BLE001 - not reported here: the probe meets the same bytes on the copy
        return False  # and reports the error itself
    return False


def read_dicom(ref: SampleRef, cfg: DicomTransformConfig, *, limits: LimitsConfig = DEFAULT_LIMITS,
               allow_burned_in: bool = False, dataset: Dataset | None = None,
               entity_keyword: str | None = None) -> list[Sample] | Issue:
    """Decode ``ref.path`` once, validate it and transform every frame into C×H×W samples.

    Returns one Sample per frame (``frames: split``, keys ``<id>-f0000``…; single-frame files keep
    ``<id>``) or one Sample with frames as channels (``frames: stack``), or one Issue:
    read/``truncated`` (pixel bytes missing, or encapsulated data cut short), read/``unreadable``
    (native Pixel Data of undefined length, which only encapsulated data may have), read/``decode_failed``,
    validate/``constant_image``, validate/``missing_window``, transform/``unsupported`` (float16
    overflow), plus every issue of :func:`probe_dicom` (``too_large`` and ``burned_in_annotation``
    are checked again here, before decoding). Anything unforeseen becomes read/``unexpected_error``
    with the file, the exception type and message (:func:`packer.read.at_boundary`, the read
    stage's one boundary). ``dataset``: the file as :func:`probe_dicom` parsed it with
    ``keep_pixels`` (not parsed again). ``entity_keyword``: the source's ``entity:``; when its
    element holds bytes the declared character set cannot decode, each sample says so in
    ``metadata.warnings`` (:func:`~packer.read.dicom_attrs.undecodable_note`).
    """
    return at_boundary(ref, lambda progress: _read(ref, cfg, limits, allow_burned_in, dataset, entity_keyword),
                       name=ref.relpath or ref.path)


def _read(ref: SampleRef, cfg: DicomTransformConfig, limits: LimitsConfig, allow_burned_in: bool,
          dataset: Dataset | None = None, entity_keyword: str | None = None) -> list[Sample] | Issue:
    ds = dataset if dataset is not None else _parse(ref, header_only=False, limits=limits)
    if isinstance(ds, Issue):
        return ds
    geometry = _check_image(ref, ds)
    if isinstance(geometry, Issue):
        if geometry.reason in ("no_pixel_data", "unreadable"):
            return _cut_inside_pixel_data(ref, limits) or geometry
        return geometry
    problem = _check_safety(ref, ds, geometry, limits, allow_burned_in)
    if problem is not None:
        return problem
    decoded = _decode(ref, ds, geometry)
    if isinstance(decoded, Issue):
        return decoded
    pixels = decoded.pixels
    color_bits = _palette_bits(ds) if geometry.photometric == PALETTE else geometry.bits_stored
    metadata = _base_metadata(ds, geometry)
    notes = [undecodable_note(ds, entity_keyword) if entity_keyword else None,
             _dark_palette_note(ds) if geometry.photometric == PALETTE else None,
             _wide_palette_note(ds) if geometry.photometric == PALETTE else None,
             _signed_colour_note(ds, geometry), _codestream_planar_note(ds, geometry),
             _excess_padding_note(ds, geometry), decoded.note]
    if any(note is not None for note in notes):
        metadata["warnings"] = [note for note in notes if note is not None]
    try:
        return render_samples(ref, ds, pixels, cfg, photometric=geometry.photometric, color_bits=color_bits,
                              base_metadata=metadata, max_pixels=limits.max_pixels)
    except DamagedElement as err:
        return _damaged(ref, err)


def _expected_native_bytes(geometry: _Geometry) -> int:
    """PS3.5 8.1.1: native pixel data length, without the even-length pad byte."""
    count = geometry.rows * geometry.columns * geometry.frames
    if geometry.bits_allocated == 1:
        return -(-count * geometry.samples // 8)
    per_pixel = 2 if geometry.photometric == "YBR_FULL_422" else geometry.samples  # 4:2:2 halves chroma
    return count * per_pixel * geometry.bits_allocated // 8


#: The (FFFE,E000) Item tag, little endian: encapsulated Pixel Data starts with it (its Basic
#: Offset Table item, PS3.5 A.4).
_ITEM_TAG = b"\xfe\xff\x00\xe0"

_CUT_ENCAPSULATED = ("the encapsulated (7FE0,0010) Pixel Data ends before its (FFFE,E0DD) sequence delimiter: "
                     "the file was cut short; copy it again from the source")


def _native_undefined_length(ref: SampleRef, syntax: str) -> Issue:
    """The issue of native (uncompressed) Pixel Data whose length is undefined (FFFFFFFF)."""
    return _issue(ref, "read", "unreadable",
                  f"(7FE0,0010) Pixel Data has an undefined length (FFFFFFFF), but transfer syntax {syntax} "
                  f"({UID(syntax).name}) stores pixels uncompressed, and native Pixel Data must state its length "
                  "(PS3.5 A.4 allows an undefined length only for encapsulated, compressed data): the writer of this "
                  "file is broken, and where its pixels end is a guess. Re-export the file, or rewrite it with a "
                  "converter that writes the length (e.g. dcmconv from DCMTK or gdcmconv from GDCM)")


def _undefined_length_issue(ref: SampleRef, syntax: str) -> Issue:
    """What an undefined-length (7FE0,0010) Pixel Data element that pydicom could not read says:
    under a compressed syntax the encapsulated data lacks its end (the file was cut short); under a
    native one the element may not have an undefined length at all."""
    if syntax in _NATIVE:
        return _native_undefined_length(ref, syntax)
    return _issue(ref, "read", "truncated", _CUT_ENCAPSULATED)


def _cut_inside_pixel_data(ref: SampleRef, limits: LimitsConfig) -> Issue | None:
    """pydicom drops the *whole* dataset (with only a warning) when a file ends inside undefined-
    length pixel data (found by looking for its sequence delimiter); the header read still sees the
    Image Pixel module then. The issue of such a file (:func:`_undefined_length_issue`), or None."""
    head, stop = _parse_at(ref, header_only=True, limits=limits)
    if isinstance(head, Issue):
        return None
    geometry = _check_image(ref, head, stop)
    if isinstance(geometry, Issue) or not _has_undefined_pixel_tag(ref.path):
        return None
    return _undefined_length_issue(ref, geometry.transfer_syntax)


#: The start of an undefined-length (7FE0,0010) element: Explicit VR OB or OW, little and big
#: endian, and Implicit VR Little Endian.
_UNDEFINED_PIXEL_TAGS = (b"\xe0\x7f\x10\x00OB\x00\x00\xff\xff\xff\xff", b"\xe0\x7f\x10\x00OW\x00\x00\xff\xff\xff\xff",
                         b"\x7f\xe0\x00\x10OB\x00\x00\xff\xff\xff\xff", b"\x7f\xe0\x00\x10OW\x00\x00\xff\xff\xff\xff",
                         b"\xe0\x7f\x10\x00\xff\xff\xff\xff")


def _has_undefined_pixel_tag(path: str) -> bool:
    """Whether the file holds the start of an undefined-length (7FE0,0010) element (PS3.5 A.4)."""
    with open(path, "rb") as handle:
        data = handle.read()
    return any(marker in data for marker in _UNDEFINED_PIXEL_TAGS)


def _frames_cut_short(ds: Dataset, geometry: _Geometry) -> str | None:
    """How encapsulated pixel data falls short of what the header declares, None where it does
    not: fewer frames than (0028,0008) Number of Frames, or a frame that lacks its end (JPEG,
    JPEG-LS and JPEG 2000 codestreams end with the EOI/EOC marker FFD9; an RLE frame must hold
    every segment its header points to), with the fix."""
    try:
        frames = list(generate_frames(ds.PixelData, number_of_frames=geometry.frames))
    except _DECODE_ERRORS:
        return "its fragments cannot be split into frames; copy the file again"
    if len(frames) < geometry.frames:
        return (f"it holds {len(frames)} frame(s) where (0028,0008) Number of Frames declares {geometry.frames}: a "
                "file cut short (copy it again), or a wrong count (where the file is whole, fix the header)")
    rle = geometry.transfer_syntax == _RLE
    for index, frame in enumerate(frames):
        if rle:
            count, *offsets = struct.unpack("<16L", frame[:64]) if len(frame) >= 64 else (1, len(frame))
            if any(offset >= len(frame) for offset in offsets[:count]):
                return f"RLE frame {index} ends before the segments its header points to; copy the file again"
        elif b"\xff\xd9" not in frame[-16:]:  # the marker, then at most padding (no codestream holds FF D9 else)
            return f"frame {index} lacks its end marker (FFD9); copy the file again"
    return None


#: JPEG 2000's two starts: a codestream's SOC marker then SIZ (ITU T.800 A.5.1), or a JP2 file's
#: signature box (T.800 I.5.1)
_J2K_STARTS = (b"\xff\x4f\xff\x51", b"\x00\x00\x00\x0cjP  \r\n\x87\n")


def _starts_as(frame: bytes, syntax: str) -> bool:
    """Whether ``frame`` starts as a frame of ``syntax`` does: an RLE header of 1 to 15 segments
    (PS3.5 G.5), a JPEG 2000 codestream or JP2 file (:data:`_J2K_STARTS`), or a JPEG / JPEG-LS
    SOI marker (FFD8). A frame too short to tell (cut short) passes."""
    if syntax == _RLE:
        return len(frame) < 4 or 1 <= struct.unpack_from("<L", frame)[0] <= 15
    starts = _J2K_STARTS if syntax in _JPEG_2000 else (b"\xff\xd8",)
    return any(frame[:len(start)] == start[:len(frame)] for start in starts)


def _frame_not_its_codec(ds: Dataset, geometry: _Geometry) -> str | None:
    """What is wrong where a frame of encapsulated pixel data does not start as a frame of the
    transfer syntax the file meta names (an RLE file relabelled JPEG by a broken converter: the
    decoder fails and the frame lacks FFD9, which is no truncation), None where each does (or
    the fragments cannot be split into frames: :func:`_frames_cut_short` says so)."""
    syntax = geometry.transfer_syntax
    try:
        frames = list(islice(generate_frames(ds.PixelData, number_of_frames=geometry.frames), geometry.frames))
    except _DECODE_ERRORS:
        return None
    for index, frame in enumerate(frames):
        if not _starts_as(frame, syntax):
            return (f"the file meta names {syntax} ({UID(syntax).name}) but frame {index} does not start as one (it "
                    f"starts {frame[:8].hex(' ')}…), which no cut can do; the transfer syntax is wrong: re-export the "
                    "file")
    return None


def _component_mismatch(ds: Dataset, geometry: _Geometry) -> str | None:
    """What is wrong where a frame's JPEG, JPEG-LS or JPEG 2000 codestream holds another number of
    components (its SOFn's Nf, its SIZ's Csiz: :func:`~packer.read.limits.codestream_components`)
    than (0028,0002) Samples per Pixel gives each pixel (a palette's 1 index), None where each
    frame's does (or none says). The decoder fails on such a frame with numpy's "could not
    broadcast input array from shape (1536,) into shape (4608,)", which names neither; which of
    the two is wrong packer does not guess, so the message says how to make the header match."""
    try:
        frames = list(islice(generate_frames(ds.PixelData, number_of_frames=geometry.frames), geometry.frames))
    except _DECODE_ERRORS:
        return None
    for index, frame in enumerate(frames):
        components = codestream_components(frame)
        if components is None or components == geometry.samples:
            continue
        name = UID(geometry.transfer_syntax).name
        codec = "JPEG 2000" if geometry.transfer_syntax in _JPEG_2000 else "JPEG-LS" if "JPEG-LS" in name else "JPEG"
        said = (f"frame {index}'s {codec} codestream holds {components} component{'s' if components != 1 else ''} "
                f"but (0028,0002) Samples per Pixel is {geometry.samples} and (0028,0004) Photometric "
                f"Interpretation {geometry.photometric}: the header does not describe the frames, and packer does "
                "not guess which of the two is right")
        if components == 1:
            fix = ("set (0028,0002) Samples per Pixel to 1 and (0028,0004) Photometric Interpretation to MONOCHROME2 "
                   "(MONOCHROME1 where the frames display inverted), removing (0028,0006) Planar Configuration")
        elif components == 3:
            fix = ("set (0028,0002) Samples per Pixel to 3, (0028,0004) Photometric Interpretation to the colour "
                   "model the frames hold (RGB; YBR_FULL_422 or YBR_FULL for a lossy JPEG colour frame in YCbCr, as "
                   "most encoders write one; YBR_ICT or YBR_RCT for a JPEG 2000 one with its colour transform) and "
                   "(0028,0006) Planar Configuration to 0")
        else:
            return (f"{said}; no Photometric Interpretation packer reads takes {components} components (1 or 3): "
                    "re-export the file from its source")
        return f"{said}; where the frames are right, {fix}; else re-export the file from its source"
    return None


#: JPEG Baseline (Process 1) and Extended (Process 2 & 4): the syntaxes whose 8-bit frames
#: :func:`_jpeg_scan_lost` checks (lossless JPEG is not TurboJPEG's; 12-bit Extended neither)
_JPEG_CHECKED = ("1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51")


def _jpeg_scan_lost(ds: Dataset, geometry: _Geometry) -> tuple[str, str] | None:
    """(reason, what) for the first 8-bit JPEG Baseline/Extended frame whose scan data loses
    pixels, None where none does. A frame cut inside its scan that still ends with FFD9 passes
    :func:`_frames_cut_short`, and pylibjpeg's libjpeg decodes it without an error, padding the
    lost rows with grey: libjpeg-turbo in strict mode (:func:`packer.read.jpeg_scan.check_scan`)
    reports it. A check only: the frames are decoded by the pinned plugin as before, so the packed
    bytes do not change; a frame TurboJPEG cannot open is left unchecked."""
    if geometry.transfer_syntax not in _JPEG_CHECKED:
        return None
    try:
        frames = list(generate_frames(ds.PixelData, number_of_frames=geometry.frames))
    except _DECODE_ERRORS:
        return None  # _frames_cut_short reports fragments that cannot be split
    for index, frame in enumerate(frames[:geometry.frames]):
        header = codestream_header(frame)
        if header is None or header.precision != 8:
            continue
        try:
            check_scan(frame)
        except Defect as defect:
            return defect.reason, f"frame {index}: {defect.message}"
    return None


#: Transfer syntaxes DICOM defines (PS3.6 Table A-1, 2024-2025 editions) that pydicom 3.0 does not
#: name, so a file in one is told what it is, not that its syntax is unknown.
_NEWER_SYNTAXES = {
    "1.2.840.10008.1.2.4.110": "JPEG XL Lossless",
    "1.2.840.10008.1.2.4.111": "JPEG XL JPEG Recompression",
    "1.2.840.10008.1.2.4.112": "JPEG XL",
    "1.2.840.10008.1.2.8.1": "Deflated Image Frame Compression",
}


#: RLE Lossless: the decodable syntax whose frames carry no end marker (JPEG, JPEG-LS and JPEG 2000
#: codestreams end with FFD9), so nothing in its fragments says where one frame ends
_RLE = "1.2.840.10008.1.2.5"
#: The ISO 10918 (JPEG) syntaxes: pylibjpeg-libjpeg returns their samples in 8 bits (precision up
#: to 8) or 16, and pydicom lays them out by Bits Allocated, where it sizes JPEG-LS and JPEG 2000
#: samples by the codestream's precision (its pylibjpeg decoder's ``bits_allocated`` option)
_JPEG_10918 = frozenset({"1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57",
                         "1.2.840.10008.1.2.4.70"})


def _unsplittable_fragments(ds: Dataset, geometry: _Geometry) -> str | None:
    """What is wrong with multi-frame RLE pixel data that holds more fragments than (0028,0008)
    Number of Frames and no Basic Offset Table, None where that is not so. Without an offset table
    frames are told apart by the end marker of their codestream, which an RLE frame does not have:
    pydicom then joins every fragment into one frame, which read as "truncated, 1 frame". The file
    is whole; it holds a fragment too many (RLE puts each frame in one fragment, PS3.5 A.4.2) or
    declares too few frames. (The caller has checked that there is no Extended Offset Table.)"""
    if geometry.transfer_syntax != _RLE or geometry.frames < 2:
        return None
    try:
        buffer = io.BytesIO(ds.PixelData)
        if parse_basic_offsets(buffer):
            return None
        fragments, _ = parse_fragments(buffer)
    except _DECODE_ERRORS:
        return None  # not splittable into items at all: the decoder reports it
    if fragments <= geometry.frames:
        return None
    return (f"the encapsulated (7FE0,0010) Pixel Data holds {fragments} fragments for the {geometry.frames} frames "
            "(0028,0008) Number of Frames declares, more fragments than frames, and it has neither a Basic Offset "
            "Table nor an Extended Offset Table to say which fragments make up which frame; RLE frames carry no end "
            "marker, so the frames cannot be told apart (RLE Lossless puts each frame in one fragment, PS3.5 "
            "A.4.2). Nothing is missing, nothing was decoded: fix (0028,0008) Number of Frames where the file holds "
            "more frames, or re-export it with one fragment per frame or with an offset table")


def _rle_segment_problem(frame: bytes, want: int) -> tuple[int, int] | None:
    """(segment, decoded length) of the first segment of RLE ``frame`` that decodes past the
    ``want`` bytes (Rows × Columns) a segment holds, by more than one pad byte (PS3.5 G.3.1 pads an
    odd count; some writers pad an even one too), with anything but zeros there; None where none
    does. pydicom only warns of "non-conformant padding" and keeps each segment's first ``want``
    bytes: a Columns or Rows one short packs sheared. A header that is no RLE header is left to the
    decoder; so is a segment that decodes short (pydicom raises)."""
    if len(frame) < 64:
        return None
    count, *offsets = struct.unpack_from("<16L", frame)
    if not 1 <= count <= 15:
        return None
    for segment, (start, end) in enumerate(zip(offsets[:count], [*offsets[1:count], len(frame)], strict=True)):
        if not 64 <= start <= end <= len(frame):
            return None
        length = _rle_decoded_length(frame, start, end)
        if length > want + 1 and _rle_excess_is_data(frame[start:end], want):
            return segment, length
    return None


def _rle_decoded_length(frame: bytes, pos: int, end: int) -> int:
    """How many bytes the PackBits segment ``frame[pos:end]`` decodes to (PS3.5 G.3.1), as pydicom
    decodes it (a run cut by the segment's end gives what is there). Lengths only, nothing copied:
    one step a header byte (about 3 ms for a 512×512 CT slice, a quarter of pydicom's decoding)."""
    length = header = 0
    while pos < end:
        header = frame[pos]
        if header < 128:  # a literal run of header + 1 bytes
            pos += header + 2
            length += header + 1
        elif header > 128:  # one byte repeated 257 - header times
            pos += 2
            length += 257 - header
        else:  # 128: no operation
            pos += 1
    if pos > end:  # the last run is cut by the segment's end
        length -= pos - end if header < 128 else 257 - header
    return length


def _rle_excess_is_data(segment: bytes, want: int) -> bool:
    """Whether PackBits ``segment`` decodes to anything but zeros past its first ``want`` bytes
    and the one pad byte after them (only asked of a segment that decodes that long)."""
    decoded, pos = bytearray(), 0
    while pos < len(segment):
        header = segment[pos]
        if header < 128:
            decoded += segment[pos + 1:pos + header + 2]
            pos += header + 2
        elif header > 128:
            decoded += segment[pos + 1:pos + 2] * (257 - header)
            pos += 2
        else:
            pos += 1
    excess = decoded[want + 1:]
    return excess.count(0) != len(excess)


def _check_frames(ref: SampleRef, ds: Dataset, geometry: _Geometry) -> Issue | None:
    """Before decoding encapsulated data: each frame's own JPEG / JPEG-LS / JPEG 2000 header must
    say Rows × Columns (the decoder allocates what the codestream says, and pydicom reshapes a
    64×48 codestream under a 48×64 header without a word: rows scrambled) and a bit depth Bits
    Allocated holds (a 12-bit codestream under Bits Allocated 8 came back as each value's low
    byte) and, for JPEG (ISO 10918), one no narrower than the decoder's 8- or 16-bit samples (an
    8-bit codestream under Bits Allocated 16 failed in numpy's broadcast), and there must not be
    more frames than (0028,0008) says, nor fragments that cannot be told apart into frames
    (:func:`_unsplittable_fragments`). Data too broken to split into frames is left to the
    decoder, which reports it."""
    extended = None
    if "ExtendedOffsetTable" in ds and "ExtendedOffsetTableLengths" in ds:
        extended = (ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths)
    elif (unsplittable := _unsplittable_fragments(ds, geometry)) is not None:
        return _issue(ref, "validate", "bad_shape", unsplittable)
    rle = geometry.transfer_syntax == _RLE
    try:
        frames = generate_frames(ds.PixelData, number_of_frames=geometry.frames, extended_offsets=extended)
        for index, frame in enumerate(islice(frames, geometry.frames + 1)):
            if index == geometry.frames:
                return _issue(ref, "validate", "bad_shape",
                              f"the encapsulated (7FE0,0010) Pixel Data holds more than the {geometry.frames} "
                              "frame(s) (0028,0008) Number of Frames declares; fix the header")
            if rle and (long := _rle_segment_problem(frame, geometry.rows * geometry.columns)) is not None:
                want = geometry.rows * geometry.columns
                return _issue(ref, "validate", "bad_shape",
                              f"RLE frame {index}'s segment {long[0]} decodes to {long[1]} bytes, but (0028,0010) "
                              f"Rows {geometry.rows} × (0028,0011) Columns {geometry.columns} give {want} a segment "
                              "(one more byte may pad it, zeros past it are padding), and the bytes past them are "
                              "not zeros: the header does not describe the stored image, which would pack sheared "
                              "(pydicom keeps the first bytes of each segment); check Rows and Columns against "
                              "the image, fix the wrong one, or re-export the file")
            header = codestream_header(frame)
            if header is None:
                continue
            if (header.rows, header.columns) != (geometry.rows, geometry.columns):
                return _issue(ref, "validate", "bad_shape",
                              f"frame {index}'s codestream header says {header.rows}×{header.columns} pixels but "
                              f"(0028,0010) Rows × (0028,0011) Columns say {geometry.rows}×{geometry.columns}; "
                              "nothing was decoded, fix the header or re-export the file")
            if header.precision > geometry.bits_allocated:
                return _issue(ref, "validate", "bad_shape",
                              f"frame {index}'s codestream holds {header.precision}-bit values but (0028,0100) "
                              f"Bits Allocated is {geometry.bits_allocated}, which cannot hold them (the decoder "
                              "would keep the low bits of each); nothing was decoded, fix Bits Allocated and Bits "
                              "Stored or re-export the file")
            container = 8 if header.precision <= 8 else 16
            if geometry.transfer_syntax in _JPEG_10918 and geometry.bits_allocated > container:
                return _issue(ref, "validate", "bad_shape",
                              f"frame {index}'s codestream holds {header.precision}-bit values but (0028,0100) "
                              f"Bits Allocated is {geometry.bits_allocated}: the JPEG decoder returns them in "
                              f"{container} bits, which cannot be laid out as {geometry.bits_allocated}; nothing was "
                              f"decoded, fix Bits Allocated (to {container}) and Bits Stored, or re-export the file")
    except _DECODE_ERRORS:
        return None
    return None


def _declared_length(ref: SampleRef, element: DataElement, syntax: str) -> int | None:
    """The value length the file declares for its top-level native pixel data ``element``: the
    4-byte length just before the value (a long VR's, explicit or implicit VR; pydicom keeps the
    bytes it found, fewer where the file ends inside the value, and not the length). None where it
    cannot be read: a deflated data set (its offsets are the inflated stream's), an explicit VR
    there that is not a long one, a file that cannot be read again."""
    tell = getattr(element, "file_tell", None)
    if syntax == _DEFLATED or not isinstance(tell, int) or tell < 8:
        return None
    try:
        with open(ref.path, "rb") as handle:
            handle.seek(tell - 8)
            head = handle.read(8)
    except OSError:
        return None
    if len(head) != 8 or (syntax != _IMPLICIT and head[:2] not in LONG_VRS):
        return None
    return int.from_bytes(head[4:], "big" if syntax == _BIG_ENDIAN else "little")


def _decode(ref: SampleRef, ds: Dataset, geometry: _Geometry) -> _Decoded | Issue:
    """Decode all frames with the pinned plugin → (frames, rows, columns, samples), native order."""
    keyword = next((kw for kw in _PIXEL_KEYWORDS if kw in ds), None)
    encapsulated = geometry.transfer_syntax not in _NATIVE
    if keyword is None:
        if _has_undefined_pixel_tag(ref.path):
            return _undefined_length_issue(ref, geometry.transfer_syntax)
        return _issue(ref, "validate", "no_pixel_data",
                      f"{sop_class_name(str(ds.get('SOPClassUID', '') or ''))} has an Image Pixel module but no "
                      "(7FE0,0010) Pixel Data element (the file may have been cut short); copy it again, or "
                      "re-export it with its pixels")
    if not encapsulated:
        if ds[keyword].is_undefined_length:  # pydicom found an end by looking for a sequence delimiter
            return _native_undefined_length(ref, geometry.transfer_syntax)
        have, want = len(ds[keyword].value or b""), _expected_native_bytes(geometry)
        if keyword != "PixelData":
            want = geometry.rows * geometry.columns * geometry.frames * geometry.bits_allocated // 8
        declared = _declared_length(ref, ds[keyword], geometry.transfer_syntax) if have < want else None
        if have < want and declared is not None and declared <= have:
            # the element is whole (a cut file holds less than its element declares): the header is wrong
            return _issue(ref, "validate", "bad_shape",
                          f"({keyword}) holds {have} bytes, the whole length its element declares, where Rows "
                          f"{geometry.rows} × Columns {geometry.columns} × Number of Frames {geometry.frames} × "
                          f"Samples per Pixel {geometry.samples} × Bits Allocated {geometry.bits_allocated} give "
                          f"{want}: the header describes more pixels than the pixel data holds (no byte is missing); "
                          "check (0028,0010) Rows, (0028,0011) Columns, (0028,0008) Number of Frames, (0028,0002) "
                          "Samples per Pixel and (0028,0100) Bits Allocated against the image, fix the wrong one, or "
                          "re-export the file")
        if have < want:
            return _issue(ref, "read", "truncated",
                          f"({keyword}) holds {have} bytes, {want} expected for Rows {geometry.rows} × Columns "
                          f"{geometry.columns} × Frames {geometry.frames} × Samples {geometry.samples} × "
                          f"{geometry.bits_allocated} bits; the file was cut short, copy it again")
        if have > want + want % 2 and _excess_is_data(ds[keyword].value, want):
            # PS3.5 8.1.1/7.1: native data is that long, plus one pad byte where it is odd; older writers
            # padded further with zeros, which its Note says to accept (_excess_padding_note). Excess that
            # is not zeros is no padding: pydicom would read the first ``want`` bytes, and a Columns one
            # short of the stored width would pack sheared (each row starting one pixel later)
            return _issue(ref, "validate", "bad_shape",
                          f"({keyword}) holds {have} bytes, where Rows {geometry.rows} × Columns {geometry.columns} "
                          f"× Number of Frames {geometry.frames} × Samples per Pixel {geometry.samples} × Bits "
                          f"Allocated {geometry.bits_allocated} give {want}"
                          f"{f' ({want + 1} with its pad byte)' if want % 2 else ''}, and the bytes past them are not "
                          "zero padding: the header does not describe the stored image; check (0028,0010) Rows, "
                          "(0028,0011) Columns, (0028,0008) Number of Frames, (0028,0002) Samples per Pixel and "
                          "(0028,0100) Bits Allocated against the image, fix the wrong one, or re-export the file")
    else:
        value = ds[keyword].value or b""
        if len(value) >= 4 and value[:4] != _ITEM_TAG:
            return _issue(ref, "read", "decode_failed",
                          f"{ds[keyword].tag} {keyword} is not encapsulated: it starts with {value[:4].hex(' ')}, "
                          f"not the Item tag (FFFE,E000) that transfer syntax {geometry.transfer_syntax} "
                          f"({UID(geometry.transfer_syntax).name}) requires; the file meta names a compressed "
                          "syntax its pixels are not in (a broken converter?): re-export the file")
        problem = _check_frames(ref, ds, geometry)
        if problem is not None:
            return problem
    if geometry.photometric == PALETTE and (short := _palette_length_problem(ds)) is not None:
        return _issue(ref, "read", "decode_failed", short)
    plugin = _DECODERS[geometry.transfer_syntax]
    # colour samples flagged signed are read as the unsigned values they are (_signed_colour_note)
    unsigned: dict[str, Any] = {"pixel_representation": 0} if _overrules_signed(ds, geometry) else {}
    note: str | None = None
    try:
        # Encapsulated: decode only the frames the header declares (and _check_frames sized), not
        # whatever else the fragments hold: pydicom's default would decode excess frames too.
        # Planar Configuration 0 for every codestream: PS3.5 8.2 makes the header's value irrelevant
        # there (the codestream fixes the component layout, and the decoders return colour-by-pixel),
        # but pydicom re-reads the output as colour-by-plane where the header says 1 (the RLE and
        # JPEG-LS decoders set the layout they return themselves, over this option).
        if encapsulated:
            decoded = pixel_array(ds, decoding_plugin=plugin, allow_excess_frames=False, planar_configuration=0,
                                  **unsigned)
            arr, clipped = _fitted_to_bits_stored(decoded, lambda: _lossy_frames(ds, geometry), geometry.bits_stored)
            note = _overshoot_note(clipped, _stored_range(decoded.dtype, geometry.bits_stored), geometry) \
                if clipped else None
        else:
            # Native: the frames the header declares too. Bytes past them were checked above (the
            # raw value, not what pydicom returns): data is bad_shape, zeros are padding, dropped
            # here (_excess_padding_note); pydicom's default would return zero padding of a
            # frame's size or more as extra frames (and mis-slice 1-bit data)
            arr = pixel_array(ds, decoding_plugin=plugin, allow_excess_frames=False, **unsigned)
        if geometry.photometric == PALETTE:
            arr = apply_color_lut(arr, ds)
        if encapsulated and (short := _frames_cut_short(ds, geometry)) is not None:
            if (wrong := _frame_not_its_codec(ds, geometry)) is not None:
                return _issue(ref, "read", "decode_failed", f"{wrong} ({plugin} decoded it anyway, not packed)")
            # libjpeg (and OpenJPEG) decode a codestream cut short without an error, filling the
            # missing rows with padding: made-up pixels that would pack as data
            return _issue(ref, "read", "truncated",
                          f"encapsulated pixel data is cut short ({plugin} decoded it anyway by filling in the "
                          f"missing part, which is not packed): {short}")
        if (lost := _jpeg_scan_lost(ds, geometry)) is not None:
            return _issue(ref, "read", lost[0], f"encapsulated pixel data ({plugin} decoded it anyway), {lost[1]}")
    except _DECODE_ERRORS as err:
        if encapsulated and (wrong := _frame_not_its_codec(ds, geometry)) is not None:
            failed = f"{plugin}: {type(err).__name__}: {err}" if str(err) else f"{plugin}: {type(err).__name__}"
            return _issue(ref, "read", "decode_failed", f"{wrong} ({failed})")
        if encapsulated and (short := _frames_cut_short(ds, geometry)) is not None:
            failed = f" ({plugin}: {type(err).__name__}: {err})" if str(err) else ""
            return _issue(ref, "read", "truncated", f"encapsulated pixel data is cut short{failed}: {short}")
        if encapsulated and (mismatch := _component_mismatch(ds, geometry)) is not None:
            return _issue(ref, "read", "decode_failed", f"{mismatch} ({plugin}: {type(err).__name__})")
        return _issue(ref, "read", "decode_failed", f"{plugin} could not decode {UID(geometry.transfer_syntax).name} "
                                                    f"pixel data: {type(err).__name__}: {err}; re-export the file "
                                                    "from its source (where the message names an Image Pixel "
                                                    "attribute, (0028,xxxx), fix that attribute instead)")
    samples = 3 if geometry.photometric == PALETTE else geometry.samples
    want_size = geometry.frames * geometry.rows * geometry.columns * samples
    if arr.size != want_size:
        if encapsulated and (mismatch := _component_mismatch(ds, geometry)) is not None:
            return _issue(ref, "read", "decode_failed", f"{mismatch} ({plugin} decoded it to {arr.size} values)")
        return _issue(ref, "validate", "bad_shape",
                      f"decoded {arr.shape} ({arr.size} values) but the header describes {geometry.frames} frame(s) "
                      f"of {geometry.rows}×{geometry.columns}×{samples}; fix (0028,0008) Number of Frames, Rows, "
                      "Columns or Bits Allocated, or re-export the file")
    arr = arr.reshape(geometry.frames, geometry.rows, geometry.columns, samples)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return _Decoded(arr, note)


def _overrules_signed(ds: Dataset, geometry: _Geometry) -> bool:
    """Whether a colour image's (0028,0103) Pixel Representation 1 is overruled and its stored
    bits read as unsigned: R, G, B and Y, Cb, Cr samples are unsigned (a YBR sample's no-colour Cb/Cr
    is half full scale, PS3.3 C.7.6.3.1.2; the US Image module, C.8.5.6.1, allows 0 only), and so
    are palette indices, except where the palette's descriptor starts at a negative index (its
    second value, PS3.3 C.7.6.3.1.5): such a palette was written for signed indices. Read signed,
    every sample of 8 bits >= 128 was negative and packed as 0 (and YBR was not converted at all)."""
    if ds.get("PixelRepresentation") != 1 or geometry.photometric in GRAYSCALE:
        return False
    if geometry.photometric != PALETTE:
        return True
    descriptor = ds.get("RedPaletteColorLookupTableDescriptor")
    first = descriptor[1] if isinstance(descriptor, (list, MultiValue)) and len(descriptor) >= 2 else None
    return not (isinstance(first, int) and first < 0)


def _signed_colour_note(ds: Dataset, geometry: _Geometry) -> str | None:
    """The warning for a colour image whose Pixel Representation 1 was overruled
    (:func:`_overrules_signed`); None otherwise."""
    if not _overrules_signed(ds, geometry):
        return None
    what = "palette indices" if geometry.photometric == PALETTE else f"{geometry.photometric} samples"
    return (f"(0028,0103) Pixel Representation is 1 (signed), but {what} are unsigned (the US Image module, "
            "PS3.3 C.8.5.6.1, allows 0 only): the header's value was overruled and the stored "
            f"{geometry.bits_stored} bits read as unsigned; set it to 0 in the file "
            "(e.g. dcmodify -m \"(0028,0103)=0\")")


@dataclass(frozen=True)
class _Decoded:
    """A file's decoded stored values (frames × rows × columns × samples) and the warning its
    decoding earned (:func:`_overshoot_note`), None where it earned none."""

    pixels: np.ndarray
    note: str | None


#: The decodable syntaxes whose codestreams may be lossy (PS3.5 8.2: JPEG Baseline/Extended's DCT,
#: JPEG-LS near-lossless, irreversible JPEG 2000 and HTJ2K): their decoders reconstruct values
#: approximately, and a codestream whose precision exceeds Bits Stored (Bits Allocated's 16, as
#: encoders write it) can come back a few levels outside Bits Stored's range at saturated pixels.
#: The lossless-only syntaxes are not here: what they decode is what was written, bit for bit.
#: Which frames are lossy is told by each one's codestream (:func:`_lossy_frames`), but for
#: :data:`_LOSSY_BY_PROCESS`.
_LOSSY_CAPABLE = frozenset({
    "1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.81", "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.203"})
#: JPEG Baseline and Extended: the DCT processes, lossy whatever a frame holds.
_LOSSY_BY_PROCESS = frozenset({"1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51"})
_JPEG_LS_NEAR_LOSSLESS = "1.2.840.10008.1.2.4.81"


def _lossy_frames(ds: Dataset, geometry: _Geometry) -> list[bool]:
    """For each frame of encapsulated Pixel Data, whether its codestream is lossy, as the codestream
    itself says (:func:`~packer.read.limits.codestream_lossy`: JPEG 2000's and HTJ2K's wavelet,
    JPEG-LS's NEAR), not its transfer syntax alone: 1.2.840.10008.1.2.4.81, .91 and .203 allow
    lossless coding too, and a reversible codestream's values past Bits Stored are bits above High
    Bit, to be masked, not an overshoot to clip. Each frame is told by its own codestream, not the
    first frame's for all: the frames of a file need not share an encoder (a series merged into a
    multi-frame object, a lossless key frame among lossy ones). All False under a lossless-only
    syntax, all True under JPEG Baseline/Extended (:data:`_LOSSY_BY_PROCESS`); a frame whose
    markers cannot be read, or frames that cannot be told apart, are taken as the syntax allows
    (lossy), as before the codestream was read. A reversible wavelet proves no lossless coding
    (a 5-3 codestream whose coding passes a rate cut is lossy too: OpenJPEG's ``-r``, Kakadu's
    ``Creversible=yes`` with a rate), so a header that says the image was coded lossily (Lossy
    Image Compression "01", PS3.3 C.7.6.1.1.5) makes every JPEG 2000 or HTJ2K frame lossy whatever
    its wavelet. Not a JPEG-LS frame: NEAR bounds every sample's error (ISO 14495-1), so NEAR 0
    proves the codestream lossless, and "01" stays on an image once lossy-coded, then transcoded
    losslessly (a lossy JPEG archive moved to JPEG-LS), where its values past the range are bits
    above High Bit still."""
    syntax, count = geometry.transfer_syntax, geometry.frames
    if syntax not in _LOSSY_CAPABLE or syntax in _LOSSY_BY_PROCESS:
        return [syntax in _LOSSY_CAPABLE] * count
    if syntax != _JPEG_LS_NEAR_LOSSLESS and str(ds.get("LossyImageCompression", "")).strip() == "01":
        return [True] * count
    extended = None
    if "ExtendedOffsetTable" in ds and "ExtendedOffsetTableLengths" in ds:
        extended = (ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths)
    try:
        frames = list(islice(generate_frames(ds.PixelData, number_of_frames=count, extended_offsets=extended), count))
    except _DECODE_ERRORS:
        return [True] * count
    if len(frames) != count:
        return [True] * count
    return [codestream_lossy(frame) is not False for frame in frames]


def _fitted_to_bits_stored(decoded: np.ndarray, lossy_frames: Callable[[], list[bool]],
                           bits_stored: int) -> tuple[np.ndarray, int]:
    """``decoded`` (all frames, frames first where more than one) with each frame's values past Bits
    Stored's range clipped to it where the frame's codestream is lossy and they are its overshoot
    (:func:`_lossy_overshoot`), else cut to their low ``bits_stored`` bits (:func:`_stored_bits_only`),
    frame by frame as ``lossy_frames()`` says (asked only where a value lies past the range: its
    codestreams are not read for a file whose values all fit, the usual case); and how many values
    were clipped. ``decoded`` itself, not copied, where no frame changes."""
    low, high = _stored_range(decoded.dtype, bits_stored)
    if decoded.dtype.kind not in "iu" or decoded.size == 0 or low <= int(decoded.min()) <= int(decoded.max()) <= high:
        return decoded, 0
    lossy = lossy_frames()
    if len(lossy) < 1 or decoded.size % len(lossy):  # frames that cannot be told apart: one, lossy if any is
        lossy = [any(lossy)]
    frames = decoded.reshape(len(lossy), -1)
    out, flat, clipped = decoded, frames, 0
    for index, (frame, is_lossy) in enumerate(zip(frames, lossy, strict=True)):
        overshoot = _lossy_overshoot(frame, bits_stored) if is_lossy else 0
        fitted = _clipped_to_stored_range(frame, bits_stored) if overshoot else _stored_bits_only(frame, bits_stored)
        clipped += overshoot
        if fitted is frame:
            continue
        if out is decoded:
            out = decoded.copy()
            flat = out.reshape(len(lossy), -1)
        flat[index] = fitted
    return out, clipped


def _stored_range(dtype: np.dtype, bits_stored: int) -> tuple[int, int]:
    """The lowest and highest value ``bits_stored`` bits hold, two's complement where ``dtype`` is signed."""
    if dtype.kind == "i":
        return -(1 << (bits_stored - 1)), (1 << (bits_stored - 1)) - 1
    return 0, (1 << bits_stored) - 1


def _lossy_overshoot(arr: np.ndarray, bits_stored: int) -> int:
    """How many of a lossy-capable codestream's decoded values lie outside Bits Stored's range
    where all of them lie so near it that they are the coder's reconstruction error at saturated
    pixels (4095 → 4098 for 12 bits unsigned, -2048 → -2052 signed); 0 where none lies outside, or
    where any lies further out: those are bits above High Bit, no pixel data, which
    :func:`_stored_bits_only` drops.

    The margin, an eighth of the range (512 levels for 12 bits): a garbage bit above High Bit
    moves a value by at least the whole range (4096 for bit 12), and sets it on almost every pixel;
    a lossy coder's overshoot is its error at an edge against the range's end, a few levels for
    near-lossless JPEG-LS (NEAR at most) and for JPEG 2000 at diagnostic rates, under a tenth of the
    edge's height even for ringing at high compression."""
    width = arr.dtype.itemsize * 8
    if arr.dtype.kind not in "iu" or not 0 < bits_stored < width or arr.size == 0:
        return 0
    low, high = _stored_range(arr.dtype, bits_stored)
    least, most = int(arr.min()), int(arr.max())
    if low <= least and most <= high:
        return 0
    margin = (1 << bits_stored) // 8
    if least < low - margin or most > high + margin:
        return 0
    return int(np.count_nonzero((arr < low) | (arr > high)))


def _clipped_to_stored_range(arr: np.ndarray, bits_stored: int) -> np.ndarray:
    """``arr`` clipped to Bits Stored's range (a lossy codestream's overshoot, :func:`_lossy_overshoot`)."""
    low, high = _stored_range(arr.dtype, bits_stored)
    return np.clip(arr, low, high).astype(arr.dtype, copy=False)


def _overshoot_note(clipped: int, stored_range: tuple[int, int], geometry: _Geometry) -> str:
    """The warning for a lossy codestream's values clipped to Bits Stored's range (:func:`_lossy_overshoot`)."""
    low, high = stored_range
    return (f"{clipped} decoded value(s) lay just outside {low}..{high}, the range of (0028,0101) Bits Stored "
            f"{geometry.bits_stored}: the codestream is coded lossily, as it or (0028,2110) Lossy Image Compression "
            f"says (transfer syntax {geometry.transfer_syntax}, "
            f"{UID(geometry.transfer_syntax).name}), and its reconstruction overshoots "
            "saturated pixels by a few levels; they were "
            f"clipped to the range, not cut to their low {geometry.bits_stored} bits (which would turn the "
            "brightest pixels dark, or the darkest bright): nothing to fix in the file")


def _stored_bits_only(arr: np.ndarray, bits_stored: int) -> np.ndarray:
    """``arr`` with only its low ``bits_stored`` bits, sign-extended where it is signed: what
    pydicom gives for native and RLE data (PS3.5 8.1.1: the bits above High Bit are no pixel
    data), and what a JPEG 2000 or JPEG-LS codestream that carries those bits too (its precision
    Bits Allocated, not Bits Stored) decodes to without it (a lossy codestream's few values just
    past the range are clipped instead: :func:`_lossy_overshoot`). Unchanged, not copied, where every
    value lies in Bits Stored's range already (the usual case)."""
    width = arr.dtype.itemsize * 8
    if arr.dtype.kind not in "iu" or not 0 < bits_stored < width or arr.size == 0:
        return arr
    signed = arr.dtype.kind == "i"
    low, high = (-(1 << (bits_stored - 1)), (1 << (bits_stored - 1)) - 1) if signed else (0, (1 << bits_stored) - 1)
    if low <= int(arr.min()) and int(arr.max()) <= high:
        return arr
    unsigned = np.dtype(arr.dtype.str.replace("i", "u"))
    kept = arr.view(unsigned) & unsigned.type((1 << bits_stored) - 1)
    if not signed:
        return kept
    sign = unsigned.type(1 << (bits_stored - 1))
    return ((kept ^ sign) - sign).view(arr.dtype)  # two's complement from bit bits_stored - 1 (wraps as unsigned)


def _base_metadata(ds: Dataset, geometry: _Geometry) -> dict[str, Any]:
    """Per-file metadata with no PS3.15 Annex E attribute (no names, IDs, dates, UIDs but the
    transfer syntax, institution)."""
    meta: dict[str, Any] = {
        "modality": str(ds.get("Modality", "") or "") or None,
        "photometric_interpretation": geometry.photometric,
        "rows": geometry.rows,
        "columns": geometry.columns,
        "number_of_frames": geometry.frames,
        "bits_stored": geometry.bits_stored,
        "transfer_syntax": geometry.transfer_syntax,
        "decoder": _DECODERS[geometry.transfer_syntax],
    }
    for key, keyword in (("body_part_examined", "BodyPartExamined"),
                         ("manufacturer_model_name", "ManufacturerModelName")):
        value = text_value(ds, keyword)
        if value is not None:
            meta[key] = value
    kvp = first_float(ds.get("KVP"))
    if kvp is not None:
        meta["kvp"] = kvp
    if geometry.photometric == PALETTE:
        meta["palette_bits"] = _palette_bits(ds)
    return meta


def _excess_is_data(value: bytes | None, want: int) -> bool:
    """Whether native Pixel Data ``value`` holds anything but zero bytes past the ``want`` its
    header describes (and the one pad byte of an odd length)."""
    excess = (value or b"")[want + want % 2:]
    return bool(excess) and excess.count(0) != len(excess)


def _excess_padding_note(ds: Dataset, geometry: _Geometry) -> str | None:
    """The warning for native Pixel Data padded with zeros past the image its header describes
    (pydicom's ``MR_small_padded.dcm``: 128 bytes past a 64×64 image); None otherwise. PS3.5
    8.1.1's Note: older applications sent such excess padding, which was not prohibited, and
    readers should accept it and may delete it; so the image is read and the padding dropped,
    and the sample says so (a header one column short over a black border would look the same)."""
    if geometry.transfer_syntax not in _NATIVE or "PixelData" not in ds:
        return None
    value = ds.PixelData or b""
    want = _expected_native_bytes(geometry)
    if len(value) <= want + want % 2 or _excess_is_data(value, want):
        return None
    return (f"(7FE0,0010) Pixel Data holds {len(value) - want} zero byte(s) past the {want} its Rows, Columns, "
            "Number of Frames, Samples per Pixel and Bits Allocated describe: read as padding (PS3.5 8.1.1) and "
            "dropped; if the image looks sheared, a Rows or Columns value is wrong: fix the header")


def _codestream_planar_note(ds: Dataset, geometry: _Geometry) -> str | None:
    """The warning for colour pixel data in a JPEG or JPEG 2000 codestream whose header says
    (0028,0006) Planar Configuration 1; None otherwise. PS3.5 8.2 makes the value irrelevant for
    compressed syntaxes (the codestream fixes the layout; for JPEG it "shall be 0"), so packer
    decodes such frames colour-by-pixel (:func:`_decode`) and records that the header was
    overruled. RLE defines its own layout, colour-by-plane, whatever the header says."""
    if geometry.samples < 2 or geometry.transfer_syntax in _NATIVE or geometry.transfer_syntax == _RLE \
            or ds.get("PlanarConfiguration") != 1:
        return None
    return (f"(0028,0006) Planar Configuration is 1 (colour-by-plane), but the pixel data is "
            f"{UID(geometry.transfer_syntax).name}, whose codestream defines the component layout (PS3.5 8.2: "
            "the value is irrelevant there): the frames were decoded colour-by-pixel as the codestream holds "
            "them; the header's value was ignored (fix it to 0 to silence this)")


def _dark_palette_note(ds: Dataset) -> str | None:
    """The warning for a PALETTE COLOR file whose Palette Color Lookup Table Descriptors declare
    16 bits per entry while no entry of its palette exceeds 255; None otherwise.

    PS3.3 C.7.6.3.1.6 gives a 16-bit palette's entries the range 0..65535, so such an image is
    rendered nearly black (255 of 65535 is level 1 of 255). Some writers put 8-bit values in
    16-bit tables, but the field's readers do not agree on rescaling them: pydicom's
    ``apply_color_lut`` and GDCM return the 16-bit entries as they are, Cornerstone (OHIF)
    shifts them right by 8 bits (black), dcmtk reads them as 8 bits only when asked to
    (``--check-lut-depth``). So packer keeps the standard's reading (the palette is not
    rescaled) and says so on each sample."""
    if _declared_palette_bits(ds) != 16:
        return None
    largest = _largest_palette_entry(ds)
    if largest > 255:
        return None
    return (f"(0028,1101-1103) Palette Color Lookup Table Descriptors declare 16 bits per entry, yet no palette "
            f"entry exceeds {largest} of 65535: read as PS3.3 C.7.6.3.1.6 defines (entries over 0..65535) the "
            "image is nearly black, and it was packed so; the palette was not rescaled (some writers put 8-bit "
            "values in 16-bit tables, but pydicom, GDCM and Cornerstone/OHIF read them as 16-bit, dcmtk only "
            "with --check-lut-depth as 8-bit); if its colours are meant in 0..255, fix the file: multiply each "
            "entry by 257, or declare 8 bits per entry")


def _wide_palette_note(ds: Dataset) -> str | None:
    """The warning for a PALETTE COLOR file whose descriptors declare 8 bits per entry while its
    Palette Color Lookup Table Data holds 16-bit words with entries above 255; None otherwise.

    An 8-bit entry cannot exceed 255, so such entries are 16-bit values under a wrong descriptor
    (some vendors write them): pydicom's ``apply_color_lut`` reads them as 16-bit from the
    data's length, and read over 0..255 nearly every pixel would clip to white, made-up colours.
    So packer reads them over 0..65535 (:func:`_palette_bits`) and says so on each sample: the
    converse of :func:`_dark_palette_note`."""
    if _declared_palette_bits(ds) != 8:
        return None
    largest = _largest_palette_entry(ds)
    if largest <= 255:
        return None
    return (f"(0028,1101-1103) Palette Color Lookup Table Descriptors declare 8 bits per entry, yet the (0028,1201-"
            f"1203) Palette Color Lookup Table Data holds 16-bit entries up to {largest}, which 8 bits cannot "
            "hold: the entries were read as 16-bit values over 0..65535 (as pydicom reads them), not clipped to "
            "255; if that is not what the file means, fix its descriptors (third value 16) or its entries")


_PALETTE_COLOURS = (("Red", "1"), ("Green", "2"), ("Blue", "3"), ("Alpha", "4"))


def _palette_length_problem(ds: Dataset) -> str | None:
    """What is wrong with a PALETTE COLOR file whose Palette Color Lookup Table Data do not hold
    the entries the (0028,1101) Red Palette Color Lookup Table Descriptor's first value declares
    (PS3.3 C.7.6.3.1.6; 0 means 65536), else None. An entry is one 16-bit word (2n bytes) or one
    byte (n bytes), the two layouts ``apply_color_lut`` reads (from the data's length); any
    other length it fails on with its own dtype error ("data type 'uint14' not understood"),
    which names nothing in the file. As for a Modality or VOI LUT of the wrong count
    (:func:`~packer.read.dicom_attrs.read_lut`), the message names the descriptor, the data and
    both counts. A segmented palette, or one whose descriptor is malformed, is left to the decoder."""
    descriptor = ds.get("RedPaletteColorLookupTableDescriptor")
    if descriptor is None:
        return None
    try:
        entries, bits = int(descriptor[0]) % 65536 or 65536, int(descriptor[2])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    for colour, digit in _PALETTE_COLOURS:
        data = ds.get(f"{colour}PaletteColorLookupTableData")
        if not isinstance(data, bytes) or len(data) in (entries, 2 * entries) or (colour == "Alpha" and not data):
            continue
        size = len(data)
        declared = (f"(0028,1101) Red Palette Color Lookup Table Descriptor declares {entries} entries of {bits} bits "
                    f"but (0028,120{digit}) {colour} Palette Color Lookup Table Data holds {size} bytes "
                    f"({size / 2:g} 16-bit entries, or {size} 8-bit ones), where {2 * entries} (one 16-bit word an "
                    f"entry) or {entries} (one byte an entry) are expected")
        if size < (2 * entries if bits > 8 else entries):  # looked up past its end: the last entry's colour
            return f"{declared}; the palette is cut short: re-export the file"
        return (f"{declared}: one of the two is wrong, and the palette cannot be read without guessing which; fix "
                "the descriptors' (0028,1101-1103) first value or re-export the file")
    return None


def _declared_palette_bits(ds: Dataset) -> int:
    """The bits per entry the (0028,1101) Red Palette Color Lookup Table Descriptor declares."""
    descriptor = ds.get("RedPaletteColorLookupTableDescriptor") or (0, 0, 16)
    return 8 if int(descriptor[2]) == 8 else 16


def _largest_palette_entry(ds: Dataset) -> int:
    """The largest entry of the file's palette, as pydicom's ``apply_color_lut`` reads it."""
    descriptor = ds.get("RedPaletteColorLookupTableDescriptor")
    entries, first = (int(descriptor[0]) or 65536, int(descriptor[1])) if descriptor else (65536, 0)
    palette = apply_color_lut(np.arange(first, first + entries, dtype=np.int64), ds)
    return int(palette.max()) if palette.size else 0


def _palette_bits(ds: Dataset) -> int:
    """The bits per entry the palette's entries are read over: the descriptors' (PS3.3
    C.7.6.3.1.6), except 16 where they declare 8 but entries exceed 255 (:func:`_wide_palette_note`)."""
    declared = _declared_palette_bits(ds)
    return 16 if declared == 8 and _largest_palette_entry(ds) > 255 else declared
