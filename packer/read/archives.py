"""Compressed files and archives among a source's files, by name: what they are and how to open them.

No source kind reads inside a compressed file (other than a NIfTI kind's ``.nii.gz``) or an
archive; a kind that finds one of its own files compressed (``x.dcm.gz``, ``img.png.gz``) or any
archive (``series.zip``, ``series.tar.gz``) under its root names it as ``unsupported_format``
(:meth:`packer.read.kinds.SourceKind.unsupported`) with the fix this module words, so that no
such file vanishes from the counts unsaid. What a file compressed with gzip, bzip2 or xz holds
is told by the first bytes it decompresses to (:meth:`Compressed.decoded_head`), not guessed from
its name: a rotated log ``syslog.2.gz`` is no DICOM file named by a UID.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Single-file compressors by suffix: (name, command that decompresses a file in place)
COMPRESSORS = {".gz": ("gzip", "gunzip"), ".bz2": ("bzip2", "bunzip2"), ".xz": ("xz", "unxz"),
               ".zst": ("Zstandard", "unzstd --rm")}


#: The compressors the standard library decodes, by suffix (a decompressor with ``decompress(data,
#: max_length)`` and ``eof``): their files' heads can be looked at
_DECODERS: dict[str, Callable[[], Any]] = {".gz": lambda: zlib.decompressobj(wbits=31), ".bz2": bz2.BZ2Decompressor,
                                           ".xz": lzma.LZMADecompressor}
#: The most of a compressed file read to decompress its head: bzip2 gives nothing before its
#: first whole block (up to 900 kB of data, a little more compressed); gzip and xz give it at once
PEEK_LIMIT = 1 << 20
_PEEK_CHUNK = 64 << 10

#: Archives by how their names end (longest first): (what, command that unpacks one into FOLDER)
ARCHIVES = (
    (".tar.gz", "a gzip-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".tar.bz2", "a bzip2-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".tar.xz", "an xz-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".tar.zst", "a Zstandard-compressed tar archive", "tar --zstd -xf ARCHIVE -C FOLDER"),
    (".tgz", "a gzip-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".tbz2", "a bzip2-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".txz", "an xz-compressed tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".tar", "a tar archive", "tar -xf ARCHIVE -C FOLDER"),
    (".zip", "a zip archive", "unzip ARCHIVE -d FOLDER"),
    (".7z", "a 7-Zip archive", "7z x ARCHIVE -oFOLDER"),
    (".rar", "a RAR archive", "unrar x ARCHIVE FOLDER/"),
)


@dataclass(frozen=True)
class Archive:
    """An archive found among a source's files: what it is (``a zip archive``), the ending that
    says so (``.zip``) and the command that unpacks one (``unzip ARCHIVE -d FOLDER``)."""

    what: str
    ending: str
    unpack: str

    def detail(self, reads: str) -> str:
        """The detail of its ``unsupported_format`` record; ``reads``: what the source reads
        (``a DICOM source reads the files under its root``)."""
        return (f"{self.what} ({self.ending}), whose files packer does not read: {reads}, not the files inside "
                f"an archive; unpack it into a folder under the root (e.g. {self.unpack}) and move the archive "
                "out of the root")


#: Archives and compressed streams by their first bytes (magic), for a file whose name has no
#: suffix to tell (an export's ``EXPORT``, ``IM0035``): (magic, what, command that unpacks one)
MAGICS = (
    (b"PK\x03\x04", "a zip archive", "unzip ARCHIVE -d FOLDER"),
    (b"PK\x05\x06", "an empty zip archive", "unzip ARCHIVE -d FOLDER"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x ARCHIVE -oFOLDER"),
    (b"Rar!\x1a\x07", "a RAR archive", "unrar x ARCHIVE FOLDER/"),
    (b"\x1f\x8b", "a gzip-compressed file (a tar archive, or one file compressed whole)",
     "tar -xf ARCHIVE -C FOLDER for a tar, else gunzip -c ARCHIVE > FILE"),
    (b"BZh", "a bzip2-compressed file (a tar archive, or one file compressed whole)",
     "tar -xf ARCHIVE -C FOLDER for a tar, else bunzip2 -c ARCHIVE > FILE"),
    (b"\xfd7zXZ\x00", "an xz-compressed file (a tar archive, or one file compressed whole)",
     "tar -xf ARCHIVE -C FOLDER for a tar, else unxz -c ARCHIVE > FILE"),
    (b"\x28\xb5\x2f\xfd", "a Zstandard-compressed file (a tar archive, or one file compressed whole)",
     "tar --zstd -xf ARCHIVE -C FOLDER for a tar, else unzstd -c ARCHIVE > FILE"),
)
#: Files a folder that is a Zarr store (or an array or group inside one) holds: Zarr v3's
#: ``zarr.json``, v2's ``.zarray``, ``.zgroup``, ``.zattrs`` and consolidated ``.zmetadata``
ZARR_MARKERS = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


def zarr_detail(reads: str) -> str:
    """The detail of the ``unsupported_format`` record of a file inside a Zarr store (a chunk,
    ``0/0`` or ``c/0/1``, or its metadata); ``reads``: what the source reads."""
    return ("a file of a Zarr store (a folder named *.zarr, or holding zarr.json, .zarray or .zgroup: an array's "
            f"chunks and metadata, one file per chunk), which packer does not read: {reads}; convert the array to "
            "NIfTI (.nii.gz, for a nifti source; e.g. nibabel.save(nibabel.Nifti1Image(zarr.open(STORE)[:], "
            "affine), 'x.nii.gz')) or to DICOM files, and move the store out of the root")


def sniffed_archive(head: bytes) -> Archive | None:
    """The archive (or compressed file) a file is by its first bytes ``head`` (:data:`MAGICS`),
    or None. A plain tar says so at byte 257 (``ustar``), past the DICOM kind's 132-byte head:
    it is not told here."""
    for magic, what, unpack in MAGICS:
        if head.startswith(magic):
            return Archive(what=what, ending="told by its first bytes, its name having no suffix", unpack=unpack)
    return None


@dataclass(frozen=True)
class Compressed:
    """A single file compressed whole (``x.dcm.gz``): its compressor (``gzip``), the suffix that
    says so (``.gz``), the name it has decompressed (``x.dcm``, lower case) and the command that
    decompresses one in place (``gunzip``)."""

    compressor: str
    suffix: str
    inner: str
    command: str

    @property
    def peekable(self) -> bool:
        """Whether the standard library decodes its compressor (gzip, bzip2, xz; not Zstandard),
        so that :meth:`decoded_head` can tell what it holds."""
        return self.suffix in _DECODERS

    @property
    def peek_bytes(self) -> int:
        """How much of the file to fetch at once to decode its head from, where it is read whole
        rather than as a stream (a URL root's ranged read): bzip2 needs its first whole block."""
        return PEEK_LIMIT if self.suffix == ".bz2" else _PEEK_CHUNK

    def decoded_head(self, read: Callable[[int], bytes], size: int) -> bytes:
        """The first ``size`` bytes the file decompresses to, its bytes got from ``read`` (a
        file's ``read``; at most :data:`PEEK_LIMIT` of them are asked for): fewer where the
        stream ends first, and only those that decoded before it broke where it is no such
        stream or a damaged one (``b""`` for a log named ``.gz`` by mistake, or an empty file),
        which is no verdict on the file but what it holds as far as it can be read. Only for a
        :attr:`peekable` one (ValueError otherwise)."""
        if not self.peekable:
            raise ValueError(f"{self.inner}{self.suffix}: no decoder for {self.compressor} in the standard library")
        decoder = _DECODERS[self.suffix]()
        out, taken = b"", 0
        try:
            while len(out) < size and taken < PEEK_LIMIT and not decoder.eof:
                chunk = read(_PEEK_CHUNK)
                if not chunk:
                    break
                taken += len(chunk)
                out += decoder.decompress(chunk, size - len(out))
        except (zlib.error, OSError, lzma.LZMAError, EOFError):  # bz2 says a bad stream with OSError
            return out  # what decoded before the stream broke
        return out[:size]

    @property
    def inner_suffix(self) -> str:
        """The lower-cased suffix of the name decompressed (``.dcm``; ``""`` for ``im0001.gz``)."""
        dot = self.inner.rfind(".")
        return self.inner[dot:] if 0 < dot < len(self.inner) - 1 else ""

    def detail(self, what: str, reads: str) -> str:
        """The detail of its ``unsupported_format`` record; ``what``: what it holds (``a DICOM
        file``), ``reads``: what the source reads."""
        return (f"{what} compressed with {self.compressor} ({self.suffix}), which packer does not read: {reads}, "
                f"not compressed; decompress it where it lies (e.g. {self.command} *{self.suffix} in its folder)")


def archive(name: str) -> Archive | None:
    """The archive a file named ``name`` (lower case, no folder) is by its name, or None."""
    for ending, what, unpack in ARCHIVES:
        if name.endswith(ending) and len(name) > len(ending):
            return Archive(what=what, ending=ending, unpack=unpack)
    return None


def compressed(name: str) -> Compressed | None:
    """The single compressed file a file named ``name`` (lower case, no folder) is by its name
    (not an archive: ``x.tar.gz`` is none), or None."""
    dot = name.rfind(".")
    if dot <= 0 or archive(name) is not None:
        return None
    suffix = name[dot:]
    if suffix not in COMPRESSORS:
        return None
    compressor, command = COMPRESSORS[suffix]
    return Compressed(compressor=compressor, suffix=suffix, inner=name[:dot], command=command)
