"""Per-channel 256-bin intensity histograms of packed samples, grouped by split and source;
histograms of a numeric target's values per split; and pixels per segmentation-mask class id."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packer.htmlreport.thumbs import as_chw, to_display
from packer.opencv import cv2

SATURATION_SHARE = 0.5
VALUE_BINS = 24  # bins of a numeric target's histogram


@dataclass
class ChannelHistograms:
    """Counts per channel (256 bins of the uint8 display value) over ``samples`` samples."""

    names: list[str]
    counts: np.ndarray  # C×256 int64
    samples: int = 0
    dtypes: set[str] = field(default_factory=set)
    #: Per normalised channel (percentiles, z-score), the statistics each counted sample recorded
    normalised: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @classmethod
    def empty(cls, names: list[str]) -> ChannelHistograms:
        return cls(names=names, counts=np.zeros((len(names), 256), dtype=np.int64))

    def add(self, image: np.ndarray) -> None:
        """Count one C×H×W sample (any dtype: non-uint8 goes through ``to_display``)."""
        self.add_counts(channel_counts(image), str(image.dtype))

    def add_counts(self, counts: np.ndarray, dtype: str,
                   normalised: Sequence[tuple[str, dict[str, float]]] = ()) -> None:
        """Add one sample's :func:`channel_counts` (C×256) of a ``dtype`` image, and the statistics
        of its normalised channels (:func:`normalisation_stats`)."""
        self.counts += counts
        self.samples += 1
        self.dtypes.add(dtype)
        for name, stats in normalised:
            self.normalised.setdefault(name, []).append(stats)

    def normalisation_notes(self) -> list[str]:
        """One line per normalised channel: the median (and range) over the counted samples of
        the values its normalisation used (``low``/``high`` of percentiles, ``mean``/``std``)."""
        lines = []
        for name, seen in self.normalised.items():
            parts = []
            for field_name in ("low", "high", "mean", "std"):
                values = [s[field_name] for s in seen if field_name in s]
                if values:
                    parts.append(f"{field_name} {np.median(values):.4g} ({min(values):.4g} to {max(values):.4g})")
            lines.append(f"{name}: {', '.join(parts)} over {len(seen)} sample(s)")
        return lines

    def saturation(self) -> list[tuple[str, float, float]]:
        """(channel, share of pixels at 0, share at 255) for each channel."""
        out = []
        for name, row in zip(self.names, self.counts, strict=True):
            total = int(row.sum()) or 1
            out.append((name, float(row[0]) / total, float(row[255]) / total))
        return out

    def saturated(self) -> list[tuple[str, float, float]]:
        """Channels where more than half of the pixels sit at 0 or at 255 together."""
        return [s for s in self.saturation() if s[1] + s[2] > SATURATION_SHARE]


def channel_counts(image: np.ndarray) -> np.ndarray:
    """C×256 int64 counts of one sample's display values (non-uint8 via ``to_display``): every
    pixel of a C×H×W (or H×W) sample, every voxel of a C×D×H×W volume (not only the three middle
    planes its thumbnails show)."""
    arr = np.asarray(image)
    chw = to_display(arr.reshape(arr.shape[0], -1, arr.shape[-1]) if arr.ndim == 4 else as_chw(arr))
    counts = np.zeros((chw.shape[0], 256), dtype=np.int64)
    for c in range(chw.shape[0]):
        # cv2.calcHist counts a uint8 plane ~10x faster than np.bincount (which widens every
        # pixel to intp first); its float32 counts are exact below 2**24 pixels a plane.
        plane = np.ascontiguousarray(chw[c])
        if plane.size < 1 << 24:
            counts[c] = cv2.calcHist([plane], [0], None, [256], [0, 256]).reshape(256).astype(np.int64)
        else:
            counts[c] = np.bincount(plane.ravel(), minlength=256)
    return counts


@dataclass(frozen=True)
class ValueHistogram:
    """One numeric target's values per split, counted over bins shared by every split.

    ``edges``: ``VALUE_BINS + 1`` ascending float64 edges from the smallest to the largest value
    of any split; ``counts``: per split, int64 counts per bin; ``stats``: per split, (values
    counted, min, mean, max). Values that are not finite (a damaged index) are left out.
    """

    name: str
    edges: np.ndarray
    counts: dict[str, np.ndarray]
    stats: dict[str, tuple[int, float, float, float]]


def value_histograms(names: Sequence[str], values: np.ndarray, split_code: np.ndarray, split_names: Sequence[Any],
                     bins: int = VALUE_BINS) -> list[ValueHistogram]:
    """A :class:`ValueHistogram` per name of ``names``: ``values`` is the n × len(names) float
    matrix of every sample's target, ``split_code`` each row's number in ``split_names``."""
    out = []
    for k, name in enumerate(names):
        column = values[:, k]
        finite = np.isfinite(column)
        low, high = (float(column[finite].min()), float(column[finite].max())) if finite.any() else (0.0, 1.0)
        if low == high:  # one value: a bin around it
            low, high = low - 0.5, high + 0.5
        edges = np.linspace(low, high, bins + 1)
        counts, stats = {}, {}
        for code, split in enumerate(split_names):
            held = column[finite & (split_code == code)]
            counts[str(split)] = np.histogram(held, edges)[0].astype(np.int64)
            if held.size:
                stats[str(split)] = (int(held.size), float(held.min()), float(held.mean()), float(held.max()))
        out.append(ValueHistogram(name=name, edges=edges, counts=counts, stats=stats))
    return out


def mask_pixel_counts(mask: np.ndarray) -> dict[int, int]:
    """Pixels per class id (those present) of one F×H×W mask, every frame counted."""
    counts = np.bincount(np.ascontiguousarray(mask).ravel())
    return {int(i): int(counts[i]) for i in np.flatnonzero(counts).tolist()}


@dataclass
class MaskCounts:
    """Over the masks of ``samples`` samples of one split: pixels per class id, and how many of
    those masks are empty (hold no id but 0, and the id ``fit`` pads with where it is no class:
    the caller passes :attr:`~packer.htmlreport.collect.MaskSchema.pad_only`, None where the pad
    is a named class, whose pixels make a mask not empty)."""

    pixels: Counter[int] = field(default_factory=Counter)
    samples: int = 0
    empty: int = 0

    def add(self, counts: dict[int, int], pad: int | None = None) -> None:
        """Add one mask's :func:`mask_pixel_counts`."""
        self.pixels.update(counts)
        self.samples += 1
        self.empty += not (set(counts) - {0, pad})

    def shares(self) -> dict[int, float]:
        """Share of the counted pixels per class id, by id."""
        total = sum(self.pixels.values())
        return {i: (self.pixels[i] / total if total else 0.0) for i in sorted(self.pixels)}


def normalisation_stats(info: dict[str, Any], names: Sequence[str]) -> list[tuple[str, dict[str, float]]]:
    """(channel name, statistics) of each channel of a packed sample that a percentiles or
    z-score normalisation made, from its record's ``metadata.windows`` (in channel order: a
    neighbour stack repeats its centre slice's; a replicated channel is one)."""
    metadata = info.get("metadata") if isinstance(info.get("metadata"), dict) else {}
    windows = metadata.get("windows") if isinstance(metadata, dict) else None
    if not isinstance(windows, list):
        return []
    out = []
    for name, window in zip(names, windows, strict=False):
        if isinstance(window, dict) and window.get("source") in ("percentiles", "zscore", "fallback_percentiles"):
            stats = {k: float(window[k]) for k in ("low", "high", "mean", "std")
                     if isinstance(window.get(k), int | float)}
            out.append((str(window.get("name") or name), stats))
    return out
