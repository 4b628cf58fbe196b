"""Encode one sample into the bytes that go into a shard (the same for tar and Parquet), and
say what its per-sample sha256 covers in each format (:func:`pixels_digest`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.records import SampleRef
from packer.shards.members import npy_header
from packer.targets import Target


@dataclass(frozen=True)
class EncodedSample:
    """A sample ready to be written: its target, its JSON record and its pixel bytes.

    ``label``/``label_name``: the class index and name (None without a class target);
    ``target``: the multi-label or numeric vector (None for other kinds)."""

    key: str
    split: str
    label: int | None
    label_name: str | None
    entity_id: str
    source: str
    shape: tuple[int, ...]
    dtype: str
    pixels: bytes
    info: dict[str, Any]
    #: The per-sample sha256 (:func:`pixels_digest` for the shard's format) when already known:
    #: the pixel pass hashed the pixels as they were produced; else the writer computes it
    known_sha256: str | None = None
    target: np.ndarray | None = None
    #: The segmentation mask's ``.npy`` bytes (as spilled), None without masks
    mask: bytes | None = None

    @property
    def pixels_sha256(self) -> str:
        """The Parquet image cell's sha256 (the raw pixels): :attr:`known_sha256`, or computed."""
        return self.known_sha256 or pixels_digest(self.pixels, shape=self.shape, dtype=self.dtype,
                                                  fmt="parquet").hexdigest()


def pixels_digest(pixels: bytes | memoryview, *, shape: tuple[int, ...], dtype: str, fmt: str) -> hashlib._Hash:
    """The sha256 (a hashlib object) that ``_index.parquet`` records for a sample with these
    pixels (raw C-order bytes) in a shard of format ``fmt``: of its ``.npy`` member, header then
    pixels, in a tar shard (``webdataset``); of its ``image`` cell, the raw pixels, in Parquet.

    The pixel pass computes it once, as the bytes are produced; the shard writers take it from
    there instead of hashing every sample again. Exact duplicates are grouped by it too, so
    in a tar dataset two samples are exact copies when their pixels, shape and dtype agree."""
    digest = hashlib.sha256(npy_header(tuple(shape), dtype)) if fmt == "webdataset" else hashlib.sha256()
    digest.update(pixels)
    return digest


def encode_sample(*, key: str, ref: SampleRef, shape: tuple[int, ...], dtype: str, pixels: bytes,
                  metadata: dict[str, Any], split: str, target: Target,
                  sha256: str | None = None, mask: bytes | None = None, relpath: str | None = None) -> EncodedSample:
    """Attach split and target to a transformed sample's bytes (raw C-order pixels).

    The record (``.json``) says the target as a reader wants it: ``label`` and ``label_index``
    for a class, ``labels`` (the names) for multi-label, ``target`` (name → number) for numeric,
    nothing for an unlabeled sample. ``relpath``: the raw file's path relative to its source root,
    recorded as ``path`` (given under ``phi.mode: keep`` only)."""
    if ref.label is None or ref.entity is None:
        raise ValueError(f"{ref.path}: sample {key} reached packing without label/entity")
    label, vector = target.encode(ref.label, where=f"{ref.path}: sample {key}")
    info: dict[str, Any] = {
        "key": key,
        "sample_id": ref.sample_id,
        "source": ref.source,
        "kind": ref.kind,
    }
    if relpath is not None:
        info["path"] = relpath
    info.update(target.record_fields(ref.label, label, vector))
    info.update({
        "entity_id": ref.entity,
        "split": split,
        "shape": list(shape),
        "dtype": dtype,
        "metadata": metadata,
    })
    if ref.extra:
        info["extra"] = dict(ref.extra)
    return EncodedSample(key=key, split=split, label=label, label_name=ref.label if label is not None else None,
                         entity_id=ref.entity, source=ref.source, shape=shape, dtype=dtype, pixels=pixels,
                         info=info, known_sha256=sha256, target=vector, mask=mask or None)
