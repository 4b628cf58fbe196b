"""The pack stage: write the planned shards from spilled sample bytes (no decoding happens here).

:func:`pack_shards` runs on the client and submits one :func:`write_shard` dask task per shard;
each task streams its samples out of the spill (:mod:`packer.pipeline.spill`) through the
shard format's writer (:mod:`packer.shards`).

The spill is freed as it is packed, so that a build does not keep a second copy of the
dataset. A tar shard's task punches each sample's spilled bytes out as soon as the shard file
holds them (:class:`~packer.pipeline.spill.SpillPuncher`); a Parquet shard is written whole at
its end, so its samples are freed by the client when the task returns, which also deletes
each spill file once all of it is packed (:class:`~packer.pipeline.spill.SpillConsumer`). A
worker that dies mid-shard leaves its partial file behind; dask runs the task again, and the
new attempt finds the samples the dead one had freed in that file (:class:`_EarlierAttempts`:
renamed aside first, read back and checked against each sample's sha256, removed once the
shard is complete).

A shard that an earlier version of the output already holds (same content key,
:mod:`packer.pipeline.reuse`) is not written: its task checks that file's bytes and links it
into the staging folder, and the client takes its index rows from that version's index. Every
shard file ends read-only."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
import uuid
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packer.allocator import tune_allocator
from packer.errors import PackerError
from packer.files import READ_ONLY, TMP_SUFFIX
from packer.pipeline.cluster import Executor, LazySequence, WorkerLost
from packer.pipeline.plan import PlannedShard, ShardPlan
from packer.pipeline.reuse import EarlierShards, ReuseSource, link_earlier, shard_content_key
from packer.pipeline.sampletable import SampleTable
from packer.pipeline.spill import SpillConsumer, SpillFreed, SpillPuncher, SpillReader, tar_sample_as_spilled
from packer.progress import Progress
from packer.records import SpilledSample
from packer.shards.encode import EncodedSample, encode_sample, pixels_digest
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import scan_tar, write_tar_shard
from packer.shards.writer import ShardWrite
from packer.targets import Target


@dataclass(frozen=True)
class ShardTask:
    """One shard to write. ``free_spill``: free each sample's spilled bytes once the shard holds
    them (tar), except in the spill files of ``keep``."""

    plan: ShardPlan
    target: Target
    cache_dir: str
    folder: str
    format: str
    free_spill: bool = False
    keep: frozenset[str] = field(default_factory=frozenset)
    #: each record names its raw file (``path``, relative to the source root): ``phi.mode: keep``
    #: only, since folder and file names can identify a patient
    raw_paths: bool = False
    #: the shard's content key (:func:`~packer.pipeline.reuse.shard_content_key`; "" unknown)
    content_key: str = ""
    #: an earlier version's file with the same content key: linked instead of written once its
    #: bytes check out (:func:`~packer.pipeline.reuse.link_earlier`)
    reuse: ReuseSource | None = None


class _EarlierAttempts:
    """What earlier attempts at a shard left in the staging folder: the ``.partial`` file of a
    worker that died while writing it (or the finished shard of one that died just after),
    holding the samples whose spilled bytes it had freed. Renamed to ``<file>.attempt-<n>``
    before this attempt writes; :meth:`read` gives a sample back from them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = sorted(path.parent.glob(f"{path.name}.attempt-*"))
        for left in (path.with_name(path.name + TMP_SUFFIX), path):
            if left.exists():
                aside = path.with_name(f"{path.name}.attempt-{len(self.files)}")
                left.rename(aside)
                self.files.append(aside)
        self._where: dict[str, list[tuple[Path, int]]] | None = None
        self._handles: dict[Path, Any] = {}

    def read(self, sample: SpilledSample) -> tuple[bytes, dict[str, Any], bytes]:
        """``sample``'s pixels, metadata and mask from the latest earlier attempt that holds it
        whole and matching its sha256; OSError naming the fix where none does."""
        if self._where is None:
            self._where = {}
            for attempt in reversed(self.files):  # the latest first
                for found in scan_tar(attempt).samples:
                    self._where.setdefault(found.key, []).append((attempt, found.offset))
        for attempt, position in self._where.get(sample.key, []):
            handle = self._handles.get(attempt)
            if handle is None:
                handle = self._handles[attempt] = open(attempt, "rb")  # noqa: SIM115 - closed by close()
            try:
                pixels, meta, mask = tar_sample_as_spilled(handle, attempt, position, sample.key)
            except (KeyError, ValueError, tarfile.TarError):  # cut short there: a later attempt died mid-sample
                continue
            # only tar shards free their samples as they go, so only a tar's attempts are read here
            digest = pixels_digest(pixels, shape=sample.shape, dtype=sample.dtype, fmt="webdataset")
            if digest.hexdigest() == sample.sha256:
                return pixels, json.loads(meta), mask
        raise OSError(f"{self.path}: sample {sample.key}'s spilled bytes were freed by an earlier attempt at writing "
                      "this shard, which left no whole copy of them; run the build again: it decodes those files "
                      "anew")

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def remove(self) -> None:
        self.close()
        for attempt in self.files:
            attempt.unlink(missing_ok=True)


def write_shard(task: ShardTask) -> ShardWrite:
    """Dask task: stream the plan's samples from the spill files into the shard file."""
    tune_allocator()
    path = Path(task.folder) / task.plan.file
    start = time.perf_counter()
    refused = ""
    if task.reuse is not None:
        how, refused = link_earlier(task.reuse, path)
        if how:  # the client fills in the earlier index rows (:func:`pack_shards`)
            return ShardWrite(file=task.plan.file, bytes=task.reuse.bytes, sha256=task.reuse.sha256,
                              positions=array("q"), sizes=array("q"), digests=b"", checksums=array("Q"),
                              seconds=time.perf_counter() - start, content_key=task.content_key, reused=how)
    earlier = _EarlierAttempts(path)
    files = SpillReader(Path(task.cache_dir))
    puncher = SpillPuncher(Path(task.cache_dir), task.keep) if task.free_spill and task.format == "webdataset" else None
    latest: list[SpilledSample] = []

    def encoded() -> Iterator[EncodedSample]:
        for sample in task.plan.samples:
            try:
                pixels, metadata, mask = files.read(sample)
            except SpillFreed:
                pixels, metadata, mask = earlier.read(sample)
            latest[:] = [sample]
            yield encode_sample(key=sample.key, ref=sample.ref, shape=sample.shape, dtype=sample.dtype,
                                pixels=pixels, metadata=metadata, split=task.plan.split, target=task.target,
                                sha256=sample.sha256, mask=mask,
                                relpath=sample.ref.relpath if task.raw_paths else None)

    def written_out(_: EncodedSample) -> None:  # the shard file holds the latest sample now
        if puncher is not None:
            puncher.punch(latest[0])

    try:
        if task.format == "webdataset":
            written = write_tar_shard(path, encoded(), after_each=written_out if puncher is not None else None)
        else:
            written = write_parquet_shard(path, encoded())
    finally:
        files.close()
        earlier.close()
        if puncher is not None:
            puncher.close()
    earlier.remove()
    os.chmod(path, READ_ONLY)  # shards are immutable: a later version may link this very file
    return replace(written, seconds=time.perf_counter() - start, content_key=task.content_key, refused=refused)


def pack_shards(shards: Sequence[PlannedShard], samples: SampleTable, executor: Executor, target: Target,
                cache_dir: Path, staging: Path, fmt: str, quiet: bool,
                consumer: SpillConsumer | None = None, raw_paths: bool = False,
                earlier: EarlierShards | None = None, libraries: dict[str, str] | None = None,
                warned: frozenset[str] = frozenset()) -> dict[str, ShardWrite]:
    """Write every planned shard into ``staging`` on ``executor``, one task per shard, from the
    spill files under ``cache_dir``; return what each writer reported, by shard file.

    With ``libraries`` (the manifest's) each shard gets its content key
    (:mod:`packer.pipeline.reuse`); a shard that ``earlier`` finds in an earlier version is
    linked from there (its task checks the file's bytes first) and reported with that version's
    index rows, under its new name, so the index and manifest are the same as a fresh build's.

    Shards are submitted in the order of their first sample (the table is in key order, and so
    are the chunks), so the splits advance through the spill together. With a ``consumer``, tar
    shard tasks free their samples' spilled bytes as they write them, and the consumer frees
    what is left of each shard's samples (and deletes finished spill files) once its task has
    returned. ``raw_paths``: records name their raw files (:attr:`ShardTask.raw_paths`).
    ``warned``: the resolved paths of earlier shards the build has already warned are damaged
    (:func:`~packer.pipeline.filecache.damage_report`): one not linked for that reason is not
    warned of a second time."""
    order = sorted(range(len(shards)), key=lambda i: (int(shards[i].rows[0]) if len(shards[i].rows) else -1, i))

    def task_of(j: int) -> ShardTask:  # made when submitted: a shard's records exist only while it is written
        shard = shards[order[j]]
        mine = samples.take(shard.rows)
        plan = ShardPlan(file=shard.file, split=shard.split, index=shard.index, samples=mine)
        keep = consumer.keep.intersection(mine.column("spill")) if consumer is not None else frozenset()
        key = "" if libraries is None else shard_content_key(mine, split=shard.split, fmt=fmt, target=target,
                                                              libraries=libraries, raw_paths=raw_paths)
        found = earlier.find(key, mine.column("key")) if key and earlier is not None else None
        if found is not None:
            found_rows[shard.file] = found.columns
        return ShardTask(plan=plan, target=target, cache_dir=str(cache_dir), folder=str(staging), format=fmt,
                         free_spill=consumer is not None, keep=keep, raw_paths=raw_paths, content_key=key,
                         reuse=found.source if found is not None else None)

    progress = Progress("pack", sum(len(s.rows) for s in shards), unit="samples", quiet=quiet)
    written: dict[str, ShardWrite] = {}
    found_rows: dict[str, ShardWrite] = {}
    nonce = uuid.uuid4().hex[:8]
    tasks = LazySequence(len(shards), task_of)
    for task, shard in executor.map_unordered(write_shard, tasks,
                                              [f"pack-{shards[i].file}-{nonce}" for i in order],
                                              waiting=progress.waiting):
        if isinstance(shard, WorkerLost):
            raise PackerError(f"writing shard {task.plan.file} killed its worker process every time ({shard}); "
                              "this happens only when copying already-decoded bytes, so check the worker's memory "
                              "limit and the disk under the output folder")
        if shard.reused:
            shard = replace(found_rows.pop(shard.file), file=shard.file, seconds=shard.seconds,
                            content_key=shard.content_key, reused=shard.reused)
        elif shard.refused and not (task.reuse is not None and str(Path(task.reuse.path).resolve()) in warned):
            print(f"packer: warning: {shard.refused}", file=sys.stderr, flush=True)  # under --quiet too
        written[shard.file] = shard
        if consumer is not None:
            consumer.packed(task.plan.samples)
        progress.update(shard.samples)
    progress.close()
    return written
