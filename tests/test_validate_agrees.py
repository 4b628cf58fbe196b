"""packer validate agrees with packer build, or says where it cannot.

A check that passes where the build of the same job fails (exit 4) is worse than no check: CI
goes green and the build breaks later. Each test here plants the case on real files, runs the
build and the check, and holds the check to the build's verdict, or to saying (``skipped``,
``passed: null``) the part it could not judge.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import packer.pipeline.stages as stages
from packer.config import load_job
from packer.errors import LeakageError
from packer.pipeline.datacheck import format_summary, summary, validate_job
from tests.test_label_conflicts import _keys, _leakage, _mask_tree, _source
from tests.test_targets import _build, _job


def _scratch(work: Path) -> list[Path]:
    """What a check left in the work folder: its scratch folders (signatures, masks)."""
    return sorted(work.glob("packer-signatures-*")) if work.is_dir() else []


def _mask_job(tmp: Path, policy: str) -> Path:
    raw, _ = _mask_tree(tmp)
    source = {**_source(raw), "label": "none", "mask": {"column": "mask", "classes": [0, 1]}}
    return _job(tmp, [source], transform={"image": {}},
                split={"by": "entity", "ratios": {"train": 1.0}, "duplicates": {"label_conflict": policy}})


def test_full_validate_compares_masks_as_the_build_does_and_fails_where_it_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two byte-identical images whose masks draw different structures: the build compares the
    masks (its spill holds them) and fails under ``label_conflict: fail``; the full check must
    compare them too, count the same group, exit 4 and print the rule as failed, keeping the
    masks only for the run (its scratch folder is gone after)."""
    work = tmp_path / "work"
    monkeypatch.setenv("PACKER_WORK_DIR", str(work))
    job = _mask_job(tmp_path, "fail")
    keys = _keys(job)
    with pytest.raises(LeakageError):
        _build(job)
    built = next((tmp_path / "out").rglob("leakage.json"))
    built_rule = _leakage(built.parent)["rules"]["label_conflicts"]
    assert built_rule["masks_compared"] is True and built_rule["count"] == 1
    before = _scratch(work)

    result = validate_job(load_job(job), scheduler="sync", quiet=True)
    rule = summary(result)["audit"]["rules"]["label_conflicts"]
    assert rule["masks_compared"] is True
    assert rule["count"] == built_rule["count"] == 1 and rule["passed"] is False
    (finding,) = rule["findings"]
    assert {s["key"] for s in finding["samples"]} == {keys["img/0.png"], keys["img/copy_far.png"]}
    assert finding["mask_dice"] == built_rule["findings"][0]["mask_dice"]
    assert result.exit_code == LeakageError.exit_code == 4
    assert "[FAIL] label_conflicts: 1" in format_summary(result)
    assert _scratch(work) == before  # the masks lived for the run only


def test_full_validate_leaves_out_the_groups_drop_group_leaves_out(tmp_path: Path) -> None:
    """``label_conflict: drop_group``: the check leaves out the members the build leaves out."""
    job = _mask_job(tmp_path, "drop_group")
    keys = _keys(job)
    _build(job)
    result = validate_job(load_job(job), scheduler="sync", quiet=True)
    dropped = {e.sample_id for e in result.prepared.excluded if e.why == "label_conflict"}
    assert dropped == {keys["img/0.png"], keys["img/copy_far.png"]}
    assert result.exit_code == 0


def test_the_masks_scratch_is_removed_when_the_check_stops_midway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt while the masks are compared (Ctrl-C) leaves no scratch folder behind."""
    work = tmp_path / "work"
    monkeypatch.setenv("PACKER_WORK_DIR", str(work))
    job = _mask_job(tmp_path, "fail")
    seen: list[list[Path]] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        seen.append(sorted(p for folder in _scratch(work) for p in folder.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(stages, "find_label_conflicts", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate_job(load_job(job), scheduler="sync", quiet=True)
    assert seen and any(p.name.endswith(".masks") for p in seen[0])  # the masks were there while compared
    assert _scratch(work) == []
