"""The loader's plan, without any I/O: exactly-once, padding, dropping, resume folding."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.loader.sharding import (
    Segment,
    buffer_shuffle,
    epoch_order,
    plan_rank,
    remaining_after,
    worker_indices,
)


def delivered(counts, *, seed, epoch, world, uneven, workers, batch, drop_last=False, shuffle=True, buffer=8):
    """Per rank: the ids its workers yield, collected in DataLoader round-robin batch order."""
    order = epoch_order(counts, seed=seed, epoch=epoch, shuffle=shuffle, buffer=buffer)
    out = []
    for rank in range(world):
        seg = Segment(world_size=world, uneven=uneven, drop_last=drop_last, batch_size=batch, consumed=0)
        plan = plan_rank(order, rank=rank, current=seg, history=())
        streams = [plan.ids[worker_indices(len(plan.ids), batch_size=batch, num_workers=workers, worker=w)]
                   for w in range(workers)]
        # round-robin by batch over workers, skipping exhausted ones (what DataLoader does)
        chunks = [[s[i:i + batch].tolist() for i in range(0, len(s), batch)] for s in streams]
        merged, j = [], 0
        while any(j < len(c) for c in chunks):
            for c in chunks:
                if j < len(c):
                    merged += c[j]
            j += 1
        out.append(merged)
    return out


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=8), world=st.integers(1, 4),
       workers=st.integers(1, 4), batch=st.integers(1, 5), seed=st.integers(0, 3),
       uneven=st.sampled_from(["exact", "pad", "drop"]))
def test_every_sample_once_or_per_policy(counts, world, workers, batch, seed, uneven):
    total = sum(counts)
    ranks = delivered(counts, seed=seed, epoch=1, world=world, uneven=uneven, workers=workers, batch=batch)
    seen = Counter(g for r in ranks for g in r)
    if uneven == "exact":
        assert seen == Counter(range(total))
        assert max(map(len, ranks)) - min(map(len, ranks)) <= 1
    elif uneven == "drop":
        assert all(len(r) == total // world for r in ranks)
        assert all(c == 1 for c in seen.values())
    else:
        each = -(-total // world)
        assert all(len(r) == each for r in ranks)
        assert set(seen) == set(range(total))
        assert sum(seen.values()) - total == each * world - total
    # batch order does not depend on the worker count
    assert ranks == delivered(counts, seed=seed, epoch=1, world=world, uneven=uneven, workers=1, batch=batch)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=6), old=st.integers(1, 4), new=st.integers(1, 4),
       batch=st.integers(1, 4), steps=st.integers(0, 6), seed=st.integers(0, 3))
def test_resume_with_another_world_size_yields_exactly_the_rest(counts, old, new, batch, steps, seed):
    order = epoch_order(counts, seed=seed, epoch=0, shuffle=True, buffer=5)
    consumed = steps * batch
    first = Segment(world_size=old, uneven="exact", drop_last=False, batch_size=batch, consumed=consumed)
    done = [g for r in range(old) for g in plan_rank(order, rank=r, current=Segment(
        world_size=old, uneven="exact", drop_last=False, batch_size=batch, consumed=0), history=()).ids[:consumed]]
    rest = [g for r in range(new) for g in plan_rank(order, rank=r, current=Segment(
        world_size=new, uneven="exact", drop_last=False, batch_size=batch, consumed=0), history=(first,)).ids]
    assert Counter(done) + Counter(rest) == Counter(range(sum(counts)))


def test_same_world_resume_is_the_tail_of_the_epoch():
    order = epoch_order([4, 7, 2], seed=5, epoch=3, shuffle=True, buffer=4)
    seg = Segment(world_size=2, uneven="pad", drop_last=False, batch_size=3, consumed=0)
    full = plan_rank(order, rank=1, current=seg, history=())
    later = plan_rank(order, rank=1, current=Segment(2, "pad", False, 3, 6), history=())
    assert later.ids.tolist() == full.ids[6:].tolist()
    assert later.pad_from == full.pad_from - 6


def test_remaining_after_drops_only_delivered():
    seq = np.array([5, 3, 1, 0, 4, 2])
    left = remaining_after(seq, Segment(world_size=2, uneven="exact", drop_last=False, batch_size=1, consumed=2))
    # rank 0 had [5,3,1] and delivered 5,3; rank 1 had [0,4,2] and delivered 0,4
    assert left.tolist() == [1, 2]


def test_buffer_shuffle_is_a_seeded_permutation_with_bounded_lead():
    items = np.arange(500)
    out = buffer_shuffle(items, 16, seed=1)
    assert sorted(out.tolist()) == items.tolist()
    assert out.tolist() == buffer_shuffle(items, 16, seed=1).tolist()
    assert out.tolist() != buffer_shuffle(items, 16, seed=2).tolist()
    # an item never leaves the buffer before it entered: index i emits a stream item < i + 16
    assert all(int(v) < i + 16 for i, v in enumerate(out))


def test_unshuffled_order_is_packed_order():
    order = epoch_order([3, 0, 2], seed=9, epoch=4, shuffle=False, buffer=100)
    assert order.sequence.tolist() == [0, 1, 2, 3, 4]


def test_plan_and_readers_import_without_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import packer.loader.sharding, packer.loader.readers\n"
            "from packer.loader import ShardReadError, load_split\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True)
