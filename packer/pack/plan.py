"""Plan shard boundaries from the header pass, before any pixel is decoded.

Boundaries are a pure function of the sorted sample list, the estimated sizes and the
pack limits, so they never depend on how many workers run or in which order tasks finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packer.records import SampleRef

#: Bytes a sample adds beyond its pixels: three tar headers with padding and the JSON.
PER_SAMPLE_OVERHEAD = {"webdataset": 3 * 1024 + 512, "parquet": 512}
EXTENSIONS = {"webdataset": "tar", "parquet": "parquet"}


@dataclass(frozen=True)
class ShardPlan:
    """One shard to write: its file name, split and the raw files whose samples go in it."""

    file: str
    split: str
    index: int
    refs: tuple[SampleRef, ...]


def plan_shards(refs: Sequence[SampleRef], *, split: str, fmt: str, max_samples: int,
                max_bytes: int) -> list[ShardPlan]:
    """Cut one split's refs (already in their final order) into shards.

    A shard closes before it would exceed ``max_samples`` samples or ``max_bytes`` estimated
    bytes; a file larger than either limit on its own gets a shard to itself. All samples of
    one raw file (frames, tiles) stay in one shard.
    """
    overhead = PER_SAMPLE_OVERHEAD[fmt]
    plans: list[ShardPlan] = []
    current: list[SampleRef] = []
    current_bytes = current_samples = 0

    def close() -> None:
        index = len(plans)
        plans.append(ShardPlan(file=f"{split}-{index:06d}.{EXTENSIONS[fmt]}", split=split,
                               index=index, refs=tuple(current)))

    for ref in refs:
        size = ref.est_bytes + overhead * ref.est_samples
        if current and (current_samples + ref.est_samples > max_samples or current_bytes + size > max_bytes):
            close()
            current, current_bytes, current_samples = [], 0, 0
        current.append(ref)
        current_bytes += size
        current_samples += ref.est_samples
    if current:
        close()
    return plans
