"""Remote outputs: build to s3:// (moto's S3 server on 127.0.0.1), publish with the manifest
last, verify and load through fsspec; file:// URLs; errors that name the URL and the fix."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packer.config import load_job
from packer.errors import ConfigError, IntegrityError, PackerError
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.publish import publish_version
from packer.storage import LOCAL_ONLY, parse_storage_options, resolve_output
from packer.verify import verify_dataset
from tests.helpers import demo_job_doc, write_job
from tests.s3_store import S3Requests, Store, running_store

pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
s3fs = pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "packer-test"
FORMATS = ("webdataset", "parquet")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """moto's S3 server on 127.0.0.1 with one bucket; the AWS_* variables point at it."""
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running


@dataclass(frozen=True)
class Built:
    fmt: str
    remote: BuildResult
    local: BuildResult
    events: tuple[tuple[str, str], ...]  # ("start"|"end", object key) of every upload, in order

    @property
    def version_url(self) -> str:
        return f"s3://{BUCKET}/datasets/demo/{self.remote.manifest['version']}"

    @property
    def prefix(self) -> str:
        return f"datasets/demo/{self.remote.manifest['version']}/"


def _job(demo_raw: Any, tmp: Path, fmt: str) -> Any:
    doc = demo_job_doc(demo_raw.root, tmp / "unused-local-output", pack={"format": fmt, "max_samples": 32})
    return load_job(write_job(tmp / "job", doc))


def _record_uploads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record the start and end of every object upload s3fs makes."""
    events: list[tuple[str, str]] = []
    original = s3fs.S3FileSystem._put_file

    async def recording(self: Any, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
        key = rpath.split("/", 1)[1]
        events.append(("start", key))
        try:
            return await original(self, lpath, rpath, *args, **kwargs)
        finally:
            events.append(("end", key))

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", recording)
    return events


@pytest.fixture(scope="module", params=FORMATS)
def built(request: pytest.FixtureRequest, store: Store, demo_raw: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The demo built to s3://packer-test/datasets (uploads recorded), and built locally."""
    tmp = tmp_path_factory.mktemp(f"s3-{request.param}")
    job = _job(demo_raw, tmp, request.param)
    with pytest.MonkeyPatch.context() as patch:
        events = _record_uploads(patch)
        remote = build(job, BuildOptions(out=f"s3://{BUCKET}/datasets", work_dir=tmp / "work", scheduler="sync",
                                         quiet=True))
    local = build(job, BuildOptions(out=tmp / "local", scheduler="sync", quiet=True))
    yield Built(fmt=request.param, remote=remote, local=local, events=tuple(events))


def _listed(manifest: dict[str, Any]) -> dict[str, str]:
    """File → sha256 for every file the manifest hashes (shards, index, splits table)."""
    files = {s["file"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}
    files[manifest["index"]["file"]] = manifest["index"]["sha256"]
    files[manifest["splits_table"]["file"]] = manifest["splits_table"]["sha256"]
    return files


def _get(store: Store, key: str) -> bytes:
    body: bytes = store.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return body


def _keys(store: Store, prefix: str) -> set[str]:
    pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {obj["Key"][len(prefix):] for page in pages for obj in page.get("Contents", [])}


def _split_keys(result: BuildResult, split: str) -> list[str]:
    table = pq.read_table(result.version_dir / "_index.parquet").to_pylist()
    return sorted(row["key"] for row in table if row["split"] == split)


@pytest.mark.slow  # moto's S3 server
def test_a_remote_build_uploads_the_same_bytes_as_a_local_build(store: Store, built: Built) -> None:
    manifest = built.remote.manifest
    assert manifest["dataset_hash"] == built.local.manifest["dataset_hash"]  # where it goes is not identity
    assert built.remote.published is not None and not built.remote.published.skipped
    assert built.remote.published.manifest_url == f"{built.version_url}/manifest.json"
    listed = _listed(manifest)
    assert _keys(store, built.prefix) == set(listed) | {"manifest.json"}  # local-only files stay local
    assert not set(LOCAL_ONLY) & _keys(store, built.prefix)
    for name, digest in listed.items():
        data = _get(store, built.prefix + name)
        assert hashlib.sha256(data).hexdigest() == digest
        assert data == (built.local.version_dir / name).read_bytes()
    remote_manifest = json.loads(_get(store, built.prefix + "manifest.json"))
    assert remote_manifest == json.loads(built.remote.manifest_path.read_text())


@pytest.mark.slow  # moto's S3 server
def test_the_manifest_is_uploaded_last_after_every_other_object_finished(built: Built) -> None:
    starts = [key for kind, key in built.events if kind == "start"]
    assert starts[-1] == built.prefix + "manifest.json" and starts.count(starts[-1]) == 1
    manifest_start = built.events.index(("start", built.prefix + "manifest.json"))
    ends_before = {key for kind, key in built.events[:manifest_start] if kind == "end"}
    assert ends_before == {built.prefix + name for name in _listed(built.remote.manifest)}
    assert built.remote.published is not None
    assert built.remote.published.uploaded[-1] == "manifest.json"


@pytest.mark.slow  # moto's S3 server
def test_rebuilding_to_the_same_url_uploads_nothing(store: Store, built: Built, demo_raw: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    before = {o["Key"]: o["LastModified"] for o in
              store.client.list_objects_v2(Bucket=BUCKET, Prefix=built.prefix)["Contents"]}
    events = _record_uploads(monkeypatch)
    work = built.remote.version_dir.parent.parent
    again = build(_job(demo_raw, tmp_path, built.fmt),
                  BuildOptions(out=f"s3://{BUCKET}/datasets", work_dir=work, scheduler="sync", quiet=True))
    assert again.reused and again.published is not None and again.published.skipped
    assert events == []
    after = {o["Key"]: o["LastModified"] for o in
             store.client.list_objects_v2(Bucket=BUCKET, Prefix=built.prefix)["Contents"]}
    assert after == before


@pytest.mark.slow  # moto's S3 server
def test_verify_passes_on_the_remote_version(built: Built) -> None:
    for location in (f"{built.version_url}/manifest.json", built.version_url, built.version_url + "/"):
        report = verify_dataset(location, deep=True)
        assert report.ok, report.problems
        assert report.files_checked == len(_listed(built.remote.manifest))
        assert report.samples_checked == built.remote.manifest["inputs"]["samples"]


_COPIES = itertools.count()


def _corrupt_copy(store: Store, built: Built) -> tuple[str, str, str]:
    """Publish the version under another prefix and flip one byte of a shard there.

    Returns (version URL, shard file, its split)."""
    result = publish_version(built.local.version_dir, f"s3://{BUCKET}/corrupt-{built.fmt}-{next(_COPIES)}")
    split = "valid"
    shard = built.local.manifest["splits"][split]["shards"][0]["file"]
    key = result.url.split(f"s3://{BUCKET}/", 1)[1] + "/" + shard
    data = bytearray(_get(store, key))
    data[len(data) // 2] ^= 0x01
    store.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    return result.url, shard, split


@pytest.mark.slow  # moto's S3 server
def test_verify_fails_after_one_byte_of_a_remote_shard_flips(store: Store, built: Built) -> None:
    url, shard, _ = _corrupt_copy(store, built)
    report = verify_dataset(url)
    assert not report.ok
    assert {p.shard for p in report.problems} == {shard}
    assert "sha256" in report.problems[0].message and report.problems[0].key is None
    # the shard streamed from the store once more: the sample holding the flipped byte, by name
    named = [p for p in report.problems if p.key is not None]
    assert len(named) == 1 and "xxh3" in named[0].message


@pytest.mark.slow  # moto's S3 server
def test_shard_dataset_over_s3_yields_the_split_and_the_same_samples(built: Built) -> None:
    torch = pytest.importorskip("torch", reason="the loader extra")
    from torch.utils.data import DataLoader

    from packer.loader import ShardDataset

    local = {item["key"]: item for item in ShardDataset(built.local.version_dir, "train", shuffle=False)}
    assert sorted(local) == _split_keys(built.local, "train")
    for workers in (0, 2):
        dataset = ShardDataset(f"{built.version_url}/manifest.json", "train", seed=3, verify=workers == 2)
        items = list(DataLoader(dataset, batch_size=None, num_workers=workers))
        assert sorted(item["key"] for item in items) == _split_keys(built.local, "train")
        for item in items:
            assert torch.equal(item["image"], local[item["key"]]["image"])
            assert int(item["label"]) == int(local[item["key"]]["label"])


@pytest.mark.slow  # moto's S3 server
def test_shard_dataset_takes_storage_options_instead_of_the_environment(store: Store, built: Built,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="the loader extra")
    from packer.loader import ShardDataset

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    options = {"endpoint_url": store.endpoint}
    keys = sorted(item["key"] for item in ShardDataset(built.version_url, "test", storage_options=options))
    assert keys == _split_keys(built.local, "test")
    assert verify_dataset(built.version_url, storage_options=options).ok


@pytest.mark.slow  # moto's S3 server
def test_verify_true_refuses_a_corrupted_remote_shard(store: Store, built: Built) -> None:
    pytest.importorskip("torch", reason="the loader extra")
    from packer.loader import ShardDataset
    from packer.loader.readers import ShardReadError

    url, shard, split = _corrupt_copy(store, built)
    with pytest.raises(ShardReadError, match=shard) as caught:
        list(ShardDataset(url, split, shuffle=False, verify=True))
    assert "sha256" in str(caught.value)
    skipping = ShardDataset(url, split, shuffle=False, verify=True, on_error="skip", max_skipped=10_000)
    keys = [item["key"] for item in skipping]
    entries = built.local.manifest["splits"][split]["shards"]
    assert len(keys) == sum(e["samples"] for e in entries if e["file"] != shard)


@pytest.mark.slow  # moto's S3 server
def test_the_verify_command_reads_s3_and_exits_5_on_a_flipped_byte(store: Store, built: Built) -> None:
    from click.testing import CliRunner

    from packer.cli import main

    runner = CliRunner()
    good = runner.invoke(main, ["verify", built.version_url, "--quiet",
                                "--storage-option", f"endpoint_url={store.endpoint}"])
    assert good.exit_code == 0, good.output
    url, shard, _ = _corrupt_copy(store, built)
    bad = runner.invoke(main, ["verify", url, "--quiet"])
    assert bad.exit_code == 5, bad.output
    assert shard in bad.output


@pytest.mark.slow  # moto's S3 server
def test_the_build_command_publishes_to_an_out_url_or_the_jobs_output_url(store: Store, demo_raw: Any,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from packer.cli import main

    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    doc = demo_job_doc(demo_raw.root, tmp_path / "unused")
    job = write_job(tmp_path / "job", doc)
    args = ["build", str(job), "--scheduler", "sync", "--quiet", "--no-report"]
    first = CliRunner().invoke(main, [*args, "--out", f"s3://{BUCKET}/cli", "--storage-option",
                                      f"endpoint_url={store.endpoint}"])
    assert first.exit_code == 0, first.output
    version = json.loads(next((tmp_path / "work" / "demo").glob("*/manifest.json")).read_text())["version"]
    assert f"remote    s3://{BUCKET}/cli/demo/{version}/manifest.json" in first.output
    again = CliRunner().invoke(main, [*args, "--out", f"s3://{BUCKET}/cli"])
    assert again.exit_code == 0 and "already there: nothing uploaded" in again.output, again.output
    doc["output"] = f"s3://{BUCKET}/from-job"
    from_job = CliRunner().invoke(main, ["build", str(write_job(tmp_path / "job2", doc)), *args[2:]])
    assert from_job.exit_code == 0, from_job.output
    assert "manifest.json" in _keys(store, f"from-job/demo/{version}/")


@pytest.mark.slow  # moto's S3 server
def test_an_interrupted_upload_leaves_no_manifest_and_a_retry_publishes(store: Store, built: Built,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    original = s3fs.S3FileSystem._put_file
    victim = built.local.manifest["splits"]["train"]["shards"][-1]["file"]

    async def failing(self: Any, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
        if rpath.endswith(victim):
            raise OSError(f"connection reset while uploading {rpath}")
        return await original(self, lpath, rpath, *args, **kwargs)

    target = f"s3://{BUCKET}/interrupted-{built.fmt}"
    prefix = f"interrupted-{built.fmt}/demo/{built.local.manifest['version']}/"
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", failing)
    with pytest.raises(PackerError, match="connection reset"):
        publish_version(built.local.version_dir, target)
    assert "manifest.json" not in _keys(store, prefix)
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", original)
    store.client.put_object(Bucket=BUCKET, Key=prefix + "manifest.json", Body=b"{not json")  # damaged
    result = publish_version(built.local.version_dir, target)
    assert not result.skipped
    assert verify_dataset(result.url).ok


@pytest.mark.slow  # moto's S3 server
def test_publish_refuses_bytes_that_do_not_match_the_manifest(store: Store, built: Built, tmp_path: Path) -> None:
    local = Path(shutil.copytree(built.local.version_dir, tmp_path / built.local.version_dir.name,
                                 copy_function=shutil.copyfile))  # writable copies: published shards are 0444
    shard = local / built.local.manifest["splits"]["test"]["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"{shard.name}: sha256 .* the manifest records"):
        publish_version(local, f"s3://{BUCKET}/bad-local-{built.fmt}")
    assert "manifest.json" not in _keys(store, f"bad-local-{built.fmt}/")
    assert f"{shard.name}" in {k.rsplit("/", 1)[-1] for k in _keys(store, f"bad-local-{built.fmt}/")}


@pytest.mark.slow  # its `built` fixture builds to moto's S3 server
def test_file_urls_work_for_publish_verify_and_the_loader(built: Built, tmp_path: Path) -> None:
    copy = publish_version(built.local.version_dir, f"file://{tmp_path}/mirror")
    folder = tmp_path / "mirror" / "demo" / built.local.manifest["version"]
    assert copy.manifest_url == str(folder / "manifest.json")
    assert sorted(p.name for p in folder.iterdir()) == sorted([*_listed(built.local.manifest), "manifest.json"])
    assert publish_version(built.local.version_dir, f"file://{tmp_path}/mirror").skipped
    # a published version that lost a shard (or holds a cut one) is published again, as verify's hint says
    lost = built.local.manifest["splits"]["train"]["shards"][0]["file"]
    (folder / lost).unlink()
    assert not verify_dataset(folder).ok
    again = publish_version(built.local.version_dir, f"file://{tmp_path}/mirror")
    assert not again.skipped and lost in again.uploaded and verify_dataset(folder).ok
    os.truncate(folder / lost, 1000)
    assert not publish_version(built.local.version_dir, f"file://{tmp_path}/mirror").skipped
    assert verify_dataset(folder).ok
    assert verify_dataset(f"file://{folder}/manifest.json", deep=True).ok
    assert resolve_output(f"file://{tmp_path}/out") == ((tmp_path / "out").resolve(), None)
    pytest.importorskip("torch", reason="the loader extra")
    from packer.loader import ShardDataset

    keys = sorted(item["key"] for item in ShardDataset(f"file://{folder}", "valid"))
    assert keys == _split_keys(built.local, "valid")


@pytest.mark.slow  # moto's S3 server
def test_a_missing_bucket_is_a_config_error_that_says_so(store: Store, built: Built) -> None:
    with pytest.raises(ConfigError, match="no-such-bucket.*bucket does not exist.*create it"):
        publish_version(built.local.version_dir, "s3://no-such-bucket/datasets")


def test_the_work_dir_defaults_to_packer_work_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    assert resolve_output("s3://bucket/prefix") == ((tmp_path / "work").resolve(), "s3://bucket/prefix")
    monkeypatch.delenv("PACKER_WORK_DIR")
    assert resolve_output("s3://b/p")[0] == (Path.home() / ".cache" / "packer" / "work").resolve()
    assert resolve_output(tmp_path / "out") == ((tmp_path / "out").resolve(), None)


def test_an_output_url_without_a_bucket_or_with_a_slash_missing_is_refused(tmp_path: Path) -> None:
    """Both built a local folder named "s3:" and reported it published."""
    with pytest.raises(ConfigError, match="output 's3://' names no bucket; write s3://BUCKET/PREFIX"):
        resolve_output("s3://")
    for typo in ("s3:/datasets/pub", "s3//datasets/pub", "gs:bucket/x"):
        with pytest.raises(ConfigError, match=f"output '{typo}' looks like a .*:// URL with a slash missing"):
            resolve_output(typo)
    for typo in ("s3:/datasets/pub", "gs:bucket/x"):  # as the command line passes it (a Path): named as written
        with pytest.raises(ConfigError, match=f"output '{typo}' looks like a .*:// URL with a slash missing"):
            resolve_output(Path(typo))
    assert resolve_output(f"./s3:/{tmp_path.name}")[1] is None  # a folder named so, on purpose


def test_a_storage_option_the_store_does_not_take_is_a_config_error_before_any_request() -> None:
    pytest.importorskip("s3fs")
    from packer.storage import filesystem_for

    for option, value in (("foo", "bar"), ("endpoint_url", "")):
        with pytest.raises(ConfigError, match=rf"the storage options \(given: {option}\) are not accepted"):
            filesystem_for(f"s3://bucket-{option}/x", {option: value})


def test_an_http_url_opens_without_the_connect_step_only_s3fs_has() -> None:
    pytest.importorskip("aiohttp")
    from packer.storage import filesystem_for

    fs, path = filesystem_for("http://127.0.0.1:9/raw/")  # no request: the connect step makes no client here
    assert type(fs).__name__ == "HTTPFileSystem" and path == "http://127.0.0.1:9/raw/"


def test_half_a_key_pair_or_a_malformed_option_is_a_config_error_naming_the_url_not_the_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    from packer.storage import filesystem_for

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    for n, options in enumerate(({"secret": "S3CR3T-VALUE"}, {"key": "AKIAONLY"}, {"client_kwargs": "abc"})):
        url = f"s3://bucket-partial-{n}/x"
        with pytest.raises(ConfigError, match=rf"{url}: the storage options \(given: {next(iter(options))}\)") as err:
            filesystem_for(url, options)
        assert "S3CR3T-VALUE" not in str(err.value)


def test_http_reads_time_out_when_a_server_stalls_unless_the_options_set_their_own_timeout() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    from packer.storage import storage_options_for

    default = storage_options_for("https://host/raw/")["client_kwargs"]["timeout"]
    assert default == aiohttp.ClientTimeout(sock_connect=30, sock_read=120)  # no cap on a whole (large) transfer
    given = storage_options_for("http://host/raw/",
                                ["client_kwargs.timeout.sock_read=600", "client_kwargs.trust_env=true"])
    assert given["client_kwargs"] == {"timeout": aiohttp.ClientTimeout(sock_read=600), "trust_env": True}
    assert "client_kwargs" not in storage_options_for("s3://bucket/raw/")


def test_storage_options_parse_from_key_value_pairs() -> None:
    options = parse_storage_options(["endpoint_url=http://127.0.0.1:9000", "anon=false",
                                     "client_kwargs.region_name=eu-west-1", "config_kwargs.retries.max_attempts=2"])
    assert options == {"endpoint_url": "http://127.0.0.1:9000", "anon": False,
                       "client_kwargs": {"region_name": "eu-west-1"},
                       "config_kwargs": {"retries": {"max_attempts": 2}}}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_storage_options(["endpoint_url"])


def test_an_unknown_protocol_names_the_url() -> None:
    with pytest.raises(ConfigError, match="nosuchproto://x"):
        verify_dataset("nosuchproto://x/manifest.json")


def test_an_unreachable_output_store_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    """A build to s3://... whose endpoint cannot be reached (or whose credentials are missing)
    decoded every file into the local work folder and failed only at the upload; the store is now
    reached first, and the build stops there with a ConfigError naming the endpoint fix, having
    made no build cache."""
    raw = tmp_path / "raw"
    (raw / "ct").mkdir(parents=True)
    job = load_job(write_job(tmp_path, demo_job_doc(raw, tmp_path / "unused")))
    options = {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s",
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    work = tmp_path / "work"
    with pytest.raises(ConfigError) as raised:
        build(job, BuildOptions(scheduler="sync", quiet=True, out="s3://packer-out/x", work_dir=work,
                                storage_options=options))
    assert "reaching the output store before building: s3://packer-out/x: cannot reach the object store" in str(
        raised.value)
    assert not any(p.is_file() for p in work.rglob("*"))


@pytest.mark.slow  # moto's S3 server
def test_an_output_bucket_that_does_not_exist_is_refused_before_anything_is_built(store: Store,
                                                                                   tmp_path: Path) -> None:
    """The check before building asked only whether the output folder exists, which s3fs answers
    False for a missing bucket too: the build decoded and packed everything into the work folder
    and only the upload said the bucket does not exist."""
    raw = tmp_path / "raw"
    (raw / "ct").mkdir(parents=True)
    job = load_job(write_job(tmp_path, demo_job_doc(raw, tmp_path / "unused")))
    work = tmp_path / "work"
    with pytest.raises(ConfigError) as raised:
        build(job, BuildOptions(scheduler="sync", quiet=True, out="s3://no-such-bucket/datasets", work_dir=work))
    assert ("reaching the output store before building: s3://no-such-bucket/datasets: the bucket does not exist"
            in str(raised.value)), raised.value
    assert "create it" in str(raised.value)
    assert not any(p.is_file() for p in work.rglob("*"))



@pytest.mark.slow  # moto's S3 server, a build in a subprocess
def test_ctrl_c_during_the_upload_exits_130_with_one_line_and_publishes_no_manifest(
        store: Store, demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while an upload request was in flight exited 130, but Python's shutdown then
    printed asyncio's "Task was destroyed but it is pending!" and a botocore traceback
    ("Exception ignored in: <coroutine object S3FileSystem._call_s3 ...>") for the request left
    running on fsspec's event loop. The rerun publishes a version that verifies."""
    import signal
    import subprocess
    import sys
    import time

    import moto.s3.models

    from tests.helpers import REPO

    put_object = moto.s3.models.S3Backend.put_object

    def slow_put(*args: Any, **kwargs: Any) -> Any:  # a slow store (the server runs in this process's threads)
        time.sleep(0.5)
        return put_object(*args, **kwargs)

    monkeypatch.setattr(moto.s3.models.S3Backend, "put_object", slow_put)
    job = write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "unused"))
    env = {**os.environ, "PACKER_WORK_DIR": str(tmp_path / "work"),
           "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "packer.cli", "build", str(job), "--out", f"s3://{BUCKET}/ctrl-c",
               "--scheduler", "sync"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not _keys(store, "ctrl-c/") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    noise = [word for word in ("Traceback", "Task was destroyed", "Exception ignored", "Error") if word in output]
    assert not noise, output
    assert not any(key.endswith("manifest.json") for key in _keys(store, "ctrl-c/")), output
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    version = next(key.split("/")[1] for key in _keys(store, "ctrl-c/") if key.endswith("manifest.json"))
    assert verify_dataset(f"s3://{BUCKET}/ctrl-c/demo/{version}").ok


@pytest.mark.slow  # moto's S3 server
def test_ctrl_c_while_a_request_is_in_flight_leaves_no_request_running_on_fsspecs_loop(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deterministic half of the test above: a command interrupted while its upload request
    waits on the store exits 130 with no task left on fsspec's event loop (a task left there is
    what Python's shutdown printed as "Task was destroyed but it is pending!" and a traceback)."""
    import _thread
    import asyncio
    import signal
    import threading
    import time

    import click
    import fsspec.asyn
    import moto.s3.models
    from click.testing import CliRunner

    from packer.commands import exits
    from packer.storage import VersionFolder

    put_object = moto.s3.models.S3Backend.put_object

    def slow_put(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)
        return put_object(*args, **kwargs)

    monkeypatch.setattr(moto.s3.models.S3Backend, "put_object", slow_put)
    source = tmp_path / "shard.tar"
    source.write_bytes(b"x" * 1000)

    @click.command()
    @exits
    def upload() -> None:
        VersionFolder(f"s3://{BUCKET}/in-flight/demo/v").upload([source], ["shard.tar"])

    async def pending() -> int:
        return len([task for task in asyncio.all_tasks() if task is not asyncio.current_task()])

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, _thread.interrupt_main).start()
        result = CliRunner().invoke(upload, [])
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert result.exit_code == 130, result.output
    loop = fsspec.asyn.loop[0]
    assert loop is not None
    assert asyncio.run_coroutine_threadsafe(pending(), loop).result(5) == 0


def test_a_missing_object_whose_path_says_bucket_is_not_taken_for_a_missing_bucket() -> None:
    """A missing bucket was told from the word "bucket" anywhere in the error, and s3fs's
    FileNotFoundError for an absent key carries the path: s3://bucket/ds/x (or my-bucket, or a
    prefix named buckets/) read "the bucket does not exist", a config error, for a missing object."""
    from packer.storage import describe_error, storage_error

    missing_key = FileNotFoundError("bucket/datasets/demo/v/manifest.json")
    message = describe_error("s3://bucket/datasets/demo/v/manifest.json", missing_key)
    assert "bucket does not exist" not in message and "not found" in message, message
    assert not isinstance(storage_error("s3://bucket/datasets", missing_key, doing="reading"), ConfigError)
    missing_bucket = FileNotFoundError("The specified bucket does not exist")
    assert "the bucket does not exist" in describe_error("s3://nobucket/x", missing_bucket)
    assert isinstance(storage_error("s3://nobucket/x", missing_bucket, doing="reading"), ConfigError)


@pytest.mark.slow  # moto's S3 server
def test_a_build_to_a_new_prefix_with_bucket_in_its_name_is_not_refused(store: Store, tmp_path: Path) -> None:
    from packer.storage import check_output_store

    check_output_store(f"s3://{BUCKET}/bucket-datasets")  # absent, in a bucket that exists: the build makes it
    with pytest.raises(ConfigError, match="the bucket does not exist"):
        check_output_store("s3://no-such-bucket/bucket-datasets")


@pytest.mark.slow  # moto's S3 server
def test_a_remote_dataset_folder_or_missing_bucket_is_named_as_such_by_the_readers(store: Store) -> None:
    """`packer verify s3://b/datasets/demo/` (the dataset folder, not a version) said the folder
    "holds no file", as it said for a bucket that does not exist; a local dataset folder gets its
    versions listed. Now the URL form does the same, and a missing bucket is named."""
    from packer.manifest import read_manifest

    for version in ("0123456789ab", "ba9876543210"):
        store.client.put_object(Bucket=BUCKET, Key=f"listed/demo/{version}/manifest.json", Body=b"{}")
    store.client.put_object(Bucket=BUCKET, Key="listed/demo/fedcba987654/train-000000.tar", Body=b"half")
    with pytest.raises(ConfigError) as raised:
        read_manifest(f"s3://{BUCKET}/listed/demo/")
    message = str(raised.value)
    assert f"s3://{BUCKET}/listed/demo: a dataset folder, not a version" in message, message
    assert "0123456789ab, ba9876543210" in message and "fedcba987654" not in message, message
    assert f"s3://{BUCKET}/listed/demo/ba9876543210/" in message, message
    with pytest.raises(ConfigError, match="s3://no-such-bucket/x/demo/v.*the bucket does not exist.*create it"):
        read_manifest("s3://no-such-bucket/x/demo/v/")
    half = f"s3://{BUCKET}/listed/demo/fedcba987654/"
    with pytest.raises(IntegrityError) as raised:  # an upload cut off before its manifest: readers refuse it
        read_manifest(half)
    assert "an upload interrupted before its manifest" in str(raised.value), raised.value
    assert "run the same `packer build` again to publish it" in str(raised.value), raised.value


def test_shard_dataset_errors_name_storage_options_not_a_command_line_flag() -> None:
    """ShardDataset is Python: its unreachable-store error told the user to pass
    `--storage-option endpoint_url=...`, a flag of a command they never ran."""
    from packer.loader import ShardDataset

    options = {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s",
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    with pytest.raises(ConfigError) as raised:
        ShardDataset("s3://packer-test/datasets/demo/0123456789ab/manifest.json", "train", storage_options=options)
    message = str(raised.value)
    assert "cannot reach the object store" in message, message
    assert "--storage-option" not in message and "storage_options={'endpoint_url': 'http://HOST:PORT'}" in message, \
        message


@pytest.mark.slow  # moto's S3 server
def test_a_shard_missing_from_the_store_fails_at_once_and_alike_with_and_without_the_shard_cache(
        store: Store, built: Built, tmp_path: Path) -> None:
    """Through the shard cache a deleted object was retried with backoff five times (15 s) as if
    the store were failing, then reported as every sample "unreadable"; streamed, the same shard
    was at once a bad_shard "not found". A missing object is not a failing store: both now fail
    at once, the same way."""
    import time

    from packer.loader import ShardDataset
    from packer.loader.readers import ShardReadError

    prefix = f"missing-shard-{built.fmt}/demo/{built.remote.manifest['version']}/"
    for key in _keys(store, built.prefix):
        store.client.copy_object(Bucket=BUCKET, Key=prefix + key,
                                 CopySource={"Bucket": BUCKET, "Key": built.prefix + key})
    shard = built.remote.manifest["splits"]["train"]["shards"][0]["file"]
    store.client.delete_object(Bucket=BUCKET, Key=prefix + shard)
    url = f"s3://{BUCKET}/{prefix}manifest.json"
    messages = []
    for options in ({}, {"cache_dir": tmp_path / "cache", "read_ahead": 0}, {"cache_dir": tmp_path / "c2"}):
        started = time.monotonic()
        with pytest.raises(ShardReadError) as raised:
            list(ShardDataset(url, "train", shuffle=False, **options))
        assert time.monotonic() - started < 5, (options, raised.value)
        messages.append(str(raised.value))
    assert all("bad_shard" in m and f"s3://{BUCKET}/{prefix}{shard} not found" in m for m in messages), messages


@pytest.mark.slow  # moto's S3 server
def test_verify_of_a_damaged_remote_version_names_a_fix_that_works(store: Store, built: Built) -> None:
    """`packer verify` told the user to "rebuild the version with `packer build`": a rebuild found
    the remote manifest with the same dataset_hash (sizes match: a flipped byte) and uploaded
    nothing, so the version stayed damaged, and then to delete the manifest first. A rebuild now
    checks every object the manifest lists, so the fix it names is the plain rebuild, and doing
    it (publishing) repairs the version."""
    from click.testing import CliRunner

    from packer.cli import main

    url, shard, _ = _corrupt_copy(store, built)
    bad = CliRunner().invoke(main, ["verify", url, "--quiet"])
    assert bad.exit_code == 5, bad.output
    assert "or run the same `packer build` again: it checks every object" in bad.output, bad.output
    remote = url.rsplit("/", 2)[0]
    again = publish_version(built.local.version_dir, remote)  # what a plain rebuild does
    assert not again.skipped and again.repaired == (shard,)
    assert verify_dataset(url).ok


def _flip_object(store: Store, key: str) -> None:
    """Flip one byte in the middle of object ``key``: the same size, other bytes (as a bad disk,
    a botched sync or a hand edit leave it); its ETag changes with its bytes."""
    data = bytearray(_get(store, key))
    data[len(data) // 2] ^= 0x01
    store.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))


def _sibling_version(local: Path, tmp: Path) -> Path:
    """A second version of the dataset of ``local`` whose every shard is byte for byte one of
    ``local``'s: a copy with one config value changed (as a job edit that moves no sample would)
    and its manifest sealed again, so its dataset_hash and version differ."""
    from packer.manifest import seal_manifest

    copy = Path(shutil.copytree(local, tmp / "sibling", copy_function=shutil.copyfile))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["split"]["seed"] = int(manifest["config"]["split"].get("seed", 0)) + 1000
    body = {k: v for k, v in manifest.items() if k not in ("dataset_hash", "version", "created_at")}
    (copy / "manifest.json").write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))
    return copy


@pytest.mark.slow  # moto's S3 server
def test_a_damaged_shard_of_an_earlier_remote_version_is_not_copied_into_the_next_one(
        store: Store, built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new version copies in the store each shard an earlier version lists with the same sha256
    (issue 39: reuse on an object store). With a byte of that earlier object flipped (same size)
    the copy was damaged, and the publish failed with an IntegrityError that blamed the local
    file, on every rebuild: the damage could never be got past. Now the copy is checked (read
    back, as before) and a damaged one is uploaded from the local version instead, with a
    warning that names the earlier object and `packer verify`; the new version verifies."""
    remote = f"s3://{BUCKET}/reuse-{built.fmt}"
    first = publish_version(built.local.version_dir, remote)
    shard = built.local.manifest["splits"]["train"]["shards"][0]["file"]
    _flip_object(store, first.url.split(f"s3://{BUCKET}/", 1)[1] + "/" + shard)
    sibling = _sibling_version(built.local.version_dir, tmp_path)
    result = publish_version(sibling, remote)
    assert not result.skipped and result.repaired == (shard,)
    assert shard not in result.copied and len(result.copied) == len(_listed(built.local.manifest)) - 3
    said = capsys.readouterr().err
    assert f"packer: warning: {first.url}/{shard}" in said and "is damaged" in said, said
    assert f"`packer verify {first.url}`" in said
    report = verify_dataset(result.url)
    assert report.ok, report.problems
    assert not verify_dataset(first.url).ok  # the earlier version is left as it is, for the user to repair


@pytest.mark.slow  # moto's S3 server
def test_repairing_one_object_never_copies_a_damaged_earlier_shard_over_an_intact_one(
        store: Store, built: Built, tmp_path: Path) -> None:
    """v2 shares its shards with v1 (copied in the store). A byte flipped in one of v1's shards
    and in another of v2's own: rebuilding v2 to repair its damaged object also copied v1's
    damaged shard over v2's intact copy, unread, and recorded it as checked, so v2 stayed broken
    and every later rebuild said there was nothing to do."""
    remote = f"s3://{BUCKET}/repair-{built.fmt}"
    first = publish_version(built.local.version_dir, remote)
    sibling = _sibling_version(built.local.version_dir, tmp_path)
    second = publish_version(sibling, remote)
    shards = [s["file"] for split in built.local.manifest["splits"].values() for s in split["shards"]]
    assert len(shards) >= 2 and set(second.copied) >= set(shards[:2])
    _flip_object(store, first.url.split(f"s3://{BUCKET}/", 1)[1] + "/" + shards[0])   # v1's, shared with v2
    _flip_object(store, second.url.split(f"s3://{BUCKET}/", 1)[1] + "/" + shards[1])  # v2's own
    repaired = publish_version(sibling, remote)
    # v2's damaged object may be mended by a copy of v1's intact one; v1's damaged one is never copied
    assert repaired.repaired == (shards[1],) and shards[0] not in repaired.copied
    report = verify_dataset(second.url)
    assert report.ok, report.problems
    assert publish_version(sibling, remote).skipped


@pytest.mark.slow  # moto's S3 server
def test_a_rebuild_finds_a_same_size_damaged_object_of_its_own_remote_version_and_uploads_it_again(
        store: Store, built: Built, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild whose remote manifest has the same dataset_hash compared the objects' sizes only
    and uploaded nothing, so a flipped byte stayed (the README said so, and `packer verify` told
    the user to delete the manifest first). Each listed object is now checked against the local
    version: by its ETag where the store's ETag is the MD5 of its bytes (no download), else read
    back and hashed; only a damaged object is uploaded again, manifest last."""
    remote = f"s3://{BUCKET}/same-{built.fmt}"
    first = publish_version(built.local.version_dir, remote)
    prefix = first.url.split(f"s3://{BUCKET}/", 1)[1] + "/"
    import packer.pipeline.publish as publish

    hashed: list[str] = []  # the local files whose MD5 was compared with an object's ETag

    def counting(etag: str | None, path: Path) -> bool:
        hashed.append(path.name)
        return publish_etag_matches(etag, path)

    publish_etag_matches = publish.etag_matches
    monkeypatch.setattr(publish, "etag_matches", counting)
    requests = S3Requests(monkeypatch)
    again = publish_version(built.local.version_dir, remote)
    assert again.skipped and again.uploaded == () and again.repaired == ()
    # every object has the ETag it had when the first publish read it back: nothing hashed, and no
    # object but the manifest downloaded
    assert hashed == [] and requests.keys("get_object") == {prefix + "manifest.json"}, requests.keys("get_object")
    record = built.local.version_dir.parent / f".published-{built.local.version_dir.name}.json"
    record.unlink()  # another machine, or a work folder cleared: moto's ETags are MD5s, as S3's for one part
    assert publish_version(built.local.version_dir, remote).skipped
    assert sorted(hashed) == sorted(_listed(built.local.manifest))
    assert requests.keys("get_object") == {prefix + "manifest.json"}, requests.keys("get_object")
    hashed.clear()
    shard = built.local.manifest["splits"]["valid"]["shards"][0]["file"]
    _flip_object(store, prefix + shard)
    assert not verify_dataset(first.url).ok
    capsys.readouterr()
    repaired = publish_version(built.local.version_dir, remote)
    assert hashed == [shard]  # the one object whose ETag changed since it was checked
    assert not repaired.skipped and repaired.repaired == (shard,)
    assert repaired.uploaded == (shard, "manifest.json")  # the intact objects stay as they are
    said = capsys.readouterr().err
    assert f"packer: warning: {first.url}/{shard}" in said and "uploaded it again" in said, said
    assert verify_dataset(first.url).ok
    assert _get(store, prefix + shard) == (built.local.version_dir / shard).read_bytes()
