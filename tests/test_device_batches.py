"""DevicePrefetcher and the images a transform or a collate of your own hands it.

The prefetcher converts a dict batch's ``image`` to float32 and normalises it per channel along
the channel axis (C first in each image). ``collate="list"`` and a collate of your own take
whatever a transform returns, so an image may reach the prefetcher as a tuple (``zip(*...)``) or
a numpy array; the prefetcher converts every tensor it is given and names anything else, with
the fix, instead of an AttributeError or a silent pass-through of uint8 pixels.
"""

from __future__ import annotations

import warnings
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


def zip_collate(items: list[dict]) -> dict:
    """The common ``zip(*...)`` idiom of a collate of your own: the images come as a tuple."""
    images, keys = zip(*[(item["image"], item["key"]) for item in items], strict=True)
    return {"image": images, "key": list(keys)}


def numpy_collate(items: list[dict]) -> dict:
    """A collate of your own that stacks the images as numpy (B×C×H×W)."""
    return {"image": np.stack([item["image"].numpy() for item in items]), "key": [item["key"] for item in items]}


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


def test_a_tuple_of_images_is_converted_and_normalised_as_a_list_is(manifest):
    """A collate of your own returning {"image": tuple_of_tensors} got its uint8 pixels handed out
    moved but unconverted and unnormalised, although mean and std were given."""
    listed = make_loader(ShardDataset(manifest, "train", shuffle=False), 4, collate="list")
    zipped = make_loader(ShardDataset(manifest, "train", shuffle=False), 4, collate=zip_collate)
    raw = next(iter(listed))["image"]
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 0.125)
    expected = next(iter(DevicePrefetcher(listed, "cpu", mean=mean, std=std)))["image"]
    batch = next(iter(DevicePrefetcher(zipped, "cpu", mean=mean, std=std)))
    assert type(batch["image"]) is tuple and len(batch["image"]) == 4
    for got, want, pixels in zip(batch["image"], expected, raw, strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, want)
        by_hand = (pixels.double() / 255 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
        assert torch.allclose(got.double(), by_hand, atol=1e-6)


def test_a_tuple_image_with_a_numpy_element_is_refused_too(manifest):
    batch = {"image": (torch.zeros(3, 4, 5, dtype=torch.uint8), np.zeros((3, 4, 5), np.uint8)), "key": ["a", "b"]}
    with pytest.raises(ImageTypeError, match=r"^DevicePrefetcher: batch\['image'\]\[1\] \(sample b\) is a "
                                             r"numpy\.ndarray 3×4×5, uint8, not a torch\.Tensor"):
        next(iter(DevicePrefetcher([batch], "cpu")))


@pytest.mark.parametrize("normalise", [{"mean": (0.5,), "std": (0.25,)}, {}], ids=["mean-std", "plain"])
def test_a_numpy_batch_image_is_refused_instead_of_passed_through_unconverted(manifest, normalise):
    """A dict batch whose image a collate of your own stacked as numpy passed through unmoved and
    unconverted: uint8 0..255 where the prefetcher promises float32 (normalised where asked)."""
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False), 4, collate=numpy_collate)
    with pytest.raises(ImageTypeError) as caught:
        next(iter(DevicePrefetcher(loader, "cpu", **normalise)))
    message = str(caught.value)
    assert message.startswith("DevicePrefetcher: batch['image'] is a numpy.ndarray 4×3×4×5, uint8, not a "
                              "torch.Tensor")
    assert "torch.from_numpy" in message and "B×C×H×W" in message


@pytest.mark.parametrize("image", [None, "pixels", 3.0], ids=["none", "str", "float"])
def test_any_other_image_type_is_named(image):
    with pytest.raises(ImageTypeError, match=rf"^DevicePrefetcher: batch\['image'\] is a {type(image).__name__}"):
        next(iter(DevicePrefetcher([{"image": image, "key": ["a"]}], "cpu")))


def test_a_batch_without_an_image_name_is_still_moved_as_it_is(manifest):
    """Only a dict batch's "image" is converted: a tuple batch or a dict of other names is moved, not refused."""
    pairs = [(np.zeros(2), torch.ones(2, dtype=torch.uint8)), {"pixels": np.zeros(2), "label": torch.ones(2)}]
    tuple_batch, dict_batch = DevicePrefetcher(pairs, "meta")
    assert isinstance(tuple_batch[0], np.ndarray) and tuple_batch[1].device.type == "meta"
    assert tuple_batch[1].dtype == torch.uint8 and dict_batch["label"].device.type == "meta"


def test_cuda_on_a_machine_without_it_is_packers_config_error_not_torchs_runtime_error(monkeypatch):
    """DevicePrefetcher(loader, "cuda") without CUDA raised torch's 'torch.cuda.Stream requires CUDA
    support' where the CLI's --device check names the device and the fix."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^DevicePrefetcher\(loader, 'cuda'\): CUDA is not available here "
                                          r"\(torch .*\); use DevicePrefetcher\(loader, 'cpu'\)"):
        DevicePrefetcher([], "cuda")
    with pytest.raises(ConfigError, match=r"^DevicePrefetcher\(loader, 'gpu'\) is not a torch device"):
        DevicePrefetcher([], "gpu")


def test_tensor_mean_and_std_are_taken_without_torchs_copy_construct_warning():
    batch = {"image": torch.full((2, 3, 2, 2), 51, dtype=torch.uint8), "key": ["a", "b"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prefetcher = DevicePrefetcher([batch], "cpu", mean=torch.tensor([0.2, 0.1, 0.0]), std=torch.tensor([0.5]))
        (out,) = prefetcher
    assert torch.allclose(out["image"][:, 0], torch.zeros(2, 2, 2), atol=1e-6)
    assert torch.allclose(out["image"][:, 2], torch.full((2, 2, 2), 0.4), atol=1e-6)


def test_an_int_device_is_cuda_n_as_torch_takes_it(monkeypatch):
    """DDP's device=local_rank: torch.device(0) is cuda:0, but the check was given str(0), '0', and
    refused it as 'not a torch device' (a regression of the usable_device check)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)
    assert DevicePrefetcher([], 1).device == torch.device("cuda", 1)
    assert DevicePrefetcher([], np.int64(1)).device == torch.device("cuda", 1)  # np.argmin of the free memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^DevicePrefetcher\(loader, 0\): CUDA is not available here"):
        DevicePrefetcher([], 0)
