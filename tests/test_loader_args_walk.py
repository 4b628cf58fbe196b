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
from packer.loader import MixedDataset, ShardDataset
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
