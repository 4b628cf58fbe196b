"""A NIfTI file whose header was damaged so that its voxels pack wrong is refused, naming the file:

- a scl_slope so small (1e-30, scl_inter 0) that the stored values, scaled, all round to one
  float16 value where packer packs them as float16 (``windows: []``): every voxel would pack
  as 0.0 — ``constant_image``; a real small slope (an ADC in mm²/s, a PET's Bq/ml to SUV) whose
  values stay apart packs, and so does any scaling under a window or a normalisation, which
  work on the float32 values (an ADC in m²/s, ~1e-9, as nibabel saves it in int16);
- a dim or datatype damaged smaller (dim[1] 12 → 11, dim[3] one short, int16 relabelled int8),
  so that the header's voxels end before the file's (or the inflated stream's) data does and the
  bytes past them are not zero: read by the header, the volume packs sheared or as garbage —
  ``bad_shape``, as a DICOM file's Pixel Data longer than its header's image is; zero padding
  after the voxels, and every file nibabel writes, still packs."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import yaml

from packer.config import JobConfig, load_job
from packer.demo_nifti import nifti_bytes
from packer.pipeline.checks import find_sample_issue
from packer.pipeline.probe import probe_for_read
from packer.read import read_sample
from packer.records import Issue, Sample, SampleRef

AFFINE = np.diag([0.8, 0.8, 2.0, 1.0])
VALUES_FLOAT16: dict[str, Any] = {"windows": [], "output": "float16", "sample": "volume"}
CT_WINDOW_UINT8: dict[str, Any] = {"windows": [{"center": 40, "width": 400}], "output": "uint8", "sample": "volume"}


def ct_volume() -> np.ndarray:
    """A 12×10×8 int16 volume of varied values (a CT's stored values, roughly)."""
    return np.random.default_rng(1).normal(40, 200, (12, 10, 8)).astype(np.int16)


def job(folder: Path, transform: dict[str, Any]) -> JobConfig:
    doc = {"name": "mutated", "sources": [{"kind": "nifti", "root": str(folder), "label": "none"}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"nifti": transform},
           "pack": {"format": "webdataset"}, "output": str(folder / "out")}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_job(path)


def outcome(path: Path, transform: dict[str, Any]) -> list[Sample] | Issue:
    """``path`` through the pixel pass's own steps: its probe, its read, the per-sample checks."""
    config = job(path.parent, transform)
    ref = SampleRef(sample_id="m", source=config.sources[0].name, kind="nifti", path=str(path), relpath=path.name,
                    label="", entity="e")
    probed = probe_for_read(ref, config)
    if isinstance(probed, Issue):
        return probed
    result = read_sample(probed[0], config, state=probed[1])
    if isinstance(result, Issue):
        return result
    for sample in result:
        problem = find_sample_issue(sample, config)
        if problem is not None:
            return problem
    return result


def packed(result: list[Sample] | Issue) -> np.ndarray:
    assert isinstance(result, list) and len(result) == 1, result
    return np.asarray(result[0].image)


def with_header(data: bytes, **fields: Any) -> bytes:
    """``data`` (a single-file NIfTI-1) with header fields set, unchecked; ``dim`` as {index: size}."""
    header = nib.Nifti1Header.from_fileobj(io.BytesIO(data), check=False)
    for key, value in fields.items():
        if key == "dim":
            for index, size in value.items():
                header["dim"][index] = size
        else:
            header[key] = value
    return header.binaryblock + data[348:]


def write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return path


# ------------------------------------------------------------------------------- scl_slope


@pytest.mark.parametrize("slope", [1e-30, -1e-30, 1e-20])
def test_a_slope_that_scales_every_stored_value_to_one_float16_value_is_a_constant_image(
        tmp_path: Path, slope: float) -> None:
    """int16 stored values -600..800 times a scl_slope of 1e-30 are distinct float32 numbers
    (1e-27 apart), so a check of the float32 values passed them, yet every one is 0.0 in float16,
    as ``windows: []`` packs them: the volume would pack as one value. The file is constant_image,
    naming it and the scaling, ending with the fix."""
    path = write(tmp_path, "tiny_slope.nii", with_header(nifti_bytes(ct_volume(), AFFINE), scl_slope=slope,
                                                          scl_inter=0.0))
    found = outcome(path, VALUES_FLOAT16)
    assert isinstance(found, Issue) and (found.reason, found.stage) == ("constant_image", "validate"), found
    assert str(path) in found.message and "scl_slope" in found.message and f"{slope:g}" in found.message
    assert "float16" in found.message, found.message
    assert any(word in found.message.rsplit(";", 1)[-1] for word in ("fix", "export")), found.message


def test_a_tiny_slope_under_a_job_window_packs_as_the_window_renders_it(tmp_path: Path) -> None:
    """The same scl_slope of 1e-30 under a 40/400 window packs, every voxel level 102: a window
    renders the float32 values, not float16 ones, and what it makes of them is the job's choice
    (an earlier version refused it, and so refused valid small-valued files under any window)."""
    path = write(tmp_path, "tiny_slope.nii", with_header(nifti_bytes(ct_volume(), AFFINE), scl_slope=1e-30,
                                                          scl_inter=0.0))
    assert np.unique(packed(outcome(path, CT_WINDOW_UINT8))).tolist() == [102]


NORMALISED: dict[str, dict[str, Any]] = {
    "default_windows": {"sample": "volume"},
    "zscore_float16": {"windows": ["zscore"], "output": "float16", "sample": "volume"},
    "percentiles_uint8": {"windows": [{"percentiles": [1, 99]}], "output": "uint8", "sample": "volume"},
}


def adc_in_si_units(folder: Path) -> Path:
    """An ADC map in m²/s (0.2e-9..3e-9) saved by nibabel as int16: nibabel picks scl_slope ~4e-14
    and scl_inter ~1.6e-9 itself, a valid header."""
    adc = np.random.default_rng(0).uniform(0.2e-9, 3.0e-9, (12, 10, 8))
    image = nib.Nifti1Image(adc, AFFINE)
    image.set_data_dtype(np.int16)
    nib.save(image, folder / "adc.nii.gz")
    return folder / "adc.nii.gz"


@pytest.mark.parametrize("name", list(NORMALISED))
def test_a_valid_small_valued_scaling_packs_under_windows_and_normalisation(tmp_path: Path, name: str) -> None:
    """The nibabel-saved ADC map in m²/s under the default windows (percentiles 0.5/99.5), a
    z-score or a percentile window: each normalises its float32 values, which are far apart
    there, so it packs hundreds of levels; float16 precision is not what is packed."""
    assert np.unique(packed(outcome(adc_in_si_units(tmp_path), NORMALISED[name]))).size > 100


def test_a_valid_small_valued_scaling_packed_as_float16_values_is_a_constant_image(tmp_path: Path) -> None:
    """The same ADC map under ``windows: []`` would pack every voxel as 0.0 (float16 has nothing
    between 0 and 6e-8): constant_image, as the rule says; a window or a normalisation packs it."""
    found = outcome(adc_in_si_units(tmp_path), VALUES_FLOAT16)
    assert isinstance(found, Issue) and found.reason == "constant_image", found
    assert "float16" in found.message, found.message


@pytest.mark.parametrize(("slope", "inter"), [(1e-6, 0.0), (1e-4, 0.0), (0.001, 2000.0)],
                         ids=["adc_mm2_per_s", "pet_suv", "offset"])
def test_a_small_slope_whose_values_stay_apart_still_packs(tmp_path: Path, slope: float, inter: float) -> None:
    """An ADC map stored as int16 with scl_slope 1e-6 (mm²/s), a PET scaled to SUV by 1e-4, an
    intercept of 2000 with a slope of 0.001: the values are small, or close together, but float16
    still tells them apart, and they pack as they are."""
    stored = np.abs(ct_volume()).astype(np.int16)
    path = write(tmp_path, "small_slope.nii", with_header(nifti_bytes(stored, AFFINE), scl_slope=slope,
                                                           scl_inter=inter))
    values = packed(outcome(path, VALUES_FLOAT16))
    assert np.unique(values).size > 1
    expected = (stored.astype(np.float32) * np.float32(slope) + np.float32(inter)).astype(np.float16)
    assert set(np.unique(values).tolist()) <= set(np.unique(expected).tolist())


def test_an_unscaled_float_volume_of_small_values_is_not_judged_by_the_scaling_rule(tmp_path: Path) -> None:
    """The float16 rule is about a damaged scl_slope/scl_inter: a float32 file written without
    scaling, whose values are small (an ADC in m²/s, 1e-9), packs under a percentile window."""
    values = (np.abs(ct_volume()).astype(np.float32) + 1) * np.float32(1e-12)
    path = write(tmp_path, "adc_si.nii", nifti_bytes(values, AFFINE))
    result = packed(outcome(path, {"windows": [{"percentiles": [1, 99]}], "output": "uint8", "sample": "volume"}))
    assert np.unique(result).size > 1


# ------------------------------------------------------------------------------- trailing bytes


DAMAGES: dict[str, dict[str, Any]] = {
    "dim1_short": {"dim": {1: 11}},
    "dim3_short": {"dim": {3: 7}},
    "int16_as_int8": {"datatype": 256, "bitpix": 8},
}


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_header_that_accounts_for_fewer_bytes_than_the_file_holds_is_bad_shape(
        tmp_path: Path, damage: str, suffix: str) -> None:
    """dim[1] 12 → 11 reflows the voxels into 11-wide rows (a sheared volume), dim[3] one short
    drops a slice, int16 relabelled int8 reads half the bytes as other numbers; in each the
    voxels the header describes end before the file's (or the inflated stream's) data does,
    and the bytes past them are not zero. bad_shape, naming the file, what the header's dim ×
    datatype account for and what the file holds, and the likely cause."""
    data = nifti_bytes(ct_volume(), AFFINE)
    path = write(tmp_path, f"{damage}{suffix}", with_header(data, **DAMAGES[damage]))
    header = nib.Nifti1Header.from_fileobj(io.BytesIO(with_header(data, **DAMAGES[damage])), check=False)
    accounted = int(np.prod(header.get_data_shape())) * header.get_data_dtype().itemsize
    found = outcome(path, VALUES_FLOAT16)
    assert isinstance(found, Issue) and (found.reason, found.stage) == ("bad_shape", "validate"), found
    assert str(path) in found.message
    assert f"{accounted} bytes" in found.message and f"{len(data) - 352} bytes" in found.message, found.message
    assert "dim" in found.message and "datatype" in found.message and "export" in found.message


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_zero_padding_after_the_voxels_still_packs(tmp_path: Path, suffix: str) -> None:
    """Zeros after the last voxel are padding, not data the header leaves out: the file packs,
    its voxels as written."""
    stored = ct_volume()
    path = write(tmp_path, f"padded{suffix}", nifti_bytes(stored, AFFINE) + bytes(4096))
    assert np.unique(packed(outcome(path, VALUES_FLOAT16))).size == np.unique(stored).size


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
@pytest.mark.parametrize("kind", ["int16_scaled", "float32_4d", "uint8_extension"])
def test_files_nibabel_writes_end_with_their_last_voxel_and_pack(tmp_path: Path, kind: str, suffix: str) -> None:
    """nibabel writes the voxels last, from vox_offset (after any header extension) to the end of
    the file or stream: none of its files is refused for bytes past the voxels."""
    stored: np.ndarray = ct_volume()
    if kind == "float32_4d":
        stored = np.stack([stored, stored // 2 + 7], axis=-1).astype(np.float32)
    elif kind == "uint8_extension":
        stored = (stored % 200).astype(np.uint8)
    image = nib.Nifti1Image(stored, AFFINE)
    if kind == "int16_scaled":
        image.header.set_slope_inter(0.5, -1024.0)
    if kind == "uint8_extension":
        image.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"a comment written by a pipeline" * 3))
    path = tmp_path / f"{kind}{suffix}"
    nib.save(image, path)
    transform = {**VALUES_FLOAT16, "channels_from": "last_axis"} if kind == "float32_4d" else VALUES_FLOAT16
    assert np.unique(packed(outcome(path, transform))).size > 1
