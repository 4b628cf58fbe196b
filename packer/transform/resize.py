"""Resize an H×W×C float32 or uint8 array to a target size under one of three policies.

- ``stretch``: scale each axis independently to the target (aspect ratio not kept).
- ``fit``: scale to fit inside the target, keeping aspect, and pad (letterbox) with ``pad_value``.
- ``crop``: scale to cover the target, keeping aspect, and cut the centre.

Downscaling uses ``cv2.INTER_AREA`` (no aliasing), upscaling ``cv2.INTER_LINEAR``
(``interpolation="auto"``). Label arrays (segmentation masks) use ``interpolation="nearest"``:
``cv2.INTER_NEAREST_EXACT``, which takes source pixel ``floor((i + 0.5) · src / dst)``, the one
under the output pixel's centre, so it lines up with the centre-aligned AREA/LINEAR image.
(``cv2.INTER_NEAREST`` takes ``floor(i · src / dst)``, (s − 1)/2 source pixels toward the
origin for a shrink by s: 8 → 4 picks [0, 2, 4, 6] where EXACT picks [1, 3, 5, 7].) It never
makes new values. A resize that shrinks one axis and grows the other (``stretch`` to another
aspect, or a spacing resample of anisotropic pixels) is done one axis at a time, INTER_AREA on
the shrunk axis then INTER_LINEAR on the grown one: cv2's INTER_AREA given both falls back to a
2-tap filter at ``floor(i · s)``, which skipped 3 of every 5 source rows at a 5× shrink (a
one-pixel line vanished from the image while its mask, nearest and centre-aligned, kept it) and
sat about half a source pixel toward the origin.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packer.opencv import cv2

POLICIES = ("stretch", "fit", "crop")
INTERPOLATIONS = ("auto", "nearest")


def _interp(src_hw: tuple[int, int], dst_hw: tuple[int, int], interpolation: str = "auto") -> int:
    if interpolation == "nearest":
        return cv2.INTER_NEAREST_EXACT
    shrinking = dst_hw[0] < src_hw[0] or dst_hw[1] < src_hw[1]
    return cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR


def _scale(image: np.ndarray, height: int, width: int, interpolation: str = "auto") -> np.ndarray:
    """cv2.resize that keeps the channel axis even for one channel (cv2 drops it); one axis at a
    time where one shrinks and the other grows (see the module docstring)."""
    src = image.shape[:2]
    if src == (height, width):
        return image
    if interpolation == "auto" and (height - src[0]) * (width - src[1]) < 0:  # one axis shrinks, one grows
        if height < src[0]:
            return _scale(_scale(image, height, src[1]), height, width)
        return _scale(_scale(image, src[0], width), height, width)
    out = cv2.resize(image, (width, height), interpolation=_interp(src, (height, width), interpolation))
    if out.ndim == 2 and image.ndim == 3:
        out = out[:, :, None]
    return out


def resize_image(image: np.ndarray, size: tuple[int, int], policy: str = "stretch",
                 pad_value: float | Sequence[float] = 0.0, *, interpolation: str = "auto") -> np.ndarray:
    """Resize H×W×C ``image`` to ``size`` = (height, width); dtype and channel count are kept.

    ``interpolation``: ``auto`` (AREA shrinking, LINEAR growing) for pixel values, ``nearest``
    (INTER_NEAREST_EXACT, see the module docstring) for class ids: every output value is a
    source value. ``fit`` pads with ``pad_value`` either way: one value, or one per channel (a
    z-score's black is not a window's). ``cv2`` handles at most 512
    channels; packer's images have a handful. Raises ValueError on an unknown policy or
    interpolation, or an array that is not H×W×C.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown resize policy {policy!r}; expected one of {POLICIES}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}")
    if image.ndim != 3:
        raise ValueError(f"resize_image expects H×W×C, got shape {image.shape}")
    height, width = size
    (new_h, new_w), (top, left) = resize_plan(image.shape[:2], size, policy)
    if policy == "crop" and new_h * new_w > max(CROP_SAMPLED_PIXELS, image.shape[0] * image.shape[1]):
        return _crop_sampled(image, (new_h, new_w), (top, left), size, interpolation)
    scaled = _scale(image, new_h, new_w, interpolation)
    if policy == "stretch":
        return scaled
    if policy == "fit":
        out = np.full((height, width, image.shape[2]), pad_value, dtype=image.dtype)
        out[top:top + new_h, left:left + new_w] = scaled
        return out
    return np.ascontiguousarray(scaled[-top:-top + height, -left:-left + width])


#: ``crop`` scales the whole image before it cuts the centre, as cv2.resize can only; an image
#: whose aspect is far from the target's (a 1×600000 strip cropped to 256×256 scales to 256 ×
#: 153,600,000 pixels, 39 GB of float32 for one channel) is instead sampled at the output pixels
#: alone (:func:`_crop_sampled`) once the scaled grid would hold more pixels than this (256 MiB of
#: float32 a channel) and more than the source (a crop that scales down stays within the source's
#: size, which ``limits.max_pixels`` bounds). Decided by pixels, not bytes, so an image and its
#: mask take the same path. Every crop under it is cv2.resize's, byte for byte, as before.
CROP_SAMPLED_PIXELS = 2**26


def resize_plan(src_hw: tuple[int, ...], size: tuple[int, int], policy: str
                ) -> tuple[tuple[int, int], tuple[int, int]]:
    """What :func:`resize_image` does to an H×W grid: the size it scales to, and where that
    scaled grid's (0, 0) lands in the output (``fit``: the padding, >= 0; ``crop``: minus the
    cut, <= 0; ``stretch``: (0, 0))."""
    height, width = size
    src_h, src_w = src_hw[0], src_hw[1]
    if policy == "stretch":
        return (height, width), (0, 0)
    if policy == "fit":
        scale = min(height / src_h, width / src_w)
        new_h, new_w = max(1, round(src_h * scale)), max(1, round(src_w * scale))
        return (new_h, new_w), ((height - new_h) // 2, (width - new_w) // 2)
    scale = max(height / src_h, width / src_w)
    new_h, new_w = max(height, round(src_h * scale)), max(width, round(src_w * scale))
    return (new_h, new_w), (-((new_h - height) // 2), -((new_w - width) // 2))


def content_box(src_hw: tuple[int, ...], size: tuple[int, int], policy: str) -> tuple[int, int, int, int] | None:
    """Where the image lies in :func:`resize_image`'s output: (top, left, height, width) of the
    scaled grid under ``fit``, whose padding around it is no part of the image; ``None`` under
    ``stretch`` and ``crop``, whose image fills the whole output. What shows the image, for
    evidence drawn from it (near-copy signatures, :func:`packer.pipeline.nearcopy.packed_signature`)."""
    if policy != "fit":
        return None
    (new_h, new_w), (top, left) = resize_plan(src_hw, size, policy)
    return top, left, new_h, new_w


def _crop_sampled(image: np.ndarray, scaled: tuple[int, int], offset: tuple[int, int], size: tuple[int, int],
                  interpolation: str) -> np.ndarray:
    """The ``crop`` of ``image`` scaled to ``scaled`` and cut at ``offset`` (<= 0) to ``size``,
    computed at the output pixels only: each takes the source point under its centre in the
    scaled grid, ``(j + 0.5) · source/scaled − 0.5``, as cv2.resize maps it, by bilinear
    interpolation with edges repeated (``cv2.remap``, whose 1/32-pixel coordinate steps put it
    within 1 of cv2.resize's uint8 values) or the source pixel under it (``nearest``:
    ``floor((j + 0.5) · source/scaled)``, INTER_NEAREST_EXACT's rule; OpenCV's own arithmetic
    picks the pixel before where a centre falls exactly on a pixel edge, about one row or column
    in seven thousand). The caller comes here only when the crop scales the image up, so LINEAR is
    the filter cv2.resize would have used."""
    axes, spans = [], []
    for n_src, n_scaled, cut, n_out in zip(image.shape[:2], scaled, offset, size, strict=True):
        centres = (np.arange(n_out, dtype=np.float64) - cut + 0.5) * (n_src / n_scaled)
        if interpolation == "nearest":
            axes.append(np.minimum(np.floor(centres), n_src - 1).astype(np.intp))
            continue
        # the source span the output reads (cv2.remap takes at most 32767 pixels a side), edges kept
        first = max(0, int(np.floor(centres[0] - 0.5)) - 1)
        spans.append(slice(first, min(n_src, int(np.ceil(centres[-1] - 0.5)) + 2)))
        axes.append((centres - 0.5 - first).astype(np.float32))
    rows, cols = axes
    if interpolation == "nearest":
        return np.ascontiguousarray(image[rows[:, None], cols[None, :]])
    out = cv2.remap(np.ascontiguousarray(image[spans[0], spans[1]]),
                    np.ascontiguousarray(np.broadcast_to(cols[None, :], size)),
                    np.ascontiguousarray(np.broadcast_to(rows[:, None], size)), cv2.INTER_LINEAR,
                    borderMode=cv2.BORDER_REPLICATE)
    return out[:, :, None] if out.ndim == 2 else out
