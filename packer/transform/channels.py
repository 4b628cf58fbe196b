"""One channel count for a whole dataset: the rules that map a sample's own channels to ``transform.channels``.

A job mixes kinds whose natural channel counts differ: a CT slice has one channel per window,
a radiograph with its own ``file`` window has one, a photo has three (RGB). A model takes one
count, so ``transform.channels: N`` (or ``transform.dicom.channels`` / ``transform.image.channels``
for one kind) makes every sample N channels, by these rules and no others:

- ``keep``: the sample already has N channels.
- ``replicate``: a 1-channel sample is repeated N times (grey → RGB, as torchvision's
  ``Grayscale(num_output_channels=3)`` does).
- ``luma``: a 3-channel colour DICOM (RGB, YBR, PALETTE COLOR) asked for 1 channel becomes its
  luminance 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601, the weights ``color: gray`` uses for images).

Anything else (2 windows asked to become 3 channels, RGB photos asked to become 1 channel) is
never reshaped silently: where the job file already tells the count (windows, ``color``), it is a
config error naming the source and the fix (:func:`check_channels`); where only the file tells
(``frames: stack``), the file is a ``bad_shape`` bad sample (:func:`match_channels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.errors import ConfigError

#: BT.601 luma weights for R, G, B.
LUMA = (0.299, 0.587, 0.114)


def luminance(image: np.ndarray, axis: int = 0) -> np.ndarray:
    """The BT.601 luma of the 3 channels along ``axis`` of ``image``, in float64, that axis kept
    (size 1). Both the rule applied to a finished sample (:func:`match_channels`) and a colour
    DICOM frame's luma taken before its levels are rounded (:mod:`packer.transform.dicom`) use it,
    so the two agree wherever the rounding loses nothing."""
    shape = [1] * image.ndim
    shape[axis] = 3
    weights = np.asarray(LUMA, dtype=np.float64).reshape(shape)
    return (image.astype(np.float64) * weights).sum(axis=axis, keepdims=True)


def channel_rule(natural: int, target: int, *, color: bool = False) -> str | None:
    """How a ``natural``-channel sample becomes ``target`` channels: ``keep``, ``replicate``,
    ``luma`` (only for ``color`` samples, 3 → 1), or None when no rule applies."""
    if natural == target:
        return "keep"
    if natural == 1:
        return "replicate"
    if color and natural == 3 and target == 1:
        return "luma"
    return None


@dataclass(frozen=True)
class Mapped:
    """A sample's image after :func:`match_channels`, and the rule that made it (``keep``, ...)."""

    image: np.ndarray
    rule: str


def match_channels(image: np.ndarray, target: int, *, color: bool = False) -> Mapped | str:
    """``image`` (C×H×W) with ``target`` channels by :func:`channel_rule`, or why it cannot be.

    ``color``: the channels are R, G, B (colour DICOM), so 3 → 1 may take the luminance. The
    dtype is kept; a luminance is rounded back to an integer dtype.
    """
    natural = int(image.shape[0])
    rule = channel_rule(natural, target, color=color)
    if rule is None:
        return (f"it has {natural} channels and transform.channels asks for {target}; only 1 channel "
                f"(replicated) or exactly {target} can be mapped")
    if rule == "keep":
        return Mapped(image, rule)
    if rule == "replicate":
        return Mapped(np.ascontiguousarray(np.repeat(image, target, axis=0)), rule)
    luma = luminance(image, axis=0)
    if image.dtype.kind in "ui":
        info = np.iinfo(image.dtype)
        luma = np.clip(np.rint(luma), info.min, info.max)
    return Mapped(np.ascontiguousarray(luma.astype(image.dtype)), rule)


def check_channels(target: int, natural: int, *, where: str, sources: list[str], fix: str,
                   key: str = "transform.channels") -> None:
    """Raise :class:`ConfigError` when a count the job file fixes (``natural``) cannot become ``target``.

    ``where``: the key that fixes the count (``transform.dicom.windows``); ``sources``: the
    sources it applies to; ``fix``: what to change in the job; ``key``: the key that asks for
    ``target`` (``transform.image.channels``, or the shared ``transform.channels``).
    """
    if channel_rule(natural, target) is not None:
        return
    mappable = ("only a sample of exactly 1 channel, or of 3 colour channels of a colour DICOM (their luminance), "
                "can be mapped" if target == 1 else f"only 1 channel (replicated) or exactly {target} can be mapped")
    raise ConfigError(
        f"{where}: gives {natural} channel(s) for source(s) {', '.join(sources)}, and {key} is "
        f"{target}: {mappable}, never a silent reshape. "
        f"Fix: {fix}; or drop {key} and load each source on its own "
        "(ShardDataset(manifest, split, sources=[...]))")
