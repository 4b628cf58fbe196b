"""Folders several people or processes use at once: a dataset folder `packer gc` plans over while
a build publishes into it, a colleague's version folder this user may not read, a build cache
two users' builds share, a shard cache a lab group shares, a registry this user may not write.

Real demo builds and real files throughout. Where a test needs "another user" it makes the
kernel's answer for one: the suite may run as root, for whom chmod changes nothing, so a folder
without permission is made to fail os.scandir and os.stat with EACCES (as in test_discover), and
a file owned by someone else to fail os.utime with EPERM.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from packer.cli import main
from packer.config import load_job
from packer.gc import plan_gc, run_gc
from packer.pipeline.build import BuildOptions, build
from packer.verify import verify_dataset
from tests.helpers import demo_job_doc, write_job


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@dataclass(frozen=True)
class TwoVersions:
    raw: Path
    out: Path    # <out>/demo/<older>/ and <out>/demo/<newer>/
    older: str
    newer: str


@pytest.fixture(scope="module")
def two_versions(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> TwoVersions:
    tmp = tmp_path_factory.mktemp("shared")
    raw = Path(shutil.copytree(demo_raw.root, tmp / "raw"))

    def run(**overrides: Any) -> str:
        job = load_job(write_job(tmp / "job", demo_job_doc(raw, tmp / "out", **overrides)))
        return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir.name

    older = run()
    newer = run(validate={"max_bad_fraction": 0.2})
    return TwoVersions(raw=raw, out=tmp / "out", older=older, newer=newer)


def dataset_copy(versions: TwoVersions, tmp_path: Path) -> Path:
    """A copy of the dataset folder, ``created_at`` set so that ``newer`` is the newer (outside
    the dataset hash: the manifests still check out)."""
    root = Path(shutil.copytree(versions.out / "demo", tmp_path / "out" / "demo"))
    for version, when in ((versions.older, "2024-01-01T00:00:00Z"), (versions.newer, "2024-02-01T00:00:00Z")):
        path = root / version / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["created_at"] = when
        path.write_text(json.dumps(manifest))
    return root


def deny(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """Make ``locked`` behave as another user's folder of mode 700 does for this one: listing it
    and looking at anything under it fail with EACCES; the folder itself can be stat'ed."""
    real_scandir, real_stat = os.scandir, os.stat
    under = str(locked)

    def scandir(path: Any = ".") -> Any:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if text == under or text.startswith(under + os.sep):
            raise PermissionError(errno.EACCES, "Permission denied", text)
        return real_scandir(path)

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else ""
        if text.startswith(under + os.sep):
            raise PermissionError(errno.EACCES, "Permission denied", text)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)


# -- packer gc while a build publishes ---------------------------------------------------------------


def test_gc_plans_again_under_the_lock_and_keeps_a_version_a_build_published_meanwhile(
        two_versions: TwoVersions, tmp_path: Path) -> None:
    """gc made its plan without the build lock and carried it out under the lock unchanged: a
    plan made while a build was publishing (its version folder moved in, manifest.json not yet
    written: "incomplete") deleted that version after the build had completed it, the newest
    version, and kept the older one."""
    root = dataset_copy(two_versions, tmp_path)
    manifest = root / two_versions.newer / "manifest.json"
    written = manifest.read_bytes()
    manifest.unlink()  # the build has renamed its staging folder into place; the manifest comes next
    stale = plan_gc(root, keep=1)
    assert stale.incomplete == (two_versions.newer,)
    assert [v.folder for v in stale.keep] == [two_versions.older]

    manifest.write_bytes(written)  # the build writes its manifest and lets go of the lock
    done = run_gc(stale)
    assert sorted(p.name for p in root.iterdir()) == [two_versions.newer]
    assert verify_dataset(root / two_versions.newer).ok
    assert [v.folder for v in done.keep] == [two_versions.newer]
    assert [v.folder for v in done.remove] == [two_versions.older] and done.incomplete == ()


# -- a version folder this user may not read --------------------------------------------------------


def test_ls_and_gc_name_a_version_folder_this_user_may_not_read_and_leave_it_alone(
        two_versions: TwoVersions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A colleague's version folder of mode 700 in a shared dataset folder: `packer ls` and
    `packer gc --dry-run` died with an internal error (exit 1, PermissionError) instead of
    listing the readable versions and naming that one."""
    root = dataset_copy(two_versions, tmp_path)
    private = root / two_versions.older
    deny(monkeypatch, private)

    listed = invoke("ls", root)
    assert listed.exit_code == 0, listed.output
    assert "1 version," in listed.output and f"  {two_versions.newer}  " in listed.output
    assert (f"also {two_versions.older}: UNREADABLE: this user may not look into it (Permission denied)"
            in listed.output)
    (other,) = json.loads(invoke("ls", root, "--json").output)["others"]
    assert other == {"folder": two_versions.older, "kind": "unreadable", "bytes": 0, "problem": "Permission denied"}

    for args in (("--dry-run",), ()):
        gc = invoke("gc", root, "--keep", "1", *args)
        assert gc.exit_code == 0, gc.output
        assert f"keep    {two_versions.newer}" in gc.output
        assert f"left alone: {two_versions.older} (this user may not look into it: Permission denied" in gc.output
        assert f"remove {two_versions.older}" not in gc.output and f"removed {two_versions.older}" not in gc.output
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == sorted([two_versions.older, two_versions.newer])
    assert verify_dataset(private).ok and verify_dataset(root / two_versions.newer).ok


def test_a_build_beside_a_version_folder_this_user_may_not_read_builds_without_reusing_from_it(
        two_versions: TwoVersions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group member building a new version into the shared dataset folder died while looking
    for shards to reuse in the earlier versions (PermissionError on the private one's manifest)."""
    root = dataset_copy(two_versions, tmp_path)
    shutil.rmtree(root / two_versions.newer)
    deny(monkeypatch, root / two_versions.older)
    doc = demo_job_doc(two_versions.raw, tmp_path / "out", validate={"max_bad_fraction": 0.2})
    result = build(load_job(write_job(tmp_path / "job", doc)),
                   BuildOptions(scheduler="sync", quiet=True, html_report=False))
    assert result.version_dir.name == two_versions.newer
    assert result.shards_reused == 0 and result.shards_written > 0
    monkeypatch.undo()
    assert verify_dataset(result.version_dir).ok


# -- one build cache, two work folders --------------------------------------------------------------


def test_a_build_is_refused_while_another_holds_its_build_cache_folder(
        two_versions: TwoVersions, tmp_path: Path) -> None:
    """Two people building one job into one URL, sharing --cache-dir but each with their own work
    folder, each hold the dataset folder's lock in their own work folder: nothing guarded the
    build cache folder they share, each deleted the other's temporaries and one died with an
    internal error (FileNotFoundError). The cache folder's own lock refuses the second (exit 2),
    before anything is decoded; once the first has ended the build runs."""
    import fcntl

    from packer.storage import build_cache_dir

    out, shared = tmp_path / "out", tmp_path / "shared-cache"
    job = write_job(tmp_path / "job", demo_job_doc(two_versions.raw, out))
    cache = build_cache_dir("demo", str(out), shared)
    cache.mkdir(parents=True)
    fd = os.open(cache, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what the other user's running build holds
        refused = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report", "-q",
                                            "--cache-dir", str(shared)])
        assert refused.exit_code == 2, refused.output
        assert f"{cache}: another `packer build` of demo into the same output is running with this build cache" \
            in refused.output
        assert list(cache.iterdir()) == [] and not (out / "demo").exists()
    finally:
        os.close(fd)
    done = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report", "-q",
                                     "--cache-dir", str(shared)])
    assert done.exit_code == 0, done.output
    assert [p.name for p in (out / "demo").iterdir()] == [two_versions.older]
    assert verify_dataset(out / "demo" / two_versions.older).ok


# -- a shard cache a lab group shares ---------------------------------------------------------------


def _remote_shard(name: str, data: bytes) -> tuple[str, str, int]:
    import fsspec

    fsspec.filesystem("memory").pipe(f"/shared-folders/{name}", data)
    return f"memory://shared-folders/{name}", hashlib.sha256(data).hexdigest(), len(data)


def as_group_member(monkeypatch: pytest.MonkeyPatch, cache: Path, *, folder_writable: bool) -> None:
    """What the kernel tells a member of the group about a shard cache another member filled
    (entries mode 664, folder 775 under umask 002): setting a chosen access time needs ownership
    (os.utime with times: EPERM). ``folder_writable=False``: the cache was made read-only once
    filled (chmod -R a-w): every file opened for writing, made or removed in it is EACCES too."""
    import builtins

    from packer.loader import cache as cache_module

    real_utime, real_open, real_unlink = os.utime, builtins.open, Path.unlink
    inside = str(cache) + os.sep

    def utime(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(inside) and (args or kwargs.get("ns") or kwargs.get("times")):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_utime(path, *args, **kwargs)

    def open_(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not folder_writable and str(path).startswith(inside) and any(c in mode for c in "wax+"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if not folder_writable and str(self).startswith(inside):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "utime", utime)
    monkeypatch.setattr(cache_module, "open", open_, raising=False)
    monkeypatch.setattr(Path, "unlink", unlink)


def test_a_group_member_reads_an_entry_another_member_downloaded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache hit marked the entry recently used with os.utime(path, ns=...), which only the
    file's owner may do: every member of the group but the one who downloaded an entry got EPERM,
    and ShardDataset called the whole shard unreadable."""
    from packer.loader.cache import ShardCache

    data = b"g" * 6000
    url, sha, size = _remote_shard("group.tar", data)
    cache = tmp_path / "shared-cache"
    ShardCache(cache).fetch(url, sha, size, "group.tar")  # the member who downloaded it
    as_group_member(monkeypatch, cache, folder_writable=True)
    with ShardCache(cache).reading(url, sha, size, "group.tar") as path:
        assert path.read_bytes() == data


def on_nfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What NFS tells ``flock``: Linux emulates it there with byte-range locks, and an exclusive
    one on a file open read-only fails with EBADF (flock(2): "the file must be opened for writing")."""
    import fcntl
    import types

    from packer.loader import cache as cache_module

    def flock(handle: Any, operation: int) -> None:
        fd = handle if isinstance(handle, int) else handle.fileno()
        if operation & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        fcntl.flock(handle, operation)

    shim = types.SimpleNamespace(**{name: getattr(fcntl, name) for name in dir(fcntl) if not name.startswith("__")})
    shim.flock = flock
    monkeypatch.setattr(cache_module, "fcntl", shim)


def test_a_cache_on_nfs_downloads_again_and_evicts_through_lock_files_it_opens_for_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening every existing lock file read-only (for a group's or a read-only cache) broke the
    exclusive locks of a download and of an eviction on NFS, where a lab's shared cache lives."""
    from packer.loader.cache import ShardCache

    on_nfs(monkeypatch)
    shards = [(*_remote_shard(f"nfs-{n}.tar", bytes([n]) * 4000), f"nfs-{n}.tar") for n in range(3)]
    cache = tmp_path / "nfs-cache"
    url, sha, size, file = shards[0]
    ShardCache(cache).fetch(url, sha, size, file)
    ShardCache(cache).invalidate(sha, file)  # a sample failed its checksum: downloaded again
    assert ShardCache(cache).fetch(url, sha, size, file).read_bytes() == bytes([0]) * 4000
    for shard in shards:
        ShardCache(cache).fetch(*shard)
    with ShardCache(cache, limit=5000).reading(*shards[0]) as path:  # room for one: the others evicted
        assert path.read_bytes() == bytes([0]) * 4000
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [f"{sha}.tar"]


def test_a_read_only_cache_serves_its_entries_and_names_the_folder_for_a_missing_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fully populated cache made read-only (chmod -R a-w) failed every read: the entry's lock
    file was opened "a+b" only to take a shared lock, which needs no write access. Its entries
    are read; a shard it does not hold fails saying the folder cannot be written and what to do;
    over its limit it stays over, with a warning, instead of failing the read."""
    from packer.loader.cache import ShardCache

    held, missing = b"r" * 5000, b"m" * 3000
    url, sha, size = _remote_shard("held.tar", held)
    other_url, other_sha, other_size = _remote_shard("missing.tar", missing)
    extra_url, extra_sha, extra_size = _remote_shard("extra.tar", b"e" * 4000)
    cache = tmp_path / "read-only-cache"
    ShardCache(cache).fetch(url, sha, size, "held.tar")
    ShardCache(cache).fetch(extra_url, extra_sha, extra_size, "extra.tar")
    as_group_member(monkeypatch, cache, folder_writable=False)

    with ShardCache(cache).reading(url, sha, size, "held.tar") as path:
        assert path.read_bytes() == held
    with pytest.raises(OSError, match=f"the shard cache folder {cache} cannot be written by this user") as err, \
            ShardCache(cache).reading(other_url, other_sha, other_size, "missing.tar"):
        pass
    assert "make the folder writable" in str(err.value) and "cache_dir of your own" in str(err.value)
    with pytest.warns(UserWarning, match=f"the shard cache {cache} holds more than its cache_limit"), \
            ShardCache(cache, limit=1000).reading(url, sha, size, "held.tar") as path:
        assert path.read_bytes() == held
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted(
        [f"{sha}.tar", f"{extra_sha}.tar"])


# -- a registry this user may not write -------------------------------------------------------------


def test_a_registry_this_user_may_not_write_is_named_with_its_fix_and_the_version_as_published(
        two_versions: TwoVersions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose `registry:` folder this user may not write (the lab's committed manifests/):
    the version was published whole, then the build said "choose another output folder (--out
    DIR)", which moves no registry, and that decoded files "stay in the build cache", as if the
    dataset were not built. The message names the registry, its fix, and the published version."""
    import builtins

    from packer import files

    registry = tmp_path / "manifests"
    (registry / "demo").mkdir(parents=True)
    real_open = builtins.open

    def refused(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(registry) + os.sep) and "w" in mode:  # what chmod a-w makes of it
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", refused, raising=False)
    doc = {**demo_job_doc(two_versions.raw, tmp_path / "out"), "registry": str(registry)}
    job = write_job(tmp_path / "job", doc)
    result = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report", "-q"])
    assert result.exit_code == 6, result.output
    version = tmp_path / "out" / "demo" / two_versions.older
    assert verify_dataset(version).ok
    assert f"cannot write {registry / 'demo' / two_versions.older}.json" in result.output
    assert "change `registry:` in the job to a folder this user can write" in result.output
    assert f"The version {two_versions.older} itself is complete and published in {version}" in result.output
    assert f"Once the registry folder {registry} (the job's `registry:`) can be written" in result.output
    assert "--out DIR" not in result.output and "stay in the build cache" not in result.output

    monkeypatch.undo()
    again = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--no-report", "-q"])
    assert again.exit_code == 0, again.output
    assert json.loads((registry / "demo" / f"{two_versions.older}.json").read_text())["version"] == two_versions.older
