"""Text that its declared character set cannot decode is read faithfully wherever packer reads it:
ST, LT and UT elements (a job may take its entity from PatientComments) and text inside sequence
items (an RTSTRUCT's ROIName, a SEG's SegmentLabel), as SH/LO/PN elements of the top level are.

pydicom writes U+FFFD for each undecodable byte, so two files (or two ROIs) that differ only in
such bytes read alike: two patients became one entity, two structures one name. Each test writes
two real files (pydicom, highdicom) that differ only in those bytes and checks they stay apart,
each byte kept as the text ``\\xNN``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.datadict import tag_for_keyword
from pydicom.dataelem import DataElement

from packer.read.dicom import DicomHeader, probe_dicom, read_dicom
from packer.read.dicom_attrs import text_value
from packer.structures import Structure, StructureMap
from tests.dicom_files import config, ct_dataset, ct_pixels, make_ref, save

TIME = ("StudyDate", "StudyTime")
#: An element of each text VR that holds one value, backslashes allowed (PS3.5 6.2).
KEYWORD = {"LT": "PatientComments", "ST": "CommentsOnThePerformedProcedureStep", "UT": "TextValue"}


def ct_with_comment(path: Path, raw: bytes, vr: str = "LT", charset: str = "ISO_IR 192") -> Path:
    """A CT file whose :data:`KEYWORD` element of ``vr`` holds the bytes ``raw`` as they are,
    under ``charset``."""
    ds = ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet=charset)
    tag = tag_for_keyword(KEYWORD[vr])
    assert tag is not None
    ds.add(DataElement(tag, vr, raw))
    saved = save(ds, path)
    assert raw in saved.read_bytes()
    return saved


@pytest.mark.parametrize("vr", ["LT", "ST", "UT"])
def test_an_entity_of_a_text_vr_keeps_the_bytes_that_tell_two_patients_apart(tmp_path: Path, vr: str) -> None:
    keyword = KEYWORD[vr]
    written = (("ff", b"Case A\\B \xff1"), ("fe", b"Case A\\B \xfe1"), ("ff-padded", b"Case A\\B \xff1 "))
    files = {name: ct_with_comment(tmp_path / f"{name}.dcm", raw, vr) for name, raw in written}
    entities = {}
    for name, path in files.items():
        header = probe_dicom(make_ref(path), entity_keyword=keyword, time_keywords=TIME)
        assert isinstance(header, DicomHeader)
        entities[name] = header.entity
        kept = probe_dicom(make_ref(path), entity_keyword=keyword, time_keywords=TIME, keep_pixels=True)
        assert isinstance(kept, DicomHeader) and kept.entity == header.entity
        assert text_value(pydicom.dcmread(path), keyword) == header.entity  # the lazy reread of a placed file
    # the text's own backslash stays one character: LT and UT are one value, never split
    assert entities == {"ff": "Case A\\B \\xff1", "fe": "Case A\\B \\xfe1", "ff-padded": "Case A\\B \\xff1"}


def test_valid_text_of_a_text_vr_is_read_as_pydicom_reads_it(tmp_path: Path) -> None:
    for text in ("Müller \\ follow-up", "MRN\ufffd01", "山田"):
        path = ct_with_comment(tmp_path / "ok.dcm", text.encode())
        header = probe_dicom(make_ref(path), entity_keyword="PatientComments", time_keywords=TIME)
        assert isinstance(header, DicomHeader) and header.entity == text


def test_a_sample_whose_text_vr_entity_kept_undecodable_bytes_says_so_without_the_value(tmp_path: Path) -> None:
    bad = ct_with_comment(tmp_path / "bad.dcm", b"Case \xff1")
    samples = read_dicom(make_ref(bad), config(), entity_keyword="PatientComments")
    assert isinstance(samples, list) and samples
    (note,) = samples[0].metadata["warnings"]
    assert note.startswith("(0010,4000) PatientComments") and "ISO_IR 192" in note and "Case" not in note
    good = ct_with_comment(tmp_path / "good.dcm", b"Case A\\B")
    samples = read_dicom(make_ref(good), config(), entity_keyword="PatientComments")
    assert isinstance(samples, list) and "warnings" not in samples[0].metadata


# -- text inside sequence items: RTSTRUCT ROI names -------------------------------------------------

def test_two_roi_names_that_differ_only_in_undecodable_bytes_are_two_structures(tmp_path: Path) -> None:
    """ROIName (LO) sits in StructureSetROISequence items, which inherit the file's character set.
    PTV<A0> and PTV<B0> are not UTF-8: pydicom read both as 'PTV\ufffd', one name, so neither could
    be mapped to its own class. Each is kept as PTV\\xa0, PTV\\xb0, which a job's map can name."""
    from tests.test_rtstruct import ISLAND_A, ISLAND_B, closed, paint, rtstruct, series

    slices = series()
    ds = rtstruct([("PLACEHOLDER A", [closed(slices[3], ISLAND_A)]), ("PLACEHOLDER B", [closed(slices[7], ISLAND_B)])])
    for item, raw in zip(ds.StructureSetROISequence, (b"PTV\xa0", b"PTV\xb0"), strict=True):
        item.add(DataElement(0x30060026, "LO", raw))
    ds.SpecificCharacterSet = "ISO_IR 192"
    rois = StructureMap((Structure("boost", 1, aliases=("PTV\\xa0",)), Structure("elective", 2, aliases=("PTV\\xb0",))))
    labels, drawn = paint(tmp_path, ds, slices, rois=rois)
    assert drawn.unmapped == ()
    assert set(np.unique(labels[3])) == {0, 1} and set(np.unique(labels[7])) == {0, 2}
    assert labels.sum() == labels[3].sum() + labels[7].sum()


# -- text inside sequence items: SEG segment labels -------------------------------------------------

@pytest.mark.parametrize("parsed", [False, True])
def test_two_segment_labels_that_differ_only_in_undecodable_bytes_are_two_segments(tmp_path: Path,
                                                                                   parsed: bool) -> None:
    """SegmentLabel (LO) sits in SegmentSequence items. A SEG written by highdicom, its two labels
    then set to the bytes PTV<A0> and PTV<B0> under ISO_IR 192: each segment maps to its own class
    by its faithful label, whether the file is read by path or handed over parsed."""
    from tests.test_seg import Grid, ct_series, expected_labels, in_source_order, paint, places, truth, write_seg

    grid = Grid()
    sources = ct_series(grid)
    planted = truth(grid)
    path = write_seg(tmp_path / "seg.dcm", sources, in_source_order(sources, grid, planted), ["one", "two"])
    ds = pydicom.dcmread(path)
    ds.SpecificCharacterSet = "ISO_IR 192"
    for item, raw in zip(ds.SegmentSequence, (b"PTV\xa0", b"PTV\xb0"), strict=True):
        item.add(DataElement(0x00620005, "LO", raw))
    ds.save_as(path)
    assert b"PTV\xa0" in path.read_bytes() and b"PTV\xb0" in path.read_bytes()
    segments = StructureMap((Structure("sphere", 1, aliases=("PTV\\xa0",)), Structure("box", 2, aliases=("PTV\\xb0",))))
    labels, drawn = paint(path, places(sources), segments, dataset=pydicom.dcmread(path) if parsed else None)
    assert drawn.unmapped == ()  # type: ignore[attr-defined]
    np.testing.assert_array_equal(labels, expected_labels(planted))


@pytest.mark.parametrize("vr", ["LT", "ST", "UT"])
def test_an_undecodable_byte_and_the_same_text_written_as_an_escape_are_two_entities(tmp_path: Path, vr: str) -> None:
    """The byte 0xE9, which UTF-8 cannot decode, is kept as the four characters ``\\xe9``. Text
    may hold those four characters itself (ST, LT and UT take backslashes): such text is written
    with its backslash doubled, ``\\\\xe9``, so the two files are two patients, not one. Text
    whose backslashes read as no escape stays as pydicom reads it."""
    keyword = KEYWORD[vr]
    written = {"byte": b"caf\xe9", "text": b"caf\\xe9", "both": b"caf\\\xe9", "plain": b"Case A\\B"}
    entities, warned = {}, set()
    for name, raw in written.items():
        path = ct_with_comment(tmp_path / f"{name}.dcm", raw, vr)
        header = probe_dicom(make_ref(path), entity_keyword=keyword, time_keywords=TIME)
        assert isinstance(header, DicomHeader)
        entities[name] = header.entity
        assert text_value(pydicom.dcmread(path), keyword) == header.entity
        samples = read_dicom(make_ref(path), config(), entity_keyword=keyword)
        assert isinstance(samples, list)
        if "warnings" in samples[0].metadata:
            warned.add(name)
    assert entities == {"byte": "caf\\xe9", "text": "caf\\\\xe9", "both": "caf\\\\\\xe9", "plain": "Case A\\B"}
    assert len(set(entities.values())) == len(entities)
    assert warned == {"byte", "both"}  # only bytes the character set cannot decode


def test_a_multi_valued_id_whose_second_value_reads_like_an_escape_is_another_patient(tmp_path: Path) -> None:
    """PatientID (LO, split at backslashes) of the bytes MRN 0xFF 01 reads MRN\\xff01; one of the
    two values MRN and xff01 was joined to the same text, and the two patients were one entity
    (one split, one pseudonym). The separator before such a value is doubled."""
    entities = {}
    for name, raw in (("byte", b"MRN\xff01"), ("values", b"MRN\\xff01"), ("plain", b"MRN\\B2")):
        ds = ct_dataset(ct_pixels((4, 4)), SpecificCharacterSet="ISO_IR 192")
        ds.add(DataElement(tag_for_keyword("PatientID"), "LO", raw))
        path = save(ds, tmp_path / f"{name}.dcm")
        header = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=TIME)
        assert isinstance(header, DicomHeader)
        entities[name] = header.entity
        assert text_value(pydicom.dcmread(path), "PatientID") == header.entity
    assert entities == {"byte": "MRN\\xff01", "values": "MRN\\\\xff01", "plain": "MRN\\B2"}


# -- character sets: the default, ISO 2022 code extensions, person names ---------------------------

def ct_with_element(path: Path, raw: bytes, charset: str | list[str] | None, keyword: str = "PatientID") -> Path:
    """A CT file whose ``keyword`` element holds the bytes ``raw`` as they are, under ``charset``
    (None: no (0008,0005) at all)."""
    ds = ct_dataset(ct_pixels((4, 4)))
    if charset is not None:
        ds.SpecificCharacterSet = charset
    tag = tag_for_keyword(keyword)
    assert tag is not None
    ds.add(DataElement(tag, "PN" if keyword == "PatientName" else "LO", raw + b" " * (len(raw) % 2)))
    saved = save(ds, path)
    assert raw in saved.read_bytes()
    return saved


def entity_of(path: Path, keyword: str = "PatientID") -> tuple[str | None, list[str]]:
    """The entity a file's header gives and the warnings of its sample."""
    header = probe_dicom(make_ref(path), entity_keyword=keyword, time_keywords=TIME)
    assert isinstance(header, DicomHeader)
    samples = read_dicom(make_ref(path), config(), entity_keyword=keyword)
    assert isinstance(samples, list) and samples
    return header.entity, list(samples[0].metadata.get("warnings", []))


@pytest.mark.parametrize(("written", "raw"), [("ISO_IR100", b"M\xfcller"), ("ISO_IR192", "Müller".encode()),
                                              ("iso_ir 100", b"M\xfcller")])
def test_a_defined_term_written_without_its_space_reads_as_that_term(tmp_path: Path, written: str,
                                                                    raw: bytes) -> None:
    """``ISO_IR100`` is ``ISO_IR 100`` less its space, which pydicom does not correct (it does
    ``ISO-IR 100``): read as ASCII, one patient's ``Müller`` under both spellings was two entities."""
    proper = "ISO_IR 192" if "192" in written else "ISO_IR 100"
    assert entity_of(ct_with_element(tmp_path / "proper.dcm", raw, proper)) == ("Müller", [])
    assert entity_of(ct_with_element(tmp_path / "unspaced.dcm", raw, written)) == ("Müller", [])


@pytest.mark.parametrize("charset", [None, "ISO_IR 6", "ISO_IR 6x6"])
def test_bytes_above_0x7f_under_the_default_character_set_are_kept_as_escapes_and_warned(
        tmp_path: Path, charset: str | None) -> None:
    """Absent, ISO_IR 6 or a term pydicom does not know, the character set is ASCII: pydicom read
    a UTF-8 MÜLLER01 written without (0008,0005) as Latin-1 MÃ\\x9cLLER01, silently."""
    entity, warnings = entity_of(ct_with_element(tmp_path / "u.dcm", "MÜLLER01".encode(), charset))
    assert entity == "M\\xc3\\x9cLLER01"
    (note,) = warnings
    assert note.startswith("(0010,0020) PatientID") and "ISO_IR 6" in note and "LLER" not in note
    assert entity_of(ct_with_element(tmp_path / "a.dcm", b"MRN01", charset)) == ("MRN01", [])


def test_an_id_under_iso_2022_ir_87_keeps_the_bytes_its_sets_cannot_decode_and_warns(tmp_path: Path) -> None:
    """pydicom fell back to Latin-1 for the whole value: a raw ESC and Latin-1 letters, no warning.
    Each code extension is read strictly: the kanji decode, 0xFF 0xFE (outside JIS X 0208) do not."""
    jis = "山田".encode("iso2022_jp")[:-3]  # ESC $ B and two kanji, no return to ASCII
    coded = ct_with_element(tmp_path / "j.dcm", b"MRN" + jis + b"\xff\xfe", ["", "ISO 2022 IR 87"])
    entity, warnings = entity_of(coded)
    assert entity == "MRN山田\\xff\\xfe"
    (note,) = warnings
    assert "ISO 2022 IR 87" in note and "MRN" not in note
    same = ct_with_element(tmp_path / "u.dcm", b"MRN" + "山田".encode() + b"\xff\xfe", "ISO_IR 192")
    assert entity_of(same)[0] == entity


@pytest.mark.parametrize(("charset", "raw", "text"), [
    (["", "ISO 2022 IR 58"], b"\x1b$)A" + "张伟".encode("gb2312") + b"01", "张伟01"),
    (["", "ISO 2022 IR 87"], "Yamada^Tarou=山田^太郎".encode("iso2022_jp"), "Yamada^Tarou=山田^太郎"),
    (["", "ISO 2022 IR 149"], b"Hong^Gildong=\x1b$)C\xfb\xf3^\x1b$)C\xd1\xce\xd4\xd7", "Hong^Gildong=洪^吉洞"),
    (["ISO 2022 IR 13", "ISO 2022 IR 87"], b"\xd4\xcf\xc0\xde^\xc0\xdb\xb3=\x1b$B;3ED\x1b(J^\x1b$BB@O:\x1b(J",
     "ﾔﾏﾀﾞ^ﾀﾛｳ=山田^太郎"),
])
def test_a_name_in_iso_2022_code_extensions_reads_as_the_same_name_in_utf8(
        tmp_path: Path, charset: list[str], raw: bytes, text: str) -> None:
    """One patient written under ISO 2022 and under ISO_IR 192 is one entity. pydicom kept
    ISO 2022 IR 58's escape sequence as text (``\\x1b$)A张伟01``): another entity, split apart."""
    keyword = "PatientName" if b"^" in raw else "PatientID"
    coded = entity_of(ct_with_element(tmp_path / "coded.dcm", raw, charset, keyword), keyword)
    utf8 = entity_of(ct_with_element(tmp_path / "utf8.dcm", text.encode(), "ISO_IR 192", keyword), keyword)
    assert coded == utf8 == (text, [])


def test_person_names_that_differ_only_in_trailing_empty_components_are_one_entity(tmp_path: Path) -> None:
    """PS3.5 6.2.1.1: trailing empty components (with their ^) and groups (with their =) may be
    omitted, so Müller^Jörg and Müller^Jörg^^^ name one patient; read as written they were two
    entities, which the split placed apart. The where: values of PatientName read alike too."""
    from packer.read.dicom_objects import header_values

    written = {"plain": ("Müller^Jörg".encode("latin-1"), "ISO_IR 100"),
               "carets": ("Müller^Jörg^^^".encode(), "ISO_IR 192"),
               "group": ("Müller^Jörg ^^=".encode(), "ISO_IR 192")}
    for name, (raw, charset) in written.items():
        path = ct_with_element(tmp_path / f"{name}.dcm", raw, charset, "PatientName")
        assert entity_of(path, "PatientName") == ("Müller^Jörg", [])
        assert header_values(pydicom.dcmread(path), "PatientName") == ["Müller^Jörg"]
    inner = ct_with_element(tmp_path / "inner.dcm", b"Doe^^John^", None, "PatientName")
    assert entity_of(inner, "PatientName") == ("Doe^^John", [])  # an empty component between others stays
