"""NIfTI ``output: uint16`` levels are the exact value of the window (or percentile) formula,
rounded half to even, as DICOM's are (README, Pixels: a value within 1e-7 of a half level counts
as that half level); ``uint8`` keeps its float32 arithmetic and its bytes.

Real files written by nibabel, every stored value of an int16 volume (``scl_slope`` 0.5,
``scl_inter`` -1024.25: each value is a quarter, x = (2s - 4097)/4, exact in float32), packed as
slices, 2.5D stacks and a volume, and compared with the formula computed in exact integer and
fraction arithmetic: DICOM's ``exact_levels`` (tests/test_dicom_transform.py) for the windows, and
:func:`exact_percentile_levels` for percentile normalisation.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nifti_files import Packed, build_nifti, write_nifti
from test_dicom_transform import EXACT_INTERCEPT, EXACT_SLOPE, EXACT_WINDOWS, assert_exact_levels, exact_levels

from packer.config import parse_window
from packer.read.nifti_samples import Case, Slicing, plan_channels, slice_samples
from packer.records import SampleRef
from packer.transform.dicom import finish_image

#: RAS diag(-1, -1, 2): file axes i, j, k run left, posterior, superior, packer's canonical W, H, D
#: in that order, so the canonical D×H×W array is the file's transposed: ``data.transpose(2, 1, 0)``.
AFFINE = np.diag([-1.0, -1.0, 2.0, 1.0])
#: Every int16 stored value once (X×Y×Z = 64×64×16): 16 axial slices of 64×64.
EVERY_INT16 = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16).reshape(64, 64, 16)
#: Stored values 0..131070 (the last value twice), no scaling: percentiles [0, 100] map n to
#: n·65535/131070 = n/2 levels, an exact half level for each of the 65,535 odd n.
HALVES = np.minimum(np.arange(64 * 64 * 32), 131070).astype(np.int32).reshape(64, 64, 32)

WINDOWS: list[dict[str, Any]] = [{"center": c, "width": w, "function": f} for c, w, f in EXACT_WINDOWS]
PERCENTILES: list[dict[str, Any]] = [{"percentiles": [0, 100]}, {"percentiles": [0.5, 99.5]},
                                     {"percentiles": [1, 99], "over": "nonzero"}]
SAMPLES: dict[str, Any] = {"slice": "slice", "neighbors": {"neighbors": 1}, "volume": "volume"}


def modality_values(stored: np.ndarray, scaled: bool) -> tuple[np.ndarray, int]:
    """(P, Q): the modality value of each stored value as the fraction P/Q (integers)."""
    s = stored.astype(np.int64)
    return (2 * s - 4097, 4) if scaled else (s, 1)


def exact_percentile_levels(stored: np.ndarray, scaled: bool, low: float, high: float, over: str,
                            top: int) -> np.ndarray:
    """``round(top · clip((x - lo) / (hi - lo), 0, 1))`` in exact arithmetic, half to even, a value
    within 1e-7 of a half level counting as that half level (the README's rule); lo and hi are
    numpy's (linear) percentiles of the region's values, as floats, taken exactly as fractions."""
    p, q = modality_values(stored, scaled)
    x = p.astype(np.float64) / q  # exact: quarters of values below 2**20
    region = x[x != 0] if over == "nonzero" else x
    lo, hi = (Fraction(float(v)) for v in np.percentile(region.reshape(-1), [low, high]))
    a, b = lo.numerator, lo.denominator
    span = hi - lo
    c, e = span.numerator, span.denominator
    # top·(P/Q - a/b)/(c/e) = N/D, N = top·(P·b - a·Q)·e, D = Q·b·c
    n = (p.reshape(-1).astype(object) * b - a * q) * (top * e)
    d = q * b * c
    k, r = n // d, n % d
    tie = np.array([abs(2 * int(ri) - d) * 10**7 <= 2 * d for ri in r])
    up = np.array([2 * int(ri) > d for ri in r])
    odd = np.array([int(ki) % 2 == 1 for ki in k])
    levels = np.array([int(ki) for ki in k], dtype=np.int64) + np.where(tie, odd, up)
    return np.clip(levels, 0, top).reshape(stored.shape)


def build(tmp_path: Path, data: np.ndarray, windows: list[dict[str, Any]], sample: Any, output: str,
          scaled: bool = True) -> Packed:
    raw = tmp_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    write_nifti(raw / "ct.nii.gz", data, AFFINE, slope=EXACT_SLOPE if scaled else None,
                inter=EXACT_INTERCEPT if scaled else None)
    return build_nifti(tmp_path, [{"path": "ct.nii.gz", "entity": "p1"}], {
        "windows": windows, "sample": sample, "output": output})


def packed_volume(packed: Packed, mode: str, channels: int) -> np.ndarray:
    """The packed pixels as one C×D×H×W array, whatever the sampling: a volume's one sample, the
    slices stacked along D, or each 2.5D stack's centre slice (its channels ``channels..2·channels``)."""
    keys = packed.of_entity(next(iter(packed.records.values()))["entity_id"])
    assert packed.bad == [] and keys
    if mode == "volume":
        [key] = keys
        return packed.images[key]
    images = [packed.images[key] for key in keys]
    if mode == "neighbors":  # the neighbours' channels are their own slices' (checked against the slice)
        for i, image in enumerate(images):
            assert image.shape[0] == 3 * channels
            below, above = images[max(i - 1, 0)], images[min(i + 1, len(images) - 1)]
            np.testing.assert_array_equal(image[:channels], below[channels:2 * channels])
            np.testing.assert_array_equal(image[2 * channels:], above[channels:2 * channels])
        images = [image[channels:2 * channels] for image in images]
    return np.stack(images, axis=1)


@pytest.mark.parametrize("mode", SAMPLES)
def test_uint16_levels_equal_the_window_formula_computed_exactly(tmp_path: Path, mode: str) -> None:
    """Every int16 stored value through lung, bone, narrow, wide and LINEAR_EXACT windows (one of
    them with an exact half level at every even stored value): no level off by one from float32
    arithmetic (the lung window gave the next level for 4 of its ramp values), none from float64
    noise at a half level."""
    packed = build(tmp_path, EVERY_INT16, WINDOWS, SAMPLES[mode], "uint16")
    got = packed_volume(packed, mode, len(WINDOWS))
    stored = EVERY_INT16.transpose(2, 1, 0)  # canonical D×H×W
    assert got.dtype == np.uint16 and got.shape == (len(WINDOWS), *stored.shape)
    ramp = 0
    for channel, window in zip(got, EXACT_WINDOWS, strict=True):
        ramp += assert_exact_levels(channel, stored, window, f"{mode}, ")
    assert ramp > 60_000  # the ramps are exercised


@pytest.mark.parametrize("mode", ["slice", "volume"])
@pytest.mark.parametrize(("data", "scaled"), [(EVERY_INT16, True), (HALVES, False)], ids=["int16", "halves"])
def test_uint16_percentile_levels_equal_the_formula_computed_exactly(tmp_path: Path, mode: str, data: np.ndarray,
                                                                     scaled: bool) -> None:
    """Percentile normalisation quantised to uint16 follows the same rule: (x - lo)/(hi - lo) in
    exact arithmetic, rounded half to even (``halves``: 65,535 exact half levels)."""
    packed = build(tmp_path, data, PERCENTILES, SAMPLES[mode], "uint16", scaled=scaled)
    got = packed_volume(packed, mode, len(PERCENTILES))
    stored = data.transpose(2, 1, 0)
    for channel, spec in zip(got, PERCENTILES, strict=True):
        low, high = spec["percentiles"]
        expected = exact_percentile_levels(stored, scaled, low, high, spec.get("over", "all"), 65535)
        off = np.flatnonzero(channel.astype(np.int64) != expected)
        assert off.size == 0, (f"{mode}, {spec}: {off.size} levels differ, first stored value "
                               f"{stored.flat[off[0]]}: {channel.flat[off[0]]} != {expected.flat[off[0]]}")


def float32_window(x: np.ndarray, c: float, w: float, f: str) -> np.ndarray:
    """The window as packer computed it before float64 display values: the ramp in float64, cast
    to float32."""
    c, w = (c - 0.5, w - 1.0) if f == "LINEAR" else (c, w)
    return np.clip((x - c) / w + 0.5, 0.0, 1.0).astype(np.float32)


def float32_percentiles(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Percentile scaling in float32: (x - float32(lo)) · float32(1/(hi - lo)), clipped."""
    lo, hi = (float(v) for v in np.percentile(x.reshape(-1), [low, high]))
    y = (x.astype(np.float32) - np.float32(lo)) * np.float32(1.0 / (hi - lo))
    return np.clip(y, np.float32(0.0), np.float32(1.0))


@pytest.mark.parametrize("mode", ["slice", "volume"])
def test_uint8_levels_are_the_float32_paths_bytes(tmp_path: Path, mode: str) -> None:
    """uint8 output keeps its float32 arithmetic, and the bytes of every dataset built with it:
    y in float32, times 255 in float32, rounded half to even."""
    specs = WINDOWS + PERCENTILES[:2]
    packed = build(tmp_path, EVERY_INT16, specs, SAMPLES[mode], "uint8")
    got = packed_volume(packed, mode, len(specs))
    stored = EVERY_INT16.transpose(2, 1, 0)
    x = (stored.astype(np.float64) * EXACT_SLOPE + EXACT_INTERCEPT)
    assert got.dtype == np.uint8
    for channel, spec in zip(got, specs, strict=True):
        if "percentiles" in spec:
            y = float32_percentiles(x, *spec["percentiles"])
        else:
            y = float32_window(x, spec["center"], spec["width"], spec["function"])
            np.testing.assert_array_equal(channel, exact_levels(stored, spec["center"], spec["width"],
                                                                spec["function"], 255))
        np.testing.assert_array_equal(channel, np.rint(y * np.float32(255.0)).astype(np.uint8))


@pytest.mark.parametrize("output", ["uint8", "uint16"])
def test_a_resized_slice_is_windowed_and_interpolated_in_float32_as_before(output: str) -> None:
    """A slice resized to ``size`` (or resampled to ``spacing``) has interpolated values, no
    stored value's formula: it is rendered and interpolated in float32, uint16 as uint8."""
    stored = EVERY_INT16.transpose(2, 1, 0)[:4]
    values = (stored.astype(np.float32) * np.float32(EXACT_SLOPE) + np.float32(EXACT_INTERCEPT))[None]
    case = Case(values=values, affine=np.diag([2.0, 1.0, 1.0, 1.0]), names=("ct",), cal=(None,))
    ref = SampleRef(sample_id="c", source="s", kind="nifti", path="/raw/c.nii.gz", relpath="c.nii.gz")
    for spacing, size in [(None, (48, 40)), ((0.75, 1.5), None)]:
        plan = Slicing(windows=tuple(parse_window(w, f"w[{i}]") for i, w in enumerate(WINDOWS[:3] + PERCENTILES[:1])),
                       sample="slice", axis="axial", neighbors=0, edge="replicate", spacing=spacing, size=size,
                       resize="stretch", output=output, volume_spacing=None, volume_size=None)
        channels = plan_channels(case, plan.windows)
        samples = slice_samples(ref, case, plan, {})
        for index, sample in enumerate(samples):
            rendered = np.stack([channel.render(values[0, index]) for channel in channels], axis=-1)
            assert rendered.dtype == np.float32
            expected = finish_image(rendered, pixel_spacing=(1.0, 1.0), spacing=spacing, size=size,
                                    policy="stretch", output=output)
            assert sample.image.shape == expected.shape and sample.image.shape[1:] != stored.shape[1:]
            assert sample.image.tobytes() == expected.tobytes()
