"""DICOM codestreams at the edges of their transfer syntaxes: a lossy codestream's reconstruction
overshoot past Bits Stored's range, and JPIP Referenced files whose pixels are on a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import imagecodecs
import numpy as np
import pytest
from dicom_files import ct_dataset, make_ref, save
from pydicom.encaps import encapsulate
from pydicom.uid import JPEG2000, JPEG2000Lossless, JPEGLSLossless, JPEGLSNearLossless

from packer.config import DicomTransformConfig
from packer.read.dicom import read_dicom
from packer.records import Issue


def _image(signed: bool) -> np.ndarray:
    """A 12-bit CT slice with both ends of Bits Stored's range saturated (metal right, the
    scanner's floor left) and a mid-grey rest: the pixels a lossy coder overshoots."""
    low, high = (-2048, 2047) if signed else (0, 4095)
    img = np.full((64, 72), (low + high) // 2, np.int16 if signed else np.uint16)
    img[:, 48:] = high
    img[:, :12] = low
    img[20:40, 20:30] = low + 1000
    return img


def _encode(syntax: str, img: np.ndarray, reversible: bool = False) -> bytes:
    """``img`` as one frame's codestream for ``syntax``, its precision Bits Allocated (16), not
    Bits Stored (12): JPEG-LS codes a signed image as its two's-complement bits (PS3.5 A.4.4)."""
    if syntax in (JPEG2000, JPEG2000Lossless):
        return bytes(imagecodecs.jpeg2k_encode(img, level=0 if reversible else 90, codecformat="J2K",
                                               reversible=reversible))
    return bytes(imagecodecs.jpegls_encode(img.view(np.uint16), level=0 if syntax == JPEGLSLossless else 3))


def _file(tmp_path: Path, syntax: str, frame: bytes, img: np.ndarray) -> Path:
    ds = ct_dataset(img, center=None, width=None)
    ds.BitsStored, ds.HighBit = 12, 11
    ds.file_meta.TransferSyntaxUID = syntax
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    return save(ds, tmp_path / f"{syntax}.dcm")


def _hu(path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    out = read_dicom(make_ref(path), DicomTransformConfig(windows=(), output="float16"))
    assert isinstance(out, list), getattr(out, "message", "")
    return out[0].image[0].astype(np.float64), out[0].metadata


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("syntax", [JPEG2000, JPEGLSNearLossless], ids=["jpeg2000-lossy", "jpeg-ls-near-lossless"])
def test_a_lossy_codestreams_overshoot_past_bits_stored_is_clipped_not_wrapped(
        tmp_path: Path, syntax: str, signed: bool) -> None:
    """Lossy JPEG 2000 and near-lossless JPEG-LS reconstruct a saturated pixel a few levels past
    Bits Stored's range (4095 → 4098; -2048 → -2052). Masked to the 12 stored bits, as a garbage
    bit above High Bit is, metal (3071 HU) packed as air (-1024 HU) and the floor as bright: the
    values are clipped to the range instead, and the sample says how many."""
    img = _image(signed)
    frame = _encode(syntax, img)
    decoded = (imagecodecs.jpeg2k_decode(frame) if syntax == JPEG2000 else
               imagecodecs.jpegls_decode(frame).view(img.dtype)).astype(np.int64)
    low, high = (-2048, 2047) if signed else (0, 4095)
    outside = int(((decoded < low) | (decoded > high)).sum())
    assert outside > 0, "the codestream no longer overshoots: the test shows nothing"
    hu, metadata = _hu(_file(tmp_path, syntax, frame, img))
    error = np.abs(hu - (img.astype(np.float64) - 1024)).max()
    assert error <= 64, f"packed {error} HU from the original somewhere (a wrapped pixel is ~4096 off)"
    # the range's ends in HU, as float16 holds them (3071 is 3072)
    floor, ceiling = (float(np.float16(end - 1024)) for end in (low, high))
    assert floor <= hu.min() and hu.max() <= ceiling  # clipped: not one value past either end
    notes = [note for note in metadata.get("warnings", []) if "clipped" in note]
    assert len(notes) == 1, metadata.get("warnings")
    assert f"{outside} decoded value(s)" in notes[0] and "(0028,0101) Bits Stored 12" in notes[0]


def test_a_lossless_codestream_in_a_lossy_capable_syntax_keeps_its_stored_bits_only(tmp_path: Path) -> None:
    """A reversible (lossless) JPEG 2000 codestream under the lossy-capable 1.2.840.10008.1.2.4.91,
    its 4 bits above High Bit holding garbage as some modalities write them: almost every pixel
    lies far outside 12 bits, which is no reconstruction error: the low 12 bits are the pixels,
    bit for bit (PS3.5 8.1.1), and nothing is clipped."""
    rng = np.random.default_rng(6)
    stored = rng.integers(0, 4096, (32, 32)).astype(np.uint16)
    raw = stored | (rng.integers(1, 16, (32, 32)).astype(np.uint16) << 12)
    hu, metadata = _hu(_file(tmp_path, JPEG2000, _encode(JPEG2000, raw, reversible=True), stored))
    np.testing.assert_array_equal(hu, (stored.astype(np.float64) - 1024).astype(np.float16))
    assert not [note for note in metadata.get("warnings", []) if "clipped" in note]


@pytest.mark.parametrize("syntax", [JPEG2000Lossless, JPEGLSLossless], ids=["jpeg2000-lossless", "jpeg-ls-lossless"])
def test_a_lossless_only_syntax_reads_values_past_bits_stored_as_its_stored_bits(
        tmp_path: Path, syntax: str) -> None:
    """Under a lossless-only syntax a decoded value is the value written: one just past 12 bits
    (4097) carries bit 12, above High Bit, which is no pixel data (PS3.5 8.1.1): it is masked (to
    1) as native data is, never clipped as a lossy overshoot would be."""
    img = np.full((32, 32), 1000, np.uint16)
    img[:, 16:] = 4097
    raw = _encode(syntax, img, reversible=True) if syntax == JPEG2000Lossless else _encode(syntax, img)
    hu, metadata = _hu(_file(tmp_path, syntax, raw, img))
    np.testing.assert_array_equal(hu, (img & 0x0FFF).astype(np.float64) - 1024)
    assert not [note for note in metadata.get("warnings", []) if "clipped" in note]


def _jpip_file(tmp_path: Path, syntax: str, url: str | None) -> Path:
    """A JPIP Referenced CT header: no (7FE0,0010) Pixel Data, its pixels on the JPIP server
    that (0028,7FE0) Pixel Data Provider URL names (PS3.5 A.6)."""
    ds = ct_dataset(np.zeros((64, 64), np.uint16))
    ds.BitsStored, ds.HighBit = 12, 11
    ds.file_meta.TransferSyntaxUID = syntax
    del ds.PixelData
    if url is not None:
        ds.PixelDataProviderURL = url
    return save(ds, tmp_path / f"{syntax}.dcm")


@pytest.mark.parametrize("syntax", ["1.2.840.10008.1.2.4.94", "1.2.840.10008.1.2.4.95", "1.2.840.10008.1.2.4.204",
                                    "1.2.840.10008.1.2.4.205"])
def test_a_jpip_referenced_file_is_told_to_fetch_its_pixels_from_the_server_not_to_transcode(
        tmp_path: Path, syntax: str) -> None:
    """A JPIP Referenced (Deflate; HTJ2K) file holds no pixels to transcode: dcmconv or gdcmconv
    cannot help. The message names the server's URL and says to retrieve the instances from the
    PACS in a transfer syntax that carries the pixels."""
    url = "http://pacs.example.org/jpip?target=" + "7" * 300
    out = read_dicom(make_ref(_jpip_file(tmp_path, syntax, url)), DicomTransformConfig(windows=(), output="float16"))
    assert isinstance(out, Issue) and out.reason == "unsupported_transfer_syntax", out
    assert "dcmconv" not in out.message and "gdcmconv" not in out.message
    assert "JPIP" in out.message and "(0028,7FE0) Pixel Data Provider URL" in out.message
    assert "'http://pacs.example.org/jpip?target=777" in out.message and "7" * 300 not in out.message
    assert "Explicit VR Little Endian" in out.message and "retrieve" in out.message


def test_a_jpip_referenced_file_without_its_url_says_it_has_none(tmp_path: Path) -> None:
    out = read_dicom(make_ref(_jpip_file(tmp_path, "1.2.840.10008.1.2.4.94", None)),
                     DicomTransformConfig(windows=(), output="float16"))
    assert isinstance(out, Issue) and out.reason == "unsupported_transfer_syntax", out
    assert "dcmconv" not in out.message and "no (0028,7FE0) Pixel Data Provider URL" in out.message
