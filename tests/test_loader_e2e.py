"""The loader on a real demo build: every sample once per epoch, and a tiny model trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.loader import DevicePrefetcher, ShardDataset, make_loader
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import demo_job_doc, write_job


@pytest.fixture(scope="module", params=["webdataset", "parquet"])
def built(request: pytest.FixtureRequest, demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    tmp = tmp_path_factory.mktemp(f"loader-{request.param}")
    doc = demo_job_doc(demo_raw.root, tmp / "out", pack={"format": request.param, "max_samples": 16})
    return build(load_job(write_job(tmp, doc)), BuildOptions(scheduler="sync", quiet=True))


def test_every_sample_of_the_split_once_per_epoch_with_workers(built: BuildResult) -> None:
    index = pq.read_table(built.version_dir / "_index.parquet").to_pylist()
    expected = sorted(r["key"] for r in index if r["split"] == "train")
    dataset = ShardDataset(built.manifest_path, "train", seed=3)
    # the demo mixes 2-channel CT and 3-channel photo samples, so batch size 1 keeps shapes simple
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    keys = [item["key"] for item in loader]
    assert sorted(keys) == expected


def test_a_tiny_model_trains_from_the_shards(built: BuildResult) -> None:
    torch.manual_seed(0)
    label_count = len(built.manifest["label_map"])
    dataset = ShardDataset(built.manifest_path, "train", seed=0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.LazyLinear(label_count))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    loader = make_loader(dataset, batch_size=1, num_workers=0)
    for step, batch in enumerate(DevicePrefetcher(loader, "cpu")):
        image = batch["image"][:, :2]  # CT has 2 window channels, photos 3: train on the first two
        loss = torch.nn.functional.cross_entropy(model(image.float()), batch["label"])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        if step == 30:
            break
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10


def test_bench_loader_command_prints_a_table(built: BuildResult, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench-loader", str(built.manifest_path), "--workers", "0",
                                       "--batch-sizes", "1", "--seconds", "0.2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {"raw_read", "decode", "loader"} <= set(report) and report["loader"][0]["samples_per_s"] > 0
