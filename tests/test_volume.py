"""Volumes from DICOM series: voxels where a pydicom + numpy reference puts them, in patient space.

The reference is built here, not by packer's volume code: the series' files read with pydicom,
sorted by Image Position projected on the slice normal, each slice as packer renders it in
``sample: slice`` mode, and a voxel's patient position from the DICOM definitions (PS3.3
C.7.6.2.1.1). A packed volume must agree voxel for voxel through its own affine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid

from packer.badsamples import read_bad_samples
from packer.buildwarnings import read_warnings
from packer.config import load_job
from packer.errors import ConfigError
from packer.loader import ShardDataset, make_loader
from packer.verify import verify_dataset
from tests.test_series import _oblique, _write_series
from tests.test_targets import _build, _job

WINDOW = {"windows": [{"center": 1000, "width": 3000}]}
SAGITTAL = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)   # rows run +y (anterior→posterior), columns run -z


def _volume_job(tmp: Path, raw: Path, volume: Any = "volume", **extra: Any) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                transform={"dicom": {**WINDOW, "sample": volume}}, validate={"max_bad_fraction": 0.9}, **extra)


def _reference(tmp: Path, raw: Path, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """The series as the reference sees it: slices (packer's own slice rendering) stacked in
    order of position along the normal, C×D×H×W, and a 4×4 (d, h, w) → LPS mm map."""
    built = _build(_job(tmp / "ref", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                        transform={"dicom": WINDOW}))
    images = {item["key"]: item["image"].numpy() for item in ShardDataset(built.manifest_path, "train",
                                                                         shuffle=False)}
    headers = [pydicom.dcmread(p) for p in paths]
    iop = np.array(headers[0].ImageOrientationPatient, dtype=float)
    row, col = iop[:3], iop[3:]
    normal = np.cross(row, col)
    ordered = sorted(zip(headers, paths, strict=True), key=lambda hp: float(np.dot(normal, hp[0].ImagePositionPatient)))
    from packer.phi import pseudonymizer_for
    from packer.pipeline.discover import make_sample_id

    phi = pseudonymizer_for(load_job(tmp / "ref" / "job" / "job.yaml").phi)
    stack = np.stack([images[make_sample_id("raw", p.relative_to(raw).as_posix(), phi)] for _, p in ordered], axis=1)
    first = np.array(ordered[0][0].ImagePositionPatient, dtype=float)
    last = np.array(ordered[-1][0].ImagePositionPatient, dtype=float)
    spacing = [float(v) for v in ordered[0][0].PixelSpacing]
    affine = np.eye(4)
    affine[:3, 0] = (last - first) / (len(ordered) - 1)
    affine[:3, 1] = col * spacing[0]
    affine[:3, 2] = row * spacing[1]
    affine[:3, 3] = first
    return stack, affine


def _packed(result: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    (item,) = list(ShardDataset(result.manifest_path, "train", shuffle=False, records=True))
    import webdataset as wds

    urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
    (record,) = [s["json"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()]
    assert item["record"] == record  # records=True hands over the record a stock reader sees: the affine with it
    return item["image"].numpy(), np.array(record["metadata"]["volume"]["affine"]), record["metadata"]["volume"]


def _assert_same_voxels(volume: np.ndarray, affine: np.ndarray, reference: np.ndarray, ref_affine: np.ndarray) -> None:
    """Every voxel of ``volume`` holds the reference voxel at the same patient position."""
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in volume.shape[1:]), indexing="ij"), axis=-1).reshape(-1, 3)
    world = grid @ affine[:3, :3].T + affine[:3, 3]
    back = np.linalg.solve(ref_affine[:3, :3], (world - ref_affine[:3, 3]).T).T
    index = np.rint(back).astype(int)
    assert np.abs(back - index).max() < 1e-3  # no resampling: the grids coincide
    assert ((index >= 0) & (index < np.array(reference.shape[1:]))).all()
    expected = reference[:, index[:, 0], index[:, 1], index[:, 2]].reshape(volume.shape)
    assert np.array_equal(volume, expected)


@pytest.mark.parametrize("orientation,canonical_diagonal", [
    ((1.0, 0.0, 0.0, 0.0, 1.0, 0.0), True),   # axial: nothing moves
    (SAGITTAL, True),                         # permuted and flipped onto z, y, x
    (_oblique(25.0), False),                  # oblique: reordered, still oblique
])
def test_a_volume_holds_the_reference_voxels_at_their_patient_positions(tmp_path: Path, orientation: Any,
                                                                       canonical_diagonal: bool) -> None:
    raw = tmp_path / "raw"
    paths = _write_series(raw / "s", seed=3, slices=7, orientation=orientation)
    result = _build(_volume_job(tmp_path, raw))
    volume, affine, info = _packed(result)
    reference, ref_affine = _reference(tmp_path, raw, paths)
    assert volume.shape[0] == 1 and sorted(volume.shape[1:]) == sorted(reference.shape[1:])
    _assert_same_voxels(volume, affine, reference, ref_affine)
    directions = affine[:3, :3]
    assert directions[2, 0] > 0 and directions[1, 1] > 0 and directions[0, 2] > 0  # D→+z, H→+y, W→+x (LPS)
    if canonical_diagonal:  # only those three entries: each axis along one patient axis
        others = directions.copy()
        others[2, 0] = others[1, 1] = others[0, 2] = 0.0
        assert np.allclose(others, 0.0, atol=1e-6)
    assert sorted(info["spacing"]) == pytest.approx(sorted([3.0, 0.5, 0.5]), abs=1e-3)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["sample_schema"]["layout"] == "CDHW" and len(manifest["sample_schema"]["shape"]) == 4
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_resampling_is_linear_along_each_axis_and_keeps_patient_space(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    paths = _write_series(raw / "s", seed=4, slices=7)  # slice i holds 100·i HU (+ one bright row)
    result = _build(_volume_job(tmp_path, raw, {"volume": {"spacing": [1.5, 1.0, 1.0]}}))
    volume, affine, info = _packed(result)
    reference, ref_affine = _reference(tmp_path, raw, paths)
    assert info["spacing"] == pytest.approx([1.5, 1.0, 1.0], rel=0.1)
    assert volume.shape[1:] == (14, 8, 8)  # 7 × 3 mm / 1.5, 16 × 0.5 / 1.0
    # along D, at a column away from the bright rows: the voxel is the reference interpolated at its z
    z_ref = ref_affine[2, 3] + ref_affine[2, 0] * np.arange(reference.shape[1])
    profile_ref = reference[0, :, 12, 2].astype(float)   # reference row 12 is bright only in slice 12: none here
    for d in range(1, volume.shape[1] - 1):
        z = affine[2, 3] + affine[2, 0] * d
        expected = np.interp(z, z_ref, profile_ref)
        assert abs(float(volume[0, d, 6, 1]) - expected) <= 1.01, d


@pytest.mark.parametrize("output", ["uint16", "float16"])
def test_a_resampled_volume_keeps_its_output_precision(tmp_path: Path, output: str) -> None:
    """uint16 and float16 slices stay uint16 and float16 through the 3-D resample (it once clipped
    every volume to 0-255 and uint8, whatever the job's output)."""
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=4, slices=7)  # slice i holds 100·i HU (+ one bright row)
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {**WINDOW, "output": output, "sample": {"volume": {"spacing": [1.5, 1.0, 1.0]}}}},
               validate={"max_bad_fraction": 0.9})
    volume, _, _ = _packed(_build(job))
    assert volume.dtype == np.dtype(output)
    values = volume.astype(np.float64)
    assert values.max() > 255  # uint16: window levels up to 65535; float16: modality values (HU) up to 600+
    assert len(np.unique(values)) > 5  # interpolated levels, not 0 and 255


def test_crop_and_pad_keep_each_voxel_at_its_patient_position(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    paths = _write_series(raw / "s", seed=5, slices=7)
    result = _build(_volume_job(tmp_path, raw, {"volume": {"size": [4, 20, 10]}}))
    volume, affine, _ = _packed(result)
    reference, ref_affine = _reference(tmp_path, raw, paths)
    assert volume.shape[1:] == (4, 20, 10)
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in volume.shape[1:]), indexing="ij"), axis=-1).reshape(-1, 3)
    world = grid @ affine[:3, :3].T + affine[:3, 3]
    back = np.rint(np.linalg.solve(ref_affine[:3, :3], (world - ref_affine[:3, 3]).T).T).astype(int)
    inside = ((back >= 0) & (back < np.array(reference.shape[1:]))).all(axis=1)
    flat = volume.reshape(1, -1)
    assert np.array_equal(flat[0, inside], reference[0, back[inside, 0], back[inside, 1], back[inside, 2]])
    assert (flat[0, ~inside] == 0).all() and (~inside).any() and inside.any()   # padded H, cropped D and W


def test_a_volume_over_max_voxels_is_refused_before_decoding(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=6, slices=7)
    _write_series(raw / "t", seed=7, slices=3, patient="P2")
    result = _build(_volume_job(tmp_path, raw, limits={"max_voxels": 16 * 16 * 5}))
    reasons = {Path(r["path"]).parent.name: r["reason"] for r in read_bad_samples(result.version_dir /
                                                                                 "bad_samples.jsonl")}
    assert reasons == {"s": "too_large"}
    assert json.loads(result.manifest_path.read_text())["inputs"]["samples"] == 1



@pytest.mark.parametrize(("spacing", "limit", "over", "advice", "not_advised"), [
    ([6.0, 2.0, 2.0], 1000, "stacks to 7×16×16 = 1792 voxels, over limits.max_voxels (1000)",
     "raise the limit", "coarser spacing"),
    ([1.5, 0.25, 0.25], 5000, "resampled to transform.dicom.sample.volume.spacing it is 14×32×32 = 14336, over it",
     "resample to a coarser spacing", None),
], ids=["stacked-over", "resampled-over"])
def test_a_too_large_volume_says_which_size_is_over_and_only_advice_that_can_fix_it(
        tmp_path: Path, spacing: list[float], limit: int, over: str, advice: str, not_advised: str | None) -> None:
    """limits.max_voxels holds a series as stacked and after resampling: where the stacked size is
    over, a coarser spacing cannot bring it under (the record advised one, even with the job
    already resampling far under the limit); where only the resampled size is over, it can."""
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=6, slices=7)  # 7 slices of 16×16, 3 mm apart at 0.5 mm
    result = _build(_volume_job(tmp_path, raw, {"volume": {"spacing": spacing}}, limits={"max_voxels": limit}))
    records = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert len(records) == 7 and {r["reason"] for r in records} == {"too_large"}
    message = records[0]["message"]
    assert over in message and advice in message
    assert not_advised is None or not_advised not in message

def test_a_series_without_pixel_spacing_is_no_volume(tmp_path: Path) -> None:
    """A volume's affine and spacing are in mm: a series whose slices give no Pixel Spacing has no
    in-plane mm to put there (packing it at an assumed 1 mm would record invented geometry and
    resample by it). Neighbour stacks, ordered by position alone, still pack it."""
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=6, slices=5, overrides={i: {"PixelSpacing": None} for i in range(5)})
    _write_series(raw / "t", seed=7, slices=5, patient="P2")
    result = _build(_volume_job(tmp_path, raw, volume={"volume": {"spacing": [2, 2, 2]}}))
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert {(Path(r["path"]).parent.name, r["reason"]) for r in bad} == {("s", "series_geometry")} and len(bad) == 5
    assert all("no (0028,0030) Pixel Spacing" in r["message"] for r in bad)
    assert json.loads(result.manifest_path.read_text())["inputs"]["samples"] == 1
    stacks = _build(_job(tmp_path / "stacks", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                         transform={"dicom": {**WINDOW, "size": [16, 16], "sample": {"neighbors": 1}}}))
    assert json.loads(stacks.manifest_path.read_text())["inputs"]["samples"] == 10


def test_volumes_batch_and_refuse_2d_size_settings(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    for n in range(3):
        _write_series(raw / f"s{n}", seed=10 + n, patient=f"P{n}", slices=5)
    result = _build(_volume_job(tmp_path, raw, {"volume": {"spacing": [3, 1, 1], "size": [6, 8, 8]}}))
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=3)))
    assert batch["image"].shape == (3, 1, 6, 8, 8)
    with pytest.raises(ConfigError, match="a volume's size and spacing are 3-D"):
        load_job(_job(tmp_path / "bad", [{"kind": "dicom", "root": str(raw), "label": "none"}],
                      transform={"dicom": {**WINDOW, "sample": "volume", "size": [32, 32]}}))
    # a job of images only would have packed 2-D images, silently
    with pytest.raises(ConfigError, match="sample: volume makes a volume of DICOM series, but this job has no DICOM "
                                          "source"):
        load_job(_job(tmp_path / "photos", [{"kind": "image", "root": str(raw), "label": "folder"}],
                      transform={"dicom": {"sample": "volume"}}))


def test_the_demo_volume_workflow_packs_one_canonical_volume_per_good_series(demo_raw: Any, tmp_path: Path) -> None:
    import shutil

    from packer.demo import SERIES
    from tests.demo_version import REPO

    (tmp_path / "workflows").mkdir()
    shutil.copy(REPO / "workflows" / "series-volume.yaml", tmp_path / "workflows")
    (tmp_path / "demo-raw").symlink_to(demo_raw.root)
    result = _build(tmp_path / "workflows" / "series-volume.yaml")
    manifest = json.loads(result.manifest_path.read_text())
    good = sum(1 for _, reason in SERIES.values() if reason in (None, "not_requested"))
    assert manifest["inputs"]["samples"] == good
    assert manifest["sample_schema"] == {"dtype": "uint8", "layout": "CDHW", "shape": [3, 16, 48, 48],
                                         "shapes": {"series": [[3, 16, 48, 48]]}}
    assert verify_dataset(result.manifest_path, deep=True).ok
    # the whole body is in every volume: nothing but air or padding along the in-plane edges
    for split in ("train", "valid", "test"):
        for batch in ShardDataset(result.manifest_path, split, shuffle=False):
            volume = batch["image"].numpy()
            edges = np.concatenate([volume[:, :, [0, -1], :].ravel(), volume[:, :, :, [0, -1]].ravel()])
            assert edges.max() == 0, batch["key"]


def test_a_volume_agrees_with_simpleitks_series_reader(tmp_path: Path) -> None:
    """ITK reads the same series (GDCM orders it by position): same origin, spacing and
    direction, and its Hounsfield units through the job's window are packer's voxels."""
    sitk = pytest.importorskip("SimpleITK")
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=8, slices=7)
    result = _build(_volume_job(tmp_path, raw))
    volume, affine, info = _packed(result)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(raw / "s")))
    image = reader.Execute()
    hu = sitk.GetArrayFromImage(image).astype(np.float64)          # D×H×W (ITK's z, y, x)
    assert np.allclose(affine[:3, 3], image.GetOrigin(), atol=1e-3)
    assert info["spacing"] == pytest.approx(list(reversed(image.GetSpacing())), abs=1e-3)
    direction = np.array(image.GetDirection()).reshape(3, 3)       # columns: ITK's x, y, z axes
    assert np.allclose(affine[:3, :3] / np.array(info["spacing"]), direction[:, ::-1], atol=1e-6)
    centre, width = 1000.0, 3000.0                                 # PS3.3 C.11.2.1.2.1, LINEAR
    unit = np.clip((hu - (centre - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)
    assert np.abs(volume[0].astype(int) - np.rint(unit * 255)).max() <= 1


def _numpy_linear(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """The straightforward centre-aligned linear resampling along one axis (the definition)."""
    n = array.shape[axis]
    x = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    low = np.floor(x).astype(int)
    high = np.minimum(low + 1, n - 1)
    shape = [1] * array.ndim
    shape[axis] = size
    w = (x - low).reshape(shape)
    return np.take(array, low, axis=axis) * (1 - w) + np.take(array, high, axis=axis) * w


@given(st.tuples(st.integers(2, 9), st.integers(2, 17), st.integers(2, 17)),
       st.tuples(*[st.floats(0.3, 3.0)] * 3), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_fast_resampling_is_the_separable_linear_definition(shape: tuple[int, int, int],
                                                            spacing: tuple[float, float, float], seed: int) -> None:
    from packer.transform.volume import Volume, resample_linear

    array = np.random.default_rng(seed).uniform(0, 255, size=(2, *shape)).astype(np.float32)
    volume = Volume(array, np.diag([1.0, 1.0, 1.0, 1.0]))
    fast = resample_linear(volume, spacing)
    slow = array.astype(np.float64)
    for axis in range(3):
        slow = _numpy_linear(slow, 1 + axis, fast.array.shape[1 + axis])
    assert fast.array.shape == slow.shape
    assert np.abs(fast.array - slow).max() < 1e-3


@given(st.integers(1, 3), st.integers(3, 12), st.integers(2, 40), st.integers(2, 40), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_resampling_slice_by_slice_gives_the_bytes_of_the_whole_volume_two_step(
        channels: int, depth: int, height: int, width: int, seed: int) -> None:
    """D shrinking while H, W change: resample_linear makes each D slice and resizes it at once;
    its bytes are those of resampling the whole volume along D, then every slice in-plane."""
    from packer.transform.volume import Volume, _resample_depth, _resample_plane, resample_linear

    rng = np.random.default_rng(seed)
    array = rng.uniform(-1024, 3071, size=(channels, depth, height, width)).astype(np.float32)
    spacing = (float(rng.uniform(1.05, 2.5)), float(rng.uniform(0.3, 3.0)), float(rng.uniform(0.3, 3.0)))
    fast = resample_linear(Volume(array, np.eye(4)), spacing).array
    d, h, w = fast.shape[1:]
    if d == depth or (h, w) == (height, width):
        return  # the one-pass path is for D shrinking with H, W changing
    whole = _resample_plane(_resample_depth(array, d), h, w)
    assert fast.dtype == whole.dtype and fast.shape == whole.shape
    assert fast.tobytes() == whole.tobytes()


def test_an_enhanced_multi_frame_ct_becomes_one_volume_ordered_by_its_frame_positions(tmp_path: Path) -> None:
    from tests.test_series import write_enhanced_ct

    board = (np.indices((8, 8)).sum(axis=0) % 2).astype(np.int16)  # 0 at (4, 4); a constant-only series is refused
    frames = np.stack([np.full((8, 8), 600 + 300 * i, dtype=np.int16) + board for i in range(4)])  # -424 + 300·i HU
    write_enhanced_ct(tmp_path / "raw" / "enhanced.dcm", frames, [4.0, 0.0, 6.0, 2.0])  # not the frame order
    result = _build(_volume_job(tmp_path, tmp_path / "raw"))
    volume, affine, info = _packed(result)
    assert volume.shape == (1, 4, 8, 8) and info["spacing"] == pytest.approx([2.0, 0.5, 0.5])
    # along +z the frames come 1, 3, 0, 2; each through the window (PS3.3 LINEAR, c 1000, w 3000)
    hu = [-424.0 + 300 * frame for frame in (1, 3, 0, 2)]
    expected = [round(255 * min(1.0, max(0.0, (v - 999.5) / 2999 + 0.5))) for v in hu]
    assert [int(volume[0, d, 4, 4]) for d in range(4)] == expected
    assert affine[2, 3] == pytest.approx(0.0) and affine[2, 0] == pytest.approx(2.0)


def test_a_volume_whose_frames_carry_their_own_windows_records_each_slices(tmp_path: Path) -> None:
    """windows: [file] over an enhanced CT whose frames carry their own Window Center/Width:
    each slice is windowed by its frame's, but the volume's record named frame 0's window only,
    so a reader could not tell how the other slices' grey levels map back to HU. Now every
    slice's window is recorded, in the volume's order; a series read through one window keeps
    the single record (nothing added)."""
    import pydicom
    from pydicom.sequence import Sequence as DicomSequence

    from tests.test_series import write_enhanced_ct

    board = (np.indices((8, 8)).sum(axis=0) % 2).astype(np.int16)
    frames = np.stack([np.full((8, 8), 1000 + 100 * i, dtype=np.int16) + board for i in range(3)])
    path = write_enhanced_ct(tmp_path / "raw" / "enhanced.dcm", frames, [4.0, 0.0, 2.0])
    ds = pydicom.dcmread(path)
    for group, (center, width) in zip(ds.PerFrameFunctionalGroupsSequence, [(40, 80), (-600, 1500), (300, 600)],
                                      strict=True):
        voi = pydicom.Dataset()
        voi.WindowCenter, voi.WindowWidth = center, width
        group.FrameVOILUTSequence = DicomSequence([voi])
    ds.save_as(path)
    job = _job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
               transform={"dicom": {"windows": ["file"], "sample": "volume"}}, validate={"max_bad_fraction": 0.9})
    _, _, info = _packed(_build(job))
    # along +z the frames come 1, 2, 0
    assert [(w[0]["center"], w[0]["width"]) for w in info["slice_windows"]] == [(-600, 1500), (300, 600), (40, 80)]
    raw = tmp_path / "one"
    _write_series(raw / "s", seed=9, slices=4)
    _, _, info = _packed(_build(_volume_job(tmp_path / "o", raw)))
    assert "slice_windows" not in info


def test_a_series_whose_slices_carry_different_labels_is_no_volume_of_one_of_them(tmp_path: Path) -> None:
    """A table labelled one series' slices a, b, b, b: the volume packed as a (its first slice's
    label), three rows overridden without a word. Each file of that series is now a bad_target
    naming the labels; a series labelled alike packs."""
    raw = tmp_path / "raw"
    mixed = _write_series(raw / "mixed", seed=3, patient="P1", slices=4)
    alike = _write_series(raw / "alike", seed=4, patient="P2", slices=4)
    rows = ["path,label", *(f"{p.relative_to(raw).as_posix()},{'a' if i == 0 else 'b'}" for i, p in enumerate(mixed)),
            *(f"{p.relative_to(raw).as_posix()},b" for p in alike)]
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv")}],
               transform={"dicom": {**WINDOW, "sample": "volume"}}, validate={"max_bad_fraction": 0.9})
    result = _build(job)
    bad = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert sorted(Path(b["path"]).name for b in bad) == sorted(p.name for p in mixed)
    assert {b["reason"] for b in bad} == {"bad_target"} and "carry different labels ('a', 'b')" in bad[0]["message"]
    assert len(list(ShardDataset(result.manifest_path, "train", shuffle=False))) == 1


def test_the_report_shows_a_volumes_three_middle_planes(tmp_path: Path) -> None:
    from packer.config import load_job as load
    from packer.pipeline.build import BuildOptions, build

    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=9, slices=5)
    result = build(load(_volume_job(tmp_path, raw, {"volume": {"size": [5, 16, 12]}})),
                   BuildOptions(scheduler="sync", quiet=True))
    html = (result.version_dir / "report.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in html
    # each pane is three planes side by side: the lead says which, and which way up
    assert "axial, coronal and sagittal middle planes side by side" in html and "superior up" in html
    from packer.htmlreport.thumbs import as_chw

    planes = as_chw(np.arange(5 * 16 * 12, dtype=np.uint8).reshape(1, 5, 16, 12))
    assert planes.shape == (1, 16, 36)  # axial, coronal and sagittal middles side by side, each 16×12


@settings(max_examples=400, deadline=None)
@given(quaternion=st.tuples(*[st.floats(-1, 1, allow_nan=False)] * 4).filter(lambda q: sum(v * v for v in q) > 0.01),
       zooms=st.tuples(*[st.floats(0.2, 6.0)] * 3))
def test_the_canonical_axes_are_nibabels_for_any_rotation(quaternion: tuple[float, ...],
                                                          zooms: tuple[float, ...]) -> None:
    """The README: volumes are laid out as nibabel's as_closest_canonical lays them out. The
    order assigned superior first, then posterior, then left, and differed from nibabel's
    io_orientation for one rotation in fifteen, each with an axis about 45° from every patient
    axis (an axis left 69° off left-right where nibabel keeps all within 50°)."""
    import nibabel as nib

    from packer.transform.volume import canonical_order

    w, x, y, z = np.asarray(quaternion) / np.linalg.norm(quaternion)
    rotation = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                         [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                         [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
    magnitudes = np.sort(np.abs(rotation).ravel())
    assume(bool(np.diff(magnitudes).min() > 1e-6))  # an exact tie (a 45° or symmetric rotation): either is right
    nifti = np.eye(4)  # file axes i, j, k in RAS
    nifti[:3, :3] = rotation * np.asarray(zooms)
    ornt = nib.orientations.io_orientation(nifti)  # file axis -> RAS axis
    volume = np.eye(4)  # packer's: array axes D, H, W = k, j, i, in LPS
    volume[:3, :3] = (np.diag([-1.0, -1.0, 1.0]) @ nifti[:3, :3])[:, [2, 1, 0]]
    expected = {int(ornt[i, 0]): 2 - i for i in range(3)}  # patient axis -> array axis
    assert canonical_order(volume) == (expected[2], expected[1], expected[0])


def test_the_canonical_axes_follow_direction_not_voxel_size() -> None:
    """Axis 1 runs 40° off superior with 0.5 mm voxels, axis 2 50° off it with 5 mm ones: the
    axis order weighed direction by voxel size and took axis 2 for D, where nibabel's
    io_orientation (the README's anchor) takes axis 1."""
    import nibabel as nib

    from packer.transform.volume import canonical_order

    a, b = np.radians(40.0), np.radians(50.0)
    affine = np.eye(4)
    affine[:3, 0] = [1.0, 0.0, 0.0]  # x: 1 mm
    affine[:3, 1] = 0.5 * np.array([0.0, np.sin(a), np.cos(a)])  # 40° off z
    affine[:3, 2] = 5.0 * np.array([0.0, -np.sin(b), np.cos(b)])  # 50° off z
    assert canonical_order(affine)[0] == 1
    # nibabel: input axis -> output axis; packer: output axis (z, y, x) -> input axis
    ornt = nib.orientations.io_orientation(affine)
    assert {int(ornt[i, 0]): i for i in range(3)}[2] == canonical_order(affine)[0]


@pytest.mark.parametrize(("windows", "monochrome1", "black"), [
    ([{"center": 1000, "width": 3000}], False, lambda v: -1024.0),           # float16 keeps HU: air, not 0 (water)
    ([{"center": 1000, "width": 3000}], True, lambda v: 3000 - 1024.0),  # MONOCHROME1: its largest (the bright row)
    ([{"zscore": {"over": "all"}}], False, lambda v: float(v.min())),        # the lowest z-score: 0 is the mean
    ([{"zscore": {"over": "nonzero"}}, {"center": 1000, "width": 3000}], False, lambda v: 0.0),  # background, black
])
def test_a_float16_volume_is_padded_with_its_black_never_a_value_that_reads_as_tissue(
        tmp_path: Path, windows: list[Any], monochrome1: bool, black: Any) -> None:
    """The padding of a volume follows the 2-D rule (README, Transforms step 5): float16 modality
    values pad with the volume's smallest value (its largest for MONOCHROME1), a z-score over all
    voxels with its lowest z-score; a window or a z-score over non-zero voxels with 0. It was 0
    whatever the channel: 0 HU, water, beside −1024 HU air."""
    raw = tmp_path / "raw"
    overrides = {i: {"PhotometricInterpretation": "MONOCHROME1"} for i in range(4)} if monochrome1 else None
    _write_series(raw / "s", seed=5, slices=4, overrides=overrides)  # slice i: 100·i − 1024 HU, one row 1976 HU
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {"windows": windows, "output": "float16",
                                    "sample": {"volume": {"size": [8, 20, 20]}}}}, validate={"max_bad_fraction": 0.9})
    volume, _, _ = _packed(_build(job))
    assert volume.shape[1:] == (8, 20, 20)
    body = volume[:, 2:6, 2:18, 2:18].astype(np.float64)
    pad = np.ones(volume.shape[1:], dtype=bool)
    pad[2:6, 2:18, 2:18] = False
    for c in range(volume.shape[0]):
        expected = black(body[c]) if c == 0 else 0.0
        assert np.unique(volume[c][pad]).tolist() == [pytest.approx(expected, abs=1e-3)], c
    if not monochrome1 and "center" in windows[0]:
        assert body.min() == -1024.0 and not (volume[0][pad] == 0).any()


IRREGULAR = [0.0, 2.0, 4.0, 6.0, 9.0, 12.0, 15.0]   # steps 2, 2, 2, 3, 3, 3: median 2.5, within gap_tolerance 0.25


def _irregular_job(tmp: Path, raw: Path, volume: Any) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none"}],
                transform={"dicom": {**WINDOW, "output": "float16", "sample": volume,
                                     "series": {"gap_tolerance": 0.25}}}, validate={"max_bad_fraction": 0.9})


@pytest.mark.parametrize("volume", ["volume", {"volume": {"spacing": [1.0, 0.5, 0.5]}}])
def test_slices_off_the_uniform_grid_are_resampled_onto_it_from_their_true_positions(tmp_path: Path,
                                                                                     volume: Any) -> None:
    """A series irregular within ``gap_tolerance`` was stacked by index on the uniform grid between
    its first and last slice, so its affine put the slice at z = 9 mm at 10 mm (1.5 mm off, no
    warning). Each voxel along D now holds the true slices interpolated at the z its affine gives
    it (with ``spacing``, straight from the true slices: one interpolation), and the record and the
    build's warnings say so."""
    raw = tmp_path / "raw"
    _write_series(raw / "s", seed=8, positions=IRREGULAR)   # slice i: 100·i − 1024 HU, its row i bright
    result = _build(_irregular_job(tmp_path, raw, volume))
    packed, affine, _ = _packed(result)
    (record,) = [r for r in _records_of(result)]
    z = affine[2, 3] + affine[2, 0] * np.arange(packed.shape[1])
    expected = np.interp(z, np.array(IRREGULAR) + 0.0, [100.0 * i - 1024 for i in range(len(IRREGULAR))])
    column = packed[0, :, -1, 0].astype(np.float64)   # the last row: bright in no slice
    assert np.abs(column - expected).max() <= 0.5, (column, expected)   # float16 steps are 0.5 at 1000 HU
    # the grid between the first and last slice (2.5 mm), or spacing's over the same extent: 18 × 7/18 steps
    assert z[0] == pytest.approx(0.0 if volume == "volume" else (7 / 18 - 1) / 2 * 2.5, abs=1e-6)
    (warning,) = [w for w in record["metadata"]["warnings"] if w.startswith("irregular slice positions")]
    assert "up to 1.500 mm from the uniform grid" in warning and "linear interpolation" in warning
    warned = [w.message for w in read_warnings(result.version_dir / "warnings.jsonl")]
    assert any("1 file(s) packed with a reader's warning" in w and "irregular slice positions" in w for w in warned)


def _records_of(result: Any) -> list[dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in result.version_dir.glob("train-*.tar"))
    return [s["json"] for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()]


def test_a_regular_series_is_stacked_as_read_and_a_mask_follows_the_nearest_true_slice() -> None:
    """Positions within 1% of a step of the grid (DS rounding) are no irregularity: no resampling,
    the bytes as before. Further off, the label map along D takes the nearest true slice, on the
    grid the image is interpolated on, so it stays aligned with the image."""
    from packer.config import DicomTransformConfig
    from packer.read.dicom_masks import volume_mask
    from packer.read.series import Series, off_grid
    from packer.transform.volume import build_volume

    def series(zs: list[float]) -> Series:
        return Series(uid_key="k", refs=(), slices=tuple((i, 0) for i in range(len(zs))),
                      steps=tuple(float(s) for s in np.diff(zs)), pixel_spacing=(1.0, 1.0), rows=2, columns=2,
                      step=(0.0, 0.0, (zs[-1] - zs[0]) / (len(zs) - 1)))

    assert off_grid(series([0.0, 2.5, 5.01, 7.5])) is None   # 0.01 mm: 0.4% of the step
    positions, offset = off_grid(series(IRREGULAR)) or (None, 0.0)
    assert offset == pytest.approx(1.5) and positions is not None
    labels = np.broadcast_to(np.arange(1, 8, dtype=np.uint8)[:, None, None], (7, 2, 2)).copy()
    affine = series(IRREGULAR).affine()
    mask = volume_mask(labels, affine, DicomTransformConfig(windows=()), 0, positions)
    # the grid's z 0, 2.5, 5, 7.5, 10, 12.5, 15 mm: nearest true slices at 0, 2, 6 (5: a tie, the upper),
    # 9 (7.5: a tie), 9, 12 and 15 mm
    assert mask[:, 0, 0].tolist() == [1, 2, 4, 5, 5, 6, 7]
    image = build_volume(labels[None].astype(np.float16), affine, spacing=None, size=None, positions=positions)
    assert image.array[0, :, 0, 0].astype(float).tolist() == pytest.approx([1, 2.25, 3.5, 4.5, 5 + 1 / 3, 6 + 1 / 6, 7],
                                                                          abs=5e-3)
    assert np.array_equal(build_volume(labels[None], affine, spacing=None, size=None).array[0, :, 0, 0],
                          np.arange(1, 8))   # without positions: by index, as a regular series is


def _slope_series(folder: Path, positions: list[float]) -> np.ndarray:
    """A CT series of random 16×16 slices at ``positions`` (mm along z), each slice its own Rescale
    Slope (as a PET series' are); returns the modality values, D×H×W float64, in position order."""
    from tests.dicom_files import ct_dataset, save

    rng = np.random.default_rng(11)
    values = []
    for i, z in enumerate(positions):
        stored = rng.integers(0, 3000, size=(16, 16)).astype(np.int16)
        slope = float(f"{0.4 + 0.13 * i + rng.random():.6g}")
        ds = ct_dataset(stored, slope=slope, center=None, width=None, InstanceNumber=i + 1,
                        StudyInstanceUID="1.2.826.0.1.77.0", SeriesInstanceUID="1.2.826.0.1.77",
                        ImageOrientationPatient=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                        ImagePositionPatient=[-4.0, -4.0, float(z)], ImageType=["ORIGINAL", "PRIMARY", "AXIAL"])
        save(ds, folder / f"s{i:02d}.dcm")
        values.append(stored.astype(np.float64) * slope - 1024.0)
    return np.stack(values)


def _along_d(values: np.ndarray, positions: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``values`` (D×H×W) linearly interpolated along D from ``positions`` at ``targets`` (float64)."""
    low = np.clip(np.searchsorted(positions, targets, side="right") - 1, 0, len(positions) - 2)
    t = np.clip((targets - positions[low]) / (positions[low + 1] - positions[low]), 0.0, 1.0)[:, None, None]
    return (1 - t) * values[low] + t * values[low + 1]


@pytest.mark.parametrize("case,output", [("spacing", "uint8"), ("irregular", "uint16"), ("spacing", "float16")])
def test_a_resampled_volume_interpolates_the_unrounded_values_and_rounds_once(tmp_path: Path, case: str,
                                                                               output: str) -> None:
    """README (Volumes, step 3): a volume is resampled by linear interpolation of the windowed
    values, as a resampled frame is (in float32, rounded once). Its slices were quantised to the
    output's levels first and the resampled levels rounded again: one voxel in six of a uint8
    volume came out a level off ``round(255 · interp(window(values)))``, and float16 voxels up to
    an ulp off. Along z only here (spacing 2 mm from 3 mm; or the irregular slices put on their
    uniform grid), each voxel is checked against that formula in float64."""
    raw = tmp_path / "raw"
    positions = [3.0 * i for i in range(8)] if case == "spacing" else IRREGULAR
    values = _slope_series(raw / "s", positions)
    n = len(positions)
    if case == "spacing":
        size = round(n * 3.0 / 2.0)
        grid, targets = np.arange(n, dtype=np.float64), np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
        sample: Any = {"volume": {"spacing": [2.0, 0.5, 0.5]}}
    else:
        step = (positions[-1] - positions[0]) / (n - 1)
        grid, targets, sample = np.array(positions) / step, np.arange(n, dtype=np.float64), "volume"
    job = _job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}],
               transform={"dicom": {**WINDOW, "output": output, "sample": sample,
                                    "series": {"gap_tolerance": 0.25}}}, validate={"max_bad_fraction": 0.9})
    packed, _, _ = _packed(_build(job))
    got = packed[0].astype(np.float64)
    if output == "float16":  # modality values (float16 takes no window): within half a float16 ulp of the exact value
        exact = _along_d(values, grid, targets)
        ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
        assert got.shape == exact.shape and (np.abs(got - exact) <= ulp / 2 + 1e-3).all()
        return
    top = 255.0 if output == "uint8" else 65535.0
    y = np.clip((values - 999.5) / 2999.0 + 0.5, 0.0, 1.0)   # LINEAR window, PS3.3 C.11.2.1.2.1
    exact = _along_d(y, grid, targets) * top
    away_from_ties = np.abs(np.abs(exact - np.floor(exact)) - 0.5) > 1e-2
    assert got.shape == exact.shape and away_from_ties.mean() > 0.9
    assert np.array_equal(got[away_from_ties], np.rint(exact)[away_from_ties])


RT_DOSE_STORAGE = "1.2.840.10008.5.1.4.1.1.481.2"
NM_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.20"


def _stacked_job(tmp: Path, raw: Path, **source: Any) -> Path:
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none", **source}],
                transform={"dicom": {"output": "float16", "sample": "volume"}}, validate={"max_bad_fraction": 1.0})


@pytest.mark.parametrize("first", [0.0, -30.0], ids=["relative", "absolute-z"])
def test_an_rt_dose_grid_packs_as_a_volume_along_its_grid_frame_offset_vector(tmp_path: Path, first: float) -> None:
    """An RT Dose places its frames by Grid Frame Offset Vector (PS3.3 C.8.8.3.2): offsets from
    the top-level Image Position (Patient) along the normal where the first is 0, else the
    frames' z coordinates. Only functional groups were read, so a dose grid in a volume job was
    series_no_position, its message pointing at Per-frame Functional Groups it need not have."""
    from tests.dicom_files import image_dataset, save

    stored = np.random.default_rng(3).integers(0, 400000, (6, 8, 10)).astype(np.uint32)
    save(image_dataset(stored, modality="RTDOSE", sop_class=RT_DOSE_STORAGE, ImagePositionPatient=[-40, -30, -30],
                       ImageOrientationPatient=[1, 0, 0, 0, 1, 0], PixelSpacing=[3.0, 2.0], DoseUnits="GY",
                       GridFrameOffsetVector=[first + 2.5 * i for i in range(6)], FrameIncrementPointer=0x3004000C,
                       DoseGridScaling=1.234e-4, DoseType="PHYSICAL", DoseSummationType="PLAN",
                       FrameOfReferenceUID=generate_uid()), tmp_path / "raw" / "dose.dcm")
    result = _build(_stacked_job(tmp_path, tmp_path / "raw", where={"Modality": "RTDOSE"}))
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    volume, affine, info = _packed(result)
    assert volume.shape == (1, 6, 8, 10) and info["spacing"] == pytest.approx([2.5, 3.0, 2.0])
    assert affine[2, 3] == pytest.approx(-30.0)  # frame 0 at z -30 either way
    assert np.allclose(volume[0].astype(np.float64), stored * 1.234e-4, rtol=2e-3, atol=0.02)


def _nm_tomogram(**attrs: Any) -> Any:
    from pydicom.sequence import Sequence as DicomSequence

    from tests.dicom_files import image_dataset

    detector = Dataset()
    detector.ImagePositionPatient, detector.ImageOrientationPatient = [-64, -64, -20], [1, 0, 0, 0, 1, 0]
    values = {"ImageType": ["ORIGINAL", "PRIMARY", "RECON TOMO", "EMISSION"], "PixelSpacing": [4.0, 4.0],
              "FrameIncrementPointer": [0x00540080], "SliceVector": list(range(1, 7)), "NumberOfSlices": 6,
              "SpacingBetweenSlices": 4.0, "SliceThickness": 4.0, "FrameOfReferenceUID": generate_uid(),
              "DetectorInformationSequence": DicomSequence([detector]), **attrs}
    stored = np.random.default_rng(4).integers(0, 3000, (6, 8, 8)).astype(np.uint16)
    return stored, image_dataset(stored, modality="NM", sop_class=NM_IMAGE_STORAGE,
                                 **{k: v for k, v in values.items() if v is not None})


def test_an_nm_recon_tomo_packs_as_a_volume_along_its_slice_vector(tmp_path: Path) -> None:
    """An NM RECON TOMO object (a SPECT reconstruction) gives no functional groups: frame k is
    slice Slice Vector[k], Spacing Between Slices apart along the normal from the Image
    Position (Patient) of its Detector Information Sequence (or top level). It was refused as
    series_no_position; it packs as a volume, its slices in Slice Vector's order."""
    from tests.dicom_files import save

    stored, ds = _nm_tomogram(SliceVector=[1, 2, 3, 6, 5, 4])  # frames need not be in slice order
    save(ds, tmp_path / "raw" / "spect.dcm")
    result = _build(_stacked_job(tmp_path, tmp_path / "raw"))
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    volume, affine, info = _packed(result)
    assert volume.shape == (1, 6, 8, 8) and info["spacing"] == pytest.approx([4.0, 4.0, 4.0])
    assert affine[2, 3] == pytest.approx(-20.0)
    assert np.array_equal(volume[0], stored[[0, 1, 2, 5, 4, 3]].astype(np.float16))  # counts, float16-rounded


def test_an_nm_tomogram_without_its_slice_spacing_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    """Without Spacing Between Slices nothing places an NM tomogram's frames: the refusal names
    that, not the Per-frame Functional Groups an NM object does not have."""
    from tests.dicom_files import save

    _, ds = _nm_tomogram(SpacingBetweenSlices=None)
    save(ds, tmp_path / "raw" / "spect.dcm")
    result = _build(_stacked_job(tmp_path, tmp_path / "raw"))
    (record,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert record["reason"] == "series_no_position"
    assert "no positive Spacing Between Slices (0018,0088)" in record["message"]
    assert "Functional Groups" not in record["message"]
