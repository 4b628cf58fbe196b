"""``bench_loader``: where does input throughput go? One variable at a time.

Stages, each timed on its own so a stall can be pinned on one of them:

1. ``raw_read``: the split's shard files read sequentially in 8 MiB blocks (MB/s). A
   second run on the same files mostly measures the page cache; the first cold run, disk.
2. ``decode``: ShardDataset iterated in this process, no DataLoader (samples/s).
3. ``loader``: make_loader samples/s, varying ``num_workers`` (at the first batch size and
   pin_memory value), then, around the fastest worker count, ``pin_memory`` and ``batch_size``
   where more than one value of each is given. ``first_batch_s`` is the time to the first
   batch (worker start-up).
4. ``device``: DevicePrefetcher + a dummy step on ``device``, with the fastest worker count:
   time blocked waiting for data versus time computing, and on CUDA the host→device copy time
   of one batch.

5. ``verify`` (only when several ``verify`` modes are given, e.g. ``off`` and ``sample``): the
   decode and loader stages (at the fastest worker count) for each mode, interleaved over
   ``rounds`` rounds (the order alternating), so that a noisy machine weighs on every mode
   alike; the medians, and each mode's cost against the first.

Every measurement loops over epochs until ``seconds`` have passed (at least one batch).

A split whose samples have several shapes (a dataset mixing CT windows, radiographs and
photos) cannot be stacked into batches: unless a collate is chosen, such a split is measured
with ``collate="list"`` and the result says so (``config.collate_note``); ``sources=`` measures
a view of some sources instead.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from packer.errors import ConfigError
from packer.loader.dataloader import make_loader
from packer.loader.dataset import ShardDataset
from packer.loader.device import DevicePrefetcher, usable_device


def _epochs(make_iter: Any, seconds: float) -> Iterator[Any]:
    """Items from ``make_iter(epoch)`` for epochs 0, 1, ... until ``seconds`` have passed."""
    start, epoch = time.perf_counter(), 0
    while True:
        produced = False
        for item in make_iter(epoch):
            produced = True
            yield item
            if time.perf_counter() - start >= seconds:
                return
        if not produced:
            return
        epoch += 1


def _raw_read(paths: Sequence[str], seconds: float) -> dict[str, Any]:
    total, start = 0, time.perf_counter()
    while True:
        for path in paths:
            with open(path, "rb", buffering=0) as fh:
                while block := fh.read(8 << 20):
                    total += len(block)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds or total == 0:
            break
    return {"bytes": total, "seconds": elapsed, "mb_per_s": total / 1e6 / elapsed if elapsed else 0.0}


def _decode(dataset: ShardDataset, seconds: float) -> dict[str, Any]:
    def run(epoch: int) -> Iterable[Any]:
        dataset.set_epoch(epoch)
        return dataset

    count, start, cpu = 0, time.perf_counter(), time.process_time()
    for _ in _epochs(run, seconds):
        count += 1
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    # CPU seconds of this process: on a shared machine a steadier measure of what a sample costs than wall time
    return {"samples": count, "seconds": elapsed, "samples_per_s": count / elapsed if elapsed else 0.0,
            "cpu_s": cpu, "samples_per_cpu_s": count / cpu if cpu else 0.0}


def _loader(dataset: ShardDataset, *, num_workers: int, batch_size: int, pin_memory: bool,
            seconds: float, collate: str) -> dict[str, Any]:
    loader = make_loader(dataset, batch_size, num_workers, pin_memory=pin_memory, collate=collate)

    def run(epoch: int) -> Iterable[Any]:
        loader.set_epoch(epoch)
        return loader

    count, first, start = 0, None, time.perf_counter()
    for batch in _epochs(run, seconds):
        count += len(batch["key"])
        if first is None:
            first = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    loader.close()
    return {"num_workers": num_workers, "batch_size": batch_size, "pin_memory": pin_memory,
            "samples": count, "seconds": elapsed, "first_batch_s": first,
            "samples_per_s": count / elapsed if elapsed else 0.0}


def _features(image: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """B×256 float features of a batch (stacked, padded or a list of images): the dummy step's input."""
    rows = [im.flatten()[:256] for im in image]
    return torch.stack([torch.nn.functional.pad(r.float(), (0, 256 - r.shape[0])) for r in rows])


def _device(dataset: ShardDataset, *, device: torch.device, num_workers: int, batch_size: int,
            seconds: float, collate: str) -> dict[str, Any]:
    cuda = device.type == "cuda"
    loader = make_loader(dataset, batch_size, num_workers, pin_memory=cuda, collate=collate)
    weight = torch.randn(256, 256, device=device)
    wait = compute = 0.0
    steps = samples = 0
    start = time.perf_counter()
    epoch = 0
    while time.perf_counter() - start < seconds:
        loader.set_epoch(epoch)
        iterator = iter(DevicePrefetcher(loader, device))
        while True:
            t0 = time.perf_counter()
            batch = next(iterator, None)
            t1 = time.perf_counter()
            if batch is None:
                break
            wait += t1 - t0
            out = _features(batch["image"]) @ weight
            for _ in range(8):
                out = torch.tanh(out @ weight)
            if cuda:
                torch.cuda.synchronize(device)
            compute += time.perf_counter() - t1
            steps += 1
            samples += len(batch["key"])
            if time.perf_counter() - start >= seconds:
                break
        if steps == 0:
            break
        epoch += 1
    result: dict[str, Any] = {"device": str(device), "steps": steps, "samples": samples,
                              "data_wait_s": wait, "compute_s": compute,
                              "wait_fraction": wait / (wait + compute) if wait + compute else 0.0}
    if cuda:
        result.update(_h2d(loader, device))
    return result


def _h2d(loader: Any, device: torch.device, batches: int = 5) -> dict[str, Any]:
    """Host→device copy time of ``batches`` pinned batches, timed with CUDA events."""
    loader.set_epoch(0)
    times, nbytes = [], 0
    for i, batch in enumerate(loader):
        if i >= batches or not isinstance(batch["image"], torch.Tensor):
            break
        image = batch["image"] if batch["image"].is_pinned() else batch["image"].pin_memory()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        image.to(device, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
        nbytes = image.numel() * image.element_size()
    mean_ms = sum(times) / len(times) if times else None
    return {"h2d_ms_per_batch": mean_ms, "h2d_batch_bytes": nbytes,
            "h2d_gb_per_s": nbytes / 1e6 / mean_ms if mean_ms else None}


def _verify_modes(manifest: str | os.PathLike[str], split: str, modes: Sequence[str], *, rounds: int,
                  seconds: float, seed: int, sources: Sequence[str] | None, num_workers: int, batch_size: int,
                  collate: str) -> dict[str, Any]:
    """Decode (samples per wall second and per CPU second of this process) and loader samples/s
    for each ``verify`` mode, interleaved over ``rounds`` rounds; medians, every run, and each
    mode's cost (1 - its samples/s ÷ the first mode's)."""
    datasets = {mode: ShardDataset(manifest, split, seed=seed, rank=0, world_size=1, sources=sources, verify=mode)
                for mode in modes}
    runs: dict[str, dict[str, list[float]]] = {mode: {"decode": [], "decode_cpu": [], "loader": []} for mode in modes}
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else list(reversed(modes))):
            decoded = _decode(datasets[mode], seconds)
            runs[mode]["decode"].append(decoded["samples_per_s"])
            runs[mode]["decode_cpu"].append(decoded["samples_per_cpu_s"])
            runs[mode]["loader"].append(_loader(datasets[mode], num_workers=num_workers, batch_size=batch_size,
                                                pin_memory=False, seconds=seconds, collate=collate)["samples_per_s"])
    medians = {mode: {stage: statistics.median(values) for stage, values in stages.items()}
               for mode, stages in runs.items()}
    base = medians[modes[0]]
    return {"modes": list(modes), "rounds": rounds, "num_workers": num_workers, "batch_size": batch_size,
            "runs": runs, "median": medians,
            "cost": {mode: {stage: 1 - value / base[stage] if base[stage] else None for stage, value in m.items()}
                     for mode, m in medians.items()}}


def choose_collate(dataset: ShardDataset, collate: str | None) -> tuple[str, str | None]:
    """The collate to measure ``dataset`` with, and a note when it was chosen for a mixed split:
    ``collate`` when given, else ``stack`` for one shape and ``list`` for several."""
    if collate is not None:
        return collate, None
    if dataset.shape is not None:
        return "stack", None
    view = dataset.view.sources if dataset.view is not None else None
    which = f"sources {', '.join(view)} of " if view else ""
    scope = [shape for source, listed in dataset.info.shapes.items() if view is None or source in view
             for shape in listed]
    if len({(len(shape), shape[0]) for shape in scope}) == 1:  # one channel count: they differ in size only
        fix = ("build with one volume size (sample: {volume: {size: [D, H, W]}}) for one shape"
               if len(scope[0]) == 4 else "build with one size (transform.<kind>.size) for one shape")
    elif (view is not None and len(view) == 1) or len(dataset.info.shapes) == 1:
        fix = "build with transform.channels for one shape"
    else:
        fix = "measure one source with --sources NAME, or build with transform.channels for one shape"
    return "list", (f"the samples of {which}this split have several shapes ({dataset.info.describe_shapes(view)}), "
                    f"so batches were measured with collate=\"list\"; {fix}")


def bench_loader(manifest: str | os.PathLike[str], split: str, *, device: str = "cpu",
                 workers: Sequence[int] = (0, 1, 2), batch_sizes: Sequence[int] = (32,),
                 pin_memory: Sequence[bool] | None = None, seconds: float = 3.0, seed: int = 0,
                 sources: Sequence[str] | None = None, collate: str | None = None,
                 verify: Sequence[str] = ("sample",), rounds: int = 5) -> dict[str, Any]:
    """Measure input throughput of ``split`` (or of the view of ``sources``) one variable at a
    time (see module doc).

    ``pin_memory``: the values to try (default both with CUDA, off without).
    ``collate``: ``stack``, ``list`` or ``pad`` (see :func:`packer.loader.make_loader`); by
    default ``stack`` when the samples have one shape and ``list`` when they have several
    (said in ``config.collate_note``). Returns a JSON-able dict with keys ``dataset``,
    ``config`` (with ``fastest_workers``, the worker count the later runs use), ``raw_read``,
    ``decode``, ``loader`` (a list of runs, each with ``vary``, the three settings and
    ``samples_per_s``) and ``device``. ``verify``: the ``ShardDataset`` verify mode(s); the
    stages run with the first, and with several a ``verify`` key compares them (see the
    module doc; ``rounds`` interleaved rounds). Times are wall-clock seconds;
    nothing is asserted. Raises what ShardDataset raises for an unreadable manifest or shard.
    """
    if pin_memory is None:  # pinned memory matters only for copies to an accelerator
        pin_memory = (False, True) if torch.cuda.is_available() else (False,)
    if not workers or not batch_sizes or not pin_memory or not verify:
        raise ValueError("workers, batch_sizes, pin_memory and verify each need at least one value")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    torch_device = usable_device(device, f"--device {device}")
    dataset = ShardDataset(manifest, split, seed=seed, rank=0, world_size=1, sources=sources, verify=verify[0])
    if dataset.samples == 0:
        which = f"sources {', '.join(sources)} of " if sources else ""
        raise ConfigError(f"{manifest}: {which}split {split!r} has no samples; nothing to measure (choose another "
                          "split with --split)")
    collate, note = choose_collate(dataset, collate)
    info = dataset.info
    runs: dict[tuple[int, int, bool], dict[str, Any]] = {}   # by (num_workers, batch_size, pin_memory)
    loader_rows = []

    def measure(name: str, key: tuple[int, int, bool]) -> None:
        if key not in runs:
            runs[key] = _loader(dataset, num_workers=key[0], batch_size=key[1], pin_memory=key[2], seconds=seconds,
                                collate=collate)
        loader_rows.append({"vary": name, **runs[key]})

    for w in workers:
        measure("num_workers", (w, batch_sizes[0], bool(pin_memory[0])))
    fastest = max(loader_rows, key=lambda row: row["samples_per_s"])["num_workers"]  # first of equals
    base = (fastest, batch_sizes[0], bool(pin_memory[0]))
    for p in pin_memory if len(pin_memory) > 1 else ():
        measure("pin_memory", (base[0], base[1], bool(p)))
    for b in batch_sizes if len(batch_sizes) > 1 else ():
        measure("batch_size", (base[0], b, base[2]))
    compared = (_verify_modes(manifest, split, list(dict.fromkeys(verify)), rounds=rounds, seconds=seconds, seed=seed,
                              sources=sources, num_workers=base[0], batch_size=base[1], collate=collate)
                if len(set(verify)) > 1 else None)
    return {
        "dataset": {"manifest": str(info.manifest), "split": split, "format": info.format,
                    "samples": dataset.samples, "shards": len(info.shards),
                    "bytes": sum(s.bytes for s in info.shards),
                    "sources": list(sources) if sources is not None else None},
        "config": {"device": device, "workers": list(workers), "batch_sizes": list(batch_sizes),
                   "pin_memory": list(pin_memory), "seconds": seconds, "collate": collate,
                   "collate_note": note, "cuda_available": torch.cuda.is_available(), "fastest_workers": base[0],
                   "verify": dataset.verify},
        "raw_read": _raw_read([str(s.path) for s in info.shards], seconds),
        "decode": _decode(dataset, seconds),
        "loader": loader_rows,
        "device": _device(dataset, device=torch_device, num_workers=base[0], batch_size=base[1], seconds=seconds,
                          collate=collate),
        **({"verify": compared} if compared is not None else {}),
    }


def format_table(result: dict[str, Any]) -> str:
    """A plain-text report of a :func:`bench_loader` result."""
    ds, raw, dec = result["dataset"], result["raw_read"], result["decode"]
    view = f" (sources {', '.join(ds['sources'])})" if ds.get("sources") else ""
    config = result["config"]
    lines = [
        f"{ds['split']}{view} of {ds['manifest']}: {ds['samples']} samples, {ds['shards']} {ds['format']} shards, "
        f"{ds['bytes'] / 1e6:.1f} MB; collate {config.get('collate', 'stack')}",
        *([f"note: {config['collate_note']}"] if config.get("collate_note") else []),
        f"raw read      {raw['mb_per_s']:10.1f} MB/s",
        f"decode        {dec['samples_per_s']:10.1f} samples/s (one process)",
        "",
        f"{'vary':<12} {'workers':>7} {'batch':>6} {'pin':>5} {'samples/s':>11} {'first batch s':>14}",
    ]
    for row in result["loader"]:
        first = f"{row['first_batch_s']:.3f}" if row["first_batch_s"] is not None else "-"
        lines.append(f"{row['vary']:<12} {row['num_workers']:>7} {row['batch_size']:>6} "
                     f"{row['pin_memory']!s:>5} {row['samples_per_s']:>11.1f} {first:>14}")
    if config.get("fastest_workers") is not None and len(config["workers"]) > 1:
        rest = ("the pin_memory and batch_size rows and the device step use it"
                if len(result["loader"]) > len(config["workers"]) else "the device step uses it")
        lines.append(f"(num_workers {config['fastest_workers']} was the fastest: {rest})")
    dev = result["device"]
    lines += ["", f"device {dev['device']}: {dev['steps']} steps, waiting for data {dev['data_wait_s']:.3f} s, "
                  f"computing {dev['compute_s']:.3f} s ({dev['wait_fraction']:.0%} waiting)"]
    if dev.get("h2d_ms_per_batch") is not None:
        lines.append(f"host→device  {dev['h2d_ms_per_batch']:.3f} ms per batch of {dev['h2d_batch_bytes']} bytes "
                     f"({dev['h2d_gb_per_s']:.2f} GB/s)")
    compared = result.get("verify")
    if compared is not None:
        first = compared["modes"][0]
        lines += ["", f"verify modes, medians of {compared['rounds']} interleaved rounds (loader: "
                      f"{compared['num_workers']} workers, batch {compared['batch_size']}):",
                  f"{'verify':<8} {'decode/s':>10} {'cost':>7} {'decode/cpu-s':>13} {'cost':>7} {'loader/s':>10} "
                  f"{'cost':>7}"]
        for mode in compared["modes"]:
            med, cost = compared["median"][mode], compared["cost"][mode]
            cells = [f"{med[stage]:>{13 if stage == 'decode_cpu' else 10}.1f} "
                     f"{_percent(cost[stage]) if mode != first else '-':>7}"
                     for stage in ("decode", "decode_cpu", "loader")]
            lines.append(f"{mode:<8} {' '.join(cells)}")
        lines.append(f"(cost: fewer samples/s than verify={first})")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
