"""Per-sample tables of more rows than one row group holds are written a row group at a time.

At 10M samples the index's columns were +2.3 GB on the client, and the splits table's +2 GB,
while ``_index.parquet`` and ``_splits.parquet`` were each written as one row group
(benchmarks/RESULTS.md, issue 40). A table of more than
:data:`packer.pipeline.publish.ROW_GROUP_ROWS` rows is now written in groups of that many, each
made when it is written. A build cannot make a million rows in a test, so these tests lower the
limit and check that such a version's tables hold the same rows as ones written whole, that
everything which reads them (the loader and its per-sample checks, ``packer verify``,
``inspect``, ``diff``, ``report``, an incremental rebuild's reuse, stock pyarrow) reads them, and
that with the real limit each table stays the one row group it always was.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import packer.pipeline.publish
from packer.loader import ShardDataset
from packer.manifest import INDEX_FILE, SPLITS_FILE
from packer.verify import verify_dataset
from tests.photo_jobs import assert_read_by_every_command, build_tree, grow_and_rebuild, write_tree

GROUP = 5   # rows a row group holds in these tests: groups end inside shards of 4 and across splits


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same job built with the real row group length and with groups of :data:`GROUP` rows."""
    tmp_path = tmp_path_factory.mktemp("row-groups")
    write_tree(tmp_path / "raw")
    whole = build_tree(tmp_path, "whole")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packer.pipeline.publish, "ROW_GROUP_ROWS", GROUP)
        grouped = build_tree(tmp_path, "grouped")
    return whole, grouped


@pytest.mark.parametrize("name", [INDEX_FILE, SPLITS_FILE])
def test_a_long_table_is_written_in_row_groups_of_the_same_rows_as_one_written_whole(versions, tmp_path,
                                                                                     name) -> None:
    whole, grouped = versions
    rows = pq.read_metadata(whole / name).num_rows
    assert pq.read_metadata(whole / name).num_row_groups == 1   # the real limit: one group, as ever
    meta = pq.read_metadata(grouped / name)
    assert meta.num_rows == rows == 24
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [GROUP] * (rows // GROUP) + [
        rows % GROUP]
    table = pq.read_table(grouped / name)
    assert table.to_pylist() == pq.read_table(whole / name).to_pylist()
    # made a group at a time, the file is the one pyarrow writes of the whole table in such groups
    pq.write_table(pq.read_table(whole / name), tmp_path / "at-once.parquet", compression="zstd",
                   row_group_size=GROUP)
    assert (grouped / name).read_bytes() == (tmp_path / "at-once.parquet").read_bytes()
    for shard in sorted(whole.glob("*.tar")):   # the shards do not change
        assert (grouped / shard.name).read_bytes() == shard.read_bytes()


@pytest.mark.parametrize("verify", ["sample", "shard", "off"])
def test_the_loader_reads_and_checks_every_sample_through_an_index_of_several_row_groups(versions, verify) -> None:
    whole, grouped = versions
    for split in ("train", "valid", "test"):
        got = {item["key"]: item for item in ShardDataset(grouped / "manifest.json", split, verify=verify)}
        want = {item["key"]: item for item in ShardDataset(whole / "manifest.json", split)}
        assert got.keys() == want.keys() and got
        for key, item in got.items():
            assert np.array_equal(np.asarray(item["image"]), np.asarray(want[key]["image"]))
            assert item["label"] == want[key]["label"]
    # a filtered view finds its rows in the index's label column, across the groups
    circles = {item["key"] for item in ShardDataset(grouped / "manifest.json", "train", labels=["circle"])}
    assert circles == {item["key"] for item in ShardDataset(whole / "manifest.json", "train", labels=["circle"])}


def test_verify_inspect_diff_and_report_read_tables_of_several_row_groups(versions, tmp_path) -> None:
    whole, grouped = versions
    assert_read_by_every_command(whole, grouped, tmp_path)


def test_a_build_leaves_no_index_spill_in_its_cache(hermetic_environment, versions) -> None:
    # each shard's index columns wait in the build cache (index-*.arrow.partial) until the index is written
    spills = list((hermetic_environment / "cache").glob("t-*/index-*"))
    assert (hermetic_environment / "cache").is_dir() and spills == []


def test_a_rebuild_reuses_the_shards_an_earlier_index_of_several_row_groups_lists(tmp_path, monkeypatch) -> None:
    write_tree(tmp_path / "raw")
    monkeypatch.setattr(packer.pipeline.publish, "ROW_GROUP_ROWS", GROUP)
    first = build_tree(tmp_path, "out")
    result = grow_and_rebuild(tmp_path)
    second = Path(result.manifest_path).parent
    assert second != first and result.shards_reused > 0  # read from the earlier version's index
    assert verify_dataset(second, deep=True).ok
    manifest = json.loads((second / "manifest.json").read_text())
    assert pq.read_metadata(second / INDEX_FILE).num_row_groups == -(-manifest["index"]["rows"] // GROUP)
    splits = pq.read_metadata(second / SPLITS_FILE)
    assert splits.num_row_groups == -(-splits.num_rows // GROUP) > 1
