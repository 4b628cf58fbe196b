"""What packer diff, ls and gc say of versions must be true of the folders: copies of one image
paired with their own new keys, a damaged version folder told from a registry copy, a linked-in
version not counted as this dataset's, bytes held by a version gc leaves alone blamed on it, and
the leftovers of a killed build named and removed.

Real builds of real image files; expected facts come from the inputs and from the folders
(``os.stat``, the Parquet tables), never from the code under test.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from numpy.typing import NDArray

from packer.cli import main
from packer.config import load_job
from packer.demo import write_demo_key, write_photo
from packer.inspection import diff_datasets, format_diff
from packer.pipeline.build import BuildOptions, build
from tests.helpers import write_job


def _build(tmp: Path, root: Path, name: str = "ds", **extra: Any) -> Path:
    """Build ``root``'s images (``labels.csv``: path, label, entity, timestamp) into ``tmp/out``;
    the version folder."""
    doc: dict[str, Any] = {
        "name": name,
        "sources": [{"kind": "image", "root": str(root), "table": str(root / "labels.csv")}],
        "split": {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 1},
        "transform": {"image": {"size": [16, 16], "color": "rgb"}},
        "pack": {"format": "webdataset", "max_samples": 8},
        "output": str(tmp / "out"),
        "phi": {"mode": "pseudonymize", "key_file": str(write_demo_key(tmp, 7))},
        "validate": {"max_bad_fraction": 0.9},
        **extra,
    }
    job = load_job(write_job(tmp / f"job-{root.name}", doc))
    return build(job, BuildOptions(scheduler="sync", quiet=True, html_report=False)).version_dir


def _noise(rng: np.random.Generator) -> NDArray[np.uint8]:
    """A 24×24 BGR image of uniform noise: no two are near copies."""
    return rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)


def _images_with_copies(root: Path, entities: int = 12) -> dict[str, str]:
    """Per entity two images of its own and one image filed twice (``dup0.png`` labelled a,
    ``dup1.png`` labelled b: a label conflict, common in real data). The label of each path."""
    rng = np.random.default_rng(3)
    labels: dict[str, str] = {}
    rows = ["path,label,entity,timestamp"]
    for e in range(entities):
        for i in range(2):
            labels[f"E{e}/{i}.png"] = "ab"[(e + i) % 2]
            write_photo(root / f"E{e}/{i}.png", _noise(rng))
        copy = _noise(rng)
        for j, label in enumerate("ab"):
            labels[f"E{e}/dup{j}.png"] = label
            write_photo(root / f"E{e}/dup{j}.png", copy)
    rows += [f"{path},{label},{path.split('/')[0]},2023-01-0{1 + len(rows) % 8}T00:00:00"
             for path, label in labels.items()]
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return labels


# -- diff: copies of one image under new keys ----------------------------------------------------------


def test_a_renamed_source_pairs_each_copy_of_an_image_with_its_own_new_key(tmp_path: Path) -> None:
    """Renaming the source root changes every pseudonymized key; diff pairs removed and added
    samples by their sha256. Where an image is filed twice with two labels, it paired the copies
    "in key order", and the new keys sort in another order than the old ones: a pure rename showed
    copies relabeled a -> b and b -> a. It now pairs copies of the same target (then split, then
    entity) first: nothing relabeled or moved; a real relabel beside the rename is still listed."""
    raw = tmp_path / "raw"
    labels = _images_with_copies(raw)
    before = _build(tmp_path, raw)
    scans = Path(shutil.copytree(raw, tmp_path / "scans"))
    after = _build(tmp_path, scans)
    old = pq.read_table(before / "_index.parquet", columns=["key", "label", "sha256"]).to_pylist()
    new = pq.read_table(after / "_index.parquet", columns=["key", "label", "sha256"]).to_pylist()
    assert not {row["key"] for row in old} & {row["key"] for row in new}  # every key changed
    assert len({row["sha256"] for row in old}) == len(labels) - 12  # each entity's copy: one digest, two labels

    diff = diff_datasets(before, after)
    assert diff.added == diff.removed == diff.relabeled == diff.moved == ()
    assert len(diff.rekeyed) == len(labels)
    assert [(c.old_key, c.old_label, c.new_label) for c in diff.rekeyed if c.old_label != c.new_label] == []
    assert [c.old_key for c in diff.rekeyed if c.old_split != c.new_split] == []
    assert not any(column.startswith("relabeled") for counts in diff.by_label().values() for column in counts)
    assert "leak risk" not in format_diff(diff, limit=100)

    # one real relabel (of an image filed once) beside the rename: that one, and only it, is listed
    edited = (scans / "labels.csv").read_text().replace("E3/0.png,b,", "E3/0.png,a,")
    assert labels["E3/0.png"] == "b" and edited != (scans / "labels.csv").read_text()
    (scans / "labels.csv").write_text(edited)
    relabeled = _build(tmp_path, scans)
    again = diff_datasets(before, relabeled)
    assert [(c.old_label, c.new_label) for c in again.rekeyed if c.old_label != c.new_label] == [("b", "a")]


# -- diff: a damaged version folder is not a registry copy ----------------------------------------------


def _images(root: Path, seed: int = 0) -> Path:
    """Six entities of three images each, labelled a or b (``labels.csv``)."""
    rng = np.random.default_rng(seed)
    rows = ["path,label,entity,timestamp"]
    for e in range(6):
        for i in range(3):
            write_photo(root / f"E{e}/{i}.png", _noise(rng))
            rows.append(f"E{e}/{i}.png,{'ab'[(e + i) % 2]},E{e},2023-01-0{i + 1}T00:00:00")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


@dataclass(frozen=True)
class Registered:
    old: Path       # <out>/ds/<version>: a version folder
    new: Path       # another version of ds (another split seed)
    copy: Path      # <registry>/ds/<old's version>.json: old's registry copy, nothing beside it


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Registered:
    tmp = tmp_path_factory.mktemp("registered")
    raw = _images(tmp / "raw")
    old = _build(tmp, raw, registry=str(tmp / "reg"))
    new = _build(tmp, raw, registry=str(tmp / "reg"),
                 split={"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 2})
    return Registered(old, new, tmp / "reg" / "ds" / f"{old.name}.json")


def _cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("lost", ["_index.parquet", "_splits.parquet"])
def test_a_version_folder_that_lost_a_table_is_damaged_not_a_registry_copy(
        registered: Registered, tmp_path: Path, lost: str) -> None:
    """A version folder (its shards beside its manifest) without its _index.parquet was taken for
    a registry copy: diff exited 0 with "(a registry copy?) ... pass the version folders" and hid
    every sample difference, and a lost _splits.parquet was skipped in silence, while `packer
    verify` calls the folder damaged (exit 5). diff now says so too: exit 5, restore or rebuild."""
    damaged = Path(shutil.copytree(registered.new, tmp_path / registered.new.name))
    (damaged / lost).unlink()
    assert any(damaged.glob("*.tar"))  # the shards are there: a version folder

    assert _cli("verify", "-q", damaged).exit_code == 5
    result = _cli("diff", registered.old, damaged)
    assert result.exit_code == 5, result.output
    message = " ".join(result.output.split())
    assert f"{damaged / lost}: not found" in message
    assert "not a registry copy (other files of the version are beside it): the version is damaged" in message
    assert "restore the file from a good copy or rebuild the version with `packer build`" in message
    assert "pass the version folders" not in message

    # a registry copy, with none of the version's files beside it, is still compared by its manifest only
    copy = _cli("diff", registered.copy, registered.new)
    assert copy.exit_code == 0, copy.output
    assert ("_index.parquet not found (a registry copy, or a manifest alone: none of its version's files is beside "
            "it): samples not compared; pass the version folders") in " ".join(copy.output.split())


def test_a_manifest_json_alone_is_compared_by_its_manifest_as_a_registry_copy_is(
        registered: Registered, tmp_path: Path) -> None:
    """A version's manifest.json fetched on its own (aws s3 cp .../<version>/manifest.json) holds
    what the version is, as a registry copy does, and none of its files is beside it: diff
    compares its config and versions with a note (it said "damaged", exit 5, as if a version
    folder had lost its tables)."""
    alone = tmp_path / "fetched"
    alone.mkdir()
    shutil.copy(registered.old / "manifest.json", alone / "manifest.json")
    result = _cli("diff", alone / "manifest.json", registered.new)
    assert result.exit_code == 0, result.output
    assert "samples not compared; pass the version folders" in " ".join(result.output.split())


def test_diff_check_refuses_a_registry_copy_as_verify_does(registered: Registered) -> None:
    """`packer diff --check COPY VERSION` verified the registry copy as a version folder: every
    file "missing", "restore the named files ... or rebuild", exit 5, though nothing is damaged
    (a registry copy holds the manifest only, by design); `packer verify COPY` says exit 2: pass
    the version folder. diff --check now says what verify says, for either argument."""
    assert not [p for p in registered.copy.parent.iterdir() if p.suffix != ".json"]  # nothing but manifests there
    verify = _cli("verify", registered.copy)
    assert verify.exit_code == 2
    expected = (f"none of the {len(list(registered.old.glob('*.tar'))) + 2} files this manifest lists (its index, "
                "splits table and shards) is beside it")
    assert expected in " ".join(verify.output.split())
    for args in ((registered.copy, registered.new), (registered.new, registered.copy)):
        result = _cli("diff", "--check", *args)
        assert result.exit_code == 2, result.output
        message = " ".join(result.output.split())
        assert f"{registered.copy}: {expected}" in message
        assert f"pass the version folder it describes (<output>/ds/{registered.old.name}/)" in message
        assert "restore" not in message and "integrity problem" not in message
    # the version folder it describes passes --check; without --check the copy is compared by its manifest
    assert _cli("diff", "--check", registered.old, registered.new).exit_code == 0
    assert _cli("diff", registered.copy, registered.new).exit_code == 0


# -- ls and gc: a symbolic link in the dataset folder is no version of it -------------------------------


def _file_bytes(folder: Path) -> int:
    """Every regular file under ``folder`` (links not followed), each inode once, by ``os.stat``."""
    seen = {}
    for path in folder.rglob("*"):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def test_ls_names_a_symlinked_version_as_a_link_and_counts_none_of_its_bytes(
        registered: Registered, tmp_path: Path) -> None:
    """Another team's version brought in with `ln -s` (the case gc documents): ls listed it as a
    version of this dataset, its bytes as "own" (what removing it alone frees: nothing here) and
    in "on disk", its dataset's name beside this one's, while gc never counts it. ls now names it
    as a link with its target, as gc's plan does, and counts none of its bytes."""
    root = Path(shutil.copytree(registered.old.parent, tmp_path / "out" / "ds"))
    own = _file_bytes(root)
    other = _build(tmp_path / "b", _images(tmp_path / "b" / "raw", seed=5), name="other")
    (root / "teamA").symlink_to(other, target_is_directory=True)
    assert _file_bytes(other) > 0

    listing = json.loads(_cli("ls", root, "--json").output)
    assert listing["dataset"] == "ds"
    assert "teamA" not in [v["folder"] for v in listing["versions"]]
    assert {"folder": "teamA", "kind": "link", "bytes": 0, "target": str(other)} in listing["others"]
    assert listing["disk_bytes"] == own
    text = _cli("ls", root).output
    assert f"also teamA: a symbolic link to {other}: not a folder a build of this dataset wrote" in text

    plan = json.loads(_cli("gc", root, "--keep", "1", "--dry-run", "--json").output)
    assert plan["linked"] == [{"folder": "teamA", "target": str(other)}]
    assert "teamA" not in [v["folder"] for v in plan["keep"] + plan["remove"] + plan["broken"]]
    assert _cli("gc", root, "--keep", "1").exit_code == 0
    assert (root / "teamA").is_symlink() and (other / "manifest.json").is_file()


# -- gc: bytes a left-alone folder holds -----------------------------------------------------------------


def _inodes(folder: Path) -> dict[tuple[int, int], int]:
    """The size of each inode of a regular file under ``folder``, by ``os.stat``."""
    return {(st.st_dev, st.st_ino): st.st_size for path in folder.rglob("*")
            if path.is_file() and not path.is_symlink() for st in (path.lstat(),)}


def test_gc_names_the_left_alone_version_that_holds_bytes_not_a_kept_one(tmp_path: Path) -> None:
    """v2 hard-links most of v1's shards (an incremental build) and its manifest was edited (gc
    leaves it alone: it fails its hash); v3, of another seed, shares nothing and is kept. gc's
    plan said "kept because a kept version still links them" of the bytes v1 shares with v2 only:
    no kept version links any. They are now counted as held by v2, which gc leaves alone."""
    raw = _images(tmp_path / "raw")
    v1 = _build(tmp_path, raw)
    rng = np.random.default_rng(9)
    for i in range(3):
        write_photo(raw / f"E9/{i}.png", _noise(rng))
    with (raw / "labels.csv").open("a") as table:
        table.writelines(f"E9/{i}.png,a,E9,2023-02-0{i + 1}T00:00:00\n" for i in range(3))
    time.sleep(1.1)  # created_at is to the second: each version strictly newer than the last
    v2 = _build(tmp_path, raw)
    time.sleep(1.1)
    v3 = _build(tmp_path, raw, split={"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 7})
    manifest = v2 / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_text(manifest.read_text().replace('"samples": ', '"samples": 1', 1))
    one, two, three = _inodes(v1), _inodes(v2), _inodes(v3)
    held_by_v2 = sum(size for inode, size in one.items() if inode in two)
    assert held_by_v2 > 0 and not set(one) & set(three)  # the premise: v1 shares with v2 only

    plan = json.loads(_cli("gc", v1.parent, "--keep", "1", "--dry-run", "--json").output)
    assert ([v["folder"] for v in plan["keep"]], [v["folder"] for v in plan["remove"]],
            [v["folder"] for v in plan["broken"]]) == ([v3.name], [v1.name], [v2.name])
    assert plan["shared_bytes"] == 0
    assert plan["left_alone_bytes"] == held_by_v2 and plan["left_alone_holders"] == [v2.name]
    assert plan["freed_bytes"] == sum(one.values()) - held_by_v2
    text = _cli("gc", v1.parent, "--keep", "1", "--dry-run").output
    assert "kept because a kept version still links them: 0 B" in text
    assert f"kept because {v2.name}, which gc leaves alone, still links them: " in text
    assert _cli("gc", v1.parent, "--keep", "1").exit_code == 0
    assert not v1.exists() and _inodes(v2) == two  # v2's files, hard links to v1's included, untouched


# -- gc: a killed build's temporaries in the dataset folder ---------------------------------------------


def test_gc_removes_the_probe_a_killed_build_left_and_names_it(registered: Registered, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A build writes shared-probe-<hex>.partial into the dataset folder while it runs (a worker
    that sees it sees the client's output folder). kill -9 leaves it there: gc removed the killed
    build's .staging-* folder but not the probe, and neither ls nor the plan named it. Both do
    now, and gc removes it, as the staging folder: only under the dataset folder's lock, which a
    running build holds (gc then refuses and removes nothing), and never where the file system
    takes no directory locks (a running build's probe looks the same). A link so named is left alone."""
    from packer.pipeline.build import _shared_probe

    root = Path(shutil.copytree(registered.old.parent, tmp_path / "out" / "ds"))
    killed = _shared_probe(root)
    probe = killed.__enter__()  # never exited: what a build killed while it runs leaves behind
    assert probe.parent == root and probe.name.startswith("shared-probe-") and probe.is_file()
    outside = tmp_path / "keep.txt"
    outside.write_text("not the build's")
    (root / "mine.partial").symlink_to(outside)

    listing = json.loads(_cli("ls", root, "--json").output)
    assert {"folder": probe.name, "kind": "temporary", "bytes": 0} in listing["others"]
    assert "mine.partial" not in [o["folder"] for o in listing["others"]]
    assert f"also {probe.name} (0 B): a temporary file of a build in progress, or one interrupted" in _cli(
        "ls", root).output
    plan = json.loads(_cli("gc", root, "--keep", "2", "--dry-run", "--json").output)
    assert plan["temporaries"] == [probe.name] and plan["remove"] == []
    assert f"remove  {probe.name}  (a temporary file an interrupted build left" in _cli(
        "gc", root, "--keep", "2", "--dry-run").output
    assert probe.is_file()

    with monkeypatch.context() as unlocked:  # a file system without directory locks (some network ones)
        unlocked.setattr("packer.gc.folder_locks_work", lambda folder: False)
        plan = json.loads(_cli("gc", root, "--keep", "2", "--json").output)
        assert (plan["temporaries"], plan["unguarded_temporaries"]) == ([], [probe.name]) and probe.is_file()

    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running `packer build` holds
        assert _cli("gc", root, "--keep", "2").exit_code == 2
        assert probe.is_file()
    finally:
        os.close(fd)
    result = _cli("gc", root, "--keep", "2")
    assert result.exit_code == 0, result.output
    assert f"removed {probe.name}" in result.output
    assert not probe.exists()
    assert (root / "mine.partial").is_symlink() and outside.read_text() == "not the build's"
    assert all((root / v.name / "manifest.json").is_file() for v in (registered.old, registered.new))
