"""check_values refuses a NIfTI volume with a NaN or an infinity (counting them) or of one value,
from its minimum and maximum: one voxel is enough, wherever it is."""

from __future__ import annotations

import numpy as np
import pytest

from packer.read.nifti import NiftiDefect, check_values
from packer.transform.volume import Volume


@pytest.mark.parametrize(("value", "nan", "inf"), [(np.nan, 1, 0), (np.inf, 0, 1), (-np.inf, 0, 1)])
def test_one_voxel_that_is_not_a_number_refuses_the_volume_and_is_counted(value: float, nan: int, inf: int) -> None:
    array = np.random.default_rng(6).uniform(-1000, 1000, size=(1, 5, 6, 7)).astype(np.float32)
    check_values(Volume(array, np.eye(4)))  # a good volume passes
    array[0, 3, 2, 4] = value
    with pytest.raises(NiftiDefect) as caught:
        check_values(Volume(array, np.eye(4)))
    assert caught.value.reason == "non_finite"
    assert caught.value.message.startswith(f"{nan} NaN and {inf} infinite voxel(s)")


def test_a_nan_and_an_infinity_together_are_both_counted() -> None:
    array = np.zeros((2, 3, 4, 5), dtype=np.float32)
    array[0, 0, 0, 0], array[1, 2, 3, 4], array[1, 0, 1, 2] = np.nan, np.inf, -np.inf
    with pytest.raises(NiftiDefect) as caught:
        check_values(Volume(array, np.eye(4)))
    assert caught.value.message.startswith("1 NaN and 2 infinite voxel(s)")


def test_a_volume_of_one_value_is_constant() -> None:
    with pytest.raises(NiftiDefect) as caught:
        check_values(Volume(np.full((1, 3, 4, 5), -1024.0, dtype=np.float32), np.eye(4)))
    assert caught.value.reason == "constant_image" and "-1024" in caught.value.message
