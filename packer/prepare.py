"""Prepare: everything before packing — discover, process, split, audit — shared by
``packer build`` and ``packer validate``.

The result holds small records only: the samples (with their content hashes), the
bad-sample issues, the split assignment and the audit report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from packer.audit import AuditReport, audit_assignment
from packer.config import JobConfig
from packer.discover import discover
from packer.execute import Executor
from packer.manifest import library_versions
from packer.phi import Pseudonymizer, pseudonymizer_for
from packer.process import ChunkResult, ChunkTask, SpilledSample, chunk_key, chunk_refs, process_chunk
from packer.progress import Progress
from packer.records import Issue
from packer.report import sort_issues
from packer.split import Assignment, assign_splits, near_edges


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


def process_all(job: JobConfig, executor: Executor, refs: list, *, cache_dir: Path | None, decode: bool = True,
                quiet: bool = False) -> list[ChunkResult]:
    """Run the pixel pass (or the header pass when ``decode`` is False) over all refs."""
    libraries = library_versions()
    tasks = [ChunkTask(key=chunk_key(chunk, job, libraries), refs=chunk, job=job,
                       cache_dir=str(cache_dir) if cache_dir is not None else None, decode=decode)
             for chunk in chunk_refs(refs)]
    progress = Progress("process" if decode else "headers", len(refs), quiet=quiet)
    results: list[ChunkResult] = []
    for result in executor.map_unordered(process_chunk, tasks):
        results.append(result)
        progress.update(result.files, bad=len(result.issues))
    progress.close()
    return sorted(results, key=lambda r: r.key)


def prepare(job: JobConfig, executor: Executor, *, cache_dir: Path | None, decode: bool = True,
            quiet: bool = False) -> Prepared:
    """Discover, process, split and audit ``job``. Does not raise on leakage: callers decide.

    With ``decode`` False (``validate --quick``) only headers are read: duplicate rules
    cannot run and are disabled for this audit.
    """
    phi = pseudonymizer_for(job.phi)
    refs, issues = discover(job, phi)
    inputs = len(refs) + len(issues)
    if not quiet:
        print(f"packer: {job.name}: {inputs} input files, running on {executor.description}", flush=True)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    chunks = process_all(job, executor, refs, cache_dir=cache_dir, decode=decode, quiet=quiet)
    samples = sorted((_pseudonymized(s, phi) for c in chunks for s in c.samples), key=lambda s: s.key)
    issues.extend(i for c in chunks for i in c.issues)
    split_cfg = job.split if decode else replace(job.split, duplicates="report", near_enabled=False)
    edges = near_edges(samples, split_cfg)
    assignment = assign_splits(samples, split_cfg, edges)
    audit = audit_assignment(samples, assignment, split_cfg, edges, show_paths=not phi.active,
                             show_dates=phi.dates == "keep")
    issues.extend(assignment.dropped)
    kept = tuple(s for s in samples if s.key in assignment.split)
    return Prepared(inputs=inputs, samples=kept, issues=tuple(sort_issues(issues)), assignment=assignment, audit=audit,
                    chunks=tuple(chunks), decoded=decode, phi=phi)


def _pseudonymized(sample: SpilledSample, phi: Pseudonymizer) -> SpilledSample:
    """Swap the raw entity id for its pseudonym (and drop free-text table columns) before any
    record can reach an output. Raw ids exist only in header reads and the local cache."""
    if not phi.active or sample.ref.entity is None:
        return sample
    return replace(sample, ref=replace(sample.ref, entity=phi.entity(sample.ref.entity), extra=()))
