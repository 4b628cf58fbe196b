"""Exact duplicates and the union-find that closes duplicate links into groups.

Exact duplicates share the sha256 of their packed pixels, or the stored pixels a DICOM reader
rendered them from (:func:`exact_groups`): a file saved again under another patient is one
whatever window each copy was given. Near copies
(re-encoded, resized, shifted, re-windowed) are found and verified by :mod:`packer.pipeline.nearcopy`;
both kinds of link are joined into groups with :class:`UnionFind`, whose members must share a
split.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.pipeline.sampletable import SampleTable

#: How many levels apart a uint8 sample's values may be and still show nothing (2 of 255, under 1 %
#: of the display range): a black border's faint pattern, a JPEG's flat blocks, a camera's dark noise.
BLANK_LEVELS_UINT8 = 2


def is_blank(pixels: np.ndarray) -> bool:
    """Whether ``pixels`` (H×W, or channels first: C×H×W, C×D×H×W; any dtype) show nothing: every
    pixel one value (in each channel: one colour, a tinted slide background as much as a white
    one), or, for uint8 (display levels), each channel within :data:`BLANK_LEVELS_UINT8` of its
    own first value. A plain or dark background tile or an empty frame, whose digest every other
    blank sample of its shape (and, for a nearly blank one, of its faint pattern) shares. Other
    dtypes (HU, raw intensities, floats) need every value of a channel equal: a few units apart
    there are data."""
    if pixels.size == 0:
        return True
    planes = pixels.reshape(pixels.shape[0], -1) if pixels.ndim >= 3 else pixels.reshape(1, -1)
    spread = BLANK_LEVELS_UINT8 if pixels.dtype == np.uint8 else 0
    # a sparse probe of each channel rejects almost every real image in microseconds; the full
    # check runs only when ~64 spread-out values of every channel lie near its first one
    first = planes[:, :1]
    probe = planes[:, :: max(1, planes.shape[1] // 64)]
    if spread == 0:
        return bool((probe == first).all()) and bool((planes == first).all())
    wide = first.astype(np.int16)
    if (np.abs(probe.astype(np.int16) - wide) > spread).any():
        return False
    return bool(((planes.max(axis=1) - planes.min(axis=1)).astype(np.int16) <= spread).all())


def exact_groups(digests: Sequence[str], stored: Sequence[str] | None = None,
                 blank: Sequence[bool] | None = None) -> list[list[int]]:
    """Indices sharing a digest: groups of size >= 2, each ascending, ordered by first index. O(n).

    With ``stored`` (each sample's :attr:`~packer.records.SpilledSample.stored_digest`, ``""``
    where none is known), two samples are also exact duplicates when they were rendered from the
    same stored pixels, and a group is every sample joined by either digest. With ``blank`` (each
    sample's :attr:`~packer.records.SpilledSample.blank`), blank samples are in no group: the
    white background tiles of two slides, or the empty frames of two patients' series, are equal
    without being copies of one image, and must not join their entities or count as a leak."""
    skip = [bool(b) for b in blank] if blank is not None else [False] * len(digests)
    by_digest: dict[str, list[int]] = {}
    for index, digest in enumerate(digests):
        if not skip[index]:
            by_digest.setdefault(digest, []).append(index)
    groups = [group for group in by_digest.values() if len(group) > 1]
    by_stored: dict[str, list[int]] = {}
    for index, digest in enumerate(stored or ()):
        if digest and not skip[index]:
            by_stored.setdefault(digest, []).append(index)
    joining = [group for group in by_stored.values() if len(group) > 1]
    if not joining:
        return sorted(groups)
    forest = UnionFind(len(digests))
    for group in (*groups, *joining):
        for a, b in zip(group, group[1:], strict=False):
            forest.union(a, b)
    members: dict[int, list[int]] = {}
    for index in sorted({i for group in (*groups, *joining) for i in group}):
        members.setdefault(forest.find(index), []).append(index)
    return sorted(members.values())


#: Leading characters of a digest that :func:`equal_text_rows` sorts by (64 bits of hex); rows
#: that agree on them are then compared whole, so a clash of prefixes joins nothing.
_PREFIX = 16


def exact_groups_of(samples: SampleTable, skip: np.ndarray | None = None) -> list[list[int]]:
    """:func:`exact_groups` of a table's ``sha256``, ``stored_digest`` and ``blank`` fields, the
    same groups in the same order, without a Python object per record: the digests are grouped by
    their first 64 bits in numpy (one sort of n integers) and only rows sharing those are compared
    as text. At 10M records the lists :func:`exact_groups` takes held ~2 GB. ``skip`` (a bool per
    row): rows in no group, as blank ones are, and joining none (a row that is not part of the
    dataset: :func:`packer.pipeline.conflicts.find_label_conflicts`)."""
    blank = samples.array("blank").astype(bool)
    if skip is not None:
        blank = blank | skip
    groups = equal_text_rows(samples, "sha256", blank, skip_empty=False)
    joining = equal_text_rows(samples, "stored_digest", blank, skip_empty=True)
    if groups is None or joining is None:  # digests of another form (validate --quick's placeholders)
        return exact_groups(samples.column("sha256"), samples.column("stored_digest"), blank.tolist())
    if not joining:
        return groups
    return joined_groups([*groups, *joining])


def joined_groups(groups: Sequence[Sequence[int]]) -> list[list[int]]:
    """``groups`` (lists of row indices) closed under shared members: each component once, its
    rows ascending, ordered by their first row. Only the rows named are held."""
    roots = components_of((a, b) for group in groups for a, b in zip(group, group[1:], strict=False))
    members: dict[int, list[int]] = {}
    for row in sorted(roots):
        members.setdefault(roots[row], []).append(row)
    return sorted(members.values())


def components_of(edges: Iterable[Sequence[int]]) -> dict[int, int]:
    """Per row named by an edge ((i, j) or (i, j, ...)), its component's id: the smallest row of
    the component, as :func:`cluster_duplicates` gives it, but holding only the rows named (a row
    no edge names is alone)."""
    pairs = [(int(edge[0]), int(edge[1])) for edge in edges]
    rows = sorted({row for pair in pairs for row in pair})
    compact = {row: k for k, row in enumerate(rows)}
    forest = UnionFind(len(rows))
    for a, b in pairs:
        forest.union(compact[a], compact[b])
    return {rows[k]: rows[root] for k, root in enumerate(forest.components())}


def equal_text_rows(samples: SampleTable, name: str, skip: np.ndarray | None = None, *, skip_empty: bool
                    ) -> list[list[int]] | None:
    """Groups (size >= 2, rows ascending, ordered by first row) of the rows whose text field
    ``name`` is equal, leaving out the rows of ``skip`` and, with ``skip_empty``, those where it
    is empty or missing; None when the values used are not digests (one length, at least
    :data:`_PREFIX` characters): the caller groups those as text."""
    digests = samples.digests(name)
    if digests is not None:  # kept as raw digests: row i's bytes sit at i × width
        held = ~(digests.null | digests.empty)
        lengths = np.where(held, 2 * digests.width, 0)   # as hex characters, as the text's lengths
        raw, missing = digests.raw, digests.null
    else:
        raw, ends = samples.text_bytes(name)
        lengths = np.diff(ends, prepend=0)
        missing = samples.field_text(name).null
    # each intermediate of n rows is let go as soon as it is used: at 10M rows each is 10-160 MB
    used = ~missing & (lengths > 0) if skip_empty else np.ones(len(lengths), dtype=bool)
    if skip is not None:
        used &= ~skip
    rows = np.flatnonzero(used)
    del used
    if not rows.size:
        return []
    width = int(lengths[rows[0]])
    if width < _PREFIX or not (lengths[rows] == width).all():
        return None
    del lengths
    width_of = digests.width if digests is not None else width   # bytes a value holds
    starts = rows * width_of if digests is not None else ends[rows] - width
    view = np.frombuffer(raw, dtype=np.uint8)
    # each value's first 16 bytes (16 hex characters: 64 bits; or up to 16 raw bytes), mixed into
    # one key; gathered a byte at a time (an index array of every row's 16 offsets was 1.3 GB at 10M)
    prefix = np.zeros((rows.size, _PREFIX), dtype=np.uint8)
    for k in range(min(_PREFIX, width_of)):
        prefix[:, k] = view[starts + k]
    halves = prefix.view(np.uint64)
    key = halves[:, 0] ^ (halves[:, 1] * np.uint64(0x9E3779B97F4A7C15))
    del prefix, halves
    order = np.argsort(key, kind="stable")  # rows of one key stay ascending
    key = key[order]
    # the sorted positions whose key another row shares: only those can be equal values
    same = key[1:] == key[:-1]
    if not same.any():
        return []
    shared = np.zeros(key.size, dtype=bool)
    shared[1:] = same
    shared[:-1] |= same
    del same
    picked = np.flatnonzero(shared)
    del shared
    keys = key[picked]
    del key
    bounds = np.concatenate(([0], np.flatnonzero(keys[1:] != keys[:-1]) + 1, [keys.size])).tolist()
    groups: list[list[int]] = []
    for begin, end in itertools.pairwise(bounds):
        by_value: dict[bytes, list[int]] = {}
        sharing = order[picked[begin:end]]
        for row, at in zip(rows[sharing].tolist(), starts[sharing].tolist(), strict=True):
            by_value.setdefault(raw[at:at + width_of], []).append(row)  # the whole value decides, not 64 bits
        groups.extend(group for group in by_value.values() if len(group) > 1)
    groups.sort()
    return groups


class UnionFind:
    """Disjoint sets over 0..n-1 with path compression and union by size (near O(1) per op)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"UnionFind size must be >= 0, got {n}")
        self._parent = list(range(n))
        self._size = [1] * n

    def find(self, item: int) -> int:
        """The representative of ``item``'s set (IndexError outside 0..n-1)."""
        parent = self._parent
        root = item
        while parent[root] != root:
            root = parent[root]
        while parent[item] != root:
            parent[item], item = root, parent[item]
        return root

    def union(self, a: int, b: int) -> bool:
        """Merge the sets of ``a`` and ``b``; False if they were already one set."""
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return False
        if self._size[root_a] < self._size[root_b]:
            root_a, root_b = root_b, root_a
        self._parent[root_b] = root_a
        self._size[root_a] += self._size[root_b]
        return True

    def components(self) -> list[int]:
        """Component id per item; the id is the smallest member index, so runs agree. O(n)."""
        smallest: dict[int, int] = {}
        return [smallest.setdefault(self.find(item), item) for item in range(len(self._parent))]


def cluster_duplicates(n: int, edges: Iterable[Sequence[int]]) -> list[int]:
    """Component id (smallest member index) per item 0..n-1, from (i, j) or (i, j, ...) edges."""
    forest = UnionFind(n)
    for edge in edges:
        forest.union(edge[0], edge[1])
    return forest.components()


#: How the ``sha256`` of a sample ``validate --quick`` did not decode begins (its key follows):
#: no two are equal, and none is a pixel digest
NOT_DECODED = "not-decoded:"


@dataclass(frozen=True)
class SharedInstance:
    """Samples of several entities whose files carry one SOP Instance UID (by its digest,
    :attr:`~packer.records.Sample.instance`): ``keys`` and ``entities`` of its samples, in sample
    order, one entry per entity (its first sample); ``same_pixels``: whether all their packed
    pixels are equal (then also exact duplicates, which the audit reports and the split keeps together),
    None where they were not decoded (``validate --quick``: the UID comes from the header)."""

    keys: tuple[str, ...]
    entities: tuple[str, ...]
    same_pixels: bool | None


def shared_instances(instances: Sequence[str], entities: Sequence[str | None], keys: Sequence[str],
                     digests: Sequence[str]) -> list[SharedInstance]:
    """The unique ids (``instances``; ``""``: none known) that samples of two or more entities
    share, in order of their first sample. A DICOM SOP Instance UID names one image the world
    over, and a multi-frame file's samples share their file's: one held by two patients' files
    is a mix-up, not a copy a series job would see (one file exported twice)."""
    rows: dict[str, list[int]] = {}
    for i, instance in enumerate(instances):
        if instance:
            rows.setdefault(instance, []).append(i)
    found = []
    for members in rows.values():
        first: dict[str, int] = {}
        for i in members:
            first.setdefault(entities[i] or "", i)
        if len(first) > 1:
            found.append(SharedInstance(keys=tuple(keys[i] for i in first.values()), entities=tuple(first),
                                        same_pixels=_same_pixels([digests[i] for i in members])))
    return found


def _same_pixels(digests: Sequence[str]) -> bool | None:
    """Whether samples of these packed-pixel digests are equal; None where one was not decoded."""
    if any(digest.startswith(NOT_DECODED) for digest in digests):
        return None
    return len(set(digests)) == 1


def shared_instances_of(samples: SampleTable) -> list[SharedInstance]:
    """:func:`shared_instances` of a table's ``instance``, ``entity``, ``key`` and ``sha256``
    fields, without a Python object per record: only the rows that share a UID are read."""
    groups = equal_text_rows(samples, "instance", skip_empty=True)
    if groups is None:
        return shared_instances(samples.column("instance"), samples.column("entity"), samples.column("key"),
                                samples.column("sha256"))
    found = []
    for members in groups:
        first: dict[str, int] = {}
        for i in members:
            first.setdefault(samples.value("entity", i) or "", i)
        if len(first) > 1:
            found.append(SharedInstance(keys=tuple(samples.value("key", i) for i in first.values()),
                                        entities=tuple(first),
                                        same_pixels=_same_pixels([samples.value("sha256", i) for i in members])))
    return found


def shared_instances_warning(found: Sequence[SharedInstance], job_path: Path) -> str | None:
    """A sentence for the build's and validate's stderr naming the first shared UID's entities and
    sample keys (pseudonyms under PHI, as the table holds them; never the UID), or None."""
    if not found:
        return None
    first = found[0]
    named = ", ".join(f"{entity} ({key})" for entity, key in zip(first.entities, first.keys, strict=True))
    pixels = ("pixels not compared (headers only)" if first.same_pixels is None
              else "the same pixels" if first.same_pixels else "different pixels")
    return (f"{len(found):,} SOP Instance UID(s) are each carried by files of several entities, e.g. one by the "
            f"samples of {named}, with {pixels}; a UID names one image the world over, so one file's header was "
            "edited or an anonymiser mapped two patients' files onto one UID: check which patient each belongs to "
            f"(`packer locate {job_path} KEY` names a sample's file); they are packed as they are")
