"""Natural-image pixels → training-ready uint8 C×H×W arrays (pure array functions).

:func:`transform_image` runs these steps, in this order, on what OpenCV decoded
(``cv2.IMREAD_UNCHANGED``: H×W or H×W×C in BGR(A) order, uint8, uint16 or float):

1. :func:`orient_image`: apply the EXIF/TIFF Orientation value (1-8, TIFF 6.0 tag 0x0112).
2. :func:`remove_alpha`: ``drop`` the alpha channel, or ``composite`` over white (the dtype's
   full-range maximum: 255, 65535). Done in float32 on the stored scale. Float pixels have no
   white of their own (the window decides what shows white): their alpha (0..1) composites over
   white after step 4, on its [0, 1] scale.
3. :func:`convert_color`: BGR → RGB; ``rgb`` gives 3 channels (grey images are repeated),
   ``gray`` gives 1 channel of luminance 0.299 R + 0.587 G + 0.114 B (``cv2.COLOR_BGR2GRAY``).
   A 3-channel image into ``rgb`` skips this step: its channels are swapped as the output is
   copied to C×H×W (steps 4-6 treat every channel alike, so the bytes are the same).
4. To float32 in [0, 1]: the configured window (:func:`window_center_width`, like DICOM
   LINEAR_EXACT, or :func:`window_percentiles`), else the full range of the stored dtype
   (uint8 / 255, uint16 / 65535: a 16-bit image is *scaled*, not shifted). Float images have
   no full range and need a window. Window values are in stored units (0-65535 for 16-bit,
   0-4095 for a 12-bit TIFF, which OpenCV decodes scaled to 16 bits: the window is scaled too).
   A float image's NaN pixels are then black (0), as −inf is, so the resize blends them as
   black instead of spreading NaN over every output pixel its filter touches.
5. :func:`packer.transform.resize.resize_image` to ``cfg.size`` under ``cfg.resize``
   (``fit`` pads with 0 = black, and the tile records where the image lies: ``Tile.content``).
6. :func:`to_uint8`: ``rint(clip(x, 0, 1) * 255)``.
7. Tiles (``cfg.tile_size``): cut from the resized image, row-major, stride ``cfg.tile_stride``
   (default: the tile size). Only full tiles are kept: a right or bottom margin narrower than a
   tile is dropped, and an image smaller than one tile gives no tile at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isfinite
from typing import Any

import numpy as np

from packer.config import ImageTransformConfig
from packer.errors import ConfigError
from packer.opencv import cv2
from packer.transform.resize import POLICIES, content_box, resize_image

COLORS = ("rgb", "gray")
ALPHA_MODES = ("drop", "composite")


@dataclass(frozen=True)
class Tile:
    """One output array: ``image`` is uint8 C×H×W, C-contiguous; ``origin`` is the tile's
    top-left (row, col) in the resized image, or ``None`` when the image is not tiled;
    ``content``: where the image lies in ``image`` as (top, left, height, width), the rest being
    ``fit``'s padding (a tile of padding alone: (0, 0, 0, 0)), or ``None`` where the image
    fills it (:func:`packer.transform.resize.content_box`)."""

    origin: tuple[int, int] | None
    image: np.ndarray
    content: tuple[int, int, int, int] | None = None


def check_image_config(cfg: ImageTransformConfig) -> None:
    """Raise :class:`ConfigError` naming the ``transform.image`` key when ``cfg`` is unusable.

    A bad config is a defect of the run, not of a sample, so it raises instead of
    becoming an Issue. ``cfg`` is usually schema-validated already; this guards configs
    built in code.
    """
    where = "transform.image"
    if cfg.resize not in POLICIES:
        raise ConfigError(f"{where}.resize: unknown policy {cfg.resize!r}; expected one of {POLICIES}")
    if cfg.color not in COLORS:
        raise ConfigError(f"{where}.color: unknown value {cfg.color!r}; expected one of {COLORS}")
    if cfg.alpha not in ALPHA_MODES:
        raise ConfigError(f"{where}.alpha: unknown value {cfg.alpha!r}; expected one of {ALPHA_MODES}")
    for key, pair in (("size", cfg.size), ("tile.size", cfg.tile_size), ("tile.stride", cfg.tile_stride)):
        if pair is not None and (len(pair) != 2 or min(pair) < 1):
            raise ConfigError(f"{where}.{key}: expected [height, width] of positive integers, got {pair!r}")
    if cfg.tile_stride is not None and cfg.tile_size is None:
        raise ConfigError(f"{where}.tile.stride: a stride needs a tile size; add tile.size: [height, width]")
    _window_params(cfg.window)


def _window_params(window: tuple[tuple[str, Any], ...]) -> tuple[str, float, float] | None:
    """``cfg.window`` → ("center_width", c, w) | ("percentiles", lo, hi) | None; raises ConfigError."""
    where = "transform.image.window"
    spec = dict(window)
    if not spec:
        return None
    if set(spec) == {"center", "width"}:
        center, width = float(spec["center"]), float(spec["width"])
        if not (isfinite(center) and isfinite(width) and width > 0):
            raise ConfigError(f"{where}: expected a finite center and a width > 0, got {spec}")
        return ("center_width", center, width)
    if set(spec) == {"percentiles"}:
        pair = spec["percentiles"]
        if len(pair) != 2 or not 0 <= float(pair[0]) < float(pair[1]) <= 100:
            raise ConfigError(f"{where}.percentiles: expected [lo, hi] with 0 <= lo < hi <= 100, got {pair!r}")
        return ("percentiles", float(pair[0]), float(pair[1]))
    raise ConfigError(f"{where}: expected {{center, width}} or {{percentiles: [lo, hi]}}, got keys {sorted(spec)}")


#: TIFF sample depths OpenCV decodes to uint16 scaled up to 16 bits (v << shift), by their shift:
#: its decoder takes 1, 8, 10, 12, 14, 16, 32 and 64 bits a sample (an image's WhiteIsZero
#: inversion and a mask's ids undo it: :mod:`packer.read.image`, :mod:`packer.transform.mask`)
OPENCV_SCALED_TIFF_BITS = {10: 6, 12: 4, 14: 2}


def opencv_misreads_planar_tiff(planar: int, samples: int, bits: int) -> bool:
    """Whether OpenCV 5 decodes a TIFF page of this layout wrong: more than one sample of more
    than 8 bits stored as separate planes (PlanarConfiguration 2), which it reads as if they were
    interleaved (the first plane's values spread over all channels); the same page at 8 bits, or
    interleaved, it reads right. The image reader and the mask decoder refuse it alike."""
    return planar == 2 and samples > 1 and bits > 8


def full_range_max(dtype: np.dtype) -> float | None:
    """The stored maximum that maps to 1.0 without a window: 255 for uint8, 65535 for uint16,
    ``None`` for any other dtype (such images need a window)."""
    return {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}.get(np.dtype(dtype))


def orient_image(image: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF/TIFF Orientation value (1-8) to an H×W[×C] array of any dtype.

    1 = as stored, 2 = mirror left-right, 3 = rotate 180°, 4 = mirror top-bottom,
    5 = transpose, 6 = rotate 90° clockwise, 7 = transverse, 8 = rotate 90° counter-clockwise.
    Values outside 1-8 are reserved and treated as 1. Returns a view (not contiguous).
    """
    if orientation == 2:
        return image[:, ::-1]
    if orientation == 3:
        return image[::-1, ::-1]
    if orientation == 4:
        return image[::-1]
    if orientation == 5:
        return image.swapaxes(0, 1)
    if orientation == 6:
        return np.rot90(image, k=-1)
    if orientation == 7:
        return np.rot90(image, k=2).swapaxes(0, 1)
    if orientation == 8:
        return np.rot90(image, k=1)
    return image


def oriented_size(height: int, width: int, orientation: int) -> tuple[int, int]:
    """(height, width) after :func:`orient_image`: orientations 5-8 swap the axes."""
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def remove_alpha(image: np.ndarray, mode: str, white: float) -> np.ndarray:
    """H×W×C float32 with C in 1-4 → H×W×1 or H×W×3 float32 on the same scale.

    C = 2 is grey+alpha and C = 4 is BGRA; C = 1 or 3 pass through. ``drop`` removes the
    alpha channel; ``composite`` gives ``colour·a + white·(1 − a)`` with ``a = alpha / white``.
    """
    if image.shape[2] not in (2, 4):
        return image
    colour, alpha = image[:, :, :-1], image[:, :, -1:]
    if mode == "drop":
        return colour
    weight = np.clip(alpha / np.float32(white), 0.0, 1.0)
    return (colour * weight + np.float32(white) * (1.0 - weight)).astype(np.float32)


def convert_color(image: np.ndarray, color: str) -> np.ndarray:
    """H×W×1 grey or H×W×3 BGR float32 → H×W×3 RGB (``rgb``) or H×W×1 luminance (``gray``)."""
    if image.shape[2] == 1:
        return image if color == "gray" else np.repeat(image, 3, axis=2)
    code = cv2.COLOR_BGR2GRAY if color == "gray" else cv2.COLOR_BGR2RGB
    out = cv2.cvtColor(np.ascontiguousarray(image), code)
    return out[:, :, None] if out.ndim == 2 else out


def window_center_width(values: np.ndarray, center: float, width: float) -> np.ndarray:
    """Linear window to float32 [0, 1], as DICOM LINEAR_EXACT (PS3.3 C.11.2.1.3.2).

    ``y = (x − center) / width + 0.5``, clipped to [0, 1]: ``x <= center − width/2`` → 0,
    ``x >= center + width/2`` → 1. ``width`` > 0, in stored units.
    """
    return np.clip((values - np.float32(center)) / np.float32(width) + np.float32(0.5), 0.0, 1.0,
                   dtype=np.float32)


def window_percentiles(values: np.ndarray, lo: float, hi: float, pool: np.ndarray | None = None) -> np.ndarray:
    """Clip at the image's ``lo``-th and ``hi``-th percentiles (numpy ``linear`` method, over all
    channels, NaN and ±inf ignored: one infinite pixel made the high percentile infinite and
    the whole image black) and scale that range to float32 [0, 1] (+inf clips to 1, −inf to 0).
    When both percentiles are equal the result is 0 at or below that value and 1 above it; no
    finite value gives 0. ``pool``: the pixels to take the percentiles of, where ``values``
    repeats them (a grey image as RGB: three copies of each value interpolate to other levels)."""
    pool = values if pool is None else pool
    ok = np.isfinite(pool)
    finite = pool if ok.all() else pool[ok]
    if finite.size == 0:
        return np.zeros(values.shape, dtype=np.float32)
    low, high = (float(v) for v in np.percentile(finite, [lo, hi]))
    if high <= low:
        return (values > low).astype(np.float32)
    return np.clip((values - np.float32(low)) / np.float32(high - low), 0.0, 1.0, dtype=np.float32)


def to_uint8(unit: np.ndarray, *, finite: bool = False) -> np.ndarray:
    """Float in [0, 1] (NaN → 0, out of range clipped) → uint8 ``rint(x · 255)``, same shape.
    ``finite``: the caller knows ``unit`` holds no NaN or infinity (it came from integer pixels),
    so the NaN pass, which would change nothing, is skipped."""
    scaled = np.multiply(unit, np.float32(255.0), dtype=np.float32)
    if not finite:
        np.nan_to_num(scaled, copy=False, nan=0.0)
    np.clip(scaled, 0.0, 255.0, out=scaled)
    np.rint(scaled, out=scaled)
    return scaled.astype(np.uint8)


def tile_origins(height: int, width: int, tile: tuple[int, int],
                 stride: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Top-left (row, col) of every full ``tile`` in a ``height``×``width`` image, row-major.

    ``stride`` defaults to ``tile`` (no overlap). Partial tiles at the right and bottom edges
    are not produced; an image smaller than the tile gives an empty list.
    """
    step_r, step_c = stride or tile
    rows = range(0, height - tile[0] + 1, step_r)
    cols = range(0, width - tile[1] + 1, step_c)
    return [(r, c) for r in rows for c in cols]


def transform_image(image: np.ndarray, cfg: ImageTransformConfig, orientation: int = 1, *,
                    scaled_bits: int | None = None) -> list[Tile]:
    """Decoded OpenCV array → list of :class:`Tile` (uint8 C×H×W, C-contiguous).

    ``image`` is H×W or H×W×C (C in 1-4, BGR(A) order). Steps and their order are in the
    module docstring. One Tile with ``origin=None`` when ``cfg.tile_size`` is unset; else
    one per full tile (possibly none). Raises ValueError when ``image`` is neither uint8
    nor uint16 and ``cfg.window`` is empty, or on a bad config (see check_image_config).

    ``scaled_bits``: the stored bits of a 10-, 12- or 14-bit TIFF that OpenCV decoded scaled to
    16 (``v << shift``, :data:`OPENCV_SCALED_TIFF_BITS`). A ``{center, width}`` window is in
    stored units, so it is scaled by ``2**shift`` to meet the decoded values: exact in float32,
    the same bytes as windowing the stored values. Percentiles and the full range are the same
    either way.
    """
    window = _window_params(cfg.window)
    peak = full_range_max(image.dtype)
    if window is None and peak is None:
        raise ValueError(f"{image.dtype} pixels have no full range to scale; set transform.image.window")
    hwc = orient_image(image, orientation)
    if hwc.ndim == 2:
        hwc = hwc[:, :, None]
    # BGR -> RGB is an exact channel swap, and every step up to the output treats the channels
    # alike (a window maps each value, percentiles pool all channels, the resize is per channel):
    # the swap is left to the C×H×W copy at the end, on the output's pixels instead of the input's
    # (OpenCV's float resize may round a value 1 ulp differently by its channel's SIMD lane, so on
    # some machines a value on a rounding boundary lands one level off what swapping first gives;
    # the bytes are this order's, on every run)
    late_alpha = None
    if peak is None and cfg.alpha == "composite" and hwc.shape[2] in (2, 4):
        # float pixels have no white in stored units (a window decides what shows white): their
        # alpha (0..1) composites over white after the window, on the [0, 1] scale
        late_alpha = np.clip(hwc[:, :, -1:].astype(np.float32), 0.0, 1.0)
        hwc = hwc[:, :, :-1]
    swap = hwc.shape[2] == 3 and cfg.color == "rgb"
    grey = None if swap else remove_alpha(hwc.astype(np.float32), cfg.alpha, peak or 1.0)
    values = hwc if grey is None else convert_color(grey, cfg.color)
    if window is None:  # integer pixels: to float32 and onto [0, 1] in one pass, the same float32 products
        scale = np.float32(1.0 / (peak or 1.0))
        unit = (np.multiply(values, scale, out=values) if values.dtype == np.float32
                else np.multiply(values, scale, dtype=np.float32))
    elif window[0] == "center_width":
        stored = float(1 << OPENCV_SCALED_TIFF_BITS.get(scaled_bits or 0, 0))  # decoded units per stored unit
        unit = window_center_width(values.astype(np.float32, copy=False), window[1] * stored, window[2] * stored)
    else:
        unit = window_percentiles(values.astype(np.float32, copy=False), window[1], window[2],
                                  pool=grey if grey is not None and grey.shape[2] == 1 else None)
    if late_alpha is not None:
        unit = (unit * late_alpha + (np.float32(1.0) - late_alpha)).astype(np.float32)
    if image.dtype.kind not in "ui":
        # a window leaves NaN as NaN (np.clip does): black now, before the resize, whose filter
        # would spread it to every output pixel it touches (one NaN blackened a whole 8×8 block)
        np.nan_to_num(unit, copy=False, nan=0.0, posinf=1.0, neginf=0.0)
    box = None
    if cfg.size:
        box = content_box(unit.shape[:2], cfg.size, cfg.resize)
        unit = resize_image(np.ascontiguousarray(unit, dtype=np.float32), cfg.size, cfg.resize)
    out = to_uint8(unit, finite=image.dtype.kind in "ui")  # integer pixels: finite through every step
    if swap:
        out = out[:, :, ::-1]
    if cfg.tile_size is None:
        return [Tile(None, np.ascontiguousarray(out.transpose(2, 0, 1)), box)]
    th, tw = cfg.tile_size
    return [Tile((r, c), np.ascontiguousarray(out[r:r + th, c:c + tw].transpose(2, 0, 1)),
                 _tile_content(box, (r, c), (th, tw)))
            for r, c in tile_origins(out.shape[0], out.shape[1], cfg.tile_size, cfg.tile_stride)]


def _tile_content(box: tuple[int, int, int, int] | None, origin: tuple[int, int], tile: tuple[int, int]
                  ) -> tuple[int, int, int, int] | None:
    """The part of the image's ``box`` in the resized output (``None``: all of it) that the tile at
    ``origin`` holds, in the tile's pixels; ``None`` where the tile is all image, (0, 0, 0, 0) where
    it is all padding."""
    if box is None:
        return None
    top, left = max(box[0], origin[0]), max(box[1], origin[1])
    bottom, right = min(box[0] + box[2], origin[0] + tile[0]), min(box[1] + box[3], origin[1] + tile[1])
    if bottom <= top or right <= left:
        return 0, 0, 0, 0
    inside = (top - origin[0], left - origin[1], bottom - top, right - left)
    return None if inside == (0, 0, tile[0], tile[1]) else inside
