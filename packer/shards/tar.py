"""Write WebDataset tar shards byte-reproducibly, and read them back.

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

Reading (packer's loader and HTML report; ``packer verify --deep`` keeps stock ``tarfile`` as
its independent check): :func:`scan_tar` walks a shard's headers, seeking past the data, into a
:class:`TarIndex` of member offsets (``tarfile`` walks any shard not laid out as packer writes
it); :func:`read_tar_sample` then decodes one sample with positional reads, the pixels copied
once into the image (or none, from a memory map). :func:`stream_tar_samples`
reads a shard front to back from a non-seekable stream (a remote store), and
:func:`read_sample_at` one sample at the offset ``_index.parquet`` records. Every reader
refuses the member names :func:`~packer.shards.members.parse_member_name` refuses and never
extracts anything to disk.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, BinaryIO, Protocol

import numpy as np

from packer.files import atomic_output, canonical_json
from packer.shards.checksum import SampleHasher, fields_checksum, members_checksum
from packer.shards.encode import EncodedSample, pixels_digest
from packer.shards.members import (
    MEMBER_NAME,
    NPY_HEAD,
    SMALL_MEMBERS,
    Decoded,
    SampleDefect,
    decode_members,
    decode_small_members,
    irregular_member,
    npy_header,
    npy_layout,
    npy_size_problem,
    parse_member_name,
)
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


def member_bytes(size: int) -> int:
    """The bytes a member holding ``size`` bytes of data takes in a tar shard: its 512-byte
    header, then the data padded to a whole block (:func:`write_tar_shard`)."""
    return BLOCK + -(-size // BLOCK) * BLOCK


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes ``numpy.save`` writes for ``array`` (C order): :func:`npy_header`, then the data."""
    array = np.ascontiguousarray(array)
    return npy_header(tuple(array.shape), array.dtype.str) + array.tobytes()


def sample_members(sample: EncodedSample) -> list[tuple[str, Sequence[bytes | memoryview]]]:
    """The (member name, pieces of its bytes) of one sample, in the order they are written:
    ``.cls`` (the class index; only with a class target), ``.json`` (the sample record), ``.npy``
    (the ``numpy.save`` bytes of the pixels: header, then the raw C-order buffer) and
    ``.mask.npy`` (the segmentation mask, ``numpy.save`` bytes; only with masks) and
    ``.target.npy`` (the multi-label or numeric target vector; only with one) and
    ``.target_mask.npy`` (its uint8 mask; only with a masked target)."""
    header = npy_header(tuple(sample.shape), sample.dtype)
    members: list[tuple[str, Sequence[bytes | memoryview]]] = []
    if sample.label is not None:
        members.append((f"{sample.key}.cls", (str(sample.label).encode(),)))
    members += [
        (f"{sample.key}.json", (canonical_json(sample.info),)),
        (f"{sample.key}.npy", (header, sample.pixels)),
    ]
    if sample.mask is not None:
        members.append((f"{sample.key}.mask.npy", (sample.mask,)))
    if sample.target is not None:
        members.append((f"{sample.key}.target.npy", (npy_bytes(sample.target),)))
    if sample.target_mask is not None:
        members.append((f"{sample.key}.target_mask.npy", (npy_bytes(sample.target_mask),)))
    return members


def write_tar_shard(path: Path, samples: Iterable[EncodedSample],
                    after_each: Callable[[EncodedSample], None] | None = None) -> ShardWrite:
    """Stream ``samples`` into the tar shard ``path``; return its size, sha256 and, per sample,
    the tar offset of its first member header, the size and sha256 of its ``.npy`` member
    (a sample's ``known_sha256`` where it has one: :func:`~packer.shards.encode.pixels_digest`)
    and the checksum of all its members (:mod:`packer.shards.checksum`, hashed as they are written).

    ``after_each(sample)`` is called once a sample's members have been handed to the kernel
    (flushed; not yet fsynced): from then on the file being written holds them, even if this
    process dies (see :mod:`packer.pipeline.assemble`, which frees their spilled bytes there).
    """
    written = WrittenSamples()
    with atomic_output(path) as raw:
        out = _HashingWriter(raw)
        for sample in samples:
            offset = out.size
            members = sample_members(sample)
            hasher = SampleHasher(sample.key)
            for name, pieces in members:
                size = sum(len(piece) for piece in pieces)
                hasher.add(name[len(sample.key) + 1:], *pieces)
                out.write(member_header(name, size))
                for piece in pieces:
                    out.write(piece)
                if size % BLOCK:
                    out.write(_ZEROS[:BLOCK - size % BLOCK])
            pixels_member = f"{sample.key}.npy"
            npy = next(pieces for name, pieces in members if name == pixels_member)
            npy_sha256 = (bytes.fromhex(sample.known_sha256) if sample.known_sha256 is not None  # the pixel pass's
                          else pixels_digest(sample.pixels, shape=tuple(sample.shape), dtype=sample.dtype,
                                             fmt="webdataset").digest())
            written.add(position=offset, size=sum(len(piece) for piece in npy), sha256=npy_sha256,
                        checksum=hasher.value())
            if after_each is not None:
                raw.flush()
                after_each(sample)
        out.write(_ZEROS[:2 * BLOCK])
        if out.size % RECORD:
            out.write(_ZEROS[:RECORD - out.size % RECORD])
        size = out.size
        digest = out.sha256.hexdigest()
    return written.result(file=path.name, size=size, sha256=digest)


# -- reading ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TarSample:
    """One sample's members in a tar shard: ``offset`` of its first member header (the
    sample's position in ``_index.parquet``) and, by extension, each member's (data offset, size)."""

    key: str
    offset: int
    members: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class TarIndex:
    """The whole samples found by scanning a tar shard's headers, and the defect that ended the scan.

    ``cut``: the key of the sample in which the file ends (a member of it runs past the end of the
    file: a shard truncated mid-sample); that sample is not in ``samples``, which holds only the
    samples wholly before the defect."""

    samples: tuple[TarSample, ...]
    defect: str | None
    cut: str | None = None


def _member_defect(member: tarfile.TarInfo) -> tuple[str, str] | str:
    """(key, ext) of a member a reader may read, or why it may not (its name, a negative size, not
    a plain regular file: :func:`member_type_problem`)."""
    parsed = parse_member_name(member.name)
    if isinstance(parsed, str):
        return parsed
    if member.size < 0:  # tarfile takes a size field of "-1" as it is
        return f"member {member.name!r} has a negative size ({member.size})"
    return member_type_problem(member) or parsed


def member_type_problem(member: tarfile.TarInfo, limit: int | None = None) -> str | None:
    """Why ``member`` is not a member packer writes, a plain regular file (ustar type ``0`` or
    NUL) of at most ``limit`` bytes (the shard's size, where known), or None.

    ``TarInfo.isreg()`` is not that test: it is true of GNU sparse members (type ``S``, and PAX
    ``GNU.sparse`` ones), whose size is the real size the header declares and whose holes
    ``tarfile`` fills with zeros as it reads, so a few hundred bytes of header would make a
    reader allocate a terabyte; and of contiguous files (type ``7``). Any reader that walks a
    shard with :mod:`tarfile` asks this before it reads a member's data."""
    if member.sparse is not None or member.type == tarfile.GNUTYPE_SPARSE:
        return (f"member {member.name!r} is a sparse file (tar type {member.type.decode('latin-1')!r}, declaring "
                f"{member.size:,} bytes), which packer never writes: a tar reader would fill its holes to that "
                "size; refuse to read this shard")
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        return irregular_member(member.name)
    if limit is not None and member.size > limit:
        return (f"member {member.name!r} declares {member.size:,} bytes, more than the whole shard holds "
                f"({limit:,} bytes); refuse to read this shard")
    return None


#: The first bytes of the compressed files a stock tar reader (``tarfile`` mode ``r|*``, as
#: webdataset opens a shard) decompresses on the fly: gzip, bzip2, xz.
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def unsafe_member(path: Path) -> str | None:
    """Why a stock tar reader (webdataset's) must not read the shard at ``path``, or None.

    The first member header that is not a plain regular file (a sparse file, whose holes the
    reader fills to the real size its header declares; a link, folder or device) or that
    declares more bytes than the shard holds, as far as a tar walk reaches (it stops, as a
    stock reader does, at the end-of-archive block or a damaged header); or a compressed file
    (packer writes uncompressed tar; a stock reader would decompress it, a bomb too). A shard
    in packer's own layout is cleared by the header walk of :func:`scan_tar` (a few µs a
    member); anything else is walked by :mod:`tarfile`, past names it would refuse (a stock
    reader reads those members too)."""
    if _scan_ustar(path) is not None:  # every header a regular member whose data lies within the file
        return None
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if fh.read(6).startswith(_COMPRESSED):
            return "the shard is a compressed file, not the plain tar packer writes; refuse to read it"
        fh.seek(0)
        try:
            with tarfile.open(fileobj=fh, mode="r:") as tar:
                for member in tar:
                    problem = member_type_problem(member, size)
                    if problem is not None:
                        return problem
        except tarfile.TarError:  # a header a stock reader cannot read either: it stops there, as this walk
            return None
    return None


def scan_tar(path: Path) -> TarIndex:
    """Walk a tar shard's member headers (seeking past the data) and group members by key.

    Stops at the first defect: an unreadable header, a member that is not a regular file,
    a name :func:`~packer.shards.members.parse_member_name` refuses, a key seen again after
    another key, or data that runs past the end of the file. Samples before the defect are kept.

    A shard as packer writes it (plain ustar headers, nothing wrong) is walked here, one
    positioned read per sample and the checksums checked together at the end (about 3 µs a
    member); anything else (a defect, PAX or GNU extension headers, a long name, a signed
    checksum) is walked again by :mod:`tarfile`, whose reading is then the answer, defect and all.
    """
    fast = _scan_ustar(path)
    return fast if fast is not None else _scan_tarfile(path)


class _Grouping:
    """Members, in the order a scan meets them, grouped into samples by key."""

    def __init__(self) -> None:
        self.samples: list[TarSample] = []
        self._seen: set[str] = set()
        self._current: TarSample | None = None

    def add(self, key: str, ext: str, header_at: int, data_at: int, size: int) -> bool:
        """Add one member; False (and nothing added) when ``key`` comes again after another key."""
        if self._current is None or key != self._current.key:
            if key in self._seen:
                return False
            self._seen.add(key)
            self._current = TarSample(key=key, offset=header_at, members={})
            self.samples.append(self._current)
        self._current.members[ext] = (data_at, size)
        return True

    def cut(self, key: str) -> None:
        """Forget the sample ``key`` if it is the one being grouped: a member of it is cut short."""
        if self._current is not None and self._current.key == key:
            self.samples.pop()
            self._current = None


#: A ustar name field as the fast walk takes it: a member name ``parse_member_name`` accepts,
#: padded with NULs to the field's end (anything else goes to ``tarfile``).
_NAME_FIELD_BYTES = re.compile(MEMBER_NAME.pattern + rb"\0+")
#: Bytes read at each header the walk reaches: a sample's small members and the header of the
#: next (``.cls``, ``.json`` and the ``.npy`` header are about 3 kB) come in one read.
_WALK_READ = 8192
#: Powers of 8 for the six octal digits of a checksum field as ``tarfile`` writes it ("%06o\0 ").
_OCTAL6 = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def _scan_ustar(path: Path) -> TarIndex | None:
    """:func:`scan_tar` of a clean shard in packer's layout, or None for anything else.

    Takes only headers exactly as packer (and ``tarfile``'s ustar writer) lays them out: a
    name :data:`~packer.shards.members.MEMBER_NAME` matches, NUL-padded, no ustar prefix, a
    regular-file type, an 11-digit octal size. The member names and sizes are read one header
    at a time (each read also takes in the small members that follow); the checksums of all
    headers are then checked in one vectorised pass. Anything it does not take returns None.
    """
    found = _Grouping()
    headers: list[bytes] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = buf_at = buf_end = 0
        buf = b""
        name_field = _NAME_FIELD_BYTES.fullmatch
        while position + BLOCK <= size:
            if position < buf_at or position + BLOCK > buf_end:
                buf, buf_at = os.pread(fd, _WALK_READ, position), position
                buf_end = position + len(buf)
                if len(buf) < BLOCK:
                    return None
            at = position - buf_at
            header = buf[at:at + BLOCK]
            named = name_field(header, 0, _NAME_FIELD)
            if named is None:
                return _checked(found, headers) if not any(header) else None
            size_field = header[124:135]
            if header[156] not in _REGULAR or header[345] != 0 or header[135] != 0 or not size_field.isdigit():
                return None
            try:
                data_size = int(size_field, 8)
            except ValueError:  # an 8 or a 9
                return None
            data_at = position + BLOCK
            if data_at + data_size > size:
                return None
            if not found.add(named[1].decode("ascii"), named[2].decode("ascii"), position, data_at, data_size):
                return None
            headers.append(header)
            position = data_at + (data_size + BLOCK - 1) // BLOCK * BLOCK
        return None  # no end-of-archive block: let tarfile say what it makes of the end
    finally:
        os.close(fd)


#: The type flags of a regular file ("0", and NUL from old tar writers), as bytes of a header.
_REGULAR = (tarfile.REGTYPE[0], tarfile.AREGTYPE[0])


def _checked(found: _Grouping, headers: list[bytes]) -> TarIndex | None:
    """``found`` as a :class:`TarIndex` when every header's checksum (the unsigned sum of its
    bytes, the checksum field counted as spaces) is the one it stores, else None."""
    if headers:
        blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(-1, BLOCK)
        field = blocks[:, 148:156]
        sums = blocks.sum(axis=1, dtype=np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 0x20
        digits = field[:, :6].astype(np.int64) - ord("0")
        if ((digits < 0) | (digits > 7)).any() or (field[:, 6] != 0).any() or (field[:, 7] != 0x20).any():
            return None  # a checksum written another way: tarfile reads it
        if not np.array_equal(digits @ _OCTAL6, sums):
            return None
    return TarIndex(samples=tuple(found.samples), defect=None)


def _scan_tarfile(path: Path, start: int = 0) -> TarIndex:
    """:func:`scan_tar` by :mod:`tarfile`: any tar it reads, and the defect where it stops.
    ``start``: the byte offset of the member header to start at (offsets stay the file's)."""
    found = _Grouping()
    defect: str | None = None
    cut: str | None = None
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(start)  # tarfile starts at the file's position, and counts offsets from the file's start
        try:
            with tarfile.open(fileobj=fh, mode="r:") as tar:
                for member in tar:
                    parsed = _member_defect(member)
                    if isinstance(parsed, str):
                        defect = parsed
                        break
                    if member.offset_data + member.size > size:  # truncated mid-sample: that sample is not whole
                        cut = parsed[0]
                        found.cut(cut)
                        defect = f"member {member.name!r} runs past the end of the file: sample {cut} is cut short"
                        break
                    if not found.add(*parsed, header_at=member.offset, data_at=member.offset_data,
                                     size=member.size):
                        defect = f"key {parsed[0]!r} appears twice"
                        break
                if defect is None:  # tarfile ends an archive quietly at a header whose checksum fails
                    defect = _damaged_header(fh, tar.offset, size)
        except tarfile.TarError as err:
            defect = f"unreadable tar header ({err})"
    return TarIndex(samples=tuple(found.samples), defect=defect, cut=cut)


def resume_scan(path: Path, index: TarIndex, offsets: Sequence[int]
                ) -> tuple[dict[int, TarSample], dict[int, str], dict[int, str]]:
    """The samples of a tar shard whose scan (``index``) stopped at a defect, by position, found
    again past each defect from ``offsets`` (each sample's first member header, by position:
    ``_index.parquet``'s ``position`` column of a tar shard); why each position no scan found
    was lost; and the defect each walk stopped at, by the position of the last sample it found
    (a later member header of that sample may be the damaged one). A walk restarts at the first
    position it has not placed; a sample found at an offset the index does not hold ends that
    walk (the shard is not the one indexed there)."""
    at = {int(offset): position for position, offset in enumerate(offsets)}
    placed: dict[int, TarSample] = {}
    lost: dict[int, str] = {}
    stopped: dict[int, str] = {}

    def take(scan: TarIndex) -> bool:
        taken = None
        for sample in scan.samples:
            position = at.get(sample.offset)
            if position is None or position in placed:
                break
            placed[position] = sample
            taken = position
        if taken is not None and scan.defect is not None:
            stopped[taken] = scan.defect
        return taken is not None

    take(index)
    position, defect = (max(placed) + 1 if placed else 0), index.defect
    while position < len(offsets) and defect is not None:
        scan = _scan_tarfile(path, start=int(offsets[position]))
        if not take(scan):
            lost[position] = scan.defect or defect
            position += 1
            continue
        position, defect = max(placed) + 1, scan.defect
        if scan.cut is not None:  # the file ends inside a sample: what follows is not there
            break
    return placed, lost, stopped


def _stream_stopped_early(tar: tarfile.TarFile) -> str | None:
    """Why a tar stream's walk ended at ``tar.offset`` where the archive had not ended: bytes
    other than zeros after the block it stopped at (the header it could not read; read past
    already). ``None`` at a real end: only the end-of-archive zeros follow."""
    stream = tar.fileobj
    assert stream is not None  # an open TarFile has its file
    while chunk := stream.read(1 << 20):
        if chunk.strip(b"\0"):
            return _damaged_header_text(tar.offset)
    return None


def _damaged_header_text(offset: int) -> str:
    return (f"damaged tar header at byte {offset}, whose checksum does not match its bytes: disk, copy or cache "
            "damage after the build; a tar walk stops there (packer's readers read on from the next sample's "
            "offset in _index.parquet)")


def _damaged_header(fh: BinaryIO, offset: int, size: int) -> str | None:
    """Why a tar walk that ended at ``offset`` ended there, where it was not the archive's end: a
    header block that is not the end-of-archive block of zeros (its checksum fails, so
    :mod:`tarfile` stopped reading). ``None`` at a real end (zeros, or the end of the file)."""
    if offset + tarfile.BLOCKSIZE > size:
        return None
    fh.seek(offset)
    block = fh.read(tarfile.BLOCKSIZE)
    return _damaged_header_text(offset) if block.strip(b"\0") else None


#: A ``.cls`` member this close before its ``.npy`` member (packer writes ``.cls``, ``.json``,
#: ``.npy``) is read in the same system call as the npy header.
_NEAR = 64 << 10
#: Positional reads (``os.pread``/``os.preadv``): where missing, members are read with seek + read.
_PREAD = hasattr(os, "pread") and hasattr(os, "preadv")


def read_member_bytes(fh: BinaryIO, sample: TarSample, exts: Sequence[str]) -> dict[str, bytes] | SampleDefect:
    """The bytes of ``sample``'s members ``exts`` (seek + read), by extension; a missing or
    cut-short member is a :class:`SampleDefect`."""
    data: dict[str, bytes] = {}
    for ext in exts:
        if ext not in sample.members:
            return SampleDefect("missing_member", f"no {sample.key}.{ext} member", sample.key)
        offset, size = sample.members[ext]
        fh.seek(offset)
        data[ext] = fh.read(size)
        if len(data[ext]) != size:
            return SampleDefect("truncated", f"{sample.key}.{ext} is cut short", sample.key)
    return data


#: Set to ``0`` to read tar shards with positional reads instead of memory maps.
MMAP_SWITCH = "PACKER_TAR_MMAP"


def map_shard(fh: BinaryIO) -> mmap.mmap | None:
    """A private (copy-on-write) memory map of the open shard ``fh``, for :func:`read_tar_sample`;
    None where the file is empty or cannot be mapped, or with ``PACKER_TAR_MMAP=0``.

    Images read through it are views of the page cache: nothing is copied until the collate
    stacks them (or the caller writes to one, which copies that page for this process only).
    The map lives as long as the last image of it; a shard file must not be truncated in
    place while it is read (packer replaces files by rename, which leaves open maps intact).
    """
    if os.environ.get(MMAP_SWITCH, "1") == "0":
        return None
    try:
        if os.fstat(fh.fileno()).st_size == 0:
            return None
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None


def read_tar_sample(fh: BinaryIO, sample: TarSample, mapped: mmap.mmap | None = None, *,
                    checksum: bool = False) -> Decoded | SampleDefect:
    """Decode one scanned sample's ``.npy`` member and, where present, its ``.cls`` and
    ``.target.npy`` members from the open shard ``fh``.

    With ``mapped`` (:func:`map_shard` of ``fh``) the image is a view of the map: no copy at
    all. Where ``os.preadv`` exists (Linux, the BSDs) see :func:`_pread_sample`: the pixels are
    copied once, from the page cache into the image. Elsewhere each member is read whole
    (seek + read) and decoded by :func:`~packer.shards.members.decode_members`. ``checksum``:
    also read the ``.json`` member and hash every member as read into ``Decoded.checksum``
    (:mod:`packer.shards.checksum`; the pixels are hashed where they land, not read twice).
    """
    if mapped is not None or _PREAD:
        return _pread_sample(fh.fileno(), sample, mapped, checksum=checksum)
    exts = list(sample.members) if checksum else [ext for ext in ("cls", "npy", *SMALL_MEMBERS)
                                                     if ext in sample.members]
    data = read_member_bytes(fh, sample, exts or ["npy"])
    if isinstance(data, SampleDefect):
        return data
    decoded = decode_members(sample.key, data)
    if checksum and isinstance(decoded, Decoded):
        decoded = replace(decoded, checksum=members_checksum(sample.key, data))
    return decoded


def tar_sample_checksum(fh: BinaryIO, sample: TarSample) -> int | SampleDefect:
    """The checksum (:mod:`packer.shards.checksum`) of a scanned sample's members as they are
    in the open shard ``fh`` now, each read whole: for a sample that did not decode, and for
    ``packer verify`` naming the damaged samples of a shard; a member cut short is a defect."""
    data = read_member_bytes(fh, sample, list(sample.members))
    return data if isinstance(data, SampleDefect) else members_checksum(sample.key, data)


def _bytes_at(fd: int, mapped: mmap.mmap | None, size: int, at: int) -> bytes:
    """``size`` bytes of the shard from ``at`` (fewer where it ends first): from the map, else by ``pread``."""
    return os.pread(fd, size, at) if mapped is None else mapped[at:at + size]


def _pread_member(fd: int, key: str, ext: str, at: int, size: int,
                  mapped: mmap.mmap | None = None) -> bytes | SampleDefect:
    data = _bytes_at(fd, mapped, size, at)
    return data if len(data) == size else SampleDefect("truncated", f"{key}.{ext} is cut short", key)


def _pread_sample(fd: int, sample: TarSample, mapped: mmap.mmap | None = None, *,
                  checksum: bool = False) -> Decoded | SampleDefect:
    """Decode one sample from the shard open as ``fd``, copying its pixels once (or, from the
    map ``mapped``, not at all).

    One ``pread`` fetches the ``.cls`` member (and, with ``checksum``, the ``.json`` member) and
    the start of the ``.npy`` member (more reads when they lie far apart); for packer's own npy
    header (:func:`~packer.shards.members.npy_layout`) the pixels are then read by ``preadv``
    straight into the ``np.empty`` array that becomes the image, byte-swapped in place if the
    file's byte order is not the machine's. With a map the same bytes are sliced from it and
    the image is a view of the map (a copy only to swap bytes). The ``.mask.npy``,
    ``.target.npy`` and ``.target_mask.npy`` members are read whole. Any other pixel npy form
    is read whole and goes through ``decode_members``, with the same
    messages. ``checksum``: every member is hashed as read (the pixels before any byte swap).
    """
    key, members = sample.key, sample.members
    if "npy" not in members:
        return SampleDefect("missing_member", f"no {key}.npy member", key)
    npy_at, npy_size = members["npy"]
    head_size = min(npy_size, NPY_HEAD)
    before: list[str] = [ext for ext in (("cls", "json") if checksum else ("cls",)) if ext in members]
    got: dict[str, bytes] = {}  # the members read whole: the small ones before and after the pixels
    if before and all(0 <= npy_at - (members[ext][0] + members[ext][1]) <= _NEAR for ext in before):
        first = min(members[ext][0] for ext in before)
        span = _bytes_at(fd, mapped, npy_at + head_size - first, first)
        for ext in before:
            at, size = members[ext]
            got[ext] = span[at - first:at - first + size]
        head = span[npy_at - first:]
    else:
        for ext in before:
            at, size = members[ext]
            got[ext] = _bytes_at(fd, mapped, size, at)
        head = _bytes_at(fd, mapped, head_size, npy_at)
    for ext in before:
        if len(got[ext]) != members[ext][1]:
            return SampleDefect("truncated", f"{key}.{ext} is cut short", key)
    if len(head) != head_size:
        return SampleDefect("truncated", f"{key}.npy is cut short", key)
    for small_ext in SMALL_MEMBERS:  # a mask, a target vector and its mask, read whole
        if small_ext in members:
            member = _pread_member(fd, key, small_ext, *members[small_ext], mapped=mapped)
            if isinstance(member, SampleDefect):
                return member
            got[small_ext] = member
    layout = npy_layout(head)
    if layout is None:
        data = _pread_member(fd, key, "npy", npy_at, npy_size, mapped=mapped)
        if isinstance(data, SampleDefect):
            return data
        whole = {ext: data if ext == "npy" else got[ext] for ext in members if ext == "npy" or ext in got}
        decoded = decode_members(key, {ext: value for ext, value in whole.items() if ext != "json"})
        if checksum and isinstance(decoded, Decoded):
            decoded = replace(decoded, checksum=members_checksum(key, whole))
        return decoded
    small = decode_small_members(key, {ext: value for ext, value in got.items() if ext != "json"})
    if isinstance(small, SampleDefect):
        return small
    dtype, shape, start = layout
    problem = npy_size_problem(npy_size - start, dtype, shape)
    if problem is not None:
        return SampleDefect("undecodable", f"{key}.npy: {problem}", key)
    if mapped is not None:
        count = math.prod(shape)
        if npy_at + start + count * dtype.itemsize > len(mapped):
            return SampleDefect("truncated", f"{key}.npy is cut short", key)
        # a writable view of the private map (no copy); empty arrays cannot view a buffer
        image = (np.frombuffer(mapped, dtype=dtype, count=count, offset=npy_at + start).reshape(shape) if count
                 else np.empty(shape, dtype))
    else:
        image = np.empty(shape, dtype)
        if _read_into(fd, image, npy_at + start) != image.nbytes:
            return SampleDefect("truncated", f"{key}.npy is cut short", key)
    found: int | None = None
    if checksum:  # the pixels as they sit in the shard: before any byte swap
        found = fields_checksum(key, ((name, (head[:start], image) if name == "npy" else (got[name],))
                                      for name in members))
    if not dtype.isnative:
        image = (image.byteswap(inplace=mapped is None)).view(dtype.newbyteorder("="))
    return Decoded.of(key, image, small, checksum=found)


def _read_into(fd: int, array: np.ndarray, offset: int) -> int:
    """Fill C-contiguous ``array`` with the bytes of ``fd`` from ``offset``; the bytes read
    (fewer than ``array.nbytes`` only where the file ends first)."""
    raw = array.reshape(-1).view(np.uint8).data
    got = 0
    while got < len(raw):
        n = os.preadv(fd, [raw[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


class _Replayable:
    """A forward-only stream (``read``) that keeps the last bytes it has pulled from its source,
    so a reader on it (``tarfile``'s stream, which reads ahead in records) can be restarted at a
    byte it has already pulled (:meth:`restart`), or further on."""

    #: Bytes kept: more than ``tarfile``'s stream reads ahead (a record) past where it stopped
    KEEP = 4 * RECORD

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self.position = 0  # the byte of the stream the next read returns first
        self._end = 0  # the bytes pulled from the source
        self._kept = bytearray()  # the last of them (KEEP to 2 × KEEP): bytes _end - len(_kept) to _end

    def read(self, size: int = -1) -> bytes:
        replay = b""
        if self.position < self._end:
            start = len(self._kept) - (self._end - self.position)
            replay = bytes(self._kept[start:] if size < 0 else self._kept[start:start + size])
            self.position += len(replay)
            if size >= 0:
                size -= len(replay)
                if size == 0:
                    return replay
        data = self._source.read(size) if size >= 0 else self._source.read()
        self._pulled(data)
        self.position = self._end
        return replay + data

    def _pulled(self, data: bytes) -> None:
        self._end += len(data)
        self._kept += data
        if len(self._kept) > 2 * self.KEEP:  # trimmed now and then, not on every read
            del self._kept[:len(self._kept) - self.KEEP]

    def restart(self, offset: int) -> bool:
        """Make the next read start at byte ``offset`` of the stream; False where that byte is no
        longer kept or the stream ends before it."""
        if offset < self._end - len(self._kept):
            return False
        while self._end < offset:
            data = self._source.read(min(1 << 20, offset - self._end))
            if not data:
                return False
            self._pulled(data)
        self.position = offset
        return True


def stream_tar_samples(fh: IO[bytes], last: int, offsets: Sequence[int] | None = None
                       ) -> Iterator[tuple[int, str, dict[str, bytes]] | str]:
    """``(index, key, members)`` for the samples of a tar stream (read once, front to back,
    ``tarfile`` mode ``r|``) up to index ``last``; ``members`` holds every member's bytes by extension.

    A string, the defect, ends the stream: the defects :func:`scan_tar` stops at, or an
    unreadable stream. A sample whose member the stream ends in (a shard truncated mid-sample) is
    not yielded: the defect names it. ``OSError`` from the store propagates.

    ``offsets``: each sample's first member header, by position (``_index.parquet``'s
    ``position`` column of a tar shard). Past a damaged member header, then, the stream is read
    on from the next sample's offset, as :func:`resume_scan` does in a file: the defect is
    yielded (not the last item, then), the sample the header belonged to is yielded with the
    members before it (or, its first header damaged, not at all), and each sample after it
    with its position (``index``) by its offset; a sample at an offset the index does not hold
    ends the stream (the shard is not the one indexed).
    """
    at = {int(offset): position for position, offset in enumerate(offsets)} if offsets is not None else None
    source: IO[bytes] = fh if at is None else _Replayable(fh)  # type: ignore[assignment]
    seen: set[str] = set()
    index = -1
    base = 0  # the stream's byte at which this tarfile walk began
    while True:
        key: str | None = None
        members: dict[str, bytes] = {}
        defect: str | None = None
        reading: str | None = None  # the member whose data is being read
        damaged: int | None = None  # where a walk stopped at a header it could not read, past which samples follow
        try:
            with tarfile.open(fileobj=source, mode="r|") as tar:
                for member in tar:
                    parsed = _member_defect(member)
                    if isinstance(parsed, str):
                        defect = parsed
                        break
                    name, ext = parsed
                    if name != key:
                        if key is not None:
                            yield index, key, members
                            if index >= last:
                                return
                        if name in seen:
                            defect = f"key {name!r} appears twice"
                            key = None
                            break
                        seen.add(name)
                        position = index + 1 if at is None or not base else at.get(base + member.offset)
                        if position is None or position <= index:
                            defect = (f"a sample ({name}) at byte {base + member.offset}, where _index.parquet "
                                      "records none: the shard is not the one indexed")
                            key = None
                            break
                        key, members, index = name, {}, position
                    reading = member.name
                    extracted = tar.extractfile(member)
                    members[ext] = extracted.read() if extracted is not None else b""
                    reading = None
                else:  # tarfile ends a stream quietly at a header whose checksum fails, as a file
                    damaged = _header_past_which_samples_follow(at, base + tar.offset)
                    defect = _stream_stopped_early(tar) if damaged is None else _damaged_header_text(damaged)
        except GeneratorExit:  # closed early (a reader that stops, or interpreter exit, when module
            raise  # globals may be gone already: the clause below must not be evaluated then)
        except (tarfile.TarError, EOFError) as err:
            if reading is not None and key is not None:  # the stream ends inside this sample: it is not whole
                defect = f"unreadable tar stream in member {reading!r} ({err}): sample {key} is cut short"
                key = None
            else:
                damaged = _header_past_which_samples_follow(at, base) if key is None and reading is None else None
                defect = (f"unreadable tar stream ({err})" if damaged is None else
                          f"{_damaged_header_text(damaged)} ({err})")
        if key is not None:
            yield index, key, members
            if index >= last:
                return
        if defect is not None:
            yield defect
        if damaged is None or at is None or not isinstance(source, _Replayable):
            return
        base = min(offset for offset in at if offset > damaged)
        if not source.restart(base):
            yield (f"the stream cannot be read on from byte {base}, where _index.parquet records sample "
                   f"{at[base] + 1} (it ends before)")
            return


def _header_past_which_samples_follow(at: dict[int, int] | None, offset: int) -> int | None:
    """``offset`` where a tar walk stopped at it and the index (``at``: sample position by the
    offset of its first member header) records a sample after it: the archive did not end
    there, a damaged header did. None without an index, or with none after."""
    return offset if at is not None and any(o > offset for o in at) else None


def parse_member_header(block: bytes) -> tuple[str, int, bool] | None:
    """(name, size, is a regular file) of the ustar member header ``block``, None for an
    end-of-archive (all-zero) block.

    The inverse of :func:`member_header` for the fields packer writes, for reading one sample at
    a known offset: a tenth of the cost of ``tarfile.open`` + ``TarInfo.frombuf`` per sample.
    Raises ``tarfile.HeaderError`` for a short block, a bad checksum, a bad number or a negative size.
    """
    if len(block) < BLOCK:
        raise tarfile.HeaderError("header block cut short")
    if not any(block):
        return None
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
        size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError as err:
        raise tarfile.HeaderError(f"bad number in header ({err})") from err
    if size < 0:
        raise tarfile.HeaderError(f"negative member size ({size})")
    if stored != sum(block[:148]) + 8 * 0x20 + sum(block[156:BLOCK]):
        raise tarfile.HeaderError("header checksum does not match")
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    regular = block[156:157] in (tarfile.REGTYPE, tarfile.AREGTYPE)
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "replace"), size, regular


class _ReadInto(Protocol):
    """A binary file ``read_sample_at`` reads: seek, read and readinto (any ``open(..., "rb")``)."""

    def seek(self, offset: int, whence: int = ..., /) -> int: ...
    def read(self, size: int = ..., /) -> bytes: ...
    def readinto(self, buffer: memoryview, /) -> int | None: ...


def read_sample_at(fh: _ReadInto, position: int, key: str,
                   mapped: mmap.mmap | None = None) -> dict[str, bytearray | memoryview]:
    """The bytes, by extension, of the consecutive members of sample ``key`` whose first header
    sits at ``position`` (the position ``_index.parquet`` records); empty when none does. Each
    member is read once into a ``bytearray`` of its own (``load_npy(..., copy=False)`` then
    decodes the pixels without a second copy); with ``mapped`` (:func:`map_shard` of ``fh``)
    each is a ``memoryview`` of the map instead, and nothing is copied at all.

    Reading stops at the first header of another key, a refused name or a member that is
    not a regular file, or at the end of the file right after one of the sample's members (a
    shard cut short there, such as an unfinished one, still holds the sample whole). Raises
    ``tarfile.TarError`` when ``position`` holds no member header or a member is cut short:
    the caller falls back to :func:`scan_tar`.
    """
    members: dict[str, bytearray | memoryview] = {}
    end = len(mapped) if mapped is not None else fh.seek(0, os.SEEK_END)
    while True:
        if mapped is not None:
            block = mapped[position:position + BLOCK]
        else:
            fh.seek(position)
            block = fh.read(BLOCK)
        if not block and members:  # the file ends right after the sample's last member (a partial shard)
            return members
        header = parse_member_header(block)
        if header is None:
            return members
        name, size, regular = header
        parsed = parse_member_name(name)
        if isinstance(parsed, str) or parsed[0] != key or not regular:
            return members
        if position + BLOCK + size > end:  # before a buffer of the size the header claims is allocated
            raise tarfile.ReadError(f"member {name!r} cut short (it declares {size:,} bytes, past the end of the file)")
        members[parsed[1]] = (_read_member(fh, name, size) if mapped is None else
                              _mapped_member(mapped, name, position + BLOCK, size))
        position += BLOCK + -(-size // BLOCK) * BLOCK


def _read_member(fh: _ReadInto, name: str, size: int) -> bytearray:
    """The next ``size`` bytes of ``fh`` (member ``name``'s data) in a bytearray of their own."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = fh.readinto(view[got:])
        if not n:
            raise tarfile.ReadError(f"member {name!r} cut short")
        got += n
    return data


def _mapped_member(mapped: mmap.mmap, name: str, at: int, size: int) -> memoryview:
    """Member ``name``'s data, ``size`` bytes from ``at``, as a view of the map."""
    if at + size > len(mapped):
        raise tarfile.ReadError(f"member {name!r} cut short")
    return memoryview(mapped)[at:at + size]

