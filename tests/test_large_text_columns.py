"""Per-sample tables past 2 GiB of text: a column too large for Arrow's ``string`` is written ``large_string``.

One Arrow ``string`` column holds at most 2 GiB of characters (int32 offsets): the index's
``sha256`` column passes that at ~33.5M rows, keys and entity ids at ~100M. A build cannot make
that many rows in a test, so these tests lower :data:`packer.manifest.STRING_MAX_BYTES` and check
that such a build writes its text columns ``large_string``, that everything which reads the tables
(the loader, ``packer verify``/``inspect``/``diff``/``report``, stock pyarrow) reads that form,
and that with the real limit the tables keep the ``string`` columns they always had.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import packer.manifest
from packer.loader import ShardDataset
from packer.manifest import INDEX_FILE, INDEX_SCHEMA, SPLITS_FILE, SPLITS_SCHEMA
from packer.pipeline.sampletable import as_table
from packer.records import SampleRef, SpilledSample
from packer.verify import verify_dataset
from tests.photo_jobs import LABELS, assert_read_by_every_command, build_tree, grow_and_rebuild, write_tree


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """The same job built with the real limit and with a limit of 0 bytes (every text column that
    holds any text is then too large for ``string``)."""
    tmp_path = tmp_path_factory.mktemp("large-text")
    pixels = write_tree(tmp_path / "raw")
    normal = build_tree(tmp_path, "normal")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packer.manifest, "STRING_MAX_BYTES", 0)
        large = build_tree(tmp_path, "large")
    return normal, large, pixels


def _text_types(path: Path) -> dict[str, str]:
    schema = pq.read_schema(path)
    return {f.name: str(f.type) for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}


def test_a_column_past_the_limit_is_written_large_string_and_stock_pyarrow_reads_it(versions) -> None:
    normal, large, _ = versions
    # under the real limit: string, as ever (the schemas of the format)
    assert pq.read_schema(normal / INDEX_FILE).remove_metadata() == INDEX_SCHEMA
    assert pq.read_schema(normal / SPLITS_FILE).remove_metadata() == SPLITS_SCHEMA
    # past it: every column that holds text; the all-null time column (no text) stays string
    assert set(_text_types(large / INDEX_FILE).values()) == {"large_string"}
    assert _text_types(large / SPLITS_FILE) == {"key": "large_string", "sample_id": "large_string",
                                                "entity_id": "large_string", "split": "large_string",
                                                "time": "string", "label": "large_string"}
    for name in (INDEX_FILE, SPLITS_FILE):
        assert pq.read_table(large / name).to_pylist() == pq.read_table(normal / name).to_pylist()
        assert pq.ParquetFile(large / name).read().cast(pq.read_schema(normal / name)).equals(
            pq.read_table(normal / name))


def test_the_limit_changes_no_sample_and_the_tables_only_in_their_schema(versions) -> None:
    normal, large, _ = versions
    for shard in sorted(normal.glob("*.tar")):
        assert (large / shard.name).read_bytes() == shard.read_bytes()
    for name in (INDEX_FILE, SPLITS_FILE):
        meta_normal, meta_large = pq.read_metadata(normal / name), pq.read_metadata(large / name)
        assert meta_normal.num_rows == meta_large.num_rows and meta_large.num_row_groups == 1


def test_the_loader_reads_and_checks_every_sample_through_a_large_string_index(versions) -> None:
    normal, large, pixels = versions
    for split in ("train", "valid", "test"):
        got = {item["key"]: item for item in ShardDataset(large / "manifest.json", split, records=True)}
        want = {item["key"]: item for item in ShardDataset(normal / "manifest.json", split, records=True)}
        assert got.keys() == want.keys() and got
        for key, item in got.items():
            assert np.array_equal(np.asarray(item["image"]), np.asarray(want[key]["image"]))
            assert item["label"] == want[key]["label"]
            # the pixels are the raw file's (16x16 grey, no resize needed)
            assert np.array_equal(np.asarray(item["image"])[0], pixels[item["record"]["path"]])
    # a filtered view finds its rows in the index's source and label columns
    view = ShardDataset(large / "manifest.json", "train", labels=["circle"], records=True)
    assert {item["record"]["path"] for item in view} == {
        rel for rel in pixels if LABELS.index("circle") == int(rel[-6:-4]) % 2
        and rel in {item["record"]["path"] for item in ShardDataset(normal / "manifest.json", "train",
                                                                       records=True)}}


def test_verify_inspect_diff_and_report_read_a_large_string_version(versions, tmp_path: Path) -> None:
    normal, large, _ = versions
    assert_read_by_every_command(normal, large, tmp_path)


def test_an_index_of_mixed_widths_reads_as_one(tmp_path: Path, monkeypatch) -> None:
    """A limit between the columns' sizes, as at ~33.5M rows: only sha256 (64 characters a row,
    1,536 bytes here) passes it; the keys (20 characters, 480 bytes) and the rest stay string."""
    write_tree(tmp_path / "raw")
    monkeypatch.setattr(packer.manifest, "STRING_MAX_BYTES", 1000)
    built = build_tree(tmp_path, "mixed")
    assert _text_types(built / INDEX_FILE) == {"key": "string", "split": "string", "shard": "string",
                                               "sha256": "large_string", "entity_id": "string", "source": "string"}
    assert set(_text_types(built / SPLITS_FILE).values()) == {"string"}
    assert verify_dataset(built, deep=True).ok
    train = json.loads((built / "manifest.json").read_text())["splits"]["train"]["samples"]
    assert sum(1 for _ in ShardDataset(built / "manifest.json", "train")) == train > 0


def test_sample_table_arrow_gives_large_string_past_the_limit_and_client_stages_take_it(monkeypatch) -> None:
    def sample(i: int) -> SpilledSample:
        ref = SampleRef(sample_id=f"s{i:03d}", source="photos", kind="image", path=f"/r/{i}.png", relpath=f"{i}.png",
                        label=LABELS[i % 2], entity=f"e{i % 3}", time=None)
        return SpilledSample(key=f"k{i:03d}", ref=ref, spill="c.spill", offset=0, pixel_bytes=16, meta_bytes=2,
                             shape=(1, 4, 4), dtype="uint8", sha256="0" * 64)

    samples = [sample(i) for i in range(10)]
    table = as_table(samples)
    assert table.arrow("key").type == pa.string()
    monkeypatch.setattr(packer.manifest, "STRING_MAX_BYTES", 5)
    keys, labels = table.arrow("key"), table.arrow("label")
    assert keys.type == pa.large_string() and labels.type == pa.large_string()
    assert keys.to_pylist() == [s.key for s in samples]
    assert labels.to_pylist() == [s.ref.label for s in samples]
    # coded: the distinct values (12 and 6 bytes) fit, the rows' (60 and 20) do not: the type follows the rows'
    monkeypatch.setattr(packer.manifest, "STRING_MAX_BYTES", 19)
    assert table.arrow("label").type == pa.large_string() and table.arrow("entity").type == pa.large_string()
    assert table.order_by(["entity", "key"]).tolist() == sorted(range(10), key=lambda i: (f"e{i % 3}", i))


def test_hex_digests_past_the_limit_are_large_string_not_wrapped_offsets(monkeypatch) -> None:
    from packer.pipeline.publish import hex_digests

    digests = [bytes([i]) * 32 for i in range(5)]
    assert hex_digests(b"".join(digests), 5).type == pa.string()
    monkeypatch.setattr(packer.manifest, "STRING_MAX_BYTES", 64 * 5 - 1)
    column = hex_digests(b"".join(digests), 5)
    assert column.type == pa.large_string() and column.to_pylist() == [d.hex() for d in digests]
    column.validate(full=True)


def test_a_rebuild_reuses_the_shards_an_earlier_large_string_index_lists(tmp_path: Path, monkeypatch) -> None:
    write_tree(tmp_path / "raw")
    monkeypatch.setattr(packer.manifest, "STRING_MAX_BYTES", 0)
    first = build_tree(tmp_path, "out")
    result = grow_and_rebuild(tmp_path)
    second = Path(result.manifest_path).parent
    assert second != first and result.shards_reused > 0  # read from the earlier version's index
    assert verify_dataset(second, deep=True).ok
