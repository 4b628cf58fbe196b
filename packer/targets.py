"""What a dataset's training target is, and how one sample's target is written, stored and read.

A dataset has one target kind (the job's sources must agree), recorded in the manifest:

========== ===================================== ============================ ===============================
kind       a sample carries                      tar members / Parquet        loader batch
========== ===================================== ============================ ===============================
class      one class name (``label_map`` index)  ``.cls`` / ``label`` int64   ``label`` int64 (B,)
multilabel any number of names of ``names``      ``.target.npy`` uint8 (L,) / ``target`` float32 (B, L), multi-hot
                                                 ``target`` list<float32>
numeric    one float per name of ``names``       ``.target.npy`` float32 (K,) ``target`` float32 (B, K)
                                                 / ``target`` list<float32>
none       nothing (unlabeled)                   no ``.cls``; ``label`` null  no ``label``, no ``target``
========== ===================================== ============================ ===============================

On the client a sample's target travels as text in ``SampleRef.label`` (one column of the
sample table, whatever the kind): the class name; the multi-label names joined by ``|`` in
sorted order (``""``: none of them); the numbers as ``repr`` of their float32 values joined by
``|``; ``""`` for an unlabeled sample. :meth:`Target.encode` turns that text into what a shard
holds; ``None`` is a sample without a target, which discovery reports as ``missing_label``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("class", "multilabel", "numeric", "none")
#: How the names of a multi-label target are joined in its text form.
SEPARATOR = "|"

#: DICOM attributes a class label may be read from: descriptive, never identifying (PS3.15
#: Annex E's profile keeps or cleans them; none is a direct identifier). Free-text ones
#: (descriptions, protocol) are on the list because they often are the label; check their values.
LABEL_ATTRIBUTES = (
    "BodyPartExamined", "ContrastBolusAgent", "ConvolutionKernel", "ImageLaterality", "Laterality",
    "Manufacturer", "ManufacturerModelName", "Modality", "MRAcquisitionType", "PatientPosition",
    "PhotometricInterpretation", "PresentationIntentType", "ProtocolName", "ScanningSequence",
    "SequenceVariant", "SeriesDescription", "StudyDescription", "ViewPosition",
)


def number_text(values: Iterable[float]) -> str:
    """The text form of a numeric target: each value as float32, in the shortest decimal that
    reads back as that float32 (``0.2054``, not float64's ``0.2054000049829483``), joined by ``|``."""
    return SEPARATOR.join(str(np.float32(v)) for v in values)


def names_text(names: Iterable[str]) -> str:
    """The text form of a multi-label target: the distinct names, sorted, joined by ``|``."""
    return SEPARATOR.join(sorted(set(names)))


@dataclass(frozen=True)
class Target:
    """A dataset's target: its ``kind`` (:data:`KINDS`) and ``names``: the class names in
    label-index order (class), the multi-hot positions (multilabel), the numbers' names
    (numeric), nothing (none)."""

    kind: str
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; expected one of {KINDS}")

    @property
    def label_map(self) -> dict[str, int]:
        """Name → index: the class index (class) or multi-hot position (multilabel); empty otherwise."""
        return {name: i for i, name in enumerate(self.names)} if self.kind in ("class", "multilabel") else {}

    @property
    def has_vector(self) -> bool:
        """True where each sample carries a target vector (``.target.npy``, column ``target``)."""
        return self.kind in ("multilabel", "numeric")

    @property
    def vector_dtype(self) -> np.dtype:
        return np.dtype(np.uint8 if self.kind == "multilabel" else np.float32)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "names": list(self.names)}

    @classmethod
    def of_manifest(cls, manifest: Mapping[str, Any]) -> Target:
        """The target a manifest records; a manifest without ``target`` has one class label per
        sample, named by its ``label_map`` (every dataset built before targets had kinds)."""
        recorded = manifest.get("target")
        if recorded is None:
            label_map: Mapping[str, int] = manifest.get("label_map", {})
            return cls("class", tuple(sorted(label_map, key=label_map.__getitem__)))
        return cls(str(recorded["kind"]), tuple(recorded.get("names", ())))

    def encode(self, text: str | None, where: str = "") -> tuple[int | None, np.ndarray | None]:
        """(class index, target vector) of a sample whose target text is ``text``; ``None`` where
        the kind has none. Raises ValueError, naming ``where``, for text this target cannot hold
        (an unknown name, a wrong count of numbers): discovery refuses those first."""
        if text is None:
            raise ValueError(f"{where}: the sample has no target")
        if self.kind == "none":
            return None, None
        if self.kind == "class":
            index = self.label_map.get(text)
            if index is None:
                raise ValueError(f"{where}: label {text!r} is not one of {list(self.names)}")
            return index, None
        if self.kind == "multilabel":
            vector = np.zeros(len(self.names), dtype=np.uint8)
            positions = self.label_map
            for name in filter(None, text.split(SEPARATOR)):
                if name not in positions:
                    raise ValueError(f"{where}: label {name!r} is not one of {list(self.names)}")
                vector[positions[name]] = 1
            return None, vector
        values = np.array([float(v) for v in text.split(SEPARATOR)] if text else [], dtype=np.float32)
        if len(values) != len(self.names):
            raise ValueError(f"{where}: {len(values)} numbers for the {len(self.names)} targets {list(self.names)}")
        return None, values

    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        """A short human reading of one sample's target (contact sheets, ``inspect``)."""
        if self.kind == "class" and label is not None:
            return self.names[label] if 0 <= label < len(self.names) else str(label)
        if self.kind == "multilabel" and vector is not None:
            return ", ".join(n for n, v in zip(self.names, vector, strict=False) if v) or "(none)"
        if self.kind == "numeric" and vector is not None:
            return ", ".join(f"{n}={float(v):g}" for n, v in zip(self.names, vector, strict=False))
        return "unlabeled"

    def problem(self, label: int | None, vector: np.ndarray | None) -> str | None:
        """Why a read sample's target does not fit this dataset's target, or None."""
        if self.kind == "class":
            if label is None:
                return "no label (.cls member or label cell)"
            if not 0 <= label < len(self.names):
                return f"label index {label} is out of range of label_map (0..{len(self.names) - 1})"
        elif label is not None and self.kind != "class":
            return f"a label {label}, but this dataset's target kind is {self.kind}"
        if self.has_vector:
            if vector is None:
                return f"no target vector (.target.npy member or target cell) for a {self.kind} dataset"
            if vector.shape != (len(self.names),):
                return (f"target has shape {tuple(vector.shape)}, the manifest's {self.kind} target has "
                        f"{len(self.names)}")
            if self.kind == "multilabel" and not np.isin(vector, (0, 1)).all():
                return "multi-label target holds values other than 0 and 1"
        elif vector is not None:
            return f"a target vector, but this dataset's target kind is {self.kind}"
        return None


def multilabel_counts(target: Target, texts: Sequence[str | None]) -> dict[str, int]:
    """Per name of a multi-label ``target``: how many of ``texts`` hold it."""
    counts = dict.fromkeys(target.names, 0)
    for text in texts:
        for name in filter(None, (text or "").split(SEPARATOR)):
            if name in counts:
                counts[name] += 1
    return counts
