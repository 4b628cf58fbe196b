"""An RT Structure Set's Contour Sequence items read from their raw bytes, where pydicom would build a Dataset each.

pydicom parses a sequence when it is first accessed: a Dataset for every Contour Sequence item
and every Contour Image Sequence item inside it, each element through its converters (a
structure set of 721 contours took 0.5 s so). The rasteriser (:mod:`packer.read.rtstruct`)
reads five elements of a contour item: Contour Geometric Type (3006,0042), Number of Contour
Points (3006,0046), Contour Data (3006,0050) and, in its Contour Image Sequence (3006,0016),
Referenced SOP Instance UID (0008,1155) and Referenced Frame Number (0008,1160).
:func:`contour_items` walks the value of a Contour Sequence that pydicom left raw and reads
those, in little endian, explicit or implicit VR, at about a twentieth of the cost.

It reads only what it can read as pydicom would: defined lengths everywhere, items and
elements that end exactly where their lengths say, tags in ascending order, in explicit VR the
VR the standard gives each element read (and a known VR for every other), a geometric type of
upper-case letters, digits, ``_`` and spaces, numbers of plain digits, UIDs of digits and dots.
Anything else (undefined lengths, big endian, a damaged length, a multi-valued or empty type or
count, another VR) returns None, and the caller lets pydicom parse the sequence: every value,
note, error and message is then pydicom's, as before. Contour Data is kept as its raw text
for the rasteriser, which parses it as it parses pydicom's raw element.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset

CONTOUR_SEQUENCE = 0x30060040
CONTOUR_IMAGE_SEQUENCE = 0x30060016
CONTOUR_GEOMETRIC_TYPE = 0x30060042
NUMBER_OF_CONTOUR_POINTS = 0x30060046
CONTOUR_DATA = 0x30060050
REFERENCED_SOP_INSTANCE_UID = 0x00081155
REFERENCED_FRAME_NUMBER = 0x00081160

#: The VR each element read must have in an explicit VR file.
_VRS = {CONTOUR_IMAGE_SEQUENCE: b"SQ", CONTOUR_GEOMETRIC_TYPE: b"CS", NUMBER_OF_CONTOUR_POINTS: b"IS",
        CONTOUR_DATA: b"DS", REFERENCED_SOP_INSTANCE_UID: b"UI", REFERENCED_FRAME_NUMBER: b"IS"}
#: Explicit VRs with a 2-byte reserved field and a 4-byte length (PS3.5 7.1.2); the rest of _SHORT have 2.
_LONG = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
_SHORT = frozenset({b"AE", b"AS", b"AT", b"CS", b"DA", b"DS", b"DT", b"FL", b"FD", b"IS", b"LO", b"LT", b"PN",
                    b"SH", b"SL", b"SS", b"ST", b"TM", b"UI", b"UL", b"US"})
_ITEM = 0xFFFEE000
_UNDEFINED = 0xFFFFFFFF
_TYPE = re.compile(rb"[A-Z0-9_ ]*")
_COUNT = re.compile(rb"[0-9]{1,9} ?")
_FRAMES = re.compile(rb"[0-9]{1,9}(?:\\[0-9]{1,9})* ?")
_UID = re.compile(rb"[0-9.]*[\x00 ]?")
_HEAD = struct.Struct("<HHI")  # implicit VR element, or an item: group, element, 4-byte length
_EXPLICIT = struct.Struct("<HH2sH")  # group, element, VR, 2-byte length


@dataclass(frozen=True)
class RawContour:
    """One Contour Sequence item as the rasteriser reads it: ``kind`` (Contour Geometric Type,
    stripped, upper case; "" where absent), ``declared`` (Number of Contour Points; None where
    absent), ``data`` (Contour Data's raw text; None where absent), and the Referenced SOP
    Instance UIDs and Referenced Frame Numbers of its Contour Image Sequence, in order."""

    kind: str
    declared: int | None
    data: bytes | None
    image_uids: tuple[str, ...]
    image_frames: tuple[int, ...]


def _elements(data: bytes, start: int, stop: int, implicit: bool) -> dict[int, bytes] | None:
    """The elements of the item ``data[start:stop]`` read here, by tag; None if anything is unusual."""
    out: dict[int, bytes] = {}
    pos, last = start, -1
    while pos < stop:
        if pos + 8 > stop:
            return None
        if implicit:
            group, element, length = _HEAD.unpack_from(data, pos)
            vr, pos = b"", pos + 8
        else:
            group, element, vr, length = _EXPLICIT.unpack_from(data, pos)
            if vr in _LONG:
                if pos + 12 > stop:
                    return None
                length = int.from_bytes(data[pos + 8:pos + 12], "little")
                pos += 12
            elif vr in _SHORT:
                pos += 8
            else:
                return None
        tag = group << 16 | element
        if tag <= last or group == 0xFFFE or length == _UNDEFINED or pos + length > stop:
            return None
        wanted = _VRS.get(tag)
        if wanted is not None:
            if not implicit and vr != wanted:
                return None
            out[tag] = data[pos:pos + length]
        last, pos = tag, pos + length
    return out


def _items(data: bytes, implicit: bool) -> list[dict[int, bytes]] | None:
    """Each item of the sequence value ``data`` (its elements read here); None if anything is unusual."""
    items = []
    pos, end = 0, len(data)
    while pos < end:
        if pos + 8 > end:
            return None
        group, element, length = _HEAD.unpack_from(data, pos)
        if group << 16 | element != _ITEM or length == _UNDEFINED or pos + 8 + length > end:
            return None
        found = _elements(data, pos + 8, pos + 8 + length, implicit)
        if found is None:
            return None
        items.append(found)
        pos += 8 + length
    return items


def _contour(found: dict[int, bytes], implicit: bool) -> RawContour | None:
    kind = found.get(CONTOUR_GEOMETRIC_TYPE, b"")
    count = found.get(NUMBER_OF_CONTOUR_POINTS)
    if not _TYPE.fullmatch(kind) or (count is not None and not _COUNT.fullmatch(count)):
        return None
    images = found.get(CONTOUR_IMAGE_SEQUENCE)
    pictures = _items(images, implicit) if images is not None else []
    if pictures is None:
        return None
    uids: list[str] = []
    frames: list[int] = []
    for picture in pictures:
        uid = picture.get(REFERENCED_SOP_INSTANCE_UID, b"")
        number = picture.get(REFERENCED_FRAME_NUMBER)
        if not _UID.fullmatch(uid) or (number is not None and not _FRAMES.fullmatch(number)):
            return None
        text = uid.decode("ascii").rstrip("\x00 ")
        if text:
            uids.append(text)
        if number is not None:
            frames.extend(int(v) for v in number.decode("ascii").rstrip(" ").split("\\"))
    return RawContour(kind=kind.decode("ascii").strip().upper(), declared=int(count) if count is not None else None,
                      data=found.get(CONTOUR_DATA), image_uids=tuple(uids), image_frames=tuple(frames))


def contour_items(roi_contour: Dataset) -> list[RawContour] | None:
    """The items of ``roi_contour``'s Contour Sequence read from its raw bytes, in order; None
    where pydicom must parse them (the sequence is absent, already parsed, or unusual: see the
    module docstring)."""
    element = roi_contour.get_item(CONTOUR_SEQUENCE)
    if not isinstance(element, RawDataElement) or not isinstance(element.value, bytes):
        return None
    implicit = bool(element.is_implicit_VR)
    if (not element.is_little_endian or element.length != len(element.value)
            or (not implicit and element.VR != "SQ")):
        return None
    items = _items(element.value, implicit)
    if items is None:
        return None
    out = []
    for found in items:
        contour = _contour(found, implicit)
        if contour is None:
            return None
        out.append(contour)
    return out
