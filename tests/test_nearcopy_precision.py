"""Near copies are linked on evidence that a copy gives and a stranger does not.

An output too small to show a copy blows up into blocks or bars on the thumbnail, and any two
such outputs align on the blocks' grid: that is no evidence, so a tiny output gets exact copies
only. And a copy among a family of look-alikes (one template rendered for many subjects) does not
stand out from them, so it is not linked, while three copies of one image under three entities
are.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from packer.config import load_job
from packer.pipeline import nearcopy
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job


def _build(tmp_path: Path, images: dict[str, tuple[np.ndarray, str]], image_transform: dict) -> dict:
    """Build the PNGs ``images`` (name: (pixels, entity)) and return leakage.json's rules."""
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    rows = ["path,label,entity"]
    for name, (pixels, entity) in images.items():
        assert cv2.imwrite(str(raw / name), pixels)
        rows.append(f"{name},{'ab'[len(rows) % 2]},{entity}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    job = write_job(tmp_path / "job", {
        "name": "near",
        "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 17,
                  "balance": {"accept": True}},
        "transform": {"image": image_transform},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    return json.loads((Path(result.manifest_path).parent / "leakage.json").read_text())["rules"]


def _joined(rules: dict) -> list[list[str]]:
    return [sorted(finding["entities"]) for finding in rules["duplicates_span_entities"]["findings"]]


def test_tiles_of_independent_noise_too_small_to_show_a_copy_are_never_near_copies(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    images = {f"n{i}.png": (rng.integers(0, 256, (6, 32), dtype=np.uint8), f"P{i}") for i in range(8)}
    rules = _build(tmp_path, images, {"color": "gray", "tile": {"size": [1, 8], "stride": [1, 8]}})
    assert rules["near_duplicates_across_splits"]["links"] == 0
    assert _joined(rules) == []


def test_an_output_under_the_minimum_side_has_a_blank_signature_and_verifies_as_no_copy() -> None:
    rng = np.random.default_rng(3)
    for shape in [(1, 1, 8), (1, 3, 3), (3, 4, 4), (1, nearcopy.MIN_SIDE - 1, 64), (1, 64, nearcopy.MIN_SIDE - 1),
                  (1, 5, 8, 8)]:
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        thumb = np.asarray(nearcopy.packed_signature(image)["thumb"])
        assert not thumb.any(), shape
        assert nearcopy.verify(thumb, thumb).score == 0.0, shape
    # from the minimum side on, the same image is its own copy, as at any larger size
    image = cv2.resize(rng.integers(0, 256, (6, 6)).astype(np.float32), (nearcopy.MIN_SIDE, nearcopy.MIN_SIDE),
                       interpolation=cv2.INTER_CUBIC).clip(0, 255).astype(np.uint8)[None]
    thumb = np.asarray(nearcopy.packed_signature(image)["thumb"])
    assert nearcopy.verify(thumb, thumb).score >= nearcopy.MIN_SCORE


def _template_family(rng: np.random.Generator, subjects: int) -> list[np.ndarray]:
    """``subjects`` renders of one template of blurred ellipses, each with its own noise (sigma 4)."""
    template = np.zeros((128, 128), np.float32)
    for _ in range(10):
        cv2.ellipse(template, (int(rng.integers(20, 108)), int(rng.integers(20, 108))),
                    (int(rng.integers(5, 30)), int(rng.integers(5, 30))), float(rng.uniform(0, 180)), 0, 360,
                    float(rng.uniform(0.2, 1)), -1)
    template = cv2.GaussianBlur(template, (0, 0), 1.5) * 200 + 20
    return [np.clip(template + rng.normal(0, 4, template.shape), 0, 255).astype(np.uint8) for _ in range(subjects)]


def _unrelated(rng: np.random.Generator, count: int) -> dict[str, tuple[np.ndarray, str]]:
    """``count`` blurred noise images, one entity each."""
    noise = [rng.integers(0, 256, (128, 128), dtype=np.uint8) for _ in range(count)]
    return {f"x{i:02d}.png": (cv2.GaussianBlur(image, (0, 0), 2), f"X{i:03d}") for i, image in enumerate(noise)}


def test_renders_of_one_template_for_many_subjects_are_each_others_rivals_and_not_linked(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    images = {f"s{i:02d}.png": (render, f"S{i:03d}") for i, render in enumerate(_template_family(rng, 10))}
    images.update(_unrelated(rng, 30))
    rules = _build(tmp_path, images, {"size": [64, 64], "color": "gray"})
    assert rules["near_duplicates_across_splits"]["links"] == 0
    assert _joined(rules) == []


def test_an_image_its_copy_and_the_copys_copy_under_three_entities_are_all_linked(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    source = _template_family(rng, 1)[0]
    copy = np.roll(source, 1, axis=1)  # moved a pixel: a near copy, not an exact one
    copy[:, 0] = source[:, 0]
    _, jpeg = cv2.imencode(".jpg", copy, [cv2.IMWRITE_JPEG_QUALITY, 90])
    images = {"source.png": (source, "A"), "copy.png": (copy, "B"),
              "copy-of-copy.png": (cv2.imdecode(jpeg, cv2.IMREAD_GRAYSCALE), "C")}
    images.update(_unrelated(rng, 30))
    rules = _build(tmp_path, images, {"size": [64, 64], "color": "gray"})
    assert _joined(rules) == [["A", "B", "C"]]
    assert rules["near_duplicates_across_splits"]["links"] >= 2
