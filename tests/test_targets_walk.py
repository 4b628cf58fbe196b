"""Targets as tables write them: class ids and missing-value sentinels in the spellings pandas and
other writers use.

- A class id column that has a blank is a float column to pandas, so its ids are written ``1.0``,
  ``2.0``, ``4.0``: ``ShardDataset(labels=[2])`` is class ``2.0`` (the class id), not label index 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packer.errors import ConfigError
from packer.loader import ShardDataset
from packer.loader.readers import _label_name
from tests.test_targets import _build, _job, _photo_table

# -- labels= views of class ids written as decimals --------------------------------------------


@pytest.mark.parametrize(("label", "label_map", "name"), [
    (2, {"1.0": 0, "2.0": 1, "4.0": 2}, "2.0"),  # pandas' float id column: class id 2, not index 2 ('4.0')
    (np.int64(4), {"1.0": 0, "2.0": 1, "4.0": 2}, "4.0"),
    (0, {"-1.0": 0, "0.0": 1, "1.0": 2}, "0.0"),  # CheXpert's -1.0/0.0/1.0: 0 is the negative, not index 0
    (-1, {"-1.0": 0, "0.0": 1, "1.0": 2}, "-1.0"),
    (1, {"-1.0": 0, "0.0": 1, "1.0": 2}, "1.0"),
    (10, {"1": 0, "2": 1, "10": 2}, "10"),  # integer spellings as before
    (2, {"1": 0, "2": 1, "10": 2}, "2"),
    (3, {"1": 0, "2.0": 1, "3.0": 2}, "3.0"),  # a column written both ways
    (1, {"1.0": 0, "2.0": 1, "cat": 2}, "2.0"),  # a name that is no number: an integer is an index, as before
    (0, {"0.5": 0, "1.0": 1}, "0.5"),  # a fraction is no class id: an integer is an index
    ("2.0", {"1.0": 0, "2.0": 1, "4.0": 2}, "2.0"),  # a string is the name as written
])
def test_an_integer_in_a_view_is_the_class_id_a_whole_decimal_name_writes(
        label: object, label_map: dict[str, int], name: str) -> None:
    assert _label_name(label, label_map, "m") == name


@pytest.mark.parametrize(("label", "label_map", "said"), [
    (3, {"1.0": 0, "2.0": 1, "4.0": 2},
     r"no label 3 .*whole numbers \(2 or 2\.0\).*an integer names the class id '3' here \(written 3 or 3\.0\), "
     "not a label index"),
    (3, {"0": 0, "1": 1, "2": 2, "4": 3}, "an integer names the class id '3' here"),
    (5, {"cat": 0, "dog": 1}, "not all class ids written as whole numbers.*a label index here, 0 to 1"),
    (2, {"2": 0, "2.0": 1}, r"labels '2' and '2\.0' are both class id 2.*name the one meant as a string"),
    ("2", {"1.0": 0, "2.0": 1}, "no label '2' "),  # a string is a name, read as written
])
def test_a_view_class_id_that_is_no_class_or_two_is_a_config_error_saying_how_integers_read(
        label: object, label_map: dict[str, int], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        _label_name(label, label_map, "m")


def test_a_labels_view_of_a_pandas_float_id_column_holds_the_class_id_it_names(tmp_path: Path) -> None:
    ids = ["1.0", "2.0", "4.0", "2.0", "1.0", "4.0", "2.0"]
    raw = _photo_table(tmp_path, [{"path": f"{i}.png", "label": c, "entity": f"E{i}", "timestamp": "2024-01-01"}
                                  for i, c in enumerate(ids)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv")}
    result = _build(_job(tmp_path, [source]))
    assert result.manifest["label_map"] == {"1.0": 0, "2.0": 1, "4.0": 2}
    for label, name in ((2, "2.0"), (4, "4.0"), (1, "1.0")):
        view = ShardDataset(result.version_dir, "train", labels=[label], shuffle=False, records=True)
        got = [item["record"]["label"] for item in view]
        assert got == [name] * ids.count(name), (label, got)
