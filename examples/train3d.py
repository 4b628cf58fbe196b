"""Train a small 3-D CNN from packed volumes (``layout: CDHW``): one process, or DDP under torchrun.

    # a job whose transform.dicom has sample: {volume: {spacing: [z, y, x], size: [D, H, W]}}
    packer build volumes.yaml                          # one C×D×H×W sample per DICOM series
    python examples/train3d.py --manifest build/volumes/<version> --epochs 1
    python examples/train3d.py --manifest build/volumes/<version> --epochs 2 --checkpoint ckpt.pt
    python examples/train3d.py --manifest build/volumes/<version> --checkpoint ckpt.pt --resume
    torchrun --nproc-per-node 2 examples/train3d.py --manifest build/volumes/<version> --checkpoint ckpt.pt

The 3-D twin of examples/train.py (keep train.py next to it: ``Objective`` and
``save_checkpoint`` come from there). Batches are ``image`` uint8 B×C×D×H×W, C the windows;
2-D datasets (``layout: CHW``) are refused here: train those with examples/train.py.

What it trains follows the manifest's ``target.kind``; no flag chooses it:
- class: a class per volume, cross-entropy on ``batch["label"]``.
- multilabel: one logit per label, binary cross-entropy on the multi-hot ``batch["target"]``.
- numeric: one output per number, MSE on ``batch["target"]`` standardised by the train split's
  ``target_stats``, as train.py does.
- none (unlabeled): self-supervised denoising: from the volume plus Gaussian noise, predict the
  clean volume average-pooled to 4×4×4 (MSE).
Segmentation masks are not handled here (a dataset with ``mask`` stops with a message).

Distributed training, ``set_epoch`` and the checkpoint (which holds the loader position, so
``--resume`` continues mid-epoch) work as in train.py; see its docstring.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from train import Objective, save_checkpoint  # examples/train.py, next to this file

from packer.loader import DevicePrefetcher, ShardDataset, make_loader
from packer.manifest import read_manifest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", required=True, help="manifest.json or the dataset version folder")
    parser.add_argument("--split", default="train")
    parser.add_argument("--sources", type=lambda text: [s for s in text.split(",") if s],
                        help="train on these sources only (comma-separated names, as in the job file)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="volumes per batch (they are big)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint", type=Path, help="where to save (and, with --resume, load) the checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps in total (0: no limit)")
    return parser.parse_args(argv)


def build_model(channels: int, outputs: int) -> nn.Module:
    """A tiny 3-D CNN for any volume size: two strided convs (volumes are big) → global average pool → linear."""
    return nn.Sequential(
        nn.Conv3d(channels, 16, 3, padding=1, stride=2), nn.ReLU(),
        nn.Conv3d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(32, outputs),
    )


def pick_objective(dataset: ShardDataset, channels: int, device: torch.device) -> Objective:
    """Head and loss for the dataset's target kind (see the module docstring)."""
    target = dataset.info.target
    if dataset.info.mask is not None:
        raise SystemExit("train3d.py: this dataset has segmentation masks; this example trains a volume-level "
                         "target (class, multilabel, numeric) or, unlabeled, denoising")
    if target.kind == "class":
        classes = max(dataset.info.label_map.values()) + 1
        return Objective(f"class: {classes} classes", build_model(channels, classes),
                         lambda model, batch: F.cross_entropy(model(batch["image"]), batch["label"]))
    outputs = len(target.names)
    if target.kind == "multilabel":
        return Objective(f"multilabel: {outputs} labels", build_model(channels, outputs),
                         lambda model, batch: F.binary_cross_entropy_with_logits(model(batch["image"]),
                                                                                 batch["target"]))
    if target.kind == "numeric":
        stats = read_manifest(dataset.info.manifest, check_hash=False).splits["train"]["target_stats"]
        mean = torch.tensor([stats[n]["mean"] for n in target.names], device=device)
        scale = torch.tensor([(stats[n]["max"] - stats[n]["min"]) or 1.0 for n in target.names], device=device)
        return Objective(f"numeric: {', '.join(target.names)}", build_model(channels, outputs),
                         lambda model, batch: F.mse_loss(model(batch["image"]), (batch["target"] - mean) / scale))

    # unlabeled: self-supervised denoising; from the volume plus noise, reconstruct the clean one pooled to 4×4×4
    def denoising(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        volume = batch["image"]
        return F.mse_loss(model(volume + 0.5 * torch.randn_like(volume)), F.adaptive_avg_pool3d(volume, 4))

    model = nn.Sequential(build_model(channels, channels * 64), nn.Unflatten(1, (channels, 4, 4, 4)))
    return Objective("unlabeled: denoising reconstruction", model, denoising)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; return what happened (steps, losses, keys seen) for tests and logs."""
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    device = torch.device(args.device)
    if distributed:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return train(args, device, distributed)
    finally:
        if distributed:
            dist.destroy_process_group()


def train(args: argparse.Namespace, device: torch.device, distributed: bool) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    dataset = ShardDataset(args.manifest, args.split, seed=args.seed, uneven="pad" if distributed else "exact",
                           sources=args.sources)
    rank = dataset.rank
    if dataset.info.layout != "CDHW":
        raise SystemExit(
            f"train3d.py: {args.manifest} holds 2-D samples (layout {dataset.info.layout}: "
            f"{dataset.info.describe_shapes()}); this example trains on volumes (C×D×H×W, built with "
            "transform.dicom.sample: {volume: ...}). Train a 2-D dataset with examples/train.py")
    if dataset.shape is None:
        raise SystemExit(
            f"train3d.py: the {args.split} volumes{' of ' + ','.join(args.sources) if args.sources else ''} have "
            f"several shapes ({dataset.info.describe_shapes()}), and this model takes one channel count; "
            "pass --sources NAME to train on one source")
    channels = dataset.shape[0]
    loader = make_loader(dataset, args.batch_size, args.workers)
    # one mean/std for all channels: the prefetcher broadcasts per-channel values over C×H×W, not C×D×H×W
    batches = DevicePrefetcher(loader, device, mean=(0.5,), std=(0.25,))
    objective = pick_objective(dataset, channels, device)
    model: nn.Module = objective.model.to(device)
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step, start_epoch = 0, 0
    if args.resume and args.checkpoint and args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        batches.load_state_dict(ckpt["loader"])
        step, start_epoch = ckpt["step"], ckpt["loader"]["epoch"]
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    losses: list[float] = []
    keys: list[str] = []

    def checkpoint() -> None:
        if args.checkpoint and rank == 0:
            module: nn.Module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
            save_checkpoint(args.checkpoint, {"model": module.state_dict(), "optim": optim.state_dict(),
                                              "loader": batches.state_dict(), "step": step})

    def done() -> dict[str, Any]:
        return {"steps": step, "losses": losses, "keys": keys, "rank": rank, "objective": objective.summary}

    for epoch in range(start_epoch, args.epochs):
        batches.set_epoch(epoch)
        model.train()
        for batch in batches:
            loss = objective.loss(model, batch)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            step += 1
            losses.append(loss.item())
            keys.extend(batch["key"])
            if step % args.save_every == 0:
                checkpoint()
            if args.max_steps and step >= args.max_steps:
                checkpoint()
                return done()
        if rank == 0 and losses:
            print(f"epoch {epoch}: step {step}, last loss {losses[-1]:.4f} ({objective.summary})", flush=True)
        checkpoint()
    return done()


if __name__ == "__main__":
    main()
