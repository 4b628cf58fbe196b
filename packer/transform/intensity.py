"""Intensity normalisation where there is no calibrated unit (MR): percentile clipping and z-scores.

CT values are Hounsfield units after the modality LUT (DICOM) or ``scl_slope`` (NIfTI), so a
window (:mod:`packer.transform.window`) means the same on every scanner. MR values have no
unit: they differ between scanners, sequences and sessions, and a fixed window means nothing.
The two schemes the field uses instead, both computed from the image's own values:

- **percentiles** (MONAI's ``ScaleIntensityRangePercentiles(lower, upper, 0, 1, clip=True)``):
  the ``low`` and ``high`` percentiles of the values (numpy's default linear interpolation)
  become 0 and 1; values outside are clipped. Output in [0, 1], so it quantises to uint8/uint16
  (for uint16 computed in float64: the levels are the exact formula's, as a window's).
- **z-score** (nnU-Net's scheme for every modality but CT, MONAI's
  ``NormalizeIntensity(nonzero=True)``): ``(x - mean) / std``, with mean and std (population,
  ``ddof=0``) over the non-zero voxels (``over="nonzero"``, the default) or all of them. With
  ``nonzero``, voxels that are 0 stay 0 (nnU-Net's ``use_mask_for_norm``: the background
  outside a skull-stripped brain stays background). Output is unbounded: float16 only.

The statistics (:class:`Stats`) are what a prediction needs to be mapped back; every sample
records them with its channel (``metadata.windows[i]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Where the statistics are taken: every value, or the non-zero ones (a background of exact 0).
REGIONS = ("all", "nonzero")


@dataclass(frozen=True)
class Stats:
    """What one normalisation of one image used: ``kind`` (``percentiles`` or ``zscore``), the
    region (``over``), the values that became 0 and 1 (``low``/``high``, percentiles) or the
    ``mean`` and ``std`` (z-score), and how many values they were taken from (``count``)."""

    kind: str
    over: str
    count: int
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    std: float | None = None
    percentiles: tuple[float, float] | None = None
    #: The lowest and highest value of the region (z-score): where black lies, :func:`zscore_black`
    minimum: float | None = None
    maximum: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The record of a sample's channel (``metadata.windows[i]``): the statistics at full
        (float64) precision, the values every output is computed from, so that the record
        reproduces the packed bytes: ``uint16`` computes ``(x - low) / (high - low)`` in float64
        from them as they are; ``uint8`` and ``float16`` compute in float32 from
        ``float32(low)`` and ``float32(1 / (high - low))``, or ``float32(mean)`` and
        ``float32(1 / std)`` (:func:`apply_percentiles`, :func:`apply_zscore`), which
        values rounded to float32 first would not always give."""
        out: dict[str, Any] = {"over": self.over, "count": self.count}
        if self.kind == "percentiles":
            out.update(percentiles=list(self.percentiles or ()), low=self.low, high=self.high)
        else:
            out.update(mean=self.mean, std=self.std)
        return out


def _region(values: np.ndarray, over: str) -> np.ndarray:
    """The values the statistics are taken from, flattened (a copy only where it must be)."""
    if over not in REGIONS:
        raise ValueError(f"unknown region {over!r}; expected one of {REGIONS}")
    flat = values.reshape(-1)
    return flat[flat != 0] if over == "nonzero" else flat


def percentile_stats(values: np.ndarray, low: float, high: float, over: str = "all") -> Stats:
    """The ``low`` and ``high`` percentiles (0-100) of ``values`` over ``over``. An empty region
    (``nonzero`` of an all-zero image) gives low = high = 0. Raises ValueError for a bad range."""
    if not 0 <= low < high <= 100:
        raise ValueError(f"percentiles [{low}, {high}] must satisfy 0 <= low < high <= 100")
    region = _region(values, over)
    if region.size == 0:
        return Stats("percentiles", over, 0, low=0.0, high=0.0, percentiles=(low, high))
    lo, hi = np.percentile(region, [low, high])
    return Stats("percentiles", over, int(region.size), low=float(lo), high=float(hi), percentiles=(low, high))


def zscore_stats(values: np.ndarray, over: str = "nonzero") -> Stats:
    """Mean and population standard deviation (float64 sums) of ``values`` over ``over``; an
    empty region gives mean 0 and std 0."""
    region = _region(values, over)
    if region.size == 0:
        return Stats("zscore", over, 0, mean=0.0, std=0.0)
    mean = float(np.mean(region, dtype=np.float64))
    std = float(np.std(region, dtype=np.float64))
    return Stats("zscore", over, int(region.size), mean=mean, std=std, minimum=float(region.min()),
                 maximum=float(region.max()))


def apply_percentiles(values: np.ndarray, stats: Stats, dtype: type[np.floating] = np.float32) -> np.ndarray:
    """``values`` clipped to [low, high] and scaled to [0, 1], ``dtype`` of the same shape. Where
    low == high (most voxels share one value: a sparse image, a constant one) the range has no
    width and the clip decides alone: a voxel at or below it is 0, one above it 1 (MONAI's
    ``ScaleIntensityRangePercentiles`` with ``clip``; a bright voxel over a black background
    packed as 0, the whole image black).

    float32 (uint8 and float16 outputs) computes ``(x - float32(low)) · float32(1/(high - low))``
    in float32, the bytes of every dataset built with it; float64 (uint16 output,
    :func:`packer.transform.dicom.display_dtype`) computes ``(x - low) / (high - low)`` in
    float64, within 1e-11 of a level of the exact value, for
    :func:`packer.transform.dicom.quantise` to round as the exact formula's."""
    lo, hi = float(stats.low or 0.0), float(stats.high or 0.0)
    if dtype == np.float64:
        exact = np.array(values, dtype=np.float64)  # a copy: the steps below are in place
        if hi <= lo:
            return (exact > lo).astype(np.float64)
        exact -= lo
        exact /= hi - lo
        np.clip(exact, 0.0, 1.0, out=exact)
        return exact
    out = np.asarray(values, dtype=np.float32).astype(np.float32, copy=True)
    if hi <= lo:
        return (out > np.float32(lo)).astype(np.float32)
    out -= np.float32(lo)
    out *= np.float32(1.0 / (hi - lo))
    np.clip(out, 0.0, 1.0, out=out)
    return out


def zscore_scale(stats: Stats) -> np.float32:
    """``float32(1 / std)``, the factor :func:`apply_zscore` multiplies by: the population std
    itself, however small (an ADC map in m²/s has a std of ~1e-9), so that the record's
    ``mean``/``std`` reproduce the packed values; 0 where the std is 0 (a constant region, every
    value of which is the mean: its z-scores are 0). Raises ValueError, naming the std, where
    float32 cannot hold ``1 / std`` (a std below ~3e-39: subnormal values) or holds it as 0 (a
    std beyond ~1e45): the z-scores cannot be computed as the record says (``non_finite``)."""
    std = float(stats.std or 0.0)
    if std == 0.0:
        return np.float32(0.0)
    with np.errstate(over="ignore", under="ignore"):
        scale = np.float32(1.0 / std)
    if not np.isfinite(scale) or scale == 0:
        raise ValueError(f"the standard deviation of its z-score region ({stats.count} values, mean "
                         f"{float(stats.mean or 0.0):.6g}) is {std:.6g}, whose reciprocal {1.0 / std:.6g} float32 "
                         "cannot hold (its range is about 1.2e-38 to 3.4e38), so the values cannot be z-scored; "
                         "rescale the values into a usable unit (mm²/s rather than m²/s) or use a window or "
                         "percentiles")
    return scale


def apply_zscore(values: np.ndarray, stats: Stats) -> np.ndarray:
    """``(values - mean) / std``, float32 of the same shape, computed as
    ``(x - float32(mean)) · float32(1 / std)`` (:func:`zscore_scale`, which raises ValueError
    where float32 cannot hold ``1 / std``); with ``over == "nonzero"`` the zero voxels stay 0. A
    zero std (a constant region) gives 0 where the statistics apply."""
    mean, scale = float(stats.mean or 0.0), zscore_scale(stats)
    out = np.asarray(values, dtype=np.float32).astype(np.float32, copy=True)
    zero = out == 0 if stats.over == "nonzero" else None
    if scale == 0:
        out[...] = 0.0  # every value of the region is the mean: +0.0, never (x - mean) · 0's -0.0
        return out
    out -= np.float32(mean)
    out *= scale
    if zero is not None:
        out[zero] = 0.0
    return out


def zscore_black(stats: Stats, *, inverted: bool = False) -> float:
    """The value that is black in an image z-scored by ``stats``, which its padding and ``fit``'s
    border take (README, Transforms step 5): over ``nonzero``, 0 (the background zeros stay 0);
    over ``all``, 0 is the mean (mid-grey), so the lowest z-score of the values the statistics
    came from (a DICOM frame's, a NIfTI volume's); ``inverted`` (MONOCHROME1's -z), the highest
    z-score negated. Computed by :func:`apply_zscore` itself, so it is the float32 value the
    darkest pixel has, bit for bit. 0 for an empty region."""
    if stats.over != "all" or not stats.count or stats.minimum is None or stats.maximum is None:
        return 0.0
    z = float(apply_zscore(np.array([stats.maximum if inverted else stats.minimum]), stats)[0])
    return 0.0 - z if inverted else z  # +0.0, never -0.0, as the inverted channel has
