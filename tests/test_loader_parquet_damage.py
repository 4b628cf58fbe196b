"""A damaged page of a Parquet shard costs only the samples whose bytes it damaged.

A built Parquet shard holds one row group; its ``image`` column (uncompressed, PLAIN: each cell
a 4-byte length and the pixel bytes) is one or a few pages. A flipped byte in a cell's length or
in the page header makes every record batch of the shard fail to decode, and the loader used to
skip all ~30 samples of the row group under ``on_error="skip"`` though one sample's bytes (or
none) were damaged. The loader now reads such a shard column by column and the image cells from
the page's own layout, and delivers every row whose checksum (``_index.parquet``) matches.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packer.config import load_job
from packer.loader import ShardDataset, ShardReadError
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.helpers import demo_job_doc, write_job


@pytest.fixture(scope="module")
def built(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    tmp = tmp_path_factory.mktemp("parquet-damage")
    doc = demo_job_doc(demo_raw.root, tmp / "out", pack={"format": "parquet", "max_samples": 30})
    return build(load_job(write_job(tmp, doc)), BuildOptions(scheduler="sync", quiet=True))


def damaged_copy(built: BuildResult, folder: Path) -> tuple[Path, Path]:
    """A writable copy of the version folder; its manifest and its first train shard."""
    copy = folder / "v"
    shutil.copytree(built.version_dir, copy)
    for path in copy.iterdir():
        path.chmod(0o644)
    return copy / "manifest.json", copy / "train-000000.parquet"


def flip(shard: Path, *offsets: int) -> None:
    data = bytearray(shard.read_bytes())
    for offset in offsets:
        data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))


def cell_at(shard: Path, row: int) -> int:
    """The byte offset of row ``row``'s image bytes in ``shard`` (its 4-byte length is just before)."""
    data = shard.read_bytes()
    image = pq.read_table(shard, columns=["image"]).column("image")[row].as_py()
    assert data.count(image) == 1
    return data.find(image)


def image_page_header(shard: Path) -> int:
    group = pq.ParquetFile(shard).metadata.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "image")
    assert chunk.compression == "UNCOMPRESSED" and not chunk.has_dictionary_page
    return chunk.data_page_offset


def read_all(manifest: Path) -> tuple[dict[str, bytes], ShardDataset]:
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    return {item["key"]: item["image"].numpy().tobytes() for item in dataset}, dataset


@pytest.mark.parametrize("damage", ["length", "length_and_pixels", "page_header", "page_header_and_pixels"])
def test_a_damaged_image_page_loses_only_the_samples_whose_bytes_changed(
        built: BuildResult, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    manifest, shard = damaged_copy(built, tmp_path)
    table = pq.read_table(shard)
    assert table.num_rows == 30 and pq.ParquetFile(shard).metadata.num_row_groups == 1
    rows = table.to_pylist()
    expected, _ = read_all(manifest)  # every train sample, read before the damage
    assert len(expected) > 30
    assert all(expected[r["key"]] == r["image"] for r in rows)  # the loader's pixels are the shard's cells
    k = 7
    at = cell_at(shard, k)
    offsets = {"length": [at - 2], "length_and_pixels": [at - 2, at + 100],
               "page_header": [image_page_header(shard) + 3],
               "page_header_and_pixels": [image_page_header(shard) + 3, at + 100]}[damage]
    flip(shard, *offsets)
    with pytest.raises(Exception):  # noqa: B017 - stock pyarrow's own error, whatever its type: unchanged
        pq.read_table(shard)

    with caplog.at_level(logging.WARNING):
        got, dataset = read_all(manifest)
    lost = {rows[k]["key"]} if damage.endswith("pixels") else set()
    assert set(got) == set(expected) - lost
    assert all(got[key] == expected[key] for key in got)  # every delivered sample's pixels as built
    assert dataset.skipped == len(lost)
    if lost:
        assert len(dataset.skipped_samples) == 1 and rows[k]["key"] in dataset.skipped_samples[0]
        assert "checksum_mismatch" in dataset.skipped_samples[0], dataset.skipped_samples
        with pytest.raises(ShardReadError, match=f"train-000000.parquet: sample {rows[k]['key']}: checksum_mismatch"):
            list(ShardDataset(manifest, "train", shuffle=False))


def test_without_per_sample_checksums_the_rows_past_a_damaged_length_are_not_delivered(
        built: BuildResult, tmp_path: Path) -> None:
    """verify="off" checks no sample's bytes, so nothing read around pyarrow's decoder is
    delivered: the rows pyarrow decodes before the damage arrive, the rest are skipped, counted
    and named as undecodable, with the column and what to do."""
    manifest, shard = damaged_copy(built, tmp_path)
    rows = pq.read_table(shard).to_pylist()
    flip(shard, cell_at(shard, 7) - 2)
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip", verify="off")
    keys = {item["key"] for item in dataset}
    assert {r["key"] for r in rows[:7]} <= keys and not {r["key"] for r in rows[7:]} & keys
    assert dataset.skipped == 23
    message = dataset.skipped_samples[0]
    assert "undecodable" in message and "column 'image'" in message and "packer verify" in message, message


@pytest.mark.parametrize("page", [0, 1, 2])
def test_past_a_damaged_page_header_the_later_pages_of_the_column_are_read(tmp_path: Path, page: int) -> None:
    """A shard whose image column spans three pages (2,500 rows of 1 KiB): one page header
    flipped and one pixel of a sample in another page. Only that sample is lost, and every
    sample delivered has the pixels it was written with."""
    from loader_fixtures import build_dataset, sample_image

    from packer.shards.parquet import _thrift_struct

    manifest = build_dataset(tmp_path / "ds", fmt="parquet", shard_sizes=(2500,), shape=(1, 32, 32))
    shard = tmp_path / "ds" / "train-000000.parquet"
    data = memoryview(shard.read_bytes())
    first = image_page_header(shard)
    headers, pos = [], first
    while len(headers) < 3:
        header, end = _thrift_struct(data, pos)
        headers.append((pos, header[8][3]))
        pos = end + header[3]
    assert [rows for _, rows in headers] == [1024, 1024, 452]
    victim = 2300 if page != 2 else 100  # a sample in another page than the damaged header's
    pixels = bytes(data).find(sample_image(victim, (1, 32, 32)).tobytes())
    flip(shard, headers[page][0] + 3, pixels + 10)
    with pytest.raises(Exception):  # noqa: B017 - stock pyarrow's own error, whatever its type: unchanged
        pq.read_table(shard)
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    items = {item["key"]: item["image"].numpy() for item in dataset}
    assert set(items) == {f"s{i:05d}" for i in range(2500)} - {f"s{victim:05d}"}
    assert all((image == sample_image(int(key[1:]), (1, 32, 32))).all() for key, image in items.items())
    assert dataset.skipped == 1 and "checksum_mismatch" in dataset.skipped_samples[0]


def column_page(shard: Path, column: str) -> int:
    """The byte offset of ``column``'s (compressed) data page in ``shard``'s one row group."""
    group = pq.ParquetFile(shard).metadata.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == column)
    assert chunk.compression != "UNCOMPRESSED"
    return chunk.data_page_offset


@pytest.mark.parametrize("column", ["key", "label"])
def test_a_damaged_key_or_label_page_costs_no_sample_the_index_names_them(
        built: BuildResult, tmp_path: Path, column: str) -> None:
    """A byte flipped 20 bytes into the compressed ``key`` (or ``label``) page: stock pyarrow
    decodes no row of the shard ("Invalid number of indices: 0" for the key), and the loader used
    to skip all 30 as undecodable. ``_index.parquet`` records each sample's key and label by its
    position, and the per-sample checksum covers both: every sample arrives, with the key, label
    and pixels it was built with."""
    manifest, shard = damaged_copy(built, tmp_path)
    rows = pq.read_table(shard).to_pylist()
    before = {item["key"]: (int(item["label"]), item["image"].numpy().tobytes())
              for item in ShardDataset(manifest, "train", shuffle=False)}
    assert all(before[r["key"]] == (r["label"], r["image"]) for r in rows)  # the loader reads the shard's cells
    flip(shard, column_page(shard, column) + 20)
    with pytest.raises(Exception):  # noqa: B017 - stock pyarrow's own error, whatever its type: unchanged
        pq.read_table(shard, columns=[column])

    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    got = {item["key"]: (int(item["label"]), item["image"].numpy().tobytes()) for item in dataset}
    assert dataset.skipped == 0, dataset.skipped_samples
    assert got == before  # every sample: its key, label and pixels as built
    assert len(got) == len(before) > 30


def test_a_damaged_key_page_and_a_damaged_pixel_lose_that_sample_only(built: BuildResult, tmp_path: Path) -> None:
    """The keys taken from the index do not hide other damage: a flipped pixel of row 7 besides
    the damaged key page fails that sample's checksum, named by its key; the other 29 arrive
    intact. Without per-sample checks (verify="off") nothing is taken from the index: the rows
    whose key is lost are skipped as undecodable, naming the column."""
    manifest, shard = damaged_copy(built, tmp_path)
    rows = pq.read_table(shard).to_pylist()
    before = {item["key"]: item["image"].numpy().tobytes() for item in ShardDataset(manifest, "train", shuffle=False)}
    flip(shard, column_page(shard, "key") + 20, cell_at(shard, 7) + 100)

    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    got = {item["key"]: item["image"].numpy().tobytes() for item in dataset}
    assert set(got) == set(before) - {rows[7]["key"]}
    assert all(got[key] == before[key] for key in got)
    assert dataset.skipped == 1 and rows[7]["key"] in dataset.skipped_samples[0]
    assert "checksum_mismatch" in dataset.skipped_samples[0], dataset.skipped_samples

    unchecked = ShardDataset(manifest, "train", shuffle=False, on_error="skip", verify="off")
    keys = {item["key"] for item in unchecked}
    assert keys == set(before) - {r["key"] for r in rows}
    assert unchecked.skipped == 30 and "column 'key'" in unchecked.skipped_samples[0]


def test_a_data_page_whose_type_reads_as_an_index_page_loses_no_sample(built: BuildResult, tmp_path: Path) -> None:
    """One bit of the image page header's type (DATA_PAGE_V2, 3) flipped makes it an INDEX_PAGE
    (1), which pyarrow skips without an error: it yields no row of the shard. The loader said
    "truncated: the file ended after 0 rows" for all 30 samples, though the file is whole and
    only a page header is damaged; it now reads the image cells from the chunk's own layout as
    for any damaged page, and delivers every sample whose checksum matches."""
    manifest, shard = damaged_copy(built, tmp_path)
    expected, _ = read_all(manifest)
    header = image_page_header(shard)
    data = bytearray(shard.read_bytes())
    assert data[header:header + 2] == b"\x15\x06"  # field 1 (type), i32 zigzag 3: DATA_PAGE_V2
    data[header + 1] = 0x02  # zigzag 1: INDEX_PAGE
    shard.write_bytes(bytes(data))
    assert pq.ParquetFile(shard).metadata.num_rows == 30

    got, dataset = read_all(manifest)
    assert dataset.skipped == 0, dataset.skipped_samples
    assert got == expected


def test_without_checksums_a_skipped_page_names_the_damage_not_a_truncated_file(
        built: BuildResult, tmp_path: Path) -> None:
    """The same damage under verify="off": nothing read around pyarrow is delivered, and each
    lost sample says its cells cannot be decoded, with what to do, not that the file ended."""
    manifest, shard = damaged_copy(built, tmp_path)
    header = image_page_header(shard)
    data = bytearray(shard.read_bytes())
    data[header + 1] = 0x02
    shard.write_bytes(bytes(data))
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip", verify="off")
    list(dataset)
    assert dataset.skipped == 30
    message = dataset.skipped_samples[0]
    assert "undecodable" in message and "column 'image'" in message and "packer verify" in message, message
    assert "truncated" not in message and "the file ended" not in message, message


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """30 photos of 64×64, mostly black (as a CT slice's air is), each with a mask, as one
    Parquet shard: the image and mask columns are both uncompressed byte columns."""
    import cv2
    import numpy as np

    tmp = tmp_path_factory.mktemp("parquet-masked")
    rng = np.random.default_rng(0)
    rows = ["path,mask,entity,label"]
    (tmp / "img").mkdir()
    for i in range(30):
        image = np.zeros((64, 64, 3), np.uint8)
        image[i:i + 9, 40:50] = rng.integers(1, 256, (9, 10, 3))
        mask = np.zeros((64, 64), np.uint8)
        mask[4:12 + i, 5:20] = 1
        cv2.imwrite(str(tmp / f"img/{i:02d}.png"), image)
        cv2.imwrite(str(tmp / f"img/{i:02d}_m.png"), mask)
        rows.append(f"img/{i:02d}.png,img/{i:02d}_m.png,E{i},{'ab'[i % 2]}")
    (tmp / "t.csv").write_text("\n".join(rows) + "\n")
    doc = {"name": "seg", "sources": [{"kind": "image", "root": str(tmp), "mask": {"column": "mask", "classes": [0, 1]},
                                       "table": {"file": str(tmp / "t.csv"), "files": "table"}}],
           "split": {"by": "entity", "ratios": {"train": 1.0, "valid": 0.0, "test": 0.0}, "seed": 1,
                     "balance": {"accept": True}},
           "transform": {"image": {"size": [64, 64], "color": "rgb"}},
           "pack": {"format": "parquet"}, "output": str(tmp / "out")}
    return build(load_job(write_job(tmp, doc)), BuildOptions(scheduler="sync", quiet=True))


def masked_items(manifest: Path, **kwargs: Any) -> tuple[dict[str, tuple[bytes, bytes]], ShardDataset]:
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip", **kwargs)
    return {item["key"]: (item["image"].numpy().tobytes(), item["mask"].numpy().tobytes()) for item in dataset}, dataset


def column_cell(shard: Path, column: str, row: int) -> int:
    """The byte offset of row ``row``'s cell of the byte column ``column`` (its 4-byte length just before)."""
    data = shard.read_bytes()
    cells = pq.read_table(shard, columns=[column]).column(column).to_pylist()
    at = data.find(cells[row])
    assert at > 0 and int.from_bytes(data[at - 4:at], "little") == len(cells[row])
    return at


@pytest.mark.parametrize("damage", ["mask_length", "mask_page_header", "image_length_still_decodes"])
def test_a_damaged_mask_page_or_a_length_that_still_decodes_loses_no_sample(
        masked: BuildResult, tmp_path: Path, damage: str) -> None:
    """A byte of row 3's mask length, or of the mask page header: the mask column was not read
    from its pages as the image column is, so every row from the damage on was lost (all 30 for
    the header). One bit of row 5's image length (12288 → 45056): the cell swallows its black
    neighbours, whose zero bytes read as small lengths, so pyarrow decodes the page without an
    error, and every later row failed its size or checksum check. Every sample now arrives with
    the pixels and mask it was built with."""
    copy = tmp_path / "v"
    shutil.copytree(masked.version_dir, copy)
    for path in copy.iterdir():
        path.chmod(0o644)
    manifest, shard = copy / "manifest.json", copy / "train-000000.parquet"
    before, _ = masked_items(manifest)
    assert len(before) == 30
    data = bytearray(shard.read_bytes())
    if damage == "mask_length":
        data[column_cell(shard, "mask", 3) - 3] ^= 0xFF
    elif damage == "mask_page_header":
        group = pq.ParquetFile(shard).metadata.row_group(0)
        chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "mask")
        assert chunk.compression == "UNCOMPRESSED"
        data[chunk.data_page_offset + 3] ^= 0xFF
    else:
        at = column_cell(shard, "image", 5)
        assert int.from_bytes(data[at - 4:at], "little") == 12288
        data[at - 3] ^= 0x80
    shard.write_bytes(bytes(data))
    if damage == "image_length_still_decodes":
        assert len(pq.read_table(shard, columns=["image"])) == 30  # stock pyarrow: no error, cells wrong
    got, dataset = masked_items(manifest)
    assert dataset.skipped == 0, dataset.skipped_samples
    assert got == before


@pytest.mark.parametrize("column", ["key", "label"])
def test_a_key_or_label_page_pyarrow_skips_without_an_error_loses_no_sample_and_verify_names_none(
        built: BuildResult, tmp_path: Path, column: str) -> None:
    """The data page of the compressed key (or label) column with its type read as an index page:
    pyarrow yields none of its cells, without an error. The loader skipped all 30 samples
    ("column 'label': ends early") where a page that raises costs none, and `packer verify` named
    all 30 as unreadable though every sample's bytes are intact: both take those cells from
    _index.parquet now, as for a page that raises."""
    from click.testing import CliRunner

    from packer.cli import main

    manifest, shard = damaged_copy(built, tmp_path)
    before = {item["key"]: (int(item["label"]), item["image"].numpy().tobytes())
              for item in ShardDataset(manifest, "train", shuffle=False)}
    page = column_page(shard, column)
    data = bytearray(shard.read_bytes())
    assert data[page:page + 2] == b"\x15\x06"  # field 1 (type), i32 zigzag 3: DATA_PAGE_V2
    data[page + 1] = 0x02  # zigzag 1: INDEX_PAGE
    shard.write_bytes(bytes(data))
    assert len(pq.read_table(shard, columns=[column])) == 0  # stock pyarrow: no error, no cell
    dataset = ShardDataset(manifest, "train", shuffle=False, on_error="skip")
    got = {item["key"]: (int(item["label"]), item["image"].numpy().tobytes()) for item in dataset}
    assert dataset.skipped == 0, dataset.skipped_samples
    assert got == before
    result = CliRunner().invoke(main, ["verify", str(manifest.parent)])
    assert result.exit_code == 5, result.output  # the shard's sha256 still differs: it is damaged
    assert "train-000000.parquet" in result.output and "cannot be read to check its xxh3" not in result.output
    assert not any(key in result.output for key in before), result.output
