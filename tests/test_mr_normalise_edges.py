"""MR normalisation at its edges: where the foreground meets the background, where a record meets
the bytes it describes, and where a blank sequence hides in a 4-D file.

Real files written by nibabel, packed by real builds, and compared with numpy's statistics of the
planted voxels and an independent trilinear interpolation (``tests/nifti_files.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from nifti_files import Packed, build_nifti, file_index, trilinear, write_nifti

from packer.config import parse_window
from packer.read.dicom import read_dicom
from tests.dicom_files import config, image_dataset, make_ref, save

#: RAS, 1 mm in-plane and 2 mm slices: resampled to 0.7 mm in-plane and 1.5 mm along D below.
AFFINE = np.diag([1.0, 1.0, 2.0, 1.0])
SPACING = [1.5, 0.7, 0.7]


def skull_stripped(seed: int = 0) -> np.ndarray:
    """A float32 'skull-stripped brain' (X×Y×Z): background exactly 0, tissue around 500."""
    data = np.zeros((24, 22, 8), dtype=np.float32)
    data[6:18, 5:17, 2:6] = np.random.default_rng(seed).normal(500, 50, size=(12, 12, 4)).astype(np.float32)
    return data


def build_one(folder: Path, data: np.ndarray, nifti: dict[str, Any]) -> tuple[Packed, Any]:
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    path = write_nifti(folder / "raw" / "mr.nii.gz", data, AFFINE)
    return build_nifti(folder, [{"path": "mr.nii.gz", "entity": "p1"}], nifti), nib.load(path)


def resampled_at_packed_voxels(img: Any, normalised: np.ndarray, record: dict[str, Any], shape: tuple[int, ...]
                               ) -> np.ndarray:
    """``normalised`` (the file's X×Y×Z grid) trilinearly interpolated at the centre of every packed
    voxel, placed by the sample's recorded affine (voxel (d, h, w) → LPS mm)."""
    affine = np.array(record["metadata"]["volume"]["affine"])
    index = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), axis=-1).astype(float)
    lps = index @ affine[:3, :3].T + affine[:3, 3]
    return trilinear(normalised, file_index(img, lps))


def test_a_resampled_volume_is_normalised_on_its_stored_voxels_then_resampled(tmp_path: Path) -> None:
    """nnU-Net's order, and a slice's: statistics and the foreground mask from the voxels as
    stored, the normalisation applied to them, then the resampling. The voxels between the
    background and the brain are blends of 0 and tissue z-scores (never a blend of 0 and tissue
    values z-scored as tissue: a rim of z far below both), and percentiles blends of [0, 1]."""
    data = skull_stripped()
    packed, img = build_one(tmp_path, data, {"windows": ["zscore", {"percentiles": [1, 99], "over": "nonzero"}],
                                             "output": "float16", "sample": {"volume": {"spacing": SPACING}}})
    [(key, image)] = packed.images.items()
    record = packed.records[key]
    assert image.shape[2:] == (31, 34) and image.shape[1] == 11  # resampled: 8×2/1.5, 22/0.7, 24/0.7

    tissue = data[data != 0].astype(np.float64)
    z = np.where(data != 0, (data - tissue.mean()) / tissue.std(), 0.0)
    low, high = np.percentile(tissue, [1, 99])
    scaled = np.clip((data - low) / (high - low), 0.0, 1.0)
    for channel, normalised in enumerate((z, scaled)):
        expected = resampled_at_packed_voxels(img, normalised, record, image.shape[1:])
        np.testing.assert_allclose(image[channel].astype(np.float64), expected, atol=4e-3, rtol=1e-3)
    zscores = image[0].astype(np.float64)
    assert zscores.min() >= min(z.min(), 0.0) - 4e-3 and zscores.max() <= z.max() + 4e-3
    assert (zscores < 0).sum() and (zscores == 0).sum()  # the background stays exactly 0


def test_a_volume_and_slices_at_the_same_spacing_hold_the_same_normalised_voxels(tmp_path: Path) -> None:
    """Packed as axial slices resampled to 0.7 mm, or as a volume at (2, 0.7, 0.7) mm (its slices
    kept), the same case has the same z-scores: one order for both samplings."""
    data = skull_stripped(seed=3)
    volume, _ = build_one(tmp_path / "volume", data, {"windows": ["zscore"], "output": "float16",
                                                      "sample": {"volume": {"spacing": [2.0, 0.7, 0.7]}}})
    slices, _ = build_one(tmp_path / "slices", data, {"windows": ["zscore"], "output": "float16",
                                                      "sample": "slice", "spacing": [0.7, 0.7]})
    [whole] = volume.images.values()
    stacked = np.stack([slices.images[key] for key in slices.of_entity("p1")], axis=1)
    assert stacked.shape == whole.shape
    np.testing.assert_array_equal(whole, stacked)


def test_fixed_windows_still_take_the_resampled_values(tmp_path: Path) -> None:
    """A fixed window maps physical values (HU) and keeps its order: the values resampled, then
    windowed (in float64 for uint16, so its levels are the window formula's at the interpolated
    value, never an interpolation of levels)."""
    data = skull_stripped(seed=5)
    window = {"center": 300, "width": 600, "function": "LINEAR_EXACT"}
    packed, img = build_one(tmp_path, data, {"windows": [window], "output": "uint16",
                                             "sample": {"volume": {"spacing": SPACING}}})
    [(key, image)] = packed.images.items()
    values = resampled_at_packed_voxels(img, data.astype(np.float64), packed.records[key], image.shape[1:])
    expected = np.rint(np.clip(values / 600.0, 0.0, 1.0) * 65535)
    assert np.abs(image[0].astype(np.int64) - expected).max() <= 1  # float32 interpolation of the values


# ----------------------------------------------------------------------- the record and the bytes


def canonical(data: np.ndarray) -> np.ndarray:
    """The file's X×Y×Z voxels in packer's D×H×W for :data:`AFFINE` (LPS: superior, posterior, left)."""
    return data.transpose(2, 1, 0)[:, ::-1, ::-1]


def from_record(x: np.ndarray, record: dict[str, Any], output: str) -> np.ndarray:
    """The packed channel, recomputed from the stored values and nothing but the record, as the
    README says: uint16 in float64 from low/high; uint8 and float16 in float32 from
    float32(low) and float32(1/(high - low)), or float32(mean) and float32(1/std)."""
    if output == "uint16":
        y = np.clip((x.astype(np.float64) - record["low"]) / (record["high"] - record["low"]), 0.0, 1.0)
        return np.rint(y * 65535).astype(np.uint16)
    f = x.astype(np.float32)
    if output == "uint8":
        y = (f - np.float32(record["low"])) * np.float32(1.0 / (record["high"] - record["low"]))
        return np.rint(np.clip(y, 0.0, 1.0) * np.float32(255.0)).astype(np.uint8)
    z = (f - np.float32(record["mean"])) * np.float32(1.0 / record["std"])
    return np.where(f == 0, np.float32(0.0), z).astype(np.float16)


@pytest.mark.parametrize(("window", "output"), [({"percentiles": [2.5, 97.5]}, "uint16"),
                                                ({"percentiles": [0.5, 99.5], "over": "nonzero"}, "uint16"),
                                                ({"percentiles": [2.5, 97.5]}, "uint8"),
                                                ("zscore", "float16")])
def test_a_channel_s_record_reproduces_its_packed_bytes(tmp_path: Path, window: Any, output: str) -> None:
    """``metadata.windows[i]`` holds the statistics the pixels were computed from, at full
    precision: mapping the stored values through the record gives every packed value back (a
    record rounded to float32 put one uint16 level in 500 one off)."""
    data = np.random.default_rng(7).normal(500, 100, size=(40, 36, 10)).astype(np.float32)
    data[:4] = 0  # a background, for over: nonzero
    packed, _ = build_one(tmp_path, data, {"windows": [window], "output": output, "sample": "volume"})
    [(key, image)] = packed.images.items()
    [record] = packed.records[key]["metadata"]["windows"]
    expected = from_record(canonical(data), record, output)
    assert image.dtype == np.dtype(output) and image[0].shape == expected.shape
    np.testing.assert_array_equal(image[0], expected)


def test_a_dicom_percentile_record_s_low_and_high_are_its_window_s(tmp_path: Path) -> None:
    """A DICOM frame's percentiles are the LINEAR_EXACT window from low to high: the record's
    ``low``/``high`` and ``center``/``width`` are one window, and its uint16 levels their formula."""
    pixels = np.random.default_rng(5).integers(0, 1200, size=(64, 64)).astype(np.uint16)
    path = save(image_dataset(pixels, modality="MR"), tmp_path / "mr.dcm")
    [sample] = read_dicom(make_ref(path), config(parse_window({"percentiles": [1, 99]}, "t"), output="uint16"))
    [record] = sample.metadata["windows"]
    low, high = record["low"], record["high"]
    assert record["center"] == (low + high) / 2 and record["width"] == high - low
    np.testing.assert_array_equal(sample.image[0], from_record(pixels, record, "uint16"))


# ------------------------------------------------------------------------- a blank sequence


def test_a_blank_volume_of_a_4d_file_packs_with_a_warning_naming_it(tmp_path: Path) -> None:
    """A 4-D file (``channels_from: last_axis``, the Decathlon's layout) whose one volume is all
    zeros (a sequence exported blank, or a dynamic series' frame before the injection) packs, as
    a fixed window or a time series needs, but its sample says which volume carries nothing:
    it was packed as a z-scored channel of zeros without a word."""
    t1 = skull_stripped()
    (tmp_path / "raw").mkdir(parents=True)
    write_nifti(tmp_path / "raw" / "mr.nii.gz", np.stack([t1, np.zeros_like(t1)], axis=-1), AFFINE)
    packed = build_nifti(tmp_path, [{"path": "mr.nii.gz", "entity": "p1"}],
                         {"windows": ["zscore"], "output": "float16", "sample": "volume", "channels_from": "last_axis"})
    [(key, image)] = packed.images.items()
    assert packed.bad == [] and image.shape[0] == 2
    warnings = packed.records[key]["metadata"]["warnings"]
    assert any("constant channel: volume 1 of 2 along the last axis" in w and "'image[1]'" in w
               and "every voxel 0" in w for w in warnings), warnings
