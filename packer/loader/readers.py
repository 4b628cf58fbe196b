"""Read samples out of one shard (tar or Parquet), and the split's entry in the manifest.

The shard format, in both directions, is :mod:`packer.shards`: this module applies the
loader's policy (which positions, size and hash checks, what a sample must look like, what a
failure is) to the readers there. No torch here: readers return numpy arrays. Nothing is ever
unpickled (``.npy`` members go through :func:`packer.shards.members.load_npy`), tar members
are never extracted to disk, and a member name that :func:`packer.shards.members.parse_member_name`
refuses (``/``, ``..``, absolute paths) or a member that is not a regular file (a link) stops
the scan as a defect of the shard.

Per-sample checks: where a shard's :class:`ShardInfo` carries ``checksums`` (the dataset's
``verify="sample"``, the default: :func:`load_checksums` reads them from ``_index.parquet``),
every reader hashes each sample's bytes as it reads them (:mod:`packer.shards.checksum`; the
pixels where they land, never read twice) and :func:`against_index` turns a mismatch into a
``checksum_mismatch`` failure naming the shard, the key, the expected and the found checksum.

Every reader yields exactly one ``(position, Decoded | Failure)`` per requested position,
in ascending position order, whatever is wrong with the file: the caller decides whether a
:class:`Failure` raises (:class:`ShardReadError`) or is skipped and counted.

Tar images are not copied at all: the shard is memory-mapped privately (copy-on-write,
:func:`packer.shards.tar.map_shard`) and, for packer's own ``.npy`` header (numpy's
version-1.0 header of a C-order numeric array), the image (and, in turn, the tensor) is a
view of the map; the collate's stack is the one copy out of the page cache
(:func:`packer.shards.tar.read_tar_sample`). Where a shard cannot be mapped (or with
``PACKER_TAR_MMAP=0``), one ``pread`` fetches the ``.cls`` member and the npy header
together and ``preadv`` reads the pixels straight into the ``np.empty`` array that becomes
the image. Any other npy form is read whole and decoded by ``np.load(allow_pickle=False)``.

Parquet images are zero-copy views (:func:`packer.shards.parquet.read_parquet_samples`): the
shard is opened with ``pa.memory_map``, read in record batches of ``PARQUET_ROWS`` rows, and
each ``image`` cell becomes an ``np.frombuffer`` view on the record batch's Arrow data buffer
(no copy from Arrow to numpy to torch; Arrow copies the cells once out of the page cache
because Parquet stores byte arrays length-prefixed). Arrow's reader allocates mutable
buffers, so the view is writable; a view that is not writable or not aligned for its dtype is
copied. A held view keeps its record batch alive, so at most ``PARQUET_ROWS`` samples' bytes
per held sample.

Remote shards (a manifest given as an ``s3://`` or other fsspec URL) are read through
fsspec: tar shards as one sequential stream (:func:`packer.shards.tar.stream_tar_samples`,
stopping after the last wanted sample, and read on from the next sample's offset past a damaged
member header where ``_index.parquet``'s offsets are loaded), Parquet shards through a seekable
fsspec file. With
``verify`` the shard is first copied into a spooled temporary file while it is hashed, so the
bytes decoded are the bytes hashed. ``file://`` URLs are local paths.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import numbers
import os
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import numpy as np

from packer import storage
from packer.errors import ConfigError, IntegrityError, a_type, from_python, surface
from packer.files import file_sha256
from packer.loader.cache import ShardCache
from packer.shards.checksum import INDEX_COLUMN, describe, members_checksum
from packer.shards.members import Decoded, SampleDefect, decode_members, record_defect
from packer.shards.tar import (
    TarIndex,
    TarSample,
    map_shard,
    read_member_bytes,
    read_tar_sample,
    resume_scan,
    scan_tar,
    stream_tar_samples,
    tar_sample_checksum,
)
from packer.storage import MANIFEST_FILE
from packer.targets import Target
from packer.targets.base import DECIMAL

if TYPE_CHECKING:
    from packer.manifest import Manifest

log = logging.getLogger("packer.loader")
PARQUET_ROWS = 64
#: A remote shard read with ``verify`` is held in memory up to this size, then on disk.
SPOOL_BYTES = 64 << 20


#: The text PyTorch's DataLoader makes of an error raised in a worker process, which it passes
#: to the error's type to raise it again (``torch._utils.ExceptionWrapper.reraise``): its own
#: words, the worker's traceback, and last the error's own message
_WORKER_TEXT = re.compile(r"Caught (?P<type>\w+) (?P<where>in DataLoader worker process \d+)\.\n"
                          r"Original (?P<trace>Traceback .*)\n(?:[\w.]+\.)?(?P=type): (?P<message>.*)\Z", re.S)
#: The start of a sample's message (:meth:`Failure.describe`): the shard file and the key
_SAMPLE_TEXT = re.compile(r"(?P<shard>[^\s:/]+\.(?:tar|parquet)): (?:sample (?P<key>[^\s:]+): )?")


def own_message_first(message: str) -> tuple[str, str | None]:
    """``message`` with the error's own message first where it is the text a plain
    ``torch.utils.data.DataLoader`` makes of an error raised in a worker ("Caught X in
    DataLoader worker process 0. Original Traceback ... X: <its message>"), the worker and its
    traceback after it; and that own message (None: ``message`` is not such a text, and is
    returned as it is). For packer's errors that cross the worker boundary by their message."""
    wrapped = _WORKER_TEXT.match(message)
    if wrapped is None:
        return message, None
    own = wrapped["message"].strip()
    return (f"{own}\n\n(raised {wrapped['where']}; its traceback, as PyTorch's DataLoader passes it on:\n"
            f"{wrapped['trace'].rstrip()})"), own


class ShardReadError(RuntimeError, IntegrityError):
    """A shard or sample could not be read: names the shard file and, where known, the key.

    A ``RuntimeError`` (what PyTorch re-raises from DataLoader workers) and a packer
    ``IntegrityError`` (exit code 5 at the CLI). Constructible from the message alone, so
    it crosses the worker boundary with its type intact; from the text a plain
    ``torch.utils.data.DataLoader`` makes of it in a worker ("Caught ShardReadError in
    DataLoader worker process 0. Original Traceback ..."), its own message comes first again,
    its shard and key read back from it, and the worker's traceback follows.
    """

    def __init__(self, message: str, *, shard: str | None = None, key: str | None = None) -> None:
        message, own = own_message_first(message) if shard is None and key is None else (message, None)
        if own is not None:
            named = _SAMPLE_TEXT.match(own)
            if named is not None:
                shard = named["shard"]
                key = named["key"] if named["key"] is not None and not named["key"].startswith("#") else None
        super().__init__(message)
        self.shard = shard
        self.key = key


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a split, as the manifest lists it.

    A local shard has an absolute ``path`` and ``url`` None; a remote one has its ``url``
    (read with ``storage_options``) and ``path`` is only its file name; with a ``cache`` a
    remote shard is read from its local cache entry (:mod:`packer.loader.cache`).
    """

    file: str
    path: Path
    bytes: int
    sha256: str
    samples: int
    url: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    cache: ShardCache | None = field(default=None, compare=False, hash=False)
    #: Each sample's checksum by its position in the shard (``_index.parquet``'s ``xxh3``
    #: column), which the readers check every sample against; None: samples are not checked
    checksums: np.ndarray | None = field(default=None, compare=False, hash=False, repr=False)
    #: Each sample's byte offset in a tar shard by its position (``_index.parquet``'s ``position``
    #: column), loaded with ``checksums``: a memory-mapped, positional or streamed read resumes past a
    #: damaged member header at the next sample's offset (:func:`~packer.shards.tar.resume_scan`,
    #: :func:`~packer.shards.tar.stream_tar_samples`); None: the samples after such a header are lost with it
    offsets: np.ndarray | None = field(default=None, compare=False, hash=False, repr=False)
    #: The split this shard is of, loaded with ``checksums``: a checksum mismatch is told apart from
    #: another shard's sample by the shard's rows of ``_index.parquet`` (read only then:
    #: :func:`against_index`); where a Parquet shard's own ``key`` or ``label`` pages do not decode,
    #: those cells are read from its rows (only then; every sample delivered still checked against
    #: its checksum, which covers both); None: the rows of such a page are lost with it
    split_of: SplitInfo | None = field(default=None, compare=False, hash=False, repr=False)
    #: The store's URL where ``path`` is the shard cache's copy of it (:func:`_read_cached`): a
    #: sample found damaged there is the copy's damage (the store's may be intact); the copy is
    #: dropped from the cache, and the next read fetches the shard again
    cached_from: str | None = field(default=None, compare=False, hash=False)

    @property
    def download(self) -> tuple[str, str, int, str, Any]:
        """What :meth:`ShardCache.prefetch` needs of a remote shard: url, sha256, bytes, file, options."""
        return (self.url or "", self.sha256, self.bytes, self.file, dict(self.storage_options))

    @property
    def location(self) -> str:
        """Where the shard is, as a user would type it."""
        return self.url if self.url is not None else str(self.path)


@dataclass(frozen=True)
class SplitInfo:
    """The manifest fields the loader reads, for one split.

    ``label_map``: label name → index (class or multi-hot position). ``dtype``/``shape``: the sample schema (``shape``
    is ``None`` when samples vary in size); ``shapes``: each source's shapes (the schema's
    ``shapes``; empty where the manifest has none). ``shards`` in manifest order. ``index``:
    the manifest's ``_index.parquet`` entry (file, sha256, bytes), ``None`` where it has none.
    """

    manifest: Path | str
    name: str
    version: str
    format: str
    split: str
    label_map: dict[str, int]
    dtype: str
    shape: tuple[int, ...] | None
    shards: tuple[ShardInfo, ...]
    samples: int
    shapes: Mapping[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    index: Mapping[str, Any] | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: The dataset's target (``packer.targets``): what ``label``/``target`` a sample carries.
    target: Target = field(default_factory=lambda: Target("class"))
    #: The manifest's ``mask`` (dtype, classes) where every sample carries a mask, else None.
    mask: Mapping[str, Any] | None = None
    #: ``CHW``, or ``CDHW`` for volumes (``sample: volume``)
    layout: str = "CHW"

    @property
    def mask_pad(self) -> int:
        """The class id the dataset's masks are padded with (the manifest's ``mask.pad``: the id
        ``fit`` pads with, which a loss may ignore; 0, background, where it names none)."""
        return int(self.mask.get("pad") or 0) if self.mask else 0

    def shape_of(self, sources: Sequence[str] | None = None) -> tuple[int, ...] | None:
        """The one C×H×W shape of the samples of ``sources`` (all: None), by the manifest; None
        when they have several (or the manifest does not say)."""
        if sources is None:
            return self.shape
        shapes = {shape for source in sources for shape in self.shapes.get(source, ())}
        return next(iter(shapes)) if len(shapes) == 1 else None

    def describe_shapes(self, sources: Sequence[str] | None = None) -> str:
        """``ct 1×64×64, 2×64×64; photos 3×64×64``: each source's shapes (of ``sources`` only,
        when given: a view's), as the manifest lists them."""
        return "; ".join(f"{source} {', '.join('×'.join(map(str, s)) for s in shapes)}"
                         for source, shapes in sorted(self.shapes.items())
                         if sources is None or source in sources) or "(the manifest lists no shapes)"


def _view_dtype(path: Path | str, schema: Mapping[str, Any], sources: Sequence[str] | None) -> str:
    """The one dtype of the samples of ``sources`` in a dataset whose samples have several
    (``sample_schema.dtypes``: each source's), or ConfigError naming each source's dtype and the
    view that reads it. Sources the dataset lacks are left to the view's own check."""
    dtypes: Mapping[str, list[str]] = schema.get("dtypes") or {}
    if not dtypes:  # a manifest written before each source's dtype was recorded
        raise ConfigError(f"{path}: the samples have several dtypes (sample_schema.dtype is null) and the manifest "
                          "does not say which source has which; rebuild it with this packer, then read one source "
                          f"at a time ({surface().view(python='ShardDataset(..., sources=[...])')})")
    if sources is not None:  # a string: load_view refuses it with its own message
        sources = [sources] if isinstance(sources, str) else [str(s) for s in _view_names(sources, "sources",
                                                                                          "source names")]
    chosen = {dtype for source in (sources or ()) for dtype in dtypes.get(source, ())}
    if sources is not None and len(chosen) == 1:
        return next(iter(chosen))
    each = ", ".join(f"{source} {'/'.join(found)}" for source, found in sorted(dtypes.items()))
    single = [source for source, found in sorted(dtypes.items()) if len(found) == 1]
    # named as the caller asks for a view: the call's sources=[...], or a command's --sources
    view = (f"{surface().view(single[:1], python=f'ShardDataset(..., sources=[{single[0]!r}])')}, one view per dtype"
            if single else "a source of one dtype")
    given = surface().view(sources or (), python=f"sources={list(sources or ())}")
    asked = f" ({given} hold {', '.join(sorted(chosen))})" if sources is not None else ""
    raise ConfigError(f"{path}: the sources' samples have different dtypes ({each}), and a batch holds one{asked}: "
                      f"read {view}, or rebuild with one output dtype for every kind (transform.dicom.output, "
                      "transform.nifti.output; images are uint8)")


@from_python
def load_split(manifest: str | os.PathLike[str] | Manifest, split: str, *,
               storage_options: Mapping[str, Any] | Sequence[str] | None = None, cache: ShardCache | None = None,
               sources: Sequence[str] | None = None) -> SplitInfo:
    """Read ``manifest.json`` (the file or its folder) and return ``split``'s shards.

    ``manifest`` is a local path, a ``file://`` URL or an fsspec URL (``s3://bucket/...``,
    read with ``storage_options``: a mapping, or the command line's ``KEY=VALUE`` strings,
    :func:`storage_options_given`), or the :class:`~packer.manifest.Manifest` that ``packer.build``
    and ``packer.open`` return, read again from its ``location``. The manifest is read by
    :func:`packer.manifest.read_manifest`:
    IntegrityError when it cannot be read, is from a newer packer, names a file outside its
    version folder, breaks ``schemas/manifest.schema.json`` (the message names the field; a
    sealed manifest, whose content still hashes to its dataset_hash, is checked against the
    schema only where this code cannot read it: the fields it reads, ``format_version``, the
    ``index`` entry and the split's shard entries, are checked on every open, :func:`_unread_field`),
    or was edited after the build (its content no
    longer hashes to its ``dataset_hash``);
    ``ConfigError`` when the store cannot be reached. The shards' bytes are not hashed here
    (``packer verify`` and ``verify="shard"`` do that). On top of the schema the loader needs one numpy dtype, C×H×W
    shapes, and shards that add up to the split's sample count (IntegrityError otherwise);
    ``ConfigError`` when ``split`` is not in the manifest (the message lists the splits), or when the
    build that wrote the version failed its bad-sample threshold (exit 3: the version is its report's,
    not one to train on: :func:`packer.badsamples.failed_build`). A dataset
    whose sources' samples have different dtypes is read through a view of ``sources`` of one
    dtype (``ConfigError`` otherwise, naming each source's dtype).
    """
    from packer.manifest import Manifest, read_manifest  # pyarrow: not in every worker

    if isinstance(manifest, Manifest):  # what packer.build returns: checked again as any open checks it
        manifest = manifest.location

    # the content must still hash to its dataset_hash (an edited label_map would otherwise deliver
    # other classes), and a sealed manifest was checked against the schema by the build that
    # wrote it: not again here (jsonschema's import is 0.1 s of a start; the hash, 0.2 ms)
    options = storage_options_given(storage_options)
    doc = read_manifest(manifest, storage_options=options, schema_if_sealed=False)
    unread = _unread_field(doc.data, split)
    if unread is None:
        try:
            return _split_info(doc, split, options, cache, sources)
        except (KeyError, TypeError, AttributeError, IndexError) as err:
            _refuse_unread(manifest, options, doc, f"the manifest lacks what this packer reads ({err!r})", err)
    _refuse_unread(manifest, options, doc, f"manifest field {unread}", None)


def storage_options_given(storage_options: object) -> dict[str, Any]:
    """``storage_options`` as the loader keeps them (None: none): a mapping, or the command line's
    ``KEY=VALUE`` strings (a list or tuple), parsed as ``--storage-option`` parses them
    (:func:`packer.storage.parse_storage_options`: JSON values, dotted keys nest), as
    ``packer.build`` takes them. Anything else, a lone string included, is a ConfigError naming
    its type only: the options hold credentials, and the message must never repeat them."""
    if storage_options is None:
        return {}
    if isinstance(storage_options, Mapping):
        return dict(storage_options)
    if isinstance(storage_options, list | tuple) and all(isinstance(pair, str) for pair in storage_options):
        return storage.parse_storage_options(storage_options)
    raise ConfigError(f"storage_options: {a_type(storage_options)} (not shown: it may hold credentials); "
                      "give a mapping of the filesystem's options, as in "
                      "storage_options={'endpoint_url': 'http://127.0.0.1:9000'}, or a list of the command line's "
                      "KEY=VALUE strings, as in storage_options=['endpoint_url=http://127.0.0.1:9000']")


def _refuse_unread(manifest: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, doc: Manifest,
                   what: str, cause: Exception | None) -> NoReturn:
    """Raise IntegrityError for a sealed manifest this code cannot read (written by a packer of
    another format, or edited and re-sealed with the README's recipe): the schema's own message
    names the field where the schema refuses it (read_manifest raises it, saying whose it may be),
    else ``what`` does."""
    from packer.manifest import read_manifest

    read_manifest(manifest, storage_options=storage_options, check_hash=False)
    raise IntegrityError(f"{doc.path or doc.location}: {what}; the loader cannot read this manifest: read it with "
                         "the packer that built it, or rebuild the dataset with this packer") from cause


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unread_field(data: Mapping[str, Any], split: str) -> str | None:
    """``<field>: <what is wrong>`` for the first field the loader reads that is not as it reads
    it, or None: ``format_version`` this packer's (the integer), the ``index`` entry's file,
    sha256, bytes and rows, and ``split``'s sample count and shard entries. The build checked these
    against the schema before sealing; a sealed manifest skips the schema here (jsonschema costs
    0.1 s of a start: this check costs microseconds), and one sealed by hand or by a packer of
    another format must still fail with the field named, not with a KeyError deep in a read."""
    from packer.manifest import FORMAT_VERSION

    version = data.get("format_version")
    if not _is_int(version) or version != FORMAT_VERSION:
        return f"format_version: {version!r}, expected the integer {FORMAT_VERSION}"
    index = data.get("index")
    if index is not None:  # a manifest of a packer before the index: the views that need it say so
        if not isinstance(index, dict):
            return f"index: {index!r} is not an object"
        for name, fits, expected in _INDEX_FIELDS:
            if not fits(index.get(name)):
                return f"index/{name}: {index.get(name, 'missing')!r}, expected {expected}"
    entry = (data.get("splits") or {}).get(split) if isinstance(data.get("splits"), dict) else None
    if entry is None:
        return None  # no such split: _split_info names the splits there are
    if not isinstance(entry, dict) or not _is_int(entry.get("samples")) or not isinstance(entry.get("shards"), list):
        return f"splits/{split}: expected an object with samples (an integer) and shards (a list)"
    for i, shard in enumerate(entry["shards"]):
        if _plain_shard(shard):
            continue
        if not isinstance(shard, dict):
            return f"splits/{split}/shards/{i}: {shard!r} is not an object"
        for name, fits, expected in _SHARD_FIELDS:
            if not fits(shard.get(name)):
                return f"splits/{split}/shards/{i}/{name}: {shard.get(name, 'missing')!r}, expected {expected}"
    return None


def _plain_shard(shard: object) -> bool:
    """:data:`_SHARD_FIELDS`' checks in one expression: a manifest lists thousands of shards, and
    this is on every open (about 1 µs a shard, a tenth of what hashing the manifest costs)."""
    if type(shard) is not dict:
        return False
    file, size, digest, samples = shard.get("file"), shard.get("bytes"), shard.get("sha256"), shard.get("samples")
    return (type(file) is str and file != "" and type(size) is int and size >= 0 and type(samples) is int
            and samples >= 0 and type(digest) is str and _SHA256.fullmatch(digest) is not None)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value)


#: (field, check, what is expected) of the ``index`` entry and of a shard entry, as the loader reads them
_INDEX_FIELDS = (("file", _is_name, "a file name"), ("sha256", _is_sha256, "64 hex digits"),
                 ("bytes", _is_count, "a byte count"), ("rows", _is_count, "a row count"))
_SHARD_FIELDS = (("file", _is_name, "a file name"), ("sha256", _is_sha256, "64 hex digits"),
                 ("bytes", _is_count, "a byte count"), ("samples", _is_count, "a sample count"))


def _split_info(doc: Manifest, split: str, storage_options: Mapping[str, Any], cache: ShardCache | None,
                sources: Sequence[str] | None) -> SplitInfo:
    """:func:`load_split` after reading the manifest."""
    from packer.badsamples import failed_build

    path: Path | str = doc.path if doc.path is not None else doc.location
    failed = failed_build(doc.data)
    if failed is not None:  # written for its report only: ls, inspect and gc say so too
        raise ConfigError(f"{path}: the build that wrote this version failed: {failed}; fix or drop the bad files "
                          "(bad_samples.jsonl beside the manifest names each), or raise validate.max_bad_fraction, "
                          "and build again")
    if split not in doc.splits:
        raise ConfigError(f"{path}: no split {split!r}; the manifest has {sorted(doc.splits)}")
    schema = doc.sample_schema
    dtype = schema["dtype"]
    if dtype is None and not schema["shapes"]:  # no sample anywhere: no dtype to record, nothing mixed
        raise ConfigError(f"{path}: the dataset has no samples: every input file was bad or left out on purpose "
                          "(bad_samples.jsonl and excluded.jsonl beside the manifest say why); there is nothing to "
                          "load")
    if dtype is None:  # the build writes null for samples of mixed dtypes (and np.dtype(None) is float64)
        dtype = _view_dtype(path, schema, sources)
    try:
        np.dtype(dtype)
    except TypeError as err:
        raise IntegrityError(f"{path}: sample_schema.dtype {dtype!r} is not a numpy dtype") from err
    shape = schema["shape"]
    axes = len(schema["layout"])  # CHW, or CDHW for volumes
    if shape is not None and (len(shape) != axes or not all(d > 0 for d in shape)):
        raise IntegrityError(f"{path}: sample_schema.shape is {shape!r}, expected [{', '.join(schema['layout'])}] "
                             "or null")
    shapes = schema["shapes"]
    # CDHW where any sample is a volume: a job may pack 2-D sources (C×H×W) beside them
    ranks = {axes, 3} if axes == 4 else {axes}
    if not all(len(s) in ranks for v in shapes.values() for s in v):
        raise IntegrityError(f"{path}: sample_schema.shapes is {shapes!r}, expected "
                             f"{{source: [[{', '.join(schema['layout'])}], ...]}}")
    listed = doc.shards(split)
    if isinstance(path, Path) and path.name != MANIFEST_FILE and listed and not (path.parent / listed[0].file).exists():
        raise ConfigError(f"{path}: a registry copy of the manifest, without its shards beside it ({listed[0].file} "
                          f"is not in {path.parent}); open the version folder it describes instead, "
                          f"<output>/{doc.name}/{doc.version}/ (the build printed where)")
    shards = []
    for entry in listed:
        where = doc.locate(entry.file)
        if isinstance(where, Path):
            shards.append(ShardInfo(file=entry.file, path=where.resolve(), bytes=entry.bytes, sha256=entry.sha256,
                                    samples=entry.samples))
        else:
            shards.append(ShardInfo(file=entry.file, path=Path(entry.file), bytes=entry.bytes, sha256=entry.sha256,
                                    samples=entry.samples, url=where, storage_options=dict(storage_options),
                                    cache=cache))
    total = doc.splits[split]["samples"]
    if total != sum(s.samples for s in shards):
        raise IntegrityError(f"{path}: splits.{split}.samples is {total} but its shards hold "
                             f"{sum(s.samples for s in shards)}")
    return SplitInfo(manifest=path, name=doc.name, version=doc.version, format=doc.format, split=split,
                     label_map=dict(doc.label_map), dtype=dtype,
                     shape=tuple(shape) if shape is not None else None, shards=tuple(shards), samples=total,
                     shapes={src: tuple(tuple(int(d) for d in s) for s in v) for src, v in shapes.items()},
                     index=doc.index, storage_options=dict(storage_options),
                     target=Target.of_manifest(doc.data), mask=doc.data.get("mask"), layout=schema["layout"])


@dataclass(frozen=True)
class View:
    """The samples of a split that pass a filter: per shard (manifest order), the positions
    (ascending) of the chosen samples in that shard. ``sources``/``labels``: the filter (None: any)."""

    sources: tuple[str, ...] | None
    labels: tuple[str, ...] | None
    positions: tuple[np.ndarray, ...]
    #: The sources the chosen samples come from (a labels= view may hold fewer than the dataset)
    present: tuple[str, ...] | None = None

    @property
    def samples(self) -> int:
        return sum(len(p) for p in self.positions)


def _index_bytes(info: SplitInfo, *, verify: bool, fix: str = "") -> bytes:
    """The bytes of the split's ``_index.parquet`` (checked against the manifest's sha256 with
    ``verify``); ``fix``: what else the user may do, added to the messages."""
    if info.index is None:
        raise IntegrityError(f"{info.manifest}: the manifest lists no sample index (_index.parquet), which a "
                             "filtered view (sources=, labels=) needs; rebuild the dataset with packer build")
    folder: Any = (info.manifest.parent if isinstance(info.manifest, Path)
                   else str(info.manifest).rsplit("/", 1)[0])
    version = storage.VersionFolder(folder, info.storage_options)
    where = version.where(info.index["file"])
    try:
        data = version.read_bytes(info.index["file"])
    except FileNotFoundError as err:
        raise IntegrityError(f"{where}: the sample index is missing; restore it or rebuild the dataset"
                             f"{', ' + fix if fix else ''}") from err
    except OSError as err:
        raise IntegrityError(f"{where}: cannot read the sample index ({err}){'; ' + fix if fix else ''}") from err
    if verify and hashlib.sha256(data).hexdigest() != info.index["sha256"]:
        raise IntegrityError(f"{where}: sha256 does not match the manifest's; the index is corrupt: restore it "
                             f"or rebuild the dataset{', ' + fix if fix else ''}")
    return data


def _label_name(label: object, label_map: Mapping[str, int], where: str) -> str:
    """The label name ``labels=`` means by ``label``: a name; an integer where the names are class
    ids (a Kaggle table's 1, 2, 3: ``2`` is class '2', whatever index it packs as; a whole number
    written as a decimal, ``2.0`` as pandas writes an id column that has a blank, is that id too),
    else an integer is its index in the label map. ``2`` meant index 2, class '3', while ``'2'``
    and ``numpy.int64(2)`` meant class '2'. Raises ConfigError listing the labels."""
    if isinstance(label, numbers.Integral) and not isinstance(label, bool):
        ids = _class_ids(label_map)
        if ids is not None:
            named = ids.get(int(label), [])
            if len(named) > 1:
                raise ConfigError(f"{where}: labels {' and '.join(repr(n) for n in sorted(named))} are both class id "
                                  f"{int(label)}, so the integer {int(label)} names neither alone; name the one meant "
                                  "as a string")
            if not named:
                padded = sorted(name for name in label_map if _is_zero_padded(name))
                if padded:  # '01' is no spelling of an integer: the name itself picks it
                    meant = [n for n in padded if int(n) == int(label)]
                    pick = f"e.g. labels=[{meant[0]!r}]" if meant else "one of those listed"
                    raise ConfigError(f"{where}: no label {label!r} in this dataset's label_map; its labels are "
                                      f"{sorted(label_map)}, class ids among them written with leading zeros "
                                      f"({', '.join(repr(n) for n in padded[:3])}), which no integer writes: pass "
                                      f"the name as a string, {pick}")
                raise ConfigError(f"{where}: no label {label!r} in this dataset's label_map; its labels are "
                                  f"{sorted(label_map)}, all class ids written as whole numbers (2 or 2.0), so "
                                  f"an integer names the class id '{int(label)}' here (written {int(label)} or "
                                  f"{int(label)}.0), not a label index")
            return named[0]
        name: str | None = {index: key for key, index in label_map.items()}.get(int(label))
        if name is None:
            raise ConfigError(f"{where}: no label {label!r} in this dataset's label_map; its labels are "
                              f"{sorted(label_map)}, not all class ids written as whole numbers (2 or 2.0), so an "
                              f"integer is a label index here, 0 to {len(label_map) - 1}")
        return name
    name = str(label)
    if name not in label_map:
        raise ConfigError(f"{where}: no label {label!r} in this dataset's label_map; its labels are "
                          f"{sorted(label_map)}")
    return name


def _class_ids(label_map: Mapping[str, int]) -> dict[int, list[str]] | None:
    """Each class id and the label names that write it, where every name is a class id: an integer
    (``2``, ``-1``; one with leading zeros, ``007``, is that text, an id no integer names) or a whole
    number written as a decimal (``2.0``, ``-1.0``, ``1e3``: :data:`~packer.targets.base.DECIMAL`),
    as packer reads such ids in path templates and join keys. None where a name is no such id (a
    word, ``0.5``): then ``labels=`` reads an integer as a label index."""
    ids: dict[int, list[str]] = {}
    for name in label_map:
        if _INTEGER_NAME.fullmatch(name):
            if _is_zero_padded(name):
                continue  # zero-padded: its zeros count, no integer spells it (str(7) is '7')
            number = int(name)
        elif DECIMAL.fullmatch(name) and math.isfinite(float(name)):
            exact = Decimal(name)  # not the float: a 20-digit id keeps every digit
            if exact != exact.to_integral_value():
                return None
            number = int(exact)
        else:
            return None
        ids.setdefault(number, []).append(name)
    return ids


def _is_zero_padded(name: str) -> bool:
    """Whether ``name`` is an integer written with leading zeros (``007``, ``-01``; not ``0``)."""
    digits = name.lstrip("-")
    return bool(_INTEGER_NAME.fullmatch(name)) and digits != "0" and digits.startswith("0")


#: A class id written as an integer (``labels=`` reads integers as such ids where every name is one)
_INTEGER_NAME = re.compile(r"-?[0-9]+")


def split_index_rows(info: SplitInfo, columns: Sequence[str], *, verify: bool,
                     data: bytes | None = None) -> tuple[Any, list[tuple[int, int]]]:
    """The split's rows of ``_index.parquet`` (``columns`` besides split, shard and position),
    ordered by shard (manifest order) and position, and each shard's (start, end) rows in it:
    row ``start + i`` is sample ``i`` of the shard. ``IntegrityError`` when the index is missing,
    unreadable, lacks a column or disagrees with the manifest. ``data``: the index's bytes where
    the caller has already read (and checked) them."""
    import pyarrow as pa

    table, order, bounds = _split_index_order(info, columns, verify=verify, data=data)
    taken = pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)])  # pa.array(numpy): pandas
    return table.take(taken), bounds


def _split_index_order(info: SplitInfo, columns: Sequence[str], *, verify: bool,
                       data: bytes | None = None) -> tuple[Any, np.ndarray, list[tuple[int, int]]]:
    """:func:`split_index_rows` before the take: the whole index table (``columns`` besides
    split, shard and position), the split's row numbers in shard and position order (int64), and
    the shards' (start, end) in that order.

    The split and shard columns are read as dictionaries and the row order is worked out on the
    arrays' buffers (:func:`_integers`), never through ``to_numpy`` or a Python-valued compute
    call: pyarrow imports pandas for those on first use, 0.3-0.4 s of a fresh process, and every
    checked ``ShardDataset`` comes here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = f"{info.manifest}"
    try:
        # One small file, read on this thread. pq.read_table goes through the dataset scanner, which
        # starts Arrow's thread pools (even with use_threads=False); a pool thread still joinable
        # when the interpreter exits makes std::terminate abort the process: exit 134, "terminate
        # called without an active exception" (apache/arrow#34314), in 1 of ~10 runs of a view.
        data = _index_bytes(info, verify=verify) if data is None else data
        table = pq.ParquetFile(pa.BufferReader(data), read_dictionary=["split", "shard"]).read(
            columns=list(dict.fromkeys(["split", "shard", "position", *columns])), use_threads=False)
    except (pa.ArrowException, KeyError) as err:
        raise IntegrityError(f"{where}: the sample index is not a readable packer index ({err}); "
                             "rebuild the dataset") from err

    def names_and_codes(name: str) -> tuple[list[str], np.ndarray]:
        column = table[name].combine_chunks()
        return [str(value.as_py()) for value in column.dictionary], _integers(column.indices, where)

    splits, split_codes = names_and_codes("split")
    rows = (np.flatnonzero(split_codes == splits.index(info.split)) if info.split in splits
            else np.zeros(0, dtype=np.int64))
    shard_names, shard_codes = names_and_codes("shard")
    rank_of = {s.file: k for k, s in enumerate(info.shards)}  # a shard the manifest does not list ranks last
    ranks = np.array([rank_of.get(name, len(info.shards)) for name in shard_names], dtype=np.int64)[shard_codes[rows]]
    order = rows[np.lexsort((_integers(table["position"], where)[rows], ranks))].astype(np.int64)
    counts = np.bincount(ranks, minlength=len(info.shards) + 1)
    bounds, start = [], 0
    for s, count in zip(info.shards, counts.tolist(), strict=False):
        if count != s.samples:
            raise IntegrityError(f"{where}: _index.parquet lists {count} samples of shard {s.file}, the manifest "
                                 f"says {s.samples}; the index does not belong to this manifest: restore it or "
                                 "rebuild the dataset")
        bounds.append((start, start + count))
        start += count
    if counts[len(info.shards)]:
        raise IntegrityError(f"{where}: _index.parquet lists {info.split} samples in shards the manifest does not")
    return table, order, bounds


def load_checksums(info: SplitInfo) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]] | None:
    """Each shard's per-sample checksums (uint64, by position in the shard; manifest order),
    from ``_index.parquet``'s ``xxh3`` column, the index checked against the manifest's sha256
    first; what ``verify="sample"`` checks every sample against. With them, each shard's
    ``position`` column (int64: a tar shard's byte offset of each sample, :attr:`ShardInfo.offsets`).

    None (and a warning) for a dataset built before per-sample checksums (an index without the
    column, or no index in the manifest): its samples cannot be checked one by one.
    ``IntegrityError`` when the index is missing, damaged or does not belong to the manifest.
    """
    import pyarrow.parquet as pq

    if info.index is None:
        _warn_unchecked(info, "its manifest lists no sample index (_index.parquet)")
        return None
    unchecked = "or read without per-sample checks (ShardDataset(..., verify='off'); packer bench-loader --verify off)"
    index_bytes = _index_bytes(info, verify=True, fix=unchecked)
    import pyarrow as pa

    try:
        names = pq.ParquetFile(pa.BufferReader(index_bytes)).schema_arrow.names
    except pa.ArrowException as err:
        raise IntegrityError(f"{info.manifest}: the sample index is not a readable packer index ({err}); "
                             "rebuild the dataset") from err
    if INDEX_COLUMN not in names:
        _warn_unchecked(info, f"its _index.parquet has no {INDEX_COLUMN} column (built by a packer from before "
                              "per-sample checksums)")
        return None
    # the two integer columns are taken by numpy: Arrow's take imports pyarrow.compute, 0.1 s of
    # every fresh process that makes a checked dataset (the harness times it)
    table, order, bounds = _split_index_order(info, [INDEX_COLUMN], verify=False, data=index_bytes)  # hashed above
    sums = _integers(table[INDEX_COLUMN], f"{info.manifest}")[order].astype(np.uint64)
    offsets = _integers(table["position"], f"{info.manifest}")[order].astype(np.int64)
    return tuple(sums[lo:hi] for lo, hi in bounds), tuple(offsets[lo:hi] for lo, hi in bounds)


#: numpy's spelling of the integer types an index's numeric and dictionary-index columns have
_INTEGERS = {"int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
             "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}


def _integers(column: Any, where: str) -> np.ndarray:
    """An integer Arrow column without nulls as a numpy array, read from its value buffer.

    Not ``to_numpy``: pyarrow's conversion imports pandas on first use (0.3-0.4 s of a fresh
    process, measured), and this runs where every ``ShardDataset`` is made."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dtype = _INTEGERS.get(str(array.type))
    if dtype is None or array.null_count:
        raise IntegrityError(f"{where}: _index.parquet has a {array.type} column with {array.null_count} nulls "
                             "where packer writes whole integers; rebuild the dataset")
    if not len(array):  # an empty array may have no value buffer at all
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array))[array.offset:]


def _warn_unchecked(info: SplitInfo, why: str) -> None:
    """Say once per process that a dataset's samples are read without per-sample checks."""
    if str(info.manifest) not in _WARNED:
        _WARNED.add(str(info.manifest))
        log.warning("%s: samples are not checked one by one (verify='sample'): %s; rebuild the dataset with this "
                    "packer to check every sample, or pass verify='shard' to hash whole shards", info.manifest, why)


def _view_names(value: Any, argument: str, what: str) -> list[Any]:
    """A view argument (``sources=``, ``labels=``) as a list: any iterable of names (a list, a
    tuple, a set, a numpy array such as ``np.unique(table.label)``). ConfigError for one string
    (a list of its letters is never meant) or a value that is not a collection."""
    if isinstance(value, str | bytes):
        name = str(value) if isinstance(value, str) else value  # numpy's str_ too, shown as a str
        raise ConfigError(f"{argument}={name!r}: pass a list of {what}, e.g. {argument}=[{name!r}]")
    try:
        return list(value)
    except TypeError:  # an int, a 0-d numpy array
        raise ConfigError(f"{argument}={value!r} ({type(value).__name__}): pass a list of {what}") from None


def load_view(info: SplitInfo, *, sources: Sequence[str] | None = None, labels: Sequence[str | int] | None = None,
              verify: bool = False) -> View:
    """The samples of ``info``'s split whose source is in ``sources`` and label in ``labels``
    (None: any), found in ``_index.parquet`` without opening a shard.

    ``labels``: label names (an integer: a class id where the names are integers, else an index in
    the label map: :func:`_label_name`). Raises ``ConfigError`` for
    a source or label the dataset does not have (the message lists those it has) and
    ``IntegrityError`` when the index is missing, unreadable or disagrees with the manifest.
    """
    import pyarrow as pa

    where = f"{info.manifest}"
    wanted_sources: tuple[str, ...] | None = None
    if sources is not None:
        wanted_sources = tuple(dict.fromkeys(str(s) for s in _view_names(sources, "sources", "source names")))
        if not wanted_sources:
            raise ConfigError(f"sources=[]: an empty view holds no sample; name at least one of "
                              f"{sorted(info.shapes)}, or pass sources=None for the whole split")
        unknown = [s for s in wanted_sources if info.shapes and s not in info.shapes]
        if unknown:
            raise ConfigError(f"{where}: no source {unknown[0]!r} in this dataset; its sources are "
                              f"{sorted(info.shapes)}")
    label_ids: set[int] | None = None
    label_names: tuple[str, ...] | None = None
    if labels is not None:
        labels = _view_names(labels, "labels", "label names")
    if labels is not None and info.target.view_column is None:
        raise ConfigError(f"labels={labels!r}: this dataset's target is {info.target.kind}, so it has no "
                          "labels to filter by; filter by sources= instead")
    if labels is not None:
        if not labels:
            raise ConfigError(f"labels=[]: an empty view holds no sample; name at least one of "
                              f"{sorted(info.label_map)}, or pass labels=None for every label")
        names = [_label_name(label, info.label_map, where) for label in labels]
        label_names = tuple(dict.fromkeys(names))
        label_ids = {info.label_map[n] for n in label_names}
    column = (info.target.view_column if label_ids is not None else None) or "label"  # the labels= filter's
    table, bounds = split_index_rows(info, ["source", column], verify=verify)
    keep = np.ones(table.num_rows, dtype=bool)
    if wanted_sources is not None:
        keep &= np.isin(table["source"].to_numpy(zero_copy_only=False).astype(str), list(wanted_sources))
    if label_ids is not None:  # the target kind says which rows hold any of the labels
        values = table[column].combine_chunks()
        if pa.types.is_list(values.type):  # a vector per row: its values, flat
            values = values.flatten()
        keep &= info.target.holding(np.asarray(values.to_numpy(zero_copy_only=False)), label_ids)
    positions = [np.flatnonzero(keep[lo:hi]).astype(np.int64) for lo, hi in bounds]
    present = tuple(sorted(set(table["source"].filter(pa.array(keep)).to_pylist())))
    return View(sources=wanted_sources, labels=label_names, positions=tuple(positions), present=present)


@dataclass(frozen=True)
class SampleCheck:
    """What every decoded sample must satisfy: dtype, CHW shape (or any), the dataset's target
    (a known class index, a target vector of the right length: :meth:`Target.problem`; a
    target mask where the target is masked: :meth:`Target.mask_problem`)."""

    dtype: str
    shape: tuple[int, ...] | None
    target: Target
    #: The masks' dtype where the dataset has masks (every sample then needs one), else None
    mask_dtype: str | None = None
    #: ``CHW``, or ``CDHW`` for volumes
    layout: str = "CHW"
    #: Deliver each sample's JSON record too (:attr:`Decoded.record`): ``ShardDataset(records=True)``
    records: bool = False

    def problem(self, image: np.ndarray, label: int | None, vector: np.ndarray | None = None,
                mask: np.ndarray | None = None, target_mask: np.ndarray | None = None) -> str | None:
        if image.dtype != np.dtype(self.dtype):
            return f"dtype {image.dtype}, expected {self.dtype}"
        if image.ndim != len(self.layout) and not (self.layout == "CDHW" and image.ndim == 3):
            # CDHW: the dataset holds volumes, and maybe 2-D samples of other sources beside them
            return f"shape {image.shape} is not {'×'.join(self.layout)}"
        if self.shape is not None and tuple(image.shape) != self.shape:
            return f"shape {tuple(image.shape)}, expected {self.shape}"
        if self.mask_dtype is not None:
            if mask is None:
                return "no mask (.mask.npy member or mask cell), but the manifest says every sample has one"
            grid = tuple(mask.shape) == image.shape[1:] if image.ndim == 4 else mask.shape[1:] == image.shape[1:]
            if mask.ndim != 3 or not grid or mask.dtype != np.dtype(self.mask_dtype):
                wanted = "×".join(map(str, image.shape[1:])) if image.ndim == 4 else \
                    f"F×{image.shape[1]}×{image.shape[2]}"
                return f"mask {mask.dtype} {tuple(mask.shape)} is not {self.mask_dtype} {wanted} on the image's grid"
        return self.target.problem(label, vector) or self.target.mask_problem(target_mask)

    def outcome(self, result: Decoded | SampleDefect) -> Decoded | SampleDefect:
        """``result`` of a shard reader, or a ``bad_sample`` defect when the decoded sample fails this check."""
        if isinstance(result, SampleDefect):
            return result
        problem = self.problem(result.image, result.label, result.target, result.mask, result.target_mask)
        if problem is not None:
            return SampleDefect("bad_sample", problem, result.key)
        if self.records and result.record is not None:  # a Parquet row's metadata cell (tar: _with_record)
            return record_defect(result.key, result.record, "the metadata cell") or result
        return result


@dataclass(frozen=True)
class Failure:
    """A sample that could not be read: shard file, key (``None`` if unknown), why."""

    shard: str
    position: int
    key: str | None
    reason: str
    message: str

    @classmethod
    def of(cls, shard: str, position: int, defect: SampleDefect, key: str | None = None) -> Failure:
        """The failure of sample ``position`` of ``shard`` for a shard reader's ``defect``."""
        return cls(shard, position, defect.key if defect.key is not None else key, defect.reason, defect.message)

    def describe(self) -> str:
        if self.reason == "bad_shard":  # the whole shard's defect (size, sha256): no one sample's
            return f"{self.shard}: {self.reason}: {self.message}"
        if self.key is None:  # its key is in bytes that could not be read: named by its place
            return f"{self.shard}: the sample at position {self.position}: {self.reason}: {self.message}"
        return f"{self.shard}: sample {self.key}: {self.reason}: {self.message}"

    def error(self) -> ShardReadError:
        return ShardReadError(self.describe(), shard=self.shard, key=self.key)


def _lost_text(position: int, samples: int, defect: str) -> str:
    """Why sample ``position`` of a tar shard of ``samples`` cannot be read past a damaged header."""
    return (f"sample {position + 1} of the shard's {samples} cannot be found ({defect}); the samples after it are "
            "read from the offsets _index.parquet recorded. `packer verify` on the version names every damaged "
            "sample; restore the shard or rebuild the dataset (a rebuild of the same version restores it)")


def against_index(info: ShardInfo, position: int, result: Decoded | SampleDefect,
                  recompute: Callable[[], int | SampleDefect] | None = None) -> Decoded | SampleDefect:
    """``result`` (sample ``position`` of shard ``info`` as a reader gave it), or a
    ``checksum_mismatch`` defect when the checksum of the bytes read is not the one
    ``_index.parquet`` records for it (``info.checksums``).

    Where ``result`` carries no checksum (a sample that did not decode, or a reader that does
    not hash), ``recompute`` (the checksum of its members' bytes) gives it, so that damage after
    the build is named as such rather than as whatever the decoder tripped on; a sample whose
    bytes cannot be had at all keeps its defect."""
    if info.checksums is None:
        return result
    found: int | SampleDefect | None = result.checksum
    if found is None and recompute is not None:
        found = recompute()
    if found is None or isinstance(found, SampleDefect):
        return result
    expected = int(info.checksums[position])
    if found == expected:
        return result
    also = f" (reading it also failed: {result.reason}: {result.message})" if isinstance(result, SampleDefect) else ""
    misplaced = _misplaced(info, position, result.key, found)
    if misplaced is not None:
        return SampleDefect("checksum_mismatch", misplaced + also, result.key)
    return SampleDefect("checksum_mismatch", mismatch_message(expected, found, info.location, also,
                                                             cached_from=info.cached_from), result.key)


@dataclass(frozen=True)
class IndexPlaces:
    """Where ``_index.parquet`` puts every sample of a version (all splits): ``home``: key → (shard
    file, split, recorded xxh3); ``keys``: shard file → its keys by position."""

    home: dict[str, tuple[str, str, int | None]]
    keys: dict[str, list[str]]


def index_places(split: SplitInfo) -> IndexPlaces | str:
    """:class:`IndexPlaces` of the version ``split`` is of, from its ``_index.parquet`` (checked
    against the manifest's sha256), or why they cannot be had. Read on a checksum mismatch only
    (the common path never comes here), and kept for the last few indexes: a swapped shard
    mismatches at every sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stamp = (str(split.manifest), str((split.index or {}).get("sha256")))
    if stamp in _PLACES:
        return _PLACES[stamp]
    try:
        index = pq.ParquetFile(pa.BufferReader(_index_bytes(split, verify=True)))
        columns = ["key", "shard", "split", "position",
                   *([INDEX_COLUMN] if INDEX_COLUMN in index.schema_arrow.names else [])]
        rows = index.read(columns=columns, use_threads=False).to_pylist()
    except IntegrityError as err:
        return str(err)
    except (pa.ArrowException, KeyError) as err:
        return f"{split.manifest}: the sample index is not a readable packer index ({err})"
    home: dict[str, tuple[str, str, int | None]] = {}
    placed: dict[str, list[tuple[int, str]]] = {}
    for row in rows:
        if not isinstance(row["key"], str) or not isinstance(row["shard"], str):
            continue
        checksum = row.get(INDEX_COLUMN)
        home[row["key"]] = (row["shard"], str(row["split"]), int(checksum) if checksum is not None else None)
        placed.setdefault(row["shard"], []).append((int(row["position"] or 0), row["key"]))
    places = IndexPlaces(home=home, keys={shard: [key for _, key in sorted(at)] for shard, at in placed.items()})
    _PLACES[stamp] = places
    while len(_PLACES) > 4:
        _PLACES.pop(next(iter(_PLACES)))
    return places


#: :func:`index_places` of the last few versions this process read, by (manifest, index sha256)
_PLACES: dict[tuple[str, str], IndexPlaces] = {}


def _misplaced(info: ShardInfo, position: int, key: str | None, found: int) -> str | None:
    """What a ``checksum_mismatch`` at ``position`` of ``info`` says when the sample read there
    (``key``, its checksum ``found``) is not the one ``_index.parquet`` puts there: the shard holds
    another shard's sample (shard files swapped, or one overwritten with a copy of another), not
    bytes changed. None where the key read is the index's (or either cannot be had)."""
    if key is None or info.split_of is None:
        return None
    places = index_places(info.split_of)
    if isinstance(places, str):
        return None
    here = places.keys.get(info.file, [])
    wanted = here[position] if position < len(here) else None
    if wanted is None or wanted == key:
        return None
    where = places.home.get(key)
    if where is None:
        home = "_index.parquet does not list it in any shard of this version"
        intact = ""
    else:
        shard, split, recorded = where
        home = f"_index.parquet puts it in {shard}" + (f" (split {split!r})" if split != info.split_of.split else "")
        intact = (" (its bytes are intact: their xxh3 is the one the index records for it)" if recorded == found
                  else " (and its bytes do not match the index's xxh3 for it either)")
    return misplaced_message(key, home + intact, info.location, expected=wanted, cached_from=info.cached_from)


def misplaced_message(key: str, home: str, location: str, *, expected: str | None = None,
                      cached_from: str | None = None) -> str:
    """What a sample read from a shard ``_index.parquet`` does not put it in says (after the shard
    and the key): ``home``: where the index puts it (``"_index.parquet puts it in train-000001.tar"``);
    ``expected``: the key the index puts at that place of the shard, where known."""
    instead = f", where _index.parquet puts sample {expected}" if expected is not None else ""
    text = (f"the shard holds another shard's sample: {key} is read from {location}{instead}, but {home}: shard "
            "files were swapped, or one overwritten with a copy of another")
    if cached_from is not None:
        return (f"{text} (in the shard cache's copy of {cached_from}; the copy is dropped from the cache, so the next "
                "read fetches the shard again; `packer verify` on the version checks the store's copy)")
    return (f"{text}; restore the shard from the version's own copy (or rebuild the dataset); `packer verify` on the "
            "version folder names every shard that holds another's samples")


def mismatch_message(expected: int, found: int, location: str, also: str = "", *,
                     cached_from: str | None = None) -> str:
    """What a ``checksum_mismatch`` says (after the shard and the key): the two checksums, what
    happened, and the fix; ``location``: the shard's path or URL; ``cached_from``: the store's URL
    where ``location`` is the shard cache's copy of it (restoring the store's copy, or rebuilding,
    would leave the damaged copy in the cache, which is served as long as it is there)."""
    found_text = (f"expected xxh3 {describe(expected)} (recorded in _index.parquet at build time), found "
                  f"{describe(found)}: the sample's bytes changed after the build")
    if cached_from is not None:
        return (f"{found_text} in the shard cache's copy {location} of {cached_from} (damage on the cache's disk; "
                f"the store's copy may be intact){also}; the copy is dropped from the cache, so the next read fetches "
                "the shard again; `packer verify` on the version checks the store's copy")
    return (f"{found_text} (disk, copy or cache damage){also}; restore {location} from a good copy or rebuild the "
            "dataset, and run `packer verify` on the version folder to name every damaged sample")


def check_shard_file(info: ShardInfo, *, verify: bool) -> str | None:
    """``None`` if the shard file exists with the manifest's size (and sha256 if ``verify``).

    Otherwise a message saying what differs. ``verify`` reads the whole file.
    """
    try:
        size = os.stat(info.path).st_size
    except OSError as err:
        return f"cannot open the shard {info.path} ({err.strerror}); restore it or rebuild the dataset"
    if size != info.bytes:
        return _size_problem(size, info.bytes)
    if verify:
        st = os.stat(info.path)
        stamp = (str(info.path), info.sha256, size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if stamp in _VERIFIED:
            return None
        _, digest = file_sha256(info.path)
        if digest != info.sha256:
            return (f"sha256 {digest[:16]}… does not match the manifest's {info.sha256[:16]}…; "
                    "the shard is corrupt: restore it or rebuild the dataset")
        _VERIFIED.add(stamp)
    return None


#: Shards this process has hashed and found good, by (path, sha256, size, inode, mtime,
#: ctime): a worker hashes a shard once, not once per epoch; a rewrite changes the stamp.
_VERIFIED: set[tuple[str, str, int, int, int, int]] = set()


class _IndexCache:
    """The last few scanned tar shards of this process (keyed by path and size)."""

    def __init__(self, capacity: int = 32) -> None:
        self._items: OrderedDict[tuple[str, int], TarIndex] = OrderedDict()
        self._capacity = capacity

    def get(self, path: Path) -> TarIndex:
        key = (str(path), os.stat(path).st_size)
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        index = scan_tar(path)
        self._items[key] = index
        if len(self._items) > self._capacity:
            self._items.popitem(last=False)
        return index


_TAR_INDEX = _IndexCache()


def read_tar(info: ShardInfo, positions: Sequence[int], check: SampleCheck, *,
             strict: bool, verify: bool) -> Iterator[tuple[int, Decoded | Failure]]:
    """Samples at ``positions`` (ascending) of a tar shard, read front to back with skips.

    ``strict``: a size/hash mismatch fails every position (else, for size only, the
    readable prefix is still read). ``verify``: compare the sha256 first. An I/O error
    fails the positions not yet read. A remote shard is streamed (:func:`read_remote`).
    """
    if info.url is not None and info.cache is not None:
        yield from _read_cached(read_tar, info, positions, check, strict=strict, verify=verify)
        return
    if info.url is not None:
        yield from read_remote(info, positions, check, strict=strict, verify=verify)
        return
    done = 0
    try:
        problem = check_shard_file(info, verify=verify)
        index = _TAR_INDEX.get(info.path) if info.path.exists() else TarIndex(samples=(), defect="missing")
        if problem is not None and (strict or verify or not info.path.exists()):
            for pos in positions:  # the shard's defect, not any one sample's: the record names no key
                yield pos, Failure(info.file, pos, None, "bad_shard", problem)
            return
        if problem is not None:
            _read_anyway(info, problem)
        found = len(index.samples)
        placed: dict[int, TarSample] | None = None
        lost: dict[int, str] = {}
        # the defect a scan stopped at, by the last sample it found: a later member header of it may be the one
        stopped = {found - 1: index.defect} if index.defect is not None and index.cut is None and found else {}
        if (problem is None and index.defect is not None and index.cut is None and found < info.samples
                and info.offsets is not None and len(info.offsets) == info.samples):
            placed, lost, stopped = resume_scan(info.path, index, info.offsets.tolist())  # past a damaged header
        with open(info.path, "rb", buffering=0) as fh:
            mapped = map_shard(fh)  # images become views of it: the collate's stack is their one copy
            for pos in positions:
                at = placed.get(pos) if placed is not None else index.samples[pos] if pos < found else None
                if at is None and pos in lost:
                    outcome: Decoded | Failure = Failure(
                        info.file, pos, None, "unreadable",
                        _lost_text(pos, info.samples, lost[pos]))
                elif at is None:  # ``found`` counts whole samples: the one the file ends in is not one
                    outcome = Failure(
                        info.file, pos, index.cut if pos == found else None, "truncated",
                        f"the archive ends after {found} of the manifest's {info.samples} samples "
                        f"({index.defect or 'early end of archive'}); restore the shard or rebuild the dataset")
                else:
                    sample = at
                    result = read_tar_sample(fh, sample, mapped, checksum=info.checksums is not None)
                    if info.checksums is not None:
                        result = against_index(info, pos, result, functools.partial(tar_sample_checksum, fh, sample))
                    result = check.outcome(result)
                    if check.records and isinstance(result, Decoded):
                        result = _with_record(result, read_member_bytes(fh, sample, ["json"]))
                    outcome = result if isinstance(result, Decoded) else Failure.of(info.file, pos, result)
                    if isinstance(outcome, Failure) and pos in stopped:
                        outcome = replace(outcome, message=f"{outcome.message} (the shard's scan stopped in this "
                                                           f"sample: {stopped[pos]})")
                done += 1
                yield pos, outcome
    except OSError as err:
        for pos in positions[done:]:
            yield pos, Failure(info.file, pos, None, "unreadable", f"I/O error ({err})")


def read_parquet(info: ShardInfo, positions: Sequence[int], check: SampleCheck, *,
                 strict: bool, verify: bool) -> Iterator[tuple[int, Decoded | Failure]]:
    """Samples at ``positions`` (ascending) of a Parquet shard, memory-mapped, in record batches."""
    import pyarrow as pa

    if info.url is not None and info.cache is not None:
        yield from _read_cached(read_parquet, info, positions, check, strict=strict, verify=verify)
        return
    if info.url is not None:
        yield from read_remote(info, positions, check, strict=strict, verify=verify)
        return
    problem = check_shard_file(info, verify=verify)
    if problem is not None and (strict or verify or not info.path.exists()):
        yield from _fail(info, positions, "bad_shard", problem)
        return
    if problem is not None:
        _read_anyway(info, problem)
    source = pa.memory_map(str(info.path), "r")
    if problem is not None and info.bytes and source.size() > info.bytes:
        # bytes appended (a copy padded to a block size): a Parquet file's index is at its end,
        # so it is read as the manifest's length of it, the samples checked as ever
        source = pa.BufferReader(source.read_buffer(info.bytes))
    yield from _read_parquet_file(info, source, positions, check)


def _read_cached(reader: Callable[..., Iterator[tuple[int, Decoded | Failure]]], info: ShardInfo,
                 positions: Sequence[int], check: SampleCheck, *, strict: bool,
                 verify: bool) -> Iterator[tuple[int, Decoded | Failure]]:
    """A remote shard read from its cache entry (downloaded once per machine, held while read)."""
    if info.cache is None or info.url is None:
        raise ValueError("_read_cached needs a remote shard with a cache")
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(info.cache.reading(info.url, info.sha256, info.bytes, info.file,
                                                          info.storage_options))
        except FileNotFoundError:  # the same failure as a streamed read of the missing object
            yield from _fail(info, positions, "bad_shard", _missing_remote_shard(info.url))
            return
        except IntegrityError as err:  # the store's bytes are not the manifest's: the whole shard, not a sample
            yield from _fail(info, positions, "bad_shard", f"refused by the shard cache {info.cache.folder}, so none "
                                                           f"of its samples is read: {err}")
            return
        except OSError as err:
            yield from _fail(info, positions, "unreadable", f"the whole shard could not be fetched through the shard "
                                                            f"cache {info.cache.folder}: {err}")
            return
        dropped = False
        for pos, outcome in reader(replace(info, path=path, url=None, cache=None, cached_from=info.url), positions,
                                   check, strict=strict, verify=verify):
            if not dropped and isinstance(outcome, Failure) and outcome.reason == "checksum_mismatch":
                info.cache.invalidate(info.sha256, info.file)  # before the caller sees (and maybe raises) it
                dropped = True
            yield pos, outcome


def _fail(info: ShardInfo, positions: Sequence[int], reason: str, message: str) -> Iterator[tuple[int, Failure]]:
    for pos in positions:
        yield pos, Failure(info.file, pos, None, reason, message)


def _read_parquet_file(info: ShardInfo, source: Any, positions: Sequence[int],
                       check: SampleCheck) -> Iterator[tuple[int, Decoded | Failure]]:
    """Samples at ``positions`` (ascending) of the Parquet shard ``info``, read from ``source``
    (a memory map or a seekable binary file) by :func:`packer.shards.parquet.read_parquet_samples`."""
    from packer.shards.parquet import read_parquet_samples  # pyarrow: imported by Parquet readers only

    checked = info.checksums is not None
    for pos, result in read_parquet_samples(source, positions, expect_rows=info.samples, batch_rows=PARQUET_ROWS,
                                            records=check.records, checksums=checked,
                                            recover=_index_cells(info) if checked else None):
        outcome = check.outcome(against_index(info, pos, result) if info.checksums is not None else result)
        yield pos, outcome if isinstance(outcome, Decoded) else Failure.of(info.file, pos, outcome)


def _index_cells(info: ShardInfo) -> Callable[[str], Sequence[Any] | str] | None:
    """The ``recover`` of :func:`~packer.shards.parquet.read_parquet_samples` for the Parquet shard
    ``info``: a column's cells of every sample of the shard, by position, from ``_index.parquet``
    (read again, and checked against the manifest's sha256, only when the shard's own pages of that
    column fail), or why they cannot be had. None without :attr:`ShardInfo.split_of`."""
    split = info.split_of
    if split is None:
        return None

    def cells(column: str) -> Sequence[Any] | str:
        files = [shard.file for shard in split.shards]
        if info.file not in files:
            return f"{info.file} is not a shard of the split {split.split!r}"
        try:
            table, bounds = split_index_rows(split, [column], verify=True)
        except IntegrityError as err:
            return str(err)
        lo, hi = bounds[files.index(info.file)]
        return table[column].slice(lo, hi - lo).to_pylist()

    return cells


# -- remote shards ---------------------------------------------------------------------------
def _missing_remote_shard(url: str) -> str:
    return f"cannot open the shard ({url} not found); restore it or republish the dataset"


@contextlib.contextmanager
def _open_remote(info: ShardInfo, url: str, *, verify: bool) -> Iterator[tuple[IO[bytes] | None, str | None]]:
    """The remote shard opened for reading (``None`` if absent) and a size/hash problem or ``None``.

    With ``verify`` the shard is copied into a spooled temporary file while it is hashed,
    and that copy is what the caller reads.
    """
    fs, path = storage.filesystem_for(url, info.storage_options)
    fs.invalidate_cache(path)  # a listing cached earlier in this process may describe a replaced object
    try:
        size = int(fs.info(path)["size"])
    except FileNotFoundError:
        yield None, _missing_remote_shard(url)
        return
    if size != info.bytes:
        with fs.open(path, "rb") as fh:
            yield fh, _size_problem(size, info.bytes)
        return
    if not verify:
        with fs.open(path, "rb") as fh:
            yield fh, None
        return
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool, fs.open(path, "rb") as source:
        digest = hashlib.sha256()
        while block := source.read(1 << 20):
            digest.update(block)
            spool.write(block)
        spool.seek(0)
        problem = None
        if digest.hexdigest() != info.sha256:
            problem = (f"sha256 {digest.hexdigest()[:16]}… does not match the manifest's {info.sha256[:16]}…; "
                       "the shard is corrupt: restore it or rebuild the dataset")
        yield spool, problem


def read_remote(info: ShardInfo, positions: Sequence[int], check: SampleCheck, *,
                strict: bool, verify: bool) -> Iterator[tuple[int, Decoded | Failure]]:
    """Samples at ``positions`` (ascending) of a remote shard (``info.url``), tar or Parquet.

    Same contract as :func:`read_tar`: a size mismatch (and with ``verify`` a sha256
    mismatch) fails every position when ``strict`` or ``verify``; an error of the store
    (network, permissions) fails the positions not yet read, naming the URL.
    """
    url = info.location
    done = 0
    try:
        with _open_remote(info, url, verify=verify) as (fh, problem):
            if fh is None or (problem is not None and (strict or verify)):
                yield from _fail(info, positions, "bad_shard", problem or "unreadable")
                return
            if problem is not None:
                _read_anyway(info, problem)
            if info.file.endswith(".parquet"):
                from packer.shards.parquet import FilePrefix  # pyarrow: imported by Parquet readers only

                # bytes appended: its index is at the manifest's length (see read_parquet)
                source = FilePrefix(fh, info.bytes) if problem is not None and info.bytes else fh
                results = _read_parquet_file(info, source, positions, check)
            else:
                results = _stream_tar(info, fh, positions, check)
            for pos, outcome in results:
                done += 1
                yield pos, outcome
    except GeneratorExit:  # closed early (interpreter exit among others): the clause below, a call into a
        raise  # module that may be gone by then, must not be evaluated
    except storage.remote_errors() as err:
        yield from _fail(info, positions[done:], "unreadable",
                         f"I/O error ({storage.describe_error(url, err)})")


def _stream_tar(info: ShardInfo, fh: IO[bytes], positions: Sequence[int],
                check: SampleCheck) -> Iterator[tuple[int, Decoded | Failure]]:
    """Samples at ``positions`` (ascending) of a tar shard read front to back from ``fh``. Where
    the shard's offsets are known (``verify="sample"``), a damaged member header costs only its
    own sample, as in a memory-mapped read: the stream is read on from the next sample's offset
    (:func:`~packer.shards.tar.stream_tar_samples`)."""
    want = list(positions)
    offsets = info.offsets.tolist() if info.offsets is not None and len(info.offsets) == info.samples else None
    i = found = 0
    defect: str | None = None
    held: tuple[int, str, dict[str, bytes]] | None = None  # settled when the next item says if the stream stopped in it
    for item in _then_none(stream_tar_samples(fh, want[-1] if want else -1, offsets)):
        if held is not None:
            index, key, members = held
            stopped = item if isinstance(item, str) else None
            while i < len(want) and want[i] <= index:
                pos = want[i]
                if pos == index:
                    outcome = _streamed_sample(info, check, index, key, members, stopped)
                elif defect is not None:  # passed over where the stream was read on from the next offset
                    outcome = Failure(info.file, pos, None, "unreadable",
                                      _lost_text(pos, info.samples, defect))
                else:
                    outcome = Failure.of(info.file, pos, SampleDefect(
                        "internal", f"position {pos} asked for after {index}: positions must ascend"), key)
                yield pos, outcome
                i += 1
            found, held = index + 1, None
        if isinstance(item, str):
            defect = item
        elif item is not None:
            held = item
    for pos in want[i:]:
        yield pos, Failure(info.file, pos, None, "truncated",
                           f"the archive ends after {found} of the manifest's {info.samples} samples "
                           f"({defect or 'early end of archive'}); restore the shard or rebuild the dataset")


def _then_none(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, then one ``None``: the end, after which the last item is settled."""
    yield from items
    yield None


def _streamed_sample(info: ShardInfo, check: SampleCheck, index: int, key: str, members: dict[str, bytes],
                     stopped: str | None) -> Decoded | Failure:
    """The sample at ``index`` of a streamed shard from its members' bytes, checked; ``stopped``:
    the defect the stream stopped at right after it (a later member header of it may be the damaged one)."""
    result = decode_members(key, members)
    if info.checksums is not None:
        result = against_index(info, index, result, functools.partial(members_checksum, key, members))
    result = check.outcome(result)
    if check.records and isinstance(result, Decoded):
        result = _with_record(result, {"json": members["json"]} if "json" in members else SampleDefect(
            "missing_member", f"no {key}.json member", key))
    if isinstance(result, Decoded):
        return result
    outcome = Failure.of(info.file, index, result, key)
    if stopped is not None:
        outcome = replace(outcome, message=f"{outcome.message} (the shard's scan stopped in this sample: {stopped})")
    return outcome


def _size_problem(size: int, expected: int) -> str:
    """Why a shard of ``size`` bytes is not the manifest's (``expected`` bytes)."""
    how = "truncated or replaced" if size < expected else "bytes appended, or replaced"
    return f"the shard is {size} bytes, the manifest says {expected} ({how}); restore it or rebuild the dataset"


def _read_anyway(info: ShardInfo, problem: str) -> None:
    """Say (once per shard and process) that a shard whose size differs from the manifest's is
    read as far as it is readable, as ``on_error="skip"`` asks: its intact samples arrive, the
    others are skipped and counted, and nothing about the shard itself would otherwise show."""
    if info.location not in _WARNED:
        _WARNED.add(info.location)
        log.warning("%s: %s; reading the samples that are still readable (on_error='skip')", info.location, problem)


#: The shards :func:`_read_anyway` spoke of in this process
_WARNED: set[str] = set()


def _with_record(decoded: Decoded, members: dict[str, bytes] | SampleDefect) -> Decoded | SampleDefect:
    """``decoded`` with its ``.json`` member as its record, or why that member cannot be had
    (or is not a JSON object: :func:`~packer.shards.members.record_defect`)."""
    if isinstance(members, SampleDefect):
        return members
    record = members["json"]
    return record_defect(decoded.key, record, f"{decoded.key}.json") or replace(decoded, record=record)


def read_shard(fmt: str, info: ShardInfo, positions: Sequence[int], check: SampleCheck, *,
               strict: bool, verify: bool) -> Iterator[tuple[int, Decoded | Failure]]:
    """Dispatch to :func:`read_tar` or :func:`read_parquet` by manifest ``format``."""
    reader = read_tar if fmt == "webdataset" else read_parquet
    return reader(info, positions, check, strict=strict, verify=verify)
