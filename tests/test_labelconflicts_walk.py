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

import numpy as np

from packer.pipeline.conflicts import aligned_dice, dice_below, exact_aligned_dice, exact_mask_dice, mask_dice
from tests.test_label_conflicts import _keys, _leakage, _png, _source, _texture
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
