"""DICOM header attributes as a job names them (``where:``, ``entity:``, ``label: {attribute}``,
``time:``): a float32 (VR FL) value compares as the number the scanner wrote, an attribute with no
value of its own (a sequence, bytes) or written as its tag is refused with the keyword to give, and
a file whose date attribute holds an unreadable value is told which value that is."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover
from packer.pipeline.probe import probe_ref
from packer.read.dicom_attrs import tag_key_problem
from packer.read.dicom_objects import header_values
from packer.records import Excluded, Issue, SampleRef
from tests.dicom_files import ct_dataset, save


def _files(raw: Path, files: dict[str, dict[str, Any]]) -> None:
    """One CT slice per name, each with its own PatientID and the attributes given (written as a
    broken exporter writes them: pydicom's warning for an ISO date in a DA is not this test's)."""
    for seed, (name, attrs) in enumerate(sorted(files.items())):
        attrs = {"PatientID": f"P{seed}", "StudyDate": "20240101", "StudyTime": "101112", **attrs}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Invalid value for VR", UserWarning)
            save(ct_dataset(pixels=np.full((8, 8), 100 + seed, dtype=np.int16), **attrs), raw / name)


def _job(tmp_path: Path, source: dict[str, Any], **doc: Any) -> Path:
    job = {"name": "t", "sources": [{"name": "ct", "kind": "dicom", "root": "raw", "label": "none", **source}],
           "split": {"by": "entity", "ratios": {"train": 1.0}},
           "transform": {"dicom": {"windows": ["lung"], "size": [8, 8]}}, "pack": {"format": "webdataset"},
           "output": "out", "phi": {"mode": "keep"}, **doc}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _probed(job: Path) -> dict[str, SampleRef | Issue | Excluded]:
    loaded = load_job(job)
    return {Path(ref.path).name: probe_ref(ref, loaded) for ref in discover(loaded).refs}


# -- 1. a float32 (FL) value is the number the file holds ------------------------------------------


def test_an_fl_value_is_read_as_the_float32_the_file_holds_not_its_float64_widening(tmp_path: Path) -> None:
    """pydicom reads an FL 0.1 as 0.10000000149011612 (float32 widened to float64); the file holds 0.1."""
    _files(tmp_path / "raw", {"near.dcm": {"DistanceSourceToIsocenter": 0.1}})
    ds = pydicom.dcmread(tmp_path / "raw" / "near.dcm")
    assert ds["DistanceSourceToIsocenter"].VR == "FL" and ds.DistanceSourceToIsocenter != 0.1
    assert header_values(ds, "DistanceSourceToIsocenter") == ["0.1"]


def test_where_on_an_fl_attribute_keeps_the_file_holding_the_listed_number(tmp_path: Path) -> None:
    _files(tmp_path / "raw", {"near.dcm": {"DistanceSourceToIsocenter": 0.1},
                              "far.dcm": {"DistanceSourceToIsocenter": 600.0},
                              "mid.dcm": {"DistanceSourceToIsocenter": 5.5}})
    probed = _probed(_job(tmp_path, {"where": {"DistanceSourceToIsocenter": [0.1, 600]}}))
    assert isinstance(probed["near.dcm"], SampleRef) and isinstance(probed["far.dcm"], SampleRef)
    mid = probed["mid.dcm"]
    assert isinstance(mid, Excluded) and mid.why == "filtered"
    assert mid.detail == "DistanceSourceToIsocenter is 5.5, where: DistanceSourceToIsocenter in [0.1, 600]"


def test_where_not_on_an_fl_attribute_leaves_out_the_file_holding_the_number_and_says_it(tmp_path: Path) -> None:
    _files(tmp_path / "raw", {"near.dcm": {"DistanceSourceToIsocenter": 0.1},
                              "far.dcm": {"DistanceSourceToIsocenter": 600.0}})
    probed = _probed(_job(tmp_path, {"where": {"DistanceSourceToIsocenter": {"not": [0.1]}}}))
    near = probed["near.dcm"]
    assert isinstance(near, Excluded), near
    assert near.detail == "DistanceSourceToIsocenter is 0.1, where: DistanceSourceToIsocenter is not 0.1"
    assert isinstance(probed["far.dcm"], SampleRef)


def test_an_fd_value_stays_the_float64_the_file_holds(tmp_path: Path) -> None:
    """A double (VR FD) is no widened float32: 0.10000000149011612 written as FD is not 0.1."""
    _files(tmp_path / "raw", {"exact.dcm": {"EffectiveEchoTime": 0.1},
                              "widened.dcm": {"EffectiveEchoTime": float(np.float32(0.1))}})
    probed = _probed(_job(tmp_path, {"where": {"EffectiveEchoTime": 0.1}}))
    assert isinstance(probed["exact.dcm"], SampleRef)
    widened = probed["widened.dcm"]
    assert isinstance(widened, Excluded) and widened.detail.startswith("EffectiveEchoTime is 0.10000000149011612,")


def test_every_value_of_a_multi_valued_fl_attribute_is_read_as_its_float32(tmp_path: Path) -> None:
    ds = ct_dataset()
    ds.add_new(pydicom.tag.Tag("DistanceSourceToIsocenter"), "FL", [0.1, 2.3])
    again = pydicom.dcmread(save(ds, tmp_path / "two.dcm"))
    assert header_values(again, "DistanceSourceToIsocenter") == ["0.1", "2.3"]


# -- 2. an attribute with no value of its own (a sequence, bytes) is refused -----------------------


def _refusal(tmp_path: Path, source: dict[str, Any], at: str) -> str:
    """The config error a job with ``source``'s settings over one CT file stops with, checked to
    name the job file and the key path ``at``."""
    _files(tmp_path / "raw", {"a.dcm": {}})
    job = _job(tmp_path, source)
    with pytest.raises(ConfigError) as raised:
        load_job(job)
    message = str(raised.value)
    assert message.startswith(f"{job}: {at}: "), message
    return message


@pytest.mark.parametrize(("source", "at", "said"), [
    ({"entity": "OtherPatientIDsSequence"}, "sources[0].entity (source 'ct')",
     "OtherPatientIDsSequence is a sequence (VR SQ, Other Patient IDs Sequence)"),
    ({"entity": "PixelData"}, "sources[0].entity (source 'ct')", "PixelData is of VR OB or OW (Pixel Data)"),
    ({"label": {"attribute": "OtherPatientIDsSequence"}}, "sources[0].label.attribute",
     "OtherPatientIDsSequence is a sequence (VR SQ, Other Patient IDs Sequence)"),
    ({"label": {"attribute": "PixelData"}}, "sources[0].label.attribute", "PixelData is of VR OB or OW (Pixel Data)"),
    ({"where": {"PixelData": "x"}}, "sources[0].where.PixelData", "PixelData is of VR OB or OW (Pixel Data)"),
    ({"where": {"FloatPixelData": 1}}, "sources[0].where.FloatPixelData",
     "FloatPixelData is of VR OF (Float Pixel Data)"),
    ({"where": {"RedPaletteColorLookupTableData": 1}}, "sources[0].where.RedPaletteColorLookupTableData",
     "is of VR OW"),
    ({"time": ["PixelData"]}, "sources[0].time (source 'ct')",
     "'PixelData' is of VR OB or OW (Pixel Data), not a date"),
])
def test_an_attribute_without_a_value_of_its_own_is_refused_naming_its_vr(
        tmp_path: Path, source: dict[str, Any], at: str, said: str) -> None:
    """entity: OtherPatientIDsSequence made every entity id pydicom's multi-line dump of the
    sequence's items (each PatientID and issuer in every shard record), entity: PixelData the repr
    of the pixel bytes; where: refused a sequence but compared bytes."""
    message = _refusal(tmp_path, source, at)
    assert said in message, message


def test_an_entity_from_a_sequence_is_told_its_items_are_not_read_and_what_to_give(tmp_path: Path) -> None:
    _files(tmp_path / "raw", {"a.dcm": {}})
    with pytest.raises(ConfigError) as raised:
        load_job(_job(tmp_path, {"entity": "OtherPatientIDsSequence"}))
    message = str(raised.value)
    assert "it holds items, not a value of its own, and the attributes inside its items are not read" in message
    assert "give an attribute with a value, such as PatientID, or entity: {path: REGEX}" in message


def test_a_where_on_a_sequence_is_still_refused_as_one(tmp_path: Path) -> None:
    _files(tmp_path / "raw", {"a.dcm": {}})
    with pytest.raises(ConfigError, match=r"where\.OtherPatientIDsSequence: a sequence has no value to compare"):
        load_job(_job(tmp_path, {"where": {"OtherPatientIDsSequence": "x"}}))


def test_an_entity_of_an_attribute_with_a_value_still_loads(tmp_path: Path) -> None:
    """PatientName (PN) and StudyInstanceUID (UI) name entities; Rows (US) is a number, not bytes."""
    _files(tmp_path / "raw", {"a.dcm": {}})
    for keyword in ("PatientName", "StudyInstanceUID", "Rows"):
        assert load_job(_job(tmp_path, {"entity": keyword})).sources[0].entity == keyword


# -- 3. an attribute written as its tag is told its keyword ------------------------------------------


@pytest.mark.parametrize(("source", "at", "said"), [
    ({"where": {"(0008,0060)": "CT"}}, "sources[0].where.(0008,0060)", "write its keyword: Modality"),
    ({"where": {"0008,0060": "CT"}}, "sources[0].where.0008,0060", "write its keyword: Modality"),
    ({"where": {"(0008, 0060)": "CT"}}, "sources[0].where.(0008, 0060)", "write its keyword: Modality"),
    ({"label": {"attribute": "(0018,0015)"}}, "sources[0].label.attribute", "write its keyword: BodyPartExamined"),
    ({"entity": "(0010,0020)"}, "sources[0].entity (source 'ct')", "write its keyword: PatientID"),
    ({"time": ["(0008,0020)", "StudyTime"]}, "sources[0].time (source 'ct')", "write its keyword: StudyDate"),
    ({"where": {"(0009,1001)": "x"}}, "sources[0].where.(0009,1001)",
     "'(0009,1001)' is the private tag (0009,1001) (an odd group): private tags are not supported as keys"),
    ({"entity": "(0029,1010)"}, "sources[0].entity (source 'ct')", "private tags are not supported as keys"),
    ({"where": {"(0008,FFF0)": "x"}}, "sources[0].where.(0008,FFF0)",
     "'(0008,FFF0)' is the tag (0008,FFF0), which pydicom's data dictionary does not name"),
])
def test_an_attribute_written_as_its_tag_is_refused_naming_its_keyword(
        tmp_path: Path, source: dict[str, Any], at: str, said: str) -> None:
    """where: {"(0008,0060)": CT} was refused as "not a header attribute ... add 'labels: FILE.csv'",
    label: {attribute: "(0018,0015)"} as one that "may identify" someone, entity: "(0010,0020)" as
    no keyword of the dictionary, never naming the keyword the tag is."""
    message = _refusal(tmp_path, source, at)
    assert said in message, message
    assert "not a header attribute" not in message and "may not be a label" not in message


def test_the_keyword_a_tag_names_is_read_as_the_keyword(tmp_path: Path) -> None:
    """The fix the refusal gives works: Modality keeps the CT file, leaves out the MR one."""
    _files(tmp_path / "raw", {"ct.dcm": {}, "mr.dcm": {"Modality": "MR"}})
    probed = _probed(_job(tmp_path, {"where": {"Modality": "CT"}}))
    assert isinstance(probed["ct.dcm"], SampleRef) and isinstance(probed["mr.dcm"], Excluded)


def test_eight_digits_that_name_no_dictionary_tag_stay_a_column_of_the_table(tmp_path: Path) -> None:
    """A labels table may have a column named by a date (20250101): eight hex digits are taken for
    a tag only where they name one of the dictionary's (00080060), never a private or unknown one."""
    _files(tmp_path / "raw", {"a.dcm": {}})
    for date in ("20250101", "20200110"):  # the second is also the dictionary's tag (2020,0110)
        (tmp_path / "labels.csv").write_text(f"path,label,{date}\na.dcm,x,yes\n")
        job = load_job(_job(tmp_path, {"labels": "labels.csv", "label": {"column": "label"},
                                       "where": {date: "yes"}}))
        assert [c.key for c in job.sources[0].where] == [date] and job.sources[0].header_where == ()


@pytest.mark.parametrize(("key", "said"), [
    ("(0008,0060)", "'(0008,0060)' is the tag (0008,0060): header attributes are named by keyword, not by tag; "
                    "write its keyword: Modality"),
    ("00080060", None), ("20200110", None), ("0018,0015", "'0018,0015' is the tag (0018,0015)"),
    ("(0008,fff0)", "'(0008,fff0)' is the tag (0008,FFF0), which pydicom's data dictionary does not name"),
    ("Modality", None), ("20250101", None), ("(0008,006)", None), ("site", None),
])
def test_a_key_in_tag_form_is_told_apart_from_a_keyword_and_a_column(key: str, said: str | None) -> None:
    """(gggg,eeee) and gggg,eeee; eight bare digits are a column's name (20200110 is a date and the
    dictionary's tag (2020,0110) alike: a labels table's date column must stay one)."""
    problem = tag_key_problem(key)
    assert problem == said if said is None else problem is not None and problem.startswith(said), problem


# -- 4. a missing_time record names the value it could not read --------------------------------------

_BY_TIME = {"by": "time", "cutoffs": {"valid": "2024-03-01", "test": "2024-06-01"}}


def _missing_time(tmp_path: Path, attrs: dict[str, Any], time: list[str]) -> str:
    """The missing_time message of one file with ``attrs`` (beside a well-dated one) under ``time:``."""
    _files(tmp_path / "raw", {"dated.dcm": {}, "odd.dcm": attrs})
    probed = _probed(_job(tmp_path, {"time": time}, split=_BY_TIME))
    assert isinstance(probed["dated.dcm"], SampleRef) and (probed["dated.dcm"].time or "")[:10] == "2024-01-01"
    odd = probed["odd.dcm"]
    assert isinstance(odd, Issue) and odd.reason == "missing_time", odd
    assert odd.message.startswith(f"{odd.path}: no readable time, but the job splits by time; its header's ")
    return odd.message


def test_an_iso_date_in_a_da_is_quoted_with_the_dicom_form_to_write(tmp_path: Path) -> None:
    """The record said StudyDate, StudyTime 'hold no valid DICOM date' and to set time: to
    attributes this file fills (SeriesDate, AcquisitionDateTime): it fills neither."""
    said = _missing_time(tmp_path, {"StudyDate": "2024-03-05"}, ["StudyDate", "StudyTime"])
    assert "StudyDate holds '2024-03-05', not a DICOM date (DA: YYYYMMDD, here 20240305)" in said, said
    assert "(the source's time: StudyDate, StudyTime)" in said
    assert "fix the value in the file" in said
    assert "no other date attribute of this file holds a date (SeriesDate, AcquisitionDate, ContentDate, " \
           "AcquisitionDateTime)" in said, said
    assert "fills (" not in said and "StudyTime holds" not in said


def test_the_date_attributes_the_file_fills_are_offered_and_only_those(tmp_path: Path) -> None:
    said = _missing_time(tmp_path, {"StudyDate": "2024-03-05", "SeriesDate": "20240305"}, ["StudyDate", "StudyTime"])
    assert "or add to the source's time: an attribute this file fills with a date (SeriesDate)" in said, said
    assert "AcquisitionDateTime" not in said and "ContentDate" not in said


def test_an_absent_date_and_an_unreadable_one_are_told_apart_and_time_s_own_are_not_offered(tmp_path: Path) -> None:
    said = _missing_time(tmp_path, {"StudyDate": "", "SeriesDate": "05/03/2024", "ContentDate": "20240305"},
                         ["StudyDate", "SeriesDate"])
    assert "its header's SeriesDate holds '05/03/2024', not a DICOM date (DA: YYYYMMDD); StudyDate is absent or " \
           "empty (the source's time: StudyDate, SeriesDate)" in said, said
    assert said.endswith("an attribute this file fills with a date (ContentDate)"), said


def test_a_file_without_its_dates_is_offered_the_ones_it_fills(tmp_path: Path) -> None:
    said = _missing_time(tmp_path, {"StudyDate": "", "AcquisitionDateTime": "20240305101112"}, ["StudyDate"])
    assert "its header's StudyDate is absent or empty (the source's time: StudyDate): add to the source's time: an " \
           "attribute this file fills with a date (AcquisitionDateTime)" in said, said
    assert "fix the value" not in said


def test_an_iso_date_time_in_a_dt_is_quoted_as_no_dicom_date_time(tmp_path: Path) -> None:
    said = _missing_time(tmp_path, {"AcquisitionDateTime": "2024-03-05T10:11:12", "StudyDate": ""},
                         ["AcquisitionDateTime", "StudyDate"])
    assert "AcquisitionDateTime holds '2024-03-05T10:11:12', not a DICOM date-time to at least the day (DT: " \
           "YYYYMMDD[HHMMSS], here 20240305101112)" in said, said
