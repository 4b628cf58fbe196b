"""One SOP Instance UID in two patients' files: a mix-up the build and validate warn of.

A UID names one image the world over (PS3.5 9.1). A series job treats a file repeated with its
UID at one position as the same image exported twice; in a slice job two *entities'* files with
one UID and different pixels mean a header was edited or an anonymiser mapped two patients'
files onto one UID. The build packs them as they are and says so, naming the pseudonymised
entities and sample keys, never the UID or the raw patient ids. Real files written by pydicom.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pydicom.uid import generate_uid

from packer.cli import main
from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from tests.dicom_files import ct_dataset, ct_pixels, save
from tests.test_targets import _job

SHARED = generate_uid()


def write_raw(raw: Path, *, shared: bool = True) -> None:
    """Three patients' CT slices; with ``shared``, MRN-1's a.dcm and MRN-2's b.dcm carry one UID."""
    for name, patient, seed, uid in (("MRN-1/a.dcm", "MRN-1", 1, SHARED), ("MRN-1/c.dcm", "MRN-1", 3, None),
                                     ("MRN-2/b.dcm", "MRN-2", 2, SHARED if shared else None),
                                     ("MRN-3/d.dcm", "MRN-3", 4, None)):
        ds = ct_dataset(ct_pixels(seed=seed), PatientID=patient)
        if uid is not None:
            ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = uid
        save(ds, raw / name)


def job_for(tmp_path: Path) -> Path:
    return _job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}])


def test_a_uid_in_two_patients_files_is_a_build_warning_naming_their_pseudonyms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_raw(tmp_path / "raw")
    result = build(load_job(job_for(tmp_path)), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    err = capsys.readouterr().err
    (warning,) = [line for line in err.splitlines() if "SOP Instance UID" in line]
    assert "1 SOP Instance UID(s) are each carried by files of several entities" in warning
    assert "with different pixels" in warning and "packer locate" in warning
    index = pq.read_table(result.version_dir / "_index.parquet", columns=["key", "entity_id"]).to_pylist()
    named = [row for row in index if row["key"] in warning]
    assert len(named) == 2 and len({row["entity_id"] for row in named}) == 2
    assert all(f"{row['entity_id']} ({row['key']})" in warning for row in named)
    assert "MRN" not in warning and SHARED not in warning  # pseudonyms, and never the UID
    assert len(index) == 4  # report-only: every file is packed as it is


def test_validate_json_reports_it_and_files_with_their_own_uids_give_none(tmp_path: Path) -> None:
    write_raw(tmp_path / "raw")
    job = job_for(tmp_path)
    out = tmp_path / "report.json"
    run = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out)])
    assert run.exit_code == 0, run.output
    codes = [w["code"] for w in json.loads(out.read_text())["warnings"]]
    assert codes.count("instance_uids") == 1

    clean = tmp_path / "clean"
    write_raw(clean / "raw", shared=False)
    out = clean / "report.json"
    run = CliRunner().invoke(main, ["validate", str(job_for(clean)), "--scheduler", "sync", "-q", "--json", str(out)])
    assert run.exit_code == 0, run.output
    assert "instance_uids" not in [w["code"] for w in json.loads(out.read_text())["warnings"]]
