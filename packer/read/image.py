"""Read natural images (PNG, JPEG, TIFF, BMP): header probe, output-size estimate, decode.

- :func:`probe_image` parses the header only (PNG IHDR, JPEG SOFn and EXIF, first TIFF IFD,
  BMP info header), for the header pass; :func:`probe_image_at` does the same through a
  ``read(offset, count)`` function (the raw store rehearses it on remote files).
- :func:`read_image` checks the file's structure (a cut file is ``truncated`` even where
  the decoder would fill the missing part), checks the header against the job's size limits
  (``too_large`` before the decoder allocates anything, see :mod:`packer.read.limits`; also
  OpenCV's own ``OPENCV_IO_MAX_IMAGE_*`` limits and, for TIFF, the tile or strip buffer libtiff
  allocates), decodes it once with OpenCV
  (``IMREAD_UNCHANGED``: 16-bit and alpha survive), applies the JPEG EXIF / TIFF
  Orientation where OpenCV did not (:func:`decoder_orients`), validates the pixels and hands
  them to :mod:`packer.transform.image`. A PNG's orientation comes from its eXIf chunk, which
  may follow the pixel data, so it is read with the whole file, not by the probe.
- Every page of a multi-page TIFF becomes samples: :func:`read_image` walks the main IFD
  chain itself (loops, ``limits.max_frames``, cut strips and tiles of every IFD, the size limits
  over all IFDs together), decodes all of them with one ``cv2.imdecodemulti`` and keeps the
  pages, skipping reduced-resolution IFDs (thumbnails, pyramid levels). The probe looks at the
  first IFD only, so a defect of a later page shows up in the read, not in the header pass.

Defects of the file come back as an :class:`~packer.records.Issue`, never ``None``.
The format is taken from the file's signature, not its extension. The file structure itself
(headers, IFD chains, completeness) is parsed by :mod:`packer.read.image_structure`.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from packer.config import ImageTransformConfig, LimitsConfig
from packer.keys import make_key, page_key
from packer.opencv import cv2
from packer.read import ReadProgress, at_boundary
from packer.read.image_structure import (
    FORMATS,
    TIFF_ORIENTATION,
    TIFF_ROWS_PER_STRIP,
    TIFF_TILE_LENGTH,
    TIFF_TILE_WIDTH,
    Defect,
    Ifd,
    ImageHeader,
    Reader,
    TiffSamples,
    check_complete,
    check_strip_data,
    cut_signature,
    damaged_signature,
    file_header,
    png_grey_key,
    sniff_format,
    straight_alpha,
    tiff_buffer_pixels,
    tiff_chain,
    tiff_compressions,
    tiff_header_of,
    tiff_photometrics,
    tiff_tags,
)
from packer.read.jpeg_scan import strict_decode
from packer.read.limits import DEFAULT_LIMITS, file_size_problem, limit_problem
from packer.read.opening import open_failure
from packer.read.tiff_codecs import check_jpeg_chunks, check_opencv_decodes
from packer.records import Issue, Sample, SampleRef
from packer.transform.image import (
    OPENCV_SCALED_TIFF_BITS,
    Tile,
    check_image_config,
    full_range_max,
    oriented_size,
    transform_image,
)
from packer.transform.tiff_strips import TIFF_CHECKED_ALWAYS, TIFF_CHECKED_ON_ZERO, page_indices

# OpenCV refuses larger images itself (modules/imgcodecs/src/loadsave.cpp validateInputImageSize),
# with limits it reads from these environment variables once, when the library loads. Its C++
# constants are named CV_IO_MAX_IMAGE_*, but no variable of that name is read: the too_large
# message says so where one is set (packer's own advice used to name them).
_CV_LIMITS = (("OPENCV_IO_MAX_IMAGE_WIDTH", 1 << 20), ("OPENCV_IO_MAX_IMAGE_HEIGHT", 1 << 20),
              ("OPENCV_IO_MAX_IMAGE_PIXELS", 1 << 30))
# OpenCV's parse of a size setting (core/src/system.cpp): digits, then nothing, KB or MB in one of
# three spellings. Any other value makes OpenCV abort while it loads, before packer runs at all.
_CV_LIMIT_VALUE = re.compile(r"([0-9]+)(KB|Kb|kb|MB|Mb|mb)?")


# --- size limits -----------------------------------------------------------------------------

def _opencv_limit(name: str, default: int) -> int:
    """The limit OpenCV enforces for ``name`` in this environment: the variable's value as OpenCV
    parses it (``4194304``, ``4MB``: × 2**20, ``64KB``: × 2**10), or ``default`` when it is unset."""
    match = _CV_LIMIT_VALUE.fullmatch(os.environ.get(name, ""))
    if match is None:
        return default
    number, unit = match.groups()
    return int(number) << {None: 0, "k": 10, "m": 20}[unit[0].lower() if unit else None]


@dataclass(frozen=True)
class _Sizes:
    """What decoding one image allocates, in bytes, from its header (see :mod:`packer.read.limits`)."""

    size_text: str  # names the header fields and their values
    pixels: int
    per_sample: int  # bytes per decoded sample
    stored: int  # the decoded array
    working: int  # two float32 copies of max(C, 3) channels
    buffer: int | None  # the TIFF tile/strip buffer; None for other formats

    @classmethod
    def of(cls, header: ImageHeader, buffer_pixels: int | None, where: str = "") -> _Sizes:
        fields = {"png": ("IHDR width", "height"), "jpeg": ("SOF width", "height"),
                  "tiff": ("ImageWidth (256)", "ImageLength (257)"), "bmp": ("width", "height")}[header.format]
        per_sample = min(8, max(1, -(-header.bit_depth // 8)))
        pixels = header.height * header.width
        return cls(f"{where}{header.format.upper()} {fields[0]} {header.width} × {fields[1]} {header.height}",
                   pixels, per_sample, pixels * header.channels * per_sample, 2 * pixels * max(header.channels, 3) * 4,
                   None if buffer_pixels is None else buffer_pixels * header.channels * per_sample)


def _check_size(header: ImageHeader, limits: LimitsConfig, read: Reader, size: int) -> int:
    """Raise Defect("too_large") when decoding ``header`` would exceed ``limits`` or OpenCV's
    own limits; what is counted is in :mod:`packer.read.limits`. Returns the bytes decoding
    needs (the count checked against ``limits.max_decoded_bytes``)."""
    buffer_pixels = None
    if header.format == "tiff":
        tags = tiff_tags(read, size, {TIFF_ROWS_PER_STRIP, TIFF_TILE_WIDTH, TIFF_TILE_LENGTH})
        buffer_pixels = tiff_buffer_pixels(tags, header)
    one = _Sizes.of(header, buffer_pixels)
    decoded_text = (f"{header.height}×{header.width} × {header.channels} channel(s) × {one.per_sample} byte(s) "
                    f"decoded, plus {one.working} bytes of float32 working copies")
    if one.buffer is not None:
        decoded_text += f", plus a {one.buffer}-byte TIFF tile/strip buffer"
    needed = one.stored + one.working + (one.buffer or 0)
    problem = limit_problem(limits, size_text=one.size_text, pixels=one.pixels,
                            decoded=needed, decoded_text=decoded_text)
    if problem is not None:
        raise Defect("too_large", problem)
    _check_opencv_limits(header, one.size_text)
    return needed


def _check_pages_size(images: list[tuple[Ifd, ImageHeader]], limits: LimitsConfig) -> None:
    """:func:`_check_size` for every image of a TIFF's IFD chain, which OpenCV decodes at once:
    each image's pixels against ``limits.max_pixels`` and OpenCV's limits, and the sum of the
    decoded arrays, plus the working copies of the largest (pages are transformed one at a time)
    and the largest tile/strip buffer (libtiff frees it between pages), against
    ``limits.max_decoded_bytes``."""
    sizes = [_Sizes.of(header, tiff_buffer_pixels(ifd.tags, header), f"IFD {ifd.index} at byte {ifd.offset}: ")
             for ifd, header in images]
    for one in sizes:
        problem = limit_problem(limits, size_text=one.size_text, pixels=one.pixels, decoded=0, decoded_text="")
        if problem is not None:
            raise Defect("too_large", problem)
    stored, working, buffer = sum(s.stored for s in sizes), max(s.working for s in sizes), max(
        s.buffer or 0 for s in sizes)
    decoded_text = (f"{len(sizes)} images in the TIFF's IFD chain, decoded together: {stored} bytes, plus "
                    f"{working} bytes of float32 working copies of the largest, plus a {buffer}-byte TIFF "
                    "tile/strip buffer")
    problem = limit_problem(limits, size_text="", pixels=0, decoded=stored + working + buffer,
                            decoded_text=decoded_text)
    if problem is not None:
        raise Defect("too_large", problem)
    for (_, header), one in zip(images, sizes, strict=True):
        _check_opencv_limits(header, one.size_text)


def _check_opencv_limits(header: ImageHeader, size_text: str) -> None:
    """Raise Defect("too_large") where OpenCV would refuse to decode ``header``'s image: its width,
    height or pixel count over the limit OpenCV reads from ``OPENCV_IO_MAX_IMAGE_*``."""
    values = {"OPENCV_IO_MAX_IMAGE_WIDTH": header.width, "OPENCV_IO_MAX_IMAGE_HEIGHT": header.height,
              "OPENCV_IO_MAX_IMAGE_PIXELS": header.height * header.width}
    for name, default in _CV_LIMITS:
        limit = _opencv_limit(name, default)
        if values[name] > limit:
            alias = name.removeprefix("OPEN")
            unread = (f"; {alias}, which is set here, is only the name of OpenCV's C++ constant and changes "
                      "nothing" if alias in os.environ else "")
            raise Defect("too_large", f"{size_text}: {values[name]} is over OpenCV's {name} {limit}, so OpenCV "
                                      f"would refuse it; if the file is genuine, set the environment variable {name} "
                                      "higher where every worker starts (OpenCV reads it when it loads), and raise "
                                      f"limits.max_pixels to match{unread}")


# --- public API ------------------------------------------------------------------------------

def _name(ref: SampleRef) -> str:
    return ref.relpath or ref.path


def _unsupported(ref: SampleRef, head: bytes, dicm: bytes = b"") -> Issue:
    """The Issue of a file whose first bytes (``head``: up to 16, all of a shorter file) name no
    format; ``truncated`` when the whole file is the start of a signature, ``decode_failed`` when
    they are a damaged signature of a format packer reads (:func:`damaged_signature`: converting
    the file would not help). ``dicm``: its bytes
    128-131, which say ``DICM`` in a DICOM file (a DICOM file among the photos is told to go to a
    DICOM source, not to be converted to PNG; renamed first, since a DICOM source never reads a
    file named as an image)."""
    if dicm == b"DICM":
        ext = os.path.splitext(ref.path)[1] or "(no extension)"
        return Issue.of(ref, stage="read", reason="unsupported",
                        message=f"{_name(ref)}: a DICOM file (DICM at byte 128) named {ext} in an image source, which "
                                "reads PNG, JPEG, TIFF and BMP; rename it to .dcm, which a kind: dicom source reads (a "
                                f"job may have both; it never reads a file named {ext}), or move it out of this root")
    cut = cut_signature(head)
    if cut is not None:
        return Issue.of(ref, stage="read", reason="truncated",
                        message=f"{_name(ref)}: the file is only {len(head)} bytes long ({head.hex(' ')}), the start "
                                f"of a {cut.upper()} signature: it was cut short, copy or export it again")
    suffix = os.path.splitext(ref.path)[1]
    damaged = damaged_signature(head, suffix)
    if damaged is not None:  # a damaged file of a format packer reads: converting it would not help
        fmt, what = damaged
        return Issue.of(ref, stage="read", reason="decode_failed",
                        message=f"{_name(ref)}: a damaged {fmt.upper()} signature: first bytes {what}; the file is "
                                "damaged, copy or export it again")
    ext = suffix or "(none)"
    return Issue.of(ref, stage="read", reason="unsupported",
                    message=f"{_name(ref)}: first bytes {head[:8].hex(' ')} (extension {ext}) are not a PNG, "
                            f"JPEG, TIFF or BMP signature; convert the file to one of {', '.join(FORMATS)}")


def _open_issue(ref: SampleRef, err: OSError) -> Issue:
    reason, said = open_failure(ref.path, err)
    return Issue.of(ref, stage="read", reason=reason, message=f"{_name(ref)}: {said}")


def probe_image(ref: SampleRef, *, limits: LimitsConfig = DEFAULT_LIMITS) -> ImageHeader | Issue:
    """Read only the header of the image at ``ref.path`` (no pixel decode).

    Returns the :class:`ImageHeader`, or an Issue (stage ``read``): ``missing_file``,
    ``unreadable`` (OSError, zero bytes), ``unsupported`` (unknown signature),
    ``truncated`` (ends inside the header), ``decode_failed`` (malformed header, or a damaged PNG,
    JPEG or TIFF signature),
    ``bad_shape`` (zero height or width), ``too_large`` (file size, pixels or decoded size
    over ``limits``, or over OpenCV's ``OPENCV_IO_MAX_IMAGE_*``), ``unexpected_error``.

    A TIFF's header is its first IFD's: the probe does not walk the IFD chain, so for a
    multi-page TIFF it describes (and checks against ``limits``) the first page only;
    :func:`read_image` checks every page.
    """
    try:
        with open(ref.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size

            def read(offset: int, count: int) -> bytes:
                handle.seek(offset)
                return handle.read(count)

            return probe_image_at(ref, read, size, limits=limits)
    except OSError as err:  # opening, reading or closing the file; probe_image_at is the boundary of the rest
        return _open_issue(ref, err)


def probe_image_at(ref: SampleRef, read: Callable[[int, int], bytes], size: int, *,
                   limits: LimitsConfig = DEFAULT_LIMITS) -> ImageHeader | Issue:
    """:func:`probe_image` of a ``size``-byte file that ``read(offset, count)`` reads (the bytes
    a seek to ``offset`` then ``read(count)`` gives; fewer at the end): the same outcome, and
    every byte it looks at comes through ``read``. ``ref.path`` is only named in messages.

    The raw store rehearses the probe with it to learn which byte ranges of a remote file the
    header pass needs (:func:`packer.pipeline.rawstore.fetched` with ``headers_only``).
    """
    try:
        header = _probe_header(ref, read, size, limits)
    except Exception as err:  # the probe's one boundary: a bug must not stop the header pass
        return _probe_issue(ref, err)
    if isinstance(header, Issue):
        return header
    if header.height < 1 or header.width < 1:
        return Issue.of(ref, stage="read", reason="bad_shape",
                        message=f"{_name(ref)}: {header.format} header gives {header.height}×{header.width} pixels; "
                                "expected both >= 1")
    return header


def _probe_header(ref: SampleRef, read: Reader, size: int, limits: LimitsConfig) -> ImageHeader | Issue:
    """The header, or the Issue of an empty or unrecognised file; raises Defect, OSError."""
    if size == 0:
        return Issue.of(ref, stage="read", reason="unreadable",
                        message=f"{_name(ref)}: the file is empty (0 bytes); replace it or remove it")
    head = read(0, 16)
    fmt = sniff_format(head)
    if fmt is None:
        # the 8 bytes more show an IHDR a line-ending translation moved by a byte or two
        return _unsupported(ref, head + read(16, 8), read(128, 4) if size >= 132 else b"")
    too_big = file_size_problem(size, limits)
    if too_big is not None:
        raise Defect("too_large", too_big)
    header = file_header(fmt, read, size)
    if header.height >= 1 and header.width >= 1:
        _check_size(header, limits, read, size)
    return header


def _probe_issue(ref: SampleRef, err: Exception) -> Issue:
    """The Issue (stage ``read``) for what a header probe raised: an OSError is ``missing_file``
    or ``unreadable``, a defect its own reason, anything else ``unexpected_error``."""
    if isinstance(err, OSError):
        return _open_issue(ref, err)
    if isinstance(err, Defect):
        return Issue.of(ref, stage="read", reason=err.reason, message=f"{_name(ref)}: {err.message}")
    return Issue.of(ref, stage="read", reason="unexpected_error", message=f"{type(err).__name__}: {err}")


def _exif_block(orientation: int) -> bytes:
    """An EXIF TIFF block (big-endian) holding only an Orientation tag."""
    return b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">HHHIHHI", 1, TIFF_ORIENTATION, 3, 1, orientation, 0, 0)


def _exif_segment(orientation: int) -> bytes:
    """A JPEG APP1 segment holding only an EXIF Orientation tag."""
    payload = b"Exif\x00\x00" + _exif_block(orientation)
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _exif_chunk(orientation: int) -> bytes:
    """A PNG eXIf chunk (PNG 3rd edition, 11.3.6.1) holding only an EXIF Orientation tag."""
    block = _exif_block(orientation)
    return struct.pack(">I", len(block)) + b"eXIf" + block + struct.pack(">I", zlib.crc32(b"eXIf" + block))


def _tiny_tiff(*orientations: int) -> bytes:
    """A 1×2 grey uint8 TIFF, pixels [0, 255], one page (IFD) per Orientation value given."""
    entries = [(256, 3, 2), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, 8),
               (TIFF_ORIENTATION, 3, 0), (277, 3, 1), (278, 3, 1), (279, 4, 2)]
    ifd_size = 2 + 12 * len(entries) + 4
    out = b"II*\x00" + struct.pack("<I", 10) + b"\x00\xff"  # every page shares the strip at byte 8
    for page, orientation in enumerate(orientations):
        out += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            value = orientation if tag == TIFF_ORIENTATION else value
            field = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
            out += struct.pack("<HHI", tag, kind, 1) + field
        out += struct.pack("<I", 10 + (page + 1) * ifd_size if page + 1 < len(orientations) else 0)
    return out


def _left_is_bright(image: np.ndarray) -> bool:
    return int(image.reshape(image.shape[0], image.shape[1], -1)[0, 0, 0]) > 127


@cache
def decoder_orients(fmt: str) -> bool:
    """Whether ``cv2.imdecode(..., IMREAD_UNCHANGED)`` applies the file's Orientation itself.

    It differs by format and OpenCV version (OpenCV 5 orients TIFF, not JPEG), so it is
    measured once on a tiny mirrored (Orientation 2) file instead of assumed.
    """
    left_dark = np.repeat(np.repeat([[0, 255]], 8, axis=0), 8, axis=1).astype(np.uint8)
    if fmt == "jpeg":
        ok, encoded = cv2.imencode(".jpg", left_dark)
        data = encoded.tobytes()[:2] + _exif_segment(2) + encoded.tobytes()[2:] if ok else b""
    elif fmt == "png":  # eXIf right after IHDR (8-byte signature + 25-byte IHDR chunk)
        ok, encoded = cv2.imencode(".png", left_dark)
        data = encoded.tobytes()[:33] + _exif_chunk(2) + encoded.tobytes()[33:] if ok else b""
    elif fmt == "tiff":
        data = _tiny_tiff(2)
    else:
        return False
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) if data else None
    return decoded is not None and _left_is_bright(decoded)


@cache
def decoder_orients_pages() -> tuple[bool, bool]:
    """Whether ``cv2.imdecodemulti(..., IMREAD_UNCHANGED)`` applies each TIFF page's Orientation
    itself: (for the first IFD, for the later ones). Measured once on a tiny two-page TIFF whose
    pages are both mirrored (Orientation 2), like :func:`decoder_orients`; OpenCV 5.0 orients both.
    """
    try:
        ok, mats = cv2.imdecodemulti(np.frombuffer(_tiny_tiff(2, 2), np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error:
        ok, mats = False, ()
    if not ok or len(mats) != 2:
        return False, False
    return _left_is_bright(mats[0]), _left_is_bright(mats[1])


@contextlib.contextmanager
def _opencv_quietly() -> Iterator[None]:
    """OpenCV's own log silenced while it decodes, and set back after: on a damaged file it wrote
    ``[ERROR:0@0.99] global loadsave.cpp ... imdecode_(''): can't read header: ...`` to the
    process's stderr, naming no file, between the progress lines; the file's record says what
    happened (its message quotes OpenCV's error where one is raised). libpng's and libjpeg's own
    lines are not OpenCV's log and still print (see the README)."""
    before = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(before)


@contextlib.contextmanager
def _as_file(data: bytes) -> Iterator[str]:
    """``data`` as a temporary file's path (deleted after): for OpenCV's file readers."""
    handle, path = tempfile.mkstemp(suffix=".tif", prefix="packer-decode-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        yield path
    finally:
        os.unlink(path)


def _raise_if_out_of_memory(err: cv2.error) -> None:
    """Raise MemoryError for OpenCV's own failed allocation (``-4: Insufficient memory``): the
    machine is short of memory, the file is fine (:func:`packer.read.at_boundary` stops the run)."""
    if getattr(err, "code", None) == cv2.Error.StsNoMem:
        raise MemoryError(f"OpenCV: {str(err).strip()}") from err


def _decode(data: bytes, fmt: str) -> np.ndarray:
    try:
        with _opencv_quietly():
            image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            if image is None and fmt == "tiff":
                # OpenCV 5.0's in-memory TIFF stream fails on tiles stored uncompressed ("Invalid
                # tile byte count"), which its file reader decodes: a valid file, read from a file
                with _as_file(data) as path:
                    image = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    except cv2.error as err:
        _raise_if_out_of_memory(err)
        raise Defect("decode_failed", f"OpenCV could not decode this {fmt} file: {err}") from err
    if image is None:
        raise Defect("decode_failed", f"OpenCV could not decode this {fmt} file (imdecode returned nothing); "
                                       "open it in an image viewer, re-export it, or remove it")
    return image


#: The precisions a JPEG's SOF may give (8 and 12 bits for DCT, 2 to 16 for lossless): outside them
#: the header is damaged, not of a kind OpenCV does not read
_JPEG_PRECISIONS = range(2, 17)


def _decode_wide_jpeg(data: bytes, bits: int) -> np.ndarray:
    """A JPEG whose SOF gives ``bits`` other than 8 (a 12-bit extended SOF1, a 12- or 16-bit
    lossless SOF3), as OpenCV decodes it; where OpenCV returns nothing, as its 8-bit libjpeg
    does for every such file, ``unsupported`` naming the precision and the fix: the file is valid,
    and ``decode_failed`` "re-export it" would blame it."""
    try:
        return _decode(data, "jpeg")
    except Defect as defect:
        if bits not in _JPEG_PRECISIONS:
            raise
        raise Defect("unsupported", (
            f"a {bits}-bit JPEG (SOF precision {bits}: extended or lossless JPEG, as scientific and medical "
            "cameras write), which OpenCV (packer's decoder) does not read: it reads 8-bit JPEG only; convert it "
            "to a 16-bit PNG or TIFF, which keeps every bit (e.g. in Python: imagecodecs.imwrite('x.png', "
            "imagecodecs.imread('x.jpg')))")) from defect


@dataclass(frozen=True)
class _Page:
    """One decoded image of a file: ``orientation`` is the file's value for it (1-8), ``oriented``
    whether OpenCV applied it already, ``page`` its index in the TIFF IFD chain when the file
    has several pages (else ``None``: no page in the key or metadata)."""

    image: np.ndarray
    orientation: int
    oriented: bool
    page: int | None = None
    #: samples per pixel as the file stores them (its header's; OpenCV decodes grey+alpha as 4)
    channels: int | None = None
    #: bits per sample as stored where OpenCV hands them back scaled to 16 (a 10-, 12- or 14-bit
    #: TIFF: :data:`~packer.transform.image.OPENCV_SCALED_TIFF_BITS`), whose window is in stored units
    scaled_bits: int | None = None

    @property
    def where(self) -> str:
        return "" if self.page is None else f"page {self.page}: "


def _tiff_as_stored(data: bytes, ifd: Ifd, image: np.ndarray) -> tuple[np.ndarray, bool | None]:
    """The page of IFD ``ifd`` as the file stores it, where OpenCV's decode ``image`` is not, and,
    where Pillow read it instead, whether Pillow applied the page's orientation (None: OpenCV's
    decode stands, oriented as :func:`~packer.read.image_structure.decoder_orients_pages` says):

    - an extra sample that is not alpha (ExtraSamples 0, unspecified) is no alpha channel: the
      page is its colour or grey samples alone;
    - a grey+alpha page comes back as the grey alone (its alpha dropped): an 8-bit one is read
      with Pillow instead (H×W×2, grey and alpha); a 16-bit one is ``unsupported``;
    - a page of more than 8 bits whose samples are stored as separate planes (PlanarConfiguration
      2) is ``unsupported``: OpenCV reads its first plane as if it held every sample, interleaved;
    - any page of more than 8 bits that comes back as 8 bits (libtiff's RGBA interface, which
      OpenCV falls back on for layouts it does not read itself) is ``unsupported``: its
      precision, and its values, are not the file's (a palette page's colours excepted);
    - associated (premultiplied) alpha gives colours multiplied by alpha: they are divided back
      (alpha 0: colour 0), so that packer's alpha handling sees straight colours, as for a PNG;
    - a WhiteIsZero (photometric 0) page of 10 to 16 bits comes back as stored (libtiff inverts
      only what its RGBA interface reads, 8 bits and fewer; 10, 12 and 14 bits scaled to 16): it
      is inverted here, as DICOM's MONOCHROME1 is, so that black is 0.
    """
    layout = TiffSamples.of(ifd)
    where = f"TIFF IFD {ifd.index} at byte {ifd.offset}"
    channels = image.shape[2] if image.ndim == 3 else 1
    alpha = bool(layout.extra) and layout.extra[0] in (1, 2)
    if layout.extra and not alpha and layout.samples == 4 and channels == 4:
        # an extra sample that is not alpha (ExtraSamples 0, unspecified: a NIR band, a mask,
        # padding): the image is its colour samples, which OpenCV hands back as BGRA
        image, channels = np.ascontiguousarray(image[:, :, :3]), 3
    if layout.samples == 2 and channels == 1 and alpha:
        if layout.bits != 8:
            raise Defect("unsupported", (
                f"{where}: a {layout.bits}-bit grey+alpha TIFF, which OpenCV (packer's decoder) reads without its "
                "alpha and at 8 bits; export it as a 16-bit grey+alpha PNG, which is read whole"))
        (image, by_pillow), channels = _pillow_grey_alpha(data, ifd, where), 2
    else:
        by_pillow = None
    if layout.separate_wide:
        raise Defect("unsupported", (
            f"{where}: a {layout.bits}-bit TIFF whose {layout.samples} samples per pixel are stored as separate "
            "planes (PlanarConfiguration 2), which OpenCV (packer's decoder) reads as if they were interleaved, "
            "giving wrong pixels; export it with interleaved samples (PlanarConfiguration 1: tifffile's "
            "planarconfig='contig', GDAL's INTERLEAVE=PIXEL) or as a 16-bit PNG"))
    if layout.bits > 8 and image.dtype.itemsize == 1 and layout.photometric != 3:  # a palette's colours are 8-bit
        raise Defect("unsupported", (
            f"{where}: a {layout.bits}-bit TIFF ({layout.samples} samples per pixel, photometric "
            f"{layout.photometric}) that OpenCV (packer's decoder) reads only at 8 bits; export it as a 16-bit PNG "
            "or a TIFF of 1, 3 or 4 samples per pixel"))
    if layout.premultiplied and channels in (2, 4) and image.dtype.kind == "u":
        image = _unpremultiplied(image)
    if layout.photometric == 0 and image.dtype == np.uint16 and layout.bits <= 16:
        # OpenCV hands a 10-, 12- or 14-bit page back scaled to 16 bits (v << (16 - bits)), as it does a
        # BlackIsZero one: inverted in that scale (4095 - v of the scaled values wrapped around in uint16)
        shift = OPENCV_SCALED_TIFF_BITS.get(layout.bits, 0)
        image = np.subtract(((1 << layout.bits) - 1) << shift, image, dtype=np.uint16)
    return image, by_pillow


def _scaled_bits(ifd: Ifd, image: np.ndarray) -> int | None:
    """The page's stored bits per sample where OpenCV decoded it scaled up to 16 bits (10, 12 or 14
    bits come back as ``v << (16 - bits)``), else None."""
    bits = TiffSamples.of(ifd).bits
    return bits if bits in OPENCV_SCALED_TIFF_BITS and image.dtype == np.uint16 else None


def _pillow_grey_alpha(data: bytes, ifd: Ifd, where: str) -> tuple[np.ndarray, bool]:
    """An 8-bit grey+alpha TIFF page as Pillow decodes it: H×W×2 uint8, grey then alpha, and
    whether Pillow applied the page's Orientation as it loaded it (Pillow 13 does, and drops the
    tag then; earlier versions left the pixels as stored, the tag in place)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.seek(ifd.index)
            before = opened.getexif().get(_ORIENTATION_TAG, 1)
            pixels = np.asarray(opened)
            after = opened.getexif().get(_ORIENTATION_TAG, 1)
    except (OSError, ValueError, EOFError, SyntaxError, Image.DecompressionBombError) as err:
        planar = (" Its two samples are stored as separate planes (PlanarConfiguration 2); export it with "
                  "interleaved samples (PlanarConfiguration 1) or as a grey+alpha PNG"
                  if TiffSamples.of(ifd).planar == 2 else "")
        raise Defect("decode_failed", f"{where}: Pillow could not decode this grey+alpha page: {err}.{planar}") from err
    if pixels.ndim != 3 or pixels.shape[2] != 2 or pixels.dtype != np.uint8:
        raise Defect("decode_failed", f"{where}: Pillow decoded this grey+alpha page as {pixels.shape} {pixels.dtype}, "
                                       "not grey and alpha; re-export it as a grey+alpha PNG")
    return np.ascontiguousarray(pixels), before != after


#: TIFF's Orientation tag (274)
_ORIENTATION_TAG = 274


def _unpremultiplied(image: np.ndarray) -> np.ndarray:
    """Colours stored multiplied by alpha (the last channel) → straight colours, rounded."""
    peak = float(np.iinfo(image.dtype).max)
    alpha = image[:, :, -1:].astype(np.float64)
    colour = image[:, :, :-1].astype(np.float64) * peak / np.maximum(alpha, 1.0)
    straight = np.where(alpha > 0, np.clip(np.rint(colour), 0.0, peak), 0.0)
    return np.concatenate([straight.astype(image.dtype), image[:, :, -1:]], axis=2)


#: Bits per sample OpenCV's TIFF decoder reads (4 only as a palette's indices): a valid page of any
#: other depth (a 2- or 4-bit greyscale scan) makes it return nothing, which reads as a damaged file
OPENCV_TIFF_BITS = (1, 8, 10, 12, 14, 16, 32, 64)
#: What a TIFF PhotometricInterpretation is, for a refusal to name the layout
_TIFF_LAYOUTS = {0: "greyscale (WhiteIsZero)", 1: "greyscale", 2: "RGB", 3: "palette", 5: "CMYK", 6: "YCbCr"}


def _check_opencv_reads_bits(chain: list[Ifd]) -> None:
    """Raise ``unsupported`` for the first IFD of ``chain`` (every one is decoded) whose bits per
    sample OpenCV does not read (:data:`OPENCV_TIFF_BITS`): the file is valid, and OpenCV's
    empty answer would otherwise be ``decode_failed``, "re-export it", as if it were damaged."""
    for ifd in chain:
        layout = TiffSamples.of(ifd)
        read = layout.bits in OPENCV_TIFF_BITS or (layout.bits == 4 and layout.photometric == 3)
        if read or not 1 < layout.bits < 64:
            continue  # a depth of 0 or past 64 is no layout but damage: OpenCV's decode_failed says so
        kind = _TIFF_LAYOUTS.get(layout.photometric, f"photometric {layout.photometric}")
        raise Defect("unsupported", (
            f"TIFF IFD {ifd.index} at byte {ifd.offset}: a {layout.bits}-bit {kind} TIFF ({layout.samples} "
            f"sample{'s' if layout.samples != 1 else ''} per pixel), which OpenCV (packer's decoder) does not read: "
            "it reads 1, 8, 10, 12, 14, 16, 32 or 64 bits a sample (4 only as a palette); save it at 8 or 16 bits "
            "a sample (a TIFF or a PNG)"))


#: The samples a pixel OpenCV's TIFF decoder reads (grey, grey+alpha, RGB, RGBA or CMYK): a page of
#: more (RGB + alpha + a saved selection) makes it return nothing, which reads as a damaged file
OPENCV_TIFF_MAX_SAMPLES = 4
#: What an ExtraSamples value says the sample is
_EXTRA_SAMPLES = {0: "unspecified", 1: "associated alpha", 2: "unassociated alpha"}


def _check_opencv_reads_samples(decoded: list[Ifd]) -> None:
    """Raise ``unsupported`` for the first IFD of ``decoded`` (the IFDs OpenCV will decode) of more
    than :data:`OPENCV_TIFF_MAX_SAMPLES` samples a pixel, naming its layout (photometric,
    ExtraSamples) and the fix: a valid file, which OpenCV's empty answer would make
    ``decode_failed``, "re-export it"."""
    for ifd in decoded:
        layout = TiffSamples.of(ifd)
        if layout.samples <= OPENCV_TIFF_MAX_SAMPLES:
            continue
        kind = _TIFF_LAYOUTS.get(layout.photometric, f"photometric {layout.photometric}")
        extras = ", ".join(_EXTRA_SAMPLES.get(value, f"value {value}") for value in layout.extra)
        said = f"ExtraSamples {list(layout.extra)}: {extras}" if layout.extra else "no ExtraSamples"
        raise Defect("unsupported", (
            f"TIFF IFD {ifd.index} at byte {ifd.offset}: {layout.samples} samples per pixel ({kind}, {said}), "
            f"which OpenCV (packer's decoder) does not read: it reads 1 to {OPENCV_TIFF_MAX_SAMPLES} samples a "
            "pixel (grey, grey+alpha, RGB, RGBA, CMYK); save it without the extra channels (Photoshop's alpha "
            "channels and saved selections: delete them in the Channels panel, or export as PNG), as RGB or RGBA"))


def _tiff_pages(chain: list[Ifd]) -> list[Ifd]:
    """The IFDs that are pages: all but reduced-resolution ones, or all when every IFD is flagged
    reduced (:func:`~packer.transform.tiff_strips.page_indices`, the rule a TIFF mask's pages
    are chosen by too)."""
    return [chain[index] for index in page_indices([ifd.tags for ifd in chain])]


def _chain_headers(chain: list[Ifd], limits: LimitsConfig) -> list[ImageHeader]:
    """The header of each IFD of a multi-page TIFF's ``chain``, each page's size and the
    decoded arrays' sum checked against ``limits`` (:func:`_check_pages_size`), from the tags
    alone: before any strip is inflated."""
    headers = []
    for ifd in chain:
        header = tiff_header_of(ifd.tags, f"IFD {ifd.index} at byte {ifd.offset}")
        if header.height < 1 or header.width < 1:
            raise Defect("bad_shape", f"TIFF IFD {ifd.index} at byte {ifd.offset} gives {header.height}×"
                                       f"{header.width} pixels; expected both >= 1")
        headers.append(header)
    _check_pages_size(list(zip(chain, headers, strict=True)), limits)
    return headers


def _decode_tiff_pages(data: bytes, chain: list[Ifd], pages: list[Ifd], headers: list[ImageHeader]) -> list[_Page]:
    """Decode every IFD of ``chain`` (``headers``: theirs, checked by :func:`_chain_headers`) with
    one ``cv2.imdecodemulti`` call and keep ``pages``.

    OpenCV 5.0 returns one image per IFD of the main chain, reduced-resolution ones included (it
    walks the chain with libtiff and does not look at NewSubfileType). Image ``i`` is taken for
    IFD ``i`` only when the counts agree and every image has its IFD's (oriented) size; anything
    else is ``decode_failed``, never a page silently shifted or dropped.
    """
    try:
        with _opencv_quietly():
            ok, mats = cv2.imdecodemulti(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            if not ok or not mats:  # as in _decode: uncompressed tiles decode from a file
                with _as_file(data) as path:
                    ok, mats = cv2.imreadmulti(path, flags=cv2.IMREAD_UNCHANGED)
    except cv2.error as err:
        _raise_if_out_of_memory(err)
        raise Defect("decode_failed", f"OpenCV could not decode this multi-page tiff file: {err}") from err
    if not ok or not mats:
        raise Defect("decode_failed", "OpenCV could not decode this multi-page tiff file (imdecodemulti returned "
                                       "nothing); open it in an image viewer, re-export it, or remove it")
    if len(mats) != len(chain):
        raise Defect("decode_failed", f"OpenCV decoded {len(mats)} images from the {len(chain)} IFDs of the TIFF "
                                       "chain, so its images cannot be matched to pages; re-export the file")
    first, later = decoder_orients_pages()
    wanted = {ifd.index for ifd in pages}
    out = []
    for ifd, header, image in zip(chain, headers, mats, strict=True):
        oriented = first if ifd.index == 0 else later
        expected = oriented_size(header.height, header.width, header.orientation) if oriented else (
            header.height, header.width)
        if tuple(image.shape[:2]) != expected:
            raise Defect("decode_failed", f"OpenCV decoded IFD {ifd.index} at byte {ifd.offset} as "
                                           f"{image.shape[0]}×{image.shape[1]}, but its header gives "
                                           f"{expected[0]}×{expected[1]}; its images cannot be matched to pages, "
                                           "re-export the file")
        if ifd.index in wanted:
            stored, by_pillow = _tiff_as_stored(data, ifd, image)
            out.append(_Page(stored, header.orientation, oriented if by_pillow is None else by_pillow,
                             ifd.index if len(pages) > 1 else None, header.channels, _scaled_bits(ifd, stored)))
    return out


def _decode_pages(fmt: str, data: bytes, limits: LimitsConfig, progress: ReadProgress) -> list[_Page]:
    """Check the file's structure and size limits, then decode it: one page, or one per page of a
    multi-page TIFF. Raises Defect; notes in ``progress.needed`` the bytes decoding needs."""
    def read(offset: int, count: int) -> bytes:
        return data[offset:offset + count]

    chain: list[Ifd] = []
    if fmt == "tiff":
        chain = tiff_chain(read, len(data), limits)
        pages = _tiff_pages(chain)
        # every IFD decoded at once: each one's size checked before a strip is inflated
        headers = _chain_headers(chain, limits) if [ifd.index for ifd in pages] != [0] else None
        # OpenCV decodes the whole chain with the pages, or the first IFD alone
        check_opencv_decodes(chain if headers is not None else chain[:1])
        _check_opencv_reads_samples(chain if headers is not None else chain[:1])
        check_jpeg_chunks(data, pages)
        # a thumbnail's strips are no page's: libtiff pads its lost rows and it is left out
        check_strip_data(data, pages, TIFF_CHECKED_ALWAYS)
        _check_opencv_reads_bits(chain)
        data = straight_alpha(data, chain)
        if headers is not None:
            return _zero_samples_checked(data, pages, _decode_tiff_pages(data, chain, pages, headers))
    orientation = check_complete(fmt, data)
    header = file_header(fmt, read, len(data))
    if header.height >= 1 and header.width >= 1:  # else OpenCV reports the bad header
        progress.needed = _check_size(header, limits, read, len(data))
    # an 8-bit JPEG is decoded by libjpeg-turbo in strict mode, which (unlike OpenCV) reports scan
    # data cut short or damaged (packer.read.jpeg_scan); its pixels are OpenCV's, not oriented
    strict = strict_decode(data) if fmt == "jpeg" and header.bit_depth == 8 else None
    if strict is not None:
        image, oriented = strict, False
    else:
        wide = fmt == "jpeg" and header.bit_depth != 8
        image = _decode_wide_jpeg(data, header.bit_depth) if wide else _decode(data, fmt)
        oriented = decoder_orients(fmt)
    if chain:
        image, by_pillow = _tiff_as_stored(data, chain[0], image)
        oriented = oriented if by_pillow is None else by_pillow
    elif fmt == "png" and image.ndim == 2 and (key := png_grey_key(data)) is not None:
        # a grey PNG whose transparency is a colour key: OpenCV gives the grey alone
        opaque = np.iinfo(image.dtype).max
        image = np.dstack([image, np.where(image == key, 0, opaque).astype(image.dtype)])
    page = _Page(image, orientation, oriented, channels=header.channels,
                 scaled_bits=_scaled_bits(chain[0], image) if chain else None)
    return _zero_samples_checked(data, _tiff_pages(chain), [page]) if chain else [page]


def _zero_samples_checked(data: bytes, ifds: list[Ifd], pages: list[_Page]) -> list[_Page]:
    """``pages`` (decoded from ``ifds``, the TIFF's IFDs that are pages: :func:`_tiff_pages`, no
    thumbnail, whose strips libtiff pads and which is left out), once an LZW or PackBits TIFF has
    had its strips checked
    (:func:`~packer.read.image_structure.check_strip_data`, slower than the decode: 10 MB/s) where
    a decoded page holds a zero sample, as the rows libtiff pads a strip that ran out with do
    (whatever the orientation), or where its colours are not its stored values (a palette, or
    WhiteIsZero, which OpenCV inverts)."""
    if not tiff_compressions(ifds) & TIFF_CHECKED_ON_ZERO:
        return pages
    if tiff_photometrics(ifds) - {1, 2} or not all(page.image.all() for page in pages):
        check_strip_data(data, ifds, TIFF_CHECKED_ON_ZERO)
    return pages


def _check_shape(image: np.ndarray) -> None:
    channels = image.shape[2] if image.ndim == 3 else 1
    if image.ndim not in (2, 3) or image.size == 0 or channels not in (1, 2, 3, 4):
        raise Defect("bad_shape", f"decoded to shape {image.shape} {image.dtype}; expected H×W or H×W×C "
                                   "with H, W >= 1 and C in 1-4")


def _constant(image: np.ndarray) -> str | None:
    """What a blank image is made of (every pixel the same), or None."""
    channels = image.shape[2] if image.ndim == 3 else 1
    pixels = image.reshape(image.shape[0] * image.shape[1], channels)
    # a sparse probe rejects almost every real image in microseconds; the full check runs
    # only when ~64 spread-out pixels all equal the first one
    probe = pixels[:: max(1, len(pixels) // 64)]
    if bool((probe == pixels[0]).all()) and bool((pixels == pixels[0]).all()):
        # OpenCV's order is BGR(A): the message gives the colour as a viewer shows it
        value, order = pixels[0].tolist(), {3: "RGB ", 4: "RGBA "}.get(channels, "")
        if order:
            value = [*value[2::-1], *value[3:]]
        return f"every pixel is {order}{value} ({image.shape[0]}×{image.shape[1]})"
    return None


def _validate(pages: list[_Page]) -> None:
    """Every page must have a usable shape; the file is ``constant_image`` only when every page is
    blank (like a DICOM file's frames: a blank page among others is packed)."""
    for page in pages:
        try:
            _check_shape(page.image)
        except Defect as defect:
            raise Defect(defect.reason, page.where + defect.message) from None
    blank = [_constant(page.image) for page in pages]
    if all(blank):
        raise Defect("constant_image", "; ".join(page.where + str(why) for page, why in zip(pages, blank, strict=True))
                      + "; a blank image carries no signal, remove it")


def _samples(ref: SampleRef, fmt: str, page: _Page, tiles: list[Tile], pages: int) -> list[Sample]:
    stored_h, stored_w = page.image.shape[:2]
    if page.oriented:  # OpenCV returned it oriented: undo the axis swap to report the stored size
        stored_h, stored_w = oriented_size(stored_h, stored_w, page.orientation)
    metadata: dict[str, Any] = {
        "format": fmt,
        "source_height": int(stored_h),
        "source_width": int(stored_w),
        "source_channels": page.channels if page.channels is not None else (
            int(page.image.shape[2]) if page.image.ndim == 3 else 1),
        "bit_depth": page.scaled_bits or int(page.image.dtype.itemsize * 8),
        "orientation": page.orientation,
    }
    key = ref.sample_id
    if page.page is not None:
        metadata.update(page=page.page, pages=pages)
        key = page_key(key, page.page)
    samples = []
    for tile in tiles:
        if tile.origin is None:
            samples.append(Sample(key, ref, tile.image, metadata, content=tile.content))
        else:
            row, col = tile.origin
            samples.append(Sample(make_key(ref.sample_id, page=page.page, tile=(row, col)), ref, tile.image,
                                  {**metadata, "tile": [row, col]}, content=tile.content))
    return samples


def read_image(ref: SampleRef, cfg: ImageTransformConfig, *,
               limits: LimitsConfig = DEFAULT_LIMITS) -> list[Sample] | Issue:
    """Decode, validate and transform the image at ``ref.path``.

    Returns one Sample (key ``ref.sample_id``) or one per full tile (key
    ``{sample_id}-t{row:05d}_{col:05d}``), each with ``image`` uint8 C×H×W C-contiguous
    (C = 3 RGB or 1 grey; order of operations in :mod:`packer.transform.image`) and
    ``metadata`` = format, source_height/source_width (as stored, before orientation, like
    :func:`probe_image`), source_channels (samples per pixel as the header stores them: grey+alpha PNG 2,
    palette PNG 3, CMYK JPEG 4, whatever OpenCV decodes them to),
    bit_depth (of the decoded samples: 8, 16, 32 or 64; a 10-, 12- or 14-bit TIFF's stored bits,
    the units its window is in), orientation (1-8), tile [row, col].

    A TIFF with N > 1 pages gives every page's samples, in IFD order, each page transformed on its
    own with ``cfg``: keys ``{sample_id}-p{page:05d}`` (tiled: ``…-p{page:05d}-t{row:05d}_{col:05d}``),
    metadata as above for that page plus ``page`` (0-based index in the main IFD chain, as
    tifffile's ``pages[i]`` and Pillow's ``seek(i)`` count) and ``pages`` (N). Reduced-resolution
    IFDs (NewSubfileType bit 0: thumbnails, pyramid levels of another page) are not pages: they
    are skipped, so ``page`` then skips their indices; SubIFDs are never visited. A file with one
    page keeps the plain key and metadata. A defect of any page is the Issue of the whole file,
    naming the page or IFD.

    Defects → Issue: ``missing_file``, ``unreadable``, ``unsupported``, ``truncated``,
    ``decode_failed`` (also: a TIFF IFD chain that loops), ``too_large`` (header over ``limits``,
    checked before decoding; for a TIFF, also more than ``limits.max_frames`` IFDs, and all pages'
    decoded bytes together) (stage ``read``); ``bad_shape``, ``constant_image`` (every page
    blank) (``validate``); ``missing_window`` (float image without a window), ``bad_shape`` (no
    full tile) (``transform``); ``unexpected_error`` from whichever stage raised
    (:func:`packer.read.at_boundary`, the read stage's one boundary). Raises ConfigError only for
    an unusable ``cfg`` (a defect of the run).
    """
    check_image_config(cfg)
    return at_boundary(ref, lambda progress: _read(ref, cfg, limits, progress))


def _read(ref: SampleRef, cfg: ImageTransformConfig, limits: LimitsConfig,
          progress: ReadProgress) -> list[Sample] | Issue:
    """:func:`read_image`'s work; moves ``progress.stage`` on as it goes, and raises what it did
    not foresee (to :func:`packer.read.at_boundary`)."""
    try:
        try:
            too_big = file_size_problem(os.stat(ref.path).st_size, limits)
            if too_big is not None:
                raise Defect("too_large", too_big)
            data = Path(ref.path).read_bytes()
        except OSError as err:
            return _open_issue(ref, err)
        if not data:
            return Issue.of(ref, stage="read", reason="unreadable",
                            message=f"{_name(ref)}: the file is empty (0 bytes); replace it or remove it")
        fmt = sniff_format(data[:16])
        if fmt is None:
            return _unsupported(ref, data[:24], data[128:132])
        pages = _decode_pages(fmt, data, limits, progress)
        progress.stage = "validate"
        _validate(pages)
        progress.stage = "transform"
        for page in pages:
            if not cfg.window and full_range_max(page.image.dtype) is None:
                return Issue.of(ref, stage="transform", reason="missing_window",
                                message=f"{_name(ref)}: {page.where}{page.image.dtype} pixels have no fixed range to "
                                        "scale to 8 bits; set transform.image.window ({center, width} or "
                                        "{percentiles: [lo, hi]})")
        tiled = [transform_image(page.image, cfg, 1 if page.oriented else page.orientation,
                                 scaled_bits=page.scaled_bits) for page in pages]
    except Defect as defect:
        return Issue.of(ref, stage=progress.stage, reason=defect.reason, message=f"{_name(ref)}: {defect.message}")
    for page, tiles in zip(pages, tiled, strict=True):
        if not tiles:
            return Issue.of(ref, stage="transform", reason="bad_shape",
                            message=f"{_name(ref)}: {page.where}no full {cfg.tile_size} tile fits the "
                                    f"{'resized' if cfg.size else 'oriented'} image; lower transform.image.tile.size")
    return [sample for page, tiles in zip(pages, tiled, strict=True)
            for sample in _samples(ref, fmt, page, tiles, len(pages))]
