"""Grey-level maths of DICOM display, as small pure numpy functions (no pydicom here).

Order of operations for a grayscale image (DICOM PS3.3 C.11, PS3.4 N.2.1.1):

1. stored values → :func:`padding_mask` (Pixel Padding Value / Range Limit, C.7.5.1.1.2),
   computed on the *stored* values, before anything else;
2. stored values → modality values: :func:`apply_modality_lut` (Modality LUT Sequence,
   C.11.1.1) or, when there is none, :func:`apply_modality` (Rescale Slope/Intercept, C.11.1);
3. modality values → [0, 1]: :func:`apply_window` (Window Center/Width with VOI LUT Function
   LINEAR, LINEAR_EXACT or SIGMOID, C.11.2.1.2 and C.11.2.1.3) or :func:`apply_voi_lut`
   (VOI LUT Sequence, C.11.2.1.1);
4. MONOCHROME1 only: :func:`invert_monochrome1` (C.7.6.3.1.2: minimum displays white).

The window presets (:data:`PRESETS`) are CT level/width pairs in Hounsfield units; values vary
between institutions, so each one names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WINDOW_FUNCTIONS = ("LINEAR", "LINEAR_EXACT", "SIGMOID")


@dataclass(frozen=True)
class Preset:
    """A named CT window: ``center`` (level) and ``width`` in HU, the VOI LUT Function, a citation."""

    center: float
    width: float
    function: str = "LINEAR"
    source: str = ""


_RADIOPAEDIA = "Radiopaedia, 'Windowing (CT)', https://radiopaedia.org/articles/windowing-ct"
_RSNA_ICH = "RSNA Intracranial Hemorrhage Detection 2019, public winning solutions"

#: CT window presets (HU). Sources as in docs: Radiopaedia and the RSNA ICH 2019 solutions.
PRESETS: dict[str, Preset] = {
    "brain": Preset(40, 80, source=_RADIOPAEDIA),
    "subdural": Preset(80, 200, source=f"{_RSNA_ICH} (Radiopaedia gives L 50-100, W 130-300)"),
    "stroke": Preset(40, 40, source=f"{_RADIOPAEDIA} (35/35 is also used)"),
    "head_soft_tissue": Preset(40, 380, source=_RSNA_ICH),
    "bone": Preset(600, 2800, source=f"{_RADIOPAEDIA} (head/temporal bone; some use W 2000)"),
    "lung": Preset(-600, 1500, source=_RADIOPAEDIA),
    "mediastinum": Preset(50, 350, source=f"{_RADIOPAEDIA} (RSNA PE solutions use 40/400)"),
    "abdomen": Preset(50, 400, source=f"{_RADIOPAEDIA} (abdominal soft tissue)"),
    "soft_tissue": Preset(50, 400, source=f"{_RADIOPAEDIA} (alias of abdomen)"),
    "liver": Preset(30, 150, source=_RADIOPAEDIA),
    "bone_body": Preset(400, 1800, source=f"{_RADIOPAEDIA} (body/spine bone)"),
}


def check_window(center: float, width: float, function: str = "LINEAR") -> None:
    """Raise ``ValueError`` unless (center, width, function) is a valid DICOM window.

    LINEAR needs width >= 1 (PS3.3 C.11.2.1.2); LINEAR_EXACT and SIGMOID need width > 0
    (C.11.2.1.3); centre and width must be finite.
    """
    if function not in WINDOW_FUNCTIONS:
        raise ValueError(f"VOI LUT Function {function!r} is not one of {WINDOW_FUNCTIONS} (PS3.3 C.11.2.1.3)")
    if not (np.isfinite(center) and np.isfinite(width)):
        raise ValueError(f"window center {center!r} / width {width!r} must be finite numbers")
    if function == "LINEAR" and width < 1:
        raise ValueError(f"LINEAR windows need width >= 1 (PS3.3 C.11.2.1.2), got {width:g}")
    if function != "LINEAR" and width <= 0:
        raise ValueError(f"{function} windows need width > 0 (PS3.3 C.11.2.1.3), got {width:g}")


def apply_window(x: np.ndarray, center: float, width: float, function: str = "LINEAR",
                 dtype: type[np.floating] = np.float32, *, invert: bool = False) -> np.ndarray:
    """Map modality values ``x`` (any real dtype, any shape) through a window onto [0, 1].

    Returns ``dtype`` (float32, or float64 for 16-bit output: float32's 24-bit mantissa cannot
    tell every 16-bit level from the next half level) of ``x``'s shape, computed in float64. Formulas of DICOM PS3.3
    C.11.2.1.2 (LINEAR) and C.11.2.1.3 (LINEAR_EXACT, SIGMOID) with output range [0, 1]:

    - LINEAR: ``x <= c - 0.5 - (w-1)/2 -> 0``; ``x > c - 0.5 + (w-1)/2 -> 1``;
      else ``(x - (c - 0.5)) / (w - 1) + 0.5``.
    - LINEAR_EXACT: ``x <= c - w/2 -> 0``; ``x > c + w/2 -> 1``; else ``(x - c)/w + 0.5``.
    - SIGMOID: ``1 / (1 + exp(-4 (x - c) / w))``, no clipping.

    ``invert``: ``1 - y`` (MONOCHROME1, :func:`invert_monochrome1`), taken in float64 before the
    cast to ``dtype``, so an exact half level of the inverted value stays one as the window's
    own do (``1 - y`` in float32 made 62.5 of 255 62.500004, rounded to 63).

    Raises ``ValueError`` for an invalid window (see :func:`check_window`).
    """
    check_window(center, width, function)
    xf = np.asarray(x, dtype=np.float64)
    if function == "SIGMOID":
        # 1 / (1 + exp(-2z)) == (1 + tanh(z)) / 2, with z = 2 (x - c) / w; tanh never overflows.
        out = 0.5 * (1.0 + np.tanh(2.0 * (xf - center) / width))
        return (1.0 - out if invert else out).astype(dtype, copy=False)
    if function == "LINEAR":
        c, w = center - 0.5, width - 1.0
    else:
        c, w = center, width
    if w <= 0:  # LINEAR with width 1 is a pure threshold: the ramp is empty
        return (xf <= c if invert else xf > c).astype(dtype)
    # The ramp maps c - w/2 to exactly 0 and c + w/2 to exactly 1, so clipping it reproduces
    # the piecewise definition (x <= low -> 0, x > high -> 1) without masks: one pass, in place.
    out = xf - c
    out /= w
    out += 0.5
    np.clip(out, 0.0, 1.0, out=out)
    if invert:
        np.subtract(1.0, out, out=out)
    return out.astype(dtype, copy=False)


def lookup(x: np.ndarray, first_mapped: int, data: np.ndarray) -> np.ndarray:
    """Index a DICOM LUT: ``data[clip(floor(x) - first_mapped, 0, len(data) - 1)]``.

    PS3.3 C.11.1.1 / C.11.2.1.1: inputs below the first mapped value take the first entry,
    inputs past the end take the last. Returns ``data``'s dtype, ``x``'s shape.
    """
    index = np.floor(np.asarray(x, dtype=np.float64)) - first_mapped
    index = np.clip(index, 0, len(data) - 1).astype(np.intp)
    return np.asarray(data)[index]


def apply_modality(stored: np.ndarray, slope: float = 1.0, intercept: float = 0.0) -> np.ndarray:
    """Rescale stored values to modality values: ``stored * slope + intercept`` (PS3.3 C.11.1).

    Returns float64 of ``stored``'s shape (HU for CT).
    """
    return np.asarray(stored, dtype=np.float64) * float(slope) + float(intercept)


def apply_modality_lut(stored: np.ndarray, first_mapped: int, lut_data: np.ndarray) -> np.ndarray:
    """Map stored values through a Modality LUT Sequence item (PS3.3 C.11.1.1).

    ``first_mapped`` is LUT Descriptor value 2 (the first stored value mapped), ``lut_data``
    the LUT Data entries. Returns float64 modality values of ``stored``'s shape.
    """
    return lookup(stored, first_mapped, np.asarray(lut_data)).astype(np.float64)


def voi_lut_bits(declared: int, lut_data: np.ndarray) -> int:
    """The bits per entry a VOI LUT's output range is read in: the declared ones (LUT Descriptor
    value 3), unless the LUT Data never reach the upper half of that range, and then the bits its
    largest entry needs (at least 8). Some devices (notably Agfa CRs) declare 16 bits for LUT
    Data of 12; divided by 65535 such an image comes out nearly black (nearly white once a
    MONOCHROME1 image is inverted). dcm4che (#413), Horos, Cornerstone and dicom-rs read the
    range from the data the same way; a LUT that uses its declared range is read as declared.

    Conversely, LUT Data past the declared range (16-bit entries up to 65520 under a descriptor of
    12 bits, a known writer bug) are read over the smallest range that holds them (16 bits at
    most, the most a LUT Data word holds), not clipped: divided by 4095 such an image came out
    nearly all white. The palette's entries above 255 under 8-bit descriptors are read the same way.
    A stray few past the range (at most 1 entry in 100, or one in a shorter LUT: a LUT written as
    round(i * 4096 / 4095) whose last entry is 4096) are the writer's rounding, not a wider range:
    read as declared and clipped, as pydicom's apply_voi does, since widening by them would halve
    the whole image."""
    data = np.asarray(lut_data)
    if data.size == 0:
        return declared
    largest = int(data.max())
    if largest > (1 << declared) - 1:
        past = int(np.count_nonzero(data > (1 << declared) - 1))
        return min(16, largest.bit_length()) if past > max(1, data.size // 100) else declared
    if declared <= 8 or largest < 0 or largest >= 1 << (declared - 1):
        return declared
    return max(8, largest.bit_length())


def apply_voi_lut(x: np.ndarray, lut_descriptor: tuple[int, int, int], lut_data: np.ndarray,
                  dtype: type[np.floating] = np.float32) -> np.ndarray:
    """Map modality values through a VOI LUT Sequence item onto [0, 1] (PS3.3 C.11.2.1.1).

    ``lut_descriptor`` = (number of entries, 0 meaning 65536; first input value mapped;
    bits per entry n). Entries are divided by ``2**n - 1``, the LUT's nominal output range,
    with n as :func:`voi_lut_bits` reads it. Returns ``dtype`` (as :func:`apply_window`) in
    [0, 1] of ``x``'s shape.
    """
    entries, first_mapped, bits = (int(v) for v in lut_descriptor)
    data = np.asarray(lut_data, dtype=np.float64)[: entries or 65536]
    if data.size == 0:
        raise ValueError("VOI LUT Sequence item has an empty (0028,3006) LUT Data")
    if not 1 <= bits <= 16:
        raise ValueError(f"VOI LUT Descriptor (0028,3002) gives {bits} bits per entry; expected 8 or 10-16")
    out = lookup(x, first_mapped, data) / float(2 ** voi_lut_bits(bits, data) - 1)
    return np.clip(out, 0.0, 1.0).astype(dtype, copy=False)


def padding_mask(stored: np.ndarray, padding_value: float | None, range_limit: float | None = None) -> np.ndarray:
    """Boolean mask of padding pixels, on *stored* values (PS3.3 C.7.5.1.1.2).

    With only Pixel Padding Value (0028,0120) the mask is ``stored == padding_value``; with
    Pixel Padding Range Limit (0028,0121) too, every value between the two, inclusive, in
    either order. No padding value gives an all-False mask. Same shape as ``stored``. Float
    Pixel Data's (0028,0122)/(0028,0124) and Double Float Pixel Data's (0028,0123)/(0028,0125)
    are floats, compared as such.
    """
    stored = np.asarray(stored)
    if padding_value is None:
        return np.zeros(stored.shape, dtype=bool)
    if range_limit is None:
        return stored == padding_value
    low, high = sorted((padding_value, range_limit))
    return (stored >= low) & (stored <= high)


def invert_monochrome1(y: np.ndarray) -> np.ndarray:
    """``1 - y`` for [0, 1] display values of a MONOCHROME1 image (PS3.3 C.7.6.3.1.2).

    Apply *after* the VOI transform. Returns float64 for float64 ``y`` (16-bit output), else
    float32; same shape.
    """
    values = np.asarray(y)
    if values.dtype == np.float64:
        return 1.0 - values
    return (1.0 - np.asarray(values, dtype=np.float32)).astype(np.float32)
