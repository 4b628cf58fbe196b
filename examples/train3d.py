"""Train a small 3-D CNN from packed volumes (``layout: CDHW``): one process, or DDP under torchrun.

    make demo                                          # also writes demo-raw/nifti/
    packer build workflows/nifti-volume.yaml           # one C×D×H×W CT volume per case, with its label map
    python examples/train3d.py --manifest build/nifti-volume/<version> --epochs 2
    packer build workflows/series-volume.yaml          # one volume per DICOM series, unlabeled
    python examples/train3d.py --manifest build/series-volume/<version> --epochs 1
    python examples/train3d.py --manifest build/nifti-volume/<version> --epochs 2 --checkpoint ckpt.pt
    python examples/train3d.py --manifest build/nifti-volume/<version> --checkpoint ckpt.pt --resume
    torchrun --nproc-per-node 2 examples/train3d.py --manifest build/nifti-volume/<version> --checkpoint ckpt.pt

The 3-D entry of examples/train.py (keep train.py next to it: the loop, the checkpoint and
the objectives are its own, with 3-D convolutions for volumes). Batches are ``image`` uint8
B×C×D×H×W (C the windows; float16 for z-scored volumes), and with masks ``mask`` B×D×H×W
class ids on the same voxels; 2-D datasets (``layout: CHW``) are refused here: train those
with examples/train.py.

What it trains follows the manifest (``mask``, ``target.kind``); no flag chooses it:
- masks (any target kind; ``workflows/nifti-volume.yaml``): 3-D segmentation, a small U-Net
  (:class:`UNet3d`) giving per-voxel logits over ``max(classes) + 1`` classes, trained on
  per-voxel cross-entropy plus soft Dice over the foreground classes (organs are a few percent
  of an abdomen's voxels: cross-entropy alone learns the background first). A non-zero
  ``mask.pad`` is ignored by both, as in train.py.
- class: a class per volume, cross-entropy on ``batch["label"]``.
- multilabel: one logit per label, binary cross-entropy on the multi-hot ``batch["target"]``.
- numeric: one output per number, MSE on ``batch["target"]`` standardised by the train split's
  ``target_stats``, as train.py does.
- none (unlabeled): self-supervised denoising: from the volume plus Gaussian noise, predict the
  clean volume average-pooled to 4×4×4 (MSE).

Distributed training, ``set_epoch`` and the checkpoint (which holds the loader position, so
``--resume`` continues mid-epoch) work as in train.py; see its docstring.
"""

from __future__ import annotations

from typing import Any

import torch
import train as shared  # examples/train.py, next to this file
from torch import nn
from torch.nn import functional as F

from packer.errors import ConfigError
from packer.loader import MixedDataset, ShardDataset


class UNet3d(nn.Module):
    """Per-voxel class logits (B×classes×D×H×W) of a B×C×D×H×W volume: a U-Net of two levels
    sized for a CPU. A strided 3×3×3 convolution to half resolution (3-D convolutions are
    costly, their gradients most), two more to a quarter, that upsampled (trilinear) and joined
    to the half-resolution features, a convolution, a 1×1×1 head, and the logits upsampled to
    the input's voxels. Any D, H, W."""

    def __init__(self, channels: int, classes: int, width: int = 16) -> None:
        super().__init__()

        def conv(inputs: int, outputs: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv3d(inputs, outputs, 3, padding=1, stride=stride), nn.ReLU())

        self.fine = conv(channels, width, stride=2)
        self.coarse = nn.Sequential(conv(width, 2 * width, stride=2), conv(2 * width, 2 * width))
        self.joined = conv(3 * width, width)
        self.head = nn.Conv3d(width, classes, 1)

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        fine = self.fine(volume)
        up = F.interpolate(self.coarse(fine), size=fine.shape[2:], mode="trilinear", align_corners=False)
        logits = self.head(self.joined(torch.cat([fine, up], dim=1)))
        return F.interpolate(logits, size=volume.shape[2:], mode="trilinear", align_corners=False)


def soft_dice_loss(logits: torch.Tensor, mask: torch.Tensor, classes: int, ignore: int | None) -> torch.Tensor:
    """1 − the mean soft Dice of the foreground classes (1..classes-1) over the batch's voxels
    (``ignore``: a class id whose voxels count for nothing); ``logits`` B×K×D×H×W, ``mask``
    B×D×H×W int64."""
    probs = logits.softmax(dim=1)
    keep = torch.ones_like(mask, dtype=probs.dtype) if ignore is None else (mask != ignore).to(probs.dtype)
    truth = F.one_hot(mask.clamp(0, classes - 1), classes).movedim(-1, 1).to(probs.dtype)
    dims = (0, 2, 3, 4)
    overlap = (probs * truth * keep[:, None]).sum(dims)
    total = ((probs + truth) * keep[:, None]).sum(dims)
    dice = (2 * overlap + 1.0) / (total + 1.0)
    return 1.0 - dice[1:].mean()


def segmentation_objective(dataset: ShardDataset | MixedDataset, channels: int) -> shared.Objective:
    """3-D segmentation of the dataset's label maps (module docstring)."""
    mask = dataset.info.mask or {}
    pad = int(mask.get("pad", 0))  # a non-zero pad is what crop-or-pad filled in: not a class
    ids = sorted(set(mask.get("classes") or range(256)) - ({pad} if pad else set()))
    classes = max(ids) + 1
    ignore = pad if pad else None

    def loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        target = batch["mask"].long()
        if target.dim() != 4:
            raise ConfigError(f"the masks are {tuple(target.shape)}, not B×D×H×W label maps of volumes")
        logits = model(batch["image"])
        return (F.cross_entropy(logits, target, ignore_index=-100 if ignore is None else ignore)
                + soft_dice_loss(logits, target, classes, ignore))

    return shared.Objective(f"segmentation: {classes} classes, 3-D", UNet3d(channels, classes), loss)


def pick_objective(dataset: ShardDataset | MixedDataset, channels: int, device: torch.device) -> shared.Objective:
    """This file's 3-D segmentation for volumes with label maps (train.py segments 2-D images
    only); every other dataset gets train.py's own objective."""
    if dataset.info.mask is not None and dataset.info.layout == "CDHW":
        return segmentation_objective(dataset, channels)
    return shared.pick_objective(dataset, channels, device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train on volumes; return what happened (steps, losses, keys seen) for tests and logs."""
    # volumes are big: a few per batch, and a gentler step than train.py's for 2-D images
    args = shared.parse_args(argv, description=__doc__, batch_size=4, lr=0.01)
    return shared.run(args, layouts=("CDHW",), name="train3d.py", pick=pick_objective)


if __name__ == "__main__":
    main()
