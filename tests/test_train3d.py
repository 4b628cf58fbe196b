"""examples/train3d.py: trains on packed volumes (CDHW), DICOM series and NIfTI cases with label maps
alike, and sends a 2-D dataset to examples/train.py."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers import REPO
from tests.test_series import _write_series
from tests.test_targets import _build, _ct, _job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

VOLUME = {"dicom": {"windows": [{"center": 1000, "width": 3000}],
                    "sample": {"volume": {"spacing": [3, 1, 1], "size": [6, 16, 16]}}}}
#: workflows/nifti-volume.yaml's job, coarser (10×12×12 mm voxels) so that a CPU trains it in seconds
NIFTI_VOLUME = {"nifti": {"windows": ["abdomen", "liver"],
                          "sample": {"volume": {"spacing": [10, 12, 12], "size": [16, 32, 32]}}}}


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """examples/train3d.py as a module; it imports examples/train.py, found beside it as when run as a script."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = importlib.util.spec_from_file_location("packer_example_train3d", REPO / "examples" / "train3d.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _volumes(tmp: Path, source: dict[str, Any]) -> Path:
    for i in range(3):
        _write_series(tmp / "raw" / ("ab"[i % 2]) / f"s{i}", seed=i, patient=f"P{i}")
    return _build(_job(tmp, [{"kind": "dicom", "root": str(tmp / "raw"), **source}], transform=VOLUME)).version_dir


def _run(example: ModuleType, version: Path, *extra: str) -> dict[str, Any]:
    return example.main(["--manifest", str(version), "--epochs", "1", "--batch-size", "2", "--workers", "0",
                         "--device", "cpu", *extra])


def test_unlabeled_volumes_train_an_epoch_of_denoising(tmp_path: Path, example: ModuleType,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    done = _run(example, _volumes(tmp_path, {"label": "none"}))
    assert done["objective"] == "unlabeled: denoising reconstruction"
    assert done["steps"] == 2 and len(done["keys"]) == 3  # 3 series, batches of 2
    assert all(math.isfinite(loss) for loss in done["losses"])
    assert re.search(r"^epoch 0: step 2, last loss [0-9.]+ \(unlabeled: denoising reconstruction\)$",
                     capsys.readouterr().out, flags=re.M)


def test_class_volumes_train_with_cross_entropy_and_resume(tmp_path: Path, example: ModuleType) -> None:
    version = _volumes(tmp_path, {"label": {"folder": True}})
    ckpt = tmp_path / "ckpt.pt"
    first = _run(example, version, "--checkpoint", str(ckpt), "--max-steps", "1")
    assert first["objective"] == "class: 2 classes" and first["steps"] == 1
    rest = _run(example, version, "--checkpoint", str(ckpt), "--resume")
    assert rest["steps"] == 2 and sorted(first["keys"] + rest["keys"]) == sorted(_run(example, version)["keys"])
    assert all(math.isfinite(loss) for loss in first["losses"] + rest["losses"])


def test_a_2d_dataset_is_refused_with_a_pointer_to_train_py(tmp_path: Path, example: ModuleType,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A dataset of the wrong dimension is a usage error, exit 2, as a missing manifest is (it
    exited 1, packer's "internal error", while the missing manifest exited 2)."""
    raw = tmp_path / "raw"
    for i in range(2):
        _ct(raw, f"p{i}/slice.dcm", f"P{i}", i)
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(raw), "label": "none"}]))
    with pytest.raises(SystemExit) as wrong:
        _run(example, result.version_dir)
    assert wrong.value.code == 2
    assert re.match(r"train3d\.py: .* holds 2-D samples \(layout CHW.*examples/train\.py", capsys.readouterr().err)
    with pytest.raises(SystemExit) as missing:
        _run(example, tmp_path / "no-such-version")
    assert missing.value.code == 2 and capsys.readouterr().err.startswith("train3d.py: ")


def test_train_py_refuses_volumes_with_exit_2_as_it_refuses_a_missing_manifest(
        tmp_path: Path, example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/train.py given volumes: exit 2 and a pointer to train3d.py, on stderr; it exited
    1 (packer's "internal error") while a missing manifest exited 2 (README, exit codes)."""
    version = _volumes(tmp_path, {"label": "none"})
    flat = example.shared  # examples/train.py, as train3d.py imports it
    args = ["--epochs", "1", "--batch-size", "2", "--workers", "0", "--device", "cpu"]
    with pytest.raises(SystemExit) as volumes:
        flat.main(["--manifest", str(version), *args])
    said = capsys.readouterr().err
    assert volumes.value.code == 2, said
    assert re.match(r"train\.py: .* holds volumes \(layout CDHW.*\); train them with examples/train3d\.py", said)
    with pytest.raises(SystemExit) as missing:
        flat.main(["--manifest", str(tmp_path / "no-such-version"), *args])
    assert missing.value.code == 2 and capsys.readouterr().err.startswith("train.py: ")


@pytest.fixture(scope="module")
def nifti_volumes(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's NIfTI CT cases with their label maps as volumes (its broken files are bad samples)."""
    ct = demo_raw.root / "nifti" / "ct"
    source = {"kind": "nifti", "root": str(ct), "table": str(ct / "cases.csv"), "label": "none",
              "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}
    tmp = tmp_path_factory.mktemp("nifti-volumes")
    job = _job(tmp, [source], transform=NIFTI_VOLUME, validate={"max_bad_fraction": 0.5})
    return _build(job).version_dir


def test_nifti_volumes_with_label_maps_train_a_3d_segmentation(nifti_volumes: Path, example: ModuleType,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    done = _run(example, nifti_volumes, "--epochs", "3")
    assert done["objective"] == "segmentation: 4 classes, 3-D"
    assert done["steps"] == 15 and len(done["keys"]) == 27  # 9 cases packed (8 planted broken), batches of 2
    assert all(math.isfinite(loss) for loss in done["losses"])
    assert sum(done["losses"][-3:]) < sum(done["losses"][:3])  # it learns
    assert re.search(r"^epoch 2: step 15, last loss [0-9.]+ \(segmentation: 4 classes, 3-D\)$",
                     capsys.readouterr().out, flags=re.M)


def test_the_3d_segmenter_gives_logits_on_the_masks_voxels(example: ModuleType) -> None:
    import torch

    model = example.UNet3d(channels=2, classes=4)
    for shape in ((16, 32, 32), (7, 15, 13)):  # odd sizes too: the coarse level is upsampled to fit
        assert tuple(model(torch.zeros(2, 2, *shape)).shape) == (2, 4, *shape)


def test_soft_dice_is_zero_for_a_perfect_prediction_and_skips_the_ignored_id(example: ModuleType) -> None:
    import torch

    mask = torch.zeros(1, 4, 4, 4, dtype=torch.long)
    mask[0, :2] = 1
    mask[0, 3, 3, 3] = 2
    perfect = torch.nn.functional.one_hot(mask, 3).movedim(-1, 1).float() * 50
    assert example.soft_dice_loss(perfect, mask, 3, None).item() == pytest.approx(0.0, abs=1e-6)
    wrong = perfect.roll(1, dims=1)  # every voxel predicted as the next class
    assert example.soft_dice_loss(wrong, mask, 3, None).item() > 0.9
    padded = mask.clone()
    padded[0, 2] = 2                  # class 2 as the pad id: predictions there do not count
    ignored, counted = (example.soft_dice_loss(perfect, padded, 3, pad).item() for pad in (2, None))
    assert ignored < 0.01 < counted
