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
                    sums[row["key"]] = parquet_cells_checksum(row["key"], row)
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
    """The cache's paths are <sha256><suffix> and .<sha256>.lock; a re-sealed manifest is read
    without its schema, so a sha256 of "/../../x/ESCAPED" made ShardDataset(cache_dir=C) create
    x/ESCAPED.lock outside C. Now that shard is a bad_shard naming it, and nothing is written
    outside the cache folder."""
    manifest = build_dataset(tmp_path / "version", shard_sizes=SIZES)
    outside = tmp_path / "outside"
    outside.mkdir()
    bad = sha256.format(escaped=outside / "ESCAPED", name="ESCAPED")

    def plant(doc: dict) -> None:
        doc["splits"]["train"]["shards"][0]["sha256"] = bad

    url = _publish(manifest.parent, f"hostile-{tmp_path.name}", plant)
    cache = tmp_path / "cache"
    with pytest.raises(ShardReadError, match=r"train-000000.tar: bad_shard: refused by the shard cache .*: manifest "
                                             r"shard 'train-000000.tar': sha256 .* is not 64 lowercase hex digits"):
        list(ShardDataset(url, "train", shuffle=False, cache_dir=cache))
    dataset = ShardDataset(url, "train", shuffle=False, cache_dir=cache, on_error="skip")
    assert [item["key"] for item in dataset] == ["s00003", "s00004"]  # the other shard, through the cache
    assert dataset.skipped == 3
    assert list(outside.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cache", "outside",
                                                                                             "version"]
    assert all(path.parent == cache for path in cache.rglob("*"))
    with pytest.raises(IntegrityError, match="not 64 lowercase hex digits"):
        ShardCache(cache).entry(bad, "train-000000.tar")
