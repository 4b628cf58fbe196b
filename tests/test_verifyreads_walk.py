"""A shard file that holds another shard's samples: two shards' files swapped (a copy script that
mixed up the names), or one overwritten with a copy of another. The samples in it are intact, so
every reader and `packer verify` must say where they belong, not that bytes changed or a tar
header is damaged, and no reader may deliver a sample from a shard it does not belong to."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import webdataset
from loader_fixtures import build_dataset, sample_image, split_keys

from packer.errors import IntegrityError
from packer.loader import ShardDataset, ShardReadError, wds_dataset
from packer.verify import verify_dataset

SIZES = (4, 4, 4)  # shards of one size: a swap or a copy keeps every file's size


def swap(a: Path, b: Path) -> None:
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def test_shard_dataset_names_a_swapped_shards_sample_as_misplaced_not_as_changed_bytes(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    swap(tmp_path / "train-000000.tar", tmp_path / "train-000001.tar")
    with pytest.raises(IntegrityError) as err:
        list(ShardDataset(manifest, "train", shuffle=False))
    message = str(err.value)
    assert err.value.key == "s00004"
    assert message.startswith("train-000000.tar: sample s00004: checksum_mismatch: the shard holds another shard's "
                              "sample"), message
    assert "_index.parquet puts it in train-000001.tar" in message and "puts sample s00000" in message
    assert "swapped" in message and "packer verify" in message
    assert "bytes changed after the build" not in message and "expected xxh3" not in message


def test_shard_dataset_names_a_misplaced_parquet_sample_too(tmp_path):
    # 3 samples of 3×4×4 a shard: the fixture's first two Parquet shards are then of one size, so
    # the copy passes the size check and only the per-sample check can tell
    manifest = build_dataset(tmp_path, fmt="parquet", shard_sizes=(3, 3, 3), shape=(3, 4, 4))
    first, second = tmp_path / "train-000000.parquet", tmp_path / "train-000001.parquet"
    assert first.stat().st_size == second.stat().st_size
    shutil.copyfile(first, second)
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip", max_skipped=100)
    keys = [item["key"] for item in dataset]
    assert keys == split_keys(9)[:3] + split_keys(9)[6:]  # the copy's samples are not delivered a second time
    assert dataset.skipped == 3
    said = dataset.skipped_samples[0]
    assert said.startswith("train-000001.parquet: sample s00000: checksum_mismatch: the shard holds another "
                           "shard's sample"), said
    assert "_index.parquet puts it in train-000000.parquet" in said and "puts sample s00003" in said


def test_a_damaged_sample_in_its_own_place_still_says_its_bytes_changed(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    path = tmp_path / "train-000001.tar"
    data = bytearray(path.read_bytes())
    at = data.find(sample_image(5).tobytes())
    data[at + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"sample s00005: checksum_mismatch: expected xxh3 .* the sample's bytes "
                                             r"changed after the build"):
        list(ShardDataset(manifest, "train", shuffle=False))


def test_wds_dataset_delivers_no_sample_twice_from_a_shard_overwritten_with_a_copy_of_another(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    shutil.copyfile(tmp_path / "train-000000.tar", tmp_path / "train-000001.tar")
    with pytest.warns(UserWarning):
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == split_keys(12)[:4] + split_keys(12)[8:]
    delivered = []
    with pytest.raises(ShardReadError, match=r"train-000001.tar: sample s00000: .*holds another shard's sample.*"
                                             r"puts it in train-000000.tar"):
        for sample in wds_dataset(manifest, "train"):
            delivered.append(sample["__key__"])
    assert delivered == split_keys(4)


def test_wds_dataset_refuses_a_swapped_shards_samples_and_says_whose_they_are(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    swap(tmp_path / "train-000000.tar", tmp_path / "train-000001.tar")
    delivered = []
    with pytest.raises(ShardReadError) as err:
        for sample in wds_dataset(manifest, "train"):
            delivered.append(sample["__key__"])
    assert delivered == []
    message = str(err.value)
    assert err.value.key == "s00004" and err.value.shard == "train-000000.tar"
    assert "the shard holds another shard's sample" in message and "puts it in train-000001.tar" in message
    with pytest.warns(UserWarning) as warned:
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == split_keys(12)[8:]
    said = [str(w.message) for w in warned]
    assert not any("damaged tar header" in text for text in said), said
    never = [text for text in said if "never read" in text]
    assert len(never) == 8
    assert any("train-000000.tar: sample s00000: never read: the file holds another shard's samples" in text
               and "holds none of the shard's 4 samples" in text and "train-000001.tar" in text
               for text in never), never


def test_verify_says_a_swapped_shard_holds_another_shards_samples(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    swap(tmp_path / "train-000000.tar", tmp_path / "train-000001.tar")
    quick = verify_dataset(manifest)
    shards = [p for p in quick.problems if p.shard != "_splits.parquet"]  # the fixture writes no splits table
    said: dict[str, list[str]] = {p.shard: [] for p in shards}
    for p in shards:
        said[p.shard].append(p.message)
    assert set(said) == {"train-000000.tar", "train-000001.tar"}, shards
    assert len(said["train-000000.tar"]) == 1 and "this file is train-000001.tar's bytes" in \
        said["train-000000.tar"][0], said
    assert "this file is train-000000.tar's bytes" in said["train-000001.tar"][0]
    deep = verify_dataset(manifest, deep=True)
    texts = [f"{p.shard} [{p.key}]: {p.message}" for p in deep.problems]
    assert not any("not in _index.parquet" in text for text in texts), texts
    assert any(text.startswith("train-000000.tar [s00004]: ") and "_index.parquet puts it in train-000001.tar" in text
               for text in texts), texts
