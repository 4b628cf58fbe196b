"""A PACS export copied with interruptions: a DICOM file cut short inside its header is `truncated`
(README, reason table: "a DICOM file that ends inside a header element's value ...; or inside the
next element's 8- or 12-byte header"), naming the element, wherever the cut falls: inside an element's
value, an element's 8- or 12-byte header, a sequence item's 8-byte header, an undefined-length
sequence or item before its delimiter; in explicit or implicit VR, little or big endian, deflated.
pydicom raises on some of these cuts ("unpack requires a buffer of 4 bytes", "No tag to read") and
drops others silently; none of that reaches the record. A cut image-class file is a bad sample: a
header read short is not judged as what it holds; a non-image object (an SR) only where its header
cannot be read (its bytes are not walked where pydicom reads it: a 100 MB RTSTRUCT would take seconds)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence as DicomSequence
from pydicom.uid import DeflatedExplicitVRLittleEndian, ExplicitVRBigEndian, ImplicitVRLittleEndian

from packer.read.dicom_meta import META_START, meta_elements
from packer.records import Excluded, Issue
from tests.dicom_files import ct_dataset, save
from tests.test_dicom_exports import write_text_sr
from tests.test_dicom_read import issue_of, probe, read

RAW_ERRORS = ("unpack requires", "OSError", "No tag to read", "error:", "no data set after")


def codes(*values: str) -> DicomSequence:
    items = []
    for value in values:
        item = Dataset()
        item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, "99", f"meaning {value}"
        items.append(item)
    return DicomSequence(items)


def ct_with_sequence(tmp_path: Path, syntax: str | None = None, undefined: bool = False) -> bytes:
    """A CT slice whose (0008,1032) Procedure Code Sequence (three items) precedes its Image Pixel module."""
    ds = ct_dataset()
    ds.ProcedureCodeSequence = codes("X0", "X1", "X2")
    if undefined:
        ds["ProcedureCodeSequence"].is_undefined_length = True
        for item in ds.ProcedureCodeSequence:
            item.is_undefined_length_sequence_item = True
    if syntax is not None:
        ds.file_meta.TransferSyntaxUID = syntax
    return save(ds, tmp_path / "whole.dcm").read_bytes()


def data_set_start(data: bytes) -> int:
    *_, (_, at, length) = meta_elements(data[:1 << 16])
    return at + length


def cut_file(tmp_path: Path, data: bytes, at: int, name: str = "cut.dcm.part") -> Path:
    path = tmp_path / name
    path.write_bytes(data[:at])
    return path


def truncated(path: Path, *named: str) -> str:
    """The message of ``path``'s truncated record, probe and read alike, naming ``named``."""
    messages = []
    for result in (probe(path), read(path)):
        message = issue_of(result, "truncated", "read").message
        assert not any(raw in message for raw in RAW_ERRORS), message
        assert "copy it again" in message
        for text in named:
            assert text in message, message
        messages.append(message)
    assert messages[0] == messages[1]
    return messages[0]


SEQUENCE_TAG = {"<": b"\x08\x00\x32\x10", ">": b"\x00\x08\x10\x32"}


@pytest.mark.parametrize("syntax", [None, ImplicitVRLittleEndian, ExplicitVRBigEndian])
def test_cut_inside_a_sequence_header_is_truncated_naming_the_sequence(tmp_path: Path, syntax: str | None) -> None:
    data = ct_with_sequence(tmp_path, syntax)
    at = data.index(SEQUENCE_TAG[">" if syntax == ExplicitVRBigEndian else "<"], data_set_start(data))
    head = 8 if syntax == ImplicitVRLittleEndian else 12
    for into in range(4, head):  # its tag is there: named
        truncated(cut_file(tmp_path, data, at + into), f"ends {into} byte(s) into the header of the element after "
                  "(0008,", "((0008,1032) ProcedureCodeSequence, by its tag)")
    for into in range(1, 4):  # its tag is not: the element before it is named
        truncated(cut_file(tmp_path, data, at + into), f"ends {into} byte(s) into the header of the element after")


@pytest.mark.parametrize("syntax", [None, ImplicitVRLittleEndian, ExplicitVRBigEndian])
def test_cut_inside_an_item_header_is_truncated_naming_its_sequence(tmp_path: Path, syntax: str | None) -> None:
    data = ct_with_sequence(tmp_path, syntax)
    at = data.index(SEQUENCE_TAG[">" if syntax == ExplicitVRBigEndian else "<"], data_set_start(data))
    first_item = at + (8 if syntax == ImplicitVRLittleEndian else 12)
    for into in range(1, 8):
        truncated(cut_file(tmp_path, data, first_item + into), f"ends {into} byte(s) into the header of item 1 of "
                  "(0008,1032) ProcedureCodeSequence")


def test_cut_inside_the_first_element_header_is_truncated_not_an_empty_data_set(tmp_path: Path) -> None:
    data = ct_with_sequence(tmp_path)
    start = data_set_start(data)
    for into in range(1, 8):
        truncated(cut_file(tmp_path, data, start + into), f"ends {into} byte(s) into the header of",
                  "the data set's first element")


def test_cut_inside_an_element_of_an_item_names_the_element_the_item_and_the_sequence(tmp_path: Path) -> None:
    data = ct_with_sequence(tmp_path)
    at = data.index(b"\x08\x00\x04\x01LO", data_set_start(data))  # item 1's (0008,0104) Code Meaning
    truncated(cut_file(tmp_path, data, at + 8 + 3), "(0008,0104) CodeMeaning in item 1 of (0008,1032) "
              "ProcedureCodeSequence", "holds 3 of them")
    truncated(cut_file(tmp_path, data, at + 5), "ends 5 byte(s) into the header of the element after (0008,0102) "
              "CodingSchemeDesignator in item 1", "(0008,0104) CodeMeaning in item 1 of (0008,1032) "
              "ProcedureCodeSequence, by its tag")


def test_cut_inside_undefined_length_sequence_and_items_is_truncated_before_their_delimiters(tmp_path: Path) -> None:
    data = ct_with_sequence(tmp_path, undefined=True)
    start = data_set_start(data)
    item_end = data.index(b"\xfe\xff\x0d\xe0\x00\x00\x00\x00", start)  # item 1's Item Delimitation Item
    truncated(cut_file(tmp_path, data, item_end), "inside item 1 of (0008,1032) ProcedureCodeSequence, whose length "
              "is undefined, before its (FFFE,E00D) Item Delimitation Item")
    truncated(cut_file(tmp_path, data, item_end + 5), "5 byte(s) into the (FFFE,E00D) Item Delimitation Item of item "
              "1 of (0008,1032)")
    sequence_end = data.index(b"\xfe\xff\xdd\xe0\x00\x00\x00\x00", start)
    truncated(cut_file(tmp_path, data, sequence_end), "inside (0008,1032) ProcedureCodeSequence, whose length is "
              "undefined, after 3 item(s) and before its (FFFE,E0DD) Sequence Delimitation Item")
    for into in range(1, 8):
        truncated(cut_file(tmp_path, data, sequence_end + into), "ProcedureCodeSequence")
    whole_header = cut_file(tmp_path, data, sequence_end + 8)  # the sequence whole, then nothing: a clean end
    assert isinstance(probe(whole_header), Issue) and probe(whole_header).reason == "no_pixel_data"


def test_a_deflated_data_set_that_ends_inside_an_item_header_is_truncated(tmp_path: Path) -> None:
    """A whole deflate stream around a data set cut short (the stream itself cut is zlib's verdict)."""
    data = ct_with_sequence(tmp_path, DeflatedExplicitVRLittleEndian)
    start = data_set_start(data)
    plain = zlib.decompress(data[start:], -zlib.MAX_WBITS)
    at = plain.index(SEQUENCE_TAG["<"]) + 12 + 3  # 3 bytes into item 1's header
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    path = tmp_path / "deflated.dcm"
    path.write_bytes(data[:start] + packer.compress(plain[:at]) + packer.flush())
    message = truncated(path, "3 byte(s) into the header of item 1 of (0008,1032) ProcedureCodeSequence")
    assert "deflated" in message and "inflated data set" in message


def test_a_damaged_item_tag_in_a_whole_file_is_not_called_truncated(tmp_path: Path) -> None:
    """Files unparseable for other reasons keep their verdict: an item tag overwritten is no cut."""
    data = bytearray(ct_with_sequence(tmp_path, undefined=True))
    at = data.index(SEQUENCE_TAG["<"], data_set_start(bytes(data))) + 12
    data[at:at + 4] = b"\x08\x00\x00\x01"  # an element's tag where item 1's should be
    path = tmp_path / "damaged.dcm"
    path.write_bytes(bytes(data))
    result = probe(path)
    assert not (isinstance(result, Issue) and result.reason == "truncated"), result


def top_level_ends(tmp_path: Path, whole: Path) -> set[int]:
    """The file sizes at which the data set of ``whole`` ends cleanly after a top-level element:
    the sizes of the files holding its first k elements, written by pydicom."""
    ds = pydicom.dcmread(whole)
    ends = set()
    for k in range(1, len(ds) + 1):
        part = Dataset()
        part.file_meta = ds.file_meta
        for elem in list(ds)[:k]:
            part.add(elem)
        ends.add(save(part, tmp_path / "part.dcm").stat().st_size)
    return ends


@pytest.mark.parametrize("undefined", [False, True])
def test_a_structured_report_cut_at_every_offset_is_truncated_or_left_out_never_unreadable(
        tmp_path: Path, undefined: bool) -> None:
    """A cut SR was not_image (left out) at most offsets and unreadable at others, with pydicom's raw
    error. Cut where pydicom cannot read its header (inside a sequence's or an item's header, an
    undefined-length sequence or item), the SR is a truncated bad sample, the cut named; cut where
    pydicom reads it without an error, a non-image object is left out as not_image unwalked, as the
    whole one is; cut exactly after a whole top-level element nothing tells it from an SR that ends
    there."""
    whole = write_text_sr(tmp_path / "sr.dcm", "P1")
    if undefined:
        ds = pydicom.dcmread(whole)
        for keyword in ("ConceptNameCodeSequence", "ContentSequence"):
            ds[keyword].is_undefined_length = True
            for item in ds[keyword].value:
                item.is_undefined_length_sequence_item = True
        save(ds, whole)
    data = whole.read_bytes()
    assert isinstance(probe(whole), Excluded) and probe(whole).why == "not_image"
    clean = top_level_ends(tmp_path, whole)
    assert len(data) in clean
    seen = {"truncated": 0, "not_image": 0}
    for at in range(data_set_start(data) + 1, len(data)):
        result = probe(cut_file(tmp_path, data, at))
        if at in clean or isinstance(result, Excluded):
            assert isinstance(result, Excluded) and result.why == "not_image", (at, result)
            seen["not_image"] += 1
        else:
            assert isinstance(result, Issue) and result.reason == "truncated", (at, result)
            assert "Basic Text SR" in result.message and not any(raw in result.message for raw in RAW_ERRORS)
            seen["truncated"] += 1
    assert seen["not_image"] > 100 and seen["truncated"] >= 8


def test_cut_inside_the_file_meta_stays_unreadable(tmp_path: Path) -> None:
    """The walk reads the data set; a file cut inside its file meta keeps the reader's own verdict."""
    data = ct_with_sequence(tmp_path)
    result = probe(cut_file(tmp_path, data, META_START + 20))
    assert isinstance(result, Issue) and result.reason != "truncated"


def test_a_whole_file_and_a_file_cut_inside_its_pixels_are_not_header_cuts(tmp_path: Path) -> None:
    data = ct_with_sequence(tmp_path)
    assert not isinstance(probe(tmp_path / "whole.dcm"), Issue)
    pixels = data.index(b"\xe0\x7f\x10\x00OW")
    result = read(cut_file(tmp_path, data, pixels + 12 + 100))
    assert isinstance(result, Issue) and "(0008,1032)" not in result.message
    assert struct.unpack_from("<I", data, pixels + 8)[0] > 100
