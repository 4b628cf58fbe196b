"""Vendor quirks of real DICOM files: attributes beside the pixels that change what they mean.

Presentation LUT Shape INVERSE on a MONOCHROME2 radiograph, Float Pixel Padding Value on float
pixel data, a palette whose LUT Data does not hold the entries its descriptor declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dicom_files import config, image_dataset, make_ref, save, window

from packer.config import WindowSpec
from packer.read.dicom import read_dicom
from packer.records import Issue, Sample

CR = "1.2.840.10008.5.1.4.1.1.1"  # CR Image Storage
# 12-bit stored values 0, 1365, 2730, 4095 under Window 2048/4096 (LINEAR): y = (s - 2047.5)/4095 + 1/2
STORED = np.array([[0, 1365], [2730, 4095]], dtype=np.uint16)
LEVELS = np.rint(np.clip((STORED - 2047.5) / 4095 + 0.5, 0, 1) * 255)  # 0, 85, 170, 255: dark → bright


def read(path: Path, *windows: WindowSpec, **kwargs: Any) -> list[Sample]:
    result = read_dicom(make_ref(path), config(*windows, **kwargs))
    assert isinstance(result, list), f"{result.reason}: {result.message}"
    return result


def radiograph(tmp_path: Path, name: str, photometric: str, shape: str | None, stored: np.ndarray = STORED,
               **attrs: Any) -> Path:
    ds = image_dataset(stored, photometric=photometric, modality="CR", sop_class=CR, bits_stored=12,
                       WindowCenter=2048, WindowWidth=4096, **attrs)
    if shape is not None:
        ds.PresentationLUTShape = shape
    return save(ds, tmp_path / f"{name}.dcm")


# ---------------------------------------------------------------- Presentation LUT Shape (2050,0020)


def test_monochrome2_with_presentation_lut_shape_inverse_is_rendered_inverted(tmp_path: Path) -> None:
    """PS3.3 C.11.6.1.2: INVERSE means the output after inversion is in P-values: the minimum
    displays white, as a viewer (DCMTK) shows it. A MONOCHROME2 CR with INVERSE is packed as its
    MONOCHROME1 twin is, and its sample says why (``presentation_lut_shape``)."""
    sample = read(radiograph(tmp_path, "inverse", "MONOCHROME2", "INVERSE"))[0]
    np.testing.assert_array_equal(sample.image[0], 255 - LEVELS)
    assert sample.metadata["presentation_lut_shape"] == "INVERSE"
    assert sample.metadata["photometric_interpretation"] == "MONOCHROME2"  # the file's, as written
    twin = read(radiograph(tmp_path, "mono1", "MONOCHROME1", None))[0]
    np.testing.assert_array_equal(sample.image, twin.image)


@pytest.mark.parametrize(("photometric", "shape", "expected"), [
    ("MONOCHROME2", "IDENTITY", LEVELS), ("MONOCHROME2", None, LEVELS),
    ("MONOCHROME1", "INVERSE", 255 - LEVELS),  # the value the standard pairs with MONOCHROME1: inverted once
    ("MONOCHROME1", "IDENTITY", 255 - LEVELS), ("MONOCHROME1", None, 255 - LEVELS)])
def test_identity_absent_and_monochrome1_with_inverse_keep_their_polarity(
        tmp_path: Path, photometric: str, shape: str | None, expected: np.ndarray) -> None:
    sample = read(radiograph(tmp_path, "cr", photometric, shape))[0]
    np.testing.assert_array_equal(sample.image[0], expected)
    assert "presentation_lut_shape" not in sample.metadata


def test_inverse_padding_float16_fit_border_and_zscore_follow_the_inverted_display(tmp_path: Path) -> None:
    """Everything MONOCHROME1 does for its inversion, MONOCHROME2 + INVERSE does: padding stays
    black after inversion; float16 modality values (kept as stored, inverted by the window applied
    later) give padding and fit's border the largest real value; a z-score is negated and says
    ``inverted: true``."""
    stored = np.array([[0, 1365], [2730, 4000]], dtype=np.uint16)
    path = radiograph(tmp_path, "pad", "MONOCHROME2", "INVERSE", stored, PixelPaddingValue=4000)
    np.testing.assert_array_equal(read(path)[0].image[0], [[255, 170], [85, 0]])  # padding: black
    np.testing.assert_array_equal(read(path, output="float16")[0].image[0], [[0, 1365], [2730, 2730]])
    boxed = read(path, output="float16", size=(2, 4), resize="fit")[0].image[0]
    assert boxed[:, 0].tolist() == [2730, 2730] and boxed[:, -1].tolist() == [2730, 2730]
    zscore = WindowSpec(kind="zscore", name="zscore-all", over="all")
    sample = read(path, zscore, window(2048, 4096), output="float16")[0]
    real = np.array([0.0, 1365.0, 2730.0])
    z = (real - real.mean()) / real.std()
    np.testing.assert_allclose(sample.image[0], [[-z[0], -z[1]], [-z[2], -z[2]]], rtol=1e-3)  # padding: lowest -z
    assert sample.metadata["windows"][0]["inverted"] is True
    np.testing.assert_allclose(sample.image[1], [[1.0, 2 / 3], [1 / 3, 0.0]], atol=1e-3)


# ---------------------------------------------------------------- Float Pixel Padding Value (0028,0122)/(0028,0123)

PARAMETRIC_MAP = "1.2.840.10008.5.1.4.1.1.30"
TISSUE = np.array([[0.5, 1.0, 1.5], [2.0, 2.5, 3.0]])


def float_map(tmp_path: Path, name: str, values: np.ndarray, *, double: bool = False, **attrs: Any) -> Path:
    """An MR Parametric Map of Float Pixel Data (Double Float Pixel Data where ``double``)."""
    ds = image_dataset(np.zeros(values.shape, np.uint16), modality="MR", sop_class=PARAMETRIC_MAP, **attrs)
    del ds.PixelData
    bits = 64 if double else 32
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, bits, bits - 1
    stored = values.astype(np.float64 if double else np.float32)
    if double:
        ds.DoubleFloatPixelData = stored.tobytes()
    else:
        ds.FloatPixelData = stored.tobytes()
    return save(ds, tmp_path / f"{name}.dcm")


def padded(value: float) -> np.ndarray:
    """:data:`TISSUE` with a left column of ``value`` (outside the field of view)."""
    return np.concatenate([np.full((2, 1), value), TISSUE], axis=1)


@pytest.mark.parametrize(("double", "attrs"), [
    (False, {"FloatPixelPaddingValue": -3024.0}),
    (True, {"DoubleFloatPixelPaddingValue": -3024.0})])
def test_float_pixel_padding_value_masks_float_pixel_data(tmp_path: Path, double: bool, attrs: dict[str, Any]
                                                          ) -> None:
    """PS3.3 C.7.5.1.1.2/C.7.6.3: Float Pixel Data marks its padding with Float Pixel Padding Value
    (0028,0122), Double Float Pixel Data with (0028,0123); (0028,0120) is for integer pixels only.
    The padding is masked as the integer one is: under float16 it takes the frame's smallest real
    value, a percentiles window's statistics leave it out, and a window renders it black."""
    path = float_map(tmp_path, "map", padded(-3024.0), double=double, **attrs)
    np.testing.assert_array_equal(read(path, output="float16")[0].image[0], padded(0.5))
    percentiles = WindowSpec(kind="percentiles", name="p0-100", low=0.0, high=100.0, over="all")
    sample = read(path, percentiles)[0]
    stats = sample.metadata["windows"][0]
    assert (stats["low"], stats["high"], stats["count"]) == (0.5, 3.0, 6)
    np.testing.assert_array_equal(sample.image[0], padded(0.5) * 0 + np.rint((padded(0.5) - 0.5) / 2.5 * 255))


def test_float_pixel_padding_range_limit_masks_every_value_between(tmp_path: Path) -> None:
    """Float Pixel Padding Range Limit (0028,0124): every value between it and the padding value,
    inclusive, in either order, is padding."""
    values = padded(-3024.0)
    values[1, 0] = -1000.0
    path = float_map(tmp_path, "range", values, FloatPixelPaddingValue=-1000.0,
                     FloatPixelPaddingRangeLimit=-3024.0)
    np.testing.assert_array_equal(read(path, output="float16")[0].image[0], padded(0.5))


def test_a_float_map_with_only_the_integer_pixel_padding_value_is_read_as_before(tmp_path: Path) -> None:
    """(0028,0120) on float pixel data is not what the standard says, but a writer that put it
    there meant padding: without a float padding value it is masked as it always was."""
    path = float_map(tmp_path, "int-pad", padded(0.0), PixelPaddingValue=0)
    np.testing.assert_array_equal(read(path, output="float16")[0].image[0], padded(0.5))


def test_a_float_map_whose_padding_is_every_pixel_names_the_float_padding_value(tmp_path: Path) -> None:
    path = float_map(tmp_path, "all-pad", np.full((2, 3), -3024.0), FloatPixelPaddingValue=-3024.0)
    result = read_dicom(make_ref(path), config())
    assert isinstance(result, Issue) and result.reason == "constant_image", result
    assert "(0028,0122) Float Pixel Padding Value" in result.message, result.message


# ---------------------------------------------------------------- Palette Color LUT Data length


def palette_image(tmp_path: Path, name: str, declared: int, bits: int, data: dict[str, bytes]) -> Path:
    """A PALETTE COLOR image indexing entries 0..3, its descriptors declaring ``declared``
    entries of ``bits`` bits, its Red/Green/Blue LUT Data the given bytes."""
    ds = image_dataset(np.array([[0, 1], [2, 3]], dtype=np.uint8), photometric="PALETTE COLOR", modality="US")
    for colour, raw in data.items():
        setattr(ds, f"{colour}PaletteColorLookupTableDescriptor", [declared, 0, bits])
        ds[f"{colour}PaletteColorLookupTableDescriptor"].VR = "US"
        setattr(ds, f"{colour}PaletteColorLookupTableData", raw)
    return save(ds, tmp_path / f"{name}.dcm")


def words(count: int) -> bytes:
    return (np.arange(count) * 8000).astype("<u2").tobytes()


@pytest.mark.parametrize(("entries", "holds"), [(7, "14 bytes (7 16-bit entries"), (9, "18 bytes (9 16-bit entries")])
def test_a_palette_whose_lut_data_does_not_hold_its_declared_entries_is_decode_failed_naming_both(
        tmp_path: Path, entries: int, holds: str) -> None:
    """PS3.3 C.7.6.3.1.6: the descriptor's first value is the palette's entry count. LUT Data of 7
    (or 9) 16-bit entries under a descriptor declaring 8 is a palette cut short (or a botched
    descriptor), refused as a Modality LUT of the wrong count is: decode_failed naming the
    palette's descriptor and data and both counts, never pydicom's "data type 'uint14' not
    understood"."""
    path = palette_image(tmp_path, "short", 8, 16, {colour: words(entries) for colour in ("Red", "Green", "Blue")})
    result = read_dicom(make_ref(path), config())
    assert isinstance(result, Issue) and (result.stage, result.reason) == ("read", "decode_failed"), result
    message = result.message
    assert "(0028,1101) Red Palette Color Lookup Table Descriptor declares 8 entries" in message, message
    assert f"(0028,1201) Red Palette Color Lookup Table Data holds {holds}" in message, message
    assert "short.dcm" in message and "not understood" not in message


def test_one_colour_of_the_palette_cut_short_is_named(tmp_path: Path) -> None:
    path = palette_image(tmp_path, "green", 4, 16, {"Red": words(4), "Green": words(3), "Blue": words(4)})
    result = read_dicom(make_ref(path), config())
    assert isinstance(result, Issue) and result.reason == "decode_failed", result
    assert "(0028,1202) Green Palette Color Lookup Table Data holds 6 bytes" in result.message, result.message


@pytest.mark.parametrize(("bits", "data"), [(16, words(4)), (8, bytes([0, 60, 120, 180])), (8, words(4))])
def test_palettes_of_one_byte_or_one_word_an_entry_are_read(tmp_path: Path, bits: int, data: bytes) -> None:
    """The two layouts a palette's entries come in: one 16-bit word each (2n bytes) or one byte
    each (n bytes), whatever the descriptor's bits say (an 8-bit descriptor over words is read
    as 16-bit, as pydicom reads it)."""
    path = palette_image(tmp_path, "ok", 4, bits, {colour: data for colour in ("Red", "Green", "Blue")})
    [sample] = read(path)
    assert sample.image.shape == (3, 2, 2)
