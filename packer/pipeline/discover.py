"""Discover: list every raw file of every source in a stable order and attach label, entity, time.

This is the client side of the header pass. It lists files (sorted, so the listing order of
the file system never matters), reads the label tables, and produces one unprobed
:class:`SampleRef` per file, or an :class:`Issue` for a table row whose file is missing.
:mod:`packer.pipeline.probe` (run on workers) then reads headers and fills in what only the file knows.

A source whose root is a URL is listed through :mod:`packer.pipeline.rawstore` under the same rules;
its refs carry the full URL as ``path``, and :func:`discover` also returns what the
listing said about each remote file (size, version tag) for the build cache's keys.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import hashlib
import io
import os
import posixpath
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from stat import S_ISFIFO, S_ISREG
from typing import Any, BinaryIO

import numpy as np
import pyarrow.compute as pc

from packer.config import MAPPING_JOB, JobConfig, SourceConfig, SplitConfig
from packer.errors import ConfigError
from packer.keys import KeyParts, make_key, parse_key
from packer.manifest import INDEX_FILE, SPLITS_FILE
from packer.phi import Pseudonymizer
from packer.pipeline.labels import Refused, from_folder
from packer.pipeline.listings import BUILD_LISTINGS, Listings
from packer.pipeline.rawstore import (
    RawObject,
    RemoteFile,
    join_relpath,
    list_remote_files,
    read_heads,
    stat_remote,
)
from packer.pipeline.sampletable import RefTable, TableBuilder
from packer.pipeline.splitlists import is_extension
from packer.pipeline.tables import (
    Placed,
    TableRow,
    escapes_root,
    folder_link_on_way,
    is_url_cell,
    normalize_time,
    place_rows,
    read_records,
    written_from_base,
)
from packer.progress import Progress, stage_progress
from packer.read.archives import ZARR_MARKERS, compressed, zarr_detail
from packer.read.kinds import SourceKind, source_kind
from packer.read.opening import link_text
from packer.records import Excluded, Issue, SampleRef, safe_key
from packer.redact import note_names
from packer.storage import MANIFEST_FILE, build_cache_dir, is_url, resolve_output
from packer.where import failed


def make_sample_id(source: str, relpath: str, phi: Pseudonymizer | None = None) -> str:
    """A stable, tar-safe sample id: source name plus 16 hex identifying the relative path
    (keyed HMAC when pseudonymizing, so MRN-like folder names cannot be guessed back)."""
    digest = phi.path_digest(source, relpath) if phi is not None else hashlib.sha256(relpath.encode()).hexdigest()[:16]
    return f"{safe_key(source)}-{digest}"


def _shown_name(name: str) -> str:
    """``name`` (a path or a relative path as the OS gave it) as a record or a message may hold
    it: where it is not valid UTF-8 (a Latin-1 name copied from an old export, whose bad bytes
    Python holds as surrogates), those bytes escaped (``caf\\xe9.png``); otherwise ``name``."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    return name


def _name_id(source: str, relpath: str, phi: Pseudonymizer | None = None) -> str:
    """The sample id of the file or folder at ``relpath``: :func:`make_sample_id`'s, or for a name
    that is not valid UTF-8 (which cannot be hashed as text), that of its escaped text
    (:func:`_shown_name`) after a NUL no file name holds: the escaped text alone is also the name
    of a file spelled with a real backslash (``caf\\xe9.png``), whose sample would share the id."""
    shown = _shown_name(relpath)
    return make_sample_id(source, relpath if shown is relpath else "\0" + shown, phi)


def _note_real(real_paths: dict[str, str] | None, sample_id: str, path: str, shown: str) -> None:
    """Keep ``path`` (as the OS gave it) in ``real_paths`` by ``sample_id`` where its record holds
    it escaped (``shown``, :func:`_shown_name`): ``packer locate`` prints the real name."""
    if real_paths is not None and shown != path:
        real_paths[sample_id] = path


def _walk_relpaths(root: Path, follow_links: bool = False, links: list[str] | None = None,
                   progress: Progress | None = None, unlisted: list[tuple[str, OSError]] | None = None,
                   aliases: list[tuple[str, str]] | None = None) -> list[str]:
    """POSIX paths relative to ``root`` of every file under it, hidden files and folders left
    out, sorted. Strings, not Paths: a Path costs several objects, and at 100k files discovery's
    Paths were the client's largest short-lived allocation. Without ``follow_links``, links to
    folders are not entered; their relative paths go into ``links`` when given. ``progress``
    counts the files found, folder by folder. With ``follow_links`` each real folder is walked
    once, the first way the walk reaches it (real subfolders before links, at each level): a link
    back to a folder above it (``a/loop -> ..``) is not walked again and again until the path
    gets too long, listing every file once per lap. Without ``follow_links``, a link to a folder
    under a hidden folder of the root is walked all the same, its files listed at the link's
    paths (they are nowhere else; each such folder once). A folder that cannot be listed (no read
    or execute permission, a path too long) goes into ``unlisted`` as (its relative path, the
    error), where given: its files are not silently missing. A folder not walked because its
    files are listed at other paths (a link to a folder under the root, ``kitty -> cat``; with
    ``follow_links``, any folder whose real folder was walked the first way) goes into
    ``aliases`` as (its relative path, the relative path its files are listed under; "" for the
    root), where given: its files are one each, listed once, and :func:`_aliased_files` accounts
    for the paths not listed."""
    top = os.fspath(root)
    found: list[str] = []
    walked: dict[tuple[int, int], str] = {}

    def refused(err: OSError) -> None:
        if unlisted is not None and err.filename is not None:
            rel = os.path.relpath(os.fspath(err.filename), top).replace(os.sep, "/")
            unlisted.append((rel, err))

    real_top = os.path.realpath(top)
    pending, entered = [top], {real_top: ""}
    while pending:
        for folder, dirs, files in os.walk(pending.pop(), followlinks=follow_links, onerror=refused):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            prefix = os.path.relpath(folder, top).replace(os.sep, "/")
            prefix = "" if prefix == "." else prefix + "/"
            if follow_links:
                dirs[:] = _first_visits(folder, prefix, dirs, walked, aliases)
            before = len(found)
            found.extend(prefix + name for name in files if not name.startswith("."))
            if progress is not None:
                progress.update(len(found) - before)
            if follow_links:
                continue
            for d in dirs:
                path = os.path.join(folder, d)
                if not os.path.islink(path):
                    continue
                target = os.path.realpath(path)
                if _hidden_inside(target, real_top) and target not in entered:
                    # a link into a hidden folder of the root (raw/cat -> raw/.store/cat, as caches
                    # and annexes lay files out): the walk never lists those files at their own
                    # paths, so they are listed at the link's
                    entered[target] = prefix + d
                    pending.append(path)
                    continue
                if aliases is not None:
                    listed_at = _listed_at(target, real_top, entered)
                    if listed_at is not None:
                        aliases.append((prefix + d, listed_at))
                if links is not None:
                    links.append(prefix + d)
    found.sort()
    return found


def _hidden_inside(target: str, root: str) -> bool:
    """Whether the real path ``target`` lies inside the real folder ``root`` under a hidden
    folder (a relative path with a part starting with a dot), which the walk does not enter."""
    rel = os.path.relpath(target, root)
    parts = rel.split(os.sep)
    return rel != "." and parts[0] != ".." and any(part.startswith(".") for part in parts)


def _listed_at(target: str, real_top: str, entered: Mapping[str, str]) -> str | None:
    """The relative path under which the walk lists the files of the real folder ``target`` that
    a link not entered leads to: its own path under the root, or, in a hidden folder, the path of
    the link through which the walk entered it (``entered``); None outside the root, or in a
    hidden folder no link entered."""
    for real, at in entered.items():
        if at and (target == real or target.startswith(real + os.sep)):
            rest = os.path.relpath(target, real).replace(os.sep, "/")
            return at if rest == "." else f"{at}/{rest}"
    rel = os.path.relpath(target, real_top)
    if rel.split(os.sep)[0] == ".." or _hidden_inside(target, real_top):
        return None
    return "" if rel == "." else rel.replace(os.sep, "/")


def _first_visits(folder: str, prefix: str, dirs: list[str], walked: dict[tuple[int, int], str],
                  aliases: list[tuple[str, str]] | None = None) -> list[str]:
    """The subfolders of ``folder`` (at ``prefix`` under the root) whose real folder no walk has
    reached yet (by device and inode, recorded in ``walked`` with the relative path it was walked
    at; the root's is recorded on its first call), real ones first. Each other one goes into
    ``aliases`` as (its relative path, the one its files are listed under), where given."""
    if not walked:
        with contextlib.suppress(OSError):
            info = os.stat(folder)
            walked[(info.st_dev, info.st_ino)] = ""
    kept = []
    for name in sorted(dirs, key=lambda d: os.path.islink(os.path.join(folder, d))):
        try:
            info = os.stat(os.path.join(folder, name))
        except OSError:
            continue
        key = (info.st_dev, info.st_ino)
        if key not in walked:
            walked[key] = prefix + name
            kept.append(name)
        elif aliases is not None:
            aliases.append((prefix + name, walked[key]))
    return kept


@dataclass(frozen=True)
class Unread:
    """Why the first bytes of a file were not read: the OS error opening or reading it (a broken
    link, a loop of links, no read permission), or what it is instead of a regular file (a named
    pipe, a socket, a device: never read, so nothing waits on a writer). Not a verdict on the
    file: the read names its defect (``missing_file``, ``unreadable``), as it does for a file
    named as its kind's."""

    why: str


def _read_head(path: str, size: int) -> bytes | Unread:
    """The first ``size`` bytes of the file at ``path`` (fewer for a shorter one), or why none
    were read (:class:`Unread`). Opened without blocking, and read only where it is a regular
    file: a named pipe among the files (``IM0001`` a FIFO) does not hang the listing until some
    writer opens it; a regular file reads as it always does."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        return Unread(err.strerror or str(err))
    try:
        with open(fd, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not S_ISREG(mode):
                return Unread("a named pipe" if S_ISFIFO(mode) else "not a regular file")
            return fh.read(size) or b""
    except OSError as err:
        return Unread(err.strerror or str(err))


def _suffix(relpath: str) -> str:
    """The lower-cased suffix of a relative path's file name, as ``Path.suffix`` gives it."""
    name = relpath.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return name[dot:].lower() if 0 < dot < len(name) - 1 else ""


def own_output_folders(job: JobConfig) -> tuple[str, ...]:
    """Where builds of ``job`` write, as absolute local paths or URLs: its dataset folder
    ``<output>/<name>/`` (a URL output's too, and the local folder it is built in under the work
    folder) and its build cache in the work folder (:func:`~packer.storage.build_cache_dir`). A
    source root may hold them (``root: data``, ``output: data/packed``): nothing in them is
    raw input, and a listing that took the first build's shards for archives to unpack made every
    rebuild a new version (:func:`_without_packer_output`)."""
    output, remote = resolve_output(job.output)
    folders = [os.fspath(output / job.name), os.fspath(build_cache_dir(job.name, remote or os.fspath(output)))]
    if remote is not None:
        folders.append(f"{remote.rstrip('/')}/{job.name}")
    return tuple(folders)


def _relative_folders(root: Path | str, folders: Sequence[str]) -> list[str]:
    """The relative paths under ``root`` (a local folder or a URL) of those of ``folders`` that lie
    under it (``""`` for the root itself), real paths compared for a local root."""
    out = []
    if isinstance(root, str):
        top = root.rstrip("/") + "/"
        for folder in folders:
            if is_url(folder) and (folder.rstrip("/") + "/").startswith(top):
                out.append(folder.rstrip("/")[len(top):])
        return out
    real_root = os.path.realpath(root)
    for folder in folders:
        if is_url(folder):
            continue
        rel = os.path.relpath(os.path.realpath(folder), real_root)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            out.append("" if rel == os.curdir else rel.replace(os.sep, "/"))
    return out


def _version_folders(relpaths: Iterable[str]) -> set[str]:
    """The folders (relative paths, ``""`` for the root) among ``relpaths`` that are version folders
    of packer's: each holds the sample index (``_index.parquet``) beside ``manifest.json`` or the
    splits table, as every build writes them (a version whose build stopped before its manifest
    has the two tables)."""
    names: defaultdict[str, set[str]] = defaultdict(set)
    for rel in relpaths:
        folder, _, name = rel.rpartition("/")
        if name in (INDEX_FILE, MANIFEST_FILE, SPLITS_FILE):
            names[folder].add(name)
    return {folder for folder, held in names.items() if INDEX_FILE in held and len(held) > 1}


def _without_packer_output(relpaths: Sequence[str], own: Sequence[str]) -> tuple[list[str], list[str]]:
    """``relpaths`` without the files under the job's own output folders (``own``: relative
    folders, :func:`own_output_folders`) and under any version folder of packer's
    (:func:`_version_folders`: another job's, or one copied there): a build's shards are no raw
    files, nor archives to unpack. Also the version folders skipped outside ``own``, sorted, for
    one warning (the job's own output is skipped unsaid). A root that is itself the job's dataset
    folder (``output: data``, ``name: rsna``, ``root: data/rsna``) keeps its raw files: only its
    version folders, the job's own, are skipped (unsaid)."""
    versions = _version_folders(relpaths)
    own_root = "" in own
    skipped = {o for o in own if o} | versions
    if not skipped:
        return list(relpaths), []

    def under(rel: str) -> bool:
        parts = rel.split("/")
        return any("/".join(parts[:depth]) in skipped for depth in range(1, len(parts)))

    def owned(version: str) -> bool:
        return (own_root and "/" not in version) or any(version == o or version.startswith(o + "/") for o in own if o)

    said = sorted(v for v in versions if not owned(v))
    return [rel for rel in relpaths if not under(rel)], said


def _verdict(kind: SourceKind, relpath: str) -> bool | None:
    """Whether the file at ``relpath`` is one of ``kind``'s by its name, None when only its head can tell."""
    return kind.lists_name(relpath.rsplit("/", 1)[-1].lower(), _suffix(relpath))


def _opener(path: str) -> Callable[[], BinaryIO]:
    """What opens the local file at ``path`` for reading bytes, when called."""
    return lambda: open(path, "rb")  # the caller closes it


class ZarrStores:
    """Which folders under a root hold a Zarr store: a folder named ``*.zarr``, or one holding a
    Zarr metadata file (:data:`~packer.read.archives.ZARR_MARKERS`), where ``marked`` tells (a
    local root's folders are looked at, the walk skipping hidden files such as ``.zarray``; a
    URL root's listing names them). Each folder is looked at once."""

    def __init__(self, marked: Callable[[str], bool]) -> None:
        self._marked = marked
        self._seen: dict[str, bool] = {}

    @classmethod
    def local(cls, root: str) -> ZarrStores:
        return cls(lambda folder: any(os.path.isfile(os.path.join(root, folder, m)) for m in ZARR_MARKERS))

    @classmethod
    def listed(cls, relpaths: Iterable[str]) -> ZarrStores:
        folders = {rel.rpartition("/")[0] for rel in relpaths if rel.rpartition("/")[2] in ZARR_MARKERS}
        return cls(folders.__contains__)

    def holds(self, relpath: str) -> bool:
        """Whether the file at ``relpath`` lies inside a Zarr store (a folder above it is one)."""
        parts = relpath.split("/")[:-1]
        for depth in range(len(parts), 0, -1):
            folder = "/".join(parts[:depth])
            if folder not in self._seen:
                self._seen[folder] = parts[depth - 1].lower().endswith(".zarr") or self._marked(folder)
            if self._seen[folder]:
                return True
        return False


def _unsupported(kind: SourceKind, relpath: str, head: bytes | None = None,
                 read: Callable[[], BinaryIO] | None = None, stores: ZarrStores | None = None) -> str | None:
    """:func:`_told`, but for a file inside a Zarr store (``stores``), which the kind would tell as
    one of its own it cannot read (a chunk ``0/0`` as an export's extension-less image): said
    to be the store's, with the fix (convert the array)."""
    said = _told(kind, relpath, head, read)
    if said is not None and stores is not None and stores.holds(relpath):
        return zarr_detail(f"a {kind.name} source reads {kind.looked_for}")
    return said


def _told(kind: SourceKind, relpath: str, head: bytes | None = None,
          read: Callable[[], BinaryIO] | None = None) -> str | None:
    """What an unlisted file at ``relpath`` is, where ``kind`` finds but cannot read it
    (:meth:`unsupported`), or, where its name could not tell and its ``head`` did not make it
    one of the kind's, what that head says (:meth:`unrecognised`). For a file compressed whole
    with gzip, bzip2 or xz (``IM0035.gz``) that head is what it decompresses to, from the file
    ``read`` opens (:meth:`~packer.read.archives.Compressed.decoded_head`; ``b""`` where it
    cannot be opened now): its name says nothing of what it holds (``syslog.2.gz``)."""
    name, suffix = relpath.rsplit("/", 1)[-1].lower(), _suffix(relpath)
    said = kind.unsupported(name, suffix)
    if said is not None or head is None:
        return said
    squeezed = compressed(name)
    if squeezed is not None and squeezed.peekable and read is not None:
        try:
            with read() as fh:
                head = squeezed.decoded_head(fh.read, kind.head_bytes)
        except OSError:  # gone or locked since its head was read: nothing of it decoded
            head = b""
    return kind.unrecognised(name, suffix, head)


def source_relpaths(kind: SourceKind, root: Path, follow_links: bool = False, links: list[str] | None = None, *,
                    quiet: bool = False, unsupported: dict[str, str] | None = None,
                    unlisted: list[tuple[str, OSError]] | None = None,
                    aliases: list[tuple[str, str]] | None = None, own: Sequence[str] = (),
                    skipped: list[str] | None = None) -> list[str]:
    """Relative paths of the files of a ``kind`` source under ``root``: those its name says are
    the kind's (:meth:`~packer.read.kinds.SourceKind.lists`), plus those whose head the kind
    recognises where the name cannot tell (a DICOM file without a suffix: :meth:`sniff`); hidden
    files and folders are skipped (``links``: see :func:`_walk_relpaths`). The files of formats
    the kind finds but cannot read (a WebP image: :meth:`unsupported`) go into ``unsupported``
    (relative path → what it is and what to do), where given; folders that cannot be listed into
    ``unlisted``, folders whose files are listed at other paths into ``aliases``
    (:func:`_walk_relpaths`). Nothing under the job's own output folders (``own``, absolute:
    :func:`own_output_folders`) or a version folder of packer's is listed; the latter go into
    ``skipped`` (:func:`_without_packer_output`). A long walk shows a ``listing``
    progress line (files found), a long look at heads a ``sniffing`` one (files looked at),
    unless ``quiet``."""
    with stage_progress("listing", None, unit="files", quiet=quiet) as walking:
        walked = _walk_relpaths(root, follow_links, links, walking, unlisted, aliases)
    walked, said = _without_packer_output(walked, _relative_folders(root, own))
    if skipped is not None:
        skipped.extend(said)
    out = []
    stores = ZarrStores.local(os.fspath(root))
    with stage_progress("sniffing", len(walked), unit="files", quiet=quiet or not kind.head_bytes) as sniffing:
        for rel in walked:
            verdict = _verdict(kind, rel)
            head = _read_head(os.path.join(root, rel), kind.head_bytes) if verdict is None and kind.head_bytes else b""
            if isinstance(head, Unread):
                # its bytes could not be looked at (a broken link, no permission, a named pipe): a
                # name the kind would speak for is listed, for the read to name the defect as it
                # names it for the kind's named files; another is told by its name alone
                if kind.lists_unread(rel.rsplit("/", 1)[-1].lower(), _suffix(rel)):
                    out.append(rel)
                elif unsupported is not None and (what := _unsupported(kind, rel, stores=stores)):
                    unsupported[rel] = what
            elif verdict or (verdict is None and kind.head_bytes and kind.sniff(head)):
                out.append(rel)
            elif unsupported is not None and (what := _unsupported(
                    kind, rel, head if verdict is None else None,
                    _opener(os.path.join(root, rel)), stores)):
                unsupported[rel] = what
            sniffing.update()
    return out


def list_remote_source(source: SourceConfig, storage_options: Mapping[str, Any] | None = None, *,
                       unsupported: list[tuple[str, str, str]] | None = None,
                       present: set[str] | None = None, own: Sequence[str] = (),
                       skipped: list[str] | None = None) -> list[RemoteFile]:
    """The raw files of a source whose root is a URL, by the rules of :func:`source_relpaths`
    (``unsupported``: (relative path, URL, what it is) of each, in order; ``present``: where the
    relative path of every object under the root goes, listed or not), sorted by relative
    path. Files only a head can tell (extension-less DICOM candidates) cost one ranged read each
    (concurrent); the others are not read. A file shorter than a head cannot be the kind's, but
    where ``unsupported`` is asked for, its head is read too (one more ranged read), so that it
    is described by its bytes as a local root's is ("a file of 5 bytes", not "an empty file"). As
    there, the job's own output (``own``) and packer's version folders (into ``skipped``) are
    not listed."""
    if not isinstance(source.root, str):
        raise TypeError(f"sources.{source.name}.root is a local folder, not a URL")
    kind = source_kind(source.kind)
    files = list_remote_files(source.root, storage_options=storage_options, where=f"sources.{source.name}.root")
    if present is not None:
        present.update(f.relpath for f in files)
    kept_rels, said = _without_packer_output([f.relpath for f in files], _relative_folders(source.root, own))
    if skipped is not None:
        skipped.extend(said)
    if len(kept_rels) < len(files):
        keep = set(kept_rels)
        files = [f for f in files if f.relpath in keep]
    verdicts = [_verdict(kind, f.relpath) for f in files]
    unsure = [f for f, verdict in zip(files, verdicts, strict=True)
              if verdict is None and kind.head_bytes
              and (f.stat.size >= kind.head_bytes or (unsupported is not None and f.stat.size > 0))]
    heads = read_heads(source.root, [f.relpath for f in unsure], kind.head_bytes, storage_options) if unsure else []
    recognised = {f.relpath for f, head in zip(unsure, heads, strict=True) if kind.sniff(head)}
    head_of = {f.relpath: head for f, head in zip(unsure, heads, strict=True)}  # an empty file: b""
    # a file compressed whole (IM0035.gz) is told by what it decompresses to: its start is read
    # once more, as far as its decoder needs (bzip2: a whole block), from which _unsupported decodes
    peeked: defaultdict[int, list[str]] = defaultdict(list)  # by how much of each to read
    for f in unsure:
        squeezed = compressed(f.relpath.rsplit("/", 1)[-1].lower())
        if unsupported is not None and f.relpath not in recognised and squeezed is not None and squeezed.peekable:
            peeked[squeezed.peek_bytes].append(f.relpath)
    starts = {rel: start for size, rels in peeked.items()
              for rel, start in zip(rels, read_heads(source.root, rels, size, storage_options), strict=True)}
    kept = [f for f, verdict in zip(files, verdicts, strict=True) if verdict or f.relpath in recognised]
    if unsupported is not None:
        taken = {f.relpath for f in kept}
        stores = ZarrStores.listed(f.relpath for f in files)
        unsupported.extend((f.relpath, f.url, what) for f, verdict in zip(files, verdicts, strict=True)
                           if f.relpath not in taken and (what := _unsupported(
                               kind, f.relpath, head_of.get(f.relpath, b"") if verdict is None and kind.head_bytes
                               else None, functools.partial(io.BytesIO, starts[f.relpath])
                               if f.relpath in starts else None, stores)) is not None)
    return kept


def _real_outside(path: Path, real_root: Path) -> Path | None:
    """Where ``path`` really is (links on its way and itself resolved) when that is not under
    ``real_root`` (a root, resolved); None when it is under it, or when nothing is there to be
    outside: a broken link (a link to a file that does not exist, absolute or not) is a
    ``missing_file`` the read names (:func:`~packer.read.opening.open_failure`), never
    ``outside_root``, whose fix (move the file in, allow outside_root) cannot make it readable.
    None as well where it cannot be resolved (a loop of links; a folder without permission on
    the way): the read calls that unreadable, naming it. The one place that decides whether a
    local file leads outside its root."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # RuntimeError: a loop of links on Python 3.11, 3.12
        return None
    return None if real.is_relative_to(real_root) else real


def _outside_root(path: Path, real_root: Path) -> bool:
    """A listed file whose real location (symlinks resolved) is not under ``real_root`` (the
    root, resolved): :func:`_real_outside`.

    Only for files listed without following directory links: every folder between the root and
    the file is then a real folder, so only a file that is itself a link can lead outside, and
    one ``lstat`` clears the rest (resolving every path cost 0.1 ms a file, most of discover).
    """
    try:
        return path.is_symlink() and _real_outside(path, real_root) is not None
    except OSError as err:  # a folder without permission on the way: the read says unreadable, naming it
        return err.errno not in (errno.ELOOP, errno.EACCES, errno.EPERM)


def _resolves_outside(path: Path, root: Path) -> bool:
    """Whether ``path`` (a table row's file the listing did not give), links on its way resolved,
    lies outside ``root``: a row through a link to a folder outside the root
    (:func:`_real_outside`)."""
    return _real_outside(path, root.resolve()) is not None


def _link_out(path: Path, root: Path) -> Path | None:
    """Where ``path`` leads when it is itself a link to somewhere outside ``root`` (the folder a
    link the listing does not enter leads to: :func:`_folder_link_issues`); None otherwise."""
    try:
        return _real_outside(path, root.resolve()) if path.is_symlink() else None
    except OSError:
        return None


def _listed_files(source: SourceConfig, allow_outside: bool, storage_options: Mapping[str, Any] | None,
                  links: list[str] | None = None, *, quiet: bool = False,
                  unsupported: list[tuple[str, str, str]] | None = None, present: set[str] | None = None,
                  unlisted: list[tuple[str, OSError]] | None = None, aliases: list[tuple[str, str]] | None = None,
                  own: Sequence[str] = (), skipped: list[str] | None = None
                  ) -> tuple[list[tuple[str, str]], dict[str, RawObject]]:
    """(relative path, path or URL) of every raw file of the source, sorted, and for a URL root
    what the listing said about each file (by URL). ``links``: where the links to folders that
    were not entered go (without ``allow_outside``); ``unsupported``: where (relative path, path
    or URL, what it is) of each file of a format the source's kind cannot read goes, sorted;
    ``present``: for a URL root, where the relative path of every object under it goes;
    ``aliases``: where the folders whose files are listed at other paths go (:func:`_walk_relpaths`);
    ``own``, ``skipped``: the job's output folders, not listed, and where the version folders of
    packer's skipped go (:func:`_without_packer_output`)."""
    if isinstance(source.root, str):
        remote = list_remote_source(source, storage_options, unsupported=unsupported, present=present, own=own,
                                    skipped=skipped)
        return [(f.relpath, f.url) for f in remote], {f.url: f.stat for f in remote}
    root = os.fspath(source.root)
    by_rel: dict[str, str] = {}
    relpaths = source_relpaths(source_kind(source.kind), source.root, follow_links=allow_outside, links=links,
                               quiet=quiet, unsupported=by_rel, unlisted=unlisted, aliases=aliases, own=own,
                               skipped=skipped)
    if unsupported is not None:
        unsupported.extend((rel, os.path.join(root, rel), what) for rel, what in sorted(by_rel.items()))
    return [(rel, os.path.join(root, rel)) for rel in relpaths], {}


def _folder_link_issues(source: SourceConfig, links: Sequence[str], phi: Pseudonymizer | None,
                        named: Container[str] = (), real_paths: dict[str, str] | None = None) -> list[Issue]:
    """One ``outside_root`` record per link to a folder outside the source root: its files are
    not read, and nothing may be dropped unsaid. A link to a folder inside the root gets none:
    its files are listed at their own paths, and each path through the link is a ``folder_link``
    record of its own (:func:`_aliased_files`). A link a table row names itself (in
    ``named``, the rows' relative paths) gets none: that row's ``missing_file`` record (a folder
    is not a file, :func:`_folder_row_issue`) is its one record, and says where the link leads,
    so the link is counted once."""
    root = Path(source.root).resolve()
    issues = []
    for rel in links:
        if rel in named:
            continue
        link = Path(source.root) / rel
        try:
            target = link.resolve()
        except OSError:
            target = link
        if target.is_relative_to(root):
            continue
        shown, sample_id = _shown_name(str(link)), _name_id(source.name, rel, phi)
        _note_real(real_paths, sample_id, str(link), shown)
        issues.append(Issue(sample_id=sample_id, path=shown, stage="discover",
                            reason="outside_root",
                            message=f"{shown} is a link to the folder {_shown_name(str(target))}, outside the source "
                                    f"root {source.root}; its files were not read: move them in, or set "
                                    "safety.outside_root: allow"))
    return issues


def _aliased_files(source: SourceConfig, aliases: Sequence[tuple[str, str]], relpaths: Sequence[str],
                   phi: Pseudonymizer | None, named: Container[str] = (),
                   real_paths: dict[str, str] | None = None) -> dict[str, list[Excluded]]:
    """One ``folder_link`` record per file seen through a folder not walked because its files are
    listed at other paths (``aliases``, :func:`_walk_relpaths`: ``kitty -> cat``, a link to a folder
    already under the root): each such file is packed once, under the path it is listed at, and
    the paths through the link are left out on purpose, said, not silently dropped. Packing them
    again would put the same bytes in the dataset twice, in two splits as like as not. A path a
    table row names (``named``) gets none: the row's own record says it. ``relpaths``: the
    listing's, sorted. The records by the folder (relative path) they were seen through."""
    root = os.fspath(source.root)
    out: dict[str, list[Excluded]] = {}
    for alias, listed_at in aliases:
        prefix = f"{listed_at}/" if listed_at else ""
        start = bisect.bisect_left(relpaths, prefix)
        link, folder = os.path.join(root, alias), os.path.join(root, listed_at) if listed_at else root
        for rel in relpaths[start:]:
            if not rel.startswith(prefix):
                break
            seen = f"{alias}/{rel[len(prefix):]}"
            if seen in named:
                continue
            sample_id, path = _name_id(source.name, seen, phi), f"{root}/{seen}"
            _note_real(real_paths, sample_id, path, _shown_name(path))
            out.setdefault(alias, []).append(Excluded(
                sample_id, _shown_name(path), "discover", "folder_link",
                f"{_shown_name(link)} and {_shown_name(folder)} are one folder, reached through a folder link under "
                f"the source root: this file is packed once, as {_shown_name(os.path.join(root, rel))}, not again at "
                "this path"))
    return out


def _aliased_class_warning(source: SourceConfig, aliases: Sequence[tuple[str, str]],
                           linked: Mapping[str, Sequence[Excluded]], *, hide_names: bool = False,
                           listed_in: str = BUILD_LISTINGS.excluded) -> str:
    """Under ``label: folder``, the warning for class folders whose files were left out as
    ``folder_link`` (:func:`_aliased_files`): a link ``kitty -> cat`` reads as a class of its own,
    but its files are packed once, in the class of the folder they are listed in. ``listed_in``:
    where those records are (``excluded.jsonl``; packer validate's report's records)."""
    if source.target.origin != "folder" or not linked:
        return ""
    root = os.fspath(source.root)
    classes = [(alias, listed_at) for alias, listed_at in aliases
               if linked.get(alias) and alias.partition("/")[0] != listed_at.partition("/")[0]]
    if not classes:
        return ""
    if hide_names:
        shown = f"{len(classes)} class folder(s)"
    else:
        shown = ", ".join(f"{alias!r} -> {listed_at or '.'!r} ({len(linked[alias])} file(s))"
                          for alias, listed_at in classes[:3]) + (" ..." if len(classes) > 3 else "")
    return (f"source {source.name!r}: class folder(s) that are links to a folder already under the root {root}: "
            f"{shown}; their files are packed once, in the class of the folder they lie in, and "
            f"left out at the link's paths ({listed_in}, why folder_link). To make a link's name a class of its "
            "own, copy its files there instead of linking, or label the files with a table")


def _unlisted_folder_issues(source: SourceConfig, unlisted: Sequence[tuple[str, OSError]],
                            phi: Pseudonymizer | None, real_paths: dict[str, str] | None = None) -> list[Issue]:
    """One ``unreadable`` record per folder under the root that could not be listed (no read or
    execute permission, a path longer than the OS allows): its files were not read, and nothing
    may be dropped unsaid. The fix the message gives is the error's (:func:`_unlisted_fix`)."""
    issues = []
    for rel, err in unlisted:
        real, sample_id = str(Path(source.root) / rel), _name_id(source.name, rel, phi)
        folder, why = _shown_name(real), err.strerror or str(err)
        _note_real(real_paths, sample_id, real, folder)
        issues.append(Issue(sample_id=sample_id, path=folder, stage="discover",
                            reason="unreadable",
                            message=f"{folder}: this folder cannot be listed ({why}), so none of its files was "
                                    f"read; {_unlisted_fix(err)}"))
    return issues


def _unlisted_fix(err: OSError) -> str:
    """What makes a folder that could not be listed with ``err`` readable: permission for
    EACCES/EPERM, a shorter path for ENAMETOOLONG (chmod cannot shorten it), and otherwise
    what the OS said is the thing to fix."""
    if err.errno in (errno.EACCES, errno.EPERM):
        return "make it readable by this user (chmod a+rx on it), or move it out of the root"
    if err.errno == errno.ENAMETOOLONG:
        return ("its path is longer than the operating system allows (PATH_MAX); shorten the names of the folders "
                "on its way or move it higher up, or move it out of the root")
    return ("fix what the operating system reports above (a disk error, a stale network mount), or move it out of "
            "the root")


def _undecodable_names(source: SourceConfig, files: list[tuple[str, str]], phi: Pseudonymizer | None,
                       real_paths: dict[str, str] | None = None
                       ) -> tuple[list[tuple[str, str]], list[Issue], list[Excluded]]:
    """The listed files whose names are text, and one ``unreadable`` record per file whose name
    is not valid UTF-8 (a Latin-1 name copied from an old export): such a name cannot be hashed,
    tabled or written into any record, so it is named with its bad bytes escaped (``caf\\xe9.png``)
    rather than crash the job (its sample id is hashed apart from that text's, which another
    file may bear). On a ``files: table`` source no (UTF-8) table row can name such a
    file, so it is *not in the table*, left out like any other file the table does not name."""
    kept, issues, excluded = [], [], []
    only_table = source.table_map is not None and source.table_map.files == "table"
    for rel, path in files:
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            shown, sample_id, named = _shown_name(rel), _name_id(source.name, rel, phi), _shown_name(path)
            _note_real(real_paths, sample_id, path, named)
            if only_table:
                excluded.append(Excluded(sample_id, named, "discover", "not_in_table",
                                         f"its name '{shown}' is not valid UTF-8, so no table row names it "
                                         "(files: table)"))
            else:
                issues.append(Issue(sample_id=sample_id, path=named, stage="discover", reason="unreadable",
                                    message=f"the file name '{shown}' is not valid UTF-8; rename the file "
                                            "(e.g. convmv -f latin1 -t utf-8)"))
        else:
            kept.append((rel, path))
    return kept, issues, excluded


#: Folders whose files are masks or label maps (compared in lower case): ``masks/`` (Kvasir-SEG),
#: ``labelsTr/`` (the Medical Segmentation Decathlon, nnU-Net), ``segmentations/`` (TotalSegmentator),
#: ``Ground Truth/`` (CVC-ClinicDB); and a folder whose name ends in the word ``GroundTruth``
#: (ISIC 2018's ``ISIC2018_Task1_Training_GroundTruth/``); Pascal VOC's ``SegmentationClass/`` and
#: ``SegmentationObject/`` (and SBD's ``SegmentationClassAug/``), each file named as its image in
#: ``JPEGImages/``; Cityscapes' ``gtFine/`` and ``gtCoarse/``, whose files are named as their image in
#: ``leftImg8bit/`` less its ending (:data:`_CITYSCAPES_ENDING`). A class folder such as ``with_mask/``
#: (a face-mask classification set) is none of them. KiTS23's ``case_00000/instances/`` (one mask per
#: instance and annotator) counts only beside its case's label map (:data:`_CASE_MASK_FOLDERS`).
MASK_FOLDERS = frozenset({"mask", "masks", "labels", "labelstr", "labelsts", "labelsva", "seg", "segs", "segmentation",
                          "segmentations", "ground truth", "ground_truth", "groundtruth", "gt", "instances",
                          "segmentationclass", "segmentationclassaug", "segmentationobject", "gtfine", "gtcoarse"})
#: The ending of a Cityscapes label map's name in its ``gtFine/`` or ``gtCoarse/`` folder
#: (``aachen_000000_000019_gtFine_labelIds``, ``_instanceIds``, ``_labelTrainIds``, ``_color``): what
#: is left names its image (``aachen_000000_000019_leftImg8bit``). It counts only for a file in one
#: of those folders (:data:`_CITYSCAPES_FOLDERS`): a photo ``sunset_color.png`` beside ``sunset.png``
#: is no label map.
_CITYSCAPES_FOLDERS = frozenset({"gtfine", "gtcoarse"})
_CITYSCAPES_ENDING = re.compile(r"(?:_gtfine|_gtcoarse)?_(?:labelids|instanceids|labeltrainids|color)$",
                                re.IGNORECASE)
#: Masks folders too common a word to count on an image beside them alone: they count only in a
#: folder that also holds a file named as a mask (KiTS23's ``segmentation.nii.gz`` beside ``instances/``)
_CASE_MASK_FOLDERS = frozenset({"instances"})
_GROUND_TRUTH_FOLDER = re.compile(r"(?:^|[_\-. ])ground[_ ]?truth$", re.IGNORECASE)
#: Folders whose files are a segmentation set's images, beside its masks folder: the Decathlon's
#: ``imagesTr/`` beside ``labelsTr/``, Kvasir-SEG's ``images/`` beside ``masks/``, CVC-ClinicDB's
#: ``Original/`` beside ``Ground Truth/``, ISIC's ``..._Training_Input/`` beside its ``_GroundTruth/``
_IMAGE_FOLDER = re.compile(r"(?:^|[_\-. ])(?:images?|imgs?|inputs?|originals?)(?:tr|ts|va)?$", re.IGNORECASE)
#: A file name (its extension removed) ending in one of these words marks a mask or label map,
#: where the rest of the name names an image of the source or the file lies in a case folder
#: (:class:`MaskPartners`, :func:`mask_named`): ``_seg``
#: (BraTS), ``segmentation`` (KiTS), ``_segmentation`` (ISIC), ``_mask`` and ``_mask_1`` (BUSI),
#: ``_Segm`` (BraTS 2020's case 355); words are separated by ``_``, ``-``, ``.`` or a space
MASK_NAME = re.compile(r"(?:^|[_\-. ])(mask|masks|seg|segm|segmentation|label|labels|labelmap|gt)(?:[_\-. ]?\d+)?$",
                       re.IGNORECASE)
_WORD_BREAKS = ("_", "-", ".", " ")
#: The words of :data:`MASK_NAME` that name nothing but a segmentation: a name ending in one beside
#: an image is a label map whatever its prefix (KiTS21's ``aggregated_MAJ_seg`` beside
#: ``imaging``). ``mask``, ``label`` and ``gt`` end photos' names too (``with_mask_12.jpg``).
_SEGMENTATION_WORDS = frozenset({"seg", "segm", "segmentation", "labelmap"})
#: A BIDS name (extension removed) of a label map: entities (``sub-01_ses-1_desc-brain``, the
#: first ``sub-<label>``) and the file's type after the last ``_`` (its BIDS suffix): ``mask`` (a
#: brain mask), ``dseg`` (a discrete segmentation) or ``probseg`` (a probabilistic one). Its rest
#: names no image (the image is ``sub-01_ses-1_T1w``): it counts beside an image of its subject
_BIDS_LABEL_MAP = re.compile(r"^(sub-[a-zA-Z0-9]+)(?:_[a-zA-Z0-9]+-[a-zA-Z0-9]+)*_(mask|dseg|probseg)$")


def _stem(name: str) -> str:
    """A file name without its extension, for telling masks by their images' names; a suffix of
    digits is no extension, as a split list's ``match: stem`` reads it (:func:`is_extension`)."""
    if name.lower().endswith(".nii.gz"):
        return name[:-len(".nii.gz")]
    head, dot, suffix = name.rpartition(".")
    return head if dot and is_extension(suffix) else name


def _mask_folder(relpath: str) -> str | None:
    for folder in relpath.split("/")[:-1]:
        if _is_mask_folder(folder):
            return f"folder {folder!r}"
    return None


def _is_mask_folder(folder: str) -> bool:
    return folder.lower() in MASK_FOLDERS or _GROUND_TRUTH_FOLDER.search(folder) is not None


def _folder_has_partner(relpath: str, stem: str, partners: MaskPartners) -> bool:
    """Whether a file in a masks folder has the image it belongs to: a file of the same name
    outside any masks folder (Kvasir-SEG's ``masks/x.jpg`` and ``images/x.jpg``, the Decathlon's
    ``labelsTr/`` and ``imagesTr/``), or of that name and a suffix (nnU-Net's ``imagesTr/x_0000``
    beside ``labelsTr/x``), or, in Cityscapes' ``gtFine/`` and ``gtCoarse/``, of its name less its
    ending (``x_gtFine_labelIds`` beside ``x_leftImg8bit``: :data:`_CITYSCAPES_ENDING`), or an image
    in the folder that holds the masks folder
    (TotalSegmentator's ``s0000/ct.nii.gz`` beside ``s0000/segmentations/``), or an images folder
    beside the masks folder (:data:`_IMAGE_FOLDER`: ``imagesTr/`` beside ``labelsTr/``), whatever
    its files' names: a partial download that lacks one case's image still ships that case's label
    map, which is no image either. A class folder named ``mask`` of a classification set
    (``mask/``, ``no_mask/``) has none of them. An ``instances/`` folder (KiTS23) counts only where
    its folder holds an image and a file named as a mask (``imaging.nii.gz``, ``segmentation.nii.gz``).
    """
    parts = relpath.split("/")
    index = next(i for i, part in enumerate(parts[:-1]) if _is_mask_folder(part))
    holder = "/".join(parts[:index])
    if parts[index].lower() in _CASE_MASK_FOLDERS:
        return holder in partners.folders and holder in partners.labelled
    if _named_by_image(stem, partners):  # nnU-Net's imagesTr/x_0000 (a channel suffix) holds labelsTr/x's image
        return True
    ending = _CITYSCAPES_ENDING.search(stem) if parts[index].lower() in _CITYSCAPES_FOLDERS else None
    if ending is not None and ending.start() and _named_by_image(stem[:ending.start()], partners):
        return True  # gtFine/x_gtFine_labelIds: leftImg8bit/x_leftImg8bit is its image
    return holder in partners.folders or holder in partners.image_folders


@dataclass(frozen=True)
class MaskPartners:
    """What a mask-named file's image is looked for among (:func:`mask_named`): of the source's
    files that are named as masks neither by a folder nor by their own name, the sorted name stems
    (extension removed), the folders that hold one directly ("" the root), the folders that
    hold an images folder (:data:`_IMAGE_FOLDER`) holding one, and the case folders: those that
    hold one named after the folder (BraTS's ``BraTS20_Training_355/BraTS20_Training_355_t1.nii``);
    and the folders outside any masks folder that hold a file named as a mask by its name."""

    stems: tuple[str, ...]
    folders: frozenset[str]
    image_folders: frozenset[str] = frozenset()
    cases: frozenset[str] = frozenset()
    labelled: frozenset[str] = frozenset()

    @classmethod
    def of(cls, relpaths: Iterable[str]) -> MaskPartners:
        named = [(head, _stem(name)) for rel in relpaths if _mask_folder(rel) is None
                 for head, _, name in (rel.rpartition("/"),)]
        images = [(head, stem) for head, stem in named
                  if MASK_NAME.search(stem) is None and _BIDS_LABEL_MAP.match(stem) is None]
        folders = frozenset(head for head, _ in images)
        image_folders = frozenset(holder for folder in folders if folder
                                  for holder, _, last in (folder.rpartition("/"),) if _IMAGE_FOLDER.search(last))
        cases = frozenset(head for head, stem in images if head
                          for case in (head.rpartition("/")[2],)
                          if stem == case or (stem.startswith(case) and stem[len(case)] in _WORD_BREAKS))
        labelled = frozenset(head for head, stem in named if MASK_NAME.search(stem))
        return cls(tuple(sorted(stem for _, stem in images)), folders, image_folders, cases, labelled)


def mask_named(relpath: str, partners: MaskPartners | None = None, *, weak: bool = True) -> str | None:
    """Why the file at ``relpath`` is named as a mask or label map (``folder 'labelsTr'``,
    ``name ending '_seg'``), or None where its name says nothing of the kind: its folder is a
    masks folder (:data:`MASK_FOLDERS`), or its name ends in a mask word (:data:`MASK_NAME`) and
    the rest of it names an image among ``partners`` (None: not checked). Either rule suffices: a
    masks folder whose file has no image of its own name (``masks/p0_mask.nii.gz`` beside
    ``images/p0.nii.gz``) is still named by its file's name. ``benign (1)_mask.png``
    beside ``benign (1).png``, ``BraTS20_Training_001_seg.nii.gz`` beside ``..._t1.nii.gz``,
    KiTS's ``segmentation.nii.gz`` beside ``imaging.nii.gz`` in its case folder. A BIDS name whose
    suffix is ``mask``, ``dseg`` or ``probseg`` (:data:`_BIDS_LABEL_MAP`) is one beside an image of
    its subject (``sub-01_desc-brain_mask.nii.gz`` beside ``sub-01_T1w.nii.gz``). A face-mask
    set's ``with_mask_12.jpg``, with no image named ``with`` or ``with_...`` that is no mask
    itself, is an image.

    ``weak``: the weak rule counts too (:func:`label_map_candidate`), as it does for a kind
    that cannot read the answer from the file: a name ending in a word that names nothing but a
    segmentation beside an image in its folder, whatever its prefix (KiTS21's
    ``aggregated_MAJ_seg.nii.gz`` beside ``imaging.nii.gz``), ``seg`` only bare
    (``SAX_cine_seg_5`` is dcm2niix's protocol-and-series name of a segmented k-space cine)."""
    head, _, name = relpath.rpartition("/")
    stem = _stem(name)
    folder = _mask_folder(relpath)
    if folder is not None and (partners is None or _folder_has_partner(relpath, stem, partners)):
        return folder
    bids = _BIDS_LABEL_MAP.match(stem)
    if bids is not None and (partners is None or _named_by_image(bids.group(1), partners)):
        return f"BIDS suffix '_{bids.group(2)}'"
    found = MASK_NAME.search(stem)
    if found is None:
        return None
    why = f"name ending {stem[found.start():]!r}"
    if partners is None or _has_partner(head, stem[:found.start()], partners):
        return why
    word, bare = found.group(1).lower(), not stem[-1].isdigit()
    if weak and (bare or word != "seg") and _beside_image(head, word, partners):
        return why
    return None


def label_map_candidate(relpath: str, partners: MaskPartners) -> str | None:
    """Why the weak name rule takes the file at ``relpath`` for a label map, where the strong
    ones (:func:`mask_named` with ``weak=False``) do not: its name ends in a word that names
    nothing but a segmentation (:data:`_SEGMENTATION_WORDS`), numbered or not, and an image lies
    in its folder, though no image is named by the rest of its name. That is KiTS21's
    ``aggregated_AND_seg.nii.gz`` beside ``imaging.nii.gz`` and QUBIQ's ``task01_seg01.nii.gz``
    beside ``image.nii.gz``, label maps, but also dcm2niix's ``SAX_cine_seg.nii.gz`` and
    ``LGE_PSIR_seg_12.nii.gz``, MR images of a segmented k-space protocol: only the file can
    tell them apart (:attr:`packer.read.kinds.SourceKind.label_maps_by_content`). None for
    a file the strong rules name, or no rule does."""
    if mask_named(relpath, partners, weak=False) is not None:
        return None
    head, _, name = relpath.rpartition("/")
    stem = _stem(name)
    found = MASK_NAME.search(stem)
    if found is None or not _beside_image(head, found.group(1).lower(), partners):
        return None
    return f"name ending {stem[found.start():]!r}"


def _has_partner(head: str, prefix: str, partners: MaskPartners) -> bool:
    """Whether an image of ``partners`` is the one a mask named ``prefix`` + a mask word
    belongs to: one whose name, extension removed, is ``prefix`` or starts with it and a word
    break (anywhere in the source: ISIC keeps its masks in a folder of their own); for an empty
    prefix (``segmentation.nii.gz``), any file of the same folder not named as a mask; and in a
    case folder, whose images are named after it, the case's images whatever the prefix: BraTS
    2020's ``BraTS20_Training_355/W39_1998.09.19_Segm.nii`` is that case's label map though no
    image is named ``W39_1998.09.19``."""
    if not prefix:
        return head in partners.folders
    return _named_by_image(prefix, partners) or head in partners.cases


def _beside_image(head: str, word: str, partners: MaskPartners) -> bool:
    """The weak rule: ``word`` names nothing but a segmentation (:data:`_SEGMENTATION_WORDS`)
    and folder ``head`` holds a file not named as a mask."""
    return word in _SEGMENTATION_WORDS and head in partners.folders


def _named_by_image(prefix: str, partners: MaskPartners) -> bool:
    """Whether an image of ``partners`` is named ``prefix``, or ``prefix`` then a word break and
    more (``x_0000``, ``x_t1``: a channel or sequence suffix)."""
    at = bisect.bisect_left(partners.stems, prefix)
    for stem in partners.stems[at:]:
        if not stem.startswith(prefix):
            break
        if stem == prefix or stem[len(prefix)] in _WORD_BREAKS:
            return True
    return False


def _without_mask_named(source: SourceConfig, files: list[tuple[str, str]], phi: Pseudonymizer | None, *,
                        by_content: bool = False) -> tuple[list[tuple[str, str]], list[Excluded], dict[str, str]]:
    """The listed files of a source without a table, less those named as masks or label maps
    (:func:`mask_named`, against the source's other files), each of those left out as
    ``label_map``: packed as images of their own, a segmentation set's label maps would hand a
    model its answers as inputs (a BraTS folder's ``_seg`` files, the Decathlon's
    ``labelsTr/``), and a ``label: folder`` source would make ``masks`` a class. A table decides
    instead wherever there is one. ``by_content``: the kind's probe tells a label map by its
    header (:attr:`~packer.read.kinds.SourceKind.label_maps_by_content`), so a file only the weak
    rule names (:func:`label_map_candidate`) is kept, and returned with why it may be one (by
    relative path), for its ref's :attr:`~packer.records.SampleRef.maybe_label_map`."""
    kept: list[tuple[str, str]] = []
    out: list[Excluded] = []
    maybe: dict[str, str] = {}
    partners = MaskPartners.of(rel for rel, _ in files)
    for rel, path in files:
        why = mask_named(rel, partners, weak=not by_content)
        if why is None:
            kept.append((rel, path))
            candidate = label_map_candidate(rel, partners) if by_content else None
            if candidate is not None:
                maybe[rel] = candidate
            continue
        out.append(Excluded(make_sample_id(source.name, rel, phi), path, "discover", "label_map",
                            f"{why}: named as a mask or label map, which the source, having no table, would pack as "
                            "an image of its own; name it in a table's mask column to pack it as its image's mask, "
                            "or list it in the source's table to pack it as an image"))
    return kept, out, maybe


def _mask_named_warning(source: SourceConfig, masks_out: Sequence[Excluded], *, hide_names: bool = False,
                        listed_in: str = BUILD_LISTINGS.excluded) -> str:
    """The warning for files left out as masks or label maps, counted by what named them (under
    PHI pseudonymization a folder by its kind only: ``Doe_John_GroundTruth/`` names a patient).
    ``listed_in``: where those records are (``excluded.jsonl``; packer validate's report's records)."""
    if not masks_out:
        return ""

    def why(record: Excluded) -> str:
        said = record.detail.split(":", 1)[0]
        return "a masks or ground-truth folder" if hide_names and said.startswith("folder ") else said

    whys = Counter(why(e) for e in masks_out)
    shown = ", ".join(f"{why} ({n})" for why, n in sorted(whys.items(), key=lambda item: (-item[1], item[0]))[:3])
    return (f"source {source.name!r}: {len(masks_out)} file(s) named as masks or label maps left out ({listed_in}, "
            f"why label_map; {shown}): a source without a table would pack each as an image of its own. To pack them "
            "as the masks of their images, name both in a table (README: Targets; NIfTI volumes)")


def _row_cells(source: SourceConfig, row: TableRow | None) -> tuple[tuple[str, str], ...]:
    """A header-identity ref's extra: only the cells naming its files (mask, other files of the
    case), where the source has them (a DICOM label table's other columns stay out of the
    samples' records, as before masks)."""
    if row is None or not source.file_columns():
        return ()
    kept = set(source.file_columns())
    return tuple((k, v) for k, v in row.extra if k in kept)


def _named_files(placed: Placed) -> set[str]:
    """The relative paths the table's file columns name (masks, other files of a case) in every
    row placed, a refused file's rows too (:attr:`Placed.named`): they belong to a row's sample
    and are not samples themselves, unless the table gives them rows of their own."""
    return {rel for rel in placed.named if rel not in placed.rows and rel not in placed.refused}


def _cells_naming_files(rows: Mapping[str, TableRow]) -> dict[str, tuple[int, str]]:
    """Each relative path a row's other cells hold (normalized like table paths), with the first
    row number and column that hold it: a label map or another file of a case named beside the
    row's own file."""
    cells: dict[str, tuple[int, str]] = {}
    for row in sorted(rows.values(), key=lambda r: r.row):
        for column, value in row.extra:
            cell = value.strip()
            if cell and ("/" in cell or "." in cell):
                cells.setdefault(posixpath.normpath(cell), (row.row, column))
    return cells


def _unnameable(rel: str, table: Path | str) -> str | None:
    """The ``missing_label`` message of a file whose name no table cell can name, or None: a
    backslash in it is read as a folder separator (tables written on Windows), and a line break
    ends a CSV row unless the cell is quoted, which table writers rarely do."""
    name = rel.rsplit("/", 1)[-1]
    odd = "a backslash" if "\\" in name else "a line break" if "\n" in name or "\r" in name else None
    if odd is None:
        return None
    return (f"no label: no row of {table} names {rel!r}, and none can: its name holds {odd}, which a table cell "
            "reads as " + ("a folder separator" if odd == "a backslash" else "the end of the row")
            + "; rename the file (and its row)")


def _cells_read_outside(source: SourceConfig, rows: Mapping[str, TableRow]) -> dict[str, tuple[int, str]]:
    """Under a table ``path_base``: the cell text of each row whose path it reads outside the
    root, with the row's number and that path (relative to the root): a cell written from the
    root instead names a file under the root that then has no row."""
    table_map = source.table_map
    if table_map is None or table_map.path_base is None:
        return {}
    out: dict[str, tuple[int, str]] = {}
    for rel, row in sorted(rows.items(), key=lambda item: item[1].row):
        if escapes_root(rel) and (cell := written_from_base(rel, table_map, source.root)) is not None:
            out.setdefault(cell, (row.row, rel))
    return out


def _named_elsewhere(rel: str, cell: tuple[int, str], table: Path | str, table_key: str) -> str:
    """The ``missing_label`` message of a file that no row names as its own file while a row's
    other column does (a Decathlon table's label map on a source without ``mask:``): adding its row
    would pack it as an image."""
    number, column = cell
    return (f"no label: no row of {table} names {rel!r} as its file, though row {number}'s column {column!r} names "
            f"it (a label map or another file of that row, listed here as an image of its own); to pack it as that "
            f"row's mask give the source mask: {{column: {column}, classes: [...]}}, or, to leave such files out, "
            f"set {table_key}.files: table (they are then not_in_table, never bad)")


def _row_files_problem(source: SourceConfig, ref: SampleRef, table: Path | str | None, row: TableRow | None
                       ) -> Issue | None:
    """The first problem with the files a row names beside its own: ``mask_missing`` for a
    masked source's row that names no mask, ``missing_file`` for a row without one of the case's
    other files (:attr:`~packer.config.SourceConfig.companions`), ``outside_root`` for a path
    that leaves the source root."""
    for column in source.file_columns():
        relpath = dict(ref.extra).get(column, "").strip()
        what = "mask" if source.mask is not None and column == source.mask.column else "file"
        if not relpath:
            where = f"{table} row {row.row}, column {column!r} is empty" if row else f"{table} has no row for it"
            reason = "mask_missing" if what == "mask" else "missing_file"
            fix = (f"name the file's {what if what == 'mask' else column}, or leave the file out" if row else
                   "add its row, or, where the table names only the dataset's files (the Decathlon's imagesTs/ has "
                   f"no labels), set {source_kind(source.kind).table_key}.files: table")
            return Issue.of(ref, stage="discover", reason=reason,
                            message=f"{ref.path}: no {what if what == 'mask' else column + ' file'} ({where}); {fix}")
        if escapes_root(relpath):
            return Issue.of(ref, stage="discover", reason="outside_root",
                            message=f"{table} row {row.row if row else '?'}, column {column!r}: {what} {relpath!r} "
                                    "leaves the source root; give a path inside the root")
    return None


def _row_file_outside(source: SourceConfig, ref: SampleRef, table: Path | str | None, row: TableRow | None,
                      real_root: Path) -> Issue | None:
    """``outside_root`` for a file the row names beside its own (a mask, a case's other file) whose
    real location is not under ``real_root``: a link, or a link to a folder on its way. These files
    are not listed, so every folder between the root and the file may be a link: resolve it all."""
    for column in source.file_columns():
        relpath = dict(ref.extra).get(column, "").strip()
        if not relpath:
            continue
        real = _real_outside(Path(source.root) / relpath, real_root)  # a broken link: _row_file_missing says it
        if real is not None:
            return Issue.of(ref, stage="discover", reason="outside_root", message=(
                f"{table} row {row.row if row else '?'}, column {column!r}: {relpath!r} resolves to {real}, outside "
                f"the source root {source.root}; move the file in, or set safety.outside_root: allow"))
    return None


def _row_file_missing(source: SourceConfig, ref: SampleRef, table: Path | str | None, row: TableRow | None,
                      present: set[str]) -> Issue | None:
    """``mask_missing`` (the mask column) or ``missing_file`` (a case's other file) for a file the
    row names beside its own that is not there, the reason the decode pass gives it: found while
    listing, ``validate --quick``, which decodes nothing, reports it as the full check does, and
    the row's file is not decoded only to be refused for it after. Under a URL root the objects
    ``present`` under it (the listing's) tell, without a request per file; a local file is looked
    at (a folder on its way that cannot be entered is left to the read, which names why)."""
    for column in source.file_columns():
        relpath = dict(ref.extra).get(column, "").strip()
        if not relpath:
            continue
        if isinstance(source.root, str):
            if posixpath.normpath(relpath) in present:
                continue
            named = join_relpath(source.root, relpath)
        else:
            named = os.path.join(os.fspath(source.root), relpath)
            try:
                os.stat(named)
                continue
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError:  # there, but not to be looked at: the read says why
                continue
        where = f"{table} row {row.row if row else '?'}, column {column!r}"
        link = None if isinstance(source.root, str) else link_text(named)
        broken = f", a symbolic link to {link}, which does not exist" if link is not None else ""
        if source.mask is not None and column == source.mask.column:
            return Issue.of(ref, stage="discover", reason="mask_missing", message=(
                f"{ref.path}: its mask {named} does not exist{broken} ({where}); fix the table's mask column or "
                "add the file" + (", or fix the link" if broken else "")))
        return Issue.of(ref, stage="discover", reason="missing_file", message=(
            f"{named} ({column}): no such file{broken}; {where} names it beside {ref.path}: copy the file there, "
            "or fix the " + ("link or the row" if broken else "row")))
    return None


def _check_root(source: SourceConfig, where: str, relative_to: str) -> str:
    """How the job file wrote the source's root, for messages (``root: 'raw', relative to the
    job file``; ``relative_to``: what a relative path is relative to). Raises ConfigError for a
    local root that is missing or not a folder."""
    remote = isinstance(source.root, str)
    # an absolute path or a URL as written is not "relative to the job file": say so only when it is
    as_written = f"root: {source.root_spec!r}" + (
        "" if remote or "://" in source.root_spec or Path(source.root_spec).is_absolute()
        else f", relative to {relative_to}")
    if not isinstance(source.root, str) and not source.root.is_dir():
        what = "is a file, not a folder" if source.root.exists() else "does not exist"
        raise ConfigError(f"{where}.root (source {source.name!r}): folder {source.root} {what} ({as_written})")
    return as_written


def _target_text(source: SourceConfig, rel: str, row: TableRow | None, known: tuple[str, ...]
                 ) -> str | Refused | None:
    """A listed file's target text (None: its table has no row for it), or why it has none."""
    origin = source.target.origin
    if origin == "none":
        return ""
    if origin == "folder":
        return from_folder(source.target, rel, str(source.root), known)
    return (row.refused or row.label) if row else None


def _path_facts(source: SourceConfig, rel: str) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
    """The entity, time and fields a file's path gives (``entity: {path: ...}``, ``fields:``)."""
    entity = source.entity_path.value(rel) if source.entity_path is not None else None
    time = normalize_time(source.time_path.value(rel)) if source.time_path is not None else None
    fields = tuple((f.name, f.value(rel) or "") for f in source.fields)
    return entity, time, fields


def _file_ref(source: SourceConfig, kind: SourceKind, rel: str, path: str, row: TableRow | None,
              label: str | None, phi: Pseudonymizer | None, sample_id: str | None = None) -> SampleRef:
    """The unprobed ref of a listed file. A kind that reads entity and time from headers gets
    them in the probe (the ref keeps only the cells naming its other files); otherwise they come
    from the path (``entity: {path: ...}``) or the table row, and a table-less source gives each
    file its own entity. ``sample_id``: the file's id when the caller made it already."""
    sample_id = sample_id or make_sample_id(source.name, rel, phi)
    if kind.identity_in_header:  # entity and time from headers, unless the source takes its entity from paths
        entity = source.entity_path.value(rel) if source.entity_path is not None else None
        return SampleRef(sample_id=sample_id, source=source.name, kind=kind.name, path=path, relpath=rel, label=label,
                         entity=entity, extra=_row_cells(source, row))
    entity, time, fields = _path_facts(source, rel)
    if source.entity_path is None:
        entity = (row.entity if row else None) if source.label_table is not None else rel
        if entity is None and row is not None and source.entity_empty == "file":  # entity: {column, empty: file}
            entity = rel
    if source.time_path is None:
        time = row.time if row else None
    extra = row.extra if row else fields  # a row holds its path's fields already (tables.place_rows)
    return SampleRef(sample_id=sample_id, source=source.name, kind=kind.name, path=path, relpath=rel, label=label,
                     entity=entity, time=time, extra=extra)


def _listed_refs(source: SourceConfig, files: Sequence[tuple[str, str]], placed: Placed,
                 table: Path | str | None, phi: Pseudonymizer | None, known: tuple[str, ...],
                 real_root: Path | None, issues: list[Issue], excluded: list[Excluded], progress: Progress,
                 unlabeled: dict[str, str], present: set[str], maybe_label_maps: Mapping[str, str] | None = None
                 ) -> RefTable:
    """The refs of the listed ``files`` (sorted by relative path), each file refused while
    listing (no usable label, a missing mask, outside the root) appended to ``issues`` and each
    file left out on purpose (a ``where:`` filter, not in a ``files: table`` table) to
    ``excluded`` instead; a file the table gives no label (no row, or an empty cell: the probe's
    ``missing_label``, reported after the file's own defects) gets its message in ``unlabeled``,
    by path. ``present``: a URL root's objects, by relative path (:func:`_row_file_missing`).
    Refs go into a table one at a time (:mod:`packer.pipeline.sampletable`):
    as a list of objects, 100k refs held 60 MiB at once, much of it never given back after
    discovery. ``progress`` counts the files, one by one. ``maybe_label_maps``: why the weak name
    rule takes a file for a label map, by relative path, for its ref's ``maybe_label_map``."""
    kind = source_kind(source.kind)
    refs = TableBuilder(RefTable)
    rows = placed.rows
    named = _named_files(placed)
    only_table = source.table_map is not None and source.table_map.files == "table"
    cells: dict[str, tuple[int, str]] | None = None  # built when a file has no row: the other cells naming it
    escaped: dict[str, tuple[int, str]] | None = None  # likewise: the cells path_base reads outside the root
    folded_rows: dict[str, list[str]] | None = None  # likewise: the rows naming no listed file, by case fold
    for rel, path in files:
        progress.update()
        if rel in named:  # a mask (or a case's other file) beside the images is the table's, not a sample
            continue
        sample_id = make_sample_id(source.name, rel, phi)
        if rel in placed.filtered:
            excluded.append(Excluded(sample_id, path, "discover", "filtered", placed.filtered[rel]))
            continue
        if rel in placed.refused:
            refused = placed.refused[rel]
            issues.append(Issue(sample_id=sample_id, path=path, stage="discover", reason=refused.reason,
                                message=refused.message))
            continue
        row = rows.get(rel)
        if row is None and only_table:
            said = f"{table} names no such file (files: table)"
            if (twin := _case_twin(rel, folded_rows := folded_rows if folded_rows is not None else _folded(
                    set(rows) - {listed for listed, _ in files}))) is not None:
                said = (f"no row of {table} names {rel!r}, but row {rows[twin].row} names {twin!r}, which differs "
                        "from it only in case (file names compare with their case; that row's own record is "
                        "missing_file): write the row as the file is named (files: table)")
            excluded.append(Excluded(sample_id, path, "discover", "not_in_table", said))
            continue
        label = _target_text(source, rel, row, known)
        # a folder-labelled source whose entity is its table's: a file without a row lacks the row,
        # not an entity cell, and is missing_label as a table-labelled one is (README, files: root)
        rowless = (row is None and table is not None and source.target.origin == "folder"
                   and not kind.identity_in_header and source.entity_path is None)
        if rowless and isinstance(label, str):
            label = None
        ref = _file_ref(source, kind, rel, path, row, label if isinstance(label, str) else None, phi, sample_id)
        if maybe_label_maps and rel in maybe_label_maps:
            ref = replace(ref, maybe_label_map=maybe_label_maps[rel])
        if label is None and table is not None and (source.target.origin == "table" or rowless):
            if cells is None:
                cells = _cells_naming_files(rows)
            if escaped is None:
                escaped = _cells_read_outside(source, rows)
            if row is not None and row.unlabeled:
                why = row.unlabeled
            elif rel in cells:
                why = _named_elsewhere(rel, cells[rel], table, kind.table_key)
            elif rel in escaped:
                why = (f"no label: {table} row {escaped[rel][0]} names {rel!r}, but the table's cells are read from "
                       f"{kind.table_key}.path_base, so it names {escaped[rel][1]!r}, outside the root (that row's "
                       "own record says how to write it)")
            elif (twin := _case_twin(rel, folded_rows := folded_rows if folded_rows is not None else _folded(
                    set(rows) - {listed for listed, _ in files}))) is not None:
                why = (f"no label: no row of {table} names {rel!r}, but row {rows[twin].row} names {twin!r}, which "
                       "differs from it only in case (file names compare with their case; that row's own record is "
                       "missing_file): write the row as the file is named")
            elif rowless:
                why = _unnameable(rel, table) or (
                    f"no row of {table} names {rel!r}: a label: folder source with a table takes each file's class "
                    f"from its folder and its entity from its row (column {source.entity!r}, the source's entity:), "
                    "so a file without a row is not packed; add its row, or, where the table names only the "
                    f"dataset's files, set {kind.table_key}.files: table")
            else:
                why = _unnameable(rel, table) or (
                    f"no label: no row of {table} names {rel!r}; add its row, or, where the table names only the "
                    f"dataset's files, set {kind.table_key}.files: table (or, for unlabeled data, the source's "
                    "'label: none')")
            unlabeled[path] = f"{path}: {why}"
        if source.label_table is None and (miss := failed(source.where, {k: (v,) for k, v in ref.extra})):
            # a table-less source filters on its paths' fields (a table's rows were filtered when placed)
            excluded.append(Excluded(sample_id, path, "discover", "filtered",
                                     f"{miss.key} is {dict(ref.extra).get(miss.key, '')!r}; where: {miss.describe()}"))
            continue
        if isinstance(label, Refused):
            issues.append(Issue.of(ref, stage="discover", reason=label.reason, message=label.message))
        elif row is not None and ref.entity is None and isinstance(label, str) and not kind.identity_in_header \
                and source.entity_path is None:
            issues.append(Issue.of(ref, stage="discover", reason="missing_entity", message=(
                f"{row.entity_at or f'{table} row {row.row}'}, column {source.entity!r} (the source's entity:): "
                "empty, so the file has "
                "no entity to keep it in one split; fill the cell, make each such file its own entity (entity: "
                f"{{column: {source.entity}, empty: file}}), or leave such rows out with where: "
                f"{{{source.entity}: {{match: '.'}}}}")))
        elif (unnamed := _row_files_problem(source, ref, table, row)) is not None:
            issues.append(unnamed)
        elif real_root is not None and (linked := _row_file_outside(source, ref, table, row, real_root)) is not None:
            issues.append(linked)
        elif real_root is not None and _outside_root(Path(ref.path), real_root):
            # an object store has no symlinks: a listed object is always under its prefix
            issues.append(Issue.of(ref, stage="discover", reason="outside_root",
                                   message=f"{ref.path} resolves to {Path(ref.path).resolve()}, outside the source "
                                           f"root {source.root}; move the file in, or set safety.outside_root: allow"))
        elif (gone := _row_file_missing(source, ref, table, row, present)) is not None:
            issues.append(gone)
        else:
            refs.append(ref)
    _filtered_without_files(source, files, placed, phi, excluded)
    return refs.finish(release=True)


def _filtered_without_files(source: SourceConfig, files: Sequence[tuple[str, str]], placed: Placed,
                            phi: Pseudonymizer | None, excluded: list[Excluded]) -> None:
    """A ``filtered`` record for each table row a ``where:`` left out whose file the root does not
    hold (a partial download): it was in no count and no record, so whether a filtered row was
    counted hung on whether its file happened to be there. Its path is where the file would be."""
    unlisted = set(placed.filtered) - {rel for rel, _ in files}
    for rel in sorted(unlisted):
        if escapes_root(rel):
            continue
        path = join_relpath(source.root, rel) if isinstance(source.root, str) else str(source.root / rel)
        excluded.append(Excluded(make_sample_id(source.name, rel, phi), path, "discover", "filtered",
                                 f"{placed.filtered[rel]} (its file is not under the root either)"))


def _unlisted_path(source: SourceConfig, rel: str) -> str:
    """The path of a file a table row names that the listing does not give, as its record names
    it: under the root (a URL root joined by :func:`join_relpath`), normalized where ``..`` leads out."""
    if isinstance(source.root, str):
        return join_relpath(source.root, rel)
    target = str(source.root / rel)
    return os.path.normpath(target) if escapes_root(rel) else target


def _rows_saying(table: Path | str | None, row: TableRow, verb: str) -> str:
    """``<table> row 8 lists`` (``verb`` "lists") or, for a file several rows name,
    ``<table> rows 8 and 9 list``."""
    if not row.other_rows:
        return f"{table} row {row.row} {verb}"
    numbers = [str(n) for n in (row.row, *row.other_rows)]
    return f"{table} rows {', '.join(numbers[:-1])} and {numbers[-1]} {verb.removesuffix('s')}"


def _unlisted_rows(source: SourceConfig, rows: Mapping[str, TableRow], seen: set[str], table: Path | str | None,
                   phi: Pseudonymizer | None, allow_outside: bool, listed: dict[str, RawObject],
                   storage_options: Mapping[str, Any] | None, present: set[str], issues: list[Issue],
                   excluded: list[Excluded]) -> list[SampleRef]:
    """The table's rows for files the listing did not give: with ``safety.outside_root: allow``,
    refs of existing files next to the root (their listing entries added to ``listed``); every
    other such row is an ``outside_root`` or ``missing_file`` record, appended to ``issues``, or,
    under the table's ``missing: drop`` (a partial download), a row naming no file under the
    root is a ``not_downloaded`` record appended to ``excluded``. A row naming a folder, or a file
    the listing does not give (``notes.txt``, a hidden file), is a ``missing_file`` record saying
    so, with or without ``missing: drop``: under a URL root, by the objects ``present`` under it
    (a folder there is a prefix of some), so that a local and a remote copy of a tree give the
    same records. A row whose ``refused`` is set stands for rows that the table refuses (they
    disagree: :attr:`Placed.refused_rows`): its ``missing_file`` or ``not_downloaded`` record says
    that too, and an existing file outside the root that ``outside_root: allow`` lets in is that
    refusal's record, not a ref."""
    by_name = source.table_map is not None and source.table_map.find == "name"
    drop = source.table_map is not None and source.table_map.missing == "drop"
    remote = isinstance(source.root, str)
    outside: list[SampleRef] = []
    listed_sorted: list[str] = []
    present_sorted: list[str] = []
    folded_files: dict[str, list[str]] | None = None  # the listed files by their name's case fold, when first asked
    for rel, row in sorted(rows.items()):
        if rel in seen:
            continue
        if is_url_cell(rel):  # a URL on another store (or under a local root): no path under the root names it
            issues.append(Issue(sample_id=make_sample_id(source.name, rel, phi), path=rel, stage="discover",
                                reason="missing_file",
                                message=f"{_rows_saying(table, row, 'lists')} {row.cell or rel!r}, a URL outside the "
                                        f"source root {source.root} (another store, bucket or host); give the URL of "
                                        "the file under the root, or its path relative to the root, or point the "
                                        "root at the folder the URLs are under"))
            continue
        target = join_relpath(source.root, rel) if isinstance(source.root, str) else str(source.root / rel)
        if escapes_root(rel):
            if not allow_outside:
                issues.append(Issue(sample_id=make_sample_id(source.name, rel, phi),
                                    path=target if remote else os.path.normpath(target), stage="discover",
                                    reason="outside_root", message=_leaves_root(source, rel, row, table, seen)))
                continue
            stat = stat_remote(target, storage_options) if remote else None
            if (stat is not None or (not remote and Path(target).is_file())) and row.refused is not None \
                    and row.other_rows:
                issues.append(Issue(sample_id=make_sample_id(source.name, rel, phi), path=target, stage="discover",
                                    reason=row.refused.reason, message=row.refused.message))
                continue
            if stat is not None or (not remote and Path(target).is_file()):
                # allowed on purpose: a table may point next to the root
                if stat is not None:
                    listed[target] = stat
                outside.append(SampleRef(sample_id=make_sample_id(source.name, rel, phi), source=source.name,
                                         kind=source.kind, path=target, relpath=rel, label=row.label,
                                         entity=row.entity, time=row.time, extra=row.extra))
                continue
        if not remote:
            try:
                folder = Path(target).is_dir()
                present_here = Path(target).is_file()
            except OSError as err:  # a folder on the way cannot be entered (permissions): say so, no crash
                issues.append(Issue(sample_id=make_sample_id(source.name, rel, phi),
                                    path=os.path.normpath(target), stage="discover", reason="unreadable",
                                    message=f"{table} row {row.row} lists {rel!r}, but {target} cannot be looked at "
                                            f"({err.strerror or err}): a folder on its way is not readable by this "
                                            "user; make it readable (chmod a+rx on the folders), or remove the row"))
                continue
        else:
            present_sorted = present_sorted or sorted(present)
            folder = _remote_folder(present_sorted, rel)
        if folder:
            # it exists: a folder is neither missing nor a partial download
            listed_sorted = listed_sorted or sorted(seen)
            linked_out = None if remote or allow_outside else _link_out(Path(target), Path(source.root))
            issues.append(_folder_row_issue(source, rel, row, target, table, listed_sorted, phi, linked_out))
            continue
        sample_id = make_sample_id(source.name, rel, phi)
        kind = source_kind(source.kind)
        if not by_name and not remote and present_here and not allow_outside and _resolves_outside(
                Path(target), Path(source.root)):  # through a link to a folder outside the root
            issues.append(Issue(sample_id=sample_id, path=target, stage="discover", reason="outside_root",
                                message=f"{table} row {row.row} lists {rel!r}, which resolves to "
                                        f"{Path(target).resolve()} through a link to a folder outside the source "
                                        f"root {source.root}; move the file in, or set safety.outside_root: allow"))
            continue
        if not by_name and (rel in present if remote else present_here):  # there, but not listed
            linked = None if remote else folder_link_on_way(source.root, rel)
            why = (f"(it is reached through the link {linked[0]} to a folder inside the root, and the listing "
                   f"names each file at its real path: write the row as {linked[1]!r})" if linked is not None else
                   f"(it lists {kind.looked_for}; hidden files and folders are skipped); point the row at one of "
                   "them, or remove the row")
            issues.append(Issue(sample_id=sample_id, path=target, stage="discover", reason="missing_file",
                                message=f"{table} row {row.row} lists {rel!r}, but {target} is not one of the "
                                        f"source's files {why}"))
            continue
        # a file that differs only in case is there, not undownloaded: never dropped in silence
        twin = None if by_name else _case_twin(rel, folded_files := folded_files if folded_files is not None
                                               else _folded(seen))
        also = (f"; the table refuses its rows as well ({row.refused.reason}: {row.refused.message})"
                if row.refused is not None and row.other_rows else "")
        if drop and twin is None:
            excluded.append(Excluded(sample_id, target, "discover", "not_downloaded",
                                     f"{_rows_saying(table, row, 'names')} {rel!r}, and no such file is under the root "
                                     f"(table.missing: drop){also}"))
            continue
        said = f"no file of that name is under {source.root} (find: name)" if by_name else f"{target} does not exist"
        if twin is not None:
            own = "not_in_table" if source.table_map is not None and source.table_map.files == "table" \
                else "missing_label"
            said += (f" (the root holds {twin!r}, which differs from it only in case: file names compare with their "
                     f"case, so that file has no row; its own record is {own})")
        elif not by_name and "/" in rel and (backslashed := rel.replace("/", "\\")) in seen:
            said += (f" (a backslash in the cell is read as a folder separator, and the root holds {backslashed!r} "
                     "itself: rename that file without the backslash)")
        issues.append(Issue(sample_id=sample_id, path=target, stage="discover", reason="missing_file",
                            message=f"{_rows_saying(table, row, 'lists')} {rel!r}, but {said}; " + (
                                "fix the row (missing: drop leaves out only rows whose file is not there)" if drop
                                else f"fix the row, or, where part of the dataset is not downloaded, set "
                                     f"{kind.table_key}.missing: drop") + also))
    return outside


def _folded(names: Iterable[str]) -> dict[str, list[str]]:
    """``names`` by their case fold (:func:`_case_twin`'s index)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in names:
        out[name.casefold()].append(name)
    return out


def _case_twin(rel: str, folded: Mapping[str, list[str]]) -> str | None:
    """The one name of the index ``folded`` (:func:`_folded`: the rows naming no listed file, or
    the listed files) other than ``rel`` that differs from it only in case; None where there is
    none, or several. A table made on Windows or macOS often spells names as the disk never did."""
    twins = [name for name in folded.get(rel.casefold(), ()) if name != rel]
    return twins[0] if len(twins) == 1 else None


def _leaves_root(source: SourceConfig, rel: str, row: TableRow, table: Path | str | None, seen: set[str]) -> str:
    """The ``outside_root`` message of a row whose path leaves the source root: the cell as the
    table writes it, and, where the cells are read from ``path_base``, where that led and whether
    the root holds the cell's path itself (a cell written from the root, not from the base)."""
    table_map = source.table_map
    cell = written_from_base(rel, table_map, source.root) if table_map is not None else None
    if table_map is None or cell is None:
        written = f"{row.cell!r} (read as {rel!r} from the source root)" if row.cell and row.cell != rel else repr(rel)
        return (f"{table} row {row.row}: {written} leaves the source root; give a path inside the root, or set "
                "safety.outside_root: allow")
    key = source_kind(source.kind).table_key
    # quoted as the table writes it (cell is only the path rebuilt from rel, which an absolute
    # '/mnt/old/a.png' never was: '../../mnt/old/a.png'); a template's path has no cell
    shown = row.cell or cell
    read = (f"an absolute path (not read from {key}.path_base)" if posixpath.isabs(shown.strip().replace("\\", "/"))
            else f"read from {key}.path_base ({table_map.path_base})")
    said = f"{table} row {row.row}: {shown!r}, {read}, is {rel!r} from the source root {source.root}, outside it"
    if cell in seen:  # the root holds the cell's path itself: the cell was written from the root
        below = written_from_base(cell, table_map, source.root)
        return (f"{said}; the root holds {cell!r} itself, so this cell is written from the root, not from "
                f"path_base: write it as {below!r}, as the other rows are, or, where every cell is written from the "
                f"root, drop {key}.path_base")
    return f"{said}; give a path inside the root, or set safety.outside_root: allow"


def _remote_folder(present: Sequence[str], rel: str) -> bool:
    """Whether ``rel`` is a folder of a URL root whose objects' relative paths are ``present``
    (sorted): a prefix of some."""
    prefix = rel.rstrip("/") + "/"
    at = bisect.bisect_left(present, prefix)
    return at < len(present) and present[at].startswith(prefix)


def _folder_row_issue(source: SourceConfig, rel: str, row: TableRow, target: str, table: Path | str | None,
                      listed: Sequence[str], phi: Pseudonymizer | None, outside: Path | None = None) -> Issue:
    """The ``missing_file`` record of a table row whose path names a folder under the root, not a
    file: it names the table, the row, the column and the folder, and a listed file inside it
    (``listed``: the listing's relative paths, sorted) to point the column at, where there is one.
    ``outside``: where the folder leads, when it is a link to a folder outside the root that the
    listing did not enter (:func:`_folder_link_issues` makes no record of its own for it)."""
    assert source.table_map is not None
    spec = source.table_map
    column = f"column {spec.path!r}" if spec.template is None else f"the path template {spec.template!r}"
    start = bisect.bisect_left(listed, rel.rstrip("/") + "/")
    inside = listed[start] if start < len(listed) and listed[start].startswith(rel.rstrip("/") + "/") else None
    example = f" (e.g. {inside!r})" if inside is not None else " (the listing found none of the source's files in it)"
    linked = ""
    if outside is not None:  # the listing did not enter it: its files are outside the root
        linked = (f"; it is a link to the folder {outside}, outside the source root, so none of its files was read: "
                  "move them in, or set safety.outside_root: allow")
        example = ""
    return Issue(sample_id=make_sample_id(source.name, rel, phi), path=target, stage="discover", reason="missing_file",
                 message=f"{table} row {row.row}, {column}: {rel!r} is the folder {target}, not a file; point the "
                         f"{'column' if spec.template is None else 'template'} at a file inside it{example}{linked}")


def _unsupported_note(unsupported: Sequence[tuple[str, str, str]]) -> str:
    """For the error of a source without a file it reads: the files of formats it does not read
    it found, counted by suffix (not named: a path may carry a patient's name), and what to do."""
    if not unsupported:
        return ""
    suffixes = Counter(_suffix(rel) or rel.rsplit("/", 1)[-1] for rel, _, _ in unsupported)
    counted = ", ".join(f"{n} {suffix}" for suffix, n in sorted(suffixes.items()))
    return f"It found {len(unsupported)} file(s) of formats it does not read ({counted}): {unsupported[0][2]}. "


def _versions_note(versions: Sequence[str]) -> str:
    """The sentence a source's no-files config error adds where the root holds packer's version
    folders (:func:`_without_packer_output`), which are not listed."""
    if not versions:
        return ""
    where = "the root itself" if versions[0] == "" else versions[0]
    return (f"It holds {len(versions)} version folder(s) of a packer build ({where}), which are its output, not raw "
            "files: point the root at the raw files the dataset was built from. ")


def _versions_warning(source: SourceConfig, versions: Sequence[str], *, hide_names: bool = False) -> str:
    """The warning naming the version folders of packer's under a source's root, skipped
    (:func:`_without_packer_output`), or ``""`` for none."""
    if not versions:
        return ""
    first = "" if hide_names else f" ({versions[0]}{', ...' if len(versions) > 1 else ''})"
    return (f"sources.{source.name}: {len(versions)} folder(s) under the root are version folders of a packer "
            f"build{first} (manifest.json and _index.parquet beside its shards): a build's output, not raw files; "
            "they are not listed. Move them out of the root to silence this")


def _unsupported_files(source: SourceConfig, unsupported: Sequence[tuple[str, str, str]],
                       placed: Placed, table: Path | str | None, phi: Pseudonymizer | None,
                       real_paths: dict[str, str] | None = None) -> list[Excluded]:
    """One ``unsupported_format`` record per file of a format the source's kind finds but cannot
    read (a WebP image under an image source: :meth:`~packer.read.kinds.SourceKind.unsupported`),
    its detail saying what it is and what to do. A file the table's file columns name (a mask)
    is its row's, not left out; under ``files: table`` a file no row names is ``not_in_table``,
    like any other such file. A name that is not valid UTF-8 is shown with its bad bytes escaped."""
    rows = placed.rows
    named = _named_files(placed)
    only_table = source.table_map is not None and source.table_map.files == "table"
    by_name = source.table_map is not None and source.table_map.find == "name"
    # under find: name a row naming a file that is not listed keeps the row's own path: match by name
    row_names = {key.rsplit("/", 1)[-1] for key in rows} if only_table and by_name else set()
    out = []
    for rel, path, what in unsupported:
        if rel in named:
            continue
        sample_id = _name_id(source.name, rel, phi)
        at = _shown_name(path)
        _note_real(real_paths, sample_id, path, at)
        if only_table and rel not in rows and rel.rsplit("/", 1)[-1] not in row_names:
            out.append(Excluded(sample_id, at, "discover", "not_in_table",
                                f"{table} names no such file (files: table)"))
        else:
            out.append(Excluded(sample_id, at, "discover", "unsupported_format", what))
    return out


def _rows_of_readable(source: SourceConfig, rows: Mapping[str, TableRow],
                      unsupported: Sequence[tuple[str, str, str]]) -> dict[str, TableRow]:
    """The table's rows less those naming a file of a format the source does not read (its
    ``unsupported_format`` record says it; the row is no ``missing_file`` as well)."""
    by_name = source.table_map is not None and source.table_map.find == "name"
    paths = {rel for rel, _, _ in unsupported}
    names = {rel.rsplit("/", 1)[-1] for rel in paths} if by_name else set()
    return {rel: row for rel, row in rows.items()
            if rel not in paths and not (by_name and rel.rsplit("/", 1)[-1] in names)}


def _path_pattern_problem(source: SourceConfig, relpaths: Sequence[str], where: str) -> None:
    """Raise ConfigError for a path pattern (entity, time, a field) that matches no listed file,
    showing one: a typo there would otherwise make every file a bad sample."""
    for field_spec in (source.entity_path, source.time_path, *source.fields):
        if field_spec is None or not relpaths:
            continue
        if not any(field_spec.value(rel) for rel in relpaths):
            said = f"path: {field_spec.pattern!r}" if field_spec.pattern is not None else \
                f"component: {field_spec.component}"
            key = field_spec.name if field_spec.name in ("entity", "time") else f"fields.{field_spec.name}"
            raise ConfigError(f"{where}.{key} (source {source.name!r}): {said} matches none of the "
                              f"{len(relpaths)} files; a file's path relative to the root is {relpaths[0]!r}")


def _source_refs(source: SourceConfig, phi: Pseudonymizer | None, allow_outside: bool,
                 known_labels: tuple[str, ...] = (), storage_options: Mapping[str, Any] | None = None, *,
                 where: str = "sources[0]", relative_to: str = "the job file", quiet: bool = False,
                 split: SplitConfig | None = None, own: Sequence[str] = (),
                 listings: Listings = BUILD_LISTINGS) -> SourceFound:
    """The refs of one source, its table-only issues, what it left out, and its remote listing.
    ``where``: the source's key path in the job file (``sources[1]``), for its ConfigErrors;
    ``relative_to``: what its relative paths are relative to, for them too. ``quiet``: no
    progress lines (:func:`~packer.progress.stage_progress`). ``split``: the job's (a file's rows
    must agree on its ``by: column`` cell, :func:`place_rows`). ``own``: the job's output folders,
    never listed (:func:`own_output_folders`). ``listings``: where its warnings say the files it
    left out are listed (a build's ``excluded.jsonl``; packer validate's report)."""
    as_written = _check_root(source, where, relative_to)
    kind = source_kind(source.kind)
    table = source.label_table
    try:
        records = (read_records(source, storage_options, hide_values=phi is not None and phi.active)
                   if table is not None else None)  # before a long listing
    except ConfigError as err:
        raise ConfigError(f"{where}.{kind.table_key} (source {source.name!r}): {err}") from err
    links: list[str] = []
    aliases: list[tuple[str, str]] = []
    unlisted: list[tuple[str, OSError]] = []
    unsupported: list[tuple[str, str, str]] = []
    present: set[str] = set()  # a URL root's objects, listed or not: what a table row names is there or not
    versions: list[str] = []  # packer's version folders under the root, not listed
    files, listed = _listed_files(source, allow_outside, storage_options, links, quiet=quiet, unsupported=unsupported,
                                  present=present, unlisted=unlisted, aliases=aliases, own=own, skipped=versions)
    real_paths: dict[str, str] = {}  # by sample id, where a record holds the path escaped
    files, unnamed, unnamed_out = _undecodable_names(source, files, phi, real_paths)
    masks_out: list[Excluded] = []
    maybe_label_maps: dict[str, str] = {}  # by relpath: for the probe to decide by the file's header
    if table is None and kind.names_masks:  # never all of them: a mask is left out only beside its image
        files, masks_out, maybe_label_maps = _without_mask_named(source, files, phi,
                                                                 by_content=kind.label_maps_by_content)
    if not files:  # a typo in root would otherwise build an empty dataset and exit 0
        undecodable = len(unnamed) + len(unnamed_out)
        # a folder name may be a patient's: under pseudonymization the message names no file
        example = ("" if not undecodable or phi is not None and phi.active
                   else f", e.g. '{unnamed[0].path if unnamed else unnamed_out[0].path}'")
        named = (f"{undecodable} file(s) whose names are not valid UTF-8{example}, which no record can hold: "
                 "rename them (e.g. convmv -r -f latin1 -t utf-8 --notest ROOT). " if undecodable else "")
        if undecodable and not unsupported and not versions:  # there are files, only no name is text
            raise ConfigError(f"{where}.root (source {source.name!r}): every {source.kind} file under {source.root} "
                              f"({as_written}) has a name that is not valid UTF-8 ({undecodable} file(s){example}), "
                              "which no record can hold; rename them (e.g. convmv -r -f latin1 -t utf-8 --notest "
                              "ROOT)")
        raise ConfigError(f"{where}.root (source {source.name!r}): no {source.kind} files under {source.root} "
                          f"({as_written}); looked for {kind.looked_for}, in subfolders too. "
                          + named + _unsupported_note(unsupported) + _versions_note(versions)
                          + "Check the root, or remove the source from the job")
    relpaths = [rel for rel, _ in files]
    if phi is not None and phi.active:  # a folder or file name may be a patient's: no message prints it bare
        note_names(_path_names(relpaths))
    _path_pattern_problem(source, relpaths, where)
    placed: Placed = Placed()
    unplaced: dict[str, Refused] = {}
    if records is not None:
        try:
            placed, unplaced = place_rows(source, records, relpaths, known_labels, quiet=quiet,
                                          hide_paths=phi is not None and phi.active, split=split)
        except ConfigError as err:
            raise ConfigError(f"{where}.{kind.table_key} (source {source.name!r}): {err}") from err
    excluded: list[Excluded] = [*unnamed_out, *masks_out]
    rows = placed.rows
    if unsupported:
        excluded.extend(_unsupported_files(source, unsupported, placed, table, phi, real_paths))
        rows = _rows_of_readable(source, rows, unsupported)  # an unsupported file's row is said by its record
    # a link a row names is that row's record (_unlisted_rows), not a second one of its own
    issues: list[Issue] = _folder_link_issues(source, links, phi, named=rows, real_paths=real_paths) if links else []
    linked = _aliased_files(source, aliases, relpaths, phi, named=rows, real_paths=real_paths) if aliases else {}
    excluded.extend(record for records in linked.values() for record in records)
    issues.extend(_unlisted_folder_issues(source, unlisted, phi, real_paths))
    issues.extend(unnamed)
    for rel, refused in sorted(unplaced.items()):  # one record per file, however many rows name it
        issues.append(Issue(sample_id=make_sample_id(source.name, rel, phi), path=_unlisted_path(source, rel),
                            stage="discover", reason=refused.reason, message=refused.message))
    real_root = None if isinstance(source.root, str) or allow_outside else Path(source.root).resolve()
    with stage_progress("discover", len(files), unit="files", quiet=quiet) as progress:
        unlabeled: dict[str, str] = {}
        refs = _listed_refs(source, files, placed, table, phi, known_labels, real_root, issues, excluded, progress,
                            unlabeled, present, maybe_label_maps)
    seen = set(relpaths)
    del files, relpaths
    # a file not on disk whose rows disagree is still one file: its missing_file record says both
    refused_rows = _rows_of_readable(source, placed.refused_rows, unsupported) if unsupported else placed.refused_rows
    outside = _unlisted_rows(source, {**rows, **refused_rows}, seen, table, phi, allow_outside, listed,
                             storage_options, present, issues, excluded)
    if outside:
        refs = RefTable.concat([refs, RefTable.of(outside)])
        # UTF-8 byte order is code point order, as sorted() on str; the sort is stable, as sorted()
        refs = refs.take(pc.sort_indices(refs.arrow("relpath")).to_numpy())
    own_entity = entity_warning(source, refs, records.columns if records else (), rows,
                                hide_ids=phi is not None and phi.active)
    warnings_said = [w for w in (_versions_warning(source, versions, hide_names=phi is not None and phi.active),
                                 _mask_named_warning(source, masks_out, hide_names=phi is not None and phi.active,
                                                     listed_in=listings.excluded),
                                 _aliased_class_warning(source, aliases, linked,
                                                        hide_names=phi is not None and phi.active,
                                                        listed_in=listings.excluded))
                     if w]
    hint = header_entity_hint(source, refs, records.columns if records else (), rows,
                              hide_ids=phi is not None and phi.active)
    return SourceFound(refs, issues, listed, excluded, warnings_said, placed.rows_filtered, unlabeled, hint,
                       own_entity, real_paths)


@dataclass(frozen=True)
class SourceFound:
    """What one source's listing found (:func:`_source_refs`)."""

    refs: RefTable
    issues: list[Issue]
    listed: dict[str, RawObject]
    excluded: list[Excluded]
    warnings: list[str]
    rows_filtered: int
    unlabeled: dict[str, str]
    #: what to warn of once the probe finds every kept file its own entity (:func:`header_entity_hint`)
    entity_hint: EntityHint | None = None
    #: :func:`entity_warning`: said unless another source's files share this one's entities
    own_entity_warning: str | None = None
    #: by sample id, the real path of each record whose path is escaped (not valid UTF-8)
    real_paths: dict[str, str] = field(default_factory=dict)


_PATIENT_COLUMN = re.compile(r"patient|subject|mrn|participant|person|case[ _-]?id", re.IGNORECASE)
#: What a column named after the patient may hold that is no id: "Patient Age", "Patient Sex"
_PATIENT_ATTRIBUTE = re.compile(r"(?<![a-z])(?:age|sex|gender|weight|height|size|birth|dob|date|time|race|"
                                r"ethnicity|position|orientation|comments?|notes?)(?![a-z])", re.IGNORECASE)
#: A file name's leading token, before its first ``_`` or ``-`` (``10`` of ``10_left.jpeg``)
_LEADING_TOKEN = re.compile(r"^([^_.-]+)([_-])")
_PATIENT_PART = re.compile(r"^(?:patient|subject|case|sub|pat|p)[-_]?\d+$", re.IGNORECASE)
#: A file name ending in a channel number, ``_`` and four digits, before its suffixes: nnU-Net's and the
#: Decathlon's ``prostate_01_0000.nii.gz``, ``prostate_01_0001.nii.gz`` (the case ``prostate_01``)
_CHANNEL_SUFFIX = re.compile(r"^(.+)_\d{4}(?:\.[A-Za-z][A-Za-z0-9]*)+$")


def _names_its_files(folders: Sequence[str], relpaths: Sequence[str]) -> bool:
    """Whether each file's name holds the name of its folder at one level, a name of letters and
    digits (an id, not a year or a date): a case folder that names its files after itself, as
    BraTS's do (``BraTS20_Training_006/BraTS20_Training_006_t1.nii.gz``)."""
    return all(any(c.isdigit() for c in folder) and any(c.isalpha() for c in folder)
               and folder.lower() in rel.rsplit("/", 1)[-1].lower()
               for folder, rel in zip(folders, relpaths, strict=True))


def _id_columns(columns: Sequence[str], rows: Mapping[str, TableRow], entity: str | None) -> list[str]:
    """The table ``columns`` that look like a patient id: named like one (``Patient ID``,
    ``subject_id``; not an attribute of the patient such as ``Patient Age``), not the ``entity``
    column already, and grouping the files (``rows``: the table's rows by file): a cell some
    files share. A column of one value per file would make each file its own entity again."""
    named = [c for c in columns if _PATIENT_COLUMN.search(c) and not _PATIENT_ATTRIBUTE.search(c) and c != entity]
    cells = [dict(row.extra) for row in rows.values()] if named else []  # the rows read only for them
    return [column for column in named if _groups([c.get(column, "") for c in cells])]


def _groups(cells: Sequence[str]) -> bool:
    """Whether some of ``cells`` (one a file; a blank one groups nothing) are the same."""
    values = [cell for cell in cells if cell.strip()]
    return len(set(values)) < len(values)


def entity_warning(source: SourceConfig, refs: RefTable, columns: Sequence[str],
                   rows: Mapping[str, TableRow] | None = None, *, hide_ids: bool = False) -> str | None:
    """A warning when every file of a source is its own entity while a table column whose cells
    group the files (``rows``: the table's rows by file), or a part of the paths, looks like a
    patient id: leakage protection is then off, most likely by mistake (``entity: path``, or a
    table whose patient column the job does not name). None otherwise, and for a kind that reads
    entities from headers, whose entities are known once the probe has read them
    (:func:`header_entity_hint`, :func:`own_entity_warnings`). The files of another source may
    share the entities (ODIR's left and right fundus sources over one ``ID`` column):
    :func:`discover` then drops the warning. ``hide_ids`` (PHI pseudonymization): a path part is
    named by its place only, not quoted: it is the raw patient id."""
    if source_kind(source.kind).identity_in_header or len(refs) < 2:
        return None
    codes, _ = refs.codes("entity")
    if np.unique(codes).size != len(refs):
        return None
    hints = [f"column {c!r}" for c in _id_columns(columns, rows or {}, source.entity)]
    if not hints:
        channel_files = "channel_files" in source_kind(source.kind).source_keys
        hints = [hint for hint in (_path_part_hint(_first_relpaths(refs), hide_ids=hide_ids,
                                                   channel_files=channel_files),) if hint]
    if not hints:
        return None
    return (f"source {source.name!r}: each of its {len(refs)} files is its own entity, so leakage protection is "
            f"off: no patient can be kept in one split. {hints[0][0].upper() + hints[0][1:]} looks like a patient "
            "id: name it in 'entity:'")


def _first_relpaths(refs: RefTable) -> list[str]:
    """The relative paths of the first 1000 of ``refs``: what :func:`_path_part_hint` looks at."""
    return [rel or "" for rel in refs.field_text("relpath").slice(0, min(1000, len(refs))).values()]


def _path_part_hint(relpaths: Sequence[str], *, hide_ids: bool, channel_files: bool = False) -> str | None:
    """A part of ``relpaths`` (a folder level; the first 1000 are looked at) that looks like a
    patient id and groups files: its place and the ``entity: {component: N}`` that reads it; None
    where none does. ``channel_files``: the source's kind stacks a case's files as channels
    (:func:`_channel_suffix_hint` offers that too)."""
    relpaths = relpaths[:1000]
    if not relpaths:
        return None
    for part in range(-len(relpaths[0].split("/")), -1):
        values = [rel.split("/")[part] if len(rel.split("/")) >= -part else "" for rel in relpaths]
        if len(set(values)) < len(values) and (all(_PATIENT_PART.match(v) for v in values)
                                               or _names_its_files(values, relpaths)):
            component = len(relpaths[0].split("/")) + part
            example = f"the path part at component {component}" if hide_ids else f"the path part {values[0]!r}"
            return f"{example} (entity: {{component: {component}}})"
    return _file_name_hint(relpaths, hide_ids=hide_ids) or \
        _channel_suffix_hint(relpaths, hide_ids=hide_ids, channel_files=channel_files)


def _file_name_hint(relpaths: Sequence[str], *, hide_ids: bool) -> str | None:
    """The leading token of the file names, before a ``_`` or ``-``, where it looks like a patient
    id that groups the files (Diabetic Retinopathy's ``10_left.jpeg``, ``10_right.jpeg``): it holds
    a digit, most files share theirs with another file, and it makes several entities, none
    holding most files (``ISIC_0000000``'s ``ISIC``, a ``view1_``/``view2_`` prefix group nothing).
    Its place and the ``entity: {path: REGEX}`` that reads it; None where it does not look so."""
    tokens, seps = [], set()
    for rel in relpaths:
        found = _LEADING_TOKEN.match(rel.rsplit("/", 1)[-1])
        if found is None or not any(c.isdigit() for c in found.group(1)):
            return None
        tokens.append(found.group(1))
        seps.add(found.group(2))
    counts = Counter(tokens)
    if not _groups_patients(counts):
        return None
    token = r"\d+" if all(t.isdigit() for t in counts) else r"[^/_.-]+"
    sep = next(iter(seps)) if len(seps) == 1 else "[_-]"
    at = "^" if all("/" not in rel for rel in relpaths) else "(?:^|/)"
    end = "" if at == "^" else "[^/]*$"
    example = "the leading part of the file names" if hide_ids else f"the leading part {tokens[0]!r} of the file names"
    return f"{example} (entity: {{path: '{at}(?P<entity>{token}){sep}{end}'}})"


def _groups_patients(counts: Counter[str]) -> bool:
    """Whether ``counts`` (files by a candidate id) look like patients grouping the files: several
    ids (3 or more), most files sharing theirs with another, none holding most files, and no more
    than 20 files an id on average (a class or a camera's sequence, not a patient)."""
    total = sum(counts.values())
    shared = sum(n for n in counts.values() if n > 1)
    return len(counts) >= 3 and 2 * shared >= total and 2 * max(counts.values()) <= total and total <= 20 * len(counts)


def _channel_suffix_hint(relpaths: Sequence[str], *, hide_ids: bool, channel_files: bool) -> str | None:
    """The file names less a trailing channel number (``_`` and four digits), where what is left
    looks like a case id that groups the files: nnU-Net's raw ``imagesTr/prostate_01_0000.nii.gz``,
    ``prostate_01_0001.nii.gz`` are the channels of case ``prostate_01``. Every name ends so, what is
    left holds a digit, and it groups as patients do (:func:`_groups_patients`): one channel a case
    (``CT001_0000``) groups nothing, and a camera's ``IMG_0001.jpg``, ``IMG_0002.jpg`` leave ``IMG``, no
    id. Its place and the ``entity: {path: REGEX}`` that reads it, and, for a kind that stacks a
    case's files as channels (``channel_files``), the table that does; None where it does not look so."""
    cases = []
    for rel in relpaths:
        name = rel.rsplit("/", 1)[-1]
        found = _CHANNEL_SUFFIX.match(name)
        if found is None or not any(c.isdigit() for c in found.group(1)):
            return None
        cases.append((found.group(1), name))
    if not _groups_patients(Counter(case for case, _ in cases)):
        return None
    at = "^" if all("/" not in rel for rel in relpaths) else "(?:^|/)"
    example = "" if hide_ids else f", as {cases[0][0]!r} of {cases[0][1]!r}"
    stacked = "; or, one sample a case, a table whose channel_files columns name its other files" \
        if channel_files else ""
    return (f"the file names less their trailing channel number{example} "
            f"(entity: {{path: '{at}(?P<entity>[^/]+)_\\d{{4}}\\.[^/]*$'}}{stacked})")


@dataclass(frozen=True)
class EntityHint:
    """What :func:`header_entity_hint` found over a header-entity source's listed files, judged
    again over the files the probe kept (:meth:`said`): a header ``where:`` that keeps one image a
    patient leaves each kept file its own entity, and a column or a folder that grouped only the
    files it left out is no reason to warn."""

    kind: str
    #: the table's columns that look like a patient id and group the listed files
    columns: tuple[str, ...]
    #: by relative path, each listed file's cells of ``columns``, in their order
    cells: Mapping[str, tuple[str, ...]]
    #: PHI pseudonymization: a path part is named by its place only (:func:`_path_part_hint`)
    hide_ids: bool

    def said(self, relpaths: Sequence[str]) -> str | None:
        """The hint over the files at ``relpaths`` (the kept ones: their entities are the probe's):
        the columns whose cells group them and the part of their paths that does; None where
        none does (each file's patient holds that file alone: nothing to leak)."""
        relpaths = sorted(relpaths)
        kept = [self.cells[rel] for rel in relpaths if rel in self.cells]
        columns = [column for i, column in enumerate(self.columns) if _groups([cells[i] for cells in kept])]
        return _header_hint_text(self.kind, columns, _path_part_hint(relpaths, hide_ids=self.hide_ids))


def header_entity_hint(source: SourceConfig, refs: RefTable, columns: Sequence[str], rows: Mapping[str, TableRow],
                       *, hide_ids: bool = False) -> EntityHint | None:
    """For a kind that reads entities from headers (DICOM): what :func:`own_entity_warnings` says
    once the probe finds every kept file its own entity, where a table column whose cells group
    the files (``rows``: the table's rows by file) or a part of the paths looks like a patient id:
    an anonymiser that wrote one PatientID per image while the table's ``patient_id`` and the
    folders group them spreads each patient over the splits. None where nothing looks so over
    the listed files; otherwise judged again over the files the probe keeps (:meth:`EntityHint.said`)."""
    if not source_kind(source.kind).identity_in_header or source.entity_path is not None or len(refs) < 2:
        return None
    grouping = _id_columns(columns, rows, None)
    if not grouping and _path_part_hint(_first_relpaths(refs), hide_ids=hide_ids) is None:
        return None
    cells = {rel: tuple(dict(row.extra).get(column, "") for column in grouping) for rel, row in rows.items()} \
        if grouping else {}
    return EntityHint(source.kind, tuple(grouping), cells, hide_ids)


def _header_hint_text(kind: str, columns: Sequence[str], path_hint: str | None) -> str | None:
    """The sentence of :func:`own_entity_warnings` naming the first of ``columns`` and the path
    part of ``path_hint`` (:func:`_path_part_hint`) that look like a patient id, and the fix; None
    for neither."""
    place, _, read = (path_hint or "").partition(" (")
    named = " and ".join([*(f"column {column!r}" for column in columns[:1]), *([place] if place else [])])
    if not named:
        return None
    if place:
        fix = f"read the entity from the path, {read.removesuffix(')')}"
    else:
        fix = (f"a {kind} source reads its entity from a header keyword or from its paths, not a table "
               "column: name the header keyword that holds the patient id (entity: KEYWORD), or, where the "
               "paths hold it, entity: {path: REGEX} or entity: {component: N}")
    return (f"{named[0].upper() + named[1:]} {'look' if ' and ' in named else 'looks'} like a patient id, grouping "
            f"the files: {fix}")


def own_entity_warnings(hints: Mapping[str, EntityHint], sources: Sequence[str], entities: Sequence[int],
                        relpaths: Sequence[str | None], files: Sequence[int] | None = None) -> list[str]:
    """The warnings of :func:`header_entity_hint` (``hints``: by source name) for each source
    whose probed files are each their own entity: ``sources``, ``entities``, ``relpaths``: each
    sample's source name, entity code (as :meth:`~packer.pipeline.sampletable.SampleTable.codes`
    gives them) and relative path; ``files``: how many files each sample stands for (a volume: its
    series'; default one each), so that one volume a patient is a patient's files together, not
    files each their own. The hint is judged over the kept samples' files alone, as the entities
    are (:meth:`EntityHint.said`): those a header ``where:`` left out group nothing that can leak."""
    said = []
    by_source: dict[str, Counter[int]] = defaultdict(Counter)
    for n, (name, entity) in enumerate(zip(sources, entities, strict=True)):
        if name in hints:
            by_source[name][entity] += files[n] if files is not None else 1
    for name, found in by_source.items():
        total = sum(found.values())
        if total < 2 or any(count != 1 for count in found.values()):
            continue
        hint = hints[name].said([rel or "" for rel, of in zip(relpaths, sources, strict=True) if of == name])
        if hint is not None:
            said.append(f"source {name!r}: each of its {total} files is its own entity (its headers name a "
                        "different one each), so leakage protection is off: no patient can be kept in one split. "
                        f"{hint}")
    return said


@dataclass(frozen=True)
class Discovery:
    """What discovery found: ``refs`` (sorted by source, then relative path), the table-only
    ``issues``, ``excluded``: files left out on purpose (a ``where:`` filter, not in a
    ``files: table`` table), ``warnings`` to print, ``rows_filtered``: table rows a filter left
    out (counted; only those naming a listed file are in ``excluded``), ``unlabeled``: by path,
    the message of a file its table gives no label (no row, an empty cell) for the probe's
    ``missing_label`` record, and ``listed``: for each
    remote file (by URL) the size and version tag its listing gave, which the build cache keys it
    by (a local file is keyed by its stat)."""

    refs: RefTable
    issues: list[Issue]
    listed: dict[str, RawObject] = field(default_factory=dict)
    excluded: list[Excluded] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows_filtered: int = 0
    unlabeled: dict[str, str] = field(default_factory=dict)
    #: by source name, what to warn of once the probe finds every file its own entity
    #: (:func:`header_entity_hint`, :func:`own_entity_warnings`)
    entity_hints: dict[str, EntityHint] = field(default_factory=dict)
    #: by sample id, the path as the OS gives it of each record whose ``path`` holds it escaped
    #: (a name that is not valid UTF-8: :func:`_shown_name`), for ``packer locate``
    real_paths: dict[str, str] = field(default_factory=dict)


def _path_names(relpaths: Sequence[str]) -> set[str]:
    """Every folder and file name of ``relpaths``, and each file's name without its extensions
    (``IM_Doe_John.dcm`` and ``IM_Doe_John``), for :func:`packer.redact.note_names`."""
    names: set[str] = set()
    for rel in relpaths:
        parts = rel.split("/")
        names.update(parts)
        names.add(parts[-1].split(".", 1)[0])
    return names


def check_roots(job: JobConfig) -> None:
    """Raise the ConfigError :func:`discover` would for a local source root that is missing or
    not a folder, before a cluster starts: its workers would otherwise be blamed for not seeing
    a folder that is nowhere (:meth:`~packer.pipeline.cluster.Executor.require_shared`)."""
    relative_to = "base_dir" if job.job_path == MAPPING_JOB else "the job file"
    for index, source in enumerate(job.sources):
        try:
            _check_root(source, f"sources[{index}]", relative_to)
        except ConfigError as err:
            raise ConfigError(f"{job.job_path}: {err}") from err


def discover(job: JobConfig, phi: Pseudonymizer | None = None, *,
             storage_options: Mapping[str, Any] | None = None, quiet: bool = False,
             listings: Listings = BUILD_LISTINGS) -> Discovery:
    """List every source's raw files, local or behind URLs (read with ``storage_options``):
    refs sorted by source, then relative path, the table-only issues, what was left out on
    purpose, warnings, and the remote listing. A step that runs long (the walk, the placement of
    the table's rows, the refs) shows a progress line on stderr unless ``quiet``
    (:func:`~packer.progress.stage_progress`). ``listings``: where the warnings say the files left
    out are listed (a build's ``excluded.jsonl``; packer validate's report's records).

    Raises ConfigError for a missing root, an unreadable or malformed table, or a store that
    cannot be listed (missing bucket, credentials, endpoint; the message says which).
    """
    tables: list[RefTable] = []
    issues: list[Issue] = []
    excluded: list[Excluded] = []
    said: list[str] = []
    listed: dict[str, RawObject] = {}
    rows_filtered = 0
    unlabeled: dict[str, str] = {}
    hints: dict[str, EntityHint] = {}
    real_paths: dict[str, str] = {}
    own_entity: dict[int, str] = {}  # where in ``said`` each source's entity_warning goes: by source name
    allow_outside = job.safety.outside_root == "allow"
    own = own_output_folders(job)
    for index, source in enumerate(job.sources):
        try:
            found = _source_refs(source, phi, allow_outside, job.labels, storage_options, where=f"sources[{index}]",
                                 relative_to="base_dir" if job.job_path == MAPPING_JOB else "the job file",
                                 quiet=quiet, split=job.split, own=own, listings=listings)
        except ConfigError as err:  # the job file and the source's place in it, as a schema error names them
            raise ConfigError(f"{job.job_path}: {err}") from err
        tables.append(found.refs)
        issues.extend(found.issues)
        listed.update(found.listed)
        excluded.extend(found.excluded)
        if found.own_entity_warning is not None:
            own_entity[len(said)] = source.name
            said.append(found.own_entity_warning)
        said.extend(found.warnings)
        rows_filtered += found.rows_filtered
        unlabeled.update(found.unlabeled)
        real_paths.update(found.real_paths)
        if found.entity_hint is not None:
            hints[source.name] = found.entity_hint
    refs = RefTable.concat(tables)
    if own_entity and len(job.sources) > 1:
        sharing = _sharing_entities(refs)
        said = [w for i, w in enumerate(said) if own_entity.get(i) not in sharing]
    if len(job.sources) > 1:
        said.extend(_read_twice(refs, hide_paths=phi is not None and phi.active))
    excluded = _once(excluded, refs, issues, real_paths)
    # distinct ids counted in Arrow: a set of every id held ~120 bytes a sample
    if len(refs) and pc.count_distinct(refs.arrow("sample_id")).as_py() != len(refs):  # a (vanishingly rare) hash
        # collision: renamed in path order
        unique, renamed = unique_ids(list(refs), hide_paths=phi is not None and phi.active)
        refs = RefTable.of(unique)
        said.extend(renamed)
    return Discovery(refs=refs, issues=issues, listed=listed, excluded=excluded, warnings=said,
                     rows_filtered=rows_filtered, unlabeled=unlabeled, entity_hints=hints, real_paths=real_paths)


def _sharing_entities(refs: RefTable) -> set[str]:
    """The sources at least half of whose files share their entity with another source's files
    (ODIR's left- and right-fundus sources over one table's ``ID``): the entity groups them
    across the sources, as the split does, so a source's files each their own entity within it
    are no leak."""
    sources, source_names = refs.codes("source")
    entities, entity_names = refs.codes("entity")
    known = np.array([name is not None for name in entity_names], dtype=bool)[entities]  # a file without one: alone
    pairs = np.unique(np.stack([entities[known], sources[known]]), axis=1)
    shared = known & (np.bincount(pairs[0], minlength=len(entity_names))[entities] > 1)
    files = np.bincount(sources, minlength=len(source_names))
    sharing = np.bincount(sources, weights=shared, minlength=len(source_names))
    return {str(source_names[i]) for i in range(len(source_names)) if files[i] and 2 * sharing[i] >= files[i]}


def _read_twice(refs: RefTable, *, hide_paths: bool = False) -> list[str]:
    """A warning where sources read one file each (nested or shared roots of one kind, not
    parted by ``where:``): each such file is packed once per source, and counted once per source
    among the inputs and the bad samples; empty where every file is one source's. ``hide_paths``
    (PHI pseudonymization): no example path, as a folder may carry a patient's name."""
    paths = refs.arrow("path")
    if not len(paths) or pc.count_distinct(paths).as_py() == len(paths):
        return []
    counts = pc.value_counts(paths)
    twice = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    held = pc.is_in(paths, value_set=twice)
    sources = sorted(set(refs.arrow("source").filter(held).to_pylist()))
    example = "" if hide_paths else f"; e.g. {twice[0].as_py()}"
    return [f"{len(twice):,} file(s) are read by several sources ({', '.join(sources)}{example}): "
            "their roots are nested or shared, so each such file is packed, and counted among the inputs, once per "
            "source; narrow a root, or part the sources with where:"]


def _once(excluded: list[Excluded], refs: RefTable, issues: Sequence[Issue],
          real_paths: Mapping[str, str]) -> list[Excluded]:
    """The exclusions, each file once: sources over one root with a table each (CheXpert's
    train.csv and valid.csv, ``files: table``) each list the other's files as not in their
    table; such a file is the other source's sample, bad sample or exclusion, and counted there.
    Likewise a file of a format no source reads is one ``unsupported_format`` record however
    many sources list its root (and none where another source took it). A file is told by its
    real path (``real_paths``, by sample id, where a record holds it escaped): a name that is not
    valid UTF-8, escaped, is the name of another file spelled with a real backslash."""
    if not any(e.why in ("not_in_table", "unsupported_format") for e in excluded):
        return excluded
    taken = set(refs.column("path")) | {real_paths.get(i.sample_id, i.path) for i in issues}
    placed = taken | {real_paths.get(e.sample_id, e.path) for e in excluded if e.why != "not_in_table"}
    out, seen = [], set()
    for item in excluded:
        real = real_paths.get(item.sample_id, item.path)
        if item.why == "not_in_table" and (real in placed or real in seen):
            continue
        if item.why == "unsupported_format" and (real in taken or real in seen):
            continue
        seen.add(real)
        out.append(item)
    return out


def unique_ids(refs: list[SampleRef], *, hide_paths: bool = False) -> tuple[list[SampleRef], list[str]]:
    """Keep sample ids unique: a (vanishingly rare) 64-bit hash collision gets a ``-dupN``
    suffix, given in path order so the result is deterministic, and a warning names both files,
    or, with ``hide_paths`` (the job pseudonymizes: a folder or file name may hold a patient's
    name), only the sample ids, which ``packer locate`` turns back into files where the key is.
    Returns the refs and those warnings, which the build prints and keeps in ``warnings.jsonl``
    with discovery's others (a Python warning reached the terminal alone, naming packer's line)."""
    seen: dict[str, SampleRef] = {}
    said: list[str] = []
    out = []
    for ref in refs:
        sample_id, n = ref.sample_id, 1
        while sample_id in seen:
            n += 1
            sample_id = f"{ref.sample_id}-dup{n}"
        if sample_id != ref.sample_id:
            if hide_paths:
                said.append(f"two files share sample id {ref.sample_id} (a hash collision); the later in path order "
                            f"is {sample_id} (paths not shown under phi: pseudonymize; packer locate JOB "
                            f"{ref.sample_id} {sample_id} names them)")
            else:
                said.append(f"sample id {ref.sample_id} of {ref.path} collides with {seen[ref.sample_id].path}; "
                            f"using {sample_id}")
            ref = replace(ref, sample_id=sample_id)
        seen[sample_id] = ref
        out.append(ref)
    return out, said


def locate_samples(job: JobConfig, keys: Sequence[str], phi: Pseudonymizer, *,
                   storage_options: Mapping[str, Any] | None = None,
                   refused: dict[str, str] | None = None,
                   entities: dict[str, list[str]] | None = None) -> dict[str, str | None]:
    """The raw file (path or URL) of each sample key of ``job``, None for a key no file of its
    sources makes: the sources are listed again and each file's sample id made as discovery
    makes it (with ``phi``, the job's pseudonymizer: the key decides the ids). A frame's, a page's
    or a tile's key (``<id>-f0003``, ``<id>-p00001-t00000_00128``: :func:`packer.keys.parse_key`)
    and a volume's (its first file's id) name their file. Nothing is decoded. ``refused``: where
    the key of a file the job has names a part that file cannot be cut into (a frame of a photo,
    a tile of a job that cuts none) goes, with why. A path is the file's real name, as the OS
    gives it, also where its record holds it escaped (not valid UTF-8: its bad bytes are
    surrogates here, which :func:`os.fsencode` turns back into them). ``entities``: where a key
    no file makes is an entity id of the job's files as its outputs write it (``e-`` and 20 hex
    under pseudonymization, ``leakage.json``'s ``entities``), the sample ids of that entity's
    files go, by key; only entities known from the listing (a table's or a path's, or the file's
    own), never one read from a file's headers (nothing is decoded)."""
    found = discover(job, phi, storage_options=storage_options)
    files = dict(zip(found.refs.column("sample_id"), found.refs.column("path"), strict=True))
    kinds = dict(zip(found.refs.column("sample_id"), found.refs.column("kind"), strict=True))
    for issue in found.issues:  # files refused while listing (outside the root, no label) are files too
        files.setdefault(issue.sample_id, issue.path)
    for left_out in found.excluded:  # and so are files left out on purpose (filtered, not in the table)
        files.setdefault(left_out.sample_id, left_out.path)
    files.update(found.real_paths)  # a name that is not valid UTF-8: its record holds it escaped
    out: dict[str, str | None] = {}
    heads: dict[str, bytes] = {}
    for key in keys:
        parts = parse_key(key)
        kind = kinds.get(parts.file_id)
        head = b""
        if kind is not None and parts != KeyParts(parts.file_id) and source_kind(kind).key_head_bytes:
            if parts.file_id not in heads:  # a file's format decides its parts (a page only of a TIFF)
                heads[parts.file_id] = _file_head(files[parts.file_id], source_kind(kind).key_head_bytes,
                                                  storage_options)
            head = heads[parts.file_id]
        made = kind is None or _makes_part(job, kind, parts, head)
        out[key] = files.get(key) or (files.get(parts.file_id) if made else None)
        if out[key] is None and not made and refused is not None and kind is not None:
            refused[key] = _unmade_part(job, kind, parts, head)
    unmade = {key for key, path in out.items() if path is None and key not in (refused or {})}
    if entities is not None and unmade:
        written: dict[str, str] = {}  # an entity as the listing has it -> as outputs write it
        for sample_id, entity in zip(found.refs.column("sample_id"), found.refs.column("entity"), strict=True):
            if entity is not None:
                written.setdefault(entity, phi.entity(entity))
                if written[entity] in unmade:
                    entities.setdefault(written[entity], []).append(sample_id)
    return out


def _file_head(path: str, size: int, storage_options: Mapping[str, Any] | None) -> bytes:
    """The first ``size`` bytes of the raw file at ``path`` (a local path or a URL: one ranged
    read), ``b""`` where it cannot be read, as the reader would find it unreadable."""
    if not is_url(path):
        head = _read_head(path, size)
        return head if isinstance(head, bytes) else b""
    folder, name = path.rsplit("/", 1)
    return read_heads(folder, [name], size, storage_options)[0]


def _unmade_part(job: JobConfig, kind: str, parts: KeyParts, head: bytes = b"") -> str:
    """Why a ``kind`` file of ``job`` whose first bytes are ``head`` makes no sample of the part
    ``parts`` names (see :func:`_makes_part`), naming keys the file does make, never one the
    dataset lacks (a tiled job packs no ``<id>``, only its tiles)."""
    maker = source_kind(kind)
    made, fmt = maker.file_key_parts(head), maker.file_format(head)
    what = f"{parts.file_id} is {'an' if kind[:1] in 'aeiou' else 'a'} {kind} file of the job"
    if parts.frame is not None and "frame" not in made:
        return f"{what}, and only DICOM and NIfTI files have frames (-fNNNN)"
    if maker.key_head_bytes and not made:
        return (f"{what}, but its first bytes are no format its reader reads (or it cannot be read): it makes no "
                f"sample, and its bad-sample record is keyed {parts.file_id}")
    if parts.page is not None and "page" not in made:
        said = "" if fmt is None else (f": by its first bytes it is a {fmt} file, a single image, so its keys carry no "
                                     "-pNNNNN")
        return f"{what}, and only TIFF files have pages (-pNNNNN){said}"
    if "tile" not in made:
        return f"{what}, and only image files are cut into tiles (-tRRRRR_CCCCC)"
    paged = "page" in made and parts.page is None  # a TIFF: its pages' keys, where it has several, carry -pNNNNN
    nearest = maker.nearest_tile(job, parts.tile) if parts.tile is not None else None
    if nearest is None:
        whole = (f"{parts.file_id}-pNNNNN, one per page of a multi-page TIFF, or {parts.file_id} for a one-page one"
                 if "page" in made else parts.file_id)
        return (f"{parts.file_id} is a file of the job, but the job cuts no tile at that top-left pixel: it cuts no "
                f"tiles at all (transform.image.tile is not set), so its samples of this file are keyed {whole}")
    tile, stride = job.image.tile_size, job.image.tile_stride or job.image.tile_size
    reach = "" if job.image.size is not None else ", where the image holds a full tile there"
    suffix = make_key(parts.file_id, tile=nearest)[len(parts.file_id):]
    pages = f" ({parts.file_id}-pNNNNN{suffix} of each page of a multi-page TIFF)"
    return (f"{parts.file_id} is a file of the job, but the job cuts no tile at that top-left pixel: its tiles "
            f"(transform.image.tile size {list(tile or ())}, stride {list(stride or ())}) start on rows and columns "
            f"that are multiples of the stride; rounded down to them, that pixel is the top-left one of "
            f"{make_key(parts.file_id, page=parts.page, tile=nearest)}{pages if paged else ''}{reach}")


def _makes_part(job: JobConfig, kind: str, parts: KeyParts, head: bytes = b"") -> bool:
    """Whether a file of ``kind`` whose first bytes are ``head`` can make the part ``parts``
    names under ``job``: the parts its format gives keys
    (:meth:`~packer.read.kinds.SourceKind.file_key_parts`: frames from DICOM and NIfTI files,
    tiles from images, pages from TIFF images alone: :func:`packer.keys.make_key`), a tile only
    where the job cuts it."""
    maker = source_kind(kind)
    made = maker.file_key_parts(head)
    if (parts.frame is not None and "frame" not in made) or (parts.page is not None and "page" not in made):
        return False
    return parts.tile is None or ("tile" in made and maker.makes_tile(job, parts.tile))
