"""A TIFF mask saved with a thumbnail is judged by its pages, not by the thumbnail.

Reduced-resolution IFDs (NewSubfileType bit 0: thumbnails, pyramid levels) are no pages of a
mask (:func:`packer.transform.tiff_strips.page_indices`), yet the mask decoder ran its per-IFD
checks on every IFD: a mask whose viewer- or scanner-written preview is JPEG (lossy, but no page)
was refused ``mask_unreadable`` "page N ... JPEG is lossy", and so was one whose thumbnail's
strips ran short or whose thumbnail stores 16-bit samples as separate planes. The checks now run
on the pages alone; a page in JPEG is still refused, numbered among the pages.

Files are real: written by tifffile (its imagecodecs encode JPEG), damaged byte by byte where a
test says so. Expected ids come from the arrays written.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile

from packer.config import ImageTransformConfig, LimitsConfig
from packer.read.image import read_image
from packer.records import Issue, SampleRef
from packer.transform.mask import MaskError, decode_mask, decode_mask_pages
from tests.test_masks_walk import IDS, _mask_build

# --- helpers ---------------------------------------------------------------------------------


def _ids(seed: int = 0) -> np.ndarray:
    """40×64 blocks of 4×4 pixels, ids 0-3, a grey 8-bit label map."""
    rng = np.random.default_rng(seed)
    return np.kron(rng.integers(0, 4, (10, 16)), np.ones((4, 4))).astype(np.uint8)


def _preview(mask: np.ndarray) -> np.ndarray:
    """A quarter-size greyscale preview of ``mask``, its ids spread to greys as a viewer shows them."""
    return (mask[::4, ::4] * 80).astype(np.uint8)


def _tiff(ifds: list[tuple[np.ndarray, dict[str, object]]]) -> bytes:
    """One IFD a (pixels, tifffile write arguments) pair, in order, in one TIFF's main chain."""
    buffer = io.BytesIO()
    with tifffile.TiffWriter(buffer) as writer:
        for pixels, arguments in ifds:
            writer.write(pixels, **arguments)  # type: ignore[arg-type]
    return buffer.getvalue()


def _thumbnail(compression: str) -> dict[str, object]:
    return {"subfiletype": 1, "compression": compression, "photometric": "minisblack"}


def _page(compression: str) -> dict[str, object]:
    return {"compression": compression, "photometric": "minisblack"}


def _with_ifd_strip_cut(data: bytes, ifd: int) -> bytes:
    """``data`` with the one strip of IFD ``ifd`` declared half its length (StripByteCounts): a
    stream cut short, which libtiff pads with zero rows."""
    page = tifffile.TiffFile(io.BytesIO(data)).pages[ifd]
    tag = page.tags["StripByteCounts"]  # type: ignore[union-attr]
    assert len(tag.value) == 1, "the helper cuts a one-strip IFD"
    out = bytearray(data)
    struct.pack_into("<H" if tag.dtype == 3 else "<I", out, tag.valueoffset, int(tag.value[0]) // 2)
    return bytes(out)


# --- a lossy thumbnail is no lossy page --------------------------------------------------------


@pytest.mark.parametrize("compression", ["lzw", "zlib"], ids=["LZW", "Deflate"])
@pytest.mark.parametrize("first", [True, False], ids=["thumbnail-first", "thumbnail-last"])
def test_a_mask_with_a_jpeg_thumbnail_reads_its_lossless_pages(compression: str, first: bool) -> None:
    """A grey mask of two LZW or Deflate pages with a JPEG preview IFD (as viewers and scanners
    write one) first or last in the chain: it was refused mask_unreadable "page 0 (or 2): a TIFF
    mask compressed with JPEG", though the preview is no page. Its pages are read, id for id."""
    pages = [_ids(1), _ids(2)]
    thumbnail = (_preview(pages[0]), _thumbnail("jpeg"))
    ifds = [(page, _page(compression)) for page in pages]
    data = _tiff([thumbnail, *ifds] if first else [*ifds, thumbnail])
    assert tifffile.TiffFile(io.BytesIO(data)).pages[0 if first else 2].compression == 7  # type: ignore[union-attr]
    assert np.array_equal(decode_mask(data, "m.tif"), np.stack(pages))
    assert [page.tolist() for page in decode_mask_pages(data, "m.tif")] == [page.tolist() for page in pages]


def test_a_mask_with_a_jpeg_thumbnail_packs_through_the_pipeline(tmp_path: Path) -> None:
    """The walk's check before decoding (packer.read.masks) judged every IFD as well: through a
    build, the mask with a JPEG preview packs its page's ids, and a mask whose page is JPEG is
    still a bad sample, mask_unreadable for its compression."""
    thumbnail = (_preview(IDS), _thumbnail("jpeg"))
    masks = {"thumb-last.tif": _tiff([(IDS, _page("zlib")), thumbnail]),
             "jpeg-page.tif": _tiff([(_preview(IDS), _thumbnail("zlib")), (IDS, _page("jpeg"))])}
    bad, packed = _mask_build(tmp_path, masks, [0, 1, 2])
    assert sorted(packed) == ["thumb-last.tif"], bad
    for mask in packed.values():
        assert np.array_equal(mask.reshape(IDS.shape), IDS)
    assert sorted(bad) == ["jpeg-page.tif"]
    assert bad["jpeg-page.tif"]["reason"] == "mask_unreadable"
    assert "page 0: a TIFF mask compressed with JPEG (Compression 7)" in bad["jpeg-page.tif"]["message"]


@pytest.mark.parametrize("first", [True, False], ids=["thumbnail-first", "thumbnail-last"])
def test_a_jpeg_page_beside_a_lossless_thumbnail_is_still_refused_and_numbered_among_the_pages(first: bool) -> None:
    """Only the thumbnail is spared: a page compressed with JPEG is mask_unreadable as before,
    named by its number among the pages (0 here, whichever IFD it is), with the fix."""
    mask = _ids(4)
    thumbnail = (_preview(mask), _thumbnail("zlib"))
    page = (mask, _page("jpeg"))
    data = _tiff([thumbnail, page] if first else [page, thumbnail])
    with pytest.raises(MaskError) as caught:
        decode_mask(data, "m.tif")
    assert caught.value.reason == "mask_unreadable"
    assert caught.value.message.startswith("m.tif page 0: a TIFF mask compressed with JPEG (Compression 7); "
                                           "JPEG is lossy"), caught.value.message
    assert "save the mask as PNG or as a TIFF with LZW, Deflate or no compression" in caught.value.message


def test_a_second_page_in_jpeg_is_refused_by_its_page_number_not_its_ifd() -> None:
    """Page 1 in JPEG after a thumbnail (IFDs: page, thumbnail, page) is "page 1", not IFD 2."""
    pages = [_ids(5), _ids(6)]
    data = _tiff([(pages[0], _page("lzw")), (_preview(pages[0]), _thumbnail("lzw")), (pages[1], _page("jpeg"))])
    with pytest.raises(MaskError) as caught:
        decode_mask(data, "m.tif")
    assert caught.value.message.startswith("m.tif page 1: a TIFF mask compressed with JPEG"), caught.value.message


# --- the other per-IFD checks: strips and separate planes ---------------------------------------


def test_a_thumbnail_whose_strip_runs_short_does_not_refuse_the_mask() -> None:
    """libtiff pads a thumbnail's short Deflate strip with zero rows; the thumbnail is left out,
    so its strips are not the mask's: the page is read."""
    mask = _ids(7)
    data = _with_ifd_strip_cut(_tiff([(_preview(mask), _thumbnail("zlib")), (mask, _page("zlib"))]), 0)
    assert np.array_equal(decode_mask(data, "m.tif"), mask)


def test_a_page_whose_strip_runs_short_beside_a_thumbnail_is_still_refused_by_its_page_number() -> None:
    """A page's short strip is still mask_unreadable, numbered among the pages (page 0, IFD 1)."""
    mask = _ids(8)
    data = _with_ifd_strip_cut(_tiff([(_preview(mask), _thumbnail("zlib")), (mask, _page("zlib"))]), 1)
    with pytest.raises(MaskError) as caught:
        decode_mask(data, "m.tif")
    assert caught.value.reason == "mask_unreadable"
    assert caught.value.message.startswith("m.tif page 0: the TIFF mask's "), caught.value.message


def test_a_16_bit_rgb_thumbnail_stored_as_separate_planes_does_not_refuse_a_grey_mask() -> None:
    """A 16-bit RGB preview stored as separate planes (a layout OpenCV misreads) is no page: the
    grey page after it is read. The same layout on a page is still refused (below)."""
    mask = _ids(9)
    preview = np.stack([_preview(mask).astype(np.uint16) * 257] * 3)
    separate = {"subfiletype": 1, "compression": "zlib", "photometric": "rgb", "planarconfig": "separate"}
    data = _tiff([(preview, separate), (mask, _page("zlib"))])
    assert np.array_equal(decode_mask(data, "m.tif"), mask)


def test_a_16_bit_separate_planes_page_after_a_thumbnail_is_still_refused_by_its_page_number() -> None:
    mask = _ids(10)
    planes = np.stack([mask.astype(np.uint16)] * 3)
    data = _tiff([(_preview(mask), _thumbnail("zlib")),
                  (planes, {"compression": "zlib", "photometric": "rgb", "planarconfig": "separate"})])
    with pytest.raises(MaskError) as caught:
        decode_mask(data, "m.tif")
    assert caught.value.reason == "mask_unreadable"
    assert caught.value.message.startswith("m.tif page 0: a 16-bit TIFF mask whose 3 samples per pixel are stored "
                                           "as separate planes"), caught.value.message


# --- the walk's header check before decoding -----------------------------------------------------


@pytest.mark.parametrize("compression", ["jpeg", "zlib"], ids=["JPEG-thumbnail", "Deflate-thumbnail"])
def test_a_mask_whose_thumbnail_comes_first_is_sized_by_its_page_through_the_pipeline(tmp_path: Path,
                                                                                      compression: str) -> None:
    """The walk compares a PNG or TIFF mask's header size with its image's before decoding; for a
    TIFF it read the first IFD, a thumbnail where the preview was written first, and refused the
    mask mask_size "its header gives 12×16 pixels, the image 48×64". The size is the first page's
    (page_indices' rule); a mask whose page is another size than its image is still refused."""
    masks = {"thumb-first.tif": _tiff([(_preview(IDS), _thumbnail(compression)), (IDS, _page("lzw"))]),
             "wrong-size.tif": _tiff([(_preview(IDS), _thumbnail(compression)), (IDS[:40], _page("lzw"))])}
    bad, packed = _mask_build(tmp_path, masks, [0, 1, 2])
    assert sorted(packed) == ["thumb-first.tif"], bad
    assert np.array_equal(packed["thumb-first.tif"].reshape(IDS.shape), IDS)
    assert sorted(bad) == ["wrong-size.tif"]
    assert bad["wrong-size.tif"]["reason"] == "mask_size"
    assert "its header gives 40×64 pixels, the image 48×64" in bad["wrong-size.tif"]["message"]


# --- the image side: a thumbnail's strips are no page's ------------------------------------------


def _read_image(path: Path) -> list[np.ndarray] | Issue:
    ref = SampleRef(sample_id="img-001", source="scans", kind="image", path=str(path), relpath=path.name,
                    label="doc", entity="e1", time="2024-01-01")
    result = read_image(ref, ImageTransformConfig(color="gray"), limits=LimitsConfig())
    return result if isinstance(result, Issue) else [sample.image[0] for sample in result]


@pytest.mark.parametrize("first", [True, False], ids=["thumbnail-first", "thumbnail-last"])
@pytest.mark.parametrize("compression", ["jpeg", "zlib"], ids=["JPEG-thumbnail", "Deflate-thumbnail"])
def test_an_image_is_read_whatever_its_thumbnail_s_strips_hold(tmp_path: Path, first: bool, compression: str) -> None:
    """An image read as its mask is: a JPEG preview is no refusal, and neither is a preview whose
    Deflate strip runs short. That one was decode_failed "TIFF Deflate strip 0 of IFD 1 ...", even
    where the thumbnail came last and OpenCV decoded IFD 0 alone; libtiff pads a thumbnail's lost
    rows, and the thumbnail is left out. The page's pixels are read exactly."""
    pixels = np.random.default_rng(11).integers(1, 255, (48, 64), dtype=np.uint8)
    thumbnail, page = (pixels[::4, ::4].copy(), _thumbnail(compression)), (pixels, _page("lzw"))
    data = _tiff([thumbnail, page] if first else [page, thumbnail])
    if compression == "zlib":
        data = _with_ifd_strip_cut(data, 0 if first else 1)
    (tmp_path / "a.tif").write_bytes(data)
    read = _read_image(tmp_path / "a.tif")
    assert not isinstance(read, Issue), read
    assert [image.tolist() for image in read] == [pixels.tolist()]


def test_an_image_page_whose_strip_runs_short_beside_a_thumbnail_is_still_decode_failed(tmp_path: Path) -> None:
    pixels = np.random.default_rng(12).integers(1, 255, (48, 64), dtype=np.uint8)
    data = _with_ifd_strip_cut(_tiff([(pixels[::4, ::4].copy(), _thumbnail("zlib")), (pixels, _page("zlib"))]), 1)
    (tmp_path / "a.tif").write_bytes(data)
    read = _read_image(tmp_path / "a.tif")
    assert isinstance(read, Issue) and read.reason == "decode_failed", read
    assert "TIFF Deflate strip 0 of IFD 1 " in read.message and "re-export the file" in read.message, read.message
