"""Text in every character set reads as its writer wrote it, wherever packer compares it.

A multi-byte DICOM character whose encoding holds the byte 0x5C (GB18030 乗 = 81 5C, JIS X 0208 倍 =
47 5C after ESC $ B) is no value delimiter: PS3.5 6.1.2.3, "Only the character that encodes as a
single byte valued 05/12 is a delimiter". Read as one, MRN乗01 became MRN\\x81\\01 with a warning
of undecodable bytes, another entity than the same id in UTF-8 (one patient in two splits).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataelem import DataElement

from packer.read.dicom import DicomHeader, probe_dicom
from packer.read.dicom_attrs import text_value
from packer.records import Excluded
from packer.structures import Structure, StructureMap
from packer.where import parse_where
from tests.dicom_files import make_ref
from tests.test_dicom_text_bytes import TIME, ct_with_element, entity_of

#: Text whose encodings hold a 0x5C byte inside a character, and the (0008,0005) that declares each.
SPLIT_BY_BACKSLASH = [
    ("GB18030", "MRN乗01", "gb18030"),            # 乗 = 81 5C
    ("GB18030", "俓^伟", "gb18030"),              # 俓 = 82 5C
    ("GB18030", "ID\U00020000\\乗", "gb18030"),   # a four-byte character, then a true delimiter
    ("GBK", "MRN乗01", "gbk"),
    (["", "ISO 2022 IR 87"], "ID倍01", "iso2022_jp"),  # ESC $ B 47 5C
    (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^倍俊", "iso2022_jp"),
]


@pytest.mark.parametrize(("charset", "text", "codec"), SPLIT_BY_BACKSLASH)
def test_a_multi_byte_character_holding_0x5c_is_no_value_delimiter(tmp_path: Path, charset: str | list[str],
                                                                   text: str, codec: str) -> None:
    """The id and the name read as in UTF-8, one entity, and no warning of undecodable bytes."""
    keyword = "PatientName" if "^" in text else "PatientID"
    raw = text.encode(codec)
    assert raw.count(b"\\") > text.count("\\")  # a 0x5C inside a character
    coded = ct_with_element(tmp_path / "coded.dcm", raw, charset, keyword)
    utf8 = ct_with_element(tmp_path / "utf8.dcm", text.encode(), "ISO_IR 192", keyword)
    assert entity_of(coded, keyword) == entity_of(utf8, keyword) == (text, [])
    assert text_value(pydicom.dcmread(coded), keyword) == text


def test_a_single_byte_backslash_between_multi_byte_characters_still_splits_values(tmp_path: Path) -> None:
    """乗\\俓 under GB18030 is two values, as pydicom reads it; the split is at the lone 0x5C only."""
    path = ct_with_element(tmp_path / "two.dcm", "乗\\俓".encode("gb18030"), "GB18030")
    assert text_value(pydicom.dcmread(path), "PatientID") == "乗\\俓"
    assert list(pydicom.dcmread(path).PatientID) == ["乗", "俓"]


@pytest.mark.parametrize(("charset", "codec"), [("GB18030", "gb18030"), (["", "ISO 2022 IR 87"], "iso2022_jp")])
def test_where_and_label_attribute_values_holding_0x5c_read_whole(tmp_path: Path, charset: str | list[str],
                                                                  codec: str) -> None:
    """A where: value and the label attribute read the same path: 乗 / 倍 kept, the file kept."""
    text = "乗倍" if codec == "gb18030" else "倍"
    path = ct_with_element(tmp_path / "s.dcm", f"AX {text}".encode(codec), charset, "PatientID")
    where = parse_where({"PatientID": f"AX {text}"}, "sources[0].where")
    header = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME, where=where,
                         label_keyword="PatientID")
    assert not isinstance(header, Excluded), header
    assert isinstance(header, DicomHeader) and header.label_value == f"AX {text}"


def test_an_roi_name_holding_0x5c_maps_to_its_structure(tmp_path: Path) -> None:
    """ROIName PTV乗 (GB18030) sits in an item that inherits the file's character set: it maps by
    the name written in the job, not as PTV\\x81 and a second value."""
    from tests.test_rtstruct import ISLAND_A, ISLAND_B, closed, paint, rtstruct, series

    slices = series()
    ds = rtstruct([("PLACEHOLDER A", [closed(slices[3], ISLAND_A)]), ("PLACEHOLDER B", [closed(slices[7], ISLAND_B)])])
    for item, name in zip(ds.StructureSetROISequence, ("PTV乗", "CTV俓"), strict=True):
        item.add(DataElement(0x30060026, "LO", name.encode("gb18030")))
    ds.SpecificCharacterSet = "GB18030"
    rois = StructureMap((Structure("boost", 1, aliases=("PTV乗",)), Structure("elective", 2, aliases=("CTV俓",))))
    labels, drawn = paint(tmp_path, ds, slices, rois=rois)
    assert drawn.unmapped == ()
    assert set(np.unique(labels[3])) == {0, 1} and set(np.unique(labels[7])) == {0, 2}
