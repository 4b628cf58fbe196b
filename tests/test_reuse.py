"""Incremental versions: a shard whose bytes an earlier version of the same output already
holds is linked from it, not written again (:mod:`packer.pipeline.reuse`), and the new version
is byte-for-byte what a fresh build of the same inputs gives, complete on its own."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.files import human_bytes
from packer.loader import ShardDataset
from packer.manifest import MANIFEST_FILE
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.pipeline.discover import make_sample_id
from packer.verify import verify_dataset
from tests.helpers import write_job


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed (no two are near copies)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (128, 96), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def write_tree(raw: Path, files: dict[str, tuple[str, str, int]]) -> None:
    """PNGs at ``files`` (relpath → (label, split, image seed)), each its own entity, and the
    table path,label,entity,split; other PNGs in ``raw`` are deleted."""
    lines = ["path,label,entity,split"]
    for gone in {p.name for p in raw.glob("*.png")} - set(files):
        (raw / gone).unlink()
    for rel, (label, split, seed) in sorted(files.items()):
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (raw / rel).exists():
            assert cv2.imwrite(str(raw / rel), photo(seed))
        lines.append(f"{rel},{label},{Path(rel).stem},{split}")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")


def job_doc(raw: Path, out: Path, fmt: str = "webdataset", order: str | None = None) -> dict[str, Any]:
    pack: dict[str, Any] = {"format": fmt, "max_samples": 4} | ({"order": order} if order else {})
    return {"name": "daily", "sources": [{"name": "xray", "kind": "image", "root": str(raw),
                                          "table": str(raw / "labels.csv")}],
            "split": {"by": "column", "column": "split"}, "transform": {"image": {"size": [32, 32]}},
            "pack": pack, "output": str(out)}


def run_build(tmp: Path, raw: Path, output: Path, fmt: str = "webdataset", order: str | None = None,
              **options: Any) -> BuildResult:
    """Build the job of ``raw`` into ``output`` (``order``: ``pack.order``, unset when None;
    ``options``: :class:`BuildOptions`' fields)."""
    job = load_job(write_job(tmp / "jobs" / output.name, job_doc(raw, output, fmt, order)))
    return build(job, BuildOptions(**{"scheduler": "sync", "quiet": True, "html_report": False,
                                      "cache_dir": tmp / "cache", **options}))


def day_one() -> dict[str, tuple[str, str, int]]:
    """16 train images (4 shards of 4), 4 valid, 4 test: names sort in seed order."""
    files = {f"img{i:03d}.png": ("ab"[i % 2], "train", i) for i in range(16)}
    files.update({f"val{i:03d}.png": ("ab"[i % 2], "valid", 100 + i) for i in range(4)})
    files.update({f"tst{i:03d}.png": ("ab"[i % 2], "test", 200 + i) for i in range(4)})
    return files


RELABELLED = "tst000.png"


def day_two() -> dict[str, tuple[str, str, int]]:
    """Day one plus two train images whose sample keys sort after every train key of day one
    (so the shards before them keep their samples, whatever the plan's rule), and one test image
    re-labelled (its shard keeps its samples but not its bytes). Valid is as it was."""
    files = day_one()
    last = max(make_sample_id("xray", rel) for rel, (_, split, _) in files.items() if split == "train")
    added = [rel for rel in (f"new{n:03d}.png" for n in range(1000)) if make_sample_id("xray", rel) > last][:2]
    files.update({rel: ("a", "train", 300 + i) for i, rel in enumerate(added)})
    files[RELABELLED] = ("b", "test", 200)
    return files


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def shard_files(result: BuildResult) -> list[str]:
    return [s["file"] for split in result.manifest["splits"].values() for s in split["shards"]]


def shard_samples(result: BuildResult) -> dict[str, tuple[str, ...]]:
    """Shard file → its sample keys in order, as ``_index.parquet`` lists them."""
    rows = pq.read_table(result.version_dir / "_index.parquet", columns=["key", "shard", "position"]).to_pylist()
    shards: dict[str, list[tuple[int, str]]] = {}
    for row in rows:
        shards.setdefault(row["shard"], []).append((row["position"], row["key"]))
    return {file: tuple(key for _, key in sorted(keys)) for file, keys in shards.items()}


def unchanged_shards(first: BuildResult, second: BuildResult) -> dict[str, str]:
    """The shards of ``second`` whose bytes ``first`` already holds, found without packer's
    reuse: the same samples in the same order, none of them re-labelled (new file → old file)."""
    relabelled = make_sample_id("xray", RELABELLED)
    old = {keys: file for file, keys in shard_samples(first).items()}
    return {file: old[keys] for file, keys in shard_samples(second).items() if keys in old and relabelled not in keys}


@pytest.fixture
def grown(tmp_path: Path) -> tuple[Path, BuildResult, dict[str, str], BuildResult]:
    """Day one built into ``out``, then the tree grown to day two and built again into ``out``:
    (tmp, day one's result, day one's folder digest taken right after it was built, day two's)."""
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_tree(raw, day_one())
    first = run_build(tmp_path, raw, out)
    before = folder_digest(first.version_dir)
    write_tree(raw, day_two())
    return tmp_path, first, before, run_build(tmp_path, raw, out)


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_grown_dataset_links_its_unchanged_shards_and_equals_a_fresh_build(tmp_path: Path, fmt: str) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_tree(raw, day_one())
    first = run_build(tmp_path, raw, out, fmt)
    write_tree(raw, day_two())
    second = run_build(tmp_path, raw, out, fmt)
    fresh = run_build(tmp_path, raw, tmp_path / "fresh", fmt)

    # the acceptance rule: the same bytes as a fresh build of the same inputs, index included
    assert second.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
    assert second.version_dir.name == fresh.version_dir.name != first.version_dir.name
    assert folder_digest(second.version_dir) == {
        name: digest for name, digest in folder_digest(fresh.version_dir).items() if name != MANIFEST_FILE
    } | {MANIFEST_FILE: folder_digest(second.version_dir)[MANIFEST_FILE]}  # created_at differs, nothing else
    # the shards holding yesterday's samples, none re-labelled, are yesterday's files: the same inode
    unchanged = unchanged_shards(first, second)
    assert len(unchanged) >= 4 and any(f.startswith("valid-") for f in unchanged)
    for new, old in unchanged.items():
        assert os.stat(second.version_dir / new).st_ino == os.stat(first.version_dir / old).st_ino, new
    for name in set(shard_files(second)) - set(unchanged):
        assert os.stat(second.version_dir / name).st_nlink == 1, name
    total = len(shard_files(second))
    assert (second.shards_written, second.shards_reused) == (total - len(unchanged), len(unchanged))
    assert second.bytes_reused == sum((first.version_dir / f).stat().st_size for f in unchanged.values())
    assert second.work_line == (f"decoded {second.files_decoded} of 26 files, wrote {second.shards_written} of "
                                f"{total} shards ({human_bytes(second.bytes_written)}), reused {len(unchanged)} "
                                f"({human_bytes(second.bytes_reused)})")
    # every shard is read-only, the linked ones in both versions
    for version in (first.version_dir, second.version_dir):
        for name in shard_files(second if version == second.version_dir else first):
            assert stat.S_IMODE(os.stat(version / name).st_mode) == 0o444


def test_in_path_order_files_added_under_later_paths_leave_every_earlier_shard_linked(tmp_path: Path) -> None:
    # a day's new studies under names that sort last (a date folder, a rising accession number):
    # in key order they land anywhere in the split; in path order only the split's last shards change
    raw, out = tmp_path / "raw", tmp_path / "out"
    files = {f"2026-12-01/img{i:03d}.png": ("ab"[i % 2], "train", i) for i in range(24)}
    files.update({f"2026-12-01/val{i:03d}.png": ("ab"[i % 2], "valid", 100 + i) for i in range(4)})
    write_tree(raw, files)
    first = run_build(tmp_path, raw, out, order="path")
    files.update({f"2026-12-02/img{i:03d}.png": ("a", "train", 300 + i) for i in range(3)})
    write_tree(raw, files)
    second = run_build(tmp_path, raw, out, order="path")
    fresh = run_build(tmp_path, raw, tmp_path / "fresh", order="path")

    assert second.manifest["dataset_hash"] == fresh.manifest["dataset_hash"] != first.manifest["dataset_hash"]
    assert second.manifest["config"]["pack"]["order"] == "path"
    # every shard holds its samples in path order, and the splits' shards follow one another in it
    path_of = {make_sample_id("xray", rel): rel for rel in files}
    for split in ("train", "valid"):
        keys = [key for file in shard_files(second) if file.startswith(split)
                for key in shard_samples(second)[file]]
        assert [path_of[k] for k in keys] == sorted(rel for rel, (_, s, _) in files.items() if s == split)
    # every train shard of day one but its last is linked (content-defined ends: the last may grow
    # or split), valid is untouched, and nothing else is
    old_train = [f for f in shard_files(first) if f.startswith("train-")]
    unchanged = unchanged_shards(first, second)
    assert set(unchanged.values()) >= set(old_train[:-1]) | {f for f in shard_files(first) if f.startswith("valid-")}
    assert second.shards_reused == len(unchanged) >= len(old_train) and second.files_decoded == 3
    for new, old in unchanged.items():
        assert os.stat(second.version_dir / new).st_ino == os.stat(first.version_dir / old).st_ino, new
    # the default stays key order, and leaves the job's config (and so its version) as it was
    assert "order" not in load_job(write_job(tmp_path / "jobs" / "plain", job_doc(raw, out))).pack.to_json()


def test_the_new_version_verifies_with_every_older_version_deleted(
        grown: tuple[Path, BuildResult, dict[str, str], BuildResult]) -> None:
    tmp, first, _, second = grown
    assert second.shards_reused == len(unchanged_shards(first, second)) >= 4
    shutil.rmtree(first.version_dir)
    assert [p.name for p in second.version_dir.parent.iterdir()] == [second.version_dir.name]
    result = verify_dataset(second.version_dir, deep=True)
    assert result.ok, result.problems
    assert result.files_checked >= len(shard_files(second))
    # the same inputs once more, from the command line: the build cache now points into the new
    # version's linked files (day one is gone), so nothing is decoded; the summary says so
    job = tmp / "jobs" / "out" / "job.yaml"
    said = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "--quiet", "--no-report",
                                     "--cache-dir", str(tmp / "cache")])
    assert said.exit_code == 0, said.output
    total = sum((second.version_dir / f).stat().st_size for f in shard_files(second))
    count = len(shard_files(second))
    assert f"  decoded 0 of 26 files, wrote 0 of {count} shards (0 B), reused {count} ({human_bytes(total)})\n" \
        in said.output


def test_no_build_changes_an_earlier_versions_bytes_and_its_open_reader_reads_on(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_tree(raw, day_one())
    first = run_build(tmp_path, raw, out)
    before = folder_digest(first.version_dir)
    reader = iter(ShardDataset(first.manifest_path, "train", shuffle=False, verify="sample"))
    seen = [next(reader)["key"] for _ in range(3)]  # the reader holds train-000000 open

    write_tree(raw, day_two())
    second = run_build(tmp_path, raw, out)                 # links five of day one's shards
    again = run_build(tmp_path, raw, out)                  # the same inputs: nothing rewritten
    fresh = run_build(tmp_path, raw, out, fresh=True)      # the cache cleared: every file decoded again
    assert second.shards_reused == len(unchanged_shards(first, second)) >= 4
    assert again.reused and fresh.reused  # the version folder held that version already
    assert fresh.files_decoded == 26 and fresh.version_dir == second.version_dir
    write_tree(raw, day_one())
    back = run_build(tmp_path, raw, out)                   # day one's inputs again: day one's version
    assert back.version_dir == first.version_dir and back.reused

    seen += [item["key"] for item in reader]
    train = pq.read_table(first.version_dir / "_index.parquet", columns=["key", "split"]).to_pylist()
    assert seen == [row["key"] for row in train if row["split"] == "train"]
    assert folder_digest(first.version_dir) == before


def test_a_corrupted_earlier_shard_is_never_linked_and_is_written_anew(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_tree(raw, day_one())
    first = run_build(tmp_path, raw, out)
    write_tree(raw, day_two())  # which of day one's shards day two reuses: a fresh build elsewhere says
    reference = run_build(tmp_path, raw, tmp_path / "reference")
    write_tree(raw, day_one())
    unchanged = unchanged_shards(first, reference)
    damaged = first.version_dir / min(unchanged.values())
    recorded = next(s["sha256"] for s in first.manifest["splits"]["train"]["shards"] if s["file"] == damaged.name)
    os.chmod(damaged, 0o644)  # bit rot does not ask: flip one byte in place
    with open(damaged, "r+b") as fh:
        fh.seek(2000)
        byte = fh.read(1)
        fh.seek(2000)
        fh.write(bytes([byte[0] ^ 0x01]))
    capsys.readouterr()

    write_tree(raw, day_two())
    second = run_build(tmp_path, raw, out)
    warned = [line for line in capsys.readouterr().err.splitlines() if "not reused" in line]
    rewritten = second.version_dir / next(new for new, old in unchanged.items() if old == damaged.name)
    assert len(warned) == 1 and str(damaged) in warned[0] and f"{rewritten.name} was written" in warned[0]
    assert os.stat(rewritten).st_ino != os.stat(damaged).st_ino
    assert hashlib.sha256(rewritten.read_bytes()).hexdigest() == recorded  # the bytes it should have had
    assert second.shards_reused == len(unchanged) - 1  # the other unchanged ones
    assert verify_dataset(second.version_dir).ok
    assert not verify_dataset(first.version_dir).ok  # left as it was found: reported, never repaired in place


@pytest.mark.slow  # a subprocess build killed mid-pack, and a local dask cluster
def test_kill_9_during_an_incremental_build_then_a_rerun_gives_a_fresh_builds_bytes(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_tree(raw, day_one())
    first = run_build(tmp_path, raw, out)
    before = folder_digest(first.version_dir)
    write_tree(raw, day_two())
    job = write_job(tmp_path / "jobs" / out.name, job_doc(raw, out))
    exe = str(Path(sys.executable).with_name("packer"))
    proc = subprocess.Popen([exe, "build", str(job), "--scheduler", "sync", "--quiet", "--no-report",
                             "--cache-dir", str(tmp_path / "cache")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def linked_in_staging() -> bool:  # the new build has linked a shard of day one, not yet published
        return any(p.stat().st_nlink > 1 for p in out.glob("daily/.staging-*/*.tar") if p.exists())

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not linked_in_staging():
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert folder_digest(first.version_dir) == before
    # the complete shards of the new version (one being written is *.partial): how many links each
    staged = {p.name: p.stat().st_nlink for p in out.glob("daily/.staging-*/*.tar")}

    rerun = run_build(tmp_path, raw, out, scheduler=None, workers=2)  # and with two worker processes
    fresh = run_build(tmp_path, raw, tmp_path / "fresh")
    # it was killed in the pack pass, with some shards of the new version done and not all: one
    # linked from day one, and at least one written
    assert 1 in staged.values() and len(staged) < len(shard_files(fresh)), staged
    assert rerun.manifest["dataset_hash"] == fresh.manifest["dataset_hash"]
    assert rerun.shards_reused == len(unchanged_shards(first, fresh)) >= 4
    assert folder_digest(first.version_dir) == before
    assert sorted(p.name for p in out.joinpath("daily").iterdir()) == sorted(
        [first.version_dir.name, rerun.version_dir.name])  # no staging folder left


@pytest.mark.slow  # moto's S3 server
def test_on_a_store_unchanged_shards_are_copied_in_the_store_and_the_new_version_stands_alone(
        tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto[server] (the dev extra) runs the local S3 server")
    pytest.importorskip("s3fs", reason="s3fs (the s3 extra) reads s3:// URLs")
    from tests.s3_store import running_store

    raw = tmp_path / "raw"
    with running_store(tmp_path / "aws", "reuse") as store:
        write_tree(raw, day_one())
        first = run_build(tmp_path, raw, tmp_path / "unused", out="s3://reuse/datasets", work_dir=tmp_path / "work")
        write_tree(raw, day_two())
        second = run_build(tmp_path, raw, tmp_path / "unused", out="s3://reuse/datasets", work_dir=tmp_path / "work")
        assert first.published is not None and second.published is not None
        unchanged = unchanged_shards(first, second)
        assert sorted(second.published.copied) == sorted(unchanged) and len(unchanged) >= 4
        assert second.published.copied_bytes == sum(s["bytes"] for split in first.manifest["splits"].values()
                                                    for s in split["shards"] if s["file"] in unchanged.values())
        old = f"datasets/daily/{first.manifest['version']}/"
        listed = store.client.list_objects_v2(Bucket="reuse", Prefix=old)["Contents"]
        store.client.delete_objects(Bucket="reuse", Delete={"Objects": [{"Key": o["Key"]} for o in listed]})
        assert verify_dataset(second.published.url).ok
