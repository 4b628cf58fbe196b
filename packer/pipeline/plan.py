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
    """One shard to write: its file name, split, index and the samples that go in it, in order
    (a tuple, or the build's :class:`~packer.pipeline.sampletable.SampleTable`)."""

    file: str
    split: str
    index: int
    samples: Sequence[S]


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


def plan_shards(samples: Sequence[S], *, split: str, fmt: str, max_samples: int,
                max_bytes: int) -> list[ShardPlan[S]]:
    """Cut one split's samples (already in their final order) into consecutive shards
    (:func:`shard_bounds`)."""
    bounds = shard_bounds([s.nbytes for s in samples], fmt=fmt, max_samples=max_samples, max_bytes=max_bytes)
    return [ShardPlan(file=shard_file(split, index, fmt), split=split, index=index, samples=tuple(samples[a:b]))
            for index, (a, b) in enumerate(bounds)]
