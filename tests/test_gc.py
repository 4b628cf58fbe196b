"""packer ls OUTPUT/NAME, packer diff's shard view and packer gc on real demo builds.

Versions share bytes as copies (the same shard sha256 in two version folders, two files) or as
hard links (one inode in two folders). Builds today write every shard anew, so the tests make
copies by building twice and links by linking a version's shards by hand (``os.link``), as an
incremental build does. Every expected number comes from ``os.stat`` and ``hashlib`` over the
folders, never from the code under test; ``packer verify`` checks each kept version after gc.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from packer.cli import main
from packer.commands.gc import gc_command
from packer.commands.inspect import diff_command, ls_command
from packer.config import load_job
from packer.demo import write_ct_slice, write_photo
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, build
from packer.verify import verify_dataset
from tests.helpers import demo_job_doc, write_job

CLI = click.Group(commands=[ls_command, diff_command, gc_command])


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(CLI, [str(a) for a in args])


@dataclass(frozen=True)
class Versions:
    out: Path        # <out>/demo/<version>/ for the three versions below
    base: str        # the demo tree as written
    relimited: str   # the same inputs with another max_bad_fraction: every shard the same bytes, new files
    grown: str       # + one CT patient and one photo subject, one photo's pixels replaced


@pytest.fixture(scope="module")
def versions(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> Versions:
    tmp = tmp_path_factory.mktemp("gc")
    raw = Path(shutil.copytree(demo_raw.root, tmp / "raw"))

    def run(**overrides: Any) -> str:
        job = load_job(write_job(tmp / "job", demo_job_doc(raw, tmp / "out", **overrides)))
        return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir.name

    base = run()
    relimited = run(validate={"max_bad_fraction": 0.2})
    rng = np.random.default_rng(7)
    write_ct_slice(raw / "ct" / "PAT0099" / "ST01" / "IM001.dcm", patient_id="PAT0099", study_date="20240301",
                   pixels_hu=rng.uniform(-1000, 1000, size=(64, 64)))
    with open(raw / "ct_labels.csv", "a", newline="") as fh:
        csv.writer(fh).writerow(["PAT0099/ST01/IM001.dcm", "nodule"])
    write_photo(raw / "photos" / "S099" / "01.png", rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8))
    with open(raw / "photos" / "labels.csv", "a", newline="") as fh:
        csv.writer(fh).writerow(["S099/01.png", "circle", "S099", "2024-03-01T10:00:00"])
    grown = run(validate={"max_bad_fraction": 0.2})
    return Versions(out=tmp / "out", base=base, relimited=relimited, grown=grown)


def dataset_copy(versions: Versions, tmp_path: Path, *, created: dict[str, str] | None = None) -> Path:
    """A copy of the dataset folder (files copied, no links), with ``created_at`` set per version
    (outside the dataset hash, so the manifests still check out)."""
    root = Path(shutil.copytree(versions.out / "demo", tmp_path / "out" / "demo"))
    for version, when in (created or {}).items():
        path = root / version / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["created_at"] = when
        path.write_text(json.dumps(manifest))
    return root


def shard_digests(version: Path) -> dict[str, str]:
    """Each shard file of a version folder by its sha256, hashed here."""
    return {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in sorted(version.glob("*.tar"))}


def link_same_shards(source: Path, target: Path) -> list[str]:
    """Replace each shard of ``target`` whose bytes equal a shard of ``source`` by a hard link to
    it, as an incremental build does; returns the linked file names (in ``target``)."""
    theirs = shard_digests(source)
    linked = []
    for digest, name in shard_digests(target).items():
        if digest in theirs:
            (target / name).unlink()
            os.link(source / theirs[digest], target / name)
            linked.append(name)
    return linked


def inodes(*folders: Path) -> dict[tuple[int, int], int]:
    """Every file's inode under ``folders`` with its size."""
    out = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                st = path.stat()
                out[(st.st_dev, st.st_ino)] = st.st_size
    return out


def snapshot(root: Path) -> list[tuple[str, int, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*"))


CREATED = {"base": "2024-01-01T00:00:00Z", "relimited": "2024-02-01T00:00:00Z", "grown": "2024-03-01T00:00:00Z"}


def created(versions: Versions, order: dict[str, str] = CREATED) -> dict[str, str]:
    return {getattr(versions, name): when for name, when in order.items()}


# -- ls ---------------------------------------------------------------------------------------------


def test_ls_of_a_dataset_folder_counts_shared_bytes_by_inode(versions: Versions, tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path, created=created(versions))
    base, relimited = root / versions.base, root / versions.relimited
    shard_bytes = sum(p.stat().st_size for p in base.glob("*.tar"))
    copies = json.loads(invoke("ls", root, "--json").stdout)
    assert [v["folder"] for v in copies["versions"]] == [versions.grown, versions.relimited, versions.base]
    assert copies["copied_bytes"] >= shard_bytes  # base's shards are stored again in relimited, as copies
    assert copies["linked_bytes"] == 0
    assert all(v["unique_bytes"] == v["bytes"] and v["shared_bytes"] == 0 for v in copies["versions"])

    linked = link_same_shards(base, relimited)
    assert sorted(linked) == sorted(p.name for p in base.glob("*.tar"))
    listing = json.loads(invoke("ls", root, "--json").stdout)
    every = inodes(*(root / v for v in (versions.base, versions.relimited, versions.grown)))
    by_folder = {v["folder"]: v for v in listing["versions"]}
    assert listing["disk_bytes"] == sum(every.values())
    assert listing["sum_bytes"] == sum(sum(inodes(root / v).values()) for v in by_folder)
    assert listing["linked_bytes"] == shard_bytes
    assert by_folder[versions.relimited]["shared_bytes"] == shard_bytes
    assert by_folder[versions.relimited]["unique_bytes"] == sum(p.stat().st_size for p in relimited.iterdir()
                                                                if p.suffix != ".tar")
    assert by_folder[versions.base]["shared_bytes"] == shard_bytes
    manifest = json.loads((relimited / "manifest.json").read_text())
    assert by_folder[versions.relimited]["samples"] == manifest["inputs"]["samples"]
    assert by_folder[versions.relimited]["shards"] == sum(len(s["shards"]) for s in manifest["splits"].values())

    text = invoke("ls", root)
    assert text.exit_code == 0, text.output
    assert "3 versions, newest first (by the manifest's created_at)" in text.output
    assert all(v in text.output for v in by_folder)


def test_ls_keeps_the_registry_form_and_names_what_is_not_a_version(versions: Versions, tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path)
    (root / ".staging-0123456789abcdef").mkdir()
    (root / ".staging-0123456789abcdef" / "train-000000.tar").write_bytes(b"x" * 10)
    result = invoke("ls", root)
    assert result.exit_code == 0, result.output
    assert ".staging-0123456789abcdef (10 B): a build in progress" in result.output
    output = invoke("ls", tmp_path / "out")  # an output folder: no registry, and a hint
    assert output.exit_code == 0 and "no manifests under" in output.output
    assert f"`packer ls {root}` lists the versions of demo" in output.output
    assert "output folder of 1 dataset(s) (demo)" in output.output
    shutil.copytree(root, tmp_path / "out" / "another", symlinks=True)  # an output folder of several datasets
    several = invoke("ls", tmp_path / "out")
    assert "output folder of 2 dataset(s) (another, demo)" in several.output  # each named, not only the first
    assert invoke("ls", tmp_path / "nowhere").exit_code == 2


def test_ls_of_a_dataset_whose_first_build_was_interrupted_lists_its_staging_folder(tmp_path: Path) -> None:
    """A first build killed before its version was published leaves only `.staging-*`: `packer ls
    OUTPUT/NAME` said "no manifests under" it (the registry form), hiding the staging bytes."""
    root = tmp_path / "out" / "demo"
    (root / ".staging-0123456789abcdef").mkdir(parents=True)
    (root / ".staging-0123456789abcdef" / "train-000000.tar").write_bytes(b"x" * 10)
    result = invoke("ls", root)
    assert result.exit_code == 0, result.output
    assert "0 versions" in result.output and "no manifests" not in result.output
    assert ".staging-0123456789abcdef (10 B): a build in progress" in result.output
    trash = tmp_path / "gc" / "demo" / ".trash-0123456789ab-x"  # gc finishes what an interrupted gc left
    trash.mkdir(parents=True)
    (trash / "train-000000.tar").write_bytes(b"y")
    result = invoke("gc", trash.parent, "--keep", "1")
    assert result.exit_code == 0, result.output
    assert not trash.exists()


def test_ls_of_a_version_folder_names_its_dataset_folder(versions: Versions, tmp_path: Path) -> None:
    """`packer ls OUTPUT/NAME/VERSION` said only "no manifests under" a folder holding manifest.json."""
    root = dataset_copy(versions, tmp_path)
    result = invoke("ls", root / versions.base)
    assert result.exit_code == 0, result.output
    assert f"it is a version folder: `packer ls {root}` lists the versions of its dataset" in result.output
    assert f"`packer inspect {root / versions.base}` shows this one" in result.output


def test_a_version_whose_build_stopped_while_publishing_is_listed_as_incomplete_and_gc_removes_it(
        versions: Versions, tmp_path: Path) -> None:
    """A build publishes by renaming its staging folder to the version and then writing the
    manifest; killed between the two (or out of disk at the manifest) it leaves a version folder
    of shards, index and reports without manifest.json. `packer ls` took a dataset folder holding
    only that for a registry and called its leakage.json a broken registry manifest (exit 5), and
    `packer gc` called it no dataset folder (exit 2)."""
    root = dataset_copy(versions, tmp_path)
    shutil.rmtree(root / versions.base)
    (root / versions.grown / "manifest.json").unlink()
    alone = Path(shutil.copytree(root / versions.grown, tmp_path / "alone" / "demo" / versions.grown))
    listed = invoke("ls", alone.parent)
    assert listed.exit_code == 0, listed.output
    assert "0 versions" in listed.output and "BROKEN" not in listed.output and "registry" not in listed.output
    assert (f"also {versions.grown} (" in listed.output
            and "INCOMPLETE: a version whose build stopped while publishing it" in listed.output
            and "Building the job again from the same inputs replaces it; `packer gc` removes it" in listed.output)
    (other,) = json.loads(invoke("ls", alone.parent, "--json").output)["others"]
    assert (other["folder"], other["kind"]) == (versions.grown, "incomplete")
    assert invoke("gc", alone.parent, "--keep", "1").exit_code == 0 and not alone.exists()

    # beside a complete version: never counted among the versions kept, and removed
    listed = invoke("ls", root)
    assert listed.exit_code == 0 and "1 version," in listed.output and f"also {versions.grown} (" in listed.output
    gc = invoke("gc", root, "--keep", "1")
    assert gc.exit_code == 0, gc.output
    assert f"keep    {versions.relimited}" in gc.output
    assert f"removed {versions.grown}  (a version whose build stopped while publishing it" in gc.output
    assert sorted(p.name for p in root.iterdir()) == [versions.relimited]
    assert verify_dataset(root / versions.relimited).ok


# -- diff ---------------------------------------------------------------------------------------------


def test_diff_lists_reused_new_and_removed_shards(versions: Versions, tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path)
    old, new = root / versions.relimited, root / versions.grown
    old_digests, new_digests = shard_digests(old), shard_digests(new)
    reused = {new_digests[d] for d in new_digests.keys() & old_digests.keys()}
    added = {new_digests[d] for d in new_digests.keys() - old_digests.keys()}
    removed = {old_digests[d] for d in old_digests.keys() - new_digests.keys()}
    assert reused and added, "one new patient and one new subject change some shards, not all"

    payload = json.loads(invoke("diff", old, new, "--json").stdout)["shards"]
    assert {c["file"] for c in payload["reused"]} == reused
    assert {c["file"] for c in payload["new"]} == added
    assert {c["file"] for c in payload["removed"]} == removed
    assert all(c["same_inode"] is False for c in payload["reused"])
    assert payload["counts"]["new"] == {"shards": len(added), "bytes": sum((new / f).stat().st_size for f in added)}
    assert payload["counts"]["copied"]["shards"] == len(reused)

    link_same_shards(old, new)
    payload = json.loads(invoke("diff", old, new, "--json").stdout)["shards"]
    assert all(c["same_inode"] is True for c in payload["reused"])
    assert payload["counts"]["linked"] == {"shards": len(reused),
                                           "bytes": sum((new / f).stat().st_size for f in reused)}
    text = invoke("diff", old, new).output
    assert (f"shards: {len(reused)} reused" in text and f"{len(reused)} hard-linked (stored once)" in text
            and f"{len(added)} new" in text and f"{len(removed)} removed" in text)
    assert all(f"new       {name}" in text for name in added)


# -- gc ---------------------------------------------------------------------------------------------


def test_gc_keeps_the_newest_by_created_at_and_frees_only_unshared_inodes(versions: Versions,
                                                                            tmp_path: Path) -> None:
    # created_at order differs from the folders' name order and from the build order
    order = {"relimited": "2024-01-01T00:00:00Z", "base": "2024-02-01T00:00:00Z", "grown": "2024-03-01T00:00:00Z"}
    root = dataset_copy(versions, tmp_path, created=created(versions, order))
    base, relimited, grown = (root / v for v in (versions.base, versions.relimited, versions.grown))
    link_same_shards(relimited, base)  # base's shards are relimited's inodes
    link_same_shards(relimited, grown)
    kept_inodes = inodes(base, grown)
    own = {inode: size for inode, size in inodes(relimited).items() if inode not in kept_inodes}
    shared = sum(size for inode, size in inodes(relimited).items() if inode in kept_inodes)

    result = invoke("gc", root, "--keep", "2", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [v["folder"] for v in plan["keep"]] == [versions.grown, versions.base]
    assert [v["folder"] for v in plan["remove"]] == [versions.relimited]
    assert plan["freed_bytes"] == sum(own.values()) and plan["shared_bytes"] == shared > 0
    assert not relimited.exists()
    assert sorted(p.name for p in root.iterdir()) == sorted([versions.base, versions.grown])
    assert inodes(base, grown) == kept_inodes  # every shard the kept versions link is still there
    for version in (base, grown):
        assert verify_dataset(version).ok

    text = invoke("gc", root, "--keep", "1")  # base's shards linked by grown stay; the rest goes
    assert text.exit_code == 0, text.output
    assert f"removed {versions.base}" in text.output
    assert sorted(p.name for p in root.iterdir()) == [versions.grown]
    assert verify_dataset(grown).ok
    assert all(os.stat(grown / name).st_nlink == 1 for name in os.listdir(grown))


def test_gc_dry_run_prints_the_plan_and_changes_nothing(versions: Versions, tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path, created=created(versions))
    link_same_shards(root / versions.base, root / versions.relimited)
    before = snapshot(root)
    old = inodes(root / versions.base, root / versions.relimited)
    kept = inodes(root / versions.grown)
    result = invoke("gc", root, "--keep", "1", "--dry-run")
    assert result.exit_code == 0, result.output
    assert snapshot(root) == before
    assert f"remove  {versions.base}" in result.output and f"remove  {versions.relimited}" in result.output
    assert f"keep    {versions.grown}" in result.output
    plan = json.loads(invoke("gc", root, "--keep", "1", "--dry-run", "--json").stdout)
    assert plan["dry_run"] is True and plan["freed_bytes"] == sum(old.values()) and plan["shared_bytes"] == 0
    assert not old.keys() & kept.keys()
    assert snapshot(root) == before


def test_gc_refuses_keep_0_urls_and_version_folders(versions: Versions, tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path)
    before = snapshot(root)
    raw = tmp_path / "my-raw-data"
    (raw / "scans").mkdir(parents=True)
    for args, says in (((root, "--keep", "0"), "to remove every version, delete the dataset folder"),
                       ((raw, "--keep", "0"), "not a dataset folder"),  # never told to delete a typo'd folder
                       (("s3://bucket/out/demo", "--keep", "1"), "local output folder only"),
                       ((root / versions.base, "--keep", "1"), "a version folder; pass the dataset folder"),
                       ((tmp_path / "out", "--keep", "1"), "pass one of them")):
        result = invoke("gc", *args)
        assert result.exit_code == 2 and says in result.output, result.output
        assert args[0] != raw or "delete" not in result.output, result.output
    assert snapshot(root) == before


def test_an_interrupted_gc_leaves_no_half_version_and_the_next_gc_finishes(versions: Versions, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root = dataset_copy(versions, tmp_path, created=created(versions))
    staging = root / ".staging-0123456789abcdef"
    staging.mkdir()
    (staging / "train-000000.tar").write_bytes(b"an interrupted build's shard")

    def remounted_read_only(path: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    with monkeypatch.context() as patch:  # the file system turns read-only once the first version is renamed
        patch.setattr(shutil, "rmtree", remounted_read_only)
        failed = invoke("gc", root, "--keep", "1")
    assert failed.exit_code == 6, failed.output
    assert "cannot remove " in failed.output and "then run packer gc again to finish" in failed.output
    assert "no version any more: the rerun removes it" in failed.output
    assert "--out" not in failed.output  # a build's fix (another output folder) is no fix for gc
    left = sorted(p.name for p in root.iterdir())
    trash = [name for name in left if name.startswith(".trash-")]
    assert len(trash) == 1 and trash[0].startswith(f".trash-{versions.base}-")  # the oldest goes first
    assert not (root / versions.base).exists() and not (root / trash[0] / "manifest.json").exists()
    assert (root / versions.relimited / "manifest.json").is_file()
    listing = json.loads(invoke("ls", root, "--json").stdout)
    assert {o["folder"]: o["kind"] for o in listing["others"]} == {trash[0]: "trash", staging.name: "staging"}

    result = invoke("gc", root, "--keep", "1")
    assert result.exit_code == 0, result.output
    # gc holds the build lock: no build writes the staging folder, an interrupted one left it
    assert sorted(p.name for p in root.iterdir()) == [versions.grown]


@pytest.mark.parametrize("code", [errno.EPERM, errno.EACCES, errno.EBUSY])
def test_a_version_folder_the_file_system_will_not_let_go_is_exit_6_naming_it(versions: Versions, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              code: int) -> None:
    """An immutable version folder (chattr +i) refuses its rename with EPERM: gc ended with an
    internal error and a traceback; now exit 6 names the folder and how to finish, and nothing
    of it was removed."""
    root = dataset_copy(versions, tmp_path, created=created(versions))
    real_rename = os.rename

    def refused(source: Any, target: Any) -> None:
        if Path(source).name == versions.base:
            raise OSError(code, os.strerror(code), str(source))
        real_rename(source, target)

    with monkeypatch.context() as patch:
        patch.setattr(os, "rename", refused)
        failed = invoke("gc", root, "--keep", "1")
    assert failed.exit_code == 6, failed.output
    assert f"cannot remove {root / versions.base}: {os.strerror(code)}" in failed.output
    assert "(nothing of that version was removed)" in failed.output and "Traceback" not in failed.output
    assert (root / versions.base / "manifest.json").is_file()
    assert invoke("gc", root, "--keep", "1").exit_code == 0


def test_a_build_after_gc_removed_the_version_its_cache_points_to_decodes_again(demo_raw: Any,
                                                                                 tmp_path: Path) -> None:
    """The build cache reads reused samples back from the last version's shards; once gc removed
    that version, the next build decodes those files again and writes the same dataset."""
    raw = Path(shutil.copytree(demo_raw.root, tmp_path / "raw"))

    def run(seed: int) -> Any:
        doc = demo_job_doc(raw, tmp_path / "out")
        doc["split"] = dict(doc["split"], seed=seed)
        return build(load_job(write_job(tmp_path / "job", doc)),
                     BuildOptions(scheduler="sync", quiet=True, html_report=False))

    first = run(17)
    second = run(18)  # every file reused from the cache, read back from first's shards; the cache now points here
    assert second.files_decoded == 0
    manifest = json.loads(second.manifest_path.read_text())
    manifest["created_at"] = "2000-01-01T00:00:00Z"  # older than first, so gc --keep 1 removes it
    second.manifest_path.write_text(json.dumps(manifest))
    assert invoke("gc", tmp_path / "out" / "demo", "--keep", "1").exit_code == 0
    assert not second.version_dir.exists() and first.version_dir.is_dir()

    again = run(18)
    # every file whose samples were in the removed version decodes again; a bad file's record,
    # which no shard holds, is still copied from the cache
    splits = pq.read_table(first.version_dir / "_splits.parquet", columns=["sample_id"])
    with_samples = set(splits.column(0).to_pylist())
    assert again.files_decoded == len(with_samples) > 0
    assert again.manifest["dataset_hash"] == second.manifest["dataset_hash"]
    assert verify_dataset(again.version_dir).ok


def test_a_version_whose_manifest_fails_is_listed_as_broken_and_gc_leaves_it_alone(versions: Versions,
                                                                                      tmp_path: Path) -> None:
    root = dataset_copy(versions, tmp_path, created=created(versions))
    path = root / versions.base / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["inputs"]["samples"] += 1  # edited after the build: fails its dataset_hash
    path.write_text(json.dumps(manifest))
    listed = invoke("ls", root)
    assert listed.exit_code == 5 and f"{versions.base}  BROKEN" in listed.output, listed.output
    result = invoke("gc", root, "--keep", "1")
    assert result.exit_code == 0, result.output
    assert f"left alone: {versions.base}" in result.output
    assert sorted(p.name for p in root.iterdir()) == sorted([versions.base, versions.grown])


def test_gc_leaves_a_symlinked_version_and_its_target_alone_and_never_counts_it(versions: Versions,
                                                                                  tmp_path: Path) -> None:
    """Another team's version brought in with ``ln -s``: gc deleted its manifest through the link,
    said "removed", and left a ``.trash-*`` link that every later gc "removed" again."""
    theirs = Path(shutil.copytree(versions.out / "demo" / versions.base, tmp_path / "teamA" / "demo" / versions.base))
    path = theirs / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["created_at"] = "2020-01-01T00:00:00Z"  # the oldest: the first gc would remove
    path.write_text(json.dumps(manifest))
    root = dataset_copy(versions, tmp_path, created=created(versions))
    shutil.rmtree(root / versions.base)
    os.symlink(theirs, root / versions.base)
    trash_link = root / ".trash-0123456789ab-deadbeef"
    os.symlink(theirs, trash_link)  # a link named as an interrupted gc's leftover
    before = snapshot(theirs)

    for _ in range(2):
        result = invoke("gc", root, "--keep", "1")
        assert result.exit_code == 0, result.output
        assert f"left alone: {versions.base} (a symbolic link to {theirs}" in result.output
        assert f"left alone: {trash_link.name} (a symbolic link" in result.output
        assert f"removed {versions.base}" not in result.output and f"removed {trash_link.name}" not in result.output
    assert snapshot(theirs) == before and verify_dataset(theirs).ok
    assert sorted(p.name for p in root.iterdir()) == sorted([trash_link.name, versions.base, versions.grown])
    assert (root / versions.base).is_symlink()
    plan = json.loads(invoke("gc", root, "--keep", "1", "--json").stdout)
    assert {"folder": versions.base, "target": str(theirs)} in plan["linked"] and plan["remove"] == []


def test_gc_refuses_while_a_build_of_the_dataset_holds_its_lock(versions: Versions, tmp_path: Path) -> None:
    """A build running into the dataset folder links shards from earlier versions and reads
    samples back from them; gc removed versions under it (the help only advised "start gc after
    it, or before it"), though the build holds the folder's lock. gc must refuse (exit 2, naming
    the folder) and change nothing; a dry run still prints the plan."""
    import fcntl

    root = dataset_copy(versions, tmp_path)
    before = snapshot(root)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running `packer build` holds
        result = invoke("gc", root, "--keep", "1")
        assert result.exit_code == 2, result.output
        assert f"{root}: a `packer build` of this dataset, or another `packer gc` of it, is running" in result.output
        assert snapshot(root) == before
        dry = invoke("gc", root, "--keep", "1", "--dry-run")
        assert dry.exit_code == 0 and "dry run" in dry.output
    finally:
        os.close(fd)
    assert invoke("gc", root, "--keep", "1").exit_code == 0
    assert len([p for p in root.iterdir() if not p.name.startswith(".")]) == 1


def test_a_failed_builds_version_is_marked_never_counted_by_gc_and_refused_by_the_loader(
        versions: Versions, demo_raw: Any, tmp_path: Path) -> None:
    """A build over max_bad_fraction exits 3 but writes its version, for its report. `ls` listed it
    as the newest version, `inspect` said "limit 5.0%" without "over", the loader read it, and
    `gc --keep 1` kept it and removed the last good version."""
    from packer.loader import ShardDataset

    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "failed-out",
                                                             validate={"max_bad_fraction": 0.01})))
    failed = build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir  # exit 3 at the CLI
    assert json.loads((failed / "manifest.json").read_text())["bad_samples"]["fraction"] > 0.01
    root = dataset_copy(versions, tmp_path, created=created(versions, {
        "base": "2024-01-01T00:00:00Z", "relimited": "2024-02-01T00:00:00Z", "grown": "2024-04-01T00:00:00Z"}))
    shutil.rmtree(root / versions.grown)  # for now: base and relimited, then the failed build
    copy = Path(shutil.copytree(failed, root / failed.name))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["created_at"] = "2024-03-01T00:00:00Z"  # outside the dataset hash
    (copy / "manifest.json").write_text(json.dumps(manifest))

    listed = invoke("ls", root)
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if line.strip().startswith(failed.name))
    assert "FAILED BUILD" in row and "over max_bad_fraction 1.0%" in row
    assert json.loads(invoke("ls", root, "--json").stdout)["versions"][0]["failed"]
    inspected = CliRunner().invoke(main, ["inspect", str(copy)])
    assert "OVER the limit 1.0%" in inspected.output and "FAILED BUILD" in inspected.output
    with pytest.raises(ConfigError, match="the build that wrote this version failed.*max_bad_fraction"):
        ShardDataset(copy, "train")

    plan = json.loads(invoke("gc", root, "--keep", "1", "--dry-run", "--json").stdout)
    # the newest good version is kept; the failed one, newer, stays for its report without counting
    assert [v["folder"] for v in plan["keep"]] == [failed.name, versions.relimited]
    assert [v["folder"] for v in plan["remove"]] == [versions.base]
    text = invoke("gc", root, "--keep", "1", "--dry-run").output
    assert "keeping the 1 newest version(s)" in text and "kept for its report, not counted" in text

    shutil.copytree(versions.out / "demo" / versions.grown, root / versions.grown)  # a good build after it
    manifest = json.loads((root / versions.grown / "manifest.json").read_text())
    manifest["created_at"] = "2024-04-01T00:00:00Z"
    (root / versions.grown / "manifest.json").write_text(json.dumps(manifest))
    plan = json.loads(invoke("gc", root, "--keep", "1", "--json").stdout)
    assert [v["folder"] for v in plan["keep"]] == [versions.grown]
    assert sorted(v["folder"] for v in plan["remove"]) == sorted([failed.name, versions.relimited, versions.base])
    assert sorted(p.name for p in root.iterdir()) == [versions.grown]


def _stale_staging(root: Path, kept: Path, outside: Path) -> tuple[Path, Path, Path]:
    """Two staging folders an interrupted build left: one holding a shard of its own, a hard link
    to a kept version's shard and links to the kept version and to a folder outside; and a
    ``.staging-*`` that is itself a link to that outside folder. Returns (folder, link, the kept shard)."""
    outside.mkdir()
    (outside / "precious.txt").write_text("not the dataset's")
    folder = root / ".staging-0123456789abcdef"
    folder.mkdir()
    (folder / "train-000000.tar").write_bytes(b"x" * 10_000)
    shard = sorted(kept.glob("*.tar"))[0]
    os.link(shard, folder / shard.name)
    (folder / "to-version").symlink_to(kept, target_is_directory=True)
    (folder / "to-outside").symlink_to(outside, target_is_directory=True)
    (folder / "to-shard.tar").symlink_to(shard)
    link = root / ".staging-fedcba9876543210"
    link.symlink_to(outside, target_is_directory=True)
    return folder, link, shard


def test_gc_removes_the_staging_folders_interrupted_builds_left_never_following_a_link(
        versions: Versions, tmp_path: Path) -> None:
    """An edited job never reuses the staging folder of its interrupted build (the folder is named
    by the configuration's hash), and gc, holding the build lock (so no build can be writing one),
    said it left them alone "as a build in progress": disk nothing ever gave back. gc removes them
    now, and only what lies under each: a kept version's shard linked into one stays, links inside
    are removed, never followed, and a ``.staging-*`` entry that is itself a link is left alone, as
    every link in the dataset folder is (gc removes only what builds of this folder wrote)."""
    root = dataset_copy(versions, tmp_path, created=created(versions))
    kept = root / versions.grown
    folder, link, shard = _stale_staging(root, kept, tmp_path / "outside")
    kept_before = {p.name: p.read_bytes() for p in sorted(kept.iterdir()) if p.is_file()}
    plan = invoke("gc", root, "--keep", "1", "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert f"remove  {folder.name}" in plan.output and f"remove  {link.name}" not in plan.output
    assert f"left alone: {link.name} (a symbolic link to" in plan.output and folder.is_dir()
    result = invoke("gc", root, "--keep", "1")
    assert result.exit_code == 0, result.output
    assert f"removed {folder.name}" in result.output and f"removed {link.name}" not in result.output
    assert sorted(p.name for p in root.iterdir()) == sorted([versions.grown, link.name]) and link.is_symlink()
    assert (tmp_path / "outside" / "precious.txt").read_text() == "not the dataset's"
    assert {p.name: p.read_bytes() for p in sorted(kept.iterdir()) if p.is_file()} == kept_before
    assert shard.stat().st_nlink == 1
    assert verify_dataset(kept).ok


def test_a_build_removes_the_staging_folders_an_interrupted_build_of_another_configuration_left(
        versions: Versions, tmp_path: Path) -> None:
    """A build holds the dataset folder's lock: other ``.staging-*`` folders there are an
    interrupted build's, of the job as it was before an edit; the build removes them (only what
    lies under each) and says what it freed."""
    root = dataset_copy(versions, tmp_path, created=created(versions))
    kept = root / versions.grown
    folder, link, shard = _stale_staging(root, kept, tmp_path / "outside")
    raw = versions.out.parent / "raw"
    job = load_job(write_job(tmp_path / "job", demo_job_doc(raw, tmp_path / "out", validate={"max_bad_fraction": 0.2})))
    build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, work_dir=tmp_path / "work"))
    assert not folder.exists() and not link.is_symlink()
    assert not [p.name for p in root.iterdir() if p.name.startswith(".staging-")]
    assert (tmp_path / "outside" / "precious.txt").read_text() == "not the dataset's"
    assert verify_dataset(kept).ok


def test_without_directory_locks_neither_build_nor_gc_removes_another_configurations_staging(
        versions: Versions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system takes no directory locks (flock fails with ENOLCK on some network
    file systems) a build runs unguarded, so another configuration's ``.staging-*`` folder may be
    a running build's: a build and gc leave it, and gc's plan says why."""
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    root = dataset_copy(versions, tmp_path, created=created(versions))
    running = root / ".staging-0123456789abcdef"
    running.mkdir()
    (running / "train-000000.tar").write_bytes(b"x" * 10_000)
    raw = versions.out.parent / "raw"
    job = load_job(write_job(tmp_path / "job", demo_job_doc(raw, tmp_path / "out", validate={"max_bad_fraction": 0.2})))
    build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False, work_dir=tmp_path / "work"))
    assert (running / "train-000000.tar").stat().st_size == 10_000
    plan = invoke("gc", root, "--keep", "1")
    assert plan.exit_code == 0, plan.output
    assert f"left alone: {running.name} (a staging folder; this file system takes no directory locks" in plan.output
    assert (running / "train-000000.tar").is_file()
    assert json.loads(invoke("gc", root, "--keep", "1", "--dry-run", "--json").stdout)["unguarded_staging"] == [
        running.name]
