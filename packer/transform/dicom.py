"""DICOM array transform: one decoded frame + resolved parameters → a C×H×W training array.

``packer.read.dicom`` does the I/O and reads the parameters out of the dataset (per frame for
Enhanced images); this module only does arithmetic on arrays, in this order (DICOM PS3.3 C.11,
PS3.4 N.2.1.1):

    stored values ─ padding mask (C.7.5.1.1.2, on stored values)
                  ─ modality LUT or rescale (C.11.1), × Dose Grid Scaling for RT Dose (C.8.8.3)
                  ─ per channel: window (C.11.2.1.2/3) or VOI LUT (C.11.2.1.1) → [0, 1]
                  ─ MONOCHROME1: 1 - y (C.7.6.3.1.2)
                  ─ padding pixels → 0 (black, also after inversion)
                  ─ optional resample to a pixel spacing, then resize (packer.transform.resize;
                    where ``fit`` puts the frame: :func:`output_content`)
                  ─ quantise: uint8 round(y·255), uint16 round(y·65535), half to even

uint16 output that keeps the frame's pixel grid computes the display values y in float64 from
start to end: float32 (24-bit mantissa) puts y·65535 up to 0.002 off, enough to land on the other
side of a half level (the lung window gave the next level for 4 of 3,002 stored values). uint8
keeps float32 (its levels are 257 times coarser) and its bytes; so does a resized or resampled
frame, whose interpolated values are no stored value's formula anyway (float64 frames there cost
several times the float32 time). See :func:`display_dtype`, :func:`quantise`.

``float16`` output skips the VOI stage: one channel of modality values, padding filled with the
frame's smallest real value; on the frame's own grid they stay float64 until the cast to float16,
each value rounded once (:func:`render_modality_float`). Colour frames (RGB after pydicom's YBR
conversion, or PALETTE COLOR after the palette) are scaled to [0, 1] by their bit depth and
quantised the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.transform.channels import luminance
from packer.transform.resize import content_box, resize_image, resize_plan
from packer.transform.window import (
    apply_modality,
    apply_modality_lut,
    apply_voi_lut,
    apply_window,
    invert_monochrome1,
    padding_mask,
    voi_lut_bits,
)

OUTPUTS = ("uint8", "uint16", "float16")
#: Not a job's output: the unrounded float32 values a frame would be quantised from (display values
#: in [0, 1], or ``float16``'s modality values and z-scores), which :func:`quantise` passes through.
#: A volume that is resampled renders its slices so (``DicomTransformConfig.unrounded``), so that its
#: voxels are interpolated from these and rounded once, as a resampled frame's pixels are.
UNROUNDED = "float32"
FLOAT16_MAX = float(np.finfo(np.float16).max)
#: How close (in output levels) a float64 value y·65535 must come to a half level to be rounded
#: as that half level: float64 noise (x/65535·65535 is 0.5 ± 1e-11, not 0.5) must not decide a
#: tie the exact formula has (a LINEAR_EXACT window of width 65535 gives one at every value).
HALF_LEVEL_TOLERANCE = 1e-7


def display_dtype(output: str, keeps_grid: bool = True) -> type[np.floating]:
    """The float dtype display values ([0, 1]) are computed in for ``output``: float64 for
    uint16 on the frame's own pixel grid (``keeps_grid``, :func:`keeps_geometry`: exact levels,
    see the module docstring), float32 otherwise."""
    return np.float64 if output == "uint16" and keeps_grid else np.float32


@dataclass(frozen=True)
class Lut:
    """A LUT from the file: LUT Descriptor (entries, first mapped, bits) and LUT Data.

    Used for the Modality LUT Sequence (PS3.3 C.11.1.1) and the VOI LUT Sequence (C.11.2.1.1).
    ``first_mapped`` is already signed or unsigned as the input demands.
    """

    entries: int
    first_mapped: int
    bits: int
    data: tuple[int, ...]
    explanation: str = ""

    def descriptor(self) -> tuple[int, int, int]:
        return (self.entries, self.first_mapped, self.bits)

    def array(self) -> np.ndarray:
        return np.asarray(self.data, dtype=np.int64)


@dataclass(frozen=True)
class ModalityTransform:
    """Stored → modality values for one frame: ``lut`` if given, else slope/intercept (C.11.1),
    then × ``dose_grid_scaling`` for RT Dose (3004,000E)."""

    slope: float = 1.0
    intercept: float = 0.0
    lut: Lut | None = None
    dose_grid_scaling: float | None = None


@dataclass(frozen=True)
class VoiTransform:
    """One output channel's VOI stage: a window (``function`` LINEAR/LINEAR_EXACT/SIGMOID with
    ``center``/``width``) or a VOI LUT (``function == "LUT"``, ``lut`` set).

    ``source`` says where it came from: preset, explicit, file, file_lut, or fallback_*.
    """

    name: str
    function: str
    source: str
    center: float | None = None
    width: float | None = None
    lut: Lut | None = field(default=None, compare=False)
    #: A normalisation's statistics (``source`` percentiles: the values that became 0 and 1, as a
    #: LINEAR_EXACT window from ``low`` to ``high``), recorded with the channel
    stats: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "center": self.center, "width": self.width,
                               "function": self.function, "source": self.source}
        # the LUT's LUT Explanation is free text typed at a console ("ZQX JANE DOE SQRT"): it selects the
        # window (windows: [{file: sqrt}]) and never reaches a sample, as the Window Center & Width
        # Explanation does not
        if self.lut is not None:  # LUT Data narrower or wider than its descriptor says: read in the range they use
            used = voi_lut_bits(self.lut.bits, self.lut.array()[:self.lut.entries or 65536])
            if used != self.lut.bits:
                out["lut_bits"] = {"declared": self.lut.bits, "used": used}
        out.update(self.stats)
        return out


def to_modality_values(stored: np.ndarray, modality: ModalityTransform) -> np.ndarray:
    """Stored values (H×W, any integer or float dtype) → modality values, float64 H×W."""
    if modality.lut is not None:
        values = apply_modality_lut(stored, modality.lut.first_mapped, modality.lut.array())
    else:
        values = apply_modality(stored, modality.slope, modality.intercept)
    if modality.dose_grid_scaling is not None:
        values = values * float(modality.dose_grid_scaling)
    return values


def apply_voi(values: np.ndarray, voi: VoiTransform, dtype: type[np.floating] = np.float32, *,
              monochrome1: bool = False) -> np.ndarray:
    """Modality values (float64 H×W) → one display channel, ``dtype`` (:func:`display_dtype`)
    H×W in [0, 1]; ``monochrome1``: inverted (PS3.3 C.7.6.3.1.2), a window's in float64."""
    if voi.lut is not None:
        y = apply_voi_lut(values, voi.lut.descriptor(), voi.lut.array(), dtype)
        return invert_monochrome1(y) if monochrome1 else y
    if voi.center is None or voi.width is None:
        raise ValueError(f"window {voi.name!r} has no center/width and no VOI LUT")
    # both percentiles one value (asked for, or standing in for a file's missing window): the clip decides alone
    if voi.source in ("percentiles", "fallback_percentiles") and voi.width == 0:
        above = np.asarray(values, dtype=np.float64) > voi.center  # as apply_percentiles reads a volume
        return (~above if monochrome1 else above).astype(dtype)
    return apply_window(values, voi.center, voi.width, voi.function, dtype, invert=monochrome1)


def render_grayscale(values: np.ndarray, vois: tuple[VoiTransform, ...], *, monochrome1: bool,
                     padding: np.ndarray, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """Modality values (float64 H×W) → H×W×C ``dtype`` (float32; float64 for uint16 output, see
    :func:`display_dtype`) in [0, 1], one channel per VOI, in order.

    MONOCHROME1 channels are inverted after the VOI stage; pixels where ``padding`` (bool H×W)
    is True are set to 0 last, so padding is black whatever the photometric interpretation.
    """
    channels = []
    for voi in vois:
        y = apply_voi(values, voi, dtype, monochrome1=monochrome1)
        y[padding] = 0.0
        channels.append(y)
    return np.stack(channels, axis=-1).astype(dtype, copy=False)


#: Smallest frame (pixels) for which :func:`render_stored` builds a table of stored values.
TABLE_MIN_PIXELS = 4096


def render_stored(stored: np.ndarray, modality: ModalityTransform, vois: tuple[VoiTransform, ...], *,
                  monochrome1: bool, padding: tuple[int | None, int | None],
                  mask: np.ndarray | None = None, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """Stored values (H×W) → H×W×C ``dtype`` (:func:`display_dtype`) in [0, 1]: :func:`to_modality_values`, then
    :func:`render_grayscale` with padding = ``padding_mask(stored, *padding)`` (or ``mask``,
    when the caller has it already).

    Every step from stored value to display value is a function of the stored value alone
    (padding, modality LUT or rescale, VOI, MONOCHROME1). So for an integer frame whose value
    range [min, max] holds fewer values than a quarter of its pixels (a 12-bit CT slice: at
    most 4,096 values for 262,144 pixels) the steps run once per value of the range and the
    frame is looked up in that table: the same bits as the direct path, without its float64
    passes over the whole frame.
    """
    lookup = _stored_table(stored, modality, vois, monochrome1=monochrome1, padding=padding, dtype=dtype)
    if lookup is not None:
        table, rows = lookup
        # rows of the table as single opaque items: one flat take, 15× faster than table[index]
        items = table.view(np.dtype((np.void, table.shape[1] * table.itemsize))).reshape(-1)
        return items.take(rows).view(table.dtype).reshape(*rows.shape, table.shape[1])
    if mask is None:
        mask = padding_mask(stored, *padding)
    return render_grayscale(to_modality_values(stored, modality), vois, monochrome1=monochrome1, padding=mask,
                            dtype=dtype)


def _stored_table(stored: np.ndarray, modality: ModalityTransform, vois: tuple[VoiTransform, ...], *,
                  monochrome1: bool, padding: tuple[int | None, int | None],
                  dtype: type[np.floating] = np.float32) -> tuple[np.ndarray, np.ndarray] | None:
    """(table, rows) with ``table[rows]`` what :func:`render_stored` gives: the display values of
    every stored value of the frame's range (V×C ``dtype``, row 0 its minimum) and each pixel's
    row (H×W intp); None where a table does not pay (see :func:`render_stored`)."""
    if stored.dtype.kind not in "iu" or stored.dtype.itemsize > 4 or stored.size < TABLE_MIN_PIXELS:
        return None
    low, high = int(stored.min()), int(stored.max())
    if high - low >= stored.size // 4:
        return None
    domain = np.arange(low, high + 1, dtype=np.int64).astype(stored.dtype)[None, :]
    table = np.ascontiguousarray(render_grayscale(to_modality_values(domain, modality), vois, monochrome1=monochrome1,
                                                  padding=padding_mask(domain, *padding), dtype=dtype)[0])
    return table, np.subtract(stored, low, dtype=np.intp)


def keeps_geometry(height: int, width: int, *, pixel_spacing: tuple[float, float] | None,
                   spacing: tuple[float, float] | None, size: tuple[int, int] | None) -> bool:
    """Whether :func:`finish_image` leaves an H×W frame's pixel grid as it is: no resampling to
    ``spacing`` changes its size, and ``size`` (any policy) is its own or unset."""
    if spacing is not None and pixel_spacing is not None and spacing_size(height, width, pixel_spacing,
                                                                          spacing) != (height, width):
        return False
    return size is None or tuple(size) == (height, width)


def finish_stored(stored: np.ndarray, modality: ModalityTransform, vois: tuple[VoiTransform, ...], *,
                  monochrome1: bool, padding: tuple[int | None, int | None], mask: np.ndarray | None,
                  pixel_spacing: tuple[float, float] | None, spacing: tuple[float, float] | None,
                  size: tuple[int, int] | None, policy: str, output: str) -> np.ndarray:
    """:func:`render_stored`, then :func:`finish_image`: a grayscale frame's stored values (H×W)
    → its C×H'×W' output array, the same bytes.

    Where the output keeps the frame's pixel grid (:func:`keeps_geometry`) and the frame
    renders through a table of its stored values, quantising is a function of the stored value
    too: the table is quantised (4,096 rows for a 12-bit slice) instead of every pixel, and each
    channel is taken from it straight into the output, with no float32 frame in between.
    """
    keeps = keeps_geometry(*stored.shape[:2], pixel_spacing=pixel_spacing, spacing=spacing, size=size)
    if output in ("uint8", "uint16") and keeps:
        lookup = _stored_table(stored, modality, vois, monochrome1=monochrome1, padding=padding,
                               dtype=display_dtype(output))
        if lookup is not None:
            table, rows = lookup
            levels = quantise(table[None], output)[0]
            out = np.empty((table.shape[1], *rows.shape), dtype=levels.dtype)
            for channel in range(table.shape[1]):  # every row index is in range: "clip" only skips a buffered copy
                np.take(np.ascontiguousarray(levels[:, channel]), rows, out=out[channel], mode="clip")
            return out
    image = render_stored(stored, modality, vois, monochrome1=monochrome1, padding=padding, mask=mask,
                          dtype=display_dtype(output, keeps))
    return finish_image(image, pixel_spacing=pixel_spacing, spacing=spacing, size=size, policy=policy, output=output)


def render_modality_float(values: np.ndarray, *, padding: np.ndarray, monochrome1: bool = False,
                          keeps_grid: bool = True) -> np.ndarray:
    """Modality values (float64 H×W) → H×W×1 for ``float16`` output, no window.

    ``keeps_grid`` (:func:`keeps_geometry`; False for a resampled volume's unrounded slice too):
    float64, which :func:`quantise` casts to float16 once, so each value is the nearest float16 to
    stored × slope + intercept (through float32 first, 2049.0001 became 2049.0, a float16 tie, and
    then 2048, not 2050); otherwise float32, which the resize or resample interpolates (its values
    are no stored value's formula), as before. Padding pixels take the non-padding value of the
    frame that displays black (not the padding value itself, which would wreck min/max or z-score
    normalisation downstream): the smallest, or, for ``monochrome1`` (kept as stored, inverted by
    the window applied later), the largest.
    Raises ``ValueError`` when a value does not fit in float16 (|x| > 65504).
    """
    out = values.astype(np.float64, copy=True)
    real = out[~padding]
    if real.size:
        out[padding] = real.max() if monochrome1 else real.min()
    peak = float(np.abs(out).max()) if out.size else 0.0
    if peak > FLOAT16_MAX:
        raise ValueError(f"modality values reach {peak:g}, beyond float16's range (±{FLOAT16_MAX:g})")
    return (out if keeps_grid else out.astype(np.float32))[:, :, None]


def render_color(rgb: np.ndarray, bits: int, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """An RGB frame (H×W×3, unsigned integers of ``bits`` bits) → H×W×3 ``dtype`` in [0, 1]
    (:func:`display_dtype`: float64 for uint16 output on the frame's own grid, whose levels
    ``round(v · 65535 / (2^bits - 1))`` are then exact; float32 made 2593 of 12 bits 58974, not
    58973)."""
    return (np.asarray(rgb, dtype=np.float64) / float(2**bits - 1)).clip(0.0, 1.0).astype(dtype, copy=False)


def render_luma(rgb: np.ndarray, bits: int, output: str, *, keeps_grid: bool) -> np.ndarray:
    """An RGB frame (H×W×3, unsigned integers of ``bits`` bits) → its BT.601 luma (``luma`` rule
    of :mod:`packer.transform.channels`) taken from the unrounded values, rounded once:
    ``round(levels · (0.299 R + 0.587 G + 0.114 B) / (2^bits - 1))`` for ``levels`` 255 (uint8) or
    65535 (uint16). The luma of the output's rounded R, G, B rounded again was up to one level off
    that (16-bit colour packed as uint8); where ``bits`` is the output's own depth nothing was
    rounded, and the value is the luma of the stored values itself, as before.

    ``keeps_grid`` (:func:`keeps_geometry`): the 1×H×W output array; otherwise the H×W×1 display
    values in [0, 1], in :func:`display_dtype`, for :func:`finish_image` to resize and quantise."""
    top = float(2**bits - 1)
    luma = luminance(np.asarray(rgb), axis=-1)
    if not keeps_grid:
        return (luma / top).clip(0.0, 1.0).astype(display_dtype(output, keeps_grid), copy=False)
    if output == "float16":
        return np.ascontiguousarray((luma / top).clip(0.0, 1.0).astype(np.float16).transpose(2, 0, 1))
    if output not in ("uint8", "uint16"):
        raise ValueError(f"unknown output dtype {output!r}; expected one of {OUTPUTS}")
    levels, dtype = (255.0, np.uint8) if output == "uint8" else (65535.0, np.uint16)
    scaled = luma if levels == top else luma * levels / top
    return np.ascontiguousarray(np.clip(np.rint(scaled), 0.0, levels).astype(dtype).transpose(2, 0, 1))


def spacing_size(height: int, width: int, pixel_spacing: tuple[float, float],
                 target: tuple[float, float]) -> tuple[int, int]:
    """(H', W') of an H×W image resampled from ``pixel_spacing`` to ``target``, both (row, column) mm.

    Pixel Spacing (0028,0030) is (distance between rows, distance between columns), PS3.3
    10.7.1.3. ``round(H · row / target_row) × round(W · col / target_col)``, each at least 1.
    """
    return (max(1, round(height * pixel_spacing[0] / target[0])), max(1, round(width * pixel_spacing[1] / target[1])))


def resample_to_spacing(image: np.ndarray, pixel_spacing: tuple[float, float],
                        target: tuple[float, float]) -> np.ndarray:
    """Rescale H×W×C ``image`` from ``pixel_spacing`` to ``target`` spacing (size: :func:`spacing_size`)."""
    return resize_image(image, spacing_size(image.shape[0], image.shape[1], pixel_spacing, target), "stretch")


def output_spacing(height: int, width: int, *, pixel_spacing: tuple[float, float] | None,
                   spacing: tuple[float, float] | None, size: tuple[int, int] | None,
                   policy: str) -> list[float] | None:
    """The (row, column) mm of the pixel grid :func:`finish_image` packs an H×W frame on, or None
    where it resamples nothing (``spacing`` or ``pixel_spacing`` unset).

    Not ``spacing`` itself: the resample rounds to whole pixels (:func:`spacing_size`), and
    ``size`` then scales that grid (``stretch`` per axis; ``fit`` before its padding, ``crop``
    before its cut: :func:`packer.transform.resize.resize_plan`). Both keep the frame's extent,
    so each axis is ``pixel_spacing · n / n'`` with n' the scaled grid's pixels, rounded to 1e-6
    mm as a volume's spacing is."""
    if spacing is None or pixel_spacing is None:
        return None
    grid = spacing_size(height, width, pixel_spacing, spacing)
    if size is not None:
        grid = resize_plan(grid, size, policy)[0]
    return [round(pixel_spacing[0] * height / grid[0], 6), round(pixel_spacing[1] * width / grid[1], 6)]


def output_content(height: int, width: int, *, pixel_spacing: tuple[float, float] | None,
                   spacing: tuple[float, float] | None, size: tuple[int, int] | None,
                   policy: str) -> tuple[int, int, int, int] | None:
    """Where an H×W frame lies in :func:`finish_image`'s output, as (top, left, height, width):
    under ``fit`` the box of its scaled grid (after any resample to ``spacing``), the rest being
    padding; ``None`` where it fills the output (no ``size``, ``stretch``, ``crop``). The sample's
    :attr:`packer.records.Sample.content`, from which near-copy evidence is drawn: the padding is
    none (:func:`packer.pipeline.nearcopy.packed_signature`)."""
    if size is None:
        return None
    grid = (height, width)
    if spacing is not None and pixel_spacing is not None:
        grid = spacing_size(height, width, pixel_spacing, spacing)
    return content_box(grid, size, policy)


def quantise(image: np.ndarray, output: str) -> np.ndarray:
    """H×W×C float32 (float64 for uint16: :func:`display_dtype`; for float16 modality values on
    their own grid: :func:`render_modality_float`) → H×W×C of dtype ``output``.

    ``uint8``/``uint16``: input in [0, 1] (clipped), ``round(y·255)`` / ``round(y·65535)``,
    round half to even. For float64 input, a value within :data:`HALF_LEVEL_TOLERANCE` of a
    half level is rounded as that half level (to even): the exact formula's ties stay ties.
    ``float16``: a plain cast (from float64: one rounding). :data:`UNROUNDED`: float32, nothing
    rounded (the caller quantises).
    """
    if output == UNROUNDED:
        return image.astype(np.float32, copy=False)
    if output in ("uint8", "uint16"):
        scaled = np.clip(image, 0.0, 1.0)  # a new array: the in-place steps below never touch the input
        scaled *= 255.0 if output == "uint8" else 65535.0
        dtype = np.uint8 if output == "uint8" else np.uint16
        if scaled.dtype != np.float64:
            return np.rint(scaled, out=scaled).astype(dtype)
        levels = np.rint(scaled)
        # the few values next to a half level (|y·65535 - level| within the tolerance of 1/2) are
        # rounded as that half level: to even. |y·65535 - level| in place (a third frame-sized
        # float64 array cost more than the rest of the function), the side of the few near
        # values computed again from the input.
        diff = np.subtract(scaled, levels, out=scaled).reshape(-1)  # in [-0.5, 0.5]
        near = np.flatnonzero(np.abs(diff, out=diff) >= 0.5 - HALF_LEVEL_TOLERANCE)
        if near.size:
            flat = levels.reshape(-1)
            exact = np.clip(image.reshape(-1)[near], 0.0, 1.0)
            exact *= 65535.0
            flat[near] = np.rint(flat[near] + np.copysign(0.5, exact - flat[near]))
        return levels.astype(dtype)
    if output == "float16":
        return image.astype(np.float16)
    raise ValueError(f"unknown output dtype {output!r}; expected one of {OUTPUTS}")


def finish_image(image: np.ndarray, *, pixel_spacing: tuple[float, float] | None,
                 spacing: tuple[float, float] | None, size: tuple[int, int] | None,
                 policy: str, output: str, pad_value: float | Sequence[float] = 0.0) -> np.ndarray:
    """H×W×C float32 (or float64: :func:`display_dtype`) → C×H'×W' array of dtype ``output``,
    C-contiguous, native byte order.

    Resample to ``spacing`` first (when both it and ``pixel_spacing`` are given), then resize
    to ``size`` under ``policy`` (stretch/fit/crop; fit pads with ``pad_value``, one value or one
    per channel: 0, black, for display values; the frame minimum for float16 modality values; a
    z-score's black, :func:`packer.transform.intensity.zscore_black`), then :func:`quantise`.
    """
    if spacing is not None and pixel_spacing is not None:
        image = resample_to_spacing(image, pixel_spacing, spacing)
    if size is not None:
        image = resize_image(image, size, policy, pad_value=pad_value)
    return np.ascontiguousarray(quantise(image, output).transpose(2, 0, 1))
