"""packer.transform.mask: a segmentation mask gets exactly its image's geometry.

- Lock-step: for any size, policy, EXIF orientation and tiling, the mask's outputs have the
  shapes, count and order of ``transform_image``'s tiles, and a mask drawn from the image itself
  still labels the same pixels after both transforms (DICOM: the same against ``finish_image``).
- Nearest-neighbour resizing is centre-aligned and never invents a class id; the image resize
  (``interpolation="auto"``) is what it was.
- A mask file that is not a grid of declared class ids, or not its image's size, raises
  MaskError with a reason code and a message naming the problem.

Mask files are real PNG/TIFF/NPY bytes made here with OpenCV and numpy.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from math import ceil
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from packer.config import ImageTransformConfig
from packer.transform.dicom import finish_image
from packer.transform.image import transform_image
from packer.transform.mask import (
    MASK_REASONS,
    MaskError,
    check_mask,
    decode_mask,
    decode_mask_pages,
    transform_mask_dicom,
    transform_mask_image,
)
from packer.transform.resize import POLICIES, resize_image

# --- helpers ---------------------------------------------------------------------------------

#: Grey value of each block id; 0 ↔ 0 so a ``fit`` pad (image black, mask pad_value 0) agrees too.
GREY = np.array([0] + [20 * i for i in range(1, 13)], dtype=np.uint8)


def block_ids(rows: int, cols: int, block: int) -> np.ndarray:
    """rows×cols blocks of block×block pixels, ids 1.. row-major: a (rows·block)×(cols·block) uint8 map."""
    ids = np.arange(1, rows * cols + 1, dtype=np.uint8).reshape(rows, cols)
    return np.kron(ids, np.ones((block, block), dtype=np.uint8))


def assert_same_labels(mask: np.ndarray, image: np.ndarray, radius: tuple[int, int]) -> float:
    """At every pixel whose (2·radius+1) neighbourhood in the 2-D ``mask`` is one id, ``image``
    (2-D uint8) is that id's grey ±1. Returns the fraction of pixels checked."""
    assert mask.shape == image.shape
    rh, rw = radius
    if mask.shape[0] <= 2 * rh or mask.shape[1] <= 2 * rw:
        return 0.0
    windows = sliding_window_view(mask, (2 * rh + 1, 2 * rw + 1))
    uniform = windows.min(axis=(2, 3)) == windows.max(axis=(2, 3))
    centre_ids = mask[rh:mask.shape[0] - rh, rw:mask.shape[1] - rw]
    centre_px = image[rh:image.shape[0] - rh, rw:image.shape[1] - rw].astype(int)
    wrong = uniform & (np.abs(centre_px - GREY[centre_ids].astype(int)) > 1)
    assert not wrong.any(), (f"{int(wrong.sum())} pixels disagree, first at "
                             f"{tuple(int(v) for v in np.argwhere(wrong)[0])} (offset by the radius {radius})")
    return float(uniform.sum()) / mask.size


def assert_edges_follow_the_majority(mask: np.ndarray, image: np.ndarray, radius: tuple[int, int]) -> int:
    """Where a pixel's neighbourhood holds exactly two ids A and B, the image pixel mixes their
    greys, ``f·grey(A) + (1 − f)·grey(B)``, f being A's share of the pixel (AREA) or A's weight
    (LINEAR). A centre-aligned nearest pick lands in A exactly when f > 1/2: the mask takes the
    id that covers most of its pixel. (cv2.INTER_NEAREST, half a pixel off, fails this.) Pixels
    within rounding of f = 1/2 are skipped. Returns the number of edge pixels checked."""
    rh, rw = radius
    if mask.shape[0] <= 2 * rh or mask.shape[1] <= 2 * rw:
        return 0
    windows = sliding_window_view(mask, (2 * rh + 1, 2 * rw + 1))
    low, high = windows.min(axis=(2, 3)), windows.max(axis=(2, 3))
    two = (low != high) & ((windows == low[..., None, None]) | (windows == high[..., None, None])).all(axis=(2, 3))
    ids = mask[rh:mask.shape[0] - rh, rw:mask.shape[1] - rw]
    px = image[rh:image.shape[0] - rh, rw:image.shape[1] - rw].astype(float)
    g_low, g_high = GREY[low].astype(float), GREY[high].astype(float)
    share_low = (px - g_high) / np.where(two, g_low - g_high, 1.0)
    tol = 1.5 / np.abs(np.where(two, g_low - g_high, 1.0))
    decided = two & (np.abs(share_low - 0.5) > tol)
    expected = np.where(share_low > 0.5, low, high)
    wrong = decided & (ids != expected)
    assert not wrong.any(), (f"{int(wrong.sum())} edge pixels take the minority id, first at "
                             f"{tuple(int(v) for v in np.argwhere(wrong)[0])} (offset by the radius {radius})")
    return int(decided.sum())


def mixed_stretch(ratios: tuple[float, float]) -> bool:
    """One axis shrinks while the other grows: cv2's INTER_AREA then falls back to a 2-tap filter
    at ``floor(i · s)`` that is not centre-aligned (12 → 4 samples 0.67, 3.67, … instead of 1, 4, …),
    so image edges sit about ½ source pixel off the mask's: the majority check does not hold."""
    return min(ratios) < 1 < max(ratios)


def radius_for(ratio: float) -> int:
    """Output pixels that span one source pixel or more: what LINEAR (±1 source pixel) and AREA
    (one output pixel's footprint) read around an output pixel's centre."""
    return max(1, ceil(ratio))


def scale_ratios(src: tuple[int, int], size: tuple[int, int], policy: str) -> tuple[float, float]:
    """Output pixels per source pixel on each axis under ``policy`` (computed here, not by packer)."""
    (sh, sw), (th, tw) = src, size
    if policy == "stretch":
        return th / sh, tw / sw
    scale = min(th / sh, tw / sw) if policy == "fit" else max(th / sh, tw / sw)
    return scale, scale


def encode(ext: str, array: np.ndarray) -> bytes:
    ok, data = cv2.imencode(ext, array)
    assert ok
    return data.tobytes()


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def tiff_with_orientation(pixels: np.ndarray, orientation: int) -> bytes:
    """A little-endian single-strip uint8 grey TIFF of ``pixels`` carrying an Orientation tag."""
    height, width = pixels.shape
    entries = [(256, 3, width), (257, 3, height), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, 0),
               (274, 3, orientation), (277, 3, 1), (278, 3, height), (279, 4, pixels.size)]
    strip_at = 8 + 2 + 12 * len(entries) + 4
    out = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", len(entries))
    for tag, kind, value in entries:
        value = strip_at if tag == 273 else value
        field = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, 1) + field
    return out + struct.pack("<I", 0) + pixels.astype(np.uint8).tobytes()


def png_with_exif_orientation(pixels: np.ndarray, orientation: int) -> bytes:
    """A PNG whose eXIf chunk (right after IHDR) says Orientation = ``orientation``."""
    block = b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">HHHIHHI", 1, 274, 3, 1, orientation, 0, 0)
    chunk = struct.pack(">I", len(block)) + b"eXIf" + block + struct.pack(">I", zlib.crc32(b"eXIf" + block))
    png = encode(".png", pixels)
    return png[:33] + chunk + png[33:]


@contextmanager
def raises(reason: str, *words: str) -> Iterator[None]:
    """The block raises MaskError with ``reason`` and a message holding every one of ``words``."""
    assert reason in MASK_REASONS
    with pytest.raises(MaskError, match="(?s)" + "".join(f"(?=.*{re.escape(w)})" for w in words)) as caught:
        yield
    assert caught.value.reason == reason, caught.value.message


# --- lock-step with transform_image -----------------------------------------------------------

@st.composite
def image_cases(draw: st.DrawFn) -> tuple[int, int, int, ImageTransformConfig, int]:
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 4).filter(lambda c: c != rows))  # non-square layout: a transpose shows
    block = draw(st.integers(8, 24))
    n = max(rows, cols)
    # output blocks of 8 pixels or more: block >= 8 × the shrink factor
    size = (draw(st.integers(8 * n, 96)), draw(st.integers(8 * n, 96))) if draw(st.booleans()) else None
    tile = stride = None
    if draw(st.booleans()):
        tile = (draw(st.integers(4, 48)), draw(st.integers(4, 48)))
        if draw(st.booleans()):
            stride = (draw(st.integers(2, 48)), draw(st.integers(2, 48)))
    cfg = ImageTransformConfig(size=size, resize=draw(st.sampled_from(POLICIES)), color="gray",
                               tile_size=tile, tile_stride=stride)
    return rows, cols, block, cfg, draw(st.integers(1, 8))


@settings(max_examples=300, deadline=None)
@given(image_cases())
def test_mask_follows_transform_image_tile_for_tile(case: tuple[int, int, int, ImageTransformConfig, int]) -> None:
    rows, cols, block, cfg, orientation = case
    ids = block_ids(rows, cols, block)
    tiles = transform_image(GREY[ids], cfg, orientation)
    masks = transform_mask_image(ids, cfg, orientation)

    assert [m.shape for m in masks] == [t.image.shape for t in tiles]
    assert all(m.dtype == np.uint8 and m.flags.c_contiguous for m in masks)
    oriented = ids.shape[::-1] if orientation >= 5 else ids.shape
    ratios = scale_ratios(oriented, cfg.size, cfg.resize) if cfg.size else (1.0, 1.0)
    radius = (radius_for(ratios[0]), radius_for(ratios[1]))
    checked = [assert_same_labels(m[0], t.image[0], radius) for m, t in zip(masks, tiles, strict=True)]
    # not a vacuous check: whole blocks (no crop cutting them) wide enough for a neighbourhood
    block_out = min(block * ratios[0], block * ratios[1])
    if cfg.tile_size is None and cfg.resize != "crop" and block_out >= 4 * max(radius) + 2:
        assert checked[0] > 0
    if not mixed_stretch(ratios):
        for m, t in zip(masks, tiles, strict=True):
            assert_edges_follow_the_majority(m[0], t.image[0], radius)


def test_orientation_is_the_exif_one() -> None:
    """Orientation 6 is 'rotate 90° clockwise' and 5 'transpose', as for the image."""
    mask = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8)
    cfg = ImageTransformConfig()
    assert transform_mask_image(mask, cfg, 6)[0][0].tolist() == [[4, 1], [5, 2], [6, 3]]
    assert transform_mask_image(mask, cfg, 5)[0][0].tolist() == [[1, 4], [2, 5], [3, 6]]
    assert transform_mask_image(mask, cfg, 2)[0][0].tolist() == [[3, 2, 1], [6, 5, 4]]


def test_fit_pads_the_mask_with_pad_value() -> None:
    mask = np.full((20, 10), 3, dtype=np.uint8)  # tall: fit into 20×20 leaves 5 columns each side
    (out,) = transform_mask_image(mask, ImageTransformConfig(size=(20, 20), resize="fit"), pad_value=255)
    assert out.shape == (1, 20, 20)
    assert (out[0, :, :5] == 255).all() and (out[0, :, 15:] == 255).all() and (out[0, :, 5:15] == 3).all()


def test_rgb_images_and_masks_share_their_tiles() -> None:
    ids = block_ids(2, 3, 10)
    bgr = np.stack([GREY[ids], GREY[ids] // 2, GREY[ids] // 3], axis=2)
    cfg = ImageTransformConfig(size=(33, 47), resize="crop", tile_size=(16, 16), tile_stride=(8, 12))
    tiles = transform_image(bgr, cfg, 8)
    masks = transform_mask_image(ids, cfg, 8)
    assert len(masks) == len(tiles) == 9
    assert [m.shape[1:] for m in masks] == [t.image.shape[1:] for t in tiles]


# --- lock-step with finish_image (DICOM) ------------------------------------------------------

@st.composite
def dicom_cases(draw: st.DrawFn) -> dict:
    rows = draw(st.integers(1, 3))
    cols = draw(st.integers(1, 3).filter(lambda c: c != rows))
    block = draw(st.integers(16, 32))
    pixel_spacing = (draw(st.sampled_from([0.5, 0.7, 1.0, 1.3])), draw(st.sampled_from([0.5, 0.7, 1.0, 1.3])))
    spacing = (draw(st.sampled_from([0.6, 0.8, 1.0, 1.5])), draw(st.sampled_from([0.6, 0.8, 1.0, 1.5])))
    n = max(rows, cols)
    size = (draw(st.integers(8 * n, 80)), draw(st.integers(8 * n, 80)))
    return {"rows": rows, "cols": cols, "block": block,
            "pixel_spacing": pixel_spacing if draw(st.booleans()) else None,
            "spacing": spacing if draw(st.booleans()) else None,
            "size": size if draw(st.booleans()) else None, "policy": draw(st.sampled_from(POLICIES))}


@settings(max_examples=200, deadline=None)
@given(dicom_cases())
def test_mask_follows_finish_image(case: dict) -> None:
    ids = block_ids(case["rows"], case["cols"], case["block"])
    geometry = {key: case[key] for key in ("pixel_spacing", "spacing", "size", "policy")}
    image = finish_image((GREY[ids].astype(np.float32) / 255)[:, :, None], output="uint8", **geometry)
    mask = transform_mask_dicom(ids, **geometry)

    assert mask.shape == image.shape and mask.dtype == np.uint8 and mask.flags.c_contiguous
    # the two resizes chain: a pure intermediate pixel needs its own neighbourhood, carried through the second
    mid = ids.shape
    first = (1.0, 1.0)
    if case["spacing"] and case["pixel_spacing"]:
        first = (case["pixel_spacing"][0] / case["spacing"][0], case["pixel_spacing"][1] / case["spacing"][1])
        mid = (max(1, round(ids.shape[0] * first[0])), max(1, round(ids.shape[1] * first[1])))
    second = scale_ratios(mid, case["size"], case["policy"]) if case["size"] else (1.0, 1.0)
    radius = tuple(radius_for(f * s) + radius_for(s) for f, s in zip(first, second, strict=True))
    assert_same_labels(mask[0], image[0], radius)  # type: ignore[arg-type]
    # Two nearest resizes in a row round twice: an edge may land up to half an intermediate pixel
    # from where the image's (continuous) edge is, so the majority rule holds only for one resize.
    resized = [ratios for ratios in (first, second) if ratios != (1.0, 1.0)]
    if len(resized) == 1 and not mixed_stretch(resized[0]):
        assert_edges_follow_the_majority(mask[0], image[0], radius)  # type: ignore[arg-type]


# --- nearest neighbour: centre-aligned, no new ids; auto unchanged ----------------------------

@pytest.mark.parametrize(("src", "dst", "picked"), [
    (8, 4, [1, 3, 5, 7]),        # the source pixel under each output centre, not [0, 2, 4, 6]
    (5, 3, [0, 2, 4]),
    (2, 5, [0, 0, 1, 1, 1]),     # output centres 0.5..4.5 × 0.4 = 0.2, 0.6, 1.0, 1.4, 1.8
    (3, 7, [0, 0, 1, 1, 1, 2, 2]),
])
def test_nearest_takes_the_source_pixel_under_each_output_centre(src: int, dst: int, picked: list[int]) -> None:
    for dtype in (np.uint8, np.uint16):
        row = (np.arange(src, dtype=dtype) * (1000 if dtype == np.uint16 else 10))[None, :, None]
        out = resize_image(np.repeat(row, 3, axis=0), (3, dst), "stretch", interpolation="nearest")
        assert out.shape == (3, dst, 1) and out.dtype == dtype
        assert out[1, :, 0].tolist() == (np.array(picked) * (1000 if dtype == np.uint16 else 10)).tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 60), st.integers(1, 60),
       st.sampled_from(POLICIES), st.sampled_from([np.uint8, np.uint16]), st.integers(0, 2**32 - 1))
def test_nearest_never_makes_a_new_class_id(h: int, w: int, th: int, tw: int, policy: str, dtype: type,
                                            seed: int) -> None:
    values: np.ndarray = np.array([0, 1, 7, 200, 255] if dtype == np.uint8 else [0, 1, 300, 65535], dtype=dtype)
    mask = np.random.default_rng(seed).choice(values, size=(h, w, 1))
    out = resize_image(mask, (th, tw), policy, pad_value=0, interpolation="nearest")
    assert out.shape == (th, tw, 1) and out.dtype == dtype
    assert set(np.unique(out).tolist()) <= set(values.tolist())


def _cv2_auto(image: np.ndarray, height: int, width: int) -> np.ndarray:
    if image.shape[:2] == (height, width):
        return image
    if (height - image.shape[0]) * (width - image.shape[1]) < 0:  # one axis shrinks, one grows: one at a time
        if height < image.shape[0]:
            return _cv2_auto(_cv2_auto(image, height, image.shape[1]), height, width)
        return _cv2_auto(_cv2_auto(image, image.shape[0], width), height, width)
    shrink = height < image.shape[0] or width < image.shape[1]
    out = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return out.reshape(height, width, image.shape[2])


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize(("src", "size"), [((30, 40), (15, 60)), ((30, 40), (60, 80)), ((30, 40), (17, 23)),
                                           ((25, 10), (40, 40)), ((10, 25), (8, 8))])
def test_auto_interpolation_is_unchanged(channels: int, dtype: type, src: tuple[int, int],
                                         size: tuple[int, int]) -> None:
    image: np.ndarray = np.random.default_rng(3).integers(0, 256, size=(*src, channels)).astype(dtype)
    (sh, sw), (th, tw) = src, size
    assert np.array_equal(resize_image(image, size, "stretch"), _cv2_auto(image, th, tw))
    fit = min(th / sh, tw / sw)
    fh, fw = max(1, round(sh * fit)), max(1, round(sw * fit))
    expected: np.ndarray = np.full((th, tw, channels), 9, dtype=dtype)
    top, left = (th - fh) // 2, (tw - fw) // 2
    expected[top:top + fh, left:left + fw] = _cv2_auto(image, fh, fw)
    assert np.array_equal(resize_image(image, size, "fit", pad_value=9), expected)
    cover = max(th / sh, tw / sw)
    ch, cw = max(th, round(sh * cover)), max(tw, round(sw * cover))
    top, left = (ch - th) // 2, (cw - tw) // 2
    expected = _cv2_auto(image, ch, cw)[top:top + th, left:left + tw]
    assert np.array_equal(resize_image(image, size, "crop", interpolation="auto"), expected)


def test_unknown_interpolation_is_refused() -> None:
    with pytest.raises(ValueError, match="bicubic"):
        resize_image(np.zeros((4, 4, 1), np.uint8), (2, 2), interpolation="bicubic")


# --- decode_mask ------------------------------------------------------------------------------

def test_png_tiff_and_npy_masks_decode_to_their_class_ids() -> None:
    ids = block_ids(2, 3, 4)
    assert np.array_equal(decode_mask(encode(".png", ids), "a.png"), ids)
    wide = ids.astype(np.uint16) * 300  # 16-bit PNG keeps its values
    out = decode_mask(encode(".png", wide), "a.png")
    assert out.dtype == np.uint16 and np.array_equal(out, wide)
    grey_bgr = np.stack([ids] * 3, axis=2)  # a grey mask saved as RGB
    assert np.array_equal(decode_mask(encode(".png", grey_bgr), "rgb.png"), ids)
    assert np.array_equal(decode_mask(encode(".tif", ids), "a.tif"), ids)
    assert np.array_equal(decode_mask(npy_bytes(ids.astype(np.int32)), "a.npy"), ids)
    assert np.array_equal(decode_mask(npy_bytes(ids.astype(np.float32)), "a.npy"), ids)
    assert decode_mask(npy_bytes(ids > 3), "b.npy").dtype == np.uint8


@pytest.mark.parametrize("palette", ["voc-colours", "grey-levels"])
def test_a_palette_png_mask_decodes_to_its_indices(palette: str) -> None:
    """Pascal VOC's masks are palette PNGs whose indices are the class ids (PIL and torchvision
    read them so). OpenCV expanded the palette: VOC's colours were refused as a colour mask, and
    a grey palette (id k shown as grey 100·k) packed its grey levels, 100 and 200, as ids."""
    import io

    from PIL import Image

    ids = block_ids(2, 3, 4) % 3
    image = Image.fromarray(ids.astype(np.uint8), mode="P")
    colours = [(0, 0, 0), (128, 0, 0), (0, 128, 0)] if palette == "voc-colours" else [(0, 0, 0), (100,) * 3,
                                                                                       (200,) * 3]
    image.putpalette([c for colour in colours for c in colour] + [224, 224, 192] * 253)
    out = io.BytesIO()
    image.save(out, format="PNG")
    decoded = decode_mask(out.getvalue(), "voc.png")
    assert decoded.dtype == np.uint8 and np.array_equal(decoded, ids)


@pytest.mark.parametrize("kind", ["bilevel", "white-is-zero", "palette-colours", "palette-greys"])
def test_a_tiff_mask_decodes_to_its_stored_ids_whatever_its_photometric(kind: str) -> None:
    """TIFF masks as Fiji, ImageJ and scanners write them: a bilevel (mode "1") page came back as
    0/255 (255 is the ignore id of the README's recipe), a WhiteIsZero page inverted (OpenCV
    renders it for display), a palette page as its palette's colours (refused as a colour mask,
    or grey levels packed as ids). The stored values are the ids, as a palette PNG's indices are."""
    import io

    from PIL import Image

    ids = block_ids(2, 3, 4) % (2 if kind in ("bilevel", "white-is-zero") else 4)
    out = io.BytesIO()
    if kind == "bilevel":
        Image.fromarray(ids.astype(bool)).save(out, format="TIFF")
    elif kind == "white-is-zero":  # tifffile stores the values as given (Pillow inverts them for this tag)
        import tifffile

        stored = (ids * 255).astype(np.uint8)
        tifffile.imwrite(out, stored, photometric="miniswhite")
        ids = stored
    else:
        image = Image.fromarray(ids.astype(np.uint8), mode="P")
        colours = ([(0, 0, 0), (255, 0, 0), (0, 255, 0), (0, 0, 255)] if kind == "palette-colours"
                   else [(0, 0, 0), (39, 39, 39), (78, 78, 78), (117, 117, 117)])
        image.putpalette([c for colour in colours for c in colour] + [0, 0, 0] * 252)
        image.save(out, format="TIFF")
    decoded = decode_mask(out.getvalue(), "mask.tif")
    assert np.array_equal(decoded, ids), (np.unique(decoded), np.unique(ids))


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("samples", [2, 3])
def test_a_tiff_mask_of_separate_planes_decodes_to_its_ids_or_is_refused_at_16_bits(bits: int, samples: int) -> None:
    """A grey mask saved with its samples as separate planes (PlanarConfiguration 2: grey+alpha,
    or RGB with equal planes): OpenCV reads an 8-bit one right, but decodes a 16-bit one as if its
    first plane held every sample, interleaved: the grey+alpha one packed wrong ids, the RGB one
    was refused as a colour mask, neither naming the cause. A 16-bit one is now unreadable, naming
    the layout and the fix."""
    import io

    import tifffile

    ids = block_ids(2, 3, 4).astype(np.uint8 if bits == 8 else np.uint16) * (1 if bits == 8 else 50)
    opaque = np.full_like(ids, np.iinfo(ids.dtype).max)
    out = io.BytesIO()
    if samples == 2:
        tifffile.imwrite(out, np.stack([ids, opaque]), photometric="minisblack", planarconfig="separate",
                         extrasamples=["unassalpha"])
    else:
        tifffile.imwrite(out, np.stack([ids] * 3), photometric="rgb", planarconfig="separate")
    if bits == 16:
        with raises("mask_unreadable", "page 0", f"16-bit TIFF mask whose {samples} samples per pixel",
                    "separate planes (PlanarConfiguration 2)", "single-channel"):
            decode_mask(out.getvalue(), "planar.tif")
        return
    assert np.array_equal(decode_mask(out.getvalue(), "planar.tif"), ids)


def test_a_16_bit_tiff_mask_that_decodes_at_8_bits_is_refused() -> None:
    """OpenCV reads a 16-bit grey+alpha TIFF (samples interleaved) at 8 bits, through libtiff's
    RGBA interface: ids 50..600 packed as 0..2, silently. Its precision is not the file's."""
    import io

    import tifffile

    ids = block_ids(2, 3, 4).astype(np.uint16) * 50
    out = io.BytesIO()
    tifffile.imwrite(out, np.dstack([ids, np.full_like(ids, 65535)]), photometric="minisblack",
                     extrasamples=["unassalpha"])
    with raises("mask_unreadable", "16-bit TIFF mask", "only at 8 bits", "single-channel"):
        decode_mask(out.getvalue(), "la.tif")


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_a_low_bit_depth_grey_png_mask_decodes_to_its_stored_ids(bits: int) -> None:
    """A binary mask saved as a 1-bit PNG held ids 0 and 1; OpenCV scales such a PNG to 8 bits,
    so its foreground packed as 255 (the usual ignore id) or was refused as an undeclared id."""
    import io

    from PIL import Image

    ids = (block_ids(2, 3, 4) % (1 << bits)).astype(np.uint8)
    out = io.BytesIO()
    (Image.fromarray(ids.astype(bool)) if bits == 1 else Image.fromarray(ids, mode="L")).save(
        out, format="PNG", **({} if bits == 1 else {"bits": bits}))
    data = out.getvalue()
    assert data[24] == bits and data[25] == 0
    decoded = decode_mask(data, "low.png")
    assert decoded.dtype == np.uint8 and np.array_equal(decoded, ids)


def test_multi_page_tiff_and_3d_npy_are_frames_first() -> None:
    pages = [block_ids(2, 3, 4) * k for k in (1, 2, 3)]
    ok, data = cv2.imencodemulti(".tiff", pages)
    assert ok
    out = decode_mask(data.tobytes(), "stack.tif")
    assert out.shape == (3, 8, 12) and np.array_equal(out, np.stack(pages))
    assert decode_mask(npy_bytes(np.stack(pages)), "stack.npy").shape == (3, 8, 12)


@pytest.mark.parametrize("orientation", [2, 6, 8])
def test_a_mask_file_is_never_oriented_on_decode(orientation: int) -> None:
    """The mask labels the stored grid; its image's orientation is applied later, to both."""
    stored = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8)
    assert np.array_equal(decode_mask(tiff_with_orientation(stored, orientation), "o.tif"), stored)
    assert np.array_equal(decode_mask(png_with_exif_orientation(stored, orientation), "o.png"), stored)


_ZEROS = np.zeros((4, 4), np.uint8)


@pytest.mark.parametrize(("name", "data", "reason", "words"), [
    ("colour.png", encode(".png", np.dstack([_ZEROS, _ZEROS + 1, _ZEROS])), "mask_values",
     ("colour mask", "RGB [0, 1, 0]", "single-channel")),
    ("alpha.png", encode(".png", np.dstack([_ZEROS, _ZEROS, _ZEROS, _ZEROS + 9])), "mask_values", ("transparent",)),
    ("half.npy", npy_bytes(np.array([[0.0, 0.5], [1.0, 2.0]], np.float32)), "mask_values", ("non-integer", "0.5")),
    ("nan.npy", npy_bytes(np.array([[0, np.nan]], np.float32)), "mask_values", ("NaN",)),
    ("negative.npy", npy_bytes(np.array([[0, -1], [2, 3]], np.int16)), "mask_values", ("negative", "-1")),
    ("huge.npy", npy_bytes(np.array([[0, 70000]], np.int32)), "mask_values", ("70000", "65535")),
    ("garbage.png", b"this is not an image at all", "mask_unreadable", ("not a PNG, TIFF or .npy",)),
    ("cut.png", encode(".png", _ZEROS)[:40], "mask_unreadable", ("could not decode",)),
    ("photo.jpg", encode(".jpg", np.zeros((8, 8), np.uint8)), "mask_unreadable", ("JPEG", "lossy")),
    ("4d.npy", npy_bytes(np.zeros((2, 2, 2, 2), np.uint8)), "mask_size", ("(2, 2, 2, 2)", "H×W or F×H×W")),
])
def test_a_file_that_is_no_grid_of_class_ids_raises(name: str, data: bytes, reason: str,
                                                    words: tuple[str, ...]) -> None:
    with raises(reason, name, *words):
        decode_mask(data, name)


def test_a_npy_header_promising_more_than_the_file_holds_is_unreadable() -> None:
    """np.load would allocate the header's 10 GB before finding 16 bytes of data."""
    big = io.BytesIO()
    np.lib.format.write_array_header_1_0(big, {"descr": "|u1", "fortran_order": False, "shape": (100000, 100000)})
    with raises("mask_unreadable", "promises", "100000×100000"):
        decode_mask(big.getvalue() + b"\x00" * 16, "big.npy")


# --- check_mask -------------------------------------------------------------------------------

def test_check_mask_gives_frames_first_uint8_or_uint16() -> None:
    ids = block_ids(2, 2, 3).astype(np.int64)
    out = check_mask(ids, height=6, width=6, frames=1, classes=None)
    assert out.shape == (1, 6, 6) and out.dtype == np.uint8 and np.array_equal(out[0], ids)
    assert check_mask(ids, height=6, width=6, frames=1, classes=[0, 1, 2, 3, 4, 300]).dtype == np.uint16
    assert check_mask(ids * 100, height=6, width=6, frames=1, classes=None).dtype == np.uint16
    stack = np.stack([ids, ids])
    assert check_mask(stack, height=6, width=6, frames=2, classes=range(5)).shape == (2, 6, 6)


@pytest.mark.parametrize(("shape", "frames", "words"), [
    ((4, 5), 1, ("4×5", "1×3×5")),             # one row too many
    ((3, 6), 1, ("3×6", "1×3×5")),
    ((2, 3, 5), 3, ("2×3×5", "3×3×5")),        # a frame missing
    ((5, 3), 1, ("5×3", "1×3×5")),             # the mask of the oriented (transposed) image
])
def test_a_mask_of_another_size_raises_mask_size(shape: tuple[int, ...], frames: int, words: tuple[str, ...]) -> None:
    with raises("mask_size", *words):
        check_mask(np.zeros(shape, np.uint8), height=3, width=5, frames=frames, classes=None)


def test_undeclared_class_ids_raise_mask_values_naming_them() -> None:
    mask = np.array([[0, 1, 2], [7, 9, 1]], dtype=np.uint8)
    with raises("mask_values", "7, 9", "declared: 0, 1, 2"):
        check_mask(mask, height=2, width=3, frames=1, classes=[0, 1, 2])
    many = np.arange(40, dtype=np.uint8).reshape(4, 10)
    with raises("mask_values", "3, 4, 5, 6, 7, 8, 9, 10, 11, 12 and 27 more"):
        check_mask(many, height=4, width=10, frames=1, classes=[0, 1, 2])


@pytest.mark.parametrize("bits", [10, 12, 14, 16])
def test_a_10_to_14_bit_tiff_masks_ids_are_its_stored_ids(tmp_path: Path, bits: int) -> None:
    """OpenCV scales 10-, 12- and 14-bit samples to 16 bits: a 12-bit mask's ids 1, 2 came back as
    16, 32 (packed so without `classes`, a mask_values record naming ids the file lacks with them)."""
    import tifffile

    ids = np.array([[0, 1, 2, 3], [300, 2, 1, 0]], dtype=np.uint16)
    tifffile.imwrite(tmp_path / "m.tif", ids, photometric="minisblack", bitspersample=bits)
    assert np.array_equal(decode_mask((tmp_path / "m.tif").read_bytes(), "m.tif"), ids)


def _damaged_tiff(path: Path, mask: np.ndarray, compression: str, damage: str, pages: int = 1) -> bytes:
    """``mask`` written ``pages`` times as a strip TIFF (8 rows a strip) with ``compression``,
    then the last page's last strip cut to half its StripByteCounts (``short``) or 10 of its
    bytes zeroed (``broken``): what libtiff decodes anyway, padding the lost rows with zeros."""
    import tifffile

    with tifffile.TiffWriter(path) as writer:
        for _ in range(pages):
            writer.write(mask, compression=compression, rowsperstrip=8, photometric="minisblack")
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[-1]
        counts = page.tags["StripByteCounts"]
        offset, count = page.dataoffsets[-1], page.databytecounts[-1]
        width = 2 if counts.dtype == 3 else 4
        at = counts.valueoffset + (len(page.databytecounts) - 1) * width
    data = bytearray(path.read_bytes())
    if damage == "short":
        struct.pack_into("<H" if width == 2 else "<I", data, at, count // 2)
    else:
        data[offset + 2:offset + 12] = bytes(10)
    return bytes(data)


@pytest.mark.parametrize(("compression", "damage"), [("zlib", "short"), ("zlib", "broken"), ("lzw", "short"),
                                                     ("packbits", "short")])
@pytest.mark.parametrize("pages", [1, 2])
def test_a_tiff_mask_whose_compressed_strip_is_cut_short_or_broken_is_unreadable(
        tmp_path: Path, compression: str, damage: str, pages: int) -> None:
    """libtiff (under OpenCV) fills the rows of a Deflate, LZW or PackBits strip that runs out
    with zeros and returns the page: a mask holding only ids 1 and 2 packed those rows as
    background (id 0) that no one drew. It is mask_unreadable, as the same damage in an image is
    decode_failed, naming the file, the page and the fix."""
    mask = np.random.default_rng(3).integers(1, 3, (40, 48)).astype(np.uint8)
    data = _damaged_tiff(tmp_path / "m.tif", mask, compression, damage, pages)
    codec = {"zlib": "Deflate", "lzw": "LZW", "packbits": "PackBits"}[compression]
    with raises("mask_unreadable", "m.tif", f"page {pages - 1}", f"{codec} strip 4", "re-export the mask"):
        decode_mask(data, "m.tif")
    import tifffile

    whole = tmp_path / "whole.tif"
    tifffile.imwrite(whole, np.stack([mask] * pages) if pages > 1 else mask, compression=compression,
                     rowsperstrip=8, photometric="minisblack")
    assert np.array_equal(decode_mask(whole.read_bytes(), "whole.tif"), np.stack([mask] * pages) if pages > 1 else mask)


@pytest.mark.parametrize("bits", [8, 12, 16])
def test_a_white_is_zero_tiff_mask_of_any_depth_decodes_to_its_stored_ids(tmp_path: Path, bits: int) -> None:
    """libtiff (under OpenCV) inverts a WhiteIsZero page only where it reads it at 8 bits or fewer;
    a 10- to 16-bit one comes back as stored (10-14 bits scaled to 16). Inverting every page made a
    16-bit mask's ids 0, 300, 600 read 65535, 65235, 64935 (a 12-bit one's 4095 - id)."""
    import tifffile

    ids = np.array([[0, 1, 2, 3], [200, 2, 1, 0]], dtype=np.uint8 if bits == 8 else np.uint16)
    if bits > 8:
        ids[1, 0] = 600
    tifffile.imwrite(tmp_path / "m.tif", ids, photometric="miniswhite", bitspersample=bits)
    assert np.array_equal(tifffile.imread(tmp_path / "m.tif"), ids)  # the stored values, as tifffile reads them
    decoded = decode_mask((tmp_path / "m.tif").read_bytes(), "m.tif")
    assert np.array_equal(decoded, ids), (bits, np.unique(decoded))


def test_a_tiff_mask_whose_pages_differ_in_size_decodes_page_by_page_only(tmp_path: Path) -> None:
    """decode_mask gives one F×H×W array, so pages of different sizes are mask_size there;
    decode_mask_pages gives each page at its own size, for an image whose pages differ too."""
    import tifffile

    pages = [block_ids(2, 2, 4), block_ids(1, 3, 2)]
    with tifffile.TiffWriter(tmp_path / "m.tif") as tif:
        for page in pages:
            tif.write(page, photometric="minisblack")
    data = (tmp_path / "m.tif").read_bytes()
    with raises("mask_size", "m.tif", "8×8, 2×6"):
        decode_mask(data, "m.tif")
    decoded = decode_mask_pages(data, "m.tif")
    assert [page.tolist() for page in decoded] == [page.tolist() for page in pages]
    stack = np.stack([pages[0], pages[0] + 1])
    np.save(tmp_path / "m.npy", stack)
    assert [p.tolist() for p in decode_mask_pages((tmp_path / "m.npy").read_bytes(), "m.npy")] == stack.tolist()
