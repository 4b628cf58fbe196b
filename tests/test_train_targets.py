"""examples/train.py on every target kind: it picks head and loss from the manifest and trains an epoch."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.helpers import REPO
from tests.test_masks import _ct_set, _photo_set, _photo_source
from tests.test_targets import _build, _ct, _job, _photo_table

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _example() -> ModuleType:
    """examples/train.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("packer_example_train", REPO / "examples" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _rows(columns: dict[str, list[str]]) -> list[dict[str, str]]:
    count = len(next(iter(columns.values())))
    return [{"path": f"{i}.png", **{c: v[i] for c, v in columns.items()}, "entity": f"E{i}",
             "timestamp": "2024-01-01"} for i in range(count)]


def _multilabel(tmp: Path) -> Path:
    raw = _photo_table(tmp, _rows({"findings": ["effusion|nodule", "", "nodule", "mass", "effusion", "mass|nodule"]}))
    return _job(tmp, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
                       "label": {"kind": "multilabel", "column": "findings"}}], labels=["effusion", "mass", "nodule"])


def _masked_multilabel(tmp: Path) -> Path:
    raw = _photo_table(tmp, _rows({"effusion": ["1.0", "-1.0", "0.0", "", "1.0", "-1.0"],
                                   "nodule": ["", "1.0", "-1.0", "0.0", "0.0", "1.0"]}))
    return _job(tmp, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
                       "label": {"kind": "multilabel", "columns": ["effusion", "nodule"], "uncertain": "ignore",
                                 "blank": "zeros"}}])


def _numeric(tmp: Path) -> Path:
    raw = _photo_table(tmp, _rows({"age": ["63", "41.25", "70", "55", "38", "80"],
                                   "dose": ["1.5", "0.125", "2", "1", "3", "0.5"]}))
    return _job(tmp, [{"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
                       "label": {"kind": "numeric", "columns": ["age", "dose"]}}])


def _unlabeled(tmp: Path) -> Path:
    raw = tmp / "raw"
    for i in range(6):
        _ct(raw, f"p{i}/slice.dcm", f"P{i}", i)
    return _job(tmp, [{"kind": "dicom", "root": str(raw), "label": "none"}])


def _masks(tmp: Path) -> Path:
    raw = _photo_set(tmp, [(60, 90), (90, 60), (48, 48), (40, 40), (50, 70), (70, 50)])
    return _job(tmp, [_photo_source(raw)], transform={"image": {"size": [32, 32], "color": "gray"}})


@pytest.mark.parametrize(("job", "objective"), [
    (_multilabel, "multilabel: 3 labels"),
    (_masked_multilabel, "multilabel: 2 labels (masked)"),
    (_numeric, "numeric: age, dose"),
    (_unlabeled, "unlabeled: denoising reconstruction"),
    (_masks, "segmentation: 4 classes"),  # mask classes [0, 1, 2, 3] and 255, the pad: ignored, not a class
])
def test_the_example_trains_an_epoch_on_every_target_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, job: Any,
                                                          objective: str) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = _build(job(tmp_path))
    done = _example().main(["--manifest", str(result.version_dir), "--epochs", "1", "--batch-size", "2",
                            "--workers", "0", "--device", "cpu"])
    assert done["objective"] == objective
    assert done["steps"] == 3 and len(done["keys"]) == 6
    assert all(math.isfinite(loss) for loss in done["losses"])
    assert re.search(rf"^epoch 0: step 3, last loss [0-9.]+ \({re.escape(objective)}\)$", capsys.readouterr().out,
                     flags=re.M)


def test_masks_of_several_frames_stop_with_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    raw = _ct_set(tmp_path, frames=2)
    source = {"kind": "dicom", "root": str(raw), "labels": str(raw / "labels.csv"),
              "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}
    stacked = {"windows": [{"center": 250, "width": 2000}], "frames": "stack"}  # 2-frame images, 2-frame masks
    result = _build(_job(tmp_path, [source], transform={"dicom": stacked}))
    with pytest.raises(SystemExit) as stopped:
        _example().main(["--manifest", str(result.version_dir), "--epochs", "1", "--workers", "0", "--device", "cpu"])
    assert stopped.value.code == 2  # a dataset this example does not train: a usage error, as packer's table says
    assert "train.py: the masks have 2 frames; this example segments one" in capsys.readouterr().err


def test_the_masked_loss_averages_only_the_entries_the_mask_keeps() -> None:
    logits = torch.tensor([[10.0, -10.0], [0.0, 0.0]])
    batch = {"image": torch.zeros(2, 1), "target": torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
             "target_mask": torch.tensor([[1.0, 0.0], [1.0, 1.0]])}

    def model(image: torch.Tensor) -> torch.Tensor:
        return logits

    # BCE with logits of (10, 1) is log(1 + e^-10); of (0, 0) log 2; the masked (-10, 1) entry (about 10) is left out
    expected = (math.log1p(math.exp(-10)) + 2 * math.log(2)) / 3
    assert _example().masked_bce(model, batch).item() == pytest.approx(expected, rel=1e-6)
    unmasked = {k: v for k, v in batch.items() if k != "target_mask"}
    everything = (math.log1p(math.exp(-10)) + math.log1p(math.exp(10)) + 2 * math.log(2)) / 4
    assert _example().masked_bce(model, unmasked).item() == pytest.approx(everything, rel=1e-6)
    nothing = {**batch, "target_mask": torch.zeros(2, 2)}
    assert _example().masked_bce(model, nothing).item() == 0.0
