"""The NIfTI examples in workflows/ build on the demo tree as committed: every broken file is a bad
sample with its reason, every good case packs, and the samples are what each job's comments say.

``make demo`` writes ``demo-raw/nifti/`` (:mod:`packer.demo_nifti`); ``workflows/nifti-slices.yaml``
and ``nifti-volume.yaml`` pack its CT cases, ``nifti-mr.yaml`` its MR case. Expected counts come
from nibabel's reading of the files, not from packer's reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import torch

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.demo_nifti import CT_BROKEN, CT_CASES, CT_CLASSES
from packer.loader import ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import make_sample_id
from packer.verify import verify_dataset
from tests.demo_version import REPO

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

WORKFLOWS = sorted(p.name for p in (REPO / "workflows").glob("nifti-*.yaml"))
#: What each CT job's bad-sample report holds: file name → reason code (the planted defects).
EXPECTED_BAD = {f"{name}.nii.gz": reason for name, (_, reason) in CT_BROKEN.items() if reason is not None}
#: The CT cases that pack: the good ones and the one whose sform and qform disagree.
PACKED = [f"imagesTr/{case}_0000.nii.gz" for case in CT_CASES] + ["broken/sform_qform.nii.gz"]
#: The abdomen window (50/400 HU) of each organ's HU (packer/demo_nifti.py), as uint8: round(255·(HU − 50 + 200)/400).
ABDOMEN_UINT8 = {CT_CLASSES["liver"]: 134, CT_CLASSES["kidney"]: 191, CT_CLASSES["spleen"]: 124}


@pytest.fixture(scope="module")
def home(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout's layout: workflows/ next to demo-raw/ (the session's demo tree)."""
    home = tmp_path_factory.mktemp("nifti-home")
    (home / "workflows").mkdir()
    for name in WORKFLOWS:
        shutil.copy(REPO / "workflows" / name, home / "workflows" / name)
    (home / "demo-raw").symlink_to(demo_raw.root)
    return home


@pytest.fixture(scope="module")
def built(home: Path) -> dict[str, BuildResult]:
    return {name: build(load_job(home / "workflows" / name), BuildOptions(scheduler="sync", quiet=True,
                                                                          html_report=False))
            for name in WORKFLOWS}


def _manifest(result: BuildResult) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(result.manifest_path.read_text())
    return manifest


def _axial_slices(path: Path) -> int:
    """Slices along the axis closest to superior (nibabel's canonical RAS: the third)."""
    return int(nib.as_closest_canonical(nib.load(path)).shape[2])


def _batches(result: BuildResult, split: str, **options: Any) -> list[dict[str, Any]]:
    return list(make_loader(ShardDataset(result.manifest_path, split, shuffle=False, **options), batch_size=64))


def test_the_nifti_workflows_are_the_three_jobs() -> None:
    assert WORKFLOWS == ["nifti-mr.yaml", "nifti-slices.yaml", "nifti-volume.yaml"]
    for name in WORKFLOWS:  # and each is a valid job, with its raw tree where `make demo` writes it
        job = load_job(REPO / "workflows" / name)
        assert [Path(s.root).relative_to(REPO).as_posix() for s in job.sources] == [
            "demo-raw/nifti/mr" if name == "nifti-mr.yaml" else "demo-raw/nifti/ct"]


@pytest.mark.parametrize("name", ["nifti-slices.yaml", "nifti-volume.yaml"])
def test_each_broken_ct_file_is_a_bad_sample_with_its_reason(built: dict[str, BuildResult], name: str) -> None:
    result = built[name]
    found = {Path(r["path"]).name: r["reason"] for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert found == EXPECTED_BAD
    manifest = _manifest(result)
    assert manifest["bad_samples"]["total"] == 8 and manifest["bad_samples"]["fraction"] == pytest.approx(8 / 17,
                                                                                                         abs=1e-6)
    assert manifest["bad_samples"]["fraction"] <= manifest["bad_samples"]["max_fraction"]


def test_the_slice_job_packs_every_axial_slice_with_its_label_map(built: dict[str, BuildResult], home: Path) -> None:
    result = built["nifti-slices.yaml"]
    manifest = _manifest(result)
    ct = home / "demo-raw" / "nifti" / "ct"
    assert manifest["inputs"]["samples"] == sum(_axial_slices(ct / rel) for rel in PACKED)
    assert manifest["sample_schema"]["shape"] == [3, 64, 64] and manifest["sample_schema"]["dtype"] == "uint8"
    assert manifest["mask"]["classes"] == [0, 1, 2, 3]
    assert {s: manifest["splits"][s]["entities"] for s in ("train", "valid", "test")} == {"train": 5, "valid": 2,
                                                                                          "test": 2}
    near = manifest["audit"]["rules"]
    assert near["near_duplicates_across_splits"]["count"] == 0 and near["duplicates_span_entities"]["count"] == 0
    # each label sits on its organ: the abdomen channel's median there is the organ's HU through the window
    images, masks = [], []
    for split in ("train", "valid", "test"):
        for batch in _batches(result, split):
            images.append(batch["image"][:, 0].numpy())
            masks.append(batch["mask"][:, 0].numpy())
    image, mask = np.concatenate(images), np.concatenate(masks)
    assert image.shape[0] == manifest["inputs"]["samples"] and mask.shape == image.shape
    for label, value in ABDOMEN_UINT8.items():
        assert abs(float(np.median(image[mask == label])) - value) <= 6, label
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_a_label_map_stored_in_other_axes_lines_up_with_its_image(built: dict[str, BuildResult]) -> None:
    """CT003's label map is stored RPI, its image RAS: packed, its organs on the image's."""
    result = built["nifti-slices.yaml"]
    prefix = make_sample_id("abdomen_ct", "imagesTr/CT003_0000.nii.gz", None)
    found = 0
    for split in ("train", "valid", "test"):
        for batch in _batches(result, split):
            for key, image, mask in zip(batch["key"], batch["image"][:, 0].numpy(), batch["mask"][:, 0].numpy(),
                                        strict=True):
                if key.startswith(prefix) and (mask == CT_CLASSES["liver"]).sum() > 20:
                    found += 1
                    assert abs(float(np.median(image[mask == CT_CLASSES["liver"]])) - 134) <= 8, key
    assert found >= 5


def test_the_volume_job_packs_one_volume_per_case_at_one_voxel_size(built: dict[str, BuildResult]) -> None:
    result = built["nifti-volume.yaml"]
    manifest = _manifest(result)
    assert manifest["inputs"]["samples"] == len(PACKED)
    assert manifest["sample_schema"]["layout"] == "CDHW" and manifest["sample_schema"]["shape"] == [2, 32, 64, 64]
    assert manifest["mask"]["layout"] == "DHW"
    warned = 0
    for split in ("train", "valid", "test"):
        for batch in _batches(result, split, records=True):
            assert batch["image"].dtype == torch.uint8 and tuple(batch["mask"].shape[1:]) == (32, 64, 64)
            for image, mask, record in zip(batch["image"].numpy(), batch["mask"].numpy(), batch["record"],
                                           strict=True):
                volume = record["metadata"]["volume"]
                assert volume["spacing"] == pytest.approx([5, 6, 6], abs=0.1) and len(volume["affine"]) == 4
                assert set(np.unique(mask)) == {0, 1, 2, 3}
                # the upper quartile: resampled linearly, a small kidney's edge voxels blend with the fat around it
                for label, value in ABDOMEN_UINT8.items():
                    found = float(np.percentile(image[0][mask == label], 75))
                    assert abs(found - value) <= 8, (record["key"], label)
                warned += bool(record["metadata"].get("warnings"))
    assert warned == 1  # the file whose sform and qform disagree
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_the_mr_job_packs_four_zscored_sequences_per_slice(built: dict[str, BuildResult], home: Path) -> None:
    result = built["nifti-mr.yaml"]
    manifest = _manifest(result)
    assert manifest["bad_samples"]["total"] == 0
    assert manifest["inputs"]["samples"] == _axial_slices(home / "demo-raw" / "nifti" / "mr" / "imagesTr" /
                                                          "BRAIN001_0000.nii.gz")
    assert manifest["sample_schema"]["shape"] == [4, 48, 48] and manifest["sample_schema"]["dtype"] == "float16"
    (batch,) = _batches(result, "train", records=True)
    assert [w["channel"] for w in batch["record"][0]["metadata"]["windows"]] == ["image", "t1ce", "t2", "flair"]
    image = batch["image"].float().numpy()
    brain = image[:, 0] != 0
    for channel in range(4):  # each sequence z-scored over the brain: mean 0, standard deviation 1
        values = image[:, channel][brain]
        assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.05, channel
        assert not image[:, channel][~brain].any()
    assert set(np.unique(batch["mask"].numpy())) == {0, 1, 2, 3}


@pytest.mark.slow  # subprocesses: `packer validate` as CI runs it, and `packer build` on a local dask cluster
def test_ci_validates_and_builds_each_nifti_workflow(home: Path, tmp_path: Path) -> None:
    packer = str(Path(sys.executable).with_name("packer"))
    env = {**os.environ, "PYTHONPATH": ""}
    for name in WORKFLOWS:
        report = tmp_path / f"{name}.json"
        done = subprocess.run([packer, "validate", f"workflows/{name}", "--json", str(report)], cwd=home,
                              capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        by_reason = json.loads(report.read_text())["bad_samples"]["by_reason"]
        assert by_reason == ({} if name == "nifti-mr.yaml" else {
            r: sum(v == r for v in EXPECTED_BAD.values()) for r in set(EXPECTED_BAD.values())})
    done = subprocess.run([packer, "build", "workflows/nifti-volume.yaml"], cwd=home, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "bad samples: 8 of 17 files" in said and "1 file(s) packed with a reader's warning" in said
