"""packer.read.image on TIFFs by compression: what OpenCV's libtiff decodes, what it does not,
and JPEG-in-TIFF tiles and strips checked strictly.

OpenCV's libtiff is built without JPEG 2000, ZSTD, WebP, LZMA, JPEG XL, ... : a page compressed
with one of them came back zero-filled (packed as a black page, no record) or not at all (a
``decode_failed`` "re-export it", or a ``constant_image`` "blank image"). Such a page is now
``unsupported``, naming the page, the compression and the fix, before anything is decoded.

libjpeg inside libtiff stops at a damaged JPEG tile and OpenCV hands back the page with the
tile's rest grey; each JPEG tile or strip is now decoded strictly by libjpeg-turbo (with the
page's JPEGTables spliced in), and a damaged one is ``decode_failed`` naming the page and tile.

Files are real, written by tifffile (imagecodecs' codecs) or Pillow; expected pixels come from
tifffile's own decode of the same file.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from packer.config import ImageTransformConfig
from packer.read.image import read_image
from packer.read.tiff_codecs import OPENCV_TIFF_COMPRESSIONS
from packer.records import Issue, Sample, SampleRef

RGB = ImageTransformConfig(color="rgb")
_Y, _X = np.mgrid[0:512, 0:512]
#: a smooth RGB ramp (no blank tile, JPEG-friendly)
PICTURE = np.stack([(_X * 3 + _Y * 2 + 40 * i) % 200 + 30 for i in range(3)], -1).astype(np.uint8)

#: compressions tifffile writes that OpenCV's libtiff does not decode: (tifffile name, number, name in the message)
UNDECODED = [("jpeg2000", 34712, "JPEG 2000"), ("zstd", 50000, "ZSTD"), ("webp", 50001, "WebP"),
             ("lzma", 34925, "LZMA"), ("jpegxl", 50002, "JPEG XL"), ("png", 34933, "PNG"),
             ("jpegxr", 34934, "JPEG XR"), (33003, 33003, "Aperio YCbCr JPEG 2000"),
             (33005, 33005, "Aperio RGB JPEG 2000")]


def make_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="slide", source="scans", kind="image", path=str(path), relpath=path.name,
                     label="a", entity="e1", time="2024-01-01")


def read_ok(path: Path) -> list[Sample]:
    result = read_image(make_ref(path), RGB)
    assert not isinstance(result, Issue), result
    return result


def read_issue(path: Path) -> Issue:
    result = read_image(make_ref(path), RGB)
    assert isinstance(result, Issue), f"expected an Issue, got {[s.key for s in result]}"
    assert result.message.startswith(f"{path.name}: ")
    return result


def chw(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(array, -1, 0))


@pytest.mark.parametrize(("compression", "number", "name"), UNDECODED, ids=[str(u[1]) for u in UNDECODED])
def test_a_page_in_a_compression_opencv_does_not_decode_is_unsupported(tmp_path: Path, compression: str | int,
                                                                        number: int, name: str) -> None:
    """A valid one-page TIFF (tifffile reads it back) in a compression OpenCV's libtiff lacks:
    ``unsupported`` at the read stage, naming the compression by name and number and the fix
    (re-save with Deflate, LZW or JPEG), never a blank or damaged image."""
    path = tmp_path / "slide.tif"
    tifffile.imwrite(path, PICTURE, tile=(256, 256), photometric="rgb", compression=compression)
    assert tifffile.imread(path).shape == PICTURE.shape
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("unsupported", "read"), issue.message
    assert f"{name} (Compression {number})" in issue.message, issue.message
    assert "Deflate, LZW or JPEG" in issue.message and "tifffile" in issue.message


def test_a_later_page_in_jpeg_2000_is_unsupported_not_packed_black(tmp_path: Path) -> None:
    """The second page of a two-page TIFF is JPEG 2000 (as Aperio/Leica pyramids and bfconvert
    write): libtiff said "tile decoding is not implemented" and OpenCV gave a zero-filled page,
    packed black with no record. Now the whole file is ``unsupported``, naming page 1."""
    path = tmp_path / "slide.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(PICTURE, tile=(256, 256), photometric="rgb")
        tif.write(PICTURE, tile=(256, 256), photometric="rgb", compression="jpeg2000")
    issue = read_issue(path)
    assert issue.reason == "unsupported", issue.message
    assert "TIFF page 1 " in issue.message and "JPEG 2000 (Compression 34712)" in issue.message


def test_a_reduced_resolution_image_opencv_must_decode_with_the_pages_is_named(tmp_path: Path) -> None:
    """A ZSTD thumbnail between two Deflate pages: OpenCV decodes every IFD of the chain and gave
    up on the whole file ("imdecodemulti returned nothing"); the record names the thumbnail's IFD
    and its compression."""
    path = tmp_path / "slide.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(PICTURE, photometric="rgb", compression="zlib")
        tif.write(PICTURE[::4, ::4], photometric="rgb", compression="zstd", subfiletype=1)
        tif.write(PICTURE, photometric="rgb", compression="zlib")
    issue = read_issue(path)
    assert issue.reason == "unsupported", issue.message
    assert "TIFF IFD 1 " in issue.message and "reduced-resolution" in issue.message and "ZSTD" in issue.message


def test_a_thumbnail_opencv_never_decodes_does_not_refuse_a_one_page_file(tmp_path: Path) -> None:
    """One page (Deflate) and a JPEG 2000 thumbnail: OpenCV decodes the first IFD only, so the
    thumbnail's compression does not matter and the page packs."""
    path = tmp_path / "slide.tif"
    with tifffile.TiffWriter(path) as tif:
        tif.write(PICTURE, photometric="rgb", compression="zlib")
        tif.write(PICTURE[::4, ::4], photometric="rgb", compression="jpeg2000", subfiletype=1)
    (sample,) = read_ok(path)
    assert np.array_equal(sample.image, chw(PICTURE))


@pytest.mark.parametrize("compression", ["none", "lzw", "zlib", "adobe_deflate", "packbits"])
@pytest.mark.parametrize("tiled", [False, True], ids=["strips", "tiles"])
def test_lossless_compressions_opencv_decodes_pack_every_pixel(tmp_path: Path, compression: str,
                                                               tiled: bool) -> None:
    """The known-good set is not over-refused: each lossless compression OpenCV decodes packs
    tifffile's pixels exactly, both pages of a two-page file."""
    path = tmp_path / "slide.tif"
    with tifffile.TiffWriter(path) as tif:
        for picture in (PICTURE, PICTURE[::-1].copy()):
            tif.write(picture, photometric="rgb", compression=compression,
                      **({"tile": (256, 256)} if tiled else {"rowsperstrip": 64}))
    samples = read_ok(path)
    assert [s.key for s in samples] == ["slide-p00000", "slide-p00001"]
    for sample, picture in zip(samples, (PICTURE, PICTURE[::-1]), strict=True):
        assert np.array_equal(sample.image, chw(picture))


@pytest.mark.parametrize("compression", ["group3", "group4", "tiff_ccitt"])
def test_ccitt_bilevel_pages_pack(tmp_path: Path, compression: str) -> None:
    """CCITT fax compressions (1-bit pages, Pillow's libtiff writes them) are in the known-good set."""
    bits = ((_X // 8 + _Y // 8) % 2).astype(bool)
    path = tmp_path / "fax.tif"
    Image.fromarray(bits).convert("1").save(path, "TIFF", compression=compression)
    (sample,) = read_ok(path)
    assert np.array_equal(sample.image[0] > 0, bits)


def jpeg_tiff(path: Path, *, pages: int = 1, tiled: bool = True) -> None:
    with tifffile.TiffWriter(path) as tif:
        for _ in range(pages):
            tif.write(PICTURE, photometric="rgb", compression="jpeg",
                      **({"tile": (256, 256)} if tiled else {"rowsperstrip": 128}))


def damage(path: Path, page: int, chunk: int, how: str) -> None:
    """Overwrite the second half of one tile or strip's stream with noise, or halve its byte
    count (the stream cut short; the file's own length is right)."""
    with tifffile.TiffFile(path) as tif:
        tiff_page = tif.pages[page]
        offset, count = tiff_page.dataoffsets[chunk], tiff_page.databytecounts[chunk]
        counts = tiff_page.tags["TileByteCounts" if tiff_page.is_tiled else "StripByteCounts"]
        width = 2 if counts.dtype == 3 else 4
        at = counts.valueoffset + chunk * width
        order = tif.byteorder
    data = bytearray(path.read_bytes())
    if how == "noise":
        start = offset + count // 2
        data[start:offset + count] = np.random.default_rng(1).integers(0, 256, offset + count - start,
                                                                       dtype=np.uint8).tobytes()
    else:
        struct.pack_into(order + ("H" if width == 2 else "I"), data, at, count // 2)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "strips"])
@pytest.mark.parametrize("how", ["noise", "short-count"])
def test_a_damaged_jpeg_tile_is_decode_failed_naming_page_and_tile(tmp_path: Path, tiled: bool, how: str) -> None:
    """The 4th tile (or strip) of a JPEG-in-TIFF damaged (libjpeg stopped: "Unsupported marker
    type") or its byte count halved (libjpeg warns: premature end of data segment): OpenCV filled
    the rest grey and packer packed it. tifffile refuses the damaged one, and so does packer now,
    both: ``decode_failed`` naming the page, the tile and libjpeg-turbo's message."""
    path = tmp_path / "tiles.tif"
    jpeg_tiff(path, pages=2, tiled=tiled)
    damage(path, page=1, chunk=3, how=how)
    if how == "noise":  # tifffile (imagecodecs) refuses it; a stream cut short it decodes grey too
        with pytest.raises(Exception):  # noqa: B017, PT011 -- imagecodecs' own error classes
            tifffile.imread(path, key=1)
    issue = read_issue(path)
    assert (issue.reason, issue.stage) == ("decode_failed", "read"), issue.message
    chunk = "tile 3" if tiled else "strip 3"
    assert f"TIFF page 1: JPEG {chunk} " in issue.message, issue.message
    assert "libjpeg-turbo" in issue.message


def test_the_repro_s_damaged_tile_is_refused(tmp_path: Path) -> None:
    """The file of the report: one tiled JPEG page, its 4th tile's second half noise."""
    path = tmp_path / "tiles.tif"
    tifffile.imwrite(path, PICTURE, tile=(256, 256), photometric="rgb", compression="jpeg")
    damage(path, page=0, chunk=3, how="noise")
    issue = read_issue(path)
    assert issue.reason == "decode_failed" and "JPEG tile 3 " in issue.message, issue.message


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "strips"])
def test_whole_jpeg_tiles_pack_as_tifffile_decodes_them(tmp_path: Path, tiled: bool) -> None:
    """Undamaged JPEG-in-TIFF (each tile a complete JPEG) passes the strict check and packs what
    tifffile decodes, within JPEG decoders' rounding."""
    path = tmp_path / "tiles.tif"
    jpeg_tiff(path, pages=2, tiled=tiled)
    samples = read_ok(path)
    assert len(samples) == 2
    for sample in samples:
        assert np.abs(sample.image.astype(int) - chw(tifffile.imread(path, key=0)).astype(int)).max() <= 8


def test_jpeg_strips_with_shared_tables_are_checked(tmp_path: Path) -> None:
    """Pillow's libtiff writes the quantisation and Huffman tables once, in JPEGTables (347):
    whole strips pack; a damaged strip, decoded with those tables spliced in, is refused."""
    path = tmp_path / "shared.tif"
    Image.fromarray(PICTURE).save(path, "TIFF", compression="jpeg")
    with tifffile.TiffFile(path) as tif:
        assert tif.pages[0].jpegtables is not None and len(tif.pages[0].dataoffsets) > 4
    (sample,) = read_ok(path)
    assert np.abs(sample.image.astype(int) - chw(tifffile.imread(path)).astype(int)).max() <= 8
    damage(path, page=0, chunk=4, how="noise")
    issue = read_issue(path)
    assert issue.reason == "decode_failed" and "JPEG strip 4 " in issue.message, issue.message


def test_the_known_good_set_is_what_this_opencv_decodes() -> None:
    """OPENCV_TIFF_COMPRESSIONS against this OpenCV build: every compression tifffile can write is
    decoded (pixels back) exactly when it is in the set, so the set cannot silently go stale."""
    import cv2

    written = []
    for code in tifffile.COMPRESSION:
        buffer = io.BytesIO()
        try:
            tifffile.imwrite(buffer, PICTURE[:64, :64], photometric="rgb", compression=int(code))
        except Exception:  # noqa: BLE001 -- tifffile has no encoder for it: nothing to measure
            continue
        image = cv2.imdecode(np.frombuffer(buffer.getvalue(), np.uint8), cv2.IMREAD_UNCHANGED)
        decoded = image is not None and image.shape == (64, 64, 3) and bool(image.any())
        written.append(int(code))
        assert decoded == (int(code) in OPENCV_TIFF_COMPRESSIONS), (code, decoded)
    assert {1, 5, 7, 8, 32773, 32946, 34712, 50000} <= set(written)


def _padded_tiles(rgb: np.ndarray, size: int = 128):  # type: ignore[no-untyped-def]
    """Each tile a whole JPEG with 2 zero bytes before its EOI: libjpeg warns "2 extraneous bytes
    before marker 0xd9" and loses no pixel."""
    for y in range(0, rgb.shape[0], size):
        for x in range(0, rgb.shape[1], size):
            tile = np.zeros((size, size, 3), np.uint8)
            part = rgb[y:y + size, x:x + size]
            tile[:part.shape[0], :part.shape[1]] = part
            out = io.BytesIO()
            Image.fromarray(tile).save(out, "JPEG")
            data = out.getvalue()
            yield data[:-2] + b"\0\0" + data[-2:]


def test_a_jpeg_tile_with_a_warning_that_loses_no_pixel_packs(tmp_path: Path) -> None:
    """Strict mode stops at any warning: a tile whose only warning is extraneous bytes before a
    marker was refused decode_failed, where the same stream as a standalone JPEG packs. Such a
    warning lets the tile through once it decodes whole without strict mode."""
    y, x = np.mgrid[0:300, 0:417]
    rgb = np.stack([(x * 3 + y * 2 + 40 * i) % 200 + 30 for i in range(3)], -1).astype(np.uint8)
    path = tmp_path / "padded.tif"
    tifffile.imwrite(path, _padded_tiles(rgb), shape=rgb.shape, dtype=np.uint8, tile=(128, 128),
                     compression="jpeg", photometric="rgb")
    (sample,) = read_ok(path)
    assert sample.image.shape == (3, 300, 417)


def test_a_12_bit_jpeg_tiff_is_unsupported_not_called_damaged(tmp_path: Path) -> None:
    """A 12-bit JPEG-in-TIFF is a valid file neither the check nor OpenCV's libtiff decodes: it was
    told its data is damaged ("copy or export the file again"); it is unsupported, with the fix."""
    y, x = np.mgrid[0:300, 0:417]
    grey = (((x * 3 + y * 2) % 200 + 30) * 16).astype(np.uint16)
    path = tmp_path / "twelve.tif"
    tifffile.imwrite(path, grey, tile=(128, 128), compression="jpeg", compressionargs={"bitspersample": 12},
                     bitspersample=12, photometric="minisblack")
    issue = read_issue(path)
    assert issue.reason == "unsupported", issue.message
    assert "precision" in issue.message and "Deflate or LZW" in issue.message and "copy" not in issue.message
