"""Labels: each sample's training target, read from its table row, its folder or its DICOM header.

A source's ``label:`` setting (:class:`~packer.config.TargetConfig`) says where the target comes
from; this module turns that one place into the target's text form (:mod:`packer.targets`) or
into the reason code and message of a bad-sample record:

- ``missing_label``: no value where the target should be (an empty class cell, a file directly
  under the root of a ``label: folder`` source, a header without the attribute);
- ``unknown_label``: a value the source's ``map`` (or the job's ``labels:`` list) does not name;
- ``bad_target``: a value the target's kind cannot hold (a multi-label cell that is not 0 or 1,
  a number that does not parse or is not finite).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packer.config import JobConfig, TargetConfig
from packer.targets import SEPARATOR, Target, names_text, number_text

_TRUE = {"1", "1.0", "true", "yes"}
_FALSE = {"0", "0.0", "false", "no"}


@dataclass(frozen=True)
class Refused:
    """Why a sample has no usable target: a reason code and a message naming the value and the fix."""

    reason: str
    message: str


def target_columns(target: TargetConfig) -> tuple[str, ...]:
    """The table columns the target is read from (none for folder, attribute and unlabeled targets)."""
    return target.columns if target.origin == "table" else ()


def _mapped(target: TargetConfig, value: str, where: str, known: tuple[str, ...]) -> str | Refused:
    """A class value through the source's ``map`` and the job's ``labels:`` list."""
    if target.value_map:
        mapped = dict(target.value_map).get(value)
        if mapped is None:
            return Refused("unknown_label", f"{where}: {value!r} is not in the source's label map "
                                            f"({', '.join(k for k, _ in target.value_map)}); add it to 'map:'")
        value = mapped
    if known and value not in known:
        return Refused("unknown_label", f"{where}: {value!r} is not in the job's labels ({', '.join(known)}); "
                                        "fix the value or add the label")
    return value


def from_row(target: TargetConfig, record: Mapping[str, str | None], where: str,
             known: tuple[str, ...] = ()) -> str | Refused:
    """The target text of one table row (``record``: column → cell), or why there is none.
    ``where`` names the table and row; ``known``: the job's ``labels:`` list (empty: any)."""
    cells = {column: (record.get(column) or "").strip() for column in target.columns}
    if target.kind == "class":
        (column,) = target.columns
        if not cells[column]:
            return Refused("missing_label", f"{where}, column {column!r}: empty; give the sample's class")
        return _mapped(target, cells[column], f"{where}, column {column!r}", known)
    if target.kind == "multilabel" and target.separator is not None:
        (column,) = target.columns
        names = [name.strip() for name in cells[column].split(target.separator)]
        names = [name for name in names if name]
        unknown = [name for name in names if known and name not in known]
        if unknown:
            return Refused("unknown_label", f"{where}, column {column!r}: {unknown[0]!r} is not in the job's labels "
                                            f"({', '.join(known)}); fix the value or add the label")
        if any(SEPARATOR in name for name in names):
            return Refused("bad_target", f"{where}, column {column!r}: a label name may not contain {SEPARATOR!r}")
        return names_text(names)
    if target.kind == "multilabel":
        positive = []
        for column, cell in cells.items():
            if cell.lower() in _TRUE:
                positive.append(column)
            elif cell.lower() not in _FALSE:
                return Refused("bad_target", f"{where}, column {column!r}: {cell!r} is not 0 or 1; a multi-label "
                                             "column holds 0 or 1 for every sample")
        return names_text(positive)
    values = []
    for column, cell in cells.items():
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            what = "empty" if not cell else f"{cell!r} is not a finite number"
            return Refused("bad_target", f"{where}, column {column!r}: {what}; every sample needs a number here")
        values.append(value)
    return number_text(values)


def from_folder(target: TargetConfig, relpath: str, root: str, known: tuple[str, ...] = ()) -> str | Refused:
    """The class of a file at ``relpath`` under a ``label: folder`` source: its first folder."""
    folder, slash, _ = relpath.partition("/")
    if not slash:
        return Refused("missing_label", f"{root}/{relpath}: directly under the root, not in a class folder; "
                                        "a 'label: folder' source reads the class from root/<class>/<file>: "
                                        "move the file into its class folder")
    return _mapped(target, folder, f"{root}/{relpath}, folder {folder!r}", known)


def from_attribute(target: TargetConfig, value: str | None, path: str, known: tuple[str, ...] = ()) -> str | Refused:
    """The class of a DICOM file whose ``target.attribute`` holds ``value`` (None: absent or empty)."""
    if value is None or not value.strip():
        return Refused("missing_label", f"{path}: no {target.attribute} value to label the file with; fill the "
                                        "attribute, or leave the file out")
    return _mapped(target, value.strip(), f"{path}, {target.attribute}", known)


def dataset_target(job: JobConfig, texts: Iterable[str | None]) -> Target:
    """The dataset's target from the job and the target texts of its packed samples: its kind
    (the sources agree, :func:`packer.config.parse_job` checks) and names in a fixed order. Class
    names and multi-label names: the job's ``labels:`` list, else the 0/1 columns in the order the
    job lists them followed by the other names seen, sorted. Numeric: the columns, as listed."""
    kind = job.sources[0].target.kind
    if kind == "none":
        return Target("none")
    if kind == "numeric":
        return Target("numeric", job.sources[0].target.columns)
    if job.labels:
        return Target(kind, job.labels)
    seen = {name for text in texts
            for name in ((text or "").split(SEPARATOR) if kind == "multilabel" else [text or ""])}
    if kind == "class":
        return Target("class", tuple(sorted(seen)))
    listed: list[str] = []
    for source in job.sources:
        if source.target.origin == "table" and source.target.separator is None:
            listed.extend(c for c in source.target.columns if c not in listed)
    return Target("multilabel", (*listed, *sorted(seen.difference(listed, {""}))))
