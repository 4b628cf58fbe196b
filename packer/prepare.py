"""Prepare: everything before packing — discover, process, split, audit — shared by
``packer build`` and ``packer validate``.

The result holds small records only: the samples (with their content hashes), the
bad-sample issues, the split assignment and the audit report.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from packer.audit import AuditReport, audit_assignment
from packer.config import JobConfig
from packer.discover import discover
from packer.execute import Executor, WorkerLost
from packer.manifest import library_versions
from packer.phi import Pseudonymizer, pseudonymizer_for
from packer.process import (
    ChunkResult,
    ChunkTask,
    SpilledSample,
    chunk_key,
    chunk_refs,
    group_chunks,
    process_chunk,
    process_group,
)
from packer.progress import Progress
from packer.rawstore import RawObject, remote_listing
from packer.records import Issue, SampleRef
from packer.report import sort_issues
from packer.split import Assignment, assign_splits, balance_warning, near_edges

T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    """What the client knows after the pixel pass, the split and the audit.

    ``samples`` are the ones assigned to a split, sorted by key; ``issues`` include the
    discover, read, validate and split stages; ``inputs`` counts the raw files considered.
    """

    inputs: int
    samples: tuple[SpilledSample, ...]
    issues: tuple[Issue, ...]
    assignment: Assignment
    audit: AuditReport
    chunks: tuple[ChunkResult, ...]
    decoded: bool = True
    phi: Pseudonymizer = Pseudonymizer(mode="keep", dates="keep", key=None)

    @property
    def files_decoded(self) -> int:
        return sum(c.files for c in self.chunks if not c.reused) if self.decoded else 0


class _Settle:
    """Turns a worker's sample records into the client's: pseudonymized, with shared values.

    A worker result unpickles into fresh objects for every sample, so 100k samples of ten
    labels would hold 100k label strings (and as many entity ids, times, shapes and dtypes).
    Keeping one object per distinct value, and discover's own id and path strings, keeps a
    sample's record near 1 KB (benchmarks/RESULTS.md has the measured growth). Pseudonymizing
    here, as each result arrives, means raw entity ids live only in header reads and the local
    cache, never in the records the client keeps.
    """

    def __init__(self, phi: Pseudonymizer) -> None:
        self._phi = phi
        self._values: dict[Any, Any] = {}

    def _one(self, value: T) -> T:
        return self._values.setdefault(value, value)  # type: ignore[no-any-return]

    def sample(self, sample: SpilledSample, original: SampleRef | None = None) -> SpilledSample:
        """``sample`` as the client keeps it; ``original`` is the ref discover made for its file,
        whose id and path strings the client already holds (the worker's are equal copies)."""
        ref, one = sample.ref, self._one
        entity, extra = ref.entity, ref.extra
        if self._phi.active and entity is not None:
            entity, extra = self._phi.entity(entity), ()
        sample_id, path, relpath = ref.sample_id, ref.path, ref.relpath
        if original is not None and (original.sample_id, original.path, original.relpath) == (sample_id, path, relpath):
            sample_id, path, relpath = original.sample_id, original.path, original.relpath
        ref = replace(ref, sample_id=sample_id, path=path, relpath=relpath, source=one(ref.source),
                      kind=one(ref.kind), label=one(ref.label), entity=one(entity), time=one(ref.time), extra=extra)
        return replace(sample, key=sample_id if sample.key == sample_id else sample.key, ref=ref,
                       spill=one(sample.spill), shape=one(sample.shape), dtype=one(sample.dtype),
                       pixel_bytes=one(sample.pixel_bytes), meta_bytes=one(sample.meta_bytes))

    def chunk(self, chunk: ChunkResult, refs: Sequence[SampleRef]) -> ChunkResult:
        """``chunk`` with every sample settled; ``refs`` are the refs its task was given."""
        originals = {ref.sample_id: ref for ref in refs}
        return replace(chunk, samples=tuple(self.sample(s, originals.get(s.ref.sample_id)) for s in chunk.samples))


def process_all(job: JobConfig, executor: Executor, refs: list, *, cache_dir: Path | None, decode: bool = True,
                quiet: bool = False, phi: Pseudonymizer | None = None, listed: Mapping[str, RawObject] | None = None,
                storage_options: dict[str, Any] | None = None) -> list[ChunkResult]:
    """Run the pixel pass (or the header pass when ``decode`` is False) over all refs.

    Refs whose path is a URL need ``listed`` (:attr:`packer.discover.Discovery.listed`): each
    task gets its files' entries, for the cache key and the size limit, and ``storage_options``
    to fetch them with.

    A chunk whose worker process keeps dying (a native decoder crash takes the whole worker
    down) is retried file by file; a file that still kills its worker becomes a
    ``decoder_crash`` bad sample and the build goes on. Each result's samples are settled as
    they arrive (:class:`_Settle`: pseudonymized under ``phi``, values shared).
    """
    settle = _Settle(phi or Pseudonymizer(mode="keep", dates="keep", key=None))
    libraries = library_versions()
    nonce = uuid.uuid4().hex[:8]
    cache = str(cache_dir) if cache_dir is not None else None
    listed = listed or {}

    def task_of(chunk: tuple[SampleRef, ...]) -> ChunkTask:
        return ChunkTask(key=chunk_key(chunk, job, libraries, listed), refs=chunk, job=job, cache_dir=cache,
                         decode=decode, listed=remote_listing(chunk, listed), storage_options=storage_options)

    tasks = [task_of(chunk) for chunk in chunk_refs(refs)]
    progress = Progress("process" if decode else "headers", len(refs), quiet=quiet)
    results: list[ChunkResult] = []
    lost: list[ChunkTask] = []
    groups = group_chunks(tasks, executor.threads())
    for group, done in executor.map_unordered(process_group, groups,
                                              [f"process-{g.tasks[0].key}-{len(g.tasks)}-{nonce}" for g in groups]):
        if isinstance(done, WorkerLost):
            lost.extend(group.tasks)
            continue
        for task, result in zip(group.tasks, done, strict=True):
            results.append(settle.chunk(result, task.refs))
            progress.update(result.files, bad=len(result.issues))
    singles = [task_of((ref,)) for task in lost for ref in task.refs]
    suspects: list[ChunkTask] = []
    for task, outcome in executor.map_unordered(process_chunk, singles,
                                                [f"isolate-{t.refs[0].sample_id}-{nonce}" for t in singles]):
        if isinstance(outcome, WorkerLost):
            suspects.append(task)  # maybe only a bystander on a dying worker: retried alone below
            continue
        results.append(settle.chunk(outcome, task.refs))
        progress.update(outcome.files, bad=len(outcome.issues))
    for suspect in suspects:  # one at a time, so a death can only be this file's doing
        ((task, outcome),) = executor.map_unordered(process_chunk, [suspect],
                                                    [f"isolate-alone-{suspect.refs[0].sample_id}-{nonce}"])
        if isinstance(outcome, WorkerLost):
            ref = task.refs[0]
            outcome = ChunkResult(key=task.key, samples=(), files=1, issues=(Issue.of(
                ref, stage="read", reason="decoder_crash",
                message=f"{ref.path}: reading this file alone killed the worker process every time it was tried "
                        f"({outcome}); a native decoder crash. The file was isolated and the build went on"),))
        results.append(settle.chunk(outcome, task.refs))
        progress.update(outcome.files, bad=len(outcome.issues))
    progress.close()
    return sorted(results, key=lambda r: r.key)


def stage_seconds(chunks: Sequence[ChunkResult]) -> dict[str, float]:
    """Seconds per stage summed over every task of the pixel pass."""
    total: dict[str, float] = {}
    for chunk in chunks:
        for stage, seconds in chunk.seconds:
            total[stage] = total.get(stage, 0.0) + seconds
    return total


def prepare(job: JobConfig, executor: Executor, *, cache_dir: Path | None, decode: bool = True,
            quiet: bool = False, storage_options: dict[str, Any] | None = None) -> Prepared:
    """Discover, process, split and audit ``job``. Does not raise on leakage: callers decide.

    With ``decode`` False (``validate --quick``) only headers are read: duplicate rules
    cannot run and are disabled for this audit. ``storage_options`` configure the stores of
    raw inputs given as URLs (on the client and on the workers).
    """
    phi = pseudonymizer_for(job.phi)
    found = discover(job, phi, storage_options=storage_options)
    refs, issues = found.refs, found.issues
    inputs = len(refs) + len(issues)
    if not quiet:
        print(f"packer: {job.name}: {inputs} input files, running on {executor.description}", flush=True)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    chunks = process_all(job, executor, refs, cache_dir=cache_dir, decode=decode, quiet=quiet, phi=phi,
                         listed=found.listed, storage_options=storage_options)
    del refs, found  # the settled samples carry their own (probed) refs
    samples = sorted((s for c in chunks for s in c.samples), key=lambda s: s.key)
    issues.extend(i for c in chunks for i in c.issues)
    split_cfg = job.split if decode else replace(job.split, duplicates="report", near_enabled=False)
    edges = near_edges(samples, split_cfg)
    assignment = assign_splits(samples, split_cfg, edges)
    balance = balance_warning(assignment, split_cfg)
    if balance is not None:  # a warning, not progress: printed under --quiet too
        print(f"packer: warning: {job.name}: {balance}", file=sys.stderr, flush=True)
    audit = audit_assignment(samples, assignment, split_cfg, edges, show_paths=not phi.active,
                             show_dates=phi.dates == "keep")
    issues.extend(assignment.dropped)
    kept = tuple(s for s in samples if s.key in assignment.split)
    return Prepared(inputs=inputs, samples=kept, issues=tuple(sort_issues(issues)), assignment=assignment, audit=audit,
                    chunks=tuple(chunks), decoded=decode, phi=phi)

