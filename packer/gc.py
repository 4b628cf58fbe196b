"""``packer gc``: remove all but the newest versions of a dataset, and only the bytes no kept
version needs.

Which versions: the ``keep`` newest by their manifest's ``created_at`` (the version id breaks ties),
never the newest one (``keep`` is at least 1). A failed build's version (its bad samples over
``max_bad_fraction``: exit 3, written for its report) is never counted among them: one newer than
every kept version stays (the latest attempt and its report), an older one is removed. A folder
whose manifest cannot be read is not counted as a version and is left alone, and so is a folder this
user may not look into (a colleague's, of mode 700): gc keeps the newest readable versions and never
learns what that one is. A build's ``.staging-*`` folders are removed: gc runs only while no build
of the dataset does (it holds the build lock), so each is what an interrupted build left, which no
later build of an edited job would clear; so are the ``*.partial`` files of the dataset folder (a
killed build's ``shared-probe-<hex>.partial``), for the same reason. A version whose build stopped
while publishing it (its files moved in, no manifest yet:
:func:`~packer.manifest.is_incomplete_version`) is removed, as a leftover ``.trash-*`` is: gc holds
the build lock, so no build is publishing it, and nothing can read it without its manifest; it is
never counted as a version. The plan :func:`run_gc` carries out is made under that lock (one made
before it, as ``--dry-run`` prints, may have seen a version a build was publishing then). An entry
of the dataset folder that is a symbolic link (``ln -s /shared/teamA/ds/<v> out/ds/<v>``, a version
brought in without copying, or a link named ``.staging-*``) is no version of this folder: it is left
alone and never counted, the link and what it points to. Removing only the link would be harmless to
its target, but gc removes what builds of this folder wrote, and nothing else: the plan names the
link so that whoever made it removes it. A link of the dataset folder that points at one of its own
versions (``out/ds/prod -> <v>``: a team pinning the version it trains on) keeps that version,
beyond the ``keep`` newest and never counted among them: removing it would leave the link dangling.

Which bytes: removing a version removes its directory entries. With hard-linked shards, a file
is freed only when its last link goes, so the plan counts, by inode, the files whose every link
(``st_nlink``) is in the removed versions: those are freed; the others are kept because a kept
version, a folder gc leaves alone (a broken version's, say) or a link outside the dataset
folder still links them, each counted as such. With
copies there is nothing else to think of: each version's files are its own.

How: each version folder is first renamed to ``.trash-<version>-<random>`` in the same folder
(one atomic rename: from then on the version is gone, never half there), its manifest is
deleted, then the rest. A gc interrupted mid-way leaves a ``.trash-*`` folder, which is no
version (no manifest) and which the next gc removes first.

What it cannot know: whether a reader (a training job) is using a version right now. A reader
that has a shard open keeps reading it (the file lives until it is closed), but one that opens
a shard of a removed version fails. And the build cache: its pointers into a removed version
(``.packed.json``) no longer resolve, so the next build decodes those files again (the build
says so); the bytes it writes are the same.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.errors import ConfigError, FileSystemError
from packer.files import folder_lock, folder_locks_work, human_bytes
from packer.manifest import MANIFEST_FILE
from packer.versions import (
    TRASH_PREFIX,
    VersionUsage,
    check_local_dataset_folder,
    list_versions,
    remove_staging,
    stale_staging,
    stale_temporaries,
    stale_version_temporaries,
)


@dataclass(frozen=True)
class GcPlan:
    """What ``packer gc`` removes and keeps, computed before anything is removed.

    ``freed_bytes``: the files whose every link is in ``remove`` (and in ``trash``); they go.
    ``shared_bytes``: files of the removed versions (and staging folders) a kept version still
    links: kept. ``left_alone_bytes``: files of the removed versions no kept version links but a
    folder gc leaves alone does (a version whose manifest cannot be read, a folder that is no
    version, an unguarded staging folder; named in ``left_alone_holders``): kept too.
    ``elsewhere_bytes``: files of the removed versions with links outside the dataset folder
    only: kept too. ``broken``: version folders whose manifest cannot be read, left alone.
    ``trash``: ``.trash-*`` folders an interrupted gc left, removed first. ``incomplete``:
    version folders a build stopped while publishing (no manifest), removed next. ``staging``:
    ``.staging-*`` folders interrupted builds left, removed last, with ``temporaries``: the
    ``*.partial`` files of the dataset folder (:func:`packer.versions.stale_temporaries`: a killed
    build's shared-folder probe). ``linked``: entries that are
    symbolic links to folders (each with what it points to), left alone. ``unguarded_staging``:
    ``.staging-*`` folders on a file system without directory locks, left alone (a running
    build's looks the same as an interrupted one's there), and ``unguarded_temporaries``, the
    ``*.partial`` files there, for the same reason. ``unreadable``: folders this user may
    not look into (each with why: :func:`packer.versions.unreadable_folder`), left alone and never
    counted (a colleague's version of mode 700: only its owner can tell what it is). ``keep_newest``:
    the ``keep`` the plan was made for (:func:`run_gc` makes it again under the build lock).
    ``pinned``: the versions kept only because links of the dataset folder point at them (each
    with those links): beyond the ``keep`` newest, not counted among them.
    """

    root: Path
    keep: tuple[VersionUsage, ...]
    remove: tuple[VersionUsage, ...]
    broken: tuple[VersionUsage, ...]
    staging: tuple[str, ...]
    trash: tuple[str, ...]
    freed_bytes: int
    shared_bytes: int
    elsewhere_bytes: int
    incomplete: tuple[str, ...] = ()
    linked: tuple[tuple[str, str], ...] = ()
    unguarded_staging: tuple[str, ...] = ()
    keep_newest: int = 1
    unreadable: tuple[tuple[str, str], ...] = ()
    left_alone_bytes: int = 0
    left_alone_holders: tuple[str, ...] = ()
    temporaries: tuple[str, ...] = ()
    unguarded_temporaries: tuple[str, ...] = ()
    pinned: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"folder": str(self.root), "keep": [v.to_json() for v in self.keep],
                "remove": [v.to_json() for v in self.remove], "broken": [v.to_json() for v in self.broken],
                "staging": list(self.staging), "trash": list(self.trash),
                "incomplete": list(self.incomplete),
                "linked": [{"folder": name, "target": target} for name, target in self.linked],
                "unguarded_staging": list(self.unguarded_staging), "temporaries": list(self.temporaries),
                "unguarded_temporaries": list(self.unguarded_temporaries),
                "unreadable": [{"folder": name, "problem": problem} for name, problem in self.unreadable],
                "freed_bytes": self.freed_bytes,
                "shared_bytes": self.shared_bytes, "elsewhere_bytes": self.elsewhere_bytes,
                "left_alone_bytes": self.left_alone_bytes, "left_alone_holders": list(self.left_alone_holders),
                "pinned": [{"folder": name, "links": list(links)} for name, links in self.pinned]}



def plan_gc(folder: str | Path, *, keep: int, lock_held: bool = False) -> GcPlan:
    """The plan to keep the ``keep`` newest versions of the dataset folder ``folder``
    (``<output>/<name>/``) and remove the others. Changes nothing. ``lock_held``: this process
    holds the dataset folder's lock (:func:`run_gc`), so a version without its manifest is a
    stopped build's, never one a running build is publishing (which is left alone otherwise).

    Raises ConfigError when ``keep`` is below 1 (gc never removes every version: delete the
    folder for that) or ``folder`` is not a local dataset folder (a URL, a version folder, an
    output folder holding several datasets).
    """
    if keep >= 1:
        check_local_dataset_folder(folder, command="gc")
    else:  # the folder is checked first: the fix below deletes it, which a typo'd path must never be told
        try:
            check_local_dataset_folder(folder, command="gc")
        except ConfigError as err:
            raise ConfigError(f"--keep {keep}: gc keeps at least the newest version (--keep 1); and {err}") from err
        raise ConfigError(f"--keep {keep}: gc keeps at least the newest version (--keep 1); to remove every "
                          f"version, delete the dataset folder {folder} itself")
    listing = list_versions(folder)
    # a link's folder belongs to whoever made it: never counted, never removed, never followed
    linked = tuple((o.folder, o.target or "") for o in listing.others if o.kind == "link")
    readable = [v for v in listing.versions if v.problem is None]  # newest first
    good = [v for v in readable if v.failed is None]
    kept_good = good[:keep]
    # a failed build's version (exit 3) never counts toward --keep; the ones newer than every kept
    # version stay (the latest attempts, for their reports), older ones go with the old versions
    newest_kept = (kept_good[0].created_at, kept_good[0].version) if kept_good else ("", "")
    kept_anyway = [v for v in readable if v in kept_good or (v.failed is not None
                                                              and (v.created_at, v.version) > newest_kept)]
    # a version a link of the dataset folder points at (prod -> <v>, a pinned training version) stays too,
    # not counted: removing it would leave the link dangling
    pins = _pins(listing.root, [name for name, _ in linked])
    pinned = tuple((v.folder, pins[v.folder]) for v in readable if v.folder in pins and v not in kept_anyway)
    kept = tuple(v for v in readable if v in kept_anyway or v.folder in pins)
    removed = tuple(v for v in readable if v not in kept)
    trash = tuple(o.folder for o in listing.others if o.kind == "trash")
    stopped = ("incomplete", "publishing") if lock_held else ("incomplete",)  # the lock taken looks like a build's
    incomplete = tuple(o.folder for o in listing.others if o.kind in stopped)
    staging = tuple(o.folder for o in listing.others if o.kind == "staging")
    # in a version folder: only one whose writer is gone (`packer report` writes there without the lock), and
    # not in a version removed anyway
    stale_in_versions = {p.relative_to(listing.root).as_posix()
                         for p in stale_version_temporaries(listing.root, lock_held=True)}
    gone_versions = {v.folder for v in removed}
    temporaries = tuple(o.folder for o in listing.others if o.kind == "temporary"
                        and ("/" not in o.folder or o.folder in stale_in_versions
                             and o.folder.split("/")[0] not in gone_versions))
    guarded = not (staging or temporaries) or folder_locks_work(listing.root)
    # no lock to hold: a running build's staging folder and temporaries look the same as an interrupted one's
    unguarded, unguarded_temporaries = ((), ()) if guarded else (staging, temporaries)
    staging, temporaries = (staging, temporaries) if guarded else ((), ())
    gone = {v.folder for v in removed} | set(trash) | set(incomplete) | set(staging)
    kept_folders = {v.folder for v in kept}
    freed = shared = elsewhere = left_alone = 0
    holders: set[str] = set()
    for links in listing.files.values():
        if not links.owners & gone:
            continue
        if links.owners <= gone and not links.linked_elsewhere:
            freed += links.size
        elif links.owners <= gone:
            elsewhere += links.size
        elif links.owners & kept_folders:
            shared += links.size
        else:  # linked by a folder gc leaves alone (a broken version, a folder not a version), no kept one
            left_alone += links.size
            holders |= links.owners - gone
    return GcPlan(root=listing.root, keep=kept, remove=removed,
                  broken=tuple(v for v in listing.versions if v.problem is not None),
                  staging=staging, trash=trash, freed_bytes=freed, shared_bytes=shared, elsewhere_bytes=elsewhere,
                  left_alone_bytes=left_alone, left_alone_holders=tuple(sorted(holders)), temporaries=temporaries,
                  unguarded_temporaries=unguarded_temporaries,
                  incomplete=incomplete, linked=linked, unguarded_staging=unguarded, keep_newest=keep,
                  unreadable=tuple((o.folder, o.problem or "") for o in listing.others if o.kind == "unreadable"),
                  pinned=pinned)


def _pins(root: Path, links: list[str]) -> dict[str, tuple[str, ...]]:
    """The folders of ``root`` that its entries ``links`` (symbolic links to folders) point at,
    directly or through further links, or into: each with the links naming it. A link that
    leads out of ``root``, or nowhere, pins nothing."""
    real = root.resolve()
    pins: dict[str, list[str]] = {}
    for name in links:
        try:
            parts = (root / name).resolve(strict=True).relative_to(real).parts
        except (OSError, RuntimeError, ValueError):  # dangling, a loop, or outside the dataset folder
            continue
        if parts:
            pins.setdefault(parts[0], []).append(name)
    return {folder: tuple(names) for folder, names in pins.items()}


def run_gc(plan: GcPlan, *, on_removed: Callable[[str], None] | None = None) -> GcPlan:
    """Carry out ``plan`` as it stands once the build lock is held, and return what was carried
    out: the plan is made again (:func:`plan_gc`, ``plan.keep_newest`` versions kept) under the
    lock. ``plan`` was made without it, so a build may have published a version since: its folder
    listed as incomplete (moved in, its manifest not yet written) is a complete version now, and
    the newest; removing what ``plan`` named would delete it and keep an older one. Then: finish
    the leftover ``.trash-*`` folders, remove the incomplete versions, then each version to
    remove, oldest first (each renamed to ``.trash-*`` first, its manifest deleted next, then the
    rest), then the ``.staging-*`` folders interrupted builds left.

    A version folder that is already gone is skipped. Raises OSError (the CLI maps a full or
    read-only file system to exit 6) when a folder cannot be renamed or removed; what was
    removed before stays removed, and a rerun finishes the rest. Raises ConfigError, removing
    nothing, while a ``packer build`` of the dataset runs (it holds the folder's lock and links
    shards and reads samples from the versions gc would remove); gc holds that lock while it
    plans and removes, so a build started meanwhile is refused rather than racing it.
    """
    with _build_lock(plan.root) as held:
        current = plan_gc(plan.root, keep=plan.keep_newest, lock_held=held)
        _remove(current, on_removed)
        _remove_staging(current, on_removed)
        _remove_temporaries(current, on_removed)
    return current


def _build_lock(root: Path) -> contextlib.AbstractContextManager[bool]:
    """The exclusive ``flock`` a running build holds on the dataset folder ``root``
    (:func:`packer.pipeline.build._one_build_at_a_time`); ConfigError when a build holds it.
    A file system without directory locks runs unguarded, as a build there does."""
    return folder_lock(root, f"{root}: a `packer build` of this dataset, or another `packer gc` of it, is running "
                             "(it holds the folder's lock; a build links shards and reads samples from its "
                             "versions); run gc once it has ended (nothing was removed)")


def _remove_staging(plan: GcPlan, on_removed: Callable[[str], None] | None) -> None:
    """Remove the plan's ``.staging-*`` folders (:func:`packer.versions.remove_staging`: only what
    lies under each, a link never followed). Called under the build lock, so no build writes them."""
    for path in stale_staging(plan.root):
        if path.name in plan.staging:
            with _refused(path):
                remove_staging(path)
            if on_removed is not None:
                on_removed(path.name)


def _remove_temporaries(plan: GcPlan, on_removed: Callable[[str], None] | None) -> None:
    """Remove the plan's ``*.partial`` files of the dataset folder and of its version folders
    whose writer is gone (a link never: only regular files are listed). Called under the build
    lock, so no build writes them."""
    for path in [*stale_temporaries(plan.root), *stale_version_temporaries(plan.root, lock_held=True)]:
        name = path.relative_to(plan.root).as_posix()
        if name in plan.temporaries:
            with _refused(path):
                path.unlink(missing_ok=True)
            if on_removed is not None:
                on_removed(name)


def _remove(plan: GcPlan, on_removed: Callable[[str], None] | None) -> None:
    for name in plan.trash:
        _refuse_link(plan.root / name)
        with _refused(plan.root / name):
            _remove_tree(plan.root / name)
        if on_removed is not None:
            on_removed(name)
    # oldest first: an interrupted gc leaves the newer ones
    for folder in (*plan.incomplete, *(version.folder for version in reversed(plan.remove))):
        path = plan.root / folder
        if not path.is_dir():
            continue
        _refuse_link(path)  # made a link since the plan: renaming it would carry the link into .trash-*
        trash = plan.root / f"{TRASH_PREFIX}{folder}-{secrets.token_hex(4)}"
        with _refused(path):
            os.rename(path, trash)  # atomic: from here on the folder is no version
        with _refused(trash):
            (trash / MANIFEST_FILE).unlink(missing_ok=True)
            _remove_tree(trash)
        if on_removed is not None:
            on_removed(folder)


def _refuse_link(path: Path) -> None:
    """FileSystemError (exit 6) where ``path`` is a symbolic link: gc deletes nothing through one."""
    if path.is_symlink():
        raise FileSystemError(f"cannot remove {path}: it is a symbolic link to {os.readlink(path)}, not a folder "
                              "a build of this dataset wrote; gc never removes through a link (remove the link "
                              "itself with rm if it is no longer wanted), then run packer gc again")


@contextlib.contextmanager
def _refused(path: Path) -> Iterator[None]:
    """A removal the file system refuses (read-only, an immutable file, no permission) as the
    FileSystemError (exit 6) naming what could not be removed and how to finish: what was removed
    stays removed, and a folder already renamed to ``.trash-*`` is no version any more."""
    try:
        yield
    except OSError as err:
        where = err.filename or path
        moved = path.name.startswith(TRASH_PREFIX)
        raise FileSystemError(
            f"cannot remove {where}: {err.strerror or err}; make it removable (a read-only mount: remount it "
            "read-write; an immutable file: chattr -i; no permission: run as the folders' owner), then run packer "
            "gc again to finish" + (f" ({path.name} is no version any more: the rerun removes it)" if moved else
                                    " (nothing of that version was removed)")) from err


def _remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it, read-only folders included (shards and version
    folders may be made read-only so that no write reaches them through a link)."""
    def make_writable(function: Any, failed: str, info: Any) -> None:
        err = info if isinstance(info, BaseException) else info[1]
        if not isinstance(err, PermissionError) or function is os.path.islink:
            raise err  # a link rmtree will not follow, a file that is gone: not a permission to fix
        parent = os.path.dirname(failed)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        function(failed)

    if path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=make_writable)
        else:
            shutil.rmtree(path, onerror=make_writable)


def format_gc(plan: GcPlan, *, dry_run: bool) -> str:
    """What ``packer gc`` prints: the plan (``dry_run``) or what it did."""
    verb = "would remove" if dry_run else "removed"
    pinned = dict(plan.pinned)
    counted = sum(v.failed is None and v.folder not in pinned for v in plan.keep)
    lines = [f"gc {plan.root}: keeping the {counted} newest version(s) by the manifest's created_at, "
             f"{verb} {len(plan.remove)}" + ("; a failed build's version (bad samples over the limit, exit 3) "
                                            "never counts as one" if any(v.failed for v in (*plan.keep, *plan.remove))
                                            else "")]
    for v in plan.keep:
        lines.append(f"  keep    {v.folder:<14}{v.created_at:<22}{human_bytes(v.bytes):>12}"
                     + ("  (a failed build, newer than every kept version: kept for its report, not counted)"
                        if v.failed and v.folder not in pinned else "")
                     + (f"  (kept: the link{'s' if len(pinned[v.folder]) > 1 else ''} "
                        f"{', '.join(pinned[v.folder])} point{'' if len(pinned[v.folder]) > 1 else 's'} at it; "
                        "not counted)" if v.folder in pinned else ""))
    for v in plan.remove:
        lines.append(f"  {'remove' if dry_run else 'removed':<8}{v.folder:<14}{v.created_at:<22}"
                     f"{human_bytes(v.bytes):>12}" + ("  (a failed build)" if v.failed else ""))
    for name in plan.trash:
        lines.append(f"  {'remove' if dry_run else 'removed':<8}{name}  (left by an interrupted gc)")
    for name in plan.incomplete:
        lines.append(f"  {'remove' if dry_run else 'removed':<8}{name}  (a version whose build stopped while "
                     "publishing it: no manifest.json, not a dataset)")
    lines.append(f"  {'frees' if dry_run else 'freed'} {human_bytes(plan.freed_bytes)}; kept because a kept version "
                 f"still links them: {human_bytes(plan.shared_bytes)}"
                 + (f"; kept because {', '.join(plan.left_alone_holders)}, which gc leaves alone, still "
                    f"link{'s' if len(plan.left_alone_holders) == 1 else ''} them: "
                    f"{human_bytes(plan.left_alone_bytes)}" if plan.left_alone_bytes else "")
                 + (f"; kept because linked outside {plan.root}: {human_bytes(plan.elsewhere_bytes)}"
                    if plan.elsewhere_bytes else ""))
    for v in plan.broken:
        lines.append(f"  left alone: {v.folder} (its manifest cannot be read: {v.problem})")
    for name, target in plan.linked:
        lines.append(f"  left alone: {name} (a symbolic link to {target}, not a folder a build of this dataset "
                     "wrote: gc never removes through a link; remove the link itself with rm if it is no longer "
                     "wanted)")
    for name, problem in plan.unreadable:
        lines.append(f"  left alone: {name} (this user may not look into it: {problem}; not counted as a version, "
                     "so the versions kept are the newest readable ones; its owner can make it readable, "
                     "chmod -R g+rX for a group, or remove it)")
    for name in plan.unguarded_staging:
        lines.append(f"  left alone: {name} (a staging folder; this file system takes no directory locks, so a "
                     "running build's cannot be told from an interrupted one's: remove it by hand once no build runs)")
    for name in plan.unguarded_temporaries:
        lines.append(f"  left alone: {name} (a build's temporary file; this file system takes no directory locks, "
                     "so a running build's cannot be told from an interrupted one's: remove it by hand once no build "
                     "runs)")
    for name in plan.staging:
        lines.append(f"  {'remove' if dry_run else 'removed':<8}{name}  (a staging folder an interrupted build "
                     "left; while a build runs, gc refuses and removes nothing)")
    for name in plan.temporaries:
        lines.append(f"  {'remove' if dry_run else 'removed':<8}{name}  (a temporary file an interrupted build "
                     "left: its shared-folder probe, or a table, report or manifest half written; while a build runs, "
                     "gc refuses and removes nothing)")
    if dry_run:
        lines.append("  dry run: nothing removed (run without --dry-run to remove)")
    return "\n".join(lines)
