"""A sample's JSON record as the loader hands it over (``ShardDataset(records=True)``), and how
a batch of them collates: a list, in :func:`~packer.loader.make_loader` and in a plain
``torch.utils.data.DataLoader`` alike.

A record is the ``.json`` member of a tar shard or the ``metadata`` cell of a Parquet row
(:func:`packer.shards.encode.encode_sample` writes it): ``key``, ``sample_id``, ``source``,
``kind``, ``entity_id``, ``split``, ``shape``, ``dtype``, ``metadata``, the target as names
(``label`` and ``label_index`` for classes; ``labels``, the positive labels' names, any number
of them, and ``ignored_labels`` for multi-label; ``target``, name → number, for numeric;
nothing when unlabeled), and where there are some ``path`` (under ``phi.mode: keep``) and
``extra`` (the table row's other cells, or the fields a path pattern read).

torch's ``default_collate`` goes into a dict key by key and stacks what it finds, so a batch of
plain dicts fails on the first field whose length varies (a multi-label ``labels`` list: "each
element in list of batch should be of equal size"), a ``None``, or a key one record lacks (a
source's own ``metadata``). :class:`SampleRecord` is a dict that torch collates as a list of
records: it is registered in ``default_collate_fn_map``, the extension point torch's
``default_collate`` documents ("in-place modify default_collate_fn_map").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils import collate as _torch_collate


class SampleRecord(dict[str, Any]):
    """One sample's record, a plain dict of JSON values (keys: see the module doc). A batch of
    them collates to a list of them, whichever collate runs."""

    @classmethod
    def of_json(cls, data: bytes | str) -> SampleRecord:
        """The record a ``.json`` member or ``metadata`` cell holds. The loader's readers have
        checked it already (:func:`~packer.shards.members.record_defect`: a sample whose record is
        not a JSON object is a defect, skipped under ``on_error="skip"``); ``ValueError`` for data
        that is not one, for any other caller."""
        parsed = json.loads(data)
        if not isinstance(parsed, dict):
            raise ValueError(f"a sample record is a JSON object, not a JSON {type(parsed).__name__}")
        return cls(parsed)


def collate_records(batch: list[SampleRecord], *, collate_fn_map: dict[type, Callable[..., Any]] | None = None
                    ) -> list[SampleRecord]:
    """A batch's records as a list, in sample order (never stacked field by field)."""
    return list(batch)


# torch looks the element's exact type up first, so a SampleRecord never reaches its dict branch
_torch_collate.default_collate_fn_map[SampleRecord] = collate_records
