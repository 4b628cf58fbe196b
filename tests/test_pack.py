"""Shards: reproducible bytes, planned boundaries, and stock readers get back what we packed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import SPLITS, PackConfig
from packer.files import canonical_json
from packer.pipeline.plan import PER_SAMPLE_OVERHEAD, plan_shards, sample_budget
from packer.pipeline.sampletable import SampleTable
from packer.records import SampleRef, SpilledSample
from packer.shards.encode import EncodedSample, encode_sample
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import _member, member_header, write_tar_shard
from packer.targets import Target


def samples(n: int, seed: int = 0) -> list[EncodedSample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        image = rng.integers(0, 256, size=(2, 5, 7), dtype=np.uint8)
        out.append(EncodedSample(key=f"src-{i:04d}", split="train", label=i % 3, label_name=f"c{i % 3}",
                                 entity_id=f"E{i // 2}", source="src", shape=image.shape, dtype="uint8",
                                 pixels=image.tobytes(), info={"key": f"src-{i:04d}", "n": i}))
    return out


def test_tar_shard_is_reproducible_and_normalised(tmp_path: Path) -> None:
    a = write_tar_shard(tmp_path / "a.tar", samples(5))
    b = write_tar_shard(tmp_path / "b.tar", samples(5))
    assert a.sha256 == b.sha256 == hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest()
    assert a.bytes == (tmp_path / "a.tar").stat().st_size
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members[:3]] == ["src-0000.cls", "src-0000.json", "src-0000.npy"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert not list(tmp_path.glob("*.partial"))
    starts = [m for m in members if m.name.endswith(".cls")]
    npys = {m.name: m for m in members if m.name.endswith(".npy")}
    with tarfile.open(tmp_path / "a.tar") as tar:
        npy_bytes = [tar.extractfile(npys[f"src-{i:04d}.npy"]).read() for i in range(5)]  # type: ignore[union-attr]
    assert list(a.positions) == [m.offset for m in starts]  # each sample's first member header
    assert list(a.sizes) == [len(b) for b in npy_bytes]
    assert [a.digest(i) for i in range(5)] == [hashlib.sha256(b).hexdigest() for b in npy_bytes]


def _tarfile_shard(path: Path, packed: list[EncodedSample]) -> None:
    """The shard as the standard library writes it: tarfile members, np.save arrays."""
    with tarfile.open(path, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in packed:
            buffer = io.BytesIO()
            np.save(buffer, np.frombuffer(sample.pixels, sample.dtype).reshape(sample.shape), allow_pickle=False)
            for name, data in ((f"{sample.key}.cls", str(sample.label).encode()),
                               (f"{sample.key}.json", canonical_json(sample.info)),
                               (f"{sample.key}.npy", buffer.getvalue())):
                tar.addfile(_member(name, len(data)), io.BytesIO(data))


_KEYS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=60)


@given(st.lists(st.tuples(_KEYS, st.sampled_from(["uint8", "uint16", "int16", "float32", ">i2", "bool"]),
                          st.lists(st.integers(0, 9), min_size=0, max_size=4), st.integers(0, 999)),
                min_size=0, max_size=6))
@settings(max_examples=60, deadline=None)
def test_tar_shard_bytes_are_what_tarfile_and_numpy_save_write(tmp_path_factory: pytest.TempPathFactory,
                                                              specs: list[tuple[str, str, list[int], int]]) -> None:
    folder = tmp_path_factory.mktemp("tar")
    rng = np.random.default_rng(len(specs))
    packed = []
    for i, (key, dtype, shape, label) in enumerate(specs):
        image = rng.integers(0, 2, size=shape).astype(dtype)
        packed.append(EncodedSample(key=f"{i}-{key}", split="train", label=label, label_name="x", entity_id="e",
                                    source="s", shape=tuple(shape), dtype=dtype, pixels=image.tobytes(),
                                    info={"key": key, "shape": shape}))
    try:
        _tarfile_shard(folder / "stdlib.tar", packed)
    except ValueError:  # a name ustar cannot hold: ours refuses it too, and leaves no file
        with pytest.raises(ValueError):
            write_tar_shard(folder / "ours.tar", packed)
        assert not (folder / "ours.tar").exists()
        return
    ours = write_tar_shard(folder / "ours.tar", packed)
    assert (folder / "ours.tar").read_bytes() == (folder / "stdlib.tar").read_bytes()
    assert ours.sha256 == hashlib.sha256((folder / "stdlib.tar").read_bytes()).hexdigest()


@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=120),
       st.integers(0, 8 ** 11 - 1))
@settings(max_examples=200, deadline=None)
def test_member_headers_are_tarfiles_ustar_headers(name: str, size: int) -> None:
    try:
        expected = _member(name, size).tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    except ValueError:
        with pytest.raises(ValueError):
            member_header(name, size)
        return
    assert member_header(name, size) == expected


def test_stock_webdataset_reads_back_exact_arrays(tmp_path: Path) -> None:
    packed = samples(6)
    write_tar_shard(tmp_path / "train-000000.tar", packed)
    got = list(wds.WebDataset(str(tmp_path / "train-000000.tar"), shardshuffle=False).decode())
    assert [g["__key__"] for g in got] == [s.key for s in packed]
    for g, s in zip(got, packed, strict=True):
        np.testing.assert_array_equal(g["npy"], np.frombuffer(s.pixels, np.uint8).reshape(s.shape))
        assert g["cls"] == s.label and g["json"]["n"] == s.info["n"]


def test_parquet_shard_is_reproducible_and_pyarrow_reads_it(tmp_path: Path) -> None:
    packed = samples(4)
    a = write_parquet_shard(tmp_path / "train-000000.parquet", packed)
    b = write_parquet_shard(tmp_path / "copy.parquet", packed)
    assert a.sha256 == b.sha256
    table = pads.dataset(tmp_path / "train-000000.parquet", format="parquet").to_table()
    assert table.column("key").to_pylist() == [s.key for s in packed]
    for row, s in zip(table.to_pylist(), packed, strict=True):
        assert row["image"] == s.pixels and row["shape"] == list(s.shape) and row["label"] == s.label
        assert row["sha256"] == hashlib.sha256(s.pixels).hexdigest()
    assert list(a.positions) == [0, 1, 2, 3]
    assert list(a.sizes) == [len(s.pixels) for s in packed]
    assert [a.digest(i) for i in range(4)] == [hashlib.sha256(s.pixels).hexdigest() for s in packed]


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    def broken():
        yield from samples(2)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_tar_shard(tmp_path / "x.tar", broken())
    assert list(tmp_path.iterdir()) == []


def _spilled(index: int, nbytes: int) -> SpilledSample:
    ref = SampleRef(sample_id=f"s{index:03d}", source="src", kind="image", path=f"/raw/{index}.png",
                    relpath=f"{index}.png", label="a", entity=f"E{index}")
    return SpilledSample(key=f"src-{index:03d}", ref=ref, spill="x.spill", offset=0, pixel_bytes=nbytes, meta_bytes=0,
                         shape=(1, 1, nbytes), dtype="uint8", sha256=f"{index:064x}")


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
@pytest.mark.parametrize("max_bytes", [16 * 1024, 40 * 1024, 100_000])
def test_a_shard_of_two_or_more_samples_is_written_within_max_bytes_its_own_bytes_included(
        tmp_path: Path, fmt: str, max_bytes: int) -> None:
    """At 16KiB two 32x32 RGB samples made a 20,480-byte tar: the plan counted the samples and
    not the tar's end blocks and padding to a 10,240-byte record (Parquet: not its footer). The
    samples are encoded as a build encodes them (a tar plan counts their records exactly)."""
    rng = np.random.default_rng(0)
    target = Target("class", ("c0", "c1"))
    spilled = [dataclasses.replace(_spilled(i, 3 * 32 * 32), ref=dataclasses.replace(_spilled(i, 0).ref,
                                                                                     label=f"c{i % 2}"),
                                   shape=(3, 32, 32), meta_bytes=len(canonical_json({"n": i})))
               for i in range(30)]
    packed = [encode_sample(key=s.key, ref=s.ref, shape=s.shape, dtype=s.dtype, split="train", target=target,
                            pixels=rng.integers(0, 256, 3 * 32 * 32, dtype=np.uint8).tobytes(), metadata={"n": i})
              for i, s in enumerate(spilled)]
    table = SampleTable.of(spilled)
    plans = plan_shards(table, {s.key: "train" for s in packed},
                        PackConfig(format=fmt, max_samples=1000, max_bytes=max_bytes), target)
    write = write_tar_shard if fmt == "webdataset" else write_parquet_shard
    sizes = [(len(p.rows), write(tmp_path / p.file, [packed[int(r)] for r in p.rows]).bytes) for p in plans]
    assert sum(n for n, _ in sizes) == 30
    assert [(n, size) for n, size in sizes if n > 1 and size > max_bytes] == []
    assert max_bytes < 20_000 or max(n for n, _ in sizes) > 1  # limits that hold several samples pack several


@given(st.lists(st.tuples(st.integers(1, 5000), st.sampled_from(SPLITS)), max_size=80),
       st.integers(1, 10), st.integers(1000, 30_000))
@settings(max_examples=80, deadline=None)
def test_the_build_plan_respects_limits_and_keeps_split_and_key_order(
        rows: list[tuple[int, str]], max_samples: int, max_bytes: int) -> None:
    table = SampleTable.of([_spilled(i, nbytes) for i, (nbytes, _) in enumerate(rows)])
    split_of = {f"src-{i:03d}": split for i, (_, split) in enumerate(rows)}
    plans = plan_shards(table, split_of, PackConfig(format="parquet", max_samples=max_samples, max_bytes=max_bytes))
    max_bytes = sample_budget("parquet", max_bytes)  # what the file's footer leaves to the samples
    planned = [int(r) for p in plans for r in p.rows]
    by_split = [i for split in SPLITS for i, (_, s) in enumerate(rows) if s == split]
    assert planned == by_split                                           # every row once: train, valid, test, key order
    for split in SPLITS:
        mine = [p for p in plans if p.split == split]
        assert [p.file for p in mine] == [f"{split}-{i:06d}.parquet" for i in range(len(mine))]
        for before, after in zip(mine, mine[1:], strict=False):        # 75% full by a limit, or the next did not fit
            used = sum(rows[r][0] + PER_SAMPLE_OVERHEAD["parquet"] for r in before.rows)
            first = rows[int(after.rows[0])][0] + PER_SAMPLE_OVERHEAD["parquet"]
            assert 4 * len(before.rows) >= 3 * max_samples or 4 * used >= 3 * max_bytes or used + first > max_bytes
    for p in plans:
        bytes_in = sum(rows[r][0] + PER_SAMPLE_OVERHEAD["parquet"] for r in p.rows)
        assert 0 < len(p.rows) <= max_samples and (len(p.rows) == 1 or bytes_in <= max_bytes)
