"""``ShardDataset``: a PyTorch IterableDataset over one split of a packed dataset version.

The plan (which sample, which rank, which worker, in which order) comes from
:mod:`packer.loader.sharding`; the bytes come from :mod:`packer.loader.readers`. Here the
two meet: each worker walks its shards in stream order, holds what it has read until its
turn comes (at most about ``shuffle_buffer`` samples per rank), turns samples into tensors
and applies ``transform``.

The epoch and the resume position live in a small shared-memory tensor, so
``set_epoch``/``load_state_dict`` reach DataLoader workers that persist across epochs.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import random
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.allocator import tune_allocator
from packer.errors import ConfigError, PackerError, Surface, called_from, from_python, surface
from packer.loader.cache import cache_from
from packer.loader.readers import (
    Decoded,
    Failure,
    SampleCheck,
    ShardReadError,
    SplitInfo,
    load_checksums,
    load_split,
    load_view,
    read_shard,
    split_index_rows,
)
from packer.loader.record import SampleRecord
from packer.loader.sharding import (
    UNEVEN,
    EpochOrder,
    RankPlan,
    Segment,
    derive_seed,
    epoch_order,
    plan_rank,
    shard_offsets,
    worker_indices,
)

if TYPE_CHECKING:
    from packer.manifest import Manifest

log = logging.getLogger("packer.loader")

ON_ERROR = ("raise", "skip")
#: ``verify``: no check beyond shard sizes; every sample's checksum (the default); every shard's sha256
VERIFY = ("off", "sample", "shard")
MAX_HISTORY = 8
_SEGMENT_WIDTH = 5

Item = dict[str, Any]


def verify_mode(verify: str | bool) -> str:
    """``verify`` as one of :data:`VERIFY`: ``True`` (what ``verify=True`` meant before there
    were modes) is ``"shard"``, ``False`` is ``"off"``. ``ConfigError`` for anything else."""
    if verify is True or verify is False:
        return "shard" if verify else "off"
    if verify not in VERIFY:
        raise ConfigError(f"verify={verify!r}; expected one of {VERIFY} (or True for 'shard', False for 'off')")
    return str(verify)


def as_integer(value: Any, name: str, hint: str = "") -> int:
    """``value`` as a plain ``int``: any integer type (Python's, numpy's, a one-element integer
    tensor), so that what is stored (an epoch, a rank) is JSON-able and loads under
    ``torch.load(weights_only=True)``. ``ConfigError`` naming ``name`` for anything else (a float,
    a string, a bool), ``hint`` appended to its message."""
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise ConfigError(f"{name} must be an integer, not {type(value).__name__} {value!r}{hint}")


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: the arguments, else ``torch.distributed`` when initialised,
    else the ``RANK``/``WORLD_SIZE`` environment variables, else ``(0, 1)``.

    Raises ``ConfigError`` for a rank or world size that is not an integer (a string read from
    ``os.environ``: pass ``int(...)`` of it, or leave the argument out for packer to read the
    variable), when the rank is outside ``[0, world_size)``, and for a world size over 1 with no
    rank from any of them (each process would be rank 0).
    """
    if rank is not None:
        rank = as_integer(rank, "rank", '; pass rank=int(os.environ["RANK"]), or leave rank= out (packer reads '
                                        "torch.distributed, else RANK, itself)")
    if world_size is not None:
        world_size = as_integer(world_size, "world_size", '; pass world_size=int(os.environ["WORLD_SIZE"]), or '
                                                          "leave world_size= out (packer reads torch.distributed, "
                                                          "else WORLD_SIZE, itself)")
    if rank is None or world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            default_rank, default_world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            if rank is None and world_size is not None and world_size > 1 and "RANK" not in os.environ:
                # every process would be rank 0 and read the same share: each sample world_size times
                raise ConfigError(f"world_size={world_size} without rank=: torch.distributed is not initialised and "
                                  "RANK is not set, so nothing says which rank this process is; pass rank= too, "
                                  "or initialise torch.distributed (torchrun sets RANK) before making the dataset")
            try:
                default_rank = int(os.environ.get("RANK", "0"))
                default_world = int(os.environ.get("WORLD_SIZE", "1"))
            except ValueError as err:
                raise ConfigError(f"RANK/WORLD_SIZE must be integers ({err})") from err
            if rank is None and world_size is None and default_world > 1 and "RANK" not in os.environ:
                # WORLD_SIZE exported (a job script's leftover) but no RANK: the same silent half as above
                raise ConfigError(f"WORLD_SIZE={default_world} is set in the environment but RANK is not, and "
                                  "torch.distributed is not initialised, so nothing says which rank this process "
                                  "is (each would read rank 0's share); launch with torchrun (it sets RANK), pass "
                                  "rank= and world_size=, or unset WORLD_SIZE")
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Seed torch (CPU), numpy's global RNG and ``random`` for a block; restore them after."""
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    np.random.seed(seed & 0xFFFF_FFFF)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        np.random.set_state(np_state)
        random.setstate(py_state)


_T = TypeVar("_T")


def _as_made(caller: Surface | None, items: Iterator[_T]) -> Iterator[_T]:
    """``items``, each one made under ``caller``'s surface (:func:`packer.errors.called_from`): a
    message raised while reading (access denied downloading a shard into the cache, in a
    DataLoader worker too) names the options as the dataset's maker gave them
    (``storage_options={...}`` from Python). The surface is set around each step only, so the
    consumer's own code between items runs in its own context."""
    if caller is None:
        yield from items
        return
    try:
        while True:
            with called_from(caller):
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


class PlannedDataset(IterableDataset):
    """What :class:`ShardDataset` and :class:`packer.loader.mix.MixedDataset` share: an epoch
    order over a global sample index space, this rank's plan of it, the worker split, resume
    progress in shared memory, bad-sample handling and batching. Subclasses say what the
    order is (``epoch_order``), how a worker's samples are read (``_worker_results``), how a
    decoded sample becomes an item (``_item``), and what identifies them in a loader state
    (``identity``).
    """

    seed: int
    rank: int
    world_size: int
    uneven: str
    on_error: str
    max_skipped: int
    #: Samples in one epoch of this dataset (every rank together).
    samples: int
    #: The one sample shape, or None when samples have several.
    shape: tuple[int, ...] | None

    def _init_progress(self, *, uneven: str, on_error: str, max_skipped: int) -> None:
        if uneven not in UNEVEN:
            raise ConfigError(f"uneven={uneven!r}; expected one of {UNEVEN}")
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error={on_error!r}; expected one of {ON_ERROR}")
        if isinstance(max_skipped, bool) or not isinstance(max_skipped, int | np.integer) or max_skipped < 0:
            # "5" was a bare TypeError at the comparison, 2.5 ran as 2
            raise ConfigError(f"max_skipped must be an integer >= 0 (the skipped samples an epoch allows), not "
                              f"{type(max_skipped).__name__} {max_skipped!r}")
        self.uneven, self.on_error, self.max_skipped = uneven, on_error, int(max_skipped)
        # who made the dataset (Python, or a packer command): what its reading errors name, in
        # DataLoader workers too, where nothing else says it (see _as_made)
        self._surface: Surface | None = surface()
        self.skipped = 0
        self.skipped_samples: list[str] = []
        self._orders: dict[int, EpochOrder] = {}
        #: set_epoch() calls so far and the epoch the last one asked for (a ShardLoader adopts it)
        self.epoch_calls, self.epoch_asked = 0, 0
        # [epoch, consumed, len(history), history segments...]: shared with worker processes.
        self._shared = torch.zeros(3 + _SEGMENT_WIDTH * MAX_HISTORY, dtype=torch.int64).share_memory_()

    def _warn_if_dropped(self, what: str) -> None:
        """Warn when ``uneven="drop"`` leaves every rank nothing: fewer samples than ranks."""
        if self.uneven == "drop" and 0 < self.samples < self.world_size:
            log.warning("%s: %d samples over %d ranks with uneven='drop' gives every rank floor(%d/%d) = 0 samples; "
                        "use uneven='pad' (each rank gets one, repeating) or fewer ranks", what, self.samples,
                        self.world_size, self.samples, self.world_size)

    def epoch_order(self, epoch: int) -> EpochOrder:
        """Epoch ``epoch``'s order (:meth:`_make_order`), cached for the last two epochs."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = self._make_order(epoch)
        return self._orders[epoch]

    # -- what a subclass says --------------------------------------------------------
    def _make_order(self, epoch: int) -> EpochOrder:  # pragma: no cover - abstract
        raise NotImplementedError

    def _worker_results(self, order: EpochOrder, plan: RankPlan, indices: np.ndarray
                        ) -> Generator[tuple[int, Decoded | Failure], None, None]:  # pragma: no cover
        raise NotImplementedError

    def _item(self, order: EpochOrder, sample_id: int, decoded: Decoded) -> Item:  # pragma: no cover
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:  # pragma: no cover - abstract
        """What a saved loader state must match to resume here (JSON-able)."""
        raise NotImplementedError

    @property
    def shapes(self) -> Mapping[str, Sequence[Sequence[int]]]:
        """Each source's sample shapes, to name them when a batch cannot be stacked: the sources
        of the view only (``sources=``, ``labels=``), where it is one."""
        info = getattr(self, "info", None)
        if info is None:
            return {}
        view = getattr(self, "view", None)
        present = getattr(view, "present", None)
        return info.shapes if present is None else {s: v for s, v in info.shapes.items() if s in present}

    @property
    def mask_pad(self) -> int:
        """The class id masks are padded with where a collate pads them (``collate="pad"``)."""
        info = getattr(self, "info", None)
        return info.mask_pad if info is not None else 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_orders"] = {}
        return state

    # -- epoch and progress ---------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (also in persistent workers). A
        :class:`~packer.loader.ShardLoader` driving this dataset takes the call as its own
        ``set_epoch`` at its next ``iter()`` (the later of the two calls wins)."""
        epoch = as_integer(epoch, "epoch")
        self.epoch_calls += 1
        self.epoch_asked = epoch
        self.set_progress(epoch=epoch, consumed=0, history=())

    def set_progress(self, *, epoch: int, consumed: int, history: Sequence[Segment]) -> None:
        """Resume ``epoch`` after ``consumed`` positions of this rank's sequence, after ``history``.

        Used by :class:`packer.loader.ShardLoader`; raises ``ConfigError`` past
        ``MAX_HISTORY`` world-size changes within one epoch.
        """
        if len(history) > MAX_HISTORY:
            raise ConfigError(f"the world size changed {len(history)} times within one epoch; "
                              f"at most {MAX_HISTORY} are supported")
        values = [epoch, consumed, len(history)]
        for seg in history:
            values += [seg.world_size, UNEVEN.index(seg.uneven), int(seg.drop_last), seg.batch_size, seg.consumed]
        values += [0] * (self._shared.numel() - len(values))
        self._shared.copy_(torch.tensor(values, dtype=torch.int64))

    def _progress(self, *, batch_size: int, drop_last: bool) -> tuple[int, Segment, list[Segment]]:
        values = self._shared.tolist()
        epoch, consumed, count = values[0], values[1], values[2]
        history = []
        for i in range(count):
            w, u, d, b, c = values[3 + _SEGMENT_WIDTH * i:3 + _SEGMENT_WIDTH * (i + 1)]
            history.append(Segment(world_size=w, uneven=UNEVEN[u], drop_last=bool(d), batch_size=b, consumed=c))
        current = Segment(world_size=self.world_size, uneven=self.uneven, drop_last=drop_last,
                          batch_size=batch_size, consumed=consumed)
        return epoch, current, history

    def plan(self, *, batch_size: int = 1, drop_last: bool = False) -> tuple[EpochOrder, RankPlan]:
        """This rank's remaining global sample ids for the current epoch and progress."""
        epoch, current, history = self._progress(batch_size=batch_size, drop_last=drop_last)
        order = self.epoch_order(epoch)
        return order, plan_rank(order, rank=self.rank, current=current, history=history)

    def __len__(self) -> int:
        """Samples this rank yields in a whole epoch (before ``drop_last`` in a loader)."""
        n, w, r = self.samples, self.world_size, self.rank
        if self.uneven == "exact":
            return (r + 1) * n // w - r * n // w
        return -(-n // w) if self.uneven == "pad" else n // w

    def _filled_results(self, order: EpochOrder, plan: RankPlan, indices: np.ndarray
                        ) -> Iterator[tuple[int, int, Decoded | None, str | None]]:
        """(index into ``plan.ids``, sample id, decoded or None, skip description or None).

        A failure raises (``on_error="raise"``) or is described. With ``uneven`` ``pad`` or
        ``drop`` a failure carries a stand-in instead of None: the next readable sample of this
        worker (the failures wait for it), or, for failures at the end of its share, the last.
        The next, not the last: a loader resumed mid-epoch (``load_state_dict``) has not read
        the samples before its resume point, and must fill each place as the uninterrupted
        epoch did.
        """
        fill = self.uneven != "exact"
        last: int | None = None  # the index of the last readable sample
        waiting: list[tuple[int, str]] = []
        for i, result in self._worker_results(order, plan, indices):
            if isinstance(result, Failure):
                result = self._keyed(result)
                if self.on_error == "raise":
                    raise result.error()
                if not fill:
                    yield i, int(plan.ids[i]), None, result.describe()
                else:
                    waiting.append((i, result.describe()))
                continue
            sample_id = int(plan.ids[i])
            for j, why in waiting:  # each its own arrays: a transform may work in place
                yield j, sample_id, result.repeat(), why + f"; replaced by a repeat of {result.key}"
            waiting = []
            last = i
            yield i, sample_id, result, None
        if waiting and last is not None:
            # the last sample was handed out, and maybe transformed in place: read it again
            # its readers end here (closing), not whenever the generator is collected
            with contextlib.closing(self._worker_results(order, plan, np.array([last]))) as reread:
                _, again = next(reread)
            if isinstance(again, Failure):
                raise again.error()
            for j, why in waiting:
                yield j, int(plan.ids[last]), again.repeat(), why + f"; replaced by a repeat of {again.key}"
            waiting = []
        if waiting:
            raise ShardReadError(
                f"none of the {len(waiting)} samples of this worker's share of the epoch could be read "
                f"(uneven={self.uneven!r} needs one readable sample to stand in for the skipped ones, so "
                f"that every rank yields the same number of batches); last: {waiting[-1][1]}")

    def _keyed(self, failure: Failure) -> Failure:
        """``failure`` with its sample's key from ``_index.parquet`` where the shard's own bytes
        could not give it (a damaged first member header, the samples a truncated shard lost), so
        the error and the skip name the sample, not only its position; as it was where the index
        cannot be read, and for a whole shard's defect (``bad_shard``: no one sample's)."""
        info = getattr(self, "info", None)
        if failure.key is not None or failure.reason == "bad_shard" or not isinstance(info, SplitInfo):
            return failure
        keys = self.__dict__.get("_index_keys")
        if keys is None:  # read once a process, at the first such failure
            try:
                table, bounds = split_index_rows(info, ["key"], verify=False)
            except PackerError:
                keys = {}
            else:
                column = table["key"].to_pylist()
                keys = {shard.file: column[start:end] for shard, (start, end) in zip(info.shards, bounds, strict=True)}
            self.__dict__["_index_keys"] = keys
        listed = keys.get(failure.shard, ())
        return replace(failure, key=listed[failure.position]) if 0 <= failure.position < len(listed) else failure

    def _skip(self, description: str, *, epoch: int) -> None:
        """Count a skipped sample of ``epoch``; raise past ``max_skipped``, a cap per epoch (the
        count starts again with each pass over an epoch, :meth:`_items`: the same damaged sample
        read again next epoch is not more bad data). Iterated directly or through a plain
        DataLoader: each worker process counts its own skips, which no process adds up, so each
        holds its share of the cap (``max_skipped`` split among the workers, the remainder to the
        first), and the workers together never skip more than ``max_skipped`` unsaid (each could
        skip the whole cap: 2 workers dropped 27 samples under max_skipped=20). make_loader counts
        the workers' skips in the main process against the whole cap (:meth:`iter_batches`)."""
        self.skipped += 1
        self.skipped_samples.append(description)
        log.warning("skipped %s", description)
        info = get_worker_info()
        if info is None or info.num_workers == 1:
            if self.skipped > self.max_skipped:
                raise ShardReadError(f"{self.skipped} samples skipped in epoch {epoch}, more than "
                                     f"max_skipped={self.max_skipped} (a cap per epoch); last: {description}")
            return
        share, rest = divmod(self.max_skipped, info.num_workers)
        cap = share + (1 if info.id < rest else 0)
        if self.skipped > cap:
            raise ShardReadError(f"{self.skipped} samples skipped in epoch {epoch} in this DataLoader worker, more "
                                 f"than its share ({cap}) of max_skipped={self.max_skipped} among {info.num_workers} "
                                 "workers (a cap per epoch), which count apart (make_loader counts every worker's "
                                 f"skips against the whole cap); last: {description}")

    @staticmethod
    def _worker() -> tuple[int, int]:
        """(this worker's id, workers). In a DataLoader worker process the C library's allocator is
        tuned first (:func:`packer.allocator.tune_allocator`): where samples are copied (positional
        reads, remote shards) each sample's buffer then reuses a freed one instead of faulting in
        fresh pages (the main process is the user's and is left alone)."""
        info = get_worker_info()
        if info is None:
            return 0, 1
        tune_allocator()
        return info.id, info.num_workers

    def __iter__(self) -> Iterator[Item]:
        return _as_made(getattr(self, "_surface", None), self._items())

    def _items(self) -> Iterator[Item]:
        order, plan = self.plan()
        worker, workers = self._worker()
        indices = worker_indices(len(plan.ids), batch_size=1, num_workers=workers, worker=worker)
        # the cap is per epoch: a pass over the epoch starts its count afresh (also in a persistent worker)
        self.skipped, self.skipped_samples = 0, []
        for _, sample_id, decoded, skipped in self._filled_results(order, plan, indices):
            if skipped is not None:
                self._skip(skipped, epoch=order.epoch)
            if decoded is not None:
                yield self._item(order, sample_id, decoded)

    def iter_batches(self, *, batch_size: int, drop_last: bool,
                     collate: Callable[[list[Item]], Any]
                     ) -> Iterator[tuple[Any, int, tuple[str, ...]]]:
        """This worker's batches: (collated batch, its item count, descriptions of the samples
        skipped in it); :meth:`_batches` read as the dataset's maker called it (:func:`_as_made`)."""
        return _as_made(getattr(self, "_surface", None),
                        self._batches(batch_size=batch_size, drop_last=drop_last, collate=collate))

    def _batches(self, *, batch_size: int, drop_last: bool,
                 collate: Callable[[list[Item]], Any]
                 ) -> Iterator[tuple[Any, int, tuple[str, ...]]]:
        """This worker's batches: (collated batch, its item count, descriptions of the samples
        skipped in it).

        Batch ``j`` of the rank sequence goes to worker ``j % num_workers``. A batch whose
        samples were all skipped (``uneven="exact"`` only; ``pad``/``drop`` fill skipped
        places, see the class) is still yielded, as ``(None, 0, skipped)``, so batches stay
        countable; ``collate`` is never called on an empty list (a user's collate need not
        handle one), and what it returns is never looked into (any type, any keys).
        With ``on_error="raise"`` a bad sample raises here; the caller enforces ``max_skipped``.
        """
        order, plan = self.plan(batch_size=batch_size, drop_last=drop_last)
        worker, workers = self._worker()
        indices = worker_indices(len(plan.ids), batch_size=batch_size, num_workers=workers, worker=worker)
        items: list[Item] = []
        skipped: list[str] = []
        current = -1

        def done() -> tuple[Any, int, tuple[str, ...]]:
            return (collate(items) if items else None), len(items), tuple(skipped)

        for i, sample_id, decoded, why in self._filled_results(order, plan, indices):
            batch = i // batch_size
            if batch != current:
                if current >= 0:
                    yield done()
                items, skipped, current = [], [], batch
            if why is not None:
                skipped.append(why)
            if decoded is not None:
                items.append(self._item(order, sample_id, decoded))
        if current >= 0:
            yield done()


class ShardDataset(PlannedDataset):
    """Samples of one split, each delivered exactly once per epoch across ranks × workers.

    Items are dicts: ``image`` (torch tensor C×H×W in the schema dtype, uint8 by default,
    or whatever ``transform(image)`` returns), ``key`` (str) and the dataset's targets
    (:mod:`packer.targets`): ``label`` (int64 scalar tensor) for a class target, ``target``
    (float32 L: multi-hot, or the numbers) for a multi-label or numeric one, with
    ``target_mask`` (float32 L, 1: use the entry, 0: a loss skips it) where the target is
    masked, neither when the dataset is unlabeled; with masks also ``mask`` (F×H×W class ids on the image's grid,
    uint8, or int32 for 16-bit ids). ``transform`` touches the image only: augment an image
    and its mask together on the batch (the same flip, crop or affine for both). With
    ``records=True`` each item also holds ``record``: the sample's JSON record, a
    :class:`~packer.loader.record.SampleRecord` dict (the ``.json`` member or ``metadata``
    cell: key, sample_id, source, kind, entity_id, split, shape, dtype, the target by name
    (label/label_index, labels, or target), and under
    ``metadata`` what the transform did: windows, spacing, and for a volume ``volume.affine``
    and ``volume.spacing``, for a neighbour stack ``neighbors``), and a batch a list of them;
    it costs one more small read per sample, so it is off by default.

    ``manifest``: path to ``manifest.json`` or its folder, or a URL of either
    (``s3://bucket/prefix/name/version/manifest.json``, ``file:///...``; remote shards are
    read through fsspec with ``storage_options``, e.g. ``{"endpoint_url": ...}``; with ``cache_dir``,
    or ``$PACKER_SHARD_CACHE``, remote shards are downloaded once per machine into that folder,
    kept under ``cache_limit`` bytes, and the next ``read_ahead`` shards of a worker's plan
    download while it reads: :mod:`packer.loader.cache`). ``shuffle``: permute shard order
    and pass samples through a ``shuffle_buffer``-slot buffer, deterministically for
    ``(seed, epoch)``; ``set_epoch(e)`` before each epoch. ``rank``/``world_size``: default
    from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else one process. ``uneven``:
    ``exact`` (every sample once; ranks may differ by one sample, so a DDP step can wait
    forever on the last batch), ``pad`` (every rank ``ceil(N/W)``, repeating samples from
    the start of the epoch order) or ``drop`` (every rank ``floor(N/W)``). ``verify``:
    ``"sample"`` (the default) checks every sample it delivers against the checksum
    ``_index.parquet`` records for it (xxh3-64 over all the sample's packed members:
    :mod:`packer.shards.checksum`; a flipped byte in the pixels, the label, the record or the
    mask is a ``checksum_mismatch`` naming the shard, the key, the expected and the found
    checksum; what it costs is measured in ``benchmarks/RESULTS.md``: 2-22% of the peer
    harness's read throughput over five runs, 16-30% of a one-process loader's);
    ``"shard"`` hashes each whole shard with sha256 before reading it (each worker hashes the
    shards it reads); ``"off"`` checks only shard sizes. ``True`` and ``False``, the values
    before there were modes, mean ``"shard"`` and ``"off"``. A dataset built before per-sample
    checksums is read unchecked under ``"sample"``, with a warning.
    ``transform(image) -> tensor`` runs in the worker with torch/numpy/random seeded from
    ``(seed, epoch, sample)``, so augmentations do not depend on ranks, workers or resume; the
    stacking and padding collates take tensors only (anything else, such as an H×W×C numpy array,
    is an :class:`~packer.loader.ImageTypeError` naming the transform), the list collate anything.
    ``on_error``: ``raise`` a :class:`ShardReadError` naming shard and key for a bad shard
    or sample, or ``skip`` it, count it (``skipped``, ``skipped_samples``: this epoch's) and raise
    once more than ``max_skipped`` were skipped in one epoch (the cap is per epoch: a damaged
    sample is skipped, and counted, again in every epoch that reads it). With ``uneven="exact"`` a skipped sample is
    simply missing. With ``pad`` or ``drop``, which promise every rank the same number of
    samples so that DDP steps stay in lockstep, a skipped sample's place is taken by a
    repeat of a readable sample of the same worker (the next one read, or the last one for
    failures at the end of its share, so that a resumed epoch fills each place as the
    uninterrupted one did), so no rank falls a batch behind because of bad data; a worker
    with no readable sample at all raises.

    ``sources``/``labels``: a view of the split: only the samples of these sources (names as in
    the job file and ``manifest["sample_schema"]["shapes"]``) and/or with these labels (names;
    an integer is a class id where the names are integers, else an index in the label map).
    ``_index.parquet`` says which samples those are, so the others are skipped without being
    read or decoded; everything above (exactly once across ranks × workers, the deterministic
    order, resume) holds for the view as for a whole split, and ``len()``, ``samples`` and the
    loader state count the view's samples. ``shape``: the one C×H×W shape of the view's samples
    by the manifest, None when they have several.

    Iterated directly (or through a plain DataLoader), samples are striped over workers one
    by one; :func:`packer.loader.make_loader` stripes whole batches so that the batch order
    does not depend on ``num_workers`` and can be resumed. Batching images of several shapes
    (a dataset that mixes CT windows, radiographs and photos) needs a choice: a view of one
    source (``sources=``), a build with one channel count (``transform.channels``), or a
    list/pad collate (``make_loader(..., collate="list")``, see :mod:`packer.loader.dataloader`).
    A plain DataLoader given ``collate_fn=packer.loader.collate_stack`` says so, naming the
    shapes; torch's ``default_collate`` only says "stack expects each tensor to be equal size".
    """

    @from_python
    def __init__(self, manifest: str | os.PathLike[str] | Manifest, split: str, *, shuffle: bool = True, seed: int = 0,
                 shuffle_buffer: int = 1024, rank: int | None = None, world_size: int | None = None,
                 verify: str | bool = "sample", transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 uneven: str = "exact", on_error: str = "raise", max_skipped: int = 100,
                 storage_options: Mapping[str, Any] | Sequence[str] | None = None,
                 sources: Sequence[str] | None = None,
                 labels: Sequence[str | int] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 cache_limit: int | str | None = None, read_ahead: int = 2, records: bool = False) -> None:
        super().__init__()
        self._init_progress(uneven=uneven, on_error=on_error, max_skipped=max_skipped)
        for name, value in (("seed", seed), ("shuffle_buffer", shuffle_buffer)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ConfigError(f"{name} must be an int, not {type(value).__name__} {value!r}")
        if shuffle_buffer < 1:
            raise ConfigError("shuffle_buffer must be >= 1")
        #: The local shard cache remote shards are read through (None: streamed, or a local dataset)
        self.cache = cache_from(cache_dir, cache_limit, read_ahead)
        self.info = load_split(manifest, split, storage_options=storage_options, cache=self.cache,
                               sources=sources)
        self.shuffle, self.seed, self.shuffle_buffer = shuffle, int(seed), int(shuffle_buffer)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        #: rank or world_size was passed (not taken from torch.distributed): a mix checks it against its own
        self.rank_given = rank is not None or world_size is not None
        #: ``off``, ``sample`` or ``shard`` (:data:`VERIFY`)
        self.verify, self.transform = verify_mode(verify), transform
        self.view = (load_view(self.info, sources=sources, labels=labels, verify=self.verify != "off")
                     if sources is not None or labels is not None else None)
        if self.verify == "sample":  # each shard's per-sample checksums travel with its ShardInfo to the workers
            loaded = load_checksums(self.info)
            if loaded is not None:
                sums, offsets = loaded
                self.info = replace(self.info, shards=tuple(
                    replace(shard, checksums=c, offsets=o if self.info.format == "webdataset" else None,
                            split_of=self.info)
                    for shard, c, o in zip(self.info.shards, sums, offsets, strict=True)))
        self._counts = ([len(p) for p in self.view.positions] if self.view is not None
                        else [s.samples for s in self.info.shards])
        self._offsets = shard_offsets(self._counts)
        #: Samples in this view of the split (the whole split without ``sources``/``labels``).
        self.samples = int(self._offsets[-1])
        #: The one C×H×W shape of this view's samples by the manifest, or None when they have several.
        self.shape = self.info.shape_of(self.view.present if self.view is not None else None)
        #: Whether items carry ``record`` (``records=True``)
        self.records = bool(records)
        self._check = SampleCheck(dtype=self.info.dtype, shape=self.info.shape, target=self.info.target,
                                  mask_dtype=self.info.mask["dtype"] if self.info.mask else None,
                                  layout=self.info.layout, records=records)
        self._warn_if_dropped(f"{self.info.manifest} split {split!r}")

    def identity(self) -> dict[str, Any]:
        """Name@version, split, sample count, the order's settings and the view, canonically.

        A view is a set (``load_view`` keeps the rows whose source and label are in it), so its
        sources are recorded sorted and its labels in label-map order: ``labels=["b", "a"]`` and
        ``["a", "b"]`` (or a Python set, ordered otherwise in each process) deliver the same
        batches and resume each other's states. Without shuffle the order is the packed order
        whatever the seed and ``shuffle_buffer``: the buffer is left out, and the seed too unless a
        transform draws under it (:meth:`to_item`)."""
        view = self.view
        sources = sorted(view.sources) if view is not None and view.sources is not None else None
        labels = (sorted(view.labels, key=lambda name: (self.info.label_map[name], name))
                  if view is not None and view.labels is not None else None)
        order: dict[str, Any] = {"seed": self.seed, "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer}
        if not self.shuffle:
            del order["shuffle_buffer"]
            if self.transform is None:
                del order["seed"]
        return {"dataset": f"{self.info.name}@{self.info.version}", "split": self.info.split,
                "samples": self.samples, **order, "sources": sources, "labels": labels}

    def _make_order(self, epoch: int) -> EpochOrder:
        """The whole split's order for ``epoch``."""
        return epoch_order(self._counts, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                           buffer=self.shuffle_buffer)

    # -- reading --------------------------------------------------------------------
    def _read_in_order(self, order: EpochOrder, ids: np.ndarray, *,
                       on_error: str | None = None) -> Iterator[Decoded | Failure]:
        """Results for ``ids`` in that order; shards are read in stream order, the rest held.

        ``on_error``: whose strictness the shard readers apply, this dataset's own by default (a
        :class:`~packer.loader.MixedDataset` passes its own: its members are read through it)."""
        if len(ids) == 0:
            return
        strict = (self.on_error if on_error is None else on_error) == "raise"
        unique = np.unique(ids)
        read = unique[np.argsort(order.stream_pos[unique], kind="stable")]
        shard_of = np.searchsorted(self._offsets, read, side="right") - 1
        bounds = [0, *(np.flatnonzero(np.diff(shard_of)) + 1).tolist(), len(read)]

        shard_order = [int(shard_of[lo]) for lo in bounds[:-1]]

        def source() -> Iterator[tuple[int, Decoded | Failure]]:
            for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                k = int(shard_of[lo])
                if self.cache is not None:  # read-ahead: the next shards of this worker's plan download meanwhile
                    ahead = [self.info.shards[j] for j in shard_order[n + 1:n + 1 + self.cache.read_ahead]]
                    self.cache.prefetch([s.download for s in ahead if s.url is not None])
                base = int(self._offsets[k])
                positions = read[lo:hi] - base
                if self.view is None:
                    for pos, result in read_shard(self.info.format, self.info.shards[k], positions.tolist(),
                                                  self._check, strict=strict,
                                                  verify=self.verify == "shard"):
                        yield base + pos, result
                    continue
                # a view: ask the shard for the chosen samples' own positions, hand out the view's
                chosen = self.view.positions[k][positions].tolist()
                results = read_shard(self.info.format, self.info.shards[k], chosen, self._check,
                                     strict=strict, verify=self.verify == "shard")
                for pos, (_, result) in zip(positions.tolist(), results, strict=True):
                    yield base + pos, result

        uses = Counter(ids.tolist()) if len(unique) < len(ids) else None
        held: dict[int, Decoded | Failure] = {}
        results = source()
        for g in ids.tolist():
            while g not in held:
                got = next(results, None)
                if got is None:
                    raise RuntimeError(f"internal error: the shard readers ended before sample id {g}")
                held[got[0]] = got[1]
            if uses is None:
                yield held.pop(g)
            else:  # a sample the plan repeats (padding): each use its own arrays, as a transform may work in place
                uses[g] -= 1
                kept = held[g]
                yield (kept.repeat() if isinstance(kept, Decoded) else kept) if uses[g] else held.pop(g)

    def _worker_results(self, order: EpochOrder, plan: RankPlan,
                        indices: np.ndarray) -> Generator[tuple[int, Decoded | Failure], None, None]:
        """(index into ``plan.ids``, result) for this worker's ``indices``, in order."""
        for part in (indices[indices < plan.pad_from], indices[indices >= plan.pad_from]):
            results = self._read_in_order(order, plan.ids[part])
            yield from zip(part.tolist(), results, strict=True)

    def _item(self, order: EpochOrder, sample_id: int, decoded: Decoded) -> Item:
        return self.to_item(order.epoch, sample_id, decoded)

    def to_item(self, epoch: int, sample_id: int, decoded: Decoded, *, seed: int | None = None) -> Item:
        """Tensors for one decoded sample; ``transform`` applied under a per-sample seed.

        ``seed``: the seed the transform draws under, with ``epoch`` and ``sample_id``; None is this
        dataset's own. A :class:`~packer.loader.MixedDataset` passes one derived from the mix's seed,
        which replaces its members' own."""
        image = torch.from_numpy(decoded.image)
        if self.transform is not None:
            with seeded_rng(derive_seed(self.seed if seed is None else seed, epoch, sample_id)):
                image = self.transform(image)
        item: Item = {"image": image, "key": decoded.key}
        if decoded.label is not None:
            # from_numpy of a 0-d array: a third of what torch.tensor(label) costs per sample
            item["label"] = torch.from_numpy(np.array(decoded.label, dtype=np.int64))
        if decoded.target is not None:  # multi-hot or numbers, float32 as losses take them
            item["target"] = torch.from_numpy(decoded.target.astype(np.float32))
        if decoded.target_mask is not None:  # 1: use the target entry, 0: skip it; float32 to multiply a loss by
            item["target_mask"] = torch.from_numpy(decoded.target_mask.astype(np.float32))
        if decoded.mask is not None:  # class ids as stored (uint8, or uint16 viewed as int32): .long() for a loss
            mask = decoded.mask if decoded.mask.dtype == np.uint8 else decoded.mask.astype(np.int32)
            item["mask"] = torch.from_numpy(mask)
        if decoded.record is not None:  # asked for with records=True; batches as a list in any DataLoader
            item["record"] = SampleRecord.of_json(decoded.record)
        return item

