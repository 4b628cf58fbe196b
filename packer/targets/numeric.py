"""``numeric``: one float32 per name of the dataset's targets (regression targets).

A shard holds the float32 vector (``.target.npy``, Parquet ``target`` list<float32>), the
loader's batch ``target`` float32 (B, K). There is nothing to count: a split's statistics are
each name's ``target_stats`` (min, mean, max), and the report draws each name's histogram.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar

import numpy as np

from packer.targets.base import (
    DECIMAL,
    NO_POLICY,
    SEPARATOR,
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
    groups_by_source,
    join_same_names,
    number_text,
    register_target_kind,
)

#: The largest magnitude a numeric target may have: targets are packed as float32
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _fits_float32(value: float) -> bool:
    """Whether ``value`` is finite as float32 (what it is packed as: 1e39 is infinite there)."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(value)))


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) else "-"


def pooled_stats(per_split: Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]) -> dict[str, dict[str, float]]:
    """One ``target_stats`` over several splits' (samples, target_stats): min of the minima,
    max of the maxima, the mean weighted by samples (unweighted where no split has samples), as
    unrounded as the splits' (:func:`_mean`). A split without samples has no stats (``{}``) and
    adds none; {} where no split has any."""
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(n for _, stats in per_split for n in stats):
        parts = [(samples, stats[name]) for samples, stats in per_split if stats.get(name)]
        if not parts:
            out[name] = {}
            continue
        weight = sum(samples for samples, _ in parts)
        low, high = min(s["min"] for _, s in parts), max(s["max"] for _, s in parts)
        mean = (math.fsum(samples * s["mean"] for samples, s in parts) / weight if weight else
                statistics.fmean(s["mean"] for _, s in parts))
        out[name] = {"min": low, "max": high, "mean": min(max(mean, low), high)}  # within them, whatever rounding did
    return out


def _mean(column: np.ndarray) -> float:
    """The mean of a split's float32 values as the manifest records it: the values' sum as
    float64, correctly rounded (math.fsum: the same in any order of the samples, and no overflow
    of float32's sum near its maximum), over their count, never rounded further. It was rounded to
    6 decimal places, which made the mean of targets in small units (an ADC of 7e-10 m²/s) 0.0,
    below the recorded min; the mean of values in [min, max] so computed is within them. The
    values reach fsum a slice at a time (a float32 value is exact as a Python float), so ten
    million samples never stand as one list of Python floats."""
    step = _MEAN_SLICE
    values = itertools.chain.from_iterable(column[at:at + step].tolist() for at in range(0, len(column), step))
    return math.fsum(values) / len(column)


#: How many values :func:`_mean` turns into Python floats at a time (about 24 MB of them)
_MEAN_SLICE = 1 << 20


@functools.lru_cache(maxsize=64)
def _missing_numbers(tokens: frozenset[str]) -> Mapping[float, str]:
    """The ``missing:`` tokens that are finite numbers (:func:`~packer.targets.base.cell_number`),
    by value: a cell of that value is missing however it is written (``-999``, ``-999.0``)."""
    numbers: dict[float, str] = {}
    for token in sorted(tokens):
        number = cell_number(token)
        if number is not None:
            numbers.setdefault(number, token)
    return numbers


@register_target_kind
class NumericTarget(Target):
    """Numbers per sample; ``names`` name the vector's positions, in the job's column order."""

    KIND: ClassVar[str] = "numeric"
    has_vector: ClassVar[bool] = True
    cells_are_numbers: ClassVar[bool] = True
    inspect_heading: ClassVar[str] = "targets"
    caption_field: ClassVar[str | None] = "target"

    def manifest_record(self) -> dict[str, Any] | None:
        return self.to_json()

    # -- one sample ----------------------------------------------------------------------------------

    @classmethod
    def text_of_cells(cls, cells: Mapping[str, str], *, where: str, separator: str | None,
                      value_map: Mapping[str, str | None], known: Sequence[str],
                      policy: CellPolicy = NO_POLICY) -> str | Refused:
        """Every cell a finite number (``bad_target`` names the first that is not); a cell that is
        one of ``policy.missing`` is ``missing_label`` naming the column and the token: a token
        that is a number (``-999``, as YAML's ``missing: [-999]`` gives it) matches every cell of
        that value, as cells are read (``-999.0``, ``-9.99e2``), any other token (``NA``, ``""``)
        the cell that is its text."""
        values = []
        missing_numbers = _missing_numbers(policy.missing)
        for column, cell in cells.items():
            value = float(cell) if DECIMAL.fullmatch(cell) else math.nan  # not float(): it reads 1_5 as 15
            token = cell if cell in policy.missing else missing_numbers.get(value)
            if token is not None:
                said = repr(cell) if token == cell else f"{cell!r} (the number {token})"
                return Refused("missing_label", f"{where}, column {column!r}: {said} is one of the source's "
                                                "missing-value tokens ('missing:'); the sample has no value here: "
                                                "fill it in, or leave the sample out")
            if not math.isfinite(value):
                what = "empty" if not cell else f"{cell!r} is not a finite number (written as 12, -1.5 or 1e-3)"
                return Refused("bad_target", f"{where}, column {column!r}: {what}; every sample needs a number here")
            if not _fits_float32(value):  # packed as float32, where it would be infinite
                return Refused("bad_target", f"{where}, column {column!r}: {cell!r} is beyond float32's range "
                                             f"(±{FLOAT32_MAX:.4g}), in which targets are packed; rescale the "
                                             "column (another unit), or fix the cell")
            values.append(value)
        return number_text(values)

    @classmethod
    def conflicts(cls, a: str | None, b: str | None, *, tolerance: float) -> bool:
        """A value differing by more than ``tolerance`` (or a different count of values). The
        values are compared as the decimals their text writes (``number_text``), and the tolerance
        as the decimal the job wrote: in binary floating point 0.8 - 0.7 exceeds 0.1 while
        0.6 - 0.5 does not, so gaps of exactly the tolerance conflicted or not by chance."""
        values_a = [Decimal(v) for v in (a or "").split(SEPARATOR) if v]
        values_b = [Decimal(v) for v in (b or "").split(SEPARATOR) if v]
        allowed = Decimal(repr(float(tolerance)))
        return len(values_a) != len(values_b) or any(
            abs(x - y) > allowed for x, y in zip(values_a, values_b, strict=True))

    def _encode(self, text: str, where: str) -> tuple[int | None, np.ndarray | None]:
        values = np.array([float(v) for v in text.split(SEPARATOR)] if text else [], dtype=np.float32)
        if len(values) != len(self.names):
            raise ValueError(f"{where}: {len(values)} numbers for the {len(self.names)} targets {list(self.names)}")
        return None, values

    def record_fields(self, text: str, label: int | None, vector: np.ndarray | None) -> dict[str, Any]:
        if vector is None:
            return {}
        return {"target": dict(zip(self.names, vector.tolist(), strict=True))}

    def record_vector(self, record: Mapping[str, Any]) -> tuple[float, ...] | None:
        values = record.get("target") or {}
        return tuple(float(values.get(name, np.nan)) for name in self.names)

    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        if vector is None:
            return "unlabeled"
        return ", ".join(f"{n}={float(v):g}" for n, v in zip(self.names, vector, strict=False))

    # -- the dataset ------------------------------------------------------------------------------

    @classmethod
    def from_texts(cls, texts: Iterable[str | None], *, labels: tuple[str, ...],
                   columns: tuple[str, ...]) -> Target:
        """The columns, as the job lists them (every source lists the same, in the same order)."""
        return Target(cls.KIND, columns)

    def split_counts(self, labels: np.ndarray, vectors: np.ndarray, masks: np.ndarray | None = None
                     ) -> dict[str, Any]:
        """No class counts; per name min, mean and max of the float32 values ({} for a split
        without samples), none of them rounded (:func:`_mean`)."""
        stats = {name: ({"min": float(column.min()), "mean": _mean(column),
                         "max": float(column.max())} if len(vectors) else {})
                 for i, name in enumerate(self.names) for column in (vectors[:, i],)}
        return {"class_counts": {}, "target_stats": stats}

    # -- what people read -----------------------------------------------------------------------------

    def brief(self, entry: Mapping[str, Any]) -> str:
        return ", ".join(f"{name} {stats['min']:g}..{stats['max']:g}"
                         for name, stats in entry.get("target_stats", {}).items() if stats) or "-"

    def summarize_split(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """No classes; ``target_stats`` as the manifest records them."""
        return {"classes": count_shares(entry["class_counts"], sum(entry["class_counts"].values())),
                "target_stats": entry.get("target_stats", {})}

    def summarize_total(self, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The splits' ``target_stats`` pooled (:func:`pooled_stats`)."""
        return {**super().summarize_total(entries),
                "target_stats": pooled_stats([(e["samples"], e.get("target_stats", {})) for e in entries])}

    def inspect_line(self, label_map: Mapping[str, int]) -> str:
        return f"numeric: {', '.join(self.names) or '-'}"

    def inspect_cells(self, summary: Mapping[str, Any]) -> str:
        stats = summary.get("target_stats") or {}
        return "; ".join(f"{name} min {_number(s.get('min'))} mean {_number(s.get('mean'))} max "
                         f"{_number(s.get('max'))}" for name, s in stats.items()) or "-"

    def index_target(self, label: int | None, vector: Sequence[float] | None,
                     mask: Sequence[int] | None = None) -> tuple[str, TargetValues | None]:
        if vector is None:
            return "(no target)", ()
        values = np.asarray(vector, dtype=self.vector_dtype)
        # float32 numbers by their shortest text (0.1, not 0.10000000149011612): one float32, one value
        pairs = tuple((name, float(str(v))) for name, v in zip(self.names, values, strict=False))
        return self.describe(None, values), pairs

    def compared_target(self, text: str | None, values: TargetValues | None) -> Hashable:
        return frozenset(dict(values or ()).items())

    def diff_names(self, text: str | None, values: TargetValues | None) -> tuple[str, ...]:
        return ()  # numbers are not counted by name; only their changes are (relabel_counts)

    def relabel_counts(self, old: tuple[str | None, TargetValues | None],
                       new: tuple[str | None, TargetValues | None]) -> list[tuple[str, str]]:
        """``relabeled`` for each name whose value changed."""
        before, after = dict(old[1] or ()), dict(new[1] or ())
        return [(name, "relabeled") for name in sorted(before.keys() | after.keys())
                if before.get(name) != after.get(name)]

    def report_fact(self, label_map: Iterable[str]) -> TargetFact:
        return TargetFact("Targets", f"numeric: {', '.join(self.names) or '-'}", "", "target")

    def sheet_words(self, no_label: str) -> SheetWords:
        return SheetWords(group="source", prefix="source ", hover="target values", grouping="")

    def sheet_groups(self, index: SampleGroups, no_label: str) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
        return groups_by_source(index)

    def value_names(self) -> tuple[str, ...]:
        return self.names

    def render(self, renderer: TargetRenderer[T_co]) -> T_co:
        return renderer.render_numeric(self)

    # -- the loader ------------------------------------------------------------------------------------

    def join(self, other: Target) -> tuple[Target, dict[int, int] | None]:
        return join_same_names(self, other)
