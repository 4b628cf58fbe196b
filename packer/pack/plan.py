"""Plan shard boundaries from exact sample sizes, before any shard is written.

Boundaries are a pure function of one split's sorted sample list, the sample sizes and the
pack limits, so they never depend on how many workers run or in which order tasks finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

#: Bytes a sample adds beyond its pixels and metadata: three tar headers with padding, or
#: Parquet's per-row share of page and column overhead.
PER_SAMPLE_OVERHEAD = {"webdataset": 3 * 512 + 3 * 511 + 64, "parquet": 64}
EXTENSIONS = {"webdataset": "tar", "parquet": "parquet"}


class Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


S = TypeVar("S", bound=Sized)


@dataclass(frozen=True)
class ShardPlan(Generic[S]):
    """One shard to write: its file name, split, index and the samples that go in it, in order."""

    file: str
    split: str
    index: int
    samples: tuple[S, ...]


def plan_shards(samples: Sequence[S], *, split: str, fmt: str, max_samples: int,
                max_bytes: int) -> list[ShardPlan[S]]:
    """Cut one split's samples (already in their final order) into consecutive shards.

    A shard closes before it would exceed ``max_samples`` samples or ``max_bytes`` bytes
    (sample bytes plus the format's per-sample overhead); a sample larger than ``max_bytes``
    on its own gets a shard to itself.
    """
    overhead = PER_SAMPLE_OVERHEAD[fmt]
    plans: list[ShardPlan[S]] = []
    current: list[S] = []
    current_bytes = 0
    for sample in samples:
        size = sample.nbytes + overhead
        if current and (len(current) >= max_samples or current_bytes + size > max_bytes):
            plans.append(ShardPlan(file=f"{split}-{len(plans):06d}.{EXTENSIONS[fmt]}", split=split,
                                   index=len(plans), samples=tuple(current)))
            current, current_bytes = [], 0
        current.append(sample)
        current_bytes += size
    if current:
        plans.append(ShardPlan(file=f"{split}-{len(plans):06d}.{EXTENSIONS[fmt]}", split=split,
                               index=len(plans), samples=tuple(current)))
    return plans
