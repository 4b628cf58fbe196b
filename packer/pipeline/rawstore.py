"""Raw store: list and fetch raw files that live behind fsspec URLs (``s3://``, ``gs://``, ...).

The client lists a source root with one recursive listing (:func:`list_remote_files`), which
also gives each object's size and version tag (:class:`RawObject`): the build cache keys a
remote file by them, as it keys a local file by its stat, and the workers check the size
limit against them before fetching anything. A worker fetches each file once, whole, into a
private temporary folder on its own disk (:func:`fetched`), checks the copy against the
listing (its size, then the object's version tag: an object replaced since is never decoded under
the listing's key), runs the ordinary path-based readers on the copy and deletes it; a file that
cannot be fetched, or changed since the listing, becomes a :class:`FetchIssue`.

The header pass (``validate --quick``) fetches less: ``fetched(..., headers_only=True)`` first
rehearses the header probe on a view of the object that fetches the ranges it reads
(:class:`_RangedObject`), then writes those ranges into a sparse copy of the object's size.
The ordinary probe then runs on the copy and reads exactly the bytes the rehearsal read, so
its outcome is that of the whole file (see :func:`_fetch_probed_ranges` for the rule).

Storage options come from :func:`packer.storage.storage_options_for` (the environment, then
``--storage-option``), on the client for the listing and on each worker for its fetches.
"""

from __future__ import annotations

import contextlib
import posixpath
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from packer.config import LimitsConfig
from packer.errors import ConfigError, refused_write, surface
from packer.read.kinds import source_kind
from packer.read.limits import file_size_problem
from packer.records import Issue, SampleRef
from packer.storage import describe_error, filesystem_for, remote_errors, storage_error

#: The first ranged request of a header-only fetch, and the block size of the later ones. Files
#: no larger are fetched whole (one request either way). The DICOM probe reads this much of a
#: file's head itself (``packer.read.dicom._check_inflated``), so it must stay >= 64 KiB.
HEAD_BYTES = 64 * 1024

#: Keys of an fsspec ``info`` dict that change when an object's bytes do, most telling first:
#: S3/Azure ETag, GCS md5/generation, then modification times (stores without a content tag).
#: (``Content-MD5``, ``Digest`` and ``Last-Modified`` are what an HTTP server's headers give.)
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "Content-MD5", "Digest", "generation", "VersionId", "LastModified",
                 "last_modified", "Last-Modified", "mtime", "updated", "created")


@dataclass(frozen=True, slots=True)
class RawObject:
    """What a listing says about one remote raw file: its size in bytes and a tag that changes
    when its bytes do (``ETag:"…"``, else its modification time; ``""`` when the store has none)."""

    size: int
    version: str


@dataclass(frozen=True)
class FetchIssue(Issue):
    """An :class:`Issue` about the store at the moment of the fetch, not about the file's bytes:
    the object is gone, was replaced after discovery listed it, or the store could not be
    reached. True of this build only: the build cache keeps no entry holding one (the next
    build fetches the file again), where a bad file's record is kept under the file's key."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One listed remote file: ``relpath`` (POSIX, relative to the root), its full ``url``."""

    relpath: str
    url: str
    stat: RawObject


def raw_object(info: Mapping[str, Any]) -> RawObject:
    """The :class:`RawObject` of an fsspec ``info``/``find(detail=True)`` entry."""
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            return RawObject(size=int(info.get("size") or 0), version=f"{key}:{value}")
    return RawObject(size=int(info.get("size") or 0), version="")


#: Protocols whose paths are URL paths, percent-encoded (``a%20b.png`` names ``a b.png``); the
#: others (s3, gcs, az, memory, file) name their objects literally: a key may hold ``%20`` itself.
_ENCODED_SCHEMES = ("http", "https")


def _encoded(root: str) -> bool:
    return root.split("://", 1)[0].lower() in _ENCODED_SCHEMES


def join_relpath(root: str, relpath: str) -> str:
    """The URL of ``relpath`` (a file's real name, as a table row names it) under the URL
    ``root``; ``..`` and absolute paths are resolved against the root's path (``s3://b/raw/ct`` +
    ``../x.dcm`` → ``s3://b/raw/x.dcm``). Under an http(s) root the name is percent-encoded
    (``a b.png`` → ``a%20b.png``, ``c#1.png`` → ``c%231.png``). Not for an object a listing
    gave, which is read by its own key (:func:`_listed_url`)."""
    scheme, rest = root.split("://", 1)
    host, _, path = rest.partition("/")
    if _encoded(root):
        relpath = quote(relpath, safe="/")
    joined = posixpath.normpath(posixpath.join("/" + path, relpath)).lstrip("/")
    return f"{scheme}://{host}/{joined}" if joined else f"{scheme}://{host}"


def _listed_url(base: str, key: str) -> str:
    """The URL of an object a listing gave, by its own ``key`` below the root's URL ``base``.
    Never normalised, as :func:`join_relpath` normalises a table's cell: a store's keys are
    literal, so ``raw/dog//d.png`` (a prefix that ended in ``/`` joined with ``/``) is another
    object than ``raw/dog/d.png``, and reading the one for the other packs the wrong pixels."""
    return f"{base}/{key}"


def _hidden(relpath: str) -> bool:
    return any(part.startswith(".") for part in relpath.split("/"))


def _folder_marker(name: str, info: Mapping[str, Any]) -> bool:
    """Whether a listing's entry stands for a folder, not a file: a directory, or an object whose
    key ends in ``/`` (the zero-byte "folder" objects the S3 console's "Create folder" and sync
    tools write, which object stores list as files). A local folder is never a file; neither is
    its marker."""
    return info.get("type", "file") != "file" or name.endswith("/")


def list_remote_files(root: str, *, storage_options: Mapping[str, Any] | None = None,
                      where: str = "root") -> list[RemoteFile]:
    """Every file under the URL ``root`` (hidden files and folders skipped, as in the local
    listing), sorted by relative path, from one recursive listing.

    Raises ``ConfigError`` naming ``where`` when the root holds nothing, names one object (not a
    folder) or cannot be listed (missing bucket, credentials, endpoint), ``PackerError`` for other
    store failures.
    """
    fs, path = filesystem_for(root, storage_options)
    path = path.rstrip("/")
    try:
        fs.invalidate_cache(path)  # a listing cached by an earlier build in this process may be stale
        entries: dict[str, dict[str, Any]] = fs.find(path, detail=True)
        if not entries and not fs.isdir(path):
            raise ConfigError(f"{where}: nothing under {root}: no such folder or prefix; check the URL, the "
                              f"endpoint (AWS_ENDPOINT_URL or {surface().storage_options(endpoint_url='...')}) and "
                              "the credentials")
    except ConfigError:
        raise
    except remote_errors() as err:
        raise storage_error(root, err, doing=f"{where}: listing the raw files") from err
    if list(entries) == [path] and entries[path].get("type") == "file":
        # an object store's find gives an object's own entry for a path that names one object and no prefix
        # (http's gives a bare {} for any URL that answers, an empty index page too: not told apart here)
        raise ConfigError(f"{where}: {root} is an object, not a folder or prefix; a root names the folder the "
                          f"files are under: give its folder, {join_relpath(root, '..')} (with a table to take only "
                          "some of its files)")
    found = []
    base = join_relpath(root, ".")
    for name, info in entries.items():
        if _folder_marker(name, info):
            continue
        key = name[len(path) + 1:]  # as the store names it (percent-encoded under http)
        # the listing's links are URL paths: the relative path is the file's real name
        relpath = unquote(key) if _encoded(root) else key
        if relpath and not _hidden(relpath):
            found.append(RemoteFile(relpath=relpath, url=_listed_url(base, key), stat=raw_object(info)))
    if _encoded(root):
        found = _with_headers(fs, found, [name for name, info in entries.items() if info.get("size") is None])
    return sorted(found, key=lambda f: f.relpath)


def _with_headers(fs: Any, found: list[RemoteFile], unsized: list[str]) -> list[RemoteFile]:
    """``found`` with each file an http(s) listing gave no size for (an index page holds links,
    neither sizes nor versions) described by its own headers instead: one HEAD request a file,
    concurrent, for its Content-Length and its ETag or Last-Modified (:func:`raw_object`), so
    the build cache and the size limit see what they see on other stores. A file whose request
    fails keeps the listing's entry (its fetch then says what is wrong); a server that sends no
    ETag or Last-Modified gives no version: a file replaced at the same size is not noticed."""
    if not unsized:
        return found
    from fsspec.asyn import _run_coros_in_chunks, sync

    names = [name.rstrip("/") for name in unsized]
    infos = sync(fs.loop, _run_coros_in_chunks, [fs._info(name) for name in names], return_exceptions=True)
    headers = {unquote(name): info for name, info in zip(names, infos, strict=True) if isinstance(info, dict)}
    out = []
    for file in found:
        info = headers.get(unquote(fs._strip_protocol(file.url)))
        out.append(file if info is None or info.get("size") is None else replace(file, stat=raw_object(info)))
    return out


def read_heads(root: str, relpaths: Sequence[str], size: int,
               storage_options: Mapping[str, Any] | None = None) -> list[bytes]:
    """The first ``size`` bytes of each file under the URL ``root`` (fewer for a shorter file,
    ``b""`` for one that cannot be read), in order: one ranged request per file, concurrent
    where the store allows."""
    if not relpaths:
        return []
    fs, path = filesystem_for(root, storage_options)
    paths = [f"{path.rstrip('/')}/{quote(rel, safe='/') if _encoded(root) else rel}" for rel in relpaths]
    try:
        heads = fs.cat_ranges(paths, [0] * len(paths), [size] * len(paths), on_error="return")
    except remote_errors() as err:
        raise storage_error(root, err, doing="reading the first bytes of the raw files") from err
    return [head if isinstance(head, bytes) else b"" for head in heads]


def stat_remote(url: str, storage_options: Mapping[str, Any] | None = None) -> RawObject | None:
    """The :class:`RawObject` of the file at ``url``, or None when there is no such file.
    One request; raises ``ConfigError``/``PackerError`` (:func:`storage_error`) for other failures."""
    fs, path = filesystem_for(url, storage_options)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    except remote_errors() as err:
        raise storage_error(url, err, doing=f"looking up {url}") from err
    return raw_object(info) if info.get("type", "file") == "file" else None


def read_remote_bytes(url: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """All bytes of the (small) file at ``url``: a label table. Raises what fsspec raises."""
    fs, path = filesystem_for(url, storage_options)
    data: bytes = fs.cat_file(path)
    return data


@contextlib.contextmanager
def fetched(ref: SampleRef, listed: RawObject | None, *, limits: LimitsConfig,
            storage_options: Mapping[str, Any] | None = None, headers_only: bool = False,
            ) -> Iterator[SampleRef | Issue]:
    """``ref`` (whose ``path`` is a URL) with ``path`` pointing at a local copy of the file,
    deleted on exit; or an Issue (stage ``read``) saying why there is no copy.

    ``listed`` is what discovery's listing said about the file (None: one request asks). The
    size limit (``limits.max_decoded_bytes``, as the readers apply it) is checked before any
    byte is fetched, and a copy for decoding (not ``headers_only``) is checked against ``listed``
    after: its size, and the object's version tag as the store gives it now, one ``info``
    request (:func:`_changed_since_listing`; an http(s) server's answers tell no such thing and
    are not compared). So a copy from an object store is only ever decoded as the listed object,
    and a size limit applies to the bytes decoded. Issues (:class:`FetchIssue`, but ``too_large``): ``too_large``;
    ``missing_file`` (the object is gone, or was replaced since the listing: the listed version
    is gone); ``unreadable`` (access denied, no credentials, store unreachable: the message says
    what to fix). Raises
    ``ConfigError`` when this machine cannot open the URL's protocol at all (a defect of the
    run, not of the file). The copy lives in a fresh temporary folder (``$TMPDIR``) on the
    machine that runs the task.

    ``headers_only``: the copy is only good for the header probe
    (:func:`packer.pipeline.probe.probe_ref`), which gives on it exactly what it gives on the whole
    file: a file larger than :data:`HEAD_BYTES` becomes a sparse file of its listed size that
    holds the byte ranges the probe reads and zeros elsewhere (:func:`_fetch_probed_ranges`).
    Never hand such a copy to a decoder.
    """
    with tempfile.TemporaryDirectory(prefix="packer-fetch-") as folder:
        yield _fetch(ref, listed, Path(folder), limits, storage_options, headers_only)


def _fetch(ref: SampleRef, listed: RawObject | None, folder: Path, limits: LimitsConfig,
           storage_options: Mapping[str, Any] | None, headers_only: bool) -> SampleRef | Issue:
    url = ref.path
    try:
        fs, path = filesystem_for(url, storage_options)
        if listed is None:
            listed = raw_object(fs.info(path))
        too_big = file_size_problem(listed.size, limits)
        if too_big is not None:
            return Issue.of(ref, stage="read", reason="too_large", message=f"{url}: {too_big}")
        local = folder / ("raw" + _copy_suffix(posixpath.basename(url)))
        ranged = headers_only and listed.size > HEAD_BYTES and _fetch_probed_ranges(ref, fs, path, listed.size,
                                                                                    local, limits)
        if not ranged:
            fs.get_file(path, str(local))
            # the header pass keeps nothing: its copy is probed as it is, the decoding fetch checks
            changed = "" if headers_only else _changed_since_listing(fs, path, listed, local.stat().st_size,
                                                                     web=_encoded(url))
            if changed:
                return FetchIssue.of(ref, stage="read", reason="missing_file", message=(
                    f"{url}: the object changed after discovery listed it ({changed}): the listed version is "
                    "gone and the copy was not read; build again (once the object stays as it is), so that "
                    "discovery lists what is there now"))
    except FileNotFoundError as err:
        return FetchIssue.of(ref, stage="read", reason="missing_file",
                             message=f"{url}: the object was listed but is gone ({err}); restore it, or build again "
                                     "so that discovery lists what is there now")
    except remote_errors() as err:
        # a full or read-only temporary folder is this machine's defect, not the object's
        refused = refused_write(err, f"the local copy of {url} in {folder}", opening=True,
                                elsewhere="point TMPDIR at a folder with room") if isinstance(err, OSError) else None
        if refused is not None:
            raise refused from err
        return FetchIssue.of(ref, stage="read", reason="unreadable",
                             message=f"{describe_error(url, err)}; the file was not fetched")
    return replace(ref, path=str(local))


def _changed_since_listing(fs: Any, path: str, listed: RawObject, fetched_size: int, *, web: bool = False) -> str:
    """How the object at ``path``, just fetched whole as ``fetched_size`` bytes, differs from
    ``listed`` (``"size: listed 10 bytes, fetched 12"``), or ``""`` when it does not.

    The size is the copy's own; the version tag is the one the store gives
    now (one ``info`` request, past any cached listing), compared by the key the listing's tag
    came from (an ETag with an ETag): the fetch came between the listing and that answer, so
    an object replaced before the fetch is told, unless it was put back before the answer. A
    store whose answer lacks that key (or a listing without a tag) is checked by size alone.

    ``web``: an http(s) server, not checked: its listed size may be none (a response without
    Content-Length lists as 0 bytes) or the compressed one (the body arrives decompressed), and a
    tag names one server's copy, not the content (behind a load balancer each backend's ETag or
    Last-Modified differs for the same bytes), so neither tells a changed file.
    Raises what the store raises."""
    if web:
        return ""
    if fetched_size != listed.size:
        return f"size: listed {listed.size} bytes, fetched {fetched_size}"
    if not listed.version:
        return ""
    fs.invalidate_cache(path)  # the listing's own entry may be cached in this process
    key, _, value = listed.version.partition(":")
    now = fs.info(path).get(key)
    if now in (None, "") or str(now) == value:
        return ""
    return f"{key}: listed {value}, now {now}"


def _copy_suffix(name: str) -> str:
    """The suffix a local copy of the file ``name`` keeps: the readers tell some kinds by it
    (nibabel a NIfTI file by ``.nii`` or ``.nii.gz``) and name it in messages. The name itself
    is dropped (any length, any characters). Where the name ends in ``.gz`` (any case) the
    suffix before it is kept too, so ``ct.nii.gz`` becomes ``raw.nii.gz``, not ``raw.gz``;
    each part is cut to 16 characters."""
    stem, suffix = posixpath.splitext(name)
    if suffix.lower() == ".gz":
        return posixpath.splitext(stem)[1][:16] + suffix
    return suffix[:16]


class _ObjectChanged(Exception):
    """A ranged read came back shorter than the listed size says: the object changed since."""


class _RangedObject:
    """A read-only, seekable binary file over one remote object of known ``size``, as a local
    file reads (``read(n)`` stops at the end, ``read()`` reads to it), that fetches what is
    read and keeps it.

    Bytes are fetched in blocks of :data:`HEAD_BYTES`, one ``cat_file`` range request per run
    of missing blocks; a run is stretched forward (over missing blocks, up to the end) to as
    many blocks as are already held, so a header read front to back costs O(log n) requests
    for at most twice the bytes it needs. A store error is kept in ``failure`` and raised again
    on every later read (the rehearsed reader may catch it; the caller must not miss it).
    """

    def __init__(self, fs: Any, path: str, size: int) -> None:
        self._fs, self._path, self.size = fs, path, size
        self._blocks: dict[int, bytes] = {}
        self._pos = 0
        self.failure: BaseException | None = None

    def read_at(self, offset: int, count: int) -> bytes:
        """``count`` bytes (all to the end when negative) from ``offset``, fewer at the end."""
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        end = self.size if count < 0 else min(self.size, offset + count)
        if end <= offset:
            return b""
        first, last = offset // HEAD_BYTES, (end - 1) // HEAD_BYTES
        self._fetch_blocks(first, last + 1)
        if first == last:  # pydicom reads element by element: slice, never copy a whole block
            return self._blocks[first][offset - first * HEAD_BYTES:end - first * HEAD_BYTES]
        middle = [self._blocks[i] for i in range(first + 1, last)]
        return b"".join([self._blocks[first][offset - first * HEAD_BYTES:], *middle,
                         self._blocks[last][:end - last * HEAD_BYTES]])

    def read(self, size: int = -1, /) -> bytes:
        data = self.read_at(self._pos, size)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0, /) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def runs(self) -> list[tuple[int, bytes]]:
        """The fetched bytes as (offset, bytes) runs, in order, adjacent blocks joined."""
        runs: list[tuple[int, list[bytes]]] = []
        for index in sorted(self._blocks):
            if runs and runs[-1][0] + len(runs[-1][1]) == index:
                runs[-1][1].append(self._blocks[index])
            else:
                runs.append((index, [self._blocks[index]]))
        return [(first * HEAD_BYTES, b"".join(blocks)) for first, blocks in runs]

    def _fetch_blocks(self, first: int, stop: int) -> None:
        if self.failure is not None:
            raise self.failure
        last_block = (self.size - 1) // HEAD_BYTES
        index = first
        while index < stop:
            if index in self._blocks:
                index += 1
                continue
            end = max(stop, index + len(self._blocks))
            run_end = index + 1
            while run_end < min(end, last_block + 1) and run_end not in self._blocks:
                run_end += 1
            start, length = index * HEAD_BYTES, min(self.size, run_end * HEAD_BYTES) - index * HEAD_BYTES
            try:
                data: bytes = self._fs.cat_file(self._path, start=start, end=start + length)
            except remote_errors() as err:
                self.failure = err
                raise
            if len(data) != length:
                self.failure = _ObjectChanged(f"bytes {start}-{start + length} of a {self.size}-byte object "
                                              f"came back as {len(data)} bytes")
                raise self.failure
            for block in range(index, run_end):
                at = (block - index) * HEAD_BYTES
                self._blocks[block] = data[at:at + HEAD_BYTES]
            index = run_end


def _fetch_probed_ranges(ref: SampleRef, fs: Any, path: str, size: int, local: Path,
                         limits: LimitsConfig) -> bool:
    """Write ``local``: a sparse file of ``size`` bytes holding every byte the header probe of
    ``ref`` (a ``size``-byte object at ``path``) reads, zeros elsewhere. False, with nothing
    written, when the probe reads the whole file anyway (a deflated DICOM data set) or the
    object no longer has the listed size: the caller then fetches it whole, streamed to disk.
    Raises what the store raises (``FileNotFoundError``, ``remote_errors()``).

    The rule: the probe is rehearsed on a :class:`_RangedObject` of the object, which serves
    every read from real bytes of the object, fetched as they are read. A reader is a
    deterministic function of the bytes it reads and of the file size, so the probe on the
    copy (same size, same bytes wherever the rehearsal read) makes the same reads and returns
    what it returns on the whole file. It never sees a zero the whole file does not hold.
    Each source kind rehearses its own probe
    (:meth:`packer.read.kinds.SourceKind.rehearse_probe`): images run the probe itself on the
    object, DICOM files its reads, so a DICOM head is only enough once pydicom has met the Pixel
    Data tag in it (or failed on the bytes it holds).

    Unlike a whole fetch, an object replaced at the same size between two of its range
    requests would be read as a mix of both versions; the next listing gives it a new version
    tag. The copy is sparse where the file system allows (ext4, xfs, tmpfs, APFS, ...).
    """
    source = _RangedObject(fs, path, size)
    whole = source_kind(ref.kind).rehearse_probe(ref, source, limits)  # its outcome is that of the copy's probe
    if source.failure is not None and not isinstance(source.failure, _ObjectChanged):
        raise source.failure
    if whole or source.failure is not None:
        return False
    with open(local, "wb") as copy:
        copy.truncate(size)
        for offset, data in source.runs():
            copy.seek(offset)
            copy.write(data)
    return True


def remote_listing(refs: Sequence[SampleRef], listed: Mapping[str, RawObject]) -> tuple[tuple[str, RawObject], ...]:
    """The entries of ``listed`` for ``refs`` (the part of discovery's listing a task needs)."""
    return tuple((ref.path, listed[ref.path]) for ref in refs if ref.path in listed)
