"""Same inputs and config give the same bytes: whatever the listing order, after a kill -9 and
resume, and equal to the demo manifest committed in manifests/."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import packer.pipeline.discover as discover_module
from packer.config import load_job
from packer.demo import write_demo_tree
from packer.pipeline.build import BuildOptions, BuildResult, build
from tests.demo_version import committed_demo
from tests.helpers import REPO, demo_job_doc, write_job


def shards(result: BuildResult) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.version_dir.iterdir())
            if p.name.split("-")[0] in ("train", "valid", "test")}


@pytest.fixture(scope="module")
def reference(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    tmp = tmp_path_factory.mktemp("reference")
    return build(load_job(write_job(tmp, demo_job_doc(demo_raw.root, tmp / "out"))),
                 BuildOptions(scheduler="sync", quiet=True))


def test_a_shuffled_directory_listing_changes_nothing(demo_raw: Any, reference: BuildResult, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real_walk = os.walk

    def shuffled_walk(top: Any, **kwargs: Any) -> Any:
        rng = random.Random(7)
        for folder, dirs, files in real_walk(top, **kwargs):
            rng.shuffle(dirs)
            rng.shuffle(files)
            yield folder, dirs, files

    monkeypatch.setattr(discover_module.os, "walk", shuffled_walk)
    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    result = build(job, BuildOptions(scheduler="sync", quiet=True))
    assert result.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shards(result) == shards(reference)


@pytest.mark.slow  # a subprocess build, killed and resumed
def test_kill_9_mid_build_then_resume_gives_identical_bytes(demo_raw: Any, reference: BuildResult,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out"))
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))  # the build cache: <work>/cache/demo-<digest>/
    cache = tmp_path / "work" / "cache"
    exe = str(Path(sys.executable).with_name("packer"))
    proc = subprocess.Popen([exe, "build", str(job), "--scheduler", "sync", "--quiet", "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(list(cache.glob("*/*.json"))) < 1:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done_before = len(list(cache.glob("*/*.json")))
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert 1 <= done_before and not list((tmp_path / "out" / "demo").glob("*/manifest.json"))
    (cache,) = cache.iterdir()
    (cache / "planted.spill.partial").write_bytes(b"half a spill file")  # what a kill mid-write leaves

    resumed = build(load_job(job), BuildOptions(scheduler="sync", quiet=True))
    assert resumed.files_decoded < resumed.manifest["inputs"]["files"] - 1  # cached chunks were not decoded again
    assert resumed.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shards(resumed) == shards(reference)
    assert not list(cache.glob("*.partial"))


@pytest.mark.parametrize("where", ["pixels", "metadata"])
def test_a_damaged_cache_entry_is_recomputed_not_trusted(demo_raw: Any, reference: BuildResult,
                                                         tmp_path: Path, where: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    build(job, BuildOptions(scheduler="sync", quiet=True, keep_spill=True))  # damaged shards: test_spill_consumption
    spill = next((tmp_path / "work" / "cache").glob("*/*.spill"))
    record = json.loads(spill.with_suffix(".json").read_text())
    sample = record["samples"][-1]
    at = sample["offset"] + (sample["pixel_bytes"] // 2 if where == "pixels"
                             else sample["pixel_bytes"] + sample["meta_bytes"] // 2)
    data = bytearray(spill.read_bytes())
    data[at] ^= 0x01
    spill.write_bytes(bytes(data))
    again = build(job, BuildOptions(scheduler="sync", quiet=True))
    # the damaged sample's unit (its file, or its series), and only that, decoded again: the
    # chunk's other files are checked one by one and kept
    (unit,) = [ids for _, ids, *_ in record["units"] if sample["ref"]["sample_id"] in ids]
    assert again.files_decoded == len(unit) < record["files"] or record["files"] == len(unit)
    assert shards(again) == shards(reference)


def test_a_build_stopped_in_its_pack_pass_decodes_again_only_the_files_whose_samples_it_had_packed(
        demo_raw: Any, reference: BuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a build killed in its pack pass leaves: every chunk's spill and records, the spill of
    the samples already packed freed (reads as zeros), no version published and no index of files
    (written once a version is). The rerun decodes those samples' files alone: the other files of
    their chunks are copied from the chunk's own entry, each sample checked, to a fresh build's bytes."""
    monkeypatch.setenv("PACKER_WORK_DIR", str(tmp_path / "work"))
    job = load_job(write_job(tmp_path, demo_job_doc(demo_raw.root, tmp_path / "out")))
    build(job, BuildOptions(scheduler="sync", quiet=True, keep_spill=True))
    shutil.rmtree(tmp_path / "out")
    (cache,) = (tmp_path / "work" / "cache").iterdir()
    for name in ("files.index.npy", "*.packed.json"):
        for path in cache.glob(name):
            path.unlink()
    # a chunk of several files whose first sample is a file of its own (not a series'): its bytes packed, so freed
    for spill in sorted(cache.glob("*.spill")):
        record = json.loads(spill.with_suffix(".json").read_text())
        sample = record["samples"][0]
        if record["files"] > 1 and [ids for _, ids, *_ in record["units"]
                                    if sample["ref"]["sample_id"] in ids] == [[sample["ref"]["sample_id"]]]:
            break
    else:
        raise AssertionError("no cache entry of several files whose first sample is a file of its own")
    with spill.open("r+b") as fh:
        fh.seek(sample["offset"])
        fh.write(bytes(sample["pixel_bytes"] + sample["meta_bytes"] + sample.get("mask_bytes", 0)))

    again = build(job, BuildOptions(scheduler="sync", quiet=True))
    assert again.files_decoded == 1 < record["files"]
    assert again.manifest["dataset_hash"] == reference.manifest["dataset_hash"]
    assert shards(again) == shards(reference)


def test_the_demo_rebuilds_to_the_committed_manifest(tmp_path: Path) -> None:
    """`make demo` commits manifests/demo/<version>.json; an unannounced change of output fails here.

    If a change of packer, a library or the demo is intended, run `make demo` and commit the
    new manifest (and delete the old one)."""
    expected = committed_demo()
    (tmp_path / "workflows").mkdir()
    shutil.copy(REPO / "workflows" / "demo.yaml", tmp_path / "workflows" / "demo.yaml")
    write_demo_tree(tmp_path / "demo-raw", seed=0)
    result = build(load_job(tmp_path / "workflows" / "demo.yaml"),
                   BuildOptions(scheduler="sync", quiet=True, html_report=False))
    got = result.manifest
    if got["libraries"] != expected["libraries"]:
        pytest.fail(f"library versions differ from the committed demo manifest ({expected['libraries']} → "
                    f"{got['libraries']}); the bytes may legitimately change: re-run `make demo` and commit")
    assert got["dataset_hash"] == expected["dataset_hash"], "the demo's output changed: see this test's docstring"
