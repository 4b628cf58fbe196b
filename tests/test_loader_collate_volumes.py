"""Volumes of one size through ``collate="pad"``: the README tells a user whose volumes differ in
size to give them one (``sample: {volume: {size: [D, H, W]}}``); once they have one, the pad
collate has nothing to pad and batches them as the stacking collate does (with ``size``)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml

from packer.loader import ShardDataset, make_loader

SIZE = [6, 16, 20]   # D, H, W


def _write_case(raw: Path, name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (20 + seed, 18, 7 + seed)  # X, Y, Z: each case its own grid before the volume size
    data = rng.integers(-1000, 1000, size=shape).astype(np.int16)
    labels = np.zeros(shape, dtype=np.uint8)
    labels[4:12, 3:9, 1:5] = 1
    affine = np.diag([1.5, 1.5, 3.0, 1.0])
    nib.save(nib.Nifti1Image(data, affine), raw / f"{name}.nii.gz")
    nib.save(nib.Nifti1Image(labels, affine), raw / f"{name}_seg.nii.gz")


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packer.config import load_job
    from packer.pipeline.build import BuildOptions, build

    folder = tmp_path_factory.mktemp("pad-volumes")
    raw = folder / "raw"
    raw.mkdir()
    rows = ["path,entity,mask"]
    for i in range(3):
        _write_case(raw, f"case{i}", i)
        rows.append(f"case{i}.nii.gz,E{i},case{i}_seg.nii.gz")
    (raw / "cases.csv").write_text("\n".join(rows) + "\n")
    job = {
        "name": "padvol",
        "sources": [{"kind": "nifti", "root": "raw", "table": "raw/cases.csv", "label": "none",
                     "mask": {"column": "mask", "classes": [0, 1]}}],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"nifti": {"windows": ["abdomen"], "sample": {"volume": {"size": SIZE}}}},
        "pack": {"format": "webdataset"}, "output": "out", "validate": {"max_bad_fraction": 0.0},
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    result = build(load_job(folder / "job.yaml"), BuildOptions(scheduler="sync", quiet=True, html_report=False,
                                                               fresh=True, work_dir=folder / "work"))
    return Path(result.manifest_path)


def test_the_pad_collate_batches_volumes_of_one_size_as_the_stacking_one_does(volumes: Path) -> None:
    stacked = next(iter(make_loader(ShardDataset(volumes, "train", shuffle=False), 3, 0)))
    padded = next(iter(make_loader(ShardDataset(volumes, "train", shuffle=False), 3, 0, collate="pad")))
    assert tuple(stacked["image"].shape) == (3, 1, *SIZE) and tuple(stacked["mask"].shape) == (3, *SIZE)
    assert padded["key"] == stacked["key"]
    assert torch.equal(padded["image"], stacked["image"]) and padded["image"].dtype == torch.uint8
    assert torch.equal(padded["mask"], stacked["mask"])
    assert padded["size"].tolist() == [SIZE[1:]] * 3   # each volume's own height, width: nothing padded
