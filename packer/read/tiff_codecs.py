"""TIFF compressions: which ones OpenCV's libtiff decodes, and JPEG tiles and strips checked strictly.

OpenCV's bundled libtiff is built without JPEG 2000, ZSTD, WebP, LZMA, JPEG XL, old-style JPEG,
... (opencv/3rdparty/libtiff/CMakeLists.txt). On a page in one of them it does not fail: it logs
"Compression scheme 34712 tile decoding is not implemented" (silenced, like all of OpenCV's log,
while packer decodes) and hands back a zero-filled page, or nothing at all, so a valid whole-slide
pyramid packed a black page or read as a damaged (``decode_failed``) or blank
(``constant_image``) file. :func:`check_opencv_decodes` refuses such a page first, from its
Compression tag (259), as ``unsupported``, naming the page, the compression and the fix.

libjpeg inside libtiff stops at a damaged JPEG tile ("Unsupported marker type") and OpenCV returns
the page with the tile's rest grey. :func:`check_jpeg_chunks` decodes each JPEG tile or strip of a
page strictly with libjpeg-turbo (:mod:`packer.read.jpeg_scan`), the page's JPEGTables (347)
spliced in, as for a standalone JPEG.
"""

from __future__ import annotations

from packer.read.image_structure import Defect, Ifd
from packer.read.jpeg_scan import check_stream

_COMPRESSION, _JPEG_TABLES = 259, 347
_WIDTH, _LENGTH, _TILE_WIDTH, _TILE_LENGTH = 256, 257, 322, 323
_STRIPS, _TILES = (273, 279), (324, 325)  # (offsets, byte counts)
#: TIFF Compression 7: JPEG ("new-style", TIFF Technical Note 2), the one libtiff decodes here
TIFF_JPEG = 7

#: Compression (259) values OpenCV's libtiff decodes in this build (opencv-python-headless 5.0,
#: libtiff 4.7.1). Measured by writing small TIFFs in every compression tifffile (imagecodecs) and
#: Pillow (libtiff) encode and decoding them with ``cv2.imdecode`` (tests/test_tiff_compressions.py
#: checks the set against every compression tifffile writes): none (1), CCITT RLE, Group 3 and
#: Group 4 (2, 3, 4), LZW (5), JPEG (7), Deflate (8, 32946), CCITT RLEW (32771), PackBits (32773)
#: decode; JPEG 2000 (34712, Aperio's 33003/33005, 33004), ZSTD (50000, 34926), WebP (50001,
#: 34927), LZMA (34925), JPEG XL (50002, 52546), PNG (34933), JPEG XR (34934, 22610), LERC (34887)
#: and lossy DNG JPEG (34892) give zeros or nothing. NeXT (32766), ThunderScan (32809) and SGI
#: LogLuv (34676, 34677) are enabled in OpenCV's libtiff build but no encoder here writes them:
#: kept, so a file OpenCV may read is not refused (NeXT's 2 and ThunderScan's 4 bits a sample are
#: refused by the depth check anyway). Old-style JPEG (6) is built without ("OpenCV: changed to OFF").
OPENCV_TIFF_COMPRESSIONS = frozenset({1, 2, 3, 4, 5, TIFF_JPEG, 8, 32766, 32771, 32773, 32809, 32946, 34676, 34677})

#: What a Compression value is, for a refusal to name it (tifffile's COMPRESSION and the TIFF
#: registry's names)
COMPRESSION_NAMES = {
    6: "old-style JPEG", 9: "JBIG T.85", 10: "JBIG T.43", 22610: "Hamamatsu NDPI JPEG XR",
    32908: "PixarFilm", 32909: "PixarLog", 32947: "Kodak DCS", 33003: "Aperio YCbCr JPEG 2000",
    33004: "lossy JPEG 2000", 33005: "Aperio RGB JPEG 2000", 34661: "JBIG", 34712: "JPEG 2000",
    34715: "JBIG2", 34887: "LERC", 34892: "DNG lossy JPEG", 34925: "LZMA", 34926: "ZSTD (its draft code)",
    34927: "WebP (its draft code)", 34933: "PNG", 34934: "JPEG XR", 48124: "Jetraw", 50000: "ZSTD", 50001: "WebP",
    50002: "JPEG XL", 52546: "DNG JPEG XL",
}

_FIX = ("re-save it with Deflate, LZW or JPEG compression, e.g. with tifffile (its imagecodecs decode it): "
        "`tifffile.imwrite('out.tif', tifffile.imread('in.tif', key=page), compression='zlib')` for each page, "
        "or `vips tiffsave 'in.tif[page=N]' out.tif --compression deflate` where libvips reads it")


def _where(ifd: Ifd) -> str:
    if ifd.reduced:
        return (f"TIFF IFD {ifd.index} at byte {ifd.offset} (a reduced-resolution image: a thumbnail or pyramid "
                "level, which OpenCV decodes with the pages)")
    return f"TIFF page {ifd.index} (IFD at byte {ifd.offset})"


def check_opencv_decodes(decoded: list[Ifd]) -> None:
    """Raise ``unsupported`` for the first IFD of ``decoded`` (the IFDs OpenCV will decode) whose
    Compression is not one OpenCV's libtiff decodes (:data:`OPENCV_TIFF_COMPRESSIONS`)."""
    for ifd in decoded:
        number = ifd.tags.get(_COMPRESSION, (1,))[0]
        if number in OPENCV_TIFF_COMPRESSIONS:
            continue
        name = COMPRESSION_NAMES.get(number, "a compression TIFF's registry does not name")
        raise Defect("unsupported", (
            f"{_where(ifd)} is compressed with {name} (Compression {number}), which OpenCV's libtiff (packer's "
            "decoder) does not decode: it would give a page of zeros or nothing; " + _FIX))


def _chunks(ifd: Ifd) -> tuple[str, list[tuple[int, int]]]:
    """("tile" or "strip", (offset, byte count) of each) of one IFD."""
    tiled = _TILE_WIDTH in ifd.tags and _TILE_LENGTH in ifd.tags
    offsets, counts = _TILES if tiled else _STRIPS
    return ("tile" if tiled else "strip"), list(zip(ifd.tags.get(offsets, ()), ifd.tags.get(counts, ()),
                                                    strict=False))


def _tile_place(ifd: Ifd, index: int) -> str:
    """Where tile ``index`` of a tiled IFD lies: its row and column in the grid of tiles."""
    tags = ifd.tags
    across = -(-tags[_WIDTH][0] // tags[_TILE_WIDTH][0]) if _WIDTH in tags and tags[_TILE_WIDTH][0] else 0
    if not across:
        return ""
    down = -(-tags[_LENGTH][0] // tags[_TILE_LENGTH][0]) if _LENGTH in tags and tags[_TILE_LENGTH][0] else 0
    within = index % (across * down) if down else index
    return f", row {within // across} column {within % across} of tiles"


def check_jpeg_chunks(data: bytes, pages: list[Ifd]) -> None:
    """Raise ``decode_failed`` where a JPEG (Compression 7) tile or strip of one of ``pages``
    does not decode whole with libjpeg-turbo (:func:`packer.read.jpeg_scan.check_stream`: scan
    data damaged or cut short; ``unsupported`` for a 12-bit stream, which OpenCV's libtiff does
    not decode either), each one's stream with the page's JPEGTables spliced in (the tables'
    SOI..EOI less its EOI, then the tile less its SOI). A stream TurboJPEG does not open (CMYK) is
    left to OpenCV unchecked, as a standalone JPEG is; an empty one (a sparse tile, which libtiff
    fills) is skipped."""
    for ifd in pages:
        if ifd.tags.get(_COMPRESSION, (1,))[0] != TIFF_JPEG:
            continue
        tables = bytes(ifd.tags.get(_JPEG_TABLES, ()))
        head = tables[:-2] if tables[:2] == b"\xff\xd8" and tables[-2:] == b"\xff\xd9" else b""
        kind, chunks = _chunks(ifd)
        for index, (offset, count) in enumerate(chunks):
            stream = data[offset:offset + count]
            if not stream:
                continue
            if head and stream[:2] == b"\xff\xd8":
                stream = head + stream[2:]
            try:
                check_stream(stream)
            except Defect as defect:
                place = _tile_place(ifd, index) if kind == "tile" else ""
                raise Defect("unsupported" if defect.reason == "unsupported" else "decode_failed",
                             f"TIFF page {ifd.index}: JPEG {kind} {index} (at byte {offset}{place}): "
                             f"{defect.message}") from None
