"""Long and elastic runs: many epochs over a few damaged samples, custom collates, resumes under
another world size, epochs and ranks given as other integer types."""

from __future__ import annotations

from pathlib import Path

import pytest
from loader_fixtures import build_dataset, flip_pixel_byte
from torch.utils.data import DataLoader

from packer.loader import ShardDataset, ShardReadError, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = (4, 6, 5)   # 15 samples
DAMAGED = (1, 7)    # two samples whose pixels changed after the build


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A 15-sample dataset with samples 1 (shard 0) and 7 (shard 1) damaged."""
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    flip_pixel_byte(tmp_path / "train-000000.tar", DAMAGED[0])
    flip_pixel_byte(tmp_path / "train-000001.tar", DAMAGED[1])
    return manifest


def keys_of(batches) -> list[str]:
    return [k for b in batches for k in b["key"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_max_skipped_caps_each_epoch_so_the_same_damaged_samples_never_add_up(damaged, workers):
    """2 damaged samples under max_skipped=2: every epoch skips the same 2, and the run goes on;
    summed over epochs, the count passed the cap in epoch 1 (4 > 2) and stopped the run."""
    good = sum(SIZES) - len(DAMAGED)
    loader = make_loader(ShardDataset(damaged, "train", on_error="skip", max_skipped=2), 4, workers)
    for epoch in range(4):   # persistent workers (workers=2) read every epoch
        loader.set_epoch(epoch)
        assert len(keys_of(loader)) == good
        assert loader.skipped == 2 and len(loader.skipped_samples) == 2
        assert loader.state_dict()["skipped"] == 2   # the epoch's own count, not the run's
    loader.close()

    dataset = ShardDataset(damaged, "train", on_error="skip", max_skipped=2)
    for epoch in range(4):   # iterated directly, in the main process
        dataset.set_epoch(epoch)
        assert len(list(dataset)) == good and dataset.skipped == 2

    # a plain DataLoader's persistent workers keep their dataset copy: each counts per epoch too
    plain = DataLoader(ShardDataset(damaged, "train", on_error="skip", max_skipped=4), batch_size=None,
                       num_workers=2, persistent_workers=True)
    for epoch in range(4):
        plain.dataset.set_epoch(epoch)
        assert len(list(plain)) == good


def test_more_damaged_samples_in_one_epoch_than_max_skipped_raise_naming_the_epoch(damaged):
    loader = make_loader(ShardDataset(damaged, "train", on_error="skip", max_skipped=1), 4)
    loader.set_epoch(3)
    with pytest.raises(ShardReadError, match=r"2 samples skipped in epoch 3 on rank 0, more than max_skipped=1 "
                                             r"\(a cap per epoch\)"):
        keys_of(loader)
    with pytest.raises(ShardReadError, match=r"2 samples skipped in epoch 0, more than max_skipped=1 "
                                             r"\(a cap per epoch\)"):
        list(ShardDataset(damaged, "train", on_error="skip", max_skipped=1))


def test_a_loader_state_carries_the_epochs_skips_to_its_own_rank_only(damaged):
    """The saved count is of the saving rank's share of the epoch: the rank that saved it resumes
    with it, another rank (the usual DDP checkpoint: rank 0 saves, every rank loads) from 0."""
    def loader(rank: int):
        made = make_loader(ShardDataset(damaged, "train", shuffle=False, on_error="skip", max_skipped=3,
                                        rank=rank, world_size=2), 4)
        made.set_epoch(0)
        return made

    saving = loader(0)   # rank 0's share: samples 0-6, the packed order, damaged sample 1 among them
    assert next(iter(saving))["key"] == ["s00000", "s00002", "s00003"]
    state = saving.state_dict()
    assert state["skipped"] == 1
    saving.set_epoch(1)
    assert saving.state_dict()["skipped"] == 0   # the next epoch has skipped nothing yet

    resumed = loader(0)
    resumed.load_state_dict(state)
    assert resumed.skipped == 1
    other = loader(1)
    other.load_state_dict(state)
    assert other.skipped == 0


def as_pair(items):   # torchvision style
    import torch
    return torch.stack([i["image"] for i in items]), torch.stack([i["label"] for i in items])


def as_named(items):  # the names a model's forward takes
    import torch
    return {"x": torch.stack([i["image"] for i in items]), "key_list": [i["key"] for i in items]}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_function_returns_the_batch_of_any_type_and_never_sees_an_empty_list(damaged, workers):
    """make_loader(collate=fn) hands over what fn returns: an (images, labels) tuple raised a TypeError
    and a dict without "key" a KeyError from the loader's own test of batch["key"]. A batch whose
    samples were all skipped (uneven="exact") is left out without calling fn on an empty list."""
    pairs = list(make_loader(ShardDataset(damaged, "train", shuffle=False, verify="off"), 4, workers,
                             collate=as_pair))
    assert [len(labels) for _, labels in pairs] == [4, 4, 4, 3]
    assert [int(label) for _, labels in pairs for label in labels] == [i % 3 for i in range(15)]

    named = list(make_loader(ShardDataset(damaged, "train", shuffle=False, verify="off"), 4, workers,
                             collate=as_named))
    assert [k for batch in named for k in batch["key_list"]] == [f"s{i:05d}" for i in range(15)]

    def refuses_empty(items):
        assert items, "collate called on an empty list"
        return as_pair(items)

    # batch_size 1: the batches of damaged samples 1 and 7 hold nothing once they are skipped
    skipping = make_loader(ShardDataset(damaged, "train", shuffle=False, on_error="skip", max_skipped=2), 1,
                           workers, collate=refuses_empty)
    labels = [int(labels[0]) for _, labels in skipping]
    assert labels == [i % 3 for i in range(15) if i not in DAMAGED]
    assert skipping.skipped == 2
    skipping.close()


def test_an_epoch_of_any_integer_type_leaves_a_state_that_json_and_torch_load_read_back(tmp_path):
    """set_epoch(numpy.int64(1)) (epochs from a numpy schedule) was stored as it was, so state_dict()
    held a numpy integer: json.dumps refused it, and torch.load(weights_only=True) refused the
    checkpoint at resume, after the run had written it."""
    import json

    import numpy as np
    import torch

    from packer.errors import ConfigError

    manifest = build_dataset(tmp_path / "data", shard_sizes=SIZES)
    loader = make_loader(ShardDataset(manifest, "train"), 4)
    for epoch in np.arange(2):
        loader.set_epoch(epoch)
        first = next(iter(loader))["key"]
    state = loader.state_dict()
    assert type(state["epoch"]) is int and state["epoch"] == 1
    assert json.loads(json.dumps(state)) == state
    torch.save({"loader": state}, tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)["loader"]

    resumed = make_loader(ShardDataset(manifest, "train"), 4)
    resumed.load_state_dict({**saved, "epoch": np.int64(1)})   # a state saved before this fix
    assert type(resumed.state_dict()["epoch"]) is int
    rest = [k for b in resumed for k in b["key"]]
    assert len(rest) == sum(SIZES) - len(first) and not set(rest) & set(first)

    dataset = ShardDataset(manifest, "train")
    driven = make_loader(dataset, 4)
    dataset.set_epoch(np.int32(3))   # the dataset's own set_epoch, adopted by the loader
    next(iter(driven))
    assert type(driven.state_dict()["epoch"]) is int and driven.state_dict()["epoch"] == 3
    for bad in (1.5, "2"):
        with pytest.raises(ConfigError, match="epoch must be an integer"):
            loader.set_epoch(bad)
        with pytest.raises(ConfigError, match="epoch must be an integer"):
            dataset.set_epoch(bad)


def test_a_rank_or_world_size_that_is_not_an_integer_is_a_config_error_naming_it(tmp_path):
    """rank=os.environ["RANK"] (a string, as a launcher script reads it) gave a bare TypeError
    ("'<' not supported between instances of 'str' and 'int'"), in ShardDataset and MixedDataset."""
    import numpy as np

    from packer.errors import ConfigError
    from packer.loader import MixedDataset

    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    environ = {"RANK": "1", "WORLD_SIZE": "2"}
    with pytest.raises(ConfigError, match=r"rank must be an integer, not str '1'; pass rank=int\(os.environ"):
        ShardDataset(manifest, "train", rank=environ["RANK"], world_size=2)
    with pytest.raises(ConfigError, match=r"world_size must be an integer, not str '2'; pass "
                                          r"world_size=int\(os.environ\[\"WORLD_SIZE\"\]\)"):
        ShardDataset(manifest, "train", rank=1, world_size=environ["WORLD_SIZE"])
    with pytest.raises(ConfigError, match="rank must be an integer, not float 1.0"):
        MixedDataset([(ShardDataset(manifest, "train"), 1)], rank=1.0, world_size=2)
    dataset = ShardDataset(manifest, "train", rank=np.int64(1), world_size=np.int32(2))  # integers of any type
    assert (type(dataset.rank), type(dataset.world_size)) == (int, int) and (dataset.rank, dataset.world_size) == (1, 2)
    assert len(dataset) == 8   # rank 1 of 2 under "exact": samples 7..14 of 15


def test_a_resume_under_another_world_size_warns_when_ranks_get_different_batch_counts(tmp_path):
    """61 samples, batches of 4: a whole epoch over 2 ranks is 30/31 samples, 8 batches each (no
    warning at make_loader). Resumed there from a one-process state after one batch, the 57 left
    split 28/29: 7 batches against 8, the DDP hang make_loader warns about, said by nothing; and
    len(loader) said 8 on both ranks. The rest of the epoch is now checked when the state is loaded,
    and len() counts what the next iter() yields."""
    import json
    import warnings

    import torch.distributed as dist

    manifest = build_dataset(tmp_path / "d", shard_sizes=(30, 31))
    single = make_loader(ShardDataset(manifest, "train", rank=0, world_size=1), 4)
    first = next(iter(single))["key"]
    state = json.loads(json.dumps(single.state_dict()))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        counts, keys = [], []
        for rank in (0, 1):
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # the whole epoch: 8 batches on each rank
                loader = make_loader(ShardDataset(manifest, "train", rank=rank, world_size=2), 4)
            with pytest.warns(UserWarning, match=r"ranks get 8 or 7 batches of 4 \(uneven='exact': the 57 samples "
                                                 r"epoch 0 had left after a state saved under world size 1 .*"
                                                 r"uneven='pad'"):
                loader.load_state_dict(state)
            length = len(loader)
            got = [b["key"] for b in loader]
            counts.append((length, len(got)))
            keys += [k for batch in got for k in batch]
            assert len(loader) == 8   # the next iter() runs the whole epoch again
        assert counts == [(7, 7), (8, 8)]
        assert sorted(keys + first) == [f"s{i:05d}" for i in range(61)]

        for rank in (0, 1):   # pad: every rank the same count after the resume too, nothing to say
            loader = make_loader(ShardDataset(manifest, "train", rank=rank, world_size=2, uneven="pad"), 4)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                loader.load_state_dict(state)
            assert len(loader) == 8 == sum(1 for _ in loader)
    finally:
        dist.destroy_process_group()
