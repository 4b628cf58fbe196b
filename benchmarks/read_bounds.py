"""Read bounds on the peer harness's data: how fast packer's loader can deliver, and what bounds it.

Usage (from the repository root, after one run of the peer harness, ``../shared/bench/peers.py``,
so that its packer build exists; prints a table, writes nothing):

    .venv/bin/python benchmarks/read_bounds.py --manifest /tmp/bench/out/packer/build/bench/<version> \\
        --bench ../shared/bench

Each case reads the whole packed dataset (every split with samples), three epochs in one
process, and reports the samples/s of each epoch (the first includes worker start-up):

- ``ideal reader, 2 workers``: a DataLoader (``num_workers=2``, ``batch_size=64``) over a dataset
  that reads nothing: each sample is a view of distinct, already-touched memory of the same
  shape as the harness's samples (CT 2×512×512, images 256×256×3), batched by the harness's
  own collate (``common.collate_mixed``) exactly as its adapters do. No reader can beat it with
  that collate and that many workers: what remains is the stack into shared memory and the
  hand-off to the main process.
- ``the same, no workers``: that collate in the main process.
- ``packer, 2 workers``: the packer adapter's read (``ShardDataset`` per split, the harness's
  collate in the workers).
- ``packer, no workers, one view per source``: ``make_loader(ShardDataset(v, split,
  sources=[s]), 64, num_workers=0)``, packer's stacking collate, one source after the other.
- ``packer, no workers, collate="list"``: the images handed over as views (no byte is read
  until the caller reads it; listed to show what the stack costs).
- ``... one view per source, allocator tuned``: the view-per-source case again after
  :func:`packer.allocator.tune_allocator` in this (the training) process, so that each batch's
  buffer reuses freed heap memory instead of being mapped and faulted in afresh (run last: the
  setting stays for the process). A batch of 64 CT samples is 32 MiB, at glibc's largest mmap
  threshold, so it is still mapped; with ``THP_MEM_ALLOC_ENABLE=1`` torch asks for huge pages there.

Set ``THP_MEM_ALLOC_ENABLE=1`` in the environment to give torch's large allocations huge pages
(a torch setting, not packer's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

EPOCHS = 3
BATCH = 64


class IdealReader(IterableDataset):  # type: ignore[type-arg]
    """``ct`` CT-shaped and ``img`` image-shaped samples in a fixed mixed order, each a view of its
    own row of one array made (and touched) once per worker process: no I/O, no decode."""

    rows: np.ndarray | None = None

    def __init__(self, ct: int, img: int) -> None:
        self.ct, self.img = ct, img

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        kinds = np.array(["ct"] * self.ct + ["img"] * self.img)
        np.random.default_rng(0).shuffle(kinds)
        if IdealReader.rows is None:
            IdealReader.rows = np.ones(((self.ct + self.img) // workers + BATCH, 2 * 512 * 512), np.uint8)
        rows = IdealReader.rows
        used = 0
        for index, kind in enumerate(kinds):
            if (index // BATCH) % workers != worker:
                continue
            row = rows[used]
            used += 1
            array = row.reshape(2, 512, 512) if kind == "ct" else row[:3 * 256 * 256].reshape(256, 256, 3)
            yield {"key": str(index), "kind": str(kind), "label": 0, "arr": array}


def epochs(make: Callable[[], Iterator[int]]) -> list[float]:
    """Samples/s of each of :data:`EPOCHS` passes of ``make()`` (which yields batch sizes)."""
    rates = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        count = sum(make())
        rates.append(count / (time.perf_counter() - start))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True, help="the harness's packer build (version folder)")
    parser.add_argument("--bench", type=Path, default=Path("../shared/bench"), help="the peer harness's folder")
    args = parser.parse_args()
    sys.path.insert(0, str(args.bench.resolve()))
    import common  # the harness's collate, as its adapters use it

    from packer.allocator import tune_allocator
    from packer.loader import ShardDataset, make_loader

    manifest = json.loads((args.manifest / "manifest.json").read_text())
    splits = [s for s, v in manifest["splits"].items() if int(v["samples"])]
    shapes = manifest["sample_schema"].get("shapes") or {}
    sources = sorted(shapes)
    ct_sources = [s for s in sources if shapes[s] == [[2, 512, 512]]]
    if len(sources) != 2 or len(ct_sources) != 1:
        raise SystemExit(f"{args.manifest}: expected the harness's two sources (CT 2x512x512 and images), got {shapes}")
    total = sum(int(manifest["splits"][s]["samples"]) for s in splits)
    ct = sum(len(ShardDataset(args.manifest, split, sources=ct_sources)) for split in splits)
    ideal = IdealReader(ct, total - ct)

    def ideal_loader(workers: int) -> Callable[[], Iterator[int]]:
        loader = DataLoader(ideal, batch_size=BATCH, num_workers=workers, collate_fn=common.collate_mixed,
                            persistent_workers=workers > 0)
        return lambda: (len(b["ct_keys"]) + len(b["img_keys"]) for b in loader)

    def packer_workers() -> Iterator[int]:
        for split in splits:
            def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
                return common.collate_mixed([{"key": it["key"], "label": int(it["label"]),
                                              "kind": "ct" if it["image"].shape[0] == 2 else "img",
                                              "arr": it["image"].numpy() if it["image"].shape[0] == 2
                                              else it["image"].numpy().transpose(1, 2, 0)} for it in items])
            loader = DataLoader(ShardDataset(args.manifest, split, shuffle=False), batch_size=BATCH, num_workers=2,
                                collate_fn=collate)
            yield from (len(b["ct_keys"]) + len(b["img_keys"]) for b in loader)

    def packer_views() -> Iterator[int]:
        for split in splits:
            for source in sources:
                dataset = ShardDataset(args.manifest, split, shuffle=False, sources=[source])
                yield from (len(b["key"]) for b in make_loader(dataset, batch_size=BATCH, num_workers=0))

    def packer_list() -> Iterator[int]:
        for split in splits:
            dataset = ShardDataset(args.manifest, split, shuffle=False)
            yield from (len(b["key"]) for b in make_loader(dataset, batch_size=BATCH, num_workers=0, collate="list"))

    def tuned_views() -> Iterator[int]:
        tune_allocator()
        yield from packer_views()

    cases = [("ideal reader, 2 workers", ideal_loader(2)), ("the same, no workers", ideal_loader(0)),
             ("packer, 2 workers", packer_workers), ("packer, no workers, one view per source", packer_views),
             ('packer, no workers, collate="list"', packer_list),
             ("packer, no workers, one view per source, allocator tuned", tuned_views)]
    print(f"{total} samples ({ct} CT), batch {BATCH}, "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}, torch {torch.__version__}")
    print("| case | epoch 1 | epoch 2 | epoch 3 |\n|---|---:|---:|---:|")
    for name, make in cases:
        rates = epochs(make)
        print(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
