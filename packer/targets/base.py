"""The base of every target kind: :class:`Target`, the registry of kinds, and the text forms.

A kind is one subclass of :class:`Target` registered under its name
(:func:`register_target_kind`); ``Target(kind, names)`` looks the name up and returns an
instance of that subclass, so a manifest's ``{"kind": "numeric", ...}`` becomes a
:class:`~packer.targets.numeric.NumericTarget` whose methods answer every kind-specific
question (what a shard holds, what a split's counts are, what ``inspect`` prints, what the
loader's ``labels=`` view keeps). Code outside this package asks those methods and never
compares a kind's name.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:  # the kinds import this module; the renderer protocol only names them
    from packer.targets.classes import ClassTarget
    from packer.targets.multilabel import MultiLabelTarget
    from packer.targets.numeric import NumericTarget
    from packer.targets.unlabeled import NoTarget

#: How the names of a multi-label target are joined in its text form.
SEPARATOR = "|"
#: What marks an ignored label in a multi-label target's text form (``Edema|?Cardiomegaly``):
#: the sample neither holds nor lacks it, and its ``target_mask`` entry is 0.
IGNORED = "?"

#: DICOM attributes a class label may be read from: descriptive, never identifying (PS3.15
#: Annex E's profile keeps or cleans them; none is a direct identifier). Free-text ones
#: (descriptions, protocol) are on the list because they often are the label; check their values.
LABEL_ATTRIBUTES = (
    "BodyPartExamined", "ContrastBolusAgent", "ConvolutionKernel", "ImageLaterality", "Laterality",
    "Manufacturer", "ManufacturerModelName", "Modality", "MRAcquisitionType", "PatientPosition",
    "PhotometricInterpretation", "PresentationIntentType", "ProtocolName", "ScanningSequence",
    "SequenceVariant", "SeriesDescription", "StudyDescription", "ViewPosition",
)

#: The :data:`LABEL_ATTRIBUTES` that are free text a technologist types (DICOM PS3.15 Annex E
#: lists each: "CT chest for <patient name> follow-up" happens). Under ``phi: pseudonymize`` their
#: raw values would become class names in every shard, the manifest and the report, so they are
#: labels only through a ``map:`` (or the job's ``labels:`` list), whose names the job file gives.
FREE_TEXT_LABEL_ATTRIBUTES = ("ContrastBolusAgent", "ProtocolName", "SeriesDescription", "StudyDescription")

#: One sample's target as ``packer diff`` compares it, name → value: 0/1 per label
#: (multilabel), the numbers (numeric).
TargetValues = tuple[tuple[str, float], ...]

T_co = TypeVar("T_co", covariant=True)

_REGISTRY: dict[str, type[Target]] = {}
F = TypeVar("F", bound=Callable[..., Any])


def per_kind(method: F) -> F:
    """Mark a method of :class:`Target` that every registered kind defines itself
    (:func:`register_target_kind` refuses a class that does not)."""
    method.__per_kind__ = True  # type: ignore[attr-defined]
    return method


def _undefined(kind: type[Target]) -> list[str]:
    """The :func:`per_kind` methods that ``kind`` leaves to :class:`Target`."""
    missing = []
    for name, value in vars(Target).items():
        if getattr(getattr(value, "__func__", value), "__per_kind__", False):
            owner = next(c for c in kind.__mro__ if name in vars(c))
            if owner is Target:
                missing.append(name)
    return missing


#: The cells of a 0/1 column read as a positive and as a negative (lower-cased)
TRUE_CELLS = frozenset({"1", "1.0", "true", "yes"})
FALSE_CELLS = frozenset({"0", "0.0", "false", "no"})


#: A number as a table writes one: sign, ASCII digits, a point, an exponent (``-1.5``, ``.5``,
#: ``1e-3``). Python's float() also reads ``1_5`` (15, digit grouping in source code), full-width
#: ``１２`` and other scripts' digits, which no CSV writer means as numbers
DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def cell_number(cell: str) -> float | None:
    """The finite number a cell spells (``1.00``, ``-1.0``, ``1e0``: :data:`DECIMAL`), else None."""
    if not DECIMAL.fullmatch(cell):
        return None
    number = float(cell)
    return number if math.isfinite(number) else None


def number_text(values: Iterable[float]) -> str:
    """The text form of a numeric target: each value as float32, in the shortest decimal that
    reads back as that float32 (``0.2054``, not float64's ``0.2054000049829483``), joined by ``|``."""
    return SEPARATOR.join(str(np.float32(v)) for v in values)


def names_text(names: Iterable[str]) -> str:
    """The text form of a multi-label target: the distinct names, sorted, joined by ``|``."""
    return SEPARATOR.join(sorted(set(names)))


@dataclass(frozen=True)
class CellPolicy:
    """How a source's table cells that are neither a value nor its negation read (the source's
    ``label:`` settings, :class:`packer.config.TargetConfig`): ``missing``, numeric cells that
    mean no value (``missing_label``); ``uncertain``, per multi-label 0/1 column, what an
    uncertain cell (one of ``uncertain_values``) becomes (``ones``, ``zeros``, ``ignore``,
    ``bad``); ``blank``, what an empty 0/1 cell becomes (``bad``, ``zeros``, ``ignore``). The
    default reads every such cell as a bad target."""

    missing: frozenset[str] = frozenset()
    uncertain: Mapping[str, str] | None = None
    uncertain_values: frozenset[str] = frozenset()
    blank: str = "bad"

    def uncertain_policy(self, column: str) -> str:
        """The policy of ``column``'s uncertain cells (``bad`` where none is set)."""
        return (self.uncertain or {}).get(column, "bad")


#: Every missing, uncertain or blank cell is a bad target.
NO_POLICY = CellPolicy()


@dataclass(frozen=True)
class Refused:
    """Why a sample has no usable target: a reason code (``missing_label``, ``unknown_label``,
    ``bad_target``) and a message naming the value and the fix. ``empty``: the target's cell is
    empty, which discovery leaves to the probe's own ``missing_label`` check (made after the
    file's other identity checks); any other refusal is the sample's bad-sample record as it is."""

    reason: str
    message: str
    empty: bool = False


def mapped_name(value: str, value_map: Mapping[str, str | None], known: Sequence[str], where: str) -> str | Refused:
    """A class name read from a table cell, a folder or a header attribute, through the source's
    ``map`` (raw value → class name; empty: none) and the job's ``labels:`` list (``known``;
    empty: any name). ``unknown_label`` names ``where`` and what is allowed."""
    if value_map:
        key = map_key(value, value_map)
        mapped = None if key is None else value_map[key]
        if mapped is None:  # not in the map (config parsing refuses a null class name)
            return Refused("unknown_label", f"{where}: {value!r} is not in the source's label map "
                                            f"({', '.join(value_map)}); add it to 'map:'")
        value = mapped
    if known and value not in known:
        twins = unicode_twins(value, known)
        if len(twins) == 1:
            return twins[0]
        return Refused("unknown_label", f"{where}: {value!r} is not in the job's labels ({', '.join(known)})"
                                        f"{twins_said(twins)}"
                                        f"{padded_number_said(value, known) or '; fix the value or add the label'}")
    return value


_WHOLE = re.compile(r"[0-9]+")


def padded_number_said(value: str, known: Sequence[str]) -> str:
    """What an ``unknown_label`` message says where ``value`` is a zero-padded whole number
    (``01``) whose number a listed label is (``1``): YAML 1.2 reads the job's unquoted ``01`` as
    the number 1, and a class id written as a number is its text, ``1`` (on purpose: ``labels:
    [0, 1]`` matches the cells ``0`` and ``1``); the fix is to quote the labels, padded as the
    cell is. Empty where that is not the case."""
    if len(value) < 2 or not value.startswith("0") or not _WHOLE.fullmatch(value) or str(int(value)) not in known:
        return ""
    quoted = ", ".join(f"'{int(name):0{len(value)}d}'" if _WHOLE.fullmatch(name) else name for name in known)
    return (f"; the job's labels list {int(value)}, which YAML reads from an unquoted {value}: quote them, "
            f"labels: [{quoted}]")


def unicode_twins(value: str, known: Sequence[str]) -> list[str]:
    """The names of the job's labels (``known``) that ``value`` equals in Unicode form only
    (after NFC): a class folder macOS named ``café`` as ``e`` and a combining accent (NFD) is
    the listed ``café`` typed as one code point, which prints the same. One such name is the
    class, in the job's spelling, so the label map holds the job's names whichever form a file
    used; two (a list spelling one name in both forms) are no class: a guess would merge them."""
    folded = unicodedata.normalize("NFC", value)
    return [name for name in known if name != value and unicodedata.normalize("NFC", name) == folded]


def map_key(value: str, value_map: Mapping[str, Any]) -> str | None:
    """The key of a source's ``map:`` that a cell, token, folder or header value ``value`` is:
    ``value`` itself, else the key it equals in all but Unicode form (:func:`unicode_twins`: a
    cell ``fièvre`` exported on macOS as ``e`` and a combining accent is the key typed as one code
    point), as a listed label is; None where the map has neither. Config parsing refuses two keys
    that are such twins and name different labels, so a twin is never a guess."""
    if value in value_map:
        return value
    twins = _nfc_keys(tuple(value_map)).get(unicodedata.normalize("NFC", value), ())
    return twins[0] if twins else None


@functools.lru_cache(maxsize=64)
def _nfc_keys(keys: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Map keys by their NFC form (a map is looked up once per cell or token: each key is
    normalised once per map, not once per lookup)."""
    out: dict[str, tuple[str, ...]] = {}
    for key in keys:
        folded = unicodedata.normalize("NFC", key)
        out[folded] = (*out.get(folded, ()), key)
    return out


def twins_said(twins: Sequence[str]) -> str:
    """What an ``unknown_label`` message adds where the value equals several listed names in
    Unicode form only (they print alike, so their code points are shown)."""
    if not twins:
        return ""
    return (f", though it equals {' and '.join(ascii(name) for name in twins)} in all but Unicode form (one code "
            "point, NFC, or a letter and a combining mark, NFD), which the labels list as different names: keep one")


def count_shares(counts: Mapping[str, int], total: int) -> dict[str, dict[str, float | int]]:
    """Per name (sorted) its count and its percent of ``total`` (one decimal; 0.0 when total is 0)."""
    return {name: {"count": n, "percent": round(100 * n / total, 1) if total else 0.0}
            for name, n in sorted(counts.items())}


@dataclass(frozen=True)
class SheetWords:
    """How the report's contact sheets speak of a kind: what a grid groups by (``label``,
    ``source``), the prefix of a grid's heading, what hovering a thumbnail shows of the
    target, and a sentence for the lead about the grouping (empty: none)."""

    group: str
    prefix: str
    hover: str
    grouping: str


@dataclass(frozen=True)
class TargetFact:
    """The report summary's entry for the target: its name, its value as text, an aside shown
    muted after it (empty: none), and the ``data-field`` the entry carries."""

    name: str
    value: str
    aside: str
    field: str


class SampleGroups(Protocol):
    """What grouping the report's contact sheets needs of the sample index: a column as
    per-row codes with the distinct values, the (row, position) pairs of the set multi-hot
    positions, and the number of rows."""

    def codes(self, name: str) -> tuple[np.ndarray, list[Any]]: ...

    def positives(self) -> tuple[np.ndarray, np.ndarray]: ...

    def __len__(self) -> int: ...


class TargetRenderer(Protocol[T_co]):
    """Output that is different for each kind and cannot live here because it needs its
    consumer's own tools (the HTML report's label balance): one method per registered kind,
    called through :meth:`Target.render`. Adding a kind adds its method here, and mypy names
    every renderer that lacks it."""

    def render_class(self, target: ClassTarget) -> T_co: ...

    def render_multilabel(self, target: MultiLabelTarget) -> T_co: ...

    def render_numeric(self, target: NumericTarget) -> T_co: ...

    def render_none(self, target: NoTarget) -> T_co: ...


class TargetMismatch(ValueError):
    """Two datasets' targets cannot share one batch; the message names neither dataset."""


def register_target_kind(kind: type[Target]) -> type[Target]:
    """Register ``kind`` (a subclass of :class:`Target`) under its ``KIND`` name, so that
    ``Target(name, names)`` and manifests recording that name give an instance of it. Raises
    ValueError for a class without a name or a name already taken."""
    name = kind.KIND
    if not name or name in _REGISTRY:
        raise ValueError(f"{kind.__name__}: target kind name {name!r} is empty or already registered "
                         f"({', '.join(_REGISTRY)})")
    missing = _undefined(kind)
    if missing:
        raise TypeError(f"{kind.__name__}: a target kind defines {', '.join(missing)} (see packer.targets.base.Target)")
    _REGISTRY[name] = kind
    return kind


def target_kinds() -> tuple[str, ...]:
    """The registered kind names, in registration order."""
    return tuple(_REGISTRY)


def target_class(kind: str) -> type[Target]:
    """The class registered for ``kind``; ValueError naming the known kinds otherwise."""
    found = _REGISTRY.get(kind)
    if found is None:
        raise ValueError(f"unknown target kind {kind!r}; expected one of {target_kinds()}")
    return found


@dataclass(frozen=True)
class Target:
    """A dataset's target: its ``kind`` (a registered name) and ``names``: the class names in
    label-index order (class), the multi-hot positions (multilabel), the numbers' names
    (numeric), nothing (none).

    ``Target(kind, names)`` returns the kind's registered subclass; two targets are equal when
    kind and names are. It is frozen, hashable and pickles as ``Target(kind, names)``, so it
    travels to dask workers. A subclass answers every abstract method below for its kind.
    """

    kind: str
    names: tuple[str, ...] = ()
    #: each sample also carries a target mask, 1 per target entry to use and 0 per entry a
    #: loss must skip (``.target_mask.npy``, column ``target_mask``, batch ``target_mask``);
    #: only kinds with :attr:`maskable` targets, and only where a source may ignore entries
    masked: bool = False

    #: the name this class is registered under
    KIND: ClassVar[str] = ""
    #: each sample carries a class index (``.cls`` member, ``label`` column, batch ``label``)
    has_label: ClassVar[bool] = False
    #: each sample carries a target vector (``.target.npy``, column ``target``, batch ``target``)
    has_vector: ClassVar[bool] = False
    #: its target texts name labels (a class, or the labels a sample holds: :meth:`held_names`),
    #: which a table typed by hand may spell two ways (``Effusion``, ``effusion``)
    names_labels: ClassVar[bool] = False
    #: the dtype of the target vector in a shard
    vector_dtype: ClassVar[np.dtype] = np.dtype(np.float32)
    #: the heading of ``packer inspect``'s per-split target column
    inspect_heading: ClassVar[str] = "targets"
    #: how a contact-sheet caption names the sample's target (None: it does not)
    caption_field: ClassVar[str | None] = None
    #: the ``_index.parquet`` column a ``labels=`` view filters on (None: the kind has no labels)
    view_column: ClassVar[str | None] = None
    #: a target of this kind may carry a target mask (:attr:`masked`)
    maskable: ClassVar[bool] = False
    #: its label ``map`` keeps a value it does not name as it is (a multi-label token), where a
    #: class map refuses it (``unknown_label``): so a map written for one fix need name that alone
    map_keeps_unnamed: ClassVar[bool] = False
    #: the kind a source's ``label:`` reads as when it names none (``kind:`` need not be written)
    default_kind: ClassVar[bool] = False
    #: read from several table columns without a separator, its labels are those columns'
    #: names (multi-label 0/1 columns): a ``map`` cannot rename them, the table's header can
    columns_name_labels: ClassVar[bool] = False
    #: its table cells are numbers, written in plain decimal notation (numeric targets): a JSON
    #: table's true, false or list there is no number, where a 0/1 label column reads true as 1
    cells_are_numbers: ClassVar[bool] = False

    def __new__(cls, kind: str, names: tuple[str, ...] = (), masked: bool = False) -> Target:
        chosen = target_class(kind)
        if not issubclass(chosen, cls):
            raise ValueError(f"{cls.__name__} holds {cls.KIND} targets, not {kind!r}; use Target({kind!r}, names)")
        if masked and not chosen.maskable:
            raise ValueError(f"a {kind} target has no entries to mask; only multilabel targets carry a target mask")
        return object.__new__(chosen)

    def __reduce__(self) -> tuple[Any, tuple[str, tuple[str, ...], bool]]:
        return Target, (self.kind, self.names, self.masked)

    # -- what a target is ------------------------------------------------------------------------

    @property
    def label_map(self) -> dict[str, int]:
        """Name → index: the class index (class) or multi-hot position (multilabel); empty otherwise."""
        return {}

    def to_json(self) -> dict[str, Any]:
        """``kind`` and ``names``, and ``target_mask: true`` only for a masked target (so every
        other dataset's manifest reads as before)."""
        return {"kind": self.kind, "names": list(self.names), **({"target_mask": True} if self.masked else {})}

    @classmethod
    def of_json(cls, record: Mapping[str, Any]) -> Target:
        """The target a ``to_json`` record names. ValueError for a kind not registered."""
        return Target(str(record["kind"]), tuple(record.get("names", ())), bool(record.get("target_mask", False)))

    @classmethod
    def of_manifest(cls, manifest: Mapping[str, Any]) -> Target:
        """The target a manifest records; a manifest without ``target`` has one class label per
        sample, named by its ``label_map`` (every dataset built before targets had kinds)."""
        recorded = manifest.get("target")
        if recorded is None:
            label_map: Mapping[str, int] = manifest.get("label_map", {})
            return Target("class", tuple(sorted(label_map, key=label_map.__getitem__)))
        return cls.of_json(recorded)

    @per_kind
    def manifest_record(self) -> dict[str, Any] | None:
        """The manifest's ``target`` entry; None where the manifest leaves it out."""
        raise NotImplementedError

    # -- one sample's target: text, shard, record --------------------------------------------------

    @classmethod
    @per_kind
    def text_of_cells(cls, cells: Mapping[str, str], *, where: str, separator: str | None,
                      value_map: Mapping[str, str | None], known: Sequence[str],
                      policy: CellPolicy = NO_POLICY) -> str | Refused:
        """The target text of one table row, from the stripped ``cells`` (column → text) of the
        source's target columns, or why there is none. ``where`` names the table and row;
        ``separator`` splits a multi-label cell; ``value_map`` and ``known`` as for
        :func:`mapped_name`; ``policy``: how missing, uncertain and blank cells read."""
        raise NotImplementedError

    @classmethod
    def held_names(cls, text: str | None) -> list[str]:
        """The names a sample whose target text is ``text`` counts under when the split
        stratifies by label: the text itself, one name per sample, unless the kind says otherwise."""
        return [text or ""]

    @classmethod
    @per_kind
    def conflicts(cls, a: str | None, b: str | None, *, tolerance: float) -> bool:
        """Whether two copies of one image (exact duplicates or verified near copies) whose
        target texts are ``a`` and ``b`` disagree: label noise, or two patients mixed up
        (``label_conflicts``, :mod:`packer.pipeline.conflicts`). ``tolerance``: how far two
        numbers may differ and still agree (absolute; only numeric targets have numbers)."""
        raise NotImplementedError

    @classmethod
    def union_text(cls, texts: Sequence[str | None]) -> str | None:
        """The target text of a file that several table rows name with these texts, holding
        every row's targets (``repeated: union``); None where the kind cannot join targets (the
        rows must then agree)."""
        return None

    def encode(self, text: str | None, where: str = "") -> tuple[int | None, np.ndarray | None]:
        """(class index, target vector) of a sample whose target text is ``text``; ``None`` where
        the kind has none. Raises ValueError, naming ``where``, for text this target cannot hold
        (an unknown name, a wrong count of numbers): discovery refuses those first."""
        if text is None:
            raise ValueError(f"{where}: the sample has no target")
        return self._encode(text, where)

    @per_kind
    def _encode(self, text: str, where: str) -> tuple[int | None, np.ndarray | None]:
        """:meth:`encode` of a sample that has a target text."""
        raise NotImplementedError

    def encode_mask(self, text: str | None, where: str = "") -> np.ndarray | None:
        """The target mask (uint8, one entry per name: 1 use, 0 skip) of a sample whose target
        text is ``text``; None unless the target is :attr:`masked`."""
        return None

    @per_kind
    def record_fields(self, text: str, label: int | None, vector: np.ndarray | None) -> dict[str, Any]:
        """What a sample's record (``.json`` member, ``metadata`` cell) says of its target, from
        its text and what :meth:`encode` made of it."""
        raise NotImplementedError

    def record_vector(self, record: Mapping[str, Any]) -> tuple[float, ...] | None:
        """The target vector a sample's record states (:meth:`record_fields`), in ``names``
        order; None for a kind without a vector."""
        return None

    @per_kind
    def describe(self, label: int | None, vector: np.ndarray | None) -> str:
        """A short human reading of one sample's target (contact sheets, ``inspect``, ``diff``)."""
        raise NotImplementedError

    def problem(self, label: int | None, vector: np.ndarray | None) -> str | None:
        """Why a read sample's target does not fit this dataset's target, or None."""
        if self.has_label:
            if label is None:
                return "no label (.cls member or label cell)"
            if not 0 <= label < len(self.names):
                return f"label index {label} is out of range of label_map (0..{len(self.names) - 1})"
        elif label is not None:
            return f"a label {label}, but this dataset's target kind is {self.kind}"
        if self.has_vector:
            if vector is None:
                return f"no target vector (.target.npy member or target cell) for a {self.kind} dataset"
            if vector.shape != (len(self.names),):
                return (f"target has shape {tuple(vector.shape)}, the manifest's {self.kind} target has "
                        f"{len(self.names)}")
            return self._vector_problem(vector)
        if vector is not None:
            return f"a target vector, but this dataset's target kind is {self.kind}"
        return None

    def _vector_problem(self, vector: np.ndarray) -> str | None:
        """What is wrong with a target vector of the right shape, or None (any value is fine)."""
        return None

    def mask_problem(self, mask: np.ndarray | None) -> str | None:
        """Why a read sample's target mask does not fit this dataset's target, or None: a masked
        target needs a uint8 0/1 vector of one entry per name; any other needs none."""
        if not self.masked:
            return None if mask is None else "a target mask, but this dataset's manifest records none"
        if mask is None:
            return "no target mask (.target_mask.npy member or target_mask cell) for a dataset with target masks"
        if mask.shape != (len(self.names),):
            return f"target mask has shape {tuple(mask.shape)}, the manifest's target has {len(self.names)} entries"
        if mask.dtype != np.uint8 or not np.isin(mask, (0, 1)).all():
            return f"target mask must be uint8 0/1, got {mask.dtype} {sorted(set(mask.tolist()))}"
        return None

    # -- a dataset's target and its statistics -----------------------------------------------------

    @classmethod
    @per_kind
    def from_texts(cls, texts: Iterable[str | None], *, labels: tuple[str, ...],
                   columns: tuple[str, ...]) -> Target:
        """The dataset's target of this kind from the target texts of its packed samples, the
        job's ``labels:`` list (empty: none given) and the columns the sources' tables give the
        target in, in job order (0/1 label columns; numeric targets' columns)."""
        raise NotImplementedError

    @per_kind
    def split_counts(self, labels: np.ndarray, vectors: np.ndarray, masks: np.ndarray | None = None
                     ) -> dict[str, Any]:
        """A manifest split entry's target statistics over its samples' class indices
        (``labels``, int64), target vectors (``vectors``, N×L) and, for a masked target, target
        masks (``masks``, N×L uint8): ``class_counts`` and, for some kinds, more (numeric
        targets' ``target_stats``, masked targets' ``ignored_counts``)."""
        raise NotImplementedError

    def split_problem(self, entry: Mapping[str, Any]) -> str | None:
        """What is wrong with a manifest split entry's target statistics (``packer verify``), or
        None; a kind whose counts cannot be checked against the split's samples has nothing to say."""
        return None

    # -- what people read: build summary, inspect, diff, report ---------------------------------------

    @per_kind
    def brief(self, entry: Mapping[str, Any]) -> str:
        """One split's targets in ``packer build``'s summary line (``entry``: the manifest's split)."""
        raise NotImplementedError

    @per_kind
    def summarize_split(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """What ``packer inspect`` (``summarize_manifest``) says of a manifest split ``entry``'s
        targets: ``classes`` (count and percent per name) and, for some kinds, more."""
        raise NotImplementedError

    def summarize_total(self, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:meth:`summarize_split` over the manifest split ``entries`` together."""
        counts: Counter[str] = Counter()
        for entry in entries:
            counts.update(entry["class_counts"])
        return self.summarize_split({"class_counts": dict(counts), "samples": sum(e["samples"] for e in entries)})

    @per_kind
    def inspect_line(self, label_map: Mapping[str, int]) -> str:
        """What ``packer inspect`` says of the dataset's target (``label_map``: the manifest's)."""
        raise NotImplementedError

    @per_kind
    def inspect_cells(self, summary: Mapping[str, Any]) -> str:
        """One split's (or the total's) target column of the ``inspect`` table, from what
        :meth:`summarize_split` gave."""
        raise NotImplementedError

    @per_kind
    def index_target(self, label: int | None, vector: Sequence[float] | None,
                     mask: Sequence[int] | None = None) -> tuple[str, TargetValues | None]:
        """An ``_index.parquet`` row's target as ``packer diff`` compares it: (its text, its
        :data:`TargetValues`; None for a kind without a vector). ``mask``: the row's target mask
        (``target_mask``, a masked target's index), None where none is recorded."""
        raise NotImplementedError

    @per_kind
    def compared_target(self, text: str | None, values: TargetValues | None) -> Hashable:
        """What :meth:`relabeled` compares of a sample's (text, values), as :meth:`index_target`
        gives them: two samples' targets differ exactly where these differ, so ``packer diff``
        can group samples by it (pairing copies of one image under new keys by their targets)."""
        raise NotImplementedError

    def relabeled(self, old: tuple[str | None, TargetValues | None], new: tuple[str | None, TargetValues | None]
                  ) -> bool:
        """Whether a sample's target differs between two versions of this kind; ``old`` and
        ``new`` are (text, values) as :meth:`index_target` gives them."""
        return self.compared_target(*old) != self.compared_target(*new)

    def moved_positions(self, new: Target) -> tuple[str, ...]:
        """Each position of the target vector both versions have that holds another name in
        ``new`` (a target of the same kind), as ``0 age -> dose``: a model trained on this version
        reads the values there as the old names'. A position only one version has (a column
        added or dropped at the end) moves nothing. Empty for a kind without a vector (a class
        target's indices are the label map's) or where nothing moved."""
        if not (self.has_vector and new.has_vector) or type(self) is not type(new):
            return ()
        return tuple(f"{i} {a} -> {b}" for i, (a, b) in enumerate(zip(self.names, new.names, strict=False)) if a != b)

    def compared_with(self, new: Target) -> Target:
        """The target ``packer diff`` compares samples of this version and of ``new`` (a target
        of the same kind) with: this one, unless the kind's comparison depends on both
        vocabularies (multi-label: :meth:`MultiLabelTarget.compared_with`)."""
        return self

    @per_kind
    def diff_names(self, text: str | None, values: TargetValues | None) -> tuple[str, ...]:
        """The names an added, removed or changed sample counts under in ``diff``'s by-label table."""
        raise NotImplementedError

    @per_kind
    def relabel_counts(self, old: tuple[str | None, TargetValues | None],
                       new: tuple[str | None, TargetValues | None]) -> list[tuple[str, str]]:
        """(name, column) of each count a relabeled sample adds to ``diff``'s by-label table."""
        raise NotImplementedError

    @per_kind
    def report_fact(self, label_map: Iterable[str]) -> TargetFact:
        """The report summary's entry for the target (``label_map``: the manifest's names, in its order)."""
        raise NotImplementedError

    @per_kind
    def sheet_words(self, no_label: str) -> SheetWords:
        """How the contact sheets speak of this kind (``no_label``: the group of multi-label
        samples that hold none of the labels)."""
        raise NotImplementedError

    @per_kind
    def sheet_groups(self, index: SampleGroups, no_label: str) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
        """What the contact sheets group samples by: the row of each member (None: member i is
        row i), the group number of each member and the groups' names."""
        raise NotImplementedError

    def value_names(self) -> tuple[str, ...]:
        """The names whose values the report draws as histograms (numbers, not counts); none
        unless the kind's targets are numbers."""
        return ()

    @per_kind
    def render(self, renderer: TargetRenderer[T_co]) -> T_co:
        """``renderer``'s output for this kind (see :class:`TargetRenderer`)."""
        raise NotImplementedError

    # -- the loader -----------------------------------------------------------------------------------

    def holding(self, column: np.ndarray, label_ids: Iterable[int]) -> np.ndarray:
        """Which index rows a ``labels=`` view keeps (bool per row), from the rows'
        :attr:`view_column` values (a vector column flattened) and the wanted label indices.
        ValueError for a kind without labels (``view_column`` None)."""
        raise ValueError(f"a {self.kind} target has no labels to filter by")

    @per_kind
    def join(self, other: Target) -> tuple[Target, dict[int, int] | None]:
        """The target of a mix of this target's samples and ``other``'s (of the same kind), and
        the map of ``other``'s class indices into it (None: the same indices). TargetMismatch
        when ``other``'s samples cannot share a batch with these."""
        raise NotImplementedError


def counts_text(entry: Mapping[str, Any]) -> str:
    """A split's ``class_counts`` as ``name count, ...`` (``-`` when empty)."""
    return ", ".join(f"{k} {v}" for k, v in entry["class_counts"].items()) or "-"


def shares_text(summary: Mapping[str, Any]) -> str:
    """:func:`count_shares`'s ``classes`` as ``name count (percent%), ...`` (``-`` when empty)."""
    return ", ".join(f"{k} {v['count']} ({v['percent']:.1f}%)" for k, v in summary["classes"].items()) or "-"


def join_same_names(target: Target, other: Target) -> tuple[Target, dict[int, int] | None]:
    """:meth:`Target.join` of kinds whose names are vector positions: ``other`` must name the
    same positions in the same order."""
    if other.names != target.names:
        raise TargetMismatch(f"its {target.kind} target names {list(other.names)} differ from "
                             f"{list(target.names)}; a {target.kind} target is a vector whose positions must mean "
                             "the same thing in every member")
    return target, None


def groups_by_source(index: SampleGroups) -> tuple[np.ndarray | None, np.ndarray, list[str]]:
    """:meth:`Target.sheet_groups` by each sample's source (kinds whose targets do not group)."""
    source_code, sources = index.codes("source")
    return None, source_code, [str(source) for source in sources]
