"""``packer build --keep-spill``: the build cache then holds its own copy of every sample the new
version packs, so later rebuilds reuse them whatever happens to the output folder.

A build without it frees the spill and leaves pointers into the published version; a later
``--keep-spill`` build that reuses such entries (whole, or file by file through references)
decodes nothing, so it must copy those samples' bytes into the cache itself: read back from the
version, checked against their sha256s as any reuse checks them. A build without the option
copies nothing."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import write_job

ENTITIES, PER_ENTITY = 16, 4


class Photos:
    """``ENTITIES`` × ``PER_ENTITY`` colour PNGs under ``root`` and their ``labels.csv``
    (``path,label,entity,timestamp``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.labels: dict[str, str] = {}
        rng = np.random.default_rng(1)
        for s in range(ENTITIES):
            for k in range(PER_ENTITY):
                name = f"S{s:02d}/{k}.png"
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                assert cv2.imwrite(str(root / name), rng.integers(0, 255, (24, 24, 3)).astype(np.uint8))
                self.labels[name] = "ab"[k % 2]
        self.write_table()

    def relabel(self, name: str) -> None:
        self.labels[name] = "b" if self.labels[name] == "a" else "a"
        self.write_table()

    def add(self, name: str, seed: int) -> None:
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(self.root / name),
                           np.random.default_rng(seed).integers(0, 255, (24, 24, 3)).astype(np.uint8))
        self.labels[name] = "a"
        self.write_table()

    def write_table(self) -> None:
        with open(self.root / "labels.csv", "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["path", "label", "entity", "timestamp"])
            for name, label in sorted(self.labels.items()):
                out.writerow([name, label, name.split("/")[0], "2023-01-01"])


@pytest.fixture
def photos(tmp_path: Path) -> Photos:
    return Photos(tmp_path / "raw")


def build_photos(photos: Photos, tmp_path: Path, out: str, cache: str, *, keep_spill: bool = False,
                 fmt: str = "webdataset") -> BuildResult:
    doc = {"name": "ks", "sources": [{"kind": "image", "root": str(photos.root),
                                      "table": str(photos.root / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 3},
           "transform": {"image": {"size": [16, 16], "color": "rgb"}}, "pack": {"format": fmt, "max_samples": 8},
           "output": str(tmp_path / out)}
    job = load_job(write_job(tmp_path / f"jobs-{fmt}", doc))
    return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, cache_dir=tmp_path / cache,
                                   keep_spill=keep_spill))


def cache_folder(tmp_path: Path, cache: str) -> Path:
    (folder,) = (tmp_path / cache).iterdir()
    return folder


def entries(cache: Path) -> dict[str, dict]:
    """Each entry's parsed records, by chunk key (the near-copy caches' files are no entries)."""
    found = {}
    for path in cache.glob("*.json"):
        if path.name.count(".") == 1:
            data = json.loads(path.read_text())
            if "samples" in data:
                found[path.stem] = data
    return found


def assert_self_contained(cache: Path, packed: int) -> None:
    """Every entry holds its samples' bytes in a spill of its own (the size its records say), none
    by reference; together they hold the ``packed`` samples of the version just built."""
    held = 0
    for key, data in entries(cache).items():
        spill = cache / f"{key}.spill"
        assert not any(".via." in s["spill"] for s in data["samples"]), key
        if data["samples"]:
            assert spill.is_file() and spill.stat().st_size == data["spill_bytes"], key
            assert all(s["spill"] == spill.name for s in data["samples"]), key
        held += len(data["samples"])
    assert held == packed


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_keep_spill_build_that_decodes_nothing_still_keeps_a_copy_of_every_sample(
        photos: Photos, tmp_path: Path, fmt: str) -> None:
    first = build_photos(photos, tmp_path, "out", "cache", fmt=fmt)
    assert first.files_decoded == ENTITIES * PER_ENTITY
    cache = cache_folder(tmp_path, "cache")
    assert not list(cache.glob("*.spill"))  # a plain build freed its spill: pointers only

    photos.relabel("S00/1.png")  # a re-label: nothing to decode, everything read back from the version
    kept = build_photos(photos, tmp_path, "out", "cache", keep_spill=True, fmt=fmt)
    assert kept.files_decoded == 0
    assert_self_contained(cache, kept.manifest["inputs"]["samples"])

    shutil.rmtree(tmp_path / "out")  # "whatever happens to the output"
    photos.relabel("S01/1.png")
    again = build_photos(photos, tmp_path, "out", "cache", fmt=fmt)
    assert (again.files_decoded, again.files_cached) == (0, ENTITIES * PER_ENTITY)
    fresh = build_photos(photos, tmp_path, "fresh", "fresh-cache", fmt=fmt)
    assert again.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


def test_entries_holding_samples_by_reference_get_their_own_copy_under_keep_spill(
        photos: Photos, tmp_path: Path) -> None:
    """A plain build after a new file holds its chunk's unchanged files by reference into the
    earlier version; the next --keep-spill build reuses that entry whole and copies those bytes
    too, so deleting every version costs nothing."""
    build_photos(photos, tmp_path, "out", "cache")
    photos.add("S00/9.png", seed=99)
    added = build_photos(photos, tmp_path, "out", "cache")
    assert added.files_decoded == 1
    cache = cache_folder(tmp_path, "cache")
    assert any(".via." in s["spill"] for data in entries(cache).values() for s in data["samples"])

    kept = build_photos(photos, tmp_path, "out", "cache", keep_spill=True)
    assert (kept.files_decoded, kept.files_cached) == (0, ENTITIES * PER_ENTITY + 1)
    assert_self_contained(cache, kept.manifest["inputs"]["samples"])

    shutil.rmtree(tmp_path / "out")
    again = build_photos(photos, tmp_path, "out", "cache")
    assert again.files_decoded == 0
    assert again.manifest["dataset_hash"] == kept.manifest["dataset_hash"]


def test_bytes_that_do_not_check_out_are_not_copied_but_decoded_again(photos: Photos, tmp_path: Path) -> None:
    """The copy is read back from the version and checked against the samples' digests: a
    shard damaged in place is not copied into the cache; its files are decoded again."""
    first = build_photos(photos, tmp_path, "out", "cache")
    shard = sorted(first.version_dir.glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[1024 + 200] ^= 0xFF  # inside the first sample's .npy pixels (after its tar headers)
    shard.write_bytes(bytes(data))
    photos.relabel("S00/1.png")
    kept = build_photos(photos, tmp_path, "out", "cache", keep_spill=True)
    assert 0 < kept.files_decoded < ENTITIES * PER_ENTITY
    cache = cache_folder(tmp_path, "cache")
    assert_self_contained(cache, kept.manifest["inputs"]["samples"])
    shutil.rmtree(tmp_path / "out")
    again = build_photos(photos, tmp_path, "out", "cache")
    fresh = build_photos(photos, tmp_path, "fresh", "fresh-cache")
    assert again.files_decoded == 0 and again.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


def test_without_keep_spill_nothing_is_copied_into_the_cache(photos: Photos, tmp_path: Path) -> None:
    build_photos(photos, tmp_path, "out", "cache")
    photos.relabel("S00/1.png")
    second = build_photos(photos, tmp_path, "out", "cache")
    assert second.files_decoded == 0
    assert not list(cache_folder(tmp_path, "cache").glob("*.spill"))
