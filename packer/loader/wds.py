"""A stock ``webdataset`` pipeline over a packed version's shards, for users who already live in
webdataset: :func:`wds_dataset`.

packer's tar shards are plain WebDataset shards (``<key>.cls``, ``.json``, ``.npy``, ...), so
``webdataset.WebDataset(paths)`` reads them as they are; what it cannot know is what the
manifest and ``_index.parquet`` know. This helper adds exactly that, as one ``map`` stage on a
stock ``webdataset.WebDataset``: every sample's checksum is checked against the one the index
records (the same check as ``ShardDataset(verify="sample")``, :mod:`packer.shards.checksum`,
over the member bytes as webdataset hands them over) and the class index in ``.cls`` is named
from the manifest's ``label_map`` (``__label_name__``). Everything else (decoding, shuffling,
batching, ``WebLoader``) is webdataset's own, chained by the caller.

``webdataset`` is imported when the function is called, not with this module (it takes
seconds to import on a cold machine).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from packer.errors import ConfigError, from_python
from packer.loader.readers import ShardReadError, load_split, mismatch_message, split_index_rows
from packer.shards.checksum import INDEX_COLUMN, members_checksum


@from_python
def wds_dataset(manifest: str | os.PathLike[str], split: str = "train", *, verify: str = "sample",
                shardshuffle: int | bool = False, handler: Callable[[BaseException], bool] | None = None,
                **options: Any) -> Any:
    """A ``webdataset.WebDataset`` over ``split``'s local tar shards (manifest order), each
    sample a dict of raw member bytes as webdataset yields it (``__key__``, ``__url__``,
    ``cls``, ``json``, ``npy``, ``mask.npy``, ...), plus ``__label_name__``: the label map's name
    for its ``.cls`` (where it has one).

    ``verify``: ``"sample"`` (default) checks each sample's xxh3 against ``_index.parquet``
    and raises a ``ShardReadError`` naming the shard, the key, the expected and found checksums
    (or, with ``handler=webdataset.warn_and_continue``, warns and skips it: webdataset's own
    policy for a failing stage); ``"off"`` checks nothing. ``shardshuffle``, ``handler`` and
    ``options`` go to ``webdataset.WebDataset`` as they are (``handler`` to the check too).
    Chain ``.decode()``, ``.shuffle(n)``, ``.batched(n)`` as with any WebDataset.

    ``ConfigError`` for a Parquet dataset, a remote one (use ``ShardDataset``, or a local copy),
    a split with no sample, or another ``verify``; ``IntegrityError`` when the index is missing or damaged.
    """
    import webdataset

    if verify not in ("off", "sample"):
        raise ConfigError(f"verify={verify!r}; wds_dataset checks 'sample' (each sample's xxh3) or 'off'")
    info = load_split(manifest, split)
    if info.format != "webdataset":
        raise ConfigError(f"{info.manifest}: a {info.format} dataset; wds_dataset reads WebDataset tar shards "
                          "(read Parquet shards with ShardDataset)")
    remote = [s.url for s in info.shards if s.url is not None]
    if remote:
        raise ConfigError(f"{info.manifest}: shards in a store ({remote[0]}); wds_dataset reads local shard files: "
                          "use ShardDataset, which streams and caches remote shards, or copy the version folder")
    if not info.shards:  # webdataset refuses an empty shard list with a bare IndexError
        raise ConfigError(f"{info.manifest}: split {split!r} holds no samples in this version (no shard); there is "
                          "nothing for a WebDataset to read: skip this split (ShardDataset reads it as empty)")
    expected: dict[str, int] | None = None
    if verify == "sample":
        table, _ = split_index_rows(info, ["key", INDEX_COLUMN], verify=True)
        expected = dict(zip(table["key"].to_pylist(), table[INDEX_COLUMN].to_pylist(), strict=True))
    names = {index: name for name, index in info.label_map.items()}
    kwargs: dict[str, Any] = {"shardshuffle": shardshuffle, "empty_check": False, **options}
    if handler is not None:
        kwargs["handler"] = handler
    dataset = webdataset.WebDataset([str(s.path) for s in info.shards], **kwargs)
    check = functools.partial(check_sample, expected=expected, names=names)
    return dataset.map(check, handler=handler) if handler is not None else dataset.map(check)


def check_sample(sample: dict[str, Any], *, expected: Mapping[str, int] | None,
                 names: Mapping[int, str]) -> dict[str, Any]:
    """One webdataset sample checked against its recorded checksum (``expected``: key →
    xxh3; None: unchecked) and given ``__label_name__``; ``ShardReadError`` on a mismatch."""
    key = sample["__key__"]
    shard = os.path.basename(str(sample.get("__url__", "?")))
    members = {name: value for name, value in sample.items() if not name.startswith("__")}
    if expected is not None:
        want = expected.get(key)
        if want is None:
            raise ShardReadError(f"{shard}: sample {key}: not in _index.parquet: the shard does not belong to this "
                                 "version; restore it or rebuild the dataset", shard=shard, key=key)
        found = members_checksum(key, members)
        if found != want:
            raise ShardReadError(f"{shard}: sample {key}: checksum_mismatch: "
                                 f"{mismatch_message(want, found, str(sample.get('__url__')))}", shard=shard, key=key)
    if "cls" in members:
        sample["__label_name__"] = names.get(int(members["cls"]))
    return sample
