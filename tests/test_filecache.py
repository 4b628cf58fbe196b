"""Per-file reuse: a new version decodes only the files that are new or whose bytes changed.

The build cache's entries hold content-defined chunks of about 32 files; a chunk whose key
misses (one of its files is new, changed, removed or re-labelled) copies each unchanged file's
samples and records out of the earlier entry that holds them (:mod:`packer.pipeline.filecache`)
and decodes the rest. Whatever was reused, the version's bytes (its ``dataset_hash``) equal a
build of the same inputs with an empty cache.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import make_sample_id
from packer.pipeline.filecache import INDEX_NAME
from packer.pipeline.nearcopy import SIGNATURE_DTYPE
from packer.pipeline.pixels import chunk_bounds
from packer.pipeline.spill import SpillWriter, checked_chain, load_cached_chunk, records_path, referenced_entries
from packer.records import SpilledSample
from packer.shards.tar import scan_tar
from tests.helpers import write_job

FILES = 200


def photo(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8)


class PhotoTree:
    """A raw tree of ``FILES`` PNG photos and one empty file (a bad sample), with a label table
    ``path,label,entity,timestamp,site`` (``site``: a cell that reaches only the records)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: dict[str, dict[str, str]] = {}
        root.mkdir(parents=True)
        for i in range(FILES):
            self.add(f"p{i:04d}.png", seed=i, label="ab"[i % 2], entity=f"E{i // 2:04d}")
        (root / "broken.png").write_bytes(b"")
        self.rows["broken.png"] = {"label": "a", "entity": "E9999", "site": "s0"}
        self.write_table()

    def add(self, name: str, *, seed: int, label: str, entity: str) -> None:
        cv2.imwrite(str(self.root / name), photo(seed))
        self.rows[name] = {"label": label, "entity": entity, "site": f"s{seed % 3}"}

    def write_table(self) -> None:
        with open(self.root / "labels.csv", "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(["path", "label", "entity", "timestamp", "site"])
            for name, row in sorted(self.rows.items()):
                out.writerow([name, row["label"], row["entity"], "2024-01-01", row["site"]])


@pytest.fixture
def tree(tmp_path: Path) -> PhotoTree:
    return PhotoTree(tmp_path / "raw")


def build_tree(tree: PhotoTree, tmp_path: Path, out: str, cache: str, keep_spill: bool = False,
               fmt: str = "webdataset", quiet: bool = True) -> BuildResult:
    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(tree.root),
                                          "table": str(tree.root / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 3},
           "transform": {"image": {"size": [16, 16]}}, "pack": {"format": fmt, "max_samples": 16},
           "output": str(tmp_path / out), "validate": {"max_bad_fraction": 0.05}}
    job = load_job(write_job(tmp_path / "jobs", doc))
    return build(job, BuildOptions(scheduler="sync", quiet=quiet, html_report=False, cache_dir=tmp_path / cache,
                                   keep_spill=keep_spill))


def same_as_fresh(tree: PhotoTree, tmp_path: Path, result: BuildResult, name: str, fmt: str = "webdataset") -> None:
    fresh = build_tree(tree, tmp_path, f"fresh-{name}", f"cache-{name}", fmt=fmt)
    assert fresh.files_cached == 0
    assert result.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


@pytest.mark.slow  # ten builds of a 200-file tree
def test_a_new_version_decodes_only_new_and_changed_files_and_equals_a_fresh_build(
        tree: PhotoTree, tmp_path: Path) -> None:
    first = build_tree(tree, tmp_path, "out", "cache")
    assert first.files_decoded == FILES + 1 and first.files_cached == 0
    assert any(i.sample_id and i.path.endswith("broken.png") for i in first.issues)

    # one new file (a new entity): that file is decoded, not its chunk
    tree.add("p0100x.png", seed=1000, label="b", entity="E5000")
    tree.write_table()
    added = build_tree(tree, tmp_path, "out", "cache")
    assert (added.files_decoded, added.files_cached) == (1, FILES + 1)
    same_as_fresh(tree, tmp_path, added, "added")

    # one file removed: nothing is decoded
    (tree.root / "p0057.png").unlink()
    del tree.rows["p0057.png"]
    tree.write_table()
    removed = build_tree(tree, tmp_path, "out", "cache")
    assert (removed.files_decoded, removed.files_cached) == (0, FILES + 1)
    same_as_fresh(tree, tmp_path, removed, "removed")

    # one file re-labelled and one record cell changed: nothing is decoded, the new target is packed
    tree.rows["p0120.png"].update(label="b" if tree.rows["p0120.png"]["label"] == "a" else "a")
    tree.rows["p0150.png"].update(site="elsewhere")
    tree.write_table()
    relabelled = build_tree(tree, tmp_path, "out", "cache")
    assert (relabelled.files_decoded, relabelled.files_cached) == (0, FILES + 1)
    same_as_fresh(tree, tmp_path, relabelled, "relabelled")
    assert relabelled.manifest["dataset_hash"] != removed.manifest["dataset_hash"]

    # one file's pixels changed: that file alone is decoded
    path = tree.root / "p0033.png"
    cv2.imwrite(str(path), photo(4242))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    changed = build_tree(tree, tmp_path, "out", "cache")
    assert (changed.files_decoded, changed.files_cached) == (1, FILES)
    same_as_fresh(tree, tmp_path, changed, "changed")

    # the bad file's row changes: it stays a bad sample, copied, not read again
    tree.rows["broken.png"].update(label="b")
    tree.write_table()
    bad = build_tree(tree, tmp_path, "out", "cache")
    assert (bad.files_decoded, bad.files_cached) == (0, FILES + 1)
    assert [i.reason for i in bad.issues if i.path.endswith("broken.png")] == \
        [i.reason for i in first.issues if i.path.endswith("broken.png")]
    same_as_fresh(tree, tmp_path, bad, "bad")


def cache_folder(tmp_path: Path, cache: str) -> Path:
    (folder,) = (tmp_path / cache).iterdir()
    return folder


def test_the_index_lists_only_kept_entries_and_damaged_bytes_are_decoded_again(
        tree: PhotoTree, tmp_path: Path) -> None:
    first = build_tree(tree, tmp_path, "out", "cache")
    cache = cache_folder(tmp_path, "cache")
    index = np.load(cache / INDEX_NAME)
    entries = {p.name.split(".")[0] for p in cache.glob("*.json") if not p.name.endswith(".packed.json")}
    # each file's unit key and its move key (a file found again under another name)
    assert len(index) == 2 * (FILES + 1) and {bytes(c).decode() for c in index["chunk"]} == entries

    # damage the shard holding one sample: its chunk's entry no longer checks out, so when a new
    # file makes that chunk miss, its files are decoded again rather than copied
    tree.add("p0000a.png", seed=999, label="a", entity="E7000")  # sorts right after p0000.png
    tree.write_table()
    owner = next(k for k in entries if "p0000.png" in records_path(cache, k).read_text())
    pointer = (cache / f"{owner}.packed.json").read_text()
    assert first.version_dir.name in pointer
    # zero the owner's first shard wholly: every sample it holds fails its sha256
    shards = sorted({part for part in pointer.split('"') if part.endswith(".tar")})
    target = first.version_dir / shards[0]
    target.write_bytes(b"\0" * target.stat().st_size)
    second = build_tree(tree, tmp_path, "out", "cache")
    assert second.files_decoded > 1  # the damaged entry's files were decoded, never copied
    same_as_fresh(tree, tmp_path, second, "damaged")
    assert len(np.load(cache / INDEX_NAME)) == 2 * (FILES + 2)


def test_an_entry_whose_records_or_signatures_were_damaged_is_decoded_again_and_said_so(
        tree: PhotoTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The samples' bytes are checked against the digests in an entry's records, and the records
    and the near-copy signatures against the sha256s written with them: one character of a
    sample's record changed (its shape, its entity) or a signature row zeroed (a block of zeros:
    the .npy header and length intact) makes the entry's files decoded again, as the build says,
    and the version is the one a build with an empty cache makes. An entry written before
    records were checked (no digest) simply misses."""
    build_tree(tree, tmp_path, "out", "cache")
    cache = cache_folder(tmp_path, "cache")
    entries = sorted(p for p in cache.glob("*.json") if not p.name.endswith(".packed.json"))
    assert len(entries) >= 4
    shape, entity, signed, old = entries[:4]
    text = shape.read_text()
    assert '"shape":[3,16,16]' in text
    shape.write_text(text.replace('"shape":[3,16,16]', '"shape":[3,16,17]', 1))
    text = entity.read_text()
    first_entity = json.loads(text)["samples"][0]["ref"]["entity"]
    entity.write_text(text.replace(f'"entity":"{first_entity}"', f'"entity":"{first_entity}x"', 1))
    signatures = cache / signed.name.replace(".json", ".sig.npy")
    rows = np.load(signatures, mmap_mode="r+")
    assert rows.dtype == SIGNATURE_DTYPE
    rows[0] = np.zeros((), dtype=rows.dtype)
    rows.flush()
    del rows
    record = json.loads(old.read_text())
    record.pop("records_sha256", None)  # as an entry of an earlier format
    old.write_text(json.dumps(record))
    files = {p: len(json.loads(p.read_text())["units"]) for p in (shape, entity, signed, old)}
    capsys.readouterr()

    second = build_tree(tree, tmp_path, "out", "cache", quiet=False)
    said = capsys.readouterr().out
    assert second.files_decoded == sum(files.values())
    (line,) = [line for line in said.splitlines() if "did not check out" in line]
    damaged = files[shape] + files[entity] + files[signed]
    assert line.startswith(f"packer: decoded {damaged} files again: the build cache's entries holding them did not "
                           "check out (")
    assert f"{shape}: its records do not match the sha256 written with them" in line
    assert f"{entity}: its records do not match the sha256 written with them" in line
    assert f"{signatures}: its near-copy signatures do not match the sha256 its records hold" in line
    assert str(old) not in line
    same_as_fresh(tree, tmp_path, second, "damaged-records")


def test_a_series_is_one_unit_a_new_slice_decodes_its_series_only_a_relabelled_one_nothing(tmp_path: Path) -> None:
    """A kind that groups its files before decoding (DICOM series stacked with their neighbours)
    reuses by group: a slice added to one series decodes that series, the others are copied; a
    slice given a new label decodes nothing, and its sample packs the new label."""
    from tests.test_series import _reference_order, _write_series
    from tests.test_targets import _job

    staged = _reference_order(_write_series(tmp_path / "staged", slices=7, seed=1, patient="P1"))
    raw = tmp_path / "raw"
    (raw / "a").mkdir(parents=True)
    for path in staged[:6]:
        path.rename(raw / "a" / path.name)
    _write_series(raw / "b", seed=2, patient="P2")
    _write_series(raw / "c", seed=3, patient="P3")
    table = tmp_path / "labels.csv"

    def label_all(relabel: str = "") -> None:
        names = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.dcm"))
        table.write_text("path,label\n" + "".join(f"{n},{'yes' if n == relabel else 'no'}\n" for n in names))

    job = load_job(_job(tmp_path / "job", [{"kind": "dicom", "root": str(raw), "labels": str(table)}],
                        transform={"dicom": {"windows": [{"center": 1000, "width": 3000}], "size": [16, 16],
                                             "sample": {"neighbors": 1}}}))

    def run(cache: str) -> BuildResult:
        return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, cache_dir=tmp_path / cache))

    label_all()
    first = run("cache")
    assert (first.files_decoded, first.files_cached) == (18, 0)
    staged[6].rename(raw / "a" / staged[6].name)
    label_all()
    grown = run("cache")
    assert (grown.files_decoded, grown.files_cached) == (7, 12)
    assert grown.manifest["dataset_hash"] == run("fresh-grown").manifest["dataset_hash"]
    assert grown.manifest["inputs"]["samples"] == 19

    label_all(relabel=sorted(p.relative_to(raw).as_posix() for p in (raw / "b").iterdir())[2])
    relabelled = run("cache")
    assert (relabelled.files_decoded, relabelled.files_cached) == (0, 19)
    assert relabelled.manifest["label_map"] != grown.manifest["label_map"]
    fresh = run("fresh-relabelled")
    assert fresh.files_cached == 0 and relabelled.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


def test_a_files_unit_key_leaves_out_only_what_decides_its_target(tree: PhotoTree, tmp_path: Path) -> None:
    """The key of a file's unit changes with its bytes (size, mtime) and with every ref field the
    worker reads, and stays put for its label's value and for the table cells that only reach
    its record; a group's key covers all its files, in any order."""
    from dataclasses import replace

    from packer.pipeline.filecache import unit_keys
    from packer.records import SampleRef

    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(tree.root),
                                          "table": str(tree.root / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")}
    job = load_job(write_job(tmp_path / "jobs", doc))
    libraries = {"numpy": "2.2.6"}
    path = tree.root / "p0001.png"
    ref = SampleRef(sample_id="f-1", source=job.sources[0].name, kind="image", path=str(path), relpath="p0001.png",
                    label="a", entity="E1", time="2024-01-01", extra=(("site", "s1"),))

    def key(*refs: SampleRef, group: bool = False) -> str:
        (unit,) = unit_keys(refs, job, libraries, group=group)  # one file, or one group
        return unit.key

    before = key(ref)
    assert key(replace(ref, label="b")) == before
    assert key(replace(ref, extra=(("site", "elsewhere"),))) == before
    assert key(replace(ref, label=None)) != before  # a missing label is a bad sample
    for field, value in (("entity", "E2"), ("time", "2024-02-02"), ("relpath", "x.png"), ("sample_id", "f-2")):
        assert key(replace(ref, **{field: value})) != before, field
    assert unit_keys([ref], job, {"numpy": "2.3.0"}, group=False)[0].key != before
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert key(ref) != before

    other = replace(ref, sample_id="f-2", path=str(tree.root / "p0002.png"), relpath="p0002.png")
    group = key(ref, other, group=True)
    assert key(other, ref, group=True) == group
    assert key(replace(ref, label="b"), other, group=True) == group
    os.utime(other.path, ns=(0, 10**9))
    assert key(ref, other, group=True) != group


def entry_holding(cache: Path, name: str) -> dict[str, Any]:
    """The records of the cache entry whose samples include file ``name``."""
    for path in cache.glob("*.json"):
        if path.name.endswith(".packed.json"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if any(s["ref"]["relpath"] == name for s in data["samples"]):
            return {"key": path.name.split(".")[0], **data}
    raise AssertionError(f"no cache entry holds {name}")


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_unchanged_files_of_a_changed_chunk_are_held_by_reference_not_copied_and_survive_the_old_version(
        tree: PhotoTree, tmp_path: Path, fmt: str) -> None:
    """A chunk that misses because one of its files is new holds its other files' samples by
    reference to where the published version has them (their bytes are not copied into its
    spill); once the new version is published the entry reads them from there, so the older
    version can go."""
    first = build_tree(tree, tmp_path, "out", "cache", fmt=fmt)
    cache = cache_folder(tmp_path, "cache")
    tree.add("p0000a.png", seed=999, label="a", entity="E7000")  # sorts right after p0000.png: joins its chunk
    tree.write_table()
    second = build_tree(tree, tmp_path, "out", "cache", fmt=fmt)
    assert (second.files_decoded, second.files_cached) == (1, FILES + 1)
    entry = entry_holding(cache, "p0000a.png")
    own = [s for s in entry["samples"] if ".via." not in s["spill"]]
    held = [s for s in entry["samples"] if ".via." in s["spill"]]
    assert [s["ref"]["relpath"] for s in own] == ["p0000a.png"] and len(held) >= 1
    assert entry["spill_bytes"] == sum(s["pixel_bytes"] + s["meta_bytes"] + s["mask_bytes"] for s in own)
    earlier = {s["spill"].split(".via.")[1].split(".")[0] for s in held}
    assert not any((cache / f"{key}.json").exists() for key in earlier)  # pruned: this entry has its own pointer
    assert (cache / f"{entry['key']}.packed.json").is_file()
    same_as_fresh(tree, tmp_path, second, "referenced", fmt=fmt)

    # the first version goes; the entry reads its samples from the second, so nothing is decoded again
    shutil.rmtree(first.version_dir)
    third = build_tree(tree, tmp_path, "out", "cache", fmt=fmt)
    assert (third.files_decoded, third.files_cached) == (0, FILES + 2)
    assert third.manifest["dataset_hash"] == second.manifest["dataset_hash"]
    tree.add("p0000b.png", seed=998, label="b", entity="E7001")
    tree.write_table()
    fourth = build_tree(tree, tmp_path, "out", "cache", fmt=fmt)
    assert (fourth.files_decoded, fourth.files_cached) == (1, FILES + 2)
    same_as_fresh(tree, tmp_path, fourth, "after-removal", fmt=fmt)


def test_with_the_spill_kept_unchanged_files_are_copied_not_referenced(tree: PhotoTree, tmp_path: Path) -> None:
    """``--keep-spill`` keeps entries independent of the versions: copies, never references."""
    build_tree(tree, tmp_path, "out", "cache", keep_spill=True)
    cache = cache_folder(tmp_path, "cache")
    tree.add("p0000a.png", seed=999, label="a", entity="E7000")
    tree.write_table()
    second = build_tree(tree, tmp_path, "out", "cache", keep_spill=True)
    assert (second.files_decoded, second.files_cached) == (1, FILES + 1)
    entry = entry_holding(cache, "p0000a.png")
    assert len(entry["samples"]) > 1 and not any(".via." in s["spill"] for s in entry["samples"])
    same_as_fresh(tree, tmp_path, second, "kept")


def test_an_entry_of_references_only_has_no_spill_and_checks_out_while_the_pointer_it_names_resolves(
        tree: PhotoTree, tmp_path: Path) -> None:
    """The entry format itself: an entry whose every sample is held by reference writes no spill
    file, reads its samples through the earlier entry's pointer and checks out exactly as that
    entry does; when the pointer is gone it is not reusable (its files are decoded again)."""
    build_tree(tree, tmp_path, "out", "cache")
    cache = cache_folder(tmp_path, "cache")
    earlier = entry_holding(cache, "p0000.png")["key"]
    loaded = load_cached_chunk(cache, earlier, "webdataset")
    assert loaded is not None and loaded.samples[0].spill == f"{earlier}.packed.json"
    kept: list[tuple[SpilledSample, bytes, bytes]] = []
    checked_chain(cache, loaded.samples, "webdataset", visit=lambda s, _p, meta, mask: kept.append((s, meta, mask)))
    with SpillWriter(cache, "f" * 32, sig_dir=cache, fmt="webdataset") as spill:
        for sample, meta, mask in kept:
            spill.refer(sample, meta=meta, mask=mask, signature=np.zeros((), dtype=SIGNATURE_DTYPE))
    spill.finish(files=len(kept), issues=())
    assert not (cache / f"{'f' * 32}.spill").exists()
    referenced = load_cached_chunk(cache, "f" * 32, "webdataset")
    assert referenced is not None
    assert {s.spill for s in referenced.samples} == {f"{'f' * 32}.via.{earlier}.packed.json"}
    assert [s.sha256 for s in referenced.samples] == [s.sha256 for s in loaded.samples]
    assert referenced_entries([s.spill for s in referenced.samples], ["f" * 32]) == {earlier}
    assert referenced_entries([s.spill for s in referenced.samples], ["e" * 32]) == set()
    (cache / f"{earlier}.packed.json").unlink()
    assert load_cached_chunk(cache, "f" * 32, "webdataset") is None


def test_a_moved_or_renamed_file_is_not_decoded_again_and_the_version_equals_a_fresh_build(
        tree: PhotoTree, tmp_path: Path) -> None:
    """A file moved to another folder or renamed (the same inode, size and mtime) is the same
    file: its samples are taken from the cache under their new keys, not decoded. A copy (a new
    inode) or a moved file whose bytes changed is decoded."""
    build_tree(tree, tmp_path, "out", "cache")
    (tree.root / "moved").mkdir()
    for old, new in (("p0040.png", "moved/p0040.png"), ("p0041.png", "p0041-renamed.png")):
        os.rename(tree.root / old, tree.root / new)
        tree.rows[new] = tree.rows.pop(old)
    shutil.copy2(tree.root / "p0042.png", tree.root / "p0042-copy.png")  # a copy: another inode
    tree.rows["p0042-copy.png"] = {**tree.rows["p0042.png"], "entity": "E8000"}
    tree.write_table()
    second = build_tree(tree, tmp_path, "out", "cache")
    assert (second.files_decoded, second.files_cached) == (1, FILES + 1)
    same_as_fresh(tree, tmp_path, second, "moved")
    cache = cache_folder(tmp_path, "cache")
    moved = entry_holding(cache, "moved/p0040.png")
    (record,) = [s for s in moved["samples"] if s["ref"]["relpath"] == "moved/p0040.png"]
    assert record["key"] == record["ref"]["sample_id"]  # keyed by the file's new id

    # moved again, and its pixels changed on the way: decoded
    os.rename(tree.root / "moved/p0040.png", tree.root / "p0040-back.png")
    tree.rows["p0040-back.png"] = tree.rows.pop("moved/p0040.png")
    path = tree.root / "p0040-back.png"
    cv2.imwrite(str(path), photo(4040))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    tree.write_table()
    third = build_tree(tree, tmp_path, "out", "cache")
    assert (third.files_decoded, third.files_cached) == (1, FILES + 1)
    same_as_fresh(tree, tmp_path, third, "moved-changed")


def test_two_files_of_one_size_and_mtime_that_swap_names_are_not_given_each_others_samples(
        tree: PhotoTree, tmp_path: Path) -> None:
    """A tar extraction or ``cp -p`` leaves many files one mtime, and uncompressed images of one
    shape are one size: two such files that swap names keep every field of the old key but
    their inodes. Each must pack its own pixels under its name, as a fresh build does."""
    a, b = tree.root / "same-a.bmp", tree.root / "same-b.bmp"
    for path, seed in ((a, 7001), (b, 7002)):
        cv2.imwrite(str(path), photo(seed))
        os.utime(path, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9))
        tree.rows[path.name] = {"label": "a", "entity": f"E-{path.stem}", "site": "s0"}
    tree.write_table()
    assert a.stat().st_size == b.stat().st_size and a.stat().st_mtime_ns == b.stat().st_mtime_ns
    first = build_tree(tree, tmp_path, "out", "cache")
    assert not [i for i in first.issues if "same-" in i.path]
    os.rename(a, tree.root / "swap")
    os.rename(b, a)
    os.rename(tree.root / "swap", b)
    second = build_tree(tree, tmp_path, "out", "cache")
    assert second.files_decoded <= 2  # the two (or none: found by their inodes, were their rows alike)
    same_as_fresh(tree, tmp_path, second, "swapped")


def flip_pixel_byte(version_dir: Path, relpath: str) -> tuple[Path, str]:
    """Flip one pixel byte of the sample of raw file ``relpath`` in the tar shard of
    ``version_dir`` that holds it, in place (bit rot asks no file mode); that shard and the
    sha256 its manifest records."""
    file_id = make_sample_id("raw", relpath)
    rows = pq.read_table(version_dir / "_index.parquet", columns=["key", "shard", "position"]).to_pylist()
    (row,) = [r for r in rows if r["key"].startswith(file_id)]
    shard = version_dir / row["shard"]
    (sample,) = [s for s in scan_tar(shard).samples if s.offset == row["position"]]
    start, size = sample.members["npy"]
    data = bytearray(shard.read_bytes())
    data[start + size - 1] ^= 0x01  # the last pixel byte: the tar still reads, the sample's sha256 does not match
    shard.chmod(0o644)
    shard.write_bytes(bytes(data))
    manifest = json.loads((version_dir / "manifest.json").read_text())
    (recorded,) = [s["sha256"] for split in manifest["splits"].values() for s in split["shards"]
                   if s["file"] == shard.name]
    return shard, recorded


def chunk_members(names: list[str], name: str) -> set[str]:
    """The files that the pixel pass puts in one chunk (one cache entry) with ``name``: files in
    path order, cut where a file id's hash says."""
    ids = [(make_sample_id("raw", n), n) for n in sorted(names)]
    (members,) = [{n for _, n in ids[start:stop]} for start, stop in chunk_bounds([i for i, _ in ids])
                  if name in {n for _, n in ids[start:stop]}]
    return members


def new_file(tree: PhotoTree, damaged: str, *, beside: bool) -> str:
    """A name for a new file that falls into the chunk of ``damaged`` (``beside``: that chunk's
    key misses) or leaves that chunk as it is."""
    before = chunk_members(list(tree.rows), damaged)
    for name in [f"p{n:04d}x.png" for n in range(FILES)] + [f"q{n:04d}.png" for n in range(1000)]:
        after = chunk_members([*tree.rows, name], damaged)
        if (name in after) if beside else (after == before):
            return name
    raise AssertionError("no such name")


@pytest.mark.parametrize("beside", [True, False], ids=["its-chunk-misses", "its-chunk-unchanged"])
def test_one_damaged_shard_decodes_only_the_files_whose_samples_in_it_no_longer_check_out(
        tree: PhotoTree, tmp_path: Path, capsys: pytest.CaptureFixture[str], beside: bool) -> None:
    """The samples of unchanged files are read back from the published shards; a flipped byte
    in one of them makes its file decoded again, not the cache entry (~30 files) that holds it,
    and the build names the shard with the sha256 found and the one its manifest records."""
    first = build_tree(tree, tmp_path, "out", "cache")
    assert len(chunk_members(list(tree.rows), "p0100.png")) > 10
    shard, recorded = flip_pixel_byte(first.version_dir, "p0100.png")
    found = hashlib.sha256(shard.read_bytes()).hexdigest()
    added = new_file(tree, "p0100.png", beside=beside)
    tree.add(added, seed=999, label="a", entity="E7000")
    tree.write_table()
    capsys.readouterr()

    second = build_tree(tree, tmp_path, "out", "cache", quiet=False)
    said = capsys.readouterr()
    # the new file and the damaged one; every other file's samples are reused
    assert (second.files_decoded, second.files_cached) == (2, FILES)
    assert second.work_line.startswith(f"decoded 2 of {FILES + 2} files")  # what `packer build` prints
    (warned,) = [line for line in said.err.splitlines() if "did not check out" in line]
    assert warned.startswith(f"packer: warning: {shard}: its bytes no longer match its manifest (sha256 {found[:12]}…")
    assert f"the manifest records {recorded[:12]}…" in warned
    assert "1 file's samples read back from it did not check out, so that file was decoded again" in warned
    # warned of once: the pack pass, which does not link it either, does not name it a second time
    assert [line for line in said.err.splitlines() if str(shard) in line] == [warned], said.err
    assert "gone or changed" not in said.out  # the version folder is there: the shard is named, not the version
    same_as_fresh(tree, tmp_path, second, f"damaged-{added}")


def test_a_shard_missing_from_a_version_that_is_there_is_named_not_the_version_called_gone(
        tree: PhotoTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One shard lost from the version the cache reads back from (a partial copy, a hand's rm):
    the files whose samples it held are decoded again, and the build names that shard and the
    `packer verify` that checks its version; it does not say the version folder is gone (that
    sends the user hunting for a removed version)."""
    first = build_tree(tree, tmp_path, "out", "cache")
    shard, _ = flip_pixel_byte(first.version_dir, "p0100.png")
    held = [r for r in pq.read_table(first.version_dir / "_index.parquet", columns=["key", "shard"]).to_pylist()
            if r["shard"] == shard.name]
    shard.unlink()
    capsys.readouterr()

    second = build_tree(tree, tmp_path, "out", "cache", quiet=False)
    said = capsys.readouterr()
    assert second.files_decoded == len(held) > 0
    assert "which is not there" not in said.out
    version = first.version_dir.resolve()
    (warned,) = [line for line in said.err.splitlines() if str(version / shard.name) in line]
    whose = "1 file's samples" if len(held) == 1 else f"{len(held)} files' samples"
    assert warned == (f"packer: warning: {version / shard.name}: it is missing from its version folder, which is "
                      f"there: the build cache's {whose} read back from it did not check out, so "
                      f"{'that file was' if len(held) == 1 else 'those files were'} decoded again. Check that "
                      f"version with `packer verify {version}`")
    same_as_fresh(tree, tmp_path, second, "missing-shard")


def test_a_rebuild_of_the_same_version_restores_its_damaged_and_missing_files(
        tree: PhotoTree, tmp_path: Path) -> None:
    """A rebuild that finds its version folder already built, with one shard damaged in place
    and another gone, writes both from their samples; those files replace the damaged and
    missing ones, so that the version verifies again, as `packer verify`'s "rebuild the version
    with `packer build`" promises. (They were written, then thrown away with the staging folder
    because the version's manifest was already there: the version stayed damaged and the
    summary said "nothing rewritten".)"""
    from packer.verify import verify_dataset

    first = build_tree(tree, tmp_path, "out", "cache")
    shard, recorded = flip_pixel_byte(first.version_dir, "p0100.png")
    manifest = json.loads((first.version_dir / "manifest.json").read_text())
    others = [s for split in manifest["splits"].values() for s in split["shards"] if s["file"] != shard.name]
    gone = first.version_dir / others[0]["file"]
    gone.unlink()
    kept = first.version_dir / others[1]["file"]
    kept_inode = kept.stat().st_ino
    assert verify_dataset(first.version_dir / "manifest.json").problems

    second = build_tree(tree, tmp_path, "out", "cache")
    assert second.reused and second.version_dir == first.version_dir
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == recorded
    assert hashlib.sha256(gone.read_bytes()).hexdigest() == others[0]["sha256"]
    assert kept.stat().st_ino == kept_inode  # a file that checks out is left as it is
    assert not verify_dataset(first.version_dir / "manifest.json").problems
    assert second.restored == tuple(sorted([shard.name, gone.name]))


def test_a_rebuild_of_the_same_version_writes_this_builds_local_reports(tmp_path: Path) -> None:
    """The dataset_hash counts bad files by reason only: a truncated file fixed and another
    truncated one added gives the same version. Its bad_samples.jsonl kept naming the first
    build's file (gone) and not the one there now; a deleted leakage.json never came back, and
    `packer report` then listed no findings. The latest build's reports replace the version's."""
    raw = tmp_path / "raw"
    raw.mkdir()
    rows = ["path,label,entity"]
    for i in range(6):
        cv2.imwrite(str(raw / f"s{i}.png"), photo(i))
        rows.append(f"s{i}.png,{'ab'[i % 2]},p{i}")
    cut = cv2.imencode(".png", photo(99))[1].tobytes()[:300]
    (raw / "broken_A.png").write_bytes(cut)
    (raw / "labels.csv").write_text("\n".join([*rows, "broken_A.png,a,p99"]) + "\n")
    doc = {"name": "photos", "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
           "split": {"by": "entity", "ratios": {"train": 1.0}}, "transform": {"image": {"size": [16, 16]}},
           "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), "validate": {"max_bad_fraction": 0.5}}
    options = BuildOptions(scheduler="sync", quiet=True, html_report=False, cache_dir=tmp_path / "cache")
    first = build(load_job(write_job(tmp_path / "jobs", doc)), options)
    assert "broken_A.png" in (first.version_dir / "bad_samples.jsonl").read_text()
    (raw / "broken_A.png").unlink()
    (raw / "broken_B.png").write_bytes(cut)
    (raw / "labels.csv").write_text("\n".join([*rows, "broken_B.png,a,p99"]) + "\n")
    (first.version_dir / "leakage.json").unlink()
    second = build(load_job(write_job(tmp_path / "jobs", doc)), options)
    assert second.reused and second.version_dir == first.version_dir
    listed = (second.version_dir / "bad_samples.jsonl").read_text()
    assert "broken_B.png" in listed and "broken_A.png" not in listed
    assert json.loads((second.version_dir / "leakage.json").read_text())
    assert second.reports_rewritten == ("bad_samples.jsonl", "leakage.json")
    # the same inputs again: each report holds this build's bytes already, so none is replaced
    inodes = {name: (second.version_dir / name).stat().st_ino for name in ("bad_samples.jsonl", "leakage.json")}
    third = build(load_job(write_job(tmp_path / "jobs", doc)), options)
    assert third.reused and third.reports_rewritten == () and third.restored == ()
    assert {name: (third.version_dir / name).stat().st_ino for name in inodes} == inodes
