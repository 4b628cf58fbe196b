"""A source without ``name:`` is named after its root folder as the job writes it: the last
segment of the written path (``..`` and ``.`` folded in), not of the folder a symlink on the way
points at. A ``data/photos -> ../store/snap_2024_12_01`` link (a "latest -> snapshot" layout)
named the source ``snap_2024_12_01`` when the root was written relative and ``photos`` when it
was written absolute; the name starts every sample key and member name, so repointing the link
at a byte-identical snapshot gave another dataset_hash for the same job and the same bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from packer.config import load_job
from packer.errors import ConfigError
from packer.pipeline.build import BuildOptions, build
from tests.photo_jobs import write_tree


def snapshot_layout(tmp_path: Path) -> Path:
    """``store/snap_2024_12_01`` and ``store/snap_2024_12_02``, one labelled photo tree copied
    twice, and ``data/photos`` linked to the first; returns the link."""
    for snap in ("snap_2024_12_01", "snap_2024_12_02"):
        (tmp_path / "store" / snap).mkdir(parents=True)
        write_tree(tmp_path / "store" / snap, count=12)
    (tmp_path / "data").mkdir()
    link = tmp_path / "data" / "photos"
    link.symlink_to(Path("..") / "store" / "snap_2024_12_01", target_is_directory=True)
    return link


def write_job(folder: Path, root: str, **source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "photos", "sources": [{"kind": "image", "root": root, "table": f"{root}/labels.csv", **source}],
        "split": {"by": "entity", "ratios": {"train": 0.5, "valid": 0.25, "test": 0.25}, "seed": 3},
        "transform": {"image": {"size": [16, 16], "color": "gray"}},
        "pack": {"format": "webdataset", "max_samples": 4}, "output": "../out"}, sort_keys=False))
    return job


@pytest.mark.parametrize("written", ["../data/photos", "../data/./photos/", "../jobs/../data/photos", "ABSOLUTE"])
def test_a_root_through_a_symlink_is_named_after_the_link_as_written_relative_or_absolute(
        tmp_path: Path, written: str) -> None:
    link = snapshot_layout(tmp_path)
    root = str(link) if written == "ABSOLUTE" else written
    source = load_job(write_job(tmp_path / "jobs", root)).sources[0]
    assert source.name == "photos"
    assert Path(source.root).resolve() == link.resolve()  # the files are still read where the link points


def test_a_root_with_no_name_of_its_own_is_named_after_the_folder_it_stands_for(tmp_path: Path) -> None:
    """``root: .`` and ``root: ..`` have no last segment of their own: the job's folder (or the
    one above it) names the source."""
    write_tree(tmp_path / "cases" / "photos", count=4)
    here = load_job(write_job(tmp_path / "cases" / "photos", ".")).sources[0]
    above = load_job(write_job(tmp_path / "cases" / "photos" / "jobs", "..")).sources[0]
    assert (here.name, above.name) == ("photos", "photos")


def test_repointing_a_linked_root_at_a_byte_identical_snapshot_keeps_the_dataset_hash(tmp_path: Path) -> None:
    link = snapshot_layout(tmp_path)
    job = write_job(tmp_path / "jobs", "../data/photos")
    built = []
    for snap in ("snap_2024_12_01", "snap_2024_12_02"):
        link.unlink()
        link.symlink_to(Path("..") / "store" / snap, target_is_directory=True)
        result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False, fresh=True))
        manifest = json.loads(Path(result.manifest_path).read_text())
        built.append((manifest["dataset_hash"], manifest["config"]["sources"][0]["name"]))
    assert built[0] == built[1]
    assert built[0][1] == "photos"


def test_a_linked_root_is_checked_for_a_patients_name_under_the_name_it_gives(tmp_path: Path) -> None:
    """Under ``phi: pseudonymize`` a default name that may identify a patient is refused; the
    name checked is the one written into every key: the link's, not its target's."""
    (tmp_path / "store" / "Doe^John").mkdir(parents=True)
    write_tree(tmp_path / "store" / "Doe^John", count=4)
    (tmp_path / "data").mkdir()
    os.symlink(Path("..") / "store" / "Doe^John", tmp_path / "data" / "photos", target_is_directory=True)
    os.symlink(Path("..") / "store" / "Doe^John", tmp_path / "data" / "Roe^Jane", target_is_directory=True)
    pseudonymize = {"phi": {"mode": "pseudonymize", "key_file": "k.key"}}
    assert load_job(add(write_job(tmp_path / "jobs", "../data/photos"), pseudonymize)).sources[0].name == "photos"
    with pytest.raises(ConfigError, match=r"its name defaults to its root folder's name, which may identify"):
        load_job(add(write_job(tmp_path / "jobs", "../data/Roe^Jane"), pseudonymize))


def add(job: Path, extra: dict) -> Path:
    job.write_text(yaml.safe_dump({**yaml.safe_load(job.read_text()), **extra}, sort_keys=False))
    return job
