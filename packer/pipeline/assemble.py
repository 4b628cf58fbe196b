"""The pack stage: write the planned shards from spilled sample bytes (no decoding happens here).

:func:`pack_shards` runs on the client and submits one :func:`write_shard` dask task per shard;
each task streams its samples out of the spill (:mod:`packer.pipeline.spill`) through the
shard format's writer (:mod:`packer.shards`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packer.allocator import tune_allocator
from packer.errors import PackerError
from packer.pipeline.cluster import Executor, LazySequence, WorkerLost
from packer.pipeline.plan import PlannedShard, ShardPlan
from packer.pipeline.sampletable import SampleTable
from packer.pipeline.spill import SpillConsumer, SpillReader
from packer.progress import Progress
from packer.shards.encode import EncodedSample, encode_sample
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import write_tar_shard
from packer.shards.writer import ShardWrite
from packer.targets import Target

WRITERS = {"webdataset": write_tar_shard, "parquet": write_parquet_shard}


@dataclass(frozen=True)
class ShardTask:
    plan: ShardPlan
    target: Target
    cache_dir: str
    folder: str
    format: str


def write_shard(task: ShardTask) -> ShardWrite:
    """Dask task: stream the plan's samples from the spill files into the shard file."""
    tune_allocator()
    files = SpillReader(Path(task.cache_dir))

    def encoded() -> Iterator[EncodedSample]:
        for sample in task.plan.samples:
            pixels, metadata, mask = files.read(sample)
            yield encode_sample(key=sample.key, ref=sample.ref, shape=sample.shape, dtype=sample.dtype,
                                pixels=pixels, metadata=metadata, split=task.plan.split, target=task.target,
                                sha256=sample.sha256, mask=mask)

    start = time.perf_counter()
    try:
        written = WRITERS[task.format](Path(task.folder) / task.plan.file, encoded())
    finally:
        files.close()
    return replace(written, seconds=time.perf_counter() - start)


def pack_shards(shards: Sequence[PlannedShard], samples: SampleTable, executor: Executor, target: Target,
                cache_dir: Path, staging: Path, fmt: str, quiet: bool,
                consumer: SpillConsumer | None = None) -> dict[str, ShardWrite]:
    """Write every planned shard into ``staging`` on ``executor``, one task per shard, from the
    spill files under ``cache_dir``; return what each writer reported, by shard file.

    Shards are submitted in the order of their first sample (the table is in key order, and so
    are the chunks), so the splits advance through the spill together; ``consumer`` frees each
    shard's spilled bytes once its task has returned (a task that fails or dies is retried on
    bytes still there)."""
    order = sorted(range(len(shards)), key=lambda i: (int(shards[i].rows[0]) if len(shards[i].rows) else -1, i))

    def task_of(j: int) -> ShardTask:  # made when submitted: a shard's records exist only while it is written
        shard = shards[order[j]]
        plan = ShardPlan(file=shard.file, split=shard.split, index=shard.index, samples=samples.take(shard.rows))
        return ShardTask(plan=plan, target=target, cache_dir=str(cache_dir), folder=str(staging), format=fmt)

    progress = Progress("pack", sum(len(s.rows) for s in shards), unit="samples", quiet=quiet)
    written: dict[str, ShardWrite] = {}
    nonce = uuid.uuid4().hex[:8]
    tasks = LazySequence(len(shards), task_of)
    for task, shard in executor.map_unordered(write_shard, tasks,
                                              [f"pack-{shards[i].file}-{nonce}" for i in order]):
        if isinstance(shard, WorkerLost):
            raise PackerError(f"writing shard {task.plan.file} killed its worker process every time ({shard}); "
                              "this happens only when copying already-decoded bytes, so check the worker's memory "
                              "limit and the disk under the output folder")
        written[shard.file] = shard
        if consumer is not None:
            consumer.packed(task.plan.samples)
        progress.update(shard.samples)
    progress.close()
    return written
