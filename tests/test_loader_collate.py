"""Batches through DataLoader workers: mixed shapes cross as one block and arrive as the same tensors;
the stacking collate refuses them with a message that says what to do."""

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
from packer.loader import ImageBatch, MixedShapesError, ShardDataset, collate_list, collate_stack, make_loader

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


@pytest.mark.parametrize(("kind", "collate"), [("mixed", "list"), ("uniform", "stack")])
def test_workers_hand_over_the_same_batches_as_the_main_process(manifests, kind, collate):
    dataset = ShardDataset(manifests[kind], "train", seed=1, shuffle_buffer=4)
    with make_loader(dataset, 5, 2, collate=collate) as workers:
        through_workers = list(workers)
    in_process = list(make_loader(ShardDataset(manifests[kind], "train", seed=1, shuffle_buffer=4), 5, 0,
                                  collate=collate))
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
    assert (lists > 0) == (collate == "list")


@pytest.mark.parametrize("kind", ["mixed", "uniform"])
def test_plain_dataloader_with_collate_list_gets_lists_of_any_shapes(manifests, kind):
    shapes = MIXED if kind == "mixed" else None
    loader = DataLoader(ShardDataset(manifests[kind], "train", seed=2), batch_size=4, num_workers=2,
                        collate_fn=collate_list)
    keys = []
    for batch in loader:
        keys += batch["key"]
        assert type(batch["image"]) is ImageBatch
        for image, key in zip(batch["image"], batch["key"], strict=True):
            assert np.array_equal(image.numpy(), expected_image(key, shapes))
    assert sorted(keys) == split_keys(sum(SIZES))


def test_a_mixed_batch_is_refused_by_name_never_with_torchs_stack_error(manifests):
    dataset = ShardDataset(manifests["mixed"], "train", shuffle=False)
    # make_loader's default collate, through workers: raised in the main process with its own message
    with make_loader(dataset, 6, 2) as loader, pytest.raises(MixedShapesError) as caught:
        list(loader)
    message = str(caught.value)
    assert "Traceback" not in message and "stack expects" not in message
    assert "2×4×4 (2 sample(s), e.g. s00000)" in message and "3×4×4 (4 sample(s), e.g. s00001)" in message
    for fix in ("sources=[...]", "give every source the same number of channels (2, 3 here", 'collate="list"'):
        assert fix in message
    # transform.channels replicates 1-channel samples only: no count makes 2 and 3 one
    assert "transform.channels: 3" not in message
    # a plain DataLoader given the stacking collate: the same error type, from the worker
    plain = iter(DataLoader(ShardDataset(manifests["mixed"], "train", shuffle=False), batch_size=6, num_workers=1,
                            collate_fn=collate_stack))
    with pytest.raises(MixedShapesError, match="this batch mixes image shapes") as caught:
        next(plain)
    # its own message first, not torch's "Caught MixedShapesError in DataLoader worker process 0"
    assert str(caught.value).startswith("this batch mixes image shapes"), str(caught.value)
    assert "raised in DataLoader worker process 0" in str(caught.value)
    plain._shutdown_workers()  # type: ignore[attr-defined]  # now, not after torch's 5 s timeout at collection
    # one shape per batch (batch size 1) stacks fine
    assert all(b["image"].shape[0] == 1 for b in make_loader(ShardDataset(manifests["mixed"], "train"), 1, 0))


def test_images_from_a_worker_share_one_storage_but_not_their_bytes(manifests):
    loader = DataLoader(ShardDataset(manifests["mixed"], "train", shuffle=False), batch_size=6, num_workers=1,
                        collate_fn=collate_list)
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
    batch = collate_list(items)
    assert type(batch["image"]) is ImageBatch
    assert count_fds_sent(batch, monkeypatch) == 2      # the images' block and the labels
    uniform = collate_stack([{**it, "image": torch.full((3, 4, 4), 1, dtype=torch.uint8)} for it in items])
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
    batch = collate_list(items)
    assert type(batch["image"]) is ImageBatch
    assert all(a is it["image"] for a, it in zip(batch["image"], items, strict=True))


def test_the_pad_collate_refuses_volumes_of_several_sizes_naming_the_volume_size() -> None:
    # one source, one channel count, one dtype: the fixes for "channel counts or dtypes" do not apply
    items = [{"image": torch.zeros((1, 4, 32, 40), dtype=torch.uint8), "key": "a"},
             {"image": torch.zeros((1, 4, 48, 24), dtype=torch.uint8), "key": "b"}]
    with pytest.raises(MixedShapesError) as refused:
        dataloader_module.collate_pad(items)
    message = str(refused.value)
    assert "channel counts or dtypes" not in message and "transform.channels" not in message, message
    assert "1×4×32×40" in message and "sample: {volume: {size: [D, H, W]}}" in message and 'collate="list"' in message


def test_a_batch_of_one_source_mixing_sizes_is_told_to_give_the_kind_a_size() -> None:
    # a DICOM source without transform.dicom.size packs each series at its own rows × columns:
    # a view of one source and one channel count change nothing; one size does
    items = [{"image": torch.zeros((1, 32, 40), dtype=torch.uint8), "key": "a"},
             {"image": torch.zeros((1, 48, 24), dtype=torch.uint8), "key": "b"}]
    with pytest.raises(MixedShapesError) as refused:
        collate_stack(items, shapes={"ct": [[1, 32, 40], [1, 48, 24]]})
    assert "transform.<kind>.size" in str(refused.value), refused.value


@pytest.mark.parametrize(("shapes", "offered", "not_offered"), [
    ([(3, 40, 48), (3, 48, 40)], "build with one size", "transform.channels"),  # an EXIF-rotated photo
    ([(1, 32, 32), (3, 32, 32)], "build with one channel count", "build with one size"),
    ([(1, 8, 32, 32), (3, 32, 32)], "never stack or pad", "build with one"),  # a volume beside a slice
    ([(1, 8, 32, 32), (3, 32, 32)], "never stack or pad", 'collate="pad"'),
])
def test_a_mixed_batch_is_offered_only_the_fixes_that_help_it(
        shapes: list[tuple[int, ...]], offered: str, not_offered: str) -> None:
    """A batch differing in size alone was told to build with one channel count, which changes
    nothing; one differing in channels alone, to build with one size."""
    items = [{"image": torch.zeros(shape, dtype=torch.uint8), "key": str(i)} for i, shape in enumerate(shapes)]
    with pytest.raises(MixedShapesError) as refused:
        collate_stack(items)
    said = str(refused.value)
    assert offered in said and not_offered not in said and 'collate="list"' in said, said
