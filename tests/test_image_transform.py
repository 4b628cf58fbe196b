"""packer.transform.image: alpha, colour, windows, resize, tiles — on arrays and through
read_image on real files written with OpenCV. Expected pixels are computed by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import ImageTransformConfig
from packer.read.image import read_image
from packer.records import Issue, Sample, SampleRef
from packer.transform.image import (
    convert_color,
    orient_image,
    remove_alpha,
    tile_origins,
    to_uint8,
    transform_image,
    window_center_width,
    window_percentiles,
)
from packer.transform.resize import resize_image

RNG = np.random.default_rng(7)


def make_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="scan-7", source="photos", kind="image", path=str(path), relpath=path.name)


def write_png(path: Path, array: np.ndarray) -> Path:
    assert cv2.imwrite(str(path), array)
    return path


def read_ok(path: Path, cfg: ImageTransformConfig) -> list[Sample]:
    result = read_image(make_ref(path), cfg)
    assert not isinstance(result, Issue), result
    return result


# --- alpha and colour -------------------------------------------------------------------------

def test_alpha_drop_and_composite_over_white(tmp_path: Path) -> None:
    bgra = np.array([[[0, 0, 200, 51], [10, 20, 30, 255], [90, 60, 30, 0]]], dtype=np.uint8)
    path = write_png(tmp_path / "rgba.png", bgra)
    [dropped] = read_ok(path, ImageTransformConfig(alpha="drop"))
    np.testing.assert_array_equal(dropped.image[:, 0], [[200, 30, 30], [0, 20, 60], [0, 10, 90]])
    [over_white] = read_ok(path, ImageTransformConfig(alpha="composite"))
    # pixel 0, a = 51/255 = 0.2: R = 200·0.2 + 255·0.8 = 244, G = B = 0·0.2 + 255·0.8 = 204
    # pixel 1 is opaque (unchanged); pixel 2 is fully transparent (white)
    np.testing.assert_array_equal(over_white.image[:, 0], [[244, 30, 255], [204, 20, 255], [204, 10, 255]])
    assert over_white.metadata["source_channels"] == 4


def test_source_channels_are_what_the_file_stores_not_what_opencv_decodes(tmp_path: Path) -> None:
    """OpenCV decodes a grey+alpha PNG as four channels and a CMYK JPEG as three; the record
    says what the file holds, as its header does."""
    grey = np.full((4, 6), 90, np.uint8)
    grey[1, 2] = 200
    alpha = np.full((4, 6), 255, np.uint8)
    path = tmp_path / "ga.png"
    path.write_bytes(_png_grey_alpha(grey, alpha))
    decoded = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert decoded.shape == (4, 6, 4)  # what OpenCV makes of it
    [sample] = read_ok(path, ImageTransformConfig(alpha="drop"))
    assert sample.metadata["source_channels"] == 2
    np.testing.assert_array_equal(sample.image[0], grey)


def _png_grey_alpha(grey: np.ndarray, alpha: np.ndarray) -> bytes:
    """A PNG of colour type 4 (grey + alpha, 8 bits), written chunk by chunk."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width = grey.shape
    rows = b"".join(b"\0" + np.dstack([grey, alpha])[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 4, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def test_sixteen_bit_alpha_composite(tmp_path: Path) -> None:
    bgra = np.array([[[0, 0, 65535, 32768], [0, 0, 0, 65535]]], dtype=np.uint16)
    [sample] = read_ok(write_png(tmp_path / "rgba16.png", bgra), ImageTransformConfig(alpha="composite"))
    # a = 32768/65535: R = 65535 → 255; G = B = 65535·(1 − a) = 32767 → 32767·255/65535 = 127.498 → 127
    np.testing.assert_array_equal(sample.image[:, 0, 0], [255, 127, 127])


def test_gray_is_luminance(tmp_path: Path) -> None:
    bgr = np.array([[[10, 20, 30], [200, 100, 50], [0, 0, 255]]], dtype=np.uint8)
    [sample] = read_ok(write_png(tmp_path / "c.png", bgr), ImageTransformConfig(color="gray"))
    # 0.299 R + 0.587 G + 0.114 B: 21.85 → 22; 96.45 → 96; 76.245 → 76
    np.testing.assert_array_equal(sample.image, [[[22, 96, 76]]])


def test_remove_alpha_and_convert_color_arrays() -> None:
    grey_alpha = np.array([[[100.0, 255.0], [100.0, 0.0]]], dtype=np.float32)
    np.testing.assert_allclose(remove_alpha(grey_alpha, "composite", 255.0)[..., 0], [[100.0, 255.0]])
    assert remove_alpha(grey_alpha, "drop", 255.0).shape == (1, 2, 1)
    bgr = np.array([[[1.0, 2.0, 3.0]]], dtype=np.float32)
    np.testing.assert_array_equal(convert_color(bgr, "rgb"), [[[3.0, 2.0, 1.0]]])
    assert convert_color(bgr[..., :1], "rgb").shape == (1, 1, 3)


# --- windows ----------------------------------------------------------------------------------

def test_sixteen_bit_center_width_window(tmp_path: Path) -> None:
    stored = np.array([[0, 1500, 1750, 2000, 2250, 2499, 2500, 65535]], dtype=np.uint16)
    cfg = ImageTransformConfig(color="gray", window=(("center", 2000.0), ("width", 1000.0)))
    [sample] = read_ok(write_png(tmp_path / "w.png", stored), cfg)
    # y = (x − 2000)/1000 + 0.5 clipped: 0, 0, 0.25 → 63.75, 0.5 → 127.5 (rint 128),
    # 0.75 → 191.25, 0.999 → 254.745, 1, 1
    np.testing.assert_array_equal(sample.image, [[[0, 0, 64, 128, 191, 255, 255, 255]]])


def test_window_center_width_matches_linear_exact_ends() -> None:
    values = np.array([999.0, 1000.0, 1000.5, 3000.0, 3001.0], dtype=np.float32)
    out = window_center_width(values, 2000.0, 2000.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.0, 0.5 / 2000, 1.0, 1.0], atol=1e-6)


def test_percentile_window(tmp_path: Path) -> None:
    stored = (np.arange(101, dtype=np.uint16) * 10).reshape(1, 101)  # 0, 10, …, 1000
    cfg = ImageTransformConfig(color="gray", window=(("percentiles", (10.0, 90.0)),))
    [sample] = read_ok(write_png(tmp_path / "p.png", stored), cfg)
    # the 10th and 90th percentiles of 0..1000 in steps of 10 are 100 and 900
    expected = np.rint(np.clip((stored.astype(np.float64) - 100) / 800, 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(sample.image, expected[None])
    assert sample.image[0, 0, 30] == 64 and sample.image[0, 0, 50] == 128  # 300 → 63.75, 500 → 127.5


@given(st.lists(st.integers(min_value=0, max_value=65535), min_size=2, max_size=40),
       st.floats(min_value=0, max_value=49), st.floats(min_value=51, max_value=100))
@settings(max_examples=60, deadline=None)
def test_a_grey_images_percentiles_are_its_own_pixels_as_rgb_too(pixels: list[int], lo: float, hi: float) -> None:
    """color: rgb repeats a grey image's channel: its percentile window is the grey one's, three
    times (the percentiles of three copies of each value interpolate to other levels)."""
    grey = np.array(pixels, dtype=np.uint16).reshape(1, -1)
    window = (("percentiles", (lo, hi)),)
    [gray] = transform_image(grey, ImageTransformConfig(color="gray", window=window))
    [rgb] = transform_image(grey, ImageTransformConfig(color="rgb", window=window))
    np.testing.assert_array_equal(rgb.image, np.repeat(gray.image, 3, axis=0))


def test_percentile_window_with_equal_ends() -> None:
    values = np.array([0.0, 0.0, 0.0, 0.0, 9.0], dtype=np.float32)
    np.testing.assert_array_equal(window_percentiles(values, 10, 50), [0, 0, 0, 0, 1])


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_percentile_window_ignores_non_finite_pixels(bad: float) -> None:
    """One infinite pixel made the 100th percentile infinite and the whole image black (with a
    numpy warning on the console): non-finite pixels are left out of the percentiles like NaN,
    and the rest of the image windows as it would without them."""
    import warnings

    ramp = np.linspace(-5.0, 95.0, 40, dtype=np.float32).reshape(4, 10)
    damaged = ramp.copy()
    damaged[1, 3] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = window_percentiles(damaged, 0, 100)
    clean = window_percentiles(np.delete(ramp.ravel(), 13), 0, 100)
    np.testing.assert_array_equal(np.delete(out.ravel(), 13), clean)
    assert out[1, 3] == (1.0 if bad == np.inf else 0.0) or (np.isnan(bad) and np.isnan(out[1, 3]))
    cfg = ImageTransformConfig(color="gray", window=(("percentiles", (0.0, 100.0)),))
    image = transform_image(damaged[:, :, None], cfg)
    assert image[0].image.max() == 255 and image[0].image.min() == 0


@pytest.mark.parametrize("window", [(("center", 200.0), ("width", 400.0)), (("percentiles", (0.0, 100.0)),)],
                         ids=["center-width", "percentiles"])
def test_a_float_image_composites_over_the_windows_white(window: tuple[Any, ...]) -> None:
    """A float RGBA image has no white in stored units: it was composited over 1.0 before the
    window, so a transparent pixel packed nearly black. It is windowed first, then blended over
    white with alpha 0..1: transparent is 255, opaque is the windowed colour, half is between."""
    colour = np.array([[[0.0, 100.0, 400.0]] * 3], dtype=np.float32)  # BGR, one row of three pixels
    alpha = np.array([[[0.0], [1.0], [0.5]]], dtype=np.float32)
    bgra = np.concatenate([colour, alpha], axis=2)
    cfg = ImageTransformConfig(color="rgb", alpha="composite", window=window)
    (tile,) = transform_image(bgra, cfg)
    (opaque,) = transform_image(colour, ImageTransformConfig(color="rgb", window=window))
    np.testing.assert_array_equal(tile.image[:, 0, 0], [255, 255, 255])
    np.testing.assert_array_equal(tile.image[:, 0, 1], opaque.image[:, 0, 1])
    half = np.rint((opaque.image[:, 0, 2].astype(np.float64) + 255) / 2)
    assert np.abs(tile.image[:, 0, 2].astype(np.float64) - half).max() <= 1


@pytest.mark.parametrize("seed", range(5))
def test_to_uint8_of_values_known_finite_skips_only_a_pass_that_changes_nothing(seed: int) -> None:
    """Integer pixels stay finite through scaling, windows and resizing: ``finite=True`` gives the same bytes."""
    rng = np.random.default_rng(seed)
    unit = (rng.integers(0, 256, (37, 41, 3)).astype(np.float32) / np.float32(255) * rng.uniform(0.5, 2.0)
            - rng.uniform(0, 0.5)).astype(np.float32)
    np.testing.assert_array_equal(to_uint8(unit, finite=True), to_uint8(unit))


def test_to_uint8_rounds_and_clips() -> None:
    unit = np.array([-1.0, 0.0, 0.5, 1 / 255 * 2.5, 1.0, 2.0, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(to_uint8(unit), [0, 0, 128, 2, 255, 255, 0])


# --- orientation ------------------------------------------------------------------------------

def test_orient_image_matches_exif_definitions() -> None:
    a = np.arange(6).reshape(2, 3)  # [[0 1 2], [3 4 5]]
    expected = {1: [[0, 1, 2], [3, 4, 5]], 2: [[2, 1, 0], [5, 4, 3]], 3: [[5, 4, 3], [2, 1, 0]],
                4: [[3, 4, 5], [0, 1, 2]], 5: [[0, 3], [1, 4], [2, 5]], 6: [[3, 0], [4, 1], [5, 2]],
                7: [[5, 2], [4, 1], [3, 0]], 8: [[2, 5], [1, 4], [0, 3]]}
    for orientation, want in expected.items():
        np.testing.assert_array_equal(orient_image(a, orientation), want, err_msg=f"orientation {orientation}")


# --- resize -----------------------------------------------------------------------------------

def _bright(height: int, width: int) -> np.ndarray:
    return RNG.integers(100, 255, (height, width, 3), dtype=np.uint8, endpoint=True)


@pytest.mark.parametrize("policy", ["stretch", "fit", "crop"])
def test_resize_policies_give_the_target_shape(tmp_path: Path, policy: str) -> None:
    path = write_png(tmp_path / "wide.png", _bright(40, 80))
    [sample] = read_ok(path, ImageTransformConfig(size=(32, 48), resize=policy))
    assert sample.image.shape == (3, 32, 48)
    assert sample.metadata["source_height"] == 40 and sample.metadata["source_width"] == 80


def test_fit_letterboxes_top_and_bottom_for_a_wide_image(tmp_path: Path) -> None:
    path = write_png(tmp_path / "wide.png", _bright(40, 80))
    [sample] = read_ok(path, ImageTransformConfig(size=(32, 32), resize="fit"))
    # scale min(32/40, 32/80) = 0.4 → 16×32 content, placed at rows 8..23
    assert (sample.image[:, :8] == 0).all() and (sample.image[:, 24:] == 0).all()
    assert (sample.image[:, 8:24] >= 90).all()


def test_fit_letterboxes_left_and_right_for_a_tall_image(tmp_path: Path) -> None:
    path = write_png(tmp_path / "tall.png", _bright(60, 20))
    [sample] = read_ok(path, ImageTransformConfig(size=(30, 30), resize="fit"))
    # scale 0.5 → 30×10 content at columns 10..19
    assert (sample.image[:, :, :10] == 0).all() and (sample.image[:, :, 20:] == 0).all()
    assert (sample.image[:, :, 10:20] >= 90).all()


def test_crop_keeps_the_centre(tmp_path: Path) -> None:
    bgr = _bright(40, 80)
    [sample] = read_ok(write_png(tmp_path / "wide.png", bgr), ImageTransformConfig(size=(20, 20), resize="crop"))
    # scale max(20/40, 20/80) = 0.5 → 20×40, centre columns 10..29; INTER_AREA halves exactly
    halved = bgr.astype(np.float64).reshape(20, 2, 40, 2, 3).mean(axis=(1, 3))[:, 10:30]
    np.testing.assert_allclose(sample.image, halved[:, :, ::-1].transpose(2, 0, 1), atol=1)
    assert (sample.image > 0).all()


@pytest.mark.parametrize("line", range(60))
def test_a_resize_that_shrinks_one_axis_and_grows_the_other_keeps_every_row(line: int) -> None:
    """60×60 → 12×120 (rows shrunk 5×, columns grown 2×): OpenCV's INTER_AREA given both falls
    back to a 2-tap filter that skipped 3 of every 5 source rows, so a one-pixel line vanished
    from the image while its mask (nearest neighbour) still labelled it. Each axis on its own:
    the line is averaged into output row line // 5 (255 / 5 = 51), as a 5× shrink of one axis is."""
    image = np.zeros((60, 60, 1), np.float32)
    image[line] = 255.0
    out = resize_image(image, (12, 120), "stretch")
    assert out.shape == (12, 120, 1)
    expected = np.zeros(12, np.float32)
    expected[line // 5] = 51.0
    np.testing.assert_allclose(out[:, :, 0], np.repeat(expected[:, None], 120, axis=1), atol=1e-3)


def test_a_crop_of_a_long_strip_is_computed_at_the_output_pixels_only(tmp_path: Path) -> None:
    """A 1×600000 strip cropped to 256×256 scales to 256 × 153,600,000 pixels (39 GB of float32):
    it is sampled at the output pixels instead, in a few MB, with the geometry a full resize
    has: scale 256, the output's 256 columns the centre 256 of the scaled 153,600,000, over
    which bilinear interpolation goes from source pixel 299999 (40) to 300000 (200): output column
    x reads source 299999 + (x + 0.5)/256."""
    import tracemalloc

    strip = np.zeros((1, 600_000, 3), np.uint8)
    strip[0, :300_000] = 40
    strip[0, 300_000:] = 200
    tracemalloc.start()
    try:
        [sample] = read_ok(write_png(tmp_path / "strip.png", strip), ImageTransformConfig(size=(256, 256),
                                                                                        resize="crop"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert (sample.image == sample.image[:, :1]).all()  # one source row: every output row alike
    np.testing.assert_allclose(sample.image[0, 0], 40 + 160 * (np.arange(256) + 0.5) / 256, atol=1)


@pytest.mark.parametrize("interpolation", ["auto", "nearest"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_crop_sampled_at_the_output_pixels_is_a_full_resize_and_cut(
        interpolation: str, dtype: type, data: st.DataObject) -> None:
    """The sampled crop (taken past CROP_SAMPLED_PIXELS) against the crop cv2.resize makes: within
    1 of uint8 values by bilinear interpolation, the same source pixels by nearest but where a
    pixel centre falls exactly on a source pixel edge (a tie OpenCV's arithmetic breaks the other
    way), for strips long along either axis, one or three channels."""
    from packer.transform import resize

    short, long = data.draw(st.integers(1, 5)), data.draw(st.integers(100, 1500))
    shape = (short, long) if data.draw(st.booleans()) else (long, short)
    size = (data.draw(st.integers(4, 48)), data.draw(st.integers(4, 48)))
    (new_h, new_w), _ = resize.resize_plan(shape, size, "crop")
    channels = data.draw(st.sampled_from([1, 3]))
    image = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, 256, (*shape, channels)).astype(dtype)
    if new_h * new_w <= image.shape[0] * image.shape[1]:
        return  # a crop that scales down: never sampled
    full = resize_image(image, size, "crop", interpolation=interpolation)
    threshold = resize.CROP_SAMPLED_PIXELS
    assert new_h * new_w <= threshold  # so `full` is cv2.resize's
    resize.CROP_SAMPLED_PIXELS = 0
    try:
        sampled = resize_image(image, size, "crop", interpolation=interpolation)
    finally:
        resize.CROP_SAMPLED_PIXELS = threshold
    assert sampled.shape == full.shape == (*size, channels) and sampled.dtype == full.dtype
    if interpolation == "auto":
        np.testing.assert_allclose(sampled.astype(np.float64), full.astype(np.float64), atol=1.0 if dtype is np.uint8
                                   else 0.01)
        return
    # an output pixel whose centre, (j + 0.5) · source/scaled, lands exactly on a source pixel edge
    on_edge = np.zeros(size, bool)
    for axis, (n_src, n_scaled, n_out) in enumerate(zip(shape, (new_h, new_w), size, strict=True)):
        j = np.arange(n_out) + (n_scaled - n_out) // 2
        tie = (2 * j + 1) * n_src % (2 * n_scaled) == 0
        on_edge |= tie[:, None] if axis == 0 else tie[None, :]
    differs = (sampled != full).any(axis=2)
    assert not (differs & ~on_edge).any(), "a nearest pick differs off an exact pixel edge"


# --- tiles ------------------------------------------------------------------------------------

def test_tile_origins_are_full_tiles_row_major() -> None:
    assert tile_origins(70, 100, (32, 32)) == [(0, 0), (0, 32), (0, 64), (32, 0), (32, 32), (32, 64)]
    assert len(tile_origins(70, 100, (32, 32), (16, 24))) == 3 * 3
    assert tile_origins(31, 100, (32, 32)) == []


def test_tiles_keys_count_and_content(tmp_path: Path) -> None:
    path = write_png(tmp_path / "big.png", RNG.integers(0, 255, (70, 100, 3), dtype=np.uint8))
    [whole] = read_ok(path, ImageTransformConfig())
    tiles = read_ok(path, ImageTransformConfig(tile_size=(32, 32)))
    assert [t.key for t in tiles] == ["scan-7-t00000_00000", "scan-7-t00000_00032", "scan-7-t00000_00064",
                                      "scan-7-t00032_00000", "scan-7-t00032_00032", "scan-7-t00032_00064"]
    for tile in tiles:
        row, col = tile.metadata["tile"]
        assert tile.image.shape == (3, 32, 32) and tile.image.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(tile.image, whole.image[:, row:row + 32, col:col + 32])
        assert tile.key == f"scan-7-t{row:05d}_{col:05d}"
    strided = read_ok(path, ImageTransformConfig(tile_size=(32, 32), tile_stride=(16, 24)))
    assert [t.metadata["tile"] for t in strided] == [[r, c] for r in (0, 16, 32) for c in (0, 24, 48)]


def test_tiles_are_cut_from_the_resized_image(tmp_path: Path) -> None:
    path = write_png(tmp_path / "big.png", RNG.integers(0, 255, (50, 90, 3), dtype=np.uint8))
    [resized] = read_ok(path, ImageTransformConfig(size=(64, 64)))
    tiles = read_ok(path, ImageTransformConfig(size=(64, 64), tile_size=(32, 32)))
    assert len(tiles) == 4
    for tile in tiles:
        row, col = tile.metadata["tile"]
        np.testing.assert_array_equal(tile.image, resized.image[:, row:row + 32, col:col + 32])


def test_no_full_tile_is_an_issue(tmp_path: Path) -> None:
    path = write_png(tmp_path / "small.png", RNG.integers(0, 255, (20, 40, 3), dtype=np.uint8))
    issue = read_image(make_ref(path), ImageTransformConfig(tile_size=(32, 32)))
    assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("bad_shape", "transform")
    assert "small.png" in issue.message


def test_transform_image_rejects_float_without_window() -> None:
    with pytest.raises(ValueError, match="window"):
        transform_image(np.zeros((2, 2), np.float32), ImageTransformConfig())


def _converted_first(image: np.ndarray, cfg: ImageTransformConfig) -> list[np.ndarray]:
    """The steps in the module docstring's order, with BGR → RGB done first on the input: what
    transform_image gives, written out by hand."""
    values = cv2.cvtColor(image, cv2.COLOR_BGR2RGB).astype(np.float32)
    peak = np.float32(255.0 if image.dtype == np.uint8 else 65535.0)
    if not cfg.window:
        unit = values * np.float32(1.0 / peak)
    elif cfg.window[0][0] == "percentiles":
        unit = window_percentiles(values, *cfg.window[0][1])
    else:
        unit = window_center_width(values, dict(cfg.window)["center"], dict(cfg.window)["width"])
    if cfg.size:
        unit = resize_image(np.ascontiguousarray(unit), cfg.size, cfg.resize)
    out = to_uint8(unit)
    if cfg.tile_size is None:
        return [np.ascontiguousarray(out.transpose(2, 0, 1))]
    th, tw = cfg.tile_size
    return [np.ascontiguousarray(out[r:r + th, c:c + tw].transpose(2, 0, 1))
            for r, c in tile_origins(out.shape[0], out.shape[1], cfg.tile_size)]


@settings(max_examples=120, deadline=None)
@given(dtype=st.sampled_from([np.uint8, np.uint16]), height=st.integers(8, 90), width=st.integers(8, 90),
       size=st.sampled_from([None, (32, 32), (17, 45), (120, 64)]), policy=st.sampled_from(["stretch", "fit", "crop"]),
       window=st.sampled_from([(), (("center", 100.0), ("width", 150.0)), (("percentiles", (2.0, 98.0)),)]),
       tile=st.sampled_from([None, (8, 8)]), seed=st.integers(0, 2**32 - 1))
def test_a_colour_image_swapped_to_rgb_at_the_end_gives_the_bytes_of_swapping_first(
        dtype: type, height: int, width: int, size: tuple[int, int] | None, policy: str, window: tuple,
        tile: tuple[int, int] | None, seed: int) -> None:
    """transform_image swaps BGR to RGB as it copies the output to C×H×W, not on the input: the
    window, the resize and the rounding treat every channel alike, so the bytes are the same,
    except that OpenCV's float resize may round a value 1 ulp differently by its channel's lane
    (seen on an AVX-512 machine: 26 of 3,072 values of an 8×8 → 32×32 upscale, 4% of another
    size's), which moves a value sitting on a rounding boundary by one level."""
    top = 256 if dtype is np.uint8 else 65536
    image = np.random.default_rng(seed).integers(0, top, size=(height, width, 3)).astype(dtype)
    cfg = ImageTransformConfig(size=size, resize=policy, color="rgb", window=window, tile_size=tile)
    got = [t.image for t in transform_image(image, cfg)]
    expected = _converted_first(image, cfg)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.flags.c_contiguous and a.dtype == np.uint8 and a.shape == b.shape
        if size is None:
            assert a.tobytes() == b.tobytes()
        else:  # the resize's lanes: at most one level (how often depends on the size and the CPU)
            assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


@pytest.mark.parametrize("window", [(("center", 0.5), ("width", 1.0)), (("percentiles", (0.0, 100.0)),)],
                         ids=["center-width", "percentiles"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_pixel_is_blended_by_the_resize_at_its_level_not_spread(window: tuple[Any, ...],
                                                                             bad: float) -> None:
    """README: NaN and −inf pack black, +inf white. A NaN went through the resize as NaN and
    blackened every output pixel the filter touched (one NaN in a white 8×8 block shrunk to one
    pixel made it 0); it is black before the resize, so the block is 63/64 white."""
    image = np.tile(np.linspace(0.0, 1.0, 64, dtype=np.float32), (64, 1))
    image[:8, 32:40] = 1.0
    image[3, 35] = bad
    (tile,) = transform_image(image, ImageTransformConfig(color="gray", size=(8, 8), window=window))
    level = 1.0 if bad == np.inf else 0.0
    assert abs(int(tile.image[0, 0, 4]) - round(255 * (63 + level) / 64)) <= 1, tile.image[0, 0, 4]
