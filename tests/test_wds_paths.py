"""packer.loader.wds_dataset opens a version's shards as the local files they are: a folder name
holding a URL's delimiters ('#', '?', '%', ':') reads as ShardDataset reads it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from loader_fixtures import build_dataset, sample_image

from packer.loader import ShardDataset, wds_dataset

SIZES = (4, 3)


@pytest.mark.parametrize("folder", ["runs/exp#3", "data?v=2", "a%20b", "file:x"])
def test_a_version_under_a_folder_named_like_a_url_reads_every_sample(tmp_path, folder):
    manifest = build_dataset(tmp_path / folder / "v1", shard_sizes=SIZES)
    samples = list(wds_dataset(manifest, "train"))
    assert [s["__key__"] for s in samples] == [f"s{i:05d}" for i in range(sum(SIZES))]
    for i, sample in enumerate(samples):
        assert sample["__url__"] == str(tmp_path / folder / "v1" / f"train-00000{0 if i < 4 else 1}.tar")
        np.testing.assert_array_equal(np.load(io.BytesIO(sample["npy"])), sample_image(i))
    assert len(samples) == len(list(ShardDataset(manifest, "train")))
