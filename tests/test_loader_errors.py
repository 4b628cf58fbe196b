"""Bad data at run time: hash mismatch, truncation, undecodable and hostile samples."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from loader_fixtures import build_dataset, sample_image, split_keys, write_manifest, write_raw_tar

from packer.errors import IntegrityError
from packer.loader import ShardDataset, ShardReadError, make_loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = (4, 6, 5)


def keys_of(loader) -> list[str]:
    return [k for b in loader for k in b["key"]]


def flip_pixel_byte(path: Path, index: int) -> None:
    """Flip one byte of sample ``index``'s pixels inside a shard file."""
    data = bytearray(path.read_bytes())
    at = data.find(sample_image(index).tobytes())
    assert at >= 0
    data[at + 5] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_verify_catches_a_flipped_byte_and_names_the_shard(tmp_path, fmt):
    manifest = build_dataset(tmp_path, fmt=fmt, shard_sizes=SIZES)
    shard = sorted(p for p in tmp_path.iterdir() if p.name.startswith("train-"))[1]
    assert keys_of(make_loader(ShardDataset(manifest, "train", verify=True), 4)) != []
    flip_pixel_byte(shard, 5)
    # without verify the flipped pixel goes unnoticed: verify is what catches it
    assert sorted(keys_of(make_loader(ShardDataset(manifest, "train"), 4))) == split_keys(15)
    with pytest.raises(ShardReadError, match=shard.name) as err:
        keys_of(make_loader(ShardDataset(manifest, "train", verify=True), 4))
    assert err.value.shard == shard.name and "sha256" in str(err.value)
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, IntegrityError)
    # through worker processes the type and the message survive
    with pytest.raises(ShardReadError, match=shard.name):
        keys_of(make_loader(ShardDataset(manifest, "train", verify=True), 4, 2))


def readable_after_cut(shard: bytes, cut: int) -> int:
    """Samples whose .npy member (written last) lies wholly before byte ``cut``."""
    with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
        return sum(1 for m in tar.getmembers() if m.name.endswith(".npy") and m.offset_data + m.size <= cut)


def test_truncated_tar_raises_naming_shard_then_skip_counts_and_caps(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    shard = tmp_path / "train-000001.tar"
    original = shard.read_bytes()
    cut = int(len(original) * 0.55)
    shard.write_bytes(original[:cut])
    lost = SIZES[1] - readable_after_cut(original, cut)
    assert 0 < lost < SIZES[1]

    with pytest.raises(ShardReadError, match="train-000001.tar") as err:
        keys_of(make_loader(ShardDataset(manifest, "train"), 3))
    assert "truncated" in str(err.value)
    with pytest.raises(ShardReadError, match="train-000001.tar"):
        keys_of(make_loader(ShardDataset(manifest, "train"), 3, 2))

    loader = make_loader(ShardDataset(manifest, "train", on_error="skip", max_skipped=lost), 3, 2)
    got = keys_of(loader)
    assert len(got) == len(set(got)) == 15 - lost
    assert loader.skipped == lost and loader.state_dict()["skipped"] == lost
    assert all("train-000001.tar" in line for line in loader.skipped_samples)
    loader.close()

    dataset = ShardDataset(manifest, "train", on_error="skip", max_skipped=lost)
    assert len(list(dataset)) == 15 - lost and dataset.skipped == lost

    with pytest.raises(ShardReadError, match="max_skipped"):
        keys_of(make_loader(ShardDataset(manifest, "train", on_error="skip", max_skipped=lost - 1), 3))
    with pytest.raises(ShardReadError, match="max_skipped"):
        list(ShardDataset(manifest, "train", on_error="skip", max_skipped=lost - 1))


def test_truncated_parquet_raises_naming_shard(tmp_path):
    manifest = build_dataset(tmp_path, fmt="parquet", shard_sizes=SIZES)
    shard = tmp_path / "train-000002.parquet"
    shard.write_bytes(shard.read_bytes()[:-40])
    with pytest.raises(ShardReadError, match="train-000002.parquet"):
        keys_of(make_loader(ShardDataset(manifest, "train"), 3))
    loader = make_loader(ShardDataset(manifest, "train", on_error="skip"), 3)
    assert sorted(keys_of(loader)) == split_keys(10) and loader.skipped == 5


def npy(array: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def good(key: str, label: int = 0) -> list[tuple[str, bytes]]:
    return [(f"{key}.cls", str(label).encode()), (f"{key}.json", b"{}"),
            (f"{key}.npy", npy(np.zeros((1, 4, 4), np.uint8)))]


@pytest.mark.parametrize("bad,reason", [
    ([("b.cls", b"1"), ("b.json", b"{}"), ("b.npy", npy(np.array([{"x": 1}], dtype=object), allow_pickle=True))],
     "b"),                                                               # a pickled object array: never unpickled
    ([("b.cls", b"1"), ("b.json", b"{}"), ("b.npy", b"\x93NUMPY garbage")], "b"),
    ([("b.cls", b"one"), ("b.json", b"{}"), ("b.npy", npy(np.zeros((1, 4, 4), np.uint8)))], "b"),
    ([("b.cls", b"9"), ("b.json", b"{}"), ("b.npy", npy(np.zeros((1, 4, 4), np.uint8)))], "b"),  # unknown label
    ([("b.cls", b"1"), ("b.json", b"{}"), ("b.npy", npy(np.zeros((2, 4, 4), np.uint8)))], "b"),  # wrong shape
    ([("b.cls", b"1"), ("b.json", b"{}"), ("b.npy", npy(np.zeros((1, 4, 4), np.float32)))], "b"),  # wrong dtype
])
def test_undecodable_sample_names_shard_and_key_or_is_skipped(tmp_path, bad, reason):
    entry = write_raw_tar(tmp_path, "train-000000.tar", good("a") + bad + good("c", 2), samples=3)
    manifest = write_manifest(tmp_path, fmt="webdataset", shards=[entry])
    with pytest.raises(ShardReadError, match="train-000000.tar") as err:
        list(ShardDataset(manifest, "train", shuffle=False))
    assert err.value.key == reason and "sample b" in str(err.value)
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    assert [item["key"] for item in dataset] == ["a", "c"] and dataset.skipped == 1


@pytest.mark.parametrize("name", ["../evil.npy", "/tmp/evil.npy", "dir/evil.npy", "a..npy"])
def test_member_names_outside_the_shard_are_rejected(tmp_path, name):
    members = good("a") + [(name, npy(np.zeros((1, 4, 4), np.uint8)))] + good("c")
    entry = write_raw_tar(tmp_path, "train-000000.tar", members, samples=2)
    manifest = write_manifest(tmp_path, fmt="webdataset", shards=[entry])
    with pytest.raises(ShardReadError, match="not a regular file named"):
        list(ShardDataset(manifest, "train", shuffle=False))
    assert not (tmp_path.parent / "evil.npy").exists() and not Path("/tmp/evil.npy").exists()


def test_manifest_paths_cannot_leave_the_version_folder(tmp_path):
    manifest = write_manifest(tmp_path, fmt="webdataset",
                              shards=[{"file": "../x.tar", "bytes": 1, "sha256": "0" * 64, "samples": 1}])
    with pytest.raises(IntegrityError, match="inside the version folder"):
        ShardDataset(manifest, "train")


@pytest.mark.parametrize("array", [np.zeros((2, 8, 8), np.uint8), np.arange(12, dtype=np.float16).reshape(3, 4),
                                   np.array(7, np.int32), np.zeros(5, ">u2"), np.zeros((3, 0, 2), np.uint8),
                                   np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3))])
def test_load_npy_equals_numpy_for_every_header_form(array: np.ndarray) -> None:
    from packer.loader.readers import load_npy

    buffer = io.BytesIO()
    np.save(buffer, array)
    got = load_npy(buffer.getvalue())
    np.testing.assert_array_equal(got, array)
    assert got.shape == array.shape and got.flags.writeable and got.dtype.isnative


def test_load_npy_refuses_cut_data_and_pickles() -> None:
    from packer.loader.readers import load_npy

    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="header promises"):
        load_npy(buffer.getvalue()[:-3])
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        load_npy(pickled.getvalue())
