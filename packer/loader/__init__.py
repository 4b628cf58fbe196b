"""PyTorch runtime loader for packed shards (the only part of packer that imports torch).

    from packer.loader import ShardDataset, make_loader, DevicePrefetcher

    dataset = ShardDataset("out/name/version", "train", seed=0, uneven="pad")  # rank/world from torch.distributed
    loader = make_loader(dataset, batch_size=64, num_workers=4)              # collate="stack" | "list" | "pad"
    batches = DevicePrefetcher(loader, "cuda", mean=(0.5,), std=(0.25,))      # float32 on the device

Order. A whole epoch's order is a pure function of (seed, epoch, shuffle_buffer, the
manifest's per-shard counts): shards permuted, then a shuffle buffer (see
:mod:`packer.loader.sharding`). Ranks take contiguous balanced chunks of it (``uneven``:
``exact`` / ``pad`` / ``drop``). Within a rank, batch ``j`` is built by worker
``j % num_workers`` and PyTorch's DataLoader collects worker batches round-robin, so a
rank's batch stream is the same for any ``num_workers``: a function of (seed, epoch,
rank, world_size, batch_size) only. (One exception: under ``on_error="skip"`` with
``uneven="pad"``, a skipped sample's place is filled with a repeat of a readable sample of
the same worker, so which sample repeats depends on the worker split; which samples are
delivered, each once, does not.) Samples are assigned one by one in the global sample
index space, so any number of shards works with any ranks × workers.

Checkpoint and resume. The loader counts, in the main process, the batches it has handed
out (``batches × batch_size`` positions of the rank's sequence, never what workers have
prefetched); ``state_dict()`` is a small JSON-able dict. Save it with the model, from the
object you iterate (the prefetcher, which does not count its own prefetched batch):

    state = {"model": model.state_dict(), "optim": optim.state_dict(), "loader": batches.state_dict()}
    if rank == 0:
        torch.save(state, path)      # every rank steps in lockstep, so rank 0's position is everyone's

    # on restart (every rank loads the same file)
    ckpt = torch.load(path)
    batches.load_state_dict(ckpt["loader"])
    for epoch in range(ckpt["loader"]["epoch"], epochs):
        batches.set_epoch(epoch)     # keeps the pending resume for the saved epoch
        for batch in batches: ...    # the saved epoch yields exactly what it had left

Resuming with the same world size gives exactly the rest of the uninterrupted epoch, in the
same order, with any ``num_workers`` (but the repeats that fill skipped samples' places under
``on_error="skip"`` with ``uneven="pad"``, as above). With another world size, the samples no rank had
consumed (assuming ranks stepped together, which DDP enforces) are split afresh over the
new ranks: exactly the remaining samples, in a different order. Transforms are seeded per
sample from (seed, epoch, sample), so augmentations survive resumes too.

Bad data. A shard that fails its size check (always) or sha256 (``verify="shard"``, checked
before reading), a sample whose checksum is not the one ``_index.parquet`` records
(``verify="sample"``, the default: every sample, as it is read), a truncated archive or an
undecodable sample raises :class:`ShardReadError` naming shard and key; ``on_error="skip"`` skips and counts them
(``loader.skipped``, ``loader.skipped_samples``, in the state) up to ``max_skipped`` per epoch
(each epoch counts afresh: the same damaged sample read every epoch is not more bad data).

Memory. A worker holds fewer than ``shuffle_buffer`` decoded samples read ahead of their
turn (the workers of a rank about that many together); a held Parquet sample keeps its
record batch (``readers.PARQUET_ROWS`` rows) alive. ``loader.close()`` stops persistent
workers at once (left to the garbage collector, PyTorch may wait 5 s per worker).

Processes. The epoch and resume position reach workers through a shared-memory tensor, so
``set_epoch``/``load_state_dict`` work with persistent workers under fork and spawn.
``worker_init_fn`` seeds ``random``/numpy/torch from (seed, epoch at worker start, rank,
worker); ``transform`` runs under a per-sample seed instead.
"""

from __future__ import annotations

import importlib
from typing import Any

# Exports load lazily, so ``packer.loader.sharding`` and ``packer.loader.readers`` (numpy
# and pyarrow only) import without torch.
_EXPORTS = {
    "DevicePrefetcher": "device",
    "ImageBatch": "dataloader",
    "ImageTypeError": "dataloader",
    "LoaderState": "dataloader",
    "MixedDataset": "mix",
    "MixedShapesError": "dataloader",
    "PlannedDataset": "dataset",
    "ShardDataset": "dataset",
    "ShardLoader": "dataloader",
    "ShardReadError": "readers",
    "SplitInfo": "readers",
    "bench_loader": "bench",
    "collate_list": "dataloader",
    "collate_pad": "dataloader",
    "collate_stack": "dataloader",
    "format_table": "bench",
    "load_split": "readers",
    "load_view": "readers",
    "make_loader": "dataloader",
    "resolve_rank": "dataset",
    "seed_worker": "dataloader",
    "wds_dataset": "wds",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'packer.loader' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"packer.loader.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
