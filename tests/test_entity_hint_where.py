"""The "each of its N files is its own entity ... leakage protection is off" warning of a DICOM
source, and its column and path hints, judge the files the probe kept: a header ``where:`` that
keeps one image per patient does not make a table column or a folder that grouped the files it
left out a reason to warn, while a column that groups the kept files still is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.pipeline.datacheck import validate_job
from tests.dicom_files import ct_dataset, save


def _screening(tmp_path: Path, *, per_image: bool, folder: str, where: dict[str, str]) -> Path:
    """RSNA Screening Mammography's layout: train.csv (patient_id, image_id, cancer), four views a
    patient (L/R × CC/MLO) under ``<folder>/<image_id>.dcm``, ``folder`` the patient's id
    (``{p}``: the patient's number). The headers' PatientID is the table's patient_id, or with
    ``per_image`` one id an image (an anonymiser's). ``where``: the source's header filter."""
    rows = []
    image_id = 1000
    for p in range(4):
        patient = folder.format(p=10000 + 37 * p)
        for n, (laterality, view) in enumerate((lat, view) for lat in "LR" for view in ("CC", "MLO")):
            image_id += 1
            ds = ct_dataset(pixels=np.full((8, 8), 100 * p + 10 * n, dtype=np.int16),
                            PatientID=f"ANON{image_id}" if per_image else patient,
                            ImageLaterality=laterality, ViewPosition=view)
            save(ds, tmp_path / "train_images" / patient / f"{image_id}.dcm")
            rows.append(f"{patient},{image_id},{p % 2}")
    (tmp_path / "train.csv").write_text("patient_id,image_id,cancer\n" + "\n".join(rows) + "\n")
    doc = {"name": "screening", "sources": [{"kind": "dicom", "name": "rsna", "root": "train_images",
                                             "labels": {"file": "train.csv",
                                                        "path": {"template": "{patient_id}/{image_id}.dcm"}},
                                             "label": {"column": "cancer"}, "where": where}],
           "labels": ["0", "1"], "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 1},
           "transform": {"dicom": {"windows": ["brain"], "size": [8, 8]}}, "pack": {"format": "webdataset"},
           "output": "out", "phi": {"mode": "keep"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "job.yaml"


def _entity_warnings(job: Path) -> list[str]:
    result = validate_job(load_job(job), quick=True, scheduler="sync", quiet=True)
    assert len(result.prepared.samples) > 0
    return [said for code, said in result.prepared.warnings if code == "entities"]


@pytest.mark.parametrize("folder", ["{p}", "patient{p}"])
def test_a_header_where_keeping_one_image_a_patient_does_not_warn_that_each_file_is_its_own_entity(
        tmp_path: Path, folder: str) -> None:
    """PatientID is the table's patient_id; ``where: {ImageLaterality: L, ViewPosition: CC}``
    keeps one of each patient's four images. Each kept file is its own entity because it is its
    patient's only one, not because the entity is wrong: the column patient_id (and a folder
    named patient10000) grouped only the files the filter left out. No warning, and none telling
    to name the header keyword that the entity already is."""
    said = _entity_warnings(_screening(tmp_path, per_image=False, folder=folder,
                                       where={"ImageLaterality": "L", "ViewPosition": "CC"}))
    assert said == []


@pytest.mark.parametrize("folder", ["{p}", "patient{p}"])
def test_a_column_grouping_the_kept_files_still_warns_when_the_headers_give_one_entity_a_file(
        tmp_path: Path, folder: str) -> None:
    """The anonymiser wrote one PatientID an image and ``where: {ImageLaterality: L}`` keeps two
    images a patient: the kept files are each their own entity while patient_id groups them in
    twos, so one patient's images can land in two splits: the warning names the column (and the
    folder, where it looks like a patient id), counting the 8 kept files, not the 16 listed."""
    said = _entity_warnings(_screening(tmp_path, per_image=True, folder=folder, where={"ImageLaterality": "L"}))
    assert len(said) == 1, said
    assert "source 'rsna': each of its 8 files is its own entity" in said[0]
    assert "leakage protection is off" in said[0]
    if folder == "{p}":
        assert "Column 'patient_id' looks like a patient id, grouping the files" in said[0], said[0]
        assert "entity: KEYWORD" in said[0]
    else:
        assert "Column 'patient_id' and the path part 'patient10000' look like a patient id" in said[0], said[0]
        assert said[0].endswith("read the entity from the path, entity: {component: 0}")


def test_a_header_where_keeping_one_image_a_patient_of_one_entity_an_image_does_not_warn(tmp_path: Path) -> None:
    """One PatientID an image, but the filter keeps one image a patient: no kept file shares a
    patient_id with another, so no patient's images can be split; nothing to warn of."""
    said = _entity_warnings(_screening(tmp_path, per_image=True, folder="{p}",
                                       where={"ImageLaterality": "L", "ViewPosition": "CC"}))
    assert said == []
