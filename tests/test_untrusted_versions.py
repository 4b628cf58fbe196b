"""packer's own commands on a received version folder that someone edited and then re-sealed:
every hash it carries recomputed (per-sample xxh3 in ``_index.parquet``, sha256 and size in the
manifest, ``dataset_hash``), so nothing but the content itself tells the edit apart.

Such a folder is data, not a program: ``packer report`` and ``packer verify`` read no file outside
the version folder, and each hostile sample or side file becomes a finding that names the shard
and the key (``verify`` exits 5), never a traceback. The versions are real builds of a few PNGs;
the edits are written the way a sender would, with tarfile, numpy and pyarrow.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from packer.cli import main
from packer.config import load_job
from packer.manifest import compute_dataset_hash
from packer.pipeline.build import BuildOptions, build
from packer.shards.checksum import members_checksum, parquet_cells_checksum
from tests.helpers import write_job

TAR_ORDER = ("cls", "json", "npy", "mask.npy", "target.npy", "target_mask.npy")
PARQUET_CELLS = ("label", "shape", "dtype", "image", "metadata", "target", "target_mask", "mask", "mask_shape",
                 "mask_dtype")


def _build(tmp: Path, fmt: str) -> Path:
    raw = tmp / "raw"
    raw.mkdir(parents=True)
    rows = ["path,label,entity"]
    for i in range(12):
        cv2.imwrite(str(raw / f"im{i}.png"), np.random.default_rng(i).integers(0, 255, (8, 8, 3), np.uint8))
        rows.append(f"im{i}.png,{'ab'[i % 2]},s{i}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    doc = {"name": "ds", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "transform": {"image": {"size": [8, 8], "color": "rgb"}}, "pack": {"format": fmt},
           "output": str(tmp / "out")}
    job = load_job(write_job(tmp / "job", doc))
    return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("untrusted")
    return {fmt: _build(tmp / fmt, fmt) for fmt in ("webdataset", "parquet")}


def received(built: dict[str, Path], fmt: str, tmp_path: Path) -> Path:
    """A copy of the built version, as a shared folder somewhere else."""
    return Path(shutil.copytree(built[fmt], tmp_path / "shared" / "ds" / built[fmt].name))


def reseal(version: Path, edit: Callable[[dict], None] | None = None) -> None:
    """Recompute every shard's and the index's size and sha256 and the dataset_hash, after
    ``edit`` (which may change the manifest)."""
    manifest = json.loads((version / "manifest.json").read_text())
    if edit is not None:
        edit(manifest)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            if (version / shard["file"]).is_file() and "/" not in shard["file"]:
                data = (version / shard["file"]).read_bytes()
                shard["bytes"], shard["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    index = (version / "_index.parquet").read_bytes()
    manifest["index"].update(bytes=len(index), sha256=hashlib.sha256(index).hexdigest())
    manifest["dataset_hash"] = compute_dataset_hash(manifest)
    (version / "manifest.json").write_text(json.dumps(manifest, indent=2))


def edit_index(version: Path, edit: Callable[[list[dict]], None]) -> None:
    table = pq.read_table(version / "_index.parquet")
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), version / "_index.parquet")


def first_shard(version: Path, suffix: str) -> str:
    return next(p.name for p in sorted(version.iterdir()) if p.name.startswith("test-") and p.name.endswith(suffix))


def replace_tar_member(version: Path, ext: str, data: bytes) -> tuple[str, str]:
    """The first sample of the first test shard with its ``<key>.<ext>`` replaced by ``data``,
    its index checksum and every hash re-sealed; returns (shard, key)."""
    shard = first_shard(version, ".tar")
    with tarfile.open(version / shard) as tar:
        items = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    key = items[0][0].name.split(".", 1)[0]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member, payload in items:
            payload = data if member.name == f"{key}.{ext}" else payload
            member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    (version / shard).write_bytes(buffer.getvalue())
    members: dict[str, dict[str, bytes]] = {}
    offsets: dict[str, int] = {}
    with tarfile.open(version / shard) as tar:
        for member in tar.getmembers():
            name, _, extension = member.name.partition(".")
            members.setdefault(name, {})[extension] = tar.extractfile(member).read()  # type: ignore[union-attr]
            offsets.setdefault(name, member.offset)

    def fix(rows: list[dict]) -> None:
        for row in rows:
            if row["key"] in members:
                parts = members[row["key"]]
                row["xxh3"] = members_checksum(row["key"], {e: parts[e] for e in TAR_ORDER if e in parts})
                row["position"] = offsets[row["key"]]
    edit_index(version, fix)
    reseal(version)
    return shard, key


def replace_parquet_cell(version: Path, column: str, value: object, kind: pa.DataType | None = None
                         ) -> tuple[str, str]:
    """The first row of the first test shard with ``column`` set to ``value`` (with ``kind``, the
    column retyped, every row's cell ``value``), its index checksum and every hash re-sealed;
    returns (shard, key)."""
    shard = first_shard(version, ".parquet")
    table = pq.read_table(version / shard)
    values = table.column(column).to_pylist()
    values = [value] * len(values) if kind is not None else [value, *values[1:]]
    kind = kind or table.schema.field(column).type
    table = table.set_column(table.schema.get_field_index(column), pa.field(column, kind),
                             pa.array(values, type=kind))
    pq.write_table(table, version / shard)
    sums = {row["key"]: parquet_cells_checksum(row["key"], {c: row.get(c) for c in PARQUET_CELLS})
            for row in pq.read_table(version / shard).to_pylist()}

    def fix(rows: list[dict]) -> None:
        for row in rows:
            row["xxh3"] = sums.get(row["key"], row["xxh3"])
    edit_index(version, fix)
    reseal(version)
    return shard, str(table.column("key")[0].as_py())


def packer(*args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


# -- a shard name that leaves the version folder ------------------------------------------------------------


def test_report_refuses_a_manifest_whose_shard_name_leaves_the_version_folder(built: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    version = received(built, "webdataset", tmp_path)
    secret = tmp_path / "shared" / "secret"
    secret.mkdir()
    shard = first_shard(version, ".tar")
    shutil.move(version / shard, secret / "other.tar")
    outside = "../../secret/other.tar"

    def rename(rows: list[dict]) -> None:
        for row in rows:
            row["shard"] = outside if row["shard"] == shard else row["shard"]
    edit_index(version, rename)
    reseal(version, lambda m: m["splits"]["test"]["shards"][0].update(file=outside))
    result = packer("report", version, "-o", tmp_path / "report.html")
    assert result.exit_code == 5, result.output
    assert f"'{outside}' is not a plain path inside the version folder" in result.output
    assert "packer report reads no file outside the version folder" in result.output
    assert not (tmp_path / "report.html").exists()  # refused before any shard is opened


def test_the_shard_size_warning_stats_no_path_outside_the_version_folder(built: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    from packer.verify import shard_size_problems

    version = received(built, "webdataset", tmp_path)
    manifest = json.loads((version / "manifest.json").read_text())
    (tmp_path / "shared" / "outside.tar").write_bytes(b"x" * 10)
    manifest["splits"]["test"]["shards"][0]["file"] = "../../outside.tar"
    assert shard_size_problems(version, manifest) == [
        "'../../outside.tar' (not a plain file name inside the version folder: not opened)"]


# -- an index row without a key -----------------------------------------------------------------------------


def _null_first_key(version: Path) -> None:
    table = pq.read_table(version / "_index.parquet")
    keys = table.column("key").to_pylist()
    keys[0] = None
    table = table.set_column(table.schema.get_field_index("key"), pa.field("key", pa.string()),
                             pa.array(keys, pa.string()))
    pq.write_table(table, version / "_index.parquet")
    reseal(version)


def test_verify_names_an_index_row_with_a_null_key_and_exits_5(built: dict[str, Path], tmp_path: Path) -> None:
    version = received(built, "webdataset", tmp_path)
    _null_first_key(version)
    result = packer("verify", version)
    assert result.exit_code == 5, result.output
    assert "_index.parquet" in result.output and "row 1 has no key (null)" in result.output


def test_diff_refuses_an_index_row_with_a_null_key_naming_the_index(built: dict[str, Path], tmp_path: Path) -> None:
    version = received(built, "webdataset", tmp_path)
    _null_first_key(version)
    result = packer("diff", built["webdataset"], version)
    assert result.exit_code == 5, result.output
    assert f"{version / '_index.parquet'}: row 1 has a null key or split" in result.output


# -- verify --deep on hostile samples -----------------------------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _deep_failures(version: Path) -> list[str]:
    result = packer("verify", "--deep", version)
    assert result.exit_code == 5, result.output
    return [line.strip() for line in result.output.splitlines() if line.strip().startswith("FAIL")]


@pytest.mark.parametrize(("ext", "data", "says"), [
    ("json", b"[" * 50000 + b"]" * 50000, ".json member nests too deeply to read"),
    ("json", b'{"source": ["ct"], "split": "test"}', ".json says source ['ct'], not a source name"),
    # a header that declares 2**40 bytes over 100 real ones: numpy would allocate what it declares
    ("npy", _npy(np.zeros(8, np.uint8)).replace(b"(8,)", b"(1099511627776,)"), "more than the"),
], ids=["deep-json", "json-source-a-list", "npy-declares-a-terabyte"])
def test_verify_deep_names_a_hostile_tar_member_by_shard_and_key(built: dict[str, Path], tmp_path: Path, ext: str,
                                                                 data: bytes, says: str) -> None:
    version = received(built, "webdataset", tmp_path)
    shard, key = replace_tar_member(version, ext, data)
    assert any(line.startswith(f"FAIL {shard} [{key}]: ") and says in line for line in _deep_failures(version))


def _sparse_member(name: str, real_size: int, data_len: int = 512) -> bytes:
    """A GNU sparse member header (type 'S') declaring ``real_size`` bytes over one data block."""
    header = bytearray(512)
    header[0:len(name)] = name.encode()
    header[100:108], header[108:116], header[116:124] = b"0000644\x00", b"0000000\x00", b"0000000\x00"
    header[124:136], header[136:148] = b"%011o\x00" % data_len, b"%011o\x00" % 0
    header[156:157], header[257:265] = b"S", b"ustar  \x00"
    header[386:398], header[398:410] = b"%011o\x00" % 0, b"%011o\x00" % data_len  # one chunk at offset 0
    size = bytearray(12)
    size[0] = 0x80  # base-256
    for i, value in zip(range(11, 0, -1), (real_size >> (8 * n) for n in range(11)), strict=True):
        size[i] = value & 0xFF
    header[483:495] = size
    header[148:156] = b"        "
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header) + b"\0" * data_len


def test_verify_deep_refuses_a_sparse_tar_member_before_reading_its_terabyte(built: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    version = received(built, "webdataset", tmp_path)
    shard = first_shard(version, ".tar")
    with tarfile.open(version / shard) as tar:
        last = tar.getmembers()[-1]
    raw = (version / shard).read_bytes()
    end = last.offset_data + (last.size + 511) // 512 * 512
    edited = raw[:end] + _sparse_member("zzzz.npy", 2**40) + b"\0" * 1024
    (version / shard).write_bytes(edited + b"\0" * (-len(edited) % 10240))
    reseal(version)
    failures = _deep_failures(version)
    assert (f"FAIL {shard} [zzzz]: member 'zzzz.npy' is a sparse file declaring 1,099,511,627,776 bytes, not a "
            "regular file") in "\n".join(failures)


@pytest.mark.parametrize(("column", "value", "kind", "says"), [
    ("shape", [-3, -8, 8], None, "shape cell [-3, -8, 8] is not a list of sizes"),
    ("metadata", {"a": 1}, pa.struct([("a", pa.int64())]), "metadata cell is dict, not JSON text"),
    ("metadata", "[" * 50000 + "]" * 50000, None, "metadata nests too deeply to read"),
], ids=["negative-shape", "struct-metadata", "deep-metadata"])
def test_verify_deep_names_a_hostile_parquet_cell_by_shard_and_key(built: dict[str, Path], tmp_path: Path,
                                                                   column: str, value: object,
                                                                   kind: pa.DataType | None, says: str) -> None:
    version = received(built, "parquet", tmp_path)
    shard, key = replace_parquet_cell(version, column, value, kind)
    assert any(line.startswith(f"FAIL {shard} [{key}]: ") and says in line for line in _deep_failures(version))


# -- packer report on hostile samples and side files --------------------------------------------------------


@pytest.mark.parametrize(("ext", "data", "says"), [
    ("npy", _npy(np.zeros(8 * 8 * 3, np.uint8)), "its image is uint8 [192]"),
    ("npy", _npy(np.zeros((3, 8, 8), "<U1")), "its image is <U1 [3, 8, 8]"),
    ("json", b"[1, 2, 3]", "its JSON record is a list, not an object"),
    ("json", b"[" * 50000 + b"]" * 50000, "its JSON record nests too deeply to read"),
], ids=["npy-1d", "npy-text", "json-list", "json-deep"])
def test_report_lists_a_hostile_sample_as_unreadable_by_key_and_shard(built: dict[str, Path], tmp_path: Path,
                                                                      ext: str, data: bytes, says: str) -> None:
    version = received(built, "webdataset", tmp_path)
    shard, key = replace_tar_member(version, ext, data)
    result = packer("report", version, "-o", tmp_path / "report.html")
    assert result.exit_code == 0, result.output
    assert "1 of the 12 samples this report selected could not be read" in result.output
    assert f"{key}: {shard}: " in result.output and says in result.output
    assert html.escape(says, quote=False) in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(("file", "text", "says"), [
    ("bad_samples.jsonl", "[1]\n", "bad_samples.jsonl could not be read: bad_samples.jsonl line 1: a JSON list, "
                                   "not an object"),
    ("leakage.json", '{"rules": [1, 2]}', "leakage.json could not be read (ValueError)"),
    ("warnings.jsonl", "[" * 50000 + "]" * 50000 + "\n", "warnings.jsonl line 1: JSON nested too deeply to read"),
], ids=["bad-samples-line-a-list", "leakage-rules-a-list", "warnings-deep"])
def test_report_says_a_hostile_side_file_could_not_be_read(built: dict[str, Path], tmp_path: Path, file: str,
                                                           text: str, says: str) -> None:
    version = received(built, "webdataset", tmp_path)
    (version / file).write_text(text)
    result = packer("report", version, "-o", tmp_path / "report.html")
    assert result.exit_code == 0, result.output
    assert says in (tmp_path / "report.html").read_text()


def test_report_opens_no_shard_an_edited_index_names_outside_the_version_folder(built: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    version = received(built, "webdataset", tmp_path)
    shard = first_shard(version, ".tar")
    (tmp_path / "shared" / "other.tar").write_bytes((version / shard).read_bytes())
    outside = "../../other.tar"

    def rename(rows: list[dict]) -> None:
        for row in rows:
            row["shard"] = outside if row["shard"] == shard else row["shard"]
    edit_index(version, rename)
    reseal(version)
    result = packer("report", version, "-o", tmp_path / "report.html")
    assert result.exit_code == 0, result.output
    assert f"'{outside}': not a plain file name inside the version folder (not opened)" in result.output
