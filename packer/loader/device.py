"""``DevicePrefetcher``: move batches to the device one step ahead, convert and normalise there.

On CUDA the next batch is copied with ``non_blocking=True`` on a side stream (pinned host
memory makes that copy asynchronous) while the current step computes; before a batch is
handed out the compute stream waits for the side stream and every tensor is
``record_stream``-ed on the compute stream, so the caching allocator does not reuse its
memory early. uint8 → float32 and normalisation run on the device, on the side stream.
On CPU it is a pass-through that still converts and normalises (tests run there).

Units: ``image`` becomes float32 ``x / 255`` (0..1), then ``(x - mean) / std`` per channel,
with ``mean``/``std`` in the same 0..1 units (torchvision's convention, e.g. ImageNet
``mean=(0.485, 0.456, 0.406)``). Other integer dtypes are divided by their maximum value;
float images (say, from a ``transform``) are taken to be in 0..1 already.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from packer.errors import ConfigError
from packer.loader.dataloader import ImageTypeError, _shape_text, _type_text

_ALWAYS_THERE = ("cpu", "meta")  # torch needs no backend for these
_NO_IMAGE = object()             # a batch that is no dict, or a dict without "image"


def usable_device(name: str, what: str, *, instead: str = "--device cpu") -> torch.device:
    """``name`` as a torch device this machine has, checked before anything runs on it.

    A ConfigError (exit 2) for a string torch does not know, a device type whose backend
    torch has not got here (CUDA, MPS, XPU, ...: asked of the backend's own ``is_available``,
    or, for a type without one, of an empty tensor made on it) or an index past the backend's
    last device, instead of torch's traceback once the run has started. ``what``: how the
    caller names the value in the message (``--device cuda:1``, ``'cuda:1'``); ``instead``: how it
    names the fix, a CPU run (``--device cpu``, ``DevicePrefetcher(loader, 'cpu')``).
    """
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"{what} is not a torch device; expected cpu, cuda (cuda:N), mps or xpu") from err
    if device.type in _ALWAYS_THERE:
        return device
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    kind = device.type.upper()
    if callable(is_available):
        if not is_available():
            build = f", CUDA build: {torch.version.cuda or 'no'}" if device.type == "cuda" else ""
            raise ConfigError(f"{what}: {kind} is not available here (torch {torch.__version__}{build}); "
                              f"use {instead}")
        count = getattr(getattr(torch, device.type, None), "device_count", None)
        if device.index is not None and callable(count) and device.index >= count():
            raise ConfigError(f"{what}: this machine has {count()} {kind} device(s), {device.type}:0 to "
                              f"{device.type}:{count() - 1}")
        return device
    try:  # a type torch has no availability function for (xla, hpu, ...): ask it for an empty tensor there
        torch.empty(0, device=device)
    except (RuntimeError, NotImplementedError, ImportError, AssertionError) as err:
        raise ConfigError(f"{what}: torch {torch.__version__} cannot make tensors on {kind} here "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); use {instead}") from err
    return device


def _scale_for(dtype: torch.dtype) -> float:
    if dtype.is_floating_point:
        return 1.0
    return float(torch.iinfo(dtype).max)


def _known_channels(loader: Iterable[Any]) -> int | None:
    """The channel count of every batch of ``loader`` by its dataset's manifest: a loader of
    :func:`~packer.loader.make_loader` over samples of one shape, batched by one of packer's
    collates (by name), with no ``transform=`` (a transform or a collate of your own may change
    it); else None, and the first batch says it."""
    dataset = getattr(loader, "dataset", None)
    shape = getattr(dataset, "shape", None)
    if not isinstance(getattr(loader, "collate", None), str) or not isinstance(shape, tuple) or not shape:
        return None
    if any(getattr(d, "transform", None) is not None for d in (dataset, *getattr(dataset, "members", ()))):
        return None
    return int(shape[0])


def _not_a_tensor(image: Any, where: str, takes: str) -> ImageTypeError:
    """The error for a batch's ``image`` (``where``: which, by index and sample) that is not a torch
    tensor: the prefetcher converts ``takes`` only, and cannot tell a numpy array's layout
    (normalising an H×W×C array per channel would normalise along H)."""
    shape = getattr(image, "shape", None)
    described = _type_text(image) + (f" {_shape_text(shape)}, {getattr(image, 'dtype', '?')}"
                                      if isinstance(shape, tuple) else "")
    return ImageTypeError(
        f"DevicePrefetcher: {where} is a {described}, not a torch.Tensor: the prefetcher converts and normalises "
        f"{takes}; return tensors from the transform (albumentations: end the pipeline with ToTensorV2(); an "
        "H×W×C array is torch.from_numpy(image.transpose(2, 0, 1))) or from your collate (torch.from_numpy "
        "for a B×C×H×W array), or hand the images over under another name than \"image\" to have them moved "
        "as they are")


class DevicePrefetcher:
    """Iterate ``loader``'s batches on ``device`` with ``image`` as normalised float32.

    ``mean``/``std``: one value per channel (or one for all) in 0..1 units, or ``None``
    for plain ``x / 255``; another count is a ValueError naming it and the channel count, when
    the prefetcher is made where the loader's channel count is known by its manifest, else at
    the first batch (a 2.5D neighbour stack's channels are slice-major: each slice's windows in
    turn, so per-window values repeat once per slice). ``state_dict()`` returns the loader's state as of the last
    batch handed out (the prefetched one is not counted), so save that, not the loader's.
    A list or tuple ``image`` (mixed shapes; a collate's ``zip(*...)``) is converted element by element,
    C×H×W each. An ``image`` (or element) that is not a torch tensor, a numpy array included (its
    layout unknown: an H×W×C array would be normalised along H), is an
    :class:`~packer.loader.ImageTypeError` naming its type and the fix. A batch of a collate of
    your own (a tuple, a namedtuple, a dict of your own names, nested) has every tensor in it
    moved to the device, its structure kept; only a dict batch's ``image`` is converted.
    """

    def __init__(self, loader: Iterable[Any], device: str | int | torch.device, *,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> None:
        self.loader = loader
        # an int is torch's own shorthand for cuda:N (DDP's device=local_rank): named so before the check
        named = (f"cuda:{int(device)}" if isinstance(device, numbers.Integral) and not isinstance(device, bool)
                 else str(device))  # a numpy index too (np.argmin of the free memory)
        self.device = usable_device(named, f"DevicePrefetcher(loader, {device!r})",
                                    instead="DevicePrefetcher(loader, 'cpu')")
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        self._mean = None if mean is None else torch.as_tensor(mean, dtype=torch.float32, device=self.device)
        self._std = None if std is None else torch.as_tensor(std, dtype=torch.float32, device=self.device)
        if self._std is not None and bool((self._std == 0).any()):
            raise ValueError("std must not contain zeros")
        # as given (float64: the float32 copies would print 0.4 as 0.4000000059604645), to name them in an error
        self._given = {name: tuple(torch.as_tensor(values, dtype=torch.float64).flatten().tolist())
                       for name, values in (("mean", mean), ("std", std)) if values is not None}
        self._state: dict[str, Any] | None = None
        if (channels := _known_channels(loader)) is not None:
            self._check_channels(channels, "the dataset's samples have")

    def _check_channels(self, channels: int, holder: str) -> None:
        """Raise ValueError where ``mean`` or ``std`` has neither one value nor one per channel of
        ``channels`` (torch's broadcast would say only 'The size of tensor a (9) must match ...')."""
        for name, values in self._given.items():
            if len(values) in (1, channels):
                continue
            repeat = (f"; per-window values repeated for each of {channels // len(values)} slices are "
                      f"{name}={values} * {channels // len(values)}" if channels % len(values) == 0 else "")
            raise ValueError(
                f"DevicePrefetcher: {name} has {len(values)} values, and {holder} {channels} channels: give one "
                f"value per channel ({channels}) or one for all. A 2.5D neighbour stack's channels are "
                f"slice-major (each slice's windows in turn: 3 slices × 3 windows = 9 channels){repeat}")

    def _snapshot(self) -> dict[str, Any] | None:
        state_dict = getattr(self.loader, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch this prefetcher returned."""
        if self._state is None:
            snapshot = self._snapshot()
            if snapshot is None:
                raise TypeError("the wrapped loader has no state_dict()")
            return snapshot
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Forward to the loader's ``load_state_dict``."""
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]
        self._state = None

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader's ``set_epoch``."""
        self.loader.set_epoch(epoch)  # type: ignore[attr-defined]
        self._state = None

    def _normalise(self, image: torch.Tensor, channel_axis: int) -> torch.Tensor:
        """``image`` as float in [0, 1], minus ``mean``, over ``std``, per channel along
        ``channel_axis`` (1 for a batch, B×C×H×W or B×C×D×H×W; 0 for one image of a list)."""
        out = image.to(torch.float32)
        if out.data_ptr() == image.data_ptr():
            out = out.clone()        # float32 in (CPU pass-through): never normalise the caller's tensor in place
        out.div_(_scale_for(image.dtype))
        if self._mean is not None or self._std is not None:
            self._check_channels(int(image.shape[channel_axis]) if image.ndim > channel_axis else 1,
                                 "this batch's images have" if channel_axis else "this batch's image has")
            shape = (-1, *(1,) * (image.ndim - channel_axis - 1))
            if self._mean is not None:
                out.sub_(self._mean.view(shape))
            if self._std is not None:
                out.div_(self._std.view(shape))
        return out

    def _move(self, value: Any) -> Any:
        """``value`` with every tensor in it, however nested in dicts, lists and tuples, on the
        device; the containers are rebuilt as their own types (a namedtuple stays one)."""
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=self._cuda)
        if isinstance(value, Mapping):
            moved = {name: self._move(v) for name, v in value.items()}
            try:                     # a dict subclass (OrderedDict, defaultdict, ...) keeps its type
                clone = copy.copy(value)
                clone.update(moved)  # type: ignore[attr-defined]
                return clone
            except (TypeError, AttributeError):  # a read-only Mapping: a plain dict of the same items
                return moved
        if isinstance(value, list):  # an ImageBatch too: its packing is of host memory
            return [self._move(v) for v in value]
        if isinstance(value, tuple):
            items = [self._move(v) for v in value]
            if all(new is old for new, old in zip(items, value, strict=True)):
                return value         # nothing to move (a torch.Size, a tuple of keys)
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return value

    def _prepare(self, batch: Any) -> Any:
        """``batch`` on the device; a dict batch's ``image`` also converted and normalised."""
        moved = self._move(batch)
        image = moved.get("image", _NO_IMAGE) if isinstance(moved, Mapping) else _NO_IMAGE
        if image is _NO_IMAGE:       # a batch of a collate of your own, of other names: moved as it is
            return moved
        if isinstance(image, torch.Tensor):
            moved["image"] = self._normalise(image, channel_axis=1)
        elif isinstance(image, list | tuple):
            keys = moved.get("key")
            for i, element in enumerate(image):
                if not isinstance(element, torch.Tensor):
                    key = keys[i] if isinstance(keys, list | tuple) and i < len(keys) else None
                    sample = f" (sample {key})" if key is not None else ""
                    raise _not_a_tensor(element, f"batch['image'][{i}]{sample}",
                                        "C×H×W tensors (the channel axis first; C×D×H×W for a volume)")
            images = [self._normalise(im, channel_axis=0) for im in image]
            moved["image"] = (images if isinstance(image, list) else type(image)(*images)
                              if hasattr(image, "_fields") else type(image)(images))
        else:
            raise _not_a_tensor(image, "batch['image']", "a B×C×H×W tensor (B×C×D×H×W for volumes) or a list or "
                                "tuple of C×H×W tensors")
        return moved

    def _record(self, value: Any, stream: Any) -> None:
        """``record_stream`` every tensor of the batch handed out (all on the device, moved or
        made there by ``_prepare``), wherever it is nested."""
        if isinstance(value, torch.Tensor):
            value.record_stream(stream)
        elif isinstance(value, Mapping):
            for v in value.values():
                self._record(v, stream)
        elif isinstance(value, list | tuple):
            for v in value:
                self._record(v, stream)

    def __iter__(self) -> Iterator[Any]:
        self._state = None
        if self._stream is not None:
            # mean/std (and anything else the caller queued) were made on the compute stream
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        iterator = iter(self.loader)
        pending = self._fetch(iterator)
        while pending is not None:
            batch, state = pending
            if self._stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self._stream)
                self._record(batch, current)
            pending = self._fetch(iterator)
            self._state = state
            yield batch

    def _fetch(self, iterator: Iterator[Any]) -> tuple[Any, dict[str, Any] | None] | None:
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        state = self._snapshot()
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                return self._prepare(batch), state
        return self._prepare(batch), state
