"""A stock ``webdataset`` pipeline over a packed version's shards, for users who already live in
webdataset: :func:`wds_dataset`.

packer's tar shards are plain WebDataset shards (``<key>.cls``, ``.json``, ``.npy``, ...), so
``webdataset.WebDataset(paths)`` reads them as they are; what it cannot know is what the
manifest and ``_index.parquet`` know. This helper adds exactly that, as stages on a stock
``webdataset.WebDataset``: a shard whose tar headers a stock reader must not act on (a sparse
member, whose holes Python's tar reader fills to whatever size the header declares) is refused
before webdataset opens it (:func:`safe_shards`), and each shard is opened as the local file it
is (:func:`open_shards`: webdataset's own opener parses its name as a URL, cutting a folder named
``runs/exp#3`` at its ``#``); every shard read must give every sample the index lists for it (a
shard cut short, or a damaged tar header, ends webdataset's read of it early and silently: the
samples it never reached are named, :func:`whole_shards`), every sample must come from the shard the
index puts it in (a shard file swapped with another, or overwritten with a copy of one, would
otherwise deliver another shard's samples, some twice), and every sample's checksum is checked
against the one the index records (the same check as ``ShardDataset(verify="sample")``,
:mod:`packer.shards.checksum`, over the member bytes as webdataset hands them over); the class
index in ``.cls`` is named from the manifest's ``label_map`` (``__label_name__``); a member packer
does not write (a ``.pyd`` that webdataset's ``.decode()`` would unpickle) is refused. Everything
else (decoding, shuffling, batching, ``WebLoader``) is webdataset's own, chained by the caller.

``webdataset`` is imported when the function is called, not with this module (it takes
seconds to import on a cold machine).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from packer.errors import ConfigError, from_python
from packer.loader.readers import ShardReadError, load_split, mismatch_message, misplaced_message, split_index_rows
from packer.shards.checksum import INDEX_COLUMN, members_checksum
from packer.shards.members import MEMBER_EXTENSIONS
from packer.shards.tar import unsafe_member


@from_python
def wds_dataset(manifest: str | os.PathLike[str], split: str = "train", *, verify: str = "sample",
                shardshuffle: int | bool = False, handler: Callable[[BaseException], bool] | None = None,
                **options: Any) -> Any:
    """A ``webdataset.WebDataset`` over ``split``'s local tar shards (manifest order), each
    sample a dict of raw member bytes as webdataset yields it (``__key__``, ``__url__``,
    ``cls``, ``json``, ``npy``, ``mask.npy``, ...), plus ``__label_name__``: the label map's name
    for its ``.cls`` (where it has one).

    ``verify``: ``"sample"`` (default) checks each sample's xxh3 against ``_index.parquet``
    and raises a ``ShardReadError`` naming the shard, the key, the expected and found checksums,
    and one for each sample a shard read never reached (a truncated shard, a damaged tar header:
    :func:`whole_shards`), or, with ``handler=webdataset.warn_and_continue``, warns and skips it
    (webdataset's own policy for a failing stage); ``"off"`` checks nothing. ``shardshuffle``, ``handler`` and
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
    expected: dict[str, tuple[int, str]] | None = None
    listed: dict[str, tuple[int, tuple[str, ...]]] = {}
    if verify == "sample":
        table, bounds = split_index_rows(info, ["key", INDEX_COLUMN], verify=True)
        keys = table["key"].to_pylist()
        sums = table[INDEX_COLUMN].to_pylist()
        listed = {str(shard.path): (shard.bytes, tuple(keys[start:end]))
                  for shard, (start, end) in zip(info.shards, bounds, strict=True)}
        # each key's checksum and the shard it belongs in (its url, as __url__ names the shard read)
        expected = {key: (sums[row], str(shard.path)) for shard, (start, end) in zip(info.shards, bounds, strict=True)
                    for row, key in enumerate(keys[start:end], start=start)}
    names = {index: name for name, index in info.label_map.items()}
    kwargs: dict[str, Any] = {"shardshuffle": shardshuffle, "empty_check": False, **options}
    if handler is not None:
        kwargs["handler"] = handler
    dataset = webdataset.WebDataset([str(s.path) for s in info.shards], **kwargs)
    openers = [n for n, stage in enumerate(dataset.pipeline)
               if isinstance(stage, (webdataset.cache.StreamingOpen, webdataset.cache.FileCache))]
    if len(openers) != 1:  # a webdataset whose pipeline this does not know: never read unchecked
        raise RuntimeError(f"internal error: webdataset {webdataset.__version__}'s pipeline has {len(openers)} shard "
                           "openers where wds_dataset expects one; pin webdataset to the version packer requires")
    # the shards are local files, opened by path: webdataset's opener would parse each as a URL
    dataset.pipeline[openers[0]] = functools.partial(open_shards, handler=handler)
    # before a shard is opened: its tar reader would fill a sparse member's holes
    dataset.pipeline.insert(openers[0], functools.partial(safe_shards, handler=handler))
    if listed:  # before the checksum stage, so that a sample it refuses still counts as reached
        dataset = dataset.compose(functools.partial(whole_shards, listed=listed, handler=handler))
    check = functools.partial(check_sample, expected=expected, names=names)
    return dataset.map(check, handler=handler) if handler is not None else dataset.map(check)


def safe_shards(shards: Iterable[Any], *, handler: Callable[[BaseException], bool] | None) -> Iterator[Any]:
    """``shards`` (webdataset's ``dict(url=...)`` items, local paths) as they come, less each
    one a stock tar reader must not read (:func:`packer.shards.tar.unsafe_member`: a member that
    is a sparse file, whose holes Python's tar reader fills to the terabytes its header may
    declare, a link, folder or device, a member larger than the shard, a compressed file):
    ``ShardReadError`` naming the shard and the member, raised or handed to ``handler`` (its
    True: the shard is left out, and the next one read)."""
    for item in shards:
        url = str(item["url"] if isinstance(item, dict) else item)
        problem = unsafe_member(Path(url))
        if problem is None:
            yield item
            continue
        shard = os.path.basename(url)
        error = ShardReadError(f"{shard}: {problem}; the shard was not written by packer or was edited after the "
                               "build: rebuild the dataset or get it again from its source", shard=shard)
        if handler is None or not handler(error):
            raise error


def open_shards(shards: Iterable[Any], *, handler: Callable[[BaseException], bool] | None) -> Iterator[dict[str, Any]]:
    """Each of ``shards`` (webdataset's ``dict(url=...)`` items, or plain paths: local shard files)
    opened for reading, as webdataset's opener yields it (``dict(url=, stream=, local_path=)``),
    but by its path as it is: webdataset's ``StreamingOpen`` opens ``urlparse(url).path``, which
    ends a path at a ``#`` or ``?`` in a folder's name. (A ``cache_dir`` option has no cache to
    fill: the files are local already.) Each is closed when the next is asked for, or the read
    stops. An OSError opening one is raised, or handed to ``handler`` (True: the next shard is
    opened; False: no more are)."""
    for item in shards:
        path = str(item["url"] if isinstance(item, dict) else item)
        try:
            stream = open(path, "rb")
        except OSError as err:
            if handler is None:
                raise
            if handler(err):
                continue
            return
        with stream:  # the next stage reads the shard to its end before it asks for the next one
            yield {"url": path, "stream": stream, "local_path": path}


def whole_shards(samples: Iterable[dict[str, Any]], *, listed: Mapping[str, tuple[int, tuple[str, ...]]],
                 handler: Callable[[BaseException], bool] | None) -> Iterator[dict[str, Any]]:
    """``samples`` as they come, checking that each shard read (a run of samples from one
    ``__url__``) reached every sample ``listed`` for it (url → the manifest's byte count and the
    index's keys): Python's tar reader, and so webdataset, ends a shard at a damaged member header
    or where the file is cut short, and every sample after that point would be lost with nothing
    said. Each sample never reached is a ``ShardReadError`` naming it, raised or handed to
    ``handler`` (its True: go on). A read the consumer stops early is not judged."""
    current: str | None = None
    seen: set[str] = set()
    for sample in samples:
        url = str(sample.get("__url__", ""))
        if url != current:
            if current is not None:
                _reached_all(current, seen, listed, handler)
            current, seen = url, set()
        seen.add(str(sample.get("__key__")))
        yield sample
    if current is not None:
        _reached_all(current, seen, listed, handler)


def _reached_all(url: str, seen: set[str], listed: Mapping[str, tuple[int, tuple[str, ...]]],
                 handler: Callable[[BaseException], bool] | None) -> None:
    """Raise (or hand ``handler``) a ``ShardReadError`` for each of ``url``'s listed samples not in ``seen``."""
    size, keys = listed.get(url, (None, ()))
    missing = [key for key in keys if key not in seen]
    if not missing:
        return
    shard = os.path.basename(url)
    own = set(keys)
    foreign = sorted(key for key in seen if key not in own)
    if foreign:  # the file holds other samples: swapped with another shard's file, or overwritten with a copy
        homes = {key: os.path.basename(other) for other, (_, its) in listed.items() if other != url for key in its}
        where = sorted({homes[key] for key in foreign if key in homes})
        belong = (f"_index.parquet puts them in {', '.join(where)}" if where
                  else "_index.parquet does not put them in any shard of this split")
        for key in missing:
            error = ShardReadError(
                f"{shard}: sample {key}: never read: the file holds another shard's samples ({len(foreign)} of the "
                f"{len(seen)} samples read from it, from {foreign[0]}, are not this shard's: {belong}); it holds "
                f"{_count(len(seen) - len(foreign))} the shard's {len(keys)} samples; shard files were swapped, or "
                "this one overwritten with a copy of another: restore the shard from the version's own copy (or "
                "rebuild the dataset); `packer verify` on the version names every shard that holds another's samples",
                shard=shard, key=key)
            if handler is None or not handler(error):
                raise error
        return
    try:
        found = os.path.getsize(url)
    except OSError as err:
        why = f"the shard could not be read to its end ({err.strerror or err})"
    else:
        why = (f"the shard is {found:,} bytes, the manifest says {size:,}" if found != size else
               "a damaged tar header ended the read of the shard before it")
    for key in missing:
        error = ShardReadError(
            f"{shard}: sample {key}: never read: {why}, so webdataset read {len(seen)} of the shard's {len(keys)} "
            "samples; ShardDataset reads on past a damaged header from _index.parquet's offsets, `packer verify` on "
            "the version names the damaged samples; restore the shard or rebuild the dataset", shard=shard, key=key)
        if handler is None or not handler(error):
            raise error


def check_sample(sample: dict[str, Any], *, expected: Mapping[str, tuple[int, str]] | None,
                 names: Mapping[int, str]) -> dict[str, Any]:
    """One webdataset sample checked against its recorded checksum and shard (``expected``: key →
    (xxh3, the url of the shard ``_index.parquet`` puts it in); None: unchecked) and given
    ``__label_name__``; ``ShardReadError`` on a mismatch, and for a sample read from a shard the
    index does not put it in (shard files swapped, or one overwritten with a copy of another: its
    samples would otherwise pass, and be delivered twice in an epoch).

    A member packer does not write (an extension not in
    :data:`~packer.shards.members.MEMBER_EXTENSIONS`) is a ``ShardReadError`` too, with or without
    the checksum: webdataset's ``.decode()`` unpickles ``.pyd`` and ``.pickle`` members, and a
    sender who re-seals the index and manifest passes the checksum, so such a member must never
    reach the caller's stages."""
    key = sample["__key__"]
    shard = os.path.basename(str(sample.get("__url__", "?")))
    members = {name: value for name, value in sample.items() if not name.startswith("__")}
    foreign = sorted(name for name in members if name not in MEMBER_EXTENSIONS)
    if foreign:
        raise ShardReadError(
            f"{shard}: sample {key}: member {key}.{foreign[0]} is not one packer writes "
            f"(<key>.{'|'.join(MEMBER_EXTENSIONS)}): refused before any decoder sees it (webdataset's .decode() "
            "would unpickle a .pyd or .pickle member); the shard was not written by packer or was edited after "
            "the build: rebuild the dataset or get it again from its source", shard=shard, key=key)
    if expected is not None:
        entry = expected.get(key)
        if entry is None:
            raise ShardReadError(f"{shard}: sample {key}: not in _index.parquet: the shard does not belong to this "
                                 "version; restore it or rebuild the dataset", shard=shard, key=key)
        want, home = entry
        url = str(sample.get("__url__"))
        if home != url:
            raise ShardReadError(f"{shard}: sample {key}: " + misplaced_message(
                key, f"_index.parquet puts it in {os.path.basename(home)}", url), shard=shard, key=key)
        found = members_checksum(key, members)
        if found != want:
            raise ShardReadError(f"{shard}: sample {key}: checksum_mismatch: "
                                 f"{mismatch_message(want, found, str(sample.get('__url__')))}", shard=shard, key=key)
    if "cls" in members:
        sample["__label_name__"] = names.get(int(members["cls"]))
    return sample


def _count(read: int) -> str:
    """How many of a shard's samples a read reached, as the never-read message says it."""
    return "none of" if read == 0 else f"only {read} of"
