"""What every shard writer shares: the records a write returns (files are written with
:func:`packer.files.atomic_output`)."""

from __future__ import annotations

import builtins
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardWrite:
    """What writing one shard produced: file name (relative), size and sha256, and for each
    sample in the order written its ``position`` (the tar offset of its first member, or its
    Parquet row number), the size of its packed pixel bytes (the ``.npy`` member for tar, the
    ``image`` cell for Parquet), their sha256 (32 raw bytes a sample in ``digests``) and the
    checksum of all its packed members (:mod:`packer.shards.checksum`, uint64 in ``checksums``).

    Columnar on purpose: the client holds one per shard for the whole build, so a sample
    costs it 56 bytes here; everything else an index row needs, its shard plan already has.
    """

    file: str
    bytes: int
    sha256: str
    positions: array
    sizes: array
    digests: builtins.bytes  # the field ``bytes`` shadows the builtin inside this class
    #: Each sample's checksum (:mod:`packer.shards.checksum`), in the order written (typecode ``Q``)
    checksums: array
    seconds: float = 0.0
    #: The planned shard's content key (:mod:`packer.pipeline.reuse`), recorded in its manifest
    #: entry so that a later build finds it; "" where none could be made (nothing is recorded)
    content_key: str = ""
    #: How the file came from an earlier version instead of being written (``reflink``,
    #: ``hardlink``, ``copy``: :func:`packer.files.clone_file`); "" when it was written
    reused: str = ""
    #: Why an earlier version's file was not reused though its content key matched (its bytes
    #: no longer match its manifest's sha256): a warning for the build to print; "" otherwise
    refused: str = ""

    @property
    def samples(self) -> int:
        return len(self.positions)

    def digest(self, index: int) -> str:
        """The hex sha256 of sample ``index``'s packed pixel bytes."""
        return self.digests[32 * index:32 * index + 32].hex()

    def to_entry(self) -> dict[str, object]:
        """The shard's entry in the manifest."""
        entry: dict[str, object] = {"file": self.file, "bytes": self.bytes, "sha256": self.sha256,
                                    "samples": self.samples}
        if self.content_key:
            entry["content_key"] = self.content_key
        return entry


class WrittenSamples:
    """Collects a shard's per-sample columns while a writer streams it (see :class:`ShardWrite`)."""

    def __init__(self) -> None:
        self.positions = array("q")
        self.sizes = array("q")
        self.checksums = array("Q")
        self._digests = bytearray()

    def add(self, *, position: int, size: int, sha256: builtins.bytes, checksum: int) -> None:
        """One sample: its position, packed size, raw 32-byte sha256 digest and checksum."""
        self.positions.append(position)
        self.sizes.append(size)
        self._digests += sha256
        self.checksums.append(checksum)

    def result(self, *, file: str, size: int, sha256: str) -> ShardWrite:
        return ShardWrite(file=file, bytes=size, sha256=sha256, positions=self.positions, sizes=self.sizes,
                          digests=bytes(self._digests), checksums=self.checksums)
