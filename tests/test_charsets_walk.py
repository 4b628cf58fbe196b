"""Text in every character set reads as its writer wrote it, wherever packer compares it.

A multi-byte DICOM character whose encoding holds the byte 0x5C (GB18030 乗 = 81 5C, JIS X 0208 倍 =
47 5C after ESC $ B) is no value delimiter: PS3.5 6.1.2.3, "Only the character that encodes as a
single byte valued 05/12 is a delimiter". Read as one, MRN乗01 became MRN\\x81\\01 with a warning
of undecodable bytes, another entity than the same id in UTF-8 (one patient in two splits).
"""

from __future__ import annotations

import gzip
import unicodedata
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pydicom
import pytest
import yaml
from pydicom.dataelem import DataElement

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover
from packer.pipeline.probe import probe_ref
from packer.read.dicom import DicomHeader, probe_dicom
from packer.read.dicom_attrs import text_value
from packer.records import Excluded, SampleRef
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


# -- a label map: its keys match a cell in either Unicode form -------------------------------------

FIEVRE_NFC, FIEVRE_NFD = "fièvre", unicodedata.normalize("NFD", "fièvre")


def _images(root: Path, count: int) -> list[str]:
    """``count`` real PNG files p0/a.png, p1/a.png ... under ``root``, each its own picture."""
    names = []
    for i in range(count):
        (root / f"p{i}").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / f"p{i}/a.png"), np.random.default_rng(i).integers(0, 255, (16, 16), dtype=np.uint8))
        names.append(f"p{i}/a.png")
    return names


def _job(tmp_path: Path, source: dict[str, Any], **extra: Any) -> Path:
    doc = {"name": "t", "sources": [{"kind": "image", "root": "raw", **source}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out", **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def _table(tmp_path: Path, column: str, cells: list[str]) -> None:
    """raw/t.csv naming one image per cell, ``column`` holding the cell, each image its own entity."""
    names = _images(tmp_path / "raw", len(cells))
    rows = [f"{name},{cell},E{i}" for i, (name, cell) in enumerate(zip(names, cells, strict=True))]
    (tmp_path / "raw" / "t.csv").write_text("\n".join([f"path,{column},entity", *rows]) + "\n", encoding="utf-8")


@pytest.mark.parametrize("key", [FIEVRE_NFC, FIEVRE_NFD])
def test_a_label_map_key_matches_a_cell_written_in_the_other_unicode_form(tmp_path: Path, key: str) -> None:
    """README: a cell that differs from a listed label only in Unicode form is that label; a map
    key is listed too. The NFD cell (a macOS export) was unknown_label, its message printing the
    key and the cell alike."""
    _table(tmp_path, "label", [FIEVRE_NFC, FIEVRE_NFD, "chien"])
    job = load_job(_job(tmp_path, {"table": "raw/t.csv", "label": {"column": "label",
                                                                   "map": {key: "sick", "chien": "dog"}}}))
    found = discover(job)
    assert found.issues == []
    assert {ref.relpath: ref.label for ref in found.refs} == {"p0/a.png": "sick", "p1/a.png": "sick",
                                                              "p2/a.png": "dog"}


def test_a_multilabel_map_token_matches_in_either_unicode_form(tmp_path: Path) -> None:
    """A multi-label column of names maps each token as a class cell is mapped: the NFD token is
    the NFC key's (renamed, or dropped by null), not kept as a label of its own."""
    _table(tmp_path, "findings", [f"{FIEVRE_NFD}|toux", f"{FIEVRE_NFC}|rïen", "toux"])
    job = load_job(_job(tmp_path, {"table": "raw/t.csv", "label": {
        "kind": "multilabel", "column": "findings", "separator": "|",
        "map": {FIEVRE_NFC: "fever", unicodedata.normalize("NFD", "rïen"): None}}}))
    found = discover(job)
    assert found.issues == []
    assert {ref.relpath: ref.label for ref in found.refs} == {"p0/a.png": "fever|toux", "p1/a.png": "fever",
                                                              "p2/a.png": "toux"}


def test_two_map_keys_that_differ_only_in_unicode_form_and_name_two_classes_are_a_config_error(tmp_path: Path) -> None:
    """Which of them a cell in a third spelling meant cannot be told: the error shows both keys'
    code points (they print alike)."""
    _table(tmp_path, "label", [FIEVRE_NFC])
    path = _job(tmp_path, {"table": "raw/t.csv", "label": {"column": "label",
                                                           "map": {FIEVRE_NFC: "sick", FIEVRE_NFD: "well"}}})
    with pytest.raises(ConfigError) as err:
        load_job(path)
    message = str(err.value)
    assert "label.map" in message and ascii(FIEVRE_NFC) in message and ascii(FIEVRE_NFD) in message
    assert "Unicode form" in message and "keep one" in message
    same = _job(tmp_path, {"table": "raw/t.csv", "label": {"column": "label",
                                                           "map": {FIEVRE_NFC: "sick", FIEVRE_NFD: "sick"}}})
    assert {ref.label for ref in discover(load_job(same)).refs} == {"sick"}  # one class twice: no conflict


def test_a_dicom_label_attribute_in_nfd_matches_its_nfc_map_key(tmp_path: Path) -> None:
    """label: {attribute: SeriesDescription, map: ...}: a header value in NFD UTF-8 is the NFC key's class."""
    from tests.dicom_files import ct_dataset, ct_pixels, save

    for i, text in enumerate((FIEVRE_NFC, FIEVRE_NFD, "chien")):
        ds = ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet="ISO_IR 192", PatientID=f"P{i}")
        ds.add(DataElement(0x0008103E, "LO", text.encode()))
        save(ds, tmp_path / "raw" / f"s{i}.dcm")
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": "raw", "label": {
               "attribute": "SeriesDescription", "map": {FIEVRE_NFC: "sick", "chien": "dog"}}}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    job = load_job(tmp_path / "job.yaml")
    probed = [probe_ref(ref, job) for ref in discover(job).refs]
    assert all(isinstance(ref, SampleRef) for ref in probed), probed
    assert {ref.relpath: ref.label for ref in probed if isinstance(ref, SampleRef)} == {
        "s0.dcm": "sick", "s1.dcm": "sick", "s2.dcm": "dog"}


# -- where: a value in either Unicode form is one value ---------------------------------------------

ZURICH_NFC, ZURICH_NFD = "Zürich", unicodedata.normalize("NFD", "Zürich")


@pytest.mark.parametrize(("where", "kept"), [
    ({"site": ZURICH_NFC}, {"p0", "p1"}),
    ({"site": ZURICH_NFD}, {"p0", "p1"}),
    ({"site": [ZURICH_NFC, "Genf"]}, {"p0", "p1"}),
    ({"site": {"not": [ZURICH_NFC]}}, {"p2"}),
    ({"site": {"not": [ZURICH_NFD]}}, {"p2"}),
    ({"site": {"match": "^zür"}}, {"p0", "p1"}),
    ({"site": {"match": unicodedata.normalize("NFD", "^zür")}}, {"p0", "p1"}),
    ({"site": {"match": "[üö]rich"}}, {"p0", "p1"}),
])
def test_where_compares_cells_in_nfc(tmp_path: Path, where: dict[str, Any], kept: set[str]) -> None:
    """README: table cells are one spelling in NFC. A where: value typed in NFC silently filtered
    the rows whose cell is the same word in NFD (a macOS or LIMS export): never bad, never
    counted against max_bad_fraction, with a detail printing 'Zürich' against 'Zürich'."""
    _table(tmp_path, "site", [ZURICH_NFC, ZURICH_NFD, "Bern"])
    found = discover(load_job(_job(tmp_path, {"table": "raw/t.csv", "label": "none", "where": where})))
    assert found.issues == []
    assert {ref.relpath.split("/")[0] for ref in found.refs} == kept
    assert len(found.excluded) == 3 - len(kept)


def test_where_compares_a_dicom_header_value_in_nfc(tmp_path: Path) -> None:
    """A where: on a header attribute (InstitutionName in NFD UTF-8) keeps the file the job names in NFC."""
    from tests.dicom_files import ct_dataset, ct_pixels, save

    path = save(ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet="ISO_IR 192", InstitutionName=ZURICH_NFD),
                tmp_path / "z.dcm")
    for where, excluded in (({"InstitutionName": ZURICH_NFC}, False),
                            ({"InstitutionName": {"not": [ZURICH_NFC]}}, True),
                            ({"InstitutionName": {"match": "zürich"}}, False)):
        header = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME,
                             where=parse_where(where, "sources[0].where"))
        assert isinstance(header, Excluded) == excluded, (where, header)


# -- a table in UTF-16: told as such, with or without its byte order mark ---------------------------

def _utf16_table(tmp_path: Path, codec: str, bom: bytes = b"", name: str = "t.csv") -> Path:
    """raw/<name>: an ASCII path,label table of two real images in ``codec`` (CRLF, as Windows writes)."""
    names = _images(tmp_path / "raw", 2)
    text = "\r\n".join(["path,label", *(f"{n},{'ab'[i]}" for i, n in enumerate(names))]) + "\r\n"
    data = bom + text.encode(codec)
    path = tmp_path / "raw" / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize(("codec", "bom", "name", "said"), [
    ("utf-16-le", b"", "t.csv", "UTF-16 LE"),          # PowerShell: Out-File -Encoding unicode
    ("utf-16-be", b"", "t.csv", "UTF-16 BE"),
    ("utf-16-le", b"\xff\xfe", "t.csv", "UTF-16 LE"),
    ("utf-16-le", b"", "t.csv.gz", "UTF-16 LE"),
])
def test_a_utf16_table_is_not_utf8_text_naming_utf16(tmp_path: Path, codec: str, bom: bytes, name: str,
                                                     said: str) -> None:
    """Without a BOM the table was read as UTF-8 full of NULs: the error blamed the delimiter and a
    missing cell named '\\x00l\\x00a\\x00b\\x00e\\x00l\\x00'. It is the not-UTF-8 error, naming UTF-16."""
    _utf16_table(tmp_path, codec, bom, name)
    with pytest.raises(ConfigError) as err:
        discover(load_job(_job(tmp_path, {"table": f"raw/{name}", "entity": "path"})))
    message = str(err.value)
    assert "not UTF-8 text" in message and said in message and "save the table as UTF-8" in message
    assert "\\x00" not in message and "sep=" not in message and name in message


def test_a_utf8_table_holding_nul_free_text_is_read(tmp_path: Path) -> None:
    """The same table in UTF-8 is read: the check looks for UTF-16's pattern of NULs only."""
    _utf16_table(tmp_path, "utf-8")
    found = discover(load_job(_job(tmp_path, {"table": "raw/t.csv", "entity": "path"})))
    assert found.issues == [] and {ref.label for ref in found.refs} == {"a", "b"}
