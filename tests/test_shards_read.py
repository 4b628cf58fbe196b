"""packer.shards reads back what it writes: tar (scan, positional, streamed, at an index
position) and Parquet, checked against the arrays packed and against stock tarfile."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.shards.encode import EncodedSample
from packer.shards.members import Decoded, SampleDefect, load_npy, parse_member_name
from packer.shards.parquet import read_parquet_samples, write_parquet_shard
from packer.shards.tar import (
    map_shard,
    parse_member_header,
    read_sample_at,
    read_tar_sample,
    scan_tar,
    stream_tar_samples,
    write_tar_shard,
)


def sample(i: int, shape: tuple[int, ...], dtype: str) -> tuple[EncodedSample, np.ndarray]:
    image = (np.arange(int(np.prod(shape))) * 3 + i).astype(dtype).reshape(shape)
    info = {"key": f"k{i:03d}", "source": "synthetic", "n": i}
    return EncodedSample(key=f"k{i:03d}", split="train", label=i % 4, label_name=f"c{i % 4}", entity_id=f"e{i}",
                         source="synthetic", shape=shape, dtype=dtype, pixels=image.tobytes(), info=info), image


shapes = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None)
@given(shapes=shapes, dtype=st.sampled_from(["uint8", "uint16", "float32"]))
def test_every_tar_reader_returns_what_was_packed(tmp_path_factory: pytest.TempPathFactory,
                                                   shapes: list[tuple[int, int, int]], dtype: str) -> None:
    path = tmp_path_factory.mktemp("tar") / "train-000000.tar"
    packed = [sample(i, shape, dtype) for i, shape in enumerate(shapes)]
    written = write_tar_shard(path, [s for s, _ in packed])
    index = scan_tar(path)
    assert index.defect is None and [s.key for s in index.samples] == [s.key for s, _ in packed]
    with tarfile.open(path) as tar:  # stock tarfile: where each sample's first header and each member's data sit
        members = tar.getmembers()
    assert [s.offset for s in index.samples] == list(written.positions) == [m.offset for m in members[::3]]
    assert [s.members["npy"] for s in index.samples] == [(m.offset_data, m.size) for m in members[2::3]]
    with open(path, "rb", buffering=0) as fh:
        mapped = map_shard(fh)
        for scanned, (encoded, image), position in zip(index.samples, packed, written.positions, strict=True):
            decoded = read_tar_sample(fh, scanned)
            assert isinstance(decoded, Decoded) and decoded.label == encoded.label
            assert decoded.image.dtype == image.dtype and np.array_equal(decoded.image, image)
            viewed = read_tar_sample(fh, scanned, mapped)
            assert isinstance(viewed, Decoded) and viewed.label == encoded.label
            assert viewed.image.dtype == image.dtype and np.array_equal(viewed.image, image)
            at = read_sample_at(fh, position, encoded.key)
            assert sorted(at) == ["cls", "json", "npy"] and json.loads(at["json"]) == encoded.info
            assert np.array_equal(np.load(io.BytesIO(at["npy"])), image)
            viewed = load_npy(at["npy"], copy=False)  # the member's own bytearray: no second copy
            assert np.array_equal(viewed, image) and (viewed.base is not None or viewed.size == 0)
            in_map = read_sample_at(fh, position, encoded.key, mapped)  # views of the map: the same bytes
            assert {ext: bytes(data) for ext, data in in_map.items()} == {ext: bytes(data) for ext, data in at.items()}
            assert mapped is None or all(isinstance(data, memoryview) for data in in_map.values())
    with open(path, "rb") as fh:
        streamed = list(stream_tar_samples(fh, len(packed) - 1))
    samples = [item for item in streamed if not isinstance(item, str)]  # a string would be a defect
    assert len(samples) == len(streamed) and [(i, key) for i, key, _ in samples] == [
        (i, s.key) for i, (s, _) in enumerate(packed)]
    assert all(np.array_equal(np.load(io.BytesIO(members["npy"])), image)
               for (_, _, members), (_, image) in zip(samples, packed, strict=True))


def test_member_headers_are_parsed_like_tarfile_and_a_bad_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("k1.cls", b"3"), ("k1.npy", b"x" * 700), ("k2.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = path.read_bytes()
    assert parse_member_header(raw[:512]) == ("k1.cls", 1, True)
    with open(path, "rb") as fh:
        for mapped in (None, map_shard(fh)):
            assert read_sample_at(fh, 0, "k1", mapped) == {"cls": b"3", "npy": b"x" * 700}
            assert read_sample_at(fh, 2560, "k2", mapped) == {"cls": b"1"}  # k1: 2 headers, 512 + 1024 of data
            with pytest.raises(tarfile.HeaderError):
                read_sample_at(fh, 100, "k1", mapped)  # not a header: the caller falls back to scanning
    cut = tmp_path / "cut.tar"
    cut.write_bytes(raw[:512 + 512 + 512 + 300])  # k1.npy's data cut short
    with open(cut, "rb") as fh:
        for mapped in (None, map_shard(fh)):
            with pytest.raises(tarfile.ReadError, match="cut short"):
                read_sample_at(fh, 0, "k1", mapped)
    assert parse_member_header(b"\0" * 512) is None
    broken = bytearray(raw[:512])
    broken[0] ^= 1
    with pytest.raises(tarfile.HeaderError):
        parse_member_header(bytes(broken))
    with pytest.raises(tarfile.HeaderError):
        parse_member_header(raw[:100])


@pytest.mark.parametrize(("name", "accepted"), [
    ("a.cls", True), ("s_00-1.npy", True), ("k.json", True),
    ("../a.npy", False), ("/tmp/a.npy", False), ("dir/a.npy", False), ("a\\b.npy", False), ("a..npy", False),
    ("a.txt", False), ("a.npy.gz", False), ("a b.npy", False), (".npy", False), ("a", False),
])
def test_one_member_name_rule(name: str, accepted: bool) -> None:
    parsed = parse_member_name(name)
    assert isinstance(parsed, tuple) == accepted
    if accepted:
        assert parsed == tuple(name.split(".", 1))
    assert_one_rule(name)


def assert_one_rule(name: str) -> None:
    """The header walk's byte pattern (MEMBER_NAME) accepts exactly the names parse_member_name does,
    and splits them the same way."""
    from packer.shards.members import MEMBER_NAME

    parsed = parse_member_name(name)
    matched = MEMBER_NAME.fullmatch(name.encode("utf-8", "surrogatepass"))
    assert (matched is not None) == isinstance(parsed, tuple), name
    if matched is not None:
        assert (matched[1].decode(), matched[2].decode()) == parsed


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(["a", "b0", "_", "-", ".", "/", "\\", " ", "é", "\0", ".cls", ".json", ".npy",
                                         ".mask.npy", ".target.npy", ".npy.gz", ".."]), max_size=6))
def test_the_header_walk_and_the_name_rule_agree_on_any_name(parts: list[str]) -> None:
    assert_one_rule("".join(parts))


def test_a_link_or_a_refused_name_ends_the_scan_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("a.cls", b"0"), ("a.npy", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("b.npy")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    index = scan_tar(path)
    assert [s.key for s in index.samples] == ["a"]
    assert index.defect is not None and "'b.npy' is not a regular file" in index.defect


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 5), cut=st.one_of(st.none(), st.integers(0, 6000)),
       flips=st.lists(st.tuples(st.integers(0, 6000), st.integers(1, 255)), max_size=3),
       fmt=st.sampled_from(["packer", "pax", "gnu"]))
def test_the_header_walk_finds_what_tarfile_finds_on_any_shard(tmp_path_factory: pytest.TempPathFactory, count: int,
                                                              cut: int | None, flips: list[tuple[int, int]],
                                                              fmt: str) -> None:
    """scan_tar walks a packer shard's ustar headers itself (speed); on every shard, clean,
    cut short, with flipped bytes, or written by tarfile in PAX or GNU format, what it finds (samples,
    offsets, members, defect) is what the walk by stock tarfile finds."""
    from packer.shards.tar import _scan_tarfile, _scan_ustar

    path = tmp_path_factory.mktemp("walk") / "train-000000.tar"
    packed = [sample(i, (1, 3, 4), "uint8")[0] for i in range(count)]
    if fmt == "packer":
        write_tar_shard(path, packed)
    else:
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT if fmt == "pax" else tarfile.GNU_FORMAT) as tar:
            for s in packed:
                for ext, data in (("cls", str(s.label).encode()), ("npy", s.pixels)):
                    info = tarfile.TarInfo(f"{s.key}.{ext}")
                    info.size, info.pax_headers = len(data), {"comment": "x"} if fmt == "pax" else {}
                    tar.addfile(info, io.BytesIO(data))
    data = bytearray(path.read_bytes())
    for at, value in flips:
        if at < len(data):
            data[at] ^= value
    path.write_bytes(bytes(data[:cut] if cut is not None else data))
    assert scan_tar(path) == _scan_tarfile(path)
    if fmt == "packer" and cut is None and not flips:
        assert _scan_ustar(path) is not None  # a clean packer shard takes the fast walk


def test_parquet_reader_returns_what_was_packed_and_fails_a_wrong_row_count(tmp_path: Path) -> None:
    packed = [sample(i, (1, 2 + i, 3), "uint16") for i in range(5)]
    path = tmp_path / "train-000000.parquet"
    write_parquet_shard(path, [s for s, _ in packed])
    got = list(read_parquet_samples(pa.memory_map(str(path)), [0, 3, 4], expect_rows=5, records=True, batch_rows=2))
    assert [row for row, _ in got] == [0, 3, 4]
    for (_, decoded), i in zip(got, [0, 3, 4], strict=True):
        encoded, image = packed[i]
        assert isinstance(decoded, Decoded) and (decoded.key, decoded.label) == (encoded.key, encoded.label)
        assert np.array_equal(decoded.image, image) and json.loads(decoded.record or "") == encoded.info
    wrong = list(read_parquet_samples(str(path), [1, 2], expect_rows=6, batch_rows=2))
    assert wrong == [(1, SampleDefect("bad_shard", "the file has 5 rows, the manifest says 6"))] + [
        (2, SampleDefect("bad_shard", "the file has 5 rows, the manifest says 6"))]


def test_the_format_imports_none_of_its_users() -> None:
    """packer.shards is read by the loader, the report and verify, and written by the pipeline:
    it imports none of them (nor the CLI), and the loader (with the manifest model it reads
    through) does not import the pipeline."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import packer.shards.encode, packer.shards.members, packer.shards.parquet, packer.shards.tar\n"
            "users = ('packer.loader', 'packer.pipeline', 'packer.htmlreport', 'packer.verify', 'packer.cli',\n"
            "         'packer.commands')\n"
            "bad = sorted(m for m in sys.modules if m.startswith(users))\n"
            "assert not bad, bad\n"
            "import packer.loader.readers, packer.loader.dataset, packer.manifest\n"
            "bad = sorted(m for m in sys.modules if m.startswith('packer.pipeline'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_images_read_through_the_map_are_writable_views_whose_writes_never_reach_the_shard(tmp_path: Path) -> None:
    """The loader reads tar images as views of a private map (no copy until the collate): a
    training step that writes into a sample (in-place augmentation) changes its own copy of that
    page only, never the shard, and the image keeps the machine's byte order."""
    path = tmp_path / "train-000000.tar"
    packed = [sample(i, (2, 64, 64), "uint16") for i in range(3)]
    write_tar_shard(path, [s for s, _ in packed])
    before = path.read_bytes()
    index = scan_tar(path)
    with open(path, "rb", buffering=0) as fh:
        mapped = map_shard(fh)
        assert mapped is not None
        decoded = [read_tar_sample(fh, s, mapped) for s in index.samples]
    for item, (_, image) in zip(decoded, packed, strict=True):
        assert isinstance(item, Decoded) and item.image.flags.writeable and item.image.dtype.isnative
        assert item.image.base is not None  # a view, not a copy
        assert np.array_equal(item.image, image)
        item.image[...] = 7
    assert path.read_bytes() == before
    with open(path, "rb", buffering=0) as fh:
        again = [read_tar_sample(fh, s, map_shard(fh)) for s in index.samples]
    assert all(isinstance(a, Decoded) and np.array_equal(a.image, image)
               for a, (_, image) in zip(again, packed, strict=True))


def test_packer_tar_mmap_0_reads_with_positional_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train-000000.tar"
    write_tar_shard(path, [sample(0, (1, 4, 4), "uint8")[0]])
    monkeypatch.setenv("PACKER_TAR_MMAP", "0")
    with open(path, "rb") as fh:
        assert map_shard(fh) is None
    monkeypatch.delenv("PACKER_TAR_MMAP")
    with open(path, "rb") as fh:
        assert map_shard(fh) is not None
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with open(empty, "rb") as fh:
        assert map_shard(fh) is None


@pytest.mark.parametrize(("size_field", "defect"), [
    (b"-0000000001", "member 'k000.json' has a negative size (-1)"),  # tarfile itself takes it as -1
    (b" 0000000001", None), (b"0000_000001", None), (b"+0000000001", None),  # int() reads these; tarfile too
])
def test_a_size_field_packer_never_writes_is_walked_by_tarfile_and_a_negative_one_is_a_defect(
        tmp_path: Path, size_field: bytes, defect: str | None) -> None:
    from packer.shards.tar import _scan_tarfile, _scan_ustar

    path = tmp_path / "train-000000.tar"
    write_tar_shard(path, [sample(i, (1, 3, 4), "uint8")[0] for i in range(3)])
    data = bytearray(path.read_bytes())
    header = data[1024:1536]  # k000.json's header (k000.cls: header and one block of data before it)
    assert bytes(header[:9]) == b"k000.json"
    header[124:135] = size_field
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\x00" % sum(header)  # a valid checksum: only the size field is odd
    data[1024:1536] = header
    path.write_bytes(bytes(data))
    assert _scan_ustar(path) is None  # not packer's layout: tarfile's reading is the answer
    index = scan_tar(path)
    assert index == _scan_tarfile(path) and index.defect == defect
    assert all(size >= 0 for s in index.samples for _, size in s.members.values())
    with open(path, "rb") as fh:
        streamed = list(stream_tar_samples(fh, 2))  # a remote shard read front to back
        assert (streamed[-1] == defect) if defect else len(streamed) == 3
        for mapped in (None, map_shard(fh)):  # a sample read at its index position (the report, the cache)
            if defect:
                with pytest.raises(tarfile.HeaderError, match="negative member size"):
                    read_sample_at(fh, 0, "k000", mapped)
            else:
                assert sorted(read_sample_at(fh, 0, "k000", mapped)) == ["cls", "json", "npy"]
