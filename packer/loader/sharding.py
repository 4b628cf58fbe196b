"""Which sample goes where: the epoch order, the rank split, the worker split, resume.

Pure numpy, no torch, no I/O: every function here is a deterministic function of its
arguments, so every rank and every DataLoader worker computes the same plan on its own.

Global sample index space
    The split's shards, in manifest order, own consecutive ranges of global sample ids:
    shard ``k`` holds ids ``offsets[k] .. offsets[k+1]-1`` (from the manifest's per-shard
    ``samples``), id ``g`` is the sample at position ``g - offsets[k]`` of shard ``k``.

Epoch order (:func:`epoch_order`)
    1. The *stream*: shards in a permuted order (seeded by ``seed, epoch``), each shard's
       samples in packed order. Readers walk the stream forward, so a tar shard is read
       front to back with skips.
    2. The *sequence*: the stream passed through a seeded shuffle buffer of ``buffer``
       slots (the WebDataset shuffle, simulated on indices). An item leaves the buffer at
       most ``buffer`` places before its stream position, so a reader that walks the
       stream holds at most ``buffer`` decoded samples while it emits the sequence.
       ``buffer >= samples`` gives a full permutation.

Rank split (:func:`rank_slice`), on the sequence (or, after a resume with another world
size, on the sequence of what is left): contiguous balanced chunks. ``exact``: sizes differ
by at most one, every sample once. ``pad``: every rank ``ceil(N/W)``, the extra slots
repeat the sequence from its start. ``drop``: every rank ``floor(N/W)``, the tail dropped.

Worker split (:func:`worker_indices`): the rank's sequence is cut into batches of
``batch_size``; batch ``j`` goes to worker ``j % num_workers``. PyTorch's DataLoader
collects batches from workers round-robin, so it hands them out in the order 0, 1, 2, ...
and the rank's batch stream is its sequence in order, whatever ``num_workers`` is.

Random numbers come from a counter-based splitmix64 written here, not from numpy's
generators, so the order does not change with the numpy version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UNEVEN = ("exact", "pad", "drop")

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(value: int) -> int:
    z = value & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def derive_seed(*words: int) -> int:
    """A 64-bit seed that depends on every word in order (splitmix64 chaining).

    Negative words are taken modulo 2**64. Returns an int in ``[0, 2**64)``.
    """
    state = _GOLDEN
    for word in words:
        state = _mix64(state ^ _mix64((word & _MASK) + _GOLDEN))
    return state


def random_u64(seed: int, count: int) -> np.ndarray:
    """``count`` pseudo-random uint64 values (splitmix64 over a counter), shape ``(count,)``."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _MASK) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shard_offsets(counts: Sequence[int]) -> np.ndarray:
    """Cumulative sample counts, int64, shape ``(len(counts)+1,)``; ``offsets[-1]`` is the total."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=offsets[1:])
    return offsets


def buffer_shuffle(items: np.ndarray, buffer: int, seed: int) -> np.ndarray:
    """Pass ``items`` through a shuffle buffer of ``buffer`` slots; int64, same length.

    Fill the buffer; for every further item emit a random slot's content and put the item
    there; at the end emit what is left in random order. Deterministic for ``seed``.
    """
    n = len(items)
    size = min(max(buffer, 1), n)
    if size <= 1:
        return np.asarray(items, dtype=np.int64).copy()
    rand = random_u64(seed, n)
    values = np.asarray(items, dtype=np.int64).tolist()
    slots = (rand[: n - size] % np.uint64(size)).astype(np.int64).tolist()
    held = values[:size]
    out: list[int] = []
    append = out.append
    for slot, incoming in zip(slots, values[size:], strict=True):
        append(held[slot])
        held[slot] = incoming
    tail = np.asarray(held, dtype=np.int64)[np.argsort(rand[n - size:], kind="stable")]
    return np.concatenate([np.asarray(out, dtype=np.int64), tail])


@dataclass(frozen=True)
class EpochOrder:
    """One epoch's order over the split.

    ``shard_order``: shard indices in stream order. ``sequence``: global ids in the order
    they are handed out (before the rank split). ``stream_pos[g]``: where id ``g`` sits in
    the stream (the order readers walk). All int64.
    """

    epoch: int
    shard_order: np.ndarray
    sequence: np.ndarray
    stream_pos: np.ndarray


def epoch_order(counts: Sequence[int], *, seed: int, epoch: int, shuffle: bool, buffer: int) -> EpochOrder:
    """The order of one epoch: permuted shards, then a ``buffer``-slot shuffle (see module doc).

    With ``shuffle=False`` the sequence is the packed order (shards in manifest order).
    """
    offsets = shard_offsets(counts)
    total = int(offsets[-1])
    if shuffle and len(counts) > 1:
        shard_order = np.argsort(random_u64(derive_seed(seed, epoch, 1), len(counts)), kind="stable")
    else:
        shard_order = np.arange(len(counts), dtype=np.int64)
    if total:
        stream = np.concatenate([np.arange(offsets[k], offsets[k + 1], dtype=np.int64) for k in shard_order])
    else:
        stream = np.zeros(0, dtype=np.int64)
    stream_pos = np.empty(total, dtype=np.int64)
    stream_pos[stream] = np.arange(total, dtype=np.int64)
    sequence = buffer_shuffle(stream, buffer, derive_seed(seed, epoch, 2)) if shuffle else stream
    return EpochOrder(epoch=epoch, shard_order=shard_order.astype(np.int64), sequence=sequence, stream_pos=stream_pos)


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch run under one configuration, ended by a checkpoint.

    ``consumed`` counts positions of each rank's sequence already delivered (every rank
    the same number: ranks step together; a shorter rank is capped at its length).
    """

    world_size: int
    uneven: str
    drop_last: bool
    batch_size: int
    consumed: int

    def to_json(self) -> list[int | str | bool]:
        return [self.world_size, self.uneven, self.drop_last, self.batch_size, self.consumed]

    @classmethod
    def from_json(cls, value: Sequence[int | str | bool]) -> Segment:
        if len(value) != 5:
            raise ValueError(f"a loader state segment has 5 fields, got {list(value)!r}")
        world_size, uneven, drop_last, batch_size, consumed = value
        if str(uneven) not in UNEVEN:
            raise ValueError(f"loader state segment: uneven={uneven!r}, expected one of {UNEVEN}")
        # bool("no") is True; a state saved before drop_last was made a bool may hold 0, 1 or None,
        # as it was given (argparse's type=int, a YAML 0/1), which read as that truth value
        plain_truth = drop_last is None or (isinstance(drop_last, int | np.integer) and int(drop_last) in (0, 1))
        if not (isinstance(drop_last, bool | np.bool_) or plain_truth):
            raise ValueError(f"loader state segment: drop_last={drop_last!r}, expected true or false")
        # a negative consumed resumed at the epoch's end (ids[-4:]), batch_size 0 divided by zero at len()
        numbers = {"world_size": (world_size, 1), "batch_size": (batch_size, 1), "consumed": (consumed, 0)}
        for name, (number, least) in numbers.items():
            if isinstance(number, bool) or not isinstance(number, int | np.integer) or number < least:
                raise ValueError(f"loader state segment: {name}={number!r}, expected an integer >= {least}")
        return cls(world_size=int(world_size), uneven=str(uneven), drop_last=bool(drop_last),
                   batch_size=int(batch_size), consumed=int(consumed))

    def same_split(self, other: Segment) -> bool:
        """True if both cut the sequence into the same per-rank sequences."""
        return (self.world_size == other.world_size and self.uneven == other.uneven
                and self.drop_last == other.drop_last
                and (not self.drop_last or self.batch_size == other.batch_size))


def rank_slice(sequence: np.ndarray, *, rank: int, world_size: int, uneven: str) -> tuple[np.ndarray, int]:
    """This rank's part of ``sequence`` and where padding starts in it (``len`` if none).

    ``exact``: balanced contiguous chunks. ``pad``: ``ceil(N/W)`` each, the extra slots
    repeat ``sequence`` from its start (cyclically). ``drop``: ``floor(N/W)`` each.
    """
    if uneven not in UNEVEN:
        raise ValueError(f"uneven={uneven!r}; expected one of {UNEVEN}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    n = len(sequence)
    if uneven == "exact":
        lo, hi = rank * n // world_size, (rank + 1) * n // world_size
        return sequence[lo:hi], hi - lo
    if uneven == "drop":
        each = n // world_size
        return sequence[rank * each:(rank + 1) * each], each
    each = -(-n // world_size)
    lo, hi = rank * each, (rank + 1) * each
    if n == 0:
        return sequence[:0], 0
    ids = sequence[np.arange(lo, hi) % n]
    return ids, max(0, min(each, n - lo))


def rank_sequence(sequence: np.ndarray, *, rank: int, segment: Segment) -> tuple[np.ndarray, int]:
    """Rank's sequence under ``segment`` (drop_last applied), and its padding start."""
    ids, pad_from = rank_slice(sequence, rank=rank, world_size=segment.world_size, uneven=segment.uneven)
    if segment.drop_last:
        keep = len(ids) // segment.batch_size * segment.batch_size
        ids, pad_from = ids[:keep], min(pad_from, keep)
    return ids, pad_from


def remaining_after(sequence: np.ndarray, segment: Segment) -> np.ndarray:
    """The ids of ``sequence`` not delivered by any rank during ``segment``, in sequence order."""
    delivered = [rank_sequence(sequence, rank=r, segment=segment)[0][: segment.consumed]
                 for r in range(segment.world_size)]
    if not delivered:
        return sequence
    return sequence[~np.isin(sequence, np.concatenate(delivered))]


@dataclass(frozen=True)
class RankPlan:
    """What one rank hands out for the rest of an epoch.

    ``ids``: global ids in order (already-consumed positions removed). ``pad_from``: index
    in ``ids`` where padding repeats begin. ``start``: positions consumed before ``ids[0]``.
    """

    ids: np.ndarray
    pad_from: int
    start: int


def plan_rank(order: EpochOrder, *, rank: int, current: Segment, history: Sequence[Segment]) -> RankPlan:
    """Rank's remaining plan: fold finished ``history`` segments, split, skip ``current.consumed``."""
    base = order.sequence
    for segment in history:
        base = remaining_after(base, segment)
    ids, pad_from = rank_sequence(base, rank=rank, segment=current)
    start = min(current.consumed, len(ids))
    return RankPlan(ids=ids[start:], pad_from=max(0, pad_from - start), start=start)


def rank_lengths(order: EpochOrder, *, current: Segment, history: Sequence[Segment]) -> list[int]:
    """Every rank's count of :func:`plan_rank`'s ``ids`` under ``current`` (ranks ``0 ..
    current.world_size - 1``), the history folded once for all of them."""
    base = order.sequence
    for segment in history:
        base = remaining_after(base, segment)
    return [max(0, len(rank_sequence(base, rank=r, segment=current)[0]) - current.consumed)
            for r in range(current.world_size)]


def worker_indices(count: int, *, batch_size: int, num_workers: int, worker: int) -> np.ndarray:
    """Indices into a rank sequence of length ``count`` that ``worker`` yields, in order.

    Batch ``j`` (``batch_size`` positions; the last may be short) goes to worker
    ``j % num_workers``. int64, ascending.
    """
    if batch_size < 1 or num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"bad worker split: batch_size={batch_size}, num_workers={num_workers}, worker={worker}")
    positions = np.arange(count, dtype=np.int64)
    return positions[(positions // batch_size) % num_workers == worker]
