"""Decoded DICOM frames + their per-frame attributes → packer Samples.

The array maths lives in :mod:`packer.transform.dicom` and :mod:`packer.transform.window`; this
module walks the frames, looks up each frame's modality and VOI parameters
(:mod:`packer.read.dicom_attrs`), resolves the requested windows, and assembles keys and
metadata. Defects become one :class:`~packer.records.Issue` for the whole file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import xxhash
from pydicom.dataset import Dataset
from pydicom.multival import MultiValue

from packer.config import DicomTransformConfig, WindowSpec
from packer.keys import frame_key
from packer.read.dicom_attrs import (
    NO_FILE_VOI,
    DamagedElement,
    MalformedValue,
    checked_pixel_spacing,
    displays_inverted,
    file_voi,
    modality_transform,
    pixel_spacing,
    resolve_window,
    slice_thickness,
    text_value,
)
from packer.read.series import NO_ONE_RESCALE, SPACING_TOLERANCE, constant_slice_note
from packer.records import Issue, Sample, SampleRef
from packer.transform.dicom import (
    UNROUNDED,
    ModalityTransform,
    VoiTransform,
    apply_voi,
    display_dtype,
    finish_image,
    finish_stored,
    keeps_geometry,
    output_content,
    output_spacing,
    quantise,
    render_color,
    render_luma,
    render_modality_float,
    spacing_size,
    to_modality_values,
)
from packer.transform.intensity import apply_zscore, percentile_stats, zscore_black, zscore_scale, zscore_stats
from packer.transform.window import padding_mask

GRAYSCALE = ("MONOCHROME1", "MONOCHROME2")


def _issue(ref: SampleRef, stage: str, reason: str, message: str) -> Issue:
    return Issue.of(ref, stage=stage, reason=reason, message=f"{ref.relpath or ref.path}: {message}")


def _as_int(value: Any, *, signed: bool, little_endian: bool) -> int | None:
    """A US/SS element value as an int, read as SS for signed pixels and US for unsigned whichever
    VR the file used; raw 2-byte values (VR left ambiguous) are unpacked."""
    if value is None or value == "":
        return None
    if isinstance(value, bytes):
        if len(value) != 2:
            return None
        return int(struct.unpack(("<" if little_endian else ">") + ("h" if signed else "H"), value)[0])
    if isinstance(value, list | tuple | MultiValue):
        value = value[0] if value else None
    if isinstance(value, bool) or not isinstance(value, int | None):
        raise DamagedElement(f"{value!r} is not a 16-bit integer")
    # US or SS by Pixel Representation: a writer's US 63536 over signed pixels is -2000, as the
    # LUT Descriptor's first value is re-read (16 bits either way: the VR holds nothing wider)
    if value is not None and signed and 32768 <= value < 65536:
        return value - 65536
    if value is not None and not signed and -32768 <= value < 0:
        return value + 65536
    return value


def _in_bits_stored(value: int | None, bits_stored: Any, *, signed: bool) -> int | None:
    """``value`` reduced to its low ``bits_stored`` bits, sign-extended where ``signed``: the
    reduction the reader applies to the stored pixels (PS3.5 8.1.1: the bits above High Bit are
    no pixel data), so that a padding value written with those bits set (0xFFFF over 12-bit
    pixels, read as 4095) still equals the pixels it marks. A value already in Bits Stored's
    range comes back unchanged; so does every value where Bits Stored is missing or not below 16
    (the width of the US/SS element)."""
    if value is None or isinstance(bits_stored, bool) or not isinstance(bits_stored, int) or not 0 < bits_stored < 16:
        return value
    kept = value & ((1 << bits_stored) - 1)
    if not signed:
        return kept
    sign = 1 << (bits_stored - 1)
    return (kept ^ sign) - sign


def padding_values(ds: Dataset) -> tuple[int | None, int | None]:
    """(Pixel Padding Value (0028,0120), Pixel Padding Range Limit (0028,0121)), stored values:
    reduced to (0028,0101) Bits Stored as the pixels are, so the two compare in one domain.
    Raises :class:`DamagedElement` when either is not an integer."""
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    little = str(ds.file_meta.get("TransferSyntaxUID", "")) != "1.2.840.10008.1.2.2"
    try:
        value = _as_int(ds.get("PixelPaddingValue"), signed=signed, little_endian=little)
        limit = _as_int(ds.get("PixelPaddingRangeLimit"), signed=signed, little_endian=little)
    except DamagedElement as err:
        raise DamagedElement(f"(0028,0120) Pixel Padding Value / (0028,0121) Range Limit: {err}") from err
    bits_stored = ds.get("BitsStored")
    value = _in_bits_stored(value, bits_stored, signed=signed)
    limit = _in_bits_stored(limit, bits_stored, signed=signed)
    return (value, limit if value is not None else None)


#: Float Pixel Data's and Double Float Pixel Data's own padding elements (PS3.3 C.7.6.24,
#: C.7.5.1.1.2): (value keyword, range limit keyword, the pair's tags as messages name them).
_FLOAT_PADDING = {
    "FloatPixelData": ("FloatPixelPaddingValue", "FloatPixelPaddingRangeLimit",
                       "(0028,0122) Float Pixel Padding Value / (0028,0124) Range Limit"),
    "DoubleFloatPixelData": ("DoubleFloatPixelPaddingValue", "DoubleFloatPixelPaddingRangeLimit",
                             "(0028,0123) Double Float Pixel Padding Value / (0028,0125) Range Limit"),
}


def _as_float(value: Any) -> float | None:
    """An FL/FD element value as a float; None when absent or empty."""
    if isinstance(value, list | tuple | MultiValue):
        value = value[0] if value else None
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DamagedElement(f"{value!r} is not a number")
    return float(value)


def _float_padding(ds: Dataset) -> tuple[tuple[float | None, float | None], str] | None:
    """(padding value, range limit) of a Float or Double Float Pixel Data image that carries its
    float padding value, and the pair's tags; None for any other. Raises
    :class:`DamagedElement` when either is not a number."""
    for pixels, (value_key, limit_key, named) in _FLOAT_PADDING.items():
        if pixels in ds and ds.get(value_key) is not None:
            try:
                value, limit = _as_float(ds.get(value_key)), _as_float(ds.get(limit_key))
            except DamagedElement as err:
                raise DamagedElement(f"{named}: {err}") from err
            return (value, limit if value is not None else None), named.split(" / ")[0]
    return None


def frame_padding(ds: Dataset, stored: np.ndarray) -> tuple[np.ndarray, str]:
    """The padding mask of grey ``stored`` pixels (any shape; the decoded values) and the
    element that marks it, as messages name it: Float Pixel Data's (0028,0122) Float Pixel
    Padding Value and (0028,0124) Range Limit, Double Float Pixel Data's (0028,0123) and
    (0028,0125), compared as floats (PS3.3 C.7.5.1.1.2: (0028,0120) is for integer pixels);
    else (0028,0120)/(0028,0121) (:func:`padding_values`; also read, as it always was, where a
    float image carries it instead of its own). Raises :class:`DamagedElement`."""
    floats = _float_padding(ds)
    if floats is not None:
        return padding_mask(stored, *floats[0]), floats[1]
    return padding_mask(stored, *padding_values(ds)), "(0028,0120) Pixel Padding Value"


def _constant(stored: np.ndarray, mask: np.ndarray | None, photometric: str = "",
              padding: str = "(0028,0120) Pixel Padding Value") -> str | None:
    """Why the image carries no information (all real pixels equal), or None.

    ``stored`` is (frames, H, W, samples), as decoded; ``mask`` (frames, H, W) marks padding,
    which the element ``padding`` marks.
    A YBR file's pixels were converted to RGB by the decoder and a palette's looked up, so the
    value quoted for ``photometric`` other than grayscale and RGB is said to be that RGB value,
    not the stored one (all-zero YBR samples are [0, 135, 0] in RGB)."""
    flat = stored.reshape(-1, stored.shape[-1])
    if mask is not None and mask.any():  # copying out the real pixels only when there is padding
        flat = flat[~mask.reshape(-1)]
        if flat.shape[0] == 0:
            return f"every pixel equals the {padding}"
    # a sparse probe rejects almost every real image at once; the full comparison runs only
    # when ~64 spread-out pixels all equal the first one
    if flat.shape[0] and bool((flat[:: max(1, len(flat) // 64)] == flat[0]).all()) and bool((flat == flat[0]).all()):
        if photometric in (*GRAYSCALE, "RGB", ""):
            return f"every pixel has the same stored value {flat[0].tolist()}"
        how = "through its palette" if photometric == "PALETTE COLOR" else "after the decoder's colour conversion"
        return f"every pixel has the same RGB value {flat[0].tolist()} ((0028,0004) {photometric}, {how})"
    return None


def _normalised(spec: WindowSpec, values: np.ndarray, padding: np.ndarray, frame: int) -> VoiTransform:
    """A percentiles window of one frame: the percentiles of its modality values (padding left
    out) as the LINEAR_EXACT window from the low to the high one (which maps them to 0 and 1 and
    clips outside: :mod:`packer.transform.intensity`), its statistics recorded. Where the two
    percentiles are one value (most of the frame shares it: all air, or a sparse frame) the
    window has width 0 and the clip decides alone, as the README says and NIfTI volumes read:
    a value at or below it is 0, one above it 1 (:func:`packer.transform.dicom.apply_voi`)."""
    stats = percentile_stats(values[~padding], float(spec.low or 0.0), float(spec.high or 100.0), spec.over or "all")
    low, high = float(stats.low or 0.0), float(stats.high or 0.0)
    return VoiTransform(name=spec.name, function="LINEAR_EXACT", source="percentiles",
                        center=(low + high) / 2 if high > low else low, width=max(high - low, 0.0),
                        stats=tuple(stats.to_json().items()))


def _resolve_vois(ref: SampleRef, ds: Dataset, frame: int, modality: ModalityTransform,
                  cfg: DicomTransformConfig, stored: np.ndarray | None = None,
                  padding: np.ndarray | None = None, values: np.ndarray | None = None
                  ) -> tuple[VoiTransform, ...] | Issue:
    """The requested windows for ``frame``, in order; a ``file`` window the file cannot give is
    replaced by ``cfg.fallback_window``, and without one the file is a ``missing_window`` issue.
    A percentiles window takes its statistics from the frame (``stored`` values, ``padding``;
    ``values``: their modality values, where the caller has them already)."""
    broken: str | None = None
    try:
        offer = file_voi(ds, frame, modality)
    except DamagedElement:
        raise
    except ValueError as err:
        offer, broken = NO_FILE_VOI, f"the file's (0028,3010) VOI LUT Sequence is malformed ({err})"

    def resolve(spec: WindowSpec, fallback: bool) -> VoiTransform | str:
        nonlocal values
        if broken is not None and spec.kind == "file":
            return broken
        if spec.kind == "percentiles":
            if stored is None or padding is None:
                raise ValueError("a percentiles window needs the frame's stored values")
            if values is None:
                values = to_modality_values(stored, modality)
            got = _normalised(spec, values, padding, frame)
            # a fallback says so, as resolve_window's fallback_<kind>: a percentiles window standing in
            # for a file's missing one is told from one the job asked for
            return replace(got, source="fallback_percentiles") if fallback else got
        return resolve_window(spec, offer, fallback=fallback)

    vois = []
    for spec in cfg.windows_for(text_value(ds, "Modality")):
        got = resolve(spec, False)
        if isinstance(got, str) and cfg.fallback_window is not None:
            fallback = resolve(cfg.fallback_window, True)
            got = fallback if not isinstance(fallback, str) else f"{got}; fallback window: {fallback}"
        if isinstance(got, str):
            return _issue(ref, "validate", "missing_window",
                          f"window {spec.to_json()} for frame {frame}: {got}; set "
                          "transform.dicom.fallback_window (e.g. a preset) or request a preset/explicit window")
        vois.append(got)
    return tuple(vois)


def _frame_metadata(ds: Dataset, frame: int, modality: ModalityTransform | None,
                    vois: tuple[VoiTransform, ...], spacing: tuple[float, float] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "pixel_spacing": list(spacing) if spacing else None,
        "slice_thickness": slice_thickness(ds, frame),
        "rescale_slope": None, "rescale_intercept": None, "modality_lut": False,
        "windows": [v.to_json() for v in vois],
    }
    if modality is not None:
        meta["modality_lut"] = modality.lut is not None
        if modality.lut is None:
            meta["rescale_slope"], meta["rescale_intercept"] = modality.slope, modality.intercept
        if modality.dose_grid_scaling is not None:
            meta["dose_grid_scaling"] = modality.dose_grid_scaling
            meta["dose_units"] = str(ds.get("DoseUnits", "") or "") or None
    if text_value(ds, "Modality") == "PT":  # Bq/ml, counts, SUV...: its values mean nothing without it
        meta["pet_units"] = (text_value(ds, "Units") or "").upper() or None
    return meta


def _rescale_defect(ref: SampleRef, stored: np.ndarray, padding: np.ndarray, modality: ModalityTransform,
                    frame: int) -> Issue | None:
    """Stored values that are not numbers (NaN or infinity in Float Pixel Data: ``non_finite``,
    said so), or a Rescale Slope/Intercept that are numbers yet no usable map for this frame's
    stored values (H×W; ``padding`` marks pixels left out): one that overflows float64 (a slope of 1e308:
    ``non_finite``, every windowed pixel white), or one under which the lowest and the highest
    stored value land on the same float64 (an intercept of 1e20, a slope of 1e-30:
    ``constant_image``, one flat grey under any window, as with a slope of 0). The map is linear,
    so the extremes decide for every pixel; a frame whose stored values are all equal is left to
    the constant check of its stored values."""
    real = stored[~padding] if padding.any() else stored
    if real.size == 0:
        return None
    if real.dtype.kind == "f" and not np.isfinite(real).all():  # Float / Double Float Pixel Data
        bad = int(np.count_nonzero(~np.isfinite(real)))
        return _issue(ref, "validate", "non_finite",
                      f"frame {frame}: {bad} of {real.size} pixel values of the float pixel data are NaN or "
                      "infinite (the values themselves, before any rescale); re-export the file from its source")
    low, high = real.min(), real.max()
    with np.errstate(over="ignore", invalid="ignore"):
        ends = to_modality_values(np.array([[low, high]], dtype=np.float64), modality)[0]
    where = (f"frame {frame}: (0028,1053) Rescale Slope {modality.slope:g} and (0028,1052) Rescale Intercept "
             f"{modality.intercept:g} take stored values {low:g}..{high:g} to {ends[0]:g}..{ends[1]:g}")
    if not np.isfinite(ends).all():
        return _issue(ref, "validate", "non_finite", f"{where}, beyond float64: the header is corrupt, fix it")
    if low != high and ends[0] == ends[1]:
        return _issue(ref, "validate", "constant_image",
                      f"{where}: every pixel becomes the same value and the image would carry no information; "
                      "the header is corrupt, fix it")
    return None


def _rescale_flattens(ref: SampleRef, stored: np.ndarray, padding: np.ndarray, modality: ModalityTransform,
                      frame: int) -> Issue | None:
    """``constant_image`` where ``output: float16`` without a window packs this frame's modality
    values and a Rescale Slope/Intercept takes its distinct stored values (H×W, ``padding`` left
    out) to modality values float64 keeps apart (:func:`_rescale_defect` passed them) but float16
    does not, while it does keep the stored values apart: the rescale collapsed them (a slope of
    1e-30 with intercept 0 gives 1e-30..3e-27, all 0.0 in float16), and every packed pixel would
    be that one value. Monotone, so the lowest and the highest stored value decide. Not judged:
    ends past float16's range (both inf: the render's ``non_finite`` says so, with its fix), a
    window (it renders the float64 values: a job's window that clips them is the job's choice, a
    file's own is :func:`_flat_windows`'s), a series' slice (context, as a constant one is: the
    caller's ``by_series`` guard)."""
    real = stored[~padding] if padding.any() else stored
    if real.size == 0:
        return None
    low, high = real.min(), real.max()
    ends = to_modality_values(np.array([[low, high]], dtype=np.float64), modality)
    with np.errstate(over="ignore"):
        halves = ends.astype(np.float16)
    if (low == high or not np.isfinite(halves).all() or halves[0, 0] != halves[0, 1]
            or np.float16(low) == np.float16(high)):
        return None
    return _issue(ref, "validate", "constant_image",
                  f"frame {frame}: (0028,1053) Rescale Slope {modality.slope:g} and (0028,1052) Rescale Intercept "
                  f"{modality.intercept:g} take stored values {low:g}..{high:g} to {ends[0, 0]:g}..{ends[0, 1]:g}, "
                  f"one value, {float(halves[0, 0]):g}, in float16, as output float16 packs them: every pixel would "
                  "be that value and the image would carry no information; the header is corrupt, fix it")


def _flat_windows(ref: SampleRef, stored: np.ndarray, padding: np.ndarray, modality: ModalityTransform,
                  vois: tuple[VoiTransform, ...], output: str, frame: int) -> Issue | None:
    """``constant_image`` when the file's own windows (Window Center/Width, every channel's)
    turn every real pixel of the frame (stored H×W, ``padding`` left out) into one output level
    although its stored values differ: a Window Width of 1e30 maps them all to 128, a flat grey
    square, a damaged header. Rescale and windows are monotone, so the lowest and the highest
    stored value decide for every pixel. Not judged: a window the job names (a preset, an
    explicit or fallback one: a CT window on a radiograph may be flat, but it is the job's
    choice), a Modality or VOI LUT (no such order), ``float16`` output (no levels)."""
    if (output not in ("uint8", "uint16") or modality.lut is not None
            or any(voi.source != "file" or voi.lut is not None for voi in vois)):
        return None
    real = stored[~padding] if padding.any() else stored
    if real.size == 0 or real.min() == real.max():
        return None
    low, high = real.min(), real.max()
    values = to_modality_values(np.array([[low, high]], dtype=np.float64), modality)
    levels = [quantise(apply_voi(values, voi, display_dtype(output))[:, :, None], output)[0, :, 0].tolist()
              for voi in vois]
    if any(pair[0] != pair[1] for pair in levels):
        return None
    named = ", ".join(f"Window Center {voi.center:g} / Window Width {voi.width:g} → {pair[0]}"
                      for voi, pair in zip(vois, levels, strict=True))
    return _issue(ref, "validate", "constant_image",
                  f"frame {frame}: its stored values {low:g}..{high:g} (modality values {values[0, 0]:g}.."
                  f"{values[0, 1]:g}) all come out as one level under the file's (0028,1050)/(0028,1051) window(s): "
                  f"{named}; the sample would carry no information; fix the file's window, or request a preset "
                  "or explicit window")


def _flat_file_luts(ref: SampleRef, array: np.ndarray, stored: np.ndarray, padding: np.ndarray,
                    modality: ModalityTransform, vois: tuple[VoiTransform, ...], frame: int) -> Issue | None:
    """:func:`_flat_windows` where a LUT is in play (a Modality LUT, or a VOI LUT of the file),
    which need not be monotone: judged on the rendered frame (``array``, C×H×W): every channel
    one value, the stored values (``padding`` left out) not, every channel from the file's own
    windows or VOI LUTs: ``constant_image``. (Padding, rendered 0, keeps such a frame: no verdict
    then.)"""
    if (not vois or (modality.lut is None and not any(voi.lut is not None for voi in vois))
            or any(voi.source not in ("file", "file_lut") for voi in vois)
            or array.dtype.kind not in "ui" or not all(channel.min() == channel.max() for channel in array)):
        return None
    real = stored[~padding] if padding.any() else stored
    if real.size == 0 or real.min() == real.max():
        return None
    named = ", ".join((f"VOI LUT {voi.lut.explanation!r}" if voi.lut.explanation else f"VOI LUT ({voi.name})")
                      if voi.lut is not None else
                      f"Window Center {voi.center:g} / Window Width {voi.width:g}" for voi in vois)
    behind = " behind its (0028,3000) Modality LUT" if modality.lut is not None else ""
    return _issue(ref, "validate", "constant_image",
                  f"frame {frame}: its stored values {real.min():g}..{real.max():g} all come out as one level under "
                  f"the file's own {named}{behind} (output {[int(c.flat[0]) for c in array]}); the sample would "
                  "carry no information; fix the file's (0028,3010) VOI LUT Sequence or window, or request a preset "
                  "or explicit window")


def _render_frame(ref: SampleRef, ds: Dataset, stored: np.ndarray, frame: int, mask: np.ndarray | None,
                  cfg: DicomTransformConfig, photometric: str, color_bits: int,
                  resample_from: tuple[float, float] | None,
                  luma: bool = False, inverted: bool = False) -> tuple[np.ndarray, dict[str, Any]] | Issue:
    """One frame → (its C×H×W output array, frame metadata) or an Issue. ``resample_from``: the
    Pixel Spacing a ``transform.dicom.spacing`` resample starts from (this frame's, or frame 0's
    for a stack). ``luma``: a colour frame becomes its one-channel luma (:func:`render_luma`).
    ``inverted``: a grey frame displays its minimum white
    (:func:`~packer.read.dicom_attrs.displays_inverted`)."""
    spacing = pixel_spacing(ds, frame)
    # a resampled volume's slice stays unrounded (float32): the volume is quantised once, resampled
    output = UNROUNDED if cfg.unrounded else cfg.output

    def finish(image: np.ndarray, pad_value: float | Sequence[float] = 0.0) -> np.ndarray:
        return finish_image(image, pixel_spacing=resample_from, spacing=cfg.spacing, size=cfg.size,
                            policy=cfg.resize, output=output, pad_value=pad_value)

    if photometric not in GRAYSCALE:
        # an unrounded slice is finished as a resampled frame is: its display values, then ``finish``
        keeps = not cfg.unrounded and keeps_geometry(*stored.shape[:2], pixel_spacing=resample_from,
                                                     spacing=cfg.spacing, size=cfg.size)
        if luma:
            image = render_luma(stored, color_bits, cfg.output, keeps_grid=keeps)
            return (image if keeps else finish(image)), _frame_metadata(ds, frame, None, (), spacing)
        return (finish(render_color(stored, color_bits, display_dtype(cfg.output, keeps))),
                _frame_metadata(ds, frame, None, (), spacing))
    if mask is None:
        mask = np.zeros(stored.shape[:2], dtype=bool)
    try:
        modality = modality_transform(ds, frame)
    except DamagedElement:
        raise
    except ValueError as err:
        return _issue(ref, "read", "decode_failed", f"(0028,3000) Modality LUT Sequence is malformed: {err}")
    if modality.lut is None and modality.slope == 0:
        return _issue(ref, "validate", "constant_image",
                      f"frame {frame}: (0028,1053) Rescale Slope is 0, so every stored value becomes the intercept "
                      f"{modality.intercept:g}: the image would carry no information; fix the header")
    if modality.lut is None:
        flat = _rescale_defect(ref, stored[:, :, 0], mask, modality, frame)
        if flat is not None:
            return flat
    specs = cfg.windows_for(text_value(ds, "Modality"))
    if cfg.output == "float16" and any(spec.normalises for spec in specs):
        return _render_normalised(ref, ds, stored[:, :, 0], frame, mask, modality, cfg, specs, inverted, spacing,
                                  finish)
    if cfg.output == "float16":
        # a series' near-constant slice is context, as a constant one is
        if modality.lut is None and not cfg.by_series and (
                flat := _rescale_flattens(ref, stored[:, :, 0], mask, modality, frame)) is not None:
            return flat
        # on the frame's own grid float64, cast once to float16; resized, resampled or unrounded float32
        keeps = not cfg.unrounded and keeps_geometry(*stored.shape[:2], pixel_spacing=resample_from,
                                                     spacing=cfg.spacing, size=cfg.size)
        try:
            image = render_modality_float(to_modality_values(stored[:, :, 0], modality), padding=mask,
                                          monochrome1=inverted, keeps_grid=keeps)
        except ValueError as err:  # values float16 cannot hold would be infinite: non_finite, as the README says
            return _issue(ref, "transform", "non_finite",
                          f"frame {frame}: {err}; use output uint8/uint16 with a window instead of float16")
        # the border fit pads with displays black too: an inverted display's largest value, inverted later
        black = float(image.max() if inverted else image.min())
        return finish(image, black), _frame_metadata(ds, frame, modality, (), spacing)
    vois = _resolve_vois(ref, ds, frame, modality, cfg, stored[:, :, 0], mask)
    if isinstance(vois, Issue):
        return vois
    if not cfg.by_series:  # a series' blank slice is context, as a constant one is
        flat = _flat_windows(ref, stored[:, :, 0], mask, modality, vois, cfg.output, frame)
        if flat is not None:
            return flat
    array = finish_stored(stored[:, :, 0], modality, vois, monochrome1=inverted,
                          padding=padding_values(ds), mask=mask, pixel_spacing=resample_from, spacing=cfg.spacing,
                          size=cfg.size, policy=cfg.resize, output=output)
    if not cfg.by_series:
        flat = _flat_file_luts(ref, array, stored[:, :, 0], mask, modality, vois, frame)
        if flat is not None:
            return flat
    return array, _frame_metadata(ds, frame, modality, vois, spacing)


def _render_normalised(ref: SampleRef, ds: Dataset, stored: np.ndarray, frame: int, padding: np.ndarray,
                       modality: ModalityTransform, cfg: DicomTransformConfig, specs: tuple[WindowSpec, ...],
                       inverted: bool, spacing: tuple[float, float] | None,
                       finish: Callable[[np.ndarray, list[float]], np.ndarray]
                       ) -> tuple[np.ndarray, dict[str, Any]] | Issue:
    """A grey frame with ``output: float16`` and a normalisation among its windows: every window is
    a channel (windows and percentiles in [0, 1], ``inverted`` (MONOCHROME1, or MONOCHROME2 under
    Presentation LUT Shape INVERSE) as displayed; a z-score of the frame's modality values over its
    non-padding (``over: nonzero``: non-zero) pixels, negated where ``inverted`` so that bright
    means dense there too, its record ``inverted: true``), padding
    and fit's border black (0; a z-score over all pixels: the frame's lowest, since 0 is its mean:
    :func:`~packer.transform.intensity.zscore_black`). (Without a
    normalisation, float16 keeps its meaning: one channel of modality values.)
    ``specs``: the frame's windows (``cfg.windows_for`` its Modality)."""
    values = to_modality_values(stored, modality)
    fixed = tuple(spec for spec in specs if spec.kind != "zscore")
    vois = _resolve_vois(ref, ds, frame, modality, replace(cfg, windows=fixed, modality_windows=()), stored, padding,
                         values) if fixed else ()
    if isinstance(vois, Issue):
        return vois
    by_spec = dict(zip(fixed, vois, strict=True))
    channels, records, blacks = [], [], []
    for spec in specs:
        if spec.kind == "zscore":
            stats = zscore_stats(values[~padding], spec.over or "nonzero")
            try:
                zscore_scale(stats)
            except ValueError as err:
                return _issue(ref, "transform", "non_finite", f"frame {frame}: {err}")
            channel = apply_zscore(values, stats)
            record = {"name": spec.name, "center": None, "width": None, "function": None, "source": "zscore",
                      **stats.to_json()}
            if inverted:  # inverted as its windows are: -z (a value is mean - z·std)
                np.subtract(np.float32(0.0), channel, out=channel)  # +0.0 where z is 0, never -0.0
                record["inverted"] = True
            records.append(record)
            # padding and fit's border are black: 0 is the mean under over: all, so there the
            # frame's lowest z-score; under nonzero, 0 (the background zeros stay 0 too)
            black = zscore_black(stats, inverted=inverted)
        else:
            voi = by_spec[spec]
            channel = apply_voi(values, voi, monochrome1=inverted)
            records.append(voi.to_json())
            black = 0.0
        channel[padding] = black
        blacks.append(black)
        channels.append(channel.astype(np.float32, copy=False))
    meta = _frame_metadata(ds, frame, modality, (), spacing)
    meta["windows"] = records
    return finish(np.stack(channels, axis=-1), blacks), meta


def _resampled_grids(ds: Dataset, shape: tuple[int, ...], cfg: DicomTransformConfig, stack: bool
                     ) -> Iterator[tuple[int, tuple[float, float], tuple[int, int]]]:
    """(frame, its Pixel Spacing, the H×W it is resampled to) of each frame ``transform.dicom.spacing``
    resamples (frame 0 alone for a stack); none where the job does not resample, or for a frame
    without Pixel Spacing (only resized)."""
    if cfg.spacing is None:
        return
    for frame in range(1 if stack else shape[0]):
        spacing = pixel_spacing(ds, frame)
        if spacing is not None:
            yield frame, spacing, spacing_size(shape[1], shape[2], spacing, cfg.spacing)


def _check_resampled(ref: SampleRef, ds: Dataset, shape: tuple[int, ...], cfg: DicomTransformConfig,
                     stack: bool, max_pixels: int) -> Issue | None:
    """A Pixel Spacing of 1000 mm resampled to 0.5 mm would ask for a 2000× larger image: check the
    size every frame will be resampled to (before rendering any) against ``max_pixels``."""
    for frame, spacing, (height, width) in _resampled_grids(ds, shape, cfg, stack):
        if height * width > max_pixels:
            return _issue(ref, "read", "too_large",
                          f"frame {frame}: (0028,0030) Pixel Spacing {list(spacing)} mm resampled to "
                          f"transform.dicom.spacing {list(cfg.spacing or ())} mm gives {height}×{width} = "
                          f"{height * width} pixels, over limits.max_pixels {max_pixels}; fix the header, or raise "
                          "limits.max_pixels in the job file if the file is genuine")
    return None


def _check_shrunk(ref: SampleRef, ds: Dataset, shape: tuple[int, ...], cfg: DicomTransformConfig,
                  stack: bool) -> Issue | None:
    """A Pixel Spacing written in metres (0.0005 for 0.5 mm) resampled to ``transform.dicom.spacing``
    leaves under one pixel, which ``size`` then scaled back up as an image of one level, packed
    silently. A frame the resample would leave under 2 pixels along an axis it had 2 or more along
    is ``bad_geometry``, naming the Pixel Spacing and the grid it would give."""
    for frame, spacing, (height, width) in _resampled_grids(ds, shape, cfg, stack):
        if (height < 2 <= shape[1]) or (width < 2 <= shape[2]):
            return _issue(ref, "validate", "bad_geometry",
                          f"frame {frame}: (0028,0030) Pixel Spacing {list(spacing)} mm resampled to "
                          f"transform.dicom.spacing {list(cfg.spacing or ())} mm turns its {shape[1]}×{shape[2]} "
                          f"pixels into {height}×{width}: the image ({shape[1] * spacing[0]:g} × "
                          f"{shape[2] * spacing[1]:g} mm) would be gone; a Pixel Spacing written in metres or cm, "
                          "not mm? fix the header")
    return None


def _malformed_spacing(ds: Dataset, frames: Iterable[int]) -> str | None:
    """What is wrong with the first of ``frames``' Pixel Spacing that is there but malformed
    (:func:`~packer.read.dicom_attrs.checked_pixel_spacing`), ``None`` where none is."""
    for frame in frames:
        try:
            checked_pixel_spacing(ds, frame)
        except MalformedValue as err:
            return str(err)
    return None


def render_samples(ref: SampleRef, ds: Dataset, pixels: np.ndarray, cfg: DicomTransformConfig, *,
                   photometric: str, color_bits: int, base_metadata: dict[str, Any],
                   max_pixels: int | None = None) -> list[Sample] | Issue:
    """Decoded ``pixels`` (frames × H × W × samples, native byte order; RGB for colour) → Samples.

    ``frames: split`` gives one sample per frame (key ``<id>-f0000`` when the file has several
    frames); ``stack`` one sample whose channels are frame-major (frame 0's windows first).
    Spacing resampling uses each frame's Pixel Spacing (``split``) or frame 0's (``stack``, whose
    frames must share it: ``bad_shape`` otherwise); when
    a resampled frame would exceed ``max_pixels`` the file is ``too_large`` before any rendering.
    Where the job resamples, a Pixel Spacing that is there but malformed raises
    :class:`~packer.read.dicom_attrs.MalformedValue` (the file is ``unreadable``): only a file
    without one is resized alone; where it does not, the sample records null and says why.

    A file whose every pixel is equal is ``constant_image``, except a slice of a series
    (``cfg.by_series``: neighbour stacks, volumes), where an all-air or all-padding slice at the
    edge of a scan is context: it is rendered, and each of its samples says so in
    ``metadata.warnings`` (:func:`packer.read.series.constant_slice_note`; a series of such slices only is refused when
    it is stacked, :meth:`packer.read.dicom_kind.DicomSeries.combine`).
    """
    frames = pixels.shape[0]
    mask, padded_by = None, "(0028,0120) Pixel Padding Value"
    if photometric in GRAYSCALE:
        mask, padded_by = frame_padding(ds, pixels[..., 0])
    inverted = displays_inverted(ds, photometric)
    if inverted and photometric != "MONOCHROME1":  # what MONOCHROME1 says for itself: a float16 reader inverts
        base_metadata = {**base_metadata, "presentation_lut_shape": "INVERSE"}
    why = _constant(pixels, mask, photometric, padded_by)
    if why is not None and not cfg.by_series:
        return _issue(ref, "validate", "constant_image", f"{why}; the image carries no information")
    if why is not None:
        base_metadata = {**base_metadata, "warnings": [*base_metadata.get("warnings", ()), constant_slice_note(why)]}
    stack = cfg.frames == "stack"
    flat = _flat_frames(pixels, mask, photometric, padded_by) if why is None and frames > 1 else {}
    if len(flat) == frames and not cfg.by_series:  # each frame flat, one grey to the next (a fade, a blank loop)
        return _issue(ref, "validate", "constant_image", _every_frame_constant(flat))
    blank = _constant_frames(flat, cfg) if not stack else {}
    if cfg.spacing is not None:  # resampled by it: a malformed one raises (unreadable), never read as absent
        for frame in range(1 if stack else frames):
            checked_pixel_spacing(ds, frame)
    shrunk = _check_shrunk(ref, ds, pixels.shape, cfg, stack)
    if shrunk is not None:
        return shrunk
    if max_pixels is not None:
        too_big = _check_resampled(ref, ds, pixels.shape, cfg, stack, max_pixels)
        if too_big is not None:
            return too_big
    outputs: list[tuple[np.ndarray, dict[str, Any]]] = []
    boxes: list[tuple[int, int, int, int] | None] = []  # where each frame lies in its output (fit's padding aside)
    spacing0 = pixel_spacing(ds, 0)
    if stack and spacing0 is not None:  # channels of one grid: a frame of another scale would cover another area
        for frame in range(1, frames):
            other = pixel_spacing(ds, frame)
            if other is not None and any(abs(a - b) > SPACING_TOLERANCE * max(abs(b), 1e-9)
                                         for a, b in zip(other, spacing0, strict=True)):
                return _issue(ref, "validate", "bad_shape",
                              f"frame {frame}'s Pixel Spacing {list(other)} mm is not frame 0's {list(spacing0)} mm "
                              "(Pixel Measures per frame): frames of two scales cannot be the channels of one "
                              "sample (frames: stack); set frames: split, which resamples each frame by its own")
    malformed = _malformed_spacing(ds, range(1 if stack else frames)) if cfg.spacing is None else None
    if malformed is not None:  # only recorded, as null: what it should have been is for the user to fix
        base_metadata = {**base_metadata, "warnings": [*base_metadata.get("warnings", ()),
                                                       f"{malformed}; metadata.pixel_spacing is null"]}
    if cfg.spacing is not None and any(pixel_spacing(ds, frame) is None for frame in range(1 if stack else frames)):
        # a radiograph with only Imager Pixel Spacing (0018,1164), a screenshot: nothing says its mm (a
        # malformed one was refused above)
        base_metadata = {**base_metadata, "warnings": [*base_metadata.get("warnings", ()), (
            f"no usable (0028,0030) Pixel Spacing: not resampled to transform.dicom.spacing {list(cfg.spacing)} mm, "
            "only resized; its pixels' size in mm is not the other samples'")]}
    # transform.channels: 1 takes a colour sample's luma (packer.read.kinds.with_channels); taken
    # here, from the unrounded values, it is rounded once, not after each of R, G, B was
    luma = (cfg.channels == 1 and photometric not in GRAYSCALE and not cfg.by_series
            and (not stack or frames == 1))
    if photometric not in GRAYSCALE and (unapplied := _unapplied_windows(ds, cfg, photometric, luma)) is not None:
        base_metadata = {**base_metadata, "warnings": [*base_metadata.get("warnings", ()), unapplied]}
    for frame in range(frames):
        spacing = spacing0 if stack else pixel_spacing(ds, frame)
        rendered = _render_frame(ref, ds, pixels[frame], frame, None if mask is None else mask[frame], cfg,
                                 photometric, color_bits, resample_from=spacing, luma=luma, inverted=inverted)
        if isinstance(rendered, Issue):
            return rendered
        array, meta = rendered
        grid = output_spacing(*pixels.shape[1:3], pixel_spacing=spacing, spacing=cfg.spacing, size=cfg.size,
                              policy=cfg.resize)
        if grid is not None:
            meta["output_spacing"] = grid
        outputs.append((array, meta))
        boxes.append(output_content(*pixels.shape[1:3], pixel_spacing=spacing, spacing=cfg.spacing, size=cfg.size,
                                    policy=cfg.resize))
    presets = _hu_presets_note(ds, cfg, outputs)
    if presets is not None:
        base_metadata = {**base_metadata, "warnings": [*base_metadata.get("warnings", ()), presets]}
    samples = _samples(ref, ds, pixels, cfg, outputs, base_metadata, blank, stack, boxes)
    if luma:  # what with_channels records where it maps the channels itself
        return [replace(s, metadata={**s.metadata, "channels": {"from": 3, "rule": "luma"}}) for s in samples]
    return samples


def _unapplied_windows(ds: Dataset, cfg: DicomTransformConfig, photometric: str, luma: bool) -> str | None:
    """The warning for a colour file under windows or normalisations other than its own
    (``file``, which for colour is the pixels as stored), or a ``fallback_window``: a window maps
    grey values, so colour pixels are packed as stored colour (``luma``: their luma, unwindowed)
    and the job's windows are not applied; None where the job asks for nothing else."""
    modality = text_value(ds, "Modality")
    specs = cfg.windows_for(modality)
    named = [spec.name for spec in specs if spec.kind != "file"]
    if not named and cfg.fallback_window is None:
        return None
    wanted = (modality or "").strip().upper()
    key = (f"transform.dicom.modality_windows.{wanted}" if any(name == wanted for name, _ in cfg.modality_windows)
           else "transform.dicom.windows")
    asked = [f"{key} [{', '.join(spec.name for spec in specs)}]"] if named else []
    if cfg.fallback_window is not None:
        asked.append(f"transform.dicom.fallback_window {cfg.fallback_window.name}")
    packed = "as the luma of its stored colour" if luma else "as stored colour"
    return (f"{' and '.join(asked)}: windows do not apply to colour ({photometric}) pixels: packed {packed}, no "
            "window applied (metadata.windows is empty); a window maps grey values, which a colour file does not hold")


#: The Modality (0008,0060) whose stored values, rescaled, are Hounsfield units: the unit window presets are in.
HU_MODALITY = "CT"


def _hu_presets_note(ds: Dataset, cfg: DicomTransformConfig,
                     outputs: Sequence[tuple[np.ndarray, dict[str, Any]]]) -> str | None:
    """The warning for a file whose Modality is not CT (an MR, a radiograph: values of no unit, or
    of another) that was windowed by a preset, CT's windows in HU (lung, mediastinum), from the job's
    windows or its fallback_window: its values are on another scale, so the channel shows
    nothing a CT's would (an MR above lung's top at 150 HU is one level throughout); None where no
    preset was applied, the Modality is CT or absent, or (0028,1054) Rescale Type says HU (a
    secondary capture of a CT). The sample is packed: the user picks its windows."""
    modality = (text_value(ds, "Modality") or "").strip().upper()
    if not modality or modality == HU_MODALITY or (text_value(ds, "RescaleType") or "").strip().upper() == "HU":
        return None
    applied = {str(w.get("name")): str(w.get("source")) for _, meta in outputs for w in meta.get("windows", ())
               if w.get("source") in ("preset", "fallback_preset")}
    if not applied:
        return None
    asked = []
    chosen = [name for name, source in applied.items() if source == "preset"]
    if chosen:
        key = (f"transform.dicom.modality_windows.{modality}"
               if any(name == modality for name, _ in cfg.modality_windows) else "transform.dicom.windows")
        asked.append(f"{key} [{', '.join(chosen)}]")
    if any(source == "fallback_preset" for source in applied.values()):
        asked.append(f"transform.dicom.fallback_window {cfg.fallback_window.name if cfg.fallback_window else ''}")
    return (f"{' and '.join(asked)}: preset windows are CT windows in Hounsfield units (HU), and this file's "
            f"Modality {modality} stores no HU: packed through them, a channel may be one level throughout; give "
            f"its Modality its own windows: transform.dicom.modality_windows: {{{modality}: [zscore]}} (output: "
            f"float16), {{{modality}: [{{percentiles: [0.5, 99.5]}}]}} or {{{modality}: [file]}}")


def _samples(ref: SampleRef, ds: Dataset, pixels: np.ndarray, cfg: DicomTransformConfig,
             outputs: list[tuple[np.ndarray, dict[str, Any]]], base_metadata: dict[str, Any], blank: dict[int, str],
             stack: bool, boxes: list[tuple[int, int, int, int] | None]) -> list[Sample]:
    """The samples of a file's rendered frames (``outputs``): one per frame, or one stack. ``boxes``:
    where each frame lies in its output (:func:`~packer.transform.dicom.output_content`; a stack's
    frames share frame 0's grid, and so its box), each sample's ``content``."""
    frames = pixels.shape[0]

    def stored(part: np.ndarray) -> str:  # a slice of a series is one part of a stack or volume: none
        return "" if cfg.by_series else stored_digest(part)

    instance = "" if cfg.by_series else instance_digest(ds)  # a series job checks repeated UIDs itself

    if stack:
        image = np.ascontiguousarray(np.concatenate([a for a, _ in outputs], axis=0))
        meta = {**base_metadata, **outputs[0][1]}
        meta["windows"] = [{**w, "frame": i} for i, (_, m) in enumerate(outputs) for w in m["windows"]]
        if frames > 1:
            meta["frame_rescale"] = [[m["rescale_slope"], m["rescale_intercept"]] for _, m in outputs]
            if any(pair != meta["frame_rescale"][0] for pair in meta["frame_rescale"][1:]):
                meta.update(NO_ONE_RESCALE)  # frame 0's pair holds for frame 0 only
        return [Sample(key=ref.sample_id, ref=ref, image=image, metadata=meta, stored_digest=stored(pixels),
                       instance=instance, content=boxes[0])]
    if frames == 1:
        return [Sample(key=ref.sample_id, ref=ref, image=outputs[0][0], metadata={**base_metadata, **outputs[0][1]},
                       stored_digest=stored(pixels[0]), instance=instance, content=boxes[0])]
    return [Sample(key=frame_key(ref.sample_id, i, frames), ref=ref, image=array,
                   metadata={**base_metadata, **meta, "frame": i,
                             **({"warnings": [*base_metadata.get("warnings", ()), blank[i]]} if i in blank else {})},
                   stored_digest=stored(pixels[i]), instance=instance, content=boxes[i])
            for i, (array, meta) in enumerate(outputs)]


def _flat_frames(pixels: np.ndarray, mask: np.ndarray | None, photometric: str = "",
                 padding: str = "(0028,0120) Pixel Padding Value") -> dict[int, str]:
    """Frame → why it carries no information (:func:`_constant`), for each frame of a multi-frame
    file whose every real pixel is equal."""
    flat: dict[int, str] = {}
    for frame in range(pixels.shape[0]):
        why = _constant(pixels[frame:frame + 1], None if mask is None else mask[frame:frame + 1], photometric, padding)
        if why is not None:
            flat[frame] = why
    return flat


def _every_frame_constant(flat: dict[int, str]) -> str:
    """The ``constant_image`` message of a file whose every frame is flat, each frame's value
    another (the file as a whole is not constant): its first frames' values, then how many more."""
    shown = "; ".join(f"frame {frame}: {why}" for frame, why in list(flat.items())[:3])
    more = f"; and {len(flat) - 3} more" if len(flat) > 3 else ""
    return (f"every one of its {len(flat)} frames is constant ({shown}{more}): no frame carries information, "
            "whether packed one sample per frame or stacked as channels; remove the file")


def _constant_frames(flat: dict[int, str], cfg: DicomTransformConfig) -> dict[int, str]:
    """Frame → the warning its sample carries, for each ``flat`` frame (:func:`_flat_frames`) of a
    multi-frame file split into samples (neither the file as a whole nor every frame of it
    constant: those are ``constant_image``): a slice of a series (``cfg.by_series``) is context, as
    a constant single-frame slice is, and is counted as one; a frame packed on its own says it
    carries no information, so that a blank frame among a file's good ones is seen (the file is
    not a bad sample: its other frames are good)."""
    return {frame: constant_slice_note(why) if cfg.by_series else (
                f"constant frame: {why} in frame {frame}; it carries no information, but the file's other frames "
                "do, so it is packed with them (a file whose every frame is constant is a constant_image bad sample)")
            for frame, why in flat.items()}


def instance_digest(ds: Dataset) -> str:
    """A digest (32 hex) of the file's (0008,0018) SOP Instance UID, ``""`` where it has none.
    The UID is unique to one image the world over (PS3.5 9.1): two patients' files with one are a
    mix-up (a header edited, an anonymiser that mapped two files onto one UID). Digested, since a
    UID is an identifier (PS3.15 Annex E) and the build cache keeps what this returns."""
    uid = str(ds.get("SOPInstanceUID", "") or "").strip()
    return xxhash.xxh3_128(uid.encode()).hexdigest() if uid else ""


def stored_digest(pixels: np.ndarray) -> str:
    """A digest (32 hex) of decoded stored pixels (a frame, or a file's frames), their shape and
    type included: a file saved again under another patient, with new UIDs, other window tags or
    another lossless transfer syntax, has the same one, so the split keeps the two copies together
    and the audit reports them as exact duplicates however each is windowed."""
    array = np.ascontiguousarray(pixels)
    digest = xxhash.xxh3_128(f"{array.dtype.str}{array.shape}".encode())  # 8 µs a 512×512 slice; blake2b: 740
    digest.update(array.data)
    return digest.hexdigest()
