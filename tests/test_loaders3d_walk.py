"""Volumes and 2.5D stacks through the loader and the examples: every message that meets them offers
only what packer accepts for them (a volume's size is sample: {volume: {size: [D, H, W]}}, never
transform.<kind>.size; collate="pad" pads only 2-D images), and DevicePrefetcher's mean/std are
checked against the channel count instead of failing in torch's broadcast."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import nibabel as nib
import numpy as np
import pytest

from packer.config import load_job
from packer.errors import ConfigError
from tests.helpers import REPO
from tests.test_targets import _build, _job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

VOLUME_SIZE = "sample: {volume: {size: [D, H, W]}}"


def _nifti_volumes(tmp: Path, shapes: list[tuple[int, int, int]], transform: dict[str, Any]) -> Path:
    """A built dataset of one NIfTI CT case per shape (x, y, z voxels), packed as volumes; its version folder."""
    raw = tmp / "raw"
    raw.mkdir(parents=True)
    rows = ["path,entity"]
    for i, shape in enumerate(shapes):
        data = (np.arange(np.prod(shape)).reshape(shape) % 400 - 100).astype(np.int16)
        nib.save(nib.Nifti1Image(data, np.diag([1.5, 1.5, 3.0, 1.0])), raw / f"case{i}.nii.gz")
        rows.append(f"case{i}.nii.gz,C{i}")
    (raw / "cases.csv").write_text("\n".join(rows) + "\n")
    source = {"kind": "nifti", "root": str(raw), "table": str(raw / "cases.csv"), "label": "none"}
    job = _job(tmp, [source], transform={"nifti": transform}, validate={"max_bad_fraction": 0.0})
    return _build(job).version_dir


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two CT volumes of their own sizes (1×12×24×24 and 1×10×24×20): no sample: {volume: {size}}."""
    return _nifti_volumes(tmp_path_factory.mktemp("two-sizes"), [(24, 24, 12), (20, 24, 10)],
                          {"windows": ["abdomen"], "sample": "volume"})


@pytest.fixture
def train3d(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """examples/train3d.py as a module; it imports examples/train.py, found beside it as when run as a script."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = importlib.util.spec_from_file_location("packer_example_train3d_walk", REPO / "examples" / "train3d.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# -- examples/train3d.py: volumes of several sizes are told the volume size --------------------------------------


def test_train3d_on_volumes_of_several_sizes_advises_the_volume_size_packer_accepts(
        two_sizes: Path, train3d: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """It advised transform.<kind>.size (transform.image.size: [224, 224]), which load_job refuses
    for volumes ("a volume's size and spacing are 3-D")."""
    with pytest.raises(SystemExit) as refused:
        train3d.main(["--manifest", str(two_sizes), "--epochs", "1", "--device", "cpu", "--workers", "0"])
    said = capsys.readouterr().err
    assert refused.value.code == 2, said
    assert "1×10×24×20" in said and "1×12×24×24" in said, said
    assert VOLUME_SIZE in said and "transform.<kind>.size" not in said and "transform.image.size" not in said, said
    # the advice taken: the job with a volume size loads (the old advice does not)
    source = {"kind": "nifti", "root": str(tmp_path), "label": "none"}
    taken = _job(tmp_path / "taken", [source], transform={"nifti": {"sample": {"volume": {"size": [8, 24, 24]}}}})
    assert load_job(taken).sources
    with pytest.raises(ConfigError, match="a volume's size and spacing are 3-D"):
        load_job(_job(tmp_path / "old", [source], transform={"nifti": {"sample": "volume", "size": [24, 24]}}))
