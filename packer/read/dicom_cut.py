"""Where a DICOM file that was cut short ends inside its header: one walk over the data set's raw bytes.

A copy that stopped early (an export's ``.dcm.part``, a CD read error) ends inside an element's
value, inside an element's 8- or 12-byte header, inside a sequence item's 8-byte header, or inside
an undefined-length sequence or item before its delimiter. pydicom keeps a partial value without
a word, drops a partial element header, and raises on a partial sequence or item header
("unpack requires a buffer of 4 bytes", "No tag to read"), so none of its outcomes says which.
:func:`cut_in_header` walks the element headers (values skipped, never read) in the encoding the
file meta names: explicit or implicit VR, little or big endian, defined and undefined lengths with
their delimiters, and a deflated data set's inflated bytes. It stops at the top-level pixel data
element: a file cut inside its pixels is the pixel checks' to judge; and at (FFFC,FFFC) Data Set
Trailing Padding or a tail of zero bytes after a whole top-level element: padding, no cut.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from pydicom.datadict import dictionary_VR, keyword_for_tag

from packer.read.dicom_meta import LONG_VRS, META_START, meta_elements

#: Implicit VR Little Endian, Explicit VR Big Endian and Deflated Explicit VR Little Endian (PS3.5 A.1-A.5)
IMPLICIT, BIG_ENDIAN, DEFLATED = "1.2.840.10008.1.2", "1.2.840.10008.1.2.2", "1.2.840.10008.1.2.1.99"
_UNDEFINED = 0xFFFFFFFF
_ITEM, _ITEM_END, _SEQUENCE_END = 0xFFFEE000, 0xFFFEE00D, 0xFFFEE0DD
#: The top-level pixel data elements: (7FE0,0008) Float, (7FE0,0009) Double Float, (7FE0,0010) Pixel Data
_PIXEL_TAGS = frozenset({0x7FE00008, 0x7FE00009, 0x7FE00010})
#: (FFFC,FFFC) Data Set Trailing Padding (PS3.10 7.2): the data set's last element, its bytes meaningless
_TRAILING_PADDING = 0xFFFCFFFC
#: The two-letter value representations (PS3.5 6.2)
_VRS = frozenset({b"AE", b"AS", b"AT", b"CS", b"DA", b"DS", b"DT", b"FL", b"FD", b"IS", b"LO", b"LT", b"OB", b"OD",
                  b"OF", b"OL", b"OV", b"OW", b"PN", b"SH", b"SL", b"SQ", b"SS", b"ST", b"SV", b"TM", b"UC", b"UI",
                  b"UL", b"UN", b"UR", b"US", b"UT", b"UV"})
#: A deflated data set is walked inflated up to this size (the reader measured it against its limits already)
_INFLATED_MAX = 1 << 28
#: Deeper than this no real header nests: the walk gives up (a damaged or crafted file)
_MAX_DEPTH = 64
#: More failed readings of undefined-length UN values than this (each tried up to three ways, nested
#: ones within each; a reading that reaches the delimiter is not counted) and the walk gives up: no
#: real header holds that many that read neither way
_MAX_UN_READINGS = 256
#: Zero padding after the last element is checked for all zeros this many bytes at a time
_ZERO_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Encoding:
    explicit: bool
    order: str  # "<" or ">"


@dataclass(frozen=True)
class HeaderCut:
    """Where a file ends inside its header: ``what`` is cut (the element, the item and sequence it is
    in, the byte counts); ``sop_class``: the file meta's (0002,0002) Media Storage SOP Class UID, ""
    where it names none."""

    what: str
    sop_class: str


class _NotACut(Exception):
    """The bytes do not read as a header cut short (damaged otherwise): nothing to say."""


def _name(tag: int) -> str:
    keyword = keyword_for_tag(tag) if tag >> 16 & 1 == 0 else ""
    return f"({tag >> 16:04X},{tag & 0xFFFF:04X}) {keyword or 'a private or unknown element'}"


class _Walk:
    def __init__(self, data: bytes | mmap.mmap, encoding: _Encoding, size: int, where: str) -> None:
        self.data, self.encoding, self.size, self.where = data, encoding, size, where
        self.un_readings = 0

    def _total(self) -> str:
        return f"the file is {self.size:,} bytes{self.where}"

    def elements(self, pos: int, end: int | None, inside: str, top: bool, depth: int) -> tuple[int, str | None]:
        """Walk a data set's elements from ``pos`` to ``end`` (None: to its Item Delimitation Item,
        or at the top level to the file's end). (where the walk stopped, what is cut or None)."""
        if depth > _MAX_DEPTH:
            raise _NotACut
        data, order, previous = self.data, self.encoding.order, ""
        limit = len(data) if end is None else min(end, len(data))
        while pos < limit:
            if top and limit - pos >= 2 and not any(data[pos:pos + 2]):  # group 0000, never stored in a data set
                if _zeros(data, pos, limit):  # zeros to the end: padding to a word or 4-byte boundary, no cut
                    return limit, None
                raise _NotACut  # group 0000, then more: damaged otherwise
            if limit - pos < 4:
                return pos, self._cut_header(limit - pos, previous, inside, top)
            group, number = struct.unpack_from(order + "HH", data, pos)
            tag = group << 16 | number
            if not top and end is None and tag == _ITEM_END:
                if limit - pos < 8:
                    return pos, (f"the file ends {limit - pos} byte(s) into the (FFFE,E00D) Item Delimitation Item "
                                 f"of {inside.removeprefix(' in ')} (8 bytes; {self._total()})")
                return pos + 8, None
            if top and (tag in _PIXEL_TAGS or tag == _TRAILING_PADDING):  # the trailing padding is meaningless
                return len(data), None
            if group == 0xFFFE or (top and group == 0x0002):
                raise _NotACut  # a delimiter or a file meta element where a data set element belongs
            explicit = self.encoding.explicit
            head = 8
            if explicit:
                if limit - pos < 6:
                    return pos, self._cut_header(limit - pos, previous, inside, top, tag)
                vr = bytes(data[pos + 4:pos + 6])
                if vr not in _VRS:
                    raise _NotACut
                head = 12 if vr in LONG_VRS else 8
            if limit - pos < head:
                return pos, self._cut_header(limit - pos, previous, inside, top, tag)
            if explicit and head == 8:
                length = int(struct.unpack_from(order + "H", data, pos + 6)[0])
            else:
                length = int(struct.unpack_from(order + "I", data, pos + head - 4)[0])
            name = _name(tag)
            here = f"{name}{inside}"
            at = pos + head
            vr_text = vr.decode() if explicit else _implicit_vr(tag)
            if length == _UNDEFINED:
                if vr_text == "UN" and explicit:
                    pos, cut = self.un_sequence(at, here, depth)
                elif vr_text == "SQ" or not explicit:
                    pos, cut = self.sequence(at, None, here, depth)
                else:  # encapsulated pixel data nested in an item (an icon's): fragments, no data sets
                    pos, cut = self.items(at, here)
                if cut is not None:
                    return pos, cut
            elif vr_text == "SQ":
                pos, cut = self.sequence(at, at + length, here, depth)
                if cut is not None:
                    return pos, cut
                if at + length > len(data):
                    return pos, self._cut_value(here, at, length)
                pos = at + length
            else:
                if at + length > len(data):
                    return pos, self._cut_value(here, at, length)
                pos = at + length
            previous = here
        if end is None and not top:
            return pos, (f"the file ends inside {inside.removeprefix(' in ')}, whose length is undefined, before its "
                         f"(FFFE,E00D) Item Delimitation Item ({self._total()})")
        return pos, None

    def un_sequence(self, pos: int, name: str, depth: int) -> tuple[int, str | None]:
        """Walk the items of ``name``, an undefined-length UN value in an explicit VR data set, up to
        its Sequence Delimitation Item. PS3.5 6.2.2 makes them implicit VR little endian, but a
        converter or anonymiser that rewrote an SQ's VR to UN leaves them explicit, and pydicom reads
        each item as its first element's header shows (a VR there: explicit). That reading is walked
        first, then every item implicit, then every item explicit: the first that reaches the delimiter
        wins, so a whole file is never called cut for being read the wrong way. Where none does, the
        first reading's cut is the verdict (the bytes pydicom would read, ending early); none there
        either: no verdict."""
        kept = self.encoding
        implicit = _Encoding(False, "<")
        readings = ((lambda at: _Encoding(True, kept.order) if self._vr_at(at) else implicit),
                    (lambda at: implicit), (lambda at: kept))
        first: tuple[int, str | None] | None = None
        for number, reading in enumerate(readings):
            try:
                found: tuple[int, str | None] | None = self.sequence(pos, None, name, depth, reading)
            except (_NotACut, struct.error):
                found = None
            finally:
                self.encoding = kept
            if found is not None and found[1] is None:
                return found
            if number == 0:
                first = found
            self.un_readings += 1  # a reading that did not reach the delimiter: only these are bounded
            if self.un_readings > _MAX_UN_READINGS:
                raise _NotACut
        if first is None:
            raise _NotACut
        return first

    def _vr_at(self, at: int) -> bool:
        """Whether the element header at ``at`` holds a VR (explicit), as pydicom tells it."""
        return bytes(self.data[at + 4:at + 6]) in _VRS

    def sequence(self, pos: int, end: int | None, name: str, depth: int,
                 reading: Callable[[int], _Encoding] | None = None) -> tuple[int, str | None]:
        """Walk the items of sequence ``name`` from ``pos`` to ``end`` (None: to its Sequence
        Delimitation Item). ``reading``: an undefined-length UN's, the encoding of the item whose
        first element is at the offset given (:meth:`un_sequence`), its item tags read in that
        encoding's byte order too (PS3.5 6.2.2: a UN's items are implicit VR little endian, in a
        big-endian file as well)."""
        data, order, count = self.data, self.encoding.order, 0
        limit = len(data) if end is None else min(end, len(data))
        while pos < limit:
            count += 1
            if reading is not None:
                self.encoding = reading(pos + 8)
                order = self.encoding.order
            if limit - pos < 8:
                return pos, (f"the file ends {limit - pos} byte(s) into the header of item {count} of {name} (an "
                             f"item's tag and length take 8 bytes; {self._total()})")
            group, number = struct.unpack_from(order + "HH", data, pos)
            length = int(struct.unpack_from(order + "I", data, pos + 4)[0])
            tag = group << 16 | number
            if tag == _SEQUENCE_END and end is None:
                return pos + 8, None
            if tag != _ITEM:
                raise _NotACut
            inside = f" in item {count} of {name}"
            if length == _UNDEFINED:
                pos, cut = self.elements(pos + 8, None, inside, False, depth + 1)
            else:
                at = pos + 8
                pos, cut = self.elements(at, at + length, inside, False, depth + 1)
                if cut is None and at + length > len(data):
                    return pos, self._cut_value(f"item {count} of {name}", at, length)
                pos = at + length
            if cut is not None:
                return pos, cut
        if end is None:
            return pos, (f"the file ends inside {name}, whose length is undefined, after {count} item(s) and before "
                         f"its (FFFE,E0DD) Sequence Delimitation Item ({self._total()})")
        return pos, None

    def items(self, pos: int, name: str) -> tuple[int, str | None]:
        """Skip the fragments of undefined-length encapsulated data ``name`` up to its delimiter."""
        data, order = self.data, self.encoding.order
        while len(data) - pos >= 8:
            tag = struct.unpack_from(order + "HH", data, pos)
            length = int(struct.unpack_from(order + "I", data, pos + 4)[0])
            if tag == (0xFFFE, 0xE0DD):
                return pos + 8, None
            if tag != (0xFFFE, 0xE000) or length == _UNDEFINED:
                raise _NotACut
            if pos + 8 + length > len(data):
                return pos, self._cut_value(f"a fragment of {name}", pos + 8, length)
            pos += 8 + length
        return pos, (f"the file ends inside {name}, whose length is undefined, before its (FFFE,E0DD) Sequence "
                     f"Delimitation Item ({self._total()})")

    def _cut_header(self, held: int, previous: str, inside: str, top: bool, tag: int | None = None) -> str:
        named = f" ({_name(tag)}{inside}, by its tag)" if tag is not None else ""  # its tag is there: name it
        after = (f"the element after {previous}{named}" if previous else
                 f"the data set's first element{named}, right after the file meta information" if top else
                 f"its item's first element{named}" if named else f"the first element{inside}")
        return (f"the file ends {held} byte(s) into the header of {after} (a data element's tag, VR and length take "
                f"8 or 12 bytes; {self._total()})")

    def _cut_value(self, name: str, at: int, length: int) -> str:
        kept = max(len(self.data) - at, 0)
        return (f"the file ends inside {name}, whose value declares {length:,} bytes from byte {at:,} but holds "
                f"{kept:,} of them ({self._total()})")


def _zeros(data: bytes | mmap.mmap, pos: int, end: int) -> bool:
    """Whether ``data[pos:end]`` is all zero bytes."""
    for at in range(pos, end, _ZERO_CHUNK):
        if bytes(data[at:min(at + _ZERO_CHUNK, end)]).strip(b"\0"):
            return False
    return True


def _implicit_vr(tag: int) -> str:
    """The dictionary VR of ``tag`` (an implicit-VR data set carries none): SQ is what matters."""
    try:
        return str(dictionary_VR(tag))
    except KeyError:
        return "UN"


def _data_set_start(data: bytes | mmap.mmap) -> tuple[str, str, int] | None:
    """(Transfer Syntax UID, Media Storage SOP Class UID, offset of the data set), or None where
    the file ends inside its file meta."""
    head = bytes(data[:1 << 16])
    said, start = {0x0002: "", 0x0010: ""}, META_START
    for number, value_at, length in meta_elements(head):
        if number in said:
            said[number] = head[value_at:value_at + length].rstrip(b"\0 ").decode("ascii", "replace")
        start = value_at + length
    if start > len(data) or (len(data) - start >= 2 and data[start:start + 2] == b"\x02\x00"):
        return None  # cut inside the file meta (or inside its next element's header): not the data set's
    return said[0x0010], said[0x0002], start


def cut_in_header(path: str) -> HeaderCut | None:
    """Where the DICOM file at ``path`` ends inside its header (its data set before the top-level
    pixel data element): inside an element's value, an element's or an item's header, or an
    undefined-length sequence or item before its delimiter, naming the element (with the item and
    sequence it is in) and the byte counts. None where the header ends cleanly after a whole
    top-level element or reaches the pixel data, where the file ends inside its file meta, and where
    the bytes do not read as a header at all (damaged otherwise: the caller's verdict stands).
    Raises OSError."""
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if size <= META_START:
            return None
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = _data_set_start(data)
            if found is None:
                return None
            syntax, sop_class, start = found
            try:
                if syntax == DEFLATED:
                    inflated = zlib.decompressobj(-zlib.MAX_WBITS).decompress(data[start:], _INFLATED_MAX)
                    if len(inflated) >= _INFLATED_MAX:
                        return None
                    what = _walk(inflated, 0, _Encoding(True, "<"), size, f", deflated: the byte offsets are its "
                                 f"inflated data set's, {len(inflated):,} bytes")
                else:
                    explicit = syntax != IMPLICIT
                    if len(data) - start >= 6:  # pydicom reads the data set as its first element's header shows it:
                        explicit = all(0x41 <= b <= 0x5A for b in data[start + 4:start + 6])  # two capitals, a VR
                    what = _walk(data, start, _Encoding(explicit, ">" if syntax == BIG_ENDIAN else "<"), size, "")
            except zlib.error:
                return None
            return None if what is None else HeaderCut(what=what, sop_class=sop_class)


def _walk(data: bytes | mmap.mmap, start: int, encoding: _Encoding, size: int, where: str) -> str | None:
    try:
        return _Walk(data, encoding, size, where).elements(start, None, "", True, 0)[1]
    except (_NotACut, struct.error, RecursionError):
        return None
