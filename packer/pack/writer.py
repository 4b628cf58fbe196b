"""What every shard writer shares: atomic file output and the records a write returns."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

TMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class IndexRow:
    """One sample's place in the packed dataset (a row of ``_index.parquet``).

    ``position`` is the tar offset of the sample's first member, or its Parquet row number.
    ``sha256`` hashes the sample's packed pixel bytes (the ``.npy`` member for tar, the
    ``image`` cell for Parquet).
    """

    key: str
    split: str
    shard: str
    position: int
    bytes: int
    sha256: str
    label: int
    entity_id: str
    source: str


@dataclass(frozen=True)
class ShardWrite:
    """What writing one shard produced: file name (relative), size, sha256 and index rows."""

    file: str
    bytes: int
    sha256: str
    rows: tuple[IndexRow, ...]
    seconds: float = 0.0

    def to_entry(self) -> dict[str, object]:
        """The shard's entry in the manifest."""
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256, "samples": len(self.rows)}


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """Open ``path.partial`` for writing; on success fsync and rename it to ``path``.

    On failure the temporary file is removed, so ``path`` is either absent or complete.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> tuple[int, str]:
    """Size and sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
