"""What the loader refuses of its arguments and of a saved state, and how it says so.

Every refusal is a ConfigError naming the argument (or the state's field) and what it must be,
raised where the value is given, never a bare TypeError, a torch assertion at the first batch or
a value quietly rounded into another one.
"""

from __future__ import annotations

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
