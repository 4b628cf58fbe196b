"""``multilabel``: any number of the dataset's label names per sample, stored multi-hot.

A shard holds a uint8 vector with a 1 at each label held (``.target.npy``, Parquet ``target``
list<float32>), the loader's batch ``target`` float32 (B, L). Counts do not add up: a sample
counts under each label it holds, so a split's ``class_counts`` say how many samples hold each
label and the report draws each label's share of the split's samples.

A masked target (a source with ``uncertain: ignore`` or ``blank: ignore``) also holds, per
sample, a uint8 mask with a 0 at each label the sample ignores (``?name`` in its text form):
``.target_mask.npy``, Parquet ``target_mask``, batch ``target_mask``; a split then also counts
per label the samples ignoring it (``ignored_counts``) and those lacking it (``negative_counts``).
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from packer.targets.base import (
    FALSE_CELLS,
    IGNORED,
    NO_POLICY,
    SEPARATOR,
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
    join_same_names,
    map_key,
    names_text,
    padded_number_said,
    register_target_kind,
    shares_text,
    twins_said,
    unicode_twins,
)
from packer.targets.classes import class_order

#: The by-label name ``packer diff`` counts a sample under that holds none of the labels.
NO_LABEL = "(none)"


def _held(values: TargetValues | None) -> set[str]:
    """The labels a multi-label sample holds."""
    return {name for name, value in values or () if value}


def _known(values: TargetValues | None) -> set[str]:
    """The labels a multi-label sample holds or lacks: all but those its target mask ignores."""
    return {name for name, _ in values or ()}


def _list_items(cell: str, where: str) -> list[str] | Refused:
    """The names of a cell written as a list literal (``cell`` stripped, ``[`` … ``]``): JSON
    (``["pneumonia", "nodule"]``) or Python text (PadChest's ``['pneumonia', 'nodule']``), read
    as data only (:func:`json.loads`, else :func:`ast.literal_eval`, which evaluates nothing).
    A cell that does not read as a list of strings is ``bad_target`` naming the row: its
    brackets and quotes are never taken into a label's name."""
    try:
        items = json.loads(cell)
    except (ValueError, RecursionError):  # RecursionError: a cell of thousands of nested brackets
        try:
            items = ast.literal_eval(cell)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            items = None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        shown = cell if len(cell) <= 80 else cell[:77] + "..."
        return Refused("bad_target", f"{where}: {shown!r} looks like a list (it starts with '[' and ends with ']') "
                                     "but is no list of quoted names, as ['pneumonia', 'nodule'] or "
                                     '["pneumonia", "nodule"] are; fix the cell (a list cell\'s items are the '
                                     "sample's labels, whatever the separator)")
    return items


def _list_literal(cell: str) -> bool:
    """Whether ``cell`` (stripped) is written as a list literal of quoted names: ``[]``, or ``[``
    then a quote (``['pneumonia', 'nodule']``, ``["a"]``) … ``]``. A bracketed word (``[none]``,
    ``[REDACTED]``) is a token like any other, which ``map:`` may name."""
    if not (cell.startswith("[") and cell.endswith("]")):
        return False
    inner = cell[1:-1].strip()
    return not inner or inner[0] in "'\""


def _names_of_column(cell: str, where: str, separator: str, value_map: Mapping[str, str | None],
                     known: Sequence[str]) -> str | Refused:
    """The target text of a multi-label column of names joined by ``separator``, or written as a
    list literal (PadChest's ``['pneumonia', 'nodule']``: :func:`_list_items`, whatever the
    separator, unless ``value_map`` names the whole cell): each token through ``value_map`` (a
    name; None drops it; absent: the token
    itself), then checked against the job's labels (``known``) and the text form's reserved
    characters."""
    stripped = cell.strip()
    if _list_literal(stripped) and map_key(stripped, value_map) is None:
        listed = _list_items(stripped, where)
        if isinstance(listed, Refused):
            return listed
        tokens = listed
    else:
        tokens = cell.split(separator)
    names = []
    for token in filter(None, (token.strip() for token in tokens)):
        key = map_key(token, value_map)
        name = token if key is None else value_map[key]
        if name is None:
            continue
        if known and name not in known:
            twins = unicode_twins(name, known)  # the listed name in another Unicode form: that name
            if len(twins) != 1:
                return Refused("unknown_label", f"{where}: {name!r} is not in the job's labels ({', '.join(known)})"
                                                f"{twins_said(twins)}{padded_number_said(name, known)}; fix the "
                                                "value, add the label, or map the token ('map:')")
            name = twins[0]
        if SEPARATOR in name or name.startswith(IGNORED):
            return Refused("bad_target", f"{where}: label name {name!r} may not contain {SEPARATOR!r} or start with "
                                         f"{IGNORED!r}; map the token to another name ('map:')")
        names.append(name)
    return names_text(names)


@register_target_kind
class MultiLabelTarget(Target):
    """Any number of labels per sample; ``names`` are the multi-hot positions."""

    KIND: ClassVar[str] = "multilabel"
    has_vector: ClassVar[bool] = True
    names_labels: ClassVar[bool] = True
    vector_dtype: ClassVar[np.dtype] = np.dtype(np.uint8)
    inspect_heading: ClassVar[str] = "labels: samples holding each"
    caption_field: ClassVar[str | None] = "labels"
    view_column: ClassVar[str | None] = "target"
    maskable: ClassVar[bool] = True
    map_keeps_unnamed: ClassVar[bool] = True
    columns_name_labels: ClassVar[bool] = True

    @property
    def label_map(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def manifest_record(self) -> dict[str, Any] | None:
        return self.to_json()

    # -- one sample ----------------------------------------------------------------------------------

    @classmethod
    def text_of_cells(cls, cells: Mapping[str, str], *, where: str, separator: str | None,
                      value_map: Mapping[str, str | None], known: Sequence[str],
                      policy: CellPolicy = NO_POLICY) -> str | Refused:
        """One column of names split at ``separator`` (each token through ``value_map``: a label
        name, or None to drop it; a token the map lacks stays as it is), or 0/1 columns named by
        their labels, whose uncertain and blank cells read as ``policy`` says: a positive, a
        negative, an ignored label (``?name``) or ``bad_target``."""
        if separator is not None:
            (column,) = cells
            return _names_of_column(cells[column], f"{where}, column {column!r}", separator, value_map, known)
        positive = []
        uncertain_numbers = {n for n in map(cell_number, policy.uncertain_values) if n is not None}
        for column, cell in cells.items():
            value, number = cell.lower(), cell_number(cell)
            if value in TRUE_CELLS or number == 1:  # a number compares as one: 1.00 and 1e0 are 1
                read = "ones"
            elif value in FALSE_CELLS or number == 0:
                read = "zeros"
            elif not cell:
                read = policy.blank
                if read == "bad":
                    return Refused("bad_target", f"{where}, column {column!r}: empty; a multi-label column holds 0 "
                                                 "or 1 for every sample (or set 'blank: zeros' or 'blank: ignore')")
            elif cell in policy.uncertain_values or (number is not None and number in uncertain_numbers):
                read = policy.uncertain_policy(column)
                if read == "bad":
                    said = ("the source's uncertain policy for this column is bad, which refuses such a cell"
                            if column in (policy.uncertain or {}) else
                            "the source has no uncertain policy for this column")
                    return Refused("bad_target", f"{where}, column {column!r}: {cell!r} is uncertain and {said}; set "
                                                 "'uncertain: ones', 'zeros' or 'ignore' (for all columns or this one)")
            else:
                return Refused("bad_target", f"{where}, column {column!r}: {cell!r} is not 0 or 1; a multi-label "
                                             "column holds 0 or 1 for every sample")
            if read == "ones":
                positive.append(column)
            elif read == "ignore":
                positive.append(IGNORED + column)
        stray = [name.removeprefix(IGNORED) for name in positive if known and name.removeprefix(IGNORED) not in known]
        if stray:  # a column the job's labels: leaves out: its label has no place in the vector
            return Refused("unknown_label", f"{where}, column {stray[0]!r}: the sample holds label {stray[0]!r}, which "
                                            f"is not in the job's labels ({', '.join(known)}); add it to labels:, or "
                                            "drop the column from label.columns")
        return names_text(positive)

    @classmethod
    def held_names(cls, text: str | None) -> list[str]:
        """Each label the text holds (``a|b``), so that every label's quota is tracked; a
        sample holding none counts under the empty name. An ignored label (``?a``) is not held."""
        return [name for name in (text or "").split(SEPARATOR) if not name.startswith(IGNORED)] or [""]

    @classmethod
    def conflicts(cls, a: str | None, b: str | None, *, tolerance: float) -> bool:
        """Different vectors: a label one text holds and the other lacks. A label either text
        ignores (``?name``: an uncertain or blank cell under an ``ignore`` policy) says nothing,
        so it never conflicts."""
        def read(text: str | None) -> tuple[set[str], set[str]]:
            names = [name for name in (text or "").split(SEPARATOR) if name]
            return ({n for n in names if not n.startswith(IGNORED)},
                    {n.removeprefix(IGNORED) for n in names if n.startswith(IGNORED)})

        (held_a, ignored_a), (held_b, ignored_b) = read(a), read(b)
        return bool((held_a ^ held_b) - ignored_a - ignored_b)

    @classmethod
    def union_text(cls, texts: Sequence[str | None]) -> str | None:
        """Every label any text holds; a label one text ignores (``?name``) stays ignored only
        where no other text holds it."""
        named = {name for text in texts for name in (text or "").split(SEPARATOR) if name}
        return names_text(n for n in named if not (n.startswith(IGNORED) and n.removeprefix(IGNORED) in named))

    def _positions(self, text: str, where: str) -> tuple[list[int], list[int]]:
        """The positions of the labels ``text`` holds and of those it ignores (``?name``)."""
        held: list[int] = []
        ignored: list[int] = []
        positions = self.label_map
        for name in filter(None, text.split(SEPARATOR)):
            bare = name.removeprefix(IGNORED)
            if bare not in positions:
                raise ValueError(f"{where}: label {bare!r} is not one of {list(self.names)}")
            (ignored if name.startswith(IGNORED) else held).append(positions[bare])
        return held, ignored

    def _encode(self, text: str, where: str) -> tuple[int | None, np.ndarray | None]:
        """The multi-hot uint8 vector: 1 for each label held; 0 for those ignored (the mask says so)."""
        vector = np.zeros(len(self.names), dtype=np.uint8)
        held, ignored = self._positions(text, where)
        if ignored and not self.masked:
            raise ValueError(f"{where}: ignored labels {text!r} in a dataset without target masks")
        vector[held] = 1
        return None, vector

    def encode_mask(self, text: str | None, where: str = "") -> np.ndarray | None:
        """uint8 (L,): 0 at each label the text ignores (``?name``), 1 elsewhere; None unless masked."""
        if not self.masked:
            return None
        if text is None:
            raise ValueError(f"{where}: the sample has no target")
        mask = np.ones(len(self.names), dtype=np.uint8)
        mask[self._positions(text, where)[1]] = 0
        return mask

    def record_fields(self, text: str, label: int | None, vector: np.ndarray | None) -> dict[str, Any]:
        if vector is None:
            return {}
        ignored = [name.removeprefix(IGNORED) for name in text.split(SEPARATOR) if name.startswith(IGNORED)]
        return {"labels": [name for name, on in zip(self.names, vector, strict=True) if on],
                **({"ignored_labels": sorted(ignored, key=self.label_map.__getitem__)} if ignored else {})}

    def record_vector(self, record: Mapping[str, Any]) -> tuple[float, ...] | None:
        held = set(record.get("labels") or ())
        return tuple(1.0 if name in held else 0.0 for name in self.names)

    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        if vector is None:
            return "unlabeled"
        return ", ".join(n for n, v in zip(self.names, vector, strict=False) if v) or NO_LABEL

    def _vector_problem(self, vector: np.ndarray) -> str | None:
        if not np.isin(vector, (0, 1)).all():
            return "multi-label target holds values other than 0 and 1"
        return None

    # -- the dataset ------------------------------------------------------------------------------

    @classmethod
    def from_texts(cls, texts: Iterable[str | None], *, labels: tuple[str, ...],
                   columns: tuple[str, ...]) -> Target:
        """The job's ``labels:`` in their order, else the 0/1 columns in job order followed by
        the other names seen in the class targets' order (numeric where every one is a number:
        a Human Protein Atlas ``Target`` of ids ``0`` … ``27`` gets positions 0 … 27, not
        ``0, 1, 10, 11, …``), so one dataset's ids are numbered alike under either kind."""
        if labels:
            return Target(cls.KIND, labels)
        seen = {name.removeprefix(IGNORED) for text in texts for name in (text or "").split(SEPARATOR)}
        return Target(cls.KIND, (*columns, *class_order(seen.difference(columns, {""}))))

    def split_counts(self, labels: np.ndarray, vectors: np.ndarray, masks: np.ndarray | None = None
                     ) -> dict[str, Any]:
        """``class_counts``: per label the samples holding it; for a masked target also
        ``ignored_counts`` (samples whose entry is masked out) and ``negative_counts`` (the rest)."""
        hot = vectors.sum(axis=0, dtype=np.int64).tolist()
        counts: dict[str, Any] = {"class_counts": dict(sorted((name, int(n)) for name, n in zip(self.names, hot,
                                                                                               strict=True)))}
        if self.masked:
            ignored = ((masks if masks is not None else np.ones_like(vectors)) == 0).sum(axis=0, dtype=np.int64)
            counts["ignored_counts"] = dict(sorted(zip(self.names, map(int, ignored), strict=True)))
            counts["negative_counts"] = dict(sorted((name, len(vectors) - int(n) - int(i))
                                                    for name, n, i in zip(self.names, hot, ignored, strict=True)))
        return counts

    # -- what people read -----------------------------------------------------------------------------

    def brief(self, entry: Mapping[str, Any]) -> str:
        ignored = {name: n for name, n in entry.get("ignored_counts", {}).items() if n}
        return counts_text(entry) + (f" (ignored: {', '.join(f'{k} {v}' for k, v in ignored.items())})"
                                     if ignored else "")

    def summarize_split(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Per label the samples holding it and their percent of the split's samples (a sample may
        hold several labels or none, so the counts do not add up to the samples); for a masked
        target also ``ignored``, the samples whose entry is masked out, likewise."""
        out = {"classes": count_shares(entry["class_counts"], entry["samples"])}
        if "ignored_counts" in entry:
            out["ignored"] = count_shares(entry["ignored_counts"], entry["samples"])
        return out

    def summarize_total(self, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:meth:`summarize_split` of the splits' counts added up."""
        total: dict[str, Any] = {"samples": sum(e["samples"] for e in entries)}
        for name in ("class_counts", "ignored_counts"):
            if name == "class_counts" or any(name in e for e in entries):
                counts: Counter[str] = Counter()
                for entry in entries:
                    counts.update(entry.get(name, {}))
                total[name] = dict(counts)
        return self.summarize_split(total)

    def inspect_line(self, label_map: Mapping[str, int]) -> str:
        return f"multilabel: {', '.join(self.names) or '-'} (a sample holds any number of them)"

    def inspect_cells(self, summary: Mapping[str, Any]) -> str:
        ignored = {name: share for name, share in summary.get("ignored", {}).items() if share["count"]}
        return shares_text(summary) + (f"; ignored: {shares_text({'classes': ignored})}" if ignored else "")

    def index_target(self, label: int | None, vector: Sequence[float] | None,
                     mask: Sequence[int] | None = None) -> tuple[str, TargetValues | None]:
        if vector is None:
            return "(no target)", ()
        values = np.asarray(vector, dtype=self.vector_dtype)
        # an ignored label (mask 0) is neither held nor lacked: left out of the values, named in the text
        used = [True] * len(self.names) if mask is None else [bool(m) for m in mask]
        pairs = tuple((name, int(v)) for name, v, use in zip(self.names, values.tolist(), used, strict=False) if use)
        ignored = [name for name, use in zip(self.names, used, strict=False) if not use]
        return self.describe(None, values) + (f"; ignored: {', '.join(ignored)}" if ignored else ""), pairs

    def compared_with(self, new: Target) -> Target:
        """The target whose names are the labels of both vocabularies (this one's order, masked
        where either is): a label only one version has is neither known nor ignored in the other,
        so it says only whether a sample holds it, never that it became ignored or known."""
        shared = tuple(name for name in self.names if name in new.names)
        return Target(self.KIND, shared, masked=self.masked or new.masked)

    def _known_shared(self, values: TargetValues | None) -> set[str]:
        """:func:`_known` over the labels of this target (both versions' vocabularies, in a diff)."""
        return _known(values) & set(self.names)

    def compared_target(self, text: str | None, values: TargetValues | None) -> Hashable:
        """The labels held and those known among the labels of both versions: relabeled where the
        labels held changed (a label added to, or dropped from, the vocabulary only where the
        sample holds it), or those ignored (a known negative now masked out)."""
        return frozenset(_held(values)), frozenset(self._known_shared(values))

    def diff_names(self, text: str | None, values: TargetValues | None) -> tuple[str, ...]:
        """Each label the sample holds (:data:`NO_LABEL` when none)."""
        return tuple(_held(values)) or (NO_LABEL,)

    def relabel_counts(self, old: tuple[str | None, TargetValues | None],
                       new: tuple[str | None, TargetValues | None]) -> list[tuple[str, str]]:
        """``relabeled_in`` for each label the sample gained, ``relabeled_out`` for each it lost;
        ``ignored_in`` for each label now ignored (masked out), ``ignored_out`` for each no longer,
        among the labels of this target (:meth:`compared_with`: those both versions have)."""
        before, after = _held(old[1]), _held(new[1])
        known_before, known_after = self._known_shared(old[1]), self._known_shared(new[1])
        return ([(name, "relabeled_in") for name in after - before]
                + [(name, "relabeled_out") for name in before - after]
                + [(name, "ignored_in") for name in known_before - known_after]
                + [(name, "ignored_out") for name in known_after - known_before])

    def report_fact(self, label_map: Iterable[str]) -> TargetFact:
        return TargetFact("Labels", f"multilabel: {', '.join(self.names) or '-'}", "(a sample holds any number)",
                          "target")

    def sheet_words(self, no_label: str) -> SheetWords:
        return SheetWords(group="label", prefix="", hover="labels",
                          grouping=f" A sample appears under each label it holds; {no_label} holds those with none.")

    def sheet_groups(self, index: SampleGroups, no_label: str) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
        """One member per label a sample holds, by row then label position, or one in
        ``no_label`` for a sample that holds none."""
        rows, positions = index.positives()
        names = list(self.names)
        names += [str(p) for p in range(len(names), int(positions.max(initial=-1)) + 1)]  # beyond the manifest's
        unlabeled = np.ones(len(index), dtype=bool)
        unlabeled[rows] = False
        none_rows = np.flatnonzero(unlabeled)
        member_rows = np.concatenate((rows, none_rows))
        member_codes = np.concatenate((positions, np.full(len(none_rows), len(names), dtype=np.int64)))
        order = np.lexsort((member_codes, member_rows))
        return member_rows[order], member_codes[order], [*names, no_label]

    def render(self, renderer: TargetRenderer[T_co]) -> T_co:
        return renderer.render_multilabel(self)

    # -- the loader ------------------------------------------------------------------------------------

    def holding(self, column: np.ndarray, label_ids: Iterable[int]) -> np.ndarray:
        """The rows holding any of ``label_ids`` (``column``: the rows' multi-hot vectors, flat)."""
        return np.asarray(np.asarray(column).reshape(-1, len(self.names))[:, sorted(label_ids)].any(axis=1))

    def join(self, other: Target) -> tuple[Target, dict[int, int] | None]:
        return join_same_names(self, other)
