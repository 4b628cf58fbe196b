"""DICOM files damaged the way a mutation walk damages them: a copy cut short inside its header,
a Bits Allocated that no longer matches the codestream. Each is a bad sample whose reason and
message say what is wrong and what to do, not a misleading reason or a decoder's internal error."""

from __future__ import annotations

import struct
from pathlib import Path

import pydicom
import pytest
from dicom_files import ct_dataset, save, window
from pydicom.data import get_testdata_file
from pydicom.uid import ImplicitVRLittleEndian
from test_dicom_read import issue_of, probe, read  # the DICOM reader's test helpers

from packer.records import Issue

# ---------------------------------------------------------------- a copy cut short inside its header


UID = "1.2.826.0.1.3680043.8.498.1234567890123456789012345678901234"  # 60 characters: no padding


def value_at(data: bytes, group: int, element: int, vr: bytes) -> tuple[int, int]:
    """Offset and length of an Explicit VR Little Endian short-form element's value in ``data``."""
    at = data.find(struct.pack("<HH", group, element) + vr)
    assert at > 0
    return at + 8, struct.unpack_from("<H", data, at + 6)[0]


def ct_file(tmp_path: Path) -> bytes:
    ds = ct_dataset(SeriesInstanceUID=UID)
    return save(ds, tmp_path / "whole.dcm").read_bytes()


@pytest.mark.parametrize("where", ["first byte", "middle", "all but the last byte"])
def test_file_cut_inside_a_header_value_is_truncated_not_no_pixel_data(tmp_path: Path, where: str) -> None:
    data = ct_file(tmp_path)
    start, length = value_at(data, 0x0020, 0x000E, b"UI")  # before the Image Pixel module (0028,xxxx)
    kept = {"first byte": 1, "middle": length // 2, "all but the last byte": length - 1}[where]
    path = tmp_path / "cut.dcm"
    path.write_bytes(data[:start + kept])
    for result in (probe(path), read(path)):
        found = issue_of(result, "truncated", "read")
        assert "(0020,000E)" in found.message and "SeriesInstanceUID" in found.message
        assert f"{length} bytes" in found.message and f"{kept} of them" in found.message
        assert "copy it again" in found.message and "export it again" not in found.message


def test_file_cut_inside_a_header_value_in_implicit_vr_is_truncated(tmp_path: Path) -> None:
    ds = ct_dataset(SeriesInstanceUID=UID)
    whole = tmp_path / "whole.dcm"
    ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
    save(ds, whole)
    assert pydicom.dcmread(whole).file_meta.TransferSyntaxUID == ImplicitVRLittleEndian
    data = whole.read_bytes()
    at = data.find(struct.pack("<HHL", 0x0020, 0x000E, len(UID)))  # implicit VR: tag, 4-byte length
    path = tmp_path / "cut.dcm"
    path.write_bytes(data[:at + 8 + 10])
    for result in (probe(path), read(path)):
        assert "(0020,000E)" in issue_of(result, "truncated", "read").message


def test_file_ending_cleanly_between_elements_without_pixels_stays_no_pixel_data(tmp_path: Path) -> None:
    """Cut exactly after a whole element, nothing tells a cut from a header exported without its
    pixels: the reason stays no_pixel_data."""
    data = ct_file(tmp_path)
    start, length = value_at(data, 0x0020, 0x000E, b"UI")
    path = tmp_path / "header_only.dcm"
    path.write_bytes(data[:start + length])
    for result in (probe(path), read(path)):
        found = issue_of(result, "no_pixel_data", "validate")
        assert "cut short" not in found.message


@pytest.mark.parametrize("into", [1, 4, 7])
def test_file_cut_inside_the_next_elements_header_is_truncated(tmp_path: Path, into: int) -> None:
    """pydicom drops a trailing element header cut short (1 to 7 of its 8 bytes) without a word: the
    cut copy read as a header exported without its pixels, as about a third of header cuts did."""
    data = ct_file(tmp_path)
    start, length = value_at(data, 0x0020, 0x000E, b"UI")
    path = tmp_path / "cut.dcm"
    path.write_bytes(data[:start + length + into])
    for result in (probe(path), read(path)):
        found = issue_of(result, "truncated", "read")
        assert f"ends {into} byte(s) into the header of the element after (0020,000E)" in found.message, found
        assert "copy it again" in found.message


# ---------------------------------------------------------------- Bits Allocated wider than the JPEG decoder returns


def with_bits_allocated(name: str, bits: int, tmp_path: Path) -> Path:
    ds = pydicom.dcmread(get_testdata_file(name))
    ds.BitsAllocated = bits
    ds.BurnedInAnnotation = "NO"
    return save(ds, tmp_path / f"{Path(name).stem}_ba{bits}.dcm")


@pytest.mark.parametrize(("name", "precision", "bits"), [
    ("SC_rgb_jpeg_dcmtk.dcm", 8, 16),   # JPEG Baseline (Process 1): 8-bit samples only
    ("SC_rgb_jpeg_gdcm.dcm", 8, 16),    # JPEG Lossless SV1, an 8-bit codestream
    ("JPGExtended.dcm", 12, 32),        # JPEG Extended, 12-bit: libjpeg returns 16-bit samples
])
def test_jpeg_codestream_narrower_than_bits_allocated_is_bad_shape_naming_both(
        tmp_path: Path, name: str, precision: int, bits: int) -> None:
    """pylibjpeg-libjpeg returns an ISO 10918 codestream's samples in 8 bits (precision up to 8)
    or 16, and pydicom lays them out by Bits Allocated: a wider Bits Allocated failed in numpy
    ("could not broadcast input array from shape (15000,) into shape (30000,)")."""
    found = issue_of(read(with_bits_allocated(name, bits, tmp_path), window(2048.0, 4096.0)), "bad_shape", "validate")
    assert f"{precision}-bit" in found.message and f"(0028,0100) Bits Allocated is {bits}" in found.message
    assert "broadcast" not in found.message and "fix Bits Allocated" in found.message


@pytest.mark.parametrize(("name", "bits"), [
    ("JPGExtended.dcm", 16),                # 12-bit JPEG Extended in 16 bits: as written
    ("SC_rgb_jpeg_dcmtk.dcm", 8),           # 8-bit JPEG Baseline as written
    ("JPEGLSNearLossless_08.dcm", 16),      # 8-bit JPEG-LS: pydicom sizes the container by its precision
    ("examples_jpeg2k.dcm", 16),            # 8-bit JPEG 2000: likewise
    ("MR_small_jpeg_ls_lossless.dcm", 16),  # 16-bit JPEG-LS, 16-bit JPEG 2000, as written
    ("MR_small_jp2klossless.dcm", 16),
])
def test_jpeg_codestreams_the_decoder_lays_out_in_bits_allocated_still_decode(
        tmp_path: Path, name: str, bits: int) -> None:
    result = read(with_bits_allocated(name, bits, tmp_path), window(2048.0, 4096.0))
    assert not isinstance(result, Issue), result.message
    assert result and result[0].image.size > 0
