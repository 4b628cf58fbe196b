"""Masks of 2-D files: one raw file's mask, read and given each of its samples' geometry.

Runs in the pixel pass, after the file's samples are made (the default of
:meth:`packer.read.kinds.SourceKind.attach_masks`). The mask file (the source's table column
``mask.column``, relative to the root) is decoded and checked against the image *as stored*
(:func:`packer.transform.mask.check_mask`, on the grid the kind's ``mask_grid`` reads from the
first sample's metadata; where the kind's ``mask_frames`` gives frames of different sizes, a
multi-page TIFF's pages, each frame's mask against its own frame's size), then given each
sample's geometry by the kind's ``place_masks``: an
image's orientation, resize and tile (per TIFF page); a DICOM frame's pixel spacing, spacing
resample and resize (per frame; ``frames: stack`` stacks the frames' masks). A defect is the
file's bad-sample record: ``mask_missing``, ``mask_unreadable``, ``mask_size``,
``mask_values``, ``mask_empty`` (``empty: bad``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.config import JobConfig, LimitsConfig, SourceConfig
from packer.read.image_structure import (
    Defect,
    ImageHeader,
    Reader,
    file_header,
    sniff_format,
    tiff_chain,
    tiff_header_of,
)
from packer.read.tiff_codecs import check_opencv_decodes
from packer.records import Issue, Sample, SampleRef
from packer.transform.mask import (
    MaskError,
    check_lossless_tiff,
    check_mask,
    decode_mask,
    decode_mask_pages,
    displayed_size_fix,
    lossless_jpeg_page,
)
from packer.transform.tiff_strips import page_indices

if TYPE_CHECKING:
    from packer.read.kinds import SourceKind

_COMPRESSION = 259  # TIFF Compression


def _issue(ref: SampleRef, reason: str, message: str) -> Issue:
    return Issue.of(ref, stage="transform" if reason != "mask_missing" else "read", reason=reason, message=message)


def _mask_issue(ref: SampleRef, path: str, err: MaskError) -> Issue:
    """The record of a defect of the mask file ``path``: the image, then the mask named once. The
    decoders' messages (:func:`decode_mask`, :func:`decode_mask_pages`) begin with the name they
    were given (``path``, or ``path page N``), the checks' after decoding do not; prefixing every
    one with ``mask {path}:`` named the file twice in the first."""
    said = err.message if err.message.startswith(path) else f"{path}: {err.message}"
    return _issue(ref, err.reason, f"{ref.path}: mask {said}")


def _orientation(metadata: Mapping[str, Any]) -> int:
    """The image file's Orientation value (1-8) where its metadata records one (an image's EXIF
    or TIFF tag), else 1: a mask's messages only (the kind's ``place_masks`` orients the mask)."""
    value = metadata.get("orientation")
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _first_page_header(read: Reader, size: int, limits: LimitsConfig) -> ImageHeader | None:
    """A TIFF's first page's header (not a thumbnail's written before it), or None where its chain
    cannot be walked whole (cut short past its first IFD, more IFDs than ``limits`` allow, a loop):
    the first IFD's header is then checked instead, as before thumbnails were skipped, so a cut
    mask that claims a huge size is still refused before it is decoded."""
    try:
        chain = tiff_chain(read, size, limits)
    except Defect:
        return None
    if not chain:
        return None
    page = chain[page_indices([ifd.tags for ifd in chain])[0]]
    return tiff_header_of(page.tags, f"IFD {page.index} at byte {page.offset}")


def _check_header_size(data: bytes, height: int, width: int, orientation: int = 1, *,
                       limits: LimitsConfig) -> None:
    """Raise MaskError ``mask_size`` where a PNG or TIFF mask's header gives another size than
    its image's stored one, before a pixel is decoded: a 140 KB PNG claiming 12000×12000 was
    decoded whole (a quarter of a GB) only to be refused after, past the job's limits. Where the
    image's ``orientation`` swaps its axes and the mask has the displayed size, it says so. A
    TIFF's size is its first page's, not a thumbnail's written before it
    (:func:`~packer.transform.tiff_strips.page_indices`; ``limits`` bound the chain's walk)."""
    fmt = sniff_format(bytes(data[:8]))
    if fmt not in ("png", "tiff"):
        return  # .npy (its array is its size), and what decode_mask refuses by format

    def read(offset: int, count: int) -> bytes:
        return bytes(data[offset:offset + count])

    try:
        header = _first_page_header(read, len(data), limits) if fmt == "tiff" else None
        if header is None:
            header = file_header(fmt, read, len(data))
    except Defect:
        return  # a damaged header: decode_mask says what OpenCV makes of it
    if (header.height, header.width) != (height, width):
        shown = displayed_size_fix((header.height, header.width), height=height, width=width, orientation=orientation)
        raise MaskError("mask_size", f"its header gives {header.height}×{header.width} pixels, the image "
                                     f"{height}×{width} (as stored, before orientation); nothing was decoded: "
                                     + (shown or "a mask labels its image's own pixels, so save it at the image's "
                                                 "size"))


def _check_tiff_codecs(data: bytes, limits: LimitsConfig, path: str) -> None:
    """Raise MaskError ``mask_unreadable`` where a TIFF mask (the file ``path``) has a page in a
    lossy compression (JPEG, WebP, JPEG 2000, ...: :func:`check_lossless_tiff`, the decoder's own
    check, whose message names the compression and the lossless fix), or in one OpenCV's libtiff
    does not decode (ZSTD, LZMA, ...: :func:`check_opencv_decodes`): it would come back as zeros,
    background everywhere, or as nothing. Every page is judged for loss (a mask of a multi-page
    image decodes them all), but no reduced-resolution IFD (a thumbnail, as a viewer's JPEG preview
    is: no page, :func:`~packer.transform.tiff_strips.page_indices`); every IFD for OpenCV's codecs,
    as OpenCV decodes the whole chain, thumbnails with the pages, and gives nothing for one it does
    not decode. A damaged chain is left to the decoder to describe."""
    if sniff_format(bytes(data[:8])) != "tiff":
        return
    try:
        chain = tiff_chain(lambda offset, count: bytes(data[offset:offset + count]), len(data), limits)
    except Defect:
        return
    pages = [chain[index] for index in page_indices([ifd.tags for ifd in chain])]
    check_lossless_tiff([(ifd.tags.get(_COMPRESSION) or (1,))[0] for ifd in pages], path,
                        [lossless_jpeg_page(data, ifd.tags) for ifd in pages])
    try:
        check_opencv_decodes(chain)
    except Defect as err:
        raise MaskError("mask_unreadable", f"the mask TIFF's {err.message[:1].lower()}{err.message[1:]}") from err


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
    sizes = kind.mask_frames(samples)
    if len(set(sizes)) > 1:
        return _attach_per_frame(kind, samples, source, job, data, path, sizes)
    first = samples[0].metadata
    try:
        frames, height, width = kind.mask_grid(first)
        orientation = _orientation(first)
        _check_tiff_codecs(data, job.limits, path)
        _check_header_size(data, height, width, orientation, limits=job.limits)
        mask = _checked(decode_mask(data, path), "mask", source, height=height, width=width, frames=frames,
                        orientation=orientation)
    except MaskError as err:
        return _mask_issue(ref, path, err)
    if source.mask.empty == "bad" and not mask.any():
        return _empty(ref, path)
    mask = mask.astype(source.mask.dtype, copy=False)
    return _placed(samples, kind.place_masks(samples, mask, source, job))


def _checked(decoded: np.ndarray, what: str, source: SourceConfig, *, height: int, width: int,
             frames: int, orientation: int = 1) -> np.ndarray:
    """``decoded`` (the mask, or one page of it: ``what``) checked against its image's grid and the
    source's classes (:func:`check_mask`); ids above 255 must be declared. Raises MaskError."""
    assert source.mask is not None
    if source.mask.classes is None and decoded.size and int(decoded.max()) > 255:
        raise MaskError("mask_values", f"{what} holds class id {int(decoded.max())}; ids above 255 must be "
                                       "declared in the source's mask.classes (they make the masks uint16)")
    return check_mask(decoded, height=height, width=width, frames=frames, classes=source.mask.classes,
                      orientation=orientation)


def _empty(ref: SampleRef, path: str) -> Issue:
    """The ``mask_empty`` record of a mask that is all background under ``mask.empty: bad``."""
    return _issue(ref, "mask_empty", f"{ref.path}: mask {path} is all background (0) and the source's "
                                     "mask.empty is bad; fix the mask, or set empty: keep to pack it")


def _placed(samples: list[Sample], out: list[np.ndarray]) -> list[Sample] | Issue:
    """``samples`` each with its placed mask of ``out``, or an ``unexpected_error`` record where
    the masks do not match the samples one to one."""
    ref = samples[0].ref
    wrong = [(s.key, m.shape, s.image.shape) for s, m in zip(samples, out, strict=False)
             if m.shape[1:] != s.image.shape[1:]]
    if len(out) != len(samples) or wrong:  # the transforms' contract: a record, never a crash, if it ever breaks
        return Issue.of(ref, stage="transform", reason="unexpected_error",
                        message=f"{ref.path}: {len(out)} masks for {len(samples)} samples, or a mask off its image's "
                                f"grid ({wrong[:1]}); please report this with the file")
    return [replace(sample, mask=sample_mask) for sample, sample_mask in zip(samples, out, strict=True)]


def _attach_per_frame(kind: SourceKind, samples: list[Sample], source: SourceConfig, job: JobConfig, data: bytes,
                      path: str, sizes: list[tuple[int, int]]) -> list[Sample] | Issue:
    """:func:`attach_masks` for a file whose frames (a TIFF's pages) differ in size: the mask has
    one frame per frame (a multi-page TIFF of those sizes, or nothing else fits), each checked
    against its own frame's stored size and placed on that frame's samples."""
    assert source.mask is not None
    ref = samples[0].ref
    listed = ", ".join(f"{height}×{width}" for height, width in sizes)
    try:
        _check_tiff_codecs(data, job.limits, path)
        _check_header_size(data, *sizes[0], limits=job.limits)
        pages = decode_mask_pages(data, path)
        if len(pages) != len(sizes):
            raise MaskError("mask_size", (
                f"the mask has {len(pages)} page{'s' if len(pages) != 1 else ''} but its image {len(sizes)} pages of "
                f"different sizes ({listed}, height×width as stored); a mask labels each page on that page's own "
                "grid: save one mask page per image page, each of its page's size (a multi-page TIFF)"))
        checked = []
        for number, (page, (height, width)) in enumerate(zip(pages, sizes, strict=True)):
            if page.shape != (height, width):
                raise MaskError("mask_size", (
                    f"mask page {number} is {page.shape[0]}×{page.shape[1]} but image page {number} is "
                    f"{height}×{width} (height×width, as stored, before orientation and resize; the image's pages "
                    f"are {listed}); each mask page must label its own image page's pixels one to one, so save "
                    "the mask as a multi-page TIFF whose pages have the image pages' sizes"))
            checked.append(_checked(page, f"mask page {number}", source, height=height, width=width, frames=1))
    except MaskError as err:
        return _mask_issue(ref, path, err)
    if source.mask.empty == "bad" and not any(page.any() for page in checked):
        return _empty(ref, path)
    # each frame's samples get that frame's mask: the kind places a one-frame mask on one frame's samples
    frame_of = {page: number for number, page in enumerate(sorted({int(s.metadata.get("page", 0)) for s in samples}))}
    out: list[np.ndarray | None] = [None] * len(samples)
    for number, mask in enumerate(checked):
        at = [i for i, s in enumerate(samples) if frame_of[int(s.metadata.get("page", 0))] == number]
        placed = kind.place_masks([samples[i] for i in at], mask.astype(source.mask.dtype, copy=False), source, job)
        for i, sample_mask in zip(at, placed, strict=False):
            out[i] = sample_mask
    return _placed(samples, [m for m in out if m is not None])
