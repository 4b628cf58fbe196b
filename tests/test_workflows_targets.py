"""The target examples in workflows/ build on the demo tree as committed, and train-ready batches come out.

`make demo` writes ``demo-raw/targets/`` beside the demo's own sources; each
``workflows/targets-*.yaml`` packs one target kind from it, and the README points at them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.loader import ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.verify import verify_dataset
from tests.demo_version import REPO

WORKFLOWS = sorted(p.name for p in (REPO / "workflows").glob("targets-*.yaml"))


@pytest.fixture(scope="module")
def home(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout's layout: workflows/ next to demo-raw/ (the session's demo tree)."""
    home = tmp_path_factory.mktemp("targets-home")
    (home / "workflows").mkdir()
    for name in WORKFLOWS:
        shutil.copy(REPO / "workflows" / name, home / "workflows" / name)
    (home / "demo-raw").symlink_to(demo_raw.root)
    return home


def _build(home: Path, name: str) -> BuildResult:
    return build(load_job(home / "workflows" / name), BuildOptions(scheduler="sync", quiet=True, html_report=False))


def test_there_is_an_example_for_every_target_kind_and_the_readme_names_each() -> None:
    assert WORKFLOWS == ["targets-imagefolder.yaml", "targets-multilabel.yaml", "targets-numeric.yaml",
                         "targets-segmentation.yaml", "targets-unlabeled.yaml"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert all(f"workflows/{name}" in readme for name in WORKFLOWS)


@pytest.mark.parametrize("name,expect", [
    ("targets-unlabeled.yaml", {"image"}),
    ("targets-imagefolder.yaml", {"image", "label"}),
    ("targets-multilabel.yaml", {"image", "target"}),
    ("targets-numeric.yaml", {"image", "target"}),
    ("targets-segmentation.yaml", {"image", "mask"}),
])
def test_each_target_example_builds_verifies_and_loads(home: Path, name: str, expect: set[str]) -> None:
    result = _build(home, name)
    manifest = json.loads(result.manifest_path.read_text())
    assert all(manifest["splits"][split]["samples"] > 0 for split in ("train", "valid", "test"))
    batch = next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=8)))
    assert set(batch) - {"key"} == expect
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape[0] == 8
    if "target" in batch:
        width = len(manifest["target"]["names"])
        assert batch["target"].shape == (8, width) and batch["target"].dtype == torch.float32
    if "mask" in batch:
        assert batch["mask"].shape == (8, 1, *batch["image"].shape[-2:])
        assert set(batch["mask"].unique().tolist()) <= {0, 1, 2}
    assert verify_dataset(result.manifest_path, deep=True).ok


def test_the_segmentation_example_reports_its_planted_mask_defects(home: Path) -> None:
    result = _build(home, "targets-segmentation.yaml")
    found = {Path(r["path"]).name: r["reason"] for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    assert found == {"022.png": "mask_missing", "023.png": "mask_size"}


def test_the_multilabel_example_holds_the_labels_measured_from_each_photo(home: Path) -> None:
    result = _build(home, "targets-multilabel.yaml")
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["target"] == {"kind": "multilabel", "names": ["circle", "square", "bright", "textured"]}
    for item in ShardDataset(result.manifest_path, "train", shuffle=False):
        circle, square = item["target"][:2].tolist()
        assert circle + square == 1  # every photo holds exactly one shape
    # every label is there to learn: each one held by training samples of several subjects
    assert all(count >= 3 for count in manifest["splits"]["train"]["class_counts"].values()), manifest["splits"]
