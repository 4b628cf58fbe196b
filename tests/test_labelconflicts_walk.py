"""Label conflicts at their edges: a mean mask Dice equal to ``mask_dice`` is no conflict (README:
only one *below* it is), however the float mean of the classes' Dice rounds; and a file that is
not part of the dataset takes no part in conflict detection.

The masks are drawn here so that each class's Dice is a known ratio of pixel counts: classes 1
and 2 agree (Dice 1), class 3 is five pixels of which two (or, just below, two of five against
six) are shared, so the mean is exactly 4/5 (or 26/33, just below 0.8).
"""

from __future__ import annotations

import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.badsamples import read_bad_samples
from packer.exclusions import read_excluded
from packer.pipeline.conflicts import aligned_dice, dice_below, exact_aligned_dice, exact_mask_dice, mask_dice
from tests.test_label_conflicts import _keys, _leakage, _packed, _png, _row, _source, _texture, _tree
from tests.test_targets import _build, _job


def _three_classes(shift: int = 0) -> np.ndarray:
    """Classes 1 and 2 as blocks, class 3 as five pixels of row 40 (columns 10..14)."""
    mask = np.zeros((48, 64), dtype=np.uint8)
    mask[4:12, 4 + 2 * shift:12 + 2 * shift] = 1
    mask[20:28, 30:38] = 2
    mask[40, 10:15] = 3
    return mask


def _class_three_moved(mask: np.ndarray, start: int, length: int = 5) -> np.ndarray:
    """``mask`` with its class 3 redrawn as ``length`` pixels of row 40 from column ``start``."""
    other = mask.copy()
    other[other == 3] = 0
    other[40, start:start + length] = 3
    return other


# -- the exact mean, and the threshold as the job writes it -----------------------------------------------------


def test_a_mean_dice_of_exactly_four_fifths_is_four_fifths_not_the_float_just_below() -> None:
    mask = _three_classes()
    half = _class_three_moved(mask, 13)  # class 3: 2 of 5 pixels shared, Dice 2·2/(5+5) = 2/5
    assert float(np.mean([1.0, 1.0, 0.4])) < 0.8  # why the float mean will not do
    assert exact_mask_dice(mask, half) == Fraction(4, 5)
    assert mask_dice(mask, half) == 0.8
    # near copies go through the same mean: an alignment that moves nothing gives the same Dice
    assert exact_aligned_dice(mask, half, zoom=1.0, dy=0.0, dx=0.0) == Fraction(4, 5)
    assert aligned_dice(mask, half, zoom=1.0, dy=0.0, dx=0.0) == 0.8
    below = _class_three_moved(mask, 13, length=6)  # class 3: Dice 2·2/(5+6) = 4/11
    assert exact_mask_dice(mask, below) == Fraction(26, 33)


def test_the_threshold_is_the_decimal_the_job_writes_and_only_a_dice_below_it_conflicts() -> None:
    # 0.8 as a float is 0.8000000000000000444...: above 4/5, so a Dice of exactly 4/5 would be "below" it
    assert Fraction(4, 5) < Fraction(0.8)
    assert not dice_below(Fraction(4, 5), 0.8)
    assert dice_below(Fraction(4, 5) - Fraction(1, 10**12), 0.8)
    assert not dice_below(Fraction(7, 10), 0.7) and dice_below(Fraction(69, 100), 0.7)
    assert not dice_below(Fraction(1), 1.0) and dice_below(Fraction(0), 0.01)


def test_a_build_lists_the_copy_whose_mask_dice_is_just_below_mask_dice_and_not_the_one_equal_to_it(
        tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    rows = ["path,mask,entity,timestamp"]
    for i in range(4):
        _png(raw / "img" / f"{i}.png", _texture(10 + i, (48, 64)))
        _png(raw / "masks" / f"{i}.png", _three_classes(i))
        rows.append(f"img/{i}.png,masks/{i}.png,E{i},2024-01-01")
    for name, original, length in (("equal", 0, 5), ("below", 1, 6)):  # mean Dice 4/5, and 26/33
        shutil.copyfile(raw / "img" / f"{original}.png", raw / "img" / f"copy_{name}.png")
        _png(raw / "masks" / f"{name}.png", _class_three_moved(_three_classes(original), 13, length))
        rows.append(f"img/copy_{name}.png,masks/{name}.png,E9{original},2024-01-01")
    (raw / "table.csv").write_text("\n".join(rows) + "\n")
    source = {**_source(raw), "label": "none", "mask": {"column": "mask", "classes": [0, 1, 2, 3]}}
    job = _job(tmp_path, [source], transform={"image": {}},
               split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"mask_dice": 0.8}})
    keys = _keys(job)
    rule = _leakage(_build(job).version_dir)["rules"]["label_conflicts"]
    assert rule["masks_compared"] is True and rule["mask_dice"] == 0.8
    assert [{s["key"] for s in f["samples"]} for f in rule["findings"]] == [
        {keys["img/1.png"], keys["img/copy_below.png"]}]
    assert rule["findings"][0]["mask_dice"] == round(26 / 33, 4)


# -- a file that is not part of the dataset takes no part -------------------------------------------------------
#
# Eight photos of eight entities, classes cat and dog in turn. ``copy_listed.png`` is 2.png under
# another entity with the other class, in a split like 2.png: a conflict of the dataset.
# ``copy_unlisted.png`` is 0.png with the other class, but no split list names it (or its split
# cell is empty): a not_in_split bad sample, as the build's warning says, so it conflicts with
# nothing, drops nothing and is not listed with 0.png.


def _stray_copy_tree(tmp: Path, *, filtered: bool = False) -> Path:
    """The photos, copy_listed.png and copy_unlisted.png; with ``filtered``, instead of the
    latter, ``copy_filtered.png``: 4.png with the other class, listed, but a ``view`` a
    ``where:`` leaves out (every other row's view is ``frontal``)."""
    rows = [_row(f"{i}.png", f"E{i}", label=("cat", "dog")[i % 2], split=("train", "test")[i % 2], view="frontal")
            for i in range(8)]
    rows.append(_row("copy_listed.png", "E92", label="dog", split="train", view="frontal"))
    if filtered:
        rows.append(_row("copy_filtered.png", "E94", label="dog", split="test", view="lateral"))
        return _tree(tmp, rows, {"copy_listed.png": "2.png", "copy_filtered.png": "4.png"})
    rows.append(_row("copy_unlisted.png", "E90", label="dog", split="", view="frontal"))
    return _tree(tmp, rows, {"copy_listed.png": "2.png", "copy_unlisted.png": "0.png"})


def _lists(tmp: Path) -> dict[str, str]:
    """train: the even photos and copy_listed.png; test: the odd ones (and copy_filtered.png, which
    a ``where:`` leaves out); copy_unlisted.png in neither."""
    (tmp / "train.txt").write_text("\n".join([*(f"{i}.png" for i in range(0, 8, 2)), "copy_listed.png"]) + "\n")
    (tmp / "test.txt").write_text("\n".join([*(f"{i}.png" for i in range(1, 8, 2)), "copy_filtered.png"]) + "\n")
    return {"train": str(tmp / "train.txt"), "test": str(tmp / "test.txt")}


def _names(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((Path(r["path"]).name, r.get("reason") or r["why"]) for r in records)


def test_drop_group_leaves_a_file_no_split_list_names_a_not_in_split_bad_sample_and_drops_nothing_for_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _stray_copy_tree(tmp_path)
    job = _job(tmp_path, [_source(raw)], split={
        "by": "list", "match": "name", "lists": _lists(tmp_path),
        "duplicates": {"label_conflict": "drop_group"}}, validate={"max_bad_fraction": 0.5})
    result = _build(job)
    keys = _keys(job)
    warned = capsys.readouterr().err
    assert "1 file(s) are in no split list" in warned
    assert "copy_unlisted.png: each is a not_in_split bad sample" in warned
    # what the warning says is what the records say: copy_unlisted.png is the bad sample, and 0.png packs
    assert _names(read_bad_samples(result.version_dir / "bad_samples.jsonl")) == [("copy_unlisted.png", "not_in_split")]
    assert _names(read_excluded(result.version_dir / "excluded.jsonl")) == [
        ("2.png", "label_conflict"), ("copy_listed.png", "label_conflict")]
    assert _packed(result.version_dir) == {keys[f"{i}.png"] for i in (0, 1, 3, 4, 5, 6, 7)}
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    assert rule["count"] == 1 and rule["dropped"] == 2
    assert [{s["key"] for s in f["samples"]} for f in rule["findings"]] == [{keys["2.png"], keys["copy_listed.png"]}]


def test_under_warn_a_file_with_an_empty_split_cell_is_paired_with_no_packed_copy(tmp_path: Path) -> None:
    raw = _stray_copy_tree(tmp_path)
    job = _job(tmp_path, [_source(raw)], split={"by": "column", "column": "split"},
               validate={"max_bad_fraction": 0.5})
    result = _build(job)
    keys = _keys(job)
    assert _names(read_bad_samples(result.version_dir / "bad_samples.jsonl")) == [("copy_unlisted.png", "not_in_split")]
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    assert [{s["key"] for s in f["samples"]} for f in rule["findings"]] == [{keys["2.png"], keys["copy_listed.png"]}]
    assert _packed(result.version_dir) == {keys[name] for name in keys if name != "copy_unlisted.png"}


def test_a_file_a_where_leaves_out_takes_no_part_either(tmp_path: Path) -> None:
    raw = _stray_copy_tree(tmp_path, filtered=True)
    job = _job(tmp_path, [{**_source(raw), "where": {"view": "frontal"}}], split={
        "by": "list", "match": "name", "lists": _lists(tmp_path),
        "duplicates": {"label_conflict": "drop_group"}}, validate={"max_bad_fraction": 0.5})
    result = _build(job)
    keys = _keys(job)
    assert not read_bad_samples(result.version_dir / "bad_samples.jsonl")
    assert _names(read_excluded(result.version_dir / "excluded.jsonl")) == [
        ("2.png", "label_conflict"), ("copy_filtered.png", "filtered"), ("copy_listed.png", "label_conflict")]
    assert keys["4.png"] in _packed(result.version_dir)  # the left-out copy of 4.png, another class, drops nothing
    rule = _leakage(result.version_dir)["rules"]["label_conflicts"]
    assert [{s["key"] for s in f["samples"]} for f in rule["findings"]] == [{keys["2.png"], keys["copy_listed.png"]}]
