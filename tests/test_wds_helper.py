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


def _member_offsets(path) -> dict[str, int]:
    """Each member's name → the offset of its tar header in the shard."""
    import tarfile

    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def test_samples_a_shard_read_never_reaches_are_each_named_not_lost_in_silence(tmp_path):
    """Python's tar reader (and so webdataset) ends a shard at a damaged member header or where
    the file is cut short: every sample after that point was lost with nothing said (the
    checksum stage never sees them). Each is now a ShardReadError naming it; with webdataset's
    warn_and_continue each is a warning, and the next shard is read whole."""
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    first = tmp_path / "train-000000.tar"
    whole = first.read_bytes()
    first.write_bytes(whole[:min(o for n, o in _member_offsets(first).items() if n.startswith("s00002."))])
    with pytest.raises(ShardReadError, match=r"train-000000.tar: sample s00002: never read: the shard is [\d,]+ "
                                             r"bytes, the manifest says [\d,]+, so webdataset read 2 of the "
                                             r"shard's 4 samples") as err:
        list(wds_dataset(manifest, "train"))
    assert err.value.key == "s00002"
    with pytest.warns(UserWarning) as caught:
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == ["s00000", "s00001", "s00004", "s00005", "s00006"]
    assert [k for k in ("s00002", "s00003") if any(k in str(w.message) for w in caught)] == ["s00002", "s00003"]
    data = bytearray(whole)  # whole again, one flipped byte in sample 1's first member header (its name)
    data[min(o for n, o in _member_offsets(first).items() if n.startswith("s00001.")) + 3] ^= 0x01
    first.write_bytes(bytes(data))
    with pytest.warns(UserWarning) as caught:
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == ["s00000", "s00004", "s00005", "s00006"]
    told = " ".join(str(w.message) for w in caught)
    assert all(k in told for k in ("s00001", "s00002", "s00003")), told
    assert "a damaged tar header ended the read of the shard before it" in told


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
