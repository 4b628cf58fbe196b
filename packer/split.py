"""Split: assign every sample to train/valid/test by entity or by time, then audit the result.

By entity, a sample's split is a pure function of (seed, entity id, ratios): the entity id is
hashed to a number in [0, 1) and compared with the cumulative ratios. Input order never
matters and adding entities never moves an existing one. By time, each entity goes where
its first record falls relative to the cutoffs (``first_seen``), so an entity never
straddles two splits. The audit re-checks the final assignment independently.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packer.config import SPLITS, SplitConfig
from packer.errors import LeakageError
from packer.records import SampleRef


def entity_unit(entity: str, seed: int) -> float:
    """Map (seed, entity) to a uniform number in [0, 1) with sha256 (stable across machines)."""
    digest = hashlib.sha256(f"packer-split\x00{seed}\x00{entity}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_for_unit(unit: float, ratios: Iterable[tuple[str, float]]) -> str:
    """The split whose cumulative-ratio interval holds ``unit``."""
    cumulative = 0.0
    last = "train"
    for name, ratio in ratios:
        if ratio <= 0:
            continue
        cumulative += ratio
        last = name
        if unit < cumulative:
            return name
    return last


def split_for_time(time: str, cutoffs: Mapping[str, str]) -> str:
    """``train`` before the valid cutoff, ``valid`` before the test cutoff, else ``test``.

    ``time`` and the cutoffs are ISO strings; a date-only cutoff compares as its midnight.
    """
    valid, test = cutoffs.get("valid"), cutoffs.get("test")
    if test is not None and time >= test:
        return "test"
    if valid is not None and time >= valid:
        return "valid"
    return "train"


def assign_splits(refs: Iterable[SampleRef], cfg: SplitConfig) -> dict[str, str]:
    """Return {sample_id: split} for refs that all carry an entity (and a time when by time)."""
    refs = list(refs)
    if cfg.by == "entity":
        by_entity = {ref.entity for ref in refs}
        entity_split = {e: split_for_unit(entity_unit(e, cfg.seed), cfg.ratios) for e in by_entity if e is not None}
    else:
        first_seen: dict[str, str] = {}
        for ref in refs:
            if ref.entity is None or ref.time is None:
                raise ValueError(f"{ref.path}: reached the time split without entity/time")
            if ref.entity not in first_seen or ref.time < first_seen[ref.entity]:
                first_seen[ref.entity] = ref.time
        cutoffs = dict(cfg.cutoffs)
        entity_split = {e: split_for_time(t, cutoffs) for e, t in first_seen.items()}
    return {ref.sample_id: entity_split[ref.entity] for ref in refs if ref.entity is not None}


@dataclass(frozen=True)
class SplitAudit:
    """What the audit checked and found; ``entity_overlap`` must be empty."""

    entities: dict[str, int]
    entity_overlap: dict[str, tuple[str, ...]]
    time_ranges: dict[str, tuple[str, str]]

    def to_json(self) -> dict[str, object]:
        return {
            "entities_per_split": dict(sorted(self.entities.items())),
            "entity_overlap": {e: list(s) for e, s in sorted(self.entity_overlap.items())},
            "time_ranges": {s: list(r) for s, r in sorted(self.time_ranges.items())},
            "passed": not self.entity_overlap,
        }


def audit_splits(refs: Iterable[SampleRef], assignment: Mapping[str, str]) -> SplitAudit:
    """Check from scratch that no entity appears in two splits; summarise entities and times."""
    splits_of: dict[str, set[str]] = defaultdict(set)
    times: dict[str, list[str]] = defaultdict(list)
    for ref in refs:
        split = assignment.get(ref.sample_id)
        if split is None or ref.entity is None:
            continue
        splits_of[ref.entity].add(split)
        if ref.time is not None:
            times[split].append(ref.time)
    overlap = {e: tuple(sorted(s, key=SPLITS.index)) for e, s in splits_of.items() if len(s) > 1}
    entities: dict[str, int] = defaultdict(int)
    for splits in splits_of.values():
        for split in splits:
            entities[split] += 1
    return SplitAudit(entities=dict(entities), entity_overlap=overlap,
                      time_ranges={s: (min(t), max(t)) for s, t in times.items()})


def raise_on_leakage(audit: SplitAudit) -> None:
    """Fail the build naming the entities found in more than one split."""
    if audit.entity_overlap:
        shown = ", ".join(f"{e} ({'+'.join(s)})" for e, s in sorted(audit.entity_overlap.items())[:10])
        more = len(audit.entity_overlap) - 10
        raise LeakageError(f"split audit: {len(audit.entity_overlap)} entities are in more than one split: {shown}"
                           + (f" and {more} more" if more > 0 else ""))
