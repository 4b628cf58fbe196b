"""packer validate writes no bad_samples.jsonl and no excluded.jsonl: its lists of bad samples and
of files left out on purpose are parts of its report (``--json``'s ``bad_samples.records`` and
``excluded.records``; README, "validate writes no excluded.jsonl, and its line says the list is
the report's"). Every warning validate prints, and keeps in the report's ``warnings``, must send the
user to those records, never to a file it did not write; a build's warnings still name its files."""
from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from packer.cli import main
from packer.config import load_job
from packer.pipeline.datacheck import validate_job
from packer.pipeline.stages import BUILD_LISTINGS, VALIDATE_LISTINGS
from tests.test_dicom_masks import RTSTRUCT_ROIS, SEGMENTS, _annotated_tree, _mask_job, add_degenerate_contour

FILES = ("bad_samples.jsonl", "excluded.jsonl")


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.random.default_rng(seed).integers(0, 255, (16, 16), dtype=np.uint8))


def _job(folder: Path, source: dict[str, object], split: dict[str, object], **extra: object) -> Path:
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "t", "sources": [{"kind": "image", "root": "raw", **source}], "split": split,
        "transform": {"image": {"size": [16, 16], "color": "gray"}}, "pack": {"format": "webdataset"},
        "output": "out", **extra}, sort_keys=False))
    return job


def _validate_cli(job: Path, folder: Path) -> tuple[str, list[str]]:
    """The stderr of ``packer validate JOB --json`` and the messages of its report's warnings."""
    report = folder / "v.json"
    run = CliRunner().invoke(main, ["validate", str(job), "--quick", "--scheduler", "sync", "-q", "--json",
                                    str(report)], env={"PACKER_WORK_DIR": str(folder / "work")})
    assert run.exit_code in (0, 3, 4), run.output
    assert not any(list(folder.rglob(name)) for name in FILES)  # the premise: validate writes neither
    return run.stderr, [w["message"] for w in json.loads(report.read_text())["warnings"]]


def _listed_split(folder: Path) -> Path:
    """A by: list split over 20 PNGs of 10 patients, whose train list names one empty PNG (a bad
    sample) and one file a where: leaves out."""
    rows = []
    for i in range(20):
        rel = f"P{i // 2:02d}/img{i:02d}.png"
        _png(folder / "raw" / rel, i)
        rows.append(f"{rel},{'ab'[i % 2]},P{i // 2:02d},{'PA' if i != 3 else 'AP'}")
    (folder / "raw/P00/img00.png").write_bytes(b"")  # one bad sample, within the limit
    (folder / "raw/labels.csv").write_text("path,label,entity,view\n" + "\n".join(rows) + "\n")
    paths = [r.split(",")[0] for r in rows]
    (folder / "train.txt").write_text("\n".join(paths[:16]) + "\n")
    (folder / "test.txt").write_text("\n".join(paths[16:]) + "\n")
    return _job(folder, {"table": "raw/labels.csv", "where": {"view": "PA"}},
                {"by": "list", "lists": {"train": "train.txt", "test": "test.txt"}, "seed": 0},
                validate={"max_bad_fraction": 0.2})


def test_a_split_list_naming_a_bad_or_left_out_file_points_validate_at_its_reports_records(tmp_path: Path) -> None:
    stderr, warnings = _validate_cli(_listed_split(tmp_path), tmp_path)
    refused = next(w for w in warnings if "refused as a bad sample" in w)
    left_out = next(w for w in warnings if "items name files left out as filtered" in w)
    assert refused.endswith("not packed: the validate report's bad_samples.records lists each with its reason and fix")
    assert left_out.endswith("not packed, and not bad samples: the validate report's excluded.records lists each "
                             "with why")
    for said in (stderr, *warnings):
        assert not any(name in said for name in FILES), said


def test_a_split_list_naming_a_bad_or_left_out_file_still_points_a_build_at_its_files(tmp_path: Path) -> None:
    """The same warnings from the split alone, as a build's stages ask it (the default): the files."""
    from packer.pipeline.split import assign_splits
    from tests.test_split import sample

    (tmp_path / "train.txt").write_text("0.png\n7.png\n8.png\n")
    (tmp_path / "test.txt").write_text("1.png\n")
    lists = {"train": "train.txt", "test": "test.txt"}
    job = load_job(_job(tmp_path, {"label": "folder"}, {"by": "list", "lists": lists}))
    samples = [sample(0, "E0"), sample(1, "E1")]
    bad = {"7.png": "unreadable", "8.png": "filtered"}
    for listings, bad_list, out_list in ((BUILD_LISTINGS, "the bad-sample report (bad_samples.jsonl)",
                                          "excluded.jsonl"),
                                         (VALIDATE_LISTINGS, VALIDATE_LISTINGS.bad, VALIDATE_LISTINGS.excluded)):
        said = assign_splits(samples, job.split, bad=bad, quiet=True, listings=listings).warnings
        assert any(w.endswith(f"not packed: {bad_list} lists each with its reason and fix") for w in said), said
        assert any(w.endswith(f"not bad samples: {out_list} lists each with why") for w in said), said
    assert assign_splits(samples, job.split, bad=bad, quiet=True).warnings == assign_splits(
        samples, job.split, bad=bad, quiet=True, listings=BUILD_LISTINGS).warnings


def test_a_masks_folder_left_out_of_an_image_source_points_validate_at_its_reports_records(tmp_path: Path) -> None:
    for c in "ab":
        for i in range(6):
            _png(tmp_path / "raw" / c / f"img{i}.png", i + ord(c))
    _png(tmp_path / "raw/masks/img0.png", 0)
    job = _job(tmp_path, {"label": "folder"}, {"by": "entity", "ratios": {"train": 0.8, "test": 0.2}, "seed": 1})
    stderr, warnings = _validate_cli(job, tmp_path)
    (said,) = [w for w in warnings if "named as masks or label maps left out" in w]
    assert "left out (the validate report's excluded.records, why label_map; folder 'masks' (1))" in said
    for said in (stderr, *warnings):
        assert not any(name in said for name in FILES), said


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="folder links")
def test_a_class_folder_that_links_to_another_points_validate_at_its_reports_records(tmp_path: Path) -> None:
    for c in "ab":
        for i in range(6):
            _png(tmp_path / "raw" / c / f"img{i}.png", i + ord(c))
    (tmp_path / "raw" / "kitty").symlink_to("a", target_is_directory=True)
    job = _job(tmp_path, {"label": "folder"}, {"by": "entity", "ratios": {"train": 0.8, "test": 0.2}, "seed": 1})
    stderr, warnings = _validate_cli(job, tmp_path)
    (said,) = [w for w in warnings if "links to a folder already under the root" in w]
    assert "left out at the link's paths (the validate report's excluded.records, why folder_link)" in said
    for said in (stderr, *warnings):
        assert not any(name in said for name in FILES), said


def test_annotations_painted_with_notes_point_validate_at_its_reports_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A contour of two points is skipped and noted in the annotation's record (tests/test_dicom_masks.py
    shows the build's warning naming excluded.jsonl); validate's names its report's records."""
    raw = tmp_path / "raw"
    _annotated_tree(raw)
    add_degenerate_contour(raw)
    result = validate_job(load_job(_mask_job(tmp_path, raw, {**RTSTRUCT_ROIS, **SEGMENTS})), scheduler="sync",
                          quiet=True)
    stderr = capsys.readouterr().err
    (said,) = [w for code, w in result.prepared.warnings if code == "annotation_notes"]
    assert said.endswith("each object's row in the validate report's excluded.records gives its notes")
    for text in (stderr, *(w for _, w in result.prepared.warnings)):
        assert not any(name in text for name in FILES), text
