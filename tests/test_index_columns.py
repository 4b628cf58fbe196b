"""The index and splits tables: row order and contents, whatever order shards finish in."""

from __future__ import annotations

import random
from array import array
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.manifest import INDEX_FILE, INDEX_SCHEMA
from packer.phi import Pseudonymizer
from packer.pipeline.publish import IndexColumns, write_index, write_splits_table
from packer.records import SampleRef, SpilledSample
from packer.shards.writer import ShardWrite


def _shard(name: str, count: int, start: int) -> ShardWrite:
    positions = array("q", (start + 1536 * i for i in range(count)))
    return ShardWrite(file=name, bytes=1536 * count, sha256="0" * 64, positions=positions,
                      sizes=array("q", [1024] * count), digests=bytes(range(32)) * count,
                      checksums=array("Q", range(count)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["train", "valid", "test"]), st.integers(1, 6)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_index_rows_are_ordered_by_split_shard_position_whatever_the_order_shards_arrive(
        shards: list[tuple[str, int]], rnd: random.Random) -> None:
    entries = [(split, f"{split}-{n:06d}.tar", count) for n, (split, count) in enumerate(shards)]
    rnd.shuffle(entries)
    index = IndexColumns()
    for split, name, count in entries:
        keys = [f"{name}-k{i}" for i in range(count)]
        index.add_shard(_shard(name, count, start=rnd.randrange(3)), split=split, keys=keys,
                        labels=[i % 3 for i in range(count)], entity_ids=[f"e{i}" for i in range(count)],
                        sources=["ct"] * count)
    table = index.table()
    expected = table.sort_by([("split", "ascending"), ("shard", "ascending"), ("position", "ascending")])
    assert table.to_pydict() == expected.to_pydict()
    assert table.num_rows == sum(count for _, count in shards)
    assert all(column.num_chunks == 1 for column in table.columns)


def test_index_refuses_a_shard_whose_positions_go_backwards() -> None:
    shard = _shard("train-000000.tar", 2, start=0)
    shard = ShardWrite(file=shard.file, bytes=shard.bytes, sha256=shard.sha256, positions=array("q", [1536, 0]),
                       sizes=shard.sizes, digests=shard.digests, checksums=shard.checksums)
    with pytest.raises(ValueError, match="train-000000.tar: the writer reported positions out of order"):
        IndexColumns().add_shard(shard, split="train", keys=["a", "b"], labels=[0, 0], entity_ids=["e", "e"],
                                 sources=["ct", "ct"])


def test_splits_table_holds_one_row_per_sample_sorted_by_key_with_days_since_first(tmp_path) -> None:
    def sample(key: str, entity: str, time: str | None, label: str) -> SpilledSample:
        sample_id = key.split("-f")[0]
        ref = SampleRef(sample_id=sample_id, source="ct", kind="dicom", path=f"/raw/{sample_id}.dcm",
                        relpath=f"{sample_id}.dcm", label=label, entity=entity, time=time)
        return SpilledSample(key=key, ref=ref, spill="c.spill", offset=0, pixel_bytes=16, meta_bytes=2, shape=(1, 4, 4),
                             dtype="uint8", sha256=key)

    samples = [sample("ct-b", "P1", "2020-01-03T00:00:00", "x"), sample("ct-a", "P1", "2020-01-01T12:00:00", "y"),
               sample("ct-c-f0001", "P2", None, "x")]
    assignment = SimpleNamespace(split={"ct-a": "train", "ct-b": "train", "ct-c-f0001": "test"}, fold={"ct-a": 1})
    keep = Pseudonymizer(mode="keep", dates="keep", key=None)
    entry = write_splits_table(tmp_path, samples, assignment, keep)
    table = pq.read_table(tmp_path / entry["file"])
    assert entry["rows"] == 3
    assert table.to_pylist() == [
        {"key": "ct-a", "sample_id": "ct-a", "entity_id": "P1", "split": "train", "fold": 1,
         "time": "2020-01-01T12:00:00", "days_since_first": 0.0, "label": "y"},
        {"key": "ct-b", "sample_id": "ct-b", "entity_id": "P1", "split": "train", "fold": None,
         "time": "2020-01-03T00:00:00", "days_since_first": 1.5, "label": "x"},
        {"key": "ct-c-f0001", "sample_id": "ct-c", "entity_id": "P2", "split": "test", "fold": None,
         "time": None, "days_since_first": None, "label": "x"},
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), max_size=20))
def test_hex_digests_are_the_digests_hex(digests: list[bytes]) -> None:
    from packer.pipeline.publish import hex_digests

    column = hex_digests(b"".join(digests), len(digests))
    assert column.type == pa.string() and column.to_pylist() == [d.hex() for d in digests]


def _shard_rows(split: str, name: str, count: int) -> dict[str, list]:
    # keys, entities and sources as long as the digests' hex: no column is most of the table
    return {"keys": [f"{name}-k{i:05d}".ljust(64, "k") for i in range(count)],
            "labels": [i % 3 for i in range(count)],
            "entity_ids": [f"e{i // 7}".ljust(64, "e") for i in range(count)],
            "sources": [f"source-{count % 2}".ljust(64, "s")] * count}


def _digested(name: str, count: int) -> ShardWrite:
    shard = _shard(name, count, start=0)
    return ShardWrite(file=shard.file, bytes=shard.bytes, sha256=shard.sha256, positions=shard.positions,
                      sizes=shard.sizes, digests=bytes((7 * i + len(name)) % 256 for i in range(32 * count)),
                      checksums=shard.checksums)


def _index_of(shards: list[tuple[str, int]], spill: Path | None = None) -> IndexColumns:
    index = IndexColumns(spill=spill)
    for n, (split, count) in enumerate(shards):
        name = f"{split}-{n:06d}.tar"
        index.add_shard(_digested(name, count), split=split, **_shard_rows(split, name, count))
    return index


def _index_as_one_table_per_shard(shards: list[tuple[str, int]]) -> pa.Table:
    """The index as it was made: a whole table per shard (split and file repeated per row, the
    digests' hex by hashlib's hexdigest form), the tables ordered by (split, file) and joined."""
    tables = []
    for n, (split, count) in sorted(enumerate(shards), key=lambda e: (e[1][0], f"{e[1][0]}-{e[0]:06d}.tar")):
        name = f"{split}-{n:06d}.tar"
        written, rows = _digested(name, count), _shard_rows(split, name, count)
        tables.append(pa.table({
            "key": rows["keys"], "split": [split] * count, "shard": [name] * count,
            "position": list(written.positions), "bytes": list(written.sizes),
            "sha256": [written.digests[32 * i:32 * i + 32].hex() for i in range(count)],
            "xxh3": pa.array(list(written.checksums), pa.uint64()), "label": rows["labels"],
            "entity_id": rows["entity_ids"], "source": rows["sources"]}, schema=INDEX_SCHEMA))
    return pa.concat_tables(tables).combine_chunks()


def test_the_index_given_up_is_the_same_table_and_file_and_leaves_nothing_held(tmp_path) -> None:
    # at 10M samples the index is GBs: the shards keep no per-row split, file or digest hex,
    # write_index gives the shards' columns up as the one table is made, each freed once copied
    # (benchmarks/client_scale.py), and the file's bytes are those of the index made as one
    # table per shard
    shards = [(("test", "train", "valid")[n % 3], 40 + n) for n in range(30)] + [("train", 0)]
    together = _index_as_one_table_per_shard(shards)
    pq.write_table(together, tmp_path / "together.parquet", compression="zstd", row_group_size=together.num_rows)
    index = _index_of(shards)
    assert index.table().equals(together) and index.table().equals(together)  # kept: made again
    table = index.table(release=True)
    assert table.equals(together) and all(column.num_chunks == 1 for column in table.columns)
    assert index.table().num_rows == 0 and index._parts == []
    index = _index_of(shards)
    entry = write_index(tmp_path, index)
    assert (tmp_path / INDEX_FILE).read_bytes() == (tmp_path / "together.parquet").read_bytes()
    assert entry["rows"] == sum(count for _, count in shards) and index.table().num_rows == 0


@pytest.mark.parametrize("rows", [1, 7, 40, 10_000])
def test_an_index_whose_shards_wait_on_disk_is_the_same_table_and_file(tmp_path, monkeypatch, rows) -> None:
    # a build spills each shard's columns to the work disk as it is added (IndexColumns(spill=...))
    # and reads them back a row group at a time: the same rows, the same file, the spill removed
    import packer.pipeline.publish as publish

    shards = [(("test", "train", "valid")[n % 3], 40 + n) for n in range(12)] + [("train", 0), ("valid", 1)]
    together = _index_as_one_table_per_shard(shards)
    spill = tmp_path / "index.arrow.partial"
    index = _index_of(shards, spill)
    assert spill.is_file() and all(not p.columns and not p.digests for p in index._parts)  # nothing held per row
    assert index.table().equals(together) and index.table().equals(together)  # kept: made again from the file
    monkeypatch.setattr(publish, "ROW_GROUP_ROWS", rows)
    pq.write_table(together, tmp_path / "together.parquet", compression="zstd", row_group_size=rows)
    entry = write_index(tmp_path, index)
    assert (tmp_path / INDEX_FILE).read_bytes() == (tmp_path / "together.parquet").read_bytes()
    assert entry["rows"] == together.num_rows and not spill.exists() and index.table().num_rows == 0


def test_an_index_spill_is_removed_when_the_build_stops_before_the_index_is_written(tmp_path) -> None:
    spill = tmp_path / "index.arrow.partial"
    index = _index_of([("train", 3), ("test", 2)], spill)
    assert spill.is_file()
    index.discard()
    assert not spill.exists() and index.table().num_rows == 0
    empty = IndexColumns(spill=spill)   # nothing added: no file, an empty index
    assert empty.table().num_rows == 0 and not spill.exists()
    write_index(tmp_path, empty)
    assert pq.read_table(tmp_path / INDEX_FILE).num_rows == 0


@pytest.mark.skipif(not hasattr(__import__("resource"), "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE")
def test_a_refused_index_spill_names_the_file_and_the_cache_fix_and_discard_raises_nothing_more(
        tmp_path: Path) -> None:
    """The index spill lives in the build cache: when its disk refuses it (here the file size
    limit, as a full disk does), the error names the spill file and the cache's fix, not "a file"
    and another output folder; discard(), run in the ``finally`` of that write, adds no second
    error, and removes the file."""
    import resource

    from packer.errors import FileSystemError

    spill = tmp_path / "cache" / "index-0123456789abcdef.arrow.partial"
    spill.parent.mkdir()
    index = IndexColumns(spill=spill)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(FileSystemError) as caught:
            for n in range(200):
                name = f"train-{n:06d}.tar"
                index.add_shard(_shard(name, 100, start=0), split="train", keys=[f"{name}-{i}" for i in range(100)],
                                labels=[0] * 100, entity_ids=[f"e{i}" for i in range(100)], sources=["ct"] * 100)
            index.table()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(caught.value)
    assert f"cannot write {spill}:" in message
    assert "--cache-dir" in message and "PACKER_WORK_DIR" in message and "output folder" not in message
    index.discard()
    assert not spill.exists()
