"""Incremental versions: a shard whose bytes an earlier version of the same output already
holds is linked from it, not written again (:mod:`packer.pipeline.reuse`), and the new version
is byte-for-byte what a fresh build of the same inputs gives, complete on its own."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from packer.config import load_job
from packer.manifest import MANIFEST_FILE
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import make_sample_id
from tests.helpers import write_job


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed (no two are near copies)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (128, 96), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def write_tree(raw: Path, files: dict[str, tuple[str, str, int]]) -> None:
    """PNGs at ``files`` (relpath → (label, split, image seed)), each its own entity, and the
    table path,label,entity,split."""
    lines = ["path,label,entity,split"]
    for rel, (label, split, seed) in sorted(files.items()):
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (raw / rel).exists():
            assert cv2.imwrite(str(raw / rel), photo(seed))
        lines.append(f"{rel},{label},{Path(rel).stem},{split}")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")


def job_doc(raw: Path, out: Path, fmt: str = "webdataset") -> dict[str, Any]:
    return {"name": "daily", "sources": [{"name": "xray", "kind": "image", "root": str(raw),
                                          "table": str(raw / "labels.csv")}],
            "split": {"by": "column", "column": "split"}, "transform": {"image": {"size": [32, 32]}},
            "pack": {"format": fmt, "max_samples": 4}, "output": str(out)}


def run_build(tmp: Path, raw: Path, out: Path, fmt: str = "webdataset", **options: Any) -> BuildResult:
    job = load_job(write_job(tmp / "jobs" / out.name, job_doc(raw, out, fmt)))
    return build(job, BuildOptions(**{"scheduler": "sync", "quiet": True, "html_report": False,
                                      "cache_dir": tmp / "cache", **options}))


def day_one() -> dict[str, tuple[str, str, int]]:
    """16 train images (4 shards of 4), 4 valid, 4 test: names sort in seed order."""
    files = {f"img{i:03d}.png": ("ab"[i % 2], "train", i) for i in range(16)}
    files.update({f"val{i:03d}.png": ("ab"[i % 2], "valid", 100 + i) for i in range(4)})
    files.update({f"tst{i:03d}.png": ("ab"[i % 2], "test", 200 + i) for i in range(4)})
    return files


def day_two() -> dict[str, tuple[str, str, int]]:
    """Day one plus two train images whose sample keys sort after every train key of day one,
    so that today's plan (greedy, in key order) keeps the first four train shards as they were
    and adds one: 4 of 7 shards written anew (the last train shard, the new one, none of valid
    and test... which are kept too: 2 more)."""
    files = day_one()
    last = max(make_sample_id("xray", rel) for rel, (_, split, _) in files.items() if split == "train")
    added = [rel for rel in (f"new{n:03d}.png" for n in range(1000)) if make_sample_id("xray", rel) > last][:2]
    files.update({rel: ("a", "train", 300 + i) for i, rel in enumerate(added)})
    return files


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def shard_files(result: BuildResult) -> list[str]:
    return [s["file"] for split in result.manifest["splits"].values() for s in split["shards"]]
