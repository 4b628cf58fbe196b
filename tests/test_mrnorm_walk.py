"""MR normalisation and NIfTI scaling walked through values far from the usual range: an ADC map
in m²/s (voxels ~1e-9), a frame whose Rescale Slope makes its modality values as small, and
integer volumes with a non-trivial scl_slope/scl_inter.

README "Intensity without a unit (MR)": a z-score is (x - mean) / std with the population std,
and the record's mean and std reproduce the packed bytes (float32, from float32(mean) and
float32(1 / std)). README "NIfTI volumes": the voxel values are the stored values × scl_slope +
scl_inter as nibabel's get_fdata(dtype=np.float32) gives them. Real files written by nibabel
and pydicom, packed by real builds (or read by the DICOM reader), compared with numpy and nibabel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nifti_files import Packed, build_nifti, write_nifti

from packer.config import parse_window
from packer.read.dicom import read_dicom
from packer.records import Issue
from tests.dicom_files import config, image_dataset, make_ref, save

AFFINE = np.diag([1.0, 1.0, 2.0, 1.0])


def adc_map(scale: float, seed: int = 0) -> np.ndarray:
    """A float32 X×Y×Z map: background exactly 0, tissue uniform in [0.2, 3] × ``scale``."""
    data = np.zeros((20, 18, 6), dtype=np.float32)
    data[4:16, 3:15, 1:5] = (np.random.default_rng(seed).uniform(0.2, 3.0, size=(12, 12, 4)) * scale
                             ).astype(np.float32)
    return data


def pack_volume(folder: Path, data: np.ndarray, nifti: dict[str, Any], **scaling: float) -> Packed:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    write_nifti(folder / "raw" / "mr.nii.gz", data, AFFINE, **scaling)
    return build_nifti(folder, [{"path": "mr.nii.gz", "entity": "p1"}], nifti)


def from_record(values: np.ndarray, record: dict[str, Any]) -> np.ndarray:
    """README's recipe: the packed z-scores from the record alone, in float32."""
    z = (values.astype(np.float32) - np.float32(record["mean"])) * np.float32(1.0 / record["std"])
    return np.where(values != 0, z, np.float32(0.0)) if record["over"] == "nonzero" else z


def test_an_adc_map_in_square_metres_per_second_is_z_scored_by_its_own_std(tmp_path: Path) -> None:
    """A std of ~8e-10 is divided by, not replaced by 1e-8 (which packed z-scores of std 0.08):
    the tissue's z-scores have mean 0 and std 1, and the record reproduces every packed byte."""
    data = adc_map(1e-9)
    packed = pack_volume(tmp_path, data, {"windows": ["zscore"], "output": "float16", "sample": "volume"})
    assert packed.bad == []
    [(key, image)] = packed.images.items()
    [record] = packed.records[key]["metadata"]["windows"]
    tissue = data[data != 0].astype(np.float64)
    assert record["std"] == pytest.approx(tissue.std(), rel=1e-9) and record["std"] < 1e-8
    z = image[0].astype(np.float64)[image[0] != 0]
    assert z.mean() == pytest.approx(0.0, abs=1e-3) and z.std() == pytest.approx(1.0, abs=1e-3)
    # packed D×H×W is the file's X×Y×Z reoriented: compare as multisets, exact to the byte
    want = np.sort(from_record(data, record).astype(np.float16).ravel())
    assert np.array_equal(np.sort(image[0].ravel()), want)


@pytest.mark.parametrize("over", ["all", "nonzero"])
def test_a_dicom_frame_with_tiny_modality_values_is_z_scored_by_its_own_std(tmp_path: Path, over: str) -> None:
    """The DICOM frame path uses the same z-score: a Rescale Slope of 1e-12 (modality values
    ~1e-9) gives z-scores of std 1 over the region, as the record's statistics reproduce."""
    stored = np.random.default_rng(4).integers(200, 3000, size=(24, 24)).astype(np.uint16)
    stored[:4] = 0
    ds = image_dataset(stored, modality="MR", RescaleSlope="1e-12", RescaleIntercept="0")
    samples = read_dicom(make_ref(save(ds, tmp_path / "adc.dcm")),
                         config(parse_window({"zscore": {"over": over}}, "t"), output="float16"))
    assert isinstance(samples, list), samples
    [sample] = samples
    [record] = sample.metadata["windows"]
    values = stored.astype(np.float64) * 1e-12
    region = values[values != 0] if over == "nonzero" else values.ravel()
    assert record["std"] == pytest.approx(region.std(), rel=1e-9) and record["std"] < 1e-8
    z = sample.image[0].astype(np.float64)[stored != 0] if over == "nonzero" else sample.image[0].astype(np.float64)
    assert z.std() == pytest.approx(1.0, abs=1e-3)
    assert np.array_equal(sample.image[0], from_record(values, record).astype(np.float16))


def test_a_nifti_std_whose_reciprocal_float32_cannot_hold_is_a_non_finite_bad_sample(tmp_path: Path) -> None:
    """Subnormal float32 voxels (~1e-40) have a std whose 1/std is beyond float32's range: the
    z-scores cannot be computed as the record says, so the case is refused, naming the std."""
    data = adc_map(1e-40)
    packed = pack_volume(tmp_path, data, {"windows": ["zscore"], "output": "float16", "sample": "volume"})
    assert packed.images == {}
    [bad] = packed.bad
    assert bad["reason"] == "non_finite", bad
    assert "standard deviation" in bad["message"] and "float32" in bad["message"], bad["message"]


def test_a_dicom_frame_whose_std_float32_cannot_invert_is_a_non_finite_bad_sample(tmp_path: Path) -> None:
    stored = np.random.default_rng(4).integers(200, 3000, size=(24, 24)).astype(np.uint16)
    ds = image_dataset(stored, modality="MR", RescaleSlope="1e-45", RescaleIntercept="0")
    issue = read_dicom(make_ref(save(ds, tmp_path / "tiny.dcm")),
                       config(parse_window({"zscore": {"over": "all"}}, "t"), output="float16"))
    assert isinstance(issue, Issue), issue
    assert issue.reason == "non_finite" and "standard deviation" in issue.message, issue


def test_a_constant_foreground_z_scores_to_zero_not_nan(tmp_path: Path) -> None:
    """A std of exactly 0 over the non-zero voxels (a binary map) has no scale: its voxels are
    0, as the README says of a constant region, never NaN from 0/0."""
    data = np.zeros((20, 18, 6), dtype=np.float32)
    data[4:16, 3:15, 1:5] = 7.5
    packed = pack_volume(tmp_path, data, {"windows": ["zscore"], "output": "float16", "sample": "volume"})
    assert packed.bad == []
    [image] = packed.images.values()
    assert np.array_equal(image, np.zeros_like(image)) and not np.signbit(image).any()


# ------------------------------------------------------------------ scl_slope / scl_inter, as nibabel reads them

#: (stored dtype, scl_slope, scl_inter): CT in 0.1 HU steps, a uint8 map, an int32 PET count (the
#: header holds float32: the values as written and read back)
SCALINGS = [(dtype, float(np.float32(slope)), float(np.float32(inter)))
            for dtype, slope, inter in [(np.int16, 0.1, -1024.3), (np.uint8, 0.37, 3.1), (np.int32, 1.3e-5, -12.9)]]


def stored_ramp(dtype: Any, shape: tuple[int, int, int] = (24, 24, 40)) -> np.ndarray:
    """Every stored value of ``dtype`` from its low end upwards (a ramp, wrapping past the top):
    a third of int16 CT scaled by 0.1 and -1024.3 rounds differently in two float32 steps."""
    info = np.iinfo(dtype)
    count = int(np.prod(shape))
    values = np.arange(count, dtype=np.int64) * max(1, (int(info.max) - int(info.min)) // count)
    return (values % (int(info.max) - int(info.min) + 1) + int(info.min)).astype(dtype).reshape(shape)


@pytest.mark.parametrize("gzipped", [True, False], ids=["nii.gz", "nii"])
@pytest.mark.parametrize(("dtype", "slope", "inter"), SCALINGS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_scaled_voxels_are_nibabel_s_get_fdata_float32(tmp_path: Path, gzipped: bool, dtype: Any, slope: float,
                                                      inter: float) -> None:
    """README "NIfTI volumes": the values are those of nibabel's get_fdata(dtype=np.float32), which
    scales in float64 and rounds once; under windows: [] they pack as float16 of that. Read both
    ways a file is read (a .nii.gz inflated a slice at a time, a .nii mapped)."""
    import nibabel as nib

    raw = stored_ramp(dtype)
    name = "v.nii.gz" if gzipped else "v.nii"
    (tmp_path / "raw").mkdir()
    path = write_nifti(tmp_path / "raw" / name, raw, AFFINE, slope=slope, inter=inter)
    reference = nib.load(path).get_fdata(dtype=np.float32)
    packed = build_nifti(tmp_path, [{"path": name, "entity": "p1"}],
                         {"windows": [], "output": "float16", "sample": "volume"})
    assert packed.bad == []
    [image] = packed.images.values()
    # the scaling is monotonic and the packed grid a permutation of the file's: compare sorted
    got = np.sort(image.ravel().astype(np.float64))
    assert np.array_equal(got, np.sort(reference.astype(np.float16).ravel().astype(np.float64)))


@pytest.mark.parametrize(("dtype", "slope", "inter"), SCALINGS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_normalised_scaled_volume_takes_its_statistics_from_nibabel_s_values(tmp_path: Path, dtype: Any,
                                                                              slope: float, inter: float) -> None:
    """The float32 values every window and normalisation starts from are nibabel's: the
    percentile channel's recorded ends are two of nibabel's float32 voxels."""
    import nibabel as nib

    raw = stored_ramp(dtype)
    (tmp_path / "raw").mkdir()
    path = write_nifti(tmp_path / "raw" / "v.nii.gz", raw, AFFINE, slope=slope, inter=inter)
    reference = nib.load(path).get_fdata(dtype=np.float32)
    packed = build_nifti(tmp_path, [{"path": "v.nii.gz", "entity": "p1"}],
                         {"windows": [{"percentiles": [0, 100]}], "output": "float16", "sample": "volume"})
    [record] = packed.records.values()
    [window] = record["metadata"]["windows"]
    assert (window["low"], window["high"]) == (float(reference.min()), float(reference.max()))


def test_scaling_a_volume_holds_no_float64_copy_of_it(tmp_path: Path) -> None:
    """The float64 scaling is done a slice at a time: reading a scaled int16 .nii.gz peaks at its
    float32 volume and a slab, within limits.max_decoded_bytes' stored + float32 estimate."""
    import tracemalloc

    import nibabel as nib

    from packer.config import LimitsConfig
    from packer.read.nifti import load_header, read_canonical

    raw = stored_ramp(np.int16, (256, 256, 64))
    _, slope, inter = SCALINGS[0]
    path = write_nifti(tmp_path / "big.nii.gz", raw, AFFINE, slope=slope, inter=inter)
    img, header = load_header(str(path), LimitsConfig(), channels_from=None)
    tracemalloc.start()
    try:
        volume = read_canonical(img, header)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert volume.array.dtype == np.float32 and peak < volume.array.nbytes + raw.nbytes, peak
    want = np.sort(nib.load(path).get_fdata(dtype=np.float32).ravel())
    assert np.array_equal(np.sort(volume.array.ravel()), want)
