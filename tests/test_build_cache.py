"""The build cache lives outside the output tree: in the work folder, one folder per job and output.

The cache's records name raw paths, entity ids and dates; an output folder is what people sync
and share. So the cache goes to ``$PACKER_WORK_DIR/cache/<name>-<digest>/`` (digest: the first
12 hex digits of sha256 of the resolved output folder, a newline and the job name), resumes from
there, is cleared by ``--fresh``, and is never shared by two outputs."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, BuildResult, build, cache_location
from packer.pipeline.filecache import INDEX_NAME
from packer.pipeline.neighborcache import NEIGHBORS_FILE
from packer.pipeline.paircache import PAIRS_FILE
from packer.storage import build_cache_dir
from tests.helpers import demo_job_doc, write_job


def build_demo(demo_raw: Any, tmp_path: Path, out: Path, **options: Any) -> BuildResult:
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out")))
    return build(job, BuildOptions(out=out, **{"scheduler": "sync", "quiet": True, "html_report": False, **options}))


def expected_cache(base: Path, out: Path, name: str = "demo") -> Path:
    """The documented folder, computed here rather than by packer."""
    digest = hashlib.sha256(f"{out.resolve()}\n{name}".encode()).hexdigest()[:12]
    return base.resolve() / f"{name}-{digest}"


def files_under(root: Path) -> list[Path]:
    return sorted(Path(folder) / name for folder, _, names in os.walk(root) for name in names)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    return tmp_path / "work"


def test_the_default_cache_is_in_the_work_folder_and_a_second_build_decodes_nothing(
        demo_raw: Any, tmp_path: Path, work: Path) -> None:
    out = tmp_path / "out"
    first = build_demo(demo_raw, tmp_path, out)
    cache = expected_cache(work / "cache", out)
    assert first.files_decoded > 0
    # per chunk: its records, its near-copy signatures and where its samples are now (the
    # pack pass freed the spill: tests/test_spill_consumption.py), the index of the files
    # each entry holds (per-file reuse: tests/test_filecache.py), the verified near-copy pairs
    # and every sample's near-copy neighbour list (tests/test_neighborcache.py)
    names = [p.name for p in cache.iterdir() if p.name not in (INDEX_NAME, PAIRS_FILE, NEIGHBORS_FILE)]
    assert (cache / PAIRS_FILE).is_file()
    assert (cache / NEIGHBORS_FILE).is_file()
    chunks = {name.split(".")[0] for name in names}
    assert sorted(names) == sorted(f"{c}{suffix}" for c in chunks for suffix in (".json", ".packed.json", ".sig.npy"))
    assert (cache / INDEX_NAME).is_file()
    assert re.fullmatch(r"demo-[0-9a-f]{12}", cache.name)  # nothing from the raw tree in its name
    assert [p.name for p in (work / "cache").iterdir()] == [cache.name]
    # the output holds the version folder and nothing else: no cache, no spill, no hidden folder
    assert [p.name for p in (out / "demo").iterdir()] == [first.version_dir.name]
    assert not [p for p in files_under(out) if p.suffix in (".spill", ".partial") or p.name.startswith(".")]

    second = build_demo(demo_raw, tmp_path, out)
    assert second.files_decoded == 0 and second.files_cached == first.files_decoded
    assert second.manifest["dataset_hash"] == first.manifest["dataset_hash"] and second.reused


def test_two_outputs_of_one_job_keep_separate_caches(demo_raw: Any, tmp_path: Path, work: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    first_a = build_demo(demo_raw, tmp_path, a)
    entries_a = {p.name: p.read_bytes() for p in expected_cache(work / "cache", a).iterdir()}
    first_b = build_demo(demo_raw, tmp_path, b)
    assert first_b.files_decoded == first_a.files_decoded  # b did not find a's cache
    assert sorted(p.name for p in (work / "cache").iterdir()) == sorted(
        [expected_cache(work / "cache", a).name, expected_cache(work / "cache", b).name])
    # b's build pruned only its own folder: a's entries are all there, unchanged, and still used
    assert {p.name: p.read_bytes() for p in expected_cache(work / "cache", a).iterdir()} == entries_a
    assert build_demo(demo_raw, tmp_path, a).files_decoded == 0


def test_fresh_clears_the_cache_and_an_old_cache_in_the_output_is_warned_about_then_deleted(
        demo_raw: Any, tmp_path: Path, work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    legacy = out / "demo" / ".cache"  # where packer kept the cache before: names raw paths and ids
    legacy.mkdir(parents=True)
    (legacy / "0123.json").write_text('{"path": "MRN83746251/scan.dcm"}')
    first = build_demo(demo_raw, tmp_path, out)
    warned = capsys.readouterr().err
    assert f"packer: warning: {legacy} is a build cache left in the output folder" in warned
    assert "--fresh" in warned and (legacy / "0123.json").is_file()  # warned about, not deleted unasked

    cache = expected_cache(work / "cache", out)
    (cache / "planted.json").write_text("{}")
    fresh = build_demo(demo_raw, tmp_path, out, fresh=True)
    assert fresh.files_decoded == first.files_decoded  # nothing reused: everything decoded again
    assert not (cache / "planted.json").exists() and not legacy.exists()
    assert fresh.manifest["dataset_hash"] == first.manifest["dataset_hash"]
    assert "warning" not in capsys.readouterr().err


def test_cache_dir_puts_the_cache_under_it_and_warns_when_that_is_inside_the_output(
        demo_raw: Any, tmp_path: Path, work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    result = build_demo(demo_raw, tmp_path, out, cache_dir=out / "caches")
    cache = expected_cache(out / "caches", out)
    assert any(p.name.endswith(".packed.json") for p in cache.iterdir())
    assert not (work / "cache").exists()
    assert f"the build cache {cache} (--cache-dir) is inside the output folder {out.resolve()}" \
        in capsys.readouterr().err
    assert result.files_decoded > 0


def test_a_scheduler_elsewhere_needs_a_chosen_cache_folder(demo_raw: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PACKER_WORK_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="PACKER_WORK_DIR") as caught:
        build_demo(demo_raw, tmp_path, out, scheduler="tcp://127.0.0.1:9")  # refused before connecting
    assert "--cache-dir" in str(caught.value) and "every worker mounts" in str(caught.value)
    assert not out.exists() and not (tmp_path / "home").exists()

    remote = BuildOptions(scheduler="tcp://127.0.0.1:9", cache_dir=tmp_path / "shared")
    assert cache_location("demo", remote, output=out, remote=None)[0] == expected_cache(tmp_path / "shared", out)
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "shared-work"))
    chosen = cache_location("demo", BuildOptions(scheduler="tcp://127.0.0.1:9"), output=out, remote=None)
    assert chosen == (expected_cache(tmp_path / "shared-work" / "cache", out), "$PACKER_WORK_DIR")


def test_a_second_build_of_the_job_into_the_same_output_is_refused_while_the_first_runs(
        demo_raw: Any, tmp_path: Path, work: Path) -> None:
    """Two builds at once (a cron job that overran) shared the staging folder and the build
    cache: each deleted the other's temporaries and one died with an internal error (exit 1,
    FileNotFoundError on a `.partial` or a staging shard). The folder's lock refuses the second."""
    import fcntl

    out = tmp_path / "out"
    (out / "demo").mkdir(parents=True)
    fd = os.open(out / "demo", os.O_RDONLY)  # what a running build holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another `packer build` of demo into this folder is running, or a "
                                              "`packer gc` of it"):
            build_demo(demo_raw, tmp_path, out)
        assert list((out / "demo").iterdir()) == [] and not (work / "cache").exists()  # touched nothing
    finally:
        os.close(fd)
    assert build_demo(demo_raw, tmp_path, out).files_decoded > 0  # once it ended
    refused = tmp_path / "refused"  # a job refused later leaves no folder made for the lock
    with pytest.raises(ConfigError):
        build(load_job(write_job(tmp_path / "job2", demo_job_doc(tmp_path / "nowhere", refused))),
              BuildOptions(scheduler="sync", quiet=True))
    assert not (refused / "demo").exists()


def test_a_build_refused_by_the_lock_leaves_the_folder_it_saw_made_by_the_running_build(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """B saw out/demo missing; A made it and locked it before B's lock: B was refused, and on its
    way out removed the (still empty) folder A's lock was on, so a third build could run beside A.
    B now leaves a folder another build holds."""
    import fcntl

    from packer.pipeline import build as build_module

    out = tmp_path / "out"
    (out / "demo").mkdir(parents=True)
    fd = os.open(out / "demo", os.O_RDONLY)  # A: made it a moment after B looked, and holds its lock
    real_exists = build_module.path_exists
    monkeypatch.setattr(build_module, "path_exists", lambda p: False if Path(p) == out / "demo" else real_exists(p))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="another `packer build` of demo into this folder is running"):
            build_demo(demo_raw, tmp_path, out)
        assert (out / "demo").is_dir()
        assert os.stat(out / "demo").st_ino == os.fstat(fd).st_ino  # the very folder A locked
    finally:
        os.close(fd)


def test_every_job_and_output_has_its_own_cache_folder(tmp_path: Path) -> None:
    base = tmp_path / "cache"
    folders = {build_cache_dir(name, location, base) for name in ("ct", "ct2", "mri")
               for location in ("/data/out", "/data/out2", "s3://bucket/datasets")}
    assert len(folders) == 9 and {f.parent for f in folders} == {base.resolve()}
    assert build_cache_dir("ct", "/data/out", base) == build_cache_dir("ct", "/data/out", base)  # found again
    assert build_cache_dir("ct", "/data/out", base).name == "ct-" + hashlib.sha256(b"/data/out\nct").hexdigest()[:12]


def test_a_file_where_the_cache_folder_must_be_is_a_config_error_naming_it(demo_raw: Any, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").write_text("not a folder")
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    with pytest.raises(ConfigError) as caught:
        build_demo(demo_raw, tmp_path, tmp_path / "out")
    cache = expected_cache(tmp_path / "work" / "cache", tmp_path / "out")
    assert str(caught.value).startswith(f"the build cache folder {cache} ($PACKER_WORK_DIR): {tmp_path / 'work'} is "
                                        "a file, not a folder; remove that file")
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="Linux /sys refuses new folders: a real refused write")
def test_a_cache_folder_the_file_system_refuses_exits_6_with_the_caches_fix(demo_raw: Any, tmp_path: Path) -> None:
    from packer.errors import FileSystemError

    with pytest.raises(FileSystemError) as caught:
        build_demo(demo_raw, tmp_path, tmp_path / "out", cache_dir=Path("/sys/packer-cache"))
    assert caught.value.exit_code == 6
    assert str(caught.value).startswith("cannot write /sys/packer-cache/demo-")
    assert "choose another cache folder (packer build --cache-dir DIR, or set PACKER_WORK_DIR)" in str(caught.value)


def test_packer_build_cache_dir_option_keeps_the_cache_there(demo_raw: Any, tmp_path: Path, work: Path) -> None:
    out, caches = tmp_path / "out", tmp_path / "caches"
    job = write_job(tmp_path / "job", demo_job_doc(demo_raw.root, out))
    done = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--quiet", "--no-report",
                                     "--cache-dir", str(caches)])
    assert done.exit_code == 0, done.output
    assert any(p.name.endswith(".packed.json") for p in expected_cache(caches, out).iterdir())
    assert not (work / "cache").exists() and not list(out.rglob("*.spill"))


def test_raising_a_size_limit_decodes_the_files_it_refused_instead_of_reusing_the_verdict(
        demo_raw: Any, tmp_path: Path, work: Path) -> None:
    """The worker applies ``limits``: a cached ``too_large`` verdict is only valid for its limits."""
    out = tmp_path / "out"
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    tight = load_job(write_job(tmp_path / "tight", {**doc, "limits": {"max_pixels": 16}, "validate": {
        "max_bad_fraction": 1.0}}))
    first = build(tight, BuildOptions(out=out, scheduler="sync", quiet=True, html_report=False))
    refused = {i.path for i in first.issues if i.reason == "too_large"}
    assert refused and first.manifest["inputs"]["samples"] == 0

    second = build_demo(demo_raw, tmp_path, out)  # the default limits, same output, same cache folder
    assert not [i for i in second.issues if i.reason == "too_large"]
    assert second.files_decoded >= len(refused) and second.manifest["inputs"]["samples"] > 0


def test_a_one_split_job_keeps_no_signatures_reuses_its_cache_and_says_why_near_copies_were_not_searched(
        demo_raw: Any, tmp_path: Path, work: Path) -> None:
    """``near_duplicates.enabled: auto`` in a one-split job: no near-copy search, no signature
    files in the cache, and the cache still serves a second build; asking for the check
    (``enabled: true``) then decodes again, since those entries carry no signatures."""
    out = tmp_path / "out"
    doc = demo_job_doc(demo_raw.root, tmp_path / "out")
    one = {**doc, "split": {**doc["split"], "ratios": {"train": 1.0}}}
    job = load_job(write_job(tmp_path / "one", one))
    first = build(job, BuildOptions(out=out, scheduler="sync", quiet=True, html_report=False))
    cache = expected_cache(work / "cache", out)
    assert first.files_decoded > 0 and not list(cache.glob("*.sig.npy"))
    rule = first.manifest["audit"]["rules"]["near_duplicates_across_splits"]
    assert rule["enabled"] is False and rule["off"].startswith("one split")
    assert set(first.manifest["splits"]) == {"train"} or all(
        s["samples"] == 0 for name, s in first.manifest["splits"].items() if name != "train")

    second = build(job, BuildOptions(out=out, scheduler="sync", quiet=True, html_report=False))
    assert second.files_decoded == 0 and second.manifest["dataset_hash"] == first.manifest["dataset_hash"]

    checked = load_job(write_job(tmp_path / "on", {**one, "split": {**one["split"], "near_duplicates": {
        "enabled": True}}}))
    third = build(checked, BuildOptions(out=out, scheduler="sync", quiet=True, html_report=False))
    assert third.files_decoded == first.files_decoded and list(cache.glob("*.sig.npy"))
    assert third.manifest["audit"]["rules"]["near_duplicates_across_splits"]["enabled"] is True


@pytest.mark.slow  # two demo trees and two builds
def test_make_demo_twice_decodes_nothing_the_second_time(tmp_path: Path, work: Path) -> None:
    """`make demo` writes the demo tree afresh every time, then builds. The tree is a pure
    function of its seed, mtimes included, so the second build's cache keys match the first's."""
    from packer.demo import write_demo_tree

    raw = tmp_path / "demo-raw"
    listing = []
    for _ in range(2):
        tree = write_demo_tree(raw, seed=0)
        listing.append(sorted((p.relative_to(raw).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                              for p in raw.rglob("*") if p.is_file()))
    assert listing[0] == listing[1]

    first = build_demo(tree, tmp_path, tmp_path / "out")
    write_demo_tree(raw, seed=0)
    second = build_demo(tree, tmp_path, tmp_path / "out")
    assert first.files_decoded > 0 and second.files_decoded == 0
    assert second.files_cached == first.files_decoded
