"""Reading a dataset someone else sent: shards edited, then resealed (each sample's xxh3 in
_index.parquet, each shard's sha256 and bytes in the manifest, the dataset_hash all recomputed,
so every checksum passes). Reading it must never run code, write outside the folders given, or
allocate what a header merely claims; each problem is a ShardReadError naming the shard and the
sample or member, skipped (and counted) under on_error="skip" or webdataset's handler."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset
from loader_fixtures import build_dataset

from packer.errors import IntegrityError
from packer.loader import ShardDataset, ShardReadError, wds_dataset
from packer.loader.cache import ShardCache
from packer.manifest import compute_dataset_hash
from packer.shards.checksum import members_checksum, parquet_cells_checksum

SIZES = (3, 2)


def tar_members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(out.getvalue())


def reseal(manifest: Path) -> None:
    """As a hostile sender would: every sample's xxh3 and position in _index.parquet, every
    shard's bytes and sha256, the index entry and the dataset_hash recomputed from the files."""
    root = manifest.parent
    doc = json.loads(manifest.read_text())
    sums: dict[str, int] = {}
    positions: dict[str, int] = {}
    for split in doc["splits"].values():
        for shard in split["shards"]:
            path = root / shard["file"]
            if doc["format"] == "webdataset":
                with tarfile.open(path) as tar:
                    grouped: dict[str, dict[str, bytes]] = {}
                    for m in tar.getmembers():
                        if not m.isreg() or m.sparse is not None or m.type == tarfile.GNUTYPE_SPARSE:
                            continue  # a planted irregular member: its header is what is hostile
                        key, _, ext = m.name.partition(".")
                        grouped.setdefault(key, {})[ext] = tar.extractfile(m).read()  # type: ignore[union-attr]
                        positions.setdefault(key, m.offset)
                sums.update({key: members_checksum(key, found) for key, found in grouped.items()})
            else:
                for row in pq.read_table(path).to_pylist():
                    key = row["key"].decode() if isinstance(row["key"], bytes) else row["key"]
                    sums[key] = parquet_cells_checksum(key, row)
            data = path.read_bytes()
            shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    index = root / doc["index"]["file"]
    table = pq.read_table(index)
    rows = table.to_pylist()
    for row in rows:
        row["xxh3"] = sums.get(row["key"], row["xxh3"])
        if row["key"] in positions and "position" in row:
            row["position"] = positions[row["key"]]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), index)
    data = index.read_bytes()
    doc["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    doc["dataset_hash"] = compute_dataset_hash(doc)
    manifest.write_text(json.dumps(doc, indent=2, sort_keys=True))


class _Planted:
    """Unpickling this creates ``marker``: proof that a reader ran code from a shard."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_wds_dataset_refuses_a_member_packer_never_writes_before_webdatasets_decoder_unpickles_it(tmp_path):
    """webdataset's .decode() (README's recipe) runs pickle.loads on .pyd/.pickle members; the
    per-sample xxh3 covers whatever members there are, so a resealed index passes a planted one.
    wds_dataset refuses the sample, naming shard, key and member, before any decoder sees it."""
    manifest = build_dataset(tmp_path, shard_sizes=SIZES)
    marker = tmp_path / "PWNED"
    shard = tmp_path / "train-000000.tar"
    members = tar_members(shard)
    members.insert(3, ("s00000.pyd", pickle.dumps(_Planted(marker))))  # after s00000's .npy
    write_tar(shard, members)
    reseal(manifest)
    with pytest.raises(ShardReadError, match=r"train-000000.tar: sample s00000: member s00000.pyd is not one "
                                             r"packer writes") as err:
        list(wds_dataset(manifest, "train").decode())
    assert (err.value.shard, err.value.key) == ("train-000000.tar", "s00000")
    for verify in ("sample", "off"):
        with pytest.warns(UserWarning, match="s00000.pyd"):
            kept = [s["__key__"] for s in wds_dataset(manifest, "train", verify=verify,
                                                      handler=webdataset.warn_and_continue).decode()]
        assert kept == ["s00001", "s00002", "s00003", "s00004"]
    assert not marker.exists()


def _set_metadata(shard: Path, row: int, value: str) -> None:
    table = pq.read_table(shard)
    cells = table.column("metadata").to_pylist()
    cells[row] = value
    field = table.schema.field("metadata")
    pq.write_table(table.set_column(table.schema.get_field_index("metadata"), field,
                                    pa.array(cells, type=field.type)), shard)


@pytest.mark.parametrize(("fmt", "record", "why"), [
    ("webdataset", b"[1, 2, 3]", r"s00000.json \(the sample's record\) is a JSON list, not an object"),
    ("webdataset", b'{"a":', r"s00000.json \(the sample's record\) is not valid JSON"),
    ("webdataset", b"[" * 50_000 + b"]" * 50_000, r"s00000.json \(the sample's record\) is nested too deeply"),
    ("parquet", "[1, 2, 3]", r"the metadata cell \(the sample's record\) is a JSON list, not an object"),
])
def test_a_record_that_is_not_a_json_object_is_a_sample_defect_named_and_skippable(tmp_path, fmt, record, why):
    """records=True: a .json member or metadata cell that is a list, invalid JSON or nested past
    Python's recursion limit raised a raw TypeError/JSONDecodeError/RecursionError, which
    on_error="skip" did not skip; it is now that sample's ShardReadError (undecodable)."""
    manifest = build_dataset(tmp_path, fmt=fmt, shard_sizes=SIZES)
    if fmt == "webdataset":
        shard = tmp_path / "train-000000.tar"
        write_tar(shard, [(n, record if n == "s00000.json" else d) for n, d in tar_members(shard)])
    else:
        _set_metadata(tmp_path / "train-000000.parquet", 0, record)
    reseal(manifest)
    with pytest.raises(ShardReadError, match=rf"train-000000.{'tar' if fmt == 'webdataset' else 'parquet'}: "
                                             rf"sample s00000: undecodable: {why}") as err:
        list(ShardDataset(manifest, "train", shuffle=False, records=True))
    assert err.value.key == "s00000"
    dataset = ShardDataset(manifest, "train", shuffle=False, records=True, on_error="skip")
    assert [item["record"]["key"] for item in dataset] == ["s00001", "s00002", "s00003", "s00004"]
    assert dataset.skipped == 1
    # without records the pixels and label are all a reader needs: the sample is read
    assert len(list(ShardDataset(manifest, "train", shuffle=False))) == 5


def _publish(root: Path, where: str, edit: Callable[[dict], None] | None = None) -> str:
    """The version in ``root`` copied to fsspec's memory store under ``where`` (its manifest
    first edited by ``edit`` and re-sealed); the remote manifest's URL."""
    fs = fsspec.filesystem("memory")
    for path in root.iterdir():
        data = path.read_bytes()
        if path.name == "manifest.json" and edit is not None:
            doc = json.loads(data)
            edit(doc)
            doc["dataset_hash"] = compute_dataset_hash(doc)
            data = json.dumps(doc).encode()
        fs.pipe(f"/{where}/{path.name}", data)
    return f"memory://{where}/manifest.json"


@pytest.mark.parametrize("sha256", ["/../../../../../../..{escaped}", "../{name}", "A" * 64])
def test_the_shard_cache_refuses_a_sha256_that_is_not_64_hex_digits_before_building_any_path(tmp_path, sha256):
    """The cache's paths are <sha256><suffix> and .<sha256>.lock; a re-sealed manifest was read
    without its schema, so a sha256 of "/../../x/ESCAPED" made ShardDataset(cache_dir=C) create
    x/ESCAPED.lock outside C. The loader now checks the fields it reads in every manifest, so the
    version is refused as it is opened, naming the field; and the cache refuses such a key on its
    own, before building any path, whoever calls it."""
    manifest = build_dataset(tmp_path / "version", shard_sizes=SIZES)
    outside = tmp_path / "outside"
    outside.mkdir()
    bad = sha256.format(escaped=outside / "ESCAPED", name="ESCAPED")

    def plant(doc: dict) -> None:
        doc["splits"]["train"]["shards"][0]["sha256"] = bad

    url = _publish(manifest.parent, f"hostile-{tmp_path.name}", plant)
    cache = tmp_path / "cache"
    for on_error in ("raise", "skip"):
        with pytest.raises(IntegrityError, match=r"splits/train/shards/0/sha256"):
            list(ShardDataset(url, "train", shuffle=False, cache_dir=cache, on_error=on_error))
    assert list(outside.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) in (
        ["outside", "version"], ["cache", "outside", "version"])
    assert all(path.parent == cache for path in cache.rglob("*"))
    with pytest.raises(IntegrityError, match="not 64 lowercase hex digits"):
        ShardCache(cache).entry(bad, "train-000000.tar")
    assert list(outside.iterdir()) == []


def gnu_sparse_member(name: str, realsize: int, data_len: int = 512) -> bytes:
    """A GNU sparse ('S') member header declaring ``realsize`` bytes (base-256), with one data
    chunk of ``data_len`` bytes at offset 0, and that chunk: what GNU tar writes for a file of holes."""
    h = bytearray(512)
    h[0:len(name)] = name.encode()
    h[100:108], h[108:116], h[116:124] = b"0000644\x00", b"0000000\x00", b"0000000\x00"
    h[124:136], h[136:148] = b"%011o\x00" % data_len, b"%011o\x00" % 0
    h[156:157], h[257:265] = b"S", b"ustar  \x00"
    h[386:398], h[398:410] = b"%011o\x00" % 0, b"%011o\x00" % data_len
    h[483:495] = bytes([0x80]) + realsize.to_bytes(11, "big")
    h[148:156] = b"        "
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h) + b"\0" * data_len


def _with_sparse_npy(shard: Path, key: str, realsize: int = 2 ** 40) -> None:
    """``shard`` with ``key``'s .npy member replaced by a sparse one declaring ``realsize`` bytes."""
    with tarfile.open(shard) as tar:
        npy = next(m for m in tar.getmembers() if m.name == f"{key}.npy")
    raw = shard.read_bytes()
    end = npy.offset_data + -(-npy.size // 512) * 512
    shard.write_bytes(raw[:npy.offset] + gnu_sparse_member(npy.name, realsize) + raw[end:])


def test_a_sparse_member_is_refused_by_every_tar_reader_without_allocating_its_declared_size(tmp_path):
    """Python's tar reader fills a GNU sparse member's holes with zeros up to the real size its
    header declares (here 1 TiB, in a 10 kB shard). wds_dataset, ShardDataset (a local shard, a
    remote one streamed without a cache) refuse it, naming shard and member, before reading it."""
    manifest = build_dataset(tmp_path / "version", shard_sizes=SIZES)
    root = manifest.parent
    _with_sparse_npy(root / "train-000000.tar", "s00001")
    reseal(manifest)
    sparse = r"member 's00001.npy' is a sparse file \(tar type 'S', declaring 1,099,511,627,776 bytes\)"
    with pytest.raises(ShardReadError, match=rf"train-000000.tar: {sparse}") as err:
        list(wds_dataset(manifest, "train"))
    assert err.value.shard == "train-000000.tar"
    with pytest.warns(UserWarning, match="s00001.npy"):
        kept = [s["__key__"] for s in wds_dataset(manifest, "train", handler=webdataset.warn_and_continue)]
    assert kept == ["s00003", "s00004"]  # the refused shard is left out whole, the next one read
    url = _publish(root, f"sparse-{tmp_path.name}")
    # a local shard is scanned, and read on past the refused member from the index's offsets; a
    # remote one is streamed once (no cache), so the stream ends there and s00002 is lost, named
    for source, kept in ((manifest, ["s00000", "s00002", "s00003", "s00004"]), (url, ["s00000", "s00003", "s00004"])):
        dataset = ShardDataset(source, "train", shuffle=False, on_error="skip")
        assert [item["key"] for item in dataset] == kept
        assert dataset.skipped == 5 - len(kept)
        with pytest.raises(ShardReadError, match=r"train-000000.tar: .*s00001.*" + sparse):
            list(ShardDataset(source, "train", shuffle=False))


def test_a_member_header_declaring_more_than_the_file_is_refused_before_its_buffer_is_allocated(tmp_path):
    """read_sample_at (a sample at the offset _index.parquet records) allocated the size a
    regular member's header declares before reading it (an 11-digit octal size is up to 8 GiB)."""
    from packer.shards.tar import member_header, read_sample_at, unsafe_member

    shard = tmp_path / "huge.tar"
    shard.write_bytes(member_header("s00000.npy", 7 << 30) + bytes(1024) + bytes(10240))
    with open(shard, "rb") as fh, pytest.raises(tarfile.ReadError, match=r"'s00000.npy' cut short .*7,516,192,768"):
        read_sample_at(fh, 0, "s00000")
    assert unsafe_member(shard) == ("member 's00000.npy' declares 7,516,192,768 bytes, more than the whole shard "
                                    "holds (11,776 bytes); refuse to read this shard")


def _cast_shards(root: Path, types: dict[str, pa.DataType]) -> None:
    """Every Parquet shard of ``root`` rewritten with ``types`` for those columns (the same values)."""
    for shard in sorted(root.glob("*.parquet")):
        if shard.name.startswith("_"):
            continue
        table = pq.read_table(shard)
        pq.write_table(table.cast(pa.schema([pa.field(f.name, types.get(f.name, f.type), f.nullable)
                                             for f in table.schema])), shard)


def test_parquet_shards_with_large_types_are_read_with_64_bit_offsets_never_another_rows_pixels(tmp_path):
    """polars and other Arrow writers store binary and strings as large_binary/large_string
    (64-bit offsets). The reader took the image column's offsets as int32: with verify="off"
    one sample was delivered with another sample's pixels. Every sample now has its own."""
    from loader_fixtures import sample_image

    manifest = build_dataset(tmp_path, fmt="parquet", shard_sizes=SIZES)
    _cast_shards(tmp_path, {"image": pa.large_binary(), "key": pa.large_string(), "dtype": pa.large_string(),
                            "metadata": pa.large_string(), "shape": pa.large_list(pa.int32())})
    reseal(manifest)
    assert pq.read_schema(tmp_path / "train-000000.parquet").field("image").type == pa.large_binary()
    for verify in ("off", "sample", "shard"):
        items = list(ShardDataset(manifest, "train", shuffle=False, verify=verify, records=True))
        assert [item["key"] for item in items] == [f"s{i:05d}" for i in range(5)]
        for i, item in enumerate(items):
            assert item["image"].numpy().tobytes() == sample_image(i).tobytes(), (verify, item["key"])
            assert item["record"]["key"] == item["key"]


@pytest.mark.parametrize(("column", "kind", "shown"), [
    ("image", pa.dictionary(pa.int32(), pa.binary()), "dictionary<values=binary, indices=int32"),
    ("key", pa.binary(), "binary, not string"),
    ("shape", pa.list_(pa.float64()), "list<element: double>, not a list of integers"),
])
def test_a_parquet_column_of_a_type_the_reader_does_not_take_is_a_bad_shard_naming_it(tmp_path, column, kind, shown):
    """The reader takes a column's buffers as laid out for the type packer writes; a column of
    another type fails the shard's rows as bad_shard, naming the column and its type."""
    manifest = build_dataset(tmp_path, fmt="parquet", shard_sizes=SIZES)
    _cast_shards(tmp_path, {column: kind})
    reseal(manifest)
    with pytest.raises(ShardReadError, match=rf"train-000000.parquet: bad_shard: column {column!r} is "
                                             rf"{re.escape(shown)}"):
        list(ShardDataset(manifest, "train", shuffle=False, verify="off"))
    dataset = ShardDataset(manifest, "train", shuffle=False, verify="off", on_error="skip")
    assert list(dataset) == [] and dataset.skipped == 5
