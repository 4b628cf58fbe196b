"""packer build end to end on the generated demo tree: planted defects, hashes, formats."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.dataset as pads
import pytest
import webdataset as wds

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.pipeline.build import BuildOptions, BuildResult, build
from packer.schemas import load_schema
from tests.helpers import demo_job_doc, write_job


def run(demo_raw: Any, tmp_path: Path, *, scheduler: str | None = "sync", workers: int | None = None,
        **overrides: Any) -> BuildResult:
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out", **overrides)))
    return build(job, BuildOptions(scheduler=scheduler, workers=workers, quiet=True))


@pytest.fixture(scope="module")
def demo_build(demo_raw: Any, tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    return run(demo_raw, tmp_path_factory.mktemp("build"))


def shard_digests(result: BuildResult) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(result.version_dir.iterdir())
            if p.suffix in {".tar", ".parquet"} and p.name.split("-")[0] in ("train", "valid", "test")}


def test_every_planted_defect_is_reported_under_its_reason_and_nothing_else(demo_raw: Any,
                                                                            demo_build: BuildResult) -> None:
    records = read_bad_samples(demo_build.version_dir / "bad_samples.jsonl")
    found = {str(Path(r["path"]).relative_to(demo_raw.root)): r["reason"] for r in records}
    assert found == {d.relpath: d.reason for d in demo_raw.defects}
    validator = jsonschema.Draft202012Validator(load_schema("bad_sample"))
    for record in records:
        validator.validate(record)
        assert record["message"]


def test_manifest_is_valid_and_agrees_with_the_files(demo_raw: Any, demo_build: BuildResult) -> None:
    manifest = json.loads(demo_build.manifest_path.read_text())
    jsonschema.Draft202012Validator(load_schema("manifest")).validate(manifest)
    assert demo_build.version_dir.name == manifest["version"] == manifest["dataset_hash"][:12]
    digests = shard_digests(demo_build)
    listed = {s["file"]: s for split in manifest["splits"].values() for s in split["shards"]}
    assert set(listed) == set(digests)
    for name, entry in listed.items():
        assert entry["sha256"] == digests[name]
        assert entry["bytes"] == (demo_build.version_dir / name).stat().st_size
    total = sum(s["samples"] for s in manifest["splits"].values())
    assert total == manifest["inputs"]["samples"] == manifest["index"]["rows"]
    assert manifest["bad_samples"]["total"] == len(demo_raw.defects)
    assert manifest["bad_samples"]["by_reason"] == dict(sorted(
        {r: sum(d.reason == r for d in demo_raw.defects) for r in {d.reason for d in demo_raw.defects}}.items()))
    assert manifest["sample_schema"]["dtype"] == "uint8"
    assert set(manifest["label_map"]) >= {"normal", "nodule"}
    assert manifest["audit"]["passed"] is True
    assert all(manifest["splits"][s]["samples"] > 0 for s in ("train", "valid", "test"))


def test_no_entity_is_in_two_splits(demo_build: BuildResult) -> None:
    seen: dict[str, str] = {}
    for tar in sorted(demo_build.version_dir.glob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False).decode():
            info = sample["json"]
            assert seen.setdefault(info["entity_id"], info["split"]) == info["split"]
            assert tar.name.startswith(info["split"])


def test_stock_webdataset_reads_the_demo_as_chw_uint8(demo_build: BuildResult) -> None:
    manifest = demo_build.manifest
    inverse = {v: k for k, v in manifest["label_map"].items()}
    count, own_window = 0, []
    for tar in sorted(demo_build.version_dir.glob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False).decode():
            image = sample["npy"]
            # transform.channels: 3 makes every sample 3×64×64
            assert image.dtype.name == "uint8" and image.shape == (3, 64, 64)
            if sample["json"]["kind"] == "dicom":  # a channel per window (lung, mediastinum, bone_body), the CR its own
                metadata = sample["json"]["metadata"]
                windows = metadata["windows"]
                assert len(windows) in (1, 3)
                if len(windows) == 1:           # replicated to 3 channels, and says so
                    assert metadata["channels"] == {"from": 1, "rule": "replicate"}
                    assert (image == image[:1]).all()
                    own_window.append((windows[0]["center"], windows[0]["width"]))
            assert inverse[sample["cls"]] == sample["json"]["label"]
            count += 1
    assert count == manifest["inputs"]["samples"]
    assert own_window == [(2048, 4096)]  # the demo's MONOCHROME1 CR, by transform.dicom.modality_windows


@pytest.mark.slow  # a real dask cluster
def test_same_inputs_give_the_same_hash_and_bytes_whatever_the_workers(demo_raw: Any, demo_build: BuildResult,
                                                                       tmp_path: Path) -> None:
    again = run(demo_raw, tmp_path, scheduler=None, workers=2)
    assert again.manifest["dataset_hash"] == demo_build.manifest["dataset_hash"]
    assert shard_digests(again) == shard_digests(demo_build)
    index = "_index.parquet"
    assert (again.version_dir / index).read_bytes() == (demo_build.version_dir / index).read_bytes()


def test_rebuilding_an_existing_version_is_a_no_op(demo_raw: Any, tmp_path: Path) -> None:
    first = run(demo_raw, tmp_path)
    stamp = first.manifest_path.stat().st_mtime_ns
    second = run(demo_raw, tmp_path)
    assert second.reused and not first.reused
    assert second.manifest_path.stat().st_mtime_ns == stamp
    assert not list((tmp_path / "out" / "demo").glob(".staging-*"))


def test_config_change_changes_the_hash(demo_raw: Any, demo_build: BuildResult, tmp_path: Path) -> None:
    other = run(demo_raw, tmp_path, split={"by": "entity", "ratios": {"train": 0.8, "valid": 0.1, "test": 0.1},
                                            "seed": 18})
    assert other.manifest["dataset_hash"] != demo_build.manifest["dataset_hash"]


def test_parquet_shards_read_with_pyarrow(demo_raw: Any, tmp_path: Path) -> None:
    result = run(demo_raw, tmp_path, pack={"format": "parquet", "max_samples": 32})
    files = sorted(str(p) for split in ("train", "valid", "test")
                   for p in result.version_dir.glob(f"{split}-*.parquet"))
    table = pads.dataset(files, format="parquet").to_table()
    assert table.num_rows == result.manifest["inputs"]["samples"]
    row = table.slice(0, 1).to_pylist()[0]
    assert len(row["image"]) == row["shape"][0] * row["shape"][1] * row["shape"][2]
    assert hashlib.sha256(row["image"]).hexdigest() == row["sha256"]


def test_time_split_keeps_time_order_per_entity(demo_raw: Any, tmp_path: Path) -> None:
    result = run(demo_raw, tmp_path, split={"by": "time", "cutoffs": {"valid": "2024-03-01", "test": "2024-09-01"}})
    audit = result.manifest["audit"]
    assert audit["passed"] and audit["rules"]["entity_overlap"]["count"] == 0
    assert sum(s["samples"] for s in result.manifest["splits"].values()) == result.manifest["inputs"]["samples"]


def test_a_second_build_reuses_the_cache_and_decodes_only_changed_files(demo_raw: Any, tmp_path: Path) -> None:
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(demo_raw.root, raw)
    job = load_job(write_job(tmp_path / "job", demo_job_doc(raw, tmp_path / "out")))
    first = build(job, BuildOptions(scheduler="sync", quiet=True))
    assert first.files_decoded == first.manifest["inputs"]["files"] - 1  # the missing file is never decoded
    again = build(job, BuildOptions(scheduler="sync", quiet=True))
    assert again.files_decoded == 0 and again.manifest["dataset_hash"] == first.manifest["dataset_hash"]
    photo = next(raw.glob("photos/*/01.png"))
    photo.write_bytes(photo.read_bytes())  # same bytes, new mtime: that chunk is redone, nothing else
    third = build(job, BuildOptions(scheduler="sync", quiet=True))
    assert 1 <= third.files_decoded < 130 and third.manifest["dataset_hash"] == first.manifest["dataset_hash"]


def test_a_declared_label_list_fixes_the_label_map(demo_raw: Any, tmp_path: Path) -> None:
    labels = ["square", "circle", "nodule", "normal"]
    result = run(demo_raw, tmp_path, labels=labels)
    assert result.manifest["label_map"] == {name: i for i, name in enumerate(labels)}
    assert result.manifest["config"]["labels"] == labels


def test_tar_members_sit_in_the_order_the_readme_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README said "Members sorted", but `<key>.npy` precedes `<key>.mask.npy` and a -dupN
    key's members follow its base key's (neither is name order, which `tar -t | sort -c`
    checks): samples in key order, each sample's members together in the order the checksum
    hashes them. The README now says so; this holds the shards to it."""
    import re
    import tarfile

    import cv2
    import numpy as np

    from packer.pipeline import discover as discovering
    from packer.shards.members import MEMBER_EXTENSIONS
    from tests.demo_version import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tar_section = readme[readme.index("- **WebDataset tar**"):readme.index("- **Parquet**")]
    assert "Members sorted" not in tar_section
    stated = re.search(r"together in the order ((?:`[a-z_.]+`, )+`[a-z_.]+`)", tar_section)
    assert stated is not None and re.findall(r"`([a-z_.]+)`", stated.group(1)) == list(MEMBER_EXTENSIONS)
    root = tmp_path / "raw"
    (root / "m").mkdir(parents=True)
    rows = ["path,mask,entity,timestamp"]
    for i in range(6):
        cv2.imwrite(str(root / f"{i}.png"), np.random.default_rng(i).integers(0, 256, (16, 16), dtype=np.uint8))
        cv2.imwrite(str(root / "m" / f"{i}.png"), (np.arange(256).reshape(16, 16) % 2).astype(np.uint8))
        rows.append(f"{i}.png,m/{i}.png,P{i},2024-01-0{i + 1}")
    (root / "t.csv").write_text("\n".join(rows) + "\n")
    made = discovering.make_sample_id
    monkeypatch.setattr(discovering, "make_sample_id",  # files 0 and 1 collide: 1 becomes <0's key>-dup2
                        lambda source, relpath, phi=None: made(source, relpath.replace("1.png", "0.png"), phi))
    job = write_job(tmp_path, {"name": "order", "sources": [{
        "kind": "image", "root": str(root), "table": str(root / "t.csv"), "label": "none",
        "mask": {"column": "mask", "classes": [0, 1]}}], "split": {"by": "entity", "ratios": {"train": 1.0}},
        "transform": {"image": {"size": [16, 16], "color": "gray"}}, "pack": {"format": "webdataset"},
        "output": str(tmp_path / "out"), "phi": {"mode": "keep"}})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    (shard,) = sorted(result.version_dir.glob("*.tar"))
    names = tarfile.open(shard).getnames()
    keys = list(dict.fromkeys(name.split(".", 1)[0] for name in names))
    assert keys == sorted(keys) and any(key.endswith("-dup2") for key in keys)
    assert names == [f"{key}.{ext}" for key in keys for ext in ("json", "npy", "mask.npy")]
    assert names != sorted(names)  # not name order: .npy before .mask.npy


def test_a_build_cache_removed_mid_build_is_a_file_system_error_naming_it(
        demo_raw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cleaner empties the work folder while the build runs: the pack pass finds no spill file.
    That is no packer bug (exit 1, a traceback) but a FileSystemError (exit 6) naming the removed
    folder and the fix: rerun, and keep the cache on a folder that persists."""
    import shutil

    import packer.pipeline.stages as stages
    from packer.errors import FileSystemError

    real = stages.pack_shards

    def after_a_cleaner(shards: Any, samples: Any, executor: Any, target: Any, cache_dir: Path,
                        *args: Any, **kwargs: Any) -> Any:
        shutil.rmtree(tmp_path / "work")
        return real(shards, samples, executor, target, cache_dir, *args, **kwargs)

    monkeypatch.setattr(stages, "pack_shards", after_a_cleaner)
    job = load_job(write_job(tmp_path / "job", demo_job_doc(demo_raw.root, tmp_path / "out")))
    with pytest.raises(FileSystemError) as caught:
        build(job, BuildOptions(scheduler="sync", quiet=True, work_dir=tmp_path / "work"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'work'}, which held the build cache {tmp_path / 'work'}/")
    assert "was removed while the build ran" in message and "run the build again" in message
    assert "--cache-dir" in message and "PACKER_WORK_DIR" in message
    assert caught.value.exit_code == 6
