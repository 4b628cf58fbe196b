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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from packer.errors import ConfigError

if TYPE_CHECKING:
    from packer.config import JobConfig, SourceConfig

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


def match_channels(image: np.ndarray, target: int, *, color: bool = False,
                   key: str = "transform.channels") -> Mapped | str:
    """``image`` (C×H×W) with ``target`` channels by :func:`channel_rule`, or why it cannot be.

    ``color``: the channels are R, G, B (colour DICOM), so 3 → 1 may take the luminance. The
    dtype is kept; a luminance is rounded back to an integer dtype. ``key``: the job's key that
    asks for ``target`` (``transform.dicom.channels``, or the shared ``transform.channels``).
    """
    natural = int(image.shape[0])
    rule = channel_rule(natural, target, color=color)
    if rule is None:
        return (f"it has {natural} channels and {key} asks for {target}; only 1 channel "
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
    alone = f"drop {key} and load each source on its own (ShardDataset(manifest, split, sources=[...]))"
    raise ConfigError(
        f"{where}: gives {natural} channel(s) for source(s) {', '.join(sources)}, and {key} is "
        f"{target}: {mappable}, never a silent reshape. "
        f"Fix: {f'{fix}; or {alone}' if fix else alone}")


def sharing_channels(job: JobConfig, sources: Sequence[SourceConfig], key: str) -> list[str]:
    """The job's sources beside ``sources`` whose channel count ``key`` sets too: those of the
    kinds that take the shared ``transform.channels`` (none where ``key`` is a kind's own). A
    fix that sets ``key`` to this kind's count is no fix where one of them cannot give it."""
    if key != "transform.channels":
        return []
    return [s.name for s in job.sources if s not in sources
            and getattr(job.settings(s.kind), "channels_key", None) == key]


def stack_fixes(target: int, per_slice: int, stacked: int, *, every_slice: Sequence[int],
                slice_fix: Callable[[int], str], sample_key: str, key: str, shared: Sequence[str]) -> list[str]:
    """The changes that make a stack of ``stacked`` (2k + 1) slices of ``per_slice`` channels each
    give ``target`` channels, and only those that can (a stack is never replicated, so it must
    give ``target`` exactly): ``key`` set to the stack's count, where every stack of the kind
    (``every_slice``: each per-slice count one stack size serves) gives one count and no other
    source's count is ``key`` too (``shared``: RGB photos beside it are refused any other count);
    ``slice_fix(n)``, slices of ``n`` channels, where ``target`` is a multiple of the stack; and
    the stack's size, ``sample_key: {neighbors: k}``, where 2k + 1 slices of every per-slice
    count make ``target``."""
    counts = {per_slice, *every_slice}
    fixes = []
    if len(counts) == 1 and not shared:
        fixes.append(f"set {key} to {per_slice * stacked}")
    if target % stacked == 0:
        fixes.append(f"{slice_fix(target // stacked)} that, times the stack's {stacked} slices, make {target} channels")
    slices, rest = divmod(target, per_slice)
    if len(counts) == 1 and not rest and slices % 2 == 1 and slices > 1:
        fixes.append(f"set {sample_key}: {{neighbors: {slices // 2}}} ({slices} slices × {per_slice} channel(s) a "
                     f"slice make {target})")
    return fixes
