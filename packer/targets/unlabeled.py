"""``none``: unlabeled samples (pretraining, labelling later).

A shard holds no target (no ``.cls``; Parquet ``label`` null), the loader's batch neither
``label`` nor ``target``; there is nothing to count, compare or filter by.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from packer.targets.base import (
    NO_POLICY,
    CellPolicy,
    Refused,
    SampleGroups,
    SheetWords,
    T_co,
    Target,
    TargetFact,
    TargetRenderer,
    TargetValues,
    count_shares,
    groups_by_source,
    join_same_names,
    register_target_kind,
)

#: What the report and ``inspect`` call an unlabeled dataset's targets.
UNLABELED = "unlabeled (no targets)"


@register_target_kind
class NoTarget(Target):
    """No target; ``names`` is empty."""

    KIND: ClassVar[str] = "none"

    def manifest_record(self) -> dict[str, Any] | None:
        return self.to_json()

    @classmethod
    def text_of_cells(cls, cells: Mapping[str, str], *, where: str, separator: str | None,
                      value_map: Mapping[str, str | None], known: Sequence[str],
                      policy: CellPolicy = NO_POLICY) -> str | Refused:
        return ""  # the text form of an unlabeled sample, whatever its row holds

    @classmethod
    def conflicts(cls, a: str | None, b: str | None, *, tolerance: float) -> bool:
        """Never: there is no target to disagree about (masks are compared on their own)."""
        return False

    def _encode(self, text: str, where: str) -> tuple[int | None, np.ndarray | None]:
        return None, None

    def record_fields(self, text: str, label: int | None, vector: np.ndarray | None) -> dict[str, Any]:
        return {}

    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        return "unlabeled"

    @classmethod
    def from_texts(cls, texts: Iterable[str | None], *, labels: tuple[str, ...],
                   columns: tuple[str, ...]) -> Target:
        return Target(cls.KIND)

    def split_counts(self, labels: np.ndarray, vectors: np.ndarray, masks: np.ndarray | None = None
                     ) -> dict[str, Any]:
        return {"class_counts": {}}

    def brief(self, entry: Mapping[str, Any]) -> str:
        return "unlabeled"

    def summarize_split(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        return {"classes": count_shares(entry["class_counts"], sum(entry["class_counts"].values()))}

    def inspect_line(self, label_map: Mapping[str, int]) -> str:
        return "none: unlabeled (no targets)"

    def inspect_cells(self, summary: Mapping[str, Any]) -> str:
        return "unlabeled"

    def index_target(self, label: int | None, vector: Sequence[float] | None,
                     mask: Sequence[int] | None = None) -> tuple[str, TargetValues | None]:
        return self.describe(None, None), None

    def compared_target(self, text: str | None, values: TargetValues | None) -> Hashable:
        return None  # nothing to relabel

    def diff_names(self, text: str | None, values: TargetValues | None) -> tuple[str, ...]:
        return ()

    def relabel_counts(self, old: tuple[str | None, TargetValues | None],
                       new: tuple[str | None, TargetValues | None]) -> list[tuple[str, str]]:
        return []

    def report_fact(self, label_map: Iterable[str]) -> TargetFact:
        return TargetFact("Labels", UNLABELED, "", "target")

    def sheet_words(self, no_label: str) -> SheetWords:
        return SheetWords(group="source", prefix="source ", hover="source",
                          grouping=" The dataset is unlabeled (no targets).")

    def sheet_groups(self, index: SampleGroups, no_label: str) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
        return groups_by_source(index)

    def render(self, renderer: TargetRenderer[T_co]) -> T_co:
        return renderer.render_none(self)

    def join(self, other: Target) -> tuple[Target, dict[int, int] | None]:
        return join_same_names(self, other)
