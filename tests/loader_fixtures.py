"""Tiny packed datasets for the loader tests, written with the real shard writers.

Sample ``i`` of a fixture has key ``s{i:05d}``, label ``i % classes`` and a C×H×W uint8
image whose first two pixels spell ``i`` (low byte, high byte), so a test can tell from the
pixels alone which sample it got; pixel 2 is ``100 * (i % 3)``.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packer.manifest import config_hash, seal_manifest
from packer.pipeline.publish import IndexColumns, write_index
from packer.shards.encode import EncodedSample
from packer.shards.parquet import write_parquet_shard
from packer.shards.tar import write_tar_shard

SHAPE = (1, 4, 4)


def sample_image(index: int, shape: Sequence[int] = SHAPE) -> np.ndarray:
    """The image of sample ``index``: pixels 0,1 = index low/high byte, pixel 2 = 100 × label, then a ramp."""
    image = ((np.arange(int(np.prod(shape))) * 7 + index) % 256).astype(np.uint8)
    image[0], image[1] = index % 256, index // 256
    image[2] = (index % 3) * 100        # the label (3 classes) is visible: a tiny model can learn it
    return image.reshape(shape)


def flip_pixel_byte(path: Path, index: int) -> None:
    """Flip one byte of sample ``index``'s pixels inside a shard file (a checksum mismatch)."""
    data = bytearray(path.read_bytes())
    at = data.find(sample_image(index).tobytes())
    assert at >= 0
    data[at + 5] ^= 0xFF
    path.write_bytes(bytes(data))


def make_sample(index: int, *, split: str = "train", classes: int = 3,
                shape: Sequence[int] = SHAPE, dtype: str = "uint8") -> EncodedSample:
    """One EncodedSample as packer's encoder would make it. A float ``dtype`` stores the image
    as z-score-like values, ``pixel / 10 - 5`` (not in 0..1, as an MR job's z-scores)."""
    image = sample_image(index, shape)
    if dtype != "uint8":
        image = (image.astype(np.float32) / 10 - 5).astype(dtype)
    label = index % classes
    key = f"s{index:05d}"
    info = {"key": key, "sample_id": key, "source": "synthetic", "kind": "image", "label": f"c{label}",
            "label_index": label, "entity_id": f"e{index}", "split": split, "shape": list(image.shape),
            "dtype": dtype, "metadata": {}}
    return EncodedSample(key=key, split=split, label=label, label_name=f"c{label}", entity_id=f"e{index}",
                         source="synthetic", shape=tuple(image.shape), dtype=dtype, pixels=image.tobytes(),
                         info=info)


def build_dataset(root: Path, *, fmt: str = "webdataset", shard_sizes: Sequence[int] = (5, 3, 4),
                  split: str = "train", classes: int = 3, shape: Sequence[int] | None = SHAPE,
                  shapes: Sequence[Sequence[int]] | None = None, dtype: str = "uint8") -> Path:
    """Write shards of ``shard_sizes`` samples and a manifest.json into ``root``; return the manifest path.

    ``shapes``: per-sample shapes (cycled) for a variable-size dataset (``shape`` then null).
    """
    root.mkdir(parents=True, exist_ok=True)
    writer, ext = (write_tar_shard, "tar") if fmt == "webdataset" else (write_parquet_shard, "parquet")
    shards, counts, index = [], {f"c{c}": 0 for c in range(classes)}, 0
    columns = IndexColumns()
    for k, size in enumerate(shard_sizes):
        samples = []
        for _ in range(size):
            sample_shape = shapes[index % len(shapes)] if shapes else (shape or SHAPE)
            samples.append(make_sample(index, split=split, classes=classes, shape=sample_shape, dtype=dtype))
            counts[f"c{index % classes}"] += 1
            index += 1
        written = writer(root / f"{split}-{k:06d}.{ext}", samples)
        shards.append({"file": written.file, "bytes": written.bytes, "sha256": written.sha256, "samples": size})
        columns.add_shard(written, split=split, keys=[s.key for s in samples], labels=[s.label for s in samples],
                          entity_ids=[s.entity_id for s in samples], sources=[s.source for s in samples])
    entry = write_index(root, columns)  # _index.parquet as a build writes it (with each sample's checksum)
    return write_manifest(root, fmt=fmt, shards=shards, split=split, classes=classes, class_counts=counts,
                          shape=None if shapes else shape, index=entry, dtype=dtype)


def write_manifest(root: Path, *, fmt: str, shards: list[dict], split: str = "train", classes: int = 3,
                   class_counts: dict[str, int] | None = None, shape: Sequence[int] | None = SHAPE,
                   dtype: str = "uint8", index: dict | None = None) -> Path:
    """Write ``root/manifest.json`` for ``shards`` (entries with file, bytes, sha256, samples): a
    whole manifest, valid against schemas/manifest.schema.json and sealed as a build seals it.

    ``shape=None`` writes a null sample shape (samples of varying size); ``dtype`` the sample
    dtype. ``index``: the ``_index.parquet`` entry (:func:`build_dataset` writes a real one); without
    it the ``index`` entry names a file no fixture writes, so such a dataset is read with
    ``verify="off"`` (the default, ``"sample"``, needs each sample's checksum from the index). The
    ``splits_table`` entry names a file no fixture writes.
    """
    total = sum(s["samples"] for s in shards)
    body = {
        "format_version": 1, "name": "fixture", "packer_version": "fixture", "config": {},
        "config_hash": config_hash({}), "libraries": {}, "decoders": {}, "format": fmt,
        "label_map": {f"c{c}": c for c in range(classes)},
        "sample_schema": {"dtype": dtype, "layout": "CHW", "shape": None if shape is None else list(shape),
                          "shapes": {}},
        "splits": {split: {"samples": total, "entities": total, "class_counts": class_counts or {}, "shards": shards}},
        "inputs": {"files": total, "samples": total},
        "bad_samples": {"total": 0, "fraction": 0.0, "max_fraction": 0.0, "by_reason": {}, "by_stage": {},
                        "report": "bad_samples.jsonl"},
        "audit": {"passed": True, "rules": {}, "entities_per_split": {}, "time_ranges": {}},
        "index": index or {"file": "_index.parquet", "bytes": 0, "sha256": "0" * 64, "rows": total},
        "splits_table": {"file": "_splits.parquet", "bytes": 0, "sha256": "0" * 64, "rows": total},
        "phi": {"mode": "keep", "dates": "keep", "key_fingerprint": None},
    }
    path = root / "manifest.json"
    path.write_text(json.dumps(seal_manifest(body), indent=2, sort_keys=True))
    return path


def write_raw_tar(root: Path, name: str, members: list[tuple[str, bytes]], samples: int) -> dict:
    """A hand-made tar shard (for hostile or broken content); returns its manifest entry."""
    import hashlib
    import io
    import tarfile

    path = root / name
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = path.read_bytes()
    return {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "samples": samples}


def split_keys(total: int) -> list[str]:
    """Every key of a fixture split of ``total`` samples."""
    return [f"s{i:05d}" for i in range(total)]


def ddp_worker(rank: int, world_size: int, port: int, manifest: str, out: str, steps: int) -> None:
    """One rank of the 2-process gloo DDP test: train ``steps`` and write what it saw."""
    import torch
    import torch.distributed as dist

    from packer.loader import DevicePrefetcher, ShardDataset, make_loader

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        dataset = ShardDataset(manifest, "train", seed=3, uneven="pad", shuffle_buffer=8)
        loader = make_loader(dataset, batch_size=4, num_workers=0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 3))
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        keys, losses, done = [], [], 0
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in DevicePrefetcher(loader, "cpu"):
                loss = torch.nn.functional.cross_entropy(model(batch["image"].flatten(1)), batch["label"])
                optim.zero_grad()
                loss.backward()
                optim.step()
                keys += batch["key"] if epoch == 0 else []
                losses.append(float(loss))
                done += 1
                if done >= steps:
                    break
        weights = [p.detach().sum().item() for p in model.parameters()]
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"rank": dataset.rank, "world": dataset.world_size, "keys": keys, "losses": losses, "steps": done,
             "weights": weights}))
        # both ranks reach teardown together: gloo aborts a rank whose peer has already torn
        # its connections down (seen as SIGABRT in CI on a busy 2-core machine)
        dist.barrier()
        # DDP's reducer holds the process group: left alive, the group (and gloo's C++ threads) is
        # destroyed at interpreter exit, after destroy_process_group, which aborted ranks in CI
        # with "terminate called without an active exception"
        del model, optim
        gc.collect()
    finally:
        dist.destroy_process_group()
