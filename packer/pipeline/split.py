"""Split: assign every sample to train/valid/test (and a fold), grouped so nothing leaks.

Samples are first joined into *split groups* with union-find: all samples of one entity,
and (with ``duplicates: group``, the default) every exact duplicate and every verified near
copy (:mod:`packer.pipeline.nearcopy`: candidates among other entities, each confirmed on thumbnails,
so look-alike images of different patients are not chained). A group then goes to one split:

- ``by: entity``: the group's smallest entity id is hashed with the seed to a number in
  [0, 1) and compared with the cumulative ratios. Input order never matters and adding
  entities never moves an existing one (unless a new duplicate links two old groups).
  ``stratify: label`` instead assigns groups greedily to the split whose label quotas are
  most behind (deterministic for a seed, not stable under growth).
- ``by: time``: the group goes where its earliest record falls; with
  ``entity_policy: drop_straddlers`` records falling after a later cutoff are left out on purpose
  (``straddles_cutoff`` records of ``excluded.jsonl``, never bad samples).
- A pinned table forces entities into splits; a conflict fails the build.
- ``by: list`` / ``by: column``: the split is given (a dataset's official split,
  :mod:`packer.pipeline.splitlists`) and reproduced sample by sample, leaks included; ``carve``
  then moves about ``ratio`` of a given split's groups, chosen by the seeded hash of their
  smallest entity id, whole into a split the data lacks.

The audit (``packer.pipeline.audit``) then checks the result from scratch, and :func:`measure_balance`
says whether the split is what was asked (the audit's ``split_balance`` rule).
"""

from __future__ import annotations

import bisect
import csv
import functools
import hashlib
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow.compute as pc

from packer.config import SPLITS, SplitConfig
from packer.errors import ConfigError
from packer.phi import entity_text
from packer.pipeline.dedup import UnionFind, components_of, exact_groups_of
from packer.pipeline.listings import BUILD_LISTINGS, Listings
from packer.pipeline.nearcopy import (
    EXACT_LIMIT,
    Candidates,
    EvidenceArrays,
    NearLinks,
    VerifyTask,
    candidate_pairs,
    corroborated,
    find_near_links,
    verify_task,
)
from packer.pipeline.neighborcache import NeighborCache, sample_identities, search_candidates
from packer.pipeline.sampletable import SampleTable, as_table
from packer.pipeline.splitlists import GivenSplit, split_from_column, split_from_lists
from packer.progress import Progress, stage_progress
from packer.records import Excluded, Issue, SpilledSample
from packer.targets import ClassTarget


@dataclass(frozen=True)
class HeldFiles:
    """What the split needs to know of the samples that hold other files' pixels (neighbour
    stacks, volumes: :meth:`packer.read.kinds.Grouping.spans`), from the header pass, by sample key.

    ``latest``: the latest record time of the files a sample holds, where it is later than the
    sample's own (a time split times such a sample by it). ``files``: each file, as (sample id,
    path), that a sample stands for whole (a volume's series, its own file first): leaving the
    sample out leaves each of them out, one record a file."""

    latest: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def timed(self, table: SampleTable) -> list[str | None]:
        """Each row's time as a time split compares it (ISO text, None where it has none): its
        sample's latest file's (:attr:`latest`), else its own. A neighbour stack or a volume holds
        its later files' pixels, so it is placed, left out (``drop_straddlers``) and audited
        (``time_order``) by the latest of them under either policy, from headers alike in a build
        and in ``validate --quick``; its record keeps its own time under ``first_seen``."""
        import pyarrow as pa

        times = table.column("time")
        if not self.latest:
            return times
        hits = pc.is_in(table.arrow("key"), value_set=pa.array(sorted(self.latest)))
        for i in np.flatnonzero(hits.to_numpy(zero_copy_only=False)).tolist():
            own, last = times[i], self.latest[table.value("key", i)]
            if own is not None and last > own:  # under drop_straddlers the pixel pass already gave it
                times[i] = last
        return times


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


@functools.total_ordering
class Members(Sequence[int]):
    """A split group's rows (indices into the sample list), held as one int64 array: a tuple of
    Python ints cost 36 bytes a sample, ~0.4 GB of every group at 10M samples, kept from the
    split to the manifest. Reads as a tuple of ints: items and iteration give ``int``, a slice
    a tuple, and it equals (and orders as) the tuple or list of the same rows."""

    __slots__ = ("rows",)

    def __init__(self, rows: Iterable[int] | np.ndarray) -> None:
        array = np.fromiter(rows, dtype=np.int64) if not isinstance(rows, np.ndarray) else rows.astype(np.int64)
        array.flags.writeable = False
        self.rows = array

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return tuple(self.rows[index].tolist())
        return int(self.rows[index])

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Members):
            return bool(np.array_equal(self.rows, other.rows))
        theirs = self._as_tuple(other)
        return NotImplemented if theirs is None else tuple(self.rows.tolist()) == theirs

    def __hash__(self) -> int:
        return hash(tuple(self.rows.tolist()))

    def _as_tuple(self, other: object) -> tuple[int, ...] | None:
        if isinstance(other, Members):
            return tuple(other.rows.tolist())
        return tuple(other) if isinstance(other, (tuple, list)) else None

    def __lt__(self, other: object) -> bool:   # ordered as the tuple of its rows (the rest: total_ordering)
        theirs = self._as_tuple(other)
        return NotImplemented if theirs is None else tuple(self.rows.tolist()) < theirs

    def __repr__(self) -> str:
        return f"Members({tuple(self.rows.tolist())})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Members, (self.rows,))


@dataclass(frozen=True)
class SplitGroup:
    """Samples that must share a split: indices into the sample list, their entities, and how
    many of them no split holds (records dropped by ``entity_policy: drop_straddlers``).
    ``members`` given as any sequence of ints is held as :class:`Members`."""

    members: Members
    entities: tuple[str, ...]
    dropped: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.members, Members):
            object.__setattr__(self, "members", Members(self.members))

    @property
    def size(self) -> int:
        """The samples the group holds in its split: its members less those dropped."""
        return len(self.members) - self.dropped

    @property
    def representative(self) -> str:
        return self.entities[0]


class RowCodes(Mapping[str, Any]):
    """A mapping from sample key to a value (a split name, a fold) held as one small integer per
    row of a sample table, -1 where a row has none: what :class:`Assignment` keeps instead of a
    dict of every key (about 120 bytes a sample, 1.2 GB at 10M). Code that walks the table's rows
    reads :attr:`codes` (:func:`split_codes`); a lookup by key builds the key index on first use."""

    def __init__(self, table: SampleTable, codes: np.ndarray, values: Sequence[Any]) -> None:
        self.keys_of = table.field_text("key")  # the rows the codes align with
        self.codes = codes
        self.values_of = tuple(values)
        self._rows: dict[str, int] | None = None

    def _index(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {key: row for row, key in self._keyed() if key is not None}
        return self._rows

    def _keyed(self) -> Iterator[tuple[int, str | None]]:
        """(row, key) of every row with a value, in row order, the keys read a block at a time."""
        block = 1 << 16
        held = np.flatnonzero(self.codes >= 0)
        for start in range(0, len(held), block):
            rows = held[start:start + block]
            yield from zip(rows.tolist(), self.keys_of.take(rows).values(), strict=True)

    def __getitem__(self, key: str) -> Any:
        return self.values_of[int(self.codes[self._index()[key]])]

    def __iter__(self) -> Iterator[str]:
        return (key for _, key in self._keyed() if key is not None)

    def __len__(self) -> int:
        return int(np.count_nonzero(self.codes >= 0))

    def counts(self) -> dict[Any, int]:
        """How many rows hold each value (values no row holds left out)."""
        found = np.bincount(self.codes[self.codes >= 0].astype(np.int64), minlength=len(self.values_of))
        return {value: int(n) for value, n in zip(self.values_of, found.tolist(), strict=True) if n}

    def take(self, table: SampleTable, rows: np.ndarray) -> RowCodes:
        """The same mapping restricted to ``rows``, aligned with ``table`` (the table's ``take`` of them)."""
        return RowCodes(table, self.codes[rows], self.values_of)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_row_codes, (self.keys_of, self.codes, self.values_of))


def _row_codes(keys: Any, codes: np.ndarray, values: tuple[Any, ...]) -> RowCodes:
    made = RowCodes.__new__(RowCodes)
    made.keys_of, made.codes, made.values_of, made._rows = keys, codes, values, None
    return made


@dataclass(frozen=True)
class Assignment:
    """Per sample key: its split and (for non-test samples, with ``folds``) its fold.

    ``dropped`` holds the ``not_in_split`` issues of samples left out of every split (bad
    samples); ``excluded``, the ``straddles_cutoff`` records of files ``entity_policy:
    drop_straddlers`` leaves out on purpose (one per file, never against ``max_bad_fraction``);
    ``warnings``, sentences for the user (list items that name no sample). ``split`` and
    ``fold`` are :class:`RowCodes` over the samples :func:`assign_splits` was given (any mapping
    where a caller makes one by hand).
    """

    split: Mapping[str, str]
    fold: Mapping[str, int]
    groups: tuple[SplitGroup, ...]
    dropped: tuple[Issue, ...]
    pinned: dict[str, str]
    warnings: tuple[str, ...] = ()
    excluded: tuple[Excluded, ...] = ()

    def split_counts(self) -> dict[str, int]:
        """Samples per split (splits without samples left out)."""
        if isinstance(self.split, RowCodes):
            return self.split.counts()
        counts: dict[str, int] = defaultdict(int)
        for name in self.split.values():
            counts[name] += 1
        return dict(counts)

    def placed_in(self, table: SampleTable, rows: np.ndarray) -> Assignment:
        """This assignment with ``split`` and ``fold`` aligned with ``table``, the rows ``rows`` of
        the samples it was made on (the same keys: a mapping by key is unchanged)."""
        if not isinstance(self.split, RowCodes) or not isinstance(self.fold, RowCodes):
            return self
        return replace(self, split=self.split.take(table, rows), fold=self.fold.take(table, rows))


def split_codes(table: SampleTable, split: Mapping[str, str]) -> np.ndarray:
    """Per row of ``table``, the index in :data:`SPLITS` of its key's split in ``split``, or -1 (no
    split, or a name that is none of them): the codes themselves where ``split`` is a
    :class:`RowCodes` aligned with ``table``, else by key, the keys read a block at a time, not as
    one list."""
    if isinstance(split, RowCodes) and split.keys_of is table.field_text("key") and split.values_of == SPLITS:
        return split.codes.astype(np.int8)
    index = {name: k for k, name in enumerate(SPLITS)}
    codes = np.full(len(table), -1, dtype=np.int8)
    block = 1 << 16
    for start in range(0, len(table), block):
        keys = table.field_text("key").slice(start, min(start + block, len(table))).values()
        codes[start:start + len(keys)] = [index.get(split[k], -1) if k is not None and k in split else -1
                                          for k in keys]
    return codes


def fold_codes(table: SampleTable, fold: Mapping[str, int]) -> np.ndarray:
    """Per row of ``table``, its key's fold in ``fold``, or -1 (int16), as :func:`split_codes`."""
    if isinstance(fold, RowCodes) and fold.keys_of is table.field_text("key"):
        return fold.codes.astype(np.int16)
    codes = np.full(len(table), -1, dtype=np.int16)
    block = 1 << 16
    for start in range(0, len(table), block):
        keys = table.field_text("key").slice(start, min(start + block, len(table))).values()
        codes[start:start + len(keys)] = [fold[k] if k is not None and k in fold else -1 for k in keys]
    return codes


RunVerify = Callable[[Sequence[VerifyTask]], Iterable[tuple[VerifyTask, EvidenceArrays]]]
#: The names a sample's target text counts under when stratifying by label (:meth:`Target.held_names`).
Strata = Callable[[str | None], Sequence[str]]


def verify_in_process(tasks: Sequence[VerifyTask]) -> Iterator[tuple[VerifyTask, EvidenceArrays]]:
    """Run verification tasks here, one after the other (tests, small jobs, ``--scheduler sync``)."""
    for task in tasks:
        yield task, verify_task(task)


def near_links(samples: Sequence[SpilledSample], cfg: SplitConfig, sig_dir: Path | None,
               run: RunVerify = verify_in_process, lists: NeighborCache | None = None, *,
               quiet: bool = False) -> NearLinks:
    """Verified near copies between samples of different entities (:mod:`packer.pipeline.nearcopy`);
    none when disabled or when the samples carry no signatures (``validate --quick``).

    ``sig_dir``: the folder of the chunks' signature files (the build cache). A sample without
    an entity is its own group. ``lists``: the last build's neighbour lists
    (:mod:`packer.pipeline.neighborcache`): the candidates are the same, found searching less.
    A long candidate search shows a ``search`` progress line unless ``quiet`` (``run`` shows the
    verification's, if any).
    """
    table = as_table(samples)
    if not cfg.near_enabled or len(table) < 2 or sig_dir is None:
        return NearLinks.empty()
    rows = table.array("sig_row")
    if (rows < 0).any():
        return NearLinks.empty()
    file_codes, names = table.codes("signature")
    entity_codes, entities = table.codes("entity")
    groups = entity_codes.astype(np.int64)
    missing = np.array([entity is None for entity in entities], dtype=bool)[entity_codes]
    groups[missing] = -1 - np.flatnonzero(missing)
    search = None
    if lists is not None:
        keys, sample_entities = table.column("key"), table.column("entity")

        def search(embeddings: Callable[[int, slice], np.ndarray], groups: np.ndarray, k: int) -> Candidates:
            if len(groups) > EXACT_LIMIT:  # an inverted file trained on all samples: nothing to reuse
                return candidate_pairs(embeddings, groups, k, quiet=quiet)
            held = _held(embeddings)
            return search_candidates(held, groups, k, sample_identities(keys, sample_entities, held), lists,
                                     quiet=quiet)

    links = find_near_links([str(sig_dir / name) for name in names], file_codes, rows, groups,
                            neighbors=cfg.near_neighbors, min_score=cfg.near_min_score, run=run,
                            max_ratio=cfg.near_max_ratio, search=search, quiet=quiet)
    if len(links) == 0:
        return links
    # a tile's (frame's, page's) lone look-alike in another tiled file is no copy of that file
    # each sample's file as a code (equal ids, equal codes), from the id column's buffers: a list
    # and an object array of every id held ~100 bytes a sample
    files = pc.dictionary_encode(table.arrow("sample_id")).indices.to_numpy(zero_copy_only=False)
    return corroborated(links, files.astype(np.int64))


def _held(embeddings: Callable[[int, slice], np.ndarray]) -> Callable[[int, slice], np.ndarray]:
    """``embeddings`` with each zoom's whole read kept: the identities and the search read them both."""
    whole: dict[tuple[int, int | None, int | None], np.ndarray] = {}

    def read(zoom: int, rows: slice) -> np.ndarray:
        key = (zoom, rows.start, rows.stop)
        if key not in whole:
            whole[key] = embeddings(zoom, rows)
        return whole[key]
    return read


def group_samples(samples: Sequence[SpilledSample], cfg: SplitConfig, links: NearLinks,
                  leave_out: frozenset[int] = frozenset()) -> list[SplitGroup]:
    """Union-find the samples into split groups: every sample of one entity, and with
    ``duplicates: group`` every exact duplicate (same packed pixels) and verified near copy.
    The rows in ``leave_out`` (label conflicts dropped before the split) are in no group, and
    their duplicate links join nothing. A sample without an entity is its own. Groups are in
    order of their first row, members ascending.

    Entities are joined through their codes (each row starts in the group of its entity's first
    row), and only the rows a duplicate link names go through a union-find: a forest of every
    row held ~5 Python objects a sample."""
    table = as_table(samples)
    codes, entities = table.codes("entity")
    if any(isinstance(e, str) and e.startswith("?") for e in entities):
        return _group_by_text(table, cfg, links, leave_out)  # an id that could be a keyless row's stand-in
    n = len(table)
    _, first_row, inverse = np.unique(codes, return_index=True, return_inverse=True)
    base = first_row[inverse.reshape(-1)].astype(np.int64)
    missing = np.array([not e for e in entities], dtype=bool)
    alone = missing[codes] if n else np.zeros(0, dtype=bool)
    base[alone] = np.flatnonzero(alone)  # no entity: the sample is its own
    if cfg.duplicates == "group":
        edges = [(int(base[a]), int(base[b])) for group in exact_groups_of(table)
                 for a, b in itertools.pairwise([row for row in group if row not in leave_out])]
        edges += [(int(base[a]), int(base[b])) for a, b in zip(links.i.tolist(), links.j.tolist(), strict=True)
                  if a not in leave_out and b not in leave_out]
        joined = components_of(edges)
        if joined:
            lookup = np.arange(n, dtype=np.int64)
            named = np.fromiter(joined.keys(), dtype=np.int64, count=len(joined))
            lookup[named] = np.fromiter(joined.values(), dtype=np.int64, count=len(joined))
            base = lookup[base]
    rows = np.arange(n, dtype=np.int64)
    if leave_out:
        keep = np.ones(n, dtype=bool)
        keep[np.fromiter(leave_out, dtype=np.int64, count=len(leave_out))] = False
        rows = rows[keep]
    order = np.argsort(base[rows], kind="stable")  # by root, members ascending
    rows, roots = rows[order], base[rows][order]
    cuts = np.flatnonzero(roots[1:] != roots[:-1]) + 1
    names = [e or "" for e in entities]
    groups = []
    for members in np.split(rows, cuts) if rows.size else ():
        held = np.unique(codes[members]).tolist()
        groups.append(SplitGroup(members=Members(members), entities=tuple(sorted({names[c] for c in held}))))
    return groups


def _group_by_text(table: SampleTable, cfg: SplitConfig, links: NearLinks, leave_out: frozenset[int]
                   ) -> list[SplitGroup]:
    """:func:`group_samples` by entity text: a sample without an entity stands in as ``?`` and
    its key, which an entity id of that form would join."""
    entities = table.column("entity")
    forest = UnionFind(len(table))
    first_of_entity: dict[str, int] = {}
    for index, (entity, key) in enumerate(zip(entities, table.column("key"), strict=True)):
        forest.union(first_of_entity.setdefault(entity or f"?{key}", index), index)
    del first_of_entity
    if cfg.duplicates == "group":
        for group in exact_groups_of(table):
            kept = [row for row in group if row not in leave_out]
            for a, b in zip(kept, kept[1:], strict=False):
                forest.union(a, b)
        for a, b in zip(links.i.tolist(), links.j.tolist(), strict=True):
            if a not in leave_out and b not in leave_out:
                forest.union(a, b)
    members: dict[int, list[int]] = defaultdict(list)
    for index, root in enumerate(forest.components()):
        if index not in leave_out:
            members[root].append(index)
    return [SplitGroup(members=Members(m), entities=tuple(sorted({entities[i] or "" for i in m})))
            for _, m in sorted(members.items())]


@dataclass(frozen=True)
class Balance:
    """How far the achieved split is from the request, and whether a group explains it.

    ``shares``/``requested``: per split. ``worst``: the split furthest from its ratio, ``miss``
    its absolute difference and ``allowed`` the most that is not a collapse: the tolerance, or
    four standard deviations of that split's share when whole groups are placed at random
    (``sqrt(r(1 - r) · Σ size²) / N``: a few entities cannot meet ratios exactly). ``largest``:
    the largest split group and its share. ``collapsed``: why the split is not what was asked
    (a group of several entities over ``max_group_share``, or a miss over ``allowed``), else None.
    """

    shares: dict[str, float]
    requested: dict[str, float]
    worst: str
    miss: float
    allowed: float
    largest: SplitGroup | None
    largest_share: float
    collapsed: str | None


def measure_balance(assignment: Assignment, cfg: SplitConfig) -> Balance:
    """:class:`Balance` of ``assignment`` against ``cfg`` (ratios are checked with ``by: entity``
    and no pinned table only; the group share always)."""
    counts = assignment.split_counts()
    total = sum(counts.values())
    shares = {name: counts.get(name, 0) / total if total else 0.0 for name, _ in cfg.ratios}
    requested = {} if cfg.by == "time" else dict(cfg.ratios)  # a time split's dates decide: no ratio was asked
    placed = [g.size for g in assignment.groups]
    squares = float(sum(size * size for size in placed))
    worst, miss, allowed = "train", 0.0, 1.0
    if cfg.given:  # nothing was asked of a given split: it is what the data says
        return Balance(shares=shares, requested={}, worst="train", miss=0.0, allowed=1.0, largest=None,
                       largest_share=0.0, collapsed=None)
    if total and cfg.holds_ratios:
        def allowed_for(ratio: float) -> float:
            return max(cfg.balance_tolerance, 4.0 * float(np.sqrt(ratio * (1 - ratio) * squares)) / total)

        worst = max(requested, key=lambda name: abs(shares[name] - requested[name]) - allowed_for(requested[name]))
        miss, allowed = abs(shares[worst] - requested[worst]), allowed_for(requested[worst])
    largest = max(assignment.groups, key=lambda g: (g.size, -g.members[0]), default=None)
    largest_share = largest.size / total if largest is not None and total else 0.0
    collapsed = None
    # with one split asked for (ratios {train: 1.0}) every group lands there: nothing can collapse
    splitting = sum(1 for _, ratio in cfg.ratios if ratio > 0) > 1
    if splitting and largest is not None and len(largest.entities) > 1 and largest_share > cfg.max_group_share:
        collapsed = "group"
    elif splitting and miss > allowed:
        collapsed = "ratios"
    return Balance(shares=shares, requested=requested, worst=worst, miss=miss, allowed=allowed, largest=largest,
                   largest_share=largest_share, collapsed=collapsed)


def balance_warning(assignment: Assignment, cfg: SplitConfig, *, tolerance: float = 0.05,
                    listed_in: str = "leakage.json") -> str | None:
    """A sentence for the user when the achieved split shares miss ``cfg.ratios`` by more than
    ``tolerance`` (absolute) but not so much that the audit's ``split_balance`` rule fails: a
    single large entity, or a small data set's too few, too coarse groups; else ``None`` (the
    seeded hash's luck of the draw). A ``stratify: label`` split places each group on purpose, so
    any miss over ``tolerance`` warns: where no group explains it, the stratification is named.
    """
    total = len(assignment.split)
    if total == 0 or cfg.by == "time" or cfg.given:
        return None
    balance = measure_balance(assignment, cfg)
    worst = max(cfg.ratios, key=lambda item: abs(balance.shares[item[0]] - item[1]))
    if abs(balance.shares[worst[0]] - worst[1]) <= tolerance:
        return None
    largest = balance.largest
    cause = None
    others = sorted(g.size for g in assignment.groups)[:-1]  # every group but (one) largest
    median = others[(len(others) - 1) // 2] if others else 0
    coarse = largest is not None and largest.size > 2 * tolerance * total
    # a group explains the miss only where it stands out from the others; eight entities of 3
    # samples each (12% apiece) miss 80/20 because whole groups this coarse cannot meet it, and
    # the first of them is no more the cause than the rest
    if coarse and largest is not None and len(assignment.groups) > 1 and largest.size < 2 * median:
        span = f"{largest.size:,}" if others[0] == largest.size else f"{others[0]:,}-{largest.size:,}"
        cause = (f"; its {len(assignment.groups):,} split groups are each {span} sample"
                 f"{'' if largest.size == 1 else 's'}, whole in one split: too few and too coarse to meet the "
                 "ratios closely")
    else:
        culprit = _explaining_group(assignment, balance, tolerance, total)
        if culprit is not None:
            group, placed = culprit
            size = f"{group.size:,} sample{'' if group.size == 1 else 's'} ({group.size / total:.0%})"
            where = f"all in {placed} ({balance.shares[placed]:.0%}, asked {dict(cfg.ratios)[placed]:.0%})"
            if len(group.entities) > 1:
                cause = (f"; a split group holds {size} of {len(group.entities):,} entities, {where}, joined by "
                         "duplicate links (each listed with its evidence under duplicates_span_entities in "
                         f"{listed_in})")
            else:
                cause = f"; one entity ({group.entities[0]}) holds {size}, {where}, and an entity never spans splits"
    # placed on purpose, group by group: no draw's luck (beside a pinned table the shares are not held to the
    # ratios at all: the pins placed them, not the stratification)
    if cause is None and cfg.stratify == "label" and cfg.holds_ratios:
        cause = (f"; stratify: label placed its {len(assignment.groups):,} split groups whole to meet each "
                 "label's quota per split, and could not also meet the ratios closely with them")
    if cause is None:
        return None  # no group explains it: a few entities' luck of the seeded draw, not a structural cause
    shares = ", ".join(f"{name} {balance.shares[name]:.0%}" for name, _ in cfg.ratios)
    asked = ", ".join(f"{name} {ratio:.0%}" for name, ratio in cfg.ratios)
    return f"split shares {shares} miss the requested {asked}{cause}"


def _explaining_group(assignment: Assignment, balance: Balance, tolerance: float, total: int
                      ) -> tuple[SplitGroup, str] | None:
    """The group that explains a missed share, with its split, or None: the largest group sitting in
    a split over its ratio that holds at least that split's excess (without it the split would not
    be over), is coarse (over twice ``tolerance`` of the samples) and stands out (at least twice the
    median size of the other groups). The largest group of all, named before wherever it sat,
    raised the share of a split that was short when it sat there: it cannot explain the miss."""
    sizes = sorted(g.size for g in assignment.groups)
    excess = {name: share - balance.requested.get(name, 0.0) for name, share in balance.shares.items()}
    rows = [g for g in assignment.groups if g.size > 2 * tolerance * total]
    if not rows or len(sizes) < 2:
        return None
    placed = _splits_of(assignment, rows)
    fitting = [(g, where) for g, where in zip(rows, placed, strict=True)
               if where is not None and excess.get(where, 0.0) > 0 and g.size / total >= excess[where]]
    middle = (len(sizes) - 2) // 2  # the median's place among the other groups (``sizes`` less one)
    for group, where in sorted(fitting, key=lambda item: (-item[0].size, item[0].members[0])):
        # the median of the other groups: ``sizes`` less one of this group's size
        median = sizes[middle] if bisect.bisect_left(sizes, group.size) > middle else sizes[middle + 1]
        if group.size >= 2 * median:
            return group, where
    return None


def _splits_of(assignment: Assignment, groups: Sequence[SplitGroup]) -> list[str | None]:
    """Each group's split, by its first placed member: from the row codes of an assignment made by
    :func:`assign_splits`, else (a mapping made by hand) from the mapping's values in row order."""
    split = assignment.split
    if isinstance(split, RowCodes):
        out: list[str | None] = []
        for group in groups:
            codes = split.codes[group.members.rows]
            held = codes[codes >= 0]
            out.append(str(split.values_of[int(held[0])]) if held.size else None)
        return out
    values = list(split.values())
    return [next((values[i] for i in group.members if i < len(values)), None) for group in groups]


def read_pinned(path: Path) -> dict[str, str]:
    """Read ``entity,split`` rows; ConfigError naming the row for a bad split or a repeat."""
    return {entity: split for entity, (split, _) in read_pinned_rows(path).items()}


def read_pinned_rows(path: Path, *, hide_values: bool = False) -> dict[str, tuple[str, int]]:
    """Read ``entity,split`` rows: entity → (split, its first row's number). ConfigError naming
    the row for a bad split or a repeat; never the entity's raw id (a patient's record number,
    which a message would carry into CI logs): the row tells the user which it is. ``hide_values``
    (PHI pseudonymization): nor a split cell that is no split's name (a row whose cells were
    swapped holds the id there). Entity ids are read in NFC (:func:`~packer.phi.entity_text`), as
    samples' are: ``Müller`` written decomposed pins the patient written composed."""
    from packer.pipeline.tables import (
        long_cells,
        not_utf8,
        swallowed_lines,
        table_head,
        unclosed_at_end,
        unreadable_csv,
    )

    pins: dict[str, tuple[str, int]] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh, long_cells():
            head = table_head(fh, path.name)  # separated as a source's table is (tabs, an Excel "CSV"'s semicolons)
            reader = csv.DictReader(head.lines, delimiter=head.delimiter)
            if not reader.fieldnames or {"entity", "split"} - set(reader.fieldnames):
                raise ConfigError(f"{path}: a pinned table needs the columns entity,split")
            for row in reader:
                number = head.above + reader.line_num  # the line the row ends on, as a text editor numbers it
                unclosed_at_end(path, head, number, row, reader.fieldnames)
                # an id in NFC, as the data's are (entity_text): a table saved on a Mac pins its NFD form
                entity, split = entity_text((row["entity"] or "").strip()), (row["split"] or "").strip()
                swallowed_lines(path, number, "entity", entity, "an entity id")
                swallowed_lines(path, number, "split", split, "a split name")
                if split not in SPLITS:
                    shown = ("its cell (not shown under PHI pseudonymization: cells swapped with the entity's "
                             "would print a patient id)" if hide_values else repr(split))
                    raise ConfigError(f"{path}: row {number}, column 'split': {shown} is not one of {SPLITS}")
                if entity in pins and pins[entity][0] != split:
                    raise ConfigError(f"{path}: row {number}: its entity is pinned at row {pins[entity][1]} too, to "
                                      f"another split ({pins[entity][0]}, here {split}); keep one of the two rows")
                pins.setdefault(entity, (split, number))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the pinned table ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from err
    except csv.Error as err:
        raise unreadable_csv(path, err) from err
    return pins


def _group_time(group: SplitGroup, times_of: Sequence[str | None]) -> str:
    times = [t for t in (times_of[i] for i in group.members) if t is not None]
    if not times:
        raise ValueError(f"split group of {group.representative} reached the time split without times")
    return min(times)


def _stratified(groups: Sequence[SplitGroup], label_of: Sequence[str | None], cfg: SplitConfig,
                fixed: Mapping[int, str], *, names: Strata = ClassTarget.held_names) -> dict[int, str]:
    """Greedy group-aware stratification: each group goes to the split whose quota of the
    group's labels is most behind, measured at the group's middle (half of it placed: the
    unbiased rounding, Sainte-Laguë's), so a group larger than a small split's remaining quota
    goes where it fits. Measured before placing, an empty valid or test won every large group
    even when the group was larger than its whole quota, and three 8-image patients a class made
    80/10/10 68/16/16 where single images could fill valid and test exactly. Large groups first;
    ties broken by the seeded hash.

    ``names``: the names a sample's target text counts under (:meth:`Target.held_names`). A
    multi-label sample counts once under each label it holds (and one with none under the
    empty name), so every label's quota is tracked, the greedy form of iterative
    stratification (Sechidis et al., 2011) over groups."""
    labels = sorted({name for text in set(label_of) for name in names(text)})
    column = {label: k for k, label in enumerate(labels)}
    ratios = np.array([r for _, r in cfg.ratios], dtype=np.float64)
    counts = np.zeros((len(groups), len(labels)))
    for g, group in enumerate(groups):
        for i in group.members:
            for name in names(label_of[i]):
                counts[g, column[name]] += 1
    target = ratios[:, None] * counts.sum(axis=0)[None, :]
    have = np.zeros_like(target)
    out: dict[int, str] = {}
    for g, split in fixed.items():
        have[SPLITS.index(split)] += counts[g]
        out[g] = split
    order = sorted((g for g in range(len(groups)) if g not in fixed),
                   key=lambda g: (-counts[g].sum(), entity_unit(groups[g].representative, cfg.seed)))
    for g in order:
        need = (target - have - counts[g][None, :] / 2) / np.maximum(target, 1.0)
        score = (need * counts[g][None, :]).sum(axis=1) / max(counts[g].sum(), 1.0)
        score[ratios <= 0] = -np.inf
        best = int(np.argmax(score))
        have[best] += counts[g]
        out[g] = SPLITS[best]
    _spread_labels(groups, counts, out, fixed, ratios, cfg.seed)
    return out


def _spread_labels(groups: Sequence[SplitGroup], counts: np.ndarray, out: dict[int, str], fixed: Mapping[int, str],
                   ratios: np.ndarray, seed: int) -> None:
    """Repair what the greedy pass can leave: a label carried by at least as many groups as there
    are splits to fill (a *promised* label), yet absent from one of them. The greedy score averages a group's need
    over all its labels, so the last carriers of a rare label can all go where their other,
    commoner labels are most behind (a label on 12 single-sample entities reached train and test,
    never valid). Rarest label first, a split without it takes the smallest movable carrier of
    the split holding most carriers (the next where none there is movable), where that group is no
    split's last carrier of a promised label it holds (so no earlier repair is undone and no promised label
    leaves a split); a label on fewer groups than splits was promised nothing and protects nothing (four
    carriers of a rare label, each holding a label of its own, all stayed in train). Pinned groups
    never move. Each split without a label is filled once, at most: a few small groups move, and none
    where every promised label already reaches every split."""
    wanted = [k for k, ratio in enumerate(ratios) if ratio > 0]
    split_index = {name: k for k, name in enumerate(SPLITS)}
    where = np.array([split_index[out[g]] for g in range(len(groups))], dtype=np.int64)
    carriers_in = np.zeros((len(SPLITS), counts.shape[1]), dtype=np.int64)  # groups carrying each label, per split
    for g in range(len(groups)):
        carriers_in[where[g]] += counts[g] > 0
    promised = carriers_in.sum(axis=0) >= len(wanted)  # a move never changes a label's count of carriers
    for label in sorted(np.flatnonzero(promised).tolist(), key=lambda k: (int(carriers_in[:, k].sum()), k)):
        for empty in wanted:
            if carriers_in[empty, label]:
                continue
            movable = [g for g in range(len(groups)) if where[g] != empty and carriers_in[where[g], label] >= 2
                       and counts[g, label] > 0 and g not in fixed
                       and not np.any((counts[g] > 0) & promised & (carriers_in[where[g]] < 2))]
            if not movable:
                continue
            g = min(movable, key=lambda m: (-int(carriers_in[where[m], label]), int(where[m]), counts[m].sum(),
                                            entity_unit(groups[m].representative, seed), groups[m].representative))
            donor = int(where[g])
            carriers_in[donor] -= counts[g] > 0
            carriers_in[empty] += counts[g] > 0
            where[g] = empty
            out[g] = SPLITS[empty]


def assign_splits(samples: Sequence[SpilledSample], cfg: SplitConfig, links: NearLinks | None = None, *,
                  strata: Strata = ClassTarget.held_names, pseudonym: Callable[[str], str] | None = None,
                  leave_out: frozenset[int] = frozenset(), quiet: bool = False,
                  stacked: Mapping[str, str] | None = None, bad: Mapping[str, str] | None = None,
                  held: HeldFiles | None = None, listings: Listings = BUILD_LISTINGS) -> Assignment:
    """Assign every sample a split (and fold) by its split group. Raises ConfigError when a
    pinned table conflicts with itself or with the time policy, or a given split's lists or
    column are wrong (:mod:`packer.pipeline.splitlists`). ``strata``: the names a
    sample's target text counts under for ``stratify: label``, the target kind's
    :meth:`~packer.targets.Target.held_names` (a multi-label target balances each label).
    ``pseudonym``: under PHI, what turns a listed entity id into the samples' pseudonym.
    ``leave_out``: rows left out before the split (``label_conflict: drop_group``): in no
    group and no split, as if they had not been found. A long split shows a ``split`` progress
    line (split groups placed, the grouping's time included) unless ``quiet``. ``stacked``: the
    sources (by name) whose samples are neighbour stacks or volumes of series (``neighbors``,
    ``volume``), timed by their latest slice (``held``), as the records of those
    ``drop_straddlers`` leaves out say. ``bad``: for ``by: list``, the files refused as bad samples or left out on
    purpose, by their name under ``split.match``, with their reason
    (:func:`packer.pipeline.splitlists.split_from_lists`).
    ``held``: what those samples hold of other files, from headers
    (:func:`packer.pipeline.pixels.held_files`): a time split places and leaves out each sample
    by the latest of its files' times under either policy (:meth:`HeldFiles.timed`), and a volume
    ``drop_straddlers`` leaves out has one ``straddles_cutoff`` record per file of its series, as
    every input file is counted once. ``listings``: where the warnings of a list naming a bad or
    left-out file say those are listed (a build's files; packer validate's report)."""
    with stage_progress("split", None, unit="groups", quiet=quiet) as progress:
        return _assign(as_table(samples), cfg, links, strata, pseudonym, leave_out, progress, stacked, bad, held,
                       listings)


def _assign(table: SampleTable, cfg: SplitConfig, links: NearLinks | None, strata: Strata,
            pseudonym: Callable[[str], str] | None, leave_out: frozenset[int], progress: Progress,
            stacked: Mapping[str, str] | None = None, bad: Mapping[str, str] | None = None,
            held: HeldFiles | None = None, listings: Listings = BUILD_LISTINGS) -> Assignment:
    """:func:`assign_splits`, counting the groups placed in ``progress`` (its total set once the
    groups are known; a given split's groups all at once)."""
    held = held or HeldFiles()
    groups = group_samples(table, cfg, links if links is not None else NearLinks.empty(), leave_out)
    progress.total = len(groups)
    if cfg.given:
        given = _assign_given(table, cfg, groups, pseudonym, leave_out, bad, listings)
        progress.update(len(groups))
        return given
    rows = read_pinned_rows(cfg.pinned, hide_values=pseudonym is not None) if cfg.pinned else {}
    listed = {entity: split for entity, (split, _) in rows.items()}
    pins = dict(listed)
    if pseudonym is not None:  # the table names raw ids, as the data does (or pseudonyms, from a manifest)
        pins = {**{pseudonym(e): s for e, s in listed.items()}, **listed}
    known = {e for group in groups for e in group.entities}
    stray = [e for e in listed if e not in known and (pseudonym is None or pseudonym(e) not in known)]
    fixed: dict[int, str] = {}
    # under PHI an entity is named by its pin's row, as the table's user wrote it (not its pseudonym)
    row_of = {**{pseudonym(e): row for e, (_, row) in rows.items()}, **{e: row for e, (_, row) in rows.items()}} \
        if pseudonym is not None else {}

    def named(entity: str) -> str:
        return f"the one at row {row_of[entity]}" if entity in row_of else entity

    for g, group in enumerate(groups):
        wanted = {pins[e] for e in group.entities if e in pins}
        if len(wanted) > 1:
            each = ", ".join(f"{named(e)} to {pins[e]}" for e in group.entities if e in pins)
            raise ConfigError(f"{cfg.pinned}: its entities are pinned to different splits ({each}) but share a "
                              "split group (one patient, or duplicate images: a copy of one's image under the "
                              "other), which goes to one split whole, or its copies would leak across splits; pin "
                              "them to one split, or unpin all but one")
        if wanted:
            fixed[g] = wanted.pop()
    cutoffs = dict(cfg.cutoffs)
    group_split: dict[int, str] = {}
    times = held.timed(table) if cfg.by == "time" else None  # only a time split reads them
    if times is not None:
        for g, group in enumerate(groups):
            by_time = split_for_time(_group_time(group, times), cutoffs)
            if g in fixed and fixed[g] != by_time:
                pinned_one = next((e for e in group.entities if e in pins), group.representative)
                raise ConfigError(f"{cfg.pinned}: {named(pinned_one)} is pinned to {fixed[g]} but its group's first "
                                  f"record falls in {by_time} under the time cutoffs; unpin it or move the cutoff")
            group_split[g] = by_time
    elif cfg.stratify == "label":
        group_split = _stratified(groups, table.column("label"), cfg, fixed, names=strata)
    else:
        for g, group in enumerate(groups):
            group_split[g] = fixed.get(g) or split_for_unit(entity_unit(group.representative, cfg.seed), cfg.ratios)

    split = np.full(len(table), -1, dtype=np.int8)
    fold = np.full(len(table), -1, dtype=np.int16)
    code_of = {name: k for k, name in enumerate(SPLITS)}
    dropped: dict[str, Excluded] = {}  # by sample id: a multi-frame file's rows are one file
    straddlers = times if times is not None and cfg.entity_policy == "drop_straddlers" else None
    # a stack holds its neighbours' pixels: one reaching past its entity's cutoff is left out with them
    timed = {"neighbors": " (the latest of the slices its sample stacks: the file's own slice may fall earlier, "
                          "and is then still packed as its neighbours' neighbour)",
             "volume": " (the latest of its volume's slices: the volume, every file of its series, is left out "
                       "with it)"}
    stacked = stacked or {}
    if straddlers is None:  # every member goes where its group goes
        _place_groups(groups, group_split, cfg, split, fold)
        progress.update(len(groups))
    else:  # a time split leaving out the records after their entity's cutoff, record by record
        for g, group in enumerate(groups):
            progress.update()
            left_out = 0
            for i in group.members:
                target, time = group_split[g], straddlers[i]
                if time is not None:
                    own = split_for_time(time, cutoffs)
                    if own != target:
                        ref = table[i].ref
                        left_out += 1
                        others = len(group.entities) - 1
                        whose = ("its entity's first record" if not others else
                                 f"the first record of its split group (its entity and {others} other "
                                 f"entit{'y' if others == 1 else 'ies'} whose images duplicate one another, kept "
                                 "in one split)")
                        detail = (f"record time {time}{timed.get(stacked.get(ref.source, ''), '')} falls in {own}, "
                                  f"but {whose} put it in {target}; "
                                  "left out by split.entity_policy: drop_straddlers (first_seen keeps it, in its "
                                  "group's split)")
                        # a volume stands for every file of its series: one record a file, each counted once
                        key = table.value("key", i)
                        for sample_id, path in held.files.get(key, ((ref.sample_id, ref.path),)):
                            dropped.setdefault(sample_id, Excluded(
                                sample_id=sample_id, path=path, stage="split", why="straddles_cutoff",
                                detail=detail if sample_id == ref.sample_id else f"a file of volume {key}: {detail}"))
                        continue
                split[i] = code_of[target]
                if cfg.folds and target != "test":
                    fold[i] = int(entity_unit(f"fold\x00{group.representative}", cfg.seed) * cfg.folds)
            if left_out:
                groups[g] = replace(group, dropped=left_out)
    # under PHI the raw id stays out of the warning (printed, and kept in packer validate --json): its row names it
    pinned = "split.pinned" if pseudonym is not None else f"split.pinned ({cfg.pinned})"  # its folder may be a name
    # an entity whose every sample a label conflict left out (drop_group) is no typo: say so
    conflicted = {table[row].ref.entity for row in leave_out}
    gone = [e for e in stray if e in conflicted or (pseudonym is not None and pseudonym(e) in conflicted)]
    unknown = [e for e in stray if e not in gone]
    first = (unknown or gone or [""])[0]
    why = "; ".join(part for part in (
        f"{len(gone):,} had every sample left out by split.duplicates.label_conflict: drop_group" if gone else "",
        ("a typo, or an entity whose files were all bad samples" if not gone else
         f"{len(unknown):,}: a typo, or an entity whose files were all bad samples") if unknown else "") if part)
    warnings = (f"{pinned}: {len(stray):,} of its entities name no sample, e.g. the one at row "
                f"{rows[first][1]}{'' if pseudonym is not None else f': {first!r}'}; they are pinned nowhere "
                f"({why})",) if stray else ()
    return Assignment(split=RowCodes(table, split, SPLITS), fold=RowCodes(table, fold, range(cfg.folds or 1)),
                      groups=tuple(groups), dropped=(), pinned={e: s for e, s in pins.items()},
                      warnings=(*warnings, *_empty_folds(fold, groups, cfg)),
                      excluded=tuple(dropped[sample_id] for sample_id in sorted(dropped)))


def _place_groups(groups: Sequence[SplitGroup], group_split: Mapping[int, str], cfg: SplitConfig,
                  split: np.ndarray, fold: np.ndarray) -> None:
    """Each group's members into its split's code in ``split`` and (``cfg.folds``, not test) its
    fold in ``fold``, by array, not member by member."""
    sizes = np.fromiter((len(group.members) for group in groups), dtype=np.int64, count=len(groups))
    rows = np.concatenate([group.members.rows for group in groups]) if groups else np.zeros(0, dtype=np.int64)
    codes = np.array([SPLITS.index(group_split[g]) for g in range(len(groups))], dtype=np.int8)
    split[rows] = np.repeat(codes, sizes)
    if cfg.folds:
        folds = np.array([-1 if group_split[g] == "test" else
                          int(entity_unit(f"fold\x00{group.representative}", cfg.seed) * cfg.folds)
                          for g, group in enumerate(groups)], dtype=np.int16)
        fold[rows] = np.repeat(folds, sizes)


def given_split(table: SampleTable, cfg: SplitConfig, pseudonym: Callable[[str], str] | None = None,
                bad: Mapping[str, str] | None = None, listings: Listings = BUILD_LISTINGS) -> GivenSplit:
    """The split a given split (``by: list`` or ``by: column``, ``cfg.given``) gives each row of
    ``table``, before any carve (:mod:`packer.pipeline.splitlists`); ``pseudonym``, ``bad`` and
    ``listings`` as :func:`assign_splits` takes them."""
    return (split_from_lists(table, cfg, pseudonym, bad, listings=listings) if cfg.by == "list"
            else split_from_column(table, cfg, hide_paths=pseudonym is not None))


def not_in_split_rows(samples: Sequence[SpilledSample], cfg: SplitConfig,
                      pseudonym: Callable[[str], str] | None = None, bad: Mapping[str, str] | None = None,
                      listings: Listings = BUILD_LISTINGS) -> frozenset[int]:
    """The rows of ``samples`` that a given split names in none of its lists (or whose split cell
    is empty): ``not_in_split`` bad samples, not part of the dataset, so that they take no part in
    what is decided about the dataset's samples before the split (label conflicts:
    :func:`packer.pipeline.conflicts.find_label_conflicts`). Empty for a split that is not given.
    Raises ConfigError as :func:`assign_splits` does for wrong lists or a wrong column."""
    if not cfg.given:
        return frozenset()
    split = given_split(as_table(samples), cfg, pseudonym, bad, listings).split
    return frozenset(row for row, name in enumerate(split) if name is None)


def _assign_given(table: SampleTable, cfg: SplitConfig, groups: Sequence[SplitGroup],
                  pseudonym: Callable[[str], str] | None, leave_out: frozenset[int] = frozenset(),
                  bad: Mapping[str, str] | None = None, listings: Listings = BUILD_LISTINGS) -> Assignment:
    """A given split: each sample where its list or table cell says (leaks included: the audit
    reports them), then each ``carve``, then folds by group. Samples without a split are
    ``not_in_split`` issues in ``dropped``; the rows in ``leave_out`` get no split and no issue.
    ``bad``: the bad and left-out files' names, which a list may name (:func:`split_from_lists`)."""
    given = given_split(table, cfg, pseudonym, bad, listings)
    unlisted = given.unlisted
    if leave_out:
        left_files = {table[row].ref.sample_id for row in leave_out}
        unlisted = tuple(issue for issue in unlisted if issue.sample_id not in left_files)
    split_of = carve_splits([None if i in leave_out else s for i, s in enumerate(given.split)], groups, cfg)
    split = np.array([-1 if name is None else SPLITS.index(name) for name in split_of], dtype=np.int8)
    fold = np.full(len(table), -1, dtype=np.int16)
    if cfg.folds:
        for group in groups:
            unit = entity_unit(f"fold\x00{group.representative}", cfg.seed)
            for i in group.members:
                if split_of[i] not in (None, "test"):
                    fold[i] = int(unit * cfg.folds)
    return Assignment(split=RowCodes(table, split, SPLITS), fold=RowCodes(table, fold, range(cfg.folds or 1)),
                      groups=tuple(groups), dropped=unlisted, pinned={},
                      warnings=(*given.warnings, *_empty_folds(fold, groups, cfg)))


def _empty_folds(fold: np.ndarray, groups: Sequence[SplitGroup], cfg: SplitConfig) -> tuple[str, ...]:
    """A sentence for the user when ``split.folds`` leaves a fold without a sample: each split
    group's fold is drawn from its own hash (a group keeps its fold whatever else the data
    holds, so folds are not dealt out in turn), and a few groups can miss a fold, or be fewer
    than the folds. Cross-validation then validates on an empty fold; the fix is the job's."""
    if not cfg.folds:
        return ()
    held = fold[fold >= 0]
    if not held.size:  # nothing outside test: no fold to fill
        return ()
    counts = np.bincount(held, minlength=cfg.folds)
    empty = np.flatnonzero(counts == 0).tolist()
    if not empty:
        return ()
    placed = sum(1 for group in groups if len(group.members) and (fold[group.members.rows] >= 0).any())
    named = ", ".join(str(f) for f in empty)
    cause = (f"{placed:,} non-test split group{'' if placed == 1 else 's'} cannot fill {cfg.folds} folds"
             if placed < cfg.folds else
             f"each of the {placed:,} non-test split groups draws its fold from its own hash (folds are not dealt "
             "out in turn, so that a group keeps its fold as the data grows)")
    fix = "use fewer folds" if placed < cfg.folds else "use fewer folds, or another split.seed"
    one = len(empty) == 1
    return (f"split.folds: fold{'' if one else 's'} {named} of {cfg.folds} hold{'s' if one else ''} no sample: "
            f"{cause}; a cross-validation run on an empty fold has nothing to validate on: {fix}",)


def carve_splits(given: Sequence[str | None], groups: Sequence[SplitGroup], cfg: SplitConfig) -> list[str | None]:
    """``cfg.carve`` applied to the given split of each sample (by index): for each split carved
    from ``origin``, a group's members in ``origin`` move to it when the seeded hash of the
    group's smallest entity id falls in its share (carves from one origin take consecutive
    intervals of [0, 1), in train/valid/test order). A group moves whole, so no entity or copy
    is split by the carve; the result depends only on the seed and the groups."""
    out = list(given)
    for origin in sorted({c.origin for c in cfg.carve}, key=SPLITS.index):
        carves = [(c.split, c.ratio) for c in cfg.carve if c.origin == origin]
        for group in groups:
            members = [i for i in group.members if out[i] == origin]
            if not members:
                continue
            unit = entity_unit(f"carve\x00{origin}\x00{group.representative}", cfg.seed)
            cumulative = 0.0
            for name, ratio in carves:
                cumulative += ratio
                if unit < cumulative:
                    for i in members:
                        out[i] = name
                    break
    return out


# -- splits that got none --------------------------------------------------------------------------


_WHY_NOT_EMPTY = {"train": "there is nothing to train on",
                  "valid": "there is nothing to validate on (model selection, early stopping)",
                  "test": "nothing is held out to report results on"}


@dataclass(frozen=True)
class EmptySplit:
    """A split the job asked samples for (a ratio above 0, or a time cutoff) that got none.
    ``message`` says why that matters and how to fix it. ``split`` None: no split got a sample,
    the job has none at all (one warning, not one per split)."""

    split: str | None
    message: str

    def to_json(self) -> dict[str, str]:
        where = {} if self.split is None else {"split": self.split}
        return {"code": "empty_split", **where, "message": self.message}


#: The one empty-split warning of a job with no sample at all: no seed, ratio, cutoff or carve can
#: fill a split from nothing, the files are what to look at.
NO_SAMPLE_AT_ALL = ("no split has a sample: the job has 0 samples in all (every input file was bad or left out), "
                    "so there is nothing to split; the bad samples and the files left out say why each file was "
                    "refused (bad_samples.jsonl and "
                    "excluded.jsonl beside the shards; bad_samples and excluded in packer validate's report)")


def empty_splits(split_config: Mapping[str, Any], splits: Mapping[str, Mapping[str, Any]]) -> list[EmptySplit]:
    """The splits that asked for samples but hold none, in split order.

    ``split_config`` is the job's ``split`` as the manifest records it (``SplitConfig.to_json()``:
    ``by``, ``ratios``, ``cutoffs``); ``splits`` maps each split to at least its ``samples`` and
    ``entities`` counts (the manifest's ``splits``, or ``packer validate``'s). With ``by: time``
    train always asks and valid/test ask when they have a cutoff; otherwise a split asks when its
    ratio is above 0. A split with ratio 0 (or no cutoff) that is empty is what the job said.
    When no split has a sample (every file bad or left out) one warning says so, with no split's
    advice: a split's advice (reseed, move the ratios) cannot fill a split from nothing.
    """
    by_time = split_config.get("by") == "time"
    ratios = split_config.get("ratios") or {}
    cutoffs = split_config.get("cutoffs") or {}
    # a given split (by: list or column) asks samples only of the splits it carves (a listed split
    # that names no sample is a config error before this)
    carve = split_config.get("carve") or {}
    entities = sum(int(entry.get("entities", 0)) for entry in splits.values())
    found = []
    for split in SPLITS:
        asked = (split == "train" or split in cutoffs) if by_time else (
            split in carve if "carve" in split_config else float(ratios.get(split, 0)) > 0)
        if not asked or int(splits.get(split, {}).get("samples", 0)) > 0:
            continue
        why = _WHY_NOT_EMPTY[split]
        if split in carve:
            message = (f"split {split} has 0 samples (carved from {carve[split]['from']} at ratio "
                       f"{float(carve[split]['ratio']):g}; {entities} entities in all), so {why}. Each entity goes "
                       f"whole, so a few entities can leave it empty: raise split.carve.{split}.ratio, or try "
                       "another split.seed")
        elif by_time:
            given = ", ".join(f"{name} {cutoffs[name]}" for name in SPLITS if name in cutoffs)
            message = (f"split {split} has 0 samples (by time, cutoffs {given}: no entity's first record falls in "
                       f"{split}'s period), so {why}; move split.cutoffs, or add records from that period")
        else:
            asked_for = ", ".join(f"{name} {float(ratios.get(name, 0)):g}" for name in SPLITS)
            message = (f"split {split} has 0 samples (ratios {asked_for}; {entities} entities in all), so {why}. "
                       "Each entity goes whole to one split, so a few entities can leave a split empty: add "
                       "entities, change split.ratios, or try another split.seed")
        found.append(EmptySplit(split=split, message=message))
    if found and not any(int(entry.get("samples", 0)) for entry in splits.values()):
        return [EmptySplit(split=None, message=NO_SAMPLE_AT_ALL)]
    return found
