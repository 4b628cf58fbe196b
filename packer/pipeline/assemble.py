"""Assemble: write one planned shard from spilled sample bytes (no decoding happens here)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from packer.allocator import tune_allocator
from packer.pipeline.pixels import read_spilled
from packer.pipeline.plan import ShardPlan
from packer.records import SpilledSample
from packer.shards.encode import EncodedSample, encode_sample
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import write_tar_shard
from packer.shards.writer import ShardWrite

WRITERS = {"webdataset": write_tar_shard, "parquet": write_parquet_shard}


@dataclass(frozen=True)
class ShardTask:
    plan: ShardPlan[SpilledSample]
    label_map: dict[str, int]
    cache_dir: str
    folder: str
    format: str


class _SpillFiles:
    """Keeps spill files open while a shard is assembled (samples of a shard share few files)."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.handles: dict[str, BinaryIO] = {}

    def read(self, sample: SpilledSample) -> tuple[bytes, dict]:
        return read_spilled(self.cache_dir, sample, self.handles)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


def write_shard(task: ShardTask) -> ShardWrite:
    """Dask task: stream the plan's samples from the spill files into the shard file."""
    tune_allocator()
    files = _SpillFiles(Path(task.cache_dir))

    def encoded() -> Iterator[EncodedSample]:
        for sample in task.plan.samples:
            pixels, metadata = files.read(sample)
            yield encode_sample(key=sample.key, ref=sample.ref, shape=sample.shape, dtype=sample.dtype,
                                pixels=pixels, metadata=metadata, split=task.plan.split, label_map=task.label_map,
                                sha256=sample.sha256)

    start = time.perf_counter()
    try:
        written = WRITERS[task.format](Path(task.folder) / task.plan.file, encoded())
    finally:
        files.close()
    return replace(written, seconds=time.perf_counter() - start)
