"""Regressions of the raw-bytes DICOM cut walker (cae7eec) and of the stale-temporary cleanup
(f69543f, bff5840): a whole file is never called cut, a whole non-image object is not walked, and
a temporary the file system will not let the build remove is warned of, not raised after publishing.

Files are written by pydicom, then given the bytes real writers add: a private element whose VR a
converter rewrote to UN (undefined length) while its items stayed explicit VR, zero bytes padding
the file to a word or 4-byte boundary, (FFFC,FFFC) Data Set Trailing Padding."""

from __future__ import annotations

import struct
from pathlib import Path

import pydicom
import pytest
from pydicom.uid import ImplicitVRLittleEndian

from packer.read.dicom_cut import cut_in_header
from packer.records import Excluded
from tests.dicom_files import ct_dataset, save
from tests.test_dicom_exports import write_text_sr
from tests.test_dicom_read import issue_of, probe

PIXEL_MODULE = ("Rows", "Columns", "BitsAllocated", "BitsStored", "HighBit", "PixelRepresentation",
                "SamplesPerPixel", "PhotometricInterpretation", "PixelData")


def ct_without_pixels(path: Path, syntax: str | None = None) -> Path:
    """A CT slice exported without its Image Pixel module: `no_pixel_data` when whole, `truncated`
    when cut inside its header (README's reason table): the one image-class file the walker judges
    after a header pydicom read."""
    ds = ct_dataset()
    for keyword in PIXEL_MODULE:
        delattr(ds, keyword)
    if syntax is not None:
        ds.file_meta.TransferSyntaxUID = syntax
    return save(ds, path)


def un_sequence(explicit_items: bool, code: bytes = b"ABCD") -> bytes:
    """(0041,0010) private creator and (0041,1001) UN of undefined length holding one
    undefined-length item with (0008,0100) Code Value, in explicit VR little endian, the item's
    elements explicit (what converters and anonymisers write when an SQ becomes UN) or implicit
    (PS3.5 6.2.2)."""
    if explicit_items:
        inner = struct.pack("<HH2sH", 0x0008, 0x0100, b"SH", len(code)) + code
    else:
        inner = struct.pack("<HHI", 0x0008, 0x0100, len(code)) + code
    return (struct.pack("<HH2sH", 0x0041, 0x0010, b"LO", 4) + b"ACME"
            + struct.pack("<HH2s2xI", 0x0041, 0x1001, b"UN", 0xFFFFFFFF)
            + struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF) + inner + struct.pack("<HHI", 0xFFFE, 0xE00D, 0)
            + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0))


def appended(path: Path, tail: bytes) -> Path:
    path.write_bytes(path.read_bytes() + tail)
    return path


# ---------------------------------------------------------------- 1. UN of undefined length, explicit items


@pytest.mark.parametrize("explicit_items", [True, False])
def test_a_whole_file_with_an_undefined_length_un_is_whole_whatever_its_items_vr(tmp_path: Path,
                                                                                 explicit_items: bool) -> None:
    """pydicom reads a UN of undefined length as a sequence, each item's elements explicit or
    implicit as their first header shows; the walker read them implicit only, so explicit items
    made a whole file `truncated` ("ends inside (0008,0100) CodeValue in item 1 of (0041,1001)")."""
    path = appended(ct_without_pixels(tmp_path / "ct.dcm"), un_sequence(explicit_items))
    assert pydicom.dcmread(path)[0x00411001].value[0].CodeValue == "ABCD"  # whole: pydicom reads it
    assert cut_in_header(str(path)) is None
    result = probe(path)
    assert "CT Image Storage" in issue_of(result, "no_pixel_data").message


@pytest.mark.parametrize("explicit_items", [True, False])
def test_a_cut_inside_an_undefined_length_un_is_still_truncated(tmp_path: Path, explicit_items: bool) -> None:
    """Cut inside the item's Code Value: in either encoding the file ends inside the UN."""
    whole = appended(ct_without_pixels(tmp_path / "ct.dcm"), un_sequence(explicit_items, b"ABCDEFGH"))
    data = whole.read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:data.index(b"ABCDEFGH") + 3])
    message = issue_of(probe(cut), "truncated", "read").message
    assert "(0008,0100) CodeValue in item 1 of (0041,1001)" in message and "holds 3 of them" in message, message


def test_a_whole_sr_with_explicit_items_in_a_un_is_left_out_as_not_image(tmp_path: Path) -> None:
    """The repro: a whole SR holding such a UN was `truncated`."""
    path = appended(write_text_sr(tmp_path / "sr.dcm", "P1"), un_sequence(True))
    result = probe(path)
    assert isinstance(result, Excluded) and result.why == "not_image", result


# ---------------------------------------------------------------- 2. padding after the last element


@pytest.mark.parametrize("zeros", [2, 3, 4, 6, 7, 8, 10, 100])
@pytest.mark.parametrize("syntax", [None, ImplicitVRLittleEndian])
def test_zero_bytes_after_the_last_element_are_padding_not_a_cut(tmp_path: Path, zeros: int,
                                                                 syntax: str | None) -> None:
    """Writers pad a file to a word or 4-byte boundary with zeros; group 0000 never appears in a
    stored data set, so two zero bytes or more start no element: the file is whole (`no_pixel_data`
    for a CT without pixels, as without the padding), not cut inside a next element's header. (One
    zero byte may be the start of a tag: (6000,xxxx) Overlay in little endian, (00xx,xxxx) in big.)"""
    path = appended(ct_without_pixels(tmp_path / "ct.dcm", syntax), b"\0" * zeros)
    assert cut_in_header(str(path)) is None
    issue_of(probe(path), "no_pixel_data")


def test_a_sr_padded_with_zeros_is_left_out_as_not_image(tmp_path: Path) -> None:
    path = appended(write_text_sr(tmp_path / "sr.dcm", "P1"), b"\0\0")
    result = probe(path)
    assert isinstance(result, Excluded) and result.why == "not_image", result


def test_trailing_padding_element_ends_a_whole_data_set(tmp_path: Path) -> None:
    """(FFFC,FFFC) Data Set Trailing Padding (PS3.10 7.2) is the data set's last element; its
    bytes mean nothing, so zeros after it or a value cut short inside it are no cut of the header."""
    padding = struct.pack("<HH2s2xI", 0xFFFC, 0xFFFC, b"OB", 16) + b"\0" * 16
    whole = appended(ct_without_pixels(tmp_path / "ct.dcm"), padding)
    assert cut_in_header(str(whole)) is None
    issue_of(probe(whole), "no_pixel_data")
    assert cut_in_header(str(appended(whole, b"\0\0"))) is None
    short = tmp_path / "short.dcm"
    short.write_bytes(whole.read_bytes()[:-10])
    assert cut_in_header(str(short)) is None


def test_a_non_zero_tail_is_still_a_cut_header(tmp_path: Path) -> None:
    """Only zeros are padding: 2 bytes of a next element's tag are a cut (the rule README states),
    and so is one zero byte, the first of an Overlay group's (6000,xxxx) tag."""
    whole = ct_without_pixels(tmp_path / "ct.dcm").read_bytes()
    for tail in (b"\x08\x00", b"\x00"):
        path = tmp_path / "cut.dcm"
        path.write_bytes(whole + tail)
        message = issue_of(probe(path), "truncated", "read").message
        assert f"ends {len(tail)} byte(s) into the header of the element after" in message, message
