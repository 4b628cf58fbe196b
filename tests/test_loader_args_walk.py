"""What the loader refuses of its arguments and of a saved state, and how it says so.

Every refusal is a ConfigError naming the argument (or the state's field) and what it must be,
raised where the value is given, never a bare TypeError, a torch assertion at the first batch or
a value quietly rounded into another one.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from packer.errors import ConfigError
from packer.loader import MixedDataset, ShardDataset, make_loader
from tests.loader_fixtures import build_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("args")
    return {"a": build_dataset(root / "a", shard_sizes=(5, 7)), "b": build_dataset(root / "b", shard_sizes=(6,))}


def mix(manifests: dict[str, Path], **kwargs: object) -> MixedDataset:
    return MixedDataset([(ShardDataset(manifests["a"], "train"), 1), (ShardDataset(manifests["b"], "train"), 1)],
                        **kwargs)  # type: ignore[arg-type]


# -- MixedDataset(epoch_length=) ---------------------------------------------------------------
def test_a_numpy_integer_epoch_length_is_that_many_samples(manifests: dict[str, Path]) -> None:
    """A length read from a schedule (a numpy int) was refused as 'expected ... a number of samples > 0'."""
    dataset = mix(manifests, epoch_length=np.int64(10))
    assert dataset.samples == 10 and sum(dataset.counts().values()) == 10
    assert type(dataset.epoch_length) is int  # the state identity stays JSON-able


@pytest.mark.parametrize("length", [True, False, 2.5, "10", 0, -3])
def test_an_epoch_length_that_is_not_a_positive_integer_or_a_rule_is_refused(manifests: dict[str, Path],
                                                                            length: object) -> None:
    """True was taken for an epoch of 1 sample."""
    with pytest.raises(ConfigError, match=r"epoch_length=.*expected one of \('shortest', 'longest'\) or an "
                                          r"integer number of samples > 0"):
        mix(manifests, epoch_length=length)


# -- seed= -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1.7, "3", True, None])
def test_a_mix_seed_that_is_not_an_integer_is_refused_as_a_datasets_is(manifests: dict[str, Path],
                                                                       seed: object) -> None:
    """MixedDataset(seed=1.7) ran with seed 1 and seed="3" with 3, where ShardDataset refuses both."""
    with pytest.raises(ConfigError, match=r"^seed must be an int, not \w+ "):
        ShardDataset(manifests["a"], "train", seed=seed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^seed must be an int, not \w+ "):
        mix(manifests, seed=seed)


def test_a_numpy_integer_mix_seed_is_kept_as_a_plain_int(manifests: dict[str, Path]) -> None:
    dataset = mix(manifests, seed=np.int32(7))
    assert dataset.identity()["seed"] == 7 and type(dataset.seed) is int


# -- max_skipped= ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["5", 2.5, True, None, -1])
def test_max_skipped_must_be_an_integer_at_least_zero(manifests: dict[str, Path], value: object) -> None:
    """"5" was a bare TypeError ('<' not supported between 'str' and 'int'), 2.5 ran as 2."""
    with pytest.raises(ConfigError, match=r"^max_skipped must be an integer >= 0 "):
        ShardDataset(manifests["a"], "train", max_skipped=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^max_skipped must be an integer >= 0 "):
        mix(manifests, max_skipped=value)


def test_a_numpy_integer_max_skipped_is_kept_as_a_plain_int(manifests: dict[str, Path]) -> None:
    dataset = ShardDataset(manifests["a"], "train", max_skipped=np.int64(3))
    assert dataset.max_skipped == 3 and type(dataset.max_skipped) is int
    assert mix(manifests, max_skipped=np.int64(0)).max_skipped == 0


# -- MixedDataset members ----------------------------------------------------------------------
def test_a_member_given_without_its_weight_is_refused_before_any_sample_is_read(
        manifests: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """[dataset] was unpacked as a pair by iterating the dataset (reading and decoding its samples),
    then 'too many values to unpack' (or, for 2 samples, 'got dict')."""
    dataset = ShardDataset(manifests["a"], "train")

    def no_reading(self: ShardDataset) -> None:
        raise AssertionError("the mix read the member's samples to check its arguments")

    monkeypatch.setattr(ShardDataset, "__iter__", no_reading)
    with pytest.raises(ConfigError, match=r"^MixedDataset members are \(ShardDataset, weight\) pairs, got a "
                                          r"ShardDataset alone \(its weight left out\) \(member 0\)"):
        MixedDataset([dataset])  # type: ignore[list-item]


@pytest.mark.parametrize("member", [("a", 1), (1,), "ab"], ids=["not-a-dataset", "one-element", "string"])
def test_a_member_that_is_not_a_dataset_weight_pair_is_refused(manifests: dict[str, Path], member: object) -> None:
    dataset = ShardDataset(manifests["a"], "train")
    with pytest.raises(ConfigError, match=r"^MixedDataset members are \(ShardDataset, weight\) pairs, got .*member 1"):
        MixedDataset([(dataset, 1), member])  # type: ignore[list-item]


# -- make_loader(prefetch_factor=) -------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("factor", [0, -1])
def test_a_prefetch_factor_below_one_is_refused_at_make_loader(manifests: dict[str, Path], factor: int,
                                                               workers: int) -> None:
    """0 was accepted and failed at the first batch with torch's AssertionError; -1 was torch's ValueError."""
    with pytest.raises(ConfigError, match=rf"^prefetch_factor must be >= 1 \(batches each worker loads ahead\) "
                                          rf"or None, got {factor}"):
        make_loader(ShardDataset(manifests["a"], "train"), 2, workers, prefetch_factor=factor)


@pytest.mark.parametrize("factor", [None, 1, np.int64(3)])
def test_a_prefetch_factor_of_one_or_more_or_none_loads_with_workers(manifests: dict[str, Path],
                                                                    factor: object) -> None:
    loader = make_loader(ShardDataset(manifests["a"], "train", shuffle=False), 4, 2,
                         prefetch_factor=factor)  # type: ignore[arg-type]
    try:
        assert sum(len(batch["key"]) for batch in loader) == 12
    finally:
        loader.close()


# -- load_state_dict: the saved segment --------------------------------------------------------
BAD_SEGMENTS = {  # [world_size, uneven, drop_last, batch_size, consumed]
    "consumed -4": ([1, "exact", False, 2, -4], "consumed"),  # resumed at ids[-4:], the epoch's last 4
    "batch_size 0": ([2, "exact", True, 0, 4], "batch_size"),  # ZeroDivisionError at len()
    "world_size 0": ([0, "exact", False, 2, 4], "world_size"),
    "consumed 2.5": ([1, "exact", False, 2, 2.5], "consumed"),  # int() made it 2
    "world_size '1'": (["1", "exact", False, 2, 4], "world_size"),
    "drop_last 'no'": ([1, "exact", "no", 2, 4], "drop_last"),  # bool('no') is True
}


@pytest.mark.parametrize("where", ["segment", "history"])
@pytest.mark.parametrize("case", list(BAD_SEGMENTS))
def test_a_saved_segment_out_of_range_is_a_malformed_state_naming_the_field(manifests: dict[str, Path], case: str,
                                                                           where: str) -> None:
    good = make_loader(ShardDataset(manifests["a"], "train"), 2).state_dict()
    state = copy.deepcopy(good)
    segment, field = BAD_SEGMENTS[case]
    if where == "segment":
        state["segment"] = segment
    else:
        state["history"] = [segment]
    loader = make_loader(ShardDataset(manifests["a"], "train"), 2)
    with pytest.raises(ConfigError, match=rf"^malformed loader state \(loader state segment: {field}="):
        loader.load_state_dict(state)
    assert len(loader) == 6 and loader.state_dict() == good  # nothing of the bad state was taken


def test_a_good_segment_still_resumes_where_it_stopped(manifests: dict[str, Path]) -> None:
    loader = make_loader(ShardDataset(manifests["a"], "train"), 2)
    batches = iter(loader)
    first = [key for _ in range(2) for key in next(batches)["key"]]
    state = loader.state_dict()
    resumed = make_loader(ShardDataset(manifests["a"], "train"), 2)
    resumed.load_state_dict(state)
    rest = [key for batch in resumed for key in batch["key"]]
    assert len(first) == 4 and len(rest) == 8 and not set(first) & set(rest)


@pytest.mark.parametrize("state", ["not a state", None, [1, 2]])
def test_a_state_that_is_not_a_dict_is_a_malformed_state(manifests: dict[str, Path], state: object) -> None:
    """A string was an AttributeError ('str' object has no attribute 'get')."""
    loader = make_loader(ShardDataset(manifests["a"], "train"), 2)
    with pytest.raises(ConfigError, match=r"^malformed loader state \(a state is the dict state_dict\(\) returned, "
                                          r"got \w+\)"):
        loader.load_state_dict(state)  # type: ignore[arg-type]


@pytest.mark.parametrize("skipped", [-1, "3", 1.5])
def test_a_saved_skip_count_that_is_not_a_count_is_a_malformed_state(manifests: dict[str, Path],
                                                                     skipped: object) -> None:
    state = make_loader(ShardDataset(manifests["a"], "train"), 2).state_dict()
    state["skipped"] = skipped
    with pytest.raises(ConfigError, match=r"^malformed loader state \(skipped="):
        make_loader(ShardDataset(manifests["a"], "train"), 2).load_state_dict(state)


@pytest.mark.parametrize("drop_last", [1, 0, None, np.bool_(True)])
def test_a_drop_last_given_as_another_truth_value_saves_a_state_that_resumes(manifests: dict[str, Path],
                                                                              drop_last: object) -> None:
    """make_loader(drop_last=1) (argparse's type=int, a YAML 0/1) saved drop_last 1, which 69d5ef8's
    check then refused to load back; np.bool_ saved a state json.dumps refused. The loader holds a
    bool, and a state saved with 0, 1 or None before still loads as that truth value."""
    loader = make_loader(ShardDataset(manifests["a"], "train", shuffle=False), 2,
                         drop_last=drop_last)  # type: ignore[arg-type]
    batches = iter(loader)
    first = [key for key in next(batches)["key"]]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["segment"][2] is bool(drop_last)
    resumed = make_loader(ShardDataset(manifests["a"], "train", shuffle=False), 2,
                          drop_last=drop_last)  # type: ignore[arg-type]
    resumed.load_state_dict(state)
    rest = [key for batch in resumed for key in batch["key"]]
    assert len(first) + len(rest) == 12 and not set(first) & set(rest)
    old = copy.deepcopy(state)  # as the code before saved it: the value given
    old["segment"][2] = None if drop_last is None else int(bool(drop_last))
    make_loader(ShardDataset(manifests["a"], "train", shuffle=False), 2).load_state_dict(old)
