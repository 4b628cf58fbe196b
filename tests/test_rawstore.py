"""Raw inputs behind s3:// URLs (moto's S3 server on 127.0.0.1): listed by the client, fetched
once by the task that decodes them, the same shards as from local paths, bad samples that name
the URL, a cache keyed by size and ETag."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.config import JobConfig, load_job
from packer.errors import ConfigError
from packer.phi import pseudonymizer_for
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import discover
from packer.pipeline.pixels import ChunkTask, process_chunk
from packer.pipeline.rawstore import remote_listing
from packer.records import Issue
from tests.helpers import demo_job_doc, write_job
from tests.s3_store import S3Requests, Store, running_store

pytestmark = pytest.mark.slow  # every test talks to moto's S3 server; some build the demo on a dask cluster
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
s3fs = pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "packer-raw"
#: Files of the demo tree that are neither raw files nor tables.
NOT_READ = ("README.txt", "phi.key")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running



def demo_doc(demo_raw: Any, output: Path, raw: str | None = None) -> dict[str, Any]:
    """The demo job with its sources named; reading the raw tree from ``raw`` (a URL) if given."""
    doc = demo_job_doc(demo_raw.root, output)
    doc["sources"][0]["name"], doc["sources"][1]["name"] = "ct", "photos"
    if raw is not None:
        doc["sources"][0].update(root=f"{raw}/ct", labels=f"{raw}/ct_labels.csv")
        doc["sources"][1].update(root=f"{raw}/photos", table=f"{raw}/photos/labels.csv")
    return doc


def shard_bytes(result: BuildResult) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.version_dir.iterdir())
            if p.name.split("-")[0] in ("train", "valid", "test") or p.name == "_index.parquet"}


@dataclass(frozen=True)
class Builds:
    url: str
    local: BuildResult
    remote: BuildResult
    calls: S3Requests


@pytest.fixture(scope="module")
def builds(store: Store, demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Builds:
    """The demo built from local paths and, in-process with every S3 request recorded, from s3://."""
    tmp = tmp_path_factory.mktemp("raw-s3")
    url = store.upload(demo_raw.root, "demo/raw")
    local = build(load_job(write_job(tmp / "local", demo_doc(demo_raw, tmp / "out-local"))),
                  BuildOptions(scheduler="sync", quiet=True))
    with pytest.MonkeyPatch.context() as patch:
        calls = S3Requests(patch)
        remote = build(load_job(write_job(tmp / "remote", demo_doc(demo_raw, tmp / "out-remote", url))),
                       BuildOptions(scheduler="sync", quiet=True))
    return Builds(url=url, local=local, remote=remote, calls=calls)


def test_s3_inputs_build_the_same_shards_and_bad_samples_as_local_paths(builds: Builds, demo_raw: Any) -> None:
    assert builds.remote.manifest["inputs"] == builds.local.manifest["inputs"]
    assert shard_bytes(builds.remote) == shard_bytes(builds.local)
    assert len(shard_bytes(builds.local)) > 3

    def records(result: BuildResult) -> set[tuple[str, str, str]]:
        return {(i.sample_id, i.stage, i.reason) for i in result.issues}

    assert records(builds.remote) == records(builds.local)
    assert len(builds.remote.issues) == len(demo_raw.defects)
    local_paths = {i.sample_id: Path(i.path) for i in builds.local.issues}
    for issue in builds.remote.issues:
        relpath = local_paths[issue.sample_id].relative_to(demo_raw.root).as_posix()
        assert issue.path == f"{builds.url}/{relpath}"  # the URL, never the fetched copy's path
        assert "packer-fetch-" not in issue.message
    missing = next(i for i in builds.remote.issues if i.reason == "missing_file")
    planted = next(d.relpath for d in demo_raw.defects if d.reason == "missing_file")
    assert (missing.stage, missing.path) == ("discover", f"{builds.url}/{planted}")
    assert missing.path in missing.message
    assert "fetch" in dict(builds.remote.stage_seconds)


def test_each_raw_file_is_fetched_once_and_the_cache_key_costs_no_request(builds: Builds, store: Store) -> None:
    prefix = "demo/raw/"
    objects = {o["Key"] for o in store.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    others = ("targets/", "series/", "nifti/", "annotated/")  # other jobs' sources
    read = {key for key in objects if key[len(prefix):] not in NOT_READ and not key[len(prefix):].startswith(others)}
    fetched = builds.calls.whole_gets()
    assert set(fetched) == read  # the raw files (planted defects included) and the two tables
    assert set(fetched.values()) == {1}
    tables = {prefix + "ct_labels.csv", prefix + "photos/labels.csv"}
    looked_up = [r.key for r in builds.calls.requests if r.method == "head_object" and r.key not in tables]
    # a table may be sized first; a raw file's size and ETag (cache key, size limit) came from the listing,
    # and it is looked up once, after its fetch, to check the copy is of the listed version
    assert sorted(looked_up) == sorted(set(fetched) - tables)
    for key in looked_up:
        kinds = [r.method for r in builds.calls.requests if r.key == key]
        assert kinds.index("head_object") > kinds.index("get_object")
    assert builds.calls.count("list_objects_v2") == 2  # one listing per source


def test_a_rebuild_reuses_unchanged_objects_and_decodes_a_replaced_one(store: Store, demo_raw: Any,
                                                                      tmp_path: Path) -> None:
    url = store.upload(demo_raw.root, "cache/raw")
    job = load_job(write_job(tmp_path, demo_doc(demo_raw, tmp_path / "out", url)))
    options = BuildOptions(scheduler="sync", quiet=True, html_report=False)
    first = build(job, options)
    assert first.files_decoded == first.manifest["inputs"]["files"] - 1  # all but the table row without a file
    again = build(job, options)
    assert again.files_decoded == 0 and again.manifest["dataset_hash"] == first.manifest["dataset_hash"]

    refs = discover(job, pseudonymizer_for(job.phi)).refs
    victim = next(r for r in refs if r.relpath.endswith(".jpg") and r.sample_id in _digests(first))
    key = victim.path.split(f"s3://{BUCKET}/", 1)[1]
    data = bytearray(store.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[-200] ^= 0xFF  # same size, other bytes: only the ETag tells
    store.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    changed = build(job, options)
    assert 1 <= changed.files_decoded < first.files_decoded
    assert _digests(changed).get(victim.sample_id) != _digests(first)[victim.sample_id]
    assert _digests(changed).keys() - {victim.sample_id} == _digests(first).keys() - {victim.sample_id}


def _digests(result: BuildResult) -> dict[str, str]:
    table = pq.read_table(result.version_dir / "_index.parquet", columns=["key", "sha256"]).to_pylist()
    return {row["key"]: row["sha256"] for row in table}


def test_workers_of_a_local_cluster_fetch_the_raw_files_themselves(builds: Builds, demo_raw: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = S3Requests(monkeypatch)  # this process only: the workers are processes of their own
    job = load_job(write_job(tmp_path, demo_doc(demo_raw, tmp_path / "out", builds.url)))
    result = build(job, BuildOptions(workers=2, quiet=True, html_report=False))
    assert result.executor.startswith("local dask cluster, 2 worker")
    assert shard_bytes(result) == shard_bytes(builds.local)
    assert set(calls.whole_gets()) == {"demo/raw/ct_labels.csv", "demo/raw/photos/labels.csv"}
    assert dict(result.stage_seconds).get("fetch", 0.0) > 0.0


def png_bytes(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    return encoded.tobytes()


def photo_job(store: Store, tmp_path: Path, prefix: str, rows: list[str], files: dict[str, bytes],
              **overrides: Any) -> JobConfig:
    """An image source at ``s3://BUCKET/<prefix>`` holding ``files`` and a table of ``rows``."""
    return store.photo_job(tmp_path, prefix, rows, files, **overrides)


def test_an_object_gone_after_discovery_is_a_missing_file_naming_its_url(store: Store, tmp_path: Path) -> None:
    job = photo_job(store, tmp_path, "gone", ["a.png,cat,S1,", "b.png,dog,S2,"],
                    {"a.png": png_bytes(1), "b.png": png_bytes(2)})
    found = discover(job)
    assert [r.path for r in found.refs] == [f"s3://{BUCKET}/gone/a.png", f"s3://{BUCKET}/gone/b.png"]
    store.client.delete_object(Bucket=BUCKET, Key="gone/b.png")
    result = process_chunk(ChunkTask(key="gone", refs=tuple(found.refs), job=job, cache_dir=None,
                                     listed=remote_listing(found.refs, found.listed)))
    assert [s.ref.path for s in result.samples] == [f"s3://{BUCKET}/gone/a.png"]
    (issue,) = result.issues
    assert (issue.stage, issue.reason, issue.path) == ("read", "missing_file", f"s3://{BUCKET}/gone/b.png")
    assert issue.message.startswith(f"s3://{BUCKET}/gone/b.png: ") and "restore it" in issue.message


def test_an_unreachable_store_makes_its_files_unreadable_with_the_fix(store: Store, tmp_path: Path) -> None:
    job = photo_job(store, tmp_path, "unreachable", ["a.png,cat,S1,"], {"a.png": png_bytes(10)})
    found = discover(job)
    options = {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"max_attempts": 1}}}
    result = process_chunk(ChunkTask(key="unreachable", refs=tuple(found.refs), job=job, cache_dir=None,
                                     listed=remote_listing(found.refs, found.listed), storage_options=options))
    (issue,) = result.issues
    assert (issue.stage, issue.reason, issue.path) == ("read", "unreadable", f"s3://{BUCKET}/unreachable/a.png")
    assert issue.message.startswith(f"s3://{BUCKET}/unreachable/a.png: cannot reach the object store")
    assert "--storage-option endpoint_url=" in issue.message and result.samples == ()


def test_the_size_limit_is_checked_from_the_listing_before_anything_is_fetched(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = png_bytes(3)
    job = photo_job(store, tmp_path, "large", ["a.png,cat,S1,"], {"a.png": data},
                    limits={"max_decoded_bytes": len(data) - 1})
    found = discover(job)
    calls = S3Requests(monkeypatch)
    result = process_chunk(ChunkTask(key="large", refs=tuple(found.refs), job=job, cache_dir=None,
                                     listed=remote_listing(found.refs, found.listed)))
    (issue,) = result.issues
    assert (issue.stage, issue.reason, issue.path) == ("read", "too_large", f"s3://{BUCKET}/large/a.png")
    assert f"{len(data)} bytes, over limits.max_decoded_bytes" in issue.message
    assert calls.requests == []  # not even a HEAD: the size came from the listing


def test_extension_less_dicom_objects_are_found_by_their_preamble(store: Store, tmp_path: Path) -> None:
    files = {"a.dcm": b"anything", "IM0001": b"\0" * 128 + b"DICM" + b"rest", "notes": b"hello" * 40,
             "short": b"DICM", ".hidden.dcm": b"x", "sub/.git/x.dcm": b"x", "b.png": b"\0" * 128 + b"DICM"}
    for name, data in files.items():
        store.client.put_object(Bucket=BUCKET, Key=f"preamble/{name}", Body=data)
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": f"s3://{BUCKET}/preamble/"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    job = load_job(write_job(tmp_path, doc))
    assert job.sources[0].name == "preamble"  # the last segment of the URL, as of a folder
    found = discover(job)
    refs, issues = found.refs, found.issues
    assert [(r.relpath, r.path) for r in refs] == [("IM0001", f"s3://{BUCKET}/preamble/IM0001"),
                                                   ("a.dcm", f"s3://{BUCKET}/preamble/a.dcm")]
    assert issues == []


def test_a_webp_object_under_an_image_root_is_left_out_as_unsupported_format_by_its_url(
        store: Store, tmp_path: Path) -> None:
    """Listed by suffix like a local root: a WebP object is no sample, and no silent drop either."""
    for name, data in {"a.png": png_bytes(4), "b.webp": b"RIFF\0\0\0\0WEBPVP8 ", "README.txt": b"hi"}.items():
        store.client.put_object(Bucket=BUCKET, Key=f"webp/{name}", Body=data)
    doc = {"name": "t", "sources": [{"kind": "image", "root": f"s3://{BUCKET}/webp", "label": "none"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    found = discover(load_job(write_job(tmp_path, doc)))
    assert [r.path for r in found.refs] == [f"s3://{BUCKET}/webp/a.png"] and found.issues == []
    assert [(e.path, e.why) for e in found.excluded] == [(f"s3://{BUCKET}/webp/b.webp", "unsupported_format")]
    assert found.excluded[0].detail.startswith("a WebP image (.webp), which packer does not read")

def test_a_row_naming_a_folder_or_an_unlisted_object_says_so_as_for_a_local_root(store: Store,
                                                                                   tmp_path: Path) -> None:
    """The listing of a URL root holds every object under it: a row naming a "folder" (a prefix of
    objects) or an object that is not one of the source's files gets the message a local root's row
    gets, not "does not exist"; a row naming nothing there still does not exist."""
    rows = ["a.png,cat,S1,", "case1,cat,S2,", "notes.txt,cat,S3,", "nothing.png,cat,S4,"]
    job = photo_job(store, tmp_path, "rows", rows, {"a.png": png_bytes(1), "case1/b.png": png_bytes(2),
                                                    "notes.txt": b"hello"})
    found = discover(job)
    said = {Path(i.path).name: i.message for i in found.issues}
    assert {i.reason for i in found.issues} == {"missing_file"} and sorted(said) == ["case1", "notes.txt",
                                                                                    "nothing.png"]
    assert said["case1"].endswith("'case1' is the folder s3://packer-raw/rows/case1, not a file; point the column "
                                  "at a file inside it (e.g. 'case1/b.png')")
    assert "is not one of the source's files" in said["notes.txt"] and "does not exist" not in said["notes.txt"]
    assert said["nothing.png"].endswith(f"s3://{BUCKET}/rows/nothing.png does not exist; fix the row, or, where "
                                        "part of the dataset is not downloaded, set table.missing: drop")


def test_table_paths_leaving_a_url_root_are_rejected_unless_allowed(store: Store, tmp_path: Path) -> None:
    store.client.put_object(Bucket=BUCKET, Key="outside/secret.png", Body=png_bytes(4))
    rows = ["a.png,cat,S1,", "../secret.png,cat,S2,", "../nothing.png,cat,S3,"]
    job = photo_job(store, tmp_path / "reject", "outside/raw", rows, {"a.png": png_bytes(5)})
    found = discover(job)
    refs, issues = found.refs, found.issues
    assert [r.relpath for r in refs] == ["a.png"]
    # the records name where the rows point, as URLs like every other record's path
    assert sorted((i.reason, i.path) for i in issues) == [("outside_root", f"s3://{BUCKET}/outside/nothing.png"),
                                                          ("outside_root", f"s3://{BUCKET}/outside/secret.png")]
    allowed = photo_job(store, tmp_path / "allow", "outside/raw", rows, {}, safety={"outside_root": "allow"})
    found = discover(allowed)
    assert [(r.relpath, r.path) for r in found.refs] == [("../secret.png", f"s3://{BUCKET}/outside/secret.png"),
                                                         ("a.png", f"s3://{BUCKET}/outside/raw/a.png")]
    assert found.listed[f"s3://{BUCKET}/outside/secret.png"].size == len(png_bytes(4))
    assert [(i.reason, i.path) for i in found.issues] == [("missing_file", f"s3://{BUCKET}/outside/nothing.png")]


def test_store_errors_are_config_errors_naming_the_source_and_the_fix(store: Store, tmp_path: Path) -> None:
    doc = {"name": "t", "sources": [{"kind": "dicom", "root": "s3://no-such-bucket/raw"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": "out"}
    with pytest.raises(ConfigError, match=r"sources\.raw\.root: listing .*no-such-bucket.*bucket does not exist"):
        discover(load_job(write_job(tmp_path / "bucket", doc)))
    doc["sources"][0]["root"] = f"s3://{BUCKET}/no/such/prefix"
    with pytest.raises(ConfigError, match=r"sources\.prefix\.root: nothing under s3://packer-raw/no/such/prefix"):
        discover(load_job(write_job(tmp_path / "prefix", doc)))
    job = photo_job(store, tmp_path / "table", "notable", ["a.png,cat,S1,"], {"a.png": png_bytes(6)})
    store.client.delete_object(Bucket=BUCKET, Key="notable/labels.csv")
    with pytest.raises(ConfigError, match=r"notable/labels\.csv: cannot read the table: there is no such object"):
        discover(job)


def test_validate_sends_storage_options_to_the_listing_and_the_fetches(store: Store, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.cli import main

    job = photo_job(store, tmp_path, "options", ["a.png,cat,S1,", "b.png,dog,S2,"],
                    {"a.png": png_bytes(7), "b.png": png_bytes(8)})
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    for quick in ([], ["--quick"]):
        result = CliRunner().invoke(main, ["validate", str(job.job_path), "--scheduler", "sync", "--quiet", *quick,
                                           "--storage-option", f"endpoint_url={store.endpoint}"])
        assert result.exit_code == 0, result.output  # a file the workers could not fetch would be bad: exit 3


def test_a_remote_ref_gets_its_url_back_on_every_record(store: Store, tmp_path: Path) -> None:
    job = photo_job(store, tmp_path, "records", ["a.png,cat,S1,", "b.png,dog,S2,"],
                    {"a.png": png_bytes(9), "b.png": b"\x89PNG\r\n\x1a\n" + b"\0" * 40})
    found = discover(job)
    task = ChunkTask(key="records", refs=tuple(found.refs), job=job, cache_dir=str(tmp_path / "cache"),
                     listed=remote_listing(found.refs, found.listed))
    (tmp_path / "cache").mkdir()
    for result in (process_chunk(task), process_chunk(replace(task, decode=False)), process_chunk(task)):
        paths = [s.ref.path for s in result.samples] + [i.path for i in result.issues]
        assert sorted(paths) == [f"s3://{BUCKET}/records/a.png", f"s3://{BUCKET}/records/b.png"]
        assert all("packer-fetch-" not in i.message for i in result.issues)
        assert all(isinstance(i, Issue) and i.stage == "read" for i in result.issues)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full (Linux) gives real ENOSPC writes")
def test_a_full_temporary_folder_stops_the_run_instead_of_blaming_the_objects(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    import packer.pipeline.rawstore
    from packer.errors import FileSystemError

    job = photo_job(store, tmp_path, "fulltmp", ["a.png,cat,S1,"], {"a.png": png_bytes(3)})
    found = discover(job)
    folder = tmp_path / "tmp"
    folder.mkdir()
    (folder / "raw.png").symlink_to("/dev/full")  # where the fetched copy goes: every write is ENOSPC

    @contextlib.contextmanager
    def full_temporary_directory(**_: Any) -> Iterator[str]:
        yield str(folder)

    monkeypatch.setattr(packer.pipeline.rawstore.tempfile, "TemporaryDirectory", full_temporary_directory)
    with pytest.raises(FileSystemError, match=f"cannot write the local copy of s3://{BUCKET}/fulltmp/a.png in "
                                              f"{folder}: the file system is full .*point TMPDIR at a folder"):
        process_chunk(ChunkTask(key="fulltmp", refs=tuple(found.refs), job=job, cache_dir=None,
                                listed=remote_listing(found.refs, found.listed)))


# -- http(s):// roots: fsspec's HTTPFileSystem over a folder served by http.server ------------------
class _Served(http.server.SimpleHTTPRequestHandler):
    """http.server on a folder; ``faults`` (by file name) make a GET answer ``500``, send half the
    body (``cut``) or half the body and then nothing for 3 s (``stall``), answer without a
    Content-Length, the body ending where the connection closes (``unsized``), or with another
    ETag each time, as backends behind a load balancer do (``retagged``)."""

    faults: dict[str, str] = {}
    answers = itertools.count()

    def log_message(self, *args: Any) -> None:
        pass

    def send_header(self, keyword: str, value: str) -> None:
        fault = self.faults.get(self.path.rsplit("/", 1)[-1])
        if fault == "unsized" and keyword.lower() == "content-length":
            return
        if fault == "retagged" and keyword.lower() == "last-modified":
            super().send_header("ETag", f'"backend{next(self.answers)}"')
        super().send_header(keyword, value)

    def do_GET(self) -> None:
        fault = self.faults.get(self.path.rsplit("/", 1)[-1])
        if fault == "500":
            self.send_error(500)
            return
        if fault in ("cut", "stall"):
            data = Path(self.translate_path(self.path)).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            if fault == "stall":
                time.sleep(3)
            self.close_connection = True
            return
        super().do_GET()


@contextlib.contextmanager
def serving(folder: Path, faults: dict[str, str] | None = None) -> Iterator[str]:
    """``folder`` served over http on 127.0.0.1 while the block runs; yields its URL (with a slash)."""
    handler = type("Handler", (_Served,), {"faults": faults or {},
                                           "__init__": lambda self, *a, **k: _Served.__init__(
                                               self, *a, directory=str(folder), **k)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def http_job(tmp_path: Path, url: str, **overrides: Any) -> JobConfig:
    """An image source labelled by folder at the http(s) URL ``url``."""
    doc = {"name": "t", "sources": [{"kind": "image", "root": url, "label": "folder"}],
           "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"), **overrides}
    return load_job(write_job(tmp_path / "job", doc))


def photo_folder(folder: Path, names: dict[str, int]) -> Path:
    """``folder`` holding a PNG (:func:`png_bytes` of the seed) at each relative path of ``names``."""
    for name, seed in names.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(png_bytes(seed))
    return folder


def test_an_http_file_without_a_content_length_or_with_a_tag_per_answer_is_decoded_not_called_changed(
        tmp_path: Path) -> None:
    """The fetch checks a copy against the listing on object stores, not on an http(s) server: a
    response without Content-Length lists as 0 bytes, and a tag that differs on every answer
    names a backend's copy, not the bytes. Each such file was a missing_file record ('the
    object changed after discovery listed it')."""
    raw = photo_folder(tmp_path / "raw", {"cat/plain.png": 1, "cat/unsized.png": 2, "dog/retagged.png": 3})
    with serving(raw, {"unsized.png": "unsized", "retagged.png": "retagged"}) as url:
        job = http_job(tmp_path, url)
        found = discover(job)
        assert {f.relpath: found.listed[f.path].size for f in found.refs}["cat/unsized.png"] == 0
        result = process_chunk(ChunkTask(key="http", refs=tuple(found.refs), job=job, cache_dir=None,
                                         listed=remote_listing(found.refs, found.listed)))
    assert result.issues == ()
    assert sorted(s.ref.relpath for s in result.samples) == ["cat/plain.png", "cat/unsized.png", "dog/retagged.png"]


def test_an_http_file_that_answers_500_is_cut_short_or_stalls_is_an_unreadable_bad_sample(tmp_path: Path) -> None:
    """aiohttp's errors (a 500, a body shorter than its Content-Length) escaped the fetch as a
    crash of the build; a server that stops sending mid-body is cut off by the read timeout."""
    raw = photo_folder(tmp_path / "raw", {"cat/ok.png": 1, "cat/e500.png": 2, "dog/cut.png": 3, "dog/stall.png": 4})
    faults = {"e500.png": "500", "cut.png": "cut", "stall.png": "stall"}
    with serving(raw, faults) as url:
        job = http_job(tmp_path, url)
        found = discover(job)
        result = process_chunk(ChunkTask(key="http", refs=tuple(found.refs), job=job, cache_dir=None,
                                         listed=remote_listing(found.refs, found.listed),
                                         storage_options={"client_kwargs": {"timeout": {"sock_read": 1}}}))
    assert [s.ref.path for s in result.samples] == [f"{url}cat/ok.png"]
    assert sorted((i.path, i.reason) for i in result.issues) == [
        (f"{url}cat/e500.png", "unreadable"), (f"{url}dog/cut.png", "unreadable"),
        (f"{url}dog/stall.png", "unreadable")]
    assert all(i.message.endswith("the file was not fetched") for i in result.issues)


def test_files_under_an_http_root_keep_their_real_names_and_s3_keys_stay_literal(store: Store,
                                                                                 tmp_path: Path) -> None:
    """An http listing's links are percent-encoded: ``a b.png`` was listed as ``a%20b.png`` (a new
    sample id, a table row that named no file). The names are decoded for http(s) only: an S3 key
    holding ``%20`` is that text."""
    from packer.pipeline.rawstore import list_remote_files

    names = {"cat/a b.png": 1, "cat/c#1.png": 2, "dog/d%20e.png": 3, "dog/plain.png": 4}
    raw = photo_folder(tmp_path / "raw", names)
    with serving(raw) as url:
        job = http_job(tmp_path, url)
        found = discover(job)
        assert sorted(r.relpath for r in found.refs) == sorted(names)
        result = process_chunk(ChunkTask(key="names", refs=tuple(found.refs), job=job, cache_dir=None,
                                         listed=remote_listing(found.refs, found.listed)))
    assert result.issues == () and len(result.samples) == len(names)  # each fetched by its encoded URL
    store.client.put_object(Bucket=BUCKET, Key="literal/d%20e.png", Body=png_bytes(5))
    assert [f.relpath for f in list_remote_files(f"s3://{BUCKET}/literal")] == ["d%20e.png"]


def test_an_http_listing_takes_each_files_size_and_version_from_its_headers(tmp_path: Path) -> None:
    """An index page gives links only: every file had size 0 and version "", so a file replaced
    by one of the same size was never decoded again. Each file's HEAD gives its Content-Length
    and Last-Modified (or ETag) instead."""
    import os

    from packer.pipeline.rawstore import list_remote_files

    raw = photo_folder(tmp_path / "raw", {"cat/a.png": 1, "dog/b.png": 2})
    with serving(raw) as url:
        before = {f.relpath: f.stat for f in list_remote_files(url)}
        assert {rel: stat.size for rel, stat in before.items()} == {"cat/a.png": len(png_bytes(1)),
                                                                    "dog/b.png": len(png_bytes(2))}
        assert all(stat.version.startswith("Last-Modified:") for stat in before.values())
        replaced = raw / "cat/a.png"
        replaced.write_bytes(bytes(reversed(replaced.read_bytes())))  # same size, other bytes, a later time
        os.utime(replaced, (replaced.stat().st_atime, replaced.stat().st_mtime + 10))
        after = {f.relpath: f.stat for f in list_remote_files(url)}
    assert after["cat/a.png"].size == before["cat/a.png"].size
    assert after["cat/a.png"].version != before["cat/a.png"].version
    assert after["dog/b.png"] == before["dog/b.png"]
