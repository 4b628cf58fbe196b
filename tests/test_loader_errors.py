"""Bad data at run time: hash mismatch, truncation, undecodable and hostile samples."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from loader_fixtures import build_dataset, flip_pixel_byte, sample_image, split_keys, write_manifest, write_raw_tar

from packer.errors import ConfigError, IntegrityError
from packer.loader import ShardDataset, ShardLoader, ShardReadError, make_loader
from packer.targets import Target

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = (4, 6, 5)


def keys_of(loader) -> list[str]:
    return [k for b in loader for k in b["key"]]


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_verify_catches_a_flipped_byte_and_names_the_shard(tmp_path, fmt):
    manifest = build_dataset(tmp_path, fmt=fmt, shard_sizes=SIZES)
    shard = sorted(p for p in tmp_path.iterdir() if p.name.startswith("train-"))[1]
    assert keys_of(make_loader(ShardDataset(manifest, "train", verify=True), 4)) != []
    flip_pixel_byte(shard, 5)
    # with verify="off" the flipped pixel goes unnoticed; the default per-sample check names the sample
    assert sorted(keys_of(make_loader(ShardDataset(manifest, "train", verify="off"), 4))) == split_keys(15)
    with pytest.raises(ShardReadError, match=f"{shard.name}: sample s00005: checksum_mismatch"):
        keys_of(make_loader(ShardDataset(manifest, "train"), 4))
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


def test_another_versions_manifest_in_a_version_folder_is_named_not_the_index(tmp_path):
    """A version folder holding another version's manifest.json: the loader said the (intact)
    index was corrupt and offered verify='off', and verify listed every shard as damaged. The
    manifest records its own version: a folder named for another one says which file is wrong."""
    import json
    import re
    import shutil

    from packer.errors import IntegrityError
    from packer.verify import verify_dataset

    first = json.loads(build_dataset(tmp_path / "a", shard_sizes=SIZES).read_text())
    second = json.loads(build_dataset(tmp_path / "b", shard_sizes=(3, 3)).read_text())
    assert first["version"] != second["version"]
    folder = tmp_path / "demo" / first["version"]
    shutil.copytree(tmp_path / "a", folder)
    (folder / "manifest.json").write_text(json.dumps(second))
    said = rf"it is version {second['version']}'s manifest, but it sits in the folder of version {first['version']}"
    with pytest.raises(IntegrityError, match=said) as raised:
        ShardDataset(folder, "train")
    # the registry is whatever the job's registry: names (or none): no made-up manifests/ path
    assert "manifests/" not in str(raised.value) and "<registry>/" in str(raised.value), raised.value
    found = verify_dataset(folder)
    assert len(found.problems) == 1 and re.search(said, json.dumps(found.to_json())), found.to_json()
    from packer.verify import format_result
    head = format_result(found).splitlines()[0]  # no dataset named: the file given is, never "verify ? ?"
    assert head.startswith(f"verify {found.manifest} (hashes)") and "?" not in head, head
    shutil.copytree(tmp_path / "a", tmp_path / "demo" / "renamed")  # a folder of another name: not judged
    assert len(list(ShardDataset(tmp_path / "demo" / "renamed", "train"))) == sum(SIZES)


def test_a_plain_dataloaders_workers_together_never_skip_more_than_max_skipped(tmp_path):
    """Each worker of a plain DataLoader counted its own skips against the whole cap: with 2
    workers, 27 samples of a deleted shard went missing under max_skipped=20, with no error and
    dataset.skipped 0 in the main process. Each worker now holds its share of the cap."""
    from torch.utils.data import DataLoader

    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    (tmp_path / "train-000001.tar").unlink()
    lost = SIZES[1]
    cap = lost - 1
    for workers in (2, 3):
        with pytest.raises(ShardReadError, match=rf"share \(\d+\) of max_skipped={cap} among {workers} workers"):
            list(DataLoader(ShardDataset(manifest, "train", on_error="skip", max_skipped=cap), batch_size=None,
                            num_workers=workers))
    delivered = list(DataLoader(ShardDataset(manifest, "train", on_error="skip", max_skipped=4 * lost),
                                batch_size=None, num_workers=2))
    assert len(delivered) == 15 - lost  # a cap every worker's share covers: the rest is read


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("workers", [0, 2])
def test_skipped_samples_never_put_ddp_ranks_out_of_step(tmp_path, uneven, workers):
    """pad/drop promise every rank the same batches; a skipped sample must not break that
    (a rank a batch short leaves the others waiting in their gradient all-reduce forever)."""
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    shard = tmp_path / "train-000001.tar"
    original = shard.read_bytes()
    shard.write_bytes(original[:int(len(original) * 0.3)])
    lost = SIZES[1] - readable_after_cut(original, int(len(original) * 0.3))
    assert lost >= 3                                 # enough for whole batches of one rank to fail
    world, batch = 3, 2
    sizes, delivered, skipped = [], [], 0
    for rank in range(world):
        dataset = ShardDataset(manifest, "train", rank=rank, world_size=world, uneven=uneven,
                               on_error="skip", seed=3)
        with make_loader(dataset, batch, workers) as loader:
            batches = list(loader)
            sizes.append([len(b["key"]) for b in batches])
            assert len(batches) == len(loader)
            delivered += [k for b in batches for k in b["key"]]
            skipped += loader.skipped
            assert all("replaced by a repeat of s" in line for line in loader.skipped_samples)
    assert sizes[0] == sizes[1] == sizes[2]          # same batches, same sizes, on every rank
    assert skipped == lost
    per_rank = -(-15 // world) if uneven == "pad" else 15 // world
    assert len(delivered) == world * per_rank
    assert set(delivered) <= set(split_keys(15))
    # nothing readable is lost for drop's 15 = 3 × 5; repeats stand in for the bad ones
    if uneven == "drop":
        assert len(set(delivered)) == 15 - lost

    # a plain iteration of the dataset fills the same way
    counts = [len(list(ShardDataset(manifest, "train", rank=r, world_size=world, uneven=uneven,
                                    on_error="skip"))) for r in range(world)]
    assert counts == [per_rank] * world


def test_a_worker_with_nothing_readable_cannot_stand_in_and_says_so(tmp_path):
    manifest = build_dataset(tmp_path, shard_sizes=(3,))
    shard = tmp_path / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:600])
    with pytest.raises(ShardReadError, match="none of the 3 samples"):
        keys_of(make_loader(ShardDataset(manifest, "train", uneven="pad", on_error="skip"), 2))
    # uneven="exact" promises no lockstep: the samples are just skipped
    loader = make_loader(ShardDataset(manifest, "train", on_error="skip"), 2)
    assert keys_of(loader) == [] and loader.skipped == 3


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
    manifest = write_manifest(tmp_path, fmt="webdataset", shards=[entry])  # no index: read with verify="off"
    with pytest.raises(ShardReadError, match="train-000000.tar") as err:
        list(ShardDataset(manifest, "train", shuffle=False, verify="off"))
    assert err.value.key == reason and "sample b" in str(err.value)
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip", verify="off")
    assert [item["key"] for item in dataset] == ["a", "c"] and dataset.skipped == 1


@pytest.mark.parametrize("name", ["../evil.npy", "/tmp/evil.npy", "dir/evil.npy", "a..npy"])
def test_member_names_outside_the_shard_are_rejected(tmp_path, name):
    members = good("a") + [(name, npy(np.zeros((1, 4, 4), np.uint8)))] + good("c")
    entry = write_raw_tar(tmp_path, "train-000000.tar", members, samples=2)
    manifest = write_manifest(tmp_path, fmt="webdataset", shards=[entry])
    with pytest.raises(ShardReadError, match=r"unsafe member name .*\(a path, not <key>\.<ext>\)"):
        list(ShardDataset(manifest, "train", shuffle=False, verify="off"))
    assert not (tmp_path.parent / "evil.npy").exists() and not Path("/tmp/evil.npy").exists()


def test_manifest_paths_cannot_leave_the_version_folder(tmp_path):
    manifest = write_manifest(tmp_path, fmt="webdataset",
                              shards=[{"file": "../x.tar", "bytes": 1, "sha256": "0" * 64, "samples": 1}])
    with pytest.raises(IntegrityError, match="inside the version folder"):
        ShardDataset(manifest, "train")


def test_a_registry_copy_without_shards_beside_it_is_refused_before_the_first_read(tmp_path):
    """``manifests/<name>/<version>.json`` holds no shards: say so when the dataset is made,
    with the folder to open instead, not as an unreadable shard in the first batch."""
    manifest = build_dataset(tmp_path / "v", shard_sizes=(3,))
    copy = tmp_path / "manifests" / "abc123.json"
    copy.parent.mkdir()
    copy.write_bytes(manifest.read_bytes())
    with pytest.raises(ConfigError, match=r"a registry copy of the manifest, without its shards beside it "
                                          r"\(train-000000\.tar is not in .*manifests\); open the version folder"):
        ShardDataset(copy, "train")
    beside = manifest.parent / "abc123.json"  # a copy next to the shards reads them
    beside.write_bytes(manifest.read_bytes())
    assert len(list(ShardDataset(beside, "train", shuffle=False))) == 3


@pytest.mark.parametrize("array", [np.zeros((2, 8, 8), np.uint8), np.arange(12, dtype=np.float16).reshape(3, 4),
                                   np.array(7, np.int32), np.zeros(5, ">u2"), np.zeros((3, 0, 2), np.uint8),
                                   np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3))])
def test_load_npy_equals_numpy_for_every_header_form(array: np.ndarray) -> None:
    from packer.shards.members import load_npy

    buffer = io.BytesIO()
    np.save(buffer, array)
    got = load_npy(buffer.getvalue())
    np.testing.assert_array_equal(got, array)
    assert got.shape == array.shape and got.flags.writeable and got.dtype.isnative
    # without a copy, from a view (the HTML report reads members of a mapped shard): the same values
    source = bytearray(buffer.getvalue())
    view = load_npy(memoryview(source), copy=False)
    np.testing.assert_array_equal(view, array)
    assert view.shape == array.shape and view.dtype.isnative
    if array.dtype.isnative and array.flags.c_contiguous and array.size:
        assert np.shares_memory(view, np.frombuffer(source, np.uint8))  # packer's own layout: not copied


def test_load_npy_refuses_cut_data_and_pickles() -> None:
    from packer.shards.members import load_npy

    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="header promises"):
        load_npy(buffer.getvalue()[:-3])
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        load_npy(pickled.getvalue())


@given(st.integers(0, 127), st.sampled_from([b"X", b"(", b"'", b"\\", b"\n", b"{", b"9", b"\x00", b"}"]))
def test_a_damaged_npy_header_is_a_value_error_or_an_array_never_numpys_parser_error(at: int, byte: bytes) -> None:
    """Whatever a flipped header byte makes numpy's header parser raise (TokenError, SyntaxError,
    ...), load_npy raises ValueError, which the readers turn into an ``undecodable`` sample:
    ``on_error="skip"`` can skip it."""
    from packer.shards.members import load_npy

    buffer = io.BytesIO()
    np.save(buffer, np.arange(48, dtype=np.uint8).reshape(3, 4, 4))
    data = bytearray(buffer.getvalue())
    data[at:at + 1] = byte
    try:
        array = load_npy(bytes(data))
    except ValueError:
        return
    assert isinstance(array, np.ndarray)


@pytest.mark.parametrize("corrupt", [b"{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 4), }  X\n",
                                     b"{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 4(, }   \n"])
def test_skip_skips_a_sample_whose_npy_header_numpy_cannot_parse(tmp_path, corrupt):
    manifest = build_dataset(tmp_path / "v", shard_sizes=(3,))
    shard = manifest.parent / "train-000000.tar"
    data = bytearray(shard.read_bytes())
    magic = data.find(b"\x93NUMPY")
    header = data[magic + 10:data.index(b"\n", magic) + 1]
    data[magic + 10:magic + 10 + len(header)] = corrupt.ljust(len(header))[:len(header) - 1] + b"\n"
    shard.write_bytes(bytes(data))
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    assert len(list(dataset)) == 2 and dataset.skipped == 1
    with pytest.raises(ShardReadError, match="undecodable"):
        list(ShardDataset(manifest, "train", shuffle=False))


def decode_both_ways(path: Path, check, monkeypatch: pytest.MonkeyPatch, *,
                     index_of: Path | None = None) -> list[tuple[object, object]]:
    """Every sample of the tar shard at ``path`` (as scanned from ``index_of``, default ``path``)
    decoded by positional reads straight into the image and by whole-member reads (the path
    taken where ``os.preadv`` is missing), then judged by ``check``: a ``Decoded`` or the
    defect's (reason, message). The loader's own way, views of a private map of the shard, is
    held here to give what the positional reads give, sample by sample."""
    from packer.shards import tar
    from packer.shards.members import SampleDefect

    def judged(result: object) -> object:
        outcome = check.outcome(result)
        return (outcome.reason, outcome.message) if isinstance(outcome, SampleDefect) else outcome

    index = tar.scan_tar(index_of or path)
    out = []
    with open(path, "rb", buffering=0) as fh:
        for sample in index.samples:
            monkeypatch.setattr(tar, "_PREAD", True)
            positional = judged(tar.read_tar_sample(fh, sample))
            mapped = tar.map_shard(fh)
            if mapped is not None:  # None only for an empty file, which has no samples
                assert_same_outcome(positional, judged(tar.read_tar_sample(fh, sample, mapped)))
            monkeypatch.setattr(tar, "_PREAD", False)
            whole = judged(tar.read_tar_sample(fh, sample))
            out.append((positional, whole))
    return out


def assert_same_outcome(a: object, b: object) -> None:
    from packer.loader.readers import Decoded

    if isinstance(a, Decoded) and isinstance(b, Decoded):
        assert (a.key, a.label) == (b.key, b.label)
        assert a.image.dtype == b.image.dtype and a.image.dtype.isnative and a.image.flags.writeable
        np.testing.assert_array_equal(a.image, b.image)
    else:
        assert a == b


def long_header_npy() -> bytes:
    """A valid npy whose header (a 40-dimensional shape) is longer than the first read of a member."""
    return npy(np.zeros((1,) * 38 + (2, 2), np.uint8))


CUT_DATA = ("undecodable", "a.npy: npy data holds 13 bytes, the header promises 16 for shape (1, 4, 4) uint8")


needs_preadv = pytest.mark.skipif(not hasattr(os, "preadv"), reason="no positional reads on this platform")


@needs_preadv
@pytest.mark.parametrize("dtype,member,expected", [
    ("uint8", npy(np.arange(48, dtype=np.uint8).reshape(3, 4, 4)), "decoded"),
    ("uint16", npy(np.arange(48, dtype=">u2").reshape(3, 4, 4)), "decoded"),     # not the machine's byte order
    ("uint16", npy(np.arange(48, dtype="<u2").reshape(3, 4, 4)), "decoded"),
    ("float32", npy(np.linspace(-1, 1, 32, dtype=">f4").reshape(2, 4, 4)), "decoded"),
    ("uint8", npy(np.asfortranarray(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))), "decoded"),  # np.load
    ("uint8", npy(np.zeros((1, 4, 4), np.uint8))[:-3], CUT_DATA),            # header promises more than it holds
    ("uint8", npy(np.array([{"x": 1}], dtype=object), allow_pickle=True), "undecodable"),
    ("uint8", b"\x93NUMPY\x01\x00garbage", "undecodable"),
    ("uint8", long_header_npy(), "bad_sample"),                              # decoded, but not C×H×W
    ("uint8", npy(np.zeros((1, 4, 4), np.uint16)), "bad_sample"),            # wrong dtype
])
def test_reading_pixels_straight_into_the_image_agrees_with_whole_member_reads(tmp_path, monkeypatch, dtype,
                                                                             member, expected):
    from packer.loader.readers import Decoded, SampleCheck

    members = [("a.cls", b"1"), ("a.json", b"{}"), ("a.npy", member),
               ("b.cls", b"one"), ("b.json", b"{}"), ("b.npy", member)]       # b: an unreadable label
    write_raw_tar(tmp_path, "train-000000.tar", members, samples=2)
    check = SampleCheck(dtype=dtype, shape=None, target=Target("class", ("a", "b", "c")))
    (a_pos, a_whole), (b_pos, b_whole) = decode_both_ways(tmp_path / "train-000000.tar", check, monkeypatch)
    assert_same_outcome(a_pos, a_whole)
    assert_same_outcome(b_pos, b_whole)
    assert b_pos == ("bad_label", "b.cls holds b'one', not an integer")
    if expected == "decoded":
        assert isinstance(a_pos, Decoded) and a_pos.label == 1
        np.testing.assert_array_equal(a_pos.image, np.load(io.BytesIO(member)))
    elif isinstance(expected, tuple):
        assert a_pos == expected
    else:
        assert isinstance(a_pos, tuple) and a_pos[0] == expected


@needs_preadv
@pytest.mark.parametrize("where", ["cls", "npy header", "npy data"])
def test_a_member_cut_short_after_the_scan_is_truncated_either_way(tmp_path, monkeypatch, where):
    from packer.loader import readers
    from packer.shards.tar import scan_tar

    manifest = build_dataset(tmp_path, shard_sizes=(3,), shape=(3, 8, 8))
    shard = manifest.parent / "train-000000.tar"
    sample = scan_tar(shard).samples[1]
    cls_at, npy_at = sample.members["cls"][0], sample.members["npy"][0]
    cut = {"cls": cls_at, "npy header": npy_at + 20, "npy data": npy_at + 128 + 50}[where]
    cut_copy = tmp_path / "cut.tar"
    cut_copy.write_bytes(shard.read_bytes()[:cut])
    check = readers.SampleCheck(dtype="uint8", shape=(3, 8, 8), target=Target("class", ("a", "b", "c")))
    outcomes = decode_both_ways(cut_copy, check, monkeypatch, index_of=shard)
    ext = "cls" if where == "cls" else "npy"
    assert outcomes[1] == (("truncated", f"s00001.{ext} is cut short"),) * 2
    assert all(isinstance(o, tuple) for o in outcomes[2])
    np.testing.assert_array_equal(outcomes[0][0].image, sample_image(0, (3, 8, 8)))


def test_big_endian_samples_load_as_native_arrays(tmp_path):
    values = [np.arange(i, i + 32, dtype=">u2").reshape(2, 4, 4) * 1000 for i in range(3)]
    members = []
    for i, array in enumerate(values):
        members += [(f"k{i}.cls", str(i % 3).encode()), (f"k{i}.json", b"{}"), (f"k{i}.npy", npy(array))]
    entry = write_raw_tar(tmp_path, "train-000000.tar", members, samples=3)
    manifest = write_manifest(tmp_path, fmt="webdataset", shards=[entry], shape=(2, 4, 4), dtype="uint16")
    items = list(ShardDataset(manifest, "train", shuffle=False, verify="off"))  # a hand-made shard: no index
    assert [item["key"] for item in items] == ["k0", "k1", "k2"]
    for item, array in zip(items, values, strict=True):
        assert item["image"].dtype == torch.uint16
        np.testing.assert_array_equal(item["image"].numpy(), array.astype(np.uint16))


def test_bench_loader_on_an_empty_split_says_so_instead_of_a_table_of_zeros(tmp_path):
    from click.testing import CliRunner

    from packer.cli import main

    manifest = build_dataset(tmp_path / "empty", shard_sizes=())
    result = CliRunner().invoke(main, ["bench-loader", str(manifest), "--seconds", "0.1", "--workers", "0"])
    assert result.exit_code == 2
    assert "split 'train' has no samples; nothing to measure" in result.output and "samples/s" not in result.output


def test_a_missing_shard_is_named_by_its_full_path(tmp_path):
    manifest = build_dataset(tmp_path / "v", shard_sizes=(2, 2))
    gone = manifest.parent / "train-000001.tar"
    gone.unlink()
    with pytest.raises(ShardReadError, match=f"cannot open the shard {gone} .*restore it or rebuild the dataset"):
        list(ShardDataset(manifest, "train", shuffle=False))


def test_skip_reads_a_shard_of_the_wrong_size_as_far_as_it_can_and_says_so(tmp_path, caplog):
    """700 bytes cut from a tar shard's end take only its end-of-archive padding: every sample is
    intact, and on_error='skip' delivers them, with one warning naming the shard and the sizes."""
    manifest = build_dataset(tmp_path / "v", shard_sizes=(3, 2))
    shard = manifest.parent / "train-000001.tar"
    size = shard.stat().st_size
    os.truncate(shard, size - 700)
    with caplog.at_level("WARNING", logger="packer.loader"):
        items = list(ShardDataset(manifest, "train", shuffle=False, on_error="skip"))
        list(ShardDataset(manifest, "train", shuffle=False, on_error="skip"))  # once per shard and process
    assert len(items) == 5
    said = [r.getMessage() for r in caplog.records if "still readable" in r.getMessage()]
    assert len(said) == 1 and f"the shard is {size - 700} bytes, the manifest says {size}" in said[0]
    with pytest.raises(ShardReadError, match="the manifest says"):
        list(ShardDataset(manifest, "train", shuffle=False))


def test_drop_over_more_ranks_than_samples_warns_that_every_rank_gets_none(tmp_path, caplog):
    manifest = build_dataset(tmp_path / "v", shard_sizes=(5,))
    with caplog.at_level("WARNING", logger="packer.loader"):
        dropped = ShardDataset(manifest, "train", rank=0, world_size=8, uneven="drop")
        ShardDataset(manifest, "train", rank=0, world_size=8, uneven="pad")
    assert len(list(dropped)) == 0
    (said,) = [r.getMessage() for r in caplog.records if "uneven='drop'" in r.getMessage()]
    assert "5 samples over 8 ranks with uneven='drop' gives every rank floor(5/8) = 0 samples" in said


def test_a_dataset_that_packed_nothing_is_said_to_be_empty_not_of_mixed_dtypes(tmp_path):
    # a job whose every file is bad, under validate.max_bad_fraction: 1.0, builds (exit 0) a version
    # of no samples, whose sample_schema.dtype is null because no sample has one; "mixed dtypes"
    # sends the user hunting for samples that do not exist, as an integrity failure (exit 5).
    # (A job whose files are all left out on purpose is refused before it builds: "no sample to pack".)
    from click.testing import CliRunner

    from packer.cli import main
    from tests.test_targets import _build, _job

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.dcm").write_bytes(b"not a DICOM file at all" * 8)
    result = _build(_job(tmp_path, [{"kind": "dicom", "root": str(tmp_path / "raw"), "label": "none"}],
                         validate={"max_bad_fraction": 1.0}))
    with pytest.raises(ConfigError) as refused:
        ShardDataset(result.manifest_path, "train")
    assert "mixed dtypes" not in str(refused.value) and "has no samples" in str(refused.value)
    assert "excluded.jsonl" in str(refused.value)
    shown = CliRunner().invoke(main, ["inspect", str(result.version_dir)])
    assert shown.exit_code == 0 and "mixed dtypes" not in shown.output and "no samples" in shown.output, shown.output


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_a_loader_resumed_mid_epoch_fills_skipped_places_as_the_uninterrupted_epoch_did(tmp_path, uneven):
    """Under pad/drop a skipped sample's place is taken by a repeat of a readable one. A loader
    resumed from a state saved at any batch must deliver exactly the rest of the uninterrupted
    epoch, repeats included: the stand-in cannot be one read before the resume point."""
    import json

    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    shard = tmp_path / "train-000001.tar"
    original = shard.read_bytes()
    shard.write_bytes(original[:int(len(original) * 0.3)])

    def loader() -> ShardLoader:
        dataset = ShardDataset(manifest, "train", uneven=uneven, on_error="skip", seed=5, shuffle=False)
        return make_loader(dataset, 2, 0)

    full = keys_of(loader())
    for stop in range(1, len(full) // 2):
        first = loader()
        head: list[str] = []
        for i, batch in enumerate(first):
            head += batch["key"]
            if i + 1 == stop:
                break
        state = json.loads(json.dumps(first.state_dict()))
        second = loader()
        second.load_state_dict(state)
        assert head + keys_of(second) == full, stop


@pytest.mark.parametrize(("argument", "value"),
                         [("seed", "x"), ("seed", 1.5), ("seed", True), ("shuffle_buffer", "64")])
def test_a_seed_or_buffer_that_is_not_an_int_is_a_config_error_naming_it(tmp_path, argument, value):
    """A seed read from a config file as text ("x", "1.5") used to fail inside int() with a bare
    ValueError, or (1.5, True) be taken silently; it is the caller's setting to fix (exit 2)."""
    manifest = build_dataset(tmp_path, shard_sizes=(3,))
    with pytest.raises(ConfigError, match=f"{argument} must be an int"):
        ShardDataset(manifest, "train", **{argument: value})
    assert len(list(ShardDataset(manifest, "train", seed=np.int64(3)))) == 3  # numpy ints are ints


@pytest.mark.parametrize("device", ["gpu", "cuda:7" if torch.cuda.is_available() else "cuda"])
def test_bench_loader_refuses_a_device_it_cannot_use_before_measuring(tmp_path, device, monkeypatch):
    """--device names a torch device this machine has; any other (a typo, CUDA on a machine
    without it, a GPU index past the last) is a usage error (exit 2) naming the option, given
    before seconds of measuring, never a torch traceback (exit 1)."""
    from click.testing import CliRunner

    from packer.cli import main
    from packer.loader import bench

    measured = []
    monkeypatch.setattr(bench, "_raw_read", lambda *a, **k: measured.append(a) or {})
    manifest = build_dataset(tmp_path / "v", shard_sizes=(2,))
    result = CliRunner().invoke(main, ["bench-loader", str(manifest), "--seconds", "0.1", "--workers", "0",
                                       "--device", device])
    assert result.exit_code == 2, result.output
    assert f"--device {device}" in result.output and "Traceback" not in result.output
    assert not measured


def test_bench_loader_json_path_under_a_file_is_refused_before_measuring_and_a_new_folder_is_made(
        tmp_path, monkeypatch):
    """--json FILE is written as validate's --json is: its folders made, and a file standing
    where a folder must be named up front (exit 2), not a traceback after the measurements."""
    from click.testing import CliRunner

    from packer.cli import main
    from packer.loader import bench

    manifest = build_dataset(tmp_path / "v", shard_sizes=(2,))
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    measured = []
    real = bench._raw_read
    monkeypatch.setattr(bench, "_raw_read", lambda *a, **k: measured.append(a) or real(*a, **k))
    args = ["bench-loader", str(manifest), "--seconds", "0.05", "--workers", "0", "--json"]
    refused = CliRunner().invoke(main, [*args, str(blocker / "bench.json")])
    assert refused.exit_code == 2, refused.output
    assert f"{blocker} is a file, not a folder" in refused.output and not measured
    written = CliRunner().invoke(main, [*args, str(tmp_path / "new" / "bench.json")])
    assert written.exit_code == 0, written.output
    assert "loader" in json.loads((tmp_path / "new" / "bench.json").read_text())


@pytest.mark.parametrize("option", [["--workers", ""], ["--workers", ","], ["--batch-sizes", ""],
                                    ["--verify", ""], ["--verify", " , "], ["--seconds", "0"], ["--seconds", "-1"]])
def test_bench_loader_refuses_an_empty_list_or_no_time_as_a_usage_error(tmp_path, option):
    """An option that leaves nothing to measure (no worker count, batch size or verify mode, or
    no time per measurement) is a usage error naming the option (exit 2), never a ValueError
    traceback (exit 1) nor a table of 0 steps."""
    from click.testing import CliRunner

    from packer.cli import main

    manifest = build_dataset(tmp_path / "v", shard_sizes=(2,))
    result = CliRunner().invoke(main, ["bench-loader", str(manifest), "--workers", "0", "--seconds", "0.05", *option])
    assert result.exit_code == 2, result.output
    assert option[0] in result.output and "Traceback" not in result.output and "samples/s" not in result.output


@pytest.mark.parametrize(("option", "example"), [("--workers", "0,1,2"), ("--batch-sizes", "32,64")])
def test_bench_loaders_list_options_suggest_values_they_take(tmp_path, option, example):
    """--batch-sizes x suggested 'e.g. 0,1,2' (the --workers example), and 0 is no batch size."""
    from click.testing import CliRunner

    from packer.cli import main

    manifest = build_dataset(tmp_path / "v", shard_sizes=(2,))
    result = CliRunner().invoke(main, ["bench-loader", str(manifest), "--seconds", "0.05", option, "x"])
    assert result.exit_code == 2 and f"e.g. {example}" in result.output, result.output


def test_a_parquet_page_damaged_after_the_build_says_to_restore_the_shard_and_run_verify(tmp_path):
    """A flipped byte inside a compressed Parquet page fails the decompression before any checksum
    can be computed; the message must still say what the damage is and what to do, as the
    checksum_mismatch one does, not only the decompressor's words."""
    import pyarrow.parquet as pq

    manifest = build_dataset(tmp_path / "ds", fmt="parquet", shard_sizes=(6,))
    shard = tmp_path / "ds" / "train-000000.parquet"
    group = pq.ParquetFile(shard).metadata.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "metadata")
    assert chunk.compression != "UNCOMPRESSED"
    original = shard.read_bytes()
    end = chunk.data_page_offset + chunk.total_compressed_size
    for offset in range(end - 1, chunk.data_page_offset, -1):  # the last page byte that breaks the page
        damaged = bytearray(original)
        damaged[offset] ^= 0xFF
        shard.write_bytes(bytes(damaged))
        try:
            pq.read_table(shard)
        except Exception:  # noqa: BLE001 - any failure of the stock reader: the page no longer decodes
            break
    else:
        pytest.fail("no single flipped byte made the metadata page undecodable")
    with pytest.raises(ShardReadError, match="train-000000.parquet") as err:
        list(ShardDataset(manifest, "train", shuffle=False))
    message = str(err.value)
    assert "undecodable" in message and "restore" in message and "packer verify" in message, message
    skipping = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    assert list(skipping) == [] and skipping.skipped == 6


def flip_header_byte(shard: Path, member: tarfile.TarInfo) -> None:
    """Flip a byte of ``member``'s name in ``shard``: its header checksum no longer matches."""
    damaged = bytearray(shard.read_bytes())
    damaged[member.offset + 1] ^= 0x01
    shard.write_bytes(bytes(damaged))


@contextlib.contextmanager
def read_from(manifest: Path, read: str, name: str) -> Iterator[Path | str]:
    """Where to read the version of ``manifest`` from: the folder itself, or for ``read ==
    "streamed"`` a copy of it on fsspec's memory store under ``/<name>`` (a store without a
    shard cache reads each shard front to back), removed afterwards."""
    if read != "streamed":
        yield manifest
        return
    import fsspec

    memory = fsspec.filesystem("memory")
    for path in manifest.parent.iterdir():
        memory.pipe(f"/{name}/v/{path.name}", path.read_bytes())
    try:
        yield f"memory://{name}/v/manifest.json"
    finally:
        memory.rm(f"/{name}", recursive=True)


@pytest.mark.parametrize("read", ["mapped", "positional", "streamed"])
def test_a_tar_header_damaged_after_the_build_is_named_not_called_an_early_end(tmp_path, monkeypatch, read):
    """A flipped byte in a member's header fails the header's checksum, and a tar reader stops
    there; the shard still has the manifest's size, so "truncated ... (early end of archive)"
    sent the user looking for a short copy. The message names the damaged header and its offset,
    whether the shard is memory-mapped, read positionally or streamed from a store."""
    monkeypatch.setenv("PACKER_TAR_MMAP", "0" if read == "positional" else "1")
    manifest = build_dataset(tmp_path / "ds", shard_sizes=(4,))
    shard = tmp_path / "ds" / "train-000000.tar"
    with tarfile.open(shard) as tar:
        second = [m for m in tar.getmembers() if not m.name.startswith(tar.getmembers()[0].name.split(".")[0])][0]
    flip_header_byte(shard, second)
    with read_from(manifest, read, "damaged-header") as where, \
            pytest.raises(ShardReadError, match="train-000000.tar") as err:
        list(ShardDataset(where, "train", shuffle=False))
    message = str(err.value)
    assert "early end of archive" not in message, message
    assert f"damaged tar header at byte {second.offset}" in message and "restore" in message, message


@pytest.mark.parametrize("read", ["mapped", "positional", "streamed"])
@pytest.mark.parametrize("member", [0, 1, 2])  # the sample's first member header, or a later one
def test_a_damaged_tar_header_loses_only_its_own_sample_where_the_index_gives_the_offsets(
        tmp_path, monkeypatch, read, member):
    """A fresh-user trial flipped one byte in a member header: under on_error="skip" every later
    sample of the shard was skipped (66 of 95 delivered), since no tar reader reads past a header
    whose checksum fails. _index.parquet records each sample's offset: the read resumes at the
    next sample's, and only the damaged sample is lost, whether the shard is memory-mapped, read
    positionally or streamed front to back from a store without a shard cache (which still
    ended at the damaged header). verify="shard" names the shard alone."""
    monkeypatch.setenv("PACKER_TAR_MMAP", "0" if read == "positional" else "1")
    manifest = build_dataset(tmp_path / "ds", shard_sizes=(4, 6, 5))
    shard = tmp_path / "ds" / "train-000001.tar"
    with tarfile.open(shard) as tar:
        header = [m for m in tar.getmembers() if m.name.startswith("s00006.")][member]
    flip_header_byte(shard, header)
    with read_from(manifest, read, "damaged-resync") as where:
        dataset = ShardDataset(where, "train", shuffle=False, on_error="skip")
        items = list(dataset)
        assert [item["key"] for item in items] == [k for k in split_keys(15) if k != "s00006"]
        assert all((item["image"].numpy() == sample_image(int(item["key"][1:]))).all() for item in items)
        assert dataset.skipped == 1 and f"damaged tar header at byte {header.offset}" in dataset.skipped_samples[0]
        with pytest.raises(ShardReadError, match="train-000001.tar") as err:
            list(ShardDataset(where, "train", shuffle=False))
        # its first header damaged, the sample is not found; a later one, it is found without that member
        assert f"damaged tar header at byte {header.offset}" in str(err.value)
        assert (member == 0) == ("no s00006.npy member" not in str(err.value)), str(err.value)
        if member == 0:  # its key lies in the damaged bytes: named from _index.parquet, with where to look next
            assert "train-000001.tar: sample s00006: unreadable: sample 3 of the shard's 6" in str(err.value), \
                str(err.value)
            assert err.value.key == "s00006" and "`packer verify`" in str(err.value), str(err.value)
        with pytest.raises(ShardReadError) as err:
            list(ShardDataset(where, "train", shuffle=False, verify="shard"))
        assert err.value.shard == "train-000001.tar" and "sha256" in str(err.value)
        assert "sample" not in str(err.value).split("sha256")[0], str(err.value)  # the shard's defect, no sample's


def test_a_damaged_sample_read_in_a_worker_raises_as_in_the_main_process(tmp_path):
    """make_loader with workers: the ShardReadError reaches the training loop with its own
    message (shard, key, what to do) and its shard and key, as with num_workers=0, instead of
    PyTorch's "Caught ShardReadError in DataLoader worker process 1. Original Traceback ..."
    rebuilt from the text alone (shard and key None)."""
    manifest = build_dataset(tmp_path / "ds", shard_sizes=(4, 4))
    shard = tmp_path / "ds" / "train-000001.tar"
    with tarfile.open(shard) as tar:
        member = [m for m in tar.getmembers() if m.name.endswith(".npy")][2]
    damaged = bytearray(shard.read_bytes())
    damaged[member.offset_data + member.size - 1] ^= 0x01
    shard.write_bytes(bytes(damaged))
    key = member.name[: -len(".npy")]
    errors = []
    for workers in (0, 2):
        with pytest.raises(ShardReadError) as err:
            list(make_loader(ShardDataset(manifest, "train", shuffle=False), 2, workers))
        errors.append(err.value)
    # a plain torch DataLoader passes the error on as a text it starts with its own words and the
    # worker's traceback ("Caught ShardReadError in DataLoader worker process 0 ..."): packer's
    # message (shard, sample, what to do) comes first again, with its shard and key
    with pytest.raises(ShardReadError) as err:
        list(torch.utils.data.DataLoader(ShardDataset(manifest, "train", shuffle=False), batch_size=2,
                                         num_workers=2))
    errors.append(err.value)
    assert "raised in DataLoader worker process" in str(err.value) and "Traceback" in str(err.value)
    for error in errors:
        assert (error.shard, error.key) == ("train-000001.tar", key)
        assert str(error).startswith(f"train-000001.tar: sample {key}: checksum_mismatch"), str(error)


def test_a_dataset_of_sources_with_different_dtypes_is_read_one_source_at_a_time(tmp_path):
    # a CT source (uint8 windows) beside MR NIfTI z-scored to float16 built with exit 0, but the
    # loader refused the whole dataset, a sources=["mr"] view of one dtype included, as an integrity
    # failure ("sample_schema.dtype is null"), and the build said nothing of the dtypes
    from click.testing import CliRunner

    from packer.cli import main
    from tests.test_targets import ct_beside_float16_mr

    job = ct_beside_float16_mr(tmp_path)
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report"])
    assert run.exit_code == 0, run.output
    assert "warning: the sources' samples have different dtypes (ct uint8, mr float16)" in run.output, run.output
    manifest = next((tmp_path / "out" / "targets").glob("*/manifest.json"))
    assert json.loads(manifest.read_text())["sample_schema"]["dtypes"] == {"ct": ["uint8"], "mr": ["float16"]}

    mr_items = list(ShardDataset(manifest, "train", sources=["mr"], shuffle=False))
    assert len(mr_items) == 3 and all(item["image"].dtype == torch.float16 for item in mr_items)
    ct_items = list(ShardDataset(manifest, "train", sources=["ct"], shuffle=False))
    assert len(ct_items) == 2 and all(item["image"].dtype == torch.uint8 for item in ct_items)
    with pytest.raises(ConfigError, match=r"different dtypes \(ct uint8, mr float16\).*sources=\['ct'\]"):
        ShardDataset(manifest, "train")
    shown = CliRunner().invoke(main, ["inspect", str(manifest.parent)])
    assert "samples       mixed dtypes CHW; ct [1, 8, 8] uint8; mr [1, 8, 8] float16" in shown.output, shown.output
    reported = CliRunner().invoke(main, ["report", str(manifest.parent)])
    assert reported.exit_code == 0, reported.output
    assert "mixed CHW: ct 1×8×8 uint8; mr 1×8×8 float16" in (manifest.parent / "report.html").read_text()


def _made_from_python(image: torch.Tensor) -> torch.Tensor:
    """A transform that fails unless the messages of the read in progress name Python's options."""
    from packer.errors import surface

    if not surface().python:
        raise AssertionError("a dataset made from Python is read with the command line's option names")
    return image


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_made_from_python_names_pythons_options_while_it_reads(tmp_path, workers):
    """A store error raised while reading (access denied downloading a shard into the cache) said
    to pass `--storage-option key=...`, a flag of a command the notebook user never ran: the
    surface was set while the dataset was made, not while it was read, and not at all in a
    DataLoader worker. The read runs under its maker's surface (the transform runs inside it)."""
    from packer.errors import surface

    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    dataset = ShardDataset(manifest, "train", transform=_made_from_python)
    assert sorted(keys_of(make_loader(dataset, 4, workers))) == split_keys(15)
    assert sum(1 for _ in dataset) == 15
    assert not surface().python  # the caller's own context between items is left as it was


@pytest.mark.parametrize("shape", [(1, 4, 4), (3, 64, 64)])  # the next sample within tarfile's read-ahead, or past it
def test_a_streamed_shard_reads_on_past_every_damaged_header(tmp_path, shape):
    """Two damaged member headers in one shard streamed from a store without a cache (sample 2's
    first header, sample 5's .npy header): exactly those two samples are lost, in a view too,
    and every sample delivered holds the pixels it was written with."""
    import fsspec

    manifest = build_dataset(tmp_path / "ds", shard_sizes=(8,), shape=shape)
    shard = tmp_path / "ds" / "train-000000.tar"
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    damaged = bytearray(shard.read_bytes())
    for member in (next(m for m in members if m.name.startswith("s00002.")), next(m for m in members
                                                                                  if m.name == "s00005.npy")):
        damaged[member.offset + 1] ^= 0x01
    memory = fsspec.filesystem("memory")
    for path in manifest.parent.iterdir():
        memory.pipe(f"/two-headers/v/{path.name}", bytes(damaged) if path == shard else path.read_bytes())
    try:
        for labels in (None, ["c2"]):
            dataset = ShardDataset("memory://two-headers/v/manifest.json", "train", shuffle=False, on_error="skip",
                                   labels=labels)
            items = list(dataset)
            wanted = [k for k in split_keys(8) if labels is None or int(k[1:]) % 3 == 2]
            assert [item["key"] for item in items] == [k for k in wanted if k not in ("s00002", "s00005")]
            assert all((item["image"].numpy() == sample_image(int(item["key"][1:]), shape)).all() for item in items)
            assert dataset.skipped == len({"s00002", "s00005"} & set(wanted))
    finally:
        memory.rm("/two-headers", recursive=True)


@pytest.mark.parametrize("bad", [(5,), (14,), (5, 14)], ids=["next-stands-in", "last-stands-in", "both"])
@pytest.mark.parametrize("world", [1, 2])
def test_a_repeat_that_stands_in_or_pads_is_transformed_once_by_an_in_place_transform(tmp_path, bad, world):
    """A stand-in for a skipped sample and a padding repeat are the same sample again: each
    delivery has arrays of its own, so an in-place augmentation (the README allows one) runs
    once on each, never twice on one shared buffer (they arrived as stored + 2)."""
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    for index in bad:
        flip_pixel_byte(next(p for p in sorted(tmp_path.glob("train-*.tar"))
                             if sample_image(index).tobytes() in p.read_bytes()), index)
    delivered = 0
    for rank in range(world):
        dataset = ShardDataset(manifest, "train", uneven="pad", on_error="skip", shuffle=False, rank=rank,
                               world_size=world, transform=lambda image: image.add_(1))
        for batch in make_loader(dataset, 2):
            for key, image in zip(batch["key"], batch["image"], strict=True):
                stored = torch.from_numpy(sample_image(int(key[1:])).copy())
                assert torch.equal(image, stored + 1), key
                delivered += 1
    assert delivered == world * -(-15 // world)


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("where", ["local", "url"])
def test_a_shard_with_bytes_appended_still_delivers_every_intact_sample_under_skip(tmp_path, fmt, where):
    """A copy padded to a block size: every sample's bytes are intact. A tar shard was read as
    far as its samples were; a Parquet one, whose index is at its end, delivered none of them
    (its footer is now in the middle): it is read as the manifest's length of it."""
    manifest = build_dataset(tmp_path, fmt=fmt, shard_sizes=SIZES)
    for shard in sorted(tmp_path.glob("train-*")):
        shard.write_bytes(shard.read_bytes() + bytes(512))
    location = manifest if where == "local" else f"file://{manifest}"
    loader = make_loader(ShardDataset(location, "train", on_error="skip"), 4)
    assert sorted(keys_of(loader)) == split_keys(15) and loader.skipped == 0
    with pytest.raises(ShardReadError, match=r"bad_shard: the shard is \d+ bytes, the manifest says \d+ "
                                             r"\(bytes appended, or replaced\)"):  # raise: the size fails the shard
        keys_of(make_loader(ShardDataset(location, "train"), 4))
