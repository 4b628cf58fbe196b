"""Resize an H×W×C float32 or uint8 array to a target size under one of three policies.

- ``stretch``: scale each axis independently to the target (aspect ratio not kept).
- ``fit``: scale to fit inside the target, keeping aspect, and pad (letterbox) with ``pad_value``.
- ``crop``: scale to cover the target, keeping aspect, and cut the centre.

Downscaling uses ``cv2.INTER_AREA`` (no aliasing), upscaling ``cv2.INTER_LINEAR``.
"""

from __future__ import annotations

import cv2
import numpy as np

POLICIES = ("stretch", "fit", "crop")


def _interp(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> int:
    shrinking = dst_hw[0] < src_hw[0] or dst_hw[1] < src_hw[1]
    return cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR


def _scale(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv2.resize that keeps the channel axis even for one channel (cv2 drops it)."""
    src = image.shape[:2]
    if src == (height, width):
        return image
    out = cv2.resize(image, (width, height), interpolation=_interp(src, (height, width)))
    if out.ndim == 2 and image.ndim == 3:
        out = out[:, :, None]
    return out


def resize_image(image: np.ndarray, size: tuple[int, int], policy: str = "stretch",
                 pad_value: float = 0.0) -> np.ndarray:
    """Resize H×W×C ``image`` to ``size`` = (height, width); dtype and channel count are kept.

    ``cv2`` handles at most 512 channels; packer's images have a handful.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown resize policy {policy!r}; expected one of {POLICIES}")
    if image.ndim != 3:
        raise ValueError(f"resize_image expects H×W×C, got shape {image.shape}")
    height, width = size
    src_h, src_w = image.shape[:2]
    if policy == "stretch":
        return _scale(image, height, width)
    if policy == "fit":
        scale = min(height / src_h, width / src_w)
        new_h, new_w = max(1, round(src_h * scale)), max(1, round(src_w * scale))
        scaled = _scale(image, new_h, new_w)
        out = np.full((height, width, image.shape[2]), pad_value, dtype=image.dtype)
        top, left = (height - new_h) // 2, (width - new_w) // 2
        out[top:top + new_h, left:left + new_w] = scaled
        return out
    scale = max(height / src_h, width / src_w)
    new_h, new_w = max(height, round(src_h * scale)), max(width, round(src_w * scale))
    scaled = _scale(image, new_h, new_w)
    top, left = (new_h - height) // 2, (new_w - width) // 2
    return np.ascontiguousarray(scaled[top:top + height, left:left + width])
