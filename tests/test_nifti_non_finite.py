"""NaN and infinite voxels of a NIfTI case: a bad sample by default, or, with
``transform.nifti.non_finite: {fill: VALUE}``, replaced before anything reads the values.

Real MR, PET and derived maps (ADC, registration outputs) carry a few NaNs outside the brain;
losing the case for them is the strict default the README promises, and filling them is the
job's explicit choice, counted per sample and in the manifest. Every packed voxel is compared
with numpy's own statistics of the planted volume, computed here with the fill applied by hand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.test_nifti import nifti_job, records

#: A positive diagonal RAS affine: canonical (D, H, W) = (k, reversed j, reversed i) of the file.
AFFINE = np.diag([1.5, 1.5, 3.0, 1.0])


def brain(seed: int = 0) -> np.ndarray:
    """A float32 'skull-stripped MR' (X, Y, Z): background 0, a block of tissue values in
    100-900, with two NaNs and an infinity in the background and one NaN inside the tissue."""
    rng = np.random.default_rng(seed)
    data = np.zeros((12, 10, 6), dtype=np.float32)
    data[2:10, 2:8, 1:5] = rng.uniform(100, 900, size=(8, 6, 4)).astype(np.float32)
    data[0, 0, 0] = data[11, 9, 5] = np.nan
    data[0, 9, 3] = np.inf
    data[5, 5, 2] = np.nan
    return data


def canonical(data: np.ndarray) -> np.ndarray:
    """The file's (X, Y, Z) voxels in packer's D×H×W for :data:`AFFINE` (LPS: superior, posterior, left)."""
    return data.transpose(2, 1, 0)[:, ::-1, ::-1]


def save(path: Path, data: np.ndarray) -> None:
    img = nib.Nifti1Image(data, AFFINE)
    img.header.set_sform(AFFINE, code=1)
    img.header.set_qform(AFFINE, code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, path)


def build_case(tmp_path: Path, *, html: bool = False, **settings: Any) -> BuildResult:
    return build(load_job(nifti_job(tmp_path, ["mr.nii.gz,P1"], **settings)),
                 BuildOptions(scheduler="sync", quiet=True, html_report=html, work_dir=tmp_path / "work"))


def bad_samples(result: BuildResult) -> list[dict[str, Any]]:
    path = result.version_dir / "bad_samples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_by_default_one_nan_voxel_makes_the_case_non_finite_and_the_message_names_the_option(tmp_path: Path
                                                                                               ) -> None:
    save(tmp_path / "raw" / "mr.nii.gz", brain())
    result = build_case(tmp_path, windows=["zscore"], output="float16", sample="volume")
    assert records(result) == {}
    [bad] = bad_samples(result)
    assert bad["reason"] == "non_finite"
    assert "3 NaN and 1 infinite voxel(s)" in bad["message"]
    assert "transform.nifti.non_finite: {fill: min}" in bad["message"]


def test_fill_zero_keeps_the_case_and_the_zscore_is_over_the_finite_tissue_only(tmp_path: Path) -> None:
    """``{fill: 0}`` under a non-zero z-score: the filled voxels join the background, outside the
    statistics, and stay 0; the mean and std are those of the finite tissue voxels."""
    data = brain()
    save(tmp_path / "raw" / "mr.nii.gz", data)
    result = build_case(tmp_path, windows=["zscore"], output="float16", sample="volume", non_finite={"fill": 0},
                        html=True)
    [(record, image, _)] = records(result).values()
    filled = np.where(np.isfinite(data), data, 0).astype(np.float32)
    tissue = filled[filled != 0].astype(np.float64)
    mean, std = tissue.mean(), tissue.std()
    expected = np.where(filled != 0, (filled - mean) / std, 0.0)
    assert image.shape == (1, 6, 10, 12) and np.isfinite(image).all()
    np.testing.assert_allclose(image[0].astype(np.float64), canonical(expected), rtol=2e-3, atol=2e-3)
    window = record["metadata"]["windows"][0]
    assert window["count"] == tissue.size
    assert window["mean"] == pytest.approx(mean, rel=1e-5) and window["std"] == pytest.approx(std, rel=1e-5)
    assert record["metadata"]["nifti"]["non_finite"] == {"image": {"nan": 3, "inf": 1, "fill": 0.0,
                                                                   "values": [0.0]}}
    [warning] = record["metadata"]["warnings"]
    assert warning == ("non-finite voxels filled: 3 NaN and 1 infinite voxel(s) of the 'image' file replaced with 0 "
                       "(transform.nifti.non_finite)")
    manifest = json.loads((result.version_dir / "manifest.json").read_text())
    assert manifest["inputs"]["non_finite_filled"] == 1
    assert manifest["config"]["transform"]["nifti"]["non_finite"] == {"fill": 0.0}
    assert "1 file with NaN/infinite voxels filled" in (result.version_dir / "report.html").read_text()
    assert bad_samples(result) == []


def test_fill_min_takes_each_channel_s_smallest_finite_voxel_before_the_percentiles(tmp_path: Path) -> None:
    """``{fill: min}`` over every voxel: the percentiles are those of the filled volume, and each
    file of the case is filled from its own minimum."""
    t1, t2 = brain(0) - 50, brain(1) * 2 + 10  # minima: -50 (background) and 10
    save(tmp_path / "raw" / "mr.nii.gz", t1)
    save(tmp_path / "raw" / "mr_t2.nii.gz", t2)
    (tmp_path / "raw").mkdir(exist_ok=True)
    job = nifti_job(tmp_path, ["mr.nii.gz,P1,mr_t2.nii.gz"], header="path,entity,t2",
                    windows=[{"percentiles": [1, 99]}], output="float16", sample="volume",
                    non_finite={"fill": "min"}, source={"channel_files": ["t2"]})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False,
                                               work_dir=tmp_path / "work"))
    [(record, image, _)] = records(result).values()
    for channel, data in enumerate((t1, t2)):
        finite = np.isfinite(data)
        filled = np.where(finite, data, data[finite].min()).astype(np.float32)
        low, high = np.percentile(filled, [1, 99])
        expected = np.clip((filled.astype(np.float64) - low) / (high - low), 0, 1)
        np.testing.assert_allclose(image[channel].astype(np.float64), canonical(expected), atol=1e-3)
        window = record["metadata"]["windows"][channel]
        assert window["low"] == pytest.approx(low, rel=1e-5) and window["high"] == pytest.approx(high, rel=1e-5)
    assert record["metadata"]["nifti"]["non_finite"] == {
        "image": {"nan": 3, "inf": 1, "fill": "min", "values": [-50.0]},
        "t2": {"nan": 3, "inf": 1, "fill": "min", "values": [10.0]}}
    assert len(record["metadata"]["warnings"]) == 2


def test_slices_are_filled_as_the_volume_is(tmp_path: Path) -> None:
    data = brain()
    save(tmp_path / "raw" / "mr.nii.gz", data)
    result = build_case(tmp_path, windows=[{"center": 500, "width": 1000, "function": "LINEAR_EXACT"}],
                        output="float16", non_finite={"fill": -1000})
    packed = records(result)
    assert len(packed) == 6  # every axial slice of the case
    filled = canonical(np.where(np.isfinite(data), data, -1000).astype(np.float64))
    for key, (_, image, _) in sorted(packed.items()):
        d = int(key.rsplit("-f", 1)[1])
        np.testing.assert_allclose(image[0].astype(np.float64), np.clip(filled[d] / 1000, 0, 1), atol=1e-3)


def test_a_channel_of_nothing_but_nan_stays_non_finite(tmp_path: Path) -> None:
    save(tmp_path / "raw" / "mr.nii.gz", np.full((4, 4, 3), np.nan, dtype=np.float32))
    result = build_case(tmp_path, windows=["zscore"], output="float16", non_finite={"fill": "min"})
    [bad] = bad_samples(result)
    assert bad["reason"] == "non_finite"
    assert "every one of its 48 voxels (channel 0) is NaN or infinite" in bad["message"]


@pytest.mark.parametrize(("value", "words"), [
    ("fill", "transform.nifti.non_finite: 'fill' is not valid under any of the given schemas. What a NaN"),
    ({"fill": "max"}, "transform.nifti.non_finite.fill: 'max' is not valid under any of the given schemas. The value "
                      "that replaces each NaN or infinite voxel: a finite number"),
    # a mapping whose one key no form takes: named as an unknown key, with the keys the mapping form allows
    ({"value": 0}, "transform.nifti.non_finite.value: unknown key (the keys allowed in transform.nifti.non_finite "
                   "are fill)"),
    ({"fill": float("nan")}, "transform.nifti.non_finite.fill: nan is not a finite number"),
    ({"fill": float("inf")}, "transform.nifti.non_finite.fill: inf is not a finite number"),
])
def test_a_misspelt_non_finite_setting_is_refused_naming_the_field(tmp_path: Path, value: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_job(nifti_job(tmp_path, [], non_finite=value))


def test_the_setting_is_part_of_the_dataset_identity_only_when_set(tmp_path: Path) -> None:
    """A job that keeps the default keeps its config_hash; a fill rule makes another dataset
    (and another cache key: the identity's transform is part of it)."""
    from packer.pipeline.spill import sample_shaping_config

    plain = load_job(nifti_job(tmp_path, []))
    assert "non_finite" not in plain.identity()["transform"]["nifti"]
    assert load_job(nifti_job(tmp_path, [], non_finite="bad")).identity() == plain.identity()
    zero, least = (load_job(nifti_job(tmp_path, [], non_finite={"fill": f})) for f in (0, "min"))
    assert zero.identity()["transform"]["nifti"]["non_finite"] == {"fill": 0.0}
    shaping = [json.dumps(sample_shaping_config(j), sort_keys=True, default=str) for j in (plain, zero, least)]
    assert len(set(shaping)) == 3
