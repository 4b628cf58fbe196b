"""Time splits end to end: records an entity leaves after a cutoff, and which splits hold what.

Every test builds a small real tree of PNGs (OpenCV) with a table path,label,entity,timestamp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.badsamples import read_bad_samples
from packer.config import load_job
from packer.exclusions import read_excluded
from packer.pipeline.build import BuildOptions, BuildResult, build, check_bad_fraction
from tests.helpers import write_job

CUTOFFS = {"valid": "2024-01-01", "test": "2024-07-01"}


def photo(seed: int) -> np.ndarray:
    """A textured colour image, different for every seed (no two are near copies)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    return cv2.GaussianBlur(cv2.resize(small, (128, 96), interpolation=cv2.INTER_CUBIC), (5, 5), 0)


def write_tree(folder: Path, records: list[tuple[str, str]]) -> Path:
    """One PNG per (entity, date) at ``<entity>/<date>.png`` and its table row; returns the root."""
    raw = folder / "raw"
    lines = ["path,label,entity,timestamp"]
    for i, (entity, date) in enumerate(records):
        rel = f"{entity}/{date}.png"
        (raw / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(raw / rel), photo(i))
        lines.append(f"{rel},{'ab'[i % 2]},{entity},{date}")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    return raw


def build_job(folder: Path, split: dict[str, Any], **settings: Any) -> BuildResult:
    doc = {"name": "timed", "sources": [{"name": "photos", "kind": "image", "root": "raw", "table": "raw/labels.csv"}],
           "split": split, "transform": {"image": {"size": [32, 32]}}, "pack": {"format": "webdataset"},
           "output": "out", **settings}
    return build(load_job(write_job(folder, doc)), BuildOptions(scheduler="sync", quiet=True))


def test_straddlers_dropped_on_purpose_are_excluded_files_not_bad_samples(tmp_path: Path) -> None:
    # Four of ten files are records of entities seen before a cutoff and again after it: 40% of
    # the inputs, far over max_bad_fraction 5%. drop_straddlers leaves them out by design, so the
    # build succeeds and lists them in excluded.jsonl; they counted as bad samples and failed it.
    records = [("A", "2023-02-01"), ("A", "2024-02-01"), ("A", "2024-08-01"),
               ("B", "2023-03-01"), ("B", "2024-09-01"),
               ("C", "2024-02-01"), ("C", "2024-10-01"),
               ("D", "2023-04-01"), ("E", "2024-03-01"), ("F", "2024-11-01")]
    write_tree(tmp_path, records)
    result = build_job(tmp_path, {"by": "time", "cutoffs": CUTOFFS, "entity_policy": "drop_straddlers"},
                       validate={"max_bad_fraction": 0.05})
    assert not result.over_threshold
    check_bad_fraction(result)  # the CLI's exit 3 check: it passes
    assert read_bad_samples(result.version_dir / "bad_samples.jsonl") == []
    excluded = read_excluded(result.version_dir / "excluded.jsonl")
    assert sorted((Path(e["path"]).relative_to(tmp_path / "raw").as_posix(), e["why"], e["stage"])
                  for e in excluded) == [("A/2024-02-01.png", "straddles_cutoff", "split"),
                                         ("A/2024-08-01.png", "straddles_cutoff", "split"),
                                         ("B/2024-09-01.png", "straddles_cutoff", "split"),
                                         ("C/2024-10-01.png", "straddles_cutoff", "split")]
    assert all("drop_straddlers" in e["detail"] for e in excluded)
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["inputs"]["files"] == 10 and manifest["inputs"]["samples"] == 6
    assert manifest["inputs"]["excluded"] == {"straddles_cutoff": 4}
    assert manifest["bad_samples"]["total"] == 0 and manifest["bad_samples"]["fraction"] == 0
    assert {s: manifest["splits"][s]["samples"] for s in ("train", "valid", "test")} == {
        "train": 3, "valid": 2, "test": 1}


def test_a_copy_left_out_as_a_straddler_says_its_group_placed_it_and_leaves_the_audit(tmp_path: Path) -> None:
    """XCOPY's only record (2024-11, test) is an exact copy of P0's image (2023, train): the copy
    group went to train and the copy was left out. Its record said "its entity's first record put
    it in train" (XCOPY's only record is in test), and duplicates_span_entities still listed it,
    with split None, though the audit is of the final assignment."""
    raw = write_tree(tmp_path, [("P0", "2023-02-01"), ("P1", "2023-03-01"), ("P2", "2024-09-01")])
    (raw / "XCOPY").mkdir()
    (raw / "XCOPY" / "2024-11-11.png").write_bytes((raw / "P0" / "2023-02-01.png").read_bytes())
    with (raw / "labels.csv").open("a") as fh:
        fh.write("XCOPY/2024-11-11.png,a,XCOPY,2024-11-11\n")
    result = build_job(tmp_path, {"by": "time", "cutoffs": CUTOFFS, "entity_policy": "drop_straddlers",
                                  "balance": {"accept": True}})  # four files: one group is a large share
    (left,) = read_excluded(result.version_dir / "excluded.jsonl")
    assert left["path"].endswith("XCOPY/2024-11-11.png") and left["why"] == "straddles_cutoff"
    assert "the first record of its split group (its entity and 1 other entity whose images" in left["detail"]
    leakage = json.loads((result.version_dir / "leakage.json").read_text())
    span = leakage["rules"]["duplicates_span_entities"]
    assert span["count"] == 0 and not span.get("findings"), span


def test_a_time_split_records_its_cutoffs_and_no_ratios_it_never_asked_for(tmp_path: Path) -> None:
    """Ratios under by: time are a config error, yet the manifest's config and the audit's
    split_balance recorded the schema's 0.8/0.1/0.1 as the split's request beside shares the dates
    made (1/3 each here)."""
    write_tree(tmp_path, [("A", "2023-02-01"), ("B", "2024-02-01"), ("C", "2024-08-01")])
    result = build_job(tmp_path, {"by": "time", "cutoffs": CUTOFFS})
    manifest = json.loads(result.manifest_path.read_text())
    assert "ratios" not in manifest["config"]["split"] and manifest["config"]["split"]["cutoffs"] == CUTOFFS
    leakage = json.loads((result.version_dir / "leakage.json").read_text())
    balance = leakage["rules"]["split_balance"]
    assert "requested" not in balance and balance["cutoffs"] == CUTOFFS
    assert balance["shares"] == {"train": 0.3333, "valid": 0.3333, "test": 0.3333}
