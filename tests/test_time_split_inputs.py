"""The times a ``by: time`` split reads, from a table's rows, a file's path and a DICOM header.

Rows of one file that write one instant in two ISO forms agree on it; a file named by its date
is timed by its name under ``time: {component: -1}``; and a DICOM ``time:`` that can date no file
(a keyword of no date VR, or a time of day alone) is refused when the job is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.discover import discover
from packer.pipeline.probe import probe_ref
from packer.records import Excluded, Issue, SampleRef

CUTOFFS = {"valid": "2024-01-01", "test": "2024-07-01"}


def _images(root: Path, names: list[str]) -> None:
    for i, name in enumerate(names):  # decodable, each its own (no planted duplicates)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / name), np.random.default_rng(i).integers(0, 255, (24, 24, 3)).astype(np.uint8))


def _job(tmp_path: Path, source: dict[str, Any]) -> Path:
    doc = {"name": "t", "sources": [{"name": "s", "kind": "image", "root": "img", **source}],
           "split": {"by": "time", "cutoffs": CUTOFFS},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": "webdataset"}, "output": "out",
           "validate": {"max_bad_fraction": 0.9}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# -- rows of one file (repeated: same) that write its time in two forms ----------------------------


def _rows_job(tmp_path: Path, times: list[str]) -> Path:
    _images(tmp_path / "img", ["a.png", "b.png"])
    rows = [f"a.png,cat,A,{t}" for t in times] + ["b.png,dog,B,2023-01-01"]
    (tmp_path / "t.csv").write_text("\n".join(["path,label,entity,timestamp", *rows]) + "\n")
    return _job(tmp_path, {"table": {"file": "t.csv", "repeated": "same"}})


@pytest.mark.parametrize("second", ["20240305", "2024-03-05 00:00", "2024-03-05T00:00:00", "2024-03-05T00:00+02:00"])
def test_rows_writing_one_instant_in_two_iso_forms_agree_on_the_time(tmp_path: Path, second: str) -> None:
    """2024-03-05 read as a date and 20240305 as 2024-03-05T00:00:00: the strings differ, the
    instant does not (a date is its midnight, as the split compares it with a cutoff), and the file
    was a bad_target 'rows must agree'. It is packed with the first row's time."""
    found = discover(load_job(_rows_job(tmp_path, ["2024-03-05", second])))
    assert found.issues == []
    assert {r.relpath: r.time for r in found.refs}["a.png"] == "2024-03-05"


@pytest.mark.parametrize(("first", "second"), [("2024-03-05", "2024-03-06"), ("2024-03-05", "2024-03-05T14:30"),
                                               ("2024-03-05", "05/03/2024"), ("soon", "later")])
def test_rows_giving_two_instants_still_make_the_file_a_bad_target(tmp_path: Path, first: str, second: str) -> None:
    """A time of day other than midnight is another instant than the date alone; a cell that reads
    as no time compares as written."""
    found = discover(load_job(_rows_job(tmp_path, [first, second])))
    (issue,) = found.issues
    assert (issue.reason, Path(issue.path).name) == ("bad_target", "a.png")
    assert issue.message == (f"{tmp_path / 't.csv'} rows 2 and 3 name 'a.png' with time {first!r} and {second!r}; "
                             "rows of one file must agree")


# -- a time read from the file's name (time: {component: -1}) --------------------------------------


DATED = ["P1/2023-05-01.png", "P1/2024-03-01.png", "P2/2024-08-01.png", "P3/2024-02-02.png"]


def _probed(tmp_path: Path, names: list[str], source: dict[str, Any]) -> dict[str, SampleRef | Issue]:
    """Each listed file's probed ref, or its Issue (missing_time comes from the probe)."""
    _images(tmp_path / "img", names)
    job = load_job(_job(tmp_path, {"label": "none", **source}))
    out: dict[str, SampleRef | Issue] = {}
    for ref in discover(job).refs:
        probed = probe_ref(ref, job)
        assert not isinstance(probed, Excluded)
        out[ref.relpath] = probed
    return out


@pytest.mark.parametrize("component", [-1, 1])
def test_a_file_named_by_its_date_is_timed_by_its_name_without_the_suffix(tmp_path: Path, component: int) -> None:
    """README: -1 is the file name. 2023-05-01.png was read with its suffix, never a date, and
    every file was missing_time; the name is read without its suffixes (1 names it too here)."""
    probed = _probed(tmp_path, DATED, {"entity": {"component": 0}, "time": {"component": component}})
    assert {rel: ref.time for rel, ref in probed.items() if isinstance(ref, SampleRef)} == {
        "P1/2023-05-01.png": "2023-05-01", "P1/2024-03-01.png": "2024-03-01",
        "P2/2024-08-01.png": "2024-08-01", "P3/2024-02-02.png": "2024-02-02"}


def test_every_suffix_of_a_dated_name_is_left_out_and_a_fraction_of_a_second_is_kept(tmp_path: Path) -> None:
    names = ["P1/2023-05-01.final.png", "P2/2024-02-01T10:11:12.5.png"]
    probed = _probed(tmp_path, names, {"entity": {"component": 0}, "time": {"component": -1}})
    assert {rel: getattr(ref, "time", None) for rel, ref in probed.items()} == {
        "P1/2023-05-01.final.png": "2023-05-01", "P2/2024-02-01T10:11:12.5.png": "2024-02-01T10:11:12.500000"}


def test_an_entity_read_from_the_file_name_keeps_its_suffix(tmp_path: Path) -> None:
    """The entity keys the dataset: reading time without the suffix does not change it."""
    probed = _probed(tmp_path, DATED, {"entity": {"component": -1}, "time": {"component": -1}})
    assert sorted(ref.entity for ref in probed.values() if isinstance(ref, SampleRef)) == [
        "2023-05-01.png", "2024-02-02.png", "2024-03-01.png", "2024-08-01.png"]


def test_a_missing_time_from_the_file_name_says_the_file_name_was_read(tmp_path: Path) -> None:
    """It said 'name the folder with an ISO date', of a file name read with its suffix."""
    probed = _probed(tmp_path, [*DATED, "P4/shot_7.png"], {"entity": {"component": 0}, "time": {"component": -1}})
    issue = probed["P4/shot_7.png"]
    assert isinstance(issue, Issue) and issue.reason == "missing_time"
    assert issue.message == (
        f"{tmp_path / 'img' / 'P4' / 'shot_7.png'}: no readable time, but the job splits by time; the part of its "
        "path 'P4/shot_7.png' that the source's time: {component: -1} reads, its file name 'shot_7.png' read "
        "without its suffixes as 'shot_7', is not ISO 8601 (2024-03-05 or 2024-03-05T14:30; 2024_07_01 or "
        "05/03/2024 are not read): name the file with an ISO date, as 2024-03-05.png, or set time: to the "
        "component or path pattern that holds one")


def test_a_missing_time_from_a_folder_says_the_folder_was_read(tmp_path: Path) -> None:
    probed = _probed(tmp_path, ["2023-06-01/A_1.png", "2024_07_01/C_1.png"], {"time": {"component": 0}})
    issue = probed["2024_07_01/C_1.png"]
    assert isinstance(issue, Issue) and issue.reason == "missing_time"
    assert issue.message.endswith(
        "the part of its path '2024_07_01/C_1.png' that the source's time: {component: 0} reads, its folder "
        "'2024_07_01', is not ISO 8601 (2024-03-05 or 2024-03-05T14:30; 2024_07_01 or 05/03/2024 are not read): "
        "name the folder with an ISO date, or set time: to the component or path pattern that holds one")


def test_a_missing_time_from_a_path_pattern_names_what_it_matched(tmp_path: Path) -> None:
    names = ["2023-06-01/A_1.png", "2024_07_01/C_1.png", "x/D_1.png"]
    probed = _probed(tmp_path, names, {"time": {"path": r"^([^/]*\d[^/]*)/"}})
    matched, unmatched = probed["2024_07_01/C_1.png"], probed["x/D_1.png"]
    assert isinstance(matched, Issue) and isinstance(unmatched, Issue)
    assert "{path: '^([^/]*\\\\d[^/]*)/'} reads, its match '2024_07_01', is not ISO 8601" in matched.message
    assert "reads, no match, is not ISO 8601" in unmatched.message
    assert matched.message.endswith("fix the pattern, or name the file or folder with an ISO date")


# -- a DICOM source's time: keywords that can date no file -----------------------------------------


def _dicom_job(tmp_path: Path, time: Any) -> Path:
    from packer.demo import write_ct_slice

    for i, (pid, day) in enumerate([("P1", "20230510"), ("P2", "20240210"), ("P3", "20240801")]):
        write_ct_slice(tmp_path / "raw" / f"{pid}.dcm", patient_id=pid, study_date=day,
                       pixels_hu=np.random.default_rng(i).normal(0, 200, (32, 32)).astype(np.float32))
    doc = {"name": "t", "sources": [{"name": "ct", "kind": "dicom", "root": "raw", "label": "none", "time": time}],
           "split": {"by": "time", "cutoffs": CUTOFFS},
           "transform": {"dicom": {"windows": [{"center": 40, "width": 400}], "size": [16, 16]}, "channels": 1},
           "phi": {"mode": "keep"}, "pack": {"format": "webdataset"}, "output": "out"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


FIX = "give a date keyword, such as StudyDate, AcquisitionDateTime or ContentDate"


@pytest.mark.parametrize(("time", "message"), [
    ("PatientID", "'PatientID' is of VR LO (Patient ID), not a date: time: reads DA, DT and TM attributes; "
                  f"{FIX} (a TM beside a DA, as [StudyDate, StudyTime], adds the time of day)"),
    (["StudyDate", "StudyInstanceUID"], "'StudyInstanceUID' is of VR UI (Study Instance UID), not a date"),
    (["StudyTime"], "'StudyTime' is of VR TM, a time of day with no day, and no DA or DT keyword of time: gives "
                    f"one, so no file would be dated; {FIX}, beside it: [StudyDate, StudyTime]"),
    (["StudyTime", "SeriesTime"], "'StudyTime', 'SeriesTime' are of VR TM"),
])
def test_a_dicom_time_that_can_date_no_file_is_refused_when_the_job_loads(
        tmp_path: Path, time: Any, message: str) -> None:
    """PatientID (LO) or StudyTime alone (TM) passed the keyword check, then every file was
    missing_time, told to 'set time: to attributes this file fills' (it fills PatientID)."""
    job = _dicom_job(tmp_path, time)
    with pytest.raises(ConfigError) as raised:
        load_job(job)
    assert str(raised.value).startswith(f"{job}: sources[0].time (source 'ct'): {message}")


@pytest.mark.parametrize(("time", "dated"), [("StudyDate", True), (["StudyDate", "StudyTime"], True),
                                           (["StudyTime", "StudyDate"], True), ("AcquisitionDateTime", False),
                                           (["AcquisitionDateTime", "ContentDate", "ContentTime"], True)])
def test_dicom_times_that_name_a_day_load_and_date_the_files_that_fill_them(
        tmp_path: Path, time: Any, dated: bool) -> None:
    """A TM beside a DA is the documented pairing, in either order; the demo slices fill StudyDate and
    ContentDate, not AcquisitionDateTime (a file none dates is missing_time, the job still loads)."""
    job = load_job(_dicom_job(tmp_path, time))
    probed = [probe_ref(ref, job) for ref in discover(job).refs]
    days = {ref.relpath: (ref.time or "")[:10] for ref in probed if isinstance(ref, SampleRef)}
    timeless = {Path(i.path).name for i in probed if isinstance(i, Issue) and i.reason == "missing_time"}
    if dated:
        assert days == {"P1.dcm": "2023-05-10", "P2.dcm": "2024-02-10", "P3.dcm": "2024-08-01"}
    else:
        assert (days, timeless) == ({}, {"P1.dcm", "P2.dcm", "P3.dcm"})
