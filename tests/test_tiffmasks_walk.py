"""TIFF masks (and the TIFF images beside them) on the walk: a Deflate strip damaged in place
that still inflates to the rows it holds, and a mask saved with a thumbnail IFD as its image is.

Files are real: written by tifffile, then damaged byte by byte where a test says so. Expected
ids and pixels come from the arrays written.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

from packer.config import ImageTransformConfig, LimitsConfig
from packer.read.image import read_image
from packer.records import Issue, SampleRef
from packer.transform.mask import MaskError, decode_mask, decode_mask_pages
from packer.transform.tiff_strips import DEFLATE_SLACK, strip_problem

# --- helpers ---------------------------------------------------------------------------------


def _ids() -> np.ndarray:
    """48×80 blocks of 4×4 pixels, ids 0-3: a mask whose wrong ids would still be declared ones."""
    rng = np.random.default_rng(0)
    return np.kron(rng.integers(0, 4, (12, 20)), np.ones((4, 4))).astype(np.uint8)


def _deflate_tiff(pixels: np.ndarray) -> tuple[bytes, int, int]:
    """``pixels`` as a one-strip Deflate TIFF, and the strip's offset and byte count."""
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, pixels, photometric="minisblack", compression="zlib")
    data = buffer.getvalue()
    page = tifffile.TiffFile(io.BytesIO(data)).pages[0]
    return data, int(page.dataoffsets[0]), int(page.databytecounts[0])


def _silently_damaged(pixels: np.ndarray) -> bytes:
    """``pixels`` as a Deflate TIFF with one bit of its strip flipped such that the stream still
    inflates to every byte the rows need, libtiff (under OpenCV) decodes the page at its size
    without a word, but the pixels differ from ``pixels`` and the stream's Adler-32 (or a later
    block) says it is damaged: the first such bit, past the zlib header."""
    data, offset, count = _deflate_tiff(pixels)
    for bit in range(16, (count - 4) * 8):
        damaged = bytearray(data)
        damaged[offset + bit // 8] ^= 1 << (bit % 8)
        strip = bytes(damaged[offset:offset + count])
        try:
            if len(zlib.decompressobj().decompress(strip, pixels.nbytes)) < pixels.nbytes:
                continue  # runs short: caught by its length
        except zlib.error:
            continue  # broken before the rows are out: caught there
        try:
            zlib.decompress(strip)
            continue  # still a whole, valid stream
        except zlib.error:
            pass
        decoded = cv2.imdecode(np.frombuffer(bytes(damaged), np.uint8), cv2.IMREAD_UNCHANGED)
        if decoded is not None and decoded.shape == pixels.shape and not np.array_equal(decoded, pixels) \
                and decoded.max() <= pixels.max():
            return bytes(damaged)
    raise AssertionError("no bit flip inflates to the full length with wrong pixels")


def _with_strip_count(data: bytes, count: int) -> bytes:
    """``data`` (a one-strip TIFF) with its StripByteCounts set to ``count``."""
    page = tifffile.TiffFile(io.BytesIO(data)).pages[0]
    tag = page.tags["StripByteCounts"]
    out = bytearray(data)
    struct.pack_into("<H" if tag.dtype == 3 else "<I", out, tag.valueoffset, count)
    return bytes(out)


def _read(path: Path) -> list[np.ndarray] | Issue:
    ref = SampleRef(sample_id="img-001", source="scans", kind="image", path=str(path), relpath=path.name,
                    label="doc", entity="e1", time="2024-01-01")
    result = read_image(ref, ImageTransformConfig(color="gray"), limits=LimitsConfig())
    return result if isinstance(result, Issue) else [sample.image for sample in result]


# --- a Deflate strip damaged in place ----------------------------------------------------------


def test_a_deflate_mask_strip_damaged_in_place_is_unreadable_though_it_inflates_to_its_rows() -> None:
    """One flipped bit that still inflates to the 3840 bytes the rows need: the check stopped
    there, before the stream's end and its Adler-32 checksum, and the mask packed with wrong
    (but declared) ids. The stream is now inflated to its end: mask_unreadable, naming the
    strip, zlib's error and the fix."""
    mask = _ids()
    damaged = _silently_damaged(mask)
    with pytest.raises(MaskError) as caught:
        decode_mask(damaged, "a_m.tif")
    assert caught.value.reason == "mask_unreadable", caught.value.message
    message = caught.value.message
    assert message.startswith("a_m.tif page 0: the TIFF mask's Deflate strip 0 "), message
    assert "is not a valid Deflate stream" in message and "re-export the mask" in message, message
    assert "libtiff would decode the rows it gives without a word" in message, message
    data, _, _ = _deflate_tiff(mask)
    assert np.array_equal(decode_mask(data, "a_m.tif"), mask)  # the undamaged file decodes whole


def test_a_deflate_image_strip_damaged_in_place_is_decode_failed(tmp_path: Path) -> None:
    """The image reader asks the same check: the same damage in an image packed wrong pixels
    without a word; it is decode_failed now, as a strip that runs short is."""
    pixels = (_ids() * 60 + 20).astype(np.uint8)  # greys 20-200 in blocks: a stream that has back-references
    path = tmp_path / "a.tif"
    path.write_bytes(_silently_damaged(pixels))
    issue = _read(path)
    assert isinstance(issue, Issue) and issue.reason == "decode_failed", issue
    assert "TIFF Deflate strip 0 " in issue.message and "is not a valid Deflate stream" in issue.message, issue.message
    path.write_bytes(_deflate_tiff(pixels)[0])
    (image,) = _read(path)  # type: ignore[misc]
    assert np.array_equal(image[0], pixels)


def test_a_deflate_strip_cut_inside_its_checksum_is_unreadable() -> None:
    """A StripByteCounts 2 bytes short: every pixel inflates, but the stream ends inside its
    Adler-32, so nothing says the pixels are the ones written: the stream did not end."""
    mask = _ids()
    data, _, count = _deflate_tiff(mask)
    short = _with_strip_count(data, count - 2)
    with pytest.raises(MaskError) as caught:
        decode_mask(short, "a_m.tif")
    assert caught.value.reason == "mask_unreadable", caught.value.message
    assert "Deflate strip 0 " in caught.value.message and "ends before its stream does" in caught.value.message


def _one_strip_tags(width: int, height: int, stream: bytes) -> dict[int, tuple[int, ...]]:
    """The integer tags of an 8-bit grey one-strip Deflate IFD whose strip is ``stream`` at byte 0."""
    return {256: (width,), 257: (height,), 258: (8,), 277: (1,), 278: (height,), 259: (8,), 273: (0,),
            279: (len(stream),)}


def test_a_deflate_strip_padded_past_its_stream_still_passes() -> None:
    """Bytes after the end of the stream (a StripByteCounts that counts a writer's padding) are
    not read by libtiff: the stream ended cleanly, its checksum matched, the strip passes."""
    stream = zlib.compress(bytes(range(64)))
    assert strip_problem(stream + bytes(4), _one_strip_tags(16, 4, stream + bytes(4)), frozenset({8})) is None


@pytest.mark.parametrize("extra", [100, 2 * DEFLATE_SLACK], ids=["a-little-more", "past-the-slack"])
def test_a_deflate_strip_that_inflates_to_more_than_its_rows_is_judged_as_libtiff_reads_it(extra: int) -> None:
    """libtiff reads the bytes the rows need and leaves the rest of a stream unread: a strip
    whose stream holds more (a writer's last strip padded to RowsPerStrip) passes. One that ends
    a little later is inflated to its end, so a damaged checksum there is caught; one that goes
    on past :data:`DEFLATE_SLACK` is not inflated further (a zip bomb stops there), so its
    checksum is not reached and is not judged."""
    stream = zlib.compress(bytes(16 * 4 + extra))
    tags = _one_strip_tags(16, 4, stream)
    assert strip_problem(stream, tags, frozenset({8})) is None
    damaged = stream[:-1] + bytes([stream[-1] ^ 1])  # the Adler-32's last byte
    problem = strip_problem(damaged, tags, frozenset({8}))
    if extra < DEFLATE_SLACK:
        assert problem is not None and "is not a valid Deflate stream" in problem and "incorrect data check" in problem
    else:
        assert problem is None


# --- a mask saved with a thumbnail -------------------------------------------------------------


def _with_thumbnails(path: Path, pages: list[np.ndarray], *, after: int = 1, palette: bool = False) -> None:
    """``pages`` as a Deflate TIFF with a quarter-size reduced-resolution IFD (NewSubfileType 1:
    a thumbnail) after the first ``after`` pages, as a viewer or a slide scanner saves one."""
    extra = {"photometric": "palette", "colormap": np.tile(np.arange(256, dtype=np.uint16) * 257, (3, 1))} \
        if palette else {"photometric": "minisblack"}
    with tifffile.TiffWriter(path) as writer:
        for number, page in enumerate(pages):
            if number == after:
                writer.write(pages[0][::4, ::4].copy(), subfiletype=1, compression="zlib", **extra)
            writer.write(page, compression="zlib", **extra)
        if after >= len(pages):
            writer.write(pages[0][::4, ::4].copy(), subfiletype=1, compression="zlib", **extra)


@pytest.mark.parametrize(("count", "after"), [(1, 1), (2, 1), (3, 2)], ids=["one-page", "two-pages", "three-pages"])
@pytest.mark.parametrize("palette", [False, True], ids=["grey", "palette"])
def test_a_tiff_mask_s_thumbnail_ifd_is_skipped_as_an_image_s_is(tmp_path: Path, count: int, after: int,
                                                                   palette: bool) -> None:
    """A mask saved with a thumbnail (a reduced-resolution IFD) beside an image that has one too
    was refused mask_size, "pages have different sizes (40×60, 10×15)": its thumbnail counted as
    a page. The image reader skips reduced-resolution IFDs; the mask decoder now does the same,
    so the mask has one page per full page of the image, each its own page's ids."""
    rng = np.random.default_rng(count)
    pages = [rng.integers(0, 3, (40, 60), dtype=np.uint8) for _ in range(count)]
    path = tmp_path / "m.tif"
    _with_thumbnails(path, pages, after=after, palette=palette)
    assert len(tifffile.TiffFile(path).pages) == count + 1  # the thumbnail is an IFD of the main chain
    decoded = decode_mask(path.read_bytes(), "m.tif")
    assert np.array_equal(decoded, pages[0] if count == 1 else np.stack(pages))
    assert [page.tolist() for page in decode_mask_pages(path.read_bytes(), "m.tif")] == [p.tolist() for p in pages]


def test_a_tiff_mask_whose_pages_differ_in_size_skips_its_thumbnail_page_by_page(tmp_path: Path) -> None:
    """For an image whose full pages differ in size, each mask page is checked against its own
    page: the thumbnail between them is not one of them."""
    pages = [np.full((40, 60), 1, np.uint8), np.full((20, 30), 2, np.uint8)]
    path = tmp_path / "m.tif"
    _with_thumbnails(path, pages)
    assert [page.tolist() for page in decode_mask_pages(path.read_bytes(), "m.tif")] == [p.tolist() for p in pages]


def test_a_tiff_mask_of_reduced_resolution_ifds_only_keeps_them_all(tmp_path: Path) -> None:
    """Where every IFD is flagged reduced-resolution there is no full image they could stand for:
    the image reader reads them all as pages, and so does the mask decoder."""
    pages = [np.full((8, 12), 1, np.uint8), np.full((8, 12), 2, np.uint8)]
    path = tmp_path / "m.tif"
    with tifffile.TiffWriter(path) as writer:
        for page in pages:
            writer.write(page, photometric="minisblack", subfiletype=1)
    assert np.array_equal(decode_mask(path.read_bytes(), "m.tif"), np.stack(pages))


def test_the_image_and_its_mask_count_the_same_pages(tmp_path: Path) -> None:
    """The rule is one: the image reader's samples are the full pages (each keyed by its IFD),
    and the mask's pages are as many, in the same order."""
    rng = np.random.default_rng(9)
    images = [rng.integers(1, 255, (40, 60), dtype=np.uint8) for _ in range(2)]
    masks = [rng.integers(0, 3, (40, 60), dtype=np.uint8) for _ in range(2)]
    _with_thumbnails(tmp_path / "a.tif", images)
    _with_thumbnails(tmp_path / "a_m.tif", masks)
    packed = _read(tmp_path / "a.tif")
    assert not isinstance(packed, Issue), packed
    assert [image[0].tolist() for image in packed] == [image.tolist() for image in images]
    assert np.array_equal(decode_mask((tmp_path / "a_m.tif").read_bytes(), "a_m.tif"), np.stack(masks))


def test_a_mask_whose_decoder_gives_another_count_than_its_ifds_is_unreadable_not_shifted() -> None:
    """Where some IFD is a thumbnail, the decoder's images are matched to the IFDs one to one to
    leave it out; where the counts differ no image can be matched to its IFD: mask_unreadable,
    never a page silently shifted."""
    from packer.transform.mask import _full_pages

    page, thumbnail = np.zeros((4, 6), np.uint8), np.zeros((1, 2), np.uint8)
    chain = [{256: (6,)}, {254: (1,), 256: (2,)}]
    assert [p.shape for p in _full_pages([page, thumbnail], chain, "m.tif")] == [(4, 6)]
    assert [p.shape for p in _full_pages([page, page], [{}, {}], "m.tif")] == [(4, 6), (4, 6)]
    with pytest.raises(MaskError) as caught:
        _full_pages([page, thumbnail, page], chain, "m.tif")
    assert caught.value.reason == "mask_unreadable"
    assert caught.value.message.startswith("m.tif: the TIFF mask holds reduced-resolution IFDs"), caught.value.message
    assert "decoded 3 images from its 2 IFDs" in caught.value.message
