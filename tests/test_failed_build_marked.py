"""A failed build's version is marked as such wherever a script or a reviewer looks at it.

A build over ``validate.max_bad_fraction`` (exit 3) writes its version for its report, not to
train on: ``packer ls`` and ``packer inspect`` say ``FAILED BUILD`` and ``packer ls --json``
gives why as ``failed``. ``packer inspect --json``, the stable dict for scripts, carried no such
field, and report.html, which a reviewer may read alone, did not say it either.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from click.testing import CliRunner

from packer.cli import main
from tests.helpers import write_job


def _build(tmp_path: Path, broken: bool) -> tuple[int, Path]:
    raw = tmp_path / "raw" / "cls"
    raw.mkdir(parents=True)
    for i in range(9):
        cv2.imwrite(str(raw / f"{i}.png"), np.random.default_rng(i).integers(0, 255, (16, 16), dtype=np.uint8))
    if broken:  # 1 bad file of 10: 10% against a limit of 5%
        (raw / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    job = write_job(tmp_path, {"name": "marked", "sources": [{"kind": "image", "root": str(tmp_path / "raw"),
                                                             "label": "folder"}],
                               "split": {"by": "entity", "ratios": {"train": 1.0}}, "pack": {"format": "webdataset"},
                               "validate": {"max_bad_fraction": 0.05}, "output": str(tmp_path / "out")})
    built = CliRunner().invoke(main, ["build", str(job), "--scheduler", "sync", "-q"])
    (version,) = (tmp_path / "out" / "marked").glob("*/")
    return built.exit_code, version


def _inspected(version: Path) -> dict:
    shown = CliRunner().invoke(main, ["inspect", str(version), "--json"])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.output)


def test_inspect_json_and_the_report_mark_a_build_over_the_bad_fraction_as_ls_does(tmp_path: Path) -> None:
    code, version = _build(tmp_path, broken=True)
    assert code == 3
    listed = json.loads(CliRunner().invoke(main, ["ls", str(version.parent), "--json"]).output)
    (entry,) = listed["versions"]
    failed = _inspected(version)["failed"]
    assert failed == entry["failed"]
    assert failed.startswith("1 bad input files, 10.0% over max_bad_fraction 5.0%")
    report = (version / "report.html").read_text()
    assert f'id="failed-build"><strong>FAILED BUILD</strong> {failed}' in report


def test_a_good_version_has_no_failed_mark(tmp_path: Path) -> None:
    code, version = _build(tmp_path, broken=False)
    assert code == 0
    assert _inspected(version)["failed"] is None
    assert "FAILED BUILD" not in (version / "report.html").read_text()
