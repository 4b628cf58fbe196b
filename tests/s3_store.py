"""moto's S3 server on 127.0.0.1 for the tests that read or write s3:// URLs."""

from __future__ import annotations

import collections
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from packer.config import JobConfig, load_job
from tests.helpers import write_job


@dataclass(frozen=True)
class Store:
    endpoint: str
    client: Any  # a boto3 S3 client for the server, to set up and inspect objects behind packer's back
    bucket: str

    def upload(self, root: Path, prefix: str) -> str:
        """Every file under ``root`` to ``s3://<bucket>/<prefix>/<relpath>``; returns that URL."""
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self.client.put_object(Bucket=self.bucket, Key=f"{prefix}/{path.relative_to(root).as_posix()}",
                                   Body=path.read_bytes())
        return f"s3://{self.bucket}/{prefix}"

    def photo_job(self, tmp_path: Path, prefix: str, rows: list[str], files: dict[str, bytes],
                  **overrides: Any) -> JobConfig:
        """A job over an image source at ``s3://<bucket>/<prefix>`` holding ``files`` and a table
        ``labels.csv`` of ``rows`` (path, label, entity, timestamp), its output under ``tmp_path``."""
        for name, data in files.items():
            self.client.put_object(Bucket=self.bucket, Key=f"{prefix}/{name}", Body=data)
        table = "\n".join(["path,label,entity,timestamp", *rows]) + "\n"
        self.client.put_object(Bucket=self.bucket, Key=f"{prefix}/labels.csv", Body=table.encode())
        doc = {"name": "t", "sources": [{"kind": "image", "root": f"s3://{self.bucket}/{prefix}",
                                         "table": f"s3://{self.bucket}/{prefix}/labels.csv"}],
               "split": {"by": "entity"}, "pack": {"format": "webdataset"}, "output": str(tmp_path / "out"),
               **overrides}
        return load_job(write_job(tmp_path, doc))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_store(scratch: Path, bucket: str) -> Iterator[Store]:
    """moto's S3 server with one bucket; while it runs, the AWS_* variables point at it (and at
    no credentials or config file of the machine). ``scratch``: an empty folder."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
    boto3 = pytest.importorskip("boto3", reason="boto3 comes with moto[server]")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    empty = scratch / "none"
    try:
        with pytest.MonkeyPatch.context() as env:
            for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                                "AWS_CONFIG_FILE": str(empty), "AWS_SHARED_CREDENTIALS_FILE": str(empty),
                                "AWS_EC2_METADATA_DISABLED": "true"}.items():
                env.setenv(name, value)
            env.delenv("AWS_PROFILE", raising=False)
            client = boto3.client("s3", endpoint_url=endpoint)
            client.create_bucket(Bucket=bucket)
            yield Store(endpoint=endpoint, client=client, bucket=bucket)
    finally:
        server.stop()


@dataclass
class S3Request:
    method: str
    key: str
    ranged: bool
    body_bytes: int = 0  # a get_object's ContentLength, once it answered


class S3Requests:
    """Every S3 request s3fs makes in this process (not in worker processes), in order,
    recorded before it is sent (so a request that fails counts too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        s3fs = pytest.importorskip("s3fs", reason="s3fs (the dev extra) reads s3:// URLs")
        self.requests: list[S3Request] = []
        original = s3fs.S3FileSystem._call_s3

        async def recording(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            request = S3Request(method, kwargs.get("Key", ""), "Range" in kwargs)
            self.requests.append(request)
            response = await original(fs, method, *args, **kwargs)
            if method == "get_object":
                request.body_bytes = int(response["ContentLength"])
            return response

        monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", recording)

    def count(self, method: str) -> int:
        return sum(1 for r in self.requests if r.method == method)

    def keys(self, method: str) -> set[str]:
        return {r.key for r in self.requests if r.method == method}

    def gets(self, key: str) -> list[S3Request]:
        """The GetObject requests for ``key``, in order."""
        return [r for r in self.requests if r.method == "get_object" and r.key == key]

    def whole_gets(self) -> collections.Counter[str]:
        """Un-ranged GetObject requests per key: whole-object fetches."""
        return collections.Counter(r.key for r in self.requests if r.method == "get_object" and not r.ranged)

    def fetched(self, key: str) -> int:
        """Bytes of ``key`` that GetObject responses carried."""
        return sum(r.body_bytes for r in self.gets(key))
