"""A JPEG's entropy-coded scan data checked by decoding it with libjpeg-turbo in strict mode.

libjpeg does not fail on scan data cut short or damaged: it warns (``Corrupt JPEG data: premature
end of data segment``) and fills the lost blocks with grey, and OpenCV, Pillow, imagecodecs and
pylibjpeg hand those pixels back without a word. The marker walk of
:mod:`packer.read.image_structure` cannot see such a cut where the file still ends with its EOI
marker (FFD9): only the decoder knows how much of the image the scan really codes. simplejpeg
(libjpeg-turbo's TurboJPEG API, with ``strict=True``: stop on any warning) is the one decoder here
that reports it, so it decodes 8-bit JPEGs (:func:`strict_decode`) and checks the JPEG frames of
DICOM files (:func:`check_scan`).

A warning that says pixels were made up (:data:`LOSSY_WARNINGS`) is a :class:`Defect`. Any other
refusal (a warning that loses no pixel, such as ``N extraneous bytes before marker``, or a file
TurboJPEG cannot open: unusual sampling factors, CMYK, 12-bit or lossless JPEG) gives ``None``:
the caller decodes as before, without the check (libjpeg stops at its first warning in strict mode,
so a lost scan after a harmless warning goes unseen there). For a standalone JPEG that caller is
OpenCV, whose libjpeg-turbo (not strict) refuses a file it cannot decode at all; a DICOM frame is
decoded by pylibjpeg's libjpeg, which decodes some of those anyway (a damaged Huffman table segment:
wrong tables, garbage pixels), so :func:`check_scan` asks OpenCV the same question of such a frame.
"""

from __future__ import annotations

import numpy as np
import simplejpeg

from packer.opencv import cv2
from packer.read.image_structure import Defect

#: libjpeg-turbo's warnings (jerror.h, JWRN_*) after which the decoder made pixels up, lower case,
#: with the reason code each gives: the scan ends before the image does (JWRN_HIT_MARKER,
#: JWRN_JPEG_EOF, and JWRN_MUST_RESYNC on the EOI marker FFD9) is ``truncated``; a scan that does
#: not decode (JWRN_HUFF_BAD_CODE, JWRN_ARITH_BAD_CODE, JWRN_MUST_RESYNC on another marker,
#: JWRN_BOGUS_PROGRESSION: a progressive scan refining coefficients never coded) is
#: ``decode_failed``. The rest (an unknown Adobe transform or JFIF revision, extraneous bytes
#: before a marker, a bad ICC marker, too many scanlines) lose no pixel.
LOSSY_WARNINGS = (
    ("premature end of data segment", "truncated"),
    ("premature end of jpeg file", "truncated"),
    ("found marker 0xd9 instead of rst", "truncated"),
    ("instead of rst", "decode_failed"),
    ("bad huffman code", "decode_failed"),
    ("bad arithmetic code", "decode_failed"),
    ("inconsistent progression sequence", "decode_failed"),
)

#: libjpeg-turbo's warnings that lose no pixel (jerror.h: JWRN_EXTRANEOUS_DATA, JWRN_ADOBE_XFORM,
#: JWRN_JFIF_MAJOR, JWRN_BOGUS_ICC, JWRN_TOO_MUCH_DATA, JWRN_NOT_SEQUENTIAL), lower case: strict mode
#: stops at them as at any warning, so :func:`check_stream` decodes such a stream again without it.
HARMLESS_WARNINGS = (
    "extraneous bytes before marker",
    "unknown adobe color transform",
    "unknown jfif revision",
    "bad icc marker",
    "too many scanlines",
    "invalid sos parameters for sequential jpeg",
)

#: TurboJPEG's colour space of a JPEG (decode_jpeg_header) → the output OpenCV's imdecode gives
#: for it (IMREAD_UNCHANGED): grey stays grey, YCbCr and RGB become BGR. CMYK and YCCK are left to
#: OpenCV.
_OUTPUT = {"Gray": "GRAY", "YCbCr": "BGR", "RGB": "BGR"}


def _lost(err: ValueError) -> Defect | None:
    """The Defect for a strict decode's ``err`` whose warning means pixels were made up, else None."""
    text = str(err)
    reason = next((reason for key, reason in LOSSY_WARNINGS if key in text.lower()), None)
    if reason is None:
        return None
    cut = "cut short" if reason == "truncated" else "damaged"
    return Defect(reason, f"JPEG scan data is {cut}: libjpeg-turbo warns \"{text}\" and would fill the lost part "
                          "of the image with grey, which is not packed; copy or export the file again")


def strict_decode(data: bytes) -> np.ndarray | None:
    """The 8-bit JPEG ``data`` decoded as ``cv2.imdecode(..., IMREAD_UNCHANGED)`` decodes it
    (H×W uint8 grey, H×W×3 BGR; not oriented), or None where TurboJPEG cannot open it or stops at a
    warning that loses no pixel (decode it with OpenCV then). Raises Defect where a warning says the
    scan lost pixels (:data:`LOSSY_WARNINGS`)."""
    return _strict(data)[0]


def _strict(data: bytes) -> tuple[np.ndarray | None, str]:
    """:func:`strict_decode`'s image and ``""``, or None and why TurboJPEG did not decode ``data``
    (its message, or the colour space it does not convert)."""
    try:
        space_name = simplejpeg.decode_jpeg_header(data)[2]
        space = _OUTPUT.get(space_name)
        if space is None:
            return None, f"TurboJPEG does not convert {space_name} JPEG data"
        image = simplejpeg.decode_jpeg(data, colorspace=space, strict=True)
    except ValueError as err:
        lost = _lost(err)
        if lost is not None:
            raise lost from err
        return None, str(err)
    return (image.reshape(image.shape[:2]) if space == "GRAY" else image), ""


def check_scan(data: bytes) -> None:
    """Raise Defect where the JPEG codestream ``data`` (a DICOM frame) loses pixels in its scan
    (:data:`LOSSY_WARNINGS`), or does not decode at all: where strict mode stops at a warning that
    loses no pixel, or TurboJPEG does not open the frame, libjpeg-turbo decodes it without strict
    mode through OpenCV, as a standalone JPEG is decoded (:func:`strict_decode`'s caller), and a
    frame OpenCV refuses is ``decode_failed``. Extraneous bytes between two whole segments, which
    some writers leave, decode so and pass; extraneous bytes because a segment (a Huffman table,
    say) lost bytes and no longer ends where its length says do not, where pylibjpeg's libjpeg
    decodes the frame with the wrong tables. A check only: the pixels decoded here are thrown
    away."""
    image, stopped = _strict(data)
    if image is not None or _opencv_decodes(data):
        return
    # libjpeg's "N extraneous bytes before marker" on a frame that then does not decode: bytes a
    # segment's length leaves out, or a segment that lost bytes and runs into the next one
    damage = (" (a marker segment is damaged: one, a Huffman or quantisation table say, that does not end where its "
              "length says gives wrong tables)") if "extraneous bytes" in stopped.lower() else ""
    raise Defect("decode_failed", f"JPEG data does not decode: libjpeg-turbo stops with \"{stopped}\" and fails "
                                  f"without strict mode too, as OpenCV does on the same bytes as a .jpg{damage}, "
                                  "which is not packed; copy or export the file again")


def _opencv_decodes(data: bytes) -> bool:
    """Whether OpenCV (libjpeg-turbo, not strict) decodes the JPEG ``data``, its log silenced."""
    before = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) is not None
    except cv2.error as err:
        if getattr(err, "code", None) == cv2.Error.StsNoMem:  # the machine is short of memory, not the file
            raise MemoryError(f"OpenCV: {str(err).strip()}") from err
        return False
    finally:
        cv2.utils.logging.setLogLevel(before)


def check_stream(data: bytes) -> None:
    """Raise Defect where the JPEG stream ``data`` (a JPEG-in-TIFF tile or strip, its tables
    spliced in) does not decode whole: a warning that loses pixels (:data:`LOSSY_WARNINGS`), or
    an error that stops libjpeg-turbo mid-scan (``Unsupported marker type``: libtiff stops the
    same way, and OpenCV returns the page with the rest of the tile grey), ``decode_failed``. A
    stream whose header TurboJPEG cannot read, or of a colour space it does not convert (12-bit,
    CMYK), is not checked, as in :func:`strict_decode`. A check only: the pixels are thrown away
    (decoded with the fast DCT and upsampling, which change no warning)."""
    try:
        space = _OUTPUT.get(simplejpeg.decode_jpeg_header(data)[2])
    except ValueError:
        return
    if space is None:
        return
    try:
        simplejpeg.decode_jpeg(data, colorspace=space, strict=True, fastdct=True, fastupsample=True)
        return
    except ValueError as err:
        lost = _lost(err)
        if lost is not None:
            raise lost from err
        stopped = err
    text = str(stopped).lower()
    if "data precision" in text:  # a 12-bit stream TurboJPEG's header reader took: not damage
        raise Defect("unsupported", f"JPEG data of another precision than 8 bits (libjpeg-turbo: \"{stopped}\"), "
                                    "which neither this check nor OpenCV's libtiff decodes: re-save the TIFF with "
                                    "Deflate or LZW (16-bit), or as 8-bit JPEG") from stopped
    if not any(key in text for key in HARMLESS_WARNINGS):  # an error that stops libjpeg mid-scan
        raise _undecodable(stopped)
    try:  # a warning that loses no pixel stopped strict mode: the rest of the stream decoded without it
        simplejpeg.decode_jpeg(data, colorspace=space, strict=False, fastdct=True, fastupsample=True)
    except ValueError as err:
        lost = _lost(err)
        raise (lost if lost is not None else _undecodable(err)) from err


def _undecodable(err: ValueError) -> Defect:
    return Defect("decode_failed", f"JPEG data does not decode: libjpeg-turbo stops with \"{err}\", where libtiff "
                                   "fills the rest of the tile with grey, which is not packed; copy or export the "
                                   "file again")
