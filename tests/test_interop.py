"""Interoperability: stock readers (webdataset, pyarrow.dataset, Hugging Face datasets) read our
shards and see exactly what ``_index.parquet`` records and what ``packer.loader`` yields."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from packer.config import SPLITS, load_job
from packer.pipeline.build import BuildOptions, build
from tests.helpers import demo_job_doc, write_job

torch = pytest.importorskip("torch", reason="the loader extra: the round trip compares with packer.loader")


@dataclass(frozen=True)
class Sample:
    label: int
    image: np.ndarray


@dataclass(frozen=True)
class Version:
    folder: Path
    manifest: dict[str, Any]
    index: dict[str, dict[str, Any]]   # key → its _index.parquet row
    loaded: dict[str, dict[str, Sample]]  # split → key → what packer.loader yields

    def shard_files(self, split: str) -> list[str]:
        return [str(self.folder / s["file"]) for s in self.manifest["splits"][split]["shards"]]


def _build(demo_raw: Any, tmp: Path, fmt: str) -> Version:
    from packer.loader import ShardDataset

    doc = demo_job_doc(demo_raw.root, tmp / "out", pack={"format": fmt, "max_samples": 16})
    result = build(load_job(write_job(tmp / "job", doc)), BuildOptions(scheduler="sync", quiet=True))
    index = {row["key"]: row for row in pq.read_table(result.version_dir / "_index.parquet").to_pylist()}
    loaded = {split: {item["key"]: Sample(int(item["label"]), item["image"].numpy())
                      for item in ShardDataset(result.version_dir, split, shuffle=False)}
              for split in SPLITS}
    return Version(folder=result.version_dir, manifest=result.manifest, index=index, loaded=loaded)


@pytest.fixture(scope="module")
def tar_version(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Version:
    return _build(demo_raw, tmp_path_factory.mktemp("interop-tar"), "webdataset")


@pytest.fixture(scope="module")
def parquet_version(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Version:
    return _build(demo_raw, tmp_path_factory.mktemp("interop-parquet"), "parquet")


def _assert_same(version: Version, split: str, seen: dict[str, Sample]) -> None:
    """What a stock reader saw in ``split`` equals the index and the loader, sample for sample."""
    assert sorted(seen) == sorted(k for k, row in version.index.items() if row["split"] == split)
    assert seen.keys() == version.loaded[split].keys()
    for key, sample in seen.items():
        assert sample.label == version.index[key]["label"] == version.loaded[split][key].label
        assert sample.image.dtype == version.loaded[split][key].image.dtype
        np.testing.assert_array_equal(sample.image, version.loaded[split][key].image)


@pytest.mark.parametrize("split", SPLITS)
def test_stock_webdataset_reads_what_the_index_and_the_loader_say(tar_version: Version, split: str) -> None:
    wds = pytest.importorskip("webdataset")
    urls = tar_version.shard_files(split)
    seen: dict[str, Sample] = {}
    for raw in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        key = raw["__key__"]
        assert hashlib.sha256(raw["npy"]).hexdigest() == tar_version.index[key]["sha256"]
        image = np.load(io.BytesIO(raw["npy"]), allow_pickle=False)
        seen[key] = Sample(label=int(raw["cls"]), image=image)
    _assert_same(tar_version, split, seen)
    decoded = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode())
    assert len(decoded) == len(seen)
    for sample in decoded:  # the stock decoders give the same arrays, labels and metadata
        np.testing.assert_array_equal(sample["npy"], seen[sample["__key__"]].image)
        assert sample["cls"] == seen[sample["__key__"]].label
        assert sample["json"]["split"] == split


def _parquet_sample(row: dict[str, Any]) -> Sample:
    image = np.frombuffer(row["image"], dtype=np.dtype(row["dtype"])).reshape(row["shape"])
    assert hashlib.sha256(row["image"]).hexdigest() == row["sha256"]
    return Sample(label=int(row["label"]), image=image)


@pytest.mark.parametrize("split", SPLITS)
def test_pyarrow_dataset_reads_what_the_index_and_the_loader_say(parquet_version: Version, split: str) -> None:
    table = pads.dataset(parquet_version.shard_files(split), format="parquet").to_table()
    rows = table.to_pylist()
    seen = {row["key"]: _parquet_sample(row) for row in rows}
    assert len(seen) == len(rows)
    for row in rows:
        assert row["sha256"] == parquet_version.index[row["key"]]["sha256"]
        assert row["split"] == split
        assert row["label_name"] in parquet_version.manifest["label_map"]
        assert parquet_version.manifest["label_map"][row["label_name"]] == row["label"]
    _assert_same(parquet_version, split, seen)


@pytest.fixture(scope="module")
def hf_datasets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Hugging Face ``datasets``, imported offline with its caches in a temporary folder."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as env:
        # datasets reads these at import time: set them before the first import.
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_HOME", str(home))
        env.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
        datasets = pytest.importorskip("datasets", reason="Hugging Face datasets (the hf extra) is not installed")
        if not datasets.config.HF_DATASETS_OFFLINE:
            pytest.skip("datasets was imported before HF_DATASETS_OFFLINE=1 could be set")
        yield datasets


def test_hugging_face_datasets_reads_every_split(parquet_version: Version, hf_datasets: Any,
                                                  tmp_path: Path) -> None:
    files = {split: parquet_version.shard_files(split) for split in SPLITS}
    loaded = hf_datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "cache"))
    assert set(loaded) == set(SPLITS)
    for split in SPLITS:
        rows = list(loaded[split])
        seen = {row["key"]: _parquet_sample(row) for row in rows}
        assert len(seen) == len(rows) == parquet_version.manifest["splits"][split]["samples"]
        _assert_same(parquet_version, split, seen)
