"""Window, LUT, padding and inversion maths on a few pixels with hand-computed answers."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

from packer.transform.dicom import (
    ModalityTransform,
    VoiTransform,
    quantise,
    render_grayscale,
    render_modality_float,
    resample_to_spacing,
    to_modality_values,
)
from packer.transform.window import (
    PRESETS,
    apply_modality,
    apply_modality_lut,
    apply_voi_lut,
    apply_window,
    check_window,
    invert_monochrome1,
    padding_mask,
    voi_lut_bits,
)

# ---------------------------------------------------------------- presets


@pytest.mark.parametrize(("name", "center", "width"), [
    ("brain", 40, 80), ("subdural", 80, 200), ("stroke", 40, 40), ("head_soft_tissue", 40, 380),
    ("bone", 600, 2800), ("lung", -600, 1500), ("mediastinum", 50, 350), ("abdomen", 50, 400),
    ("liver", 30, 150), ("bone_body", 400, 1800),
])
def test_presets_match_the_domain_table(name: str, center: float, width: float) -> None:
    preset = PRESETS[name]
    assert (preset.center, preset.width, preset.function) == (center, width, "LINEAR")
    assert preset.source, f"preset {name} must cite its source"


def test_presets_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["brain"].center = 0  # type: ignore[misc]


# ---------------------------------------------------------------- LINEAR (PS3.3 C.11.2.1.2)

def test_linear_hand_computed() -> None:
    # c=40, w=80: c-0.5 = 39.5, w-1 = 79; 0 below x <= 39.5 - 39.5 = 0, 1 above x > 39.5 + 39.5 = 79,
    # in between (x - 39.5)/79 + 0.5 = x/79.
    x = np.array([-100, 0, 0.5, 20, 39.5, 79, 79.001, 1000])
    expected = [0, 0, 0.5 / 79, 20 / 79, 0.5, 1.0, 1.0, 1.0]
    y = apply_window(x, 40, 80, "LINEAR")
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-7)


def test_linear_boundaries_are_exactly_where_the_standard_puts_them() -> None:
    c, w = 50.0, 350.0
    low = c - 0.5 - (w - 1) / 2       # x <= low -> 0
    high = c - 0.5 + (w - 1) / 2      # x > high -> 1
    y = apply_window(np.array([low, low + 1e-6, high, np.nextafter(high, np.inf)]), c, w)
    assert y[0] == 0.0 and y[1] == pytest.approx(1e-6 / (w - 1), rel=1e-3)
    assert y[2] == pytest.approx(1.0) and y[3] == 1.0


def test_linear_width_one_is_a_threshold() -> None:
    # w = 1: 0 for x <= c - 0.5, 1 above; no ramp and no division by zero.
    y = apply_window(np.array([9.0, 9.5, 9.51, 10.0, 11.0]), 10, 1)
    np.testing.assert_array_equal(y, [0, 0, 1, 1, 1])


# ---------------------------------------------------------------- LINEAR_EXACT and SIGMOID (C.11.2.1.3)

def test_linear_exact_hand_computed() -> None:
    # c=40, w=80: 0 for x <= 0, 1 for x > 80, else (x - 40)/80 + 0.5 = x/80.
    y = apply_window(np.array([-1, 0, 20, 40, 80, 80.5]), 40, 80, "LINEAR_EXACT")
    np.testing.assert_allclose(y, [0, 0, 0.25, 0.5, 1.0, 1.0], rtol=1e-6)


def test_linear_exact_allows_width_below_one() -> None:
    y = apply_window(np.array([9.7, 9.8, 10.0, 10.3]), 10, 0.4, "LINEAR_EXACT")
    np.testing.assert_allclose(y, [0, 0, 0.5, 1], atol=1e-6)


def test_sigmoid_hand_computed() -> None:
    # 1 / (1 + exp(-4 (x - c) / w)) with c = 40, w = 80.
    x = np.array([40.0, 60.0, 0.0, 20.0])
    expected = [0.5, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(2)), 1 / (1 + math.exp(1))]
    np.testing.assert_allclose(apply_window(x, 40, 80, "SIGMOID"), expected, rtol=1e-6)


def test_sigmoid_is_not_clipped_and_never_overflows() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = apply_window(np.array([-1e12, 39.0, 1e12]), 40, 1e-3, "SIGMOID")
    assert y[0] == 0.0 and y[2] == 1.0
    # "No clipping": far outside the window the curve keeps moving, it does not flatten at the edge.
    tails = apply_window(np.array([-100.0, -60.0, 140.0, 180.0]), 40, 80, "SIGMOID")
    assert 0.0 < tails[0] < tails[1] < 0.01 and 0.99 < tails[2] < tails[3] < 1.0


@pytest.mark.parametrize(("center", "width", "function"), [
    (40, 0.5, "LINEAR"), (40, 0, "LINEAR_EXACT"), (40, -1, "SIGMOID"), (40, 80, "GAMMA"), (math.nan, 80, "LINEAR"),
])
def test_invalid_windows_raise(center: float, width: float, function: str) -> None:
    with pytest.raises(ValueError):
        check_window(center, width, function)
    with pytest.raises(ValueError):
        apply_window(np.zeros(2), center, width, function)


def test_apply_window_does_not_mutate_its_input() -> None:
    x = np.array([0, 40, 80], dtype=np.int16)
    apply_window(x, 40, 80)
    np.testing.assert_array_equal(x, [0, 40, 80])


# ---------------------------------------------------------------- LUTs (C.11.1.1, C.11.2.1.1)

def test_voi_lut_hand_computed() -> None:
    # 4 entries from input 10, 8 bits: [0, 85, 170, 255] / 255; below 10 -> first, past 13 -> last.
    y = apply_voi_lut(np.array([5, 10, 11, 12, 13, 100]), (4, 10, 8), np.array([0, 85, 170, 255]))
    np.testing.assert_allclose(y, [0, 0, 1 / 3, 2 / 3, 1, 1], rtol=1e-6)


def test_voi_lut_with_negative_first_value_and_12_bits() -> None:
    y = apply_voi_lut(np.array([-3.0, -2.0, -1.5, -1.0, 0.0, 5.0]), (3, -2, 12), np.array([0, 2048, 4095]))
    # -1.5 floors to -2, the first entry.
    np.testing.assert_allclose(y, [0, 0, 0, 2048 / 4095, 1, 1], rtol=1e-6)


def test_a_voi_lut_of_12_bit_data_under_a_16_bit_descriptor_is_read_in_the_range_its_data_use() -> None:
    # Agfa CRs (and others) declare 16 bits per entry for LUT Data of 12: divided by 65535 the image
    # was nearly black (nearly white once MONOCHROME1 is inverted); dcm4che #413, Horos, Cornerstone
    # and dicom-rs read the range from the data. A LUT that reaches its declared range is unchanged.
    data = np.array([0, 1024, 2048, 4095])
    y = apply_voi_lut(np.array([0, 1, 2, 3]), (4, 0, 16), data)
    np.testing.assert_allclose(y, data / 4095, rtol=1e-6)
    assert voi_lut_bits(16, data) == 12 and voi_lut_bits(12, data) == 12
    full = np.array([0, 30000, 65535])
    np.testing.assert_allclose(apply_voi_lut(np.array([0, 1, 2]), (3, 0, 16), full), full / 65535, rtol=1e-6)
    assert voi_lut_bits(16, np.array([0, 40000])) == 16  # the upper half used: as declared
    assert voi_lut_bits(16, np.array([0, 100])) == 8 and voi_lut_bits(8, np.array([0, 100])) == 8


def test_modality_rescale_hand_computed() -> None:
    values = apply_modality(np.array([0, 1000, 2000], dtype=np.uint16), 1.0, -1024.0)
    assert values.dtype == np.float64
    np.testing.assert_array_equal(values, [-1024, -24, 976])
    np.testing.assert_array_equal(apply_modality(np.array([3]), 0.5, 1.0), [2.5])


def test_modality_lut_hand_computed() -> None:
    out = apply_modality_lut(np.array([-5, 0, 1, 2, 9]), 0, np.array([100, 200, 300]))
    np.testing.assert_array_equal(out, [100, 100, 200, 300, 300])


def test_modality_transform_prefers_lut_and_scales_dose() -> None:
    from packer.transform.dicom import Lut

    lut = Lut(entries=3, first_mapped=0, bits=16, data=(100, 200, 300))
    np.testing.assert_array_equal(
        to_modality_values(np.array([[0, 2]]), ModalityTransform(slope=5, intercept=7, lut=lut)), [[100, 300]])
    dose = to_modality_values(np.array([[1000, 2]], dtype=np.uint32), ModalityTransform(dose_grid_scaling=1e-3))
    np.testing.assert_allclose(dose, [[1.0, 0.002]])


# ---------------------------------------------------------------- padding and MONOCHROME1

def test_padding_mask_value_and_range() -> None:
    stored = np.array([-2000, -1500, -1000, -999, 0])
    np.testing.assert_array_equal(padding_mask(stored, -2000), [True, False, False, False, False])
    np.testing.assert_array_equal(padding_mask(stored, -2000, -1000), [True, True, True, False, False])
    np.testing.assert_array_equal(padding_mask(stored, -1000, -2000), [True, True, True, False, False])
    assert not padding_mask(stored, None).any()


def test_invert_monochrome1() -> None:
    np.testing.assert_allclose(invert_monochrome1(np.array([0.0, 0.25, 1.0])), [1.0, 0.75, 0.0])


def test_render_grayscale_inverts_then_blacks_out_padding() -> None:
    values = np.array([[-3024.0, 39.5], [0.0, 80.0]])
    padding = np.array([[True, False], [False, False]])
    brain = VoiTransform(name="brain", function="LINEAR", source="preset", center=40, width=80)
    mono2 = render_grayscale(values, (brain,), monochrome1=False, padding=padding)[:, :, 0]
    mono1 = render_grayscale(values, (brain,), monochrome1=True, padding=padding)[:, :, 0]
    np.testing.assert_allclose(mono2, [[0, 0.5], [0, 1]], atol=1e-7)
    np.testing.assert_allclose(mono1, [[0, 0.5], [1, 0]], atol=1e-7)  # padding stays black


def test_render_grayscale_channels_follow_window_order() -> None:
    values = np.array([[0.0, 100.0]])
    a = VoiTransform(name="a", function="LINEAR_EXACT", source="explicit", center=0, width=200)
    b = VoiTransform(name="b", function="LINEAR_EXACT", source="explicit", center=100, width=200)
    out = render_grayscale(values, (a, b), monochrome1=False, padding=np.zeros((1, 2), bool))
    np.testing.assert_allclose(out[0], [[0.5, 0.0], [1.0, 0.5]])


def test_float16_render_fills_padding_with_the_smallest_real_value() -> None:
    values = np.array([[-3024.0, -1000.0], [40.0, 500.0]])
    out = render_modality_float(values, padding=np.array([[True, False], [False, False]]))
    np.testing.assert_array_equal(out[:, :, 0], [[-1000, -1000], [40, 500]])
    inverted = render_modality_float(values, padding=np.array([[True, False], [False, False]]), monochrome1=True)
    np.testing.assert_array_equal(inverted[:, :, 0], [[500, -1000], [40, 500]])  # black once inverted
    with pytest.raises(ValueError, match="float16"):
        render_modality_float(np.array([[70000.0]]), padding=np.zeros((1, 1), bool))


# ---------------------------------------------------------------- quantise and spacing

def test_quantise_rounds_and_clips() -> None:
    y = np.array([[[0.0], [0.5], [1 / 255 * 3.49], [1.2], [-0.1]]], dtype=np.float32)
    np.testing.assert_array_equal(quantise(y, "uint8")[0, :, 0], [0, 128, 3, 255, 0])
    np.testing.assert_array_equal(quantise(y, "uint16")[0, :, 0], [0, 32768, round(3.49 * 257), 65535, 0])
    with pytest.raises(ValueError):
        quantise(y, "int8")


def test_resample_to_spacing_uses_row_then_column_spacing() -> None:
    image = np.zeros((4, 6, 1), dtype=np.float32)
    assert resample_to_spacing(image, (0.5, 1.0), (1.0, 1.0)).shape == (2, 6, 1)
    assert resample_to_spacing(image, (1.0, 0.5), (1.0, 0.25)).shape == (4, 12, 1)
