"""moto's S3 server on 127.0.0.1 for the tests that read or write s3:// URLs."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class Store:
    endpoint: str
    client: Any  # a boto3 S3 client for the server, to set up and inspect objects behind packer's back


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
            yield Store(endpoint=endpoint, client=client)
    finally:
        server.stop()
