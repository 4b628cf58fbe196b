"""Regressions of the raw-bytes DICOM cut walker (cae7eec) and of the stale-temporary cleanup
(f69543f, bff5840): a whole file is never called cut, a whole non-image object is not walked, and
a temporary the file system will not let the build remove is warned of, not raised after publishing.

Files are written by pydicom, then given the bytes real writers add: a private element whose VR a
converter rewrote to UN (undefined length) while its items stayed explicit VR, zero bytes padding
the file to a word or 4-byte boundary, (FFFC,FFFC) Data Set Trailing Padding."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import ImplicitVRLittleEndian, RTStructureSetStorage

import packer.read.dicom as dicom_reader
from packer.read.dicom_cut import HeaderCut, cut_in_header
from packer.records import Excluded
from tests.dicom_files import ct_dataset, save
from tests.test_dicom_exports import write_text_sr
from tests.test_dicom_read import issue_of, probe
from tests.test_interrupts_walk import CLEANUP_LINE, _build, killed_while_writing

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


# ---------------------------------------------------------------- 3. where the walker runs


def rtstruct(path: Path, contours: int) -> Path:
    """An RT Structure Set: a non-image object whose ROI Contour Sequence grows with its contours
    (real ones reach 50-200 MB)."""
    ds = pydicom.dcmread(write_text_sr(path, "P1"))
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = RTStructureSetStorage
    ds.Modality = "RTSTRUCT"
    roi = Dataset()
    roi.ReferencedROINumber = 1
    items = []
    for _ in range(contours):
        item = Dataset()
        item.ContourGeometricType, item.NumberOfContourPoints, item.ContourData = "CLOSED_PLANAR", 4, [1.0] * 12
        items.append(item)
    roi.ContourSequence = DicomSequence(items)
    ds.ROIContourSequence = DicomSequence([roi])
    return save(ds, path)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the probe walks byte by byte (packer.read.dicom_cut.cut_in_header), recorded."""
    walked: list[str] = []

    def recorded(path: str) -> HeaderCut | None:
        walked.append(Path(path).name)
        return cut_in_header(path)

    monkeypatch.setattr(dicom_reader, "cut_in_header", recorded)
    return walked


def test_a_whole_non_image_object_is_left_out_without_walking_its_bytes(tmp_path: Path, walks: list[str]) -> None:
    """cae7eec walked every excluded file without pixel data: a 3.8 MB RTSTRUCT's probe went from
    ~0.01 s to ~0.8 s, a 100 MB one's to tens of seconds. A non-image object whose header pydicom
    reads is left out as not_image, as before, and its bytes are not walked."""
    for path in (rtstruct(tmp_path / "rtstruct.dcm", 500), write_text_sr(tmp_path / "sr.dcm", "P1")):
        result = probe(path)
        assert isinstance(result, Excluded) and result.why == "not_image", result
    assert walks == []


def test_a_non_image_object_cut_where_pydicom_reads_it_is_left_out_as_not_image(tmp_path: Path,
                                                                                walks: list[str]) -> None:
    """Cut inside a contour's (3006,0050) Contour Data value, pydicom reads the header without an
    error: a non-image object's cut is told only where its header cannot be read."""
    data = rtstruct(tmp_path / "whole.dcm", 500).read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:data.index(b"\x06\x30\x50\x00DS", len(data) // 2) + 8 + 10])
    pydicom.dcmread(cut)  # reads
    result = probe(cut)
    assert isinstance(result, Excluded) and result.why == "not_image", result
    assert walks == []


def test_a_non_image_object_cut_where_its_header_cannot_be_read_is_truncated(tmp_path: Path,
                                                                             walks: list[str]) -> None:
    """Cut 10 bytes into the (3006,0039) ROI Contour Sequence's 12-byte header, pydicom raises: the
    walk names the cut."""
    data = rtstruct(tmp_path / "whole.dcm", 50).read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:data.index(b"\x06\x30\x39\x00SQ") + 10])
    message = issue_of(probe(cut), "truncated", "read").message
    assert "RT Structure Set Storage" in message and "10 byte(s) into the header of the element after" in message
    assert "(3006,0039) ROIContourSequence, by its tag" in message, message
    assert walks == ["cut.dcm"]


def test_an_image_class_file_without_pixels_is_still_walked(tmp_path: Path, walks: list[str]) -> None:
    """The scope cae7eec replaced: a CT without its Image Pixel module, cut inside an element's value,
    is truncated (pydicom keeps the partial value without a word)."""
    whole = ct_without_pixels(tmp_path / "ct.dcm").read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(whole[:whole.index(b"TestScanner 9000") + 4])
    message = issue_of(probe(cut), "truncated", "read").message
    assert "(0008,1090) ManufacturerModelName" in message and "holds 4 of them" in message, message
    assert walks == ["cut.dcm"]


# ---------------------------------------------------------------- 4. stale temporaries the file system keeps


def test_a_stale_temporary_the_build_cannot_remove_is_warned_of_not_raised_after_publishing(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A killed build's report and registry copy temporaries, in a version folder and a registry
    folder the file system will not let the next build remove from (read-only: unlink refused;
    chmod does not stop root, so the refusal is made by patching unlink). The build published
    first, then raised PermissionError; it now finishes, leaves them, and warns of each, naming it
    and the fix."""
    out, registry = tmp_path / "out", tmp_path / "manifests"
    version = _build(demo_raw.root, out, registry, tmp_path / "job", quiet=True).version_dir
    report = killed_while_writing(version / "report.html")
    copy = killed_while_writing(registry / "demo" / f"{version.name}.json")
    unlink = Path.unlink

    def refused(self: Path, missing_ok: bool = False) -> None:
        if self in (report, copy):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    capsys.readouterr()
    result = _build(demo_raw.root, out, registry, tmp_path / "job", quiet=False)
    assert result.version_dir == version and result.registry_copy == registry / "demo" / f"{version.name}.json"
    assert report.exists() and copy.exists()
    captured = capsys.readouterr()
    assert CLEANUP_LINE not in captured.out  # nothing was removed
    for left, fix in ((report, f"run `packer gc {out / 'demo'}`"), (copy, "remove it by hand")):
        assert f"packer: warning: cannot remove {left}, a temporary file an interrupted build left: Permission " \
               "denied" in captured.err, captured.err
        assert fix in captured.err.split(str(left), 1)[1].split("\n", 1)[0]
    # the published version is not written into to record the folder's leftover (a read-only one cannot be)
    recorded = (version / "warnings.jsonl").read_text() if (version / "warnings.jsonl").exists() else ""
    assert str(report) not in recorded


# -- many whole UN sequences, and a UN in a big-endian file: a later cut is still told (s75j) ----------


def _un_item(body: bytes) -> bytes:
    return struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF) + body + struct.pack("<HHI", 0xFFFE, 0xE00D, 0)


def test_a_cut_after_hundreds_of_whole_un_sequences_is_still_truncated(tmp_path: Path) -> None:
    """A Philips enhanced MR converted to explicit VR without the vendor dictionary holds a private
    UN of undefined length in each of its per-frame items, implicit VR inside (PS3.5 6.2.2). Every
    one reads whole: the bound on readings counts only readings that fail, so the 300th UN does not
    end the walk, and a cut after them is named."""
    creator = b"Philips MR Imaging DD 005 "
    un = (struct.pack("<HH2s2xI", 0x2005, 0x140F, b"UN", 0xFFFFFFFF)
          + _un_item(struct.pack("<HHI", 0x0008, 0x0100, 4) + b"ABCD") + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0))
    frame = _un_item(struct.pack("<HH2sH", 0x2005, 0x0010, b"LO", len(creator)) + creator + un)
    path = ct_without_pixels(tmp_path / "ct.dcm")
    whole = path.read_bytes() + (struct.pack("<HH2s2xI", 0x5200, 0x9230, b"SQ", 0xFFFFFFFF) + frame * 300
                                 + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)
                                 + struct.pack("<HH2s2xI", 0x6001, 0x1000, b"OB", 1000) + b"\x01" * 1000)
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(whole[:-500])
    issue_of(probe(cut), "truncated")


def test_a_un_in_a_big_endian_file_is_read_little_endian_and_a_later_cut_is_truncated(tmp_path: Path) -> None:
    """A UN's value is implicit VR little endian, item tags included, in an Explicit VR Big Endian
    file too (PS3.5 6.2.2): its items are read so, and a cut after it is still named."""
    path = ct_without_pixels(tmp_path / "ct.dcm", "1.2.840.10008.1.2.2")
    inner = struct.pack("<HHI", 0x0008, 0x0100, 4) + b"ABCD"
    un = (struct.pack(">HH2sH", 0x0041, 0x0010, b"LO", 4) + b"ACME"
          + struct.pack(">HH2s2xI", 0x0041, 0x1001, b"UN", 0xFFFFFFFF)
          + _un_item(inner) + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0))
    whole = (path.read_bytes() + un + struct.pack(">HH2sH", 0x0043, 0x0010, b"LO", 4) + b"ACME"
             + struct.pack(">HH2s2xI", 0x0043, 0x1000, b"OB", 1000) + b"\x01" * 1000)
    (tmp_path / "whole.dcm").write_bytes(whole)
    assert cut_in_header(str(tmp_path / "whole.dcm")) is None
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(whole[:-500])
    issue_of(probe(cut), "truncated")
