"""A damaged byte in a Parquet shard's footer fails that shard cleanly: it never ends the process.

A Parquet file's footer (thrift metadata at its end) says where each column chunk lies and holds
the statistics of its columns. pyarrow 26 aborts the whole process (an uncaught C++
``parquet::ParquetException``, SIGABRT, no Python error) when asked for the metadata of a
column chunk whose footer bytes no longer add up, e.g. a flipped bit in the size statistics of
the list column ``shape`` ("Definition level histogram size mismatch"). The normal read raises a
clean error for that damage, but the salvage read that follows it used to ask pyarrow for every
column chunk's metadata to find the ``image`` pages, so the loader (either ``on_error``) and
``packer verify`` (quick and ``--deep``) died with the shard unnamed. The salvage read now finds
the chunk from the footer's own bytes. Each damaged read runs in a forked child, so a regression
fails a test instead of killing the test run.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from packer.config import load_job
from packer.loader import ShardDataset, ShardReadError
from packer.pipeline.build import BuildOptions, build
from packer.shards.parquet import _column_chunks, read_parquet_samples
from packer.verify import verify_dataset
from tests.photo_jobs import write_tree

SHARD = "train-000000.parquet"
#: The bit flipped in each footer byte: one that makes pyarrow 26 abort on the shard's metadata
BIT = 0x10
#: Seconds a child may take before it is killed (a read that hangs on damage fails the test too)
CHILD_SECONDS = 120


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Parquet build of 24 grey 16×16 PNGs, four samples a shard."""
    folder = tmp_path_factory.mktemp("parquet-footer")
    write_tree(folder / "raw")
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "t", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16], "color": "gray"}},
        "pack": {"format": "parquet", "max_samples": 4}, "output": str(folder / "out")}, sort_keys=False))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    return Path(result.manifest_path).parent


def footer_bytes(data: bytes) -> range:
    """The positions of a Parquet file's footer (its length is in the 4 bytes before the closing magic)."""
    length = int.from_bytes(data[-8:-4], "little")
    return range(len(data) - 8 - length, len(data) - 8)


def flipped(data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= BIT
    return bytes(damaged)


def in_child(work: Callable[[], Any]) -> tuple[int | None, Any]:
    """Run ``work`` in a forked child: (the signal that killed it, or None; what it returned, via JSON).
    An exception in the child fails the test, naming it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: it must leave here by os._exit, whatever happens
        os.close(read)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # pyarrow's abort message
        faulthandler.disable()  # pytest's dump of the aborted child's stack (on a descriptor of its own)
        try:
            signal.alarm(CHILD_SECONDS)
            os.write(write, json.dumps({"value": work()}).encode())
        except BaseException as err:
            os.write(write, json.dumps({"raised": f"{type(err).__name__}: {err}"}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        sent = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status), None
    got = json.loads(sent)
    if "raised" in got:
        pytest.fail(f"the child raised {got['raised']}")
    return None, got["value"]


def column_metadata_of_every_chunk(path: Path) -> bool:
    """What the salvage read used to do: pyarrow's metadata of every column chunk (False: the
    footer does not even parse, a clean error)."""
    try:
        meta = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException):
        return False
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            group.column(c)
    return True


@pytest.fixture(scope="module")
def aborting(version: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the version whose first train shard has the first footer flip on which pyarrow's
    column chunk metadata aborts the process."""
    copy = tmp_path_factory.mktemp("aborting") / "v"
    shutil.copytree(version, copy)
    for path in copy.iterdir():
        path.chmod(0o644)
    shard = copy / SHARD
    data = shard.read_bytes()

    def probe(positions: range) -> bool:
        for at in positions:
            shard.write_bytes(flipped(data, at))
            column_metadata_of_every_chunk(shard)
        return True

    footer = footer_bytes(data)
    for first in range(footer.start, footer.stop, 64):  # a batch of flips a child, then the one that aborted
        if in_child(lambda first=first: probe(range(first, min(first + 64, footer.stop))))[0] == signal.SIGABRT:
            for at in range(first, min(first + 64, footer.stop)):
                if in_child(lambda at=at: probe(range(at, at + 1)))[0] == signal.SIGABRT:
                    shard.write_bytes(flipped(data, at))
                    return copy
    pytest.fail(f"no flip of bit {BIT:#x} in {SHARD}'s footer makes pyarrow's column chunk metadata abort: "
                "this pyarrow no longer aborts there; aim these tests at the damage it does abort on, or drop them")


def test_the_image_column_chunk_is_found_in_the_footer_where_pyarrow_says(version: Path) -> None:
    for shard in sorted(version.glob("*-*.parquet")):
        meta = pq.ParquetFile(shard).metadata
        assert meta.num_row_groups == 1
        group = meta.row_group(0)
        image = next(group.column(c) for c in range(group.num_columns) if group.column(c).path_in_schema == "image")
        assert _column_chunks(shard, "image") == [(group.num_rows, (image.data_page_offset,
                                                                    image.total_compressed_size))]
        assert _column_chunks(shard, "key") == [(group.num_rows, None)]  # compressed: its pages are not read raw
        assert _column_chunks(shard, "nothing") == [(group.num_rows, None)]


def test_a_footer_that_does_not_parse_gives_no_column_chunk(version: Path, tmp_path: Path) -> None:
    data = (version / SHARD).read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:-8] + b"\xff\xff\xff\x7fPAR1")  # a footer longer than the file
    assert _column_chunks(cut, "image") == []
    cut.write_bytes(data[:-1])  # no closing magic
    assert _column_chunks(cut, "image") == []
    start = footer_bytes(data).start
    cut.write_bytes(data[:start] + b"\x0b" * (len(data) - 8 - start) + data[-8:])  # map fields: not thrift Parquet
    assert _column_chunks(cut, "image") == []


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_the_loader_fails_the_shard_whose_footer_pyarrow_aborts_on(aborting: Path, on_error: str) -> None:
    def load() -> dict[str, Any]:
        dataset = ShardDataset(aborting, "train", shuffle=False, on_error=on_error)
        try:
            return {"delivered": len(list(dataset)), "skipped": dataset.skipped,
                    "skipped_samples": dataset.skipped_samples}
        except ShardReadError as err:
            return {"error": str(err)}

    killed, got = in_child(load)
    assert killed is None, f"the loader was killed by signal {killed}"
    if on_error == "raise":
        assert got["error"].startswith(f"{SHARD}: sample ") and "undecodable" in got["error"]
    else:
        in_shard = pq.ParquetFile(aborting / SHARD).metadata.num_rows
        total = sum(s["samples"] for s in json.loads((aborting / "manifest.json").read_text())["splits"]["train"]
                    ["shards"])
        assert got["skipped"] == in_shard and got["delivered"] == total - in_shard
        assert all(SHARD in description for description in got["skipped_samples"])


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_verify_names_the_shard_whose_footer_pyarrow_aborts_on(aborting: Path, deep: bool) -> None:
    def check() -> dict[str, Any]:
        result = verify_dataset(aborting, deep=deep)
        return {"ok": result.ok, "shards": sorted({p.shard for p in result.problems})}

    killed, got = in_child(check)
    assert killed is None, f"packer verify was killed by signal {killed}"
    assert got == {"ok": False, "shards": [SHARD]}


def test_no_flipped_bit_anywhere_in_the_footer_ends_the_process(version: Path, tmp_path: Path) -> None:
    """The salvage read, with checksums (what the loader and verify run): one outcome per row for
    every flip, read from a path and from a memory map, each batch of flips in one child."""
    data = (version / SHARD).read_bytes()
    rows = pq.ParquetFile(version / SHARD).metadata.num_rows
    probe = tmp_path / "probe.parquet"
    positions = list(footer_bytes(data))

    def read_each(batch: list[int]) -> list[int]:
        wrong = []
        for at in batch:
            probe.write_bytes(flipped(data, at))
            for source in (str(probe), pa.memory_map(str(probe))):
                got = [row for row, _ in read_parquet_samples(source, range(rows), batch_rows=64, checksums=True,
                                                              recover=lambda column: "not in this test")]
                if got != list(range(rows)):
                    wrong.append(at)
        return wrong

    batch = 128
    for first in range(0, len(positions), batch):
        flips = positions[first:first + batch]
        killed, wrong = in_child(lambda flips=flips: read_each(flips))
        assert killed is None, f"signal {killed} reading {SHARD} with one of the footer bytes {flips[0]}-{flips[-1]} " \
                               f"flipped"
        assert wrong == [], f"not one outcome per row with footer bytes {wrong} flipped"


@pytest.fixture(scope="module")
def unnamed(version: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the version whose first train shard's footer names a column in bytes that are not
    UTF-8 (the top bit of the first letter of ``label_name`` flipped: pyarrow raises
    UnicodeDecodeError, a ValueError, opening the file)."""
    copy = tmp_path_factory.mktemp("unnamed") / "v"
    shutil.copytree(version, copy)
    for path in copy.iterdir():
        path.chmod(0o644)
    shard = copy / SHARD
    data = shard.read_bytes()
    at = data.index(b"label_name", footer_bytes(data).start)
    shard.write_bytes(bytes(data[:at]) + bytes([data[at] ^ 0x80]) + data[at + 1:])
    with pytest.raises(UnicodeDecodeError):
        pq.ParquetFile(shard)
    return copy


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_column_name_that_is_not_utf8_fails_the_shard_in_the_loader(unnamed: Path, on_error: str) -> None:
    dataset = ShardDataset(unnamed, "train", shuffle=False, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(ShardReadError, match=rf"^{SHARD}: .*bad_shard: not a readable Parquet file"):
            list(dataset)
        return
    train = json.loads((unnamed / "manifest.json").read_text())["splits"]["train"]
    assert train["shards"][0]["file"] == SHARD
    delivered = list(dataset)
    assert dataset.skipped == train["shards"][0]["samples"]
    assert len(delivered) == train["samples"] - train["shards"][0]["samples"]


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_verify_names_the_shard_with_a_column_name_that_is_not_utf8(unnamed: Path, deep: bool) -> None:
    result = verify_dataset(unnamed, deep=deep)
    assert not result.ok and {p.shard for p in result.problems} == {SHARD}
    said = " ".join(p.message for p in result.problems)
    assert ("not a readable Parquet file" if deep else "could not be reached in the damaged shard") in said
