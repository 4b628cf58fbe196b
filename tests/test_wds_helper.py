"""packer.loader.wds_dataset: a stock webdataset.WebDataset over a version's shards, checking each
sample's checksum against _index.parquet and naming its label from the manifest's label map."""

from __future__ import annotations

import io

import numpy as np
import pytest
import webdataset
from loader_fixtures import build_dataset, sample_image

from packer.errors import ConfigError
from packer.loader import ShardReadError, wds_dataset

SIZES = (4, 3)


def flip_pixel(path, index: int) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(sample_image(index).tobytes())
    assert at >= 0
    data[at + 7] ^= 0x10
    path.write_bytes(bytes(data))


def test_stock_webdataset_reads_every_sample_with_its_label_name(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    samples = list(wds_dataset(manifest, "train"))
    assert [s["__key__"] for s in samples] == [f"s{i:05d}" for i in range(sum(SIZES))]
    for i, sample in enumerate(samples):
        assert sample["__label_name__"] == f"c{i % 3}" and int(sample["cls"]) == i % 3
        np.testing.assert_array_equal(np.load(io.BytesIO(sample["npy"])), sample_image(i))
    # webdataset's own stages chain on: its decoder turns .npy into arrays
    decoded = next(iter(wds_dataset(manifest, "train").decode()))
    np.testing.assert_array_equal(decoded["npy"], sample_image(0))


def test_a_flipped_byte_raises_naming_the_sample_or_is_skipped_by_webdatasets_handler(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    flip_pixel(tmp_path / "train-000001.tar", 5)
    with pytest.raises(ShardReadError, match=r"train-000001.tar: sample s00005: checksum_mismatch: expected xxh3 "
                                             r"[0-9a-f]{16} .*found [0-9a-f]{16}") as err:
        list(wds_dataset(manifest, "train"))
    assert err.value.key == "s00005"
    with pytest.warns(UserWarning, match="s00005"):
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == [f"s{i:05d}" for i in range(sum(SIZES)) if i != 5]
    # without the check stock webdataset hands the damaged pixels over
    assert len(list(wds_dataset(manifest, "train", verify="off"))) == sum(SIZES)


def test_parquet_datasets_are_refused_with_the_reader_to_use(tmp_path):
    manifest = build_dataset(tmp_path, fmt="parquet", shard_sizes=SIZES)
    with pytest.raises(ConfigError, match="read Parquet shards with ShardDataset"):
        wds_dataset(manifest, "train")


def test_an_empty_split_is_a_config_error_naming_it_not_webdatasets_index_error(tmp_path):
    """A small job can leave a split empty (samples 0, shards []): webdataset raised a bare
    IndexError from its shard list."""
    manifest = build_dataset(tmp_path, shard_sizes=())
    with pytest.raises(ConfigError, match="split 'train' holds no samples in this version"):
        wds_dataset(manifest, "train")
