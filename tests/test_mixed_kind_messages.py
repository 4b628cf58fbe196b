"""A job that mixes kinds (CT stacks, NIfTI slices, photos) is told only the fixes that can work:
every change its shapes need, no collate the loader then refuses, no channel count another
source is refused."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import cv2
import nibabel as nib
import numpy as np
import pytest

from packer.config import load_job
from packer.errors import ConfigError
from packer.loader import ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, build, dataset_warnings
from packer.pipeline.sampletable import several_shapes
from tests.helpers import write_job


def _schema(shapes: dict[str, list[list[int]]], dtypes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """A manifest's sample_schema of ``shapes`` (and ``dtypes``, each source's) per source."""
    found = {d for listed in (dtypes or {}).values() for d in listed}
    return {"shape": None, "shapes": shapes, "dtype": None if len(found) > 1 else "uint8",
            **({"dtypes": dtypes} if len(found) > 1 else {})}


# -- several_shapes: every fix the shapes need -------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [
    {"nii": [[1, 24, 24]], "photo": [[3, 32, 32]]},
    {"ct": [[2, 64, 64]], "nii": [[1, 24, 24]], "photo": [[3, 32, 32]]},
])
def test_sources_differing_in_channels_and_size_are_told_both_fixes(shapes: dict[str, list[list[int]]]) -> None:
    # one channel count alone leaves 3×24×24 beside 3×32×32, which no batch stacks either
    (warning,) = several_shapes(_schema(shapes))
    assert "make them one channel count with transform.channels" in warning, warning
    assert "give every source one size" in warning, warning


def test_a_source_of_several_channel_counts_and_sizes_is_told_both_fixes() -> None:
    (warning,) = several_shapes(_schema({"mixed": [[1, 24, 24], [3, 32, 32]]}))
    assert warning.startswith("source mixed packs samples of 2 shapes (1×24×24, 3×32×32), which no batch can stack: "
                              "make them one channel count with transform.channels"), warning
    assert "give the kind a size (transform.<kind>.size)" in warning, warning


def test_pad_is_offered_only_where_it_pads_one_channel_count() -> None:
    # collate="pad" pads height and width only: it refuses a batch of several channel counts
    (mixed,) = several_shapes(_schema({"nii": [[1, 24, 24]], "photo": [[3, 32, 32]]}))
    assert 'collate="list"' in mixed and 'collate="pad"' not in mixed, mixed
    (sizes,) = several_shapes(_schema({"a": [[3, 24, 24]], "b": [[3, 32, 32]]}))
    assert 'collate="list") or collate="pad"' in sizes, sizes


# -- several_shapes beside several dtypes: no collate the loader refuses --------------------------------------


def test_shapes_and_dtypes_that_differ_are_told_only_one_dtype_views() -> None:
    (warning,) = several_shapes(_schema({"nii": [[1, 24, 24]], "photo": [[3, 32, 32]]},
                                        {"nii": ["float16"], "photo": ["uint8"]}))
    assert "collate" not in warning.split("no batch can stack")[1].replace("no collate loads", ""), warning
    assert "dtypes differ too (nii float16, photo uint8), so no collate loads the whole split" in warning, warning
    assert "load one source at a time (ShardDataset(..., sources=[...]))" in warning, warning


def test_a_one_dtype_view_of_several_shapes_is_offered_its_collates() -> None:
    (warning,) = several_shapes(_schema({"nii": [[1, 24, 24]], "a": [[3, 32, 32]], "b": [[3, 48, 48]]},
                                        {"nii": ["float16"], "a": ["uint8"], "b": ["uint8"]}))
    assert ("batch a view of one dtype (ShardDataset(..., sources=['a', 'b'])) with make_loader(..., "
            'collate="list") or collate="pad"') in warning, warning
    (own,) = several_shapes(_schema({"nii": [[1, 24, 24]], "photo": [[3, 32, 32], [3, 48, 48]]},
                                    {"nii": ["float16"], "photo": ["uint8"]}))
    assert own.startswith("source photo packs samples of 2 shapes"), own
    assert "batch a view of one dtype (ShardDataset(..., sources=['photo']))" in own, own


def _nifti_and_photos(tmp_path: Path) -> Path:
    """6 NIfTI cases z-scored to float16 slices (1×24×24) beside 6 RGB photos (3×32×32)."""
    (tmp_path / "nii").mkdir()
    (tmp_path / "img").mkdir()
    nii, img = [], []
    for i in range(6):
        voxels = np.random.default_rng(i).normal(0, 200, (24, 24, 3)).astype(np.float32)
        nib.save(nib.Nifti1Image(voxels, np.eye(4)), str(tmp_path / "nii" / f"c{i}.nii.gz"))
        nii.append([f"c{i}.nii.gz", f"P{i}", "a"])
        photo = np.random.default_rng(100 + i).integers(0, 255, (40, 40, 3), np.uint8)
        cv2.imwrite(str(tmp_path / "img" / f"p{i}.png"), photo)
        img.append([f"p{i}.png", f"Q{i}", "b"])
    for folder, rows in (("nii", nii), ("img", img)):
        with open(tmp_path / folder / "t.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "entity", "label"])
            writer.writerows(rows)
    return write_job(tmp_path, {
        "name": "mixed", "output": str(tmp_path / "out"), "pack": {"format": "webdataset"},
        "sources": [{"kind": "nifti", "name": "nii", "root": str(tmp_path / "nii"),
                     "table": str(tmp_path / "nii/t.csv")},
                    {"kind": "image", "name": "photo", "root": str(tmp_path / "img"),
                     "table": str(tmp_path / "img/t.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1,
                  "balance": {"accept": True}},
        "transform": {"nifti": {"windows": ["zscore"], "output": "float16", "sample": "slice", "size": [24, 24]},
                      "image": {"size": [32, 32], "color": "rgb"}}})


def test_a_built_dataset_of_two_dtypes_is_warned_of_no_collate_the_loader_refuses(tmp_path: Path) -> None:
    result = build(load_job(_nifti_and_photos(tmp_path)), BuildOptions(scheduler="sync", quiet=True,
                                                                       html_report=False))
    (shapes,) = [message for code, message in dataset_warnings(result.manifest) if code == "several_shapes"]
    with pytest.raises(ConfigError, match="different dtypes"):  # the whole split, whichever collate
        next(iter(make_loader(ShardDataset(result.manifest_path, "train"), batch_size=4, collate="list")))
    assert 'collate="list"' not in shapes and 'collate="pad"' not in shapes, shapes
    assert "give every source one size" in shapes and "transform.channels" in shapes, shapes
    view = ShardDataset(result.manifest_path, "train", sources=["photo"])  # what it advises does load
    assert len(list(view)) > 0


# -- a neighbour stack's channel count: only fixes that give it --------------------------------------------------


def _stack_job(tmp_path: Path, kind: str, channels: int, windows: list[Any], neighbors: int,
               photos: bool = True, **extra: Any) -> Path:
    for folder in ("scans", "img"):
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "img" / "t.csv").write_text("path,label,entity\n")
    (tmp_path / "k.key").write_text("ab" * 32 + "\n")
    sources: list[dict[str, Any]] = [{"kind": kind, "name": "scan", "root": str(tmp_path / "scans"), "label": "none"}]
    if photos:
        sources.append({"kind": "image", "name": "photo", "root": str(tmp_path / "img"),
                        "table": str(tmp_path / "img" / "t.csv"), "label": "none"})
    return write_job(tmp_path, {
        "name": "stack", "sources": sources, "output": str(tmp_path / "out"), "pack": {"format": "webdataset"},
        "split": {"by": "entity"}, "phi": {"key_file": str(tmp_path / "k.key")},
        "transform": {"channels": channels, kind: {"windows": windows, "sample": {"neighbors": neighbors}, **extra},
                      **({"image": {"color": "rgb"}} if photos else {})}})


def _refusal(job: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_job(job)
    return str(caught.value)


@pytest.mark.parametrize("kind", ["dicom", "nifti"])
def test_a_stack_beside_rgb_photos_is_told_the_stack_size_that_makes_their_count(tmp_path: Path, kind: str) -> None:
    # 5 slices × 1 window beside RGB photos under transform.channels: 3. No windows times 5 make 3, and
    # transform.channels: 5 is refused for the photos; neighbors: 1 (3 slices × 1 window) is the way
    said = _refusal(_stack_job(tmp_path, kind, 3, ["lung" if kind == "dicom" else "abdomen"], 2))
    assert f"set transform.{kind}.sample: {{neighbors: 1}} (3 slices × 1 channel(s) a slice make 3)" in said, said
    assert "times the stack's" not in said, said
    assert "transform.channels to" not in said, said
    assert "drop transform.channels and load each source on its own" in said, said


@pytest.mark.parametrize("kind", ["dicom", "nifti"])
def test_a_stack_alone_may_set_the_count_to_its_own(tmp_path: Path, kind: str) -> None:
    # no other source shares transform.channels: the stack's own 5 is a fix; 3 is no multiple of 5 slices
    said = _refusal(_stack_job(tmp_path, kind, 3, ["lung" if kind == "dicom" else "abdomen"], 2, photos=False))
    assert "set transform.channels to 5" in said and "neighbors: 1" in said, said
    assert "times the stack's" not in said, said


def test_a_stack_whose_count_is_a_multiple_is_told_the_windows_and_no_impossible_stack(tmp_path: Path) -> None:
    # 6 channels from 3-slice stacks of 1 window: 2 windows a slice; no odd stack of 1 window makes 6
    said = _refusal(_stack_job(tmp_path, "dicom", 6, ["lung"], 1))
    assert "list 2 window(s) that, times the stack's 3 slices, make 6 channels" in said, said
    assert "neighbors:" not in said.split("Fix:")[1], said


def test_modality_windows_of_a_stack_are_told_the_windows_a_slice(tmp_path: Path) -> None:
    # 3-slice stacks under transform.channels: 3: CT's 2 windows make 6. "list 3 windows for CT (or 1,
    # replicated)" made 9 or 3 slices × 1 = 3 only by luck of the words; the count a slice is 1
    said = _refusal(_stack_job(tmp_path, "dicom", 3, ["lung"], 1, modality_windows={"CT": ["lung", "bone"]}))
    assert "transform.dicom.modality_windows.CT: gives 6 channel(s)" in said, said
    assert "list 1 window(s) for CT that, times the stack's 3 slices, make 3 channels" in said, said
    assert "replicated" not in said.split("Fix:")[1] and "neighbors:" not in said.split("Fix:")[1], said
