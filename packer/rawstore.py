"""Raw store: list and fetch raw files that live behind fsspec URLs (``s3://``, ``gs://``, ...).

The client lists a source root with one recursive listing (:func:`list_remote_files`), which
also gives each object's size and version tag (:class:`RawObject`): the build cache keys a
remote file by them, as it keys a local file by its stat, and the workers check the size
limit against them before fetching anything. A worker fetches each file once, whole, into a
private temporary folder on its own disk (:func:`fetched`), runs the ordinary path-based
readers on the copy and deletes it; a file that cannot be fetched becomes an :class:`Issue`.

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

from packer.config import LimitsConfig
from packer.errors import ConfigError
from packer.read.limits import file_size_problem
from packer.records import Issue, SampleRef
from packer.storage import describe_error, filesystem_for, remote_errors, storage_error

#: Keys of an fsspec ``info`` dict that change when an object's bytes do, most telling first:
#: S3/Azure ETag, GCS md5/generation, then modification times (stores without a content tag).
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "generation", "VersionId", "LastModified", "last_modified",
                 "mtime", "updated", "created")


@dataclass(frozen=True, slots=True)
class RawObject:
    """What a listing says about one remote raw file: its size in bytes and a tag that changes
    when its bytes do (``ETag:"…"``, else its modification time; ``""`` when the store has none)."""

    size: int
    version: str


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


def join_relpath(root: str, relpath: str) -> str:
    """The URL of ``relpath`` under the URL ``root``; ``..`` and absolute paths are resolved
    against the root's path (``s3://b/raw/ct`` + ``../x.dcm`` → ``s3://b/raw/x.dcm``)."""
    scheme, rest = root.split("://", 1)
    host, _, path = rest.partition("/")
    joined = posixpath.normpath(posixpath.join("/" + path, relpath)).lstrip("/")
    return f"{scheme}://{host}/{joined}" if joined else f"{scheme}://{host}"


def _hidden(relpath: str) -> bool:
    return any(part.startswith(".") for part in relpath.split("/"))


def list_remote_files(root: str, *, storage_options: Mapping[str, Any] | None = None,
                      where: str = "root") -> list[RemoteFile]:
    """Every file under the URL ``root`` (hidden files and folders skipped, as in the local
    listing), sorted by relative path, from one recursive listing.

    Raises ``ConfigError`` naming ``where`` when the root holds nothing or cannot be listed
    (missing bucket, credentials, endpoint), ``PackerError`` for other store failures.
    """
    fs, path = filesystem_for(root, storage_options)
    path = path.rstrip("/")
    try:
        fs.invalidate_cache(path)  # a listing cached by an earlier build in this process may be stale
        entries: dict[str, dict[str, Any]] = fs.find(path, detail=True)
        if not entries and not fs.isdir(path):
            raise ConfigError(f"{where}: nothing under {root}: no such folder or prefix; check the URL, the "
                              "endpoint (AWS_ENDPOINT_URL or --storage-option endpoint_url=...) and the credentials")
    except ConfigError:
        raise
    except remote_errors() as err:
        raise storage_error(root, err, doing=f"{where}: listing the raw files") from err
    found = []
    for name, info in entries.items():
        relpath = name.rstrip("/")[len(path) + 1:]
        if info.get("type", "file") == "file" and relpath and not _hidden(relpath):
            found.append(RemoteFile(relpath=relpath, url=join_relpath(root, relpath), stat=raw_object(info)))
    return sorted(found, key=lambda f: f.relpath)


def read_heads(root: str, relpaths: Sequence[str], size: int,
               storage_options: Mapping[str, Any] | None = None) -> list[bytes]:
    """The first ``size`` bytes of each file under the URL ``root`` (fewer for a shorter file,
    ``b""`` for one that cannot be read), in order: one ranged request per file, concurrent
    where the store allows."""
    if not relpaths:
        return []
    fs, path = filesystem_for(root, storage_options)
    paths = [f"{path.rstrip('/')}/{rel}" for rel in relpaths]
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
            storage_options: Mapping[str, Any] | None = None) -> Iterator[SampleRef | Issue]:
    """``ref`` (whose ``path`` is a URL) with ``path`` pointing at a local copy of the file,
    deleted on exit; or an Issue (stage ``read``) saying why there is no copy.

    ``listed`` is what discovery's listing said about the file (None: one request asks). The
    size limit (``limits.max_decoded_bytes``, as the readers apply it) is checked before any
    byte is fetched. Issues: ``too_large``; ``missing_file`` (the object is gone); ``unreadable``
    (access denied, no credentials, store unreachable: the message says what to fix). Raises
    ``ConfigError`` when this machine cannot open the URL's protocol at all (a defect of the
    run, not of the file). The copy lives in a fresh temporary folder (``$TMPDIR``) on the
    machine that runs the task.
    """
    with tempfile.TemporaryDirectory(prefix="packer-fetch-") as folder:
        yield _fetch(ref, listed, Path(folder), limits, storage_options)


def _fetch(ref: SampleRef, listed: RawObject | None, folder: Path, limits: LimitsConfig,
           storage_options: Mapping[str, Any] | None) -> SampleRef | Issue:
    url = ref.path
    try:
        fs, path = filesystem_for(url, storage_options)
        size = listed.size if listed is not None else int(fs.info(path)["size"])
        too_big = file_size_problem(size, limits)
        if too_big is not None:
            return Issue.of(ref, stage="read", reason="too_large", message=f"{url}: {too_big}")
        # the copy keeps the suffix (readers name it in messages) but not the name (any length)
        local = folder / ("raw" + posixpath.splitext(posixpath.basename(url))[1][:16])
        fs.get_file(path, str(local))
    except FileNotFoundError as err:
        return Issue.of(ref, stage="read", reason="missing_file",
                        message=f"{url}: the object was listed but is gone ({err}); restore it, or build again "
                                "so that discovery lists what is there now")
    except remote_errors() as err:
        return Issue.of(ref, stage="read", reason="unreadable",
                        message=f"{describe_error(url, err)}; the file was not fetched")
    return replace(ref, path=str(local))


def remote_listing(refs: Sequence[SampleRef], listed: Mapping[str, RawObject]) -> tuple[tuple[str, RawObject], ...]:
    """The entries of ``listed`` for ``refs`` (the part of discovery's listing a task needs)."""
    return tuple((ref.path, listed[ref.path]) for ref in refs if ref.path in listed)
