"""Jobs of several sources, walked as a user would: the advice a message offers for one source
or several is followed as written, and must work.

- A batch of several shapes, where one source itself holds several, offers a view for the other
  sources; sources of different shapes never share that view (it would mix shapes again).
- The warning for class names that differ only in case offers each source that holds an odd
  spelling its own ``label:`` (its own kind, column, folder, separator), naming the source."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from packer.config import load_job
from packer.loader import MixedShapesError, ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import write_job

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def write_photos(folder: Path, prefix: str, sizes: list[int], count: int, seed: int) -> None:
    """``count`` random RGB PNGs under ``folder``, their sides taken from ``sizes`` in turn."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        side = sizes[i % len(sizes)]
        cv2.imwrite(str(folder / f"{prefix}{i:02d}.png"), rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def build_job(root: Path, doc: dict[str, Any]) -> BuildResult:
    return build(load_job(write_job(root, doc)), BuildOptions(scheduler="sync", quiet=True, html_report=False))


# 1. a view offered for the sources of one shape holds one shape ------------------------------------

@pytest.fixture(scope="module")
def four_sources(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """'a' holds 24×24 and 40×40 photos, 'b' and 'd' 16×16 alone, 'c' 32×32 alone; no size."""
    root = tmp_path_factory.mktemp("four-sources")
    sides = {"a": [24, 40], "b": [16], "c": [32], "d": [16]}
    for seed, (source, sizes) in enumerate(sides.items()):
        write_photos(root / "raw" / source, source, sizes, 8, seed)
    return build_job(root, {
        "name": "four", "sources": [{"kind": "image", "root": f"raw/{s}", "label": "none"} for s in sides],
        "split": {"by": "entity", "ratios": {"train": 1.0}, "near_duplicates": {"enabled": False}},
        "transform": {"image": {"color": "rgb"}}, "pack": {"format": "webdataset"}, "output": str(root / "out")})


def test_a_mixed_batch_offers_one_view_per_shape_and_each_view_stacks(four_sources: BuildResult) -> None:
    """The message listed every single-shape source in one view, sources=["b", "c", "d"], though
    b and c differ in shape: following it raised MixedShapesError again."""
    manifest = four_sources.manifest_path
    with pytest.raises(MixedShapesError) as caught:
        for _ in make_loader(ShardDataset(manifest, "train", shuffle=True, seed=0), batch_size=32):
            pass
    message = str(caught.value)
    assert "source a itself holds several shapes" in message, message
    views = [[s.strip().strip('"') for s in listed.split(",")]
             for listed in re.findall(r"ShardDataset\(manifest, split, sources=\[([^\]]*)\]\)", message)]
    # b and d share 16×16 and may share a view; c (32×32) has its own; a (two shapes) is in none
    assert sorted(views) == [["b", "d"], ["c"]], message
    assert "3×16×16" in message and "3×32×32" in message
    for view in views:
        loaded = [batch for batch in make_loader(ShardDataset(manifest, "train", sources=view), batch_size=32)]
        assert sum(len(batch["key"]) for batch in loaded) == 8 * len(view)
