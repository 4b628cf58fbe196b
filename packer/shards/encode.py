"""Encode one sample into the bytes that go into a shard (the same for tar and Parquet)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.records import SampleRef
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
    #: sha256 of ``pixels`` when already known (the pixel pass hashed them); else computed
    known_sha256: str | None = None
    target: np.ndarray | None = None
    #: The segmentation mask's ``.npy`` bytes (as spilled), None without masks
    mask: bytes | None = None

    @property
    def pixels_sha256(self) -> str:
        return self.known_sha256 or hashlib.sha256(self.pixels).hexdigest()


def encode_sample(*, key: str, ref: SampleRef, shape: tuple[int, ...], dtype: str, pixels: bytes,
                  metadata: dict[str, Any], split: str, target: Target,
                  sha256: str | None = None, mask: bytes | None = None) -> EncodedSample:
    """Attach split and target to a transformed sample's bytes (raw C-order pixels).

    The record (``.json``) says the target as a reader wants it: ``label`` and ``label_index``
    for a class, ``labels`` (the names) for multi-label, ``target`` (name → number) for numeric,
    nothing for an unlabeled sample."""
    if ref.label is None or ref.entity is None:
        raise ValueError(f"{ref.path}: sample {key} reached packing without label/entity")
    label, vector = target.encode(ref.label, where=f"{ref.path}: sample {key}")
    info: dict[str, Any] = {
        "key": key,
        "sample_id": ref.sample_id,
        "source": ref.source,
        "kind": ref.kind,
    }
    if label is not None:
        info.update(label=ref.label, label_index=label)
    elif vector is not None and target.kind == "multilabel":
        info["labels"] = [name for name, on in zip(target.names, vector, strict=True) if on]
    elif vector is not None:
        info["target"] = dict(zip(target.names, vector.tolist(), strict=True))
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
