"""Gather what the report shows: bounded sample selections, thumbnails, histograms, bad samples.

Everything here is bounded independently of the dataset's size except the index, which stays
in Arrow columns and numpy arrays (tens of bytes a sample, no Python object per sample): at most
``histogram_samples`` samples per split are decoded for histograms and at most
``sheet_columns × sheet_rows`` per (split, group) for contact sheets, and only those and the
duplicate-group members become :class:`IndexEntry` objects. Arrays are dropped as soon as they
are counted and encoded.

A contact-sheet group follows the dataset's target (:mod:`packer.targets`): the class label; each
label a multi-label sample holds (it appears under each, under ``NO_LABEL`` when it holds none);
the source for numeric and unlabeled datasets.

A dataset with segmentation masks (the manifest's ``mask``, :class:`MaskSchema`) has each
sheet sample's mask drawn over its thumbnail (:func:`packer.htmlreport.thumbs.mask_overlay`) and
the masks of the histogram samples counted per split (:class:`MaskCounts`): the same bounded,
seeded selection, so every mask of a split up to ``histogram_samples`` samples.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from packer.badsamples import REPORT_FILE, read_bad_samples
from packer.buildwarnings import WARNINGS_FILE, BuildWarning, read_warnings
from packer.exclusions import EXCLUDED_FILE, read_excluded
from packer.htmlreport.findings import AuditFindings, DuplicateGroup, Member, read_audit
from packer.htmlreport.shards import IndexEntry, PackedSample, SampleIndex, load_index, read_samples
from packer.htmlreport.stats import (
    ChannelHistograms,
    MaskCounts,
    ValueHistogram,
    channel_counts,
    mask_pixel_counts,
    normalisation_stats,
    value_histograms,
)
from packer.htmlreport.thumbs import Pane, as_chw, channel_names, composite_pane, sample_panes
from packer.progress import stage_progress
from packer.shards.checksum import describe as describe_checksum
from packer.targets import Target

T = TypeVar("T")
R = TypeVar("R")

SPLIT_ORDER = ("train", "valid", "test")
SMALL_PX = 64
NO_LABEL = "(no label)"  # the contact-sheet group of multi-label samples that hold none of the labels


@dataclass(frozen=True)
class ReportLimits:
    """Bounds that keep the report's size and build time independent of the dataset's size."""

    thumb_px: int = 128             # longest side of every thumbnail
    sheet_columns: int = 8
    sheet_rows: int = 4
    labels_per_split: int = 12      # contact-sheet grids per split (the most frequent labels or sources)
    histogram_samples: int = 2000   # samples per split counted into the histograms
    bad_rows: int = 500             # bad-sample table rows
    listed_rows: int = 500          # entity-overlap and duplicate-pair rows
    duplicate_thumbs: int = 40      # duplicate groups shown with thumbnails
    group_members: int = 4          # thumbnails per duplicate group
    image_bytes: int = 7_000_000    # data-URI budget of all thumbnails together
    duplicate_share: float = 0.2    # of image_bytes kept for the duplicate thumbnails

    @property
    def per_sheet(self) -> int:
        return self.sheet_columns * self.sheet_rows


@dataclass(frozen=True)
class MaskSchema:
    """What every mask of a dataset with masks is (the manifest's ``mask``): its dtype, the class
    ids its sources declare (None: any), the id ``fit`` pads with (None where not recorded)."""

    dtype: str
    classes: tuple[int, ...] | None
    pad: int | None
    #: class id → its name, where the manifest names them (masks from DICOM SEG and RTSTRUCT)
    names: tuple[tuple[int, str], ...] = ()

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> MaskSchema | None:
        """The manifest's mask record; None without masks (or a record this packer cannot read).
        The pad id comes from the record, else from the first masked source of the job config."""
        record = manifest.get("mask")
        if not isinstance(record, dict):
            return None
        classes = record.get("classes")
        pad = record.get("pad")
        if pad is None:
            sources = manifest.get("config", {}).get("sources", [])
            pads = [s["mask"].get("pad") for s in sources if isinstance(s, dict) and isinstance(s.get("mask"), dict)]
            pad = pads[0] if pads else None
        try:
            named: dict[str, Any] = record["names"] if isinstance(record.get("names"), dict) else {}
            return cls(dtype=str(record.get("dtype", "?")),
                       classes=None if classes is None else tuple(sorted(int(c) for c in classes)),
                       pad=None if pad is None else int(pad),
                       names=tuple(sorted((int(k), str(v.get("name", ""))) for k, v in named.items()
                                          if isinstance(v, dict))))
        except (TypeError, ValueError):
            return None

    @property
    def pad_class(self) -> str | None:
        """The name of the class the pad id is (the manifest names it: a DICOM SEG or RTSTRUCT
        class); None where the pad is 0, no class, or not recorded."""
        return dict(self.names).get(self.pad) if self.pad else None

    @property
    def pad_only(self) -> int | None:
        """The id ``fit`` pads with where it marks padding only: drawn grey, named "pad", left out
        of a mask's classes. None where the pad is 0 (background), a named class (that class,
        everywhere in the report: its padding is indistinguishable from it) or not recorded."""
        return self.pad if self.pad and self.pad_class is None else None


@dataclass(frozen=True)
class SheetItem:
    """One contact-sheet cell: the sample's identity, its target as text (:meth:`ReportData.describe`)
    and its panes.

    ``small`` holds the same panes at half the size (at most 64 px) for sheets that would
    overrun the image budget at full size; it is ``panes`` itself when those are already small.
    """

    key: str
    label: str
    entity_id: str
    source: str
    channels: tuple[str, ...]
    panes: tuple[Pane, ...]
    small: tuple[Pane, ...]
    mask: str | None = None  # the class ids its mask holds, as text (None: no mask)
    #: why its bytes are not what was packed (its checksum failed), None when they check out
    damaged: str | None = None

    def nbytes(self, small: bool = False) -> int:
        return sum(p.nbytes for p in (self.small if small else self.panes))


@dataclass(frozen=True)
class DamagedSample:
    """A sample the report read whose bytes fail the checksum its index row records (``xxh3``,
    :mod:`packer.shards.checksum`): its shard changed after the build, and what the report shows
    of it is not what was packed."""

    key: str
    shard: str
    expected: int
    found: int

    def describe(self) -> str:
        return (f"{self.shard} [{self.key}]: xxh3 {describe_checksum(self.found)}, _index.parquet records "
                f"{describe_checksum(self.expected)}")


def damaged_finding(damaged: list[DamagedSample], checked: int) -> str:
    """The report's finding (and ``packer report``'s warning) about samples that failed their checksum."""
    shown = "; ".join(d.describe() for d in damaged[:10]) + (f"; and {len(damaged) - 10} more"
                                                             if len(damaged) > 10 else "")
    return (f"{len(damaged):,} of the {checked:,} samples this report read fail their checksum: their shard's bytes "
            f"changed after the build (disk, copy or sync damage), so what is shown of them is not what was packed "
            f"({shown}). Run `packer verify` on the version folder to name every damaged shard and sample, then "
            "restore the shards from a good copy or rebuild.")


def unreadable_finding(unreadable: Sequence[tuple[str, str]], selected: int) -> str:
    """The report's finding (and ``packer report``'s warning) about selected samples it could not read."""
    shown = "; ".join(f"{key}: {why}" for key, why in unreadable[:3]) + (f"; and {len(unreadable) - 3} more"
                                                                        if len(unreadable) > 3 else "")
    return (f"{len(unreadable):,} of the {selected:,} samples this report selected could not be read, so it "
            f"neither shows nor counts them ({shown}). Run `packer verify` on the version folder to name every "
            "damaged shard and sample, then restore the shards from a good copy or rebuild.")


@dataclass
class ReportData:
    """Everything the sections render, read once from the version folder."""

    manifest: dict[str, Any]
    folder: Path
    limits: ReportLimits
    splits: list[str]
    kinds: dict[str, str]
    audit: AuditFindings = field(default_factory=AuditFindings)
    warnings: list[str] = field(default_factory=list)
    index_note: str | None = None
    index_size: int = 0
    # index rows of the samples the report names (the selection, every duplicate-group member), by
    # key; not every row: a dict of all of them was most of the report's memory on a large dataset
    entries: dict[str, IndexEntry] = field(default_factory=dict)
    sheets: dict[tuple[str, str], list[SheetItem]] = field(default_factory=dict)
    # per split, samples per contact-sheet group (a multi-label sample counts under each label it holds)
    label_totals: dict[str, Counter[str]] = field(default_factory=dict)
    split_totals: dict[str, int] = field(default_factory=dict)  # samples per split in the index
    # per (split, source, channel count, channel names): samples whose channels mean different
    # things (a CR's replicated file window and a CT's three windows, in one source) never share one
    histograms: dict[tuple[str, str, int, tuple[str, ...]], ChannelHistograms] = field(default_factory=dict)
    histogram_totals: dict[str, tuple[int, int]] = field(default_factory=dict)  # split -> (counted, all)
    duplicate_panes: dict[str, Pane] = field(default_factory=dict)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    bad_records: list[dict[str, Any]] | None = None
    bad_note: str | None = None
    # the files left out on purpose (excluded.jsonl), read only where the manifest counts some
    excluded_records: list[dict[str, Any]] | None = None
    excluded_note: str | None = None
    #: what the build warned of as it ran (warnings.jsonl), shown at the report's top; empty without
    build_warnings: list[BuildWarning] = field(default_factory=list)
    build_warnings_note: str | None = None  # why warnings.jsonl could not be read
    target: Target = field(default_factory=lambda: Target("class"))
    value_histograms: list[ValueHistogram] = field(default_factory=list)  # numeric targets, from the index
    mask: MaskSchema | None = None  # the dataset's masks; None without
    mask_counts: dict[str, MaskCounts] = field(default_factory=dict)  # per split, over the histogram samples
    mask_ids: set[int] = field(default_factory=set)  # class ids in any mask the report read
    #: the samples read whose bytes fail their index row's checksum, in the order read
    damaged: list[DamagedSample] = field(default_factory=list)
    checked: int = 0  # samples read whose checksum was compared with the index's
    selected: int = 0  # samples the report set out to read (histograms, sheets, duplicate groups)

    def describe(self, entry: IndexEntry) -> str:
        """The target of the sample ``entry`` as text: its class name, its labels, its numbers."""
        return self.target.describe(entry.label, None if entry.target is None else np.asarray(entry.target))


def ordered_splits(manifest: dict[str, Any]) -> list[str]:
    names = list(manifest.get("splits", {}))
    return sorted(names, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else len(SPLIT_ORDER), s))


def _first_per_group(ranked: np.ndarray, group: np.ndarray, limit: int) -> np.ndarray:
    """The rows of ``ranked`` (row numbers, best first) that are among the first ``limit`` of their
    ``group`` (a code per row), still best first."""
    groups = group[ranked]
    by_group = np.argsort(groups, kind="stable")  # rank order kept inside each group
    grouped = groups[by_group]
    keep = np.zeros(len(ranked), dtype=bool)
    keep[by_group] = np.arange(len(ranked)) - np.searchsorted(grouped, grouped) < limit  # place within the group
    return ranked[keep]


def _select(index: SampleIndex, data: ReportData) -> tuple[set[str], dict[tuple[str, str], list[str]]]:
    """Histogram keys (first N per split) and contact-sheet keys (first M per split and group, as
    the target kind groups them: :meth:`~packer.targets.Target.sheet_groups`).

    "First" is the order of ``selection_rank``; groups count per split into ``data.label_totals``
    in the order they first occur in the index (``most_common`` breaks ties by it), samples per
    split into ``data.split_totals``. Works on per-row codes, so only the selected keys become
    Python objects.
    """
    limits = data.limits
    ranked = index.rank_order(str(data.manifest.get("dataset_hash", "")))  # first: its peak is the largest
    split_code, split_names = index.codes("split")
    member_rows, group_code, group_names = data.target.sheet_groups(index, NO_LABEL)
    width = len(group_names)
    member_split = split_code if member_rows is None else split_code[member_rows]
    pairs, first, pair_of_member, counts = np.unique(member_split * width + group_code, return_index=True,
                                                     return_inverse=True, return_counts=True)
    del group_code, member_split
    pair_cells = [(split_names[pair // width], group_names[pair % width]) for pair in pairs.tolist()]
    for p in np.argsort(first, kind="stable").tolist():
        split, label = pair_cells[p]
        data.label_totals.setdefault(split, Counter())[label] += int(counts[p])
    shown = [(split, name) for split, totals in data.label_totals.items()
             for name, _ in totals.most_common(limits.labels_per_split)]
    number = {cell: i for i, cell in enumerate(shown)}
    cell_of_pair = np.array([number.get(cell, -1) for cell in pair_cells], dtype=np.int64)  # -1: no sheet
    histogram = set(index.keys_at(_first_per_group(ranked, split_code, limits.histogram_samples)))
    cell_of_member = cell_of_pair[pair_of_member]
    if member_rows is None:
        ranked_members = ranked
    else:  # a row's members in the row's rank, in member order among themselves
        rank_of_row = np.empty(len(ranked), dtype=np.int64)
        rank_of_row[ranked] = np.arange(len(ranked))
        ranked_members = np.argsort(rank_of_row[member_rows], kind="stable")
    sheet_members = _first_per_group(ranked_members[cell_of_member[ranked_members] >= 0], cell_of_member,
                                     limits.per_sheet)
    sheet_rows = sheet_members if member_rows is None else member_rows[sheet_members]
    sheets: dict[tuple[str, str], list[str]] = defaultdict(list)
    for cell, key in zip(cell_of_member[sheet_members].tolist(), index.keys_at(sheet_rows), strict=True):
        sheets[shown[cell]].append(key)
    splits, split_first, split_counts = np.unique(split_code, return_index=True, return_counts=True)
    data.split_totals = {split_names[splits[i]]: int(split_counts[i])
                         for i in np.argsort(split_first, kind="stable").tolist()}
    data.histogram_totals = {split: (min(limits.histogram_samples, total), total)
                             for split, total in data.split_totals.items()}
    return histogram, dict(sheets)


def collect_report_data(folder: Path, manifest: dict[str, Any], limits: ReportLimits,
                        warnings: list[str] | None = None, *, quiet: bool = False) -> ReportData:
    """Read the index, the selected samples and the bad-sample report of a version folder. A
    long read shows a ``report`` progress line (samples read and drawn) unless ``quiet``."""
    config = manifest.get("config", {})
    data = ReportData(
        manifest=manifest, folder=folder, limits=limits, splits=ordered_splits(manifest),
        kinds={str(s.get("name")): str(s.get("kind")) for s in config.get("sources", []) if isinstance(s, dict)},
        audit=read_audit(manifest, folder), warnings=list(warnings or []), target=_target(manifest),
        mask=MaskSchema.of_manifest(manifest))
    index, data.index_note = load_index(folder, manifest)
    data.index_size = len(index)
    histogram_keys, sheet_keys = _select(index, data)
    if data.target.value_names():  # numbers, drawn as histograms (numeric targets)
        split_code, split_names = index.codes("split")
        data.value_histograms = value_histograms(data.target.value_names(), index.vectors(len(data.target.names)),
                                                 split_code, split_names)
    on_sheets = {key for keys in sheet_keys.values() for key in keys}
    members = {m.key for g in data.audit.groups for m in g.members}
    data.entries = index.entries(histogram_keys | on_sheets | members)
    del index  # the columns are not needed past this point
    data.audit.groups = [_locate(g, data.entries) for g in data.audit.groups]
    duplicate_keys = {m.key for g in data.audit.groups[: limits.duplicate_thumbs]
                      for m in g.members[: limits.group_members]} & data.entries.keys()
    wanted = histogram_keys | on_sheets | duplicate_keys
    items: dict[str, SheetItem] = {}
    kinds, px = data.kinds, limits.thumb_px
    masked, pad = data.mask is not None, data.mask.pad_only if data.mask is not None else None

    def render(result: PackedSample | tuple[IndexEntry, str]) -> _Rendered | tuple[IndexEntry, str]:
        if not isinstance(result, PackedSample):
            return result
        try:  # the one boundary: a sample an edited shard made undrawable is listed as unreadable
            return _render(result, kinds, px, counted=result.entry.key in histogram_keys,
                           sheet=result.entry.key in on_sheets, duplicate=result.entry.key in duplicate_keys,
                           masked=masked, pad=pad)
        except (ValueError, TypeError) as err:
            return result.entry, f"{result.entry.shard}: cannot be drawn ({type(err).__name__}: {err})"

    data.selected = len(wanted)
    samples = read_samples(folder, (data.entries[k] for k in sorted(wanted)))
    with stage_progress("report", len(wanted), unit="samples", quiet=quiet) as progress:
        for rendered in _ordered_map(render, samples, workers=os.cpu_count() or 1):
            progress.update()
            if not isinstance(rendered, _Rendered):
                data.unreadable.append((rendered[0].key, rendered[1]))
                continue
            _add_rendered(data, rendered, items)
    data.sheets = {cell: [items[k] for k in keys if k in items] for cell, keys in sheet_keys.items()}
    for key, _ in data.unreadable:  # the histograms count what was read: "counted: train 12 of 12" drew 11
        if key in histogram_keys and data.entries[key].split in data.histogram_totals:
            counted, total = data.histogram_totals[data.entries[key].split]
            data.histogram_totals[data.entries[key].split] = (counted - 1, total)
    if data.unreadable:
        data.warnings.insert(0, unreadable_finding(data.unreadable, data.selected))
    if data.damaged:  # above everything else: the pixels below are not all what was packed
        data.warnings.insert(0, damaged_finding(data.damaged, data.checked))
    data.bad_records, data.bad_note = _bad_records(folder, manifest)
    if (manifest.get("inputs") or {}).get("excluded"):
        data.excluded_records, data.excluded_note = _excluded_records(folder)
    data.build_warnings, data.build_warnings_note = _build_warnings(folder)
    return data


def _build_warnings(folder: Path) -> tuple[list[BuildWarning], str | None]:
    """The warnings the build printed (``warnings.jsonl``, written only where there were some)."""
    try:
        return read_warnings(folder / WARNINGS_FILE), None
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError) as err:
        return [], f"{WARNINGS_FILE}, the warnings the build printed, could not be read: {err}"


def _target(manifest: dict[str, Any]) -> Target:
    """The manifest's target; a class target when its ``target`` record is not one this packer
    knows (the report still shows what it can, under the manifest's warning)."""
    try:
        return Target.of_manifest(manifest)
    except (ValueError, KeyError, TypeError):
        return Target.of_manifest({"label_map": manifest.get("label_map", {})})


def _locate(group: DuplicateGroup, by_key: Mapping[str, IndexEntry]) -> DuplicateGroup:
    """Fill split and entity of duplicate members named by key only, from the index."""
    members = tuple(m if m.split or m.key not in by_key else
                    Member(key=m.key, split=by_key[m.key].split, entity_id=m.entity_id or by_key[m.key].entity_id)
                    for m in group.members)
    return dataclasses.replace(group, members=members)


@dataclass(frozen=True)
class _Rendered:
    """What the report keeps of one sample: its histogram counts and thumbnails, no pixels."""

    entry: IndexEntry
    names: tuple[str, ...]
    channels: int
    dtype: str
    counts: np.ndarray | None
    panes: tuple[Pane, ...] | None
    small: tuple[Pane, ...] | None
    duplicate: Pane | None
    mask_pixels: dict[int, int] | None = None  # pixels per class id of its mask (None: no mask)
    normalised: tuple[tuple[str, dict[str, float]], ...] = ()  # its normalised channels' statistics
    checksum: int | None = None  # its bytes' checksum as read (None: the index records none to compare)


def _render(sample: PackedSample, kinds: dict[str, str], thumb_px: int, *, counted: bool, sheet: bool,
            duplicate: bool, masked: bool = False, pad: int | None = None) -> _Rendered:
    """Histogram counts, thumbnails and, ``masked`` (the manifest records masks), mask counts and
    overlays of one sample: pure, and mostly OpenCV and numpy calls that release the GIL, so
    samples render on a thread pool. ValueError where its image is not numbers in a shape packer
    writes (an edited shard)."""
    entry = sample.entry
    if sample.image.dtype.kind not in "buif" or sample.image.ndim not in (2, 3, 4):
        raise ValueError(f"its image is {sample.image.dtype} {list(sample.image.shape)}; packer packs numbers "
                         "in H×W, C×H×W or C×D×H×W")
    kind = str(sample.info.get("kind") or kinds.get(entry.source, ""))
    chw = as_chw(sample.image)
    mask = sample.mask if masked and sample.mask is not None and sample.mask.ndim == 3 and len(sample.mask) else None
    frame = None  # the sheets show frame 0 of an F×H×W mask, a volume's label map in its three middle planes
    if mask is not None:
        frame = as_chw(mask[None])[0] if sample.image.ndim == 4 else mask[0]
    panes = small = None
    if sheet:
        panes = tuple(sample_panes(chw, sample.info, kind, thumb_px, mask=frame, pad=pad))
        small_px = min(SMALL_PX, thumb_px // 2)
        small = panes if max(chw.shape[1:]) <= small_px else tuple(sample_panes(chw, sample.info, kind, small_px,
                                                                                 mask=frame, pad=pad))
    shown = composite_pane(chw, thumb_px, sample.info) if duplicate else None
    names = tuple(channel_names(sample.info, kind, chw.shape[0]))
    return _Rendered(entry=entry, names=names, channels=chw.shape[0],
                     dtype=str(sample.image.dtype), counts=channel_counts(sample.image) if counted else None,
                     panes=panes, small=small, duplicate=shown,
                     mask_pixels=mask_pixel_counts(mask) if mask is not None and (counted or sheet) else None,
                     normalised=tuple(normalisation_stats(sample.info, names)) if counted else (),
                     checksum=sample.checksum)


def _mask_caption(pixels: dict[int, int], data: ReportData) -> str:
    """The class ids a mask holds, as its thumbnail's hover text says them: the id ``fit`` pads
    with, where it is no class (:attr:`MaskSchema.pad_only`), is none of them, so a mask of 0 and
    padding only is empty, as the splits table counts it (:class:`~packer.htmlreport.stats.MaskCounts`);
    the pad is named after the classes. A pad id that is a named class is that class."""
    pad = data.mask.pad_only if data.mask is not None else None
    padded = bool(pad) and pad in pixels
    classes = ", ".join(str(i) for i in sorted(pixels) if i and i != pad)
    if not classes:
        return f"empty (0 and pad {pad})" if padded else "empty (all 0)"
    return f"{classes} (and pad {pad})" if padded else classes


def _add_rendered(data: ReportData, rendered: _Rendered, items: dict[str, SheetItem]) -> None:
    entry = rendered.entry
    damaged = None
    if rendered.checksum is not None and entry.xxh3 is not None:
        data.checked += 1
        if rendered.checksum != entry.xxh3:
            found = DamagedSample(key=entry.key, shard=entry.shard, expected=entry.xxh3, found=rendered.checksum)
            data.damaged.append(found)
            damaged = (f"fails its checksum (xxh3 {describe_checksum(found.found)}, _index.parquet records "
                       f"{describe_checksum(found.expected)}): not what was packed; run `packer verify`")
    if rendered.counts is not None:
        slot = (entry.split, entry.source, rendered.channels, rendered.names)
        if slot not in data.histograms:
            data.histograms[slot] = ChannelHistograms.empty(list(rendered.names))
        data.histograms[slot].add_counts(rendered.counts, rendered.dtype, rendered.normalised)
        if rendered.mask_pixels is not None:
            pad = data.mask.pad_only if data.mask is not None else None
            data.mask_counts.setdefault(entry.split, MaskCounts()).add(rendered.mask_pixels, pad)
    if rendered.mask_pixels is not None:
        data.mask_ids.update(rendered.mask_pixels)
    if rendered.panes is not None and rendered.small is not None:
        held = None if rendered.mask_pixels is None else _mask_caption(rendered.mask_pixels, data)
        items[entry.key] = SheetItem(key=entry.key, label=data.describe(entry), entity_id=entry.entity_id,
                                     source=entry.source, channels=rendered.names, panes=rendered.panes,
                                     small=rendered.small, mask=held, damaged=damaged)
    if rendered.duplicate is not None:
        data.duplicate_panes[entry.key] = rendered.duplicate


def _ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads, in order, with at most ``4 × workers`` items
    in flight (the items are decoded samples: an unbounded map would hold them all)."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="packer-report") as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _excluded_records(folder: Path) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        return list(read_excluded(folder / EXCLUDED_FILE)), None
    except FileNotFoundError:
        return None, f"{EXCLUDED_FILE} is missing from the version folder"
    except (OSError, ValueError) as err:
        return None, f"{EXCLUDED_FILE} could not be read: {err}"


def _bad_records(folder: Path, manifest: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str | None]:
    name = manifest.get("bad_samples", {}).get("report", REPORT_FILE)
    path = folder / name
    try:
        return list(read_bad_samples(path)), None
    except FileNotFoundError:
        return None, f"{name} is missing from the version folder"
    except (OSError, ValueError) as err:
        return None, f"{name} could not be read: {err}"
