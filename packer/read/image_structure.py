"""Image file structure, parsed without decoding a pixel: the format from the file's signature,
the headers of PNG (IHDR), JPEG (SOFn, EXIF APP1), TIFF (classic and BigTIFF IFDs, the main IFD
chain of a multi-page file) and BMP, EXIF orientation, and the checks that a whole file is
complete (a cut JPEG or PNG, strips or tiles past the end of a TIFF).

:mod:`packer.read.image` probes and decodes with what this module finds. Every function reads
through ``read(offset, count)`` or a bytes object, so the raw store can rehearse a probe on a
remote file. Defects raise :class:`Defect`, which carries the Issue reason code.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from packer.config import LimitsConfig
from packer.read.limits import limit_problem
from packer.transform.image import opencv_misreads_planar_tiff
from packer.transform.tiff_strips import is_reduced, strip_problem

FORMATS = ("png", "jpeg", "tiff", "bmp")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # colour type → samples; palette (3) decodes to RGB
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# BYTE SHORT LONG SBYTE UNDEFINED SSHORT SLONG LONG8 (UNDEFINED: JPEGTables' bytes)
_TIFF_TYPES = {1: "B", 3: "H", 4: "I", 6: "b", 7: "B", 8: "h", 9: "i", 16: "Q"}
_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES, TIFF_ORIENTATION = 256, 257, 258, 277, 274
_TIFF_DATA = ((273, 279), (324, 325))  # (StripOffsets, StripByteCounts), (TileOffsets, TileByteCounts)
TIFF_ROWS_PER_STRIP, TIFF_TILE_WIDTH, TIFF_TILE_LENGTH = 278, 322, 323
_TIFF_SUBFILE = 254  # NewSubfileType
_TIFF_EXTRA_SAMPLES = 338  # ExtraSamples: 0 unspecified, 1 associated (premultiplied) alpha, 2 unassociated alpha
_TIFF_COMPRESSION, _TIFF_PHOTOMETRIC, _TIFF_PLANAR, _TIFF_JPEG_TABLES = 259, 262, 284, 347
# what the IFD chain walk reads of every IFD (JPEGTables: for packer.read.tiff_codecs' strict JPEG check)
_TIFF_CHAIN_TAGS = {_TIFF_SUBFILE, _TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES, TIFF_ORIENTATION,
                    TIFF_ROWS_PER_STRIP, TIFF_TILE_WIDTH, TIFF_TILE_LENGTH, _TIFF_EXTRA_SAMPLES,
                    _TIFF_COMPRESSION, _TIFF_PHOTOMETRIC, _TIFF_PLANAR, _TIFF_JPEG_TABLES,
                    *(t for p in _TIFF_DATA for t in p)}
#: Tags whose values libtiff must read to decode a page, often kept out of line after the IFD
#: (BitsPerSample, ColorMap, ExtraSamples, SampleFormat): values cut off by the end of the file
#: make the file truncated, not decode_failed (another tag's values past the end are left alone:
#: libtiff decodes past a broken private tag)
_TIFF_DECODE_VALUES = {_TIFF_BITS, 320, 338, 339}
_JPEG_PROBE_START = 64 * 1024

Reader = Callable[[int, int], bytes]
_Tags = dict[int, tuple[int, ...]]  # TIFF tag → its integer values
_Values = dict[tuple[int, int, int], tuple[int, ...]]  # (offset, type, count) → out-of-line tag values


@dataclass(frozen=True)
class ImageHeader:
    """What the header says: stored ``height``×``width`` (before EXIF orientation),
    ``channels`` (samples per pixel as stored; palette images count 3, BMP palettes of greys 1),
    ``bit_depth`` (bits per sample as stored; 8 for BMP), ``format`` (one of FORMATS) and
    ``orientation`` (EXIF/TIFF Orientation 1-8 for JPEG and TIFF, else 1: a PNG's eXIf chunk
    may follow its pixel data, so :func:`read_image` reads it from the whole file)."""

    height: int
    width: int
    channels: int
    bit_depth: int
    format: str
    orientation: int = 1


class Defect(Exception):
    """A defect of the file found while parsing: carries the Issue reason code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _u16(data: bytes, pos: int, order: str = ">") -> int:
    return int(struct.unpack_from(order + "H", data, pos)[0])


def sniff_format(head: bytes) -> str | None:
    """The format named by the first bytes of a file (at least 8), or ``None``."""
    if head.startswith(_PNG_SIGNATURE):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head.startswith(b"BM"):
        return "bmp"
    return None


#: Each format's signature, as :func:`sniff_format` matches it (TIFF: its little- and big-endian
#: forms, classic and BigTIFF).
_SIGNATURES = {"png": (_PNG_SIGNATURE,), "jpeg": (b"\xff\xd8\xff",),
               "tiff": (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")}


def cut_signature(data: bytes) -> str | None:
    """The format whose signature a whole file of 2 bytes or more is a proper beginning of (a JPEG
    cut after its SOI marker FF D8), or ``None``: such a file is cut short, not of an unknown
    format. (BMP's signature is 2 bytes, so no BMP file ends inside it.)"""
    if len(data) < 2:
        return None
    for fmt, signatures in _SIGNATURES.items():
        if any(len(data) < len(sig) and sig.startswith(data) for sig in signatures):
            return fmt
    return None


#: The formats whose signature a file's own suffix names (BMP's 2-byte ``BM`` is too short to
#: tell a damaged one from another format's first bytes)
_SUFFIX_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".tif": "tiff", ".tiff": "tiff"}
#: At most this many bits of a signature may differ for the file to be a damaged one of its
#: suffix's format: no other format's magic is so close (MNG, JPEG 2000, JPEG XL and the TIFF-like
#: raw formats ORF and RW2 differ in 4 bits or more)
_NEAR_MISS_BITS = 2


def _bits_apart(head: bytes, signature: bytes) -> int:
    return sum(bin(a ^ b).count("1") for a, b in zip(head, signature, strict=False)) + 8 * max(
        0, len(signature) - len(head))


def damaged_signature(head: bytes, suffix: str) -> tuple[str, str] | None:
    """(format, what is damaged) where the first bytes ``head`` (up to 16) of a file named
    ``suffix`` match no signature (:func:`sniff_format`) but are a damaged one: a near miss (at most
    :data:`_NEAR_MISS_BITS` bits off) of the signature of the suffix's own format, any 8 bytes
    before an IHDR chunk header (length 13, at byte 8), which nothing but a PNG holds, or a PNG's
    start (``\\x89PNG``) with its IHDR a byte or two away from byte 8 (line endings translated; ``head``
    up to 24 bytes). ``None`` for
    another format's bytes (left ``unsupported``: convert it)."""
    if len(head) >= 16 and head[8:16] == b"\0\0\0\rIHDR":
        return "png", (f"{head[:8].hex(' ')} where a PNG signature ({_PNG_SIGNATURE.hex(' ')}) belongs, before "
                       "the PNG's IHDR chunk at byte 8")
    # the signature's CR LF / LF bytes gained or lost one, or CR became LF (in the IHDR's length 13 too)
    ihdr = next((at for at in (head.find(length + b"IHDR", 4, 24) for length in (b"\0\0\0\r", b"\0\0\0\n"))
                 if at != -1), -1)
    if head.startswith(b"\x89PNG") and ihdr != -1:
        return "png", (f"{head[:ihdr].hex(' ')} where a PNG signature ({_PNG_SIGNATURE.hex(' ')}) belongs, with the "
                       f"IHDR chunk at byte {ihdr} instead of 8: line endings were translated in a text-mode "
                       "transfer (FTP ASCII mode, a git autocrlf), which the signature is made to show (PNG "
                       "12.12)")
    fmt = _SUFFIX_FORMATS.get(suffix.lower())
    if fmt is None:
        return None
    signature = min(_SIGNATURES[fmt], key=lambda sig: _bits_apart(head, sig))
    bits = _bits_apart(head, signature)
    if bits > _NEAR_MISS_BITS:
        return None
    return fmt, (f"{head[:len(signature)].hex(' ')} where a {fmt.upper()} signature ({signature.hex(' ')}) belongs: "
                 f"{bits} bit{'s' if bits > 1 else ''} off")


# --- headers ---------------------------------------------------------------------------------

def _png_header(data: bytes) -> ImageHeader:
    if len(data) < 33:
        raise Defect("truncated", f"PNG ends at byte {len(data)}, before the end of its IHDR chunk (byte 33); "
                                   "the file was cut short, copy or export it again")
    if data[12:16] != b"IHDR":
        raise Defect("decode_failed", f"PNG's first chunk is {data[12:16]!r}; expected IHDR")
    width, height = struct.unpack_from(">II", data, 16)
    bit_depth, colour_type = data[24], data[25]
    if colour_type not in _PNG_CHANNELS:
        raise Defect("decode_failed", f"PNG colour type {colour_type} is not one of {sorted(_PNG_CHANNELS)}")
    return ImageHeader(height, width, _PNG_CHANNELS[colour_type], bit_depth, "png")


def png_grey_key(data: bytes) -> int | None:
    """The grey value a greyscale PNG's tRNS chunk makes transparent (PNG 11.3.2.1), scaled as
    libpng expands 1-, 2- and 4-bit samples to 8 bits; None for another colour type or without
    the chunk (it precedes the image data). OpenCV decodes such a PNG as grey alone, so
    :func:`packer.read.image.read_image` adds the alpha the key stands for."""
    if len(data) < 33 or data[25] != 0:
        return None
    bits, pos = data[24], 8
    while pos + 8 <= len(data):
        length, kind = int(struct.unpack_from(">I", data, pos)[0]), data[pos + 4:pos + 8]
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tRNS" and length >= 2 and pos + 10 <= len(data):
            key = int(struct.unpack_from(">H", data, pos + 8)[0])
            if key >= 1 << bits:  # out of the samples' range: matches no pixel
                return None
            return key * (255 // ((1 << bits) - 1)) if bits < 8 else key
        pos += 12 + length
    return None


def _jpeg_marker_ends(data: bytes) -> np.ndarray:
    """Positions of every marker code byte in ``data``: a byte other than 00 and FF right after
    an FF (a run of FF fill bytes belongs to the marker; FF 00 is a stuffed FF in entropy-coded
    data). Vectorised: the regex ``\\xff+([^\\x00\\xff])`` over a 50 kB photo took 5 ns a byte."""
    if len(data) < 2:
        return np.empty(0, dtype=np.intp)
    arr = np.frombuffer(data, dtype=np.uint8)
    code = arr[1:]
    hits = (arr[:-1] == 0xFF) & (code != 0x00) & (code != 0xFF)
    return np.flatnonzero(hits) + 1


def _walk_jpeg(data: bytes, *, complete: bool, until_sof: bool) -> ImageHeader | None:
    """Walk JPEG markers from SOI. Stops at the first SOFn when ``until_sof`` (returns the
    header), else at EOI (returns the header). Stray bytes between segments are skipped, as
    libjpeg does. Raises Defect("truncated") when the data ends first and ``complete``;
    returns ``None`` when it ends first and more data may follow."""
    pos, header, orientation, inside, exif_seen = 2, None, 1, "", False
    markers = _jpeg_marker_ends(data)
    while True:
        # the next marker is the first FF run starting at or after pos: its code byte is at >= pos + 1
        at = int(np.searchsorted(markers, pos + 1))
        if at == len(markers):
            break
        code_at = int(markers[at])
        marker, pos = data[code_at], code_at + 1
        if marker == 0xD9:
            return header
        if 0xD0 <= marker <= 0xD7 or marker in (0x01, 0xD8):  # standalone markers
            continue
        if pos + 2 > len(data) or pos + _u16(data, pos) > len(data):
            inside = _cut_segment(data, marker, pos)
            break
        length = _u16(data, pos)
        segment = data[pos + 2:pos + length]
        if marker in _JPEG_SOF and header is None:
            if len(segment) < 6:
                raise Defect("decode_failed", f"JPEG SOF marker at byte {pos - 2} is {length} bytes; expected >= 8")
            precision, height, width, components = segment[0], _u16(segment, 1), _u16(segment, 3), segment[5]
            header = ImageHeader(height, width, components, precision, "jpeg", orientation)
            if until_sof:
                return header
        elif marker == 0xE1 and segment.startswith(b"Exif\x00\x00") and header is None and not exif_seen:
            # the first EXIF segment wins, as in Pillow (exif_transpose) and libjpeg-based readers
            # (cv2.imread) and as for a PNG's first eXIf chunk: a later one (an editor's appended
            # copy) must not rotate the pixels differently from what every viewer shows
            exif_seen = True
            orientation = _exif_orientation(segment[6:])
        pos += length
    if not complete:
        return None
    where = "before its SOF header" if header is None else "without an EOI marker (FFD9)"
    if inside:  # the data ends inside a marker segment (and whatever FF D9 it ends with lies in there)
        where = inside + (", before its SOF header" if header is None else "")
    raise Defect("truncated", f"JPEG ends at byte {len(data)} {where}; the file was cut short, "
                               "copy or export it again")


def _jpeg_segment_name(marker: int) -> str:
    """The name of a JPEG marker segment (ITU T.81 Table B.1) for messages: ``SOF0``, ``DHT``, ``APP1``."""
    if marker in _JPEG_SOF:
        return f"SOF{marker - 0xC0}"
    if 0xE0 <= marker <= 0xEF:
        return f"APP{marker - 0xE0}"
    return {0xC4: "DHT", 0xCC: "DAC", 0xDA: "SOS", 0xDB: "DQT", 0xDC: "DNL", 0xDD: "DRI", 0xDE: "DHP",
            0xDF: "EXP", 0xFE: "COM"}.get(marker, "marker")


def _cut_segment(data: bytes, marker: int, pos: int) -> str:
    """Where ``data`` ends inside the segment of ``marker`` whose length field starts at byte
    ``pos`` (the marker's code byte at ``pos - 1``): the words of a truncated-JPEG message. The
    last two bytes may be FF D9 (an EOI marker put back after a cut), which lie inside the segment
    and are no end of image; the message says so, not that the marker is missing."""
    name = f"{_jpeg_segment_name(marker)} segment (marker FF {marker:02X} at byte {pos - 2})"
    if pos + 2 > len(data):
        said = f"inside the {name}, before its length field"
    else:
        said = (f"inside the {name}, which declares {_u16(data, pos)} bytes and so runs to byte "
                f"{pos + _u16(data, pos)}")
    if data.endswith(b"\xff\xd9"):
        said += "; the FF D9 it ends with lies inside that segment, so it is no end-of-image marker"
    return said


def _exif_orientation(tiff: bytes) -> int:
    """Orientation (0x0112) from an EXIF TIFF block; 1 when absent, reserved or unreadable
    (a broken EXIF block does not make the pixels unusable)."""
    try:
        tags = tiff_tags(lambda offset, size: tiff[offset:offset + size], len(tiff), {TIFF_ORIENTATION})
    except Defect:
        return 1
    value = tags.get(TIFF_ORIENTATION, (1,))[0]
    return value if 1 <= value <= 8 else 1


def _tiff_layout(read: Reader) -> tuple[str, int, int]:
    """(byte order ``<`` or ``>``, version 42 or 43 (BigTIFF), offset of the first IFD)."""
    head = read(0, 16)
    if len(head) < 4 or head[:2] not in (b"II", b"MM"):
        raise Defect("decode_failed", f"TIFF header {head[:8].hex()} is not II/MM + version")
    order = "<" if head[:2] == b"II" else ">"
    version = _u16(head, 2, order)
    if len(head) < (16 if version == 43 else 8):
        raise Defect("truncated", f"TIFF ends at byte {len(head)}, inside its {16 if version == 43 else 8}-byte "
                                   "header (before the first IFD's offset); the file was cut short, copy or export it "
                                   "again")
    if version not in (42, 43):
        raise Defect("decode_failed", f"TIFF version {version}; expected 42 (TIFF) or 43 (BigTIFF)")
    header_size = 16 if version == 43 else 8
    first = int(struct.unpack_from(order + ("Q" if version == 43 else "I"), head, header_size // 2)[0])
    if first < header_size:  # 0: "no IFD", which a TIFF must have; the walk would find no page at all
        raise Defect("decode_failed", f"TIFF header gives byte {first} as its first IFD, inside the {header_size}-byte "
                                       "header: the file names no image directory (a damaged header); re-export it")
    return order, version, first


def _tiff_ifd(read: Reader, size: int, layout: tuple[str, int, int], ifd: int, index: int, wanted: set[int],
              values: _Values) -> tuple[_Tags, int | None, int]:
    """Integer tags in ``wanted`` of the IFD at byte ``ifd``, the ``index``-th of the chain.

    Returns (tags, offset of the next IFD (0: none; ``None``: the offset itself lies past the end
    of the file), bytes parsed that ``values`` did not hold yet). ``values`` caches out-of-line
    tag values by (offset, type, count), so an array that several IFDs share is parsed once.
    """
    order, version, _ = layout
    where = "first IFD" if index == 0 else f"IFD {index}"
    count_fmt, entry_size, inline = ("Q", 20, 8) if version == 43 else ("H", 12, 4)
    count_size = struct.calcsize(count_fmt)
    # Offsets and counts are checked against the file size before reading: a BigTIFF offset can
    # exceed what seek() accepts, and read(n) allocates n bytes first.
    raw_count = read(ifd, count_size) if ifd + count_size <= size else b""
    if len(raw_count) < count_size:
        raise Defect("truncated", f"TIFF {where} at byte {ifd} lies past the end of the file ({size} bytes); "
                                   "the file was cut short, copy or export it again")
    n_entries = int(struct.unpack(order + count_fmt, raw_count)[0])
    fits = ifd + count_size + n_entries * entry_size <= size
    entries = read(ifd + count_size, n_entries * entry_size) if fits else b""
    if len(entries) < n_entries * entry_size:
        raise Defect("truncated", f"TIFF {where} ({n_entries} entries at byte {ifd}) runs past the end "
                                   f"of the file ({size} bytes); the file was cut short, copy or export it again")
    value_count_fmt = "Q" if version == 43 else "I"
    parsed = count_size + n_entries * entry_size
    tags: _Tags = {}
    for i in range(n_entries):
        base = i * entry_size
        tag, kind = struct.unpack_from(order + "HH", entries, base)
        if tag not in wanted or kind not in _TIFF_TYPES:
            continue
        count = int(struct.unpack_from(order + value_count_fmt, entries, base + 4)[0])
        if count == 0:  # a tag without values is as good as absent
            continue
        item = _TIFF_TYPES[kind]
        nbytes = count * struct.calcsize(item)
        field_at = base + 4 + struct.calcsize(value_count_fmt)
        if nbytes <= inline:
            tags[tag] = struct.unpack(order + item * count, entries[field_at:field_at + nbytes])
            continue
        offset = int(struct.unpack_from(order + value_count_fmt, entries, field_at)[0])
        if (offset, kind, count) not in values:
            raw = read(offset, nbytes) if offset + nbytes <= size else b""
            if len(raw) < nbytes:
                in_ifd = "" if index == 0 else f" in IFD {index}"
                raise Defect("truncated", f"TIFF tag {tag} values{in_ifd} ({nbytes} bytes) lie past the end "
                                           "of the file; the file was cut short, copy or export it again")
            values[offset, kind, count] = struct.unpack(order + item * count, raw)
            parsed += nbytes
        tags[tag] = values[offset, kind, count]
    next_at, next_size = ifd + count_size + n_entries * entry_size, struct.calcsize(value_count_fmt)
    raw_next = read(next_at, next_size) if next_at + next_size <= size else b""
    next_ifd = int(struct.unpack(order + value_count_fmt, raw_next)[0]) if len(raw_next) == next_size else None
    return {tag: tuple(int(v) for v in vals) for tag, vals in tags.items()}, next_ifd, parsed + next_size


def tiff_tags(read: Reader, size: int, wanted: set[int]) -> _Tags:
    """Integer tags of the first IFD of a classic or Big TIFF, either byte order."""
    layout = _tiff_layout(read)
    return _tiff_ifd(read, size, layout, layout[2], 0, wanted, {})[0]


@dataclass(frozen=True)
class Ifd:
    """One IFD of a TIFF's main chain: ``index`` (0-based position in the chain, what tifffile's
    ``pages[index]`` and Pillow's ``seek(index)`` address), ``offset`` (byte) and its ``tags``."""

    index: int
    offset: int
    tags: _Tags

    @property
    def reduced(self) -> bool:
        """NewSubfileType (254) bit 0: a reduced-resolution version of another image in the file."""
        return is_reduced(self.tags)


def tiff_chain(read: Reader, size: int, limits: LimitsConfig) -> list[Ifd]:
    """Every IFD of the main chain (not SubIFDs), in file order, each checked for completeness.

    Raises Defect: ``decode_failed`` when the chain loops (an IFD offset seen twice) or when the
    IFDs and their tag values add up to more bytes than the file holds (overlapping IFDs: without
    this check a crafted chain makes the walk quadratic); ``too_large`` past
    ``limits.max_frames`` IFDs; ``truncated`` when an IFD, its tag values, its strip or tile data
    or the next-IFD offset lies past the end of the file.
    """
    layout = _tiff_layout(read)
    chain: list[Ifd] = []
    seen: dict[int, int] = {}
    values: _Values = {}
    parsed, offset = 0, layout[2]
    while offset:
        if offset in seen:
            raise Defect("decode_failed", f"TIFF IFD {len(chain) - 1} gives byte {offset} as the next IFD, which is "
                                           f"IFD {seen[offset]} again: the IFD chain loops; the file is damaged, "
                                           "re-export it")
        if len(chain) == limits.max_frames:
            frames_text = ("the number of images in the TIFF's IFD chain (pages and reduced-resolution images, all "
                           "decoded; counting stopped at the first one over the limit)")
            raise Defect("too_large", str(limit_problem(limits, size_text="", pixels=0, decoded=0, decoded_text="",
                                                         frames=len(chain) + 1, frames_text=frames_text)))
        seen[offset] = len(chain)
        tags, next_offset, new_bytes = _tiff_ifd(read, size, layout, offset, len(chain), _TIFF_CHAIN_TAGS, values)
        parsed += new_bytes
        if parsed > size:
            raise Defect("decode_failed", f"TIFF IFDs 0-{len(chain)} and their tag values add up to {parsed} bytes, "
                                           f"more than the file's {size}: they overlap, which no TIFF writer does; "
                                           "the file is damaged or crafted, re-export it")
        _check_tiff_data(tags, size, len(chain))
        if next_offset is None:
            where = "first IFD" if not chain else f"IFD {len(chain)}"
            raise Defect("truncated", f"TIFF {where} at byte {offset} ends where the file does ({size} bytes), "
                                       "without its next-IFD offset; the file was cut short, copy or export it again")
        chain.append(Ifd(len(chain), offset, tags))
        offset = next_offset
    return chain


def straight_alpha(data: bytes, chain: list[Ifd]) -> bytes:
    """``data`` with the ExtraSamples of each 8-bit IFD that declares unassociated alpha (2)
    rewritten as associated (1), or ``data`` itself where none does.

    OpenCV decodes an 8-bit TIFF with alpha through libtiff's RGBA interface, which hands over
    unassociated (straight) colours multiplied by alpha (``(c·a + 127) / 255``: a colour under
    alpha 0 is lost), so an RGBA TIFF packed darkened where it is transparent, and composited over
    white its alpha counted twice. Told the alpha is associated, libtiff passes the stored colours
    and alpha through unchanged: the straight values the file holds, which is what packer's alpha
    handling (drop, or composite over white) expects, as for a PNG.
    """
    if not any(_TIFF_EXTRA_SAMPLES in ifd.tags and 2 in ifd.tags[_TIFF_EXTRA_SAMPLES]
               and ifd.tags.get(_TIFF_BITS, (1,))[0] == 8 for ifd in chain):
        return data
    order, version, _ = _tiff_layout(lambda offset, count: data[offset:offset + count])
    count_fmt, entry_size, inline = ("Q", 20, 8) if version == 43 else ("H", 12, 4)
    value_fmt = "Q" if version == 43 else "I"
    patched = bytearray(data)
    for ifd in chain:
        if ifd.tags.get(_TIFF_BITS, (1,))[0] != 8 or 2 not in ifd.tags.get(_TIFF_EXTRA_SAMPLES, ()):
            continue
        entries = ifd.offset + struct.calcsize(count_fmt)
        for i in range(int(struct.unpack_from(order + count_fmt, data, ifd.offset)[0])):
            base = entries + i * entry_size
            tag, kind = struct.unpack_from(order + "HH", data, base)
            if tag != _TIFF_EXTRA_SAMPLES or kind != 3:  # SHORT, as the walk read it
                continue
            count = int(struct.unpack_from(order + value_fmt, data, base + 4)[0])
            at = base + 4 + struct.calcsize(value_fmt)
            if 2 * count > inline:
                at = int(struct.unpack_from(order + value_fmt, data, at)[0])
            for k in range(count):
                if struct.unpack_from(order + "H", data, at + 2 * k)[0] == 2:
                    struct.pack_into(order + "H", patched, at + 2 * k, 1)
    return bytes(patched)


def _check_tiff_data(tags: _Tags, size: int, index: int) -> None:
    """Raise Defect("truncated") when the strips or tiles of IFD ``index`` run past ``size``."""
    for offsets_tag, counts_tag in _TIFF_DATA:
        ends = [o + c for o, c in zip(tags.get(offsets_tag, ()), tags.get(counts_tag, ()), strict=False)]
        if ends and max(ends) > size:
            of_ifd = "" if index == 0 else f" of IFD {index}"
            raise Defect("truncated", f"TIFF image data{of_ifd} runs to byte {max(ends)} but the file has "
                                       f"{size} bytes; the file was cut short, copy or export it again")


def tiff_compressions(chain: list[Ifd]) -> set[int]:
    """The Compression value of each IFD of ``chain`` (1, none, where it has no tag)."""
    return {ifd.tags.get(_TIFF_COMPRESSION, (1,))[0] for ifd in chain}


@dataclass(frozen=True)
class TiffSamples:
    """How one IFD stores its samples: ``bits`` (BitsPerSample, the first), ``samples``
    (SamplesPerPixel), ``photometric`` (PhotometricInterpretation, −1 where absent),
    ``extra`` (ExtraSamples: 1 associated, premultiplied alpha; 2 unassociated alpha) and
    ``planar`` (PlanarConfiguration: 1 interleaved, the default; 2 one plane per sample)."""

    bits: int
    samples: int
    photometric: int
    extra: tuple[int, ...]
    planar: int = 1

    @classmethod
    def of(cls, ifd: Ifd) -> TiffSamples:
        tags = ifd.tags
        return cls(bits=tags.get(_TIFF_BITS, (1,))[0], samples=tags.get(_TIFF_SAMPLES, (1,))[0],
                   photometric=tags.get(_TIFF_PHOTOMETRIC, (-1,))[0], extra=tags.get(_TIFF_EXTRA_SAMPLES, ()),
                   planar=tags.get(_TIFF_PLANAR, (1,))[0])

    @property
    def separate_wide(self) -> bool:
        """Its samples are stored as separate planes at more than 8 bits, a layout OpenCV 5 decodes
        wrong (:func:`~packer.transform.image.opencv_misreads_planar_tiff`)."""
        return opencv_misreads_planar_tiff(self.planar, self.samples, self.bits)

    @property
    def premultiplied(self) -> bool:
        """Its alpha is associated: the stored colours are multiplied by it."""
        return bool(self.extra) and self.extra[0] == 1


def tiff_photometrics(chain: list[Ifd]) -> set[int]:
    """The PhotometricInterpretation of each IFD of ``chain`` (−1 where it has none)."""
    return {ifd.tags.get(_TIFF_PHOTOMETRIC, (-1,))[0] for ifd in chain}


def check_strip_data(data: bytes, chain: list[Ifd], compressions: frozenset[int]) -> None:
    """Raise Defect("decode_failed") where a strip or tile of an IFD of ``chain`` compressed with
    one of ``compressions`` (Deflate, LZW, PackBits) does not decode to the bytes its rows need
    (:func:`~packer.transform.tiff_strips.strip_problem`): a stored stream cut short (a
    StripByteCounts smaller than the stream: the file's own length is right, so
    :func:`tiff_chain` passes it) or damaged. libtiff (through OpenCV) pads such a strip with
    zero rows and returns the image, which would pack black rows as if they were data; Pillow
    and tifffile refuse it. Decodes at most the size of each strip."""
    for ifd in chain:
        problem = strip_problem(data, ifd.tags, compressions, where="" if ifd.index == 0 else f" of IFD {ifd.index}")
        if problem:
            raise Defect("decode_failed", f"TIFF {problem}; re-export the file")


def tiff_header_of(tags: _Tags, where: str) -> ImageHeader:
    """The header of one IFD's ``tags``; ``where`` names the IFD in messages."""
    missing = [name for tag, name in ((_TIFF_WIDTH, "ImageWidth (256)"), (_TIFF_LENGTH, "ImageLength (257)"))
               if tag not in tags]
    if missing:
        raise Defect("decode_failed", f"TIFF {where} lacks {' and '.join(missing)}")
    orientation = tags.get(TIFF_ORIENTATION, (1,))[0]
    return ImageHeader(height=tags[_TIFF_LENGTH][0], width=tags[_TIFF_WIDTH][0],
                       channels=tags.get(_TIFF_SAMPLES, (1,))[0], bit_depth=tags.get(_TIFF_BITS, (1,))[0],
                       format="tiff", orientation=orientation if 1 <= orientation <= 8 else 1)


def _tiff_header(read: Reader, size: int) -> ImageHeader:
    tags = tiff_tags(read, size, {_TIFF_WIDTH, _TIFF_LENGTH, _TIFF_BITS, _TIFF_SAMPLES, TIFF_ORIENTATION})
    return tiff_header_of(tags, "first IFD")


def _bmp_fields(read: Reader) -> dict[str, int]:
    head = read(0, 54)
    if len(head) < 26:
        raise Defect("truncated", f"BMP ends at byte {len(head)}, inside its headers")
    dib = int(struct.unpack_from("<I", head, 14)[0])
    fields = {"offset": int(struct.unpack_from("<I", head, 10)[0]), "dib": dib, "compression": 0, "colours": 0}
    if dib == 12:  # BITMAPCOREHEADER: 16-bit unsigned sizes, 3-byte palette entries
        fields["width"], fields["height"], _, fields["bpp"] = struct.unpack_from("<HHHH", head, 18)
        return fields
    if dib < 40 or len(head) < 50:
        raise Defect("decode_failed" if len(head) >= 50 else "truncated",
                      f"BMP info header of {dib} bytes; expected 12 or >= 40")
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", head, 18)
    fields.update(width=width, height=abs(height), bpp=bpp, compression=compression,
                  colours=int(struct.unpack_from("<I", head, 46)[0]))
    return fields


def _bmp_header(read: Reader) -> ImageHeader:
    fields = _bmp_fields(read)
    bpp = fields["bpp"]
    if bpp > 8:
        channels = 4 if bpp == 32 else 3
    else:  # OpenCV decodes a palette of greys to one channel, like this check
        entry = 3 if fields["dib"] == 12 else 4
        count = min(fields["colours"] or 1 << bpp, 1 << bpp)
        palette = read(14 + fields["dib"], count * entry)
        grey = all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, entry))
        channels = 1 if grey else 3
    return ImageHeader(fields["height"], fields["width"], channels, 8, "bmp")


def file_header(fmt: str, read: Reader, size: int) -> ImageHeader:
    if fmt == "png":
        return _png_header(read(0, 33))
    if fmt == "tiff":
        return _tiff_header(read, size)
    if fmt == "bmp":
        return _bmp_header(read)
    chunk = _JPEG_PROBE_START
    while True:  # read a growing prefix until the SOF is in it: header-only for the usual file
        header = _walk_jpeg(read(0, chunk), complete=chunk >= size, until_sof=True)
        if header is not None:
            return header
        if chunk >= size:
            raise Defect("decode_failed", "JPEG has an EOI marker (FFD9) but no SOF header before it")
        chunk *= 4


def tiff_buffer_pixels(tags: _Tags, header: ImageHeader) -> int:
    """Pixels of the one tile or strip buffer libtiff allocates (TileWidth × TileLength, or
    ImageWidth × RowsPerStrip): a tiny TIFF can claim 65535×65535 tiles."""
    if TIFF_TILE_WIDTH in tags and TIFF_TILE_LENGTH in tags:
        return tags[TIFF_TILE_WIDTH][0] * tags[TIFF_TILE_LENGTH][0]
    return header.width * min(tags.get(TIFF_ROWS_PER_STRIP, (header.height,))[0], header.height)


# --- structure checks on the whole file ------------------------------------------------------

def check_complete(fmt: str, data: bytes) -> int:
    """Raise Defect("truncated") when ``data`` is cut short; returns the orientation (1-8)."""
    def read(offset: int, size: int) -> bytes:
        return data[offset:offset + size]

    if fmt == "jpeg":
        header = _walk_jpeg(data, complete=True, until_sof=False)
        return header.orientation if header else 1
    if fmt == "png":
        pos, orientation, exif_seen = 8, 1, False
        while pos + 8 <= len(data):
            length, kind = int(struct.unpack_from(">I", data, pos)[0]), data[pos + 4:pos + 8]
            if kind == b"IEND":
                if pos + 12 > len(data):  # length, type and a 4-byte CRC: libpng refuses a cut one
                    raise Defect("truncated", f"PNG ends at byte {len(data)} inside its IEND chunk (which ends at "
                                               f"byte {pos + 12}); the file was cut short, copy or export it again")
                return orientation
            if kind == b"acTL" and length >= 8 and (frames := int(struct.unpack_from(">I", data, pos + 8)[0])) > 1:
                # an animated PNG (APNG, PNG 3rd edition): libpng and OpenCV decode its default
                # image alone, so every other frame would vanish unsaid
                raise Defect("unsupported", f"an animated PNG (APNG: an acTL chunk, {frames} frames), which "
                                             "packer does not read: a decode keeps only its first frame; "
                                             "export each frame as its own PNG (lossless), e.g. with "
                                             "ffmpeg -i FILE.png frame%03d.png")
            if kind == b"eXIf" and not exif_seen:  # PNG 3rd edition: at most one, before or after IDAT
                exif_seen = True
                orientation = _exif_orientation(data[pos + 8:pos + 8 + length])
            pos += 12 + length
        raise Defect("truncated", f"PNG ends at byte {len(data)} without an IEND chunk; the file was cut short, "
                                   "copy or export it again")
    if fmt == "tiff":
        tags = tiff_tags(read, len(data), {t for pair in _TIFF_DATA for t in pair} | {TIFF_ORIENTATION}
                         | _TIFF_DECODE_VALUES)
        _check_tiff_data(tags, len(data), 0)
        orientation = tags.get(TIFF_ORIENTATION, (1,))[0]
        return orientation if 1 <= orientation <= 8 else 1
    fields = _bmp_fields(read)
    if fields["compression"] in (0, 3, 6):  # uncompressed rows: BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS
        need = fields["offset"] + ((fields["bpp"] * fields["width"] + 31) // 32) * 4 * fields["height"]
        if need > len(data):
            raise Defect("truncated", f"BMP pixel rows need {need} bytes but the file has {len(data)}; "
                                       "the file was cut short, copy or export it again")
    return 1
