"""Masks: read one raw file's segmentation mask and attach it, in its image's geometry, to each of its samples.

Runs in the pixel pass, after the file's samples are made. The mask file (the source's table
column ``mask.column``, relative to the root) is decoded and checked against the image *as
stored* (:func:`packer.transform.mask.check_mask`), then given each sample's geometry from that
sample's metadata: an image's orientation, resize and tile (per TIFF page); a DICOM frame's
pixel spacing, spacing resample and resize (per frame; ``frames: stack`` stacks the frames'
masks). A defect is the file's bad-sample record: ``mask_missing``, ``mask_unreadable``,
``mask_size``, ``mask_values``, ``mask_empty`` (``empty: bad``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from packer.config import JobConfig, SourceConfig
from packer.pipeline.spill import mask_path
from packer.records import Issue, Sample, SampleRef
from packer.transform.mask import MaskError, check_mask, decode_mask, transform_mask_dicom, transform_mask_image


def _issue(ref: SampleRef, reason: str, message: str) -> Issue:
    return Issue.of(ref, stage="transform" if reason != "mask_missing" else "read", reason=reason, message=message)


def with_masks(samples: list[Sample], source: SourceConfig, job: JobConfig) -> list[Sample] | Issue:
    """``samples`` (all of one raw file) each with its mask, or the file's mask defect."""
    if source.mask is None or not samples:
        return samples
    ref = samples[0].ref
    path = mask_path(source, ref)
    if path is None:
        return _issue(ref, "mask_missing", f"{ref.path}: its table row names no mask in column {source.mask.column!r}")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        return _issue(ref, "mask_missing", f"{ref.path}: its mask {path} cannot be read ({err.strerror or err}); "
                                           "fix the table's mask column or add the file")
    first = samples[0].metadata
    try:
        decoded = decode_mask(data, path)
        if ref.kind == "dicom":
            frames = int(first.get("number_of_frames") or 1)
            height, width = int(first["rows"]), int(first["columns"])
        else:
            frames = int(first.get("pages") or 1)
            height, width = int(first["source_height"]), int(first["source_width"])
        if source.mask.classes is None and decoded.size and int(decoded.max()) > 255:
            raise MaskError("mask_values", f"mask holds class id {int(decoded.max())}; ids above 255 must be "
                                           "declared in the source's mask.classes (they make the masks uint16)")
        mask = check_mask(decoded, height=height, width=width, frames=frames, classes=source.mask.classes)
    except MaskError as err:
        return _issue(ref, err.reason, f"{ref.path}: mask {path}: {err.message}")
    if source.mask.empty == "bad" and not mask.any():
        return _issue(ref, "mask_empty", f"{ref.path}: mask {path} is all background (0) and the source's "
                                         "mask.empty is bad; fix the mask, or set empty: keep to pack it")
    mask = mask.astype(source.mask.dtype, copy=False)
    out = _dicom_masks(samples, mask, source, job) if ref.kind == "dicom" else _image_masks(samples, mask, source, job)
    wrong = [(s.key, m.shape, s.image.shape) for s, m in zip(samples, out, strict=False)
             if m.shape[1:] != s.image.shape[1:]]
    if len(out) != len(samples) or wrong:  # the transforms' contract: a record, never a crash, if it ever breaks
        return Issue.of(ref, stage="transform", reason="unexpected_error",
                        message=f"{ref.path}: {len(out)} masks for {len(samples)} samples, or a mask off its image's "
                                f"grid ({wrong[:1]}); please report this with the file")
    return [replace(sample, mask=sample_mask) for sample, sample_mask in zip(samples, out, strict=True)]


def _image_masks(samples: list[Sample], mask: np.ndarray, source: SourceConfig, job: JobConfig) -> list[np.ndarray]:
    """Each image sample's mask: its page's mask through the page's orientation, resize and tiles."""
    pad = source.mask.pad if source.mask is not None else 0
    by_page: dict[int, list[np.ndarray]] = {}
    out = []
    for sample in samples:
        page = int(sample.metadata.get("page", 0))
        if page not in by_page:  # tiles of one page come in transform_image's order
            tiles = transform_mask_image(mask[page], job.image, int(sample.metadata.get("orientation", 1)), pad)
            by_page[page] = list(reversed(tiles))
        out.append(by_page[page].pop())
    return out


def _dicom_masks(samples: list[Sample], mask: np.ndarray, source: SourceConfig, job: JobConfig) -> list[np.ndarray]:
    """Each DICOM sample's mask: its frame's (``frames: stack``: every frame's, stacked) through
    the frame's pixel spacing, the spacing resample and the resize."""
    cfg = job.dicom
    pad = source.mask.pad if source.mask is not None else 0

    def one(frame: int, spacing: list[float] | None) -> np.ndarray:
        return transform_mask_dicom(mask[frame], pixel_spacing=tuple(spacing) if spacing else None,  # type: ignore[arg-type]
                                    spacing=cfg.spacing, size=cfg.size, policy=cfg.resize, pad_value=pad)

    if cfg.frames == "stack":
        spacing = samples[0].metadata.get("pixel_spacing")
        return [np.ascontiguousarray(np.concatenate([one(f, spacing) for f in range(mask.shape[0])], axis=0))]
    return [one(int(s.metadata.get("frame", 0)), s.metadata.get("pixel_spacing")) for s in samples]
