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
Values compare in NFC (one spelling of text whatever its Unicode form, as entity ids, class
folders and table cells are): ``Zürich`` with one code point for the ``ü`` is the same cell
written with ``u`` and a combining mark.
A value the job writes as a number (unquoted YAML: ``1``, ``2.5``) compares as a number with
cells in plain decimal notation, so ``1`` matches a cell written ``1.0`` or ``1e0``; a value the
job writes as text (quoted: ``'007'``) matches only that text, as ids with leading zeros are
distinct entities everywhere else in packer. A value ``true`` or ``false`` (YAML's boolean, or
quoted) matches the cell in any of YAML's spellings, ``true``, ``True`` (as pandas writes a bool
column) or ``TRUE``, as a ``map:`` key does.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packer.errors import ConfigError
from packer.targets.base import cell_number

#: The operators a condition may use, as the job file writes them.
OPERATORS = ("in", "not", "match")


def _text(value: Any) -> str:
    """A job file's scalar as the text a cell would hold (YAML ``true`` is ``true``, not ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


#: The spellings YAML reads as one boolean: a ``where:`` value ``true`` or ``false`` (quoted or
#: not, as a ``map:`` key) matches a cell in any of them, ``True`` as pandas writes a bool column
BOOL_TEXTS = (("true", "True", "TRUE"), ("false", "False", "FALSE"))
_SPELLINGS = {text: texts for texts in BOOL_TEXTS for text in texts}


def _number(value: Any) -> int | float | None:
    """``value`` where the job file writes it as a number (unquoted ``10``, ``2.5``), else None: a
    quoted ``'007'`` is text, and YAML's ``true`` is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None  # YAML's .inf and .nan are compared as the text a cell would hold ('inf')
    return value


def _same(value: str, wanted: str, number: int | float | None) -> bool:
    """Whether a cell's ``value`` is the job's ``wanted``: the same text, or, where the job wrote
    a number, the same number in plain decimal notation (:func:`~packer.targets.base.cell_number`:
    ``10.0`` and ``1e1`` are 10, but not ``1_0`` or a full-width ``１０``, which Python's float()
    would read), or, where the job wrote true or false, the same boolean in another of YAML's
    spellings (``True``, ``TRUE``), as a ``map:`` key matches. Text compares in NFC: ``Zürich``
    typed with one code point for the ``ü`` is the cell a macOS export wrote with ``u`` and a
    combining mark, which prints alike."""
    value, wanted = unicodedata.normalize("NFC", value), unicodedata.normalize("NFC", wanted)
    if value == wanted:
        return True
    if number is None:
        return value in _SPELLINGS.get(wanted, ())
    return cell_number(value) == number


@dataclass(frozen=True)
class Condition:
    """One ``where:`` condition: ``key`` (a table column or a header keyword), ``op`` (``in``,
    ``not`` or ``match``) and ``values`` (the listed values, or the one regular expression);
    ``numbers``: for each value the job wrote as a number, that number (None for text), compared
    as a number; empty where every value is text."""

    key: str
    op: str
    values: tuple[str, ...]
    numbers: tuple[int | float | None, ...] = ()

    def holds(self, values: Iterable[str]) -> bool:
        """Whether a row's or header's ``values`` for :attr:`key` meet the condition (an absent
        or empty value is no value: it meets ``not`` only). Text compares in NFC, the job's and
        the value's alike, and a pattern searches the value's NFC form."""
        present = [v.strip() for v in values if v is not None and v.strip()]
        if self.op == "match":  # pattern and values in NFC, as _same compares them
            pattern = re.compile(unicodedata.normalize("NFC", self.values[0]), re.IGNORECASE)
            return any(pattern.search(unicodedata.normalize("NFC", v)) for v in present)
        numbers = self.numbers or (None,) * len(self.values)
        listed = any(_same(v, w, n) for v in present for w, n in zip(self.values, numbers, strict=True))
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
        """The condition as the job wrote it: a number stays a number, as it is compared as one."""
        if self.op == "match":
            return {"match": self.values[0]}
        numbers = self.numbers or (None,) * len(self.values)
        written = [w if n is None else n for w, n in zip(self.values, numbers, strict=True)]
        if self.op == "in":
            return written[0] if len(written) == 1 else written
        return {"not": written}


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
        listed = value if isinstance(value, list) else [value]
        values = tuple(_text(v) for v in listed)
        if not values:
            raise ConfigError(f"{at}: an empty list keeps nothing; list the values to keep, or remove the key")
        if not all(values):  # "" would read as "keep (or drop) the empty cells", and did neither
            raise ConfigError(f"{at}: an empty value never matches: an empty cell is no value (it meets {{not: "
                              f"[...]}} whatever the list holds, and no listed value); to leave out the rows whose "
                              f"{key} is empty, write {key}: {{match: '.'}}")
        numbers = tuple(_number(v) for v in listed)
        out.append(Condition(str(key), op, values, numbers if any(n is not None for n in numbers) else ()))
    return tuple(sorted(out, key=lambda c: c.key))


def failed(conditions: Iterable[Condition], lookup: Mapping[str, Iterable[str]]) -> Condition | None:
    """The first condition the values in ``lookup`` (key → its values) do not meet, None when
    all hold: the reason a row or file is filtered out."""
    for condition in conditions:
        if not condition.holds(lookup.get(condition.key, ())):
            return condition
    return None
