"""NIfTI sources: what a job may say, what a case's files become, and what each defect of a case is.

The geometry of the packed voxels against independent readers is ``tests/test_nifti_geometry.py``;
this file holds the kind's job settings, discovery (``.nii``/``.nii.gz``, a case's other files
and label maps are not samples), multi-file cases and 4-D files, and the build's records.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from packer.badsamples import read_bad_samples
from packer.config import load_job, parse_window
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import discover
from packer.read.nifti_samples import Case, Slicing, slice_samples
from packer.records import SampleRef
from tests.helpers import write_job

AFFINE = np.array([[0.8, 0, 0, -20.0], [0, 0.9, 0, -18.0], [0, 0, 2.5, 10.0], [0, 0, 0, 1]])


def phantom(shape: tuple[int, int, int] = (24, 20, 10), seed: int = 0, offset: int = 0) -> np.ndarray:
    """An int16 body (HU about 40) in air (-1000), with a bright block placed by ``offset``."""
    rng = np.random.default_rng(seed)
    volume = np.full(shape, -1000, dtype=np.int16)
    x, y, z = shape
    volume[2:x - 2, 2:y - 2, :] = 40 + rng.integers(-10, 10, (x - 4, y - 4, z)).astype(np.int16)
    volume[4 + offset:8 + offset, 5:9, 2:z - 2] = 700
    return volume


def save(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE, **header: Any) -> Path:
    img = nib.Nifti1Image(data, affine)
    img.header.set_qform(affine, code=1)
    img.header.set_sform(affine, code=1)
    for key, value in header.items():
        img.header[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, path)
    return path


def nifti_job(tmp_path: Path, rows: list[str], header: str = "path,entity", **settings: Any) -> Path:
    root = tmp_path / "raw"
    root.mkdir(exist_ok=True)
    (root / "cases.csv").write_text("\n".join([header, *rows]) + "\n")
    source: dict[str, Any] = {"kind": "nifti", "root": "raw", "table": "raw/cases.csv", "label": "none",
                              **settings.pop("source", {})}
    doc = {"name": "nt", "sources": [source],
           "split": {"by": "entity", "ratios": {"train": 1.0}},
           "transform": {"nifti": {"windows": ["abdomen"], **settings}},
           "pack": {"format": "webdataset"}, "output": "out", "validate": {"max_bad_fraction": 0.9}}
    return write_job(tmp_path, doc)


def run(job: Path, tmp_path: Path) -> BuildResult:
    return build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False,
                                             work_dir=tmp_path / "work"))


def records(result: BuildResult) -> dict[str, tuple[dict[str, Any], np.ndarray, np.ndarray | None]]:
    """Every packed sample: key → (its JSON record, its array, its mask or None), with stock tarfile."""
    out: dict[str, Any] = {}
    for shard in sorted(result.version_dir.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
        for name, data in members.items():
            if name.endswith(".json"):
                key = name.removesuffix(".json")
                mask = members.get(f"{key}.mask.npy")
                out[key] = (json.loads(data), np.load(_io(members[f"{key}.npy"])),
                            None if mask is None else np.load(_io(mask)))
    return out


def _io(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


# -- the job file -------------------------------------------------------------------------------

def test_a_zscore_needs_float16_output(tmp_path: Path) -> None:
    save(tmp_path / "raw" / "a.nii.gz", phantom())
    with pytest.raises(ConfigError, match="transform.nifti.output: a z-score is not in \\[0, 1\\] and cannot be "
                                          "uint8; set output: float16"):
        load_job(nifti_job(tmp_path, ["a.nii.gz,P1"], windows=["zscore"]))
    job = load_job(nifti_job(tmp_path, ["a.nii.gz,P1"], windows=["zscore", {"percentiles": [1, 99]}],
                             output="float16"))
    assert [w.to_json() for w in job.settings("nifti").windows] == [
        {"zscore": {"over": "nonzero"}}, {"percentiles": [1.0, 99.0], "over": "all"}]


def test_settings_a_volume_cannot_use_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transform.nifti.axis: a volume keeps every axis"):
        load_job(nifti_job(tmp_path, [], sample="volume", axis="coronal"))
    with pytest.raises(ConfigError, match="transform.nifti.size/spacing: a volume's size and spacing are 3-D"):
        load_job(nifti_job(tmp_path, [], sample="volume", size=[32, 32]))
    with pytest.raises(ConfigError, match="percentiles: \\[99, 1\\]: the low percentile must be below"):
        load_job(nifti_job(tmp_path, [], windows=[{"percentiles": [99, 1]}]))


def test_channel_files_may_not_name_the_row_or_its_mask(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="channel_files: column 'seg' already names the row's own file or its mask"):
        load_job(nifti_job(tmp_path, [], header="path,entity,seg", source={
            "mask": {"column": "seg"}, "channel_files": ["t2", "seg"]}))


def test_a_job_without_nifti_records_no_nifti_settings(tmp_path: Path) -> None:
    """Only jobs that use the kind record its settings and nibabel's version: every other
    dataset keeps its config_hash and dataset_hash."""
    doc = {"name": "t", "sources": [{"kind": "image", "root": "raw", "label": "none"}], "split": {"by": "entity"},
           "pack": {"format": "webdataset"}, "output": "out"}
    assert set(load_job(write_job(tmp_path, doc)).identity()["transform"]) == {"dicom", "image"}
    assert set(load_job(nifti_job(tmp_path, [])).identity()["transform"]) == {"dicom", "image", "nifti"}


# -- discovery ----------------------------------------------------------------------------------

def test_nii_and_nii_gz_are_listed_and_a_case_s_other_files_are_not_samples(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    for name in ("a_t1.nii.gz", "a_t2.nii", "a_seg.nii.gz", "b_t1.NII.GZ", "notes.txt", "x.gz", "y.nii.bak"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    job = load_job(nifti_job(tmp_path, ["a_t1.nii.gz,P1,a_t2.nii,a_seg.nii.gz", "b_t1.NII.GZ,P2,,b_seg.nii.gz"],
                             header="path,entity,t2,seg",
                             source={"channel_files": ["t2"], "mask": {"column": "seg"}}))
    found = discover(job)
    assert [ref.relpath for ref in found.refs] == ["a_t1.nii.gz"]
    assert [(i.relpath if hasattr(i, "relpath") else i.path.rsplit("/", 1)[-1], i.reason) for i in found.issues] == [
        ("b_t1.NII.GZ", "missing_file")]
    assert "no t2 file" in found.issues[0].message


def test_a_label_map_or_channel_file_the_row_names_but_the_disk_lacks_is_found_while_listing(tmp_path: Path) -> None:
    """Found only by the decode pass, a case whose label map or other sequence was never copied
    passed validate --quick (headers only) clean; the listing now gives the decode pass's reasons."""
    root = tmp_path / "raw"
    root.mkdir()
    for name in ("a_t1.nii.gz", "a_t2.nii.gz", "a_seg.nii.gz", "b_t1.nii.gz", "b_t2.nii.gz", "c_t1.nii.gz",
                 "c_seg.nii.gz"):
        save(root / name, phantom())
    job = load_job(nifti_job(tmp_path, ["a_t1.nii.gz,P1,a_t2.nii.gz,a_seg.nii.gz",
                                        "b_t1.nii.gz,P2,b_t2.nii.gz,b_seg.nii.gz",
                                        "c_t1.nii.gz,P3,c_t2.nii.gz,c_seg.nii.gz"],
                             header="path,entity,t2,seg", source={"channel_files": ["t2"], "mask": {"column": "seg"}}))
    found = discover(job)
    assert [ref.relpath for ref in found.refs] == ["a_t1.nii.gz"]
    assert [(Path(i.path).name, i.reason) for i in found.issues] == [("b_t1.nii.gz", "mask_missing"),
                                                                      ("c_t1.nii.gz", "missing_file")]
    assert f"its mask {root / 'b_seg.nii.gz'} does not exist" in found.issues[0].message
    assert found.issues[1].message.startswith(f"{root / 'c_t2.nii.gz'} (t2): no such file; ")


# -- what a case becomes ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Case.Nii.Gz", "Case.NII.GZ", "Case.nIi"])
def test_a_suffix_in_any_case_reads_as_its_lower_case_twin(tmp_path: Path, name: str) -> None:
    """nibabel renames a mixed-case suffix from its own case (Case.Nii.Gz -> Case.nii.Gz) and
    then cannot open it: such a file, listed as NIfTI, must read as the same file named
    .nii.gz does, not be "unreadable: No such file or directory"."""
    first, second = tmp_path / "lower", tmp_path / "mixed"
    suffix = ".nii.gz" if name.lower().endswith(".gz") else ".nii"
    for folder in (first, second):
        save(folder / "raw" / f"case{suffix}", phantom(), scl_slope=1.0, scl_inter=0.0)
    (second / "raw" / f"case{suffix}").rename(second / "raw" / name)
    expected = records(run(nifti_job(first, [f"case{suffix},P1"]), first))
    got = records(run(nifti_job(second, [f"{name},P1"]), second))
    assert len(got) == len(expected) == 10
    for key_got, key_expected in zip(sorted(got), sorted(expected), strict=True):
        assert np.array_equal(got[key_got][1], expected[key_expected][1])


def test_slices_carry_their_place_and_the_case_its_header(tmp_path: Path) -> None:
    save(tmp_path / "raw" / "a.nii.gz", phantom(), scl_slope=1.0, scl_inter=0.0)
    result = run(nifti_job(tmp_path, ["a.nii.gz,P1"]), tmp_path)
    packed = records(result)
    assert len(packed) == 10  # one sample per axial slice (dim[3])
    record, image, mask = packed[sorted(packed)[3]]
    meta = record["metadata"]
    assert image.shape == (1, 20, 24) and image.dtype == np.uint8 and mask is None
    assert meta["slice"]["index"] == 3 and meta["slice"]["axis"] == "axial" and meta["slice"]["count"] == 10
    assert meta["pixel_spacing"] == [0.9, 0.8]
    assert meta["nifti"]["affine_source"] == "sform" and meta["nifti"]["shape"] == [24, 20, 10]
    assert meta["windows"] == [{"name": "abdomen", "source": "preset", "channel": "image", "center": 50.0,
                                "width": 400.0, "function": "LINEAR"}]
    # LPS of pixel (0, 0): the canonical W axis runs to the patient's left, so column 0 is the RAS
    # voxel with the largest x index; H runs posterior, so row 0 is the largest y index
    ras = AFFINE @ np.array([23, 19, 3, 1.0])
    assert meta["slice"]["position"] == pytest.approx([-ras[0], -ras[1], ras[2]], abs=1e-5)
    assert meta["slice"]["orientation"] == pytest.approx([1, 0, 0, 0, 1, 0])


def test_a_case_s_sequences_become_channels_in_the_table_s_order(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    volumes = {name: phantom(seed=n) + 100 * n for n, name in enumerate(("t1", "t1ce", "t2", "flair"))}
    for name, data in volumes.items():
        save(root / f"case_{name}.nii.gz", data)
    result = run(nifti_job(tmp_path, ["case_t1.nii.gz,P1,case_t1ce.nii.gz,case_t2.nii.gz,case_flair.nii.gz"],
                           header="path,entity,t1ce,t2,flair", source={"channel_files": ["t1ce", "t2", "flair"]},
                           windows=[{"percentiles": [0, 100]}]), tmp_path)
    record, image, _ = records(result)[sorted(records(result))[5]]
    assert image.shape == (4, 20, 24)
    assert [w["channel"] for w in record["metadata"]["windows"]] == ["image", "t1ce", "t2", "flair"]
    assert record["metadata"]["channel_files"] == ["image", "t1ce", "t2", "flair"]
    for c, name in enumerate(("t1", "t1ce", "t2", "flair")):  # each channel its own file's percentiles
        low, high = float(volumes[name].min()), float(volumes[name].max())
        assert record["metadata"]["windows"][c]["low"] == low and record["metadata"]["windows"][c]["high"] == high
        axial = np.flip(volumes[name][:, :, 5].T, axis=(0, 1))  # canonical (H, W): y then x, both flipped
        expected = np.rint((axial - low) / (high - low) * 255)
        assert np.abs(image[c].astype(int) - expected).max() <= 1


def test_a_case_whose_files_lie_on_two_grids_is_channel_geometry(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    save(root / "a_t1.nii.gz", phantom())
    shifted = AFFINE.copy()
    shifted[0, 3] += 1.6  # two voxels along x
    save(root / "a_t2.nii.gz", phantom(), affine=shifted)
    result = run(nifti_job(tmp_path, ["a_t1.nii.gz,P1,a_t2.nii.gz"], header="path,entity,t2",
                           source={"channel_files": ["t2"]}), tmp_path)
    (issue,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "channel_geometry" and "a_t2.nii.gz (t2) lies on 10×20×24" in issue["message"]
    assert "same voxel counts, affines up to 1.6 mm apart" in issue["message"]


def test_a_label_map_one_slice_short_is_mask_geometry_that_says_the_voxel_counts_differ(tmp_path: Path) -> None:
    """A label map of the image's affine but one slice fewer: the message names the counts, not a
    distance between affines (there is none) nor a header from another case."""
    root = tmp_path / "raw"
    data = phantom()
    save(root / "c.nii.gz", data)
    save(root / "c_seg.nii.gz", (data[:, :, :9] > 500).astype(np.uint8))
    result = run(nifti_job(tmp_path, ["c.nii.gz,P1,c_seg.nii.gz"], header="path,entity,seg",
                           source={"mask": {"column": "seg", "classes": [0, 1]}}), tmp_path)
    (issue,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "mask_geometry"
    assert "other voxel counts: slices 9 against 10; the same affine" in issue["message"]
    assert "another number of voxels than the image" in issue["message"]
    assert "inf" not in issue["message"] and "another case" not in issue["message"]


def _label_case(tmp_path: Path, seg: np.ndarray, affine: np.ndarray = AFFINE, **mask: Any) -> BuildResult:
    """One case whose label map ``seg`` (saved with ``affine``) goes with a phantom image."""
    root = tmp_path / "raw"
    save(root / "c.nii.gz", phantom())
    save(root / "c_seg.nii.gz", seg, affine)
    return run(nifti_job(tmp_path, ["c.nii.gz,P1,c_seg.nii.gz"], header="path,entity,seg",
                         source={"mask": {"column": "seg", "classes": [0, 1], **mask}}, channels_from="last_axis"),
               tmp_path)


def test_a_4d_label_map_is_told_what_a_label_map_is_not_to_set_channels_from(tmp_path: Path) -> None:
    """The 4-D label map's record said to set transform.nifti.channels_from: last_axis, which the
    job had set (it applies to images); it now says what a label map must be."""
    result = _label_case(tmp_path, np.zeros((24, 20, 10, 2), np.uint8))
    (issue,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "mask_unreadable" and "channels_from" not in issue["message"], issue["message"]
    assert "a label map is one 3-D volume of class ids" in issue["message"]


def test_a_label_maps_own_sform_and_qform_disagreeing_is_warned_as_an_images_is(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    seg = (phantom() > 500).astype(np.uint8)
    path = save(root / "c_seg.nii.gz", seg)
    img = nib.load(path)
    moved = AFFINE.copy()
    moved[:3, 3] += [0, 8.0, 0]
    img.header.set_qform(moved, code=1)
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), None, header=img.header), path)
    save(root / "c.nii.gz", phantom())
    result = run(nifti_job(tmp_path, ["c.nii.gz,P1,c_seg.nii.gz"], header="path,entity,seg",
                           source={"mask": {"column": "seg", "classes": [0, 1]}}), tmp_path)
    meta = records(result)[sorted(records(result))[0]][0]["metadata"]
    # the label map by its role, not its file name: a sample's notes reach its shard record and the reports,
    # where under phi: pseudonymize a name (often the patient's) may not be seen
    assert meta["warnings"] == ["its label map's sform and qform differ by up to 8 mm; the sform is used"]


def test_a_resampled_label_map_wholly_outside_its_image_is_mask_geometry_not_an_empty_mask(tmp_path: Path) -> None:
    """grid: resample of a label map whose header puts it 500 mm from its image (copied from
    another case): every labelled voxel fell outside, and the case packed an all-zero mask with
    no record, "no structure here", its annotation lost."""
    far = AFFINE.copy()
    far[:3, 3] += [500.0, 0, 0]
    result = _label_case(tmp_path, (phantom() > 500).astype(np.uint8), far, grid="resample")
    (issue,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "mask_geometry" and "lies in the image's field of view once resampled" in issue["message"]


def test_a_channel_file_the_row_names_but_the_disk_lacks_is_missing_file(tmp_path: Path) -> None:
    # BraTS-style case whose flair was never copied: the README's missing_file, not "unreadable"
    save(tmp_path / "raw" / "a_t1.nii.gz", phantom())
    result = run(nifti_job(tmp_path, ["a_t1.nii.gz,P1,a_flair.nii.gz"], header="path,entity,flair",
                           source={"channel_files": ["flair"]}), tmp_path)
    (issue,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "missing_file"
    assert "a_flair.nii.gz (flair): no such file; " in issue["message"]


def test_nibabel_s_header_repairs_print_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a flipped byte gives sform_code 65: nibabel sets it to 0 and logs that to stderr, with no
    # file name, from inside every worker (a worker has no root handler: logging's last resort
    # prints it; caplog's root handler stands in for it here)
    from packer.config import LimitsConfig
    from packer.read.nifti import load_header

    path = save(tmp_path / "a.nii", phantom())
    data = bytearray(path.read_bytes())
    data[254:256] = (65).to_bytes(2, "little")  # sform_code
    path.write_bytes(bytes(data))
    for _ in range(2):
        _, header = load_header(str(path), LimitsConfig(), channels_from=None)
        assert header.affine_source == "qform"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("nibabel")] == []


def test_a_4d_file_is_refused_unless_its_last_axis_is_channels(tmp_path: Path) -> None:
    root = tmp_path / "raw"
    four = np.stack([phantom(seed=s) for s in range(3)], axis=-1)
    save(root / "dce.nii.gz", four)
    refused = run(nifti_job(tmp_path, ["dce.nii.gz,P1"]), tmp_path)
    (issue,) = read_bad_samples(refused.version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "unsupported_dimensions" and "channels_from: last_axis" in issue["message"]
    packed = run(nifti_job(tmp_path, ["dce.nii.gz,P1"], channels_from="last_axis"), tmp_path)
    record, image, _ = records(packed)[sorted(records(packed))[0]]
    assert image.shape == (3, 20, 24)
    assert [w["channel"] for w in record["metadata"]["windows"]] == ["image[0]", "image[1]", "image[2]"]


def test_a_sform_that_disagrees_with_the_qform_is_used_and_both_are_recorded(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "raw"
    path = save(root / "a.nii.gz", phantom())
    img = nib.load(path)
    rotated = AFFINE.copy()
    rotated[:3, 3] += [5.0, 0, 0]
    img.header.set_qform(rotated, code=1)
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), None, header=img.header), path)
    result = run(nifti_job(tmp_path, ["a.nii.gz,P1"]), tmp_path)
    meta = records(result)[sorted(records(result))[0]][0]["metadata"]
    assert meta["nifti"]["affine_source"] == "sform" and meta["nifti"]["forms_differ_mm"] == pytest.approx(5.0)
    assert meta["nifti"]["qform_ras"][0][3] == pytest.approx(-15.0)
    assert meta["warnings"] == ["sform and qform differ by up to 5 mm; the sform is used"]
    warned = capsys.readouterr().err
    assert "packer: warning: nt: 1 file(s) packed with a reader's warning, e.g. file raw-" in warned
    assert "sform and qform differ by up to 5 mm" in warned and "packer locate" in warned
    # it names a file, not a sample key, and a volume's samples do not all carry the note
    assert "a volume keeps one slice's metadata" in warned
    assert str(tmp_path / "raw") not in warned  # ids, never paths
    run(nifti_job(tmp_path, ["a.nii.gz,P1"]), tmp_path)  # from the build cache: the warning is kept there too
    assert "sform and qform differ by up to 5 mm" in capsys.readouterr().err


def test_a_volume_s_label_map_is_packed_on_its_grid_and_loaded_with_it(tmp_path: Path) -> None:
    """``sample: volume`` with a mask: the manifest says DHW, the loader and ``packer verify
    --deep`` accept the D×H×W label map of each C×D×H×W volume, and the report draws it."""
    from torch.utils.data import DataLoader

    from packer.loader import ShardDataset
    from packer.verify import verify_dataset

    root = tmp_path / "raw"
    for n in range(3):
        data = phantom(seed=n, offset=n)
        save(root / f"c{n}.nii.gz", data)
        save(root / f"c{n}_seg.nii.gz", (data > 500).astype(np.uint8))
    job = nifti_job(tmp_path, [f"c{n}.nii.gz,P{n},c{n}_seg.nii.gz" for n in range(3)], header="path,entity,seg",
                    source={"mask": {"column": "seg", "classes": [0, 1], "pad": 0}},
                    sample={"volume": {"spacing": [2.5, 1.6, 1.6], "size": [12, 16, 16]}})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, work_dir=tmp_path / "work"))
    assert result.manifest["mask"]["layout"] == "DHW"
    assert result.manifest["sample_schema"] == {"dtype": "uint8", "layout": "CDHW", "shape": [1, 12, 16, 16],
                                                "shapes": {"raw": [[1, 12, 16, 16]]}}
    for _record, image, mask in records(result).values():
        assert mask is not None and mask.shape == image.shape[1:]
        # the block (700 HU, past the abdomen window) and its label share a centre within a voxel (the
        # image is resampled linearly and saturates at its blurred edges, the label by nearest neighbour)
        bright = np.argwhere(image[0] == 255).mean(axis=0)
        labelled = np.argwhere(mask == 1).mean(axis=0)
        assert np.abs(bright - labelled).max() <= 1.0, (bright, labelled)
    batch = next(iter(DataLoader(ShardDataset(result.version_dir, "train"), batch_size=3)))
    assert tuple(batch["image"].shape) == (3, 1, 12, 16, 16) and tuple(batch["mask"].shape) == (3, 12, 16, 16)
    assert verify_dataset(result.version_dir, deep=True).ok
    assert "mask" in (result.version_dir / "report.html").read_text(encoding="utf-8")


def test_the_report_lists_the_statistics_of_normalised_channels(tmp_path: Path) -> None:
    """Each sample is scaled by its own statistics, so its histogram hides how far apart the inputs
    were: the report lists the median and range of what the normalisation used, per channel."""
    for n in range(2):
        save(tmp_path / "raw" / f"c{n}.nii.gz", phantom(seed=n) + 100 * n)
    job = nifti_job(tmp_path, ["c0.nii.gz,P0", "c1.nii.gz,P1"], windows=[{"percentiles": [0, 100]}])
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, work_dir=tmp_path / "work"))
    html = (result.version_dir / "report.html").read_text(encoding="utf-8")
    lows = [float(phantom(seed=n).min() + 100 * n) for n in range(2)]
    highs = [float(phantom(seed=n).max() + 100 * n) for n in range(2)]
    assert (f"p0-100: low {np.median(lows):.4g} ({min(lows):.4g} to {max(lows):.4g}), high {np.median(highs):.4g} "
            f"({min(highs):.4g} to {max(highs):.4g}) over 20 sample(s)") in html


@pytest.mark.parametrize(("sample", "axis", "count"), [("slice", "axial", 10), ("slice", "coronal", 20),
                                                        ("slice", "sagittal", 24), ({"neighbors": 2, "edge": "skip"},
                                                                                    "axial", 6)])
def test_validate_quick_counts_the_slices_the_build_makes(tmp_path: Path, sample: Any, axis: str,
                                                          count: int) -> None:
    """``packer validate --quick`` reads headers only, and counts each case's samples as the
    build keys them: the slices along the axis (less the edges neighbour stacks skip)."""
    from packer.pipeline.datacheck import validate_job

    save(tmp_path / "raw" / "a.nii.gz", phantom())
    job = load_job(nifti_job(tmp_path, ["a.nii.gz,P1"], sample=sample, axis=axis))
    quick = validate_job(job, quick=True, scheduler="sync", quiet=True)
    built = records(run(nifti_job(tmp_path, ["a.nii.gz,P1"], sample=sample, axis=axis), tmp_path))
    assert len(quick.prepared.samples) == count == len(built)


def test_nifti_only_keys_are_refused_on_other_kinds(tmp_path: Path) -> None:
    base = {"name": "t", "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    image = {"kind": "image", "root": "raw", "table": "raw/t.csv"}
    with pytest.raises(ConfigError, match="sources\\[0\\].channel_files: only nifti sources take channel_files; a "
                                          "source of kind image does not read it"):
        load_job(write_job(tmp_path, {**base, "sources": [{**image, "channel_files": ["t2"]}]}))
    with pytest.raises(ConfigError, match="sources\\[0\\].mask.grid: image masks are files of the image's stored "
                                          "size"):
        load_job(write_job(tmp_path, {**base, "sources": [{**image, "mask": {"column": "m", "grid": "resample"}}]}))


@pytest.mark.parametrize(("settings", "limit", "words"), [
    ({"sample": {"volume": {"spacing": [0.1, 0.1, 0.1]}}}, {"max_voxels": 10**6}, "over limits.max_voxels"),
    ({"spacing": [0.01, 0.01]}, {"max_pixels": 10**6}, "over limits.max_pixels"),
])
def test_a_resample_past_the_limits_is_too_large_from_the_header(tmp_path: Path, settings: dict[str, Any],
                                                                  limit: dict[str, int], words: str) -> None:
    """A voxel size of 1 m (a header that says mm where it means µm, or a hostile one) resampled
    to a fine spacing would ask for a huge grid: refused before a voxel is read."""
    import yaml

    huge = AFFINE.copy()
    huge[:3, :3] *= 1000
    save(tmp_path / "raw" / "a.nii.gz", phantom(), affine=huge)
    doc = nifti_job(tmp_path, ["a.nii.gz,P1"], **settings)
    job_doc = yaml.safe_load(doc.read_text())
    job_doc["limits"] = limit
    doc.write_text(yaml.safe_dump(job_doc))
    (issue,) = read_bad_samples(run(doc, tmp_path).version_dir / "bad_samples.jsonl")
    assert issue["reason"] == "too_large" and words in issue["message"] and "nothing was decoded" in issue["message"]


@pytest.mark.parametrize("affine", [AFFINE, np.diag([-0.8, 0.9, -2.5, 1.0]),
                                    np.array([[0, 0, 2.5, 0], [0.9, 0, 0, 0], [0, -0.8, 0, 0], [0, 0, 0, 1.0]])])
@pytest.mark.parametrize("dtype", [np.int16, ">i2", np.float32, np.uint8])
@pytest.mark.parametrize("chunk", [1 << 20, 1000, 7 * 480])  # whole, pieces across slices, several slices
def test_the_streamed_read_is_the_whole_read(tmp_path: Path, affine: np.ndarray, dtype: Any, chunk: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A .nii.gz inflated a few slices at a time straight into its canonical places holds what
    reading it whole and reordering gives, for any stored axes, byte order, 4-D channels and
    pieces that end anywhere in a slice."""
    from packer.read import nifti

    monkeypatch.setattr(nifti, "_CHUNK", chunk)

    volume = np.stack([phantom(seed=s) for s in range(2)], axis=-1).astype(dtype)
    path = save(tmp_path / "a.nii.gz", volume, affine=affine, scl_slope=2.0, scl_inter=-5.0)
    img, header = nifti.load_header(str(path), nifti.LimitsConfig(), channels_from="last_axis")
    whole = nifti.canonical_values(nifti.read_voxels(img, header), header)
    streamed = nifti.read_canonical(img, header)
    assert streamed.array.tobytes() == whole.array.tobytes() and np.array_equal(streamed.affine, whole.affine)
    cut = tmp_path / "cut.nii.gz"
    cut.write_bytes(path.read_bytes()[:-200])
    img, header = nifti.load_header(str(cut), nifti.LimitsConfig(), channels_from="last_axis")
    with pytest.raises(nifti.NiftiDefect) as refused:
        nifti.read_canonical(img, header)
    assert refused.value.reason in ("truncated", "decode_failed")


def test_a_volume_too_short_for_its_stacks_under_edge_skip_is_left_out_and_counted(tmp_path: Path) -> None:
    """Under ``sample: {neighbors: 2, edge: skip}`` a 3-slice case has no slice with both its
    neighbours on each side: it made no sample and no record, and the manifest counted it as a
    file packed. It is left out (not_requested) and said so; a 6-slice case packs its 2 middle ones."""
    save(tmp_path / "raw" / "long.nii.gz", phantom((24, 20, 6)))
    save(tmp_path / "raw" / "short.nii.gz", phantom((24, 20, 3), seed=1))
    result = run(nifti_job(tmp_path, ["long.nii.gz,A", "short.nii.gz,B"], sample={"neighbors": 2, "edge": "skip"}),
                 tmp_path)
    assert len(records(result)) == 2
    (left,) = [json.loads(line) for line in (result.version_dir / "excluded.jsonl").read_text().splitlines()]
    assert (Path(left["path"]).name, left["why"]) == ("short.nii.gz", "not_requested")
    assert "edge: skip" in left["detail"]
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["excluded"] == {"not_requested": 1}


def test_percentiles_that_coincide_clip_the_voxels_above_to_the_top_not_to_black(tmp_path: Path) -> None:
    """A sparse volume (three bright voxels of 1,600) has its 0.5th and 99.5th percentiles both 0:
    every voxel packed as 0, the bright ones too, where MONAI's ScaleIntensityRangePercentiles
    (clip) gives them 1. A range without width is its clip: at or below it 0, above it the top."""
    sparse = np.zeros((20, 20, 4), np.int16)
    sparse[4, 4, 1], sparse[5, 5, 2], sparse[9, 9, 3] = 700, 900, 800
    save(tmp_path / "raw" / "sparse.nii.gz", sparse)
    result = run(nifti_job(tmp_path, ["sparse.nii.gz,A"], windows=[{"percentiles": [0.5, 99.5]}], sample="volume",
                           output="uint8"), tmp_path)
    ((record, volume, _),) = records(result).values()
    assert (record["metadata"]["windows"][0]["low"], record["metadata"]["windows"][0]["high"]) == (0.0, 0.0)
    assert sorted(np.unique(volume).tolist()) == [0, 255] and int((volume == 255).sum()) == 3


def test_a_file_window_that_renders_every_voxel_one_level_is_constant_image(tmp_path: Path) -> None:
    """A display range of 0..1 over voxels of 102..997 renders the whole volume white: it packed
    as a blank sample, where a DICOM file's own window that renders a frame flat is
    constant_image. A range that cuts through the values packs."""
    values = (np.arange(20 * 20 * 4).reshape(20, 20, 4) % 896 + 102).astype(np.int16)
    save(tmp_path / "raw" / "flat.nii.gz", values, cal_min=0.0, cal_max=1.0)
    save(tmp_path / "raw" / "ok.nii.gz", values, cal_min=300.0, cal_max=700.0)
    result = run(nifti_job(tmp_path, ["flat.nii.gz,A", "ok.nii.gz,B"], windows=["file"], sample="volume"), tmp_path)
    (bad,) = read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert (Path(bad["path"]).name, bad["reason"]) == ("flat.nii.gz", "constant_image")
    assert "all come out as the top level (white)" in bad["message"] and "cal_min 0, cal_max 1" in bad["message"]
    assert len(records(result)) == 1


def test_a_reversed_display_range_is_named_as_unusable_not_as_unset(tmp_path: Path) -> None:
    """cal_min 900 / cal_max 100 (and 500 / 500) are set: the record said the file "sets no
    display range", and a user who looked at the header saw it set."""
    save(tmp_path / "raw" / "reversed.nii.gz", phantom(), cal_min=900.0, cal_max=100.0)
    save(tmp_path / "raw" / "unset.nii.gz", phantom(seed=1))
    result = run(nifti_job(tmp_path, ["reversed.nii.gz,A", "unset.nii.gz,B"], windows=["file"], sample="volume"),
                 tmp_path)
    by_name = {Path(r["path"]).name: r for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert {name: r["reason"] for name, r in by_name.items()} == {"reversed.nii.gz": "missing_window",
                                                                  "unset.nii.gz": "missing_window"}
    assert "cal_min 900 and cal_max 100 are set but make no range" in by_name["reversed.nii.gz"]["message"]
    assert "sets no display range" in by_name["unset.nii.gz"]["message"]


@pytest.mark.parametrize("selector", [2, "LUNG"])
def test_a_file_window_by_index_or_name_is_missing_on_a_nifti_which_has_one_range(tmp_path: Path,
                                                                                  selector: Any) -> None:
    """A NIfTI file holds one display range (cal_min/cal_max), with no index or name: {file: 2}
    and {file: "LUNG"} packed that range as if it were the one asked for. They are missing_window,
    saying what to write; {file: 0} is the range."""
    values = (np.arange(20 * 20 * 4).reshape(20, 20, 4) % 896 + 102).astype(np.int16)
    save(tmp_path / "raw" / "ok.nii.gz", values, cal_min=300.0, cal_max=700.0)
    asked = run(nifti_job(tmp_path, ["ok.nii.gz,A"], windows=[{"file": selector}], sample="volume"), tmp_path)
    (bad,) = read_bad_samples(asked.version_dir / "bad_samples.jsonl")
    assert bad["reason"] == "missing_window" and "a NIfTI file cannot hold" in bad["message"], bad
    first = run(nifti_job(tmp_path, ["ok.nii.gz,A"], windows=[{"file": 0}], sample="volume"), tmp_path)
    assert len(records(first)) == 1


@pytest.mark.parametrize("sample", ["slice", "neighbors"])
def test_fit_s_border_is_black_under_every_normalisation(sample: str) -> None:
    """README, Transforms step 5: a slice is resized like a DICOM frame, ``fit``'s border black:
    0 for percentiles and a z-score over the non-zero voxels (their background), the volume's
    lowest z-score over all voxels, where 0 is the mean (the border was 0 there: mid-grey
    tissue to a network). Each slice of a neighbour stack the same."""
    rng = np.random.default_rng(13)
    values = rng.uniform(10, 100, (1, 3, 4, 8)).astype(np.float32)  # 3 slices of 4 × 8: fit to 8 × 8 pads 2 rows a side
    case = Case(values=values, affine=np.eye(4), names=("mr",), cal=(None,))
    ref = SampleRef(sample_id="c", source="s", kind="nifti", path="/raw/c.nii.gz", relpath="c.nii.gz")
    windows = ({"zscore": {"over": "all"}}, {"zscore": {"over": "nonzero"}}, {"percentiles": [0, 100]})
    plan = Slicing(windows=tuple(parse_window(w, f"w[{i}]") for i, w in enumerate(windows)), sample=sample,
                   axis="axial", neighbors=1, edge="replicate", spacing=None, size=(8, 8), resize="fit",
                   output="float16", volume_spacing=None, volume_size=None)
    lowest = np.float16((values.min() - values.mean(dtype=np.float64)) / values.std(dtype=np.float64))
    samples = slice_samples(ref, case, plan, {})
    assert len(samples) == 3
    for packed in samples:
        assert packed.image.shape == (3 * (3 if sample == "neighbors" else 1), 8, 8)
        for channel in packed.image.reshape(-1, 3, 8, 8):
            border = np.concatenate([channel[:, :2], channel[:, 6:]], axis=1)
            assert border[0] == pytest.approx(np.full((4, 8), lowest), abs=1e-3) and lowest < -1.5, border[0]
            assert (border[0] <= channel[0, 2:6].min()).all()
            assert (border[1:] == 0).all()


def test_a_z_scored_volume_over_all_voxels_is_padded_with_its_lowest_z_score(tmp_path: Path) -> None:
    """0 is the mean of a z-score over all voxels (mid-grey): a volume padded to ``size`` takes its
    lowest z-score there, black as in a slice's ``fit`` border; a window's channel 0."""
    save(tmp_path / "raw" / "a.nii.gz", phantom())
    job = nifti_job(tmp_path, ["a.nii.gz,P1"], windows=[{"zscore": {"over": "all"}}, "abdomen"], output="float16",
                    sample={"volume": {"size": [14, 24, 28]}})   # D 10 → 14, H 20 → 24, W 24 → 28
    ((record, image, _),) = records(run(job, tmp_path)).values()
    values = phantom().astype(np.float64)
    lowest = (values.min() - values.mean()) / values.std()
    pad = np.ones(image.shape[1:], dtype=bool)
    pad[2:12, 2:22, 2:26] = False
    assert np.unique(image[0][pad]).tolist() == [pytest.approx(lowest, abs=2e-3)]
    assert float(image[0][~pad].min()) == pytest.approx(lowest, abs=2e-3)
    assert np.unique(image[1][pad]).tolist() == [0.0]
