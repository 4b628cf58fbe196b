"""``class``: one class name per sample, stored as its index in ``label_map``.

A shard holds the index (``.cls`` ASCII integer, Parquet ``label`` int64), the loader's batch
``label`` int64 (B,). Counts add up: each sample counts under its one class, so a split's
``class_counts`` sum to its samples and the report draws them as 100 % stacked bars.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from packer.targets.base import (
    FALSE_CELLS,
    NO_POLICY,
    TRUE_CELLS,
    CellPolicy,
    Refused,
    SampleGroups,
    SheetWords,
    T_co,
    Target,
    TargetFact,
    TargetRenderer,
    TargetValues,
    cell_number,
    count_shares,
    counts_text,
    mapped_name,
    register_target_kind,
    shares_text,
)


def _by_value(item: tuple[str, int]) -> int:
    return item[1]


def _one_hot(cells: Mapping[str, str], *, where: str, value_map: Mapping[str, str | None],
             known: Sequence[str]) -> str | Refused:
    """The class of a one-hot row (ISIC's ``MEL,NV,…`` columns, ``1.0``/``0.0``): the one column
    holding 1, through ``value_map``; ``bad_target`` for a cell that is not 0 or 1 (an empty one
    included), and for a row where no column, or several, hold 1."""
    held = []
    for column, cell in cells.items():
        number = cell_number(cell)
        if cell.lower() in TRUE_CELLS or number == 1:
            held.append(column)
        elif not (cell.lower() in FALSE_CELLS or number == 0):
            said = "empty" if not cell else f"{cell!r} is not 0 or 1"
            return Refused("bad_target", f"{where}, column {column!r}: {said}; a one-hot column holds 0 or 1 for "
                                         "every sample")
    if len(held) == 1:
        return mapped_name(held[0], value_map, known, f"{where}, column {held[0]!r}")
    named = ", ".join(cells)
    said = f"no column of {named} holds 1" if not held else f"{' and '.join(held)} both hold 1" if len(held) == 2 \
        else f"{', '.join(held)} all hold 1"
    return Refused("bad_target", f"{where}: {said}; a one-hot row names exactly one class (for none or several "
                                 "labels per sample use kind: multilabel)")


def class_order(names: set[str]) -> tuple[str, ...]:
    """``names`` by numeric value (ties as text) where every one is a finite number, else as text.

    As text, class ids ``0`` … ``11`` would order ``0, 1, 10, 11, 2, …``: label index 2 would be
    class 10, and a model trained on the indices would answer in another numbering than the
    table's."""
    values = {}
    for name in names:
        try:
            value = float(name)
        except ValueError:
            return tuple(sorted(names))
        if not math.isfinite(value):
            return tuple(sorted(names))
        values[name] = value
    return tuple(sorted(names, key=lambda name: (values[name], name)))


@register_target_kind
class ClassTarget(Target):
    """One class per sample; ``names`` are the classes in label-index order."""

    KIND: ClassVar[str] = "class"
    default_kind: ClassVar[bool] = True
    has_label: ClassVar[bool] = True
    names_labels: ClassVar[bool] = True
    inspect_heading: ClassVar[str] = "classes"
    caption_field: ClassVar[str | None] = "label"
    view_column: ClassVar[str | None] = "label"

    @property
    def label_map(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def manifest_record(self) -> dict[str, Any] | None:
        return None  # absent: a class target, as every manifest said before targets had kinds

    def _name(self, index: Any) -> str:
        """The class name of a label index; the index as text where it names no class."""
        return self.names[index] if isinstance(index, int | np.integer) and 0 <= index < len(self.names) else str(index)

    # -- one sample ----------------------------------------------------------------------------------

    @classmethod
    def text_of_cells(cls, cells: Mapping[str, str], *, where: str, separator: str | None,
                      value_map: Mapping[str, str | None], known: Sequence[str],
                      policy: CellPolicy = NO_POLICY) -> str | Refused:
        if len(cells) > 1:
            return _one_hot(cells, where=where, value_map=value_map, known=known)
        (column,) = cells
        if not cells[column]:
            return Refused("missing_label", f"{where}, column {column!r}: empty; give the sample's class", empty=True)
        return mapped_name(cells[column], value_map, known, f"{where}, column {column!r}")

    @classmethod
    def conflicts(cls, a: str | None, b: str | None, *, tolerance: float) -> bool:
        """Different classes."""
        return a != b

    def _encode(self, text: str, where: str) -> tuple[int | None, np.ndarray | None]:
        index = self.label_map.get(text)
        if index is None:
            raise ValueError(f"{where}: label {text!r} is not one of {list(self.names)}")
        return index, None

    def record_fields(self, text: str, label: int | None, vector: np.ndarray | None) -> dict[str, Any]:
        return {"label": text, "label_index": label}

    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        return "unlabeled" if label is None else self._name(label)

    # -- the dataset ------------------------------------------------------------------------------

    @classmethod
    def from_texts(cls, texts: Iterable[str | None], *, labels: tuple[str, ...],
                   columns: tuple[str, ...]) -> Target:
        """The job's ``labels:`` in their order, else the classes of one-hot ``columns`` in job
        order, held by a sample or not (ISIC's MEL, NV, …, UNK, which no training image holds),
        then the other class names seen, sorted: by value where every name is a number (a
        table's class ids ``0`` … ``11``: ``10`` after ``9``, so each id is its label index),
        else as text."""
        if labels:
            return Target(cls.KIND, labels)
        seen = {text or "" for text in texts}
        return Target(cls.KIND, (*columns, *class_order(seen.difference(columns))))

    def split_counts(self, labels: np.ndarray, vectors: np.ndarray, masks: np.ndarray | None = None
                     ) -> dict[str, Any]:
        counts = np.bincount(labels, minlength=len(self.names))
        return {"class_counts": dict(sorted((self.names[i], int(n)) for i, n in enumerate(counts.tolist()) if n))}

    def split_problem(self, entry: Mapping[str, Any]) -> str | None:
        counted = sum(entry["class_counts"].values())
        return None if counted == entry["samples"] else f"class_counts add up to {counted}, not samples " \
                                                         f"{entry['samples']}"

    # -- what people read -----------------------------------------------------------------------------

    def brief(self, entry: Mapping[str, Any]) -> str:
        return counts_text(entry)

    def summarize_split(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        return {"classes": count_shares(entry["class_counts"], sum(entry["class_counts"].values()))}

    def inspect_line(self, label_map: Mapping[str, int]) -> str:
        return "class: " + ", ".join(f"{k} {v}" for k, v in sorted(label_map.items(), key=_by_value))

    def inspect_cells(self, summary: Mapping[str, Any]) -> str:
        return shares_text(summary)

    def index_target(self, label: int | None, vector: Sequence[float] | None,
                     mask: Sequence[int] | None = None) -> tuple[str, TargetValues | None]:
        return self._name(label), None

    def compared_target(self, text: str | None, values: TargetValues | None) -> Hashable:
        return text

    def diff_names(self, text: str | None, values: TargetValues | None) -> tuple[str, ...]:
        return (str(text),)

    def relabel_counts(self, old: tuple[str | None, TargetValues | None],
                       new: tuple[str | None, TargetValues | None]) -> list[tuple[str, str]]:
        return [(str(new[0]), "relabeled_in"), (str(old[0]), "relabeled_out")]

    def report_fact(self, label_map: Iterable[str]) -> TargetFact:
        return TargetFact("Labels", ", ".join(label_map) or "-", "", "label_map")

    def sheet_words(self, no_label: str) -> SheetWords:
        return SheetWords(group="label", prefix="", hover="label", grouping="")

    def sheet_groups(self, index: SampleGroups, no_label: str) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
        """A sample's class."""
        label_code, label_values = index.codes("label")
        return None, label_code, [self._name(value) for value in label_values]

    def render(self, renderer: TargetRenderer[T_co]) -> T_co:
        return renderer.render_class(self)

    # -- the loader ------------------------------------------------------------------------------------

    def holding(self, column: np.ndarray, label_ids: Iterable[int]) -> np.ndarray:
        """The rows whose class index is one of ``label_ids``."""
        return np.isin(column, sorted(label_ids))

    def join(self, other: Target) -> tuple[Target, dict[int, int] | None]:
        """Every class of either, this target's first (its indices unchanged), then ``other``'s
        new ones in its index order; ``other``'s indices are remapped where they move."""
        names = list(self.names)
        names += [name for name in other.names if name not in self.label_map]
        joined = Target(self.KIND, tuple(names))
        position = joined.label_map
        remap = {index: position[name] for index, name in enumerate(other.names)}
        return joined, None if all(k == v for k, v in remap.items()) else remap
