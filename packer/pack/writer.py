"""What every shard writer shares: atomic file output and the records a write returns."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packer.errors import ConfigError, blocking_file, refused_write

TMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class ShardWrite:
    """What writing one shard produced: file name (relative), size and sha256, and for each
    sample in the order written its ``position`` (the tar offset of its first member, or its
    Parquet row number), the size of its packed pixel bytes (the ``.npy`` member for tar, the
    ``image`` cell for Parquet) and their sha256 (32 raw bytes a sample in ``digests``).

    Columnar on purpose: the client holds one per shard for the whole build, so a sample
    costs it 48 bytes here; everything else an index row needs, its shard plan already has.
    """

    file: str
    bytes: int
    sha256: str
    positions: array
    sizes: array
    digests: builtins.bytes  # the field ``bytes`` shadows the builtin inside this class
    seconds: float = 0.0

    @property
    def samples(self) -> int:
        return len(self.positions)

    def digest(self, index: int) -> str:
        """The hex sha256 of sample ``index``'s packed pixel bytes."""
        return self.digests[32 * index:32 * index + 32].hex()

    def to_entry(self) -> dict[str, object]:
        """The shard's entry in the manifest."""
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256, "samples": self.samples}


class WrittenSamples:
    """Collects a shard's per-sample columns while a writer streams it (see :class:`ShardWrite`)."""

    def __init__(self) -> None:
        self.positions = array("q")
        self.sizes = array("q")
        self._digests = bytearray()

    def add(self, *, position: int, size: int, sha256: builtins.bytes) -> None:
        """One sample: its position, packed size and raw 32-byte sha256 digest."""
        self.positions.append(position)
        self.sizes.append(size)
        self._digests += sha256

    def result(self, *, file: str, size: int, sha256: str) -> ShardWrite:
        return ShardWrite(file=file, bytes=size, sha256=sha256, positions=self.positions, sizes=self.sizes,
                          digests=bytes(self._digests))


@contextlib.contextmanager
def atomic_output(path: Path, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Open ``path.partial`` for writing; on success fsync and rename it to ``path``.

    On failure the temporary file is removed, so ``path`` is either absent or complete.
    ``durable=False`` skips both fsyncs: for files whose reader verifies them and redoes the
    work when a crash left them damaged (the spill cache), not for outputs.

    A full, read-only or over-quota file system (and, creating the file, a refused permission)
    raises :class:`packer.errors.FileSystemError` naming ``path`` and the fix, from the OSError;
    a file where one of its folders must be raises :class:`packer.errors.ConfigError` naming it.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(tmp, "wb")  # noqa: SIM115 - closed below, inside the same try
    except (FileExistsError, NotADirectoryError) as err:  # a file stands where a folder must be
        raise ConfigError(f"cannot write {path}: {blocking_file(path.parent) or path.parent} is a file, not a "
                          "folder; remove it, or write elsewhere") from err
    except OSError as err:
        refused = refused_write(err, path, opening=True)
        if refused is None:
            raise
        raise refused from err
    try:
        with fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and (refused := refused_write(err, path)) is not None:
            raise refused from err
        raise
    if durable:
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
