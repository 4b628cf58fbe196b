"""A DICOM source's ``where:`` as a job author writes it, walked against real files.

README "DICOM exports": a localizer (in a slice job), a slide's LABEL, OVERVIEW or THUMBNAIL
image, a secondary capture and an RT Dose are ``not_requested`` unless a positive condition
*names* them and holds for the file. A condition that merely holds for them (``ImageType:
ORIGINAL``, which README offers to keep a slide's base level, or ``{SOPClassUID: {match: Image
Storage}}``) does not ask for them: it would pack scouts as slices and a slide's label photo as
tissue.
"""

from __future__ import annotations

import shutil
from datetime import date as _date
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydicom.uid import SecondaryCaptureImageStorage

from packer.config import load_job
from packer.errors import ConfigError
from packer.read.dicom import probe_dicom
from packer.records import Excluded, Issue
from tests.dicom_files import ct_dataset, image_dataset, make_ref, save, shipped
from tests.test_dicom_exports import _slide_image, export_job


def _outcome(tmp: Path, raw: Path, path: Path, where: dict[str, Any]) -> str:
    """What the probe makes of ``path`` under the source's ``where:`` (loaded as a job loads it,
    names of SOP classes turned into UIDs): the why of its exclusion, or ``packed``."""
    conditions = load_job(export_job(tmp, raw, where=where)).sources[0].header_where
    found = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=(), where=conditions)
    assert not isinstance(found, Issue), found
    return found.why if isinstance(found, Excluded) else "packed"


@pytest.fixture()
def scout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CT slice (ORIGINAL\\PRIMARY\\AXIAL) and a scout (ORIGINAL\\PRIMARY\\LOCALIZER) of one patient."""
    raw = tmp_path / "raw"
    axial = save(ct_dataset(PatientID="P1", ImageType=["ORIGINAL", "PRIMARY", "AXIAL"]), raw / "ax.dcm")
    localizer = save(ct_dataset(PatientID="P1", ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"]), raw / "scout.dcm")
    return raw, axial, localizer


@pytest.mark.parametrize(("where", "localizer"), [
    ({"ImageType": "ORIGINAL"}, "not_requested"),            # holds for the scout, names no LOCALIZER
    ({"ImageType": {"in": ["PRIMARY"]}}, "not_requested"),
    ({"ImageType": {"match": "."}}, "not_requested"),        # broad: finds every value
    ({"ImageType": {"match": "ORIG|PRIM"}}, "not_requested"),
    ({"ImageType": {"not": ["DERIVED"]}}, "not_requested"),  # not never asks
    ({"ImageType": "LOCALIZER"}, "packed"),
    ({"ImageType": ["ORIGINAL", "LOCALIZER"]}, "packed"),    # a list member names it
    ({"ImageType": {"match": "localizer"}}, "packed"),       # a pattern that finds the word itself
    ({"ImageType": {"match": "^LOCAL"}}, "packed"),
])
def test_only_a_condition_naming_localizer_asks_for_a_scout_in_a_slice_job(
        tmp_path: Path, scout: tuple[Path, Path, Path], where: dict[str, Any], localizer: str) -> None:
    raw, axial, scout_path = scout
    assert _outcome(tmp_path, raw, scout_path, where) == localizer
    expected_axial = "filtered" if localizer == "packed" and where != {"ImageType": ["ORIGINAL", "LOCALIZER"]} \
        else "packed"
    assert _outcome(tmp_path, raw, axial, where) == expected_axial


def test_readmes_slide_recipe_image_type_original_keeps_the_base_level_not_the_label_overview_or_thumbnail(
        tmp_path: Path) -> None:
    """README: ``{ImageType: ORIGINAL}`` keeps a slide's base level. The label, overview and
    thumbnail images are ORIGINAL too (value 1), and were packed as tissue by it."""
    raw = tmp_path / "raw"
    files = {kind: _slide_image(raw / f"{kind.lower()}.dcm", kind, label_in_image=False, seed=k)
             for k, kind in enumerate(("VOLUME", "LABEL", "OVERVIEW", "THUMBNAIL"))}
    assert {kind: _outcome(tmp_path / "a", raw, path, {"ImageType": "ORIGINAL"}) for kind, path in files.items()} == {
        "VOLUME": "packed", "LABEL": "not_requested", "OVERVIEW": "not_requested", "THUMBNAIL": "not_requested"}
    # a list asks for the images whose own value 3 it names, and no other
    listed = {"ImageType": ["ORIGINAL", "THUMBNAIL"]}
    assert {kind: _outcome(tmp_path / "b", raw, path, listed) for kind, path in files.items()} == {
        "VOLUME": "packed", "LABEL": "not_requested", "OVERVIEW": "not_requested", "THUMBNAIL": "packed"}
    pattern = {"ImageType": {"match": "thumb|overview"}}
    assert {kind: _outcome(tmp_path / "c", raw, path, pattern) for kind, path in files.items()} == {
        "VOLUME": "filtered", "LABEL": "filtered", "OVERVIEW": "packed", "THUMBNAIL": "packed"}
    broad = {"ImageType": {"match": "o"}}  # finds ORIGINAL in every image: names none
    assert {kind: _outcome(tmp_path / "d", raw, path, broad) for kind, path in files.items()} == {
        "VOLUME": "packed", "LABEL": "not_requested", "OVERVIEW": "not_requested", "THUMBNAIL": "not_requested"}


@pytest.mark.parametrize(("where", "capture"), [
    ({"SOPClassUID": {"match": "Image Storage"}}, "not_requested"),  # every image class's name holds it
    ({"SOPClassUID": {"match": "."}}, "not_requested"),
    ({"SOPClassUID": {"match": "Storage$"}}, "not_requested"),
    ({"SOPClassUID": {"match": "Secondary Capture"}}, "packed"),     # README's recipe: the five SC classes only
    ({"SOPClassUID": {"match": "secondary"}}, "packed"),
    ({"SOPClassUID": ["CT Image Storage", "Secondary Capture Image Storage"]}, "packed"),
    ({"SOPClassUID": "1.2.840.10008.5.1.4.1.1.7"}, "packed"),
    ({"SOPClassUID": {"not": ["CT Image Storage"]}}, "not_requested"),
])
def test_only_a_condition_naming_a_secondary_capture_class_asks_for_a_screenshot(
        tmp_path: Path, where: dict[str, Any], capture: str) -> None:
    raw = tmp_path / "raw"
    screen = np.random.default_rng(6).integers(0, 255, (16, 16), dtype=np.uint8)
    shot = save(image_dataset(screen, modality="OT", sop_class=SecondaryCaptureImageStorage, PatientID="P1",
                              BurnedInAnnotation="NO"), raw / "shot.dcm")
    assert _outcome(tmp_path, raw, shot, where) == capture


@pytest.mark.parametrize(("where", "dose"), [
    ({"Modality": {"match": "."}}, "not_requested"),
    ({"Modality": {"match": "^RT"}}, "not_requested"),  # RTIMAGE, RTPLAN, RTSTRUCT too
    ({"SOPClassUID": {"match": "Storage"}}, "not_requested"),
    ({"Modality": {"not": ["CT"]}}, "not_requested"),
    ({"Modality": "RTDOSE"}, "packed"),
    ({"Modality": ["CT", "RTDOSE"]}, "packed"),
    ({"Modality": {"match": "dose"}}, "packed"),
    ({"SOPClassUID": "RT Dose Storage"}, "packed"),
    ({"SOPClassUID": {"match": "RT Dose"}}, "packed"),
])
def test_only_a_condition_naming_rt_dose_asks_for_a_dose_grid(tmp_path: Path, where: dict[str, Any],
                                                                dose: str) -> None:
    raw = tmp_path / "raw"
    grid = Path(shutil.copy(shipped("rtdose.dcm"), (raw.mkdir() or raw) / "dose.dcm"))
    assert _outcome(tmp_path, raw, grid, where) == dose


def _dated(raw: Path) -> dict[str, Path]:
    """Three CT studies, one a day, StudyDate written as DICOM writes a DA (YYYYMMDD)."""
    return {date: save(ct_dataset(PatientID=f"P{k}", StudyDate=date, StudyTime="101112",
                                  AcquisitionDateTime=f"{date}101112"), raw / f"P{k}" / "ax.dcm")
            for k, date in enumerate(("20230504", "20240110", "20220301"))}


@pytest.mark.parametrize(("where", "said"), [
    ({"StudyDate": {"not": ["2024-01-10"]}}, r"StudyDate: '2024-01-10' .*DA.*YYYYMMDD.*20240110"),
    ({"StudyDate": ["20230504", "2024/01/10"]}, r"StudyDate: '2024/01/10' .*20240110"),
    ({"StudyDate": _date(2024, 1, 10)}, r"StudyDate: '2024-01-10' .*20240110"),  # unquoted YAML: a date
    ({"StudyDate": "Jan 10 2024"}, r"StudyDate: 'Jan 10 2024' .*DA.*YYYYMMDD"),
    ({"StudyTime": "10:11"}, r"StudyTime: '10:11' .*TM.*1011"),  # ACR-NEMA's HH:MM:SS has seconds
    ({"AcquisitionDateTime": {"in": ["2024-01-10T10:11:12"]}}, r"AcquisitionDateTime: '2024-01-10T10:11:12' "
                                                                 r".*DT.*20240110101112"),
])
def test_a_date_or_time_no_dicom_header_can_hold_is_refused_naming_its_dicom_spelling(
        tmp_path: Path, where: dict[str, Any], said: str) -> None:
    """A DA is YYYYMMDD (PS3.5 6.2): ``{StudyDate: {not: ['2024-01-10']}}`` never matches a
    file, so it left the study of that day in with no word; a list silently dropped it."""
    raw = tmp_path / "raw"
    _dated(raw)
    with pytest.raises(ConfigError, match=r"sources\[0\]\.where\." + said):
        load_job(export_job(tmp_path, raw, where=where))


def test_a_date_written_as_dicom_writes_it_is_compared_as_ever(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    files = _dated(raw)
    for k, where in enumerate(({"StudyDate": {"not": ["20240110"]}}, {"StudyDate": {"not": [20240110]}},
                               {"AcquisitionDateTime": {"not": ["20240110101112"]}})):
        outcomes = {date: _outcome(tmp_path / str(k), raw, path, where) for date, path in files.items()}
        assert outcomes == {"20230504": "packed", "20240110": "filtered", "20220301": "packed"}, where
    for k, where in enumerate(({"StudyTime": ["1011", "101112", "101112.5"]}, {"AcquisitionDateTime": "2024"},
                               {"AcquisitionDateTime": "20240110101112.123456+0100"})):
        load_job(export_job(tmp_path / f"t{k}", raw, where=where))  # each a value its VR may hold: accepted
    # a pattern finds part of a value: no whole value to hold to the VR's form
    year = {date: _outcome(tmp_path / "m", raw, path, {"StudyDate": {"match": "^2024"}})
            for date, path in files.items()}
    assert year == {"20230504": "filtered", "20240110": "packed", "20220301": "filtered"}


@pytest.mark.parametrize(("where", "said"), [
    ({"ImageType": {"not": ["DERIVED\\SECONDARY\\MPR"]}},
     r"ImageType: 'DERIVED\\SECONDARY\\MPR' never matches: .*each value of ImageType alone.*"
     r"ImageType: \{not: \[MPR\]\}.*ImageType: \{not: \[DERIVED, SECONDARY, MPR\]\}"),
    ({"ImageType": "ORIGINAL\\PRIMARY\\AXIAL"}, r"ImageType: 'ORIGINAL\\PRIMARY\\AXIAL' .*ImageType: AXIAL"),
    ({"ImageType": ["LOCALIZER", "ORIGINAL\\PRIMARY"]}, r"ImageType: 'ORIGINAL\\PRIMARY' never matches"),
    ({"PatientOrientation": "L\\F"}, r"PatientOrientation: 'L\\F' never matches"),
])
def test_a_value_holding_dicoms_value_delimiter_is_refused_saying_to_write_one_value(
        tmp_path: Path, scout: tuple[Path, Path, Path], where: dict[str, Any], said: str) -> None:
    """A backslash separates the values of a multi-valued attribute (PS3.5 6.4) and a condition
    tests each value alone, so ``{not: ['DERIVED\\SECONDARY\\MPR']}`` (ImageType as dcmdump shows
    it) never matched: it packed the MPRs it meant to leave out, with no word."""
    with pytest.raises(ConfigError, match=r"sources\[0\]\.where\." + said):
        load_job(export_job(tmp_path, scout[0], where=where))


def test_a_backslash_in_a_text_value_that_may_hold_one_is_a_value_and_a_pattern_is_a_pattern(
        tmp_path: Path, scout: tuple[Path, Path, Path]) -> None:
    raw, axial, _ = scout
    # LT, ST and UT are single-valued text, where a backslash is a character (PS3.5 6.2)
    load_job(export_job(tmp_path / "lt", raw, where={"ImageComments": "C:\\scans\\a"}))
    assert _outcome(tmp_path / "re", raw, axial, {"ImageType": {"match": "^AX\\w+"}}) == "packed"


def test_the_values_a_file_holds_are_shown_as_dicom_writes_them_joined_by_backslashes(
        tmp_path: Path, scout: tuple[Path, Path, Path]) -> None:
    """The filtered and not_requested details joined ImageType's values with '/', a spelling
    no header, dcmdump or where: uses."""
    raw, axial, localizer = scout
    conditions = load_job(export_job(tmp_path, raw, where={"ImageType": "LOCALIZER"})).sources[0].header_where
    filtered = probe_dicom(make_ref(axial), entity_keyword="PatientID", time_keywords=(), where=conditions)
    assert isinstance(filtered, Excluded) and filtered.why == "filtered", filtered
    assert filtered.detail == "ImageType is ORIGINAL\\PRIMARY\\AXIAL, where: ImageType = LOCALIZER"
    scout_left_out = probe_dicom(make_ref(localizer), entity_keyword="PatientID", time_keywords=())
    assert isinstance(scout_left_out, Excluded) and scout_left_out.why == "not_requested", scout_left_out
    assert "(Image Type ORIGINAL\\PRIMARY\\LOCALIZER)" in scout_left_out.detail


def test_a_time_written_unquoted_is_a_number_and_matches_the_header_by_value(tmp_path: Path) -> None:
    """``StudyTime: 083000`` unquoted is the number 83000 in YAML 1.2, and a number compares with a
    header's value as a number (083000 is 83000), so it matched the morning study; the DA/TM
    form check held the number's digits, '83000', to the TM's form and refused the job."""
    raw = tmp_path / "raw"
    morning = save(ct_dataset(PatientID="P1", StudyTime="083000"), raw / "P1" / "ax.dcm")
    noon = save(ct_dataset(PatientID="P2", StudyTime="120000"), raw / "P2" / "ax.dcm")
    job = export_job(tmp_path, raw, where={"StudyTime": 83000})
    text = job.read_text()
    assert "StudyTime: 83000" in text
    job.write_text(text.replace("StudyTime: 83000", "StudyTime: 083000"))  # as the user typed it
    conditions = load_job(job).sources[0].header_where
    outcomes = {}
    for name, path in (("morning", morning), ("noon", noon)):
        found = probe_dicom(make_ref(path), entity_keyword="PatientID", time_keywords=(), where=conditions)
        assert not isinstance(found, Issue), found
        outcomes[name] = found.why if isinstance(found, Excluded) else "packed"
    assert outcomes == {"morning": "packed", "noon": "filtered"}


def test_a_date_or_time_in_acr_nema_spelling_matches_a_legacy_header_written_so(tmp_path: Path) -> None:
    """PS3.5 Table 6.2-1 notes the ACR-NEMA 300 spellings a pre-3.0 archive holds, DA
    ``YYYY.MM.DD`` and TM ``HH:MM:SS.frac``; a where: value written as such a header writes it
    matched it, until the DA/TM form check refused it as a value no header holds."""
    raw = tmp_path / "raw"
    old = save(ct_dataset(PatientID="P1", StudyDate="1995.03.15", StudyTime="10:11:12"), raw / "P1" / "ax.dcm")
    other = save(ct_dataset(PatientID="P2", StudyDate="1995.03.16", StudyTime="10:11:13.5"), raw / "P2" / "ax.dcm")
    modern = save(ct_dataset(PatientID="P3", StudyDate="19950315", StudyTime="101112"), raw / "P3" / "ax.dcm")
    for k, where in enumerate(({"StudyDate": "1995.03.15"}, {"StudyTime": {"in": ["10:11:12", "09:00:00.25"]}})):
        outcomes = {path.parent.name: _outcome(tmp_path / str(k), raw, path, where) for path in (old, other, modern)}
        # compared as written: the legacy spelling is not the DICOM one's day
        assert outcomes == {"P1": "packed", "P2": "filtered", "P3": "filtered"}, where


def _scout_file(raw: Path) -> Path:
    return save(ct_dataset(PatientID="P1", ImageType=["ORIGINAL", "PRIMARY", "LOCALIZER"]), raw / "scout.dcm")


def _dose_file(raw: Path) -> Path:
    return Path(shutil.copy(shipped("rtdose.dcm"), (raw.mkdir(parents=True, exist_ok=True) or raw) / "dose.dcm"))


def _screenshot_file(raw: Path) -> Path:
    screen = np.random.default_rng(6).integers(0, 255, (16, 16), dtype=np.uint8)
    return save(image_dataset(screen, modality="OT", sop_class=SecondaryCaptureImageStorage, PatientID="P1",
                              BurnedInAnnotation="NO"), raw / "shot.dcm")


@pytest.mark.parametrize(("made", "where", "outcome"), [
    # the pattern form of README's {Modality: [CT, RTDOSE]}: it spells out RTDOSE
    (_dose_file, {"Modality": {"match": "^(CT|RTDOSE)$"}}, "packed"),
    (_dose_file, {"SOPClassUID": {"match": "CT Image|RT\\ Dose"}}, "packed"),
    (_dose_file, {"Modality": {"match": "^(CT|RT.*)$"}}, "not_requested"),  # RTIMAGE, RTPLAN too: no RTDOSE written
    (_scout_file, {"ImageType": {"match": "AXIAL|LOCALIZER"}}, "packed"),
    (_scout_file, {"ImageType": {"match": "ORIGINAL|localizer"}}, "packed"),
    (_scout_file, {"ImageType": {"match": "AXIAL|PRIMARY"}}, "not_requested"),
    # the SC class UID, escaped or not, is a prefix of the five SC classes' UIDs
    (_screenshot_file, {"SOPClassUID": {"match": r"^1\.2\.840\.10008\.5\.1\.4\.1\.1\.7"}}, "packed"),
    (_screenshot_file, {"SOPClassUID": {"match": "1.2.840.10008.5.1.4.1.1.7"}}, "packed"),
    (_screenshot_file, {"SOPClassUID": {"match": "Secondary Capture|CT Image"}}, "packed"),
    (_screenshot_file, {"SOPClassUID": {"match": r"^1\.2\.840\.10008\.5\.1\.4\.1\.1\."}}, "not_requested"),
    # VL Endoscopic 1.2.840.10008.5.1.4.1.1.77.1.1 starts with the SC UID's text but is not it
    (_screenshot_file, {"SOPClassUID": {"match": r"^1\.2\.840\.10008\.5\.1\.4\.1\.1\.77|^1\.2\.840\.10008\.5\.1"
                                                 r"\.4\.1\.1\.[0-9]$"}}, "not_requested"),
    # a pattern that writes the kind's word to keep it out (a negative lookahead) never asks for it
    (_scout_file, {"ImageType": {"match": "^(?!LOCALIZER$)"}}, "not_requested"),
    (_scout_file, {"ImageType": {"match": "^(?!.*LOCALIZER)"}}, "not_requested"),
    (_screenshot_file, {"SOPClassUID": {"match": r"^(?!1\.2\.840\.10008\.5\.1\.4\.1\.1\.7)"}}, "not_requested"),
    (_screenshot_file, {"SOPClassUID": {"match": "^(?!Secondary Capture)"}}, "not_requested"),
    (_dose_file, {"Modality": {"match": "^(?!RTDOSE)"}}, "filtered"),  # its one Modality fails the where: itself
])
def test_a_match_that_spells_out_the_kinds_own_value_asks_for_it_though_it_finds_ordinary_values_too(
        tmp_path: Path, made: Any, where: dict[str, Any], outcome: str) -> None:
    """A pattern that writes RTDOSE, LOCALIZER or the SC class UID out names the kind, as the list
    it stands for does; before 85f7d0a such a file packed, and 85f7d0a left it not_requested
    because the pattern also finds CT or AXIAL, though it passed the where: (not filtered)."""
    raw = tmp_path / "raw"
    path = made(raw)
    assert _outcome(tmp_path, raw, path, where) == outcome
