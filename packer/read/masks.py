"""Masks of 2-D files: one raw file's mask, read and given each of its samples' geometry.

Runs in the pixel pass, after the file's samples are made (the default of
:meth:`packer.read.kinds.SourceKind.attach_masks`). The mask file (the source's table column
``mask.column``, relative to the root) is decoded and checked against the image *as stored*
(:func:`packer.transform.mask.check_mask`, on the grid the kind's ``mask_grid`` reads from the
first sample's metadata), then given each sample's geometry by the kind's ``place_masks``: an
image's orientation, resize and tile (per TIFF page); a DICOM frame's pixel spacing, spacing
resample and resize (per frame; ``frames: stack`` stacks the frames' masks). A defect is the
file's bad-sample record: ``mask_missing``, ``mask_unreadable``, ``mask_size``,
``mask_values``, ``mask_empty`` (``empty: bad``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from packer.config import JobConfig, SourceConfig
from packer.read.image_structure import Defect, file_header, sniff_format
from packer.records import Issue, Sample, SampleRef
from packer.transform.mask import MaskError, check_mask, decode_mask

if TYPE_CHECKING:
    from packer.read.kinds import SourceKind


def _issue(ref: SampleRef, reason: str, message: str) -> Issue:
    return Issue.of(ref, stage="transform" if reason != "mask_missing" else "read", reason=reason, message=message)


def _check_header_size(data: bytes, height: int, width: int) -> None:
    """Raise MaskError ``mask_size`` where a PNG or TIFF mask's header gives another size than
    its image's stored one, before a pixel is decoded: a 140 KB PNG claiming 12000×12000 was
    decoded whole (a quarter of a GB) only to be refused after, past the job's limits."""
    fmt = sniff_format(bytes(data[:8]))
    if fmt not in ("png", "tiff"):
        return  # .npy (its array is its size), and what decode_mask refuses by format
    try:
        header = file_header(fmt, lambda offset, count: bytes(data[offset:offset + count]), len(data))
    except Defect:
        return  # a damaged header: decode_mask says what OpenCV makes of it
    if (header.height, header.width) != (height, width):
        raise MaskError("mask_size", f"its header gives {header.height}×{header.width} pixels, the image "
                                     f"{height}×{width} (as stored, before orientation); nothing was decoded: a mask "
                                     "labels its image's own pixels, so save it at the image's size")


def attach_masks(kind: SourceKind, samples: list[Sample], source: SourceConfig, job: JobConfig
                 ) -> list[Sample] | Issue:
    """``samples`` (all of one raw file of ``kind``) each with its mask, or the file's mask defect."""
    if source.mask is None or not samples:
        return samples
    ref = samples[0].ref
    path = source.mask_file(ref.extra)
    if path is None:
        return _issue(ref, "mask_missing", f"{ref.path}: its table row names no mask in column {source.mask.column!r}")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        return _issue(ref, "mask_missing", f"{ref.path}: its mask {path} cannot be read ({err.strerror or err}); "
                                           "fix the table's mask column or add the file")
    first = samples[0].metadata
    try:
        frames, height, width = kind.mask_grid(first)
        _check_header_size(data, height, width)
        decoded = decode_mask(data, path)
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
    out = kind.place_masks(samples, mask, source, job)
    wrong = [(s.key, m.shape, s.image.shape) for s, m in zip(samples, out, strict=False)
             if m.shape[1:] != s.image.shape[1:]]
    if len(out) != len(samples) or wrong:  # the transforms' contract: a record, never a crash, if it ever breaks
        return Issue.of(ref, stage="transform", reason="unexpected_error",
                        message=f"{ref.path}: {len(out)} masks for {len(samples)} samples, or a mask off its image's "
                                f"grid ({wrong[:1]}); please report this with the file")
    return [replace(sample, mask=sample_mask) for sample, sample_mask in zip(samples, out, strict=True)]

