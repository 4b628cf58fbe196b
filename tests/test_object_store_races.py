"""Objects that change while a build reads them, and object-store names that are not plain (moto's
S3 server on 127.0.0.1): a raw object replaced between discovery's listing and the worker's fetch
is never decoded nor cached as the listed object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from packer.config import JobConfig, load_job
from packer.errors import ConfigError
from packer.manifest import decoding_libraries
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.discover import Discovery, discover
from packer.pipeline.pixels import ChunkResult, ChunkTask, process_chunk
from packer.pipeline.rawstore import remote_listing
from packer.pipeline.spill import chunk_key, load_cached_chunk
from packer.verify import verify_dataset
from tests.helpers import write_job
from tests.s3_store import S3Requests, Store, running_store

pytestmark = pytest.mark.slow  # every test talks to moto's S3 server
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "packer-races"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running


def png_bytes(seed: int, side: int = 16) -> bytes:
    """An uncompressed PNG: two of one side have one size, whatever their pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert ok
    return encoded.tobytes()


def photo_job(store: Store, tmp_path: Path, prefix: str, files: dict[str, bytes], **overrides: Any) -> JobConfig:
    """An image source at ``s3://BUCKET/<prefix>`` holding ``files``, one entity each."""
    rows = [f"{name},{'cat' if i % 2 else 'dog'},E{i}," for i, name in enumerate(files)]
    return store.photo_job(tmp_path, prefix, rows, files, **overrides)


def pixel_pass(job: JobConfig, found: Discovery, cache_dir: Path | None) -> ChunkResult:
    """The worker's pass over every file discovery found, keyed by discovery's listing."""
    libraries = decoding_libraries()
    key = chunk_key(found.refs, job, libraries, found.listed)
    return process_chunk(ChunkTask(key=key, refs=tuple(found.refs), job=job, libraries=tuple(libraries.items()),
                                   cache_dir=str(cache_dir) if cache_dir is not None else None,
                                   listed=remote_listing(found.refs, found.listed)))


def digests(result: ChunkResult) -> dict[str, str]:
    return {s.ref.path: s.sha256 for s in result.samples}


def test_an_object_replaced_at_its_size_after_the_listing_is_a_record_never_a_cached_decode(
        store: Store, tmp_path: Path) -> None:
    original, interim = png_bytes(1), png_bytes(99)
    assert len(original) == len(interim) and original != interim  # only the ETag tells them apart
    job = photo_job(store, tmp_path, "swapped", {"a.png": png_bytes(2), "b.png": original})
    found = discover(job)
    swapped = f"s3://{BUCKET}/swapped/b.png"
    store.client.put_object(Bucket=BUCKET, Key="swapped/b.png", Body=interim)  # after the listing

    cache = tmp_path / "cache"
    cache.mkdir()
    during = pixel_pass(job, found, cache)
    (issue,) = during.issues
    assert (issue.stage, issue.reason, issue.path) == ("read", "missing_file", swapped)
    assert issue.message.startswith(f"{swapped}: the object changed after discovery listed it (ETag: listed ")
    assert "build again" in issue.message
    assert swapped not in digests(during)
    key = chunk_key(found.refs, job, decoding_libraries(), found.listed)
    assert load_cached_chunk(cache, key, "webdataset") is None  # a record of this build only: not kept

    store.client.put_object(Bucket=BUCKET, Key="swapped/b.png", Body=original)  # put back: the listed ETag again
    after = pixel_pass(job, found, cache)
    assert not after.reused and after.issues == ()
    assert digests(after) == digests(pixel_pass(job, found, None))  # the listed bytes' pixels, decoded now
    assert load_cached_chunk(cache, key, "webdataset") is not None


def test_a_larger_object_swapped_in_after_the_listing_is_not_decoded_past_the_size_limit(
        store: Store, tmp_path: Path) -> None:
    small, large = png_bytes(3, side=16), png_bytes(4, side=64)
    job = photo_job(store, tmp_path, "grown", {"a.png": small}, limits={"max_decoded_bytes": len(small)})
    found = discover(job)
    store.client.put_object(Bucket=BUCKET, Key="grown/a.png", Body=large)
    result = pixel_pass(job, found, tmp_path / "cache")
    (issue,) = result.issues
    assert (issue.reason, issue.path) == ("missing_file", f"s3://{BUCKET}/grown/a.png")
    assert f"(size: listed {len(small)} bytes, fetched {len(large)})" in issue.message
    assert result.samples == ()


CHAINED = "simplecache::s3://bucket/datasets"


def chained_doc(tmp_path: Path, **where: str) -> dict[str, Any]:
    (tmp_path / "raw").mkdir(exist_ok=True)
    (tmp_path / "raw" / "labels.csv").write_text("path,label,entity,timestamp\na.png,cat,E1,\n")
    source = {"kind": "image", "root": "raw", "table": "raw/labels.csv"}
    source.update({k: v for k, v in where.items() if k != "output"})
    return {"name": "t", "sources": [source], "split": {"by": "entity"}, "pack": {"format": "webdataset"},
            "output": where.get("output", str(tmp_path / "out"))}


@pytest.mark.parametrize("key", ["output", "root", "table"])
def test_a_chained_url_is_refused_naming_it_and_the_plain_url(tmp_path: Path, key: str) -> None:
    """As the output it built a local folder named ``simplecache::s3:`` and exited 0."""
    doc = chained_doc(tmp_path, **{key: CHAINED if key != "table" else f"zip://labels.csv::{CHAINED}/raw.zip"})
    with pytest.raises(ConfigError) as refused:
        load_job(write_job(tmp_path, doc))
    where = "output" if key == "output" else f"sources[0].{key}"
    assert f"{where}: " in str(refused.value) and "is an fsspec chained URL" in str(refused.value)
    plain = "s3://bucket/datasets" if key != "table" else "s3://bucket/datasets/raw.zip"
    assert f"give the plain URL ({plain})" in str(refused.value) and "--storage-option" in str(refused.value)
    assert not any(p.name.startswith(("simplecache", "zip")) for p in tmp_path.iterdir())


def test_a_chained_out_on_the_command_line_exits_2_and_builds_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.cli import main

    monkeypatch.chdir(tmp_path)  # where a relative --out would be built
    job = write_job(tmp_path, chained_doc(tmp_path))
    for out in (CHAINED, "blockcache::s3:/bucket/datasets"):  # a Path made of it folds the slashes
        result = CliRunner().invoke(main, ["build", str(job), "--out", out, "--scheduler", "sync", "--quiet"])
        assert result.exit_code == 2, result.output
        assert f"output: {out} is an fsspec chained URL" in result.output
        assert "give the plain URL (s3://bucket/datasets)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "raw"]


def local_photo_job(tmp_path: Path, output: str, labels: dict[str, str]) -> JobConfig:
    """Eight local PNGs, one entity each, labelled by ``labels`` (file name: label), output to ``output``."""
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    for i, name in enumerate(labels):
        (raw / name).write_bytes(png_bytes(100 + i))
    rows = [f"{name},{label},E{i},2023-01-0{i + 1}T00:00:00" for i, (name, label) in enumerate(labels.items())]
    (raw / "labels.csv").write_text("\n".join(["path,label,entity,timestamp", *rows]) + "\n")
    doc = {"name": "glob", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 1},
           "pack": {"format": "webdataset"}, "output": output}
    return load_job(write_job(tmp_path, doc))


@pytest.mark.parametrize("prefix", ["exp[1]", "q?x", "a*b"])
def test_a_later_version_publishes_under_a_prefix_with_glob_characters_copying_the_earlier_shards(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """fsspec's copy took the names for glob patterns: ``[1]`` found nothing, ``?`` copied a shard into
    ``<version>/test-000000.tar/test-000000.tar``; every later build failed to publish."""
    output = f"s3://{BUCKET}/{prefix}"
    labels = {f"p{i}.png": "cat" if i % 2 else "dog" for i in range(8)}
    options = BuildOptions(scheduler="sync", quiet=True, html_report=False)
    first = build(local_photo_job(tmp_path, output, labels), options)
    calls = S3Requests(monkeypatch)
    second = build(local_photo_job(tmp_path, output, {**labels, "p1.png": "dog"}), options)
    assert second.manifest["version"] != first.manifest["version"]
    copied = calls.keys("copy_object")
    assert copied and all(key.startswith(f"{prefix}/glob/{second.manifest['version']}/") for key in copied)
    keys = {o["Key"] for o in store.client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]}
    assert not [key for key in keys if ".tar/" in key]  # no shard copied into a "folder" named after a shard
    for result in (first, second):
        version = f"{prefix}/glob/{result.manifest['version']}"
        shards = {s["file"] for split in result.manifest["splits"].values() for s in split["shards"]}
        assert {f"{version}/{name}" for name in shards} <= keys
        assert verify_dataset(f"s3://{BUCKET}/{version}").ok


def test_a_damaged_shard_repaired_by_a_copy_from_an_earlier_version_is_said_to_be_copied(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The warning said "uploaded it again from <local file>" while the shard was copied in the store
    from the earlier version (as the summary said)."""
    output = f"s3://{BUCKET}/repair"
    labels = {f"p{i}.png": "cat" if i % 2 else "dog" for i in range(8)}
    options = BuildOptions(scheduler="sync", quiet=True, html_report=False)
    first = build(local_photo_job(tmp_path, output, labels), options)
    job = local_photo_job(tmp_path, output, {**labels, "p1.png": "dog"})
    calls = S3Requests(monkeypatch)
    second = build(job, options)
    version, earlier = second.manifest["version"], first.manifest["version"]
    key = sorted(calls.keys("copy_object"))[0]  # a shard the second version took from the first
    name = key.rsplit("/", 1)[1]
    data = bytearray(store.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[len(data) // 2] ^= 1  # same size, other bytes
    store.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    capsys.readouterr()

    calls.requests.clear()
    build(job, BuildOptions(scheduler="sync", quiet=False, html_report=False))
    err = capsys.readouterr()
    (warning,) = [line for line in err.err.splitlines() if "damaged in the store" in line]
    assert warning.startswith(f"packer: warning: {output}/glob/{version}/{name} has the size but not the sha256")
    assert warning.endswith(f"copied it again in the store from {output}/glob/{earlier}/{name}")
    assert key in calls.keys("copy_object") and key not in calls.keys("put_object")  # as the warning says
    (summary,) = [line for line in err.out.splitlines() if line.startswith("packer: published")]
    assert "1 shards (0.0 MiB) copied in the store from earlier versions" in summary
    assert verify_dataset(f"{output}/glob/{version}").ok
