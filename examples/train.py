"""Train a small CNN from packed shards, for whatever target the dataset has: one process, or DDP under torchrun.

    make demo                                          # builds build/demo/<version>/
    python examples/train.py --manifest build/demo/<version> --epochs 1
    python examples/train.py --manifest build/demo/<version> --epochs 2 --checkpoint ckpt.pt
    python examples/train.py --manifest build/demo/<version> --checkpoint ckpt.pt --resume
    python examples/train.py --manifest build/demo/<version> --sources photos   # one source's samples only
    python examples/train.py --mix build/demo/<version>=0.7 --mix build/targets-imagefolder/<version>=0.3
    torchrun --nproc-per-node 2 examples/train.py --manifest build/demo/<version> --checkpoint ckpt.pt

The model takes one channel count, so the samples it reads must have one shape. The demo job
builds them so (``transform.channels: 3``: its 1-channel radiograph is replicated to match the
3-window CT slices and the RGB photos). For a dataset whose sources differ in shape (the
manifest lists them under ``sample_schema.shapes``), ``--sources`` trains on a view of some
sources (``ShardDataset(..., sources=[...])``, which skips the others without reading them);
without it, this script stops and names the shapes.

``--mix PATH=WEIGHT`` (twice or more, instead of ``--manifest``) trains on a weighted mix of
datasets (:class:`packer.loader.MixedDataset`): each epoch gives every dataset its weight's
share of the samples, ends when the first runs out (``--mix-length longest`` oversamples the
others instead, ``--mix-length N`` makes N samples), and class labels are matched by name
across the datasets. The checkpoint records the mix, and ``--resume`` with another mix stops.

What it trains follows the manifest (``target.kind``, ``mask``); no flag chooses it:
- class: a class per image, cross-entropy on ``batch["label"]``.
- multilabel: one logit per label, binary cross-entropy on the multi-hot ``batch["target"]``;
  with ``batch["target_mask"]`` (a source's ``uncertain: ignore`` or ``blank: ignore``) the
  entries it zeroes are left out of the mean: ``(bce * mask).sum() / mask.sum().clamp(min=1)``.
- numeric: one output per number, MSE on ``batch["target"]`` standardised by the train split's
  ``target_stats``: ``(value - mean) / (max - min)`` per name (min/mean/max is what the
  manifest records; the range stands in for a standard deviation it does not record). A train
  split with no samples records no stats: the script stops with a message.
- none (unlabeled): self-supervised denoising: from the image plus Gaussian noise, predict the
  clean image average-pooled to 8×8 (MSE).
- masks (any target kind): segmentation: a tiny fully-convolutional net, per-pixel
  cross-entropy on ``batch["mask"][:, 0]`` over ``max(classes) + 1`` classes (256 when the
  manifest's ``mask.classes`` is null); a non-zero ``mask.pad`` (what ``resize: fit`` padded
  with) is the loss's ignore index, not a class. One mask frame only: F > 1 stops with a message.
Each epoch's line says which (``class: 3 classes``, ``numeric: age, dose``, ...); an epoch that
``--max-steps`` ended part way prints its line too, ending ``; stopped at --max-steps N``.

What to copy into a real training script:
- ``init_process_group`` under torchrun or when ``WORLD_SIZE > 1`` (NCCL on CUDA, gloo on CPU); ShardDataset
  reads rank and world size from torch.distributed, and ``uneven="pad"`` gives every rank
  the same number of batches, so no rank waits forever in an all-reduce.
- ``set_epoch`` before every epoch (new shard and sample order).
- Integer samples (uint8) are scaled to 0..1 and centred (mean 0.5, std 0.25) on the device;
  float samples (z-scores of an MR job with ``output: float16``) are fed as stored.
- The checkpoint holds the loader position (``DevicePrefetcher.state_dict()``), taken from
  the prefetcher so the batch it has prefetched is not counted as consumed; ``--resume``
  continues mid-epoch with exactly the batches that were left.

Exit codes are ``packer``'s (README, Commands and exit codes): 2 for a wrong option or a dataset
this script does not train (a missing manifest, a split with no samples, volumes given to train.py,
samples of several shapes, masks of several frames, a checkpoint of another dataset or mix), 5 for damaged data;
the message goes to stderr, prefixed with the script's name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from packer.errors import COMMAND_LINE, ConfigError, PackerError, called_from
from packer.loader import DevicePrefetcher, MixedDataset, ShardDataset, make_loader
from packer.loader.device import usable_device
from packer.manifest import read_manifest


def parse_args(argv: list[str] | None, *, description: str = __doc__, batch_size: int = 32,
               lr: float = 0.05) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--manifest", help="manifest.json or the dataset version folder")
    data.add_argument("--mix", action="append", type=mix_member, metavar="PATH=WEIGHT",
                      help="a dataset of a weighted mix (repeat for each dataset; weights need not add up to 1)")
    parser.add_argument("--mix-length", type=mix_length, default="shortest",
                        help="a mix's epoch: shortest (ends when the first dataset runs out; default), longest "
                             "(when the last does; the others are repeated) or a number of samples")
    parser.add_argument("--split", default="train", help="the split to train on (default: %(default)s)")
    parser.add_argument("--sources", type=lambda text: [s for s in text.split(",") if s],
                        help="train on these sources only (comma-separated names, as in the job file)")
    parser.add_argument("--epochs", type=positive, default=2,
                        help="passes over the split (N >= 1; default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help="samples a step, on each rank under torchrun (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader worker processes reading the shards (0: read in this process; "
                             "default: %(default)s)")
    parser.add_argument("--lr", type=float, default=lr, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model's weights and of the shuffle order (default: %(default)s)")
    parser.add_argument("--device", type=device_arg, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device this machine has: cpu, cuda, cuda:1, mps, xpu (default here: %(default)s)")
    parser.add_argument("--checkpoint", type=Path, help="where to save (and, with --resume, load) the checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    parser.add_argument("--save-every", type=positive, default=100, help="checkpoint every N steps (N >= 1)")
    parser.add_argument("--max-steps", type=non_negative, default=0,
                        help="stop after N steps in total (N >= 0; 0: no limit)")
    return parser.parse_args(argv)


def positive(text: str) -> int:
    """An integer of at least 1 (``--save-every``: a step count to divide by; ``--epochs``: 0 or
    fewer trained nothing and exited 0, as if it had trained)."""
    return _at_least(text, 1)


def non_negative(text: str) -> int:
    """An integer of at least 0 (``--max-steps``, where 0 is no limit: a negative count stopped
    the run after its first step, as if it were a limit of 1)."""
    return _at_least(text, 0)


def _at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}, got {value}")
    return value


def device_arg(text: str) -> str:
    """``--device``: a torch device this machine has (cpu, cuda, cuda:1, mps, xpu, ...)."""
    try:
        usable_device(text, repr(text))
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def mix_member(text: str) -> tuple[str, float]:
    """``PATH=WEIGHT`` of ``--mix``."""
    path, sep, weight = text.rpartition("=")
    try:
        if not sep or not path:
            raise ValueError(text)
        return path, float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mix takes PATH=WEIGHT (e.g. build/demo/<version>=0.7), got {text!r}") from None


def mix_length(text: str) -> str | int:
    """``--mix-length``: shortest, longest or a number of samples."""
    return text if text in ("shortest", "longest") else int(text)


def open_dataset(args: argparse.Namespace, uneven: str) -> ShardDataset | MixedDataset:
    """The --manifest dataset (a view of --sources), or the --mix of datasets."""
    if not args.mix:
        return ShardDataset(args.manifest, args.split, seed=args.seed, uneven=uneven, sources=args.sources)
    if args.sources:
        raise ConfigError("--sources names sources of one dataset; it does not apply to --mix")
    members = [(ShardDataset(path, args.split, seed=args.seed), weight) for path, weight in args.mix]
    mix = MixedDataset(members, epoch_length=args.mix_length, seed=args.seed, uneven=uneven)
    if mix.rank == 0:
        shares = ", ".join(f"{name} {count}" for name, count in mix.counts().items())
        print(f"mix: {shares} samples an epoch", flush=True)
    return mix


def build_model(channels: int, classes: int, dims: int = 2) -> nn.Module:
    """A tiny CNN for any image (``dims`` 2) or volume (3) size: conv → ReLU → conv → global
    average pool → linear. A volume's first conv strides too: volumes are big."""
    conv, pool = (nn.Conv2d, nn.AdaptiveAvgPool2d) if dims == 2 else (nn.Conv3d, nn.AdaptiveAvgPool3d)
    return nn.Sequential(
        conv(channels, 16, 3, padding=1, stride=1 if dims == 2 else 2), nn.ReLU(),
        conv(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        pool(1), nn.Flatten(), nn.Linear(32, classes),
    )


def build_segmenter(channels: int, classes: int) -> nn.Module:
    """A tiny fully-convolutional net: per-pixel class logits on the image's own H×W grid."""
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, classes, 1),
    )


@dataclass
class Objective:
    """What train() optimises: ``model``, and ``loss(model, batch)`` (model as called, DDP or not)."""

    summary: str  # printed each epoch: "class: 3 classes", "unlabeled: denoising reconstruction", ...
    model: nn.Module
    loss: Callable[[nn.Module, dict[str, Any]], torch.Tensor]


def masked_bce(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Binary cross-entropy of one logit per label against the multi-hot ``batch["target"]``;
    where the batch has a ``target_mask`` (an ignore policy: uncertain or blank cells), the mean
    over the entries it keeps (1), so an ignored label neither rewards nor punishes the model."""
    logits = model(batch["image"])
    if "target_mask" not in batch:
        return F.binary_cross_entropy_with_logits(logits, batch["target"])
    bce = F.binary_cross_entropy_with_logits(logits, batch["target"], reduction="none")
    mask = batch["target_mask"]
    return (bce * mask).sum() / mask.sum().clamp(min=1)


def pick_objective(dataset: ShardDataset | MixedDataset, channels: int, device: torch.device) -> Objective:
    """Head and loss for the dataset's masks, else for its target kind (see the module docstring);
    a 3-D network for volumes (``layout: CDHW``)."""
    target, mask = dataset.info.target, dataset.info.mask
    dims = 3 if dataset.info.layout == "CDHW" else 2
    if mask is not None and dims == 3:
        raise ConfigError("this dataset has segmentation masks; masks come with 2-D samples only")
    if mask is not None:
        pad = int(mask.get("pad", 0))  # what resize "fit" filled in: not a class when the job padded with another id
        ids = sorted(set(mask["classes"] or range(256)) - ({pad} if pad else set()))
        classes = max(ids) + 1

        def segmentation(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
            if batch["mask"].shape[1] != 1:
                raise ConfigError(f"the masks have {batch['mask'].shape[1]} frames; this example segments one "
                                  "mask frame per image")
            return F.cross_entropy(model(batch["image"]), batch["mask"][:, 0].long(),
                                   ignore_index=pad if pad else -100)

        return Objective(f"segmentation: {classes} classes", build_segmenter(channels, classes), segmentation)
    if target.kind == "class":
        classes = max(dataset.info.label_map.values()) + 1
        return Objective(f"class: {classes} classes", build_model(channels, classes, dims),
                         lambda model, batch: F.cross_entropy(model(batch["image"]), batch["label"]))
    outputs = len(target.names)
    if target.kind == "multilabel":
        return Objective(f"multilabel: {outputs} labels{' (masked)' if target.masked else ''}",
                         build_model(channels, outputs, dims), masked_bce)
    if target.kind == "numeric":
        # standardised by the train split's stats: the manifest records min/mean/max per name
        stats = train_stats(dataset.info.manifest, target.names)
        mean = torch.tensor([stats[n]["mean"] for n in target.names], device=device)
        scale = torch.tensor([(stats[n]["max"] - stats[n]["min"]) or 1.0 for n in target.names], device=device)
        return Objective(f"numeric: {', '.join(target.names)}", build_model(channels, outputs, dims),
                         lambda model, batch: F.mse_loss(model(batch["image"]), (batch["target"] - mean) / scale))

    # unlabeled: self-supervised denoising; from the image plus noise, reconstruct the clean one
    # pooled to 8×8 (a volume: to 4×4×4)
    side = 8 if dims == 2 else 4
    pool = F.adaptive_avg_pool2d if dims == 2 else F.adaptive_avg_pool3d

    def denoising(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        image = batch["image"]
        return F.mse_loss(model(image + 0.5 * torch.randn_like(image)), pool(image, side))

    model = nn.Sequential(build_model(channels, channels * side ** dims, dims),
                          nn.Unflatten(1, (channels,) + (side,) * dims))
    return Objective("unlabeled: denoising reconstruction", model, denoising)


def train_stats(manifest: str | os.PathLike[str], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """The train split's ``target_stats`` (min, mean, max) of every name, which the numeric loss
    standardises by, whichever split is trained on; ConfigError where the train split has none
    for a name (an empty train split records ``{}``, a manifest may hold no train split)."""
    entry = read_manifest(manifest, check_hash=False).splits.get("train")
    stats = (entry or {}).get("target_stats") or {}
    missing = [name for name in names if not {"min", "mean", "max"} <= set(stats.get(name) or {})]
    if missing:
        why = ("the manifest has no train split" if entry is None else
               "the train split has no samples" if entry.get("samples") == 0 else "the train split records none")
        raise ConfigError(f"{manifest}: the numeric targets are standardised by the train split's target_stats, "
                          f"and {why} (no stats for {', '.join(missing)}); rebuild with samples in the train split "
                          "(split.ratios, split.seed, or more entities)")
    return stats


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a crash mid-save leaves the previous checkpoint intact."""
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train; return what happened (steps, losses, keys seen) for tests and logs."""
    return run(parse_args(argv))


def run(args: argparse.Namespace, layouts: tuple[str, ...] = ("CHW",), name: str = "train.py",
        pick: Callable[[ShardDataset | MixedDataset, int, torch.device], Objective] | None = None) -> dict[str, Any]:
    """Train as ``args`` say, on a dataset whose layout is one of ``layouts`` (``name`` says who
    refuses another); ``pick``: chooses the head and loss (default :func:`pick_objective`)."""
    args.layouts, args.script, args.pick = layouts, name, pick or pick_objective
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # torchrun means DDP, even with one process (one GPU): the same code path as on many
    distributed = world > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    device = torch.device(args.device)
    if distributed:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return train(args, device, distributed)
    except PackerError as err:  # a wrong source, split, path or dataset, or damaged data: its message, not a
        print(f"{args.script}: {err}", file=sys.stderr)  # traceback, and packer's exit code (2 for a usage error)
        raise SystemExit(err.exit_code) from None
    finally:
        if distributed:
            dist.destroy_process_group()


def train(args: argparse.Namespace, device: torch.device, distributed: bool) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    # the loader's refusals name this script's flags (--sources ct), not Python's; but --mix reads each member
    # whole and refuses --sources beside it, so a member's refusal says what to build instead
    try:
        with called_from(COMMAND_LINE) if not args.mix else contextlib.nullcontext():
            dataset = open_dataset(args, "pad" if distributed else "exact")
    except ConfigError as err:
        if not args.mix or "--mix" in str(err):
            raise
        raise ConfigError(f"{err} (under --mix each member is read whole, with no choice of its sources: build a job "
                          "of that member's sources of one dtype and shape, and mix its version)") from err
    what = args.manifest or " + ".join(path for path, _ in args.mix)
    if dataset.samples == 0:  # a mix refuses an empty member itself; one dataset trained nothing and exited 0
        splits = read_manifest(dataset.info.manifest, check_hash=False).splits
        others = ", ".join(f"{name} {entry['samples']}" for name, entry in splits.items() if name != args.split)
        which, of = (f"sources {','.join(args.sources)} of ", " (every source)") if args.sources else ("", "")
        raise ConfigError(f"{what}: {which}split {args.split!r} has no samples (other splits{of}: "
                          f"{others or 'none'}); nothing to train: choose another split with --split")
    rank = dataset.rank
    if dataset.info.layout not in args.layouts:
        other = "examples/train3d.py" if dataset.info.layout == "CDHW" else "examples/train.py"
        kind = "volumes" if dataset.info.layout == "CDHW" else "2-D samples"
        raise ConfigError(f"{what} holds {kind} (layout {dataset.info.layout}: {dataset.info.describe_shapes()}); "
                          f"train them with {other}")
    if dataset.shape is None:
        one_source = args.sources is not None and len(args.sources) == 1
        shown = [shape for source, shapes in dataset.info.shapes.items()
                 if args.sources is None or source in args.sources for shape in shapes]
        if len({shape[0] for shape in shown}) == 1 and dataset.info.layout == "CDHW":
            # a volume's size is 3-D and set on its sample: load_job refuses transform.<kind>.size for volumes
            fix = "build the dataset with one volume size (sample: {volume: {size: [D, H, W]}})"
        elif len({shape[0] for shape in shown}) == 1:  # one channel count: the sizes differ, no channel rule helps
            fix = ("build the dataset with one size (transform.<kind>.size, e.g. transform.image.size: [224, 224]; "
                   "transform.dicom.size for DICOM)")
        elif one_source or args.mix:
            fix = "build the dataset with transform.channels"
        else:
            fix = "pass --sources NAME to train on one source, or build the dataset with transform.channels"
        of = (f"source{'s' if len(args.sources) > 1 else ''} {','.join(args.sources)} "
              f"hold{'' if len(args.sources) > 1 else 's'}" if args.sources else "sources hold")
        raise ConfigError(
            f"this dataset's {of} samples of several shapes "
            f"({dataset.info.describe_shapes(args.sources)}; the manifest lists shapes per source, over every "
            f"split, so the {args.split} split may hold fewer), and this model takes one shape; {fix} "
            "(README, 'Mixed shapes')")
    channels = dataset.shape[0]
    loader = make_loader(dataset, args.batch_size, args.workers)
    # integer samples (uint8 windows) become 0..1 and are centred; float ones (an MR job's
    # z-scores, output: float16) are already in the units a model wants and pass as stored
    integer = not torch.empty(0, dtype=getattr(torch, dataset.info.dtype)).is_floating_point()
    batches = DevicePrefetcher(loader, device, **({"mean": (0.5,), "std": (0.25,)} if integer else {}))
    objective = args.pick(dataset, channels, device)
    model: nn.Module = objective.model.to(device)
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step, start_epoch = 0, 0
    if args.resume and args.checkpoint and args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        try:  # the loader's state first: it names another dataset, split, view or mix than the checkpoint's
            batches.load_state_dict(ckpt["loader"])
        except ConfigError as err:
            raise ConfigError(f"cannot resume from {args.checkpoint}: {err}") from None
        try:
            model.load_state_dict(ckpt["model"])
            optim.load_state_dict(ckpt["optim"])
        except (RuntimeError, ValueError) as err:  # another model: its layers' shapes differ from this one's
            first = str(err).strip().splitlines()[0]
            raise ConfigError(f"cannot resume from {args.checkpoint}: its model does not fit this run's ({first}); "
                              "resume with the run's own --checkpoint, or start without --resume") from None
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

    stopped = False  # by --max-steps, maybe part way through an epoch
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
                stopped = True
                break
        if rank == 0 and losses:  # the epoch's line also when --max-steps cut it short, saying so
            print(f"epoch {epoch}: step {step}, last loss {losses[-1]:.4f} ({objective.summary})"
                  + (f"; stopped at --max-steps {args.max_steps}" if stopped else ""), flush=True)
        checkpoint()
        if stopped:
            break
    if rank == 0 and not losses and args.resume:  # said, not silent: the run did nothing on purpose
        print(f"nothing to train: {args.checkpoint} already holds every epoch of --epochs {args.epochs} (step "
              f"{step}); raise --epochs to train on from it", flush=True)
    return {"steps": step, "losses": losses, "keys": keys, "rank": rank, "objective": objective.summary}


if __name__ == "__main__":
    main()
