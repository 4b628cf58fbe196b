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
import torch

from packer.config import load_job
from packer.errors import ConfigError
from packer.loader import DevicePrefetcher, MixedShapesError, ShardDataset, collate_pad, collate_stack, make_loader
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


@pytest.fixture(scope="module")
def two_windows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two CT volumes of one size and two windows: every sample 2×4×8×8."""
    return _nifti_volumes(tmp_path_factory.mktemp("two-windows"), [(24, 24, 12), (20, 24, 10)],
                          {"windows": ["abdomen", "liver"], "sample": {"volume": {"size": [4, 8, 8]}}})


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


# -- the stacking collate: no collate="pad" where pad refuses the batch ------------------------------------------


def test_the_stack_error_for_volumes_of_several_sizes_offers_only_what_loads_them(two_sizes: Path) -> None:
    """It ended '(collate="pad" pads height and width)', and collate="pad" refuses that very batch."""
    with pytest.raises(MixedShapesError) as stacked:
        next(iter(make_loader(ShardDataset(two_sizes, "train", shuffle=False), 2, 0)))
    said = str(stacked.value)
    assert VOLUME_SIZE in said and 'collate="list"' in said, said
    assert 'collate="pad"' not in said and "transform.<kind>.size" not in said, said
    with pytest.raises(MixedShapesError, match="volumes of several sizes"):  # what the old advice led to
        next(iter(make_loader(ShardDataset(two_sizes, "train", shuffle=False), 2, 0, collate="pad")))
    listed = next(iter(make_loader(ShardDataset(two_sizes, "train", shuffle=False), 2, 0, collate="list")))
    assert sorted(tuple(im.shape) for im in listed["image"]) == [(1, 10, 24, 20), (1, 12, 24, 24)]


def test_a_transform_that_gives_volumes_several_sizes_is_not_offered_pad() -> None:
    items = [{"image": torch.zeros(shape, dtype=torch.uint8), "key": f"ct-{i}"}
             for i, shape in enumerate([(1, 4, 8, 8), (1, 3, 8, 8)])]
    with pytest.raises(MixedShapesError) as stacked:
        collate_stack(items, shapes={"ct": [[1, 6, 8, 8]]}, transforms=("crop",))
    said = str(stacked.value)
    assert "crop" in said and 'collate="list"' in said and 'collate="pad"' not in said, said


@pytest.mark.parametrize(("shapes", "pad_offered"), [
    ([(3, 40, 48), (3, 48, 40)], True),               # 2-D images of one channel count: pad pads them
    ([(1, 32, 32), (3, 48, 48)], False),              # channel counts differ: pad refuses them
    ([(1, 4, 32, 40), (1, 4, 48, 24)], False),        # volumes of two sizes: pad refuses them
])
def test_pad_is_offered_only_where_it_loads_the_batch(shapes: list[tuple[int, ...]], pad_offered: bool) -> None:
    items = [{"image": torch.zeros(shape, dtype=torch.uint8), "key": str(i)} for i, shape in enumerate(shapes)]
    with pytest.raises(MixedShapesError) as stacked:
        collate_stack(items)
    said = str(stacked.value)
    assert ('collate="pad"' in said) is pad_offered and 'collate="list"' in said, said
    if pad_offered:  # and pad does load it
        assert collate_pad(items)["image"].shape == (2, 3, 48, 48)
    else:
        with pytest.raises(MixedShapesError):
            collate_pad(items)
    # volumes are told their own size setting only; 2-D images the kind's
    assert (VOLUME_SIZE in said) is (len(shapes[0]) == 4), said
    assert ("transform.<kind>.size" in said) is (len(shapes[0]) == 3), said


# -- DevicePrefetcher: mean/std against the channel count ----------------------------------------------------------


def test_three_means_on_a_9_channel_2_5d_stack_are_refused_naming_mean_and_the_slice_major_channels() -> None:
    """3 slices × 3 windows: torch said only 'The size of tensor a (9) must match the size of tensor b (3)'."""
    batch = {"image": torch.zeros(2, 9, 8, 8, dtype=torch.uint8), "key": ["a", "b"]}
    with pytest.raises(ValueError) as refused:
        next(iter(DevicePrefetcher([batch], "cpu", mean=(0.5, 0.4, 0.3), std=(0.25,))))
    said = str(refused.value)
    assert "mean has 3 values" in said and "9 channels" in said, said
    assert "one value per channel (9) or one for all" in said and "slice-major" in said, said
    assert "mean=(0.5, 0.4, 0.3) * 3" in said, said  # the per-window values repeated for each slice


def test_a_std_that_fits_no_volume_channel_count_is_refused_by_name() -> None:
    volume = {"image": torch.zeros(2, 2, 4, 8, 8, dtype=torch.uint8), "key": ["a", "b"]}  # B×C×D×H×W, C=2
    with pytest.raises(ValueError) as refused:
        next(iter(DevicePrefetcher([volume], "cpu", mean=(0.5,), std=(0.25, 0.25, 0.25))))
    said = str(refused.value)
    assert "std has 3 values" in said and "2 channels" in said and "mean has" not in said, said


def test_a_list_batch_is_checked_image_by_image() -> None:
    batch = {"image": [torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(2, 6, 6, dtype=torch.uint8)],
             "key": ["a", "b"]}
    with pytest.raises(ValueError, match="mean has 3 values.*2 channels"):
        next(iter(DevicePrefetcher([batch], "cpu", mean=(0.5, 0.4, 0.3))))


def test_one_value_or_one_per_channel_normalises_each_channel() -> None:
    image = torch.full((1, 9, 2, 2), 255, dtype=torch.uint8)
    (one,) = DevicePrefetcher([{"image": image}], "cpu", mean=(0.5,), std=(0.25,))
    assert torch.allclose(one["image"], torch.full_like(one["image"], 2.0))
    means = tuple(float(i) / 10 for i in range(9))
    (each,) = DevicePrefetcher([{"image": image}], "cpu", mean=means, std=(1.0,) * 9)
    assert torch.allclose(each["image"][0, :, 0, 0], torch.tensor([1 - m for m in means]))


def test_a_loader_of_known_channels_is_checked_when_the_prefetcher_is_made(two_windows: Path) -> None:
    loader = make_loader(ShardDataset(two_windows, "train", shuffle=False), 2, 0)
    with pytest.raises(ValueError) as refused:
        DevicePrefetcher(loader, "cpu", mean=(0.5, 0.4, 0.3), std=(0.25, 0.25, 0.25))
    said = str(refused.value)
    assert "mean has 3 values" in said and "the dataset's samples have 2 channels" in said, said
    (batch,) = DevicePrefetcher(loader, "cpu", mean=(0.5, 0.4), std=(0.25,))
    assert batch["image"].shape == (2, 2, 4, 8, 8)
    # a transform= may change the channel count: then only the batches say it
    def three(image: torch.Tensor) -> torch.Tensor:
        return image[:1].expand(3, *image.shape[1:]).clone()
    grown = make_loader(ShardDataset(two_windows, "train", shuffle=False, transform=three), 2, 0)
    (batch,) = DevicePrefetcher(grown, "cpu", mean=(0.5, 0.4, 0.3), std=(0.25,))
    assert batch["image"].shape == (2, 3, 4, 8, 8)
