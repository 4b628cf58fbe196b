"""Write WebDataset tar shards byte-reproducibly.

Members are ``<key>.cls``, ``<key>.json``, ``<key>.npy`` per sample, samples in the order
given (the plan sorts them), with mtime 0, uid/gid 0, empty user/group names and mode
0o644, in the POSIX ustar format (no PAX headers, so no timestamps sneak in). The file is
written to a temporary name, fsynced and renamed, so a reader never sees a partial shard.

The bytes are those :mod:`tarfile` writes for these members (``tarfile.open(mode="w",
format=USTAR_FORMAT)`` and ``addfile``; the tests compare the two), but the writer streams
each member's pieces straight to the file: a pixel array goes out as the ``numpy.save``
header followed by the array's own buffer, with no ``BytesIO``, ``np.save`` or
``copyfileobj`` copy in between. Headers of names up to 100 bytes are built here;
longer names (split into ustar prefix and name) get :mod:`tarfile`'s own header.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from packer.files import atomic_output, canonical_json
from packer.shards.encode import EncodedSample
from packer.shards.writer import ShardWrite, WrittenSamples

BLOCK = tarfile.BLOCKSIZE  # 512: headers and member data are padded to whole blocks
RECORD = tarfile.RECORDSIZE  # 10240: the archive ends with two zero blocks, padded to a record
_ZEROS = bytes(RECORD)
_NAME_FIELD = 100
_SIZE_LIMIT = 8 ** 11  # the ustar size field holds 11 octal digits


class _HashingWriter:
    """Writes to ``target`` while hashing and counting everything that passes."""

    def __init__(self, target: BinaryIO) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        self._target.write(data)
        self.sha256.update(data)
        self.size += len(data)


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def member_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular member ``name`` holding ``size`` bytes, with
    packer's fixed fields; the same bytes as ``tarfile``'s ``TarInfo.tobuf(USTAR_FORMAT)``.
    Raises ValueError where ustar cannot hold the member (a name with no fitting
    prefix/name split, a size of 8 GiB or more), as ``tarfile`` does."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > _NAME_FIELD or size >= _SIZE_LIMIT or size < 0:
        return _member(name, size).tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    block = bytearray(BLOCK)
    block[0:len(encoded)] = encoded
    block[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
    block[124:136] = b"%011o\x00" % size
    block[136:148] = b"00000000000\x00"  # mtime
    block[148:156] = b"        "  # the checksum counts its own field as spaces
    block[156] = ord(tarfile.REGTYPE)
    block[257:265] = tarfile.POSIX_MAGIC
    block[148:155] = b"%06o\x00" % sum(block)
    return bytes(block)


@functools.lru_cache(maxsize=64)
def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The bytes ``numpy.save`` writes before the data of a C-contiguous ``shape`` × ``dtype``
    array (format 1.0, or 2.0 when the header does not fit 1.0's 16-bit length)."""
    fields = {"descr": npy_format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    buffer = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buffer, fields)
    except ValueError:  # numpy.save moves to format 2.0 when the header outgrows 1.0
        buffer = io.BytesIO()
        npy_format.write_array_header_2_0(buffer, fields)
    return buffer.getvalue()


def sample_members(sample: EncodedSample) -> list[tuple[str, Sequence[bytes | memoryview]]]:
    """The (member name, pieces of its bytes) of one sample, in the sorted order they are
    written: ``.cls`` (the label index), ``.json`` (the sample record) and ``.npy`` (the
    ``numpy.save`` bytes of the pixels: header, then the raw C-order buffer)."""
    header = npy_header(tuple(sample.shape), sample.dtype)
    return [
        (f"{sample.key}.cls", (str(sample.label).encode(),)),
        (f"{sample.key}.json", (canonical_json(sample.info),)),
        (f"{sample.key}.npy", (header, sample.pixels)),
    ]


def write_tar_shard(path: Path, samples: Iterable[EncodedSample]) -> ShardWrite:
    """Stream ``samples`` into the tar shard ``path``; return its size, sha256 and, per sample,
    the tar offset of its first member header and the size and sha256 of its ``.npy`` member.
    """
    written = WrittenSamples()
    with atomic_output(path) as raw:
        out = _HashingWriter(raw)
        for sample in samples:
            offset = out.size
            members = sample_members(sample)
            for name, pieces in members:
                size = sum(len(piece) for piece in pieces)
                out.write(member_header(name, size))
                for piece in pieces:
                    out.write(piece)
                if size % BLOCK:
                    out.write(_ZEROS[:BLOCK - size % BLOCK])
            npy = members[-1][1]  # the .npy member is the last one
            npy_digest = hashlib.sha256()
            for piece in npy:
                npy_digest.update(piece)
            written.add(position=offset, size=sum(len(piece) for piece in npy), sha256=npy_digest.digest())
        out.write(_ZEROS[:2 * BLOCK])
        if out.size % RECORD:
            out.write(_ZEROS[:RECORD - out.size % RECORD])
        size = out.size
        digest = out.sha256.hexdigest()
    return written.result(file=path.name, size=size, sha256=digest)


def read_tar_members(path: Path) -> list[str]:
    """Member names of a tar shard, in order (used by tests and ``verify``)."""
    with tarfile.open(path, mode="r:") as tar:
        return [m.name for m in tar.getmembers()]
