"""Public NIfTI layouts as they ship, packed as README's recipes say.

An nnU-Net v2 raw folder (``imagesTr/<case>_0000.nii.gz``, ``<case>_0001.nii.gz``: one file a channel,
``labelsTr/<case>.nii.gz``) read by a table-less ``kind: nifti`` source makes each channel file its own
entity (README: without a table each file is its own entity), so one case's channels can land in
different splits. That is leakage, and the build must say so, as it does for BraTS's case folders:
the warning names the case id the file names hold less their ``_NNNN`` channel number, and the fix.
A layout whose names end in four digits without grouping cases (a camera's ``IMG_0001.jpg``, one
channel a case) is not warned of.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import nibabel as nib
import numpy as np
import pytest
import yaml

from packer.config import load_job
from packer.phi import Pseudonymizer
from packer.pipeline.discover import discover


def _volume(path: Path, seed: int, *, labels: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2, (8, 8, 4)).astype(np.uint8) if labels else \
        rng.normal(100, 5, (8, 8, 4)).astype(np.float32)
    nib.save(nib.Nifti1Image(data, np.diag([1.5, 1.5, 3.0, 1.0])), str(path))


def _photo(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8))


def _job(tmp_path: Path, kind: str, root: Path, **source: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "public", "sources": [{"kind": kind, "root": str(root), "label": "none", **source}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16]}} if kind == "image" else
        {"nifti": {"windows": ["zscore"], "sample": "volume", "output": "float16"}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _nnunet(root: Path, cases: int, channels: int) -> None:
    """nnU-Net v2's raw layout: ``imagesTr/prostate_NN_000C.nii.gz`` and ``labelsTr/prostate_NN.nii.gz``."""
    for i in range(1, cases + 1):
        case = f"prostate_{i:02d}"
        for ch in range(channels):
            _volume(root / "imagesTr" / f"{case}_{ch:04d}.nii.gz", 10 * i + ch)
        _volume(root / "labelsTr" / f"{case}.nii.gz", 10 * i + 9, labels=True)


def _leakage(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "leakage protection is off" in w]


def test_an_nnunet_raw_folder_without_a_table_warns_that_each_channel_file_is_its_own_entity(tmp_path: Path) -> None:
    """Each case's T2 and ADC files are two entities, which the split may part: the warning names the
    case id left of the channel number and offers both fixes README documents, an entity read from
    the path and a table with channel_files (one sample a case)."""
    root = tmp_path / "Dataset001_Prostate"
    _nnunet(root, cases=4, channels=2)
    found = discover(load_job(_job(tmp_path, "nifti", root)))
    assert sorted(ref.relpath for ref in found.refs) == sorted(
        f"imagesTr/prostate_{i:02d}_{ch:04d}.nii.gz" for i in range(1, 5) for ch in range(2))
    (warning,) = _leakage(found.warnings)
    assert warning == (
        "source 'Dataset001_Prostate': each of its 8 files is its own entity, so leakage protection is off: no "
        "patient can be kept in one split. The file names less their trailing channel number, as 'prostate_01' of "
        "'prostate_01_0000.nii.gz' (entity: {path: '(?:^|/)(?P<entity>[^/]+)_\\d{4}\\.[^/]*$'}; or, one sample "
        "a case, a table whose channel_files columns name its other files) looks like a patient id: name it in "
        "'entity:'")


def test_the_entity_the_nnunet_warning_offers_keeps_each_case_in_one_entity(tmp_path: Path) -> None:
    root = tmp_path / "Dataset001_Prostate"
    _nnunet(root, cases=4, channels=2)
    warning = _leakage(discover(load_job(_job(tmp_path, "nifti", root))).warnings)[0]
    offered = re.search(r"entity: \{path: '(.*?)'\}", warning)
    assert offered is not None
    found = discover(load_job(_job(tmp_path, "nifti", root, entity={"path": offered.group(1)})))
    assert _leakage(found.warnings) == []
    assert sorted(ref.entity for ref in found.refs) == sorted(f"prostate_{i:02d}" for i in range(1, 5) for _ in "ab")


def test_the_nnunet_warning_names_no_case_under_pseudonymization(tmp_path: Path) -> None:
    """Under PHI pseudonymization a case id from the path is the raw patient id: the warning says
    where it is, not what it is."""
    root = tmp_path / "Dataset001_Prostate"
    _nnunet(root, cases=4, channels=2)
    job = _job(tmp_path, "nifti", root)
    doc = yaml.safe_load(job.read_text())
    doc["phi"] = {"mode": "pseudonymize"}
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    phi = Pseudonymizer(mode="pseudonymize", dates="shift", key=b"0123456789abcdef" * 4)
    (warning,) = _leakage(discover(load_job(job), phi).warnings)
    assert "The file names less their trailing channel number (entity: {path:" in warning
    assert "prostate_01" not in warning


def test_an_nnunet_folder_of_one_channel_a_case_is_not_warned_of(tmp_path: Path) -> None:
    """The Decathlon's CT tasks in nnU-Net form, ``CT001_0000.nii.gz``: one file a case, each its own
    entity rightly; nothing can leak."""
    root = tmp_path / "Dataset003_Liver"
    _nnunet(root, cases=6, channels=1)
    assert _leakage(discover(load_job(_job(tmp_path, "nifti", root))).warnings) == []


@pytest.mark.parametrize("names", [
    [f"DCIM/100CANON/IMG_{n:04d}.jpg" for n in range(1, 13)],  # a camera: one prefix, no id
    [f"DCIM/{folder}/IMG_{n:04d}.jpg" for folder in ("100CANON", "101CANON", "102CANON") for n in range(1, 5)],
    [f"{c}/{c}_{n:04d}.jpg" for c in ("cat", "dog", "bird") for n in range(1, 5)],  # class names, no digit
    [f"scan{n}_0000.png" for n in range(1, 9)],  # one file a case
    [f"video{v}_{n:04d}.png" for v in range(1, 4) for n in range(40)],  # frames: 40 a video, not a patient's files
])
def test_names_ending_in_four_digits_that_group_no_cases_are_not_warned_of(tmp_path: Path, names: list[str]) -> None:
    root = tmp_path / "photos"
    for i, name in enumerate(names):
        _photo(root / name, i)
    assert _leakage(discover(load_job(_job(tmp_path, "image", root))).warnings) == []


def test_an_image_source_of_channel_files_is_offered_the_entity_but_not_channel_files(tmp_path: Path) -> None:
    """The same rule on photos (an nnU-Net 2-D set, ``case_001_0000.png``): a kind without channel_files
    is offered the entity only."""
    root = tmp_path / "Dataset120_RoadSeg" / "imagesTr"
    for i in range(1, 5):
        for ch in range(2):
            _photo(root / f"road_{i:03d}_{ch:04d}.png", 10 * i + ch)
    (warning,) = _leakage(discover(load_job(_job(tmp_path, "image", root))).warnings)
    assert "'road_001' of 'road_001_0000.png' (entity: {path: '^(?P<entity>[^/]+)_\\d{4}\\.[^/]*$'})" in warning
    assert "channel_files" not in warning


# -- README's BraTS recipe: the case table script, on the releases as they ship ------------------------

def _readme_brats_script() -> str:
    """The case-table script of README's "NIfTI volumes", as pasted."""
    section = (Path(__file__).resolve().parents[1] / "README.md").read_text().split("### NIfTI volumes", 1)[1]
    found = re.search(r"```sh\ncd data/brats && python - <<'PY'\n(.*?)\nPY\n```", section, re.S)
    assert found is not None, "README's NIfTI section holds no BraTS case-table script"
    return found.group(1)


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])  # BraTS 2020 (Kaggle) ships .nii; other releases .nii.gz
def test_readmes_brats_table_script_names_the_files_each_release_ships(tmp_path: Path, suffix: str) -> None:
    """Run as pasted in a BraTS folder, the script writes a table whose every cell names a file on disk,
    and README's BraTS source reads it: one sample a case, its sequences as channel files."""
    brats = tmp_path / "data" / "brats"
    for i in range(1, 4):
        case = f"BraTS20_Training_{i:03d}"
        for k, sequence in enumerate(("t1", "t1ce", "t2", "flair", "seg")):
            _volume(brats / case / f"{case}_{sequence}{suffix}", 10 * i + k, labels=sequence == "seg")
    subprocess.run([sys.executable, "-c", _readme_brats_script()], cwd=brats, check=True)
    with (brats / "cases.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["entity"] for row in rows] == [f"BraTS20_Training_{i:03d}" for i in range(1, 4)]
    for row in rows:
        for column in ("path", "t1ce", "t2", "flair", "seg"):
            assert row[column].endswith(suffix) and (brats / row[column]).is_file(), (column, row[column])
    found = discover(load_job(_job(tmp_path, "nifti", brats, table=str(brats / "cases.csv"),
                                   channel_files=["t1ce", "t2", "flair"],
                                   mask={"column": "seg", "classes": [0, 1, 2, 4]})))
    assert found.issues == []
    assert sorted(ref.relpath for ref in found.refs) == [row["path"] for row in rows]
