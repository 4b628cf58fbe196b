"""Read-only views of built datasets: what a version holds (``inspect``), how two versions
differ (``diff``: samples, then shards reused, new and removed) and which versions a registry
folder keeps (``ls``; a dataset folder's versions are :mod:`packer.versions`').

Everything here reads manifests through :func:`packer.manifest.read_manifest` (strict), so an
edited or damaged manifest raises IntegrityError (exit 5) instead of being summarised. ``diff``
also reads each version's ``_index.parquet`` (after checking its sha256 against the
manifest) to compare samples by key, per-sample sha256 and target; across formats it reads
the Parquet side's pixels to hash them as the tar side's index does (:func:`as_tar_digests`).

Each view follows the dataset's target kind (:mod:`packer.targets`): class counts for a class
target, samples holding each label for multi-label, min/mean/max for numeric targets, nothing
for an unlabeled dataset. ``inspect`` also says whether the samples carry segmentation masks
(the manifest's ``mask``: dtype, declared class ids, pad id).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict, deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from packer.badsamples import failed_build
from packer.config import SPLITS
from packer.errors import ConfigError, IntegrityError
from packer.files import TMP_SUFFIX, arrow_readable, file_sha256, human_bytes
from packer.manifest import Manifest, read_manifest
from packer.targets import Target, TargetValues

DEFAULT_REGISTRY = Path("manifests")
#: How a shard of two versions compares (:class:`ShardChange`), in the order ``diff`` lists them.
SHARD_KINDS = ("reused", "new", "removed")


def inspect_dataset(manifest_path: str | Path, *, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Summarise the manifest at ``manifest_path`` (file or version folder, a path or a URL read
    with ``storage_options``) as a stable dict.

    Raises IntegrityError when the manifest is unreadable, breaks the schema or fails its hash.
    """
    manifest = read_manifest(manifest_path, storage_options=storage_options)
    splits_table = manifest.path.parent / SPLITS_TABLE if manifest.path is not None else None
    return {"manifest": manifest.location, **summarize_manifest(manifest.data, splits_table)}


#: The version folder's table of every sample's split and entity
SPLITS_TABLE = "_splits.parquet"


def total_entities(manifest: Mapping[str, Any], splits_table: Path | None = None) -> int | None:
    """The dataset's distinct entities: the splits' sum where no entity has samples in two of them
    (the audit's ``entity_overlap`` found none: every split the build makes), else counted in the
    version's ``splits_table`` (a given split whose leaks were accepted); None where that is not
    at hand (a registry copy, a URL)."""
    splits = manifest.get("splits") or {}
    summed = sum(int(entry.get("entities", 0)) for entry in splits.values() if isinstance(entry, Mapping))
    overlap = ((manifest.get("audit") or {}).get("rules") or {}).get("entity_overlap") or {}
    if not overlap.get("count"):
        return summed
    if splits_table is None or not splits_table.is_file():
        return None
    import pyarrow.compute as pc  # only here: its import builds every compute function (0.1 s)

    with arrow_readable(splits_table) as source:
        entities = pq.read_table(source, columns=["entity_id"]).column("entity_id")
    return len(pc.unique(entities.drop_null()))


def _size_stats(sizes: list[int]) -> dict[str, int] | None:
    if not sizes:
        return None
    return {"min": min(sizes), "median": int(statistics.median(sizes)), "max": max(sizes)}


def summarize_manifest(manifest: dict[str, Any], splits_table: Path | None = None) -> dict[str, Any]:
    """The numbers ``packer inspect`` shows, taken from a loaded manifest (no file access, but
    for the distinct entities of a split with accepted leaks: :func:`total_entities` reads
    ``splits_table`` then; totals.entities is None where it is not given).

    Keys: name, version, dataset_hash, created_at, format, format_version, packer_version,
    libraries, decoders, label_map, target (kind and names, :meth:`Target.to_json`),
    mask (the manifest's mask record: dtype, classes, layout and pad; None without masks),
    sample_schema, splits (per split samples, entities, shards, bytes, shard_bytes
    min/median/max, classes count/percent: per class of all samples, per multi-label label of
    the samples holding it; numeric targets add target_stats min/mean/max per name), totals,
    inputs, bad_samples, audit (passed + the manifest's audit record), config_hash, config,
    phi (mode, dates and the key's fingerprint; None in a manifest without one), failed (why
    the build failed, :func:`~packer.badsamples.failed_build`'s text, as ``packer ls --json``
    gives it: bad samples over ``max_bad_fraction``, a version kept for its report and not to
    train on; None for a good version).
    """
    target = Target.of_manifest(manifest)
    splits: dict[str, Any] = {}
    all_sizes: list[int] = []
    entries = [(split, manifest["splits"][split]) for split in SPLITS if split in manifest["splits"]]
    for split, entry in entries:
        sizes = [shard["bytes"] for shard in entry["shards"]]
        all_sizes += sizes
        splits[split] = {"samples": entry["samples"], "entities": entry["entities"], "shards": len(sizes),
                         "bytes": sum(sizes), "shard_bytes": _size_stats(sizes), **target.summarize_split(entry)}
    bad = manifest["bad_samples"]
    audit = manifest["audit"]
    totals: dict[str, Any] = {"samples": sum(s["samples"] for s in splits.values()),
                              "entities": total_entities(manifest, splits_table),
                              "shards": len(all_sizes), "bytes": sum(all_sizes), "shard_bytes": _size_stats(all_sizes),
                              **target.summarize_total([entry for _, entry in entries])}
    return {
        "name": manifest["name"], "version": manifest["version"], "dataset_hash": manifest["dataset_hash"],
        "created_at": manifest["created_at"], "format": manifest["format"],
        "format_version": manifest["format_version"], "packer_version": manifest["packer_version"],
        "libraries": manifest["libraries"], "decoders": manifest["decoders"], "label_map": manifest["label_map"],
        "target": target.to_json(), "mask": manifest.get("mask"), "sample_schema": manifest["sample_schema"],
        "splits": splits,
        "totals": totals,
        "inputs": manifest["inputs"],
        "bad_samples": {k: bad[k] for k in ("total", "fraction", "max_fraction", "by_reason", "by_stage")},
        "audit": {"passed": audit.get("passed") if isinstance(audit.get("passed"), bool) else None,
                  "record": audit},
        "config_hash": manifest["config_hash"], "config": manifest["config"],
        "phi": manifest.get("phi"),
        "failed": failed_build(manifest),
    }


def _phi_lines(phi: dict[str, Any] | None) -> list[str]:
    """How ids were kept: the PHI mode and, pseudonymized, the key's fingerprint (a rebuild that
    should give the same version needs the key with that fingerprint)."""
    if not phi:
        return []
    key = f"; key fingerprint {phi['key_fingerprint']}" if phi.get("key_fingerprint") else ""
    return [f"  phi           {phi.get('mode')}, dates {phi.get('dates')}{key}"]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as ``{"a.b[0].c": leaf}`` (empty dicts and lists are leaves)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return "+".join(str(v["name"]) for v in value)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _compact(value: Any, prefix: str = "") -> str:
    """One-line rendering of a config section: its non-null leaves as ``path=value``."""
    if not isinstance(value, dict):
        return _scalar(value)
    parts = []
    for key in sorted(value):
        item = value[key]
        if isinstance(item, dict) and item:
            parts.append(_compact(item, f"{prefix}{key}."))
        elif item is not None:
            parts.append(f"{prefix}{key}={_scalar(item)}")
    return " ".join(p for p in parts if p and p != "-") or "-"


#: The audit rules a manifest records only where they found something, and what they find.
_RECORDED_WHEN_FOUND = {"label_conflicts": "a group of copies conflicts",
                        "entity_lookalikes": "entity ids differ only in case, spacing or leading zeros"}


def _audit_lines(audit: dict[str, Any]) -> list[str]:
    passed = audit.get("passed")
    lines = [f"  audit         {'passed' if passed is True else 'FAILED' if passed is False else 'recorded'}"]
    rules = audit.get("rules")
    if isinstance(rules, dict):
        for rule, result in sorted(rules.items()):
            if isinstance(result, dict):
                # a report-only rule with findings (duplicates within a split, copies spanning
                # entities) did not fail the audit: "reported", as packer validate's "note"
                status = ("passed" if result.get("passed") else
                          "FAILED" if result.get("severity") == "fail" else "reported")
                lines.append(f"    {rule:<32} {status:<8} count {result.get('count', '-')} "
                             f"({result.get('severity', '-')})")
        for rule, found in _RECORDED_WHEN_FOUND.items():  # kept out of a manifest without findings, so its
            if rule not in rules:                          # hash stays as it was before the rule
                lines.append(f"    {rule:<32} none recorded: the manifest holds this rule only where {found} "
                             "(leakage.json lists it either way)")
    for key, value in sorted(audit.items()):
        if key not in ("passed", "rules"):
            lines.append(f"    {key:<32} {_compact(value)}")
    return lines


def _left_out(inputs: dict[str, Any]) -> str:
    """The input files left out on purpose by why (``excluded.jsonl`` lists them), where there
    are some: with the bad samples they account for every input file that made no sample."""
    by_why = inputs.get("excluded") or {}
    if not by_why:
        return ""
    total = sum(int(n) for n in by_why.values())
    return (f"; {total} files left out on purpose ({', '.join(f'{k} {v}' for k, v in sorted(by_why.items()))}; "
            "not bad samples, listed in excluded.jsonl)")


def _mask_line(mask: dict[str, Any], fmt: str) -> str:
    """What ``inspect`` says of a dataset's masks: dtype, layout, where they are, declared class
    ids, pad id."""
    classes = mask.get("classes")
    names: dict[str, Any] = mask["names"] if isinstance(mask.get("names"), dict) else {}
    named = [f"{c} {names[str(c)]['name']}" if isinstance(names.get(str(c)), dict) else str(c)
             for c in classes] if isinstance(classes, list) else []
    declared = "classes " + ", ".join(named) if isinstance(classes, list) else "classes not declared (any id)"
    pad = f"; fit pads with {mask['pad']}" if mask.get("pad") else ""
    where = "mask columns" if fmt == "parquet" else "<key>.mask.npy"
    return f"{mask.get('dtype', '?')} {mask.get('layout', 'FHW')}, one per sample ({where}); {declared} " \
           f"(0 background){pad}"


def format_summary(summary: dict[str, Any]) -> str:
    """The text ``packer inspect`` prints for a :func:`summarize_manifest` dict."""
    libs = ", ".join(f"{k} {v}" for k, v in sorted(summary["libraries"].items()) if k != "packer")
    by_decoder = Counter(summary["decoders"].values())
    schema = summary["sample_schema"]
    dtypes = schema.get("dtypes") or {}  # each source's, where they differ
    shapes = "; ".join(f"{src} {', '.join(map(str, s))}" + (f" {'/'.join(dtypes[src])}" if src in dtypes else "")
                       for src, s in sorted(schema["shapes"].items()))
    target = Target.of_json(summary.get("target") or {"kind": "class"})
    lines = [
        f"dataset {summary['name']} version {summary['version']}",
        f"  dataset_hash  {summary['dataset_hash']}",
        f"  created_at    {summary['created_at']}",
        f"  format        {summary['format']} (format_version {summary['format_version']})",
        f"  packer        {summary['packer_version']}; {libs}",
        "  decoders      " + (", ".join(f"{d} ({n} transfer syntaxes)" for d, n in sorted(by_decoder.items())) or "-"),
        (f"  samples       {schema['dtype'] or 'mixed dtypes'} {schema['layout']}; {shapes or '-'}"
         if schema["shapes"] else "  samples       none: the dataset has no samples (every input bad or left out)"),
        f"  target        {target.inspect_line(summary['label_map'])}",
        *([f"  masks         {_mask_line(summary['mask'], summary['format'])}"]
          if isinstance(summary.get("mask"), dict) else []),
        "",
        f"  {'split':<7}{'samples':>8}{'entities':>10}{'shards':>8}{'bytes':>12}   {target.inspect_heading}",
    ]
    rows = [*summary["splits"].items(), ("total", summary["totals"])]
    for split, entry in rows:
        entities = "?" if entry["entities"] is None else entry["entities"]  # in several splits, not counted here
        lines.append(f"  {split:<7}{entry['samples']:>8}{entities:>10}{entry['shards']:>8}"
                     f"{human_bytes(entry['bytes']):>12}   {target.inspect_cells(entry)}")
    sizes = summary["totals"]["shard_bytes"]
    if sizes:
        lines.append(f"  shard size    min {human_bytes(sizes['min'])}  median {human_bytes(sizes['median'])}  "
                     f"max {human_bytes(sizes['max'])}")
    bad = summary["bad_samples"]
    failed = failed_build(summary)  # the one wording ls, gc and the loader use too
    reasons = ", ".join(f"{k} {v}" for k, v in bad["by_reason"].items()) or "none"
    lines += [
        f"  inputs        {summary['inputs']['files']} files -> {summary['inputs']['samples']} samples"
        f"{_left_out(summary['inputs'])}",
        f"  bad samples   {bad['total']} ({bad['fraction']:.1%}, "
        f"{'OVER the' if failed is not None else 'within'} limit {bad['max_fraction']:.1%}): {reasons}",
        *([f"  FAILED BUILD  {failed}; fix the files or raise validate.max_bad_fraction, and build again"]
          if failed is not None else []),
        *_audit_lines(summary["audit"]["record"]),
        *_phi_lines(summary.get("phi")),
        f"  config        {summary['config_hash'][:16]}…",
    ]
    for section, value in summary["config"].items():
        if section == "name":
            continue
        if section == "sources" and isinstance(value, list):
            lines += [f"    {'source':<18}{s.get('name', '?')}: {s.get('kind', '?')} {s.get('root', '?')}"
                      for s in value if isinstance(s, dict)]
        elif isinstance(value, dict) and value and all(isinstance(v, dict | None) for v in value.values()):
            lines += [f"    {section + '.' + part:<18}{_compact(sub)}" for part, sub in value.items()]
        else:
            lines.append(f"    {section:<18}{_compact(value)}")
    return "\n".join(lines)


# -- diff -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleChange:
    """One sample present in either version: where it was and where it is (None: absent).

    ``old_label``/``new_label``: its target as text (the class name, the labels held, the numbers;
    :meth:`Target.describe`); ``old_target``/``new_target``: a multi-label or numeric sample's values.
    """

    key: str
    old_split: str | None
    new_split: str | None
    old_label: str | None
    new_label: str | None
    old_target: TargetValues | None = None
    new_target: TargetValues | None = None
    #: a sample of the ``rekeyed`` list (:func:`pair_by_content`): its key in the old version
    #: (``key`` is the new one), and its entity in the new version where ``_splits.parquet`` says
    old_key: str | None = None
    new_entity: str | None = None

    @property
    def split_changed(self) -> bool:
        """A sample of both versions in another split (a rekeyed one's split drawn afresh)."""
        return self.old_split is not None and self.new_split is not None and self.old_split != self.new_split

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "old_split": self.old_split, "new_split": self.new_split,
                               "old_label": self.old_label, "new_label": self.new_label}
        if self.old_key is not None:
            out.update(old_key=self.old_key, new_entity=self.new_entity, split_changed=self.split_changed)
        if self.old_target is not None or self.new_target is not None:
            out["old_target"] = None if self.old_target is None else dict(self.old_target)
            out["new_target"] = None if self.new_target is None else dict(self.new_target)
        return out

    def target_of(self, side: str) -> tuple[str | None, TargetValues | None]:
        """(text, values) of the sample's target in the ``old`` or ``new`` version."""
        return getattr(self, f"{side}_label"), getattr(self, f"{side}_target")


@dataclass(frozen=True)
class ValueChange:
    """One key path whose value differs; ``change`` is added, removed or changed."""

    path: str
    change: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class ShardChange:
    """One shard of either version, matched by content (the manifests' sha256).

    ``kind``: ``reused`` (the same bytes are a shard of both versions), ``new`` (only in NEW) or
    ``removed`` (only in OLD). ``split``, ``file``, ``bytes``: the shard in NEW (in OLD for a removed
    one); ``old_file``: a reused shard's file in OLD. ``same_inode``: whether a reused shard's two
    files are one file on disk (hard-linked, stored once) or separate copies; None when that could
    not be checked (a registry copy, a file missing).
    """

    kind: str
    split: str
    file: str
    bytes: int
    sha256: str
    old_file: str | None = None
    same_inode: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"split": self.split, "file": self.file, "bytes": self.bytes, "sha256": self.sha256}
        if self.kind == "reused":
            out.update(old_file=self.old_file, same_inode=self.same_inode)
        return out


@dataclass(frozen=True)
class DatasetDiff:
    """What changed from ``old`` to ``new``. Sample lists are sorted by key.

    ``changed``: same key, different per-sample sha256 (only when ``content_compared``);
    ``moved``: same key, different split; ``relabeled``: same key, different target (class name,
    set of labels held, numbers); ``record_changed``: same key, pixels, target and split, but other
    packed bytes differ (the JSON record: entity, time, table cells; a mask), found by the index's
    ``xxh3`` over all of a sample's packed bytes (only when both versions have one format and
    both indexes an ``xxh3`` column).
    ``rekeyed``: a removed and an added sample with the same per-sample sha256, paired
    (:func:`pair_by_content`) and in neither ``removed`` nor ``added``: the same bytes under a new
    key (a file moved to another class folder, renamed), whose split was drawn afresh.
    ``samples_compared`` is False when an ``_index.parquet`` was not available (``notes`` says why);
    ``content_compared`` whether the per-sample sha256s were compared: never without the samples.
    ``inputs``: the input files, samples, files left out on purpose (by why) and bad samples (in
    all and by reason) whose counts differ (:func:`diff_inputs`): new rows refused as bad samples
    change no sample, yet the versions differ. ``hash_fields``: where the dataset_hashes differ,
    the manifest fields that differ (those the hash covers); empty where the hashes agree.
    ``target``: the versions' target; None when their kinds differ (then no sample counts as
    relabeled; ``notes`` says so). ``shards``: every shard of either version, matched by sha256
    (:class:`ShardChange`).
    """

    old: dict[str, Any]
    new: dict[str, Any]
    samples_compared: bool
    content_compared: bool
    added: tuple[SampleChange, ...]
    removed: tuple[SampleChange, ...]
    changed: tuple[SampleChange, ...]
    moved: tuple[SampleChange, ...]
    relabeled: tuple[SampleChange, ...]
    config: tuple[ValueChange, ...]
    versions: tuple[ValueChange, ...]
    notes: tuple[str, ...]
    target: Target | None = field(default_factory=lambda: Target("class"))
    shards: tuple[ShardChange, ...] = ()
    record_changed: tuple[SampleChange, ...] = ()
    inputs: tuple[ValueChange, ...] = ()
    hash_fields: tuple[str, ...] = ()
    rekeyed: tuple[SampleChange, ...] = ()

    @property
    def hash_differs(self) -> bool:
        return self.old.get("dataset_hash") != self.new.get("dataset_hash")

    @property
    def listed(self) -> bool:
        """Some list here names a difference: samples, shards, input counts, config or versions."""
        return bool(self.added or self.removed or self.changed or self.moved or self.relabeled or self.rekeyed
                    or self.record_changed or self.config or self.inputs or self.versions
                    or any(c.kind != "reused" for c in self.shards))

    @property
    def empty(self) -> bool:
        """Nothing differs: never where the dataset_hashes do, whether or not a list names why."""
        return not (self.listed or self.hash_differs)

    @property
    def unexplained(self) -> bool:
        """The dataset_hashes differ but no list here says how: only ``hash_fields`` does."""
        return self.hash_differs and not self.listed

    def shards_of(self, kind: str) -> tuple[ShardChange, ...]:
        """The shards of one ``kind`` (reused, new, removed), in manifest order."""
        return tuple(c for c in self.shards if c.kind == kind)

    def shard_counts(self) -> dict[str, dict[str, int]]:
        """Per kind (reused, new, removed): shards and bytes; ``linked``: the reused shards whose two
        files are one inode (stored once), ``copied``: those stored twice."""
        out = {kind: {"shards": len(items), "bytes": sum(c.bytes for c in items)}
               for kind in SHARD_KINDS for items in [self.shards_of(kind)]}
        for name, same in (("linked", True), ("copied", False)):
            items = tuple(c for c in self.shards_of("reused") if c.same_inode is same)
            out[name] = {"shards": len(items), "bytes": sum(c.bytes for c in items)}
        return out

    def by_split(self) -> dict[str, dict[str, int]]:
        """Per split: added, removed, changed and relabeled (counted where the sample is now),
        moved_in, moved_out; rekeyed_in and rekeyed_out (:attr:`rekeyed`: where the bytes are
        now, where they were)."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for kind, items, side in (("added", self.added, "new"), ("removed", self.removed, "old"),
                                  ("changed", self.changed, "new"), ("relabeled", self.relabeled, "new")):
            for item in items:
                out[str(getattr(item, f"{side}_split"))][kind] += 1
        for item in self.moved:
            out[str(item.new_split)]["moved_in"] += 1
            out[str(item.old_split)]["moved_out"] += 1
        for item in self.rekeyed:
            out[str(item.new_split)]["rekeyed_in"] += 1
            out[str(item.old_split)]["rekeyed_out"] += 1
        return {split: dict(sorted(out[split].items())) for split in sorted(out, key=_split_order)}

    def by_label(self) -> dict[str, dict[str, int]]:
        """Per label name: added, removed, changed, relabeled_in, relabeled_out.

        The target kind says under which names a sample counts (:meth:`Target.diff_names`,
        :meth:`Target.relabel_counts`). class: by the sample's class. multilabel: a sample counts
        under each label it holds (``(none)`` when none); relabeled_in counts the samples that
        gained the label, relabeled_out those that lost it, ignored_in those where it became
        ignored (masked out, under ``uncertain: ignore``), ignored_out those where it no longer is.
        numeric: per target name, ``relabeled`` counts the samples whose value of it changed.
        A rekeyed sample (:attr:`rekeyed`) counts as a relabeled one where its target changed.
        Empty for unlabeled datasets and mixed kinds.
        """
        out: dict[str, Counter[str]] = defaultdict(Counter)
        if self.target is None:
            return {}
        for change, items, side in (("added", self.added, "new"), ("removed", self.removed, "old"),
                                    ("changed", self.changed, "new")):
            for item in items:
                for name in self.target.diff_names(*item.target_of(side)):
                    out[name][change] += 1
        for item in self.relabeled:
            for name, column in self.target.relabel_counts(item.target_of("old"), item.target_of("new")):
                out[name][column] += 1
        for item in self.rekeyed:  # the same bytes under a new key (a class folder fixed, or a rename)
            if not self.target.relabeled(item.target_of("old"), item.target_of("new")):
                continue  # renamed within its class: no relabel
            for name, column in self.target.relabel_counts(item.target_of("old"), item.target_of("new")):
                out[name][column] += 1
        return {label: dict(sorted(out[label].items())) for label in sorted(out)}

    def to_json(self) -> dict[str, Any]:
        """A stable, JSON-ready dict (what ``packer diff --json`` prints)."""
        samples = {name: [c.to_json() for c in getattr(self, name)]
                   for name in SAMPLE_KINDS}
        return {"old": self.old, "new": self.new, "empty": self.empty,
                "samples": {"compared": self.samples_compared, "content_compared": self.content_compared,
                            **samples, "by_split": self.by_split(), "by_label": self.by_label()},
                "shards": {**{kind: [c.to_json() for c in self.shards_of(kind)] for kind in SHARD_KINDS},
                           "counts": self.shard_counts()},
                "inputs": [c.to_json() for c in self.inputs],
                "dataset_hash": {"differs": self.hash_differs, "fields": list(self.hash_fields)},
                "config": [c.to_json() for c in self.config], "versions": [c.to_json() for c in self.versions],
                "notes": list(self.notes)}


def _input_counts(manifest: Mapping[str, Any]) -> dict[str, int]:
    """A manifest's counts of what went in and what came of it, by key path: ``inputs.files``,
    ``inputs.samples``, ``inputs.excluded.<why>``, ``bad_samples.total``,
    ``bad_samples.by_reason.<reason>``."""
    inputs, bad = manifest.get("inputs") or {}, manifest.get("bad_samples") or {}
    return {"inputs.files": int(inputs.get("files", 0)), "inputs.samples": int(inputs.get("samples", 0)),
            **{f"inputs.excluded.{why}": int(n) for why, n in (inputs.get("excluded") or {}).items()},
            "bad_samples.total": int(bad.get("total", 0)),
            **{f"bad_samples.by_reason.{reason}": int(n) for reason, n in (bad.get("by_reason") or {}).items()}}


def diff_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[ValueChange, ...]:
    """The counts of :func:`_input_counts` that differ between two manifests, sorted by path; a
    reason or why one side lacks counts 0 there (``bad_samples.by_reason.unknown_label: 0 -> 6``)."""
    a, b = _input_counts(old), _input_counts(new)
    return tuple(ValueChange(path, "changed", a.get(path, 0), b.get(path, 0))
                 for path in sorted(set(a) | set(b)) if a.get(path, 0) != b.get(path, 0))


def _hash_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """The manifest fields the dataset_hash covers (all but created_at, version and the hash)
    that differ, where the hashes do; empty where they agree."""
    if old.get("dataset_hash") == new.get("dataset_hash"):
        return ()
    return tuple(sorted(key for key in set(old) | set(new)
                        if key not in ("created_at", "version", "dataset_hash") and old.get(key) != new.get(key)))


def _split_order(split: str) -> tuple[int, str]:
    return (SPLITS.index(split) if split in SPLITS else len(SPLITS), split)


def diff_values(old: dict[str, Any], new: dict[str, Any]) -> tuple[ValueChange, ...]:
    """Key-path differences between two nested dicts (leaves as :func:`flatten` names them),
    sorted by path. A list or dict that was empty on one side and is not on the other is one
    change of its whole value (``labels: [] -> ["dog", "cat"]``): flattened, the empty one was a
    leaf that the other side lacked, and ``labels`` read as removed."""
    changes: list[ValueChange] = []
    _diff_into(old, new, "", changes)
    return tuple(sorted(changes, key=lambda c: c.path))


def _diff_into(old: Any, new: Any, prefix: str, changes: list[ValueChange]) -> None:
    def at(key: str | int) -> str:
        return f"{prefix}[{key}]" if isinstance(key, int) else f"{prefix}.{key}" if prefix else str(key)

    if isinstance(old, dict) and isinstance(new, dict) and (old and new or not prefix):  # the top level: by key
        keys: list[Any] = sorted(set(old) | set(new))
    elif isinstance(old, list) and isinstance(new, list) and old and new:
        keys = list(range(max(len(old), len(new))))
    else:
        if old != new:
            changes.append(ValueChange(prefix, "changed", old, new))
        return
    for key in keys:
        here, there = _member(old, key), _member(new, key)
        if there is _ABSENT:
            changes.extend(ValueChange(path, "removed", value, None) for path, value in flatten(here, at(key)).items())
        elif here is _ABSENT:
            changes.extend(ValueChange(path, "added", None, value) for path, value in flatten(there, at(key)).items())
        else:
            _diff_into(here, there, at(key), changes)


#: A key or position one side of a diff lacks
_ABSENT = object()


def _member(container: dict[Any, Any] | list[Any], key: Any) -> Any:
    """``container[key]`` (a dict's key, a list's position), or :data:`_ABSENT` where it has none."""
    if isinstance(container, dict):
        return container.get(key, _ABSENT)
    return container[key] if key < len(container) else _ABSENT


#: The per-sample lists of a :class:`DatasetDiff`, in the order ``packer diff`` shows them.
SAMPLE_KINDS = ("added", "removed", "changed", "moved", "relabeled", "rekeyed", "record_changed")


def read_sample_index(manifest: Manifest, *, target_masks: bool = True) -> dict[str, dict[str, Any]] | None:
    """``_index.parquet`` beside a local ``manifest`` as ``{key: {split, label, target, sha256, xxh3}}``
    (``xxh3`` None where the index has no such column, as an older packer wrote it):
    ``label`` the sample's target as text (class name, labels held, numbers), ``target`` a
    multi-label or numeric sample's :data:`TargetValues` (None for other kinds), read with its
    ``target_mask`` where the index has one and ``target_masks``; None when the file is absent
    from a registry copy. IntegrityError when it is absent from a version folder or does not match
    the manifest's recorded sha256, or when a multi-label or numeric dataset's index has no
    ``target`` column."""
    path = _checked_table(manifest, manifest.data["index"], "every sample's key, split, target and sha256")
    if path is None:
        return None
    target = Target.of_manifest(manifest.data)
    try:
        with arrow_readable(path) as source:
            names = pq.read_schema(source).names
            columns = (["key", "split", "label", "sha256"] + (["target"] if target.has_vector else [])
                       + (["xxh3"] if "xxh3" in names else [])
                       + (["target_mask"] if target_masks and "target_mask" in names else []))
            if target.has_vector and "target" not in names:
                raise IntegrityError(f"{path}: no target column, but the manifest's target kind is {target.kind}; "
                                     f"rebuild the version with this packer")
            rows = pq.read_table(source, columns=columns).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise IntegrityError(f"{path}: unreadable as Parquet ({err}); rebuild the version") from err
    out: dict[str, dict[str, Any]] = {}
    for number, row in enumerate(rows, start=1):
        if not isinstance(row["key"], str) or not isinstance(row["split"], str):  # an edited index: no sample to name
            raise IntegrityError(f"{path}: row {number} has a null key or split; the index is damaged: restore the "
                                 "version from its registry copy or rebuild it")
        label, values = target.index_target(row["label"], row.get("target"), row.get("target_mask"))
        out[row["key"]] = {"split": row["split"], "label": label, "target": values, "sha256": row["sha256"],
                           "xxh3": row.get("xxh3")}
    return out


def _records_target_masks(manifest: Manifest) -> bool | None:
    """Whether a local ``manifest``'s index records its samples' target masks: None where its
    target is masked and its index has no ``target_mask`` column (an older packer wrote it),
    False where the target is not masked or the index is absent (a registry copy)."""
    path = Path(manifest.locate(manifest.data["index"]["file"]))
    if not Target.of_manifest(manifest.data).masked or not path.is_file():
        return False
    try:
        with arrow_readable(path) as source:
            return True if "target_mask" in pq.read_schema(source).names else None
    except (pa.ArrowException, OSError) as err:
        raise IntegrityError(f"{path}: unreadable as Parquet ({err}); rebuild the version") from err


def _checked_table(manifest: Manifest, entry: dict[str, Any], needed: str) -> Path | None:
    """The local table a manifest ``entry`` (``index``, ``splits_table``) names, None where it is
    absent from a registry copy or a manifest alone (:attr:`Manifest.detached`: none of the
    version's files beside it); IntegrityError where it is absent from a version folder (damaged, as ``packer
    verify`` says; ``needed``: what diff reads it for) or does not hold the size and sha256 recorded."""
    path = Path(manifest.locate(entry["file"]))
    if not path.is_file():
        if manifest.detached:
            return None
        raise IntegrityError(f"{path}: not found, though the manifest lists it and this is a version folder, not a "
                             f"registry copy (other files of the version are beside it): the version is damaged and "
                             f"diff reads {needed} from it; restore the "
                             f"file from a good copy or rebuild the version with `packer build` (`packer verify "
                             f"{manifest.folder}` names every problem)")
    if file_sha256(path) != (entry["bytes"], entry["sha256"]):
        raise IntegrityError(f"{path}: does not match the sha256 its manifest records; run `packer verify "
                             f"{manifest.folder}` and rebuild the version")
    return path


#: The columns of ``_splits.parquet`` a sample's record carries besides its split and label: a
#: change in any is a changed record (a time edited under dates: shift is in no shard byte)
_ASSIGNMENT_COLUMNS = ("entity_id", "fold", "time", "days_since_first")


def read_assignment(manifest: Manifest) -> dict[str, tuple[Any, ...]] | None:
    """``_splits.parquet`` beside a local ``manifest`` as ``{key: (entity_id, fold, time,
    days_since_first)}``; None where the manifest names no such table or the file is absent from
    a registry copy. IntegrityError where it is absent from a version folder or does not match the
    manifest's recorded sha256."""
    entry = manifest.data.get("splits_table")
    path = _checked_table(manifest, entry, "every sample's entity, fold and time") if isinstance(entry, dict) else None
    if path is None:
        return None
    try:
        with arrow_readable(path) as source:
            present = [c for c in _ASSIGNMENT_COLUMNS if c in pq.read_schema(source).names]
            table = pq.read_table(source, columns=["key", *present]).to_pydict()
    except (pa.ArrowException, OSError) as err:
        raise IntegrityError(f"{path}: unreadable as Parquet ({err}); rebuild the version") from err
    values = [table.get(c, [None] * len(table["key"])) for c in _ASSIGNMENT_COLUMNS]
    return {key: tuple(column[i] for column in values) for i, key in enumerate(table["key"])}


#: The shard format whose index sha256 is of the raw pixels (the tar format's is of the .npy member).
PARQUET = "parquet"


def as_tar_digests(manifest: Manifest, rows: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """Rewrite ``rows`` (:func:`read_sample_index` of the Parquet version ``manifest``) so that
    each sample's ``sha256`` is the one a WebDataset build of the same pixels records (of the
    ``.npy`` member: header, then pixels; :func:`~packer.shards.encode.pixels_digest`), reading
    every shard's ``key``, ``shape``, ``dtype`` and ``image`` cells. Returns (shards read, bytes
    of those shards). IntegrityError, naming the shard and key, when a shard is missing or
    unreadable, or when a cell's pixels do not hash to the sha256 the index records for it."""
    from packer.shards.encode import pixels_digest

    shards = size = 0
    for _, shard in _manifest_shards(manifest):
        path = Path(manifest.locate(shard["file"]))
        try:
            with arrow_readable(path) as source:
                batches = pq.ParquetFile(source).iter_batches(columns=["key", "shape", "dtype", "image"],
                                                              batch_size=64)
                for batch in batches:
                    cells = zip(*(batch.column(n).to_pylist() for n in batch.schema.names), strict=True)
                    for key, shape, dtype, image in cells:
                        found = pixels_digest(image, shape=tuple(shape), dtype=dtype, fmt=PARQUET).hexdigest()
                        row = rows.get(key)
                        if row is None or row["sha256"] != found:
                            why = ("_index.parquet has no row for it" if row is None
                                   else "not what _index.parquet records")
                            raise IntegrityError(
                                f"{path}: sample {key}: its image cell hashes to sha256 {found[:16]}…, {why}; run "
                                f"`packer verify {manifest.folder}` and rebuild the version")
                        row["sha256"] = pixels_digest(image, shape=tuple(shape), dtype=dtype,
                                                      fmt="webdataset").hexdigest()
        except (pa.ArrowException, OSError) as err:
            raise IntegrityError(f"{path}: shard unreadable as Parquet ({err}); diff across formats reads the "
                                 f"Parquet side's pixels: pass a version folder that holds its shards") from err
        shards += 1
        size += int(shard["bytes"])
    return shards, size


def _side(manifest: Manifest) -> dict[str, Any]:
    return {"manifest": manifest.location, "name": manifest.name, "version": manifest.version,
            "dataset_hash": manifest.dataset_hash, "format": manifest.format,
            "samples": manifest.data["inputs"]["samples"], "target": Target.of_manifest(manifest.data).to_json()}


def diff_datasets(old_path: str | Path, new_path: str | Path) -> DatasetDiff:
    """Compare two built versions (manifests or version folders): samples by key and content,
    the resolved config, and the packer/library/decoder versions.

    Raises IntegrityError when a manifest, index or splits table fails its hash, or when a
    version folder lacks its index or splits table (damaged). A registry copy or a manifest
    alone (none of the version's files beside it) has neither: the sample comparison is
    skipped, with a note.
    """
    old_manifest, new_manifest = read_manifest(Path(old_path)), read_manifest(Path(new_path))
    old, new = old_manifest.data, new_manifest.data
    notes: list[str] = []
    if old["name"] != new["name"]:
        notes.append(f"different datasets: {old['name']!r} vs {new['name']!r}")
    old_key, new_key = ((m.get("phi") or {}).get("key_fingerprint") for m in (old, new))
    if old_key != new_key:  # outside the config: the key is a secret, only its fingerprint is recorded
        notes.append(f"PHI key fingerprints differ ({old_key or 'none'} vs {new_key or 'none'}): every sample id, "
                     "entity pseudonym and so the split differ, so the samples do not match up; rebuild with the "
                     "key the old version was built with to compare them")
    masks = [_records_target_masks(m) for m in (old_manifest, new_manifest)]
    if None in masks:  # a masked version from before the index held target masks: compare neither side's
        notes.append("one version's index records no target masks (built by an older packer): labels ignored "
                     "under uncertain: ignore are not compared, only those held; rebuild it to compare them")
    old_rows, new_rows = (read_sample_index(m, target_masks=None not in masks) for m in (old_manifest, new_manifest))
    for rows, manifest in ((old_rows, old_manifest), (new_rows, new_manifest)):
        missing = (f"{manifest.locate(manifest.data['index']['file'])} not found (a registry copy, or a manifest "
                   "alone: none of its version's files is beside it): samples not compared; pass the version folders")
        if rows is None and missing not in notes:  # two registry copies of one folder: one note, not two
            notes.append(missing)
    samples_compared = old_rows is not None and new_rows is not None
    same_format = old["format"] == new["format"]
    content = same_format and samples_compared   # no sha256 compared where either index was not read
    if not same_format and old_rows is not None and new_rows is not None:
        parquet = old_manifest if old["format"] == PARQUET else new_manifest
        shards, size = as_tar_digests(parquet, old_rows if parquet is old_manifest else new_rows)
        content = True
        notes.append(f"formats differ ({old['format']} vs {new['format']}): the index's per-sample sha256 hashes "
                     f"the .npy member in one and the raw pixels in the other, so the {PARQUET} side's pixels were "
                     f"read from its {shards} shard(s) ({human_bytes(size)}) and hashed as a tar shard's .npy member "
                     "to compare content")
    moved_classes = _moved_class_indices(old.get("label_map") or {}, new.get("label_map") or {})
    if moved_classes:
        notes.append(moved_classes)
    old_target, new_target = Target.of_manifest(old), Target.of_manifest(new)
    moved_positions = _moved_target_positions(old_target, new_target)
    if moved_positions:
        notes.append(moved_positions)
    target = old_target.compared_with(new_target) if old_target.kind == new_target.kind else None
    if target is None:
        notes.append(f"target kinds differ (old {_target_text(old_target)}, new {_target_text(new_target)}): "
                     "targets are not compared per sample, so none is listed as relabeled")
    lists: dict[str, list[SampleChange]] = defaultdict(list)
    old_assigned: dict[str, tuple[Any, ...]] = {}
    new_assigned: dict[str, tuple[Any, ...]] = {}
    if old_rows is not None and new_rows is not None:
        # what _splits.parquet says of a sample besides its split: its entity, fold and time (under
        # dates: shift a time is in no shard byte, so two versions that differ in it alone said "no differences")
        old_assigned, new_assigned = read_assignment(old_manifest) or {}, read_assignment(new_manifest) or {}
        for key in sorted(set(old_rows) | set(new_rows)):
            a, b = old_rows.get(key), new_rows.get(key)
            change = SampleChange(key, old_split=a["split"] if a else None, new_split=b["split"] if b else None,
                                  old_label=a["label"] if a else None, new_label=b["label"] if b else None,
                                  old_target=a["target"] if a else None, new_target=b["target"] if b else None)
            if a is None:
                lists["added"].append(change)
            elif b is None:
                lists["removed"].append(change)
            else:
                changed = content and a["sha256"] != b["sha256"]
                if changed:
                    lists["changed"].append(change)
                if a["split"] != b["split"]:
                    lists["moved"].append(change)
                relabeled = target is not None and target.relabeled((a["label"], a["target"]),
                                                                    (b["label"], b["target"]))
                if relabeled:
                    lists["relabeled"].append(change)
                unlisted = not changed and not relabeled and a["split"] == b["split"]
                if unlisted and ((same_format and a["xxh3"] is not None and b["xxh3"] is not None
                                  and a["xxh3"] != b["xxh3"] and a["sha256"] == b["sha256"]
                                  and a["label"] == b["label"])
                                 or (old_assigned and new_assigned
                                     and old_assigned.get(key) != new_assigned.get(key))):
                    lists["record_changed"].append(change)
    if content:
        lists["rekeyed"] = pair_by_content(lists, old_rows or {}, new_rows or {}, old_assigned, new_assigned, target)
    versions = diff_values({"packer_version": old["packer_version"], "libraries": old["libraries"],
                            "decoders": old["decoders"], "format_version": old["format_version"]},
                           {"packer_version": new["packer_version"], "libraries": new["libraries"],
                            "decoders": new["decoders"], "format_version": new["format_version"]})
    return DatasetDiff(old=_side(old_manifest), new=_side(new_manifest),
                       samples_compared=samples_compared, content_compared=content,
                       added=tuple(lists["added"]), removed=tuple(lists["removed"]), changed=tuple(lists["changed"]),
                       moved=tuple(lists["moved"]), relabeled=tuple(lists["relabeled"]),
                       config=diff_values(old["config"], new["config"]), versions=versions, notes=tuple(notes),
                       target=target, shards=diff_shards(old_manifest, new_manifest),
                       record_changed=tuple(lists["record_changed"]), rekeyed=tuple(lists["rekeyed"]),
                       inputs=diff_inputs(old, new),
                       hash_fields=_hash_fields(old, new))


#: The traits of a sample (0 its target as :meth:`Target.compared_target` gives it, 1 its split,
#: 2 its entity) that :func:`pair_by_content` pairs copies of one image by, most alike first:
#: those of all three, then of the target and split, ..., then any
_PAIRING_TIERS = ((0, 1, 2), (0, 1), (0, 2), (0,), (1, 2), (1,), (2,), ())


def pair_by_content(lists: dict[str, list[SampleChange]], old_rows: Mapping[str, Mapping[str, Any]],
                    new_rows: Mapping[str, Mapping[str, Any]], old_assigned: Mapping[str, tuple[Any, ...]],
                    new_assigned: Mapping[str, tuple[Any, ...]], target: Target | None) -> list[SampleChange]:
    """Pair each removed sample with an added one of the same per-sample sha256 (the same bytes
    under a new key: a file moved to another class folder under ``label: folder``, renamed, or
    moved under the root, changes its path, so its entity, key and drawn split). Where several
    share a digest (copies of one image, each with its own label), a removed sample is paired
    with an added one of the same target (``target``: the one the diff compares, None where the
    kinds differ), then of the same split, then of the same entity (``old_assigned`` and
    ``new_assigned``, :func:`read_assignment`), then in key order: a renamed source pairs each
    copy with its own new key, whatever order pseudonymized keys sort in, so no copy is reported
    relabeled or moved. Takes the pairs out of ``lists``' removed and added lists and returns
    them as :class:`SampleChange` under the new key, with ``old_key`` and the new entity."""
    def traits(rows: Mapping[str, Mapping[str, Any]], assigned: Mapping[str, tuple[Any, ...]],
               key: str) -> tuple[Hashable, str, Any]:
        row = rows[key]
        return (None if target is None else target.compared_target(row["label"], row["target"]), row["split"],
                (assigned.get(key) or (None,))[0])

    added: dict[str, list[SampleChange]] = defaultdict(list)
    for change in lists["added"]:
        added[new_rows[change.key]["sha256"]].append(change)
    removed: dict[str, list[SampleChange]] = defaultdict(list)
    for change in lists["removed"]:
        if old_rows[change.key]["sha256"] in added:
            removed[old_rows[change.key]["sha256"]].append(change)
    pairs = []
    for digest, gone in removed.items():  # each list in key order, as lists holds them
        candidates = added[digest]
        old_traits = {change.key: traits(old_rows, old_assigned, change.key) for change in gone}
        new_traits = {change.key: traits(new_rows, new_assigned, change.key) for change in candidates}
        for tier in _PAIRING_TIERS:
            waiting: dict[tuple[Any, ...], deque[SampleChange]] = defaultdict(deque)
            for change in candidates:
                waiting[tuple(new_traits[change.key][i] for i in tier)].append(change)
            unpaired = []
            for old in gone:
                alike = waiting.get(tuple(old_traits[old.key][i] for i in tier))
                if not alike:
                    unpaired.append(old)
                    continue
                new = alike.popleft()
                entity = new_traits[new.key][2]
                pairs.append(SampleChange(new.key, old_split=old.old_split, new_split=new.new_split,
                                          old_label=old.old_label, new_label=new.new_label,
                                          old_target=old.old_target, new_target=new.new_target, old_key=old.key,
                                          new_entity=None if entity is None else str(entity)))
            taken = {pair.key for pair in pairs}
            gone, candidates = unpaired, [change for change in candidates if change.key not in taken]
            if not gone or not candidates:
                break
    paired_old, paired_new = {pair.old_key for pair in pairs}, {pair.key for pair in pairs}
    lists["removed"] = [change for change in lists["removed"] if change.key not in paired_old]
    lists["added"] = [change for change in lists["added"] if change.key not in paired_new]
    return sorted(pairs, key=lambda pair: pair.key)


def _moved_class_indices(old: dict[str, int], new: dict[str, int]) -> str | None:
    """The note on a label map whose classes changed index (a new class sorted before them, one
    removed): every sample of such a class holds another index in its packed label, though its
    class did not change, and a model trained on the old version reads them as other classes."""
    moved = [f"{name} {old[name]} -> {new[name]}" for name in sorted(old, key=old.__getitem__)
             if name in new and old[name] != new[name]]
    if not moved:
        return None
    added, gone = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    why = "; ".join(part for part in (f"added {', '.join(map(repr, added))}" if added else "",
                                      f"removed {', '.join(map(repr, gone))}" if gone else "") if part)
    return (f"the label map changed ({why or 'reordered'}), so classes hold other indices: {', '.join(moved[:8])}"
            f"{', ...' if len(moved) > 8 else ''}; every sample of those classes packs another label index (its "
            "record changed, its class did not), and a model trained on the old version reads them as other "
            "classes: list the classes in the job's labels: [...], which keeps their indices from one version to "
            "the next")


def _moved_target_positions(old: Target, new: Target) -> str | None:
    """The note on a target vector whose positions hold other names (numeric columns in another
    order, a multi-label name sorted before others): every sample's packed target vector holds
    its values at other positions, though no value changed, so nothing is relabeled, and a model
    trained on the old version reads them as other values (:meth:`Target.moved_positions`)."""
    moved = old.moved_positions(new)
    if not moved:
        return None
    return (f"target positions changed: {', '.join(moved[:8])}{', ...' if len(moved) > 8 else ''}; every sample's "
            "target vector (.target.npy, the target column, batch['target']) holds its values at other positions "
            "(no value changed, so none is relabeled), and a model trained on the old version reads them as other "
            "values: keep the order of the label columns (or the job's labels: [...]) from one version to the next")


def _manifest_shards(manifest: Manifest) -> list[tuple[str, dict[str, Any]]]:
    return [(split, shard) for split in SPLITS if split in manifest.data["splits"]
            for shard in manifest.data["splits"][split]["shards"]]


def _same_file(a: Path | str, b: Path | str) -> bool | None:
    """Whether two local paths are one inode; None when either cannot be stat'ed (or is a URL)."""
    if not isinstance(a, Path) or not isinstance(b, Path):
        return None
    try:
        return a.samefile(b)
    except OSError:
        return None


def diff_shards(old: Manifest, new: Manifest) -> tuple[ShardChange, ...]:
    """The shards of ``new`` (reused when ``old`` has a shard with the same sha256, else new),
    then those of ``old`` that ``new`` lacks (removed). A reused shard is matched to the old shard
    of the same file name when several hold its bytes. Reads the manifests and stats the files."""
    by_digest: dict[str, list[str]] = defaultdict(list)
    for _, shard in _manifest_shards(old):
        by_digest[shard["sha256"]].append(shard["file"])
    new_digests = set()
    changes = []
    for split, shard in _manifest_shards(new):
        new_digests.add(shard["sha256"])
        files = by_digest.get(shard["sha256"])
        if not files:
            changes.append(ShardChange("new", split, shard["file"], shard["bytes"], shard["sha256"]))
            continue
        old_file = shard["file"] if shard["file"] in files else files[0]
        changes.append(ShardChange("reused", split, shard["file"], shard["bytes"], shard["sha256"], old_file=old_file,
                                   same_inode=_same_file(old.locate(old_file), new.locate(shard["file"]))))
    changes += [ShardChange("removed", split, shard["file"], shard["bytes"], shard["sha256"])
                for split, shard in _manifest_shards(old) if shard["sha256"] not in new_digests]
    return tuple(changes)


def _target_text(target: Target) -> str:
    return f"{target.kind}" + (f" ({', '.join(target.names)})" if target.names else "")


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if value is not None else "(absent)"


def format_diff(diff: DatasetDiff, *, limit: int = 20) -> str:
    """The text ``packer diff`` prints; at most ``limit`` keys per list (``--json`` has all)."""
    old, new = diff.old, diff.new
    lines = [f"diff {old['name']} {old['version']} ({old['samples']} samples) -> "
             f"{new['name']} {new['version']} ({new['samples']} samples)"]
    lines += [f"  note: {note}" for note in diff.notes]
    if diff.empty:  # without the samples (a registry copy) only the config and versions were compared
        lines.append("  no differences" if diff.samples_compared else
                     "  no differences in config or library versions (samples not compared: see the note)")
        return "\n".join(lines)
    if diff.samples_compared:
        lines.append(f"  samples: {len(diff.added)} added, {len(diff.removed)} removed, {len(diff.changed)} changed, "
                     f"{len(diff.moved)} moved split, {len(diff.relabeled)} relabeled"
                     + (f", {len(diff.rekeyed)} rekeyed (same bytes under a new key; "
                        f"{sum(item.split_changed for item in diff.rekeyed)} in another split)" if diff.rekeyed else "")
                     + (f", {len(diff.record_changed)} record changed (same pixels and target, another record: "
                        "entity, time or fold, table cells, mask, or the class index where the label map "
                        "changed)" if diff.record_changed else ""))
        for title, table in (("by split", diff.by_split()), ("by label", diff.by_label())):
            for name, counts in table.items():
                lines.append(f"    {title} {name:<10} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        for name in SAMPLE_KINDS:
            items: tuple[SampleChange, ...] = getattr(diff, name)
            label = "record" if name == "record_changed" else name
            for item in items[:limit]:
                if name == "moved":
                    detail = f"{item.old_split} -> {item.new_split}"
                elif name == "relabeled":
                    detail = f"{item.new_split}, {item.old_label} -> {item.new_label}"
                elif name == "rekeyed":
                    lines.append(f"    {label:<9} {item.old_key} -> {item.key}  ({item.old_split} -> {item.new_split}, "
                                 f"{item.old_label} -> {item.new_label})"
                                 + ("  SPLIT CHANGED: leak risk" if item.split_changed else ""))
                    continue
                elif name == "removed":
                    detail = f"{item.old_split}, {item.old_label}"
                else:
                    detail = f"{item.new_split}, {item.new_label}"
                lines.append(f"    {label:<9} {item.key}  ({detail})")
            if len(items) > limit:
                lines.append(f"    {label:<9} ... and {len(items) - limit} more (--json lists all)")
        lines += _rekeyed_lines(diff.rekeyed)
    lines += _shard_lines(diff, limit)
    if diff.inputs:  # new rows refused as bad samples change no sample, yet the versions differ
        lines.append(f"  inputs: {len(diff.inputs)} difference{'s' if len(diff.inputs) != 1 else ''} (bad samples "
                     "are listed in each version's bad_samples.jsonl, files left out on purpose in excluded.jsonl)")
        lines += [f"    {c.path}: {_value(c.old)} -> {_value(c.new)}" for c in diff.inputs]
    for title, changes in (("config", diff.config), ("versions", diff.versions)):
        # "unchanged", not "no differences": that says the versions are the same, and is said only then
        lines.append(f"  {title}: " + (f"{len(changes)} difference{'s' if len(changes) != 1 else ''}"
                                       if changes else "unchanged"))
        lines += [f"    {c.path}: {_value(c.old)} -> {_value(c.new)}" for c in changes]
    if diff.unexplained:
        lines.append(f"  dataset_hash differs ({old['dataset_hash'][:12]} -> {new['dataset_hash'][:12]}), though no "
                     f"list above says how: the manifests differ in {', '.join(diff.hash_fields) or 'no field'} "
                     "(compare them with packer inspect --json)")
    return "\n".join(lines)


def _rekeyed_lines(rekeyed: tuple[SampleChange, ...]) -> list[str]:
    """The warning on rekeyed samples whose split changed: the same bytes in another split, so a
    model trained on one version has seen what the other tests on."""
    moved = [item for item in rekeyed if item.split_changed]
    if not moved:
        return []
    flows = Counter(f"{item.old_split} -> {item.new_split}" for item in moved)
    return [f"  leak risk: {len(moved)} sample(s) are the same bytes as a sample of the old version under a new key "
            f"(a new path, so a new entity, whose split was drawn afresh) in another split "
            f"({', '.join(f'{flow} {n}' for flow, n in sorted(flows.items()))}): a model trained on one version has "
            "seen images the other tests on, so their test results do not compare; to keep each where it was, pin "
            "its new entity to its old split in split.pinned (entity,split; --json lists new_entity and old_split "
            "under samples.rekeyed) and build again"]


def _shard_lines(diff: DatasetDiff, limit: int) -> list[str]:
    """The shard view: counts and bytes of reused (stored once or twice), new and removed shards,
    then the new and removed shards by name (reused ones only in ``--json``)."""
    counts = diff.shard_counts()
    reused, linked, copied = counts["reused"], counts["linked"], counts["copied"]
    unchecked = reused["shards"] - linked["shards"] - copied["shards"]
    storage = [f"{linked['shards']} hard-linked (stored once)", f"{copied['shards']} separate copies"]
    if unchecked:
        storage.append(f"{unchecked} not checked (files not here)")
    lines = [f"  shards: {reused['shards']} reused ({human_bytes(reused['bytes'])}: {', '.join(storage)}), "
             f"{counts['new']['shards']} new ({human_bytes(counts['new']['bytes'])}), "
             f"{counts['removed']['shards']} removed ({human_bytes(counts['removed']['bytes'])})"]
    for kind in ("new", "removed"):
        items = diff.shards_of(kind)
        lines += [f"    {kind:<9} {c.file}  ({c.split}, {human_bytes(c.bytes)})" for c in items[:limit]]
        if len(items) > limit:
            lines.append(f"    {kind:<9} ... and {len(items) - limit} more (--json lists all)")
    return lines


# -- registry ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryEntry:
    """One manifest kept in a registry folder (``<registry>/<name>/<version>.json``).

    ``problem`` is set (and the other fields are best effort) when the manifest fails to load.
    """

    name: str
    version: str
    created_at: str
    dataset_hash: str
    samples: tuple[tuple[str, int], ...]
    path: str
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "created_at": self.created_at,
                "dataset_hash": self.dataset_hash, "samples": dict(self.samples), "path": self.path,
                "problem": self.problem}


def list_registry(registry: str | Path = DEFAULT_REGISTRY, *, name: str | None = None) -> tuple[RegistryEntry, ...]:
    """Manifests under ``registry`` (optionally only dataset ``name``), newest ``created_at`` first.

    Raises ConfigError when ``registry`` is not a folder. A manifest that fails to load is
    listed with its ``problem`` rather than hidden.
    """
    root = Path(registry)
    if not root.is_dir():
        raise ConfigError(f"{root}: no registry folder here; pass the folder that holds "
                          "<name>/<version>.json (the job's 'registry')")
    entries = []
    for file in sorted(root.glob(f"{name if name is not None else '*'}/*.json")):
        try:
            manifest = read_manifest(file).data
        except IntegrityError as err:
            entries.append(RegistryEntry(name=file.parent.name, version=file.stem, created_at="", dataset_hash="",
                                         samples=(), path=str(file), problem=str(err)))
            continue
        samples = tuple((split, manifest["splits"][split]["samples"])
                        for split in SPLITS if split in manifest["splits"])
        entries.append(RegistryEntry(name=manifest["name"], version=manifest["version"],
                                     created_at=manifest["created_at"], dataset_hash=manifest["dataset_hash"],
                                     samples=samples, path=str(file)))
    return tuple(sorted(entries, key=lambda e: (e.created_at, e.version), reverse=True))


def registry_temporaries(registry: str | Path = DEFAULT_REGISTRY, *, name: str | None = None) -> tuple[Path, ...]:
    """The ``*.partial`` files in the dataset folders of ``registry`` (optionally only ``name``'s):
    a registry copy half written (``<version>.json.<pid>-<hex>.partial``) by a build that was
    killed, or runs now. Not manifests, so :func:`list_registry` skips them; ``packer ls`` names
    them, as the registry folder is one users commit."""
    return tuple(sorted(p for p in Path(registry).glob(f"{name if name is not None else '*'}/*{TMP_SUFFIX}")
                        if p.is_file() and not p.is_symlink()))


def format_registry(entries: tuple[RegistryEntry, ...]) -> str:
    """The table ``packer ls`` prints."""
    lines = [f"{'name':<16} {'version':<13} {'created_at':<21} {'train':>7} {'valid':>7} {'test':>7}  dataset_hash"]
    for e in entries:
        if e.problem is not None:
            lines.append(f"{e.name:<16} {e.version:<13} BROKEN: {e.problem}")
            continue
        counts = dict(e.samples)
        lines.append(f"{e.name:<16} {e.version:<13} {e.created_at:<21} " + " ".join(
            f"{counts.get(split, 0):>7}" for split in SPLITS) + f"  {e.dataset_hash[:16]}…")
    return "\n".join(lines)
