"""The per-sample checksum: one xxh3-64 over every packed piece of a sample, recorded at pack
time in ``_index.parquet``'s ``xxh3`` column and checked by the loader on every sample it
delivers (``ShardDataset(verify="sample")``, the default) and by ``packer verify`` to name the
damaged samples of a damaged shard.

What it covers, in both formats: a sequence of *fields* ``(name, payload)``, each fed to
xxh3-64 (seed 0) as ``name`` (ASCII) + ``b"\\0"`` + the payload's length (8 bytes,
little-endian) + the payload, so no byte can move from one field to the next unnoticed.

- The first field is always ``("key", <the sample key, UTF-8>)``.
- Tar: then one field per member of the sample, in the order the members sit in the shard (the
  order :func:`packer.shards.tar.sample_members` writes them: ``cls``, ``json``, ``npy``,
  ``mask.npy``, ``target.npy``, ``target_mask.npy``, each only where the sample has it); the
  name is the member's extension, the payload the member's data (no tar header, no padding).
  A flipped byte in the pixels, the label, the record or the mask changes it.
- Parquet: then one field per cell of the row that the loader decodes, in :data:`PARQUET_FIELDS`
  order, a null cell left out: ``label`` (int64 little-endian), ``shape`` and ``mask_shape``
  (int32 little-endian each), ``dtype`` and ``mask_dtype`` (ASCII), ``image`` and ``mask`` (the
  raw bytes), ``metadata`` (the JSON record, UTF-8), ``target`` and ``target_mask`` (the list's
  values, little-endian). The cells the loader does not read (``label_name``, ``entity_id``,
  ``split``, ``source``, ``sha256``) are covered by the shard's sha256 only.

xxh3-64 (the ``xxhash`` package, bindings to the reference C implementation) hashes tens of
GB/s on one core, so checking every sample costs far less than reading it; it detects damage,
it does not authenticate (the shards' and the manifest's sha256 do that).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

#: The ``_index.parquet`` column that holds each sample's checksum (uint64).
INDEX_COLUMN = "xxh3"
#: The Parquet cells a sample's checksum covers, in the order they are hashed (after the key).
PARQUET_FIELDS = ("label", "shape", "dtype", "image", "metadata", "target", "target_mask", "mask", "mask_shape",
                  "mask_dtype")

#: Anything with the buffer protocol: bytes, bytearray, memoryview, a C-contiguous numpy array
Buffer = Any


#: ``name NUL`` of each field name seen, so a sample's framing costs no encoding
_HEADS: dict[str, bytes] = {}
_LENGTH = struct.Struct("<Q").pack


def _head(name: str) -> bytes:
    head = _HEADS.get(name)
    if head is None:
        head = _HEADS[name] = name.encode("ascii") + b"\0"
    return head


class SampleHasher:
    """Feeds one sample's fields to xxh3-64 in order (see the module docstring); ``value()`` is
    the checksum. A field's payload may come in several pieces (an npy header, then the pixels),
    each hashed where it lies, never copied: hashing the concatenation in pieces gives the same
    value as hashing it whole."""

    __slots__ = ("_hash",)

    def __init__(self, key: str) -> None:
        encoded = key.encode("utf-8")
        self._hash = xxhash.xxh3_64(b"key\0" + _LENGTH(len(encoded)) + encoded)

    def add(self, name: str, *pieces: Buffer) -> None:
        """One field: ``name`` and its payload, the concatenation of ``pieces`` (any buffer)."""
        update = self._hash.update
        if len(pieces) == 1:
            update(_head(name) + _LENGTH(_nbytes(pieces[0])))
            update(pieces[0])
            return
        update(_head(name) + _LENGTH(sum(_nbytes(piece) for piece in pieces)))
        for piece in pieces:
            update(piece)

    def value(self) -> int:
        return int(self._hash.intdigest())


def _nbytes(piece: Buffer) -> int:
    return len(piece) if type(piece) is bytes else memoryview(piece).nbytes


#: Pieces under this size are joined and hashed in one update (each update is a call into C).
_SMALL = 4096


def fields_checksum(key: str, fields: Iterable[tuple[str, Sequence[Buffer]]]) -> int:
    """The checksum of sample ``key`` with these ``(name, pieces)`` fields, in this order: the
    same value as :class:`SampleHasher` fed field by field (hashing is streaming: only the
    bytes' order counts), with the framing and the small pieces joined so that a sample takes
    a few updates, its pixels hashed where they lie."""
    encoded = key.encode("utf-8")
    digest = xxhash.xxh3_64()
    pending: list[Buffer] = [b"key\0", _LENGTH(len(encoded)), encoded]
    for name, pieces in fields:
        pending.append(_head(name))
        pending.append(_LENGTH(sum(_nbytes(piece) for piece in pieces)))
        for piece in pieces:
            if _nbytes(piece) < _SMALL:
                pending.append(piece)
                continue
            digest.update(b"".join(pending))
            pending = []
            digest.update(piece)
    digest.update(b"".join(pending))
    return int(digest.intdigest())


def members_checksum(key: str, members: Mapping[str, Buffer]) -> int:
    """The checksum of a tar sample from its members' data by extension, in the mapping's order
    (which must be the order the members sit in the shard: a scan's or a stream's order)."""
    return fields_checksum(key, ((ext, (data,)) for ext, data in members.items()))


def little_endian(values: np.ndarray) -> np.ndarray:
    """``values`` as a C-contiguous array in little-endian byte order (what a checksum hashes)."""
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))


def int_bytes(value: int) -> bytes:
    """A label cell's payload: int64, little-endian."""
    return int(value).to_bytes(8, "little", signed=True)


def shape_bytes(shape: Sequence[int]) -> bytes:
    """A shape cell's payload: int32 little-endian per dimension."""
    return np.asarray(shape, dtype="<i4").tobytes()


def parquet_cells_checksum(key: str, cells: Mapping[str, Any]) -> int:
    """The checksum of a Parquet row from its cells as Python/numpy values (``None``: null or
    absent, left out): ``label`` int, ``shape``/``mask_shape`` sequences of ints, ``dtype``/
    ``mask_dtype``/``metadata`` str, ``image``/``mask`` bytes-like, ``target``/``target_mask``
    numpy arrays. The writer and ``packer verify`` use this; the loader's reader hashes the same
    bytes straight from Arrow's buffers."""
    hasher = SampleHasher(key)
    for name in PARQUET_FIELDS:
        value = cells.get(name)
        if value is None:
            continue
        if name == "label":
            hasher.add(name, int_bytes(value))
        elif name in ("shape", "mask_shape"):
            hasher.add(name, shape_bytes(value))
        elif name in ("dtype", "mask_dtype", "metadata"):
            hasher.add(name, str(value).encode("utf-8"))
        elif name in ("target", "target_mask"):
            hasher.add(name, little_endian(np.asarray(value)))
        else:
            hasher.add(name, value)
    return hasher.value()


def describe(value: int) -> str:
    """A checksum as messages and JSON print it: 16 hex digits."""
    return f"{int(value):016x}"
