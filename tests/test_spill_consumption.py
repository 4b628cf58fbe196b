"""A build does not keep a second copy of the dataset: the pack pass frees the spill.

As each shard's task returns, the client punches its samples' byte ranges out of their spill
files and deletes a spill file once all of it is packed (``SpillConsumer``); after publishing it
writes each chunk's ``<key>.packed.json``, where its samples now sit. A rebuild reads unchanged
samples back from those shards, checked against the same digests the spill was, so it decodes
only what is new and gives the same bytes as a fresh build. ``keep_spill`` keeps the old way."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.config import load_job
from packer.files import canonical_json, punch_hole
from packer.keys import parse_key
from packer.pipeline.assemble import ShardTask, write_shard
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.plan import ShardPlan
from packer.pipeline.spill import (
    RECORDS_CHECK,
    SpillConsumer,
    SpillFreed,
    SpillPuncher,
    SpillReader,
    SpillWriter,
    load_cached_chunk,
    records_digest,
)
from packer.records import SampleRef, SpilledSample
from packer.shards.encode import pixels_digest
from packer.shards.tar import scan_tar
from packer.targets import Target
from tests.helpers import demo_job_doc, write_job


def run(demo_raw: Any, tmp_path: Path, out: Path, work: Path, monkeypatch: pytest.MonkeyPatch, *,
        seed: int | None = None, fmt: str | None = None, keep_spill: bool = False) -> BuildResult:
    """The demo job into ``out`` with its cache under ``work``, optionally with another split seed
    (another version from the same samples) or shard format."""
    monkeypatch.setenv("PACKER_WORK_DIR", str(work))
    doc = demo_job_doc(demo_raw.root, out)
    if seed is not None:
        doc["split"] = {**doc["split"], "seed": seed}
    if fmt is not None:
        doc["pack"] = {**doc.get("pack", {}), "format": fmt}
    job = load_job(write_job(tmp_path / f"job-{seed}-{fmt}", doc))
    return build(job, BuildOptions(out=out, scheduler="sync", quiet=True, html_report=False, keep_spill=keep_spill))


def shard_bytes(result: BuildResult) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.version_dir.iterdir()) if p.suffix in (".tar", ".parquet")}


def cache_files(work: Path) -> list[Path]:
    (cache,) = (work / "cache").iterdir()
    return sorted(cache.iterdir())


@pytest.mark.slow  # several demo builds (in process); make test-fast stays under two minutes
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_build_frees_its_spill_and_a_rebuild_reads_unchanged_samples_back_from_the_last_version(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch, fmt=fmt)
    names = [p.name for p in cache_files(work)]
    assert first.files_decoded > 0
    assert not [n for n in names if n.endswith(".spill")]  # no second copy of the dataset left behind
    pointers = [p for p in cache_files(work) if p.name.endswith(".packed.json")]
    assert len(pointers) == len([n for n in names if n.endswith(".sig.npy")])  # one per chunk
    pointer = json.loads(pointers[0].read_text())
    assert Path(pointer["version"]) == first.version_dir.resolve()
    assert all((first.version_dir / file).is_file() for file, _ in pointer["samples"].values())

    # another split seed: a new version of the same samples, none of them decoded again
    second = run(demo_raw, tmp_path, out, work, monkeypatch, seed=5, fmt=fmt)
    assert second.version_dir != first.version_dir
    assert second.files_decoded == 0 and second.files_cached == first.files_decoded
    # ... and byte for byte what a fresh build of that job gives
    fresh = run(demo_raw, tmp_path / "fresh", tmp_path / "fresh" / "out", tmp_path / "fresh" / "work", monkeypatch,
                seed=5, fmt=fmt)
    assert fresh.files_decoded == first.files_decoded
    assert second.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
    assert shard_bytes(second) == shard_bytes(fresh)
    # the pointers now name the newest version
    assert {Path(json.loads(p.read_text())["version"]) for p in cache_files(work)
            if p.name.endswith(".packed.json")} == {second.version_dir.resolve()}


@pytest.mark.slow  # several demo builds (in process); make test-fast stays under two minutes
@pytest.mark.parametrize(("first_fmt", "then_fmt"), [("webdataset", "parquet"), ("parquet", "webdataset")])
def test_another_shard_format_reuses_every_cached_sample_with_that_formats_sha256(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_fmt: str, then_fmt: str) -> None:
    """A sample's sha256 is the one its shard format records (the .npy member in a tar, the raw
    pixels in Parquet), made once by the pixel pass; a chunk cached by a build of the other
    format is still reused, re-hashed for this one, and the version is byte for byte a fresh one."""
    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch, fmt=first_fmt)
    then = run(demo_raw, tmp_path, out, work, monkeypatch, seed=5, fmt=then_fmt)
    assert then.files_decoded == 0 and then.files_cached == first.files_decoded
    fresh = run(demo_raw, tmp_path / "fresh", tmp_path / "fresh" / "out", tmp_path / "fresh" / "work", monkeypatch,
                seed=5, fmt=then_fmt)
    assert then.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
    assert shard_bytes(then) == shard_bytes(fresh)
    # the index's sha256 is what a stock reader gets by hashing the member or the cell
    index = pq.read_table(then.version_dir / "_index.parquet").to_pylist()
    found = 0
    for shard in (p for p in then.version_dir.iterdir() if p.suffix in (".tar", ".parquet") and p.name[0] != "_"):
        if shard.suffix == ".tar":
            with tarfile.open(shard) as tar:
                held = {m.name.split(".", 1)[0]: tar.extractfile(m).read()  # type: ignore[union-attr]
                        for m in tar.getmembers() if m.name.split(".", 1)[1] == "npy"}
        else:
            held = dict(zip(*pq.read_table(shard, columns=["key", "image"]).to_pydict().values(), strict=True))
        for row in (r for r in index if r["shard"] == shard.name):
            assert hashlib.sha256(held[row["key"]]).hexdigest() == row["sha256"], row["key"]
            found += 1
    assert found == len(index) > 0


def test_a_deleted_version_folder_means_its_samples_are_decoded_again_and_the_build_says_why(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch)
    packed = {parse_key(key).file_id for key in pq.read_table(first.version_dir / "_index.parquet")["key"].to_pylist()}
    shutil.rmtree(first.version_dir)
    capsys.readouterr()
    job = load_job(write_job(tmp_path / "again", demo_job_doc(demo_raw.root, out)))
    again = build(job, BuildOptions(out=out, scheduler="sync", quiet=False, html_report=False))
    # the files whose samples were in it; a bad file's records (it has no samples) are still in the cache
    assert again.files_decoded == len(packed) and again.files_cached == first.files_decoded - len(packed) > 0
    assert again.manifest["dataset_hash"] == first.manifest["dataset_hash"]
    assert (f"packer: decoded {len(packed)} files again: the build cache read their samples back from "
            f"{first.version_dir.resolve()}, which is not there: a version removed, or one an interrupted build "
            "never published (packer build --keep-spill keeps a copy in the cache instead)") in capsys.readouterr().out


@pytest.mark.slow  # several demo builds (in process); make test-fast stays under two minutes
@pytest.mark.parametrize("member", ["npy", "json"])
def test_a_changed_byte_in_a_published_shard_makes_only_its_file_decode_again(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, member: str) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch)
    # a chunk of several files whose first pointed sample is a file of its own (not a series'), so
    # that "only its file" and "not the chunk" are different counts
    for pointer_file in sorted(p for p in cache_files(work) if p.name.endswith(".packed.json")):
        records = json.loads(pointer_file.with_name(pointer_file.name.replace(".packed.json", ".json")).read_text())
        key, (file, position) = next(iter(json.loads(pointer_file.read_text())["samples"].items()))
        (file_id,) = {r["ref"]["sample_id"] for r in records["samples"] if r["key"] == key}
        if records["files"] > 1 and [ids for _, ids, *_ in records["units"] if file_id in ids] == [[file_id]]:
            break
    else:
        raise AssertionError("no cache entry of several files whose first pointed sample is a file of its own")
    shard = first.version_dir / file
    (sample,) = [s for s in scan_tar(shard).samples if s.offset == position]
    assert sample.key == key
    start, size = sample.members[member]
    data = bytearray(shard.read_bytes())
    if member == "npy":
        at = start + size - 1  # the last pixel byte
    else:  # the first letter of the sample's metadata (the record's other fields are not what was spilled)
        at = data.index(b'"metadata":{"', start, start + size) + len(b'"metadata":{"')
    data[at] ^= 0x01
    shard.chmod(0o644)  # bit rot does not ask a published shard's mode (0444)
    shard.write_bytes(bytes(data))

    again = run(demo_raw, tmp_path, out, work, monkeypatch, seed=5)  # a new version: the damaged one is not kept
    # that sample's file, not the other files of its chunk (the cache entry that read it back)
    assert again.files_decoded == 1 < records["files"]
    fresh = run(demo_raw, tmp_path / "fresh", tmp_path / "fresh" / "out", tmp_path / "fresh" / "work", monkeypatch,
                seed=5)
    assert again.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]


@pytest.mark.slow  # several demo builds (in process); make test-fast stays under two minutes
def test_keep_spill_keeps_every_chunks_spill_and_rebuilds_from_it(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch, keep_spill=True)
    spills = [p for p in cache_files(work) if p.name.endswith(".spill")]
    assert len(spills) == len([p for p in cache_files(work) if p.name.endswith(".sig.npy")])
    records = [json.loads(p.with_suffix(".json").read_text()) for p in spills]
    assert all(p.stat().st_size == r["spill_bytes"] for p, r in zip(spills, records, strict=True))
    shutil.rmtree(first.version_dir)  # the spill alone serves the rebuild
    again = run(demo_raw, tmp_path, out, work, monkeypatch)
    assert again.files_decoded == 0 and again.manifest["dataset_hash"] == first.manifest["dataset_hash"]
    assert not [p for p in cache_files(work) if p.name.endswith(".spill")]  # that build consumed it


def _spill(folder: Path, name: str, sizes: list[int]) -> list[SpilledSample]:
    """A spill file of random bytes holding samples of ``sizes`` bytes, and their records."""
    data = os.urandom(sum(sizes))
    (folder / name).write_bytes(data)
    ref = SampleRef(sample_id="s", source="s", kind="image", path="/raw/s.png", relpath="s.png", label="a",
                    entity="e")
    samples, offset = [], 0
    for i, size in enumerate(sizes):
        samples.append(SpilledSample(key=f"{name.split('.')[0]}-{i}", ref=ref, spill=name, offset=offset,
                                     pixel_bytes=size - 10, meta_bytes=10, shape=(1, 1, size - 10), dtype="uint8",
                                     sha256="0" * 64))
        offset += size
    return samples


def _punching_works(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"x" * 65536)
    with open(probe, "r+b") as fh:
        works = punch_hole(fh.fileno(), 0, 65536)
    probe.unlink()
    return works


def test_the_consumer_frees_packed_bytes_deletes_finished_spills_and_leaves_kept_ones(tmp_path: Path) -> None:
    mib = 1 << 20
    a = _spill(tmp_path, "aaaa.spill", [mib, mib, mib, mib])
    b = _spill(tmp_path, "bbbb.spill", [mib, mib])
    kept = _spill(tmp_path, "kkkk.spill", [mib, mib])
    before_b = (tmp_path / "bbbb.spill").read_bytes()
    os.sync()
    consumer = SpillConsumer(tmp_path, [s.spill for s in [*a, *b, *kept]], keep=["kkkk.spill"])

    consumer.packed([a[0], a[1], b[0], kept[0]])  # one shard's samples
    spill_a = tmp_path / "aaaa.spill"
    assert spill_a.stat().st_size == 4 * mib  # holes keep the size
    if _punching_works(tmp_path):
        assert spill_a.stat().st_blocks * 512 <= 2 * mib + 8192
        with open(spill_a, "rb") as fh:
            assert fh.read(2 * mib) == bytes(2 * mib)  # the packed samples' bytes are gone ...
        spill_b = (tmp_path / "bbbb.spill").read_bytes()
        assert spill_b[:mib] == bytes(mib) and spill_b[mib:] == before_b[mib:]  # ... the others untouched
        assert consumer.freed >= 3 * mib
    consumer.packed([a[2], a[3], b[1], kept[1]])
    assert not spill_a.exists() and not (tmp_path / "bbbb.spill").exists()  # all packed: deleted
    assert (tmp_path / "kkkk.spill").stat().st_size == 2 * mib  # a kept spill stays whole
    assert consumer.freed >= 6 * mib


@pytest.mark.slow  # several demo builds (in process); make test-fast stays under two minutes
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_sample_read_back_from_a_shard_is_the_spilled_sample_byte_for_byte(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    run(demo_raw, tmp_path, out, work, monkeypatch, keep_spill=True, fmt=fmt)  # spill and pointers both kept
    (cache,) = (work / "cache").iterdir()
    chunks = [p.name.split(".")[0] for p in cache.glob("*.spill")]
    compared = 0
    with SpillReader(cache) as reader:
        for chunk in chunks:
            entry = load_cached_chunk(cache, chunk, fmt)
            assert entry is not None
            for sample in entry.samples:
                as_spilled = reader.read_bytes(sample)
                back = reader.read_bytes(replace(sample, spill=f"{chunk}.packed.json"))
                assert back == as_spilled, sample.key
                compared += 1
    assert compared == sum(len(json.loads((cache / f"{c}.json").read_text())["samples"]) for c in chunks)


def test_a_block_shared_by_two_samples_packed_apart_is_freed_once_both_are(tmp_path: Path) -> None:
    """Holes free whole blocks only: the consumer punches each file's packed ranges merged, so
    the block two neighbouring samples share goes once the second of them is packed."""
    if not _punching_works(tmp_path):
        pytest.skip("this file system cannot punch holes (whole spill files are still deleted)")
    block = os.statvfs(tmp_path).f_bsize
    samples = _spill(tmp_path, "cccc.spill", [block + 904, block + 904, 8 * block])  # not block-aligned
    spill = tmp_path / "cccc.spill"
    os.sync()
    full = spill.stat().st_blocks * 512
    consumer = SpillConsumer(tmp_path, [s.spill for s in samples])
    consumer.packed([samples[0]])  # one shard
    assert full - spill.stat().st_blocks * 512 == block  # [0, block + 904): one whole block
    consumer.packed([samples[1]])  # another shard
    assert full - spill.stat().st_blocks * 512 == 2 * block  # [0, 2 block + 1808) merged: two
    assert consumer.freed == 2 * block


@pytest.mark.parametrize("change", ["cut", "deleted"])
def test_a_shard_changed_after_the_cache_was_checked_is_an_error_naming_the_pointer_and_the_fix(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """The pack pass reads reused samples back after the pixel pass checked them; a version
    folder changed in between (by hand, during the build) is a clear error (IntegrityError, exit
    5), never wrong bytes; one deleted (rm -rf by a teammate) was a bare FileNotFoundError, an
    internal error."""
    from packer.errors import IntegrityError

    out, work = tmp_path / "out", tmp_path / "work"
    first = run(demo_raw, tmp_path, out, work, monkeypatch)
    (cache,) = (work / "cache").iterdir()
    chunk = next(cache.glob("*.packed.json")).name.split(".")[0]
    entry = load_cached_chunk(cache, chunk, "webdataset")
    assert entry is not None and all(s.spill == f"{chunk}.packed.json" for s in entry.samples)
    for shard in first.version_dir.glob("*.tar"):
        shard.chmod(0o644)  # by hand, past the published shard's read-only mode
        if change == "cut":
            shard.write_bytes(shard.read_bytes()[:1024])  # cut short, under the build's feet
        else:
            shard.unlink()
    with SpillReader(cache) as reader, pytest.raises(IntegrityError) as caught:
        for sample in entry.samples:
            reader.read_bytes(sample)
    message = str(caught.value)
    assert message.startswith(f"{cache / chunk}.packed.json: sample ")
    assert "could not be read back from the earlier version" in message and "Run the build again" in message
    assert load_cached_chunk(cache, chunk, "webdataset") is None  # and the next build decodes that chunk


def _real_chunk(cache: Path, key: str, count: int) -> list[SpilledSample]:
    """``count`` samples spilled through the real writer: random uint8 images of unaligned sizes."""
    rng = np.random.default_rng(7)
    with SpillWriter(cache, key, sig_dir=None, fmt="webdataset") as writer:
        for i in range(count):
            shape = (1, 37, 41 + i)
            pixels = rng.integers(0, 256, size=shape, dtype=np.uint8).tobytes()
            ref = SampleRef(sample_id=f"src-{i:03d}", source="src", kind="image", path=f"/raw/{i}.png",
                            relpath=f"{i}.png", label="a", entity=f"E{i}")
            digest = pixels_digest(pixels, shape=shape, dtype="uint8", fmt="webdataset")
            writer.add(key=f"src-{i:03d}", ref=ref, pixels=pixels, digest=digest,
                       meta=canonical_json({"index": i}), shape=shape, dtype="uint8", signature=None)
    writer.finish(files=count, issues=[])
    return writer.samples


def _die_after(samples_written: int, task: ShardTask) -> None:
    """In a child process: write ``task``'s shard and die (no clean-up, like SIGKILL or the OOM
    killer) right after the shard file took its ``samples_written``-th sample."""
    import packer.pipeline.assemble as assemble

    real = assemble.write_tar_shard
    seen = [0]

    def dying(path: Path, samples: Any, after_each: Any = None) -> Any:
        def then_die(sample: Any) -> None:
            after_each(sample)
            seen[0] += 1
            if seen[0] == samples_written:
                os._exit(9)
        return real(path, samples, after_each=then_die)

    assemble.write_tar_shard = dying
    assemble.write_shard(task)
    os._exit(0)  # not reached when the kill point is inside the shard


def test_a_shard_task_that_dies_mid_shard_is_retried_from_the_samples_its_partial_file_holds(tmp_path: Path) -> None:
    """A tar shard's task frees each sample's spill as soon as the shard file holds it. A worker
    that dies there leaves the partial file; the retried task finds the freed samples in it,
    checks them against their sha256 and writes the shard a clean run writes, then removes it."""
    cache, staging, reference = tmp_path / "cache", tmp_path / "staging", tmp_path / "reference"
    for folder in (cache, staging, reference):
        folder.mkdir()
    samples = _real_chunk(cache, "chunk", 12)
    plan = ShardPlan(file="train-000000.tar", split="train", index=0, samples=samples)
    target = Target("class", ("a",))
    clean = write_shard(ShardTask(plan=plan, target=target, cache_dir=str(cache), folder=str(reference),
                                  format="webdataset"))  # frees nothing
    task = ShardTask(plan=plan, target=target, cache_dir=str(cache), folder=str(staging), format="webdataset",
                     free_spill=True)

    child = multiprocessing.get_context("fork").Process(target=_die_after, args=(5, task))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    assert [p.name for p in staging.iterdir()] == ["train-000000.tar.partial"]  # what the dead attempt left
    with SpillReader(cache) as reader:  # its first five samples are gone from the spill ...
        with pytest.raises(SpillFreed):
            reader.read(samples[4])
        reader.read(samples[5])  # ... the rest are not
    assert load_cached_chunk(cache, "chunk", "webdataset") is None  # a later build would decode this chunk again

    retried = write_shard(task)
    assert [p.name for p in staging.iterdir()] == ["train-000000.tar"]  # the earlier attempt's file is gone
    assert (staging / "train-000000.tar").read_bytes() == (reference / "train-000000.tar").read_bytes()
    assert (retried.sha256, list(retried.positions)) == (clean.sha256, list(clean.positions))
    with SpillReader(cache) as reader, pytest.raises(SpillFreed):
        reader.read(samples[11])  # the retry freed the rest


def test_a_retry_without_the_earlier_attempts_file_stops_with_the_fix(tmp_path: Path) -> None:
    cache, staging = tmp_path / "cache", tmp_path / "staging"
    cache.mkdir()
    staging.mkdir()
    samples = _real_chunk(cache, "chunk", 4)
    plan = ShardPlan(file="train-000000.tar", split="train", index=0, samples=samples)
    task = ShardTask(plan=plan, target=Target("class", ("a",)), cache_dir=str(cache), folder=str(staging),
                     format="webdataset", free_spill=True)
    write_shard(task)
    (staging / "train-000000.tar").unlink()  # freed spill, and no shard to read it back from
    with pytest.raises(OSError, match=r"spilled bytes were freed by an earlier attempt at writing this shard, "
                                      r"which left no whole copy of them; run the build again"):
        write_shard(task)
    assert not list(staging.glob("*.partial"))


@given(sizes=st.lists(st.integers(11, 20_000), min_size=1, max_size=24), data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_freeing_packed_samples_never_touches_a_sample_not_yet_packed(tmp_path: Path, sizes: list[int],
                                                                      data: st.DataObject) -> None:
    """Whatever the sample sizes (aligned to blocks or not), however they are grouped into shards
    and in whatever order the shards finish, punching the packed samples out (the shard task's
    per-sample punches, then the client's merged ranges) leaves every other sample's bytes as
    they were, and the spill file goes once all of it is packed."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    samples = _spill(folder, "ffff.spill", sizes)
    original = (folder / "ffff.spill").read_bytes()
    shard_of = data.draw(st.lists(st.integers(0, 4), min_size=len(samples), max_size=len(samples)))
    shards = [[s for s, k in zip(samples, shard_of, strict=True) if k == shard] for shard in sorted(set(shard_of))]
    order = data.draw(st.permutations(range(len(shards))))
    consumer = SpillConsumer(folder, [s.spill for s in samples])
    puncher = SpillPuncher(folder)
    packed: set[str] = set()
    for index in order:
        for sample in shards[index]:  # the task frees each sample once the shard holds it ...
            puncher.punch(sample)
            packed.add(sample.key)
        consumer.packed(shards[index])  # ... and the client what is left when the task returns
        spill = folder / "ffff.spill"
        if len(packed) == len(samples):
            assert not spill.exists()
            break
        now = spill.read_bytes()
        for sample in samples:
            if sample.key not in packed:
                end = sample.offset + sample.pixel_bytes + sample.meta_bytes
                assert now[sample.offset:end] == original[sample.offset:end], sample.key
    puncher.close()


def write_entry(cache: Path, key: str, images: list[np.ndarray]) -> None:
    """A cache entry of ``images`` (one sample each) as the pixel pass writes it."""
    with SpillWriter(cache, key, sig_dir=None, fmt="webdataset") as spill:
        for n, image in enumerate(images):
            pixels = image.tobytes()
            ref = SampleRef(sample_id=f"f{n}", source="s", kind="image", path=f"/raw/{n}.png", relpath=f"{n}.png",
                            label="a", entity=f"e{n}")
            spill.add(key=f"k{n}", ref=ref, pixels=pixels, meta=b'{"n":%d}' % n, shape=image.shape,
                      dtype=image.dtype.name, signature=None,
                      digest=pixels_digest(pixels, shape=image.shape, dtype=image.dtype.name, fmt="webdataset"))
    spill.finish(files=len(images), issues=())


@pytest.mark.parametrize("recorded", [True, False], ids=["xxh3 recorded", "entry from before xxh3"])
@pytest.mark.parametrize("where", [0, 1, 4095, 4096 * 3 - 1])
def test_a_reused_entry_checks_each_samples_pixels_and_any_changed_byte_refuses_it(
        tmp_path: Path, recorded: bool, where: int) -> None:
    """The pixels are checked against the xxh3 recorded with their sha256 (a sha256 over every byte
    read back costs a rebuild seconds per GB); an entry written before it was recorded is
    checked against the sha256 as before. Either way one changed byte anywhere refuses the entry."""
    rng = np.random.default_rng(where)
    images = [rng.integers(0, 255, (3, 32, 64), dtype=np.uint8) for _ in range(2)]
    write_entry(tmp_path, "chunk", images)
    records = tmp_path / "chunk.json"
    data = json.loads(records.read_text())
    assert [s["pixels_xxh3"] for s in data["samples"]] == [xxhash.xxh3_64_intdigest(i.tobytes()) for i in images]
    if not recorded:
        for sample in data["samples"]:
            del sample["pixels_xxh3"]
        # written so, its records' own digest made over them (an edit alone is damage: test_filecache)
        data[RECORDS_CHECK] = records_digest({k: v for k, v in data.items() if k != RECORDS_CHECK})
        records.write_text(canonical_json(data).decode())
    entry = load_cached_chunk(tmp_path, "chunk", "webdataset")
    assert entry is not None and [s.sha256 for s in entry.samples] == [s["sha256"] for s in data["samples"]]
    spill = tmp_path / "chunk.spill"
    raw = bytearray(spill.read_bytes())
    offset = data["samples"][1]["offset"] + where % data["samples"][1]["pixel_bytes"]
    raw[offset] ^= 0x01
    spill.write_bytes(bytes(raw))
    assert load_cached_chunk(tmp_path, "chunk", "webdataset") is None


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_shard_drawing_from_every_spill_file_keeps_a_bounded_number_of_them_open(tmp_path: Path) -> None:
    """Packed in key order a shard reads from every spill file (one per ~32 raw files): the
    reader and the puncher each keep at most OPEN_FILES open, so ``ulimit -n`` no longer runs out
    as the dataset grows, and every sample reads back its bytes all the same."""
    chunks = [_real_chunk(tmp_path, f"{n:04x}", 2) for n in range(3 * SpillReader.OPEN_FILES)]
    originals = {c[0].spill: (tmp_path / c[0].spill).read_bytes() for c in chunks}
    interleaved = [chunk[i] for i in range(2) for chunk in chunks]  # each file met twice, far apart
    before = _open_descriptors()
    most = 0
    puncher = SpillPuncher(tmp_path)
    with SpillReader(tmp_path) as reader:
        for sample in interleaved:
            pixels, meta, _ = reader.read_bytes(sample)
            whole = originals[sample.spill]
            assert pixels == whole[sample.offset:sample.offset + sample.pixel_bytes]
            assert meta == whole[sample.offset + sample.pixel_bytes:sample.offset + sample.pixel_bytes
                                 + sample.meta_bytes]
            puncher.punch(sample)
            most = max(most, _open_descriptors() - before)
    puncher.close()
    assert most <= SpillReader.OPEN_FILES + SpillPuncher.OPEN_FILES < len(chunks)
    assert _open_descriptors() == before
