"""What the default per-sample check costs in make_loader's loader stage, and where it is hashed.

One process, 0 workers, batch 32, the stacking collate; four loaders over the same view, one
pass each per round, round-robin (the order rotating), so a busy machine weighs on all alike:

- ``off``: ``verify="off"``;
- ``fused``: ``verify="sample"`` with ``collate="stack"`` (the default): each image is copied
  into its row of the batch as it arrives and the row is hashed there, in cache;
- ``delivery``: ``verify="sample"`` with the same collate passed as a function (packer then
  cannot assume it copies): each image is hashed where it lies just before it joins its batch,
  then stacked;
- ``readtime``: as ``delivery``, but every sample hashed as the reader reads it (what packer
  did before the check was deferred; with a shuffle buffer, read and delivery lie far apart).

Per variant: median µs of wall and CPU time per sample, the cost against ``off`` (of the
medians) and the median and quartiles of the per-round paired costs. ``THREADS`` sets
``torch.set_num_threads`` (1: as in a DataLoader worker; torch's intra-op threads make
``torch.stack`` erratic on a machine whose cores are all busy).

Usage (from the repository root; the builds of ``benchmarks/loader.py``):

    PYTHONPATH=. THREADS=1 .venv/bin/python benchmarks/verify_cost.py MANIFEST [SOURCES|all] [ROUNDS]
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

import packer.loader.dataset as dataset_module
from packer.loader import ShardDataset, collate_stack, make_loader

_read_shard = dataset_module.read_shard
_AT_READ = [False]


def _read_shard_at_read(*args: Any, **kwargs: Any) -> Iterator[Any]:
    if _AT_READ[0]:
        kwargs["defer"] = False
    return _read_shard(*args, **kwargs)


def main(manifest: str, sources: str = "ct", rounds: int = 15) -> dict[str, Any]:
    if os.environ.get("THREADS"):
        torch.set_num_threads(int(os.environ["THREADS"]))
    dataset_module.read_shard = _read_shard_at_read  # type: ignore[assignment]
    view = None if sources == "all" else sources.split(",")
    stack = functools.partial(collate_stack)  # a function: packer does not fuse the check with it
    cells = {}
    for name, verify, collate in (("off", "off", "stack"), ("fused", "sample", "stack"),
                                  ("delivery", "sample", stack), ("readtime", "sample", stack)):
        ds = ShardDataset(manifest, "train", sources=view, verify=verify)
        cells[name] = (ds, make_loader(ds, 32, collate=collate))
    epochs = dict.fromkeys(cells, 0)

    def one_pass(name: str) -> tuple[float, float]:
        ds, loader = cells[name]
        _AT_READ[0] = name == "readtime"
        ds.set_epoch(epochs[name])
        epochs[name] += 1
        count, wall, cpu = 0, time.perf_counter(), time.process_time()
        for batch in loader:
            count += len(batch["key"])
        return (time.perf_counter() - wall) / count * 1e6, (time.process_time() - cpu) / count * 1e6

    names = list(cells)
    for name in names:
        one_pass(name)  # warm: page cache, scans, imports
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(one_pass(name))
    out: dict[str, Any] = {"manifest": manifest, "sources": sources, "rounds": rounds,
                           "threads": torch.get_num_threads()}
    for name in names:
        row: dict[str, Any] = {}
        for i, what in enumerate(("wall", "cpu")):
            row[f"{what}_us"] = round(statistics.median(x[i] for x in runs[name]), 1)
            if name != "off":
                paired = sorted(100 * (1 - a[i] / b[i]) for a, b in zip(runs["off"], runs[name], strict=True))
                row[f"{what}_cost_pct"] = round(100 * (1 - out["off"][f"{what}_us"] / row[f"{what}_us"]), 1)
                row[f"{what}_paired_pct"] = [round(paired[len(paired) // 4], 1), round(statistics.median(paired), 1),
                                             round(paired[3 * len(paired) // 4], 1)]
        out[name] = row
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], *(args[1:2] or ["ct"]), *([int(args[2])] if len(args) > 2 else []))))
