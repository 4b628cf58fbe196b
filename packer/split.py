"""Split: assign every sample to train/valid/test (and a fold), grouped so nothing leaks.

Samples are first joined into *split groups* with union-find: all samples of one entity,
and (with ``duplicates: group``, the default) every exact or near duplicate cluster. A
group then goes to one split:

- ``by: entity``: the group's smallest entity id is hashed with the seed to a number in
  [0, 1) and compared with the cumulative ratios. Input order never matters and adding
  entities never moves an existing one (unless a new duplicate links two old groups).
  ``stratify: label`` instead assigns groups greedily to the split whose label quotas are
  most behind (deterministic for a seed, not stable under growth).
- ``by: time``: the group goes where its earliest record falls; with
  ``entity_policy: drop_straddlers`` records falling after a later cutoff are dropped.
- A pinned table forces entities into splits; a conflict fails the build.

The audit (``packer.audit``) then checks the result from scratch.
"""

from __future__ import annotations

import csv
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.config import SPLITS, SplitConfig
from packer.dedup import UnionFind, exact_groups, near_duplicate_edges
from packer.errors import ConfigError
from packer.records import Issue, SpilledSample
from packer.sampletable import as_table


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


@dataclass(frozen=True)
class SplitGroup:
    """Samples that must share a split: indices into the sample list, their entities."""

    members: tuple[int, ...]
    entities: tuple[str, ...]

    @property
    def representative(self) -> str:
        return self.entities[0]


@dataclass(frozen=True)
class Assignment:
    """Per sample key: its split and (for non-test samples, with ``folds``) its fold.

    ``dropped`` holds the ``straddles_cutoff`` issues of samples left out of every split.
    """

    split: dict[str, str]
    fold: dict[str, int]
    groups: tuple[SplitGroup, ...]
    dropped: tuple[Issue, ...]
    pinned: dict[str, str]


def near_edges(samples: Sequence[SpilledSample], cfg: SplitConfig) -> Sequence[tuple[int, int, int]]:
    """Near-duplicate edges (i, j, distance) between samples, empty when disabled."""
    if not cfg.near_enabled or len(samples) < 2:
        return []
    return near_duplicate_edges(as_table(samples).array("dhash"), cfg.near_threshold)


def group_samples(samples: Sequence[SpilledSample], cfg: SplitConfig,
                  edges: Sequence[tuple[int, int, int]]) -> list[SplitGroup]:
    """Union-find the samples into split groups (entities, plus duplicates when grouping)."""
    table = as_table(samples)
    entities = table.column("entity")
    forest = UnionFind(len(table))
    first_of_entity: dict[str, int] = {}
    for index, (entity, key) in enumerate(zip(entities, table.column("key"), strict=True)):
        forest.union(first_of_entity.setdefault(entity or f"?{key}", index), index)
    del first_of_entity
    if cfg.duplicates == "group":
        for group in exact_groups(table.column("sha256")):
            for a, b in zip(group, group[1:], strict=False):
                forest.union(a, b)
        for a, b, _ in edges:
            forest.union(a, b)
    members: dict[int, list[int]] = defaultdict(list)
    for index, root in enumerate(forest.components()):
        members[root].append(index)
    return [SplitGroup(members=tuple(m), entities=tuple(sorted({entities[i] or "" for i in m})))
            for _, m in sorted(members.items())]


def balance_warning(assignment: Assignment, cfg: SplitConfig, *, tolerance: float = 0.05) -> str | None:
    """A sentence for the user when the achieved split shares miss ``cfg.ratios`` by more than
    ``tolerance`` (absolute) and one group holds over twice ``tolerance`` of the samples, naming
    that group as the cause; else ``None`` (a small data set's luck of the draw is not worth one).

    Whole groups move between splits, so a group holding a large share of the samples (many
    entities chained by near-duplicate links, typically: adjacent slices, phantoms, shared
    templates) makes the requested ratios unreachable. The split is still leak-free; the user
    should know, and can lower ``split.near_duplicates.threshold`` or review the chained groups
    (``duplicates_span_entities`` in leakage.json).
    """
    total = len(assignment.split)
    if total == 0 or cfg.by == "time":
        return None
    counts: dict[str, int] = defaultdict(int)
    for name in assignment.split.values():
        counts[name] += 1
    worst = max(cfg.ratios, key=lambda item: abs(counts[item[0]] / total - item[1]))
    achieved = counts[worst[0]] / total
    if abs(achieved - worst[1]) <= tolerance:
        return None
    largest = max(assignment.groups, key=lambda g: len(g.members), default=None)
    if largest is None or len(largest.members) <= 2 * tolerance * total:
        return None  # no group big enough to explain it: a few entities' luck, not a structural cause
    size = f"{len(largest.members):,} samples ({len(largest.members) / total:.0%})"
    if len(largest.entities) > 1:
        cause = (f"; the largest split group holds {size} of {len(largest.entities):,} entities, joined by "
                 "duplicate links: lower split.near_duplicates.threshold or review duplicates_span_entities "
                 "in leakage.json")
    else:
        cause = f"; one entity ({largest.entities[0]}) holds {size}, and an entity never spans splits"
    shares = ", ".join(f"{name} {counts[name] / total:.0%}" for name, _ in cfg.ratios)
    asked = ", ".join(f"{name} {ratio:.0%}" for name, ratio in cfg.ratios)
    return f"split shares {shares} miss the requested {asked}{cause}"


def read_pinned(path: Path) -> dict[str, str]:
    """Read ``entity,split`` rows; ConfigError naming the row for a bad split or a repeat."""
    pins: dict[str, str] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames or {"entity", "split"} - set(reader.fieldnames):
                raise ConfigError(f"{path}: a pinned table needs the columns entity,split")
            for number, row in enumerate(reader, start=2):
                entity, split = (row["entity"] or "").strip(), (row["split"] or "").strip()
                if split not in SPLITS:
                    raise ConfigError(f"{path}: row {number}, column 'split': {split!r} is not one of {SPLITS}")
                if entity in pins and pins[entity] != split:
                    raise ConfigError(f"{path}: row {number}: entity {entity!r} is pinned twice")
                pins[entity] = split
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the pinned table ({err.strerror})") from err
    return pins


def _group_time(group: SplitGroup, times_of: Sequence[str | None]) -> str:
    times = [t for t in (times_of[i] for i in group.members) if t is not None]
    if not times:
        raise ValueError(f"split group of {group.representative} reached the time split without times")
    return min(times)


def _stratified(groups: Sequence[SplitGroup], label_of: Sequence[str | None], cfg: SplitConfig,
                fixed: Mapping[int, str]) -> dict[int, str]:
    """Greedy group-aware stratification: each group goes to the split whose quota of the
    group's labels is most behind. Large groups first; ties broken by the seeded hash."""
    labels = sorted({label or "" for label in label_of})
    column = {label: k for k, label in enumerate(labels)}
    ratios = np.array([r for _, r in cfg.ratios], dtype=np.float64)
    counts = np.zeros((len(groups), len(labels)))
    for g, group in enumerate(groups):
        for i in group.members:
            counts[g, column[label_of[i] or ""]] += 1
    target = ratios[:, None] * counts.sum(axis=0)[None, :]
    have = np.zeros_like(target)
    out: dict[int, str] = {}
    for g, split in fixed.items():
        have[SPLITS.index(split)] += counts[g]
        out[g] = split
    order = sorted((g for g in range(len(groups)) if g not in fixed),
                   key=lambda g: (-counts[g].sum(), entity_unit(groups[g].representative, cfg.seed)))
    for g in order:
        need = (target - have) / np.maximum(target, 1.0)
        score = (need * counts[g][None, :]).sum(axis=1) / max(counts[g].sum(), 1.0)
        score[ratios <= 0] = -np.inf
        best = int(np.argmax(score))
        have[best] += counts[g]
        out[g] = SPLITS[best]
    return out


def assign_splits(samples: Sequence[SpilledSample], cfg: SplitConfig,
                  edges: Sequence[tuple[int, int, int]] = ()) -> Assignment:
    """Assign every sample a split (and fold) by its split group. Raises ConfigError when a
    pinned table conflicts with itself or with the time policy."""
    table = as_table(samples)
    groups = group_samples(table, cfg, edges)
    pins = read_pinned(cfg.pinned) if cfg.pinned else {}
    fixed: dict[int, str] = {}
    for g, group in enumerate(groups):
        wanted = {pins[e] for e in group.entities if e in pins}
        if len(wanted) > 1:
            raise ConfigError(f"{cfg.pinned}: entities {', '.join(e for e in group.entities if e in pins)} are "
                              f"pinned to different splits ({', '.join(sorted(wanted))}) but share a split group "
                              "(same entity or duplicate images); fix the table or set split.duplicates: report")
        if wanted:
            fixed[g] = wanted.pop()
    cutoffs = dict(cfg.cutoffs)
    group_split: dict[int, str] = {}
    times = table.column("time")
    if cfg.by == "time":
        for g, group in enumerate(groups):
            by_time = split_for_time(_group_time(group, times), cutoffs)
            if g in fixed and fixed[g] != by_time:
                raise ConfigError(f"{cfg.pinned}: {group.representative} is pinned to {fixed[g]} but its first "
                                  f"record falls in {by_time} under the time cutoffs; unpin it or move the cutoff")
            group_split[g] = by_time
    elif cfg.stratify == "label":
        group_split = _stratified(groups, table.column("label"), cfg, fixed)
    else:
        for g, group in enumerate(groups):
            group_split[g] = fixed.get(g) or split_for_unit(entity_unit(group.representative, cfg.seed), cfg.ratios)

    split: dict[str, str] = {}
    fold: dict[str, int] = {}
    dropped: list[Issue] = []
    keys = table.column("key")
    for g, group in enumerate(groups):
        for i in group.members:
            target, time = group_split[g], times[i]
            if cfg.by == "time" and cfg.entity_policy == "drop_straddlers" and time is not None:
                own = split_for_time(time, cutoffs)
                if own != target:
                    ref = table[i].ref
                    dropped.append(Issue.of(ref, stage="split", reason="straddles_cutoff",
                                            message=f"{ref.path}: record time {time} falls in "
                                                    f"{own}, but its entity's first record put it in {target}; "
                                                    "dropped by entity_policy: drop_straddlers"))
                    continue
            split[keys[i]] = target
            if cfg.folds and target != "test":
                fold[keys[i]] = int(entity_unit(f"fold\x00{group.representative}", cfg.seed) * cfg.folds)
    return Assignment(split=split, fold=fold, groups=tuple(groups), dropped=tuple(dropped),
                      pinned={e: s for e, s in pins.items()})
