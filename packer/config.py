"""Load a job file (YAML) into frozen dataclasses, validated against ``schemas/job.schema.json``.

The schema is the single source of truth for what a job file may say; this module turns
a valid document into typed records with defaults filled in and paths resolved
relative to the job file. A source's ``root``, ``labels`` or ``table`` may be an fsspec URL
(``s3://bucket/raw``): it stays a string, as written (``file://`` URLs become local paths);
only its protocol is checked here, without any request. ``JobConfig.identity()`` is the part of the job that defines
the dataset (it is hashed into ``dataset_hash``); execution options such as the output
folder or the worker count are kept out of it.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from packer.errors import ConfigError, a_type, blocking_file, exhausted
from packer.files import parse_byte_size
from packer.records import safe_key
from packer.schemas import joined_surrogate_pairs, schema_defaults, validate_document
from packer.storage import check_protocol, is_url, local_path
from packer.structures import Structure, StructureMap, code_key, normalise_name
from packer.where import BOOL_TEXTS, Condition, parse_where

if TYPE_CHECKING:  # the kinds import this module; the mask parser only asks one what it reads
    from packer.read.kinds import SourceKind

SPLITS = ("train", "valid", "test")
#: The cells of a multilabel 0/1 column that mean "uncertain" unless ``uncertain_values:`` says
#: otherwise (CheXpert's labeler writes -1.0)
UNCERTAIN_VALUES = ("-1", "-1.0")
#: What ``uncertain:`` may make of an uncertain 0/1 cell, and ``blank:`` of an empty one
UNCERTAIN_POLICIES = ("ones", "zeros", "ignore", "bad")
BLANK_POLICIES = ("bad", "zeros", "ignore")
#: The split policies whose assignment is given by the data (official lists, a table column).
GIVEN = ("list", "column")
#: What a split list's items name (``split.match``).
MATCHES = ("path", "name", "stem", "entity")


def job_default(path: str) -> Any:
    """The default ``schemas/job.schema.json`` declares for the key at dotted ``path`` (the schema is
    the one place defaults are written; defaults that depend on the source's kind stay in code)."""
    return schema_defaults("job")[path]


@dataclass(frozen=True)
class WindowSpec:
    """One requested output channel's intensity mapping. ``kind`` is ``preset``, ``explicit``
    or ``file`` (a window: fixed values, CT's Hounsfield units), or ``percentiles`` or ``zscore``
    (a normalisation from the image's own values, for MR and other uncalibrated modalities:
    :mod:`packer.transform.intensity`).

    ``values`` (NIfTI's ``windows: []``, float16 only) is no mapping: the voxels' own values.

    ``file`` windows take the file's own window (DICOM Window Center/Width, NIfTI
    ``cal_min``/``cal_max``): ``selector`` is the index of the pair (default 0) or its Window
    Center & Width Explanation text. ``percentiles``: ``low`` and ``high`` (0-100) become 0 and
    1; ``zscore``: ``(x - mean) / std``; both take their statistics ``over`` all values or the
    non-zero ones.
    """

    kind: str
    name: str
    center: float | None = None
    width: float | None = None
    function: str = "LINEAR"
    selector: int | str = 0
    low: float | None = None
    high: float | None = None
    over: str = ""

    @property
    def normalises(self) -> bool:
        """True for a normalisation (percentiles, z-score): its values come from the image."""
        return self.kind in ("percentiles", "zscore")

    def to_json(self) -> dict[str, Any]:
        if self.kind == "file":
            return {"file": self.selector}
        if self.kind == "percentiles":
            return {"percentiles": [self.low, self.high], "over": self.over}
        if self.kind == "zscore":
            return {"zscore": {"over": self.over}}
        if self.kind == "values":
            return {"values": True}
        return {"name": self.name, "center": self.center, "width": self.width, "function": self.function}


@dataclass(frozen=True)
class TargetConfig:
    """A source's ``label:``: where each sample's training target comes from and what it is
    (see :mod:`packer.targets`). ``origin``: ``table`` (columns of the label table), ``folder``
    (a folder of the file's path under the root: the ``component``-th, as ``fields:`` count them;
    0, the first, is the ImageFolder layout, 1 a ``train/<class>/<file>`` tree's), ``attribute``
    (a DICOM header attribute) or ``none`` (unlabeled). ``kind``: class, multilabel, numeric or none.
    ``value_map``: raw value → class name (a value the map lacks is ``unknown_label``), or, for
    a multilabel column of names, raw token → label name or None (the token is dropped; a token
    the map lacks is kept as it is).

    Cell policies (each only where it applies, empty/default otherwise, so a job that does not
    use them keeps its config_hash): ``missing``, numeric cells that mean "no value"
    (``missing_label``); ``uncertain``, for multilabel 0/1 columns, (column or ``default``,
    policy) pairs saying what an uncertain cell (one of ``uncertain_values``, default
    :data:`UNCERTAIN_VALUES`) becomes: ``ones``, ``zeros``, ``ignore`` (masked out of the loss,
    ``target_mask``) or ``bad`` (a ``bad_target`` sample, as without ``uncertain``); ``blank``,
    what an empty 0/1 cell becomes (``bad``, ``zeros``, ``ignore``)."""

    kind: str = "class"
    origin: str = "table"
    columns: tuple[str, ...] = ("label",)
    attribute: str | None = None
    value_map: tuple[tuple[str, str | None], ...] = ()
    separator: str | None = None
    missing: tuple[str, ...] = ()
    uncertain: tuple[tuple[str, str], ...] = ()
    uncertain_values: tuple[str, ...] | None = None
    blank: str = "bad"
    component: int = 0

    @property
    def is_default(self) -> bool:
        return self == TargetConfig()

    @property
    def class_map(self) -> dict[str, str]:
        """The value map of a class target (raw value → class name); config parsing refuses a
        null name there, so none is dropped."""
        return {raw: name for raw, name in self.value_map if name is not None}

    @property
    def named_columns(self) -> tuple[str, ...]:
        """The target names this source's columns stand for, in job order: 0/1 multilabel and
        numeric columns by their names, one-hot class columns by their classes (through the
        map); none for a column of names or of class values, whose names are the cells'."""
        if self.origin != "table" or self.separator is not None or (self.kind == "class" and len(self.columns) == 1):
            return ()
        if self.kind == "class" and self.class_map:  # a column the map lacks is unknown_label: no class
            return tuple(dict.fromkeys(self.class_map[column] for column in self.columns if column in self.class_map))
        return self.columns

    def uncertain_policy(self, column: str) -> str:
        """What an uncertain cell of the 0/1 ``column`` becomes: its own policy, else the
        ``default`` one, else ``bad``."""
        policies = dict(self.uncertain)
        return policies.get(column, policies.get("default", "bad"))

    @property
    def ignores(self) -> bool:
        """Whether some cell may become an ignored label (a target mask entry of 0)."""
        return self.blank == "ignore" or any(policy == "ignore" for _, policy in self.uncertain)

    def to_json(self) -> Any:
        if self.origin in ("none", "folder") and not self.value_map and not self.component:
            return self.origin
        out: dict[str, Any] = {"kind": self.kind}
        if self.origin == "table":
            out["columns"] = list(self.columns)
        elif self.origin == "attribute":
            out["attribute"] = self.attribute
        else:
            out["folder"] = True
            if self.component:  # absent at 0, so a job without it keeps its config_hash
                out["component"] = self.component
        if self.value_map:
            out["map"] = dict(self.value_map)
        if self.separator is not None:
            out["separator"] = self.separator
        if self.missing:
            out["missing"] = list(self.missing)
        if self.uncertain:
            policies = dict(self.uncertain)
            out["uncertain"] = policies["default"] if list(policies) == ["default"] else policies
        if self.uncertain_values is not None:
            out["uncertain_values"] = list(self.uncertain_values)
        if self.blank != "bad":
            out["blank"] = self.blank
        return out


@dataclass(frozen=True)
class MaskConfig:
    """A source's ``mask:``: each sample's segmentation mask is the file its table's ``column``
    names (relative to the source root). ``classes``: the declared class ids (None: any id up to
    255); ``empty``: ``keep`` an all-zero mask, or make its file a ``mask_empty`` bad sample;
    ``pad``: the id ``fit`` pads with; ``grid``: for a volume's label map on another grid than
    its image, ``require`` (a ``mask_geometry`` bad sample) or ``resample`` (nearest neighbour,
    in world coordinates). Masks are uint8, uint16 when a declared id exceeds 255.

    ``origin`` ``dicom`` (``mask: {from: dicom}``): the masks are the DICOM SEG and RTSTRUCT
    objects of the source itself, each on the series it references
    (:mod:`packer.read.annotations`); ``segments`` and ``rois`` map their structures to class
    ids (``classes`` is then 0 and those ids), ``overlap`` says which class a voxel two claim
    gets (``later_wins``: the class declared later; ``refuse``: ``mask_overlap``),
    ``threshold`` where a FRACTIONAL SEG is on, and ``empty`` what a series that no annotation
    references gets (``keep``: all-zero masks; ``bad``: ``mask_missing``); ``column`` is empty."""

    column: str
    classes: tuple[int, ...] | None = None
    empty: str = "keep"
    pad: int = 0
    grid: str = "require"
    origin: str = "file"
    segments: StructureMap | None = None
    rois: StructureMap | None = None
    overlap: str = "later_wins"
    threshold: float = 0.5

    @property
    def from_dicom(self) -> bool:
        """The masks come from the source's own SEG and RTSTRUCT objects."""
        return self.origin != "file"

    def structures(self) -> StructureMap:
        """Every class of ``segments`` and ``rois`` in declared order (as the job file writes them):
        the order ``overlap: later_wins`` ranks them by."""
        maps = [m for m in (self.segments, self.rois) if m is not None]
        if len(maps) == 2 and self.rois_first:
            maps.reverse()
        return StructureMap(tuple(s for m in maps for s in m.structures))

    #: ``rois:`` is written before ``segments:`` in the job file (their classes rank first)
    rois_first: bool = False

    @property
    def dtype(self) -> str:
        return "uint16" if self.classes and max(self.classes) > 255 else "uint8"

    def relpath(self, extra: tuple[tuple[str, str], ...]) -> str:
        """The mask file a table row names (its ``column`` cell, relative to the source root;
        ``""`` where the row names none), from the row's extra columns."""
        return dict(extra).get(self.column, "").strip()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"column": self.column,
                               "classes": list(self.classes) if self.classes is not None else None,
                               "empty": self.empty, "pad": self.pad}
        if self.grid != "require":  # only when set, so other jobs keep their config_hash
            out["grid"] = self.grid
        if self.from_dicom:  # likewise
            del out["column"]
            out["from"] = "dicom"
            maps = [("segments", self.segments), ("rois", self.rois)]
            for key, structures in (reversed(maps) if self.rois_first else maps):
                if structures is not None:
                    out[key] = structures.to_json()
            out["overlap"] = self.overlap
            # the rank order under later_wins, which a canonical (sorted-key) dump would lose
            out["order"] = [structure.name for structure in self.structures().structures]
            out["threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class JoinConfig:
    """One more table joined onto a source's table (``table.join``): its rows are matched to the
    table's rows by the ``on`` columns, and their other columns added. ``missing``: a table row
    without a match is a ``join_unmatched`` bad sample (``bad``) or filtered out (``drop``)."""

    file: Path | str
    file_spec: str
    on: tuple[str, ...]
    missing: str = "bad"
    repeated: str = "refuse"
    records: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file_spec, "on": list(self.on), "missing": self.missing,
                               "repeated": self.repeated}
        if self.records is not None:
            out["records"] = self.records
        return out


@dataclass(frozen=True)
class TableConfig:
    """How a source's table names its files and rows (``table:`` or ``labels:`` as an object).

    ``path``: the column naming each file, or ``template``: a file name built from columns
    (``{dicom_id}.jpg``, Python format syntax); ``path_base``: the folder the paths are relative
    to (default: the source root); ``find``: ``path`` (a relative path) or ``name`` (a bare
    file name, found anywhere under the root; a name found twice is ``ambiguous_path``);
    ``files``: ``root`` (every file under the root is the dataset's, one without a row is a
    ``missing_label`` bad sample) or ``table`` (the table says which files are in it; the rest
    are counted as not in the table); ``repeated``: rows naming one file are refused
    (``refuse``), kept when they agree on the target (``same``), or their multi-label targets
    united (``union``); ``records``: for a JSON table, the key of its list of records (the
    Medical Segmentation Decathlon's ``training``); ``join``: more tables joined on columns;
    ``missing``: a row naming no file under the root is a ``missing_file`` bad sample (``bad``) or,
    for a partial download, left out as ``not_downloaded`` (``drop``)."""

    file: Path | str
    file_spec: str
    path: str = "path"
    template: str | None = None
    path_base: Path | str | None = None
    path_base_spec: str | None = None
    find: str = "path"
    files: str = "root"
    repeated: str = "refuse"
    records: str | None = None
    join: tuple[JoinConfig, ...] = ()
    missing: str = "bad"

    @property
    def is_plain(self) -> bool:
        """A table given as a file name only (every setting at its default)."""
        return self == TableConfig(file=self.file, file_spec=self.file_spec)

    def to_json(self) -> Any:
        if self.is_plain:  # as before tables had settings: the same config_hash
            return self.file_spec
        out: dict[str, Any] = {"file": self.file_spec, "find": self.find, "files": self.files,
                               "repeated": self.repeated}
        out["path"] = {"template": self.template} if self.template is not None else self.path
        if self.path_base_spec is not None:
            out["path_base"] = self.path_base_spec
        if self.records is not None:
            out["records"] = self.records
        if self.join:
            out["join"] = [j.to_json() for j in self.join]
        if self.missing != "bad":  # absent at its default: the config_hash of a job without it is unchanged
            out["missing"] = self.missing
        return out


#: A file name's suffixes, as a time read from the name leaves them out: ``.png``, ``.nii.gz``, each a
#: dot and a letter, then letters and digits (``.5``, a fraction of a second, is none)
SUFFIXES = re.compile(r"(?:\.[A-Za-z][A-Za-z0-9]*)+$")


@dataclass(frozen=True)
class PathField:
    """A value read from each file's path relative to the root (``entity: {path: REGEX}``,
    ``{component: N}``): the regular expression's group named like the field (else its first
    group, else the whole match), or the path's ``component``-th folder or file name (0 is
    the first folder under the root, -1 the file name)."""

    name: str
    pattern: str | None = None
    component: int | None = None
    #: Read a file name without its suffixes (``time:``; not in :meth:`to_json`, which the job writes)
    stem: bool = False

    def value(self, relpath: str) -> str | None:
        """The field's value in ``relpath``, None where the pattern does not match or the
        path has no such component. A ``stem`` field (``time:``) reads a file name
        (:meth:`reads_file_name`) without its suffixes (``2023-05-01.png`` and ``2023-05-01.nii.gz``
        read ``2023-05-01``; :data:`SUFFIXES`), which no ISO time holds; any other, the entity first
        (it keys the dataset), reads the whole name."""
        text = self.part(relpath)
        if text is None or not self.stem or not self.reads_file_name(relpath):
            return text
        return SUFFIXES.sub("", text) or text

    def part(self, relpath: str) -> str | None:
        """The part of ``relpath`` the field reads, as written: its component, or the pattern's
        group (named like the field, else the first, else the whole match); None where there is none."""
        if self.component is not None:
            parts = relpath.split("/")
            return parts[self.component] if -len(parts) <= self.component < len(parts) else None
        assert self.pattern is not None
        found = re.search(self.pattern, relpath)
        if found is None:
            return None
        if self.name in found.re.groupindex:
            return found.group(self.name)
        return found.group(1) if found.re.groups else found.group(0)

    def reads_file_name(self, relpath: str) -> bool:
        """True where ``component`` names ``relpath``'s file name (``-1``, or the last part's index)."""
        return self.component is not None and self.component in (-1, relpath.count("/"))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.pattern} if self.pattern is not None else {"component": self.component}


@dataclass(frozen=True)
class SourceConfig:
    """One raw source. ``root``, ``labels`` and ``table`` are local paths (resolved against the
    job file) or URL strings (``s3://...``, read through :mod:`packer.pipeline.rawstore`); the ``*_spec``
    fields keep what the job file says, which is what the dataset's identity records."""

    kind: str
    name: str
    root: Path | str
    root_spec: str
    entity: str
    time: tuple[str, ...]
    labels: Path | str | None = None
    labels_spec: str | None = None
    table: Path | str | None = None
    table_spec: str | None = None
    target: TargetConfig = field(default_factory=TargetConfig)
    mask: MaskConfig | None = None
    #: The kind's own source keys (:meth:`packer.read.kinds.SourceKind.parse_source`), sorted pairs
    options: tuple[tuple[str, Any], ...] = ()
    #: Table columns naming further files of a row's sample (a NIfTI case's other sequences):
    #: their files are not samples of their own, and they are part of the sample's cache key
    companions: tuple[str, ...] = ()

    #: How the table names files and rows (None: no table; a plain file: every default)
    table_map: TableConfig | None = None
    #: ``entity:`` / ``time:`` read from each file's path instead of a column
    entity_path: PathField | None = None
    time_path: PathField | None = None
    #: ``entity: {column, empty}``: a row whose entity cell is empty is ``bad`` (``missing_entity``)
    #: or its file is its own entity (``file``: ISIC's images without a lesion id)
    entity_empty: str = "bad"
    #: ``fields:`` more values read from each file's path, as extra columns of its row
    fields: tuple[PathField, ...] = ()
    #: ``where:`` conditions on table columns (rows that fail are filtered out while listing)
    where: tuple[Condition, ...] = ()
    #: ``where:`` conditions on header attributes (:meth:`packer.read.kinds.SourceKind.header_keys`:
    #: files that fail are filtered out by the probe, before any pixel is decoded)
    header_where: tuple[Condition, ...] = ()
    #: Whether the table must have the ``time`` column: the job names it (``time: tstamp``), or
    #: splits by time; a default column that is absent is fine otherwise (not part of the identity)
    time_required: bool = field(default=False, compare=False)

    @property
    def label_table(self) -> Path | str | None:
        """The CSV that gives this source's labels (and, where the kind reads them from a table,
        entities and times): ``labels`` or ``table``, whichever its kind takes; None where there
        is none."""
        return self.labels if self.labels is not None else self.table

    def option(self, key: str, default: Any = None) -> Any:
        """The kind's own source key ``key`` (:attr:`options`), or ``default``."""
        return dict(self.options).get(key, default)

    def file_columns(self) -> tuple[str, ...]:
        """The table columns whose cells name files that belong to a row's sample rather than
        being samples: the mask column and the :attr:`companions`."""
        return ((self.mask.column,) if self.mask is not None and self.mask.column else ()) + self.companions

    def row_file(self, extra: tuple[tuple[str, str], ...], column: str) -> str | None:
        """The local path of the file a row's ``column`` names (relative to the root), None where
        the cell is empty."""
        relpath = dict(extra).get(column, "").strip()
        return os.path.join(os.fspath(self.root), relpath) if relpath else None

    def mask_file(self, extra: tuple[tuple[str, str], ...]) -> str | None:
        """The local path of a row's mask file (``mask.column``), None where it names none."""
        return self.row_file(extra, self.mask.column) if self.mask is not None and self.mask.column else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "root": self.root_spec,
                               "entity": self.entity_path.to_json() if self.entity_path else self.entity if
                               self.entity_empty == "bad" else {"column": self.entity, "empty": self.entity_empty},
                               "time": self.time_path.to_json() if self.time_path else list(self.time)}
        table = self.table_map.to_json() if self.table_map is not None else None
        if self.labels_spec:
            out["labels"] = table
        if self.table_spec:
            out["table"] = table
        if self.fields:  # only when set, so other jobs keep their config_hash
            out["fields"] = {f.name: f.to_json() for f in self.fields}
        if not self.target.is_default:  # only when set, so jobs that do not use it keep their config_hash
            out["label"] = self.target.to_json()
        if self.mask is not None:
            out["mask"] = self.mask.to_json()
        for key, value in self.options:  # likewise: only a kind that has options records them
            out[key] = list(value) if isinstance(value, tuple) else value
        if self.companions:  # likewise
            out["companions"] = list(self.companions)
        if self.where or self.header_where:  # likewise
            out["where"] = {c.key: c.to_json() for c in sorted((*self.where, *self.header_where), key=lambda c: c.key)}
        return out


@dataclass(frozen=True)
class SplitList:
    """``split.lists.<split>``: a file naming the samples of one split (``by: list``).

    ``path``: the file, resolved against the job folder; ``spec``: as written; ``column``: the
    CSV column that holds the items (None: plain text, one item a line, blank lines and ``#``
    comments ignored); ``sha256``: of the file's bytes when the job was loaded (the dataset's
    identity: a changed list is another dataset); under ``phi: pseudonymize`` it is keyed
    instead (``hmac-sha256:`` and an HMAC with the job's PHI key over that sha256,
    :func:`_keyed_lists`): a plain hash of a short list of raw ids (one MRN a line) gives the ids
    back by brute force from the manifest alone."""

    split: str
    path: Path
    spec: str
    column: str | None
    sha256: str
    #: the sha256 of the file's bytes, keyed or not ``sha256``: what a later read of the file is
    #: checked against (the list must not change while the job runs); never written out
    file_sha256: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.spec, "sha256": self.sha256}
        if self.column is not None:
            out["column"] = self.column
        return out


@dataclass(frozen=True)
class Carve:
    """``split.carve.<split>``: a split made from a listed one by entity (``by: list`` or
    ``column``): about ``ratio`` of the split groups of ``origin`` (an entity and its copies,
    kept whole) move to ``split``, chosen by the seeded hash."""

    split: str
    origin: str
    ratio: float

    def to_json(self) -> dict[str, Any]:
        return {"from": self.origin, "ratio": self.ratio}


@dataclass(frozen=True)
class SplitConfig:
    """How samples are assigned to splits and audited for leakage (see ``packer.pipeline.split``).

    ``by: list`` and ``by: column`` are *given* splits (a dataset's official split,
    :mod:`packer.pipeline.splitlists`): ``lists`` and ``match``, or the table ``column`` and its
    value ``value_map``, say each sample's split; ``carve`` makes the splits they lack;
    ``accept_leaks`` reports an official split's leaks instead of failing on them."""

    by: str
    ratios: tuple[tuple[str, float], ...]
    seed: int
    cutoffs: tuple[tuple[str, str], ...] = ()
    stratify: str | None = None
    entity_policy: str = "first_seen"
    folds: int | None = None
    pinned: Path | None = None
    pinned_spec: str | None = None
    duplicates: str = "group"
    near_enabled: bool = True
    #: ``enabled: auto`` (the default) decided ``near_enabled`` from the splits (not part of the identity)
    near_auto: bool = False
    near_neighbors: int = 16
    near_min_score: float = 0.984
    near_max_cross_split: int = 0
    #: The rival test's largest residual ratio (None: off); ``near_max_ratio_set``: the job set it
    #: (only then is it part of the config's identity, so jobs that do not keep their hashes)
    near_max_ratio: float | None = 0.5
    near_max_ratio_set: bool = False
    balance_tolerance: float = 0.05
    max_group_share: float = 0.2
    accept_imbalance: bool = False
    lists: tuple[SplitList, ...] = ()
    match: str = "path"
    column: str | None = None
    value_map: tuple[tuple[str, str], ...] = ()
    carve: tuple[Carve, ...] = ()
    accept_leaks: bool = False
    #: ``split.duplicates.label_conflict``: what a group of copies whose targets disagree does
    #: (``warn``, ``fail``, ``drop_group``; :mod:`packer.pipeline.conflicts`), with the numeric
    #: targets' ``label_tolerance`` and the masks' ``mask_dice``
    label_conflict: str = "warn"
    label_tolerance: float = 0.0
    mask_dice: float = 0.8

    @property
    def holds_ratios(self) -> bool:
        """Whether the audit holds the split's shares to its ratios within ``balance_tolerance``:
        with ``by: entity`` and no pinned table only (a time split's dates decide its shares, and
        pinned entities stand where they are pinned)."""
        return self.by == "entity" and self.pinned is None

    @property
    def given(self) -> bool:
        """Whether the split is given (``by: list`` or ``column``) rather than made by packer."""
        return self.by in GIVEN

    def to_json(self) -> dict[str, Any]:
        if self.given:
            return self._given_json()
        out: dict[str, Any] = {
            "by": self.by, "ratios": dict(self.ratios), "seed": self.seed, "stratify": self.stratify,
            "folds": self.folds, "pinned": self.pinned_spec, "duplicates": self.duplicates,
            "near_duplicates": {"enabled": self.near_enabled, "neighbors": self.near_neighbors,
                                "min_score": self.near_min_score, "max_cross_split": self.near_max_cross_split},
            "balance": {"tolerance": self.balance_tolerance, "max_group_share": self.max_group_share,
                        "accept": self.accept_imbalance},
        }
        if self.near_max_ratio_set:
            out["near_duplicates"]["max_ratio"] = self.near_max_ratio
        out.update(self._conflicts_json())
        if self.by == "time":  # the dates decide: ratios are refused under by: time, so none is recorded
            del out["ratios"]
            out["cutoffs"] = dict(self.cutoffs)
            out["entity_policy"] = self.entity_policy
        return out

    def _conflicts_json(self) -> dict[str, Any]:
        """The label-conflict settings where any differs from its default (so every job that does
        not set them keeps its config_hash)."""
        settings = {"policy": self.label_conflict, "tolerance": self.label_tolerance, "mask_dice": self.mask_dice}
        defaults = {"policy": job_default("split.duplicates.label_conflict"),
                    "tolerance": job_default("split.duplicates.label_tolerance"),
                    "mask_dice": job_default("split.duplicates.mask_dice")}
        return {} if settings == defaults else {"label_conflicts": settings}

    def _given_json(self) -> dict[str, Any]:
        """A given split's identity: its own keys (no ratios, stratify or pinned table: the lists or
        the column decide), each list with its file's sha256. A new shape, so the other splits'
        ``to_json`` and every existing job's config_hash stay as they were."""
        out: dict[str, Any] = {
            "by": self.by, "seed": self.seed, "folds": self.folds, "duplicates": self.duplicates,
            "near_duplicates": {"enabled": self.near_enabled, "neighbors": self.near_neighbors,
                                "min_score": self.near_min_score, "max_cross_split": self.near_max_cross_split},
            "carve": {c.split: c.to_json() for c in self.carve}, "accept_leaks": self.accept_leaks,
        }
        if self.near_max_ratio_set:
            out["near_duplicates"]["max_ratio"] = self.near_max_ratio
        out.update(self._conflicts_json())
        if self.by == "list":
            out["lists"] = {entry.split: entry.to_json() for entry in self.lists}
            out["match"] = self.match
        else:
            out["column"] = self.column
            out["map"] = dict(self.value_map)
        return out


@dataclass(frozen=True)
class SeriesConfig:
    """``transform.dicom.series``: how series are checked when samples are made from series
    (``sample: {neighbors: k}``). ``gap_tolerance``: a step between slices may differ from the
    series' median step by at most this fraction; ``drop_localizers``: localizer or derived
    images in a series are left out (each reported) rather than failing it; ``min_slices``:
    fewer slices fail the series."""

    gap_tolerance: float = 0.1
    drop_localizers: bool = True
    min_slices: int = 3

    def to_json(self) -> dict[str, Any]:
        return {"gap_tolerance": self.gap_tolerance, "drop_localizers": self.drop_localizers,
                "min_slices": self.min_slices}


@dataclass(frozen=True)
class DicomTransformConfig:
    """``transform.dicom``. ``modality_windows`` maps a Modality (0008,0060) value, upper case,
    to the windows files of that modality get instead of ``windows`` (CT presets mean nothing
    to a radiograph's stored values: ``{CR: [file]}`` gives a CR its own window)."""

    windows: tuple[WindowSpec, ...]
    fallback_window: WindowSpec | None = None
    size: tuple[int, int] | None = None
    resize: str = "stretch"
    spacing: tuple[float, float] | None = None
    output: str = "uint8"
    frames: str = "split"
    modality_windows: tuple[tuple[str, tuple[WindowSpec, ...]], ...] = ()
    channels: int | None = None
    #: the job-file key that set ``channels`` (``transform.<kind>.channels`` or the shared
    #: ``transform.channels``), as errors name it; not part of the identity
    channels_key: str = field(default="transform.channels", compare=False)
    #: ``slice`` (every slice its own sample), ``neighbors`` (each slice with ``neighbors``
    #: spatial neighbours on each side as channels, from its assembled series) or ``volume``
    #: (one C×D×H×W sample per series, at ``volume_spacing`` (z, y, x mm) and ``volume_size``)
    sample: str = "slice"
    neighbors: int = 0
    edge: str = "replicate"
    series: SeriesConfig = field(default_factory=SeriesConfig)
    volume_spacing: tuple[float, float, float] | None = None
    volume_size: tuple[int, int, int] | None = None
    #: not from the job file (nor in ``to_json``): set by ``DicomSeries.file_job`` for the slices of a
    #: volume that is resampled, which are then rendered unrounded (float32, ``packer.transform.dicom.UNROUNDED``)
    #: and quantised to ``output`` once, after the resample, instead of resampled as levels and rounded again
    unrounded: bool = False

    @property
    def by_series(self) -> bool:
        """True when samples are made from assembled series rather than file by file."""
        return self.sample != "slice"

    def windows_for(self, modality: str | None) -> tuple[WindowSpec, ...]:
        """The windows for a file whose Modality is ``modality`` (any case, None: absent)."""
        wanted = (modality or "").strip().upper()
        return next((windows for name, windows in self.modality_windows if name == wanted), self.windows)

    def to_json(self) -> dict[str, Any]:
        # modality_windows appears only when set, so jobs that do not use it keep their config_hash
        extra: dict[str, Any] = (
            {"modality_windows": {name: [w.to_json() for w in windows] for name, windows in self.modality_windows}}
            if self.modality_windows else {})
        if self.channels is not None:  # likewise: only when set
            extra["channels"] = self.channels
        if self.sample == "neighbors":  # likewise
            extra["sample"] = {"neighbors": self.neighbors, "edge": self.edge}
        elif self.sample == "volume":
            extra["sample"] = {"volume": {"spacing": list(self.volume_spacing) if self.volume_spacing else None,
                                          "size": list(self.volume_size) if self.volume_size else None}}
        if self.by_series:
            extra["series"] = self.series.to_json()
        return {
            "windows": [w.to_json() for w in self.windows],
            **extra,
            "fallback_window": self.fallback_window.to_json() if self.fallback_window else None,
            "size": list(self.size) if self.size else None,
            "resize": self.resize,
            "spacing": list(self.spacing) if self.spacing else None,
            "output": self.output,
            "frames": self.frames,
        }


@dataclass(frozen=True)
class ImageTransformConfig:
    size: tuple[int, int] | None = None
    resize: str = "stretch"
    color: str = "rgb"
    alpha: str = "drop"
    window: tuple[tuple[str, Any], ...] = ()
    tile_size: tuple[int, int] | None = None
    tile_stride: tuple[int, int] | None = None
    channels: int | None = None
    #: the job-file key that set ``channels`` (``transform.<kind>.channels`` or the shared
    #: ``transform.channels``), as errors name it; not part of the identity
    channels_key: str = field(default="transform.channels", compare=False)

    def to_json(self) -> dict[str, Any]:
        channels = {"channels": self.channels} if self.channels is not None else {}  # only when set: same hashes
        return {
            **channels,
            "size": list(self.size) if self.size else None,
            "resize": self.resize,
            "color": self.color,
            "alpha": self.alpha,
            "window": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.window} or None,
            "tile": {"size": list(self.tile_size), "stride": list(self.tile_stride or self.tile_size)}
            if self.tile_size else None,
        }


@dataclass(frozen=True)
class PackConfig:
    format: str
    max_samples: int = 1000
    max_bytes: int = 256 * 2**20
    #: each split's sample order in its shards: ``key`` or ``path`` (:func:`packer.pipeline.plan.order_ranks`)
    order: str = "key"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "max_samples": self.max_samples, "max_bytes": self.max_bytes}
        if self.order != "key":  # only when set, so other jobs keep their config_hash
            out["order"] = self.order
        return out


@dataclass(frozen=True)
class LimitsConfig:
    """Size limits checked from headers before decoding (bad sample ``too_large``)."""

    max_pixels: int = 2**28
    max_frames: int = 10_000
    max_decoded_bytes: int = 4 * 2**30
    #: voxels of one volume (``sample: volume``), before and after resampling, per channel
    max_voxels: int = 2**29

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_pixels": self.max_pixels, "max_frames": self.max_frames,
                               "max_decoded_bytes": self.max_decoded_bytes}
        if self.max_voxels != LimitsConfig.max_voxels:  # only when set, so other jobs keep their config_hash
            out["max_voxels"] = self.max_voxels
        return out


@dataclass(frozen=True)
class SafetyConfig:
    burned_in_annotation: str = "reject"
    outside_root: str = "reject"

    def to_json(self) -> dict[str, Any]:
        return {"burned_in_annotation": self.burned_in_annotation, "outside_root": self.outside_root}


@dataclass(frozen=True)
class PhiConfig:
    """``mode`` is ``pseudonymize`` or ``keep``; the key itself never enters the config."""

    mode: str = "pseudonymize"
    key_file: Path | None = None
    key_file_spec: str | None = None
    dates: str = "shift"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "dates": self.dates}


@dataclass(frozen=True)
class JobConfig:
    """A loaded job. ``job_path`` and ``output``/``registry`` are execution facts, not identity."""

    name: str
    sources: tuple[SourceConfig, ...]
    split: SplitConfig
    #: Each registered source kind's ``transform.<kind>`` settings, as (kind, settings) sorted by
    #: kind (:meth:`packer.read.kinds.SourceKind.parse_settings`); :meth:`settings` reads one
    transforms: tuple[tuple[str, Any], ...]
    pack: PackConfig
    output: Path | str  # a URL (s3://...) is kept as written: packer.storage publishes there
    max_bad_fraction: float = 0.05
    registry: Path | None = None
    job_path: Path = field(default=Path("job.yaml"))
    labels: tuple[str, ...] = ()
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    phi: PhiConfig = field(default_factory=PhiConfig)
    #: The kinds whose settings are in :meth:`identity` (the kinds a source uses, and those every
    #: job records: :attr:`packer.read.kinds.SourceKind.always_recorded`)
    recorded: tuple[str, ...] = ()
    #: The ``transform.<kind>`` sections the job writes settings in for a kind none of its
    #: sources is: ignored, and warned of (:func:`unused_transforms_warning`)
    unused_transforms: tuple[str, ...] = ()

    def settings(self, kind: str) -> Any:
        """The ``transform.<kind>`` settings of source kind ``kind``. Raises KeyError for a kind
        the job was not parsed with."""
        for name, value in self.transforms:
            if name == kind:
                return value
        raise KeyError(f"no transform settings for source kind {kind!r}")

    def with_settings(self, kind: str, value: Any) -> JobConfig:
        """This job with ``transform.<kind>`` replaced by ``value``."""
        return replace(self, transforms=tuple((name, value if name == kind else old) for name, old in self.transforms))

    @property
    def dicom(self) -> DicomTransformConfig:
        """``transform.dicom``: the DICOM kind's settings (for its reader and transforms)."""
        value: DicomTransformConfig = self.settings("dicom")
        return value

    @property
    def image(self) -> ImageTransformConfig:
        """``transform.image``: the image kind's settings (for its reader and transforms)."""
        value: ImageTransformConfig = self.settings("image")
        return value

    def identity(self) -> dict[str, Any]:
        """The resolved config that defines the dataset: defaults filled, paths as written."""
        return {
            "name": self.name,
            "sources": [s.to_json() for s in self.sources],
            "split": self.split.to_json(),
            "transform": {name: value.to_json() for name, value in self.transforms if name in self.recorded},
            "pack": self.pack.to_json(),
            "validate": {"max_bad_fraction": self.max_bad_fraction},
            "labels": list(self.labels),
            "limits": self.limits.to_json(),
            "safety": self.safety.to_json(),
            "phi": self.phi.to_json(),
        }

    def manifest_config(self) -> dict[str, Any]:
        """:meth:`identity` as the manifest records it and ``config_hash`` hashes it: under ``phi:
        pseudonymize`` each segment of a job path (a source's root, labels or table file, a split
        list, the pinned table) that the root-name check refuses (:data:`_PERSONAL_NAME`, as in
        ``DOE^JOHN_19280101``) shown as ``<id>``, as the manifest is shared and the job's ``name:``
        keeps such a folder out of the sample keys only; a job whose paths hold none records them as
        written and keeps its config_hash."""
        identity = self.identity()
        return _redacted_paths(identity) if self.phi.mode == "pseudonymize" else identity


def parse_window(raw: Any, where: str) -> WindowSpec:
    from packer.transform.window import PRESETS  # the preset table lives with the window maths

    if raw == "file":
        return WindowSpec(kind="file", name="file")
    if raw == "zscore":
        return WindowSpec(kind="zscore", name="zscore", over="nonzero")
    if isinstance(raw, dict) and "zscore" in raw:
        over = (raw["zscore"] or {}).get("over", "nonzero")
        return WindowSpec(kind="zscore", name="zscore" if over == "nonzero" else f"zscore-{over}", over=over)
    if isinstance(raw, dict) and "percentiles" in raw:
        low, high = (float(v) for v in raw["percentiles"])
        if not low < high:
            raise ConfigError(f"{where}.percentiles: [{low:g}, {high:g}]: the low percentile must be below the high "
                              "one, as in [0.5, 99.5]")
        over = raw.get("over", "all")
        return WindowSpec(kind="percentiles", name=f"p{low:g}-{high:g}" + ("" if over == "all" else f"-{over}"),
                          low=low, high=high, over=over)
    if isinstance(raw, str):
        preset = PRESETS.get(raw)
        if preset is None:
            close = difflib.get_close_matches(raw.lower(), sorted(PRESETS), n=1, cutoff=0.6)
            meant = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown window preset {raw!r}{meant}; known presets: "
                              f"{', '.join(sorted(PRESETS))}, or give {{center, width}}, 'file', 'zscore' or "
                              "{percentiles: [low, high]}")
        return WindowSpec(kind="preset", name=raw, center=float(preset.center), width=float(preset.width),
                          function=preset.function)
    if "file" in raw:
        return WindowSpec(kind="file", name="file", selector=raw["file"])
    center, width = float(raw["center"]), float(raw["width"])
    function = raw.get("function", "LINEAR")
    if function == "LINEAR" and width < 1:
        raise ConfigError(f"{where}.width: LINEAR windows need width >= 1 (DICOM PS3.3 C.11.2.1.2), got {width}")
    name = raw.get("name") or f"c{center:g}w{width:g}"
    return WindowSpec(kind="explicit", name=name, center=center, width=width, function=function)


def _resolve(base: Path, spec: str) -> Path:
    return (base / spec).resolve() if not Path(spec).is_absolute() else Path(spec)


def _location(base: Path, spec: str, where: str) -> Path | str:
    """A source location: a path resolved against the job folder, a ``file://`` URL as its local
    path, or any other URL as written (trailing ``/`` dropped) once fsspec knows its protocol."""
    if not is_url(spec):
        return _resolve(base, spec)
    try:
        path = local_path(spec)
        if path is not None:
            return path
        check_protocol(spec)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err
    return spec.rstrip("/")


#: A folder name that looks like a patient's: a DICOM person name's ``^`` (kept as ``_`` in a
#: source name, so the raw ``^`` is looked for in the root), or a calendar date (19xx/20xx):
#: eight digits as YYYYMMDD, DDMMYYYY or MMDDYYYY (``19600131``, ``31011960``, ``01311960``), a
#: YYYYMMDD starting a longer run of digits as a DICOM DT writes it (``20230504101112``), or
#: year, month and day with one separator (``-``, ``_``, ``.``, space) year first, or day or month
#: first (``1960-01-01``, ``01.01.1960``, ``1960_01_01``, ``12-31-1960``), or with the month
#: spelled in English, whole or cut short (``Sept`` too), in any case, with or without separators,
#: a separator being any run of ``-``, ``_``, ``.``, ``,`` and spaces, so that an abbreviation's
#: period and a comma count (``31-Dec-1960``, ``1960_dec_31``, ``31Dec1960``, ``December 31, 1960``,
#: ``Dec. 31, 1960``, ``31_Dec._1960``, ``Sept._4_1960``, ``31 December, 1960``), the day then
#: ordinal or not (``4th_May_2023``, ``May 4th, 2023``), the year of four digits. Eight digits whose
#: last four are no 19xx/20xx year and whose first four no month and day (``12345678``), a year
#: alone (``ISIC_2019``, ``CT_1960-01``), a month and a year (``Decathlon_Mar_2018``), a month and a
#: day without a year (``may_2_runs``), a month's letters inside a word (``decoder_v2``,
#: ``Dec_model``) and a month between two short numbers (``nnUNet_v2_Dec_23``, ``fold_4_Dec_19``,
#: ``llama3_june_24``: a two-digit year is no year here, as run and model names are spelled so) are
#: not dates.
_DAY, _MONTH, _YEAR = r"(?:0?[1-9]|[12]\d|3[01])", r"(?:0?[1-9]|1[0-2])", r"(?:19|20)\d{2}"
_DD, _MM = r"(?:0[1-9]|[12]\d|3[01])", r"(?:0[1-9]|1[0-2])"
_MONTH_NAME = (r"(?i:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
               r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_DAY_TH = rf"{_DAY}(?i:st|nd|rd|th)?"  # a day next to a spelled month may be ordinal (``4th May 2023``)
#: between a spelled month and its day or year: none, or any run of - _ . , and spaces (``Dec. 31, 1960``)
_SPELLED_SEP = r"[-_., ]*"
_PERSONAL_NAME = re.compile(
    r"\^|(?<!\d)(?:"
    rf"{_YEAR}{_MM}{_DD}"  # more digits may follow: a DT's time (``20230504101112``) is a date all the same
    rf"|(?:{_DD}{_MM}{_YEAR}|{_MM}{_DD}{_YEAR}"
    rf"|{_YEAR}([-_. ]){_MONTH}\1{_DAY}"
    rf"|{_DAY}([-_. ]){_MONTH}\2{_YEAR}"
    rf"|{_MONTH}([-_. ]){_DAY}\3{_YEAR}"
    rf"|{_YEAR}{_SPELLED_SEP}{_MONTH_NAME}{_SPELLED_SEP}{_DAY_TH}"
    rf"|{_DAY_TH}{_SPELLED_SEP}{_MONTH_NAME}{_SPELLED_SEP}{_YEAR}"
    rf"|(?<![A-Za-z]){_MONTH_NAME}{_SPELLED_SEP}{_DAY_TH}{_SPELLED_SEP}{_YEAR}"
    r")(?!\d))")


def redacted_path(spec: str) -> str:
    """A job path as written with each of its segments that may identify a patient (one the
    root-name check refuses: :data:`_PERSONAL_NAME`) shown as ``<id>``
    (``../DOE^JOHN_19280101/ct`` → ``../<id>/ct``); a path without one as it is."""
    return "".join("<id>" if part not in ("/", "\\") and _PERSONAL_NAME.search(part) else part
                   for part in re.split(r"([/\\])", spec))


def _redacted_table(table: Any) -> Any:
    """A source's recorded ``labels``/``table`` (a file, or an object with ``file``, ``path_base``
    and each ``join``'s ``file``) with its paths as :func:`redacted_path` shows them."""
    if isinstance(table, str):
        return redacted_path(table)
    if not isinstance(table, dict):
        return table
    out = dict(table)
    for key in ("file", "path_base"):
        if isinstance(out.get(key), str):
            out[key] = redacted_path(out[key])
    if isinstance(out.get("join"), list):
        out["join"] = [{**j, "file": redacted_path(j["file"])} if isinstance(j.get("file"), str) else j
                       for j in out["join"]]
    return out


def _redacted_paths(identity: dict[str, Any]) -> dict[str, Any]:
    """A job's :meth:`JobConfig.identity` with every job path in it as :func:`redacted_path` shows it."""
    sources = []
    for source in identity["sources"]:
        source = {**source, "root": redacted_path(source["root"])}
        for key in ("labels", "table"):
            if key in source:
                source[key] = _redacted_table(source[key])
        sources.append(source)
    split = dict(identity["split"])
    if isinstance(split.get("pinned"), str):
        split["pinned"] = redacted_path(split["pinned"])
    if isinstance(split.get("lists"), dict):
        split["lists"] = {name: {**entry, "file": redacted_path(entry["file"])}
                          for name, entry in split["lists"].items()}
    return {**identity, "sources": sources, "split": split}


def _written_root(base: Path, spec: str, root: Path | str) -> Path | str:
    """The root a source without ``name:`` is named after: the path as the job writes it, made
    absolute against ``base`` with ``.`` and ``..`` folded in (``os.path.normpath``) but no symlink
    followed, so ``../data/photos`` names a source ``photos`` whether written relative or absolute
    and wherever the link ``data/photos`` points (a "latest -> snapshot" link named it after the
    snapshot folder, and repointing the link at a byte-identical copy changed every sample key and
    the dataset_hash). ``root``, the location the files are read from, where the written path has
    no last segment of its own (``/``); a URL as written."""
    local = local_path(spec) if is_url(spec) else Path(spec)
    if local is None:
        return root
    written = Path(os.path.normpath(base / local))
    return written if written.name else root


def _root_segment(root: Path | str) -> str:
    """The last segment of a root folder or URL, as it is spelled (``s3://bucket/raw/ct`` → ``ct``)."""
    return root.name if isinstance(root, Path) else root.split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]


def _default_name(root: Path | str) -> str:
    """A source's name where the job gives none: its root's last segment, other characters than
    letters, digits, ``_`` and ``-`` made ``_``, what then comes before its first letter or
    digit dropped and the ``_`` after its last dropped, so it follows the rule a written ``name:``
    follows (a root ``-scans`` gave keys starting with ``-``, which ``packer locate`` took for an
    option; ``ü.x`` gave ``_x``; ``my.data ñ`` gave ``my_data_``, whose keys start ``my_data-``, as
    sample keys drop a name's end ``_``). Empty where the segment holds no ASCII letter or digit
    (the caller names it ``source<N>`` then)."""
    return re.sub(r"^[_-]+", "", re.sub(r"[^A-Za-z0-9_-]+", "_", _root_segment(root))).rstrip("_")


#: The longest source name (``sources[].name``'s maxLength in the schema): it starts every sample
#: key, and ``<name>-<16 hex>-dupN-pNNNNNN-tNNNNNN_NNNNNN.target_mask.npy`` must fit a ustar name (100 bytes)
SOURCE_NAME_MAX = 32


def _written_name(name: str, where: str) -> str:
    """A source's ``name:`` as the job writes it; a config error where sample keys would not start
    with it: they hold it through :func:`~packer.records.safe_key`, which drops an end ``_``, so
    ``scan_``'s keys started ``scan-`` and collided with those of a source ``scan``."""
    if safe_key(name) != name:
        raise ConfigError(f"{where}.name: {name!r} ends with '_', which sample keys drop (they would start "
                          f"'{safe_key(name)}-', as a source named {safe_key(name)!r} does); name it "
                          f"{safe_key(name)!r}, or end the name with a letter or digit")
    return name


def _named_after_root(root: Path | str, where: str) -> str:
    """The default name of a source at ``root``; a config error where it is longer than a name may be."""
    name = _default_name(root)
    if len(name) > SOURCE_NAME_MAX:
        raise ConfigError(f"{where}: its name defaults to its root folder's name, {len(name)} characters; "
                          f"a source's name starts every sample key and may have at most {SOURCE_NAME_MAX} (a tar "
                          "member's name must fit 100 bytes): give the source a shorter name of its own (name: ct)")
    return name


def _parse_source(raw: dict[str, Any], base: Path, index: int) -> SourceConfig:
    from packer.read.kinds import source_kind, source_kinds  # the kinds register there; they import this module

    where = f"sources[{index}]"
    kind = source_kind(raw["kind"], f"{where}.kind")
    for other_kind in source_kinds():
        for key in other_kind.source_keys:
            if key in raw and key not in kind.source_keys:
                takers = [k.name for k in source_kinds() if key in k.source_keys]
                raise ConfigError(f"{where}.{key}: only {' and '.join(takers)} sources take {key}; a source of "
                                  f"kind {kind.name} does not read it: remove it")
    if (isinstance(raw.get("mask"), dict) and raw["mask"].get("grid", "require") != "require" and not kind.volume_masks
            and "from" not in raw["mask"]):
        raise ConfigError(f"{where}.mask.grid: {kind.name} masks are files of the image's stored size, not label "
                          "maps of a volume that could be resampled to its grid: remove grid")
    root = _location(base, raw["root"], f"{where}.root")
    time_raw = raw.get("time", list(kind.default_time) if len(kind.default_time) > 1 else kind.default_time[0])
    entity_raw = raw.get("entity", kind.default_entity)
    entity_column = isinstance(entity_raw, Mapping) and "column" in entity_raw
    if entity_column and kind.identity_in_header:
        raise ConfigError(f"{where}.entity: {kind.name} files name their entity in their headers; give a header "
                          "keyword (PatientID), not a column")
    entity_path = None if entity_column else _path_field("entity", entity_raw, f"{where}.entity")
    time_path = _path_field("time", time_raw, f"{where}.time", stem=True)
    if time_path and kind.identity_in_header:
        raise ConfigError(f"{where}.time: {kind.name} files name their time in their headers; give a header keyword "
                          "(StudyDate, AcquisitionDateTime), not a path pattern")
    time = (kind.default_time[0],) if time_path else (time_raw,) if isinstance(time_raw, str) else tuple(time_raw)
    fields = tuple(_path_field(str(name), spec, f"{where}.fields.{name}") or PathField(str(name))
                   for name, spec in sorted((raw.get("fields") or {}).items()))
    if fields and kind.identity_in_header:
        raise ConfigError(f"{where}.fields: {kind.name} sources read their files' facts from headers; fields from "
                          "paths are for image and nifti sources")
    other = "table" if kind.table_key == "labels" else "labels"
    if other in raw:
        raise ConfigError(f"{where}.{other}: {kind.name} sources take labels from '{kind.table_key}: FILE.csv' "
                          f"({kind.table_columns}), not '{other}'")
    label_raw = raw.get("label")
    if kind.attribute_labels and isinstance(label_raw, Mapping) and "attribute" in label_raw:
        from packer.targets import LABEL_ATTRIBUTES

        problem = kind.header_key_problem(str(label_raw["attribute"]), "a label comes from a descriptive attribute "
                                          f"with a value: one of {', '.join(LABEL_ATTRIBUTES)}")
        if problem is not None:  # before the allow-list, whose reason (it may identify someone) is not this one
            raise ConfigError(f"{where}.label.attribute: {problem}")
    target = _parse_target(label_raw, kind.attribute_labels, f"{where}.label")
    has_table = kind.table_key in raw
    if not kind.identity_in_header and not has_table and target.origin == "table":
        raise ConfigError(f"{where}.table: {kind.name} sources need a table ({kind.table_columns}) naming each "
                          "file's label and entity, or 'label: folder' (root/<class>/<file>, the ImageFolder "
                          "layout) or 'label: none' (unlabeled)")
    names_masks = isinstance(raw.get("mask"), Mapping) and "column" in raw["mask"]
    conditions = parse_where(raw.get("where"), f"{where}.where")
    in_header = set(kind.header_keys([c.key for c in conditions]))
    row_where = tuple(c for c in conditions if c.key not in in_header)
    if kind.identity_in_header and target.origin != "table" and has_table and not names_masks and not row_where:
        raise ConfigError(f"{where}.{kind.table_key}: the label table is unused with label: {target.to_json()}; "
                          f"remove '{kind.table_key}:' or the 'label:' setting (a table that names each file's "
                          "mask, mask: {column: ...}, or whose columns where: tests, is used with any label:)")
    mask = _parse_mask(raw, root, kind, f"{where}.mask") if "mask" in raw else None
    options, companions = kind.parse_source(raw, where)
    if companions and not has_table:
        raise ConfigError(f"{where}: {', '.join(companions)} name files by table columns; add "
                          f"'{kind.table_key}: FILE.csv' with those columns")
    if companions and isinstance(root, str):
        raise ConfigError(f"{where}: the files a table row names beside its own ({', '.join(companions)}) are read "
                          f"from a local source root; {root} is a URL. Copy the source to a local folder")
    table_map = _parse_table(raw[kind.table_key], base, f"{where}.{kind.table_key}") if has_table else None
    table_at = table_map.file if table_map is not None else None
    field_names = {f.name for f in fields}
    if row_where and not has_table and not all(c.key in field_names for c in row_where):
        hints = "".join(kind.header_key_hint(c.key) for c in row_where)
        raise ConfigError(f"{where}.where: {', '.join(c.key for c in row_where)} "
                          f"{'is not a header attribute' if kind.identity_in_header else 'names a table column'} "
                          f"of {kind.name} files, and the source has no table{hints}; add "
                          f"'{kind.table_key}: FILE.csv', or remove the condition")
    return SourceConfig(
        where=row_where,
        header_where=kind.header_conditions(tuple(c for c in conditions if c.key in in_header), f"{where}.where"),
        mask=mask,
        kind=kind.name,
        name=_written_name(str(raw["name"]), where) if raw.get("name") else (
            _named_after_root(_written_root(base, raw["root"], root), where) or f"source{index}"),
        root=root,
        root_spec=raw["root"],
        entity=kind.default_entity if entity_path else str(entity_raw["column"]) if entity_column else entity_raw,
        entity_path=entity_path,
        entity_empty=entity_raw.get("empty", "bad") if entity_column else "bad",
        time=time,
        time_path=time_path,
        time_required="time" in raw,
        fields=fields,
        table_map=table_map,
        labels=table_at if kind.table_key == "labels" else None,
        labels_spec=table_map.file_spec if table_map is not None and kind.table_key == "labels" else None,
        table=table_at if kind.table_key == "table" else None,
        table_spec=table_map.file_spec if table_map is not None and kind.table_key == "table" else None,
        target=target,
        options=options,
        companions=companions,
    )


def _path_field(name: str, raw: Any, where: str, *, stem: bool = False) -> PathField | None:
    """``{path: REGEX}`` or ``{component: N}`` as a PathField; None for a column or keyword name.
    ``stem``: a component that is the file name is read without its suffixes (``time:``)."""
    if not isinstance(raw, Mapping):
        return None
    if "component" in raw:
        return PathField(name, component=int(raw["component"]), stem=stem)
    pattern = str(raw["path"])
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise ConfigError(f"{where}.path: {pattern!r} is not a regular expression ({err})") from err
    if not compiled.groups and "(" in pattern:
        raise ConfigError(f"{where}.path: {pattern!r} has no capturing group; name one (?P<{name}>...)")
    return PathField(name, pattern=pattern)


def _parse_table(raw: Any, base: Path, where: str) -> TableConfig:
    """A source's ``table:``/``labels:``: a file, or an object saying how it names files."""
    if isinstance(raw, str):
        return TableConfig(file=_location(base, raw, where), file_spec=raw)
    path = raw.get("path", "path")
    template = path.get("template") if isinstance(path, Mapping) else None
    if template is not None:
        _check_template(str(template), f"{where}.path.template")
    base_spec = raw.get("path_base")
    joins = []
    for i, join in enumerate(raw.get("join") or ()):
        on = (join["on"],) if isinstance(join["on"], str) else tuple(join["on"])
        joins.append(JoinConfig(file=_location(base, join["file"], f"{where}.join[{i}].file"), file_spec=join["file"],
                                on=on, missing=join.get("missing", "bad"), repeated=join.get("repeated", "refuse"),
                                records=join.get("records")))
    return TableConfig(
        file=_location(base, raw["file"], f"{where}.file"), file_spec=raw["file"],
        path="path" if template is not None else str(path), template=template,
        path_base=_location(base, base_spec, f"{where}.path_base") if base_spec is not None else None,
        path_base_spec=base_spec, find=raw.get("find", "path"), files=raw.get("files", "root"),
        repeated=raw.get("repeated", "refuse"), records=raw.get("records"), join=tuple(joins),
        missing=raw.get("missing", "bad"))


def _check_template(template: str, where: str) -> None:
    import string

    try:
        fields = [(field, spec or "") for _, field, spec, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as err:
        raise ConfigError(f"{where}: {template!r} is not a file-name template ({err}); write columns in braces, "
                          "as in 'files/p{subject_id:.2}/p{subject_id}/{dicom_id}.jpg'") from err
    if not fields or any(not name for name, _ in fields):
        raise ConfigError(f"{where}: {template!r} names no column; write each column in braces, as in "
                          "'{dicom_id}.jpg'")
    # Python's format syntax reads attributes and items ('{path.__class__}', '{path[0]}') and fills a
    # nested field inside a spec ('{a:{b.x}}'): a shared job file could pull the process environment
    # into messages that way. A field is a column name, an optional !conversion and a literal spec.
    for name, spec in fields:
        if "." in name or "[" in name or "{" in spec:
            part = f"{{{name}:{spec}}}" if spec else f"{{{name}}}"
            column = name.split(".")[0].split("[")[0]
            raise ConfigError(f"{where}: {part!r} in {template!r} is not a column name with an optional format "
                              "spec; a field is a column name in braces, as in '{dicom_id}' or '{subject_id:.2}' "
                              f"(attribute access '.', indexing '[' and nested fields are refused): write "
                              f"'{{{column}}}' and rename the column if its name holds '.' or '['")


def _parse_structures(spec: Any, key: str, where: str) -> StructureMap:
    """``mask.segments`` or ``mask.rois``: ``NAME: ID`` or ``NAME: {id, aliases, codes}``."""
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{where}.{key}: map each structure to a class id, as in '{key}: {{liver: 1, tumour: "
                          "{id: 2, aliases: [lesion]}}'")
    out = []
    for name, entry in spec.items():
        at = f"{where}.{key}.{name}"
        body = {"id": entry} if isinstance(entry, int) and not isinstance(entry, bool) else entry
        if not isinstance(body, dict) or not isinstance(body.get("id"), int) or isinstance(body.get("id"), bool):
            raise ConfigError(f"{at}: give the class id, as in '{name}: 1' or '{name}: {{id: 1, aliases: [...]}}'")
        if not 1 <= body["id"] <= 65535:
            raise ConfigError(f"{at}.id: {body['id']} is not a class id 1-65535 (0 is the background)")
        if key == "rois" and body.get("codes"):
            raise ConfigError(f"{at}.codes: RTSTRUCT ROIs are matched by name (ROI Name) only; codes match SEG "
                              "segments: move the class to segments, or give aliases")
        codes = tuple(str(c) for c in body.get("codes") or ())
        for code in codes:
            if not any(ch.isdigit() for ch in code.rpartition(":")[2]):
                raise ConfigError(f"{at}.codes: {code!r} is a name, not a code (a code's value has digits: SNOMED CT "
                                  "10200004); put it in aliases, which match the Segment Label, or give the coded "
                                  "Segmented Property Type as SCHEME:VALUE (SCT:10200004)")
        out.append(Structure(name=str(name), id=int(body["id"]),
                             aliases=tuple(str(a) for a in body.get("aliases") or ()), codes=codes))
    _check_names(out, key, where)
    return StructureMap(tuple(out))


def _check_names(structures: list[Structure], key: str, where: str) -> None:
    """Names compare without case, spaces or punctuation: one that compares as nothing would match
    every other such name, and one that compares equal to another class's would give all its
    structures to whichever class is declared first; a code (``SCT:10200004``) in two classes
    likewise."""
    seen: dict[str, tuple[str, Structure]] = {}
    for structure in structures:
        for alias in (structure.name, *structure.aliases):
            compared = normalise_name(alias)
            if not compared:
                raise ConfigError(f"{where}.{key}.{structure.name}: {alias!r} has no letter or digit, and names "
                                  "compare by their letters and digits only; give a name that has some")
            first = seen.setdefault(compared, (alias, structure))
            if first[1].id != structure.id:
                raise ConfigError(f"{where}.{key}: {alias!r} of class {structure.name} and {first[0]!r} of class "
                                  f"{first[1].name} compare as one name (case, spaces and punctuation are ignored), "
                                  "so one class would take every structure so called; keep the name in one class")
    coded: dict[str, tuple[str, Structure]] = {}
    for structure in structures:
        for code in structure.codes:
            first = coded.setdefault(code_key(code), (code, structure))
            if first[1].id != structure.id:
                raise ConfigError(f"{where}.{key}: the code {code!r} of class {structure.name} and {first[0]!r} of "
                                  f"class {first[1].name} name one concept (SNOMED CT is the default scheme), so one "
                                  "class would take every segment so coded; keep the code in one class")


def _parse_dicom_mask(spec: dict[str, Any], root: Path | str, where: str) -> MaskConfig:
    """``mask: {from: dicom, segments, rois, ...}``: the masks are the source's own SEG and RTSTRUCT."""
    if "column" in spec:
        raise ConfigError(f"{where}.column: masks from: dicom come from the source's SEG and RTSTRUCT objects, "
                          "not files a table names; remove column (or from: dicom)")
    if "classes" in spec:
        raise ConfigError(f"{where}.classes: with from: dicom the class ids are those of segments and rois; "
                          "remove classes")
    if isinstance(root, str):
        raise ConfigError(f"{where}: masks are read from a local source root; {root} is a URL. Copy the source "
                          "(images and annotations) to a local folder, or pack it without masks")
    if not spec.get("segments") and not spec.get("rois"):
        raise ConfigError(f"{where}: from: dicom needs segments (SEG segment labels or codes → class ids) or rois "
                          "(RTSTRUCT ROI names → class ids), as in 'rois: {lung: {id: 1, aliases: [Lung_L, "
                          "Lung_R]}}'")
    segments = _parse_structures(spec["segments"], "segments", where) if spec.get("segments") else None
    rois = _parse_structures(spec["rois"], "rois", where) if spec.get("rois") else None
    ids: dict[str, int] = {}
    names: dict[int, str] = {}
    for structure in (*(segments.structures if segments else ()), *(rois.structures if rois else ())):
        if ids.setdefault(structure.name, structure.id) != structure.id:
            raise ConfigError(f"{where}: class {structure.name!r} has id {ids[structure.name]} in one map and "
                              f"{structure.id} in the other; one class, one id")
        if names.setdefault(structure.id, structure.name) != structure.name:
            raise ConfigError(f"{where}: classes {names[structure.id]!r} and {structure.name!r} share id "
                              f"{structure.id}; give each class its own id, or list the second's names as aliases "
                              "of the first")
    pad = int(spec.get("pad", 0))
    if not 0 <= pad <= 65535:
        raise ConfigError(f"{where}.pad: {pad} is no mask id (0-65535); give 0, a class id, or an id your loss "
                          "ignores (255)")
    # the ids are the maps': a pad of no class is an id the loss ignores (255), listed with them as
    # a file mask's classes list it
    classes = tuple(sorted({0, *names, pad}))
    keys = list(spec)
    rois_first = "rois" in keys and "segments" in keys and keys.index("rois") < keys.index("segments")
    return MaskConfig(column="", classes=classes, empty=spec.get("empty", "keep"), pad=pad,
                      grid=spec.get("grid", "require"), origin="dicom", segments=segments, rois=rois,
                      overlap=spec.get("overlap", "later_wins"), threshold=float(spec.get("threshold", 0.5)),
                      rois_first=rois_first)


def _parse_mask(raw: dict[str, Any], root: Path | str, kind: SourceKind, where: str) -> MaskConfig:
    spec = raw["mask"]
    table = kind.table_key
    if "from" in spec:  # the schema allows one value: dicom
        if not kind.annotation_masks:
            raise ConfigError(f"{where}.from: dicom masks are the SEG and RTSTRUCT objects of a DICOM source; a "
                              f"{kind.name} source names its mask files by a table column ('column:')")
        if table in raw:
            raise ConfigError(f"{where}.from: masks from dicom with a '{table}:' table: the table names image files, "
                              "so the SEG and RTSTRUCT files it does not name would be refused before their headers "
                              "are read; label the source from a header attribute (label: {attribute: "
                              "BodyPartExamined}) or leave it unlabeled (label: none), or pack the labels and the "
                              "masks as two datasets")
        return _parse_dicom_mask(spec, root, where)
    if "column" not in spec:
        raise ConfigError(f"{where}: say where the masks are: 'column: NAME' (a table column naming each file's "
                          "mask) or, in a DICOM source, 'from: dicom' (its SEG and RTSTRUCT objects)")
    for key in ("segments", "rois", "overlap", "threshold"):
        if key in spec:
            raise ConfigError(f"{where}.{key}: only masks from: dicom (SEG and RTSTRUCT) have {key}; remove it "
                              "or set from: dicom")
    if table not in raw:
        raise ConfigError(f"{where}: masks are named by a column of the source's table; add '{table}: FILE.csv' "
                          f"with a column {spec['column']!r} naming each file's mask")
    if isinstance(root, str):
        raise ConfigError(f"{where}: masks are read from a local source root; {root} is a URL. Copy the source "
                          "(images and masks) to a local folder, or pack it without masks")
    classes = tuple(sorted(set(int(c) for c in spec["classes"]))) if spec.get("classes") is not None else None
    pad = int(spec.get("pad", 0))
    if classes is not None and pad not in classes:
        raise ConfigError(f"{where}.pad: {pad} is not one of the declared classes {list(classes)}; 'fit' pads masks "
                          "with it, so declare it (0, background, usually) or choose a declared id")
    # undeclared masks are uint8 (ids up to 255): only declared ids above 255 make them uint16, as
    # for a mask file's own ids, so a wider pad (the id 'fit' writes into the border) must be declared
    if classes is None and pad > 255:
        raise ConfigError(f"{where}.pad: {pad} is above 255, and with no classes declared masks are uint8 (ids "
                          f"0-255); declare the classes with it (classes: [0, 1, ..., {pad}]: ids above 255 make "
                          "the masks uint16) or choose a pad of 255 or less")
    return MaskConfig(column=spec["column"], classes=classes, empty=spec.get("empty", "keep"), pad=pad,
                      grid=spec.get("grid", "require"))


def _parse_target(raw: Any, attribute_labels: bool, where: str) -> TargetConfig:
    """A source's ``label:`` setting (shapes in ``schemas/job.schema.json``) as a TargetConfig."""
    if raw is None:
        return TargetConfig()
    if raw == "none":
        return TargetConfig(kind="none", origin="none", columns=())
    if raw == "folder":
        return TargetConfig(origin="folder", columns=())
    target_kind = raw.get("kind", "class")
    value_map = _parse_value_map(raw, target_kind, where)
    origins = [key for key in ("column", "columns", "attribute", "folder") if key in raw]
    if len(origins) != 1:
        raise ConfigError(f"{where}: give exactly one of column, columns, attribute or folder: true "
                          f"(got {', '.join(origins) or 'none of them'})")
    separator = raw.get("separator")
    if separator is not None and not (target_kind == "multilabel" and "column" in raw):
        raise ConfigError(f"{where}.separator: only a multilabel target read from one column has a separator")
    if "missing" in raw and target_kind != "numeric":
        raise ConfigError(f"{where}.missing: only numeric targets have missing-value tokens (a {target_kind} "
                          "target's empty cell already says so); remove 'missing:'")
    zero_one = target_kind == "multilabel" and "columns" in raw
    for key in ("uncertain", "uncertain_values", "blank"):
        if key in raw and not zero_one:
            raise ConfigError(f"{where}.{key}: only multilabel 0/1 columns ('kind: multilabel' with 'columns:') "
                              f"have uncertain or blank cells; remove '{key}:'")
    if "attribute" in raw:
        return _attribute_target(raw["attribute"], attribute_labels, target_kind, value_map, where)
    if "component" in raw and "folder" not in raw:
        raise ConfigError(f"{where}.component: says which folder of the path is the class, with folder: true; "
                          "remove it, or write label: {folder: true, component: N}")
    if "folder" in raw:
        if raw["folder"] is not True or target_kind != "class":
            raise ConfigError(f"{where}.folder: folder names are class labels: use folder: true with kind: class")
        component = int(raw.get("component", 0))
        if component == -1:
            raise ConfigError(f"{where}.component: -1 is the file name, not a folder; the class is a folder of the "
                              "path: 0 the first under the root, 1 the next (train/<class>/<file>), -2 the file's "
                              "own folder")
        return TargetConfig(origin="folder", columns=(), value_map=value_map, component=component)
    columns = (raw["column"],) if "column" in raw else tuple(raw["columns"])
    if len(set(columns)) != len(columns):
        raise ConfigError(f"{where}.columns: {sorted(c for c in columns if columns.count(c) > 1)[0]!r} is listed "
                          "twice")
    if target_kind == "class" and "columns" in raw and len(columns) == 1:
        raise ConfigError(f"{where}.columns: a class from one column is 'column: {columns[0]}'; 'columns:' lists "
                          "the one-hot 0/1 columns of a class (exactly one 1 per row), or, with kind: multilabel, "
                          "several labels")
    if target_kind == "multilabel" and "column" in raw:
        separator = separator if separator is not None else "|"
        if not separator:
            raise ConfigError(f"{where}.separator: must not be empty")
    if zero_one:
        if value_map:
            raise ConfigError(f"{where}.map: 0/1 columns are named by their column; a value map is for a "
                              "multilabel column of names ('column:'); rename the columns in the table instead")
        _check_label_names(columns, f"{where}.columns")
    target = TargetConfig(kind=target_kind, origin="table", columns=columns, value_map=value_map,
                          separator=separator, missing=tuple(str(token) for token in raw.get("missing") or ()))
    return _parse_cell_policies(raw, target, where) if zero_one else target


def _parse_value_map(raw: Mapping[str, Any], target_kind: str, where: str) -> tuple[tuple[str, str | None], ...]:
    """``map:`` as sorted (raw value, name or None) pairs: class names for a class target, label
    names or null (the token is dropped) for a multilabel column of names. Keys are cell texts;
    YAML reads an unquoted ``true``/``false`` key as a boolean (its text once Python's ``True``,
    which matched no cell ``true``), and which of its spellings was written is then lost; so a key
    ``true`` or ``false`` in any spelling YAML reads as that boolean (``true``, ``True``,
    ``TRUE``), quoted or not, stands for all three: the cell matches however either spells it."""
    entries: dict[str, str | None] = {}
    spelled: dict[str, str] = {}  # cell text -> the key it came from, to name a clash
    for key, value in (raw.get("map") or {}).items():
        name = None if value is None else str(value)
        text = str(key).lower() if isinstance(key, bool) else str(key)  # bool: not through the schema check
        for cell in next((texts for texts in BOOL_TEXTS if text in texts), (text,)):
            if cell in entries and entries[cell] != name:
                raise ConfigError(f"{where}.map.{text}: the keys {spelled[cell]!r} and {text!r} both stand for the "
                                  f"cell {cell!r} (true and false match in any of YAML's spellings: true, True, "
                                  f"TRUE) and name different labels ({entries[cell]!r}, {name!r}); keep one")
            entries[cell], spelled[cell] = name, text
    _refuse_unicode_twin_keys(entries, where)
    value_map = tuple(sorted(entries.items()))
    if value_map and target_kind not in ("class", "multilabel"):
        raise ConfigError(f"{where}.map: a value map names classes or labels; a {target_kind} target has none "
                          "(use 'missing:' for tokens that mean no value)")
    if target_kind == "class" and any(name is None for _, name in value_map):
        dropped = next(k for k, name in value_map if name is None)
        raise ConfigError(f"{where}.map.{dropped}: null drops a token of a multilabel column; a class target "
                          "needs a class for every value: name one, or leave the sample out of the table")
    if target_kind == "multilabel":
        _check_label_names([name for _, name in value_map if name is not None], f"{where}.map")
    return value_map


def _refuse_unicode_twin_keys(entries: Mapping[str, str | None], where: str) -> None:
    """Refuse two ``map:`` keys that differ only in Unicode form (``fièvre`` typed as one code
    point, NFC, and as ``e`` and a combining accent, NFD) and name different labels: a cell in
    either form, or a third, matches both (:func:`~packer.targets.base.map_key`), and which one
    it meant cannot be told. Twins naming one label are the same entry written twice."""
    seen: dict[str, str] = {}
    for key in entries:
        folded = unicodedata.normalize("NFC", key)
        other = seen.setdefault(folded, key)
        if other != key and entries[other] != entries[key]:
            raise ConfigError(f"{where}.map: the keys {ascii(other)} and {ascii(key)} differ only in Unicode form "
                              "(one code point, NFC, or a letter and a combining mark, NFD), so they print alike and "
                              "a cell in either form is both, yet they name different labels "
                              f"({entries[other]!r}, {entries[key]!r}); keep one")


def _check_label_names(names: Any, where: str) -> None:
    """Refuse label names that the target's text form cannot carry: a leading ``?`` marks an
    ignored label, ``|`` joins the names."""
    for name in names:
        if str(name).startswith("?") or "|" in str(name):
            raise ConfigError(f"{where}: label name {name!r} may not start with '?' (it marks an ignored label) "
                              "or contain '|' (it joins labels); rename it")


def _parse_cell_policies(raw: Mapping[str, Any], target: TargetConfig, where: str) -> TargetConfig:
    """``uncertain:``, ``uncertain_values:`` and ``blank:`` of a multilabel target read from 0/1 columns."""
    spec = raw.get("uncertain")
    policies: dict[str, str] = {}
    if isinstance(spec, str):
        policies["default"] = spec
    elif spec is not None:
        policies = {str(column): str(policy) for column, policy in spec.items()}
        unknown = sorted(set(policies).difference(target.columns, {"default"}))
        if unknown:
            raise ConfigError(f"{where}.uncertain.{unknown[0]}: not one of the target's columns "
                              f"({', '.join(target.columns)}) or 'default'; fix the name or add the column")
        if not policies:
            raise ConfigError(f"{where}.uncertain: empty; give a policy ({', '.join(UNCERTAIN_POLICIES)}) or a "
                              "mapping column -> policy")
    for column, policy in policies.items():
        if policy not in UNCERTAIN_POLICIES:
            raise ConfigError(f"{where}.uncertain{'' if isinstance(spec, str) else '.' + column}: {policy!r} is "
                              f"not one of {', '.join(UNCERTAIN_POLICIES)}")
    values = raw.get("uncertain_values")
    uncertain_values = None if values is None else tuple(str(v) for v in values)
    from packer.targets.base import FALSE_CELLS, TRUE_CELLS

    clash = [v for v in (uncertain_values or ()) if v.lower() in TRUE_CELLS | FALSE_CELLS or not v]
    if clash:
        raise ConfigError(f"{where}.uncertain_values: {clash[0]!r} already means 0, 1 or blank; list only the "
                          "cells that mean uncertain (CheXpert: -1.0)")
    if uncertain_values is not None and not policies:
        raise ConfigError(f"{where}.uncertain_values: there is no 'uncertain:' policy to apply to them; add "
                          f"'uncertain: {'|'.join(UNCERTAIN_POLICIES[:3])}'")
    blank = str(raw.get("blank", "bad"))
    if blank not in BLANK_POLICIES:
        raise ConfigError(f"{where}.blank: {blank!r} is not one of {', '.join(BLANK_POLICIES)}")
    return replace(target, uncertain=tuple(sorted(policies.items())), uncertain_values=uncertain_values, blank=blank)


def _attribute_target(keyword: str, attribute_labels: bool, target_kind: str,
                      value_map: tuple[tuple[str, str | None], ...],
                      where: str) -> TargetConfig:
    from packer.targets import LABEL_ATTRIBUTES

    if not attribute_labels:
        raise ConfigError(f"{where}.attribute: only DICOM files have header attributes; this source takes "
                          "labels from its table or its folders")
    if target_kind != "class":
        raise ConfigError(f"{where}.attribute: a header attribute gives a class label; kind must be class")
    if keyword not in LABEL_ATTRIBUTES:
        raise ConfigError(f"{where}.attribute: {keyword!r} may not be a label: labels are written into every "
                          "shard and the manifest, so only descriptive attributes that identify nobody are "
                          f"allowed: {', '.join(LABEL_ATTRIBUTES)}")
    return TargetConfig(origin="attribute", columns=(), attribute=keyword, value_map=value_map)


def _parse_split(raw: dict[str, Any], base: Path) -> SplitConfig:
    by = raw["by"]
    if by in GIVEN:
        return _parse_given(raw, base)
    for key in ("lists", "match", "carve", "column", "map", "accept_leaks"):
        if key in raw:
            raise ConfigError(f"split.{key}: only meaningful with a given split (by: list or by: column); "
                              f"remove it, or set split.by")
    if by != "time" and "cutoffs" in raw:
        raise ConfigError(f"split.cutoffs: only meaningful with 'by: time'; a split by {by} ignores dates, so "
                          "records after the cutoffs could land in train; set split.by: time, or remove cutoffs")
    if by == "time":
        for key in ("ratios", "stratify"):
            if key in raw:
                raise ConfigError(f"split.{key}: a split by time puts each entity in the split its first record's "
                                  f"date falls in under the cutoffs, so {key} would be ignored; remove {key}, or set "
                                  "split.by: entity")
    ratios = raw.get("ratios", job_default("split.ratios"))
    total = sum(ratios.values())
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"split.ratios: the ratios must add up to 1, they add up to {total:g}")
    cutoffs: tuple[tuple[str, str], ...] = ()
    if by == "time":
        raw_cutoffs = raw.get("cutoffs") or {}
        if not raw_cutoffs:
            raise ConfigError("split.cutoffs: 'by: time' needs cutoffs, e.g. {valid: 2024-01-01, test: 2024-07-01}")
        parsed = {}
        for split_name, value in raw_cutoffs.items():
            try:
                parsed[split_name] = date.fromisoformat(str(value)).isoformat()
            except ValueError as err:
                raise ConfigError(f"split.cutoffs.{split_name}: expected a date YYYY-MM-DD, got {value!r}") from err
        if "valid" in parsed and "test" in parsed and parsed["valid"] > parsed["test"]:
            raise ConfigError("split.cutoffs: the valid cutoff must not come after the test cutoff")
        cutoffs = tuple(sorted(parsed.items()))
    ordered = tuple((s, float(ratios.get(s, 0.0))) for s in SPLITS)
    if "entity_policy" in raw and by != "time":
        raise ConfigError("split.entity_policy: only meaningful with 'by: time'")
    near = raw.get("near_duplicates") or {}
    near_enabled = near.get("enabled", job_default("split.near_duplicates.enabled"))
    if "threshold" in near:
        raise ConfigError("split.near_duplicates.threshold: near duplicates are no longer pairs of dHashes within a "
                          "Hamming distance (look-alike images of different patients fell within it and chained them "
                          "into one group); candidates are now verified on thumbnails. Remove threshold; to link "
                          "fewer pairs raise split.near_duplicates.min_score (default 0.984), to search wider raise "
                          "neighbors (default 16)")
    balance = raw.get("balance") or {}
    asked = "tolerance" in balance and float(balance["tolerance"]) != float(job_default("split.balance.tolerance"))
    if asked and (by == "time" or raw.get("pinned")):  # the default written out (README's example) changes nothing
        why = ("under by: time each entity goes to the split its first record's date falls in and no ratio is "
               "asked" if by == "time" else
               "beside a pinned table (split.pinned) the shares are not held to the ratios: pinned entities stand "
               "where they are pinned")
        raise ConfigError(f"split.balance.tolerance: {why}, so the tolerance would be ignored; remove "
                          "balance.tolerance (balance.max_group_share and accept still apply)"
                          + (", or set split.by: entity" if by == "time" else ", or remove split.pinned"))
    duplicates = _duplicates_settings(raw.get("duplicates", job_default("split.duplicates")))
    return SplitConfig(
        by=by, ratios=ordered, seed=int(raw.get("seed", job_default("split.seed"))), cutoffs=cutoffs,
        stratify=raw.get("stratify"),
        entity_policy=raw.get("entity_policy", job_default("split.entity_policy")),
        folds=raw.get("folds"),
        pinned=_pinned_table(base, raw["pinned"]) if raw.get("pinned") else None,
        pinned_spec=raw.get("pinned"),
        **duplicates,
        near_enabled=_near_enabled(near_enabled, by=by, ratios=ordered, folds=raw.get("folds"),
                                   pinned=bool(raw.get("pinned")), label_conflict=str(duplicates["label_conflict"])),
        near_auto=near_enabled == "auto",
        **_near_settings(near),
        balance_tolerance=float(balance.get("tolerance", job_default("split.balance.tolerance"))),
        max_group_share=float(balance.get("max_group_share", job_default("split.balance.max_group_share"))),
        accept_imbalance=bool(balance.get("accept", job_default("split.balance.accept"))),
    )


def _duplicates_settings(raw: str | Mapping[str, Any]) -> dict[str, Any]:
    """``split.duplicates`` as SplitConfig fields: the mode alone (``group``), or an object with
    the mode and the label-conflict settings (``{mode: group, label_conflict: drop_group}``),
    defaults from the schema."""
    settings: Mapping[str, Any] = {"mode": raw} if isinstance(raw, str) else raw
    return {
        "duplicates": settings.get("mode", job_default("split.duplicates.mode")),
        "label_conflict": settings.get("label_conflict", job_default("split.duplicates.label_conflict")),
        "label_tolerance": float(settings.get("label_tolerance", job_default("split.duplicates.label_tolerance"))),
        "mask_dice": float(settings.get("mask_dice", job_default("split.duplicates.mask_dice"))),
    }


def _near_settings(near: Mapping[str, Any]) -> dict[str, Any]:
    """``split.near_duplicates``' search and verification settings as SplitConfig fields, defaults
    from the schema (whether the check runs is the caller's: it depends on the kind of split)."""
    return {
        "near_neighbors": int(near.get("neighbors", job_default("split.near_duplicates.neighbors"))),
        "near_min_score": float(near.get("min_score", job_default("split.near_duplicates.min_score"))),
        "near_max_cross_split": int(near.get("max_cross_split",
                                             job_default("split.near_duplicates.max_cross_split"))),
        "near_max_ratio": (float(near["max_ratio"]) if near.get("max_ratio") is not None else None)
        if "max_ratio" in near else float(job_default("split.near_duplicates.max_ratio")),
        "near_max_ratio_set": "max_ratio" in near,
    }


def _parse_given(raw: dict[str, Any], base: Path) -> SplitConfig:
    """``by: list`` or ``by: column``: the split is given; what packer would choose (ratios, a
    stratified or time split, pinned entities) does not apply, and carving makes the rest."""
    by = raw["by"]
    for key in ("ratios", "stratify", "cutoffs", "entity_policy", "pinned", "balance"):
        if key in raw:
            raise ConfigError(f"split.{key}: a given split (by: {by}) puts each sample where its "
                              f"{'list' if by == 'list' else 'table cell'} says, so {key} does not apply; remove it"
                              + (" (to make a split the data lacks, use split.carve)" if key == "ratios" else ""))
    for key in (("column", "map") if by == "list" else ("lists", "match")):
        if key in raw:
            other = "column" if by == "list" else "list"
            raise ConfigError(f"split.{key}: only meaningful with by: {other}; remove it, or set split.by: {other}")
    lists: tuple[SplitList, ...] = ()
    column = None
    value_map: tuple[tuple[str, str], ...] = ()
    if by == "list":
        given = raw.get("lists") or {}
        if not given:
            raise ConfigError("split.lists: by: list needs a file per split, e.g. "
                              "{train: train_val_list.txt, test: test_list.txt}")
        lists = tuple(_split_list(name, given[name], base) for name in SPLITS if name in given)
    else:
        column = raw.get("column")
        if not column:
            raise ConfigError("split.column: by: column needs the table column that holds each file's split, "
                              "e.g. column: split")
        value_map = tuple(sorted((str(k), str(v)) for k, v in (raw.get("map") or {}).items()))
    carve = _parse_carve(raw.get("carve") or {}, listed={e.split for e in lists} if by == "list" else None)
    near = raw.get("near_duplicates") or {}
    near_enabled = near.get("enabled", job_default("split.near_duplicates.enabled"))
    return SplitConfig(
        by=by, ratios=tuple((s, 0.0) for s in SPLITS), seed=int(raw.get("seed", job_default("split.seed"))),
        folds=raw.get("folds"), **_duplicates_settings(raw.get("duplicates", job_default("split.duplicates"))),
        # auto: on, since a given split puts samples in several splits (or says nothing about it)
        near_enabled=True if near_enabled == "auto" else bool(near_enabled), near_auto=near_enabled == "auto",
        **_near_settings(near),
        lists=lists, match=raw.get("match", job_default("split.match")), column=column, value_map=value_map,
        carve=carve, accept_leaks=bool(raw.get("accept_leaks", job_default("split.accept_leaks"))),
    )


def _registry_folder(base: Path, spec: str, name: str) -> Path:
    """``registry`` resolved, and refused at load when a file stands where its folder
    ``<registry>/<name>/`` must be (``registry: labels.csv``, a typo): the build wrote the copy
    last, after all its work and the published version, and then failed naming neither the job
    nor the key. The file is likely the user's own, so the fix is the key, never removing it.
    A ``file://`` URL is its local path; any other URL is refused: the copies are written with
    local file calls, and ``s3://bucket/registry`` became a folder named ``s3:`` beside the job."""
    try:
        path = local_path(spec) if is_url(spec) else _resolve(base, spec)
    except ConfigError as err:  # a file:// URL naming another host
        raise ConfigError(f"registry: {err}") from err
    if path is None:
        raise ConfigError(f"registry: {spec} is a URL, and the registry is a local folder (the manifest copies "
                          "are kept with the repository); point registry at a local folder, e.g. the repository's "
                          "manifests/ (registry: ../manifests), or leave registry out; a dataset is published to "
                          "object storage with output:")
    blocker = blocking_file(path / name)
    if blocker is not None:
        raise ConfigError(f"registry: {path} cannot hold the manifest copies <registry>/{name}/<version>.json: "
                          f"{blocker} is a file, not a folder; point registry at a folder (it is made if missing), "
                          "or leave registry out")
    return path


def _output_location(base: Path, spec: str, name: str) -> Path | str:
    """``output`` resolved (a URL kept as written), and refused at load as a source root is when
    fsspec does not know its protocol (``s4://``, a typo, or one whose package is missing), or
    when ``output`` or a folder above it is a file (``output: labels.csv``, a typo): both passed
    ``packer validate`` and failed only the build. A file inside the output folder
    (``<output>/<name>``) is the build's to name (its fix may be removing that file), not the key's."""
    if is_url(spec):
        try:
            if local_path(spec) is None:
                check_protocol(spec)
        except ConfigError as err:
            raise ConfigError(f"output: {err}") from err
        return spec
    path = _resolve(base, spec)
    blocker = blocking_file(path)
    if blocker is not None:
        raise ConfigError(f"output: {path} cannot hold the dataset folder <output>/{name}/: {blocker} is a file, not a "
                          "folder; point output at a folder (it is made if missing)")
    return path


def _pinned_table(base: Path, spec: str) -> Path:
    """``split.pinned`` resolved, and refused at load when it cannot be opened, as a split list
    is: the split stage reads it after the files are listed and decoded, and its error there
    named neither the job nor the key."""
    path = _resolve(base, spec)
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise ConfigError(f"split.pinned: cannot read {path} ({_unread(err, path, spec)}); fix the path") from err
    return path


def _unread(err: OSError, path: Path, spec: str) -> str:
    """Why a file the job names could not be read, for its message: the OS's reason, how a relative
    ``spec`` resolved, and where its folder is missing too (a public dataset's recipe run before the
    data was downloaded or mounted: the list's folder, not the list, is what is missing)."""
    said = str(err.strerror or err) + ("" if Path(spec).is_absolute() else f"; {spec!r} is relative to the job file")
    if spec.startswith("~"):
        return said + "; a leading ~ is not expanded here: write the home folder out, or the path relative to the job"
    if "://" in spec:
        return said + "; a list is read from a local file, not a URL: copy it beside the job file and name that"
    if isinstance(err, FileNotFoundError) and not path.parent.exists():
        missing = path.parent
        while not missing.parent.exists() and missing.parent != missing:
            missing = missing.parent
        said += f"; the folder {missing} does not exist either: is the dataset downloaded or mounted there?"
    return said


def _split_list(split: str, raw: str | dict[str, Any], base: Path) -> SplitList:
    """One ``split.lists`` entry: a file (plain text), or ``{file, column}`` (a CSV column)."""
    spec, column = (raw, None) if isinstance(raw, str) else (raw["file"], raw.get("column"))
    path = _resolve(base, spec)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise ConfigError(f"split.lists.{split}: cannot read {path} ({_unread(err, path, spec)}); "
                          "fix the path") from err
    return SplitList(split=split, path=path, spec=spec, column=column, sha256=digest, file_sha256=digest)


def _parse_carve(raw: dict[str, Any], listed: set[str] | None) -> tuple[Carve, ...]:
    """``split.carve``: ``{valid: {from: train, ratio: 0.1}}``. ``listed``: the splits that have a
    list (``by: list``; None for ``by: column``, where any split may hold samples)."""
    carves = tuple(Carve(split=name, origin=raw[name]["from"], ratio=float(raw[name]["ratio"]))
                   for name in SPLITS if name in raw)
    for carve in carves:
        where = f"split.carve.{carve.split}"
        if carve.origin == carve.split:
            raise ConfigError(f"{where}.from: a split cannot be carved from itself; name another split")
        if listed is not None and carve.split in listed:
            raise ConfigError(f"{where}: split {carve.split} has a list (split.lists.{carve.split}); carve only "
                              "the splits that have none, or remove the list")
        if listed is not None and carve.origin not in listed:
            raise ConfigError(f"{where}.from: split {carve.origin} has no list to carve from; name a listed split "
                              f"({', '.join(s for s in SPLITS if s in listed)})")
        if any(other.split == carve.origin for other in carves):
            raise ConfigError(f"{where}.from: {carve.origin} is itself carved; carve from a split the data gives")
    for origin in {c.origin for c in carves}:
        total = sum(c.ratio for c in carves if c.origin == origin)
        if total >= 1:
            raise ConfigError(f"split.carve: the ratios carved from {origin} add up to {total:g}; they must leave "
                              f"some of {origin} (add up to less than 1)")
    return carves


def _near_enabled(value: bool | str, *, by: str, ratios: tuple[tuple[str, float], ...], folds: int | None,
                  pinned: bool, label_conflict: str = "warn") -> bool:
    """``split.near_duplicates.enabled`` resolved: ``auto`` is on when samples can land in two or more
    splits (a time split, folds, pinned entities, or two ratios above 0), or when the job acts on
    copies' label conflicts (``label_conflict: fail | drop_group``: near copies are copies too), and
    off for a one-split job otherwise, where no copy can leak across splits (its ``label_conflicts``
    rule then says near copies were not compared)."""
    if value == "auto":
        return (by == "time" or folds is not None or pinned or sum(1 for _, r in ratios if r > 0) > 1
                or label_conflict in ("fail", "drop_group"))
    return bool(value)


def parse_size(raw: Any) -> tuple[int, int] | None:
    return (int(raw[0]), int(raw[1])) if raw else None


def parse_job(doc: Any, job_path: Path, *, base: Path | None = None) -> JobConfig:
    """Validate a parsed job document and build the JobConfig. Raises ConfigError naming
    ``job_path``. Relative paths are relative to ``base``, by default the folder of the job file
    as given: a job file reached through a symlink (``workflows/x.yaml -> ../jobs/x.yaml``) reads
    its paths from the link's folder, as make and docker-compose do, and messages name the link.
    A job that pseudonymizes notes its source roots for :mod:`packer.redact` (an internal error
    then prints no raw path under them)."""
    from packer.redact import note_job

    doc = validate_document(doc, "job", source=str(job_path))
    try:
        job = _build_job(doc, job_path, job_path.parent.resolve() if base is None else base)
    except ConfigError as err:
        raise ConfigError(f"{job_path}: {err}") from err
    note_job(job)
    return job


def _build_job(doc: dict[str, Any], job_path: Path, base: Path) -> JobConfig:
    from packer.read.kinds import source_kind, source_kinds

    sources = tuple(_parse_source(s, base, i) for i, s in enumerate(doc["sources"]))
    names = [s.name for s in sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"sources: two sources are named {duplicates[0]!r}; give each a distinct 'name:'")
    transform = doc.get("transform") or {}
    kinds = source_kinds()
    transforms = tuple((kind.name, kind.parse_settings(transform.get(kind.name) or {}, transform)) for kind in kinds)
    used = {s.kind for s in sources}
    recorded = tuple(kind.name for kind in kinds if kind.always_recorded or kind.name in used)
    # an empty section sets nothing; one with settings for a kind no source is reads as if it acted
    unused = tuple(kind.name for kind in kinds if kind.name not in used and transform.get(kind.name))
    split = _parse_split(doc["split"], base)
    if split.by == "time":  # every file needs its time: a table without the column is a config error
        sources = tuple(replace(s, time_required=True) for s in sources)
    labels = tuple(str(label) for label in doc.get("labels") or ())  # a class id written as a number: its text
    if len(set(labels)) < len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        raise ConfigError(f"labels: {twice!r} is listed twice (once as a number, once as text); list each class once")
    raw_pack = doc["pack"]
    pack = PackConfig(
        format=raw_pack["format"],
        max_samples=int(raw_pack.get("max_samples", job_default("pack.max_samples"))),
        max_bytes=parse_byte_size(raw_pack.get("max_bytes", job_default("pack.max_bytes"))),
        order=str(raw_pack.get("order", job_default("pack.order"))),
    )
    raw_limits = doc.get("limits") or {}
    limits = LimitsConfig(
        max_pixels=int(raw_limits.get("max_pixels", job_default("limits.max_pixels"))),
        max_frames=int(raw_limits.get("max_frames", job_default("limits.max_frames"))),
        max_decoded_bytes=parse_byte_size(raw_limits.get("max_decoded_bytes", job_default("limits.max_decoded_bytes")),
                                          "limits.max_decoded_bytes"),
        max_voxels=int(raw_limits.get("max_voxels", job_default("limits.max_voxels"))),
    )
    raw_safety = doc.get("safety") or {}
    raw_phi = doc.get("phi") or {}
    identifying = any(source_kind(s.kind).pseudonymize_by_default for s in sources)
    phi = PhiConfig(
        mode=raw_phi.get("mode", "pseudonymize" if identifying else "keep"),
        key_file=_resolve(base, raw_phi["key_file"]) if raw_phi.get("key_file") else None,
        key_file_spec=raw_phi.get("key_file"),
        dates=raw_phi.get("dates", job_default("phi.dates")),
    )
    if phi.mode == "pseudonymize":
        for index, (raw_source, source) in enumerate(zip(doc["sources"], sources, strict=True)):
            named_after = _written_root(base, raw_source["root"], source.root)
            if not raw_source.get("name") and _PERSONAL_NAME.search(_root_segment(named_after)):
                raise ConfigError(
                    f"sources[{index}]: its name defaults to its root folder's name, which may "
                    "identify a patient (a DICOM person name's ^, or a calendar date, which phi: pseudonymize never "
                    "writes), and a source's name is written in clear into every sample id, shard member, manifest "
                    "and report; give the source a name of its own (name: ct)")
    job = JobConfig(
        labels=labels,
        limits=limits,
        safety=SafetyConfig(burned_in_annotation=raw_safety.get("burned_in_annotation",
                                                                job_default("safety.burned_in_annotation")),
                            outside_root=raw_safety.get("outside_root", job_default("safety.outside_root"))),
        phi=phi,
        name=doc["name"],
        sources=sources,
        split=split,
        transforms=transforms,
        recorded=recorded,
        unused_transforms=unused,
        pack=pack,
        output=_output_location(base, doc["output"], doc["name"]),
        max_bad_fraction=float((doc.get("validate") or {}).get("max_bad_fraction",
                                                               job_default("validate.max_bad_fraction"))),
        registry=_registry_folder(base, doc["registry"], doc["name"]) if doc.get("registry") else None,
        # the file as given, in its folder resolved: not the symlink's target, whose folder the
        # relative paths are not read from (messages named the target and looked beside the link)
        job_path=job_path if job_path == MAPPING_JOB else job_path.parent.resolve() / job_path.name,
    )
    for kind in kinds:  # channels, sampling modes: what only the kind knows it can honour
        kind.check_job(job, [s for s in sources if s.kind == kind.name])
    _check_targets(sources, split, labels, {kind.name for kind in kinds if kind.identity_in_header})
    _check_free_text_labels(sources, labels, phi.mode)
    _check_identifying_where(sources, phi.mode)
    _check_split_column(sources, split, {kind.name for kind in kinds if kind.identity_in_header})
    if phi.mode == "pseudonymize" and split.lists:
        job = replace(job, split=replace(split, lists=_keyed_lists(split.lists, phi)))
    return job


def unused_transforms_warning(job: JobConfig) -> str | None:
    """A sentence for the user when the job writes ``transform.<kind>`` settings for a kind none
    of its sources is: they were ignored without a word (``transform.image: {size: [8, 8]}`` in a
    NIfTI job built at the volumes' own size). A warning, not a config error: a job made from
    another by removing a source (the demo's photos without its CT) keeps the other's section."""
    if not job.unused_transforms:
        return None
    kinds = sorted({source.kind for source in job.sources})
    sections = ", ".join(f"transform.{name}" for name in job.unused_transforms)
    one = len(job.unused_transforms) == 1
    return (f"{sections}: no source of this job is of {'that kind' if one else 'those kinds'} (its sources are "
            f"{', '.join(kinds)}), so {'its' if one else 'their'} settings are ignored; write them under "
            f"transform.{kinds[0] if len(kinds) == 1 else '<kind>'} if they are meant for this job's "
            f"{'files' if len(kinds) == 1 else 'sources'}, or remove {sections}")


def transform_warnings(job: JobConfig) -> tuple[str, ...]:
    """What the build and ``packer validate`` warn of under code ``transform``: settings for a
    kind no source is (:func:`unused_transforms_warning`), then each of the job's kinds' own
    (:meth:`packer.read.kinds.SourceKind.config_warnings`: DICOM windows under ``output: float16``)."""
    from packer.read.kinds import source_kind

    unused = unused_transforms_warning(job)
    said = [unused] if unused is not None else []
    for name in dict.fromkeys(source.kind for source in job.sources):
        said.extend(source_kind(name).config_warnings(job, [s for s in job.sources if s.kind == name]))
    return tuple(said)


def _keyed_lists(lists: tuple[SplitList, ...], phi: PhiConfig) -> tuple[SplitList, ...]:
    """``lists`` with each file's sha256 replaced by ``hmac-sha256:`` and an HMAC-SHA256 of it
    under the job's PHI key (:func:`packer.phi.load_key`, whose errors are the job's): the
    manifest then names each list's content without a digest anyone can test guesses against.
    The same key and list give the same digest, so the dataset's identity stays reproducible."""
    import hmac

    from packer.phi import load_key

    loaded = load_key(phi)
    assert loaded is not None  # pseudonymize always has a key, or load_key raised
    return tuple(replace(entry, sha256="hmac-sha256:" + hmac.new(
        loaded.key, b"packer-split-list\x00" + entry.sha256.encode(), hashlib.sha256).hexdigest()) for entry in lists)


def _check_free_text_labels(sources: tuple[SourceConfig, ...], labels: tuple[str, ...], mode: str) -> None:
    """Under ``phi: pseudonymize`` a free-text header attribute (a Study Description may hold a
    name) is a label only through names the job file gives: a ``map:`` or the job's ``labels:``."""
    from packer.targets import FREE_TEXT_LABEL_ATTRIBUTES

    if mode != "pseudonymize" or labels:
        return
    for index, source in enumerate(sources):
        target = source.target
        if target.origin == "attribute" and target.attribute in FREE_TEXT_LABEL_ATTRIBUTES and not target.value_map:
            raise ConfigError(f"sources[{index}].label.attribute: {target.attribute} is free text that may name the "
                              "patient, and its values would be written as class names into every shard, the "
                              "manifest and the report; give a 'map:' from the values to class names (a value "
                              "it lacks is unknown_label), or list the job's 'labels:', or set phi.mode: keep")


#: DICOM attributes whose values identify a patient, a study or the people and places that made
#: it: a ``where:`` value on one is a raw identifier. Written out from DICOM PS3.15 Annex E,
#: Table E.1-1 (Application Level Confidentiality Profile Attributes; pydicom does not ship it):
#: the attributes with action X, Z, D or U that are ids (of the patient, the visit, the order, the
#: procedure step, the device), names (of the patient and of the people and institutions caring
#: for them), the birth date and age, addresses and places of residence, telephone numbers, and
#: free text about the patient (comments, history, alerts). Every UID but a SOP class's and the
#: transfer syntax's identifies too (:func:`identifying_attribute`, read from pydicom's data
#: dictionary, so a UID this list does not name is not missed). Not every Annex E attribute: dates
#: (a cohort's cutoff, as a time split's cutoffs are) and descriptions (a series chosen by its
#: protocol) are filtered on in practice, and the values in such a filter are the job author's,
#: not a patient's.
IDENTIFYING_ATTRIBUTES = frozenset({
    # the patient: ids, names, birth, age, address, telephone, demographics
    "PatientName", "PatientID", "OtherPatientIDs", "OtherPatientIDsSequence", "OtherPatientNames",
    "IssuerOfPatientID", "PatientBirthDate", "PatientBirthTime", "PatientBirthName", "PatientMotherBirthName",
    "PatientBirthDateInAlternativeCalendar", "PatientDeathDateInAlternativeCalendar", "PatientAge",
    "PatientAddress", "PatientTelephoneNumbers", "PatientTelecomInformation", "MedicalRecordLocator",
    "InsurancePlanIdentification", "CountryOfResidence", "RegionOfResidence", "PatientInstitutionResidence",
    "ScheduledPatientInstitutionResidence", "CurrentPatientLocation", "ResponsiblePerson",
    "ResponsibleOrganization", "MilitaryRank", "BranchOfService", "EthnicGroup", "Occupation",
    "PatientReligiousPreference",
    # free text about the patient
    "PatientComments", "AdditionalPatientHistory", "MedicalAlerts", "Allergies", "PatientState", "SpecialNeeds",
    "VisitComments", "IdentifyingComments", "PatientTransportArrangements",
    # the visit, the order, the study and its procedure steps
    "AccessionNumber", "StudyID", "StudyIDIssuer", "AdmissionID", "IssuerOfAdmissionID", "ServiceEpisodeID",
    "IssuerOfServiceEpisodeID", "PlacerOrderNumberImagingServiceRequest", "FillerOrderNumberImagingServiceRequest",
    "RequestedProcedureID", "ScheduledProcedureStepID", "PerformedProcedureStepID", "InterpretationIDIssuer",
    "ResultsIDIssuer", "OrderCallbackPhoneNumber",
    # the people who ordered, made, read or received it
    "ReferringPhysicianName", "ReferringPhysicianAddress", "ReferringPhysicianTelephoneNumbers",
    "PerformingPhysicianName", "OperatorsName", "PhysiciansOfRecord", "NameOfPhysiciansReadingStudy",
    "RequestingPhysician", "ConsultingPhysicianName", "ScheduledPerformingPhysicianName", "PersonName",
    "PersonAddress", "PersonTelephoneNumbers", "PersonTelecomInformation", "VerifyingObserverName",
    "VerifyingOrganization", "ContentCreatorName", "HumanPerformerName", "HumanPerformerOrganization",
    "NamesOfIntendedRecipientsOfResults", "OrderEnteredBy", "OrderEntererLocation", "ReviewerName", "EvaluatorName",
    "InterpretationAuthor", "InterpretationRecorder", "InterpretationTranscriber",
    "PhysicianApprovingInterpretation", "DistributionName", "DistributionAddress", "TopicAuthor",
    # the institution, its places, stations and devices
    "InstitutionName", "InstitutionAddress", "InstitutionalDepartmentName", "StationName", "PerformedStationName",
    "ScheduledStationName", "PerformedStationAETitle", "ScheduledStationAETitle", "ScheduledStudyLocation",
    "ScheduledStudyLocationAETitle", "PerformedLocation", "ScheduledProcedureStepLocation",
    "RequestedProcedureLocation", "DeviceSerialNumber", "SourceSerialNumber", "CassetteID", "PlateID", "GantryID",
    "GeneratorID", "DetectorID", "ModifyingDeviceID",
})


def identifying_attribute(keyword: str) -> bool:
    """Whether a ``where:`` on ``keyword`` filters on a raw identifier: one of
    :data:`IDENTIFYING_ATTRIBUTES`, a person's name (any attribute of VR PN, such as
    ``SecondaryReviewerName``: the list above is Annex E's, and the dictionary names more people),
    or any UID (VR UI) but a SOP class's (``SOPClassUID``,
    ``ReferencedSOPClassUID``: they name a kind of object, and ``where: {SOPClassUID: RT Dose
    Storage}`` is how a job asks for one) and a transfer syntax's, or another class's
    (``ImplementationClassUID``): every other UID names one instance, study, series, frame of
    reference, concatenation, irradiation event or file set, so one patient's."""
    from pydicom.datadict import dictionary_VR, keyword_dict

    if keyword in IDENTIFYING_ATTRIBUTES:
        return True
    if keyword not in keyword_dict:
        return False
    vr = dictionary_VR(keyword_dict[keyword])
    if vr == "PN":
        return True
    return vr == "UI" and "Class" not in keyword and "TransferSyntax" not in keyword


def _spelling(key: str) -> str:
    """``key`` as a table's header may spell a DICOM keyword or a column: case, ``_``, ``-``
    and spaces dropped, so ``patientId``, ``patient_id`` and ``Patient ID`` are one spelling."""
    return re.sub(r"[\s_-]+", "", key).lower()


@functools.cache
def _keywords_by_spelling() -> dict[str, str]:
    """pydicom's dictionary keywords by :func:`_spelling`: a table column named ``patient_id``
    holds what the header's ``PatientID`` does (Kaggle's tables spell them so)."""
    from pydicom.datadict import keyword_dict

    return {_spelling(keyword): keyword for keyword in keyword_dict}


def _check_identifying_where(sources: tuple[SourceConfig, ...], mode: str) -> None:
    """Under ``phi: pseudonymize`` a ``where:`` on a header attribute that identifies a patient
    (``PatientID: {not: [MRN0099]}``, to leave out a withdrawn patient), or on the table column
    holding a source's entity ids, is refused: its values are raw identifiers, and the job's
    config is written into the manifest and the report. A table column spelled like such an
    attribute (``patientId``, ``patient_id``, ``Patient ID``) or like the entity is refused too:
    it holds the same values (RSNA Pneumonia's ``patientId`` is the header's ``PatientID``)."""
    from packer.read.kinds import source_kind

    if mode != "pseudonymize":
        return
    for index, source in enumerate(sources):
        for condition in (*source.header_where, *source.where):
            key = condition.key
            keyword = _keywords_by_spelling().get(_spelling(key), key)
            if identifying_attribute(keyword):
                named = "" if keyword == key else f"spelled like the DICOM keyword {keyword}: "
                why = f"{named}a UID, a person's name (VR PN) or one of PS3.15 Annex E's direct identifiers"
            elif _spelling(key) == _spelling(source.entity):
                why = f"spelled like the source's entity, {source.entity}, so holding its entity ids"
            else:
                continue
            raise ConfigError(
                f"sources[{index}].where.{key}: {key} identifies the patient or study ({why}), and "
                "the job's config, where: values included, is written into the manifest and the report, which "
                "under phi: pseudonymize hold no raw identifier; to leave out some patients' files, give the "
                f"source's {source_kind(source.kind).table_key}: table a column (withdrawn: yes) "
                "and filter on it (where: {withdrawn: {not: [yes]}}), or set phi.mode: keep")


def _check_split_column(sources: tuple[SourceConfig, ...], split: SplitConfig, headed: set[str]) -> None:
    """``by: column`` reads each sample's split from its table row (or a field read from its path):
    every source needs a table whose cells reach the samples, or that field. ``headed``: the
    kinds that read identity from file headers (DICOM), whose table rows keep only the cells
    naming files."""
    if split.by != "column":
        return
    for index, source in enumerate(sources):
        if source.kind in headed:
            raise ConfigError(f"sources[{index}] (source {source.name!r}): by: column reads the split from the "
                              f"table row, but a {source.kind} source's rows keep only the cells naming its files; "
                              "give the split as lists instead, e.g. split: {by: list, match: stem, lists: {train: "
                              "{file: train.csv, column: dicom_id}, ...}}")
        if source.label_table is None and split.column not in {f.name for f in source.fields}:
            raise ConfigError(f"sources[{index}] (source {source.name!r}): by: column reads the split from column "
                              f"{split.column!r} of the source's table (or a field of that name read from each "
                              "path, fields:), and this source has neither; add a table or the field, or give the "
                              "split as lists (by: list)")
        _check_split_not_read(index, source, split)
        _check_split_not_class(index, source, split)


def _check_split_not_read(index: int, source: SourceConfig, split: SplitConfig) -> None:
    """Refuses a ``split.column`` that the job reads as something else of each row: a row keeps
    the cells it reads as the file's path, label, entity and time as those, not among the cells
    the split reads, so ``by: column`` on the entity column was told the table "has no column
    'patient'" above a header that names it. Each role's message says what to do instead."""
    table = source.table_map
    if table is None or split.column in {f.name for f in source.fields}:  # a path's field is read as one
        return
    roles = {"label": "the label column, which packer reads as each file's label",
             table.path: f"the column naming each file (path: {table.path})"}
    roles.update({column: "a column of its label (label:), which holds classes, not split names"
                  for column in (source.target.columns if source.target.origin == "table" else ())})
    for column in source.time if source.time_path is None else ():
        roles[column] = (f"the source's time column (time: {column}), which holds dates, not split "
                         "names; to split by date use split: {by: time, cutoffs: ...}, or name the time "
                         "column another (time: <column>)")
    if source.entity_path is None:
        roles[source.entity] = (f"the source's entity column (entity: {source.entity}), which holds entity ids, not "
                                "split names; to keep each entity's files in one split use split: {by: entity} (with "
                                "ratios:), or split.pinned to place chosen entities")
    why = roles.get(split.column or "")
    if why is not None:
        raise ConfigError(f"sources[{index}] (source {source.name!r}): split.column {split.column!r} is {why}; by: "
                          "column reads each row's split (train, valid, test) from a column of its own, so name that "
                          "column in split.column")


def _check_split_not_class(index: int, source: SourceConfig, split: SplitConfig) -> None:
    """Refuses a ``label: folder`` source whose split field reads the very folder the class is
    read from: a tree shipped as ``train/<class>/<file>`` with ``fields: {split: {component: 0}}``
    and a plain ``label: folder`` would make every class its split's name, silently."""
    target = source.target
    if target.origin != "folder":
        return
    field = next((f for f in source.fields if f.name == split.column and f.component is not None), None)
    if field is None or field.component != target.component:
        return
    label = "folder" if not target.component else f"{{folder: true, component: {target.component}}}"
    suggested = field.component + 1 if field.component >= 0 else field.component - 1
    raise ConfigError(f"sources[{index}] (source {source.name!r}): the class (label: {label}) and "
                      f"the split (split.column {split.column!r}, fields.{field.name}: {{component: "
                      f"{field.component}}}) read the same folder of each path, so every class would be its split's "
                      f"name; where the tree is <split>/<class>/<file>, read the class from the folder below it: "
                      f"label: {{folder: true, component: {suggested}}}")


def windows_fix(channels: int, where: str) -> str:
    """How to make the windows give ``channels`` channels: ``list 3 windows (or 1, replicated)``."""
    if channels == 1:
        return f"list 1 window{where}"
    return f"list {channels} windows{where} (or 1, replicated)"


def parse_sampling(raw: Mapping[str, Any], section: str) -> dict[str, Any]:
    """``transform.<section>.sample`` and ``series`` as settings fields (``sample``,
    ``neighbors``, ``edge``, ``series``, ``volume_spacing``, ``volume_size``), for the kinds that
    make 2.5D stacks and volumes (DICOM series, NIfTI volumes)."""
    sample = raw.get("sample", "slice")
    if sample == "slice":
        if "series" in raw:
            raise ConfigError(f"transform.{section}.series: series are assembled only for sample: {{neighbors: k}}; "
                              "remove series, or set sample")
        return {}
    series = raw.get("series") or {}
    if sample == "volume" or "volume" in sample:
        if raw.get("size") or raw.get("spacing"):
            raise ConfigError(f"transform.{section}.size/spacing: a volume's size and spacing are 3-D; give them as "
                              "sample: {volume: {spacing: [z, y, x], size: [D, H, W]}}")
        volume = (sample.get("volume") or {}) if isinstance(sample, dict) else {}
        mode: dict[str, Any] = {"sample": "volume",
                "volume_spacing": tuple(float(v) for v in volume["spacing"]) if volume.get("spacing") else None,
                "volume_size": tuple(int(v) for v in volume["size"]) if volume.get("size") else None}
    else:
        mode = {"sample": "neighbors", "neighbors": int(sample["neighbors"]), "edge": sample.get("edge", "replicate")}
    defaults = "transform.dicom.series"  # the series checks' defaults (one schema entry for every kind)
    return {**mode,
            "series": SeriesConfig(
                gap_tolerance=float(series.get("gap_tolerance", job_default(f"{defaults}.gap_tolerance"))),
                drop_localizers=bool(series.get("drop_localizers", job_default(f"{defaults}.drop_localizers"))),
                min_slices=int(series.get("min_slices", job_default(f"{defaults}.min_slices"))))}


def _check_targets(sources: tuple[SourceConfig, ...], split: SplitConfig, labels: tuple[str, ...],
                   timed: set[str]) -> None:
    """A dataset has one target kind: the sources must agree on it (and on the names of
    numeric or 0/1-column targets), and the split must be able to use it. ``timed``: the source
    kinds whose files carry their own time (the others need a table to split by time)."""
    first = sources[0]
    for index, source in enumerate(sources):
        where = f"sources[{index}].label"
        if source.target.kind != first.target.kind:
            raise ConfigError(f"{where}: source {source.name!r} gives {source.target.kind} targets, source "
                              f"{first.name!r} gives {first.target.kind}; a dataset has one target kind, so "
                              "build them as two datasets (ShardDataset reads each; MixedDataset-style mixing "
                              "is for the loader)")
        if source.target.kind == "numeric" and source.target.columns != first.target.columns:
            raise ConfigError(f"{where}.columns: {list(source.target.columns)} differs from source {first.name!r}'s "
                              f"{list(first.target.columns)}; the numeric targets of one dataset have one order")
        if source.kind not in timed and source.table is None and source.time_path is None and split.by == "time":
            raise ConfigError(f"sources[{index}].table: splitting by time needs each file's time, from a table "
                              "(path,entity,timestamp) or from its path (time: {component: 0} or {path: REGEX}); "
                              "add one, or split by entity")
        if split.stratify == "label" and source.target.kind in ("none", "numeric"):
            raise ConfigError(f"split.stratify: label: source {source.name!r} has "
                              f"{'no labels' if source.target.kind == 'none' else 'numeric targets'} to stratify "
                              "by; remove stratify")
    masked = [s.name for s in sources if s.mask is not None]
    if masked and len(masked) != len(sources):
        bare = next(s.name for s in sources if s.mask is None)
        raise ConfigError(f"sources: {', '.join(repr(m) for m in masked)} pack masks but {bare!r} does not; every "
                          "sample of a dataset has a mask or none does (a batch stacks them), so give every source "
                          "a 'mask:' or build two datasets")
    if len({s.mask.pad for s in sources if s.mask is not None}) > 1:
        raise ConfigError("sources: the masks' pad ids differ; 'fit' must pad every mask of a dataset with one id "
                          "(the manifest records it, so a loss can ignore it)")
    if len({s.mask.dtype for s in sources if s.mask is not None}) > 1:
        raise ConfigError("sources: the masks' declared classes give uint8 masks for some sources and uint16 for "
                          "others; declare classes up to the same range (ids above 255 make uint16 masks)")
    if labels and first.target.kind in ("none", "numeric"):
        raise ConfigError(f"labels: a {first.target.kind} target has no class names to list; remove 'labels:'")
    if first.target.kind == "multilabel":
        _check_label_names(labels, "labels")


#: The Defined Terms of Modality (0008,0060), PS3.3 C.7.3.1.1.1, with the retired ones files still
#: carry (AS, CD, CF, CP, CS, DD, DF, DM, DS, EC, FA, FS, LP, MA, MS, OPR, ST, VF).
DICOM_MODALITIES = frozenset({
    "ANN", "AR", "ASMT", "AU", "BDUS", "BI", "BMD", "CFM", "CR", "CT", "CTPROTOCOL", "DG", "DMS", "DOC", "DX", "ECG",
    "EEG", "EMG", "EOG", "EPS", "ES", "FID", "GM", "HC", "HD", "IO", "IOL", "IVOCT", "IVUS", "KER", "KO", "LEN", "LS",
    "M3D", "MG", "MR", "NM", "OAM", "OCT", "OP", "OPM", "OPT", "OPTBSV", "OPTENF", "OPV", "OSS", "OT", "PA", "PLAN",
    "POS", "PR", "PT", "PX", "REG", "RESP", "RF", "RG", "RTDOSE", "RTIMAGE", "RTINTENT", "RTPLAN", "RTRAD",
    "RTRECORD", "RTSEGANN", "RTSTRUCT", "RWV", "SEG", "SM", "SMR", "SR", "SRF", "STAIN", "TEXTUREMAP", "TG", "US",
    "VA", "XA", "XAPROTOCOL", "XC",
    "AS", "CD", "CF", "CP", "CS", "DD", "DF", "DM", "DS", "EC", "FA", "FS", "LP", "MA", "MS", "OPR", "ST", "VF",
})
#: Names people write for a modality whose code is another (``PET`` is ``PT``).
_MODALITY_NAMES = {"PET": "PT", "MRI": "MR", "SPECT": "NM", "CAT": "CT", "XRAY": "DX", "X-RAY": "DX",
                   "ULTRASOUND": "US", "MAMMO": "MG", "MAMMOGRAPHY": "MG", "DXA": "BMD", "DEXA": "BMD",
                   "ANGIO": "XA", "FLUORO": "RF", "DOSE": "RTDOSE", "RTSS": "RTSTRUCT"}


def check_modality_code(key: str, where: str) -> str:
    """``key`` as the Modality (0008,0060) code it must be, upper case; a ConfigError naming the
    code meant (``PET``: PT) for a key that is none of :data:`DICOM_MODALITIES`, as no file's
    Modality would ever match it."""
    name = key.strip().upper()
    if name in DICOM_MODALITIES:
        return name
    meant = _MODALITY_NAMES.get(name) or next(iter(difflib.get_close_matches(name, sorted(DICOM_MODALITIES), n=1,
                                                                             cutoff=0.6)), None)
    hint = f"; did you mean {meant}?" if meant else ""
    raise ConfigError(f"{where}: {key!r} is no DICOM Modality (0008,0060) code (PS3.3 C.7.3.1.1.1: e.g. CT, MR, PT, "
                      f"NM, CR, DX, MG, US, XA, RF, OT), so no file would get these windows{hint}")


def parse_modality_windows(raw: Mapping[str, Any], section: str = "dicom"
                           ) -> tuple[tuple[str, tuple[WindowSpec, ...]], ...]:
    """``transform.<section>.modality_windows`` as sorted (MODALITY, windows) pairs; keys are
    compared upper case, so ``cr`` and ``CR`` may not both appear, and must be Modality codes
    (:func:`check_modality_code`)."""
    out: dict[str, tuple[WindowSpec, ...]] = {}
    for key, windows in raw.items():
        where = f"transform.{section}.modality_windows.{key}"
        name = check_modality_code(str(key), where)
        if name in out:
            raise ConfigError(f"{where}: modality {name} is given twice (keys are not case-sensitive); keep one")
        out[name] = tuple(parse_window(w, f"{where}[{i}]") for i, w in enumerate(windows))
    return tuple(sorted(out.items()))


class JobLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only ``true`` and ``false`` (any case), and
    its numbers (``010`` is ten, ``0o10`` octal; ``1:30`` and ``1_0`` are text).
    YAML 1.1 also reads ``on``, ``off``, ``yes`` and ``no`` as booleans, so a join's ``on:`` key
    became ``True`` and ``where: {flag: no}`` would test ``false``. And with YAML 1.2's unique
    keys: a key written twice in one mapping is an error naming both lines (PyYAML kept the last
    silently, so a second ``ratios:`` or ``output:`` replaced the first unseen); keys a merge
    (``<<: *defaults``) brings in may still be overridden, as YAML intends."""

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        """A scalar's text with each escaped UTF-16 surrogate pair (JSON's ``"\\ud83d\\ude00"``,
        as json.dump writes a character outside the BMP) the one character it is in JSON: YAML
        keeps the two halves, which no UTF-8 text holds (a half alone is refused when the job is
        checked, naming its key path)."""
        value = super().construct_scalar(node)
        return joined_surrogate_pairs(value) if isinstance(value, str) else value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # keyed by (type, value): Python's True == 1 and 1 == 1.0, but YAML's true, 1 and 1.0 are
        # different keys (a label map may list the cells true and 1, or 1 and 1.0)
        seen: dict[tuple[type, Any], yaml.Node] = {}
        # and by the text each key becomes (a key is text once checked): 1 and '1' are one key
        texts: dict[str, yaml.Node] = {}
        equal: dict[Any, yaml.Node] = {}
        as_text: set[yaml.Node] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault((type(key), key), key_node)
            except TypeError:  # an unhashable key: the base loader says so
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} a second time (first on line {first.start_mark.line + 1}); a key may "
                    "appear once in a mapping: keep one", key_node.start_mark)
            written = texts.setdefault(_key_text(key), key_node)
            if written is not key_node:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {_key_text(key)!r} a second time (first on line {written.start_mark.line + 1}, "
                    f"written {_as_written(written)}, here {_as_written(key_node)}: a key is its text, so both are "
                    "one key, as a map: key is a cell's text); a key may appear once in a mapping: keep one",
                    key_node.start_mark)
            other = equal.setdefault(key, key_node)
            if other is not key_node and isinstance(other, yaml.ScalarNode) and isinstance(key_node, yaml.ScalarNode):
                as_text.update((other, key_node))
        mapping = super().construct_mapping(node, deep=deep)
        if not as_text:
            return mapping
        # one Python dict cannot hold both True and 1: such keys stay the text they were written as
        # (a schema check makes every key text anyway); node.value is now flattened, merges first
        return {(key_node.value if key_node in as_text else self.construct_object(key_node, deep=deep)):
                self.construct_object(value_node, deep=deep) for key_node, value_node in node.value}


def _key_text(key: Any) -> str:
    """The text a mapping key becomes where the job is checked (:func:`packer.schemas.validate_document`
    makes every key text: a boolean or null as JSON writes it), so that two keys of one text are found twice."""
    return "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)


def _as_written(node: yaml.Node) -> str:
    """A key as the job file writes it, quotes included (``1`` or ``'1'``)."""
    style = getattr(node, "style", None)
    return f"{style}{node.value}{style}" if style in ("'", '"') else str(node.value)


_YAML_INT, _YAML_FLOAT, _YAML_BOOL = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"
#: YAML 1.2's core schema numbers. YAML 1.1 (PyYAML's) reads 010 as octal 8, 1:30 as 90 (base
#: 60) and 1_0 as 10, so a seed written 010 became 8 without a word; 1.2 reads 010 as ten,
#: octal as 0o10, and 1:30 and 1_0 as text (which the schema then refuses where a number is due)
_CORE_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_CORE_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                         r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _construct_core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _construct_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    """A date or time as YAML reads it; an impossible one (2024-13-45, a typo) stays the text it
    is, for the check of the key that holds it to name (PyYAML raised ValueError: a traceback)."""
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:
        return str(loader.construct_scalar(node))


JobLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_YAML_BOOL, _YAML_INT, _YAML_FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
JobLoader.add_implicit_resolver(_YAML_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
JobLoader.add_implicit_resolver(_YAML_INT, _CORE_INT, list("-+0123456789"))
JobLoader.add_implicit_resolver(_YAML_FLOAT, _CORE_FLOAT, list("-+0123456789."))
JobLoader.add_constructor(_YAML_INT, _construct_core_int)
JobLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)


def load_job(path: str | Path) -> JobConfig:
    """Read and validate a job file. Raises ConfigError naming the file and key path."""
    job_path = Path(path)
    try:
        text = job_path.read_text(encoding="utf-8")
    except OSError as err:  # out of open files or memory is the machine's condition (exit 6), not the job's
        raise exhausted(err, job_path) or ConfigError(f"{job_path}: cannot read the job file ({err.strerror})") from err
    except UnicodeDecodeError as err:  # a binary file, or a job saved in another encoding
        line = job_path.read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigError(f"{job_path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at line {line}); a job "
                          "file is YAML text: save it as UTF-8, or give the job file, not another file") from err
    try:
        _check_expanded_size(yaml.compose(text, Loader=JobLoader), job_path)  # noqa: S506 (a SafeLoader)
        doc = yaml.load(text, Loader=JobLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:  # its marks say 'in "<unicode string>", line 3': name the file there
        where = str(err).replace('"<unicode string>"', f'"{job_path}"')
        if "found character '\\t' that cannot start any token" in where:  # a JSON job indented with tabs
            where += "\nindent with spaces (YAML does not allow tabs)"
        raise ConfigError(f"{job_path}: not valid YAML: {where}") from err
    except RecursionError as err:  # PyYAML composes recursively: a mapping nested some thousand levels deep
        raise ConfigError(f"{job_path}: mappings or lists nested deeper than a YAML reader can follow; a job file "
                          "nests a few levels (see workflows/): fix the file, or give the job file, not another "
                          "file") from err
    return parse_job(doc, job_path)


#: The most values (mappings, lists and scalars, each alias counted as what it stands for) a job
#: file may expand to: thousands of classes or paths fit; nested aliases ("billion laughs": a
#: few hundred bytes that expand to billions of values) do not
MAX_JOB_VALUES = 1_000_000


def _check_expanded_size(root: yaml.Node | None, job_path: Path) -> None:
    """ConfigError where the document ``root`` (composed: each alias one shared node) expands to
    more than :data:`MAX_JOB_VALUES` values, counted once per node without expanding anything."""
    if root is None:
        return
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        children: list[yaml.Node] = (
            [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode)
            else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if not done:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in size)
            continue
        size[id(node)] = min(1 + sum(size[id(child)] for child in children), MAX_JOB_VALUES + 1)
    if size[id(root)] > MAX_JOB_VALUES:
        raise ConfigError(f"{job_path}: the job file expands to more than {MAX_JOB_VALUES:,} values: YAML aliases "
                          "(*name) that repeat anchors which themselves repeat others (a 'billion laughs' document, "
                          "a few hundred bytes that would take gigabytes); a job file holds a few hundred values: "
                          "write the repeated parts out, or use fewer nested aliases")


#: What ``JobConfig.job_path`` is, and how messages name the job, for a job given as a mapping
#: rather than a file (``packer.build({...})``): there is no file to name.
MAPPING_JOB = Path("<dict>")


def job_from_mapping(doc: Mapping[str, Any], *, base_dir: str | os.PathLike[str] | None = None) -> JobConfig:
    """The job a job file would give, from the mapping its YAML parses to (``packer.build({...})``).

    Validated against the same schema with the same messages as a file, naming the job
    ``<dict>`` where they name the file. Relative paths (roots, tables, ``output``,
    ``registry``, ``phi.key_file``) are relative to ``base_dir``, by default the current folder,
    as a file's are to its folder. Values may be path objects and tuples: they are read as the
    strings and lists YAML gives, so the same job as a file and as a mapping has the same
    ``identity()`` and ``dataset_hash``. Raises ConfigError.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{MAPPING_JOB}: a job is a mapping with name, sources, split, pack and output, "
                          f"not {a_type(doc)}")
    base = Path.cwd() if base_dir is None else Path(base_dir)
    return parse_job(_as_yaml_values(doc), MAPPING_JOB, base=base.resolve())


def _as_yaml_values(value: Any) -> Any:
    """``value`` with mappings as dicts, tuples as lists and path objects as strings: the values
    a YAML job file parses to; numpy's scalars (``np.int64(8)``, computed in a notebook) as the
    Python ints, floats, bools and strings they hold, and its arrays (``df["cls"].unique()``)
    as lists of them: the schema refused ``np.int64(8)`` as not an integer. numpy is not
    imported here: where it is not loaded, no value is one of its."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    if numpy is not None and isinstance(value, numpy.ndarray):
        return _as_yaml_values(value.tolist())
    if isinstance(value, Mapping):
        return {(joined_surrogate_pairs(key) if isinstance(key, str) else key): _as_yaml_values(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_yaml_values(item) for item in value]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return joined_surrogate_pairs(value) if isinstance(value, str) else value
