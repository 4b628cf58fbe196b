"""Segmentation masks: decode a mask file, check it against its image, and give it exactly the
geometry the image transforms give their image (pure array functions).

A mask is a grid of class ids (non-negative integers) drawn on the image's *stored* pixel grid:
mask pixel (r, c) labels stored image pixel (r, c). It follows its image step for step, but is
never windowed or colour-converted and is resized with nearest-neighbour
(``cv2.INTER_NEAREST_EXACT``, centre-aligned like the image's AREA/LINEAR resize, see
:mod:`packer.transform.resize`), so no new class id ever appears:

- :func:`transform_mask_image` mirrors :func:`packer.transform.image.transform_image`:
  orientation, resize (size and policy), tiles.
- :func:`transform_mask_dicom` mirrors the geometry of :func:`packer.transform.dicom.finish_image`:
  resample to a pixel spacing, then resize.

Defects of a mask raise :class:`MaskError` with a reason code (:data:`MASK_REASONS`).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from packer.config import ImageTransformConfig
from packer.opencv import cv2
from packer.transform.dicom import spacing_size
from packer.transform.image import OPENCV_SCALED_TIFF_BITS, opencv_misreads_planar_tiff, orient_image, tile_origins
from packer.transform.resize import POLICIES, resize_image, resize_plan
from packer.transform.tiff_strips import (
    STRIP_TAGS,
    TIFF_CHECKED_ALWAYS,
    TIFF_CHECKED_ON_ZERO,
    TIFF_NEW_SUBFILE_TYPE,
    Tags,
    page_indices,
    strip_problem,
)

#: Reason codes of :class:`MaskError`: the file cannot be decoded as a mask, its values are not
#: (declared) class ids, or its shape is not its image's.
MASK_REASONS = ("mask_unreadable", "mask_values", "mask_size")
#: Largest class id: packed masks are uint8, or uint16 when an id exceeds 255.
MAX_CLASS_ID = 65535

_PNG = b"\x89PNG\r\n\x1a\n"
_TIFF = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
_NPY = b"\x93NUMPY"
_JPEG = b"\xff\xd8\xff"
_TIFF_ORIENTATION = 0x0112
_TIFF_BITS = 0x0102  # BitsPerSample
_TIFF_PHOTOMETRIC = 0x0106  # PhotometricInterpretation: 0 WhiteIsZero, 1 BlackIsZero, 3 Palette
_TIFF_SAMPLES, _TIFF_PLANAR = 0x0115, 0x011C  # SamplesPerPixel; PlanarConfiguration (2: one plane per sample)
_TIFF_INTEGERS = {3: "H", 4: "I", 16: "Q"}  # SHORT, LONG, LONG8: the types of the strip tags
_TIFF_COMPRESSION = 0x0103
#: TIFF Compression (259) values a mask page may not be stored in, each one's name: JPEG (7, and
#: old-style 6; DNG's lossy JPEG) is lossy, as a ``.jpg`` mask is, and invents class ids along every
#: edge (quality 75 turns ids 0-2 into 0-4); WebP, JPEG XL, JPEG 2000 and JPEG XR are lossy unless
#: written in a lossless mode that the tags do not record (:data:`_MAYBE_LOSSLESS`), so a page in one
#: of them cannot be told lossless without decoding it against the original, and is refused as well.
LOSSY_TIFF_COMPRESSIONS = {
    6: "old-style JPEG", 7: "JPEG", 34892: "DNG lossy JPEG", 50001: "WebP", 34927: "WebP (its draft code)",
    50002: "JPEG XL", 52546: "DNG JPEG XL", 33003: "Aperio YCbCr JPEG 2000", 33004: "lossy JPEG 2000",
    33005: "Aperio RGB JPEG 2000", 34712: "JPEG 2000", 34934: "JPEG XR", 22610: "Hamamatsu NDPI JPEG XR",
}
_MAYBE_LOSSLESS = frozenset({50001, 34927, 50002, 52546, 34712, 34934, 22610})
_SHOWN_IDS = 10
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
#: Each Orientation value that swaps an image's axes (5-8): how a viewer shows the stored pixels, and what
#: turns a mask drawn on that display back onto them (undoes :func:`~packer.transform.image.orient_image`).
_TRANSPOSING = {5: ("transposed", "transpose it (mask.T)"),
                6: ("turned 90° clockwise", "rotate it 90° counter-clockwise (numpy.rot90(mask))"),
                7: ("transposed across the other diagonal", "transpose it across the other diagonal "
                                                           "(numpy.rot90(mask, 2).T)"),
                8: ("turned 90° counter-clockwise", "rotate it 90° clockwise (numpy.rot90(mask, -1))")}


class MaskError(Exception):
    """A defect of one mask: ``reason`` is one of :data:`MASK_REASONS`, ``message`` says what,
    where and how to fix it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def decode_mask(data: bytes, name: str) -> np.ndarray:
    """The bytes of a mask file → its class ids: an integer array H×W, or F×H×W for a multi-page
    TIFF or a 3-D ``.npy`` (frames first). ``name`` is only used in messages.

    The format comes from the file's signature: PNG and TIFF (any page count) are decoded by
    OpenCV unchanged (16-bit values kept; a 1-, 2- or 4-bit grey PNG's stored ids, which OpenCV
    scales to 8 bits; a palette PNG's indices by Pillow, since OpenCV expands them to colours)
    and *never oriented*: a TIFF's Orientation tag is
    ignored, since the mask labels the image's stored grid and follows the image's orientation
    later (:func:`transform_mask_image`). ``.npy`` is loaded without pickles. A 3-channel image
    whose channels are equal counts as one channel; an opaque alpha channel is dropped.
    The dtype is the file's (uint8/uint16 for images; floats become int64).

    Raises :class:`MaskError`: ``mask_unreadable`` (not PNG/TIFF/NPY, or undecodable),
    ``mask_values`` (colour, transparent, negative, non-integer or non-finite values, ids above
    65535), ``mask_size`` (not 2-D or 3-D, or TIFF pages of different sizes).
    """
    head = bytes(data[:8])
    if head.startswith(_PNG):
        _refuse_animated(data, name)
    if head.startswith(_NPY):
        mask = _load_npy(data, name)
    elif head.startswith(_PNG) and bytes(data[12:16]) == b"IHDR" and len(data) > 25 and data[25] == 3:
        mask = _palette_indices(data, name)
    elif head.startswith(_PNG):
        decoded = _imdecode(data, name, "PNG")
        if len(data) > 25 and data[25] in (0, 2) and decoded.ndim == 3 and decoded.shape[2] in (2, 4):
            # grey or RGB (colour types 0, 2) hold no alpha: OpenCV made one of a tRNS colour key, which a
            # grey mask's decode ignores; the ids are the stored values either way
            decoded = decoded[:, :, :-1]
        mask = _one_channel(decoded, name)
        if len(data) > 25 and data[25] == 0 and data[24] < 8:  # 1-, 2- or 4-bit grey: libpng scales to 8 bits
            mask = mask // (255 // ((1 << data[24]) - 1))  # back to the stored ids (a 1-bit mask's 255 is id 1)
    elif head[:4] in _TIFF:
        pages = _decode_tiff(data, name)
        if len({page.shape for page in pages}) > 1:
            listed = ", ".join(f"{page.shape[0]}×{page.shape[1]}" for page in pages)
            raise MaskError("mask_size", f"{name}: the TIFF mask's pages have different sizes ({listed}); every "
                                         "page labels one frame of the same image, so all must have its size")
        mask = pages[0] if len(pages) == 1 else np.stack(pages)
    elif head.startswith(_JPEG):
        raise MaskError("mask_unreadable", f"{name}: a JPEG mask; JPEG is lossy and invents class ids along every "
                                           "edge; save masks as PNG, TIFF or .npy")
    else:
        raise MaskError("mask_unreadable", f"{name}: not a PNG, TIFF or .npy file (starts with {head.hex()}); "
                                           "save masks as single-channel PNG, TIFF or .npy")
    return _class_ids(mask, name)


#: JPEG start-of-frame markers of the lossless process (ITU T.81: SOF3, and SOF7, SOF11, SOF15
#: differential or arithmetic): a Compression 7 page whose stream starts such a frame (tifffile's
#: ``compressionargs={"lossless": True}``, DNG's raw data) holds the ids exactly
_LOSSLESS_SOF = frozenset({0xC3, 0xC7, 0xCB, 0xCF})
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG and DAC share the range


def lossless_jpeg_page(data: bytes, tags: Mapping[int, Sequence[Any]]) -> int:
    """The sample precision (bits) of a TIFF page (``tags``, its IFD's values) of Compression 7
    whose first strip or tile is lossless JPEG, by the frame marker its stream starts (read from
    ``data``, the file); 0 where it is not, never a guess (a marker not found, or a damaged stream,
    is lossy)."""
    offsets, counts = tags.get(273) or tags.get(324), tags.get(279) or tags.get(325)
    if not offsets or not counts:
        return 0
    start, size = int(offsets[0]), int(counts[0])
    stream = bytes(data[start:start + min(size, 1 << 16)])
    if not stream.startswith(b"\xff\xd8"):
        return 0
    at = 2
    while at + 5 <= len(stream) and stream[at] == 0xFF:
        marker = stream[at + 1]
        if marker in _SOF:
            return stream[at + 4] if marker in _LOSSLESS_SOF else 0
        if marker == 0xDA:  # a scan before any frame: no frame to tell
            return 0
        at += 2 + int.from_bytes(stream[at + 2:at + 4], "big")
    return 0


def check_lossless_tiff(compressions: Sequence[int], name: str, lossless: Sequence[int] = ()) -> None:
    """Raise MaskError ``mask_unreadable`` for the first page of a TIFF mask whose Compression
    (``compressions``, one per page, in order: its main chain's IFDs less the reduced-resolution
    ones, :func:`~packer.transform.tiff_strips.page_indices`, as a thumbnail is no page) is lossy or may be
    (:data:`LOSSY_TIFF_COMPRESSIONS`), naming ``name``, the page, the compression and the fix,
    as a ``.jpg`` mask is refused: its pixels would pack with class ids nobody drew. ``lossless``
    (per page, where given, :func:`lossless_jpeg_page`): a JPEG page whose stream is 8-bit lossless
    JPEG is no such page; one of more bits is refused, as OpenCV's 8-bit libjpeg cannot decode it."""
    for page, number in enumerate(compressions):
        label = LOSSY_TIFF_COMPRESSIONS.get(number)
        bits = lossless[page] if number == 7 and page < len(lossless) else 0
        if label is None or 0 < bits <= 8:
            continue
        if bits:
            raise MaskError("mask_unreadable", (
                f"{name} page {page}: a TIFF mask in {bits}-bit lossless JPEG (Compression 7), which OpenCV's "
                "libtiff (8-bit JPEG only) does not decode; save the mask as a 16-bit PNG or as a TIFF with LZW, "
                "Deflate or no compression (or as .npy)"))
        lossy = ("which is lossy unless written in its lossless mode (the TIFF's tags do not say which), and "
                 "lossy compression invents" if number in _MAYBE_LOSSLESS else
                 f"{'JPEG 2000' if 'JPEG 2000' in label else 'JPEG'} is lossy and invents")
        raise MaskError("mask_unreadable", (
            f"{name} page {page}: a TIFF mask compressed with {label} (Compression {number}); {lossy} class ids "
            "along every edge; save the mask as PNG or as a TIFF with LZW, Deflate or no compression (or as .npy)"))


def decode_mask_pages(data: bytes, name: str) -> list[np.ndarray]:
    """The bytes of a mask file → one H×W array of class ids per frame, each of its own size: a
    TIFF's pages (which :func:`decode_mask` refuses where their sizes differ), a 3-D ``.npy``'s
    frames, or the one 2-D grid. For an image whose pages differ in size, each page's mask is
    checked against its own page. Decoded and checked as :func:`decode_mask` does; raises
    :class:`MaskError`."""
    if bytes(data[:4]) in _TIFF:
        return [_class_ids(page, f"{name} page {number}") for number, page in enumerate(_decode_tiff(data, name))]
    mask = decode_mask(data, name)
    return [mask] if mask.ndim == 2 else list(mask)


def check_mask(mask: np.ndarray, *, height: int, width: int, frames: int,
               classes: Sequence[int] | None, orientation: int = 1) -> np.ndarray:
    """Check a decoded mask (H×W or F×H×W) against its image *before* any transform and return it
    as F×H×W (F = 1 for a single frame), C-contiguous, uint8, or uint16 when an id can exceed
    255 (the largest declared id when ``classes`` is given, else the mask's largest value).

    ``height``/``width`` are the image's stored size (before orientation), ``frames`` its frame
    or page count. ``classes``: the declared class ids, or ``None`` to accept any id.
    ``orientation``: the image file's Orientation value (1-8), for the message only: a mask of the
    image's displayed size is told so (:func:`displayed_size_fix`).

    Raises :class:`MaskError`: ``mask_size`` when the frames, height or width differ from the
    image's (the message gives both), ``mask_values`` for an id not in ``classes`` (the first
    10 such ids are named) or a value that is no class id. Raises ValueError when ``classes``
    holds an id outside 0-65535 (a defect of the job, not of the mask).
    """
    stack = mask[None] if mask.ndim == 2 else mask
    if stack.ndim != 3 or stack.shape != (frames, height, width):
        got = "×".join(str(n) for n in mask.shape)
        last = _last_axis(mask, height=height, width=width, frames=frames)
        if last:
            raise MaskError("mask_size", f"mask is {got}, {last}")
        shown = displayed_size_fix(mask.shape[-2:], height=height, width=width, orientation=orientation)
        if shown and stack.ndim == 3 and stack.shape[0] == frames:
            raise MaskError("mask_size", f"mask is {got} ({'frames×' if mask.ndim == 3 else ''}height×width) but "
                                         f"its image {frames}×{height}×{width} as stored; {shown}")
        raise MaskError("mask_size", f"mask is {got} ({'frames×' if mask.ndim == 3 else ''}height×width) but its "
                                     f"image is {frames}×{height}×{width} (frames×height×width, as stored, before "
                                     "orientation and resize); a mask must label the image's pixels one to one")
    stack = _class_ids(stack, "mask")
    if classes is not None:
        declared = np.unique(np.asarray(classes, dtype=np.int64))
        if declared.size and (declared[0] < 0 or declared[-1] > MAX_CLASS_ID):
            raise ValueError(f"class ids must be in 0-{MAX_CLASS_ID}, got {declared.tolist()}")
        found = np.unique(stack)
        extra = np.setdiff1d(found, declared, assume_unique=True)
        if extra.size:
            shown = ", ".join(str(v) for v in extra[:_SHOWN_IDS].tolist())
            more = f" and {extra.size - _SHOWN_IDS} more" if extra.size > _SHOWN_IDS else ""
            raise MaskError("mask_values", f"mask holds class ids {shown}{more}, which are not declared "
                                           f"(declared: {_listed(declared)}); declare them or fix the mask")
        peak = int(declared[-1]) if declared.size else 0
    else:
        peak = int(stack.max()) if stack.size else 0
    return np.ascontiguousarray(stack, dtype=np.uint8 if peak <= 255 else np.uint16)


def displayed_size_fix(mask_size: Sequence[int], *, height: int, width: int, orientation: int) -> str:
    """Where the image (``height``×``width`` as stored) carries an Orientation that swaps its axes
    (5-8) and the mask's (height, width) ``mask_size`` is the image's displayed size (``width``×
    ``height``): that the mask was drawn on the displayed image, and the fix; else "". A mask
    labels the stored pixels (README), which "save it at the image's size" did not tell a user who
    had saved it at the size every viewer shows."""
    if orientation not in _TRANSPOSING or tuple(mask_size) != (width, height) or height == width:
        return ""
    shown, undo = _TRANSPOSING[orientation]
    return (f"the image carries EXIF Orientation {orientation} (viewers show it {shown}, {width}×{height}), and the "
            "mask has that displayed size: it was drawn on the displayed image, but a mask labels the image's "
            f"stored pixels; {undo} to save it on the stored grid, or strip the image's orientation (save the "
            "image upright, Orientation 1) to keep the mask as it is")


def _last_axis(mask: np.ndarray, *, height: int, width: int, frames: int) -> str:
    """What a 3-D ``mask`` of ``height``×``width``×N is, and its fix, where the image is
    ``frames``×``height``×``width`` and N is not a frame count that fits (else ""): a channels-last
    label map (H×W×1, or N equal channels), a colour mask, or a multi-frame image's frames saved
    last. Read as frames first, it was "40 frames of 60×1"."""
    if mask.ndim != 3 or mask.shape[:2] != (height, width) or mask.shape == (frames, height, width):
        return ""
    count = int(mask.shape[2])
    grid = f"the image's {height}×{width} (height×width, as stored, before orientation and resize)"
    if frames > 1 and count == frames:
        return (f"height×width×frames (frames last) on {grid}, of {frames} frames; masks are frames first "
                "(F×H×W): save numpy.moveaxis(mask, -1, 0)")
    said = f"height×width×channels (channels last) on {grid}; a mask is one label map of class ids"
    if count == 1:
        return f"{said}: drop the last axis (save mask[:, :, 0], or numpy.squeeze(mask, -1))"
    if bool((mask == mask[:, :, :1]).all()):
        return f"{said}: keep one of its {count} equal channels (save mask[:, :, 0])"
    return (f"{said}, and its {count} channels differ: a colour mask is not a label map: map each colour to its "
            "class id and save that H×W array")


def transform_mask_image(mask: np.ndarray, cfg: ImageTransformConfig, orientation: int = 1,
                         pad_value: int = 0) -> list[np.ndarray]:
    """An H×W mask (uint8 or uint16 class ids) → one 1×H'×W' array per output of
    :func:`packer.transform.image.transform_image` ``(image, cfg, orientation)``, same dtype,
    C-contiguous: the same orientation, the same ``cfg.size`` and ``cfg.resize`` policy (nearest
    neighbour; ``fit`` pads with ``pad_value``), the same tiles in the same (row-major) order.

    ``orientation`` is the image file's Orientation value (1-8), whether or not OpenCV applied
    it to the image while decoding: the mask labels the stored grid. Raises ValueError when
    ``mask`` is not 2-D or ``cfg.resize`` is unknown.
    """
    if mask.ndim != 2:
        raise ValueError(f"transform_mask_image expects an H×W mask, got shape {mask.shape}")
    out = orient_image(mask, orientation)[:, :, None]
    if cfg.size:
        out = resize_image(np.ascontiguousarray(out), cfg.size, cfg.resize, pad_value=pad_value,
                           interpolation="nearest")
    if cfg.tile_size is None:
        return [np.ascontiguousarray(out.transpose(2, 0, 1))]
    th, tw = cfg.tile_size
    return [np.ascontiguousarray(out[r:r + th, c:c + tw].transpose(2, 0, 1))
            for r, c in tile_origins(out.shape[0], out.shape[1], cfg.tile_size, cfg.tile_stride)]


def transform_mask_dicom(mask: np.ndarray, *, pixel_spacing: tuple[float, float] | None,
                         spacing: tuple[float, float] | None, size: tuple[int, int] | None,
                         policy: str, pad_value: int = 0) -> np.ndarray:
    """One frame's H×W mask → 1×H'×W' (same dtype, C-contiguous) with the geometry
    :func:`packer.transform.dicom.finish_image` gives that frame: resampled from ``pixel_spacing``
    to ``spacing`` (row, column mm; when both are given) to :func:`spacing_size`, then resized to
    ``size`` under ``policy`` (``fit`` pads with ``pad_value``), nearest neighbour.

    When both steps apply, the mask is not resized twice (two nearest steps round twice and
    can put an edge half an intermediate pixel off the image's): each output pixel takes the
    source pixel under its centre through both steps at once (:func:`_through`).

    Raises ValueError when ``mask`` is not 2-D or ``policy`` is unknown.
    """
    if mask.ndim != 2:
        raise ValueError(f"transform_mask_dicom expects an H×W mask, got shape {mask.shape}")
    out = np.ascontiguousarray(mask)[:, :, None]
    resampled = (spacing_size(out.shape[0], out.shape[1], pixel_spacing, spacing)
                 if spacing is not None and pixel_spacing is not None else None)
    if resampled is not None and size is not None:
        if policy not in POLICIES:
            raise ValueError(f"unknown resize policy {policy!r}; expected one of {POLICIES}")
        scaled, offset = resize_plan(resampled, size, policy)
        rows, cols = (_through(n0, n1, n2, o, want) for n0, n1, n2, o, want in
                      zip(mask.shape, resampled, scaled, offset, size, strict=True))
        picked = mask[np.clip(rows, 0, None)[:, None], np.clip(cols, 0, None)[None, :]]
        picked[(rows < 0)[:, None] | (cols < 0)[None, :]] = pad_value
        return np.ascontiguousarray(picked[None])
    if resampled is not None:
        out = resize_image(out, resampled, "stretch", interpolation="nearest")
    if size is not None:
        out = resize_image(out, size, policy, pad_value=pad_value, interpolation="nearest")
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def _through(source: int, middle: int, scaled: int, offset: int, out: int) -> np.ndarray:
    """For each of ``out`` output pixels along one axis, the source pixel under its centre when
    ``source`` pixels are resampled to ``middle``, then scaled to ``scaled`` and placed at
    ``offset`` (:func:`~packer.transform.resize.resize_plan`); -1 where it falls outside (padding).
    Both steps are centre-aligned, as the image's AREA/LINEAR resizes are, so the composite is
    ``floor((j + 0.5) · middle/scaled · source/middle)`` for scaled pixel ``j``."""
    j = np.arange(out) - offset
    index = np.floor((j + 0.5) * (middle / scaled) * (source / middle)).astype(np.int64)
    index = np.minimum(index, source - 1)
    index[(j < 0) | (j >= scaled)] = -1
    return index


def _listed(ids: np.ndarray) -> str:
    shown = ", ".join(str(v) for v in ids[:_SHOWN_IDS].tolist())
    return shown + (f", … ({ids.size} ids)" if ids.size > _SHOWN_IDS else "") if ids.size else "none"


def _imdecode(data: bytes, name: str, fmt: str) -> np.ndarray:
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as err:
        raise MaskError("mask_unreadable", f"{name}: OpenCV could not decode this {fmt} mask: {err}") from err
    if image is None:
        raise MaskError("mask_unreadable", f"{name}: OpenCV could not decode this {fmt} mask; re-export it")
    return image


def _palette_indices(data: bytes, name: str) -> np.ndarray:
    """A palette PNG mask's stored indices, H×W uint8: its class ids (Pascal VOC's masks, and
    what PIL and torchvision read from them). OpenCV expands the palette to colours, which made
    a colour palette a refused "colour mask" and a grey one (id k shown as grey 100·k) pack its
    grey levels as ids. Pillow reads the indices."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode != "P":
                raise MaskError("mask_unreadable", f"{name}: a palette PNG mask that reads as mode {image.mode!r}, "
                                                   "not indices; save it as a single-channel (grey) PNG")
            return np.asarray(image, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError) as err:
        raise MaskError("mask_unreadable", f"{name}: the palette PNG mask could not be decoded ({err}); "
                                           "re-export it") from err


def _decode_tiff(data: bytes, name: str) -> list[np.ndarray]:
    """Every page of a TIFF mask, H×W each (each of its own size), in stored order; reduced-resolution
    IFDs (thumbnails, pyramid levels) are no pages (:func:`_full_pages`)."""
    try:
        unoriented, bits, photometric, separate, chain = _unoriented_tiff(data)
        # the checks below judge the pages alone: a thumbnail (a JPEG preview, as viewers and
        # scanners write one) is decoded with them but left out (_full_pages), so its compression,
        # strips and layout are no page's; a refused page is numbered among the pages
        pages_tags = _page_tags(chain)
        # a lossy page (JPEG inside the TIFF) decodes, with ids nobody drew: refused as a .jpg mask is
        check_lossless_tiff([(tags.get(_TIFF_COMPRESSION) or (1,))[0] for tags in pages_tags], name,
                            [lossless_jpeg_page(data, tags) for tags in pages_tags])
        # the compressed strips that libtiff pads with zero rows where they run out: Deflate's
        # before every decode; LZW's and PackBits' (slower to check) where the padding could not
        # be told from the ids: a palette or WhiteIsZero page, whose zeros are not id 0, or a
        # page that holds a 0 (below)
        _check_strips(data, pages_tags, name, TIFF_CHECKED_ALWAYS if photometric in (1, 2) else
                      TIFF_CHECKED_ALWAYS | TIFF_CHECKED_ON_ZERO)
        if separate is not None:
            page, wide, samples = separate
            raise MaskError("mask_unreadable", (
                f"{name} page {page}: a {wide}-bit TIFF mask whose {samples} samples per pixel are stored as "
                "separate planes (PlanarConfiguration 2), which OpenCV (packer's decoder) reads as if they were "
                "interleaved, giving wrong ids; save the mask as a single-channel (grey) TIFF or PNG, or as .npy"))
        if photometric == 3:  # palette: the stored indices are the ids (OpenCV expands them to colours)
            return _palette_tiff_indices(unoriented, name, chain)
        ok, decoded = cv2.imdecodemulti(np.frombuffer(unoriented, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as err:
        raise MaskError("mask_unreadable", f"{name}: OpenCV could not decode this TIFF mask: {err}") from err
    if not ok or not decoded:
        raise MaskError("mask_unreadable", f"{name}: OpenCV could not decode this TIFF mask; re-export it")
    pages = _full_pages(list(decoded), chain, name)
    if bits > 8 and any(page.dtype.itemsize == 1 for page in pages):
        # libtiff's RGBA interface, which OpenCV falls back on for layouts it does not read itself (a
        # grey+alpha page), gives 8 bits: ids 300 and 2 would pack as 1 and 0
        raise MaskError("mask_unreadable", f"{name}: a {bits}-bit TIFF mask that OpenCV (packer's decoder) reads "
                                           "only at 8 bits, which changes its ids; save it as a single-channel "
                                           "(grey) TIFF or PNG, or as .npy")
    if photometric in (1, 2) and not all(page.all() for page in pages):
        _check_strips(data, pages_tags, name, TIFF_CHECKED_ON_ZERO)
    planes = [_one_channel(page, f"{name} page {i}") for i, page in enumerate(pages)]
    if photometric == 0:  # WhiteIsZero: the ids are the stored values, which libtiff (under OpenCV) inverts
        # for display only where it reads a page at 8 bits or fewer; a 10- to 16-bit page comes back as stored
        planes = [np.iinfo(plane.dtype).max - plane if plane.dtype == np.uint8 else plane for plane in planes]
    shift = OPENCV_SCALED_TIFF_BITS.get(bits, 0)
    if shift:  # OpenCV scales 10-, 12- and 14-bit samples to 16 bits: ids 1, 2 came back as 16, 32
        planes = [plane >> shift if plane.dtype == np.uint16 else plane for plane in planes]
    if bits == 1:  # a bilevel page: OpenCV gives 0/255 for the stored 0/1
        planes = [(plane > 0).astype(np.uint8) if plane.dtype == np.uint8 else plane for plane in planes]
    return planes


def _page_tags(chain: list[Tags]) -> list[Tags]:
    """The tags of the IFDs of ``chain`` that are pages (:func:`~packer.transform.tiff_strips.page_indices`,
    the rule :func:`_full_pages` keeps the decoded images by), in order: what the mask decoder's
    per-page checks (compression, strips) judge, so a thumbnail's are never a page's."""
    return [chain[index] for index in page_indices(chain)]


def _full_pages(decoded: list[np.ndarray], chain: list[Tags], name: str) -> list[np.ndarray]:
    """The pages of ``decoded`` (one image per IFD of ``chain``, as OpenCV and Pillow give them):
    its reduced-resolution IFDs (thumbnails, pyramid levels) left out by the rule the image
    reader chooses an image's pages by (:func:`~packer.transform.tiff_strips.page_indices`), so
    a mask saved as its image was, a thumbnail beside each, has a page for each of the image's.
    Raises MaskError ``mask_unreadable`` where some IFD is reduced but the decoder gave another
    number of images than the chain has IFDs: which image is which page cannot be told."""
    keep = page_indices(chain)
    if len(keep) == len(chain):
        return decoded
    if len(decoded) != len(chain):
        raise _pages_untold(name, "OpenCV", len(decoded), len(chain))
    return [decoded[index] for index in keep]


def _pages_untold(name: str, decoder: str, images: int, ifds: int) -> MaskError:
    """The error for a TIFF mask with reduced-resolution IFDs of which ``decoder`` sees another
    number of images (``images``) than its main chain has IFDs (``ifds``)."""
    return MaskError("mask_unreadable", (
        f"{name}: the TIFF mask holds reduced-resolution IFDs (thumbnails or pyramid levels, which are no pages) "
        f"but {decoder} decoded {images} images from its {ifds} IFDs, so its pages cannot be told from "
        "them; save the mask without thumbnails (one IFD a page), or as PNG or .npy"))


def _unoriented_tiff(data: bytes) -> tuple[bytes, int, int, tuple[int, int, int] | None, list[Tags]]:
    """``data`` with every main-chain IFD's Orientation (0x0112) set to 1 (as stored), the first
    page's BitsPerSample (0x0102, where held inline; 1, the TIFF default, where absent; 0 where
    the walk cannot tell) and PhotometricInterpretation (0x0106; -1 where the walk cannot tell):
    the first IFD's that is a page (:func:`~packer.transform.tiff_strips.page_indices`), not a
    thumbnail's before it, whose 8-bit grey would unmap a bilevel page's 0/255 or keep libtiff's
    inversion of a WhiteIsZero page,
    and (page, bits, samples) of the first page (numbered among the pages, by the same rule) that
    stores more than one sample of more than 8 bits as separate planes (PlanarConfiguration 2),
    which OpenCV 5 decodes as if they were interleaved (None where none does; a thumbnail in that
    layout is decoded wrong, but left out), and each IFD's :data:`~packer.transform.tiff_strips.STRIP_TAGS`
    (what :func:`~packer.transform.tiff_strips.strip_problem` checks its strips with) and its
    NewSubfileType (which IFDs are pages: :func:`_full_pages`).

    OpenCV 5 applies a TIFF's Orientation while decoding, even with IMREAD_UNCHANGED or
    IMREAD_IGNORE_ORIENTATION; rewriting the tag is the one way to get the stored grid whatever
    the OpenCV version. Anything the walk cannot follow is left as it is, for OpenCV to judge.
    """
    out = bytearray(data)
    order = "<" if out[:2] == b"II" else ">"
    big = out[2:4] in (b"+\x00", b"\x00+")
    count_fmt, entry_size, offset_fmt = ("Q", 20, "Q") if big else ("H", 12, "I")
    count_size, offset_size = struct.calcsize(count_fmt), struct.calcsize(offset_fmt)
    offset = struct.unpack_from(order + offset_fmt, out, 8 if big else 4)[0] if len(out) >= (16 if big else 8) else 0
    seen: set[int] = set()
    bits: list[int] = []  # each IFD's, as the docstring says
    photometric: list[int] = []
    planes: list[tuple[int, int] | None] = []  # each IFD's (bits, samples) where OpenCV misreads its planes
    chain: list[Tags] = []
    while offset and offset not in seen and offset + count_size <= len(out):
        seen.add(offset)
        entries = int(struct.unpack_from(order + count_fmt, out, offset)[0])
        first, end = offset + count_size, offset + count_size + entries * entry_size
        if end + offset_size > len(out):
            break
        # BitsPerSample absent: the TIFF default, a bilevel image (as Pillow writes mode "1")
        bits.append(0 if any(struct.unpack_from(order + "H", out, at)[0] == _TIFF_BITS
                             for at in range(first, end, entry_size)) else 1)
        photometric.append(-1)
        layout = {_TIFF_BITS: 1, _TIFF_SAMPLES: 1, _TIFF_PLANAR: 1}  # this IFD's, the TIFF defaults where absent
        strips: Tags = {}
        for at in range(first, end, entry_size):
            tag, kind = struct.unpack_from(order + "HH", out, at)
            if (tag in STRIP_TAGS or tag == TIFF_NEW_SUBFILE_TYPE) and kind in _TIFF_INTEGERS:
                strips[tag] = _values(out, order, at, kind, offset_fmt, offset_size)
            if tag in layout and kind == 3:
                layout[tag] = _first_short(out, order, at, offset_fmt, offset_size)
            if tag == _TIFF_ORIENTATION and kind == 3:  # SHORT: the value sits inline, first
                struct.pack_into(order + "H", out, at + 4 + offset_size, 1)
            elif tag == _TIFF_BITS and kind == 3:  # held inline
                count = int(struct.unpack_from(order + offset_fmt, out, at + 4)[0])
                if 1 <= count and 2 * count <= offset_size:
                    bits[-1] = int(struct.unpack_from(order + "H", out, at + 4 + offset_size)[0])
            elif tag == _TIFF_PHOTOMETRIC and kind == 3:
                photometric[-1] = int(struct.unpack_from(order + "H", out, at + 4 + offset_size)[0])
        misread = opencv_misreads_planar_tiff(layout[_TIFF_PLANAR], layout[_TIFF_SAMPLES], layout[_TIFF_BITS])
        planes.append((layout[_TIFF_BITS], layout[_TIFF_SAMPLES]) if misread else None)
        chain.append(strips)
        offset = int(struct.unpack_from(order + offset_fmt, out, end)[0])
    if not chain:
        return bytes(out), 0, -1, None, chain
    keep = page_indices(chain)
    separate = next(((number, *planar) for number, index in enumerate(keep) if (planar := planes[index])), None)
    return bytes(out), bits[keep[0]], photometric[keep[0]], separate, chain


def _values(out: bytearray, order: str, at: int, kind: int, offset_fmt: str, offset_size: int) -> tuple[int, ...]:
    """The values of the SHORT, LONG or LONG8 IFD entry at byte ``at``: held inline, or at the
    offset the entry holds; none where they lie past the end of the file."""
    item = _TIFF_INTEGERS[kind]
    count = int(struct.unpack_from(order + offset_fmt, out, at + 4)[0])
    size = count * struct.calcsize(item)
    where = at + 4 + offset_size
    if size > offset_size:
        where = int(struct.unpack_from(order + offset_fmt, out, where)[0])
    if where + size > len(out):
        return ()
    return tuple(int(v) for v in struct.unpack_from(f"{order}{count}{item}", out, where))


def _check_strips(data: bytes, pages: list[Tags], name: str, compressions: frozenset[int]) -> None:
    """Raise MaskError ``mask_unreadable`` where a strip or tile of one of ``pages`` (each page's
    IFD's tags, in order: :func:`_page_tags`, no thumbnail's) compressed with one of
    ``compressions`` does not decode to the rows it holds
    (:func:`~packer.transform.tiff_strips.strip_problem`): libtiff would fill the lost rows with
    zeros, which a mask would pack as background (class 0) that no one drew."""
    for page, tags in enumerate(pages):
        problem = strip_problem(data, tags, compressions)
        if problem:
            raise MaskError("mask_unreadable", f"{name} page {page}: the TIFF mask's {problem}; re-export the mask "
                                               "(or save it as PNG or .npy)")


def _first_short(out: bytearray, order: str, at: int, offset_fmt: str, offset_size: int) -> int:
    """The first value of the SHORT IFD entry at byte ``at``: held inline, or at the offset the
    entry holds where its values do not fit (an RGB page's three BitsPerSample); 0 where that
    lies past the end of the file."""
    count = int(struct.unpack_from(order + offset_fmt, out, at + 4)[0])
    where = at + 4 + offset_size
    if 2 * count > offset_size:
        where = int(struct.unpack_from(order + offset_fmt, out, where)[0])
    return int(struct.unpack_from(order + "H", out, where)[0]) if where + 2 <= len(out) else 0


def _palette_tiff_indices(data: bytes, name: str, chain: list[Tags]) -> list[np.ndarray]:
    """Every page of a palette TIFF mask as its stored indices (H×W each): its
    class ids, as a palette PNG's are (:func:`_palette_indices`); a label image saved with a
    lookup table (Fiji's glasbey) was refused as a colour mask, or a grey one packed its greys.
    The IFDs of ``chain`` (its main chain's tags) that are reduced-resolution (an RGB preview
    saved beside the label image) are no pages and are not read (:func:`_full_pages`' rule):
    their mode is no page's."""
    from PIL import Image, ImageSequence, UnidentifiedImageError

    keep = set(page_indices(chain))
    try:
        with Image.open(io.BytesIO(data)) as image:
            images = int(getattr(image, "n_frames", 1))  # a TIFF image's IFDs (ImageFile does not declare it)
            if len(keep) < len(chain) and images != len(chain):
                raise _pages_untold(name, "Pillow", images, len(chain))
            pages: list[np.ndarray] = []
            for number, page in enumerate(ImageSequence.Iterator(image)):
                if number not in keep:  # a thumbnail or pyramid level
                    continue
                if page.mode != "P":
                    raise MaskError("mask_unreadable", f"{name} page {len(pages)}: a palette TIFF mask page that "
                                                       f"reads as mode {page.mode!r}, not indices; save it as a "
                                                       "single-channel (grey) mask")
                pages.append(np.asarray(page, dtype=np.uint8))
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError) as err:
        raise MaskError("mask_unreadable", f"{name}: the palette TIFF mask could not be decoded ({err}); "
                                           "re-export it") from err
    return pages


def _refuse_animated(data: bytes | memoryview, name: str) -> None:
    """Raise MaskError for an animated PNG (an ``acTL`` chunk of more than one frame, before the
    first IDAT): libpng, OpenCV and Pillow decode its default image alone, so a mask's other
    frames (another class's region, another frame's labels) would vanish unsaid, as an image's
    would (which is ``unsupported``)."""
    pos, size = 8, len(data)
    while pos + 8 <= size:
        length = int.from_bytes(bytes(data[pos:pos + 4]), "big")
        kind = bytes(data[pos + 4:pos + 8])
        if kind in (b"IDAT", b"IEND"):  # acTL comes before the first IDAT (APNG spec)
            return
        if kind == b"acTL" and length >= 8 and (frames := int.from_bytes(bytes(data[pos + 8:pos + 12]), "big")) > 1:
            raise MaskError("mask_unreadable", f"{name}: an animated PNG (APNG: an acTL chunk, {frames} frames), of "
                                               "which a decode keeps only the first frame's labels; save the mask "
                                               "as one PNG (or a multi-page TIFF for a multi-frame image)")
        pos += 12 + length


def _one_channel(image: np.ndarray, name: str) -> np.ndarray:
    """A decoded H×W or H×W×C image → H×W: drop an opaque alpha, merge equal colour channels."""
    if image.ndim == 2:
        return image
    if image.shape[2] in (2, 4):
        alpha = image[:, :, -1]
        opaque = np.iinfo(image.dtype).max if image.dtype.kind in "iu" else 1.0
        if not bool((alpha == opaque).all()):  # (OpenCV gives an RGB PNG's tRNS colour key as an alpha too)
            raise MaskError("mask_values", f"{name}: the mask has transparent pixels (an alpha channel, or a PNG "
                                           "tRNS transparency colour); class ids must not depend on transparency; "
                                           "save a single-channel mask")
        image = image[:, :, :-1]
    first = image[:, :, 0]
    if image.shape[2] > 1:
        differ = np.argwhere((image != first[:, :, None]).any(axis=2))
        if differ.size:
            r, c = (int(v) for v in differ[0])
            bgr = image[r, c].tolist()
            raise MaskError("mask_values", f"{name}: a colour mask (pixel row {r}, column {c} is RGB "
                                           f"{bgr[::-1]}); class ids are read from one channel: map each colour "
                                           "to its id and save a single-channel (grey) mask")
    return first


def _load_npy(data: bytes, name: str) -> np.ndarray:
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_HEADERS:  # 3.0 exists only for structured dtypes with non-latin-1 names
            raise ValueError(f"format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
        shape, _, dtype = _NPY_HEADERS[version](stream)
        if dtype.hasobject:  # its data is a pickle, not dtype.itemsize bytes an item: no size to compare
            raise MaskError("mask_unreadable", f"{name}: holds Python objects (a pickle): an object array, as "
                                               "numpy.save writes from a ragged list of arrays; packer does not load "
                                               "pickles: save an integer array (uint8, or uint16 for ids above 255), "
                                               "one H×W or F×H×W label map")
        # np.load allocates the whole array before reading it: a header must not promise more than the file holds
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > len(data):
            raise ValueError(f"its header promises a {'×'.join(map(str, shape))} {dtype} array, more than the "
                             f"file's {len(data)} bytes")
        stream.seek(0)
        return np.asarray(np.load(stream, allow_pickle=False))
    except (ValueError, OSError, EOFError, TypeError) as err:
        raise MaskError("mask_unreadable", f"{name}: not a readable .npy mask: {err}; save it with "
                                           "numpy.save(path, mask) from an integer array") from err


def _class_ids(mask: np.ndarray, name: str) -> np.ndarray:
    """Check that ``mask`` holds class ids (non-negative integers up to 65535, 2-D or 3-D);
    bool becomes uint8, floats int64. Raises MaskError."""
    if mask.ndim not in (2, 3) or mask.size == 0:
        raise MaskError("mask_size", f"{name}: the mask has shape {mask.shape}; expected H×W or F×H×W "
                                     "(frames first), none of them 0")
    if mask.dtype.kind == "b":
        return mask.astype(np.uint8)
    if mask.dtype.kind not in "iuf":
        raise MaskError("mask_values", f"{name}: a {mask.dtype} mask holds no class ids; expected integers")
    if mask.dtype.kind == "f":
        finite = np.isfinite(mask)
        if not bool(finite.all()):
            raise MaskError("mask_values", f"{name}: the mask holds NaN or infinite values; expected class ids")
        fractional = np.argwhere(mask != np.floor(mask))
        if fractional.size:
            where = tuple(int(v) for v in fractional[0])
            raise MaskError("mask_values", f"{name}: the float mask holds non-integer values ({mask[where]!r} at "
                                           f"index {where}); class ids are integers: threshold or round it first")
    low, high = mask.min(), mask.max()
    if low < 0:
        raise MaskError("mask_values", f"{name}: the mask holds negative values (smallest {low!r}); class ids are "
                                       "0 (background) and up")
    if high > MAX_CLASS_ID:
        raise MaskError("mask_values", f"{name}: the mask holds values up to {high!r}; class ids must be at most "
                                       f"{MAX_CLASS_ID} (uint16)")
    return mask.astype(np.int64) if mask.dtype.kind == "f" else mask
