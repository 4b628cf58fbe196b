"""Labels: each sample's training target, read from its table row, its folder or its DICOM header.

A source's ``label:`` setting (:class:`~packer.config.TargetConfig`) says where the target comes
from; this module turns that one place into the target's text form (:mod:`packer.targets`) or
into the reason code and message of a bad-sample record:

- ``missing_label``: no value where the target should be (an empty class cell, a numeric cell
  holding one of the source's ``missing:`` tokens, a file directly under the root of a
  ``label: folder`` source, a header without the attribute);
- ``unknown_label``: a value the source's ``map`` (or the job's ``labels:`` list) does not name;
- ``bad_target``: a value the target's kind cannot hold (a multi-label cell that is not 0 or 1,
  or is uncertain or blank without a policy for it; a number that does not parse or is not finite).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from packer.config import UNCERTAIN_VALUES, JobConfig, TargetConfig
from packer.targets import CellPolicy, Refused, Target, mapped_name, target_class

__all__ = ["Refused", "cell_policy", "dataset_target", "from_attribute", "from_folder", "from_row", "target_columns"]


def target_columns(target: TargetConfig) -> tuple[str, ...]:
    """The table columns the target is read from (none for folder, attribute and unlabeled targets)."""
    return target.columns if target.origin == "table" else ()


def _mapped(target: TargetConfig, value: str, where: str, known: tuple[str, ...]) -> str | Refused:
    """A class value through the source's ``map`` and the job's ``labels:`` list."""
    return mapped_name(value, target.class_map, known, where)


def from_row(target: TargetConfig, record: Mapping[str, str | None], where: str,
             known: tuple[str, ...] = ()) -> str | Refused:
    """The target text of one table row (``record``: column → cell), or why there is none.
    ``where`` names the table and row; ``known``: the job's ``labels:`` list (empty: any).
    The target's kind reads the cells (:meth:`~packer.targets.Target.text_of_cells`)."""
    cells = {column: (record.get(column) or "").strip() for column in target.columns}
    return target_class(target.kind).text_of_cells(cells, where=where, separator=target.separator,
                                                   value_map=dict(target.value_map), known=known,
                                                   policy=cell_policy(target))


def cell_policy(target: TargetConfig) -> CellPolicy:
    """How the source's missing, uncertain and blank cells read (its ``label:`` settings)."""
    uncertain = {column: target.uncertain_policy(column) for column in target.columns} if target.uncertain else None
    values = target.uncertain_values if target.uncertain_values is not None else UNCERTAIN_VALUES
    return CellPolicy(missing=frozenset(target.missing), uncertain=uncertain, uncertain_values=frozenset(values),
                      blank=target.blank)


def from_folder(target: TargetConfig, relpath: str, root: str, known: tuple[str, ...] = ()) -> str | Refused:
    """The class of a file at ``relpath`` under a ``label: folder`` source: its first folder, or
    the ``component``-th part of its path (``label: {folder: true, component: 1}``: the class
    folder of a ``train/<class>/<file>`` tree), counted as ``fields:`` count them. A file whose
    path has no folder there (the index falls on its file name, or past it) has no class."""
    parts = relpath.split("/")
    index = target.component
    folders = len(parts) - 1
    if not (0 <= index < folders or -len(parts) <= index <= -2):
        if not target.component:
            return Refused("missing_label", f"{root}/{relpath}: directly under the root, not in a class folder; "
                                            "a 'label: folder' source reads the class from root/<class>/<file>: "
                                            "move the file into its class folder")
        return Refused("missing_label", f"{root}/{relpath}: its path has {folders} folder(s), none at label.component "
                                        f"{index} (0: the first folder under the root, -2: the file's own): move "
                                        "the file into its class folder, or fix label.component")
    folder = parts[index]
    return _mapped(target, folder, f"{root}/{relpath}, folder {folder!r}", known)


def from_attribute(target: TargetConfig, value: str | None, path: str, known: tuple[str, ...] = ()) -> str | Refused:
    """The class of a DICOM file whose ``target.attribute`` holds ``value`` (None: absent or empty)."""
    if value is None or not value.strip():
        return Refused("missing_label", f"{path}: no {target.attribute} value to label the file with; fill the "
                                        "attribute, or leave the file out")
    return _mapped(target, value.strip(), f"{path}, {target.attribute}", known)


def dataset_target(job: JobConfig, texts: Iterable[str | None]) -> Target:
    """The dataset's target from the job and the target texts of its packed samples: its kind
    (the sources agree, :func:`packer.config.parse_job` checks) names them in a fixed order
    (:meth:`~packer.targets.Target.from_texts`): the job's ``labels:`` list, the columns of
    the sources' tables (0/1 label columns, numeric targets' columns) in the order the job
    lists them, and the names seen."""
    columns: list[str] = []
    for source in job.sources:
        columns.extend(c for c in source.target.named_columns if c not in columns)
    target = target_class(job.sources[0].target.kind).from_texts(texts, labels=job.labels, columns=tuple(columns))
    # a target mask only where a source may ignore entries, so every other dataset's shards stay as they were
    return replace(target, masked=True) if any(source.target.ignores for source in job.sources) else target
