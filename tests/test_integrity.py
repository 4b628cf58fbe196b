"""Every sample is checked on every read, by default (``ShardDataset(verify="sample")``).

A byte flipped on disk after the build, in a sample's pixels, its mask or its label, is caught
by the default loader for tar shards read through a memory map, with positional reads and
streamed from a store, and for Parquet shards: an error naming the shard, the key, and the
expected and found checksums, or, under ``on_error="skip"``, a skipped and counted sample. The
checksums the tests expect are computed here from the definition (xxh3-64 over framed fields,
:mod:`packer.shards.checksum`) with the stock ``xxhash``, ``tarfile`` and ``pyarrow``, not by the
code under test.
"""

from __future__ import annotations

import json
import logging
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_fixtures import make_sample, sample_image, write_manifest

from packer.errors import ConfigError, IntegrityError
from packer.loader import ShardDataset, ShardReadError, make_loader
from packer.manifest import seal_manifest
from packer.pipeline.publish import IndexColumns, write_index
from packer.shards.encode import EncodedSample
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import npy_bytes, write_tar_shard
from packer.verify import verify_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SIZES = (3, 4)
DAMAGED = "s00004"  # label 1, in the second shard
SHARD = {"webdataset": "train-000001.tar", "parquet": "train-000001.parquet"}


def sample_mask(index: int) -> np.ndarray:
    """A 1×4×4 uint8 mask whose bytes no other sample's mask repeats."""
    mask = ((np.arange(16) * 7 + 11 * index) % 200).astype(np.uint8)
    mask[0], mask[1] = index, 250
    return mask.reshape(1, 4, 4)


def masked_sample(index: int) -> EncodedSample:
    sample = make_sample(index)
    return EncodedSample(**{**sample.__dict__, "mask": npy_bytes(sample_mask(index))})


def build(root: Path, fmt: str) -> Path:
    """A dataset with masks, packed and indexed as a build does; the manifest path."""
    root.mkdir(parents=True)
    writer, ext = (write_tar_shard, "tar") if fmt == "webdataset" else (write_parquet_shard, "parquet")
    index, shards, first = IndexColumns(), [], 0
    for k, size in enumerate(SIZES):
        samples = [masked_sample(i) for i in range(first, first + size)]
        first += size
        written = writer(root / f"train-{k:06d}.{ext}", samples)
        shards.append({"file": written.file, "bytes": written.bytes, "sha256": written.sha256, "samples": size})
        index.add_shard(written, split="train", keys=[s.key for s in samples], labels=[s.label for s in samples],
                        entity_ids=[s.entity_id for s in samples], sources=[s.source for s in samples])
    path = write_manifest(root, fmt=fmt, shards=shards, index=write_index(root, index))
    body = json.loads(path.read_text())
    body["mask"] = {"dtype": "uint8", "classes": None, "layout": "FHW", "pad": 0}
    path.write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))
    return path


def framed(key: str, fields: list[tuple[str, bytes]]) -> int:
    """The checksum by its definition: xxh3-64 of name NUL length(8, LE) payload, key first."""
    data = b"".join(name.encode() + b"\0" + len(payload).to_bytes(8, "little") + payload
                    for name, payload in [("key", key.encode()), *fields])
    return xxhash.xxh3_64_intdigest(data)


def tar_members(shard: Path, key: str) -> list[tuple[str, bytes]]:
    """(extension, data) of ``key``'s members as stock tarfile reads them, in shard order."""
    with tarfile.open(shard) as tar:
        return [(m.name.split(".", 1)[1], tar.extractfile(m).read()) for m in tar if m.name.startswith(key + ".")]


def recorded(manifest: Path, key: str) -> int:
    table = pq.read_table(manifest.parent / "_index.parquet").to_pylist()
    return next(row["xxh3"] for row in table if row["key"] == key)


def flip_tar(shard: Path, member: str, at: int) -> None:
    """Flip the low bit of byte ``at`` of ``member``'s data (``at`` < 0: counted from its end)."""
    with tarfile.open(shard) as tar:
        info = tar.getmember(member)
    data = bytearray(shard.read_bytes())
    data[info.offset_data + (at % info.size)] ^= 0x01
    shard.write_bytes(bytes(data))


def flip_found(shard: Path, needle: bytes, at: int) -> None:
    data = bytearray(shard.read_bytes())
    where = data.find(needle)
    assert where >= 0 and data.find(needle, where + 1) < 0
    data[where + at] ^= 0x01
    shard.write_bytes(bytes(data))


def flip_parquet_label(shard: Path) -> None:
    """Flip one byte of the ``label`` column chunk such that the file still reads and only
    DAMAGED's label changes (a flip that breaks decompression fails the batch another way)."""
    original = bytes(shard.read_bytes())
    chunk = pq.ParquetFile(shard).metadata.row_group(0).column(pq.ParquetFile(shard).schema_arrow.names.index("label"))
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
    before = pq.read_table(shard).to_pylist()
    for at in range(start, start + chunk.total_compressed_size):
        for bit in (0x01, 0x02, 0x04):
            data = bytearray(original)
            data[at] ^= bit
            shard.write_bytes(bytes(data))
            try:
                after = pq.read_table(shard).to_pylist()
            except (pa.ArrowException, OSError):
                continue
            changed = [a["key"] for a, b in zip(after, before, strict=True) if a != b]
            if changed == [DAMAGED] and after[1]["label"] != before[1]["label"]:
                return
    raise AssertionError("no byte of the label column flips DAMAGED's label alone")


def damage(manifest: Path, fmt: str, what: str) -> None:
    """Flip one byte of DAMAGED's ``what`` (pixels, mask, label) in its shard on disk."""
    shard = manifest.parent / SHARD[fmt]
    index = int(DAMAGED[1:])
    if fmt == "webdataset":
        member, at = {"pixels": (f"{DAMAGED}.npy", -3), "mask": (f"{DAMAGED}.mask.npy", -5),
                      "label": (f"{DAMAGED}.cls", 0)}[what]
        flip_tar(shard, member, at)
    elif what == "pixels":
        flip_found(shard, make_sample(index).pixels, 9)
    elif what == "mask":
        flip_found(shard, sample_mask(index).tobytes(), 6)
    else:
        flip_parquet_label(shard)


def streamed(manifest: Path, name: str) -> str:
    """The version folder copied to an fsspec memory store (read front to back, never mapped)."""
    memory = fsspec.filesystem("memory")
    for path in manifest.parent.iterdir():
        if path.is_file():
            memory.pipe(f"/{name}/v/{path.name}", path.read_bytes())
    return f"memory://{name}/v/manifest.json"


READS = [("webdataset", "mapped"), ("webdataset", "positional"), ("webdataset", "streamed"), ("parquet", "mapped"),
         ("parquet", "streamed")]


@pytest.mark.parametrize("what", ["pixels", "mask", "label"])
@pytest.mark.parametrize("fmt,read", READS)
def test_a_flipped_byte_is_caught_by_default_named_and_skippable(tmp_path, monkeypatch, fmt, read, what):
    manifest = build(tmp_path / "v", fmt)
    expected = recorded(manifest, DAMAGED)
    damage(manifest, fmt, what)
    if read == "positional":
        monkeypatch.setenv("PACKER_TAR_MMAP", "0")
    where = streamed(manifest, f"{fmt}-{what}") if read == "streamed" else manifest
    try:
        with pytest.raises(ShardReadError) as err:
            list(ShardDataset(where, "train", shuffle=False))
        assert err.value.shard == SHARD[fmt] and err.value.key == DAMAGED
        message = str(err.value)
        assert "checksum_mismatch" in message and f"expected xxh3 {expected:016x}" in message
        assert "restore" in message and "packer verify" in message
        if fmt == "webdataset":  # the found checksum, from the damaged bytes by the definition
            found = framed(DAMAGED, tar_members(manifest.parent / SHARD[fmt], DAMAGED))
            assert found != expected and f"found {found:016x}" in message
        skipping = ShardDataset(where, "train", shuffle=False, on_error="skip")
        keys = [item["key"] for item in skipping]
        assert keys == [f"s{i:05d}" for i in range(sum(SIZES)) if i != 4]
        assert skipping.skipped == 1 and "checksum_mismatch" in skipping.skipped_samples[0]
        # what the default stops: verify="off" hands the damaged sample to training without a word
        unchecked = {item["key"]: item for item in ShardDataset(where, "train", shuffle=False, verify="off")}
        assert DAMAGED in unchecked
    finally:
        if read == "streamed":
            fsspec.filesystem("memory").rm(f"/{fmt}-{what}", recursive=True)
    if what == "label":
        assert int(unchecked[DAMAGED]["label"]) != 1, "the flipped label reads as another valid class"


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_workers_check_too_and_an_intact_dataset_reads_whole(tmp_path, fmt):
    manifest = build(tmp_path / "v", fmt)
    keys = [k for batch in make_loader(ShardDataset(manifest, "train"), 2, 2) for k in batch["key"]]
    assert sorted(keys) == [f"s{i:05d}" for i in range(sum(SIZES))]
    damage(manifest, fmt, "pixels")
    with pytest.raises(ShardReadError, match=f"sample {DAMAGED}: checksum_mismatch"):
        list(make_loader(ShardDataset(manifest, "train"), 2, 2))


@pytest.mark.parametrize("what,workers", [("pixels", 0), ("mask", 0), ("label", 0), ("pixels", 2)])
@pytest.mark.parametrize("fmt,read", [("webdataset", "mapped"), ("webdataset", "positional"), ("parquet", "mapped")])
def test_where_the_batch_is_stacked_the_copy_is_checked_before_it_is_delivered(tmp_path, monkeypatch, fmt, read,
                                                                              what, workers):
    """make_loader's stacking collate, in the main process and in workers: a flipped byte raises
    the same error, and under on_error="skip" the batch comes without the sample, its rows the
    intact images (what any change to where the check runs, such as hashing the batch's copy
    of each image, must keep)."""
    manifest = build(tmp_path / "v", fmt)
    expected = recorded(manifest, DAMAGED)
    damage(manifest, fmt, what)
    if read == "positional":
        monkeypatch.setenv("PACKER_TAR_MMAP", "0")
    with pytest.raises(ShardReadError) as err:
        list(make_loader(ShardDataset(manifest, "train", shuffle=False), 4, workers))
    message = str(err.value)
    assert f"{SHARD[fmt]}: sample {DAMAGED}: checksum_mismatch" in message
    assert f"expected xxh3 {expected:016x}" in message
    if fmt == "webdataset":
        assert f"found {framed(DAMAGED, tar_members(manifest.parent / SHARD[fmt], DAMAGED)):016x}" in message
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False, on_error="skip"), 4, workers)
    batches = list(loader)
    keys = [key for batch in batches for key in batch["key"]]
    assert keys == [f"s{i:05d}" for i in range(sum(SIZES)) if i != 4]
    assert [len(batch["key"]) for batch in batches] == [4, 2]  # the damaged sample's batch, rebuilt without it
    assert loader.skipped == 1 and "checksum_mismatch" in loader.skipped_samples[0]
    for batch in batches:
        for key, image in zip(batch["key"], batch["image"], strict=True):
            assert np.array_equal(image.numpy(), sample_image(int(key[1:])))


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_sample_in_a_stacked_batch_that_fails_its_check_is_replaced_as_uneven_pad_promises(tmp_path, fmt):
    """uneven="pad" keeps every batch full: the damaged sample's place (the first of its batch)
    is taken by a repeat of the next sample read (one a loader resumed at that batch reads too),
    and every image is still the intact one."""
    manifest = build(tmp_path / "v", fmt)
    damage(manifest, fmt, "pixels")
    loader = make_loader(ShardDataset(manifest, "train", shuffle=False, on_error="skip", uneven="pad"), 4)
    batches = list(loader)
    assert [batch["key"] for batch in batches] == [["s00000", "s00001", "s00002", "s00003"],
                                                   ["s00005", "s00005", "s00006"]]
    assert loader.skipped == 1 and "replaced by a repeat of s00005" in loader.skipped_samples[0]
    for batch in batches:
        assert batch["image"].shape == (len(batch["key"]), *sample_image(0).shape)
        for key, image in zip(batch["key"], batch["image"], strict=True):
            assert np.array_equal(image.numpy(), sample_image(int(key[1:])))


def test_the_recorded_checksum_is_xxh3_over_every_member_in_shard_order(tmp_path):
    """The definition, checked against the index for every sample of an intact tar dataset: the
    key, then each member (.cls, .json, .npy, .mask.npy) framed as name NUL length payload."""
    manifest = build(tmp_path / "v", "webdataset")
    rows = pq.read_table(manifest.parent / "_index.parquet").to_pylist()
    assert len(rows) == sum(SIZES)
    for row in rows:
        members = tar_members(manifest.parent / row["shard"], row["key"])
        assert [ext for ext, _ in members] == ["cls", "json", "npy", "mask.npy"]
        assert row["xxh3"] == framed(row["key"], members)
    assert pq.read_schema(manifest.parent / "_index.parquet").field("xxh3").type == pa.uint64()


def test_parquet_checksum_covers_the_decoded_cells_in_order(tmp_path):
    manifest = build(tmp_path / "v", "parquet")
    rows = pq.read_table(manifest.parent / "train-000000.parquet").to_pylist()
    for row in rows:
        fields = [("label", row["label"].to_bytes(8, "little", signed=True)),
                  ("shape", np.asarray(row["shape"], "<i4").tobytes()), ("dtype", row["dtype"].encode()),
                  ("image", row["image"]), ("metadata", row["metadata"].encode()), ("mask", row["mask"]),
                  ("mask_shape", np.asarray(row["mask_shape"], "<i4").tobytes()),
                  ("mask_dtype", row["mask_dtype"].encode())]
        assert recorded(manifest, row["key"]) == framed(row["key"], fields)


def test_verify_modes_and_the_old_booleans(tmp_path):
    manifest = build(tmp_path / "v", "webdataset")
    assert ShardDataset(manifest, "train").verify == "sample"
    assert ShardDataset(manifest, "train", verify=True).verify == "shard"
    assert ShardDataset(manifest, "train", verify=False).verify == "off"
    with pytest.raises(ConfigError, match="verify='full'.*'off', 'sample', 'shard'"):
        ShardDataset(manifest, "train", verify="full")
    damage(manifest, "webdataset", "mask")
    with pytest.raises(ShardReadError, match="sha256 .* does not match"):  # "shard": today's whole-shard sha256
        list(ShardDataset(manifest, "train", shuffle=False, verify="shard"))


def test_a_missing_index_is_refused_and_an_old_one_is_read_unchecked_with_a_warning(tmp_path, caplog):
    manifest = build(tmp_path / "v", "webdataset")
    index = manifest.parent / "_index.parquet"
    table = pq.read_table(index)
    index.unlink()
    with pytest.raises(IntegrityError, match=r"_index.parquet: the sample index is missing.*verify='off'.*"
                                             r"packer bench-loader --verify off"):
        ShardDataset(manifest, "train")
    assert len(list(ShardDataset(manifest, "train", verify="off"))) == sum(SIZES)
    # a dataset built before per-sample checksums: its index has no xxh3 column
    entry = write_index(manifest.parent, _Table(table.drop_columns(["xxh3"])))
    body = json.loads(manifest.read_text())
    body["index"] = entry
    manifest.write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))
    with caplog.at_level(logging.WARNING, logger="packer.loader"):
        assert len(list(ShardDataset(manifest, "train"))) == sum(SIZES)
    assert "not checked one by one" in caplog.text and "no xxh3 column" in caplog.text


class _Table:
    """An IndexColumns stand-in holding a ready table (an index as an older packer wrote it)."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def table(self) -> pa.Table:
        return self._table


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_packer_verify_names_the_damaged_sample_not_only_the_shard(tmp_path, fmt):
    manifest = build(tmp_path / "v", fmt)
    damage(manifest, fmt, "pixels")
    report = verify_dataset(manifest)
    assert not report.ok
    named = [p for p in report.problems if p.key is not None]
    assert [(p.shard, p.key) for p in named] == [(SHARD[fmt], DAMAGED)]
    assert "xxh3" in named[0].message and f"{recorded(manifest, DAMAGED):016x}" in named[0].message


def full_sample(index: int) -> EncodedSample:
    """A sample with every member a writer emits: label, record, pixels, mask, target and target mask."""
    sample = masked_sample(index)
    return EncodedSample(**{**sample.__dict__, "target": np.array([index % 2, 1, 0], np.uint8),
                            "target_mask": np.array([1, index % 2, 1], np.uint8)})


@pytest.mark.parametrize("mmap_switch", ["1", "0"])
def test_every_reader_agrees_with_the_writer_on_every_members_checksum(tmp_path, monkeypatch, mmap_switch):
    """What the writers record is what each reader path computes, for every member and cell kind
    (the writers and readers hash from different pieces: a drift between them fails here)."""
    from packer.shards.parquet import read_parquet_samples
    from packer.shards.tar import map_shard, read_tar_sample, scan_tar, stream_tar_samples

    monkeypatch.setenv("PACKER_TAR_MMAP", mmap_switch)
    samples = [full_sample(i) for i in range(4)]
    written = write_tar_shard(tmp_path / "train-000000.tar", samples)
    with open(tmp_path / "train-000000.tar", "rb", buffering=0) as fh:
        mapped = map_shard(fh)
        assert (mapped is None) == (mmap_switch == "0")
        found = [read_tar_sample(fh, s, mapped, checksum=True).checksum for s in scan_tar(fh.name).samples]
    with open(tmp_path / "train-000000.tar", "rb") as fh:
        streamed = [framed(key, list(members.items())) for _, key, members in stream_tar_samples(fh, 10)]
    assert found == streamed == list(written.checksums)
    written = write_parquet_shard(tmp_path / "train-000000.parquet", samples)
    rows = [result.checksum for _, result in read_parquet_samples(tmp_path / "train-000000.parquet", range(4),
                                                                  batch_rows=3, checksums=True)]
    assert rows == list(written.checksums) and len(set(rows)) == 4


def _rewrite_index(manifest: Path, table: pa.Table) -> None:
    """Replace the version's _index.parquet by ``table`` and record its new size and sha256 in
    the (resealed) manifest, as a build would have: the index is then intact but says ``table``."""
    import hashlib

    index = manifest.parent / "_index.parquet"
    pq.write_table(table, index)
    body = json.loads(manifest.read_text())
    data = index.read_bytes()
    body["index"] = {**body["index"], "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                     "rows": table.num_rows}
    manifest.write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))


def test_checksums_are_found_by_shard_and_position_whatever_the_index_rows_order(tmp_path):
    manifest = build(tmp_path / "v", "webdataset")
    table = pq.read_table(manifest.parent / "_index.parquet")
    _rewrite_index(manifest, table.take(pa.array(np.arange(table.num_rows)[::-1])))
    assert [item["key"] for item in ShardDataset(manifest, "train", shuffle=False)] == [
        f"s{i:05d}" for i in range(sum(SIZES))]
    damage(manifest, "webdataset", "pixels")
    with pytest.raises(ShardReadError, match=f"sample {DAMAGED}: checksum_mismatch"):
        list(ShardDataset(manifest, "train", shuffle=False))


def test_an_index_that_misses_a_shards_sample_is_refused_before_any_read(tmp_path):
    manifest = build(tmp_path / "v", "webdataset")
    table = pq.read_table(manifest.parent / "_index.parquet")
    _rewrite_index(manifest, table.slice(1))
    with pytest.raises(IntegrityError, match=f"lists {SIZES[0] - 1} samples of shard train-000000.tar, the "
                                             f"manifest says {SIZES[0]}"):
        ShardDataset(manifest, "train")


def test_making_a_checked_dataset_does_not_import_pandas_arrow_compute_or_jsonschema(tmp_path):
    """Reading the checksums must not go through pyarrow's to_numpy, which imports pandas on first
    use (0.3-0.4 s of every fresh process, the whole start-up cost the peer harness measured), nor
    through Arrow's take, which imports pyarrow.compute (0.1 s: it builds every compute function's
    wrapper and docstring); and a sealed manifest is not checked against the schema again, whose
    validator's import is 0.1 s more."""
    import subprocess
    import sys

    manifest = build(tmp_path / "v", "webdataset")
    code = ("import sys; from packer.loader import ShardDataset; "
            f"d = ShardDataset({str(manifest)!r}, 'train'); "
            "print(len(list(d)), *(m in sys.modules for m in ('pandas', 'pyarrow.compute', 'jsonschema')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(sum(SIZES)), "False", "False", "False"]


def test_a_sealed_manifest_the_loader_cannot_read_is_told_by_the_schema(tmp_path):
    """The loader skips the schema for a manifest whose content still hashes to its
    dataset_hash; one sealed by a packer of another schema (a field this one needs is absent)
    still gets the schema's message naming the field, never a KeyError."""
    from packer.manifest import compute_dataset_hash

    manifest = build(tmp_path / "v", "webdataset")
    doc = json.loads(manifest.read_text())
    del doc["sample_schema"]
    doc["dataset_hash"] = compute_dataset_hash(doc)  # sealed as it stands
    manifest.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match="manifest field \\(top level\\): 'sample_schema' is a required property"):
        ShardDataset(manifest, "train")


def reseal_by_hand(manifest: Path, change) -> None:
    """Apply ``change`` to the manifest and seal it with the README's recipe, written out here: sha256 of
    the canonical JSON of every field but created_at, version and dataset_hash."""
    import hashlib

    doc = json.loads(manifest.read_text())
    change(doc)
    content = {k: v for k, v in doc.items() if k not in ("created_at", "version", "dataset_hash")}
    doc["dataset_hash"] = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=False).encode()).hexdigest()
    manifest.write_text(json.dumps(doc))


@pytest.mark.parametrize(("change", "field"), [
    (lambda doc: doc["index"].pop("sha256"), "index"),
    (lambda doc: doc["index"].pop("file"), "index"),
    (lambda doc: doc["index"].update(rows="8"), "index/rows"),
    (lambda doc: doc.pop("format_version"), r"\(top level\): 'format_version'"),
    (lambda doc: doc.update(format_version="1"), "format_version"),
    (lambda doc: doc["splits"]["train"]["shards"][1].update(bytes="12"), "splits/train/shards/1/bytes"),
    (lambda doc: doc["splits"]["train"]["shards"][0].pop("sha256"), "splits/train/shards/0"),
], ids=["no index sha256", "no index file", "index rows as text", "no format_version", "format_version as text",
        "shard bytes as text", "no shard sha256"])
def test_a_hand_edited_manifest_resealed_with_the_readme_recipe_is_refused_naming_the_field(tmp_path, change, field):
    """The loader skips the schema for a sealed manifest, but the fields it reads are still checked:
    a manifest edited by hand and re-sealed is refused as inspect refuses it, an IntegrityError naming
    the manifest and the field, never a KeyError deep in a read nor a silent read."""
    manifest = build(tmp_path / "v", "webdataset")
    reseal_by_hand(manifest, change)
    with pytest.raises(IntegrityError, match=f"{manifest}: manifest field {field}"):
        list(ShardDataset(manifest, "train", sources=["ct"]))  # a view: it reads the index


def test_a_sealed_manifest_with_a_field_this_packer_does_not_know_still_loads(tmp_path):
    """What a newer packer adds (an optional field, format_version still 1) is no field the loader reads."""
    manifest = build(tmp_path / "v", "webdataset")
    reseal_by_hand(manifest, lambda doc: [s.update(compression="none") for s in doc["splits"]["train"]["shards"]])
    assert len(list(ShardDataset(manifest, "train"))) == sum(SIZES)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.lists(st.sampled_from([0, 1, 7, 4095, 4096, 70_000]), min_size=1, max_size=3), max_size=5),
       seed=st.integers(0, 2**32 - 1))
def test_joining_small_pieces_hashes_what_feeding_them_one_by_one_hashes(sizes, seed):
    """fields_checksum joins the framing and the small pieces into few updates: the value must be
    the field-by-field SampleHasher's, for bytes, memoryviews and numpy arrays, empty pieces too."""
    from packer.shards.checksum import SampleHasher, fields_checksum

    rng = np.random.default_rng(seed)
    kinds = [bytes, memoryview, np.asarray]
    fields = [(f"m{i}", tuple(kinds[(i + j) % 3](rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
                                                 if kinds[(i + j) % 3] is not np.asarray
                                                 else rng.integers(0, 256, size=n, dtype=np.uint8))
                              for j, n in enumerate(pieces)))
              for i, pieces in enumerate(sizes)]
    hasher = SampleHasher("kéy-1")
    for name, pieces in fields:
        hasher.add(name, *pieces)
    assert fields_checksum("kéy-1", fields) == hasher.value()
