"""A user's ``ShardDataset(transform=...)`` meets the collates: what it returns that they cannot
batch is named as the transform's doing, not as a dataset of several shapes to rebuild.

The dataset: two image sources (``cats``, ``dogs``) of 16×16 RGB PNGs, built by packer; every
sample is 3×16×16 by the manifest, so any other shape in a batch is one a transform made."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.config import load_job
from packer.errors import ConfigError
from packer.loader import ImageTypeError, MixedShapesError, ShardDataset, collate_stack, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import write_job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def pets(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    root = tmp_path_factory.mktemp("user-transforms")
    for source in ("cats", "dogs"):
        for label in ("small", "large"):
            folder = root / source / label
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = np.random.default_rng([len(source), len(label), i]).integers(0, 256, (16, 16, 3), np.uint8)
                cv2.imwrite(str(folder / f"{label}{i}.png"), pixels)
    doc = {"name": "pets",
           "sources": [{"kind": "image", "root": str(root / s), "label": "folder", "name": s}
                       for s in ("cats", "dogs")],
           "split": {"by": "entity", "ratios": {"train": 1.0}, "seed": 1},
           "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(root / "out"), "phi": {"mode": "keep"}}
    return build(load_job(write_job(root, doc)), BuildOptions(scheduler="sync", quiet=True, html_report=False))


def hwc_numpy(image: torch.Tensor) -> np.ndarray:
    """What an albumentations pipeline without ToTensorV2 hands back: an H×W×C numpy array."""
    return np.ascontiguousarray(image.numpy().transpose(1, 2, 0))


def random_crop(image: torch.Tensor) -> torch.Tensor:
    """A crop of a random size: each sample its own height and width."""
    height, width = (int(n) for n in torch.randint(8, 17, (2,)))
    return image[:, :height, :width]


def first_batch(loader: Any) -> Any:
    try:
        return next(iter(loader))
    finally:
        getattr(loader, "close", lambda: None)()


def test_the_fixture_has_one_stored_shape(pets: BuildResult) -> None:
    assert pets.manifest["sample_schema"]["shapes"] == {"cats": [[3, 16, 16]], "dogs": [[3, 16, 16]]}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_returning_numpy_is_named_with_its_type_not_as_mixed_shapes(pets: BuildResult,
                                                                                 workers: int) -> None:
    loader = make_loader(ShardDataset(pets.manifest_path, "train", transform=hwc_numpy), batch_size=4,
                         num_workers=workers)
    with pytest.raises(ImageTypeError) as caught:
        first_batch(loader)
    message = str(caught.value)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ConfigError)
    assert "numpy.ndarray 16×16×3, uint8, not a torch.Tensor" in message
    assert "transform= (hwc_numpy)" in message  # the transform by name
    assert "ToTensorV2()" in message and "image.transpose(2, 0, 1)" in message and 'collate="list"' in message
    assert "mixes image shapes" not in message and "transform.channels" not in message  # no rebuild advice


def test_a_plain_dataloader_with_collate_stack_names_the_returned_type_too(pets: BuildResult) -> None:
    loader = DataLoader(ShardDataset(pets.manifest_path, "train", transform=hwc_numpy), batch_size=4,
                        num_workers=1, collate_fn=collate_stack)
    with pytest.raises(ImageTypeError) as caught:
        next(iter(loader))
    own = str(caught.value).split("\n\n")[0]  # its own message first, the worker's traceback after it
    assert own.startswith("sample ") and "numpy.ndarray" in own and "ShardDataset(..., transform=...)" in own


def test_collate_pad_names_a_non_tensor_image_apart_from_channel_counts(pets: BuildResult) -> None:
    loader = make_loader(ShardDataset(pets.manifest_path, "train", transform=hwc_numpy), batch_size=4,
                         collate="pad")
    with pytest.raises(ImageTypeError, match="numpy.ndarray .* collate='pad'"):
        first_batch(loader)


def test_the_list_collate_hands_over_whatever_the_transform_returns(pets: BuildResult) -> None:
    batch = first_batch(make_loader(ShardDataset(pets.manifest_path, "train", transform=hwc_numpy),
                                    batch_size=4, collate="list"))
    assert [type(image) for image in batch["image"]] == [np.ndarray] * 4
    assert {image.shape for image in batch["image"]} == {(16, 16, 3)}


def test_a_transform_that_varies_shapes_is_blamed_not_the_build_or_the_view(pets: BuildResult) -> None:
    dataset = ShardDataset(pets.manifest_path, "train", sources=["cats"], transform=random_crop)
    with pytest.raises(MixedShapesError) as caught:
        first_batch(make_loader(dataset, batch_size=8))
    message = str(caught.value)
    assert "this batch mixes image shapes" in message
    assert "are not shapes the build made (the manifest's: 3×16×16)" in message
    assert "transform= (random_crop) changed them" in message and "one shape for every sample" in message
    assert 'collate="list"' in message
    # a view of one source already: neither a view nor a rebuild would help
    assert "load one source at a time" not in message and "transform.channels" not in message
    assert "transform.<kind>.size" not in message


def test_a_transform_that_gives_every_sample_one_new_shape_stacks(pets: BuildResult) -> None:
    batch = first_batch(make_loader(ShardDataset(pets.manifest_path, "train", transform=lambda im: im[:, :8, :12]),
                                    batch_size=4))
    assert tuple(batch["image"].shape) == (4, 3, 8, 12)


def test_collate_stack_on_a_plain_dataloader_says_a_transform_may_have_made_the_shapes(pets: BuildResult) -> None:
    # no manifest's shapes to tell a transform's shapes from stored ones: the message says what to do if so
    items = list(ShardDataset(pets.manifest_path, "train", sources=["dogs"], transform=random_crop))[:4]
    assert len({item["image"].shape for item in items}) > 1
    with pytest.raises(MixedShapesError, match="where the dataset has a transform= that changes shapes .* make it "
                                               "return one shape for every sample"):
        collate_stack(items)
