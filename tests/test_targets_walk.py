"""Targets as tables write them: class ids and missing-value sentinels in the spellings pandas and
other writers use.

- A class id column that has a blank is a float column to pandas, so its ids are written ``1.0``,
  ``2.0``, ``4.0``: ``ShardDataset(labels=[2])`` is class ``2.0`` (the class id), not label index 2.
- A numeric target's ``missing: [-999]`` is a number: the cell ``-999.0`` or ``-9.99e2`` is that
  sentinel too, and a missing_label bad sample, never the target value -999.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.badsamples import read_bad_samples
from packer.config import load_job
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
    (1, {"00": 0, "01": 1, "02": 2}, r"written with leading zeros \('00', '01', '02'\), which no integer writes: "
                                      r"pass the name as a string, e.g. labels=\['01'\]$"),
    (5, {"00": 0, "01": 1, "02": 2}, r"pass the name as a string, one of those listed$"),  # no '05': none offered
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


# -- a numeric target's missing: numbers match by value ----------------------------------------

SENTINELS = ["-999", "-999.0", "-9.99e2", "-999.00", "5", "-998.5", "NA", "-9990"]


def _numeric_build(tmp: Path, missing: list[Any]) -> tuple[dict[str, float], dict[str, str]]:
    """Build the SENTINELS table under ``missing:``; (path -> packed target, path -> bad reason)."""
    raw = _photo_table(tmp, [{"path": f"{i}.png", "v": cell, "entity": f"E{i}", "timestamp": "2024-01-01"}
                             for i, cell in enumerate(SENTINELS)])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "numeric", "columns": ["v"], "missing": missing}}
    result = _build(_job(tmp, [source], "parquet", validate={"max_bad_fraction": 1.0}))
    packed = {Path(item["record"]["path"]).name: float(item["target"][0])
              for item in ShardDataset(result.version_dir, "train", shuffle=False, records=True)}
    bad = {Path(r["path"]).name: r["reason"] for r in read_bad_samples(result.version_dir / "bad_samples.jsonl")}
    return packed, bad


@pytest.mark.parametrize("missing", [[-999], [-999.0], [-9.99e2], ["NA", -999]])
def test_a_number_in_missing_matches_every_cell_of_that_value(tmp_path: Path, missing: list[Any]) -> None:
    packed, bad = _numeric_build(tmp_path, missing)
    sentinels = {f"{i}.png" for i, cell in enumerate(SENTINELS) if cell in ("-999", "-999.0", "-9.99e2", "-999.00")}
    assert {name: bad[name] for name in sentinels} == dict.fromkeys(sentinels, "missing_label")
    assert packed == {"4.png": 5.0, "5.png": -998.5, "7.png": -9990.0}  # other numbers are values
    assert bad["6.png"] == ("missing_label" if "NA" in missing else "bad_target")


def test_a_text_token_in_missing_still_matches_its_text(tmp_path: Path) -> None:
    packed, bad = _numeric_build(tmp_path, ["NA"])
    assert bad == {"6.png": "missing_label"}
    assert sorted(packed.values()) == [-9990.0, -999.0, -999.0, -999.0, -999.0, -998.5, 5.0]


def test_the_missing_label_record_names_the_cell_and_the_number_it_equals(tmp_path: Path) -> None:
    from packer.targets.base import CellPolicy
    from packer.targets.numeric import NumericTarget

    policy = CellPolicy(missing=frozenset({"-999"}))
    refused = NumericTarget.text_of_cells({"v": "-9.99e2"}, where="t.csv, row 3", separator=None, value_map={},
                                          known=(), policy=policy)
    assert not isinstance(refused, str) and refused.reason == "missing_label"
    assert "column 'v'" in refused.message and "'-9.99e2'" in refused.message and "-999" in refused.message
    assert NumericTarget.text_of_cells({"v": "-999.5"}, where="w", separator=None, value_map={}, known=(),
                                       policy=policy) == "-999.5"


def test_missing_numbers_keep_the_job_config_as_written(tmp_path: Path) -> None:
    """The recorded config (and so the config hash) lists ``missing:`` tokens as text, as before."""
    raw = _photo_table(tmp_path, [{"path": "0.png", "v": "1", "entity": "E0", "timestamp": "2024-01-01"}])
    source = {"kind": "image", "root": str(raw), "table": str(raw / "table.csv"),
              "label": {"kind": "numeric", "columns": ["v"], "missing": [-999, "NA"]}}
    job = load_job(_job(tmp_path, [source]))
    assert job.sources[0].target.missing == ("-999", "NA")
