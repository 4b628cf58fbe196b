"""packer.build and packer.validate print the warnings the commands print in their summaries.

README, From Python: "Progress and warnings are printed as the commands print them ...;
``progress=False`` leaves the warnings". ``packer build`` warns under its summary (also under
``-q``) of a split that asked for samples and got none, and of samples of several shapes no
batch stacks; ``packer validate`` in its summary. The Python calls print no summary: they print
these warnings on stderr as ``packer: warning: <job>: <message>``, as the stages' own warnings
are printed, with or without progress, and the command line still prints each once.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import packer
from packer.cli import main

#: seed 3 over the six entities E00..E05 leaves ``valid`` empty (asserted below from the manifest)
SPLIT = {"by": "entity", "ratios": {"train": 0.6, "valid": 0.2, "test": 0.2}, "seed": 3}


def two_size_job(tmp_path: Path, *, max_bad: float = 0.5, zero_byte: int = 0) -> Path:
    """Twelve photos of six entities in two sizes (48×64 and 40×56) with no transform size, so
    the samples keep two shapes; ``zero_byte`` bad files besides. Returns the job file."""
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ["path,label,entity,timestamp"]
    for i in range(12):
        small = np.random.default_rng(i).integers(0, 256, (6, 8, 3), dtype=np.uint8)
        h, w = (48, 64) if i % 3 else (40, 56)
        assert cv2.imwrite(str(raw / f"p{i:02d}.png"), cv2.GaussianBlur(cv2.resize(small, (w, h)), (5, 5), 0))
        lines.append(f"p{i:02d}.png,{'ab'[i % 2]},E{i // 2:02d},2024-01-01")
    for i in range(zero_byte):
        (raw / f"z{i}.png").write_bytes(b"")
        lines.append(f"z{i}.png,a,Z{i},2024-01-01")
    (raw / "labels.csv").write_text("\n".join(lines) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "photos", "sources": [{"kind": "image", "root": "raw", "table": "raw/labels.csv"}],
        "split": SPLIT, "pack": {"format": "webdataset"}, "output": "out",
        "validate": {"max_bad_fraction": max_bad}}, sort_keys=False))
    return job


def summary_warnings(text: str) -> list[str]:
    """The messages of the ``  warning: ...`` lines of a command's summary."""
    return [line.removeprefix("  warning: ") for line in text.splitlines() if line.startswith("  warning: ")]


def printed_warnings(err: str) -> list[str]:
    """The messages of the ``packer: warning: photos: ...`` lines on stderr: each names the job."""
    prefix = "packer: warning: photos: "
    return [line.removeprefix(prefix) for line in err.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("progress", [False, True])
def test_build_prints_the_empty_split_and_shape_warnings_the_command_prints_in_its_summary(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], progress: bool) -> None:
    job = two_size_job(tmp_path)
    ran = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report",
                                    "--out", str(tmp_path / "cli-out")])
    assert ran.exit_code == 0, ran.output
    in_summary = summary_warnings(ran.output)
    assert [w.split(" ")[:4] for w in in_summary] == [["split", "valid", "has", "0"], ["source", "raw", "packs",
                                                                                      "samples"]], ran.output
    assert "which no batch can stack" in in_summary[1]
    capfd.readouterr()

    manifest = packer.build(job, scheduler="sync", progress=progress, report=False, out=tmp_path / "api-out")
    assert manifest.splits["valid"]["samples"] == 0
    captured = capfd.readouterr()
    printed = printed_warnings(captured.err)
    for message in in_summary:  # the same text, each once, on stderr (stdout keeps the opening line only)
        assert printed.count(message) == 1, (message, captured.err)
        assert message not in captured.out
    # they are the ones the version's warnings.jsonl keeps, as the report shows them
    kept = [json.loads(line) for line in (Path(manifest.folder) / "warnings.jsonl").read_text().splitlines()]
    assert [r["message"] for r in kept if r["code"] in ("empty_split", "several_shapes")] == in_summary


def test_build_over_the_bad_fraction_prints_the_warnings_before_it_raises(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = two_size_job(tmp_path, max_bad=0.01, zero_byte=1)
    with pytest.raises(packer.errors.BadFractionError):
        packer.build(job, scheduler="sync", progress=False, report=False)
    printed = printed_warnings(capfd.readouterr().err)
    assert any(w.startswith("split valid has 0 samples") for w in printed), printed
    assert any("which no batch can stack" in w for w in printed), printed


def test_the_command_line_prints_each_build_warning_once_in_its_summary_not_again_on_stderr(tmp_path: Path) -> None:
    job = two_size_job(tmp_path)
    ran = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q", "--no-report"])
    assert ran.exit_code == 0, ran.output
    for message in summary_warnings(ran.output):
        assert ran.output.count(message) == 1, ran.output


@pytest.mark.parametrize("progress", [False, True])
def test_validate_prints_the_empty_split_and_shape_warnings_its_summary_holds(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], progress: bool) -> None:
    job = two_size_job(tmp_path)
    result = packer.validate(job, scheduler="sync", progress=progress)
    printed = printed_warnings(capfd.readouterr().err)
    in_summary = summary_warnings(result.summary())
    assert len(in_summary) == 2 and in_summary[0].startswith("split valid has 0 samples"), result.summary()
    assert "which no batch can stack" in in_summary[1]
    for message in in_summary:
        assert printed.count(message) == 1, (message, printed)
        assert message in result.warnings


def test_packer_validate_prints_each_summary_warning_once(tmp_path: Path) -> None:
    job = two_size_job(tmp_path)
    ran = CliRunner().invoke(main, ["validate", str(job), "--scheduler", "sync", "-q"])
    assert ran.exit_code == 0, ran.output
    in_summary = summary_warnings(ran.output)
    assert len(in_summary) == 2, ran.output
    for message in in_summary:
        assert ran.output.count(message) == 1, ran.output
