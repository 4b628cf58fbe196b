"""Blank samples (every pixel one value) are not duplicate evidence.

Pathology slides tiled with ``transform.image.tile`` give many tiles of plain background, white
on every slide. Those tiles have identical packed pixels, but they show no tissue: two slides of
two patients sharing a white tile are not copies of one image. They must not join the patients
into one split group (which collapses the split and fails the build's balance audit), nor make a
label conflict, nor be an exact duplicate across splits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from packer.config import load_job
from packer.pipeline.build import BuildOptions, build
from packer.pipeline.dedup import exact_groups, is_blank
from tests.helpers import write_job


def _slide(path: Path, seed: int, background: tuple[int, int, int] = (255, 255, 255)) -> None:
    """A 64×64 RGB 'slide': tissue (a random smooth field) in the top-left 32×32 quarter, plain
    ``background`` (BGR; pure white by default) elsewhere, so three of its four 32×32 tiles are blank."""
    rng = np.random.default_rng(seed)
    slide = np.empty((64, 64, 3), np.uint8)
    slide[:] = background
    tissue = cv2.resize(rng.integers(0, 200, (4, 4, 3)).astype(np.float32), (32, 32), interpolation=cv2.INTER_CUBIC)
    slide[:32, :32] = np.clip(tissue, 0, 254).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), slide)


def _labelled_job(tmp_path: Path, name: str, rows: list[str], split: dict[str, Any],
                  image: dict[str, Any]) -> Path:
    """A job over the photos under ``tmp_path/raw`` with the label table ``rows`` (after the
    header ``path,label,entity``), split by entity as ``split`` adds to, transformed by ``image``."""
    raw = tmp_path / "raw"
    (raw / "labels.csv").write_text("\n".join(["path,label,entity", *rows]) + "\n")
    return write_job(tmp_path / "job", {
        "name": name,
        "sources": [{"kind": "image", "root": str(raw), "table": str(raw / "labels.csv")}],
        "split": {"by": "entity", **split},
        "transform": {"image": {"color": "rgb", **image}},
        "pack": {"format": "webdataset"}, "output": str(tmp_path / "out")})


def test_blank_samples_form_no_exact_duplicate_group() -> None:
    assert exact_groups(["a", "a", "b", "b"], blank=[True, True, False, False]) == [[2, 3]]
    assert exact_groups(["a", "a", "a"], blank=[True, False, False]) == [[1, 2]]


@pytest.mark.parametrize("background", [(255, 255, 255), (240, 232, 236), (200, 120, 160)])
def test_white_background_tiles_do_not_join_slides_of_different_patients(tmp_path: Path,
                                                                        background: tuple[int, int, int]) -> None:
    """White, and tinted (a stained slide's background is rarely grey): a tile of one colour
    shows nothing whatever the colour (a walkthrough's tinted tiles joined eight patients)."""
    rows = []
    for i in range(10):
        _slide(tmp_path / "raw" / f"slide{i}.png", i, background)
        rows.append(f"slide{i}.png,{('normal', 'tumor')[i % 2]},patient{i}")
    job = _labelled_job(tmp_path, "slides", rows, {"ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 17},
                        {"tile": {"size": [32, 32]}})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    manifest = json.loads(Path(result.manifest_path).read_text())
    # every slide gives 4 tiles (3 blank), all packed; the patients are placed one by one, as if
    # the blank tiles were not there, not as one group of all ten
    splits = {name: split["samples"] for name, split in manifest["splits"].items()}
    assert sum(splits.values()) == 40
    assert len([n for n in splits.values() if n]) > 1, splits
    leakage = json.loads((Path(result.manifest_path).parent / "leakage.json").read_text())
    rules = leakage["rules"]
    for rule in ("exact_duplicates_across_splits", "exact_duplicates_within_split", "duplicates_span_entities",
                 "label_conflicts", "split_balance"):
        assert rules.get(rule, {"count": 0})["count"] == 0, (rule, rules.get(rule))


def _dark_slide(path: Path, seed: int) -> None:
    """A 64×64 RGB photo on a black border that is not quite constant: the same faint pattern of
    0-2 (a JPEG's flat blocks, a camera's dark noise) on every photo, and a different textured
    subject in the top-left 32×32 quarter of each."""
    background = np.random.default_rng(12345).integers(0, 3, (64, 64, 3)).astype(np.uint8)
    photo = background.copy()
    tissue = cv2.resize(np.random.default_rng(seed).integers(0, 250, (8, 8, 3)).astype(np.float32), (32, 32),
                        interpolation=cv2.INTER_CUBIC)
    photo[:32, :32] = np.clip(tissue, 10, 250).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), photo)


def test_nearly_blank_tiles_shared_by_photos_of_different_patients_do_not_join_them(tmp_path: Path) -> None:
    """Dark border tiles whose values span 2 levels of 255 show nothing, yet are byte-identical
    across photos whose borders carry the same faint pattern: they joined every patient into one
    exact-duplicate group (all in one split, a label conflict across patients)."""
    assert is_blank(np.array([[0, 1], [2, 2]], np.uint8))  # 2 of 255 levels: nothing to see
    assert not is_blank(np.array([[0, 1], [3, 2]], np.uint8))
    assert not is_blank(np.array([[0, 1], [2, 2]], np.int16))  # 2 HU apart is data, not a blank
    tinted = np.empty((3, 4, 4), np.uint8)
    tinted[:] = np.array([240, 232, 236], np.uint8)[:, None, None]  # one colour: each channel flat
    assert is_blank(tinted) and is_blank(tinted.astype(np.float32))
    tinted[1, 2, 2] += 3  # one pixel 3 levels off in one channel: something to see
    assert not is_blank(tinted)
    rows = []
    for i in range(10):
        _dark_slide(tmp_path / "raw" / f"photo{i}.png", i)
        rows.append(f"photo{i}.png,{('normal', 'tumor')[i % 2]},patient{i}")
    job = _labelled_job(tmp_path, "photos", rows, {"ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 17},
                        {"tile": {"size": [32, 32]}})
    result = build(load_job(job), BuildOptions(scheduler="sync", quiet=True, html_report=False))
    manifest = json.loads(Path(result.manifest_path).read_text())
    splits = {name: split["samples"] for name, split in manifest["splits"].items()}
    assert sum(splits.values()) == 40
    assert len([n for n in splits.values() if n]) > 1, splits
    rules = json.loads((Path(result.manifest_path).parent / "leakage.json").read_text())["rules"]
    for rule in ("exact_duplicates_within_split", "duplicates_span_entities", "label_conflicts"):
        assert rules.get(rule, {"count": 0})["count"] == 0, (rule, rules.get(rule))

def test_a_collapsed_split_is_named_by_a_copy_pair_across_entities_not_two_copies_of_one(tmp_path: Path) -> None:
    """An exact group of two copies in one patient's files and one in another's joins the two
    patients; the split_balance finding names a pair that shows the join (two entities), not the
    group's first two members (two copies of one patient)."""
    from click.testing import CliRunner

    from packer.cli import main

    raw = tmp_path / "raw"
    rows = []
    for i in range(8):
        _slide(raw / f"s{i}.png", 100 + i)
        rows.append(f"s{i}.png,normal,patient{i}")
    # one image: twice in patient A's files, once in patient B's (the names make A's two copies the
    # group's first two members in key order: raw-17ed…, raw-1e6f…, then b.png's raw-5f59…)
    for name in ("a5.png", "a28.png", "b.png"):
        _slide(raw / name, 7)
    rows += ["a5.png,normal,patientA", "a28.png,normal,patientA", "b.png,normal,patientB"]
    job = _labelled_job(tmp_path, "copies", rows, {"ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 3,
                                                   "balance": {"max_group_share": 0.2, "accept": True}},
                        {"size": [32, 32]})
    out = tmp_path / "validate.json"
    run = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q", "--json", str(out)])
    assert run.exit_code == 0, run.output
    (finding,) = json.loads(out.read_text())["audit"]["rules"]["split_balance"]["findings"]
    exact = [f for f in finding["formed_by"] if f["kind"] == "exact"]
    assert exact and all(f["a"]["entity_id"] != f["b"]["entity_id"] for f in exact), exact


def _placeholder_job(tmp_path: Path, split: dict[str, object] | None = None) -> Path:
    """20 patients with an image of their own each, and one image (a shared placeholder) filed
    under 12 of them: exact copies that join those 12 into one split group."""
    raw = tmp_path / "raw"
    rows = []
    for i in range(20):
        _slide(raw / f"own{i}.png", 100 + i)
        rows.append(f"own{i}.png,normal,patient{i:02d}")
    for i in range(12):
        _slide(raw / f"shared{i}.png", 7)
        rows.append(f"shared{i}.png,normal,patient{i:02d}")
    return _labelled_job(tmp_path, "shared", rows, {"ratios": {"train": 0.8, "valid": 0.1, "test": 0.1}, "seed": 1,
                                                    **(split or {})}, {"size": [32, 32]})


def test_a_split_collapsed_by_exact_copies_counts_a_link_per_joined_entity_and_says_how_to_fix_it(
        tmp_path: Path) -> None:
    """One image filed under 12 patients (a shared placeholder) joins them by exact copies alone,
    with the near-copy search off: the failure names 11 links (one per entity joined to the
    first), and its fix is about the copies, not the near-copy settings, which cannot part them."""
    from click.testing import CliRunner

    from packer.cli import main

    job = _placeholder_job(tmp_path, {"near_duplicates": {"enabled": False}})
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert run.exit_code == 4, run.output
    assert "of 12 entities" in run.output and "joined by 11 duplicate link(s)" in run.output, run.output
    assert "near_duplicates.min_score" not in run.output
    assert "remove the exact copies shared by several entities" in run.output
    (finding,) = json.loads((tmp_path / "out" / "shared" / "leakage.json").read_text())["rules"][
        "split_balance"]["findings"]
    assert finding["links"] == 11 and {f["kind"] for f in finding["formed_by"]} == {"exact"}
    assert len({f["b"]["entity_id"] for f in finding["formed_by"]}) == 11


def test_exact_copies_the_near_copy_search_also_pairs_are_called_exact_copies_in_a_collapsed_split(
        tmp_path: Path) -> None:
    """The same 12 copies with the near-copy search on (the default): it pairs them too, score
    1.00. Counted as near links, those pairs sorted first and filled the listed links, so the
    failure showed only "score 1.00" links and advised raising near_duplicates.min_score, which
    cannot part identical pixels. A pair that is an exact copy is the exact copy, and the fix is
    decided by every link, not by the listed ones."""
    from click.testing import CliRunner

    from packer.cli import main

    job = _placeholder_job(tmp_path)
    run = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert run.exit_code == 4, run.output
    assert "joined by 11 duplicate link(s) (exact copies)" in run.output, run.output
    assert "identical pixels" in run.output and "score 1.00" not in run.output
    assert "near_duplicates.min_score" not in run.output
    assert "remove the exact copies shared by several entities" in run.output
    leakage = json.loads((tmp_path / "out" / "shared" / "leakage.json").read_text())
    assert leakage["rules"]["near_duplicates_across_splits"]["links"] > 0  # the search did pair them
    (finding,) = leakage["rules"]["split_balance"]["findings"]
    assert finding["exact_links"] == 11 and finding["near_links"] == 0 and finding["links"] == 11
    assert {f["kind"] for f in finding["formed_by"]} == {"exact"}
    checked = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"])
    assert checked.exit_code == 4 and "joined by 11 duplicate link(s) (exact copies)" in checked.output, checked.output


def test_a_failed_audits_leakage_json_beside_the_versions_goes_once_a_build_passes(tmp_path: Path) -> None:
    """The exit-4 message sends the user to OUT/NAME/leakage.json; once the cause is gone (here the
    collapse accepted) and a build passes, that file, whose findings are no longer the build's, is
    removed, not left to read as a failure forever (the version's own leakage.json says what holds)."""
    from click.testing import CliRunner

    from packer.cli import main

    job = _placeholder_job(tmp_path)
    stale = tmp_path / "out" / "shared" / "leakage.json"
    failed = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert failed.exit_code == 4 and str(stale) in failed.output.replace("\n", ""), failed.output
    assert json.loads(stale.read_text())["passed"] is False
    job = _placeholder_job(tmp_path, {"balance": {"accept": True}})  # the same tree, the collapse accepted
    passed = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    assert passed.exit_code == 0, passed.output
    assert not stale.exists()
    (version,) = [p for p in stale.parent.iterdir() if (p / "manifest.json").exists()]
    assert (version / "leakage.json").exists()
