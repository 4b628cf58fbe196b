"""Row and header filters: a source's ``where:`` conditions, parsed once and tested against values.

A job keeps only the table rows (or DICOM files, by their header attributes) that meet every
condition of its source's ``where:``. What the conditions leave out is not a bad sample: it is
counted as filtered and listed, never packed. One condition per key::

    where:
      Frontal/Lateral: Frontal              # equality
      AP/PA: [AP, PA]                       # membership
      ImageType: {not: [LOCALIZER, DERIVED]}  # none of these
      SeriesDescription: {match: "ax|axial"}  # a regular expression found in the value (any case)

A key may hold several values (a multi-valued DICOM attribute such as ImageType): equality and
membership hold when any value is listed, ``not`` when none is, ``match`` when any matches.
Numbers compare as numbers, so ``1`` matches a cell written ``1.0``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packer.errors import ConfigError

#: The operators a condition may use, as the job file writes them.
OPERATORS = ("in", "not", "match")


def _text(value: Any) -> str:
    """A job file's scalar as the text a cell would hold (YAML ``true`` is ``true``, not ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _same(value: str, wanted: str) -> bool:
    if value == wanted:
        return True
    a, b = _number(value), _number(wanted)
    return a is not None and b is not None and a == b


@dataclass(frozen=True)
class Condition:
    """One ``where:`` condition: ``key`` (a table column or a header keyword), ``op`` (``in``,
    ``not`` or ``match``) and ``values`` (the listed values, or the one regular expression)."""

    key: str
    op: str
    values: tuple[str, ...]

    def holds(self, values: Iterable[str]) -> bool:
        """Whether a row's or header's ``values`` for :attr:`key` meet the condition (an absent
        or empty value is no value: it meets ``not`` only)."""
        present = [v.strip() for v in values if v is not None and v.strip()]
        if self.op == "match":
            pattern = re.compile(self.values[0], re.IGNORECASE)
            return any(pattern.search(v) for v in present)
        listed = any(_same(v, w) for v in present for w in self.values)
        return not listed if self.op == "not" else listed

    def describe(self) -> str:
        """The condition as a person reads it: ``AP/PA in [AP, PA]``."""
        if self.op == "match":
            return f"{self.key} matches /{self.values[0]}/"
        shown = self.values[0] if len(self.values) == 1 else f"[{', '.join(self.values)}]"
        if self.op == "not":
            return f"{self.key} is not {shown}"
        return f"{self.key} = {shown}" if len(self.values) == 1 else f"{self.key} in {shown}"

    def to_json(self) -> Any:
        if self.op == "in":
            return self.values[0] if len(self.values) == 1 else list(self.values)
        if self.op == "match":
            return {"match": self.values[0]}
        return {"not": list(self.values)}


def parse_where(raw: Mapping[str, Any] | None, where: str) -> tuple[Condition, ...]:
    """The conditions of a ``where:`` mapping (key → value, list, ``{in|not|match: ...}``),
    sorted by key. Raises ConfigError for an empty list, an unknown operator or a bad pattern."""
    out = []
    for key, spec in (raw or {}).items():
        at = f"{where}.{key}"
        if isinstance(spec, Mapping):
            if len(spec) != 1 or next(iter(spec)) not in OPERATORS:
                raise ConfigError(f"{at}: give a value, a list of values, or one of {{in: [...]}}, {{not: [...]}}, "
                                  f"{{match: REGEX}}; got {dict(spec)!r}")
            op, value = next(iter(spec.items()))
        else:
            op, value = "in", spec
        if op == "match":
            text = _text(value)
            try:
                re.compile(text)
            except re.error as err:
                raise ConfigError(f"{at}.match: {text!r} is not a regular expression ({err}); escape special "
                                  "characters, e.g. '\\.'") from err
            out.append(Condition(str(key), op, (text,)))
            continue
        values = tuple(_text(v) for v in (value if isinstance(value, list) else [value]))
        if not values:
            raise ConfigError(f"{at}: an empty list keeps nothing; list the values to keep, or remove the key")
        if not all(values):  # "" would read as "keep (or drop) the empty cells", and did neither
            raise ConfigError(f"{at}: an empty value never matches: an empty cell is no value (it meets {{not: "
                              f"[...]}} whatever the list holds, and no listed value); to leave out the rows whose "
                              f"{key} is empty, write {key}: {{match: '.'}}")
        out.append(Condition(str(key), op, values))
    return tuple(sorted(out, key=lambda c: c.key))


def failed(conditions: Iterable[Condition], lookup: Mapping[str, Iterable[str]]) -> Condition | None:
    """The first condition the values in ``lookup`` (key → its values) do not meet, None when
    all hold: the reason a row or file is filtered out."""
    for condition in conditions:
        if not condition.holds(lookup.get(condition.key, ())):
            return condition
    return None
