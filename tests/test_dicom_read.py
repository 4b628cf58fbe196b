"""DICOM reading: header probe, rejection of broken files, pinned decoders, compressed syntaxes."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from dicom_files import (
    PATIENT_ID,
    TEST_FILES,
    config,
    ct_dataset,
    ct_pixels,
    enhanced_ct_dataset,
    file_window,
    image_dataset,
    lut_item,
    make_ref,
    save,
    shipped,
    window,
)
from pydicom.datadict import tag_for_keyword
from pydicom.dataelem import RawDataElement
from pydicom.encaps import encapsulate, generate_frames
from pydicom.pixels import pixel_array
from pydicom.sequence import Sequence as DicomSequence
from pydicom.tag import Tag
from pydicom.uid import (
    JPEG2000,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    MRImageStorage,
    RLELossless,
)

import packer.read.dicom as reader
from packer.read.dicom import DicomHeader, decoder_table, probe_dicom, read_dicom
from packer.read.dicom_attrs import text_value
from packer.records import Excluded, Issue, MemberIssue, Sample
from packer.where import Condition

TIME = ("StudyDate", "StudyTime")


def probe(path: Path, entity: str = "PatientID", time: tuple[str, ...] = TIME) -> DicomHeader | Issue | Excluded:
    return probe_dicom(make_ref(path), entity_keyword=entity, time_keywords=time)


def read(path: Path, *windows: Any, **kwargs: Any) -> list[Sample] | Issue:
    return read_dicom(make_ref(path), config(*windows, **kwargs))


def issue_of(result: Any, reason: str, stage: str | None = None) -> Issue:
    assert isinstance(result, Issue), f"expected a {reason} issue, got {type(result).__name__}"
    assert result.reason == reason, result.message
    if stage is not None:
        assert result.stage == stage
    return result


# ---------------------------------------------------------------- not DICOM / unreadable


def test_text_file_named_dcm_is_not_dicom(tmp_path: Path) -> None:
    path = tmp_path / "notes.dcm"
    path.write_text("This is not an image.\n" * 20)
    for result in (probe(path), read(path)):
        found = issue_of(result, "not_dicom", "read")
        assert "notes.dcm" in found.message and "DICM" in found.message
    short = tmp_path / "short.dcm"
    short.write_text("not an image\n")
    for result in (probe(short), read(short)):
        assert "the file is only 13 bytes long" in issue_of(result, "not_dicom", "read").message


@pytest.mark.parametrize("name", ["README.txt", "test1.json", "crayons.icc", "zipMR.gz"])
def test_files_that_force_true_would_accept_are_not_dicom(name: str, tmp_path: Path) -> None:
    # pydicom's dcmread(force=True) returns a junk dataset for each of these.
    path = tmp_path / f"{name}.dcm"
    shutil.copy(shipped(name), path)
    issue_of(probe(path), "not_dicom")
    issue_of(read(path), "not_dicom")


def test_json_document_is_not_dicom(tmp_path: Path) -> None:
    path = tmp_path / "meta.dcm"
    path.write_text(json.dumps({"PatientID": "x", "padding": "y" * 200}))
    issue_of(probe(path), "not_dicom")


def test_dataset_without_part10_header_is_not_dicom() -> None:
    issue_of(probe(shipped("no_meta.dcm")), "not_dicom")


def test_zero_byte_file_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "empty.dcm"
    path.write_bytes(b"")
    found = issue_of(probe(path), "unreadable", "read")
    assert "zero-byte" in found.message
    issue_of(read(path), "unreadable")


def test_a_missing_file_is_missing_file_and_a_directory_unreadable(tmp_path: Path) -> None:
    """missing_file, as an image or NIfTI source says for the same file (packer.read.opening)."""
    issue_of(probe(tmp_path / "gone.dcm"), "missing_file")
    folder = tmp_path / "folder.dcm"
    folder.mkdir()
    issue_of(read(folder), "unreadable")


def test_garbage_after_the_preamble_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "garbage.dcm"
    path.write_bytes(b"\0" * 128 + b"DICM" + b"\x02\x00\x10\x00UI\xff\x7f" + b"junk" * 4)
    issue_of(probe(path), "unreadable")


# ---------------------------------------------------------------- header checks


def test_an_rt_plan_is_left_out_by_the_probe_and_refused_by_a_bare_read_naming_its_sop_class() -> None:
    probed = probe(shipped("rtplan.dcm"))
    assert isinstance(probed, Excluded) and probed.why == "not_image" and "RT Plan Storage" in probed.detail
    found = issue_of(read(shipped("rtplan.dcm")), "no_pixel_data")  # read_dicom without its probe
    assert "RT Plan Storage" in found.message and "(0028,0010)" in found.message
    assert "not an image object" in found.message and "export it again" not in found.message


def test_a_vendors_private_object_without_an_image_is_left_out_not_a_damaged_file(tmp_path: Path) -> None:
    """A Siemens CSA Non-Image (1.3.12.2.1107.5.9.1) or a Philips Private MR Series Data object is
    a well-formed file of a class no standard names, and holds no image: it was no_pixel_data,
    "damaged or exported without its pixels", counted against max_bad_fraction."""
    for uid, modality in (("1.3.12.2.1107.5.9.1", "MR"), ("1.3.46.670589.11.0.0.12.2", "MR")):
        ds = ct_dataset()
        for keyword in ("PixelData", "Rows", "Columns", "BitsAllocated", "BitsStored", "HighBit",
                        "PixelRepresentation", "SamplesPerPixel", "PhotometricInterpretation"):
            if keyword in ds:
                delattr(ds, keyword)
        ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = uid
        ds.Modality = modality
        probed = probe(save(ds, tmp_path / f"{uid}.dcm"))
        assert isinstance(probed, Excluded) and probed.why == "not_image", probed
        assert "a vendor's private object, without pixel data" in probed.detail and uid in probed.detail
    # a damaged standard UID (not a UID's syntax: the fuzz test's mutant) is no vendor's class
    ds = ct_dataset()
    del ds.PixelData, ds.Rows, ds.Columns
    ds.SOPClassUID = "1.2/840.10008.5.1.4.1.1.2"
    assert not isinstance(probe(save(ds, tmp_path / "damaged.dcm")), Excluded)
    # a private class with an image is tried as one
    ds = ct_dataset()
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.3.12.2.1107.5.9.1"
    assert not isinstance(probe(save(ds, tmp_path / "with-pixels.dcm")), Excluded)


def test_an_image_header_exported_without_pixels_or_photometric_is_no_pixel_data_not_unsupported(
        tmp_path: Path) -> None:
    # A PACS export's "header only" CT: Rows, Columns and Bits Allocated, but no Photometric
    # Interpretation and no Pixel Data. Its defect is the missing image; "Photometric
    # Interpretation (missing) is not supported; fix the header" sends the user the wrong way.
    ds = ct_dataset()
    del ds.PixelData
    del ds.PhotometricInterpretation
    path = save(ds, tmp_path / "IM0037")
    for found in (probe(path), read(path)):
        issue = issue_of(found, "no_pixel_data")
        assert "CT Image Storage" in issue.message and "(7FE0,0010)" in issue.message
        assert "export it again" in issue.message or "re-export" in issue.message
    # with its pixels, a missing Photometric Interpretation is still the header's defect
    ds = ct_dataset()
    del ds.PhotometricInterpretation
    issue_of(probe(save(ds, tmp_path / "IM0038")), "unsupported")


def test_non_integer_number_of_frames_is_bad_shape(tmp_path: Path) -> None:
    dose = shipped("badVR.dcm")  # an RT Dose: checked only where the job asks for RT Dose (else Excluded)
    asked = probe_dicom(make_ref(dose), entity_keyword="PatientID", time_keywords=TIME,
                        where=(Condition("Modality", "in", ("RTDOSE",)),))
    issue_of(asked, "bad_shape")
    ds = ct_dataset()
    ds.NumberOfFrames = "2"
    path = save(ds, tmp_path / "frames.dcm")
    raw = path.read_bytes()
    assert b"IS\x02\x002 " in raw
    path.write_bytes(raw.replace(b"IS\x02\x002 ", b"IS\x02\x001A"))
    found = issue_of(probe(path), "bad_shape")
    assert "1A" in found.message and "(0028,0008)" in found.message


# Found by tests/test_fuzz.py: pydicom decodes elements lazily, so a damaged one used to raise
# wherever it was first read, outside any parse boundary (unexpected_error, or a crash in the probe).


def raw_element(ds: Any, keyword: str, vr: str, value: bytes) -> None:
    """Store ``value`` as the raw bytes of ``keyword`` with ``vr``, as a broken writer would."""
    tag = Tag(tag_for_keyword(keyword) or 0)
    ds._dict[tag] = RawDataElement(tag, vr, len(value), value, 0, False, True)


@pytest.mark.parametrize(("vr", "value", "shown"), [("US", struct.pack("<HH", 8, 8), "[8, 8]"),
                                                    ("UT", b"abc ", "'abc'")])
def test_rows_that_are_not_one_integer_are_bad_shape(tmp_path: Path, vr: str, value: bytes, shown: str) -> None:
    ds = ct_dataset()
    raw_element(ds, "Rows", vr, value)
    path = save(ds, tmp_path / "rows.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "bad_shape", "validate")
        assert f"(0028,0010) Rows is {shown}" in found.message


def test_an_image_pixel_integer_written_with_a_wrong_vr_says_which_vr_not_that_12_is_no_integer(
        tmp_path: Path) -> None:
    ds = ct_dataset()
    ds[0x00280101] = pydicom.DataElement(0x00280101, "DS", "12")  # Bits Stored is US
    path = save(ds, tmp_path / "vr.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "bad_shape", "validate")
        assert "(0028,0101) BitsStored is '12' with VR DS, where the standard has US" in found.message
        assert "expected one integer" not in found.message and "write the element again as US" in found.message


def test_an_empty_image_pixel_element_is_named_as_empty_not_as_pixels_missing_or_a_value_not_there(
        tmp_path: Path) -> None:
    # an anonymiser that blanks values leaves the element with zero length; the Pixel Data is all there
    ds = ct_dataset(ct_pixels((32, 32)))
    ds["PixelData"].VR = "OW"  # as read from a file: pydicom picks OB or OW by Bits Allocated
    raw_element(ds, "BitsAllocated", "US", b"")
    path = save(ds, tmp_path / "ba.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "bad_shape", "validate")
        assert "(0028,0100) BitsAllocated is present but empty (zero length)" in found.message, found.message
        assert "holds its Pixel Data" in found.message and "without its pixels" not in found.message
    ds = ct_dataset(ct_pixels((32, 32)))
    ds.BitsStored, ds.HighBit = 12, 11
    raw_element(ds, "BitsStored", "US", b"")
    found = issue_of(read(save(ds, tmp_path / "bs.dcm")), "bad_shape", "validate")
    assert "(0028,0101) Bits Stored is empty (zero length)" in found.message, found.message
    assert "Bits Stored is 16" not in found.message and "High Bit 11 says 12 bits" in found.message
    # blank and no Pixel Data either: still a header exported without its image
    ds = ct_dataset()
    del ds.PixelData
    raw_element(ds, "BitsAllocated", "US", b"")
    issue_of(read(save(ds, tmp_path / "header-only.dcm")), "no_pixel_data")


@pytest.mark.parametrize(("keyword", "value"), [("RescaleSlope", b"NaN "), ("RescaleIntercept", b"abc "),
                                                ("RescaleIntercept", b"inf ")])
def test_a_rescale_that_is_no_number_is_unreadable_not_taken_as_1_or_0(tmp_path: Path, keyword: str,
                                                                        value: bytes) -> None:
    """A CT intercept of 'abc' read as 0 packs every pixel 1024 HU off; a slope of 'NaN' read as 1
    ignores the real one. Neither may pass silently: the file is unreadable, naming the element."""
    ds = ct_dataset()
    raw_element(ds, keyword, "DS", value)
    found = issue_of(read(save(ds, tmp_path / "rescale.dcm")), "unreadable", "read")
    assert f"{keyword} {value.decode().strip()!r} is not a finite number" in found.message


@pytest.mark.parametrize("where", ["top level", "per-frame"])
@pytest.mark.parametrize(("keyword", "partner"), [("RescaleIntercept", "RescaleSlope"),
                                                  ("RescaleSlope", "RescaleIntercept")])
def test_an_empty_rescale_beside_its_partner_is_unreadable_not_taken_as_0_or_1(tmp_path: Path, where: str,
                                                                                keyword: str, partner: str) -> None:
    """A CT whose Rescale Intercept is there but empty, beside a Rescale Slope of 1, was packed
    with intercept 0: every pixel 1024 HU off, while 'abc' in its place was unreadable. The pair
    is Type 1 together, so an empty one beside a value is as corrupt as 'abc', at the top level
    and in an enhanced file's per-frame Pixel Value Transformation. Both empty reads as both
    absent (slope 1, intercept 0), as before."""
    if where == "top level":
        ds = ct_dataset()
        raw_element(ds, keyword, "DS", b"")
    else:
        ds = enhanced_ct_dataset(ct_pixels((2, 8, 8)), [(1.0, -1024.0), (1.0, -1024.0)], [None, None],
                                 shared_rescale=(1.0, -1024.0))
        raw_element(ds.PerFrameFunctionalGroupsSequence[1].PixelValueTransformationSequence[0], keyword, "DS", b"")
    found = issue_of(read(save(ds, tmp_path / "rescale.dcm"), window(40.0, 400.0)), "unreadable", "read")
    assert f"{keyword} is empty while (0028,105" in found.message and f"{partner} is '" in found.message
    assert found.message.startswith("rescale.dcm: ") and "copy the file again" in found.message
    ds = ct_dataset()
    raw_element(ds, "RescaleIntercept", "DS", b"")
    raw_element(ds, "RescaleSlope", "DS", b"")
    samples = read(save(ds, tmp_path / "both_empty.dcm"), window(40.0, 400.0))
    assert isinstance(samples, list) and samples[0].metadata["rescale_intercept"] == 0.0


def test_unknown_vr_of_a_top_level_element_is_unreadable(tmp_path: Path) -> None:
    path = save(ct_dataset(), tmp_path / "vr.dcm")
    raw = path.read_bytes()
    sop_class = b"\x08\x00\x16\x00UI"
    assert raw.count(sop_class) == 1
    path.write_bytes(raw.replace(sop_class, b"\x08\x00\x16\x00UM"))
    for result in (probe(path), read(path)):
        found = issue_of(result, "unreadable", "read")
        assert "(0008,0016)" in found.message and "Unknown Value Representation" in found.message


@pytest.mark.parametrize("sop_class_in_data_set", [False, True])
def test_unknown_vr_of_a_file_meta_element_is_unreadable_not_a_crashed_build(tmp_path: Path,
                                                                             sop_class_in_data_set: bool) -> None:
    """The long fuzz run: a bit flip turned (0002,0002) Media Storage SOP Class UID's VR 'UI' into
    'TI'. pydicom converts file meta elements lazily too, and the probe reads that one for a file
    without (0008,0016) (as a DICOMDIR names its class): NotImplementedError escaped probe_dicom
    and ended the whole build with exit 1. Every file meta element is converted at the parse now:
    one unreadable record naming the element, whatever the data set holds."""
    ds = ct_dataset()
    if not sop_class_in_data_set:
        del ds.SOPClassUID
    path = save(ds, tmp_path / "meta.dcm")
    raw = path.read_bytes()
    media_class = b"\x02\x00\x02\x00UI"
    assert raw.count(media_class) == 1
    path.write_bytes(raw.replace(media_class, b"\x02\x00\x02\x00TI"))
    for result in (probe(path), read(path)):
        found = issue_of(result, "unreadable", "read")
        assert "meta.dcm" in found.message and "(0002,0002)" in found.message


def test_damaged_functional_group_item_is_unreadable(tmp_path: Path) -> None:
    ds = enhanced_ct_dataset(ct_pixels((2, 8, 8)), rescales=[None, None], windows=[(40.0, 400.0), None],
                             shared_rescale=(1.0, -1024.0), shared_window=(40.0, 80.0))
    spacing = b"\x28\x00\x30\x00UM\x04\x000.5 "  # (0028,0030) with the unknown VR 'UM'
    item = b"\xfe\xff\x00\xe0" + struct.pack("<I", len(spacing)) + spacing
    raw_element(ds.SharedFunctionalGroupsSequence[0], "PixelMeasuresSequence", "SQ", item)
    path = save(ds, tmp_path / "enhanced.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "unreadable", "read")
        assert "(0028,0030) PixelSpacing cannot be decoded" in found.message


def test_unsupported_transfer_syntax_names_uid_and_name(tmp_path: Path) -> None:
    ds = ct_dataset(ct_pixels((8, 8)))
    ds.PixelData = encapsulate([b"\x00\x00\x01\xb3" + b"\x00" * 60])
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.100"  # MPEG2 Main Profile
    path = save(ds, tmp_path / "mpeg.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "unsupported_transfer_syntax")
        assert "1.2.840.10008.1.2.4.100" in found.message and "MPEG2" in found.message
    # a video's own photometric (YBR_PARTIAL_420, colour) does not turn it into a header to fix
    ds.PhotometricInterpretation, ds.SamplesPerPixel, ds.PlanarConfiguration = "YBR_PARTIAL_420", 3, 0
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.102"  # MPEG-4 AVC/H.264 High Profile
    path = save(ds, tmp_path / "h264.dcm")
    for result in (probe(path), read(path)):
        found = issue_of(result, "unsupported_transfer_syntax")
        assert "1.2.840.10008.1.2.4.102" in found.message and "fix the header" not in found.message


def test_probe_reads_entity_time_and_geometry(tmp_path: Path) -> None:
    ds = ct_dataset(ct_pixels((8, 12)))
    ds.PatientID = f"  {PATIENT_ID} "
    ds.StudyTime = "101112.123456"
    header = probe(save(ds, tmp_path / "ct.dcm"))
    assert isinstance(header, DicomHeader)
    assert header.entity == PATIENT_ID
    assert header.time == "2023-05-04T10:11:12"
    assert (header.rows, header.columns, header.frames, header.samples_per_pixel) == (8, 12, 1, 1)
    assert header.modality == "CT" and header.transfer_syntax_uid == "1.2.840.10008.1.2.1"
    assert header.sop_class_uid == "1.2.840.10008.5.1.4.1.1.2"


@pytest.mark.parametrize(("attrs", "keywords", "expected"), [
    ({"StudyDate": "20230504", "StudyTime": ""}, TIME, "2023-05-04"),
    ({"StudyDate": "20230504", "StudyTime": "1011"}, TIME, "2023-05-04T10:11:00"),
    ({"StudyDate": "2023-05-04"}, TIME, None),             # not a DICOM DA
    ({"StudyDate": "20231340"}, TIME, None),                # no 13th month
    ({"StudyDate": ""}, TIME, None),
    ({"AcquisitionDateTime": "20220102030405.5+0100"}, ("AcquisitionDateTime",), "2022-01-02T03:04:05"),
    ({"AcquisitionDateTime": "20220102"}, ("AcquisitionDateTime",), "2022-01-02"),
    # pydicom's DT matches a prefix: ISO forms read as their year's January 1st; a DT names a day, as a DA must
    ({"AcquisitionDateTime": "2024-08-01T10:10:10"}, ("AcquisitionDateTime",), None),
    ({"AcquisitionDateTime": "2023-12-31 23:00"}, ("AcquisitionDateTime",), None),
    ({"AcquisitionDateTime": "202408"}, ("AcquisitionDateTime",), None),
    ({"AcquisitionDateTime": "2024"}, ("AcquisitionDateTime",), None),
    ({"AcquisitionDateTime": "20240801101010.1234567"}, ("AcquisitionDateTime",), None),  # 7 fraction digits
    # a value padded with a NUL byte (as some writers pad) is still whole DT syntax
    ({"AcquisitionDateTime": "20240801101010\x00"}, ("AcquisitionDateTime",), "2024-08-01T10:10:10"),
    ({"AcquisitionDateTime": "2024-08-01T10:10:10", "StudyDate": "20240802"}, ("AcquisitionDateTime", "StudyDate"),
     "2024-08-02"),
    ({"StudyDate": "20230504"}, ("NotAKeyword", "StudyDate"), "2023-05-04"),
])
def test_probe_time_parsing(tmp_path: Path, attrs: dict[str, str], keywords: tuple[str, ...],
                            expected: str | None) -> None:
    ds = ct_dataset(ct_pixels((4, 4)))
    del ds.StudyTime
    for key, value in attrs.items():
        setattr(ds, key, value)
    header = probe(save(ds, tmp_path / "t.dcm"), time=keywords)
    assert isinstance(header, DicomHeader) and header.time == expected


def test_missing_entity_is_none_not_an_issue(tmp_path: Path) -> None:
    ds = ct_dataset(ct_pixels((4, 4)))
    ds.PatientID = "   "
    header = probe(save(ds, tmp_path / "anon.dcm"))
    assert isinstance(header, DicomHeader) and header.entity is None
    header = probe(save(ds, tmp_path / "anon.dcm"), entity="OtherPatientIDs")
    assert isinstance(header, DicomHeader) and header.entity is None


def _raw_patient_id(path: Path, raw: bytes, charset: str = "ISO_IR 192") -> Path:
    """A CT file whose (0010,0020) Patient ID holds the bytes ``raw`` as they are, under ``charset``."""
    ds = ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet=charset)
    ds.add_new(0x00100020, "LO", raw)
    saved = save(ds, path)
    assert raw in saved.read_bytes()
    return saved


def test_ids_that_differ_only_in_bytes_invalid_in_utf8_stay_two_entities(tmp_path: Path) -> None:
    """pydicom decodes what is not UTF-8 under ISO_IR 192 as U+FFFD (with a warning), so
    MRN<FF>01 and MRN<FE>01 both read 'MRN\ufffd01': two patients became one entity. Each such
    byte is kept as the text \\xNN instead, the same for the same bytes (padding aside)."""
    paths = {name: _raw_patient_id(tmp_path / f"{name}.dcm", raw)
             for name, raw in (("ff", b"MRN\xff01"), ("fe", b"MRN\xfe01"), ("ff-padded", b"MRN\xff01 "))}
    entities = {}
    for name, path in paths.items():
        header = probe(path)
        assert isinstance(header, DicomHeader)
        entities[name] = header.entity
        kept = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, keep_pixels=True)
        assert isinstance(kept, DicomHeader) and kept.entity == header.entity  # the whole-file parse too
        lazy = pydicom.dcmread(path)  # nothing converted yet: the pixel pass's reread of a placed file
        assert text_value(lazy, "PatientID") == header.entity
    assert entities == {"ff": "MRN\\xff01", "fe": "MRN\\xfe01", "ff-padded": "MRN\\xff01"}


def test_a_valid_utf8_id_and_one_holding_u_fffd_itself_are_read_as_pydicom_reads_them(tmp_path: Path) -> None:
    for text in ("Müller", "MRN\ufffd01", "山田"):
        header = probe(_raw_patient_id(tmp_path / "ok.dcm", text.encode()))
        assert isinstance(header, DicomHeader) and header.entity == text
    header = probe(_raw_patient_id(tmp_path / "latin1.dcm", "Müller".encode("latin-1"), charset="ISO_IR 100"))
    assert isinstance(header, DicomHeader) and header.entity == "Müller"


def test_a_sample_whose_entity_kept_undecodable_bytes_says_so_without_the_id(tmp_path: Path) -> None:
    bad = _raw_patient_id(tmp_path / "bad.dcm", b"MRN\xff01")
    samples = read_dicom(make_ref(bad), config(), entity_keyword="PatientID")
    assert isinstance(samples, list) and samples
    (note,) = samples[0].metadata["warnings"]
    assert note.startswith("(0010,0020) PatientID") and "ISO_IR 192" in note and "MRN" not in note
    good = _raw_patient_id(tmp_path / "good.dcm", "Müller".encode())
    samples = read_dicom(make_ref(good), config(), entity_keyword="PatientID")
    assert isinstance(samples, list) and "warnings" not in samples[0].metadata


# ---------------------------------------------------------------- truncation and decode failures


def test_truncated_native_pixel_data(tmp_path: Path) -> None:
    issue_of(read(shipped("MR_truncated.dcm")), "truncated", "read")
    path = save(ct_dataset(ct_pixels((32, 32))), tmp_path / "ct.dcm")
    path.write_bytes(path.read_bytes()[:-300])
    found = issue_of(read(path), "truncated")
    assert "1748 bytes, 2048 expected" in found.message
    assert isinstance(probe(path), DicomHeader)  # the header pass cannot see it; the pixel pass does


@pytest.mark.parametrize(("shape", "header", "found"), [((32, 32), {"Columns": 31}, ("2048 bytes, where", "give 1984")),
                                                        ((2, 32, 32), {}, ("4096 bytes, where", "give 2048"))])
def test_native_pixel_data_longer_than_its_header_says_is_bad_shape_not_a_sheared_image(
        tmp_path: Path, shape: tuple[int, ...], header: dict[str, int], found: tuple[str, str]) -> None:
    """A Columns one short of the stored width would read as the first Rows × 31 pixels, each row
    starting one pixel later than the one above; only the one pad byte of an odd length is padding."""
    ds = ct_dataset(ct_pixels((32, 32)))
    ds.PixelData = np.arange(np.prod(shape), dtype=np.uint16).tobytes()
    for keyword, value in header.items():
        setattr(ds, keyword, value)
    issue = issue_of(read(save(ds, tmp_path / "long.dcm")), "bad_shape", "validate")
    assert all(text in issue.message for text in found), issue.message
    assert "(0028,0011) Columns" in issue.message and "(0028,0008) Number of Frames" in issue.message
    odd = ct_dataset(ct_pixels((32, 32)))
    odd.Rows, odd.Columns, odd.BitsAllocated, odd.BitsStored, odd.HighBit = 3, 3, 8, 8, 7
    odd.PixelData = bytes(range(9)) + b"\0"  # 9 bytes and the pad byte that makes them even
    assert isinstance(read(save(odd, tmp_path / "odd.dcm"), window(4, 8)), list)
    # zeros past the image are the excess padding PS3.5 8.1.1's Note says to accept (pydicom's
    # MR_small_padded.dcm): read, the padding dropped, and the sample says so
    padded = ct_dataset(ct_pixels((32, 32)))
    image = np.arange(32 * 32, dtype=np.uint16).reshape(32, 32)
    padded.PixelData = image.tobytes() + bytes(128)
    (sample,) = read(save(padded, tmp_path / "padded.dcm"), window(512, 1024))
    (note,) = sample.metadata["warnings"]
    assert "128 zero byte(s) past the 2048" in note and "dropped" in note


def _native_pixel_data_of_undefined_length(path: Path, syntax: str, delimiter: bool) -> Path:
    """A native CT file as a broken writer makes it: its (7FE0,0010) length field FFFFFFFF, then the
    pixel bytes, then (``delimiter``) a (FFFE,E0DD) Sequence Delimitation Item, as if encapsulated."""
    ds = ct_dataset(ct_pixels((8, 8)))
    ds.file_meta.TransferSyntaxUID = syntax
    data = save(ds, path).read_bytes()
    header = b"\xe0\x7f\x10\x00" + (b"OW\x00\x00" if syntax == ExplicitVRLittleEndian else b"")
    at = data.rindex(header) + len(header)
    assert struct.unpack_from("<I", data, at)[0] == 8 * 8 * 2 and len(data) == at + 4 + 128
    path.write_bytes(data[:at] + b"\xff\xff\xff\xff" + data[at + 4:] + (b"\xfe\xff\xdd\xe0" + bytes(4)) * delimiter)
    return path


@pytest.mark.parametrize("delimiter", [True, False], ids=["delimited", "undelimited"])
@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian], ids=["explicit", "implicit"])
def test_native_pixel_data_of_undefined_length_is_unreadable_not_a_truncated_encapsulated_stream(
        tmp_path: Path, syntax: str, delimiter: bool) -> None:
    """PS3.5 A.4 allows an undefined length only for encapsulated Pixel Data. pydicom reads such
    native data up to a sequence delimiter it finds (or drops the whole data set when there is
    none), so the file was packed, or reported as a cut encapsulated stream, or as having no data
    set. It is malformed: unreadable, naming the syntax and how to rewrite it, in both passes."""
    path = _native_pixel_data_of_undefined_length(tmp_path / "undefined.dcm", syntax, delimiter)
    header = probe(path)
    kept = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, keep_pixels=True)
    assert isinstance(header, DicomHeader) and isinstance(kept, DicomHeader)  # the header is sound
    for result in (read(path), read_dicom(make_ref(path), config(), dataset=kept.dataset)):
        found = issue_of(result, "unreadable", "read")
        assert "(7FE0,0010) Pixel Data has an undefined length" in found.message
        assert f"{syntax} ({syntax.name})" in found.message and "dcmconv" in found.message
        assert "encapsulated (7FE0,0010)" not in found.message and "cut short" not in found.message


def test_packer_validate_reports_native_pixel_data_of_undefined_length_as_bad_samples(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from helpers import write_job

    from packer.cli import main

    root = tmp_path / "raw"
    for name in ("a", "b"):
        save(ct_dataset(ct_pixels((8, 8), seed=ord(name)), PatientID=f"P-{name}"), root / f"{name}.dcm")
    _native_pixel_data_of_undefined_length(root / "explicit.dcm", ExplicitVRLittleEndian, delimiter=False)
    _native_pixel_data_of_undefined_length(root / "implicit.dcm", ImplicitVRLittleEndian, delimiter=True)
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\na.dcm,x\nb.dcm,y\nexplicit.dcm,x\nimplicit.dcm,y\n")
    job = write_job(tmp_path, {
        "name": "undefined", "sources": [{"kind": "dicom", "root": str(root), "labels": str(labels)}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "test": 0.5}, "seed": 1, "balance": {"accept": True},
                  "near_duplicates": {"enabled": False}},
        "transform": {"dicom": {"windows": ["lung"], "size": [8, 8]}}, "pack": {"format": "webdataset"},
        "output": str(tmp_path / "out"), "phi": {"mode": "keep"}, "validate": {"max_bad_fraction": 0.5}})
    report = tmp_path / "v.json"
    result = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(report)])
    assert result.exit_code == 0, result.output
    records = json.loads(report.read_text())["bad_samples"]["records"]
    assert sorted((Path(r["path"]).name, r["reason"]) for r in records) == [("explicit.dcm", "unreadable"),
                                                                           ("implicit.dcm", "unreadable")]
    assert all("undefined length" in r["message"] for r in records)


def test_encapsulated_file_cut_short_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "cut.dcm"
    path.write_bytes(shipped("MR_small_jp2klossless.dcm").read_bytes()[:-400])
    found = issue_of(read(path), "truncated", "read")
    assert "(7FE0,0010)" in found.message


def test_encapsulated_frame_without_end_marker_is_truncated(tmp_path: Path) -> None:
    ds = pydicom.dcmread(shipped("MR_small_jp2klossless.dcm"))
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([frame[: len(frame) // 2]])
    issue_of(read(save(ds, tmp_path / "half.dcm")), "truncated")


def _compressed_frames(syntax: str, frames: int = 4) -> tuple[Any, list[bytes], np.ndarray]:
    """A CT multi-frame dataset compressed under ``syntax``, its frames' codestreams, its pixels."""
    pixels = ct_pixels((frames, 64, 64))
    ds = ct_dataset(pixels)
    ds.compress(syntax, pixels)
    return ds, list(generate_frames(ds.PixelData, number_of_frames=frames)), pixels


def test_rle_with_more_fragments_than_frames_and_no_offset_table_is_bad_shape_not_truncated(tmp_path: Path) -> None:
    """Four RLE frames and a fifth fragment, with an empty Basic Offset Table: RLE frames carry no
    end marker, so pydicom joined all five fragments into one frame, read as 'truncated: it holds
    1 frame(s) ... copy it again'. The file is whole; the frames cannot be told apart."""
    ds, frames, _ = _compressed_frames(RLELossless)
    ds.PixelData = encapsulate([*frames, frames[0]], has_bot=False)
    found = issue_of(read(save(ds, tmp_path / "extra.dcm")), "bad_shape", "validate")
    assert found.message.startswith("extra.dcm: the encapsulated (7FE0,0010) Pixel Data holds 5 fragments for the "
                                    "4 frames (0028,0008) Number of Frames declares"), found.message
    assert "neither a Basic Offset Table nor an Extended Offset Table" in found.message
    assert "cut short" not in found.message and "1 frame" not in found.message


def test_rle_cut_short_is_still_truncated(tmp_path: Path) -> None:
    """Real truncation keeps its verdict: a frame's fragment gone, or the last frame cut inside."""
    ds, frames, _ = _compressed_frames(RLELossless)
    ds.PixelData = encapsulate(frames[:3], has_bot=False)
    issue_of(read(save(ds, tmp_path / "missing.dcm")), "truncated", "read")
    ds.PixelData = encapsulate([*frames[:3], frames[3][:len(frames[3]) // 4 * 2]], has_bot=False)
    assert "RLE frame 3 ends before the segments" in issue_of(read(save(ds, tmp_path / "cut.dcm")),
                                                              "truncated", "read").message


@pytest.mark.parametrize(("syntax", "has_bot"), [(JPEG2000Lossless, True), (JPEG2000Lossless, False),
                                                 (RLELossless, True)])
def test_frames_in_several_fragments_decode(tmp_path: Path, syntax: str, has_bot: bool) -> None:
    """Each frame split into two fragments reads as the frames did in one: JPEG 2000 with or
    without a Basic Offset Table (its frames end with the EOC marker FFD9), RLE where the offset
    table says which fragments make up which frame (without one, see the test above)."""
    ds, frames, pixels = _compressed_frames(syntax, frames=3)
    wide = window(2048.0, 4096.0)
    whole = read(save(ds, tmp_path / "whole.dcm"), wide)
    ds.PixelData = encapsulate(frames, fragments_per_frame=2, has_bot=has_bot)
    split = read(save(ds, tmp_path / "split.dcm"), wide)
    assert not isinstance(whole, Issue) and not isinstance(split, Issue), getattr(split, "message", whole)
    assert [sample.key for sample in split] == [sample.key for sample in whole] and len(split) == 3
    for fragmented, single in zip(split, whole, strict=True):
        assert np.array_equal(fragmented.image, single.image)
    assert np.array_equal(pixel_array(pydicom.dcmread(tmp_path / "split.dcm")), pixels)


@pytest.mark.parametrize("name", ["SC_jpeg_no_color_transform.dcm", "JPGExtended.dcm", "MR_small_jpeg_ls_lossless.dcm",
                                  "MR_small_jp2klossless.dcm"])
@pytest.mark.parametrize("kept", [0.5, 0.9])
def test_a_frame_cut_short_that_the_decoder_fills_in_is_truncated(tmp_path: Path, name: str, kept: float) -> None:
    """libjpeg decodes a baseline JPEG cut in half without an error, filling the missing rows with
    padding blocks: made-up pixels packed as data, with no record. A frame without its end marker
    is truncated whether its decoder raises or not; the whole frame (padded to even length) reads."""
    ds = pydicom.dcmread(shipped(name))
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    wide = window(2048.0, 4096.0)
    whole = read(save(ds, tmp_path / "whole.dcm"), wide)
    assert not isinstance(whole, Issue), whole.message
    ds.PixelData = encapsulate([frame[: int(len(frame) * kept) // 2 * 2]])
    found = issue_of(read(save(ds, tmp_path / "cut.dcm"), wide), "truncated", "read")
    assert "frame 0 lacks its end marker (FFD9); copy the file again" in found.message


def _scan_start(frame: bytes) -> int:
    """Where the entropy-coded data of a JPEG frame's first scan starts (after its SOS segment)."""
    sos = frame.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(frame[sos + 2:sos + 4], "big")


@pytest.mark.parametrize("name", ["SC_jpeg_no_color_transform.dcm", "SC_rgb_jpeg_dcmtk.dcm"])
@pytest.mark.parametrize("kept", [0.3, 0.7])
def test_a_jpeg_baseline_frame_cut_inside_its_scan_but_ending_in_ffd9_is_truncated(
        tmp_path: Path, name: str, kept: float) -> None:
    """A JPEG Baseline frame cut inside its scan data, FFD9 put back at its end: pylibjpeg's libjpeg
    decodes it without an error, padding the lost blocks, and the end marker is there.
    libjpeg-turbo in strict mode checks the scan; the frames are still decoded by the pinned
    plugin (the whole file reads)."""
    ds = pydicom.dcmread(shipped(name))
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    assert not isinstance(read(save(ds, tmp_path / "whole.dcm")), Issue)
    start = _scan_start(frame)
    cut = frame[:start + int((len(frame) - start) * kept)] + b"\xff\xd9"
    ds.PixelData = encapsulate([cut + b"\x00" * (len(cut) % 2)])
    assert pixel_array(ds, decoding_plugin="pylibjpeg").shape == (ds.Rows, ds.Columns, 3)  # no error
    found = issue_of(read(save(ds, tmp_path / "cut.dcm")), "truncated", "read")
    assert "frame 0: JPEG scan data is cut short" in found.message, found.message
    assert "premature end of data segment" in found.message, found.message


def _relabelled(path: Path, syntax: str) -> Path:
    """The Explicit VR Little Endian file at ``path`` with its file meta's Transfer Syntax UID
    made ``syntax`` (and the group length to match), its data set as it was: pydicom writes no
    syntax it does not know, nor native pixels under a compressed one."""
    data = path.read_bytes()
    native = b"1.2.840.10008.1.2.1\0"  # Explicit VR Little Endian, 20 bytes in the file meta
    assert data.count(native) == 1 and data[132:140] == b"\x02\x00\x00\x00UL\x04\x00"
    uid = syntax.encode() + (b"\0" if len(syntax) % 2 else b"")
    group_length = struct.unpack_from("<I", data, 140)[0] + len(uid) - len(native)
    head = data[:data.index(native)].replace(b"\x10\x00UI\x14\x00", b"\x10\x00UI" + struct.pack("<H", len(uid)))
    path.write_bytes(head[:140] + struct.pack("<I", group_length) + head[144:] + uid + data[data.index(native) + 20:])
    return path


@pytest.mark.parametrize("syntax", [JPEG2000Lossless, RLELossless, "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.50"])
def test_native_pixel_data_under_a_compressed_syntax_is_decode_failed_not_truncated(tmp_path: Path,
                                                                                     syntax: str) -> None:
    """A whole native file whose file meta was relabelled with a compressed transfer syntax (a
    broken converter): its Pixel Data holds raw pixels, not the items an encapsulated syntax
    requires. Nothing is cut short, so 'truncated, copy it again' is the wrong verdict and the
    wrong fix: it is decode_failed, naming the element, what it starts with and the syntax."""
    path = _relabelled(save(ct_dataset(ct_pixels((16, 16))), tmp_path / "relabelled.dcm"), syntax)
    assert str(pydicom.dcmread(path).file_meta.TransferSyntaxUID) == syntax
    found = issue_of(read(path), "decode_failed", "read")
    assert "relabelled.dcm" in found.message and "(7FE0,0010)" in found.message and syntax in found.message
    assert "not encapsulated" in found.message


@pytest.mark.parametrize(("name", "package"), [("MR_small_jp2klossless.dcm", "pylibjpeg-openjpeg"),
                                             ("MR_small_jpeg_ls_lossless.dcm", "pylibjpeg-libjpeg")])
def test_a_missing_decoder_package_is_named(monkeypatch: pytest.MonkeyPatch, name: str, package: str) -> None:
    """pylibjpeg installed without pylibjpeg-openjpeg: "needs the pylibjpeg plugin, which is not
    installed" though pylibjpeg is; the package that decodes the syntax is named."""
    class NoPlugins:
        available_plugins: tuple[str, ...] = ()

    monkeypatch.setattr(reader, "get_decoder", lambda syntax: NoPlugins())
    found = issue_of(read(shipped(name)), "unsupported_transfer_syntax", "read")
    assert f"{package} package, which is not installed here; pip install pylibjpeg {package}" in found.message


def test_corrupt_encapsulated_frame_is_decode_failed(tmp_path: Path) -> None:
    ds = pydicom.dcmread(shipped("MR_small_jp2klossless.dcm"))
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([b"\x00" * 64 + frame[64:]])  # header destroyed, end marker intact
    found = issue_of(read(save(ds, tmp_path / "bad.dcm")), "decode_failed", "read")
    assert "pylibjpeg" in found.message and "RuntimeError" in found.message
    issue_of(read(shipped("JPEG-lossy.dcm")), "decode_failed")  # a real, undecodable 12-bit stream


def test_unexpected_exception_becomes_one_issue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(reader, "render_samples", explode)
    found = issue_of(read(save(ct_dataset(), tmp_path / "ct.dcm")), "unexpected_error")
    assert "ZeroDivisionError: boom" in found.message


# ---------------------------------------------------------------- validation of content


def test_constant_image(tmp_path: Path) -> None:
    path = save(ct_dataset(np.full((8, 8), 1024, dtype=np.int16)), tmp_path / "flat.dcm")
    issue_of(read(path), "constant_image", "validate")


def test_constant_after_padding_mask(tmp_path: Path) -> None:
    pixels = np.full((8, 8), 1024, dtype=np.int16)
    pixels[:2] = -2000
    path = save(ct_dataset(pixels, PixelPaddingValue=-2000), tmp_path / "padded.dcm")
    issue_of(read(path), "constant_image")
    path = save(ct_dataset(np.full((4, 4), -2000, np.int16), PixelPaddingValue=-2000), tmp_path / "all.dcm")
    assert "Padding" in issue_of(read(path), "constant_image").message


def test_a_zero_rescale_slope_is_a_constant_image_not_a_flat_sample(tmp_path: Path) -> None:
    """Rescale Slope 0 (a broken export) maps every stored value to the intercept: the packed
    sample would be one flat grey whatever the scan showed. Its stored values differ, so only the
    modality values can tell: the file is constant_image, naming the slope."""
    path = save(ct_dataset(ct_pixels((16, 16)), slope=0.0, intercept=-1024.0), tmp_path / "slope0.dcm")
    found = issue_of(read(path), "constant_image", "validate")
    assert "(0028,1053) Rescale Slope is 0" in found.message
    enhanced = enhanced_ct_dataset(np.stack([ct_pixels((8, 8), seed=s) for s in range(2)]), [None, (0.0, 10.0)],
                                   [None, None], shared_rescale=(1.0, -1024.0), shared_window=(40.0, 400.0))
    found = issue_of(read(save(enhanced, tmp_path / "enhanced.dcm")), "constant_image")
    assert "frame 1" in found.message


@pytest.mark.parametrize(("slope", "intercept"), [(1.0, 1e308), (1.0, 1e20), (1e-300, -1024.0), (1e-30, -1024.0)])
def test_a_rescale_that_rounds_every_value_to_one_is_a_constant_image(tmp_path: Path, slope: float,
                                                                         intercept: float) -> None:
    """A Rescale Intercept of 1e20 (or a slope of 1e-30) is a number, yet in float64 every stored
    value plus it (or times it) is the same modality value: the sample would be one flat grey
    under any window, as with a slope of 0. The file is constant_image naming both attributes."""
    path = save(ct_dataset(ct_pixels((16, 16)), slope=slope, intercept=intercept), tmp_path / "flat.dcm")
    found = issue_of(read(path), "constant_image", "validate")
    assert "(0028,1053) Rescale Slope" in found.message and "(0028,1052) Rescale Intercept" in found.message


@pytest.mark.parametrize(("slope", "intercept"), [(1e308, 0.0), (1e308, -1e308), (-1e308, 0.0)])
def test_a_rescale_that_overflows_float64_is_non_finite(tmp_path: Path, slope: float, intercept: float) -> None:
    """Stored values times a Rescale Slope of 1e308 are inf: windowed, every pixel would be white
    (or NaN), a flat sample packed as if it were an image. The file is non_finite."""
    path = save(ct_dataset(ct_pixels((16, 16)), slope=slope, intercept=intercept), tmp_path / "inf.dcm")
    found = issue_of(read(path), "non_finite", "validate")
    assert "(0028,1053) Rescale Slope" in found.message and "flat.dcm" not in found.message


def test_float_pixel_data_holding_nan_is_non_finite_saying_so_not_blaming_a_rescale(tmp_path: Path) -> None:
    """A Parametric Map whose Float Pixel Data holds a NaN and an infinity, with no Rescale
    Slope/Intercept at all: non_finite blamed "(0028,1053) Rescale Slope 1 and (0028,1052)
    Rescale Intercept 0 ... the header is corrupt", a header that is fine."""
    values = np.linspace(0, 200, 256, dtype=np.float32).reshape(16, 16)
    values[3, 3], values[4, 4] = np.nan, np.inf
    ds = image_dataset(np.zeros((16, 16), np.uint16), modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.30")
    del ds.PixelData
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 32, 32, 31
    ds.FloatPixelData = values.tobytes()
    found = issue_of(read(save(ds, tmp_path / "map.dcm"), window(100.0, 200.0)), "non_finite", "validate")
    assert "2 of 256 pixel values of the float pixel data are NaN or infinite" in found.message, found.message
    assert "Rescale" not in found.message and "header is corrupt" not in found.message


@pytest.mark.parametrize("width", [1e30, 1e12])
def test_a_file_window_so_wide_that_every_pixel_is_one_grey_is_a_constant_image(tmp_path: Path, width: float) -> None:
    """A Window Width of 1e30 in the file is a valid LINEAR width (>= 1), yet it maps the stored
    values 0..3000 to 0.5 ± 1e-27: every packed pixel is 128, a flat grey square packed as if it
    were an image. When the file's own windows turn every pixel of a frame into one level while
    its stored values differ, the file is constant_image, naming the window. A window the job
    asks for is its choice (a CT window on a radiograph may be flat too): a usable one beside the
    file's keeps the file."""
    path = save(ct_dataset(ct_pixels((16, 16)), center=40.0, width=width), tmp_path / "wide.dcm")
    found = issue_of(read(path), "constant_image", "validate")
    assert "wide.dcm" in found.message and "Window Width" in found.message and "128" in found.message
    assert isinstance(read(path, file_window(), window(40.0, 400.0)), list)
    assert isinstance(read(path, window(-5000.0, 2.0)), list)  # flat too, but asked for


def _damaged_variant(name: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{name}.dcm"
    if name == "dangling_link":
        path.symlink_to(tmp_path / "gone.dcm")
        return path
    overrides: dict[str, Any] = {"rows_0": {"Rows": 0}, "photometric_xyz": {"PhotometricInterpretation": "XYZ"},
                                 "rgb_of_one_sample": {"PhotometricInterpretation": "RGB"},
                                 "bits_stored_20": {"BitsStored": 20},
                                 "bits_allocated_1": {"BitsAllocated": 1, "BitsStored": 1, "HighBit": 0},
                                 "pixel_representation_2": {"PixelRepresentation": 2}, "no_pixels": {}}[name]
    ds = ct_dataset(ct_pixels((16, 16)))
    for keyword, value in overrides.items():
        setattr(ds, keyword, value)
    if name == "no_pixels":
        del ds.PixelData
    return save(ds, path)


@pytest.mark.parametrize("name", ["dangling_link", "rows_0", "photometric_xyz", "rgb_of_one_sample", "bits_stored_20",
                                  "bits_allocated_1", "pixel_representation_2", "no_pixels"])
def test_every_damaged_header_message_names_the_file_and_ends_with_the_fix(tmp_path: Path, name: str) -> None:
    """A bad-sample record is read by whoever has to repair the data: its message names the file,
    the field, and (its last clause) what to do, as the truncated and not_dicom ones always did."""
    found = read(_damaged_variant(name, tmp_path))
    assert isinstance(found, Issue) and found.reason != "unexpected_error", found
    assert found.message.startswith(f"{name}.dcm: ")
    fix = found.message.rsplit(";", 1)[-1]
    assert any(word in fix for word in ("fix", "re-export", "copy", "convert", "remove", "replace")), found.message


@pytest.mark.parametrize(("first_mapped", "flat"), [(-1024, True), (-30000, True), (0, False)])
def test_a_file_voi_lut_that_maps_every_pixel_to_one_entry_is_a_constant_image(tmp_path: Path, first_mapped: int,
                                                                              flat: bool) -> None:
    """Behind a Modality LUT (whose output is unsigned) a VOI LUT whose first mapped value is
    read as 64512 (-1024 in 16 bits) or 35536 (-30000) puts every modality value 0..5998 before its first
    entry: windows: [file] packed an all-black square. A LUT need not be monotone, so the
    rendered frame itself tells: every channel one value while the stored values differ, all from
    the file's own LUTs, is constant_image. A LUT that starts at 0 renders the image."""
    ds = ct_dataset(ct_pixels((12, 10)), center=None, width=None)
    ds.ModalityLUTSequence = DicomSequence([lut_item(0, 16, list(range(0, 6000, 2)))])
    ds.VOILUTSequence = DicomSequence([lut_item(first_mapped, 12, list(range(0, 4096, 4)), "SOFT")])
    del ds.RescaleSlope, ds.RescaleIntercept
    path = save(ds, tmp_path / "lut.dcm")
    found = read(path)
    if flat:
        found_issue = issue_of(found, "constant_image", "validate")
        assert "lut.dcm" in found_issue.message and "the file's own VOI LUT 'SOFT'" in found_issue.message
    else:
        assert isinstance(found, list) and found[0].image.min() < found[0].image.max()


def test_unsupported_photometric_interpretation(tmp_path: Path) -> None:
    ds = ct_dataset(ct_pixels((4, 4)), PhotometricInterpretation="HSV")
    found = issue_of(probe(save(ds, tmp_path / "hsv.dcm")), "unsupported", "validate")
    assert "(0028,0004)" in found.message and "HSV" in found.message


@pytest.mark.parametrize(("bits_stored", "high_bit", "refused"), [(12, 15, True), (12, 11, False), (12, None, False),
                                                                (16, 11, True), (8, 7, False)])
def test_a_high_bit_other_than_bits_stored_minus_one_is_bad_shape(tmp_path: Path, bits_stored: int,
                                                                 high_bit: int | None, refused: bool) -> None:
    """Bits Stored 12 with High Bit 15 (12-bit values in bits 4..15, as old exporters wrote them):
    pydicom keeps the low 12 bits whatever High Bit says, and the file packed as a good sample of
    other numbers. PS3.3 C.7.6.3 requires High Bit = Bits Stored - 1: anything else is bad_shape,
    from the header probe on, naming both attributes. A missing High Bit reads as before."""
    pixels = ct_pixels((8, 8), high=1 << min(bits_stored, 12)).astype(np.uint8 if bits_stored == 8 else np.uint16)
    ds = ct_dataset(pixels, PixelRepresentation=0)
    ds.BitsStored = bits_stored
    if high_bit is None:
        del ds.HighBit
    else:
        ds.HighBit = high_bit
    path = save(ds, tmp_path / "bits.dcm")
    if not refused:
        assert isinstance(probe(path), DicomHeader) and isinstance(read(path, window(0.0, 20000.0)), list)
        return
    for found in (probe(path), read(path)):
        issue = issue_of(found, "bad_shape", "validate")
        assert f"(0028,0102) High Bit is {high_bit} but (0028,0101) Bits Stored is {bits_stored}" in issue.message
        assert f"High Bit = Bits Stored - 1 ({bits_stored - 1})" in issue.message and "re-export" in issue.message


@pytest.mark.parametrize("photometric", ["YBR_ICT", "YBR_RCT"])
def test_native_ybr_ict_or_rct_is_unsupported_but_their_jpeg_2000_files_read(tmp_path: Path, photometric: str) -> None:
    """YBR_ICT and YBR_RCT are only valid with JPEG 2000 (PS3.3 C.7.6.3.1.2): its decoder undoes
    the component transform. An uncompressed file so labelled was packed with its Y, Cb, Cr
    samples as R, G, B; it is refused, naming the transfer syntax. JPEG 2000 files decode to RGB."""
    ybr = np.random.default_rng(3).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    ds = image_dataset(ybr, photometric="RGB", modality="OT")
    ds.PhotometricInterpretation = photometric
    path = save(ds, tmp_path / "native.dcm")
    for found in (probe(path), read(path)):
        issue = issue_of(found, "unsupported", "validate")
        assert f"{photometric} is only valid with a JPEG 2000 transfer syntax" in issue.message, issue.message
        assert "Explicit VR Little Endian" in issue.message and "re-export" in issue.message
    assert isinstance(read(shipped("GDCMJ2K_TextGBR.dcm")), list)  # YBR_RCT, JPEG 2000 Lossless


def test_a_siemens_mosaic_is_unsupported_naming_dcm2niix_in_slice_and_series_jobs(tmp_path: Path) -> None:
    """A Siemens MOSAIC image (Image Type value MOSAIC) tiles the slices of a volume into one 2-D
    image; where each tile lies is only in the private CSA header. It packed as one slice of nine
    side by side, silently; packer cannot unpack it without guessing, so the header probe refuses
    it (a series job's too, which then holds back its series), naming the tile count and dcm2niix.
    The same image without MOSAIC in its Image Type reads."""
    mosaic = np.repeat(np.repeat(np.arange(9, dtype=np.uint16).reshape(3, 3) * 40 + 50, 8, 0), 8, 1)
    ds = image_dataset(mosaic, modality="MR", sop_class=MRImageStorage, Manufacturer="SIEMENS",
                       ImageType=["ORIGINAL", "PRIMARY", "M", "ND", "MOSAIC"])
    ds.add_new(0x00190010, "LO", "SIEMENS CSA HEADER")
    ds.add_new(0x0019100A, "US", 9)  # Number of Images in Mosaic
    path = save(ds, tmp_path / "mosaic.dcm")
    in_series = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, placement=True,
                            slices=False)
    assert isinstance(in_series, MemberIssue)
    for found in (probe(path), read(path), in_series.issue):
        issue = issue_of(found, "unsupported", "validate")
        assert "mosaic.dcm" in issue.message and "(0008,0008) Image Type holds MOSAIC" in issue.message
        assert "tiles 9 slices" in issue.message and "CSA header" in issue.message
        assert "dcm2niix" in issue.message and "nifti source" in issue.message
    ds.ImageType = ["ORIGINAL", "PRIMARY", "M", "ND"]
    assert isinstance(read(save(ds, tmp_path / "plain.dcm"), window(200.0, 400.0)), list)


@pytest.mark.parametrize(("columns", "planar", "what"), [(5, 0, "(0028,0011) Columns is 5, odd"),
                                                         (6, 1, "(0028,0006) Planar Configuration is 1")])
def test_native_ybr_full_422_of_odd_columns_or_planes_is_bad_shape(tmp_path: Path, columns: int, planar: int,
                                                                   what: str) -> None:
    """Uncompressed YBR_FULL_422 stores Y Y Cb Cr per pixel pair, so it needs an even column count
    and Planar Configuration 0 (PS3.3 C.7.6.3.1.2); pydicom decoded either anyway, pairing the
    wrong samples, and the made-up colours packed as good. The valid layout reads (see
    test_dicom_transform's test_ybr_comes_out_as_rgb)."""
    ds = image_dataset(np.zeros((4, columns, 3), np.uint8), photometric="RGB", modality="OT")
    ds.PhotometricInterpretation, ds.PlanarConfiguration = "YBR_FULL_422", planar
    ds.PixelData = bytes(range(4 * columns * 2))
    found = issue_of(read(save(ds, tmp_path / "ybr422.dcm")), "bad_shape", "validate")
    assert what in found.message and "even column count and Planar Configuration 0" in found.message


@pytest.mark.parametrize(("photometric", "said"), [
    ("YBR_FULL", "every pixel has the same RGB value [0, 135, 0] ((0028,0004) YBR_FULL, after the decoder's colour "
                 "conversion)"),
    ("RGB", "every pixel has the same stored value [0, 0, 0]"),
])
def test_a_constant_colour_image_says_which_values_it_quotes(tmp_path: Path, photometric: str, said: str) -> None:
    """A YBR file whose every stored sample is [0, 0, 0] was refused as constant_image quoting
    "stored value [0, 135, 0]": the RGB the decoder converted it to, which no sample of the file
    holds. The message now says it quotes the RGB value after the colour conversion."""
    ds = image_dataset(np.zeros((6, 6, 3), np.uint8), photometric=photometric, modality="OT")
    found = issue_of(read(save(ds, tmp_path / "flat.dcm")), "constant_image", "validate")
    assert said in found.message, found.message


def test_float16_overflow_is_a_transform_issue(tmp_path: Path) -> None:
    pixels = np.array([[0, 100_000], [5, 7]], dtype=np.uint32)
    path = save(image_dataset(pixels, modality="OT"), tmp_path / "big.dcm")
    found = issue_of(read(path, output="float16"), "non_finite", "transform")  # float16 would hold them as inf
    assert "float16" in found.message and "uint16" in found.message


def test_missing_file_window_without_fallback(tmp_path: Path) -> None:
    path = save(ct_dataset(center=None, width=None), tmp_path / "nowin.dcm")
    found = issue_of(read(path), "missing_window", "validate")
    assert "(0028,1050)" in found.message and "fallback_window" in found.message
    samples = read(path, file_window(), fallback_window=window(40, 80, name="brain"))
    assert isinstance(samples, list)
    assert samples[0].metadata["windows"][0]["source"] == "fallback_explicit"


def test_file_window_by_index_and_explanation(tmp_path: Path) -> None:
    ds = ct_dataset(center=[40, 600], width=[80, 2800])
    ds.WindowCenterWidthExplanation = ["BRAIN", "BONE"]
    path = save(ds, tmp_path / "two.dcm")
    by_index = read(path, file_window(1))
    by_text = read(path, file_window("bone"))
    assert isinstance(by_index, list) and isinstance(by_text, list)
    assert by_index[0].metadata["windows"][0]["center"] == 600
    np.testing.assert_array_equal(by_index[0].image, by_text[0].image)
    issue_of(read(path, file_window(2)), "missing_window")
    assert "BRAIN" in issue_of(read(path, file_window("lung")), "missing_window").message


def test_invalid_file_window_is_missing(tmp_path: Path) -> None:
    path = save(ct_dataset(center=40, width=0.5), tmp_path / "thin.dcm")
    assert "width >= 1" in issue_of(read(path), "missing_window").message


# ---------------------------------------------------------------- pinned decoders


def test_decoder_table_pins_one_plugin_per_syntax() -> None:
    table = decoder_table()
    assert set(table.values()) == {"pydicom", "pylibjpeg"}
    assert table["1.2.840.10008.1.2.5"] == "pydicom"
    for uid in ("1.2.840.10008.1.2.4.50", "1.2.840.10008.1.2.4.51", "1.2.840.10008.1.2.4.57",
                "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81",
                "1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.91"):
        assert table[uid] == "pylibjpeg"
    table["1.2.840.10008.1.2.5"] = "changed"
    assert decoder_table()["1.2.840.10008.1.2.5"] == "pydicom"  # a copy, not shared state


@pytest.mark.parametrize("name", ["JPGExtended.dcm", "SC_rgb_jpeg_dcmtk.dcm", "MR_small_RLE.dcm",
                                  "MR_small_jpeg_ls_lossless.dcm", "JPEG2000.dcm"])
def test_read_passes_the_pinned_plugin(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def spy(ds: Any, **kwargs: Any) -> np.ndarray:
        seen.append(kwargs.get("decoding_plugin", ""))
        return pixel_array(ds, **kwargs)

    monkeypatch.setattr(reader, "pixel_array", spy)
    path = shipped(name)
    samples = read(path, window(1000, 2000))
    assert isinstance(samples, list)
    syntax = str(pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID)
    assert seen == [decoder_table()[syntax]]
    assert samples[0].metadata["decoder"] == decoder_table()[syntax]
    assert samples[0].metadata["transfer_syntax"] == syntax


# ---------------------------------------------------------------- compressed syntaxes equal the native reference


def _float16(path: Path) -> np.ndarray:
    samples = read(path, output="float16")
    assert isinstance(samples, list), getattr(samples, "message", "")
    return np.stack([s.image for s in samples])


def _uint16(path: Path, *windows: Any) -> np.ndarray:
    samples = read(path, *windows, output="uint16")
    assert isinstance(samples, list), getattr(samples, "message", "")
    return np.stack([s.image for s in samples])


@pytest.mark.parametrize(("syntax", "plugin"), [(RLELossless, "pydicom"), (RLELossless, "pylibjpeg"),
                                                 (JPEG2000Lossless, "pylibjpeg")])
def test_generated_lossless_files_equal_native(tmp_path: Path, syntax: str, plugin: str) -> None:
    pixels = ct_pixels((64, 64), seed=3)
    native = save(ct_dataset(pixels), tmp_path / "native.dcm")
    ds = ct_dataset(pixels)
    ds.compress(syntax, encoding_plugin=plugin)
    packed = save(ds, tmp_path / "packed.dcm")
    np.testing.assert_array_equal(_float16(packed), _float16(native))
    np.testing.assert_array_equal(_uint16(packed, file_window()), _uint16(native, file_window()))


def test_a_codestream_whose_rows_and_columns_are_the_headers_swapped_is_bad_shape(tmp_path: Path) -> None:
    """A 64×48 JPEG 2000 codestream under Rows 48, Columns 64: as many pixels, so pydicom reshaped
    it without a word and the rows packed scrambled, as a good sample."""
    ds = ct_dataset(ct_pixels((64, 48), seed=4))
    ds.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")
    ds.Rows, ds.Columns = 48, 64
    found = issue_of(read(save(ds, tmp_path / "swapped.dcm")), "bad_shape", "validate")
    assert "codestream header says 64×48 pixels" in found.message and "say 48×64" in found.message


def test_a_codestream_deeper_than_bits_allocated_is_bad_shape_not_its_low_byte(tmp_path: Path) -> None:
    """A 12-bit JPEG 2000 codestream under Bits Allocated 8: pydicom returned each value's low
    byte, packed as a good sample."""
    ds = ct_dataset(ct_pixels((32, 32), seed=5, low=0, high=4096).astype(np.uint16), PixelRepresentation=0)
    ds.BitsStored, ds.HighBit = 12, 11
    ds.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    found = issue_of(read(save(ds, tmp_path / "deep.dcm")), "bad_shape", "validate")
    assert "holds 12-bit values but (0028,0100) Bits Allocated is 8" in found.message


def test_a_codestream_carrying_the_bits_above_bits_stored_reads_as_the_native_file_does(tmp_path: Path) -> None:
    """Bits Stored 12 of 16, signed, the 4 high bits holding garbage as some modalities write
    them: pydicom keeps only the 12 stored bits, sign-extended, for native and RLE data (PS3.5
    8.1.1), but gives a JPEG 2000 codestream that carries all 16 bits as it is: the same image
    packed two ways by its transfer syntax. Now both read as the native file."""
    rng = np.random.default_rng(6)
    stored = rng.integers(0, 4096, (32, 32)).astype(np.uint16)
    raw = stored | (rng.integers(0, 16, (32, 32)).astype(np.uint16) << 12)

    def dataset() -> Any:
        ds = ct_dataset(raw, center=None, width=None, PixelRepresentation=0)
        ds.BitsStored, ds.HighBit = 16, 15
        return ds

    compressed = dataset()
    compressed.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")  # a codestream of all 16 bits
    for ds in (native := dataset(), compressed):
        ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 12, 11, 1
    native.PixelData = raw.tobytes()
    signed = np.where(stored >= 2048, stored.astype(np.int32) - 4096, stored)  # the 12 bits, sign-extended
    for path in (save(native, tmp_path / "native.dcm"), save(compressed, tmp_path / "j2k.dcm")):
        np.testing.assert_array_equal(_float16(path)[0, 0], (signed - 1024).astype(np.float16), err_msg=path.name)


def test_generated_lossy_jpeg2000_is_close_to_native(tmp_path: Path) -> None:
    yy, xx = np.mgrid[0:64, 0:64]
    pixels = (1000 + 8 * yy + 4 * xx).astype(np.int16)  # smooth: lossy coding keeps it close
    ds = ct_dataset(pixels, center=400, width=1200)
    ds.compress(JPEG2000, encoding_plugin="pylibjpeg", j2k_cr=[20])
    assert str(ds.file_meta.TransferSyntaxUID) == "1.2.840.10008.1.2.4.91"
    lossy = read(save(ds, tmp_path / "lossy.dcm"))
    exact = read(save(ct_dataset(pixels, center=400, width=1200), tmp_path / "exact.dcm"))
    assert isinstance(lossy, list) and isinstance(exact, list)
    assert np.abs(lossy[0].image.astype(int) - exact[0].image.astype(int)).max() <= 1


@pytest.mark.parametrize("name", ["MR_small_RLE.dcm", "MR_small_jp2klossless.dcm", "MR_small_jpeg_ls_lossless.dcm",
                                  "MR_small_bigendian.dcm", "MR_small_expb.dcm", "MR_small_implicit.dcm"])
def test_shipped_mr_syntaxes_equal_the_explicit_little_endian_original(name: str) -> None:
    reference = shipped("MR_small.dcm")
    np.testing.assert_array_equal(_float16(shipped(name)), _float16(reference))
    np.testing.assert_array_equal(_uint16(shipped(name), file_window()), _uint16(reference, file_window()))


@pytest.mark.parametrize("name", ["SC_rgb_jpeg_gdcm.dcm", "SC_rgb_gdcm_KY.dcm", "SC_rgb_rle_16bit.dcm"])
def test_shipped_rgb_lossless_syntaxes_equal_rle_reference(name: str) -> None:
    reference = read(shipped("SC_rgb_rle.dcm"))
    other = read(shipped(name))
    assert isinstance(reference, list) and isinstance(other, list)
    np.testing.assert_array_equal(other[0].image, reference[0].image)


def test_deflated_syntax_decodes(tmp_path: Path) -> None:
    samples = read(shipped("image_dfl.dcm"), window(128, 256))
    assert isinstance(samples, list)
    stored = pixel_array(pydicom.dcmread(shipped("image_dfl.dcm"))).astype(np.float64)
    expected = np.rint(np.clip((stored - 127.5) / 255 + 0.5, 0, 1) * 255)
    np.testing.assert_array_equal(samples[0].image[0], expected)


def test_a_deflated_file_cut_short_is_truncated_as_a_native_one_is(tmp_path: Path) -> None:
    """Its deflate stream stops short: the record called the header unparseable (unreadable), where
    the same cut of an Explicit VR file is truncated, naming the fix (copy it again)."""
    data = shipped("image_dfl.dcm").read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[:len(data) - 400])
    for result in (read(cut), probe(cut)):
        assert isinstance(result, Issue) and (result.reason, result.stage) == ("truncated", "read"), result
        assert "cut short, copy it again" in result.message


def test_big_endian_gives_native_byte_order() -> None:
    for output in ("uint16", "float16"):
        samples = read(shipped("MR_small_bigendian.dcm"), output=output)
        assert isinstance(samples, list)
        assert samples[0].image.dtype.isnative and samples[0].image.flags.c_contiguous
    dose = read(shipped("rtdose_expb.dcm"), output="float16")
    little = read(shipped("rtdose.dcm"), output="float16")
    assert isinstance(dose, list) and isinstance(little, list)
    np.testing.assert_array_equal(np.stack([s.image for s in dose]), np.stack([s.image for s in little]))


def _with_meta_syntax(data: bytes, syntax: str) -> bytes:
    """``data`` (a Part 10 file) with its file meta rewritten to name ``syntax``, its data set as it was."""
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_file_meta_info

    meta = pydicom.dcmread(DicomBytesIO(data), stop_before_pixels=True).file_meta
    start = reader._meta_transfer_syntax(data[:1 << 16])[1]
    meta.TransferSyntaxUID = syntax
    out = DicomBytesIO()
    out.is_little_endian, out.is_implicit_VR = True, False
    write_file_meta_info(out, meta, enforce_standard=True)
    return data[:132] + out.getvalue() + data[start:]


@pytest.mark.parametrize(("body", "claimed", "found", "fix"), [
    ("explicit", "1.2.840.10008.1.2.2", "is little endian", "1.2.840.10008.1.2.1 (Explicit VR Little Endian)"),
    ("implicit", "1.2.840.10008.1.2.2", "is little endian", "1.2.840.10008.1.2 (Implicit VR Little Endian)"),
    ("big", "1.2.840.10008.1.2.1", "is big endian", "1.2.840.10008.1.2.2 (Explicit VR Big Endian)"),
    ("explicit", "1.2.840.10008.1.2.1.99", "is not deflated", "1.2.840.10008.1.2.1 (Explicit VR Little Endian)")])
def test_a_file_meta_naming_a_syntax_its_data_set_is_not_in_is_unreadable_naming_both(
        body: str, claimed: str, found: str, fix: str, tmp_path: Path) -> None:
    """A broken converter's file meta names Big Endian over a little-endian data set (or the
    reverse, or Deflated over one not deflated): read as declared, the header is a few nonsense
    tags, which called the file a CT exported without its pixels (no_pixel_data) and let a
    ``where: {Modality: CT}`` leave it out as filtered ("Modality is absent"), never a bad sample.
    It is unreadable, by the probe and the read, naming the declared syntax, what the data set
    is, and the (0002,0010) that fixes it."""
    if body == "big":
        data = shipped("MR_small_bigendian.dcm").read_bytes()
    else:
        ds = ct_dataset()
        if body == "implicit":
            ds.file_meta = pydicom.dataset.FileMetaDataset()
            ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2"
        data = save(ds, tmp_path / "ct.dcm").read_bytes()
    damaged = tmp_path / "damaged.dcm"
    damaged.write_bytes(_with_meta_syntax(data, claimed))
    where = (Condition("Modality", "in", ("CT", "MR")),)
    filtered = probe_dicom(make_ref(damaged), entity_keyword="PatientID", time_keywords=TIME, where=where)
    for result in (probe(damaged), filtered, read(damaged)):
        message = issue_of(result, "unreadable", "read").message
        assert f"Transfer Syntax UID is {claimed}" in message and f"data set {found}" in message, message
        assert f"set (0002,0010) to {fix}, or re-export the file" in message, message
    intact = tmp_path / "intact.dcm"
    intact.write_bytes(data)
    assert isinstance(probe(intact), DicomHeader)  # the same data set under its own syntax reads well


def test_a_header_that_was_not_read_well_is_a_bad_sample_never_filtered(tmp_path: Path) -> None:
    """Only a header read well can be left out by the source's where: a data set with neither its
    SOP Class UID nor an Image Pixel module, under a file meta naming CT Image Storage, is a damaged
    CT (what a misparsed header reads as), not a file whose Modality is absent on purpose: a bad
    sample (no_pixel_data, counted against max_bad_fraction), never ``filtered``. A header that
    does read well and fails the where: is still filtered."""
    ds = ct_dataset()
    save(ds, tmp_path / "ct.dcm")
    for keyword in [e.keyword for e in ds if e.keyword not in ("PatientID", "StudyInstanceUID", "StudyDate")]:
        delattr(ds, keyword)
    path = save(ds, tmp_path / "damaged.dcm")
    assert pydicom.dcmread(path).file_meta.MediaStorageSOPClassUID == "1.2.840.10008.5.1.4.1.1.2"
    where = (Condition("Modality", "in", ("CT",)),)
    damaged = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, where=where)
    assert "the file is damaged" in issue_of(damaged, "no_pixel_data").message
    other = (Condition("Modality", "in", ("MR",)),)
    intact = probe_dicom(make_ref(tmp_path / "ct.dcm"), entity_keyword="PatientID", time_keywords=TIME, where=other)
    assert isinstance(intact, Excluded) and intact.why == "filtered", intact


def test_decode_step_returns_native_byte_order() -> None:
    # The decoded stored values feed pixel hashing and float16 output: '>i2' must not leak out.
    ref = make_ref(shipped("MR_small_bigendian.dcm"))
    ds = pydicom.dcmread(ref.path)
    assert not pixel_array(ds).dtype.isnative  # pydicom itself keeps big-endian order
    geometry = reader._check_image(ref, ds)
    assert not isinstance(geometry, Issue)
    result = reader._decode(ref, ds, geometry)
    assert not isinstance(result, Issue) and result.note is None
    decoded = result.pixels
    assert decoded.dtype.isnative and decoded.shape == (1, 64, 64, 1)
    little = pixel_array(pydicom.dcmread(shipped("MR_small.dcm")))
    np.testing.assert_array_equal(decoded[0, :, :, 0], little)


def test_modality_windows_give_a_radiograph_its_own_window_next_to_ct_presets(tmp_path: Path) -> None:
    """One config, two modalities: the CT gets the two CT windows, the MONOCHROME1 CR its file's
    window (2048/4096, "FULL"), inverted as MONOCHROME1 requires."""
    from packer.demo import make_uids, render_ct_phantom, render_radiograph, seeded_rng, write_cr_image, write_ct_slice

    rng = seeded_rng(0, "modality-windows")
    cr_pixels = render_radiograph(rng)
    write_cr_image(tmp_path / "cr.dcm", patient_id="P1", study_date="20240101", pixels=cr_pixels,
                   uids=make_uids(0, "P1", 1, 1, study=1))
    write_ct_slice(tmp_path / "ct.dcm", patient_id="P2", study_date="20240101", pixels_hu=render_ct_phantom(rng),
                   uids=make_uids(0, "P2", 1, 1, study=1))
    cfg = config(window(-600, 1500, name="lung"), window(40, 400, name="mediastinum"),
                 modality_windows=(("CR", (file_window(),)),))
    [ct] = read_dicom(make_ref(tmp_path / "ct.dcm"), cfg)  # type: ignore[misc]
    [cr] = read_dicom(make_ref(tmp_path / "cr.dcm"), cfg)  # type: ignore[misc]
    assert ct.image.shape[0] == 2 and [w["center"] for w in ct.metadata["windows"]] == [-600, 40]
    assert cr.image.shape[0] == 1 and len(cr.metadata["windows"]) == 1
    assert (cr.metadata["windows"][0]["center"], cr.metadata["windows"][0]["width"]) == (2048, 4096)
    # what the CR's own window alone gives, with no modality_windows in play
    [alone] = read_dicom(make_ref(tmp_path / "cr.dcm"), config(file_window()))  # type: ignore[misc]
    np.testing.assert_array_equal(cr.image, alone.image)
    # and without modality_windows the CR would get the CT presets: a different image
    [as_ct] = read_dicom(make_ref(tmp_path / "cr.dcm"), config(window(-600, 1500, name="lung")))  # type: ignore[misc]
    assert not np.array_equal(as_ct.image[0], cr.image[0])


def _outcome(result: list[Sample] | Issue) -> Any:
    if isinstance(result, Issue):
        return result
    return [(s.key, s.image.dtype.str, s.image.shape, s.image.tobytes(), json.dumps(s.metadata, sort_keys=True))
            for s in result]


@pytest.mark.parametrize("name", sorted(p.name for p in TEST_FILES.glob("*.dcm")))
def test_reading_from_memory_and_streaming_give_the_same_outcome(name: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The full parse reads small files whole and parses them from memory; a file over
    WHOLE_READ_MAX streams through BoundedFile. Every shipped pydicom file (valid, truncated,
    deflated, odd) and a cut copy of it read the same either way: samples or issue."""
    cut = tmp_path / f"cut-{name}"
    data = (TEST_FILES / name).read_bytes()
    cut.write_bytes(data[: max(0, len(data) * 2 // 3)])
    cfg = config(window(40, 400), fallback_window=window(40, 400))
    for path in (TEST_FILES / name, cut):
        in_memory = read_dicom(make_ref(path), cfg)
        monkeypatch.setattr(reader, "WHOLE_READ_MAX", -1)
        streamed = read_dicom(make_ref(path), cfg)
        monkeypatch.undo()
        assert _outcome(in_memory) == _outcome(streamed)


@pytest.mark.parametrize(("uid", "said"), [
    ("1.2.840.10008.1.2.7", "(one pydicom {version} does not know: newer than it, or made up)"),
    ("1.2.840.10008.1.2.4.112", "(JPEG XL)"), ("1.2.840.10008.1.2.8.1", "(Deflated Image Frame Compression)")])
def test_an_unknown_transfer_syntax_is_named_where_dicom_defines_it_and_never_by_itself(
        tmp_path: Path, uid: str, said: str) -> None:
    """A UID pydicom does not name is not thereby no DICOM syntax: JPEG XL and Deflated Image Frame
    Compression are newer than pydicom 3.0 (they were called "not a transfer syntax DICOM
    defines", which sent users to fix a header that was fine)."""
    import pydicom

    path = _relabelled(save(ct_dataset(ct_pixels((8, 8))), tmp_path / "odd.dcm"), uid)
    found = issue_of(probe(path), "unsupported_transfer_syntax")
    assert f"{uid} {said.format(version=pydicom.__version__)}" in found.message
    assert f"{uid} ({uid})" not in found.message and "DICOM defines" not in found.message


@pytest.mark.parametrize("uid", ["1.2.840.10008.1.2.4.102", "1.2.840.10008.1.2.4.107", "1.2.840.10008.1.2.4.100"])
def test_a_video_transfer_syntax_is_told_how_to_get_frames_not_to_transcode(tmp_path: Path, uid: str) -> None:
    """An ultrasound cine stored as H.264 (or HEVC, MPEG-2) was told to transcode it with dcmconv
    +te or gdcmconv --raw, neither of which decodes video."""
    path = _relabelled(save(ct_dataset(ct_pixels((8, 8))), tmp_path / "cine.dcm"), uid)
    found = issue_of(probe(path), "unsupported_transfer_syntax")
    assert "is a video stream, which packer does not decode" in found.message and "ffmpeg" in found.message
    assert "dcmconv" not in found.message


def _sequence_as_ob(ds: Any, keyword: str, path: Path) -> Path:
    """Save ``ds``, then rewrite the VR of its top-level ``keyword`` sequence from SQ to OB: a
    damaged export whose functional groups or LUT read back as bytes, not items."""
    save(ds, path)
    tag = Tag(tag_for_keyword(keyword))
    header = struct.pack("<HH", tag.group, tag.element) + b"SQ"
    raw = path.read_bytes()
    assert raw.count(header) == 1
    path.write_bytes(raw.replace(header, header[:4] + b"OB"))
    return path


def _enhanced() -> Any:
    return enhanced_ct_dataset(ct_pixels((2, 16, 16)), [None, None], [None, None], shared_rescale=(1.0, -1024.0),
                               shared_window=(40, 400))


def _with_luts() -> Any:
    ds = ct_dataset(center=None, width=None)
    ds.ModalityLUTSequence = DicomSequence([lut_item(0, 16, list(range(0, 4096, 2)))])
    ds.VOILUTSequence = DicomSequence([lut_item(0, 16, list(range(0, 65536, 16)))])
    del ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType
    return ds


@pytest.mark.parametrize(("make", "keyword"), [
    (_enhanced, "PerFrameFunctionalGroupsSequence"),
    (_enhanced, "SharedFunctionalGroupsSequence"),
    (_with_luts, "ModalityLUTSequence"),
    (_with_luts, "VOILUTSequence"),
])
def test_a_sequence_that_reads_back_as_bytes_is_unreadable_not_a_crash(tmp_path: Path, make: Any,
                                                                       keyword: str) -> None:
    """A sequence whose VR a damaged export wrote as OB reads back as bytes, whose items are ints:
    the probe crashed the whole build on it (AttributeError: 'int' object has no attribute 'get',
    found by mutating an Enhanced CT). It is the file's own bad sample, naming the tag."""
    path = _sequence_as_ob(make(), keyword, tmp_path / f"{keyword}.dcm")
    ref = make_ref(path)
    tag = str(Tag(tag_for_keyword(keyword)))
    outcomes = [probe_dicom(ref, entity_keyword="PatientID", time_keywords=TIME),
                probe_dicom(ref, entity_keyword="PatientID", time_keywords=TIME, keep_pixels=True),
                probe_dicom(ref, entity_keyword="PatientID", time_keywords=TIME, placement=True, slices=False),
                read(path, file_window()), read(path, window(40, 400))]
    for result in outcomes:
        if isinstance(result, DicomHeader):  # a sequence the probe does not need: the read says why
            continue
        found = issue_of(result, "unreadable", "read")
        assert tag in found.message and keyword in found.message and path.name in found.message, found.message
    assert isinstance(outcomes[-1], Issue) or keyword == "VOILUTSequence"


def test_a_bug_in_the_dicom_probe_is_the_files_unexpected_error_not_a_crashed_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image and NIfTI probes each have one boundary that turns an exception nobody foresaw
    into the file's ``unexpected_error``; the DICOM probe had none, so one damaged header (an
    Enhanced CT whose functional groups read back as bytes) ended the whole build with an
    internal error and a traceback instead of a bad-sample row."""
    from packer.config import parse_job
    from packer.pipeline.probe import probe_for_read, probe_placement
    from packer.records import SampleRef

    path = save(ct_dataset(), tmp_path / "raw" / "a.dcm")
    job = parse_job({"name": "j", "sources": [{"kind": "dicom", "root": "raw", "label": "none"}],
                     "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 0},
                     "transform": {"dicom": {"windows": ["lung"]}}, "pack": {"format": "webdataset"},
                     "output": "out", "phi": {"mode": "keep"}}, tmp_path / "job.yaml")
    ref = SampleRef(sample_id="raw-a", source=job.sources[0].name, kind="dicom", path=str(path), relpath="a.dcm")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'int' object has no attribute 'get'")

    monkeypatch.setattr(reader, "probe_dicom", broken)
    for outcome in (probe_for_read(ref, job), probe_placement(ref, job)):
        found = issue_of(outcome, "unexpected_error", "read")
        assert found.message == f"{path}: AttributeError: 'int' object has no attribute 'get'"


def test_sequences_nested_thousands_deep_are_unreadable_not_a_reader_bug(tmp_path: Path) -> None:
    """A crafted header of 5,000 nested sequences made pydicom's parser recurse past Python's
    limit: the RecursionError was an unexpected_error, "a reader bug", not the file's defect."""
    data = save(ct_dataset(ct_pixels((16, 16))), tmp_path / "ok.dcm").read_bytes()
    at = data.rfind(struct.pack("<HH", 0x7FE0, 0x0010))
    opening = struct.pack("<HH2sHI", 0x0040, 0xA730, b"SQ", 0, 0xFFFFFFFF) + struct.pack("<HHI", 0xFFFE, 0xE000,
                                                                                         0xFFFFFFFF)
    closing = struct.pack("<HHI", 0xFFFE, 0xE00D, 0) + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)
    path = tmp_path / "deep.dcm"
    path.write_bytes(data[:at] + opening * 5000 + closing * 5000 + data[at:])
    for outcome in (probe(path), read(path)):
        found = issue_of(outcome, "unreadable", "read")
        assert "nested deeper than a reader can follow" in found.message


def test_a_multi_valued_attribute_reads_as_dicom_writes_it() -> None:
    """ScanningSequence SE\\IR (several values: LABEL_ATTRIBUTES allows it as a class) read as
    Python's list text, "['SE', 'IR']": a label map keyed by the header's own form never matched,
    and unknown_label told the user to map the list text."""
    from packer.read.dicom_attrs import text_value

    ds = ct_dataset(ct_pixels((4, 4)))
    ds.ScanningSequence = ["SE", "IR"]
    ds.SequenceVariant = "SK"
    assert text_value(ds, "ScanningSequence") == "SE\\IR"
    assert text_value(ds, "SequenceVariant") == "SK"


def test_an_rle_file_with_fewer_frames_than_it_declares_says_so_not_end_marker(tmp_path: Path) -> None:
    """RLE has no end marker, and a whole file with a wrong Number of Frames is not fixed by
    copying it again: the record said "a frame lacks its end marker ... StopIteration: ; copy the file
    again"; it names both counts and both fixes."""
    ds = pydicom.dcmread(shipped("MR_small_RLE.dcm"))
    ds.NumberOfFrames = 2
    found = issue_of(read(save(ds, tmp_path / "two.dcm")), "truncated", "read")
    assert "it holds 1 frame(s) where (0028,0008) Number of Frames declares 2" in found.message, found.message
    assert "end marker" not in found.message and "StopIteration" not in found.message
    assert "copy it again" in found.message and "fix the header" in found.message


def _placed_slice_refusal(tmp_path: Path, keyword: str, value: bytes) -> str:
    """The message of the ``unreadable`` record a series job's header probe gives a CT slice
    whose ``keyword`` (DS) holds the raw bytes ``value``."""
    ds = ct_dataset(ImagePositionPatient=[0, 0, 0], ImageOrientationPatient=[1, 0, 0, 0, 1, 0])
    raw_element(ds, keyword, "DS", value)
    path = save(ds, tmp_path / "slice.dcm")
    placed = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, placement=True)
    assert isinstance(placed, MemberIssue)
    return issue_of(placed.issue, "unreadable", "read").message


@pytest.mark.parametrize(("keyword", "value", "why"), [
    ("ImagePositionPatient", b"0\\NaN\\0\\4 ", "it holds 4 value(s), not 3"),
    ("ImagePositionPatient", b"0\\NaN\\4 ", "value 2 'NaN' is no number"),
    ("ImagePositionPatient", b"0\\0 ", "it holds 2 value(s), not 3"),
    ("ImageOrientationPatient", b"1\\0\\0\\0\\1\\0\\0 ", "it holds 7 value(s), not 6"),
    ("ImageOrientationPatient", b"1\\0\\0\\0\\1\\inf ", "value 6 'inf' is no number"),
], ids=["nan-of-four", "nan-of-three", "two", "seven-cosines", "inf-cosine"])
def test_a_placed_image_position_or_orientation_with_a_bad_entry_is_unreadable_never_shifted(
        tmp_path: Path, keyword: str, value: bytes, why: str) -> None:
    """A DS entry that is no number was dropped and the rest shifted into its place: a slice whose
    Image Position read "0\\NaN\\0\\4" (four values, VM 3) was stacked at (0, 0, 4). Every entry and
    the value count are checked: the series job's header probe refuses the file (holding back its
    series), naming the element, quoting the value and saying the fix."""
    message = _placed_slice_refusal(tmp_path, keyword, value)
    tag = "(0020,0032) Image Position (Patient)" if keyword == "ImagePositionPatient" else \
        "(0020,0037) Image Orientation (Patient)"
    assert f"{tag} '{value.decode().strip()}' is malformed: {why}" in message
    assert "fix the value in the file's header" in message and "copy the file again" not in message


def test_floats_never_drop_one_entry_and_shift_the_rest() -> None:
    """``floats`` is all or nothing: "NaN\\0.5\\0.7" is no value, not the Pixel Spacing 0.5 x 0.7."""
    from pydicom.valuerep import DSfloat

    from packer.read.dicom_attrs import floats

    assert floats([DSfloat("NaN"), DSfloat("0.5"), DSfloat("0.7")]) == ()
    assert floats(["0", "4,5"]) == ()
    assert floats([DSfloat("0.5"), DSfloat("0.7")]) == (0.5, 0.7)


def test_a_pixel_spacing_with_a_bad_entry_is_recorded_as_null_with_a_warning_not_shifted(tmp_path: Path) -> None:
    """A job that does not resample records Pixel Spacing "NaN\\0.5\\0.7" as null, saying why: it
    was recorded as [0.5, 0.7], the first entry dropped and the others shifted into its place."""
    ds = ct_dataset()
    raw_element(ds, "PixelSpacing", "DS", b"NaN\\0.5\\0.7 ")
    (sample,) = read(save(ds, tmp_path / "spacing.dcm"), window(40.0, 400.0))
    assert sample.metadata["pixel_spacing"] is None
    assert any("(0028,0030) Pixel Spacing 'NaN\\0.5\\0.7' is malformed: it holds 3 value(s), not 2" in w
               for w in sample.metadata["warnings"])


@pytest.mark.parametrize(("keyword", "value", "tag"), [
    ("ImagePositionPatient", b"0\\0\\4,5 ", "(0020,0032) Image Position (Patient)"),
    ("ImageOrientationPatient", b"1,0\\0\\0\\0\\1\\0 ", "(0020,0037) Image Orientation (Patient)"),
    ("PixelSpacing", b"0,5\\0,5 ", "(0028,0030) Pixel Spacing"),
], ids=["position", "orientation", "pixel-spacing"])
def test_a_placed_geometry_value_with_a_decimal_comma_is_malformed_not_absent(
        tmp_path: Path, keyword: str, value: bytes, tag: str) -> None:
    """A series refused a slice whose Image Position read "0\\0\\4,5" as one that "has no Image
    Position (Patient)", and a volume whose Pixel Spacing read "0,5\\0,5" as one whose slices "give
    no Pixel Spacing": the user went looking for a missing tag. The element is there: its file is
    unreadable, the message quotes it and names the decimal comma."""
    message = _placed_slice_refusal(tmp_path, keyword, value)
    bad = value.decode().strip().split("\\")
    n = next(i for i, entry in enumerate(bad, 1) if "," in entry)
    assert f"{tag} '{value.decode().strip()}' is malformed: value {n} '{bad[n - 1]}' is no" in message
    assert "(a decimal comma: DS writes a period)" in message and "has no" not in message
