"""Regressions of two changes: a lossy-capable syntax's lossless codestream taken for a lossy one
(its bits above High Bit clipped as an overshoot), and a TIFF mask whose first IFD is a
thumbnail read with the thumbnail's bits and photometric, or a palette mask refused for its
thumbnail.

Files are real: codestreams written by OpenJPEG, CharLS and OpenJPH (imagecodecs), TIFFs by
tifffile; expected values come from the arrays written.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import imagecodecs
import numpy as np
import pytest
import tifffile
from dicom_files import ct_dataset, make_ref, save
from pydicom import dcmread
from pydicom.encaps import encapsulate
from pydicom.uid import JPEG2000, JPEGLSNearLossless

from packer.config import DicomTransformConfig
from packer.read.dicom import read_dicom
from packer.read.limits import codestream_lossy
from packer.transform.mask import decode_mask_pages

HTJ2K = "1.2.840.10008.1.2.4.203"

# --- lossy or lossless: the codestream says, not the syntax ------------------------------------


def _overlaid() -> tuple[np.ndarray, np.ndarray]:
    """A 12-bit slice (stored in 16) whose dark background corner (0..40) carries an overlay plane
    in bit 12 (burned-in text, OverlayBitPosition 12 as old writers stored it): the stored values,
    and the raw values a codestream of 16-bit precision holds (4096..4136 under the text): every
    value past 4095 within an eighth of the range of it, as a lossy overshoot would be."""
    rng = np.random.default_rng(1)
    stored = np.zeros((64, 64), np.uint16)
    stored[16:, :] = rng.integers(800, 1400, (48, 64))
    stored[:16, :] = rng.integers(0, 41, (16, 64))
    raw = stored.copy()
    raw[2:10, 4:40] |= 1 << 12
    return stored, raw


def _saturated() -> np.ndarray:
    """A 12-bit slice with both ends of the range saturated beside a mid-grey: what a lossy coder
    overshoots (test_dicom_codecs_walk's image)."""
    img = np.full((64, 64), 2047, np.uint16)
    img[:, 44:] = 4095
    img[:, :12] = 0
    img[20:40, 20:30] = 1000
    return img


def _lossless(syntax: str, raw: np.ndarray) -> bytes:
    """``raw`` coded losslessly under ``syntax``, which allows lossy coding too: a reversible (5-3)
    JPEG 2000 or HTJ2K codestream, or JPEG-LS with NEAR 0; checked to decode to ``raw``."""
    if syntax == JPEG2000:
        frame = bytes(imagecodecs.jpeg2k_encode(raw, level=0, codecformat="J2K", reversible=True))
        decoded = imagecodecs.jpeg2k_decode(frame)
    elif syntax == HTJ2K:
        frame = bytes(imagecodecs.htj2k_encode(raw, reversible=True))
        decoded = imagecodecs.htj2k_decode(frame)
    else:
        frame = bytes(imagecodecs.jpegls_encode(raw, level=0))
        decoded = imagecodecs.jpegls_decode(frame)
    assert np.array_equal(decoded, raw), "the codestream is not lossless: the test shows nothing"
    return frame


def _dicom(tmp_path: Path, syntax: str, frames: list[bytes], stored: np.ndarray) -> Path:
    ds = ct_dataset(stored, center=None, width=None)
    ds.BitsStored, ds.HighBit = 12, 11
    ds.file_meta.TransferSyntaxUID = syntax
    ds.PixelData = encapsulate(frames)
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    return save(ds, tmp_path / "f.dcm")


def _hu(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    out = read_dicom(make_ref(path), DicomTransformConfig(windows=(), output="float16"))
    assert isinstance(out, list), getattr(out, "message", "")
    return np.stack([sample.image[0] for sample in out]).astype(np.float64), out[0].metadata


def _clip_notes(metadata: dict[str, Any]) -> list[str]:
    return [note for note in metadata.get("warnings", []) if "clipped" in note]


@pytest.mark.parametrize("syntax", [JPEG2000, HTJ2K, JPEGLSNearLossless],
                         ids=["jpeg2000-reversible", "htj2k-reversible", "jpeg-ls-near-0"])
def test_a_lossless_codestream_s_overlay_bit_over_dark_pixels_is_masked_not_clipped(
        tmp_path: Path, syntax: str) -> None:
    """Under a syntax that allows lossy coding, a lossless codestream whose bit 12 (above High Bit
    11) holds an overlay over dark pixels decodes to 4096..4136, all just past 4095. Taken for a
    lossy overshoot by the syntax alone, the text was clipped to 4095 (3071 HU, white) "nothing to
    fix". The codestream says it is lossless (reversible wavelet, NEAR 0): its values past the range
    are bits above High Bit, which are no pixel data (PS3.5 8.1.1), and the pixels are the low 12."""
    stored, raw = _overlaid()
    hu, metadata = _hu(_dicom(tmp_path, syntax, [_lossless(syntax, raw)], stored))
    np.testing.assert_array_equal(hu[0], (stored.astype(np.float64) - 1024).astype(np.float16))
    assert not _clip_notes(metadata), metadata.get("warnings")


def test_a_reversible_codestream_cut_by_a_rate_under_a_header_that_says_lossy_is_clipped(tmp_path: Path) -> None:
    """A 5-3 (reversible) JPEG 2000 codestream whose coding passes a rate cut is lossy too
    (opj_compress -r, Kakadu Creversible=yes with a rate): its wavelet proves nothing, and its
    saturated pixels overshoot 4095. A header that says the image was coded lossily (Lossy Image
    Compression 01) makes it clipped to the range, as a lossy overshoot: masked to the low 12 bits,
    white bone packed as air."""
    img = _saturated()
    frame = bytes(imagecodecs.jpeg2k_encode(img, level=80, reversible=True, codecformat="J2K"))
    decoded = imagecodecs.jpeg2k_decode(frame).astype(np.int64)
    assert codestream_lossy(frame) is False and 4095 < decoded.max() <= 4095 + 512, "no overshoot: shows nothing"
    path = _dicom(tmp_path, JPEG2000, [frame], img)
    ds = dcmread(path)
    ds.LossyImageCompression = "01"
    ds.save_as(path)
    hu, metadata = _hu(path)
    assert hu[0][img == 4095].min() > 3071 - 200
    assert _clip_notes(metadata), metadata.get("warnings")


def test_a_jpeg_ls_near_0_codestream_is_lossless_whatever_lossy_image_compression_says(tmp_path: Path) -> None:
    """Lossy Image Compression 01 stays on an image once lossy-coded, then transcoded losslessly (a
    lossy JPEG archive moved to JPEG-LS). JPEG-LS's NEAR bounds every sample's error, so NEAR 0
    proves the codestream lossless: its overlay bit over dark pixels is masked, not clipped white."""
    stored, raw = _overlaid()
    path = _dicom(tmp_path, JPEGLSNearLossless, [_lossless(JPEGLSNearLossless, raw)], stored)
    ds = dcmread(path)
    ds.LossyImageCompression = "01"
    ds.save_as(path)
    hu, metadata = _hu(path)
    np.testing.assert_array_equal(hu[0], (stored.astype(np.float64) - 1024).astype(np.float16))
    assert not _clip_notes(metadata), metadata.get("warnings")


def test_each_frame_is_judged_lossy_or_lossless_by_its_own_codestream(tmp_path: Path) -> None:
    """A two-frame file under 1.2.840.10008.1.2.4.91: frame 0 lossy (irreversible 9-7), which
    overshoots its saturated pixels, frame 1 reversible with an overlay bit over dark pixels. Frame
    0's overshoot is clipped and counted; frame 1's bit 12 is masked, not clipped with it."""
    stored, raw = _overlaid()
    saturated = _saturated()
    lossy = bytes(imagecodecs.jpeg2k_encode(saturated, level=90, codecformat="J2K", reversible=False))
    overshoot = imagecodecs.jpeg2k_decode(lossy).astype(np.int64)
    outside = int((overshoot > 4095).sum())
    assert outside > 0 and overshoot.max() <= 4095 + 512, "no overshoot within the margin: the test shows nothing"
    path = _dicom(tmp_path, JPEG2000, [lossy, _lossless(JPEG2000, raw)], np.stack([saturated, stored]))
    hu, metadata = _hu(path)
    assert hu.shape[0] == 2
    np.testing.assert_array_equal(hu[1], (stored.astype(np.float64) - 1024).astype(np.float16))
    assert hu[0].max() <= float(np.float16(4095 - 1024))
    assert np.abs(hu[0] - (saturated.astype(np.float64) - 1024)).max() <= 64  # clipped, not wrapped to air
    notes = _clip_notes(metadata)
    assert len(notes) == 1 and f"{outside} decoded value(s)" in notes[0], metadata.get("warnings")


def _with_tile_cod(codestream: bytes, transformation: int) -> bytes:
    """``codestream`` with a copy of its main header's COD, its transformation byte set to
    ``transformation``, added to its first tile-part's header (Psot grown to match): a tile coded
    otherwise than the main header says (ITU T.800 A.4.2)."""
    cod_at = codestream.index(b"\xff\x52")
    (length,) = struct.unpack_from(">H", codestream, cod_at + 2)
    cod = bytearray(codestream[cod_at:cod_at + 2 + length])
    cod[13] = transformation
    sot = codestream.index(b"\xff\x90")
    (psot,) = struct.unpack_from(">I", codestream, sot + 6)
    assert psot, "an open-ended tile-part: the test needs a sized one"
    out = bytearray(codestream[:sot + 12] + bytes(cod) + codestream[sot + 12:])
    struct.pack_into(">I", out, sot + 6, psot + len(cod))
    return bytes(out)


def test_codestream_lossy_reads_the_wavelet_and_near_of_each_coder() -> None:
    """What each coder writes: the wavelet of JPEG 2000 and HTJ2K (9-7 lossy, 5-3 lossless; raw
    or in a JP2 file; in a tile-part header too, which overrides the main header's), JPEG-LS's NEAR
    (0 lossless); None for a frame that is neither."""
    img = _saturated()
    j2k = bytes(imagecodecs.jpeg2k_encode(img, level=0, codecformat="J2K", reversible=True))
    assert codestream_lossy(j2k) is False
    assert codestream_lossy(bytes(imagecodecs.jpeg2k_encode(img, level=90, codecformat="J2K"))) is True
    assert codestream_lossy(bytes(imagecodecs.jpeg2k_encode(img, level=0, codecformat="JP2", reversible=True))) \
        is False
    assert codestream_lossy(bytes(imagecodecs.jpeg2k_encode(img, level=90, codecformat="JP2"))) is True
    assert codestream_lossy(_with_tile_cod(j2k, 0)) is True
    assert codestream_lossy(_with_tile_cod(j2k, 1)) is False
    assert codestream_lossy(bytes(imagecodecs.htj2k_encode(img, reversible=True))) is False
    assert codestream_lossy(bytes(imagecodecs.htj2k_encode(img, reversible=False))) is True
    assert codestream_lossy(bytes(imagecodecs.jpegls_encode(img, level=0))) is False
    assert codestream_lossy(bytes(imagecodecs.jpegls_encode(img, level=3))) is True
    assert codestream_lossy(bytes(imagecodecs.jpeg8_encode(img.astype(np.uint8)))) is None
    assert codestream_lossy(j2k[:40]) is None  # cut short before its COD


# --- a TIFF mask whose first IFD is a thumbnail ------------------------------------------------


def _ids() -> np.ndarray:
    """48×80 blocks of 4×4 pixels, ids 0-3."""
    rng = np.random.default_rng(0)
    return np.kron(rng.integers(0, 4, (12, 20)), np.ones((4, 4))).astype(np.uint8)


def _tiff(writes: list[tuple[np.ndarray, dict[str, Any]]]) -> bytes:
    """One IFD per (array, tifffile options), in order."""
    buffer = io.BytesIO()
    with tifffile.TiffWriter(buffer) as writer:
        for array, options in writes:
            writer.write(array, **options)
    return buffer.getvalue()


def _thumbnail(ids: np.ndarray, **options: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """An 8-bit grey quarter-size preview of ``ids``, flagged reduced-resolution (NewSubfileType 1)."""
    return (ids[::4, ::4] * 60).astype(np.uint8), {"subfiletype": 1, "photometric": "minisblack", **options}


@pytest.mark.parametrize("thumbnail_first", [True, False], ids=["thumbnail-first", "thumbnail-after"])
@pytest.mark.parametrize(("layout", "options"), [
    ("bilevel", {"photometric": "minisblack"}),
    ("white-is-zero", {"photometric": "miniswhite"}),
    ("12-bit", {"photometric": "minisblack", "bitspersample": 12}),
], ids=["bilevel", "white-is-zero", "12-bit"])
def test_a_tiff_mask_s_bits_and_photometric_are_its_first_page_s_not_its_thumbnail_s(
        layout: str, options: dict[str, Any], thumbnail_first: bool) -> None:
    """Reduced-resolution IFDs are no pages of a mask, but its BitsPerSample and Photometric were
    read from IFD 0 whatever it was: where that is an 8-bit BlackIsZero thumbnail, a bilevel page's
    1s packed as 255 (OpenCV gives 0/255 for 0/1), a WhiteIsZero page's ids 0..3 as 255..252
    (libtiff's display inversion kept), a 12-bit page's ids 16 times over (OpenCV's scaling to 16
    bits kept). They are the first page's, the first IFD that is not reduced."""
    ids = _ids()
    if layout == "bilevel":
        ids = (ids > 1).astype(np.uint8)
        page: tuple[np.ndarray, dict[str, Any]] = (ids.astype(bool), options)
    else:
        page = (ids.astype(np.uint16) if layout == "12-bit" else ids, options)
    writes = [_thumbnail(ids), page] if thumbnail_first else [page, _thumbnail(ids)]
    pages = decode_mask_pages(_tiff(writes), "mask.tif")
    assert len(pages) == 1 and pages[0].tolist() == ids.tolist()


def test_a_mask_s_bilevel_thumbnail_does_not_make_its_8_bit_page_bilevel() -> None:
    """The other way round: a 1-bit thumbnail first took an 8-bit mask for a bilevel one, and its
    ids 1, 2 and 3 all packed as 1."""
    ids = _ids()
    thumbnail = (ids[::4, ::4] > 1, {"subfiletype": 1, "photometric": "minisblack"})
    pages = decode_mask_pages(_tiff([thumbnail, (ids, {"photometric": "minisblack"})]), "mask.tif")
    assert len(pages) == 1 and pages[0].tolist() == ids.tolist()


@pytest.mark.parametrize("thumbnail_first", [True, False], ids=["thumbnail-first", "thumbnail-after"])
@pytest.mark.parametrize("pages", [1, 2], ids=["one-page", "two-pages"])
def test_a_palette_tiff_mask_saved_with_an_rgb_thumbnail_packs_its_indices(thumbnail_first: bool,
                                                                          pages: int) -> None:
    """A label image saved with a lookup table and an RGB preview (NewSubfileType 1) was refused:
    Pillow's walk of a palette mask's pages read the thumbnail too ("a palette TIFF mask page that
    reads as mode 'RGB'"), and with the thumbnail first the mask was not taken for a palette one
    at all ("a colour mask"). The thumbnail is no page: the mask's pages are its stored indices."""
    colormap = np.zeros((3, 256), np.uint16)
    colormap[0, :4], colormap[1, :4], colormap[2, :4] = [0, 65535, 0, 0], [0, 0, 65535, 0], [0, 0, 0, 65535]
    masks = [_ids(), 3 - _ids()][:pages]
    preview = np.stack([_ids()[::4, ::4] * 60] * 3, -1).astype(np.uint8)
    thumbnail = (preview, {"subfiletype": 1, "photometric": "rgb"})
    writes = [(mask, {"photometric": "palette", "colormap": colormap}) for mask in masks]
    writes.insert(0 if thumbnail_first else 1, thumbnail)
    decoded = decode_mask_pages(_tiff(writes), "mask.tif")
    assert [page.tolist() for page in decoded] == [mask.tolist() for mask in masks]
