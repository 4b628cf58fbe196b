"""packer.read.image on multi-page TIFFs: one sample per page, reduced-resolution IFDs skipped,
and the IFD chain checked (loops, page cap, cut files, size limits over all pages).

Files are real: written by hand with struct (:func:`tiff_pages`: classic or BigTIFF, either
byte order) or by ``cv2.imencodemulti``. Expected pixels come from numpy on the arrays written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.config import ImageTransformConfig, LimitsConfig
from packer.read import image as image_mod
from packer.read.image import ImageHeader, probe_image, read_image
from packer.records import Issue, Sample, SampleRef
from packer.transform.image import transform_image

RNG = np.random.default_rng(20240612)
DEFAULT = ImageTransformConfig()
DEFAULT_LIMITS = LimitsConfig()


@dataclass(frozen=True)
class TiffPage:
    """One IFD: ``array`` as TIFF stores it (H×W grey or H×W×3 RGB, uint8 or uint16)."""

    array: np.ndarray
    orientation: int | None = None
    subfile: int | None = None  # NewSubfileType (254); bit 0 = reduced-resolution image


def tiff_pages(pages: list[TiffPage], *, big_endian: bool = False, bigtiff: bool = False) -> bytes:
    """An uncompressed one-strip-per-page TIFF: header, then every IFD (with its out-of-line
    values), then every page's strip, in page order (so cutting the tail cuts the last strip)."""
    order = ">" if big_endian else "<"
    off, count_fmt, entry_size, inline = ("Q", "Q", 20, 8) if bigtiff else ("I", "H", 12, 4)
    long_type = 16 if bigtiff else 4  # LONG8 strip offsets and counts in a BigTIFF
    magic = b"MM" if big_endian else b"II"
    head = magic + (struct.pack(order + "HHH", 43, 8, 0) if bigtiff else struct.pack(order + "H", 42))
    head_size = len(head) + struct.calcsize(off)
    strips = [page.array.astype(page.array.dtype.newbyteorder(order)).tobytes() for page in pages]

    def entries(page: TiffPage, strip_at: int, strip: bytes) -> list[tuple[int, int, tuple[int, ...]]]:
        height, width = page.array.shape[:2]
        spp = 1 if page.array.ndim == 2 else page.array.shape[2]
        out = [] if page.subfile is None else [(254, 4, (page.subfile,))]
        out += [(256, 4, (width,)), (257, 4, (height,)), (258, 3, (page.array.dtype.itemsize * 8,) * spp),
                (259, 3, (1,)), (262, 3, (2 if spp == 3 else 1,)), (273, long_type, (strip_at,))]
        out += [] if page.orientation is None else [(274, 3, (page.orientation,))]
        return out + [(277, 3, (spp,)), (278, 4, (height,)), (279, long_type, (len(strip),)), (284, 3, (1,))]

    item = {3: "H", 4: "I", 16: "Q"}

    def extra_size(values: tuple[int, ...], kind: int) -> int:
        nbytes = len(values) * struct.calcsize(item[kind])
        return 0 if nbytes <= inline else nbytes + nbytes % 2

    # pass 1: IFD block sizes (they do not depend on the offsets written into them)
    blocks = [entries(page, 0, strip) for page, strip in zip(pages, strips, strict=True)]
    sizes = [struct.calcsize(count_fmt) + len(e) * entry_size + struct.calcsize(off)
             + sum(extra_size(v, k) for _, k, v in e) for e in blocks]
    ifd_at = [head_size + sum(sizes[:i]) for i in range(len(pages))]
    strip_at = [head_size + sum(sizes) + sum(len(s) for s in strips[:i]) for i in range(len(pages))]
    out = bytearray(head + struct.pack(order + off, ifd_at[0]))
    for i, (page, strip) in enumerate(zip(pages, strips, strict=True)):
        fields = entries(page, strip_at[i], strip)
        extra_at = ifd_at[i] + struct.calcsize(count_fmt) + len(fields) * entry_size + struct.calcsize(off)
        extra = b""
        out += struct.pack(order + count_fmt, len(fields))
        for tag, kind, values in fields:
            raw = struct.pack(order + item[kind] * len(values), *values)
            if len(raw) <= inline:
                field = raw.ljust(inline, b"\x00")
            else:
                field = struct.pack(order + off, extra_at + len(extra))
                extra += raw + bytes(len(raw) % 2)
            out += struct.pack(order + "HH" + off, tag, kind, len(values)) + field
        out += struct.pack(order + off, ifd_at[i + 1] if i + 1 < len(pages) else 0) + extra
    assert len(out) == strip_at[0]
    return bytes(out) + b"".join(strips)


def ifd_offsets(data: bytes) -> list[int]:
    """Byte offsets of the IFDs of a little-endian classic TIFF, following the chain."""
    offsets, at = [], struct.unpack_from("<I", data, 4)[0]
    while at:
        offsets.append(at)
        at = struct.unpack_from("<I", data, at + 2 + 12 * struct.unpack_from("<H", data, at)[0])[0]
    return offsets


def with_next(data: bytes, ifd: int, next_offset: int) -> bytes:
    """``data`` with the next-IFD offset of its IFD at byte ``ifd`` replaced."""
    out = bytearray(data)
    struct.pack_into("<I", out, ifd + 2 + 12 * struct.unpack_from("<H", data, ifd)[0], next_offset)
    return bytes(out)


def make_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="img-001", source="scans", kind="image", path=str(path), relpath=path.name,
                     label="doc", entity="e1", time="2024-01-01")


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def read_ok(path: Path, cfg: ImageTransformConfig = DEFAULT, limits: LimitsConfig = DEFAULT_LIMITS) -> list[Sample]:
    result = read_image(make_ref(path), cfg, limits=limits)
    assert not isinstance(result, Issue), result
    return result


def read_issue(path: Path, cfg: ImageTransformConfig = DEFAULT, limits: LimitsConfig = DEFAULT_LIMITS) -> Issue:
    result = read_image(make_ref(path), cfg, limits=limits)
    assert isinstance(result, Issue), f"expected an Issue, got {[s.key for s in result]}"
    assert result.message.startswith(f"{path.name}: ")
    return result


def as_rgb_u8(stored: np.ndarray) -> np.ndarray:
    """What the default config makes of a stored TIFF array: RGB (grey repeated) C×H×W uint8,
    16-bit scaled by 255/65535 and rounded."""
    values = stored.astype(np.float64)
    if stored.dtype == np.uint16:
        values = values * 255 / 65535
    rgb = np.stack([values] * 3) if stored.ndim == 2 else values.transpose(2, 0, 1)
    return np.rint(rgb).astype(np.uint8)


def by_hand(base: np.ndarray, orientation: int) -> np.ndarray:
    """EXIF 2.3 / TIFF 6.0 Orientation, written independently of the code under test."""
    return {1: base, 2: np.fliplr(base), 3: np.rot90(base, 2), 4: np.flipud(base),
            5: np.rot90(np.fliplr(base), 1), 6: np.rot90(base, -1), 7: np.rot90(np.fliplr(base), -1),
            8: np.rot90(base, 1)}[orientation]


def mixed_pages() -> list[TiffPage]:
    """Grey 8-bit 5×7, RGB 8-bit 6×4, grey 16-bit 3×9: every page a different size and kind."""
    return [TiffPage(RNG.integers(0, 256, (5, 7), dtype=np.uint8)),
            TiffPage(RNG.integers(0, 256, (6, 4, 3), dtype=np.uint8)),
            TiffPage(RNG.integers(0, 65536, (3, 9), dtype=np.uint16))]


def page_metadata(page: int, pages: int, height: int, width: int, channels: int, bits: int,
                  orientation: int = 1) -> dict[str, object]:
    return {"format": "tiff", "source_height": height, "source_width": width, "source_channels": channels,
            "bit_depth": bits, "orientation": orientation, "page": page, "pages": pages}


# --- one sample per page ---------------------------------------------------------------------

@pytest.mark.parametrize("bigtiff", [False, True])
@pytest.mark.parametrize("big_endian", [False, True])
def test_every_page_of_a_three_page_tiff_is_a_sample(tmp_path: Path, big_endian: bool, bigtiff: bool) -> None:
    pages = mixed_pages()
    data = tiff_pages(pages, big_endian=big_endian, bigtiff=bigtiff)
    assert data[:4] == {(False, False): b"II*\x00", (True, False): b"MM\x00*", (False, True): b"II+\x00",
                        (True, True): b"MM\x00+"}[big_endian, bigtiff]
    samples = read_ok(write(tmp_path, "three.tif", data))
    assert [s.key for s in samples] == ["img-001-p00000", "img-001-p00001", "img-001-p00002"]
    assert [s.metadata for s in samples] == [page_metadata(0, 3, 5, 7, 1, 8), page_metadata(1, 3, 6, 4, 3, 8),
                                             page_metadata(2, 3, 3, 9, 1, 16)]
    for sample, page in zip(samples, pages, strict=True):
        np.testing.assert_array_equal(sample.image, as_rgb_u8(page.array))
        assert sample.image.flags["C_CONTIGUOUS"] and sample.ref.path.endswith("three.tif")
    # the same arrays as OpenCV's own multi-page decode, transformed, and as each page on its own
    ok, mats = cv2.imdecodemulti(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert ok and len(mats) == 3
    for i, (sample, mat, page) in enumerate(zip(samples, mats, pages, strict=True)):
        [tile] = transform_image(mat, DEFAULT)
        np.testing.assert_array_equal(sample.image, tile.image)
        [alone] = read_ok(write(tmp_path, f"alone{i}.tif", tiff_pages([page], big_endian=big_endian,
                                                                       bigtiff=bigtiff)))
        np.testing.assert_array_equal(sample.image, alone.image)
        assert alone.key == "img-001" and {**alone.metadata, "page": i, "pages": 3} == sample.metadata


def test_opencv_written_multipage_tiff(tmp_path: Path) -> None:
    bgr, grey, deep = (RNG.integers(0, 256, (9, 11, 3), dtype=np.uint8), RNG.integers(0, 256, (4, 13), dtype=np.uint8),
                       RNG.integers(0, 65536, (7, 5), dtype=np.uint16))
    ok, encoded = cv2.imencodemulti(".tiff", [bgr, grey, deep])
    assert ok
    samples = read_ok(write(tmp_path, "cv.tiff", encoded.tobytes()), ImageTransformConfig(color="gray"))
    assert [s.key for s in samples] == ["img-001-p00000", "img-001-p00001", "img-001-p00002"]
    assert [(s.metadata["source_height"], s.metadata["source_width"], s.metadata["source_channels"],
             s.metadata["bit_depth"]) for s in samples] == [(9, 11, 3, 8), (4, 13, 1, 8), (7, 5, 1, 16)]
    np.testing.assert_array_equal(samples[0].image, cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)[None])
    np.testing.assert_array_equal(samples[1].image, grey[None])
    np.testing.assert_array_equal(samples[2].image, np.rint(deep * (255 / 65535)).astype(np.uint8)[None])


def test_probe_describes_the_first_page_only(tmp_path: Path) -> None:
    path = write(tmp_path, "three.tif", tiff_pages(mixed_pages()))
    assert probe_image(make_ref(path)) == ImageHeader(5, 7, 1, 8, "tiff", 1)


@pytest.mark.parametrize("orientations", [(6, None, 3), (8, 2, 5), (1, 7, 4)])
def test_each_page_is_oriented_once_by_its_own_orientation(tmp_path: Path,
                                                           orientations: tuple[int | None, ...]) -> None:
    arrays = [RNG.integers(0, 256, (4, 6, 3), dtype=np.uint8), RNG.integers(0, 256, (5, 3), dtype=np.uint8),
              RNG.integers(0, 65536, (2, 7), dtype=np.uint16)]
    pages = [TiffPage(a, orientation=o) for a, o in zip(arrays, orientations, strict=True)]
    samples = read_ok(write(tmp_path, "o.tif", tiff_pages(pages)))
    for sample, array, orientation in zip(samples, arrays, orientations, strict=True):
        expected = as_rgb_u8(array).transpose(1, 2, 0)  # H×W×C, to orient by hand
        np.testing.assert_array_equal(sample.image, by_hand(expected, orientation or 1).transpose(2, 0, 1))
        assert sample.metadata["orientation"] == (orientation or 1)
        assert (sample.metadata["source_height"], sample.metadata["source_width"]) == array.shape[:2]


# --- reduced-resolution IFDs -----------------------------------------------------------------

def test_reduced_resolution_ifds_are_not_pages(tmp_path: Path) -> None:
    big_a, big_b = RNG.integers(0, 256, (8, 10, 3), dtype=np.uint8), RNG.integers(0, 256, (6, 6), dtype=np.uint8)
    chain = [TiffPage(big_a, subfile=0), TiffPage(big_a[::2, ::2], subfile=1),
             TiffPage(big_b, subfile=2),  # bit 1 (one page of many) is still a page
             TiffPage(big_b[::3, ::3], subfile=1)]
    data = tiff_pages(chain)
    # measured: OpenCV decodes reduced-resolution IFDs too, one image per IFD of the chain
    ok, mats = cv2.imdecodemulti(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert ok and [m.shape[:2] for m in mats] == [(8, 10), (4, 5), (6, 6), (2, 2)]
    samples = read_ok(write(tmp_path, "pyramid.tif", data))
    assert [s.key for s in samples] == ["img-001-p00000", "img-001-p00002"]
    assert [s.metadata for s in samples] == [page_metadata(0, 2, 8, 10, 3, 8), page_metadata(2, 2, 6, 6, 1, 8)]
    np.testing.assert_array_equal(samples[0].image, as_rgb_u8(big_a))
    np.testing.assert_array_equal(samples[1].image, as_rgb_u8(big_b))


@pytest.mark.parametrize("thumbnail_first", [False, True])
def test_one_page_with_a_thumbnail_is_a_single_page_file(tmp_path: Path, thumbnail_first: bool) -> None:
    page = RNG.integers(0, 256, (8, 12, 3), dtype=np.uint8)
    chain = [TiffPage(page, subfile=0), TiffPage(page[::4, ::4], subfile=1)]
    [sample] = read_ok(write(tmp_path, "thumb.tif", tiff_pages(chain[::-1] if thumbnail_first else chain)))
    assert sample.key == "img-001"
    assert sample.metadata == {"format": "tiff", "source_height": 8, "source_width": 12, "source_channels": 3,
                               "bit_depth": 8, "orientation": 1}
    np.testing.assert_array_equal(sample.image, as_rgb_u8(page))


def test_a_file_of_reduced_resolution_ifds_only_keeps_them_all(tmp_path: Path) -> None:
    arrays = [RNG.integers(0, 256, (4, 4), dtype=np.uint8), RNG.integers(0, 256, (2, 2), dtype=np.uint8)]
    samples = read_ok(write(tmp_path, "odd.tif", tiff_pages([TiffPage(a, subfile=1) for a in arrays])))
    assert [s.key for s in samples] == ["img-001-p00000", "img-001-p00001"]


# --- tiles, transforms -----------------------------------------------------------------------

def test_tiles_of_every_page(tmp_path: Path) -> None:
    wide, tall = RNG.integers(0, 256, (8, 12), dtype=np.uint8), RNG.integers(0, 256, (12, 8), dtype=np.uint8)
    samples = read_ok(write(tmp_path, "tiles.tif", tiff_pages([TiffPage(wide), TiffPage(tall)])),
                      ImageTransformConfig(color="gray", tile_size=(4, 4)))
    expected = ([("p00000", r, c) for r in (0, 4) for c in (0, 4, 8)]
                + [("p00001", r, c) for r in (0, 4, 8) for c in (0, 4)])
    assert [s.key for s in samples] == [f"img-001-{p}-t{r:05d}_{c:05d}" for p, r, c in expected]
    for sample, (page, row, col) in zip(samples, expected, strict=True):
        assert sample.metadata["tile"] == [row, col]
        assert (sample.metadata["page"], sample.metadata["pages"]) == (int(page[1:]), 2)
        source = wide if page == "p00000" else tall
        np.testing.assert_array_equal(sample.image, source[None, row:row + 4, col:col + 4])


def test_a_page_without_a_full_tile_fails_the_file_naming_the_page(tmp_path: Path) -> None:
    path = write(tmp_path, "small.tif", tiff_pages([TiffPage(RNG.integers(0, 256, (8, 8), dtype=np.uint8)),
                                                     TiffPage(RNG.integers(0, 256, (3, 8), dtype=np.uint8))]))
    issue = read_issue(path, ImageTransformConfig(tile_size=(4, 4)))
    assert (issue.reason, issue.stage) == ("bad_shape", "transform") and "page 1: no full" in issue.message


def test_a_blank_page_is_packed_but_an_all_blank_file_is_constant(tmp_path: Path) -> None:
    blank, busy = np.full((4, 5), 9, np.uint8), RNG.integers(0, 256, (4, 5), dtype=np.uint8)
    samples = read_ok(write(tmp_path, "sep.tif", tiff_pages([TiffPage(busy), TiffPage(blank)])))
    np.testing.assert_array_equal(samples[1].image, np.full((3, 4, 5), 9, np.uint8))
    issue = read_issue(write(tmp_path, "blank.tif", tiff_pages([TiffPage(blank), TiffPage(blank + 1)])))
    assert (issue.reason, issue.stage) == ("constant_image", "validate")
    assert "page 0: every pixel is [9]" in issue.message and "page 1: every pixel is [10]" in issue.message


def test_a_float_page_needs_a_window(tmp_path: Path) -> None:
    values = np.array([[0.0, 0.5], [1.0, 2.0]], dtype=np.float32)
    ok, encoded = cv2.imencodemulti(".tiff", [RNG.integers(0, 256, (2, 2), dtype=np.uint8), values])
    assert ok
    issue = read_issue(write(tmp_path, "f.tiff", encoded.tobytes()))
    assert (issue.reason, issue.stage) == ("missing_window", "transform") and "page 1: float32" in issue.message


# --- defects of the chain --------------------------------------------------------------------

def test_an_ifd_chain_that_loops_is_decode_failed(tmp_path: Path) -> None:
    data = tiff_pages(mixed_pages())
    first, _, last = ifd_offsets(data)
    for name, target, again in (("back.tif", first, 0), ("self.tif", last, 2)):
        issue = read_issue(write(tmp_path, name, with_next(data, last, target)))
        assert (issue.reason, issue.stage) == ("decode_failed", "read")
        assert f"TIFF IFD 2 gives byte {target} as the next IFD, which is IFD {again} again" in issue.message
        assert "loops" in issue.message


def test_more_pages_than_max_frames_is_too_large(tmp_path: Path) -> None:
    path = write(tmp_path, "three.tif", tiff_pages(mixed_pages()))
    issue = read_issue(path, limits=LimitsConfig(max_frames=2))
    assert (issue.reason, issue.stage) == ("too_large", "read")
    assert "is 3, over limits.max_frames 2" in issue.message and "raise limits.max_frames" in issue.message
    assert len(read_ok(path, limits=LimitsConfig(max_frames=3))) == 3


def test_a_file_cut_inside_the_third_page_is_truncated(tmp_path: Path) -> None:
    data = tiff_pages(mixed_pages())
    assert len(ifd_offsets(data)) == 3  # every IFD lies before the strips: the cut leaves the chain whole
    issue = read_issue(write(tmp_path, "cut.tif", data[:-10]))
    assert (issue.reason, issue.stage) == ("truncated", "read")
    assert f"image data of IFD 2 runs to byte {len(data)} but the file has {len(data) - 10} bytes" in issue.message


def test_a_next_ifd_past_the_end_is_truncated(tmp_path: Path) -> None:
    data = tiff_pages(mixed_pages())
    issue = read_issue(write(tmp_path, "lost.tif", with_next(data, ifd_offsets(data)[1], len(data) + 100)))
    assert (issue.reason, issue.stage) == ("truncated", "read")
    assert f"IFD 2 at byte {len(data) + 100} lies past the end" in issue.message


def test_a_page_without_a_width_is_decode_failed_naming_its_ifd(tmp_path: Path) -> None:
    data = bytearray(tiff_pages(mixed_pages()))
    second = ifd_offsets(bytes(data))[1]
    for i in range(struct.unpack_from("<H", data, second)[0]):
        if struct.unpack_from("<H", data, second + 2 + 12 * i)[0] == 256:
            struct.pack_into("<H", data, second + 2 + 12 * i, 65000)  # an unknown private tag instead
    issue = read_issue(write(tmp_path, "nowidth.tif", bytes(data)))
    assert (issue.reason, issue.stage) == ("decode_failed", "read")
    assert f"IFD 1 at byte {second} lacks ImageWidth (256)" in issue.message


def test_decoded_bytes_of_all_pages_count_together(tmp_path: Path) -> None:
    # each 10×10 RGB page: 300 bytes decoded, 2·100·3·4 = 2400 of float32 working copies, a 300-byte
    # strip buffer: 3000 alone; three pages: 900 + 2400 (largest) + 300 (largest) = 3600
    pages = [TiffPage(RNG.integers(0, 256, (10, 10, 3), dtype=np.uint8)) for _ in range(3)]
    limits = LimitsConfig(max_decoded_bytes=3500)
    assert len(read_ok(write(tmp_path, "one.tif", tiff_pages(pages[:1])), limits=limits)) == 1
    issue = read_issue(write(tmp_path, "three.tif", tiff_pages(pages)), limits=limits)
    assert (issue.reason, issue.stage) == ("too_large", "read")
    assert "about 3600 bytes" in issue.message and "limits.max_decoded_bytes 3500" in issue.message
    assert len(read_ok(tmp_path / "three.tif", limits=LimitsConfig(max_decoded_bytes=3600))) == 3


def test_pixels_per_page_are_checked_for_every_page(tmp_path: Path) -> None:
    data = tiff_pages([TiffPage(RNG.integers(0, 256, (10, 10), dtype=np.uint8)),
                       TiffPage(RNG.integers(0, 256, (20, 10), dtype=np.uint8))])
    issue = read_issue(write(tmp_path, "tall.tif", data), limits=LimitsConfig(max_pixels=150))
    assert (issue.reason, issue.stage) == ("too_large", "read")
    assert (f"IFD 1 at byte {ifd_offsets(data)[1]}: TIFF ImageWidth (256) 10 × ImageLength (257) 20 = 200 pixels"
            in issue.message)


def test_opencv_images_that_do_not_match_the_ifds_are_decode_failed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "three.tif", tiff_pages(mixed_pages()))
    real = cv2.imdecodemulti
    for name, change in (("one missing", lambda mats: mats[:2]), ("out of order", lambda mats: mats[::-1])):
        monkeypatch.setattr(image_mod.cv2, "imdecodemulti",
                            lambda buf, flags, change=change: (True, change(real(buf, flags)[1])))
        issue = read_issue(path)
        assert (issue.reason, issue.stage) == ("decode_failed", "read"), name
        assert "cannot be matched to pages" in issue.message


# --- single-page files are read exactly as before --------------------------------------------

@pytest.mark.parametrize("bigtiff", [False, True])
def test_a_single_page_tiff_keeps_its_key_and_metadata(tmp_path: Path, bigtiff: bool) -> None:
    rgb = RNG.integers(0, 256, (6, 9, 3), dtype=np.uint8)
    [sample] = read_ok(write(tmp_path, "one.tif", tiff_pages([TiffPage(rgb, orientation=6)], bigtiff=bigtiff)))
    assert sample.key == "img-001"
    assert sample.metadata == {"format": "tiff", "source_height": 6, "source_width": 9, "source_channels": 3,
                               "bit_depth": 8, "orientation": 6}
    np.testing.assert_array_equal(sample.image, by_hand(as_rgb_u8(rgb).transpose(1, 2, 0), 6).transpose(2, 0, 1))
    tiles = read_ok(tmp_path / "one.tif", ImageTransformConfig(tile_size=(3, 3)))
    assert [s.key for s in tiles] == [f"img-001-t{r:05d}_{c:05d}" for r in (0, 3, 6) for c in (0, 3)]
    assert all("page" not in s.metadata and "pages" not in s.metadata for s in tiles)


def test_overlapping_ifds_are_decode_failed_before_the_walk_goes_quadratic(tmp_path: Path) -> None:
    """IFD k starts 10 bytes into entry k of one shared run of 12-byte entries, so every IFD
    re-reads the next ``n`` entries: the chain parses K·(12n + 6) bytes of a far smaller file."""
    base, n, k = 1000, 50, 20
    starts = [base + 12 * i + 10 for i in range(k)]
    entries = bytearray()
    for i in range(k + n + 1):
        j = i - n - 1  # entry i begins with the next-IFD offset of IFD j (tag and type: never a wanted tag)
        next_ifd = starts[j + 1] if 0 <= j < k - 1 else 0
        entries += struct.pack("<IIHH", next_ifd, 1, 0, n)  # bytes 10-11 (the next IFD's count) = n
    data = b"II*\x00" + struct.pack("<I", starts[0]) + bytes(base - 8) + bytes(entries)
    issue = read_issue(write(tmp_path, "overlap.tif", data))
    assert (issue.reason, issue.stage) == ("decode_failed", "read")
    assert "they overlap" in issue.message and f"more than the file's {len(data)}" in issue.message


@pytest.mark.parametrize("pages", [1, 2], ids=["one-page", "two-pages"])
@pytest.mark.parametrize("alpha", ["drop", "composite"])
def test_an_rgba_tiff_with_straight_alpha_packs_its_stored_colours(tmp_path: Path, pages: int, alpha: str) -> None:
    """An 8-bit RGBA TIFF whose alpha is unassociated (ExtraSamples 2, what Pillow and tifffile
    write): OpenCV decodes it through libtiff's RGBA interface, which multiplied the colours by
    alpha, so ``alpha: drop`` packed them darkened and ``composite`` counted alpha twice. The
    same pixels as a PNG are the reference."""
    import tifffile

    y, x = np.mgrid[0:24, 0:32]
    rgba = np.dstack([(100 + 3 * y).astype(np.uint8), np.full((24, 32), 100, np.uint8),
                      np.full((24, 32), 50, np.uint8), (x * 255 // 31).astype(np.uint8)])
    tiff = tmp_path / "rgba.tif"
    tifffile.imwrite(tiff, np.stack([rgba] * pages) if pages > 1 else rgba, photometric="rgb",
                     extrasamples=["unassalpha"])
    png = tmp_path / "rgba.png"
    cv2.imwrite(str(png), cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
    cfg = ImageTransformConfig(alpha=alpha)
    (reference,) = read_ok(png, cfg)
    packed = read_ok(tiff, cfg)
    assert len(packed) == pages
    for sample in packed:
        assert np.array_equal(sample.image, reference.image)
    if alpha == "drop":
        assert np.array_equal(packed[0].image, np.moveaxis(rgba[..., :3], -1, 0))


@pytest.mark.parametrize("pages", [1, 2], ids=["one-page", "two-pages"])
@pytest.mark.parametrize("alpha", ["drop", "composite"])
def test_an_rgba_tiff_with_premultiplied_alpha_packs_its_straight_colours(tmp_path: Path, pages: int,
                                                                           alpha: str) -> None:
    """ExtraSamples 1 (associated alpha) stores colour × alpha: composited over white it is
    stored + white·(1 − a), and dropping alpha gives the straight colours. packer took the
    stored colours for straight ones, so composite applied alpha twice (63 levels dark)."""
    import tifffile

    y, x = np.mgrid[0:24, 0:32]
    colour = np.dstack([(100 + 3 * y), np.full((24, 32), 200), np.full((24, 32), 50)]).astype(np.float64)
    a = (x * 255 // 31).astype(np.float64)[:, :, None]
    stored = np.dstack([np.rint(colour * a / 255), a]).astype(np.uint8)
    tiff = tmp_path / "premultiplied.tif"
    tifffile.imwrite(tiff, np.stack([stored] * pages) if pages > 1 else stored, photometric="rgb",
                     extrasamples=["assocalpha"])
    packed = read_ok(tiff, ImageTransformConfig(alpha=alpha))
    assert len(packed) == pages
    weight = a / 255
    expected = (stored[:, :, :3] + 255 * (1 - weight)) if alpha == "composite" else np.where(a > 0, colour, 0)
    # dropped, the straight colours are as exact as alpha lets them be: check where it is >= 1/2
    checked = np.ones((24, 32), bool) if alpha == "composite" else a[:, :, 0] >= 128
    for sample in packed:
        difference = np.abs(sample.image.astype(np.float64) - np.moveaxis(expected, -1, 0))
        assert difference[:, checked].max() <= 1, difference.max()


@pytest.mark.parametrize("bits", [8, 16])
def test_a_grey_alpha_tiff_composites_as_its_png_twin_or_is_refused_at_16_bits(tmp_path: Path, bits: int) -> None:
    """A grey+alpha TIFF came back from OpenCV as its grey alone (a 16-bit one at 8 bits), so
    alpha: composite packed it as if opaque: an 8-bit one is read with Pillow and composites by
    its alpha; a 16-bit one is unsupported, naming the fix."""
    import tifffile

    rng = np.random.default_rng(3)
    dtype = np.uint8 if bits == 8 else np.uint16
    la = rng.integers(0, np.iinfo(dtype).max, (12, 16, 2), endpoint=True).astype(dtype)
    tiff = tmp_path / "la.tif"
    tifffile.imwrite(tiff, la, photometric="minisblack", extrasamples=["unassalpha"])
    cfg = ImageTransformConfig(alpha="composite", color="gray")
    if bits == 16:
        issue = read_issue(tiff, cfg)
        assert issue.reason == "unsupported" and "16-bit grey+alpha TIFF" in issue.message
        assert "grey+alpha PNG" in issue.message
        return
    weight = la[:, :, 1:].astype(np.float64) / 255
    expected = np.rint(la[:, :, :1] * weight + 255 * (1 - weight))
    (sample,) = read_ok(tiff, cfg)
    assert np.abs(sample.image.astype(np.float64) - np.moveaxis(expected, -1, 0)).max() <= 1
    (dropped,) = read_ok(tiff, ImageTransformConfig(alpha="drop", color="gray"))
    assert np.array_equal(dropped.image[0], la[:, :, 0])


@pytest.mark.parametrize("bits", [8, 16])
def test_a_planar_rgb_tiff_packs_as_its_interleaved_twin_or_is_refused_at_16_bits(tmp_path: Path, bits: int) -> None:
    """A TIFF with its colour samples stored as separate planes (PlanarConfiguration 2, as
    microscopy and GIS tools write them): OpenCV reads an 8-bit one right, but decodes a 16-bit
    one as if its first plane held every sample, interleaved, which packed wrong pixels with no
    bad-sample row. The 8-bit one packs as stored; the 16-bit one is unsupported, naming the fix."""
    import tifffile

    rng = np.random.default_rng(5)
    dtype = np.uint8 if bits == 8 else np.uint16
    planes = rng.integers(0, np.iinfo(dtype).max, (3, 12, 16), endpoint=True).astype(dtype)  # R, G, B
    tiff = tmp_path / "planar.tif"
    tifffile.imwrite(tiff, planes, photometric="rgb", planarconfig="separate")
    if bits == 16:
        issue = read_issue(tiff)
        assert issue.reason == "unsupported" and "16-bit TIFF whose 3 samples per pixel" in issue.message
        assert "separate planes (PlanarConfiguration 2)" in issue.message and "PlanarConfiguration 1" in issue.message
        return
    (sample,) = read_ok(tiff)
    assert np.array_equal(sample.image, as_rgb_u8(np.moveaxis(planes, 0, -1)))


ORIENTED = {1: lambda z: z, 2: np.fliplr, 3: lambda z: np.rot90(z, 2), 4: np.flipud, 5: lambda z: np.swapaxes(z, 0, 1),
            6: lambda z: np.rot90(z, -1), 7: lambda z: np.rot90(np.swapaxes(z, 0, 1), 2), 8: lambda z: np.rot90(z, 1)}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_grey_alpha_tiff_page_is_oriented_once_whoever_decodes_it(tmp_path: Path, orientation: int) -> None:
    """An 8-bit grey+alpha TIFF page is read with Pillow, which (version 13) applies the page's
    Orientation as it loads it; packer took Pillow for a decoder that does not, and oriented the
    page again: 6 came out turned 180°, 2, 4, 5 and 7 not at all. One page alone, and the second
    page of a file whose first is RGB, are each oriented once, as the grey page is."""
    import tifffile

    rng = np.random.default_rng(11)
    la = rng.integers(0, 256, (10, 14, 2), dtype=np.uint8)
    tag = [(274, 3, 1, orientation, True)]
    one = tmp_path / "la.tif"
    tifffile.imwrite(one, la, photometric="minisblack", extrasamples=["unassalpha"], extratags=tag)
    cfg = ImageTransformConfig(alpha="drop", color="gray")
    (sample,) = read_ok(one, cfg)
    np.testing.assert_array_equal(sample.image[0], ORIENTED[orientation](la[:, :, 0]))
    two = tmp_path / "pages.tif"
    with tifffile.TiffWriter(two) as tif:
        tif.write(np.dstack([la[:, :, 0]] * 3), photometric="rgb", extratags=tag)
        tif.write(la, photometric="minisblack", extrasamples=["unassalpha"], extratags=tag)
    first, second = read_ok(two, cfg)
    np.testing.assert_array_equal(first.image[0], ORIENTED[orientation](la[:, :, 0]))
    np.testing.assert_array_equal(second.image[0], ORIENTED[orientation](la[:, :, 0]))


@pytest.mark.parametrize("colour", ["rgb", "minisblack"])
def test_an_extra_sample_that_is_not_alpha_is_no_alpha_channel(tmp_path: Path, colour: str) -> None:
    """ExtraSamples 0 ("unspecified": a NIR band, a mask, padding) is not alpha (README: alpha is
    what the file says it is). An RGB page with one was composited by that band (off by up to 237
    levels from its stored colours); a grey one went down the grey+alpha path and was refused as
    decode_failed ("not grey and alpha"). Both pack their stored samples, under either alpha policy."""
    import tifffile

    rng = np.random.default_rng(4)
    samples = 4 if colour == "rgb" else 2
    stored = rng.integers(0, 256, (10, 14, samples), dtype=np.uint8)
    tiff = tmp_path / "extra.tif"
    tifffile.imwrite(tiff, stored, photometric=colour, extrasamples=["unspecified"])
    for alpha in ("composite", "drop"):
        (sample,) = read_ok(tiff, ImageTransformConfig(alpha=alpha, color="rgb" if colour == "rgb" else "gray"))
        np.testing.assert_array_equal(sample.image, np.moveaxis(stored[:, :, :samples - 1], -1, 0))


def test_a_later_page_over_the_limits_is_refused_before_any_strip_is_inflated(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """README: sizes are checked from headers before any pixel memory is allocated. A multi-page
    TIFF's strips were all inflated (check_strip_data decodes each up to its page's size) before
    the per-page size check: a small first page and a Deflate bomb behind it (12000² zeros in
    140 KB) grew the worker by the bomb's size before it was refused as too_large."""
    import tifffile

    tiff = tmp_path / "bomb.tif"
    with tifffile.TiffWriter(tiff) as tif:
        tif.write(np.arange(64, dtype=np.uint8).reshape(8, 8), compression="zlib")
        tif.write(np.zeros((200, 200), np.uint8), compression="zlib")
    inflated: list[int] = []
    real = image_mod.check_strip_data

    def counting(data: bytes, chain: list, compressions: frozenset[int]) -> None:
        inflated.append(len(chain))
        real(data, chain, compressions)

    monkeypatch.setattr(image_mod, "check_strip_data", counting)
    issue = read_issue(tiff, limits=LimitsConfig(max_pixels=10_000))
    assert issue.reason == "too_large" and "IFD 1 at byte" in issue.message, issue.message
    assert inflated == []
    assert len(read_ok(tiff)) == 2 and inflated == [2]  # within the limits, every strip is checked as before


def test_a_16_bit_white_is_zero_tiff_is_inverted_as_the_8_bit_one_is(tmp_path: Path) -> None:
    """PhotometricInterpretation 0 (WhiteIsZero, TIFF's MONOCHROME1): libtiff inverts what it
    reads at 8 bits, so only 16-bit pages packed black for white."""
    import tifffile

    ramp = np.linspace(0, 65535, 12 * 16).reshape(12, 16).astype(np.uint16)
    tiff = tmp_path / "miniswhite16.tif"
    tifffile.imwrite(tiff, ramp, photometric="miniswhite")
    (sample,) = read_ok(tiff, ImageTransformConfig(color="gray"))
    expected = np.rint((65535 - ramp.astype(np.float64)) / 65535 * 255)
    assert np.abs(sample.image[0].astype(np.float64) - expected).max() <= 1
    tifffile.imwrite(tmp_path / "miniswhite8.tif", (ramp >> 8).astype(np.uint8), photometric="miniswhite")
    (eight,) = read_ok(tmp_path / "miniswhite8.tif", ImageTransformConfig(color="gray"))
    assert np.array_equal(eight.image[0], 255 - (ramp >> 8).astype(np.uint8))


@pytest.mark.parametrize("bits", [10, 12, 14])
def test_a_10_to_14_bit_white_is_zero_tiff_is_inverted_in_the_scale_opencv_reads_it_in(
        tmp_path: Path, bits: int) -> None:
    """OpenCV reads 10-, 12- and 14-bit samples scaled to 16 bits (v << (16 - bits)); the inversion
    took (1 << bits) - 1 - v in uint16, which wrapped: stored 4095 (black) packed as 16, 0 as 16."""
    import tifffile

    top = (1 << bits) - 1
    stored = (np.arange(12 * 16).reshape(12, 16) * 131 % (top + 1)).astype(np.uint16)
    stored[0, :2] = (top, 0)
    for photometric, seen in (("miniswhite", top - stored.astype(np.float64)), ("minisblack", stored.astype(float))):
        tifffile.imwrite(tmp_path / f"{photometric}.tif", stored, photometric=photometric, bitspersample=bits)
        (sample,) = read_ok(tmp_path / f"{photometric}.tif", ImageTransformConfig(color="gray"))
        assert np.abs(sample.image[0].astype(np.float64) - np.rint(seen / top * 255)).max() <= 1, photometric


@pytest.mark.parametrize("pages", [1, 2])
@pytest.mark.parametrize("bits", [10, 12, 14])
def test_a_10_to_14_bit_tiffs_window_is_in_its_stored_units(tmp_path: Path, bits: int, pages: int) -> None:
    """A {center, width} window is in stored units; OpenCV reads 10-, 12- and 14-bit samples
    scaled to 16 bits, and the window was applied to those: a 12-bit image under center 2048,
    width 4096 packed 95% white. It is applied to the stored values (LINEAR_EXACT), grey and
    RGB, one page or several, and the samples' bit_depth is the stored bits."""
    import tifffile

    top = (1 << bits) - 1
    rng = np.random.default_rng(bits)
    grey = rng.integers(0, top + 1, (pages, 12, 16)).astype(np.uint16)
    rgb = rng.integers(0, top + 1, (pages, 12, 16, 3)).astype(np.uint16)
    center, width = (top + 1) / 2, top + 1.0
    for name, stored, color in (("grey", grey, "gray"), ("rgb", rgb, "rgb")):
        path = tmp_path / f"{name}.tif"
        tifffile.imwrite(path, stored if pages > 1 else stored[0], bitspersample=bits,
                         photometric="rgb" if name == "rgb" else "minisblack")
        samples = read_ok(path, ImageTransformConfig(color=color, window=(("center", center), ("width", width))))
        assert len(samples) == pages
        for sample, page in zip(samples, stored, strict=True):
            want = np.rint(np.clip((page - center) / width + 0.5, 0, 1) * 255).astype(np.uint8)
            chw = want[None] if name == "grey" else want.transpose(2, 0, 1)
            np.testing.assert_array_equal(sample.image, chw, err_msg=name)
            assert sample.metadata["bit_depth"] == bits


@pytest.mark.parametrize("photometric", ["minisblack", "miniswhite"])
@pytest.mark.parametrize("bits", [2, 4])
def test_a_2_or_4_bit_grey_tiff_is_unsupported_naming_its_layout_not_damaged(tmp_path: Path, bits: int,
                                                                             photometric: str) -> None:
    """A valid 2- or 4-bit greyscale TIFF (baseline TIFF allows 4) is a depth OpenCV does not read:
    it returned nothing, and the file was decode_failed, "re-export it", as if damaged. It is
    unsupported, naming the page, its depth and layout, and the fix (8 or 16 bits); a later page
    of that depth is named too."""
    import tifffile

    stored = np.random.default_rng(bits).integers(0, 1 << bits, (2, 16, 24)).astype(np.uint8)
    tifffile.imwrite(tmp_path / "one.tif", stored[0], bitspersample=bits, photometric=photometric)
    with tifffile.TiffWriter(tmp_path / "two.tif") as tif:
        tif.write(stored[0] << (8 - bits), photometric=photometric)
        tif.write(stored[1], bitspersample=bits, photometric=photometric)
    for name, ifd in (("one.tif", 0), ("two.tif", 1)):
        issue = read_image(make_ref(tmp_path / name), ImageTransformConfig(color="gray"))
        assert isinstance(issue, Issue) and issue.reason == "unsupported", issue
        assert f"TIFF IFD {ifd} at byte" in issue.message and f"a {bits}-bit greyscale" in issue.message
        assert "save it at 8 or 16 bits" in issue.message and "re-export" not in issue.message


@pytest.mark.parametrize("shape", [(48, 48), (48, 48, 3), (2, 40, 40)], ids=["grey", "rgb", "two-pages"])
def test_a_tiff_of_uncompressed_tiles_decodes(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Uncompressed tiles: OpenCV 5.0's in-memory TIFF reader refuses them ("Invalid tile byte
    count"), and a valid file was a decode_failed bad sample telling the user to re-export it.
    The pixels must equal tifffile's."""
    import tifffile

    stored = RNG.integers(0, 256, size=shape, dtype=np.uint8)
    path = tmp_path / "tiled.tif"
    tifffile.imwrite(path, stored, tile=(16, 16), photometric="rgb" if shape[-1] == 3 else "minisblack")
    packed = read_ok(path)
    expected = [stored] if len(shape) == 2 or shape[-1] == 3 else list(stored)
    assert len(packed) == len(expected)
    for sample, page in zip(packed, expected, strict=True):
        assert np.array_equal(sample.image, as_rgb_u8(page))


STRIP_LAYOUTS = {  # tifffile.imwrite arguments: the ways a compressed TIFF splits its rows
    "one-strip-rgb": {"shape": (40, 48, 3), "photometric": "rgb"},
    "strips-of-7-rows": {"shape": (40, 48), "photometric": "minisblack", "rowsperstrip": 7},
    "predictor-16-bit": {"shape": (40, 48), "photometric": "minisblack", "predictor": True, "dtype": np.uint16},
    "separate-planes": {"shape": (3, 40, 48), "photometric": "rgb", "planarconfig": "separate", "rowsperstrip": 16},
    "tiles": {"shape": (48, 48, 3), "photometric": "rgb", "tile": (16, 16)},
    "two-pages": {"shape": (2, 40, 48), "photometric": "minisblack", "rowsperstrip": 16},
    # LZW's code table grows past 511, 1023 and 2047 entries and is cleared at 4096
    "big-random": {"shape": (300, 400, 3), "photometric": "rgb"},
}
#: Compressions whose short strips libtiff pads with zero rows (checked by packer)
PADDED = ["zlib", "lzw", "packbits"]


def _strip_tiff(path: Path, layout: str, compression: str | None, *, zero_row: bool = False) -> None:
    """A TIFF of ``layout`` whose pixels are 1 or more (``zero_row``: but for an all-zero row 5,
    which makes packer check an LZW or PackBits file's strips)."""
    import tifffile

    spec = dict(STRIP_LAYOUTS[layout])
    shape, dtype = spec.pop("shape"), spec.pop("dtype", np.uint8)
    rng = np.random.default_rng(37)
    stored = rng.integers(1, 200 if dtype == np.uint8 else 60000, size=shape).astype(dtype)
    if zero_row:
        rows_axis = 1 if len(shape) == 3 and shape[-1] != 3 else 0
        stored[(slice(None),) * rows_axis + (5,)] = 0
    if compression in (None, "packbits"):
        spec.pop("predictor", None)
    tifffile.imwrite(path, stored, compression=compression, **spec)


@pytest.mark.parametrize("layout", sorted(STRIP_LAYOUTS))
@pytest.mark.parametrize("compression", PADDED)
def test_valid_compressed_tiffs_decode_as_their_uncompressed_twins(tmp_path: Path, layout: str,
                                                                   compression: str) -> None:
    """The strip completeness check passes every layout a writer makes (strips, a last short
    strip, a predictor, separate planes, tiles, pages, LZW tables that grow and clear): each
    packs what the same pixels stored uncompressed pack. An all-zero row makes packer run the
    check on LZW and PackBits files too."""
    _strip_tiff(tmp_path / "packed.tif", layout, compression, zero_row=True)
    _strip_tiff(tmp_path / "plain.tif", layout, None, zero_row=True)
    packed, reference = read_ok(tmp_path / "packed.tif"), read_ok(tmp_path / "plain.tif")
    assert len(packed) == len(reference) == (2 if layout == "two-pages" else 1)
    for sample, twin in zip(packed, reference, strict=True):
        assert np.array_equal(sample.image, twin.image)


@pytest.mark.parametrize("layout", sorted(STRIP_LAYOUTS))
@pytest.mark.parametrize("damage", ["zlib-short-count", "zlib-flipped-bytes", "lzw-short-count",
                                    "packbits-short-count"])
def test_a_strip_that_does_not_decode_whole_is_decode_failed(tmp_path: Path, layout: str, damage: str) -> None:
    """A StripByteCounts (or TileByteCounts) shorter than its stream, or a damaged Deflate
    stream, in a file whose own length is right: libtiff filled the missing rows with zeros and
    the image packed with black rows as if they were data (Pillow and tifffile refuse such
    files). Now the file is decode_failed, naming the codec and the strip or tile."""
    import tifffile

    compression = damage.split("-")[0]
    path = tmp_path / "damaged.tif"
    _strip_tiff(path, layout, compression)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[-1]  # the last page's last strip or tile
        counts = page.tags["TileByteCounts" if page.is_tiled else "StripByteCounts"]
        offset, count = page.dataoffsets[-1], page.databytecounts[-1]
        width = 2 if counts.dtype == 3 else 4
        at = counts.valueoffset + (len(page.databytecounts) - 1) * width
    data = bytearray(path.read_bytes())
    if damage.endswith("short-count"):
        struct.pack_into("<H" if width == 2 else "<I", data, at, count // 2)
    else:
        data[offset + 2:offset + 12] = bytes(10)  # past the zlib header: a stream that breaks
    path.write_bytes(bytes(data))
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("decode_failed", "read"), issue.message
    chunk = "tile" if layout == "tiles" else "strip"
    codec = {"zlib": "Deflate", "lzw": "LZW", "packbits": "PackBits"}[compression]
    if compression != "zlib" and layout == "predictor-16-bit":  # OpenCV refuses these itself
        assert "OpenCV could not decode" in issue.message
    else:
        assert f"TIFF {codec} {chunk} " in issue.message and "re-export the file" in issue.message


@pytest.mark.parametrize("data", [b"a", b"ab" * 7000, bytes(100_000), np.arange(50_000, dtype=np.uint8).tobytes(),
                                  np.random.default_rng(5).integers(0, 256, 60_000, dtype=np.uint8).tobytes(),
                                  np.random.default_rng(6).integers(0, 4, 200_000, dtype=np.uint8).tobytes()],
                         ids=["one-byte", "repeats", "zeros", "ramp", "random", "four-values"])
def test_lzw_lengths_equal_an_lzw_decoder_s(data: bytes) -> None:
    """packer's LZW length decoder (numpy, lengths only) against imagecodecs' LZW codec, whole
    and cut short: the byte counts agree (random data fills the table, which is cleared, and
    widens the codes to 12 bits)."""
    import imagecodecs

    from packer.transform.tiff_strips import _lzw_decoded

    raw = imagecodecs.lzw_encode(data)
    assert _lzw_decoded(raw, len(data)) == (len(data), "")
    for cut in (len(raw) // 3, len(raw) // 2):
        if cut < 2:
            continue
        got, problem = _lzw_decoded(raw[:cut], len(data))
        assert problem == "" and got < len(data)
        try:  # a stream cut without its End of Information code
            expected = len(imagecodecs.lzw_decode(raw[:cut]))
        except imagecodecs.ImcdError:
            continue
        assert abs(got - expected) <= 4096  # at most the last code's string, cut in two, is not read


def test_a_planar_grey_alpha_tiff_pillow_cannot_read_says_the_planes_are_the_cause(tmp_path: Path) -> None:
    """An 8-bit grey+alpha TIFF goes to Pillow, which does not read one stored as separate planes:
    the record said only that Pillow failed; it now says the layout is why and how to export it."""
    import tifffile

    planes = np.random.default_rng(7).integers(0, 256, (2, 12, 16), dtype=np.uint8)  # grey, alpha
    tiff = tmp_path / "planar_la.tif"
    tifffile.imwrite(tiff, planes, photometric="minisblack", planarconfig="separate", extrasamples=["unassalpha"])
    issue = read_issue(tiff, ImageTransformConfig(alpha="composite", color="gray"))
    assert issue.reason == "decode_failed" and "separate planes (PlanarConfiguration 2)" in issue.message
    assert "interleaved samples (PlanarConfiguration 1)" in issue.message
