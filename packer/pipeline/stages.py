"""The pipeline's stages, in order, in one place: what ``packer build`` and ``packer validate`` run.

:func:`run_stages` is the order::

    discover      client: list raw files, read label tables        pipeline.discover
    pixels        dask: probe, read, check, transform, spill       pipeline.pixels (+ probe, checks, spill)
    near copies   client + dask: candidates, verification          pipeline.nearcopy
    conflicts     client: copies whose targets disagree (drop_group   pipeline.conflicts
                  leaves them out here)
    split         client: entity/time split over duplicate groups, pipeline.split
                  or the given split (lists, a table column)      pipeline.splitlists
    audit         client: leakage rules on the assignment          pipeline.audit
    ── packer validate stops here (through="audit") ──
    gate          a failed audit writes leakage.json and raises (exit 4)
    plan          client: shard boundaries from exact sizes        pipeline.plan
    pack          dask: spilled bytes into shards, hashed; a shard     pipeline.assemble
                  an earlier version holds is linked from it      pipeline.reuse

``packer build`` (:mod:`packer.pipeline.build`) then publishes: index, splits table, bad-sample
report, manifest, HTML report (:mod:`packer.pipeline.publish`). Everything the client keeps is
small records: the samples in columns (with their content hashes), the bad-sample issues, the
split assignment and the audit report.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import tempfile
import time
import unicodedata
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from packer.badsamples import sort_issues
from packer.config import JobConfig, SplitConfig, TargetConfig, transform_warnings
from packer.errors import ConfigError, blocking_file, refused_write, surface, unmakeable_folder
from packer.exclusions import describe_counts, sort_excluded
from packer.manifest import library_versions
from packer.phi import Pseudonymizer, pseudonymizer_for
from packer.pipeline.assemble import pack_shards
from packer.pipeline.audit import (
    LEAKAGE_FILE,
    LeakageAudit,
    accepted_leaks,
    audit_assignment,
    lookalikes_warning,
    raise_on_leakage,
    write_leakage,
)
from packer.pipeline.cluster import Executor, SharedPath, WorkerLost
from packer.pipeline.conflicts import LabelConflicts, SpilledMasks, conflict_exclusions, find_label_conflicts
from packer.pipeline.dedup import shared_instances_of, shared_instances_warning
from packer.pipeline.discover import discover, make_sample_id, own_entity_warnings
from packer.pipeline.filecache import damage_report
from packer.pipeline.labels import dataset_target
from packer.pipeline.listings import BUILD_LISTINGS, VALIDATE_LISTINGS, Listings
from packer.pipeline.nearcopy import EvidenceArrays, NearLinks, VerifyTask, pairs_in, verify_task
from packer.pipeline.neighborcache import NeighborCache
from packer.pipeline.paircache import PairCache, cached_verification
from packer.pipeline.pixels import ChunkResult, process_all
from packer.pipeline.plan import PlannedShard, plan_shards
from packer.pipeline.reuse import EarlierShards
from packer.pipeline.sampletable import SampleTable
from packer.pipeline.spill import SpillConsumer, cache_elsewhere
from packer.pipeline.split import (
    Assignment,
    RunVerify,
    assign_splits,
    balance_warning,
    near_links,
    not_in_split_rows,
    split_codes,
)
from packer.pipeline.splitlists import name_of
from packer.progress import Progress
from packer.read.dicom_masks import annotation_notes_warning, note_count, possible_annotations_warning
from packer.read.dicom_objects import NOT_IMAGE_MODALITIES
from packer.read.kinds import source_kind, source_libraries
from packer.read.nifti import is_filled_note
from packer.read.series import UNITS_NOTE, is_constant_note, is_units_note
from packer.records import Excluded, Issue
from packer.shards.writer import ShardWrite
from packer.storage import is_url, work_dir
from packer.targets import Target, target_class
from packer.targets.base import cell_number

#: The stages :func:`run_stages` runs, in order (``packer validate`` stops after "audit").
STAGES = ("discover", "pixels", "near copies", "conflicts", "split", "audit", "plan", "pack")


@dataclass(frozen=True)
class Prepared:
    """What the client knows after the pixel pass, the split and the audit.

    ``samples`` are the ones assigned to a split, sorted by key, in columns; ``issues`` include
    the discover, read, validate and split stages; ``inputs`` counts the raw files found, each
    once: a file that gave samples, a bad one (``issues``) or one left out on purpose
    (``excluded``: discovery's and the probe's, never against ``max_bad_fraction``);
    ``chunks`` are the pixel pass's results without their samples (counts, cache use, seconds);
    ``links`` the verified near copies, indices into the samples *before* unassigned ones were
    dropped (the assignment's groups use the same indices), found in ``near_seconds`` (wall time
    of the candidate search and the verification tasks).
    """

    inputs: int
    samples: SampleTable
    issues: tuple[Issue, ...]
    assignment: Assignment
    audit: LeakageAudit
    chunks: tuple[ChunkResult, ...]
    decoded: bool = True
    phi: Pseudonymizer = Pseudonymizer(mode="keep", dates="keep", key=None)
    links: NearLinks = field(default_factory=NearLinks.empty)
    near_seconds: float = 0.0
    #: spill files holding a sample that is not packed (dropped by the split): the pack pass
    #: leaves them whole, since no published shard can stand in for them later
    partial_spills: frozenset[str] = frozenset()
    #: the files left out on purpose, sorted by path (:mod:`packer.exclusions`)
    excluded: tuple[Excluded, ...] = ()
    #: the warnings the stages printed, as (code, message): ``entities`` (every file its own entity
    #: where a column looks like one), ``readers`` (files packed with a reader's warning),
    #: ``split_shares``, ``split`` (the split's own: pins, groups), ``accepted_leaks``,
    #: ``label_conflicts``, ``instance_uids`` (one SOP Instance UID in files of several entities),
    #: ``labels`` (class names differing only in case), ``annotations`` (files of a source with
    #: masks from DICOM that did not parse and may be its SEG or RTSTRUCT objects);
    #: ``packer validate --json`` reports them
    warnings: tuple[tuple[str, str], ...] = ()

    @property
    def considered(self) -> int:
        """The input files that could be samples: all but the excluded ones (the bad fraction's
        denominator, so that files left out on purpose neither count as bad nor dilute it)."""
        return self.inputs - len(self.excluded)

    @property
    def files_decoded(self) -> int:
        """Files read by this run: all but those whose results came from the build cache."""
        return sum(c.files - c.copied for c in self.chunks if not c.reused) if self.decoded else 0

    @property
    def files_cached(self) -> int:
        """Files whose samples and records came from the build cache (their bytes checked out):
        a whole entry reused, or a file copied out of an earlier entry (:mod:`packer.pipeline.filecache`)."""
        return sum(c.files if c.reused else c.copied for c in self.chunks)


def _make_cache_folder(cache_dir: Path) -> None:
    """Create the build cache folder (outside the output: in the work folder or ``--cache-dir``);
    a full, read-only or unwritable file system there is a FileSystemError naming the cache's fix."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        refused = refused_write(err, cache_dir, opening=True, elsewhere=cache_elsewhere())
        if refused is None:
            raise
        raise refused from err


def _check(job: JobConfig, executor: Executor, *, cache_dir: Path | None, decode: bool = True,
            quiet: bool = False, storage_options: dict[str, Any] | None = None, refer: bool = True,
            listings: Listings = BUILD_LISTINGS) -> Prepared:
    """Stages discover to audit of ``job``. Does not raise on leakage: :func:`run_stages` decides.

    With ``decode`` False (``validate --quick``) only headers are read: duplicate rules
    cannot run and are disabled for this audit. ``storage_options`` configure the stores of
    raw inputs given as URLs (on the client and on the workers). ``refer``: per-file reuse may
    hold unchanged files' samples by reference (:attr:`~packer.pipeline.pixels.ChunkTask.refer`).
    ``listings``: where the messages say the audit's findings, the bad samples and the files left
    out are listed (files for a build; packer validate writes none: parts of its report).
    """
    listed_in = listings.audit
    phi = pseudonymizer_for(job.phi, job.job_path)
    found = discover(job, phi, storage_options=storage_options, quiet=quiet, listings=listings)
    refs, issues, listed = found.refs, found.issues, found.listed  # refs: a RefTable (packer.pipeline.sampletable)
    excluded = list(found.excluded)
    unlabeled = found.unlabeled  # the missing_label messages naming the table, row and fix
    warned: list[tuple[str, str]] = [("entities", said) for said in found.warnings]
    warned[:0] = [("transform", said) for said in transform_warnings(job)]
    entity_hints = found.entity_hints  # said once the probe has read the headers' entities
    for _, said in warned:  # a warning, not progress: printed under --quiet too
        print(f"packer: warning: {job.name}: {said}", file=sys.stderr, flush=True)
    del found
    inputs = len(refs) + len(issues) + len(excluded)
    if not quiet:  # the files refused while listing are not in the progress lines' "bad" counts: say them here
        listed_bad = Counter(issue.reason for issue in issues)
        counted = [f"{len(issues)} bad before decoding: {describe_counts(listed_bad)}"] if issues else []
        if excluded:
            counted.append(f"{len(excluded)} left out while listing: "
                           f"{describe_counts(Counter(e.why for e in excluded))}")
        refused = f" ({'; '.join(counted)})" if counted else ""
        print(f"packer: {job.name}: {inputs} input files{refused}, running on {executor.description}", flush=True)
    if cache_dir is not None:
        _make_cache_folder(cache_dir)
    with contextlib.ExitStack() as stack:
        # without a cache (packer validate), the near-copy signatures and the masks live for this run only
        sig_dir = cache_dir if cache_dir is not None or not decode else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="packer-signatures-", dir=_scratch_folder())))
        if cache_dir is None:  # packer validate (packer build checks its cache and roots itself)
            executor.require_shared([*_shared_scratch(sig_dir), *shared_roots(job)])
        chunks, table, lookalikes, held = process_all(job, executor, refs, cache_dir=cache_dir, decode=decode,
                                                quiet=quiet, phi=phi, listed=listed,
                                                storage_options=storage_options, sig_dir=sig_dir, refer=refer)
        del refs, listed  # the settled samples carry their own (probed) refs
        readers = readers_warning(job, [note for chunk in chunks for note in chunk.notes])
        if readers is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {readers}", file=sys.stderr, flush=True)
            warned.append(("readers", readers))
        units = mixed_units_warning(job, [note for chunk in chunks for note in chunk.notes])
        if units is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {units}", file=sys.stderr, flush=True)
            warned.append(("readers", units))
        samples = table.sorted_by_key(release=True)
        del table
        if entity_hints:
            (source_codes, source_names), (entity_codes, _) = samples.codes("source"), samples.codes("entity")
            # a volume stands for its series' files: counted as files, not as one
            files = [len(held.files.get(key, ((),))) for key in samples.column("key")] if held.files else None
            for said in own_entity_warnings(entity_hints, [source_names[c] for c in source_codes.tolist()],
                                            entity_codes.tolist(), samples.column("relpath"), files):
                print(f"packer: warning: {job.name}: {said}", file=sys.stderr, flush=True)  # under --quiet too
                warned.append(("entities", said))
        decoded_issues, probed_out = one_record_per_file([i for c in chunks for i in c.issues],
                                                         [e for c in chunks for e in c.excluded])
        issues.extend(replace(i, message=unlabeled[i.path]) if i.reason == "missing_label" and i.path in unlabeled
                      else i for i in decoded_issues)
        if probed_out and not quiet:  # not bad samples: the progress lines did not count them
            # a progress line (stderr, as the others): stdout holds the opening line alone
            print(f"packer: {job.name}: {len(probed_out)} files left out on purpose by their headers "
                  f"({describe_counts(Counter(e.why for e in probed_out))}); not bad samples, listed in "
                  f"{listings.excluded}", file=sys.stderr, flush=True)
        excluded.extend(probed_out)
        # a broken file or two beside them does not make the left-out files' cause a bad fraction
        if not len(samples) and excluded and len(issues) < len(excluded):
            raise _nothing_to_pack(job, excluded, issues, show_paths=not phi.active)
        source_codes, source_names = samples.codes("source")
        empty = empty_sources_warning(job, {source_names[c] for c in np.unique(source_codes).tolist()}, issues,
                                      excluded, listings)
        if empty is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {empty}", file=sys.stderr, flush=True)
            warned.append(("sources", empty))
        possible = possible_annotations_warning(issues)
        if possible is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {possible}", file=sys.stderr, flush=True)
            warned.append(("annotations", possible))
        noted = annotation_notes_warning(probed_out, listings.excluded)
        if noted is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {noted}", file=sys.stderr, flush=True)
            warned.append(("annotation_notes", noted))
        split_cfg = job.split if decode else replace(job.split, duplicates="report", near_enabled=False,
                                                     near_auto=False)
        started = time.perf_counter()
        # a build keeps each verified pair's evidence in its cache: a pair of unchanged thumbnails is
        # not verified again (packer.pipeline.paircache); the links are the same either way
        pairs = PairCache.open(cache_dir) if cache_dir is not None and split_cfg.near_enabled else None
        # and each sample's neighbour lists: an unchanged sample is compared with the new ones only
        # (packer.pipeline.neighborcache); the candidates are the same either way
        lists = (NeighborCache.open(cache_dir, split_cfg.near_neighbors)
                 if cache_dir is not None and split_cfg.near_enabled else None)
        run = _verify_on(executor, quiet=quiet)
        links = near_links(samples, split_cfg, sig_dir, run if pairs is None else cached_verification(run, pairs),
                           lists=lists, quiet=quiet)
        near_seconds = time.perf_counter() - started
        if lists is not None:
            lists.save()
        if pairs is not None:
            pairs.save()
            if not quiet and (pairs.reused or pairs.verified):
                ignored = "; ".join(f"the cache's {what} file was not used: {why}" for what, why in
                                    (("pair", pairs.ignored), ("neighbour", lists.ignored if lists else "")) if why)
                # the candidates are leakage.json's ``candidates_verified``; the rival test has some
                # verified again in full and verifies pairs that are no candidates
                # (packer.pipeline.nearcopy.settle_rivals, rival_test), so the verifications (run
                # now or reused) can outnumber them
                print(f"packer: near copies: {links.candidates} candidate pairs (candidates_verified), "
                      f"{pairs.verified + pairs.reused} verifications with the rival test's pairs "
                      f"({pairs.verified} run, {pairs.reused} reused from the build cache), "
                      f"{lists.reused if lists else 0} of {len(samples)} samples' neighbour lists reused, "
                      f"{len(links)} links ({near_seconds:.1f}s){'; ' + ignored if ignored else ''}", flush=True)
        # a file a given split does not name is a not_in_split bad sample, not part of the dataset: no conflict of it
        outside = not_in_split_rows(samples, split_cfg, pseudonym=phi.entity if phi.active else None,
                                    bad=_listed_bad(job, split_cfg, issues, excluded, phi), listings=listings)
        # the masks: the build's spill, or packer validate's scratch folder (removed as this block ends)
        conflicts = _label_conflicts(job, samples, links, split_cfg, (cache_dir or sig_dir) if decode else None,
                                     outside, scratch=cache_dir is None)
    kind = target_class(job.sources[0].target.kind)
    if conflicts.dropped:
        excluded.extend(conflict_exclusions(samples, conflicts, held.files))
    assignment = assign_splits(samples, split_cfg, links, strata=kind.held_names,
                               pseudonym=phi.entity if phi.active else None, leave_out=conflicts.dropped, quiet=quiet,
                               stacked={s.name: job.dicom.sample for s in job.sources
                                        if job.dicom.by_series and source_kind(s.kind).grouping(job) is not None},
                               bad=_listed_bad(job, split_cfg, issues, excluded, phi), held=held, listings=listings)
    balance = balance_warning(assignment, split_cfg, listed_in=listed_in)
    audit = audit_assignment(samples, assignment, split_cfg, links, show_paths=not phi.active,
                             show_dates=phi.dates == "keep", conflicts=conflicts, lookalikes=lookalikes,
                             quiet=quiet, held=held)
    for code, warning in (("split_shares", balance), *(("split", w) for w in assignment.warnings),
                          ("accepted_leaks", accepted_leaks(audit, split_cfg, listed_in)),
                          ("label_conflicts", conflicts_warning(conflicts, split_cfg.label_conflict, listings)),
                          ("instance_uids", shared_instances_warning(shared_instances_of(samples), job.job_path)),
                          ("entity_lookalikes", lookalikes_warning(audit, listed_in, split_cfg.by)),
                          ("labels", case_twins_warning(job, samples.codes("label")[1], labels_by_source(samples))),
                          ("labels", uncertain_class_warning(job, samples.codes("label")[1])),
                          ("labels", id_like_class_warning(job, *samples.codes("label")))):
        if warning is not None:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {job.name}: {warning}", file=sys.stderr, flush=True)
            warned.append((code, warning))
    issues.extend(assignment.dropped)
    excluded.extend(assignment.excluded)
    placed = split_codes(samples, assignment.split) >= 0
    spill_codes, spills = samples.codes("spill")
    partial = frozenset(spills[code] for code in np.unique(spill_codes[~placed]).tolist())
    if placed.all():  # the usual case: what is packed is every sample, the table as it is
        kept = samples
    else:  # each field given up as it is copied: the records are not held twice
        rows = np.flatnonzero(placed)
        kept = samples.take(rows, release=True)
        assignment = assignment.placed_in(kept, rows)  # split and fold by row of what is packed
    return Prepared(inputs=inputs, samples=kept, issues=tuple(sort_issues(issues)), assignment=assignment, audit=audit,
                    chunks=tuple(chunks), decoded=decode, phi=phi, links=links, near_seconds=near_seconds,
                    partial_spills=partial, excluded=tuple(sort_excluded(excluded)), warnings=tuple(warned))


def _nothing_to_pack(job: JobConfig, excluded: Sequence[Excluded], issues: Sequence[Issue], *,
                     show_paths: bool) -> ConfigError:
    """The error for a job whose every file was left out on purpose (RSNA's secondary captures
    without a where: asking for them, a where: no row meets), or all but ``issues``, bad files
    fewer than those left out: an empty dataset is no result, and its empty splits would otherwise
    be warned of as a matter of ratios and seeds, or its few bad files be 100% of a bad fraction.
    The first file left out is named by its path, or by its sample id where paths are
    pseudonymized; the bad ones are counted by reason, commonest first, and the first of them
    named with its message (:func:`_first_bad`): no bad-sample list is written when the job stops
    here, and a bad file can be why nothing packs (a table's masks all JPEG). Where every file left out is no image
    (SR, KO, PR, a PDF: ``not_image``), no ``where:`` can help: the error counts what the sources
    hold, by modality (or SOP class), and points at the images instead."""
    first = sort_excluded(list(excluded))[0]
    named = first.path if show_paths else f"sample {first.sample_id}"
    detail = first.detail
    if not show_paths and first.why == "filtered":  # "ImageComments is <free text>, where: ...": the value stays local
        said = re.search(r"[;,] where: (.*)$", detail)  # "X is V, where: .." (headers), "x is 'v'; where: .." (tables)
        condition = said.group(1) if said else "the source's where:"
        detail = (f"left out by where: {condition} (the value it has is not shown under phi: pseudonymize: a "
                  "header's free text or a table cell may hold a name)")
    why = describe_counts(Counter(e.why for e in excluded))
    if issues:
        bad = _commonest(Counter(i.reason for i in issues))
        which = (f"{len(excluded)} of the job's {len(excluded) + len(issues)} files are left out on purpose ({why}) "
                 f"and the other {len(issues)} {'is' if len(issues) == 1 else 'are'} bad ({bad}); the first left out")
    else:
        which = f"all {len(excluded)} files of the job are left out on purpose ({why}); the first"
    if all(e.why == "not_image" for e in excluded):
        # no where: or files: can pack an SR or a PDF: the fix is the images, not what leaves these out
        held = Counter(_held_kind(e) for e in excluded)
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(held.items(), key=lambda kv: (-kv[1], kv[0])))
        holds = (f"Besides {len(issues)} bad {'file' if len(issues) == 1 else 'files'}, the job's sources hold "
                 "objects that are not images" if issues else "The job's sources hold no image, only objects that "
                 "are not images")
        # no bad-sample list is written when the job stops here: name the first bad file itself
        bad_first = min(issues, key=lambda i: (i.path, i.sample_id)) if issues else None
        first_named = "" if bad_first is None else bad_first.path if show_paths else f"sample {bad_first.sample_id}"
        fix = "" if bad_first is None else f"re-export the bad files (the first, {first_named}: {bad_first.reason}), "
        return ConfigError(f"{job.job_path}: no sample to pack: {which}, {named}: {detail}. {holds} ({kinds}), "
                           f"which no filter can pack: {fix}point the source's root at the folder of the images (or "
                           "export the images themselves from the archive), or remove the source")
    bad_said = "" if not issues else f" {_first_bad(issues, show_paths=show_paths)}."
    fix = "; fix the bad files" if issues else ""
    return ConfigError(f"{job.job_path}: no sample to pack: {which}, {named}: {detail}.{bad_said} Change what leaves "
                       f"them out (the source's where:, its table's files:){fix}, or remove the source")


#: How many of the bad files' reasons the no-sample error names (commonest first)
_NAMED_REASONS = 3


def _commonest(counts: Counter[str]) -> str:
    """``mask_unreadable 6, unreadable 1``: the commonest reasons first (ties by name), the rest
    counted together."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    said = ", ".join(f"{k} {v}" for k, v in ranked[:_NAMED_REASONS])
    rest = sum(v for _, v in ranked[_NAMED_REASONS:])
    return said + (f", {rest} of {len(ranked) - _NAMED_REASONS} other reason(s)" if rest else "")


def _first_bad(issues: Sequence[Issue], *, show_paths: bool) -> str:
    """The first bad file (by path) of a job stopped before its bad-sample list is written, with
    its reason and message, which says why it is bad and the fix (a JPEG mask: save it as PNG).
    Where paths are pseudonymized, its sample id and reason only: a message may quote a header
    or a path that names a patient."""
    first = min(issues, key=lambda i: (i.path, i.sample_id))
    if not show_paths:
        return (f"The first bad file, sample {first.sample_id}: {first.reason} (its message is not shown under phi: "
                "pseudonymize, as it may quote a header or a path)")
    said = first.message.removeprefix(f"{first.path}: ").rstrip(".")
    return f"The first bad file, {first.path}: {first.reason}: {said}"


def _held_kind(excluded: Excluded) -> str:
    """What a ``not_image`` file is, as the no-sample error counts it: its Modality where that
    names a non-image object (``SR``, ``RTPLAN``), else its SOP class (a Raw Data object of
    Modality CT is no CT image; a DICOMDIR has no Modality), else ``unknown``."""
    if excluded.modality in NOT_IMAGE_MODALITIES or not excluded.sop_class:
        return excluded.modality or excluded.sop_class or "unknown"
    return excluded.sop_class


def _listed_bad(job: JobConfig, cfg: SplitConfig, issues: Sequence[Issue], excluded: Sequence[Excluded],
                phi: Pseudonymizer) -> dict[str, str] | None:
    """For ``split: {by: list}``: the files refused as bad samples (``issues``) or left out on
    purpose (``excluded``: ``not_downloaded`` under a table's ``missing: drop``, a ``where:`` row),
    by their name under ``split.match``, each with its reason code (a bad sample's :data:`REASONS
    <packer.records.REASONS>`, an exclusion's :data:`~packer.records.EXCLUSIONS`: the two never
    share a code), so that a list naming one is told so, not that its item names nothing (with the
    closest name: another patient's file), and a list all of whose files were left out is no
    ConfigError. A file's relative path is its path under its source's root, checked against its
    sample id (discover's, from the source and relative path); a bad sample's reason comes first.
    None under ``match: entity``: a refused file's entity may never have been read."""
    if cfg.by != "list" or cfg.match == "entity":
        return None
    names: dict[str, str] = {}
    for sample_id, path, reason in [*((i.sample_id, i.path, i.reason) for i in issues),
                                    *((e.sample_id, e.path, e.why) for e in excluded)]:
        for source in job.sources:
            root = str(source.root).rstrip("/")
            if not path.startswith(root + "/"):
                continue
            rel = path[len(root) + 1:]
            if make_sample_id(source.name, rel, phi) == sample_id:
                names.setdefault(name_of(rel, None, cfg.match), reason)
                break
    return names


def _label_conflicts(job: JobConfig, samples: SampleTable, links: NearLinks, cfg: SplitConfig,
                     cache_dir: Path | None, outside: frozenset[int] = frozenset(), *,
                     scratch: bool = False) -> LabelConflicts:
    """The duplicate groups whose targets (or masks, exact copies' and near copies' aligned,
    read back from the build cache ``cache_dir``, or with ``scratch`` from packer validate's scratch
    folder; None: not compared) disagree; under ``label_conflict: drop_group``,
    with every member to be left out of the split. ``outside``: rows that are not part of the dataset
    (:func:`~packer.pipeline.split.not_in_split_rows`), in no group."""
    masked = {s.name: s.mask.pad for s in job.sources if s.mask is not None}
    masks = SpilledMasks(cache_dir, masked, scratch=scratch) if masked and cache_dir is not None else None
    found = find_label_conflicts(samples, links, cfg, target_class(job.sources[0].target.kind).conflicts,
                                 masks=masks,
                                 has_masks=bool(masked), outside=outside)
    return replace(found, dropped=found.rows) if cfg.label_conflict == "drop_group" else found


def empty_sources_warning(job: JobConfig, present: set[str], issues: Sequence[Issue],
                          excluded: Sequence[Excluded], listings: Listings = BUILD_LISTINGS) -> str | None:
    """A warning naming each source of a job of several that packs no sample although it has files
    (each bad or left out: a cut download, a wrong setting for that source alone), or None. Within
    ``validate.max_bad_fraction`` such a build succeeds, and the dataset lacks that source's samples
    and the classes only it holds. ``present``: the sources of the samples packed."""
    if len(job.sources) < 2:
        return None
    names = sorted((source.name for source in job.sources), key=len, reverse=True)  # sample ids: <source>-<id>

    def source_of(sample_id: str) -> str | None:
        return next((name for name in names if sample_id.startswith(name + "-")), None)

    said = []
    for source in job.sources:
        if source.name in present:
            continue
        bad = Counter(issue.reason for issue in issues if source_of(issue.sample_id) == source.name)
        out = Counter(record.why for record in excluded if source_of(record.sample_id) == source.name)
        files = sum(bad.values()) + sum(out.values())
        if not files:
            continue
        if not out:
            what = f"every one of its {files} files is a bad sample ({describe_counts(bad)})"
        elif not bad:
            what = f"every one of its {files} files is left out on purpose ({describe_counts(out)})"
        else:
            what = (f"its {files} files are bad ({describe_counts(bad)}) or left out on purpose "
                    f"({describe_counts(out)})")
        said.append(f"source {source.name!r} packed no sample: {what}")
    if not said:
        return None
    return ("; ".join(said) + f"; the dataset holds none of its samples, nor the classes only it has ({listings.bad} "
            f"and {listings.excluded} say why for each file): fix that source's files or settings, or remove it")


def labels_by_source(samples: SampleTable) -> dict[str, list[Any]]:
    """The distinct target texts each source's samples hold, by source name (for
    :func:`case_twins_warning`, whose advice is each source's own ``label:``)."""
    if not len(samples):
        return {}
    source_codes, sources = samples.codes("source")
    label_codes, labels = samples.codes("label")
    held: dict[str, list[Any]] = {}
    for source, label in np.unique(np.stack([source_codes, label_codes], axis=1), axis=0).tolist():
        held.setdefault(sources[source], []).append(labels[label])
    return held


def case_twins_warning(job: JobConfig, names: Sequence[Any],
                       by_source: Mapping[str, Sequence[Any]] | None = None) -> str | None:
    """A warning for class names that differ only in case or spacing (``Cat`` and ``cat``, a
    table typed by several people), or that spell one number (``1`` and ``1.0``): each is a
    class of its own, which is rarely meant. ``names``: each sample's target text; a multi-label
    target's names are the labels they hold (``Effusion|effusion``: two positions of the vector).
    ``by_source``: the target texts each source holds, by source name (None: ``names`` are all
    ``sources[0]``'s, a job of one source); the warning offers each source that holds a spelling
    to change its own ``label:``. None for a job that lists its classes (``labels:`` decides
    then) or a target of no class names (numbers, none)."""
    kind = target_class(job.sources[0].target.kind)
    if job.labels or not kind.names_labels:
        return None
    counts = Counter(str(held) for text in names if text for held in kind.held_names(str(text)) if held)
    groups: dict[str, list[str]] = {}
    for name in sorted(counts):
        number = cell_number(name)
        # NFC: café typed on one machine and café (e + a combining accent: macOS's folder names)
        # on another print the same and are two classes
        folded = " ".join(unicodedata.normalize("NFC", name).casefold().split())
        groups.setdefault(repr(number) if number is not None else folded, []).append(name)
    twins = [group for group in groups.values() if len(group) > 1]
    if not twins:
        return None
    shown = "; ".join(" and ".join(repr(n) for n in group) for group in twins[:5])
    more = f" (and {len(twins) - 5} more such groups)" if len(twins) > 5 else ""
    # a class id written 1 and 1.0 (a pandas column with a blank cell turns ints into floats)
    how = "case, spacing or how a number is written" if any(
        cell_number(group[0]) is not None for group in twins) else "case or spacing"
    if any(len({unicodedata.normalize("NFC", n) for n in group}) < len(group) for group in twins):
        how += " (or only in Unicode form: the same letters as one code point or as a letter and a combining mark)"
    return (f"classes that differ only in {how} are separate classes: {shown}{more}; if each group is one "
            f"class, map its spellings to one name: {_twin_map(job, twins, counts, by_source)}, or list the classes "
            "in the job's labels:")


def _twin_map(job: JobConfig, twins: list[list[str]], counts: Counter[str],
              by_source: Mapping[str, Sequence[Any]] | None) -> str:
    """The ``label:`` for each source that holds a spelling to change, named by index and name
    (``on sources[1] (scans), the source's label: {...}``), that maps each group of
    :func:`case_twins_warning` to its most common spelling (``counts``: samples per class name,
    over every source). Each is built from that source's own target (sources may read their
    classes from a folder, a column, an attribute) and the names that source holds
    (``by_source``, its target texts by source name; None: all are ``sources[0]``'s); a source
    that holds only the chosen spellings needs no change and is not named."""
    chosen = {name: max(group, key=lambda n: (counts[n], n == n.lower(), n)) for group in twins for name in group}
    texts: Mapping[str, Sequence[Any]] = by_source if by_source is not None else {job.sources[0].name: list(counts)}
    offers = []
    for index, source in enumerate(job.sources):
        kind = target_class(source.target.kind)
        held = {str(name) for text in texts.get(source.name, ()) if text for name in kind.held_names(str(text)) if name}
        if any(chosen.get(name, name) != name for name in held):
            offers.append(f"on sources[{index}] ({source.name}), {_source_twin_map(source.target, chosen, held)}")
    return "; ".join(offers)


def _source_twin_map(target: TargetConfig, chosen: Mapping[str, str], held: set[str]) -> str:
    """One source's ``label:`` of :func:`_twin_map`, as YAML that works as written: its other
    settings kept (kind, column or columns, separator), and a map keyed by what the source reads
    (a cell, a token, a folder), so a map it already has is composed with the new one (raw → its
    name → the chosen spelling). A class map names every class the source holds (one it lacks
    is ``unknown_label``), so the others map to themselves; a multi-label map keeps the tokens it
    lacks, so it names the source's twins (and its own entries) alone. ``held``: the class names
    the source's samples hold (after its own map)."""
    kind = target_class(target.kind)
    if kind.columns_name_labels and target.separator is None and target.origin == "table":
        return ("rename the columns in the table (a multilabel target of 0/1 columns is named by its columns, and "
                "takes no map)")
    own = dict(target.value_map)
    pairs: dict[str, str | None] = {raw: None if name is None else chosen.get(name, name) for raw, name in own.items()}
    if kind.map_keeps_unnamed:  # a token the map lacks reads as itself
        pairs.update((name, to) for name, to in chosen.items() if name in held and name not in own)
    elif not own:  # a class map names every class; the names are the raw values then
        pairs = {name: chosen.get(name, name) for name in held}
    shown = sorted(pairs.items())
    body = ", ".join(f"{_flow_text(name)}: {'null' if to is None else _flow_text(to)}" for name, to in shown[:12])
    body += f", ... ({len(shown)} in all, every class)" if len(shown) > 12 and not kind.map_keeps_unnamed else (
        f", ... ({len(shown)} in all)" if len(shown) > 12 else "")
    settings = [] if kind.default_kind else [f"kind: {target.kind}"]
    if target.origin == "attribute":
        settings.append(f"attribute: {target.attribute}")
    elif target.origin == "folder":
        settings.append("folder: true" + (f", component: {target.component}" if target.component else ""))
    elif len(target.columns) == 1:
        settings.append(f"column: {_flow_text(target.columns[0])}")
    else:
        settings.append(f"columns: [{', '.join(_flow_text(column) for column in target.columns)}]")
    if target.separator not in (None, "|"):
        settings.append(f"separator: {json.dumps(target.separator, ensure_ascii=False)}")
    return f"the source's label: {{{', '.join(settings)}, map: {{{body}}}}}" + (
        "" if kind.map_keeps_unnamed else " (a class map names every class: one it lacks is unknown_label)")


def _flow_text(text: str) -> str:
    """``text`` as a YAML flow-mapping key or value: plain where YAML reads it back as that
    text, else a JSON string (which YAML reads too), so `true`, `1`, `a: b` stay text."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*(?: [A-Za-z0-9_.-]+)*", text)
    return text if plain and text.lower() not in ("true", "false", "null") else json.dumps(text, ensure_ascii=False)


def uncertain_class_warning(job: JobConfig, names: Sequence[Any]) -> str | None:
    """A warning for a class target whose classes are the numbers -1 and 0 or 1: CheXpert's and
    MIMIC-CXR's tables write ``-1.0`` for an uncertain finding (and ``1.0``, ``0.0`` for positive
    and negative), and a class column makes "uncertain" a class of its own, which a binary model
    was rarely meant to learn. None for a job that lists its classes (``labels:`` decides then)
    or a target that is not one class."""
    if job.labels or not target_class(job.sources[0].target.kind).has_label:
        return None
    numbers = {name: cell_number(name) for name in {str(n) for n in names if n}}
    values = set(numbers.values())
    if None in values or -1.0 not in values or not values <= {-1.0, 0.0, 1.0} or len(values) < 2:
        return None
    uncertain = sorted(name for name, value in numbers.items() if value == -1.0)
    others = sorted(name for name, value in numbers.items() if value != -1.0)
    columns = sorted({c for source in job.sources if source.target.origin == "table" for c in source.target.columns})
    column = columns[0] if len(columns) == 1 else "COLUMN"
    return (f"class {uncertain[0]!r} is a class of its own beside {', '.join(map(repr, others))}: tables in "
            f"CheXpert's convention (CheXpert, MIMIC-CXR) write -1.0 for an uncertain finding. To read it as "
            f"uncertain, make {column!r} a multilabel target (label: {{kind: multilabel, columns: [{column}], "
            "uncertain: ones | zeros | ignore}); to leave such rows out, use the source's where:; to keep it a "
            "class, list the classes in the job's labels:")


#: A class target with at least this many classes, most of them held by one sample, reads a
#: column that is no class (:func:`id_like_class_warning`).
ID_LIKE_CLASSES = 20
_RLE = re.compile(r"^\s*\d+(\s+\d+){3,}\s*$")


def id_like_class_warning(job: JobConfig, codes: np.ndarray, names: Sequence[Any]) -> str | None:
    """A warning for a class target whose classes are nearly as many as its samples (at least
    :data:`ID_LIKE_CLASSES`, and more than half of them held by one sample each): the label
    column holds an id, a free-text note or an encoded mask rather than a class. A class that
    reads as run-length encoded pixels (SIIM-ACR's ``EncodedPixels``: numbers separated by
    spaces) is named as such. None for a job that lists its classes, or a target that is not one class."""
    if job.labels or not target_class(job.sources[0].target.kind).has_label or len(names) < ID_LIKE_CLASSES:
        return None
    counts = np.bincount(codes[codes >= 0], minlength=len(names)) if codes.size else np.zeros(0, dtype=np.int64)
    singles = int((counts == 1).sum())
    if singles * 2 <= len(names):
        return None
    rle = sum(1 for name in names if name and _RLE.match(str(name)))
    what = (f"{rle} of them read as run-length encoded pixels (numbers separated by spaces, SIIM-ACR's "
            "EncodedPixels): decode them to mask files (PNG) and name those in the source's mask: {column: ...}"
            if rle else "the column holds an id or a note rather than a class: set the source's label: to the "
                        "column of classes, or list the classes in the job's labels:")
    return (f"{len(names):,} classes for {int(counts.sum()):,} samples, {singles:,} of them held by one sample each; "
            f"{what}")


def conflicts_warning(found: LabelConflicts, policy: str = "warn", listings: Listings = BUILD_LISTINGS) -> str | None:
    """A sentence for the build's and validate's stderr when copies of one image disagree, or None.

    ``policy``: the job's ``split.duplicates.label_conflict``; it says what happens to them (under
    ``fail`` nothing is packed: the audit fails with exit 4)."""
    if not found.groups:
        return None
    samples = sum(len(group.members) for group in found.groups)
    if found.dropped:
        done = (f"{samples} samples left out before the split (label_conflict: drop_group; each file left out whole "
                f"listed in {listings.excluded})")
    elif policy == "fail":
        done = ("the leakage audit fails (split.duplicates.label_conflict: fail, exit 4): fix the labels, or set "
                "label_conflict: drop_group to leave those groups out")
    else:
        done = "packed as they are (split.duplicates.label_conflict: warn; fail or drop_group to stop it)"
    return (f"{len(found.groups)} group(s) of copies of one image ({samples} samples) carry different targets or "
            f"masks: label noise, or two patients mixed up; {done}; each group is listed under label_conflicts in "
            f"{listings.audit}")


def readers_warning(job: JobConfig, notes: Sequence[tuple[str, str]]) -> str | None:
    """One line for the files packed with a reader's warning (a NIfTI file whose sform and qform
    disagree), or None: how many, the first one's id and text (ids, never paths: build logs are
    shared; ``packer locate`` names the file)."""
    notes = [(file_id, text) for file_id, text in notes if not is_units_note(text)]  # a unit is no warning
    if not notes:
        return None
    files = sorted({file_id for file_id, _ in notes})
    first_id, text = sorted(notes)[0]
    more = f" (and {len(notes) - 1} more warning(s))" if len(notes) > 1 else ""
    return (f"{len(files)} file(s) packed with a reader's warning, e.g. file {first_id}: {text}{more}; the samples "
            "of such a file record it in metadata.warnings (a volume keeps one slice's metadata: it counts its "
            f"constant slices in metadata.volume.constant_slices), and `packer locate {job.job_path} {first_id}` "
            "names the file")


def mixed_units_warning(job: JobConfig, notes: Sequence[tuple[str, str]]) -> str | None:
    """One line where the packed samples of one modality hold values in different units (PET
    slices in Bq/ml, Units BQML, beside slices the scanner wrote as SUVbw, GML: values 10⁴ apart),
    from the readers' unit notes (:func:`packer.read.series.units_note`), or None: each unit, how
    many files and the first one's id (ids, never paths), and where each sample records its unit."""
    by_unit: dict[tuple[str, str], set[str]] = {}
    for file_id, text in notes:
        if is_units_note(text):
            modality, _, unit = text[len(UNITS_NOTE):].partition(" ")
            by_unit.setdefault((modality, unit), set()).add(file_id)
    modalities = sorted({modality for modality, _ in by_unit})
    mixed = [m for m in modalities if sum(modality == m for modality, _ in by_unit) > 1]
    if not mixed:
        return None
    said = []
    for modality in mixed:
        units = sorted((unit, sorted(ids)) for (m, unit), ids in by_unit.items() if m == modality)
        listed = ", ".join(f"{unit} ({len(ids)} file(s), e.g. file {ids[0]})" for unit, ids in units)
        said.append(f"{modality} values in {len(units)} units: {listed}")
    return (f"{'; '.join(said)}; one dataset then holds values of different meaning (Bq/ml beside SUV, say), "
            "which no window or model tells apart; each sample records its unit (metadata.pet_units, Units "
            "(0054,1001)): pack one unit per job (the source's where: {Units: BQML}), or convert upstream, and "
            f"`packer locate {job.job_path} FILE_ID` names a file")


def constant_slices(notes: Sequence[tuple[str, str]]) -> int:
    """How many files were packed as constant slices of their series (their readers' notes,
    :func:`packer.read.series.constant_slice_note`): the manifest's ``inputs.constant_slices``."""
    return len({file_id for file_id, text in notes if is_constant_note(text)})


def one_record_per_file(issues: Sequence[Issue], excluded: Sequence[Excluded]) -> tuple[list[Issue], list[Excluded]]:
    """The units of work's records with one per file: a file several units read gives each of
    them a record (a SEG or RTSTRUCT over a series stacked per acquisition paints, and is judged
    by, each stack), but the bad-sample report and ``excluded.jsonl`` have a row per file, and
    the bad fraction counts files (two rows made it exceed 1, and the manifest was refused after
    the whole build). A file that is bad for one unit is bad (its first record in report order
    stands); one used by several units is left out once, by the record that says most: an
    annotation object's with notes (the stack it was drawn on; another acquisition's stack
    paints none of it and notes nothing), else the first."""
    kept: dict[str, Issue] = {}
    for issue in sort_issues(issues):
        kept.setdefault(issue.sample_id, issue)
    left_out: dict[tuple[str, str], Excluded] = {}
    for record in sort_excluded(excluded):
        if record.sample_id not in kept:
            first = left_out.setdefault((record.sample_id, record.why), record)
            if note_count(record) > note_count(first):
                left_out[(record.sample_id, record.why)] = record
    return list(kept.values()), list(left_out.values())


def non_finite_filled(notes: Sequence[tuple[str, str]]) -> int:
    """How many files were packed with NaN or infinite voxels replaced (``transform.nifti.non_finite:
    {fill}``, :meth:`packer.read.nifti.FilledVoxels.note`): the manifest's ``inputs.non_finite_filled``."""
    return len({file_id for file_id, text in notes if is_filled_note(text)})


def shared_roots(job: JobConfig) -> list[SharedPath]:
    """Each local source root of ``job``, which every worker must see at the client's path
    (:meth:`Executor.require_shared`; README, Running on a cluster: Storage)."""
    return [(str(source.root), f"the root of source {source.name!r}",
             "mount the raw data at the same path on every worker, or give the root as a URL (s3://..., see "
             "Running on a cluster)", "entries") for source in job.sources if not is_url(str(source.root))]


def _shared_scratch(sig_dir: Path | None) -> list[SharedPath]:
    """The run's signature folder in the local work folder (``packer validate``), through a probe
    file in it (removed with the folder), which every worker must see."""
    if sig_dir is None:
        return []
    probe = sig_dir / "shared-probe"
    probe.touch()
    return [(str(probe), "the work folder's signature folder ($PACKER_WORK_DIR)",
             "set PACKER_WORK_DIR to a folder every worker mounts at the same path (the near-copy check's "
             f"signatures go there), or validate with {surface().option('quick')} (no pixels, no signatures)", "file")]


def _scratch_folder() -> Path:
    """Where ``packer validate`` keeps the run's signatures: the local work folder."""
    folder = work_dir()
    blocker = blocking_file(folder)
    if blocker is not None:  # mkdir's FileExistsError or NotADirectoryError: no file system condition, a usage error
        raise ConfigError(f"the work folder {folder} ($PACKER_WORK_DIR): {blocker} is a file, not a folder; remove "
                          "that file, or set PACKER_WORK_DIR to a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        elsewhere = "set PACKER_WORK_DIR to a writable folder"
        refused = refused_write(err, folder, opening=True, elsewhere=elsewhere) or unmakeable_folder(err, folder,
                                                                                                     elsewhere)
        if refused is None:
            raise
        raise refused from err
    return folder


def _verify_on(executor: Executor, *, quiet: bool = False) -> RunVerify:
    """Run near-copy verification tasks on ``executor``; a task whose worker died is run here. A
    progress line (``nearcopy``, pairs verified) follows the tasks as they return."""
    def run(tasks: Sequence[VerifyTask]) -> Iterator[tuple[VerifyTask, EvidenceArrays]]:
        if not tasks:
            return
        progress = Progress("nearcopy", pairs_in(tasks), unit="pairs", quiet=quiet)
        # named by position, not by the task (a task list may make each task only as it is submitted)
        names = [f"verify-{t}-{uuid.uuid4().hex[:8]}" for t in range(len(tasks))]
        for task, result in executor.map_unordered(verify_task, tasks, keys=names, waiting=progress.waiting):
            progress.update(len(task.a_file))
            yield task, verify_task(task) if isinstance(result, WorkerLost) else result
        progress.close()
    return run


@dataclass(frozen=True)
class StageRun:
    """What :func:`run_stages` did: the checked samples (``prepared``) and, when it went through
    packing, the dataset's target (its kind and label names), the planned shards and what each
    shard's writer reported."""

    prepared: Prepared
    target: Target = field(default_factory=lambda: Target("class"))
    shards: tuple[PlannedShard, ...] = ()
    written: dict[str, ShardWrite] = field(default_factory=dict)


def run_stages(job: JobConfig, executor: Executor, *, through: Literal["audit", "pack"],
               cache_dir: Path | None, decode: bool = True, quiet: bool = False,
               storage_options: dict[str, Any] | None = None, staging: Path | None = None,
               leakage_dir: Path | None = None, keep_spill: bool = False) -> StageRun:
    """Run :data:`STAGES` of ``job`` on ``executor`` in order, up to and including ``through``.

    ``through="audit"`` (``packer validate``): nothing is written; ``cache_dir`` None keeps no
    spill (``decode`` False reads headers only). ``through="pack"`` (``packer build``): a failed
    audit writes ``leakage.json`` into ``leakage_dir`` and raises LeakageError; otherwise the
    shards are written into ``staging`` (emptied first) from the spill under ``cache_dir``, which
    the pack pass frees as it goes (:class:`~packer.pipeline.spill.SpillConsumer`) unless
    ``keep_spill``.
    """
    # packer validate writes no leakage.json, bad_samples.jsonl nor excluded.jsonl: they are parts of its report
    listings = BUILD_LISTINGS if through == "pack" else VALIDATE_LISTINGS
    prepared = _check(job, executor, cache_dir=cache_dir, decode=decode, quiet=quiet,
                      storage_options=storage_options, refer=not keep_spill, listings=listings)
    if prepared.files_cached and not quiet:
        print(f"packer: reused {prepared.files_cached} of {prepared.inputs} files from the build cache "
              "(their bytes' hashes checked out)", flush=True)
    warned_shards: frozenset[str] = frozenset()
    if cache_dir is not None:
        said = damage_report(cache_dir, [unit for c in prepared.chunks for unit in c.damaged],
                             surface().call("build", "keep_spill"))
        if not quiet:
            for line in said.lines:
                print(line, flush=True)
        for warning in said.warnings:  # a warning, not progress: printed under --quiet too
            print(f"packer: warning: {warning}", file=sys.stderr, flush=True)
        warned_shards = said.shards
    if through == "audit":
        return StageRun(prepared)
    if cache_dir is None or staging is None or leakage_dir is None:
        raise ValueError("run_stages(through='pack') needs cache_dir, staging and leakage_dir")
    if prepared.audit.failed:
        raise_on_leakage(prepared.audit, write_leakage(leakage_dir, prepared.audit))
    # an earlier build's failed audit, beside the versions: its findings are not this build's, and
    # its path is what that build's exit-4 message sent the user (or a script) to read
    (leakage_dir / LEAKAGE_FILE).unlink(missing_ok=True)
    samples = prepared.samples
    codes, labels = samples.codes("label")
    # the labels packed samples hold: a class only left-out samples held (drop_group, a split's drop) is no class
    target = dataset_target(job, tuple(labels[code] for code in np.unique(codes).tolist()))
    shards = plan_shards(samples, split_codes(samples, prepared.assignment.split), job.pack, target,
                         raw_paths=job.phi.mode == "keep")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    consumer = None if keep_spill else SpillConsumer(cache_dir, samples.column("spill"), keep=prepared.partial_spills)
    # the earlier versions in the dataset folder, whose identical shards are linked, not written
    earlier = EarlierShards(staging.parent, job.pack.format)
    written = pack_shards(shards, samples, executor, target, cache_dir, staging, job.pack.format, quiet, consumer,
                          raw_paths=job.phi.mode == "keep", earlier=earlier,
                          libraries=library_versions(source_libraries(job.sources)), warned=warned_shards)
    return StageRun(prepared, target=target, shards=tuple(shards), written=written)
