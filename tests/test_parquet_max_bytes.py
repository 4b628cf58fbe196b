"""``pack.max_bytes`` is a hard limit for Parquet shards too (README, Output layout, Shard
boundaries): every shard's file is within it unless it holds one sample.

The planner once sized a Parquet sample as its pixels, spilled metadata and mask plus 64 bytes:
the ``target`` and ``target_mask`` cells (a numeric target of 300 columns: 1,200 raw bytes) and
the record's fields that are not the spilled metadata (its target by name, a table's extra
columns such as a free-text report), which the ``metadata`` cell holds, went uncounted, so
shards came out 3-6 times over ``max_bytes``. Where those parts are none (a class dataset
without extra columns) a sample's size, and so every shard's bytes, is what it was.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from packer.config import load_job
from packer.files import file_sha256
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.plan import parquet_sizes
from packer.pipeline.sampletable import SampleTable
from packer.records import SampleRef, SpilledSample
from packer.shards.encode import EncodedSample
from packer.shards.parquet import shard_compression, shard_schema, write_parquet_shard
from packer.shards.tar import npy_bytes
from packer.targets import Target

MAX_BYTES = 40 * 1024
COLUMNS = [f"c{j}" for j in range(300)]


def _tree(root: Path, *, count: int, report_words: int, zero_one: bool) -> None:
    """``count`` grey 8×8 PNGs under ``root/img`` and their table: an entity, 300 numbers (0 or 1
    where ``zero_one``) and a free-text ``report`` of ``report_words`` words (an extra column every
    record carries)."""
    rng = np.random.default_rng(0)
    (root / "img").mkdir(parents=True)
    with open(root / "t.csv", "w", newline="") as fh:
        rows = csv.writer(fh)
        rows.writerow(["path", "entity", *COLUMNS, "report"])
        for i in range(count):
            assert cv2.imwrite(str(root / "img" / f"{i:03d}.png"), rng.integers(0, 255, (8, 8), dtype=np.uint8))
            numbers = [str(int(x > 0)) if zero_one else f"{x:.6f}" for x in rng.normal(size=len(COLUMNS))]
            rows.writerow([f"{i:03d}.png", f"e{i % 20}", *numbers,
                           " ".join(f"finding{rng.integers(1000)}" for _ in range(report_words))])


def _build(root: Path, out: str, label: dict[str, object]) -> list[Path]:
    job = root / f"{out}.yaml"
    job.write_text(yaml.safe_dump({
        "name": "wide", "sources": [{"kind": "image", "root": str(root / "img"), "table": str(root / "t.csv"),
                                     "label": label}],
        "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1},
        "transform": {"image": {"size": [8, 8], "color": "gray"}},
        "pack": {"format": "parquet", "max_bytes": MAX_BYTES, "max_samples": 1000},
        "output": str(root / out)}, sort_keys=False))
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False, fresh=True))
    return sorted(p for p in Path(result.manifest_path).parent.glob("*.parquet") if not p.name.startswith("_"))


@pytest.mark.parametrize(("label", "zero_one", "report_words"), [
    ({"kind": "numeric", "columns": COLUMNS}, False, 5),       # a wide target: its cells and its names in the record
    ({"kind": "multilabel", "columns": COLUMNS}, True, 5),     # a multi-hot target of 300 and its names
    ({"kind": "numeric", "columns": COLUMNS[:2]}, False, 400),  # a long extra column: a free-text report
], ids=["wide-numeric", "wide-multilabel", "long-report"])
def test_every_parquet_shard_is_within_max_bytes_and_two_builds_write_the_same_bytes(
        tmp_path: Path, label: dict[str, object], zero_one: bool, report_words: int) -> None:
    _tree(tmp_path, count=60, report_words=report_words, zero_one=zero_one)
    shards = _build(tmp_path, "a", label)
    sizes = {shard.name: shard.stat().st_size for shard in shards}
    over = {name: size for name, size in sizes.items() if size > MAX_BYTES}
    assert over == {}, f"shards over pack.max_bytes {MAX_BYTES}: {over}"
    rows = {shard.name: pq.ParquetFile(shard).metadata.num_rows for shard in shards}
    assert sum(rows.values()) == 60
    assert max(rows.values()) > 1  # the limit holds several of these samples, and they are packed together
    again = _build(tmp_path, "b", label)
    assert [(p.name, file_sha256(p)) for p in again] == [(p.name, file_sha256(p)) for p in shards]


def _table(extra: tuple[tuple[str, str], ...] = ()) -> SampleTable:
    return SampleTable.of([
        SpilledSample(key=f"k{i}", ref=SampleRef(sample_id=f"k{i}", source="ct", kind="image", path=f"/r/{i}.png",
                                                 relpath=f"{i}.png", label="ab"[i % 2], entity=f"e{i}", time=None,
                                                 extra=extra),
                      spill="a.spill", offset=0, pixel_bytes=100 + i, meta_bytes=30 + i, mask_bytes=7 * i,
                      shape=(1, 10, 10), dtype="uint8", sha256="")
        for i in range(6)])


def test_a_class_sample_without_extra_columns_is_sized_as_before_and_extras_add_their_record_bytes() -> None:
    target = Target("class", ("a", "b"))
    plain = _table()
    assert parquet_sizes(plain, target).tolist() == plain.nbytes.tolist()  # so its shards keep their bytes
    assert parquet_sizes(plain, None).tolist() == plain.nbytes.tolist()
    report = ("report", "x" * 500)
    with_report = _table((report,))
    assert (parquet_sizes(with_report, target) - with_report.nbytes).tolist() == [len(',"extra":{"report":""}')
                                                                                  + 500] * 6


def test_a_vector_target_adds_its_cells_and_its_record_fields() -> None:
    table = SampleTable.of([
        SpilledSample(key="k", ref=SampleRef(sample_id="k", source="ct", kind="image", path="/r/k.png",
                                             relpath="k.png", label="1.5|2|-3", entity="e", time=None),
                      spill="a.spill", offset=0, pixel_bytes=100, meta_bytes=30, shape=(1, 10, 10), dtype="uint8",
                      sha256="")])
    added = int((parquet_sizes(table, Target("numeric", ("w", "h", "d"))) - table.nbytes)[0])
    record = len(',"target":{"d":-3.0,"h":2.0,"w":1.5}')
    assert record + 3 * 4 <= added <= record + 3 * 4 + 16  # the record's fields, 3 float32 and their list levels


# -- which columns are compressed ---------------------------------------------------------------

def _codecs(tmp_path: Path) -> dict[str, str]:
    """Each column chunk's codec (by its path in the Parquet schema) of a shard with every column."""
    mask = npy_bytes(np.zeros((1, 4, 4), dtype=np.uint8))
    sample = EncodedSample(key="s-0", split="train", label=None, label_name=None, entity_id="e", source="src",
                           shape=(1, 4, 4), dtype="uint8", pixels=bytes(16), info={"k": 1},
                           target=np.arange(50, dtype=np.float32), target_mask=np.ones(50, dtype=np.uint8), mask=mask)
    write_parquet_shard(tmp_path / "train-000000.parquet", [sample])
    group = pq.ParquetFile(tmp_path / "train-000000.parquet").metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)}


def test_the_writer_names_each_columns_codec_by_the_path_parquet_stores_it_under(tmp_path: Path) -> None:
    # pyarrow keys a list column's codec by its leaf (shape.list.element): a codec under the
    # column's own name is ignored, so the writer names none that way
    codecs = _codecs(tmp_path)
    schema = shard_schema(has_label=False, target=np.dtype(np.float32), mask=True, target_mask=True)
    assert sorted(shard_compression(schema)) == sorted(codecs)
    assert {path: codec.upper().replace("NONE", "UNCOMPRESSED")
            for path, codec in shard_compression(schema).items()} == codecs
    # the list columns are uncompressed, as every Parquet shard packer wrote has them (their bytes kept)
    assert {path for path, codec in codecs.items() if codec == "UNCOMPRESSED"} == {
        "image", "mask", "shape.list.element", "target.list.element", "target_mask.list.element",
        "mask_shape.list.element"}


def test_the_readme_calls_compressed_only_columns_that_are(tmp_path: Path) -> None:
    codecs = {path.removesuffix(".list.element"): codec for path, codec in _codecs(tmp_path).items()}
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"A damaged compressed page of (.+?) \(zstd.*?a damaged page of (.+?) can still cost", readme)
    assert said is not None, "README names the columns whose damaged page costs its rows, compressed or not"
    compressed, uncompressed = (set(re.findall(r"`([a-z_]+)`", part)) for part in said.groups())
    assert compressed and {name: codecs[name] for name in compressed} == dict.fromkeys(compressed, "ZSTD")
    assert {name: codecs[name] for name in uncompressed} == dict.fromkeys(uncompressed, "UNCOMPRESSED")
    assert uncompressed >= {"shape", "target", "target_mask", "mask_shape", "image", "mask"}
