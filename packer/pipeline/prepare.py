"""Prepare: everything before packing — discover, process, split, audit — shared by
``packer build`` and ``packer validate``.

The result holds small records only: the samples (with their content hashes), the
bad-sample issues, the split assignment and the audit report.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packer.badsamples import sort_issues
from packer.config import JobConfig
from packer.errors import refused_write
from packer.manifest import library_versions
from packer.phi import Pseudonymizer, pseudonymizer_for
from packer.pipeline.audit import AuditReport, audit_assignment
from packer.pipeline.cluster import Executor, LazySequence, WorkerLost
from packer.pipeline.discover import discover
from packer.pipeline.nearcopy import EvidenceArrays, NearLinks, VerifyTask, verify_task
from packer.pipeline.pixels import (
    CACHE_ELSEWHERE,
    ChunkGroup,
    ChunkResult,
    ChunkTask,
    chunk_bounds,
    chunk_key,
    group_size,
    process_chunk,
    process_group,
)
from packer.pipeline.rawstore import RawObject, remote_listing
from packer.pipeline.sampletable import RefTable, SampleTable, TableBuilder
from packer.pipeline.split import Assignment, RunVerify, assign_splits, balance_warning, near_links
from packer.progress import Progress
from packer.records import Issue, SampleRef
from packer.storage import work_dir


@dataclass(frozen=True)
class Prepared:
    """What the client knows after the pixel pass, the split and the audit.

    ``samples`` are the ones assigned to a split, sorted by key, in columns; ``issues`` include
    the discover, read, validate and split stages; ``inputs`` counts the raw files considered;
    ``chunks`` are the pixel pass's results without their samples (counts, cache use, seconds);
    ``links`` the verified near copies, indices into the samples *before* unassigned ones were
    dropped (the assignment's groups use the same indices), found in ``near_seconds`` (wall time
    of the candidate search and the verification tasks).
    """

    inputs: int
    samples: SampleTable
    issues: tuple[Issue, ...]
    assignment: Assignment
    audit: AuditReport
    chunks: tuple[ChunkResult, ...]
    decoded: bool = True
    phi: Pseudonymizer = Pseudonymizer(mode="keep", dates="keep", key=None)
    links: NearLinks = field(default_factory=NearLinks.empty)
    near_seconds: float = 0.0

    @property
    def files_decoded(self) -> int:
        return sum(c.files for c in self.chunks if not c.reused) if self.decoded else 0


class _Settle:
    """Turns a worker's sample records into the client's: pseudonymized, then into columns.

    Pseudonymizing here, as each result arrives, means raw entity ids live only in header reads
    and the local cache, never in the records the client keeps. The records go into a
    :class:`~packer.pipeline.sampletable.TableBuilder` (about 300 bytes a sample, no Python object
    each); the chunk result keeps its counts and seconds, not its samples.
    """

    def __init__(self, phi: Pseudonymizer) -> None:
        self._phi = phi
        self.table = TableBuilder(SampleTable)

    def chunk(self, chunk: ChunkResult) -> ChunkResult:
        for sample in chunk.samples:
            if self._phi.active and sample.ref.entity is not None:
                sample = replace(sample, ref=replace(sample.ref, entity=self._phi.entity(sample.ref.entity), extra=()))
            self.table.append(sample)
        return replace(chunk, samples=())


def process_all(job: JobConfig, executor: Executor, refs: Sequence[SampleRef], *, cache_dir: Path | None,
                decode: bool = True, quiet: bool = False, phi: Pseudonymizer | None = None,
                listed: Mapping[str, RawObject] | None = None, storage_options: dict[str, Any] | None = None,
                sig_dir: Path | None = None) -> tuple[list[ChunkResult], SampleTable]:
    """Run the pixel pass (or the header pass when ``decode`` is False) over all refs.

    Returns the chunk results in key order, without their samples, and every sample in a
    table, in the order the results arrived.

    Refs whose path is a URL need ``listed`` (:attr:`packer.pipeline.discover.Discovery.listed`): each
    task gets its files' entries, for the cache key and the size limit, and ``storage_options``
    to fetch them with. ``sig_dir``: where the near-copy signatures go when there is no cache
    (``packer validate``).

    A chunk whose worker process keeps dying (a native decoder crash takes the whole worker
    down) is retried file by file; a file that still kills its worker becomes a
    ``decoder_crash`` bad sample and the build goes on. Each result's samples are settled as
    they arrive (:class:`_Settle`: pseudonymized under ``phi``, into columns).
    """
    settle = _Settle(phi or Pseudonymizer(mode="keep", dates="keep", key=None))
    libraries = library_versions()
    library_pairs = tuple(sorted(libraries.items()))
    nonce = uuid.uuid4().hex[:8]
    cache = str(cache_dir) if cache_dir is not None else None
    listed = listed or {}

    def task_of(chunk: Sequence[SampleRef]) -> ChunkTask:  # the worker computes the chunk's key
        return ChunkTask(key="", refs=chunk, job=job, cache_dir=cache, decode=decode,
                         listed=remote_listing(chunk, listed), libraries=library_pairs,
                         sig_dir=str(sig_dir) if sig_dir is not None else None, storage_options=storage_options)

    # Tasks are made as the executor submits them, each from its rows of the ref table: made all
    # at once, they would keep every ref alive as objects through the whole pass.
    table = refs if isinstance(refs, RefTable) else RefTable.of(refs)
    ids = table.column("sample_id")
    bounds = chunk_bounds(ids)
    size = group_size(len(bounds), executor.threads())
    spans = [bounds[i:i + size] for i in range(0, len(bounds), size)]
    names = [f"process-{ids[span[0][0]]}-{len(span)}-{nonce}" for span in spans]
    del ids

    def group_of(index: int) -> ChunkGroup:
        return ChunkGroup(tuple(task_of(tuple(table[start:stop])) for start, stop in spans[index]))

    progress = Progress("process" if decode else "headers", len(table), quiet=quiet)
    results: list[ChunkResult] = []
    lost: list[ChunkTask] = []
    groups = LazySequence(len(spans), group_of)
    for group, done in executor.map_unordered(process_group, groups, names):
        if isinstance(done, WorkerLost):
            lost.extend(group.tasks)
            continue
        for result in done:
            results.append(settle.chunk(result))
            progress.update(result.files, bad=len(result.issues))
    singles = [task_of((ref,)) for task in lost for ref in task.refs]
    suspects: list[ChunkTask] = []
    for task, outcome in executor.map_unordered(process_chunk, singles,
                                                [f"isolate-{t.refs[0].sample_id}-{nonce}" for t in singles]):
        if isinstance(outcome, WorkerLost):
            suspects.append(task)  # maybe only a bystander on a dying worker: retried alone below
            continue
        results.append(settle.chunk(outcome))
        progress.update(outcome.files, bad=len(outcome.issues))
    for suspect in suspects:  # one at a time, so a death can only be this file's doing
        ((task, outcome),) = executor.map_unordered(process_chunk, [suspect],
                                                    [f"isolate-alone-{suspect.refs[0].sample_id}-{nonce}"])
        if isinstance(outcome, WorkerLost):
            ref, key = task.refs[0], chunk_key(task.refs, job, libraries, listed)
            outcome = ChunkResult(key=key, samples=(), files=1, issues=(Issue.of(
                ref, stage="read", reason="decoder_crash",
                message=f"{ref.path}: reading this file alone killed the worker process every time it was tried "
                        f"({outcome}); a native decoder crash. The file was isolated and the build went on"),))
        results.append(settle.chunk(outcome))
        progress.update(outcome.files, bad=len(outcome.issues))
    progress.close()
    return sorted(results, key=lambda r: r.key), settle.table.finish()


def stage_seconds(chunks: Sequence[ChunkResult]) -> dict[str, float]:
    """Seconds per stage summed over every task of the pixel pass."""
    total: dict[str, float] = {}
    for chunk in chunks:
        for stage, seconds in chunk.seconds:
            total[stage] = total.get(stage, 0.0) + seconds
    return total


def _make_cache_folder(cache_dir: Path) -> None:
    """Create the build cache folder (outside the output: in the work folder or ``--cache-dir``);
    a full, read-only or unwritable file system there is a FileSystemError naming the cache's fix."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        refused = refused_write(err, cache_dir, opening=True, elsewhere=CACHE_ELSEWHERE)
        if refused is None:
            raise
        raise refused from err


def prepare(job: JobConfig, executor: Executor, *, cache_dir: Path | None, decode: bool = True,
            quiet: bool = False, storage_options: dict[str, Any] | None = None) -> Prepared:
    """Discover, process, split and audit ``job``. Does not raise on leakage: callers decide.

    With ``decode`` False (``validate --quick``) only headers are read: duplicate rules
    cannot run and are disabled for this audit. ``storage_options`` configure the stores of
    raw inputs given as URLs (on the client and on the workers).
    """
    phi = pseudonymizer_for(job.phi)
    found = discover(job, phi, storage_options=storage_options)
    refs, issues, listed = found.refs, found.issues, found.listed  # refs: a RefTable (packer.pipeline.sampletable)
    del found
    inputs = len(refs) + len(issues)
    if not quiet:
        print(f"packer: {job.name}: {inputs} input files, running on {executor.description}", flush=True)
    if cache_dir is not None:
        _make_cache_folder(cache_dir)
    with contextlib.ExitStack() as stack:
        # without a cache (packer validate), the near-copy signatures live for this run only
        sig_dir = cache_dir if cache_dir is not None or not decode else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="packer-signatures-", dir=_scratch_folder())))
        chunks, table = process_all(job, executor, refs, cache_dir=cache_dir, decode=decode, quiet=quiet, phi=phi,
                                    listed=listed, storage_options=storage_options, sig_dir=sig_dir)
        del refs, listed  # the settled samples carry their own (probed) refs
        samples = table.sorted_by_key()
        del table
        issues.extend(i for c in chunks for i in c.issues)
        split_cfg = job.split if decode else replace(job.split, duplicates="report", near_enabled=False)
        started = time.perf_counter()
        links = near_links(samples, split_cfg, sig_dir, _verify_on(executor))
        near_seconds = time.perf_counter() - started
    assignment = assign_splits(samples, split_cfg, links)
    balance = balance_warning(assignment, split_cfg)
    if balance is not None:  # a warning, not progress: printed under --quiet too
        print(f"packer: warning: {job.name}: {balance}", file=sys.stderr, flush=True)
    audit = audit_assignment(samples, assignment, split_cfg, links, show_paths=not phi.active,
                             show_dates=phi.dates == "keep")
    issues.extend(assignment.dropped)
    split = assignment.split
    kept = samples.take([i for i, key in enumerate(samples.column("key")) if key in split])
    return Prepared(inputs=inputs, samples=kept, issues=tuple(sort_issues(issues)), assignment=assignment, audit=audit,
                    chunks=tuple(chunks), decoded=decode, phi=phi, links=links, near_seconds=near_seconds)


def _scratch_folder() -> Path:
    """Where ``packer validate`` keeps the run's signatures: the local work folder."""
    folder = work_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        refused = refused_write(err, folder, opening=True, elsewhere="set PACKER_WORK_DIR to a writable folder")
        if refused is None:
            raise
        raise refused from err
    return folder


def _verify_on(executor: Executor) -> RunVerify:
    """Run near-copy verification tasks on ``executor``; a task whose worker died is run here."""
    def run(tasks: Sequence[VerifyTask]) -> Iterator[tuple[VerifyTask, EvidenceArrays]]:
        for task, result in executor.map_unordered(verify_task, tasks,
                                                   keys=[f"verify-{t.index}-{uuid.uuid4().hex[:8]}" for t in tasks]):
            yield task, verify_task(task) if isinstance(result, WorkerLost) else result
    return run
