"""Write WebDataset tar shards byte-reproducibly.

Members are ``<key>.cls``, ``<key>.json``, ``<key>.npy`` per sample, samples in the order
given (the plan sorts them), with mtime 0, uid/gid 0, empty user/group names and mode
0o644, in the POSIX ustar format (no PAX headers, so no timestamps sneak in). The file is
written to a temporary name, fsynced and renamed, so a reader never sees a partial shard.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from packer.pack.encode import EncodedSample, canonical_json, encode_npy
from packer.pack.writer import ShardWrite, WrittenSamples, atomic_output


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``target``."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        view = memoryview(data)
        self._target.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def sample_members(sample: EncodedSample) -> list[tuple[str, bytes]]:
    """The (member name, bytes) of one sample, in the sorted order they are written."""
    import numpy as np

    array = np.frombuffer(sample.pixels, dtype=np.dtype(sample.dtype)).reshape(sample.shape)
    return [
        (f"{sample.key}.cls", str(sample.label).encode()),
        (f"{sample.key}.json", canonical_json(sample.info)),
        (f"{sample.key}.npy", encode_npy(array)),
    ]


def write_tar_shard(path: Path, samples: Iterable[EncodedSample]) -> ShardWrite:
    """Stream ``samples`` into the tar shard ``path``; return its size, sha256 and, per sample,
    the tar offset of its first member header and the size and sha256 of its ``.npy`` member.
    """
    written = WrittenSamples()
    with atomic_output(path) as raw:
        hashing = _HashingWriter(raw)
        with tarfile.open(fileobj=hashing, mode="w", format=tarfile.USTAR_FORMAT) as tar:  # type: ignore[call-overload]
            for sample in samples:
                offset = hashing.size
                members = sample_members(sample)
                for name, data in members:
                    tar.addfile(_member(name, len(data)), io.BytesIO(data))
                npy = members[-1][1]
                written.add(position=offset, size=len(npy), sha256=hashlib.sha256(npy).digest())
        size = hashing.size
        digest = hashing.sha256.hexdigest()
    return written.result(file=path.name, size=size, sha256=digest)


def read_tar_members(path: Path) -> list[str]:
    """Member names of a tar shard, in order (used by tests and ``verify``)."""
    with tarfile.open(path, mode="r:") as tar:
        return [m.name for m in tar.getmembers()]

