"""Mid-epoch resume: same world size gives the same tail, another world size the same rest."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
from loader_fixtures import build_dataset, split_keys

from packer.errors import ConfigError
from packer.loader import DevicePrefetcher, ShardDataset, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = (5, 3, 6, 2, 4)      # 20 samples


@pytest.fixture(scope="module", params=["webdataset", "parquet"])
def manifest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dataset(tmp_path_factory.mktemp(request.param), fmt=request.param, shard_sizes=SIZES)


def loader_for(manifest: Path, *, workers: int, rank: int = 0, world: int = 1, batch: int = 3, epoch: int = 1):
    dataset = ShardDataset(manifest, "train", seed=7, shuffle_buffer=5, rank=rank, world_size=world)
    loader = make_loader(dataset, batch, workers)
    loader.set_epoch(epoch)
    return loader


def take(loader, batches: int) -> list[str]:
    keys = []
    for i, batch in enumerate(loader):
        keys += batch["key"]
        if i + 1 == batches:
            break
    return keys


@pytest.mark.parametrize("workers,resume_workers", [(0, 0), (2, 2), (2, 0)])
@pytest.mark.parametrize("stop", [1, 3, 7])
def test_resume_continues_the_uninterrupted_epoch(manifest, workers, resume_workers, stop):
    full = [k for b in loader_for(manifest, workers=workers) for k in b["key"]]
    first = loader_for(manifest, workers=workers)
    head = take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))       # survives JSON (and torch.save)
    assert state["epoch"] == 1 and state["segment"][-1] == 3 * stop
    second = loader_for(manifest, workers=resume_workers, epoch=0)
    second.load_state_dict(state)
    second.set_epoch(1)                                        # the training loop's call keeps the resume
    tail = [k for b in second for k in b["key"]]
    assert head + tail == full
    # the next iteration is a whole epoch again
    assert [k for b in second for k in b["key"]] == full


@pytest.mark.parametrize("old,new", [(2, 3), (3, 1), (1, 2)])
def test_resume_with_another_world_size_yields_exactly_the_rest(manifest, old, new):
    stop = 2
    heads, states = [], []
    for rank in range(old):                                   # ranks step together
        loader = loader_for(manifest, workers=0, rank=rank, world=old)
        heads += take(loader, stop)
        states.append(loader.state_dict())
    tails = []
    for rank in range(new):                                   # every new rank loads rank 0's state
        loader = loader_for(manifest, workers=2 if rank == 0 else 0, rank=rank, world=new)
        loader.load_state_dict(states[0])
        tails += [k for b in loader for k in b["key"]]
    assert Counter(heads) + Counter(tails) == Counter(split_keys(sum(SIZES)))
    # and once more: save mid-way through the resumed epoch, resume with the original size
    mid, rest, mid_states = [], [], []
    for rank in range(new):
        loader = loader_for(manifest, workers=0, rank=rank, world=new)
        loader.load_state_dict(states[0])
        mid += take(loader, 1)
        mid_states.append(loader.state_dict())
    state = mid_states[0]
    for rank in range(old):
        loader = loader_for(manifest, workers=0, rank=rank, world=old)
        loader.load_state_dict(state)
        rest += [k for b in loader for k in b["key"]]
    assert Counter(heads) + Counter(mid) + Counter(rest) == Counter(split_keys(sum(SIZES)))


def test_prefetcher_state_does_not_count_the_prefetched_batch(manifest):
    full = [k for b in loader_for(manifest, workers=0) for k in b["key"]]
    batches = DevicePrefetcher(loader_for(manifest, workers=2), "cpu")
    head = take(batches, 2)
    state = batches.state_dict()
    assert state["segment"][-1] == 6                        # 2 batches of 3, not 3 batches
    again = DevicePrefetcher(loader_for(manifest, workers=0), "cpu")
    again.load_state_dict(state)
    assert head + [k for b in again for k in b["key"]] == full


def test_state_saved_at_epoch_end_resumes_into_the_next_epoch(manifest):
    loader = loader_for(manifest, workers=0)
    keys = [k for b in loader for k in b["key"]]
    assert len(keys) == sum(SIZES)
    resumed = loader_for(manifest, workers=0, epoch=0)
    resumed.load_state_dict(loader.state_dict())
    epochs = {}
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        epochs[epoch] = [k for b in resumed for k in b["key"]]
    assert epochs[1] == []
    assert sorted(epochs[2]) == split_keys(sum(SIZES))


def test_state_for_another_configuration_is_refused(manifest):
    state = loader_for(manifest, workers=0).state_dict()
    other = make_loader(ShardDataset(manifest, "train", seed=8, shuffle_buffer=5), 3)
    with pytest.raises(ConfigError, match="seed"):
        other.load_state_dict(state)


def test_without_shuffle_the_seed_and_buffer_do_not_refuse_a_resume(manifest):
    """With ``shuffle=False`` the order is the packed order whatever ``seed`` and
    ``shuffle_buffer``, yet an eval state saved with seed=0 was refused by seed=7. A transform
    draws under the seed, so with one the seed still counts."""
    def loader(seed: int, buffer: int, **kwargs):
        return make_loader(ShardDataset(manifest, "train", shuffle=False, seed=seed, shuffle_buffer=buffer,
                                        **kwargs), 3)

    whole = take(loader(0, 5), 0)
    assert whole == take(loader(7, 64), 0) == split_keys(sum(SIZES))
    first = loader(0, 5)
    head = take(first, 2)
    state = json.loads(json.dumps(first.state_dict()))
    assert "seed" not in state and "shuffle_buffer" not in state
    resumed = loader(7, 64)
    resumed.load_state_dict(state)
    assert head + take(resumed, 0) == whole
    with pytest.raises(ConfigError, match="shuffle saved False, now True"):
        make_loader(ShardDataset(manifest, "train", seed=0, shuffle_buffer=5), 3).load_state_dict(state)
    augmented = loader(0, 5, transform=lambda image: image)
    take(augmented, 1)
    with pytest.raises(ConfigError, match="seed saved 0, now 7"):
        loader(7, 5, transform=lambda image: image).load_state_dict(augmented.state_dict())


@pytest.mark.parametrize("workers", [0, 2])
def test_the_datasets_set_epoch_reshuffles_a_make_loader_as_the_loaders_does(manifest, workers):
    """``dataset.set_epoch(e)`` (what a plain DataLoader needs, and what torch habit calls) on
    a dataset that make_loader drives was overwritten by the loader's own epoch at the next
    iter(): every epoch came in epoch 0's order, with epoch 0's augmentations."""
    def fresh():
        dataset = ShardDataset(manifest, "train", seed=7, shuffle_buffer=5)
        return dataset, make_loader(dataset, 3, workers)

    dataset, loader = fresh()
    epoch0 = take(loader, 0)
    dataset.set_epoch(1)
    by_dataset = take(loader, 0)
    _, reference = fresh()
    reference.set_epoch(1)
    assert by_dataset == take(reference, 0) != epoch0
    loader.set_epoch(0)  # the later call wins, whichever object it is made on
    assert take(loader, 0) == epoch0
    dataset.set_epoch(1)
    assert take(loader, 0) == by_dataset and loader.epoch == 1
    state = loader.state_dict()
    for closing in (loader, reference):
        closing.close()
    # a resume is kept when the dataset's set_epoch names the saved epoch, as the loader's does
    dataset, resumed = fresh()
    stopped = make_loader(ShardDataset(manifest, "train", seed=7, shuffle_buffer=5), 3, workers)
    stopped.set_epoch(1)
    head = take(stopped, 2)
    resumed.load_state_dict(stopped.state_dict())
    dataset.set_epoch(1)
    assert head + take(resumed, 0) == by_dataset and state["epoch"] == 1
    for closing in (stopped, resumed):
        closing.close()


def test_set_epoch_that_drops_a_loaded_mid_epoch_position_says_so(manifest):
    """``load_state_dict`` then ``set_epoch`` of another epoch (a loop restarted at 0, or at the
    checkpoint's epoch + 1 by the script's own count) threw the resume position away without a
    word: the saved epoch's rest was never trained, or epochs were trained twice."""
    stopped = loader_for(manifest, workers=0, epoch=1)
    take(stopped, 2)
    state = stopped.state_dict()
    resumed = loader_for(manifest, workers=0, epoch=0)
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(0\) discards the loader state loaded for epoch 1 "
                                         r"\(6 of its 20 samples consumed\)"):
        resumed.set_epoch(0)
    assert sorted(k for b in resumed for k in b["key"]) == split_keys(sum(SIZES))  # epoch 0, whole
    # the saved epoch itself keeps it, and a state saved at an epoch's end has nothing to lose
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    ended = loader_for(manifest, workers=0, epoch=1)
    [b for b in ended]
    resumed.load_state_dict(ended.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.set_epoch(2)


@pytest.mark.parametrize("world,uneven", [(1, "exact"), (3, "exact"), (3, "pad")])
def test_a_state_saved_after_a_whole_drop_last_epoch_has_nothing_left_to_warn_about(manifest, world, uneven):
    """Under ``drop_last`` an epoch ends before its dropped tail (20 samples, batch 3: 18 of 20;
    a rank of 7 under 3 ranks: 6 of 7), yet set_epoch(next) after a state saved at such an
    epoch's end warned that "the rest of epoch 1 will not be read", advice that re-runs an epoch
    yielding nothing. A state saved mid-epoch still warns, counting what the epoch delivers."""
    def loader(rank: int, epoch: int, ranks: int = world):
        dataset = ShardDataset(manifest, "train", seed=7, shuffle_buffer=5, rank=rank, world_size=ranks,
                               uneven=uneven)
        made = make_loader(dataset, 3, drop_last=True)
        made.set_epoch(epoch)
        return made

    for rank in range(world):
        ended = loader(rank, 1)
        take(ended, 0)
        resumed = loader(rank, 0)
        resumed.load_state_dict(ended.state_dict())
        assert take(resumed, 0) == []                                 # epoch 1 has no batch left
        resumed.load_state_dict(ended.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed.set_epoch(2)
        stopped = loader(rank, 1)
        take(stopped, 1)
        resumed.load_state_dict(stopped.state_dict())
        delivered = 18 if world == 1 else 6                            # 20 // 3 * 3; 6 or 7 // 3 * 3
        with pytest.warns(UserWarning, match=rf"discards the loader state loaded for epoch 1 \(3 of its {delivered} "):
            resumed.set_epoch(2)
    # a whole epoch under 2 ranks resumed under `world`: what the saved one left is a dropped tail too
    ended = loader(0, 1, ranks=2)
    take(ended, 0)
    resumed = loader(0, 0)
    resumed.load_state_dict(ended.state_dict())
    assert take(resumed, 0) == []
    resumed.load_state_dict(ended.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.set_epoch(2)


def test_state_for_another_dataset_version_is_refused_by_name(manifest, tmp_path):
    """Only split, sample count, seed and view were compared, so a checkpoint taken on one
    dataset resumed into another of the same size (a rebuilt version, another dataset) and
    "the rest of the epoch" was the rest of another order: samples seen twice, others never."""
    fmt = "parquet" if manifest.parent.joinpath("train-000000.parquet").exists() else "webdataset"
    other = build_dataset(tmp_path / "other", fmt=fmt, shard_sizes=SIZES, classes=2)  # same count, other data
    stopped = loader_for(manifest, workers=0)
    take(stopped, 2)
    resumed = make_loader(ShardDataset(other, "train", seed=7, shuffle_buffer=5), 3)
    mine, theirs = (json.loads(p.read_text()) for p in (manifest, other))
    with pytest.raises(ConfigError, match=f"dataset saved '{mine['name']}@{mine['version']}', now "
                                          f"'{theirs['name']}@{theirs['version']}'"):
        resumed.load_state_dict(stopped.state_dict())
    old = {k: v for k, v in stopped.state_dict().items() if k != "dataset"}  # a state saved before versions were
    same = loader_for(manifest, workers=0)
    same.load_state_dict(old)                                                 # recorded still resumes
    assert len([k for b in same for k in b["key"]]) == sum(SIZES) - 6
