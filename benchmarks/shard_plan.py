"""Measure the shard plan: how local an edit stays, and what the content-defined ends cost in size spread.

    .venv/bin/python benchmarks/shard_plan.py                     # about a minute; prints a table for RESULTS.md
    .venv/bin/python benchmarks/shard_plan.py --index build/demo/<version>/_index.parquet

No build needed. Each case is ``--splits`` splits of ``--samples`` samples with random keys
(``<source>-<16 hex>``, as packer names samples, sorted) and sizes drawn from a mix: the bench
mix (the peer harness's CT 2×256×256 and photo 3×256×256 samples, 131,200 and 196,736 bytes,
65/35), or with ``--index`` the ``bytes`` column of a built ``_index.parquet``, resampled; and a
heavy-tailed mix (lognormal, median 200 kB, σ 0.8). Each case is planned by packer's
:func:`packer.pipeline.plan.shard_bounds` and by the greedy rule it replaced (a shard closes only
when the next sample would break a limit; kept here for the comparison).

Locality: ``--edits`` single edits shared among the splits, half insertions (a new key right
after a random sample, its size drawn from the mix) and half removals (a random sample), each
applied to the original split alone; "changed" counts the edited plan's shards whose sample
list no shard of the original plan had (the shards an incremental build must write). The edited
plan is computed near the edit (:func:`edited_plan`); every ``--check``-th edit it is also
planned whole and compared. Most of the minute goes to the greedy rule, whose edits move every
later shard. Spread: bytes per
shard (samples' bytes plus the format's per-sample overhead, what ``max_bytes`` limits) as a
share of ``max_bytes``, p5/p50/p95 over the original plan's shards, without the split's last
shard and (in brackets) with it; and samples per shard, p5/p50/p95.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.pipeline.plan import PER_SAMPLE_OVERHEAD, shard_bounds

FMT = "webdataset"
BENCH_MIX = (np.array([131_200, 196_736]), np.array([0.65, 0.35]))


def greedy_bounds(sizes: list[int], *, max_samples: int, max_bytes: int) -> list[tuple[int, int]]:
    """The plan before issue 39: each shard as full as the limits allow, in order."""
    overhead = PER_SAMPLE_OVERHEAD[FMT]
    bounds: list[tuple[int, int]] = []
    start, used = 0, 0
    for index, nbytes in enumerate(sizes):
        if index > start and (index - start >= max_samples or used + nbytes + overhead > max_bytes):
            bounds.append((start, index))
            start, used = index, 0
        used += nbytes + overhead
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


def plan(rule: str, keys: list[str], sizes: list[int], max_samples: int, max_bytes: int) -> list[tuple[int, int]]:
    if rule == "greedy":
        return greedy_bounds(sizes, max_samples=max_samples, max_bytes=max_bytes)
    return shard_bounds(keys, sizes, fmt=FMT, max_samples=max_samples, max_bytes=max_bytes)


@dataclass(frozen=True)
class Case:
    name: str
    mix: str
    max_samples: int
    max_bytes: int


CASES = (
    Case("bench mix, 64 MiB binds", "bench", 100_000, 64 * 2**20),
    Case("heavy-tailed mix, 64 MiB binds", "lognormal", 100_000, 64 * 2**20),
    Case("bench mix, defaults (1000 samples, 256 MiB): count binds", "bench", 1000, 256 * 2**20),
    Case("bench mix, the demo's 32 samples: count binds", "bench", 32, 64 * 2**20),
)


def draw_sizes(mix: str, count: int, rng: np.random.Generator, index_sizes: np.ndarray | None) -> np.ndarray:
    if mix == "lognormal":
        return np.exp(rng.normal(np.log(200_000), 0.8, size=count)).astype(np.int64)
    if index_sizes is not None:
        return rng.choice(index_sizes, size=count)
    values, weights = BENCH_MIX
    return rng.choice(values, size=count, p=weights)


def reach(bounds_start: int, ends: np.ndarray, case: Case) -> int:
    """The last sample a shard starting at ``bounds_start`` reads to find its end (both rules):
    ``max_samples`` on from its start, or the first sample that overflows ``max_bytes``."""
    overflow = int(np.searchsorted(ends, ends[bounds_start] + case.max_bytes, "right")) - 1
    return min(bounds_start + case.max_samples, overflow)


def edited_plan(rule: str, old: list[tuple[int, int]], ends: np.ndarray, keys2: list[str], sizes2: list[int],
                pos: int, shift: int, case: Case) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The plan of the edited split (sample ``pos`` inserted, ``shift`` 1, or removed, -1),
    planned near the edit only, and the shards of it that were planned anew. A plan is a pure
    function of the samples from any of its shard starts on, and a shard reads at most
    :func:`reach` samples: so the shards whose reach ends before the edit are kept, the plan
    restarts from the first other shard's start, and once one of its starts after the edit is
    an old start, the old plan goes on from there."""
    starts = [a for a, _ in old]
    first = 0
    while first + 1 < len(old) and reach(starts[first], ends, case) < pos:
        first += 1
    first = max(first - 1, 0)
    while first > 0 and reach(starts[first - 1], ends, case) >= pos:
        first -= 1
    begin = starts[first]
    old_start = {a: i for i, a in enumerate(starts)}
    span = max(b - a for a, b in old) + 1
    length = 8 * span
    while True:
        stop = min(len(keys2), begin + length)
        window = [(a + begin, b + begin) for a, b in plan(rule, keys2[begin:stop], sizes2[begin:stop],
                                                           case.max_samples, case.max_bytes)]
        trusted = window if stop == len(keys2) else window[:-2]
        for index, (a, _) in enumerate(trusted):
            back = a - shift if a > pos or (shift < 0 and a == pos) else None
            if back is not None and back in old_start and index > 0:
                rest = [(x + shift, y + shift) for x, y in old[old_start[back]:]]
                return old[:first] + trusted[:index] + rest, trusted[:index]
        if stop == len(keys2):
            return old[:first] + window, window
        length *= 2


def changed_shards(rule: str, keys: list[str], sizes: list[int], case: Case, edits: int,
                   rng: np.random.Generator, pool: np.ndarray, check_every: int) -> np.ndarray:
    bounds = plan(rule, keys, sizes, case.max_samples, case.max_bytes)
    old = {tuple(keys[a:b]) for a, b in bounds}
    ends = np.concatenate([[0], np.cumsum(np.array(sizes) + PER_SAMPLE_OVERHEAD[FMT])])
    out = []
    for edit in range(edits):
        if edit % 2 == 0:
            pos, shift = int(rng.integers(0, len(keys) + 1)), 1
            key = (keys[pos - 1] if pos else "") + "+"
            keys2, sizes2 = keys[:pos] + [key] + keys[pos:], sizes[:pos] + [int(rng.choice(pool))] + sizes[pos:]
        else:
            pos, shift = int(rng.integers(0, len(keys))), -1
            keys2, sizes2 = keys[:pos] + keys[pos + 1:], sizes[:pos] + sizes[pos + 1:]
        new, planned = edited_plan(rule, bounds, ends, keys2, sizes2, pos, shift, case)
        if check_every and edit % check_every == 0:
            whole = plan(rule, keys2, sizes2, case.max_samples, case.max_bytes)
            assert new == whole, f"{case.name}, {rule}, edit {edit}: the plan near the edit is not the whole plan"
        out.append(sum(tuple(keys2[a:b]) not in old for a, b in planned))
    return np.array(out)


def percentiles(values: np.ndarray, scale: float = 1.0, fmt: str = "{:.0%}") -> str:
    """p5/p50/p95 of ``values``; "-" where there are none (every split planned into one shard:
    a small --samples leaves no shard but the last)."""
    if len(values) == 0:
        return "-"
    return "/".join(fmt.format(v / scale) for v in np.percentile(values, [5, 50, 95]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000, help="samples in the split (default 20,000)")
    parser.add_argument("--edits", type=int, default=1_000,
                        help="single insertions + removals per case (default 1,000)")
    parser.add_argument("--index", type=Path, help="draw the bench mix's sizes from this _index.parquet's bytes column")
    parser.add_argument("--splits", type=int, default=5,
                        help="splits drawn per case, the edits shared among them (default 5)")
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--check", type=int, default=20, metavar="N",
                        help="every Nth edit, also plan the whole split and compare (0: never; default 20)")
    args = parser.parse_args()
    index_sizes = None
    if args.index is not None:
        import pyarrow.parquet as pq

        index_sizes = pq.read_table(args.index, columns=["bytes"]).column("bytes").to_numpy()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}; "
          f"{args.splits} splits of {args.samples:,} samples and {args.edits:,} edits in all a case, seed {args.seed}"
          + (f", sizes from {args.index}" if args.index else ""))
    print("| case | rule | shards a split | bytes/shard p5/p50/p95 of max_bytes (with last) | samples/shard p5/p50/p95 "
          "| edits changing 1 / 2 / 3+ shards | changed mean / p99 / max | plan ms |")
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES:
        for rule in ("content-defined", "greedy"):
            nbytes, nbytes_all, counts, changed, ms = [], [], [], [], 0.0
            for split in range(args.splits):
                rng = np.random.default_rng([args.seed, split])
                keys = sorted({f"s-{int(v):016x}" for v in rng.integers(0, 2**63, size=args.samples)})
                sizes = draw_sizes(case.mix, len(keys), rng, index_sizes).tolist()
                began = time.perf_counter()
                bounds = plan(rule, keys, sizes, case.max_samples, case.max_bytes)
                ms += (time.perf_counter() - began) * 1000 / args.splits
                ends = np.concatenate([[0], np.cumsum(np.array(sizes) + PER_SAMPLE_OVERHEAD[FMT])])
                shard_bytes = [int(ends[b] - ends[a]) for a, b in bounds]
                nbytes += shard_bytes[:-1]
                nbytes_all += shard_bytes
                counts += [b - a for a, b in bounds[:-1]]
                edit_rng = np.random.default_rng([args.seed, split, 1])
                changed += changed_shards(rule, keys, sizes, case, args.edits // args.splits, edit_rng,
                                          np.array(sizes), args.check).tolist()
            edits = np.array(changed)
            share = np.bincount(edits, minlength=4) / len(edits)
            print(f"| {case.name} | {rule} | {len(nbytes_all) / args.splits:.0f} "
                  f"| {percentiles(np.array(nbytes), case.max_bytes)} "
                  f"({percentiles(np.array(nbytes_all), case.max_bytes)}) "
                  f"| {percentiles(np.array(counts), fmt='{:.0f}')} "
                  f"| {share[1]:.1%} / {share[2]:.1%} / {share[3:].sum():.1%} "
                  f"| {edits.mean():.2f} / {np.percentile(edits, 99):.0f} / {edits.max()} | {ms:.0f} |")

if __name__ == "__main__":
    main()
