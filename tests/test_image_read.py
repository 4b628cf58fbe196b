"""packer.read.image: header probe, byte estimate, decode and the Issue for each defect.

Every file is real: written with OpenCV (or, for big-endian TIFF and EXIF, spliced by hand
with struct) into tmp_path. Expected values come from numpy on the arrays we wrote.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import ImageTransformConfig
from packer.errors import ConfigError
from packer.read import image as image_mod
from packer.read import image_structure, jpeg_scan
from packer.read.image import ImageHeader, probe_image, read_image
from packer.records import Issue, Sample, SampleRef

RNG = np.random.default_rng(20240611)
DEFAULT = ImageTransformConfig()


def make_ref(path: Path, sample_id: str = "img-001") -> SampleRef:
    return SampleRef(sample_id=sample_id, source="photos", kind="image", path=str(path), relpath=path.name,
                     label="cat", entity="e1", time="2024-01-01")


def write_image(path: Path, array: np.ndarray, params: tuple[int, ...] = ()) -> Path:
    ok, encoded = cv2.imencode(path.suffix, array, list(params))
    assert ok, f"OpenCV could not encode {path.suffix}"
    path.write_bytes(encoded.tobytes())
    return path


def noise(shape: tuple[int, ...], dtype: type = np.uint8) -> np.ndarray:
    return RNG.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


def smooth_bgr(height: int, width: int) -> np.ndarray:
    """A gradient that survives JPEG well and differs in every row and column."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.dstack([rows * 250 // height, cols * 250 // width, (rows + cols) * 120 // (height + width)]
                     ).astype(np.uint8)


def exif_app1(orientation: int, order: str) -> bytes:
    """APP1 'Exif' segment whose IFD0 holds one SHORT tag 0x0112 = orientation."""
    tiff = (b"MM\x00\x2a" if order == ">" else b"II\x2a\x00") + struct.pack(order + "I", 8)
    tiff += struct.pack(order + "H", 1) + struct.pack(order + "HHIHH", 0x0112, 3, 1, orientation, 0)
    tiff += struct.pack(order + "I", 0)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def app_segment(marker: int, size: int) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", size + 2) + bytes(size)


def tiff_bytes(array: np.ndarray, *, big_endian: bool, orientation: int | None = None) -> bytes:
    """A one-strip uncompressed TIFF (grey or RGB, 8 or 16 bit) in the chosen byte order."""
    order = ">" if big_endian else "<"
    height, width = array.shape[:2]
    spp = 1 if array.ndim == 2 else array.shape[2]
    bits = array.dtype.itemsize * 8
    pixels = array.astype(array.dtype.newbyteorder(order)).tobytes()
    entries: list[tuple[int, int, int, int]] = [
        (256, 4, 1, width), (257, 4, 1, height), (258, 3, spp, bits), (259, 3, 1, 1),
        (262, 3, 1, 2 if spp == 3 else 1), (273, 4, 1, 8)]
    if orientation is not None:
        entries.append((274, 3, 1, orientation))
    entries += [(277, 3, 1, spp), (278, 4, 1, height), (279, 4, 1, len(pixels)), (284, 3, 1, 1)]
    pad = len(pixels) % 2
    ifd_at = 8 + len(pixels) + pad
    extra_at = ifd_at + 2 + 12 * len(entries) + 4
    out = (b"MM\x00\x2a" if big_endian else b"II\x2a\x00") + struct.pack(order + "I", ifd_at)
    out += pixels + bytes(pad) + struct.pack(order + "H", len(entries))
    extra = b""
    for tag, kind, count, value in entries:
        if tag == 258 and spp > 1:  # spp SHORTs do not fit in the 4-byte field
            field, extra = struct.pack(order + "I", extra_at), struct.pack(order + "H" * spp, *[bits] * spp)
        elif kind == 3:
            field = struct.pack(order + "HH", value, 0)
        else:
            field = struct.pack(order + "I", value)
        out += struct.pack(order + "HHI", tag, kind, count) + field
    return out + struct.pack(order + "I", 0) + extra


def read_ok(path: Path, cfg: ImageTransformConfig = DEFAULT) -> list[Sample]:
    result = read_image(make_ref(path), cfg)
    assert not isinstance(result, Issue), result
    return result


def read_issue(path: Path, cfg: ImageTransformConfig = DEFAULT) -> Issue:
    result = read_image(make_ref(path), cfg)
    assert isinstance(result, Issue), f"expected an Issue, got {len(result)} samples"
    assert path.name in result.message or result.reason == "unexpected_error"
    return result


def chw_rgb(bgr: np.ndarray) -> np.ndarray:
    return bgr[:, :, ::-1].transpose(2, 0, 1)


# --- decode per format ------------------------------------------------------------------------

def test_png_8bit_rgb_keeps_pixels_and_metadata(tmp_path: Path) -> None:
    bgr = noise((12, 20, 3))
    [sample] = read_ok(write_image(tmp_path / "a.png", bgr))
    assert sample.key == "img-001"
    assert sample.image.dtype == np.uint8 and sample.image.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(sample.image, chw_rgb(bgr))
    assert sample.metadata == {"format": "png", "source_height": 12, "source_width": 20, "source_channels": 3,
                               "bit_depth": 8, "orientation": 1}


def test_png_8bit_gray_gives_three_equal_channels_or_one(tmp_path: Path) -> None:
    grey = noise((9, 7))
    path = write_image(tmp_path / "g.png", grey)
    [rgb] = read_ok(path)
    np.testing.assert_array_equal(rgb.image, np.stack([grey] * 3))
    [one] = read_ok(path, ImageTransformConfig(color="gray"))
    np.testing.assert_array_equal(one.image, grey[None])
    assert one.metadata["source_channels"] == 1


def test_png_16bit_is_scaled_by_255_over_65535(tmp_path: Path) -> None:
    stored = np.array([[0, 65535, 25700, 32768, 257]], dtype=np.uint16)
    [sample] = read_ok(write_image(tmp_path / "d.png", stored), ImageTransformConfig(color="gray"))
    # 25700 = 100 · 257 → 100; 32768 · 255 / 65535 = 127.502 → 128; 257 → 1
    np.testing.assert_array_equal(sample.image, [[[0, 255, 100, 128, 1]]])
    assert sample.metadata["bit_depth"] == 16


def test_png_16bit_rgb(tmp_path: Path) -> None:
    bgr = noise((4, 5, 3), np.uint16)
    [sample] = read_ok(write_image(tmp_path / "c16.png", bgr))
    expected = np.rint(bgr.astype(np.float64) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(sample.image, chw_rgb(expected))


def with_trns(png: bytes, key: int) -> bytes:
    """``png`` with a greyscale tRNS chunk (the 16-bit grey value that is transparent) after IHDR."""
    body = b"tRNS" + struct.pack(">H", key)
    chunk = struct.pack(">I", 2) + body + struct.pack(">I", zlib.crc32(body))
    return png[:33] + chunk + png[33:]


@pytest.mark.parametrize(("bits", "key"), [(8, 65), (16, 40000), (2, 1)])
def test_a_grey_pngs_transparency_key_composites_over_white_and_drops(tmp_path: Path, bits: int, key: int) -> None:
    """A grey PNG may say which grey is transparent with a tRNS chunk instead of an alpha channel
    (palette and RGB PNGs' keys OpenCV turns into alpha; a grey one's it ignored): composite packs
    those pixels white, drop packs their grey."""
    rng = np.random.default_rng(bits)
    if bits == 2:  # 2-bit samples: 0..3, which libpng expands to 0, 85, 170, 255
        from PIL import Image

        stored = rng.integers(0, 4, (6, 8)).astype(np.uint8)
        out = tmp_path / "g.png"
        Image.fromarray(stored).save(out, bits=2)
        data, grey, opaque = out.read_bytes(), stored * 85, 255
    else:
        dtype = np.uint8 if bits == 8 else np.uint16
        grey = rng.integers(0, np.iinfo(dtype).max, (6, 8), endpoint=True).astype(dtype)
        grey[::2, ::3] = key
        data, opaque = cv2.imencode(".png", grey)[1].tobytes(), np.iinfo(dtype).max
    assert data[24] == bits and data[25] == 0
    path = tmp_path / "keyed.png"
    path.write_bytes(with_trns(data, key))
    transparent = grey == (key * 85 if bits == 2 else key)
    assert transparent.any() and not transparent.all()
    (composited,) = read_ok(path, ImageTransformConfig(color="gray", alpha="composite"))
    expected = np.where(transparent, 255, np.rint(grey.astype(np.float64) / opaque * 255))
    np.testing.assert_array_equal(composited.image[0], expected.astype(np.uint8))
    (dropped,) = read_ok(path, ImageTransformConfig(color="gray", alpha="drop"))
    np.testing.assert_array_equal(dropped.image[0], np.rint(grey.astype(np.float64) / opaque * 255).astype(np.uint8))


def test_tiff_8bit_rgb_and_16bit_gray(tmp_path: Path) -> None:
    bgr = noise((6, 9, 3))
    [rgb] = read_ok(write_image(tmp_path / "c.tiff", bgr))
    np.testing.assert_array_equal(rgb.image, chw_rgb(bgr))
    assert rgb.metadata["format"] == "tiff"
    grey = np.array([[0, 257, 514], [65535, 1285, 2570]], dtype=np.uint16)
    [deep] = read_ok(write_image(tmp_path / "g.tif", grey), ImageTransformConfig(color="gray"))
    np.testing.assert_array_equal(deep.image, [[[0, 1, 2], [255, 5, 10]]])


@pytest.mark.parametrize("big_endian", [False, True])
def test_hand_built_tiff_both_byte_orders(tmp_path: Path, big_endian: bool) -> None:
    grey = np.array([[0, 2570, 65535], [5140, 257, 12850]], dtype=np.uint16)
    path = tmp_path / "h.tif"
    path.write_bytes(tiff_bytes(grey, big_endian=big_endian))
    assert probe_image(make_ref(path)) == ImageHeader(2, 3, 1, 16, "tiff", 1)
    [sample] = read_ok(path, ImageTransformConfig(color="gray"))
    np.testing.assert_array_equal(sample.image, [[[0, 10, 255], [20, 1, 50]]])


def test_bmp_24bit_and_8bit_gray(tmp_path: Path) -> None:
    bgr = noise((5, 6, 3))
    [rgb] = read_ok(write_image(tmp_path / "c.bmp", bgr))
    np.testing.assert_array_equal(rgb.image, chw_rgb(bgr))
    grey = noise((7, 3))
    [one] = read_ok(write_image(tmp_path / "g.bmp", grey), ImageTransformConfig(color="gray"))
    np.testing.assert_array_equal(one.image, grey[None])


def test_float_tiff_needs_a_window(tmp_path: Path) -> None:
    values = np.array([[0.0, 0.5], [1.0, 2.0]], dtype=np.float32)
    path = write_image(tmp_path / "f.tiff", values)
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("missing_window", "transform")
    [sample] = read_ok(path, ImageTransformConfig(color="gray", window=(("center", 1.0), ("width", 2.0))))
    # y = (x − 1) / 2 + 0.5: 0 → 0, 0.5 → 0.25 → 63.75, 1 → 0.5 → 127.5 (rint → 128), 2 → 1
    np.testing.assert_array_equal(sample.image, [[[0, 64], [128, 255]]])
    assert sample.metadata["bit_depth"] == 32


# --- EXIF / TIFF orientation ------------------------------------------------------------------

def _by_hand(base: np.ndarray, orientation: int) -> np.ndarray:
    """EXIF 2.3 Orientation, written independently of the code under test."""
    return {
        1: base,
        2: np.fliplr(base),
        3: np.rot90(base, 2),
        4: np.flipud(base),
        5: np.rot90(np.fliplr(base), 1),  # transpose = mirror, then a quarter turn counter-clockwise
        6: np.rot90(base, -1),  # 90° clockwise
        7: np.rot90(np.fliplr(base), -1),  # transverse = mirror, then a quarter turn clockwise
        8: np.rot90(base, 1),  # 90° counter-clockwise
    }[orientation]


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_exif_orientation_is_applied(tmp_path: Path, orientation: int) -> None:
    ok, encoded = cv2.imencode(".jpg", smooth_bgr(16, 24))
    assert ok
    data = encoded.tobytes()
    spliced = data[:2] + exif_app1(orientation, ">" if orientation % 2 else "<") + data[2:]
    path = tmp_path / "o.jpg"
    path.write_bytes(spliced)
    unrotated = cv2.imdecode(np.frombuffer(spliced, np.uint8), cv2.IMREAD_UNCHANGED)
    assert unrotated.shape == (16, 24, 3)  # OpenCV ignores EXIF here, so the reader must rotate
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(_by_hand(unrotated, orientation)))
    # a second, independent oracle: OpenCV's own EXIF handling under IMREAD_COLOR
    np.testing.assert_array_equal(sample.image, chw_rgb(cv2.imdecode(np.frombuffer(spliced, np.uint8),
                                                                     cv2.IMREAD_COLOR)))
    assert sample.metadata["orientation"] == orientation
    assert (sample.metadata["source_height"], sample.metadata["source_width"]) == (16, 24)
    header = probe_image(make_ref(path))
    assert header == ImageHeader(16, 24, 3, 8, "jpeg", orientation)


@pytest.mark.parametrize(("first", "second"), [(1, 6), (6, 1), (3, 8)])
def test_a_jpeg_with_two_exif_segments_is_turned_by_the_first(tmp_path: Path, first: int, second: int) -> None:
    # Pillow's exif_transpose and OpenCV's imread both read the first APP1 Exif segment; a later
    # one (an editor's appended copy) must not turn the pixels another way than every viewer shows
    data = cv2.imencode(".jpg", smooth_bgr(16, 24))[1].tobytes()
    spliced = data[:2] + exif_app1(first, ">") + exif_app1(second, "<") + data[2:]
    path = tmp_path / "two.jpg"
    path.write_bytes(spliced)
    unrotated = cv2.imdecode(np.frombuffer(spliced, np.uint8), cv2.IMREAD_UNCHANGED)
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(_by_hand(unrotated, first)))
    np.testing.assert_array_equal(sample.image, chw_rgb(cv2.imdecode(np.frombuffer(spliced, np.uint8),
                                                                     cv2.IMREAD_COLOR)))
    assert sample.metadata["orientation"] == first
    assert probe_image(make_ref(path)) == ImageHeader(16, 24, 3, 8, "jpeg", first)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def exif_tiff(orientation: int, order: str) -> bytes:
    """The TIFF block of :func:`exif_app1` (what a PNG eXIf chunk holds: no ``Exif`` prefix)."""
    return exif_app1(orientation, order)[10:]


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, whole chunk bytes) of every chunk of a PNG, in order."""
    chunks, pos = [], 8
    while pos < len(data):
        length = struct.unpack_from(">I", data, pos)[0]
        chunks.append((data[pos + 4:pos + 8], data[pos:pos + 12 + length]))
        pos += 12 + length
    return chunks


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("place", ["before IDAT", "after IDAT"])
def test_png_exif_orientation_is_applied_wherever_the_chunk_sits(tmp_path: Path, orientation: int,
                                                                 place: str) -> None:
    bgr = noise((5, 7, 3))
    ok, encoded = cv2.imencode(".png", bgr)
    assert ok
    data = encoded.tobytes()
    chunks = png_chunks(data)
    kinds = [kind for kind, _ in chunks]
    at = kinds.index(b"IDAT") if place == "before IDAT" else kinds.index(b"IEND")
    exif = png_chunk(b"eXIf", exif_tiff(orientation, ">" if orientation % 2 else "<"))
    spliced = data[:8] + b"".join(c for _, c in chunks[:at]) + exif + b"".join(c for _, c in chunks[at:])
    path = tmp_path / "o.png"
    path.write_bytes(spliced)
    as_stored = cv2.imdecode(np.frombuffer(spliced, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(as_stored, bgr)  # the file is valid and OpenCV leaves it as stored
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(_by_hand(bgr, orientation)))
    assert sample.metadata["orientation"] == orientation
    assert (sample.metadata["source_height"], sample.metadata["source_width"]) == (5, 7)


def test_a_png_without_exif_or_with_a_broken_one_is_read_as_stored(tmp_path: Path) -> None:
    bgr = noise((4, 6, 3))
    data = cv2.imencode(".png", bgr)[1].tobytes()
    broken = data[:33] + png_chunk(b"eXIf", b"MM\x00*\x00\x00\xff\xff") + data[33:]  # IFD offset past the end
    for name, content in (("plain.png", data), ("broken.png", broken)):
        (tmp_path / name).write_bytes(content)
        [sample] = read_ok(tmp_path / name)
        np.testing.assert_array_equal(sample.image, chw_rgb(bgr))
        assert sample.metadata["orientation"] == 1


@pytest.mark.parametrize("orientation", [3, 6, 7])
def test_tiff_orientation_is_applied_once(tmp_path: Path, orientation: int) -> None:
    bgr = noise((4, 6, 3))
    path = tmp_path / "o.tif"
    path.write_bytes(tiff_bytes(bgr[:, :, ::-1], big_endian=False, orientation=orientation))  # TIFF stores RGB
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(_by_hand(bgr, orientation)))
    assert (sample.metadata["source_height"], sample.metadata["source_width"]) == (4, 6)
    assert probe_image(make_ref(path)) == ImageHeader(4, 6, 3, 8, "tiff", orientation)


# --- probe ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "shape", "dtype", "params", "channels", "bits"), [
    ("a.png", (13, 21, 3), np.uint8, (), 3, 8),
    ("b.png", (13, 21), np.uint16, (), 1, 16),
    ("c.png", (13, 21, 4), np.uint8, (), 4, 8),
    ("d.jpg", (13, 21, 3), np.uint8, (), 3, 8),
    ("e.jpg", (13, 21), np.uint8, (), 1, 8),
    ("f.jpg", (37, 50, 3), np.uint8, (cv2.IMWRITE_JPEG_PROGRESSIVE, 1), 3, 8),
    ("g.tiff", (13, 21, 3), np.uint8, (), 3, 8),
    ("h.tiff", (13, 21), np.uint16, (), 1, 16),
    ("i.bmp", (13, 21, 3), np.uint8, (), 3, 8),
    ("j.bmp", (13, 21), np.uint8, (), 1, 8),
])
def test_probe_matches_real_dims(tmp_path: Path, name: str, shape: tuple[int, ...], dtype: type,
                                 params: tuple[int, ...], channels: int, bits: int) -> None:
    path = write_image(tmp_path / name, noise(shape, dtype), params)
    header = probe_image(make_ref(path))
    assert isinstance(header, ImageHeader), header
    assert (header.height, header.width, header.channels, header.bit_depth) == (shape[0], shape[1], channels, bits)
    decoded = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED)
    assert decoded.shape[:2] == (header.height, header.width)


def test_progressive_jpeg_is_sof2(tmp_path: Path) -> None:
    path = write_image(tmp_path / "p.jpg", smooth_bgr(40, 56), (cv2.IMWRITE_JPEG_PROGRESSIVE, 1))
    assert b"\xff\xc2" in path.read_bytes() and b"\xff\xc0" not in path.read_bytes()
    assert probe_image(make_ref(path)) == ImageHeader(40, 56, 3, 8, "jpeg", 1)
    [sample] = read_ok(path)
    assert sample.image.shape == (3, 40, 56)


def test_probe_finds_sof_after_large_app_segments(tmp_path: Path) -> None:
    ok, encoded = cv2.imencode(".jpg", smooth_bgr(30, 45))
    data = encoded.tobytes()
    # EXIF, then ~130 KB of APP2 (ICC-sized) segments: the SOF lies past the first 64 KiB read
    spliced = data[:2] + exif_app1(6, ">") + app_segment(0xE2, 65000) + app_segment(0xE2, 65000) + data[2:]
    path = tmp_path / "big-app.jpg"
    path.write_bytes(spliced)
    assert spliced.index(b"\xff\xc0") > 64 * 1024
    assert probe_image(make_ref(path)) == ImageHeader(30, 45, 3, 8, "jpeg", 6)
    [sample] = read_ok(path)
    assert sample.image.shape == (3, 45, 30)


# --- defects ----------------------------------------------------------------------------------

def test_truncated_jpeg(tmp_path: Path) -> None:
    ok, encoded = cv2.imencode(".jpg", smooth_bgr(32, 32))
    data = encoded.tobytes()
    dht = data.index(b"\xff\xc4")
    for name, cut, said in (("in-dht.jpg", data[:dht + 10], f"inside the DHT segment (marker FF C4 at byte {dht})"),
                            ("no-eoi.jpg", data[:-2], "without an EOI marker (FFD9)")):
        path = tmp_path / name
        path.write_bytes(cut)
        issue = read_issue(path)
        assert (issue.reason, issue.stage) == ("truncated", "read"), issue
        assert said in issue.message, issue.message


@pytest.mark.parametrize("marker, name", [(0xDB, "DQT"), (0xC0, "SOF0"), (0xC4, "DHT"), (0xDA, "SOS")])
def test_a_jpeg_cut_inside_a_header_segment_says_where_though_it_ends_in_ffd9(tmp_path: Path, marker: int,
                                                                                name: str) -> None:
    # an FF D9 put back after the cut lies inside the segment: the file does end in FF D9, so the
    # message must not say the EOI marker is missing, but where the data ends short
    data = write_image(tmp_path / "whole.jpg", smooth_bgr(32, 32)).read_bytes()
    at = data.index(bytes([0xFF, marker]))
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[:at + 6] + b"\xff\xd9")
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("truncated", "read"), issue
    assert f"inside the {name} segment (marker FF {marker:02X} at byte {at})" in issue.message, issue.message
    assert "without an EOI marker" not in issue.message
    assert "the FF D9 it ends with lies inside that segment" in issue.message
    assert ("before its SOF header" in issue.message) == (marker in (0xDB, 0xC0))


def test_jpeg_with_trailing_bytes_after_eoi_is_fine(tmp_path: Path) -> None:
    ok, encoded = cv2.imencode(".jpg", smooth_bgr(16, 16))
    path = tmp_path / "tail.jpg"
    path.write_bytes(encoded.tobytes() + b"extra appended data \xff\x00\xff")
    assert read_ok(path)[0].image.shape == (3, 16, 16)


def _scan_start(data: bytes) -> int:
    """Where the entropy-coded data of a JPEG's first scan starts (after its SOS segment)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")


_ENCODINGS = {
    "baseline 4:2:0": (),
    "progressive": (cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
    "restart markers": (cv2.IMWRITE_JPEG_RST_INTERVAL, 2),
}


@pytest.mark.parametrize("params", list(_ENCODINGS.values()), ids=list(_ENCODINGS))
def test_a_jpeg_whose_scan_is_cut_but_ends_in_eoi_is_truncated(tmp_path: Path, params: tuple[int, ...]) -> None:
    # libjpeg only warns about the lost scan data and fills the lost rows with grey: OpenCV
    # decodes the file without a word, so the end marker alone proves nothing
    data = write_image(tmp_path / "whole.jpg", noise((64, 64, 3)), (cv2.IMWRITE_JPEG_QUALITY, 95, *params)).read_bytes()
    start = _scan_start(data)
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[:start + (len(data) - start) // 2] + b"\xff\xd9")
    assert cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED) is not None
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("truncated", "read"), issue
    assert "scan data is cut short" in issue.message and "Corrupt JPEG data" in issue.message, issue.message


def test_a_jpeg_whose_scan_holds_a_bad_huffman_code_is_decode_failed(tmp_path: Path) -> None:
    data = write_image(tmp_path / "whole.jpg", noise((32, 32, 3))).read_bytes()
    at = _scan_start(data) + 40
    path = tmp_path / "bad-code.jpg"
    path.write_bytes(data[:at] + b"\xff\x00" * 8 + data[at + 16:])  # all-ones bits: no Huffman code
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("decode_failed", "read"), issue
    assert "bad Huffman code" in issue.message


def test_a_jpeg_warning_that_loses_no_pixel_falls_back_to_opencv(tmp_path: Path) -> None:
    # libjpeg skips stray bytes between segments; TurboJPEG's strict mode stops there, so the file
    # is decoded by OpenCV, as before, and packs
    data = write_image(tmp_path / "whole.jpg", smooth_bgr(24, 32)).read_bytes()
    sos = data.index(b"\xff\xda")
    path = tmp_path / "stray.jpg"
    path.write_bytes(data[:sos] + b"\x00\x01\x02" + data[sos:])
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(cv2.imdecode(np.fromfile(path, np.uint8),
                                                                     cv2.IMREAD_UNCHANGED)))


_VARIED = {
    "grey": ((40, 56), ()),
    "4:2:0": ((40, 56, 3), (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420)),
    "4:2:2": ((40, 56, 3), (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422)),
    "4:4:4": ((40, 56, 3), (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444)),
    "4:1:1": ((40, 56, 3), (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411)),
    "progressive": ((40, 56, 3), (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)),
    "progressive grey": ((40, 56), (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)),
    "restart markers": ((40, 56, 3), (cv2.IMWRITE_JPEG_RST_INTERVAL, 1)),
    "odd size": ((37, 53, 3), (cv2.IMWRITE_JPEG_QUALITY, 60)),
}


@pytest.mark.parametrize("shape, params", list(_VARIED.values()), ids=list(_VARIED))
def test_the_strict_jpeg_decoder_gives_opencvs_pixels(tmp_path: Path, shape: tuple[int, ...],
                                                      params: tuple[int, ...]) -> None:
    # packer decodes JPEGs with libjpeg-turbo in strict mode to see lost scan data, and must pack
    # the very bytes OpenCV's decode gave before
    data = write_image(tmp_path / "v.jpg", noise(shape), params).read_bytes()
    expected = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    decoded = jpeg_scan.strict_decode(data)
    assert decoded is not None, "TurboJPEG should open this file"
    assert (decoded.shape, decoded.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_array_equal(decoded, expected)
    assert decoded.flags.c_contiguous


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_the_strict_jpeg_decoder_leaves_exif_orientation_to_the_reader(tmp_path: Path, orientation: int) -> None:
    data = write_image(tmp_path / "w.jpg", smooth_bgr(16, 24)).read_bytes()
    spliced = data[:2] + exif_app1(orientation, ">") + data[2:]
    path = tmp_path / "o.jpg"
    path.write_bytes(spliced)
    stored = cv2.imdecode(np.frombuffer(spliced, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(jpeg_scan.strict_decode(spliced), stored)  # pixels as stored
    [sample] = read_ok(path)
    np.testing.assert_array_equal(sample.image, chw_rgb(_by_hand(stored, orientation)))
    assert sample.metadata["orientation"] == orientation


def test_truncated_png(tmp_path: Path) -> None:
    data = write_image(tmp_path / "full.png", noise((20, 20, 3))).read_bytes()
    assert data[-8:-4] == b"IEND"
    for name, cut in (("no-iend.png", data[:-12]), ("half.png", data[: len(data) // 2])):
        path = tmp_path / name
        path.write_bytes(cut)
        issue = read_issue(path)
        assert (issue.reason, issue.stage) == ("truncated", "read")
        assert "IEND" in issue.message


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_png_cut_inside_its_iend_chunk_is_truncated(tmp_path: Path, cut: int) -> None:
    """The IEND chunk is 12 bytes (length, type, CRC): a file missing the last 1-3 bytes of its CRC
    has the IEND type yet is cut short, and libpng refuses it. It is truncated (copy it again), not
    decode_failed (re-export it)."""
    data = write_image(tmp_path / "full.png", noise((20, 20, 3))).read_bytes()
    path = tmp_path / "cut.png"
    path.write_bytes(data[:-cut])
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("truncated", "read"), issue
    assert "IEND" in issue.message and "cut.png" in issue.message
    probed = probe_image(make_ref(path))
    assert not isinstance(probed, Issue) or probed.reason == "truncated"


@pytest.mark.parametrize(("name", "head"), [("soi.jpg", b"\xff\xd8"), ("sig.png", b"\x89PNG\r\n"),
                                            ("sig.png", b"\x89P"), ("sig.tif", b"II*")])
def test_a_file_cut_inside_its_signature_is_truncated_not_unsupported(tmp_path: Path, name: str, head: bytes) -> None:
    """A JPEG cut after its SOI marker (FF D8) begins as a JPEG does: the message must not say its
    first bytes are no JPEG signature, and the fix is to copy it again, not to convert it."""
    path = tmp_path / name
    path.write_bytes(head)
    for issue in (read_issue(path), probe_image(make_ref(path))):
        assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("truncated", "read"), issue
        assert name in issue.message and "signature" in issue.message and "cut short" in issue.message


@pytest.mark.parametrize("cut", [8, 20, 32])
def test_a_png_cut_inside_its_ihdr_says_what_to_do(tmp_path: Path, cut: int) -> None:
    """The header probe stops at the IHDR chunk; its truncated record must give the fix as the
    read's does (the read finds no IEND first)."""
    data = write_image(tmp_path / "full.png", noise((20, 20, 3))).read_bytes()
    path = tmp_path / "head.png"
    path.write_bytes(data[:cut])
    for issue in (read_issue(path), probe_image(make_ref(path))):
        assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("truncated", "read"), issue
        assert "head.png" in issue.message and issue.message.endswith("copy or export it again"), issue.message


@pytest.mark.parametrize("cut", [1, 2, 5])
def test_a_tiff_cut_inside_the_sample_format_it_keeps_last_is_truncated(tmp_path: Path, cut: int) -> None:
    """OpenCV writes an RGB TIFF's three SampleFormat (339) values after the IFD, at the end of the
    file: cut there, libtiff cannot read it and the record said decode_failed ('re-export it')
    though the file is only cut short, as a cut inside its BitsPerSample values already said."""
    data = write_image(tmp_path / "full.tif", noise((6, 5, 3))).read_bytes()
    assert struct.unpack_from("<I", data, len(data) - 6)[0] == 0x10001  # SampleFormat 1, 1, 1 last
    path = tmp_path / "rgb.tif"
    path.write_bytes(data[:-cut])
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("truncated", "read"), issue
    assert "rgb.tif" in issue.message and "339" in issue.message and issue.message.endswith("export it again")


@pytest.mark.parametrize("head", [b"II*\x00", b"MM\x00*\x00\x00", b"II+\x00\x08\x00\x00\x00\x00\x00"])
def test_a_tiff_cut_inside_its_8_or_16_byte_header_is_truncated(tmp_path: Path, head: bytes) -> None:
    """'II*\\0' is a TIFF's byte order and version: a file that ends before its first-IFD offset was
    cut short; the record said 'TIFF header 49492a00 is not II/MM + version', which is false."""
    path = tmp_path / "head.tif"
    path.write_bytes(head)
    for issue in (read_issue(path), probe_image(make_ref(path))):
        assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("truncated", "read"), issue
        assert "head.tif" in issue.message and "cut short" in issue.message


@pytest.mark.parametrize("first_ifd", [0, 4, 7])
def test_a_tiff_whose_first_ifd_offset_points_into_its_header_is_decode_failed(tmp_path: Path, first_ifd: int) -> None:
    """The long fuzz run: a TIFF header whose first-IFD offset is 0 (or inside the 8-byte header)
    names no image directory. The probe read an 'IFD' at byte 0 ('II' = 18761 entries) and called
    the file truncated; the read walked an empty chain into max() of nothing, unexpected_error.
    Both now say decode_failed: the header is damaged."""
    path = tmp_path / "noifd.tif"
    path.write_bytes(b"II*\x00" + struct.pack("<I", first_ifd) + bytes(range(200)))
    for issue in (read_issue(path), probe_image(make_ref(path))):
        assert isinstance(issue, Issue) and (issue.reason, issue.stage) == ("decode_failed", "read"), issue
        assert "noifd.tif" in issue.message and "first IFD" in issue.message


def test_truncated_tiff_and_bmp(tmp_path: Path) -> None:
    tiff = tiff_bytes(noise((20, 20)), big_endian=True)  # the IFD follows the 400 pixel bytes
    cut_tiff = tmp_path / "cut.tif"
    cut_tiff.write_bytes(tiff[: 8 + 200])
    issue = read_issue(cut_tiff)
    assert issue.reason == "truncated" and "IFD" in issue.message
    bmp = write_image(tmp_path / "full.bmp", noise((20, 20, 3))).read_bytes()
    cut_bmp = tmp_path / "cut.bmp"
    cut_bmp.write_bytes(bmp[: len(bmp) - 100])
    assert read_issue(cut_bmp).reason == "truncated"


def test_tiff_strips_past_end_are_truncated(tmp_path: Path) -> None:
    grey = noise((10, 10))
    data = tiff_bytes(grey, big_endian=False)
    # move the IFD to the front so cutting the tail cuts pixels but keeps the IFD
    ifd_at = struct.unpack("<I", data[4:8])[0]
    ifd = data[ifd_at:]
    strip_at = 8 + len(ifd)
    fixed = bytearray(ifd)
    for i in range(struct.unpack("<H", ifd[:2])[0]):
        if struct.unpack_from("<H", ifd, 2 + 12 * i)[0] == 273:
            struct.pack_into("<I", fixed, 2 + 12 * i + 8, strip_at)
    rebuilt = b"II\x2a\x00" + struct.pack("<I", 8) + bytes(fixed) + grey.tobytes()
    whole = tmp_path / "whole.tif"
    whole.write_bytes(rebuilt)
    np.testing.assert_array_equal(read_ok(whole, ImageTransformConfig(color="gray"))[0].image, grey[None])
    cut = tmp_path / "cut.tif"
    cut.write_bytes(rebuilt[:-30])
    issue = read_issue(cut)
    assert issue.reason == "truncated" and "runs to byte" in issue.message


def test_random_bytes_named_png_are_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "noise.png"
    path.write_bytes(b"GIF89a" + RNG.integers(0, 255, 200, dtype=np.uint8).tobytes())
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("unsupported", "read")
    assert "47 49 46 38 39 61" in issue.message and ".png" in issue.message
    probed = probe_image(make_ref(path))
    assert isinstance(probed, Issue) and probed.reason == "unsupported"


def test_a_dicom_file_named_png_is_told_to_go_to_a_dicom_source(tmp_path: Path) -> None:
    """A DICOM file among the photos (x.png): 'first bytes 00 00 ... are not a PNG ... signature;
    convert the file to png' sent the user to convert a DICOM file; it is named as DICOM, with the
    source kind that reads it."""
    path = tmp_path / "scan.png"
    path.write_bytes(bytes(128) + b"DICM" + RNG.integers(0, 255, 300, dtype=np.uint8).tobytes())
    for issue in (read_issue(path), probe_image(make_ref(path))):
        assert isinstance(issue, Issue) and issue.reason == "unsupported"
        assert "a DICOM file (DICM at byte 128)" in issue.message and "kind: dicom" in issue.message, issue.message


def test_corrupt_png_data_is_decode_failed(tmp_path: Path) -> None:
    data = bytearray(write_image(tmp_path / "ok.png", noise((16, 16, 3))).read_bytes())
    start = data.index(b"IDAT") + 4
    data[start + 10:start + 40] = bytes(30)  # structure intact, compressed stream and CRC broken
    path = tmp_path / "corrupt.png"
    path.write_bytes(bytes(data))
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("decode_failed", "read")
    assert "png" in issue.message


def test_empty_missing_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    missing = tmp_path / "gone.png"
    folder = tmp_path / "folder.png"
    folder.mkdir()
    for path, reason in ((empty, "unreadable"), (missing, "missing_file"), (folder, "unreadable")):
        for result in (read_image(make_ref(path), DEFAULT), probe_image(make_ref(path))):
            assert isinstance(result, Issue) and (result.reason, result.stage) == (reason, "read"), result
            assert path.name in result.message


@pytest.mark.parametrize(("array", "said"), [
    (np.full((8, 8), 7, np.uint8), "every pixel is [7] (8×8)"),
    (np.full((8, 8, 3), (30, 200, 10), np.uint8), "every pixel is RGB [10, 200, 30] (8×8)"),  # written as BGR
    (np.full((8, 8, 4), (30, 200, 10, 128), np.uint8), "every pixel is RGBA [10, 200, 30, 128] (8×8)"),
    (np.full((8, 8), 4000, np.uint16), "every pixel is [4000] (8×8)")])
def test_constant_image(tmp_path: Path, array: np.ndarray, said: str) -> None:
    issue = read_issue(write_image(tmp_path / "flat.png", array))
    assert (issue.reason, issue.stage) == ("constant_image", "validate")
    assert said in issue.message, issue.message


def test_unexpected_error_becomes_an_issue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_image(tmp_path / "a.png", noise((4, 4)))

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(image_mod, "transform_image", boom)
    issue = read_image(make_ref(path), DEFAULT)
    assert isinstance(issue, Issue)
    assert (issue.reason, issue.stage, issue.message) == ("unexpected_error", "transform", "RuntimeError: boom")


def test_bad_config_raises_config_error(tmp_path: Path) -> None:
    path = write_image(tmp_path / "a.png", noise((4, 4)))
    for cfg in (ImageTransformConfig(color="cmyk"), ImageTransformConfig(window=(("width", 0.0), ("center", 1.0))),
                ImageTransformConfig(tile_size=(0, 4)), ImageTransformConfig(resize="squash", size=(2, 2))):
        with pytest.raises(ConfigError, match="transform.image"):
            read_image(make_ref(path), cfg)


# --- found by tests/test_fuzz.py --------------------------------------------------------------


def test_tiff_tag_without_values_is_treated_as_absent(tmp_path: Path) -> None:
    """SamplesPerPixel (277) with a count of 0 used to index an empty tuple (unexpected_error)."""
    data = bytearray(tiff_bytes(noise((6, 5)), big_endian=False))
    ifd_at = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack_from("<H", data, ifd_at)[0]):
        at = ifd_at + 2 + 12 * i
        if struct.unpack_from("<H", data, at)[0] == 277:
            struct.pack_into("<I", data, at + 4, 0)
    path = tmp_path / "count0.tif"
    path.write_bytes(bytes(data))
    assert probe_image(make_ref(path)) == ImageHeader(6, 5, 1, 8, "tiff", 1)


@pytest.mark.parametrize(("head", "needle"), [
    (b"MM\x00+\x00\x08\x00\x00" + struct.pack(">Q", 2**63 + 5), "IFD at byte 9223372036854775813"),
    (b"II+\x00\x08\x00\x00\x00" + struct.pack("<QQ", 16, 2**60), "1152921504606846976 entries"),
])
def test_bigtiff_offsets_past_the_file_are_truncated(tmp_path: Path, head: bytes, needle: str) -> None:
    """A 64-bit IFD offset past what seek() takes (ValueError), or an entry count that read()
    would allocate before failing: both are checked against the file size first."""
    path = tmp_path / "big.tif"
    path.write_bytes(head + bytes(32))
    for result in (probe_image(make_ref(path)), read_image(make_ref(path), DEFAULT)):
        assert isinstance(result, Issue) and (result.reason, result.stage) == ("truncated", "read")
        assert needle in result.message


_MARKER_REGEX = __import__("re").compile(rb"\xff+([^\x00\xff])")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\xff", b"\x00", b"\xd9", b"\xd0", b"\xe1", b"ab", b"\xff\xff"]), max_size=60))
def test_jpeg_marker_scan_finds_what_the_marker_grammar_says(parts: list[bytes]) -> None:
    """FF fill bytes then a code other than 00/FF is a marker; the vectorised scan must find,
    from every position, the marker the plain regex of that grammar finds."""
    data = b"".join(parts)
    ends = image_structure._jpeg_marker_ends(data)
    for pos in range(len(data) + 1):
        match = _MARKER_REGEX.search(data, pos)
        at = int(np.searchsorted(ends, pos + 1))
        assert (None if at == len(ends) else int(ends[at]) + 1) == (None if match is None else match.end())


def test_opencv_logs_nothing_of_its_own_for_a_file_it_cannot_decode(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """OpenCV's own log wrote lines such as ``[ERROR:0@0.99] global loadsave.cpp:1355 imdecode_
    imdecode_(''): can't read header: ... m_rle_code_ >= 0`` to the build's stderr, between the
    progress lines and naming no file (found by mutating BMP and TIFF files): the file's record says
    what happened. (libpng's and libjpeg's own lines are theirs, as the README says.)"""
    ok, encoded = cv2.imencode(".bmp", np.full((12, 16, 3), 90, np.uint8))
    assert ok
    data = bytearray(encoded.tobytes())
    struct.pack_into("<I", data, 30, 9)  # BITMAPINFOHEADER biCompression: no such method
    path = tmp_path / "damaged.bmp"
    path.write_bytes(bytes(data))
    capfd.readouterr()
    found = read_issue(path)
    assert found.reason in ("decode_failed", "unsupported", "bad_shape"), found.message
    assert "[ERROR" not in capfd.readouterr().err
    assert cv2.utils.logging.getLogLevel() != cv2.utils.logging.LOG_LEVEL_SILENT  # the caller's level, restored


def test_an_animated_png_is_refused_not_packed_as_its_first_frame(tmp_path: Path) -> None:
    """An APNG (PNG with an acTL chunk) decodes as its default image alone: its other frames
    vanished without a record. It is refused, naming the frame count and the fix; a still PNG
    written by the same writer packs."""
    from PIL import Image

    ramp = np.arange(16 * 20 * 3, dtype=np.uint16).reshape(16, 20, 3) % 200
    frames = [Image.fromarray((ramp + 10 * i).astype(np.uint8)) for i in range(3)]
    animated = tmp_path / "anim.png"
    frames[0].save(animated, save_all=True, append_images=frames[1:], duration=100)
    assert b"acTL" in animated.read_bytes()
    issue = read_issue(animated)
    assert issue.reason == "unsupported"
    assert "an animated PNG (APNG: an acTL chunk, 3 frames)" in issue.message and "own PNG" in issue.message
    still = tmp_path / "still.png"
    frames[0].save(still)
    (sample,) = read_ok(still)
    assert sample.image.shape == (3, 16, 20)


def test_the_strict_jpeg_decoders_version_keys_the_build_cache_but_not_the_manifest() -> None:
    """simplejpeg decides which JPEGs are refused (scan data cut short): a cache entry made under
    another version must not be reused, and a cluster's workers must run the client's; its pixels
    are OpenCV's, so the manifest (and every dataset_hash) records no version of it."""
    from packer.manifest import decoding_libraries, library_versions
    from packer.pipeline.cluster import environment

    assert "simplejpeg" in decoding_libraries() and "simplejpeg" not in library_versions()
    assert "simplejpeg" in dict(environment())
