"""Audit: check a split assignment for leakage from scratch, rule by rule.

Each rule yields a :class:`RuleResult` with its findings. ``fail`` rules stop the build
(exit 4) when they find anything; ``report`` rules are written to ``leakage.json`` and the
manifest but do not fail. The rules:

- ``entity_overlap`` (fail): an entity with samples in two splits.
- ``exact_duplicates_across_splits`` (fail; report with ``duplicates: report``): the same
  packed pixels in two splits.
- ``near_duplicates_across_splits`` (fail above ``near_duplicates.max_cross_split``; report
  with ``duplicates: report``): linked dHashes within the threshold in two splits.
- ``exact_duplicates_within_split`` (report): the same pixels twice in one split.
- ``duplicates_span_entities`` (report): a duplicate cluster holding several entities, a
  likely identity error (one patient under two ids, or a mislabelled copy).
- ``time_order`` (report, time splits): the latest train time precedes the earliest
  valid/test time.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.config import SPLITS, SplitConfig
from packer.dedup import exact_groups
from packer.errors import LeakageError
from packer.pack.writer import atomic_output
from packer.process import SpilledSample
from packer.split import Assignment

#: Findings listed per rule in leakage.json; the count is always complete.
MAX_LISTED = 200


@dataclass(frozen=True)
class RuleResult:
    rule: str
    severity: str  # "fail" or "report"
    count: int
    findings: tuple[dict[str, Any], ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

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
class AuditReport:
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
            "rules": {r.rule: r.to_json(listed=listed) for r in self.rules},
        }


def _where(sample: SpilledSample, split: str | None, show_paths: bool = True) -> dict[str, Any]:
    where = {"key": sample.key, "source": sample.ref.source, "entity_id": sample.ref.entity, "split": split}
    if show_paths:
        where["path"] = sample.ref.relpath
    return where


def _entity_overlap(samples: Sequence[SpilledSample], split: dict[str, str]) -> RuleResult:
    splits_of: dict[str, set[str]] = defaultdict(set)
    for sample in samples:
        if sample.key in split and sample.ref.entity is not None:
            splits_of[sample.ref.entity].add(split[sample.key])
    findings = [{"entity_id": e, "splits": sorted(s, key=SPLITS.index)}
                for e, s in sorted(splits_of.items()) if len(s) > 1]
    return RuleResult("entity_overlap", "fail", len(findings), tuple(findings))


def _exact(samples: Sequence[SpilledSample], split: dict[str, str], cfg: SplitConfig,
           show_paths: bool) -> list[RuleResult]:
    across: list[dict[str, Any]] = []
    within: list[dict[str, Any]] = []
    for group in exact_groups([s.sha256 for s in samples]):
        placed = [samples[i] for i in group if samples[i].key in split]
        splits = {split[s.key] for s in placed}
        finding = {"sha256": placed[0].sha256 if placed else samples[group[0]].sha256,
                   "samples": [_where(s, split.get(s.key), show_paths) for s in placed]}
        if len(splits) > 1:
            across.append(finding)
        elif len(placed) > 1:
            within.append(finding)
    severity = "report" if cfg.duplicates == "report" else "fail"
    return [RuleResult("exact_duplicates_across_splits", severity, len(across), tuple(across)),
            RuleResult("exact_duplicates_within_split", "report", len(within), tuple(within))]


def _near(samples: Sequence[SpilledSample], split: dict[str, str], cfg: SplitConfig,
          edges: Sequence[tuple[int, int, int]], show_paths: bool) -> RuleResult:
    crossing = [{"a": _where(samples[i], split[samples[i].key], show_paths),
                 "b": _where(samples[j], split[samples[j].key], show_paths),
                 "distance": d}
                for i, j, d in edges
                if samples[i].key in split and samples[j].key in split
                and split[samples[i].key] != split[samples[j].key] and samples[i].sha256 != samples[j].sha256]
    severity = "report" if cfg.duplicates == "report" or not cfg.near_enabled else "fail"
    count = len(crossing)
    # max_cross_split pairs are tolerated: the rule fails only beyond them
    effective = count if count > cfg.near_max_cross_split else 0
    return RuleResult("near_duplicates_across_splits", severity, effective, tuple(crossing),
                      detail={"pairs": count, "threshold": cfg.near_threshold, "tolerated": cfg.near_max_cross_split,
                              "enabled": cfg.near_enabled})


def _span_entities(samples: Sequence[SpilledSample], split: dict[str, str],
                   edges: Sequence[tuple[int, int, int]], show_paths: bool) -> RuleResult:
    from packer.dedup import cluster_duplicates

    exact = ((g[k], g[k + 1]) for g in exact_groups([s.sha256 for s in samples]) for k in range(len(g) - 1))
    links = itertools.chain(exact, edges)  # streamed: near edges can number in the millions
    clusters: dict[int, list[int]] = defaultdict(list)
    for index, root in enumerate(cluster_duplicates(len(samples), links)):
        clusters[root].append(index)
    findings: list[dict[str, Any]] = []
    for members in clusters.values():
        entities = sorted({samples[i].ref.entity or "" for i in members})
        if len(members) > 1 and len(entities) > 1:
            findings.append({"entities": entities, "size": len(members),
                             "samples": [_where(samples[i], split.get(samples[i].key), show_paths)
                                         for i in members[:20]]})
    findings.sort(key=lambda f: f["entities"])
    return RuleResult("duplicates_span_entities", "report", len(findings), tuple(findings))


def _time_order(samples: Sequence[SpilledSample], split: dict[str, str], cfg: SplitConfig,
                show_dates: bool) -> tuple[RuleResult, dict[str, tuple[str, str]]]:
    times: dict[str, list[str]] = defaultdict(list)
    for sample in samples:
        if sample.key in split and sample.ref.time is not None:
            times[split[sample.key]].append(sample.ref.time)
    ranges = {s: (min(t), max(t)) for s, t in times.items()}
    findings = []
    if cfg.by == "time" and "train" in ranges:
        train_max = ranges["train"][1]
        for later in ("valid", "test"):
            if later in ranges and ranges[later][0] <= train_max:
                finding: dict[str, Any] = {"split": later}
                if show_dates:
                    finding.update(earliest=ranges[later][0], latest_train=train_max)
                findings.append(finding)
    return RuleResult("time_order", "report", len(findings), tuple(findings),
                      detail={"checked": cfg.by == "time"}), ranges


def audit_assignment(samples: Sequence[SpilledSample], assignment: Assignment, cfg: SplitConfig,
                     edges: Sequence[tuple[int, int, int]] = (), *, show_paths: bool = True,
                     show_dates: bool = True) -> AuditReport:
    """Run every rule on the final assignment (recomputed from the samples, not trusted).

    ``show_paths``/``show_dates`` False (PHI pseudonymization) keep raw relative paths and
    calendar dates out of the findings; samples are then named by key and entity pseudonym.
    """
    split = assignment.split
    time_rule, ranges = _time_order(samples, split, cfg, show_dates)
    rules = [_entity_overlap(samples, split), *_exact(samples, split, cfg, show_paths),
             _near(samples, split, cfg, edges, show_paths), _span_entities(samples, split, edges, show_paths),
             time_rule]
    entities: dict[str, set[str]] = defaultdict(set)
    for sample in samples:
        if sample.key in split:
            entities[split[sample.key]].add(sample.ref.entity or "")
    return AuditReport(rules=tuple(rules), entities_per_split={s: len(e) for s, e in entities.items()},
                       time_ranges=ranges if show_dates else {})


LEAKAGE_FILE = "leakage.json"


def write_leakage(folder: Path, report: AuditReport) -> Path:
    """Write ``leakage.json``: every rule with its count and (up to MAX_LISTED) findings.

    It names raw relative paths, like the bad-sample report: keep it with the build.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LEAKAGE_FILE
    with atomic_output(path) as fh:
        fh.write(json.dumps(report.to_json(), indent=2, sort_keys=True).encode() + b"\n")
    return path


def raise_on_leakage(report: AuditReport) -> None:
    """Fail the build naming what leaked (exit 4)."""
    failed = [r for r in report.rules if r.failed]
    if not failed:
        return
    parts = []
    for rule in failed:
        examples = []
        for finding in rule.findings[:5]:
            if "entity_id" in finding:
                examples.append(f"{finding['entity_id']} ({'+'.join(finding['splits'])})")
            elif "samples" in finding:
                examples.append(" = ".join(f"{_name(s)} [{s['split']}]" for s in finding["samples"][:2]))
            else:
                examples.append(f"{_name(finding['a'])} [{finding['a']['split']}] ~ "
                                f"{_name(finding['b'])} [{finding['b']['split']}] (distance {finding['distance']})")
        parts.append(f"{rule.rule}: {rule.count} finding(s), e.g. {'; '.join(examples)}")
    raise LeakageError("leakage audit failed: " + " | ".join(parts)
                       + " (every finding is listed in leakage.json)")


def _name(where: dict[str, Any]) -> str:
    """How a finding names a sample: its raw relative path, or its key under pseudonymization."""
    return str(where.get("path") or f"{where['source']}:{where['key']}")
