"""Walk a DICOM file's meta group (PS3.10 7.1) in its raw bytes, before pydicom parses anything.

The meta group is always Explicit VR Little Endian and starts at byte 132, after the 128-byte
preamble and ``DICM``. Reading it by hand lets a reader learn the transfer syntax, or the SOP
class of a file too damaged for pydicom, from the first bytes alone.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

#: The VRs whose explicit-VR element header holds two reserved bytes and a 4-byte length (PS3.5 7.1.2)
LONG_VRS = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
#: The byte the meta group starts at: after the preamble and "DICM"
META_START = 132


def meta_elements(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(element number, offset of its value, value length) of each group-0002 element of
    ``data`` (a file's first bytes), in order. Stops at the first element of another group (the
    data set), or where an element's header is cut short; a value may run past ``data``: the
    caller compares ``offset + length`` with ``len(data)``."""
    pos = META_START
    while pos + 8 <= len(data):
        group, element = struct.unpack_from("<HH", data, pos)
        if group != 0x0002:
            return
        if data[pos + 4:pos + 6] in LONG_VRS:
            if pos + 12 > len(data):
                return
            length, at = int(struct.unpack_from("<I", data, pos + 8)[0]), pos + 12
        else:
            length, at = int(struct.unpack_from("<H", data, pos + 6)[0]), pos + 8
        yield element, at, length
        pos = at + length
