"""Walking a URL root finds what walking the same tree on local disk finds: folders (and the
zero-byte objects that stand for them) are never files, a root that names one object is
refused as a file is, and a label table's cells name objects under the root as a local
table's paths name files under a local root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from packer.config import load_job
from packer.pipeline.discover import discover
from packer.pipeline.rawstore import list_remote_files
from tests.helpers import write_job
from tests.s3_store import Store, running_store

pytestmark = pytest.mark.slow  # every test talks to moto's S3 server
pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")

BUCKET = "walk"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with running_store(tmp_path_factory.mktemp("aws"), BUCKET) as running:
        yield running


def png_bytes(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    return encoded.tobytes()


def job_for(tmp_path: Path, source: dict[str, Any], **overrides: Any) -> Any:
    doc = {"name": "t", "sources": [source], "split": {"by": "entity"}, "pack": {"format": "webdataset"},
           "output": str(tmp_path / "out"), **overrides}
    return load_job(write_job(tmp_path, doc))


def test_folder_marker_objects_are_folders_not_empty_files(store: Store, tmp_path: Path) -> None:
    """``ct/pat0/`` (a zero-byte object whose key ends in ``/``, as the S3 console's "Create
    folder" and sync tools write) is a folder: it is neither listed nor excluded as an empty
    file, and a folder holding only its marker holds no file."""
    for patient in range(3):
        store.client.put_object(Bucket=BUCKET, Key=f"markers/pat{patient}/", Body=b"")
        store.client.put_object(Bucket=BUCKET, Key=f"markers/pat{patient}/IM0001",
                                Body=b"\0" * 128 + b"DICM" + b"rest")
    store.client.put_object(Bucket=BUCKET, Key="markers/", Body=b"")
    store.client.put_object(Bucket=BUCKET, Key="markers/empty/", Body=b"")
    listed = list_remote_files(f"s3://{BUCKET}/markers")
    assert [f.relpath for f in listed] == ["pat0/IM0001", "pat1/IM0001", "pat2/IM0001"]
    found = discover(job_for(tmp_path, {"kind": "dicom", "name": "ct", "root": f"s3://{BUCKET}/markers"}))
    assert [e.path for e in found.excluded if not e.path.endswith("IM0001")] == []
