"""Size limits checked before anything is allocated, shared by the DICOM and image readers.

A hostile or broken file can make a decoder allocate what its header claims: a 200-byte PNG
whose IHDR says 30000×30000, a DICOM with Rows = Columns = 65535 and 10000 frames, a deflated
data set that inflates a thousandfold, or an element that claims a 4 GiB length (CPython's
``read(n)`` allocates ``n`` bytes before it reads). The readers compare header values with
:class:`~packer.config.LimitsConfig` first and turn a breach into a ``too_large`` issue whose
message names the header fields, their values, the limit and the job key to raise.

What counts towards ``limits.max_decoded_bytes`` (an estimate of the peak, not an exact sum):

- DICOM: the stored array of all frames as pydicom decodes it (Rows × Columns × Frames ×
  Samples × bytes per sample, 1-bit data unpacked to 1 byte; PALETTE COLOR adds the expanded
  3 × 16-bit RGB), plus two float64 working copies of one frame (the modality values and one
  window output; frames are transformed one at a time).
- Images: the decoded array (H × W × C × bytes per sample), plus two float32 working copies of
  max(C, 3) channels (the float image and the scaled copy :mod:`packer.transform.image` makes).
  A multi-page TIFF: the decoded arrays of every IFD of its main chain (OpenCV decodes them
  together), plus the working copies of the largest, plus the largest tile/strip buffer; each
  IFD's pixels are checked against ``limits.max_pixels`` and the IFD count against
  ``limits.max_frames``.
- Each compared on its own: the file size (``read_*`` read files whole; the probes check it
  too, so both passes agree) and, for Deflated Explicit VR Little Endian, twice the inflated data
  set (pydicom holds it and its elements' values at once).

Other sizes a header can make the code allocate: a DICOM frame resampled from its Pixel Spacing
to ``transform.dicom.spacing`` must stay within ``limits.max_pixels`` (``too_large``); a JPEG /
JPEG 2000 codestream inside a DICOM file must not claim more than Rows × Columns (``bad_shape``);
a TIFF tile or strip buffer counts towards the decoded bytes. Output arrays are not counted: they
are no larger than the working copies unless ``transform.*.size`` asks for a bigger image.
"""

from __future__ import annotations

import io
import os
import re
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from packer.config import LimitsConfig

DEFAULT_LIMITS = LimitsConfig()

_FIX = "; nothing was decoded. If the file is genuine, raise limits.{key} in the job file"
# JPEG start-of-frame markers (ITU T.81 B.1.1.3) and JPEG-LS SOF55 (T.87): they carry the size.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xF7})


class BoundedFile(io.BufferedReader):
    """A binary file whose ``read(n)`` never asks for more than the bytes left in it.

    CPython's ``read(n)`` allocates ``n`` bytes up front, so pydicom reading an element whose
    length field says 0xFFFFFFF0 would reserve 4 GiB for a value the file does not hold.
    """

    def __init__(self, path: str) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.size = os.fstat(self.fileno()).st_size

    def read(self, size: int | None = -1, /) -> bytes:
        if size is not None and size > 0:
            size = min(size, max(0, self.size - self.tell()))
        return super().read(size)


def file_size_problem(size: int, limits: LimitsConfig) -> str | None:
    """Why a file of ``size`` bytes is too large to read whole, or None."""
    if size > limits.max_decoded_bytes:
        return (f"the file is {size} bytes, over limits.max_decoded_bytes {limits.max_decoded_bytes} "
                "(it is read whole before decoding)" + _FIX.format(key="max_decoded_bytes"))
    return None


def limit_problem(limits: LimitsConfig, *, size_text: str, pixels: int, decoded: int, decoded_text: str,
                  frames: int = 1, frames_text: str = "") -> str | None:
    """Compare header-derived sizes with ``limits``; the message for the first breach, or None.

    ``size_text`` names the size fields and values (``IHDR width 100000 × height 100000``),
    ``decoded_text`` says what ``decoded`` (bytes) is made of, ``frames_text`` names the
    frame count field.
    """
    if frames > limits.max_frames:
        return (f"{frames_text} is {frames}, over limits.max_frames {limits.max_frames}"
                + _FIX.format(key="max_frames"))
    if pixels > limits.max_pixels:
        return (f"{size_text} = {pixels} pixels per frame, over limits.max_pixels {limits.max_pixels}"
                + _FIX.format(key="max_pixels"))
    if decoded > limits.max_decoded_bytes:
        return (f"decoding needs about {decoded} bytes ({decoded_text}), over limits.max_decoded_bytes "
                f"{limits.max_decoded_bytes}" + _FIX.format(key="max_decoded_bytes"))
    return None


def inflated_size_exceeds(handle: BinaryIO, cap: int) -> int | None:
    """Stream-inflate a raw deflate stream (RFC 1951, as in PS3.5 A.5) from ``handle``'s position,
    keeping nothing; the byte count once it passes ``cap``, else None (also for a corrupt
    stream: the parser reports that)."""
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    total = 0
    try:
        while not inflater.eof and (chunk := handle.read(1 << 20)):
            while chunk and not inflater.eof:  # past the end: a pad byte stays in unconsumed_tail
                total += len(inflater.decompress(chunk, 1 << 22))
                if total > cap:
                    return total
                chunk = inflater.unconsumed_tail
    except zlib.error:
        return None
    return None


@dataclass(frozen=True)
class Codestream:
    """What a frame's JPEG / JPEG-LS (SOFn) or JPEG 2000 (SIZ) header declares: its size, and the
    bit depth of its (first) component."""

    rows: int
    columns: int
    precision: int


#: A JPEG 2000 codestream's first bytes: SOC, then SIZ's marker (ITU T.800 A.5.1)
_J2K_START = b"\xff\x4f\xff\x51"


def codestream_header(frame: bytes) -> Codestream | None:
    """The header of a JPEG / JPEG-LS (SOFn) or JPEG 2000 (SIZ) codestream.

    None when the frame is neither, when the header is cut short, or when the JPEG height is 0
    (defined later by a DNL marker). The marker segments before SOF are walked, however many
    (comments, application segments: a size check that gave up after 64 let a frame of any size
    be decoded), never the scan after them.
    """
    if frame[:4] == _J2K_START and len(frame) >= 43:
        xsiz, ysiz, xosiz, yosiz = struct.unpack_from(">IIII", frame, 8)
        ssiz = frame[42]  # component 0: bit 7 the sign, the rest the precision minus 1
        return Codestream(max(0, ysiz - yosiz), max(0, xsiz - xosiz), (ssiz & 0x7F) + 1)
    pos = _jpeg_sof(frame)
    if pos is None or pos + 9 > len(frame):
        return None
    precision = frame[pos + 4]
    height, width = struct.unpack_from(">HH", frame, pos + 5)
    return Codestream(height, width, precision) if height else None


def codestream_components(frame: bytes) -> int | None:
    """The component count a JPEG / JPEG-LS frame's SOFn header (Nf, ITU T.81 B.2.2; T.87 keeps
    it) or a JPEG 2000 codestream's SIZ (Csiz, T.800 A.5.1) declares; None where the frame is
    neither or the header is cut short. Only the headers are read, never the scan."""
    if frame[:4] == _J2K_START:
        return struct.unpack_from(">H", frame, 40)[0] if len(frame) >= 42 else None
    pos = _jpeg_sof(frame)
    return frame[pos + 9] if pos is not None and pos + 10 <= len(frame) else None


def _jpeg_sof(frame: bytes) -> int | None:
    """Where a JPEG / JPEG-LS frame's SOFn marker is: the marker segments before it are walked,
    however many; None where the frame is no JPEG or a SOS or EOI (or the frame's end) comes first."""
    if frame[:2] != b"\xff\xd8":
        return None
    pos = 2
    while pos < len(frame):  # marker segments up to SOF (SOS or EOI end the walk: never the scan itself)
        while pos < len(frame) and frame[pos] == 0xFF and pos + 1 < len(frame) and frame[pos + 1] == 0xFF:
            pos += 1  # fill bytes
        if pos + 4 > len(frame) or frame[pos] != 0xFF:
            return None
        marker = frame[pos + 1]
        if marker == 0xDA or marker == 0xD9:  # start of scan / end of image: no SOF before it
            return None
        if marker in _JPEG_SOF:
            return pos
        pos += 2 + struct.unpack_from(">H", frame, pos + 2)[0]
    return None


#: JPEG 2000 markers (ITU T.800 A.2): start of tile-part and of data, coding style default and
#: component; the JP2 file format's signature box and its contiguous-codestream box type.
_J2K_SOT, _J2K_SOD, _J2K_COD, _J2K_COC = 0xFF90, 0xFF93, 0xFF52, 0xFF53
_JP2_SIGNATURE, _JP2_CODESTREAM = b"\x00\x00\x00\x0c\x6a\x50\x20\x20", b"jp2c"
#: A JPEG-LS marker in or after a scan: 0xFF then a byte with its high bit set (T.87 A.1: the
#: coder stuffs a 0 bit after every 0xFF in scan data), RSTm (0xD0-0xD7) aside.
_JPEG_LS_MARKER = re.compile(rb"\xff[\x80-\xcf\xd8-\xff]")


def codestream_lossy(frame: bytes) -> bool | None:
    """Whether a frame's JPEG 2000 / HTJ2K or JPEG-LS codestream is coded lossily, read from its
    own markers, not its transfer syntax (1.2.840.10008.1.2.4.81, .91 and .203 allow lossless
    coding too): JPEG 2000's wavelet (T.800 A.6.1, the transformation byte of SPcod / SPcoc: 0 the
    irreversible 9-7 filter, 1 the reversible 5-3) in every COD and COC segment, of the main header
    and of each tile-part header; JPEG-LS's NEAR (T.87 C.2.3, the byte after an SOS segment's
    component selectors: 0 lossless) of every scan. True where any says lossy, False where all say
    lossless, None where the frame is neither, or its COD / SOS cannot be read (cut short)."""
    if frame.startswith(_JP2_SIGNATURE):
        frame = _jp2_codestream(frame)
    if frame[:4] == _J2K_START:
        return _j2k_lossy(frame)
    sof = _jpeg_sof(frame)
    if sof is not None and frame[sof + 1] == 0xF7:  # SOF55: JPEG-LS
        return _jpeg_ls_lossy(frame)
    return None


def _jp2_codestream(data: bytes) -> bytes:
    """The codestream a JP2 file's contiguous-codestream box holds (T.800 I.5.4), walked box by
    box; empty where there is none."""
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if length == 1 and pos + 16 <= len(data):  # XLBox: the length in the next 8 bytes
            length, header = struct.unpack_from(">Q", data, pos + 8)[0], 16
        if kind == _JP2_CODESTREAM:
            return data[pos + header:] if length == 0 else data[pos + header:pos + length]
        if length < header:  # 0 (to the end) on any other box, or no valid length: nothing more to walk
            return b""
        pos += length
    return b""


def _j2k_lossy(stream: bytes) -> bool | None:
    """:func:`codestream_lossy` for a JPEG 2000 codestream (SOC, SIZ first): the COD and COC
    segments of its main header and of each tile-part header, tile-parts stepped over by their
    SOT's Psot (never their data). A transformation other than 1 (a Part 2 kernel, 2 and up) is
    taken for lossy: only the 5-3 filter is known to be reversible."""
    components = struct.unpack_from(">H", stream, 40)[0] if len(stream) >= 42 else 0
    coc_transform = 4 + (1 if components < 257 else 2) + 1 + 4  # Lcoc, Ccoc, Scoc, SPcoc's first 4 bytes
    transforms: list[int] = []

    def segment(marker: int, at: int) -> None:
        if marker == _J2K_COD and at + 13 < len(stream):  # Lcod, Scod, SGcod 4, SPcod: 4 bytes then it
            transforms.append(stream[at + 13])
        elif marker == _J2K_COC and at + coc_transform < len(stream):
            transforms.append(stream[at + coc_transform])

    pos = 2
    while pos + 4 <= len(stream):
        marker, length = struct.unpack_from(">HH", stream, pos)
        if marker >> 8 != 0xFF or length < 2:  # EOC (no length), or no marker segment: the walk ends
            break
        if marker != _J2K_SOT:
            segment(marker, pos)
            pos += 2 + length
            continue
        psot = struct.unpack_from(">I", stream, pos + 6)[0] if pos + 10 <= len(stream) else 0
        end = min(pos + psot, len(stream)) if psot else len(stream)  # Psot 0: the last tile-part, to EOC
        at = pos + 2 + length
        while at + 4 <= end:  # the tile-part's header, up to SOD
            tile_marker, tile_length = struct.unpack_from(">HH", stream, at)
            if tile_marker == _J2K_SOD or tile_marker >> 8 != 0xFF or tile_length < 2:
                break
            segment(tile_marker, at)
            at += 2 + tile_length
        if not psot or psot < 14:
            break
        pos = end
    return any(transform != 1 for transform in transforms) if transforms else None


def _jpeg_ls_lossy(frame: bytes) -> bool | None:
    """:func:`codestream_lossy` for a JPEG-LS codestream: the NEAR byte of every SOS segment,
    marker segments walked by their lengths and each scan's data stepped over to the marker
    that ends it (:data:`_JPEG_LS_MARKER`)."""
    nears: list[int] = []
    pos = 2
    while pos + 4 <= len(frame):
        if frame[pos] != 0xFF:
            break
        marker = frame[pos + 1]
        if marker == 0xFF:  # a fill byte
            pos += 1
            continue
        if marker == 0xD9:  # EOI
            break
        (length,) = struct.unpack_from(">H", frame, pos + 2)
        if length < 2:
            break
        if marker != 0xDA:
            pos += 2 + length
            continue
        near = pos + 5 + 2 * frame[pos + 4]  # Ls, Ns, then Ns × (component selector, mapping table)
        if near >= len(frame):
            break
        nears.append(frame[near])
        found = _JPEG_LS_MARKER.search(frame, pos + 2 + length)
        if found is None:
            break
        pos = found.start()
    return any(nears) if nears else None
