"""A near copy between tiled images is a copy of the image, not of one tile.

Tiles of two different photos can look alike on their own: a 16×16 tile holding one straight edge
between two flat regions matches another such tile (any intensities, a small shift or zoom) as
well as a copy would, and a trial on tiled skimage photo crops linked four patients that way. A
copied photo copies all its tiles, so a near link between two files that each give several samples
(tiles, frames, pages, slices of one volume) joins them only where another link joins the same two
files.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job


def _texture(seed: int, size: int = 32) -> np.ndarray:
    """A textured RGB patch: smooth colour blobs plus fine grain (no two seeds alike)."""
    rng = np.random.default_rng(seed)
    blobs = cv2.resize(rng.integers(20, 235, (6, 6, 3)).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
    return np.clip(blobs + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)


def _build(tmp_path: Path, photos: dict[str, tuple[np.ndarray, str]]) -> dict:
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    rows = ["path,label,entity"]
    for name, (photo, entity) in photos.items():
        assert cv2.imwrite(str(raw / name), photo)
        rows.append(f"{name},{'ab'[len(rows) % 2]},{entity}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    job = write_job(tmp_path / "job", {
        "name": "tiles",
        "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 1,
                  "balance": {"accept": True}},
        "transform": {"image": {"color": "rgb", "tile": {"size": [32, 32]}}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    return json.loads((Path(result.manifest_path).parent / "leakage.json").read_text())["rules"]


def _photo(seeds: tuple[int, int, int, int]) -> np.ndarray:
    """A 64×64 photo of four textured 32×32 quarters."""
    a, b, c, d = (_texture(s) for s in seeds)
    return np.vstack([np.hstack([a, b]), np.hstack([c, d])])


def _shifted(photo: np.ndarray) -> np.ndarray:
    """The photo moved one pixel right (its first column repeated): a near copy, not an exact one."""
    moved = np.roll(photo, 1, axis=1)
    moved[:, 0] = photo[:, 0]
    return moved


def test_one_alike_tile_does_not_join_two_photos_a_copied_photo_does(tmp_path: Path) -> None:
    photos = {f"p{i}.png": (_photo((10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3)), f"patient{i}") for i in range(8)}
    # patient 8's photo shares one quarter with patient 0's, moved by a pixel: a look-alike tile
    lone = _photo((900, 901, 902, 903))
    lone[:32, :32] = _shifted(photos["p0.png"][0])[:32, :32]
    photos["lone.png"] = (lone, "patient8")
    # patient 9's photo is patient 1's whole photo, moved by a pixel: a copy
    photos["copy.png"] = (_shifted(photos["p1.png"][0]), "patient9")
    rules = _build(tmp_path, photos)
    joined = [sorted(finding["entities"]) for finding in rules["duplicates_span_entities"]["findings"]]
    assert ["patient1", "patient9"] in joined, joined
    assert ["patient0", "patient8"] not in joined, joined
