"""DevicePrefetcher and the images a transform or a collate of your own hands it.

The prefetcher converts a dict batch's ``image`` to float32 and normalises it per channel along
the channel axis (C first in each image). ``collate="list"`` and a collate of your own take
whatever a transform returns, so an image may reach the prefetcher as a tuple (``zip(*...)``) or
a numpy array; the prefetcher converts every tensor it is given and names anything else, with
the fix, instead of an AttributeError or a silent pass-through of uint8 pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from loader_fixtures import build_dataset

from packer.errors import ConfigError
from packer.loader import DevicePrefetcher, ImageTypeError, ShardDataset, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("device-batches"), shape=(3, 4, 5), shard_sizes=(4, 3))


def hwc_numpy(image: torch.Tensor) -> np.ndarray:
    """An albumentations-style transform without ToTensorV2(): H×W×C numpy."""
    return image.numpy().transpose(1, 2, 0)


def test_a_list_of_numpy_images_is_refused_naming_the_sample_the_type_and_the_fix(manifest):
    """collate="list" took the H×W×C arrays as documented, and the prefetcher died with a bare
    AttributeError ('numpy.ndarray' object has no attribute 'to')."""
    loader = make_loader(ShardDataset(manifest, "train", transform=hwc_numpy, shuffle=False), 4, collate="list")
    keys = next(iter(loader))["key"]
    with pytest.raises(ImageTypeError) as caught:
        next(iter(DevicePrefetcher(loader, "cpu", mean=(0.5,), std=(0.25,))))
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, TypeError)
    assert message.startswith(f"DevicePrefetcher: batch['image'][0] (sample {keys[0]}) is a numpy.ndarray 4×5×3, "
                              "uint8, not a torch.Tensor")
    assert "C×H×W" in message and "torch.from_numpy(image.transpose(2, 0, 1))" in message
    assert "ToTensorV2()" in message
