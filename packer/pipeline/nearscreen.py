"""The first stage of near-copy verification: a half-resolution bound that turns look-alikes away.

Most candidate pairs are look-alikes that :func:`packer.pipeline.nearcopy.verify` rejects, and
on small images verifying them is most of a build (issue 40: 248,300 candidates for 240 links
on 20,000 24×24 images, about 0.5 ms each). A pair can only score when the fine structure of its
two thumbnails agrees at their best alignment (the verification's ``structure`` ≥ 0.6), so this
stage measures that agreement coarsely, and for a whole task's pairs at once:

* each 64×64 thumbnail area-averaged to 32×32 (:data:`HALF`), minus its σ=1 Gaussian blur
  (:func:`half_bands`): the fine structure one octave coarser, where half a pixel of shift or a
  zoom of 3 % barely changes it, and where the resampling pattern that every upscaled tiny
  image shares at full resolution is gone;
* the normalised correlation (OpenCV's ``TM_CCOEFF_NORMED``) of the first thumbnail's inner
  26×26 band, magnified by each zoom of the verification's first look (0.94, 1, 1.06), with the
  second's band at every shift of up to :data:`SHIFT` half-resolution pixels (the
  verification's six); the largest is the pair's :func:`screen_values`.

It is computed through FFTs (:class:`_Spectra`): each thumbnail's band and spectrum once per
block of pairs, each pair one product of spectra and one inverse transform per zoom, batched,
and a pair whose zoom-1 correlation passes is not searched at the other two
(:func:`let_through`). Measured: 35-65 µs a pair (one core, 2 vCPU AMD EPYC), against 450-700 µs
for the verification it spares.

A pair below :data:`SCREEN_MIN` (0.30) is not verified. That this never turns away a pair the
full test would link is measured, not proven (benchmarks/RESULTS.md, "Cheaper near-copy
verification"): on every candidate pair of the near-copy benchmark's trees (300 and 3,000
similar-anatomy patients, 90 planted copies of nine kinds) and of issue 40's tiny-image tree
(20,000 files, 247 planted copies), the pairs the full test passed scored 0.61 and up here;
copies made over the verification's whole range (shifts of ±6 px, zooms 0.91-1.09, JPEG down to
quality 30, resizing, gamma, another window) that it links scored 0.46 and up
(tests/test_nearscreen.py), and any candidate whose ``structure`` reached 0.6, copy or not,
0.36 and up. Look-alikes of the tiny-image tree scored 0.19 (median) and 0.36 (99th
percentile): 94 % are turned away, and each of those scored 0 in full. Look-alikes of the
similar-anatomy phantoms score 0.62-0.66 (median): none is turned away there, and those trees
pay for the stage (up to about 7 % more verification time, in-process) for nothing. Whatever the stage turns away,
:func:`packer.pipeline.nearcopy.settle_rivals` verifies in full every pair the rival test reads,
so the links, their evidence and their rivals are those of the full test unless a pair the full
test passes is turned away.
"""

from __future__ import annotations

import numpy as np

from packer.opencv import cv2

#: Side of the half-resolution view (the 64×64 thumbnail area-averaged 2×2).
HALF = 32
#: Shifts searched, in half-resolution pixels (the verification's :data:`~packer.pipeline.nearcopy.VERIFY_SHIFT` / 2).
SHIFT = 3
#: Zooms of the first thumbnail's template (the verification's first look).
ZOOMS = (0.94, 1.0, 1.06)
#: Below this best correlation a pair is not verified (its margin: the module's docstring).
SCREEN_MIN = 0.30
_SIGMA = 1.0
_INNER = HALF - 2 * SHIFT
_KERNEL = cv2.getGaussianKernel(int(round(_SIGMA * 4 * 2 + 1)) | 1, _SIGMA, cv2.CV_32F)
_PAD = len(_KERNEL) // 2


def half_bands(thumbs: np.ndarray, zoom: float = 1.0) -> np.ndarray:
    """The band-passed half-resolution views of thumbnails (n×64×64 uint8) magnified by ``zoom``
    about their centre: n×32×32 float32, each the 2×2 area average (zoomed, edges replicated)
    minus its σ=1 Gaussian blur (OpenCV's, reflected borders). Raises ValueError for another shape."""
    if thumbs.ndim != 3 or thumbs.shape[1:] != (2 * HALF, 2 * HALF):
        raise ValueError(f"half_bands needs n×{2 * HALF}×{2 * HALF} thumbnails, got shape {thumbs.shape}")
    n = len(thumbs)
    if n == 0:
        return np.zeros((0, HALF, HALF), dtype=np.float32)
    full = np.ascontiguousarray(thumbs, dtype=np.float32)
    if zoom != 1.0:  # magnified before it is averaged, as the verification magnifies the thumbnail itself
        centre = (2 * HALF - 1) / 2.0
        matrix = cv2.getRotationMatrix2D((centre, centre), 0.0, zoom)
        full = np.stack([cv2.warpAffine(view, matrix, (2 * HALF, 2 * HALF), flags=cv2.INTER_LINEAR,
                                        borderMode=cv2.BORDER_REPLICATE) for view in full])
    # all thumbnails as one tall image: a 2× area resize averages 2×2 blocks, none across two thumbnails
    half = cv2.resize(full.reshape(n * 2 * HALF, 2 * HALF), (HALF, n * HALF),
                      interpolation=cv2.INTER_AREA).reshape(n, HALF, HALF)
    # one blur over all views stacked: each padded by its own reflected rows, so none reads another's
    padded = np.concatenate([half[:, _PAD:0:-1], half, half[:, -2:-_PAD - 2:-1]], axis=1)  # np.pad's "reflect"
    blurred = cv2.sepFilter2D(np.ascontiguousarray(padded.reshape(-1, HALF)), cv2.CV_32F, _KERNEL, _KERNEL,
                              borderType=cv2.BORDER_REFLECT_101)
    return np.asarray(half - blurred.reshape(n, HALF + 2 * _PAD, HALF)[:, _PAD:_PAD + HALF], dtype=np.float32)


class _Spectra:
    """Both sides of a block's correlations: the templates (first thumbnails: inner band at a zoom
    of :data:`ZOOMS`, mean removed, zero-padded to 32×32) as spectra with their norms, made for a
    zoom when it is first asked for, and the searched views (second thumbnails' bands) as spectra
    with each shifted window's spread."""

    def __init__(self, firsts: np.ndarray, seconds: np.ndarray) -> None:
        self.firsts = firsts
        self._templates: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        bands = half_bands(seconds).astype(np.float64)
        self.searched = np.fft.rfft2(bands).astype(np.complex64)
        sums, squares = _window_sums(bands)
        self.spread = np.sqrt(np.maximum(squares - sums ** 2 / _INNER ** 2, 0.0))

    def templates(self, zoom: float) -> tuple[np.ndarray, np.ndarray]:
        """(conjugate spectra, norms) of the first thumbnails' templates at ``zoom``."""
        if zoom not in self._templates:
            inner = slice(SHIFT, SHIFT + _INNER)
            part = half_bands(self.firsts, zoom)[:, inner, inner].astype(np.float64)
            padded = np.zeros((len(part), HALF, HALF), dtype=np.float64)
            padded[:, :_INNER, :_INNER] = part - part.mean(axis=(1, 2), keepdims=True)
            self._templates[zoom] = (np.conj(np.fft.rfft2(padded)).astype(np.complex64),
                                     np.sqrt((padded ** 2).sum(axis=(1, 2))))
        return self._templates[zoom]

    def best(self, zoom: float, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Per pair (``first[p]``, ``second[p]``: rows of the two sides), the largest normalised
        correlation over shifts at ``zoom``; 0 where the template or every window is flat."""
        spectra, norms = self.templates(zoom)
        out = np.empty(len(first), dtype=np.float64)
        for lo in range(0, len(first), BLOCK):
            a, b = first[lo:lo + BLOCK], second[lo:lo + BLOCK]
            numerator = np.fft.irfft2(spectra[a] * self.searched[b], s=(HALF, HALF))[:, :2 * SHIFT + 1, :2 * SHIFT + 1]
            denominator = norms[a][:, None, None] * self.spread[b]
            flat = denominator <= 1e-9
            ncc = np.where(flat, 0.0, numerator / np.where(flat, 1.0, denominator))
            out[lo:lo + BLOCK] = ncc.reshape(len(a), -1).max(axis=1)
        return out


def _window_sums(views: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums of values and of squares of every 26×26 window of n×32×32 views at shifts 0..6 (each
    n×7×7, float64), from one summed-area table of all views stacked (a window's sum is a
    difference of four entries, so a window inside one view reads nothing of the next)."""
    n = len(views)
    sums, squares = cv2.integral2(np.ascontiguousarray(views, dtype=np.float64).reshape(n * HALF, HALF),
                                  sdepth=cv2.CV_64F, sqdepth=cv2.CV_64F)
    span = 2 * SHIFT + 1
    top = (np.arange(n) * HALF)[:, None] + np.arange(span)[None, :]                      # n × 7 rows

    def windows(table: np.ndarray) -> np.ndarray:
        low, high = table[top], table[top + _INNER]                                      # n × 7 × 33
        return (high[:, :, _INNER:_INNER + span] - low[:, :, _INNER:_INNER + span]
                - high[:, :, :span] + low[:, :, :span])
    return windows(sums), windows(squares)


#: Pairs screened at once (bounds a block's spectra and correlation maps to about 10 MB).
BLOCK = 1024


def screen_values(firsts: np.ndarray, seconds: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The first stage's value of pairs (``firsts[first[p]]``, ``seconds[second[p]]``) of uint8
    64×64 thumbnails (the verification aligns the second to the first): the best normalised
    correlation of their half-resolution fine structure over :data:`ZOOMS` and shifts of up to
    :data:`SHIFT` half pixels, in -1..1 (float64). The value of a pair depends on its two
    thumbnails alone, not on the others screened with it, but for the last bits of float64
    rounding (the batched transforms' order)."""
    spectra = _Spectra(firsts, seconds)
    return np.max([spectra.best(zoom, first, second) for zoom in ZOOMS], axis=0)


def let_through(firsts: np.ndarray, seconds: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Which pairs (as :func:`screen_values` takes them) are worth verifying: their value reaches
    :data:`SCREEN_MIN` (bool per pair). A pair whose correlation at zoom 1 reaches it already is
    not searched at the other zooms (the value is the largest of the three), so a block of pairs
    that mostly pass, as similar-anatomy look-alikes do, costs a third of the search."""
    spectra = _Spectra(firsts, seconds)
    through = spectra.best(1.0, first, second) >= SCREEN_MIN
    for zoom in (z for z in ZOOMS if z != 1.0):
        open_ = np.flatnonzero(~through)
        if len(open_) == 0:
            break
        through[open_] = spectra.best(zoom, first[open_], second[open_]) >= SCREEN_MIN
    return through
