"""The versions of one dataset in a local output folder (``<output>/<name>/``), and which bytes
they share on disk (``packer ls OUTPUT/NAME``, and what ``packer gc`` plans from).

Versions share bytes in two ways. An incremental build may hard-link an unchanged shard from an
earlier version: the two folders then name the same inode, stored once. Or a shard may simply
have the same content as an earlier one (same sha256 in both manifests) but sit in its own file:
a copy, stored twice. Sharing on disk is counted by inode (``st_dev``, ``st_ino``); identical
content by the manifests' sha256. Sizes are the files' lengths (``st_size``), as the manifest
records them.

A file's links outside the dataset folder (a user's own hard link, another output's) are seen
only through ``st_nlink``: a file with more links than the dataset folder holds counts as shared
("elsewhere"), never as the version's own, so what ``packer gc`` says it frees is never more than
it frees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.badsamples import failed_build
from packer.config import SPLITS
from packer.errors import ConfigError, PackerError
from packer.files import TMP_SUFFIX, folder_locked_now, human_bytes, parent_folder, stale_temporary
from packer.manifest import MANIFEST_FILE, is_incomplete_version, read_manifest
from packer.storage import is_url

#: Folder prefixes in a dataset folder that are not versions: a build's staging folder (a build
#: in progress, or one that was interrupted: the next build of that job clears it) and a version
#: ``packer gc`` was removing (renamed first, so an interrupted gc leaves no half version).
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"

Inode = tuple[int, int]


@dataclass(frozen=True)
class FileLinks:
    """One inode under the dataset folder: its size, its link count (``st_nlink``) and how many of
    those links each folder of the dataset holds."""

    size: int
    nlink: int
    links: tuple[tuple[str, int], ...]

    @property
    def owners(self) -> frozenset[str]:
        return frozenset(folder for folder, _ in self.links)

    @property
    def linked_elsewhere(self) -> bool:
        """True when some link of the file lies outside the dataset folder."""
        return self.nlink > sum(n for _, n in self.links)


@dataclass(frozen=True)
class VersionUsage:
    """One version folder: what its manifest says and what its files take on disk.

    ``folder``: the folder's name (the version, unless renamed by hand). ``bytes``: every file in
    it (shards, index, reports), each inode once. ``unique_bytes``: the files no other folder
    links, which removing this version alone would free. ``shared_bytes``: the rest (linked by
    another version, a staging folder or a link outside the dataset). ``problem``: why the
    manifest could not be read (then ``version``, ``created_at`` and the counts are best effort,
    and ``packer gc`` leaves the folder alone). ``failed``: why the build that wrote it failed
    (its bad samples over ``max_bad_fraction``: exit 3, the version kept for its report), else None.
    """

    folder: str
    path: Path
    version: str
    created_at: str
    dataset_hash: str
    samples: int
    shards: int
    shard_bytes: int
    bytes: int
    unique_bytes: int
    shared_bytes: int
    problem: str | None = None
    failed: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"folder": self.folder, "path": str(self.path), "version": self.version,
                "created_at": self.created_at, "dataset_hash": self.dataset_hash, "samples": self.samples,
                "shards": self.shards, "shard_bytes": self.shard_bytes, "bytes": self.bytes,
                "unique_bytes": self.unique_bytes, "shared_bytes": self.shared_bytes, "problem": self.problem,
                "failed": self.failed}


@dataclass(frozen=True)
class OtherFolder:
    """An entry of the dataset folder that is not a readable version: ``kind`` is ``staging`` (a
    build in progress or interrupted), ``temporary`` (a ``*.partial`` file a build writes there
    while it runs, its shared-folder probe, a table half written: :func:`stale_temporaries`),
    ``incomplete`` (a version whose build stopped while publishing it:
    :func:`is_incomplete_version`), ``trash`` (a version an interrupted ``packer
    gc`` was removing), ``unreadable`` (a folder this user may not look into:
    :func:`unreadable_folder`; ``problem`` says why, ``bytes`` is 0, as nothing in it can be
    counted), ``link`` (a symbolic link to a folder, ``target`` what it points to: another team's
    version brought in with ``ln -s``, whoever made it owns it; ``bytes`` is 0, as nothing through
    it is this folder's, and ``packer gc`` leaves it alone) or ``other``."""

    folder: str
    kind: str
    bytes: int
    problem: str | None = None
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"folder": self.folder, "kind": self.kind, "bytes": self.bytes,
                **({"problem": self.problem} if self.problem is not None else {}),
                **({"target": self.target} if self.target is not None else {})}


@dataclass(frozen=True)
class DatasetVersions:
    """The versions of one dataset folder, newest ``created_at`` first, and its inodes.

    ``disk_bytes``: every file of the versions stored once (each inode once); ``sum_bytes``: the
    versions' sizes added up (what they would take as independent copies); ``linked_bytes``: the
    difference, saved by hard links. ``copied_bytes``: bytes of shards stored more than once with
    the same content (same sha256 in two manifests, different inodes), which links would save.
    """

    root: Path
    name: str
    versions: tuple[VersionUsage, ...]
    others: tuple[OtherFolder, ...]
    files: dict[Inode, FileLinks]
    copied_bytes: int

    @property
    def disk_bytes(self) -> int:
        versions = {v.folder for v in self.versions}
        return sum(f.size for f in self.files.values() if f.owners & versions)

    @property
    def sum_bytes(self) -> int:
        return sum(v.bytes for v in self.versions)

    @property
    def linked_bytes(self) -> int:
        return self.sum_bytes - self.disk_bytes

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.name, "folder": str(self.root), "versions": [v.to_json() for v in self.versions],
                "others": [o.to_json() for o in self.others], "disk_bytes": self.disk_bytes,
                "sum_bytes": self.sum_bytes, "linked_bytes": self.linked_bytes, "copied_bytes": self.copied_bytes}


#: How a build's probe of the dataset folder is named (``shared-probe-<hex>.partial``): a file
#: that tells workers see the folder the client does, there only while the build runs
PROBE_PREFIX = "shared-probe-"


def is_dataset_folder(folder: str | Path) -> bool:
    """True when ``folder`` holds at least one version folder (``<version>/manifest.json``), a
    build's ``.staging-*`` or an interrupted gc's ``.trash-*`` folder, or a version whose build
    stopped while publishing it (:func:`is_incomplete_version`): a dataset whose first build was
    interrupted holds only such a folder, and is still the dataset's folder. So is one holding
    a build's probe (``shared-probe-<hex>.partial``: all a first build killed before it published
    leaves), or one a build or gc holds the lock of (a first build that has written nothing yet):
    packer's own names and locks only, so an arbitrary folder is still none."""
    root = Path(folder)
    if not root.is_dir():
        return False
    entries = list(os.scandir(root))
    return (any(entry.is_dir() and (entry.name.startswith((STAGING_PREFIX, TRASH_PREFIX))
                                    or not entry.name.startswith(".")
                                    and unreadable_folder(Path(entry.path)) is None
                                    and ((Path(entry.path) / MANIFEST_FILE).is_file()
                                         or is_incomplete_version(Path(entry.path))))
                for entry in entries)
            or any(entry.name.startswith(PROBE_PREFIX) and entry.name.endswith(TMP_SUFFIX)
                   and entry.is_file(follow_symlinks=False) for entry in entries)
            or folder_locked_now(root))


def unreadable_folder(folder: Path) -> str | None:
    """Why this user cannot look into ``folder`` (``permission denied``: a colleague's version
    folder of mode 700, one built under umask 077), or None where its entries can be listed and
    its manifest looked for. Such a folder is none of this user's to count or remove: ``packer
    ls`` names it, ``packer gc`` leaves it alone, a build reuses no shard from it."""
    try:
        os.scandir(folder).close()
        (folder / MANIFEST_FILE).is_file()
    except PermissionError as err:
        return err.strerror or str(err)
    except OSError:  # gone meanwhile, or not a folder: not this question's
        return None
    return None


def check_local_dataset_folder(folder: str | Path, *, command: str) -> Path:
    """``folder`` as a local dataset folder, or ConfigError naming what to pass instead: a URL
    (these commands read inodes, which object stores do not have), a path that is not a folder,
    a version folder (pass its parent) or a folder without versions."""
    if is_url(str(folder)):
        raise ConfigError(f"{folder}: `packer {command}` works on a local output folder only (it counts and removes "
                          "hard-linked files by inode, which object stores do not have); for versions in an object "
                          "store, list them with the store's tools and remove a version by deleting its "
                          "<prefix>/<name>/<version>/ objects, manifest.json first")
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder; pass a dataset folder <output>/<name>/ (it holds the version "
                          "folders)")
    if (root / MANIFEST_FILE).is_file():
        raise ConfigError(f"{root}: a version folder; pass the dataset folder that holds it, {parent_folder(root)}")
    if not is_dataset_folder(root):
        datasets = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and is_dataset_folder(entry))
        hint = (f"it is an output folder holding the dataset(s) {', '.join(datasets)}: pass one of them, e.g. "
                f"{root / datasets[0]}") if datasets else "it holds no version folder (<version>/manifest.json)"
        raise ConfigError(f"{root}: not a dataset folder; {hint}")
    return root


def _walk_files(folder: Path, skip: frozenset[str] = frozenset()) -> Iterable[os.stat_result]:
    """The stat of every regular file under ``folder`` (symbolic links neither followed nor counted);
    files removed meanwhile are skipped, and so are the files of a folder this user may not read
    (:func:`unreadable_folder`: :func:`list_versions` names such a version folder instead).
    ``folder`` itself a link: nothing (what it points to is not under the folder it is in).
    ``skip``: paths of files not to count (a version's temporaries: :func:`version_temporaries`)."""
    if os.path.islink(folder):
        return
    stack = [os.fspath(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, PermissionError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.path not in skip:
                    yield entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue


def scan_links(folders: dict[str, Path], skip: frozenset[str] = frozenset()) -> dict[Inode, FileLinks]:
    """Every inode under ``folders`` (name → path): its size, link count and the links each
    folder holds; the files at the paths ``skip`` are not counted."""
    sizes: dict[Inode, tuple[int, int]] = {}
    links: dict[Inode, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, path in folders.items():
        for st in _walk_files(path, skip):
            inode = (st.st_dev, st.st_ino)
            sizes[inode] = (st.st_size, st.st_nlink)
            links[inode][name] += 1
    return {inode: FileLinks(size=size, nlink=nlink, links=tuple(sorted(links[inode].items())))
            for inode, (size, nlink) in sizes.items()}


def stale_staging(root: Path, *, keep: str | None = None) -> list[Path]:
    """The ``.staging-*`` entries of the dataset folder ``root`` but ``keep`` (a name): whoever
    holds the dataset folder's lock (a build, ``packer gc``) knows no build writes them, so they
    are what an interrupted build of the job, as it was then configured, left behind."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(entry.path) for entry in entries if entry.name.startswith(STAGING_PREFIX) and entry.name != keep]


def stale_temporaries(root: Path) -> list[Path]:
    """The ``*.partial`` files of the dataset folder ``root`` itself (regular files, no link): a
    build writes them there only while it runs (its shared-folder probe,
    ``shared-probe-<hex>.partial``; a table half written), under the dataset folder's lock, so
    whoever holds that lock (a build, ``packer gc``) knows them for what an interrupted build left;
    the next build removes them too."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(entry.path) for entry in entries
            if entry.name.endswith(TMP_SUFFIX) and entry.is_file(follow_symlinks=False)]


def version_temporaries(root: Path) -> list[Path]:
    """The ``*.partial`` files (regular files, no link) directly in the version folders of the
    dataset folder ``root`` (folders holding ``manifest.json``, not hidden, not links, readable):
    ``report.html`` or ``manifest.json`` half written by a build or ``packer report``
    (``report.html.<pid>-<hex>.partial``), a build's warnings half written. None of them is the
    version's: ``packer ls`` lists them apart, and a build or ``packer gc`` removes those whose
    writer is gone (:func:`stale_version_temporaries`)."""
    found = []
    try:
        folders = sorted((e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                          and not e.name.startswith(".")), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for folder in folders:
        path = Path(folder.path)
        if unreadable_folder(path) is not None or not (path / MANIFEST_FILE).is_file():
            continue
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile (gc)
            found += sorted(Path(e.path) for e in os.scandir(path)
                            if e.name.endswith(TMP_SUFFIX) and e.is_file(follow_symlinks=False))
    return found


def stale_version_temporaries(root: Path, *, lock_held: bool) -> list[Path]:
    """The :func:`version_temporaries` of the dataset folder ``root`` whose writer is gone
    (:func:`packer.files.stale_temporary`): one named for its writer (``report.html.<pid>-<hex>.partial``)
    once no process of that id runs (``packer report`` writes there without the dataset folder's
    lock, so a running one's stays); one of a fixed name where ``lock_held`` (the caller holds
    the dataset folder's lock, as a build writing it does)."""
    return [path for path in version_temporaries(root) if stale_temporary(path, lock_held=lock_held)]


def staging_bytes(path: Path) -> int:
    """The bytes removing the staging folder ``path`` frees: its files no other link holds (a shard
    hard-linked into a version stays on disk). A link named ``path`` frees nothing."""
    if path.is_symlink():
        return 0
    return sum(st.st_size for st in _walk_files(path) if st.st_nlink == 1)


def remove_staging(path: Path) -> None:
    """Remove the staging folder ``path`` and only what lies under it: a link named ``path`` is
    removed itself, never followed (its target may be a kept version, or anything); links inside
    are removed, never followed (``shutil.rmtree`` opens each folder without following links); a
    shard hard-linked into a version loses only this link. A read-only folder under ``path`` is
    made writable to empty it. Raises OSError when the file system refuses a removal."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    inside = os.path.abspath(path)

    def make_writable(function: Any, failed: str, info: Any) -> None:
        parent = os.path.dirname(os.path.abspath(failed))
        if not (parent == inside or parent.startswith(inside + os.sep)) or os.path.islink(parent):
            raise info[1] if isinstance(info, tuple) else info  # nothing outside the staging folder is changed
        os.chmod(parent, os.stat(parent, follow_symlinks=False).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        function(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=make_writable)
    else:
        shutil.rmtree(path, onerror=make_writable)


def _other_kind(path: Path) -> str:
    name = path.name
    if name.startswith(STAGING_PREFIX):
        return "staging"
    if name.startswith(TRASH_PREFIX):
        return "trash"
    if not is_incomplete_version(path):
        return "other"
    # a build holds the dataset folder's lock from start to end (gc while it runs): this may be its version
    return "publishing" if folder_locked_now(path.parent) else "incomplete"


def list_versions(folder: str | Path) -> DatasetVersions:
    """The versions in the dataset folder ``folder`` (``<output>/<name>/``), newest ``created_at``
    first (the version id breaks ties), with the bytes each holds alone and shares.

    Reads each manifest strictly (a damaged one is listed with its ``problem``) and stats every
    file under the folder's subfolders; reads no shard. Raises ConfigError when ``folder`` is not
    a local dataset folder (:func:`check_local_dataset_folder`).
    """
    root = check_local_dataset_folder(folder, command="ls")
    subfolders = {entry.name: entry for entry in sorted(root.iterdir()) if entry.is_dir()}
    # a link to a folder (another team's version, ln -s) is whoever made it's: named, never followed or counted
    others: list[OtherFolder] = [OtherFolder(folder=name, kind="link", bytes=0, target=os.readlink(path))
                                 for name, path in subfolders.items() if path.is_symlink()]
    subfolders = {name: path for name, path in subfolders.items() if not path.is_symlink()}
    # a folder this user may not read is no version of theirs to count: named, never looked into
    unreadable = {name: why for name, path in subfolders.items() if (why := unreadable_folder(path)) is not None}
    others += [OtherFolder(folder=name, kind="unreadable", bytes=0, problem=why) for name, why in unreadable.items()]
    subfolders = {name: path for name, path in subfolders.items() if name not in unreadable}
    in_versions = version_temporaries(root)  # a version's half-written report: not the version's bytes
    for path in [*stale_temporaries(root), *in_versions]:
        with contextlib.suppress(FileNotFoundError):  # a build that runs removes its own when it ends
            others.append(OtherFolder(folder=path.relative_to(root).as_posix(), kind="temporary",
                                      bytes=path.lstat().st_size))
    files = scan_links(subfolders, skip=frozenset(os.fspath(p) for p in in_versions))
    by_folder: dict[str, list[FileLinks]] = defaultdict(list)
    for links in files.values():
        for owner in links.owners:
            by_folder[owner].append(links)
    versions, shard_files = [], {}
    names: set[str] = set()
    for name, path in subfolders.items():
        size = sum(f.size for f in by_folder[name])
        if name.startswith(".") or not (path / MANIFEST_FILE).is_file():
            others.append(OtherFolder(folder=name, kind=_other_kind(path), bytes=size))
            continue
        unique = sum(f.size for f in by_folder[name] if f.owners == {name} and not f.linked_elsewhere)
        try:
            manifest = read_manifest(path).data
        except PackerError as err:
            versions.append(VersionUsage(folder=name, path=path, version=name, created_at="", dataset_hash="",
                                         samples=0, shards=0, shard_bytes=0, bytes=size, unique_bytes=unique,
                                         shared_bytes=size - unique, problem=str(err)))
            continue
        names.add(manifest["name"])
        shards = [s for split in SPLITS if split in manifest["splits"] for s in manifest["splits"][split]["shards"]]
        shard_files[name] = [(path / s["file"], s["sha256"], s["bytes"]) for s in shards]
        versions.append(VersionUsage(folder=name, path=path, version=manifest["version"],
                                     created_at=manifest["created_at"], dataset_hash=manifest["dataset_hash"],
                                     samples=manifest["inputs"]["samples"], shards=len(shards),
                                     shard_bytes=sum(s["bytes"] for s in shards), bytes=size, unique_bytes=unique,
                                     shared_bytes=size - unique, failed=failed_build(manifest)))
    return DatasetVersions(root=root, name=", ".join(sorted(names)) or root.name,
                           versions=tuple(sorted(versions, key=lambda v: (v.created_at, v.version), reverse=True)),
                           others=tuple(sorted(others, key=lambda o: o.folder)), files=files,
                           copied_bytes=_copied_bytes(shard_files))


def _copied_bytes(shard_files: dict[str, list[tuple[Path, str, int]]]) -> int:
    """Bytes of shards whose content (sha256) is stored in more than one inode: for each content,
    its size times the number of inodes holding it beyond the first."""
    inodes: dict[str, set[Inode]] = defaultdict(set)
    sizes: dict[str, int] = {}
    for shards in shard_files.values():
        for path, sha256, size in shards:
            try:
                st = path.stat()
            except OSError:
                continue  # a missing shard is verify's business; it is not stored at all
            inodes[sha256].add((st.st_dev, st.st_ino))
            sizes[sha256] = size
    return sum(sizes[digest] * (len(held) - 1) for digest, held in inodes.items())


_OTHER_TEXT = {"staging": "a build in progress, or one interrupted (the next build of this dataset, whatever its "
                          "configuration, or `packer gc` removes it)",
               "temporary": "a temporary file of a build in progress, or one interrupted (its shared-folder "
                            "probe, a table, report or manifest half written: the next build of this dataset, or "
                            "`packer gc`, removes it)",
               "trash": "a version an interrupted `packer gc` was removing (the next gc finishes it)",
               "incomplete": "INCOMPLETE: a version whose build stopped while publishing it, before its "
                             "manifest.json (killed, or a full disk); not a dataset. Building the job again from "
                             "the same inputs replaces it; `packer gc` removes it",
               "publishing": "NO MANIFEST YET: a `packer build` (or gc) of this dataset is running (it holds the "
                             "folder's lock), and this may be the version it is publishing (manifest.json comes "
                             "last) or an earlier build's leftover; once the build has ended it is either complete "
                             "or, still without manifest.json, INCOMPLETE (`packer gc` removes it)",
               "other": "not a version (no manifest.json): left alone",
               "link": "a symbolic link to {target}: not a folder a build of this dataset wrote, so not listed "
                       "as a version and none of its bytes counted here (`packer gc` leaves it alone)",
               "unreadable": "UNREADABLE: this user may not look into it ({problem}), so it is not counted, "
                             "`packer gc` leaves it alone and a build links no shard from it; its owner can make "
                             "it readable (chmod -R g+rX, for a group) or remove it"}


def format_versions(listing: DatasetVersions) -> str:
    """The table ``packer ls OUTPUT/NAME`` prints."""
    n = len(listing.versions)
    lines = [f"dataset {listing.name} in {listing.root}: {n} version{'s' if n != 1 else ''}, newest first "
             "(by the manifest's created_at)",
             f"  {'version':<14}{'created_at':<22}{'samples':>8}{'shards':>8}{'size':>12}{'own':>12}{'shared':>12}"]
    for v in listing.versions:
        if v.problem is not None:
            lines.append(f"  {v.folder:<14}BROKEN: {v.problem}")
            continue
        lines.append(f"  {v.folder:<14}{v.created_at:<22}{v.samples:>8}{v.shards:>8}{human_bytes(v.bytes):>12}"
                     f"{human_bytes(v.unique_bytes):>12}{human_bytes(v.shared_bytes):>12}"
                     + (f"  FAILED BUILD: {v.failed}" if v.failed else ""))
    lines.append(f"  on disk {human_bytes(listing.disk_bytes)} for {human_bytes(listing.sum_bytes)} of versions "
                 f"({human_bytes(listing.linked_bytes)} saved by hard links); identical shards stored as separate "
                 f"copies: {human_bytes(listing.copied_bytes)}")
    lines.append("  own: files no other folder links (what removing that version alone frees); shared: linked by "
                 "another version or elsewhere")
    for other in listing.others:
        text = _OTHER_TEXT[other.kind].format(problem=other.problem, target=other.target)
        lines.append(f"  also {other.folder}: {text}" if other.kind in ("unreadable", "link")
                     else f"  also {other.folder} ({human_bytes(other.bytes)}): {text}")
    return "\n".join(lines)
