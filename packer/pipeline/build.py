"""Build: run a job end to end — discover, process, split, plan, pack, index, report, manifest.

1. discover (client): list raw files in a stable order, read the label tables.
2. process (dask, one task per chunk of files): header → decode → validate → transform, each
   file decoded once; sample bytes go to spill files in the build cache, small records back.
3. split + audit (client): on the records; no pixels on the client.
4. plan (client): shard boundaries from exact sizes (``pack.plan``).
5. pack (dask, one task per shard): copy spilled bytes into tar/Parquet shards, hash them;
   the client frees each shard's spill as its task returns (unless ``keep_spill``). A shard
   whose content key an earlier version of the output holds is linked from it instead
   (:mod:`packer.pipeline.reuse`).
6. index, bad-sample report, manifest (written last), registry copy; each cache entry then
   points at the published shards that now hold its samples, for the next build to reuse, and
   the cache's index of files lists what each entry holds (per-file reuse,
   :mod:`packer.pipeline.filecache`).

The bytes depend only on the inputs and the job: sorting happens on the client, never by
task completion order, so the worker count and scheduler do not matter.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import shutil
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packer import __version__
from packer.allocator import system_arrow_pool, tune_client_allocator
from packer.badsamples import REPORT_FILE, manifest_over_limit, summarize_issues, write_bad_samples
from packer.buildwarnings import write_warnings
from packer.config import SPLITS, JobConfig
from packer.errors import (
    BadFractionError,
    ConfigError,
    FileSystemError,
    PackerError,
    blocking_file,
    output_elsewhere,
    path_exists,
    refused_write,
    surface,
    unmakeable_folder,
)
from packer.exclusions import EXCLUDED_FILE, exclusion_counts, write_excluded
from packer.files import TMP_SUFFIX, atomic_output, file_sha256, folder_lock, human_bytes, stale_temporary
from packer.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    config_hash,
    index_schema,
    library_versions,
    read_dataset_hash,
    read_manifest,
    seal_manifest,
    write_manifest,
)
from packer.phi import unused_key_warning
from packer.pipeline.audit import LEAKAGE_FILE, write_leakage
from packer.pipeline.cluster import SharedPath, check_scheduler, open_executor
from packer.pipeline.discover import check_roots
from packer.pipeline.filecache import INDEX_NAME, write_file_index
from packer.pipeline.neighborcache import NEIGHBORS_STEM
from packer.pipeline.paircache import PAIRS_STEM
from packer.pipeline.pixels import stage_seconds
from packer.pipeline.plan import PlannedShard
from packer.pipeline.publish import (
    IndexColumns,
    PublishResult,
    publish_version,
    release_table_memory,
    write_index,
    write_splits_table,
)
from packer.pipeline.sampletable import SampleTable, sample_schema, several_dtypes, several_shapes
from packer.pipeline.spill import (
    cache_elsewhere,
    chunk_of,
    referenced_entries,
    remove_stale_temporaries,
    write_packed_pointers,
)
from packer.pipeline.split import empty_splits
from packer.pipeline.stages import constant_slices, non_finite_filled, run_stages, shared_roots
from packer.progress import stage_progress
from packer.read.kinds import source_libraries
from packer.records import Issue
from packer.shards.writer import ShardWrite
from packer.storage import WORK_DIR_ENV, build_cache_dir, check_output_store, resolve_output
from packer.targets import Target
from packer.versions import PROBE_PREFIX, remove_staging, staging_bytes, stale_staging, stale_version_temporaries

#: Where packer kept the build cache before it moved out of the output tree: ``<output>/<name>/.cache``.
#: A build that finds one there warns (it names raw paths, ids and dates); ``--fresh`` deletes it.
LEGACY_CACHE_DIR = ".cache"


@dataclass(frozen=True)
class BuildOptions:
    """Execution options: where and how to run. They never change ``dataset_hash``.

    ``out``: a folder, or a URL (``s3://bucket/prefix``) to build under ``work_dir``
    (default ``$PACKER_WORK_DIR`` or ``~/.cache/packer/work``) and then publish to
    (:func:`packer.pipeline.publish.publish_version`). ``storage_options`` configure every store the build
    reaches through a URL: that output's, and the raw inputs' (sources given as URLs), on the
    client and, sent with each task, on the workers.

    ``cache_dir``: the folder under which the build cache goes (``<cache_dir>/<name>-<digest>/``,
    :func:`packer.storage.build_cache_dir`) instead of ``<work_dir>/cache``. The cache names raw
    paths, entity ids and dates, so it stays out of the output tree by default. A ``scheduler``
    on other machines needs it (or ``$PACKER_WORK_DIR``, or ``work_dir``) to name a folder every
    worker mounts at the same path (:func:`cache_location`).
    """

    out: Path | str | None = None
    workers: int | None = None
    scheduler: str | None = None
    quiet: bool = False
    keep_cache: bool = True
    html_report: bool = True
    fresh: bool = False
    work_dir: Path | None = None
    storage_options: dict[str, Any] | None = None
    cache_dir: Path | None = None
    #: keep every chunk's spill in the build cache after packing: a second full copy of the
    #: dataset on disk, in exchange for rebuilds that reuse samples without the version folder
    #: (by default the pack pass frees the spill and rebuilds read reused samples back from
    #: the published shards: :mod:`packer.pipeline.spill`)
    keep_spill: bool = False


@dataclass(frozen=True)
class BuildResult:
    version_dir: Path
    manifest_path: Path
    manifest: dict[str, Any]
    issues: tuple[Issue, ...]
    reused: bool = False
    #: files of an already built version (``reused``) that were missing or damaged, replaced by this
    #: build's copies of the bytes its manifest records
    restored: tuple[str, ...] = ()
    #: the local reports of an already built version (``reused``) that this build's differ from (its
    #: bad files, or those left out, changed without changing the dataset), each replaced or removed;
    #: report.html among them where this build wrote it (it was missing, or renders otherwise now)
    reports_rewritten: tuple[str, ...] = ()
    registry_copy: Path | None = None
    #: whether this build wrote the registry copy (False: the copy of the same dataset was already there)
    registry_written: bool = False
    executor: str = ""
    files_decoded: int = 0
    files_cached: int = 0  # files whose samples came from the build cache
    stage_seconds: tuple[tuple[str, float], ...] = ()
    html_report: Path | None = None
    remote_url: str | None = None  # the output URL, when the output is one
    published: PublishResult | None = None  # set when remote_url is and the bad fraction is within limits
    phi_key_source: str | None = None  # where the PHI key came from (never the key); None without pseudonyms
    files_total: int = 0  # the input files (the manifest's inputs.files)
    #: shards written by this build, and those linked from an earlier version instead
    #: (:mod:`packer.pipeline.reuse`), with their bytes
    shards_written: int = 0
    shards_reused: int = 0
    bytes_written: int = 0
    bytes_reused: int = 0

    @property
    def over_threshold(self) -> bool:
        return manifest_over_limit(self.manifest)

    @property
    def work_line(self) -> str:
        """What the build did, in one line: ``decoded N of M files, wrote K of S shards (X),
        reused S-K (Y)``."""
        shards = self.shards_written + self.shards_reused
        return (f"decoded {self.files_decoded} of {self.files_total} files, wrote {self.shards_written} of {shards} "
                f"shards ({human_bytes(self.bytes_written)}), reused {self.shards_reused} "
                f"({human_bytes(self.bytes_reused)})")


def _split_summary(samples: SampleTable, shards: Sequence[PlannedShard], written: dict[str, ShardWrite],
                   targets: TargetColumns) -> dict[str, Any]:
    """Per split: samples, entities, the label balance (``class_counts``: samples per class, or
    per label of a multi-label target; a masked target adds ``ignored_counts`` and
    ``negative_counts``) and, for numeric targets, ``target_stats`` per name."""
    entity_codes, _ = samples.codes("entity")
    target = targets.target
    summary: dict[str, Any] = {}
    for split in SPLITS:
        mine = [s for s in shards if s.split == split]
        rows = np.concatenate([s.rows for s in mine]) if mine else np.zeros(0, dtype=np.int64)
        entry: dict[str, Any] = {"samples": int(rows.size), "entities": int(np.unique(entity_codes[rows]).size)}
        entry.update(target.split_counts(targets.labels[rows], targets.vectors[rows],
                                         None if targets.masks is None else targets.masks[rows]))
        entry["shards"] = [written[s.file].to_entry() for s in mine]
        summary[split] = entry
    return summary


def _mask_schema(job: JobConfig, sample_layout: str) -> dict[str, Any]:
    """What every sample's mask is (the manifest's ``mask``): its dtype, declared class ids
    (the union over the sources; null where a source accepts any id), its layout (``FHW`` on a
    C×H×W image, ``DHW`` on a C×D×H×W volume) and the id ``fit`` pads with (a loss may ignore it)."""
    masks = [s.mask for s in job.sources if s.mask is not None]
    declared = None if any(m.classes is None for m in masks) else sorted({c for m in masks for c in m.classes or ()})
    layout = "DHW" if sample_layout == "CDHW" else "FHW"
    out: dict[str, Any] = {"dtype": masks[0].dtype, "classes": declared, "layout": layout, "pad": masks[0].pad}
    named: dict[str, dict[str, Any]] = {}  # masks from DICOM: each class id's name and the structures it takes
    for mask in masks:
        for key, structures in (("segments", mask.segments), ("rois", mask.rois)):
            for s in structures.structures if structures is not None else ():
                entry = named.setdefault(str(s.id), {"name": s.name})
                entry[key] = sorted({*entry.get(key, []), s.name, *s.aliases})
                if s.codes:
                    entry["codes"] = sorted({*entry.get("codes", []), *s.codes})
    if named:
        out["names"] = dict(sorted(named.items(), key=lambda item: int(item[0])))
    return out


@dataclass(frozen=True)
class IndexFields:
    """The index's text columns of the packed samples (key, entity id, source), made once from the
    table's buffers and codes, and taken a shard's rows at a time: a take of every field of the
    table for each shard (nine text fields copied for three read) was most of the index stage's
    time at 10M samples."""

    keys: pa.Array
    entity_ids: pa.DictionaryArray
    sources: pa.DictionaryArray

    @classmethod
    def of(cls, samples: SampleTable) -> IndexFields:
        entity_codes, entities = samples.codes("entity")
        source_codes, sources = samples.codes("source")
        return cls(keys=samples.arrow("key"),
                   entity_ids=pa.DictionaryArray.from_arrays(pa.array(entity_codes, pa.int32()),
                                                             pa.array([e or "" for e in entities], pa.string())),
                   sources=pa.DictionaryArray.from_arrays(pa.array(source_codes, pa.int32()),
                                                          pa.array(list(sources), pa.string())))

    def of_rows(self, rows: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array]:
        """(keys, entity ids with "" where none, sources) of ``rows``, as string arrays."""
        taken = pa.array(rows, pa.int64())
        return (self.keys.take(taken), self.entity_ids.take(taken).dictionary_decode(),
                self.sources.take(taken).dictionary_decode())


@dataclass(frozen=True)
class TargetColumns:
    """Every packed sample's target as arrays (row = sample table row): ``labels`` the class
    index (-1 without a class target), ``vectors`` the N×L target vectors (N×0 without),
    ``masks`` the N×L uint8 target masks of a masked target (None without)."""

    target: Target
    labels: np.ndarray
    vectors: np.ndarray
    masks: np.ndarray | None = None

    @classmethod
    def of(cls, samples: SampleTable, target: Target) -> TargetColumns:
        codes, texts = samples.codes("label")
        # once per distinct text a packed sample holds (the column's values may include those of
        # samples left out of the table since: drop_group, a split's drop; no class of the target)
        held = np.zeros(len(texts), dtype=bool)
        held[np.unique(codes)] = True
        encoded = [target.encode(text, where=f"label {text!r}") if held[i] else (None, None)
                   for i, text in enumerate(texts)]
        labels = np.array([-1 if label is None else label for label, _ in encoded], dtype=np.int64)
        width = len(target.names) if target.has_vector else 0
        vectors = np.array([v if v is not None else np.zeros(width) for _, v in encoded],
                           dtype=target.vector_dtype).reshape(len(encoded), width)
        masks = None
        if target.masked:
            masks = np.array([target.encode_mask(text, where=f"label {text!r}") if held[i] else np.zeros(width)
                              for i, text in enumerate(texts)], dtype=np.uint8).reshape(len(texts), width)[codes]
        return cls(target=target, labels=labels[codes], vectors=vectors[codes], masks=masks)

    def index_schema(self) -> pa.Schema:
        return index_schema(has_label=self.target.has_label,
                            target=self.target.vector_dtype if self.target.has_vector else None,
                            masked=self.masks is not None)

    def index_labels(self, rows: np.ndarray) -> Sequence[int | None]:
        return self.labels[rows].tolist() if self.target.has_label else [None] * len(rows)

    def index_targets(self, rows: np.ndarray) -> list[np.ndarray] | None:
        return list(self.vectors[rows]) if self.target.has_vector else None

    def index_target_masks(self, rows: np.ndarray) -> list[np.ndarray] | None:
        return None if self.masks is None else list(self.masks[rows])


def build(job: JobConfig, options: BuildOptions | None = None) -> BuildResult:
    """Build the dataset ``job`` describes; return where it went and what it holds.

    Raises ConfigError (bad sources or tables), LeakageError (the split audit failed) and
    FileSystemError (a disk full, over quota or read-only; the build cache keeps what was done).
    A bad fraction over the threshold is not raised here: the report and manifest are written
    and ``BuildResult.over_threshold`` says so (``check_bad_fraction`` raises it).
    """
    tune_client_allocator()  # see packer.allocator
    options = options or BuildOptions()
    watched: list[_Watched] = []
    begun = _Begun()
    try:
        with system_arrow_pool(), _one_build_at_a_time(job, options) as locked, contextlib.ExitStack() as held:
            return _build(job, options, watched, begun, locked=locked, held=held)
    except (_ReportNotWritten, _RegistryNotWritten, _RefusedBeforeWork):
        raise
    except FileSystemError as err:
        if not begun.stages:  # refused before any file was decoded (the cache folder itself, say): no cache to keep
            raise
        raise FileSystemError(f"{err}. Files decoded before it stopped stay in the build cache, except those whose "
                              "samples were already copied into shards; the next build into the same output "
                              "folder decodes only the rest") from err
    except OSError as err:
        vanished = _vanished_folder(err, watched)
        if vanished is None:
            raise
        raise vanished from err
    finally:
        for place in watched:
            place.forget()


def _remove_stale_staging(dataset_root: Path, staging: Path, *, quiet: bool, warned: list[tuple[str, str]]) -> None:
    """Remove the staging folders an interrupted build of this dataset left under another
    configuration (its own, ``staging``, it resumes from): held under the dataset folder's lock, no
    build writes them, and no later build of the edited job would ever clear them. One the file
    system refuses to remove is warned of (added to ``warned``) and left: it costs disk, not
    correctness."""
    removed, freed = [], 0
    for path in stale_staging(dataset_root, keep=staging.name):
        size = staging_bytes(path)
        try:
            remove_staging(path)
        except OSError as err:
            _warn("output_folder", f"cannot remove {err.filename or path}, a staging folder an interrupted build "
                  f"left: {err.strerror or err}; remove it by hand, or run `packer gc {dataset_root}`", warned)
            continue
        removed.append(path.name)
        freed += size
    if removed and not quiet:
        print(f"packer: removed {len(removed)} staging folder(s) an interrupted build left "
              f"({', '.join(removed)}; {human_bytes(freed)} freed)", flush=True)


@dataclass
class _Watched:
    """A folder the build writes into and must keep while it runs, and what to say if it vanishes."""

    folder: Path
    what: str  # "the build cache", "the staging folder"
    fix: str
    marker: Path | None = None  # an empty file left in the folder while the build runs (:meth:`note`)

    def note(self) -> None:
        """Leave a marker file in the folder (it exists now), whose absence later says the folder
        was removed even where a later write made a folder of that name again (a removed folder's
        inode number is soon reused, so comparing inodes would not). Its name ends in ``.partial``:
        a build killed before :meth:`forget` has it removed by the next one."""
        marker = self.folder / f"{PROBE_PREFIX}watched-{uuid.uuid4().hex}{TMP_SUFFIX}"
        with contextlib.suppress(OSError):  # no marker: only a missing folder counts as removed
            marker.touch()
            self.marker = marker

    def forget(self) -> None:
        if self.marker is not None:
            with contextlib.suppress(OSError):
                self.marker.unlink(missing_ok=True)

    def gone(self) -> bool:
        """Whether the folder was removed while the build ran (made again since, or not)."""
        return not path_exists(self.marker if self.marker is not None else self.folder)


def _vanished_folder(err: OSError, watched: Sequence[_Watched]) -> FileSystemError | None:
    """The :class:`FileSystemError` for a file not found (``err``) because a folder the build
    writes into was removed while it ran (a /tmp or scratch cleaner, a node-local disk unmounted,
    a user deleting a stale-looking cache), naming the folder that went and the fix; None when
    ``err`` is no such error (a bug then stays one). The folder named is the outermost one gone
    (the work folder, where the whole of it went)."""
    if not isinstance(err, FileNotFoundError):
        return None
    for place in watched:
        inside = err.filename is None or Path(os.path.abspath(os.fsdecode(err.filename))).is_relative_to(
            os.path.abspath(place.folder))
        if not inside or not place.gone():
            continue
        gone = place.folder
        while gone.parent != gone and not path_exists(gone.parent):
            gone = gone.parent
        held = f"{gone}, which held {place.what} {place.folder}," if gone != place.folder else \
            f"{place.what} {place.folder}"
        return FileSystemError(f"{held} was removed while the build ran ({err.strerror or err}: "
                               f"{os.fsdecode(err.filename) if err.filename else 'a file in it'}); {place.fix}")
    return None


@contextlib.contextmanager
def _one_build_at_a_time(job: JobConfig, options: BuildOptions) -> Iterator[bool]:
    """Hold an exclusive lock (``flock``) on the dataset folder ``<output>/<name>/`` while the
    build runs. Two builds of one job into one output share its staging folder and build cache:
    each deleted the other's temporaries, and one died with an internal error. The second is
    refused instead (exit 2). The lock goes with the process (``kill -9`` included);
    a file system without directory locks builds unguarded, as before. A folder made only to
    hold the lock is removed again when the build left nothing in it, before the lock is let go;
    a build refused by the lock leaves the folder be, even one it made itself: the build that
    locked it a moment later holds it (removed, its lock would guard nothing). Yields whether the
    lock is held."""
    output, _ = resolve_output(options.out or job.output, options.work_dir)
    folder = output / job.name
    check_output_folder(folder, output=output, named_by=_output_named(options, output, remote=False))
    made = [p for p in (folder, *folder.parents) if not path_exists(p)]  # deepest first

    def remove_made() -> None:
        with contextlib.suppress(OSError):  # only while empty: a refused job leaves no trace
            for path in made:
                path.rmdir()

    lock = contextlib.ExitStack()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # not permitted, read-only, full; or a place no folder can be made (/proc, a file's name)
        remove_made()
        refused = refused_write(err, folder, opening=True)
        raise _RefusedBeforeWork(str(refused) if refused is not None else (
            f"{folder}: the output folder cannot be made there ({err.strerror or err}); choose a folder on a "
            f"writable file system ({surface().call('build', 'out', placeholder='DIR')})")) from err
    try:
        busy = (f"{folder}: another `packer build` of {job.name} into this folder is running, or a `packer gc` of "
                "it (it holds the folder's lock); wait for it to end, then build again: what a build decoded is in "
                "the build cache")
        held = lock.enter_context(folder_lock(folder, busy))
    except OSError as err:
        refused = refused_write(err, folder, opening=True)
        if refused is not None:  # not permitted, read-only, full: said now, before any file is decoded
            remove_made()
            raise _RefusedBeforeWork(str(refused)) from err
        yield False  # a file system without directory locks: the build runs unguarded
        return
    except ConfigError:  # another build holds the folder: it is that build's now, even where this one made it
        raise
    with lock:
        try:
            yield held
        finally:
            remove_made()  # while the lock is held: a build that starts now waits for it, or finds no folder


@contextlib.contextmanager
def _one_build_per_cache(cache_dir: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock (``flock``) on the build cache folder ``cache_dir`` while the build
    runs, made for it where it is not there yet (and removed again, before the lock is let go,
    when the build left nothing in it). The dataset folder's lock (:func:`_one_build_at_a_time`)
    does not cover it: a build for a URL holds that lock in its own work folder, so two people
    building one job into one URL with one shared ``--cache-dir`` (each with their own work
    folder) shared the cache folder unguarded; each deleted the other's temporaries and one died
    with an internal error. The second is refused instead (ConfigError, exit 2), as the dataset
    folder's lock refuses it. A file system without directory locks builds unguarded. A folder
    removed between its opening and its locking (the build that held it pruned it away) is made
    and locked again, so the lock is always on the folder the build writes into."""
    busy = (f"{cache_dir}: another `packer build` of {name} into the same output is running with this build cache "
            "(it holds the cache folder's lock; a build for a URL holds its dataset folder's lock in its own work "
            "folder, so a colleague's build shows only here); wait for it to end, then build again: what a build "
            "decoded is in the build cache")
    made = [p for p in (cache_dir, *cache_dir.parents) if not path_exists(p)]  # deepest first
    lock = contextlib.ExitStack()
    for _ in range(3):
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            before = os.stat(cache_dir)
            locked = lock.enter_context(folder_lock(cache_dir, busy))
            now = os.stat(cache_dir)
        except FileNotFoundError as err:  # removed between mkdir and lock, or a place that takes no folder
            lock.close()
            if path_exists(cache_dir.parent):
                continue
            refused = unmakeable_folder(err, cache_dir, cache_elsewhere())
            if refused is None:
                raise
            raise refused from err
        except OSError as err:  # not permitted, read-only, full: said before any file is decoded
            lock.close()
            refused = refused_write(err, cache_dir, opening=True, elsewhere=cache_elsewhere())
            if refused is None:
                raise
            raise refused from err
        if locked and (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
            lock.close()  # removed and made again meanwhile: this lock would guard nothing
            continue
        break
    else:
        raise FileSystemError(f"{cache_dir}: the build cache folder was removed as soon as it was made, three "
                              "times; something removes it while builds run (a cleaner, another build's --fresh): "
                              f"keep the build cache on a folder that persists ({cache_elsewhere()})")
    with lock:
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # only while empty: a build that did nothing leaves no trace
                for path in made:
                    path.rmdir()


class _ReportNotWritten(FileSystemError):
    """The dataset is published; only its HTML report could not be written."""


class _RegistryNotWritten(FileSystemError):
    """The dataset is published; only its registry copy could not be written."""


class _RefusedBeforeWork(FileSystemError):
    """The output folder could not be made: nothing was decoded yet."""


@dataclass
class _Begun:
    """How far :func:`_build` got: ``stages``, the stages that decode files into the build cache ran."""

    stages: bool = False


def _build(job: JobConfig, options: BuildOptions, watched: list[_Watched], begun: _Begun, *, locked: bool,
           held: contextlib.ExitStack) -> BuildResult:
    """:func:`build`'s work; adds to ``watched`` the folders it writes into (the build cache, the
    staging folder), for :func:`build` to name the one that vanished; notes in ``begun`` when the
    stages start decoding files into the build cache. ``locked``: the dataset
    folder's lock is held (other configurations' staging folders are then an interrupted
    build's, and removed). ``held``: what the build holds until :func:`build` returns (the build
    cache folder's lock: :func:`_one_build_per_cache`)."""
    output, remote = resolve_output(options.out or job.output, options.work_dir)
    if remote is not None:  # an unknown protocol or a storage option the store does not take: before any decoding
        check_output_store(remote, options.storage_options)
    identity = job.manifest_config()
    cfg_hash = config_hash(identity)
    dataset_root = output / job.name
    check_scheduler(options.scheduler)  # a mistyped address first: the cache's advice is for a real cluster
    cache_dir, cache_named_by = cache_location(job.name, options, output=output, remote=remote)
    staging = dataset_root / f".staging-{cfg_hash[:16]}"
    cache_option = surface().call("build", "cache_dir", placeholder="DIR")
    watched += [_Watched(cache_dir, "the build cache",
                         "run the build again, and keep the build cache on a folder that persists while a build runs, "
                         f"not one a cleaner empties ({cache_option}, or set PACKER_WORK_DIR)"),
                _Watched(staging, "the staging folder",
                         "run the build again, and leave the output folder's .staging-* folders alone while a build "
                         "of the job runs")]

    check_output_folder(dataset_root, output=output, named_by=_output_named(options, output, remote=bool(remote)))
    check_cache_folder(cache_dir, named_by=cache_named_by)
    held.enter_context(_one_build_per_cache(cache_dir, job.name))
    if options.fresh:  # its entries, not the folder: the folder holds this build's lock
        for entry in list(cache_dir.iterdir()):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    # the warnings printed before the stages run, kept with theirs in warnings.jsonl (README: the
    # warnings the build printed), in the order printed
    warned: list[tuple[str, str]] = []
    _handle_legacy_cache(dataset_root / LEGACY_CACHE_DIR, cache_dir, fresh=options.fresh, quiet=options.quiet,
                         warned=warned)
    unused_key = unused_key_warning(job.phi)
    if unused_key is not None:
        _warn("phi", unused_key, warned)
    if remote is None and cache_dir.is_relative_to(output):
        _warn("output_folder", f"the build cache {cache_dir} ({cache_named_by}) is inside the output folder "
              f"{output}: it names raw file paths, entity ids and dates, so do not share that folder as it is; "
              f"choose a cache folder outside it ({surface().call('build', 'cache_dir', placeholder='DIR')})",
              warned)
    check_roots(job)  # a root that is nowhere is the job's error, not the workers'
    # the output folder's own (its probe: below) too; it is held under the job's build lock
    stale = remove_stale_temporaries(cache_dir) + remove_stale_temporaries(dataset_root)
    if stale and not options.quiet:
        print(f"packer: removed {stale} stale temporary file(s) left by an interrupted build", flush=True)
    if locked:  # unguarded (no directory locks), another configuration's build may be writing its own
        _remove_stale_staging(dataset_root, staging, quiet=options.quiet, warned=warned)
    with open_executor(options.scheduler, options.workers, source_libraries(job.sources),
                       private=job.phi.mode == "pseudonymize") as executor, \
            _shared_probe(cache_dir) as probe, \
            _shared_probe(dataset_root, output_elsewhere()) as written_probe:
        executor.require_shared(_shared_paths(job, probe, cache_named_by))
        watched[0].note()  # the cache folder exists now (its probe is in it)
        # the workers write the shards into the output folder: one that sees another folder there
        # wrote them where the client never looks, and the version was published without them
        named = _output_named(options, output, remote=remote is not None)
        executor.require_shared([(str(written_probe), f"the output folder ({named})",
                                  "mount it at the same path on every worker, or choose a folder they all share "
                                  f"({surface().option('out', 'DIR')})", "file")])
        begun.stages = True
        run = run_stages(job, executor, through="pack", cache_dir=cache_dir, quiet=options.quiet,
                         storage_options=options.storage_options, staging=staging, leakage_dir=dataset_root,
                         keep_spill=options.keep_spill)
        description = executor.description
    prepared, target, shards, written = run.prepared, run.target, run.shards, run.written
    del run
    samples, issues, assignment = prepared.samples, list(prepared.issues), prepared.assignment
    cached_files = prepared.files_cached

    # a long index shows an "index" line: shards indexed, the index and splits tables' writing in its time
    with stage_progress("index", len(shards), unit="shards", quiet=options.quiet) as progress:
        targets = TargetColumns.of(samples, target)
        # each shard's index columns wait on the work disk, not in the client, until the index is written
        index = IndexColumns(targets.index_schema(), spill=cache_dir / f"index-{cfg_hash[:16]}.arrow{TMP_SUFFIX}")
        try:
            fields = IndexFields.of(samples)
            for shard in shards:
                keys, entity_ids, sources = fields.of_rows(shard.rows)
                index.add_shard(written[shard.file], split=shard.split, keys=keys,
                                labels=targets.index_labels(shard.rows), entity_ids=entity_ids, sources=sources,
                                targets=targets.index_targets(shard.rows),
                                target_masks=targets.index_target_masks(shard.rows))
                progress.update()
            del fields
            index_entry = write_index(staging, index)
        finally:
            index.discard()
        del index
        splits_entry = write_splits_table(staging, samples, assignment, prepared.phi)
    write_leakage(staging, prepared.audit)
    write_bad_samples(staging, issues)
    if prepared.excluded:  # only where files were left out: a dataset without any keeps its folder as it was
        write_excluded(staging, prepared.excluded)
    release_table_memory()
    body = {
        "format_version": FORMAT_VERSION,
        "name": job.name,
        "packer_version": __version__,
        "config": identity,
        "config_hash": cfg_hash,
        "libraries": library_versions(source_libraries(job.sources)),
        "decoders": _decoders(),
        "format": job.pack.format,
        "sample_schema": (schema := sample_schema(samples)),
        "label_map": target.label_map,
        **({"target": record} if (record := target.manifest_record()) is not None else {}),
        **({"mask": _mask_schema(job, schema["layout"])} if any(s.mask is not None for s in job.sources) else {}),
        "splits": _split_summary(samples, shards, written, targets),
        "inputs": {"files": prepared.inputs, "samples": len(samples), **exclusion_counts(prepared.excluded),
                   **({"constant_slices": n} if (n := constant_slices([note for chunk in prepared.chunks
                                                                      for note in chunk.notes])) else {}),
                   **({"non_finite_filled": n} if (n := non_finite_filled([note for chunk in prepared.chunks
                                                                          for note in chunk.notes])) else {})},
        "bad_samples": {**summarize_issues(issues, inputs=prepared.considered, max_fraction=job.max_bad_fraction),
                        "report": REPORT_FILE},
        "audit": prepared.audit.to_json(listed=False),
        "index": index_entry,
        "splits_table": splits_entry,
        "phi": {"mode": job.phi.mode, "dates": job.phi.dates, "key_fingerprint": prepared.phi.fingerprint},
    }
    # every warning the build prints, the summary's of the packed dataset too (a split that got no
    # sample, shapes no batch stacks): only where there were, and the report shows them at its top
    manifest = seal_manifest(body)
    warned += prepared.warnings  # printed as the stages ran
    for other_key in _other_key_warnings(dataset_root, manifest):
        _warn("phi", other_key, warned)
    warned += dataset_warnings(body)  # printed under the build's summary
    write_warnings(staging, warned)
    version_dir = dataset_root / manifest["version"]
    unpointed = {chunk_of(name) for name in prepared.partial_spills}  # chunks whose spill stays
    pointer_error: OSError | PackerError | None = None
    if options.keep_cache:  # before the manifest lands: a build stopped once it is published still resumes from them
        try:
            write_packed_pointers(cache_dir, version_dir, _placed(samples, shards, written), skip=unpointed)
        except (OSError, FileSystemError, ConfigError) as err:  # a full, read-only or blocked cache (atomic_output's
            pointer_error = err  # errors): the version does not depend on it; publish it, then say why it failed
    reused, restored, rewritten = _publish(staging, version_dir, manifest)
    # a killed build's (or `packer report`'s) half-written report or manifest in the dataset's version folders,
    # this one's included (it writes its report again): under the lock, only ones whose writer is gone
    # A leftover it cannot remove is printed on stderr but kept out of the version's
    # warnings.jsonl: it is the folder's state, not the dataset's, and a published version left as it was
    # (a read-only one) must not be written into to record it.
    _remove_stale(stale_version_temporaries(dataset_root, lock_held=locked), quiet=options.quiet, warned=[],
                  fix=f"run `packer gc {dataset_root}` (or remove it by hand)")
    if pointer_error is not None:
        raise pointer_error
    if reused:  # the staged copy is gone: this build's warnings replace (or remove) the earlier build's
        write_warnings(version_dir, warned)
    # What the result needs, then the per-sample records go: the HTML report reads what it needs
    # back from the version folder, and would otherwise stack its own peak on top of them.
    used_chunks = {c.key for c in prepared.chunks} | {PAIRS_STEM, NEIGHBORS_STEM}  # the near-copy caches stay too
    # a chunk that got no pointer still reads the samples it holds by reference through earlier entries' pointers
    used_chunks |= referenced_entries({*samples.codes("spill")[1], *prepared.partial_spills}, unpointed)
    used_units = [(c.key, c.units) for c in prepared.chunks if c.units]
    files_decoded, files_total = prepared.files_decoded, prepared.inputs
    reused_shards = [w for w in written.values() if w.reused]
    shards_reused, bytes_reused = len(reused_shards), sum(w.bytes for w in reused_shards)
    shards_written, bytes_written = len(written) - shards_reused, sum(w.bytes for w in written.values()) - bytes_reused
    seconds = {**stage_seconds(prepared.chunks),
               "pack (copy+encode+write+hash)": sum(w.seconds for w in written.values())}
    sorted_issues = tuple(sorted(issues, key=lambda i: (i.path, i.sample_id)))
    phi_key_source = prepared.phi.key_source
    del prepared, samples, issues, assignment, shards, written, body
    html_report = None
    if options.html_report:
        from packer.htmlreport import write_report

        try:
            html = write_report(version_dir, quiet=options.quiet)
            html_report = html.path
            if reused and html.wrote:  # missing (a build stopped before it) or rendered otherwise: listed with the rest
                rewritten = (*rewritten, html.path.name)
        except FileSystemError as err:
            raise _ReportNotWritten(f"{err}. The dataset itself is complete in {version_dir}, manifest included; "
                                    f"once there is room, `packer report {version_dir}` writes the report") from err
    _prune_cache(cache_dir, used_chunks, keep=options.keep_cache)
    if options.keep_cache:  # after the prune: the index lists only entries that exist
        write_file_index(cache_dir, used_units)
    del used_units
    published = None
    if remote is not None and not manifest_over_limit(manifest):  # a failed build (exit 3) stays local
        published = publish_version(version_dir, remote, storage_options=options.storage_options,
                                    quiet=options.quiet)
    # listed only once the version is where it is read from: a publish that failed or was killed
    # left a registry entry for a version the store had no manifest of
    registry_copy, registry_written = None, False
    if job.registry is not None and not manifest_over_limit(manifest):  # a failed build (exit 3) is not listed
        registry_copy = job.registry / job.name / f"{manifest['version']}.json"
        # a killed build's half-written copy: no lock covers the registry (builds of two outputs share it),
        # so only one whose writer is gone
        _remove_stale(_registry_temporaries(registry_copy.parent), quiet=options.quiet, warned=warned,
                      fix="remove it by hand (it is no manifest: do not commit it)")
        try:
            registry_written = write_manifest_copy(registry_copy, version_dir / MANIFEST_FILE)
        except FileSystemError as err:  # the dataset is out: say so, and that --out moves no registry
            where = f"{version_dir} and at {remote}" if remote is not None else str(version_dir)
            raise _RegistryNotWritten(
                f"{err}. The version {manifest['version']} itself is complete and published in {where}, manifest "
                f"included; only its registry copy is missing. Once the registry folder {job.registry} (the job's "
                "`registry:`) can be written, building the job again writes the copy and rebuilds nothing") from err
    return BuildResult(version_dir=version_dir, manifest_path=version_dir / MANIFEST_FILE,
                       manifest=read_manifest(version_dir / MANIFEST_FILE).data,
                       issues=sorted_issues, reused=reused, restored=restored, reports_rewritten=rewritten,
                       registry_copy=registry_copy, registry_written=registry_written, executor=description,
                       html_report=html_report,
                       files_decoded=files_decoded, files_cached=cached_files, remote_url=remote, published=published,
                       stage_seconds=tuple(sorted(seconds.items())), phi_key_source=phi_key_source,
                       files_total=files_total, shards_written=shards_written, shards_reused=shards_reused,
                       bytes_written=bytes_written, bytes_reused=bytes_reused)


def _registry_temporaries(folder: Path) -> list[Path]:
    """The ``*.partial`` files of the registry folder ``<registry>/<name>/`` that a killed build
    left (``<version>.json.<pid>-<hex>.partial``, its writer gone: :func:`packer.files.stale_temporary`)."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [Path(e.path) for e in entries if e.name.endswith(TMP_SUFFIX) and e.is_file(follow_symlinks=False)
            and stale_temporary(Path(e.path), lock_held=False)]


def _remove_stale(paths: list[Path], *, quiet: bool, warned: list[tuple[str, str]], fix: str) -> None:
    """Remove the temporaries ``paths`` writers that are gone left, saying so as the build's
    first cleanup does. One the file system refuses to remove (a read-only folder or mount, no
    permission) is warned of (added to ``warned``), naming it and ``fix``, and left: it runs after
    the version is published, and a leftover costs disk, not correctness."""
    removed = 0
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            _warn("output_folder", f"cannot remove {err.filename or path}, a temporary file an interrupted build "
                  f"left: {err.strerror or err}; make its folder writable (a read-only mount: remount it read-write; "
                  f"no permission: run as the folder's owner), then {fix}", warned)
            continue
        removed += 1
    if removed and not quiet:
        print(f"packer: removed {removed} stale temporary file(s) left by an interrupted build", flush=True)


def _placed(samples: SampleTable, shards: Sequence[PlannedShard], written: dict[str, ShardWrite]
            ) -> Iterator[tuple[str, str, str, int]]:
    """(chunk key, sample key, shard file, position) of every packed sample."""
    spill_codes, spills = samples.codes("spill")
    chunks = [chunk_of(spill) for spill in spills]
    for shard in shards:  # keys read a shard at a time, not as one list of every key
        keys = samples.field_text("key").take(shard.rows).values()
        for code, key, position in zip(spill_codes[shard.rows].tolist(), keys, written[shard.file].positions,
                                       strict=True):
            yield chunks[code], str(key), shard.file, position


def dataset_warnings(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(code, message) of what the build's summary warns of the packed dataset (its manifest, or
    the body of one): each split that asked for samples and got none, and shapes or dtypes no
    batch stacks; as ``packer validate --json`` codes them."""
    schema = manifest["sample_schema"]
    return [*(("empty_split", e.message) for e in empty_splits(manifest["config"]["split"], manifest["splits"])),
            *(("several_shapes", m) for m in several_shapes(schema)),
            *(("several_dtypes", m) for m in several_dtypes(schema))]


def _decoders() -> dict[str, str]:
    from packer.read.dicom import decoder_table

    return dict(sorted(decoder_table().items()))


@contextlib.contextmanager
def _shared_probe(cache_dir: Path, elsewhere: str = "") -> Iterator[Path]:
    """A file with a fresh name in the build cache folder (or the job's output folder) while the
    body runs: a worker that sees it sees this client's folder. It ends in ``.partial``, so a
    build killed before removing it has it removed by the next one, as other stale temporaries
    (:func:`~packer.pipeline.spill.remove_stale_temporaries`). ``elsewhere``: the fix for a
    folder the file system refuses (default: another cache folder)."""
    probe = cache_dir / f"{PROBE_PREFIX}{uuid.uuid4().hex}{TMP_SUFFIX}"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        probe.touch()
    except OSError as err:
        refused = (refused_write(err, probe, opening=True, elsewhere=elsewhere or cache_elsewhere())
                   or unmakeable_folder(err, probe, elsewhere or cache_elsewhere()))
        if refused is None:
            raise
        raise refused from err
    try:
        yield probe
    finally:
        probe.unlink(missing_ok=True)


def _shared_paths(job: JobConfig, probe: Path, cache_named_by: str) -> list[SharedPath]:
    """What every worker must see at the client's paths: the build cache (through ``probe``) and
    each local source root (README, Running on a cluster: Storage)."""
    paths: list[SharedPath] = [(str(probe), f"the build cache folder ({cache_named_by})",
                                "mount it at the same path on every worker, or choose a folder they all share "
                                f"({surface().call('build', 'cache_dir', placeholder='DIR')}, or PACKER_WORK_DIR)",
                                "file")]
    return [*paths, *shared_roots(job)]


def _output_named(options: BuildOptions, output: Path, *, remote: bool) -> str:
    """What chose the output folder ``output``, with it, for messages: ``--out DIR`` (``out='DIR'``
    from Python), the job's ``output``, or the local work folder of a build for a URL."""
    if remote:
        return f"the local work folder ($PACKER_WORK_DIR) {output}"
    return surface().option("out", output) if options.out else f"the job's output {output}"


def check_output_folder(folder: Path, *, output: Path, named_by: str) -> None:
    """Raise ConfigError, before any work starts, when a file stands where ``folder`` (inside the
    ``output`` folder that ``named_by`` names, with it: :func:`_output_named`) or one of its
    parents must be a folder. Creates nothing: a job refused later leaves no trace."""
    blocker = blocking_file(folder)
    if blocker is None:
        return
    fix = output_elsewhere() if blocker in (output, *output.parents) else f"remove that file, or {output_elsewhere()}"
    raise ConfigError(f"{named_by}: cannot create the folder {folder}: {blocker} is a file, not a "
                      f"folder; {fix}")


def cache_location(name: str, options: BuildOptions, *, output: Path, remote: str | None) -> tuple[Path, str]:
    """The build cache folder of the job ``name`` (:func:`packer.storage.build_cache_dir`) and
    what chose it, for messages.

    The cache is never in the output tree by default: it names raw paths, entity ids and dates,
    and an output folder gets synced and shared. It goes under ``options.cache_dir``, else
    ``<work folder>/cache`` (``options.work_dir``, ``$PACKER_WORK_DIR`` or
    ``~/.cache/packer/work``). Every worker must reach it at the same path: true of any local
    folder for the local cluster and ``sync``. A ``scheduler`` elsewhere may run tasks on other
    machines, where a folder in this user's home is not the same folder, so there the cache
    folder must be chosen (``cache_dir``, ``work_dir`` or ``$PACKER_WORK_DIR``): ConfigError
    otherwise, before anything is written.
    """
    location = remote if remote is not None else str(output)
    if options.cache_dir is not None:
        return build_cache_dir(name, location, options.cache_dir), surface().name("cache_dir")
    explicit = options.work_dir is not None or bool(os.environ.get(WORK_DIR_ENV))
    folder = build_cache_dir(name, location, work=options.work_dir)
    if options.scheduler not in (None, "sync") and not explicit:
        raise ConfigError(
            f"{surface().option('scheduler', options.scheduler)}: the cluster's workers write and read the build "
            f"cache, so it must be on a file system every worker mounts at the same path; the default, "
            f"{folder.parent}, is in this user's home on this machine. Set {WORK_DIR_ENV} (or pass "
            f"{surface().option('cache_dir', placeholder='DIR')}) to a shared folder outside "
            "the output folder (the cache names raw file paths, entity ids and dates, so it does not belong with "
            f"the dataset), e.g. {WORK_DIR_ENV}=/shared/packer-work")
    named_by = ("the work folder (work_dir)" if options.work_dir is not None
                else f"${WORK_DIR_ENV}" if explicit else "the default work folder")
    return folder, named_by


def check_cache_folder(folder: Path, *, named_by: str) -> None:
    """Raise ConfigError, before any work starts, when a file stands where the build cache
    ``folder`` (chosen by ``named_by``) or one of its parents must be a folder. Creates nothing."""
    blocker = blocking_file(folder)
    if blocker is not None:
        raise ConfigError(f"the build cache folder {folder} ({named_by}): {blocker} is a file, not a folder; remove "
                          f"that file, or {cache_elsewhere()}")


def _handle_legacy_cache(legacy: Path, cache_dir: Path, *, fresh: bool, quiet: bool,
                         warned: list[tuple[str, str]]) -> None:
    """A build cache an earlier packer left in the output tree (``<output>/<name>/.cache``):
    deleted under ``--fresh`` (which means "clear this job's cache"), otherwise left alone with
    one warning (added to ``warned``). Not deleted unasked: an older packer may still be building into it, or a
    user may keep it on purpose, and a cache is only worth rebuilding, never worth guessing."""
    if not legacy.is_dir() or cache_dir == legacy or cache_dir.is_relative_to(legacy):
        return
    if fresh:
        shutil.rmtree(legacy)
        if not quiet:
            print(f"packer: removed the old build cache {legacy} ({surface().option('fresh')}); the cache is now "
                  f"kept in {cache_dir}", flush=True)
        return
    _warn("output_folder", f"{legacy} is a build cache left in the output folder by an earlier packer; this build "
          f"does not use it (the cache is now kept in {cache_dir}, outside the output). It names raw file paths, "
          f"entity ids and dates: delete it (rm -r {legacy}) or build once with {surface().option('fresh')}, which "
          "deletes it, before sharing the output folder", warned)


def _other_key_warnings(dataset_root: Path, manifest: dict[str, Any]) -> list[str]:
    """The warnings for other versions of this dataset in the output pseudonymized with another
    PHI key than ``manifest``'s: a build with the wrong key file exits 0 with every sample id,
    entity pseudonym and so the split changed, and nothing else says why."""
    key = (manifest.get("phi") or {}).get("key_fingerprint")
    if key is None:
        return []
    others: dict[str, list[str]] = defaultdict(list)
    for folder in sorted(dataset_root.iterdir()):
        try:
            if folder.name == manifest["version"] or not (folder / MANIFEST_FILE).is_file():
                continue
            other = (read_manifest(folder, strict=False, check_hash=False).data.get("phi") or {}).get("key_fingerprint")
        except (PackerError, PermissionError):
            continue  # not a readable version (damaged, or a colleague's of mode 700): not this build's to judge
        if other is not None and other != key:
            others[other].append(folder.name)
    return [f"{dataset_root}: version(s) {', '.join(versions)} were pseudonymized with the PHI key of fingerprint "
            f"{fingerprint}; this build used {key}, so every sample id, entity pseudonym and the split differ from "
            "theirs. If that is not meant, rebuild with their key (packer inspect shows a version's fingerprint)"
            for fingerprint, versions in sorted(others.items())]


def _warn(code: str, message: str, warned: list[tuple[str, str]]) -> None:
    """A warning, not progress: on stderr, and printed under --quiet too; added to ``warned`` with
    its ``code`` (``schemas/validate.schema.json``), which ``warnings.jsonl`` and the report keep."""
    print(f"packer: warning: {message}", file=sys.stderr, flush=True)
    warned.append((code, message))


def _publish(staging: Path, version_dir: Path, manifest: dict[str, Any]
             ) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """Move the staged files into the version folder and write the manifest last.

    Returns ``(True, restored, rewritten)`` when the version folder already held this exact
    dataset: its manifest and every file that still checks out are left as they are; ``restored``
    names the files it lists (shards, index, splits table) that were missing or no longer held the
    sha256 the manifest records, each replaced (by rename) with this build's copy, whose bytes
    are the recorded ones; ``rewritten`` the local reports that differed from this build's.
    ``(False, (), ())`` when the version was written here.
    """
    _check_staged(staging, manifest)
    # only a manifest that is there is read: a missing one sends read_manifest looking through the
    # dataset folder's other versions for its message, a colleague's unreadable one among them
    if (version_dir / MANIFEST_FILE).is_file() and read_dataset_hash(version_dir / MANIFEST_FILE) == \
            manifest["dataset_hash"]:
        restored = _restore_listed(staging, version_dir, manifest)
        rewritten = _replace_local_reports(staging, version_dir)
        shutil.rmtree(staging)
        return True, restored, rewritten
    if version_dir.exists():  # incomplete or damaged: a folder without a valid manifest is not a dataset
        shutil.rmtree(version_dir)
    staging.rename(version_dir)
    write_manifest(version_dir, manifest)
    return False, (), ()


def _check_staged(staging: Path, manifest: dict[str, Any]) -> None:
    """Raise FileSystemError, before anything is published, where a shard the manifest lists is not
    in the staging folder at its recorded size: the worker that wrote it saw another folder at
    this path (not on a file system every worker mounts), and the version would be published,
    exit 0, without it."""
    missing = [(shard["file"], shard["bytes"]) for split in manifest["splits"].values() for shard in split["shards"]
               if not _staged_at_size(staging / shard["file"], int(shard["bytes"]))]
    if missing:
        name, size = missing[0]
        raise FileSystemError(f"{staging / name}: the shard ({size} bytes) the build wrote is not there"
                              f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: the worker that "
                              "wrote it sees another folder at this path; put the output on a file system every "
                              "worker mounts at the same path, and build again")


def _staged_at_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


#: The version's local reports, which name raw files and messages: the dataset_hash counts bad and
#: left-out files by reason only, so two builds of one version can differ in them (a bad file
#: removed and another added), and the latest build's are the true ones
_LOCAL_REPORTS = (REPORT_FILE, EXCLUDED_FILE, LEAKAGE_FILE)


def _replace_local_reports(staging: Path, version_dir: Path) -> tuple[str, ...]:
    """This build's local reports in place of an already built version's, where they differ: each
    one it wrote replaces the version's unless that holds the same bytes (a rebuild of the same
    inputs rewrites nothing), a missing one comes back, and one it did not write (no file left out)
    is removed. They listed the first build's bad files: a fixed file stayed listed, a new one was
    missing, and ``packer report`` sent the user to a file that was gone. Returns the names
    replaced or removed."""
    rewritten = []
    for name in _LOCAL_REPORTS:
        staged, placed = staging / name, version_dir / name
        if staged.is_file():
            if not _same_bytes(staged, placed):
                os.replace(staged, placed)
                rewritten.append(name)
        elif placed.exists():
            placed.unlink()
            rewritten.append(name)
    return tuple(rewritten)


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether files ``a`` and ``b`` hold the same bytes (False where ``b`` is missing)."""
    try:
        return filecmp.cmp(a, b, shallow=False)  # files of other sizes differ without a read
    except OSError:
        return False


def _restore_listed(staging: Path, version_dir: Path, manifest: dict[str, Any]) -> tuple[str, ...]:
    """Replace each file of the already built ``version_dir`` that ``manifest`` lists and that is
    missing or damaged (size or sha256 not the recorded ones) with its staged copy, when that copy
    holds the recorded bytes; the names replaced, sorted. A staged file that is the version's own
    (a shard this build linked from it) is not hashed again."""
    recorded = {s["file"]: (s["bytes"], s["sha256"]) for split in manifest["splits"].values() for s in split["shards"]}
    for field in ("index", "splits_table"):
        entry = manifest.get(field)
        if isinstance(entry, dict):
            recorded[entry["file"]] = (entry["bytes"], entry["sha256"])
    restored = []
    for name, expected in sorted(recorded.items()):
        staged, placed = staging / name, version_dir / name
        if not staged.is_file() or _holds(placed, staged, expected):
            continue
        if file_sha256(staged) != expected:  # not the recorded bytes either: nothing better to put there
            continue
        os.replace(staged, placed)
        restored.append(name)
    return tuple(restored)


def _holds(placed: Path, staged: Path, expected: tuple[int, str]) -> bool:
    """Whether ``placed`` is there with the ``(size, sha256)`` recorded for it."""
    try:
        return os.path.samefile(staged, placed) or file_sha256(placed) == expected
    except FileNotFoundError:
        return False


def _prune_cache(cache_dir: Path, used: set[str], *, keep: bool) -> None:
    """Drop cache entries this build did not use (or all of them when not keeping the cache);
    a kept cache's index of files (:data:`~packer.pipeline.filecache.INDEX_NAME`) stays, for the
    build to replace."""
    for path in cache_dir.iterdir():
        if not keep or (path.name.split(".")[0] not in used and path.name != INDEX_NAME):
            path.unlink()
    if not keep:
        cache_dir.rmdir()


def write_manifest_copy(target: Path, manifest_file: Path) -> bool:
    """Copy a manifest into the registry folder (``manifests/<name>/<version>.json``).

    An existing copy of the same dataset is left alone, so a rebuild does not churn the
    committed registry with a new ``created_at``. Returns whether the copy was written.
    FileSystemError (exit 6) where the registry folder refuses it, whose fix is the registry's
    (make it writable, or change the job's ``registry:``), never another output folder.
    """
    if read_dataset_hash(target) == read_dataset_hash(manifest_file):
        return False
    elsewhere = (f"change `registry:` in the job to a folder this user can write (another --out moves no "
                 f"registry; {target.parent.parent} is the job's registry)")
    with atomic_output(target, shared=True, elsewhere=elsewhere) as fh:  # builds of two outputs share the registry
        fh.write(manifest_file.read_bytes())
    return True


def check_bad_fraction(result: BuildResult) -> None:
    """Raise BadFractionError (exit 3) when the bad fraction exceeds the job's threshold."""
    bad = result.manifest["bad_samples"]
    if result.over_threshold:
        inputs = result.manifest["inputs"]
        excluded = sum(inputs.get("excluded", {}).values())
        left_out = f" (and {excluded} left out on purpose, which do not count)" if excluded else ""
        raise BadFractionError(
            f"{bad['total']} of {inputs['files'] - excluded} input files are bad{left_out} "
            f"({bad['fraction']:.1%} > max_bad_fraction {bad['max_fraction']:.1%}); "
            f"see {result.version_dir / bad['report']}", version_dir=result.version_dir)
