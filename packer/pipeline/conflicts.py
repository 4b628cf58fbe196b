"""Label conflicts: copies of one image whose targets disagree (label noise, or two patients mixed up).

A *duplicate group* closes exact duplicates (the same packed pixels, :func:`~packer.pipeline.dedup.exact_groups`)
and verified near copies (:mod:`packer.pipeline.nearcopy`) with union-find: the duplicate links
the split groups by, without the entity links (two images of one patient may well differ in
label), among the samples that are part of the dataset: a file a given split names in none of its
lists (a ``not_in_split`` bad sample) takes no part. A group conflicts when two of its members'
targets do, as the target kind says (:meth:`~packer.targets.Target.conflicts`: different
classes, different multi-label vectors, numbers further apart than ``label_tolerance``), or when
two copies' masks agree less than ``mask_dice`` (:func:`mask_dice`, :func:`aligned_dice`). No
model is needed: the groups and the targets are known before the split.

Exact copies' masks lie on one grid and are compared pixel for pixel. A near copy may be
shifted, zoomed or cropped: its mask is first carried onto the other's grid through the
alignment its verification found (:func:`aligned_dice`: the thumbnails' zoom and whole-pixel
shift, scaled to each sample's size, nearest neighbour), and compared where the two overlap,
so the Dice measures the annotation, not the geometry; the alignment is known to half a
thumbnail pixel (``H / 128`` pixels of an H-pixel sample), which costs a copy with the same
annotation a few hundredths of Dice on small structures. The client reads the masks from the
build cache (:class:`SpilledMasks`) only where two copies both have one (and, for exact copies,
their bytes differ): a few copies, never the dataset. ``packer validate`` keeps no spill: it keeps the
masks alone, compressed, in its scratch folder for the run (:class:`~packer.pipeline.spill.ScratchMasks`),
and compares them as the build does (``masks_compared: true``); ``--quick`` decodes no masks.

``split.duplicates.label_conflict`` says what a conflicting group does: ``warn`` lists it (the
audit's ``label_conflicts`` rule reports), ``fail`` fails the audit (exit 4), ``drop_group``
leaves every member out before the split, each file recorded in ``excluded.jsonl``
(:func:`conflict_exclusions`).
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np

from packer.config import SplitConfig
from packer.pipeline.dedup import components_of, exact_groups_of
from packer.pipeline.nearcopy import THUMB, NearLinks
from packer.pipeline.sampletable import SampleTable
from packer.pipeline.spill import ScratchMasks, SpillReader
from packer.records import Excluded, SpilledSample

#: Whether two target texts disagree (:meth:`packer.targets.Target.conflicts`), given the tolerance.
Compare = Callable[..., bool]
#: Groups' members whose keys an exclusion's detail names.
NAMED = 5


def mask_dice(a: np.ndarray, b: np.ndarray, *, pad: int | None = None) -> float:
    """How far two masks of one image agree: the mean over the class ids either holds (background
    0 and ``pad``, the id ``fit`` pads with, left out) of Dice, 2·|A∩B| / (|A| + |B|), in [0, 1].
    1.0 where neither holds a class; 0.0 where their shapes differ (no pixel can be compared).
    :func:`exact_mask_dice` as the nearest float."""
    return float(exact_mask_dice(a, b, pad=pad))


def exact_mask_dice(a: np.ndarray, b: np.ndarray, *, pad: int | None = None) -> Fraction:
    """:func:`mask_dice` as the exact fraction it is (each class's Dice is a ratio of pixel
    counts): in float64 the mean of 1, 1 and 0.4 is 0.7999999999999999, below a ``mask_dice`` of
    0.8 it equals, so the threshold is compared with this (:func:`dice_below`)."""
    if a.shape != b.shape:
        return Fraction(0)
    ids = np.union1d(np.unique(a), np.unique(b))
    ids = ids[(ids != 0) & (ids != pad)] if pad is not None else ids[ids != 0]
    if ids.size == 0:
        return Fraction(1)
    total = Fraction(0)
    for cls in ids.tolist():
        in_a, in_b = a == cls, b == cls
        total += Fraction(2 * int(np.count_nonzero(in_a & in_b)),
                          int(np.count_nonzero(in_a)) + int(np.count_nonzero(in_b)))
    return total / int(ids.size)


def dice_below(dice: Fraction, threshold: float) -> bool:
    """Whether an exact mean Dice (:func:`exact_mask_dice`) is below ``threshold``, the job's
    ``mask_dice`` taken as the decimal it writes (0.8 is 4/5, not the float nearest it), as
    :meth:`packer.targets.numeric.NumericTarget.conflicts` takes ``label_tolerance``: a Dice equal to
    the threshold is no conflict."""
    return dice < Fraction(Decimal(repr(float(threshold))))


def aligned_dice(a: np.ndarray, b: np.ndarray, *, zoom: float, dy: float, dx: float,
                 pad: int | None = None) -> float:
    """:func:`exact_aligned_dice` as the nearest float."""
    return float(exact_aligned_dice(a, b, zoom=zoom, dy=dy, dx=dx, pad=pad))


def exact_aligned_dice(a: np.ndarray, b: np.ndarray, *, zoom: float, dy: float, dx: float,
                       pad: int | None = None) -> Fraction:
    """:func:`exact_mask_dice` of ``a`` and ``b``, two masks (…×H×W: a slice's 1×H×W, a volume's
    D×H×W) of near copies whose thumbnails (:data:`~packer.pipeline.nearcopy.THUMB` square) the
    verification aligned: ``b``'s thumbnail magnified by ``zoom`` about its centre and moved by
    (``dy``, ``dx``) thumbnail pixels lines up with ``a``'s
    (:class:`~packer.pipeline.nearcopy.Evidence`). Each pixel of ``a`` is mapped to ``b``'s grid
    through both thumbnails (each sample's own size; every leading index alike) and takes
    ``b``'s nearest pixel; pixels that land outside ``b`` (a crop, a shift), and pixels where
    either mask holds ``pad`` (the border ``resize: fit`` pads with: a crop's missing strip can
    land on it), are left out. 1.0
    where no pixel overlaps (nothing to compare); 0.0 where the leading shapes differ."""
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or not a.size or not b.size:
        return exact_mask_dice(a, b, pad=pad)
    centre = (THUMB - 1) / 2.0

    def mapped(length_a: int, length_b: int, shift: float) -> np.ndarray:
        thumb = (np.arange(length_a, dtype=np.float64) + 0.5) * THUMB / length_a - 0.5  # a's pixel on its thumbnail
        other = centre + (thumb + shift - centre) / zoom  # the same point on b's thumbnail
        return np.floor((other + 0.5) * length_b / THUMB).astype(np.int64)  # b's pixel holding it

    rows, columns = mapped(a.shape[-2], b.shape[-2], dy), mapped(a.shape[-1], b.shape[-1], dx)
    keep_rows = (rows >= 0) & (rows < b.shape[-2])
    keep_columns = (columns >= 0) & (columns < b.shape[-1])
    if not keep_rows.any() or not keep_columns.any():
        return Fraction(1)
    carried = b[..., rows[keep_rows], :][..., columns[keep_columns]]
    own = a[..., keep_rows, :][..., keep_columns]
    if pad:  # a pixel either side pads (resize: fit's border, an id of its own) shows nothing there: not compared
        shown = (own != pad) & (carried != pad)
        own, carried = own[shown], carried[shown]
    return exact_mask_dice(own, carried, pad=pad)


class SpilledMasks:
    """The masks of spilled samples, read back from the build cache (``cache_dir``) as the
    arrays the shards will hold; ``pads``: each source's ``mask.pad``. With ``scratch``,
    ``cache_dir`` is ``packer validate``'s scratch folder, which holds the masks alone
    (:class:`~packer.pipeline.spill.ScratchMasks`): the same bytes, so the same Dice."""

    def __init__(self, cache_dir: Path, pads: Mapping[str, int], *, scratch: bool = False) -> None:
        self.cache_dir, self.pads, self.scratch = cache_dir, dict(pads), scratch

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Callable[[SpilledSample], bytes]]:
        """A sample's mask ``.npy`` bytes, while open."""
        if self.scratch:
            yield ScratchMasks(self.cache_dir).mask_bytes
            return
        with SpillReader(self.cache_dir) as reader:
            yield lambda sample: reader.read_bytes(sample)[2]

    def near_dice(self, table: SampleTable, links: Sequence[tuple[int, int, float, float, float]]) -> Fraction:
        """The lowest :func:`exact_aligned_dice` over near-copy ``links`` (rows i, j of ``table``
        and the alignment of j to i: zoom, dy, dx); 1 for none."""
        lowest = Fraction(1)
        with self._reading() as read:
            masks: dict[int, np.ndarray] = {}

            def mask(row: int) -> np.ndarray:
                if row not in masks:
                    masks[row] = np.load(io.BytesIO(read(table[row])), allow_pickle=False)
                return masks[row]

            for i, j, zoom, dy, dx in links:
                lowest = min(lowest, exact_aligned_dice(mask(i), mask(j), zoom=zoom, dy=dy, dx=dx,
                                                        pad=self.pads.get(table[i].ref.source)))
        return lowest

    def lowest_dice(self, table: SampleTable, rows: Sequence[int]) -> Fraction:
        """The lowest :func:`exact_mask_dice` between the masks of ``rows`` (distinct masks only)."""
        distinct: dict[bytes, tuple[np.ndarray, str]] = {}
        with self._reading() as read:
            for row in rows:
                sample = table[row]
                npy = read(sample)
                if npy not in distinct:
                    distinct[npy] = (np.load(io.BytesIO(npy), allow_pickle=False), sample.ref.source)
        return min((exact_mask_dice(a, b, pad=self.pads.get(source)) for (a, source), (b, _)
                    in itertools.combinations(distinct.values(), 2)), default=Fraction(1))


@dataclass(frozen=True)
class LabelConflict:
    """One duplicate group whose members disagree: ``members``, rows of the sample table
    (ascending); ``linked_by`` (``exact``, ``near`` or ``exact+near``); ``targets``, whether two
    members' targets disagree; ``dice``, the lowest Dice between copies' masks (a near copy's
    aligned) where masks were compared (None otherwise), and ``masks``, whether it is below
    ``mask_dice``."""

    members: tuple[int, ...]
    linked_by: str
    targets: bool
    dice: float | None = None
    masks: bool = False


@dataclass(frozen=True)
class LabelConflicts:
    """Every conflicting duplicate group; ``masks_compared``: whether masks were read (a build
    of a job with masks) or could not be (``packer validate``: no spill; None: the job has no
    masks); ``dropped``: the rows ``drop_group`` leaves out of the split."""

    groups: tuple[LabelConflict, ...] = ()
    masks_compared: bool | None = None
    dropped: frozenset[int] = frozenset()

    @property
    def rows(self) -> frozenset[int]:
        """Every member of every conflicting group."""
        return frozenset(row for group in self.groups for row in group.members)


def find_label_conflicts(samples: SampleTable, links: NearLinks, cfg: SplitConfig, conflicts: Compare, *,
                         masks: SpilledMasks | None, has_masks: bool = False,
                         outside: frozenset[int] = frozenset()) -> LabelConflicts:
    """The duplicate groups of ``samples`` (exact copies and the verified near ``links``) whose
    members disagree: two targets that ``conflicts`` (the target kind's
    :meth:`~packer.targets.Target.conflicts`, with ``cfg.label_tolerance``) says differ, or two
    exact copies' masks, or a near copy's aligned onto its source's (:func:`aligned_dice`), whose
    Dice is below ``cfg.mask_dice`` (read with ``masks``; None: masks are not compared).
    ``has_masks``: the job's samples carry masks. ``outside``: rows that are not part of the
    dataset (a given split names none of them: ``not_in_split`` bad samples), in no group and
    linking none, as if they had not been found: such a file conflicts with nothing, so it neither
    drops a sample of the dataset nor is left out as a ``label_conflict`` itself. Groups are
    ordered by their first row, so the result depends only on the samples."""
    skip = None
    if outside:
        skip = np.zeros(len(samples), dtype=bool)
        skip[np.fromiter(outside, dtype=np.int64, count=len(outside))] = True
        links = links.without(skip)
    exact = exact_groups_of(samples, skip)
    if not exact and not len(links):
        return LabelConflicts(masks_compared=(masks is not None) if has_masks else None)
    edges = itertools.chain(((g[k], g[k + 1]) for g in exact for k in range(len(g) - 1)),
                            zip(links.i.tolist(), links.j.tolist(), strict=True))
    roots = components_of(edges)  # the rows a link names: the others are alone
    linked: dict[int, set[str]] = defaultdict(set)
    for group in exact:
        linked[roots[group[0]]].add("exact")
    for i in links.i.tolist():
        linked[roots[i]].add("near")
    members: dict[int, list[int]] = defaultdict(list)
    for row in sorted({row for group in exact for row in group} | set(links.i.tolist()) | set(links.j.tolist())):
        members[roots[row]].append(row)
    mask_bytes = samples.array("mask_bytes") if has_masks else None
    exact_of = {group[0]: group for group in exact}
    near_of: dict[int, list[tuple[int, int, float, float, float]]] = defaultdict(list)
    if masks is not None and mask_bytes is not None:
        # equal mask bytes are compared too: on a shifted copy, the same mask is a misplaced one
        evidence = links.evidence
        for k, (i, j) in enumerate(zip(links.i.tolist(), links.j.tolist(), strict=True)):
            if mask_bytes[i] > 0 and mask_bytes[j] > 0:
                near_of[roots[i]].append((i, j, float(evidence.zoom[k]), float(evidence.dy[k]),
                                          float(evidence.dx[k])))
    found = []
    for root, rows in sorted(members.items()):
        texts = list(dict.fromkeys(samples.value("label", row) for row in rows))
        differ = any(conflicts(a, b, tolerance=cfg.label_tolerance) for a, b in itertools.combinations(texts, 2))
        dice: Fraction | None = None
        if masks is not None and mask_bytes is not None:
            for group in (exact_of[row] for row in rows if row in exact_of):
                masked = [row for row in group if mask_bytes[row] > 0]
                if len(masked) > 1:
                    low = masks.lowest_dice(samples, masked)
                    dice = low if dice is None else min(dice, low)
            if near_of.get(root):
                low = masks.near_dice(samples, near_of[root])
                dice = low if dice is None else min(dice, low)
        apart = dice is not None and dice_below(dice, cfg.mask_dice)
        if differ or apart:
            found.append(LabelConflict(members=tuple(rows), linked_by="+".join(sorted(linked[root])),
                                       targets=differ, dice=None if dice is None else float(dice), masks=apart))
    return LabelConflicts(groups=tuple(found), masks_compared=(masks is not None) if has_masks else None)


def conflict_exclusions(samples: SampleTable, found: LabelConflicts,
                        files: Mapping[str, tuple[tuple[str, str], ...]] | None = None) -> list[Excluded]:
    """One ``label_conflict`` record (``excluded.jsonl``) per file whose samples ``drop_group``
    left out (``found.dropped``), every one of them: the samples' keys, the group's size, how it
    was linked and what disagreed. A file some of whose samples (tiles, pages, frames) still
    pack is a packed file, counted once as such: its dropped samples are named in ``leakage.json``
    (the group's members, ``dropped``), not as a file left out. ``files``: by sample key, the
    files a sample stands for whole (a volume's series, :class:`packer.pipeline.split.HeldFiles`):
    each of them is left out with it, one record a file."""
    packed = _files_still_packed(samples, found.dropped)
    paths: dict[str, str] = {}
    dropped_keys: dict[str, list[str]] = defaultdict(list)
    whys: dict[str, str] = {}
    for group in found.groups:
        dropped = [row for row in group.members if row in found.dropped]
        if not dropped:
            continue
        texts = sorted({samples.value("label", row) or "" for row in group.members})
        named = (", ".join(samples.value("key", row) for row in group.members[:NAMED])
                 + (", ..." if len(group.members) > NAMED else ""))
        what = [f"targets {', '.join(repr(t) for t in texts)}"] if group.targets else []
        if group.masks and group.dice is not None:
            what.append(f"masks (Dice {group.dice:.2f})")
        why = (f"in a group of {len(group.members)} copies ({group.linked_by}: {named}) whose {' and '.join(what)} "
               "disagree; left out with its whole group by split.duplicates.label_conflict: drop_group")
        for row in dropped:
            ref = samples[row].ref
            if ref.sample_id in packed:  # the file's other samples pack: a packed file
                continue
            key = samples.value("key", row)
            for sample_id, path in (files or {}).get(key, ((ref.sample_id, ref.path),)):
                paths[sample_id] = path
                dropped_keys[sample_id].append(key)
                whys.setdefault(sample_id, why)
    return [Excluded(sample_id=sample_id, path=paths[sample_id], stage="split", why="label_conflict",
                     detail=f"sample{'s' if len(dropped_keys[sample_id]) > 1 else ''} "
                            f"{', '.join(dropped_keys[sample_id])}: {whys[sample_id]}")
            for sample_id in sorted(paths)]


def _files_still_packed(samples: SampleTable, dropped: frozenset[int]) -> set[str]:
    """The file ids among ``dropped``'s whose other samples are not dropped (a tile, a page or a
    frame of the file is in no conflicting group)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dropped_of = Counter(samples.value("sample_id", row) for row in dropped)
    column = samples.arrow("sample_id")
    hits = pc.indices_nonzero(pc.is_in(column, value_set=pa.array(sorted(dropped_of), type=column.type)))
    total = Counter(samples.value("sample_id", row) for row in hits.to_pylist())
    return {file for file, count in dropped_of.items() if total[file] > count}
