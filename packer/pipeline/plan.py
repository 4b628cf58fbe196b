"""Plan shard boundaries from exact sample sizes, before any shard is written.

Boundaries are a pure function of one split's sorted sample list, the sample sizes and the
pack limits, so they never depend on how many workers run or in which order tasks finish.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from packer.config import SPLITS, PackConfig
from packer.pipeline.sampletable import SampleTable
from packer.records import SpilledSample

#: Bytes a sample adds beyond its pixels and metadata: three tar headers with padding, or
#: Parquet's per-row share of page and column overhead.
PER_SAMPLE_OVERHEAD = {"webdataset": 3 * 512 + 3 * 511 + 64, "parquet": 64}
EXTENSIONS = {"webdataset": "tar", "parquet": "parquet"}


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write, as a pack task carries it: its file name, split, index and the
    samples that go in it, in order (the planned rows of the build's sample table)."""

    file: str
    split: str
    index: int
    samples: Sequence[SpilledSample]


def shard_file(split: str, index: int, fmt: str) -> str:
    return f"{split}-{index:06d}.{EXTENSIONS[fmt]}"


def shard_bounds(sizes: Sequence[int], *, fmt: str, max_samples: int, max_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each shard over samples of ``sizes`` bytes (already in their final
    order): a shard closes before it would exceed ``max_samples`` samples or ``max_bytes``
    bytes (sample bytes plus the format's per-sample overhead); a sample larger than
    ``max_bytes`` on its own gets a shard to itself."""
    overhead = PER_SAMPLE_OVERHEAD[fmt]
    bounds: list[tuple[int, int]] = []
    start, current_bytes = 0, 0
    for index, nbytes in enumerate(sizes):
        size = nbytes + overhead
        if index > start and (index - start >= max_samples or current_bytes + size > max_bytes):
            bounds.append((start, index))
            start, current_bytes = index, 0
        current_bytes += size
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


@dataclass(frozen=True)
class PlannedShard:
    """A planned shard: its file, split and index, and the rows of its samples (in the order they
    go in) in the build's sample table."""

    file: str
    split: str
    index: int
    rows: np.ndarray


def plan_shards(samples: SampleTable, split_of: Mapping[str, str], pack: PackConfig) -> list[PlannedShard]:
    """The shards of every split, in split order (train, valid, test), each split's samples in
    the table's (key) order, cut by :func:`shard_bounds` under ``pack``'s limits."""
    rows: dict[str, list[int]] = defaultdict(list)
    for row, key in enumerate(samples.column("key")):
        rows[split_of[key]].append(row)
    nbytes = samples.nbytes
    shards: list[PlannedShard] = []
    for split in SPLITS:
        mine = np.array(rows.pop(split, []), dtype=np.int64)
        bounds = shard_bounds(nbytes[mine].tolist(), fmt=pack.format, max_samples=pack.max_samples,
                              max_bytes=pack.max_bytes)
        shards.extend(PlannedShard(file=shard_file(split, index, pack.format), split=split, index=index,
                                   rows=mine[start:stop])
                      for index, (start, stop) in enumerate(bounds))
    return shards
