"""DICOM pixels → training arrays: references against pydicom, hand-computed files, frames, colour."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from dicom_files import (
    PATIENT_ID,
    PATIENT_NAME,
    STUDY_DATE,
    config,
    ct_dataset,
    ct_pixels,
    enhanced_ct_dataset,
    file_window,
    image_dataset,
    lut_item,
    make_ref,
    save,
    secondary_capture_rgb,
    shipped,
    window,
)
from pydicom.dataset import Dataset
from pydicom.pixels import apply_color_lut, apply_modality_lut, apply_voi_lut, pixel_array
from pydicom.sequence import Sequence as DicomSequence

from packer.read.dicom import read_dicom
from packer.records import Issue, Sample


def read(path: Path, *windows: Any, **kwargs: Any) -> list[Sample]:
    result = read_dicom(make_ref(path), config(*windows, **kwargs))
    assert isinstance(result, list), f"{result.reason}: {result.message}"
    for sample in result:
        assert sample.image.flags.c_contiguous and sample.image.dtype.isnative
    return result


def one(path: Path, *windows: Any, **kwargs: Any) -> np.ndarray:
    samples = read(path, *windows, **kwargs)
    assert len(samples) == 1
    return samples[0].image


def linear(x: np.ndarray, c: float, w: float) -> np.ndarray:
    """PS3.3 C.11.2.1.2 written independently: the piecewise ramp equals a clipped line."""
    return np.clip((x - (c - 0.5)) / (w - 1) + 0.5, 0.0, 1.0)


# ---------------------------------------------------------------- references: pydicom's own LUT functions


def pydicom_window_reference(path: Path, index: int = 0) -> np.ndarray:
    """uint8 from pydicom's apply_modality_lut + apply_voi_lut, normalised to 0..255.

    pydicom maps a window onto the stored-value range (after rescale, or the Modality LUT's
    output range), not [0, 1]; a VOI LUT comes back as raw LUT entries.
    """
    ds = pydicom.dcmread(path)
    values = apply_modality_lut(pixel_array(ds), ds)
    out = apply_voi_lut(values, ds, index=index).astype(np.float64)
    if ds.get("VOILUTSequence"):
        low, high = 0.0, float(2 ** ds.VOILUTSequence[index].LUTDescriptor[2] - 1)
    elif ds.get("ModalityLUTSequence"):
        low, high = 0.0, float(2 ** ds.ModalityLUTSequence[0].LUTDescriptor[2] - 1)
    else:
        bits = int(ds.BitsStored)
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if ds.PixelRepresentation else (0, 2**bits - 1)
        slope, intercept = float(ds.get("RescaleSlope", 1)), float(ds.get("RescaleIntercept", 0))
        low, high = low * slope + intercept, high * slope + intercept
    return np.rint((out - low) / (high - low) * 255)


def assert_within_one_lsb(ours: np.ndarray, reference: np.ndarray) -> None:
    assert ours.shape == reference.shape
    assert np.abs(ours.astype(np.int64) - reference.astype(np.int64)).max() <= 1


@pytest.mark.parametrize(("function", "centers", "widths", "index"), [
    (None, 40, 80, 0), ("LINEAR", [40, -600], [80, 1500], 1), ("LINEAR_EXACT", 40.5, 80.5, 0),
    ("SIGMOID", 40, 350, 0),
])
def test_window_matches_pydicom(tmp_path: Path, function: str | None, centers: Any, widths: Any,
                                 index: int) -> None:
    ds = ct_dataset(ct_pixels((32, 32), seed=1), center=centers, width=widths)
    if function:
        ds.VOILUTFunction = function
    path = save(ds, tmp_path / "ct.dcm")
    reference = pydicom_window_reference(path, index)
    assert_within_one_lsb(one(path, file_window(index))[0], reference)
    assert len(np.unique(reference)) > 20  # the window actually spreads values


def test_voi_lut_sequence_matches_pydicom_and_wins_over_window(tmp_path: Path) -> None:
    ramp = np.sqrt(np.linspace(0, 1, 400)) * 4095  # a non-linear 12-bit VOI LUT from -200 HU
    ds = ct_dataset(ct_pixels((32, 32), seed=2, low=600, high=1600), center=1000, width=10)
    ds.VOILUTSequence = DicomSequence([lut_item(-200, 12, np.rint(ramp).astype(int).tolist(), "SQRT")])
    path = save(ds, tmp_path / "voilut.dcm")
    sample = read(path)[0]
    assert sample.metadata["windows"][0]["function"] == "LUT"
    # LUT Explanation is free text (it may hold a name or record number): it selects, it is never recorded
    assert "explanation" not in sample.metadata["windows"][0] and "SQRT" not in json.dumps(sample.metadata)
    assert_within_one_lsb(sample.image[0], pydicom_window_reference(path))
    np.testing.assert_array_equal(one(path, file_window("sqrt")), sample.image)


def test_a_voi_lut_declared_16_bits_over_12_bit_data_renders_as_the_12_bit_lut_and_says_so(tmp_path: Path) -> None:
    # the same LUT Data under a descriptor of 16 bits (as Agfa CRs write it) and of 12: the same image,
    # not one divided by 65535 (nearly black); the sample's window record says which range was used
    ramp = np.rint(np.sqrt(np.linspace(0, 1, 400)) * 4095).astype(int).tolist()
    samples = []
    for bits in (12, 16):
        ds = ct_dataset(ct_pixels((32, 32), seed=2, low=600, high=1600), center=None, width=None)
        ds.VOILUTSequence = DicomSequence([lut_item(-200, bits, ramp, "SQRT")])
        samples.append(read(save(ds, tmp_path / f"lut{bits}.dcm"))[0])
    np.testing.assert_array_equal(samples[0].image, samples[1].image)
    assert len(np.unique(samples[1].image)) > 20
    assert "lut_bits" not in samples[0].metadata["windows"][0]
    assert samples[1].metadata["windows"][0]["lut_bits"] == {"declared": 16, "used": 12}


def test_voi_lut_first_value_written_as_us_is_read_as_signed(tmp_path: Path) -> None:
    # LUT Descriptor value 2 is US or SS by the input's signedness (PS3.3 C.11.2.1.1); some writers
    # store -200 as US 65336. Signed input (Pixel Representation 1) must read it back as -200.
    ramp = np.rint(np.linspace(0, 4095, 400)).astype(int).tolist()
    images = []
    for name, vr, first in (("ss", "SS", -200), ("us", "US", 65336)):
        ds = ct_dataset(ct_pixels((16, 16), seed=2, low=600, high=1600), center=None, width=None)
        item = lut_item(0, 12, ramp)
        del item.LUTDescriptor
        item.add_new(0x00283002, vr, [400, first, 12])
        ds.VOILUTSequence = DicomSequence([item])
        images.append(one(save(ds, tmp_path / f"{name}.dcm")))
    hu = ct_pixels((16, 16), seed=2, low=600, high=1600).astype(float) - 1024
    expected = np.rint(np.asarray(ramp)[np.clip(hu + 200, 0, 399).astype(int)] / 4095 * 255)
    np.testing.assert_array_equal(images[0][0], expected)
    np.testing.assert_array_equal(images[1], images[0])


def test_modality_lut_sequence_matches_pydicom(tmp_path: Path) -> None:
    stored = np.random.default_rng(4).integers(0, 256, (24, 24), dtype=np.uint16)
    table = np.rint(65535 * (np.arange(256) / 255) ** 2).astype(int).tolist()  # quadratic Modality LUT
    ds = image_dataset(stored, modality="OT", bits_stored=8, WindowCenter=20000, WindowWidth=30000)
    ds.ModalityLUTSequence = DicomSequence([lut_item(0, 16, table)])
    ds.ModalityLUTSequence[0].ModalityLUTType = "OD"
    path = save(ds, tmp_path / "mlut.dcm")
    sample = read(path)[0]
    assert sample.metadata["modality_lut"] is True and sample.metadata["rescale_slope"] is None
    assert_within_one_lsb(sample.image[0], pydicom_window_reference(path))
    expected = np.rint(linear(np.asarray(table, float)[stored], 20000, 30000) * 255)
    assert_within_one_lsb(sample.image[0], expected)


def test_shipped_jpeg2000_ct_matches_pydicom_outside_padding() -> None:
    path = shipped("693_J2KI.dcm")  # lossy JPEG 2000 CT, window 40/100, Pixel Padding Value -2000
    ds = pydicom.dcmread(path)
    ours = one(path)[0]
    padding = pixel_array(ds) == -2000
    assert padding.any() and (ours[padding] == 0).all()
    reference = pydicom_window_reference(path)
    assert np.abs(ours[~padding].astype(int) - reference[~padding]).max() <= 1


def test_shipped_ct_explicit_window_matches_pydicom(tmp_path: Path) -> None:
    ds = pydicom.dcmread(shipped("CT_small.dcm"))
    ds.WindowCenter, ds.WindowWidth = 300, 600
    path = save(ds, tmp_path / "ct.dcm")
    assert_within_one_lsb(one(path, window(300, 600))[0], pydicom_window_reference(path))


# ---------------------------------------------------------------- hand-computed end to end


HAND_STORED = np.array([[1024, 1064], [1104, 0]], dtype=np.int16)  # HU 0, 40, 80, -1024 (intercept -1024)


def test_hand_computed_uint8_uint16_and_monochrome1(tmp_path: Path) -> None:
    # brain 40/80 LINEAR: y = x/79 on (0, 79]: HU 40 -> 0.506329 -> 129.1 -> 129 (uint8), 33182.3 -> 33182 (uint16).
    path = save(ct_dataset(HAND_STORED), tmp_path / "m2.dcm")
    np.testing.assert_array_equal(one(path)[0], [[0, 129], [255, 0]])
    np.testing.assert_array_equal(one(path, output="uint16")[0], [[0, 33182], [65535, 0]])
    np.testing.assert_array_equal(one(path, output="float16")[0], [[0, 40], [80, -1024]])
    mono1 = save(ct_dataset(HAND_STORED, PhotometricInterpretation="MONOCHROME1"), tmp_path / "m1.dcm")
    np.testing.assert_array_equal(one(mono1)[0], [[255, 126], [0, 255]])


@pytest.mark.parametrize("photometric", ["MONOCHROME2", "MONOCHROME1"])
def test_8_bit_levels_at_exact_half_levels_round_to_even_for_monochrome1_too(tmp_path: Path, photometric: str) -> None:
    """Every 8-bit stored value s under the window 127.5/256 (LINEAR: y = (s - 127)/255 + 1/2, so
    y·255 = s + 1/2 and (1 - y)·255 = 254.5 - s: every level an exact half). The README's
    round(y·255), half to even, with y inverted first for MONOCHROME1: 1 - y taken in float32
    made 62.5 come out 62.500004 and 32 of the 256 levels one too high, where MONOCHROME2's were
    exact."""
    stored = np.arange(256, dtype=np.uint8).reshape(16, 16)
    ds = image_dataset(stored, modality="DX", photometric=photometric)
    image = one(save(ds, tmp_path / "dx.dcm"), window(127.5, 256.0))[0]
    halves = 2 * stored.astype(np.int64) + 1
    top = 510 - halves if photometric == "MONOCHROME1" else halves  # twice the level: an odd number, a tie
    expected = top // 2 + ((top // 2) % 2)  # half to even: k + 1/2 → k if k even, else k + 1
    np.testing.assert_array_equal(image, np.clip(expected, 0, 255))


# A synthetic CT over every stored value that matters: all 65,536 int16 values (a 256×256 frame:
# its range is too wide for the stored-value table, so the direct path) and a 12-bit slice (the
# table path). Rescale slope 0.5, intercept -1024.25: modality values are quarters, x = (2s - 4097)/4.
EXACT_SLOPE, EXACT_INTERCEPT = 0.5, -1024.25
EXACT_FRAMES = {
    "every int16 value": np.arange(-32768, 32768, dtype=np.int64).astype(np.int16).reshape(256, 256),
    "12-bit slice": (np.arange(128 * 128) % 4000 - 1000).astype(np.int16).reshape(128, 128),
}
# (center, width, function), all multiples of 1/4: lung, bone, narrow, wide, and a LINEAR_EXACT
# window of width 65535 centred on a modality value, whose every even stored value is an exact
# half level (y·65535 = k + 1/2), 32,768 ties that float64 arithmetic alone gets wrong 9,567 times.
EXACT_WINDOWS = [(-600.0, 1500.0, "LINEAR"), (600.0, 2800.0, "LINEAR"), (40.0, 2.0, "LINEAR"),
                 (40.25, 1.5, "LINEAR_EXACT"), (0.0, 40000.0, "LINEAR"), (1000.5, 65536.0, "LINEAR"),
                 (-1024.25, 65535.0, "LINEAR_EXACT"), (-600.0, 1500.0, "LINEAR_EXACT")]


def exact_levels(stored: np.ndarray, center: float, width: float, function: str, top: int) -> np.ndarray:
    """PS3.3 C.11.2.1.2/3 onto 0..top in exact integer arithmetic (no float anywhere), rounded
    half to even. In quarter units X = 4x, C = 4c', W = 4w' (c' = c - 1/2, w' = w - 1 for
    LINEAR) the level is top·(X - C)/W + top/2 = N / D with N = 2·top·(X - C) + top·W, D = 2W,
    clipped to [0, top] (the piecewise ends)."""
    c, w = (center - 0.5, width - 1.0) if function == "LINEAR" else (center, width)
    big_c, big_w = int(c * 4), int(w * 4)
    assert big_c == c * 4 and big_w == w * 4 and big_w > 0
    big_x = 2 * stored.astype(np.int64) - 4097  # 4 · (0.5·s - 1024.25)
    n = 2 * top * (big_x - big_c) + top * big_w
    d = 2 * big_w
    k, r = np.divmod(n, d)
    k = k + ((2 * r > d) | ((2 * r == d) & (k % 2 == 1)))
    return np.clip(k, 0, top)


def assert_exact_levels(channel: np.ndarray, stored: np.ndarray, window: tuple[float, float, str],
                        where: str = "") -> int:
    """Assert that ``channel`` (uint16 levels packed from ``stored`` through ``window``) equals
    :func:`exact_levels` everywhere, naming the first level that differs; returns how many of
    its levels lie on the ramp (neither 0 nor 65535), so a caller can check the ramp is exercised."""
    c, w, f = window
    expected = exact_levels(stored, c, w, f, 65535)
    off = np.flatnonzero(channel.astype(np.int64) != expected)
    assert off.size == 0, (f"{where}window {c}/{w} {f}: {off.size} levels differ, first stored value "
                           f"{stored.flat[off[0]]}: {channel.flat[off[0]]} != {expected.flat[off[0]]}")
    return int(((expected > 0) & (expected < 65535)).sum())


@pytest.mark.parametrize("frame", EXACT_FRAMES)
def test_uint16_levels_equal_the_window_formula_computed_exactly(tmp_path: Path, frame: str) -> None:
    """uint16 output is the exact DICOM window of every stored value, rounded half to even: no
    level off by one from float32 arithmetic (the lung window gave the next level for 4 of its
    3,002 ramp values), none from float64 noise at an exact half level."""
    stored = EXACT_FRAMES[frame]
    path = save(ct_dataset(stored, slope=EXACT_SLOPE, intercept=EXACT_INTERCEPT, center=None, width=None),
                tmp_path / "ct.dcm")
    packed = one(path, *(window(c, w, f) for c, w, f in EXACT_WINDOWS), output="uint16")
    assert packed.dtype == np.uint16
    ramp = 0
    for channel, (c, w, f) in zip(packed, EXACT_WINDOWS, strict=True):
        ramp += assert_exact_levels(channel, stored, (c, w, f))
        if f == "LINEAR" and c == -600.0:  # and the plain float64 formula agrees where it has no tie to decide
            x = stored.astype(np.float64) * EXACT_SLOPE + EXACT_INTERCEPT
            np.testing.assert_array_equal(channel, np.rint(linear(x, c, w) * 65535.0))
    assert ramp > {"every int16 value": 60_000, "12-bit slice": 8_000}[frame]  # the ramps are exercised


@pytest.mark.parametrize("frame", EXACT_FRAMES)
def test_uint8_levels_are_the_float32_paths_bytes(tmp_path: Path, frame: str) -> None:
    """uint8 output keeps its float32 arithmetic (and the bytes of every dataset built with it):
    y = the window in float64, cast to float32, times 255 in float32, rounded half to even."""
    stored = EXACT_FRAMES[frame]
    path = save(ct_dataset(stored, slope=EXACT_SLOPE, intercept=EXACT_INTERCEPT, center=None, width=None),
                tmp_path / "ct.dcm")
    packed = one(path, *(window(c, w, f) for c, w, f in EXACT_WINDOWS), output="uint8")
    x = stored.astype(np.float64) * EXACT_SLOPE + EXACT_INTERCEPT
    for channel, (c, w, f) in zip(packed, EXACT_WINDOWS, strict=True):
        y = linear(x, c, w) if f == "LINEAR" else np.clip((x - c) / w + 0.5, 0.0, 1.0)
        np.testing.assert_array_equal(channel, np.rint(y.astype(np.float32) * np.float32(255.0)).astype(np.uint8))
        np.testing.assert_array_equal(channel, exact_levels(stored, c, w, f, 255))


def test_padding_is_masked_on_stored_values_and_stays_black(tmp_path: Path) -> None:
    stored = np.array([[1024, 1064], [1104, -2000]], dtype=np.int16)
    for photometric in ("MONOCHROME2", "MONOCHROME1"):
        ds = ct_dataset(stored, PixelPaddingValue=-2000, PhotometricInterpretation=photometric)
        image = one(save(ds, tmp_path / f"{photometric}.dcm"))[0]
        assert image[1, 1] == 0  # padding: black (window minimum), after inversion too
    # float16: the padding is not -3024 "HU"; it takes the smallest real value (0 HU here).
    path = save(ct_dataset(stored, PixelPaddingValue=-2000), tmp_path / "f16.dcm")
    np.testing.assert_array_equal(one(path, output="float16")[0], [[0, 40], [80, 0]])
    # MONOCHROME1 is kept as stored, to be inverted by the window applied later: the value that then
    # shows black is its largest (the smallest showed white: padding as the densest tissue)
    path = save(ct_dataset(stored, PixelPaddingValue=-2000, PhotometricInterpretation="MONOCHROME1"),
                tmp_path / "f16-m1.dcm")
    np.testing.assert_array_equal(one(path, output="float16")[0], [[0, 40], [80, 80]])
    letterboxed = one(path, output="float16", size=(4, 8), resize="fit")[0]
    assert letterboxed[:, 0].tolist() == [80] * 4 and letterboxed[:, -1].tolist() == [80] * 4  # fit's border too


def test_padding_range_limit(tmp_path: Path) -> None:
    stored = np.array([[1024, 1064, 1104], [-2000, -1500, -1000]], dtype=np.int16)
    ds = ct_dataset(stored, PixelPaddingValue=-1000, PixelPaddingRangeLimit=-2000)
    image = one(save(ds, tmp_path / "range.dcm"), window(-1000, 4000), output="float16")[0]
    np.testing.assert_array_equal(image, [[0, 40, 80], [0, 0, 0]])


def test_padding_value_is_reduced_to_bits_stored_as_the_pixels_are(tmp_path: Path) -> None:
    """The bits above High Bit are no pixel data (PS3.5 8.1.1) in the pixels and in Pixel Padding
    Value alike: a 12-bit border written 0xFFFF with padding value 0xFFFF is padding (4095 both),
    and a signed 12-bit 0x0800 (-2048) matches a padding value written 2048. float16 output gives
    padding the smallest real value."""
    unsigned = np.array([[100, 2000, 0xFFFF], [300, 0xFFFF, 0xFFFE]], dtype=np.uint16)
    ds = ct_dataset(unsigned, intercept=0.0, bits_stored=12, PixelPaddingValue=0xFFFF)
    np.testing.assert_array_equal(one(save(ds, tmp_path / "u12.dcm"), output="float16")[0],
                                  [[100, 2000, 100], [300, 100, 4094]])
    ds = ct_dataset(unsigned, intercept=0.0, bits_stored=12, PixelPaddingValue=0xFFFF, PixelPaddingRangeLimit=0xFFFE)
    np.testing.assert_array_equal(one(save(ds, tmp_path / "u12-range.dcm"), output="float16")[0],
                                  [[100, 2000, 100], [300, 100, 100]])
    signed = np.array([[100, 0x0800], [-100, 2047]], dtype=np.int16)  # 0x0800: -2048 in 12 bits
    ds = ct_dataset(signed, intercept=0.0, bits_stored=12, PixelPaddingValue=2048)
    np.testing.assert_array_equal(one(save(ds, tmp_path / "s12.dcm"), output="float16")[0],
                                  [[100, -100], [-100, 2047]])


def test_resize_happens_on_window_floats_before_quantising(tmp_path: Path) -> None:
    # Slope 0.1, LINEAR_EXACT 50/100 -> y = stored/1000. Top-left 2x2 block: y = .002 .002 .002 .010,
    # mean .004 -> round(1.02) = 1; quantising first would give mean(1, 1, 1, 3) = 1.5 -> 2.
    stored = np.array([[2, 2, 500, 500], [2, 10, 500, 500], [900, 900, 100, 300], [900, 900, 200, 400]],
                      dtype=np.int16)
    ds = ct_dataset(stored, slope=0.1, intercept=0.0)
    image = one(save(ds, tmp_path / "r.dcm"), window(50, 100, "LINEAR_EXACT"), size=(2, 2))[0]
    np.testing.assert_array_equal(image, [[1, 128], [230, 64]])


def test_spacing_then_size_and_policies(tmp_path: Path) -> None:
    path = shipped("CT_small.dcm")  # 128 x 128 at 0.661468 mm
    sample = read(path, window(40, 400), spacing=(1.0, 1.0))[0]
    assert sample.image.shape == (1, 85, 85)
    assert sample.metadata["output_spacing"] == pytest.approx([128 * 0.661468 / 85] * 2, abs=1e-6)  # 85 whole rows
    assert sample.metadata["pixel_spacing"] == pytest.approx([0.661468, 0.661468])
    assert read(path, window(40, 400), spacing=(1.0, 1.0), size=(32, 48))[0].image.shape == (1, 32, 48)
    ds = ct_dataset(ct_pixels((20, 40)))
    fit = one(save(ds, tmp_path / "wide.dcm"), window(0, 4000), size=(20, 20), resize="fit")[0]
    assert (fit[:5] == 0).all() and (fit[15:] == 0).all() and fit[5:15].any()  # letterboxed, black bars



@pytest.mark.parametrize(("policy", "grid"), [("stretch", (16, 48)), ("fit", (16, 21)), ("crop", (37, 48))])
def test_output_spacing_is_the_packed_grids(tmp_path: Path, policy: str, grid: tuple[int, int]) -> None:
    """metadata.output_spacing is the mm of the packed pixels, not transform.dicom.spacing: 50×64
    at 0.3 mm to 0.7 mm is 21×27 (whole pixels: 15 mm / 21 rows = 0.714 mm), which ``size``
    16×48 then scales to ``grid``: per axis (stretch), by the smaller ratio before the padding
    (fit) or the larger before the cut (crop). The frame's extent, 15 × 19.2 mm, over it."""
    ds = ct_dataset(ct_pixels((50, 64)), PixelSpacing=[0.3, 0.3])
    path = save(ds, tmp_path / "ct.dcm")
    assert read(path, window(40, 400), spacing=(0.7, 0.7))[0].metadata["output_spacing"] == \
        pytest.approx([15 / 21, 19.2 / 27], abs=1e-6)
    sample = read(path, window(40, 400), spacing=(0.7, 0.7), size=(16, 48), resize=policy)[0]
    assert sample.image.shape == (1, 16, 48)
    assert sample.metadata["output_spacing"] == pytest.approx([15 / grid[0], 19.2 / grid[1]], abs=1e-6)


def test_a_file_without_pixel_spacing_is_only_resized_and_says_so(tmp_path: Path) -> None:
    """A radiograph gives Imager Pixel Spacing (at the detector), no Pixel Spacing: nothing says
    its pixels' size at the patient, so spacing cannot apply; the sample must not pass silently
    as if it were at the job's spacing."""
    stored = np.random.default_rng(0).integers(0, 4000, (32, 64)).astype(np.uint16)
    ds = image_dataset(stored, modality="CR", WindowCenter=2000, WindowWidth=4000, ImagerPixelSpacing=[0.2, 0.2])
    sample = read(save(ds, tmp_path / "cr.dcm"), file_window(), spacing=(0.4, 0.4))[0]
    assert sample.image.shape == (1, 32, 64) and "output_spacing" not in sample.metadata
    (warning,) = sample.metadata["warnings"]
    assert "no usable (0028,0030) Pixel Spacing" in warning and "[0.4, 0.4]" in warning
    assert "warnings" not in read(shipped("CT_small.dcm"), window(40, 400), spacing=(1.0, 1.0))[0].metadata


@pytest.mark.parametrize(("written", "why"), [
    (b"0,5\\0,5 ", "value 1 '0,5' is no positive number (a decimal comma: DS writes a period)"),
    (b"NaN\\0.5\\0.7 ", "it holds 3 value(s), not 2"),
    (b"0.5\\-0.5", "value 2 '-0.5' is no positive number"),
], ids=["decimal-comma", "nan-of-three", "negative"])
def test_a_malformed_pixel_spacing_under_spacing_is_unreadable_not_only_resized(tmp_path: Path, written: bytes,
                                                                               why: str) -> None:
    """Pixel Spacing "0,5\\0,5" (a German-locale exporter) was read as if the file had none: under
    ``spacing`` it packed unresampled, at another scale than every other sample, with pixel_spacing
    null and a "no usable Pixel Spacing" warning. Only a file without one is resized alone; a
    malformed one is unreadable, as a damaged Rescale Intercept is, quoting the value."""
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    ds = ct_dataset()
    ds._dict[Tag(0x00280030)] = RawDataElement(Tag(0x00280030), "DS", len(written), written, 0, False, True)
    path = save(ds, tmp_path / "ct.dcm")
    found = read_dicom(make_ref(path), config(window(40, 400), spacing=(0.25, 0.25), size=(32, 32)))
    assert isinstance(found, Issue) and found.reason == "unreadable", found
    assert f"(0028,0030) Pixel Spacing '{written.decode().strip()}' is malformed: {why}" in found.message


def test_a_pixel_spacing_that_resamples_under_two_pixels_is_bad_geometry_not_a_constant_image(
        tmp_path: Path) -> None:
    """Pixel Spacing written in metres ("0.0005" for 0.5 mm) at spacing 0.25 mm resampled a 32×32
    image to 1×1, which ``size`` scaled back to a 32×32 image of one level, packed silently. The
    file is bad_geometry, naming the Pixel Spacing and the grid it would give; 0.5 mm packs."""
    path = save(ct_dataset(ct_pixels((32, 32)), PixelSpacing=[0.0005, 0.0005]), tmp_path / "metres.dcm")
    found = read_dicom(make_ref(path), config(window(40, 400), spacing=(0.25, 0.25), size=(32, 32)))
    assert isinstance(found, Issue) and found.reason == "bad_geometry", found
    assert ("(0028,0030) Pixel Spacing [0.0005, 0.0005] mm resampled to transform.dicom.spacing [0.25, 0.25] mm "
            "turns its 32×32 pixels into 1×1" in found.message)
    fine = save(ct_dataset(ct_pixels((32, 32)), PixelSpacing=[0.5, 0.5]), tmp_path / "mm.dcm")
    assert read(fine, window(40, 400), spacing=(0.25, 0.25), size=(32, 32))[0].image.shape == (1, 32, 32)


# ---------------------------------------------------------------- frames


def _frames() -> np.ndarray:
    return np.stack([ct_pixels((8, 8), seed=s, low=900, high=1300) for s in range(3)])


def test_multiframe_split_and_stack(tmp_path: Path) -> None:
    path = save(ct_dataset(_frames()), tmp_path / "mf.dcm")
    windows = (window(40, 80, name="brain"), window(0, 2000, name="wide"))
    split = read(path, *windows)
    assert [s.key for s in split] == ["s1-f0000", "s1-f0001", "s1-f0002"]
    assert [s.metadata["frame"] for s in split] == [0, 1, 2]
    stack = read(path, *windows, frames="stack")
    assert len(stack) == 1 and stack[0].key == "s1" and stack[0].image.shape == (6, 8, 8)
    np.testing.assert_array_equal(stack[0].image, np.concatenate([s.image for s in split]))
    assert [(w["frame"], w["name"]) for w in stack[0].metadata["windows"]] == [
        (0, "brain"), (0, "wide"), (1, "brain"), (1, "wide"), (2, "brain"), (2, "wide")]
    hu = _frames().astype(float) - 1024
    np.testing.assert_array_equal(split[1].image[0], np.rint(linear(hu[1], 40, 80) * 255))


def test_a_constant_frame_among_good_ones_is_packed_with_a_warning_its_sample_alone_carries(tmp_path: Path) -> None:
    """A multi-frame file whose frame 1 is one stored value (a blank frame of a cine or an
    enhanced export) was packed as if it were an image, with nothing said, while a constant
    single-frame file is a constant_image bad sample. Its other frames are good, so the file
    packs, and frame 1's sample (only it) says it carries no information; in a series job the
    frame is context, as a constant slice is, and says that instead."""
    frames = _frames()
    frames[1] = 1000
    path = save(ct_dataset(frames), tmp_path / "mf.dcm")
    split = read(path, window(40, 80))
    assert [s.metadata.get("warnings", []) for s in split][::2] == [[], []]
    (note,) = split[1].metadata["warnings"]
    assert note.startswith("constant frame: every pixel has the same stored value [1000] in frame 1;"), note
    series = read(path, window(40, 80), sample="volume")
    assert [len(s.metadata.get("warnings", [])) for s in series] == [0, 1, 0]
    assert series[1].metadata["warnings"][0].startswith("constant slice: every pixel has the same stored value [1000]")
    stacked = read(path, window(40, 80), frames="stack")  # one sample: its channels are the frames
    assert "warnings" not in stacked[0].metadata
    frames[:] = 1000
    whole = read_dicom(make_ref(save(ct_dataset(frames), tmp_path / "blank.dcm")), config(window(40, 80)))
    assert isinstance(whole, Issue) and whole.reason == "constant_image", whole


def test_frames_of_another_pixel_spacing_are_not_stacked_as_channels_of_one_grid(tmp_path: Path) -> None:
    """Frame 2's own Pixel Measures say 1.0 mm, frame 0's 0.5: frames: stack resampled (or kept)
    every frame at frame 0's spacing, one channel covering twice the area of the others; split
    resamples each frame by its own."""
    ds = enhanced_ct_dataset(_frames(), rescales=[None] * 3, windows=[None] * 3, shared_rescale=(1.0, -1024.0))
    own = Dataset()
    own.PixelSpacing = [1.0, 1.0]
    ds.PerFrameFunctionalGroupsSequence[2].PixelMeasuresSequence = DicomSequence([own])
    path = save(ds, tmp_path / "scaled.dcm")
    for spacing in (None, (1.0, 1.0)):
        result = read_dicom(make_ref(path), config(window(40, 80), frames="stack", spacing=spacing))
        assert isinstance(result, Issue) and result.reason == "bad_shape", result
        assert "frame 2's Pixel Spacing [1.0, 1.0] mm is not frame 0's [0.5, 0.5] mm" in result.message
    split = read(path, window(40, 80), spacing=(1.0, 1.0))
    assert [s.image.shape for s in split] == [(1, 4, 4), (1, 4, 4), (1, 8, 8)]


def test_enhanced_per_frame_then_shared_lookup(tmp_path: Path) -> None:
    frames = _frames()
    ds = enhanced_ct_dataset(frames, rescales=[(1.0, -1024.0), (2.0, -2048.0), None],
                             windows=[(40, 80), None, (-600, 1500)], shared_rescale=(1.0, -1000.0),
                             shared_window=(300, 600), spacing=(0.8, 0.8))
    path = save(ds, tmp_path / "enhanced.dcm")
    split = read(path)
    hu = [frames[0] - 1024.0, frames[1] * 2.0 - 2048.0, frames[2] - 1000.0]
    expected_windows = [(40, 80), (300, 600), (-600, 1500)]
    for sample, values, (c, w) in zip(split, hu, expected_windows, strict=True):
        np.testing.assert_array_equal(sample.image[0], np.rint(linear(values, c, w) * 255))
        assert (sample.metadata["windows"][0]["center"], sample.metadata["windows"][0]["width"]) == (c, w)
        assert sample.metadata["pixel_spacing"] == [0.8, 0.8]
    assert [s.metadata["rescale_intercept"] for s in split] == [-1024.0, -2048.0, -1000.0]
    floats = read(path, output="float16")
    for sample, values in zip(floats, hu, strict=True):
        np.testing.assert_array_equal(sample.image[0], values.astype(np.float16))


def test_a_top_level_voi_lut_does_not_override_an_enhanced_frames_own_window(tmp_path: Path) -> None:
    """Per frame, then shared, then top level: a stray top-level VOI LUT Sequence rendered every
    frame through its LUT (record 'file_lut') in place of the frame's own Frame VOI LUT window.
    A frame with no Frame VOI LUT item at either level still takes the top-level LUT."""
    frames = _frames()
    ramp = np.rint(np.linspace(0, 4095, 400)).astype(int).tolist()
    for shared_window, expected in (((300, 600), [(40, 80), (300, 600), (-600, 1500)]),
                                    (None, [(40, 80), None, (-600, 1500)])):
        ds = enhanced_ct_dataset(frames, rescales=[None] * 3, windows=[(40, 80), None, (-600, 1500)],
                                 shared_rescale=(1.0, -1024.0), shared_window=shared_window)
        ds.VOILUTSequence = DicomSequence([lut_item(-200, 12, ramp, "STRAY")])
        split = read(save(ds, tmp_path / "enhanced.dcm"))
        for sample, values, pair in zip(split, frames - 1024.0, expected, strict=True):
            record = sample.metadata["windows"][0]
            if pair is None:
                assert (record["source"], record["function"]) == ("file_lut", "LUT")
                continue
            assert (record["source"], record["center"], record["width"]) == ("file", *pair)
            np.testing.assert_array_equal(sample.image[0], np.rint(linear(values, *pair) * 255))


def test_a_frames_own_voi_lut_wins_over_a_top_level_one(tmp_path: Path) -> None:
    """The LUT of the frame's Frame VOI LUT item is the frame's, not the top level's."""
    frames = _frames()[:2]
    ds = enhanced_ct_dataset(frames, rescales=[None] * 2, windows=[None] * 2, shared_rescale=(1.0, -1024.0))
    own = Dataset()
    own.VOILUTSequence = DicomSequence([lut_item(-1024, 8, list(range(256)) * 16, "OWN")])
    ds.PerFrameFunctionalGroupsSequence[0].FrameVOILUTSequence = DicomSequence([own])
    ds.VOILUTSequence = DicomSequence([lut_item(-1024, 8, [255 - v for v in range(256)] * 16, "STRAY")])
    split = read(save(ds, tmp_path / "enhanced.dcm"), file_window("own"), fallback_window=window(40, 80))
    entry = frames[0].astype(int)  # first mapped -1024 HU = stored 0
    np.testing.assert_array_equal(split[0].image[0], (entry % 256).astype(np.uint8))
    assert split[1].metadata["windows"][0]["source"] == "fallback_explicit"  # frame 1 has no LUT called OWN


def test_a_top_level_modality_lut_does_not_override_an_enhanced_frames_own_rescale(tmp_path: Path) -> None:
    """Per frame, then shared, then top level: a stray top-level Modality LUT Sequence replaced each
    frame's Pixel Value Transformation (slope 1, 2, then the shared group's 3)."""
    frames = _frames()
    ds = enhanced_ct_dataset(frames, rescales=[(1.0, -1024.0), (2.0, -2048.0), None], windows=[None] * 3,
                             shared_rescale=(3.0, -1000.0))
    ds.ModalityLUTSequence = DicomSequence([lut_item(0, 16, [0] * 4096)])
    samples = read(save(ds, tmp_path / "enhanced.dcm"), output="float16")
    expected = [frames[0] - 1024.0, frames[1] * 2.0 - 2048.0, frames[2] * 3.0 - 1000.0]
    for sample, values in zip(samples, expected, strict=True):
        assert sample.metadata["modality_lut"] is False
        np.testing.assert_array_equal(sample.image[0], values.astype(np.float16))
    assert [s.metadata["rescale_slope"] for s in samples] == [1.0, 2.0, 3.0]


def test_rt_dose_applies_dose_grid_scaling() -> None:
    path = shipped("rtdose.dcm")
    ds = pydicom.dcmread(path)
    dose = pixel_array(ds).astype(np.float64) * float(ds.DoseGridScaling)
    samples = read(path, output="float16")
    assert len(samples) == 15 and samples[0].metadata["dose_units"] == ds.DoseUnits
    np.testing.assert_array_equal(np.stack([s.image[0] for s in samples]), dose.astype(np.float16))
    windowed = read(path, window(0.6, 1.2, "LINEAR_EXACT"))  # a window in dose units (Gy)
    expected = np.rint(np.clip((dose[3] - 0.6) / 1.2 + 0.5, 0, 1) * 255)
    assert_within_one_lsb(windowed[3].image[0], expected)


def test_a_stray_dose_grid_scaling_in_a_ct_is_ignored(tmp_path: Path) -> None:
    """Dose Grid Scaling is RT Dose's alone (PS3.3 C.8.8.3): a CT carrying one by mistake had
    its HU multiplied by it (0.5: every value halved, without a word)."""
    stored = np.arange(256, dtype=np.int16).reshape(16, 16) * 8
    ds = ct_dataset(stored)
    ds.DoseGridScaling = 0.5
    (sample,) = read(save(ds, tmp_path / "ct.dcm"), output="float16")
    expected = stored.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    np.testing.assert_array_equal(sample.image[0], expected.astype(np.float16))


def test_modality_values_float16_cannot_hold_are_non_finite(tmp_path: Path) -> None:
    """A slope that takes values past ±65504 under output: float16: the record said `unsupported`,
    a reason kept for formats packer does not read; float16 would hold them as infinite."""
    ds = ct_dataset(np.arange(256, dtype=np.int16).reshape(16, 16) * 100, slope=4.0)
    issue = read_dicom(make_ref(save(ds, tmp_path / "big.dcm")), config(output="float16"))
    assert not isinstance(issue, list) and issue.reason == "non_finite", issue
    assert "beyond float16's range" in issue.message and "uint8/uint16 with a window" in issue.message


# ---------------------------------------------------------------- colour


def test_rgb_passes_through_and_ignores_windows(tmp_path: Path) -> None:
    rgb = np.random.default_rng(5).integers(0, 256, (2, 6, 5, 3), dtype=np.uint8)
    path = save(secondary_capture_rgb(rgb), tmp_path / "rgb.dcm")
    samples = read(path, window(40, 80), window(0, 100))
    for frame, sample in enumerate(samples):
        np.testing.assert_array_equal(sample.image, rgb[frame].transpose(2, 0, 1))
        assert sample.metadata["windows"] == []
    np.testing.assert_array_equal(read(path, output="uint16")[0].image, rgb[0].transpose(2, 0, 1).astype(int) * 257)


def test_rgb_of_12_bits_at_uint16_is_the_exact_level(tmp_path: Path) -> None:
    """Every 12-bit value v of an RGB frame, output uint16: round(v · 65535 / 4095), half to even,
    as the README promises for uint16 (computed in float64). In float32, 2593, 3139 and 3685
    came out one level high (58974 for 58973)."""
    values = np.arange(4096, dtype=np.uint16)
    rgb = np.stack([values, values[::-1], (values * 7) % 4096], axis=-1).reshape(64, 64, 3)
    ds = secondary_capture_rgb(rgb)
    ds.BitsStored, ds.HighBit = 12, 11
    image = read(save(ds, tmp_path / "rgb12.dcm"), output="uint16")[0].image
    exact = (rgb.astype(np.int64) * 65535 * 2 + 4095) // (2 * 4095)  # round half up: 4095 is odd, so no ties
    np.testing.assert_array_equal(image, exact.transpose(2, 0, 1))


@pytest.mark.parametrize(("name", "tolerance"), [
    ("SC_ybr_full_422_uncompressed.dcm", 6),  # native YBR_FULL_422
    ("SC_rgb_jpeg_dcmtk.dcm", 6),             # JPEG baseline YBR_FULL
    ("SC_rgb_dcmtk_+eb+cy+s2.dcm", 6),        # JPEG baseline YBR_FULL_422
])
def test_ybr_comes_out_as_rgb(name: str, tolerance: int) -> None:
    reference = pixel_array(pydicom.dcmread(shipped("SC_rgb_rle.dcm"))).transpose(2, 0, 1).astype(int)
    image = one(shipped(name))
    assert image.shape == (3, 100, 100)
    assert np.abs(image.astype(int) - reference).max() <= tolerance


@pytest.mark.parametrize(("name", "noted"), [
    ("SC_rgb_jpeg_dcmtk.dcm", True),           # JPEG Baseline YBR_FULL
    ("SC_rgb_dcmtk_+eb+cy+s2.dcm", True),      # JPEG Baseline YBR_FULL_422
    ("SC_rgb_jpeg_gdcm.dcm", True),            # JPEG Lossless SV1 RGB
    ("GDCMJ2K_TextGBR.dcm", True),             # JPEG 2000 lossless YBR_RCT
    ("SC_rgb_jls_lossy_line.dcm", True),       # JPEG-LS, line interleaved
    ("SC_rgb_jls_lossy_sample.dcm", True),     # JPEG-LS, sample interleaved
    ("SC_rgb_rle.dcm", False),                 # RLE: colour-by-plane by its own definition
])
def test_planar_configuration_1_in_a_compressed_syntax_does_not_scramble_the_colours(tmp_path: Path, name: str,
                                                                                      noted: bool) -> None:
    """PS3.5 8.2: in a compressed transfer syntax the codestream fixes the component layout and
    (0028,0006) Planar Configuration is irrelevant (for JPEG it "shall be 0"), yet devices write
    1. The frame must decode to the same colours as with 0, not the decoder's colour-by-pixel
    output re-read colour-by-plane; where the header was overruled the sample says so."""
    expected = one(shipped(name))
    ds = pydicom.dcmread(shipped(name))
    ds.PlanarConfiguration = 1
    [sample] = read(save(ds, tmp_path / name))
    np.testing.assert_array_equal(sample.image, expected)
    warnings = sample.metadata.get("warnings", [])
    if noted:
        [warning] = warnings
        assert "Planar Configuration is 1" in warning and "PS3.5 8.2" in warning
        assert "decoded colour-by-pixel" in warning
    else:
        assert not warnings


def test_palette_color_goes_through_the_palette() -> None:
    path = shipped("examples_palette.dcm")  # 16-bit palette entries
    ds = pydicom.dcmread(path)
    rgb = apply_color_lut(pixel_array(ds), ds).astype(np.float64)
    expected = np.rint(rgb / 65535 * 255).transpose(2, 0, 1)
    sample = read(path)[0]
    np.testing.assert_array_equal(sample.image, expected)
    assert sample.metadata["palette_bits"] == 16
    assert "warnings" not in sample.metadata  # a 16-bit palette that uses its range


def test_generated_palette_color(tmp_path: Path) -> None:
    index = np.array([[0, 1], [2, 3]], dtype=np.uint8)
    ds = image_dataset(index, photometric="PALETTE COLOR", modality="OT")
    for colour, values in (("Red", [255, 0, 0, 128]), ("Green", [0, 255, 0, 128]), ("Blue", [0, 0, 255, 128])):
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [4, 0, 8])
        setattr(ds, f"{colour}PaletteColorLookupTableData", bytes(values))
    image = one(save(ds, tmp_path / "pal.dcm"))
    np.testing.assert_array_equal(image[:, 0, 0], [255, 0, 0])
    np.testing.assert_array_equal(image[:, 1, 1], [128, 128, 128])


def _palette_file(tmp_path: Path, name: str, bits: int, entries: dict[str, list[int]]) -> Path:
    """A pydicom-written PALETTE COLOR image indexing entries 0..3 of its palette."""
    index = np.array([[0, 1], [2, 3]], dtype=np.uint8)
    ds = image_dataset(index, photometric="PALETTE COLOR", modality="OT")
    for colour, values in entries.items():
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [len(values), 0, bits])
        data = np.asarray(values, dtype="<u2" if bits == 16 else np.uint8).tobytes()
        setattr(ds, f"{colour}PaletteColorLookupTableData", data)
    return save(ds, tmp_path / name)


EIGHT_BIT_COLOURS = {"Red": [255, 0, 0, 128], "Green": [0, 255, 0, 128], "Blue": [0, 0, 255, 128]}


def test_a_16_bit_palette_holding_8_bit_values_is_read_as_declared_and_each_sample_says_so(tmp_path: Path) -> None:
    """PS3.3 C.7.6.3.1.6: a 16-bit palette's entries span 0..65535, so entries of at most 255
    make a nearly black image. Readers do not agree on rescaling such tables (pydicom and GDCM
    keep the entries, Cornerstone shifts them to 0, dcmtk rescales only with --check-lut-depth):
    packer keeps the standard's reading, pydicom's, and records that the palette was not
    rescaled, so a dark sample is explained rather than silent."""
    path = _palette_file(tmp_path, "pal16of8.dcm", 16, EIGHT_BIT_COLOURS)
    ds = pydicom.dcmread(path)
    reference = apply_color_lut(pixel_array(ds), ds)
    assert reference.dtype == np.uint16 and reference.max() == 255  # pydicom: the entries as stored
    sample = read(path)[0]
    np.testing.assert_array_equal(sample.image, np.rint(reference / 65535 * 255).transpose(2, 0, 1))
    np.testing.assert_array_equal(sample.image[:, 0, 0], [1, 0, 0])  # 255 of 65535: level 1
    assert sample.metadata["palette_bits"] == 16
    [warning] = sample.metadata["warnings"]
    assert "declare 16 bits per entry" in warning and "exceeds 255 of 65535" in warning
    assert "the palette was not rescaled" in warning and "multiply each entry by 257" in warning
    json.dumps(sample.metadata)


def test_an_8_bit_palette_holding_16_bit_entries_is_read_as_16_bit_and_each_sample_says_so(tmp_path: Path) -> None:
    """An 8-bit entry cannot exceed 255, so 16-bit words above 255 under an 8-bit descriptor (some
    vendors write these) are 16-bit values: packer reads them over 0..65535, as pydicom's
    apply_color_lut does from the data's length, instead of clipping nearly every colour to 255,
    and records why (the converse of the 16-bit palette holding 8-bit values)."""
    colours = {colour: [v * 257 for v in values] for colour, values in EIGHT_BIT_COLOURS.items()}
    path = _palette_file(tmp_path, "pal8of16.dcm", 16, colours)
    ds = pydicom.dcmread(path)
    for colour in colours:
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [4, 0, 8])  # the data stays 16-bit words
    path = save(ds, tmp_path / "pal8of16.dcm")
    sample = read(path)[0]
    np.testing.assert_array_equal(sample.image[:, 0, 0], [255, 0, 0])
    np.testing.assert_array_equal(sample.image[:, 1, 1], [128, 128, 128])  # 128 × 257 of 65535, not clipped
    assert sample.metadata["palette_bits"] == 16
    [warning] = sample.metadata["warnings"]
    assert "declare 8 bits per entry" in warning and "16-bit entries up to 65535" in warning
    assert "not clipped to 255" in warning


def test_an_8_bit_palette_in_16_bit_words_with_8_bit_values_is_read_as_8_bit(tmp_path: Path) -> None:
    """8-bit entries each stored in a 16-bit word (values at most 255) keep their declared
    0..255 range, with no warning: only entries an 8-bit palette cannot hold make it 16-bit."""
    path = _palette_file(tmp_path, "pal8in16.dcm", 16, EIGHT_BIT_COLOURS)
    ds = pydicom.dcmread(path)
    for colour in EIGHT_BIT_COLOURS:
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [4, 0, 8])
    sample = read(save(ds, tmp_path / "pal8in16.dcm"))[0]
    np.testing.assert_array_equal(sample.image[:, 1, 1], [128, 128, 128])
    assert sample.metadata["palette_bits"] == 8
    assert "warnings" not in sample.metadata


@pytest.mark.parametrize("bits, scale", [(16, 257), (8, 1)])
def test_a_palette_that_uses_its_declared_range_carries_no_palette_warning(tmp_path: Path, bits: int,
                                                                          scale: int) -> None:
    """The same colours as full-range 16-bit entries (value × 257, what careful writers do) or as
    an 8-bit palette: the image is the same, and nothing to warn about."""
    colours = {colour: [v * scale for v in values] for colour, values in EIGHT_BIT_COLOURS.items()}
    sample = read(_palette_file(tmp_path, f"pal{bits}.dcm", bits, colours))[0]
    np.testing.assert_array_equal(sample.image[:, 0, 0], [255, 0, 0])
    np.testing.assert_array_equal(sample.image[:, 1, 1], [128, 128, 128])
    assert "warnings" not in sample.metadata


# ---------------------------------------------------------------- metadata


def test_metadata_is_json_and_carries_no_identifiers(tmp_path: Path) -> None:
    ds = ct_dataset(ct_pixels((8, 8)))
    ds.AccessionNumber = "ACC-777"
    ds.ReferringPhysicianName = "House^Greg"
    meta = read(save(ds, tmp_path / "ct.dcm"), file_window(), window(-600, 1500, name="lung"))[0].metadata
    text = json.dumps(meta)
    for secret in (PATIENT_ID, PATIENT_NAME, "Doe", STUDY_DATE, "19700101", "Elsewhere", "ACC-777", "House"):
        assert secret not in text
    uids = re.findall(r"\d+(?:\.\d+){4,}", text)
    assert uids == [meta["transfer_syntax"]]
    assert meta["modality"] == "CT" and meta["photometric_interpretation"] == "MONOCHROME2"
    assert (meta["rows"], meta["columns"]) == (8, 8)
    assert meta["pixel_spacing"] == [0.5, 0.5] and meta["slice_thickness"] == 1.25
    assert (meta["rescale_slope"], meta["rescale_intercept"]) == (1.0, -1024.0)
    assert meta["body_part_examined"] == "HEAD" and meta["kvp"] == 120.0
    assert meta["manufacturer_model_name"] == "TestScanner 9000"
    assert meta["decoder"] == "pydicom" and meta["transfer_syntax"] == "1.2.840.10008.1.2.1"
    assert [(w["name"], w["center"], w["width"], w["function"]) for w in meta["windows"]] == [
        ("file", 40.0, 80.0, "LINEAR"), ("lung", -600.0, 1500.0, "LINEAR")]


def test_optional_metadata_is_left_out_when_absent(tmp_path: Path) -> None:
    ds = image_dataset(ct_pixels((4, 4)), WindowCenter=100, WindowWidth=200)
    meta = read(save(ds, tmp_path / "bare.dcm"))[0].metadata
    assert not {"body_part_examined", "manufacturer_model_name", "kvp"} & set(meta)
    assert meta["pixel_spacing"] is None


def test_reading_twice_gives_identical_bytes(tmp_path: Path) -> None:
    path = save(ct_dataset(_frames()), tmp_path / "mf.dcm")
    first = [s.image.tobytes() for s in read(path, window(40, 80), size=(5, 7))]
    second = [s.image.tobytes() for s in read(path, window(40, 80), size=(5, 7))]
    assert first == second


def test_enhanced_shared_only_dataset_uses_shared_groups(tmp_path: Path) -> None:
    frames = _frames()[:2]
    ds = enhanced_ct_dataset(frames, rescales=[None, None], windows=[None, None], shared_rescale=(1.0, -1024.0),
                             shared_window=(40, 80))
    del ds.PerFrameFunctionalGroupsSequence
    ds.PerFrameFunctionalGroupsSequence = DicomSequence([Dataset(), Dataset()])
    samples = read(save(ds, tmp_path / "shared.dcm"))
    np.testing.assert_array_equal(samples[1].image[0], np.rint(linear(frames[1] - 1024.0, 40, 80) * 255))


# --- the table of stored values gives the direct path's bits -----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from packer.transform.dicom import (  # noqa: E402
    TABLE_MIN_PIXELS,
    Lut,
    ModalityTransform,
    VoiTransform,
    display_dtype,
    finish_image,
    finish_stored,
    keeps_geometry,
    render_grayscale,
    render_stored,
    to_modality_values,
)
from packer.transform.window import padding_mask  # noqa: E402

_STORED_DTYPES = [np.int16, np.uint16, np.uint8, np.int32, np.uint32, np.int8]


@st.composite
def _stored_frames(draw: Any) -> tuple[np.ndarray, ModalityTransform, tuple[VoiTransform, ...], bool, tuple]:
    dtype = np.dtype(draw(st.sampled_from(_STORED_DTYPES)))
    info = np.iinfo(dtype)
    span = draw(st.integers(1, min(6000, int(info.max) - int(info.min))))
    low = draw(st.integers(int(info.min), int(info.max) - span))
    shape = draw(st.sampled_from([(64, 64), (96, 80), (128, 128), (40, 30)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    stored = rng.integers(low, low + span, size=shape, endpoint=True).astype(dtype)
    if draw(st.booleans()):
        entries = draw(st.integers(1, 300))
        lut = Lut(entries=entries, first_mapped=low + draw(st.integers(0, span)), bits=16,
                  data=tuple(int(v) for v in rng.integers(0, 65535, entries)))
        modality = ModalityTransform(lut=lut)
    else:
        modality = ModalityTransform(slope=draw(st.sampled_from([1.0, 0.5, 2.5, 1e-3, -1.0])),
                                     intercept=draw(st.sampled_from([0.0, -1024.0, 7.25])),
                                     dose_grid_scaling=draw(st.sampled_from([None, 3.3e-5])))
    values = to_modality_values(stored, modality)
    centre = float(np.percentile(values, draw(st.integers(5, 95))))
    vois = []
    for i in range(draw(st.integers(1, 4))):
        function = draw(st.sampled_from(["LINEAR", "LINEAR_EXACT", "SIGMOID", "LUT"]))
        width = max(1.0, float(np.ptp(values)) * draw(st.sampled_from([0.01, 0.3, 1.0, 2.0])))
        if function == "LUT":
            entries = draw(st.integers(2, 500))
            lut = Lut(entries=entries, first_mapped=int(values.min()) + draw(st.integers(0, 50)), bits=12,
                      data=tuple(int(v) for v in rng.integers(0, 4095, entries)))
            vois.append(VoiTransform(name=f"w{i}", function="LUT", source="file_lut", lut=lut))
        else:
            vois.append(VoiTransform(name=f"w{i}", function=function, source="explicit",
                                     center=centre + i * 0.5, width=width))
    padding_value = draw(st.sampled_from([None, "min", "mid"]))
    pad_at = None if padding_value is None else int(stored.min() if padding_value == "min" else stored.flat[7])
    limit = None if pad_at is None or draw(st.booleans()) else int(stored.flat[11])
    return stored, modality, tuple(vois), draw(st.booleans()), (pad_at, limit)


@settings(max_examples=150, deadline=None)
@given(_stored_frames())
def test_stored_value_table_gives_the_direct_paths_bits(frame: tuple) -> None:
    stored, modality, vois, monochrome1, padding = frame
    direct = render_grayscale(to_modality_values(stored, modality), vois, monochrome1=monochrome1,
                              padding=padding_mask(stored, *padding))
    tabled = render_stored(stored, modality, vois, monochrome1=monochrome1, padding=padding)
    assert tabled.dtype == direct.dtype == np.float32 and tabled.shape == direct.shape
    assert tabled.tobytes() == direct.tobytes()
    direct = render_grayscale(to_modality_values(stored, modality), vois, monochrome1=monochrome1,
                              padding=padding_mask(stored, *padding), dtype=np.float64)
    tabled = render_stored(stored, modality, vois, monochrome1=monochrome1, padding=padding, dtype=np.float64)
    assert tabled.dtype == direct.dtype == np.float64 and tabled.tobytes() == direct.tobytes()


@settings(max_examples=150, deadline=None)
@given(_stored_frames(), st.sampled_from(["uint8", "uint16"]), st.sampled_from(["own", "other", None]),
       st.sampled_from(["stretch", "fit", "crop"]), st.sampled_from([None, (0.5, 0.5), (0.7, 0.7)]))
def test_finishing_from_stored_values_gives_the_bytes_of_render_then_finish(
        frame: tuple, output: str, size_kind: str | None, policy: str, spacing: tuple[float, float] | None) -> None:
    """finish_stored quantises the table where the pixel grid is kept (its own size, a spacing
    equal to the frame's); elsewhere it renders then finishes. Either way: the same bytes."""
    stored, modality, vois, monochrome1, padding = frame
    height, width = stored.shape
    size = {"own": (height, width), "other": (height // 2 + 3, width + 5), None: None}[size_kind]
    geometry = {"pixel_spacing": (0.5, 0.5), "spacing": spacing, "size": size}
    dtype = display_dtype(output, keeps_geometry(height, width, **geometry))  # float64: uint16 on its own grid
    expected = finish_image(render_stored(stored, modality, vois, monochrome1=monochrome1, padding=padding,
                                          dtype=dtype), policy=policy, output=output, **geometry)
    got = finish_stored(stored, modality, vois, monochrome1=monochrome1, padding=padding, mask=None, policy=policy,
                        output=output, **geometry)
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.flags.c_contiguous
    assert got.tobytes() == expected.tobytes()
    assert keeps_geometry(height, width, **geometry) == (spacing in (None, (0.5, 0.5)) and size_kind != "other")


def test_stored_value_table_is_used_only_where_it_pays() -> None:
    """A frame smaller than TABLE_MIN_PIXELS, a range wider than a quarter of its pixels, or
    float pixels go the direct way (monkeypatch-free: render_grayscale sees the frame's shape)."""
    seen: list[tuple[int, ...]] = []
    import packer.transform.dicom as dicom_math

    original = dicom_math.render_grayscale

    def spy(values: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(values.shape)
        return original(values, *args, **kwargs)

    voi = (VoiTransform(name="lung", function="LINEAR", source="preset", center=-600, width=1500),)
    side = int(np.sqrt(TABLE_MIN_PIXELS))
    cases = {
        "12-bit slice": (np.arange(512 * 512) % 4096).astype(np.int16).reshape(512, 512),
        "tiny frame": (np.arange((side - 1) ** 2) % 5).astype(np.int16).reshape(side - 1, side - 1),
        "wide range": np.arange(side * side, dtype=np.int32).reshape(side, side) * 9,
        "float pixels": np.linspace(0, 10, side * side, dtype=np.float32).reshape(side, side),
    }
    dicom_math.render_grayscale = spy
    try:
        shapes = {}
        for name, stored in cases.items():
            seen.clear()
            render_stored(stored, ModalityTransform(), voi, monochrome1=False, padding=(None, None))
            shapes[name] = seen[0]
    finally:
        dicom_math.render_grayscale = original
    assert shapes == {"12-bit slice": (1, 4096), "tiny frame": (side - 1, side - 1),
                      "wide range": (side, side), "float pixels": (side, side)}


@pytest.mark.parametrize("entries", [50, 51])
def test_an_8_bit_modality_lut_packed_one_byte_per_entry_is_read_entry_by_entry(tmp_path: Path, entries: int) -> None:
    # PS3.3 C.11.1.1.1: 8-bit LUT Data are "stored in a format equivalent to 8 bits allocated": OW
    # holding one byte per entry (an odd count padded with one byte). Read as 16-bit words, half the
    # entries (each two of them glued) would map every pixel to a wrong modality value.
    table = (np.arange(entries) * 5).astype(np.uint8)
    stored = np.random.default_rng(3).integers(0, entries + 10, (8, 8), dtype=np.uint16)
    ds = image_dataset(stored, modality="OT", WindowCenter=120, WindowWidth=200)
    item = lut_item(5, 8, [0])
    item.LUTDescriptor = [entries, 5, 8]
    item.LUTData = table.tobytes() + b"\0" * (entries % 2)
    ds.ModalityLUTSequence = DicomSequence([item])
    modality = table[np.clip(stored.astype(int) - 5, 0, entries - 1)].astype(float)
    np.testing.assert_array_equal(one(save(ds, tmp_path / "mlut8.dcm"))[0], np.rint(linear(modality, 120, 200) * 255))


def test_an_8_bit_voi_lut_packed_one_byte_per_entry_is_read_entry_by_entry(tmp_path: Path) -> None:
    table = (np.arange(4096) // 16).astype(np.uint8)  # a 12-bit input ramp onto 8-bit output
    stored = np.random.default_rng(4).integers(0, 4096, (8, 8), dtype=np.uint16)
    ds = image_dataset(stored, modality="CR", bits_stored=12)
    item = lut_item(0, 8, [0])
    item.LUTDescriptor = [4096, 0, 8]
    item.LUTData = table.tobytes()
    ds.VOILUTSequence = DicomSequence([item])
    np.testing.assert_array_equal(one(save(ds, tmp_path / "voi8.dcm"))[0], table[stored])


def test_an_8_bit_voi_lut_packed_two_to_a_word_reads_alike_whether_its_lut_data_is_us_or_ow(tmp_path: Path) -> None:
    """PS3.3 C.11.2.1.1 allows LUT Data as US or OW; an explicit-VR export that wrote US words was
    read one entry a word, found half the entries declared, and refused as 'cut short'."""
    table = (np.arange(4096) // 16).astype(np.uint8)
    stored = np.random.default_rng(4).integers(0, 4096, (8, 8), dtype=np.uint16)
    ds = image_dataset(stored, modality="CR", bits_stored=12)
    item = lut_item(0, 8, [0])
    item.LUTDescriptor = [4096, 0, 8]
    del item.LUTData
    item.add_new(0x00283006, "US", [int(w) for w in table.view("<u2")])  # the same bytes, as US words
    ds.VOILUTSequence = DicomSequence([item])
    np.testing.assert_array_equal(one(save(ds, tmp_path / "voi8us.dcm"))[0], table[stored])


def refused(path: Path, *windows: Any) -> Any:
    result = read_dicom(make_ref(path), config(*windows))
    assert not isinstance(result, list), f"packed {len(result)} sample(s); expected a bad sample"
    return result


def test_a_modality_lut_with_fewer_entries_than_its_descriptor_declares_is_refused_naming_both(tmp_path: Path) -> None:
    # 100 entries declared, 10 written: looking up stored values past the 10th would give the last
    # entry for all of them; the file is damaged, and the bad sample says how
    ds = ct_dataset(center=40, width=400)
    item = lut_item(0, 16, list(range(10)))
    item.LUTDescriptor = [100, 0, 16]
    ds.ModalityLUTSequence = DicomSequence([item])
    issue = refused(save(ds, tmp_path / "short.dcm"))
    assert issue.reason == "decode_failed"
    assert "(0028,3002) LUT Descriptor declares 100 entries" in issue.message and "holds 10" in issue.message


@pytest.mark.parametrize(("sequence", "reason"), [("VOILUTSequence", "missing_window"),
                                                  ("ModalityLUTSequence", "decode_failed")])
def test_a_lut_with_more_entries_than_its_descriptor_declares_is_refused_naming_both(
        tmp_path: Path, sequence: str, reason: str) -> None:
    # 2048 entries declared, 4096 written (a botched descriptor): read to the 2048th, every stored
    # value from 2047 up would render as the last entry declared, white, where the data go on
    ds = ct_dataset(intercept=0, center=None if sequence == "VOILUTSequence" else 40,
                    width=None if sequence == "VOILUTSequence" else 400)
    item = lut_item(0, 12, list(range(4096)))
    item.LUTDescriptor = [2048, 0, 12]
    setattr(ds, sequence, DicomSequence([item]))
    issue = refused(save(ds, tmp_path / "long.dcm"))
    assert issue.reason == reason, issue.message
    assert "(0028,3002) LUT Descriptor declares 2048 entries" in issue.message and "holds 4096" in issue.message


@pytest.mark.parametrize("bits", [0, 17])
def test_a_voi_lut_whose_descriptor_gives_no_valid_entry_size_is_a_missing_window_not_an_unexpected_error(
        tmp_path: Path, bits: int) -> None:
    ds = ct_dataset(center=None, width=None)
    item = lut_item(0, 16, list(range(10)))
    item.LUTDescriptor = [10, 0, bits]
    ds.VOILUTSequence = DicomSequence([item])
    issue = refused(save(ds, tmp_path / "bits.dcm"))
    assert issue.reason == "missing_window", issue.message
    assert f"{bits} bits per entry" in issue.message and "bits.dcm" in issue.message


def test_a_window_pair_behind_a_voi_lut_item_of_its_index_is_told_how_to_reach_it(tmp_path: Path) -> None:
    """A mammogram with one VOI LUT item and one Window Center/Width pair (no explanation):
    {file: 0} is the LUT, and {file: 1} said "no pair #1 (it has 1 pair(s) ...)", pointing back to
    index 0. It now says the pair shares its index with the LUT and how to reach it."""
    ramp = np.sqrt(np.linspace(0, 1, 400)) * 4095
    ds = ct_dataset(ct_pixels((16, 16), seed=2, low=600, high=1600), center=2000, width=1000)
    ds.VOILUTSequence = DicomSequence([lut_item(-200, 12, np.rint(ramp).astype(int).tolist())])
    path = save(ds, tmp_path / "mg.dcm")
    assert read(path, file_window(0))[0].metadata["windows"][0]["function"] == "LUT"
    issue = refused(path, file_window(1))
    assert issue.reason == "missing_window"
    assert "its pair #0 shares its index with VOI LUT Sequence item(s)" in issue.message, issue.message
    assert '{file: "TEXT"}' in issue.message and "{center: C, width: W}" in issue.message


def test_a_window_center_that_is_no_number_keeps_its_place_and_is_named(tmp_path: Path) -> None:
    # Window Center 'abc\-600' with Width '400\1500': pair #1 is -600/1500 and pair #0 is damaged.
    # Dropping 'abc' would shift -600 into pair #0 and pack it under width 400, a window no one wrote.
    ds = ct_dataset(center=None, width=None, WindowCenter=["9137", "-600"], WindowWidth=["400", "1500"])
    path = save(ds, tmp_path / "damaged.dcm")
    path.write_bytes(path.read_bytes().replace(b"9137", b"abc "))
    hu = ct_pixels().astype(float) - 1024
    np.testing.assert_array_equal(one(path, file_window(1))[0], np.rint(linear(hu, -600, 1500) * 255))
    issue = refused(path, file_window(0))
    assert issue.reason == "missing_window"
    assert "(0028,1050) Window Center value #0 'abc' is not a number" in issue.message, issue.message


def test_an_enhanced_file_with_fewer_per_frame_groups_than_frames_is_refused_not_rescaled_by_the_shared_group(
        tmp_path: Path) -> None:
    # PS3.3 C.7.6.16: one Per-frame Functional Groups item per frame. Frames 1 and 2 here have
    # none: their own rescale (whatever it was) is lost, and the shared group's would be a guess.
    frames = np.random.default_rng(5).integers(0, 3000, (3, 8, 8), dtype=np.uint16)
    ds = enhanced_ct_dataset(frames, [(2.0, -2048.0)] * 3, [(40.0, 400.0)] * 3, shared_rescale=(1.0, -1024.0),
                             shared_window=(40.0, 400.0))
    ds.PerFrameFunctionalGroupsSequence = DicomSequence(list(ds.PerFrameFunctionalGroupsSequence)[:1])
    issue = refused(save(ds, tmp_path / "short_groups.dcm"))
    assert issue.reason == "unreadable"
    assert "(5200,9230) Per-frame Functional Groups Sequence has 1 item(s) for 3 frames" in issue.message, issue.message


def test_an_enhanced_file_with_more_per_frame_groups_than_frames_is_refused(tmp_path: Path) -> None:
    """5 items for 4 frames were packed: which item is which frame's is unknown, so a frame could
    take another's rescale, window or position."""
    frames = np.random.default_rng(6).integers(0, 3000, (3, 8, 8), dtype=np.uint16)
    ds = enhanced_ct_dataset(frames, [(2.0, -2048.0)] * 3, [(40.0, 400.0)] * 3, shared_rescale=(1.0, -1024.0))
    ds.PerFrameFunctionalGroupsSequence = DicomSequence([*ds.PerFrameFunctionalGroupsSequence,
                                                         ds.PerFrameFunctionalGroupsSequence[0]])
    issue = refused(save(ds, tmp_path / "long_groups.dcm"))
    assert issue.reason == "unreadable"
    assert "(5200,9230) Per-frame Functional Groups Sequence has 4 item(s) for 3 frames" in issue.message, issue.message


@pytest.mark.parametrize(("vr", "value", "limit"), [("US", 63536, 63036), ("SS", -2000, -2500)])
def test_a_pixel_padding_value_written_as_us_over_signed_pixels_is_read_as_signed(
        tmp_path: Path, vr: str, value: int, limit: int) -> None:
    # (0028,0120)/(0028,0121) are US or SS by Pixel Representation (PS3.3 C.7.5.1.1.2); some writers
    # store -2000 over signed CT pixels as US 63536. Compared with 63536 no pixel was padding: the
    # -2000 and -2500 pixels were windowed as -3024/-3524 HU tissue and took the float16 minimum.
    stored = np.array([[1024, 1064], [-2000, -2500]], dtype=np.int16)
    ds = ct_dataset(stored)
    ds.add_new(0x00280120, vr, value)
    ds.add_new(0x00280121, vr, limit)
    path = save(ds, tmp_path / f"{vr}.dcm")
    np.testing.assert_array_equal(one(path, output="float16")[0], [[0, 40], [0, 0]])
