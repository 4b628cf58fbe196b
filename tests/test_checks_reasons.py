"""Each defect of a transformed sample has its own reason code, and the read path has one boundary.

The per-sample checks (:func:`packer.pipeline.checks.find_sample_issue`) file a wrong dtype as
``bad_dtype`` and NaN or infinite values as ``non_finite``, not as ``bad_shape``; each message
names the file and sample, the job setting and the fix. The readers raise what they did not
foresee, and :func:`packer.read.at_boundary` alone turns it into ``unexpected_error``, naming the
stage the reader had reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
from dicom_files import config, ct_dataset, make_ref, save

import packer.read.dicom as dicom_mod
import packer.read.image as image_mod
from packer.config import (
    DicomTransformConfig,
    ImageTransformConfig,
    JobConfig,
    LimitsConfig,
    PackConfig,
    SafetyConfig,
    SplitConfig,
)
from packer.pipeline.checks import find_sample_issue
from packer.read import ReadProgress, read_sample
from packer.records import REASONS, Issue, Sample, SampleRef
from packer.schemas import load_schema


def job(dicom: DicomTransformConfig | None = None, image: ImageTransformConfig | None = None) -> JobConfig:
    return JobConfig(name="t", sources=(), split=SplitConfig(by="entity", ratios=(("train", 1.0),), seed=0),
                     transforms=(("dicom", dicom or config()), ("image", image or ImageTransformConfig())),
                     pack=PackConfig(format="webdataset"), output=Path("out"), limits=LimitsConfig(),
                     safety=SafetyConfig(burned_in_annotation="allow"))


def dicom_sample(image: np.ndarray, key: str = "ct-001") -> Sample:
    ref = SampleRef(sample_id="ct-001", source="ct", kind="dicom", path="/raw/ct/slice.dcm",
                    relpath="slice.dcm", label="a", entity="e")
    return Sample(key, ref, image)


def image_sample(image: np.ndarray) -> Sample:
    ref = SampleRef(sample_id="ph-001", source="photos", kind="image", path="/raw/photos/a.png",
                    relpath="a.png", label="a", entity="e")
    return Sample("ph-001", ref, image)


def issue_of(sample: Sample, job_config: JobConfig, reason: str, *needles: str) -> Issue:
    issue = find_sample_issue(sample, job_config)
    assert isinstance(issue, Issue), f"expected a {reason} issue, got None"
    assert (issue.stage, issue.reason) == ("validate", reason), issue.message
    assert issue.path == sample.ref.path
    for needle in (sample.ref.path, sample.key, *needles):
        assert needle in issue.message, (needle, issue.message)
    jsonschema.validate(issue.to_json(), load_schema("bad_sample"))
    return issue


# ------------------------------------------------------------------------------ per-sample checks


def test_new_codes_are_reasons_the_schema_accepts() -> None:
    assert {"bad_dtype", "non_finite"} <= set(REASONS)
    assert {"bad_dtype", "non_finite"} <= set(load_schema("bad_sample")["properties"]["reason"]["enum"])


def test_a_clean_sample_passes() -> None:
    assert find_sample_issue(dicom_sample(np.zeros((1, 4, 4), np.uint8)), job()) is None
    assert find_sample_issue(dicom_sample(np.zeros((1, 4, 4), np.float16)), job(config(output="float16"))) is None
    assert find_sample_issue(image_sample(np.zeros((3, 4, 4), np.uint8)), job()) is None


def test_a_dicom_sample_of_the_wrong_dtype_is_bad_dtype() -> None:
    issue = issue_of(dicom_sample(np.zeros((1, 4, 4), np.float32)), job(config(output="uint16")), "bad_dtype",
                     "dtype float32", "expected uint16", "transform.dicom.output is uint16", "packer bug")
    assert "bad_shape" not in issue.message


def test_an_image_sample_of_the_wrong_dtype_is_bad_dtype() -> None:
    issue_of(image_sample(np.zeros((3, 4, 4), np.uint16)), job(), "bad_dtype",
             "dtype uint16", "expected uint8", "images are always uint8", "packer bug")


def test_nan_is_non_finite() -> None:
    image = np.zeros((1, 4, 4), np.float16)
    image[0, 1, 2] = np.nan
    issue_of(dicom_sample(image), job(config(output="float16")), "non_finite",
             "1 NaN and 0 infinite", "transform.dicom.output is float16",
             "use an integer output (uint8/uint16) with a window")


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_infinity_is_non_finite(value: float) -> None:
    image = np.zeros((1, 4, 4), np.float16)
    image[0, 0, :2] = value
    issue_of(dicom_sample(image), job(config(output="float16")), "non_finite",
             "0 NaN and 2 infinite", "transform.dicom.output")


def test_shape_defects_stay_bad_shape_and_come_first() -> None:
    issue_of(dicom_sample(np.zeros((4, 4), np.float32)), job(), "bad_shape", "expected C×H×W")
    issue_of(dicom_sample(np.zeros((1, 4, 4), np.uint8)), job(config(size=(8, 8))), "bad_shape",
             "is 4×4", "asks for 8×8")
    wrong_size_nan = np.full((1, 4, 4), np.nan, np.float16)
    issue_of(dicom_sample(wrong_size_nan), job(config(output="float16", size=(8, 8))), "bad_shape")


# ---------------------------------------------------------------- one boundary on the read path


def boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("boom")


def png(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 256, (4, 4), dtype=np.uint8)
    assert cv2.imwrite(str(path), noise)
    return path


def image_ref(path: Path) -> SampleRef:
    return SampleRef(sample_id="img", source="photos", kind="image", path=str(path), relpath=path.name,
                     label="a", entity="e")


def test_the_readers_raise_what_they_did_not_foresee(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the boundary converts: the readers' own work lets the exception out."""
    monkeypatch.setattr(image_mod, "transform_image", boom)
    progress = ReadProgress()
    with pytest.raises(RuntimeError, match="boom"):
        image_mod._read(image_ref(png(tmp_path / "a.png")), ImageTransformConfig(), LimitsConfig(), progress)
    assert progress.stage == "transform"
    monkeypatch.setattr(dicom_mod, "render_samples", boom)
    with pytest.raises(RuntimeError, match="boom"):
        dicom_mod._read(make_ref(save(ct_dataset(), tmp_path / "ct.dcm")), config(), LimitsConfig(), True)


@pytest.mark.parametrize(("target", "stage"), [("_decode_pages", "read"), ("_validate", "validate"),
                                               ("transform_image", "transform")])
def test_read_sample_names_the_stage_an_image_reader_reached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             target: str, stage: str) -> None:
    monkeypatch.setattr(image_mod, target, boom)
    issue = read_sample(image_ref(png(tmp_path / "a.png")), job())
    assert isinstance(issue, Issue)
    assert (issue.reason, issue.stage, issue.message) == ("unexpected_error", stage, "RuntimeError: boom")


def test_read_sample_gives_one_unexpected_error_for_a_dicom_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dicom_mod, "render_samples", boom)
    issue = read_sample(make_ref(save(ct_dataset(), tmp_path / "ct.dcm")), job())
    assert isinstance(issue, Issue)
    assert (issue.reason, issue.stage, issue.message) == ("unexpected_error", "read", "ct.dcm: RuntimeError: boom")
