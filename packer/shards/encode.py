"""Encode one sample into the bytes that go into a shard (the same for tar and Parquet)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from packer.records import SampleRef


@dataclass(frozen=True)
class EncodedSample:
    """A sample ready to be written: its label index, its JSON record and its pixel bytes."""

    key: str
    split: str
    label: int
    label_name: str
    entity_id: str
    source: str
    shape: tuple[int, ...]
    dtype: str
    pixels: bytes
    info: dict[str, Any]
    #: sha256 of ``pixels`` when already known (the pixel pass hashed them); else computed
    known_sha256: str | None = None

    @property
    def pixels_sha256(self) -> str:
        return self.known_sha256 or hashlib.sha256(self.pixels).hexdigest()


def encode_sample(*, key: str, ref: SampleRef, shape: tuple[int, ...], dtype: str, pixels: bytes,
                  metadata: dict[str, Any], split: str, label_map: dict[str, int],
                  sha256: str | None = None) -> EncodedSample:
    """Attach split and label index to a transformed sample's bytes (raw C-order pixels)."""
    if ref.label is None or ref.entity is None:
        raise ValueError(f"{ref.path}: sample {key} reached packing without label/entity")
    info: dict[str, Any] = {
        "key": key,
        "sample_id": ref.sample_id,
        "source": ref.source,
        "kind": ref.kind,
        "label": ref.label,
        "label_index": label_map[ref.label],
        "entity_id": ref.entity,
        "split": split,
        "shape": list(shape),
        "dtype": dtype,
        "metadata": metadata,
    }
    if ref.extra:
        info["extra"] = dict(ref.extra)
    return EncodedSample(key=key, split=split, label=label_map[ref.label], label_name=ref.label,
                         entity_id=ref.entity, source=ref.source, shape=shape, dtype=dtype, pixels=pixels,
                         info=info, known_sha256=sha256)
