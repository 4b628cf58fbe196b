"""Structure maps: which names (and codes) of DICOM structures become which class ids of a mask.

The job's ``mask.segments`` and ``mask.rois``. A SEG segment or an RTSTRUCT ROI is named by a
person (``Lung_L``, ``LUNG LEFT``, ``lt lung``): names compare without case, spaces or
punctuation (:func:`normalise_name`), each class lists the aliases it answers to, and a SEG
segment may be matched by its coded Segmented Property Type (SNOMED CT) instead. The map keeps
the declared order, which ``overlap: later_wins`` ranks classes by. Used by the job parser
(:mod:`packer.config`) and the annotation readers (:mod:`packer.read.annotations`).
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field


def normalise_name(name: str) -> str:
    """A structure name as the map compares it: letters and digits only, of any script, case-folded
    after NFKC (``Lung_L``, ``LUNG-L`` and ``lung l`` are one name; ``心臓`` and ``肝臓`` stay two,
    and full-width ``ＬＵＮＧ`` is ``lung``). Dropping every letter outside a-z would make names in
    Japanese, Chinese, Cyrillic or Greek one empty name."""
    return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", name).casefold())


def code_key(code: str) -> str:
    """A coded concept as the map compares it: ``SCT:10200004`` and ``10200004`` both give
    ``10200004`` (SNOMED CT is the default scheme); another scheme keeps its designator."""
    scheme, _, value = code.strip().rpartition(":")
    scheme = scheme.strip().upper()
    return value.strip() if scheme in ("", "SCT", "SRT", "SNM3") else f"{scheme}:{value.strip()}"


@dataclass(frozen=True)
class Structure:
    """One class of the job's map: its ``name`` (the map's key: what the manifest names), its
    ``id`` in the mask, the ``aliases`` a structure may be called (the name itself among them),
    and for SEG the ``codes`` of its Segmented Property Type (``SCT:10200004``)."""

    name: str
    id: int
    aliases: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"id": self.id}
        if self.aliases:
            out["aliases"] = list(self.aliases)
        if self.codes:
            out["codes"] = list(self.codes)
        return out


@dataclass(frozen=True)
class StructureMap:
    """The job's map from structure names (and codes) to class ids, in declared order: under
    ``overlap: later_wins`` a class declared later wins a voxel both claim."""

    structures: tuple[Structure, ...]
    _names: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _codes: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _ids: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for rank, structure in enumerate(self.structures):
            self._ids.setdefault(structure.id, rank)
            for alias in (structure.name, *structure.aliases):
                self._names.setdefault(normalise_name(alias), rank)
            for code in structure.codes:
                self._codes.setdefault(code_key(code), rank)

    def rank(self, structure: Structure) -> int:
        """The place of ``structure``'s class (by id) in the declared order, 0 first: a class
        named in both ``segments`` and ``rois`` ranks where it first appears."""
        return self._ids[structure.id]

    def by_name(self, name: str) -> Structure | None:
        """The class a structure called ``name`` belongs to, None where the map names it nowhere."""
        rank = self._names.get(normalise_name(name))
        return self.structures[rank] if rank is not None else None

    def by_code(self, scheme: str, value: str) -> Structure | None:
        """The class whose ``codes`` hold the coded concept (``SCT``, ``10200004``), or None."""
        rank = self._codes.get(code_key(f"{scheme}:{value}"))
        return self.structures[rank] if rank is not None else None

    def names(self) -> tuple[str, ...]:
        """Every name and alias the map matches, as written."""
        return tuple(alias for s in self.structures for alias in (s.name, *s.aliases))

    def suggestions(self, found: Iterable[str]) -> str:
        """For an object none of whose structure names (``found``) is mapped: the closest pairs,
        ``'LUNG LEFT' → lung_l (alias 'Lung_L')``, or ``""`` when none is close."""
        written = {normalise_name(alias): (s, alias) for s in self.structures for alias in (s.name, *s.aliases)}
        pairs = []
        for name in found:
            close = difflib.get_close_matches(normalise_name(name), list(written), n=1, cutoff=0.5)
            if close:
                structure, alias = written[close[0]]
                via = f" (alias {alias!r})" if alias != structure.name else ""
                pairs.append(f"{name!r} → {structure.name}{via}")
        return "; ".join(pairs)

    def to_json(self) -> dict[str, object]:
        return {s.name: s.to_json() for s in self.structures}
