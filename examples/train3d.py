"""Train a small 3-D CNN from packed volumes (``layout: CDHW``): one process, or DDP under torchrun.

    # a job whose transform.dicom has sample: {volume: {spacing: [z, y, x], size: [D, H, W]}}
    packer build volumes.yaml                          # one C×D×H×W sample per DICOM series
    python examples/train3d.py --manifest build/volumes/<version> --epochs 1
    python examples/train3d.py --manifest build/volumes/<version> --epochs 2 --checkpoint ckpt.pt
    python examples/train3d.py --manifest build/volumes/<version> --checkpoint ckpt.pt --resume
    torchrun --nproc-per-node 2 examples/train3d.py --manifest build/volumes/<version> --checkpoint ckpt.pt

The 3-D entry of examples/train.py (keep train.py next to it: the loop, the checkpoint and
the objectives are its own, with 3-D convolutions for volumes). Batches are ``image`` uint8
B×C×D×H×W, C the windows; 2-D datasets (``layout: CHW``) are refused here: train those with
examples/train.py.

What it trains follows the manifest's ``target.kind``; no flag chooses it:
- class: a class per volume, cross-entropy on ``batch["label"]``.
- multilabel: one logit per label, binary cross-entropy on the multi-hot ``batch["target"]``.
- numeric: one output per number, MSE on ``batch["target"]`` standardised by the train split's
  ``target_stats``, as train.py does.
- none (unlabeled): self-supervised denoising: from the volume plus Gaussian noise, predict the
  clean volume average-pooled to 4×4×4 (MSE).
Segmentation masks come with 2-D samples only (a dataset with ``mask`` stops with a message).

Distributed training, ``set_epoch`` and the checkpoint (which holds the loader position, so
``--resume`` continues mid-epoch) work as in train.py; see its docstring.
"""

from __future__ import annotations

from typing import Any

from train import parse_args, run  # examples/train.py, next to this file


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train on volumes; return what happened (steps, losses, keys seen) for tests and logs."""
    # volumes are big: a few per batch, and a gentler step than train.py's for 2-D images
    return run(parse_args(argv, description=__doc__, batch_size=4, lr=0.01), layouts=("CDHW",), name="train3d.py")


if __name__ == "__main__":
    main()
