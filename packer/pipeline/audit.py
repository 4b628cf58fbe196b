"""Audit: check a split assignment for leakage from scratch, rule by rule.

Each rule yields a :class:`RuleResult` with its findings. ``fail`` rules stop the build
(exit 4) when they find anything; ``report`` rules are written to ``leakage.json`` and the
manifest but do not fail. The rules:

- ``entity_overlap`` (fail): an entity with samples in two splits.
- ``exact_duplicates_across_splits`` (fail; report with ``duplicates: report``): the same
  packed pixels in two splits.
- ``near_duplicates_across_splits`` (fail above ``near_duplicates.max_cross_split``; report
  with ``duplicates: report``): verified near copies (:mod:`packer.pipeline.nearcopy`) in two splits,
  each with its evidence.
- ``exact_duplicates_within_split`` (report): the same pixels twice in one split.
- ``duplicates_span_entities`` (report): a duplicate cluster holding several entities, a
  likely identity error (one patient under two ids, or a mislabelled copy).
- ``time_order`` (report, time splits): each split's latest time precedes the earliest time
  of every later split (train before valid and test, valid before test).
- ``label_conflicts`` (fail with ``split.duplicates.label_conflict: fail``, else report): a
  group of exact duplicates or verified near copies whose members' targets (or exact copies'
  masks) disagree (:mod:`packer.pipeline.conflicts`), each member with its target; under
  ``drop_group`` the members are in no split. Recorded in the manifest only where it found a
  group, so a dataset without conflicts keeps the manifest, and version, it had before the rule.
- ``entity_lookalikes`` (report): entity ids that differ only in case, spacing or leading
  zeros (``MRN0042`` and ``mrn0042``, ``0045`` and ``45``; :func:`packer.phi.entity_form`),
  likely one patient exported by two systems, each split as its own entity. Each finding lists
  the entities (pseudonyms under PHI) with their splits and a sample key, and whether they
  cross splits. Never merged (only the data's owner can tell), and recorded in the manifest only
  where found, like ``label_conflicts``.
- ``split_balance`` (fail; report with ``split.balance.accept``): the split is not what was
  asked: a group of several entities joined by duplicate links holds more than
  ``balance.max_group_share`` of the samples, or a split's share misses its ratio by more than
  the tolerance and than chance explains (:func:`packer.pipeline.split.measure_balance`). The finding
  names the largest group and the links that formed it, with their evidence.

A given split (``by: list`` or ``column``, a dataset's official split) is audited sample by
sample as given: every entity, exact copy and verified near copy that crosses it is found with
the severities above, and ``split.accept_leaks: true`` makes the three crossing rules report
instead of fail (their detail says ``accepted``). ``split_balance`` only reports there: nothing
was asked of the split's shares.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packer.config import SPLITS, SplitConfig
from packer.errors import LeakageError
from packer.files import atomic_output
from packer.pipeline.conflicts import LabelConflicts
from packer.pipeline.dedup import components_of, exact_groups, exact_groups_of
from packer.pipeline.listings import LEAKAGE_FILE
from packer.pipeline.nearcopy import NearLinks
from packer.pipeline.sampletable import SampleTable, as_table
from packer.pipeline.split import Assignment, HeldFiles, measure_balance, split_codes
from packer.progress import stage_progress
from packer.records import SpilledSample

#: Findings listed per rule in leakage.json; the count is always complete.
MAX_LISTED = 200


@dataclass(frozen=True)
class RuleResult:
    rule: str
    severity: str  # "fail" or "report"
    count: int
    findings: tuple[dict[str, Any], ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)
    #: whether the manifest records the rule when it found nothing (a rule added later does not,
    #: so every dataset it finds nothing in keeps its manifest and version)
    recorded_clean: bool = True

    @property
    def passed(self) -> bool:
        return self.count == 0

    @property
    def failed(self) -> bool:
        return self.severity == "fail" and self.count > 0

    def to_json(self, *, listed: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"severity": self.severity, "count": self.count, "passed": self.passed, **self.detail}
        if listed:
            out["findings"] = list(self.findings[:MAX_LISTED])
        return out


@dataclass(frozen=True)
class LeakageAudit:
    rules: tuple[RuleResult, ...]
    entities_per_split: dict[str, int]
    time_ranges: dict[str, tuple[str, str]]

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.rules)

    def rule(self, name: str) -> RuleResult:
        return next(r for r in self.rules if r.rule == name)

    def to_json(self, *, listed: bool = True) -> dict[str, Any]:
        return {
            "passed": not self.failed,
            "entities_per_split": dict(sorted(self.entities_per_split.items())),
            "time_ranges": {s: list(r) for s, r in sorted(self.time_ranges.items())},
            "rules": {r.rule: r.to_json(listed=listed) for r in self.rules
                      if listed or r.count or r.recorded_clean},
        }


@dataclass(frozen=True)
class _Samples:
    """What the rules read of the samples, without a Python object per record: the table, each
    row's split and entity as integer codes, and the exact-duplicate groups (computed once). A
    finding reads its few samples' fields from the table as it names them. At 10M records the
    lists of whole columns the rules read before held ~5.6 GB."""

    table: SampleTable
    #: per row, the index of its split in :data:`SPLITS`, or -1 (left out of every split)
    split_codes: np.ndarray
    #: per row, the code of its entity in ``entities`` (whose values may include None)
    entity_codes: np.ndarray
    entities: tuple[str | None, ...]
    show_paths: bool
    exact: list[list[int]]
    #: per row, its time as the split compared it (:meth:`~packer.pipeline.split.HeldFiles.timed`:
    #: a neighbour stack's or a volume's latest file's), as a ``pyarrow`` string array
    times: Any = None

    @classmethod
    def of(cls, samples: Sequence[SpilledSample], split: Mapping[str, str], show_paths: bool,
           held: HeldFiles | None = None) -> _Samples:
        table = as_table(samples)
        entity_codes, entities = table.codes("entity")
        times = table.arrow("time") if held is None or not held.latest else pa.array(held.timed(table), pa.string())
        return cls(table=table, split_codes=split_codes(table, split), entity_codes=entity_codes,
                   entities=entities, show_paths=show_paths, exact=exact_groups_of(table), times=times)

    def __len__(self) -> int:
        return len(self.table)

    def split(self, i: int) -> str | None:
        code = int(self.split_codes[i])
        return SPLITS[code] if code >= 0 else None

    def entity(self, i: int) -> str | None:
        return self.entities[int(self.entity_codes[i])]

    def value(self, name: str, i: int) -> Any:
        """Field ``name`` of row ``i``."""
        return self.table.value(name, i)

    def where(self, i: int) -> dict[str, Any]:
        where = {"key": self.value("key", i), "source": self.value("source", i), "entity_id": self.entity(i),
                 "split": self.split(i)}
        if self.show_paths:
            where["path"] = self.value("relpath", i)
        return where

    def placed_pairs(self) -> np.ndarray:
        """The distinct (entity code, split code) pairs of the rows in a split, as int64
        ``entity * 4 + split``, ascending."""
        placed = self.split_codes >= 0
        return np.unique(self.entity_codes[placed].astype(np.int64) * 4 + self.split_codes[placed])


def _entity_overlap(samples: _Samples, cfg: SplitConfig) -> RuleResult:
    splits_of: dict[str, list[str]] = defaultdict(list)
    for pair in samples.placed_pairs().tolist():
        entity = samples.entities[pair // 4]
        if entity is not None:
            splits_of[entity].append(SPLITS[pair % 4])
    findings = [{"entity_id": e, "splits": sorted(s, key=SPLITS.index)}
                for e, s in sorted(splits_of.items()) if len(s) > 1]
    return RuleResult("entity_overlap", "report" if cfg.accept_leaks else "fail", len(findings), tuple(findings),
                      detail=_given(cfg))


def _given(cfg: SplitConfig) -> dict[str, Any]:
    """The crossing rules' detail under a given split (none otherwise, as before given splits)."""
    return {"given": cfg.by, "accepted": cfg.accept_leaks} if cfg.given else {}


def _exact(samples: _Samples, cfg: SplitConfig) -> list[RuleResult]:
    across: list[dict[str, Any]] = []
    within: list[dict[str, Any]] = []
    for group in samples.exact:
        placed = [i for i in group if samples.split_codes[i] >= 0]
        splits = {int(samples.split_codes[i]) for i in placed}
        finding = {"sha256": samples.value("sha256", placed[0] if placed else group[0]),
                   "samples": [samples.where(i) for i in placed]}
        if len(splits) > 1:
            across.append(finding)
        elif len(placed) > 1:
            within.append(finding)
    severity = "report" if cfg.duplicates == "report" or cfg.accept_leaks else "fail"
    return [RuleResult("exact_duplicates_across_splits", severity, len(across), tuple(across), detail=_given(cfg)),
            RuleResult("exact_duplicates_within_split", "report", len(within), tuple(within))]


def _near(samples: _Samples, cfg: SplitConfig, links: NearLinks) -> RuleResult:
    split = samples.split_codes
    crossing = [{"a": samples.where(i), "b": samples.where(j), **links.describe(k)}
                for k, (i, j) in enumerate(zip(links.i.tolist(), links.j.tolist(), strict=True))
                if split[i] >= 0 and split[j] >= 0 and split[i] != split[j]
                and samples.value("sha256", i) != samples.value("sha256", j)]
    severity = "report" if cfg.duplicates == "report" or not cfg.near_enabled or cfg.accept_leaks else "fail"
    count = len(crossing)
    # max_cross_split pairs are tolerated: the rule fails only beyond them
    effective = count if count > cfg.near_max_cross_split else 0
    return RuleResult("near_duplicates_across_splits", severity, effective, tuple(crossing),
                      detail={"pairs": count, "tolerated": cfg.near_max_cross_split, "enabled": cfg.near_enabled,
                              "links": len(links), "candidates_verified": links.candidates,
                              "min_score": cfg.near_min_score, "neighbors": cfg.near_neighbors,
                              **({} if cfg.near_enabled else {"off": _near_off(cfg)}),
                              # as in the config's identity: named where the job sets it (default 0.5)
                              **({"max_ratio": cfg.near_max_ratio} if cfg.near_max_ratio_set else {}),
                              **_given(cfg)})


def _near_off(cfg: SplitConfig) -> str:
    """Why the near-copy check did not run (for the rule's detail and the HTML report)."""
    if cfg.near_auto:
        return ("one split: no copy can leak across splits, so near copies were not searched (enabled: auto); "
                "set split.near_duplicates.enabled: true for the duplicates_span_entities evidence")
    return f"split.near_duplicates.enabled: false, or {QUICK_OFF}"


#: How the near-copy rule's detail names a headers-only check (the manifest records it as the
#: command's; ``packer.validate``'s report names the call's option, :func:`~packer.pipeline.datacheck.summary`)
QUICK_OFF = "packer validate --quick (headers only)"


#: Near links listed with their evidence per group of duplicates that spans entities (the weakest first).
MAX_EVIDENCE = 50


def _span_entities(samples: _Samples, links: NearLinks) -> RuleResult:
    exact = ((g[k], g[k + 1]) for g in samples.exact for k in range(len(g) - 1))
    roots = components_of(itertools.chain(exact, zip(links.i.tolist(), links.j.tolist(), strict=True)))
    clusters: dict[int, list[int]] = defaultdict(list)  # only rows some link names: the others are alone
    for index in sorted(roots):
        clusters[roots[index]].append(index)
    # each near link between two entities, with its evidence, under the cluster it joins
    evidence: dict[int, list[dict[str, Any]]] = defaultdict(list)
    entity = samples.entity_codes
    for k, (i, j) in enumerate(zip(links.i.tolist(), links.j.tolist(), strict=True)):
        if entity[i] != entity[j]:
            if samples.split_codes[i] >= 0 and samples.split_codes[j] >= 0:
                evidence[roots[i]].append({"a": samples.where(i), "b": samples.where(j), **links.describe(k)})
    findings: list[dict[str, Any]] = []
    for root, linked in sorted(clusters.items()):
        # of the final assignment: a copy left out (drop_straddlers, drop_group) is in no split and packed nowhere
        members = [i for i in linked if samples.split_codes[i] >= 0]
        entities = sorted({samples.entity(i) or "" for i in members})
        if len(members) > 1 and len(entities) > 1:
            near = sorted(evidence.get(root, []), key=lambda link: float(link["score"]))  # the weakest first
            findings.append({"entities": entities, "size": len(members),
                             "samples": [samples.where(i) for i in members[:20]],
                             "near_links": len(near), "evidence": near[:MAX_EVIDENCE]})
    findings.sort(key=lambda f: f["entities"])
    return RuleResult("duplicates_span_entities", "report", len(findings), tuple(findings))


#: Members listed per conflicting group (the size is always complete).
MAX_MEMBERS = 20
#: The links a ``split_balance`` finding lists (``formed_by``); it counts them all, by kind.
MAX_FORMED = 20


def _label_conflicts(samples: _Samples, found: LabelConflicts, cfg: SplitConfig) -> RuleResult:
    """``label_conflicts``: one finding per conflicting duplicate group, its members (by key,
    entity pseudonym and split, as every finding) each with its target text."""
    findings = []
    for group in found.groups:
        finding: dict[str, Any] = {
            "size": len(group.members), "linked_by": group.linked_by, "targets_differ": group.targets,
            "labels": sorted({samples.value("label", i) or "" for i in group.members}),
            "samples": [{**samples.where(i), "label": samples.value("label", i)} for i in group.members[:MAX_MEMBERS]]}
        if group.dice is not None:
            finding["mask_dice"] = round(group.dice, 4)
        if found.dropped:
            finding["dropped"] = True
        findings.append(finding)
    detail: dict[str, Any] = {"policy": cfg.label_conflict, "tolerance": cfg.label_tolerance,
                              "mask_dice": cfg.mask_dice, "dropped": len(found.dropped)}
    if found.masks_compared is not None:
        detail["masks_compared"] = found.masks_compared
    if not cfg.near_enabled:  # exact copies only: the rule passed for them, not for near copies
        detail["near_copies_compared"] = False
        detail["near_copies"] = (
            "one split: near copies were not searched (split.near_duplicates.enabled: auto), so only exact copies' "
            "targets were compared; enabled: true, or label_conflict: fail | drop_group, compares near copies' too"
            if cfg.near_auto else f"not compared: {_near_off(cfg)}")
    return RuleResult("label_conflicts", "fail" if cfg.label_conflict == "fail" else "report", len(findings),
                      tuple(findings), detail, recorded_clean=False)


def _entity_lookalikes(samples: _Samples, groups: Sequence[Sequence[str]]) -> RuleResult:
    """``entity_lookalikes``: one finding per group of entity ids whose raw ids differ only in
    case, spacing or leading zeros (found while the raw ids were at hand, :class:`_Settle`),
    each entity with the splits it went to and its first sample (by key: ``packer locate`` maps
    it to its file)."""
    wanted = {entity for group in groups for entity in group}
    codes, rows = np.unique(samples.entity_codes, return_index=True)  # each entity's first row
    first = {samples.entities[c]: r for c, r in zip(codes.tolist(), rows.tolist(), strict=True)
             if samples.entities[c] in wanted}
    splits_of: dict[str, set[str]] = defaultdict(set)
    for pair in samples.placed_pairs().tolist():
        entity = samples.entities[pair // 4]
        if entity in first:
            splits_of[entity].add(SPLITS[pair % 4])
    findings = []
    for group in groups:
        present = [entity for entity in group if entity in first]
        if len(present) < 2:
            continue
        entities = [{**{k: v for k, v in samples.where(first[e]).items() if k != "split"},
                     "splits": sorted(splits_of[e], key=SPLITS.index)} for e in present]
        findings.append({"entities": entities,
                         "across_splits": len({s for e in present for s in splits_of[e]}) > 1})
    return RuleResult("entity_lookalikes", "report", len(findings), tuple(findings), recorded_clean=False)


#: What else keeps a lookalike group in one split, by ``split.by`` (a time split refuses a pin its dates
#: contradict, and a lookalike pair across its splits has records in two periods; a given split takes no pin)
LOOKALIKE_OTHER_FIX = {
    "entity": " (or pin each group to one split with split.pinned)",
    "time": " (a pin cannot hold them together here: under a time split the two ids' records fall in two "
            "periods, and a pin against the dates is refused)",
    "list": " (or list every file of the group in one split's list)",
    "column": " (or give every row of the group one split in the table's split column)",
}


def lookalikes_warning(report: LeakageAudit, listed_in: str = "leakage.json", split_by: str = "entity") -> str | None:
    """A warning naming the entity ids that differ only in case, spacing or leading zeros
    (pseudonyms and sample keys under PHI), or None when there are none. ``listed_in``: where the
    findings are written (leakage.json, or packer validate's --json report); ``split_by``: the job's
    ``split.by``, which decides what else it offers (:data:`LOOKALIKE_OTHER_FIX`)."""
    rule = report.rule("entity_lookalikes")
    if not rule.count:
        return None
    crossing = [f for f in rule.findings if f["across_splits"]]
    shown = (crossing or list(rule.findings))[0]["entities"]
    example = " and ".join(f"{e['entity_id']} [{'+'.join(e['splits']) or 'no split'}] ({_name(e)})"
                           for e in shown[:3])
    return (f"{rule.count} group(s) of entity ids differ only in case, spacing or leading zeros, {len(crossing)} "
            f"of them across splits, e.g. {example}: likely one patient under two ids (two systems' exports), "
            "split as two entities, so the same patient can be in train and in test. Make the ids agree at the "
            f"source{LOOKALIKE_OTHER_FIX.get(split_by, '')}; every group is listed under "
            f"entity_lookalikes in {listed_in}")


def _time_order_findings(samples: _Samples, ranges: Mapping[str, tuple[str, str]], cutoffs: Mapping[str, str],
                         earlier: str, later_splits: Sequence[str], show_dates: bool) -> list[dict[str, Any]]:
    """``time_order``'s findings for one split against each split after it: one per later split
    whose period ``earlier`` holds records in, naming them (an entity's later studies, kept where
    its first record fell by ``entity_policy: first_seen``; by key and entity, as every finding).
    A later split's period starts at its cutoff (``cutoffs``), or at its earliest record where
    that comes first (a pinned entity), so a record past the cutoff is named whether or not the
    later split holds anything before it, and under the same date ``drop_straddlers`` would drop
    it by. A train finding keeps the fields it always had (``train_samples_after``,
    ``train_samples``, ``latest_train``); a valid one says ``from: valid`` and has
    ``valid_samples_after``, ``valid_samples``, ``latest_valid``; both give ``starts`` (and,
    where it holds records, the later split's ``earliest``)."""
    latest = ranges[earlier][1]
    times = samples.times
    held = _timed(samples, earlier)
    findings: list[dict[str, Any]] = []
    for later in later_splits:
        starts = min(t for t in (cutoffs.get(later), ranges.get(later, (None,))[0]) if t is not None)
        if starts > latest:
            continue
        # UTF-8 byte order is code point order, as str comparison
        from_then = pc.fill_null(pc.greater_equal(times, pa.scalar(starts)), False)
        rows = np.flatnonzero(held & from_then.to_numpy(zero_copy_only=False)).tolist()
        after = sorted(rows, key=lambda i: (times[i].as_py() or "", samples.value("key", i)), reverse=True)
        finding: dict[str, Any] = {} if earlier == "train" else {"from": earlier}
        finding.update({
            "split": later, f"{earlier}_samples_after": len(after),
            f"{earlier}_samples": [samples.where(i) for i in after[:MAX_MEMBERS]],
            "fix": f"these {earlier} records fall in {later}'s period (from its cutoff on; each entity is split "
                   "whole, with the entities whose images its images duplicate, where the first record of that "
                   "group falls: an entity whose own first record is later was pulled back by a copy, see "
                   "duplicates_span_entities): split.entity_policy: drop_straddlers drops them instead"})
        if show_dates:
            finding.update({"starts": starts, f"latest_{earlier}": latest})
            if later in ranges:
                finding["earliest"] = ranges[later][0]
        elif starts == cutoffs.get(later):  # the job's own cutoff, which its config shows: no record's date
            finding["starts"] = starts
        findings.append(finding)
    return findings


def _timed(samples: _Samples, split: str) -> np.ndarray:
    """Per row, whether it is in ``split`` and has a time."""
    return (samples.split_codes == SPLITS.index(split)) & ~samples.table.field_text("time").null


def _time_order(samples: _Samples, cfg: SplitConfig, show_dates: bool) -> tuple[RuleResult, dict[str, tuple[str, str]]]:
    ranges: dict[str, tuple[str, str]] = {}
    if not samples.table.field_text("time").null.all():
        times = samples.times
        for split in SPLITS:
            held = _timed(samples, split)
            if held.any():
                low_high = pc.min_max(times.filter(pa.array(held)))
                ranges[split] = (low_high["min"].as_py(), low_high["max"].as_py())
    findings = []
    if cfg.by == "time":
        cutoffs = dict(cfg.cutoffs)
        # a later split is checked against even when it holds nothing: its cutoff starts its period
        order = [split for split in ("train", "valid", "test") if split in ranges or split in cutoffs]
        for e, earlier in enumerate(order):
            if earlier in ranges:
                findings.extend(_time_order_findings(samples, ranges, cutoffs, earlier, order[e + 1:], show_dates))
    return RuleResult("time_order", "report", len(findings), tuple(findings),
                      detail={"checked": cfg.by == "time"}), ranges


def _balance(samples: _Samples, assignment: Assignment, cfg: SplitConfig, links: NearLinks) -> RuleResult:
    """``split_balance``: one finding when the split collapsed (see the module docstring)."""
    balance = measure_balance(assignment, cfg)
    if cfg.given:  # nothing was asked of the shares: they are reported, as given
        return RuleResult("split_balance", "report", 0, (), {
            "shares": {k: round(v, 4) for k, v in balance.shares.items()}, "given": cfg.by})
    asked: dict[str, Any] = ({"cutoffs": dict(cfg.cutoffs)} if cfg.by == "time"  # the dates decide, not ratios
                             else {"requested": balance.requested})
    detail: dict[str, Any] = {"shares": {k: round(v, 4) for k, v in balance.shares.items()},
                              **asked, **({"tolerance": cfg.balance_tolerance} if cfg.holds_ratios else {}),
                              "max_group_share": cfg.max_group_share, "accepted": cfg.accept_imbalance,
                              "largest_group_share": round(balance.largest_share, 4)}
    severity = "report" if cfg.accept_imbalance or cfg.given else "fail"
    if balance.collapsed is None or balance.largest is None:
        return RuleResult("split_balance", severity, 0, (), detail)
    group = balance.largest
    members = set(group.members)
    entity_of = samples.entity_codes
    exact: list[dict[str, Any]] = []  # the links that joined its entities: exact copies, then near ones
    copy_of: dict[int, int] = {}  # a member's exact-copy group, where it has one
    for c, found in enumerate(exact_groups([samples.value("sha256", i) for i in group.members],
                                           [samples.value("stored_digest", i) for i in group.members],
                                           [samples.value("blank", i) for i in group.members])):
        copies = [group.members[k] for k in found]
        copy_of.update((i, c) for i in copies)
        first_of: dict[int, int] = {}  # each entity's first copy: one link joins it to the first entity's
        for i in copies:
            first_of.setdefault(int(entity_of[i]), i)
        anchor, *joined = first_of.values()
        exact.extend({"a": samples.where(anchor), "b": samples.where(other), "kind": "exact"} for other in joined)
    near: list[dict[str, Any]] = []
    for k, (i, j) in enumerate(zip(links.i.tolist(), links.j.tolist(), strict=True)):
        # two exact copies that the near-copy search also paired (score 1.00) are the exact copy already
        # listed: counted as near, they made the fix read "raise min_score", which cannot part them
        if (i in members and j in members and entity_of[i] != entity_of[j]
                and (i not in copy_of or copy_of[i] != copy_of.get(j))):
            near.append({"a": samples.where(i), "b": samples.where(j), "kind": "near", **links.describe(k)})
    near.sort(key=lambda f: float(f["score"]))  # the weakest first: the ones a higher min_score drops
    # both kinds listed where both joined it, so leakage.json shows what each fix must move
    shown = near[:MAX_FORMED - min(len(exact), MAX_FORMED // 4)]
    formed = shown + exact[:MAX_FORMED - len(shown)]
    named = ", ".join(group.entities[:3]) + (", ..." if len(group.entities) > 3 else "")
    why = (f"one split group holds {group.size:,} samples ({balance.largest_share:.0%}, over "
           f"split.balance.max_group_share {cfg.max_group_share:.0%}) of {len(group.entities):,} entities ({named})"
           if balance.collapsed == "group" else
           f"split {balance.worst} holds {balance.shares[balance.worst]:.1%} of the samples against the requested "
           f"{balance.requested[balance.worst]:.0%} (allowed: {balance.allowed:.1%}); the largest split group holds "
           f"{group.size:,} samples ({balance.largest_share:.0%}) of {len(group.entities):,} entities "
           f"({named})")
    finding = {"reason": balance.collapsed, "summary": why, "group_size": group.size,
               "group_share": round(balance.largest_share, 4), "entities": len(group.entities),
               "entity_ids": list(group.entities[:20]), "links": len(near) + len(exact),
               "near_links": len(near), "exact_links": len(exact), "formed_by": formed}
    return RuleResult("split_balance", severity, 1, (finding,), detail)


#: The rules :func:`audit_assignment` runs, in the order leakage.json lists them (``_exact`` gives two).
RULES = 9


def audit_assignment(samples: Sequence[SpilledSample], assignment: Assignment, cfg: SplitConfig,
                     links: NearLinks | None = None, *, show_paths: bool = True,
                     show_dates: bool = True, conflicts: LabelConflicts | None = None,
                     lookalikes: Sequence[Sequence[str]] = (), quiet: bool = False,
                     held: HeldFiles | None = None) -> LeakageAudit:
    """Run every rule on the final assignment (recomputed from the samples, not trusted).

    ``show_paths``/``show_dates`` False (PHI pseudonymization) keep raw relative paths and
    calendar dates out of the findings; samples are then named by key and entity pseudonym.
    ``conflicts``: the label conflicts found before the split (:mod:`packer.pipeline.conflicts`;
    None: none). ``lookalikes``: the groups of entity ids whose raw ids differ only in case,
    spacing or leading zeros (:func:`packer.pipeline.pixels.process_all`). A long audit shows an
    ``audit`` progress line (rules run, of :data:`RULES`) unless ``quiet``. ``held``: what the
    samples hold of other files (:class:`~packer.pipeline.split.HeldFiles`): ``time_order``
    compares a neighbour stack or a volume by its latest file's time, as the split places it.
    """
    with stage_progress("audit", RULES, unit="rules", quiet=quiet) as progress:
        def counted(found: list[RuleResult]) -> list[RuleResult]:
            progress.update(len(found))
            return found

        fields = _Samples.of(samples, assignment.split, show_paths, held)
        links = links if links is not None else NearLinks.empty()
        time_rule, ranges = _time_order(fields, cfg, show_dates)
        progress.update()
        # each rule counted as it finishes (a list display runs its items in order), listed in leakage.json's order
        rules = [*counted([_entity_overlap(fields, cfg)]), *counted(_exact(fields, cfg)),
                 *counted([_near(fields, cfg, links)]), *counted([_span_entities(fields, links)]),
                 *counted([_label_conflicts(fields, conflicts or LabelConflicts(), cfg)]),
                 *counted([_entity_lookalikes(fields, lookalikes)]), time_rule,
                 *counted([_balance(fields, assignment, cfg, links)])]
    entities: dict[str, set[str]] = defaultdict(set)
    for pair in fields.placed_pairs().tolist():
        entities[SPLITS[pair % 4]].add(fields.entities[pair // 4] or "")
    return LeakageAudit(rules=tuple(rules), entities_per_split={s: len(e) for s, e in entities.items()},
                       time_ranges=ranges if show_dates else {})


#: The rules that find a sample crossing the splits (what ``split.accept_leaks`` accepts).
CROSSING = ("entity_overlap", "exact_duplicates_across_splits", "near_duplicates_across_splits")


def accepted_leaks(report: LeakageAudit, cfg: SplitConfig, listed_in: str = "leakage.json") -> str | None:
    """A warning for a given split whose leaks ``split.accept_leaks`` accepted, or None: what
    crossed the splits, by rule, and where it is listed."""
    if not cfg.accept_leaks:
        return None
    found = [(rule.rule, rule.detail.get("pairs", rule.count)) for rule in report.rules if rule.rule in CROSSING]
    found = [(name, count) for name, count in found if count]
    if not found:
        return None
    return (f"the given split (by: {cfg.by}) leaks, accepted by split.accept_leaks: "
            + ", ".join(f"{name} {count}" for name, count in found) + f" (each finding is listed in {listed_in})")



def write_leakage(folder: Path, report: LeakageAudit) -> Path:
    """Write ``leakage.json``: every rule with its count and (up to MAX_LISTED) findings.

    It names raw relative paths, like the bad-sample report: keep it with the build.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LEAKAGE_FILE
    with atomic_output(path) as fh:
        fh.write(json.dumps(report.to_json(), indent=2, sort_keys=True).encode() + b"\n")
    return path


def raise_on_leakage(report: LeakageAudit, listed_in: Path | str = LEAKAGE_FILE) -> None:
    """Fail the build naming what leaked (exit 4) and ``listed_in``, the written leakage.json."""
    failed = [r for r in report.rules if r.failed]
    if not failed:
        return
    parts = []
    for rule in failed:
        examples = []
        for finding in rule.findings[:5]:
            examples.append(finding_text(rule.rule, finding, members=3 if rule.rule == "label_conflicts" else 2)
                            + (_balance_fix(finding) if "summary" in finding else ""))
        parts.append(f"{rule.rule}: {rule.count} finding(s), e.g. {'; '.join(examples)}")
    given = any(r.detail.get("given") for r in failed if r.rule in CROSSING)
    conflicting = any(r.rule == "label_conflicts" for r in failed)
    raise LeakageError("leakage audit failed: " + " | ".join(parts)
                       + f" (every finding is listed in {listed_in})"
                       + ("; label_conflicts: copies of one image carry different targets (label noise, or two "
                          "patients mixed up): fix the labels, or set split.duplicates.label_conflict: drop_group to "
                          "leave those groups out, or warn to build with them" if conflicting else "")
                       + ("; the split is given (an official split reproduced exactly): to build it as it is, "
                          "leaks and all, set split.accept_leaks: true" if given else ""))


def _balance_fix(finding: dict[str, Any]) -> str:
    """What to change for a collapsed split, by the links that formed its largest group: the
    near-copy settings move near links only; exact copies (the same bytes or stored pixels) join
    their entities whatever those settings say. Decided by the counts of every link, not by the
    listed ones: a long list of near links can crowd the exact copies out of ``formed_by``."""
    kinds = {kind for kind, count in _link_counts(finding).items() if count}
    near = "raise split.near_duplicates.min_score (or lower max_ratio), review the links"
    exact = ("remove the exact copies shared by several entities (the same file, or the same stored pixels, filed "
             "under each: a shared template, phantom or placeholder image), or, where they are not patient data, "
             "leave them out with where:")
    if not kinds:  # no link formed the group: near-copy settings cannot move it, the draw can
        return ("; no duplicate link formed the largest group, so the share follows where each entity's "
                "seeded hash put it (an unlucky draw among few or unequal entities): try another split.seed, "
                "or accept the split with split.balance.accept: true")
    said = near if kinds == {"near"} else exact if kinds == {"exact"} else f"{near}; {exact}"
    return f"; {said}, or accept the split with split.balance.accept: true"


def finding_text(rule: str, finding: dict[str, Any], *, members: int = 3, where: bool = False) -> str:
    """One finding of ``rule`` as a line of text (the build's leakage error, validate's summary):
    the samples by path (key under pseudonymization) with what the rule is about (a label
    conflict's targets, a leak's splits, a link's evidence), at most ``members`` of a group's;
    ``where``: a label conflict's members with their split and entity too, and how they are linked."""
    if "summary" in finding:
        counts = _link_counts(finding)
        formed = finding["formed_by"]
        near = [link for link in formed if link.get("kind") != "exact"]
        exact = [link for link in formed if link.get("kind") == "exact"]
        # an example of each kind that joined the group: its fix depends on which did
        examples = near[:2] + exact[:1] if near and exact else formed[:3]
        links = "; ".join(f"{_name(link['a'])} ~ {_name(link['b'])} ({_evidence(link)})" for link in examples)
        kinds = (f" ({counts['exact']:,} exact copies, {counts['near']:,} near links)"
                 if counts["exact"] and counts["near"] else " (exact copies)" if counts["exact"]
                 else " (near links)" if counts["near"] else "")
        return (f"{finding['summary']}, joined by {finding['links']} duplicate link(s){kinds}"
                + (f", e.g. {links}" if links else ""))
    if rule == "label_conflicts":
        shown = finding["samples"][:members]
        more = len(finding["samples"]) - len(shown)
        placed = (lambda s: f" ({s['split'] or 'left out'}, entity {s['entity_id']})") if where else (lambda s: "")
        return ((f"{finding['linked_by']} copies: " if where else "")
                + " = ".join(f"{_name(s)} [{s['label']}]{placed(s)}" for s in shown)
                + (f" and {more} more" if more > 0 and where else "")
                + (f" (mask Dice {finding['mask_dice']:.2f})" if "mask_dice" in finding else ""))
    if "entity_id" in finding and "splits" in finding:
        return f"{finding['entity_id']} ({'+'.join(finding['splits'])})"
    if "samples" in finding:  # a copy group: one member of each split first, so the example shows the crossing
        samples = finding["samples"]
        first_of: dict[str, int] = {}
        for i, s in enumerate(samples):
            first_of.setdefault(s["split"], i)
        leading = set(first_of.values())
        order = sorted(range(len(samples)), key=lambda i: (i not in leading, i))
        shown = [samples[i] for i in order[:members]]
        more = len(samples) - len(shown)
        return " = ".join(f"{_name(s)} [{s['split']}]" for s in shown) + (f" and {more} more" if more > 0 else "")
    if "entities" in finding:  # entity ids that differ only in spelling
        return " ~ ".join(f"{e['entity_id']!r} [{'+'.join(e['splits']) or 'no split'}] ({_name(e)})"
                          for e in finding["entities"][:members])
    if "a" in finding and "b" in finding:
        return (f"{_name(finding['a'])} [{finding['a']['split']}] ~ {_name(finding['b'])} "
                f"[{finding['b']['split']}] ({_evidence(finding)})")
    return json.dumps(finding, sort_keys=True, ensure_ascii=False)  # a report rule's own record, whole


def _link_counts(finding: dict[str, Any]) -> dict[str, int]:
    """A ``split_balance`` finding's links by kind (``near``, ``exact``), all of them, not only the
    listed ones (a finding without the counts: its listed links)."""
    listed = finding.get("formed_by", ())
    return {kind: int(finding.get(f"{kind}_links", sum(link.get("kind") == kind for link in listed)))
            for kind in ("near", "exact")}


def _evidence(link: dict[str, Any]) -> str:
    """A link's evidence in a message: its verification score and parts, or "identical pixels"."""
    if "score" not in link:
        return "identical pixels"
    return (f"score {link['score']:.2f}: detail {link['detail']:.2f}, intensity {link['intensity']:.2f}, "
            f"zoom {link['zoom']:.2f}, shift {link['shift']}")


def _name(where: dict[str, Any]) -> str:
    """How a finding names a sample: its raw relative path, or its key under pseudonymization."""
    return str(where.get("path") or f"{where['source']}:{where['key']}")
