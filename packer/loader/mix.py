"""``MixedDataset``: several packed datasets (or views of them) read as one, each by its weight.

    from packer.loader import MixedDataset, ShardDataset, make_loader

    mix = MixedDataset([(ShardDataset("build/hospital-a/<version>", "train"), 0.7),
                        (ShardDataset("build/public/<version>", "train"), 0.3)], seed=0)
    loader = make_loader(mix, batch_size=64, num_workers=4)   # state_dict/resume as for one dataset

The epoch. Member ``i`` (weight share ``p_i``, ``n_i`` samples) contributes exactly
``c_i = round(L * p_i)`` samples to an epoch of ``L`` samples (largest remainders, so the
``c_i`` add up to ``L``), and its ``c_i`` positions are spread over the epoch by a seeded
permutation. ``L`` is ``epoch_length``:

- ``"shortest"`` (the default): the epoch ends when the first member runs out, ``L = min_i n_i / p_i``.
  No sample is repeated: each member's share is a prefix of its own shuffled order, the member
  that bounds the epoch is read whole.
- ``"longest"``: the epoch ends when the last member runs out, ``L = max_i n_i / p_i``; the
  others are repeated (oversampled).
- an int ``N``: exactly ``N`` samples.

A member whose share exceeds its size goes through its samples in *passes*: every sample once
per pass, each pass in a fresh order; a share is ``c_i // n_i`` whole passes and the start of
one more. So within each member's share, every sample is delivered once before any is repeated.

Everything :class:`~packer.loader.ShardDataset` promises holds for the mix: the order is a pure
function of (seed, epoch, the members' per-shard counts, the weights); ranks take contiguous
chunks of it and workers whole batches (``uneven`` as for one dataset); a loader's
``state_dict`` resumes mid-epoch. The state carries the mix's identity (each member's dataset
name, version, split, view and weight, and, where the mix shuffles, its ``shuffle_buffer``; the
epoch length, the seed), and a state saved for another mix is refused by name.

Items. ``key`` is ``<member name>/<sample key>`` (keys are unique within one dataset only).
Class labels are remapped by *name* into the mix's ``label_map``: the first member's map, then
each further member's new names appended in order, so one index means one class in every
member. With ``records=True`` a record's ``label_index`` is in that map too (the batch's
``label``); its ``label`` name and every other field are the member's record as stored (its
``key`` without the ``<member name>/``). Multi-label and numeric members must name the same
labels/numbers in the same order;
every member must have the same dtype, layout, target kind, mask setting and ``records`` (a
:class:`~packer.errors.ConfigError` names the member and the field otherwise). Members whose
sample shapes differ meet the collate rules of one mixed-shape dataset (``collate="stack"``
names the shapes by ``member/source``; ``"list"``/``"pad"`` take them).

Each member's ``transform`` and ``shuffle_buffer`` apply to its own samples; the mix's
``seed`` (each member's order and ``transform`` draws, distinct per member), ``shuffle``, ``uneven``
and ``on_error``/``max_skipped`` replace the members' own where they are read through the mix
(the member objects keep theirs: read alone, each behaves as it was made). Ranks are the mix's: a member given
another ``rank``/``world_size`` than the mix's is refused (ConfigError), so that an explicit
rank given to the members only cannot silently hand every rank the whole mix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from packer.errors import ConfigError, from_python
from packer.loader.dataset import Item, PlannedDataset, ShardDataset, as_integer, resolve_rank
from packer.loader.readers import Decoded, Failure
from packer.loader.record import SampleRecord
from packer.loader.sharding import EpochOrder, RankPlan, derive_seed, epoch_order, random_u64
from packer.targets import TargetMismatch

EPOCH_LENGTHS = ("shortest", "longest")


def _epoch_length(value: Any) -> str | int:
    """``epoch_length`` checked: a rule of :data:`EPOCH_LENGTHS`, or a number of samples > 0 of any
    integer type (numpy's too, kept as a plain ``int`` for the state's identity), never a bool."""
    if isinstance(value, str) and value in EPOCH_LENGTHS:
        return value
    try:
        number = None if isinstance(value, str) else as_integer(value, "epoch_length")
    except ConfigError:
        number = None
    if number is None or number < 1:
        raise ConfigError(f"epoch_length={value!r}; expected one of {EPOCH_LENGTHS} or an integer number of "
                          "samples > 0")
    return number


def _not_a_pair(member: object) -> str:
    """What a MixedDataset member that is no ``(ShardDataset, weight)`` pair is, for its message."""
    if isinstance(member, ShardDataset):
        return "a ShardDataset alone (its weight left out)"
    if isinstance(member, tuple | list):
        return f"a {type(member).__name__} of {len(member)}: ({', '.join(type(m).__name__ for m in member)})"
    return f"{type(member).__name__} {member!r}"


def shares(sizes: Sequence[int], weights: Sequence[float], length: str | int) -> tuple[int, list[int]]:
    """The epoch's length ``L`` and each member's share ``c_i`` (see the module doc); the shares add up to ``L``."""
    total = float(sum(weights))
    probs = [w / total for w in weights]
    if isinstance(length, str):
        bounds = [n / p for n, p in zip(sizes, probs, strict=True)]
        # 1e-9: n / p * p must not fall a hair short of n by rounding
        L = int(math.floor(min(bounds) + 1e-9) if length == "shortest" else math.ceil(max(bounds) - 1e-9))
    else:
        L = int(length)
    exact = [L * p for p in probs]
    counts = [int(math.floor(x)) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:L - sum(counts)]:
        counts[i] += 1
    if length == "shortest":  # the bounding member is read whole, never past its end
        counts = [min(c, n) for c, n in zip(counts, sizes, strict=True)]
        L = sum(counts)
    return L, counts


@dataclass(frozen=True)
class MixOrder(EpochOrder):
    """One epoch of a mix. ``sequence`` is the mix positions ``0..L-1`` (what ranks and workers
    split); position ``q`` is sample ``local[q]`` of member ``member[q]`` in its pass
    ``passes[q]``, whose order is ``orders[member][pass]``."""

    member: np.ndarray
    local: np.ndarray
    passes: np.ndarray
    orders: tuple[tuple[EpochOrder, ...], ...]


class MixedDataset(PlannedDataset):
    """Several :class:`ShardDataset` s (datasets, splits or views) as one, sampled by weight (see module doc).

    ``members``: ``(dataset, weight)`` pairs, weights > 0 (normalised; they need not add up
    to 1). ``epoch_length``: ``"shortest"``, ``"longest"`` or a number of samples. ``names``:
    one per member, used in keys and messages (default: each dataset's name, ``.2``, ``.3``
    appended to repeats). ``counts()`` says how many samples each member gives an epoch.
    """

    @from_python
    def __init__(self, members: Sequence[tuple[ShardDataset, float]], *, epoch_length: str | int = "shortest",
                 seed: int = 0, shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 uneven: str = "exact", on_error: str = "raise", max_skipped: int = 100,
                 names: Sequence[str] | None = None) -> None:
        super().__init__()
        self._init_progress(uneven=uneven, on_error=on_error, max_skipped=max_skipped)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):  # as ShardDataset's: 1.7 is not seed 1
            raise ConfigError(f"seed must be an int, not {type(seed).__name__} {seed!r}")
        if not members:
            raise ConfigError("MixedDataset needs at least one (ShardDataset, weight) pair")
        for i, member in enumerate(members):  # before unpacking: a ShardDataset unpacks by reading its samples
            if not (isinstance(member, tuple | list) and len(member) == 2 and isinstance(member[0], ShardDataset)):
                raise ConfigError("MixedDataset members are (ShardDataset, weight) pairs, got "
                                  + _not_a_pair(member) + f" (member {i}); write [(dataset, 1.0), ...]")
        for i, (dataset, weight) in enumerate(members):  # "0.7" or True would pass float() as a number
            # a number is anything float() takes as one: int, float, numpy and 0-d torch scalars, Fraction, Decimal
            # ... and one number: a whole tensor or array (w, not w[i]) has __float__ too
            if isinstance(weight, str | bytes | bool | np.bool_) or not hasattr(weight, "__float__") \
                    or int(np.prod(getattr(weight, "shape", ()))) != 1:
                raise ConfigError(f"MixedDataset: {dataset.info.name} (member {i}) has weight {weight!r}, a "
                                  f"{type(weight).__name__}; a weight is a number > 0, e.g. (dataset, 0.7)")
        self.members = [dataset for dataset, _ in members]
        self.weights = [float(weight) for _, weight in members]
        for dataset, weight in zip(self.members, self.weights, strict=True):
            if not weight > 0 or not math.isfinite(weight):
                raise ConfigError(f"MixedDataset: {dataset.info.name} has weight {weight}; weights must be > 0")
            if dataset.samples == 0:
                raise ConfigError(f"MixedDataset: {dataset.info.name} split {dataset.info.split!r} has no samples "
                                  "(of its view); a member with nothing to give cannot be mixed by weight")
        self.names = list(names) if names is not None else _default_names(self.members)
        if len(self.names) != len(self.members) or len(set(self.names)) != len(self.names):
            raise ConfigError(f"MixedDataset: names {self.names} must be unique, one per member")
        self.epoch_length = _epoch_length(epoch_length)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        for dataset, name in zip(self.members, self.names, strict=True):
            if dataset.rank_given and (dataset.rank, dataset.world_size) != (self.rank, self.world_size):
                raise ConfigError(
                    f"MixedDataset: member {name} was made as rank {dataset.rank} of {dataset.world_size}, the mix is "
                    f"rank {self.rank} of {self.world_size}; the mix splits its epoch over the ranks itself, so pass "
                    "rank=/world_size= to MixedDataset and leave the members' at their defaults")
        for dataset, name in zip(self.members[1:], self.names[1:], strict=True):
            if dataset.records != self.members[0].records:
                raise ConfigError(
                    f"MixedDataset: {name} has records={dataset.records} but {self.names[0]} has "
                    f"records={self.members[0].records}; a batch holds each sample's record or none: make every "
                    "member with records=True, or none")
        self.info, self._label_remap = _mixed_info(self.members, self.names)
        self.samples, self._counts = shares([m.samples for m in self.members], self.weights, epoch_length)
        shapes = {m.shape for m in self.members}
        self.shape = next(iter(shapes)) if len(shapes) == 1 else None
        self._warn_if_dropped(f"MixedDataset {' + '.join(self.names)}")

    def counts(self) -> dict[str, int]:
        """Samples each member gives one epoch, by name (the same every epoch)."""
        return dict(zip(self.names, self._counts, strict=True))

    def identity(self) -> dict[str, Any]:
        """The mix's members (name@version, split, view, weight share and what else decides a member's
        order under the mix: its ``shuffle_buffer`` where the mix shuffles; the member's own seed and
        shuffle are replaced by the mix's), the epoch length, seed and shuffle."""
        total = sum(self.weights)  # shares, not weights as given: 0.7/0.3 and 7/3 are the same mix
        return {"mix": [{"name": m.info.name, "version": m.info.version, "split": m.info.split,
                         "view": own["sources"], "labels": own["labels"], "samples": m.samples,
                         "weight": round(w / total, 12), "as": n,
                         # the buffer orders the member's samples (_member_order); unshuffled it orders nothing
                         **({"shuffle_buffer": m.shuffle_buffer} if self.shuffle else {})}
                        for m, w, n, own in zip(self.members, self.weights, self.names,
                                                (m.identity() for m in self.members), strict=True)],
                "epoch_length": self.epoch_length, "samples": self.samples, "seed": self.seed,
                "shuffle": self.shuffle}

    # -- the order ---------------------------------------------------------------------
    def _member_seed(self, i: int) -> int:
        """Member ``i``'s seed under the mix: the mix's seed, not the member's own, and distinct per
        member, so two members' orders and transform draws for the same sample id are independent."""
        return derive_seed(self.seed, i)

    def _member_order(self, i: int, epoch: int, npass: int) -> EpochOrder:
        member = self.members[i]
        key = derive_seed(epoch, npass) & 0x7FFF_FFFF_FFFF_FFFF if npass else epoch
        return epoch_order(member._counts, seed=self._member_seed(i), epoch=key, shuffle=self.shuffle,
                           buffer=member.shuffle_buffer)

    def _make_order(self, epoch: int) -> MixOrder:
        """Epoch ``epoch`` of the mix (see the module doc)."""
        total = self.samples
        member = np.repeat(np.arange(len(self.members), dtype=np.int16), self._counts)
        if self.shuffle and total > 1:
            member = member[np.argsort(random_u64(derive_seed(self.seed, epoch, 3), total), kind="stable")]
        local = np.empty(total, dtype=np.int64)
        passes = np.empty(total, dtype=np.int32)
        orders = []
        for i, (m, count) in enumerate(zip(self.members, self._counts, strict=True)):
            where = np.flatnonzero(member == i)
            draws = np.arange(count, dtype=np.int64)
            passes[where] = draws // m.samples
            member_orders = tuple(self._member_order(i, epoch, p) for p in range(-(-count // m.samples)))
            if member_orders:
                sequences = np.concatenate([o.sequence for o in member_orders])
                local[where] = sequences[:count]
            orders.append(member_orders)
        return MixOrder(epoch=epoch, shard_order=np.zeros(0, dtype=np.int64),
                        sequence=np.arange(total, dtype=np.int64), stream_pos=np.zeros(0, dtype=np.int64),
                        member=member, local=local, passes=passes, orders=tuple(orders))

    # -- reading -----------------------------------------------------------------------
    def _member_results(self, order: MixOrder, i: int, local: np.ndarray,
                        passes: np.ndarray) -> Iterator[Decoded | Failure]:
        """Member ``i``'s results for ``local`` ids (of ``passes``) in that order: each run of one
        pass read by the member in its own stream order."""
        bounds = [0, *(np.flatnonzero(np.diff(passes)) + 1).tolist(), len(local)]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            # the mix's on_error, not the member's (the mix counts and raises); the member itself is left as made
            yield from self.members[i]._read_in_order(order.orders[i][int(passes[lo])], local[lo:hi],
                                                      on_error=self.on_error)

    def _worker_results(self, order: EpochOrder, plan: RankPlan,
                        indices: np.ndarray) -> Generator[tuple[int, Decoded | Failure], None, None]:
        assert isinstance(order, MixOrder)
        for part in (indices[indices < plan.pad_from], indices[indices >= plan.pad_from]):
            positions = plan.ids[part]
            member = order.member[positions]
            streams = {int(i): self._member_results(order, int(i), order.local[positions[member == i]],
                                                    order.passes[positions[member == i]])
                       for i in np.unique(member)}
            for j, i in zip(part.tolist(), member.tolist(), strict=True):
                yield j, next(streams[i])

    def _item(self, order: EpochOrder, sample_id: int, decoded: Decoded) -> Item:
        assert isinstance(order, MixOrder)
        i, npass = int(order.member[sample_id]), int(order.passes[sample_id])
        # the pass's epoch key: a sample repeated in another pass of one epoch draws afresh
        item = self.members[i].to_item(order.orders[i][npass].epoch, int(order.local[sample_id]), decoded,
                                       seed=self._member_seed(i))
        item["key"] = f"{self.names[i]}/{item['key']}"
        remap = self._label_remap[i]
        if remap is not None and "label" in item:
            item["label"] = torch.from_numpy(np.array(remap[int(item["label"])], dtype=np.int64))
        record = item.get("record")
        if remap is not None and record is not None and isinstance(record.get("label_index"), int):
            # the record names the class in the mix's map too, as the batch's label does
            item["record"] = SampleRecord({**record, "label_index": remap[record["label_index"]]})
        return item


def _default_names(members: Sequence[ShardDataset]) -> list[str]:
    names: list[str] = []
    for m in members:
        name, n = m.info.name, 1
        while name in names:
            n += 1
            name = f"{m.info.name}.{n}"
        names.append(name)
    return names


def _mixed_info(members: Sequence[ShardDataset], names: Sequence[str]) -> tuple[Any, list[dict[int, int] | None]]:
    """The mix's SplitInfo (what its samples are: target, labels, layout, mask, shapes by
    ``member/source``; no shards) and each member's class-index remap (None: identity)."""
    first = members[0].info
    target = first.target
    remaps: list[dict[int, int] | None] = []
    for m, name in zip(members, names, strict=True):
        info = m.info
        for field, mine, theirs in (("dtype", info.dtype, first.dtype), ("layout", info.layout, first.layout),
                                    ("target kind", info.target.kind, first.target.kind),
                                    ("target mask", info.target.masked, first.target.masked),
                                    ("mask", bool(info.mask), bool(first.mask)),
                                    # a padded batch's mask takes one dtype and one pad id (collate="pad"):
                                    # ids over 255 wrapped in a uint8 batch, one job's pad filled another's
                                    ("mask dtype", (info.mask or {}).get("dtype"), (first.mask or {}).get("dtype")),
                                    ("mask pad", (info.mask or {}).get("pad"), (first.mask or {}).get("pad")),
                                    # the mix's mask is the first member's: a loss sized by its classes met
                                    # another member's ids past them (torch's IndexError, target 3 out of bounds)
                                    ("mask classes", (info.mask or {}).get("classes"),
                                     (first.mask or {}).get("classes"))):
            if mine != theirs:
                fix = "rebuild one of them"
                if field == "mask classes":  # masks from DICOM (manifest mask.names) take their ids from the map
                    from_dicom = {"names" in (info.mask or {}), "names" in (first.mask or {})}
                    fix = {frozenset({False}): "give both jobs one mask.classes list, a declared id no mask holds "
                                               "being allowed, and rebuild",
                           frozenset({True}): "give both from: dicom jobs the same ids in their segments/rois (map "
                                              "a structure to each missing id, or renumber), and rebuild"}.get(
                        frozenset(from_dicom), "give the jobs the same ids: the from: dicom job's are its "
                                               "segments/rois ids, the other's its mask.classes list (a declared id "
                                               "no mask holds is allowed); then rebuild")
                raise ConfigError(f"MixedDataset: {name} has {field} {mine!r} but {names[0]} has {theirs!r}; "
                                  f"mixed members must deliver the same kind of sample ({fix}, or train on them "
                                  "separately)")
        try:  # the kind says how targets meet: class names merge (indices remapped), vector positions must agree
            target, remap = target.join(info.target)
        except TargetMismatch as err:
            raise ConfigError(f"MixedDataset: {name} does not fit {names[0]}: {err}") from err
        remaps.append(remap)
    # each member's view's sources (m.shapes), not its whole split's: a source the view leaves out is not in the mix
    shapes = {f"{name}/{source}": tuple(tuple(s) for s in found) for m, name in zip(members, names, strict=True)
              for source, found in m.shapes.items()}
    mixed = dataclasses.replace(first, name="+".join(names), version="", shards=(), target=target,
                                samples=sum(m.samples for m in members), label_map=target.label_map, shapes=shapes,
                                shape=first.shape if all(m.info.shape == first.shape for m in members) else None)
    return mixed, remaps
