"""Batches through DataLoader workers: mixed shapes cross as one block and arrive as the same tensors."""

from __future__ import annotations

import copy
import io
import multiprocessing.reduction
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory reductions with ForkingPickler)
from loader_fixtures import build_dataset, sample_image, split_keys
from torch.utils.data import DataLoader

import packer.loader.dataloader as dataloader_module
from packer.loader import ImageBatch, ShardDataset, collate_samples, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

MIXED = [(2, 4, 4), (3, 4, 4), (3, 4, 4)]   # CT windows and RGB, as in a real mixed split
SIZES = (7, 6, 4)


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("collate")
    return {
        "mixed": build_dataset(root / "mixed", shard_sizes=SIZES, shapes=MIXED),
        "uniform": build_dataset(root / "uniform", shard_sizes=SIZES, shape=(3, 4, 4)),
    }


def expected_image(key: str, shapes: list[tuple[int, ...]] | None) -> np.ndarray:
    index = int(key[1:])
    return sample_image(index, shapes[index % len(shapes)] if shapes else (3, 4, 4))


@pytest.mark.parametrize("kind", ["mixed", "uniform"])
def test_workers_hand_over_the_same_batches_as_the_main_process(manifests, kind):
    dataset = ShardDataset(manifests[kind], "train", seed=1, shuffle_buffer=4)
    with make_loader(dataset, 5, 2) as workers:
        through_workers = list(workers)
    in_process = list(make_loader(ShardDataset(manifests[kind], "train", seed=1, shuffle_buffer=4), 5, 0))
    assert [b["key"] for b in through_workers] == [b["key"] for b in in_process]
    lists = 0
    for got, want in zip(through_workers, in_process, strict=True):
        assert torch.equal(got["label"], want["label"])
        if isinstance(want["image"], torch.Tensor):     # every shape in the batch the same: stacked
            assert isinstance(got["image"], torch.Tensor) and got["image"].shape == want["image"].shape
            assert torch.equal(got["image"], want["image"])
        else:
            lists += 1
            assert type(got["image"]) is ImageBatch and isinstance(got["image"], list)
            assert len(got["image"]) == len(want["image"])
            for a, b in zip(got["image"], want["image"], strict=True):
                assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape and a.is_contiguous()
                assert torch.equal(a, b)
    assert (lists > 0) == (kind == "mixed")


@pytest.mark.parametrize("kind", ["mixed", "uniform"])
def test_plain_dataloader_with_collate_samples_gets_lists_for_mixed_shapes(manifests, kind):
    shapes = MIXED if kind == "mixed" else None
    loader = DataLoader(ShardDataset(manifests[kind], "train", seed=2), batch_size=4, num_workers=2,
                        collate_fn=collate_samples)
    keys = []
    for batch in loader:
        keys += batch["key"]
        mixed = len({expected_image(key, shapes).shape for key in batch["key"]}) > 1
        if mixed:
            assert type(batch["image"]) is ImageBatch
        else:
            assert isinstance(batch["image"], torch.Tensor) and batch["image"].ndim == 4
        for image, key in zip(batch["image"], batch["key"], strict=True):
            assert np.array_equal(image.numpy(), expected_image(key, shapes))
    assert sorted(keys) == split_keys(sum(SIZES))


def test_images_from_a_worker_share_one_storage_but_not_their_bytes(manifests):
    loader = DataLoader(ShardDataset(manifests["mixed"], "train", shuffle=False), batch_size=6, num_workers=1,
                        collate_fn=collate_samples)
    batch = next(iter(loader))
    images = batch["image"]
    assert len({im.untyped_storage().data_ptr() for im in images}) == 1
    images[0].fill_(255)        # a caller writing into one sample changes no other
    assert (images[0] == 255).all()
    for image, key in zip(images[1:], batch["key"][1:], strict=True):
        assert np.array_equal(image.numpy(), expected_image(key, MIXED))


def count_fds_sent(obj: object, monkeypatch: pytest.MonkeyPatch) -> int:
    """File descriptors torch hands over when ``obj`` is pickled as a DataLoader worker does."""
    sent = 0
    real = multiprocessing.reduction.DupFd

    def counting(fd: int):
        nonlocal sent
        sent += 1
        return real(fd)

    monkeypatch.setattr(multiprocessing.reduction, "DupFd", counting)
    multiprocessing.reduction.ForkingPickler(io.BytesIO()).dump(obj)
    return sent


def test_a_worker_batch_of_mixed_shapes_crosses_as_one_block(monkeypatch):
    items = [{"image": torch.full(shape, i, dtype=torch.uint8), "label": torch.tensor(i), "key": f"k{i}"}
             for i, shape in enumerate(MIXED * 5)]
    # as a list of separate tensors: one shared-memory block (and fd round trip) per image
    assert count_fds_sent([it["image"].clone() for it in items], monkeypatch) == 15
    monkeypatch.setattr(dataloader_module, "get_worker_info", lambda: object())
    batch = collate_samples(items)
    assert type(batch["image"]) is ImageBatch
    assert count_fds_sent(batch, monkeypatch) == 2      # the images' block and the labels
    uniform = collate_samples([{**it, "image": torch.full((3, 4, 4), 1, dtype=torch.uint8)} for it in items])
    assert uniform["image"].is_shared() and count_fds_sent(uniform, monkeypatch) == 2


def test_image_batch_pickles_to_equal_tensors_whatever_its_content():
    ragged = ImageBatch([torch.arange(8, dtype=torch.int16).view(2, 2, 2), torch.ones(1, 3, 3, dtype=torch.int16)])
    back = pickle.loads(pickle.dumps(ragged))
    assert type(back) is ImageBatch and [t.shape for t in back] == [t.shape for t in ragged]
    assert all(torch.equal(a, b) and a.dtype == torch.int16 for a, b in zip(back, ragged, strict=True))
    # a batch changed after it was packed is packed afresh, not sent stale
    back[1] = torch.zeros(2, 1, 1, dtype=torch.int16)
    again = pickle.loads(pickle.dumps(back))
    assert [tuple(t.shape) for t in again] == [(2, 2, 2), (2, 1, 1)] and not again[1].any()
    # images that cannot share one tensor (two dtypes) pickle as a list would
    odd = ImageBatch([torch.ones(2, dtype=torch.uint8), torch.ones(3, dtype=torch.float32)])
    assert [t.dtype for t in pickle.loads(pickle.dumps(odd))] == [torch.uint8, torch.float32]
    # a shallow copy holds the same tensors; a deep copy equal ones
    assert all(a is b for a, b in zip(copy.copy(ragged), ragged, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(copy.deepcopy(back), back, strict=True))


def test_collate_outside_workers_keeps_the_items_tensors():
    items = [{"image": torch.zeros(shape, dtype=torch.uint8), "label": torch.tensor(0), "key": "k"}
             for shape in MIXED]
    batch = collate_samples(items)
    assert type(batch["image"]) is ImageBatch
    assert all(a is it["image"] for a, it in zip(batch["image"], items, strict=True))
