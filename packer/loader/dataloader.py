"""``make_loader``: a configured DataLoader over a ShardDataset, with resumable state.

The loader stripes whole batches over workers (batch ``j`` to worker ``j % num_workers``),
and PyTorch's DataLoader returns worker batches round-robin, so this rank's batches arrive
in its sequence order for any ``num_workers``. The position is counted here, in the main
process, from the batches handed to the caller: ``state_dict()`` after ``k`` batches says
"epoch e, ``k * batch_size`` positions consumed" (true of every rank, since ranks step
together), and a loader that loads it yields the rest of the epoch, in the same order,
with any ``num_workers`` (the repeats that fill skipped samples' places under
``on_error="skip"`` with ``uneven="pad"`` are each worker's own: :mod:`packer.loader`).

Batches of images of several shapes. A dataset may mix shapes (CT slices with two windows,
radiographs with one, RGB photos). The default collate stacks, and refuses a mixed batch with
a :class:`MixedShapesError` that names the shapes, their sources and the fixes (a view
of one source, a build with ``transform.channels``, or another collate); ``collate="list"``
hands over a list of tensors and ``collate="pad"`` pads height and width, for models that
take inputs of several sizes::

    loader = make_loader(ShardDataset(manifest, "train"), batch_size=16, collate="list")
    for batch in loader:
        features = torch.cat([backbone(image[None]) for image in batch["image"]])
"""

from __future__ import annotations

import functools
import logging
import math
import random
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packer.errors import ConfigError, Surface, called_from, from_python, surface
from packer.keys import key_source
from packer.loader.dataset import Item, PlannedDataset, as_integer
from packer.loader.readers import ShardReadError, own_message_first
from packer.loader.sharding import Segment, derive_seed, plan_rank, rank_lengths, rank_sequence

log = logging.getLogger("packer.loader")

STATE_FORMAT = "packer.loader/1"


class ImageBatch(list):  # type: ignore[type-arg]
    """The images of a batch whose shapes differ: a ``list`` of tensors that crosses a
    process boundary as ONE tensor.

    Pickled (a DataLoader worker handing its batch to the main process; also ``pickle``,
    ``torch.save``, ``copy.deepcopy``), the images travel packed in one flat tensor, their
    shapes beside it: through DataLoader workers that is one shared-memory block and one
    file descriptor per batch, where a plain list costs one of each, and a socket round trip,
    per image. Unpickled it is an ``ImageBatch`` again, with the same shapes, dtype and
    values, each image a C-contiguous view of its own slice of the one flat tensor: writing
    to one image changes no other, but they share one storage, so holding on to one image
    keeps the whole batch's memory alive (``image.clone()`` keeps only its own). Images
    that are not all plain CPU tensors of one dtype (say, a ``transform`` that returns
    something else) pickle as a plain list would.
    """

    #: The flat tensor this batch's images are views of, and those views, when it was
    #: packed (by :meth:`packed` or by unpickling); pickling sends ``_flat`` as it is while
    #: the list still holds exactly those views.
    _flat: torch.Tensor | None = None
    _views: tuple[torch.Tensor, ...] = ()

    @classmethod
    def packed(cls, images: Sequence[torch.Tensor], *, shared: bool) -> ImageBatch:
        """Copy ``images`` (plain CPU tensors of one dtype, see :func:`packable`) into one flat
        tensor, in shared memory if ``shared``, and return the batch of its views."""
        total = sum(im.numel() for im in images)
        flat = _shared_empty((total,), images[0]) if shared else images[0].new_empty((total,))
        batch = _views_of(flat, [tuple(im.shape) for im in images])
        for view, image in zip(batch, images, strict=True):
            view.copy_(image)
        return batch

    def __reduce__(self) -> tuple[Any, ...]:
        batch = self
        if self._flat is None or len(self) != len(self._views) or any(
                a is not b for a, b in zip(self, self._views, strict=False)):
            if not packable(self):
                return ImageBatch, (list(self),)
            batch = ImageBatch.packed(self, shared=False)
        return _views_of, (batch._flat, [tuple(im.shape) for im in batch])

    def __copy__(self) -> ImageBatch:
        return ImageBatch(self)


def packable(images: Sequence[Any]) -> bool:
    """Whether ``images`` can share one flat tensor: a non-empty sequence of plain
    ``torch.Tensor`` (no subclass) on the CPU, one dtype, no autograd history."""
    if not images or type(images[0]) is not torch.Tensor:
        return False
    dtype = images[0].dtype
    return all(type(im) is torch.Tensor and im.dtype == dtype and im.device.type == "cpu"
               and im.layout == torch.strided and not im.requires_grad for im in images)


def _views_of(flat: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> ImageBatch:
    """An :class:`ImageBatch` of consecutive views of ``flat`` with ``shapes`` (the unpickler)."""
    views, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        views.append(flat[at:at + size].view(shape))
        at += size
    batch = ImageBatch(views)
    batch._flat, batch._views = flat, tuple(views)
    return batch


def _shared_empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``like``'s dtype in shared memory: what a DataLoader worker
    fills so that handing it over is not one more copy (as torch's ``default_collate`` does)."""
    storage = like._typed_storage()._new_shared(math.prod(shape), device=like.device)
    return like.new(storage).resize_(shape)


class MixedShapesError(ConfigError, RuntimeError):
    """A batch whose images differ in shape met a collate that needs one shape.

    A :class:`~packer.errors.ConfigError` (exit 2 at the CLI: a choice to make, not a defect
    of the data) and a ``RuntimeError``; constructible from the message alone, so it crosses
    a DataLoader worker boundary with its type intact, its own message first again in the text
    a plain ``torch.utils.data.DataLoader`` makes of it (:func:`~packer.loader.readers.own_message_first`).
    """

    def __init__(self, message: str) -> None:
        super().__init__(own_message_first(message)[0])


class ImageTypeError(ConfigError, TypeError):
    """A batch's image is not a ``torch.Tensor`` where the collate stacks or pads tensors: a
    ``transform=`` returned something else (a numpy array, albumentations' H×W×C output; a PIL
    image).

    A :class:`~packer.errors.ConfigError` (exit 2 at the CLI) and a ``TypeError``; constructible
    from the message alone, so it crosses a DataLoader worker boundary as :class:`MixedShapesError`
    does.
    """

    def __init__(self, message: str) -> None:
        super().__init__(own_message_first(message)[0])


def _one_source() -> str:
    """Loading one source at a time, as the caller asks for a view (:meth:`packer.errors.Surface.view`)."""
    return f"load one source at a time: {surface().view(python='ShardDataset(manifest, split, sources=[...])')}; or "


_ONE_CHANNEL_COUNT = ("build with one channel count: transform.channels: N in the job file (it replicates "
                      "1-channel samples to N; samples of another count need as many windows as the others)")


def _one_channel_count(channels: set[int]) -> str:
    """The channel-count fix for a batch of ``channels`` counts: ``transform.channels: N``
    replicates 1-channel samples only, so it is offered where every other count is that N."""
    counts = sorted(channels - {1})
    if len(counts) == 1:
        return (f"build with one channel count: transform.channels: {counts[0]} in the job file (1-channel "
                f"samples are replicated to {counts[0]})")
    shown = ", ".join(map(str, counts))
    return (f"build with one channel count: give every source the same number of channels ({shown} here: as many "
            "windows each); transform.channels replicates only 1-channel samples")
_ONE_SIZE = "build with one size: transform.<kind>.size (a volume's: sample: {volume: {size: [D, H, W]}})"
_IMAGES_ONE_SIZE = "build with one size: transform.<kind>.size"
#: load_job refuses transform.<kind>.size for volumes: their size is 3-D, set on the sample
_VOLUMES_ONE_SIZE = "build with one size: sample: {volume: {size: [D, H, W]}}"


def _list() -> str:
    """The list collate, as the caller chooses a collate (:meth:`packer.errors.Surface.collate`)."""
    return ("take the images as a list: "
            + surface().collate("list", python='make_loader(dataset, batch_size, collate="list")'))


def _list_or_pad() -> str:
    pad = surface().collate("pad", python='collate="pad"')
    return f"{_list()} ({pad} pads height and width)"


def mixed_fixes_all() -> str:
    """The ways out of a mixed batch, for every message that meets one (where its shapes are not
    known), naming the options as the caller gives them (a Python call, or a command's flags)."""
    return (f"{_one_source()}{_ONE_CHANNEL_COUNT}; or, where they differ in size only, {_ONE_SIZE}; "
            f"or {_list_or_pad()}")


def _as_list(shapes: Collection[tuple[int, ...]]) -> str:
    """The list collate, and the pad collate beside it only where it loads a batch of ``shapes``:
    C×H×W images of one channel count (it refuses volumes of several sizes and channel mixes)."""
    pads = all(len(shape) == 3 for shape in shapes) and len({shape[0] for shape in shapes}) == 1
    return _list_or_pad() if pads else _list()


def _fixes_for(shapes: set[tuple[int, ...]]) -> str:
    """The fixes of :func:`mixed_fixes_all` that can help a batch of ``shapes`` (C×H×W or C×D×H×W):
    one channel count only where the channel counts differ, one size only where the sizes do
    (an EXIF-rotated photo among upright ones differs in size alone: a channel count changes
    nothing there), neither where volumes meet 2-D images (nothing but a list joins those).
    The size is the kind's for 2-D images, ``sample: {volume: {size}}`` for volumes; the pad
    collate is offered only where it loads the batch (:func:`_as_list`)."""
    if len(shapes) < 2:
        return mixed_fixes_all()
    if len({len(shape) for shape in shapes}) > 1:  # volumes beside 2-D images: no channel count or size joins them
        return (f"{_one_source()}{_list()} (volumes, C×D×H×W, and 2-D images, C×H×W, never stack or pad into one "
                "tensor, whatever their channels or size)")
    counts = {shape[0] for shape in shapes}
    sizes = len({shape[1:] for shape in shapes}) > 1
    one_size = _VOLUMES_ONE_SIZE if len(next(iter(shapes))) == 4 else _IMAGES_ONE_SIZE
    fixes = [*([_one_channel_count(counts)] if len(counts) > 1 else []), *([one_size] if sizes else []),
             _as_list(shapes)]
    return _one_source() + "; or ".join(fixes)


def mixed_fixes(items: Sequence[Item] = (), shapes: Mapping[str, Sequence[Sequence[int]]] | None = None) -> str:
    """:func:`mixed_fixes_all` for a batch of ``items``, where a source its shapes come from (by the
    manifest's ``shapes`` per source) holds several shapes itself (a DICOM export of CT slices
    and radiographs): loading one source at a time is then offered only for the sources of one
    shape, a view for each shape (sources of one shape may share it; sources of two would mix
    them again), and where there are none, not at all (one source would mix them too). Without the
    manifest's shapes (a DataLoader made by hand with ``collate_fn=collate_stack``) the batch's
    own keys say which source each shape came from: a source seen with two shapes in one batch
    holds several itself."""
    seen = {tuple(item["image"].shape) for item in items}
    fixes = _fixes_for(seen)
    if shapes is None:
        in_batch: dict[str, list[tuple[int, ...]]] = {}
        for item in items:
            if (source := key_source(str(item["key"]))) is not None:
                in_batch.setdefault(source, []).append(tuple(item["image"].shape))
        shapes = in_batch
    owners = {src: {tuple(k) for k in known} for src, known in (shapes or {}).items()
              if seen & {tuple(k) for k in known}}
    mixed = sorted(src for src, known in owners.items() if len(known) > 1)
    if not mixed:
        return fixes
    single = sorted(src for src, known in owners.items() if len(known) == 1)
    holds = f"source {', '.join(mixed)} itself hold{'s' if len(mixed) == 1 else ''} several shapes"
    rest = fixes.removeprefix(_one_source())
    if not single:
        return f"{holds}, so loading one source at a time does not help: {rest}"
    # one view per shape: a view of sources of two shapes mixes them again (sources of one shape may share one)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for src in single:
        by_shape.setdefault(next(iter(owners[src])), []).append(src)
    views = " or ".join(surface().view(srcs, python="ShardDataset(manifest, split, sources=["
                                       + ", ".join(f'"{src}"' for src in srcs) + "])") + f" ({_shape_text(shape)})"
                        for shape, srcs in by_shape.items())
    return f"load one source at a time where it holds one shape: {views} ({holds}); or {rest}"


def _shape_text(shape: Sequence[int]) -> str:
    return "×".join(str(int(d)) for d in shape)


def describe_mixed(items: Sequence[Item], shapes: Mapping[str, Sequence[Sequence[int]]] | None = None) -> str:
    """What a mixed batch holds: each shape, how many samples have it, an example key, and the
    sources that have that shape by the manifest's ``sample_schema.shapes`` (when given)."""
    counts: dict[tuple[int, ...], list[str]] = {}
    for item in items:
        counts.setdefault(tuple(item["image"].shape), []).append(str(item["key"]))
    parts = []
    for shape, keys in counts.items():
        owners = sorted(src for src, known in (shapes or {}).items() if shape in {tuple(k) for k in known})
        if shapes is None:  # a DataLoader made by hand passes no manifest: the keys name their sources
            owners = sorted({source for key in keys if (source := key_source(key)) is not None})
        source = f", source {' or '.join(owners)}" if owners else ""
        parts.append(f"{_shape_text(shape)} ({len(keys)} sample(s){source}, e.g. {keys[0]})")
    return ", ".join(parts)


def _targets(items: Sequence[Item]) -> dict[str, Any]:
    """The batch's targets: ``label`` int64 (B,) for a class dataset, ``target`` float32 (B, L)
    for a multi-label or numeric one, neither for an unlabeled one (the items say which), and
    ``target_mask`` float32 (B, L) where the target is masked (1: use the entry, 0: skip it);
    and ``record``, a list of the items' records, where they carry them (``records=True``)."""
    if not items:
        return {"label": torch.zeros(0, dtype=torch.int64)}
    out: dict[str, Any] = {}
    for name in ("label", "target", "target_mask"):  # a mask is stacked with its image (each collate's own rule)
        if name in items[0]:
            out[name] = torch.stack([item[name] for item in items])
    if "record" in items[0]:
        out["record"] = [item["record"] for item in items]
    return out


def _type_text(value: Any) -> str:
    kind = type(value)
    module = {"builtins": "", "numpy": "numpy."}.get(kind.__module__, f"{kind.__module__}.")
    return f"{module}{kind.__qualname__}"


def _transform_text(transforms: Sequence[str] | None) -> str:
    """The dataset's ``transform=`` by name where the loader knows it, else as the argument."""
    if transforms:
        return f"the dataset's transform= ({', '.join(transforms)})"
    return "the dataset's transform= (ShardDataset(..., transform=...))"


def _require_tensors(items: Sequence[Item], collate: str, transforms: Sequence[str] | None) -> None:
    """Raise :class:`ImageTypeError` where an item's image is not a tensor: a packer dataset's
    images are tensors, so a transform made it. Named apart from a shape mismatch, which it is not."""
    for item in items:
        image = item["image"]
        if isinstance(image, torch.Tensor):
            continue
        shape = getattr(image, "shape", None)
        described = _type_text(image) + (f" {_shape_text(shape)}, {getattr(image, 'dtype', '?')}"
                                          if isinstance(shape, tuple) else "")
        hwc = (isinstance(image, np.ndarray) and image.ndim == 3
               and " (an H×W×C array, albumentations' layout, is torch.from_numpy(image.transpose(2, 0, 1)))")
        raise ImageTypeError(
            f"sample {item['key']}: its image is a {described}, not a torch.Tensor: {_transform_text(transforms)} "
            f"returned it, and collate={collate!r} batches C×H×W tensors; return a tensor from the transform "
            f"(albumentations: end the pipeline with ToTensorV2(){hwc or ''}), or take the images as they are with "
            "make_loader(dataset, batch_size, collate=\"list\") or a collate of your own")


def _made_by_transform(images: Sequence[torch.Tensor], shapes: Mapping[str, Sequence[Sequence[int]]] | None
                       ) -> list[tuple[int, ...]]:
    """The batch's image shapes that no source has by the manifest (its ``shapes`` per source):
    shapes the build never made, so a transform made them. Empty where the manifest's shapes are
    not known (a DataLoader made by hand with ``collate_fn=collate_stack``)."""
    stored = {tuple(int(d) for d in known) for found in (shapes or {}).values() for known in found}
    if not stored:
        return []
    return sorted({tuple(im.shape) for im in images} - stored)


#: Said where the manifest's shapes are not known (a DataLoader made by hand), so a transform's shapes
#: cannot be told from stored ones.
_UNKNOWN_TRANSFORM = ("; and where the dataset has a transform= that changes shapes (a random crop or resize), make it "
                      "return one shape for every sample: rebuilding does not change what it returns")


def _transform_changed(items: Sequence[Item], shapes: Mapping[str, Sequence[Sequence[int]]],
                       made: Sequence[tuple[int, ...]], transforms: Sequence[str] | None) -> str:
    stored = sorted({tuple(int(d) for d in known) for found in shapes.values() for known in found})
    return (f"this batch mixes image shapes {describe_mixed(items, shapes)}, which cannot be stacked into one "
            f"tensor; {', '.join(map(_shape_text, made))} {'is not a shape' if len(made) == 1 else 'are not shapes'} "
            f"the build made (the manifest's: {', '.join(map(_shape_text, stored))}), so {_transform_text(transforms)} "
            "changed them (a random crop or resize gives each sample its own size): make it return one shape for "
            f"every sample (crop or resize to a fixed size), or {_as_list([tuple(i['image'].shape) for i in items])}")


@from_python
def collate_stack(items: list[Item], *, shapes: Mapping[str, Sequence[Sequence[int]]] | None = None,
                  transforms: Sequence[str] | None = None) -> dict[str, Any]:
    """Batch items: ``image`` stacked to B×C×H×W, ``label`` int64 of shape (B,) (class datasets) or
    ``target`` float32 B×L (multi-label: multi-hot; numeric: the numbers), ``target_mask``
    float32 B×L (masked targets: 1 use the entry, 0 skip it), ``mask`` B×F×H×W (datasets with
    masks), ``key`` a list of str.

    The default collate of :func:`make_loader`. Images of different shapes raise
    :class:`MixedShapesError`, naming the shapes (and, given the manifest's ``shapes`` per
    source, their sources) and the fixes, instead of torch's "stack expects each tensor
    to be equal size". Shapes no source has by the manifest are a ``transform``'s doing, and
    the message says so (``transforms``: the dataset's transforms by name, for it to name
    them). An image that is not a tensor (a transform that returns a numpy array) raises
    :class:`ImageTypeError`. In a DataLoader worker the batch is stacked straight into shared
    memory, so it reaches the main process as one block.
    """
    _require_tensors(items, "stack", transforms)
    images = [item["image"] for item in items]
    if images and any(im.shape != images[0].shape for im in images):
        if made := _made_by_transform(images, shapes):
            raise MixedShapesError(_transform_changed(items, shapes or {}, made, transforms))
        raise MixedShapesError(f"this batch mixes image shapes {describe_mixed(items, shapes)}, which cannot be "
                               f"stacked into one tensor; {mixed_fixes(items, shapes)}"
                               f"{_UNKNOWN_TRANSFORM if shapes is None else ''}")
    shared = get_worker_info() is not None and packable(images)
    out = _shared_empty((len(images), *images[0].shape), images[0]) if shared and images else None
    image = torch.stack(images, out=out) if images else torch.zeros(0, dtype=torch.uint8)
    masks = [item["mask"] for item in items if "mask" in item]
    if masks and any(m.shape != masks[0].shape for m in masks):  # images alike, masks not: frames differ
        raise MixedShapesError(f"this batch's masks have shapes {sorted({tuple(m.shape) for m in masks})}; "
                               f"{mixed_fixes_all()}")
    return {"image": image, **({"mask": torch.stack(masks)} if masks else {}), **_targets(items),
            "key": [item["key"] for item in items]}


def collate_list(items: list[Item]) -> dict[str, Any]:
    """Batch items with ``image`` an :class:`ImageBatch`: a list of C×H×W tensors, any shapes.

    For models that take inputs of several sizes (detection-style backbones, per-source
    stems). In a DataLoader worker the images are packed into one flat shared tensor, so the
    batch crosses to the main process as one block (see :class:`ImageBatch`).
    """
    images = [item["image"] for item in items]
    shared = get_worker_info() is not None and packable(images)
    batch = ImageBatch.packed(images, shared=True) if shared else ImageBatch(images)
    masks = [item["mask"] for item in items if "mask" in item]
    return {"image": batch, **({"mask": masks} if masks else {}), **_targets(items),
            "key": [item["key"] for item in items]}


@from_python
def collate_pad(items: list[Item], *, mask_pad: int = 0) -> dict[str, Any]:
    """Batch items of one channel count and dtype whose height and width vary: ``image``
    B×C×Hmax×Wmax with each image in the top-left corner and zeros elsewhere, ``size`` int64
    B×2 (each image's own height, width), ``label`` and ``key`` as :func:`collate_stack`;
    ``mask`` B×F×Hmax×Wmax padded with ``mask_pad`` (:func:`make_loader` passes the manifest's
    ``mask.pad``, the id ``fit`` pads with, so a loss that ignores it ignores the collate's
    padding too; 0, background, by default).

    Volumes (C×D×H×W) of one size and dtype have nothing to pad: they are stacked as
    :func:`collate_stack` does (``mask`` B×D×H×W), with ``size`` each one's height, width.
    Volumes of several sizes, and channel counts or dtypes that differ, raise
    :class:`MixedShapesError`: padding depth or channels would invent data.
    """
    _require_tensors(items, "pad", None)
    images = [item["image"] for item in items]
    if not images:
        return {"image": torch.zeros(0, dtype=torch.uint8), "size": torch.zeros((0, 2), dtype=torch.int64),
                **_targets(items), "key": []}
    if all(isinstance(im, torch.Tensor) and im.ndim == 4 for im in images) and len({im.shape for im in images}) > 1:
        raise MixedShapesError(f"collate='pad' pads the height and width of C×H×W images, and this batch holds "
                               f"volumes of several sizes: {describe_mixed(items)}; give the volumes one size with "
                               "sample: {volume: {size: [D, H, W]}} in the job file, or take them as a list: "
                               + surface().collate("list", python='make_loader(dataset, batch_size, collate="list")'))
    if all(isinstance(im, torch.Tensor) and im.ndim == 4 for im in images) and len({im.dtype for im in images}) == 1:
        # volumes of one size (what sample: {volume: {size}} gives them): nothing to pad, so stacked
        stacked = collate_stack(items)
        return {**stacked, "size": torch.tensor([list(im.shape[-2:]) for im in images], dtype=torch.int64)}
    if any(not isinstance(im, torch.Tensor) or im.ndim != 3 or im.shape[0] != images[0].shape[0]
           or im.dtype != images[0].dtype for im in images):
        raise MixedShapesError(f"collate='pad' pads height and width, but this batch mixes channel counts or dtypes: "
                               f"{describe_mixed(items)}; {_fixes_for({tuple(im.shape) for im in images})}")
    height, width = max(im.shape[1] for im in images), max(im.shape[2] for im in images)
    shape = (len(images), images[0].shape[0], height, width)
    shared = get_worker_info() is not None and packable(images)
    image = _shared_empty(shape, images[0]) if shared else images[0].new_empty(shape)
    image.zero_()
    for i, im in enumerate(images):
        image[i, :, :im.shape[1], :im.shape[2]].copy_(im)
    size = torch.tensor([[im.shape[1], im.shape[2]] for im in images], dtype=torch.int64)
    out: dict[str, Any] = {"image": image, "size": size, **_targets(items), "key": [item["key"] for item in items]}
    masks = [item["mask"] for item in items if "mask" in item]
    if masks:  # padded like the images, with ``mask_pad`` outside each mask
        frames = max(m.shape[0] for m in masks)
        mask = masks[0].new_full((len(masks), frames, height, width), mask_pad)
        for i, m in enumerate(masks):
            mask[i, :m.shape[0], :m.shape[1], :m.shape[2]].copy_(m)
        out["mask"] = mask
    return out


#: ``make_loader(collate=...)`` by name.
COLLATES: dict[str, Callable[[list[Item]], dict[str, Any]]] = {
    "stack": collate_stack, "list": collate_list, "pad": collate_pad}


def _passthrough(payload: Any) -> Any:
    return payload


@dataclass(frozen=True)
class _Refused:
    """In place of a batch: the collate refused it (:class:`MixedShapesError`,
    :class:`ImageTypeError`); the main process raises it there, with its own message instead of
    a worker's traceback."""

    message: str
    error: type[MixedShapesError] | type[ImageTypeError] = MixedShapesError


@dataclass(frozen=True)
class _Failed:
    """In place of a batch, from a worker: a :class:`ShardReadError` it raised. The main process
    raises it with its own message, shard and key (PyTorch would rebuild it from a text that
    starts with the worker's traceback, shard and key lost)."""

    message: str
    shard: str | None
    key: str | None


class _BatchStream(IterableDataset):
    """What the DataLoader iterates: one worker's share of collated batches (see module doc)."""

    def __init__(self, *, dataset: PlannedDataset, batch_size: int, drop_last: bool,
                 collate: Callable[[list[Item]], Any]) -> None:
        super().__init__()
        self.dataset, self.batch_size, self.drop_last, self.collate = dataset, batch_size, drop_last, collate

    def __iter__(self) -> Iterator[tuple[Any, int, tuple[str, ...]]]:
        """(batch, its item count, skip descriptions); in place of a batch a :class:`_Refused` or
        :class:`_Failed` (count 0) that the main process raises."""
        batches = self.dataset.iter_batches(batch_size=self.batch_size, drop_last=self.drop_last,
                                            collate=self.collate)
        try:
            yield from batches
        except (MixedShapesError, ImageTypeError) as err:
            yield _Refused(str(err), type(err)), 0, ()
        except ShardReadError as err:
            if get_worker_info() is None:
                raise  # the main process: as it is, traceback and all
            yield _Failed(str(err), err.shard, err.key), 0, ()


def _transforms(dataset: PlannedDataset) -> tuple[str, ...]:
    """The dataset's ``transform`` functions by name (a mix's: its members'), for an error to name."""
    found = [getattr(d, "transform", None) for d in (dataset, *getattr(dataset, "members", ()))]
    return tuple(dict.fromkeys(getattr(t, "__qualname__", None) or type(t).__qualname__
                               for t in found if t is not None))


def _collate_for(dataset: PlannedDataset, collate: str | Callable[[list[Item]], Any]
                 ) -> Callable[[list[Item]], Any]:
    """The collate function for ``collate`` (a name in :data:`COLLATES` or a callable); the
    stacking one knows the manifest's shapes per source, to name them in its error."""
    if callable(collate):
        return collate
    if collate not in COLLATES:
        raise ConfigError(f"collate={collate!r}; expected one of {sorted(COLLATES)} or a function of a list of items")
    made: Callable[[list[Item]], Any] = COLLATES[collate]
    if collate == "stack":
        made = functools.partial(collate_stack, shapes=dataset.shapes, transforms=_transforms(dataset))
    if collate == "pad":  # masks padded with the dataset's own pad id, as fit pads them
        made = functools.partial(collate_pad, mask_pad=dataset.mask_pad)
    # its messages name the options as the dataset's maker gives them (a Python call, or a command's
    # flags), in a DataLoader worker too, where the batch is made after the maker returned
    return functools.partial(_collated_as, getattr(dataset, "_surface", None), made)


def _collated_as(caller: Surface | None, collate: Callable[[list[Item]], Any], items: list[Item]) -> Any:
    """``collate(items)`` under ``caller``'s surface (:func:`packer.errors.called_from`); as it is where
    ``caller`` is None."""
    if caller is None:
        return collate(items)
    with called_from(caller):
        return collate(items)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random``, numpy and torch from (seed, epoch, rank, worker)."""
    info = get_worker_info()
    dataset = getattr(info.dataset, "dataset", info.dataset) if info is not None else None
    if not isinstance(dataset, PlannedDataset):
        return
    seed = derive_seed(dataset.seed, dataset.epoch, dataset.rank, worker_id)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
    torch.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)


@dataclass(frozen=True)
class LoaderState:
    """Where an epoch stands: ``consumed`` positions of this rank's sequence after ``history``."""

    epoch: int
    consumed: int
    history: tuple[Segment, ...]


class ShardLoader:
    """Batches of one rank of a :class:`ShardDataset`, with ``state_dict``/``load_state_dict``.

    Iterating yields dicts ``{"image": uint8 B×C×H×W, "label": int64 (B,), "key": list[str]}``
    as the ``collate`` of :func:`make_loader` makes them (with ``"list"``, ``image`` is an
    :class:`ImageBatch`; with ``"pad"``, a ``size`` B×2 comes too; a collate function's batches
    are what it returns, of any type); a batch the stacking collate
    refuses raises :class:`MixedShapesError` here, in the main process. Each ``iter()`` runs the current
    epoch from its start, except the first after ``load_state_dict``, which runs the rest of
    the saved epoch.
    ``skipped``/``skipped_samples``: samples this rank skipped so far in the current epoch
    (``on_error="skip"``), counted against ``max_skipped``, a cap per epoch: each ``iter()`` that
    runs an epoch from its start counts afresh, so a damaged sample read again every epoch is
    counted once per epoch, never summed over epochs. ``load_state_dict`` restores the count
    where the state is this rank's, saved under the same world size (``skipped_samples``, the
    descriptions, are not in the state).
    """

    def __init__(self, *, dataset: PlannedDataset, batch_size: int, num_workers: int = 0,
                 prefetch_factor: int | None = 2, pin_memory: bool | None = None,
                 persistent_workers: bool | None = None, drop_last: bool = False, timeout: float = 0,
                 multiprocessing_context: Any = None,
                 collate: str | Callable[[list[Item]], Any] = "stack") -> None:
        # plain ints (a numpy one from a schedule too), so that state_dict() stays JSON-able and a
        # checkpoint of it loads under torch.load(weights_only=True); a float or a string is refused here
        batch_size, num_workers = as_integer(batch_size, "batch_size"), as_integer(num_workers, "num_workers")
        if prefetch_factor is not None:
            prefetch_factor = as_integer(prefetch_factor, "prefetch_factor")
            if prefetch_factor < 1:  # torch takes 0 and fails at the first batch (an assertion); -1 is its ValueError
                raise ConfigError(f"prefetch_factor must be >= 1 (batches each worker loads ahead) or None, got "
                                  f"{prefetch_factor}")
        if batch_size < 1 or num_workers < 0:
            raise ConfigError(f"batch_size must be >= 1 and num_workers >= 0 (got {batch_size}, {num_workers})")
        # a bool, whatever truth value it is given as (1, numpy's bool_): the state saves it as JSON's true/false
        self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
        # the collate as given: a name is packer's own (its batches' channels are the dataset's), a function yours
        self.collate = collate
        self.drop_last = bool(drop_last)
        self.skipped = 0
        self.skipped_samples: list[str] = []
        self._state = LoaderState(epoch=dataset.epoch, consumed=0, history=())
        self._resume_pending = False
        # the dataset's set_epoch calls this loader has taken into account (see __iter__)
        self._epoch_calls_seen = dataset.epoch_calls
        _warn_if_ranks_step_apart(dataset, batch_size, drop_last)
        workers = num_workers > 0
        self.dataloader = DataLoader(
            _BatchStream(dataset=dataset, batch_size=batch_size, drop_last=drop_last,
                         collate=_collate_for(dataset, collate)),
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_passthrough,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
            worker_init_fn=seed_worker,
            prefetch_factor=prefetch_factor if workers else None,
            persistent_workers=workers if persistent_workers is None else (persistent_workers and workers),
            timeout=timeout if workers else 0,
            multiprocessing_context=multiprocessing_context if workers else None,
        )

    @property
    def epoch(self) -> int:
        return self._state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next; keeps a pending resume when it is for the same epoch. The
        dataset's own ``set_epoch`` does the same when made later (adopted at the next ``iter()``).
        ``epoch``: any integer type (a numpy one from a schedule too), kept as a plain ``int`` so
        that ``state_dict()`` stays JSON-able; ``ConfigError`` for a float or a string."""
        epoch = as_integer(epoch, "epoch")
        if not (self._resume_pending and epoch == self._state.epoch):
            self._warn_if_resume_dropped(epoch)
            self._state = LoaderState(epoch=epoch, consumed=0, history=())
            self._resume_pending = False
            self._reset_skips()
        self._epoch_calls_seen = self.dataset.epoch_calls

    def _warn_if_resume_dropped(self, epoch: int) -> None:
        """Warn when ``set_epoch(epoch)`` throws away a state loaded for another epoch that had
        samples left (a loop restarted at 0, or at the saved epoch + 1 by the script's own count).

        Left: what this rank's plan of the saved epoch still holds, as ``iter()`` would read it
        (history folded, ``drop_last`` applied), not ``len(dataset)``: under ``drop_last`` an epoch
        ends before its dropped tail, and after a world-size change the saved segment may have
        delivered everything."""
        state = self._state
        if not self._resume_pending or not (state.history or state.consumed > 0):
            return
        current = self._segment(state.consumed)
        order = self.dataset.epoch_order(state.epoch)
        if not len(plan_rank(order, rank=self.dataset.rank, current=current, history=state.history).ids):
            return
        total = len(rank_sequence(order.sequence, rank=self.dataset.rank, segment=current)[0])
        done = f"{min(state.consumed, total)} of its {total} samples consumed" if not state.history else (
            "mid-epoch, under another world size")
        warnings.warn(f"set_epoch({epoch}) discards the loader state loaded for epoch {state.epoch} ({done}): the "
                      f"rest of epoch {state.epoch} will not be read; to resume it call set_epoch({state.epoch}) "
                      "first (loop from the state's 'epoch')", UserWarning, stacklevel=3)

    def _segment(self, consumed: int) -> Segment:
        return Segment(world_size=self.dataset.world_size, uneven=self.dataset.uneven, drop_last=self.drop_last,
                       batch_size=self.batch_size, consumed=consumed)

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields on this rank: a whole epoch's, or after
        ``load_state_dict`` (while the loaded state still holds, see :meth:`set_epoch`) the rest
        of the saved epoch's, which after a world-size change may differ between ranks under
        ``uneven="exact"`` (:meth:`load_state_dict` warns then). Batches whose samples were
        all skipped (``on_error="skip"`` with ``exact``) are left out of the count of what comes."""
        if self._resume_pending and (self.dataset.epoch_calls == self._epoch_calls_seen
                                     or self.dataset.epoch_asked == self._state.epoch):
            state = self._state
            left = rank_lengths(self.dataset.epoch_order(state.epoch), current=self._segment(state.consumed),
                                history=state.history)[self.dataset.rank]
            return -(-left // self.batch_size)
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if self.dataset.epoch_calls != self._epoch_calls_seen:
            # dataset.set_epoch() since this loader's last set_epoch: torch habit (a sampler's or
            # a plain DataLoader's dataset's set_epoch) must not be overwritten by our own epoch
            self.set_epoch(self.dataset.epoch_asked)
        if not self._resume_pending:
            self._state = LoaderState(epoch=self._state.epoch, consumed=0, history=())
            self._reset_skips()  # max_skipped is a cap per epoch
        self._resume_pending = False
        state = self._state
        self.dataset.set_progress(epoch=state.epoch, consumed=state.consumed, history=state.history)
        consumed = state.consumed
        iterator = iter(self.dataloader)
        try:
            for batch, count, skipped in iterator:
                if isinstance(batch, _Refused):
                    raise batch.error(batch.message)
                if isinstance(batch, _Failed):
                    raise ShardReadError(batch.message, shard=batch.shard, key=batch.key)
                # Nominal positions (batch_size per batch, also for a short last batch): ranks
                # step together, so batches × batch_size is every rank's position, even where
                # this rank's sequence is a sample shorter than another's. Each rank caps it
                # at its own length.
                consumed += self.batch_size
                self._state = replace(self._state, consumed=consumed)
                if skipped:
                    self._record_skips(skipped)
                if count:  # a batch whose samples were all skipped (uneven="exact") is not handed out
                    yield batch
        except Exception:
            self._stop_workers(iterator)
            raise

    def close(self) -> None:
        """Shut persistent worker processes down now; the next ``iter()`` starts new ones.

        Workers also stop when the loader is garbage-collected, but a loader caught in a
        reference cycle (say, a frame in an exception's traceback) makes PyTorch's shutdown
        wait 5 s per worker, so close loaders you are done with.
        """
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None:
            self._stop_workers(iterator)

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_workers(self, iterator: Any) -> None:
        """Shut workers down now after an error. Left to the garbage collector, the iterator
        sits in the exception's reference cycle and its shutdown waits 5 s per worker."""
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        if getattr(self.dataloader, "_iterator", None) is iterator:
            self.dataloader._iterator = None

    def _reset_skips(self) -> None:
        """Start the epoch's skip count afresh (``max_skipped`` caps one epoch's skips)."""
        self.skipped = 0
        self.skipped_samples = []

    def _record_skips(self, skipped: tuple[str, ...]) -> None:
        self.skipped += len(skipped)
        self.skipped_samples.extend(skipped)
        for line in skipped:
            log.warning("skipped %s", line)
        if self.skipped > self.dataset.max_skipped:
            raise ShardReadError(f"{self.skipped} samples skipped in epoch {self._state.epoch} on rank "
                                 f"{self.dataset.rank}, more than max_skipped={self.dataset.max_skipped} (a cap per "
                                 f"epoch); last: {skipped[-1]}")

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: epoch, positions consumed (counted from batches handed out), config,
        and ``skipped``, this rank's skips in the epoch so far."""
        ds = self.dataset
        return {
            "format": STATE_FORMAT,
            **ds.identity(),
            "epoch": self._state.epoch,
            "rank": ds.rank,
            "segment": self._segment(self._state.consumed).to_json(),
            "history": [seg.to_json() for seg in self._state.history],
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state``: the next ``iter()`` yields exactly what the epoch had left.

        Same world size (and ``uneven``, and batch size where ``drop_last``): the same
        order as the uninterrupted epoch. Otherwise the samples no rank had consumed are
        split afresh over the new ranks (the same set, another order). Raises
        ``ConfigError`` when the state belongs to another dataset version (``name@version``),
        split, view, seed or shuffle setting.
        """
        ds = self.dataset
        if not isinstance(state, Mapping):  # a str was an AttributeError at state.get
            raise ConfigError(f"malformed loader state (a state is the dict state_dict() returned, got "
                              f"{type(state).__name__})")
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(f"not a packer loader state (format {state.get('format')!r}, expected {STATE_FORMAT})")
        expected = ds.identity()
        if ("mix" in state) != ("mix" in expected):
            kinds = ("a MixedDataset", "a ShardDataset")
            then, now = kinds if "mix" in state else kinds[::-1]
            raise ConfigError(f"the loader state was saved for {then} and this loader reads {now}")
        if "mix" in expected:  # a member setting recorded after the state was saved cannot be checked for it
            expected["mix"] = _as_recorded(expected["mix"], state.get("mix"))
        # a state saved before its dataset's name@version was recorded cannot be checked for it
        wrong = {k: (state.get(k), v) for k, v in expected.items()
                 if _as_sets(k, state.get(k)) != _as_sets(k, v) and not (k in UNRECORDED_BEFORE and k not in state)}
        if wrong:
            raise ConfigError("the loader state was saved for another dataset configuration: "
                              + ", ".join(f"{k} saved {_state_text(k, s)}, now {_state_text(k, v)}"
                                          + _member_differences(k, s, v) for k, (s, v) in wrong.items()))
        try:
            saved = Segment.from_json(state["segment"])
            history = tuple(Segment.from_json(seg) for seg in state["history"])
            epoch = as_integer(state["epoch"], "the state's epoch")
            skipped = state.get("skipped", 0)  # states saved before the count was kept lack it
            if isinstance(skipped, bool) or not isinstance(skipped, int | np.integer) or skipped < 0:
                raise ValueError(f"skipped={skipped!r}, expected a count of samples >= 0")
        except (KeyError, TypeError, ValueError, ConfigError) as err:
            raise ConfigError(f"malformed loader state ({err})") from err
        if saved.same_split(self._segment(0)):
            self._state = LoaderState(epoch=epoch, consumed=saved.consumed, history=history)
        else:
            self._state = LoaderState(epoch=epoch, consumed=0, history=(*history, saved))
        # the count is of the saved rank's share of this epoch: this rank's only where the state is its own,
        # saved under the same split (a state saved by rank 0 and loaded by every rank is not the others')
        own = state.get("rank") == ds.rank and saved.same_split(self._segment(0))
        self.skipped = int(skipped) if own else 0
        self.skipped_samples = []
        self._resume_pending = True
        self._epoch_calls_seen = ds.epoch_calls  # a dataset.set_epoch() made before this does not undo it
        if self._state.history:  # the rest re-split over other ranks: make_loader's check was of whole epochs
            lengths = rank_lengths(ds.epoch_order(epoch), current=self._segment(self._state.consumed),
                                   history=self._state.history)
            _warn_if_ranks_step_apart(ds, self.batch_size, self.drop_last, lengths=lengths, resumed=(epoch, saved))


def _warn_if_ranks_step_apart(dataset: PlannedDataset, batch_size: int, drop_last: bool, *,
                              lengths: Sequence[int] | None = None,
                              resumed: tuple[int, Segment] | None = None) -> None:
    """Warn when, under an initialised ``torch.distributed``, the ranks of ``dataset`` get
    different numbers of batches (``uneven="exact"`` with a sample count the ranks do not share
    evenly): in DDP the rank that runs out first leaves the others waiting forever in the next
    collective (the gradient all-reduce), a hang with no message.

    Of a whole epoch (``lengths`` None: at :func:`make_loader`), or of the rest of epoch
    ``resumed[0]`` after ``load_state_dict`` of a state saved under ``resumed[1]``: ``lengths``
    are then each rank's samples left (``drop_last`` applied), the rest re-split over these ranks."""
    if dataset.world_size < 2 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    n, w = dataset.samples, dataset.world_size
    if lengths is not None:
        per_rank = set(lengths)
        batches = sorted({-(-m // batch_size) for m in per_rank}, reverse=True)
    else:
        per_rank = {(r + 1) * n // w - r * n // w for r in range(w)} if dataset.uneven == "exact" else {len(dataset)}
        batches = sorted({m // batch_size if drop_last else -(-m // batch_size) for m in per_rank}, reverse=True)
    if len(batches) <= 1:
        return
    what = f"{n} samples over {w} ranks"
    if resumed is not None:
        epoch, saved = resumed
        what = (f"the {sum(lengths or ())} samples epoch {epoch} had left after a state saved under world size "
                f"{saved.world_size} (uneven={saved.uneven!r}), split afresh over {w} ranks")
    warnings.warn(
        f"ranks get {' or '.join(map(str, batches))} batches of {batch_size} (uneven={dataset.uneven!r}: "
        f"{what}); in DDP the rank with fewer batches leaves the others waiting "
        "forever in the next all-reduce. Pass uneven='pad' (every rank the same count, a few samples "
        "repeated) or uneven='drop' to the dataset for training", UserWarning, stacklevel=3)


#: Identity fields that states saved by older packers lack (not checked when absent).
UNRECORDED_BEFORE = ("dataset",)
#: A mix member's identity fields that states saved by older packers lack (not checked when absent).
MIX_MEMBER_UNRECORDED_BEFORE = ("shuffle_buffer",)
#: A mix member's identity fields :func:`_state_text` shows; :func:`_member_differences` names the others.
_MIX_MEMBER_SHOWN = ("as", "name", "version", "split", "view", "labels", "weight")


def _as_recorded(now: list[Any], saved: Any) -> list[Any]:
    """A mix's members as ``now`` records them, less the fields of :data:`MIX_MEMBER_UNRECORDED_BEFORE`
    that the saved state's member in the same place lacks (a state saved before they were recorded)."""
    if not isinstance(saved, list) or len(saved) != len(now):
        return now
    return [{k: v for k, v in member.items() if not (k in MIX_MEMBER_UNRECORDED_BEFORE and k not in old)}
            if isinstance(member, dict) and isinstance(old, dict) else member
            for member, old in zip(now, saved, strict=True)]


def _member_differences(key: str, saved: Any, now: Any) -> str:
    """`` (member a: shuffle_buffer saved 1024, now 2)``: the mix members' differing fields that
    :func:`_state_text` does not show, member by member; empty for anything else."""
    if key != "mix" or not isinstance(saved, list) or not isinstance(now, list) or len(saved) != len(now):
        return ""
    found = [f"member {new.get('as')}: {field} saved {old.get(field)!r}, now {new.get(field)!r}"
             for old, new in zip(saved, now, strict=True) if isinstance(old, dict) and isinstance(new, dict)
             for field in dict.fromkeys([*old, *new])
             if field not in _MIX_MEMBER_SHOWN and old.get(field) != new.get(field)]
    return f" ({'; '.join(found)})" if found else ""


def _as_sets(key: str, value: Any) -> Any:
    """A loader-state value with its views' sources and labels sorted: a view is a set, and
    states saved before ``identity`` recorded it canonically keep the order it was listed in."""
    def names(v: Any) -> Any:
        return sorted(map(str, v)) if isinstance(v, list) else v

    if key in ("sources", "labels"):
        return names(value)
    if key == "mix" and isinstance(value, list):
        return [{k: names(v) if k in ("view", "labels") else v for k, v in m.items()} if isinstance(m, dict) else m
                for m in value]
    return value


def _state_text(key: str, value: Any) -> str:
    """A loader-state value for a message: a mix as ``name@version:split[view]×weight + ...``."""
    if key != "mix" or not isinstance(value, list):
        return repr(value)
    return " + ".join(f"{m.get('as')}={m.get('name')}@{m.get('version')}:{m.get('split')}"
                      f"{'[' + ','.join(m['view']) + ']' if m.get('view') else ''}"
                      f"{'[labels ' + ','.join(map(str, m['labels'])) + ']' if m.get('labels') else ''}"
                      f"×{m.get('weight')}" for m in value if isinstance(m, dict))


def make_loader(dataset: PlannedDataset, batch_size: int, num_workers: int = 0, *,
                prefetch_factor: int | None = 2, pin_memory: bool | None = None,
                persistent_workers: bool | None = None, drop_last: bool = False, timeout: float = 0,
                multiprocessing_context: Any = None,
                collate: str | Callable[[list[Item]], Any] = "stack") -> ShardLoader:
    """A :class:`ShardLoader`: DataLoader with ``pin_memory`` when CUDA is available,
    ``persistent_workers`` when ``num_workers > 0``, ``prefetch_factor`` batches per
    worker, workers seeded from (seed, epoch, rank, worker).

    ``collate``: ``"stack"`` (B×C×H×W; a batch of several shapes raises
    :class:`MixedShapesError` naming them, their sources and the fixes), ``"list"`` (an
    :class:`ImageBatch` of C×H×W tensors, any shapes), ``"pad"`` (B×C×Hmax×Wmax plus ``size``;
    one channel count), or a function of the list of items (dicts ``image``, ``label``, ``key``):
    its return value, of any type (a dict of other names, an ``(images, labels)`` tuple), is the
    batch, handed over as it is; it is never called on an empty list (a batch whose samples were
    all skipped under ``uneven="exact"`` is left out).

    ``batch_size``, ``num_workers``, ``prefetch_factor``: any integer type (numpy's too), each kept as a
    plain ``int`` so that ``state_dict()`` stays JSON-able.

    ``prefetch_factor`` is passed to torch only when ``num_workers > 0`` (torch refuses one
    without workers), so the default needs no change for ``num_workers=0``.

    Raises ``ConfigError`` for ``batch_size < 1``, ``num_workers < 0``, ``prefetch_factor < 1``
    (whatever ``num_workers``), one of them that is not an integer (a float, a string) or an
    unknown collate.
    """
    return ShardLoader(dataset=dataset, batch_size=batch_size, num_workers=num_workers,
                       prefetch_factor=prefetch_factor, pin_memory=pin_memory,
                       persistent_workers=persistent_workers, drop_last=drop_last, timeout=timeout,
                       multiprocessing_context=multiprocessing_context, collate=collate)
