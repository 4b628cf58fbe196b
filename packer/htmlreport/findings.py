"""Read the leakage audit into one shape, whichever way the manifest records it.

Current manifests carry ``audit = {passed, entities_per_split, time_ranges, rules: {rule:
{severity, count, passed, ...}}}`` and the findings live in ``leakage.json`` next to them
(a rule dict that already holds ``findings`` is used as is). Earlier manifests carried
``audit.split.{entity_overlap, time_ranges, entities_per_split, passed}`` and, optionally,
``audit.duplicates`` as a list (or ``{"pairs": [...]}``) of ``{a, b, distance}`` (a dHash
distance: near pairs before near copies were verified; now a pair carries its verification
``score``, ``structure``, ``zoom`` and ``shift``).

Findings name samples by key, split and entity id only: ``leakage.json`` also records raw
relative paths, which the report leaves out. ``leakage.json`` lists the first findings of a rule
(200) beside its full count: :meth:`AuditFindings.total` counts what each kind of finding holds
from the rules' counts, not from the capped lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

LEAKAGE_FILE = "leakage.json"


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str
    count: int
    passed: bool
    detail: dict[str, Any]


@dataclass(frozen=True)
class Member:
    key: str
    split: str | None = None
    entity_id: str | None = None


@dataclass(frozen=True)
class DuplicateGroup:
    """Samples a rule found to be copies (exact) or near copies of each other; ``evidence``: how
    the near copy was judged (its verification, or an older build's Hamming distance)."""

    rule: str
    members: tuple[Member, ...]
    evidence: str | None = None
    size: int = 0

    @property
    def cross_split(self) -> bool:
        return len({m.split for m in self.members if m.split}) > 1


@dataclass(frozen=True)
class LabelConflictGroup:
    """Copies of one image whose targets (or masks) disagree (rule ``label_conflicts``): each
    member with its target text; ``dice``, the lowest mask Dice where masks were compared;
    ``dropped``: left out of the dataset (``drop_group``)."""

    members: tuple[tuple[Member, str], ...]
    size: int
    linked_by: str
    dice: float | None = None
    dropped: bool = False


@dataclass(frozen=True)
class LookalikeGroup:
    """Entity ids that differ only in case, spacing or leading zeros (rule ``entity_lookalikes``):
    each entity (its output id: a pseudonym under PHI) with its splits and a sample key."""

    entities: tuple[tuple[Member, tuple[str, ...]], ...]
    across_splits: bool


@dataclass
class AuditFindings:
    passed: bool | None = None
    rules: list[Rule] = field(default_factory=list)
    overlap: list[tuple[str, list[str]]] = field(default_factory=list)
    groups: list[DuplicateGroup] = field(default_factory=list)
    time_order: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[LabelConflictGroup] = field(default_factory=list)
    lookalikes: list[LookalikeGroup] = field(default_factory=list)
    entities_per_split: dict[str, int] = field(default_factory=dict)
    time_ranges: dict[str, list[str]] = field(default_factory=dict)
    note: str | None = None
    #: per kind of finding (``overlap``, ``groups``, ``time_order``, ``conflicts``, ``lookalikes``),
    #: each rule that made some: how many it made (its count, or for near pairs within tolerance
    #: its ``pairs``) and how many of them ``leakage.json`` lists
    made: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    #: each group's place in ``groups`` by its members' keys (:func:`_add_group`)
    _group_at: dict[frozenset[str], int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def clean(self) -> bool:
        """True when no rule counted anything and nothing is listed."""
        return (not any(r.count for r in self.rules) and not self.overlap and not self.groups
                and not self.time_order and not self.conflicts and not self.lookalikes and self.passed is not False)

    def total(self, kind: str) -> tuple[int, bool]:
        """How many findings of ``kind`` (an attribute: ``groups``, ``overlap``, ...) the audit
        made, and whether that number is exact. The listed ones where every rule's findings are
        listed; else the count of the one rule that made them; else (several rules, one listed
        in part: a pair two rules found is one group) at least the most any one rule made."""
        listed = len(getattr(self, kind))
        made = self.made.get(kind, {})
        if all(count <= shown for count, shown in made.values()):
            return listed, True
        most = max(listed, *(count for count, _ in made.values()))
        return most, len(made) == 1


def _member(value: Any) -> Member | None:
    if isinstance(value, str):
        return Member(key=value)
    if isinstance(value, dict) and "key" in value:
        return Member(key=str(value["key"]), split=value.get("split"), entity_id=value.get("entity_id"))
    return None


def _evidence(finding: dict[str, Any]) -> str | None:
    """How a near pair was judged, in words: its verification score and alignment, or a distance."""
    score, distance = finding.get("score"), finding.get("distance")
    if isinstance(score, int | float):
        parts = [f"score {score:.3f}"]
        if isinstance(finding.get("structure"), int | float):
            parts.append(f"structure {finding['structure']:.2f}")
        if isinstance(finding.get("zoom"), int | float) and finding["zoom"] != 1.0:
            parts.append(f"zoom {finding['zoom']:.2f}")
        shift = finding.get("shift")
        if isinstance(shift, list) and any(shift):
            parts.append(f"shift {shift[0]},{shift[1]} px")
        return ", ".join(parts)
    if isinstance(distance, int | float):
        return f"Hamming distance {int(distance)}"
    return None


def _group(rule: str, members: list[Any], evidence: str | None = None, size: int = 0) -> DuplicateGroup | None:
    found = tuple(m for m in (_member(v) for v in members) if m is not None)
    if len(found) < 2 and not size:
        return None
    return DuplicateGroup(rule=rule, members=found, size=size or len(found), evidence=evidence)


def _conflict(finding: dict[str, Any]) -> LabelConflictGroup | None:
    """A ``label_conflicts`` finding: its members with their target texts."""
    members = tuple((member, str(s.get("label") or "")) for s in finding.get("samples") or []
                    if isinstance(s, dict) and (member := _member(s)) is not None)
    if not members:
        return None
    dice = finding.get("mask_dice")
    return LabelConflictGroup(members=members, size=int(finding.get("size") or len(members)),
                              linked_by=str(finding.get("linked_by", "")),
                              dice=float(dice) if isinstance(dice, int | float) else None,
                              dropped=bool(finding.get("dropped")))


def _lookalike(finding: dict[str, Any]) -> LookalikeGroup | None:
    """An ``entity_lookalikes`` finding: ``{entities: [{entity_id, key, splits, ...}], across_splits}``."""
    entities = tuple((Member(key=str(e.get("key", "")), entity_id=str(e.get("entity_id", ""))),
                      tuple(str(s) for s in e.get("splits") or []))
                     for e in finding.get("entities") or [] if isinstance(e, dict))
    if not entities:
        return None
    return LookalikeGroup(entities=entities, across_splits=bool(finding.get("across_splits")))


def _add_findings(out: AuditFindings, rule: str, findings: list[Any], made: int | None = None) -> None:
    """Add ``rule``'s listed ``findings`` to ``out``, each to its kind; ``made``: how many the
    rule made (its count; None for a legacy list, which is whole), which
    :meth:`AuditFindings.total` counts under the kind of the findings listed."""
    kinds = {name: len(getattr(out, name)) for name in ("overlap", "groups", "time_order", "conflicts", "lookalikes")}
    merged = 0  # groups another rule found first: listed under it, still this rule's findings
    for finding in findings:
        if not isinstance(finding, dict):
            continue
        group = None
        if rule == "entity_lookalikes":
            lookalike = _lookalike(finding)
            if lookalike is not None:
                out.lookalikes.append(lookalike)
        elif rule == "label_conflicts":
            conflict = _conflict(finding)
            if conflict is not None:
                out.conflicts.append(conflict)
        elif "entity_id" in finding and "splits" in finding:
            out.overlap.append((str(finding["entity_id"]), [str(s) for s in finding["splits"]]))
        elif "a" in finding and "b" in finding:
            group = _group(rule, [finding["a"], finding["b"]], _evidence(finding))
        elif isinstance(finding.get("samples"), list):
            group = _group(rule, finding["samples"], size=int(finding.get("size") or len(finding["samples"])))
        elif any(k in finding for k in ("starts", "earliest", "latest_train", "latest_valid", "train_samples_after",
                                        "valid_samples_after")):
            out.time_order.append(finding)
        if group is not None:
            merged += not _add_group(out, group)
    grown = [name for name, before in kinds.items()
             if len(getattr(out, name)) > before or (name == "groups" and merged)]
    if len(grown) == 1:
        out.made.setdefault(grown[0], {})[rule] = (max(made or 0, len(findings)), len(findings))


def _add_group(out: AuditFindings, group: DuplicateGroup) -> bool:
    """One group per set of samples: the same copies found by several rules (an exact pair is
    within a split and spans two entities) are one group naming every rule, not one each (the
    report counted and drew such a pair twice). True where the group is a new one."""
    members = frozenset(m.key for m in group.members)
    at = out._group_at.get(members)
    if at is None:
        out._group_at[members] = len(out.groups)
        out.groups.append(group)
        return True
    seen = out.groups[at]
    rules = seen.rule.split(", ")
    out.groups[at] = replace(seen, rule=", ".join([*rules, *(r for r in group.rule.split(", ") if r not in rules)]),
                             evidence=seen.evidence or group.evidence, size=max(seen.size, group.size))
    return False


def read_audit(manifest: dict[str, Any], folder: Path) -> AuditFindings:
    """The audit of ``manifest`` with its findings (from the manifest or ``folder/leakage.json``)."""
    audit: dict[str, Any] = manifest["audit"] if isinstance(manifest.get("audit"), dict) else {}
    legacy: dict[str, Any] = audit["split"] if isinstance(audit.get("split"), dict) else {}
    out = AuditFindings(
        passed=audit.get("passed", legacy.get("passed")),
        entities_per_split=dict(audit.get("entities_per_split") or legacy.get("entities_per_split") or {}),
        time_ranges=dict(audit.get("time_ranges") or legacy.get("time_ranges") or {}))
    rules: dict[str, Any] = audit["rules"] if isinstance(audit.get("rules"), dict) else {}
    listed: dict[str, Any] = {}
    if any(isinstance(r, dict) and "findings" not in r for r in rules.values()):
        try:
            listed = json.loads((folder / LEAKAGE_FILE).read_text(encoding="utf-8")).get("rules", {})
            if not isinstance(listed, dict):
                raise ValueError(f"its rules are a JSON {type(listed).__name__}, not an object")
        except (OSError, ValueError, AttributeError, RecursionError) as err:
            listed = {}
            out.note = (f"{LEAKAGE_FILE} could not be read ({type(err).__name__}); "
                        "rule counts come from the manifest, findings are not listed")
    # label_conflicts and entity_lookalikes enter the manifest only where they find something;
    # leakage.json holds every rule, so the table lists the others from it too
    extra = {name: raw for name, raw in listed.items() if name not in rules and isinstance(raw, dict)}
    for name, raw in sorted({**rules, **extra}.items()):
        if not isinstance(raw, dict):
            continue
        detail = {k: v for k, v in raw.items() if k not in ("severity", "count", "passed", "findings")}
        count = int(raw.get("count", 0))
        out.rules.append(Rule(name=str(name), severity=str(raw.get("severity", "")), count=count,
                              passed=bool(raw.get("passed", count == 0)), detail=detail))
        findings = raw.get("findings")
        if findings is None:
            entry = listed.get(name)
            findings = entry.get("findings", []) if isinstance(entry, dict) else []
        pairs = detail.get("pairs")  # near pairs: listed within tolerance too, where the count says 0
        _add_findings(out, str(name), findings if isinstance(findings, list) else [],
                      made=int(pairs) if isinstance(pairs, int) and not isinstance(pairs, bool) else count)
    for entity, splits in sorted((legacy.get("entity_overlap") or {}).items()):
        out.overlap.append((str(entity), [str(s) for s in splits]))
    pairs = audit.get("duplicates")
    if isinstance(pairs, dict):
        pairs = pairs.get("pairs")
    if isinstance(pairs, list):
        _add_findings(out, "duplicates", [p for p in pairs if isinstance(p, dict) and "a" in p and "b" in p])
    return out
